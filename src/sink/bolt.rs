//! [`KinesisSink`]: the bolt. One PutRecords call in flight while the next batch accumulates;
//! inputs held until their record is put; back-off on throttling; bounded bytes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use super::backend::{ApiBackend, Backend, PutOutcome, SdkBackend, TransmitCheck};
use super::config::KinesisSinkConfig;
use super::encoder::{OpenShard, SinkEncoder, SinkRecord};
use super::queue::{Entry, Queue};
use crate::kinesis::{ErrorKind, KinesisError};
use crate::topology::metrics::{Counter, Histogram};
use crate::topology::{AckHandle, Bolt, BoltOutput, ComponentError, TaskContext, Timer, Tuple, Watermark};

/// How long the open shards handed to the encoder's hooks are reused.
const SHARDS_TTL: Duration = Duration::from_secs(10);
/// Encode errors are logged at most once per this period (the rest are counted).
const ENCODE_LOG_PERIOD: Duration = Duration::from_secs(1);
/// How long a sink whose [`PutGate`] says "not now" waits before asking again.
const GATE_PAUSE: Duration = Duration::from_millis(100);

/// Asked by a [`KinesisSink`] before each PutRecords call (see [`KinesisSink::with_put_gate`]):
/// a writer whose right to write depends on something outside the sink (the stage boundary's
/// writer: its worker's ZooKeeper session, under which the inputs it holds were read).
pub trait PutGate: Send + Sync + std::fmt::Debug + 'static {
    /// `Some(epoch)`: the sink may put now. When `epoch` differs from the one given for the
    /// previous call, every record buffered until now is failed instead of put (their inputs
    /// fail; records of the encoder's hooks are dropped, counted). `None`: not now; the sink
    /// asks again after a short pause, holding its records (and, once full, its inputs).
    fn epoch(&self) -> Option<u64>;
}

/// Names of the sink's user metrics (summed over its tasks in the topology's metrics).
pub mod metric {
    /// Records written (acknowledged by Kinesis).
    pub const RECORDS_PUT: &str = "sink.records_put";
    /// PutRecords calls made, retries included.
    pub const PUT_CALLS: &str = "sink.put_calls";
    /// Records put again after a per-record failure or a failed call.
    pub const RETRIED_RECORDS: &str = "sink.retried_records";
    /// Throttled records (per-record ProvisionedThroughputExceeded) and throttled calls.
    pub const THROTTLED: &str = "sink.throttled";
    /// Inputs failed because their record could not be put (an error retrying cannot fix).
    pub const FAILED_INPUTS: &str = "sink.failed_inputs";
    /// Inputs failed because they did not encode.
    pub const ENCODE_ERRORS: &str = "sink.encode_errors";
    /// Records of the encoder's hooks (no input) given up after an error retrying cannot fix.
    pub const DROPPED_RECORDS: &str = "sink.dropped_records";
    /// Times `execute` waited at the `max_in_flight_bytes` bound (backpressure).
    pub const BACKPRESSURE_WAITS: &str = "sink.backpressure_waits";
    /// Histogram: bytes buffered plus in flight, recorded at every record buffered (its max is
    /// the most the sink held).
    pub const PENDING_BYTES: &str = "sink.pending_bytes";
    /// Histogram: records per PutRecords call.
    pub const BATCH_RECORDS: &str = "sink.batch_records";
    /// PutRecords attempts not sent because the [`super::PutGate`], asked again just before
    /// transmission, had closed since the call started (their records are held, then failed
    /// or put as the gate says next).
    pub const REFUSED_AT_TRANSMIT: &str = "sink.refused_at_transmit";
}

/// Where the sink's Kinesis calls go.
enum Source {
    /// A client for `cfg.kinesis`, built in `prepare`.
    Endpoint,
    /// A client given by the user.
    Client(aws_sdk_kinesis::Client),
    /// A stand-in (unit tests).
    #[cfg_attr(not(test), allow(dead_code))]
    Custom(Arc<dyn Backend>),
}

struct Metrics {
    records_put: Counter,
    put_calls: Counter,
    retried: Counter,
    throttled: Counter,
    failed_inputs: Counter,
    encode_errors: Counter,
    dropped: Counter,
    backpressure: Counter,
    pending_bytes: Histogram,
    batch_records: Histogram,
    refused_at_transmit: Counter,
}

impl Metrics {
    fn new(ctx: &TaskContext) -> Self {
        Metrics {
            records_put: ctx.counter(metric::RECORDS_PUT),
            put_calls: ctx.counter(metric::PUT_CALLS),
            retried: ctx.counter(metric::RETRIED_RECORDS),
            throttled: ctx.counter(metric::THROTTLED),
            failed_inputs: ctx.counter(metric::FAILED_INPUTS),
            encode_errors: ctx.counter(metric::ENCODE_ERRORS),
            dropped: ctx.counter(metric::DROPPED_RECORDS),
            backpressure: ctx.counter(metric::BACKPRESSURE_WAITS),
            pending_bytes: ctx.histogram(metric::PENDING_BYTES),
            batch_records: ctx.histogram(metric::BATCH_RECORDS),
            refused_at_transmit: ctx.counter(metric::REFUSED_AT_TRANSMIT),
        }
    }
}

/// What `prepare` sets up: the calls' target, the task, the metrics.
struct Running {
    backend: Arc<dyn Backend>,
    /// The endpoint label, for classifying per-record errors.
    endpoint: String,
    ctx: TaskContext,
    cancel: CancellationToken,
    m: Metrics,
}

/// The PutRecords call in flight: its records (with their inputs) and its answer to come.
struct InFlight {
    entries: Vec<Entry<Held>>,
    rx: oneshot::Receiver<PutOutcome>,
    started: Instant,
    /// Set when the gate, asked again before an attempt was transmitted, refused it.
    refused: Arc<AtomicBool>,
}

/// Capped exponential back-off with jitter (backon), shared by every failure of the sink:
/// each failed call in a row doubles it, a clean call resets it.
struct Backoff {
    builder: ExponentialBuilder,
    seq: Option<ExponentialBackoff>,
    min: Duration,
    max: Duration,
    until: Option<Instant>,
    last: Duration,
}

impl Backoff {
    fn new(min: Duration, max: Duration) -> Self {
        let builder = ExponentialBuilder::new()
            .with_min_delay(min)
            .with_max_delay(max)
            .with_jitter_seed(crate::random::u64())
            .without_max_times();
        Backoff { builder, seq: None, min, max, until: None, last: min }
    }

