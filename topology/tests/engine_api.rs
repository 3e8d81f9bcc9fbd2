//! The engine's contract at its edges: typed tuples, bounded spouts, timers, `execute_batch`,
//! held inputs that are dropped, hooks that emit a lot, panics in every hook, cooperative
//! scheduling, watermarks at max pending, equal keys of two integer types.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use serde::{Deserialize, Serialize};
use squall_topology::*;

const SECS: Duration = Duration::from_secs(20);

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Sentence {
    id: u64,
    text: String,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Word<'a> {
    word: &'a str,
    sentence: u64,
}

/// Emits `n` typed sentences, tracked, then ends its stream.
struct Sentences {
    next: u64,
    n: u64,
    acked: Arc<AtomicU64>,
}

impl Spout for Sentences {
    type MsgId = u64;
    async fn next_tuple(&mut self, out: &mut SpoutOutput<u64>) -> Result<(), ComponentError> {
        if self.next == self.n {
            out.finish();
            return Ok(());
        }
        out.emit_tracked(&Sentence { id: self.next, text: format!("a b{} c", self.next) }, self.next)?;
        self.next += 1;
        Ok(())
    }
    async fn ack(&mut self, _id: u64) {
        self.acked.fetch_add(1, Ordering::Relaxed);
    }
}

struct Split;

impl Bolt for Split {
    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let s: Sentence = t.decode()?;
        for w in s.text.split(' ') {
            out.emit(&Word { word: w, sentence: s.id })?;
        }
        Ok(())
    }
}

type Counts = Arc<Mutex<HashMap<String, u64>>>;

struct CountWords(Counts, Arc<AtomicUsize>);

impl Bolt for CountWords {
    async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        let w: Word<'_> = t.decode()?; // borrows the word from the tuple
        *self.0.lock().unwrap().entry(w.word.to_owned()).or_default() += 1;
        Ok(())
    }
    async fn on_drain(&mut self, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.1.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Typed records go in and out of tuples, fields declared from the types; a spout that finishes
/// its stream ends the topology without a drain command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_records_flow_and_a_bounded_spout_ends_the_topology() {
    let counts: Counts = Default::default();
    let drained = Arc::new(AtomicUsize::new(0));
    let acked = Arc::new(AtomicU64::new(0));
    let mut b = TopologyBuilder::new("typed");
    let a = acked.clone();
    let spout = b
        .set_spout("sentences", 2, move |_| Sentences { next: 0, n: 50, acked: a.clone() })
        .fields_of::<Sentence>()
        .id();
    let split = b.set_bolt("split", 2, |_| Split).shuffle_grouping(&spout).fields_of::<Word<'static>>().id();
    let (c, d) = (counts.clone(), drained.clone());
    b.set_bolt("count", 3, move |_| CountWords(c.clone(), d.clone())).fields_grouping(&split, &["word"]);
    let running = run_local(b.build().unwrap(), TopologyConfig::default()).unwrap();
    tokio::time::timeout(SECS, running.wait()).await.expect("the topology ends by itself").unwrap();
    assert_eq!(acked.load(Ordering::Relaxed), 100, "2 tasks x 50 sentences, all acked");
    let counts = counts.lock().unwrap();
    assert_eq!(counts["a"], 100);
    assert_eq!(counts["c"], 100);
    assert_eq!(counts["b7"], 2);
    assert_eq!(drained.load(Ordering::Relaxed), 3, "every count task ran on_drain once");
    let m = running.metrics();
    assert_eq!(m.component("count").unwrap().executed, 300);
    assert_eq!(m.component("split").unwrap().errors, 0);
}

#[test]
fn a_type_without_named_fields_is_a_build_error() {
    #[derive(Deserialize)]
    struct Pair(#[allow(dead_code)] u64, #[allow(dead_code)] u64);
    let mut b = TopologyBuilder::new("t");
    b.set_spout("s", 1, |_| Sentences { next: 0, n: 0, acked: Default::default() }).fields_of::<Pair>();
    let e = b.build().unwrap_err();
    assert!(matches!(e, BuildError::Typed { .. }), "{e}");
    assert!(e.to_string().contains("`s`") && e.to_string().contains("Pair"), "{e}");
}

/// Holds its input, then drops the handle on the first attempt of each id.
struct DropsHandles {
    attempts: Arc<Mutex<HashMap<u64, u32>>>,
}

impl Bolt for DropsHandles {
    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let id = t.get_u64("id")?;
        let attempt = {
            let mut a = self.attempts.lock().unwrap();
            let n = a.entry(id).or_default();
            *n += 1;
            *n
        };
        let held = out.defer_ack()?;
        if attempt == 1 {
            drop(held); // e.g. the code holding it panicked or forgot it
        } else {
            out.ack(held);
        }
        Ok(())
    }
}

