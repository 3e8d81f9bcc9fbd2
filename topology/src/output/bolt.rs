//! [`BoltOutput`]: where a bolt emits, holds inputs past `execute` ([`AckHandle`]), schedules
//! timers ([`Timer`]) and flushes; [`Inputs`]: the batch handed to `Bolt::execute_batch`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::EmitError;
use super::records::{Record, RecordBuf, Records};
use super::route::{Backpressure, Batch, Cancelled, Control, Outbox, Payload, Rec};
use crate::acker::{self, AckBatch, U64BuildHasher, U64Map};
use crate::builder::StreamRef;
use crate::component::{ComponentError, Watermark};
use crate::tuple::{Anchors, DEFAULT_STREAM, Tuple};
use crate::typed::IntoValues;

/// Handles dropped without `ack` or `fail`: their inputs are failed at the next chance.
#[derive(Debug, Default)]
struct DropBox {
    any: AtomicBool,
    ids: Mutex<Vec<u64>>,
}

/// An input held past `execute` with [`BoltOutput::defer_ack`]; ack or fail it later, and anchor
/// later emits to it with [`BoltOutput::emit_anchored`]. Not cloneable: acked or failed once.
/// A handle dropped without either fails its input (its spout tuples are replayed), so a held
/// input is never leaked, also when the code holding it panics.
pub struct AckHandle {
    id: u64,
    drops: Option<Arc<DropBox>>,
}

impl AckHandle {
    /// The handle's id (unique within the task).
    pub fn id(&self) -> u64 {
        self.id
    }

    fn disarm(mut self) -> u64 {
        self.drops = None;
        self.id
    }
}

impl Drop for AckHandle {
    fn drop(&mut self) {
        if let Some(d) = self.drops.take() {
            d.ids.lock().unwrap_or_else(|p| p.into_inner()).push(self.id);
            d.any.store(true, Ordering::Release);
        }
    }
}

impl PartialEq for AckHandle {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for AckHandle {}

impl std::hash::Hash for AckHandle {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

impl std::fmt::Debug for AckHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AckHandle({})", self.id)
    }
}

/// A timer that fired, handed to [`crate::Bolt::on_timer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    /// The periodic tick of the component's `tick_interval_ms` (Storm's tick tuple).
    Tick,
    /// A wake-up scheduled with [`BoltOutput::schedule_after`] or [`BoltOutput::schedule_at`],
    /// with the token given there.
    Wakeup(u64),
}

#[derive(Debug)]
struct Held {
    anchors: Anchors,
    ack_val: u64,
}

#[derive(Debug, Default)]
enum Current {
    #[default]
    None,
    /// An input outside every ack tree: emits are unanchored, ending it only counts it.
    Untracked,
    /// The usual input: one anchor, in one ack tree (no `SmallVec` to copy or walk).
    Input1 {
        root: u64,
        edge: u64,
        ack_val: u64,
    },
    Input {
        anchors: Anchors,
        ack_val: u64,
    },
    Deferred(u64),
}

/// A bolt task's waiting strategy while a send is blocked: nothing else to do.
pub(crate) struct BoltWaiter {
    cancel: CancellationToken,
}

impl Backpressure for BoltWaiter {
    fn cancel(&self) -> &CancellationToken {
        &self.cancel
    }

    fn meanwhile(&mut self) -> impl std::future::Future<Output = ()> + Send {
        std::future::pending()
    }
}

/// Where a bolt emits. Emits are anchored to the current input unless said otherwise; in
/// `execute_batch` outside any input (after its loop) to every input of the batch still open
/// (see [`Inputs`]); in the other hooks (`on_watermark`, `on_drain`, `on_timer`) they are
/// unanchored unless [`BoltOutput::emit_anchored`] names held inputs.
pub struct BoltOutput {
    pub(crate) outbox: Outbox,
    waiter: BoltWaiter,
    current: Current,
    held: U64Map<Held>,
    drops: Arc<DropBox>,
    next_handle: u64,
    /// The inputs of the `execute_batch` under way that ended well, still open: their
    /// ack-tree updates `(root, xor)` (consecutive updates of one root XORed together), queued
    /// when it returns `Ok`, their roots failed when it returns an error or panics
    /// ([`BoltOutput::settle_batch`]). An emit outside any input is anchored to them.
    open: Vec<(u64, u64)>,
    /// How many inputs (tracked or not) `open` stands for.
    open_inputs: u64,
    /// Ack updates per spout task (indexed by ack slot).
    acks: Vec<AckBatch>,
    acks_dirty: Vec<usize>,
    ack_txs: Arc<[mpsc::Sender<AckBatch>]>,
    timers: BinaryHeap<Reverse<(Instant, u64, u64)>>,
    timer_seq: u64,
    /// Inputs executed, acked and failed; errors returned or raised by hooks.
    pub(crate) executed: u64,
    pub(crate) acked: u64,
    pub(crate) failed: u64,
    pub(crate) errors: u64,
    /// Panics raised by hooks (also counted in `errors`).
    pub(crate) panics: u64,
    /// Time spent waiting for room downstream inside `Inputs::next` (excluded from latency).
    pub(crate) blocked: Duration,
    component: Arc<str>,
    task: usize,
}