    /// A call at `now` that put some records and had others throttled (per-record throttling:
    /// some shards over their limit): the rest are retried after the shortest delay, and the
    /// escalation starts over. Escalating on such calls would slow the whole sink to one call per
    /// longest delay whenever a backlog makes every batch hold a throttled record, which only
    /// grows the backlog.
    fn progress(&mut self, now: Instant) -> Duration {
        self.seq = None;
        self.until = Some(now + self.min);
        self.last = self.min;
        self.min
    }

    /// A failure at `now`: no call before the returned delay has passed.
    fn fail(&mut self, now: Instant) -> Duration {
        let builder = self.builder;
        let d = self.seq.get_or_insert_with(|| builder.build()).next().unwrap_or(self.max).min(self.max);
        self.until = Some(now + d);
        self.last = d;
        d
    }

    fn reset(&mut self) {
        self.seq = None;
        self.until = None;
    }

    /// No call before `until` (without counting as a failure).
    fn hold(&mut self, until: Instant) {
        self.until = Some(self.until.map_or(until, |u| u.max(until)));
    }

    /// When the back-off ends, if it has not.
    fn pending(&self, now: Instant) -> Option<Instant> {
        self.until.filter(|u| *u > now)
    }
}

/// Logs at most once per period; counts what it held back.
#[derive(Default)]
struct LogGate {
    last: Option<Instant>,
    suppressed: u64,
}

impl LogGate {
    /// `Some(suppressed since the last log)` when a log may go out now.
    fn pass(&mut self, now: Instant, period: Duration) -> Option<u64> {
        if self.last.is_none_or(|l| now >= l + period) {
            self.last = Some(now);
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }
}

/// A bolt that writes one Kinesis record per input (see the [module docs](super)): inputs are
/// acked once their record is put, failed when it cannot be.
///
/// ```no_run
/// use squall::kinesis::KinesisEndpoint;
/// use squall::sink::{FieldsEncoder, KinesisSink, KinesisSinkConfig};
/// use squall::topology::TopologyBuilder;
/// let cfg = KinesisSinkConfig::new("results", KinesisEndpoint::default());
/// cfg.validate().expect("valid sink config");
/// let mut b = TopologyBuilder::new("t");
/// // ... a spout "counts" emitting (word, count)
/// b.set_bolt("sink", 2, move |_| KinesisSink::new(cfg.clone(), FieldsEncoder::new(&["word"])))
///     .fields_grouping("counts", &["word"]);
/// ```
pub struct KinesisSink<E: SinkEncoder> {
    cfg: KinesisSinkConfig,
    encoder: E,
    source: Source,
    run: Option<Running>,
    queue: Queue<Held>,
    in_flight: Option<InFlight>,
    backoff: Backoff,
    /// The earliest wake-up scheduled and its token.
    armed: Option<(Instant, u64)>,
    next_token: u64,
    shards: Option<(Instant, Arc<[OpenShard]>)>,
    error_log: LogGate,
    encode_log: LogGate,
    /// The most bytes buffered plus in flight so far.
    peak_bytes: usize,
    /// Records put so far (for `abort_after_puts`).
    puts: u64,
    /// Asked before each call, and the epoch it gave last.
    gate: Option<Arc<dyn PutGate>>,
    gate_epoch: Option<u64>,
}

impl<E: SinkEncoder> std::fmt::Debug for KinesisSink<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // the config holds no secrets (credentials come from the SDK's chain); records' data
        // is never shown
        f.debug_struct("KinesisSink")
            .field("cfg", &self.cfg)
            .field("buffered", &self.queue.buffered())
            .field("pending_bytes", &self.queue.total_bytes())
            .field("in_flight", &self.in_flight.as_ref().map(|f| f.entries.len()))
            .finish_non_exhaustive()
    }
}

impl<E: SinkEncoder> KinesisSink<E> {
    /// A sink writing to `cfg.stream` at `cfg.kinesis`; the client is built in `prepare`, where
    /// an invalid `cfg` fails the topology (check it first with [`KinesisSinkConfig::validate`]).
    pub fn new(cfg: KinesisSinkConfig, encoder: E) -> Self {
        Self::with_source(cfg, encoder, Source::Endpoint)
    }

    /// A sink using a client of the caller's (cheap to clone, shared by the sink's tasks);
    /// `cfg.kinesis` then only labels error messages.
    pub fn with_client(cfg: KinesisSinkConfig, client: aws_sdk_kinesis::Client, encoder: E) -> Self {
        Self::with_source(cfg, encoder, Source::Client(client))
    }

    #[cfg(test)]
    pub(crate) fn with_backend(cfg: KinesisSinkConfig, backend: Arc<dyn Backend>, encoder: E) -> Self {
        Self::with_source(cfg, encoder, Source::Custom(backend))
    }

    fn with_source(cfg: KinesisSinkConfig, encoder: E, source: Source) -> Self {
        let backoff = Backoff::new(
            Duration::from_millis(cfg.retry_min_backoff_ms.max(1)),
            Duration::from_millis(cfg.retry_max_backoff_ms.max(1)),
        );
        KinesisSink {
            cfg,
            encoder,
            source,
            run: None,
            queue: Queue::default(),
            in_flight: None,
            backoff,
            armed: None,
            next_token: 0,
            shards: None,
            error_log: LogGate::default(),
            encode_log: LogGate::default(),
            peak_bytes: 0,
            puts: 0,
            gate: None,
            gate_epoch: None,
        }
    }

