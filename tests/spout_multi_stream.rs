//! Several streams in one topology: one worker reads two streams (`--stream a --stream b`), a
//! second worker joins, and each stream's shards are assigned over the tasks reading that
//! stream alone (its own task registry, assignment, leases and checkpoints), spreading over both
//! workers. Every record of both streams is delivered once, each tuple saying which stream it
//! came from, and `squall status` shows both streams with their owners.

use squall_test_support as support;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use squall::kinesis::{self, PutOptions};
use support::TestStream;
use support::ops::squall_ok;
use support::workers::{Cluster, read_deliveries, scratch};

/// Per stream (as `squall status --json` shows it): shard -> owning worker task, when owned.
fn owners_by_stream(status: &serde_json::Value) -> BTreeMap<String, BTreeMap<String, Option<String>>> {
    let mut out = BTreeMap::new();
    for s in status["streams"].as_array().cloned().unwrap_or_default() {
        let shards = s["shards"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter(|sh| sh["state"] == "open")
            .map(|sh| (sh["shard_id"].as_str().unwrap_or("").to_string(), sh["owner"].as_str().map(str::to_string)))
            .collect();
        out.insert(s["stream"].as_str().unwrap_or("").to_string(), shards);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_streams_in_one_topology_with_a_worker_joining() {
    let a = TestStream::create("multi-a", 2).await;
    let b = TestStream::create("multi-b", 3).await;
    let dir = scratch("multi");
    let cluster = Cluster::new(&a.name, &dir);
    let put = |s: &TestStream, count: u64| {
        let opts = PutOptions { count, keys: 30, ..PutOptions::default() };
        let (client, label, name) = (s.client.clone(), s.label(), s.name.clone());
        async move { kinesis::put_records(&client, &label, &name, &opts).await.expect("put").manifest }
    };
    let mut manifests = vec![(a.name.clone(), put(&a, 300).await), (b.name.clone(), put(&b, 300).await)];
    let extra = ["--stream", b.name.as_str()];

    // one worker, one task per stream: it owns every shard of both
    let mut w1 = cluster.start_with("w1", 1, &extra);
    let ms: Vec<_> = manifests.iter().map(|(_, m)| m.clone()).collect();
    let r = cluster.wait_delivered(&ms, Duration::from_secs(60)).await;
    assert_eq!((r.lost, r.duplicates), (0, 0), "one worker, two streams: {r:?}\n{}", cluster.logs());

    // a second joins; more records on both
    let mut w2 = cluster.start_with("w2", 1, &extra);
    let start = Instant::now();
    let spread = loop {
        let status: serde_json::Value =
            serde_json::from_str(&squall_ok(&cluster, &["status", &cluster.topology, "--json"])).expect("status json");
        let owners = owners_by_stream(&status);
        let workers_per_stream: Vec<usize> = owners
            .values()
            .map(|sh| {
                let mut holders: Vec<&str> = sh.values().flatten().map(String::as_str).collect();
                holders.sort();
                holders.dedup();
                holders.len()
            })
            .collect();
        let all_owned = owners.values().all(|sh| sh.values().all(Option::is_some));
        if owners.len() == 2 && all_owned && workers_per_stream.iter().all(|n| *n == 2) {
            break owners;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the shards of both streams never spread over both workers: {owners:?}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    eprintln!("owners after the join: {spread:?} ({:.1} s)", start.elapsed().as_secs_f64());
    assert_eq!(spread[&a.name].len(), 2);
    assert_eq!(spread[&b.name].len(), 3);
    manifests.push((a.name.clone(), put(&a, 200).await));
    manifests.push((b.name.clone(), put(&b, 200).await));
    let ms: Vec<_> = manifests.iter().map(|(_, m)| m.clone()).collect();
    let r = cluster.wait_delivered(&ms, Duration::from_secs(60)).await;
    eprintln!("audit: {r:?}");
    assert_eq!((r.lost, r.duplicates, r.order_violations), (0, 0, 0), "{r:?}\n{}", cluster.logs());
    assert_eq!(r.produced, 1000);

    // every tuple says which stream it came from, and both workers delivered from both
    let stream_of_run: HashMap<&str, &str> = manifests.iter().map(|(s, m)| (m.run.as_str(), s.as_str())).collect();
    let deliveries = read_deliveries(&cluster.delivery_files());
    let wrong: Vec<_> =
        deliveries.iter().filter(|d| stream_of_run.get(d.run.as_str()) != Some(&d.stream.as_str())).take(5).collect();
    assert!(wrong.is_empty(), "deliveries naming the wrong stream: {wrong:?}");
    let mut from: BTreeMap<(&str, String), usize> = BTreeMap::new();
    for d in &deliveries {
        let worker = d.worker.split('#').next().unwrap_or("").to_string();
        *from.entry((d.stream.as_str(), worker)).or_default() += 1;
    }
    eprintln!("deliveries per (stream, worker): {from:?}");
    for s in [&a.name, &b.name] {
        assert_eq!(
            from.keys().filter(|(st, _)| *st == s.as_str()).count(),
            2,
            "stream {s} read by both workers: {from:?}"
        );
    }
    for w in [&mut w1, &mut w2] {
        w.stop(Duration::from_secs(15));
    }
    a.delete().await;
    b.delete().await;
}
