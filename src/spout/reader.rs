//! One GetRecords loop per owned shard.
//!
//! - Starts from the shard's checkpoint (TRIM_HORIZON, AT_TIMESTAMP, AFTER_SEQUENCE_NUMBER).
//! - At most `max_gets_per_second` GetRecords calls in any one second (Kinesis allows 5 per shard),
//!   `idle_poll_interval` after an empty read, capped exponential back-off with jitter after a
//!   throttle or a transient error.
//! - After ExpiredIteratorException: a new iterator AFTER_SEQUENCE_NUMBER of the last record it
//!   fetched (or the start position if it fetched none), so nothing is fetched twice.
//! - Shard end is a null NextShardIterator (never a comparison with EndingSequenceNumber, which
//!   the emulator returns as a sentinel): the end is marked in the tracker after the last records
//!   and the coordinator is told at once.
//! - Backpressure: it fetches only while the shard's queue of unemitted records is below one batch,
//!   and only while fetching is allowed (topology active, ZooKeeper session healthy).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::DateTime;
use aws_sdk_kinesis::types::ShardIteratorType;
use backon::BackoffBuilder;
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::ShardStatus;
use super::readlog::ReadLog;
use super::tracker::{Record, Tracker};
use crate::coord::CheckpointPosition;
use crate::kinesis::KinesisError;

/// Tells the coordinator something about a shard.
#[derive(Debug)]
pub(crate) enum ReaderEvent {
    /// The reader reached the shard's end (children named by Kinesis, if any).
    Ended { shard: Arc<str>, epoch: u64, children: Vec<String> },
}

