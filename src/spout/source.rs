//! Where shards and records come from: the Kinesis API (production), or a [`ShardApi`] reached
//! by a `sim://` endpoint: the generated stream of the coordination benchmark (below), or a model
//! of Kinesis registered by the simulator (`tests/sim/`, [`register_shard_api`]) as
//! `sim://api/NAME`. The spout's readers and coordinator are the same code either way.
//!
//! The simulated stream (`--endpoint sim://shards=N,rate=R,bytes=B,epoch_ms=E`) is a
//! COORDINATION-ONLY harness: N open shards, record `k` of each shard arrives at `E + k * 1000 / R`
//! ms, with shard-ordered sequence numbers, iterators, `Limit`, MillisBehindLatest and a creation
//! time, all a pure function of the parameters and the clock, so every worker process sees the same
//! stream. It has no resharding, throttling or failures, and it never proves correctness.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::DateTime;
use aws_sdk_kinesis::types::ShardIteratorType;
use bytes::Bytes;
use tracing::{info, warn};

use super::tracker::Record;
use crate::coord::{CheckpointPosition, now_ms};
use crate::kinesis::{self, KinesisError, ShardDescription};
use crate::sink::{PutEntryError, SinkRecord, TransmitCheck};

/// One GetRecords answer, as the reader needs it.
#[derive(Debug)]
pub struct Batch {
    pub records: Vec<Record>,
    /// `None` at the shard's end.
    pub next_iterator: Option<String>,
    pub millis_behind_latest: Option<i64>,
    /// The children named at the shard's end.
    pub children: Vec<String>,
}

/// Where a shard iterator starts.
#[derive(Debug, Clone, Copy)]
pub enum StartAt<'a> {
    /// A stored checkpoint. `AfterSequence { sequence, .. }` starts AT that sequence: the
    /// checkpoint may stop in the middle of a KPL aggregate, so its record is read again and the
    /// reader skips the user records at or below the checkpoint (as KCL does). For a plain record
    /// that costs one record read again per shard taken.
    Checkpoint(&'a CheckpointPosition),
    /// After a Kinesis record this reader already fetched whole (a new iterator after an expired
    /// one), or after an enhanced fan-out event's continuation sequence (the next subscription):
    /// AFTER_SEQUENCE_NUMBER.
    AfterFetched(&'a str),
}

/// A stream consumer of enhanced fan-out, as DescribeStreamConsumer tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerDescription {
    /// Its ARN (a new one each time it is registered).
    pub arn: String,
    /// Its status.
    pub status: ConsumerStatus,
}

/// The status of a stream consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumerStatus {
    /// Registered, not usable yet.
    Creating,
    /// Usable by SubscribeToShard.
    Active,
    /// Being deregistered.
    Deleting,
}

impl ConsumerStatus {
    /// The status as Kinesis spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ConsumerStatus::Creating => "CREATING",
            ConsumerStatus::Active => "ACTIVE",
            ConsumerStatus::Deleting => "DELETING",
        }
    }
}

/// One SubscribeToShardEvent, as the enhanced fan-out reader needs it.
#[derive(Debug)]
pub struct ShardEvent {
    /// The records (KPL aggregates not split yet).
    pub records: Vec<Record>,
    /// Where the next subscription starts (AFTER_SEQUENCE_NUMBER); empty at the shard's end.
    pub continuation: String,
    /// How far the event is behind the shard's newest record.
    pub millis_behind_latest: i64,
    /// The children named at the shard's end.
    pub children: Vec<String>,
}

/// A failed SubscribeToShard: the call, or an error inside its event stream.
#[derive(Debug)]
pub struct SubscribeError {
    /// What failed.
    pub error: KinesisError,
    /// Whether it is ResourceInUse (another subscription to the shard by the consumer is live,
    /// or took this one over).
    pub in_use: bool,
}

/// The events of one subscription, in order; the stream ends when Kinesis ends the
/// subscription (every 5 minutes on AWS).
pub type ShardEvents = futures::stream::BoxStream<'static, Result<ShardEvent, SubscribeError>>;

