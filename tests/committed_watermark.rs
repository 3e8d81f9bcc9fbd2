//! The committed watermark of a stream, published by the spout tasks to ZooKeeper
//! (`committed_watermark_interval_ms`) and read with `ZkStore::committed_watermark`, against the
//! real kinesis-local and ZooKeeper, with in-process workers (one topology each, same topology
//! name and ZooKeeper root, so each has its own session):
//! - a bolt holds (does not ack) one record: the committed watermark stays at its arrival time
//!   while later records are acked and the in-band watermark moves past it; once it is acked,
//!   the committed watermark passes it;
//! - when a second worker joins, the new assignment generation has no committed watermark until
//!   every task it lists reported for it (Err names the task and the generation); then it has;
//! - a deactivated task removes its report.

use squall_test_support as support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use squall::coord::{WatermarkReport, ZkStore};
use squall::spout::{KinesisSpout, KinesisSpoutConfig, SpoutRegistry, WorkerIdentity};
use squall::topology::{
    AckHandle, Bolt, BoltOutput, ComponentError, RunningTopology, Timer, TopologyBuilder, TopologyConfig, Tuple,
    Watermark,
};
use support::TestStream;

const HOLD: &[u8] = b"HOLD";
const INTERVAL_MS: u64 = 300;

#[derive(Debug, Default)]
struct Seen {
    /// Arrival time of the held record.
    hold_arrival: Option<i64>,
    /// Arrival times of the records acked (every record but the held one, acked on return).
    acked_arrivals: Vec<i64>,
    /// The highest in-band watermark the bolt saw.
    max_watermark: Option<u64>,
}

/// Acks every record at once except the first `HOLD` record, which it holds until `release`.
struct Holder {
    seen: Arc<Mutex<Seen>>,
    release: Arc<AtomicBool>,
    held: Option<AckHandle>,
}

impl Bolt for Holder {
    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let arrival = t.get_i64("arrival_ms")?;
        let mut seen = self.seen.lock().unwrap();
        if t.get_bytes("data")?.as_ref() == HOLD && seen.hold_arrival.is_none() {
            seen.hold_arrival = Some(arrival);
            self.held = Some(out.defer_ack()?);
            out.schedule_after(Duration::from_millis(50), 0);
        } else {
            seen.acked_arrivals.push(arrival);
        }
        Ok(())
    }

    async fn on_timer(&mut self, _timer: Timer, out: &mut BoltOutput) -> Result<(), ComponentError> {
        if self.release.load(Ordering::SeqCst) {
            if let Some(h) = self.held.take() {
                out.ack(h);
            }
        } else {
            out.schedule_after(Duration::from_millis(50), 0);
        }
        Ok(())
    }

    async fn on_watermark(&mut self, wm: Watermark, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        let mut seen = self.seen.lock().unwrap();
        seen.max_watermark = Some(seen.max_watermark.map_or(wm.0, |m| m.max(wm.0)));
        Ok(())
    }
}

struct Worker {
    running: RunningTopology,
    registry: SpoutRegistry,
    seen: Arc<Mutex<Seen>>,
    release: Arc<AtomicBool>,
}

impl Worker {
    fn start(topology: &str, cfg: &KinesisSpoutConfig) -> Worker {
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let release = Arc::new(AtomicBool::new(false));
        let registry = SpoutRegistry::default();
        let mut b = TopologyBuilder::new(topology.to_string());
        KinesisSpout::declare_with_registry(
            &mut b,
            "kinesis",
            1,
            cfg.clone(),
            WorkerIdentity::current(),
            registry.clone(),
        );
        let (s, r) = (seen.clone(), release.clone());
        b.set_bolt("hold", 1, move |_| Holder { seen: s.clone(), release: r.clone(), held: None })
            .shuffle_grouping("kinesis");
        // The held record must not time out: the test releases it itself.
        let tcfg = TopologyConfig { max_spout_pending: 1000, message_timeout_ms: 300_000, ..TopologyConfig::default() };
        let running = squall::topology::run_local(b.build().unwrap(), tcfg).unwrap();
        Worker { running, registry, seen, release }
    }

    fn task(&self) -> String {
        self.registry.tasks().first().map(|t| t.task_name()).unwrap_or_default()
    }

    fn spout(&self) -> squall::topology::ComponentMetrics {
        self.running.metrics().component("kinesis").cloned().unwrap()
    }
}

