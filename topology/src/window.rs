//! Event-time tumbling windows: [`TumblingWindowBolt`] groups tuples by key into fixed,
//! non-overlapping windows of event time and emits one aggregate per (key, window) once the
//! bolt's input low watermark reaches the window's end.
//!
//! # Layout
//!
//! - [`WindowAggregate`]: what is computed per (key, window); ready-made [`Count`] and [`Sum`].
//! - [`Window`]: the bounds math (alignment, negative timestamps, the edges of the `i64` range).
//! - [`WindowState`]: the bookkeeping of open windows, free of engine types (unit- and
//!   property-tested on its own).
//! - [`TumblingWindowConfig`] (serde, validated) builds a [`TumblingWindow`]: a cloneable spec
//!   that makes the bolt instances and declares their output streams.
//! - [`TumblingWindowBolt`]: the [`Bolt`]. [`WindowStats`]: counters shared by its tasks.
//!
//! # Semantics
//!
//! - **Windows.** With size `s`, the window of an event time `t` is `[start, start + s)` with
//!   `start = floor(t / s) * s`: aligned at the epoch, also for negative times (`t = -1`, `s =
//!   1000` falls in `[-1000, 0)`). The bounds math is exact (in `i128`); the emitted
//!   `window_start_ms`/`window_end_ms` saturate to the `i64` range, which only matters within one
//!   window of `i64::MIN`/`i64::MAX`.
//! - **Firing.** A window fires when the input watermark `w` satisfies `w >= end` (no later tuple
//!   can carry an event time below `end`), never before. It emits one tuple per key that had
//!   inputs in it, on the output stream (default `"default"`), with fields
//!   `[key fields.., "window_start_ms", "window_end_ms", aggregate fields..]`. Windows fire in
//!   order of their end; within a window, keys in the order they were first seen. The
//!   [`Watermark::MAX`] sent ahead of a drain fires every open window, and so does `on_drain`.
//! - **Late data.** A tuple is late when the watermark has already reached the end of its window
//!   (the window fired, or would have had it had inputs). A tuple whose time is below the
//!   watermark but whose window is still open is *not* late: it is counted. Before the first
//!   watermark nothing is late. With [`LatePolicy::Stream`] (the default) a late tuple is
//!   emitted on the late stream (default `"late"`) as
//!   `[key fields.., "event_ms", "window_start_ms", "window_end_ms"]`, anchored to the input, so a
//!   subscriber can correct what was already emitted; with [`LatePolicy::Drop`] it is acked and
//!   only counted. Both count it in [`WindowStats::late`].
//! - **Acking ([`AckMode::OnFire`], the default: at-least-once).** Each input is held with
//!   [`BoltOutput::defer_ack`]; the window's aggregates are emitted anchored to every input of
//!   their (key, window), and the inputs are acked right after. A downstream failure of an
//!   aggregate therefore fails (and replays) exactly its inputs. The replayed inputs arrive after
//!   the watermark passed their window, so they are *late*: with [`LatePolicy::Stream`] they
//!   reach the late stream (still tracked), which is how at-least-once shows through a window
//!   without checkpointed state. With [`AckMode::OnReceive`] inputs are acked when `execute`
//!   returns and aggregates are emitted unanchored: nothing is held, but a lost aggregate is not
//!   replayed (at most once).
//!
//! # Memory
//!
//! Open state is one accumulator per (key, open window); windows stay open from their first
//! input until the watermark passes their end, so its size is keys x (watermark lag / size + 1).
//! With [`AckMode::OnFire`] every input of an open window is also held, and every held input
//! keeps its spout tuple pending: held inputs are bounded by the sum of the spout tasks'
//! `max_spout_pending`. The other side of that bound: a spout task at `max_spout_pending` emits
//! no data (its watermark moves only through
//! [`Spout::low_watermark`](crate::Spout::low_watermark)), and its watermark stays below the time
//! of the tuples it has yet to emit: a window whose inputs do not all fit in the pending tuples
//! never fires. Size `max_spout_pending` above the number of tracked tuples a spout task emits
//! over one window plus the watermark lag, and `message_timeout_ms` above the window size plus
//! the lag (held inputs that time out are replayed, and arrive late). An aggregate anchored to
//! `n` inputs carries up to `n` ack-tree anchors. For windows spanning more inputs than that
//! allows, use [`AckMode::OnReceive`].
//!
//! # Parallelism
//!
//! Each task windows the tuples it receives; subscribe with a fields grouping on (a subset of)
//! the key fields so that every key is aggregated by one task.
//!
//! # Example
//!
//! ```
//! use squall_topology::window::{Count, TumblingWindowConfig};
//! use squall_topology::*;
//!
//! struct Clicks { ts: Vec<(&'static str, i64)> }
//! impl Spout for Clicks {
//!     type MsgId = ();
//!     async fn next_tuple(&mut self, out: &mut SpoutOutput<()>) -> Result<(), ComponentError> {
//!         if let Some((user, ts)) = self.ts.pop() {
//!             out.emit_tracked(values![user, ts], ())?;
//!             out.watermark(ts as u64); // in order: nothing below `ts` follows
//!         }
//!         Ok(())
//!     }
//! }
//! struct Print;
//! impl Bolt for Print {
//!     async fn execute(&mut self, t: Tuple, _: &mut BoltOutput) -> Result<(), ComponentError> {
//!         println!("{} [{}, {}): {}", t.get_str("user")?, t.get_i64("window_start_ms")?,
//!                  t.get_i64("window_end_ms")?, t.get_u64("count")?);
//!         Ok(())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let windows = TumblingWindowConfig::new(1_000, "ts", &["user"]).build(Count).expect("valid");
//! let mut b = TopologyBuilder::new("clicks");
//! b.set_spout("clicks", 1, |_| Clicks { ts: vec![("bo", 2_500), ("al", 1_200), ("al", 300), ("al", 100)] })
//!     .fields(&["user", "ts"]);
//! windows.declare_outputs(b.set_bolt("win", 1, windows.factory()).fields_grouping("clicks", &["user"]));
//! b.set_bolt("print", 1, |_| Print).shuffle_grouping("win");
//! let running = run_local(b.build().expect("valid topology"), TopologyConfig::default()).expect("valid config");
//! while running.metrics().component("clicks").map_or(0, |m| m.acked) < 3 {
//!     tokio::time::sleep(std::time::Duration::from_millis(1)).await;
//! }
//! // watermark 1200 fired [0, 1000) (al: 2), 2500 fired [1000, 2000) (al: 1), acking al's
//! // clicks; bo's click waits in [2000, 3000) until the drain flushes it.
//! assert_eq!(windows.stats().fired(), 2);
//! assert_eq!(windows.stats().held(), 1);
//! running.drain().await.unwrap();
//! running.wait().await.unwrap();
//! assert_eq!(windows.stats().fired(), 3);
//! # }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::builder::BoltDeclarer;
use crate::component::{Bolt, ComponentError, ErrorDomain, TaskContext, Watermark};
use crate::output::{AckHandle, BoltOutput};
use crate::tuple::{DEFAULT_STREAM, Tuple};
use crate::value::{Value, Values};

