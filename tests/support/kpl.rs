//! KPL producers for tests: AWS's reference aggregator (`aws-kinesis-agg` from PyPI, installed by
//! `localstack/up` through `localstack/kpl-agg-install`) packs the aggregates, and the writers
//! below put them as the two producer styles do:
//! - [`put_reference`]: the KPL with a fresh shard map (one aggregate per shard, all where
//!   predicted);
//! - [`put_kpl_like`]: the KPL with the shard map it has, which may be stale after a reshard: an
//!   aggregate that lands on another shard than predicted is sent again WHOLE, as new Kinesis
//!   records;
//! - [`put_lambda_style`]: AWS's aggregation library from a Lambda producer (mixed keys in one
//!   aggregate, routed by its first record's key, never sent again).
//!
//! [`KplProducer`] runs both styles in the background, round after round, and reshards between
//! rounds. Also the KPL counters the workers publish in their status ([`kpl_counters`]) and a
//! reader of the de-aggregated stream ([`deaggregated`], [`counts_of`]): what a test takes as the
//! truth, since each Kinesis record (a KPL re-send is a new one) is a record of its own.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use aws_sdk_kinesis::primitives::Blob;
use squall::kinesis::kpl::{self, Deaggregated};
use squall::kinesis::payload::{AuditPayload, Manifest};
use squall::kinesis::{self, ShardDescription};

use super::TestStream;
use super::workers::Cluster;

/// The reference aggregator's Python (a project-local venv made by `localstack/up`, under
/// `SQUALL_STATE_DIR`, by default the checkout's `.squall`).
pub fn reference_python() -> PathBuf {
    let state =
        std::env::var_os("SQUALL_STATE_DIR").map(PathBuf::from).unwrap_or_else(|| super::repo_root().join(".squall"));
    let py = state.join("kpl-agg/venv/bin/python");
    assert!(py.exists(), "{} missing: run localstack/up (it installs aws-kinesis-agg)", py.display());
    py
}

/// One user record to aggregate: (partition key, data).
pub type UserPut = (String, Vec<u8>);

/// One Kinesis record to put: (partition key, explicit hash key, data).
pub type Put = (String, Option<String>, Vec<u8>);

