//! Emitting: [`SpoutOutput`] and [`BoltOutput`] route tuples into per-target send buffers, assign
//! ack-tree edges, and collect ack updates. The executors flush the buffers.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::acker::{self, AckBatch, EdgeRng, PendingTrees, U64Map};
use crate::component::Watermark;
use crate::grouping::AnyRouter;
use crate::tuple::{Anchors, DEFAULT_STREAM, StreamMeta, Tuple};
use crate::value::Values;

/// An emit the topology's declarations do not allow. The component's fault; not retryable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EmitError {
    /// The stream is not declared by the emitting component.
    #[error(
        "component `{component}` emitted on undeclared stream `{stream}`; declared streams: {declared:?} (declare it with `.output(\"{stream}\", &[..])`)"
    )]
    UnknownStream {
        /// Emitting component.
        component: String,
        /// The stream used.
        stream: String,
        /// The declared streams.
        declared: Vec<String>,
    },
    /// The number of values differs from the number of declared fields.
    #[error(
        "component `{component}` emitted {got} values on stream `{stream}`, which declares {expected} fields {fields:?}"
    )]
    FieldCount {
        /// Emitting component.
        component: String,
        /// The stream used.
        stream: String,
        /// Declared field count.
        expected: usize,
        /// Values given.
        got: usize,
        /// Declared fields.
        fields: Vec<String>,
    },
    /// `emit_direct` named a task the direct subscriber does not have.
    #[error(
        "direct emit on stream `{stream}` to task {task}, but subscriber `{consumer}` has only {parallelism} tasks"
    )]
    DirectTaskOutOfRange {
        /// The stream used.
        stream: String,
        /// The subscriber.
        consumer: String,
        /// The task index given.
        task: usize,
        /// The subscriber's parallelism.
        parallelism: usize,
    },
    /// `defer_ack` outside `execute`.
    #[error("defer_ack called outside execute: there is no current input to hold")]
    NoCurrentInput,
    /// An anchor handle that was already acked or failed.
    #[error("anchor handle {0} was already acked or failed")]
    UnknownHandle(u64),
}

/// What travels on a bolt task's input channel, in order per sending task.
#[derive(Debug)]
pub(crate) enum Message {
    /// A batch of tuples.
    Tuples(Vec<Tuple>),
    /// The sender's low watermark advanced.
    Watermark(Watermark),
    /// The sender drained: nothing more will come from it.
    Drain,
}

/// A message plus its sender's topology-wide task id.
#[derive(Debug)]
pub(crate) struct Envelope {
    pub(crate) from: usize,
    pub(crate) msg: Message,
}

/// A downstream task and the tuples buffered for it.
pub(crate) struct Target {
    pub(crate) tx: mpsc::Sender<Envelope>,
    pub(crate) buf: Vec<Tuple>,
}

/// One subscription of a stream: a router and the target indices of the subscriber's tasks.
pub(crate) struct Route {
    pub(crate) consumer: Arc<str>,
    pub(crate) router: AnyRouter,
    pub(crate) direct: bool,
    pub(crate) tasks: Vec<usize>,
}

pub(crate) struct OutStream {
    pub(crate) meta: &'static StreamMeta,
    pub(crate) routes: Vec<Route>,
}

/// The send side of one task: declared streams, their subscriptions, and per-target buffers.
pub(crate) struct Outbox {
    pub(crate) from: usize,
    pub(crate) component: Arc<str>,
    pub(crate) streams: Vec<OutStream>,
    pub(crate) targets: Vec<Target>,
    /// Targets whose buffer reached `batch_size` since the last flush.
    pub(crate) full: Vec<usize>,
    pub(crate) batch_size: usize,
    pub(crate) rng: EdgeRng,
    pub(crate) emitted: u64,
    scratch: Vec<usize>,
    default: Option<usize>,
}

impl Outbox {
    pub(crate) fn new(
        from: usize,
        component: Arc<str>,
        streams: Vec<OutStream>,
        targets: Vec<Target>,
        batch_size: usize,
    ) -> Self {
        let default = streams.iter().position(|s| &*s.meta.stream == DEFAULT_STREAM);
        Outbox {
            default,
            from,
            component,
            streams,
            targets,
            full: Vec::new(),
            batch_size,
            rng: EdgeRng::from_entropy(from as u64),
            emitted: 0,
            scratch: Vec::new(),
        }
    }