/// The emitted field holding a window's start (inclusive), in ms.
pub const WINDOW_START_FIELD: &str = "window_start_ms";
/// The emitted field holding a window's end (exclusive), in ms.
pub const WINDOW_END_FIELD: &str = "window_end_ms";
/// The late-stream field holding the late tuple's event time, in ms.
pub const EVENT_TIME_FIELD: &str = "event_ms";

/// What a window computes per key: an accumulator folded over the window's inputs and turned
/// into output values when the window fires.
pub trait WindowAggregate: Clone + Send + Sync + 'static {
    /// The per-(key, window) state.
    type Acc: Send + 'static;

    /// The names of the values [`WindowAggregate::emit`] returns, in order.
    fn fields(&self) -> Vec<String>;

    /// A fresh accumulator for a (key, window) that just received its first input.
    fn init(&self) -> Self::Acc;

    /// Folds one input in. On error the input is failed (and replayed by a replaying spout);
    /// `acc` must then be left as it was.
    fn add(&self, acc: &mut Self::Acc, input: &Tuple) -> Result<(), ComponentError>;

    /// The output values of a fired window, one per [`WindowAggregate::fields`] entry.
    fn emit(&self, acc: &Self::Acc) -> Values;
}

/// Counts the inputs: emits `count` (u64).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Count;

impl WindowAggregate for Count {
    type Acc = u64;

    fn fields(&self) -> Vec<String> {
        vec!["count".to_owned()]
    }

    fn init(&self) -> u64 {
        0
    }

    fn add(&self, acc: &mut u64, _input: &Tuple) -> Result<(), ComponentError> {
        *acc += 1;
        Ok(())
    }

    fn emit(&self, acc: &u64) -> Values {
        Values::from([*acc])
    }
}

/// Sums an integer field (signed or unsigned): emits `sum` (i64, saturating at the `i64` range;
/// the running sum itself is exact).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sum {
    field: String,
}

impl Sum {
    /// Sums `field`.
    pub fn new(field: impl Into<String>) -> Self {
        Sum { field: field.into() }
    }
}

impl WindowAggregate for Sum {
    type Acc = i128;

    fn fields(&self) -> Vec<String> {
        vec!["sum".to_owned()]
    }

    fn init(&self) -> i128 {
        0
    }

    fn add(&self, acc: &mut i128, input: &Tuple) -> Result<(), ComponentError> {
        let v = match input.get(&self.field)? {
            Value::Int(i) => i128::from(*i),
            Value::UInt(u) => i128::from(*u),
            // reports the type mismatch, naming the field, stream and component
            _ => i128::from(input.get_i64(&self.field)?),
        };
        // |v| < 2^64, so 2^63 additions cannot overflow i128: saturate to be total anyway
        *acc = acc.saturating_add(v);
        Ok(())
    }

    fn emit(&self, acc: &i128) -> Values {
        Values::from([saturate_i64(*acc)])
    }
}

fn saturate_i64(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

/// The bounds `[start, end)` of one tumbling window, in ms of event time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Window {
    start: i128,
    end: i128,
}

impl Window {
    /// The window of size `size_ms` that holds event time `ts`: aligned at the epoch, so
    /// `start = floor(ts / size) * size`, also for negative `ts`.
    pub fn containing(ts: i64, size_ms: NonZeroU64) -> Window {
        let size = i128::from(size_ms.get());
        let start = i128::from(ts).div_euclid(size) * size;
        Window { start, end: start + size }
    }

    /// The exact start (inclusive); below `i64::MIN` only for the window holding `i64::MIN`.
    pub fn start(&self) -> i128 {
        self.start
    }

    /// The exact end (exclusive); above `i64::MAX` only for the window holding `i64::MAX`.
    pub fn end(&self) -> i128 {
        self.end
    }

    /// The start as emitted: saturated to the `i64` range.
    pub fn start_ms(&self) -> i64 {
        saturate_i64(self.start)
    }

    /// The end as emitted: saturated to the `i64` range.
    pub fn end_ms(&self) -> i64 {
        saturate_i64(self.end)
    }

    /// Whether `ts` falls in the window.
    pub fn contains(&self, ts: i64) -> bool {
        (self.start..self.end).contains(&i128::from(ts))
    }

    /// Whether watermark `wm` closes the window: `wm >= end`, and [`Watermark::MAX`] closes
    /// every window.
    pub fn closed_by(&self, wm: u64) -> bool {
        wm == u64::MAX || self.end <= i128::from(wm)
    }
}

/// A key: the values of the key fields. Hashes with [`Value::hash_into`]; floats compare by bit
/// pattern, consistently with their hash.
#[derive(Clone, Debug)]
struct Key(Values);