impl BoltOutput {
    pub(crate) fn new(
        outbox: Outbox,
        ack_txs: Arc<[mpsc::Sender<AckBatch>]>,
        cancel: CancellationToken,
        task: usize,
    ) -> Self {
        let component = outbox.component.clone();
        BoltOutput {
            outbox,
            waiter: BoltWaiter { cancel },
            current: Current::None,
            held: U64Map::default(),
            drops: Arc::new(DropBox::default()),
            next_handle: 0,
            open: Vec::new(),
            open_inputs: 0,
            acks: (0..ack_txs.len()).map(|_| AckBatch::default()).collect(),
            acks_dirty: Vec::new(),
            ack_txs,
            timers: BinaryHeap::new(),
            timer_seq: 0,
            executed: 0,
            acked: 0,
            failed: 0,
            errors: 0,
            panics: 0,
            blocked: Duration::ZERO,
            component,
            task,
        }
    }

    /// Emits on the default stream, anchored to the current input (unanchored outside execute).
    #[inline]
    pub fn emit(&mut self, values: impl IntoValues) -> Result<(), EmitError> {
        let s = self.outbox.default_index()?;
        let values = self.outbox.encode(values)?;
        self.emit_current(s, values, None)
    }

    /// Emits a record of your own type on the default stream, anchored to the current input.
    /// Its fields, in declaration order, are the stream's fields (declare them with
    /// [`fields_of`](crate::typed::fields_of)); they carry the values
    /// [`to_values`](crate::typed::to_values) encodes.
    ///
    /// Unlike [`BoltOutput::emit`]`(&record)`, the record is not encoded: it travels as it is to
    /// a single subscriber with a shuffle, local-or-shuffle, or fields grouping on one field of
    /// primitive type, in a batch of records of its type, and a bolt reading it with
    /// [`Inputs::for_each_record`] gets it by reference. Any other reader gets it as a tuple,
    /// and to other subscriptions (several subscribers, a custom grouping, a fields grouping on
    /// several fields or on a field that is not a primitive) it is sent as values; the tuples
    /// are the same either way. A direct stream takes [`BoltOutput::emit_direct`]. The first
    /// record of a type on a stream is checked against the stream's fields: another number of
    /// values is an [`EmitError::FieldCount`], a struct whose field names are not the stream's
    /// in its order an [`EmitError::RecordFields`].
    #[inline]
    pub fn emit_record<T: Record>(&mut self, record: T) -> Result<(), EmitError> {
        let s = self.outbox.default_index()?;
        self.emit_current(s, Rec(record), None)
    }

    /// [`BoltOutput::emit_record`] on a named stream.
    pub fn emit_record_to<T: Record>(&mut self, stream: impl StreamRef, record: T) -> Result<(), EmitError> {
        let s = self.outbox.stream_ref(&stream)?;
        self.emit_current(s, Rec(record), None)
    }

    /// Emits on a named stream, anchored to the current input.
    pub fn emit_to(&mut self, stream: impl StreamRef, values: impl IntoValues) -> Result<(), EmitError> {
        let s = self.outbox.stream_ref(&stream)?;
        self.emit_current(s, self.outbox.encode(values)?, None)
    }

    /// Emits to task `task` of every subscriber of `stream` (declared with `direct_output`),
    /// anchored to the current input.
    pub fn emit_direct(
        &mut self,
        task: usize,
        stream: impl StreamRef,
        values: impl IntoValues,
    ) -> Result<(), EmitError> {
        let s = self.outbox.stream_ref(&stream)?;
        self.emit_current(s, self.outbox.encode(values)?, Some(task))
    }

    /// Emits an untracked tuple on the default stream.
    pub fn emit_unanchored(&mut self, values: impl IntoValues) -> Result<(), EmitError> {
        self.emit_unanchored_to(DEFAULT_STREAM, values)
    }

    /// Emits an untracked tuple on a named stream.
    pub fn emit_unanchored_to(&mut self, stream: impl StreamRef, values: impl IntoValues) -> Result<(), EmitError> {
        let s = self.outbox.stream_ref(&stream)?;
        self.outbox.dispatch(s, self.outbox.encode(values)?, None, |_| Anchors::new()).map(|_| ())
    }

