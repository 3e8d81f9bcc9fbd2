//! Bad input, each with a clear error and nothing lost: malformed checkpoint and shard-list
//! znodes, an unknown stream, a stream deleted mid-run, invalid configuration values, a poison
//! record that makes a bolt panic every time, and oversized records.

use squall_test_support as support;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use squall::kinesis::{self, PutOptions};
use support::TestStream;
use support::reliability::{manifest_without, spawn_worker};
use support::workers::{Cluster, audit_bin, scratch};

async fn put(s: &TestStream, count: u64, keys: u64) -> squall::kinesis::payload::Manifest {
    let opts = PutOptions { count, keys, ..PutOptions::default() };
    kinesis::put_records(&s.client, &s.label(), &s.name, &opts).await.expect("put").manifest
}

/// Waits until some line of `text()` contains every needle; panics with the log otherwise.
async fn wait_log(what: &str, timeout: Duration, text: impl Fn() -> String, needles: &[&str]) -> String {
    let start = Instant::now();
    loop {
        let t = text();
        if let Some(l) = t.lines().find(|l| needles.iter().all(|n| l.contains(n))) {
            return l.to_string();
        }
        assert!(start.elapsed() < timeout, "{what}: no log line with {needles:?} within {timeout:?}\n{t}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_checkpoint_and_shard_list_znodes() {
    let s = TestStream::create("rel-malformed", 2).await;
    let dir = scratch("rel-malformed");
    let cluster = Cluster::new(&s.name, &dir);
    let zk = support::zk_client().await;
    let mut w = spawn_worker(&cluster, "w1", 1, &[], &[]);
    let m1 = put(&s, 200, 10).await;
    let r = cluster.wait_delivered(std::slice::from_ref(&m1), Duration::from_secs(60)).await;
    assert_eq!(r.lost, 0, "{r:?}\n{}", cluster.logs());

    // 1. A malformed checkpoint: the error names the znode and the fix.
    let cps = format!("{}/checkpoints", cluster.stream_path());
    let mut shards = zk.list_children(&cps).await.unwrap();
    shards.sort();
    let bad = format!("{cps}/{}", shards[0]);
    zk.set_data(&bad, b"{this is not json", None).await.unwrap();
    let m2 = put(&s, 200, 10).await;
    let line =
        wait_log("malformed checkpoint", Duration::from_secs(20), || w.log_text(), &["malformed data in", &bad]).await;
    assert!(line.contains("delete the znode or run `squall checkpoints reset`"), "no fix named: {line}");
    eprintln!("malformed checkpoint -> {line}");
    // The operator's fix: stop the worker, delete the znode, start again. The shard starts again
    // from TRIM_HORIZON: duplicates, no loss. (Deleting it under a running owner leaves that owner
    // stuck: see `deleting_a_malformed_checkpoint_under_its_running_owner` below.)
    w.stop(Duration::from_secs(30));
    zk.delete(&bad, None).await.unwrap();
    let mut w = spawn_worker(&cluster, "w1b", 1, &[], &[]);
    let r = cluster.wait_delivered(&[m1.clone(), m2.clone()], Duration::from_secs(60)).await;
    assert_eq!(r.lost, 0, "after deleting the malformed checkpoint: {r:?}\n{}", cluster.logs());

    // 2. A malformed shard list.
    let list = format!("{}/shards", cluster.stream_path());
    zk.set_data(&list, b"[1, 2", None).await.unwrap();
    let m3 = put(&s, 200, 10).await;
    let line =
        wait_log("malformed shard list", Duration::from_secs(20), || w.log_text(), &["malformed data in", &list]).await;
    eprintln!("malformed shard list -> {line}");
    zk.delete(&list, None).await.unwrap();
    let all = [m1, m2, m3];
    let r = cluster.wait_delivered(&all, Duration::from_secs(60)).await;
    assert_eq!(r.lost, 0, "after deleting the malformed shard list: {r:?}\n{}", cluster.logs());
    eprintln!("RELIABILITY malformed-znodes: {}", serde_json::to_string(&r).unwrap());
    assert!(w.is_running(), "the worker died\n{}", w.log_text());
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0));
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}

