//! Enhanced fan-out (EFO): the spout as a registered stream consumer, reading each owned shard
//! through a SubscribeToShard event stream instead of GetRecords calls.
//!
//! - Registration ([`register`]), once per worker and stream (the worker's spout tasks share it,
//!   [`super::SpoutShared`]): DescribeStreamSummary (the stream's ARN), DescribeStreamConsumer
//!   first, RegisterStreamConsumer only when the consumer is missing (AWS allows about 5 a
//!   second per account: a rollout of many workers spends one), then DescribeStreamConsumer until
//!   it is ACTIVE, within `efo.register_timeout_ms`. LimitExceeded, ResourceInUse (registered
//!   meanwhile, or the stream is not ACTIVE during a reshard) and a consumer being deleted are
//!   waited out and retried; the error names the consumer, the stream and the fix.
//! - A consumer deregistered under a running worker: SubscribeToShard refuses its ARN
//!   (ResourceNotFound on AWS, as for a deleted stream); the reader registers it again (one
//!   reader does it, the others take its new ARN; counted as `reregistered` in the shard's EFO
//!   status) and subscribes on, unless the stream itself is gone.
//! - One subscription per owned shard (`ReaderCtx::run_efo`), starting where polling would:
//!   the checkpoint (AT_SEQUENCE_NUMBER, skipping the user records of a KPL aggregate at or
//!   below it), TRIM_HORIZON or AT_TIMESTAMP. Each event's records go through the same
//!   de-aggregation, fencing check, tracker queue and read log as polled records.
//! - Renewal: when a subscription ends (Kinesis ends each after 5 minutes; `efo.renew_after_ms`
//!   ends it earlier), after an error, or when the silence watchdog fires (no event for
//!   `efo.silence_timeout_ms`, 35 s by default: Kinesis sends an event, empty or not, every few
//!   seconds), the next subscription starts AFTER_SEQUENCE_NUMBER of the continuation sequence
//!   of the last event handed on. ResourceInUse on SubscribeToShard (the previous subscription,
//!   here or in another worker, is still live) is retried after a capped back-off with jitter.
//! - Backpressure: events are pulled from the stream only while the shard's queue has room
//!   (the polling reader's rule: at most half full, in records and bytes). The HTTP/2 flow
//!   control then holds Kinesis back; the watchdog counts only time spent waiting for an event.
//!   While fetching is not allowed (deactivated, draining, ZooKeeper session unconfirmed) the
//!   subscription is dropped, and an event that arrives while the leases cannot be trusted is
//!   dropped and read again by the next subscription (from the last continuation handed on).
//! - Shard end: an event with ChildShards or without a continuation sequence (AWS). An emulator
//!   that sends neither (kinesis-local: ChildShards always empty, continuation always set) is
//!   covered by a fallback: when an empty event shows the reader caught up and ListShards (at
//!   most once per `efo.end_check_interval_ms` per task) says the shard is closed, the reader
//!   finishes the shard with the polling loop from the last continuation, whose null
//!   NextShardIterator is the shard-end path polling already has.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_kinesis::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_kinesis::primitives::DateTime;
use aws_sdk_kinesis::types::{ShardIteratorType, StartingPosition, SubscribeToShardEventStream};
use futures::StreamExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::config::EfoSettings;
use super::deagg;
use super::reader::{ReaderCtx, ReaderEvent, Room, has_room};
use super::source::{
    ConsumerDescription, ConsumerStatus, ShardEvent, ShardEvents, ShardSource, StartAt, SubscribeError, record_from_sdk,
};
use super::tracker::SeqKey;
use crate::coord::CheckpointPosition;
use crate::kinesis::{ErrorKind, KinesisError};