    /// Emits on `stream` anchored to held inputs (multi-anchoring, e.g. a window's output). A
    /// handle given twice counts once. A handle whose input the engine already failed (an
    /// `execute` that returned an error after holding it) is skipped: the emit is anchored to
    /// the others, and is [`EmitError::AnchorCompleted`] only if every handle given is such.
    pub fn emit_anchored(
        &mut self,
        anchors: &[&AckHandle],
        stream: impl StreamRef,
        values: impl IntoValues,
    ) -> Result<(), EmitError> {
        let s = self.outbox.stream_ref(&stream)?;
        let mut ids: Vec<u64> = anchors.iter().map(|h| h.id).collect();
        first_of_each(&mut ids);
        let mut parents: Vec<(u64, Anchors, u64)> = Vec::with_capacity(ids.len());
        let mut completed = None;
        for id in ids {
            match self.held.get(&id) {
                Some(held) => parents.push((id, held.anchors.clone(), held.ack_val)),
                None => {
                    completed.get_or_insert(id);
                }
            }
        }
        if let (true, Some(handle)) = (parents.is_empty(), completed) {
            return Err(EmitError::AnchorCompleted { handle });
        }
        self.outbox.dispatch(s, self.outbox.encode(values)?, None, |rng| {
            acker::anchor_child(parents.iter_mut().map(|(_, a, v)| (&*a, v)), rng)
        })?;
        for (id, _, v) in parents {
            if let Some(h) = self.held.get_mut(&id) {
                h.ack_val = v;
            }
        }
        Ok(())
    }

    /// Holds the current input past `execute`: it is not acked when `execute` returns; ack or
    /// fail it later through the handle (dropping the handle fails it). If `execute` returns an
    /// error it is failed anyway.
    pub fn defer_ack(&mut self) -> Result<AckHandle, EmitError> {
        let current = match std::mem::take(&mut self.current) {
            Current::Untracked => Current::Input { anchors: Anchors::new(), ack_val: 0 },
            Current::Input1 { root, edge, ack_val } => {
                let mut anchors = Anchors::new();
                anchors.push((root, edge));
                Current::Input { anchors, ack_val }
            }
            other => other,
        };
        match current {
            Current::Input { anchors, ack_val } => {
                let id = self.next_handle;
                self.next_handle += 1;
                self.held.insert(id, Held { anchors, ack_val });
                self.current = Current::Deferred(id);
                Ok(AckHandle { id, drops: Some(self.drops.clone()) })
            }
            other => {
                self.current = other;
                Err(EmitError::NoCurrentInput)
            }
        }
    }

    /// Acks a held input.
    pub fn ack(&mut self, handle: AckHandle) {
        let id = handle.disarm();
        if let Some(h) = self.held.remove(&id) {
            self.queue_ack(&h.anchors, h.ack_val);
        }
    }

    /// Fails a held input: its spout tuples are failed (and replayed).
    pub fn fail(&mut self, handle: AckHandle) {
        let id = handle.disarm();
        if let Some(h) = self.held.remove(&id) {
            self.queue_fail(&h.anchors);
        }
    }

    /// Number of inputs held with `defer_ack`.
    pub fn held_count(&self) -> usize {
        self.held.len()
    }

    /// Calls [`crate::Bolt::on_timer`] with [`Timer::Wakeup`]`(token)` after `delay` (or as soon
    /// as the task is free after that). Any number of wake-ups may be pending.
    pub fn schedule_after(&mut self, delay: Duration, token: u64) {
        self.schedule_at(Instant::now() + delay, token);
    }

    /// Calls [`crate::Bolt::on_timer`] with [`Timer::Wakeup`]`(token)` at `at`.
    pub fn schedule_at(&mut self, at: Instant, token: u64) {
        self.timer_seq += 1;
        self.timers.push(Reverse((at, self.timer_seq, token)));
    }

    /// Number of scheduled wake-ups not yet fired.
    pub fn scheduled(&self) -> usize {
        self.timers.len()
    }

    /// Sends everything emitted so far downstream, and the acks gathered, waiting while
    /// downstream is full (backpressure). The engine flushes after every hook; call this inside
    /// a hook that emits a lot (an `on_drain` writing out a whole state) to bound the memory its
    /// output takes. Returns early when the topology stops.
    pub async fn flush(&mut self) {
        let _ = self.flush_inner().await;
    }

    pub(crate) async fn flush_inner(&mut self) -> Result<(), Cancelled> {
        self.outbox.flush(&mut self.waiter).await?;
        self.send_acks().await
    }

    pub(crate) async fn broadcast(&mut self, control: Control) -> Result<(), Cancelled> {
        self.outbox.broadcast(&mut self.waiter, control).await
    }

    pub(crate) async fn send_watermark(&mut self, wm: Watermark) -> Result<(), Cancelled> {
        self.broadcast(Control::Watermark(wm)).await
    }