/// Packs each group of user records (partition key, data) into one aggregated record with AWS's
/// reference aggregator (`localstack/kpl_aggregate.py`).
pub fn reference_aggregate(groups: &[Vec<UserPut>]) -> Vec<Put> {
    let request = serde_json::json!({
        "aggregates": groups.iter().map(|g| g.iter().map(|(k, d)| serde_json::json!({
            "partition_key": k, "data_hex": hex(d)
        })).collect::<Vec<_>>()).collect::<Vec<_>>()
    });
    let script = super::repo_root().join("localstack/kpl_aggregate.py");
    let mut child = Command::new(reference_python())
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("running localstack/kpl_aggregate.py");
    use std::io::Write as _;
    child.stdin.take().unwrap().write_all(request.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "kpl_aggregate.py failed");
    let v: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    v.iter()
        .map(|a| {
            (
                a["partition_key"].as_str().unwrap().to_string(),
                a["explicit_hash_key"].as_str().map(str::to_string),
                unhex(a["data_hex"].as_str().unwrap()),
            )
        })
        .collect()
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// A shard's hash key range, both ends included.
pub fn range(d: &ShardDescription) -> (u128, u128) {
    (d.starting_hash_key.parse().unwrap(), d.ending_hash_key.parse().unwrap())
}

/// Puts one record and returns the shard it landed in.
pub async fn put_one(s: &TestStream, put: &Put) -> String {
    put_one_at(s, put).await.0
}

/// Puts one record and returns its sequence number.
pub async fn put_one_seq(s: &TestStream, put: &Put) -> String {
    put_one_at(s, put).await.1
}

/// Puts one record into `stream` with `client` (for a producer task that holds no
/// [`TestStream`]) and returns the shard it landed in.
pub async fn put_one_with(client: &aws_sdk_kinesis::Client, stream: &str, put: &Put) -> String {
    put_one_into(client, stream, put).await.0
}

/// Puts one record; returns (shard, sequence number).
async fn put_one_at(s: &TestStream, put: &Put) -> (String, String) {
    put_one_into(&s.client, &s.name, put).await
}

async fn put_one_into(client: &aws_sdk_kinesis::Client, stream: &str, (pk, ehk, data): &Put) -> (String, String) {
    let out = client
        .put_record()
        .stream_name(stream)
        .partition_key(pk)
        .set_explicit_hash_key(ehk.clone())
        .data(Blob::new(data.clone()))
        .send()
        .await
        .expect("PutRecord");
    (out.shard_id().to_string(), out.sequence_number().to_string())
}

/// `per_key` more audit records of each key, numbered on from `counts` (which this advances), in
/// the order a producer makes them: round by round, every key once per round.
fn audit_users(run: &str, keys: &[String], per_key: u64, counts: &mut BTreeMap<String, u64>) -> Vec<UserPut> {
    let mut users = Vec::new();
    for _ in 0..per_key {
        for k in keys {
            let seq = counts.entry(k.clone()).or_default();
            users.push((k.clone(), AuditPayload::new(run, k, *seq, 0).to_bytes()));
            *seq += 1;
        }
    }
    users
}

/// Writes `per_key` more audit records of each key as the KPL would: grouped by the open shard
/// their key hashes to, `per_aggregate` user records per aggregated record packed by the reference
/// aggregator, each shard's aggregates put in order. Adds what it wrote to `counts`.
pub async fn put_reference(
    s: &TestStream,
    run: &str,
    keys: &[String],
    per_key: u64,
    per_aggregate: usize,
    counts: &mut BTreeMap<String, u64>,
) {
    let shards = kinesis::list_shards(&s.client, &s.label(), &s.name).await.unwrap();
    let open: Vec<&ShardDescription> = shards.iter().filter(|d| !d.closed).collect();
    let mut puts: Vec<(String, Put)> = Vec::new();
    for shard in &open {
        let (lo, hi) = range(shard);
        let mine: Vec<String> =
            keys.iter().filter(|k| (lo..=hi).contains(&kpl::partition_key_hash(k.as_str()))).cloned().collect();
        let users = audit_users(run, &mine, per_key, counts);
        let groups: Vec<Vec<UserPut>> = users.chunks(per_aggregate).map(<[_]>::to_vec).collect();
        if groups.is_empty() {
            continue;
        }
        for agg in reference_aggregate(&groups) {
            assert!(agg.2.starts_with(&kpl::MAGIC), "the reference aggregator wrote the KPL format");
            puts.push((shard.shard_id.clone(), agg));
        }
    }
    for (shard, put) in &puts {
        assert_eq!(&put_one(s, put).await, shard, "no reshard while putting: each aggregate lands where predicted");
    }
}

/// Writes `per_key` more audit records of each key as AWS's aggregation library writes them from a
/// Lambda producer (`aws-kinesis-agg`, awslabs/kinesis-aggregation): user records of ANY keys packed
/// in the order they come, `per_aggregate` per aggregated record by the reference aggregator, each
/// aggregate put with its first user record's partition key and explicit hash key (so it lands where
/// that record's key hashes), and never sent again. Adds what it wrote to `counts`; returns how many
/// user records landed in a shard whose hash range does not hold their own key.
pub async fn put_lambda_style(
    s: &TestStream,
    run: &str,
    keys: &[String],
    per_key: u64,
    per_aggregate: usize,
    counts: &mut BTreeMap<String, u64>,
) -> u64 {
    let users = audit_users(run, keys, per_key, counts);
    let groups: Vec<Vec<UserPut>> = users.chunks(per_aggregate).map(<[_]>::to_vec).collect();
    let ranges: BTreeMap<String, (u128, u128)> = kinesis::list_shards(&s.client, &s.label(), &s.name)
        .await
        .unwrap()
        .iter()
        .map(|d| (d.shard_id.clone(), range(d)))
        .collect();
    let mut outside = 0;
    for (agg, group) in reference_aggregate(&groups).iter().zip(&groups) {
        assert!(agg.2.starts_with(&kpl::MAGIC), "the reference aggregator wrote the KPL format");
        assert_eq!(agg.0, group[0].0, "an aggregate is put with its first user record's partition key");
        let (lo, hi) = ranges[&put_one(s, agg).await];
        outside += group.iter().filter(|(k, _)| !(lo..=hi).contains(&kpl::partition_key_hash(k))).count() as u64;
    }
    outside
}

/// How many user records a KPL-like producer put, and sent again.
#[derive(Debug, Default, Clone, Copy)]
pub struct KplPut {
    /// User records of aggregates that landed on another shard than predicted, sent again.
    pub resent: u64,
    /// Of those, the ones in an aggregate that held a user record outside the shard it landed on.
    pub resent_mixed: u64,
    /// User records that landed in a shard whose hash range does not hold their key.
    pub outside: u64,
    /// Aggregates that landed on another shard than predicted (each sent again).
    pub resent_aggregates: u64,
}

impl std::ops::AddAssign for KplPut {
    fn add_assign(&mut self, o: Self) {
        self.resent += o.resent;
        self.resent_mixed += o.resent_mixed;
        self.outside += o.outside;
        self.resent_aggregates += o.resent_aggregates;
    }
}

/// Writes `per_key` more audit records of each key as the KPL does with the shard map `map` it
/// has (which may be stale): user records grouped by the open shard `map` predicts for their
/// key, `per_aggregate` per aggregate (packed by the reference aggregator), each put with its
/// first user record's key. An aggregate that lands on another shard than predicted (the map is
/// stale: a split since) is sent again WHOLE, as the KPL does: each of its user records, grouped
/// and aggregated by the fresh shard map. Adds what it wrote to `counts`.
pub async fn put_kpl_like(
    s: &TestStream,
    run: &str,
    keys: &[String],
    per_key: u64,
    per_aggregate: usize,
    map: &[ShardDescription],
    counts: &mut BTreeMap<String, u64>,
) -> KplPut {
    let now = kinesis::list_shards(&s.client, &s.label(), &s.name).await.unwrap();
    let ranges: BTreeMap<String, (u128, u128)> = now.iter().map(|d| (d.shard_id.clone(), range(d))).collect();
    let fresh: Vec<ShardDescription> = now.iter().filter(|d| !d.closed).cloned().collect();
    let group = |map: &[ShardDescription], users: &[UserPut]| {
        let mut out: Vec<(String, Vec<Vec<UserPut>>)> = Vec::new();
        for shard in map.iter().filter(|d| !d.closed) {
            let (lo, hi) = range(shard);
            let mine: Vec<UserPut> =
                users.iter().filter(|(k, _)| (lo..=hi).contains(&kpl::partition_key_hash(k))).cloned().collect();
            if !mine.is_empty() {
                out.push((shard.shard_id.clone(), mine.chunks(per_aggregate).map(<[_]>::to_vec).collect()));
            }
        }
        out
    };
    let users = audit_users(run, keys, per_key, counts);
    let mut put = KplPut::default();
    for (predicted, groups) in group(map, &users) {
        for (agg, g) in reference_aggregate(&groups).iter().zip(&groups) {
            let landed = put_one(s, agg).await;
            let (lo, hi) = ranges[&landed];
            let outside = g.iter().filter(|(k, _)| !(lo..=hi).contains(&kpl::partition_key_hash(k))).count() as u64;
            put.outside += outside;
            if landed != predicted {
                // "Wrong Shard": every user record of the aggregate again, with the fresh map.
                put.resent += g.len() as u64;
                put.resent_aggregates += 1;
                if outside > 0 {
                    put.resent_mixed += g.len() as u64;
                }
                for (shard, again) in group(&fresh, g) {
                    for a in reference_aggregate(&again) {
                        assert_eq!(put_one(s, &a).await, shard, "the fresh map predicts right");
                    }
                }
            }
        }
    }
    put
}

/// The manifest of what a KPL writer of this module wrote (`counts`).
pub fn manifest(run: &str, stream: &str, counts: &BTreeMap<String, u64>) -> Manifest {
    Manifest { run: run.into(), stream: stream.into(), counts: counts.clone(), total: counts.values().sum() }
}

/// The worker statuses' KPL counters, summed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Kpl {
    pub aggregates: u64,
    pub users: u64,
    pub out_of_range: u64,
    pub dropped: u64,
    pub dropped_aggregates: u64,
    pub corrupt: u64,
}