impl Hash for Key {
    fn hash<S: Hasher>(&self, h: &mut S) {
        h.write_usize(self.0.len());
        for v in self.0.iter() {
            v.hash_into(h);
        }
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.0.len() == other.0.len()
            && self.0.iter().zip(other.0.iter()).all(|(a, b)| match (a, b) {
                (Value::Float(x), Value::Float(y)) => x.to_bits() == y.to_bits(),
                _ => a == b,
            })
    }
}

impl Eq for Key {}

/// One (key, window): its accumulator and its held inputs.
#[derive(Debug)]
struct Pane<Acc, H> {
    key: Values,
    acc: Acc,
    inputs: Vec<H>,
    count: u64,
}

/// The panes of one open window, in the order their keys were first seen.
#[derive(Debug)]
struct OpenWindow<Acc, H> {
    window: Window,
    index: HashMap<Key, usize>,
    panes: Vec<Pane<Acc, H>>,
}

/// Where [`WindowState::add`] put an input.
#[derive(Debug, PartialEq)]
pub enum Placement<H> {
    /// Folded into this open window.
    Open(Window),
    /// The watermark already closed the window: nothing was recorded; the key and input are
    /// handed back.
    Late {
        /// The (closed) window of the input's time.
        window: Window,
        /// The key given to `add`.
        key: Values,
        /// The input handle given to `add`.
        input: Option<H>,
    },
}

/// One (key, window) that fired.
#[derive(Debug)]
pub struct Fired<Acc, H> {
    /// The window.
    pub window: Window,
    /// The key values.
    pub key: Values,
    /// The accumulator.
    pub acc: Acc,
    /// The held inputs, in arrival order.
    pub inputs: Vec<H>,
    /// How many inputs were folded in (also when none were held).
    pub count: u64,
}

/// The open tumbling windows of one task, keyed; generic over the accumulator and the held input
/// handle `H` (an [`AckHandle`] in the bolt). No engine types: this is the logic the bolt wraps.
#[derive(Debug)]
pub struct WindowState<Acc, H> {
    size: NonZeroU64,
    watermark: Option<u64>,
    /// Open windows by their end.
    open: BTreeMap<i128, OpenWindow<Acc, H>>,
    panes: usize,
    held: usize,
}

impl<Acc, H> WindowState<Acc, H> {
    /// No open window, no watermark yet.
    pub fn new(size: NonZeroU64) -> Self {
        WindowState { size, watermark: None, open: BTreeMap::new(), panes: 0, held: 0 }
    }

    /// The window size in ms.
    pub fn size(&self) -> NonZeroU64 {
        self.size
    }

    /// The highest watermark seen (`None` before the first).
    pub fn watermark(&self) -> Option<u64> {
        self.watermark
    }

    /// The window of event time `ts`.
    pub fn window_of(&self, ts: i64) -> Window {
        Window::containing(ts, self.size)
    }

    /// Whether the watermark already closed `window`.
    pub fn is_closed(&self, window: Window) -> bool {
        self.watermark.is_some_and(|wm| window.closed_by(wm))
    }

    /// Number of open (key, window) panes.
    pub fn open_panes(&self) -> usize {
        self.panes
    }

    /// Number of open windows.
    pub fn open_windows(&self) -> usize {
        self.open.len()
    }

    /// The open windows, by end.
    pub fn windows(&self) -> impl Iterator<Item = Window> + '_ {
        self.open.values().map(|w| w.window)
    }

    /// Number of held input handles.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Folds an input with event time `ts` into the pane of (`key`, its window): creates the pane
    /// with `init` if needed, applies `fold` to its accumulator, and holds `input`. A late input
    /// (its window already closed) is handed back untouched. If `fold` fails, nothing is recorded
    /// (a pane created for it is removed) and `input` is dropped.
    pub fn add<E>(
        &mut self,
        key: Values,
        ts: i64,
        input: Option<H>,
        init: impl FnOnce() -> Acc,
        fold: impl FnOnce(&mut Acc) -> Result<(), E>,
    ) -> Result<Placement<H>, E> {
        let window = self.window_of(ts);
        if self.is_closed(window) {
            return Ok(Placement::Late { window, key, input });
        }
        let open = self.open.entry(window.end).or_insert_with(|| OpenWindow {
            window,
            index: HashMap::new(),
            panes: Vec::new(),
        });
        let (i, created) = match open.index.get(&Key(key.clone())) {
            Some(&i) => (i, false),
            None => {
                let i = open.panes.len();
                open.index.insert(Key(key.clone()), i);
                open.panes.push(Pane { key, acc: init(), inputs: Vec::new(), count: 0 });
                (i, true)
            }
        };
        let pane = &mut open.panes[i];
        if let Err(e) = fold(&mut pane.acc) {
            if created {
                let pane = open.panes.pop();
                if let Some(p) = pane {
                    open.index.remove(&Key(p.key));
                }
                if open.panes.is_empty() {
                    self.open.remove(&window.end);
                }
            }
            return Err(e);
        }
        pane.count += 1;
        if let Some(h) = input {
            pane.inputs.push(h);
            self.held += 1;
        }
        if created {
            self.panes += 1;
        }
        Ok(Placement::Open(window))
    }

    /// Advances the watermark to `wm` and returns the panes of every window it closes (`end <=
    /// wm`), by window end, then by key arrival. A watermark not above the current one is ignored
    /// and fires nothing.
    pub fn advance(&mut self, wm: u64) -> Vec<Fired<Acc, H>> {
        if self.watermark.is_some_and(|w| wm <= w) {
            return Vec::new();
        }
        self.watermark = Some(wm);
        let mut fired = Vec::new();
        while let Some(entry) = self.open.first_entry() {
            if !entry.get().window.closed_by(wm) {
                break;
            }
            let w = entry.remove();
            self.take(w, &mut fired);
        }
        fired
    }

    /// Fires every open window (the stream ended) and closes all windows for the future.
    pub fn flush(&mut self) -> Vec<Fired<Acc, H>> {
        self.watermark = Some(u64::MAX);
        let mut fired = Vec::new();
        for (_, w) in std::mem::take(&mut self.open) {
            self.take(w, &mut fired);
        }
        fired
    }

    fn take(&mut self, w: OpenWindow<Acc, H>, fired: &mut Vec<Fired<Acc, H>>) {
        self.panes -= w.panes.len();
        for p in w.panes {
            self.held -= p.inputs.len();
            fired.push(Fired { window: w.window, key: p.key, acc: p.acc, inputs: p.inputs, count: p.count });
        }
    }
}