/// The Malformed error tells the operator to delete the znode. Doing so while the shard's owner
/// runs must not leave the shard stuck: the owner notices the broken checkpoint at its next write
/// (checkpoints are not watched, so new records are put first), reports it with the path and the
/// fix, and once the znode is deleted the shard starts over from TRIM_HORIZON: duplicates, no loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_malformed_checkpoint_under_its_running_owner() {
    let s = TestStream::create("rel-malformed-live", 2).await;
    let dir = scratch("rel-malformed-live");
    let cluster = Cluster::new(&s.name, &dir);
    let zk = support::zk_client().await;
    let mut w = spawn_worker(&cluster, "w1", 1, &[], &[]);
    let m1 = put(&s, 200, 10).await;
    let r = cluster.wait_delivered(std::slice::from_ref(&m1), Duration::from_secs(60)).await;
    assert_eq!(r.lost, 0, "{r:?}\n{}", cluster.logs());
    let cps = format!("{}/checkpoints", cluster.stream_path());
    let mut shards = zk.list_children(&cps).await.unwrap();
    shards.sort();
    let bad = format!("{cps}/{}", shards[0]);
    zk.set_data(&bad, b"{this is not json", None).await.unwrap();
    let m2 = put(&s, 200, 10).await;
    wait_log("malformed checkpoint", Duration::from_secs(20), || w.log_text(), &["malformed data in", &bad]).await;
    zk.delete(&bad, None).await.unwrap();
    let m3 = put(&s, 200, 10).await;
    let r = cluster.wait_delivered(&[m1, m2, m3], Duration::from_secs(30)).await;
    assert_eq!(r.lost, 0, "after deleting the malformed checkpoint as advised: {r:?}\n{}", w.log_text());
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0));
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_stream_is_reported_and_read_once_it_exists() {
    let dir = scratch("rel-unknown");
    let name = support::unique_name("rel-unknown");
    let cluster = Cluster::new(&name, &dir);
    let mut w = spawn_worker(&cluster, "w1", 1, &[], &[]);
    let line = wait_log("unknown stream", Duration::from_secs(30), || w.log_text(), &["does not exist", &name]).await;
    assert!(line.contains("squall stream create"), "no fix named: {line}");
    eprintln!("unknown stream -> {line}");
    assert!(w.is_running(), "the worker should wait for the stream\n{}", w.log_text());

    // Created late: read from the start, nothing lost.
    let endpoint = support::kinesis_endpoint();
    let client = endpoint.client().await.unwrap();
    kinesis::create_stream(&client, &endpoint.label(), &name, 2).await.unwrap();
    let opts = PutOptions { count: 200, keys: 10, ..PutOptions::default() };
    let m = kinesis::put_records(&client, &endpoint.label(), &name, &opts).await.expect("put").manifest;
    let r = cluster.wait_delivered(std::slice::from_ref(&m), Duration::from_secs(60)).await;
    assert_eq!(r.lost, 0, "{r:?}\n{}", w.log_text());
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0));
    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    let _ = kinesis::delete_stream(&client, &endpoint.label(), &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_deleted_mid_run() {
    let s = TestStream::create("rel-deleted", 2).await;
    let dir = scratch("rel-deleted");
    let cluster = Cluster::new(&s.name, &dir);
    let mut w = spawn_worker(&cluster, "w1", 1, &[], &[]);
    let m = put(&s, 300, 10).await;
    let r = cluster.wait_delivered(std::slice::from_ref(&m), Duration::from_secs(60)).await;
    assert_eq!(r.lost, 0, "{r:?}\n{}", cluster.logs());
    let name = s.name.clone();
    s.delete().await;
    let deleted = Instant::now();
    let line = wait_log("deleted stream", Duration::from_secs(30), || w.log_text(), &["does not exist", &name]).await;
    eprintln!("stream deleted -> {line}");
    // It keeps backing off (bounded rate of failing calls), does not crash, and stops cleanly.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let failures = w.log_text().lines().filter(|l| l.contains("does not exist")).count();
    let per_s = failures as f64 / deleted.elapsed().as_secs_f64();
    eprintln!("{failures} 'does not exist' lines in {:?} ({per_s:.1}/s)", deleted.elapsed());
    assert!(per_s < 10.0, "hot loop on a deleted stream: {per_s:.1} errors/s");
    assert!(w.is_running(), "the worker crashed\n{}", w.log_text());
    let r = cluster.audit(std::slice::from_ref(&m));
    assert_eq!(r.lost, 0, "{r:?}");
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0), "{}", w.log_text());
    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
}

