//! Operating a test cluster from the outside, as an operator or a producer would: the `squall`
//! binary (status, activate, deactivate, checkpoints reset), records aimed at one shard (explicit
//! hash keys, so each shard gets its own manifest), raw znode reads, and polling with a "never
//! happened" guard.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::process::Command;
use std::time::{Duration, Instant};

use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use squall::kinesis::payload::{AuditPayload, Manifest};

use super::workers::Cluster;

/// The `squall` binary, pointed at the cluster's ZooKeeper root and the Kinesis engine.
pub fn squall(cluster: &Cluster) -> Command {
    let mut c = Command::new(super::squall_bin());
    c.env("SQUALL_ZK", super::zk_connect())
        .env("SQUALL_ZK_ROOT", &cluster.zk_root)
        .env("SQUALL_KINESIS_ENDPOINT", super::kinesis_endpoint().endpoint)
        .env_remove("RUST_LOG");
    c
}

/// Runs `squall ARGS`: exit code, stdout, stderr.
pub fn squall_run(cluster: &Cluster, args: &[&str]) -> (i32, String, String) {
    let out = squall(cluster).args(args).output().expect("run the squall binary");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The JSON lines of a file (missing file: none; unparsable lines skipped).
pub fn json_lines(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// Asserts that the watermarks a window example logged (`--watermarks`: `{task, watermark}`
/// lines) only move forward per task; returns how many there were.
pub fn assert_watermarks_monotonic(path: &std::path::Path) -> usize {
    let mut last: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    let ws = json_lines(path);
    for w in &ws {
        let (task, wm) = (w["task"].as_u64().unwrap(), w["watermark"].as_u64().unwrap());
        if let Some(prev) = last.insert(task, wm) {
            assert!(wm > prev, "watermark moved backwards or repeated at task {task}: {prev} then {wm}");
        }
    }
    ws.len()
}

/// Runs `squall ARGS` and panics (with the worker logs) unless it exits 0. Returns stdout.
pub fn squall_ok(cluster: &Cluster, args: &[&str]) -> String {
    let (rc, out, err) = squall_run(cluster, args);
    assert_eq!(rc, 0, "`squall {}` failed: {out}{err}\n{}", args.join(" "), cluster.logs());
    out
}

/// `squall status TOPOLOGY --json`, parsed.
pub fn status_json(cluster: &Cluster) -> serde_json::Value {
    let out = squall_ok(cluster, &["status", &cluster.topology, "--json"]);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("`squall status --json` printed no JSON ({e}): {out}"))
}

/// The shard entry `shard` of the first stream in a status report.
pub fn status_shard<'a>(status: &'a serde_json::Value, shard: &str) -> Option<&'a serde_json::Value> {
    status["streams"][0]["shards"].as_array()?.iter().find(|s| s["shard_id"] == shard)
}

