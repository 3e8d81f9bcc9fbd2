//! Throttling and transport faults: two workers read a 3-shard stream through a fault-injecting
//! HTTP proxy (tests/support/faultproxy.rs) that answers ProvisionedThroughputExceededException
//! (HTTP 400), HTTP 500, resets connections and adds latency at set rates, first heavily (so that
//! faults get past the SDK's own retries to the spout), then lightly, then not at all. The spout
//! must back off, keep going and lose nothing; first deliveries per key stay in producer order and
//! no shard is ever read by two tasks at once.

use squall_test_support as support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use support::TestStream;
use support::faultproxy::{FaultPlan, FaultProxy};
use support::reliability::{grep_logs, spawn_producer};
use support::workers::{Cluster, read_log_entries, read_log_violations, scratch};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_500s_resets_and_latency_lose_nothing() {
    let s = TestStream::create("rel-throttle", 3).await;
    let dir = scratch("rel-throttle");
    let heavy = FaultPlan {
        throttle: 0.35,
        server_error: 0.15,
        reset: 0.10,
        latency: 0.10,
        latency_ms: 400,
        max_faults: 5_000,
        active_for: Duration::from_secs(60),
        ..FaultPlan::default()
    };
    let proxy = FaultProxy::start(&support::kinesis_endpoint().endpoint, heavy).await;
    let cluster = Cluster::with_spout_config(
        &s.name,
        &dir,
        serde_json::json!({"retry": {"call_min_backoff_ms": 50, "call_max_backoff_ms": 1000}}),
    );
    let url = proxy.url();
    let mut w1 = cluster.start_with("w1", 1, &["--endpoint", &url]);
    let mut w2 = cluster.start_with("w2", 1, &["--endpoint", &url]);

    let producer = spawn_producer(&s.client, &s.label(), &s.name, 2400, 30, 240.0);
    // Heavy faults for at least 8 s and until enough of each kind reached the workers (how many
    // requests the workers make depends on their back-off and idle polling), light faults for
    // 8 s, then none.
    let heavy_start = Instant::now();
    tokio::time::sleep(Duration::from_secs(8)).await;
    loop {
        let c = proxy.counters();
        if (c.throttled > 20 && c.server_errors > 5 && c.resets > 5 && c.delayed > 5)
            || heavy_start.elapsed() > Duration::from_secs(40)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let after_heavy = proxy.counters();
    // The SDK retries each call (3 attempts) before the spout sees an error: random faults reach
    // the spout only when one call draws three in a row, which a run may never do. A burst of
    // throttled reads does, every time: each attempt of every GetRecords is refused for 2 s.
    proxy.set_plan(FaultPlan { throttle: 1.0, only_ops: vec!["GetRecords".into()], ..FaultPlan::default() });
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.set_plan(FaultPlan {
        throttle: 0.10,
        server_error: 0.05,
        reset: 0.05,
        latency: 0.20,
        latency_ms: 250,
        ..FaultPlan::default()
    });
    tokio::time::sleep(Duration::from_secs(8)).await;
    proxy.set_enabled(false);
    let faults_end = Instant::now();
    let manifest = producer.await.unwrap();

    let report = cluster.wait_delivered(std::slice::from_ref(&manifest), Duration::from_secs(90)).await;
    let drained = faults_end.elapsed();
    let c = proxy.counters();
    let backoffs = grep_logs(&dir, "throttled; backing off").len();
    let failed_reads = grep_logs(&dir, "reading the shard failed; backing off").len();
    eprintln!("proxy counters: {}", serde_json::to_string(&c).unwrap());
    eprintln!("after the heavy phase: {}", serde_json::to_string(&after_heavy).unwrap());
    eprintln!(
        "spout: {backoffs} throttle back-offs, {failed_reads} failed-read back-offs; all delivered {drained:?} after the faults stopped"
    );
    eprintln!("RELIABILITY throttling: {}", serde_json::to_string(&report).unwrap());

    assert_eq!(report.lost, 0, "{report:?}\n{}", cluster.logs());
    assert_eq!(report.order_violations, 0, "{report:?}");
    assert_eq!(report.produced, 2400);
    assert!(c.throttled > 20 && c.server_errors > 5 && c.resets > 5 && c.delayed > 5, "too few faults injected: {c:?}");
    // Faults reached the spout itself (not only the SDK's retries), and it backed off.
    assert!(backoffs + failed_reads > 0, "no fault reached the spout's back-off\n{}", cluster.logs());
    assert!(w1.is_running() && w2.is_running(), "a worker died under faults\n{}", cluster.logs());
    let violations = read_log_violations(&read_log_entries(&cluster.read_logs()), &HashMap::new());
    assert!(violations.is_empty(), "{violations:#?}");

    assert_eq!(w1.stop(Duration::from_secs(30)), Some(0));
    assert_eq!(w2.stop(Duration::from_secs(30)), Some(0));
    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}
