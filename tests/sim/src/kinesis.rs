//! Kinesis for the simulated workers: the product's [`ShardApi`] over the shared model
//! ([`squall_test_support::kinesismodel`]), with latency, throttling, a listing that leaves out a
//! shard, freezes (answers in flight arrive late) and crashes; enhanced fan-out (consumers and
//! subscriptions whose events come every 100-800 ms, go silent, fail, or are taken over); and
//! the check that a child shard is read only after its parents finished.

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use squall::coord::CheckpointPosition;
use squall::kinesis::{KinesisError, ShardDescription};
use squall::sink::{PutEntryError, SinkRecord, TransmitCheck};
use squall::spout::{
    Batch, ConsumerDescription, ConsumerStatus, Record, ShardApi, ShardEvent, ShardEvents, StartAt, SubscribeError,
};
use squall::stage::codec::{self, Payload, StageRecord};
use squall::topology::Value;
use squall_test_support::kinesismodel::{IteratorType, KError, Rec, Subscription};

use crate::world::{Shared, lock, wait_network};

/// One worker's Kinesis.
#[derive(Debug)]
pub struct SimKinesis {
    pub world: Shared,
    pub worker: u32,
}

impl std::fmt::Debug for crate::world::World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("World")
    }
}

fn error(op: &'static str, stream: &str, shard: &str, e: KError, now: i64, at_ms: Option<i64>) -> KinesisError {
    match e {
        KError::ResourceNotFound(_) => KinesisError::ShardNotFound { stream: stream.into(), shard: shard.into() },
        KError::ExpiredIterator => {
            KinesisError::IteratorExpired { stream: stream.into(), message: "Iterator expired".into() }
        }
        KError::InvalidArgument(message) if at_ms.is_some() && message.contains("timestamp") => {
            KinesisError::TimestampAhead {
                op,
                stream: stream.into(),
                timestamp_ms: at_ms,
                service_ms: Some(now),
                message,
            }
        }
        KError::InvalidArgument(message) | KError::ResourceInUse(message) => {
            KinesisError::Refused { op, stream: stream.into(), message }
        }
    }
}

fn record(shard: &Arc<str>, r: Rec) -> Record {
    Record {
        shard_id: shard.clone(),
        sequence: r.sequence.into(),
        sub_sequence: 0,
        partition_key: r.partition_key.into(),
        arrival_ms: r.arrival_ms,
        data: Bytes::from(r.data),
    }
}

fn iterator_type(pos: StartAt<'_>) -> (IteratorType, Option<i64>) {
    match pos {
        StartAt::Checkpoint(CheckpointPosition::TrimHorizon) => (IteratorType::TrimHorizon, None),
        StartAt::Checkpoint(CheckpointPosition::AtTimestamp { millis }) => {
            (IteratorType::AtTimestamp(*millis), Some(*millis))
        }
        StartAt::Checkpoint(CheckpointPosition::AfterSequence { sequence, .. }) => {
            (IteratorType::AtSequence(sequence.clone()), None)
        }
        StartAt::AfterFetched(sequence) => (IteratorType::AfterSequence(sequence.to_string()), None),
    }
}

/// What a subscription's event stream carries between events.
struct Events {
    world: Shared,
    worker: u32,
    stream: String,
    shard: Arc<str>,
    sub: Subscription,
    /// Events left before it goes silent (a hung connection), if it does.
    silent_after: Option<u32>,
    /// Ended (an error was sent).
    done: bool,
}

