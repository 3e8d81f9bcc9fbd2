//! The bolt executor: receives batches in order per upstream task, executes each tuple with panic
//! isolation, acks or fails inputs, combines watermarks (min over upstream tasks, never
//! backwards), and finishes once every upstream task has drained.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{BoltWiring, TaskFailure, TopologyError};
use crate::acker::AckBatch;
use crate::component::{Bolt, ComponentError, TaskContext, Watermark};
use crate::metrics::TaskMetrics;
use crate::output::{BoltOutput, Envelope, Message};
use crate::tuple::Tuple;

struct Cancelled;

/// Busy time of a batch, excluding sends.
struct Timing {
    busy: Duration,
    t0: std::time::Instant,
}

struct BoltTask<B: Bolt> {
    bolt: B,
    out: BoltOutput,
    ack_txs: Arc<[mpsc::Sender<AckBatch>]>,
    metrics: Arc<TaskMetrics>,
    cancel: CancellationToken,
    ctx: TaskContext,
    /// position of each upstream task id in `watermarks` / `drained`
    upstream: HashMap<usize, usize>,
    watermarks: Vec<Option<u64>>,
    combined: Option<u64>,
    drained: Vec<bool>,
    drained_count: usize,
    executed: u64,
    errors: u64,
}

pub(crate) async fn run<B: Bolt>(bolt: B, ctx: TaskContext, w: BoltWiring) -> Result<(), TaskFailure> {
    let n_up = w.upstream.len();
    let mut task = BoltTask {
        bolt,
        out: BoltOutput::new(w.outbox, w.spout_tasks),
        ack_txs: w.ack_txs,
        metrics: w.metrics,
        cancel: ctx.cancel.clone(),
        upstream: w.upstream.iter().enumerate().map(|(i, &id)| (id, i)).collect(),
        watermarks: vec![None; n_up],
        combined: None,
        drained: vec![false; n_up],
        drained_count: 0,
        executed: 0,
        errors: 0,
        ctx,
    };
    let mut rx = w.rx;
    let prepared = tokio::select! {
        r = AssertUnwindSafe(task.bolt.prepare(&task.ctx)).catch_unwind() => r,
        _ = task.cancel.cancelled() => return Ok(()),
    };
    match prepared {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(TopologyError::failed(&task.ctx, "prepare", &e)),
        Err(p) => return Err(TopologyError::panicked(&task.ctx, &*p)),
    }
    let _ = task.main_loop(&mut rx).await;
    task.publish();
    task.bolt.cleanup().await;
    Ok(())
}

impl<B: Bolt> BoltTask<B> {
    async fn main_loop(&mut self, rx: &mut mpsc::Receiver<Envelope>) -> Result<(), Cancelled> {
        loop {
            // fast path without registering a cancellation waiter
            let env = match rx.try_recv() {
                Ok(env) if !self.cancel.is_cancelled() => env,
                _ => tokio::select! {
                    biased;
                    _ = self.cancel.cancelled() => return Err(Cancelled),
                    m = rx.recv() => match m {
                        Some(env) => env,
                        None => return Ok(()),
                    },
                },
            };
            match env.msg {
                Message::Tuples(batch) => self.on_batch(batch).await?,
                Message::Watermark(wm) => self.on_watermark(env.from, wm).await?,
                Message::Drain => {
                    if self.on_drain_marker(env.from).await? {
                        return Ok(());
                    }
                }
            }
            self.publish();
        }
    }

    fn publish(&self) {
        let m = &self.metrics;
        TaskMetrics::set(&m.executed, self.executed);
        TaskMetrics::set(&m.emitted, self.out.outbox.emitted);
        TaskMetrics::set(&m.acked, self.out.acked);
        TaskMetrics::set(&m.failed, self.out.failed);
        TaskMetrics::set(&m.errors, self.errors);
    }