/// A dropped handle fails its input at once: it is replayed long before the message timeout,
/// not leaked until it times out (or forever, with acking of the tree blocked).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_dropped_handle_fails_its_input_at_once() {
    let log = Arc::new(Mutex::new(SpoutLog::default()));
    let l = log.clone();
    let mut b = TopologyBuilder::new("drops");
    b.set_spout("spout", 1, move |_| ReplaySpout::new(0..20, l.clone())).fields(&["id"]);
    let attempts = Arc::new(Mutex::new(HashMap::new()));
    b.set_bolt("hold", 2, move |_| DropsHandles { attempts: attempts.clone() }).shuffle_grouping("spout");
    let cfg = TopologyConfig { message_timeout_ms: 60_000, ..Default::default() };
    let running = run_local(b.build().unwrap(), cfg).unwrap();
    let start = tokio::time::Instant::now();
    assert!(wait_until(SECS, || log.lock().unwrap().acked.len() == 20).await);
    assert!(start.elapsed() < Duration::from_secs(1), "replayed after {:?}", start.elapsed());
    let m = metrics_when(&running, SECS, |m| m.component("spout").unwrap().failed == 20).await;
    let m = m.component("spout").cloned().unwrap();
    assert_eq!((m.failed, m.timed_out), (20, 0), "each id failed once by the dropped handle, none timed out");
    running.cancel().await.unwrap();
    assert!(log.lock().unwrap().violations.is_empty());
}

/// Acks its held input, then tries to emit anchored to it.
struct EmitsAfterAck(Arc<Mutex<Vec<EmitError>>>);

impl Bolt for EmitsAfterAck {
    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let h = out.defer_ack()?;
        out.emit(values![t.get_u64("id")?])?; // anchored: fine
        let id = h.id();
        out.ack(h);
        match out.emit(values![0u64]) {
            Err(e) => {
                assert_eq!(e, EmitError::AnchorCompleted { handle: id });
                self.0.lock().unwrap().push(e);
            }
            Ok(()) => panic!("an emit anchored to an acked input must not go out unanchored"),
        }
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_emit_anchored_to_an_acked_input_is_an_error() {
    let log = Arc::new(Mutex::new(SpoutLog::default()));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let (l, e) = (log.clone(), errors.clone());
    let mut b = TopologyBuilder::new("after-ack");
    b.set_spout("spout", 1, move |_| ReplaySpout::new(0..10, l.clone())).fields(&["id"]);
    b.set_bolt("b", 1, move |_| EmitsAfterAck(e.clone())).shuffle_grouping("spout").fields(&["id"]);
    let seen = Arc::new(AtomicU64::new(0));
    let s = seen.clone();
    b.set_bolt("sink", 1, move |_| Sink(s.clone())).shuffle_grouping("b");
    let running = run_local(b.build().unwrap(), TopologyConfig::default()).unwrap();
    assert!(wait_until(SECS, || log.lock().unwrap().acked.len() == 10).await);
    assert_eq!(errors.lock().unwrap().len(), 10);
    assert!(errors.lock().unwrap()[0].to_string().contains("emit_unanchored"));
    assert_eq!(seen.load(Ordering::Relaxed), 10, "only the anchored emits went out");
    running.cancel().await.unwrap();
}

struct Sink(Arc<AtomicU64>);

impl Bolt for Sink {
    async fn execute(&mut self, _t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Emits forever, untracked, on a stream nobody subscribes to: it never has to wait.
struct Busy;

impl Spout for Busy {
    type MsgId = ();
    async fn next_tuple(&mut self, out: &mut SpoutOutput<()>) -> Result<(), ComponentError> {
        out.emit([1u64])?;
        Ok(())
    }
}

/// On a current-thread runtime, a spout that never waits must still let other tasks run.
#[test]
fn a_spout_that_never_waits_yields_to_the_runtime() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let mut b = TopologyBuilder::new("busy");
            b.set_spout("busy", 1, |_| Busy).fields(&["n"]);
            let running = run_local(b.build().unwrap(), TopologyConfig::default()).unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            let emitted = running.metrics().component("busy").unwrap().emitted;
            running.cancel().await.unwrap();
            let _ = tx.send(emitted);
        });
    });
    let emitted = rx.recv_timeout(SECS).expect("the test's own task never ran: the spout starves the runtime");
    assert!(emitted > 0);
}