#[test]
fn invalid_configuration_values_are_refused_naming_the_key() {
    let dir = scratch("rel-config");
    let cases: Vec<(&str, Vec<String>, Option<serde_json::Value>, &str)> = vec![
        ("records_per_get 0", vec![], Some(serde_json::json!({"records_per_get": 0})), "records_per_get"),
        (
            "max_get_calls_per_second 10",
            vec![],
            Some(serde_json::json!({"max_get_calls_per_second": 10})),
            "max_get_calls_per_second",
        ),
        (
            "checkpoint_interval_ms 0",
            vec![],
            Some(serde_json::json!({"checkpoint_interval_ms": 0})),
            "checkpoint_interval_ms",
        ),
        ("unknown key", vec![], Some(serde_json::json!({"recrods_per_get": 5})), "unknown field `recrods_per_get`"),
        ("retry not an object", vec![], Some(serde_json::json!({"retry": 3})), "invalid spout configuration"),
        ("root without slash", vec!["--zk-root".into(), "squall".into()], None, "root"),
        ("session timeout 1 ms", vec!["--zk-session-timeout-ms".into(), "1".into()], None, "session_timeout_ms"),
        ("initial position", vec!["--initial-position".into(), "sideways".into()], None, "is not an initial position"),
        ("bad stream name", vec!["--stream".into(), "no spaces allowed".into()], None, "stream"),
        ("endpoint", vec!["--endpoint".into(), "ftp://127.0.0.1:1".into()], None, "endpoint"),
    ];
    for (i, (what, args, cfg, needle)) in cases.into_iter().enumerate() {
        let mut cmd = Command::new(audit_bin());
        cmd.args(["--topology", "t", "--stream", "s", "--deliveries"]).arg(dir.join(format!("d{i}.jsonl")));
        cmd.env("SQUALL_ZK", "127.0.0.1:1").env_remove("RUST_LOG"); // must fail before connecting
        if let Some(cfg) = cfg {
            let p = dir.join(format!("cfg{i}.json"));
            std::fs::write(&p, cfg.to_string()).unwrap();
            cmd.arg("--spout-config").arg(p);
        }
        cmd.args(&args);
        let start = Instant::now();
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
        eprintln!("{what}: exit {:?} in {:?}: {}", out.status.code(), start.elapsed(), err.trim());
        assert!(!out.status.success(), "{what}: accepted\n{err}");
        assert!(err.contains(needle), "{what}: the error does not name {needle:?}:\n{err}");
        assert!(start.elapsed() < Duration::from_secs(5), "{what}: took {:?} to refuse", start.elapsed());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_record_that_panics_is_dead_lettered_and_others_flow() {
    let s = TestStream::create("rel-poison", 2).await;
    let dir = scratch("rel-poison");
    let cluster = Cluster::with_spout_config(
        &s.name,
        &dir,
        serde_json::json!({"retry": {"max_replays": 2, "replay_min_backoff_ms": 20, "replay_max_backoff_ms": 100}}),
    );
    let dead = dir.join("dead.jsonl");
    let dead_arg = dead.to_string_lossy().to_string();
    let mut w = spawn_worker(&cluster, "w1", 1, &["--panic-key", "key-3", "--dead-letters", &dead_arg], &[]);
    let m = put(&s, 400, 10).await;
    let healthy = manifest_without(&m, &["key-3"]);
    let poisoned = m.counts["key-3"];
    let r = cluster.wait_delivered(std::slice::from_ref(&healthy), Duration::from_secs(60)).await;
    assert_eq!(r.lost, 0, "healthy keys: {r:?}\n{}", cluster.logs());
    // Every key-3 record reaches the dead-letter stream once its replays are used up.
    let start = Instant::now();
    let dead_seqs = loop {
        let text = std::fs::read_to_string(&dead).unwrap_or_default();
        let seqs: BTreeSet<u64> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .inspect(|v| assert_eq!(v["key"], "key-3", "a healthy record was dead-lettered: {v}"))
            .inspect(|v| assert_eq!(v["failures"], 3, "dead-lettered after the wrong number of failures: {v}"))
            .filter_map(|v| v["seq"].as_u64())
            .collect();
        if seqs.len() as u64 == poisoned || start.elapsed() > Duration::from_secs(60) {
            break seqs;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(dead_seqs.len() as u64, poisoned, "dead-lettered {dead_seqs:?} of {poisoned}\n{}", cluster.logs());
    let counted = w.log_text().lines().filter(|l| l.contains("emitting it on the dead-letter stream")).count();
    let panics = w.log_text().lines().filter(|l| l.contains("panic")).count();
    eprintln!(
        "RELIABILITY poison: {} of {} healthy delivered, {poisoned} poison dead-lettered, {counted} counted in the log, {panics} panic lines",
        r.distinct, r.produced
    );
    assert!(counted as u64 >= poisoned, "dead letters not counted/logged: {counted}");
    assert!(panics > 0, "the bolt never panicked?\n{}", w.log_text());
    assert!(w.is_running(), "the worker died of the panics\n{}", w.log_text());
    // No poison record was delivered to the sink.
    let delivered = cluster.audit(std::slice::from_ref(&m));
    assert_eq!(delivered.lost, poisoned, "{delivered:?}");
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0));
    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_records() {
    let s = TestStream::create("rel-big", 2).await;
    // Over Kinesis' 1 MB per record: refused by the producer before anything is sent.
    let out = Command::new(env!("CARGO_BIN_EXE_squall"))
        .args(["stream", "put", &s.name, "--count", "1", "--size", "1500000"])
        .env("SQUALL_KINESIS_ENDPOINT", support::kinesis_endpoint().endpoint)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("1 MB"), "oversized put: {err}");
    eprintln!("oversized put -> {}", err.trim());
    // Records near the limit (900 KB: a GetRecords answer of several MB) are read and delivered.
    let dir = scratch("rel-big");
    let cluster = Cluster::new(&s.name, &dir);
    let mut w = spawn_worker(&cluster, "w1", 1, &[], &[]);
    let opts = PutOptions { count: 12, keys: 3, size: 900_000, ..PutOptions::default() };
    let big = kinesis::put_records(&s.client, &s.label(), &s.name, &opts).await.expect("put big").manifest;
    let small = put(&s, 100, 5).await;
    let r = cluster.wait_delivered(&[big, small], Duration::from_secs(60)).await;
    eprintln!("RELIABILITY oversized: {}", serde_json::to_string(&r).unwrap());
    assert_eq!(r.lost, 0, "{r:?}\n{}", cluster.logs());
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0));
    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}
