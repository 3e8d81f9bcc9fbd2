//! The send side of a task (internal): declared streams and their subscriptions, routing into
//! per-target buffers, and the one send/flush path both executors use.
//!
//! A buffer that reaches `batch_size` is queued as a ready batch at once, so a hook that emits a
//! lot (an `on_drain` flushing a whole state, a large `next_tuple`) produces batches of at most
//! `batch_size` tuples, sent in order with backpressure, never one unbounded message.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::EmitError;
use crate::acker::EdgeRng;
use crate::component::Watermark;
use crate::grouping::AnyRouter;
use crate::tuple::{Anchors, DEFAULT_STREAM, StreamMeta, Tuple};
use crate::value::Values;

use super::records::{AnyRecords, Record, RecordBuf, Records};

/// What travels on a bolt task's input channel, in order per sending task.
#[derive(Debug)]
pub(crate) enum Message {
    /// A batch of tuples (all `Some`: the receiver takes them out one by one, then hands the
    /// emptied buffer back through the [`BatchPool`]).
    Tuples(Batch),
    /// A batch of records of one stream, emitted as the user's type (see `records`).
    Records(Box<dyn RecordBuf>),
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

/// The task was cancelled while it waited to send.
#[derive(Debug)]
pub(crate) struct Cancelled;

/// What a task does while a send waits for room in a full channel.
pub(crate) trait Backpressure {
    /// Cancelled when the topology stops: a waiting send gives up.
    fn cancel(&self) -> &CancellationToken;

    /// Other work done while waiting (a spout keeps applying acks so the bolts that block on
    /// its ack channel make progress). Must be cancel-safe: it is dropped when room appears.
    fn meanwhile(&mut self) -> impl Future<Output = ()> + Send;
}

/// The tuples of one batch message.
pub(crate) type Batch = Vec<Option<Tuple>>;

/// Emptied batch buffers of one bolt task's input: the task hands each batch's buffer back once
/// it has executed it, and the tasks sending to it take their next buffers from here. A batch
/// buffer is then allocated by one thread and reused instead of freed by another (a cross-thread
/// free per batch), and stays warm in cache. Holds at most `cap` buffers (bounded memory).
#[derive(Debug)]
pub(crate) struct BatchPool {
    bufs: Mutex<Vec<Batch>>,
    /// Emptied record batches (`Records<T>` of the types this task receives).
    records: Mutex<Vec<AnyRecords>>,
    batch_size: usize,
    cap: usize,
}

impl BatchPool {
    pub(crate) fn new(batch_size: usize, cap: usize) -> Self {
        BatchPool {
            bufs: Mutex::new(Vec::with_capacity(cap)),
            records: Mutex::new(Vec::new()),
            batch_size: batch_size.max(1),
            cap,
        }
    }

    /// An emptied record batch of type `T` to fill, if one was given back (one of another type
    /// is dropped: a task's inputs are usually of one record type).
    #[inline]
    pub(crate) fn take_records<T: Record>(&self) -> Option<Box<Records<T>>> {
        let reused = self.records.lock().unwrap_or_else(|p| p.into_inner()).pop()?;
        reused.downcast::<Records<T>>().ok()
    }

    /// Gives back an executed record batch, emptied (dropped when the pool is full).
    pub(crate) fn put_records(&self, records: Box<dyn RecordBuf>) {
        let Some(emptied) = records.recycle(self.batch_size) else { return };
        let mut pool = self.records.lock().unwrap_or_else(|p| p.into_inner());
        if pool.len() < self.cap {
            pool.push(emptied);
        }
    }

    /// An empty buffer with room for a batch.
    #[inline]
    pub(crate) fn take(&self) -> Batch {
        let reused = self.bufs.lock().unwrap_or_else(|p| p.into_inner()).pop();
        reused.unwrap_or_else(|| Vec::with_capacity(self.batch_size))
    }