/// Emits `n` untracked tuples in `on_drain` (a whole state written out at once).
struct DumpsOnDrain(u64);

impl Bolt for DumpsOnDrain {
    async fn execute(&mut self, _t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        Ok(())
    }
    async fn on_drain(&mut self, out: &mut BoltOutput) -> Result<(), ComponentError> {
        for i in 0..self.0 {
            out.emit(values![i])?;
        }
        Ok(())
    }
}

/// A spout whose `drain` hook emits `n` tuples.
struct DrainSpout(u64);

impl Spout for DrainSpout {
    type MsgId = ();
    async fn next_tuple(&mut self, _out: &mut SpoutOutput<()>) -> Result<(), ComponentError> {
        Ok(())
    }
    async fn drain(&mut self, out: &mut SpoutOutput<()>) -> Result<(), ComponentError> {
        for i in 0..self.0 {
            out.emit(values![i])?;
        }
        Ok(())
    }
}

/// Records the size of every batch it receives (`execute_batch` sees one channel message).
struct BatchSizes(Arc<Mutex<Vec<usize>>>);

impl Bolt for BatchSizes {
    async fn execute(&mut self, _t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        Ok(())
    }
    async fn execute_batch(&mut self, inputs: &mut Inputs, out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.0.lock().unwrap().push(inputs.len());
        while inputs.next(out).await.is_some() {}
        Ok(())
    }
}

/// Output of `on_drain` and `Spout::drain` travels in batches of at most `batch_size`, not as
/// one unbounded message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hook_output_is_sent_in_bounded_batches() {
    let sizes = Arc::new(Mutex::new(Vec::new()));
    let mut b = TopologyBuilder::new("dump");
    b.set_spout("s", 1, |_| DrainSpout(5_000)).fields(&["n"]);
    b.set_bolt("dump", 1, |_| DumpsOnDrain(10_000)).shuffle_grouping("s").fields(&["n"]);
    let s = sizes.clone();
    b.set_bolt("sizes", 1, move |_| BatchSizes(s.clone())).shuffle_grouping("dump");
    let cfg = TopologyConfig { batch_size: 64, channel_capacity: 4, ..Default::default() };
    let running = run_local(b.build().unwrap(), cfg).unwrap();
    running.drain().await.unwrap();
    tokio::time::timeout(SECS, running.wait()).await.unwrap().unwrap();
    let sizes = sizes.lock().unwrap();
    assert_eq!(sizes.iter().sum::<usize>(), 10_000);
    assert!(sizes.iter().all(|&n| n <= 64), "largest batch {}", sizes.iter().max().unwrap());
    assert_eq!(running.metrics().component("dump").unwrap().executed, 5_000);
}

/// Panics in `ack` (for even ids) and `fail`; replays failed ids.
struct PanickySpout {
    inner: ReplaySpout,
}

impl Spout for PanickySpout {
    type MsgId = u64;
    async fn next_tuple(&mut self, out: &mut SpoutOutput<u64>) -> Result<(), ComponentError> {
        self.inner.next_tuple(out).await
    }
    async fn ack(&mut self, id: u64) {
        self.inner.ack(id).await;
        if id % 2 == 0 {
            panic!("injected panic in ack of {id}");
        }
    }
    async fn fail(&mut self, id: u64) {
        self.inner.fail(id).await;
        panic!("injected panic in fail of {id}");
    }
    async fn close(&mut self) {
        panic!("injected panic in close");
    }
}

/// Fails id 3 once; panics in cleanup.
struct PanickyBolt(Arc<AtomicUsize>);

