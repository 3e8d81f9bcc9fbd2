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

use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::acker::{self, AckBatch, EdgeRng};
use crate::component::{Bolt, Spout, TaskContext, Wakeup, Watermark};
use crate::config::{ComponentConfig, ConfigError, TopologyConfig};
use crate::executor::bolt::BoltTask;
use crate::executor::spout::SpoutTask;
use crate::executor::{BoltWiring, SpoutCommand, SpoutWiring, TopologyError};
use crate::grouping::{AnyRouter, Direct, RouteContext, Shuffle};
use crate::metrics::TaskMetrics;
use crate::output::route::{Envelope, Message, OutStream, Outbox, Route, Target};
use crate::output::{BoltOutput, Timer};
use crate::tuple::{Anchors, Fields, StreamMeta, Tuple, TupleError};
use crate::typed::{IntoValues, TypedError};
use crate::value::Values;

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

/// A tracked input fed to a [`BoltHarness`], in feeding order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InputId(pub u64);

impl fmt::Display for InputId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "input #{}", self.0)
    }
}

/// A tuple a bolt emitted, as the harness (its only subscriber) received it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Emitted {
    /// The stream it was emitted on.
    pub stream: String,
    /// Its values.
    pub values: Values,
    /// The tracked inputs it is anchored to (its ack-tree roots), in anchor order; empty for
    /// an unanchored emit.
    pub anchored_to: Vec<InputId>,
    /// The task of an `emit_direct`; `None` for a plain emit.
    pub direct_task: Option<usize>,
    tuple: Tuple,
}

impl Emitted {
    /// The tuple as a subscriber receives it (typed accessors by field name).
    pub fn tuple(&self) -> &Tuple {
        &self.tuple
    }

    /// Decodes the tuple into a serde type (see [`crate::typed`]).
    pub fn decode<'de, T: serde::Deserialize<'de>>(&'de self) -> Result<T, TupleError> {
        self.tuple.decode()
    }
}

/// A tuple a spout emitted.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SpoutEmitted<M> {
    /// The stream it was emitted on.
    pub stream: String,
    /// Its values.
    pub values: Values,
    /// The message id of a tracked emit; `None` when untracked (and with acking disabled,
    /// where the engine acks a tracked emit as soon as it is sent).
    pub msg_id: Option<M>,
    /// The task of an `emit_direct`; `None` for a plain emit.
    pub direct_task: Option<usize>,
    tuple: Tuple,
    /// The tuple's (root, edge) in its ack tree.
    tree: Option<(u64, u64)>,
}

impl<M> SpoutEmitted<M> {
    /// The tuple as a subscriber receives it.
    pub fn tuple(&self) -> &Tuple {
        &self.tuple
    }

    /// Decodes the tuple into a serde type (see [`crate::typed`]).
    pub fn decode<'de, T: serde::Deserialize<'de>>(&'de self) -> Result<T, TupleError> {
        self.tuple.decode()
    }
}

/// A bolt task's counters, as the engine publishes them in its metrics (plus panics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BoltCounters {
    /// Inputs executed (tracked or not).
    pub executed: u64,
    /// Tuples emitted.
    pub emitted: u64,
    /// Inputs acked (tracked or not).
    pub acked: u64,
    /// Inputs failed (tracked or not).
    pub failed: u64,
    /// Errors returned and panics raised by hooks.
    pub errors: u64,
    /// Panics raised by hooks (also counted in `errors`).
    pub panics: u64,
}

