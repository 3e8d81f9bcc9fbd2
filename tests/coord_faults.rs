//! No lease ever leaks. Two in-process workers against the real ZooKeeper and kinesis-local,
//! each with its own shared ZooKeeper session. Worker 1's session has a fault hook that makes ONE
//! ZooKeeper operation of a lease step fail with ConnectionLoss: before it is sent, or after it took
//! effect on the server (the answer lost, as after a real connection loss). Steps covered, each in
//! its own case: the owners listing, the lease create, the listing after it, and the lease delete
//! of a release.
//!
//! Per case: worker 1 takes both shards of a fresh stream (acquire-step faults strike here) and
//! delivers records; then it is deactivated, so it hands both shards back (release-step faults
//! strike here) while its session stays alive; worker 2 must then own and read both shards, and
//! at the end no lease of worker 1 is left. Asserted first: the fault was injected exactly once.

use squall_test_support as support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use squall::coord::{FaultHook, InjectedFault, SharedSession, ZkOp};
use squall::kinesis::{self, PutOptions};
use squall::spout::{KinesisSpout, KinesisSpoutConfig, SpoutRegistry, SpoutShared, WorkerIdentity};
use squall::topology::{Bolt, BoltOutput, ComponentError, RunningTopology, TopologyBuilder, TopologyConfig, Tuple};
use support::TestStream;
use zookeeper_client as zk;

type Seen = Arc<Mutex<BTreeSet<(String, String, u64)>>>;

/// Collects (run, key, per-key sequence) of every delivery.
struct Collect(Seen);

impl Bolt for Collect {
    async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        let p = squall::audit::DeliverySink::payload(&t)?;
        self.0.lock().unwrap().insert((p.run, p.key, p.seq));
        Ok(())
    }
}

struct Worker {
    running: RunningTopology,
    session: Arc<SharedSession>,
    seen: Seen,
    registry: SpoutRegistry,
}

async fn start_worker(cfg: &KinesisSpoutConfig, hook: Option<FaultHook>) -> Worker {
    let session = SharedSession::connect(&cfg.zookeeper.to_zk_config(), Duration::from_secs(60)).await.unwrap();
    if let Some(hook) = hook {
        session.current().session.unwrap().inject_faults(Some(hook));
    }
    let seen: Seen = Arc::default();
    let registry = SpoutRegistry::default();
    let mut b = TopologyBuilder::new(cfg.topology.clone());
    KinesisSpout::declare_shared(
        &mut b,
        "kinesis",
        1,
        cfg.clone(),
        WorkerIdentity::current(),
        registry.clone(),
        SpoutShared::with_session(session.clone()),
    );
    let s = seen.clone();
    b.set_bolt("collect", 1, move |_| Collect(s.clone())).shuffle_grouping("kinesis");
    let running = squall::topology::run_local(b.build().unwrap(), TopologyConfig::default()).unwrap();
    Worker { running, session, seen, registry }
}

/// Puts `count` audit records; returns (run, key, seq) of each.
async fn put(s: &TestStream, count: u64) -> BTreeSet<(String, String, u64)> {
    let opts = PutOptions { count, keys: 40, ..PutOptions::default() };
    let m = kinesis::put_records(&s.client, &s.label(), &s.name, &opts).await.unwrap().manifest;
    m.counts.iter().flat_map(|(k, n)| (0..*n).map(|i| (m.run.clone(), k.clone(), i))).collect()
}