/// Registering the stream consumer failed; the message names the consumer, the stream and the fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EfoError {
    /// A call of the registration failed.
    #[error(
        "enhanced fan-out: cannot register the stream consumer {consumer:?} of stream {stream:?} at {endpoint}: \
         {source}. Check that the stream exists and that the credentials allow kinesis:DescribeStreamSummary, \
         kinesis:RegisterStreamConsumer and kinesis:DescribeStreamConsumer (a stream has at most 20 consumers), \
         or read by polling (--consumer polling)"
    )]
    Register {
        /// The consumer name.
        consumer: String,
        /// The stream.
        stream: String,
        /// The Kinesis endpoint.
        endpoint: String,
        /// The failed call.
        source: KinesisError,
    },
    /// The consumer did not become ACTIVE in time (or is being deleted).
    #[error(
        "enhanced fan-out: the stream consumer {consumer:?} of stream {stream:?} at {endpoint} is {status} \
         after waiting {waited_ms} ms, not ACTIVE. {fix}"
    )]
    NotActive {
        /// The consumer name.
        consumer: String,
        /// The stream.
        stream: String,
        /// The Kinesis endpoint.
        endpoint: String,
        /// Its last status.
        status: String,
        /// How long the spout waited.
        waited_ms: u64,
        /// What to do.
        fix: &'static str,
    },
}

const FIX_SLOW: &str = "Start the worker again (registration continues where it was), raise \
    efo.register_timeout_ms in the spout config, or read by polling (--consumer polling)";
const FIX_DELETING: &str = "It is being deleted: wait until DescribeStreamConsumer no longer finds it and \
    start again (it is then registered anew), or choose another name with --consumer efo:NAME";

/// A registered, ACTIVE stream consumer and the readers' shared EFO state. One per worker,
/// stream and consumer (the worker's spout tasks share it: [`super::SpoutShared`]).
#[derive(Debug)]
pub(crate) struct EfoCtx {
    pub consumer: String,
    /// The consumer's ARN; a new one after the consumer was deregistered and registered again.
    consumer_arn: Mutex<String>,
    stream_arn: String,
    settings: EfoSettings,
    silence: Duration,
    renew_after: Option<Duration>,
    end_check: Duration,
    /// Closed shards, from the last ListShards (closed is for ever), and when it was called
    /// (monotonic, and wall ms since the epoch).
    closed: tokio::sync::Mutex<(Option<Instant>, HashSet<Arc<str>>, i64)>,
    /// Held by the reader that registers the consumer again (the others wait for its ARN).
    reregistering: tokio::sync::Mutex<()>,
}