/// What happens to a late tuple (its window already fired).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LatePolicy {
    /// Emit it on the late stream, anchored to the input (acked once the late stream's
    /// subscribers processed it).
    #[default]
    Stream,
    /// Ack it and only count it.
    Drop,
}

/// When inputs are acked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AckMode {
    /// Hold every input until its window fires; anchor the aggregate to them (at-least-once).
    #[default]
    OnFire,
    /// Ack inputs when `execute` returns; emit aggregates unanchored (at most once, nothing held).
    OnReceive,
}

fn default_late_stream() -> String {
    "late".to_owned()
}

fn default_output_stream() -> String {
    DEFAULT_STREAM.to_owned()
}

/// The configuration of a tumbling window bolt. [`TumblingWindowConfig::build`] validates it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TumblingWindowConfig {
    /// Window length in ms; must be positive.
    pub size_ms: u64,
    /// The event-time field: integer ms (signed, or unsigned up to `i64::MAX`).
    pub time_field: String,
    /// The key fields; empty means one window per period for all tuples.
    #[serde(default)]
    pub key_fields: Vec<String>,
    /// What happens to late tuples.
    #[serde(default)]
    pub late: LatePolicy,
    /// The stream late tuples go to with [`LatePolicy::Stream`]. Default `"late"`.
    #[serde(default = "default_late_stream")]
    pub late_stream: String,
    /// The stream aggregates go to. Default `"default"`.
    #[serde(default = "default_output_stream")]
    pub output_stream: String,
    /// When inputs are acked.
    #[serde(default)]
    pub ack: AckMode,
}

/// An invalid [`TumblingWindowConfig`]: the caller's fault ([`ErrorDomain::User`]), not
/// retryable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WindowError {
    /// `size_ms` is zero.
    #[error("tumbling window size_ms must be positive")]
    ZeroSize,
    /// `time_field` is empty.
    #[error("tumbling window time_field is empty")]
    NoTimeField,
    /// A stream would carry two fields of one name.
    #[error(
        "tumbling window stream `{stream}` would declare field `{field}` twice (key fields, window bounds and aggregate fields must differ)"
    )]
    DuplicateField {
        /// The stream.
        stream: String,
        /// The repeated field.
        field: String,
    },
    /// The late stream and the output stream are the same.
    #[error("tumbling window late_stream and output_stream are both `{stream}`")]
    SameStream {
        /// The stream name.
        stream: String,
    },
}

impl WindowError {
    /// Always false: fix the configuration.
    pub fn is_retryable(&self) -> bool {
        false
    }

    /// Always [`ErrorDomain::User`].
    pub fn domain(&self) -> ErrorDomain {
        ErrorDomain::User
    }
}

impl TumblingWindowConfig {
    /// Windows of `size_ms` over `time_field`, per `key_fields`; defaults for the rest.
    pub fn new(size_ms: u64, time_field: &str, key_fields: &[&str]) -> Self {
        TumblingWindowConfig {
            size_ms,
            time_field: time_field.to_owned(),
            key_fields: key_fields.iter().map(|f| (*f).to_owned()).collect(),
            late: LatePolicy::default(),
            late_stream: default_late_stream(),
            output_stream: default_output_stream(),
            ack: AckMode::default(),
        }
    }

    /// Sets the late policy.
    pub fn late(mut self, late: LatePolicy) -> Self {
        self.late = late;
        self
    }

    /// Sets the ack mode.
    pub fn ack(mut self, ack: AckMode) -> Self {
        self.ack = ack;
        self
    }

    /// Validates the config for `aggregate` and builds the spec that makes the bolts.
    pub fn build<A: WindowAggregate>(&self, aggregate: A) -> Result<TumblingWindow<A>, WindowError> {
        let size = NonZeroU64::new(self.size_ms).ok_or(WindowError::ZeroSize)?;
        if self.time_field.is_empty() {
            return Err(WindowError::NoTimeField);
        }
        let key = self.key_fields.iter().cloned();
        let output_fields: Vec<String> = key
            .clone()
            .chain([WINDOW_START_FIELD.to_owned(), WINDOW_END_FIELD.to_owned()])
            .chain(aggregate.fields())
            .collect();
        let late_fields: Vec<String> = key
            .chain([EVENT_TIME_FIELD.to_owned(), WINDOW_START_FIELD.to_owned(), WINDOW_END_FIELD.to_owned()])
            .collect();
        check_unique(&self.output_stream, &output_fields)?;
        if self.late == LatePolicy::Stream {
            if self.late_stream == self.output_stream {
                return Err(WindowError::SameStream { stream: self.late_stream.clone() });
            }
            check_unique(&self.late_stream, &late_fields)?;
        }
        Ok(TumblingWindow {
            spec: Arc::new(Spec {
                config: self.clone(),
                size,
                aggregate,
                output_fields,
                late_fields,
                stats: Arc::new(WindowStats::default()),
            }),
        })
    }
}

fn check_unique(stream: &str, fields: &[String]) -> Result<(), WindowError> {
    for (i, f) in fields.iter().enumerate() {
        if fields[..i].contains(f) {
            return Err(WindowError::DuplicateField { stream: stream.to_owned(), field: f.clone() });
        }
    }
    Ok(())
}

/// Counters of the window bolts made by one [`TumblingWindow`], summed over their tasks.
#[derive(Debug, Default)]
pub struct WindowStats {
    inputs: AtomicU64,
    late: AtomicU64,
    fired: AtomicU64,
    emit_errors: AtomicU64,
    open_panes: AtomicU64,
    held: AtomicU64,
}

