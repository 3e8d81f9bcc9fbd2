//! A window that holds its inputs until it fires (`AckMode::OnFire`, the default) over the
//! Kinesis spout, with a small `max_spout_pending`, against the real kinesis-local and ZooKeeper.
//!
//! Every input of an open window keeps its spout tuple pending; the window fires only when the
//! spout's watermark passes its end, and acks its inputs only then. This deadlocked until the
//! message timeout, for two reasons, both fixed:
//! - (b) the spout's watermark counted records in flight, so the held inputs held it below the
//!   window's end (now only queued and replay-pending records hold it). Any rate shows it:
//!   [`records_put_while_running_are_counted_in_windows_that_fire`].
//! - (a) the spout sent watermarks only from `next_tuple`, which the engine stops calling at
//!   `max_spout_pending` (now also from `Spout::low_watermark`, which the engine polls while it
//!   does not call `next_tuple`). Bursts show it: a burst of exactly `MAX_PENDING` records, put
//!   in the middle of a window, fills the spout's pending tuples, all held by that window; with
//!   nothing queued behind them, only a watermark sent at max pending (once the shard is idle)
//!   fires it: [`bursts_at_max_pending_are_counted_in_windows_that_fire`].
//!
//! A window holding more inputs than `max_spout_pending` can never fire (its later records stay
//! queued, and queued records must hold the watermark; see the window module's docs), so records
//! are put at no more than `MAX_PENDING` per window, spanning several windows, while the topology
//! runs. The message timeout is 60 s, longer than the tests wait: a pass cannot come from
//! timeouts.

use squall_test_support as support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use squall::spout::{KinesisSpout, SpoutRegistry, WorkerIdentity};
use squall::topology::window::{AckMode, Count, TumblingWindowConfig};
use squall::topology::{Bolt, BoltOutput, ComponentError, TopologyBuilder, TopologyConfig, Tuple};
use support::TestStream;

const WINDOW_MS: u64 = 1000;
const MAX_PENDING: usize = 20;

#[derive(Debug, Default)]
struct Seen {
    /// (window start, count) of every fired window tuple.
    fired: Vec<(i64, u64)>,
    /// When the last window tuple arrived.
    last_fired_at: Option<Instant>,
    late: u64,
}

/// Collects the window tuples and the late ones.
struct Collect(Arc<Mutex<Seen>>);

impl Bolt for Collect {
    async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        let mut seen = self.0.lock().unwrap();
        if t.stream() == "late" {
            seen.late += 1;
        } else {
            seen.fired.push((t.get_i64("window_start_ms")?, t.get_u64("count")?));
            seen.last_fired_at = Some(Instant::now());
        }
        Ok(())
    }
}

/// How records are put.
#[derive(Debug, Clone, Copy)]
enum Puts {
    /// `batches` PutRecords calls of `per_batch` records (over three keys), `every` apart; with
    /// `mid_window`, each call waits until the clock is in the middle of a window, so that the
    /// records of one call (arrival times a few ms apart) fall in one window.
    Paced { batches: usize, per_batch: usize, every: Duration, mid_window: bool },
}

/// Puts the records; returns how many, and when the last was put.
async fn put(s: &TestStream, puts: Puts) -> (usize, Instant) {
    let Puts::Paced { batches, per_batch, every, mid_window } = puts;
    let started = Instant::now();
    for b in 0..batches {
        if b > 0 {
            tokio::time::sleep(every).await;
        }
        if mid_window {
            let phase = squall::coord::now_ms().rem_euclid(WINDOW_MS as i64) as u64;
            if !(WINDOW_MS / 4..WINDOW_MS / 2).contains(&phase) {
                tokio::time::sleep(Duration::from_millis((WINDOW_MS + WINDOW_MS / 4 - phase) % WINDOW_MS)).await;
            }
        }
        let entries = (0..per_batch)
            .map(|i| {
                PutRecordsRequestEntry::builder()
                    .partition_key(format!("key-{}", i % 3))
                    .data(Blob::new(format!("record-{b}-{i}")))
                    .build()
                    .unwrap()
            })
            .collect::<Vec<_>>();
        let out = s
            .client
            .put_records()
            .stream_name(&s.name)
            .set_records(Some(entries))
            .send()
            .await
            .unwrap_or_else(|e| panic!("put batch {b}: {}", aws_sdk_kinesis::error::DisplayErrorContext(e)));
        assert_eq!(out.failed_record_count(), Some(0), "put batch {b}");
    }
    let last_put = Instant::now();
    let records = batches * per_batch;
    eprintln!("put {records} records in {batches} batches in {:?}", last_put - started);
    (records, last_put)
}

