//! The bolt executor: receives batches in order per upstream task, hands them to
//! `execute_batch` with panic isolation, acks or fails inputs (a batch's as it returns), fires
//! timers, combines watermarks (min over upstream tasks, never backwards) and forwards them held
//! back to the bolt's `watermark_hold`, and finishes once every upstream task has drained.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use super::{BoltWiring, TaskFailure, TopologyError};
use crate::component::{Bolt, TaskContext, Watermark};
use crate::metrics::TaskMetrics;
use crate::output::route::{Batch, BatchPool, Cancelled, Control, Envelope, Message};
use crate::output::{BoltOutput, Inputs, Timer};

/// One bolt task: the bolt, its output, and the watermark and drain state of its inputs. The
/// executor drives it from its input channel ([`run`]); `crate::testing` drives the same
/// methods directly.
pub(crate) struct BoltTask<B: Bolt> {
    pub(crate) bolt: B,
    pub(crate) out: BoltOutput,
    pool: Arc<BatchPool>,
    metrics: Arc<TaskMetrics>,
    cancel: CancellationToken,
    ctx: TaskContext,
    /// position of each upstream task id in `watermarks` / `drained`
    upstream: HashMap<usize, usize>,
    watermarks: Vec<Option<u64>>,
    /// The input watermark: the minimum over the upstream tasks.
    combined: Option<u64>,
    /// The watermark forwarded downstream: `combined`, held back to `Bolt::watermark_hold`.
    forwarded: Option<u64>,
    drained: Vec<bool>,
    drained_count: usize,
    tick: Option<Duration>,
    next_tick: Option<Instant>,
}

pub(crate) async fn run<B: Bolt>(bolt: B, ctx: TaskContext, w: BoltWiring) -> Result<(), TaskFailure> {
    let (mut task, mut rx) = BoltTask::new(bolt, ctx, w);
    if !task.prepare().await? {
        return Ok(());
    }
    let _ = task.main_loop(&mut rx).await;
    task.stop().await;
    Ok(())
}

fn publish(m: &TaskMetrics, out: &BoltOutput) {
    TaskMetrics::set(&m.executed, out.executed);
    TaskMetrics::set(&m.emitted, out.outbox.emitted);
    TaskMetrics::set(&m.acked, out.acked);
    TaskMetrics::set(&m.failed, out.failed);
    TaskMetrics::set(&m.errors, out.errors);
}

impl<B: Bolt> BoltTask<B> {
    pub(crate) fn new(bolt: B, ctx: TaskContext, w: BoltWiring) -> (Self, mpsc::Receiver<Envelope>) {
        let n_up = w.upstream.len();
        let tick = w.tick;
        let task = BoltTask {
            bolt,
            out: BoltOutput::new(w.outbox, w.ack_txs, ctx.cancel.clone(), ctx.task_index),
            pool: w.pool,
            metrics: w.metrics,
            cancel: ctx.cancel.clone(),
            upstream: w.upstream.iter().enumerate().map(|(i, &id)| (id, i)).collect(),
            watermarks: vec![None; n_up],
            combined: None,
            forwarded: None,
            drained: vec![false; n_up],
            drained_count: 0,
            tick,
            next_tick: tick.map(|t| Instant::now() + t),
            ctx,
        };
        (task, w.rx)
    }

    /// Runs `prepare` (panics isolated). `Ok(false)`: the topology stopped first.
    pub(crate) async fn prepare(&mut self) -> Result<bool, TaskFailure> {
        let prepared = tokio::select! {
            r = AssertUnwindSafe(self.bolt.prepare(&self.ctx)).catch_unwind() => r,
            _ = self.cancel.cancelled() => return Ok(false),
        };
        match prepared {
            Ok(Ok(())) => Ok(true),
            Ok(Err(e)) => Err(TopologyError::failed(&self.ctx, "prepare", &e)),
            Err(p) => Err(TopologyError::panicked(&self.ctx, &*p)),
        }
    }

