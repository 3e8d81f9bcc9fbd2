//! Event-time windows: [`WindowBolt`] groups tuples by key into windows of event time
//! (tumbling, sliding or session) and emits one aggregate per (key, window) once the bolt's input
//! low watermark reaches the window's end.
//!
//! # Layout
//!
//! - `aggregate`: [`WindowAggregate`], what is computed per (key, window); ready-made [`Count`]
//!   and [`Sum`].
//! - `bounds`: [`WindowKind`] and [`Window`], the bounds math (alignment, negative timestamps,
//!   the edges of the `i64` range, sliding and session bounds).
//! - `state`: [`WindowState`], the bookkeeping of panes and held inputs, free of engine types
//!   (unit- and property-tested on its own); [`Placement`], [`Fired`], [`HeldInput`].
//! - `config`: [`TumblingWindowConfig`], [`SlidingWindowConfig`], [`SessionWindowConfig`]
//!   (serde, validated, [`WindowError`]) build a [`WindowSpec`]: a cloneable spec that makes the
//!   bolt instances and declares their output streams.
//! - `bolt`: [`WindowBolt`], the [`Bolt`]; [`WindowStats`], counters shared by its tasks.
//!
//! # Semantics
//!
//! - **Tumbling windows** ([`TumblingWindowConfig`]). With size `s`, the window of an event time
//!   `t` is `[start, start + s)` with `start = floor(t / s) * s`: aligned at the epoch, also for
//!   negative times (`t = -1`, `s = 1000` falls in `[-1000, 0)`). The bounds math is exact (in
//!   `i128`); the emitted `window_start_ms`/`window_end_ms` saturate to the `i64` range, which
//!   only matters within one window of `i64::MIN`/`i64::MAX`.
//! - **Sliding windows** ([`SlidingWindowConfig`]). Windows of size `s` start every `d` ms
//!   (`[k * d, k * d + s)`, aligned at the epoch), so each event falls in `s / d` windows. `d`
//!   must be positive, at most `s`, and divide it (so every event is in exactly `s / d` windows),
//!   and `s / d` is at most [`MAX_WINDOWS_PER_EVENT`]. An input is folded once into a fresh
//!   accumulator which is [merged](WindowAggregate::merge) into each of its windows.
//! - **Session windows** ([`SessionWindowConfig`]). Per key, an event at `t` opens the session
//!   `[t, t + gap)`; sessions that overlap merge (an event less than `gap` after the last one
//!   extends the session, and one that bridges two merges them, with
//!   [`WindowAggregate::merge`]). A session is `[first event, last event + gap)`.
//! - **Firing.** A window fires when the input watermark `w` satisfies `w >= end` (no later tuple
//!   can carry an event time below `end`), never before. It emits one tuple per key that had
//!   inputs in it, on the output stream (default `"default"`), with fields
//!   `[key fields.., "window_start_ms", "window_end_ms", aggregate fields..]`. Windows fire in
//!   order of their end; within a window, keys in the order they were first seen. The
//!   [`Watermark::MAX`] sent ahead of a drain fires every open window, and so does `on_drain`.
//! - **Allowed lateness** (`allowed_lateness_ms`, default 0). A fired window is kept until the
//!   watermark reaches `end + allowed_lateness_ms`. An input arriving meanwhile is folded in and
//!   the window fires again at once: a *refinement*, the updated aggregate for the same key and
//!   window, which downstream should take as replacing the earlier one ([`WindowStats::refinements`]
//!   counts them). A late input may extend a kept session past the watermark; it then fires again
//!   at its new end, with its new bounds (the earlier `[start, old end)` is superseded). With 0 a
//!   window is dropped when it fires.
//! - **Late data.** A tuple is late when every window it falls in is past its allowed lateness
//!   (it fired, or would have had it had inputs). A tuple whose time is below the watermark but
//!   whose window is still open is *not* late: it is counted. A sliding input late for some of
//!   its windows but not all is counted in the others only (as Flink does). Before the first
//!   watermark nothing is late. With [`LatePolicy::Stream`] (the default) a late tuple is
//!   emitted on the late stream (default `"late"`) as
//!   `[key fields.., "event_ms", "window_start_ms", "window_end_ms"]` (its last window; for
//!   sessions `[t, t + gap)`), anchored to the input, so a subscriber can correct what was
//!   already emitted; with [`LatePolicy::Drop`] it is acked and only counted. Both count it in
//!   [`WindowStats::late`].
//! - **Acking ([`AckMode::OnFire`], the default: at-least-once).** Each input is held with
//!   [`BoltOutput::defer_ack`] until the *last* window holding it fires (one for tumbling and
//!   session windows, `s / d` for sliding ones). Every window's aggregate is emitted anchored to
//!   the inputs it holds, so a downstream failure of any of them fails (and replays) those
//!   inputs; an input is acked by its last window, or failed there if an earlier window's emit
//!   failed. A refinement is anchored to the inputs that arrived since the window last fired.
//!   The replayed inputs arrive after the watermark passed their windows, so they are *late*
//!   (or, within the allowed lateness, refine the window again: at-least-once may count them
//!   twice): with [`LatePolicy::Stream`] they reach the late stream (still tracked), which is
//!   how at-least-once shows through a window without checkpointed state. With
//!   [`AckMode::OnReceive`] inputs are acked when `execute` returns and aggregates are emitted
//!   unanchored: nothing is held, but a lost aggregate is not replayed (at most once).
//!
//! # Panics in the aggregate
//!
//! A panic in [`WindowAggregate::init`], [`add`](WindowAggregate::add) or
//! [`merge`](WindowAggregate::merge) while an input is folded in records nothing (the state's
//! counters and held inputs stay consistent: a sliding input's accumulator is made for every one
//! of its windows before any window counts or holds it) and the engine fails that input, so a
//! replaying spout sends it again; the accumulator is kept as the panic left it (a panicking
//! `add` should leave it unchanged, as a failing one must). A panic in [`WindowAggregate::emit`] while
//! windows fire is caught per (key, window): that aggregate is not emitted and its held inputs
//! are failed (replayed, arriving late), every other fired window is emitted and acked as usual,
//! and the panic is then resumed so the engine logs and counts it ([`WindowStats::panics`]).
//! Fired panes are never dropped: the state evaluates all of them before it changes anything.
//! With [`AckMode::OnReceive`] the panicking window's aggregate is lost (nothing is held).
//!
//! A firing sends its aggregates as output batches fill, waiting for room downstream: the
//! memory a watermark that closes many windows takes is the fired panes, not also every
//! aggregate buffered until the firing ends.
//!
//! # Memory
//!
//! State is one accumulator per (key, window) kept: windows are kept from their first input
//! until the watermark passes their end plus the allowed lateness, so the state is keys x
//! ((watermark lag + allowed lateness) / size + 1) panes for tumbling windows, keys x
//! ((lag + lateness) / slide + size / slide) for sliding ones, and one per open session (per key
//! at most (lag + lateness) / gap + 1). With [`AckMode::OnFire`] every input is also held until
//! its last window fires (the lateness does not hold inputs), and every held input keeps its
//! spout tuple pending: held inputs are bounded by the sum of the spout tasks'
//! `max_spout_pending`. The other side of that bound: a spout task at `max_spout_pending` emits
//! no data (its watermark moves only through
//! [`Spout::low_watermark`](crate::Spout::low_watermark)), and its watermark stays below the time
//! of the tuples it has yet to emit: a window whose inputs do not all fit in the pending tuples
//! never fires. Size `max_spout_pending` above the number of tracked tuples a spout task emits
//! over one window (for sessions, the longest session) plus the watermark lag, and `message_timeout_ms` above the window size plus
//! the lag (held inputs that time out are replayed, and arrive late). An aggregate anchored to
//! `n` inputs carries up to `n` ack-tree anchors. For windows spanning more inputs than that
//! allows, use [`AckMode::OnReceive`].
//!
//! # Parallelism
//!
//! Each task windows the tuples it receives; subscribe with a fields grouping on (a subset of)
//! the key fields so that every key is aggregated by one task.
//!
//! # Configuration
//!
//! Each config is serde (`deny_unknown_fields`) and validated by `build`, whose errors name the
//! field and the fix:
//!
//! ```
//! use squall_topology::window::{Count, SessionWindowConfig, SlidingWindowConfig, Sum};
//!
//! // hourly sums every 10 minutes, refined for late data up to 5 minutes after each window
//! let sliding: SlidingWindowConfig = serde_json::from_str(
//!     r#"{"size_ms": 3600000, "slide_ms": 600000, "time_field": "ts", "key_fields": ["user"],
//!         "allowed_lateness_ms": 300000}"#,
//! ).unwrap();
//! let spec = sliding.build(Sum::new("bytes")).expect("valid");
//! assert_eq!(spec.output_fields(), ["user", "window_start_ms", "window_end_ms", "sum"]);
//!
//! // clicks per visit: a visit ends after 30 minutes without a click
//! let sessions = SessionWindowConfig::new(1_800_000, "ts", &["user"]).build(Count).expect("valid");
//! assert_eq!(sessions.output_fields(), ["user", "window_start_ms", "window_end_ms", "count"]);
//!
//! let e = SlidingWindowConfig::new(1_000, 300, "ts", &[]).build(Count).unwrap_err();
//! assert!(e.to_string().contains("pick a slide_ms that divides size_ms"));
//! ```
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

mod aggregate;
mod bolt;
mod bounds;
mod config;
mod state;

#[cfg(doc)]
use crate::{Bolt, BoltOutput, Watermark};

pub use aggregate::{Count, Sum, WindowAggregate};
pub use bolt::{TumblingWindow, TumblingWindowBolt, WindowBolt, WindowSpec, WindowStats};
pub use bounds::{MAX_WINDOWS_PER_EVENT, Window, WindowKind};
pub use config::{AckMode, LatePolicy, SessionWindowConfig, SlidingWindowConfig, TumblingWindowConfig, WindowError};
pub use state::{Fired, HeldInput, Placement, WindowState};

/// The emitted field holding a window's start (inclusive), in ms.
pub const WINDOW_START_FIELD: &str = "window_start_ms";
/// The emitted field holding a window's end (exclusive), in ms.
pub const WINDOW_END_FIELD: &str = "window_end_ms";
/// The late-stream field holding the late tuple's event time, in ms.
pub const EVENT_TIME_FIELD: &str = "event_ms";