/// A spout task's counters, as the engine publishes them in its metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SpoutCounters {
    /// Tuples emitted.
    pub emitted: u64,
    /// Trees delivered to `Spout::ack`.
    pub acked: u64,
    /// Trees delivered to `Spout::fail` (timeouts included).
    pub failed: u64,
    /// Trees failed by the message timeout.
    pub timed_out: u64,
    /// Retryable `next_tuple` errors and panics of the hooks a spout task survives.
    pub errors: u64,
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
                let (router, tasks) = match o.direct {
                    None => {
                        let ctx = RouteContext { source_task: ctx.task_index, target_tasks: 1 };
                        (AnyRouter::new(&Shuffle, &o.fields, ctx), vec![0])
                    }
                    Some(n) => {
                        let ctx = RouteContext { source_task: ctx.task_index, target_tasks: n };
                        (AnyRouter::new(&Direct, &o.fields, ctx), (1..=n).collect())
                    }
                };
                OutStream {
                    meta,
                    direct: o.direct.is_some(),
                    routes: vec![Route { consumer: Arc::from(SUBSCRIBER), router, tasks }],
                }
            })
            .collect();
        let cfg = &self.topology;
        let (targets, rxs) = (0..=direct_tasks)
            .map(|_| {
                let (tx, rx) = mpsc::channel(cfg.channel_capacity);
                (Target { tx, buf: Vec::with_capacity(cfg.batch_size) }, rx)
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

/// Builds a [`BoltHarness`]: the bolt's inputs and outputs, as a topology would declare them.
pub struct BoltHarnessBuilder<B> {
    bolt: B,
    decls: Decls,
    inputs: Vec<(String, String, Fields)>,
}

impl<B: Bolt> BoltHarnessBuilder<B> {
    /// The bolt's component id (default `"bolt"`).
    pub fn component_id(mut self, id: &str) -> Self {
        self.decls.component = id.to_owned();
        self
    }

    /// An input stream: tuples of `stream` from `component`, with `fields`. The first one
    /// declared is what [`BoltHarness::execute`] feeds.
    pub fn input<S: AsRef<str>>(mut self, component: &str, stream: &str, fields: &[S]) -> Self {
        self.inputs.push((component.to_owned(), stream.to_owned(), Fields::new(fields)));
        self
    }

    /// An output stream (as `BoltDeclarer::output`).
    pub fn output<S: AsRef<str>>(mut self, stream: &str, fields: &[S]) -> Self {
        self.decls.output(stream, fields, None);
        self
    }

    /// A direct output stream (as `BoltDeclarer::direct_output`) whose subscriber has `tasks`
    /// tasks: `emit_direct` to a task `>= tasks` fails as in the topology.
    pub fn direct_output<S: AsRef<str>>(mut self, stream: &str, fields: &[S], tasks: usize) -> Self {
        self.decls.output(stream, fields, Some(tasks.max(1)));
        self
    }

    /// The component's configuration (its tick, its settings).
    pub fn config(mut self, config: ComponentConfig) -> Self {
        self.decls.config = config;
        self
    }

    /// The topology's configuration (`batch_size`, channel capacities, ...).
    pub fn topology_config(mut self, config: TopologyConfig) -> Self {
        self.decls.topology = config;
        self
    }

    /// Validates the configuration, wires the bolt's output to the harness and runs
    /// `Bolt::prepare`. An error or a panic in `prepare` is [`HarnessError::Task`].
    pub async fn prepare(self) -> Result<BoltHarness<B>, HarnessError> {
        let BoltHarnessBuilder { bolt, decls, inputs } = self;
        decls.validate()?;
        let ctx = decls.context();
        let (outbox, data) = decls.outbox(&ctx);
        let (ack_tx, ack_rx) = mpsc::channel(decls.topology.ack_channel_capacity);
        // the executor's input channel: unused, the harness calls the task's handlers itself
        let (_, rx) = mpsc::channel(1);
        let wiring = BoltWiring {
            outbox,
            rx,
            upstream: vec![UPSTREAM],
            ack_txs: Arc::from(vec![ack_tx]),
            metrics: Arc::new(TaskMetrics::default()),
            tick: decls.config.tick_interval_ms.map(Duration::from_millis),
        };
        let (mut task, _) = BoltTask::new(bolt, ctx.clone(), wiring);
        let inputs = inputs
            .into_iter()
            .map(|(component, stream, fields)| {
                StreamMeta { component: Arc::from(component), task: 0, stream: Arc::from(stream), fields }.intern()
            })
            .collect();
        let mut sink = Sink { data, acks: Some(ack_rx), msgs: Vec::new(), ack_batches: Vec::new() };
        if !sink.drive(task.prepare()).await? {
            return Err(HarnessError::Stopped { component: decls.component, state: "cancelled" });
        }
        let mut h = BoltHarness {
            task: Some(task),
            sink,
            ctx,
            inputs,
            rng: EdgeRng::from_entropy(0),
            status: Vec::new(),
            emitted: Vec::new(),
            acked: Vec::new(),
            failed: Vec::new(),
            watermarks_out: Vec::new(),
            drained: false,
            counters: BoltCounters::default(),
        };
        h.absorb();
        Ok(h)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Pending,
    Acked,
    Failed,
}

/// Drives one bolt through the engine's task code. See the [module docs](self).
///
/// Every call runs the hooks it triggers to completion, then takes in what the bolt sent:
/// emitted tuples, watermarks and drain markers, and ack-tree updates for the inputs.
pub struct BoltHarness<B: Bolt> {
    /// `None` once cleaned up.
    task: Option<BoltTask<B>>,
    sink: Sink,
    ctx: TaskContext,
    inputs: Vec<&'static StreamMeta>,
    rng: EdgeRng,
    /// The status of each tracked input, by `InputId`.
    status: Vec<Status>,
    emitted: Vec<Emitted>,
    acked: Vec<InputId>,
    failed: Vec<InputId>,
    watermarks_out: Vec<Watermark>,
    drained: bool,
    counters: BoltCounters,
}

impl<B: Bolt> BoltHarness<B> {
    /// Starts declaring a harness for `bolt`; finish with [`BoltHarnessBuilder::prepare`].
    #[allow(clippy::new_ret_no_self)]
    pub fn new(bolt: B) -> BoltHarnessBuilder<B> {
        BoltHarnessBuilder { bolt, decls: Decls::new("bolt"), inputs: Vec::new() }
    }

    /// Executes one tracked input on the first declared input stream; returns its id.
    pub async fn execute(&mut self, values: impl IntoValues) -> Result<InputId, HarnessError> {
        let input = self.first_input()?;
        let ids = self.feed(vec![(input, values.into_values()?)], true).await?;
        Ok(ids[0])
    }

    /// Executes one tracked input on the input stream `stream` of `component`.
    pub async fn execute_on(
        &mut self,
        component: &str,
        stream: &str,
        values: impl IntoValues,
    ) -> Result<InputId, HarnessError> {
        let input = self.input_index(component, stream)?;
        let ids = self.feed(vec![(input, values.into_values()?)], true).await?;
        Ok(ids[0])
    }

    /// Executes one untracked input (outside every ack tree, as from an untracked spout
    /// emit) on the first declared input stream: its emits are unanchored, and ending it only
    /// counts it ([`BoltHarness::counters`]).
    pub async fn execute_untracked(&mut self, values: impl IntoValues) -> Result<(), HarnessError> {
        let input = self.first_input()?;
        self.feed(vec![(input, values.into_values()?)], false).await.map(drop)
    }

    /// Hands tracked inputs on the first declared input stream to the bolt as one batch
    /// (`Bolt::execute_batch`, as the executor does with one channel message); returns their
    /// ids in order.
    pub async fn execute_batch<V: IntoValues>(
        &mut self,
        inputs: impl IntoIterator<Item = V>,
    ) -> Result<Vec<InputId>, HarnessError> {
        let input = self.first_input()?;
        let batch =
            inputs.into_iter().map(|v| Ok((input, v.into_values()?))).collect::<Result<Vec<_>, TypedError>>()?;
        self.feed(batch, true).await
    }

    /// The bolt's input watermark advances to `wm`: `Bolt::on_watermark`, then the watermark
    /// is forwarded ([`BoltHarness::watermarks_out`]). A watermark not above the last one is
    /// ignored, as in the executor.
    pub async fn watermark(&mut self, wm: Watermark) -> Result<(), HarnessError> {
        let task = running(&mut self.task, self.drained, &self.ctx)?;
        let r = self.sink.drive(task.on_watermark(UPSTREAM, wm)).await;
        self.absorb();
        r.map_err(|_| self.cancelled())
    }

    /// Every input drained: `Bolt::on_drain`, then the +infinity watermark (unless forwarded
    /// already) and the drain marker are forwarded. The task then stops: only
    /// [`BoltHarness::cleanup`] may follow.
    pub async fn drain(&mut self) -> Result<(), HarnessError> {
        let task = running(&mut self.task, self.drained, &self.ctx)?;
        let r = self.sink.drive(task.on_drain_marker(UPSTREAM)).await;
        self.absorb();
        r.map(drop).map_err(|_| self.cancelled())
    }

    /// Fires the bolt's tick (`Bolt::on_timer(Timer::Tick)`) now, whether or not the component
    /// has a `tick_interval_ms`.
    pub async fn tick(&mut self) -> Result<(), HarnessError> {
        let task = running(&mut self.task, self.drained, &self.ctx)?;
        let r = self
            .sink
            .drive(async {
                task.on_timer(Timer::Tick).await;
                task.out.flush_inner().await
            })
            .await;
        self.absorb();
        r.map_err(|_| self.cancelled())
    }

    /// Lets `by` pass on tokio's clock, firing the ticks (`tick_interval_ms`) and the wake-ups
    /// scheduled with `BoltOutput::schedule_after`/`schedule_at` as they fall due, as an idle
    /// task would. With a paused clock (`start_paused`) this takes no real time.
    pub async fn advance(&mut self, by: Duration) -> Result<(), HarnessError> {
        let until = Instant::now() + by;
        loop {
            let task = running(&mut self.task, self.drained, &self.ctx)?;
            match task.next_deadline() {
                Some(at) if at <= until => {
                    sleep_until(at).await;
                    let r = self.sink.drive(task.fire_timers()).await;
                    self.absorb();
                    r.map_err(|_| self.cancelled())?;
                }
                _ => break,
            }
        }
        sleep_until(until).await;
        Ok(())
    }

    /// Stops the task: `Bolt::cleanup`, then the bolt is dropped and the inputs it still holds
    /// are failed, as in the executor. Nothing else may follow; what was captured stays.
    pub async fn cleanup(&mut self) -> Result<(), HarnessError> {
        let task = self.task.take().ok_or_else(|| self.stopped("cleaned up"))?;
        let out = self.sink.drive(task.stop()).await;
        self.counters = counters_of(&out);
        drop(out);
        self.absorb();
        self.ctx.cancel.cancel();
        Ok(())
    }

    /// The tuples emitted so far (see the [module docs](self) on their order).
    pub fn emitted(&self) -> &[Emitted] {
        &self.emitted
    }

    /// The tuples emitted on `stream`.
    pub fn emitted_on<'a>(&'a self, stream: &'a str) -> impl Iterator<Item = &'a Emitted> + 'a {
        self.emitted.iter().filter(move |e| e.stream == stream)
    }

    /// Takes the tuples emitted so far, leaving none.
    pub fn take_emitted(&mut self) -> Vec<Emitted> {
        std::mem::take(&mut self.emitted)
    }

    /// The tracked inputs the bolt acked, in the order it acked them.
    pub fn acked(&self) -> &[InputId] {
        &self.acked
    }

    /// The tracked inputs the bolt failed (an error or a panic while executing them, a
    /// `fail_current`, a failed or dropped [`AckHandle`]), in order.
    pub fn failed(&self) -> &[InputId] {
        &self.failed
    }

    /// The tracked inputs neither acked nor failed: held with `BoltOutput::defer_ack`.
    pub fn held(&self) -> Vec<InputId> {
        (0..self.status.len() as u64).map(InputId).filter(|id| self.status(*id) == Some(Status::Pending)).collect()
    }

    /// The watermarks the task forwarded downstream, in order (the +infinity one ahead of the
    /// drain marker included).
    pub fn watermarks_out(&self) -> &[Watermark] {
        &self.watermarks_out
    }

    /// True once the drain marker was forwarded.
    pub fn drained(&self) -> bool {
        self.drained
    }

    /// The task's counters.
    pub fn counters(&self) -> BoltCounters {
        self.counters
    }

    /// Wake-ups scheduled and not yet fired (0 once cleaned up).
    pub fn scheduled(&self) -> usize {
        self.task.as_ref().map_or(0, |t| t.out.scheduled())
    }

    /// The bolt (`None` once cleaned up).
    pub fn bolt(&self) -> Option<&B> {
        self.task.as_ref().map(|t| &t.bolt)
    }

    /// The bolt, mutably (`None` once cleaned up).
    pub fn bolt_mut(&mut self) -> Option<&mut B> {
        self.task.as_mut().map(|t| &mut t.bolt)
    }

    /// The task's context, as handed to `prepare`.
    pub fn context(&self) -> &TaskContext {
        &self.ctx
    }

    fn status(&self, id: InputId) -> Option<Status> {
        self.status.get(usize::try_from(id.0).ok()?).copied()
    }

    fn first_input(&self) -> Result<usize, HarnessError> {
        if self.inputs.is_empty() {
            return Err(HarnessError::NoInput { component: self.ctx.component.to_string() });
        }
        Ok(0)
    }

    fn input_index(&self, component: &str, stream: &str) -> Result<usize, HarnessError> {
        self.inputs.iter().position(|m| &*m.component == component && &*m.stream == stream).ok_or_else(|| {
            HarnessError::UnknownInput {
                component: self.ctx.component.to_string(),
                source_component: component.to_owned(),
                stream: stream.to_owned(),
                declared: self.inputs.iter().map(|m| format!("{}/{}", m.component, m.stream)).collect(),
            }
        })
    }

    fn stopped(&self, state: &'static str) -> HarnessError {
        HarnessError::Stopped { component: self.ctx.component.to_string(), state }
    }

    fn cancelled(&self) -> HarnessError {
        self.stopped("cancelled")
    }

    /// Builds the inputs (tracked ones each with a fresh root and edge) and hands them to the
    /// executor's batch handler.
    async fn feed(&mut self, batch: Vec<(usize, Values)>, tracked: bool) -> Result<Vec<InputId>, HarnessError> {
        running(&mut self.task, self.drained, &self.ctx)?;
        let mut ids = Vec::new();
        let mut tuples = Vec::with_capacity(batch.len());
        for (input, values) in batch {
            let meta = self.inputs[input];
            if values.len() != meta.fields.len() {
                return Err(HarnessError::FieldCount {
                    source_component: meta.component.to_string(),
                    stream: meta.stream.to_string(),
                    got: values.len(),
                    fields: meta.fields.to_vec(),
                });
            }
            let mut anchors = Anchors::new();
            if tracked {
                let id = InputId(self.status.len() as u64 + ids.len() as u64);
                anchors.push((acker::make_root(0, id.0), self.rng.next_edge()));
                ids.push(id);
            }
            tuples.push(Tuple { meta, values, anchors });
        }
        self.status.extend(ids.iter().map(|_| Status::Pending));
        let task = running(&mut self.task, self.drained, &self.ctx)?;
        let r = self.sink.drive(task.on_batch(tuples)).await;
        self.absorb();
        r.map_err(|_| self.cancelled())?;
        Ok(ids)
    }

    /// Takes in what the task sent.
    fn absorb(&mut self) {
        for (target, msg) in std::mem::take(&mut self.sink.msgs) {
            match msg {
                Message::Tuples(batch) => {
                    for tuple in batch {
                        let anchored_to = tuple.anchors().iter().map(|&(root, _)| input_of(root)).collect();
                        self.emitted.push(Emitted {
                            stream: tuple.stream().to_owned(),
                            values: tuple.values().clone(),
                            anchored_to,
                            direct_task: target.checked_sub(1),
                            tuple,
                        });
                    }
                }
                // every target receives the control messages: take them once
                Message::Watermark(wm) if target == 0 => self.watermarks_out.push(wm),
                Message::Drain if target == 0 => self.drained = true,
                Message::Watermark(_) | Message::Drain => {}
            }
        }
        for batch in std::mem::take(&mut self.sink.ack_batches) {
            // fails first, as a spout task applies them
            for root in batch.fails {
                if self.settle(root, Status::Failed) {
                    self.failed.push(input_of(root));
                }
            }
            for (root, _) in batch.xors {
                if self.settle(root, Status::Acked) {
                    self.acked.push(input_of(root));
                }
            }
        }
        if let Some(task) = &self.task {
            self.counters = counters_of(&task.out);
        }
    }

    /// Ends a pending input; false if it was not pending (a later update of a completed root is
    /// ignored, as by the spout task).
    fn settle(&mut self, root: u64, to: Status) -> bool {
        match usize::try_from(input_of(root).0).ok().and_then(|i| self.status.get_mut(i)) {
            Some(s) if *s == Status::Pending => {
                *s = to;
                true
            }
            _ => false,
        }
    }
}

impl<B: Bolt> Drop for BoltHarness<B> {
    fn drop(&mut self) {
        self.ctx.cancel.cancel();
    }
}

impl<B: Bolt> fmt::Debug for BoltHarness<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoltHarness")
            .field("component", &self.ctx.component)
            .field("emitted", &self.emitted.len())
            .field("acked", &self.acked)
            .field("failed", &self.failed)
            .field("held", &self.held())
            .field("watermarks_out", &self.watermarks_out)
            .field("counters", &self.counters)
            .finish()
    }
}