impl Events {
    /// The next event: after 100-800 ms (AWS pushes records as they come, at least every 5 s),
    /// and the way back (a freeze holds it; a crashed worker never gets it).
    async fn next(mut self) -> Option<(Result<ShardEvent, SubscribeError>, Self)> {
        if self.done {
            return None;
        }
        if self.silent_after == Some(0) {
            // the connection hangs: nothing more, ever (the reader's watchdog must notice)
            return std::future::pending().await;
        }
        let d = lock(&self.world).rng.range(100, 800);
        tokio::time::sleep(std::time::Duration::from_millis(d)).await;
        wait_network(&self.world, self.worker).await;
        let world = self.world.clone();
        let out = {
            let mut w = lock(&world);
            let now = w.now_ms();
            w.kinesis.set_now(now);
            let p = w.faults.efo_error;
            if w.faults.on && w.rng.chance(p) {
                w.injected("efo event error");
                w.event(format!("w{} kinesis SubscribeToShard {}: event stream error", self.worker, self.shard));
                let error = KinesisError::Unreachable {
                    endpoint: "sim".into(),
                    op: "SubscribeToShard",
                    message: "InternalFailure (simulated)".into(),
                };
                self.done = true;
                drop(w);
                return Some((Err(SubscribeError { error, in_use: false }), self));
            }
            match w.kinesis.next_event(&mut self.sub, 10_000) {
                Ok(None) => {
                    w.event(format!("w{} kinesis SubscribeToShard {}: ended by Kinesis", self.worker, self.shard));
                    return None;
                }
                Ok(Some(ev)) => {
                    if !ev.records.is_empty() || ev.continuation.is_none() {
                        w.event(format!(
                            "w{} kinesis event {}/{}: {} records{}",
                            self.worker,
                            self.stream,
                            self.shard,
                            ev.records.len(),
                            if ev.continuation.is_none() { ", shard end" } else { "" }
                        ));
                    }
                    if let Some(n) = self.silent_after.as_mut() {
                        *n -= 1;
                    }
                    Ok(ShardEvent {
                        records: ev.records.into_iter().map(|r| record(&self.shard, r)).collect(),
                        continuation: ev.continuation.unwrap_or_default(),
                        millis_behind_latest: ev.millis_behind_latest,
                        children: ev.child_shards,
                    })
                }
                Err(e) => {
                    w.event(format!("w{} kinesis SubscribeToShard {}: event stream {e:?}", self.worker, self.shard));
                    self.done = true;
                    Err(subscribe_error(&self.stream, &self.shard, e, now, None))
                }
            }
        };
        Some((out, self))
    }
}

/// A SubscribeToShard error as the SDK path classifies it.
fn subscribe_error(stream: &str, shard: &str, e: KError, now: i64, at_ms: Option<i64>) -> SubscribeError {
    match e {
        KError::ResourceInUse(message) => SubscribeError {
            error: KinesisError::Refused { op: "SubscribeToShard", stream: stream.into(), message },
            in_use: true,
        },
        // AWS answers a consumer (or stream) that is gone with ResourceNotFound
        KError::ResourceNotFound(_) => SubscribeError {
            error: KinesisError::StreamNotFound { stream: stream.into(), endpoint: "sim".into() },
            in_use: false,
        },
        e => SubscribeError { error: error("SubscribeToShard", stream, shard, e, now, at_ms), in_use: false },
    }
}

impl SimKinesis {
    /// Waits the way there (latency, a freeze; never returns for a crashed worker), then whether
    /// the call is throttled.
    async fn there(&self, op: &'static str, stream: &str) -> Result<(), KinesisError> {
        let d = lock(&self.world).latency();
        tokio::time::sleep(d).await;
        wait_network(&self.world, self.worker).await;
        let mut w = lock(&self.world);
        // The answer's Date header (the service's clock, to the second), kept as the product's
        // Kinesis client keeps it (`kinesis::clock`): the largest offset of a header from the
        // worker's own clock when it came.
        let date = w.now_ms() / 1000 * 1000;
        let offset = date - squall::coord::now_ms();
        let best = w.date_offset.entry(self.worker).or_insert(offset);
        *best = (*best).max(offset);
        let p = w.faults.throttle;
        if w.faults.on && w.rng.chance(p) {
            w.injected("kinesis throttled");
            w.event(format!("w{} kinesis {op}: throttled", self.worker));
            return Err(KinesisError::Throttled {
                op,
                stream: stream.into(),
                message: "Rate exceeded for shard (simulated)".into(),
            });
        }
        Ok(())
    }

    async fn back(&self) {
        let d = lock(&self.world).latency();
        tokio::time::sleep(d).await;
        wait_network(&self.world, self.worker).await;
    }
}

fn parents_of(w: &crate::world::World, stream: &str, shard: &str) -> Vec<String> {
    w.kinesis
        .list_shards(stream)
        .unwrap_or_default()
        .into_iter()
        .find(|s| s.shard_id == shard)
        .map(|s| s.parent.into_iter().chain(s.adjacent_parent).collect())
        .unwrap_or_default()
}