    /// The earliest scheduled wake-up.
    pub(crate) fn next_timer(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((at, _, _))| *at)
    }

    /// Pops a wake-up due at `now`.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<u64> {
        match self.timers.peek() {
            Some(Reverse((at, _, _))) if *at <= now => self.timers.pop().map(|Reverse((_, _, t))| t),
            _ => None,
        }
    }

    #[inline]
    fn emit_current<P: Payload>(&mut self, stream: usize, values: P, direct: Option<usize>) -> Result<(), EmitError> {
        match &mut self.current {
            Current::Untracked => values.dispatch(&mut self.outbox, stream, direct, |_| Anchors::new()).map(|_| ()),
            Current::None if self.open.is_empty() => {
                values.dispatch(&mut self.outbox, stream, direct, |_| Anchors::new()).map(|_| ())
            }
            // the usual input of one ack tree: what `anchor_child` does for a single root, inline
            Current::Input1 { root, ack_val, .. } => {
                let root = *root;
                values
                    .dispatch(&mut self.outbox, stream, direct, |rng| {
                        let edge = rng.next_edge();
                        *ack_val ^= edge;
                        let mut child = Anchors::new();
                        child.push((root, edge));
                        child
                    })
                    .map(|_| ())
            }
            _ => self.emit_multi(stream, values, direct),
        }
    }

    /// Emits anchored to an input of several ack trees, to the held current input, or, outside
    /// any input, to the open inputs of the batch (work after an `execute_batch` loop).
    #[inline(never)]
    fn emit_multi<P: Payload>(&mut self, stream: usize, values: P, direct: Option<usize>) -> Result<(), EmitError> {
        let (anchors, ack_val) = match &mut self.current {
            Current::None => {
                let open = &mut self.open;
                acker::merge_roots(open);
                return values
                    .dispatch(&mut self.outbox, stream, direct, |rng| acker::anchor_to_updates(open, rng))
                    .map(|_| ());
            }
            Current::Input { anchors, ack_val } => (&*anchors, ack_val),
            Current::Deferred(id) => {
                let id = *id;
                let Some(Held { anchors, ack_val }) = self.held.get_mut(&id) else {
                    return Err(EmitError::AnchorCompleted { handle: id });
                };
                (&*anchors, ack_val)
            }
            _ => return values.dispatch(&mut self.outbox, stream, direct, |_| Anchors::new()).map(|_| ()),
        };
        values
            .dispatch(&mut self.outbox, stream, direct, |rng| acker::anchor_child([(anchors, &mut *ack_val)], rng))
            .map(|_| ())
    }

    #[inline]
    fn queue_ack(&mut self, anchors: &Anchors, ack_val: u64) {
        self.acked += 1;
        for (root, x) in acker::ack_updates(anchors, ack_val) {
            self.queue_update(root, x);
        }
    }

    /// Queues one ack-tree update for the spout task owning `root`.
    #[inline(always)]
    fn queue_update(&mut self, root: u64, x: u64) {
        let slot = acker::root_slot(root);
        if let Some(b) = self.acks.get_mut(slot) {
            if b.is_empty() {
                self.acks_dirty.push(slot);
            }
            // Consecutive updates of one root (e.g. the words of one sentence) are XORed
            // together: the spout applies one update instead of several.
            match b.xors.last_mut() {
                Some((r, v)) if *r == root => *v ^= x,
                _ => b.xors.push((root, x)),
            }
        }
    }

    fn queue_fail(&mut self, anchors: &Anchors) {
        self.failed += 1;
        for &(root, _) in anchors {
            self.queue_fail_root(root);
        }
    }

    /// Queues the failure of one ack tree for the spout task owning `root`.
    fn queue_fail_root(&mut self, root: u64) {
        let slot = acker::root_slot(root);
        if let Some(b) = self.acks.get_mut(slot) {
            if b.is_empty() {
                self.acks_dirty.push(slot);
            }
            b.fails.push(root);
        }
    }

    /// Fails the inputs whose handles were dropped without `ack` or `fail`.
    pub(crate) fn reap_dropped(&mut self) {
        if !self.drops.any.load(Ordering::Acquire) {
            return;
        }
        self.drops.any.store(false, Ordering::Release);
        let ids = std::mem::take(&mut *self.drops.ids.lock().unwrap_or_else(|p| p.into_inner()));
        for id in ids {
            if let Some(h) = self.held.remove(&id) {
                tracing::debug!(component = %self.component, task = self.task, handle = id, "held input dropped without ack or fail: failing it");
                self.queue_fail(&h.anchors);
            }
        }
    }

    /// True while an input is being executed (begun and not finished).
    #[inline]
    pub(crate) fn in_input(&self) -> bool {
        !matches!(self.current, Current::None)
    }

    /// Starts executing an input.
    #[inline(always)]
    pub(crate) fn begin(&mut self, input: &Tuple) {
        self.begin_anchors(&input.anchors);
    }

    /// Starts executing an input with these anchors.
    #[inline(always)]
    pub(crate) fn begin_anchors(&mut self, anchors: &[(u64, u64)]) {
        self.executed += 1;
        // each arm stores only its own variant (an untracked input writes the tag alone)
        match *anchors {
            [] => self.current = Current::Untracked,
            // no SmallVec for the usual single anchor
            [(root, edge)] => self.current = Current::Input1 { root, edge, ack_val: 0 },
            _ => self.current = Current::Input { anchors: Anchors::from_slice(anchors), ack_val: 0 },
        }
    }

    /// An input that arrived as a record but cannot be delivered as a tuple (it does not encode
    /// into its stream's fields): counted as executed and as an error, and failed.
    #[cold]
    pub(crate) fn fail_undeliverable(&mut self, anchors: &Anchors, reason: String) {
        self.executed += 1;
        self.note_error("execute", &ComponentError::fatal(reason));
        self.queue_fail(anchors);
    }

    /// Ends executing an input: on success it joins the batch's open inputs (acked or failed
    /// with the batch, [`BoltOutput::settle_batch`]); on error it is failed at once (also when
    /// deferred).
    #[inline(always)]
    pub(crate) fn finish(&mut self, ok: bool) {
        match self.current {
            Current::Untracked => {
                self.current = Current::None;
                if ok {
                    self.open_inputs += 1;
                } else {
                    self.failed += 1;
                }
            }
            Current::Input1 { root, edge, ack_val } if ok => {
                self.current = Current::None;
                self.open_inputs += 1;
                self.open_update(root, edge ^ ack_val);
            }
            _ => self.finish_tracked(ok),
        }
    }

    #[inline]
    fn finish_tracked(&mut self, ok: bool) {
        match std::mem::take(&mut self.current) {
            Current::None | Current::Untracked => {}
            Current::Input1 { root, edge, ack_val } => {
                if ok {
                    self.open_inputs += 1;
                    self.open_update(root, edge ^ ack_val);
                } else {
                    self.failed += 1;
                    self.queue_fail_root(root);
                }
            }
            Current::Input { anchors, ack_val } => {
                if ok {
                    self.open_inputs += 1;
                    for (root, x) in acker::ack_updates(&anchors, ack_val) {
                        self.open_update(root, x);
                    }
                } else {
                    self.queue_fail(&anchors);
                }
            }
            Current::Deferred(id) => {
                if !ok {
                    if let Some(h) = self.held.remove(&id) {
                        self.queue_fail(&h.anchors);
                    }
                }
            }
        }
    }

    /// Adds an ack-tree update of an open input (see `open`).
    #[inline(always)]
    fn open_update(&mut self, root: u64, x: u64) {
        match self.open.last_mut() {
            Some((r, v)) if *r == root => *v ^= x,
            _ => self.open.push((root, x)),
        }
    }

    /// Settles the open inputs of a batch as `execute_batch` returns: acks them when it
    /// returned `Ok`, fails them (their spout tuples are replayed) when it returned an error or
    /// panicked outside any input.
    #[inline]
    pub(crate) fn settle_batch(&mut self, ok: bool) {
        if ok {
            self.acked += self.open_inputs;
        } else {
            self.failed += self.open_inputs;
        }
        self.open_inputs = 0;
        if !self.open.is_empty() {
            self.settle_open(ok);
        }
    }

    /// Queues the ack-tree updates of the open inputs, or fails their roots.
    fn settle_open(&mut self, ok: bool) {
        let mut open = std::mem::take(&mut self.open);
        if ok {
            let one_slot = match open.first() {
                None => None,
                // one spout task: every root is its
                Some(_) if self.acks.len() == 1 => Some(0),
                Some(&(first, _)) => {
                    let slot = acker::root_slot(first);
                    open.iter().all(|&(r, _)| acker::root_slot(r) == slot).then_some(slot)
                }
            };
            match one_slot.filter(|&slot| slot < self.acks.len()) {
                // the usual case, every root of one spout task: handed over at once
                Some(slot) => {
                    let b = &mut self.acks[slot];
                    if b.is_empty() {
                        self.acks_dirty.push(slot);
                    }
                    if b.xors.is_empty() {
                        std::mem::swap(&mut b.xors, &mut open);
                    } else {
                        b.xors.extend_from_slice(&open);
                    }
                }
                None => {
                    for &(root, x) in &open {
                        self.queue_update(root, x);
                    }
                }
            }
        } else {
            for &(root, _) in &open {
                self.queue_fail_root(root);
            }
        }
        open.clear();
        self.open = open;
    }

    /// A panic in the per-input code of `Inputs::for_each`: fails the input being executed (as
    /// an error would), counted and logged.
    #[cold]
    #[inline(never)]
    pub(crate) fn input_panicked(&mut self, payload: &(dyn std::any::Any + Send)) {
        self.note_panic("execute", payload);
        if self.in_input() {
            self.finish(false);
        }
    }

    /// Counts and logs an error returned by a hook.
    #[cold]
    #[inline(never)]
    pub(crate) fn note_error(&mut self, hook: &str, e: &ComponentError) {
        self.errors += 1;
        tracing::debug!(component = %self.component, task = self.task, hook, error = %e, "bolt hook failed");
    }

    /// The outcome of a hook run under a panic guard: `true` on success; an error or a panic is
    /// counted and logged.
    pub(crate) fn outcome(
        &mut self,
        hook: &str,
        r: Result<Result<(), ComponentError>, Box<dyn std::any::Any + Send>>,
    ) -> bool {
        match r {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                self.note_error(hook, &e);
                false
            }
            Err(p) => {
                self.note_panic(hook, &*p);
                false
            }
        }
    }

    /// Counts and logs a panic raised by a hook.
    #[cold]
    #[inline(never)]
    pub(crate) fn note_panic(&mut self, hook: &str, payload: &(dyn std::any::Any + Send)) {
        self.errors += 1;
        self.panics += 1;
        tracing::warn!(component = %self.component, task = self.task, hook, panic = %crate::executor::panic_message(payload), "bolt hook panicked; the task keeps running");
    }

    /// Sends the full batches queued so far (backpressure), leaving partial buffers.
    pub(crate) async fn send_ready(&mut self) -> Result<(), Cancelled> {
        self.outbox.send_ready(&mut self.waiter).await.map(drop)
    }

    /// True when full batches wait to be sent.
    pub(crate) fn has_ready(&self) -> bool {
        !self.outbox.ready.is_empty()
    }

    /// Sends the ack-tree updates gathered since the last call to their spout tasks.
    pub(crate) async fn send_acks(&mut self) -> Result<(), Cancelled> {
        self.reap_dropped();
        let mut dirty = std::mem::take(&mut self.acks_dirty);
        for &slot in &dirty {
            // the next batch starts with room for as many updates (no regrowing per batch)
            let next = AckBatch { xors: Vec::with_capacity(self.acks[slot].xors.len()), fails: Vec::new() };
            let batch = std::mem::replace(&mut self.acks[slot], next);
            let tx = &self.ack_txs[slot];
            let batch = match tx.try_send(batch) {
                Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => continue,
                Err(mpsc::error::TrySendError::Full(b)) => b,
            };
            tokio::select! {
                biased;
                _ = self.waiter.cancel.cancelled() => return Err(Cancelled),
                _ = tx.send(batch) => {}
            }
        }
        dirty.clear();
        self.acks_dirty = dirty;
        Ok(())
    }
}

