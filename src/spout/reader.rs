//! One GetRecords loop per owned shard.
//!
//! - Starts from the shard's checkpoint (TRIM_HORIZON, AT_TIMESTAMP, or AT_SEQUENCE_NUMBER of the
//!   checkpointed record, skipping the user records at or below the checkpoint: a checkpoint may
//!   stop inside a KPL aggregate).
//! - KPL aggregates are split into user records before they are queued (see `deagg`): the queue,
//!   its bounds and the tracker count user records; the call's Limit counts Kinesis records, sized
//!   from the running estimate of user records per Kinesis record.
//! - Call budget: at most `max_gets_per_second` GetRecords calls in any one second (Kinesis allows
//!   5 per shard; [`CallPacer`]): a reader catching up calls again at once while the second has
//!   room; a reader at the shard's tip spaces its calls 204 ms apart (at 5), so a few quick
//!   polls that find nothing never use up a second's calls and leave the shard unread for the
//!   rest of it; and `idle_poll_interval` after a read that returned nothing, so an idle shard
//!   costs one call per interval.
//! - Errors, by [`ErrorKind`]:
//!   - throttled, transport or server errors: the same iterator is used again after a capped
//!     exponential back-off with jitter (`call_min_backoff`..`call_max_backoff`). An iterator
//!     stays valid for 5 minutes; dropping it would cost a GetShardIterator call per throttle.
//!     After [`TRANSIENT_RUN_RESET`] such errors in a row (an emulator answers an iterator it
//!     cannot use with HTTP 500) a new iterator is taken once.
//!   - a start timestamp later than the Kinesis service's clock ("Timestamp cannot be in the
//!     future": the clock it was taken from runs ahead of the service's): the same
//!     AT_TIMESTAMP is asked again after the call back-off (or, when AWS says its time, once
//!     that passed it), never TRIM_HORIZON or LATEST instead, so nothing at or after it is
//!     skipped; WARN with stream, shard, timestamp and cause, counted as `timestamp_ahead`.
//!     Enhanced fan-out's SubscribeToShard takes the same path.
//!   - ExpiredIteratorException (or an error saying the iterator is invalid): a new iterator
//!     AFTER_SEQUENCE_NUMBER of the last record fetched (or the start position if none was), so
//!     nothing is fetched twice; no wait.
//!   - errors retrying cannot fix (access denied, KMS key, stream or shard deleted, invalid
//!     argument): the reader keeps trying, so it resumes by itself once the cause is fixed, but
//!     backs off exponentially up to `fatal_max_backoff` (60 s by default), logs each attempt at
//!     ERROR with the fix, and marks the shard's status not retryable, with the time it began.
//! - Shard end is a null NextShardIterator (never a comparison with EndingSequenceNumber, which
//!   the emulator returns as a sentinel): the end is marked in the tracker after the last records
//!   and the coordinator is told at once.
//! - Backpressure and memory: the shard's queue of read-but-unemitted records is bounded by
//!   `records_per_get` records and `max_queued_bytes` bytes. The reader fetches only while the
//!   queue is at most half full (or empty) and fetching is allowed (topology active, ZooKeeper
//!   session healthy), and sizes each call's Limit to the room left, from a running estimate of
//!   the shard's record size. The readers of one spout task share a budget of bytes being
//!   fetched (`max_read_bytes_in_flight`): a call reserves its expected size first, so many shards
//!   starting together do not hold dozens of large responses (and their decoded copies) at once.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use aws_sdk_kinesis::primitives::{DateTime, DateTimeFormat};
use backon::BackoffBuilder;
use tokio::sync::{Notify, Semaphore, mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::ShardStatus;
use super::deagg::{self, HashRange};
use super::readlog::ReadLog;
use super::source::{ShardSource, StartAt};
use super::tracker::{RECORD_OVERHEAD, Record, SeqKey, Tracker};
use crate::coord::CheckpointPosition;
use crate::kinesis::{ErrorKind, KinesisError};

/// Transport or server errors in a row after which the iterator is replaced once.
pub(crate) const TRANSIENT_RUN_RESET: u32 = 5;

/// The record size assumed before anything was read (bytes, overhead included): small enough
/// that the first read of a shard of large records stays well inside the queue's byte budget.
const INITIAL_RECORD_SIZE_GUESS: usize = 16 * 1024;

/// Paces one shard's GetRecords calls: never more than `max_per_second` in any one second (a
/// sliding window of 1020 ms, the 20 ms spare absorbing timer jitter), and after a call that
/// found the shard's tip (it returned fewer records than asked and no backlog), the next waits
/// `1020 / max_per_second` ms (204 ms at 5). A reader catching up calls again at once while the
/// window has room (full throughput); a reader at the tip calls evenly spaced, so quick polls
/// that find nothing never use up a second's calls and leave the shard unread for the rest of it.
#[derive(Debug, Clone)]
pub(crate) struct CallPacer {
    max: usize,
    gap: Duration,
    /// Start times of the calls of the last window.
    starts: VecDeque<Instant>,
    /// The last call found the tip: the next one waits `gap` after it.
    at_tip: bool,
}

impl CallPacer {
    const WINDOW: Duration = Duration::from_millis(1_020);

    pub(crate) fn new(max_per_second: u32) -> Self {
        let max = max_per_second.max(1);
        CallPacer {
            max: max as usize,
            gap: Self::WINDOW / max,
            starts: VecDeque::with_capacity(max as usize + 1),
            at_tip: false,
        }
    }

    /// When the next call may start, if later than `now`.
    pub(crate) fn wait_until(&self, now: Instant) -> Option<Instant> {
        let window = (self.starts.len() >= self.max).then(|| self.starts[self.starts.len() - self.max] + Self::WINDOW);
        let spaced = self.starts.back().filter(|_| self.at_tip).map(|last| *last + self.gap);
        window.max(spaced).filter(|at| *at > now)
    }

    /// A call started at `at`.
    pub(crate) fn called(&mut self, at: Instant) {
        self.starts.push_back(at);
        while self.starts.len() > self.max {
            self.starts.pop_front();
        }
    }

    /// What the call found: `at_tip` when it returned fewer records than asked and no backlog.
    pub(crate) fn read(&mut self, at_tip: bool) {
        self.at_tip = at_tip;
    }
}

/// Tells the coordinator something about a shard.
#[derive(Debug)]
pub(crate) enum ReaderEvent {
    /// The reader reached the shard's end (children named by Kinesis, if any).
    Ended { shard: Arc<str>, epoch: u64, children: Vec<String> },
}

pub(crate) struct ReaderCtx {
    /// Where GetShardIterator and GetRecords go.
    pub source: ShardSource,
    pub stream: String,
    /// The task's ZooKeeper node name (for the read log).
    pub task: Arc<Mutex<String>>,
    pub records_per_get: i32,
    /// Byte budget of one shard's queue of read-but-unemitted records.
    pub max_queued_bytes: usize,
    /// Expected bytes of the GetRecords calls in flight, shared by the task's readers, in KiB
    /// permits: a reader reserves its call's expected size (Limit x estimated record size) first.
    pub read_budget: Arc<Semaphore>,
    /// The budget's size in KiB.
    pub read_budget_kib: u32,
    pub max_gets_per_second: u32,
    pub idle_poll_interval: Duration,
    pub call_min_backoff: Duration,
    pub call_max_backoff: Duration,
    /// Cap of the back-off after an error retrying cannot fix.
    pub fatal_max_backoff: Duration,
    pub tracker: Arc<Mutex<Tracker>>,
    /// Signalled by the spout when it took records from a queue.
    pub space: Arc<Notify>,
    /// Wakes the spout's executor when records arrive.
    pub wakeup: squall_topology::Wakeup,
    pub events: mpsc::UnboundedSender<ReaderEvent>,
    pub fetch_allowed: watch::Receiver<bool>,
    /// Whether the worker's leases can be trusted right now (no unconfirmed pause).
    pub liveness: Arc<crate::coord::Liveness>,
    pub status: Arc<Mutex<std::collections::HashMap<Arc<str>, ShardStatus>>>,
    pub read_log: ReadLog,
    /// The task's counters (KPL de-aggregation).
    pub stats: Arc<super::SpoutStats>,
    /// Hash ranges of the stream's shards (from ListShards, fetched when a reader first meets a
    /// KPL aggregate on a shard not known yet).
    pub hash_ranges: tokio::sync::Mutex<std::collections::HashMap<Arc<str>, HashRange>>,
    /// Set when the spout is an enhanced fan-out consumer: shards are read by subscriptions.
    pub efo: Option<Arc<super::efo::EfoCtx>>,
    /// What to do with KPL aggregates holding user records outside the shard's hash range.
    pub kpl_out_of_range: super::KplOutOfRange,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a shard's queue holds right now.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Room {
    pub(super) queued: usize,
    pub(super) queued_bytes: usize,
}

/// A running estimate of a shard's record size (memory the user records of one Kinesis record
/// hold once queued) and of user records per Kinesis record (KPL aggregates), weighted towards
/// recent reads.
#[derive(Debug, Clone)]
pub(crate) struct SizeEstimate {
    bytes: f64,
    count: f64,
    users: f64,
}

impl Default for SizeEstimate {
    fn default() -> Self {
        Self { bytes: INITIAL_RECORD_SIZE_GUESS as f64, count: 1.0, users: 1.0 }
    }
}

impl SizeEstimate {
    /// Notes a read of `n` plain records holding `bytes` in total.
    #[cfg(test)]
    pub fn observe(&mut self, bytes: usize, n: usize) {
        self.observe_batch(bytes, n, n);
    }

    /// Notes a read of `records` Kinesis records that became `users` queued user records holding
    /// `bytes` in total.
    pub fn observe_batch(&mut self, bytes: usize, records: usize, users: usize) {
        if records == 0 {
            return;
        }
        self.bytes = self.bytes * 0.5 + bytes as f64;
        self.count = self.count * 0.5 + records as f64;
        self.users = self.users * 0.5 + users.max(1) as f64;
    }

    /// Estimated bytes per Kinesis record (all its user records).
    pub fn average(&self) -> usize {
        ((self.bytes / self.count).ceil() as usize).max(RECORD_OVERHEAD)
    }

    /// Estimated user records per Kinesis record (1 without aggregation).
    pub fn users_per_record(&self) -> f64 {
        (self.users / self.count).max(1.0)
    }
}

/// The Limit of the next GetRecords call: the room left in the queue, in user records
/// (`records_per_get` at most, divided by the estimated user records per Kinesis record) and in
/// bytes (at the estimated record size); at least 1.
pub(crate) fn get_limit(records_per_get: i32, max_bytes: usize, room: Room, est: &SizeEstimate) -> i32 {
    let per_get = records_per_get.max(1) as usize;
    let by_count = (per_get.saturating_sub(room.queued) as f64 / est.users_per_record()) as usize;
    let by_bytes = max_bytes.saturating_sub(room.queued_bytes) / est.average();
    by_count.min(by_bytes).clamp(1, per_get) as i32
}

/// KiB of the task's read budget a call of `limit` records reserves: its expected size, at least
/// 1 KiB, at most the whole budget.
pub(crate) fn read_reservation_kib(limit: i32, est: &SizeEstimate, budget_kib: u32) -> u32 {
    let kib = (limit.max(1) as usize).saturating_mul(est.average()).div_ceil(1024);
    kib.clamp(1, budget_kib.max(1) as usize) as u32
}

/// Whether a shard's reader may fetch: its queue is empty, or at most half full in records and
/// in bytes (so each call fetches a useful amount and the queue stays within its bounds).
pub(crate) fn has_room(records_per_get: i32, max_bytes: usize, room: Room) -> bool {
    room.queued == 0 || (room.queued <= records_per_get.max(1) as usize / 2 && room.queued_bytes <= max_bytes / 2)
}

/// Back-off state of one reader.
pub(super) struct Backoffs {
    /// After throttles and transport or server errors (backon, with jitter).
    pub(super) transient: backon::ExponentialBackoff,
    /// The next back-off after an error retrying cannot fix (doubles up to the cap).
    fatal_next: Duration,
    /// Transport or server errors in a row.
    transient_run: u32,
    /// The kind of the errors of the current failing streak, and when the streak began.
    pub(super) failing: Option<(ErrorKind, i64)>,
}

impl ReaderCtx {
    pub(super) fn transient_backoff(&self) -> backon::ExponentialBackoff {
        backon::ExponentialBuilder::default()
            .with_min_delay(self.call_min_backoff)
            .with_max_delay(self.call_max_backoff)
            .with_jitter_seed(crate::random::u64())
            .without_max_times()
            .build()
    }

    pub(super) fn backoffs(&self) -> Backoffs {
        Backoffs {
            transient: self.transient_backoff(),
            fatal_next: self.call_min_backoff,
            transient_run: 0,
            failing: None,
        }
    }

    async fn iterator(&self, shard: &str, pos: StartAt<'_>) -> Result<String, KinesisError> {
        self.source.shard_iterator(shard, pos).await
    }

    /// The shard's hash range, from the task's cache or ListShards; `None` when ListShards does
    /// not name the shard (then nothing is filtered).
    pub(super) async fn hash_range(&self, shard: &Arc<str>) -> Result<Option<HashRange>, KinesisError> {
        let mut ranges = self.hash_ranges.lock().await;
        if let Some(r) = ranges.get(shard) {
            return Ok(Some(*r));
        }
        for d in self.source.list_shards().await? {
            if let Some(r) = HashRange::of(&d) {
                ranges.insert(Arc::from(d.shard_id.as_str()), r);
            }
        }
        let found = ranges.get(shard).copied();
        if found.is_none() {
            tracing::warn!(stream = %self.stream, shard = %shard,
                "ListShards does not name this shard: its KPL user records are not checked against a hash range (none counted out of range, none dropped)");
        }
        Ok(found)
    }

    pub(super) fn set_status(&self, shard: &Arc<str>, f: impl FnOnce(&mut ShardStatus)) {
        let mut s = lock(&self.status);
        f(s.entry(shard.clone()).or_default());
    }

    /// Waits until the shard's queue has room and fetching is allowed; returns what the queue
    /// holds then. None when cancelled or the ownership ended.
    async fn wait_room(&self, shard: &str, epoch: u64, cancel: &CancellationToken) -> Option<Room> {
        let mut allowed = self.fetch_allowed.clone();
        loop {
            let room = {
                let t = lock(&self.tracker);
                match t.get(shard) {
                    Some(tr) if tr.epoch == epoch => Room { queued: tr.queued.len(), queued_bytes: tr.queued.bytes() },
                    _ => return None,
                }
            };
            if has_room(self.records_per_get, self.max_queued_bytes, room) && *allowed.borrow() {
                return Some(room);
            }
            tokio::select! {
                _ = cancel.cancelled() => return None,
                _ = self.space.notified() => {}
                // (a closed channel would answer at once: the sleep paces the loop then)
                _ = allowed.changed(), if allowed.has_changed().is_ok() => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    }

    /// Whether this task's leases can be trusted now: the worker's session is trusted and is the
    /// one the task's coordinator holds them in (not a newer one it has not noticed yet).
    pub(super) fn leases_trusted(&self) -> bool {
        let generation = lock(&self.tracker).session_generation();
        generation.is_some_and(|g| self.liveness.trusted_in(g))
    }

    /// Reads one shard until its end or cancellation: by enhanced fan-out when the spout is an
    /// EFO consumer (see `efo`), else by polling.
    pub async fn run(
        self: Arc<Self>,
        shard: Arc<str>,
        epoch: u64,
        start: CheckpointPosition,
        cancel: CancellationToken,
    ) {
        let skip = resume_skip(&start);
        match self.efo.clone() {
            Some(efo) => self.run_efo(efo, shard, epoch, start, skip, cancel).await,
            None => self.poll(shard, epoch, &start, skip, None, cancel).await,
        }
    }

    /// The polling loop (GetShardIterator + GetRecords) from `start`, or after `last_fetched`
    /// when given (a Kinesis record already read whole), skipping user records at or below
    /// `skip`; until the shard's end or cancellation.
    pub(super) async fn poll(
        &self,
        shard: Arc<str>,
        epoch: u64,
        start: &CheckpointPosition,
        mut skip: Option<SeqKey>,
        mut last_fetched: Option<Arc<str>>,
        cancel: CancellationToken,
    ) {
        let mut backoffs = self.backoffs();
        let mut sizes = SizeEstimate::default();
        let mut iterator: Option<String> = None;
        let mut pacer = CallPacer::new(self.max_gets_per_second);
        loop {
            let Some(room) = self.wait_room(&shard, epoch, &cancel).await else { return };
            if let Some(at) = pacer.wait_until(Instant::now()) {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep_until(at) => {}
                }
            }
            let it = match &iterator {
                Some(it) => it.clone(),
                None => {
                    let pos = match &last_fetched {
                        Some(seq) => StartAt::AfterFetched(seq),
                        None => StartAt::Checkpoint(start),
                    };
                    let res = tokio::select! {
                        _ = cancel.cancelled() => return,
                        r = self.iterator(&shard, pos) => r,
                    };
                    match res {
                        Ok(it) => {
                            iterator = Some(it.clone());
                            it
                        }
                        Err(e) => {
                            if self.on_error(&shard, &e, &mut backoffs, &cancel).await {
                                continue;
                            }
                            return;
                        }
                    }
                }
            };
            let limit = get_limit(self.records_per_get, self.max_queued_bytes, room, &sizes);
            // Held until the records are queued (where the queue's bound accounts for them).
            let reservation = read_reservation_kib(limit, &sizes, self.read_budget_kib);
            let permit = tokio::select! {
                _ = cancel.cancelled() => return,
                p = self.read_budget.clone().acquire_many_owned(reservation) => match p {
                    Ok(p) => p,
                    Err(_) => return,
                },
            };
            if !*self.fetch_allowed.borrow() {
                continue; // stopped while waiting for the budget: wait for room and permission again
            }
            pacer.called(Instant::now());
            // Cancellation drops the call in flight: after a release nothing more is fetched.
            let res = tokio::select! {
                _ = cancel.cancelled() => return,
                r = self.source.get_records(&shard, &it, limit) => r,
            };
            self.set_status(&shard, |s| s.get_records_calls += 1);
            let out = match res {
                Ok(out) => out,
                Err(e) => {
                    drop(permit);
                    match e.kind() {
                        ErrorKind::IteratorInvalid => iterator = None,
                        ErrorKind::Transient => {
                            backoffs.transient_run += 1;
                            if backoffs.transient_run.is_multiple_of(TRANSIENT_RUN_RESET) {
                                iterator = None;
                            }
                        }
                        // Throttles and errors retrying cannot fix leave the iterator valid.
                        _ => {}
                    }
                    if self.on_error(&shard, &e, &mut backoffs, &cancel).await {
                        continue;
                    }
                    return;
                }
            };
            // Hand nothing on unless the leases can be trusted right now: a worker that was paused
            // (and may have lost its session meanwhile) drops a batch that arrived after the pause
            // and reads it again, from the same iterator, once its session is confirmed.
            if !self.leases_trusted() || !*self.fetch_allowed.borrow() {
                iterator = Some(it);
                continue;
            }
            // KPL user records are checked against the shard's hash range, which a first aggregate on
            // this shard looks up (ListShards); if that fails, the same iterator is used again.
            let range = if deagg::any_aggregate(&out.records) {
                let res = tokio::select! {
                    _ = cancel.cancelled() => return,
                    r = self.hash_range(&shard) => r,
                };
                match res {
                    Ok(r) => r,
                    Err(e) => {
                        drop(permit);
                        iterator = Some(it);
                        if self.on_error(&shard, &e, &mut backoffs, &cancel).await {
                            continue;
                        }
                        return;
                    }
                }
            } else {
                None
            };
            if backoffs.failing.take().is_some() {
                tracing::info!(stream = %self.stream, shard = %shard, "reading the shard works again");
            }
            backoffs = self.backoffs();
            let behind = out.millis_behind_latest;
            pacer.read(out.records.len() < limit.max(1) as usize && behind.is_none_or(|b| b == 0));
            let next_iterator = out.next_iterator;
            let children = out.children;
            let n = out.records.len();
            let bytes: usize = out.records.iter().map(|r| r.data.len()).sum();
            if let Some(last) = out.records.last() {
                last_fetched = Some(last.sequence.clone());
            }
            let (records, counts) = deagg::split(&self.stream, out.records, range, self.kpl_out_of_range, &mut skip);
            self.stats.kpl.add(&counts, &self.stream, &shard);
            sizes.observe_batch(records.iter().map(Record::mem_size).sum(), n, records.len());
            self.set_status(&shard, |s| {
                s.millis_behind_latest = behind;
                s.clear_error();
                s.records_read += n as u64;
                s.bytes_read += bytes as u64;
            });
            if let (Some(first), Some(last)) = (records.first(), records.last()) {
                let (first, last, users) = (first.sequence.clone(), last.sequence.clone(), records.len());
                let live = lock(&self.tracker).enqueue(&shard, epoch, records);
                if !live || cancel.is_cancelled() {
                    return;
                }
                self.read_log.records(&lock(&self.task), &shard, &first, &last, users);
                self.wakeup.notify();
            }
            drop(permit);
            match next_iterator {
                Some(next) => iterator = Some(next),
                None => {
                    tracing::info!(stream = %self.stream, shard = %shard, ?children, "read to the end of the shard");
                    self.read_log.end(&lock(&self.task), &shard, last_fetched.as_deref());
                    lock(&self.tracker).mark_ended(&shard, epoch, self.source.watermark_now());
                    self.wakeup.notify();
                    let _ = self.events.send(ReaderEvent::Ended { shard: shard.clone(), epoch, children });
                    return;
                }
            }
            if n == 0 {
                if behind.is_none_or(|b| b == 0) {
                    lock(&self.tracker).mark_caught_up(&shard, epoch, self.source.watermark_now());
                }
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(self.idle_poll_interval) => {}
                }
            }
        }
    }

    /// Backs off after an error, as its kind says; false when cancelled.
    pub(super) async fn on_error(
        &self,
        shard: &Arc<str>,
        e: &KinesisError,
        b: &mut Backoffs,
        cancel: &CancellationToken,
    ) -> bool {
        let kind = e.kind();
        let now = crate::coord::now_ms();
        let repeated = b.failing.is_some_and(|(k, _)| k == kind);
        if !repeated {
            b.failing = Some((kind, now));
        }
        let since = b.failing.map_or(now, |(_, since)| since);
        let delay = match kind {
            ErrorKind::IteratorInvalid => {
                tracing::info!(stream = %self.stream, shard = %shard, error = %e, "shard iterator expired or invalid; getting a new one after the last fetched record");
                // At once, unless a fresh iterator was refused as well.
                if repeated { b.transient.next().unwrap_or(self.call_max_backoff) } else { Duration::ZERO }
            }
            ErrorKind::Throttled => {
                let delay = b.transient.next().unwrap_or(self.call_max_backoff);
                tracing::debug!(stream = %self.stream, shard = %shard, ?delay, "throttled; backing off");
                delay
            }
            ErrorKind::TimestampAhead => {
                // It fixes itself once the service's clock passes the timestamp, and the same
                // AT_TIMESTAMP asked then skips nothing that arrived at or after it (a start at
                // TRIM_HORIZON or LATEST instead would read too much or skip records). When the
                // service said its time (AWS does), wait until it passes; else back off.
                let (timestamp, service) = match e {
                    KinesisError::TimestampAhead { timestamp_ms, service_ms, .. } => (*timestamp_ms, *service_ms),
                    _ => (None, None),
                };
                let delay = match (timestamp, service) {
                    (Some(t), Some(s)) => Duration::from_millis((t - s).max(0) as u64 + 100)
                        .clamp(self.call_min_backoff, self.fatal_max_backoff),
                    _ => b.transient.next().unwrap_or(self.call_max_backoff),
                };
                // How far ahead: from the service's own word (AWS), else from the Date headers
                // of its answers (at most about 1 s more).
                let ahead_of_service_ms =
                    timestamp.and_then(|t| service.or_else(|| self.source.service_now_lower()).map(|s| t - s));
                if repeated {
                    tracing::debug!(stream = %self.stream, shard = %shard, ?timestamp, next_attempt_in = ?delay,
                        "start timestamp still later than the Kinesis service's clock; retrying");
                } else {
                    tracing::warn!(stream = %self.stream, shard = %shard, ?timestamp, ?ahead_of_service_ms, next_attempt_in = ?delay,
                        "{e}. The clock the timestamp was taken from (this worker's, for LATEST) is likely ahead of the \
                         Kinesis service's clock: check NTP/chrony on the workers. Retrying until the service's clock \
                         passes the timestamp; nothing that arrives at or after it is skipped");
                }
                delay
            }
            k if k.needs_operator() => {
                // Doubles per attempt up to the cap; jitter only below it, so the cap holds.
                let step = b.fatal_next.min(self.fatal_max_backoff);
                b.fatal_next = (step * 2).min(self.fatal_max_backoff);
                let delay = step.mul_f64(0.8 + 0.2 * crate::random::unit_f64());
                tracing::error!(stream = %self.stream, shard = %shard, kind = %kind, next_attempt_in = ?delay,
                    "{}", fatal_message(&self.stream, shard, e));
                delay
            }
            _ => {
                let delay = b.transient.next().unwrap_or(self.call_max_backoff);
                tracing::warn!(stream = %self.stream, shard = %shard, ?delay, error = %e, "reading the shard failed; backing off");
                delay
            }
        };
        self.set_status(shard, |s| {
            s.last_error = Some(if kind.needs_operator() {
                format!(
                    "not retryable ({kind}) since {}: {}",
                    DateTime::from_millis(since).fmt(DateTimeFormat::DateTime).unwrap_or_else(|_| since.to_string()),
                    fatal_message(&self.stream, shard, e)
                )
            } else {
                e.to_string()
            });
            s.error_kind = Some(kind);
            s.retryable = Some(!kind.needs_operator());
            s.error_since_ms = Some(since);
            s.count_error(kind);
        });
        tokio::select! {
            _ = cancel.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }
}

/// Resuming from a checkpoint: its record is read again (AT_SEQUENCE_NUMBER), and the user
/// records at or below it are skipped.
pub(super) fn resume_skip(start: &CheckpointPosition) -> Option<SeqKey> {
    match start {
        CheckpointPosition::AfterSequence { sequence, sub_sequence } => {
            Some(SeqKey(Arc::from(sequence.as_str()), *sub_sequence))
        }
        _ => None,
    }
}

/// The ERROR message of an error retrying cannot fix: the shard, the error (which names the
/// stream and the fix) and what to do about this shard.
fn fatal_message(stream: &str, shard: &str, e: &KinesisError) -> String {
    let what = match e.kind() {
        ErrorKind::NotFound => format!(
            ". If shard {shard} or stream {stream:?} was deleted: recreate the stream, and if it was \
             recreated, rewind the topology's checkpoints with `squall checkpoints reset`"
        ),
        ErrorKind::InvalidArgument => format!(
            ". Check the spout configuration (records_per_get) and the checkpoint of shard {shard} \
             (`squall checkpoints reset` rewinds it)"
        ),
        _ => String::new(),
    };
    format!("reading shard {shard} of stream {stream:?} failed and retrying cannot fix it: {e}{what}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(queued: usize, queued_bytes: usize) -> Room {
        Room { queued, queued_bytes }
    }

    #[test]
    fn limit_is_sized_to_the_room_left_in_records_and_bytes() {
        let mb = 1 << 20;
        let mut est = SizeEstimate::default();
        // Nothing known yet: a cautious first read.
        assert_eq!(get_limit(10_000, mb, room(0, 0), &est), (mb / INITIAL_RECORD_SIZE_GUESS) as i32);
        // 1 KB records: about 1 MB worth.
        est.observe(100 * (1024 + RECORD_OVERHEAD), 100);
        est.observe(700 * (1024 + RECORD_OVERHEAD), 700);
        let avg = est.average();
        assert!((1024 + RECORD_OVERHEAD..1024 + RECORD_OVERHEAD + 64).contains(&avg), "{avg}");
        let l = get_limit(10_000, mb, room(0, 0), &est) as usize;
        assert!(l * (1024 + RECORD_OVERHEAD) <= mb && l >= 800, "{l}");
        // Half full: half the room.
        let half = get_limit(10_000, mb, room(400, mb / 2), &est) as usize;
        assert!(half * (1024 + RECORD_OVERHEAD) <= mb / 2 + 1024 && half >= 400, "{half}");
        // Tiny records: records_per_get caps, counting what is queued.
        let mut tiny = SizeEstimate::default();
        for _ in 0..10 {
            tiny.observe(1000 * RECORD_OVERHEAD, 1000);
        }
        assert_eq!(get_limit(10_000, 64 * mb, room(0, 0), &tiny), 10_000);
        assert_eq!(get_limit(10_000, 64 * mb, room(2_500, 0), &tiny), 7_500);
        // A full queue still reads one record (the caller only asks when there is room).
        assert_eq!(get_limit(10_000, mb, room(0, 2 * mb), &est), 1);
    }

    /// Calls as fast as `pacer` lets a reader that takes 10 ms per call, for 10 s of virtual
    /// time; `full(i)` says whether call `i` found a backlog.
    fn paced_calls(max: u32, full: impl Fn(usize) -> bool) -> Vec<Instant> {
        let t0 = Instant::now();
        let mut pacer = CallPacer::new(max);
        let (mut now, mut starts) = (t0, Vec::new());
        while now < t0 + Duration::from_secs(10) {
            if let Some(at) = pacer.wait_until(now) {
                assert!(at > now);
                now = at;
            }
            pacer.called(now);
            pacer.read(!full(starts.len()));
            starts.push(now);
            now += Duration::from_millis(10);
        }
        starts
    }

    fn max_in_a_second(starts: &[Instant]) -> usize {
        (0..starts.len())
            .map(|i| starts[i..].iter().take_while(|t| **t < starts[i] + Duration::from_secs(1)).count())
            .max()
            .unwrap_or(0)
    }

    #[test]
    fn calls_never_exceed_the_limit_catch_up_at_full_rate_and_are_spread_at_the_tip() {
        for max in 1..=5u32 {
            let gap = Duration::from_millis(1_020 / u64::from(max));
            // catching up (every call full): bursts while the window has room, never more than
            // `max` in any second, and the whole budget used
            let backlog = paced_calls(max, |_| true);
            assert!(max_in_a_second(&backlog) <= max as usize, "max {max}: over the limit catching up");
            assert!(backlog.len() as f64 / 10.0 > f64::from(max) * 0.95, "max {max}: budget unused catching up");
            // at the tip (no call full): evenly spaced, never a burst
            let tip = paced_calls(max, |_| false);
            assert!(tip.windows(2).all(|w| w[1] - w[0] >= gap), "max {max}: calls at the tip closer than {gap:?}");
            assert!(max_in_a_second(&tip) <= max as usize);
            assert!(tip.len() as f64 / 10.0 > f64::from(max) * 0.95, "max {max}: budget unused at the tip");
            // mixed: still within the limit
            let mixed = paced_calls(max, |i| i % 3 == 0);
            assert!(max_in_a_second(&mixed) <= max as usize, "max {max}: over the limit, mixed");
        }
        // after a call at the tip the next waits the spacing; after a full one it goes at once
        let t0 = Instant::now();
        let mut pacer = CallPacer::new(5);
        assert_eq!(pacer.wait_until(t0), None, "the first call goes at once");
        pacer.called(t0);
        pacer.read(true);
        assert_eq!(pacer.wait_until(t0 + Duration::from_millis(100)), Some(t0 + Duration::from_millis(204)));
        assert_eq!(pacer.wait_until(t0 + Duration::from_millis(300)), None);
        pacer.read(false);
        assert_eq!(pacer.wait_until(t0 + Duration::from_millis(10)), None, "a backlog is read at once");
    }

    #[test]
    fn a_call_reserves_its_expected_size_of_the_read_budget() {
        let mut est = SizeEstimate::default();
        est.observe(1000 * 1200, 1000);
        let avg = est.average();
        assert_eq!(read_reservation_kib(800, &est, 8192) as usize, (800 * avg).div_ceil(1024));
        assert_eq!(read_reservation_kib(10_000, &est, 8192), 8192, "at most the whole budget");
        assert_eq!(read_reservation_kib(0, &est, 8192), 2, "at least one record");
        assert_eq!(read_reservation_kib(10, &est, 0), 1);
    }

    #[tokio::test]
    async fn the_read_budget_limits_the_bytes_fetched_at_once() {
        let mut est = SizeEstimate::default();
        est.observe(1000 * 1024, 1000);
        // Room for four calls of about 1 MiB (1024 records of ~1 KB): a fifth waits.
        let kib = read_reservation_kib(1024, &est, u32::MAX);
        assert!((1024..1100).contains(&kib), "{kib}");
        let budget = Arc::new(Semaphore::new(4 * kib as usize + 10));
        let mut held: Vec<_> = (0..4).map(|_| budget.clone().try_acquire_many_owned(kib).expect("room")).collect();
        assert!(budget.clone().try_acquire_many_owned(kib).is_err(), "a fifth waits");
        held.pop();
        assert!(budget.clone().try_acquire_many_owned(kib).is_ok(), "until one call is done");
    }

    #[test]
    fn the_reader_fetches_only_while_the_queue_is_at_most_half_full() {
        let mb = 1 << 20;
        assert!(has_room(1000, mb, room(0, 5 * mb)), "an empty queue always has room");
        assert!(has_room(1000, mb, room(500, mb / 2)));
        assert!(!has_room(1000, mb, room(501, 1000)));
        assert!(!has_room(1000, mb, room(10, mb / 2 + 1)));
        assert!(!has_room(1, mb, room(1, 10)));
    }

    #[test]
    fn the_estimate_follows_recent_reads() {
        let mut est = SizeEstimate::default();
        est.observe(10 * 100_000, 10);
        assert!(est.average() > 90_000);
        for _ in 0..8 {
            est.observe(1000 * 1200, 1000);
        }
        assert!(est.average() < 1300, "{}", est.average());
    }

    #[test]
    fn fatal_messages_name_the_shard_and_the_fix() {
        let e = KinesisError::classify("GetRecords", "clicks", "http://x", "ResourceNotFoundException", "gone".into());
        let m = fatal_message("clicks", "shardId-000000000001", &e);
        assert!(m.contains("shardId-000000000001") && m.contains("squall checkpoints reset"), "{m}");
        let e = KinesisError::classify("GetRecords", "clicks", "http://x", "AccessDeniedException", "no".into());
        let m = fatal_message("clicks", "shardId-000000000001", &e);
        assert!(m.contains("shardId-000000000001") && m.contains("kinesis:GetRecords"), "{m}");
    }
}