impl Bolt for PanickyBolt {
    async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        if t.get_u64("id")? == 3 && self.0.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(ComponentError::retryable("injected failure"));
        }
        Ok(())
    }
    async fn cleanup(&mut self) {
        panic!("injected panic in cleanup");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panics_in_ack_fail_close_and_cleanup_are_isolated() {
    quiet_injected_panics();
    let log = Arc::new(Mutex::new(SpoutLog::default()));
    let l = log.clone();
    let mut b = TopologyBuilder::new("panicky");
    b.set_spout("spout", 1, move |_| PanickySpout { inner: ReplaySpout::new(0..20, l.clone()) }).fields(&["id"]);
    let once = Arc::new(AtomicUsize::new(0));
    b.set_bolt("b", 2, move |_| PanickyBolt(once.clone())).shuffle_grouping("spout");
    let running = run_local(b.build().unwrap(), TopologyConfig::default()).unwrap();
    assert!(wait_until(SECS, || log.lock().unwrap().acked.len() == 20).await, "every id acked despite the panics");
    running.drain().await.unwrap();
    tokio::time::timeout(SECS, running.wait()).await.unwrap().expect("no task failed");
    let m = running.metrics();
    // 10 panics in ack, 1 in fail, 1 in close
    assert_eq!(m.component("spout").unwrap().errors, 12);
    // 1 returned error, 2 panics in cleanup
    assert_eq!(m.component("b").unwrap().errors, 3);
    assert_eq!(log.lock().unwrap().failed, vec![3]);
}

/// Holds each input until a wake-up scheduled 250 ms later acks it; counts ticks.
struct Delayed {
    held: HashMap<u64, AckHandle>,
    ticks: Arc<AtomicU64>,
}

impl Bolt for Delayed {
    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let id = t.get_u64("id")?;
        self.held.insert(id, out.defer_ack()?);
        out.schedule_after(Duration::from_millis(250), id);
        Ok(())
    }
    async fn on_timer(&mut self, timer: Timer, out: &mut BoltOutput) -> Result<(), ComponentError> {
        match timer {
            Timer::Tick => {
                self.ticks.fetch_add(1, Ordering::Relaxed);
            }
            Timer::Wakeup(id) => {
                let h = self.held.remove(&id).expect("held");
                out.emit_anchored(&[&h], "default", values![id])?;
                out.ack(h);
            }
        }
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn ticks_and_scheduled_wakeups_can_emit_and_ack() {
    let log = Arc::new(Mutex::new(SpoutLog::default()));
    let ticks = Arc::new(AtomicU64::new(0));
    let l = log.clone();
    let t = ticks.clone();
    let mut b = TopologyBuilder::new("timers");
    b.set_spout("spout", 1, move |_| ReplaySpout::new(0..5, l.clone())).fields(&["id"]);
    b.set_bolt("delay", 1, move |_| Delayed { held: HashMap::new(), ticks: t.clone() })
        .shuffle_grouping("spout")
        .fields(&["id"])
        .config(ComponentConfig::default().with_tick(Duration::from_millis(100)));
    let out = Arc::new(AtomicU64::new(0));
    let o = out.clone();
    b.set_bolt("sink", 1, move |_| Sink(o.clone())).shuffle_grouping("delay");
    let running = run_local(b.build().unwrap(), TopologyConfig::default()).unwrap();
    let start = tokio::time::Instant::now();
    assert!(wait_until(SECS, || log.lock().unwrap().acked.len() == 5).await);
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(250) && took < Duration::from_millis(400), "acked after {took:?}");
    assert_eq!(out.load(Ordering::Relaxed), 5, "emits from the wake-up reach the sink");
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let n = ticks.load(Ordering::Relaxed);
    assert!((11..=14).contains(&n), "{n} ticks in ~1.3 s at 100 ms");
    running.cancel().await.unwrap();
}

/// Works on whole batches; fails id 5 on its first attempt with `fail_current`.
struct BatchBolt {
    failed_once: bool,
    batches: Arc<AtomicU64>,
}

impl Bolt for BatchBolt {
    async fn execute(&mut self, _t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        unreachable!("execute_batch takes every input")
    }
    async fn execute_batch(&mut self, inputs: &mut Inputs, out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.batches.fetch_add(1, Ordering::Relaxed);
        while let Some(t) = inputs.next(out).await {
            let id = t.get_u64("id")?;
            if id == 5 && !self.failed_once {
                self.failed_once = true;
                inputs.fail_current(out, &ComponentError::retryable("injected"));
                continue;
            }
            out.emit(values![id])?;
        }
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn execute_batch_acks_and_fails_per_input() {
    let log = Arc::new(Mutex::new(SpoutLog::default()));
    let l = log.clone();
    let batches = Arc::new(AtomicU64::new(0));
    let bt = batches.clone();
    let mut b = TopologyBuilder::new("batches");
    b.set_spout("spout", 1, move |_| {
        let mut s = ReplaySpout::new(0..200, l.clone());
        s.per_call = 50;
        s
    })
    .fields(&["id"]);
    b.set_bolt("batch", 1, move |_| BatchBolt { failed_once: false, batches: bt.clone() })
        .shuffle_grouping("spout")
        .fields(&["id"]);
    let out = Arc::new(AtomicU64::new(0));
    let o = out.clone();
    b.set_bolt("sink", 1, move |_| Sink(o.clone())).shuffle_grouping("batch");
    let running = run_local(b.build().unwrap(), TopologyConfig::default()).unwrap();
    assert!(wait_until(SECS, || log.lock().unwrap().acked.len() == 200).await);
    {
        let log = log.lock().unwrap();
        assert_eq!(log.failed, vec![5]);
        assert!(log.violations.is_empty());
    }
    assert_eq!(out.load(Ordering::Relaxed), 200);
    let m = metrics_when(&running, SECS, |m| {
        let c = m.component("batch").unwrap();
        (c.executed, c.acked, c.failed) == (201, 200, 1)
    })
    .await;
    let m = m.component("batch").cloned().unwrap();
    assert_eq!((m.executed, m.acked, m.failed, m.errors), (201, 200, 1, 1));
    assert!(batches.load(Ordering::Relaxed) < 201, "inputs arrive in batches");
    running.cancel().await.unwrap();
}

/// Event time = id; the spout's watermark is the last id emitted (in-flight tuples do not hold
/// it back: they travel ahead of it in band).
struct Timed {
    next: u64,
    n: u64,
}

impl Spout for Timed {
    type MsgId = u64;
    async fn next_tuple(&mut self, out: &mut SpoutOutput<u64>) -> Result<(), ComponentError> {
        if self.next < self.n {
            out.emit_tracked(values![self.next], self.next)?;
            self.next += 1;
        }
        Ok(())
    }
    fn low_watermark(&mut self) -> Option<u64> {
        Some(self.next)
    }
}

/// Holds every input until the watermark passes its time (what a window acking on fire does).
#[derive(Default)]
struct HoldsUntilWatermark(Vec<(u64, AckHandle)>);

impl Bolt for HoldsUntilWatermark {
    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let ts = t.get_u64("ts")?;
        self.0.push((ts, out.defer_ack()?));
        Ok(())
    }
    async fn on_watermark(&mut self, wm: Watermark, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let (done, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.0).into_iter().partition(|(ts, _)| *ts < wm.0);
        self.0 = keep;
        for (_, h) in done {
            out.ack(h);
        }
        Ok(())
    }
}

/// A spout at `max_spout_pending`, every tuple held downstream until the watermark passes it:
/// the watermark still flows, so nothing waits for the message timeout.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn watermarks_flow_while_the_spout_is_at_max_pending() {
    let mut b = TopologyBuilder::new("wm");
    b.set_spout("spout", 1, |_| Timed { next: 0, n: 500 }).fields(&["ts"]);
    b.set_bolt("hold", 2, |_| HoldsUntilWatermark::default()).shuffle_grouping("spout");
    let cfg = TopologyConfig { max_spout_pending: 10, message_timeout_ms: 60_000, ..Default::default() };
    let running = run_local(b.build().unwrap(), cfg).unwrap();
    let start = tokio::time::Instant::now();
    assert!(wait_until(SECS, || running.metrics().component("spout").unwrap().acked >= 499).await);
    assert!(start.elapsed() < Duration::from_secs(5), "took {:?}", start.elapsed());
    assert_eq!(running.metrics().component("spout").unwrap().timed_out, 0);
    running.cancel().await.unwrap();
}

/// Emits each key once as `Int` and once as `UInt`.
struct TwoTypes(u64);

impl Spout for TwoTypes {
    type MsgId = ();
    async fn next_tuple(&mut self, out: &mut SpoutOutput<()>) -> Result<(), ComponentError> {
        if self.0 < 200 {
            let k = self.0 / 2;
            if self.0 % 2 == 0 {
                out.emit(values![k as i64])?
            } else {
                out.emit(values![k])?
            }
            self.0 += 1;
        }
        Ok(())
    }
}

type KeyTasks = Arc<Mutex<HashMap<u64, HashSet<usize>>>>;

struct WhoGets(KeyTasks, usize);

impl Bolt for WhoGets {
    async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.0.lock().unwrap().entry(t.get_u64("k")?).or_default().insert(self.1);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_keys_of_two_integer_types_reach_one_task() {
    let seen: KeyTasks = Default::default();
    let mut b = TopologyBuilder::new("keys");
    b.set_spout("s", 1, |_| TwoTypes(0)).fields(&["k"]);
    let s = seen.clone();
    b.set_bolt("g", 4, move |c| WhoGets(s.clone(), c.task_index())).fields_grouping("s", &["k"]);
    let running = run_local(b.build().unwrap(), TopologyConfig::default()).unwrap();
    assert!(wait_until(SECS, || running.metrics().component("g").unwrap().executed == 200).await);
    running.cancel().await.unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 100);
    assert!(seen.values().all(|t| t.len() == 1), "a key reached two tasks");
    let tasks: HashSet<usize> = seen.values().flatten().copied().collect();
    assert!(tasks.len() > 1, "keys spread over tasks");
}

/// Reads its own settings; the spout's own max pending overrides the topology's.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn component_config_reaches_the_task() {
    let log = Arc::new(Mutex::new(SpoutLog::default()));
    let l = log.clone();
    let mut b = TopologyBuilder::new("cfg");
    let mut cfg = ComponentConfig { max_spout_pending: Some(3), ..Default::default() };
    cfg.settings.insert("per_call".into(), serde_json::json!(5));
    b.set_spout("spout", 1, move |ctx| {
        let mut s = ReplaySpout::new(0..50, l.clone());
        s.per_call = ctx.component_config().setting::<usize>("per_call").unwrap().unwrap();
        s
    })
    .fields(&["id"])
    .config(cfg);
    b.set_bolt("hold", 1, |_| DropsHandles { attempts: Default::default() }).shuffle_grouping("spout");
    let running = run_local(b.build().unwrap(), TopologyConfig::default()).unwrap();
    assert!(wait_until(SECS, || log.lock().unwrap().acked.len() == 50).await);
    assert!(log.lock().unwrap().max_outstanding <= 3, "max outstanding {}", log.lock().unwrap().max_outstanding);
    running.cancel().await.unwrap();
}

