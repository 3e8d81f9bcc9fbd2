//! The spout executor: calls `next_tuple` in bursts, routes and flushes, keeps the pending ack
//! trees of its tuples, delivers ack/fail/timeout to the spout, and obeys control commands.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;

use super::{SpoutCommand, SpoutWiring, TaskFailure, TopologyError};
use crate::acker::AckBatch;
use crate::component::{Spout, TaskContext, Watermark};
use crate::metrics::TaskMetrics;
use crate::output::{Envelope, Message, SpoutOutput};

struct SpoutTask<S: Spout> {
    spout: S,
    out: SpoutOutput<S::MsgId>,
    ack_rx: mpsc::Receiver<AckBatch>,
    ctrl_rx: mpsc::Receiver<SpoutCommand>,
    metrics: Arc<TaskMetrics>,
    cancel: CancellationToken,
    ctx: TaskContext,
    active: bool,
    draining: bool,
    sent_watermark: Option<u64>,
    next_timeout_check: Instant,
    expired: Vec<S::MsgId>,
    // counters published to `metrics`
    acked: u64,
    failed: u64,
    timed_out: u64,
}

/// Marks that the task was cancelled while waiting.
struct Cancelled;

pub(crate) async fn run<S: Spout>(spout: S, ctx: TaskContext, w: SpoutWiring) -> Result<(), TaskFailure> {
    let cfg = ctx.config.clone();
    let out = SpoutOutput::new(w.outbox, cfg.acking, w.slot, cfg.message_timeout(), cfg.max_spout_pending);
    let mut task = SpoutTask {
        spout,
        out,
        ack_rx: w.ack_rx,
        ctrl_rx: w.ctrl_rx,
        metrics: w.metrics,
        cancel: ctx.cancel.clone(),
        active: false,
        draining: false,
        sent_watermark: None,
        next_timeout_check: Instant::now() + cfg.timeout_check_interval(),
        expired: Vec::new(),
        acked: 0,
        failed: 0,
        timed_out: 0,
        ctx,
    };
    let opened = tokio::select! {
        r = AssertUnwindSafe(task.spout.open(&task.ctx)).catch_unwind() => r,
        _ = task.cancel.cancelled() => return Ok(()),
    };
    match opened {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(TopologyError::failed(&task.ctx, "open", &e)),
        Err(p) => return Err(TopologyError::panicked(&task.ctx, &*p)),
    }
    if cfg.start_active {
        task.active = true;
        task.spout.activate().await;
    }
    let result = task.main_loop().await;
    task.publish();
    task.spout.close().await;
    result
}

