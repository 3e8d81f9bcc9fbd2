//! An in-memory model of Amazon Kinesis Data Streams as Squall uses it, following AWS where the
//! local engine (kinesis-local) differs: streams of shards with hash ranges and lineage (split,
//! merge), records routed by the MD5 of their partition key (or an explicit hash key), sequence
//! numbers that grow over the stream, shard iterators of every type (AT_TIMESTAMP refuses a
//! time ahead of the service's clock) that expire after 5 minutes, GetRecords with its limit,
//! MillisBehindLatest, and a closed shard's end (no next iterator, its children named). It is the
//! Kinesis of the simulator, kept honest by `tests/kinesis_model.rs` against kinesis-local.
//!
//! Where kinesis-local differs from AWS, the model follows AWS (the differential test leaves
//! these out, naming each): kinesis-local names no ChildShards at a shard's end; it reports a
//! closed shard's EndingSequenceNumber as a sentinel (`i64::MAX`); its sequence numbers have
//! their own format (the model's are 56 digits too, and compared by order, never by value); it
//! splits the hash key space of a new stream a little differently (two shards: the first ends
//! at 2^127 - 2, on AWS at 2^127 - 1); on a shard that holds no records it answers every
//! GetShardIterator with an iterator at the shard's start, a timestamp ahead of its clock or a
//! sequence number of another shard included (AWS refuses both, and so does the model).
//!
//! Enhanced fan-out as AWS documents it: stream consumers (RegisterStreamConsumer: CREATING for
//! [`CONSUMER_CREATING_MS`], then ACTIVE; deregistered: DELETING for [`CONSUMER_DELETING_MS`], then
//! gone, its ARN refused with ResourceNotFound), and SubscribeToShard: a subscription lasts
//! [`SUBSCRIPTION_MS`] (5 minutes), a second one for the same consumer and shard within
//! [`RESUBSCRIBE_IN_USE_MS`] (5 s) of a successful call is refused (ResourceInUse) and a later
//! one takes over (the earlier one's stream then fails with ResourceInUse); each event carries
//! the records after the subscription's position, MillisBehindLatest and a continuation
//! sequence (where the next subscription starts, AFTER_SEQUENCE_NUMBER), and at a closed
//! shard's end no continuation and the shard's children (kinesis-local names none and keeps a
//! continuation: the product's fallback for it is its own test's business). A subscription's
//! AFTER_SEQUENCE_NUMBER accepts any continuation the model handed out (the sequence before the
//! shard's first record included), not only the sequence of a record. The model answers events
//! when asked; how often they come is the simulator's choice (AWS pushes them as records arrive,
//! at least every 5 s).
//!
//! What it does not model: throttling and limits (the simulator injects them), retention
//! (trimming), UpdateShardCount, encryption.
#![allow(dead_code)]

use std::collections::BTreeMap;

/// AWS's iterator lifetime.
pub const ITERATOR_TTL_MS: i64 = 300_000;

/// An error, by the code AWS answers with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KError {
    ResourceNotFound(String),
    InvalidArgument(String),
    ResourceInUse(String),
    ExpiredIterator,
}

impl KError {
    /// The AWS error code.
    pub fn code(&self) -> &'static str {
        match self {
            KError::ResourceNotFound(_) => "ResourceNotFoundException",
            KError::InvalidArgument(_) => "InvalidArgumentException",
            KError::ResourceInUse(_) => "ResourceInUseException",
            KError::ExpiredIterator => "ExpiredIteratorException",
        }
    }
}

/// A shard as ListShards describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardInfo {
    pub shard_id: String,
    pub parent: Option<String>,
    pub adjacent_parent: Option<String>,
    pub start_hash: u128,
    pub end_hash: u128,
    pub start_seq: String,
    /// `Some` once the shard is closed (AWS: the last sequence number the shard can hold).
    pub end_seq: Option<String>,
}

/// A record as GetRecords returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rec {
    pub sequence: String,
    pub partition_key: String,
    pub data: Vec<u8>,
    pub arrival_ms: i64,
}

