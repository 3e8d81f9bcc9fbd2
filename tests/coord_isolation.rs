//! A malformed checkpoint blocks its own shard only. Two workers read a 4-shard stream; while the
//! topology is deactivated (no lease held) one shard's checkpoint znode is overwritten with invalid
//! JSON, then the topology is activated and records are put to every shard (explicit hash keys,
//! one manifest per shard). The test shows, in this order, that the fault took effect (none of the
//! broken shard's new records is delivered, its read log has no reads since the activation, the
//! worker logged an ERROR), then that everything else survives: the other shards' records are all
//! delivered, `squall status --json` and the worker status znode report the shard's error naming
//! the znode path and `squall checkpoints reset` with `retryable: false`, and the leader keeps
//! discovering (a split of another shard is found and its children are read). Finally the znode is
//! repaired with a valid checkpoint and the broken shard is read from TRIM_HORIZON, losing nothing.

use squall_test_support as support;

use std::time::{Duration, Instant};

use squall::coord::now_ms;
use squall::kinesis;
use squall::kinesis::payload::Manifest;
use support::TestStream;
use support::ops::{
    list_shards, listed_shards, log_lines, put_to_shard, squall_ok, status_json, status_shard, wait_for,
    worker_statuses, znode_exists,
};
use support::workers::{Cluster, owners, read_log_entries, scratch};