    /// Asks `gate` before each PutRecords call whether to put now, hold, or fail what is
    /// buffered (see [`PutGate`]).
    pub fn with_put_gate(mut self, gate: Arc<dyn PutGate>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// The configuration.
    pub fn config(&self) -> &KinesisSinkConfig {
        &self.cfg
    }

    /// The encoder.
    pub fn encoder(&self) -> &E {
        &self.encoder
    }

    /// Bytes buffered plus in flight now.
    pub fn pending_bytes(&self) -> usize {
        self.queue.total_bytes()
    }

    /// The most bytes buffered plus in flight at any time so far (at most
    /// `max_in_flight_bytes`, or one record when a single record is larger).
    pub fn peak_pending_bytes(&self) -> usize {
        self.peak_bytes
    }

    fn linger(&self) -> Duration {
        Duration::from_millis(self.cfg.linger_ms)
    }

    /// Buffers a record (after making room: backpressure), then puts what is due.
    async fn add(&mut self, record: SinkRecord, tag: Held, out: &mut BoltOutput) {
        let e = Entry::new(record, tag, Instant::now());
        if !self.reserve(e.size, out).await {
            return; // stopping: the dropped handle fails its input
        }
        let encoder = &mut self.encoder;
        self.queue.push_combining(e, |into, next| {
            into.size() + next.data.len() <= super::config::MAX_RECORD_BYTES && encoder.combine(into, next)
        });
        let total = self.queue.total_bytes();
        self.peak_bytes = self.peak_bytes.max(total);
        if let Some(run) = &self.run {
            run.m.pending_bytes.record(total as u64);
        }
        self.pump(out).await;
    }

    /// Waits until `size` more bytes fit under `max_in_flight_bytes` (one record always fits
    /// an empty sink). False when the topology stops meanwhile.
    async fn reserve(&mut self, size: usize, out: &mut BoltOutput) -> bool {
        let mut waited = false;
        loop {
            let total = self.queue.total_bytes();
            if total == 0 || total + size <= self.cfg.max_in_flight_bytes {
                return true;
            }
            let Some(run) = &self.run else { return true };
            if !waited {
                waited = true;
                run.m.backpressure.incr();
            }
            if self.in_flight.is_some() {
                if !self.harvest(out, true).await {
                    return false;
                }
                continue;
            }
            // nothing in flight: put what is buffered now, after the back-off
            if !self.wait_backoff().await {
                return false;
            }
            self.launch(out);
            if self.in_flight.is_none() {
                return true; // nothing to send (cannot happen with bytes buffered)
            }
        }
    }

    /// Sleeps out the back-off. False when the topology stops meanwhile.
    async fn wait_backoff(&mut self) -> bool {
        let Some(run) = &self.run else { return true };
        let cancel = run.cancel.clone();
        match self.backoff.pending(Instant::now()) {
            Some(until) => tokio::select! {
                biased;
                _ = cancel.cancelled() => false,
                _ = sleep_until(until) => true,
            },
            None => true,
        }
    }

    /// Takes in a finished call; starts the next when a batch is full or lingered long enough;
    /// schedules the next wake-up.
    async fn pump(&mut self, out: &mut BoltOutput) {
        self.harvest(out, false).await;
        let now = Instant::now();
        if self.in_flight.is_none() && self.queue.has_ready() && self.backoff.pending(now).is_none() {
            let full = self.queue.ready_keys() >= self.cfg.max_batch_records
                || self.queue.buffered_bytes() >= self.cfg.max_batch_bytes;
            let due = self.queue.oldest_ready().is_some_and(|t| now >= t + self.linger());
            if full || due {
                self.launch(out);
            }
        }
        self.arm(out, now);
    }

    /// Schedules a wake-up: to take in the call in flight (polled, more often when it is
    /// young), or to put a lingering batch after its linger and any back-off.
    fn arm(&mut self, out: &mut BoltOutput, now: Instant) {
        let want = if let Some(f) = &self.in_flight {
            let age = now.saturating_duration_since(f.started);
            Some(now + (age / 4).clamp(Duration::from_millis(1), Duration::from_millis(20)))
        } else if self.queue.has_ready() {
            let due = self.queue.oldest_ready().map_or(now, |t| t + self.linger());
            Some(self.backoff.pending(now).map_or(due, |u| due.max(u)))
        } else {
            None
        };
        if let Some(at) = want
            && self.armed.is_none_or(|(a, _)| at < a)
        {
            self.next_token += 1;
            out.schedule_at(at, self.next_token);
            self.armed = Some((at, self.next_token));
        }
    }

    /// Whether the gate (if any) lets a call start now; fails everything buffered when its
    /// epoch changed, and holds off the next call when it says not now.
    fn pass_gate(&mut self, out: &mut BoltOutput) -> bool {
        let Some(gate) = &self.gate else { return true };
        let Some(epoch) = gate.epoch() else {
            self.backoff.hold(Instant::now() + GATE_PAUSE);
            return false;
        };
        let Some(previous) = self.gate_epoch.replace(epoch).filter(|p| *p != epoch) else { return true };
        let Some(run) = &self.run else { return true };
        let (mut records, mut inputs) = (0usize, 0u64);
        for e in self.queue.take_all() {
            records += 1;
            inputs += e.tag.len() as u64;
            fail_entry(e, &run.m, out);
        }
        if records > 0 {
            tracing::warn!(stream = %self.cfg.stream, previous, epoch, records, inputs,
                "Kinesis sink: the writer's epoch changed (its worker's ZooKeeper session was replaced): the records \
                 buffered under the old one are not put; their inputs are failed, records without input dropped \
                 (sink.failed_inputs, sink.dropped_records)");
        }
        true
    }

    /// Starts a PutRecords call with the next batch (when the gate lets it).
    fn launch(&mut self, out: &mut BoltOutput) {
        if !self.pass_gate(out) {
            return;
        }
        let Some(run) = &self.run else { return };
        let batch = self.queue.take_batch(self.cfg.max_batch_records, self.cfg.max_batch_bytes);
        if batch.is_empty() {
            return;
        }
        let records: Vec<SinkRecord> = batch.iter().map(|e| e.record.clone()).collect();
        // the gate is asked again just before each attempt is sent: a call started before a
        // freeze (SIGSTOP, a long pause) must not go out after it under a session since lost
        let refused = Arc::new(AtomicBool::new(false));
        let check: Option<TransmitCheck> = match (&self.gate, self.gate_epoch) {
            (Some(gate), Some(epoch)) => {
                let (gate, refused) = (gate.clone(), refused.clone());
                Some(Arc::new(move || {
                    let open = gate.epoch() == Some(epoch);
                    if !open {
                        refused.store(true, Ordering::Relaxed);
                    }
                    open
                }))
            }
            _ => None,
        };
        let call = run.backend.put_records(records, check);
        let (tx, rx) = oneshot::channel();
        let cancel = run.cancel.clone();
        // owned by the topology's tracker; ends with the call or at cancellation
        drop(run.ctx.spawn(async move {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => {}
                r = call => { let _ = tx.send(r); }
            }
        }));
        run.m.put_calls.incr();
        run.m.batch_records.record(batch.len() as u64);
        self.in_flight = Some(InFlight { entries: batch, rx, started: Instant::now(), refused });
    }