/// Keeps the first of each id, in order (a window's aggregate names thousands: not quadratic).
fn first_of_each(ids: &mut Vec<u64>) {
    if ids.len() <= 16 {
        let mut kept = 0;
        for i in 0..ids.len() {
            if !ids[..kept].contains(&ids[i]) {
                ids[kept] = ids[i];
                kept += 1;
            }
        }
        ids.truncate(kept);
    } else {
        let mut seen = std::collections::HashSet::with_capacity_and_hasher(ids.len(), U64BuildHasher::default());
        ids.retain(|id| seen.insert(*id));
    }
}

/// Drops an executed input where it lies. A tuple whose values and anchors are stored inline
/// (the usual case) owns nothing but its values: they are dropped in place here, inline in the
/// loop, and the emptied tuple is forgotten (it owns nothing more: no leak), instead of going
/// through `SmallVec`'s out-of-line drop (a call with register saves and restores per tuple).
#[inline(always)]
fn drop_input(slot: &mut Option<Tuple>) {
    if let Some(t) = slot {
        if !t.values.0.spilled() && !t.anchors.spilled() {
            for v in t.values.0.iter_mut() {
                *v = crate::value::Value::Null;
            }
            std::mem::forget(slot.take());
            return;
        }
    }
    *slot = None;
}

