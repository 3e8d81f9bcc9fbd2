//! Sticky, balanced assignment with real workers (audit worker processes) on a 12-shard stream:
//! - a task joining moves at most ceil(N/T) + 1 shards (the newcomer's quota), and every shard
//!   ends up owned by the task the leader's assignment names;
//! - a task leaving moves only its own shards;
//! - a parent shard finishing after a split moves nothing but where its children go;
//! - `squall rebalance` recomputes from scratch: round-robin over the sorted tasks and shards, in
//!   one assignment once the tasks are back (or the gathering time ran out);
//! - nothing is lost, nothing delivered twice, per-key order holds, through all of it.
//!
//! Moves are counted on the leader's `assignment` znode (before and after), and the ownership
//! they imply is checked on the leases. The time to converge (from the change until every shard is
//! owned as assigned) is printed; the benchmark (`make bench`, coordination) reports it.

use squall_test_support as support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use squall::coord::{Assignment, RebalanceRequest, assign, moved, now_ms};
use squall::kinesis::{self, PutOptions};
use support::TestStream;
use support::ops::{squall_ok, wait_for};
use support::workers::{Cluster, live_tasks, owners, scratch};

async fn assignment(zk: &zookeeper_client::Client, cluster: &Cluster) -> Option<Assignment> {
    let (data, _) = zk.get_data(&format!("{}/assignment", cluster.stream_path())).await.ok()?;
    serde_json::from_slice(&data).ok()
}