/// What GetRecords answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GetRecordsOut {
    pub records: Vec<Rec>,
    /// `None` at a closed shard's end.
    pub next_iterator: Option<String>,
    pub millis_behind_latest: i64,
    /// The shard's children, at its end.
    pub child_shards: Vec<String>,
}

/// Where a shard iterator starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IteratorType {
    TrimHorizon,
    Latest,
    AtSequence(String),
    AfterSequence(String),
    AtTimestamp(i64),
}

#[derive(Clone, Debug)]
struct Shard {
    info: ShardInfo,
    /// (sequence, record) in order.
    records: Vec<(u128, Rec)>,
}

#[derive(Clone, Debug)]
struct Stream {
    shards: Vec<Shard>,
}

#[derive(Clone, Debug)]
struct Iter {
    stream: String,
    shard: String,
    /// The next record has a sequence above this one (`None`: from the shard's first).
    after: Option<u128>,
    /// Records at or after this arrival time only (AT_TIMESTAMP, until the first one is read).
    at_ms: Option<i64>,
    issued_ms: i64,
}

/// AWS ends a subscription after 5 minutes.
pub const SUBSCRIPTION_MS: i64 = 300_000;
/// A second SubscribeToShard of a consumer and shard within this long of a successful one is
/// refused (ResourceInUse); a later one takes the subscription over.
pub const RESUBSCRIBE_IN_USE_MS: i64 = 5_000;
/// How long a registered consumer stays CREATING.
pub const CONSUMER_CREATING_MS: i64 = 1_500;
/// How long a deregistered consumer stays DELETING.
pub const CONSUMER_DELETING_MS: i64 = 1_000;

/// A registered stream consumer.
#[derive(Clone, Debug)]
struct Consumer {
    arn: String,
    registered_ms: i64,
    deleting_from: Option<i64>,
}

/// An enhanced fan-out subscription (SubscribeToShard), as the model serves its events.
#[derive(Clone, Debug)]
pub struct Subscription {
    pub consumer_arn: String,
    pub stream: String,
    pub shard: String,
    /// The next record has a sequence above this one.
    after: u128,
    pub started_ms: i64,
    generation: u64,
    /// The shard's end was sent.
    ended: bool,
}

/// One SubscribeToShardEvent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventOut {
    pub records: Vec<Rec>,
    /// `None` at a closed shard's end.
    pub continuation: Option<String>,
    pub millis_behind_latest: i64,
    /// The shard's children, at its end.
    pub child_shards: Vec<String>,
}

/// The model service.
#[derive(Default)]
pub struct KinesisModel {
    streams: BTreeMap<String, Stream>,
    /// Stream consumers by (stream, name).
    consumers: BTreeMap<(String, String), Consumer>,
    /// Per (consumer ARN, shard): the last successful SubscribeToShard (ms) and its generation.
    subscriptions: BTreeMap<(String, String), (i64, u64)>,
    iterators: BTreeMap<String, Iter>,
    next_iterator: u64,
    /// The last sequence number given (over every stream: they only grow).
    seq: u128,
    /// The service's clock (ms), moved by the caller.
    now_ms: i64,
}

/// The 128-bit hash key of a partition key (MD5, big-endian), as Kinesis routes it.
pub fn hash_key(partition_key: &str) -> u128 {
    squall::kinesis::kpl::partition_key_hash(partition_key)
}

/// The shards whose parent (or adjacent parent) is `shard`.
fn children(stream: &Stream, shard: &str) -> Vec<String> {
    stream
        .shards
        .iter()
        .filter(|s| s.info.parent.as_deref() == Some(shard) || s.info.adjacent_parent.as_deref() == Some(shard))
        .map(|s| s.info.shard_id.clone())
        .collect()
}

/// MillisBehindLatest: 0 when nothing is left after the records taken, else how far the last
/// one taken is from the shard's newest.
fn behind(left: usize, last: Option<&Rec>, newest: Option<i64>) -> i64 {
    match (left, last, newest) {
        (0, _, _) => 0,
        (_, Some(r), Some(n)) => (n - r.arrival_ms).max(0),
        _ => 0,
    }
}

fn seq_str(n: u128) -> String {
    format!("{n:056}")
}

