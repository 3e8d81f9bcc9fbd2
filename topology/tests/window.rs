//! Event-time tumbling windows on the real engine: firing on the watermark, per-key counts, late
//! data, drain, watermark monotonicity and at-least-once replay through a window.

mod common;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::wait_until;
use squall_topology::window::{
    AckMode, Count, LatePolicy, SessionWindowConfig, SlidingWindowConfig, TumblingWindowConfig, WindowAggregate,
    WindowBolt, WindowSpec,
};
use squall_topology::*;

const SECS: Duration = Duration::from_secs(20);

fn cfg() -> TopologyConfig {
    // held inputs must not time out while a test waits for a watermark
    TopologyConfig { message_timeout_ms: 30_000, timeout_check_interval_ms: 50, ..Default::default() }
}

#[derive(Clone, Debug)]
enum Cmd {
    Event { id: u64, key: &'static str, ts: i64 },
    Wm(u64),
}

/// What the spout tasks do next (one queue per task) and what they were told.
#[derive(Debug, Default)]
struct Script {
    queues: Vec<VecDeque<Cmd>>,
    events: HashMap<u64, Cmd>,
    acked: Vec<u64>,
    failed: Vec<u64>,
}

type Shared = Arc<Mutex<Script>>;

fn script(tasks: usize) -> Shared {
    Arc::new(Mutex::new(Script { queues: vec![VecDeque::new(); tasks], ..Default::default() }))
}

fn push(s: &Shared, task: usize, cmds: impl IntoIterator<Item = Cmd>) {
    s.lock().unwrap().queues[task].extend(cmds);
}

fn ev(id: u64, key: &'static str, ts: i64) -> Cmd {
    Cmd::Event { id, key, ts }
}

/// Runs its task's queue, one command per call: a tracked event `[user, ts]` or a watermark (a
/// call that emits nothing ends the burst, so the watermark is sent before the next event).
/// Failed events are queued again (replayed).
struct ScriptSpout {
    task: usize,
    s: Shared,
}

impl Spout for ScriptSpout {
    type MsgId = u64;

    async fn open(&mut self, ctx: &TaskContext) -> Result<(), ComponentError> {
        self.task = ctx.task_index();
        Ok(())
    }

    async fn next_tuple(&mut self, out: &mut SpoutOutput<u64>) -> Result<(), ComponentError> {
        let mut s = self.s.lock().unwrap();
        match s.queues[self.task].pop_front() {
            Some(c @ Cmd::Event { id, key, ts }) => {
                s.events.insert(id, c);
                out.emit_tracked(values![key, ts], id)?;
            }
            Some(Cmd::Wm(w)) => out.watermark(w),
            None => {}
        }
        Ok(())
    }

    async fn ack(&mut self, id: u64) {
        self.s.lock().unwrap().acked.push(id);
    }

