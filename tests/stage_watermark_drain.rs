//! Watermarks and drain across a stage boundary (examples/windowed_counts.rs with
//! `--boundary-shards`): the windows run in the second stage, behind an intermediate Kinesis
//! stream, and see the watermark carried across it.

use squall_test_support as support;

use std::time::Duration;

use squall::kinesis::{self, PutOptions};
use support::TestStream;
use support::ops::{assert_watermarks_monotonic, json_lines, squall_run};
use support::workers::{Cluster, Worker, example_bin, read_deliveries, scratch};

fn files(cluster: &Cluster, suffix: &str) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = cluster
        .dir
        .read_dir()
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    v.sort();
    v
}

/// Starts worker `name` of `windowed_counts` in two stages (1 s windows, 2 intermediate shards),
/// logging fired windows to `{name}.windows.jsonl` and watermarks to `{name}.watermarks.jsonl`.
fn start_windows(cluster: &Cluster, name: &str) -> Worker {
    let out = cluster.dir.join(format!("{name}.windows.jsonl"));
    let wms = cluster.dir.join(format!("{name}.watermarks.jsonl"));
    cluster.start_example(
        &example_bin("windowed_counts"),
        name,
        1,
        &[
            "--window-ms",
            "1000",
            "--boundary-shards",
            "2",
            "--out",
            out.to_str().unwrap(),
            "--watermarks",
            wms.to_str().unwrap(),
        ],
    )
}

