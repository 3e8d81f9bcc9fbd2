//! The spout executor: calls `next_tuple` in bursts, routes and flushes, keeps the pending ack
//! trees of its tuples, delivers ack/fail/timeout to the spout in bulk, and obeys control
//! commands.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::FutureExt;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;

use super::{SpoutCommand, SpoutWiring, TaskFailure, TopologyError};
use crate::component::{Spout, TaskContext};
use crate::metrics::TaskMetrics;
use crate::output::route::Cancelled;
use crate::output::{SpoutAcks, SpoutOutput};

/// One spout task: the spout, its output and pending trees, and its activation state. The
/// executor drives it in a loop ([`run`]); `crate::testing` drives the same methods directly.
pub(crate) struct SpoutTask<S: Spout> {
    pub(crate) spout: S,
    pub(crate) out: SpoutOutput<S::MsgId>,
    ctrl_rx: mpsc::Receiver<SpoutCommand>,
    metrics: Arc<TaskMetrics>,
    cancel: CancellationToken,
    ctx: TaskContext,
    pub(crate) active: bool,
    pub(crate) draining: bool,
    // counters published to `metrics`
    pub(crate) acked: u64,
    pub(crate) failed: u64,
    pub(crate) errors: u64,
    /// Times the runtime polled the task's main loop (see `run`).
    polls: Arc<AtomicU64>,
}

/// What a burst of `next_tuple` calls did ([`SpoutTask::call_burst`]).
struct Burst {
    calls: u64,
    any_emitted: bool,
    last_emitted: bool,
    /// The last call failed with a retryable error.
    retry: bool,
    /// The last call waited (its future was pending: an outside read, a timer): what it
    /// emitted is sent before the spout is called again.
    waited: bool,
}

