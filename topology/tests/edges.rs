//! Where two engine features meet: work after an `execute_batch` loop, a custom router that
//! picks a task out of range, the spout's clock after backpressure, a handle anchored twice, a
//! tracked emit that fails, and a bolt that holds back the watermark it forwards.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use squall_topology::testing::{BoltHarness, InputId, SpoutHarness};
use squall_topology::*;

/// Sums each batch in a `for_each` loop, emits the sum after the loop, then "writes" it (the
/// write fails while `fail_writes` is set).
#[derive(Default)]
struct BatchWriter {
    fail_writes: bool,
    written: Vec<u64>,
}

impl Bolt for BatchWriter {
    async fn execute(&mut self, _t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        unreachable!("execute_batch takes every input")
    }

    async fn execute_batch(&mut self, inputs: &mut Inputs, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let mut sum = 0;
        inputs
            .for_each(out, |t, _out| {
                sum += t.get_u64("n")?;
                Ok(())
            })
            .await;
        // after the loop: belongs to every input of the batch
        out.emit([sum])?;
        tokio::task::yield_now().await; // the write, to an external store
        if self.fail_writes {
            return Err(ComponentError::retryable("injected: the write failed"));
        }
        self.written.push(sum);
        Ok(())
    }
}

/// Issue 33, point 9: the inputs of a batch stay open until `execute_batch` returns, so an
/// error after the loop fails them all, and an emit after the loop is anchored to them.
#[tokio::test]
async fn work_after_an_execute_batch_loop_is_inside_the_ack_tree() {
    let mut h = BoltHarness::new(BatchWriter::default())
        .input("numbers", "default", &["n"])
        .output("default", &["sum"])
        .prepare()
        .await
        .unwrap();
    let good = h.execute_batch([[1u64], [2], [3]]).await.unwrap();
    h.bolt_mut().unwrap().fail_writes = true;
    let bad = h.execute_batch([[4u64], [5]]).await.unwrap();
    let anchored: Vec<Vec<InputId>> = h.emitted().iter().map(|e| e.anchored_to.clone()).collect();
    assert_eq!(
        (h.acked().to_vec(), h.failed().to_vec(), anchored),
        (good.clone(), bad.clone(), vec![good, bad]),
        "(acked, failed, anchoring of the sums emitted after each loop)"
    );
    let c = h.counters();
    assert_eq!((c.executed, c.acked, c.failed, c.errors), (5, 3, 2, 1));
    assert_eq!(h.bolt().unwrap().written, [6]);
}

/// Sums its batch with `for_each`; panics in the closure on 0, panics after the loop when the
/// sum is 13.
struct PanicsAround;

impl Bolt for PanicsAround {
    async fn execute(&mut self, _t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        unreachable!("execute_batch takes every input")
    }

    async fn execute_batch(&mut self, inputs: &mut Inputs, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let mut sum = 0;
        inputs
            .for_each(out, |t, _out| {
                let n = t.get_u64("n")?;
                assert!(n != 0, "injected: a panic in the closure");
                sum += n;
                Ok(())
            })
            .await;
        assert!(sum != 13, "injected: a panic after the loop");
        out.emit([sum])?;
        Ok(())
    }
}

/// Point 9 with panics: a panic in `for_each`'s closure fails that input only and the batch
/// goes on (the sum after the loop is emitted, anchored to the others); a panic after the loop
/// fails every input of the batch.
#[tokio::test]
async fn a_panic_in_the_loop_fails_its_input_and_one_after_it_fails_the_batch() {
    quiet_injected_panics();
    let mut h = BoltHarness::new(PanicsAround)
        .input("numbers", "default", &["n"])
        .output("default", &["sum"])
        .prepare()
        .await
        .unwrap();
    let first = h.execute_batch([[1u64], [0], [2]]).await.unwrap();
    let second = h.execute_batch([[6u64], [7]]).await.unwrap();
    let sums: Vec<(u64, Vec<InputId>)> =
        h.emitted().iter().map(|e| (e.tuple().get_u64("sum").unwrap(), e.anchored_to.clone())).collect();
    assert_eq!(
        (sums, h.acked().to_vec(), h.failed().to_vec()),
        (vec![(3, vec![first[0], first[2]])], vec![first[0], first[2]], vec![first[1], second[0], second[1]]),
        "(sums emitted and their anchoring, acked, failed)"
    );
    let c = h.counters();
    assert_eq!((c.executed, c.acked, c.failed, c.errors, c.panics), (5, 2, 3, 2, 2));
}