    /// Runs `cleanup` (panics isolated), then fails the inputs still held (their handles go
    /// with the bolt) and publishes the final counters. Returns the output, for its counters.
    pub(crate) async fn stop(mut self) -> BoltOutput {
        self.publish();
        if let Err(p) = AssertUnwindSafe(self.bolt.cleanup()).catch_unwind().await {
            self.out.note_panic("cleanup", &*p);
        }
        let BoltTask { bolt, mut out, metrics, .. } = self;
        drop(bolt);
        out.reap_dropped();
        let _ = out.send_acks().await;
        publish(&metrics, &out);
        out
    }

    /// The next timer or tick due.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        match (self.out.next_timer(), self.next_tick) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    async fn main_loop(&mut self, rx: &mut mpsc::Receiver<Envelope>) -> Result<(), Cancelled> {
        loop {
            // fast path without registering a cancellation waiter
            let env = match rx.try_recv() {
                Ok(env) if !self.cancel.is_cancelled() => Some(env),
                _ => None,
            };
            let env = match env {
                Some(env) => env,
                None => {
                    let deadline = self.next_deadline();
                    tokio::select! {
                        biased;
                        _ = self.cancel.cancelled() => return Err(Cancelled),
                        m = rx.recv() => match m {
                            Some(env) => env,
                            None => return Ok(()),
                        },
                        _ = sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                            self.fire_timers().await?;
                            self.publish();
                            continue;
                        }
                    }
                }
            };
            match env.msg {
                Message::Tuples(batch) => self.on_batch(batch).await?,
                Message::Records(records) => self.on_inputs(Inputs::from_records(records)).await?,
                Message::Watermark(wm) => self.on_watermark(env.from, wm).await?,
                Message::Drain => {
                    if self.on_drain_marker(env.from).await? {
                        return Ok(());
                    }
                }
            }
            // timers due while the task was busy
            if self.next_deadline().is_some_and(|d| d <= Instant::now()) {
                self.fire_timers().await?;
            }
            self.publish();
            // a bolt whose input never runs dry still lets the runtime run other tasks
            tokio::task::consume_budget().await;
        }
    }

    pub(crate) fn publish(&self) {
        publish(&self.metrics, &self.out);
    }

    pub(crate) async fn on_batch(&mut self, batch: Batch) -> Result<(), Cancelled> {
        self.on_inputs(Inputs::new(batch)).await
    }

    /// Executes a batch of tuples or of records.
    pub(crate) async fn on_inputs(&mut self, mut inputs: Inputs) -> Result<(), Cancelled> {
        // Timed per batch, excluding waits for room downstream; std's clock (tokio's, with
        // test-util, takes a lock).
        let t0 = std::time::Instant::now();
        self.out.blocked = Duration::ZERO;
        let n = inputs.len() as u64;
        loop {
            let before = inputs.len();
            let r = AssertUnwindSafe(self.bolt.execute_batch(&mut inputs, &mut self.out)).catch_unwind().await;
            let ok = self.out.outcome("execute", r);
            // the input being executed when execute_batch returned, failed or panicked, then the
            // inputs it ended well: acked if it returned Ok, else failed with it
            if self.out.in_input() {
                self.out.finish(ok);
            }
            self.out.settle_batch(ok);
            self.out.reap_dropped();
            if inputs.is_empty() || self.cancel.is_cancelled() {
                break;
            }
            if inputs.len() == before {
                // execute_batch returned without taking an input: run the rest one by one
                self.execute_rest(&mut inputs).await;
            }
        }
        // the emptied buffer goes back to the senders (inputs left at a cancel are dropped)
        let (buf, records) = inputs.into_buffers();
        self.pool.put(buf);
        if let Some(records) = records {
            self.pool.put_records(records);
        }
        let busy = t0.elapsed().saturating_sub(self.out.blocked);
        self.metrics.record_latency_batch(busy, n);
        if self.combined != self.forwarded {
            return self.flush_after_hook().await;
        }
        self.out.flush_inner().await
    }

    /// Sends what a hook emitted, and the acks; first the watermark a hold kept back, if the
    /// hold moved.
    pub(crate) async fn flush_after_hook(&mut self) -> Result<(), Cancelled> {
        if self.combined != self.forwarded && self.forward_watermark().await? {
            return self.out.send_acks().await;
        }
        self.out.flush_inner().await
    }

    /// Forwards the input watermark, held back to the bolt's `watermark_hold`, if that is above
    /// the watermark forwarded last (sent behind everything emitted before it). True if sent.
    async fn forward_watermark(&mut self) -> Result<bool, Cancelled> {
        let Some(input) = self.combined else { return Ok(false) };
        let hold = match std::panic::catch_unwind(AssertUnwindSafe(|| self.bolt.watermark_hold())) {
            Ok(hold) => hold,
            Err(p) => {
                self.out.note_panic("watermark_hold", &*p);
                return Ok(false);
            }
        };
        let wm = hold.map_or(input, |h| input.min(h.0));
        if self.forwarded.is_some_and(|f| wm <= f) {
            return Ok(false);
        }
        self.forwarded = Some(wm);
        self.out.send_watermark(Watermark(wm)).await?;
        Ok(true)
    }

    /// Executes the remaining inputs with `execute`, each under its own panic guard.
    async fn execute_rest(&mut self, inputs: &mut Inputs) {
        while let Some(t) = inputs.next(&mut self.out).await {
            let r = AssertUnwindSafe(self.bolt.execute(t, &mut self.out)).catch_unwind().await;
            let ok = self.out.outcome("execute", r);
            self.out.finish(ok);
        }
        self.out.settle_batch(true);
    }

    /// Fires the tick and the wake-ups that are due, each with panic isolation.
    pub(crate) async fn fire_timers(&mut self) -> Result<(), Cancelled> {
        let now = Instant::now();
        if let (Some(at), Some(every)) = (self.next_tick, self.tick) {
            if at <= now {
                // missed ticks are not made up: one tick, then the next a period later
                self.next_tick = Some(now + every);
                self.on_timer(Timer::Tick).await;
            }
        }
        while let Some(token) = self.out.pop_due(now) {
            self.on_timer(Timer::Wakeup(token)).await;
        }
        self.flush_after_hook().await
    }

    pub(crate) async fn on_timer(&mut self, timer: Timer) {
        let r = AssertUnwindSafe(self.bolt.on_timer(timer, &mut self.out)).catch_unwind().await;
        self.out.outcome("on_timer", r);
        self.out.reap_dropped();
    }

    pub(crate) async fn on_watermark(&mut self, from: usize, wm: Watermark) -> Result<(), Cancelled> {
        let Some(&pos) = self.upstream.get(&from) else { return Ok(()) };
        if self.watermarks[pos].is_some_and(|w| w >= wm.0) {
            return Ok(());
        }
        self.watermarks[pos] = Some(wm.0);
        let mut min = u64::MAX;
        for w in &self.watermarks {
            match w {
                Some(w) => min = min.min(*w),
                None => return Ok(()), // an upstream task has not reported: hold back
            }
        }
        if self.combined.is_some_and(|c| min <= c) {
            return Ok(());
        }
        self.combined = Some(min);
        let r = AssertUnwindSafe(self.bolt.on_watermark(Watermark(min), &mut self.out)).catch_unwind().await;
        self.out.outcome("on_watermark", r);
        self.out.reap_dropped();
        self.flush_after_hook().await
    }

    /// Returns true when every upstream task has drained (and the drain was forwarded).
    pub(crate) async fn on_drain_marker(&mut self, from: usize) -> Result<bool, Cancelled> {
        let Some(&pos) = self.upstream.get(&from) else { return Ok(false) };
        if !self.drained[pos] {
            self.drained[pos] = true;
            self.drained_count += 1;
        }
        if self.drained_count < self.drained.len() {
            return Ok(false);
        }
        let r = AssertUnwindSafe(self.bolt.on_drain(&mut self.out)).catch_unwind().await;
        self.out.outcome("on_drain", r);
        self.out.reap_dropped();
        if self.forwarded != Some(u64::MAX) {
            (self.combined, self.forwarded) = (Some(u64::MAX), Some(u64::MAX));
            self.out.send_watermark(Watermark::MAX).await?;
        }
        self.out.broadcast(Control::Drain).await?;
        self.out.send_acks().await?;
        Ok(true)
    }
}
