//! The writer side of a stage boundary: a [`KinesisSink`] whose encoder writes Squall stage
//! records ([`super::codec`]) into the intermediate stream, registered as a producer.
//!
//! - The grouping key decides the shard: the explicit hash key of a data record is [`key_hash`]
//!   (FNV-1a-64 with MurmurHash3's finalizer, stable across builds and hosts) of its partition
//!   key — the key fields' values joined by U+001F — in the top 64 bits of the 128-bit hash key
//!   space. One key lands
//!   on one shard, read by one task of the next stage, cluster-wide.
//! - Every record carries the producer's current low watermark (its input watermark). Once per
//!   `watermark_interval` the writer also writes a watermark control record to each open shard
//!   it wrote no data record to since the last round. Control records per second are therefore
//!   at most `P × S / interval` (P producers, S open shards), and none for a shard that receives
//!   data in every round; with the defaults (1 s) a stage with 4 writers into 4 shards writes at
//!   most 16 control records per second, under 5% of the data records from 320 records/s on
//!   (measured in BENCHMARKS.md, Stages: 0.01-2% of the data records).
//! - The writer acks an input only once its record is put, so the previous stage's spout tuples
//!   stay pending for a put's round trip: give the first stage's spouts room
//!   (`--max-spout-pending`, e.g. 5000), which also lets more tuples of a key share a record.
//! - At drain, a drain marker (tagged with producer and deployment) goes to every open shard,
//!   after every data record, and the sink flushes before the stage's task stops.
//! - A writer puts only while its worker's ZooKeeper session can be trusted, and only what it
//!   buffered under the current session ([`StageWriter::new`]): a zombie writer puts nothing.
//! - Order: the next stage takes, per shard, the highest watermark of this producer's records it
//!   consumed; so no record may land in a shard ahead of an earlier record of this producer with
//!   a lower watermark. The sink keeps only one key's records in order, and a PutRecords call
//!   can write a record while an earlier one of another key to the same shard is throttled and
//!   retried later. So the writer asks for barriers ([`SinkEncoder::watermark_barriers`]): from
//!   each watermark (and the drain) on, records — the watermark records and drain markers first —
//!   are put only after every record buffered before was acknowledged. "Bound for the same
//!   shard" is taken as "any record": the writer's shard map (listed every 10 s) may be stale
//!   after a reshard of the intermediate stream, and a merge puts two ranges it still sees apart
//!   into one shard. Cost: at most one PutRecords round trip per watermark advance.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use squall_topology::{Bolt, BoltOutput, ComponentError, Inputs, TaskContext, Timer, Tuple, Value, Watermark};

use super::codec;
use crate::coord::{SharedSession, ZkStore};
use crate::sink::{KinesisSink, OpenShard, SinkEncoder, SinkRecord};

/// Partition key of control records (their explicit hash key picks the shard).
const CONTROL_KEY: &str = "squall-control";
/// Longest partition key Kinesis accepts.
const MAX_KEY: usize = 256;

