//! Integration tests of `squall::coord::ZkStore` against a real ZooKeeper (`SQUALL_ZK`, default
//! 127.0.0.1:2181; `localstack/up` starts one). Each test uses its own root `/squall-test-{uuid}`
//! and deletes it afterwards (also when the test panics).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use squall::coord::{
    Acquire, Assignment, ChangeEvent, Checkpoint, CheckpointPosition, CoordError, Lease, Lifecycle, SessionAlarm,
    SessionStatus, ShardList, ShardRecord, TaskInfo, TopologyState, Versioned, WatchOn, ZkAuth, ZkConfig, ZkStore,
    assign, leader, readable_shards,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use zookeeper_client as zk;

const TOPOLOGY: &str = "wordcount";
const STREAM: &str = "events";
const REAL_SEQ: &str = "49590338271490256608559692538361571095921575989136588898";

fn zk_connect() -> String {
    std::env::var("SQUALL_ZK").unwrap_or_else(|_| "127.0.0.1:2181".to_string())
}

/// A unique root that is deleted (recursively) when dropped.
struct TestRoot {
    root: String,
    auth: Option<ZkAuth>,
}

impl TestRoot {
    fn new() -> Self {
        Self { root: format!("/squall-test-{}", uuid::Uuid::new_v4().simple()), auth: None }
    }

    fn with_auth(auth: ZkAuth) -> Self {
        Self { root: format!("/squall-test-{}", uuid::Uuid::new_v4().simple()), auth: Some(auth) }
    }

    fn config(&self) -> ZkConfig {
        let cfg = ZkConfig::new(zk_connect()).with_root(&self.root).with_session_timeout(Duration::from_secs(4));
        match &self.auth {
            Some(a) => cfg.with_auth(a.clone()),
            None => cfg,
        }
    }

    async fn store(&self) -> ZkStore {
        ZkStore::connect(&self.config(), TOPOLOGY, STREAM).await.expect("connect to ZooKeeper (run localstack/up)")
    }
}

impl Drop for TestRoot {
    fn drop(&mut self) {
        let root = self.root.clone();
        let auth = self.auth.as_ref().map(|a| format!("{}:{}", a.user(), PASSWORD));
        // Async clean-up from Drop: a thread with its own runtime (works during a panic too).
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async move {
                let mut connector = zk::Client::connector();
                if let Some(a) = &auth {
                    connector = connector.with_auth("digest", a.as_bytes());
                }
                if let Ok(client) = connector.connect(&zk_connect()).await {
                    delete_tree(&client, &root).await;
                }
            })
        })
        .join();
    }
}

const PASSWORD: &str = "s3cr3t-Pa55w0rd";

async fn delete_tree(client: &zk::Client, path: &str) {
    let mut stack = vec![path.to_string()];
    let mut order = Vec::new();
    while let Some(p) = stack.pop() {
        if let Ok(children) = client.list_children(&p).await {
            stack.extend(children.into_iter().map(|c| format!("{p}/{c}")));
        }
        order.push(p);
    }
    for p in order.iter().rev() {
        let _ = client.delete(p, None).await;
    }
}

async fn raw_client() -> zk::Client {
    zk::Client::connect(&zk_connect()).await.expect("raw ZooKeeper client")
}

fn task_info(i: u32) -> TaskInfo {
    TaskInfo {
        worker_id: format!("worker-{i}"),
        host: "localhost".into(),
        pid: 1000 + i,
        task_index: i,
        since_ms: 1,
        session: String::new(),
        registration: String::new(),
    }
}

fn after(seq: &str, sub: u64) -> Checkpoint {
    Checkpoint::at(CheckpointPosition::AfterSequence { sequence: seq.into(), sub_sequence: sub }, 7)
}

fn shard(id: &str, parent: Option<&str>) -> ShardRecord {
    ShardRecord {
        shard_id: id.into(),
        parent_shard_id: parent.map(Into::into),
        adjacent_parent_shard_id: None,
        starting_hash_key: "0".into(),
        ending_hash_key: "340282366920938463463374607431768211455".into(),
        closed: false,
    }
}

/// The lease holder name a test store acts as: one per session, like a task.
fn holder(store: &ZkStore) -> String {
    format!("task-{}", store.session_name().trim_start_matches("0x"))
}

async fn acquired(store: &ZkStore, shard_id: &str) -> Lease {
    match store.try_acquire(shard_id, &holder(store)).await.expect("try_acquire") {
        Acquire::Acquired(lease) => lease,
        other => panic!("expected to acquire {shard_id}, got {other:?}"),
    }
}

/// Polls until `store` acquires the shard or the deadline passes.
async fn acquire_within(store: &ZkStore, shard_id: &str, within: Duration) -> Lease {
    let deadline = Instant::now() + within;
    loop {
        match store.try_acquire(shard_id, &holder(store)).await.expect("try_acquire") {
            Acquire::Acquired(lease) => return lease,
            Acquire::HeldBy { .. } if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
            held => panic!("still {held:?} after {within:?}"),
        }
    }
}

