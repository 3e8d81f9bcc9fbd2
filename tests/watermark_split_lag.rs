//! The committed watermark across a split whose parent lags (issue #31, point 4), against
//! kinesis-local, ZooKeeper and dynalite: workers of `examples/exactly_once_counts.rs
//! --window-ms 1000 --fire-to RESULTS` count records per key and 1 s window of arrival time, and
//! their `WindowFirer`s fire each window once the stream's committed watermark passed its end.
//!
//! Worker `a` leads (it lists the shards and writes the assignment); worker `b` reads one shard,
//! which gets a backlog that its reader (at most 50 records/s per shard here) works through for
//! many seconds, and is split meanwhile. The leader lists shards only every 10 minutes and every
//! ListShards answer takes 2.5 s (a fault proxy): it learns of the children only after `b`
//! finished the parent, from the listing that finish asks for. Records keep arriving in the
//! children from the split on, while the parent is still being read. Until the children are
//! assigned and read, nothing may let the committed watermark pass them: every window must fire
//! with its true count, and no input may arrive after its window fired (`late input`, counted
//! in `state_late`).

use squall_test_support as support;

use std::time::{Duration, Instant};

use aws_sdk_kinesis::types::ShardIteratorType;
use squall::kinesis;
use support::TestStream;
use support::faultproxy::{FaultPlan, FaultProxy};
use support::reliability::spawn_producer;
use support::state::{count_in, start_counts, wait_reading};
use support::workers::{Cluster, scratch};

const WINDOW_MS: u64 = 1000;
/// How long every ListShards answer takes (the fault proxy holds it).
const LISTING_DELAY_MS: u64 = 2500;