    /// Gives back an emptied buffer (dropped when the pool is full or the buffer has grown past
    /// a batch).
    #[inline]
    pub(crate) fn put(&self, mut buf: Batch) {
        buf.clear();
        if buf.capacity() < self.batch_size || buf.capacity() > 2 * self.batch_size {
            return;
        }
        let mut bufs = self.bufs.lock().unwrap_or_else(|p| p.into_inner());
        if bufs.len() < self.cap {
            bufs.push(buf);
        }
    }
}

/// A downstream task, the tuples buffered for it, and its pool of batch buffers.
pub(crate) struct Target {
    pub(crate) tx: mpsc::Sender<Envelope>,
    pub(crate) buf: Batch,
    pub(crate) pool: Arc<BatchPool>,
    /// The records buffered for it (emitted with `emit_record`), when any. At most one of
    /// `buf` and `rec` holds anything: switching between them, or to another stream or type of
    /// record, queues what was buffered first, so the task receives everything in emit order.
    pub(crate) rec: Option<OpenRecords>,
}

/// The records being buffered for a target: a `Records<T>` of the emitted type, and how to
/// seal it into a batch once it is sent.
pub(crate) struct OpenRecords {
    stream: usize,
    /// A `Records<T>`: the emitter finds it with one type check (a single virtual call).
    records: AnyRecords,
    seal: fn(AnyRecords) -> Option<Box<dyn RecordBuf>>,
}

impl OpenRecords {
    fn new<T: Record>(stream: usize, records: Box<Records<T>>) -> Self {
        OpenRecords { stream, records, seal: |any| any.downcast::<Records<T>>().ok().map(|r| r as Box<dyn RecordBuf>) }
    }

    fn seal(self) -> Option<Box<dyn RecordBuf>> {
        (self.seal)(self.records)
    }
}

/// One subscription of a stream: a router and the target indices of the subscriber's tasks.
pub(crate) struct Route {
    pub(crate) consumer: Arc<str>,
    /// The grouping's name (in errors).
    pub(crate) grouping: &'static str,
    pub(crate) router: AnyRouter,
    pub(crate) tasks: Vec<usize>,
}

/// A declared output stream and its subscriptions (all direct, or none, see the builder).
pub(crate) struct OutStream {
    pub(crate) meta: &'static StreamMeta,
    pub(crate) direct: bool,
    pub(crate) routes: Vec<Route>,
    /// The record type last checked against the stream's fields (see [`Outbox::open_records`]).
    pub(crate) record_type: Option<std::any::TypeId>,
}

/// The send side of one task: declared streams, their subscriptions, and per-target buffers.
pub(crate) struct Outbox {
    pub(crate) from: usize,
    pub(crate) component: Arc<str>,
    pub(crate) streams: Vec<OutStream>,
    pub(crate) targets: Vec<Target>,
    /// Full batches waiting to be sent, in emit order.
    /// (`Message::Tuples` and `Message::Records` only.)
    pub(crate) ready: VecDeque<(usize, Message)>,
    pub(crate) batch_size: usize,
    pub(crate) rng: EdgeRng,
    pub(crate) emitted: u64,
    scratch: Vec<usize>,
    default: Option<usize>,
}

/// What an emit carries: dynamic values, or a record of the user's type.
pub(crate) trait Payload {
    /// Routes it on `stream` (see [`Outbox::dispatch`]).
    fn dispatch(
        self,
        outbox: &mut Outbox,
        stream: usize,
        direct: Option<usize>,
        anchor: impl FnMut(&mut EdgeRng) -> Anchors,
    ) -> Result<usize, EmitError>;
}

impl Payload for Values {
    #[inline(always)]
    fn dispatch(
        self,
        outbox: &mut Outbox,
        stream: usize,
        direct: Option<usize>,
        anchor: impl FnMut(&mut EdgeRng) -> Anchors,
    ) -> Result<usize, EmitError> {
        outbox.dispatch(stream, self, direct, anchor)
    }
}

/// A record emitted with `emit_record`.
pub(crate) struct Rec<T>(pub(crate) T);

impl<T: Record> Payload for Rec<T> {
    #[inline(always)]
    fn dispatch(
        self,
        outbox: &mut Outbox,
        stream: usize,
        direct: Option<usize>,
        anchor: impl FnMut(&mut EdgeRng) -> Anchors,
    ) -> Result<usize, EmitError> {
        outbox.dispatch_record(stream, self.0, direct, anchor)
    }
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
            ready: VecDeque::new(),
            batch_size: batch_size.max(1),
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

