//! Low watermarks and drain, end to end with the windowed Kinesis example:
//! - an idle shard does not hold windows back longer than the idle timeout;
//! - watermarks seen by a bolt task never move backwards;
//! - `squall drain` under load: nothing read after the notification apart from what was in
//!   flight, open windows flushed, checkpoints at the last processed records, the topology
//!   DRAINED and the workers exit 0; a later start continues from the checkpoints with nothing
//!   lost and nothing repeated; a drain notification of another deployment is ignored.

use squall_test_support as support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use squall::coord::{CheckpointPosition, sequence_cmp};
use squall::kinesis::{self, PutOptions};
use support::TestStream;
use support::ops::{assert_watermarks_monotonic, json_lines, squall_run};
use support::workers::{Cluster, example_bin, read_deliveries, read_log_entries, scratch};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_shard_does_not_hold_windows_back_longer_than_the_idle_timeout() {
    let s = TestStream::create("idle", 2).await;
    let dir = scratch("idle");
    let idle_ms = 1000;
    let cluster = Cluster::with_spout_config(&s.name, &dir, serde_json::json!({"watermark_idle_timeout_ms": idle_ms}));
    let out = dir.join("windows.jsonl");
    let wms = dir.join("watermarks.jsonl");
    let bin = example_bin("windowed_counts");
    let mut w = cluster.start_example(
        &bin,
        "w",
        1,
        &["--window-ms", "1000", "--out", out.to_str().unwrap(), "--watermarks", wms.to_str().unwrap()],
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    // One partition key: every record goes to one shard; the other shard stays idle.
    let opts = PutOptions { count: 400, keys: 1, rate: Some(60.0), ..PutOptions::default() };
    kinesis::put_records(&s.client, &s.label(), &s.name, &opts).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let fired: Vec<_> = json_lines(&out).into_iter().filter(|l| l.get("late").is_none()).collect();
    assert!(fired.len() >= 4, "windows fired while a shard was idle: {fired:?}\n{}", cluster.logs());
    let limit = idle_ms + 1500;
    for f in &fired {
        let delay = f["fired_at_ms"].as_i64().unwrap() - f["window_end_ms"].as_i64().unwrap();
        assert!(delay >= 0, "a window fired before its end: {f}");
        assert!(delay <= limit, "window fired {delay} ms after its end (idle timeout {idle_ms} ms): {f}");
    }
    let total: u64 = fired.iter().map(|f| f["count"].as_u64().unwrap()).sum();
    assert!(total > 300, "most records counted in fired windows before any drain: {total}");
    assert!(assert_watermarks_monotonic(&wms) > 5, "watermarks observed");
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0));
    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_under_load_flushes_windows_checkpoints_exactly_and_ignores_stale_notifications() {
    drain_under_load("drain", false).await;
}

/// The same with enhanced fan-out: the drain drops the subscriptions, nothing is handed on after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn efo_drain_under_load_flushes_windows_and_checkpoints_exactly() {
    drain_under_load("drain-efo", true).await;
}

