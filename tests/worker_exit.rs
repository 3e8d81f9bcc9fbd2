//! A worker and a ZooKeeper it loses, through a TCP proxy the test cuts (the shared server is not
//! touched). With `--zk-session-timeout-ms 2000 --zk-give-up-after-ms 3000` and the proxy cut for
//! good, the worker's session expires (its task registration vanishes from ZooKeeper: the fault
//! happened), it fails to build a new one and exits with a non-zero code, logging that it "gave up
//! on ZooKeeper". A worker whose ZooKeeper comes back within the give-up time instead builds a new
//! session after the expiry, re-registers under a new task name, keeps running and delivers every
//! record, including those put during the outage.

use squall_test_support as support;

use std::time::{Duration, Instant};

use support::TestStream;
use support::ops::{list_shards, put_to_shard, wait_for};
use support::reliability::{Proc, spawn_worker};
use support::tcpproxy::TcpProxy;
use support::workers::{Cluster, Scratch, live_tasks, scratch};

const GUARD: Duration = Duration::from_secs(90);

/// A 1-shard stream, a cluster with a 2 s session, one worker reaching ZooKeeper through `proxy`,
/// settled (registered and delivering).
async fn setup(name: &str, proxy: &TcpProxy, give_up_ms: u64) -> (Scratch, TestStream, Cluster, Proc, Vec<String>) {
    let s = TestStream::create(name, 1).await;
    let dir = scratch(name);
    let mut cluster = Cluster::new(&s.name, &dir);
    cluster.session_timeout_ms = 2000;
    let give_up = give_up_ms.to_string();
    let w = spawn_worker(&cluster, "w1", 1, &["--zk", proxy.addr.as_str(), "--zk-give-up-after-ms", &give_up], &[]);
    let zk = support::zk_client().await;
    let hash = list_shards(&s.client, &s.name).await[0].starting_hash_key.clone();
    let m = put_to_shard(&s.client, &s.name, &hash, "before-", 20, 4).await;
    let r = cluster.wait_delivered(std::slice::from_ref(&m), GUARD).await;
    assert_eq!(r.lost, 0, "the worker never delivered: {r:?}\n{}", cluster.logs());
    let tasks = wait_for(&cluster, "the worker's task registration", GUARD, || async {
        let t = live_tasks(&zk, &cluster).await;
        (t.len() == 1).then_some(t)
    })
    .await;
    (dir, s, cluster, w, tasks)
}

/// Cut for good: the session expires, no new one can be built, the worker exits non-zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_that_gives_up_on_zookeeper_exits_non_zero() {
    let proxy = TcpProxy::start(&support::zk_connect()).await;
    let (_dir, s, cluster, mut w, tasks) = setup("exit-giveup", &proxy, 3000).await;
    let zk = support::zk_client().await;

    proxy.cut();
    let cut = Instant::now();
    // The fault: the server expires the worker's session, so its registration vanishes.
    let expired = wait_for(&cluster, "the worker's session expiring on the server", GUARD, || async {
        live_tasks(&zk, &cluster).await.is_empty().then(|| cut.elapsed())
    })
    .await;
    eprintln!("registration {tasks:?} gone {expired:?} after the cut");
    let code = w.wait_exit(Duration::from_secs(120));
    let exited = cut.elapsed();
    let log = w.log_text();
    eprintln!(
        "WORKER give-up: exit {code:?} {exited:?} after the cut ({} reconnect attempts refused)",
        proxy.refused()
    );
    assert!(code.is_some(), "the worker still runs {exited:?} after losing ZooKeeper for good\n{log}");
    assert_ne!(code, Some(0), "the worker exited 0 after giving up on ZooKeeper\n{log}");
    let line = log.lines().find(|l| l.contains("gave up on ZooKeeper"));
    assert!(line.is_some(), "no 'gave up on ZooKeeper' in the log\n{log}");
    eprintln!("{}", line.unwrap());
    assert!(proxy.refused() > 0, "the worker never tried to reconnect");
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}