/// Arrival times (ms) of every record of one shard.
async fn arrivals(s: &TestStream, shard: &str) -> Vec<i64> {
    let mut it = s
        .client
        .get_shard_iterator()
        .stream_name(&s.name)
        .shard_id(shard)
        .shard_iterator_type(ShardIteratorType::TrimHorizon)
        .send()
        .await
        .expect("GetShardIterator")
        .shard_iterator
        .expect("an iterator");
    let mut out = Vec::new();
    loop {
        let r = s.client.get_records().shard_iterator(&it).limit(10_000).send().await.expect("GetRecords");
        out.extend(
            r.records().iter().filter_map(|x| x.approximate_arrival_timestamp().and_then(|t| t.to_millis().ok())),
        );
        match r.next_shard_iterator {
            Some(next) if !r.records().is_empty() => it = next,
            _ => return out,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_fire_with_no_late_input_when_a_lagging_parent_splits_and_its_children_are_listed_late() {
    let t0 = Instant::now();
    let mark = |what: &str| eprintln!("[{:>6.1} s] {what}", t0.elapsed().as_secs_f64());
    let s = TestStream::create("wm-split", 2).await;
    let results = TestStream::create("wm-split-fired", 1).await;
    let dir = scratch("wm-split");
    let proxy = FaultProxy::start(
        &support::kinesis_endpoint().endpoint,
        FaultPlan {
            latency: 1.0,
            latency_ms: LISTING_DELAY_MS,
            only_ops: vec!["ListShards".into()],
            ..FaultPlan::default()
        },
    )
    .await;
    let cluster = Cluster::with_spout_config(
        &s.name,
        &dir,
        serde_json::json!({
            "checkpoint_interval_ms": 200,
            "committed_watermark_interval_ms": 300,
            "watermark_idle_timeout_ms": 1000,
            // the periodic listing never comes during the test: the children are found by the
            // listing the parent's end asks for
            "shard_discovery_interval_ms": 600_000,
            // at most 50 records/s per shard: a backlog makes a reader lag
            "records_per_get": 10,
            "max_get_calls_per_second": 5,
        }),
    );
    let table = support::unique_name("wm-split");
    let state = support::state_endpoint();
    let endpoint = proxy.url();
    let flags = ["--window-ms", "1000", "--fire-to", results.name.as_str(), "--endpoint", endpoint.as_str()];

    let mut a = start_counts(&cluster, "a", &state, &table, &flags);
    wait_reading(&a, &cluster).await;
    let mut b = start_counts(&cluster, "b", &state, &table, &flags);
    wait_reading(&b, &cluster).await;
    // b took one shard from a: that one is split
    let parent = {
        let log = std::fs::read_to_string(&b.log).unwrap();
        let line = log.lines().find(|l| l.contains("reading shard")).unwrap().to_string();
        support::state::log_field(&line, "shard").expect("the shard b reads").to_string()
    };
    mark(&format!("b reads {parent}"));
    assert!(count_in(&a.log, "this worker leads") > 0, "a leads\n{}", cluster.logs());

    // 8 keys at 40 records/s (about 5 per key and window) for 40 s, and a backlog of 400
    // records in b's shard: its reader lags for about 10 s
    let producer = spawn_producer(&s.client, &s.label(), &s.name, 1600, 8, 40.0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let described = support::ops::list_shards(&s.client, &s.name).await;
    let hash = described.iter().find(|d| d.shard_id == parent).unwrap().starting_hash_key.clone();
    let backlog = support::ops::put_to_shard(&s.client, &s.name, &hash, "backlog-", 400, 8).await;
    mark(&format!("backlog of {} records in {parent}", backlog.total));
    tokio::time::sleep(Duration::from_secs(2)).await;
    kinesis::split_shard(&s.client, &s.label(), &s.name, &parent).await.unwrap();
    let split_ms = squall::coord::now_ms();
    let split_at = Instant::now();
    mark(&format!("split {parent}"));
    // when b finishes the parent (read to its end, every record acked)
    let finished_line = format!("shard={parent}");
    let finished_ms = loop {
        let log = std::fs::read_to_string(&b.log).unwrap_or_default();
        if log.lines().any(|l| l.contains("shard finished") && l.contains(&finished_line)) {
            break squall::coord::now_ms();
        }
        assert!(split_at.elapsed() < Duration::from_secs(90), "b never finished {parent}\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    mark(&format!("b finished {parent}, {} ms after the split", finished_ms - split_ms));
    let manifest = producer.await.unwrap();
    mark(&format!("producer done: {} records", manifest.total));

    // the split really happened while the parent lagged: it finished seconds later, and its
    // children had records by then (records that were not read while the parent was)
    let children: Vec<String> = support::ops::list_shards(&s.client, &s.name)
        .await
        .into_iter()
        .filter(|d| d.parent_shard_id.as_deref() == Some(parent.as_str()))
        .map(|d| d.shard_id)
        .collect();
    assert_eq!(children.len(), 2, "the split's children");
    let mut early = 0;
    for c in &children {
        early += arrivals(&s, c).await.iter().filter(|t| **t < finished_ms).count();
    }
    eprintln!(
        "parent {parent} finished {} ms after the split; {early} records reached its children before",
        finished_ms - split_ms
    );
    assert!(
        finished_ms - split_ms >= 3000,
        "the parent did not lag: finished {} ms after the split",
        finished_ms - split_ms
    );
    assert!(early >= 50, "the children got only {early} records while the parent was read");
    assert!(proxy.counters().delayed > 0, "no ListShards answer was slowed");

    // every window fires (the last ones once the idle timeout passed)
    let truth = support::state::window_truth(&s, WINDOW_MS).await;
    assert_eq!(truth.values().sum::<u64>(), manifest.total + backlog.total, "the stream holds every record put");
    let start = Instant::now();
    let got = loop {
        let got = support::state::fired_windows(&results).await;
        if truth.keys().all(|k| got.contains_key(k)) || start.elapsed() > Duration::from_secs(90) {
            break got;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    mark(&format!("{} of {} windows fired (or timed out)", got.len(), truth.len()));
    let late: usize = [&a, &b].iter().map(|p| count_in(&p.log, "late input")).sum();
    let missing: Vec<_> = truth.keys().filter(|k| !got.contains_key(*k)).take(10).collect();
    let wrong: Vec<_> = truth
        .iter()
        .filter_map(|(k, n)| got.get(k).filter(|c| c.iter().any(|c| c != n)).map(|c| (k, *n, c.clone())))
        .collect();
    eprintln!(
        "{} windows; late inputs {late}; windows fired with another count than the stream's {} (e.g. {:?}); \
         missing {missing:?}",
        truth.len(),
        wrong.len(),
        wrong.iter().take(5).collect::<Vec<_>>()
    );
    assert_eq!(late, 0, "inputs arrived after their window fired\n{}", cluster.logs());
    assert!(wrong.is_empty() && missing.is_empty(), "fired windows differ from the stream\n{}", cluster.logs());
    // the CLI audit of the fired windows against the input stream agrees
    let (code, out, err) = support::ops::squall_run(
        &cluster,
        &["audit", "--windows", "--stream", &s.name, "--window-ms", "1000", "--fired", &results.name],
    );
    assert_eq!(code, 0, "squall audit --windows: {out}\n{err}");
    let report: squall::audit::WindowsReport = serde_json::from_str(out.trim()).expect("the audit's JSON report");
    assert!(report.exact() && report.windows == truth.len(), "{report:?}");
    for p in [&mut a, &mut b] {
        p.stop(Duration::from_secs(15));
    }
    s.delete().await;
    results.delete().await;
}