impl WindowStats {
    /// Inputs folded into an open window.
    pub fn inputs(&self) -> u64 {
        self.inputs.load(Ordering::Relaxed)
    }

    /// Late inputs (sent to the late stream or dropped).
    pub fn late(&self) -> u64 {
        self.late.load(Ordering::Relaxed)
    }

    /// (key, window) aggregates emitted.
    pub fn fired(&self) -> u64 {
        self.fired.load(Ordering::Relaxed)
    }

    /// Aggregates whose emit failed (undeclared stream, wrong field count); their inputs were
    /// failed.
    pub fn emit_errors(&self) -> u64 {
        self.emit_errors.load(Ordering::Relaxed)
    }

    /// Open (key, window) panes now.
    pub fn open_panes(&self) -> u64 {
        self.open_panes.load(Ordering::Relaxed)
    }

    /// Inputs held now (with [`AckMode::OnFire`]).
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }
}

#[derive(Debug)]
struct Spec<A> {
    config: TumblingWindowConfig,
    size: NonZeroU64,
    aggregate: A,
    output_fields: Vec<String>,
    late_fields: Vec<String>,
    stats: Arc<WindowStats>,
}

/// A validated tumbling window: makes the bolt instances (one per task) and declares their
/// streams. Cheap to clone; the clones share one [`WindowStats`].
#[derive(Debug)]
pub struct TumblingWindow<A> {
    spec: Arc<Spec<A>>,
}

impl<A> Clone for TumblingWindow<A> {
    fn clone(&self) -> Self {
        TumblingWindow { spec: self.spec.clone() }
    }
}

impl<A: WindowAggregate> TumblingWindow<A> {
    /// A new bolt instance (for one task).
    pub fn bolt(&self) -> TumblingWindowBolt<A> {
        TumblingWindowBolt {
            spec: self.spec.clone(),
            state: WindowState::new(self.spec.size),
            reported_panes: 0,
            reported_held: 0,
        }
    }

    /// A factory for [`crate::TopologyBuilder::set_bolt`].
    pub fn factory(&self) -> impl Fn(&TaskContext) -> TumblingWindowBolt<A> + Send + Sync + 'static {
        let this = self.clone();
        move |_| this.bolt()
    }

    /// Declares the output stream and, with [`LatePolicy::Stream`], the late stream.
    pub fn declare_outputs(&self, bolt: &mut BoltDeclarer<'_>) {
        let c = &self.spec.config;
        bolt.output(&c.output_stream, &self.spec.output_fields.iter().map(String::as_str).collect::<Vec<_>>());
        if c.late == LatePolicy::Stream {
            bolt.output(&c.late_stream, &self.spec.late_fields.iter().map(String::as_str).collect::<Vec<_>>());
        }
    }

    /// The aggregate stream's fields: key fields, `window_start_ms`, `window_end_ms`, then the
    /// aggregate's fields.
    pub fn output_fields(&self) -> &[String] {
        &self.spec.output_fields
    }

    /// The late stream's fields: key fields, `event_ms`, `window_start_ms`, `window_end_ms`.
    pub fn late_fields(&self) -> &[String] {
        &self.spec.late_fields
    }

    /// The configuration.
    pub fn config(&self) -> &TumblingWindowConfig {
        &self.spec.config
    }

    /// The counters of every bolt this spec made.
    pub fn stats(&self) -> Arc<WindowStats> {
        self.spec.stats.clone()
    }
}

/// The tumbling window bolt; make it with [`TumblingWindow::bolt`] or
/// [`TumblingWindow::factory`]. See the [module docs](self) for its semantics.
#[derive(Debug)]
pub struct TumblingWindowBolt<A: WindowAggregate> {
    spec: Arc<Spec<A>>,
    state: WindowState<A::Acc, AckHandle>,
    reported_panes: usize,
    reported_held: usize,
}

impl<A: WindowAggregate> TumblingWindowBolt<A> {
    /// This task's open windows.
    pub fn state(&self) -> &WindowState<A::Acc, AckHandle> {
        &self.state
    }

    fn late(
        &self,
        window: Window,
        key: Values,
        ts: i64,
        input: Option<AckHandle>,
        out: &mut BoltOutput,
    ) -> Result<(), ComponentError> {
        self.spec.stats.late.fetch_add(1, Ordering::Relaxed);
        let c = &self.spec.config;
        match (c.late, input) {
            (LatePolicy::Drop, Some(h)) => out.ack(h),
            (LatePolicy::Drop, None) => {} // acked when execute returns
            (LatePolicy::Stream, input) => {
                let mut v = key;
                v.push(ts);
                v.push(window.start_ms());
                v.push(window.end_ms());
                match input {
                    // on error the held input is failed by the engine as execute returns Err
                    Some(h) => {
                        out.emit_anchored(&[&h], &c.late_stream, v)?;
                        out.ack(h);
                    }
                    None => out.emit_to(&c.late_stream, v)?,
                }
            }
        }
        Ok(())
    }