/// The KPL counters of the cluster's live workers (their status znodes), summed.
pub async fn kpl_counters(cluster: &Cluster) -> Kpl {
    let zk = super::zk_client().await;
    let mut t = Kpl::default();
    for w in super::ops::worker_statuses(&zk, cluster).await {
        let k = &w["kpl"];
        let n = |f: &str| k[f].as_u64().unwrap_or(0);
        t.aggregates += n("aggregates");
        t.users += n("user_records");
        t.out_of_range += n("out_of_range");
        t.dropped += n("dropped");
        t.dropped_aggregates += n("dropped_aggregates");
        t.corrupt += n("corrupt");
    }
    t
}

/// Polls the KPL counters until `done` holds (worker statuses are refreshed every few seconds),
/// 30 s at most.
pub async fn wait_counters(cluster: &Cluster, done: impl Fn(&Kpl) -> bool) -> Kpl {
    let mut last = Kpl::default();
    for _ in 0..150 {
        last = kpl_counters(cluster).await;
        if done(&last) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    last
}

/// One user record of a stream, as the spout emits it: the Kinesis record's shard and
/// arrival time, the user record's partition key and data (a plain record is its own user record).
#[derive(Debug, Clone)]
pub struct UserRecord {
    pub shard: String,
    pub arrival_ms: i64,
    pub partition_key: String,
    pub data: bytes::Bytes,
    /// Whether the user record's hash key lies outside the hash range of the shard it is in.
    pub outside: bool,
    /// Whether it came out of an aggregate.
    pub aggregated: bool,
}

/// Every user record of `stream`, read back from TRIM_HORIZON on every shard (closed ones too)
/// and de-aggregated with the spout's own de-aggregation (`squall::kinesis::kpl::deaggregate`).
/// Corrupt aggregates are taken whole, as the spout delivers them.
pub async fn deaggregated(stream: &TestStream) -> Vec<UserRecord> {
    let shards = kinesis::list_shards(&stream.client, &stream.label(), &stream.name).await.unwrap();
    let ranges: BTreeMap<String, (u128, u128)> = shards.iter().map(|d| (d.shard_id.clone(), range(d))).collect();
    let mut out = Vec::new();
    for shard in &shards {
        let (lo, hi) = ranges[&shard.shard_id];
        for r in read_shard(stream, &shard.shard_id).await {
            let arrival_ms = r.approximate_arrival_timestamp().and_then(|t| t.to_millis().ok()).unwrap_or(0);
            let data = bytes::Bytes::copy_from_slice(r.data().as_ref());
            match kpl::deaggregate(&data) {
                Deaggregated::Records(users) => {
                    for u in users {
                        out.push(UserRecord {
                            shard: shard.shard_id.clone(),
                            arrival_ms,
                            partition_key: u.partition_key.to_string(),
                            outside: !(lo..=hi).contains(&u.hash_key()),
                            data: u.data.clone(),
                            aggregated: true,
                        });
                    }
                }
                Deaggregated::Plain | Deaggregated::Corrupt(_) => out.push(UserRecord {
                    shard: shard.shard_id.clone(),
                    arrival_ms,
                    partition_key: r.partition_key().to_string(),
                    outside: false,
                    data,
                    aggregated: false,
                }),
            }
        }
    }
    out
}

/// Every record of one shard, from TRIM_HORIZON to its end (closed) or to the latest (open).
async fn read_shard(stream: &TestStream, shard: &str) -> Vec<aws_sdk_kinesis::types::Record> {
    let mut out = Vec::new();
    let mut it = stream
        .client
        .get_shard_iterator()
        .stream_name(&stream.name)
        .shard_id(shard)
        .shard_iterator_type(aws_sdk_kinesis::types::ShardIteratorType::TrimHorizon)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GetShardIterator of {} {shard}: {e:?}", stream.name))
        .shard_iterator;
    while let Some(i) = it.take() {
        let r = stream
            .client
            .get_records()
            .shard_iterator(i)
            .limit(10_000)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GetRecords of {} {shard}: {e:?}", stream.name));
        let caught_up = r.records().is_empty() && r.millis_behind_latest().unwrap_or(0) == 0;
        out.extend(r.records().iter().cloned());
        if caught_up {
            break;
        }
        it = r.next_shard_iterator().map(String::from);
    }
    out
}

/// What exactly-once counting of `records` must end with: per partition key, or with
/// `window_ms` per `{partition_key}@{window start}` of the record's arrival time (the
/// aggregate's, as the spout stamps each of its user records), as `exactly_once_counts` keys them.
pub fn counts_of(records: &[UserRecord], window_ms: Option<u64>) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for r in records {
        let key = match window_ms {
            Some(w) => {
                let at = u64::try_from(r.arrival_ms).unwrap_or(0);
                format!("{}@{}", r.partition_key, at - at % w)
            }
            None => r.partition_key.clone(),
        };
        *out.entry(key).or_default() += 1;
    }
    out
}