/// A custom grouping whose router names task `target_tasks`: one past the last.
#[derive(Debug)]
struct OnePastTheLast;

struct ToTask(usize);

impl Router for ToTask {
    fn route(&mut self, _values: &[Value], targets: &mut Vec<usize>) {
        targets.push(self.0);
    }
}

impl Grouping for OnePastTheLast {
    fn name(&self) -> &'static str {
        "one-past-the-last"
    }
    fn router(&self, _fields: &Fields, ctx: RouteContext) -> Box<dyn Router> {
        Box::new(ToTask(ctx.target_tasks))
    }
}

/// What a [`OneTracked`] spout saw.
#[derive(Debug, Default)]
struct OneLog {
    emits: Vec<Result<(), EmitError>>,
    acked: Vec<u64>,
    failed: Vec<u64>,
}

/// Emits `values` once, tracked as message 7, keeping the emit's result, then ends its stream.
struct OneTracked {
    values: Values,
    done: bool,
    log: Arc<Mutex<OneLog>>,
}

impl Spout for OneTracked {
    type MsgId = u64;
    async fn next_tuple(&mut self, out: &mut SpoutOutput<u64>) -> Result<(), ComponentError> {
        if self.done {
            out.finish();
            return Ok(());
        }
        self.done = true;
        let r = out.emit_tracked(self.values.clone(), 7);
        self.log.lock().unwrap().emits.push(r);
        Ok(())
    }
    async fn ack(&mut self, id: u64) {
        self.log.lock().unwrap().acked.push(id);
    }
    async fn fail(&mut self, id: u64) {
        self.log.lock().unwrap().failed.push(id);
    }
}

struct Counts(Arc<AtomicU64>);

impl Bolt for Counts {
    async fn execute(&mut self, _t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Issue 33, point 10: a custom router that names a task the subscriber does not have is an
/// emit error naming the router's subscriber, the task and the parallelism, not a tuple dropped
/// silently and its tracked spout tuple acked without anyone seeing it.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_custom_router_that_names_a_missing_task_is_an_emit_error() {
    let log = Arc::new(Mutex::new(OneLog::default()));
    let l = log.clone();
    let mut b = TopologyBuilder::new("router-range");
    b.set_spout("spout", 1, move |_| OneTracked { values: values![1u64], done: false, log: l.clone() }).fields(&["n"]);
    let seen = Arc::new(AtomicU64::new(0));
    let s = seen.clone();
    b.set_bolt("bolt", 2, move |_| Counts(s.clone())).grouping("spout", DEFAULT_STREAM, OnePastTheLast);
    let running = run_local(b.build().unwrap(), TopologyConfig::default()).unwrap();
    tokio::time::timeout(Duration::from_secs(60), running.wait()).await.expect("the topology ends").unwrap();
    let log = log.lock().unwrap();
    let emits: Vec<String> = log.emits.iter().map(|r| format!("{r:?}")).collect();
    assert_eq!(
        (log.emits.iter().filter(|r| r.is_err()).count(), log.acked.clone(), log.failed.clone()),
        (1, vec![], vec![7]),
        "(emit errors, acked, failed); emits: {emits:?}"
    );
    let e = log.emits[0].as_ref().unwrap_err().to_string();
    for part in ["stream `default`", "`bolt`", "task 2", "2 tasks", "`one-past-the-last` grouping"] {
        assert!(e.contains(part), "{part} in: {e}");
    }
    assert_eq!(seen.load(Ordering::Relaxed), 0);
}

/// Issue 33, point 13 (second half): a tracked emit that fails (here: a wrong field count) fails
/// its message id, so a spout that goes on after the error learns of it; it is neither lost
/// nor left pending.
#[tokio::test]
async fn a_failed_tracked_emit_fails_its_message_id() {
    let log = Arc::new(Mutex::new(OneLog::default()));
    let spout = OneTracked { values: values![1u64, 2u64], done: false, log: log.clone() };
    let mut h = SpoutHarness::new(spout).output("default", &["n"]).open().await.unwrap();
    h.next_tuple().await.unwrap();
    assert_eq!(
        (log.lock().unwrap().emits.len(), h.pending(), h.acked().to_vec(), h.failed().to_vec()),
        (1, 0, vec![], vec![7]),
        "(emits, pending, acked, failed)"
    );
    assert!(matches!(log.lock().unwrap().emits[0], Err(EmitError::FieldCount { .. })));
}

/// Emits a tuple anchored twice to its held input, then acks the input.
struct AnchorsTwice;

impl Bolt for AnchorsTwice {
    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let h = out.defer_ack()?;
        out.emit_anchored(&[&h, &h], DEFAULT_STREAM, values![t.get_u64("id")?])?;
        out.ack(h);
        Ok(())
    }
}