/// The task, unless it drained, was cleaned up or cancelled (a function of the fields, so the
/// sink stays borrowable while the task runs).
fn running<'a, B: Bolt>(
    task: &'a mut Option<BoltTask<B>>,
    drained: bool,
    ctx: &TaskContext,
) -> Result<&'a mut BoltTask<B>, HarnessError> {
    let stopped = |state| HarnessError::Stopped { component: ctx.component.to_string(), state };
    match task {
        None => Err(stopped("cleaned up")),
        Some(_) if drained => Err(stopped("drained")),
        Some(_) if ctx.cancel.is_cancelled() => Err(stopped("cancelled")),
        Some(task) => Ok(task),
    }
}

/// The input a harness root belongs to (the harness's ack slot is 0, so the root is the id).
fn input_of(root: u64) -> InputId {
    InputId(root)
}

fn counters_of(out: &BoltOutput) -> BoltCounters {
    BoltCounters {
        executed: out.executed,
        emitted: out.outbox.emitted,
        acked: out.acked,
        failed: out.failed,
        errors: out.errors,
        panics: out.panics,
    }
}

/// Builds a [`SpoutHarness`]: the spout's outputs and configuration.
pub struct SpoutHarnessBuilder<S> {
    spout: S,
    decls: Decls,
}