fn parse_seq(s: &str) -> Result<u128, KError> {
    s.parse().map_err(|_| KError::InvalidArgument(format!("sequence number {s} is not valid")))
}

impl KinesisModel {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the service's clock.
    pub fn set_now(&mut self, ms: i64) {
        self.now_ms = ms;
    }

    pub fn now(&self) -> i64 {
        self.now_ms
    }

    /// CreateStream with `shards` shards over even hash ranges (ids `shardId-000000000000`..).
    pub fn create_stream(&mut self, name: &str, shards: u32) -> Result<(), KError> {
        let n = u128::from(shards.max(1));
        // 2^128 / n without overflowing: each shard's share of the hash key space (AWS: three
        // shards end at 113427455640312821154458202477256070484, 226854911280625642308916404954512140969
        // and 2^128 - 1)
        if n == 1 {
            // 2^128 itself does not fit: one shard holds the whole space.
            return self.create_stream_with_ranges(name, &[(0, u128::MAX)]);
        }
        let size = u128::MAX / n + (u128::MAX % n + 1) / n;
        let ranges: Vec<(u128, u128)> =
            (0..n).map(|i| (i * size, if i == n - 1 { u128::MAX } else { (i + 1) * size - 1 })).collect();
        self.create_stream_with_ranges(name, &ranges)
    }

    /// How many records a shard holds (the differential test needs it: kinesis-local answers
    /// any GetShardIterator on an empty shard with an iterator at its start).
    pub fn shard_records(&self, name: &str, shard_id: &str) -> Result<usize, KError> {
        let stream = self.stream(name)?;
        let shard = stream
            .shards
            .iter()
            .find(|s| s.info.shard_id == shard_id)
            .ok_or_else(|| KError::ResourceNotFound(format!("shard {shard_id} of stream {name} not found")))?;
        Ok(shard.records.len())
    }

    /// Creates a stream whose shards cover the given hash ranges, in order. kinesis-local splits
    /// the key space a little differently from AWS (two shards: it ends the first at 2^127 - 2,
    /// AWS at 2^127 - 1), so the differential test starts the model from the ranges the engine
    /// chose and compares everything after.
    pub fn create_stream_with_ranges(&mut self, name: &str, ranges: &[(u128, u128)]) -> Result<(), KError> {
        if self.streams.contains_key(name) {
            return Err(KError::ResourceInUse(format!("stream {name} exists")));
        }
        let start_seq = seq_str(self.seq + 1);
        let shards = ranges
            .iter()
            .enumerate()
            .map(|(i, &(start_hash, end_hash))| Shard {
                info: ShardInfo {
                    shard_id: format!("shardId-{i:012}"),
                    parent: None,
                    adjacent_parent: None,
                    start_hash,
                    end_hash,
                    start_seq: start_seq.clone(),
                    end_seq: None,
                },
                records: Vec::new(),
            })
            .collect();
        self.streams.insert(name.to_string(), Stream { shards });
        Ok(())
    }

    fn stream(&self, name: &str) -> Result<&Stream, KError> {
        self.streams.get(name).ok_or_else(|| KError::ResourceNotFound(format!("stream {name} not found")))
    }

    fn stream_mut(&mut self, name: &str) -> Result<&mut Stream, KError> {
        self.streams.get_mut(name).ok_or_else(|| KError::ResourceNotFound(format!("stream {name} not found")))
    }

    /// ListShards (every shard, open and closed).
    pub fn list_shards(&self, name: &str) -> Result<Vec<ShardInfo>, KError> {
        Ok(self.stream(name)?.shards.iter().map(|s| s.info.clone()).collect())
    }

    /// PutRecord: the shard and sequence number it got.
    pub fn put_record(
        &mut self,
        name: &str,
        partition_key: &str,
        data: &[u8],
        explicit_hash: Option<u128>,
    ) -> Result<(String, String), KError> {
        if partition_key.is_empty() || partition_key.len() > 256 {
            return Err(KError::InvalidArgument("partition key must be 1 to 256 characters".into()));
        }
        let h = explicit_hash.unwrap_or_else(|| hash_key(partition_key));
        self.seq += 1;
        let (seq, now) = (self.seq, self.now_ms);
        let stream = self.stream_mut(name)?;
        let shard = stream
            .shards
            .iter_mut()
            .find(|s| s.info.end_seq.is_none() && s.info.start_hash <= h && h <= s.info.end_hash)
            .expect("the open shards cover the hash key space");
        let rec = Rec {
            sequence: seq_str(seq),
            partition_key: partition_key.to_string(),
            data: data.to_vec(),
            arrival_ms: now,
        };
        shard.records.push((seq, rec));
        Ok((shard.info.shard_id.clone(), seq_str(seq)))
    }