/// Cut until the session expired and a rebuild failed, then restored well within the give-up time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_whose_zookeeper_comes_back_within_the_give_up_time_recovers() {
    let proxy = TcpProxy::start(&support::zk_connect()).await;
    let (_dir, s, cluster, mut w, tasks) = setup("exit-recover", &proxy, 60_000).await;
    let zk = support::zk_client().await;
    let hash = list_shards(&s.client, &s.name).await[0].starting_hash_key.clone();
    let mut manifests = Vec::new();

    proxy.cut();
    let cut = Instant::now();
    // The fault: the session expires on the server, and the worker fails to build a new one.
    let expired = wait_for(&cluster, "the worker's session expiring on the server", GUARD, || async {
        live_tasks(&zk, &cluster).await.is_empty().then(|| cut.elapsed())
    })
    .await;
    manifests.push(put_to_shard(&s.client, &s.name, &hash, "during-", 20, 4).await);
    wait_for(&cluster, "a failed attempt to build a new session", GUARD, || async {
        w.log_text().contains("building a new ZooKeeper session failed").then_some(())
    })
    .await;
    let down_for = cut.elapsed();
    proxy.restore();
    let restored = Instant::now();
    eprintln!("registration {tasks:?} gone {expired:?} after the cut; ZooKeeper restored after {down_for:?}");

    let new_tasks = wait_for(&cluster, "the worker re-registering", GUARD, || async {
        let t = live_tasks(&zk, &cluster).await;
        (t.len() == 1 && t != tasks).then_some(t)
    })
    .await;
    let reregistered = restored.elapsed();
    manifests.push(put_to_shard(&s.client, &s.name, &hash, "after-", 20, 4).await);
    let r = cluster.wait_delivered(&manifests, GUARD).await;
    eprintln!(
        "WORKER recover: re-registered as {new_tasks:?} {reregistered:?} after ZooKeeper came back; {}",
        serde_json::to_string(&r).unwrap()
    );
    assert_eq!(r.lost, 0, "{r:?}\n{}", cluster.logs());
    let log = w.log_text();
    assert!(log.contains("new ZooKeeper session"), "no new session in the log\n{log}");
    assert!(!log.contains("gave up on ZooKeeper"), "it gave up although ZooKeeper came back\n{log}");
    assert!(w.is_running(), "the worker exited\n{log}");
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0), "{}", w.log_text());
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}

/// A session rebuilt while the worker runs more spout tasks than runtime threads: every task
/// re-registers under the new session soon after ZooKeeper is back, each saying once that its
/// session was lost. (A view published healthy before it held the new session's store made every
/// task fail on the dead store and start over without yielding; with tasks >= threads the
/// rebuild that would replace the store never ran: millions of "session lost" lines, no recovery.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_rebuilt_under_more_tasks_than_threads_re_registers_every_task() {
    const TASKS: usize = 4;
    let proxy = TcpProxy::start(&support::zk_connect()).await;
    let s = TestStream::create("exit-rebuild", TASKS as i32).await;
    let dir = scratch("exit-rebuild");
    let mut cluster = Cluster::new(&s.name, &dir);
    cluster.session_timeout_ms = 2000;
    let mut w = spawn_worker(
        &cluster,
        "w1",
        TASKS,
        &["--zk", proxy.addr.as_str(), "--zk-give-up-after-ms", "60000"],
        &[("TOKIO_WORKER_THREADS", "2")],
    );
    let zk = support::zk_client().await;
    let tasks = wait_for(&cluster, "the worker's tasks registering", GUARD, || async {
        let t = live_tasks(&zk, &cluster).await;
        (t.len() == TASKS).then_some(t)
    })
    .await;
    proxy.cut();
    let cut = Instant::now();
    // past 1.4 x the session timeout: the server expired the session and the client did too
    wait_for(&cluster, "the worker's session expiring on the server", GUARD, || async {
        live_tasks(&zk, &cluster).await.is_empty().then_some(())
    })
    .await;
    wait_for(&cluster, "the worker noticing its session expired", GUARD, || async {
        w.log_text().contains("ZooKeeper session ended").then_some(())
    })
    .await;
    let down_for = cut.elapsed();
    proxy.restore();
    let restored = Instant::now();
    let new_tasks = wait_for(&cluster, "every task re-registering", GUARD, || async {
        let t = live_tasks(&zk, &cluster).await;
        (t.len() == TASKS && t.iter().all(|n| !tasks.contains(n))).then_some(t)
    })
    .await;
    let took = restored.elapsed();
    let log = w.log_text();
    let lost_lines = log.lines().filter(|l| l.contains("ZooKeeper session lost: stopped reading every shard")).count();
    eprintln!(
        "REBUILD: {TASKS} tasks, 2 threads; ZooKeeper cut for {down_for:?}; every task re-registered {took:?} after it \
         came back ({new_tasks:?}); 'session lost' lines {lost_lines}"
    );
    assert!(took < Duration::from_secs(5), "re-registered {took:?} after ZooKeeper came back (bound 5 s)\n{log}");
    assert_eq!(
        lost_lines,
        TASKS,
        "one 'session lost' line per task\n{}",
        log.lines().take(200).collect::<Vec<_>>().join("\n")
    );
    assert!(w.is_running(), "the worker exited\n{log}");
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0), "{}", w.log_text());
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}

