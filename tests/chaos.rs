//! The chaos test: a 3-node ZooKeeper ensemble on loopback (tests/support/ensemble.rs), three
//! audit worker processes and a producer. Meanwhile shards are split and merged, a worker is
//! SIGKILLed and replaced, another is SIGSTOPped past its session timeout and resumed (a zombie),
//! and the ZooKeeper leader is SIGKILLed and restarted. Every delivery is recorded by the sinks.
//!
//! Verified: nothing lost; per key, first deliveries in producer order; no checkpoint ever moved
//! backwards (every version observed from ZooKeeper); never two readers of one shard at once and
//! no child read before its parents finished (read logs); no checkpoint write by the zombie was
//! accepted after its session expired (every version's writer, observed from ZooKeeper).
//! Reports duplicates and the failover times measured.

use squall_test_support as support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use squall::coord::now_ms;
use squall::kinesis;
use support::TestStream;
use support::ensemble::Ensemble;
use support::reliability::{
    CheckpointWatcher, Proc, backwards_moves, child_before_parent, grep_logs, reading_overlaps, spawn_producer,
    spawn_worker, tasks_of, wait_reowned,
};
use support::workers::{Cluster, live_tasks, owners, read_deliveries, read_log_entries, scratch};

const SESSION_MS: u64 = 4000;

struct Chaos {
    cluster: Cluster,
    zk: zookeeper_client::Client,
    zk_connect: String,
}

impl Chaos {
    fn start(&self, name: &str) -> Proc {
        spawn_worker(&self.cluster, name, 1, &["--zk", self.zk_connect.as_str()], &[])
    }

    /// Task node names whose TaskInfo pid is `pid`.
    async fn tasks_of(&self, pid: u32) -> Vec<String> {
        tasks_of(&self.zk, &self.cluster, pid).await
    }

    /// See [`wait_reowned`].
    async fn wait_reowned(
        &self,
        victims: &[String],
        shards: &[String],
        since_ms: i64,
        limit: Duration,
    ) -> (Duration, Duration) {
        wait_reowned(&self.zk, &self.cluster, victims, shards, since_ms, limit).await
    }
}

/// Two open shards with adjacent hash ranges.
async fn some_open(s: &TestStream) -> String {
    let l = kinesis::list_shards(&s.client, &s.label(), &s.name).await.unwrap();
    l.into_iter().filter(|d| !d.closed).map(|d| d.shard_id).max().unwrap()
}

/// `make test`: 4800 records at 80 a second, long enough (60 s) for every fault below to land
/// while the producer writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_splits_merges_sigkill_zombie_and_zookeeper_leader_loss() {
    chaos(4800, 80.0).await;
}

/// `make soak`: the same faults over 9000 records at 100 a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "soak: make soak"]
async fn chaos_soak_9000_records() {
    chaos(9000, 100.0).await;
}