    /// The index of the default stream (cached).
    #[inline]
    pub(crate) fn default_index(&self) -> Result<usize, EmitError> {
        match self.default {
            Some(i) => Ok(i),
            None => self.stream_index(DEFAULT_STREAM),
        }
    }

    pub(crate) fn stream_index(&self, stream: &str) -> Result<usize, EmitError> {
        // The default stream is declared first when present: the common case is one compare.
        self.streams.iter().position(|s| &*s.meta.stream == stream).ok_or_else(|| EmitError::UnknownStream {
            component: self.component.to_string(),
            stream: stream.to_owned(),
            declared: self.streams.iter().map(|s| s.meta.stream.to_string()).collect(),
        })
    }

    /// Checks an emit before anything is routed.
    #[inline]
    fn check(&self, stream: usize, values: &Values, direct: Option<usize>) -> Result<(), EmitError> {
        let s = &self.streams[stream];
        if values.len() != s.meta.fields.len() || direct.is_some() {
            return self.check_slow(stream, values, direct);
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn check_slow(&self, stream: usize, values: &Values, direct: Option<usize>) -> Result<(), EmitError> {
        let s = &self.streams[stream];
        if values.len() != s.meta.fields.len() {
            return Err(EmitError::FieldCount {
                component: self.component.to_string(),
                stream: s.meta.stream.to_string(),
                expected: s.meta.fields.len(),
                got: values.len(),
                fields: s.meta.fields.to_vec(),
            });
        }
        if let Some(task) = direct {
            if let Some(r) = s.routes.iter().find(|r| r.direct && task >= r.tasks.len()) {
                return Err(EmitError::DirectTaskOutOfRange {
                    stream: s.meta.stream.to_string(),
                    consumer: r.consumer.to_string(),
                    task,
                    parallelism: r.tasks.len(),
                });
            }
        }
        Ok(())
    }

    /// Routes one tuple to its targets, giving each copy the anchors `anchor` returns. Returns the
    /// number of copies buffered.
    #[inline]
    pub(crate) fn dispatch(
        &mut self,
        stream: usize,
        values: Values,
        direct: Option<usize>,
        mut anchor: impl FnMut(&mut EdgeRng) -> Anchors,
    ) -> Result<usize, EmitError> {
        self.check(stream, &values, direct)?;
        self.emitted += 1;
        let s = &mut self.streams[stream];
        let meta = s.meta;
        // the usual case: one subscriber with a single-target built-in grouping
        if let ([route], None) = (&mut *s.routes, direct) {
            if !route.direct {
                if let Some(i) = route.router.route_one(&values) {
                    let Some(&target) = route.tasks.get(i) else { return Ok(0) };
                    let anchors = anchor(&mut self.rng);
                    self.push(target, Tuple { meta, values, anchors });
                    return Ok(1);
                }
            }
        }
        // target indices of every copy, then the copies: the last one takes the values
        self.scratch.clear();
        for route in &mut s.routes {
            let start = self.scratch.len();
            match (route.direct, direct) {
                (false, None) => route.router.route(&values, &mut self.scratch),
                (true, Some(task)) => self.scratch.push(task),
                _ => continue,
            }
            let mut kept = start;
            for i in start..self.scratch.len() {
                if let Some(&target) = route.tasks.get(self.scratch[i]) {
                    self.scratch[kept] = target;
                    kept += 1;
                }
            }
            self.scratch.truncate(kept);
        }
        let copies = self.scratch.len();
        if copies == 0 {
            return Ok(0);
        }
        for i in 0..copies - 1 {
            let anchors = anchor(&mut self.rng);
            self.push(self.scratch[i], Tuple { meta, values: values.clone(), anchors });
        }
        let anchors = anchor(&mut self.rng);
        self.push(self.scratch[copies - 1], Tuple { meta, values, anchors });
        Ok(copies)
    }

    #[inline(always)]
    fn push(&mut self, target: usize, tuple: Tuple) {
        let tgt = &mut self.targets[target];
        tgt.buf.push(tuple);
        if tgt.buf.len() == self.batch_size {
            self.full.push(target);
        }
    }

    /// Takes the buffered tuples of a target, leaving an empty buffer with capacity.
    pub(crate) fn take(&mut self, target: usize) -> Vec<Tuple> {
        std::mem::replace(&mut self.targets[target].buf, Vec::with_capacity(self.batch_size))
    }
}

/// Where a spout emits. Handed to [`crate::Spout::next_tuple`] and [`crate::Spout::drain`].
pub struct SpoutOutput<M> {
    pub(crate) outbox: Outbox,
    pub(crate) pending: PendingTrees<M>,
    pub(crate) acking: bool,
    pub(crate) slot: usize,
    pub(crate) seq: u64,
    pub(crate) now: Instant,
    pub(crate) timeout: Duration,
    pub(crate) max_pending: usize,
    /// Message ids to ack right away (acking off, or no subscriber received the tuple).
    pub(crate) immediate_acks: Vec<M>,
    pub(crate) watermark: Option<u64>,
}

impl<M> SpoutOutput<M> {
    pub(crate) fn new(outbox: Outbox, acking: bool, slot: usize, timeout: Duration, max_pending: usize) -> Self {
        SpoutOutput {
            outbox,
            pending: PendingTrees::default(),
            acking,
            slot,
            seq: 0,
            now: Instant::now(),
            timeout,
            max_pending,
            immediate_acks: Vec::new(),
            watermark: None,
        }
    }

    /// Emits an untracked tuple on the default stream (at most once).
    #[inline]
    pub fn emit(&mut self, values: impl Into<Values>) -> Result<(), EmitError> {
        let s = self.outbox.default_index()?;
        self.emit_inner(s, values.into(), None, None)
    }

    /// Emits a tracked tuple on the default stream: `ack(msg_id)` or `fail(msg_id)` follows.
    #[inline]
    pub fn emit_tracked(&mut self, values: impl Into<Values>, msg_id: M) -> Result<(), EmitError> {
        let s = self.outbox.default_index()?;
        self.emit_inner(s, values.into(), None, Some(msg_id))
    }

    /// Emits on a named stream, tracked when `msg_id` is given.
    pub fn emit_to(&mut self, stream: &str, values: impl Into<Values>, msg_id: Option<M>) -> Result<(), EmitError> {
        let s = self.outbox.stream_index(stream)?;
        self.emit_inner(s, values.into(), None, msg_id)
    }

    /// Emits to task `task` of every direct-grouping subscriber of `stream`.
    pub fn emit_direct(
        &mut self,
        task: usize,
        stream: &str,
        values: impl Into<Values>,
        msg_id: Option<M>,
    ) -> Result<(), EmitError> {
        let s = self.outbox.stream_index(stream)?;
        self.emit_inner(s, values.into(), Some(task), msg_id)
    }

    /// Advances this task's low watermark (event time in ms). Lower values than before are
    /// ignored. Sent in band, after the tuples emitted before it.
    pub fn watermark(&mut self, ts_millis: u64) {
        if self.watermark.is_none_or(|w| ts_millis > w) {
            self.watermark = Some(ts_millis);
        }
    }

    /// Tracked tuples in flight for this task.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// How many more tracked tuples may be emitted before `max_spout_pending` is reached.
    pub fn pending_room(&self) -> usize {
        self.max_pending.saturating_sub(self.pending.len())
    }

    fn emit_inner(
        &mut self,
        stream: usize,
        values: Values,
        direct: Option<usize>,
        msg: Option<M>,
    ) -> Result<(), EmitError> {
        match msg {
            Some(msg) if self.acking => {
                let root = acker::make_root(self.slot, self.seq);
                self.seq = self.seq.wrapping_add(1);
                let mut xor = 0u64;
                let copies = self.outbox.dispatch(stream, values, direct, |rng| {
                    let edge = rng.next_edge();
                    xor ^= edge;
                    let mut a = Anchors::new();
                    a.push((root, edge));
                    a
                })?;
                if copies == 0 {
                    self.immediate_acks.push(msg);
                } else {
                    self.pending.insert(root, msg, xor, self.now + self.timeout);
                }
            }
            Some(msg) => {
                self.outbox.dispatch(stream, values, direct, |_| Anchors::new())?;
                self.immediate_acks.push(msg);
            }
            None => {
                self.outbox.dispatch(stream, values, direct, |_| Anchors::new())?;
            }
        }
        Ok(())
    }
}

/// An input held past `execute` with [`BoltOutput::defer_ack`]; ack or fail it later, and anchor
/// later emits to it with [`BoltOutput::emit_anchored`]. Not cloneable: acked or failed once.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct AckHandle(u64);

impl AckHandle {
    /// The handle's id (unique within the task).
    pub fn id(&self) -> u64 {
        self.0
    }
}

#[derive(Debug)]
pub(crate) struct Held {
    anchors: Anchors,
    ack_val: u64,
}

#[derive(Debug, Default)]
pub(crate) enum Current {
    #[default]
    None,
    /// An input outside every ack tree: emits are unanchored, ending it only counts it.
    Untracked,
    Input {
        anchors: Anchors,
        ack_val: u64,
    },
    Deferred(u64),
}

/// Where a bolt emits. Emits are anchored to the current input unless said otherwise.
pub struct BoltOutput {
    pub(crate) outbox: Outbox,
    pub(crate) current: Current,
    pub(crate) held: U64Map<Held>,
    next_handle: u64,
    /// Ack updates per spout task (indexed by ack slot).
    pub(crate) acks: Vec<AckBatch>,
    pub(crate) acks_dirty: Vec<usize>,
    /// Inputs acked / failed by the bolt through handles or at the end of execute.
    pub(crate) acked: u64,
    pub(crate) failed: u64,
}

impl BoltOutput {
    pub(crate) fn new(outbox: Outbox, spout_tasks: usize) -> Self {
        BoltOutput {
            outbox,
            current: Current::None,
            held: U64Map::default(),
            next_handle: 0,
            acks: (0..spout_tasks).map(|_| AckBatch::default()).collect(),
            acks_dirty: Vec::new(),
            acked: 0,
            failed: 0,
        }
    }

    /// Emits on the default stream, anchored to the current input (unanchored outside execute).
    #[inline]
    pub fn emit(&mut self, values: impl Into<Values>) -> Result<(), EmitError> {
        let s = self.outbox.default_index()?;
        self.emit_current(s, values.into(), None)
    }

    /// Emits on a named stream, anchored to the current input.
    pub fn emit_to(&mut self, stream: &str, values: impl Into<Values>) -> Result<(), EmitError> {
        let s = self.outbox.stream_index(stream)?;
        self.emit_current(s, values.into(), None)
    }

    /// Emits to task `task` of each direct-grouping subscriber of `stream`, anchored to the input.
    pub fn emit_direct(&mut self, task: usize, stream: &str, values: impl Into<Values>) -> Result<(), EmitError> {
        let s = self.outbox.stream_index(stream)?;
        self.emit_current(s, values.into(), Some(task))
    }

    /// Emits an untracked tuple on the default stream.
    pub fn emit_unanchored(&mut self, values: impl Into<Values>) -> Result<(), EmitError> {
        self.emit_unanchored_to(DEFAULT_STREAM, values)
    }

    /// Emits an untracked tuple on a named stream.
    pub fn emit_unanchored_to(&mut self, stream: &str, values: impl Into<Values>) -> Result<(), EmitError> {
        let s = self.outbox.stream_index(stream)?;
        self.outbox.dispatch(s, values.into(), None, |_| Anchors::new()).map(|_| ())
    }

    /// Emits on `stream` anchored to held inputs (multi-anchoring, e.g. a window's output).
    pub fn emit_anchored(
        &mut self,
        anchors: &[&AckHandle],
        stream: &str,
        values: impl Into<Values>,
    ) -> Result<(), EmitError> {
        let s = self.outbox.stream_index(stream)?;
        let mut parents: Vec<(u64, Anchors, u64)> = Vec::with_capacity(anchors.len());
        for h in anchors {
            let held = self.held.get(&h.0).ok_or(EmitError::UnknownHandle(h.0))?;
            parents.push((h.0, held.anchors.clone(), held.ack_val));
        }
        self.outbox.dispatch(s, values.into(), None, |rng| {
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
    /// fail it later through the handle. If `execute` returns an error it is failed anyway.
    pub fn defer_ack(&mut self) -> Result<AckHandle, EmitError> {
        let current = match std::mem::take(&mut self.current) {
            Current::Untracked => Current::Input { anchors: Anchors::new(), ack_val: 0 },
            other => other,
        };
        match current {
            Current::Input { anchors, ack_val } => {
                let id = self.next_handle;
                self.next_handle += 1;
                self.held.insert(id, Held { anchors, ack_val });
                self.current = Current::Deferred(id);
                Ok(AckHandle(id))
            }
            other => {
                self.current = other;
                Err(EmitError::NoCurrentInput)
            }
        }
    }

    /// Acks a held input.
    pub fn ack(&mut self, handle: AckHandle) {
        if let Some(h) = self.held.remove(&handle.0) {
            self.queue_ack(&h.anchors, h.ack_val);
        }
    }

    /// Fails a held input: its spout tuples are failed (and replayed).
    pub fn fail(&mut self, handle: AckHandle) {
        if let Some(h) = self.held.remove(&handle.0) {
            self.queue_fail(&h.anchors);
        }
    }

    /// Number of inputs held with `defer_ack`.
    pub fn held_count(&self) -> usize {
        self.held.len()
    }

    #[inline]
    fn emit_current(&mut self, stream: usize, values: Values, direct: Option<usize>) -> Result<(), EmitError> {
        match &mut self.current {
            Current::Untracked => self.outbox.dispatch(stream, values, direct, |_| Anchors::new()).map(|_| ()),
            // the usual input of one ack tree: what `anchor_child` does for a single root, inline
            Current::Input { anchors, ack_val } if anchors.len() == 1 => {
                let root = anchors[0].0;
                self.outbox
                    .dispatch(stream, values, direct, |rng| {
                        let edge = rng.next_edge();
                        *ack_val ^= edge;
                        let mut child = Anchors::new();
                        child.push((root, edge));
                        child
                    })
                    .map(|_| ())
            }
            Current::Input { anchors, ack_val } if !anchors.is_empty() => {
                let a = &*anchors;
                self.outbox
                    .dispatch(stream, values, direct, |rng| acker::anchor_child([(a, &mut *ack_val)], rng))
                    .map(|_| ())
            }
            Current::Deferred(id) => {
                let Some(h) = self.held.get_mut(id) else {
                    return self.outbox.dispatch(stream, values, direct, |_| Anchors::new()).map(|_| ());
                };
                let Held { anchors, ack_val } = h;
                let a = &*anchors;
                self.outbox
                    .dispatch(stream, values, direct, |rng| acker::anchor_child([(a, &mut *ack_val)], rng))
                    .map(|_| ())
            }
            _ => self.outbox.dispatch(stream, values, direct, |_| Anchors::new()).map(|_| ()),
        }
    }

    #[inline]
    pub(crate) fn queue_ack(&mut self, anchors: &Anchors, ack_val: u64) {
        self.acked += 1;
        for (root, x) in acker::ack_updates(anchors, ack_val) {
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
    }

    pub(crate) fn queue_fail(&mut self, anchors: &Anchors) {
        self.failed += 1;
        for &(root, _) in anchors {
            let slot = acker::root_slot(root);
            if let Some(b) = self.acks.get_mut(slot) {
                if b.is_empty() {
                    self.acks_dirty.push(slot);
                }
                b.fails.push(root);
            }
        }
    }

    /// Starts executing an input.
    #[inline(always)]
    pub(crate) fn begin(&mut self, input: &Tuple) {
        self.current = match *input.anchors {
            [] => Current::Untracked,
            // no SmallVec clone machinery for the usual single anchor
            [a] => {
                let mut anchors = Anchors::new();
                anchors.push(a);
                Current::Input { anchors, ack_val: 0 }
            }
            _ => Current::Input { anchors: input.anchors.clone(), ack_val: 0 },
        };
    }

    /// Ends executing an input: acks it on success, fails it on error (also when deferred).
    #[inline(always)]
    pub(crate) fn finish(&mut self, ok: bool) {
        if let Current::Untracked = self.current {
            self.current = Current::None;
            if ok {
                self.acked += 1;
            } else {
                self.failed += 1;
            }
            return;
        }
        self.finish_tracked(ok);
    }

    #[inline]
    fn finish_tracked(&mut self, ok: bool) {
        match std::mem::take(&mut self.current) {
            Current::None | Current::Untracked => {}
            Current::Input { anchors, ack_val } => {
                if ok {
                    self.queue_ack(&anchors, ack_val);
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
}