const GUARD: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_checkpoint_blocks_only_its_shard_until_repaired() {
    let s = TestStream::create("iso", 4).await;
    let dir = scratch("iso");
    let cluster = Cluster::new(&s.name, &dir);
    let zk = support::zk_client().await;
    let mut w1 = cluster.start("w1", 1);
    let mut w2 = cluster.start("w2", 1);
    let shards = list_shards(&s.client, &s.name).await;
    assert_eq!(shards.len(), 4);
    let put_all = |tag: &'static str, count: u64| {
        let (client, name, shards) = (s.client.clone(), s.name.clone(), shards.clone());
        async move {
            let mut out = Vec::new();
            for sh in &shards {
                let prefix = format!("{tag}-{}-", sh.shard_id);
                out.push(put_to_shard(&client, &name, &sh.starting_hash_key, &prefix, count, 4).await);
            }
            out
        }
    };

    // 1. Every shard flows.
    let start = Instant::now();
    let first = put_all("a", 20).await;
    let r = cluster.wait_delivered(&first, GUARD).await;
    assert_eq!(r.lost, 0, "before the fault: {r:?}\n{}", cluster.logs());
    eprintln!("all 4 shards delivered in {:?}", start.elapsed());

    // 2. The fault: deactivate, wait until no lease is held, corrupt one checkpoint, activate.
    let broken = shards[1].shard_id.clone();
    let healthy: Vec<usize> = vec![0, 2, 3];
    let cp_path = format!("{}/checkpoints/{broken}", cluster.stream_path());
    squall_ok(&cluster, &["deactivate", &cluster.topology]);
    let released = Instant::now();
    wait_for(&cluster, "every lease handed back after `squall deactivate`", GUARD, || async {
        owners(&zk, &cluster).await.is_empty().then_some(())
    })
    .await;
    eprintln!("deactivated: every lease handed back in {:?}", released.elapsed());
    let (before, _) = zk.get_data(&cp_path).await.expect("the shard's checkpoint exists");
    eprintln!("checkpoint of {broken} before the fault: {}", String::from_utf8_lossy(&before));
    zk.set_data(&cp_path, b"{\"position\": {\"type\": \"AFTER_SEQ", None).await.unwrap();
    let activated_ms = now_ms();
    squall_ok(&cluster, &["activate", &cluster.topology]);
    let second = put_all("b", 30).await;
    let put_done_ms = now_ms();

    // The other shards' records are all delivered.
    let others: Vec<Manifest> = healthy.iter().map(|&i| second[i].clone()).collect();
    let r = cluster.wait_delivered(&others, GUARD).await;
    assert_eq!(r.lost, 0, "the healthy shards stopped with the broken one: {r:?}\n{}", cluster.logs());
    eprintln!(
        "healthy shards delivered {} ms after the activation ({} ms after the last put)",
        now_ms() - activated_ms,
        now_ms() - put_done_ms
    );

    // `squall status --json` names the shard's error, its znode and the fix; not retryable.
    let st = wait_for(&cluster, "the broken shard's error in `squall status --json`", GUARD, || async {
        let st = status_json(&cluster);
        status_shard(&st, &broken).is_some_and(|s| !s["error"].is_null()).then_some(st)
    })
    .await;
    let entry = status_shard(&st, &broken).unwrap();
    let err = entry["error"].as_str().unwrap_or_default();
    eprintln!("status of {broken}: {entry}");
    assert!(err.contains(&cp_path), "the status error does not name the znode {cp_path}: {err}");
    assert!(err.contains("squall checkpoints reset"), "the status error does not name the fix: {err}");
    assert_eq!(entry["retryable"], false, "{entry}");
    for &i in &healthy {
        let e = status_shard(&st, &shards[i].shard_id).unwrap();
        assert!(e["error"].is_null(), "a healthy shard reports an error: {e}");
    }
    // The task's own record of it, in its worker status znode (published every 2 s on change).
    let runtime = wait_for(&cluster, "the broken shard's error in a worker status znode", GUARD, || async {
        worker_statuses(&zk, &cluster)
            .await
            .into_iter()
            .find_map(|w| w["shards"].get(&broken).filter(|s| !s["last_error"].is_null()).cloned())
    })
    .await;
    eprintln!("worker status of {broken}: {runtime}");
    assert!(runtime["last_error"].as_str().unwrap_or_default().contains(&cp_path), "{runtime}");
    assert_eq!(runtime["retryable"], false, "{runtime}");

    // The fault really happened: an ERROR naming the shard, no read of it since the activation,
    // none of its new records delivered.
    let errors = log_lines(&cluster, &["ERROR", "cannot read this shard until its checkpoint is repaired", &broken]);
    assert!(!errors.is_empty(), "no ERROR line for {broken}\n{}", cluster.logs());
    eprintln!("{}", errors[0]);
    let reads_of_broken = |since: i64| {
        read_log_entries(&cluster.read_logs())
            .into_iter()
            .filter(|e| e.shard == broken && e.t_ms > since && matches!(e.event.as_str(), "acquire" | "records"))
            .count()
    };
    assert_eq!(reads_of_broken(activated_ms), 0, "the broken shard was read\n{}", cluster.logs());
    let blocked = cluster.audit(std::slice::from_ref(&second[1]));
    assert_eq!(blocked.distinct, 0, "records of the broken shard were delivered: {blocked:?}");

    // 3. The leader keeps discovering: split a healthy shard, its children are found and read.
    let split = shards[2].shard_id.clone();
    let split_at = Instant::now();
    kinesis::split_shard(&s.client, &s.label(), &s.name, &split).await.unwrap();
    let now = list_shards(&s.client, &s.name).await;
    let children: Vec<_> =
        now.iter().filter(|c| c.parent_shard_id.as_deref() == Some(split.as_str())).cloned().collect();
    assert_eq!(children.len(), 2, "{now:?}");
    let mut third = Vec::new();
    for c in &children {
        third.push(put_to_shard(&s.client, &s.name, &c.starting_hash_key, &format!("c-{}-", c.shard_id), 20, 4).await);
    }
    let r = cluster.wait_delivered(&third, GUARD).await;
    assert_eq!(r.lost, 0, "the split's children were not read: {r:?}\n{}", cluster.logs());
    let listed = listed_shards(&zk, &cluster).await;
    assert!(children.iter().all(|c| listed.contains(&c.shard_id)), "children not in the shard list: {listed:?}");
    assert!(znode_exists(&zk, &format!("{}/finished/{split}", cluster.stream_path())).await, "{split} not finished");
    eprintln!("split of {split} discovered and its children delivered in {:?}", split_at.elapsed());
    assert_eq!(reads_of_broken(activated_ms), 0, "the broken shard was read before its repair");

    // 4. Repair: a valid checkpoint. The shard is read again from TRIM_HORIZON; nothing lost.
    let repaired_ms = now_ms();
    let repaired = Instant::now();
    zk.set_data(&cp_path, br#"{"position":{"type":"TRIM_HORIZON"},"finished":false,"updated_at_ms":0}"#, None)
        .await
        .unwrap();
    let r = cluster.wait_delivered(std::slice::from_ref(&second[1]), GUARD).await;
    assert_eq!(r.lost, 0, "after the repair: {r:?}\n{}", cluster.logs());
    let first_read = read_log_entries(&cluster.read_logs())
        .into_iter()
        .find(|e| e.shard == broken && e.t_ms >= repaired_ms && e.event == "acquire")
        .map(|e| e.t_ms - repaired_ms);
    eprintln!(
        "repaired: {broken} acquired {first_read:?} ms after the repair, its records delivered in {:?}",
        repaired.elapsed()
    );
    assert!(first_read.is_some(), "no acquire of {broken} after the repair");
    let all: Vec<Manifest> = first.iter().chain(&second).chain(&third).cloned().collect();
    let r = cluster.wait_delivered(&all, GUARD).await;
    eprintln!("COORD isolation: {}", serde_json::to_string(&r).unwrap());
    assert_eq!(r.lost, 0, "{r:?}");
    assert_eq!(r.order_violations, 0, "{r:?}");
    wait_for(&cluster, "the broken shard's error cleared in `squall status --json`", GUARD, || async {
        let st = status_json(&cluster);
        status_shard(&st, &broken).is_some_and(|s| s["error"].is_null()).then_some(())
    })
    .await;

    assert!(w1.is_running() && w2.is_running(), "a worker died\n{}", cluster.logs());
    assert_eq!(w1.stop(Duration::from_secs(30)), Some(0));
    assert_eq!(w2.stop(Duration::from_secs(30)), Some(0));
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}
