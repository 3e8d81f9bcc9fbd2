//! The component traits: [`Spout`] produces tuples, [`Bolt`] consumes them; [`TaskContext`] describes
//! the task an instance runs in.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{ComponentConfig, TopologyConfig};
use crate::output::{BoltOutput, EmitError, Inputs, SpoutOutput, Timer};
use crate::tuple::{Tuple, TupleError};

/// A low watermark in milliseconds since the epoch: no later tuple is expected to carry an
/// event time below it (MillWheel). [`Watermark::MAX`] is sent ahead of a drain marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Watermark(pub u64);

impl Watermark {
    /// The +infinity watermark: the stream is finished.
    pub const MAX: Watermark = Watermark(u64::MAX);

    /// Milliseconds since the epoch.
    pub fn millis(self) -> u64 {
        self.0
    }
}

/// Whose fault an error is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorDomain {
    /// A bug or bad data in the component (user code).
    User,
    /// An external system (network, service) misbehaved.
    External,
    /// The engine itself.
    Internal,
}

/// The error a component hook returns.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ComponentError {
    /// A transient failure: the tuple is failed (and replayed); a spout keeps running.
    #[error("retryable error: {message}")]
    Retryable {
        /// What went wrong.
        message: String,
        /// Underlying cause.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// A permanent failure. A bolt still only fails the tuple; a spout or an `open`/`prepare`
    /// hook that returns it fails the whole topology.
    #[error("fatal error: {message}")]
    Fatal {
        /// What went wrong.
        message: String,
        /// Underlying cause.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// Reading a tuple field failed (user code asked for an undeclared or mistyped field).
    #[error(transparent)]
    Tuple(#[from] TupleError),
    /// Emitting failed (undeclared stream, wrong value count, bad direct task).
    #[error(transparent)]
    Emit(#[from] EmitError),
    /// A typed record did not encode (see [`crate::typed`]).
    #[error(transparent)]
    Typed(#[from] crate::typed::TypedError),
}

impl ComponentError {
    /// A retryable error with a message.
    pub fn retryable(message: impl Into<String>) -> Self {
        ComponentError::Retryable { message: message.into(), source: None }
    }

    /// A fatal error with a message.
    pub fn fatal(message: impl Into<String>) -> Self {
        ComponentError::Fatal { message: message.into(), source: None }
    }

    /// A retryable error wrapping a cause.
    pub fn retryable_from(message: impl Into<String>, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        ComponentError::Retryable { message: message.into(), source: Some(Box::new(source)) }
    }

    /// A fatal error wrapping a cause.
    pub fn fatal_from(message: impl Into<String>, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        ComponentError::Fatal { message: message.into(), source: Some(Box::new(source)) }
    }

    /// Whether retrying (replaying the tuple, calling `next_tuple` again) may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ComponentError::Retryable { .. })
    }

    /// Whose fault the error is.
    pub fn domain(&self) -> ErrorDomain {
        match self {
            ComponentError::Retryable { .. } => ErrorDomain::External,
            _ => ErrorDomain::User,
        }
    }
}

/// Wakes a spout task waiting for work: call [`Wakeup::notify`] from the spout's own background
/// tasks when new data is ready, so the executor calls `next_tuple` without waiting the idle sleep.
#[derive(Clone, Default)]
pub struct Wakeup(pub(crate) Arc<Notify>);

impl Wakeup {
    /// Wakes the task (a wakeup sent while the task is busy is remembered once).
    pub fn notify(&self) {
        self.0.notify_one();
    }
}

impl fmt::Debug for Wakeup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Wakeup")
    }
}

/// Describes the task a component instance runs in. Cheap to clone.
#[derive(Clone, Debug)]
pub struct TaskContext {
    pub(crate) topology: Arc<str>,
    pub(crate) component: Arc<str>,
    pub(crate) task_index: usize,
    pub(crate) parallelism: usize,
    pub(crate) task_id: usize,
    pub(crate) config: Arc<TopologyConfig>,
    pub(crate) component_config: Arc<ComponentConfig>,
    pub(crate) metrics: Arc<crate::metrics::TaskMetrics>,
    pub(crate) wakeup: Wakeup,
    pub(crate) cancel: CancellationToken,
    pub(crate) tracker: TaskTracker,
}

impl TaskContext {
    /// The topology's name.
    pub fn topology_name(&self) -> &str {
        &self.topology
    }

    /// The component id.
    pub fn component_id(&self) -> &str {
        &self.component
    }

    /// This task's index within its component, `0..parallelism`.
    pub fn task_index(&self) -> usize {
        self.task_index
    }

    /// Number of tasks of this component.
    pub fn parallelism(&self) -> usize {
        self.parallelism
    }

    /// A topology-wide unique task id.
    pub fn task_id(&self) -> usize {
        self.task_id
    }

    /// The topology's configuration.
    pub fn config(&self) -> &TopologyConfig {
        &self.config
    }

    /// This component's own configuration (set with `.config(..)` on its declarer): its
    /// overrides of the topology's settings and its own `settings`.
    pub fn component_config(&self) -> &ComponentConfig {
        &self.component_config
    }

    /// This task's counter `name` (created on first use; the same counter on later calls). It
    /// shows, summed over the component's tasks, wherever the engine's counters show
    /// ([`crate::ComponentMetrics::counters`], `squall status`).
    pub fn counter(&self, name: &str) -> crate::metrics::Counter {
        self.metrics.user.counter(name)
    }

    /// This task's histogram `name` (created on first use), merged over the component's tasks
    /// in [`crate::ComponentMetrics::histograms`].
    pub fn histogram(&self, name: &str) -> crate::metrics::Histogram {
        self.metrics.user.histogram(name)
    }

    /// The handle that wakes this task's executor (spouts).
    pub fn wakeup(&self) -> Wakeup {
        self.wakeup.clone()
    }

    /// Cancelled when the topology shuts down; background work of the component should stop.
    pub fn cancellation(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Spawns a background task owned by the topology: it is tracked and awaited at shutdown,
    /// so it should stop when [`TaskContext::cancellation`] fires.
    pub fn spawn<F>(&self, fut: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tracker.spawn(fut)
    }

    /// A context for unit-testing a component outside a topology.
    pub fn for_test(component: &str, task_index: usize, parallelism: usize) -> TaskContext {
        TaskContext {
            topology: Arc::from("test"),
            component: Arc::from(component),
            task_index,
            parallelism,
            task_id: task_index,
            config: Arc::new(TopologyConfig::default()),
            component_config: Arc::new(ComponentConfig::default()),
            metrics: Arc::default(),
            wakeup: Wakeup::default(),
            cancel: CancellationToken::new(),
            tracker: TaskTracker::new(),
        }
    }
}

/// A source of tuples (Storm's spout). Only [`Spout::next_tuple`] is required.
///
/// The executor calls `next_tuple` in a loop while the spout is active and fewer than
/// `max_spout_pending` tracked tuples are in flight; it should return promptly. When a call emits
/// nothing, the executor waits until an ack, fail or control message arrives, the
/// [`TaskContext::wakeup`] handle is notified, or the idle sleep elapses. Acks and fails of
/// tracked tuples arrive through [`Spout::ack`] and [`Spout::fail`], exactly once per message id,
/// also while the spout is deactivated.
pub trait Spout: Send + 'static {
    /// The message id a tracked tuple carries back in `ack`/`fail`.
    type MsgId: Clone + Send + Sync + fmt::Debug + 'static;

    /// Called once before anything else. An error fails the topology.
    fn open(&mut self, ctx: &TaskContext) -> impl Future<Output = Result<(), ComponentError>> + Send {
        let _ = ctx;
        async { Ok(()) }
    }

    /// Emits zero or more tuples. A non-retryable error fails the topology; a retryable one is
    /// counted and the call is repeated after the idle sleep.
    fn next_tuple(
        &mut self,
        out: &mut SpoutOutput<Self::MsgId>,
    ) -> impl Future<Output = Result<(), ComponentError>> + Send;

    /// The tuple tree of `id` completed.
    fn ack(&mut self, id: Self::MsgId) -> impl Future<Output = ()> + Send {
        let _ = id;
        async {}
    }

    /// The tuple tree of `id` failed or timed out: replay it if the data must not be lost.
    fn fail(&mut self, id: Self::MsgId) -> impl Future<Output = ()> + Send {
        let _ = id;
        async {}
    }

    /// The topology was activated (also called after `open` when it starts active).
    fn activate(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// The topology was deactivated: `next_tuple` will not be called until reactivation.
    fn deactivate(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// The topology is being drained: emit any final tuples. `next_tuple` is not called again.
    fn drain(&mut self, out: &mut SpoutOutput<Self::MsgId>) -> impl Future<Output = Result<(), ComponentError>> + Send {
        let _ = out;
        async { Ok(()) }
    }

    /// The task's current low watermark (event time in ms), polled by the executor while it
    /// does not call `next_tuple`: at `max_spout_pending`, and while waiting for acks or work.
    /// This keeps watermarks flowing when every in-flight tuple is held downstream (a window
    /// that acks its inputs when it fires). Same rules as [`SpoutOutput::watermark`]: lower
    /// values than before are ignored. `None` (the default): no opinion.
    fn low_watermark(&mut self) -> Option<u64> {
        None
    }

    /// Called once when the task stops.
    fn close(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// A tuple processor (Storm's bolt). Only [`Bolt::execute`] is required.
///
/// Emits through [`BoltOutput`] are anchored to the input by default, and the input is acked when
/// `execute` returns `Ok` (Storm's BasicBolt), or failed on `Err` or panic; the task keeps running.
/// `execute` may await I/O; the inputs behind it wait (backpressure).
pub trait Bolt: Send + 'static {
    /// Called once before the first tuple. An error fails the topology.
    fn prepare(&mut self, ctx: &TaskContext) -> impl Future<Output = Result<(), ComponentError>> + Send {
        let _ = ctx;
        async { Ok(()) }
    }

    /// Processes one input tuple.
    fn execute(
        &mut self,
        input: Tuple,
        out: &mut BoltOutput,
    ) -> impl Future<Output = Result<(), ComponentError>> + Send;

    /// Processes a batch of inputs (the tuples of one channel message, up to `batch_size`).
    /// The default takes each input with [`Inputs::next`] and calls [`Bolt::execute`] (an
    /// error or a panic there fails that input only); override it to work on a whole batch at
    /// once (one write to an external store per batch, or a tighter loop than one `execute`
    /// future per tuple).
    ///
    /// The batch's inputs stay open until this returns: an input ended with [`Inputs::next`]
    /// or by [`Inputs::for_each`] (unless failed, or held with [`BoltOutput::defer_ack`]) is
    /// acked when this returns `Ok`, and failed, with the input being executed, when it returns
    /// an `Err` or panics, so the work after the loop is part of every input's processing.
    /// Emits are anchored to the input taken last; outside any input (after the loop) to every
    /// open input of the batch. [`Inputs::for_each`] fails an input whose closure errs or
    /// panics, and goes on. Inputs not taken when this returns are handed to another
    /// `execute_batch` call (or, if it takes none, to `execute` one by one).
    fn execute_batch(
        &mut self,
        inputs: &mut Inputs,
        out: &mut BoltOutput,
    ) -> impl Future<Output = Result<(), ComponentError>> + Send {
        async move {
            while let Some(t) = inputs.next(out).await {
                match AssertUnwindSafe(self.execute(t, out)).catch_unwind().await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => inputs.fail_current(out, &e),
                    Err(panic) => inputs.fail_current_panicked(out, &*panic),
                }
            }
            Ok(())
        }
    }

    /// A timer fired: the component's periodic tick (`tick_interval_ms` in its
    /// [`ComponentConfig`], Storm's tick tuple) or a wake-up scheduled with
    /// [`BoltOutput::schedule_after`]. Emits here are unanchored unless anchored to held inputs;
    /// held inputs may be acked or failed (flush a batch to an external store, then ack it).
    /// Errors and panics are counted; the task keeps running.
    fn on_timer(
        &mut self,
        timer: Timer,
        out: &mut BoltOutput,
    ) -> impl Future<Output = Result<(), ComponentError>> + Send {
        let _ = (timer, out);
        async { Ok(()) }
    }

    /// The combined low watermark of all inputs advanced to `wm`. It is forwarded downstream
    /// after this returns, held back to [`Bolt::watermark_hold`].
    fn on_watermark(
        &mut self,
        wm: Watermark,
        out: &mut BoltOutput,
    ) -> impl Future<Output = Result<(), ComponentError>> + Send {
        let _ = (wm, out);
        async { Ok(()) }
    }

    /// The event time below which this task may still emit: while it buffers inputs to emit
    /// later, the oldest of them (a bolt that batches writes, or reorders). The watermark it
    /// forwards is the lower of its input watermark and this hold, so nothing it emits later is
    /// behind a watermark it already sent; once the hold moves up (or is released, `None`), the
    /// watermark it held back is forwarded. `None` (the default): no hold, the input watermark
    /// is forwarded as it comes.
    ///
    /// Polled after [`Bolt::on_watermark`] and, while the hold keeps the input watermark back,
    /// after every other hook (a batch of inputs, a timer); the forwarded watermark never goes
    /// back, and never passes the input watermark. A panic here is counted and forwards
    /// nothing that time. [`Bolt::on_drain`] ends the stream: the +infinity watermark follows
    /// it whatever the hold.
    fn watermark_hold(&self) -> Option<Watermark> {
        None
    }

    /// Every input has drained: flush state and emit final tuples. Called once; the drain marker
    /// is forwarded downstream after it returns, and the task then stops.
    fn on_drain(&mut self, out: &mut BoltOutput) -> impl Future<Output = Result<(), ComponentError>> + Send {
        let _ = out;
        async { Ok(()) }
    }

    /// Called once when the task stops.
    fn cleanup(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_classification() {
        assert!(ComponentError::retryable("x").is_retryable());
        assert!(!ComponentError::fatal("x").is_retryable());
        assert_eq!(ComponentError::retryable("x").domain(), ErrorDomain::External);
        assert_eq!(ComponentError::fatal("boom").to_string(), "fatal error: boom");
    }

    #[test]
    fn watermark_order() {
        assert!(Watermark(5) < Watermark::MAX);
        assert_eq!(Watermark(7).millis(), 7);
    }
}