/// The inputs of one batch, handed to [`crate::Bolt::execute_batch`]. Taking an input with
/// [`Inputs::next`] ends the previous one, unless it was failed with [`Inputs::fail_current`]
/// or held with [`BoltOutput::defer_ack`]: it stays open until `execute_batch` returns, and is
/// acked if it returns `Ok`, failed if it returns an error or panics (the work after the loop,
/// a write to an external store, is part of every input's processing). Emits between two
/// `next` calls are anchored to the input taken by the first; emits after the last (outside
/// any input) to every open input of the batch.
pub struct Inputs {
    // taken out in place, not through a consuming iterator, so the emptied buffer can be reused
    // (`into_buffers`)
    batch: Batch,
    /// A batch of records (`batch` is then empty): read as they are by `for_each_record` of
    /// their type, encoded into `batch` for any other reader.
    records: Option<Box<dyn RecordBuf>>,
    next: usize,
}

impl std::fmt::Debug for Inputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inputs").field("len", &self.len()).field("records", &self.records.is_some()).finish()
    }
}

impl Inputs {
    pub(crate) fn new(batch: Batch) -> Self {
        Inputs { batch, records: None, next: 0 }
    }

    pub(crate) fn from_records(records: Box<dyn RecordBuf>) -> Self {
        Inputs { batch: Vec::new(), records: Some(records), next: 0 }
    }

    /// The batch's buffer, emptied, for reuse, and the record batch if it was one.
    pub(crate) fn into_buffers(self) -> (Batch, Option<Box<dyn RecordBuf>>) {
        let mut buf = self.batch;
        buf.clear();
        (buf, self.records)
    }

    /// Turns the records not yet executed into tuples, for a reader of tuples. A record that
    /// cannot be a tuple of its stream is failed here (counted as an error).
    #[cold]
    #[inline(never)]
    fn records_to_tuples(&mut self, out: &mut BoltOutput) {
        if let Some(records) = self.records.take() {
            let (tuples, failed) = records.to_tuples(self.next);
            for (anchors, reason) in failed {
                out.fail_undeliverable(&anchors, reason);
            }
            self.batch = tuples;
            self.next = 0;
        }
    }

