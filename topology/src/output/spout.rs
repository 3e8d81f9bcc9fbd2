//! [`SpoutOutput`]: where a spout emits; the pending ack trees of its tracked tuples.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use super::EmitError;
use super::records::Record;
use super::route::{Backpressure, Cancelled, Control, Outbox, Payload, Rec};
use crate::acker::{self, AckBatch, PendingTrees};
use crate::builder::StreamRef;
use crate::component::Watermark;
use crate::tuple::Anchors;
use crate::typed::IntoValues;

/// The ack side of a spout task: pending trees, the ack channel, and the completions waiting to
/// be delivered to the spout (applied in bulk, also while a send waits for room).
pub(crate) struct SpoutAcks<M> {
    pub(crate) rx: mpsc::Receiver<AckBatch>,
    pub(crate) pending: PendingTrees<M>,
    /// Completed trees, to deliver with `Spout::ack`.
    pub(crate) acked: Vec<M>,
    /// Failed or timed-out trees, to deliver with `Spout::fail`.
    pub(crate) failed: Vec<M>,
    /// Trees failed by the timeout (counted; their ids are in `failed`).
    pub(crate) timed_out: u64,
    pub(crate) next_check: Instant,
    check_interval: Duration,
    cancel: CancellationToken,
}

impl<M> SpoutAcks<M> {
    pub(crate) fn new(rx: mpsc::Receiver<AckBatch>, check_interval: Duration, cancel: CancellationToken) -> Self {
        SpoutAcks {
            rx,
            pending: PendingTrees::default(),
            acked: Vec::new(),
            failed: Vec::new(),
            timed_out: 0,
            next_check: Instant::now() + check_interval,
            check_interval,
            cancel,
        }
    }

    /// Applies ack-tree updates from a bolt: fails first (a failed tree must not be reported
    /// complete), then XORs.
    pub(crate) fn apply(&mut self, batch: AckBatch) {
        for root in batch.fails {
            if let Some(id) = self.pending.fail(root) {
                self.failed.push(id);
            }
        }
        for (root, x) in batch.xors {
            if let Some(id) = self.pending.apply(root, x) {
                self.acked.push(id);
            }
        }
    }

    /// Applies every update already in the channel.
    pub(crate) fn apply_queued(&mut self) {
        while let Ok(batch) = self.rx.try_recv() {
            self.apply(batch);
        }
    }

    /// Fails the trees whose deadline passed.
    pub(crate) fn expire(&mut self, now: Instant) {
        self.next_check = now + self.check_interval;
        let before = self.failed.len();
        self.pending.expire(now, &mut self.failed);
        self.timed_out += (self.failed.len() - before) as u64;
    }

    /// True when completions wait to be delivered.
    pub(crate) fn has_completions(&self) -> bool {
        !self.acked.is_empty() || !self.failed.is_empty()
    }
}

impl<M: Send> Backpressure for SpoutAcks<M> {
    fn cancel(&self) -> &CancellationToken {
        &self.cancel
    }

    async fn meanwhile(&mut self) {
        let deadline = self.next_check;
        tokio::select! {
            Some(batch) = self.rx.recv() => self.apply(batch),
            _ = sleep_until(deadline) => self.expire(Instant::now()),
        }
    }
}

/// Where a spout emits. Handed to [`crate::Spout::next_tuple`] and [`crate::Spout::drain`].
pub struct SpoutOutput<M> {
    pub(crate) outbox: Outbox,
    pub(crate) acks: SpoutAcks<M>,
    pub(crate) acking: bool,
    pub(crate) slot: usize,
    pub(crate) seq: u64,
    /// The time the timeout of a tracked tuple emitted now counts from: read before a run of
    /// `next_tuple` calls and again after anything in it that waited (room downstream, the
    /// spout's ack hooks, a `flush`), not per emit.
    pub(crate) now: Instant,
    pub(crate) timeout: Duration,
    pub(crate) max_pending: usize,
    pub(crate) watermark: Option<u64>,
    /// The watermark last sent downstream.
    pub(crate) sent_watermark: Option<u64>,
    /// Set by [`SpoutOutput::finish`].
    pub(crate) finished: bool,
}