/// What a [`KplProducer`] wrote.
#[derive(Debug, Default, Clone)]
pub struct Produced {
    /// The KPL-like producer's records per key (what it meant to write once).
    pub kpl_like: BTreeMap<String, u64>,
    /// The Lambda-style producer's records per key.
    pub lambda: BTreeMap<String, u64>,
    /// The KPL-like producer's re-sends and out-of-range user records.
    pub kpl: KplPut,
    /// Lambda-style user records that landed in a shard whose range does not hold their key.
    pub lambda_outside: u64,
    /// Rounds put.
    pub rounds: u64,
}

/// Both producer styles writing into one stream in the background, round after round until
/// [`KplProducer::finish`]: each round, `per_round` user records of each of its keys from the
/// KPL-like producer ([`put_kpl_like`], with the shard map it had at its start until
/// [`KplProducer::refresh_map`]: stale after a reshard, so it re-sends whole aggregates) and as
/// many from the Lambda-style one ([`put_lambda_style`], its keys rotated by three each round so
/// that the keys routing its aggregates vary), `per_aggregate` user records per aggregate, then
/// a pause.
pub struct KplProducer {
    handle: tokio::task::JoinHandle<Produced>,
    splits: tokio::sync::mpsc::UnboundedSender<(String, tokio::sync::oneshot::Sender<()>)>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    refresh: std::sync::Arc<std::sync::atomic::AtomicBool>,
    rounds: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl KplProducer {
    /// Starts writing into `stream`; `kpl_keys` and `lambda_keys` should be disjoint, so that
    /// a key's truth is attributable to one producer style.
    pub async fn start(
        stream: &TestStream,
        kpl_keys: Vec<String>,
        lambda_keys: Vec<String>,
        per_round: u64,
        per_aggregate: usize,
        pause: Duration,
    ) -> KplProducer {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let stop = Arc::new(AtomicBool::new(false));
        let refresh = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicU64::new(0));
        // the stream belongs to the test: never deleted from here, even when a round panics
        let s = std::mem::ManuallyDrop::new(TestStream::existing(&stream.name).await);
        let mut map = kinesis::list_shards(&s.client, &s.label(), &s.name).await.unwrap();
        let (stop2, refresh2, rounds2) = (stop.clone(), refresh.clone(), rounds.clone());
        let (splits, mut split_rx) =
            tokio::sync::mpsc::unbounded_channel::<(String, tokio::sync::oneshot::Sender<()>)>();
        let handle = tokio::spawn(async move {
            let mut p = Produced::default();
            while !stop2.load(Ordering::SeqCst) {
                // reshards between rounds: a writer's view of the shards holds for a round
                while let Ok((shard, done)) = split_rx.try_recv() {
                    kinesis::split_shard(&s.client, &s.label(), &s.name, &shard).await.unwrap();
                    let _ = done.send(());
                }
                if refresh2.swap(false, Ordering::SeqCst) {
                    map = kinesis::list_shards(&s.client, &s.label(), &s.name).await.unwrap();
                }
                p.kpl += put_kpl_like(&s, "kpllike", &kpl_keys, per_round, per_aggregate, &map, &mut p.kpl_like).await;
                // the keys in another order each round, so that the aggregates' first keys (which
                // route them) vary, and every key is read from every shard
                let mut order = lambda_keys.clone();
                let by = (p.rounds as usize * 3) % order.len().max(1);
                order.rotate_left(by);
                p.lambda_outside +=
                    put_lambda_style(&s, "kpllambda", &order, per_round, per_aggregate, &mut p.lambda).await;
                p.rounds += 1;
                rounds2.store(p.rounds, Ordering::SeqCst);
                tokio::time::sleep(pause).await;
            }
            p
        });
        KplProducer { handle, splits, stop, refresh, rounds }
    }

    /// Splits `shard` of the stream between two rounds (in the middle of its hash range), while
    /// the writers keep going.
    pub async fn split(&self, shard: &str) {
        let (done, rx) = tokio::sync::oneshot::channel();
        self.splits.send((shard.to_string(), done)).expect("the KPL producer stopped");
        rx.await.expect("the KPL producer stopped before the split");
    }

    /// Rounds put so far.
    pub fn rounds(&self) -> u64 {
        self.rounds.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Waits until `n` more rounds were put (60 s at most).
    pub async fn wait_rounds(&self, n: u64) {
        let until = self.rounds() + n;
        let start = std::time::Instant::now();
        while self.rounds() < until {
            assert!(!self.handle.is_finished(), "the KPL producer stopped");
            assert!(start.elapsed() < Duration::from_secs(60), "the KPL producer put no {n} rounds in 60 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// From the next round on, the KPL-like producer uses the stream's current shard map (the
    /// KPL refreshes it after a record landed on another shard than predicted).
    pub fn refresh_map(&self) {
        self.refresh.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Stops after the current round; what was written.
    pub async fn finish(self) -> Produced {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.handle.await.expect("the KPL producer panicked")
    }
}