    /// The index of a stream named by a [`StreamRef`]: a name, or a [`crate::StreamId`] of this
    /// component.
    #[inline]
    pub(crate) fn stream_ref(&self, stream: &impl crate::builder::StreamRef) -> Result<usize, EmitError> {
        match stream.component() {
            Some(c) if c != &*self.component => Err(EmitError::UnknownStream {
                component: self.component.to_string(),
                stream: format!("{c}/{}", stream.name()),
                declared: self.streams.iter().map(|s| s.meta.stream.to_string()).collect(),
            }),
            _ => self.stream_index(stream.name()),
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

    /// The values of an emit; a record that does not encode is an emit error naming it.
    #[inline(always)]
    pub(crate) fn encode(&self, values: impl crate::typed::IntoValues) -> Result<Values, EmitError> {
        values.into_values().map_err(|e| self.encode_error(e))
    }

    #[cold]
    #[inline(never)]
    fn encode_error(&self, e: crate::typed::TypedError) -> EmitError {
        EmitError::Encode { component: self.component.to_string(), message: e.to_string() }
    }

    /// Checks an emit before anything is routed.
    #[inline]
    fn check(&self, stream: usize, values: &Values, direct: Option<usize>) -> Result<(), EmitError> {
        let s = &self.streams[stream];
        if values.len() != s.meta.fields.len() || direct.is_some() || s.direct {
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
        match (s.direct, direct) {
            (true, None) => {
                return Err(EmitError::DirectStream {
                    component: self.component.to_string(),
                    stream: s.meta.stream.to_string(),
                });
            }
            (false, Some(_)) => {
                return Err(EmitError::NotDirectStream {
                    component: self.component.to_string(),
                    stream: s.meta.stream.to_string(),
                });
            }
            _ => {}
        }
        if let Some(task) = direct {
            if let Some(r) = s.routes.iter().find(|r| task >= r.tasks.len()) {
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
    /// number of copies buffered: 0 only when the stream has no subscriber (or a custom router
    /// chose no task). Nothing is buffered when it returns an error (a router that chose a task
    /// the subscriber does not have is one).
    #[inline]
    pub(crate) fn dispatch(
        &mut self,
        stream: usize,
        values: Values,
        direct: Option<usize>,
        mut anchor: impl FnMut(&mut EdgeRng) -> Anchors,
    ) -> Result<usize, EmitError> {
        self.check(stream, &values, direct)?;
        let s = &mut self.streams[stream];
        let meta = s.meta;
        // the usual case: one subscriber with a single-target built-in grouping
        if let ([route], None) = (&mut *s.routes, direct) {
            if let Some(i) = route.router.route_one(&values) {
                let Some(&target) = route.tasks.get(i) else {
                    return Err(task_out_of_range(meta, route, i));
                };
                self.emitted += 1;
                let anchors = anchor(&mut self.rng);
                if self.targets[target].rec.is_some() {
                    self.queue_records(target);
                }
                let tgt = &mut self.targets[target];
                // a buffer has room for a batch (it is sent when full): with no reallocation
                // between building the tuple and storing it, it is built in place
                if tgt.buf.len() == tgt.buf.capacity() {
                    tgt.buf.reserve(1);
                }
                tgt.buf.push(Some(Tuple { meta, values, anchors }));
                if tgt.buf.len() >= self.batch_size {
                    self.queue_tuples(target);
                }
                return Ok(1);
            }
        }
        // target indices of every copy, then the copies: the last one takes the values
        self.scratch.clear();
        for route in &mut s.routes {
            let start = self.scratch.len();
            match direct {
                None => route.router.route(&values, &mut self.scratch),
                Some(task) => self.scratch.push(task),
            }
            for i in start..self.scratch.len() {
                match route.tasks.get(self.scratch[i]) {
                    Some(&target) => self.scratch[i] = target,
                    None => return Err(task_out_of_range(meta, route, self.scratch[i])),
                }
            }
        }
        self.emitted += 1;
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
        if self.targets[target].rec.is_some() {
            self.queue_records(target);
        }
        let tgt = &mut self.targets[target];
        tgt.buf.push(Some(tuple));
        if tgt.buf.len() >= self.batch_size {
            self.queue_tuples(target);
        }
    }

    /// Queues a target's buffered records as a ready batch (full or not).
    #[inline(never)]
    fn queue_records(&mut self, target: usize) {
        if let Some(rec) = self.targets[target].rec.take().and_then(OpenRecords::seal) {
            if rec.len() > 0 {
                self.ready.push_back((target, Message::Records(rec)));
            }
        }
    }

    /// Queues a target's buffered tuples as a ready batch (full, or before records) and gives
    /// the target a fresh buffer.
    #[inline(never)]
    fn queue_tuples(&mut self, target: usize) {
        let tgt = &mut self.targets[target];
        if !tgt.buf.is_empty() {
            let batch = std::mem::replace(&mut tgt.buf, tgt.pool.take());
            self.ready.push_back((target, Message::Tuples(batch)));
        }
    }

    /// Routes one record emitted with `emit_record`. To a single subscriber with a built-in
    /// grouping that can route it as it is (the usual case), the record is stored in the
    /// target's record batch without being encoded; otherwise (several subscribers, a custom
    /// grouping, a key that is not one primitive field; a direct stream, which refuses it) its
    /// values are routed.
    #[inline]
    pub(crate) fn dispatch_record<T: Record>(
        &mut self,
        stream: usize,
        rec: T,
        direct: Option<usize>,
        mut anchor: impl FnMut(&mut EdgeRng) -> Anchors,
    ) -> Result<usize, EmitError> {
        let s = &mut self.streams[stream];
        if direct.is_some() || s.direct {
            return self.dispatch_record_slow(stream, rec, direct, anchor);
        }
        let meta = s.meta;
        let [route] = &mut *s.routes else { return self.dispatch_record_slow(stream, rec, direct, anchor) };
        let Some(i) = route.router.route_one_record(&rec) else {
            return self.dispatch_record_slow(stream, rec, direct, anchor);
        };
        let Some(&target) = route.tasks.get(i) else {
            return Err(task_out_of_range(meta, route, i));
        };
        // the target's open batch of this stream and type: a record batch exists only once its
        // first record was checked against the stream's fields (`open_records`)
        if let Some(recs) = self.targets[target]
            .rec
            .as_mut()
            .filter(|o| o.stream == stream)
            .and_then(|o| o.records.downcast_mut::<Records<T>>())
        {
            recs.push(rec, anchor(&mut self.rng));
            self.emitted += 1;
            if recs.items.len() >= self.batch_size {
                self.queue_records(target);
            }
            return Ok(1);
        }
        self.open_records(target, stream, meta, rec, anchor)
    }

    /// A record routed by its values: direct emits, several subscribers, custom routers, keys
    /// that are not a primitive field. Checked as in [`Outbox::open_records`].
    #[inline(never)]
    fn dispatch_record_slow<T: Record>(
        &mut self,
        stream: usize,
        rec: T,
        direct: Option<usize>,
        anchor: impl FnMut(&mut EdgeRng) -> Anchors,
    ) -> Result<usize, EmitError> {
        if self.streams[stream].record_type != Some(std::any::TypeId::of::<T>()) {
            self.check_record(stream, &rec)?;
        }
        let values = self.encode(&rec)?;
        self.dispatch(stream, values, direct, anchor)
    }

    /// Checks a record of a type not checked last on this stream against the stream's fields:
    /// as many values (the same error as values of another shape), and, for a struct, the
    /// same names in the same order: a struct with the stream's fields in another order would
    /// be read by name wrongly downstream, and grouped by the wrong field. Remembers the type.
    #[cold]
    #[inline(never)]
    fn check_record<T: Record>(&mut self, stream: usize, rec: &T) -> Result<(), EmitError> {
        let values = self.encode(rec)?;
        let meta = self.streams[stream].meta;
        if values.len() != meta.fields.len() {
            return Err(EmitError::FieldCount {
                component: self.component.to_string(),
                stream: meta.stream.to_string(),
                expected: meta.fields.len(),
                got: values.len(),
                fields: meta.fields.to_vec(),
            });
        }
        if let Some(names) = crate::typed::record_field_names(rec) {
            if !names.iter().copied().eq(meta.fields.iter()) {
                return Err(EmitError::RecordFields {
                    stream: meta.stream.to_string(),
                    type_name: std::any::type_name::<T>(),
                    fields: names.iter().map(|n| (*n).to_owned()).collect(),
                    declared: meta.fields.to_vec(),
                });
            }
        }
        self.streams[stream].record_type = Some(std::any::TypeId::of::<T>());
        Ok(())
    }

    /// Starts a target's record batch with its first record, after queueing what the target
    /// had buffered of another kind, stream or type (emit order). The first record of a type on
    /// a stream is checked against the stream's fields ([`Outbox::check_record`]).
    #[inline(never)]
    fn open_records<T: Record>(
        &mut self,
        target: usize,
        stream: usize,
        meta: &'static StreamMeta,
        rec: T,
        mut anchor: impl FnMut(&mut EdgeRng) -> Anchors,
    ) -> Result<usize, EmitError> {
        if self.streams[stream].record_type != Some(std::any::TypeId::of::<T>()) {
            self.check_record(stream, &rec)?;
        }
        self.queue_records(target);
        self.queue_tuples(target);
        let mut records = match self.targets[target].pool.take_records::<T>() {
            Some(mut reused) => {
                reused.meta = meta;
                reused
            }
            None => Box::new(Records::<T>::new(meta, self.batch_size)),
        };
        records.push(rec, anchor(&mut self.rng));
        self.emitted += 1;
        self.targets[target].rec = Some(OpenRecords::new(stream, records));
        if self.batch_size <= 1 {
            self.queue_records(target);
        }
        Ok(1)
    }

    /// Sends the full batches queued so far, in order, waiting for room (backpressure). True if
    /// it had to wait.
    pub(crate) async fn send_ready<B: Backpressure>(&mut self, bp: &mut B) -> Result<bool, Cancelled> {
        let mut waited = false;
        while let Some((target, batch)) = self.ready.pop_front() {
            let env = Envelope { from: self.from, msg: batch };
            waited |= send(&self.targets[target].tx, env, bp).await?;
        }
        Ok(waited)
    }

    /// Sends everything buffered: the full batches, then every partial buffer.
    pub(crate) async fn flush<B: Backpressure>(&mut self, bp: &mut B) -> Result<(), Cancelled> {
        self.send_ready(bp).await?;
        for i in 0..self.targets.len() {
            if let Some(rec) = self.targets[i].rec.take().and_then(OpenRecords::seal) {
                if rec.len() > 0 {
                    let env = Envelope { from: self.from, msg: Message::Records(rec) };
                    send(&self.targets[i].tx, env, bp).await?;
                }
            }
            if !self.targets[i].buf.is_empty() {
                let tgt = &mut self.targets[i];
                let batch = std::mem::replace(&mut tgt.buf, tgt.pool.take());
                let env = Envelope { from: self.from, msg: Message::Tuples(batch) };
                send(&self.targets[i].tx, env, bp).await?;
            }
        }
        Ok(())
    }

    /// Flushes, then sends a watermark or drain marker to every downstream task (watermarks and
    /// drain markers reach every task of every subscriber, whatever the grouping).
    pub(crate) async fn broadcast<B: Backpressure>(&mut self, bp: &mut B, control: Control) -> Result<(), Cancelled> {
        self.flush(bp).await?;
        for target in &self.targets {
            let msg = match control {
                Control::Watermark(w) => Message::Watermark(w),
                Control::Drain => Message::Drain,
            };
            send(&target.tx, Envelope { from: self.from, msg }, bp).await?;
        }
        Ok(())
    }
}

/// A router chose task `task` of a subscriber that does not have it.
#[cold]
#[inline(never)]
fn task_out_of_range(meta: &StreamMeta, route: &Route, task: usize) -> EmitError {
    EmitError::RouterTaskOutOfRange {
        stream: meta.stream.to_string(),
        grouping: route.grouping,
        consumer: route.consumer.to_string(),
        task,
        parallelism: route.tasks.len(),
    }
}

/// An in-band control message.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Control {
    Watermark(Watermark),
    Drain,
}

/// Sends one envelope, waiting for room while doing the task's other work; true if it had to
/// wait. A closed channel means its receiver stopped (shutdown): the message is dropped and
/// tracked tuples time out.
async fn send<B: Backpressure>(tx: &mpsc::Sender<Envelope>, env: Envelope, bp: &mut B) -> Result<bool, Cancelled> {
    let env = match tx.try_send(env) {
        Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => return Ok(false),
        Err(mpsc::error::TrySendError::Full(env)) => env,
    };
    let cancel = bp.cancel().clone();
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(Cancelled),
            permit = tx.reserve() => {
                if let Ok(p) = permit {
                    p.send(env);
                }
                return Ok(true);
            }
            _ = bp.meanwhile() => {}
        }
    }
}