impl<M: Send> SpoutOutput<M> {
    pub(crate) fn new(
        outbox: Outbox,
        acks: SpoutAcks<M>,
        acking: bool,
        slot: usize,
        timeout: Duration,
        max_pending: usize,
    ) -> Self {
        SpoutOutput {
            outbox,
            acks,
            acking,
            slot,
            seq: 0,
            now: Instant::now(),
            timeout,
            max_pending,
            watermark: None,
            sent_watermark: None,
            finished: false,
        }
    }

    /// Emits an untracked tuple on the default stream (at most once).
    #[inline]
    pub fn emit(&mut self, values: impl IntoValues) -> Result<(), EmitError> {
        let s = self.outbox.default_index()?;
        self.emit_inner(s, self.outbox.encode(values)?, None, None)
    }

    /// Emits a tracked tuple on the default stream: `ack(msg_id)` or `fail(msg_id)` follows,
    /// also when the emit is refused (the error is returned and the message failed).
    #[inline]
    pub fn emit_tracked(&mut self, values: impl IntoValues, msg_id: M) -> Result<(), EmitError> {
        let s = match self.outbox.default_index() {
            Ok(s) => s,
            Err(e) => return Err(self.refused(Some(msg_id), e)),
        };
        match self.outbox.encode(values) {
            Ok(values) => self.emit_inner(s, values, None, Some(msg_id)),
            Err(e) => Err(self.refused(Some(msg_id), e)),
        }
    }

    /// Emits an untracked record of your own type on the default stream: see
    /// [`BoltOutput::emit_record`](crate::BoltOutput::emit_record) for how records travel.
    #[inline]
    pub fn emit_record<T: Record>(&mut self, record: T) -> Result<(), EmitError> {
        let s = self.outbox.default_index()?;
        self.emit_inner(s, Rec(record), None, None)
    }

    /// Emits a tracked record of your own type on the default stream: `ack(msg_id)` or
    /// `fail(msg_id)` follows, also when the emit is refused.
    #[inline]
    pub fn emit_record_tracked<T: Record>(&mut self, record: T, msg_id: M) -> Result<(), EmitError> {
        match self.outbox.default_index() {
            Ok(s) => self.emit_inner(s, Rec(record), None, Some(msg_id)),
            Err(e) => Err(self.refused(Some(msg_id), e)),
        }
    }

    /// Emits a record of your own type on a named stream, tracked when `msg_id` is given.
    pub fn emit_record_to<T: Record>(
        &mut self,
        stream: impl StreamRef,
        record: T,
        msg_id: Option<M>,
    ) -> Result<(), EmitError> {
        match self.outbox.stream_ref(&stream) {
            Ok(s) => self.emit_inner(s, Rec(record), None, msg_id),
            Err(e) => Err(self.refused(msg_id, e)),
        }
    }

    /// Emits on a named stream, tracked when `msg_id` is given.
    pub fn emit_to(
        &mut self,
        stream: impl StreamRef,
        values: impl IntoValues,
        msg_id: Option<M>,
    ) -> Result<(), EmitError> {
        let sent = self.outbox.stream_ref(&stream).and_then(|s| Ok((s, self.outbox.encode(values)?)));
        match sent {
            Ok((s, values)) => self.emit_inner(s, values, None, msg_id),
            Err(e) => Err(self.refused(msg_id, e)),
        }
    }

    /// Emits to task `task` of every subscriber of `stream`, a stream declared with
    /// `direct_output` (its subscribers use `direct_grouping`).
    pub fn emit_direct(
        &mut self,
        task: usize,
        stream: impl StreamRef,
        values: impl IntoValues,
        msg_id: Option<M>,
    ) -> Result<(), EmitError> {
        let sent = self.outbox.stream_ref(&stream).and_then(|s| Ok((s, self.outbox.encode(values)?)));
        match sent {
            Ok((s, values)) => self.emit_inner(s, values, Some(task), msg_id),
            Err(e) => Err(self.refused(msg_id, e)),
        }
    }