async fn delete_intermediate(cluster: &Cluster) {
    let endpoint = support::kinesis_endpoint();
    let client = endpoint.client().await.unwrap();
    let _ = kinesis::delete_stream(&client, &endpoint.label(), &format!("{}-keys", cluster.topology)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn across_a_boundary_an_idle_shard_does_not_stall_windows_and_they_fire_in_event_time_order() {
    // 2 source shards, one idle (a single key); 2 intermediate shards, one idle (one key)
    let s = TestStream::create("sidle", 2).await;
    let dir = scratch("sidle");
    let idle_ms = 1000;
    let cluster = Cluster::with_spout_config(&s.name, &dir, serde_json::json!({"watermark_idle_timeout_ms": idle_ms}));
    let (out, wms) = (dir.join("w.windows.jsonl"), dir.join("w.watermarks.jsonl"));
    let mut w = start_windows(&cluster, "w");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let opts = PutOptions { count: 400, keys: 1, rate: Some(60.0), ..PutOptions::default() };
    kinesis::put_records(&s.client, &s.label(), &s.name, &opts).await.unwrap();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let fired: Vec<_> = json_lines(&out).into_iter().filter(|l| l.get("late").is_none()).collect();
    assert!(fired.len() >= 4, "windows fired while shards were idle: {fired:?}\n{}", cluster.logs());
    // on top of the one-stage bound (idle timeout + 1.5 s), the boundary adds at most one writer
    // watermark interval (1 s) for the idle intermediate shard, a put, a read, and at start the
    // first contact with each producer (measured: 1.4-1.7 s steady, up to 4 s for the first
    // window)
    let limit = idle_ms + 1500 + 1000 + 2000;
    for f in &fired {
        let delay = f["fired_at_ms"].as_i64().unwrap() - f["window_end_ms"].as_i64().unwrap();
        assert!(delay >= 0, "a window fired before its end: {f}");
        assert!(delay <= limit, "window fired {delay} ms after its end (idle timeout {idle_ms} ms): {f}");
    }
    // event-time order: the one output task sees windows of the key in order of their end
    let ends: Vec<i64> = fired.iter().map(|f| f["window_end_ms"].as_i64().unwrap()).collect();
    assert!(ends.windows(2).all(|p| p[0] < p[1]), "windows fired out of event-time order: {ends:?}");
    let total: u64 = fired.iter().map(|f| f["count"].as_u64().unwrap()).sum();
    assert!(total > 300, "most records counted in fired windows: {total}");
    assert!(assert_watermarks_monotonic(&wms) > 5, "watermarks observed");
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0), "{}", cluster.logs());
    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    delete_intermediate(&cluster).await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_crosses_the_boundary_and_ignores_a_stale_deployments_marker() {
    let s = TestStream::create("sdrain", 3).await;
    let dir = scratch("sdrain");
    let cluster = Cluster::with_spout_config(&s.name, &dir, serde_json::json!({"watermark_idle_timeout_ms": 1000}));
    let mut a = start_windows(&cluster, "a");
    let mut b = start_windows(&cluster, "b");
    let producer = {
        let (client, label, name) = (s.client.clone(), s.label(), s.name.clone());
        tokio::spawn(async move {
            let opts = PutOptions { count: 3000, keys: 12, rate: Some(150.0), ..PutOptions::default() };
            kinesis::put_records(&client, &label, &name, &opts).await.expect("put").manifest
        })
    };
    let wait_delivered = |n: usize| {
        let cluster = &cluster;
        async move {
            let start = std::time::Instant::now();
            while read_deliveries(&cluster.delivery_files()).len() < n {
                assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "fewer than {n} delivered in 60 s\n{}",
                    cluster.logs()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    wait_delivered(100).await;

    // a drain marker of another deployment in every shard of the intermediate stream
    let inter = format!("{}-keys", cluster.topology);
    let shards = kinesis::list_shards(&s.client, &s.label(), &inter).await.expect("the intermediate stream exists");
    let stale = squall::stage::codec::encode_control(0x57a1e, "stale0000000", Some(1), true);
    for sh in shards.iter().filter(|sh| !sh.closed) {
        s.client
            .put_record()
            .stream_name(&inter)
            .partition_key("stale")
            .explicit_hash_key(&sh.starting_hash_key)
            .data(aws_sdk_kinesis::primitives::Blob::new(stale.to_vec()))
            .send()
            .await
            .expect("put a stale marker");
    }
    wait_delivered(300).await;
    assert!(a.is_running() && b.is_running(), "a stale marker stopped a worker\n{}", cluster.logs());

    let (rc, out, err) = squall_run(&cluster, &["drain", &cluster.topology, "--wait", "90"]);
    assert_eq!(rc, 0, "{out}{err}\n{}", cluster.logs());
    assert_eq!(a.stop(Duration::from_secs(30)), Some(0), "worker exits 0 after the drain\n{}", cluster.logs());
    assert_eq!(b.stop(Duration::from_secs(30)), Some(0));
    let (_, st, _) = squall_run(&cluster, &["status", &cluster.topology, "--json"]);
    let st: serde_json::Value = serde_json::from_str(&st).unwrap();
    assert_eq!(st["state"], "DRAINED");
    // whole logs (`cluster.logs()` keeps only their ends)
    let logs: String = files(&cluster, ".log").iter().map(|p| std::fs::read_to_string(p).unwrap_or_default()).collect();
    let ignored = logs.matches("ignoring a drain marker of another deployment").count();
    assert!(ignored >= 2, "the stale markers (one per intermediate shard) were read and ignored: {ignored}");

    // everything the first stage delivered went through the boundary and was counted by the
    // windows flushed at the drain
    let delivered = read_deliveries(&cluster.delivery_files());
    assert!(
        delivered.len() >= 300 && delivered.len() < 3000,
        "the drain came under load: {} delivered",
        delivered.len()
    );
    let windows = files(&cluster, ".windows.jsonl");
    let counted: u64 = windows
        .iter()
        .flat_map(|p| json_lines(p))
        .filter(|l| l.get("late").is_none())
        .map(|l| l["count"].as_u64().unwrap())
        .sum();
    let late = windows.iter().flat_map(|p| json_lines(p)).filter(|l| l.get("late").is_some()).count() as u64;
    assert_eq!(
        counted + late,
        delivered.len() as u64,
        "the second stage counted every record the first delivered before draining\n{}",
        cluster.logs()
    );
    for p in files(&cluster, ".watermarks.jsonl") {
        assert_watermarks_monotonic(&p);
        let last = json_lines(&p).last().cloned().unwrap();
        assert_eq!(last["watermark"].as_u64(), Some(u64::MAX), "+infinity watermark at the drain");
    }
    producer.abort();
    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    delete_intermediate(&cluster).await;
    s.delete().await;
}