impl<S: Spout> SpoutTask<S> {
    async fn main_loop(&mut self) -> Result<(), TaskFailure> {
        let cfg = self.ctx.config.clone();
        let burst = cfg.batch_size.max(1);
        let max_pending = cfg.max_spout_pending;
        let max_delay = cfg.max_batch_delay();
        let idle_sleep = cfg.idle_sleep();
        let wakeup = self.ctx.wakeup.0.clone();
        let mut last_flush = Instant::now();
        loop {
            if self.cancel.is_cancelled() {
                return Ok(());
            }
            let mut emitted_any = false;
            let mut retry_later = false;
            if self.active && !self.draining {
                self.out.now = Instant::now();
                let mut calls = 0u64;
                for _ in 0..burst {
                    if self.out.pending.len() >= max_pending {
                        break;
                    }
                    let before = self.out.outbox.emitted;
                    let r = AssertUnwindSafe(self.spout.next_tuple(&mut self.out)).catch_unwind().await;
                    calls += 1;
                    match r {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) if e.is_retryable() => {
                            TaskMetrics::add(&self.metrics.errors, 1);
                            tracing::warn!(component = %self.ctx.component, task = self.ctx.task_index, error = %e, "next_tuple failed; retrying after the idle sleep");
                            retry_later = true;
                        }
                        Ok(Err(e)) => return Err(TopologyError::failed(&self.ctx, "next_tuple", &e)),
                        Err(p) => return Err(TopologyError::panicked(&self.ctx, &*p)),
                    }
                    self.ack_immediate().await;
                    if self.out.outbox.emitted == before || retry_later {
                        break;
                    }
                    emitted_any = true;
                    if !self.out.outbox.full.is_empty() && self.flush_full().await.is_err() {
                        return Ok(());
                    }
                }
                TaskMetrics::add(&self.metrics.executed, calls);
                if self.send_watermark_if_advanced().await.is_err() {
                    return Ok(());
                }
            }
            // acks and commands that arrived meanwhile
            while let Ok(batch) = self.ack_rx.try_recv() {
                self.on_acks(batch).await;
            }
            while let Ok(cmd) = self.ctrl_rx.try_recv() {
                if self.on_command(cmd).await.is_err() {
                    return Ok(());
                }
            }
            let now = Instant::now();
            if now >= self.next_timeout_check {
                self.check_timeouts(now).await;
            }
            if self.draining && self.out.pending.is_empty() {
                return Ok(());
            }
            if emitted_any && !retry_later {
                if now.duration_since(last_flush) >= max_delay {
                    if self.flush_all().await.is_err() {
                        return Ok(());
                    }
                    last_flush = now;
                }
                self.publish();
                continue;
            }
            // not calling next_tuple (at max pending, inactive or out of work): the spout may
            // still move its watermark, e.g. while a window downstream holds every input
            if !self.draining {
                if let Some(w) = self.spout.low_watermark() {
                    self.out.watermark(w);
                }
                if self.send_watermark_if_advanced().await.is_err() {
                    return Ok(());
                }
            }
            // idle: flush everything, then wait for something to do
            if self.flush_all().await.is_err() {
                return Ok(());
            }
            last_flush = Instant::now();
            self.publish();
            let can_call = self.active && !self.draining && self.out.pending.len() < max_pending;
            let deadline = self.next_timeout_check;
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return Ok(()),
                Some(cmd) = self.ctrl_rx.recv() => {
                    if self.on_command(cmd).await.is_err() {
                        return Ok(());
                    }
                }
                Some(batch) = self.ack_rx.recv() => self.on_acks(batch).await,
                _ = wakeup.notified(), if can_call && !retry_later => {}
                _ = sleep(idle_sleep), if can_call => {}
                _ = sleep_until(deadline) => {}
            }
        }
    }

    /// Publishes counters (single writer).
    fn publish(&mut self) {
        let m = &self.metrics;
        TaskMetrics::set(&m.emitted, self.out.outbox.emitted);
        TaskMetrics::set(&m.acked, self.acked);
        TaskMetrics::set(&m.failed, self.failed);
        TaskMetrics::set(&m.timed_out, self.timed_out);
        TaskMetrics::set(&m.pending, self.out.pending.len() as u64);
    }

    async fn ack_immediate(&mut self) {
        if self.out.immediate_acks.is_empty() {
            return;
        }
        for id in std::mem::take(&mut self.out.immediate_acks) {
            self.acked += 1;
            self.spout.ack(id).await;
        }
    }

    async fn on_acks(&mut self, batch: AckBatch) {
        // fails first: a failed tuple's tree must not be reported complete
        for root in batch.fails {
            if let Some(id) = self.out.pending.fail(root) {
                self.failed += 1;
                self.spout.fail(id).await;
            }
        }
        for (root, x) in batch.xors {
            if let Some(id) = self.out.pending.apply(root, x) {
                self.acked += 1;
                self.spout.ack(id).await;
            }
        }
    }

    async fn check_timeouts(&mut self, now: Instant) {
        self.next_timeout_check = now + self.ctx.config.timeout_check_interval();
        self.out.pending.expire(now, &mut self.expired);
        for id in std::mem::take(&mut self.expired) {
            self.timed_out += 1;
            self.failed += 1;
            self.spout.fail(id).await;
        }
    }

    async fn on_command(&mut self, cmd: SpoutCommand) -> Result<(), Cancelled> {
        match cmd {
            SpoutCommand::Activate if !self.active => {
                self.active = true;
                self.spout.activate().await;
            }
            SpoutCommand::Deactivate if self.active => {
                self.active = false;
                self.spout.deactivate().await;
            }
            SpoutCommand::Drain if !self.draining => {
                self.draining = true;
                self.out.now = Instant::now();
                match AssertUnwindSafe(self.spout.drain(&mut self.out)).catch_unwind().await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        TaskMetrics::add(&self.metrics.errors, 1);
                        tracing::warn!(component = %self.ctx.component, task = self.ctx.task_index, error = %e, "spout drain hook failed");
                    }
                    Err(p) => {
                        TaskMetrics::add(&self.metrics.errors, 1);
                        tracing::warn!(component = %self.ctx.component, task = self.ctx.task_index, panic = %super::panic_message(&*p), "spout drain hook panicked");
                    }
                }
                self.ack_immediate().await;
                self.send_watermark_if_advanced().await?;
                self.flush_all().await?;
                // Samza: a +infinity watermark, then the drain marker, to every downstream task
                if self.sent_watermark != Some(u64::MAX) {
                    self.sent_watermark = Some(u64::MAX);
                    self.broadcast(Message::Watermark(Watermark::MAX)).await?;
                }
                self.broadcast(Message::Drain).await?;
            }
            _ => {}
        }
        Ok(())
    }

    async fn send_watermark_if_advanced(&mut self) -> Result<(), Cancelled> {
        match self.out.watermark {
            Some(w) if self.sent_watermark.is_none_or(|s| w > s) => {
                self.sent_watermark = Some(w);
                self.flush_all().await?;
                self.broadcast(Message::Watermark(Watermark(w))).await
            }
            _ => Ok(()),
        }
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
        let full = std::mem::take(&mut self.out.outbox.full);
        for &i in &full {
            if !self.out.outbox.targets[i].buf.is_empty() {
                let batch = self.out.outbox.take(i);
                self.send(i, Message::Tuples(batch)).await?;
            }
        }
        let mut full = full;
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

    /// Sends to one target, draining acks (and checking timeouts) while the target is full so
    /// bolts blocked on this task's ack channel can make progress.
    async fn send(&mut self, target: usize, msg: Message) -> Result<(), Cancelled> {
        let env = Envelope { from: self.out.outbox.from, msg };
        let tx = self.out.outbox.targets[target].tx.clone();
        // fast path: room in the channel
        let env = match tx.try_send(env) {
            Ok(()) => return Ok(()),
            Err(mpsc::error::TrySendError::Closed(_)) => return Ok(()),
            Err(mpsc::error::TrySendError::Full(env)) => env,
        };
        loop {
            let deadline = self.next_timeout_check;
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return Err(Cancelled),
                permit = tx.reserve() => {
                    // a closed channel means the receiver stopped (shutdown); its tuples time out
                    if let Ok(p) = permit {
                        p.send(env);
                    }
                    return Ok(());
                }
                Some(batch) = self.ack_rx.recv() => self.on_acks(batch).await,
                _ = sleep_until(deadline) => self.check_timeouts(Instant::now()).await,
            }
        }
    }
}