/// The boundary's stable key hash: FNV-1a (64 bits) of the key, then MurmurHash3's 64-bit
/// finalizer. FNV-1a alone spreads short, similar keys badly over its high bits (`key-0` ..
/// `key-23` all land in the lower half of the space), and the high bits pick the shard.
pub fn key_hash(key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The explicit hash key (decimal) of a partition key.
pub fn explicit_hash_key(key: &str) -> u128 {
    u128::from(key_hash(key)) << 64
}

fn key_part(v: &Value, out: &mut String) {
    use std::fmt::Write;
    match v {
        Value::Null => {}
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        // equal integers are one key, whatever their type (as in the engine's fields grouping)
        Value::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Value::UInt(u) => {
            let _ = write!(out, "{u}");
        }
        Value::Float(f) => {
            let _ = write!(out, "{f}");
        }
        Value::Str(s) => out.push_str(s),
        Value::Bytes(b) => {
            for x in b.iter() {
                let _ = write!(out, "{x:02x}");
            }
        }
    }
}

/// Encodes a boundary's tuples as stage records.
#[derive(Debug)]
pub struct StageEncoder {
    producer: u64,
    deployment: String,
    key: Vec<String>,
    watermark: Option<u64>,
    interval: Duration,
    last_round: Option<Instant>,
    /// Open shards (start, end of hash range), sorted by start; and whether this producer wrote
    /// a data record to each since the last round.
    shards: Vec<(u128, u128)>,
    written: Vec<bool>,
}

impl StageEncoder {
    /// An encoder for `producer` of `deployment`, keyed by the named fields.
    pub fn new(producer: u64, deployment: impl Into<String>, key: Vec<String>, interval: Duration) -> Self {
        Self {
            producer,
            deployment: deployment.into(),
            key,
            watermark: None,
            interval,
            last_round: None,
            shards: Vec::new(),
            written: Vec::new(),
        }
    }

    fn set_shards(&mut self, shards: &[OpenShard]) {
        let mut parsed: Vec<(u128, u128)> = shards
            .iter()
            .filter_map(|s| Some((s.starting_hash_key.parse().ok()?, s.ending_hash_key.parse().ok()?)))
            .collect();
        parsed.sort_unstable();
        if parsed != self.shards {
            self.shards = parsed;
            self.written = vec![false; self.shards.len()];
        }
    }

    fn shard_of(&self, hash: u128) -> Option<usize> {
        let i = self.shards.partition_point(|(start, _)| *start <= hash).checked_sub(1)?;
        (self.shards[i].1 >= hash).then_some(i)
    }

    fn control(&self, start: u128, drain: bool) -> SinkRecord {
        let data = codec::encode_control(self.producer, &self.deployment, self.watermark, drain);
        SinkRecord::new(CONTROL_KEY, data).with_explicit_hash_key(start.to_string())
    }
}

impl SinkEncoder for StageEncoder {
    fn encode(&mut self, t: &Tuple) -> Result<SinkRecord, ComponentError> {
        let mut key = String::new();
        for (i, f) in self.key.iter().enumerate() {
            if i > 0 {
                key.push('\u{1f}');
            }
            key_part(t.get(f).map_err(|e| ComponentError::fatal(e.to_string()))?, &mut key);
        }
        let hash = explicit_hash_key(&key);
        if let Some(i) = self.shard_of(hash) {
            self.written[i] = true;
        }
        if key.chars().count() > MAX_KEY || key.is_empty() {
            // the explicit hash key decides the shard; the partition key only has to be valid
            key = format!("{:016x}", key_hash(&key));
        }
        let data = codec::encode_data(self.producer, &self.deployment, self.watermark, t.values());
        Ok(SinkRecord::new(key, data).with_explicit_hash_key(hash.to_string()))
    }

    fn needs_shards(&self) -> bool {
        true
    }

    /// Every record carries the watermark it was encoded under, and the next stage's watermark
    /// for a shard is the highest of this producer's records consumed there: a record put ahead
    /// of one encoded before a watermark (a throttled record retried later, or one of another
    /// key in the same shard) would let the reader pass it.
    fn watermark_barriers(&self) -> bool {
        true
    }

    /// The tuples of one key buffered behind each other travel in one record.
    fn combine(&mut self, into: &mut SinkRecord, next: &SinkRecord) -> bool {
        codec::append(&mut into.data, &next.data).is_ok()
    }

    fn on_watermark(&mut self, wm: Watermark, shards: &[OpenShard]) -> Vec<SinkRecord> {
        self.watermark = Some(wm.millis());
        self.set_shards(shards);
        let now = Instant::now();
        if self.last_round.is_some_and(|t| now.duration_since(t) < self.interval) {
            return Vec::new();
        }
        self.last_round = Some(now);
        let out = (0..self.shards.len())
            .filter(|i| !self.written[*i])
            .map(|i| self.control(self.shards[i].0, false))
            .collect();
        self.written.iter_mut().for_each(|w| *w = false);
        out
    }

    fn on_drain(&mut self, shards: &[OpenShard]) -> Vec<SinkRecord> {
        self.set_shards(shards);
        self.shards.iter().map(|(start, _)| self.control(*start, true)).collect()
    }
}

/// Registers a worker's boundary writers as producers of an intermediate stream, and again
/// after a new ZooKeeper session replaced an expired one.
#[derive(Clone, Debug)]
pub struct ProducerRegistrar {
    session: Arc<SharedSession>,
    root: String,
    topology: String,
    stream: String,
    deployment: String,
    ids: Arc<Mutex<Vec<u64>>>,
}

impl ProducerRegistrar {
    /// A registrar for `stream` of `topology` in `deployment`.
    pub fn new(session: Arc<SharedSession>, root: &str, topology: &str, stream: &str, deployment: &str) -> Self {
        Self {
            session,
            root: root.into(),
            topology: topology.into(),
            stream: stream.into(),
            deployment: deployment.into(),
            ids: Arc::default(),
        }
    }

    async fn store(&self) -> Result<ZkStore, String> {
        let s = self.session.current().session.ok_or_else(|| "no ZooKeeper session".to_string())?;
        ZkStore::for_producers(s, &self.root, &self.topology, &self.stream).map_err(|e| e.to_string())
    }

    /// Registers one producer (remembered for [`ProducerRegistrar::register_all`]). While
    /// ZooKeeper is away (a lost connection or answer, no session, a session lost and not yet
    /// replaced) it tries again, 100 ms to 2 s apart, for as long as it takes: the worker's
    /// session gives up after `--zk-give-up-after-ms` and stops the topology, which ends this
    /// wait (the engine cancels `prepare`). Other errors (a name ZooKeeper refuses, no
    /// permission) end it at once.
    pub async fn register(&self, producer: u64) -> Result<(), String> {
        use backon::Retryable as _;
        self.ids.lock().unwrap_or_else(|p| p.into_inner()).push(producer);
        let once = || async {
            let store = self.store().await.map_err(|e| (e, true))?;
            store.register_producer(&self.stream, producer, &self.deployment).await.map_err(|e| {
                let again = e.is_transient() || e.is_session_lost();
                (e.to_string(), again)
            })
        };
        let backoff = backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(100))
            .with_max_delay(Duration::from_secs(2))
            .without_max_times()
            .with_jitter_seed(crate::random::u64());
        once.retry(backoff)
            .when(|(_, again)| *again)
            .notify(|(e, _), after| {
                tracing::warn!(stream = %self.stream, producer = format!("{producer:016x}"), error = %e,
                    retry_in_ms = after.as_millis() as u64,
                    "registering a boundary writer as a producer of the intermediate stream failed; trying again")
            })
            .await
            .map_err(|(e, _)| e)
    }

    /// Registers every producer again (after a new session).
    pub async fn register_all(&self) -> Result<(), String> {
        let ids = self.ids.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let store = self.store().await?;
        for id in ids {
            store.register_producer(&self.stream, id, &self.deployment).await.map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Removes one producer's registration.
    pub async fn unregister(&self, producer: u64) {
        self.ids.lock().unwrap_or_else(|p| p.into_inner()).retain(|p| *p != producer);
        if let Ok(store) = self.store().await
            && let Err(e) = store.unregister_producer(&self.stream, producer, &self.deployment).await
        {
            tracing::debug!(error = %e, "removing a producer registration failed (it goes with the session)");
        }
    }
}

/// The boundary writer bolt: the sink plus its producer registration.
pub struct StageWriter {
    sink: KinesisSink<StageEncoder>,
    producer: u64,
    registrar: ProducerRegistrar,
}

impl StageWriter {
    /// A writer for one task. Its sink puts only while its worker's ZooKeeper session can be
    /// trusted ([`SessionGate`]).
    pub fn new(sink: KinesisSink<StageEncoder>, producer: u64, registrar: ProducerRegistrar) -> Self {
        let gate = SessionGate { session: registrar.session.clone(), liveness: registrar.session.liveness() };
        Self { sink: sink.with_put_gate(Arc::new(gate)), producer, registrar }
    }
}

/// A boundary writer puts only under the ZooKeeper session its inputs were read under (the
/// epoch is the session generation) and only while that session can be trusted: connected,
/// no pause of the process unconfirmed ([`crate::coord::Liveness`]), and admitted by the worker
/// ([`SharedSession::admitted`]). A worker frozen past its session (a zombie) lost the leases
/// of what its writer holds: others read those records again from the checkpoints, and what it
/// would put once thawed (in the old epoch) only repeats them, or lands after the deployment
/// drained; it holds, then fails what it buffered once the new session is admitted, or puts
/// nothing at all when its worker leaves.
#[derive(Debug)]
struct SessionGate {
    session: Arc<SharedSession>,
    liveness: Arc<crate::coord::Liveness>,
}

impl crate::sink::PutGate for SessionGate {
    fn epoch(&self) -> Option<u64> {
        let v = self.session.current();
        (v.health == crate::coord::Health::Ok && self.liveness.trusted() && self.session.admitted(v.generation))
            .then_some(v.generation)
    }
}

impl Bolt for StageWriter {
    async fn prepare(&mut self, ctx: &TaskContext) -> Result<(), ComponentError> {
        // registered before the first record: a consumer never sees data of a producer it
        // does not know, so its watermark cannot pass that data
        self.registrar.register(self.producer).await.map_err(|e| {
            ComponentError::fatal(format!(
                "registering producer {:016x} of intermediate stream {}: {e}",
                self.producer, self.registrar.stream
            ))
        })?;
        self.sink.prepare(ctx).await
    }

    async fn execute(&mut self, input: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.sink.execute(input, out).await
    }

    async fn execute_batch(&mut self, inputs: &mut Inputs, out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.sink.execute_batch(inputs, out).await
    }

    async fn on_timer(&mut self, timer: Timer, out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.sink.on_timer(timer, out).await
    }

    async fn on_watermark(&mut self, wm: Watermark, out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.sink.on_watermark(wm, out).await
    }

    async fn on_drain(&mut self, out: &mut BoltOutput) -> Result<(), ComponentError> {
        // drain markers into every open shard, then everything flushed
        self.sink.on_drain(out).await?;
        if self.sink.pending_bytes() == 0 {
            // markers durably written: a consumer that no longer sees this producer and has
            // read its shards to the tip since has seen everything it wrote
            self.registrar.unregister(self.producer).await;
        } else {
            tracing::warn!(stream = %self.registrar.stream, producer = format!("{:016x}", self.producer),
                "drain: records of this boundary writer were not put; it stays registered until the worker exits");
        }
        Ok(())
    }

    async fn cleanup(&mut self) {
        self.sink.cleanup().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shards(n: u128) -> Vec<OpenShard> {
        let step = u128::MAX / n;
        (0..n)
            .map(|i| OpenShard {
                shard_id: format!("shardId-{i:012}"),
                starting_hash_key: (i * step).to_string(),
                ending_hash_key: if i == n - 1 { u128::MAX.to_string() } else { ((i + 1) * step - 1).to_string() },
            })
            .collect()
    }

    #[test]
    fn keys_hash_stably_and_control_records_go_where_no_data_went() {
        let mut e = StageEncoder::new(7, "dep", vec!["word".into()], Duration::ZERO);
        let recs = e.on_watermark(Watermark(10), &shards(4));
        assert_eq!(recs.len(), 4, "no data yet: one watermark record per shard");
        let t = Tuple::new_for_test("split", "default", &["word"], ["hello"].into());
        let r = e.encode(&t).unwrap();
        assert_eq!(r.partition_key, "hello");
        let hash: u128 = r.explicit_hash_key.clone().unwrap().parse().unwrap();
        let shard = e.shard_of(hash).unwrap();
        let decoded = codec::decode(&r.data, 1).unwrap();
        assert_eq!(decoded.watermark, Some(10));
        assert_eq!(decoded.producer, 7);
        let recs = e.on_watermark(Watermark(20), &shards(4));
        assert_eq!(recs.len(), 3, "the shard that got data needs no watermark record");
        for r in &recs {
            let h: u128 = r.explicit_hash_key.clone().unwrap().parse().unwrap();
            assert_ne!(e.shard_of(h), Some(shard));
            assert_eq!(codec::decode(&r.data, 1).unwrap().payload, codec::Payload::Watermark);
        }
        let drains = e.on_drain(&shards(4));
        assert_eq!(drains.len(), 4);
        assert!(drains.iter().all(|r| codec::decode(&r.data, 1).unwrap().payload == codec::Payload::Drain));
    }

    #[test]
    fn tuples_of_one_key_combine_into_one_record_and_others_do_not() {
        let mut e = StageEncoder::new(1, "d", vec!["word".into()], Duration::ZERO);
        let t = |w: &str| Tuple::new_for_test("c", "default", &["word"], [w].into());
        let mut a = e.encode(&t("x")).unwrap();
        let b = e.encode(&t("x")).unwrap();
        assert!(e.combine(&mut a, &b));
        let tuples = match codec::decode(&a.data, 1).unwrap().payload {
            codec::Payload::Data(t) => t,
            p => panic!("{p:?}"),
        };
        assert_eq!(tuples.len(), 2);
        let mut control = e.on_drain(&shards(1)).remove(0);
        assert!(!e.combine(&mut control, &b), "a control record takes no data");
    }

    #[test]
    fn keys_spread_evenly_over_equal_shards_and_the_hash_is_stable() {
        // pinned: the hash decides where a key's records go, across builds and hosts
        assert_eq!(key_hash(""), 0xefd0_1f60_ba99_2926);
        assert_eq!(key_hash("key-0"), 0x1813_7ad0_31db_6589);
        let e = {
            let mut e = StageEncoder::new(1, "d", vec!["k".into()], Duration::ZERO);
            e.set_shards(&shards(4));
            e
        };
        let mut per_shard = [0usize; 4];
        for i in 0..4000 {
            per_shard[e.shard_of(explicit_hash_key(&format!("key-{i}"))).unwrap()] += 1;
        }
        assert!(per_shard.iter().all(|n| (850..=1150).contains(n)), "{per_shard:?}");
        // few short similar keys (as a word count has) still reach every shard
        let mut few = [0usize; 4];
        for w in (0..24).map(|i| format!("key-{i}")).chain((0..7).map(|i| format!("d{i}"))) {
            few[e.shard_of(explicit_hash_key(&w)).unwrap()] += 1;
        }
        assert!(few.iter().all(|n| *n >= 3), "{few:?}");
    }

    #[test]
    fn equal_integer_keys_are_one_key() {
        let mut e = StageEncoder::new(1, "d", vec!["n".into()], Duration::ZERO);
        let a = e.encode(&Tuple::new_for_test("c", "default", &["n"], [Value::Int(5)].into())).unwrap();
        let b = e.encode(&Tuple::new_for_test("c", "default", &["n"], [Value::UInt(5)].into())).unwrap();
        assert_eq!(a.explicit_hash_key, b.explicit_hash_key);
    }
}
