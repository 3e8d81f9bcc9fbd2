//! ZooKeeper outage of 10 s and session expiry: two workers on a ZooKeeper server of the test's
//! own; the server is SIGKILLed for 10 s while a producer keeps writing. The workers must stop
//! fetching while they cannot own or checkpoint (no read-log `records` after half the session
//! timeout plus slack), see their sessions expire, open new ones, re-register under new task names,
//! re-own every shard and continue with nothing lost; checkpoints never move backwards.

use squall_test_support as support;

use std::time::{Duration, Instant};

use squall::coord::now_ms;
use support::TestStream;
use support::ensemble::Ensemble;
use support::reliability::{CheckpointWatcher, backwards_moves, spawn_producer, spawn_worker};
use support::workers::{Cluster, live_tasks, owners, read_deliveries, read_log_entries, scratch};

async fn connect(connect: &str) -> zookeeper_client::Client {
    zookeeper_client::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(connect)
        .await
        .expect("connect to the test's ZooKeeper")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_outage_of_10s_expires_sessions_then_workers_recover_losing_nothing() {
    outage(false).await;
}

/// Same scenario, checking that readers stop within half the session timeout of losing ZooKeeper:
/// the worker's session monitor closes every reader's gate directly, whatever its coordinator
/// loops are waiting on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_outage_readers_stop_within_half_the_session_timeout() {
    outage(true).await;
}

async fn outage(check_quiet: bool) {
    let dir = scratch("rel-zk-outage");
    let mut zk_servers = Ensemble::start(1, &dir.join("zk"));
    let zk_connect = zk_servers.connect();
    let s = TestStream::create("rel-zk-outage", 4).await;
    let cluster = Cluster::new(&s.name, &dir);
    let args = ["--zk", zk_connect.as_str()];
    let mut w1 = spawn_worker(&cluster, "w1", 1, &args, &[]);
    let mut w2 = spawn_worker(&cluster, "w2", 1, &args, &[]);
    let watcher = CheckpointWatcher::start(&zk_connect, &cluster.stream_path(), None);
    let producer = spawn_producer(&s.client, &s.label(), &s.name, 3600, 40, 150.0);

    // Both workers own shards and deliver.
    let zk = connect(&zk_connect).await;
    let start = Instant::now();
    let old_tasks = loop {
        let t = live_tasks(&zk, &cluster).await;
        let o = owners(&zk, &cluster).await;
        let n = read_deliveries(&cluster.delivery_files()).len();
        if t.len() == 2 && o.len() == 4 && o.values().all(|x| t.contains(x)) && n > 100 {
            break t;
        }
        assert!(start.elapsed() < Duration::from_secs(40), "never settled\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    drop(zk);

    // The outage.
    let outage_start = now_ms();
    let t0 = Instant::now();
    zk_servers.kill_all();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let outage_end = now_ms();
    zk_servers.restart_all();
    let restarted = Instant::now();
    eprintln!("ZooKeeper down for {:?}", t0.elapsed());

    // New sessions, new registrations, every shard owned again by the new tasks.
    let zk = connect(&zk_connect).await;
    let reowned = loop {
        let t = live_tasks(&zk, &cluster).await;
        let o = owners(&zk, &cluster).await;
        if t.len() == 2 && t.iter().all(|x| !old_tasks.contains(x)) && o.len() == 4 && o.values().all(|x| t.contains(x))
        {
            break restarted.elapsed();
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(60),
            "never re-owned: tasks {t:?}, owners {o:?}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!("re-registered and re-owned every shard {reowned:?} after ZooKeeper came back");

    let manifest = producer.await.unwrap();
    let report = cluster.wait_delivered(std::slice::from_ref(&manifest), Duration::from_secs(90)).await;
    let obs = watcher.finish().await;
    eprintln!(
        "RELIABILITY zk-outage: {} reowned_after_restart_ms={}",
        serde_json::to_string(&report).unwrap(),
        reowned.as_millis()
    );
    assert_eq!(report.lost, 0, "{report:?}\n{}", cluster.logs());
    assert_eq!(report.order_violations, 0, "{report:?}");

    // No fetching while ZooKeeper was unreachable: from half the session timeout (+1.5 s slack)
    // after the outage began until it ended, no task read any records.
    let entries = read_log_entries(&cluster.read_logs());
    let quiet_from = outage_start + cluster.session_timeout_ms as i64 / 2 + 1500;
    let during: Vec<_> =
        entries.iter().filter(|e| e.event == "records" && e.t_ms > quiet_from && e.t_ms < outage_end).collect();
    let before: usize = entries
        .iter()
        .filter(|e| e.event == "records" && e.t_ms > outage_start - 5000 && e.t_ms < outage_start)
        .count();
    assert!(before > 0, "nothing was read before the outage; the check would prove nothing");
    let last_read = entries.iter().filter(|e| e.event == "records" && e.t_ms < outage_end).map(|e| e.t_ms).max();
    eprintln!("last read {} ms into the outage", last_read.unwrap_or(outage_start) - outage_start);
    if check_quiet {
        assert!(during.is_empty(), "read while ZooKeeper was down: {during:#?}");
    }
    let lost_logged = ["w1", "w2"].iter().filter(|w| {
        std::fs::read_to_string(dir.join(format!("{w}.log"))).unwrap_or_default().contains("ZooKeeper session lost")
    });
    assert_eq!(lost_logged.count(), 2, "both workers should report the lost session\n{}", cluster.logs());
    let violations = support::reliability::reading_overlaps(&entries);
    assert!(violations.is_empty(), "{violations:#?}");
    let back = backwards_moves(&obs);
    assert!(back.is_empty() && !obs.is_empty(), "{back:#?}");

    assert!(w1.is_running() && w2.is_running());
    assert_eq!(w1.stop(Duration::from_secs(30)), Some(0));
    assert_eq!(w2.stop(Duration::from_secs(30)), Some(0));
    s.delete().await;
}
