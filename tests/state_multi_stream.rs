//! Exactly-once keyed state over several input streams, against kinesis-local, ZooKeeper and
//! dynalite: workers of `examples/exactly_once_counts.rs --stream A --stream B` count records per
//! partition key, both streams written with the same keys (so one key's item holds records of
//! both streams, whose shards have the same ids: every stream has a `shardId-000000000000`).
//! Record ids, floors and lease-token fences are per (stream, shard): a floor or a token of one
//! stream's shard says nothing of the other's. One worker is SIGKILLed and replaced mid-run; at
//! the end every key's count equals the records written with that key to both streams.

use squall_test_support as support;

use std::time::{Duration, Instant};

use squall::kinesis::payload::Manifest;
use squall::state::{StateEndpoint, StateStore};
use support::TestStream;
use support::reliability::spawn_producer;
use support::state::{count_in, start_counts, wait_reading};
use support::workers::{Cluster, scratch};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_over_two_streams_with_the_same_shard_ids_are_exact_through_a_sigkill() {
    let t0 = Instant::now();
    let mark = |what: &str| eprintln!("[{:>6.1} s] {what}", t0.elapsed().as_secs_f64());
    let a = TestStream::create("eo-two-a", 2).await;
    let b = TestStream::create("eo-two-b", 2).await;
    let dir = scratch("eo-two");
    let cluster = Cluster::with_spout_config(&a.name, &dir, serde_json::json!({ "checkpoint_interval_ms": 200 }));
    let table = support::unique_name("eo-two");
    let url = support::state_endpoint();
    let ep = StateEndpoint::new(url.clone(), table.clone());
    StateStore::open(&ep).await.expect("state table");
    let both = ["--stream", b.name.as_str()];

    // the same 20 keys in both streams
    let pa = spawn_producer(&a.client, &a.label(), &a.name, 2000, 20, 200.0);
    let pb = spawn_producer(&b.client, &b.label(), &b.name, 2000, 20, 200.0);
    let mut w1 = start_counts(&cluster, "w1", &url, &table, &both);
    let mut w2 = start_counts(&cluster, "w2", &url, &table, &both);
    wait_reading(&w1, &cluster).await;
    wait_reading(&w2, &cluster).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    w2.kill();
    mark("SIGKILL w2");
    let mut w3 = start_counts(&cluster, "w3", &url, &table, &both);

    let (ma, mb): (Manifest, Manifest) = (pa.await.unwrap(), pb.await.unwrap());
    let (pa_path, pb_path) = (dir.join("manifest-a.json"), dir.join("manifest-b.json"));
    std::fs::write(&pa_path, serde_json::to_string(&ma).unwrap()).unwrap();
    std::fs::write(&pb_path, serde_json::to_string(&mb).unwrap()).unwrap();
    assert_eq!(ma.counts.keys().collect::<Vec<_>>(), mb.counts.keys().collect::<Vec<_>>(), "the same keys in both");
    mark(&format!("producers done: {} + {} records", ma.total, mb.total));

    let manifests = [pa_path, pb_path];
    let start = Instant::now();
    let report = loop {
        let r = squall::audit::audit_counts(&manifests, &ep, &cluster.topology, "counts").await.unwrap();
        if r.mismatched == 0 || start.elapsed() > Duration::from_secs(90) {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    mark("counts settled (or timed out)");
    eprintln!("report: {report:?}");
    assert_eq!(report.expected_total, 4000);
    assert_eq!(
        (report.mismatched, report.over, report.under, report.counted_total),
        (0, 0, 0, 4000),
        "counts differ from the two manifests: {report:?}\n{}",
        cluster.logs()
    );
    // both streams were read by both live workers' tasks
    for (w, s) in [(&w1, &a.name), (&w1, &b.name), (&w3, &a.name), (&w3, &b.name)] {
        assert!(
            std::fs::read_to_string(&w.log)
                .unwrap_or_default()
                .lines()
                .any(|l| l.contains("reading shard") && l.contains(&format!("stream={s}"))),
            "{} never read a shard of {s}\n{}",
            w.name,
            cluster.logs()
        );
    }
    let skipped: usize =
        ["w1", "w2", "w3"].iter().map(|n| count_in(&dir.join(format!("{n}.log")), "duplicate input skipped")).sum();
    eprintln!("duplicates skipped: {skipped}");
    for p in [&mut w1, &mut w3] {
        p.stop(Duration::from_secs(15));
    }
    a.delete().await;
    b.delete().await;
}