fn no_fan_out(stream: &str) -> KinesisError {
    KinesisError::Config {
        field: "consumer".into(),
        reason: format!(
            "the source of stream {stream} (a sim:// endpoint) has no enhanced fan-out: read by polling (--consumer polling)"
        ),
    }
}

/// The shard-level calls the spout makes (ListShards, DescribeStreamSummary's creation time,
/// GetShardIterator, GetRecords), for a source not reached through the AWS SDK. Errors are the
/// ones the SDK path maps its answers to ([`KinesisError`]), so the reader treats both alike.
pub trait ShardApi: Send + Sync + fmt::Debug + 'static {
    /// Every shard of `stream`, open and closed, sorted by id.
    fn list_shards<'a>(&'a self, stream: &'a str) -> BoxFuture<'a, Result<Vec<ShardDescription>, KinesisError>>;
    /// The stream's creation time.
    fn created_ms<'a>(&'a self, stream: &'a str) -> BoxFuture<'a, Result<Option<i64>, KinesisError>>;
    /// A shard iterator at `pos`.
    fn shard_iterator<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        pos: StartAt<'a>,
    ) -> BoxFuture<'a, Result<String, KinesisError>>;
    /// One GetRecords call of at most `limit` records.
    fn get_records<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a Arc<str>,
        iterator: &'a str,
        limit: i32,
    ) -> BoxFuture<'a, Result<Batch, KinesisError>>;
    /// A lower bound of the service's clock now, as the `Date` headers of its answers tell
    /// ([`kinesis::clock`]); `None` when it does not say.
    fn service_now_lower(&self) -> Option<i64> {
        None
    }
    /// One PutRecords call into `stream` (the write path of [`crate::sink::KinesisSink`] and of
    /// the stage writers): per record, in request order, `None` when it was written, else its
    /// error code and message; or the error of the whole call. `check`, when given, is asked
    /// right before the request is transmitted (after any delay on the way): false means the
    /// request must not be sent, and the call fails. The default refuses: a source that is only
    /// read (the coordination benchmark's generated stream).
    fn put_records<'a>(
        &'a self,
        stream: &'a str,
        records: Vec<SinkRecord>,
        check: Option<TransmitCheck>,
    ) -> BoxFuture<'a, Result<Vec<Option<PutEntryError>>, KinesisError>> {
        let _ = (records, check);
        Box::pin(async move { Err(read_only("PutRecords", stream)) })
    }
    /// CreateStream with `shards` shards (an intermediate stream on a stage's first start). The
    /// default refuses, as [`ShardApi::put_records`] does.
    fn create_stream<'a>(&'a self, stream: &'a str, shards: i32) -> BoxFuture<'a, Result<(), KinesisError>> {
        let _ = shards;
        Box::pin(async move { Err(read_only("CreateStream", stream)) })
    }
    /// Enhanced fan-out: the stream's ARN (DescribeStreamSummary). The default refuses: a
    /// source without enhanced fan-out (the coordination benchmark's generated stream).
    fn stream_arn<'a>(&'a self, stream: &'a str) -> BoxFuture<'a, Result<String, KinesisError>> {
        Box::pin(async move { Err(no_fan_out(stream)) })
    }
    /// DescribeStreamConsumer: `None` when the stream has no consumer `name` (ResourceNotFound).
    fn describe_consumer<'a>(
        &'a self,
        stream: &'a str,
        stream_arn: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ConsumerDescription>, KinesisError>> {
        let _ = (stream_arn, name);
        Box::pin(async move { Err(no_fan_out(stream)) })
    }
    /// RegisterStreamConsumer: `true` when registered, `false` on ResourceInUse (registered
    /// meanwhile, or the stream is not ACTIVE).
    fn register_consumer<'a>(
        &'a self,
        stream: &'a str,
        stream_arn: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<bool, KinesisError>> {
        let _ = (stream_arn, name);
        Box::pin(async move { Err(no_fan_out(stream)) })
    }
    /// SubscribeToShard at `pos` (a checkpoint starts AT its sequence, as
    /// [`ShardApi::shard_iterator`] does) for the consumer `consumer_arn`.
    fn subscribe<'a>(
        &'a self,
        stream: &'a str,
        consumer_arn: &'a str,
        shard: &'a Arc<str>,
        pos: StartAt<'a>,
    ) -> BoxFuture<'a, Result<ShardEvents, SubscribeError>> {
        let _ = (consumer_arn, shard, pos);
        Box::pin(async move { Err(SubscribeError { error: no_fan_out(stream), in_use: false }) })
    }
}