impl<S: Spout> SpoutHarnessBuilder<S> {
    /// The spout's component id (default `"spout"`).
    pub fn component_id(mut self, id: &str) -> Self {
        self.decls.component = id.to_owned();
        self
    }

    /// An output stream (as `SpoutDeclarer::output`).
    pub fn output<T: AsRef<str>>(mut self, stream: &str, fields: &[T]) -> Self {
        self.decls.output(stream, fields, None);
        self
    }

    /// A direct output stream whose subscriber has `tasks` tasks.
    pub fn direct_output<T: AsRef<str>>(mut self, stream: &str, fields: &[T], tasks: usize) -> Self {
        self.decls.output(stream, fields, Some(tasks.max(1)));
        self
    }

    /// The component's configuration (its own `max_spout_pending`, its settings).
    pub fn config(mut self, config: ComponentConfig) -> Self {
        self.decls.config = config;
        self
    }

    /// The topology's configuration (`acking`, `message_timeout_ms`, `max_spout_pending`,
    /// `start_active`, ...).
    pub fn topology_config(mut self, config: TopologyConfig) -> Self {
        self.decls.topology = config;
        self
    }

    /// Validates the configuration, wires the spout's output to the harness and runs
    /// `Spout::open` (then `activate`, when the topology starts active). An error or a panic in
    /// `open` is [`HarnessError::Task`].
    pub async fn open(self) -> Result<SpoutHarness<S>, HarnessError> {
        let SpoutHarnessBuilder { spout, decls } = self;
        decls.validate()?;
        let ctx = decls.context();
        let (outbox, data) = decls.outbox(&ctx);
        let (ack_tx, ack_rx) = mpsc::channel(decls.topology.ack_channel_capacity);
        let (_, ctrl_rx) = mpsc::channel(1);
        let wiring = SpoutWiring {
            outbox,
            slot: 0,
            max_pending: decls.config.max_spout_pending.unwrap_or(decls.topology.max_spout_pending),
            ack_rx,
            ctrl_rx,
            metrics: Arc::new(TaskMetrics::default()),
        };
        let mut task = SpoutTask::new(spout, ctx.clone(), wiring);
        let mut sink = Sink { data, acks: None, msgs: Vec::new(), ack_batches: Vec::new() };
        if !sink.drive(task.open()).await? {
            return Err(HarnessError::Stopped { component: decls.component, state: "cancelled" });
        }
        let mut h = SpoutHarness {
            task: Some(task),
            sink,
            ack_tx,
            ctx,
            emitted: Vec::new(),
            acked: Vec::new(),
            failed: Vec::new(),
            watermarks_out: Vec::new(),
            drained: false,
            counters: SpoutCounters::default(),
        };
        h.absorb();
        Ok(h)
    }
}