/// Issue 33, point 13: the same handle twice in `emit_anchored` counts once; the trees complete
/// (before, one edge was left in each tree: every tuple timed out and was replayed, forever).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_same_handle_twice_in_emit_anchored_counts_once() {
    let log = Arc::new(Mutex::new(SpoutLog::default()));
    let l = log.clone();
    let mut b = TopologyBuilder::new("twice");
    b.set_spout("spout", 1, move |_| ReplaySpout::new(0..10, l.clone())).fields(&["id"]);
    b.set_bolt("twice", 1, |_| AnchorsTwice).shuffle_grouping("spout").fields(&["id"]);
    let seen = Arc::new(AtomicU64::new(0));
    let s = seen.clone();
    b.set_bolt("sink", 1, move |_| Counts(s.clone())).shuffle_grouping("twice");
    let cfg = TopologyConfig { message_timeout_ms: 5_000, ..Default::default() };
    let running = run_local(b.build().unwrap(), cfg).unwrap();
    wait_until(Duration::from_secs(60), || log.lock().unwrap().acked.len() == 10).await;
    {
        let log = log.lock().unwrap();
        assert_eq!((log.acked.len(), log.failed.len()), (10, 0), "(acked, failed) after 60 s of virtual time");
        assert!(log.violations.is_empty());
    }
    running.cancel().await.unwrap();
}

/// Takes 1 s (of tokio's clock) per input.
struct Slow;

impl Bolt for Slow {
    async fn execute(&mut self, _t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(())
    }
}

/// Issue 33, point 12: a spout burst that waited for room downstream (backpressure) gives the
/// tuples it emits after the wait deadlines from the time they are emitted, not from before the
/// wait. Here each `next_tuple` emits one batch of 8, the bolt takes 8 s per batch and its
/// channel holds one batch: a tuple waits 24 s from its emit to its ack, under the 30 s timeout.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_burst_after_backpressure_gives_fresh_deadlines() {
    let log = Arc::new(Mutex::new(SpoutLog::default()));
    let l = log.clone();
    let mut b = TopologyBuilder::new("stale-clock");
    b.set_spout("spout", 1, move |_| {
        let mut s = ReplaySpout::new(0..64, l.clone());
        s.per_call = 8;
        s
    })
    .fields(&["id"]);
    b.set_bolt("slow", 1, |_| Slow).shuffle_grouping("spout");
    let cfg = TopologyConfig {
        batch_size: 8,
        channel_capacity: 1,
        message_timeout_ms: 30_000,
        max_spout_pending: 1_000,
        ..Default::default()
    };
    let running = run_local(b.build().unwrap(), cfg).unwrap();
    assert!(wait_until(Duration::from_secs(3_600), || log.lock().unwrap().acked.len() == 64).await);
    let m = metrics_when(&running, Duration::from_secs(10), |m| m.component("spout").unwrap().acked == 64).await;
    let spout = m.component("spout").cloned().unwrap();
    assert_eq!(
        (spout.acked, spout.timed_out, log.lock().unwrap().failed.len()),
        (64, 0, 0),
        "(acked, timed out, failed)"
    );
    running.cancel().await.unwrap();
}

/// Buffers its inputs (event time `ts`) and emits them on the tick; holds the watermark it
/// forwards at the oldest buffered input with [`Bolt::watermark_hold`].
#[derive(Default)]
struct Buffers {
    buffered: Vec<(u64, AckHandle)>,
}

impl Bolt for Buffers {
    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let ts = t.get_u64("ts")?;
        self.buffered.push((ts, out.defer_ack()?));
        Ok(())
    }

    async fn on_timer(&mut self, _timer: Timer, out: &mut BoltOutput) -> Result<(), ComponentError> {
        for (ts, h) in std::mem::take(&mut self.buffered) {
            out.emit_anchored(&[&h], DEFAULT_STREAM, values![ts])?;
            out.ack(h);
        }
        Ok(())
    }

    fn watermark_hold(&self) -> Option<Watermark> {
        self.buffered.iter().map(|(ts, _)| Watermark(*ts)).min()
    }
}