    fn note_error(
        &mut self,
        hook: &str,
        r: &Result<Result<(), ComponentError>, Box<dyn std::any::Any + Send>>,
    ) -> bool {
        match r {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                self.errors += 1;
                tracing::debug!(component = %self.ctx.component, task = self.ctx.task_index, hook, error = %e, "bolt hook failed");
                false
            }
            Err(p) => {
                self.errors += 1;
                tracing::warn!(component = %self.ctx.component, task = self.ctx.task_index, hook, panic = %super::panic_message(&**p), "bolt hook panicked; the task keeps running");
                false
            }
        }
    }

    async fn on_batch(&mut self, batch: Vec<Tuple>) -> Result<(), Cancelled> {
        // Timed per batch, excluding sends; std's clock (tokio's, with test-util, takes a lock).
        let mut timing = Timing { busy: Duration::ZERO, t0: std::time::Instant::now() };
        let n = batch.len() as u64;
        let mut rest = batch.into_iter();
        // One panic guard per batch rather than per tuple; after a panic the tuple that was
        // executing is failed and the rest of the batch runs under a new guard.
        let mut executing = false;
        loop {
            let r = AssertUnwindSafe(self.execute_all(&mut rest, &mut executing, &mut timing)).catch_unwind().await;
            match r {
                Ok(r) => {
                    r?;
                    break;
                }
                Err(p) => {
                    self.errors += 1;
                    tracing::warn!(component = %self.ctx.component, task = self.ctx.task_index, hook = "execute", panic = %super::panic_message(&*p), "bolt hook panicked; the task keeps running");
                    if std::mem::take(&mut executing) {
                        self.out.finish(false);
                        self.executed += 1;
                    }
                }
            }
        }
        timing.busy += timing.t0.elapsed();
        self.metrics.record_latency_batch(timing.busy, n);
        self.flush_all().await?;
        self.send_acks().await
    }

    /// Executes the tuples of `rest` in order, flushing full send buffers on the way.
    /// `executing` is true while a tuple is inside `execute` (for the caller's panic handling).
    async fn execute_all(
        &mut self,
        rest: &mut std::vec::IntoIter<Tuple>,
        executing: &mut bool,
        timing: &mut Timing,
    ) -> Result<(), Cancelled> {
        for tuple in rest {
            self.out.begin(&tuple);
            *executing = true;
            let r = self.bolt.execute(tuple, &mut self.out).await;
            *executing = false;
            let ok = match r {
                Ok(()) => true,
                Err(e) => {
                    self.note_execute_error(&e);
                    false
                }
            };
            self.out.finish(ok);
            self.executed += 1;
            if !self.out.outbox.full.is_empty() {
                let t1 = std::time::Instant::now();
                timing.busy += t1.duration_since(timing.t0);
                self.flush_full().await?;
                timing.t0 = std::time::Instant::now();
            }
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn note_execute_error(&mut self, e: &ComponentError) {
        self.errors += 1;
        tracing::debug!(component = %self.ctx.component, task = self.ctx.task_index, hook = "execute", error = %e, "bolt hook failed");
    }

    async fn on_watermark(&mut self, from: usize, wm: Watermark) -> Result<(), Cancelled> {
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
        self.note_error("on_watermark", &r);
        self.flush_all().await?;
        self.broadcast(Message::Watermark(Watermark(min))).await?;
        self.send_acks().await
    }

    /// Returns true when every upstream task has drained (and the drain was forwarded).
    async fn on_drain_marker(&mut self, from: usize) -> Result<bool, Cancelled> {
        let Some(&pos) = self.upstream.get(&from) else { return Ok(false) };
        if !self.drained[pos] {
            self.drained[pos] = true;
            self.drained_count += 1;
        }
        if self.drained_count < self.drained.len() {
            return Ok(false);
        }
        let r = AssertUnwindSafe(self.bolt.on_drain(&mut self.out)).catch_unwind().await;
        self.note_error("on_drain", &r);
        self.flush_all().await?;
        if self.combined != Some(u64::MAX) {
            self.combined = Some(u64::MAX);
            self.broadcast(Message::Watermark(Watermark::MAX)).await?;
        }
        self.broadcast(Message::Drain).await?;
        self.send_acks().await?;
        Ok(true)
    }

    async fn broadcast(&mut self, msg: Message) -> Result<(), Cancelled> {
        for i in 0..self.out.outbox.targets.len() {
            let m = match &msg {
                Message::Watermark(w) => Message::Watermark(*w),
                Message::Drain => Message::Drain,
                Message::Tuples(_) => continue,
            };
            self.send(i, m).await?;
        }
        Ok(())
    }

    async fn flush_full(&mut self) -> Result<(), Cancelled> {
        let mut full = std::mem::take(&mut self.out.outbox.full);
        for &i in &full {
            if !self.out.outbox.targets[i].buf.is_empty() {
                let batch = self.out.outbox.take(i);
                self.send(i, Message::Tuples(batch)).await?;
            }
        }
        full.clear();
        self.out.outbox.full = full;
        Ok(())
    }

    async fn flush_all(&mut self) -> Result<(), Cancelled> {
        self.out.outbox.full.clear();
        for i in 0..self.out.outbox.targets.len() {
            if !self.out.outbox.targets[i].buf.is_empty() {
                let batch = self.out.outbox.take(i);
                self.send(i, Message::Tuples(batch)).await?;
            }
        }
        Ok(())
    }

    async fn send(&mut self, target: usize, msg: Message) -> Result<(), Cancelled> {
        let env = Envelope { from: self.out.outbox.from, msg };
        let tx = &self.out.outbox.targets[target].tx;
        let env = match tx.try_send(env) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => return Ok(()),
            Err(mpsc::error::TrySendError::Full(env)) => env,
        };
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(Cancelled),
            // a closed channel means the receiver stopped (shutdown); tracked tuples time out
            _ = tx.send(env) => Ok(()),
        }
    }

    /// Sends the ack-tree updates gathered since the last call to their spout tasks.
    async fn send_acks(&mut self) -> Result<(), Cancelled> {
        let dirty = std::mem::take(&mut self.out.acks_dirty);
        for &slot in &dirty {
            // the next batch starts with room for as many updates (no regrowing per batch)
            let next = AckBatch { xors: Vec::with_capacity(self.out.acks[slot].xors.len()), fails: Vec::new() };
            let batch = std::mem::replace(&mut self.out.acks[slot], next);
            let tx = &self.ack_txs[slot];
            let batch = match tx.try_send(batch) {
                Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => continue,
                Err(mpsc::error::TrySendError::Full(b)) => b,
            };
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return Err(Cancelled),
                _ = tx.send(batch) => {}
            }
        }
        let mut dirty = dirty;
        dirty.clear();
        self.out.acks_dirty = dirty;
        Ok(())
    }
}