async fn wait_seen(w: &Worker, want: &BTreeSet<(String, String, u64)>, what: &str) -> Duration {
    let start = Instant::now();
    loop {
        let missing = want.difference(&w.seen.lock().unwrap()).count();
        if missing == 0 {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{what}: {missing} of {} records never delivered",
            want.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Lease znode names under every owners/{shard} of the stream.
async fn leases(zk: &zk::Client, stream_path: &str) -> Vec<String> {
    let mut out = Vec::new();
    for shard in zk.list_children(&format!("{stream_path}/owners")).await.unwrap_or_default() {
        for l in zk.list_children(&format!("{stream_path}/owners/{shard}")).await.unwrap_or_default() {
            out.push(format!("{shard}/{l}"));
        }
    }
    out
}

async fn case(op: ZkOp, after: bool, nth: u64) {
    squall::logging::init();
    let what = format!("{op:?} #{nth} {}", if after { "after" } else { "before" });
    let s = TestStream::create("faults", 2).await;
    let root = support::unique_zk_root("faults");
    let topology = support::unique_name("topo");
    let mut cfg = support::spout_config(&topology, &s.name, &root);
    cfg.checkpoint_interval_ms = 200;
    cfg.shard_discovery_interval_ms = 1000;
    cfg.handoff_timeout_ms = 5000;
    let stream_path = format!("{root}/topologies/{topology}/streams/{}", s.name);
    // One fault: the nth matching operation on a lease path.
    let seen = Arc::new(AtomicU64::new(0));
    let injected = Arc::new(AtomicU64::new(0));
    let (seen2, injected2) = (seen.clone(), injected.clone());
    let hook: FaultHook = Arc::new(move |o: ZkOp, path: &str| {
        if o != op || !path.contains("/owners/") {
            return None;
        }
        if seen2.fetch_add(1, Ordering::SeqCst) + 1 != nth {
            return None;
        }
        injected2.fetch_add(1, Ordering::SeqCst);
        let e = zk::Error::ConnectionLoss;
        Some(if after { InjectedFault::After(e) } else { InjectedFault::Before(e) })
    });
    let w1 = start_worker(&cfg, Some(hook)).await;
    let first = put(&s, 200).await;
    let took = wait_seen(&w1, &first, &format!("{what}: worker 1")).await;
    let zk = support::zk_client().await;
    // Release: worker 1 hands both shards back; its session stays open.
    w1.running.deactivate().await.unwrap();
    let released = Instant::now();
    loop {
        let held = leases(&zk, &stream_path).await;
        if held.is_empty() {
            break;
        }
        assert!(released.elapsed() < Duration::from_secs(30), "{what}: leases left by worker 1: {held:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let release_took = released.elapsed();
    let w2 = start_worker(&cfg, None).await;
    let second = put(&s, 200).await;
    let took2 = wait_seen(&w2, &second, &format!("{what}: worker 2")).await;
    assert_eq!(
        injected.load(Ordering::SeqCst),
        1,
        "{what}: the fault was not injected (saw {} ops)",
        seen.load(Ordering::SeqCst)
    );
    let held = leases(&zk, &stream_path).await;
    let w1_task = w1.registry.tasks()[0].task_name();
    assert!(!w1_task.is_empty());
    assert!(
        held.iter().all(|l| !l.contains(&format!("lease-{w1_task}-"))),
        "{what}: worker 1 ({w1_task}) still holds {held:?}"
    );
    assert_eq!(held.len(), 2, "{what}: worker 2 holds both shards: {held:?}");
    eprintln!(
        "FAULTS {what}: worker 1 delivered in {took:?}, handed back in {release_took:?}; worker 2 delivered in {took2:?}; leases now {held:?}"
    );
    w2.running.kill(Duration::from_secs(5)).await.unwrap();
    w1.running.kill(Duration::from_secs(5)).await.unwrap();
    w1.session.close().await;
    w2.session.close().await;
    support::zk_delete_tree(&zk, &root).await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_listing_fails() {
    case(ZkOp::List, false, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_create_fails_before_it_is_sent() {
    case(ZkOp::Create, false, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_create_answer_is_lost() {
    case(ZkOp::Create, true, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_second_listing_fails() {
    case(ZkOp::List, true, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_delete_fails_before_it_is_sent() {
    case(ZkOp::Delete, false, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_delete_answer_is_lost() {
    case(ZkOp::Delete, true, 1).await;
}

/// A task registration whose answer is lost (the server created `tasks/task-N`, the client saw
/// ConnectionLoss) leaves no second, ghost registration of the session: the task finds and adopts
/// its node. Worker 1 registers first, so its lost registration would be the lowest task: no
/// worker would lead (no shard listed, nothing assigned, nothing read). Asserted first: the fault
/// was injected exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_whose_answer_is_lost_leaves_no_ghost_task() {
    squall::logging::init();
    let s = TestStream::create("faults-reg", 2).await;
    let root = support::unique_zk_root("faults-reg");
    let topology = support::unique_name("topo");
    let mut cfg = support::spout_config(&topology, &s.name, &root);
    cfg.checkpoint_interval_ms = 200;
    cfg.shard_discovery_interval_ms = 1000;
    let topo_path = format!("{root}/topologies/{topology}");
    let injected = Arc::new(AtomicU64::new(0));
    let injected2 = injected.clone();
    let hook: FaultHook = Arc::new(move |o: ZkOp, path: &str| {
        let first = o == ZkOp::Create
            && path.contains("/tasks/")
            && injected2.compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst).is_ok();
        first.then_some(InjectedFault::After(zk::Error::ConnectionLoss))
    });
    let w1 = start_worker(&cfg, Some(hook)).await;
    let zk = support::zk_client().await;
    // worker 1 registered (its first create's answer was lost) before worker 2 starts
    let guard = Instant::now();
    while zk.list_children(&format!("{topo_path}/tasks")).await.unwrap_or_default().is_empty()
        || w1.registry.tasks()[0].task_name().is_empty()
    {
        assert!(guard.elapsed() < Duration::from_secs(30), "worker 1 registered in 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let w2 = start_worker(&cfg, None).await;
    assert_eq!(injected.load(Ordering::SeqCst), 1, "the fault was injected once (a task create's answer lost)");
    let want = put(&s, 200).await;
    let guard = Instant::now();
    loop {
        let seen: BTreeSet<_> = w1.seen.lock().unwrap().union(&w2.seen.lock().unwrap()).cloned().collect();
        let missing = want.difference(&seen).count();
        if missing == 0 {
            break;
        }
        if guard.elapsed() > Duration::from_secs(30) {
            let tasks = zk.list_children(&format!("{topo_path}/tasks")).await.unwrap_or_default();
            let stream_path = format!("{topo_path}/streams/{}", s.name);
            panic!(
                "{missing} of {} records never delivered; tasks {tasks:?} (worker 1 is {}, worker 2 is {}); leases {:?}",
                want.len(),
                w1.registry.tasks()[0].task_name(),
                w2.registry.tasks()[0].task_name(),
                leases(&zk, &stream_path).await
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut tasks = zk.list_children(&format!("{topo_path}/tasks")).await.unwrap();
    tasks.sort();
    let mut live = vec![w1.registry.tasks()[0].task_name(), w2.registry.tasks()[0].task_name()];
    live.sort();
    assert_eq!(tasks, live, "tasks/ lists the live tasks only (no ghost registration of worker 1's session)");
    let stream_path = format!("{topo_path}/streams/{}", s.name);
    assert_eq!(leases(&zk, &stream_path).await.len(), 2, "every shard leased");
    eprintln!("REGISTRATION: answer lost once; tasks {tasks:?}; 200 of 200 delivered");
    w2.running.kill(Duration::from_secs(5)).await.unwrap();
    w1.running.kill(Duration::from_secs(5)).await.unwrap();
    w1.session.close().await;
    w2.session.close().await;
    support::zk_delete_tree(&zk, &root).await;
    s.delete().await;
}

/// A deactivation whose unregistration's answer is lost (the server deleted `tasks/task-N`, the
/// client saw ConnectionLoss, and every retry while deactivated too) does not leave the task
/// believing itself registered once activated again: it looks its node up, finds it gone and
/// registers anew, so it is assigned shards and reads them (before the fix it sat unregistered
/// for good: here, the only worker, nothing read; in a fleet, its unknown watermark held back
/// everything downstream). Asserted first: the faults were injected and the node was gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deactivation_whose_unregistration_answer_is_lost_registers_again_on_activate() {
    squall::logging::init();
    let s = TestStream::create("faults-unreg", 2).await;
    let root = support::unique_zk_root("faults-unreg");
    let topology = support::unique_name("topo");
    let mut cfg = support::spout_config(&topology, &s.name, &root);
    cfg.checkpoint_interval_ms = 200;
    let topo_path = format!("{root}/topologies/{topology}");
    let tasks_dir = format!("{topo_path}/tasks/");
    let injected = Arc::new(AtomicU64::new(0));
    let activated = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (injected2, activated2, dir2) = (injected.clone(), activated.clone(), tasks_dir.clone());
    let hook: FaultHook = Arc::new(move |o: ZkOp, path: &str| {
        let hit = o == ZkOp::Delete && path.starts_with(&dir2) && !activated2.load(Ordering::SeqCst);
        hit.then(|| {
            injected2.fetch_add(1, Ordering::SeqCst);
            InjectedFault::After(zk::Error::ConnectionLoss)
        })
    });
    let w = start_worker(&cfg, Some(hook)).await;
    let first = put(&s, 100).await;
    wait_seen(&w, &first, "before the deactivation").await;
    let old = w.registry.tasks()[0].task_name();
    let zk = support::zk_client().await;
    w.running.deactivate().await.unwrap();
    let guard = Instant::now();
    while injected.load(Ordering::SeqCst) < 2 {
        assert!(guard.elapsed() < Duration::from_secs(30), "the unregistration was tried twice in 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let tasks = zk.list_children(&format!("{topo_path}/tasks")).await.unwrap();
    assert!(!tasks.contains(&old), "the server applied the unregistration of {old}: tasks {tasks:?}");
    activated.store(true, Ordering::SeqCst);
    w.running.activate().await.unwrap();
    let second = put(&s, 200).await;
    let guard = Instant::now();
    loop {
        let missing = second.difference(&w.seen.lock().unwrap()).count();
        if missing == 0 {
            break;
        }
        assert!(
            guard.elapsed() < Duration::from_secs(30),
            "{missing} of 200 records put after the activation never delivered: the task is {} (was {old}), tasks {:?}",
            w.registry.tasks()[0].task_name(),
            zk.list_children(&format!("{topo_path}/tasks")).await.unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let now = w.registry.tasks()[0].task_name();
    let tasks = zk.list_children(&format!("{topo_path}/tasks")).await.unwrap();
    assert_eq!(tasks, vec![now.clone()], "the task registered again, once");
    eprintln!(
        "UNREGISTRATION: {} deletes answered ConnectionLoss while deactivated; {old} registered again as {now}; 200 of 200 delivered",
        injected.load(Ordering::SeqCst)
    );
    w.running.kill(Duration::from_secs(5)).await.unwrap();
    w.session.close().await;
    support::zk_delete_tree(&zk, &root).await;
    s.delete().await;
}

/// The topology's first start on a stream cut short between its creates (the leader's second
/// starting position never sent: ConnectionLoss) is resumed with the same decision: under LATEST
/// every shard starts at the first start's time, none at TRIM_HORIZON. Records put before the
/// start are never delivered; records put after are. Asserted first: the fault was injected once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_start_cut_short_is_resumed_with_its_starting_position() {
    squall::logging::init();
    const SHARDS: usize = 4;
    let s = TestStream::create("faults-first", SHARDS as i32).await;
    let root = support::unique_zk_root("faults-first");
    let topology = support::unique_name("topo");
    let mut cfg = support::spout_config(&topology, &s.name, &root);
    cfg.initial_position = squall::spout::InitialPosition::Latest;
    cfg.checkpoint_interval_ms = 200;
    let shards = support::ops::list_shards(&s.client, &s.name).await;
    let mut before = Vec::new();
    for sh in &shards {
        before.push(support::ops::put_to_shard(&s.client, &s.name, &sh.starting_hash_key, "old-", 10, 2).await);
    }
    let creates = Arc::new(AtomicU64::new(0));
    let injected = Arc::new(AtomicU64::new(0));
    let (creates2, injected2) = (creates.clone(), injected.clone());
    let hook: FaultHook = Arc::new(move |o: ZkOp, path: &str| {
        if o != ZkOp::Create || !path.contains("/checkpoints/") || creates2.fetch_add(1, Ordering::SeqCst) != 1 {
            return None;
        }
        injected2.fetch_add(1, Ordering::SeqCst);
        Some(InjectedFault::Before(zk::Error::ConnectionLoss))
    });
    let w = start_worker(&cfg, Some(hook)).await;
    let zk = support::zk_client().await;
    let stream_path = format!("{root}/topologies/{topology}/streams/{}", s.name);
    let guard = Instant::now();
    while leases(&zk, &stream_path).await.len() < SHARDS {
        assert!(guard.elapsed() < Duration::from_secs(30), "every shard leased: {:?}", leases(&zk, &stream_path).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(injected.load(Ordering::SeqCst), 1, "the fault was injected once (the first start's second create)");
    let mut positions = BTreeSet::new();
    for sh in &shards {
        let (data, _) = zk.get_data(&format!("{stream_path}/checkpoints/{}", sh.shard_id)).await.unwrap();
        let cp: squall::coord::Checkpoint = serde_json::from_slice(&data).unwrap();
        positions.insert(cp.position.to_string());
    }
    let mut after = BTreeSet::new();
    for sh in &shards {
        let m = support::ops::put_to_shard(&s.client, &s.name, &sh.starting_hash_key, "new-", 10, 2).await;
        after.extend(m.counts.iter().flat_map(|(k, n)| (0..*n).map(|i| (m.run.clone(), k.clone(), i))));
    }
    wait_seen(&w, &after, "records put after the first start").await;
    let old_runs: BTreeSet<&str> = before.iter().map(|m| m.run.as_str()).collect();
    let old: Vec<_> =
        w.seen.lock().unwrap().iter().filter(|(run, _, _)| old_runs.contains(run.as_str())).cloned().collect();
    assert!(
        old.is_empty(),
        "{} records put before a LATEST first start were delivered (shards started at TRIM_HORIZON); starting \
         positions {positions:?}",
        old.len()
    );
    assert_eq!(positions.len(), 1, "one starting position for every shard of the first start: {positions:?}");
    assert!(
        zk.check_stat(&format!("{stream_path}/first_start")).await.unwrap().is_none(),
        "the first start's record removed"
    );
    eprintln!("FIRST START: cut short once, resumed; every shard at {positions:?}; 0 of 40 old records delivered");
    w.running.kill(Duration::from_secs(5)).await.unwrap();
    w.session.close().await;
    support::zk_delete_tree(&zk, &root).await;
    s.delete().await;
}

/// Receive times of a bolt that takes `delay` per tuple.
/// The times the [`Slow`] bolt received each tuple, and the shards its tuples came from.
#[derive(Clone, Default)]
struct Received {
    at: Arc<Mutex<Vec<Instant>>>,
    shards: Arc<Mutex<BTreeSet<String>>>,
}

impl Received {
    fn len(&self) -> usize {
        self.at.lock().unwrap().len()
    }

    fn shards(&self) -> usize {
        self.shards.lock().unwrap().len()
    }
}

struct Slow(Received, Duration);

impl Bolt for Slow {
    async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.0.at.lock().unwrap().push(Instant::now());
        if let Ok(shard) = t.get_str("shard_id") {
            self.0.shards.lock().unwrap().insert(shard.to_string());
        }
        tokio::time::sleep(self.1).await;
        Ok(())
    }
}

/// A worker of one spout task on `session` and a [`Slow`] bolt taking `per_tuple` a tuple; what
/// the bolt received.
fn run_slow_worker(
    cfg: &KinesisSpoutConfig,
    session: &Arc<SharedSession>,
    per_tuple: Duration,
    config: TopologyConfig,
) -> (RunningTopology, Received) {
    let received = Received::default();
    let mut b = TopologyBuilder::new(cfg.topology.clone());
    KinesisSpout::declare_shared(
        &mut b,
        "kinesis",
        1,
        cfg.clone(),
        WorkerIdentity::current(),
        SpoutRegistry::default(),
        SpoutShared::with_session(session.clone()),
    );
    let r = received.clone();
    b.set_bolt("slow", 1, move |_| Slow(r.clone(), per_tuple)).shuffle_grouping("kinesis");
    (squall::topology::run_local(b.build().unwrap(), config).unwrap(), received)
}

/// A worker cut from ZooKeeper emits nothing once its session turns unsafe (a zombie must not
/// hand on its queued records while another worker may already own its shards), and it turns
/// unsafe well before the server can expire its session. One shard with a backlog, a bolt that
/// takes 20 ms a tuple and max pending 5: once unsafe, at most the 5 tuples in flight arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cut_from_zookeeper_emits_nothing_once_its_session_is_unsafe() {
    squall::logging::init();
    const MAX_PENDING: usize = 5;
    let s = TestStream::create("faults-unsafe", 1).await;
    put(&s, 600).await;
    let proxy = support::tcpproxy::TcpProxy::start(&support::zk_connect()).await;
    let root = support::unique_zk_root("faults-unsafe");
    let topology = support::unique_name("topo");
    let mut cfg = support::spout_config(&topology, &s.name, &root);
    cfg.zookeeper.connect = proxy.addr.clone();
    cfg.zookeeper.session_timeout_ms = 4000;
    let timeout = Duration::from_millis(cfg.zookeeper.session_timeout_ms);
    let session = SharedSession::connect(&cfg.zookeeper.to_zk_config(), Duration::from_secs(60)).await.unwrap();
    let config = TopologyConfig { max_spout_pending: MAX_PENDING, ..TopologyConfig::default() };
    let (running, received) = run_slow_worker(&cfg, &session, Duration::from_millis(20), config);
    let guard = Instant::now();
    while received.len() < 20 {
        assert!(guard.elapsed() < Duration::from_secs(30), "the worker delivered 20 records in 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut view = session.subscribe();
    // a silent partition: no reset, the client notices only by its own timeouts
    proxy.silence();
    let cut = Instant::now();
    let unsafe_at = loop {
        if view.borrow_and_update().health != squall::coord::Health::Ok {
            break Instant::now();
        }
        assert!(cut.elapsed() < timeout * 2, "the session never turned unsafe");
        let _ = tokio::time::timeout(Duration::from_millis(50), view.changed()).await;
    };
    // the session expires (client side at ~1.4 x the timeout): the queue is dropped then
    while view.borrow_and_update().health != squall::coord::Health::Lost && cut.elapsed() < timeout * 3 {
        let _ = tokio::time::timeout(Duration::from_millis(50), view.changed()).await;
    }
    let (before, after) = {
        let r = received.at.lock().unwrap();
        (r.iter().filter(|t| **t <= unsafe_at).count(), r.iter().filter(|t| **t > unsafe_at).count())
    };
    eprintln!(
        "UNSAFE: cut {:?} before the session turned unsafe (timeout {timeout:?}); tuples received before {before}, \
         after {after} (max pending {MAX_PENDING})",
        unsafe_at - cut
    );
    assert!(
        unsafe_at - cut <= timeout * 6 / 10,
        "unsafe {:?} after the last contact: too close to the server's expiry at {timeout:?}",
        unsafe_at - cut
    );
    assert!(
        after <= MAX_PENDING,
        "{after} tuples reached the bolt after the session turned unsafe (at most the {MAX_PENDING} in flight may)"
    );
    running.kill(Duration::from_secs(5)).await.unwrap();
    session.close().await;
    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &root).await;
    s.delete().await;
}

/// One shard whose checkpoint writes keep failing (not fenced: the connection fails them) does
/// not hold back the other shards' checkpoints: each shard of a task is maintained on its own.
/// Asserted first: the faults were injected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shards_failing_checkpoint_does_not_hold_back_the_others() {
    squall::logging::init();
    const SHARDS: usize = 4;
    let s = TestStream::create("faults-maint", SHARDS as i32).await;
    let root = support::unique_zk_root("faults-maint");
    let topology = support::unique_name("topo");
    let mut cfg = support::spout_config(&topology, &s.name, &root);
    cfg.checkpoint_interval_ms = 200;
    let shards = support::ops::list_shards(&s.client, &s.name).await;
    let failing = shards[0].shard_id.clone();
    let injected = Arc::new(AtomicU64::new(0));
    let (injected2, failing2) = (injected.clone(), format!("/checkpoints/{failing}"));
    let hook: FaultHook = Arc::new(move |o: ZkOp, path: &str| {
        if o != ZkOp::Multi || !path.ends_with(&failing2) {
            return None;
        }
        injected2.fetch_add(1, Ordering::SeqCst);
        Some(InjectedFault::Before(zk::Error::ConnectionLoss))
    });
    let w = start_worker(&cfg, Some(hook)).await;
    let mut want = BTreeSet::new();
    for sh in &shards {
        let m = support::ops::put_to_shard(&s.client, &s.name, &sh.starting_hash_key, "k-", 10, 2).await;
        want.extend(m.counts.iter().flat_map(|(k, n)| (0..*n).map(|i| (m.run.clone(), k.clone(), i))));
    }
    wait_seen(&w, &want, "every record").await;
    let zk = support::zk_client().await;
    let stream_path = format!("{root}/topologies/{topology}/streams/{}", s.name);
    let positions = || async {
        let mut out = BTreeMap::new();
        for sh in &shards {
            let (data, _) = zk.get_data(&format!("{stream_path}/checkpoints/{}", sh.shard_id)).await.unwrap();
            let cp: squall::coord::Checkpoint = serde_json::from_slice(&data).unwrap();
            out.insert(sh.shard_id.clone(), cp.position.to_string());
        }
        out
    };
    let guard = Instant::now();
    let moved = loop {
        let p = positions().await;
        if p.iter().filter(|(id, _)| **id != failing).all(|(_, pos)| pos.starts_with("AFTER")) {
            break p;
        }
        assert!(
            guard.elapsed() < Duration::from_secs(15),
            "checkpoints of the healthy shards never moved while {failing}'s writes failed ({} faults): {p:?}",
            injected.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(injected.load(Ordering::SeqCst) > 0, "the faults were injected");
    assert!(!moved[&failing].starts_with("AFTER"), "{failing}'s writes all failed: {moved:?}");
    eprintln!("MAINTAIN: {} failed writes of {failing}; checkpoints {moved:?}", injected.load(Ordering::SeqCst));
    w.running.kill(Duration::from_secs(5)).await.unwrap();
    w.session.close().await;
    support::zk_delete_tree(&zk, &root).await;
    s.delete().await;
}

/// A shard the assignment gives back to its task while that task still hands it off (waiting
/// for its in-flight tuples, behind a bolt that takes 50 ms a tuple with 200 in flight: seconds)
/// is taken again as soon as the handoff ends, not at the next event or resync (30 s here). The
/// flip: a second worker joins (one shard moves to it) and leaves at once. Asserted first: the
/// assignment gave the shard back before worker 1 released it (the flip landed during the
/// handoff), and worker 1 released it and took it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_assigned_back_during_its_handoff_is_taken_again_at_once() {
    squall::logging::init();
    let s = TestStream::create("faults-back", 2).await;
    put(&s, 2000).await;
    let dir = support::workers::scratch("faults-back");
    let root = support::unique_zk_root("faults-back");
    let topology = support::unique_name("topo");
    let mut cfg = support::spout_config(&topology, &s.name, &root);
    cfg.checkpoint_interval_ms = 200;
    cfg.resync_interval_ms = 30_000;
    cfg.handoff_timeout_ms = 20_000;
    let reads = dir.join("w1.reads.jsonl");
    cfg.read_log = Some(reads.to_string_lossy().into_owned());
    // worker 1: a bolt that takes 50 ms a tuple, 200 in flight (a handoff waits seconds)
    let session1 = SharedSession::connect(&cfg.zookeeper.to_zk_config(), Duration::from_secs(60)).await.unwrap();
    let config = TopologyConfig { max_spout_pending: 200, message_timeout_ms: 60_000, ..TopologyConfig::default() };
    let (running1, received) = run_slow_worker(&cfg, &session1, Duration::from_millis(50), config);
    let guard = Instant::now();
    // Tuples of both shards in flight before worker 2 joins, whichever shard it is given: the
    // spout may fill its first 200 from one shard (the other's first batch came a moment later),
    // and its bolt acks a batch of 64 only when done with all of them (3.2 s); the second shard's
    // first tuple reaches the bolt behind the first 200, with more of that shard behind it.
    while received.len() < 20 || received.shards() < 2 {
        assert!(
            guard.elapsed() < Duration::from_secs(40),
            "worker 1 delivered {} records of {} shards in 40 s; want 20 of both",
            received.len(),
            received.shards()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // worker 2 joins, and leaves as soon as the assignment gave it a shard
    let mut cfg2 = cfg.clone();
    cfg2.read_log = None;
    let w2 = start_worker(&cfg2, None).await;
    let zk = support::zk_client().await;
    let stream_path = format!("{root}/topologies/{topology}/streams/{}", s.name);
    let assignment = || async { support::ops::znode_json(&zk, &format!("{stream_path}/assignment")).await };
    let shard_of = |a: &serde_json::Value, task: &str| -> Option<String> {
        a["tasks"][task].as_array().and_then(|v| v.first()).and_then(|x| x.as_str()).map(String::from)
    };
    let (w2_task, moved) = loop {
        let t = w2.registry.tasks()[0].task_name();
        if !t.is_empty()
            && let Some(shard) = assignment().await.and_then(|a| shard_of(&a, &t))
        {
            break (t, shard);
        }
        assert!(guard.elapsed() < Duration::from_secs(60), "worker 2 never got a shard");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    w2.running.kill(Duration::from_secs(5)).await.unwrap();
    w2.session.close().await;
    let left = Instant::now();
    // the assignment gives the shard back to worker 1
    let back_ms = loop {
        let a = assignment().await.unwrap_or_default();
        let w2_has = a["tasks"][w2_task.as_str()].as_array().is_some_and(|v| !v.is_empty());
        let listed = a["tasks"].as_object().is_some_and(|ts| {
            ts.values().any(|v| v.as_array().is_some_and(|v| v.iter().any(|x| x.as_str() == Some(moved.as_str()))))
        });
        if !w2_has && listed {
            break squall::coord::now_ms();
        }
        assert!(guard.elapsed() < Duration::from_secs(90), "the assignment never gave {moved} back: {a}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // worker 1 takes the shard it handed off again
    let entries = || support::workers::read_log_entries(std::slice::from_ref(&reads));
    let (released, again) = loop {
        let e = entries();
        let rel = e.iter().find(|x| x.event == "release" && x.shard == moved).map(|x| x.t_ms);
        let acq = rel.and_then(|r| e.iter().find(|x| x.event == "acquire" && x.shard == moved && x.t_ms >= r));
        if let (Some(r), Some(a)) = (rel, acq) {
            break (r, a.t_ms);
        }
        assert!(
            left.elapsed() < Duration::from_secs(20),
            "worker 1 did not take back {moved} within 20 s of worker 2 ({w2_task}) leaving (resync 30 s); \
             released at {rel:?}, given back at {back_ms}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let gap = again - released;
    eprintln!(
        "HANDOFF BACK: {moved} given back {} ms before worker 1 released it; taken again {gap} ms after (resync 30 s)",
        released - back_ms
    );
    assert!(
        back_ms < released,
        "the assignment gave {moved} back at {back_ms}, after worker 1 released it at {released}: the flip did not \
         land during the handoff"
    );
    assert!(gap < 10_000, "{moved} taken again {gap} ms after its release: waited for a resync");
    running1.kill(Duration::from_secs(5)).await.unwrap();
    session1.close().await;
    support::zk_delete_tree(&zk, &root).await;
    s.delete().await;
}

/// A real ZooKeeper session whose reads of one znode can be made to fail: the next
/// `lose` get_data calls on a path ending in `suffix` answer ConnectionLoss without being sent
/// (the connection itself stays up, so no Disconnected/Reconnected follows, as when a proxy
/// drops one answer and the client times the request out). With `hold`, the first watch armed
/// on `suffix` waits until the test lets it go.
struct LosingReads {
    inner: Arc<dyn squall::coord::zkapi::ZkClient>,
    suffix: String,
    lose: Arc<AtomicU64>,
    lost: Arc<AtomicU64>,
    hold: Hold,
}

/// A watch held back: the gate the test opens, and how many watches waited at it.
type Hold = Arc<Mutex<Option<(tokio::sync::oneshot::Receiver<()>, Arc<AtomicU64>)>>>;

impl squall::coord::zkapi::ZkClient for LosingReads {
    fn session_id(&self) -> i64 {
        self.inner.session_id()
    }
    fn session_timeout(&self) -> Duration {
        self.inner.session_timeout()
    }
    fn state(&self) -> zk::SessionState {
        self.inner.state()
    }
    fn state_watcher(&self) -> squall::coord::zkapi::StateWatcher {
        self.inner.state_watcher()
    }
    fn create<'a>(
        &'a self,
        path: &'a str,
        data: &'a [u8],
        mode: &'a squall::coord::zkapi::CreateMode,
    ) -> squall::coord::zkapi::ZkResult<'a, (zk::Stat, squall::coord::zkapi::Sequence)> {
        self.inner.create(path, data, mode)
    }
    fn delete<'a>(&'a self, path: &str, version: Option<i32>) -> squall::coord::zkapi::ZkResult<'a, ()> {
        self.inner.delete(path, version)
    }
    fn get_data<'a>(&'a self, path: &str) -> squall::coord::zkapi::ZkResult<'a, (Vec<u8>, zk::Stat)> {
        let take = path.ends_with(&self.suffix)
            && self.lose.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        if take {
            self.lost.fetch_add(1, Ordering::SeqCst);
            return Box::pin(async { Err(zk::Error::ConnectionLoss) });
        }
        self.inner.get_data(path)
    }
    fn set_data<'a>(
        &'a self,
        path: &str,
        data: &[u8],
        version: Option<i32>,
    ) -> squall::coord::zkapi::ZkResult<'a, zk::Stat> {
        self.inner.set_data(path, data, version)
    }
    fn list_children<'a>(&'a self, path: &str) -> squall::coord::zkapi::ZkResult<'a, Vec<String>> {
        self.inner.list_children(path)
    }
    fn check_stat<'a>(&'a self, path: &str) -> squall::coord::zkapi::ZkResult<'a, Option<zk::Stat>> {
        self.inner.check_stat(path)
    }
    fn sync<'a>(&'a self, path: &str) -> squall::coord::zkapi::ZkResult<'a, ()> {
        self.inner.sync(path)
    }
    fn list_and_watch_children<'a>(
        &'a self,
        path: &str,
    ) -> squall::coord::zkapi::ZkResult<'a, (Vec<String>, squall::coord::zkapi::OneshotWatch)> {
        self.inner.list_and_watch_children(path)
    }
    fn check_and_watch_stat<'a>(
        &'a self,
        path: &str,
    ) -> squall::coord::zkapi::ZkResult<'a, (Option<zk::Stat>, squall::coord::zkapi::OneshotWatch)> {
        let gate = if path.ends_with(&self.suffix) { self.hold.lock().unwrap().take() } else { None };
        let path = path.to_string();
        Box::pin(async move {
            if let Some((gate, held)) = gate {
                held.fetch_add(1, Ordering::SeqCst);
                let _ = gate.await;
            }
            self.inner.check_and_watch_stat(&path).await
        })
    }
    fn multi(
        &self,
        ops: Vec<squall::coord::zkapi::MultiOp>,
    ) -> futures::future::BoxFuture<'_, Result<Vec<zk::MultiWriteResult>, zk::MultiWriteError>> {
        self.inner.multi(ops)
    }
}

/// The worker binary's flags.
#[derive(clap::Parser)]
struct WorkerCli {
    #[command(flatten)]
    worker: squall::WorkerArgs,
}

/// The worker binary's arguments and stages for one stream, through the connector registered
/// as `endpoint`, with a bolt collecting every delivery.
fn lifecycle_worker(
    stream: &str,
    topology: &str,
    root: &str,
    endpoint: &str,
) -> (squall::WorkerArgs, squall::stage::Stages<'static>, Seen) {
    let args = <WorkerCli as clap::Parser>::parse_from([
        "squall".to_string(),
        format!("--topology={topology}"),
        format!("--stream={stream}"),
        format!("--zk=sim://{endpoint}"),
        format!("--zk-root={root}"),
        format!("--endpoint={}", support::kinesis_endpoint().endpoint),
        "--spout-tasks=1".into(),
    ])
    .worker;
    let seen: Seen = Arc::default();
    let seen2 = seen.clone();
    let stages = squall::stage::Stages::new("main", move |b, spout| {
        let s = seen2.clone();
        b.set_bolt("collect", 1, move |_| Collect(s.clone())).shuffle_grouping(spout);
    });
    (args, stages, seen)
}

/// Opens [`LosingReads`] sessions on the real ZooKeeper of the tests.
struct LosingConnector {
    suffix: String,
    lose: Arc<AtomicU64>,
    lost: Arc<AtomicU64>,
    hold: Hold,
}

impl squall::coord::zkapi::ZkConnector for LosingConnector {
    fn connect<'a>(
        &'a self,
        cfg: &'a squall::coord::ZkConfig,
    ) -> futures::future::BoxFuture<'a, Result<Arc<dyn squall::coord::zkapi::ZkClient>, zk::Error>> {
        Box::pin(async move {
            let client = zk::Client::connector()
                .with_session_timeout(cfg.session_timeout)
                .connect(&support::zk_connect())
                .await?;
            let inner: Arc<dyn squall::coord::zkapi::ZkClient> =
                Arc::new(squall::coord::zkapi::RealClient::new(client, false));
            let c: Arc<dyn squall::coord::zkapi::ZkClient> = Arc::new(LosingReads {
                inner,
                suffix: self.suffix.clone(),
                lose: self.lose.clone(),
                lost: self.lost.clone(),
                hold: self.hold.clone(),
            });
            Ok(c)
        })
    }
}

/// A worker (`squall::stage::run_until`, the worker binary's lifecycle) whose read of the
/// topology state after an activation is answered ConnectionLoss reads it again and activates:
/// the watch that announced the activation fired once, and nothing else would make the worker
/// read the state again until the next change (simulator seed 2815, with the coordinator's
/// resync off: the worker stayed inactive for good). Asserted first: the read was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_activation_whose_state_read_is_lost_is_obeyed_when_read_again() {
    use squall::cli::topology_ops::{Collected, set_active};
    squall::logging::init();
    let s = TestStream::create("faults-obey", 1).await;
    let root = support::unique_zk_root("faults-obey");
    let topology = support::unique_name("topo");
    let topo_path = format!("{root}/topologies/{topology}");
    let (lose, lost) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let endpoint = support::unique_name("obey");
    squall::coord::zkapi::register_connector(
        &endpoint,
        Arc::new(LosingConnector {
            suffix: format!("{topo_path}/state"),
            lose: lose.clone(),
            lost: lost.clone(),
            hold: Hold::default(),
        }),
    );
    let (args, stages, seen) = lifecycle_worker(&s.name, &topology, &root, &endpoint);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    // The worker's stages are not Send: it runs on this thread (a LocalSet), the test beside it.
    let local = tokio::task::LocalSet::new();
    let worker = local.spawn_local(squall::stage::run_until(args, stages, async move {
        let _ = stopped.await;
    }));
    let zk = support::zk_client().await;
    local.run_until(async {
    let wait = |want: BTreeSet<(String, String, u64)>, what: &'static str| {
        let seen = seen.clone();
        async move {
            let start = Instant::now();
            loop {
                let missing = want.difference(&seen.lock().unwrap()).count();
                if missing == 0 {
                    return;
                }
                assert!(start.elapsed() < Duration::from_secs(30), "{what}: {missing} of {} never delivered", want.len());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    wait(put(&s, 50).await, "before the deactivation").await;
    let operator = squall::coord::ZkConfig::new(support::zk_connect()).with_root(root.clone());
    set_active(&operator, &topology, false, &mut Collected::default()).await.unwrap();
    let guard = Instant::now();
    while !zk.list_children(&format!("{topo_path}/tasks")).await.unwrap_or_default().is_empty() {
        assert!(guard.elapsed() < Duration::from_secs(30), "the worker never unregistered its task");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    lose.store(1, Ordering::SeqCst);
    set_active(&operator, &topology, true, &mut Collected::default()).await.unwrap();
    let guard = Instant::now();
    while lost.load(Ordering::SeqCst) == 0 {
        assert!(guard.elapsed() < Duration::from_secs(30), "the worker never read the state after the activation");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after = put(&s, 50).await;
    wait(after, "put after the activation whose state read was lost").await;
    eprintln!("OBEY: the state read after the activation was lost once; the worker read it again and delivered 50 of 50");
    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    })
    .await;
    squall::coord::zkapi::unregister_connector(&endpoint);
    support::zk_delete_tree(&zk, &root).await;
    s.delete().await;
}

/// `squall rebalance` whose request to the leader fails (the read of the stream's assignment
/// answered ConnectionLoss) fails, and leaves the topology as it found it: ACTIVE, not
/// deactivated; run again, it goes through and restores ACTIVE again (simulator seed 383: a
/// failed attempt left INACTIVE, and the retried command took INACTIVE for the state to
/// restore). Asserted first: the read was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebalance_that_fails_half_way_restores_the_state_it_found() {
    use squall::cli::topology_ops::{Collected, rebalance_topology};
    use squall::coord::{Lifecycle, TopologyState, ZkConfig, ZkSession, ZkStore};
    squall::logging::init();
    let root = support::unique_zk_root("faults-rebalance");
    let topology = support::unique_name("topo");
    let stream = support::unique_name("s");
    let real = ZkConfig::new(support::zk_connect()).with_root(root.clone());
    let store = ZkStore::open(ZkSession::connect(&real).await.unwrap(), &root, &topology, &stream).await.unwrap();
    let active = TopologyState {
        state: Lifecycle::Active,
        deployment_id: "d1".into(),
        updated_at_ms: squall::coord::now_ms(),
        kill_wait_ms: None,
    };
    store.write_state(&active, None).await.unwrap();
    let (lose, lost) = (Arc::new(AtomicU64::new(1)), Arc::new(AtomicU64::new(0)));
    let endpoint = support::unique_name("rebalance");
    let assignment = format!("{root}/topologies/{topology}/streams/{stream}/assignment");
    squall::coord::zkapi::register_connector(
        &endpoint,
        Arc::new(LosingConnector { suffix: assignment, lose: lose.clone(), lost: lost.clone(), hold: Hold::default() }),
    );
    let cfg = ZkConfig::new(format!("sim://{endpoint}")).with_root(root.clone());
    let first = rebalance_topology(&cfg, &topology, 5, 0, &mut Collected::default()).await;
    assert_eq!(lost.load(Ordering::SeqCst), 1, "the assignment's read was answered ConnectionLoss once");
    let err = format!("{:#}", first.expect_err("the rebalance fails when its request cannot be written"));
    assert!(err.contains("rebalance failed") && err.contains("ACTIVE again"), "the error says so: {err}");
    let state = store.read_state().await.unwrap().unwrap().value;
    assert_eq!(state.state, Lifecycle::Active, "the failed rebalance left the topology ACTIVE");
    rebalance_topology(&cfg, &topology, 5, 0, &mut Collected::default()).await.unwrap();
    let state = store.read_state().await.unwrap().unwrap().value;
    assert_eq!(state.state, Lifecycle::Active, "the rebalance run again restored ACTIVE");
    let request = store.read_assignment().await.unwrap().unwrap().value;
    eprintln!(
        "REBALANCE: first attempt failed ({err}); state ACTIVE; the second wrote generation {}",
        request.generation
    );
    squall::coord::zkapi::unregister_connector(&endpoint);
    support::zk_delete_tree(&support::zk_client().await, &root).await;
}

/// A worker whose lifecycle watch is armed only after the operator deactivated the topology
/// (the deactivation written between the worker's first read of the state and its watch, which
/// then raises no event) obeys INACTIVE all the same: it reads the state again once watching.
/// Asserted first: the watch was held until after the deactivation was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deactivation_written_while_a_worker_starts_its_watch_is_obeyed() {
    use squall::cli::topology_ops::{Collected, set_active};
    squall::logging::init();
    let s = TestStream::create("faults-startgap", 1).await;
    let root = support::unique_zk_root("faults-startgap");
    let topology = support::unique_name("topo");
    let topo_path = format!("{root}/topologies/{topology}");
    let (gate, held) = (tokio::sync::oneshot::channel::<()>(), Arc::new(AtomicU64::new(0)));
    let (open, closed) = gate;
    let hold: Hold = Arc::new(Mutex::new(Some((closed, held.clone()))));
    let endpoint = support::unique_name("startgap");
    squall::coord::zkapi::register_connector(
        &endpoint,
        Arc::new(LosingConnector {
            suffix: format!("{topo_path}/state"),
            lose: Arc::default(),
            lost: Arc::default(),
            hold,
        }),
    );
    let (args, stages, seen) = lifecycle_worker(&s.name, &topology, &root, &endpoint);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let local = tokio::task::LocalSet::new();
    let worker = local.spawn_local(squall::stage::run_until(args, stages, async move {
        let _ = stopped.await;
    }));
    let zk = support::zk_client().await;
    local
        .run_until(async {
            let guard = Instant::now();
            while held.load(Ordering::SeqCst) == 0 {
                assert!(guard.elapsed() < Duration::from_secs(30), "the worker never armed its lifecycle watch");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let operator = squall::coord::ZkConfig::new(support::zk_connect()).with_root(root.clone());
            set_active(&operator, &topology, false, &mut Collected::default()).await.unwrap();
            let _ = open.send(());
            let guard = Instant::now();
            loop {
                let tasks = zk.list_children(&format!("{topo_path}/tasks")).await.unwrap_or_default();
                let assigned = !tasks.is_empty();
                if !assigned && guard.elapsed() > Duration::from_secs(2) {
                    break;
                }
                assert!(
                    guard.elapsed() < Duration::from_secs(15),
                    "the worker still runs its spout task {tasks:?} 15 s after a deactivation written before its watch"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let before = seen.lock().unwrap().len();
            let _ = put(&s, 50).await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            let after = seen.lock().unwrap().len();
            assert_eq!(before, after, "records delivered while INACTIVE");
            eprintln!("STARTGAP: watch held until the deactivation was written; the worker unregistered and delivered 0 of 50 put while inactive");
            let _ = stop.send(());
            worker.await.unwrap().unwrap();
        })
        .await;
    squall::coord::zkapi::unregister_connector(&endpoint);
    support::zk_delete_tree(&zk, &root).await;
    s.delete().await;
}
