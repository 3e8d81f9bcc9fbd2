//! [`SpoutHarness`]: one spout driven through the executor's `SpoutTask`, the harness acting
//! as its downstream.

use super::records_as_tuples;
use std::fmt;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, sleep};

use super::{Decls, HarnessError, Sink};
use crate::acker::AckBatch;
use crate::component::{Spout, TaskContext, Watermark};
use crate::config::{ComponentConfig, TopologyConfig};
use crate::executor::spout::SpoutTask;
use crate::executor::{SpoutCommand, SpoutWiring};
use crate::output::route::Message;
use crate::tuple::{Tuple, TupleError};
use crate::value::Values;

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

/// Builds a [`SpoutHarness`]: the spout's outputs and configuration.
pub struct SpoutHarnessBuilder<S> {
    spout: S,
    decls: Decls,
}

impl<S: Spout> SpoutHarnessBuilder<S> {
    declaration_setters!("spout");

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
            metrics: ctx.metrics.clone(),
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
/// See the [module docs](super).
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
            let msg = match msg {
                // records arrive as the tuples they encode into
                Message::Records(records) => Message::Tuples(records_as_tuples(&*records)),
                other => other,
            };
            match msg {
                Message::Tuples(batch) => {
                    for tuple in batch.into_iter().flatten() {
                        let tree = tuple.anchors.first().copied();
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
                Message::Watermark(_) | Message::Drain | Message::Records(_) => {}
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
