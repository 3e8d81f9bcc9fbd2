//! Exactly-once keyed state under chaos, against kinesis-local, ZooKeeper and dynalite: workers
//! of `examples/exactly_once_counts.rs` count records per partition key in DynamoDB while one
//! aborts right after a commit is written and before its inputs are acked, one is SIGKILLed, one
//! is SIGSTOPped past its ZooKeeper session and resumed (its late writes must be refused), the
//! store throttles and answers 500s (through a fault proxy), and the stream is split and merged.
//! At the end every key's count in the table must equal the number of records written with
//! that key (the producer's manifest): none lost, none counted twice.

use squall_test_support as support;

use std::path::Path;
use std::time::{Duration, Instant};

use squall::kinesis;
use squall::kinesis::payload::Manifest;
use squall::state::{StateEndpoint, StateStore};
use support::TestStream;
use support::faultproxy::{FaultPlan, FaultProxy};
use support::reliability::spawn_producer;
use support::state::{ZOMBIE_COMMIT_INTERVAL_MS, count_in, start_counts, wait_committing, wait_reading};
use support::workers::{Cluster, scratch};

/// Polls the table until the counts match the manifest (or the timeout); the last report.
async fn wait_counts(
    manifest: &Path,
    ep: &StateEndpoint,
    topology: &str,
    timeout: Duration,
) -> squall::audit::CountsReport {
    let start = Instant::now();
    loop {
        let r = squall::audit::audit_counts(&[manifest.to_path_buf()], ep, topology, "counts").await.unwrap();
        if r.mismatched == 0 || start.elapsed() > timeout {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_are_exact_after_abort_mid_commit_sigkill_zombie_store_faults_split_and_merge() {
    let t0 = Instant::now();
    let mark = |what: &str| eprintln!("[{:>6.1} s] {what}", t0.elapsed().as_secs_f64());
    let s = TestStream::create("eo-chaos", 3).await;
    let dir = scratch("eo-chaos");
    let cluster = Cluster::with_spout_config(&s.name, &dir, serde_json::json!({ "checkpoint_interval_ms": 200 }));
    let table = support::unique_name("eo-chaos");
    // Every worker reaches the store through a proxy that throttles and fails some requests.
    let proxy = FaultProxy::start(
        &support::state_endpoint(),
        FaultPlan { throttle: 0.03, server_error: 0.03, max_faults: 300, ..FaultPlan::default() },
    )
    .await;
    let url = proxy.url();
    let ep = StateEndpoint::new(support::state_endpoint(), table.clone());
    StateStore::open(&ep).await.expect("state table");

    let producer = spawn_producer(&s.client, &s.label(), &s.name, 6000, 40, 300.0);
    // 1. b, alone (so it reads every shard), aborts right after its 25th written commit, before
    //    acking its inputs; a replacement takes over with the others
    let mut b = start_counts(&cluster, "b", &url, &table, &["--abort-after-commits", "25"]);
    let code = b.wait_exit(Duration::from_secs(40));
    assert!(code.is_some(), "b never reached its 25th commit\n{}", cluster.logs());
    assert_eq!(count_in(&b.log, "abort_after_commits: aborting after a written commit"), 1, "{}", b.log_text());
    mark(&format!("b aborted after a written commit (exit {code:?})"));
    // a commits slowly (inputs wait 3 s), so it holds uncommitted inputs when it is frozen
    let mut a = start_counts(&cluster, "a", &url, &table, &["--commit-interval-ms", ZOMBIE_COMMIT_INTERVAL_MS]);
    let mut b2 = start_counts(&cluster, "b2", &url, &table, &[]);
    let mut c = start_counts(&cluster, "c", &url, &table, &[]);
    wait_reading(&a, &cluster).await;
    wait_committing(&a, &cluster).await;

    // 2. split a shard
    let shards = kinesis::list_shards(&s.client, &s.label(), &s.name).await.unwrap();
    let first = shards.iter().find(|d| !d.closed).unwrap().shard_id.clone();
    kinesis::split_shard(&s.client, &s.label(), &s.name, &first).await.unwrap();
    mark(&format!("split {first}"));

    // 3. freeze a past its session (4 s), then resume it: a zombie with uncommitted inputs
    a.pause();
    mark("SIGSTOP a");
    tokio::time::sleep(Duration::from_secs(9)).await;
    a.resume();
    mark("SIGCONT a");

    // 4. SIGKILL c, start a replacement
    tokio::time::sleep(Duration::from_secs(1)).await;
    c.kill();
    mark("SIGKILL c");
    let mut c2 = start_counts(&cluster, "c2", &url, &table, &[]);

    // 5. merge two adjacent open shards
    let (x, y) = support::ops::adjacent_open(&s).await.expect("two adjacent open shards");
    kinesis::merge_shards(&s.client, &s.label(), &s.name, &x, &y).await.unwrap();
    mark(&format!("merge {x} + {y}"));

    let manifest: Manifest = producer.await.unwrap();
    let manifest_path = dir.join("manifest.json");
    std::fs::write(&manifest_path, serde_json::to_string(&manifest).unwrap()).unwrap();
    mark(&format!("producer done: {} records over {} keys", manifest.total, manifest.counts.len()));
    let report = wait_counts(&manifest_path, &ep, &cluster.topology, Duration::from_secs(120)).await;
    mark("counts settled (or timed out)");

    // ---- the faults really happened ----
    let faults = proxy.counters();
    eprintln!("store proxy: {faults:?}");
    assert!(faults.throttled > 0 && faults.server_errors > 0, "no store faults injected: {faults:?}");
    let refused = support::state::wait_refused(&a).await;
    eprintln!("refused writes of the zombie a: {refused}");
    assert!(refused > 0, "the zombie's late writes were not refused\n{}", a.log_text());
    let listed = kinesis::list_shards(&s.client, &s.label(), &s.name).await.unwrap();
    assert_eq!(listed.len(), 3 + 2 + 1, "the split and the merge not seen in the shard list: {listed:?}");

    // ---- exactly once ----
    eprintln!("report: {report:?}");
    assert_eq!(report.expected_total, 6000);
    assert_eq!(
        (report.mismatched, report.over, report.under),
        (0, 0, 0),
        "counts differ from the manifest: {report:?}\n{}",
        cluster.logs()
    );
    assert_eq!(report.counted_total, report.expected_total);
    let duplicates: usize = ["a", "b", "b2", "c", "c2"]
        .iter()
        .map(|n| count_in(&dir.join(format!("{n}.log")), "duplicate input skipped"))
        .sum();
    eprintln!("total run {:.1} s; duplicates skipped {duplicates}", t0.elapsed().as_secs_f64());
    // b's last commit was written and never acked: its records came back and were recognized
    assert!(duplicates > 0, "no replayed record was recognized as already applied\n{}", cluster.logs());
    // the deduplication data stays bounded across the split and the merge: a key's records come
    // from one shard at a time, and a shard's entry goes once its descendant was read
    let store = StateStore::open(&ep).await.unwrap();
    let scope = squall::state::scope(&cluster.topology, "counts");
    let pks: Vec<String> = manifest.counts.keys().map(|k| format!("{scope}/{k}")).collect();
    let items = store.get_many(&pks).await.unwrap();
    let mut entries: Vec<usize> = items
        .values()
        .map(|i| serde_json::from_slice::<squall::state::Dedup>(&i.dedup).expect("dedup data").shards.len())
        .collect();
    entries.sort_unstable();
    eprintln!("shard entries per key after the split and the merge: {entries:?}");
    assert_eq!(entries.len(), 40);
    assert!(entries.iter().all(|n| *n <= 2), "finished shards' entries kept: {entries:?}");

    for p in [&mut a, &mut b2, &mut c2] {
        p.stop(Duration::from_secs(15));
    }
    s.delete().await;
}

/// Exactly-once tumbling windows: counts per key and 1 s event-time window (the record's arrival
/// time) through an abort right after a commit, a zombie past its session, a SIGKILL and a
/// split; every window's count in the table must equal the count of the stream's records in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_counts_are_exact_after_abort_zombie_sigkill_and_split() {
    let t0 = Instant::now();
    let mark = |what: &str| eprintln!("[{:>6.1} s] {what}", t0.elapsed().as_secs_f64());
    let s = TestStream::create("eo-win", 2).await;
    let dir = scratch("eo-win");
    let cluster = Cluster::with_spout_config(&s.name, &dir, serde_json::json!({ "checkpoint_interval_ms": 200 }));
    let table = support::unique_name("eo-win");
    let url = support::state_endpoint();
    let store = support::state::open(&url, &table).await;
    let win = ["--window-ms", "1000"];

    let producer = spawn_producer(&s.client, &s.label(), &s.name, 3000, 20, 250.0);
    let (_b, mut a, mut c) = support::state::abort_then_start_zombie(&cluster, &url, &table, &win, "20").await;
    mark("b aborted after a written commit; a holds uncommitted inputs");
    a.pause();
    mark("SIGSTOP a");
    let first = kinesis::list_shards(&s.client, &s.label(), &s.name).await.unwrap()[0].shard_id.clone();
    kinesis::split_shard(&s.client, &s.label(), &s.name, &first).await.unwrap();
    mark(&format!("split {first}"));
    tokio::time::sleep(Duration::from_secs(8)).await;
    a.resume();
    mark("SIGCONT a");
    c.kill();
    mark("SIGKILL c");
    let mut c2 = start_counts(&cluster, "c2", &url, &table, &win);
    let manifest = producer.await.unwrap();
    mark(&format!("producer done: {} records", manifest.total));

    let truth = support::state::window_truth(&s, 1000).await;
    assert_eq!(truth.values().sum::<u64>(), 3000, "the stream holds every record put");
    let start = Instant::now();
    let counted = loop {
        let counted = support::state::counts(&support::state::items(&store, &cluster.topology).await);
        if counted == truth || start.elapsed() > Duration::from_secs(90) {
            break counted;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    mark("window counts settled (or timed out)");
    // the resumed zombie flushes what it held: its writes are refused (wait for them to be tried)
    let refused = support::state::wait_refused(&a).await;
    let duplicates: usize =
        ["a", "b", "c", "c2"].iter().map(|n| count_in(&dir.join(format!("{n}.log")), "duplicate input skipped")).sum();
    eprintln!("{} windows over {} keys; refused {refused}; duplicates skipped {duplicates}", truth.len(), 20);
    assert!(refused > 0, "the zombie's late writes were not refused\n{}", a.log_text());
    assert!(duplicates > 0, "no replayed record was recognized as already applied\n{}", cluster.logs());
    let wrong: Vec<_> = truth
        .iter()
        .filter(|(k, n)| counted.get(*k) != Some(n))
        .map(|(k, n)| (k.clone(), *n, counted.get(k).copied().unwrap_or(0)))
        .take(10)
        .collect();
    let extra: Vec<_> = counted.keys().filter(|k| !truth.contains_key(*k)).take(10).collect();
    assert!(
        wrong.is_empty() && extra.is_empty(),
        "windows differ (window, true, counted): {wrong:?}; unknown: {extra:?}"
    );
    assert!(truth.len() > 20, "records spread over several windows per key: {}", truth.len());
    for p in [&mut a, &mut c2] {
        p.stop(Duration::from_secs(15));
    }
    s.delete().await;
}
