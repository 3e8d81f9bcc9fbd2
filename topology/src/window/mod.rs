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
//! `max_spout_pending`. The other side of that bound: a spout task at `max_spout_pending` is not
//! called, so it advances neither its data nor its watermark. Size `max_spout_pending` above the
//! number of tracked tuples a spout task emits over one window plus the watermark lag, and
//! `message_timeout_ms` above the window size plus the lag (held inputs that time out are
//! replayed, and arrive late). An aggregate anchored to `n` inputs carries up to `n` ack-tree
//! anchors. For windows spanning more inputs than that allows, use [`AckMode::OnReceive`].
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

mod aggregate;
mod bolt;
mod bounds;
mod config;
mod state;

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