    /// A sequence number names a record of this shard (AWS refuses one of another shard).
    fn of_shard(shard: &Shard, n: u128, shard_id: &str) -> Result<(), KError> {
        if shard.records.iter().any(|(s, _)| *s == n) {
            Ok(())
        } else {
            Err(KError::InvalidArgument(format!("sequence number {} is not of shard {shard_id}", seq_str(n))))
        }
    }

    /// GetShardIterator.
    pub fn get_shard_iterator(&mut self, name: &str, shard_id: &str, kind: IteratorType) -> Result<String, KError> {
        let now = self.now_ms;
        let shard = self
            .stream(name)?
            .shards
            .iter()
            .find(|s| s.info.shard_id == shard_id)
            .ok_or_else(|| KError::ResourceNotFound(format!("shard {shard_id} of stream {name} not found")))?;
        let (after, at_ms) = match kind {
            IteratorType::TrimHorizon => (None, None),
            IteratorType::Latest => (Some(shard.records.last().map_or(self.seq, |(s, _)| *s).max(self.seq)), None),
            IteratorType::AtSequence(s) => {
                let n = parse_seq(&s)?;
                Self::of_shard(shard, n, shard_id)?;
                (n.checked_sub(1), None)
            }
            IteratorType::AfterSequence(s) => {
                let n = parse_seq(&s)?;
                Self::of_shard(shard, n, shard_id)?;
                (Some(n), None)
            }
            IteratorType::AtTimestamp(ms) => {
                if ms > now {
                    return Err(KError::InvalidArgument(format!(
                        "The timestampInMillis parameter cannot be greater than the currentTimestampInMillis. \
                         timestampInMillis: {ms}, currentTimestampInMillis: {now}"
                    )));
                }
                (None, Some(ms))
            }
        };
        self.next_iterator += 1;
        let id = format!("it-{}", self.next_iterator);
        self.iterators.insert(
            id.clone(),
            Iter { stream: name.to_string(), shard: shard_id.to_string(), after, at_ms, issued_ms: now },
        );
        Ok(id)
    }

    /// GetRecords: up to `limit` records after the iterator's position.
    pub fn get_records(&mut self, iterator: &str, limit: usize) -> Result<GetRecordsOut, KError> {
        let it =
            self.iterators.get(iterator).cloned().ok_or_else(|| KError::InvalidArgument("unknown iterator".into()))?;
        if self.now_ms - it.issued_ms > ITERATOR_TTL_MS {
            return Err(KError::ExpiredIterator);
        }
        let stream = self.stream(&it.stream)?;
        let shard = stream
            .shards
            .iter()
            .find(|s| s.info.shard_id == it.shard)
            .ok_or_else(|| KError::ResourceNotFound(format!("shard {}", it.shard)))?;
        let pending: Vec<&(u128, Rec)> = shard
            .records
            .iter()
            .filter(|(s, r)| it.after.is_none_or(|a| *s > a) && it.at_ms.is_none_or(|t| r.arrival_ms >= t))
            .collect();
        let taken: Vec<Rec> = pending.iter().take(limit.clamp(1, 10_000)).map(|(_, r)| r.clone()).collect();
        let last = taken.len().checked_sub(1).map(|i| pending[i].0);
        let newest = shard.records.last().map(|(_, r)| r.arrival_ms);
        let left = pending.len() - taken.len();
        let at_end = shard.info.end_seq.is_some() && left == 0;
        let child_shards = if at_end { children(stream, &it.shard) } else { Vec::new() };
        let behind = behind(left, taken.last(), newest);
        let next_iterator = if at_end {
            None
        } else {
            let after = last.or(it.after);
            let at_ms = if last.is_some() { None } else { it.at_ms };
            self.next_iterator += 1;
            let id = format!("it-{}", self.next_iterator);
            self.iterators.insert(id.clone(), Iter { after, at_ms, issued_ms: self.now_ms, ..it });
            Some(id)
        };
        Ok(GetRecordsOut { records: taken, next_iterator, millis_behind_latest: behind, child_shards })
    }