pub(crate) struct ReaderCtx {
    pub client: Client,
    pub endpoint: String,
    pub stream: String,
    /// The task's ZooKeeper node name (for the read log).
    pub task: Arc<Mutex<String>>,
    pub records_per_get: i32,
    pub max_gets_per_second: u32,
    pub idle_poll_interval: Duration,
    pub call_min_backoff: Duration,
    pub call_max_backoff: Duration,
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
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ReaderCtx {
    async fn iterator(&self, shard: &str, pos: &CheckpointPosition) -> Result<String, KinesisError> {
        let mut req = self.client.get_shard_iterator().stream_name(&self.stream).shard_id(shard);
        req = match pos {
            CheckpointPosition::TrimHorizon => req.shard_iterator_type(ShardIteratorType::TrimHorizon),
            CheckpointPosition::AtTimestamp { millis } => {
                req.shard_iterator_type(ShardIteratorType::AtTimestamp).timestamp(DateTime::from_millis(*millis))
            }
            CheckpointPosition::AfterSequence { sequence, .. } => {
                req.shard_iterator_type(ShardIteratorType::AfterSequenceNumber).starting_sequence_number(sequence)
            }
        };
        let out = req
            .send()
            .await
            .map_err(|e| KinesisError::from_sdk("GetShardIterator", &self.stream, &self.endpoint, e))?;
        out.shard_iterator.ok_or_else(|| KinesisError::Service {
            op: "GetShardIterator",
            stream: self.stream.clone(),
            endpoint: self.endpoint.clone(),
            message: format!("no iterator returned for shard {shard}"),
        })
    }

    fn set_status(&self, shard: &Arc<str>, f: impl FnOnce(&mut ShardStatus)) {
        let mut s = lock(&self.status);
        f(s.entry(shard.clone()).or_default());
    }

    /// Waits until the shard's queue has room and fetching is allowed. False when cancelled.
    async fn wait_room(&self, shard: &str, epoch: u64, cancel: &CancellationToken) -> bool {
        let mut allowed = self.fetch_allowed.clone();
        loop {
            let room = {
                let t = lock(&self.tracker);
                match t.get(shard) {
                    Some(tr) if tr.epoch == epoch => tr.queued.len() < self.records_per_get.max(1) as usize,
                    _ => return false,
                }
            };
            if room && *allowed.borrow() {
                return true;
            }
            tokio::select! {
                _ = cancel.cancelled() => return false,
                _ = self.space.notified() => {}
                _ = allowed.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    }

    /// Reads one shard until its end or cancellation.
    pub async fn run(
        self: Arc<Self>,
        shard: Arc<str>,
        epoch: u64,
        start: CheckpointPosition,
        cancel: CancellationToken,
    ) {
        let backoff = || {
            backon::ExponentialBuilder::default()
                .with_min_delay(self.call_min_backoff)
                .with_max_delay(self.call_max_backoff)
                .with_jitter()
                .without_max_times()
                .build()
        };
        let mut delays = backoff();
        let mut last_fetched: Option<Arc<str>> = None;
        let mut iterator: Option<String> = None;
        // Start times of the recent GetRecords calls: a sliding one-second window.
        let mut calls: VecDeque<Instant> = VecDeque::with_capacity(self.max_gets_per_second as usize + 1);
        loop {
            if !self.wait_room(&shard, epoch, &cancel).await {
                return;
            }
            if calls.len() >= self.max_gets_per_second as usize {
                if let Some(oldest) = calls.pop_front() {
                    let free_at = oldest + Duration::from_millis(1_020);
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep_until(free_at.into()) => {}
                    }
                }
            }
            let it = match &iterator {
                Some(it) => it.clone(),
                None => {
                    let pos = match &last_fetched {
                        Some(seq) => CheckpointPosition::AfterSequence { sequence: seq.to_string(), sub_sequence: 0 },
                        None => start.clone(),
                    };
                    let res = tokio::select! {
                        _ = cancel.cancelled() => return,
                        r = self.iterator(&shard, &pos) => r,
                    };
                    match res {
                        Ok(it) => it,
                        Err(e) => {
                            if self.on_error(&shard, &e, &mut delays, &cancel).await {
                                continue;
                            }
                            return;
                        }
                    }
                }
            };
            calls.push_back(Instant::now());
            // Cancellation drops the call in flight: after a release nothing more is fetched.
            let res = tokio::select! {
                _ = cancel.cancelled() => return,
                r = self.client.get_records().shard_iterator(&it).limit(self.records_per_get).send() => r,
            };
            let out = match res {
                Ok(out) => out,
                Err(e) => {
                    let e = KinesisError::from_sdk("GetRecords", &self.stream, &self.endpoint, e);
                    iterator = None; // a fresh iterator after any error; expired ones in particular
                    if self.on_error(&shard, &e, &mut delays, &cancel).await {
                        continue;
                    }
                    return;
                }
            };
            delays = backoff();
            // Hand nothing on unless the leases can be trusted right now: a worker that was paused
            // (and may have lost its session meanwhile) drops a batch that arrived after the pause
            // and reads it again once its session is confirmed.
            if !self.liveness.trusted() || !*self.fetch_allowed.borrow() {
                iterator = Some(it);
                continue;
            }
            let records: Vec<Record> = out
                .records()
                .iter()
                .map(|r| Record {
                    shard_id: shard.clone(),
                    sequence: r.sequence_number().into(),
                    sub_sequence: 0,
                    partition_key: r.partition_key().into(),
                    arrival_ms: r.approximate_arrival_timestamp().and_then(|t| t.to_millis().ok()).unwrap_or(0),
                    data: bytes::Bytes::copy_from_slice(r.data().as_ref()),
                })
                .collect();
            let n = records.len();
            let behind = out.millis_behind_latest();
            self.set_status(&shard, |s| {
                s.millis_behind_latest = behind;
                s.last_error = None;
                s.records_read += n as u64;
            });
            if let (Some(first), Some(last)) = (records.first(), records.last()) {
                last_fetched = Some(last.sequence.clone());
                let (first, last) = (first.sequence.clone(), last.sequence.clone());
                let live = lock(&self.tracker).enqueue(&shard, epoch, records);
                if !live || cancel.is_cancelled() {
                    return;
                }
                self.read_log.records(&lock(&self.task), &shard, &first, &last, n);
                self.wakeup.notify();
            }
            match out.next_shard_iterator() {
                Some(next) => iterator = Some(next.to_string()),
                None => {
                    let children: Vec<String> = out.child_shards().iter().map(|c| c.shard_id().to_string()).collect();
                    tracing::info!(stream = %self.stream, shard = %shard, ?children, "read to the end of the shard");
                    self.read_log.end(&lock(&self.task), &shard, last_fetched.as_deref());
                    lock(&self.tracker).mark_ended(&shard, epoch);
                    self.wakeup.notify();
                    let _ = self.events.send(ReaderEvent::Ended { shard: shard.clone(), epoch, children });
                    return;
                }
            }
            if n == 0 {
                if behind.is_none_or(|b| b == 0) {
                    lock(&self.tracker).mark_caught_up(&shard, epoch, crate::coord::now_ms());
                }
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(self.idle_poll_interval) => {}
                }
            }
        }
    }

    /// Backs off after an error; false when cancelled.
    async fn on_error(
        &self,
        shard: &Arc<str>,
        e: &KinesisError,
        delays: &mut backon::ExponentialBackoff,
        cancel: &CancellationToken,
    ) -> bool {
        let delay = delays.next().unwrap_or(self.call_max_backoff);
        match e {
            KinesisError::IteratorExpired { .. } => {
                tracing::info!(stream = %self.stream, shard = %shard, "shard iterator expired; getting a new one after the last fetched record");
            }
            KinesisError::Throttled { .. } => {
                tracing::debug!(stream = %self.stream, shard = %shard, ?delay, "throttled; backing off");
            }
            other => {
                tracing::warn!(stream = %self.stream, shard = %shard, ?delay, error = %other, "reading the shard failed; backing off");
            }
        }
        self.set_status(shard, |s| {
            s.last_error = Some(e.to_string());
            s.errors += 1;
        });
        let delay = if matches!(e, KinesisError::IteratorExpired { .. }) { Duration::ZERO } else { delay };
        tokio::select! {
            _ = cancel.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }
}