/// Waits until the assignment names exactly `tasks` tasks (all live), covers `shards` shards, and
/// every shard is leased by the task it names. Returns the assignment and when (ms since the
/// epoch) that was first seen.
async fn settled(
    zk: &zookeeper_client::Client,
    cluster: &Cluster,
    tasks: usize,
    shards: usize,
    what: &str,
) -> (Assignment, i64) {
    let start = Instant::now();
    loop {
        if let Some(a) = assignment(zk, cluster).await {
            let live = live_tasks(zk, cluster).await;
            let named: usize = a.tasks.values().map(Vec::len).sum();
            if a.tasks.len() == tasks && named == shards && a.tasks.keys().all(|t| live.contains(t)) {
                let o = owners(zk, cluster).await;
                let want: BTreeMap<String, String> =
                    a.owner_of().into_iter().map(|(s, t)| (s.to_string(), t.to_string())).collect();
                if want.iter().all(|(s, t)| o.get(s) == Some(t)) {
                    return (a, now_ms());
                }
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{what}: never settled on {tasks} tasks x {shards} shards: {:?}\n{}",
            assignment(zk, cluster).await,
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Creation time (ZooKeeper server clock, ms) of a znode.
async fn ctime(zk: &zookeeper_client::Client, path: &str) -> i64 {
    zk.check_stat(path).await.unwrap().unwrap_or_else(|| panic!("{path} missing")).ctime
}

fn ms(from: i64, to: i64) -> Duration {
    Duration::from_millis((to - from).max(0) as u64)
}

fn loads(a: &Assignment) -> Vec<usize> {
    a.tasks.values().map(Vec::len).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_leave_and_split_move_only_what_they_must() {
    const N: usize = 12;
    let s = TestStream::create("sticky", N as i32).await;
    let dir = scratch("sticky");
    let cluster = Cluster::new(&s.name, &dir);
    let zk = support::zk_client().await;
    let put = |count| {
        let opts = PutOptions { count, keys: 120, ..PutOptions::default() };
        let (client, label, name) = (s.client.clone(), s.label(), s.name.clone());
        async move { kinesis::put_records(&client, &label, &name, &opts).await.expect("put").manifest }
    };
    let mut manifests = vec![put(600).await];

    // Worker a: 3 tasks, round-robin at first.
    let started = now_ms();
    let mut a = cluster.start("a", 3);
    let (a0, at) = settled(&zk, &cluster, 3, N, "start").await;
    assert_eq!(loads(&a0), vec![4, 4, 4]);
    eprintln!("STICKY start: 3 tasks own 12 shards {:?} after the process started", ms(started, at));

    // A task joins (worker b, 1 task): it gets its quota, nobody else's shards move.
    let mut b = cluster.start("b", 1);
    let (a1, at) = settled(&zk, &cluster, 4, N, "join").await;
    let join_moves = moved(&a0.tasks, &a1.tasks);
    let limit = N.div_ceil(4) + 1;
    assert!(join_moves <= limit, "a join moved {join_moves} shards (limit ceil(N/T)+1 = {limit}): {a0:?} -> {a1:?}");
    let newcomer = a1.tasks.keys().find(|t| !a0.tasks.contains_key(*t)).expect("the new task").clone();
    let joined = ctime(&zk, &format!("{}/topologies/{}/tasks/{newcomer}", cluster.zk_root, cluster.topology)).await;
    assert_eq!(join_moves, a1.tasks[&newcomer].len(), "only the newcomer's shards moved");
    let l = loads(&a1);
    assert!(l.iter().max().unwrap() - l.iter().min().unwrap() <= 1, "{l:?}");
    eprintln!(
        "STICKY join: moved {join_moves} of {N} (limit {limit}); every shard owned as assigned {:?} after the task registered",
        ms(joined, at)
    );
    manifests.push(put(300).await);

    // It leaves (SIGTERM, graceful): only its shards move.
    let sigterm = now_ms();
    assert_eq!(b.stop(Duration::from_secs(30)), Some(0), "{}", cluster.logs());
    let (a2, at) = settled(&zk, &cluster, 3, N, "leave").await;
    let mut survivors = a1.tasks.clone();
    survivors.remove(&newcomer);
    assert_eq!(moved(&survivors, &a2.tasks), 0, "a leave moved other tasks' shards: {a1:?} -> {a2:?}");
    eprintln!(
        "STICKY leave: {} shards of the leaver moved, none of the others; every shard owned as assigned {:?} after its SIGTERM",
        a1.tasks[&newcomer].len(),
        ms(sigterm, at)
    );
    manifests.push(put(300).await);

    // A split: the parent finishes; only its children are placed, nothing else moves.
    let parent = a2.tasks.values().flatten().next().unwrap().clone();
    kinesis::split_shard(&s.client, &s.label(), &s.name, &parent).await.unwrap();
    manifests.push(put(300).await);
    let (a3, at) = settled(&zk, &cluster, 3, N + 1, "split").await;
    let finished = ctime(&zk, &format!("{}/finished/{parent}", cluster.stream_path())).await;
    assert!(!a3.owner_of().contains_key(parent.as_str()), "the finished parent is still assigned: {a3:?}");
    assert_eq!(moved(&a2.tasks, &a3.tasks), 0, "a split moved shards other than the children: {a2:?} -> {a3:?}");
    let l = loads(&a3);
    assert!(l.iter().max().unwrap() - l.iter().min().unwrap() <= 1, "{l:?}");
    eprintln!(
        "STICKY split of {parent}: children placed, nothing else moved; every shard owned as assigned {:?} after the parent finished",
        ms(finished, at)
    );

    // `squall rebalance`: from scratch, round-robin over the sorted live tasks and readable shards.
    // The tasks unregister while deactivated and register again one by one: the leader waits for
    // all 3 (the CLI's request names them), so the first assignment after the request is already
    // round-robin over all of them, whatever the spread of the re-registrations.
    let before = assignment(&zk, &cluster).await.expect("an assignment");
    squall_ok(&cluster, &["rebalance", &cluster.topology]);
    let (a4, _) = settled(&zk, &cluster, 3, N + 1, "rebalance").await;
    let tasks: Vec<String> = a4.tasks.keys().cloned().collect();
    let shards: Vec<String> = a4.tasks.values().flatten().cloned().collect();
    assert_eq!(a4.tasks, assign(&tasks, &shards), "rebalance is round-robin from scratch: {a4:?}");
    assert_eq!(
        a4.generation,
        before.generation + 2,
        "the request (generation {}) is followed by ONE assignment, over every task: {a4:?}",
        before.generation + 1
    );
    eprintln!("STICKY rebalance: round-robin over {} tasks, in one assignment after the request", tasks.len());
    manifests.push(put(300).await);

    // A rebalance whose tasks do not all come back (the request names 4, 3 register): the leader
    // waits for the gathering time, then assigns from scratch over those that did.
    squall_ok(&cluster, &["deactivate", &cluster.topology]);
    wait_for(&cluster, "every shard handed back after `squall deactivate`", Duration::from_secs(60), || async {
        owners(&zk, &cluster).await.is_empty().then_some(())
    })
    .await;
    let cfg = squall::coord::ZkConfig::new(support::zk_connect()).with_root(&cluster.zk_root);
    let store = squall::coord::ZkStore::connect(&cfg, &cluster.topology, &s.name).await.unwrap();
    const GATHER_MS: u64 = 2000;
    let request = store.request_rebalance(&RebalanceRequest { tasks: 4, gather_ms: GATHER_MS }).await.unwrap();
    let activated = now_ms();
    squall_ok(&cluster, &["activate", &cluster.topology]);
    let (a5, _) = settled(&zk, &cluster, 3, N + 1, "rebalance with a task missing").await;
    let tasks: Vec<String> = a5.tasks.keys().cloned().collect();
    assert_eq!(a5.tasks, assign(&tasks, &shards), "from scratch over the tasks that came back: {a5:?}");
    assert_eq!(a5.generation, request + 1, "one assignment after the request: {a5:?}");
    let waited = a5.updated_at_ms - activated;
    assert!(
        waited >= GATHER_MS as i64,
        "assigned {waited} ms after the activation, before the {GATHER_MS} ms gathering ran out"
    );
    eprintln!(
        "STICKY rebalance missing a task: assigned over 3 of 4 tasks {waited} ms after the activation (gathering {GATHER_MS} ms)"
    );
    manifests.push(put(300).await);

    let report = cluster.wait_delivered(&manifests, Duration::from_secs(90)).await;
    eprintln!("STICKY audit: {}", serde_json::to_string(&report).unwrap());
    assert_eq!(report.lost, 0, "{report:?}\n{}", cluster.logs());
    assert_eq!(report.duplicates, 0, "graceful moves delivered duplicates: {report:?}");
    assert_eq!(report.order_violations, 0, "{report:?}");
    assert_eq!(a.stop(Duration::from_secs(30)), Some(0));
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}