/// Drives one spout through the engine's task code, the harness acting as its downstream.
/// See the [module docs](self).
pub struct SpoutHarness<S: Spout> {
    /// `None` once closed.
    task: Option<SpoutTask<S>>,
    sink: Sink,
    /// The task's ack channel: the harness's acks and fails travel on it.
    ack_tx: mpsc::Sender<AckBatch>,
    ctx: TaskContext,
    emitted: Vec<SpoutEmitted<S::MsgId>>,
    acked: Vec<S::MsgId>,
    failed: Vec<S::MsgId>,
    watermarks_out: Vec<Watermark>,
    drained: bool,
    counters: SpoutCounters,
}

impl<S: Spout> SpoutHarness<S> {
    /// Starts declaring a harness for `spout`; finish with [`SpoutHarnessBuilder::open`].
    #[allow(clippy::new_ret_no_self)]
    pub fn new(spout: S) -> SpoutHarnessBuilder<S> {
        SpoutHarnessBuilder { spout, decls: Decls::new("spout") }
    }

    /// One `next_tuple` call, as the executor makes it: completions first reach the spout, then
    /// the call, then its tuples and its advanced watermark are sent. A spout that calls
    /// `SpoutOutput::finish` drains (its final watermark and drain marker follow). Returns the
    /// number of tuples emitted.
    ///
    /// Errors where the engine would not call `next_tuple` (at `max_spout_pending`, deactivated,
    /// drained) and where the call fails the task (a fatal error or a panic: [`HarnessError::Task`];
    /// a retryable error is only counted, as in the executor).
    pub async fn next_tuple(&mut self) -> Result<usize, HarnessError> {
        let component = self.ctx.component.to_string();
        let task = self
            .task
            .as_mut()
            .ok_or_else(|| HarnessError::Stopped { component: component.clone(), state: "closed" })?;
        if task.draining {
            return Err(HarnessError::Stopped { component, state: "drained" });
        }
        if !task.active {
            return Err(HarnessError::Inactive { component });
        }
        let pending = task.out.pending();
        if pending >= task.out.max_pending {
            return Err(HarnessError::AtMaxPending { component, pending });
        }
        let before = task.out.outbox.emitted;
        let (acked, failed) = (&mut self.acked, &mut self.failed);
        let r = self
            .sink
            .drive(async {
                task.out.now = Instant::now();
                deliver(task, acked, failed).await;
                task.call_next_tuple().await?;
                deliver(task, acked, failed).await;
                let sent = if task.out.finished {
                    task.start_drain(false).await
                } else {
                    task.out.send_watermark_if_advanced().await
                };
                Ok::<_, HarnessError>(sent.is_ok() && task.out.flush_inner().await.is_ok())
            })
            .await;
        let emitted = task.out.outbox.emitted - before;
        self.absorb();
        match r? {
            true => Ok(emitted as usize),
            false => Err(HarnessError::Stopped { component: self.ctx.component.to_string(), state: "cancelled" }),
        }
    }