impl ShardApi for SimKinesis {
    fn stream_arn<'a>(&'a self, stream: &'a str) -> BoxFuture<'a, Result<String, KinesisError>> {
        Box::pin(async move {
            self.there("DescribeStreamSummary", stream).await?;
            let r = lock(&self.world).kinesis.stream_arn(stream);
            self.back().await;
            r.map_err(|_| KinesisError::StreamNotFound { stream: stream.into(), endpoint: "sim".into() })
        })
    }

    fn describe_consumer<'a>(
        &'a self,
        stream: &'a str,
        stream_arn: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ConsumerDescription>, KinesisError>> {
        Box::pin(async move {
            self.there("DescribeStreamConsumer", stream).await?;
            let r = {
                let mut w = lock(&self.world);
                let now = w.now_ms();
                w.kinesis.set_now(now);
                let r = w.kinesis.describe_consumer(stream_arn, name);
                w.event(format!("w{} kinesis DescribeStreamConsumer {name}: {r:?}", self.worker));
                match r {
                    Ok((arn, status)) => Ok(Some(ConsumerDescription {
                        arn,
                        status: match status {
                            "ACTIVE" => ConsumerStatus::Active,
                            "DELETING" => ConsumerStatus::Deleting,
                            _ => ConsumerStatus::Creating,
                        },
                    })),
                    Err(KError::ResourceNotFound(_)) => Ok(None),
                    Err(e) => Err(error("DescribeStreamConsumer", stream, "", e, now, None)),
                }
            };
            self.back().await;
            r
        })
    }

    fn register_consumer<'a>(
        &'a self,
        stream: &'a str,
        stream_arn: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<bool, KinesisError>> {
        Box::pin(async move {
            self.there("RegisterStreamConsumer", stream).await?;
            let r = {
                let mut w = lock(&self.world);
                let now = w.now_ms();
                w.kinesis.set_now(now);
                let r = w.kinesis.register_consumer(stream_arn, name);
                w.event(format!("w{} kinesis RegisterStreamConsumer {name}: {r:?}", self.worker));
                match r {
                    Ok(_) => Ok(true),
                    Err(KError::ResourceInUse(_)) => Ok(false),
                    Err(e) => Err(error("RegisterStreamConsumer", stream, "", e, now, None)),
                }
            };
            self.back().await;
            r
        })
    }