async fn chaos(records: u64, rate: f64) {
    let t_start = Instant::now();
    let dir = scratch("chaos");
    let mut ensemble = Ensemble::start(3, &dir.join("zk"));
    let zk_connect = ensemble.connect();
    eprintln!("ensemble {zk_connect} serving after {:?}", t_start.elapsed());
    let s = TestStream::create("chaos", 4).await;
    let mut cluster = Cluster::new(&s.name, &dir);
    cluster.session_timeout_ms = SESSION_MS;
    let zk = zookeeper_client::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(&zk_connect)
        .await
        .unwrap();
    let chaos = Chaos { cluster: cluster.clone(), zk, zk_connect: zk_connect.clone() };
    let watcher = CheckpointWatcher::start(&zk_connect, &cluster.stream_path(), None);
    let mut a = chaos.start("a");
    let mut b = chaos.start("b");
    let mut c = chaos.start("c");
    let producer = spawn_producer(&s.client, &s.label(), &s.name, records, 60, rate);
    let mut timeline: Vec<String> = Vec::new();
    let mut mark = |what: String| {
        eprintln!("[{:>6.1}s] {what}", t_start.elapsed().as_secs_f64());
        timeline.push(what);
    };

    // Settle: three tasks, every shard owned, deliveries flowing.
    let settle = Instant::now();
    loop {
        let t = live_tasks(&chaos.zk, &cluster).await;
        let o = owners(&chaos.zk, &cluster).await;
        if t.len() == 3 && o.len() == 4 && read_deliveries(&cluster.delivery_files()).len() > 100 {
            break;
        }
        assert!(settle.elapsed() < Duration::from_secs(40), "never settled\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    mark("settled: 3 workers, 4 shards owned".into());

    // 1. Split.
    let shard = some_open(&s).await;
    kinesis::split_shard(&s.client, &s.label(), &s.name, &shard).await.unwrap();
    mark(format!("split {shard}"));
    tokio::time::sleep(Duration::from_secs(6)).await;

    // 2. SIGKILL worker a, start its replacement.
    let a_tasks = chaos.tasks_of(a.pid()).await;
    let a_shards: Vec<String> =
        owners(&chaos.zk, &cluster).await.into_iter().filter(|(_, t)| a_tasks.contains(t)).map(|(s, _)| s).collect();
    let killed_ms = now_ms();
    a.kill();
    let mut a2 = chaos.start("a2");
    let (sigkill_failover, sigkill_read) =
        chaos.wait_reowned(&a_tasks, &a_shards, killed_ms, Duration::from_secs(60)).await;
    mark(format!(
        "SIGKILL a {a_tasks:?} (held {a_shards:?}); replaced by a2; each of its shards owned by another task after \
         {sigkill_failover:?}, read after {sigkill_read:?}"
    ));
    tokio::time::sleep(Duration::from_secs(4)).await;

    // 3. The zombie: SIGSTOP b past its session timeout, then SIGCONT.
    // The zombie is a worker that is not the leader, so that the leader lists the children of the
    // split below while their parent is frozen.
    let leader_task = live_tasks(&chaos.zk, &cluster).await.into_iter().next().unwrap_or_default();
    if chaos.tasks_of(b.pid()).await.contains(&leader_task) {
        std::mem::swap(&mut b, &mut c);
    }
    let b_tasks = chaos.tasks_of(b.pid()).await;
    let b_shards: Vec<String> =
        owners(&chaos.zk, &cluster).await.into_iter().filter(|(_, t)| b_tasks.contains(t)).map(|(s, _)| s).collect();
    let stopped = Instant::now();
    let stopped_ms = now_ms();
    b.pause();
    // Split a shard of the frozen worker: its children are listed while their parent is unread
    // (a lagging parent), so reading them before the parent finished would be possible now.
    let lagging = b_shards.first().cloned().expect("b held a shard");
    kinesis::split_shard(&s.client, &s.label(), &s.name, &lagging).await.unwrap();
    let (zombie_failover, zombie_read) =
        chaos.wait_reowned(&b_tasks, &b_shards, stopped_ms, Duration::from_secs(60)).await;
    // Its session is gone once its task node is gone (the server expired it): within its
    // session timeout of the freeze, plus the server's tick.
    let expired_at = loop {
        let live = live_tasks(&chaos.zk, &cluster).await;
        if b_tasks.iter().all(|t| !live.contains(t)) {
            break now_ms();
        }
        assert!(
            stopped.elapsed() < Duration::from_millis(SESSION_MS) + Duration::from_secs(20),
            "the frozen worker's task nodes {b_tasks:?} outlived its {SESSION_MS} ms session by 20 s: the server never \
             expired it\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    mark(format!(
        "SIGSTOP {} {b_tasks:?} (held {b_shards:?}), split {lagging} meanwhile; each of its shards owned by another task \
         after {zombie_failover:?}, read after {zombie_read:?}",
        b.name
    ));
    let stop_for = Duration::from_millis(SESSION_MS * 8 / 5);
    tokio::time::sleep(stop_for.saturating_sub(stopped.elapsed())).await;
    b.resume();
    let resumed_at = now_ms();
    mark(format!("SIGCONT {} after {:?} stopped", b.name, stopped.elapsed()));
    tokio::time::sleep(Duration::from_secs(6)).await;

    // 4. Merge two adjacent open shards.
    let (x, y) = support::ops::adjacent_open(&s).await.expect("two open shards with adjacent hash ranges to merge");
    kinesis::merge_shards(&s.client, &s.label(), &s.name, &x, &y).await.unwrap();
    mark(format!("merge {x} + {y}"));
    tokio::time::sleep(Duration::from_secs(4)).await;

    // 5. SIGKILL the ZooKeeper leader, restart it later.
    let leader = ensemble.leader().expect("a leader");
    let cps_before = watcher.seen.lock().unwrap().len();
    let zk_killed = Instant::now();
    ensemble.kill(leader);
    let (new_leader, election) = ensemble.wait_leader(Duration::from_secs(30)).expect("no new leader");
    // Checkpoints move again (the first new version written after the kill).
    let progress = loop {
        if watcher.seen.lock().unwrap().len() > cps_before + 2 {
            break zk_killed.elapsed();
        }
        assert!(
            zk_killed.elapsed() < Duration::from_secs(30),
            "no checkpoint progress after the leader loss\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    mark(format!(
        "SIGKILL ZooKeeper leader server {}; server {} leads after {election:?}; checkpoints move again after {progress:?}",
        leader + 1,
        new_leader + 1
    ));
    tokio::time::sleep(Duration::from_secs(5)).await;
    ensemble.restart(leader);
    ensemble.wait_serving(Duration::from_secs(30));
    mark(format!("restarted ZooKeeper server {}", leader + 1));

    // 6. Another split while the producer runs.
    let shard = some_open(&s).await;
    kinesis::split_shard(&s.client, &s.label(), &s.name, &shard).await.unwrap();
    mark(format!("split {shard}"));

    let manifest = producer.await.unwrap();
    mark(format!("producer done: {} records", manifest.total));
    let report = cluster.wait_delivered(std::slice::from_ref(&manifest), Duration::from_secs(120)).await;
    mark("all delivered (or timed out)".into());
    tokio::time::sleep(Duration::from_secs(2)).await; // last checkpoints
    let obs = watcher.finish().await;

    // ---- verification ----
    let shards = kinesis::list_shards(&s.client, &s.label(), &s.name).await.unwrap();
    let parents: HashMap<String, Vec<String>> = shards
        .iter()
        .map(|d| {
            (d.shard_id.clone(), d.parent_shard_id.iter().chain(d.adjacent_parent_shard_id.iter()).cloned().collect())
        })
        .collect();
    let entries = read_log_entries(&cluster.read_logs());
    let mut violations = reading_overlaps(&entries);
    violations.extend(child_before_parent(&entries, &parents));
    let back = backwards_moves(&obs);
    // The zombie: no checkpoint version written by its tasks after its session expired.
    let zombie_writes: Vec<String> = obs
        .iter()
        .filter(|o| o.cp.writer.as_ref().is_some_and(|w| b_tasks.contains(w)) && o.mtime_ms > expired_at)
        .map(|o| format!("{} v{} by {:?} at {}", o.shard, o.version, o.cp.writer, o.mtime_ms))
        .collect();
    let b_log = b.log_text();
    // Every shard the zombie held when it froze: one refused checkpoint write each once it resumed
    // (its last attempt after the session loss writes every shard it held).
    let refused: BTreeSet<&str> = b_log
        .lines()
        .filter(|l| l.contains("checkpoint refused"))
        .flat_map(|l| b_shards.iter().filter(|s| l.contains(s.as_str())).map(String::as_str))
        .collect();
    // Batches the zombie queued after it resumed (a GetRecords answered as it was stopped) are
    // not handed on: none of their records may reach its sink.
    let late_reads: Vec<_> =
        entries.iter().filter(|e| e.event == "records" && b_tasks.contains(&e.task) && e.t_ms >= resumed_at).collect();
    let seq_key = |s: &str| (s.len(), s.to_string());
    let zombie_reads: Vec<String> = read_deliveries(&cluster.delivery_files())
        .into_iter()
        .filter(|d| d.worker == b.name)
        .filter(|d| {
            late_reads.iter().any(|e| {
                e.shard == d.shard
                    && e.first.as_deref().is_some_and(|f| seq_key(f) <= seq_key(&d.sequence))
                    && e.last.as_deref().is_some_and(|l| seq_key(&d.sequence) <= seq_key(l))
            })
        })
        .map(|d| format!("{} {} {} delivered at {} us", d.shard, d.sequence, d.key, d.t_us))
        .collect();
    let checkpoint_versions = obs.len();
    let writers: BTreeSet<String> = obs.iter().filter_map(|o| o.cp.writer.clone()).collect();
    let by_shard: BTreeMap<&str, usize> = obs.iter().fold(BTreeMap::new(), |mut m, o| {
        *m.entry(o.shard.as_str()).or_default() += 1;
        m
    });
    eprintln!("timeline:\n  {}", timeline.join("\n  "));
    eprintln!(
        "checkpoint versions observed: {checkpoint_versions} over {} shards, writers {writers:?}",
        by_shard.len()
    );
    eprintln!(
        "zombie: shards whose checkpoint write was refused after it resumed: {refused:?} of {b_shards:?}; accepted after expiry: {}; batches queued after resume: {}, their records handed on: {}",
        zombie_writes.len(),
        late_reads.len(),
        zombie_reads.len()
    );
    eprintln!(
        "RELIABILITY chaos: {} sigkill_failover_ms={} sigkill_read_ms={} zombie_failover_ms={} zombie_read_ms={} zk_election_ms={} zk_progress_ms={} total_s={:.0}",
        serde_json::to_string(&report).unwrap(),
        sigkill_failover.as_millis(),
        sigkill_read.as_millis(),
        zombie_failover.as_millis(),
        zombie_read.as_millis(),
        election.as_millis(),
        progress.as_millis(),
        t_start.elapsed().as_secs_f64()
    );
    let panics = grep_logs(&dir, "panicked");
    assert!(panics.is_empty(), "{panics:#?}");
    assert_eq!(report.lost, 0, "lost: {report:?}\n{}", cluster.logs());
    assert_eq!(report.order_violations, 0, "first deliveries out of producer order: {report:?}");
    assert!(back.is_empty(), "checkpoints moved backwards: {back:#?}");
    assert!(checkpoint_versions > 50, "too few checkpoint versions observed ({checkpoint_versions}) to prove anything");
    assert!(zombie_writes.is_empty(), "the zombie's checkpoint writes were accepted: {zombie_writes:#?}");
    let held: BTreeSet<&str> = b_shards.iter().map(String::as_str).collect();
    assert_eq!(
        refused, held,
        "the zombie held {b_shards:?}: a checkpoint write for each must be refused after it resumed\n{b_log}"
    );
    assert!(zombie_reads.is_empty(), "the zombie handed on records it read after it resumed: {zombie_reads:#?}");
    assert!(violations.is_empty(), "read-log violations: {violations:#?}");
    assert!(b_log.contains("ZooKeeper session lost"), "the zombie never noticed its session expired\n{b_log}");
    let bounded = Duration::from_millis(SESSION_MS) + Duration::from_secs(3);
    // Re-ownership follows the session expiry, not a slower safety net; when the first read comes
    // back depends on the Kinesis engine's load, so it is reported, not bounded.
    assert!(
        sigkill_failover <= bounded && zombie_failover <= bounded,
        "shards re-owned too slowly: {sigkill_failover:?} / {zombie_failover:?} (session timeout {SESSION_MS} ms)"
    );

    for w in [&mut a2, &mut b, &mut c] {
        assert!(w.is_running(), "{} died\n{}", w.name, w.log_text());
        assert_eq!(w.stop(Duration::from_secs(30)), Some(0), "{} did not stop cleanly\n{}", w.name, w.log_text());
    }
    drop(ensemble);
    s.delete().await;
}