/// Waits up to `within` for an event matching `want`, skipping others.
async fn expect_event(rx: &mut mpsc::Receiver<ChangeEvent>, want: &ChangeEvent, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(ev)) if &ev == want => return,
            Ok(Some(ev)) => seen.push(ev),
            Ok(None) => panic!("watch channel closed while waiting for {want:?}; saw {seen:?}"),
            Err(_) => panic!("no {want:?} within {within:?}; saw {seen:?}"),
        }
    }
}

/// A TCP proxy in front of ZooKeeper that can be cut, to make a session disconnect and expire.
struct CuttableProxy {
    addr: String,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl CuttableProxy {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("addr").to_string();
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let conn_tasks = tasks.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let handle = tokio::spawn(async move {
                    if let Ok(mut upstream) = TcpStream::connect(zk_connect()).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut upstream).await;
                    }
                });
                conn_tasks.lock().unwrap().push(handle);
            }
        });
        tasks.lock().unwrap().push(accept);
        Self { addr, tasks }
    }

    /// Drops every connection and stops listening: the client can no longer reach the server.
    fn cut(&self) {
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}

impl Drop for CuttableProxy {
    fn drop(&mut self) {
        self.cut();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_is_idempotent_and_tasks_are_ephemeral_and_sorted() {
    let root = TestRoot::new();
    let a = root.store().await;
    let a2 = root.store().await; // same layout again: no error
    let raw = raw_client().await;
    for dir in a.paths().persistent_dirs() {
        assert!(raw.check_stat(dir).await.unwrap().is_some(), "{dir} missing");
    }
    assert_eq!(a.paths().topology(), format!("{}/topologies/{TOPOLOGY}", root.root));

    let b = root.store().await;
    let t1 = a.register_task(&task_info(1), &format!("t{}", 1)).await.unwrap();
    let t2 = b.register_task(&task_info(2), &format!("t{}", 2)).await.unwrap();
    let t3 = a2.register_task(&task_info(3), &format!("t{}", 3)).await.unwrap();
    assert!(t1.starts_with("task-") && t1.len() == "task-".len() + 10, "{t1}");
    let live = a.live_tasks().await.unwrap();
    let names: Vec<&str> = live.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, vec![t1.as_str(), t2.as_str(), t3.as_str()], "sorted by sequence");
    assert!(!live[1].1.session.is_empty(), "register_task records the session");
    assert_eq!(live[1].1.registration, "t2", "register_task records the registration id");
    assert_eq!(TaskInfo { session: String::new(), registration: String::new(), ..live[1].1.clone() }, task_info(2));
    let owned: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    assert_eq!(leader(&owned), Some(t1.as_str()));

    // Closing b's session removes its registration, for everyone once the server confirmed the
    // close. (A plain drop closes the session from the client's background task: a read on
    // another session right after may still see the node, as one CI run did.)
    b.close_gracefully().await;
    let live: Vec<String> = a.live_tasks().await.unwrap().into_iter().map(|(n, _)| n).collect();
    assert_eq!(live, vec![t1.clone(), t3.clone()]);
    a.close_gracefully().await;
    let live: Vec<String> = a2.live_tasks().await.unwrap().into_iter().map(|(n, _)| n).collect();
    assert_eq!(live, vec![t3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_list_writes_are_compare_and_set() {
    let root = TestRoot::new();
    let a = root.store().await;
    let b = root.store().await;
    assert!(a.read_shard_list().await.unwrap().is_none());

    let list = ShardList::new(vec![shard("shardId-000000000001", None), shard("shardId-000000000000", None)], 10);
    let v0 = a.write_shard_list(&list, None).await.unwrap();
    assert!(matches!(b.write_shard_list(&list, None).await, Err(CoordError::VersionConflict { .. })));
    let read = b.read_shard_list().await.unwrap().unwrap();
    assert_eq!(read.version, v0);
    assert_eq!(read.value.shards[0].shard_id, "shardId-000000000000", "stored sorted");

    let v1 = a.write_shard_list(&list, Some(v0)).await.unwrap();
    let stale = b.write_shard_list(&list, Some(v0)).await;
    assert!(matches!(&stale, Err(CoordError::VersionConflict { path, .. }) if path == a.paths().shards()), "{stale:?}");

    // Concurrent writers with the same expected version: exactly one wins.
    for round in 0..5 {
        let current = a.read_shard_list().await.unwrap().unwrap().version;
        let mut la = list.clone();
        la.updated_at_ms = 100 + round;
        let mut lb = list.clone();
        lb.updated_at_ms = 200 + round;
        let (ra, rb) = tokio::join!(a.write_shard_list(&la, Some(current)), b.write_shard_list(&lb, Some(current)));
        assert_eq!(ra.is_ok() as u8 + rb.is_ok() as u8, 1, "round {round}: {ra:?} {rb:?}");
        let loser = if ra.is_ok() { rb } else { ra };
        assert!(matches!(loser, Err(CoordError::VersionConflict { .. })));
    }
    assert!(a.read_shard_list().await.unwrap().unwrap().version > v1);

    // Lists over the size limit are refused before anything is written.
    let huge =
        ShardList::new((0..6000).map(|i| shard(&format!("shardId-{i:012}-{}", "x".repeat(60)), None)).collect(), 1);
    let before = a.read_shard_list().await.unwrap().unwrap();
    let err = a.write_shard_list(&huge, Some(before.version)).await.unwrap_err();
    assert!(matches!(err, CoordError::TooLarge { .. }), "{err:?}");
    assert!(err.to_string().contains(a.paths().shards()), "{err}");
    assert_eq!(a.read_shard_list().await.unwrap().unwrap(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_checkpoint_first_decision_wins() {
    let root = TestRoot::new();
    let a = root.store().await;
    let b = root.store().await;
    let first = Checkpoint::at(CheckpointPosition::AtTimestamp { millis: 1_700_000_000_000 }, 1);
    let second = Checkpoint::at(CheckpointPosition::TrimHorizon, 2);
    let got = a.init_checkpoint("shardId-000000000000", &first).await.unwrap();
    assert_eq!(got.value, first);
    let got = b.init_checkpoint("shardId-000000000000", &second).await.unwrap();
    assert_eq!(got.value, first, "first decision wins");
    assert_eq!(got.version, 0);

    // A race: both get the same answer.
    let (ra, rb) = tokio::join!(a.init_checkpoint("s-race", &first), b.init_checkpoint("s-race", &second));
    assert_eq!(ra.unwrap(), rb.unwrap());
    let all = a.read_checkpoints().await.unwrap();
    assert_eq!(all.keys().collect::<Vec<_>>(), vec!["s-race", "shardId-000000000000"]);
    assert!(a.read_checkpoint("absent").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_exclusive_and_pass_on_release_and_session_close() {
    let root = TestRoot::new();
    let a = root.store().await;
    let b = root.store().await;
    let shard_id = "shardId-000000000007";

    for round in 0..3 {
        let (ha, hb) = (holder(&a), holder(&b));
        let (ra, rb) = tokio::join!(a.try_acquire(shard_id, &ha), b.try_acquire(shard_id, &hb));
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        let (winner, lease, loser) = match (&ra, &rb) {
            (Acquire::Acquired(l), Acquire::HeldBy { .. }) => (&a, l.clone(), rb.clone()),
            (Acquire::HeldBy { .. }, Acquire::Acquired(l)) => (&b, l.clone(), ra.clone()),
            _ => panic!("round {round}: exactly one must acquire: {ra:?} {rb:?}"),
        };
        assert_eq!(loser, Acquire::HeldBy { shard_id: shard_id.into(), holder_path: lease.path.clone() });
        // The same holder acquiring again gets its existing lease back.
        assert_eq!(winner.try_acquire(shard_id, &holder(winner)).await.unwrap(), Acquire::Acquired(lease.clone()));
        // Only the holder's lease node remains (losers deleted theirs).
        let raw = raw_client().await;
        assert_eq!(raw.list_children(&a.paths().owner_dir(shard_id)).await.unwrap().len(), 1);
        winner.release(lease.clone()).await.unwrap();
        winner.release(lease).await.unwrap(); // releasing twice is fine
    }

    // After release the other one acquires.
    let la = acquired(&a, shard_id).await;
    let raw = raw_client().await;
    let before = raw.get_children(&a.paths().owner_dir(shard_id)).await.unwrap().1.cversion;
    assert!(matches!(b.try_acquire(shard_id, &holder(&b)).await.unwrap(), Acquire::HeldBy { .. }));
    let after = raw.get_children(&a.paths().owner_dir(shard_id)).await.unwrap().1.cversion;
    assert_eq!(before, after, "a shard seen held is answered without creating or deleting anything");
    a.release(la).await.unwrap();
    let _lb = acquired(&b, shard_id).await;
    assert!(matches!(a.try_acquire(shard_id, &holder(&a)).await.unwrap(), Acquire::HeldBy { .. }));
    // Two holders on one session (two tasks of one worker) never pass for each other.
    assert!(matches!(b.try_acquire(shard_id, "task-sibling").await.unwrap(), Acquire::HeldBy { .. }));

    // When the holder's session closes, the other acquires.
    b.close();
    acquire_within(&a, shard_id, Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zombie_writes_are_fenced_after_session_expiry() {
    let root = TestRoot::new();
    let proxy = CuttableProxy::start().await;
    let shard_id = "shardId-000000000001";
    // A reaches ZooKeeper only through the proxy, with a short session.
    let mut cfg_a = root.config().with_session_timeout(Duration::from_secs(2));
    cfg_a.connect = proxy.addr.clone();
    let a = ZkStore::connect(&cfg_a, TOPOLOGY, STREAM).await.unwrap();
    let b = root.store().await;
    let mut watch_a = a.watch(&[WatchOn::Tasks]).await.unwrap();
    let mut session_a = a.session_state();
    assert_eq!(session_a.current(), SessionStatus::Connected);

    let lease_a = acquired(&a, shard_id).await;
    let c0 = a.init_checkpoint(shard_id, &Checkpoint::at(CheckpointPosition::TrimHorizon, 1)).await.unwrap();
    let v1 = a.write_checkpoint(&lease_a, &after("100", 0), &c0).await.unwrap();
    assert_eq!(v1, c0.version + 1);
    let c1 = Versioned { value: after("100", 0), version: v1 };

    // Network partition: A is cut off; its session expires on the server, its lease vanishes.
    proxy.cut();
    let cut_at = Instant::now();
    let alarm = tokio::time::timeout(Duration::from_secs(10), session_a.wait_unsafe()).await.expect("alarm");
    // Unsafe half a session timeout after the last contact: the client reports Disconnected
    // 2/5 of the timeout after it (on a silent network), so the grace after Disconnected is the
    // rest, a tenth; here the cut resets the connection, so Disconnected comes at once.
    assert_eq!(alarm, SessionAlarm::DisconnectedTooLong, "stop fetching after the grace");
    let t = a.session_timeout();
    assert!(cut_at.elapsed() >= t / 10, "alarm too early: {:?} (grace {:?})", cut_at.elapsed(), t / 10);
    assert!(
        cut_at.elapsed() <= t / 2,
        "alarm {:?} after the cut: less than half the timeout {t:?} left",
        cut_at.elapsed()
    );
    expect_event(&mut watch_a, &ChangeEvent::Disconnected, Duration::from_secs(1)).await;

    let lease_b = acquire_within(&b, shard_id, Duration::from_secs(10)).await;
    assert_ne!(lease_b.path, lease_a.path);

    // A's client notices the expiry itself (about 1.4 x timeout) and says so everywhere.
    expect_event(&mut watch_a, &ChangeEvent::SessionLost, Duration::from_secs(10)).await;
    assert_eq!(session_a.current(), SessionStatus::Expired);
    let err = a.write_checkpoint(&lease_a, &after("150", 0), &c1).await.unwrap_err();
    assert!(err.is_session_lost(), "{err:?}");

    // The zombie comes back with a new session but still holds its old lease: fenced.
    let a_again = root.store().await;
    let err = a_again.write_checkpoint(&lease_a, &after("150", 0), &c1).await.unwrap_err();
    match &err {
        CoordError::Fenced { shard_id: s, lease_path } => assert!(s == shard_id && *lease_path == lease_a.path),
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert!(err.to_string().contains(&lease_a.path), "{err}");
    assert_eq!(b.read_checkpoint(shard_id).await.unwrap().unwrap().value, after("100", 0), "zombie wrote nothing");

    // B, the new owner, resumes and writes.
    let current = b.read_checkpoint(shard_id).await.unwrap().unwrap();
    let v2 = b.write_checkpoint(&lease_b, &after("200", 0), &current).await.unwrap();
    let c2 = Versioned { value: after("200", 0), version: v2 };
    let v3 = b.write_checkpoint(&lease_b, &after(REAL_SEQ, 0), &c2).await.unwrap();
    let c3 = Versioned { value: after(REAL_SEQ, 0), version: v3 };
    // Stale checkpoint version.
    let err = b.write_checkpoint(&lease_b, &after(REAL_SEQ, 5), &c2).await.unwrap_err();
    assert!(
        matches!(&err, CoordError::VersionConflict { path, .. } if path == &b.paths().checkpoint(shard_id)),
        "{err:?}"
    );
    // Backwards (the 19-digit sentinel is numerically below a real 56-digit sequence).
    let err = b.write_checkpoint(&lease_b, &after("9223372036854775807", 0), &c3).await.unwrap_err();
    assert!(matches!(err, CoordError::CheckpointBackwards { .. }), "{err:?}");
    let err = b.write_checkpoint(&lease_b, &Checkpoint::at(CheckpointPosition::TrimHorizon, 9), &c3).await.unwrap_err();
    assert!(matches!(err, CoordError::CheckpointBackwards { .. }), "{err:?}");
    let stored = b.read_checkpoint(shard_id).await.unwrap().unwrap();
    assert_eq!((stored.value, stored.version), (after(REAL_SEQ, 0), v3), "refused writes changed nothing");
    // Shard end: finished is written fenced, then released; a released lease fences too.
    let mut fin = after(REAL_SEQ, 0);
    fin.finished = true;
    assert!(b.list_finished().await.unwrap().is_empty());
    let v4 = b.write_checkpoint(&lease_b, &fin, &c3).await.unwrap();
    let c4 = Versioned { value: fin.clone(), version: v4 };
    assert_eq!(
        b.list_finished().await.unwrap().into_iter().collect::<Vec<_>>(),
        vec![shard_id.to_string()],
        "the finished checkpoint and its marker are one transaction"
    );
    b.release(lease_b.clone()).await.unwrap();
    let err = b.write_checkpoint(&lease_b, &fin, &c4).await.unwrap_err();
    assert!(matches!(err, CoordError::Fenced { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_checkpoint_names_the_path() {
    let root = TestRoot::new();
    let a = root.store().await;
    let shard_id = "shardId-000000000003";
    a.init_checkpoint(shard_id, &Checkpoint::at(CheckpointPosition::TrimHorizon, 1)).await.unwrap();
    let path = a.paths().checkpoint(shard_id);
    raw_client().await.set_data(&path, b"{\"position\": 42", None).await.unwrap();

    let err = a.read_checkpoint(shard_id).await.unwrap_err();
    match &err {
        CoordError::Malformed { path: p, .. } => assert_eq!(p, &path),
        other => panic!("expected Malformed, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains(&path) && msg.contains("squall checkpoints reset"), "{msg}");
    assert!(matches!(a.read_checkpoints().await, Err(CoordError::Malformed { .. })));
    // A scan isolates it: the other shard's checkpoint reads fine, only this one is an error.
    a.init_checkpoint("shardId-000000000004", &Checkpoint::at(CheckpointPosition::TrimHorizon, 1)).await.unwrap();
    let scan = a.scan_checkpoints().await.unwrap();
    assert!(matches!(&scan["shardId-000000000003"], Err(CoordError::Malformed { path: p, .. }) if p == &path));
    assert!(scan["shardId-000000000004"].is_ok());
    // A writer holding the version from before the corruption cannot overwrite it unnoticed.
    let lease = acquired(&a, shard_id).await;
    let before = Versioned { value: Checkpoint::at(CheckpointPosition::TrimHorizon, 1), version: 0 };
    assert!(matches!(
        a.write_checkpoint(&lease, &after("1", 0), &before).await,
        Err(CoordError::VersionConflict { .. })
    ));
    // Valid JSON of the wrong shape is malformed too.
    raw_client().await.set_data(&path, b"{\"finished\": true}", None).await.unwrap();
    assert!(matches!(a.read_checkpoint(shard_id).await, Err(CoordError::Malformed { .. })));
}

/// The next event, whatever it is.
async fn next_event(rx: &mut mpsc::Receiver<ChangeEvent>, within: Duration) -> ChangeEvent {
    match tokio::time::timeout(within, rx.recv()).await {
        Ok(Some(ev)) => ev,
        Ok(None) => panic!("watch channel closed"),
        Err(_) => panic!("no event within {within:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_reports_cold_changes_and_never_hot_checkpoint_writes() {
    let root = TestRoot::new();
    let a = root.store().await;
    let b = root.store().await;
    let all = [WatchOn::Tasks, WatchOn::Assignment, WatchOn::Finished, WatchOn::State, WatchOn::Drain];
    let mut rx = a.watch(&all).await.unwrap();
    let second = Duration::from_secs(1);

    let task = b.register_task(&task_info(1), &format!("t{}", 1)).await.unwrap();
    assert_eq!(next_event(&mut rx, second).await, ChangeEvent::Tasks);

    // Hot traffic: a shard's start, its lease, many checkpoint writes, the release. None of it
    // reaches a watcher; the next event is the cold change that follows.
    let shard_id = "shardId-000000000009";
    let mut cp = b.init_checkpoint(shard_id, &Checkpoint::at(CheckpointPosition::TrimHorizon, 1)).await.unwrap();
    let lease = acquired(&b, shard_id).await;
    for i in 1..=20 {
        let next = after(&i.to_string(), 0);
        let v = b.write_checkpoint(&lease, &next, &cp).await.unwrap();
        cp = Versioned { value: next, version: v };
    }
    b.release(lease.clone()).await.unwrap();
    b.write_shard_list(&ShardList::new(vec![shard(shard_id, None)], 1), None).await.unwrap();
    let state =
        TopologyState { state: Lifecycle::Active, deployment_id: "d1".into(), updated_at_ms: 1, kill_wait_ms: None };
    b.write_state(&state, None).await.unwrap();
    assert_eq!(next_event(&mut rx, second).await, ChangeEvent::State, "hot writes produced events");

    // The leader's assignment (fenced on its task node).
    let mut plan = Assignment { generation: 1, leader: task.clone(), ..Assignment::default() };
    plan.tasks.insert(task.clone(), vec![shard_id.to_string()]);
    let v = b.write_assignment(&task, &plan, None).await.unwrap();
    assert_eq!(next_event(&mut rx, second).await, ChangeEvent::Assignment);
    assert!(matches!(b.write_assignment(&task, &plan, None).await, Err(CoordError::VersionConflict { .. })));
    assert!(
        matches!(b.write_assignment("task-0000099999", &plan, Some(v)).await, Err(CoordError::Fenced { .. })),
        "only a registered leader task writes the assignment"
    );
    assert_eq!(b.read_assignment().await.unwrap().unwrap().value, plan);

    // A shard finishing is the leader's signal.
    let lease = acquired(&b, shard_id).await;
    let mut fin = after("21", 0);
    fin.finished = true;
    b.write_checkpoint(&lease, &fin, &cp).await.unwrap();
    assert_eq!(next_event(&mut rx, second).await, ChangeEvent::Finished);

    b.write_drain(&squall::coord::DrainRequest { deployment_id: "d1".into(), requested_at_ms: 1 }).await.unwrap();
    expect_event(&mut rx, &ChangeEvent::Drain, second).await;

    // A task going away (session closed) is reported too.
    b.close();
    expect_event(&mut rx, &ChangeEvent::Tasks, second).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_auth_locks_out_other_clients() {
    let auth = ZkAuth::digest("squall", PASSWORD);
    let root = TestRoot::with_auth(auth.clone());
    let cfg = root.config();
    let debug = format!("{cfg:?} {cfg:#?}");
    assert!(!debug.contains(PASSWORD), "password leaked in Debug: {debug}");
    assert!(debug.contains("squall"));

    let a = root.store().await;
    let shard_id = "shardId-000000000000";
    a.init_checkpoint(shard_id, &Checkpoint::at(CheckpointPosition::TrimHorizon, 1)).await.unwrap();
    a.register_task(&task_info(1), &format!("t{}", 1)).await.unwrap();
    let lease = acquired(&a, shard_id).await;
    assert_eq!(a.read_checkpoint(shard_id).await.unwrap().unwrap().version, 0);

    // Every node the store created is creator-only (reading ACLs needs the credentials too).
    let authed = zk::Client::connector()
        .with_auth("digest", format!("squall:{PASSWORD}").as_bytes())
        .connect(&zk_connect())
        .await
        .unwrap();
    for path in [&root.root, a.paths().tasks(), a.paths().checkpoints(), &a.paths().checkpoint(shard_id), &lease.path] {
        let (acls, _) = authed.get_acl(path).await.unwrap();
        assert_eq!(acls.len(), 1, "{path}: {acls:?}");
        assert!(acls[0].scheme() == "digest" && acls[0].id().starts_with("squall:"), "{path}: {acls:?}");
    }
    let raw = raw_client().await;
    assert_eq!(raw.get_acl(&root.root).await.unwrap_err(), zk::Error::NoAuth);
    let cp_path = a.paths().checkpoint(shard_id);
    assert_eq!(raw.get_data(&cp_path).await.unwrap_err(), zk::Error::NoAuth);

    // A store without credentials (or with wrong ones) gets NotAuthorized naming a path.
    let mut cfg_none = cfg.clone();
    cfg_none.auth = None;
    for bad in [cfg_none, cfg.clone().with_auth(ZkAuth::digest("squall", "wrong"))] {
        let err = ZkStore::connect(&bad, TOPOLOGY, STREAM).await.unwrap_err();
        match &err {
            CoordError::NotAuthorized { path } => assert!(path.starts_with(&root.root), "{path}"),
            other => panic!("expected NotAuthorized, got {other:?}"),
        }
        assert!(!err.to_string().contains(PASSWORD));
    }
    // Other clients cannot take the lease or overwrite the checkpoint either.
    assert_eq!(raw.set_data(&cp_path, b"{}", None).await.unwrap_err(), zk::Error::NoAuth);
    assert_eq!(raw.list_children(&a.paths().owner_dir(shard_id)).await.unwrap_err(), zk::Error::NoAuth);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_failure_names_the_connect_string() {
    let cfg =
        ZkConfig::new("127.0.0.1:1").with_root("/squall-test-unreachable").with_session_timeout(Duration::from_secs(1));
    let started = Instant::now();
    let err = ZkStore::connect(&cfg, TOPOLOGY, STREAM).await.unwrap_err();
    assert!(matches!(err, CoordError::Connect { .. }), "{err:?}");
    assert!(err.to_string().contains("127.0.0.1:1") && err.is_retryable(), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30), "bounded retry took {:?}", started.elapsed());
    let err = ZkStore::connect(&ZkConfig::new(zk_connect()).with_root("/x"), "bad/name", STREAM).await.unwrap_err();
    assert!(matches!(err, CoordError::InvalidName { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_checkpoints_only_without_leases() {
    let root = TestRoot::new();
    let a = root.store().await;
    let b = root.store().await;
    let list = ShardList::new(vec![shard("s0", None), shard("s1", Some("s0")), shard("s2", Some("s0"))], 1);
    a.write_shard_list(&list, None).await.unwrap();
    let v = a.init_checkpoint("s0", &Checkpoint::at(CheckpointPosition::TrimHorizon, 1)).await.unwrap().version;
    let lease = acquired(&a, "s0").await;
    let mut fin = after("500", 0);
    fin.finished = true;
    a.write_checkpoint(
        &lease,
        &fin,
        &Versioned { value: Checkpoint::at(CheckpointPosition::TrimHorizon, 1), version: v },
    )
    .await
    .unwrap();

    let err = b.reset_checkpoints(&CheckpointPosition::TrimHorizon).await.unwrap_err();
    assert!(matches!(&err, CoordError::LeasesHeld { shards } if shards == &vec!["s0".to_string()]), "{err:?}");
    assert!(b.read_checkpoint("s1").await.unwrap().is_none(), "nothing written while leased");
    a.release(lease).await.unwrap();

    assert_eq!(a.list_finished().await.unwrap().len(), 1, "s0 finished");
    let at = CheckpointPosition::AtTimestamp { millis: 1_650_000_000_000 };
    assert_eq!(b.reset_checkpoints(&at).await.unwrap(), 3);
    assert!(a.list_finished().await.unwrap().is_empty(), "reset reopens finished shards");
    let cps = a.read_checkpoints().await.unwrap();
    assert_eq!(cps.len(), 3);
    assert!(cps.values().all(|c| c.value.position == at && !c.value.finished));
    // Only s0 is readable again (children wait for it); reset released its own leases.
    let plain: BTreeMap<String, Checkpoint> = cps.into_iter().map(|(k, v)| (k, v.value)).collect();
    assert_eq!(readable_shards(&list, &plain), vec!["s0"]);
    acquired(&a, "s1").await;
    acquired(&a, "s0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_and_assignment_round_trip() {
    let root = TestRoot::new();
    let a = root.store().await;
    assert!(a.read_state().await.unwrap().is_none());
    let mut st =
        TopologyState { state: Lifecycle::Active, deployment_id: "dep-1".into(), updated_at_ms: 1, kill_wait_ms: None };
    let v0 = a.write_state(&st, None).await.unwrap();
    st.state = Lifecycle::Draining;
    let v1 = a.write_state(&st, Some(v0)).await.unwrap();
    assert!(matches!(a.write_state(&st, Some(v0)).await, Err(CoordError::VersionConflict { .. })));
    let read = a.read_state().await.unwrap().unwrap();
    assert_eq!((read.value, read.version), (st, v1));
    let raw = raw_client().await;
    let (data, _) = raw.get_data(a.paths().state()).await.unwrap();
    assert!(String::from_utf8(data).unwrap().contains("\"DRAINING\""));

    // Assignment from live tasks, as the runtime computes it.
    let mut names = Vec::new();
    for i in 0..3 {
        names.push(a.register_task(&task_info(i), &format!("t{}", i)).await.unwrap());
    }
    let live: Vec<String> = a.live_tasks().await.unwrap().into_iter().map(|(n, _)| n).collect();
    let shards: Vec<String> = (0..7).map(|i| format!("shardId-{i:012}")).collect();
    let plan = assign(&live, &shards);
    assert_eq!(plan[&names[0]].len(), 3);
    assert_eq!(plan[&names[2]].len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_task_costs_one_watch_and_no_write() {
    let root = TestRoot::new();
    let a = root.store().await;
    let b = root.store().await;
    let shard_id = "shardId-000000000011";
    let lease = acquired(&a, shard_id).await;
    // Count every lease operation b's session makes.
    let ops: Arc<Mutex<Vec<squall::coord::ZkOp>>> = Arc::default();
    let rec = ops.clone();
    b.session().inject_faults(Some(Arc::new(move |op, _path: &str| {
        rec.lock().unwrap().push(op);
        None
    })));
    let raw = raw_client().await;
    let dir = a.paths().owner_dir(shard_id);
    let before = raw.get_children(&dir).await.unwrap().1;

    let holder_path = match b.try_acquire(shard_id, &holder(&b)).await.unwrap() {
        Acquire::HeldBy { holder_path, .. } => holder_path,
        other => panic!("expected HeldBy, got {other:?}"),
    };
    assert_eq!(holder_path, lease.path);
    let watcher = b.watch_lease(&holder_path).await.unwrap().expect("the holder's lease exists");
    // Waiting: nothing happens on b's side for as long as a holds the shard.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seen = ops.lock().unwrap().clone();
    use squall::coord::ZkOp;
    assert_eq!(seen, vec![ZkOp::List, ZkOp::Exists], "waiting costs one listing and one watch, nothing else");
    let after = raw.get_children(&dir).await.unwrap().1;
    assert_eq!((before.cversion, before.pzxid), (after.cversion, after.pzxid), "the waiter created or deleted nothing");

    // The holder leaves: the watch fires, and the waiter takes the shard with one create.
    a.release(lease).await.unwrap();
    let fired = tokio::time::timeout(Duration::from_secs(5), watcher.changed()).await.expect("the watch fired");
    assert_eq!(fired.event_type, zk::EventType::NodeDeleted);
    ops.lock().unwrap().clear();
    let got = acquired(&b, shard_id).await;
    assert!(got.path.contains(&format!("lease-{}-", holder(&b))), "{got:?}");
    let creates = ops.lock().unwrap().iter().filter(|o| **o == ZkOp::Create).count();
    assert_eq!(creates, 1);
    eprintln!("WAIT: ops while waiting {seen:?}; ops to take over {:?}", ops.lock().unwrap());
}

/// A checkpoint write whose answer is lost (it took effect on the server, the client saw
/// ConnectionLoss: what a flapping link does, found by `netfaults::netns_flapping_link…`) is not
/// taken for another writer's: writing again from the version known before it is accepted, on
/// top of it, still fenced by the lease. A version written by anyone else in between is still a
/// conflict, and so is our own write once the lease is gone.
#[tokio::test]
async fn a_checkpoint_write_whose_answer_was_lost_is_not_a_conflict() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let root = TestRoot::new();
    let a = root.store().await;
    let shard_id = "shardId-000000000021";
    let lease = acquired(&a, shard_id).await;
    let c0 = a.init_checkpoint(shard_id, &Checkpoint::at(CheckpointPosition::TrimHorizon, 1)).await.unwrap();
    let armed = Arc::new(AtomicBool::new(true));
    let arm = armed.clone();
    a.session().inject_faults(Some(Arc::new(move |op, _path: &str| {
        (op == squall::coord::ZkOp::Multi && arm.swap(false, Ordering::SeqCst))
            .then_some(squall::coord::InjectedFault::After(zk::Error::ConnectionLoss))
    })));
    let mine = |seq: &str| Checkpoint { writer: Some(holder(&a)), ..after(seq, 0) };
    let err = a.write_checkpoint(&lease, &mine("100"), &c0).await.unwrap_err();
    assert!(!armed.load(Ordering::SeqCst), "the fault was not injected");
    assert!(matches!(err, CoordError::Zk { .. }), "{err:?}");
    let raw = raw_client().await;
    let path = a.paths().checkpoint(shard_id);
    let (_, stat) = raw.get_data(&path).await.unwrap();
    assert_eq!(stat.version, c0.version + 1, "the write whose answer was lost took effect");

    // The caller still knows only c0: its next write is accepted on top of the lost one.
    let v = a.write_checkpoint(&lease, &mine("200"), &c0).await.expect("our own lost write is not a conflict");
    assert_eq!(v, c0.version + 2);
    let c2 = a.read_checkpoint(shard_id).await.unwrap().unwrap();
    assert_eq!((c2.version, c2.value.position.clone()), (v, mine("200").position));

    // Someone else's version in between: still a conflict.
    let other = Checkpoint { writer: Some("task-someone-else".into()), ..after("300", 0) };
    raw.set_data(&path, &serde_json::to_vec(&other).unwrap(), None).await.unwrap();
    let err = a.write_checkpoint(&lease, &mine("400"), &c2).await.unwrap_err();
    assert!(matches!(err, CoordError::VersionConflict { .. }), "{err:?}");

    // Our own version in between, but the lease is gone: fenced.
    let c3 = a.read_checkpoint(shard_id).await.unwrap().unwrap();
    raw.set_data(&path, &serde_json::to_vec(&mine("500")).unwrap(), None).await.unwrap();
    raw.delete(&lease.path, None).await.unwrap();
    let err = a.write_checkpoint(&lease, &mine("600"), &c3).await.unwrap_err();
    assert!(matches!(err, CoordError::Fenced { .. } | CoordError::VersionConflict { .. }), "{err:?}");
    let (data, _) = raw.get_data(&path).await.unwrap();
    let last: Checkpoint = serde_json::from_slice(&data).unwrap();
    assert_eq!(last.position, mine("500").position, "a write without the lease was accepted");
}

/// A window firer's registration whose answer is lost (created on the server, ConnectionLoss
/// to the client) is found by its registration id and can be adopted or removed: the store side
/// of "no ghost registration" (`coord_faults::a_registration_whose_answer_is_lost_leaves_no_ghost_task`
/// covers tasks end to end). Another session's node with the same id is not taken for ours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_firer_registration_whose_answer_is_lost_is_found_by_its_id() {
    use std::sync::atomic::Ordering;
    let root = TestRoot::new();
    let a = root.store().await;
    let b = root.store().await;
    let lost = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let once = lost.clone();
    a.session().inject_faults(Some(Arc::new(move |op, path: &str| {
        (op == squall::coord::ZkOp::Create && path.contains("/firers/") && once.swap(false, Ordering::SeqCst))
            .then_some(squall::coord::InjectedFault::After(zk::Error::ConnectionLoss))
    })));
    let err = a.register_firer("counts", "r1").await.unwrap_err();
    assert!(!lost.load(Ordering::SeqCst), "the fault was injected");
    assert!(err.to_string().contains("create"), "{err}");
    let other = b.register_firer("counts", "r1").await.unwrap();
    let firers = a.firers("counts").await.unwrap();
    assert_eq!(firers.len(), 2, "the lost create was applied: {firers:?}");
    let found = a.find_firer("counts", "r1").await.unwrap().expect("the applied registration is found");
    assert_ne!(found, other, "b's node with the same id is not a's");
    assert_eq!(a.find_firer("counts", "r2").await.unwrap(), None);
    a.unregister_firer("counts", &found).await.unwrap();
    assert_eq!(a.firers("counts").await.unwrap(), vec![other.clone()]);
    assert_eq!(b.find_firer("counts", "r1").await.unwrap(), Some(other));
}