    // ----- enhanced fan-out -----

    /// The ARN of a stream (DescribeStreamSummary).
    pub fn stream_arn(&self, name: &str) -> Result<String, KError> {
        self.stream(name)?;
        Ok(format!("arn:aws:kinesis:us-east-1:000000000000:stream/{name}"))
    }

    fn stream_of_arn(&self, stream_arn: &str) -> Result<String, KError> {
        let name = stream_arn
            .strip_prefix("arn:aws:kinesis:us-east-1:000000000000:stream/")
            .ok_or_else(|| KError::InvalidArgument(format!("{stream_arn} is not a stream ARN")))?;
        self.stream(name)?;
        Ok(name.to_string())
    }

    /// Forgets consumers whose deletion finished.
    fn collect_consumers(&mut self) {
        let now = self.now_ms;
        self.consumers.retain(|_, c| c.deleting_from.is_none_or(|t| now - t < CONSUMER_DELETING_MS));
    }

    /// RegisterStreamConsumer: the new consumer's ARN (ResourceInUse when the name is taken).
    pub fn register_consumer(&mut self, stream_arn: &str, name: &str) -> Result<String, KError> {
        self.collect_consumers();
        let stream = self.stream_of_arn(stream_arn)?;
        let key = (stream, name.to_string());
        if self.consumers.contains_key(&key) {
            return Err(KError::ResourceInUse(format!("consumer {name} of {stream_arn} exists")));
        }
        let arn = format!("{stream_arn}/consumer/{name}:{}", self.now_ms);
        self.consumers.insert(key, Consumer { arn: arn.clone(), registered_ms: self.now_ms, deleting_from: None });
        Ok(arn)
    }

    /// DescribeStreamConsumer: its ARN and status (ResourceNotFound when missing).
    pub fn describe_consumer(&mut self, stream_arn: &str, name: &str) -> Result<(String, &'static str), KError> {
        self.collect_consumers();
        let stream = self.stream_of_arn(stream_arn)?;
        let c = self
            .consumers
            .get(&(stream, name.to_string()))
            .ok_or_else(|| KError::ResourceNotFound(format!("consumer {name} of {stream_arn} not found")))?;
        Ok((c.arn.clone(), self.consumer_status(c)))
    }