    /// Takes in the call in flight if it finished (or, with `block`, waits for it). False when
    /// the topology stopped while waiting.
    async fn harvest(&mut self, out: &mut BoltOutput, block: bool) -> bool {
        let Some(f) = self.in_flight.as_mut() else { return true };
        let outcome = if block {
            let Some(run) = &self.run else { return true };
            let cancel = run.cancel.clone();
            tokio::select! {
                biased;
                r = &mut f.rx => r.ok(),
                _ = cancel.cancelled() => return false,
            }
        } else {
            match f.rx.try_recv() {
                Ok(r) => Some(r),
                Err(oneshot::error::TryRecvError::Empty) => return true,
                Err(oneshot::error::TryRecvError::Closed) => None,
            }
        };
        let Some(InFlight { entries, refused, .. }) = self.in_flight.take() else { return true };
        match outcome {
            Some(Err(e)) if refused.load(Ordering::Relaxed) => {
                // not sent (by the refused attempt; an earlier attempt of the call may have
                // been): held again, and the gate decides at the next call, which fails them
                // when the epoch changed
                if let Some(run) = &self.run {
                    run.m.refused_at_transmit.incr();
                }
                tracing::warn!(stream = %self.cfg.stream, records = entries.len(),
                    "Kinesis sink: a PutRecords call was not sent: the writer's gate closed between its start and its \
                     transmission (sink.refused_at_transmit); its records are held for the gate's next answer: {e}");
                self.queue.requeue(entries);
                self.backoff.hold(Instant::now() + GATE_PAUSE);
            }
            Some(outcome) => self.settle(entries, outcome, out),
            // the call's task was cancelled: stopping; the dropped handles fail their inputs
            None => {
                for e in &entries {
                    self.queue.release(e);
                }
            }
        }
        true
    }

    /// Acks what was put, queues what to retry (ahead of later records of its key), fails what
    /// cannot be put.
    fn settle(&mut self, entries: Vec<Entry<Held>>, outcome: PutOutcome, out: &mut BoltOutput) {
        let Some(run) = &self.run else { return };
        let now = Instant::now();
        let stream = self.cfg.stream.as_str();
        match outcome {
            Ok(results) => {
                let mut retry = Vec::new();
                let mut fatal: Option<KinesisError> = None;
                let mut put = 0usize;
                let mut results = results.into_iter();
                for e in entries {
                    match results.next().flatten() {
                        None => {
                            put += 1;
                            self.queue.release(&e);
                            run.m.records_put.incr();
                            self.puts += 1;
                            if self.cfg.abort_after_puts.is_some_and(|n| self.puts >= n) {
                                tracing::warn!(
                                    stream,
                                    puts = self.puts,
                                    "abort_after_puts: aborting after a record was put, before its inputs are acked"
                                );
                                std::process::abort();
                            }
                            for h in e.tag {
                                out.ack(h);
                            }
                        }
                        Some(err) => {
                            let k = KinesisError::classify("PutRecords", stream, &run.endpoint, &err.code, err.message);
                            if k.is_retryable() {
                                if k.kind() == ErrorKind::Throttled {
                                    run.m.throttled.incr();
                                }
                                retry.push(e);
                            } else {
                                self.queue.release(&e);
                                fail_entry(e, &run.m, out);
                                fatal = Some(k);
                            }
                        }
                    }
                }
                run.m.retried.add(retry.len() as u64);
                let n_retry = retry.len();
                self.queue.requeue(retry);
                if n_retry == 0 && fatal.is_none() {
                    self.backoff.reset();
                    return;
                }
                // escalate only when the call made no progress (every record refused or
                // throttled); a call that put records saw some shards throttled, not the stream
                let delay =
                    if put > 0 && fatal.is_none() { self.backoff.progress(now) } else { self.backoff.fail(now) };
                if let Some(suppressed) = self.error_log.pass(now, delay) {
                    match &fatal {
                        Some(k) => {
                            tracing::warn!(stream, kind = %k.kind(), suppressed, "Kinesis sink: records refused, their inputs failed (replayed by the spout): {k}")
                        }
                        None => tracing::debug!(
                            stream,
                            retried = n_retry,
                            backoff_ms = delay.as_millis() as u64,
                            "Kinesis sink: records not put (throttled or failed); retrying them first"
                        ),
                    }
                }
            }
            Err(e) if e.is_retryable() => {
                if e.kind() == ErrorKind::Throttled {
                    run.m.throttled.incr();
                }
                run.m.retried.add(entries.len() as u64);
                self.queue.requeue(entries);
                let delay = self.backoff.fail(now);
                if let Some(suppressed) = self.error_log.pass(now, delay) {
                    tracing::info!(stream, kind = %e.kind(), suppressed, backoff_ms = delay.as_millis() as u64, "Kinesis sink: PutRecords failed, retrying: {e}");
                }
            }
            Err(e) => {
                // retrying cannot fix it (stream missing, access denied, KMS key): fail every
                // input held so the spout replays them, and back off before the next call
                let mut failed = 0;
                for e in entries {
                    self.queue.release(&e);
                    failed += e.tag.len() as u64;
                    fail_entry(e, &run.m, out);
                }
                for e in self.queue.take_all() {
                    failed += e.tag.len() as u64;
                    fail_entry(e, &run.m, out);
                }
                let delay = self.backoff.fail(now);
                if let Some(suppressed) = self.error_log.pass(now, delay) {
                    tracing::error!(stream, kind = %e.kind(), failed_inputs = failed, suppressed, "Kinesis sink cannot write: {e}");
                }
            }
        }
    }

    /// Puts everything buffered and waits for it (drain). Returns early when the topology stops.
    async fn flush_all(&mut self, out: &mut BoltOutput) {
        loop {
            if self.run.as_ref().is_none_or(|r| r.cancel.is_cancelled()) {
                return;
            }
            if self.in_flight.is_some() {
                if !self.harvest(out, true).await {
                    return;
                }
                continue;
            }
            if !self.queue.has_ready() {
                return;
            }
            if !self.wait_backoff().await {
                return;
            }
            self.launch(out);
        }
    }