fn read_only(op: &'static str, stream: &str) -> KinesisError {
    KinesisError::Refused {
        op,
        stream: stream.to_string(),
        message: "this sim:// source is read-only (the coordination benchmark's generated stream); write to a \
                  Kinesis endpoint or a registered model"
            .into(),
    }
}

fn apis() -> &'static Mutex<BTreeMap<String, Arc<dyn ShardApi>>> {
    static APIS: OnceLock<Mutex<BTreeMap<String, Arc<dyn ShardApi>>>> = OnceLock::new();
    APIS.get_or_init(Default::default)
}

/// The prefix of endpoints that name a registered [`ShardApi`]: `sim://api/NAME`.
pub const API_PREFIX: &str = "sim://api/";

/// Makes the endpoint `sim://api/NAME` read through `api` (the simulator's model of Kinesis).
pub fn register_shard_api(name: &str, api: Arc<dyn ShardApi>) {
    apis().lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_string(), api);
}

/// Forgets `sim://api/NAME`.
pub fn unregister_shard_api(name: &str) {
    apis().lock().unwrap_or_else(|p| p.into_inner()).remove(name);
}

/// The [`ShardApi`] an endpoint names, if it is `sim://api/NAME`: `None` for any other endpoint,
/// an error naming the endpoint when nothing is registered under `NAME`.
pub(crate) fn registered_api(endpoint: &str) -> Option<Result<Arc<dyn ShardApi>, KinesisError>> {
    let name = endpoint.strip_prefix(API_PREFIX)?;
    Some(apis().lock().unwrap_or_else(|p| p.into_inner()).get(name).cloned().ok_or_else(|| KinesisError::Config {
        field: "endpoint".into(),
        reason: format!("{endpoint} names no registered Kinesis model (only the simulator registers them)"),
    }))
}

/// The shard-level API the spout needs.
#[derive(Clone, Debug)]
pub(crate) enum ShardSource {
    /// The real API (AWS, LocalStack, kinesis-local).
    Kinesis { client: Client, endpoint: String, stream: String },
    /// A [`ShardApi`]: the coordination benchmark's generated stream or a registered model.
    Api { api: Arc<dyn ShardApi>, stream: String },
}

impl ShardSource {
    /// The source an endpoint names: `sim://api/NAME` (registered), `sim://...` (generated), or a
    /// Kinesis client.
    pub async fn for_endpoint(ep: &kinesis::KinesisEndpoint, stream: &str) -> Result<Self, KinesisError> {
        if let Some(api) = registered_api(&ep.endpoint) {
            return Ok(ShardSource::Api { api: api?, stream: stream.to_string() });
        }
        if let Some(spec) = ep.endpoint.strip_prefix(SIM_SCHEME) {
            return Ok(ShardSource::Api { api: Arc::new(SimStream::parse(spec)?), stream: stream.to_string() });
        }
        Ok(ShardSource::Kinesis { client: ep.client().await?, endpoint: ep.label(), stream: stream.to_string() })
    }

    /// Every shard of the stream, open and closed, sorted by id.
    pub async fn list_shards(&self) -> Result<Vec<ShardDescription>, KinesisError> {
        match self {
            ShardSource::Kinesis { client, endpoint, stream } => kinesis::list_shards(client, endpoint, stream).await,
            ShardSource::Api { api, stream } => api.list_shards(stream).await,
        }
    }

    /// A lower bound of the Kinesis service's clock now, from the Date headers of its answers
    /// (see [`kinesis::clock`]); `None` for the simulated stream or before any answer.
    pub fn service_now_lower(&self) -> Option<i64> {
        match self {
            ShardSource::Kinesis { endpoint, .. } => kinesis::clock::service_now_lower(endpoint),
            ShardSource::Api { api, .. } => api.service_now_lower(),
        }
    }