    /// Emits the fired panes, then acks their inputs (fails them if the emit was refused).
    fn emit_fired(&mut self, fired: Vec<Fired<A::Acc, AckHandle>>, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let spec = &*self.spec;
        let mut first_err = None;
        for f in fired {
            let mut v = f.key;
            v.push(f.window.start_ms());
            v.push(f.window.end_ms());
            for x in spec.aggregate.emit(&f.acc).iter() {
                v.push(x.clone());
            }
            let stream = &spec.config.output_stream;
            let r = if f.inputs.is_empty() {
                out.emit_unanchored_to(stream, v)
            } else {
                let refs: Vec<&AckHandle> = f.inputs.iter().collect();
                out.emit_anchored(&refs, stream, v)
            };
            match r {
                Ok(()) => {
                    spec.stats.fired.fetch_add(1, Ordering::Relaxed);
                    for h in f.inputs {
                        out.ack(h);
                    }
                }
                Err(e) => {
                    spec.stats.emit_errors.fetch_add(1, Ordering::Relaxed);
                    for h in f.inputs {
                        out.fail(h);
                    }
                    first_err.get_or_insert(e);
                }
            }
        }
        self.report();
        match first_err {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Publishes this task's gauges into the shared stats.
    fn report(&mut self) {
        let s = &self.spec.stats;
        for (now, last, gauge) in [
            (self.state.open_panes(), &mut self.reported_panes, &s.open_panes),
            (self.state.held(), &mut self.reported_held, &s.held),
        ] {
            if now >= *last {
                gauge.fetch_add((now - *last) as u64, Ordering::Relaxed);
            } else {
                gauge.fetch_sub((*last - now) as u64, Ordering::Relaxed);
            }
            *last = now;
        }
    }
}

impl<A: WindowAggregate> Bolt for TumblingWindowBolt<A> {
    async fn execute(&mut self, input: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let spec = self.spec.clone();
        let c = &spec.config;
        let ts = input.get_i64(&c.time_field)?;
        let key = c.key_fields.iter().map(|f| input.get(f).cloned()).collect::<Result<Values, _>>()?;
        let handle = match c.ack {
            AckMode::OnFire => Some(out.defer_ack()?),
            AckMode::OnReceive => None,
        };
        let agg = &spec.aggregate;
        // if `add` fails, the deferred input is failed by the engine as execute returns Err
        match self.state.add(key, ts, handle, || agg.init(), |acc| agg.add(acc, &input))? {
            Placement::Open(_) => {
                spec.stats.inputs.fetch_add(1, Ordering::Relaxed);
                self.report();
                Ok(())
            }
            Placement::Late { window, key, input } => self.late(window, key, ts, input, out),
        }
    }

    async fn on_watermark(&mut self, wm: Watermark, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let fired = self.state.advance(wm.millis());
        self.emit_fired(fired, out)
    }

    async fn on_drain(&mut self, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let fired = self.state.flush();
        self.emit_fired(fired, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::values;

    fn incr(n: &mut u64) -> Result<(), ()> {
        *n += 1;
        Ok(())
    }

    fn size(ms: u64) -> NonZeroU64 {
        NonZeroU64::new(ms).unwrap()
    }

    #[test]
    fn window_assignment_aligns_at_the_epoch() {
        let w = Window::containing(1_234, size(1_000));
        assert_eq!((w.start(), w.end()), (1_000, 2_000));
        assert!(w.contains(1_000) && w.contains(1_999) && !w.contains(2_000) && !w.contains(999));
        assert_eq!(Window::containing(0, size(1_000)).start(), 0);
        assert_eq!(Window::containing(999, size(1_000)).end(), 1_000);
        assert_eq!(Window::containing(1_000, size(1_000)).start(), 1_000);
        let one = Window::containing(7, size(1));
        assert_eq!((one.start(), one.end()), (7, 8));
    }

    #[test]
    fn negative_timestamps_floor() {
        let w = Window::containing(-1, size(1_000));
        assert_eq!((w.start_ms(), w.end_ms()), (-1_000, 0));
        let w = Window::containing(-1_000, size(1_000));
        assert_eq!((w.start_ms(), w.end_ms()), (-1_000, 0));
        let w = Window::containing(-1_001, size(1_000));
        assert_eq!((w.start_ms(), w.end_ms()), (-2_000, -1_000));
        // a window ending at or below 0 is closed by any watermark
        assert!(Window::containing(-1, size(1_000)).closed_by(0));
        assert!(!Window::containing(0, size(1_000)).closed_by(999));
    }

    #[test]
    fn extremes_are_exact_inside_and_saturate_when_emitted() {
        let s = size(1_000);
        let top = Window::containing(i64::MAX, s);
        assert!(top.contains(i64::MAX));
        assert!(top.end() > i128::from(i64::MAX));
        assert_eq!(top.end_ms(), i64::MAX);
        assert!(!top.closed_by(i64::MAX as u64), "i64::MAX may still arrive at watermark i64::MAX");
        assert!(top.closed_by(u64::MAX));
        let bottom = Window::containing(i64::MIN, s);
        assert!(bottom.contains(i64::MIN));
        assert!(bottom.start() < i128::from(i64::MIN));
        assert_eq!(bottom.start_ms(), i64::MIN);
        let huge = Window::containing(-5, size(u64::MAX));
        assert_eq!(huge.start(), -i128::from(u64::MAX));
        assert_eq!(huge.end(), 0);
        let huge = Window::containing(i64::MAX, size(u64::MAX));
        assert_eq!((huge.start(), huge.end_ms()), (0, i64::MAX));
    }

    #[test]
    fn closed_by_is_watermark_at_least_end() {
        let w = Window::containing(1_500, size(1_000));
        assert!(!w.closed_by(1_999));
        assert!(w.closed_by(2_000));
        assert!(w.closed_by(2_001));
    }

    fn add(state: &mut WindowState<u64, u32>, key: &str, ts: i64, id: u32) -> Placement<u32> {
        state.add(values![key], ts, Some(id), || 0, incr).unwrap()
    }

    #[test]
    fn state_fires_only_closed_windows_in_order() {
        let mut s = WindowState::new(size(10));
        assert_eq!(add(&mut s, "b", 15, 0), Placement::Open(Window::containing(15, size(10))));
        add(&mut s, "a", 3, 1);
        add(&mut s, "b", 4, 2);
        add(&mut s, "a", 9, 3);
        add(&mut s, "a", 12, 4);
        assert_eq!((s.open_windows(), s.open_panes(), s.held()), (2, 4, 5));
        assert!(s.advance(9).is_empty(), "no window ends at or below 9");
        let fired = s.advance(10);
        let got: Vec<_> =
            fired.iter().map(|f| (f.key[0].to_string(), f.window.start(), f.acc, f.inputs.clone())).collect();
        assert_eq!(got, [("a".to_owned(), 0, 2, vec![1, 3]), ("b".to_owned(), 0, 1, vec![2])], "keys in arrival order");
        assert_eq!((s.open_windows(), s.open_panes(), s.held()), (1, 2, 2));
        // backwards or equal watermarks fire nothing
        assert!(s.advance(5).is_empty());
        assert!(s.advance(10).is_empty());
        assert_eq!(s.watermark(), Some(10));
        let fired = s.advance(25);
        assert_eq!(fired.iter().map(|f| (f.window.end(), f.count)).collect::<Vec<_>>(), [(20, 1), (20, 1)]);
        assert_eq!((s.open_windows(), s.open_panes(), s.held()), (0, 0, 0));
    }

    #[test]
    fn late_is_relative_to_closed_windows_not_the_watermark() {
        let mut s = WindowState::new(size(10));
        // before any watermark, nothing is late
        assert!(matches!(add(&mut s, "a", -100, 0), Placement::Open(_)));
        s.advance(15);
        // 12 < watermark 15, but its window [10, 20) is still open: counted
        assert!(matches!(add(&mut s, "a", 12, 1), Placement::Open(_)));
        match add(&mut s, "a", 9, 2) {
            Placement::Late { window, key, input } => {
                assert_eq!((window.start(), window.end()), (0, 10));
                assert_eq!(key, values!["a"]);
                assert_eq!(input, Some(2));
            }
            p => panic!("expected late, got {p:?}"),
        }
        assert_eq!(s.held(), 1);
        let fired = s.flush();
        assert_eq!(fired.len(), 1);
        assert_eq!(fired[0].inputs, vec![1]);
        assert!(matches!(add(&mut s, "a", i64::MAX, 3), Placement::Late { .. }), "after flush everything is late");
    }

    #[test]
    fn failed_fold_records_nothing() {
        let mut s: WindowState<u64, u32> = WindowState::new(size(10));
        let r = s.add(values!["a"], 1, Some(0), || 0, |_| Err("bad"));
        assert_eq!(r, Err("bad"));
        assert_eq!((s.open_windows(), s.open_panes(), s.held()), (0, 0, 0));
        add(&mut s, "a", 1, 1);
        let r = s.add(values!["b"], 2, Some(2), || 0, |_| Err("bad"));
        assert_eq!(r, Err("bad"));
        let r = s.add(values!["a"], 3, Some(3), || 0, |_| Err("bad"));
        assert_eq!(r, Err("bad"));
        assert_eq!((s.open_windows(), s.open_panes(), s.held()), (1, 1, 1));
        add(&mut s, "b", 4, 4);
        let fired = s.flush();
        assert_eq!(fired.iter().map(|f| (f.acc, f.inputs.clone())).collect::<Vec<_>>(), [(1, vec![1]), (1, vec![4])]);
    }

    #[test]
    fn keys_compare_by_value_floats_by_bits() {
        let mut s: WindowState<u64, ()> = WindowState::new(size(10));
        let mut put = |k: Values| s.add(k, 0, None, || 0, incr).unwrap();
        put(values!["x", 1i64]);
        put(values!["x", 1i64]);
        put(values!["x", 1u64]); // another type, another key
        put(values![f64::NAN]);
        put(values![f64::NAN]);
        put(Values::new());
        let fired = s.flush();
        assert_eq!(fired.iter().map(|f| f.acc).collect::<Vec<_>>(), [2, 1, 2, 1]);
        assert!(fired.iter().all(|f| f.inputs.is_empty()));
    }

    #[test]
    fn aggregates() {
        let t = Tuple::new_for_test("s", "default", &["n", "u", "w"], values![-5i64, u64::MAX, "x"]);
        let mut n = Count.init();
        Count.add(&mut n, &t).unwrap();
        Count.add(&mut n, &t).unwrap();
        assert_eq!(Count.emit(&n), values![2u64]);
        let sum = Sum::new("n");
        let mut acc = sum.init();
        sum.add(&mut acc, &t).unwrap();
        sum.add(&mut acc, &t).unwrap();
        assert_eq!(sum.emit(&acc), values![-10i64]);
        let big = Sum::new("u");
        let mut acc = big.init();
        big.add(&mut acc, &t).unwrap();
        assert_eq!(acc, i128::from(u64::MAX));
        assert_eq!(big.emit(&acc), values![i64::MAX], "saturates when emitted");
        let bad = Sum::new("w");
        let mut acc = bad.init();
        let e = bad.add(&mut acc, &t).unwrap_err().to_string();
        assert!(e.contains("`w`") && e.contains("not int"), "{e}");
        assert_eq!(acc, 0);
        assert!(Sum::new("missing").add(&mut acc, &t).unwrap_err().to_string().contains("unknown field"));
    }

    #[test]
    fn config_validates_and_names_fields() {
        let w = TumblingWindowConfig::new(1_000, "ts", &["user", "page"]).build(Count).unwrap();
        assert_eq!(w.output_fields(), ["user", "page", "window_start_ms", "window_end_ms", "count"]);
        assert_eq!(w.late_fields(), ["user", "page", "event_ms", "window_start_ms", "window_end_ms"]);
        assert_eq!(TumblingWindowConfig::new(0, "ts", &[]).build(Count).unwrap_err(), WindowError::ZeroSize);
        assert_eq!(TumblingWindowConfig::new(1, "", &[]).build(Count).unwrap_err(), WindowError::NoTimeField);
        let e = TumblingWindowConfig::new(1, "ts", &["count"]).build(Count).unwrap_err();
        assert_eq!(e, WindowError::DuplicateField { stream: "default".into(), field: "count".into() });
        let e = TumblingWindowConfig::new(1, "ts", &["event_ms"]).build(Count).unwrap_err();
        assert_eq!(e, WindowError::DuplicateField { stream: "late".into(), field: "event_ms".into() });
        // a dropped late stream is not declared, so its fields do not matter
        assert!(TumblingWindowConfig::new(1, "ts", &["event_ms"]).late(LatePolicy::Drop).build(Count).is_ok());
        let mut c = TumblingWindowConfig::new(1, "ts", &[]);
        c.late_stream = "default".into();
        assert_eq!(c.build(Count).unwrap_err(), WindowError::SameStream { stream: "default".into() });
        assert!(!WindowError::ZeroSize.is_retryable());
        assert_eq!(WindowError::ZeroSize.domain(), ErrorDomain::User);
    }

    #[test]
    fn config_serde_defaults_and_rejects_unknown_fields() {
        let c: TumblingWindowConfig =
            serde_json::from_str(r#"{"size_ms": 60000, "time_field": "arrival_ms", "key_fields": ["user"]}"#).unwrap();
        assert_eq!(c, TumblingWindowConfig::new(60_000, "arrival_ms", &["user"]));
        let c: TumblingWindowConfig =
            serde_json::from_str(r#"{"size_ms": 5, "time_field": "t", "late": "drop", "ack": "on_receive"}"#).unwrap();
        assert_eq!((c.late, c.ack), (LatePolicy::Drop, AckMode::OnReceive));
        let e = serde_json::from_str::<TumblingWindowConfig>(r#"{"size_ms": 5, "time_field": "t", "sise": 1}"#);
        assert!(e.unwrap_err().to_string().contains("sise"));
    }

    mod props {
        use std::collections::HashMap;

        use proptest::prelude::*;

        use super::*;

        #[derive(Clone, Debug)]
        enum Op {
            Event { key: u8, ts: i64 },
            Watermark(u64),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                3 => (0u8..4, -300i64..1_500).prop_map(|(key, ts)| Op::Event { key, ts }),
                1 => (0u64..1_600).prop_map(Op::Watermark),
            ]
        }

        /// `[start, end)` of the window of `ts`, from the definition: the multiple of `size` at or
        /// below `ts`.
        fn model_window(ts: i64, size: u64) -> (i128, i128) {
            let (ts, size) = (i128::from(ts), i128::from(size));
            let mut start = ts - ts % size;
            if start > ts {
                start -= size;
            }
            (start, start + size)
        }

        fn model_closed(ts: i64, size: u64, wm: u64) -> bool {
            model_window(ts, size).1 <= i128::from(wm)
        }

        fn check_fired(
            fired: Vec<Fired<u64, usize>>,
            wm: u64,
            events: &[(u8, i64)],
            seen: &mut HashMap<usize, (u8, Window)>,
            last_end: &mut i128,
            size: u64,
        ) -> Result<(), TestCaseError> {
            for f in fired {
                // the oracle is written out here, not Window::closed_by
                prop_assert!(
                    wm == u64::MAX || f.window.end() <= i128::from(wm),
                    "{:?} fired at watermark {}",
                    f.window,
                    wm
                );
                prop_assert!(f.window.end() >= *last_end, "windows fire in end order");
                *last_end = f.window.end();
                prop_assert_eq!(f.acc as usize, f.inputs.len());
                prop_assert_eq!(f.count as usize, f.inputs.len());
                for id in f.inputs {
                    let (key, ts) = events[id];
                    prop_assert_eq!((f.window.start(), f.window.end()), model_window(ts, size));
                    prop_assert_eq!(&f.key, &values![u64::from(key)]);
                    prop_assert!(seen.insert(id, (key, f.window)).is_none(), "event {} fired twice", id);
                }
            }
            Ok(())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Every event is either late (its window already closed when it arrived) or counted
            /// in exactly one fired pane: its own key and window. No window fires before the
            /// watermark reaches its end, and every window is fired as soon as it does.
            #[test]
            fn every_event_in_exactly_one_window_never_early(size_ms in 1u64..200, ops in prop::collection::vec(op(), 0..200)) {
                let mut s: WindowState<u64, usize> = WindowState::new(size(size_ms));
                let mut events: Vec<(u8, i64)> = Vec::new();
                let mut late = Vec::new();
                let mut seen: HashMap<usize, (u8, Window)> = HashMap::new();
                let mut wm: Option<u64> = None;
                let mut last_end = i128::MIN;
                for op in ops {
                    match op {
                        Op::Event { key, ts } => {
                            let id = events.len();
                            events.push((key, ts));
                            let expect_late = wm.is_some_and(|w| model_closed(ts, size_ms, w));
                            let p = s.add(values![u64::from(key)], ts, Some(id), || 0, incr).unwrap();
                            match p {
                                Placement::Late { input, .. } => {
                                    prop_assert!(expect_late, "event {} at {} wrongly late at {:?}", id, ts, wm);
                                    prop_assert_eq!(input, Some(id));
                                    late.push(id);
                                }
                                Placement::Open(w) => {
                                    prop_assert!(!expect_late, "late event {} at {} accepted at {:?}", id, ts, wm);
                                    prop_assert_eq!((w.start(), w.end()), model_window(ts, size_ms));
                                }
                            }
                        }
                        Op::Watermark(w) => {
                            let fired = s.advance(w);
                            if wm.is_none_or(|c| w > c) {
                                wm = Some(w);
                            } else {
                                prop_assert!(fired.is_empty(), "a watermark not above {:?} fired windows", wm);
                            }
                            let current = wm.unwrap_or(0);
                            prop_assert_eq!(s.watermark(), wm);
                            check_fired(fired, current, &events, &mut seen, &mut last_end, size_ms)?;
                            // nothing left open that the watermark closed
                            for (id, &(key, ts)) in events.iter().enumerate() {
                                if !late.contains(&id) && !seen.contains_key(&id) {
                                    prop_assert!(!model_closed(ts, size_ms, current),
                                        "event {} (key {}, ts {}) still open at watermark {}", id, key, ts, current);
                                }
                            }
                        }
                    }
                }
                check_fired(s.flush(), u64::MAX, &events, &mut seen, &mut last_end, size_ms)?;
                prop_assert_eq!(s.held(), 0);
                prop_assert_eq!(s.open_panes(), 0);
                prop_assert_eq!(seen.len() + late.len(), events.len(), "every event fired once or was late");
                for id in late {
                    prop_assert!(!seen.contains_key(&id));
                }
            }
        }
    }
}
