//! A test harness for one bolt or one spout: feed it, then look at what it emitted, acked, failed,
//! held and forwarded, without running a topology.
//!
//! The harness drives the component through the engine's own task code and output types: a
//! [`BoltHarness`] hands inputs to the same batch handler the executor uses (so `execute_batch`,
//! the panic isolation, the acking of inputs and the failing of dropped [`AckHandle`]s are the
//! engine's), and reads what the bolt sends downstream and to the acker from real channels. A
//! bolt that passes here behaves the same in a topology.
//!
//! - [`BoltHarness`]: every input fed is *tracked* by default: it gets its own ack-tree root, so
//!   the harness can tell whether the bolt [acked](BoltHarness::acked), [failed](BoltHarness::failed)
//!   or [held](BoltHarness::held) it, and which inputs each [`Emitted`] tuple is
//!   [anchored to](Emitted::anchored_to).
//! - [`SpoutHarness`]: one [`next_tuple`](SpoutHarness::next_tuple) call at a time; the harness is
//!   the downstream, so it [acks](SpoutHarness::ack), [fails](SpoutHarness::fail) or
//!   [times out](SpoutHarness::timeout_all) the spout's tracked tuples, and the spout's pending
//!   trees, `max_spout_pending` and watermark behave as in a topology.
//!
//! Time is tokio's: in a `#[tokio::test(start_paused = true)]` test,
//! [`BoltHarness::advance`] and [`SpoutHarness::advance`] move through timers and message
//! timeouts without waiting.
//!
//! # Layout
//!
//! - `bolt`: [`BoltHarness`] (built with [`BoltHarnessBuilder`]), [`Emitted`], [`InputId`],
//!   [`BoltCounters`].
//! - `spout`: [`SpoutHarness`] (built with [`SpoutHarnessBuilder`]), [`SpoutEmitted`],
//!   [`SpoutCounters`].
//! - here: [`HarnessError`], and what both share: the declared outputs wired to the harness as
//!   their only subscriber, and the sink that receives what the task sends.
//!
//! # Testing a bolt
//!
//! ```
//! use squall_topology::testing::BoltHarness;
//! use squall_topology::*;
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
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut h = BoltHarness::new(Split)
//!     .input("sentences", "default", &["sentence"])
//!     .output("default", &["word"])
//!     .prepare()
//!     .await?;
//! let first = h.execute(["the cat"]).await?;
//! let second = h.execute([42u64]).await?; // not a string: `execute` fails, the input is failed
//!
//! let words: Vec<&str> = h.emitted().iter().map(|e| e.tuple().get_str("word").unwrap()).collect();
//! assert_eq!(words, ["the", "cat"]);
//! assert!(h.emitted().iter().all(|e| e.anchored_to == [first]));
//! assert_eq!(h.acked(), [first]);
//! assert_eq!(h.failed(), [second]);
//! assert_eq!(h.counters().errors, 1);
//! # Ok(()) }
//! ```
//!
//! # Testing a spout
//!
//! ```
//! use squall_topology::testing::SpoutHarness;
//! use squall_topology::*;
//!
//! /// Emits 1, 2, 3 tracked, replays what fails, then finishes.
//! struct Numbers { next: u64, replay: Vec<u64> }
//! impl Spout for Numbers {
//!     type MsgId = u64;
//!     async fn next_tuple(&mut self, out: &mut SpoutOutput<u64>) -> Result<(), ComponentError> {
//!         let n = match self.replay.pop() {
//!             Some(n) => n,
//!             None if self.next > 3 => { out.finish(); return Ok(()) }
//!             None => { self.next += 1; self.next - 1 }
//!         };
//!         out.emit_tracked([n], n)?;
//!         out.watermark(n * 1000);
//!         Ok(())
//!     }
//!     async fn fail(&mut self, n: u64) {
//!         self.replay.push(n);
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut h = SpoutHarness::new(Numbers { next: 1, replay: vec![] })
//!     .output("default", &["n"])
//!     .config(ComponentConfig { max_spout_pending: Some(2), ..Default::default() })
//!     .open()
//!     .await?;
//! h.next_tuple().await?;
//! h.next_tuple().await?;
//! assert_eq!(h.pending(), 2);
//! assert!(h.next_tuple().await.is_err(), "at max_spout_pending the engine does not call next_tuple");
//!
//! h.ack(&1).await?;
//! h.fail(&2).await?;
//! assert!(h.ack(&2).await.is_err(), "2 is no longer pending");
//! h.next_tuple().await?; // the replay of 2
//! assert_eq!(h.emitted().iter().map(|e| e.msg_id).collect::<Vec<_>>(), [Some(1), Some(2), Some(2)]);
//! assert_eq!(h.watermarks_out(), [Watermark(1000), Watermark(2000)]);
//!
//! h.ack(&2).await?;
//! h.next_tuple().await?; // 3
//! h.next_tuple().await?; // finishes: the drain marker follows
//! assert!(h.is_finished() && h.drained());
//! assert_eq!(h.acked(), [1, 2]);
//! assert_eq!(h.failed(), [2]);
//! # Ok(()) }
//! ```
//!
//! # What the harness is not
//!
//! One task, one upstream: [`BoltHarness::watermark`] is the bolt's combined input watermark
//! (the executor's minimum over upstream tasks is not simulated), and every declared output
//! stream has exactly one subscriber, the harness (direct streams have as many tasks as
//! declared with [`BoltHarnessBuilder::direct_output`]). The engine keeps tuples in order per
//! receiving task only; so does the harness: [`BoltHarness::emitted`] is in emit order, except
//! that direct emits are listed after the plain emits of the same harness call.