    /// The open shards for the encoder's hooks: cached, refreshed at most every 10 s, never
    /// fetched for an encoder that does not need them.
    async fn open_shards(&mut self) -> Arc<[OpenShard]> {
        if !self.encoder.needs_shards() {
            return Arc::from(Vec::new());
        }
        let now = Instant::now();
        if let Some((at, s)) = &self.shards
            && now < *at + SHARDS_TTL
        {
            return s.clone();
        }
        let Some(run) = &self.run else { return Arc::from(Vec::new()) };
        let call = run.backend.open_shards();
        let fetched = tokio::select! {
            biased;
            _ = run.cancel.cancelled() => return Arc::from(Vec::new()),
            r = call => r,
        };
        let stale = self.shards.take().map(|(_, s)| s);
        let shards: Arc<[OpenShard]> = match fetched {
            Ok(v) => Arc::from(v),
            Err(e) => {
                tracing::warn!(stream = %self.cfg.stream, "Kinesis sink: listing the stream's shards failed; the encoder gets the last list: {e}");
                stale.unwrap_or_else(|| Arc::from(Vec::new()))
            }
        };
        self.shards = Some((now, shards.clone()));
        shards
    }

    /// Buffers the records of an encoder hook (no input to ack).
    async fn add_hook_records(&mut self, records: Vec<SinkRecord>, hook: &str, out: &mut BoltOutput) {
        for r in records {
            if let Err(why) = r.check() {
                if let Some(run) = &self.run {
                    run.m.dropped.incr();
                }
                tracing::warn!(stream = %self.cfg.stream, hook, "Kinesis sink: a record from the encoder's {hook} is dropped: {why}");
                continue;
            }
            self.add(r, Vec::new(), out).await;
        }
    }
}

fn fail_entry(e: Entry<Held>, m: &Metrics, out: &mut BoltOutput) {
    if e.tag.is_empty() {
        m.dropped.incr();
    }
    for h in e.tag {
        m.failed_inputs.incr();
        out.fail(h);
    }
}

/// The inputs a buffered record acks once it is put: one, several when the encoder combined
/// records of one key ([`SinkEncoder::combine`]), none for a hook's record.
type Held = Vec<AckHandle>;