    /// "Now" for watermarks: arrival times are the service's clock, so an idle shard's watermark
    /// (the time of its last caught-up read minus the idle timeout) must not run ahead of it. This
    /// worker's clock, capped at the service's clock as far as its answers' `Date` headers tell
    /// (their lower bound plus the header's 1 s resolution): a worker clock ahead of the service's
    /// by more than that would otherwise pass records the service stamps after an idle spell.
    pub fn watermark_now(&self) -> i64 {
        let now = crate::coord::now_ms();
        match self.service_now_lower() {
            Some(lower) => now.min(lower.saturating_add(kinesis::clock::DATE_RESOLUTION_MS)),
            None => now,
        }
    }

    /// Sharpens the bound of the Kinesis service's clock ([`kinesis::clock`]) from its `Date`
    /// header's 1 s to about 50 ms: one small call (ListShards of one shard) every 50 ms for a
    /// little over a second, so one answer comes soon after the service's clock ticked to a new
    /// second. About 23 calls; for the rare case that needs it (LATEST when this worker's clock is
    /// off).
    pub async fn sharpen_service_clock(&self) {
        for _ in 0..23 {
            match self {
                ShardSource::Kinesis { client, stream, .. } => {
                    let _ = client.list_shards().stream_name(stream).max_results(1).send().await;
                }
                ShardSource::Api { api, stream } if api.service_now_lower().is_some() => {
                    let _ = api.list_shards(stream).await;
                }
                ShardSource::Api { .. } => return,
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The stream's creation time (to notice a stream re-created under the same name).
    pub async fn created_ms(&self) -> Result<Option<i64>, KinesisError> {
        match self {
            ShardSource::Kinesis { client, endpoint, stream } => {
                kinesis::stream_created_ms(client, endpoint, stream).await
            }
            ShardSource::Api { api, stream } => api.created_ms(stream).await,
        }
    }

    /// A shard iterator at `pos`.
    pub async fn shard_iterator(&self, shard: &str, pos: StartAt<'_>) -> Result<String, KinesisError> {
        let (client, endpoint, stream) = match self {
            ShardSource::Kinesis { client, endpoint, stream } => (client, endpoint, stream),
            ShardSource::Api { api, stream } => return api.shard_iterator(stream, shard, pos).await,
        };
        let mut req = client.get_shard_iterator().stream_name(stream).shard_id(shard);
        req = match pos {
            StartAt::Checkpoint(CheckpointPosition::TrimHorizon) => {
                req.shard_iterator_type(ShardIteratorType::TrimHorizon)
            }
            StartAt::Checkpoint(CheckpointPosition::AtTimestamp { millis }) => {
                req.shard_iterator_type(ShardIteratorType::AtTimestamp).timestamp(DateTime::from_millis(*millis))
            }
            StartAt::Checkpoint(CheckpointPosition::AfterSequence { sequence, .. }) => {
                req.shard_iterator_type(ShardIteratorType::AtSequenceNumber).starting_sequence_number(sequence)
            }
            StartAt::AfterFetched(sequence) => {
                req.shard_iterator_type(ShardIteratorType::AfterSequenceNumber).starting_sequence_number(sequence)
            }
        };
        let out = req.send().await.map_err(|e| {
            let e = KinesisError::from_sdk("GetShardIterator", stream, endpoint, e);
            match pos {
                StartAt::Checkpoint(CheckpointPosition::AtTimestamp { millis }) => e.with_start_timestamp(*millis),
                _ => e,
            }
        })?;
        out.shard_iterator.ok_or_else(|| KinesisError::Service {
            op: "GetShardIterator",
            stream: stream.clone(),
            endpoint: endpoint.clone(),
            message: format!("no iterator returned for shard {shard}"),
        })
    }

    /// One GetRecords call of at most `limit` records.
    pub async fn get_records(&self, shard: &Arc<str>, iterator: &str, limit: i32) -> Result<Batch, KinesisError> {
        let (client, endpoint, stream) = match self {
            ShardSource::Kinesis { client, endpoint, stream } => (client, endpoint, stream),
            ShardSource::Api { api, stream } => return api.get_records(stream, shard, iterator, limit).await,
        };
        let call = client.get_records().shard_iterator(iterator).limit(limit).send();
        let out = said_if_slow(call, "GetRecords", stream, shard, endpoint)
            .await
            .map_err(|e| KinesisError::from_sdk("GetRecords", stream, endpoint, e))?;
        let children = out.child_shards.unwrap_or_default().into_iter().map(|c| c.shard_id).collect();
        let records = out.records.into_iter().map(|r| record_from_sdk(shard, r)).collect();
        Ok(Batch {
            records,
            next_iterator: out.next_shard_iterator,
            millis_behind_latest: out.millis_behind_latest,
            children,
        })
    }
}

/// How long a Kinesis call may go unanswered before the reader says so. It keeps waiting: the
/// SDK bounds each attempt at 30 s and retries a timed-out one, and a Kinesis that cannot be
/// reached (a firewall dropping packets, a partition) shows no error at all until then.
const SLOW_CALL: Duration = Duration::from_secs(5);

/// Awaits `call`; once it has gone unanswered for [`SLOW_CALL`], logs a warning naming the call,
/// stream, shard and endpoint, and when it answers at last, how long it took.
async fn said_if_slow<T>(call: impl Future<Output = T>, op: &str, stream: &str, shard: &str, endpoint: &str) -> T {
    let start = Instant::now();
    let mut call = std::pin::pin!(call);
    tokio::select! {
        biased;
        out = &mut call => return out,
        _ = tokio::time::sleep(SLOW_CALL) => {}
    }
    warn!(
        stream,
        shard,
        endpoint,
        "{op} has not answered for {} s; still waiting (each attempt is bounded at 30 s, then retried): \
         is Kinesis reachable from this host?",
        SLOW_CALL.as_secs()
    );
    let out = call.await;
    info!(stream, shard, endpoint, took_ms = start.elapsed().as_millis() as u64, "{op} answered after a slow wait");
    out
}

/// A record of shard `shard` as the SDK returned it (GetRecords or a SubscribeToShard event).
pub(crate) fn record_from_sdk(shard: &Arc<str>, r: aws_sdk_kinesis::types::Record) -> Record {
    Record {
        shard_id: shard.clone(),
        arrival_ms: r.approximate_arrival_timestamp.and_then(|t| t.to_millis().ok()).unwrap_or(0),
        sequence: r.sequence_number.into(),
        // De-aggregated (and given sub-sequences) by the reader.
        sub_sequence: 0,
        partition_key: r.partition_key.into(),
        // Takes the decoded buffer as it is: no second copy of every payload.
        data: Bytes::from(r.data.into_inner()),
    }
}

/// The scheme of simulated endpoints.
pub const SIM_SCHEME: &str = "sim://";

/// The simulated stream of the coordination benchmark (see the module docs).
#[derive(Debug)]
pub(crate) struct SimStream {
    shards: usize,
    /// Records per second per shard.
    rate: f64,
    epoch_ms: i64,
    payload: Bytes,
}

impl SimStream {
    /// Parses `shards=N,rate=R,bytes=B,epoch_ms=E` (every key optional but `shards`).
    pub fn parse(spec: &str) -> Result<Self, KinesisError> {
        let bad = |reason: String| KinesisError::Config { field: "endpoint".into(), reason };
        let (mut shards, mut rate, mut bytes, mut epoch_ms) = (None, 1.0f64, 100usize, 0i64);
        for kv in spec.split(',').filter(|s| !s.is_empty()) {
            let (k, v) =
                kv.split_once('=').ok_or_else(|| bad(format!("{kv:?} in {SIM_SCHEME}{spec} is not key=value")))?;
            let num = |v: &str| v.parse::<f64>().map_err(|_| bad(format!("{k}={v:?} is not a number")));
            match k {
                "shards" => shards = Some(num(v)? as usize),
                "rate" => rate = num(v)?,
                "bytes" => bytes = num(v)? as usize,
                "epoch_ms" => epoch_ms = num(v)? as i64,
                other => {
                    return Err(bad(format!(
                        "unknown key {other:?} in {SIM_SCHEME}{spec}; use shards, rate, bytes, epoch_ms"
                    )));
                }
            }
        }
        let shards = shards.filter(|n| (1..=100_000).contains(n)).ok_or_else(|| {
            bad(format!("{SIM_SCHEME}{spec} needs shards=N (1..=100000), e.g. {SIM_SCHEME}shards=1000,rate=1"))
        })?;
        if !(rate > 0.0 && rate <= 1000.0) {
            return Err(bad(format!("rate={rate} must be in (0, 1000] records per second per shard")));
        }
        Ok(Self { shards, rate, epoch_ms, payload: Bytes::from(vec![b'x'; bytes.min(1 << 20)]) })
    }

    fn shard_id(i: usize) -> String {
        format!("shardId-{i:012}")
    }

    fn index(&self, shard: &str) -> Result<usize, KinesisError> {
        shard
            .strip_prefix("shardId-")
            .and_then(|d| d.parse::<usize>().ok())
            .filter(|i| *i < self.shards)
            .ok_or_else(|| KinesisError::ShardNotFound { stream: "(simulated)".into(), shard: shard.to_string() })
    }

    fn shards(&self) -> Vec<ShardDescription> {
        let width = u128::MAX / self.shards as u128;
        (0..self.shards)
            .map(|i| {
                let start = width * i as u128;
                let end = if i + 1 == self.shards { u128::MAX } else { start + width - 1 };
                ShardDescription {
                    shard_id: Self::shard_id(i),
                    parent_shard_id: None,
                    adjacent_parent_shard_id: None,
                    starting_hash_key: start.to_string(),
                    ending_hash_key: end.to_string(),
                    starting_sequence_number: Self::sequence(i, 0),
                    closed: false,
                }
            })
            .collect()
    }

    /// Arrival time of record `k`.
    fn arrival(&self, k: u64) -> i64 {
        self.epoch_ms + (k as f64 * 1000.0 / self.rate) as i64
    }

    /// Records `0..available()` have arrived.
    fn available(&self) -> u64 {
        let elapsed = (now_ms() - self.epoch_ms).max(0) as f64;
        (elapsed * self.rate / 1000.0).floor() as u64 + 1
    }

    fn sequence(i: usize, k: u64) -> String {
        format!("4{i:06}{k:020}")
    }

    fn iterator(&self, shard: &str, pos: StartAt<'_>) -> Result<String, KinesisError> {
        let i = self.index(shard)?;
        let index = |sequence: &str| -> Result<u64, KinesisError> {
            sequence.get(7..).and_then(|d| d.parse().ok()).ok_or_else(|| KinesisError::Service {
                op: "GetShardIterator",
                stream: "(simulated)".into(),
                endpoint: SIM_SCHEME.into(),
                message: format!("{sequence} is not a sequence number of the simulated stream"),
            })
        };
        let k = match pos {
            StartAt::Checkpoint(CheckpointPosition::TrimHorizon) => 0,
            StartAt::Checkpoint(CheckpointPosition::AtTimestamp { millis }) => {
                (((millis - self.epoch_ms).max(0) as f64) * self.rate / 1000.0).ceil() as u64
            }
            StartAt::Checkpoint(CheckpointPosition::AfterSequence { sequence, .. }) => index(sequence)?,
            StartAt::AfterFetched(sequence) => index(sequence)? + 1,
        };
        Ok(format!("sim:{i}:{k}"))
    }

    fn get_records(&self, shard: &Arc<str>, iterator: &str, limit: i32) -> Result<Batch, KinesisError> {
        let invalid = || KinesisError::Service {
            op: "GetRecords",
            stream: "(simulated)".into(),
            endpoint: SIM_SCHEME.into(),
            message: format!("invalid iterator {iterator:?}"),
        };
        let mut parts = iterator.strip_prefix("sim:").ok_or_else(invalid)?.split(':');
        let i: usize = parts.next().and_then(|v| v.parse().ok()).ok_or_else(invalid)?;
        let k: u64 = parts.next().and_then(|v| v.parse().ok()).ok_or_else(invalid)?;
        let end = self.available().min(k + limit.max(1) as u64);
        let records: Vec<Record> = (k..end.max(k))
            .map(|j| Record {
                shard_id: shard.clone(),
                sequence: Self::sequence(i, j).into(),
                sub_sequence: 0,
                partition_key: format!("k{}", j % 100).into(),
                arrival_ms: self.arrival(j),
                data: self.payload.clone(),
            })
            .collect();
        let next = end.max(k);
        let behind = if next >= self.available() { 0 } else { (now_ms() - self.arrival(next)).max(0) };
        Ok(Batch {
            records,
            next_iterator: Some(format!("sim:{i}:{next}")),
            millis_behind_latest: Some(behind),
            children: Vec::new(),
        })
    }
}

impl ShardApi for SimStream {
    fn list_shards<'a>(&'a self, _stream: &'a str) -> BoxFuture<'a, Result<Vec<ShardDescription>, KinesisError>> {
        Box::pin(async move { Ok(self.shards()) })
    }
    fn created_ms<'a>(&'a self, _stream: &'a str) -> BoxFuture<'a, Result<Option<i64>, KinesisError>> {
        Box::pin(async move { Ok(Some(self.epoch_ms)) })
    }
    fn shard_iterator<'a>(
        &'a self,
        _stream: &'a str,
        shard: &'a str,
        pos: StartAt<'a>,
    ) -> BoxFuture<'a, Result<String, KinesisError>> {
        Box::pin(async move { self.iterator(shard, pos) })
    }
    fn get_records<'a>(
        &'a self,
        _stream: &'a str,
        shard: &'a Arc<str>,
        iterator: &'a str,
        limit: i32,
    ) -> BoxFuture<'a, Result<Batch, KinesisError>> {
        Box::pin(async move { SimStream::get_records(self, shard, iterator, limit) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulated_stream_follows_the_shard_model() {
        let epoch = now_ms() - 10_000;
        let sim = SimStream::parse(&format!("shards=4,rate=2,bytes=10,epoch_ms={epoch}")).unwrap();
        let shards = sim.shards();
        assert_eq!(shards.len(), 4);
        assert_eq!(shards[3].ending_hash_key, u128::MAX.to_string());
        let it = sim.iterator("shardId-000000000001", StartAt::Checkpoint(&CheckpointPosition::TrimHorizon)).unwrap();
        let shard: Arc<str> = "shardId-000000000001".into();
        let b = sim.get_records(&shard, &it, 5).unwrap();
        assert_eq!(b.records.len(), 5);
        assert!(b.millis_behind_latest.unwrap() > 0, "behind: ~20 records arrived");
        let seq = b.records[4].sequence.to_string();
        let after = sim.iterator("shardId-000000000001", StartAt::AfterFetched(&seq)).unwrap();
        let at = CheckpointPosition::AfterSequence { sequence: seq.clone(), sub_sequence: 0 };
        let again = sim.iterator("shardId-000000000001", StartAt::Checkpoint(&at)).unwrap();
        assert_eq!(
            sim.get_records(&shard, &again, 1).unwrap().records[0].sequence.as_ref(),
            seq.as_str(),
            "at the checkpoint"
        );
        assert_eq!(Some(after.clone()), b.next_iterator);
        let rest = sim.get_records(&shard, &after, 10_000).unwrap();
        assert!((14..=18).contains(&rest.records.len()), "{}", rest.records.len());
        assert_eq!(rest.millis_behind_latest, Some(0));
        assert!(crate::coord::sequence_cmp(&b.records[4].sequence, &rest.records[0].sequence).is_lt());
        assert!(SimStream::parse("rate=1").is_err());
        assert!(SimStream::parse("shards=3,colour=red").unwrap_err().to_string().contains("colour"));
    }
}