    /// Emits several tuples on `stream` as one tracked spout tuple: `ack(msg_id)` follows once
    /// every one of them (and everything anchored to them) is processed, `fail(msg_id)` as soon
    /// as one fails or the tree times out. For a source record that carries a batch of events
    /// (an aggregated Kinesis record, say): it is acked, checkpointed or replayed as a whole.
    /// Returns how many tuples were emitted. If one of them is refused (e.g. a wrong field
    /// count) the error is returned and the message is failed (those emitted before it may
    /// still be processed: at least once).
    pub fn emit_tracked_all<V: IntoValues>(
        &mut self,
        stream: impl StreamRef,
        tuples: impl IntoIterator<Item = V>,
        msg_id: M,
    ) -> Result<usize, EmitError> {
        let s = match self.outbox.stream_ref(&stream) {
            Ok(s) => s,
            Err(e) => return Err(self.refused(Some(msg_id), e)),
        };
        if !self.acking {
            let mut n = 0;
            for v in tuples {
                let sent =
                    self.outbox.encode(v).and_then(|values| self.outbox.dispatch(s, values, None, |_| Anchors::new()));
                if let Err(e) = sent {
                    return Err(self.refused(Some(msg_id), e));
                }
                n += 1;
            }
            self.acks.acked.push(msg_id);
            return Ok(n);
        }
        let root = acker::make_root(self.slot, self.seq);
        self.seq = self.seq.wrapping_add(1);
        let (mut xor, mut copies, mut n) = (0u64, 0usize, 0usize);
        for v in tuples {
            let sent = self.outbox.encode(v).and_then(|values| {
                self.outbox.dispatch(s, values, None, |rng| {
                    let edge = rng.next_edge();
                    xor ^= edge;
                    let mut a = Anchors::new();
                    a.push((root, edge));
                    a
                })
            });
            match sent {
                Ok(c) => copies += c,
                Err(e) => {
                    // the tree is never registered: updates for it are ignored
                    self.acks.failed.push(msg_id);
                    return Err(e);
                }
            }
            n += 1;
        }
        if copies == 0 {
            self.acks.acked.push(msg_id);
        } else {
            self.acks.pending.insert(root, msg_id, xor, self.now + self.timeout);
        }
        Ok(n)
    }

    /// The clock again after a `next_tuple` call that waited (its future was pending at least
    /// once: an outside read, a timer): the tuples it emitted since `seq_before` get deadlines
    /// from now, as they could not have been sent before the call returned, and the tuples
    /// emitted next count from now too.
    #[cold]
    #[inline(never)]
    pub(crate) fn after_wait(&mut self, seq_before: u64) {
        self.now = Instant::now();
        let n = self.seq.wrapping_sub(seq_before);
        if n > 0 {
            let first = acker::make_root(self.slot, seq_before);
            self.acks.pending.extend_deadlines(first, n, self.now + self.timeout);
        }
    }

    /// Advances this task's low watermark (event time in ms). Lower values than before are
    /// ignored. Sent in band, after the tuples emitted before it.
    pub fn watermark(&mut self, ts_millis: u64) {
        if self.watermark.is_none_or(|w| ts_millis > w) {
            self.watermark = Some(ts_millis);
        }
    }

    /// Ends this task's stream (a bounded source): `next_tuple` is not called again, and the task
    /// drains like on [`crate::RunningTopology::drain`] (its final watermark and drain marker
    /// follow the tuples it emitted) and stops once its tracked tuples complete. The topology
    /// finishes when every spout task has finished or drained.
    pub fn finish(&mut self) {
        self.finished = true;
    }

    /// Tracked tuples in flight for this task.
    pub fn pending(&self) -> usize {
        self.acks.pending.len()
    }