/// Counts words and records their lengths in its own metrics.
#[derive(Default)]
struct Measured {
    words: Counter,
    lengths: Histogram,
}

impl Bolt for Measured {
    async fn prepare(&mut self, ctx: &TaskContext) -> Result<(), ComponentError> {
        self.words = ctx.counter("words");
        self.lengths = ctx.histogram("word_length");
        Ok(())
    }
    async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.words.incr();
        self.lengths.record(t.get_str("word")?.len() as u64);
        Ok(())
    }
}

/// User metrics show, summed over tasks, next to the engine's counters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_metrics_show_with_the_engine_counters() {
    let acked = Arc::new(AtomicU64::new(0));
    let mut b = TopologyBuilder::new("user-metrics");
    let a = acked.clone();
    b.set_spout("sentences", 1, move |_| Sentences { next: 0, n: 40, acked: a.clone() }).fields_of::<Sentence>();
    b.set_bolt("split", 2, |_| Split).shuffle_grouping("sentences").fields_of::<Word<'static>>();
    b.set_bolt("measure", 3, |_| Measured::default()).fields_grouping("split", &["word"]);
    let running = run_local(b.build().unwrap(), TopologyConfig::default()).unwrap();
    tokio::time::timeout(SECS, running.wait()).await.unwrap().unwrap();
    let m = running.metrics();
    let c = m.component("measure").unwrap();
    assert_eq!(c.counters["words"], 120);
    let h = &c.histograms["word_length"];
    assert_eq!(h.count, 120);
    assert_eq!(h.max, 3, "b10..b39 are the longest words");
    assert!(h.p50 >= 1 && h.p50 <= 3, "{h:?}");
    let json = serde_json::to_value(&m).unwrap();
    assert_eq!(json["components"]["measure"]["counters"]["words"], 120);
}

