//! Fencing with a live zombie: a worker's lease on a shard is taken from it while its session is
//! still alive (its lease znode deleted and another holder's lease put in place, as when a lease
//! is lost to an operator's rewind or a new owner). The old holder still believes it owns the
//! shard and keeps acking; every checkpoint write it attempts must be refused (observed from
//! ZooKeeper: no version of that checkpoint written by it after the theft), it must stop reading
//! the shard, and once the shard is free again it re-acquires it and nothing is lost.

use squall_test_support as support;

use std::time::{Duration, Instant};

use squall::coord::now_ms;
use support::TestStream;
use support::reliability::{CheckpointWatcher, spawn_producer, spawn_worker};
use support::workers::{Cluster, live_tasks, owners, read_log_entries, scratch};
use zookeeper_client as zk;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_lost_its_lease_cannot_checkpoint() {
    lost_lease_cannot_checkpoint("rel-fence", false).await;
}

/// The same with enhanced fan-out: the subscription of the stolen shard is dropped with its reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_efo_worker_that_lost_its_lease_cannot_checkpoint_or_read() {
    lost_lease_cannot_checkpoint("rel-fence-efo", true).await;
}

async fn lost_lease_cannot_checkpoint(prefix: &str, efo: bool) {
    let s = TestStream::create(prefix, 2).await;
    let dir = scratch(prefix);
    let cluster = Cluster::new(&s.name, &dir);
    let zk = support::zk_client().await;
    let watcher = CheckpointWatcher::start(&support::zk_connect(), &cluster.stream_path(), None);
    let consumer = format!("efo:{}-app", s.name);
    let extra: Vec<&str> = if efo { vec!["--consumer", &consumer] } else { vec![] };
    let mut w = spawn_worker(&cluster, "w1", 1, &extra, &[]);
    let producer = spawn_producer(&s.client, &s.label(), &s.name, 1500, 20, 100.0);

    // Wait until the worker owns both shards and has checkpointed.
    let start = Instant::now();
    let task = loop {
        let t = live_tasks(&zk, &cluster).await;
        let o = owners(&zk, &cluster).await;
        let written = watcher.seen.lock().unwrap().iter().filter(|o| o.cp.writer.is_some()).count();
        if t.len() == 1 && o.len() == 2 && written >= 2 {
            break t[0].clone();
        }
        assert!(start.elapsed() < Duration::from_secs(30), "never settled\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let shard = owners(&zk, &cluster).await.into_keys().next().unwrap();
    let dir_path = format!("{}/owners/{shard}", cluster.stream_path());
    let leases = zk.list_children(&dir_path).await.unwrap();
    assert_eq!(leases.len(), 1, "{leases:?}");

    // The theft: delete its lease and put another holder's lease in place, in one transaction.
    let thief = support::zk_client().await;
    let mut txn = thief.new_multi_writer();
    txn.add_delete(&format!("{dir_path}/{}", leases[0]), None).unwrap();
    txn.add_create(
        &format!("{dir_path}/lease-"),
        b"{}",
        &zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all()),
    )
    .unwrap();
    txn.commit().await.unwrap();
    let stolen_at = now_ms();

    // Its next write must be refused and it must stop reading the shard.
    let t = Instant::now();
    loop {
        let log = w.log_text();
        if log.lines().any(|l| l.contains("checkpoint refused") && l.contains(&shard)) {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no refused checkpoint for {shard}\n{log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let refused_after = t.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let entries = read_log_entries(&cluster.read_logs());
    let released = entries
        .iter()
        .find(|e| e.shard == shard && e.event == "release" && e.t_ms >= stolen_at)
        .map(|e| e.t_ms)
        .unwrap_or_else(|| panic!("the worker never stopped reading {shard}"));
    let reads_after: Vec<_> =
        entries.iter().filter(|e| e.shard == shard && e.event == "records" && e.t_ms > released).collect();
    assert!(reads_after.is_empty(), "read {shard} after it was refused: {reads_after:?}");

    // Give the shard back: the worker re-acquires it and nothing is lost.
    let returned_at = now_ms();
    drop(thief);
    let manifest = producer.await.unwrap();
    let report = cluster.wait_delivered(std::slice::from_ref(&manifest), Duration::from_secs(60)).await;
    let obs = watcher.finish().await;
    let accepted: Vec<_> = obs
        .iter()
        .filter(|o| o.shard == shard && o.cp.writer.as_deref() == Some(task.as_str()) && o.mtime_ms > stolen_at)
        .filter(|o| o.mtime_ms < returned_at)
        .map(|o| format!("v{} at {} {}", o.version, o.mtime_ms, o.cp.position))
        .collect();
    eprintln!(
        "RELIABILITY fencing: refused after {refused_after:?}, released {} ms after the theft; {} accepted writes while not owner; {}",
        released - stolen_at,
        accepted.len(),
        serde_json::to_string(&report).unwrap()
    );
    assert!(
        accepted.is_empty(),
        "checkpoint writes by the old holder were accepted after it lost the lease: {accepted:#?}"
    );
    assert_eq!(report.lost, 0, "{report:?}\n{}", cluster.logs());
    assert!(owners(&zk, &cluster).await.get(&shard) == Some(&task), "the shard was not re-acquired");
    if efo {
        let subscribed = w.log_text().lines().filter(|l| l.contains("subscribing to the shard")).count();
        assert!(subscribed >= 3, "the shards were not read by enhanced fan-out ({subscribed} subscriptions)");
    }
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0));
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}