    fn subscribe<'a>(
        &'a self,
        stream: &'a str,
        consumer_arn: &'a str,
        shard: &'a Arc<str>,
        pos: StartAt<'a>,
    ) -> BoxFuture<'a, Result<ShardEvents, SubscribeError>> {
        Box::pin(async move {
            self.there("SubscribeToShard", stream).await.map_err(|error| SubscribeError { error, in_use: false })?;
            let (kind, at_ms) = iterator_type(pos);
            let (r, lost) = {
                let mut w = lock(&self.world);
                let now = w.now_ms();
                w.kinesis.set_now(now);
                let parents = parents_of(&w, stream, shard);
                w.iterator_asked(self.worker, stream, shard, &parents);
                let r = w.kinesis.subscribe(consumer_arn, shard, kind.clone());
                let (p_silent, p_lost) = (w.faults.efo_silent, w.faults.efo_subscribe_lost);
                let silent_after = (w.faults.on && w.rng.chance(p_silent)).then(|| w.rng.range(0, 4) as u32);
                let lost = r.is_ok() && w.faults.on && w.rng.chance(p_lost);
                if silent_after.is_some() && r.is_ok() {
                    w.injected("efo subscription silent");
                }
                if lost {
                    w.injected("efo subscribe answer lost");
                }
                w.event(format!(
                    "w{} kinesis SubscribeToShard {stream}/{shard} {kind:?}: {}{}{}",
                    self.worker,
                    match &r {
                        Ok(_) => "ok".to_string(),
                        Err(e) => format!("{e:?}"),
                    },
                    if silent_after.is_some() { " (goes silent)" } else { "" },
                    if lost { " (answer lost)" } else { "" }
                ));
                let r = r.map_err(|e| subscribe_error(stream, shard, e, now, at_ms)).map(|sub| Events {
                    world: self.world.clone(),
                    worker: self.worker,
                    stream: stream.to_string(),
                    shard: shard.clone(),
                    sub,
                    silent_after,
                    done: false,
                });
                (r, lost)
            };
            self.back().await;
            if lost {
                let error = KinesisError::Unreachable {
                    endpoint: "sim".into(),
                    op: "SubscribeToShard",
                    message: "timed out (simulated: the answer was lost)".into(),
                };
                return Err(SubscribeError { error, in_use: false });
            }
            let events = r?;
            Ok(Box::pin(futures::stream::unfold(events, Events::next)) as ShardEvents)
        })
    }

    fn list_shards<'a>(&'a self, stream: &'a str) -> BoxFuture<'a, Result<Vec<ShardDescription>, KinesisError>> {
        Box::pin(async move {
            self.there("ListShards", stream).await?;
            let out = {
                let mut w = lock(&self.world);
                let now = w.now_ms();
                w.kinesis.set_now(now);
                let mut shards = w.kinesis.list_shards(stream).map_err(|e| match e {
                    KError::ResourceNotFound(_) => {
                        KinesisError::StreamNotFound { stream: stream.into(), endpoint: "sim".into() }
                    }
                    e => error("ListShards", stream, "", e, now, None),
                })?;
                let p = w.faults.listing_omits;
                if w.faults.on && shards.len() > 1 && w.rng.chance(p) {
                    let i = w.rng.below(shards.len() as u64) as usize;
                    let gone = shards.remove(i);
                    w.injected("listing omits a shard");
                    w.event(format!("w{} kinesis ListShards leaves out {}", self.worker, gone.shard_id));
                }
                w.event(format!("w{} kinesis ListShards: {} shards", self.worker, shards.len()));
                shards
                    .into_iter()
                    .map(|s| ShardDescription {
                        shard_id: s.shard_id,
                        parent_shard_id: s.parent,
                        adjacent_parent_shard_id: s.adjacent_parent,
                        starting_hash_key: s.start_hash.to_string(),
                        ending_hash_key: s.end_hash.to_string(),
                        starting_sequence_number: s.start_seq,
                        closed: s.end_seq.is_some(),
                    })
                    .collect()
            };
            self.back().await;
            Ok(out)
        })
    }

    fn put_records<'a>(
        &'a self,
        stream: &'a str,
        records: Vec<SinkRecord>,
        check: Option<TransmitCheck>,
    ) -> BoxFuture<'a, Result<Vec<Option<PutEntryError>>, KinesisError>> {
        Box::pin(async move {
            self.there("PutRecords", stream).await?;
            // transmission: after the way there (a freeze included), as the SDK's last hook
            if check.is_some_and(|c| !c()) {
                lock(&self.world)
                    .event(format!("w{} kinesis PutRecords {stream}: not sent (gate closed)", self.worker));
                return Err(KinesisError::Unreachable {
                    endpoint: "sim".into(),
                    op: "PutRecords",
                    message: "not sent: the transmit check refused".into(),
                });
            }
            let (results, lost) = {
                let mut w = lock(&self.world);
                let now = w.now_ms();
                w.kinesis.set_now(now);
                let (throttle, lose) = (w.faults.throttle, w.faults.put_lost_after);
                let mut results = Vec::with_capacity(records.len());
                let mut said = Vec::new();
                for r in &records {
                    if w.faults.on && w.rng.chance(throttle / 2.0) {
                        w.injected("kinesis put record throttled");
                        said.push(format!("{} throttled", r.partition_key));
                        results.push(Some(PutEntryError {
                            code: "ProvisionedThroughputExceededException".into(),
                            message: "Rate exceeded for shard (simulated)".into(),
                        }));
                        continue;
                    }
                    let hash = r.explicit_hash_key.as_deref().and_then(|h| h.parse::<u128>().ok());
                    match w.kinesis.put_record(stream, &r.partition_key, &r.data, hash) {
                        Ok((shard, seq)) => {
                            said.push(format!("{} -> {shard} {seq}", r.partition_key));
                            results.push(None);
                            // the first stage's records of a staged at-least-once run (`{key, n,
                            // stream}`): the order the next stage must keep
                            if let Ok(StageRecord { payload: Payload::Data(tuples), .. }) = codec::decode(&r.data, 3) {
                                for t in tuples {
                                    if let [Value::Str(k), Value::UInt(n), Value::Str(s)] = &t[..] {
                                        w.written_mid(&format!("{s}/{k}"), *n);
                                    }
                                }
                            }
                        }
                        Err(e) => {
                            said.push(format!("{} refused: {e:?}", r.partition_key));
                            results.push(Some(PutEntryError { code: e.code().into(), message: format!("{e:?}") }));
                        }
                    }
                }
                let lost = w.faults.on && w.rng.chance(lose);
                if lost {
                    w.injected("kinesis put answer lost");
                }
                w.event(format!(
                    "w{} kinesis PutRecords {stream}: {}{}",
                    self.worker,
                    said.join(", "),
                    if lost { " (answer lost)" } else { "" }
                ));
                (results, lost)
            };
            self.back().await;
            if lost {
                // applied; the caller sees a timeout
                return Err(KinesisError::Unreachable {
                    endpoint: "sim".into(),
                    op: "PutRecords",
                    message: "timed out (simulated: the answer was lost)".into(),
                });
            }
            Ok(results)
        })
    }

    fn create_stream<'a>(&'a self, stream: &'a str, shards: i32) -> BoxFuture<'a, Result<(), KinesisError>> {
        Box::pin(async move {
            self.there("CreateStream", stream).await?;
            let r = {
                let mut w = lock(&self.world);
                let r = w.kinesis.create_stream(stream, shards.max(1) as u32);
                w.event(format!("w{} kinesis CreateStream {stream} ({shards} shards): {r:?}", self.worker));
                r
            };
            self.back().await;
            r.map_err(|e| KinesisError::Refused {
                op: "CreateStream",
                stream: stream.into(),
                message: format!("{e:?}"),
            })
        })
    }

    fn service_now_lower(&self) -> Option<i64> {
        let offset = lock(&self.world).date_offset.get(&self.worker).copied()?;
        Some(squall::coord::now_ms() + offset)
    }

    fn created_ms<'a>(&'a self, _stream: &'a str) -> BoxFuture<'a, Result<Option<i64>, KinesisError>> {
        Box::pin(async move { Ok(Some(lock(&self.world).epoch_ms - 3_600_000)) })
    }

    fn shard_iterator<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        pos: StartAt<'a>,
    ) -> BoxFuture<'a, Result<String, KinesisError>> {
        Box::pin(async move {
            self.there("GetShardIterator", stream).await?;
            let (kind, at_ms) = iterator_type(pos);
            let r = {
                let mut w = lock(&self.world);
                let now = w.now_ms();
                w.kinesis.set_now(now);
                let parents = parents_of(&w, stream, shard);
                w.iterator_asked(self.worker, stream, shard, &parents);
                let r = w.kinesis.get_shard_iterator(stream, shard, kind.clone());
                w.event(format!(
                    "w{} kinesis GetShardIterator {shard} {kind:?}: {}",
                    self.worker,
                    if r.is_ok() { "ok" } else { "error" }
                ));
                r.map_err(|e| error("GetShardIterator", stream, shard, e, now, at_ms))
            };
            self.back().await;
            r
        })
    }

    fn get_records<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a Arc<str>,
        iterator: &'a str,
        limit: i32,
    ) -> BoxFuture<'a, Result<Batch, KinesisError>> {
        Box::pin(async move {
            self.there("GetRecords", stream).await?;
            let r = {
                let mut w = lock(&self.world);
                let now = w.now_ms();
                w.kinesis.set_now(now);
                let r = w.kinesis.get_records(iterator, limit.max(1) as usize);
                match &r {
                    Ok(out) if !out.records.is_empty() || out.next_iterator.is_none() => w.event(format!(
                        "w{} kinesis GetRecords {shard}: {} records{}",
                        self.worker,
                        out.records.len(),
                        if out.next_iterator.is_none() { ", shard end" } else { "" }
                    )),
                    Ok(_) => {}
                    Err(e) => w.event(format!("w{} kinesis GetRecords {shard}: {e:?}", self.worker)),
                }
                r.map_err(|e| error("GetRecords", stream, shard, e, now, None)).map(|out| Batch {
                    records: out.records.into_iter().map(|r| record(shard, r)).collect(),
                    next_iterator: out.next_iterator,
                    millis_behind_latest: Some(out.millis_behind_latest),
                    children: out.child_shards,
                })
            };
            self.back().await;
            r
        })
    }
}