/// Runs spout -> window (on fire) -> collector, puts the records while it runs, and checks that
/// every record is counted in a fired window and acked, with nothing timed out. `idle_ms`: the
/// spout's `watermark_idle_timeout_ms` (what fires the last window).
async fn run(what: &str, puts: Puts, idle_ms: u64) {
    squall::logging::init();
    let s = TestStream::create("onfire", 1).await;
    // "backlog": every record is in the shard before the topology starts (read from
    // TRIM_HORIZON); else they are put while it runs
    let backlog = if what == "backlog" { Some(put(&s, puts).await) } else { None };
    let root = support::unique_zk_root("onfire");
    let topology = support::unique_name("onfire");
    let mut cfg = support::spout_config(&topology, &s.name, &root);
    cfg.watermark_idle_timeout_ms = idle_ms;

    let windows = TumblingWindowConfig::new(WINDOW_MS, "arrival_ms", &["partition_key"])
        .ack(AckMode::OnFire)
        .build(Count)
        .unwrap();
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let mut b = TopologyBuilder::new(topology.clone());
    let registry = SpoutRegistry::default();
    KinesisSpout::declare_with_registry(&mut b, "kinesis", 1, cfg, WorkerIdentity::current(), registry.clone());
    let mut w = b.set_bolt("windows", 1, windows.factory());
    w.fields_grouping("kinesis", &["partition_key"]);
    windows.declare_outputs(&mut w);
    let c = seen.clone();
    b.set_bolt("collect", 1, move |_| Collect(c.clone()))
        .global_grouping("windows")
        .global_grouping_from("windows", "late");
    let tcfg =
        TopologyConfig { max_spout_pending: MAX_PENDING, message_timeout_ms: 60_000, ..TopologyConfig::default() };
    let running = squall::topology::run_local(b.build().unwrap(), tcfg).unwrap();
    let (records, last_put) = match backlog {
        Some((records, _)) => (records, Instant::now()),
        None => {
            // put once the spout reads its shard, so the records arrive while it runs
            let t0 = Instant::now();
            while !registry.tasks().iter().any(|t| t.shards().iter().any(|(_, st)| st.millis_behind_latest.is_some())) {
                assert!(t0.elapsed() < Duration::from_secs(30), "the spout never read its shard");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            put(&s, puts).await
        }
    };

    // Every record counted in a fired window, and acked at the spout, well within the timeout.
    let deadline = last_put + Duration::from_secs(30);
    let counted = |seen: &Seen| seen.fired.iter().map(|(_, n)| n).sum::<u64>();
    let mut max_pending = 0;
    loop {
        let (acked, pending) = running.metrics().component("kinesis").map_or((0, 0), |m| (m.acked, m.pending));
        max_pending = max_pending.max(pending);
        let done = counted(&seen.lock().unwrap()) >= records as u64 && acked >= records as u64;
        if done {
            break;
        }
        if Instant::now() > deadline {
            let m = running.metrics();
            let st = windows.stats();
            panic!(
                "{what}: deadlock: 30 s after the last put, {} of {records} records counted in fired windows (per window \
                 start: {:?}), spout {:?}; window stats: inputs {} fired {} held {} late {}; spout shards: {:?}",
                counted(&seen.lock().unwrap()),
                seen.lock().unwrap().fired,
                m.component("kinesis"),
                st.inputs(),
                st.fired(),
                st.held(),
                st.late(),
                registry.tasks().iter().map(|t| t.shards()).collect::<Vec<_>>(),
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let spout = running.metrics().component("kinesis").cloned().unwrap();
    let mut per_window = std::collections::BTreeMap::<i64, u64>::new();
    for (start, n) in &seen.fired {
        *per_window.entry(*start).or_default() += n;
    }
    // for the backlog, `last_put` is when the topology started
    let last_fired = seen.last_fired_at.unwrap().saturating_duration_since(last_put);
    eprintln!(
        "ON-FIRE {what}: {records} records in {} windows (records per window {:?}); spout pending up to \
         {max_pending} of {MAX_PENDING}, emitted {} acked {} failed {} timed out {}; last window fired \
         {last_fired:?} after the last put",
        per_window.len(),
        per_window.values().collect::<Vec<_>>(),
        spout.emitted,
        spout.acked,
        spout.failed,
        spout.timed_out
    );
    assert_eq!(counted(&seen), records as u64, "every record counted once in a fired window: {per_window:?}");
    assert_eq!(seen.late, 0, "nothing late: nothing failed");
    assert_eq!(spout.timed_out, 0, "no pass through timeouts");
    assert_eq!(spout.failed, 0);
    assert_eq!(spout.acked, records as u64, "the spout acked every record");
    assert_eq!(spout.emitted, records as u64);
    assert!(per_window.len() >= 4, "records span several windows: {per_window:?}");
    assert!(
        per_window.values().all(|n| *n <= MAX_PENDING as u64),
        "no more records per window than max pending (else no window can fire): {per_window:?}"
    );
    if what == "bursts" {
        assert!(
            per_window.values().all(|n| *n == MAX_PENDING as u64),
            "each burst in one window of its own: {per_window:?}"
        );
        assert_eq!(max_pending, MAX_PENDING as u64, "the spout sat at max pending");
    }
    assert_eq!(windows.stats().held(), 0, "nothing held any more");

    running.kill(Duration::from_secs(5)).await.unwrap();
    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &root).await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_put_while_running_are_counted_in_windows_that_fire() {
    // One record every 125 ms: about 8 per window, over 6 windows.
    run(
        "trickle",
        Puts::Paced { batches: 48, per_batch: 1, every: Duration::from_millis(125), mid_window: false },
        1000,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursts_at_max_pending_are_counted_in_windows_that_fire() {
    // 4 bursts of MAX_PENDING records, each put in the middle of a window, 2.6 s apart: the
    // spout emits the whole burst and sits at max pending, every tuple held by that window, and
    // nothing queued. The window fires only when the spout's watermark passes its end, which,
    // with no later record, happens once the shard has been idle for the idle timeout (1.5 s):
    // a watermark the engine can only get from `low_watermark` at max pending. (Smaller bursts,
    // one window after the other, would reach max pending only by a race: the next burst's
    // queued records move the watermark past the held window as soon as they are read.)
    let puts = Puts::Paced { batches: 4, per_batch: MAX_PENDING, every: Duration::from_millis(2600), mid_window: true };
    run("bursts", puts, 1500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_read_at_start_is_counted_not_late() {
    // About 12 records per window over 5 windows, all put before the topology starts: the
    // task's watermark stays unknown until it has taken its shard (a task that owns nothing yet
    // must not report "now minus the idle timeout", which would make the whole backlog late).
    run(
        "backlog",
        Puts::Paced { batches: 10, per_batch: 6, every: Duration::from_millis(500), mid_window: false },
        1000,
    )
    .await;
}