/// The declarations both harness builders share (they hold a `decls: Decls`).
macro_rules! declaration_setters {
    ($default_id:literal) => {
        #[doc = concat!("The component's id (default `\"", $default_id, "\"`).")]
        pub fn component_id(mut self, id: &str) -> Self {
            self.decls.component = id.to_owned();
            self
        }

        /// An output stream (as the declarer's `output`).
        pub fn output<T: AsRef<str>>(mut self, stream: &str, fields: &[T]) -> Self {
            self.decls.output(stream, fields, None);
            self
        }

        /// A direct output stream (as the declarer's `direct_output`) whose subscriber has
        /// `tasks` tasks: `emit_direct` to a task `>= tasks` fails as in the topology.
        pub fn direct_output<T: AsRef<str>>(mut self, stream: &str, fields: &[T], tasks: usize) -> Self {
            self.decls.output(stream, fields, Some(tasks.max(1)));
            self
        }

        /// The component's configuration (its tick, its own `max_spout_pending`, its settings).
        pub fn config(mut self, config: ComponentConfig) -> Self {
            self.decls.config = config;
            self
        }

        /// The topology's configuration (`batch_size`, `acking`, `message_timeout_ms`,
        /// `max_spout_pending`, `start_active`, channel capacities, ...).
        pub fn topology_config(mut self, config: TopologyConfig) -> Self {
            self.decls.topology = config;
            self
        }
    };
}

mod bolt;
mod spout;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::acker::AckBatch;
use crate::component::{TaskContext, Wakeup};
use crate::config::{ComponentConfig, ConfigError, TopologyConfig};
use crate::executor::TopologyError;
use crate::grouping::{AnyRouter, Direct, Grouping, RouteContext, Shuffle};
use crate::output::route::BatchPool;
use crate::output::route::{Envelope, Message, OutStream, Outbox, Route, Target};
use crate::tuple::{Fields, StreamMeta};
use crate::typed::TypedError;

pub use bolt::{BoltCounters, BoltHarness, BoltHarnessBuilder, Emitted, InputId};
pub use spout::{SpoutCounters, SpoutEmitted, SpoutHarness, SpoutHarnessBuilder};

#[cfg(doc)]
use crate::output::AckHandle;

/// The topology-wide task id the harness sends from (the component under test is task 0).
const UPSTREAM: usize = 1;
/// The name of the harness as a subscriber (in emit errors).
const SUBSCRIBER: &str = "harness";