/// Issue 33, point 15: a bolt that buffers holds back the watermark it forwards, so nothing it
/// emits later is behind a watermark it already sent; the watermark moves on once it emitted.
#[tokio::test]
async fn a_buffering_bolt_holds_back_the_watermark_it_forwards() {
    let mut h = BoltHarness::new(Buffers::default())
        .input("events", "default", &["ts"])
        .output("default", &["ts"])
        .prepare()
        .await
        .unwrap();
    h.execute([1_500u64]).await.unwrap();
    h.watermark(Watermark(2_000)).await.unwrap();
    let before_tick = h.watermarks_out().to_vec();
    h.tick().await.unwrap();
    let emitted: Vec<u64> = h.emitted().iter().map(|e| e.tuple().get_u64("ts").unwrap()).collect();
    assert_eq!(
        (before_tick, emitted, h.watermarks_out().to_vec()),
        (vec![Watermark(1_500)], vec![1_500], vec![Watermark(1_500), Watermark(2_000)]),
        "(watermarks forwarded before the tick, emitted event times, all watermarks forwarded)"
    );
    // no hold: the watermark goes through at once
    h.watermark(Watermark(3_000)).await.unwrap();
    assert_eq!(h.watermarks_out().last(), Some(&Watermark(3_000)));
    h.drain().await.unwrap();
    assert_eq!(h.watermarks_out().last(), Some(&Watermark::MAX));
}

/// Counts inputs; an input with `poison` set counts 1000, and merging a poisoned count into a
/// fresh accumulator (a sliding input's new window) panics.
#[derive(Clone, Debug)]
struct PoisonCount;

impl squall_topology::window::WindowAggregate for PoisonCount {
    type Acc = u64;
    fn fields(&self) -> Vec<String> {
        vec!["count".to_owned()]
    }
    fn init(&self) -> u64 {
        0
    }
    fn add(&self, acc: &mut u64, input: &Tuple) -> Result<(), ComponentError> {
        *acc += if input.get_bool("poison")? { 1_000 } else { 1 };
        Ok(())
    }
    fn merge(&self, into: &mut u64, other: &u64) {
        assert!(!(*into == 0 && *other >= 1_000), "injected: merge into a new window");
        *into += other;
    }
    fn emit(&self, acc: &u64) -> Values {
        values![*acc]
    }
}

/// Issue 33, point 14: a panic in a sliding window's `merge` leaves no window holding the input
/// the engine fails: the window merged before the panic fires its aggregate as usual, acking its
/// inputs (before, its emit was refused, its aggregate lost and its other inputs failed).
#[tokio::test]
async fn a_panic_in_a_sliding_merge_loses_no_aggregate() {
    quiet_injected_panics();
    let spec = window::SlidingWindowConfig::new(20, 10, "ts", &["user"]).build(PoisonCount).unwrap();
    let stats = spec.stats();
    let mut h = BoltHarness::new(spec.bolt())
        .input("clicks", "default", &["user", "ts", "poison"])
        .output("default", spec.output_fields())
        .output("late", spec.late_fields())
        .prepare()
        .await
        .unwrap();
    // 5 is in [-10, 10) and [0, 20); 15 in [0, 20) and [10, 30), a new window: its merge panics
    let a = h.execute(values!["al", 5i64, false]).await.unwrap();
    let b = h.execute(values!["al", 15i64, true]).await.unwrap();
    h.watermark(Watermark(20)).await.unwrap();
    let fired: Vec<(i64, i64, u64, Vec<InputId>)> = h
        .emitted()
        .iter()
        .map(|e| {
            let t = e.tuple();
            let w = (t.get_i64("window_start_ms").unwrap(), t.get_i64("window_end_ms").unwrap());
            (w.0, w.1, t.get_u64("count").unwrap(), e.anchored_to.clone())
        })
        .collect();
    assert_eq!(
        (fired, h.acked().to_vec(), h.failed().to_vec(), stats.emit_errors()),
        (vec![(-10, 10, 1, vec![a]), (0, 20, 1, vec![a])], vec![a], vec![b], 0),
        "(aggregates fired, acked, failed, emit errors)"
    );
    assert_eq!((stats.held(), h.held()), (0, vec![]));
}

/// Holds its first input; fails on its second after holding it (the engine fails it, the bolt
/// keeps its handle); on the watermark emits anchored to both.
#[derive(Default)]
struct KeepsAFailedHandle {
    held: Vec<AckHandle>,
    emit: Option<Result<(), EmitError>>,
}

