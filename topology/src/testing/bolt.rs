//! [`BoltHarness`]: one bolt driven through the executor's `BoltTask`.

use super::records_as_tuples;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};

use super::{Decls, HarnessError, Sink, UPSTREAM};
use crate::acker::{self, EdgeRng};
use crate::component::{Bolt, TaskContext, Watermark};
use crate::config::{ComponentConfig, TopologyConfig};
use crate::executor::BoltWiring;
use crate::executor::bolt::BoltTask;
use crate::output::route::Message;
use crate::output::{BoltOutput, Timer};
use crate::tuple::{Anchors, Fields, StreamMeta, Tuple, TupleError};
use crate::typed::{IntoValues, TypedError};
use crate::value::Values;

#[cfg(doc)]
use crate::output::AckHandle;

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

/// Builds a [`BoltHarness`]: the bolt's inputs and outputs, as a topology would declare them.
pub struct BoltHarnessBuilder<B> {
    bolt: B,
    decls: Decls,
    inputs: Vec<(String, String, Fields)>,
}

impl<B: Bolt> BoltHarnessBuilder<B> {
    declaration_setters!("bolt");

    /// An input stream: tuples of `stream` from `component`, with `fields`. The first one
    /// declared is what [`BoltHarness::execute`] feeds.
    pub fn input<S: AsRef<str>>(mut self, component: &str, stream: &str, fields: &[S]) -> Self {
        self.inputs.push((component.to_owned(), stream.to_owned(), Fields::new(fields)));
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
            pool: Arc::new(crate::output::route::BatchPool::new(
                decls.topology.batch_size,
                decls.topology.channel_capacity + 8,
            )),
            outbox,
            rx,
            upstream: vec![UPSTREAM],
            ack_txs: Arc::from(vec![ack_tx]),
            metrics: ctx.metrics.clone(),
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

/// Drives one bolt through the engine's task code. See the [module docs](super).
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
    /// is forwarded ([`BoltHarness::watermarks_out`]), held back to `Bolt::watermark_hold` (the
    /// rest follows once the hold moves: after a batch of inputs, a tick or a wake-up). A
    /// watermark not above the last one is ignored, as in the executor.
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
                task.flush_after_hook().await
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

    /// The tuples emitted so far (see the [module docs](super) on their order).
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
            tuples.push(Some(Tuple { meta, values, anchors }));
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
            let msg = match msg {
                // records arrive as the tuples they encode into
                Message::Records(records) => Message::Tuples(records_as_tuples(&*records)),
                other => other,
            };
            match msg {
                Message::Tuples(batch) => {
                    for tuple in batch.into_iter().flatten() {
                        let anchored_to = tuple.anchors.iter().map(|&(root, _)| input_of(root)).collect();
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
                Message::Watermark(_) | Message::Drain | Message::Records(_) => {}
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