    /// How many more tracked tuples may be emitted before `max_spout_pending` is reached.
    pub fn pending_room(&self) -> usize {
        self.max_pending.saturating_sub(self.acks.pending.len())
    }

    /// Sends everything emitted so far downstream, waiting while downstream is full
    /// (backpressure); acks that arrive meanwhile are applied (and delivered after the hook
    /// returns). The engine flushes after every hook; call this inside a hook that emits a lot
    /// to bound the memory its output takes. Returns early when the topology stops.
    pub async fn flush(&mut self) {
        let _ = self.flush_inner().await;
        // the tuples emitted after the wait get deadlines from now
        self.now = Instant::now();
    }

    pub(crate) async fn flush_inner(&mut self) -> Result<(), Cancelled> {
        self.outbox.flush(&mut self.acks).await
    }

    /// Sends the full batches queued so far (backpressure), leaving partial buffers. True if it
    /// had to wait for room.
    pub(crate) async fn send_ready(&mut self) -> Result<bool, Cancelled> {
        self.outbox.send_ready(&mut self.acks).await
    }

    /// Flushes and sends the watermark downstream if it advanced past the last one sent.
    pub(crate) async fn send_watermark_if_advanced(&mut self) -> Result<(), Cancelled> {
        match self.watermark {
            Some(w) if self.sent_watermark.is_none_or(|s| w > s) => {
                self.sent_watermark = Some(w);
                self.outbox.broadcast(&mut self.acks, Control::Watermark(Watermark(w))).await
            }
            _ => Ok(()),
        }
    }

    /// Flushes, then sends the +infinity watermark (unless sent) and the drain marker.
    pub(crate) async fn send_drain(&mut self) -> Result<(), Cancelled> {
        if self.sent_watermark != Some(u64::MAX) {
            self.sent_watermark = Some(u64::MAX);
            self.watermark = Some(u64::MAX);
            self.outbox.broadcast(&mut self.acks, Control::Watermark(Watermark::MAX)).await?;
        }
        self.outbox.broadcast(&mut self.acks, Control::Drain).await
    }

    #[inline]
    fn emit_inner<P: Payload>(
        &mut self,
        stream: usize,
        values: P,
        direct: Option<usize>,
        msg: Option<M>,
    ) -> Result<(), EmitError> {
        match msg {
            Some(msg) if self.acking => {
                let root = acker::make_root(self.slot, self.seq);
                self.seq = self.seq.wrapping_add(1);
                let mut xor = 0u64;
                let sent = values.dispatch(&mut self.outbox, stream, direct, |rng| {
                    let edge = rng.next_edge();
                    xor ^= edge;
                    let mut a = Anchors::new();
                    a.push((root, edge));
                    a
                });
                let copies = match sent {
                    Ok(copies) => copies,
                    Err(e) => return Err(self.refused(Some(msg), e)),
                };
                if copies == 0 {
                    // no subscriber: the tree is complete (Storm's rule); direct streams and
                    // plain streams cannot be mixed up, see the builder
                    self.acks.acked.push(msg);
                } else {
                    self.acks.pending.insert(root, msg, xor, self.now + self.timeout);
                }
            }
            Some(msg) => match values.dispatch(&mut self.outbox, stream, direct, |_| Anchors::new()) {
                Ok(_) => self.acks.acked.push(msg),
                Err(e) => return Err(self.refused(Some(msg), e)),
            },
            None => {
                values.dispatch(&mut self.outbox, stream, direct, |_| Anchors::new())?;
            }
        }
        Ok(())
    }

    /// An emit the engine refused (nothing was sent): a tracked one's message is failed, so
    /// the spout hears of it (`fail`) even if it goes on after the error.
    #[cold]
    #[inline(never)]
    fn refused(&mut self, msg: Option<M>, e: EmitError) -> EmitError {
        if let Some(msg) = msg {
            self.acks.failed.push(msg);
        }
        e
    }
}