/// A mistake in using the harness, or a failure of the component that stops its task.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// The topology or component configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The values fed did not encode (a typed record, see [`crate::typed`]).
    #[error(transparent)]
    Typed(#[from] TypedError),
    /// The component failed in a way that stops its task in a topology: `prepare`/`open`
    /// returned an error or panicked, or `next_tuple` returned a fatal error or panicked.
    #[error(transparent)]
    Task(#[from] TopologyError),
    /// `execute` without a declared input stream.
    #[error("bolt `{component}` has no input declared: declare one with `.input(component, stream, &[fields..])`")]
    NoInput {
        /// The component under test.
        component: String,
    },
    /// `execute_on` named an input stream that was not declared.
    #[error("bolt `{component}` has no input `{source_component}`/`{stream}` declared; declared inputs: {declared:?}")]
    UnknownInput {
        /// The component under test.
        component: String,
        /// The source component named.
        source_component: String,
        /// The stream named.
        stream: String,
        /// The declared inputs, as `component/stream`.
        declared: Vec<String>,
    },
    /// An input with more or fewer values than its stream declares fields (the upstream's emit
    /// would have failed).
    #[error("input on stream `{stream}` of `{source_component}` has {got} values, but the stream declares {fields:?}")]
    FieldCount {
        /// The source component.
        source_component: String,
        /// The stream.
        stream: String,
        /// The values given.
        got: usize,
        /// The declared fields.
        fields: Vec<String>,
    },
    /// The task no longer runs: it drained, was cleaned up or closed, or its cancellation
    /// token was cancelled.
    #[error("`{component}` is {state}: the engine calls no more hooks")]
    Stopped {
        /// The component under test.
        component: String,
        /// `drained`, `cleaned up`, `closed` or `cancelled`.
        state: &'static str,
    },
    /// `next_tuple` at `max_spout_pending`: the engine would not call it.
    #[error(
        "spout `{component}` has {pending} tracked tuples pending, its max_spout_pending: the engine would not call next_tuple; ack, fail or time out some first"
    )]
    AtMaxPending {
        /// The component under test.
        component: String,
        /// Tuples pending.
        pending: usize,
    },
    /// `next_tuple` while the spout is deactivated.
    #[error("spout `{component}` is deactivated: the engine would not call next_tuple")]
    Inactive {
        /// The component under test.
        component: String,
    },
    /// `ack` or `fail` of a message id with no pending tuple (never emitted tracked, or already
    /// acked, failed or timed out): the engine would not call the spout.
    #[error("spout `{component}` has no pending tuple with message id {msg}")]
    NotPending {
        /// The component under test.
        component: String,
        /// The message id, `Debug`-formatted.
        msg: String,
    },
}

#[derive(Clone)]
struct OutputDecl {
    stream: String,
    fields: Fields,
    /// The direct subscriber's task count, for a direct stream.
    direct: Option<usize>,
}

/// Declarations shared by both builders.
#[derive(Clone)]
struct Decls {
    component: String,
    outputs: Vec<OutputDecl>,
    config: ComponentConfig,
    topology: TopologyConfig,
}

impl Decls {
    fn new(component: &str) -> Self {
        Decls {
            component: component.to_owned(),
            outputs: Vec::new(),
            config: ComponentConfig::default(),
            topology: TopologyConfig::default(),
        }
    }

    fn output<S: AsRef<str>>(&mut self, stream: &str, fields: &[S], direct: Option<usize>) {
        self.outputs.push(OutputDecl { stream: stream.to_owned(), fields: Fields::new(fields), direct });
    }

    fn validate(&self) -> Result<(), HarnessError> {
        self.topology.validate()?;
        self.config.validate()?;
        Ok(())
    }

    fn context(&self) -> TaskContext {
        TaskContext {
            topology: Arc::from("test"),
            component: Arc::from(self.component.as_str()),
            task_index: 0,
            parallelism: 1,
            task_id: 0,
            config: Arc::new(self.topology.clone()),
            component_config: Arc::new(self.config.clone()),
            metrics: Arc::default(),
            wakeup: Wakeup::default(),
            cancel: CancellationToken::new(),
            tracker: TaskTracker::new(),
        }
    }