    /// Acks the oldest pending tuple with message id `msg`, as a subscriber acking it would
    /// (an ack-tree update on the task's ack channel); `Spout::ack` is called. An id with no
    /// pending tuple is [`HarnessError::NotPending`].
    pub async fn ack(&mut self, msg: &S::MsgId) -> Result<(), HarnessError>
    where
        S::MsgId: PartialEq,
    {
        let (root, edge) = self.pending_tree(msg)?;
        self.complete(AckBatch { xors: vec![(root, edge)], fails: Vec::new() }).await
    }

    /// Fails the oldest pending tuple with message id `msg`, as a failing subscriber would;
    /// `Spout::fail` is called. An id with no pending tuple is [`HarnessError::NotPending`].
    pub async fn fail(&mut self, msg: &S::MsgId) -> Result<(), HarnessError>
    where
        S::MsgId: PartialEq,
    {
        let (root, _) = self.pending_tree(msg)?;
        self.complete(AckBatch { xors: Vec::new(), fails: vec![root] }).await
    }

    /// Acks every pending tuple, in emit order.
    pub async fn ack_all(&mut self) -> Result<(), HarnessError> {
        let task = self.task.as_ref().ok_or_else(|| self.closed())?;
        let xors = self
            .emitted
            .iter()
            .filter_map(|e| e.tree)
            .filter(|(root, _)| task.out.acks.pending.get(*root).is_some())
            .collect();
        self.complete(AckBatch { xors, fails: Vec::new() }).await
    }