    async fn fail(&mut self, id: u64) {
        let mut s = self.s.lock().unwrap();
        s.failed.push(id);
        let c = s.events[&id].clone();
        s.queues[self.task].push_back(c);
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Rec {
    Agg { key: String, start: i64, end: i64, n: u64 },
    Late { key: String, ts: i64, start: i64, end: i64 },
    Wm(u64),
}

fn agg(key: &str, start: i64, end: i64, n: u64) -> Rec {
    Rec::Agg { key: key.into(), start, end, n }
}

fn late(key: &str, ts: i64, start: i64, end: i64) -> Rec {
    Rec::Late { key: key.into(), ts, start, end }
}

type Log = Arc<Mutex<Vec<Rec>>>;

/// Records aggregates, late tuples and watermarks in arrival order; optionally fails the first
/// aggregate of one key.
struct Sink {
    log: Log,
    fail_first_of: Option<&'static str>,
    failed: Arc<AtomicBool>,
}

impl Bolt for Sink {
    async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        let key = t.get_str("user")?.to_owned();
        let (start, end) = (t.get_i64("window_start_ms")?, t.get_i64("window_end_ms")?);
        if t.stream() == "late" {
            let ts = t.get_i64("event_ms")?;
            self.log.lock().unwrap().push(Rec::Late { key, ts, start, end });
            return Ok(());
        }
        let fail = self.fail_first_of == Some(key.as_str()) && !self.failed.swap(true, Ordering::SeqCst);
        self.log.lock().unwrap().push(Rec::Agg { key, start, end, n: t.get_u64("count")? });
        if fail {
            return Err(ComponentError::retryable("injected downstream failure"));
        }
        Ok(())
    }

    async fn on_watermark(&mut self, wm: Watermark, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.log.lock().unwrap().push(Rec::Wm(wm.millis()));
        Ok(())
    }
}

/// What the window bolt tasks saw: watermarks per task, and broken invariants.
#[derive(Debug, Default)]
struct Observed {
    watermarks: HashMap<usize, Vec<u64>>,
    violations: Vec<String>,
}

/// Wraps the window bolt: records the watermarks it is given and checks, after every hook, that
/// no open window is already closed by the watermark (it fired, and nothing reopened it).
/// With `apply_max == false` the +infinity watermark is not passed on, so `on_drain` must flush.
struct Probe<A: WindowAggregate> {
    inner: WindowBolt<A>,
    task: usize,
    obs: Arc<Mutex<Observed>>,
    apply_max: bool,
}

impl<A: WindowAggregate> Probe<A> {
    fn check(&self, hook: &str) {
        let st = self.inner.state();
        if let Some(wm) = st.watermark() {
            for w in st.windows() {
                if w.closed_by(wm) {
                    self.obs.lock().unwrap().violations.push(format!("after {hook}: {w:?} open at watermark {wm}"));
                }
            }
        }
    }
}

impl<A: WindowAggregate> Bolt for Probe<A> {
    async fn prepare(&mut self, ctx: &TaskContext) -> Result<(), ComponentError> {
        self.task = ctx.task_index();
        self.inner.prepare(ctx).await
    }

    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let r = self.inner.execute(t, out).await;
        self.check("execute");
        r
    }

    async fn on_watermark(&mut self, wm: Watermark, out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.obs.lock().unwrap().watermarks.entry(self.task).or_default().push(wm.millis());
        if wm == Watermark::MAX && !self.apply_max {
            return Ok(());
        }
        let r = self.inner.on_watermark(wm, out).await;
        self.check("on_watermark");
        r
    }

    async fn on_drain(&mut self, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let r = self.inner.on_drain(out).await;
        if self.inner.state().open_windows() != 0 {
            self.obs.lock().unwrap().violations.push("windows open after on_drain".into());
        }
        r
    }
}

struct Rig<A = Count> {
    running: RunningTopology,
    s: Shared,
    log: Log,
    obs: Arc<Mutex<Observed>>,
    win: WindowSpec<A>,
}

/// `spouts` script spout tasks -> window (`win_tasks`, fields grouping on user) -> sink.
fn start(
    spouts: usize,
    win_tasks: usize,
    wcfg: TumblingWindowConfig,
    apply_max: bool,
    fail: Option<&'static str>,
) -> Rig {
    let stream_late = wcfg.late == LatePolicy::Stream;
    start_with(spouts, win_tasks, wcfg.build(Count).unwrap(), stream_late, apply_max, fail)
}

/// [`start`] with any window spec (its aggregate must emit `count`).
fn start_with<A: WindowAggregate>(
    spouts: usize,
    win_tasks: usize,
    win: WindowSpec<A>,
    stream_late: bool,
    apply_max: bool,
    fail: Option<&'static str>,
) -> Rig<A> {
    let s = script(spouts);
    let log: Log = Arc::default();
    let obs: Arc<Mutex<Observed>> = Arc::default();
    let mut b = TopologyBuilder::new("windows");
    let s2 = s.clone();
    b.set_spout("events", spouts, move |_| ScriptSpout { task: 0, s: s2.clone() }).fields(&["user", "ts"]);
    let (w2, o2) = (win.clone(), obs.clone());
    win.declare_outputs(
        b.set_bolt("win", win_tasks, move |_| Probe { inner: w2.bolt(), task: 0, obs: o2.clone(), apply_max })
            .fields_grouping("events", &["user"]),
    );
    let l2 = log.clone();
    let failed = Arc::new(AtomicBool::new(false));
    let mut sink =
        b.set_bolt("sink", 1, move |_| Sink { log: l2.clone(), fail_first_of: fail, failed: failed.clone() });
    sink.shuffle_grouping("win");
    if stream_late {
        sink.shuffle_grouping_from("win", "late");
    }
    let running = run_local(b.build().unwrap(), cfg()).unwrap();
    Rig { running, s, log, obs, win }
}

impl<A: WindowAggregate> Rig<A> {
    fn log(&self) -> Vec<Rec> {
        self.log.lock().unwrap().clone()
    }