/// Puts a few records every 100 ms (six keys, so both shards get some) until `stop`.
fn produce(s: &TestStream, stop: Arc<AtomicBool>, put: Arc<AtomicU64>) -> tokio::task::JoinHandle<()> {
    let (client, name) = (s.client.clone(), s.name.clone());
    tokio::spawn(async move {
        let mut i = 0u64;
        while !stop.load(Ordering::SeqCst) {
            let entries = (0..3)
                .map(|_| {
                    i += 1;
                    PutRecordsRequestEntry::builder()
                        .partition_key(format!("key-{}", i % 6))
                        .data(Blob::new(format!("record-{i}")))
                        .build()
                        .unwrap()
                })
                .collect::<Vec<_>>();
            if let Ok(out) = client.put_records().stream_name(&name).set_records(Some(entries)).send().await {
                put.fetch_add(3 - out.failed_record_count().unwrap_or(0) as u64, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

async fn wait_for<T>(what: &str, timeout: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(t0.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_watermark_waits_for_unacked_records_and_for_every_task_of_the_generation() {
    squall::logging::init();
    let s = TestStream::create("cwm", 2).await;
    let root = support::unique_zk_root("cwm");
    let topology = support::unique_name("cwm");
    let mut cfg = support::spout_config(&topology, &s.name, &root);
    cfg.checkpoint_interval_ms = 300;
    cfg.shard_discovery_interval_ms = 1000;
    cfg.resync_interval_ms = 2000;
    cfg.watermark_idle_timeout_ms = 1000;
    cfg.committed_watermark_interval_ms = INTERVAL_MS;
    cfg.validate().unwrap();
    let store = ZkStore::connect(&cfg.zookeeper.to_zk_config(), &topology, &s.name).await.unwrap();

    // Before any worker: nothing to read, and the reason says so.
    let before = store.committed_watermark().await.unwrap();
    assert!(before.as_ref().is_err_and(|e| e.contains("no assignment")), "{before:?}");

    let a = Worker::start(&topology, &cfg);
    wait_for("worker a to read both shards", Duration::from_secs(30), async || {
        (a.registry.tasks().iter().flat_map(|t| t.shards()).filter(|(_, st)| st.millis_behind_latest.is_some()).count()
            == 2)
            .then_some(())
    })
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let put = Arc::new(AtomicU64::new(0));
    let producer = produce(&s, stop.clone(), put.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Phase 1: one record held by the bolt.
    let hold = PutRecordsRequestEntry::builder().partition_key("hold").data(Blob::new(HOLD)).build().unwrap();
    s.client.put_records().stream_name(&s.name).records(hold).send().await.unwrap();
    let t_hold =
        wait_for("the bolt to hold the record", Duration::from_secs(20), async || a.seen.lock().unwrap().hold_arrival)
            .await;
    let t0 = Instant::now();
    let mut committed_seen: Vec<i64> = Vec::new();
    let mut reasons: Vec<String> = Vec::new();
    let mut passed_at: Option<Instant> = None;
    loop {
        match store.committed_watermark().await.unwrap() {
            Ok(w) => committed_seen.push(w),
            Err(why) => reasons.push(why),
        }
        let (in_band, acked_after) = {
            let seen = a.seen.lock().unwrap();
            (seen.max_watermark, seen.acked_arrivals.iter().filter(|t| **t > t_hold).count())
        };
        // Keep watching for 2 s (several report intervals) after the in-band watermark passed the
        // held record by a second and 20 later records were acked.
        if passed_at.is_none() && in_band.is_some_and(|w| w as i64 > t_hold + 1000) && acked_after >= 20 {
            passed_at = Some(Instant::now());
        }
        if passed_at.is_some_and(|p| p.elapsed() > Duration::from_secs(2)) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the in-band watermark never passed the held record (arrival {t_hold}) with 20 later records acked: in-band \
             {in_band:?}, later records acked {acked_after}; committed {committed_seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (in_band, acked_after) = {
        let seen = a.seen.lock().unwrap();
        (seen.max_watermark.unwrap(), seen.acked_arrivals.iter().filter(|t| **t > t_hold).count())
    };
    let spout = a.spout();
    eprintln!(
        "HELD: record arrival {t_hold}; in-band watermark {in_band} (+{} ms); {acked_after} later records acked by the \
         bolt, spout acked {} of {} emitted; committed readings {} (distinct {:?}), {} Err readings",
        in_band as i64 - t_hold,
        spout.acked,
        spout.emitted,
        committed_seen.len(),
        committed_seen.iter().collect::<std::collections::BTreeSet<_>>(),
        reasons.len()
    );
    assert!(
        committed_seen.iter().all(|w| *w <= t_hold),
        "the committed watermark passed the held, unacked record (arrival {t_hold}): {committed_seen:?}"
    );
    assert_eq!(
        committed_seen.last(),
        Some(&t_hold),
        "once everything older is acked, the held record's arrival is the committed watermark: {committed_seen:?} \
         (Err readings: {reasons:?})"
    );
    assert_eq!(spout.failed, 0, "nothing failed or timed out: the held record is simply unacked");

    // Release it: the committed watermark passes it.
    a.release.store(true, Ordering::SeqCst);
    let released = Instant::now();
    let after = wait_for("the committed watermark to pass the released record", Duration::from_secs(10), async || {
        store.committed_watermark().await.unwrap().ok().filter(|w| *w > t_hold)
    })
    .await;
    eprintln!("RELEASED: committed watermark {after} (+{} ms) {:?} after the ack", after - t_hold, released.elapsed());

    // Phase 2: a second worker joins.
    let g1 = store.read_assignment().await.unwrap().unwrap().value.generation;
    let task_a = a.task();
    let b = Worker::start(&topology, &cfg);
    let joined = Instant::now();
    let mut errs_after_join: Vec<String> = Vec::new();
    let (g2, w2) = loop {
        let before = store.read_assignment().await.unwrap().unwrap().value;
        let r = store.committed_watermark().await.unwrap();
        let after = store.read_assignment().await.unwrap().unwrap().value;
        match r {
            Err(why) if after.generation > g1 => errs_after_join.push(why),
            Ok(w) if before.generation > g1 && before.generation == after.generation && after.tasks.len() == 2 => {
                break (after.generation, w);
            }
            _ => {}
        }
        assert!(
            joined.elapsed() < Duration::from_secs(40),
            "no committed watermark for the assignment with both workers: assignment {after:?}, errors since the join \
             {errs_after_join:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    let task_b = b.task();
    let assignment = store.read_assignment().await.unwrap().unwrap().value;
    eprintln!(
        "JOINED: generation {g1} -> {g2} ({assignment:?}); committed watermark {w2} after {:?}; {} Err readings since the \
         join, first {:?}",
        joined.elapsed(),
        errs_after_join.len(),
        errs_after_join.first()
    );
    assert!(
        !errs_after_join.is_empty(),
        "the new generation had a committed watermark before every task reported for it"
    );
    assert!(
        errs_after_join.iter().any(|e| e.contains(&format!("task {task_b} ")) && e.contains("generation")),
        "an Err names the new task ({task_b}) and the generation: {errs_after_join:?}"
    );
    assert!(w2 > t_hold, "still past the released record: {w2} vs {t_hold}");

    // The reports: ephemeral znodes named by the task nodes, of the current generation.
    let zk = support::zk_client().await;
    let dir = format!("{}/watermarks", store.paths().stream());
    for task in [&task_a, &task_b] {
        let (data, stat) = zk.get_data(&format!("{dir}/{task}")).await.unwrap();
        let report: WatermarkReport = serde_json::from_slice(&data).unwrap();
        assert!(stat.ephemeral_owner != 0, "{task}'s report is ephemeral");
        assert!(report.generation >= g2 && report.watermark_ms.is_some(), "{task}: {report:?}");
    }

    // A deactivated task unregisters and removes its report; the committed watermark comes back
    // for the next generation (worker a alone).
    b.running.deactivate().await.unwrap();
    wait_for("b's report to be removed", Duration::from_secs(15), async || {
        zk.check_stat(&format!("{dir}/{task_b}")).await.unwrap().is_none().then_some(())
    })
    .await;
    let w3 = wait_for("a committed watermark with worker a alone", Duration::from_secs(30), async || {
        let a_only = store.read_assignment().await.unwrap().is_some_and(|v| v.value.tasks.len() == 1);
        store.committed_watermark().await.unwrap().ok().filter(|_| a_only)
    })
    .await;
    assert!(w3 >= t_hold, "{w3}");
    eprintln!("DEACTIVATED: b's report removed; committed watermark {w3} with a alone");

    stop.store(true, Ordering::SeqCst);
    producer.await.unwrap();
    b.running.kill(Duration::from_secs(5)).await.unwrap();
    a.running.kill(Duration::from_secs(5)).await.unwrap();
    store.close_gracefully().await;
    support::zk_delete_tree(&zk, &root).await;
    s.delete().await;
}