pub(crate) async fn run<S: Spout>(spout: S, ctx: TaskContext, w: SpoutWiring) -> Result<(), TaskFailure> {
    let mut task = SpoutTask::new(spout, ctx, w);
    if !task.open().await? {
        return Ok(());
    }
    // Counts the times the runtime polls the task: a `next_tuple` call during which the count
    // moved was pending at least once (it waited), at the cost of two loads per call.
    let polls = task.polls.clone();
    let result = {
        let mut main = std::pin::pin!(task.main_loop());
        std::future::poll_fn(|cx| {
            polls.store(polls.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
            main.as_mut().poll(cx)
        })
        .await
    };
    task.close().await;
    result
}

impl<S: Spout> SpoutTask<S> {
    pub(crate) fn new(spout: S, ctx: TaskContext, w: SpoutWiring) -> Self {
        let cfg = ctx.config.clone();
        let acks = SpoutAcks::new(w.ack_rx, cfg.timeout_check_interval(), ctx.cancel.clone());
        let out = SpoutOutput::new(w.outbox, acks, cfg.acking, w.slot, cfg.message_timeout(), w.max_pending);
        SpoutTask {
            spout,
            out,
            ctrl_rx: w.ctrl_rx,
            metrics: w.metrics,
            cancel: ctx.cancel.clone(),
            active: false,
            draining: false,
            acked: 0,
            failed: 0,
            errors: 0,
            polls: Arc::new(AtomicU64::new(0)),
            ctx,
        }
    }

    /// Runs `open` (panics isolated), then `activate` when the topology starts active.
    /// `Ok(false)`: the topology stopped first.
    pub(crate) async fn open(&mut self) -> Result<bool, TaskFailure> {
        let opened = tokio::select! {
            r = AssertUnwindSafe(self.spout.open(&self.ctx)).catch_unwind() => r,
            _ = self.cancel.cancelled() => return Ok(false),
        };
        match opened {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(TopologyError::failed(&self.ctx, "open", &e)),
            Err(p) => return Err(TopologyError::panicked(&self.ctx, &*p)),
        }
        if self.ctx.config.start_active {
            self.active = true;
            let r = AssertUnwindSafe(self.spout.activate()).catch_unwind().await;
            self.isolate("activate", r);
        }
        Ok(true)
    }

    /// Runs `close` (panics isolated) and publishes the final counters.
    pub(crate) async fn close(&mut self) {
        self.publish();
        let r = AssertUnwindSafe(self.spout.close()).catch_unwind().await;
        self.isolate("close", r);
        self.publish();
    }

    /// One `next_tuple` call. `Ok(true)`: it failed with a retryable error (counted), call again
    /// after the idle sleep; a fatal error or a panic fails the task.
    pub(crate) async fn call_next_tuple(&mut self) -> Result<bool, TaskFailure> {
        Ok(self.call_burst(1, usize::MAX).await?.retry)
    }

    /// Calls `next_tuple` up to `max` times under one panic guard, as long as each call emits
    /// and nothing needs the executor: no full batch waits to be sent, no completion waits to
    /// be delivered, max pending is not reached and the spout has not finished. A retryable
    /// error ends the burst (counted, `retry`); a fatal error or a panic fails the task.
    async fn call_burst(&mut self, max: u64, max_pending: usize) -> Result<Burst, TaskFailure> {
        let mut b = Burst { calls: 0, any_emitted: false, last_emitted: false, retry: false, waited: false };
        let (spout, out, polls) = (&mut self.spout, &mut self.out, &self.polls);
        let r = AssertUnwindSafe(async {
            loop {
                let (before, seq) = (out.outbox.emitted, out.seq);
                b.calls += 1;
                // Whether the call waited: a spout that reads an outside source inside
                // `next_tuple` (the window firer reads and writes DynamoDB before it emits) must
                // not lose the time it waited from its tuples' timeouts, nor hold them back while
                // its next call waits again. A call that never returned pending costs no clock read.
                let polled = polls.load(Ordering::Relaxed);
                spout.next_tuple(out).await?;
                let waited = polls.load(Ordering::Relaxed) != polled;
                b.waited = waited;
                if waited {
                    out.after_wait(seq);
                }
                b.last_emitted = out.outbox.emitted != before;
                b.any_emitted |= b.last_emitted;
                if !b.last_emitted
                    || waited
                    || out.finished
                    || b.calls >= max
                    || out.acks.pending.len() >= max_pending
                    || !out.outbox.ready.is_empty()
                    || out.acks.has_completions()
                {
                    return Ok::<(), crate::component::ComponentError>(());
                }
            }
        })
        .catch_unwind()
        .await;
        match r {
            Ok(Ok(())) => Ok(b),
            Ok(Err(e)) if e.is_retryable() => {
                self.errors += 1;
                tracing::warn!(component = %self.ctx.component, task = self.ctx.task_index, error = %e, "next_tuple failed; retrying after the idle sleep");
                b.retry = true;
                Ok(b)
            }
            Ok(Err(e)) => Err(TopologyError::failed(&self.ctx, "next_tuple", &e)),
            Err(p) => Err(TopologyError::panicked(&self.ctx, &*p)),
        }
    }

    /// Polls `Spout::low_watermark` (panics isolated) and sends the watermark if it advanced.
    pub(crate) async fn poll_low_watermark(&mut self) -> Result<(), Cancelled> {
        match std::panic::catch_unwind(AssertUnwindSafe(|| self.spout.low_watermark())) {
            Ok(Some(w)) => self.out.watermark(w),
            Ok(None) => {}
            Err(p) => self.isolate::<()>("low_watermark", Err(p)),
        }
        self.out.send_watermark_if_advanced().await
    }

    async fn main_loop(&mut self) -> Result<(), TaskFailure> {
        let cfg = self.ctx.config.clone();
        let burst = cfg.batch_size.max(1) as u64;
        let max_pending = self.out.max_pending;
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
                // completions applied while waiting reach the spout before it is called
                self.deliver().await;
                // the time the deadlines of the tuples emitted next count from: read again after
                // anything that may wait (room downstream, the spout's ack hooks), so tuples
                // emitted after a wait do not get deadlines already past
                self.out.now = Instant::now();
                let mut calls = 0u64;
                while calls < burst {
                    if self.out.acks.pending.len() >= max_pending {
                        break;
                    }
                    let b = self.call_burst(burst - calls, max_pending).await?;
                    calls += b.calls;
                    emitted_any |= b.any_emitted;
                    if b.retry {
                        retry_later = true;
                    }
                    if self.out.finished {
                        if self.start_drain(false).await.is_err() {
                            return Ok(());
                        }
                        break;
                    }
                    if !b.last_emitted || retry_later || b.waited {
                        break;
                    }
                    if !self.out.outbox.ready.is_empty() {
                        match self.out.send_ready().await {
                            Err(Cancelled) => return Ok(()),
                            Ok(true) => self.out.now = Instant::now(),
                            Ok(false) => {}
                        }
                    }
                    // trees that completed meanwhile reach the spout before it is called again
                    // (checked here: the usual call has nothing to deliver and builds no future)
                    if self.out.acks.has_completions() {
                        self.deliver().await;
                        self.out.now = Instant::now();
                    }
                }
                TaskMetrics::add(&self.metrics.executed, calls);
                self.deliver().await;
                if !self.draining && self.out.send_watermark_if_advanced().await.is_err() {
                    return Ok(());
                }
            }
            // acks and commands that arrived meanwhile
            self.out.acks.apply_queued();
            while let Ok(cmd) = self.ctrl_rx.try_recv() {
                if self.on_command(cmd).await.is_err() {
                    return Ok(());
                }
            }
            let now = Instant::now();
            if now >= self.out.acks.next_check {
                self.out.acks.expire(now);
            }
            self.deliver().await;
            if self.draining && self.out.acks.pending.is_empty() {
                return Ok(());
            }
            if emitted_any && !retry_later {
                if now.duration_since(last_flush) >= max_delay {
                    if self.out.flush_inner().await.is_err() {
                        return Ok(());
                    }
                    last_flush = now;
                }
                self.publish();
                // a spout that never has to wait still lets the runtime run other tasks
                tokio::task::consume_budget().await;
                continue;
            }
            // not calling next_tuple (at max pending, inactive or out of work): the spout may
            // still move its watermark, e.g. while a window downstream holds every input
            if !self.draining && self.poll_low_watermark().await.is_err() {
                return Ok(());
            }
            // idle: flush everything, then wait for something to do
            if self.out.flush_inner().await.is_err() {
                return Ok(());
            }
            last_flush = Instant::now();
            self.publish();
            let can_call = self.active && !self.draining && self.out.acks.pending.len() < max_pending;
            let deadline = self.out.acks.next_check;
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return Ok(()),
                Some(cmd) = self.ctrl_rx.recv() => {
                    if self.on_command(cmd).await.is_err() {
                        return Ok(());
                    }
                }
                Some(batch) = self.out.acks.rx.recv() => self.out.acks.apply(batch),
                _ = wakeup.notified(), if can_call && !retry_later => {}
                _ = sleep(idle_sleep), if can_call => {}
                _ = sleep_until(deadline) => {}
            }
        }
    }

    /// Publishes counters (single writer).
    pub(crate) fn publish(&mut self) {
        let m = &self.metrics;
        TaskMetrics::set(&m.emitted, self.out.outbox.emitted);
        TaskMetrics::set(&m.acked, self.acked);
        TaskMetrics::set(&m.failed, self.failed);
        TaskMetrics::set(&m.timed_out, self.out.acks.timed_out);
        TaskMetrics::set(&m.pending, self.out.acks.pending.len() as u64);
        TaskMetrics::set(&m.errors, self.errors);
    }

    /// Counts and logs a panic (or error) of a hook the task survives.
    fn isolate<T>(&mut self, hook: &'static str, r: Result<T, Box<dyn std::any::Any + Send>>) {
        if let Err(p) = r {
            self.errors += 1;
            tracing::warn!(component = %self.ctx.component, task = self.ctx.task_index, hook, panic = %super::panic_message(&*p), "spout hook panicked; the task keeps running");
        }
    }

    /// Delivers the completed and failed trees to the spout, in bulk. A panic in `ack` or `fail`
    /// is counted and logged; the task keeps running.
    pub(crate) async fn deliver(&mut self) {
        if !self.out.acks.has_completions() {
            return;
        }
        let mut acked = std::mem::take(&mut self.out.acks.acked);
        for id in acked.drain(..) {
            self.acked += 1;
            let r = AssertUnwindSafe(self.spout.ack(id)).catch_unwind().await;
            self.isolate("ack", r);
        }
        self.out.acks.acked = acked;
        let mut failed = std::mem::take(&mut self.out.acks.failed);
        for id in failed.drain(..) {
            self.failed += 1;
            let r = AssertUnwindSafe(self.spout.fail(id)).catch_unwind().await;
            self.isolate("fail", r);
        }
        self.out.acks.failed = failed;
    }

    /// Stops calling `next_tuple`: runs the drain hook (unless the spout finished on its own),
    /// then sends the +infinity watermark and the drain marker behind the last tuple (Samza).
    pub(crate) async fn start_drain(&mut self, run_hook: bool) -> Result<(), Cancelled> {
        if self.draining {
            return Ok(());
        }
        self.begin_drain(run_hook).await;
        self.deliver().await;
        self.send_drain_markers().await
    }

    /// Stops calling `next_tuple` and runs the drain hook (if `run_hook`).
    pub(crate) async fn begin_drain(&mut self, run_hook: bool) {
        self.draining = true;
        if run_hook {
            self.out.now = Instant::now();
            match AssertUnwindSafe(self.spout.drain(&mut self.out)).catch_unwind().await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    self.errors += 1;
                    tracing::warn!(component = %self.ctx.component, task = self.ctx.task_index, error = %e, "spout drain hook failed");
                }
                Err(p) => self.isolate::<()>("drain", Err(p)),
            }
        }
    }

    /// Sends the watermark (if it advanced), then the +infinity watermark and the drain marker.
    pub(crate) async fn send_drain_markers(&mut self) -> Result<(), Cancelled> {
        self.out.send_watermark_if_advanced().await?;
        self.out.send_drain().await
    }

    pub(crate) async fn on_command(&mut self, cmd: SpoutCommand) -> Result<(), Cancelled> {
        match cmd {
            SpoutCommand::Activate if !self.active => {
                self.active = true;
                let r = AssertUnwindSafe(self.spout.activate()).catch_unwind().await;
                self.isolate("activate", r);
            }
            SpoutCommand::Deactivate if self.active => {
                self.active = false;
                let r = AssertUnwindSafe(self.spout.deactivate()).catch_unwind().await;
                self.isolate("deactivate", r);
            }
            SpoutCommand::Drain => self.start_drain(true).await?,
            SpoutCommand::Barrier(done) => {
                // the burst that was under way is over (commands are taken between bursts):
                // what it emitted is in the pending count published now
                self.publish();
                let _ = done.send(());
            }
            _ => {}
        }
        Ok(())
    }
}
