//! Resharding under load: 2 workers x 2 spout tasks read a 4-shard stream while a producer writes
//! per-key sequence-numbered records for 100 keys (200 a second) and the stream is split twice,
//! merged, scaled up and scaled down, each while the producer writes and the workers deliver. Every record is delivered, none lost, per key the first deliveries are in
//! producer order, no child shard is read before its parents finished, never two readers at once,
//! and afterwards the shard list in ZooKeeper equals ListShards.

use squall_test_support as support;

use std::collections::HashMap;
use std::time::Duration;

use squall::coord::ShardList;
use squall::kinesis;
use support::TestStream;
use support::reliability::spawn_producer;
use support::workers::{Cluster, read_log_entries, read_log_violations, scratch};

fn open_shards(shards: &[squall::kinesis::ShardDescription]) -> Vec<&squall::kinesis::ShardDescription> {
    let mut v: Vec<_> = shards.iter().filter(|s| !s.closed).collect();
    v.sort_by_key(|s| s.starting_hash_key.parse::<u128>().unwrap());
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_under_load_loses_nothing_and_keeps_order() {
    let s = TestStream::create("reshard", 4).await;
    let dir = scratch("reshard");
    let cluster = Cluster::new(&s.name, &dir);
    let mut w1 = cluster.start("w1", 2);
    let mut w2 = cluster.start("w2", 2);
    let label = s.label();

    // A producer at 200 records a second for 12 s; each reshard below happens while it writes and
    // while the workers read (asserted: more records delivered since the one before).
    let producer = spawn_producer(&s.client, &label, &s.name, 2400, 100, 200.0);
    let mut delivered = cluster.wait_more_delivered(0).await;
    let mut reshards = Vec::new();
    kinesis::split_shard(&s.client, &label, &s.name, "shardId-000000000000").await.unwrap();
    reshards.push(("split shardId-000000000000".to_string(), delivered));
    delivered = cluster.wait_more_delivered(delivered).await;
    kinesis::split_shard(&s.client, &label, &s.name, "shardId-000000000002").await.unwrap();
    reshards.push(("split shardId-000000000002".to_string(), delivered));
    delivered = cluster.wait_more_delivered(delivered).await;
    // Merge two adjacent open shards.
    let shards = kinesis::list_shards(&s.client, &label, &s.name).await.unwrap();
    let open = open_shards(&shards);
    let (a, b) = (open[open.len() - 2].shard_id.clone(), open[open.len() - 1].shard_id.clone());
    kinesis::merge_shards(&s.client, &label, &s.name, &a, &b).await.unwrap();
    reshards.push((format!("merge {a} + {b}"), delivered));
    delivered = cluster.wait_more_delivered(delivered).await;
    kinesis::scale_stream(&s.client, &label, &s.name, 8).await.unwrap();
    reshards.push(("scale to 8".to_string(), delivered));
    delivered = cluster.wait_more_delivered(delivered).await;
    kinesis::scale_stream(&s.client, &label, &s.name, 4).await.unwrap();
    reshards.push(("scale to 4".to_string(), delivered));
    let producing = !producer.is_finished();
    eprintln!("reshards (delivered before each): {reshards:?}; producer still writing at the last: {producing}");
    assert!(producing, "the producer had finished before the last reshard: the reshards were not under load");
    let manifests = vec![producer.await.unwrap()];

    let report = cluster.wait_delivered(&manifests, Duration::from_secs(90)).await;
    assert_eq!(report.lost, 0, "lost records: {report:?}\n{}", cluster.logs());
    assert_eq!(report.produced, 2400);
    assert_eq!(report.order_violations, 0, "per-key order broken: {report:?}");

    // The read log: parents finished before any child record was read; one reader at a time.
    let shards = kinesis::list_shards(&s.client, &label, &s.name).await.unwrap();
    assert!(shards.len() > 12, "the reshards happened: {} shards", shards.len());
    let parents: HashMap<String, Vec<String>> =
        shards.iter().map(|sh| (sh.shard_id.clone(), sh.parents().map(str::to_string).collect())).collect();
    let entries = read_log_entries(&cluster.read_logs());
    let violations = read_log_violations(&entries, &parents);
    assert!(violations.is_empty(), "read-log violations: {violations:#?}");
    // The shard list in ZooKeeper equals ListShards within a discovery interval (1 s here).
    let zk = support::zk_client().await;
    let path = format!("{}/shards", cluster.stream_path());
    let mut equal = false;
    let mut last = String::new();
    for _ in 0..40 {
        let (data, _) = zk.get_data(&path).await.unwrap();
        let list: ShardList = serde_json::from_slice(&data).unwrap();
        let zk_ids: Vec<(String, bool, Option<String>)> =
            list.shards.iter().map(|s| (s.shard_id.clone(), s.closed, s.parent_shard_id.clone())).collect();
        let now = kinesis::list_shards(&s.client, &label, &s.name).await.unwrap();
        let k_ids: Vec<(String, bool, Option<String>)> =
            now.iter().map(|s| (s.shard_id.clone(), s.closed, s.parent_shard_id.clone())).collect();
        if zk_ids == k_ids {
            equal = true;
            break;
        }
        last = format!("zk: {zk_ids:?}\nkinesis: {k_ids:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(equal, "shard list in ZooKeeper differs from ListShards:\n{last}");

    assert_eq!(w1.stop(Duration::from_secs(30)), Some(0), "{}", cluster.logs());
    assert_eq!(w2.stop(Duration::from_secs(30)), Some(0), "{}", cluster.logs());
    eprintln!("reshard audit: {}", serde_json::to_string(&report).unwrap());
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}