/// Emits on its "side" stream through the handle it was given; tries another component's
/// handle once.
struct ViaHandle {
    side: StreamId,
    foreign: StreamId,
    left: u32,
}

impl Spout for ViaHandle {
    type MsgId = ();
    async fn next_tuple(&mut self, out: &mut SpoutOutput<()>) -> Result<(), ComponentError> {
        if self.left == 0 {
            out.finish();
            return Ok(());
        }
        self.left -= 1;
        out.emit_to(&self.side, values![u64::from(self.left)], None)?;
        let e = out.emit_to(&self.foreign, values![1u64], None).unwrap_err();
        assert!(matches!(&e, EmitError::UnknownStream { stream, .. } if stream == "other/default"), "{e}");
        Ok(())
    }
}

/// Stream handles name what components emit on and subscribe to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_handles_for_emits_and_subscriptions() {
    let got = Arc::new(AtomicU64::new(0));
    let mut b = TopologyBuilder::new("handles");
    let other = b.set_spout("other", 1, |_| Busy).fields(&["n"]).id();
    let foreign = other.stream("default");
    let side = StreamId::new("s", "side");
    let s2 = side.clone();
    let declared = b
        .set_spout("s", 1, move |_| ViaHandle { side: s2.clone(), foreign: foreign.clone(), left: 25 })
        .output("side", &["n"])
        .stream("side");
    assert_eq!(declared, side);
    let g = got.clone();
    b.set_bolt("sink", 2, move |_| Sink(g.clone())).shuffle_grouping(&side);
    let running = run_local(b.build().unwrap(), TopologyConfig::default()).unwrap();
    assert!(wait_until(SECS, || got.load(Ordering::Relaxed) == 25).await);
    assert_eq!(running.metrics().component("s").unwrap().errors, 0);
    running.cancel().await.unwrap();
}