/// Makes sure the stream consumer `name` of the source's stream exists and is ACTIVE
/// (registering it when missing) and returns its context (see the module docs). Call it once
/// per worker and stream ([`super::SpoutShared::efo`]): RegisterStreamConsumer is limited to a
/// few calls per second per account.
pub(crate) async fn register(source: &ShardSource, name: &str, settings: &EfoSettings) -> Result<EfoCtx, EfoError> {
    let (endpoint, stream) = source.names();
    let fail = |source: KinesisError| EfoError::Register {
        consumer: name.into(),
        stream: stream.into(),
        endpoint: endpoint.into(),
        source,
    };
    let started = Instant::now();
    let deadline = started + Duration::from_millis(settings.register_timeout_ms);
    let mut delay = Duration::from_millis(100);
    // Throttles and transport errors are retried until the deadline; the rest fail at once.
    let stream_arn = loop {
        match source.stream_arn().await {
            Ok(arn) => break arn,
            Err(e) if !retried(&e) || Instant::now() >= deadline => return Err(fail(e)),
            Err(_) => {}
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    };
    let arn = ensure_active(source, name, &stream_arn, started, deadline).await?;
    Ok(EfoCtx {
        consumer: name.into(),
        consumer_arn: Mutex::new(arn),
        stream_arn,
        settings: settings.clone(),
        silence: Duration::from_millis(settings.silence_timeout_ms),
        renew_after: settings.renew_after_ms.map(Duration::from_millis),
        end_check: Duration::from_millis(settings.end_check_interval_ms),
        closed: tokio::sync::Mutex::default(),
        reregistering: tokio::sync::Mutex::default(),
    })
}

/// Whether a registration call's error is retried until the deadline: throttles (the
/// account's registration rate) and transport errors.
fn retried(e: &KinesisError) -> bool {
    matches!(e.kind(), ErrorKind::Throttled | ErrorKind::Transient)
}

/// Describes the consumer first and registers it only when it is missing (a rollout of many
/// workers costs one RegisterStreamConsumer, not one per task); waits until it is ACTIVE.
/// Retried until `deadline`: throttles (LimitExceeded: the account's registration rate),
/// ResourceInUse (the consumer is being created, or the stream is not ACTIVE: a reshard in
/// progress), a consumer being deleted (registered anew once it is gone) and transport errors.
/// Returns the consumer's ARN.
async fn ensure_active(
    source: &ShardSource,
    name: &str,
    stream_arn: &str,
    started: Instant,
    deadline: Instant,
) -> Result<String, EfoError> {
    let (endpoint, stream) = source.names();
    let fail = |source: KinesisError| EfoError::Register {
        consumer: name.into(),
        stream: stream.into(),
        endpoint: endpoint.into(),
        source,
    };
    let mut delay = Duration::from_millis(100);
    let mut deleting_seen = false;
    loop {
        let status = match source.describe_consumer(stream_arn, name).await {
            Ok(Some(c)) if c.status == ConsumerStatus::Active => {
                tracing::info!(stream = %stream, consumer = %name, arn = %c.arn, "stream consumer ACTIVE");
                return Ok(c.arn);
            }
            Ok(Some(c)) => {
                deleting_seen |= c.status == ConsumerStatus::Deleting;
                c.status.as_str().to_string()
            }
            Ok(None) => match source.register_consumer(stream_arn, name).await {
                Ok(true) => {
                    tracing::info!(stream = %stream, consumer = %name, "registered the stream consumer");
                    "registered".to_string()
                }
                // registered meanwhile by another worker, or the stream is not ACTIVE
                Ok(false) => "in use (registered meanwhile, or the stream is being resharded)".to_string(),
                Err(e) if !retried(&e) => return Err(fail(e)),
                Err(e) => {
                    tracing::info!(stream = %stream, consumer = %name, error = %e, "registering the stream consumer was refused for now; retrying");
                    format!("not registered yet ({e})")
                }
            },
            Err(e) if !retried(&e) => return Err(fail(e)),
            Err(e) => format!("unknown ({e})"),
        };
        if Instant::now() >= deadline {
            let fix = if deleting_seen { FIX_DELETING } else { FIX_SLOW };
            return Err(EfoError::NotActive {
                consumer: name.into(),
                stream: stream.into(),
                endpoint: endpoint.into(),
                status,
                waited_ms: started.elapsed().as_millis() as u64,
                fix,
            });
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

/// The enhanced fan-out calls, through the SDK or a [`super::ShardApi`].
impl ShardSource {
    /// The endpoint and the stream, to name in errors.
    fn names(&self) -> (&str, &str) {
        match self {
            ShardSource::Kinesis { endpoint, stream, .. } => (endpoint, stream),
            ShardSource::Api { stream, .. } => (super::source::API_PREFIX, stream),
        }
    }

    /// DescribeStreamSummary: the stream's ARN.
    async fn stream_arn(&self) -> Result<String, KinesisError> {
        let (client, endpoint, stream) = match self {
            ShardSource::Kinesis { client, endpoint, stream } => (client, endpoint, stream),
            ShardSource::Api { api, stream } => return api.stream_arn(stream).await,
        };
        let out = client
            .describe_stream_summary()
            .stream_name(stream)
            .send()
            .await
            .map_err(|e| KinesisError::from_sdk("DescribeStreamSummary", stream, endpoint, e))?;
        out.stream_description_summary
            .map(|s| s.stream_arn)
            .ok_or_else(|| KinesisError::StreamNotFound { stream: stream.clone(), endpoint: endpoint.clone() })
    }

    /// DescribeStreamConsumer: `None` when the consumer is missing.
    async fn describe_consumer(
        &self,
        stream_arn: &str,
        name: &str,
    ) -> Result<Option<ConsumerDescription>, KinesisError> {
        let (client, endpoint, stream) = match self {
            ShardSource::Kinesis { client, endpoint, stream } => (client, endpoint, stream),
            ShardSource::Api { api, stream } => return api.describe_consumer(stream, stream_arn, name).await,
        };
        match client.describe_stream_consumer().stream_arn(stream_arn).consumer_name(name).send().await {
            Ok(out) => Ok(out.consumer_description.map(|c| ConsumerDescription {
                arn: c.consumer_arn,
                status: match c.consumer_status {
                    aws_sdk_kinesis::types::ConsumerStatus::Active => ConsumerStatus::Active,
                    aws_sdk_kinesis::types::ConsumerStatus::Deleting => ConsumerStatus::Deleting,
                    _ => ConsumerStatus::Creating,
                },
            })),
            Err(e) if e.code() == Some("ResourceNotFoundException") => Ok(None),
            Err(e) => Err(KinesisError::from_sdk("DescribeStreamConsumer", stream, endpoint, e)),
        }
    }

    /// RegisterStreamConsumer: `false` on ResourceInUse.
    async fn register_consumer(&self, stream_arn: &str, name: &str) -> Result<bool, KinesisError> {
        let (client, endpoint, stream) = match self {
            ShardSource::Kinesis { client, endpoint, stream } => (client, endpoint, stream),
            ShardSource::Api { api, stream } => return api.register_consumer(stream, stream_arn, name).await,
        };
        match client.register_stream_consumer().stream_arn(stream_arn).consumer_name(name).send().await {
            Ok(_) => Ok(true),
            Err(e) if e.code() == Some("ResourceInUseException") => Ok(false),
            Err(e) => Err(KinesisError::from_sdk("RegisterStreamConsumer", stream, endpoint, e)),
        }
    }

    /// SubscribeToShard (the SDK's event stream as [`ShardEvents`]); an error of an AT_TIMESTAMP
    /// start names its timestamp.
    async fn subscribe(
        &self,
        consumer_arn: &str,
        shard: &Arc<str>,
        from: StartAt<'_>,
    ) -> Result<ShardEvents, SubscribeError> {
        let r = match self {
            ShardSource::Kinesis { client, endpoint, stream } => {
                subscribe_sdk(client, endpoint, stream, consumer_arn, shard, from).await
            }
            ShardSource::Api { api, stream } => api.subscribe(stream, consumer_arn, shard, from).await,
        };
        r.map_err(|mut e| {
            if let StartAt::Checkpoint(CheckpointPosition::AtTimestamp { millis }) = from {
                e.error = e.error.with_start_timestamp(*millis);
            }
            e
        })
    }
}

/// SubscribeToShard through the SDK.
async fn subscribe_sdk(
    client: &aws_sdk_kinesis::Client,
    endpoint: &str,
    stream: &str,
    consumer_arn: &str,
    shard: &Arc<str>,
    from: StartAt<'_>,
) -> Result<ShardEvents, SubscribeError> {
    let pos = StartingPosition::builder();
    let pos = match from {
        StartAt::Checkpoint(CheckpointPosition::TrimHorizon) => pos.r#type(ShardIteratorType::TrimHorizon),
        StartAt::Checkpoint(CheckpointPosition::AtTimestamp { millis }) => {
            pos.r#type(ShardIteratorType::AtTimestamp).timestamp(DateTime::from_millis(*millis))
        }
        StartAt::Checkpoint(CheckpointPosition::AfterSequence { sequence, .. }) => {
            pos.r#type(ShardIteratorType::AtSequenceNumber).sequence_number(sequence)
        }
        StartAt::AfterFetched(sequence) => pos.r#type(ShardIteratorType::AfterSequenceNumber).sequence_number(sequence),
    };
    let pos = pos.build().map_err(|e| SubscribeError {
        error: KinesisError::Config { field: "starting position".into(), reason: e.to_string() },
        in_use: false,
    })?;
    let out = client
        .subscribe_to_shard()
        .consumer_arn(consumer_arn)
        .shard_id(shard.as_ref())
        .starting_position(pos)
        .send()
        .await
        .map_err(|e| classify("SubscribeToShard", stream, endpoint, e, |e| e.is_resource_in_use_exception()))?;
    let (shard, stream, endpoint) = (shard.clone(), stream.to_string(), endpoint.to_string());
    let events = futures::stream::unfold(Some(out), move |rx| {
        let (shard, stream, endpoint) = (shard.clone(), stream.clone(), endpoint.clone());
        async move {
            let mut rx = rx?;
            loop {
                match rx.event_stream.recv().await {
                    Ok(Some(SubscribeToShardEventStream::SubscribeToShardEvent(ev))) => {
                        let event = ShardEvent {
                            records: ev.records.into_iter().map(|r| record_from_sdk(&shard, r)).collect(),
                            continuation: ev.continuation_sequence_number,
                            millis_behind_latest: ev.millis_behind_latest,
                            children: ev.child_shards.unwrap_or_default().into_iter().map(|c| c.shard_id).collect(),
                        };
                        return Some((Ok(event), Some(rx)));
                    }
                    Ok(Some(_)) => continue,
                    Ok(None) => return None,
                    Err(e) => {
                        let e =
                            classify("SubscribeToShard", &stream, &endpoint, e, |e| e.is_resource_in_use_exception());
                        return Some((Err(e), None));
                    }
                }
            }
        }
    });
    Ok(events.boxed())
}

/// Where a shard's reading stands, carried from one subscription to the next.
struct Position<'a> {
    /// User records at or below this are skipped (a resume inside a KPL aggregate).
    skip: &'a mut Option<SeqKey>,
    /// The continuation sequence of the last event handed on.
    resume: &'a mut Option<String>,
    /// The last Kinesis record handed on.
    last_fetched: &'a mut Option<Arc<str>>,
    /// Set when the subscription delivered an event.
    delivered: &'a mut bool,
    /// Whether an earlier subscription of this ownership delivered an event (the next one
    /// that does is a renewal).
    opened_before: &'a mut bool,
}

/// Why a subscription ended.
#[derive(Debug)]
enum Ended {
    /// Kinesis ended it (every 5 minutes on AWS).
    ByKinesis,
    /// `efo.renew_after_ms` passed.
    Renew,
    /// No event for `efo.silence_timeout_ms`.
    Silent,
    /// Fetching is not allowed now (deactivated, draining, session unconfirmed).
    Paused,
    /// An event arrived while the leases could not be trusted: dropped, read again.
    Dropped,
    /// An error (`true`: ResourceInUse).
    Error(KinesisError, bool),
    /// The shard's end (children named by Kinesis, if any).
    ShardEnd(Vec<String>),
    /// An empty event while caught up, and ListShards says the shard is closed.
    Closed,
    /// Cancelled, or the ownership ended.
    Gone,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An SDK error as a `KinesisError`, and whether it is ResourceInUse (`typed`: the modeled
/// error says so; an error inside the event stream carries no code of its own).
/// Whether a SubscribeToShard error may mean that the consumer was deregistered: AWS answers
/// ResourceNotFound (as for a deleted stream), kinesis-local InvalidArgument naming the
/// consumer's ARN "not found".
fn consumer_maybe_gone(e: &KinesisError) -> bool {
    match e {
        KinesisError::StreamNotFound { .. } => true,
        KinesisError::Refused { message, .. } | KinesisError::Service { message, .. } => {
            let m = message.to_ascii_lowercase();
            m.contains("consumer") && m.contains("not found")
        }
        _ => false,
    }
}

fn classify<E, R>(
    op: &'static str,
    stream: &str,
    endpoint: &str,
    e: SdkError<E, R>,
    typed: impl Fn(&E) -> bool,
) -> SubscribeError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    let in_use = e.code() == Some("ResourceInUseException") || e.as_service_error().is_some_and(typed);
    SubscribeError { error: KinesisError::from_sdk(op, stream, endpoint, e), in_use }
}

impl EfoCtx {
    /// The consumer's current ARN.
    pub(crate) fn consumer_arn(&self) -> String {
        self.consumer_arn.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The consumer `stale` (an ARN SubscribeToShard did not find) was deregistered: makes sure
    /// it exists and is ACTIVE again (registering it), once for every reader that found it gone.
    async fn reregister(&self, source: &ShardSource, stale: &str) -> Result<(), EfoError> {
        let _one = self.reregistering.lock().await;
        if self.consumer_arn() != stale {
            return Ok(()); // another reader did it
        }
        let started = Instant::now();
        let deadline = started + Duration::from_millis(self.settings.register_timeout_ms);
        let arn = ensure_active(source, &self.consumer, &self.stream_arn, started, deadline).await?;
        *self.consumer_arn.lock().unwrap_or_else(|p| p.into_inner()) = arn;
        Ok(())
    }

    /// Whether ListShards says `shard` is open: `Some(t)`, open as of the listing started at
    /// wall time `t` (ms), `None` when closed (cached; listed at most once per
    /// `end_check_interval_ms`).
    async fn open_as_of(&self, source: &ShardSource, shard: &Arc<str>) -> Result<Option<i64>, KinesisError> {
        let mut c = self.closed.lock().await;
        if c.1.contains(shard) {
            return Ok(None);
        }
        if c.0.is_some_and(|t| t.elapsed() < self.end_check) {
            return Ok(Some(c.2));
        }
        let started = crate::coord::now_ms();
        let shards = source.list_shards().await?;
        c.0 = Some(Instant::now());
        c.2 = started;
        c.1.extend(shards.into_iter().filter(|d| d.closed).map(|d| Arc::from(d.shard_id.as_str())));
        Ok((!c.1.contains(shard)).then_some(started))
    }
}

impl ReaderCtx {
    /// What the shard's queue holds, `None` when the ownership ended.
    fn room(&self, shard: &str, epoch: u64) -> Option<Room> {
        let t = lock(&self.tracker);
        match t.get(shard) {
            Some(tr) if tr.epoch == epoch => Some(Room { queued: tr.queued.len(), queued_bytes: tr.queued.bytes() }),
            _ => None,
        }
    }

    /// Waits until the queue has room; `Err(Ended::Paused)` as soon as fetching is not allowed.
    async fn wait_efo_room(&self, shard: &str, epoch: u64, cancel: &CancellationToken) -> Result<(), Ended> {
        let mut allowed = self.fetch_allowed.clone();
        loop {
            let Some(room) = self.room(shard, epoch) else { return Err(Ended::Gone) };
            if !*allowed.borrow_and_update() {
                return Err(Ended::Paused);
            }
            if has_room(self.records_per_get, self.max_queued_bytes, room) {
                return Ok(());
            }
            tokio::select! {
                _ = cancel.cancelled() => return Err(Ended::Gone),
                _ = self.space.notified() => {}
                // (a closed channel would answer at once: the sleep paces the loop then)
                _ = allowed.changed(), if allowed.has_changed().is_ok() => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    }

    /// Reads one shard by enhanced fan-out until its end or cancellation (see the module docs).
    pub(super) async fn run_efo(
        self: Arc<Self>,
        efo: Arc<EfoCtx>,
        shard: Arc<str>,
        epoch: u64,
        start: CheckpointPosition,
        mut skip: Option<SeqKey>,
        cancel: CancellationToken,
    ) {
        self.set_status(&shard, |s| s.efo_reader = true);
        let mut backoffs = self.backoffs();
        // The continuation sequence of the last event handed on: where the next subscription
        // starts (after it). `None` until an event was handed on: then the checkpoint.
        let mut resume: Option<String> = None;
        // The last Kinesis record handed on (for the read log's end entry).
        let mut last_fetched: Option<Arc<str>> = None;
        let mut opened_before = false;
        loop {
            // Subscribe only while fetching is allowed and the queue has room.
            match self.wait_efo_room(&shard, epoch, &cancel).await {
                Ok(()) => {}
                Err(Ended::Paused) => {
                    // A clone starts at the version the reader's own receiver saw (never marked
                    // seen: it is only borrowed), so `changed` would answer at once for any change
                    // since: mark the current value seen, or a paused reader spins (found by the
                    // simulator, seed 3: simulated time stopped, a CPU busy while deactivated).
                    let mut allowed = self.fetch_allowed.clone();
                    if !*allowed.borrow_and_update() {
                        tokio::select! {
                            _ = cancel.cancelled() => return,
                            // (a closed channel would answer at once: the sleep paces the loop then)
                            _ = allowed.changed(), if allowed.has_changed().is_ok() => {}
                            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                        }
                    }
                    continue;
                }
                Err(_) => return,
            }
            let from = match &resume {
                Some(c) => StartAt::AfterFetched(c),
                None => StartAt::Checkpoint(&start),
            };
            let arn = efo.consumer_arn();
            let sub = tokio::select! {
                _ = cancel.cancelled() => return,
                r = self.source.subscribe(&arn, &shard, from) => r,
            };
            let ended = match sub {
                Err(SubscribeError { error, in_use }) => Ended::Error(error, in_use),
                Ok(mut rx) => {
                    tracing::debug!(stream = %self.stream, shard = %shard, consumer = %efo.consumer, ?from,
                        renewal = opened_before, "subscribing to the shard");
                    let mut delivered = false;
                    let pos = Position {
                        skip: &mut skip,
                        resume: &mut resume,
                        last_fetched: &mut last_fetched,
                        delivered: &mut delivered,
                        opened_before: &mut opened_before,
                    };
                    let ended = self.read_subscription(&efo, &mut rx, &shard, epoch, pos, &cancel).await;
                    if delivered {
                        // The back-off starts again after a subscription that worked.
                        backoffs = self.backoffs();
                    }
                    // Dropping the receiver closes the subscription.
                    drop(rx);
                    ended
                }
            };
            match ended {
                Ended::Gone => return,
                Ended::ByKinesis => {
                    tracing::debug!(stream = %self.stream, shard = %shard, "Kinesis ended the subscription: renewing it")
                }
                Ended::Renew => tracing::debug!(stream = %self.stream, shard = %shard, "renewing the subscription"),
                Ended::Silent => {
                    self.set_status(&shard, |s| s.efo_watchdog += 1);
                    tracing::warn!(stream = %self.stream, shard = %shard, consumer = %efo.consumer, silence = ?efo.silence,
                        "no event on the subscription for the silence timeout: subscribing again");
                }
                Ended::Paused => {}
                Ended::Dropped => {
                    // The leases are not confirmed yet: give the session a moment before the
                    // next subscription reads the dropped event again.
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    }
                }
                Ended::Error(e, true) => {
                    self.set_status(&shard, |s| s.efo_in_use += 1);
                    let delay = backoffs.transient.next().unwrap_or(self.call_max_backoff);
                    tracing::info!(stream = %self.stream, shard = %shard, consumer = %efo.consumer, ?delay, error = %e,
                        "another subscription to the shard is still live (ResourceInUse): retrying after a back-off");
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
                Ended::Error(e, false) if consumer_maybe_gone(&e) => {
                    // SubscribeToShard says ResourceNotFound for a consumer that was deregistered
                    // as for a deleted stream (kinesis-local: InvalidArgument "ConsumerARN ... not
                    // found"): register it again, unless the stream is gone.
                    let again = tokio::select! {
                        _ = cancel.cancelled() => return,
                        r = efo.reregister(&self.source, &arn) => r,
                    };
                    match again {
                        Ok(()) => {
                            self.set_status(&shard, |s| s.efo_reregistered += 1);
                            tracing::warn!(stream = %self.stream, shard = %shard, consumer = %efo.consumer,
                                "the stream consumer was gone (deregistered): it is registered again; subscribing anew");
                        }
                        Err(re) => {
                            tracing::debug!(stream = %self.stream, consumer = %efo.consumer, error = %re, "registering the consumer again failed");
                            if !self.on_error(&shard, &e, &mut backoffs, &cancel).await {
                                return;
                            }
                        }
                    }
                }
                Ended::Error(e, false) => {
                    if !self.on_error(&shard, &e, &mut backoffs, &cancel).await {
                        return;
                    }
                }
                Ended::ShardEnd(children) => {
                    tracing::info!(stream = %self.stream, shard = %shard, ?children, "read to the end of the shard (enhanced fan-out)");
                    self.read_log.end(&lock(&self.task), &shard, last_fetched.as_deref());
                    lock(&self.tracker).mark_ended(&shard, epoch, self.source.watermark_now());
                    self.wakeup.notify();
                    let _ = self.events.send(ReaderEvent::Ended { shard: shard.clone(), epoch, children });
                    return;
                }
                Ended::Closed => {
                    // Polled after the last record handed on (or from the ownership's start when
                    // none was), not after the continuation: a continuation sequence need not be
                    // a record's, and GetShardIterator may refuse one that names no record of the
                    // shard (the model does, as for any such sequence; found by the simulator,
                    // seed 4637: an empty shard closed by a merge, its fallback refused for ever,
                    // its children never read). Whatever lies between is records the events had
                    // not carried yet.
                    tracing::info!(stream = %self.stream, shard = %shard, after = ?last_fetched,
                        "the shard is closed and no event names its end: finishing it by polling to its end");
                    self.poll(shard, epoch, &start, skip, last_fetched, cancel).await;
                    return;
                }
            }
        }
    }

    /// Hands on the events of one subscription until it ends.
    async fn read_subscription(
        &self,
        efo: &EfoCtx,
        rx: &mut ShardEvents,
        shard: &Arc<str>,
        epoch: u64,
        pos: Position<'_>,
        cancel: &CancellationToken,
    ) -> Ended {
        let Position { skip, resume, last_fetched, delivered, opened_before } = pos;
        let mut first = true;
        let renew_at = efo.renew_after.map(|d| Instant::now() + d);
        loop {
            // Backpressure: the next event is pulled only when the queue has room.
            if let Err(ended) = self.wait_efo_room(shard, epoch, cancel).await {
                return ended;
            }
            let next = tokio::select! {
                _ = cancel.cancelled() => return Ended::Gone,
                _ = tokio::time::sleep_until(renew_at.unwrap_or_else(Instant::now)), if renew_at.is_some() => {
                    return Ended::Renew;
                }
                _ = tokio::time::sleep(efo.silence) => return Ended::Silent,
                r = rx.next() => r,
            };
            let ev = match next {
                Some(Ok(ev)) => ev,
                None => return Ended::ByKinesis,
                Some(Err(SubscribeError { error, in_use })) => return Ended::Error(error, in_use),
            };
            // A subscription counts once Kinesis sent its first event (kinesis-local refuses a
            // second subscription inside the event stream, not in the response).
            let renewal = std::mem::replace(opened_before, true);
            *delivered = true;
            self.set_status(shard, |s| {
                s.efo_events += 1;
                if std::mem::take(&mut first) {
                    s.efo_subscriptions += 1;
                    s.efo_resubscriptions += u64::from(renewal);
                }
            });
            // Fencing: hand nothing on unless the leases can be trusted right now. The event is
            // read again by the next subscription (after the last continuation handed on).
            if !self.leases_trusted() || !*self.fetch_allowed.borrow() {
                return Ended::Dropped;
            }
            let ShardEvent { records, continuation, millis_behind_latest: behind, children } = ev;
            let n = records.len();
            let bytes: usize = records.iter().map(|r| r.data.len()).sum();
            let range = if deagg::any_aggregate(&records) {
                match self.hash_range(shard).await {
                    Ok(r) => r,
                    Err(e) => return Ended::Error(e, false),
                }
            } else {
                None
            };
            if let Some(last) = records.last() {
                *last_fetched = Some(last.sequence.clone());
            }
            let (records, counts) = deagg::split(&self.stream, records, range, self.kpl_out_of_range, skip);
            self.stats.kpl.add(&counts, &self.stream, shard);
            self.set_status(shard, |s| {
                s.millis_behind_latest = Some(behind);
                s.clear_error();
                s.records_read += n as u64;
                s.bytes_read += bytes as u64;
            });
            if let (Some(first), Some(last)) = (records.first(), records.last()) {
                let (first, last, users) = (first.sequence.clone(), last.sequence.clone(), records.len());
                let live = lock(&self.tracker).enqueue(shard, epoch, records);
                if !live || cancel.is_cancelled() {
                    return Ended::Gone;
                }
                self.read_log.records(&lock(&self.task), shard, &first, &last, users);
                self.wakeup.notify();
            }
            // AWS ends a shard with ChildShards and no continuation sequence.
            if continuation.is_empty() || !children.is_empty() {
                return Ended::ShardEnd(children);
            }
            *resume = Some(continuation);
            if n == 0 && behind == 0 {
                // Caught up as of now, but an emulator that never names the end keeps sending
                // such events after a split: what is known is the shard open as of the last
                // listing. The idle rule (caught-up time minus the idle timeout) must not pass
                // the split, after which records arrive in the children, which nothing holds
                // until they are assigned: so the caught-up time is capped at that listing.
                let now = self.source.watermark_now();
                match efo.open_as_of(&self.source, shard).await {
                    Ok(None) => return Ended::Closed,
                    Ok(Some(listed)) => lock(&self.tracker).mark_caught_up(shard, epoch, now.min(listed)),
                    Err(e) => {
                        tracing::debug!(stream = %self.stream, shard = %shard, error = %e,
                            "ListShards failed (checking whether the shard is closed); checking again later")
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_errors_name_the_consumer_the_stream_and_the_fix() {
        let e = EfoError::NotActive {
            consumer: "app".into(),
            stream: "clicks".into(),
            endpoint: "http://127.0.0.1:4566".into(),
            status: "CREATING".into(),
            waited_ms: 60_000,
            fix: FIX_SLOW,
        };
        let m = e.to_string();
        assert!(m.contains("\"app\"") && m.contains("\"clicks\"") && m.contains("efo.register_timeout_ms"), "{m}");
        let e = EfoError::Register {
            consumer: "app".into(),
            stream: "clicks".into(),
            endpoint: "http://x".into(),
            source: KinesisError::StreamNotFound { stream: "clicks".into(), endpoint: "http://x".into() },
        };
        let m = e.to_string();
        assert!(m.contains("kinesis:RegisterStreamConsumer") && m.contains("--consumer polling"), "{m}");
    }
}
