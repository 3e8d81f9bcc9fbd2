//! Dead letters are not lost: a record that exhausted its replays counts as handled (its
//! checkpoint moves) only once its dead-letter tuple is acked. Here the dead-letter sink fails
//! every dead letter (the spout emits them again), the worker is SIGKILLed while they are pending,
//! and after a restart every poison record still reaches the dead-letter file.

use squall_test_support as support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use squall::kinesis::{self, PutOptions};
use support::TestStream;
use support::reliability::{grep_logs, manifest_without};
use support::workers::{Cluster, scratch};

fn dead_seqs(path: &std::path::Path) -> BTreeSet<u64> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .inspect(|v| assert_eq!(v["key"], "key-3", "a healthy record was dead-lettered: {v}"))
        .filter_map(|v| v["seq"].as_u64())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_dead_letters_survive_a_crash() {
    let s = TestStream::create("deadletter", 2).await;
    let dir = scratch("deadletter");
    let cluster = Cluster::with_spout_config(
        &s.name,
        &dir,
        serde_json::json!({"retry": {"max_replays": 1, "replay_min_backoff_ms": 20, "replay_max_backoff_ms": 200}}),
    );
    let opts = PutOptions { count: 300, keys: 10, ..PutOptions::default() };
    let manifest = kinesis::put_records(&s.client, &s.label(), &s.name, &opts).await.unwrap().manifest;
    let poison = manifest.counts["key-3"];
    let healthy = manifest_without(&manifest, &["key-3"]);
    let dead = dir.join("dead.jsonl");
    let dead_arg = dead.to_string_lossy().to_string();

    // 1. The dead-letter sink refuses everything.
    let mut w1 = cluster.start_with(
        "w1",
        1,
        &["--poison-key", "key-3", "--dead-letters", &dead_arg, "--fail-dead-letters", "1000000000"],
    );
    let r = cluster.wait_delivered(std::slice::from_ref(&healthy), Duration::from_secs(60)).await;
    assert_eq!(r.lost, 0, "healthy keys: {r:?}\n{}", cluster.logs());
    // Every poison record was dead-lettered, and its dead-letter tuple failed (at least once).
    let start = Instant::now();
    let failed_once = loop {
        let n = grep_logs(&dir, "the dead-letter tuple failed").iter().filter(|l| l.contains("failures=1 ")).count();
        if n as u64 >= poison {
            break n;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{n} of {poison} dead letters failed\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Several checkpoint intervals pass while they keep failing: a checkpoint that counted them
    // as handled would be written now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let decided = grep_logs(&dir, "emitting it on the dead-letter stream").len();
    let retried = grep_logs(&dir, "the dead-letter tuple failed").len();
    assert!(dead_seqs(&dead).is_empty(), "the failing sink wrote dead letters");
    w1.kill();
    eprintln!(
        "DEAD LETTERS: {poison} poison records, {decided} dead-lettered, {failed_once} failed once, {retried} failure \
         lines before the SIGKILL"
    );
    assert!(decided as u64 >= poison);

    // 2. After a restart (a working dead-letter sink), every poison record reaches the file.
    let mut w2 = cluster.start_with("w2", 1, &["--poison-key", "key-3", "--dead-letters", &dead_arg]);
    let start = Instant::now();
    let seqs = loop {
        let seqs = dead_seqs(&dead);
        if seqs.len() as u64 >= poison || start.elapsed() > Duration::from_secs(90) {
            break seqs;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!(
        "DEAD LETTERS: after the restart {} of {poison} poison records reached the dead-letter file in {:?}",
        seqs.len(),
        start.elapsed()
    );
    assert_eq!(seqs, (0..poison).collect::<BTreeSet<_>>(), "poison records lost\n{}", cluster.logs());
    let r = cluster.audit(std::slice::from_ref(&healthy));
    assert_eq!(r.lost, 0, "{r:?}");
    assert_eq!(w2.stop(Duration::from_secs(30)), Some(0), "{}", cluster.logs());
    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}