/// Polls `f` every 200 ms until it returns `Some`, and returns that. Panics after `guard` (a
/// "never happened" guard, not a timing assertion) with `what` and the cluster's logs.
pub async fn wait_for<T, F, Fut>(cluster: &Cluster, what: &str, guard: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(start.elapsed() < guard, "{what}: never happened within {guard:?}\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Writes `count` audit records over `keys` partition keys (`{prefix}0`..), every one with the
/// explicit hash key `hash_key`, so all of them land in the shard whose range holds it. Per-key
/// sequences are in order (one PutRecords call holds at most one record per key).
pub async fn put_to_shard(
    client: &aws_sdk_kinesis::Client,
    stream: &str,
    hash_key: &str,
    prefix: &str,
    count: u64,
    keys: u64,
) -> Manifest {
    let run = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    let names: Vec<String> = (0..keys).map(|i| format!("{prefix}{i}")).collect();
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut written = 0;
    let mut failures = 0;
    while written < count {
        let batch: Vec<(String, u64)> = (written..count.min(written + keys))
            .map(|n| {
                let key = names[(n % keys) as usize].clone();
                let seq = counts.get(&key).copied().unwrap_or(0);
                (key, seq)
            })
            .collect();
        let entries: Vec<PutRecordsRequestEntry> = batch
            .iter()
            .map(|(key, seq)| {
                PutRecordsRequestEntry::builder()
                    .partition_key(key.clone())
                    .explicit_hash_key(hash_key)
                    .data(Blob::new(AuditPayload::new(&run, key, *seq, 0).to_bytes()))
                    .build()
                    .expect("record entry")
            })
            .collect();
        let out = client.put_records().stream_name(stream).set_records(Some(entries)).send().await;
        let ok = out.as_ref().is_ok_and(|o| o.failed_record_count().unwrap_or(0) == 0);
        if !ok {
            failures += 1;
            assert!(failures < 10, "putting records to {stream} (hash key {hash_key}) keeps failing: {out:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        for (key, _) in batch {
            *counts.entry(key).or_default() += 1;
            written += 1;
        }
    }
    Manifest { run, stream: stream.to_string(), counts, total: written }
}

/// The shards of a stream (open and closed), sorted by id.
pub async fn list_shards(client: &aws_sdk_kinesis::Client, stream: &str) -> Vec<squall::kinesis::ShardDescription> {
    squall::kinesis::list_shards(client, "test", stream).await.unwrap_or_else(|e| panic!("listing {stream}: {e}"))
}

/// A stream's ARN (DescribeStreamSummary).
pub async fn stream_arn(client: &aws_sdk_kinesis::Client, stream: &str) -> String {
    client
        .describe_stream_summary()
        .stream_name(stream)
        .send()
        .await
        .unwrap_or_else(|e| panic!("describing {stream}: {e:?}"))
        .stream_description_summary
        .unwrap_or_else(|| panic!("{stream} has no description"))
        .stream_arn
}

/// A znode's data as JSON (None when it does not exist or is not JSON).
pub async fn znode_json(zk: &zookeeper_client::Client, path: &str) -> Option<serde_json::Value> {
    let (data, _) = zk.get_data(path).await.ok()?;
    serde_json::from_slice(&data).ok()
}

/// Whether a znode exists.
pub async fn znode_exists(zk: &zookeeper_client::Client, path: &str) -> bool {
    matches!(zk.check_stat(path).await, Ok(Some(_)))
}

/// The shard ids named in the stream's `shards` znode.
pub async fn listed_shards(zk: &zookeeper_client::Client, cluster: &Cluster) -> Vec<String> {
    let list = znode_json(zk, &format!("{}/shards", cluster.stream_path())).await;
    list.and_then(|l| {
        l["shards"].as_array().map(|a| a.iter().filter_map(|s| s["shard_id"].as_str().map(str::to_string)).collect())
    })
    .unwrap_or_default()
}

/// Every worker status znode of the topology, parsed.
pub async fn worker_statuses(zk: &zookeeper_client::Client, cluster: &Cluster) -> Vec<serde_json::Value> {
    let dir = format!("{}/topologies/{}/workers", cluster.zk_root, cluster.topology);
    let mut out = Vec::new();
    for w in zk.list_children(&dir).await.unwrap_or_default() {
        if let Some(v) = znode_json(zk, &format!("{dir}/{w}")).await {
            out.push(v);
        }
    }
    out
}

/// Lines of the worker logs of the cluster's directory containing every needle.
pub fn log_lines(cluster: &Cluster, needles: &[&str]) -> Vec<String> {
    super::reliability::grep_logs(&cluster.dir, needles[0])
        .into_iter()
        .filter(|l| needles.iter().all(|n| l.contains(n)))
        .collect()
}

/// Two adjacent open shards of the stream (for a merge), if any.
pub async fn adjacent_open(s: &super::TestStream) -> Option<(String, String)> {
    let mut open: Vec<_> = squall::kinesis::list_shards(&s.client, &s.label(), &s.name)
        .await
        .ok()?
        .into_iter()
        .filter(|d| !d.closed)
        .collect();
    open.sort_by_key(|d| d.starting_hash_key.parse::<u128>().unwrap_or(0));
    open.windows(2).find_map(|w| {
        let end: u128 = w[0].ending_hash_key.parse().ok()?;
        let start: u128 = w[1].starting_hash_key.parse().ok()?;
        (end + 1 == start).then(|| (w[0].shard_id.clone(), w[1].shard_id.clone()))
    })
}

/// Round trips of the Kinesis engine, sampled while a test's workers use it: the service's own
/// latency, which a test bounding a product latency adds to the product's terms (the engine in
/// the suite answers one request at a time and slows down under the other tests' load).
pub struct RoundTrips {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<Vec<RoundTrip>>,
}

/// One sampled call: what it was, when it started (ms since the epoch) and how long it took.
#[derive(Clone, Copy, Debug)]
pub struct RoundTrip {
    pub put: bool,
    pub at_ms: i64,
    pub ms: i64,
}

impl RoundTrips {
    /// Every `every`, one GetRecords on each open shard of each of `read` (iterators from LATEST,
    /// so nothing is consumed that the workers read) and, with `probe` (a stream of the test's
    /// own, nobody reads it), one PutRecords of one small record. A stream of `read` that does
    /// not exist yet is looked up again at the next round.
    pub fn start(client: &aws_sdk_kinesis::Client, read: &[&str], probe: Option<&str>, every: Duration) -> Self {
        use aws_sdk_kinesis::types::ShardIteratorType;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (client, stop2) = (client.clone(), stop.clone());
        let read: Vec<String> = read.iter().map(|s| s.to_string()).collect();
        let probe = probe.map(str::to_string);
        let task = tokio::spawn(async move {
            let mut its: BTreeMap<(String, String), String> = BTreeMap::new();
            let mut out = Vec::new();
            while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                for stream in &read {
                    let Ok(shards) = squall::kinesis::list_shards(&client, "round trips", stream).await else {
                        continue;
                    };
                    for sh in shards.iter().filter(|s| !s.closed) {
                        let key = (stream.clone(), sh.shard_id.clone());
                        if its.contains_key(&key) {
                            continue;
                        }
                        if let Ok(r) = client
                            .get_shard_iterator()
                            .stream_name(stream)
                            .shard_id(&sh.shard_id)
                            .shard_iterator_type(ShardIteratorType::Latest)
                            .send()
                            .await
                            && let Some(it) = r.shard_iterator
                        {
                            its.insert(key, it);
                        }
                    }
                }
                let keys: Vec<_> = its.keys().cloned().collect();
                for key in keys {
                    let (at_ms, t0) = (squall::coord::now_ms(), Instant::now());
                    let r = client.get_records().shard_iterator(its[&key].as_str()).send().await;
                    out.push(RoundTrip { put: false, at_ms, ms: t0.elapsed().as_millis() as i64 });
                    match r.ok().and_then(|r| r.next_shard_iterator) {
                        Some(next) => {
                            its.insert(key, next);
                        }
                        None => {
                            its.remove(&key);
                        }
                    }
                }
                if let Some(p) = &probe {
                    let (at_ms, t0) = (squall::coord::now_ms(), Instant::now());
                    let entry =
                        PutRecordsRequestEntry::builder().partition_key("probe").data(Blob::new(b"p".to_vec())).build();
                    if client.put_records().stream_name(p).records(entry.expect("a probe record")).send().await.is_ok()
                    {
                        out.push(RoundTrip { put: true, at_ms, ms: t0.elapsed().as_millis() as i64 });
                    }
                }
                tokio::time::sleep(every).await;
            }
            out
        });
        RoundTrips { stop, task }
    }

    /// Stops sampling; the samples.
    pub async fn stop(self) -> RoundTripSamples {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        RoundTripSamples(self.task.await.expect("the round-trip sampler"))
    }
}

/// The samples of [`RoundTrips`].
pub struct RoundTripSamples(pub Vec<RoundTrip>);

impl RoundTripSamples {
    /// How many GetRecords (`put` false) or PutRecords calls were sampled.
    pub fn count(&self, put: bool) -> usize {
        self.0.iter().filter(|s| s.put == put).count()
    }

    /// The longest call of the kind that was in flight at some time in `from_ms..=to_ms`
    /// (0 when none was).
    pub fn max_during(&self, put: bool, from_ms: i64, to_ms: i64) -> i64 {
        self.0
            .iter()
            .filter(|s| s.put == put && s.at_ms <= to_ms && s.at_ms + s.ms >= from_ms)
            .map(|s| s.ms)
            .max()
            .unwrap_or(0)
    }

    /// Longest and median call of the kind over the whole run.
    pub fn max_and_median(&self, put: bool) -> (i64, i64) {
        let mut v: Vec<i64> = self.0.iter().filter(|s| s.put == put).map(|s| s.ms).collect();
        v.sort_unstable();
        (v.last().copied().unwrap_or(0), v.get(v.len() / 2).copied().unwrap_or(0))
    }
}