/// A silent partition (no reset: connection attempts hang) with a 3 s give-up time: the worker
/// gives up and exits non-zero about 3 s after its session ended, not after its connection
/// attempts ran out (each may wait a session timeout per try).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_silenced_from_zookeeper_gives_up_within_the_configured_time() {
    const GIVE_UP_MS: u64 = 3000;
    let proxy = TcpProxy::start(&support::zk_connect()).await;
    let (_dir, s, cluster, mut w, _tasks) = setup("exit-silent", &proxy, GIVE_UP_MS).await;
    let zk = support::zk_client().await;
    proxy.silence();
    let cut = Instant::now();
    let mut ended_at = None;
    let code = loop {
        if ended_at.is_none() && w.log_text().contains("ZooKeeper session ended") {
            ended_at = Some(Instant::now());
        }
        if let Some(code) = w.wait_exit(Duration::from_millis(50)) {
            break Some(code);
        }
        if cut.elapsed() > Duration::from_secs(120) {
            break None;
        }
    };
    let exited = Instant::now();
    let log = w.log_text();
    assert!(code.is_some(), "the worker still runs {:?} after losing ZooKeeper for good\n{log}", cut.elapsed());
    assert_ne!(code, Some(0), "the worker exited 0 after giving up on ZooKeeper\n{log}");
    assert!(log.contains("gave up on ZooKeeper"), "no 'gave up on ZooKeeper' in the log\n{log}");
    let ended_at = ended_at.expect("the worker logged that its session ended");
    let after_end = exited - ended_at;
    eprintln!(
        "WORKER silent give-up: session ended {:?} after the cut; exited {after_end:?} after that (give-up {GIVE_UP_MS} ms)",
        ended_at - cut
    );
    assert!(
        after_end <= Duration::from_millis(GIVE_UP_MS + 1500),
        "exited {after_end:?} after the session ended, give-up configured at {GIVE_UP_MS} ms\n{log}"
    );
    proxy.restore();
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}

/// A worker started while its ZooKeeper cannot be reached (the proxy closes every connection)
/// keeps trying for its give-up time instead of exiting: once ZooKeeper is back it registers and
/// delivers. (It used to exit non-zero after about one second of connect retries, into its
/// supervisor's back-off; found by the simulator, a worker started during a partition.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_started_while_zookeeper_is_away_waits_for_it() {
    let proxy = TcpProxy::start(&support::zk_connect()).await;
    proxy.cut();
    let s = TestStream::create("exit-late-zk", 1).await;
    let dir = scratch("exit-late-zk");
    let mut cluster = Cluster::new(&s.name, &dir);
    cluster.session_timeout_ms = 2000;
    let mut w = spawn_worker(&cluster, "w1", 1, &["--zk", proxy.addr.as_str(), "--zk-give-up-after-ms", "30000"], &[]);
    let started = Instant::now();
    // The fault: its connect attempts fail while the proxy is cut (each one logged). A worker
    // that exits meanwhile ends the wait (its log says why).
    loop {
        if w.log_text().matches("connecting to ZooKeeper failed; retrying").count() >= 2 {
            break;
        }
        assert!(w.is_running(), "the worker exited while ZooKeeper was away\n{}", w.log_text());
        assert!(started.elapsed() < GUARD, "no failed connect attempt logged in {GUARD:?}\n{}", w.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let away = started.elapsed();
    proxy.restore();
    let back = Instant::now();
    let zk = support::zk_client().await;
    wait_for(&cluster, "the worker's task registration", GUARD, || async {
        (live_tasks(&zk, &cluster).await.len() == 1).then_some(())
    })
    .await;
    let registered = back.elapsed();
    let hash = list_shards(&s.client, &s.name).await[0].starting_hash_key.clone();
    let m = put_to_shard(&s.client, &s.name, &hash, "late-", 20, 4).await;
    let r = cluster.wait_delivered(std::slice::from_ref(&m), GUARD).await;
    eprintln!(
        "LATE ZOOKEEPER: away {away:?} (2 failed attempts or more), registered {registered:?} after it came back"
    );
    assert_eq!(r.lost, 0, "{r:?}\n{}", w.log_text());
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0), "{}", w.log_text());
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}