    /// Times out every pending tuple, as the message timeout would: `Spout::fail` is called
    /// for each (counted in `timed_out`).
    pub async fn timeout_all(&mut self) -> Result<(), HarnessError> {
        let task = self.task.as_mut().ok_or_else(|| closed_error(&self.ctx))?;
        // every deadline is at most `timeout` after the emit, which was before now
        task.out.acks.expire(Instant::now() + task.out.timeout);
        deliver(task, &mut self.acked, &mut self.failed).await;
        self.absorb();
        Ok(())
    }

    /// Lets `by` pass on tokio's clock, then times out the tuples whose message timeout passed
    /// (`Spout::fail`). With a paused clock (`start_paused`) this takes no real time.
    pub async fn advance(&mut self, by: Duration) -> Result<(), HarnessError> {
        sleep(by).await;
        let task = self.task.as_mut().ok_or_else(|| closed_error(&self.ctx))?;
        task.out.acks.expire(Instant::now());
        deliver(task, &mut self.acked, &mut self.failed).await;
        self.absorb();
        Ok(())
    }

    /// The task's low watermark, as the executor keeps it while it does not call `next_tuple`:
    /// `Spout::low_watermark` is polled, and a watermark that advanced is sent
    /// ([`SpoutHarness::watermarks_out`]). `None`: no watermark yet.
    pub async fn watermark(&mut self) -> Result<Option<Watermark>, HarnessError> {
        let task = self.task.as_mut().ok_or_else(|| closed_error(&self.ctx))?;
        let r = if task.draining {
            Ok(())
        } else {
            self.sink
                .drive(async {
                    task.poll_low_watermark().await?;
                    task.out.flush_inner().await
                })
                .await
        };
        let wm = task.out.watermark.map(Watermark);
        self.absorb();
        r.map_err(|_| self.stopped("cancelled"))?;
        Ok(wm)
    }

    /// Drains the task, as `RunningTopology::drain` does: `Spout::drain` (which may emit final
    /// tuples), then the +infinity watermark and the drain marker. `next_tuple` is not called
    /// again; acks and fails still reach the spout. Does nothing if the task drains already.
    pub async fn drain(&mut self) -> Result<(), HarnessError> {
        let task = self.task.as_mut().ok_or_else(|| closed_error(&self.ctx))?;
        let (acked, failed) = (&mut self.acked, &mut self.failed);
        let r = self
            .sink
            .drive(async {
                if task.draining {
                    return Ok(());
                }
                // start_drain, with the deliveries noted
                task.begin_drain(true).await;
                deliver(task, acked, failed).await;
                task.send_drain_markers().await
            })
            .await;
        self.absorb();
        r.map_err(|_| self.stopped("cancelled"))
    }

    /// Deactivates the spout (`Spout::deactivate`): `next_tuple` is not called until
    /// [`SpoutHarness::activate`].
    pub async fn deactivate(&mut self) -> Result<(), HarnessError> {
        self.command(SpoutCommand::Deactivate).await
    }

    /// Activates the spout (`Spout::activate`) if it is deactivated.
    pub async fn activate(&mut self) -> Result<(), HarnessError> {
        self.command(SpoutCommand::Activate).await
    }

    /// Stops the task: `Spout::close`. Nothing else may follow; what was captured stays.
    pub async fn close(&mut self) -> Result<(), HarnessError> {
        let mut task = self.task.take().ok_or_else(|| self.closed())?;
        task.close().await;
        self.counters = spout_counters(&task);
        self.ctx.cancel.cancel();
        Ok(())
    }

    /// The tuples emitted so far.
    pub fn emitted(&self) -> &[SpoutEmitted<S::MsgId>] {
        &self.emitted
    }

    /// Takes the tuples emitted so far, leaving none.
    pub fn take_emitted(&mut self) -> Vec<SpoutEmitted<S::MsgId>> {
        std::mem::take(&mut self.emitted)
    }

    /// The message ids delivered to `Spout::ack`, in order.
    pub fn acked(&self) -> &[S::MsgId] {
        &self.acked
    }

    /// The message ids delivered to `Spout::fail` (fails and timeouts), in order.
    pub fn failed(&self) -> &[S::MsgId] {
        &self.failed
    }

    /// The watermarks the task sent downstream, in order (the +infinity one ahead of the drain
    /// marker included).
    pub fn watermarks_out(&self) -> &[Watermark] {
        &self.watermarks_out
    }

    /// True once the drain marker was sent.
    pub fn drained(&self) -> bool {
        self.drained
    }

