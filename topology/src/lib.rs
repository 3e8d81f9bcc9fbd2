//! Squall's topology engine: Storm-style spouts and bolts on tokio, with at-least-once acking,
//! in-band watermarks and drain.
//!
//! # Layout
//!
//! - [`value`]: [`Value`] and [`Values`], the dynamically typed fields of a tuple.
//! - [`tuple`](mod@tuple): [`Tuple`], [`Fields`], typed accessors and [`TupleError`].
//! - [`typed`]: serde records to and from tuples: [`to_values`], [`Tuple::decode`] /
//!   [`from_tuple`], [`fields_of`] ([`TypedError`]).
//! - [`component`]: the [`Spout`] and [`Bolt`] traits, [`TaskContext`], [`Watermark`],
//!   [`ComponentError`].
//! - [`output`]: [`SpoutOutput`] and [`BoltOutput`], where components emit, hold inputs
//!   ([`AckHandle`]), schedule wake-ups ([`Timer`]) and flush; [`Inputs`] for
//!   [`Bolt::execute_batch`]; [`EmitError`]. Routing and send buffers are internal
//!   (`output::route`: one send/flush path for both executors, batches of at most `batch_size`).
//!   A [`Record`] (any `Serialize` type) emitted with [`BoltOutput::emit_record`] travels as
//!   itself in a typed batch (`output::records`), read back by reference with
//!   [`Inputs::for_each_record`]: the fast path, with no per-tuple values built or dropped.
//! - [`grouping`]: the [`Grouping`]/[`Router`] strategy traits and the built-in groupings.
//! - [`builder`]: [`TopologyBuilder`], typed handles ([`ComponentId`], [`StreamId`], [`Source`])
//!   and validation ([`BuildError`]) into a [`Topology`]; direct streams are declared
//!   (`direct_output`) and only direct groupings subscribe to them.
//! - [`config`]: [`TopologyConfig`] and per-component [`ComponentConfig`] (serde, validated).
//! - `acker` (private): Storm's XOR ack trees, kept by the spout task that owns each root.
//! - `executor` (private): one tokio task per component instance, bounded channels, backpressure,
//!   panic isolation of every hook, cooperative yielding.
//! - [`metrics`]: per-component counters ([`TopologyMetrics`]) and the components' own
//!   [`Counter`]s and [`Histogram`]s ([`TaskContext::counter`], [`TaskContext::histogram`]).
//! - [`local`]: the in-process runner, [`run_local`] / [`LocalCluster`] and [`RunningTopology`].
//! - [`testing`]: [`BoltHarness`](testing::BoltHarness) and [`SpoutHarness`](testing::SpoutHarness),
//!   which drive one component through the engine's task code to unit-test it: feed tuples,
//!   capture emits, acks, fails and watermarks, without a topology.
//! - [`window`]: event-time tumbling, sliding and session windows fired by the low watermark,
//!   with allowed lateness.
//!
//! # Example
//!
//! A spout of sentences, a bolt that splits them into words, and a counting bolt that receives
//! each word on one task (fields grouping). Every sentence is tracked: it is acked to the spout
//! once all its words have been counted.
//!
//! ```
//! use std::collections::HashMap;
//! use squall_topology::*;
//!
//! struct Sentences { left: u32 }
//! impl Spout for Sentences {
//!     type MsgId = u32;
//!     async fn next_tuple(&mut self, out: &mut SpoutOutput<u32>) -> Result<(), ComponentError> {
//!         if self.left > 0 {
//!             self.left -= 1;
//!             out.emit_tracked(["the cat and the hat"], self.left)?;
//!         }
//!         Ok(())
//!     }
//! }
//!
//! struct Split;
//! impl Bolt for Split {
//!     async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
//!         for w in t.get_str("sentence")?.split(' ') {
//!             out.emit([w])?; // anchored to `t`
//!         }
//!         Ok(())
//!     }
//! }
//!
//! #[derive(Default)]
//! struct Count(HashMap<String, u64>);
//! impl Bolt for Count {
//!     async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
//!         *self.0.entry(t.get_str("word")?.to_owned()).or_default() += 1;
//!         Ok(())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let mut b = TopologyBuilder::new("word-count");
//! b.set_spout("sentences", 1, |_| Sentences { left: 100 }).fields(&["sentence"]);
//! b.set_bolt("split", 2, |_| Split).shuffle_grouping("sentences").fields(&["word"]);
//! b.set_bolt("count", 2, |_| Count::default()).fields_grouping("split", &["word"]);
//! let topology = b.build().expect("valid topology");
//!
//! let running = run_local(topology, TopologyConfig::default()).expect("valid config");
//! while running.metrics().component("sentences").map_or(0, |m| m.acked) < 100 {
//!     tokio::time::sleep(std::time::Duration::from_millis(1)).await;
//! }
//! assert_eq!(running.metrics().component("count").unwrap().executed, 500);
//! running.drain().await.unwrap();
//! running.wait().await.unwrap();
//! # }
//! ```

mod acker;
pub mod builder;
pub mod component;
pub mod config;
mod executor;
pub mod grouping;
pub mod local;
pub mod metrics;
pub mod output;
pub mod testing;
pub mod tuple;
pub mod typed;
pub mod value;
pub mod window;

pub use builder::{BoltDeclarer, BuildError, ComponentId, Source, SpoutDeclarer, StreamId, Topology, TopologyBuilder};
pub use component::{Bolt, ComponentError, ErrorDomain, Spout, TaskContext, Wakeup, Watermark};
pub use config::{ComponentConfig, ConfigError, TopologyConfig};
pub use executor::TopologyError;
pub use grouping::{All, Direct, FieldsGrouping, Global, Grouping, LocalOrShuffle, RouteContext, Router, Shuffle};
pub use local::{LocalCluster, RunningTopology, run_local};
pub use metrics::{
    ComponentKind, ComponentMetrics, Counter, Histogram, HistogramSummary, LatencySummary, MetricsHandle,
    TopologyMetrics,
};
pub use output::{AckHandle, BoltOutput, EmitError, Inputs, Record, SpoutOutput, Timer};
pub use tuple::{DEFAULT_STREAM, Fields, Tuple, TupleError};
pub use typed::{IntoValues, TypedError, fields_of, from_tuple, to_values};
pub use value::{Value, Values};