async fn drain_under_load(prefix: &str, efo: bool) {
    let s = TestStream::create(prefix, 3).await;
    let dir = scratch(prefix);
    let cluster = Cluster::with_spout_config(&s.name, &dir, serde_json::json!({"watermark_idle_timeout_ms": 1000}));
    let bin = example_bin("windowed_counts");
    let consumer = format!("efo:{}-app", s.name);
    let start = |name: &str| {
        let out = dir.join(format!("{name}.windows.jsonl"));
        let wms = dir.join(format!("{name}.watermarks.jsonl"));
        let mut args =
            vec!["--window-ms", "1000", "--out", out.to_str().unwrap(), "--watermarks", wms.to_str().unwrap()];
        if efo {
            args.extend(["--consumer", consumer.as_str()]);
        }
        cluster.start_example(&bin, name, 1, &args)
    };
    let mut a = start("a");
    let mut b = start("b");
    let producer = {
        let (client, label, name) = (s.client.clone(), s.label(), s.name.clone());
        tokio::spawn(async move {
            let opts = PutOptions { count: 1500, keys: 12, rate: Some(150.0), ..PutOptions::default() };
            kinesis::put_records(&client, &label, &name, &opts).await.expect("put").manifest
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let zk = support::zk_client().await;
    let topo = format!("{}/topologies/{}", cluster.zk_root, cluster.topology);

    // A drain notification of another deployment is ignored.
    let (data, _) = zk.get_data(&format!("{topo}/state")).await.unwrap();
    let state: serde_json::Value = serde_json::from_slice(&data).unwrap();
    let deployment = state["deployment_id"].as_str().unwrap().to_string();
    let stale = serde_json::json!({"deployment_id": "stale-deployment", "requested_at_ms": squall::coord::now_ms()});
    let opts = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    zk.create(&format!("{topo}/drain"), stale.to_string().as_bytes(), &opts).await.unwrap();
    let before = read_deliveries(&cluster.delivery_files()).len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(a.is_running() && b.is_running(), "a stale drain notification stopped a worker\n{}", cluster.logs());
    assert!(read_deliveries(&cluster.delivery_files()).len() > before, "consumption went on");

    // Drain under load.
    let drained_at = squall::coord::now_ms();
    let t0 = Instant::now();
    let (rc, out, err) = squall_run(&cluster, &["drain", &cluster.topology, "--wait", "60"]);
    assert_eq!(rc, 0, "{out}{err}\n{}", cluster.logs());
    eprintln!("drain took {:?}: {out}", t0.elapsed());
    assert_eq!(a.stop(Duration::from_secs(20)), Some(0), "worker exits 0 after the drain\n{}", cluster.logs());
    assert_eq!(b.stop(Duration::from_secs(20)), Some(0));
    let (_, st, _) = squall_run(&cluster, &["status", &cluster.topology, "--json"]);
    let st: serde_json::Value = serde_json::from_str(&st).unwrap();
    assert_eq!(st["state"], "DRAINED");
    assert_eq!(st["deployment_id"], deployment.as_str());

    // Nothing read after the notification apart from what was in flight (a GetRecords call in
    // progress when it arrived: allow its round trip), and no shard acquired after it.
    let reads = read_log_entries(&cluster.read_logs());
    for e in &reads {
        assert!(!(e.event == "acquire" && e.t_ms > drained_at + 300), "shard acquired after the drain: {e:?}");
        assert!(!(e.event == "records" && e.t_ms > drained_at + 1500), "records read after the drain: {e:?}");
    }
    // Every processed record is in a fired window: open windows were flushed.
    let delivered = read_deliveries(&cluster.delivery_files());
    let windows: Vec<_> = cluster
        .dir
        .read_dir()
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".windows.jsonl"))
        .collect();
    let counted: u64 = windows
        .iter()
        .flat_map(|p| json_lines(p))
        .filter(|l| l.get("late").is_none())
        .map(|l| l["count"].as_u64().unwrap())
        .sum();
    let late = windows.iter().flat_map(|p| json_lines(p)).filter(|l| l.get("late").is_some()).count() as u64;
    assert_eq!(counted + late, delivered.len() as u64, "windows flushed at the drain count every delivered record");
    for p in cluster.dir.read_dir().unwrap().filter_map(|e| e.ok()).map(|e| e.path()) {
        if p.to_string_lossy().ends_with(".watermarks.jsonl") {
            assert_watermarks_monotonic(&p);
            let last = json_lines(&p).last().cloned().unwrap();
            assert_eq!(last["watermark"].as_u64(), Some(u64::MAX), "+infinity watermark at the drain");
        }
    }
    // Checkpoints sit at the last processed record of each shard.
    let mut last_seq: HashMap<String, String> = HashMap::new();
    for d in &delivered {
        let e = last_seq.entry(d.shard.clone()).or_insert_with(|| d.sequence.clone());
        if sequence_cmp(&d.sequence, e).is_gt() {
            *e = d.sequence.clone();
        }
    }
    for (shard, seq) in &last_seq {
        let (data, _) = zk.get_data(&format!("{}/checkpoints/{shard}", cluster.stream_path())).await.unwrap();
        let cp: squall::coord::Checkpoint = serde_json::from_slice(&data).unwrap();
        assert_eq!(
            cp.position,
            CheckpointPosition::AfterSequence { sequence: seq.clone(), sub_sequence: 0 },
            "{shard}"
        );
    }

    // A later start is a new deployment and continues from the checkpoints: nothing lost,
    // nothing repeated.
    let manifest = producer.await.unwrap();
    let mut c = start("c");
    let r = cluster.wait_delivered(std::slice::from_ref(&manifest), Duration::from_secs(60)).await;
    assert_eq!(r.lost, 0, "{r:?}\n{}", cluster.logs());
    assert_eq!(r.duplicates, 0, "the drain checkpointed exactly: {r:?}");
    let (_, st, _) = squall_run(&cluster, &["status", &cluster.topology, "--json"]);
    let st: serde_json::Value = serde_json::from_str(&st).unwrap();
    assert_eq!(st["state"], "ACTIVE");
    assert_ne!(st["deployment_id"], deployment.as_str(), "a new deployment id after a drain");
    if efo {
        // Every worker read its shards by subscriptions (debug log of `spout::efo`).
        for name in ["a", "b", "c"] {
            let log = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
            assert!(log.contains("subscribing to the shard"), "{name} did not read by enhanced fan-out\n{log}");
        }
    }
    assert_eq!(c.stop(Duration::from_secs(30)), Some(0));
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}