    fn aggs(&self) -> Vec<Rec> {
        self.log().into_iter().filter(|r| matches!(r, Rec::Agg { .. })).collect()
    }

    fn acked(&self) -> Vec<u64> {
        let mut a = self.s.lock().unwrap().acked.clone();
        a.sort_unstable();
        a
    }

    fn failed(&self) -> Vec<u64> {
        let mut f = self.s.lock().unwrap().failed.clone();
        f.sort_unstable();
        f
    }

    async fn saw_wm(&self, w: u64) -> bool {
        wait_until(SECS, || self.log.lock().unwrap().contains(&Rec::Wm(w))).await
    }

    async fn drain(self) -> (Vec<Rec>, Shared, Arc<Mutex<Observed>>, WindowSpec<A>) {
        self.running.drain().await.unwrap();
        tokio::time::timeout(SECS, self.running.wait()).await.expect("drain finishes").unwrap();
        let obs = self.obs.lock().unwrap();
        assert!(obs.violations.is_empty(), "{:?}", obs.violations);
        for (task, wms) in &obs.watermarks {
            assert!(wms.windows(2).all(|w| w[0] < w[1]), "task {task} watermarks not strictly increasing: {wms:?}");
            assert_eq!(wms.last(), Some(&u64::MAX), "task {task}: +infinity before the drain");
        }
        drop(obs);
        let log = self.log.lock().unwrap().clone();
        (log, self.s, self.obs, self.win)
    }
}

/// For a single window task: every aggregate arrives after the last watermark below its window's
/// end and before the first watermark at or above it (unless flushed by `on_drain` after a
/// +infinity watermark that did not fire it).
fn check_fire_timing(log: &[Rec]) {
    for (i, r) in log.iter().enumerate() {
        let Rec::Agg { end, .. } = r else { continue };
        let end = i128::from(*end);
        let before = log[..i].iter().rev().find_map(|r| if let Rec::Wm(w) = r { Some(*w) } else { None });
        let after = log[i + 1..].iter().find_map(|r| if let Rec::Wm(w) = r { Some(*w) } else { None });
        if let Some(w) = before {
            assert!(w == u64::MAX || i128::from(w) < end, "{r:?} should have fired at watermark {w}: {log:?}");
        }
        if let Some(w) = after {
            assert!(i128::from(w) >= end, "{r:?} fired before the watermark reached its end ({w}): {log:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_fire_when_the_watermark_reaches_their_end_and_not_before() {
    let rig = start(1, 1, TumblingWindowConfig::new(1_000, "ts", &["user"]), true, None);
    push(&rig.s, 0, [ev(0, "a", 100), ev(1, "b", 200), ev(2, "a", 999), ev(3, "a", 1_000), Cmd::Wm(999)]);
    assert!(rig.saw_wm(999).await);
    assert!(rig.aggs().is_empty(), "nothing fires at watermark 999: {:?}", rig.log());
    assert_eq!(rig.win.stats().held(), 4);
    assert!(rig.acked().is_empty(), "inputs are held until their window fires");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(rig.aggs().is_empty(), "still nothing: {:?}", rig.log());

    push(&rig.s, 0, [Cmd::Wm(1_000)]);
    assert!(rig.saw_wm(1_000).await);
    assert_eq!(rig.log(), [Rec::Wm(999), agg("a", 0, 1_000, 2), agg("b", 0, 1_000, 1), Rec::Wm(1_000)]);
    assert!(wait_until(SECS, || rig.acked() == [0, 1, 2]).await, "acked {:?}", rig.acked());
    assert_eq!(rig.win.stats().held(), 1, "a@1000 waits in [1000, 2000)");
    assert_eq!(rig.win.stats().open_panes(), 1);

    let (log, s, _, win) = rig.drain().await;
    assert_eq!(log[4..], [agg("a", 1_000, 2_000, 1), Rec::Wm(u64::MAX)]);
    check_fire_timing(&log);
    let s = s.lock().unwrap();
    assert_eq!(s.acked.len(), 4);
    assert!(s.failed.is_empty());
    assert_eq!((win.stats().fired(), win.stats().held(), win.stats().late()), (3, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_counts_over_several_windows_held_back_by_an_idle_source() {
    const KEYS: [&str; 3] = ["a", "b", "c"];
    let rig = start(2, 2, TumblingWindowConfig::new(1_000, "ts", &["user"]), true, None);
    let mut expected: HashMap<(String, i64), u64> = HashMap::new();
    let mut id = 0u64;
    for part in 0..3i64 {
        let mut cmds = Vec::new();
        for i in 0..150i64 {
            let (key, ts) = (KEYS[(i % 3) as usize], part * 2_000 + (i * 37) % 2_000);
            *expected.entry((key.to_owned(), ts.div_euclid(1_000) * 1_000)).or_default() += 1;
            cmds.push(ev(id, key, ts));
            id += 1;
        }
        cmds.push(Cmd::Wm((part as u64 + 1) * 2_000));
        push(&rig.s, 0, cmds);
    }
    // task 1 of the spout has sent nothing: the combined watermark does not exist yet
    assert!(wait_until(SECS, || rig.win.stats().inputs() == 450).await);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(rig.win.stats().fired(), 0, "the idle source holds every window back");
    assert!(rig.acked().is_empty());

    // the slow source reaches 3000: min(6000, 3000) closes [0,1000), [1000,2000), [2000,3000)
    push(&rig.s, 1, [Cmd::Wm(3_000)]);
    let closed = |end: i64| expected.keys().filter(|(_, s)| s + 1_000 <= end).count();
    assert!(wait_until(SECS, || rig.aggs().len() == closed(3_000)).await, "{:?}", rig.log());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(rig.aggs().len(), closed(3_000), "nothing past 3000 fires");
    for r in rig.aggs() {
        let Rec::Agg { end, .. } = r else { unreachable!() };
        assert!(end <= 3_000, "{r:?} fired at watermark 3000");
    }

    push(&rig.s, 1, [Cmd::Wm(10_000)]);
    assert!(wait_until(SECS, || rig.aggs().len() == expected.len()).await, "{:?}", rig.log());
    assert!(wait_until(SECS, || rig.acked().len() == 450).await);
    // each window task saw the min of the two sources (source 0 at 6000, source 1 at 10000)
    let last_is = |w: u64| {
        let obs = rig.obs.lock().unwrap();
        obs.watermarks.len() == 2 && obs.watermarks.values().all(|v| v.last() == Some(&w))
    };
    assert!(wait_until(SECS, || last_is(6_000)).await, "{:?}", rig.obs.lock().unwrap().watermarks);
    for (task, wms) in &rig.obs.lock().unwrap().watermarks {
        assert!(wms.contains(&3_000), "task {task}: {wms:?}");
        assert!(wms.iter().all(|w| [2_000, 3_000, 6_000].contains(w)), "task {task}: {wms:?}");
    }
    let (log, s, _, win) = rig.drain().await;
    let mut got: HashMap<(String, i64), u64> = HashMap::new();
    for r in &log {
        if let Rec::Agg { key, start, end, n } = r {
            assert_eq!(end - start, 1_000);
            assert!(got.insert((key.clone(), *start), *n).is_none(), "{r:?} emitted twice");
        }
    }
    assert_eq!(got, expected);
    assert_eq!(got.values().sum::<u64>(), 450);
    assert!(s.lock().unwrap().failed.is_empty());
    assert_eq!(win.stats().late(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_tuples_go_to_the_late_stream() {
    let rig = start(1, 1, TumblingWindowConfig::new(1_000, "ts", &["user"]), true, None);
    push(
        &rig.s,
        0,
        [
            ev(0, "a", 100),
            ev(1, "a", 1_200),
            Cmd::Wm(1_500),
            ev(2, "a", 200),   // [0, 1000) fired: late
            ev(3, "a", 1_300), // below the watermark, but [1000, 2000) is open: counted
            ev(4, "b", 999),   // late
            Cmd::Wm(2_000),
        ],
    );
    assert!(rig.saw_wm(2_000).await);
    assert_eq!(
        rig.log(),
        [
            agg("a", 0, 1_000, 1),
            Rec::Wm(1_500),
            late("a", 200, 0, 1_000),
            late("b", 999, 0, 1_000),
            agg("a", 1_000, 2_000, 2),
            Rec::Wm(2_000),
        ]
    );
    assert!(wait_until(SECS, || rig.acked() == [0, 1, 2, 3, 4]).await, "late tuples are acked once processed");
    let (log, s, _, win) = rig.drain().await;
    check_fire_timing(&log);
    assert!(s.lock().unwrap().failed.is_empty());
    assert_eq!((win.stats().late(), win.stats().inputs(), win.stats().fired()), (2, 3, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_tuples_dropped_are_counted_and_acked() {
    let wcfg = TumblingWindowConfig::new(1_000, "ts", &["user"]).late(LatePolicy::Drop);
    let rig = start(1, 1, wcfg, true, None);
    push(
        &rig.s,
        0,
        [ev(0, "a", 100), ev(1, "a", 1_200), Cmd::Wm(1_500), ev(2, "a", 200), ev(3, "b", 999), Cmd::Wm(2_000)],
    );
    assert!(rig.saw_wm(2_000).await);
    assert_eq!(rig.log(), [agg("a", 0, 1_000, 1), Rec::Wm(1_500), agg("a", 1_000, 2_000, 1), Rec::Wm(2_000)]);
    assert!(wait_until(SECS, || rig.acked() == [0, 1, 2, 3]).await, "acked {:?}", rig.acked());
    let (_, _, _, win) = rig.drain().await;
    assert_eq!(win.stats().late(), 2);
}

async fn drain_flushes(apply_max: bool) {
    let rig = start(1, 1, TumblingWindowConfig::new(100, "ts", &["user"]), apply_max, None);
    // no watermark at all: nothing can fire until the drain
    push(&rig.s, 0, [ev(0, "a", 5), ev(1, "b", 150), ev(2, "a", 250), ev(3, "a", 260), ev(4, "b", -30)]);
    assert!(wait_until(SECS, || rig.win.stats().inputs() == 5).await);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(rig.log().is_empty(), "{:?}", rig.log());
    assert_eq!(rig.win.stats().held(), 5);
    assert!(rig.acked().is_empty());
    let (log, s, obs, win) = rig.drain().await;
    let aggs: Vec<Rec> = log.iter().filter(|r| matches!(r, Rec::Agg { .. })).cloned().collect();
    let expected = [agg("b", -100, 0, 1), agg("a", 0, 100, 1), agg("b", 100, 200, 1), agg("a", 200, 300, 2)];
    assert_eq!(aggs, expected, "flushed in window order");
    let s = s.lock().unwrap();
    assert_eq!(s.acked.len(), 5, "held inputs acked after the flush");
    assert!(s.failed.is_empty());
    assert_eq!((win.stats().held(), win.stats().open_panes()), (0, 0));
    assert_eq!(obs.lock().unwrap().watermarks[&0], [u64::MAX]);
    if apply_max {
        assert_eq!(log.last(), Some(&Rec::Wm(u64::MAX)), "fired by the +infinity watermark: {log:?}");
    } else {
        assert_eq!(log[0], Rec::Wm(u64::MAX), "flushed by on_drain after the +infinity watermark: {log:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_flushes_open_windows_via_infinite_watermark() {
    drain_flushes(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_flushes_open_windows_via_on_drain() {
    drain_flushes(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watermarks_seen_by_the_window_are_monotonic() {
    let rig = start(3, 1, TumblingWindowConfig::new(100, "ts", &["user"]), true, None);
    // each source sends marks out of order (the engine ignores the backward ones) and events at
    // or above its current mark, so none is late
    let plans: [&[u64]; 3] =
        [&[10, 5, 130, 120, 250, 420], &[100, 50, 180, 170, 300, 290, 400], &[1, 200, 150, 260, 410]];
    let mut id = 0;
    for (task, marks) in plans.iter().enumerate() {
        let mut cmds = Vec::new();
        let mut hi = 0u64;
        for &m in *marks {
            hi = hi.max(m);
            for k in ["a", "b"] {
                cmds.push(ev(id, k, hi as i64 + 7));
                id += 1;
            }
            cmds.push(Cmd::Wm(m));
        }
        push(&rig.s, task, cmds);
    }
    assert!(rig.saw_wm(400).await, "{:?}", rig.log());
    let (log, s, obs, win) = rig.drain().await; // asserts strictly increasing marks, ending at +inf
    check_fire_timing(&log);
    let wms = obs.lock().unwrap().watermarks[&0].clone();
    assert!(wms.len() >= 3, "{wms:?}");
    assert!(wms.iter().all(|w| !matches!(w, 5 | 50 | 120 | 150 | 170 | 290)), "a backward mark leaked: {wms:?}");
    assert_eq!(win.stats().late(), 0);
    let total: u64 = log.iter().map(|r| if let Rec::Agg { n, .. } = r { *n } else { 0 }).sum();
    assert_eq!(total, id);
    assert_eq!(s.lock().unwrap().acked.len() as u64, id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_aggregate_replays_exactly_its_inputs() {
    let rig = start(1, 1, TumblingWindowConfig::new(1_000, "ts", &["user"]), true, Some("a"));
    push(&rig.s, 0, [ev(0, "a", 100), ev(1, "a", 200), ev(2, "b", 300), ev(3, "a", 1_100), Cmd::Wm(1_000)]);
    // Agg(a, [0,1000)) fails downstream: its inputs 0 and 1 are failed and replayed; 2 (key b)
    // is acked with its own aggregate; 3 waits in [1000, 2000)
    assert!(wait_until(SECS, || rig.acked() == [0, 1, 2]).await, "acked {:?} log {:?}", rig.acked(), rig.log());
    assert_eq!(rig.failed(), [0, 1]);
    // the replays arrive after the watermark passed their window: late, still tracked
    assert!(wait_until(SECS, || rig.log().len() == 5).await, "{:?}", rig.log());
    let mut log = rig.log();
    assert_eq!(log[..3], [agg("a", 0, 1_000, 2), agg("b", 0, 1_000, 1), Rec::Wm(1_000)]);
    log[3..].sort_by_key(|r| if let Rec::Late { ts, .. } = r { *ts } else { i64::MAX });
    assert_eq!(log[3..], [late("a", 100, 0, 1_000), late("a", 200, 0, 1_000)]);
    let (log, s, _, win) = rig.drain().await;
    assert_eq!(log[5..], [agg("a", 1_000, 2_000, 1), Rec::Wm(u64::MAX)]);
    let s = s.lock().unwrap();
    let mut acked = s.acked.clone();
    acked.sort_unstable();
    assert_eq!(acked, [0, 1, 2, 3], "each input acked exactly once");
    assert_eq!(win.stats().late(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_on_receive_holds_nothing() {
    let wcfg = TumblingWindowConfig::new(1_000, "ts", &["user"]).ack(AckMode::OnReceive);
    let rig = start(1, 1, wcfg, true, None);
    push(&rig.s, 0, [ev(0, "a", 100), ev(1, "a", 200)]);
    assert!(wait_until(SECS, || rig.acked() == [0, 1]).await, "acked before any window fired");
    assert_eq!((rig.win.stats().fired(), rig.win.stats().held(), rig.win.stats().open_panes()), (0, 0, 1));
    let (log, ..) = rig.drain().await;
    assert_eq!(log, [agg("a", 0, 1_000, 2), Rec::Wm(u64::MAX)]);
}

/// Counts like [`Count`] (emits `count`), but panics once: in `add` for the input at
/// `panic_add_at`, or in `emit` for the first window of key `panic_emit_for`.
#[derive(Clone, Default)]
struct Flaky {
    panic_add_at: Option<i64>,
    panic_emit_for: Option<&'static str>,
    panicked: Arc<AtomicBool>,
}

impl WindowAggregate for Flaky {
    type Acc = (u64, String);

    fn fields(&self) -> Vec<String> {
        vec!["count".into()]
    }

    fn init(&self) -> (u64, String) {
        (0, String::new())
    }

    fn add(&self, acc: &mut (u64, String), t: &Tuple) -> Result<(), ComponentError> {
        if Some(t.get_i64("ts")?) == self.panic_add_at && !self.panicked.swap(true, Ordering::SeqCst) {
            panic!("injected panic in add");
        }
        acc.0 += 1;
        acc.1 = t.get_str("user")?.to_owned();
        Ok(())
    }

    fn merge(&self, into: &mut (u64, String), other: &(u64, String)) {
        into.0 += other.0;
        into.1.clone_from(&other.1);
    }

    fn emit(&self, acc: &(u64, String)) -> Values {
        if Some(acc.1.as_str()) == self.panic_emit_for && !self.panicked.swap(true, Ordering::SeqCst) {
            panic!("injected panic in emit");
        }
        values![acc.0]
    }
}

/// Old code: the panicking fold left an uncounted pane for `c`; firing it underflowed the pane
/// counter, so the whole firing was lost and no input of the window was ever acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_add_fails_only_that_input_and_its_replay_is_counted() {
    let flaky = Flaky { panic_add_at: Some(250), ..Default::default() };
    let win = TumblingWindowConfig::new(1_000, "ts", &["user"]).build(flaky).unwrap();
    let rig = start_with(1, 1, win, true, true, None);
    push(&rig.s, 0, [ev(0, "a", 100), ev(1, "c", 250), ev(2, "b", 300), ev(3, "a", 400)]);
    // the panicking input is failed by the engine and replayed; the window is still open
    assert!(wait_until(SECS, || rig.failed() == [1] && rig.win.stats().inputs() == 4).await, "{:?}", rig.failed());
    assert_eq!(rig.win.stats().held(), 4);
    push(&rig.s, 0, [Cmd::Wm(1_000)]);
    assert!(rig.saw_wm(1_000).await);
    let mut aggs = rig.aggs();
    aggs.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    assert_eq!(aggs, [agg("a", 0, 1_000, 2), agg("b", 0, 1_000, 1), agg("c", 0, 1_000, 1)]);
    assert!(wait_until(SECS, || rig.acked() == [0, 1, 2, 3]).await, "acked {:?}", rig.acked());
    let (_, s, _, win) = rig.drain().await;
    assert_eq!(s.lock().unwrap().failed, [1]);
    assert_eq!((win.stats().held(), win.stats().open_panes(), win.stats().late()), (0, 0, 0));
}

/// Old code: the panic in `emit` for `b` dropped the rest of the firing: `c`'s aggregate was
/// never emitted, and `b`'s and `c`'s inputs were never acked nor failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_emit_fails_that_window_and_emits_the_others() {
    let flaky = Flaky { panic_emit_for: Some("b"), ..Default::default() };
    let win = TumblingWindowConfig::new(1_000, "ts", &["user"]).build(flaky).unwrap();
    let rig = start_with(1, 1, win, true, true, None);
    push(&rig.s, 0, [ev(0, "a", 100), ev(1, "b", 200), ev(2, "c", 300), ev(3, "b", 350), ev(4, "a", 1_500)]);
    assert!(wait_until(SECS, || rig.win.stats().inputs() == 5).await);
    push(&rig.s, 0, [Cmd::Wm(1_000)]);
    assert!(rig.saw_wm(1_000).await);
    // a and c fire, before the watermark; b's inputs are failed and replayed: late
    assert!(wait_until(SECS, || rig.acked() == [0, 1, 2, 3]).await, "acked {:?} log {:?}", rig.acked(), rig.log());
    assert_eq!(rig.failed(), [1, 3]);
    assert!(wait_until(SECS, || rig.log().len() == 5).await, "{:?}", rig.log());
    let mut log = rig.log();
    assert_eq!(log[..3], [agg("a", 0, 1_000, 1), agg("c", 0, 1_000, 1), Rec::Wm(1_000)]);
    log[3..].sort_by_key(|r| if let Rec::Late { ts, .. } = r { *ts } else { i64::MAX });
    assert_eq!(log[3..], [late("b", 200, 0, 1_000), late("b", 350, 0, 1_000)]);
    let (log, _, _, win) = rig.drain().await;
    assert_eq!(log[5..], [agg("a", 1_000, 2_000, 1), Rec::Wm(u64::MAX)]);
    assert_eq!((win.stats().panics(), win.stats().emit_errors(), win.stats().fired()), (1, 1, 3));
    assert_eq!(win.stats().held(), 0);
}

/// Each input counts in size / slide windows and is acked once the last of them fired; each
/// window's aggregate is anchored to its inputs, so a failed one replays them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_windows_count_each_input_in_every_window_and_ack_after_the_last() {
    let win = SlidingWindowConfig::new(1_000, 500, "ts", &["user"]).build(Count).unwrap();
    let rig = start_with(1, 1, win, true, true, Some("b"));
    // 700 is in [0, 1000) and [500, 1500); 1_200 in [500, 1500) and [1000, 2000)
    push(&rig.s, 0, [ev(0, "a", 700), ev(1, "a", 1_200), ev(2, "b", 100), Cmd::Wm(1_000)]);
    assert!(rig.saw_wm(1_000).await);
    // b's only aggregate is failed downstream: its input 2 replays (late for [-500, 500) and
    // [0, 1000): to the late stream)
    assert!(
        wait_until(SECS, || rig.failed() == [2] && rig.acked() == [2]).await,
        "{:?} {:?}",
        rig.failed(),
        rig.acked()
    );
    assert_eq!(rig.win.stats().held(), 2, "700 waits for [500, 1500)");
    push(&rig.s, 0, [Cmd::Wm(1_500)]);
    assert!(rig.saw_wm(1_500).await);
    assert!(wait_until(SECS, || rig.acked() == [0, 2]).await, "700 acked after its last window: {:?}", rig.acked());
    let (log, s, _, win) = rig.drain().await;
    let mut aggs: Vec<Rec> = log.iter().filter(|r| matches!(r, Rec::Agg { .. })).cloned().collect();
    aggs.sort_by_key(|r| if let Rec::Agg { key, start, .. } = r { (key.clone(), *start) } else { unreachable!() });
    assert_eq!(
        aggs,
        [
            agg("a", 0, 1_000, 1),
            agg("a", 500, 1_500, 2),
            agg("a", 1_000, 2_000, 1),
            agg("b", -500, 500, 1),
            agg("b", 0, 1_000, 1)
        ]
    );
    assert!(log.contains(&late("b", 100, 0, 1_000)), "{log:?}");
    check_fire_timing(&log);
    let mut acked = s.lock().unwrap().acked.clone();
    acked.sort_unstable();
    assert_eq!(acked, [0, 1, 2]);
    assert_eq!(win.stats().held(), 0);
}

/// Sessions per key: inputs less than the gap apart share one; one that bridges two merges
/// them; a session fires when the watermark reaches its last input + gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_merge_and_fire_at_last_input_plus_gap() {
    let win = SessionWindowConfig::new(100, "ts", &["user"]).build(Count).unwrap();
    let rig = start_with(1, 1, win, true, true, None);
    push(&rig.s, 0, [ev(0, "a", 0), ev(1, "a", 150), ev(2, "b", 50), ev(3, "a", 80), Cmd::Wm(200)]);
    assert!(rig.saw_wm(200).await);
    // a: [0, 100) and [150, 250), bridged by 80 into [0, 250); b: [50, 150) fired
    assert_eq!(rig.aggs(), [agg("b", 50, 150, 1)]);
    push(&rig.s, 0, [Cmd::Wm(250)]);
    assert!(rig.saw_wm(250).await);
    assert_eq!(rig.aggs(), [agg("b", 50, 150, 1), agg("a", 0, 250, 3)]);
    assert!(wait_until(SECS, || rig.acked() == [0, 1, 2, 3]).await, "{:?}", rig.acked());
    let (log, ..) = rig.drain().await;
    check_fire_timing(&log);
}

/// With allowed lateness a fired window is kept: a late input within it is counted and the
/// window fires again at once (a refinement); past it, the input is late as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_lateness_refines_fired_windows() {
    let win = TumblingWindowConfig::new(1_000, "ts", &["user"]).allowed_lateness(500).build(Count).unwrap();
    let rig = start_with(1, 1, win, true, true, None);
    push(
        &rig.s,
        0,
        [ev(0, "a", 100), Cmd::Wm(1_200), ev(1, "a", 200), ev(2, "b", 300), Cmd::Wm(1_500), ev(3, "a", 400)],
    );
    assert!(wait_until(SECS, || rig.log().len() == 6).await, "{:?}", rig.log());
    assert_eq!(
        rig.log(),
        [
            agg("a", 0, 1_000, 1),
            Rec::Wm(1_200),
            agg("a", 0, 1_000, 2), // refinement
            agg("b", 0, 1_000, 1), // first aggregate of b, after the window's end
            Rec::Wm(1_500),
            late("a", 400, 0, 1_000),
        ]
    );
    assert!(wait_until(SECS, || rig.acked() == [0, 1, 2, 3]).await, "{:?}", rig.acked());
    let (_, _, _, win) = rig.drain().await;
    assert_eq!((win.stats().fired(), win.stats().refinements(), win.stats().late()), (3, 1, 1));
    assert_eq!((win.stats().held(), win.stats().open_panes()), (0, 0));
}