    /// The next input, after ending the previous one (it stays open until `execute_batch`
    /// returns, see [`Inputs`]), and sending full output batches downstream, waiting for room
    /// (backpressure). `None` at the end of the batch, or when the topology stops.
    #[inline]
    pub async fn next(&mut self, out: &mut BoltOutput) -> Option<Tuple> {
        if out.in_input() {
            out.finish(true);
        }
        if self.records.is_some() {
            self.records_to_tuples(out);
        }
        if !out.outbox.ready.is_empty() {
            Self::send_ready(out).await.ok()?;
        }
        let t = self.batch.get_mut(self.next)?.take()?;
        self.next += 1;
        out.begin(&t);
        Some(t)
    }

    /// Runs `f` on every remaining input, in order: the fast way to write an `execute_batch`
    /// whose per-input work does not await. An input `f` ends with `Ok` stays open until
    /// `execute_batch` returns (acked if it returns `Ok`, failed otherwise, see [`Inputs`]); one
    /// it ends with `Err`, or panics on, is failed at once (and counted) and the loop goes on
    /// with the next. Full output batches are sent between inputs, with backpressure, as with
    /// [`Inputs::next`]. Returns early when the topology stops.
    ///
    /// Work after the loop belongs to the whole batch: emit a summary (anchored to every
    /// input), write to a store, and return its error to fail the batch:
    ///
    /// ```
    /// # use squall_topology::*;
    /// # struct Db; impl Db { async fn write(&mut self, _: u64) -> Result<(), ComponentError> { Ok(()) } }
    /// # struct Sums(Db);
    /// impl Bolt for Sums {
    ///     # async fn execute(&mut self, _t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> { Ok(()) }
    ///     async fn execute_batch(&mut self, inputs: &mut Inputs, out: &mut BoltOutput) -> Result<(), ComponentError> {
    ///         let mut sum = 0;
    ///         inputs.for_each(out, |t, _out| {
    ///             sum += t.get_u64("n")?;
    ///             Ok(())
    ///         }).await;
    ///         out.emit([sum])?; // anchored to the inputs summed
    ///         self.0.write(sum).await // on error, every input summed is failed (replayed)
    ///     }
    /// }
    /// ```
    ///
    /// ```
    /// # use squall_topology::*;
    /// # #[derive(Default)] struct Count(std::collections::HashMap<String, u64>);
    /// impl Bolt for Count {
    ///     async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
    ///         *self.0.entry(t.get_str("word")?.to_owned()).or_default() += 1;
    ///         Ok(())
    ///     }
    ///     async fn execute_batch(&mut self, inputs: &mut Inputs, out: &mut BoltOutput) -> Result<(), ComponentError> {
    ///         inputs.for_each(out, |t, _out| {
    ///             *self.0.entry(t.get_str("word")?.to_owned()).or_default() += 1;
    ///             Ok(())
    ///         }).await;
    ///         Ok(())
    ///     }
    /// }
    /// ```
    pub async fn for_each(
        &mut self,
        out: &mut BoltOutput,
        mut f: impl FnMut(&Tuple, &mut BoltOutput) -> Result<(), ComponentError>,
    ) {
        if out.in_input() {
            out.finish(true);
        }
        if self.records.is_some() {
            self.records_to_tuples(out);
        }
        loop {
            if !out.outbox.ready.is_empty() && Self::send_ready(out).await.is_err() {
                return;
            }
            // one panic guard per run of inputs, not per input (it costs nothing until a panic)
            match catch_unwind(AssertUnwindSafe(|| self.run_until_ready(out, &mut f))) {
                Ok(true) => {}
                Ok(false) => return,
                Err(panic) => out.input_panicked(&*panic),
            }
        }
    }