impl<E: SinkEncoder> Bolt for KinesisSink<E> {
    async fn prepare(&mut self, ctx: &TaskContext) -> Result<(), ComponentError> {
        self.cfg.validate().map_err(|e| ComponentError::fatal(e.to_string()))?;
        let endpoint = self.cfg.kinesis.label();
        let backend: Arc<dyn Backend> = match &self.source {
            Source::Custom(b) => b.clone(),
            Source::Client(c) => {
                Arc::new(SdkBackend { client: c.clone(), stream: self.cfg.stream.clone(), endpoint: endpoint.clone() })
            }
            Source::Endpoint => match crate::spout::registered_api(&self.cfg.kinesis.endpoint) {
                Some(api) => {
                    let api = api.map_err(|e| {
                        ComponentError::fatal_from(format!("Kinesis sink to stream {:?}", self.cfg.stream), e)
                    })?;
                    Arc::new(ApiBackend { api, stream: self.cfg.stream.clone() })
                }
                None => {
                    let client = self.cfg.kinesis.client().await.map_err(|e| {
                        ComponentError::fatal_from(
                            format!("Kinesis sink to stream {:?}: cannot build the client", self.cfg.stream),
                            e,
                        )
                    })?;
                    Arc::new(SdkBackend { client, stream: self.cfg.stream.clone(), endpoint: endpoint.clone() })
                }
            },
        };
        self.run =
            Some(Running { backend, endpoint, ctx: ctx.clone(), cancel: ctx.cancellation(), m: Metrics::new(ctx) });
        self.gate_epoch = self.gate.as_ref().and_then(|g| g.epoch());
        Ok(())
    }

    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let record = self.encoder.encode(&t).and_then(|r| r.check().map(|()| r).map_err(ComponentError::fatal));
        let record = match record {
            Ok(r) => r,
            Err(e) => {
                if let Some(run) = &self.run {
                    run.m.encode_errors.incr();
                }
                if let Some(suppressed) = self.encode_log.pass(Instant::now(), ENCODE_LOG_PERIOD) {
                    tracing::warn!(stream = %self.cfg.stream, suppressed, "Kinesis sink: input not encoded, failed: {e}");
                }
                return Err(e);
            }
        };
        let handle = out.defer_ack()?;
        self.add(record, vec![handle], out).await;
        Ok(())
    }

    async fn on_timer(&mut self, timer: Timer, out: &mut BoltOutput) -> Result<(), ComponentError> {
        if let Timer::Wakeup(token) = timer
            && self.armed.is_some_and(|(_, t)| t == token)
        {
            self.armed = None;
        }
        self.pump(out).await;
        Ok(())
    }

    async fn on_watermark(&mut self, wm: Watermark, out: &mut BoltOutput) -> Result<(), ComponentError> {
        if self.encoder.watermark_barriers() {
            self.queue.barrier();
        }
        let shards = self.open_shards().await;
        let records = self.encoder.on_watermark(wm, &shards);
        self.add_hook_records(records, "on_watermark", out).await;
        Ok(())
    }

    async fn on_drain(&mut self, out: &mut BoltOutput) -> Result<(), ComponentError> {
        if self.encoder.watermark_barriers() {
            self.queue.barrier();
        }
        let shards = self.open_shards().await;
        let records = self.encoder.on_drain(&shards);
        self.add_hook_records(records, "on_drain", out).await;
        self.flush_all(out).await;
        Ok(())
    }

    async fn cleanup(&mut self) {
        let in_flight = self.in_flight.as_ref().map_or(&[][..], |f| &f.entries[..]);
        let left = self.queue.buffered() + in_flight.len();
        let inputs: usize = self.queue.iter().chain(in_flight).map(|e| e.tag.len()).sum();
        if inputs > 0 {
            tracing::warn!(stream = %self.cfg.stream, records = left, inputs, "Kinesis sink stopped with records not put; their inputs are failed (replayed by the spout)");
        } else if left > 0 {
            // only records of the encoder's hooks (watermarks, markers): no input to replay
            tracing::debug!(stream = %self.cfg.stream, records = left, "Kinesis sink stopped with hook records not put");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use squall_topology::testing::BoltHarness;

    use super::super::backend::{BoxFuture, EntryError};
    use super::super::encoder::FieldsEncoder;
    use super::*;
    use crate::kinesis::KinesisEndpoint;

    type Script = Box<dyn FnMut(usize, &[SinkRecord]) -> PutOutcome + Send>;

    /// An in-memory PutRecords: `script` answers each call (by call number); the records it
    /// reports written are appended to `written`.
    struct Fake {
        written: Mutex<Vec<SinkRecord>>,
        calls: Mutex<Vec<usize>>,
        script: Mutex<Script>,
        delay: Duration,
        /// What `open_shards` answers.
        shards: Vec<OpenShard>,
        /// Calls the transmit check refused.
        refused: Mutex<usize>,
    }

    impl Fake {
        fn new(delay: Duration, script: Script) -> Arc<Fake> {
            Arc::new(Fake {
                written: Mutex::default(),
                calls: Mutex::default(),
                script: Mutex::new(script),
                delay,
                shards: Vec::new(),
                refused: Mutex::default(),
            })
        }
        fn ok() -> Script {
            Box::new(|_, r| Ok(vec![None; r.len()]))
        }
        fn keys(&self) -> Vec<String> {
            self.written.lock().unwrap().iter().map(|r| String::from_utf8(r.data.to_vec()).unwrap()).collect()
        }
    }

    struct Shared(Arc<Fake>);

    impl Backend for Shared {
        fn put_records(&self, records: Vec<SinkRecord>, check: Option<TransmitCheck>) -> BoxFuture<PutOutcome> {
            let fake = self.0.clone();
            Box::pin(async move {
                if !fake.delay.is_zero() {
                    tokio::time::sleep(fake.delay).await;
                }
                // transmission: after the delay (what the SDK does between a call's start and
                // its request going out), as the SDK's read_before_transmit hook does
                if check.is_some_and(|c| !c()) {
                    *fake.refused.lock().unwrap() += 1;
                    return Err(KinesisError::Unreachable {
                        endpoint: "fake".into(),
                        op: "PutRecords",
                        message: "refused by the transmit check".into(),
                    });
                }
                let n = {
                    let mut c = fake.calls.lock().unwrap();
                    c.push(records.len());
                    c.len() - 1
                };
                let outcome = (fake.script.lock().unwrap())(n, &records);
                if let Ok(results) = &outcome {
                    let mut w = fake.written.lock().unwrap();
                    for (r, res) in records.iter().zip(results) {
                        if res.is_none() {
                            w.push(r.clone());
                        }
                    }
                }
                outcome
            })
        }
        fn open_shards(&self) -> BoxFuture<Result<Vec<OpenShard>, KinesisError>> {
            let shards = self.0.shards.clone();
            Box::pin(async move { Ok(shards) })
        }
    }

    fn vals(a: impl Into<crate::topology::Value>, b: impl Into<crate::topology::Value>) -> crate::topology::Values {
        vec![a.into(), b.into()].into()
    }

    fn cfg(f: impl FnOnce(&mut KinesisSinkConfig)) -> KinesisSinkConfig {
        let mut c = KinesisSinkConfig::new("out", KinesisEndpoint::default());
        c.retry_min_backoff_ms = 1;
        c.retry_max_backoff_ms = 4;
        f(&mut c);
        c
    }

    async fn harness(
        c: KinesisSinkConfig,
        fake: &Arc<Fake>,
    ) -> squall_topology::testing::BoltHarness<KinesisSink<FieldsEncoder>> {
        let sink =
            KinesisSink::with_backend(c, Arc::new(Shared(fake.clone())), FieldsEncoder::new(&["k"]).data_field("v"));
        BoltHarness::new(sink).input("spout", "default", &["k", "v"]).prepare().await.unwrap()
    }

    #[tokio::test]
    async fn full_batches_go_at_once_partial_ones_after_linger_and_drain_flushes() {
        let fake = Fake::new(Duration::ZERO, Fake::ok());
        let mut h = harness(
            cfg(|c| {
                c.max_batch_records = 4;
                c.linger_ms = 60_000;
            }),
            &fake,
        )
        .await;
        for i in 0..10 {
            h.execute(vals(format!("k{i}"), format!("{i}"))).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(fake.calls.lock().unwrap().first(), Some(&4), "a full batch goes without waiting for linger");
        assert!(h.acked().len() < 10);
        h.drain().await.unwrap();
        assert_eq!(h.acked().len(), 10);
        assert!(h.failed().is_empty() && h.held().is_empty());
        let calls = fake.calls.lock().unwrap().clone();
        assert!(calls.iter().all(|&n| n <= 4) && calls.iter().sum::<usize>() == 10, "{calls:?}");

        // a partial batch goes after linger_ms, with no more input and no drain
        let fake = Fake::new(Duration::ZERO, Fake::ok());
        let mut h = harness(cfg(|c| c.linger_ms = 30), &fake).await;
        h.execute(vals("a", "1")).await.unwrap();
        h.execute(vals("b", "2")).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(fake.calls.lock().unwrap().is_empty(), "lingering");
        h.advance(Duration::from_millis(200)).await.unwrap();
        assert_eq!(*fake.calls.lock().unwrap(), [2]);
        assert_eq!(h.acked().len(), 2);
    }

    #[derive(Debug, Default)]
    struct TestGate(Mutex<Option<u64>>);

    impl PutGate for TestGate {
        fn epoch(&self) -> Option<u64> {
            *self.0.lock().unwrap()
        }
    }

    /// A sink (10 ms linger) on a fake whose calls take `delay`, behind a test gate open at epoch 1.
    async fn gated(delay: Duration) -> (Arc<Fake>, Arc<TestGate>, BoltHarness<KinesisSink<FieldsEncoder>>) {
        let fake = Fake::new(delay, Fake::ok());
        let gate = Arc::new(TestGate(Mutex::new(Some(1))));
        let sink = KinesisSink::with_backend(
            cfg(|c| c.linger_ms = 10),
            Arc::new(Shared(fake.clone())),
            FieldsEncoder::new(&["k"]).data_field("v"),
        )
        .with_put_gate(gate.clone());
        let h = BoltHarness::new(sink).input("spout", "default", &["k", "v"]).prepare().await.unwrap();
        (fake, gate, h)
    }

    #[tokio::test]
    async fn a_put_gate_holds_the_calls_and_an_epoch_change_fails_what_was_buffered_under_the_old_one() {
        let (fake, gate, mut h) = gated(Duration::ZERO).await;
        h.execute(vals("a", "1")).await.unwrap();
        h.advance(Duration::from_millis(200)).await.unwrap();
        assert_eq!((fake.keys(), h.acked().len()), (vec!["1".to_string()], 1), "put in epoch 1");
        *gate.0.lock().unwrap() = None;
        h.execute(vals("b", "2")).await.unwrap();
        h.execute(vals("c", "3")).await.unwrap();
        h.advance(Duration::from_millis(500)).await.unwrap();
        assert_eq!(fake.calls.lock().unwrap().len(), 1, "not now: held");
        assert!(h.failed().is_empty(), "held, not failed");
        *gate.0.lock().unwrap() = Some(2);
        h.advance(Duration::from_millis(300)).await.unwrap();
        assert_eq!(fake.calls.lock().unwrap().len(), 1, "buffered under epoch 1: never put");
        assert_eq!(h.failed().len(), 2, "their inputs failed");
        h.execute(vals("d", "4")).await.unwrap();
        h.advance(Duration::from_millis(200)).await.unwrap();
        assert_eq!(fake.keys(), ["1", "4"], "epoch 2's records go");
        assert_eq!(h.acked().len(), 2);
    }

    /// A call started while the gate was open, whose transmission comes after the gate closed
    /// (the process was frozen in between: SIGSTOP past its ZooKeeper session): nothing is sent,
    /// the records are held, and fail once the gate answers with a new epoch.
    #[tokio::test]
    async fn a_call_started_before_the_gate_closed_is_not_transmitted_after() {
        let (fake, gate, mut h) = gated(Duration::from_millis(100)).await;
        h.execute(vals("a", "1")).await.unwrap();
        // the call starts after the 10 ms linger, under epoch 1, and is transmitted 100 ms later
        h.advance(Duration::from_millis(50)).await.unwrap();
        // the gate closes while the call is on its way to transmission
        *gate.0.lock().unwrap() = None;
        h.advance(Duration::from_millis(300)).await.unwrap();
        assert_eq!(*fake.refused.lock().unwrap(), 1, "the call started, and was refused at transmission");
        assert!(fake.keys().is_empty(), "nothing sent after the gate closed");
        assert!(h.failed().is_empty() && h.acked().is_empty(), "held for the gate's next answer");
        *gate.0.lock().unwrap() = Some(2);
        h.advance(Duration::from_millis(300)).await.unwrap();
        assert!(fake.keys().is_empty(), "never put under the new epoch either");
        assert_eq!(h.failed().len(), 1, "its input failed (the next owner reads it again)");
        assert!(fake.calls.lock().unwrap().is_empty(), "no call transmitted");
    }

    #[tokio::test]
    async fn retried_records_keep_per_key_order_and_every_input_is_acked_once_put() {
        // every other call fails a third of its records (throttled) or all of it (a 500)
        let script: Script = Box::new(|n, r| match n % 4 {
            1 => Ok((0..r.len())
                .map(|i| {
                    (i % 3 == 0).then(|| EntryError {
                        code: "ProvisionedThroughputExceededException".into(),
                        message: "slow down".into(),
                    })
                })
                .collect()),
            3 => Err(KinesisError::Service {
                op: "PutRecords",
                stream: "out".into(),
                endpoint: "fake".into(),
                message: "HTTP 500".into(),
            }),
            _ => Ok(vec![None; r.len()]),
        });
        let fake = Fake::new(Duration::from_millis(1), script);
        let mut h = harness(
            cfg(|c| {
                c.max_batch_records = 5;
                c.linger_ms = 1;
            }),
            &fake,
        )
        .await;
        let mut ids = Vec::new();
        for i in 0..60 {
            ids.push(h.execute(vals(format!("k{}", i % 4), format!("k{}:{i}", i % 4))).await.unwrap());
        }
        h.drain().await.unwrap();
        assert_eq!(h.acked().len(), 60, "failed {:?} held {:?}", h.failed(), h.held());
        let written = fake.keys();
        assert_eq!(written.len(), 60, "each record written once");
        for k in 0..4 {
            let seqs: Vec<u32> =
                written.iter().filter_map(|w| w.strip_prefix(&format!("k{k}:")).map(|s| s.parse().unwrap())).collect();
            let want: Vec<u32> = (0..60).filter(|i| i % 4 == k).collect();
            assert_eq!(seqs, want, "key k{k}");
        }
        let m = &h.context().counter(metric::RETRIED_RECORDS);
        assert!(m.get() > 0);
        assert!(h.context().counter(metric::THROTTLED).get() > 0);
        assert!(fake.calls.lock().unwrap().iter().all(|&n| n <= 4), "one record per key per call");
    }

    /// Per-record throttling that never clears (every call of more than one record has one
    /// throttled while the others are put) is progress: the throttled records are retried after
    /// the shortest back-off. Escalating on such calls (to 60 s here) slowed a sink with a backlog
    /// to one call per longest back-off, until its inputs timed out and were dead-lettered.
    #[tokio::test]
    async fn per_record_throttling_with_progress_retries_after_the_shortest_back_off() {
        let script: Script = Box::new(|_, r| {
            Ok((0..r.len())
                .map(|i| {
                    (r.len() > 1 && i == r.len() - 1).then(|| EntryError {
                        code: "ProvisionedThroughputExceededException".into(),
                        message: "slow down".into(),
                    })
                })
                .collect())
        });
        let fake = Fake::new(Duration::from_millis(1), script);
        let mut h = harness(
            cfg(|c| {
                c.max_batch_records = 4;
                c.linger_ms = 1;
                c.retry_min_backoff_ms = 20;
                c.retry_max_backoff_ms = 60_000;
            }),
            &fake,
        )
        .await;
        for i in 0..40 {
            h.execute(vals(format!("k{i}"), format!("{i}"))).await.unwrap();
        }
        // about 14 calls 20 ms apart; escalating, the back-offs alone would add up to minutes
        let drained = tokio::time::timeout(Duration::from_secs(30), h.drain()).await;
        let calls = fake.calls.lock().unwrap().len();
        assert!(drained.is_ok(), "the sink still backs off after {calls} calls, each of which put records");
        assert_eq!(h.acked().len(), 40, "failed {:?} held {:?}", h.failed(), h.held());
        assert_eq!(fake.keys().len(), 40, "each record written once");
        assert!(h.context().counter(metric::THROTTLED).get() > 0, "records were throttled");
    }

    #[test]
    fn the_back_off_escalates_on_calls_without_progress_only() {
        let (min, max) = (Duration::from_millis(100), Duration::from_secs(60));
        let mut b = Backoff::new(min, max);
        let now = Instant::now();
        let escalated = (0..12).map(|_| b.fail(now)).last().unwrap();
        assert!(escalated > min * 8, "{escalated:?}");
        assert_eq!(b.progress(now), min, "a call that put records retries the rest after the shortest delay");
        assert_eq!(b.pending(now), Some(now + min));
        assert!(b.fail(now) <= min * 2, "and a later failure escalates from the start again");
    }

    /// A stage writer's sink (whose encoder asks for watermark barriers) with throttled records
    /// retried later: in each shard of the stream, the watermarks of the records written are in
    /// order (the next stage takes the highest consumed as the shard's: none may land behind a
    /// later one), the drain marker comes last, and every input is acked once.
    #[tokio::test]
    async fn a_stage_writer_never_puts_a_record_behind_a_later_watermark_in_its_shard() {
        use crate::stage::codec::{self, Payload};
        use crate::stage::writer::StageEncoder;
        // two shards; each call throttles about a third of its records
        let half = u128::MAX / 2;
        let shards = vec![
            OpenShard { shard_id: "s0".into(), starting_hash_key: "0".into(), ending_hash_key: half.to_string() },
            OpenShard {
                shard_id: "s1".into(),
                starting_hash_key: (half + 1).to_string(),
                ending_hash_key: u128::MAX.to_string(),
            },
        ];
        let script: Script = Box::new(|n, r| {
            Ok((0..r.len())
                .map(|i| {
                    ((i + n) % 3 == 0).then(|| EntryError {
                        code: "ProvisionedThroughputExceededException".into(),
                        message: "slow down".into(),
                    })
                })
                .collect())
        });
        let fake = Arc::new(Fake {
            written: Mutex::default(),
            calls: Mutex::default(),
            script: Mutex::new(script),
            delay: Duration::from_millis(1),
            shards,
            refused: Mutex::default(),
        });
        let c = cfg(|c| {
            c.max_batch_records = 6;
            c.linger_ms = 1;
        });
        let encoder = StageEncoder::new(7, "dep", vec!["word".into()], Duration::ZERO);
        let sink = KinesisSink::with_backend(c, Arc::new(Shared(fake.clone())), encoder);
        let mut h = BoltHarness::new(sink).input("split", "default", &["word"]).prepare().await.unwrap();
        let mut inputs = 0;
        for round in 0..30u64 {
            for i in 0..7 {
                h.execute(vec![crate::topology::Value::from(format!("w{}", (round + i) % 11))]).await.unwrap();
                inputs += 1;
            }
            h.watermark(Watermark(1_000 + round * 100)).await.unwrap();
            if round % 3 == 0 {
                h.advance(Duration::from_millis(5)).await.unwrap();
            }
        }
        h.drain().await.unwrap();
        assert_eq!(h.acked().len(), inputs, "failed {:?} held {:?}", h.failed(), h.held());
        let throttled = h.context().counter(metric::THROTTLED).get();
        assert!(throttled >= 10, "records throttled: {throttled}");
        let shard_of = |r: &SinkRecord| -> usize {
            usize::from(r.explicit_hash_key.as_ref().unwrap().parse::<u128>().unwrap() > half)
        };
        let mut last = [0u64; 2];
        let mut drained = [false; 2];
        let (mut tuples, mut controls) = (0, 0);
        for r in fake.written.lock().unwrap().iter() {
            let d = codec::decode(&r.data, 1).unwrap();
            let s = shard_of(r);
            assert!(!drained[s], "a record after the drain marker in shard {s}");
            let wm = d.watermark.unwrap_or(0);
            assert!(wm >= last[s], "shard {s}: a record with watermark {wm} landed after one with {}", last[s]);
            last[s] = wm;
            match d.payload {
                Payload::Data(t) => tuples += t.len(),
                Payload::Watermark => controls += 1,
                Payload::Drain => drained[s] = true,
            }
        }
        assert_eq!(tuples, inputs, "every tuple written once");
        assert!(controls > 0 && drained == [true, true], "watermark records {controls}, drained {drained:?}");
    }

    #[tokio::test]
    async fn errors_retrying_cannot_fix_fail_the_inputs_and_encode_errors_fail_one() {
        let script: Script =
            Box::new(|_, _| Err(KinesisError::StreamNotFound { stream: "out".into(), endpoint: "fake".into() }));
        let fake = Fake::new(Duration::ZERO, script);
        let mut h = harness(cfg(|c| c.linger_ms = 1), &fake).await;
        for i in 0..5 {
            h.execute(vals(format!("k{i}"), "x")).await.unwrap();
        }
        h.drain().await.unwrap();
        assert_eq!((h.acked().len(), h.failed().len()), (0, 5));
        assert_eq!(h.context().counter(metric::FAILED_INPUTS).get(), 5);

        let fake = Fake::new(Duration::ZERO, Fake::ok());
        let mut h = harness(cfg(|c| c.linger_ms = 1), &fake).await;
        let good = h.execute(vals("a", "x")).await.unwrap();
        let bad = h.execute(vals("b", 7u64)).await.unwrap(); // data must be bytes or str
        let empty_key = h.execute(vals("", "x")).await.unwrap();
        h.drain().await.unwrap();
        assert_eq!(h.acked(), [good]);
        assert_eq!(h.failed(), [bad, empty_key]);
        assert_eq!(h.context().counter(metric::ENCODE_ERRORS).get(), 2);
    }

    #[tokio::test]
    async fn bytes_buffered_and_in_flight_stay_under_the_bound() {
        let fake = Fake::new(Duration::from_millis(15), Fake::ok());
        let mut h = harness(
            cfg(|c| {
                c.max_batch_bytes = 1_000;
                c.max_in_flight_bytes = 2_000;
                c.linger_ms = 5;
            }),
            &fake,
        )
        .await;
        let data = "x".repeat(96);
        for i in 0..200 {
            h.execute(vals(format!("k{:03}", i % 50), data.clone())).await.unwrap();
        }
        h.drain().await.unwrap();
        assert_eq!(h.acked().len(), 200);
        let peak = h.bolt().unwrap().peak_pending_bytes();
        assert!(peak <= 2_000 && peak > 1_000, "peak {peak}");
        assert!(h.context().counter(metric::BACKPRESSURE_WAITS).get() > 0);
        assert!(fake.calls.lock().unwrap().iter().all(|&n| n * 100 <= 1_000));
    }
}
