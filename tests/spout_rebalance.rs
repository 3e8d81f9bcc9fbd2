//! Re-balancing: one worker owns every shard; two more join and within 2 s the shards are spread
//! with max - min <= 1; one leaves gracefully and its shards are re-owned with no duplicate
//! delivery (handoff waits for in-flight tuples and checkpoints before releasing).

use squall_test_support as support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use squall::kinesis::{self, PutOptions};
use support::TestStream;
use support::workers::{Cluster, live_tasks, owners, scratch};

fn spread(owners: &BTreeMap<String, String>, tasks: &[String]) -> (usize, usize) {
    let mut per: BTreeMap<&str, usize> = tasks.iter().map(|t| (t.as_str(), 0)).collect();
    for o in owners.values() {
        *per.entry(o.as_str()).or_default() += 1;
    }
    (per.values().copied().min().unwrap_or(0), per.values().copied().max().unwrap_or(0))
}

async fn wait_balanced(
    zk: &zookeeper_client::Client,
    cluster: &Cluster,
    tasks: usize,
    shards: usize,
    timeout: Duration,
) -> Option<(Duration, BTreeMap<String, String>)> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        let t = live_tasks(zk, cluster).await;
        let o = owners(zk, cluster).await;
        if t.len() == tasks && o.len() == shards && o.values().all(|x| t.contains(x)) {
            let (min, max) = spread(&o, &t);
            if max - min <= 1 {
                return Some((start.elapsed(), o));
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

async fn wait_tasks(zk: &zookeeper_client::Client, cluster: &Cluster, n: usize) -> Instant {
    let start = Instant::now();
    while live_tasks(zk, cluster).await.len() != n {
        assert!(start.elapsed() < Duration::from_secs(30), "{n} tasks never registered:\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Instant::now()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_join_and_leave_shards_spread_and_hand_off_without_duplicates() {
    let s = TestStream::create("rebalance", 6).await;
    let dir = scratch("rebalance");
    let cluster = Cluster::new(&s.name, &dir);
    let zk = support::zk_client().await;
    let put = |count| {
        let opts = PutOptions { count, keys: 60, ..PutOptions::default() };
        let (client, label, name) = (s.client.clone(), s.label(), s.name.clone());
        async move { kinesis::put_records(&client, &label, &name, &opts).await.expect("put").manifest }
    };
    let mut manifests = vec![put(600).await];

    let mut a = cluster.start("a", 1);
    wait_tasks(&zk, &cluster, 1).await;
    let (_, o) = wait_balanced(&zk, &cluster, 1, 6, Duration::from_secs(20)).await.expect("worker a owns all shards");
    assert_eq!(o.len(), 6);
    manifests.push(put(300).await);

    // Two more join.
    let mut b = cluster.start("b", 1);
    let mut c = cluster.start("c", 1);
    let registered = wait_tasks(&zk, &cluster, 3).await;
    let balanced = wait_balanced(&zk, &cluster, 3, 6, Duration::from_secs(10)).await;
    let (_, o) = balanced.unwrap_or_else(|| panic!("never balanced over 3 tasks\n{}", cluster.logs()));
    let took = registered.elapsed();
    assert!(took <= Duration::from_secs(2), "balanced {took:?} after the third task registered (limit 2 s)");
    let tasks = live_tasks(&zk, &cluster).await;
    let (min, max) = spread(&o, &tasks);
    assert!(max - min <= 1, "{o:?}");
    eprintln!("rebalance after join: {took:?}, owners {o:?}");

    manifests.push(put(300).await);
    let report = cluster.wait_delivered(&manifests, Duration::from_secs(60)).await;
    assert_eq!(report.lost, 0, "{report:?}\n{}", cluster.logs());

    // b leaves gracefully: its shards move to a and c.
    let left = Instant::now();
    assert_eq!(b.stop(Duration::from_secs(30)), Some(0), "graceful stop exits 0\n{}", cluster.logs());
    let (_, o) = wait_balanced(&zk, &cluster, 2, 6, Duration::from_secs(10))
        .await
        .unwrap_or_else(|| panic!("shards not re-owned after b left\n{}", cluster.logs()));
    eprintln!("re-owned {:?} after b's SIGTERM: {o:?}", left.elapsed());
    manifests.push(put(300).await);
    let report = cluster.wait_delivered(&manifests, Duration::from_secs(60)).await;
    assert_eq!(report.lost, 0, "{report:?}\n{}", cluster.logs());
    assert_eq!(report.duplicates, 0, "handoffs delivered duplicates: {report:?}\n{}", cluster.logs());
    assert_eq!(report.order_violations, 0, "{report:?}");
    eprintln!("rebalance audit: {}", serde_json::to_string(&report).unwrap());

    assert_eq!(a.stop(Duration::from_secs(30)), Some(0));
    assert_eq!(c.stop(Duration::from_secs(30)), Some(0));
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}