    /// True once the spout called `SpoutOutput::finish`.
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_some_and(|t| t.out.finished)
    }

    /// Tracked tuples in flight (0 once closed).
    pub fn pending(&self) -> usize {
        self.task.as_ref().map_or(0, |t| t.out.pending())
    }

    /// How many more tracked tuples may be in flight before `max_spout_pending` (0 once closed).
    pub fn room(&self) -> usize {
        self.task.as_ref().map_or(0, |t| t.out.pending_room())
    }

    /// The task's counters.
    pub fn counters(&self) -> SpoutCounters {
        self.counters
    }

    /// The spout (`None` once closed).
    pub fn spout(&self) -> Option<&S> {
        self.task.as_ref().map(|t| &t.spout)
    }

    /// The spout, mutably (`None` once closed).
    pub fn spout_mut(&mut self) -> Option<&mut S> {
        self.task.as_mut().map(|t| &mut t.spout)
    }

    /// The task's context, as handed to `open`.
    pub fn context(&self) -> &TaskContext {
        &self.ctx
    }

    fn stopped(&self, state: &'static str) -> HarnessError {
        HarnessError::Stopped { component: self.ctx.component.to_string(), state }
    }

    fn closed(&self) -> HarnessError {
        self.stopped("closed")
    }

    /// The (root, edge) of the oldest pending tuple with message id `msg`.
    fn pending_tree(&self, msg: &S::MsgId) -> Result<(u64, u64), HarnessError>
    where
        S::MsgId: PartialEq,
    {
        let task = self.task.as_ref().ok_or_else(|| self.closed())?;
        self.emitted
            .iter()
            .filter_map(|e| e.tree)
            .find(|(root, _)| task.out.acks.pending.get(*root) == Some(msg))
            .ok_or_else(|| HarnessError::NotPending {
                component: self.ctx.component.to_string(),
                msg: format!("{msg:?}"),
            })
    }

    /// Sends ack-tree updates on the task's ack channel, applies them as the task does, and
    /// delivers the completions to the spout.
    async fn complete(&mut self, batch: AckBatch) -> Result<(), HarnessError> {
        let task = self.task.as_mut().ok_or_else(|| closed_error(&self.ctx))?;
        if let Err(e) = self.ack_tx.try_send(batch) {
            // the harness empties the channel after every send: it is never full
            let (mpsc::error::TrySendError::Full(b) | mpsc::error::TrySendError::Closed(b)) = e;
            task.out.acks.apply(b);
        }
        task.out.acks.apply_queued();
        deliver(task, &mut self.acked, &mut self.failed).await;
        self.absorb();
        Ok(())
    }

    async fn command(&mut self, cmd: SpoutCommand) -> Result<(), HarnessError> {
        let task = self.task.as_mut().ok_or_else(|| closed_error(&self.ctx))?;
        let r = self.sink.drive(task.on_command(cmd)).await;
        self.absorb();
        r.map_err(|_| self.stopped("cancelled"))
    }

    /// Takes in what the task sent.
    fn absorb(&mut self) {
        let Some(task) = &self.task else { return };
        for (target, msg) in std::mem::take(&mut self.sink.msgs) {
            match msg {
                Message::Tuples(batch) => {
                    for tuple in batch {
                        let tree = tuple.anchors().first().copied();
                        let msg_id = tree.and_then(|(root, _)| task.out.acks.pending.get(root).cloned());
                        self.emitted.push(SpoutEmitted {
                            stream: tuple.stream().to_owned(),
                            values: tuple.values().clone(),
                            msg_id,
                            direct_task: target.checked_sub(1),
                            tuple,
                            tree,
                        });
                    }
                }
                Message::Watermark(wm) if target == 0 => self.watermarks_out.push(wm),
                Message::Drain if target == 0 => self.drained = true,
                Message::Watermark(_) | Message::Drain => {}
            }
        }
        self.counters = spout_counters(task);
    }
}

impl<S: Spout> Drop for SpoutHarness<S> {
    fn drop(&mut self) {
        self.ctx.cancel.cancel();
    }
}

impl<S: Spout> fmt::Debug for SpoutHarness<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpoutHarness")
            .field("component", &self.ctx.component)
            .field("emitted", &self.emitted.len())
            .field("acked", &self.acked)
            .field("failed", &self.failed)
            .field("pending", &self.pending())
            .field("watermarks_out", &self.watermarks_out)
            .field("counters", &self.counters)
            .finish()
    }
}

fn closed_error(ctx: &TaskContext) -> HarnessError {
    HarnessError::Stopped { component: ctx.component.to_string(), state: "closed" }
}

/// Delivers the task's completions to the spout (the executor's `deliver`), noting which.
async fn deliver<S: Spout>(task: &mut SpoutTask<S>, acked: &mut Vec<S::MsgId>, failed: &mut Vec<S::MsgId>) {
    acked.extend(task.out.acks.acked.iter().cloned());
    failed.extend(task.out.acks.failed.iter().cloned());
    task.deliver().await;
}

fn spout_counters<S: Spout>(task: &SpoutTask<S>) -> SpoutCounters {
    SpoutCounters {
        emitted: task.out.outbox.emitted,
        acked: task.acked,
        failed: task.failed,
        timed_out: task.out.acks.timed_out,
        errors: task.errors,
    }
}