/// Emits record `i` as `i % 3 + 1` tuples under one message id; a record whose tuples include
/// `bad` (every 5th) fails as a whole.
struct Batches {
    next: u64,
    n: u64,
    acked: Arc<Mutex<Vec<u64>>>,
    failed: Arc<Mutex<Vec<u64>>>,
}

impl Spout for Batches {
    type MsgId = u64;
    async fn next_tuple(&mut self, out: &mut SpoutOutput<u64>) -> Result<(), ComponentError> {
        if self.next == self.n {
            out.finish();
            return Ok(());
        }
        let i = self.next;
        let tuples =
            (0..i % 3 + 1).map(|k| [if i % 5 == 0 && k == i % 3 { "bad".to_string() } else { format!("{i}.{k}") }]);
        let n = out.emit_tracked_all("default", tuples, i)?;
        assert_eq!(n as u64, i % 3 + 1);
        self.next += 1;
        Ok(())
    }
    async fn ack(&mut self, id: u64) {
        self.acked.lock().unwrap().push(id);
    }
    async fn fail(&mut self, id: u64) {
        self.failed.lock().unwrap().push(id);
    }
}

struct FailBad(Arc<AtomicU64>);

impl Bolt for FailBad {
    async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        if t.get_str("part")? == "bad" {
            return Err(ComponentError::retryable("bad part"));
        }
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_tuples_under_one_message_id_are_acked_once_and_fail_together() {
    let (acked, failed) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
    let executed = Arc::new(AtomicU64::new(0));
    let mut b = TopologyBuilder::new("multi");
    let (a, f) = (acked.clone(), failed.clone());
    b.set_spout("s", 1, move |_| Batches { next: 0, n: 30, acked: a.clone(), failed: f.clone() }).fields(&["part"]);
    let e = executed.clone();
    b.set_bolt("b", 2, move |_| FailBad(e.clone())).shuffle_grouping("s");
    let running = run_local(b.build().unwrap(), TopologyConfig::default()).unwrap();
    tokio::time::timeout(SECS, running.wait()).await.expect("finishes").unwrap();
    let mut acked = acked.lock().unwrap().clone();
    let mut failed = failed.lock().unwrap().clone();
    acked.sort_unstable();
    failed.sort_unstable();
    assert_eq!(failed, (0..30).filter(|i| i % 5 == 0).collect::<Vec<_>>(), "a record with a failed part fails once");
    assert_eq!(acked, (0..30).filter(|i| i % 5 != 0).collect::<Vec<_>>(), "every other record is acked once");
    // 0+1+2+... parts: 30 records of 1, 2, 3 tuples = 60, minus the 6 bad ones
    assert_eq!(executed.load(Ordering::Relaxed), 60 - 6);
}
