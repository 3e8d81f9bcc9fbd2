//! The Kinesis call budget, counted by a proxy in front of the engine (tests/support/faultproxy.rs):
//!
//! - throttled GetRecords calls are retried with the same shard iterator: GetShardIterator stays at
//!   one call per shard ownership however many throttles reach the spout (dropping the iterator
//!   after every error cost one GetShardIterator per throttle);
//! - an idle shard is polled at most once per `idle_poll_interval_ms` (1000 by default).

use squall_test_support as support;

use std::time::{Duration, Instant};

use support::TestStream;
use support::faultproxy::{FaultPlan, FaultProxy};
use support::reliability::{grep_logs, spawn_producer};
use support::workers::{Cluster, read_log_entries, scratch};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttles_keep_the_iterator_and_idle_shards_cost_one_call_per_interval() {
    let shards = 2;
    let s = TestStream::create("budget", shards).await;
    let dir = scratch("budget");
    // Throttles on GetRecords only; GetShardIterator and everything else pass.
    let plan = FaultPlan { throttle: 0.8, only_ops: vec!["GetRecords".into()], ..FaultPlan::default() };
    let proxy = FaultProxy::start(&support::kinesis_endpoint().endpoint, plan).await;
    let cluster = Cluster::with_spout_config(
        &s.name,
        &dir,
        // The default idle poll interval (the test harness usually polls faster).
        serde_json::json!({"idle_poll_interval_ms": null, "retry": {"call_min_backoff_ms": 20, "call_max_backoff_ms": 200}}),
    );
    let url = proxy.url();
    let mut w = cluster.start_with("w", 1, &["--endpoint", &url]);

    // Records keep arriving, so the readers call GetRecords often while throttled.
    let producer = spawn_producer(&s.client, &s.label(), &s.name, 600, 10, 60.0);
    let start = Instant::now();
    loop {
        let spout_throttles = grep_logs(&dir, "throttled; backing off").len();
        if spout_throttles >= 20 || start.elapsed() > Duration::from_secs(90) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let manifest = producer.await.unwrap();
    let report = cluster.wait_delivered(std::slice::from_ref(&manifest), Duration::from_secs(60)).await;
    proxy.set_enabled(false);

    let gets = proxy.op("GetRecords");
    let iterators = proxy.op("GetShardIterator");
    let spout_throttles = grep_logs(&dir, "throttled; backing off").len();
    let ownerships = read_log_entries(&cluster.read_logs()).iter().filter(|e| e.event == "acquire").count();
    eprintln!(
        "BUDGET throttled: GetRecords {} calls ({} throttled by the proxy), {spout_throttles} throttles reached the spout \
         past the SDK's retries; GetShardIterator {} calls for {ownerships} shard ownerships",
        gets.requests, gets.faults, iterators.requests
    );
    assert_eq!(report.lost, 0, "{report:?}\n{}", cluster.logs());
    // The faults really happened, and reached the spout's own back-off.
    assert!(gets.faults >= 50, "too few throttles injected: {gets:?}");
    assert!(spout_throttles >= 20, "too few throttles reached the spout: {spout_throttles}\n{}", cluster.logs());
    assert_eq!(ownerships, shards as usize, "one worker, one ownership per shard");
    assert_eq!(
        iterators.requests as usize, ownerships,
        "GetShardIterator after throttles: {} calls for {ownerships} ownerships and {spout_throttles} throttles",
        iterators.requests
    );

    // Idle: every shard caught up, nothing arriving. Count GetRecords over a measured window.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (before, t0) = (proxy.op("GetRecords").requests, Instant::now());
    tokio::time::sleep(Duration::from_secs(8)).await;
    let (calls, window) = (proxy.op("GetRecords").requests - before, t0.elapsed());
    let per_shard_per_s = calls as f64 / shards as f64 / window.as_secs_f64();
    eprintln!(
        "BUDGET idle: {calls} GetRecords calls for {shards} idle shards in {window:?} ({per_shard_per_s:.2} per shard per second)"
    );
    // At most one call per shard per started second of the window (plus one in flight).
    let bound = shards as u64 * (window.as_secs() + 2);
    assert!(calls <= bound, "{calls} GetRecords calls for {shards} idle shards in {window:?} (bound {bound})");
    assert!(calls >= shards as u64, "the idle shards were not polled at all");

    assert_eq!(w.stop(Duration::from_secs(30)), Some(0), "{}", cluster.logs());
    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}