    /// Runs `f` on every remaining input as a record of type `T`, in order: the fastest way to
    /// read a stream whose emitter uses [`BoltOutput::emit_record`] or
    /// [`SpoutOutput::emit_record`](crate::SpoutOutput::emit_record) with the same type. Those
    /// records arrive as they were emitted and are handed over by reference; any other input
    /// (emitted as values, or as records of another type) is decoded into `T` with
    /// [`Tuple::decode`], and one that does not decode fails with the decode error. Acks, fails,
    /// panics and backpressure as with [`Inputs::for_each`].
    ///
    /// ```
    /// # use squall_topology::*;
    /// # use std::sync::Arc;
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct Word {
    ///     word: Arc<str>,
    /// }
    /// # #[derive(Default)] struct Count(std::collections::HashMap<Arc<str>, u64>);
    /// impl Bolt for Count {
    ///     async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
    ///         *self.0.entry(t.decode::<Word>()?.word).or_default() += 1;
    ///         Ok(())
    ///     }
    ///     async fn execute_batch(&mut self, inputs: &mut Inputs, out: &mut BoltOutput) -> Result<(), ComponentError> {
    ///         inputs.for_each_record(out, |w: &Word, _out| {
    ///             *self.0.entry(w.word.clone()).or_default() += 1;
    ///             Ok(())
    ///         }).await;
    ///         Ok(())
    ///     }
    /// }
    /// ```
    pub async fn for_each_record<T, F>(&mut self, out: &mut BoltOutput, mut f: F)
    where
        T: Record + serde::de::DeserializeOwned,
        F: FnMut(&T, &mut BoltOutput) -> Result<(), ComponentError> + Send,
    {
        if !self.records.as_deref().is_some_and(|r| r.as_any().is::<Records<T>>()) {
            // tuples, or records of another type: decode each input (`f` called through a
            // reference here, so that its one direct call, below, is inlined into the loop)
            let f: &mut (dyn FnMut(&T, &mut BoltOutput) -> Result<(), ComponentError> + Send) = &mut f;
            return self
                .for_each(out, |t, out| {
                    let record: T = t.decode()?;
                    f(&record, out)
                })
                .await;
        }
        if out.in_input() {
            out.finish(true);
        }
        loop {
            if !out.outbox.ready.is_empty() && Self::send_ready(out).await.is_err() {
                return;
            }
            match catch_unwind(AssertUnwindSafe(|| self.run_records_until_ready(out, &mut f))) {
                Ok(true) => {}
                Ok(false) => return,
                Err(panic) => out.input_panicked(&*panic),
            }
        }
    }

    /// [`Inputs::run_until_ready`] over a batch of records of type `T` (dropped with the batch).
    #[inline(never)]
    fn run_records_until_ready<T: Record>(
        &mut self,
        out: &mut BoltOutput,
        f: &mut impl FnMut(&T, &mut BoltOutput) -> Result<(), ComponentError>,
    ) -> bool {
        let Some(records) = self.records.as_deref().and_then(|r| r.as_any().downcast_ref::<Records<T>>()) else {
            return false;
        };
        if records.anchors.is_empty() {
            // No record of the batch is tracked: each input is begun as untracked and, unless
            // `f` held it (`defer_ack`) or failed, ends by being counted as open, without the
            // `begin_anchors`/`finish` of the loop below (6 instructions per input less).
            // Counted as it goes, so a panic in `f` (caught around this run) leaves the counters
            // right: the input being executed is failed.
            out.current = Current::Untracked;
            while let Some(record) = records.items.get(self.next) {
                self.next += 1;
                out.executed += 1;
                match f(record, out) {
                    Ok(()) if matches!(out.current, Current::Untracked) => out.open_inputs += 1,
                    r => {
                        if let Err(e) = &r {
                            out.note_error("execute", e);
                        }
                        // failed (counted) by `finish`; a held input is acked or failed later
                        out.finish(r.is_ok());
                        out.current = Current::Untracked;
                    }
                }
                if !out.outbox.ready.is_empty() {
                    out.current = Current::None;
                    return true;
                }
            }
            out.current = Current::None;
            return false;
        }
        while let Some(record) = records.items.get(self.next) {
            out.begin_anchors(records.anchors_at(self.next));
            self.next += 1;
            match f(record, out) {
                Ok(()) => out.finish(true),
                Err(e) => {
                    out.note_error("execute", &e);
                    out.finish(false);
                }
            }
            if !out.outbox.ready.is_empty() {
                return true;
            }
        }
        false
    }

    /// Runs `f` on the inputs in order until the batch ends (`false`) or full output batches
    /// wait to be sent (`true`). Synchronous, so the loop keeps its state in registers rather
    /// than in the future of `for_each`; and a function of its own (not inlined into that
    /// future's large poll function), so the compiler inlines the caller's closure and what it
    /// calls (the emit path, the user's own helpers) into one compact loop.
    #[inline(never)]
    fn run_until_ready(
        &mut self,
        out: &mut BoltOutput,
        f: &mut impl FnMut(&Tuple, &mut BoltOutput) -> Result<(), ComponentError>,
    ) -> bool {
        // by reference, then dropped in place once executed
        while let Some(slot) = self.batch.get_mut(self.next) {
            let Some(t) = slot else { break };
            self.next += 1;
            out.begin(t);
            match f(t, out) {
                Ok(()) => out.finish(true),
                Err(e) => {
                    out.note_error("execute", &e);
                    out.finish(false);
                }
            }
            drop_input(slot);
            if !out.outbox.ready.is_empty() {
                return true;
            }
        }
        false
    }

    /// Sends the full output batches (kept out of `next`'s own state machine: the usual call
    /// sends nothing).
    #[inline(never)]
    async fn send_ready(out: &mut BoltOutput) -> Result<(), Cancelled> {
        let t0 = std::time::Instant::now();
        let sent = out.send_ready().await;
        out.blocked += t0.elapsed();
        sent
    }

    /// Fails the input taken last (its spout tuples are replayed) and counts `error` against the
    /// component. The next [`Inputs::next`] then does not ack it.
    pub fn fail_current(&mut self, out: &mut BoltOutput, error: &ComponentError) {
        if out.in_input() {
            out.note_error("execute", error);
            out.finish(false);
        }
    }

    /// Fails the input taken last because its `execute` panicked (counted and logged).
    pub(crate) fn fail_current_panicked(&mut self, out: &mut BoltOutput, payload: &(dyn std::any::Any + Send)) {
        out.input_panicked(payload);
    }

    /// Inputs not yet taken.
    pub fn len(&self) -> usize {
        match &self.records {
            Some(r) => r.len() - self.next,
            None => self.batch.len() - self.next,
        }
    }

    /// True when every input was taken.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