    /// The component's outbox, subscribed by the harness: every plain stream to target 0, task
    /// `k` of the direct streams to target `1 + k`, one channel per target.
    fn outbox(&self, ctx: &TaskContext) -> (Outbox, Vec<mpsc::Receiver<Envelope>>) {
        let component: Arc<str> = ctx.component.clone();
        let direct_tasks = self.outputs.iter().filter_map(|o| o.direct).max().unwrap_or(0);
        let streams = self
            .outputs
            .iter()
            .map(|o| {
                let meta = StreamMeta {
                    component: component.clone(),
                    task: ctx.task_index,
                    stream: Arc::from(o.stream.as_str()),
                    fields: o.fields.clone(),
                }
                .intern();
                let (grouping, router, tasks) = match o.direct {
                    None => {
                        let ctx = RouteContext { source_task: ctx.task_index, target_tasks: 1 };
                        (Shuffle.name(), AnyRouter::new(&Shuffle, &o.fields, ctx), vec![0])
                    }
                    Some(n) => {
                        let ctx = RouteContext { source_task: ctx.task_index, target_tasks: n };
                        (Direct.name(), AnyRouter::new(&Direct, &o.fields, ctx), (1..=n).collect())
                    }
                };
                OutStream {
                    meta,
                    direct: o.direct.is_some(),
                    record_type: None,
                    routes: vec![Route { consumer: Arc::from(SUBSCRIBER), grouping, router, tasks }],
                }
            })
            .collect();
        let cfg = &self.topology;
        let (targets, rxs) = (0..=direct_tasks)
            .map(|_| {
                let (tx, rx) = mpsc::channel(cfg.channel_capacity);
                let pool = Arc::new(BatchPool::new(cfg.batch_size, cfg.channel_capacity + 8));
                (Target { tx, buf: pool.take(), pool, rec: None }, rx)
            })
            .unzip();
        (Outbox::new(ctx.task_id, component, streams, targets, cfg.batch_size), rxs)
    }
}

/// What the component under test sent: the receiving ends of its data and ack channels.
struct Sink {
    data: Vec<mpsc::Receiver<Envelope>>,
    acks: Option<mpsc::Receiver<AckBatch>>,
    /// (target, message) in the order received (per target: in the order sent).
    msgs: Vec<(usize, Message)>,
    ack_batches: Vec<AckBatch>,
}

impl Sink {
    fn receive(&mut self, cx: &mut Context<'_>) {
        for (target, rx) in self.data.iter_mut().enumerate() {
            while let Poll::Ready(Some(env)) = rx.poll_recv(cx) {
                self.msgs.push((target, env.msg));
            }
        }
        if let Some(rx) = &mut self.acks {
            while let Poll::Ready(Some(batch)) = rx.poll_recv(cx) {
                self.ack_batches.push(batch);
            }
        }
    }

    /// Runs a task handler while receiving what it sends, so a send that waits for room (the
    /// engine's backpressure) proceeds as it would with a live subscriber.
    async fn drive<F: Future>(&mut self, fut: F) -> F::Output {
        let mut fut = pin!(fut);
        std::future::poll_fn(|cx| {
            let r = fut.as_mut().poll(cx);
            self.receive(cx);
            r
        })
        .await
    }
}

/// The tuples a batch of records (emitted with `emit_record`) encodes into, as a downstream
/// task reading tuples gets them. A record that cannot be a tuple of its stream panics with the
/// reason: in a test that is the failure to see (a topology fails that input downstream).
pub(crate) fn records_as_tuples(records: &dyn crate::output::records::RecordBuf) -> crate::output::route::Batch {
    let (tuples, failed) = records.to_tuples(0);
    if let Some((_, reason)) = failed.first() {
        panic!("test harness: emitted {reason}");
    }
    tuples
}