    fn consumer_status(&self, c: &Consumer) -> &'static str {
        if c.deleting_from.is_some() {
            "DELETING"
        } else if self.now_ms - c.registered_ms < CONSUMER_CREATING_MS {
            "CREATING"
        } else {
            "ACTIVE"
        }
    }

    /// DeregisterStreamConsumer (the consumer is DELETING, then gone).
    pub fn deregister_consumer(&mut self, stream_arn: &str, name: &str) -> Result<(), KError> {
        self.collect_consumers();
        let stream = self.stream_of_arn(stream_arn)?;
        let now = self.now_ms;
        let c = self
            .consumers
            .get_mut(&(stream, name.to_string()))
            .ok_or_else(|| KError::ResourceNotFound(format!("consumer {name} of {stream_arn} not found")))?;
        c.deleting_from.get_or_insert(now);
        Ok(())
    }

    /// The consumer of an ARN and its status, if it exists.
    fn consumer_by_arn(&self, arn: &str) -> Option<(&(String, String), &Consumer)> {
        self.consumers.iter().find(|(_, c)| c.arn == arn)
    }

    /// SubscribeToShard at `kind` (an AFTER_SEQUENCE_NUMBER continuation may be any sequence in
    /// the shard's range, see the module docs).
    pub fn subscribe(
        &mut self,
        consumer_arn: &str,
        shard_id: &str,
        kind: IteratorType,
    ) -> Result<Subscription, KError> {
        self.collect_consumers();
        let now = self.now_ms;
        let (stream, status) = match self.consumer_by_arn(consumer_arn) {
            Some(((stream, _), c)) => (stream.clone(), self.consumer_status(c)),
            None => return Err(KError::ResourceNotFound(format!("consumer {consumer_arn} not found"))),
        };
        if status != "ACTIVE" {
            return Err(KError::ResourceInUse(format!("consumer {consumer_arn} is {status}, not ACTIVE")));
        }
        let shard = self
            .stream(&stream)?
            .shards
            .iter()
            .find(|s| s.info.shard_id == shard_id)
            .ok_or_else(|| KError::ResourceNotFound(format!("shard {shard_id} of stream {stream} not found")))?;
        let start = parse_seq(&shard.info.start_seq)?;
        let after = match kind {
            IteratorType::TrimHorizon => start - 1,
            IteratorType::Latest => shard.records.last().map_or(self.seq, |(s, _)| *s).max(self.seq),
            IteratorType::AtSequence(s) => {
                let n = parse_seq(&s)?;
                Self::of_shard(shard, n, shard_id)?;
                n - 1
            }
            IteratorType::AfterSequence(s) => {
                let n = parse_seq(&s)?;
                let end = shard.info.end_seq.as_deref().map(parse_seq).transpose()?;
                if n + 1 < start || end.is_some_and(|e| n > e) {
                    return Err(KError::InvalidArgument(format!("sequence number {s} is not of shard {shard_id}")));
                }
                n
            }
            IteratorType::AtTimestamp(ms) => {
                if ms > now {
                    return Err(KError::InvalidArgument(format!(
                        "The timestampInMillis parameter cannot be greater than the currentTimestampInMillis. \
                         timestampInMillis: {ms}, currentTimestampInMillis: {now}"
                    )));
                }
                // records arrive in sequence order: the ones before the time are a prefix
                shard.records.iter().take_while(|(_, r)| r.arrival_ms < ms).last().map_or(start - 1, |(s, _)| *s)
            }
        };
        let slot = self.subscriptions.entry((consumer_arn.to_string(), shard_id.to_string())).or_insert((i64::MIN, 0));
        if slot.0 != i64::MIN && now - slot.0 < RESUBSCRIBE_IN_USE_MS {
            return Err(KError::ResourceInUse(format!(
                "another subscription of {consumer_arn} to {shard_id} began {} ms ago",
                now - slot.0
            )));
        }
        *slot = (now, slot.1 + 1);
        Ok(Subscription {
            consumer_arn: consumer_arn.to_string(),
            stream,
            shard: shard_id.to_string(),
            after,
            started_ms: now,
            generation: slot.1,
            ended: false,
        })
    }

    /// The next event of a subscription, of at most `limit` records: `Ok(None)` once it ended
    /// (after [`SUBSCRIPTION_MS`], or after the shard's end was sent), ResourceInUse once
    /// another subscription took it over, ResourceNotFound once its consumer is gone.
    pub fn next_event(&mut self, sub: &mut Subscription, limit: usize) -> Result<Option<EventOut>, KError> {
        self.collect_consumers();
        if sub.ended || self.now_ms - sub.started_ms >= SUBSCRIPTION_MS {
            return Ok(None);
        }
        if self.consumer_by_arn(&sub.consumer_arn).is_none_or(|(_, c)| c.deleting_from.is_some()) {
            return Err(KError::ResourceNotFound(format!("consumer {} not found", sub.consumer_arn)));
        }
        let slot = self.subscriptions.get(&(sub.consumer_arn.clone(), sub.shard.clone())).map(|s| s.1);
        if slot != Some(sub.generation) {
            return Err(KError::ResourceInUse(format!("the subscription to {} was taken over", sub.shard)));
        }
        let stream = self.stream(&sub.stream)?;
        let shard = stream
            .shards
            .iter()
            .find(|s| s.info.shard_id == sub.shard)
            .ok_or_else(|| KError::ResourceNotFound(format!("shard {}", sub.shard)))?;
        let pending: Vec<&(u128, Rec)> = shard.records.iter().filter(|(s, _)| *s > sub.after).collect();
        let taken: Vec<Rec> = pending.iter().take(limit.max(1)).map(|(_, r)| r.clone()).collect();
        let left = pending.len() - taken.len();
        if let Some(n) = taken.len().checked_sub(1).map(|i| pending[i].0) {
            sub.after = n;
        }
        let newest = shard.records.last().map(|(_, r)| r.arrival_ms);
        let behind = behind(left, taken.last(), newest);
        let at_end = shard.info.end_seq.is_some() && left == 0;
        let child_shards = if at_end { children(stream, &sub.shard) } else { Vec::new() };
        sub.ended = at_end;
        let continuation = (!at_end).then(|| seq_str(sub.after));
        Ok(Some(EventOut { records: taken, continuation, millis_behind_latest: behind, child_shards }))
    }

    fn next_shard_id(stream: &Stream) -> String {
        format!("shardId-{:012}", stream.shards.len())
    }

    /// SplitShard at `new_start_hash`: the shard closes, two children split its range.
    pub fn split_shard(&mut self, name: &str, shard_id: &str, new_start_hash: u128) -> Result<(), KError> {
        let seq = self.seq;
        let stream = self.stream_mut(name)?;
        let i = stream
            .shards
            .iter()
            .position(|s| s.info.shard_id == shard_id)
            .ok_or_else(|| KError::ResourceNotFound(format!("shard {shard_id} of stream {name} not found")))?;
        let p = stream.shards[i].info.clone();
        if p.end_seq.is_some() {
            return Err(KError::ResourceInUse(format!("shard {shard_id} is closed")));
        }
        if new_start_hash <= p.start_hash || new_start_hash > p.end_hash {
            return Err(KError::InvalidArgument(format!(
                "new starting hash key {new_start_hash} is outside shard {shard_id}"
            )));
        }
        stream.shards[i].info.end_seq = Some(seq_str(seq));
        let start_seq = seq_str(seq + 1);
        for (lo, hi) in [(p.start_hash, new_start_hash - 1), (new_start_hash, p.end_hash)] {
            let id = Self::next_shard_id(stream);
            stream.shards.push(Shard {
                info: ShardInfo {
                    shard_id: id,
                    parent: Some(shard_id.to_string()),
                    adjacent_parent: None,
                    start_hash: lo,
                    end_hash: hi,
                    start_seq: start_seq.clone(),
                    end_seq: None,
                },
                records: Vec::new(),
            });
        }
        Ok(())
    }

    /// MergeShards: two adjacent open shards close into one child.
    pub fn merge_shards(&mut self, name: &str, shard_id: &str, adjacent: &str) -> Result<(), KError> {
        let seq = self.seq;
        let stream = self.stream_mut(name)?;
        let find = |id: &str| stream.shards.iter().position(|s| s.info.shard_id == id);
        let (Some(a), Some(b)) = (find(shard_id), find(adjacent)) else {
            return Err(KError::ResourceNotFound(format!("shard {shard_id} or {adjacent} of stream {name} not found")));
        };
        let (ia, ib) = (stream.shards[a].info.clone(), stream.shards[b].info.clone());
        if ia.end_seq.is_some() || ib.end_seq.is_some() {
            return Err(KError::ResourceInUse("a shard to merge is closed".into()));
        }
        let adjacent_ranges =
            ia.end_hash.checked_add(1) == Some(ib.start_hash) || ib.end_hash.checked_add(1) == Some(ia.start_hash);
        if !adjacent_ranges {
            return Err(KError::InvalidArgument(format!("shards {shard_id} and {adjacent} are not adjacent")));
        }
        stream.shards[a].info.end_seq = Some(seq_str(seq));
        stream.shards[b].info.end_seq = Some(seq_str(seq));
        let id = Self::next_shard_id(stream);
        stream.shards.push(Shard {
            info: ShardInfo {
                shard_id: id,
                parent: Some(shard_id.to_string()),
                adjacent_parent: Some(adjacent.to_string()),
                start_hash: ia.start_hash.min(ib.start_hash),
                end_hash: ia.end_hash.max(ib.end_hash),
                start_seq: seq_str(seq + 1),
                end_seq: None,
            },
            records: Vec::new(),
        });
        Ok(())
    }
}