impl Bolt for KeepsAFailedHandle {
    async fn execute(&mut self, _t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.held.push(out.defer_ack()?);
        if self.held.len() == 2 {
            return Err(ComponentError::retryable("injected: fails after holding its input"));
        }
        Ok(())
    }

    async fn on_watermark(&mut self, _wm: Watermark, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let refs: Vec<&AckHandle> = self.held.iter().collect();
        self.emit = Some(out.emit_anchored(&refs, DEFAULT_STREAM, values![1u64]));
        for h in self.held.drain(..) {
            out.ack(h);
        }
        Ok(())
    }
}

/// Point 14: an emit anchored to held inputs skips the ones the engine already completed (an
/// input failed because `execute` returned an error after holding it) and is anchored to the
/// others, instead of refusing the whole emit.
#[tokio::test]
async fn an_emit_skips_anchors_the_engine_completed() {
    let mut h = BoltHarness::new(KeepsAFailedHandle::default())
        .input("numbers", "default", &["n"])
        .output("default", &["n"])
        .prepare()
        .await
        .unwrap();
    let first = h.execute([1u64]).await.unwrap();
    let second = h.execute([2u64]).await.unwrap();
    h.watermark(Watermark(10)).await.unwrap();
    let emit = format!("{:?}", h.bolt().unwrap().emit);
    let anchored: Vec<Vec<InputId>> = h.emitted().iter().map(|e| e.anchored_to.clone()).collect();
    assert_eq!(
        (emit.as_str(), anchored, h.acked().to_vec(), h.failed().to_vec()),
        ("Some(Ok(()))", vec![vec![first]], vec![first], vec![second]),
        "(emit_anchored said, anchoring, acked, failed)"
    );
}

/// Reads from an outside source inside `next_tuple` (as the window firer reads DynamoDB): each
/// call waits `wait` for its read, then emits `per_call` tracked tuples.
struct AwaitingSpout {
    next: u64,
    total: u64,
    per_call: u64,
    wait: Duration,
    log: Arc<Mutex<SpoutLog>>,
}

impl Spout for AwaitingSpout {
    type MsgId = u64;

    async fn next_tuple(&mut self, out: &mut SpoutOutput<u64>) -> Result<(), ComponentError> {
        if self.next >= self.total {
            return Ok(());
        }
        tokio::time::sleep(self.wait).await;
        for _ in 0..self.per_call {
            out.emit_tracked([self.next], self.next)?;
            self.next += 1;
        }
        Ok(())
    }

    async fn ack(&mut self, id: u64) {
        self.log.lock().unwrap().acked.push(id);
    }

    async fn fail(&mut self, id: u64) {
        self.log.lock().unwrap().failed.push(id);
    }
}

/// A tuple's timeout counts from its emission, also when the spout's `next_tuple` waited for an
/// outside read before emitting it (the window firer's DynamoDB reads and writes before its
/// firings): here each call waits 8 s, then emits 4 tuples the bolt takes 1 s each to process,
/// so the last acks 4 s after its emit, under the 10 s timeout. Before, the deadline counted
/// from before the call, 8 s of it gone: tuples timed out (and were replayed) while their trees
/// completed in time.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_spout_that_waits_inside_next_tuple_gives_deadlines_from_its_emits() {
    let log = Arc::new(Mutex::new(SpoutLog::default()));
    let l = log.clone();
    let mut b = TopologyBuilder::new("awaiting-spout");
    b.set_spout("spout", 1, move |_| AwaitingSpout {
        next: 0,
        total: 16,
        per_call: 4,
        wait: Duration::from_secs(8),
        log: l.clone(),
    })
    .fields(&["id"]);
    b.set_bolt("slow", 1, |_| Slow).shuffle_grouping("spout");
    let cfg = TopologyConfig { message_timeout_ms: 10_000, max_spout_pending: 1_000, ..Default::default() };
    let running = run_local(b.build().unwrap(), cfg).unwrap();
    assert!(
        wait_until(Duration::from_secs(3_600), || {
            let l = log.lock().unwrap();
            l.acked.len() + l.failed.len() >= 16
        })
        .await
    );
    let m = metrics_when(&running, Duration::from_secs(10), |m| {
        let s = m.component("spout").unwrap();
        s.acked + s.failed >= 16
    })
    .await;
    let spout = m.component("spout").cloned().unwrap();
    assert_eq!(
        (spout.acked, spout.timed_out, log.lock().unwrap().failed.len()),
        (16, 0, 0),
        "(acked, timed out, failed)"
    );
    running.cancel().await.unwrap();
}
