//! End-to-end Kinesis benchmarks of Squall (`cargo bench --bench kinesis`, part of `make bench`).
//!
//! Sections (run all, or name some: `cargo bench --bench kinesis -- throughput memory`):
//!
//! - `throughput` (b): one pre-filled multi-shard stream per engine, read from TRIM_HORIZON by a
//!   raw aws-sdk-kinesis GetRecords loop (one task per shard, no pauses) and by a topology
//!   (Kinesis spout -> no-op bolt, acking on, fresh topology name and ZooKeeper root each time),
//!   interleaved raw, topology, raw, topology..., medians. On kinesis-local (LocalStack's engine,
//!   `SQUALL_KINESIS_ENDPOINT`) and kinesalite (`SQUALL_KINESALITE_ENDPOINT`).
//! - `reshard` (c): an audit worker process reads a 2-shard stream under a steady producer; shards
//!   are split one after another; latency = from the parent's `end` in the read log to the first
//!   delivery of a child record.
//! - `failover` (d, e): two worker processes share a 4-shard stream; a worker joins, leaves
//!   (SIGTERM) and crashes (SIGKILL); latency = from the event to the first records read by the
//!   new owner of every moved shard. While both run, checkpoint znode versions (and every znode
//!   version of the topology) are counted over a timed window: ZooKeeper writes per shard per
//!   checkpoint interval.
//! - `memory` (f): one worker process owning 50 shards, each with a backlog of 10,000 records of
//!   1 KB (500 MB) put before the worker starts (parallel PutRecords of 500); VmRSS sampled from
//!   /proc every 250 ms while it works through the backlog, then 30 s of steady state under a
//!   50 rec/s producer; VmHWM (peak); records/s of the catch-up. On kinesalite by default
//!   (kinesis-local's puts slow down as the stream fills: 500 MB would take hours);
//!   `SQUALL_BENCH_MEMORY_ENGINE=kinesis-local` and `SQUALL_BENCH_MEMORY_BACKLOG` (records per
//!   shard, default 10000) change that.
//! - `stages` (g): the cost of a stage boundary. Throughput: a pre-filled 4-shard stream read by
//!   a fresh in-process worker (`squall::stage::run`): spout -> keyer (one tuple per record,
//!   keyed by its partition key) -> count (fields grouping), in one stage or with a boundary (a
//!   4-shard intermediate stream) between keyer and count; records/s until every record was
//!   counted, interleaved one, two, one, two..., on kinesis-local and kinesalite. Latency: from a
//!   record's put (a timestamp in its payload) to the counting bolt under a steady 200 rec/s
//!   producer on kinesis-local (`SQUALL_BENCH_STAGE_LATENCY_REPS` rounds, default 2; 0 skips;
//!   `SQUALL_BENCH_STAGE_LATENCY_ENGINE=kinesalite` moves it). Cost: the intermediate stream is
//!   read back: records written per source record, control records as a share of data records,
//!   against the writer's bound P x S / interval. `SQUALL_BENCH_STAGE_PENDING` sets the
//!   worker's `--max-spout-pending` (default 1000, the product default);
//!   `SQUALL_BENCH_STAGE_ENGINES` (e.g. `kinesalite`, or `none`) limits the throughput part.
//!
//! Needs ZooKeeper and the engines on loopback (`make bench` starts them) and the audit example
//! built in the same profile (`cargo build --release --examples`). `SQUALL_BENCH_REPS` sets the
//! throughput repetitions (default 5).

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::types::ShardIteratorType;
use clap::Parser;
use common::{median, unique, zk_client, zk_delete_tree};
use squall::audit::Delivery;
use squall::kinesis::{KinesisEndpoint, PutOptions};
use squall::spout::{KinesisSpout, KinesisSpoutConfig, ReadLogEntry, WorkerIdentity};
use squall::stage::{Boundary, Stages};
use squall::topology::{Bolt, BoltOutput, ComponentError, TopologyBuilder, TopologyConfig, Tuple, Value, run_local};

const REGION: &str = "us-east-1";

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
}

struct Env {
    kinesis_local: String,
    kinesalite: String,
    zk: String,
    audit_bin: PathBuf,
    reps: usize,
}

impl Env {
    fn load() -> anyhow::Result<Self> {
        let var = |k: &str, d: &str| std::env::var(k).ok().filter(|v| !v.is_empty()).unwrap_or_else(|| d.into());
        // target/<profile>/deps/kinesis-HASH -> target/<profile>/examples/audit
        let exe = std::env::current_exe()?;
        let profile_dir = exe.parent().and_then(Path::parent).context("bench binary has no target dir")?;
        let audit_bin = profile_dir.join("examples").join("audit");
        Ok(Self {
            kinesis_local: var("SQUALL_KINESIS_ENDPOINT", "http://127.0.0.1:4566"),
            kinesalite: var("SQUALL_KINESALITE_ENDPOINT", "http://127.0.0.1:4568"),
            zk: var("SQUALL_ZK", "127.0.0.1:2181"),
            audit_bin,
            reps: var("SQUALL_BENCH_REPS", "5").parse().unwrap_or(5).max(1),
        })
    }

    fn need_audit_bin(&self) -> anyhow::Result<()> {
        if !self.audit_bin.exists() {
            bail!(
                "{} missing: build it first with `cargo build --release --examples` (make bench does)",
                self.audit_bin.display()
            );
        }
        Ok(())
    }
}

async fn client(endpoint: &str) -> anyhow::Result<Client> {
    Ok(KinesisEndpoint::new(endpoint, REGION).client().await?)
}

async fn reachable(client: &Client) -> bool {
    tokio::time::timeout(Duration::from_secs(3), client.list_streams().send()).await.is_ok_and(|r| r.is_ok())
}

/// Sum of `version` and `cversion` of every znode under `root`, and the versions of the nodes
/// directly under `checkpoints` (by shard).
async fn zk_versions(zk: &zookeeper_client::Client, root: &str) -> (i64, BTreeMap<String, i32>) {
    let mut total = 0i64;
    let mut checkpoints = BTreeMap::new();
    let mut stack = vec![root.to_string()];
    while let Some(p) = stack.pop() {
        if let Ok(Some(st)) = zk.check_stat(&p).await {
            total += i64::from(st.version) + i64::from(st.cversion);
            if let Some((dir, shard)) = p.rsplit_once('/')
                && dir.ends_with("/checkpoints")
            {
                checkpoints.insert(shard.to_string(), st.version);
            }
        }
        for c in zk.list_children(&p).await.unwrap_or_default() {
            stack.push(format!("{p}/{c}"));
        }
    }
    (total, checkpoints)
}

/// Creates a stream and waits until it is ACTIVE.
async fn create_stream(client: &Client, endpoint: &str, shards: i32, prefix: &str) -> anyhow::Result<String> {
    let name = unique(prefix);
    squall::kinesis::create_stream(client, endpoint, &name, shards)
        .await
        .with_context(|| format!("creating stream {name} on {endpoint}"))?;
    Ok(name)
}

/// Writes `count` records with `producers` concurrent producers (distinct keys, spread over the
/// shards by their hash).
async fn fill(client: &Client, endpoint: &str, stream: &str, count: u64, producers: u64) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for p in 0..producers {
        let (client, endpoint, stream) = (client.clone(), endpoint.to_string(), stream.to_string());
        let opts = PutOptions {
            count: count / producers + u64::from(p < count % producers),
            keys: 100,
            size: 100,
            key_prefix: format!("p{p}-key-"),
            ..PutOptions::default()
        };
        set.spawn(async move { squall::kinesis::put_records(&client, &endpoint, &stream, &opts).await });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    Ok(start.elapsed())
}

/// A steady background producer (aborted on drop): a small PutRecords every 25 ms, one fresh
/// partition key per record, so records arrive evenly on every shard. (The `squall stream put`
/// producer batches one record per key per call, which at low rates means one burst per second.)
struct Producer(tokio::task::JoinHandle<()>);

impl Producer {
    fn start(client: &Client, stream: &str, rate: f64) -> Self {
        let (client, stream) = (client.clone(), stream.to_string());
        Producer(tokio::spawn(async move {
            let tick = Duration::from_millis(25);
            let mut timer = tokio::time::interval(tick);
            timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let run = unique("live");
            let (mut n, start) = (0u64, Instant::now());
            loop {
                timer.tick().await;
                let due = (start.elapsed().as_secs_f64() * rate) as u64 + 1;
                let entries: Vec<_> = (n..due.max(n + 1))
                    .filter_map(|i| {
                        let key = format!("live-{i}");
                        let data = squall::kinesis::payload::AuditPayload::new(&run, &key, 0, 100).to_bytes();
                        aws_sdk_kinesis::types::PutRecordsRequestEntry::builder()
                            .partition_key(key)
                            .data(aws_sdk_kinesis::primitives::Blob::new(data))
                            .build()
                            .ok()
                    })
                    .collect();
                n += entries.len() as u64;
                if let Err(e) = client.put_records().stream_name(&stream).set_records(Some(entries)).send().await {
                    eprintln!("background producer on {stream}: {}", aws_sdk_kinesis::error::DisplayErrorContext(e));
                }
            }
        }))
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn delete_stream(client: &Client, endpoint: &str, stream: &str) {
    let _ = squall::kinesis::delete_stream(client, endpoint, stream).await;
}

// ---------------------------------------------------------------------------------------------
// (b) throughput

/// One read of the whole stream: when it started, when the first and the last record arrived.
#[derive(Debug, Clone, Copy)]
struct ReadRun {
    records: u64,
    start: Instant,
    first: Instant,
    last: Instant,
}

impl ReadRun {
    /// Records per second from the first record to the last (steady state).
    fn steady(&self) -> f64 {
        self.records.saturating_sub(1) as f64 / self.last.duration_since(self.first).as_secs_f64().max(1e-6)
    }
    /// Records per second from the start (client or topology creation) to the last record.
    fn total(&self) -> f64 {
        self.records as f64 / self.last.duration_since(self.start).as_secs_f64().max(1e-6)
    }
    fn startup_ms(&self) -> f64 {
        self.first.duration_since(self.start).as_secs_f64() * 1e3
    }
}

/// The raw loop: one task per shard, GetShardIterator(TRIM_HORIZON), GetRecords as fast as the
/// engine answers, until an empty answer that is not behind.
async fn raw_read(client: &Client, stream: &str, shards: &[String], limit: i32) -> anyhow::Result<ReadRun> {
    let start = Instant::now();
    let first: Arc<Mutex<Option<Instant>>> = Arc::default();
    let mut set = tokio::task::JoinSet::new();
    for shard in shards {
        let (client, stream, shard, first) = (client.clone(), stream.to_string(), shard.clone(), first.clone());
        set.spawn(async move {
            let mut it = client
                .get_shard_iterator()
                .stream_name(&stream)
                .shard_id(&shard)
                .shard_iterator_type(ShardIteratorType::TrimHorizon)
                .send()
                .await?
                .shard_iterator
                .context("no iterator")?;
            let mut n = 0u64;
            let mut last = Instant::now();
            loop {
                let out = client.get_records().shard_iterator(&it).limit(limit).send().await?;
                let got = out.records().len() as u64;
                if got > 0 {
                    last = Instant::now();
                    first.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(last);
                    n += got;
                }
                match out.next_shard_iterator() {
                    Some(next) if got > 0 || out.millis_behind_latest().unwrap_or(0) > 0 => it = next.to_string(),
                    _ => break,
                }
            }
            anyhow::Ok((n, last))
        });
    }
    let (mut records, mut last) = (0, start);
    while let Some(r) = set.join_next().await {
        let (n, l) = r??;
        records += n;
        last = last.max(l);
    }
    let first = first.lock().unwrap_or_else(|p| p.into_inner()).unwrap_or(last);
    Ok(ReadRun { records, start, first, last })
}

#[derive(Default)]
struct Seen {
    count: AtomicU64,
    times: Mutex<(Option<Instant>, Option<Instant>)>,
}

/// The no-op bolt: counts, notes the first and last arrival, acks (returns Ok).
struct Noop(Arc<Seen>);

impl Bolt for Noop {
    async fn execute(&mut self, _t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        let now = Instant::now();
        self.0.count.fetch_add(1, Ordering::Relaxed);
        let mut t = self.0.times.lock().unwrap_or_else(|p| p.into_inner());
        t.0.get_or_insert(now);
        t.1 = Some(now);
        Ok(())
    }
}

/// A fresh topology (own name and ZooKeeper root) reads the stream from TRIM_HORIZON until the
/// bolt saw `expect` records.
async fn topology_read(env: &Env, endpoint: &str, stream: &str, expect: u64, limit: i32) -> anyhow::Result<ReadRun> {
    let topo = unique("bench-tput");
    let root = format!("/{}", unique("squall-bench"));
    let mut cfg = KinesisSpoutConfig::new(topo.clone(), stream);
    cfg.kinesis = KinesisEndpoint::new(endpoint, REGION);
    cfg.zookeeper.connect = env.zk.clone();
    cfg.zookeeper.root = root.clone();
    cfg.records_per_get = limit;
    let seen = Arc::new(Seen::default());
    let start = Instant::now();
    let mut b = TopologyBuilder::new(topo.clone());
    KinesisSpout::declare(&mut b, "kinesis", 1, cfg, WorkerIdentity::current());
    let s = seen.clone();
    b.set_bolt("noop", 1, move |_| Noop(s.clone())).shuffle_grouping("kinesis");
    let topology = b.build().map_err(|e| anyhow::anyhow!("{e}"))?;
    let tcfg = TopologyConfig { max_spout_pending: 5000, ..TopologyConfig::default() };
    let running = run_local(topology, tcfg).map_err(|e| anyhow::anyhow!("{e}"))?;
    let deadline = Instant::now() + Duration::from_secs(180);
    while seen.count.load(Ordering::Relaxed) < expect {
        if Instant::now() > deadline || running.is_finished() {
            bail!("topology read {} of {expect} records", seen.count.load(Ordering::Relaxed));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let (first, last) = *seen.times.lock().unwrap_or_else(|p| p.into_inner());
    let records = seen.count.load(Ordering::Relaxed);
    running.kill(Duration::from_secs(5)).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    if let Ok(zk) = zk_client(&env.zk).await {
        zk_delete_tree(&zk, &root).await;
    }
    Ok(ReadRun { records, start, first: first.unwrap_or(start), last: last.unwrap_or(start) })
}

async fn throughput(env: &Env) -> anyhow::Result<()> {
    println!("\n## (b) end-to-end read throughput: topology vs raw GetRecords loop\n");
    let engines =
        [("kinesis-local", env.kinesis_local.clone(), 5_000u64), ("kinesalite", env.kinesalite.clone(), 25_000)];
    const SHARDS: i32 = 4;
    let mut summary = Vec::new();
    for (engine, endpoint, per_shard) in engines {
        let client = client(&endpoint).await?;
        if !reachable(&client).await {
            // a figure missing from a run that succeeds would read as measured: fail instead
            bail!("{engine} does not answer at {endpoint}: start it (localstack/up, localstack/kinesalite-up)");
        }
        let stream = create_stream(&client, &endpoint, SHARDS, "bench-tput").await?;
        let total = per_shard * SHARDS as u64;
        let took = fill(&client, &endpoint, &stream, total, 4).await?;
        let shards: Vec<String> =
            squall::kinesis::list_shards(&client, &endpoint, &stream).await?.into_iter().map(|s| s.shard_id).collect();
        println!(
            "{engine}: stream {stream}, {SHARDS} shards, {total} records of ~190 bytes, filled in {:.1} s ({:.0} rec/s)",
            took.as_secs_f64(),
            total as f64 / took.as_secs_f64()
        );
        println!();
        println!(
            "| engine | records/get | raw steady rec/s | topology steady rec/s | ratio (median of per-round) | raw incl. start | topology incl. start | ratio incl. start | topology start-up ms |"
        );
        println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
        for limit in [1000, 10_000] {
            // One warm-up read of each, not counted.
            raw_read(&client, &stream, &shards, limit).await?;
            topology_read(env, &endpoint, &stream, total, limit).await?;
            let (mut raw_s, mut top_s, mut raw_t, mut top_t, mut ratio_s, mut ratio_t, mut start_ms) =
                (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
            for _ in 0..env.reps {
                let r = raw_read(&client, &stream, &shards, limit).await?;
                if r.records != total {
                    bail!("raw loop read {} of {total} records on {engine}", r.records);
                }
                let t = topology_read(env, &endpoint, &stream, total, limit).await?;
                raw_s.push(r.steady());
                top_s.push(t.steady());
                raw_t.push(r.total());
                top_t.push(t.total());
                ratio_s.push(t.steady() / r.steady());
                ratio_t.push(t.total() / r.total());
                start_ms.push(t.startup_ms());
            }
            println!(
                "| {engine} | {limit} | {:.0} | {:.0} | **{:.2}** | {:.0} | {:.0} | {:.2} | {:.0} |",
                median(&raw_s),
                median(&top_s),
                median(&ratio_s),
                median(&raw_t),
                median(&top_t),
                median(&ratio_t),
                median(&start_ms)
            );
            summary.push(format!(
                "(b) {engine} records/get {limit}: steady ratio {:.2} (per-round {:?}), incl. start-up {:.2}",
                median(&ratio_s),
                ratio_s.iter().map(|r| (r * 100.0).round() / 100.0).collect::<Vec<_>>(),
                median(&ratio_t)
            ));
        }
        println!();
        delete_stream(&client, &endpoint, &stream).await;
    }
    for s in summary {
        println!("{s}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Worker processes (examples/audit.rs)

struct Cluster {
    topology: String,
    stream: String,
    root: String,
    dir: PathBuf,
    spout_config: PathBuf,
    session_timeout_ms: u64,
    endpoint: String,
    zk: String,
    bin: PathBuf,
}

struct Worker {
    name: String,
    child: Option<Child>,
    read_log: PathBuf,
    deliveries: PathBuf,
}

impl Worker {
    fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }
    fn signal(&self, sig: &str) {
        let _ = Command::new("kill").arg(format!("-{sig}")).arg(self.pid().to_string()).status();
    }
    /// SIGKILL: a crash.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
    /// SIGTERM, without waiting.
    fn term(&self) {
        self.signal("TERM");
    }
    fn reap(&mut self, timeout: Duration) {
        let Some(c) = self.child.as_mut() else { return };
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(Some(_)) = c.try_wait() {
                self.child = None;
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
    }
    fn reads(&self) -> Vec<ReadLogEntry> {
        read_log(std::slice::from_ref(&self.read_log))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}

fn read_log(files: &[PathBuf]) -> Vec<ReadLogEntry> {
    let mut out: Vec<ReadLogEntry> = files
        .iter()
        .flat_map(|f| std::fs::read_to_string(f).unwrap_or_default().lines().map(str::to_owned).collect::<Vec<_>>())
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect();
    out.sort_by_key(|e| e.t_ms);
    out
}

fn deliveries(files: &[PathBuf]) -> Vec<Delivery> {
    files
        .iter()
        .flat_map(|f| std::fs::read_to_string(f).unwrap_or_default().lines().map(str::to_owned).collect::<Vec<_>>())
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect()
}

impl Cluster {
    fn new(env: &Env, endpoint: &str, stream: &str, session_timeout_ms: u64) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(unique("squall-bench"));
        std::fs::create_dir_all(&dir)?;
        // Product defaults (checkpoint 1 s, discovery 10 s, idle poll 250 ms, GetRecords >= 200 ms apart).
        let spout_config = dir.join("spout.json");
        std::fs::write(&spout_config, "{}")?;
        Ok(Self {
            topology: unique("bench-topo"),
            stream: stream.into(),
            root: format!("/{}", unique("squall-bench")),
            dir,
            spout_config,
            session_timeout_ms,
            endpoint: endpoint.into(),
            zk: env.zk.clone(),
            bin: env.audit_bin.clone(),
        })
    }

    fn start(&self, name: &str) -> anyhow::Result<Worker> {
        let read_log = self.dir.join(format!("{name}.reads.jsonl"));
        let deliveries = self.dir.join(format!("{name}.deliveries.jsonl"));
        let log = std::fs::File::create(self.dir.join(format!("{name}.log")))?;
        let child = Command::new(&self.bin)
            .args(["--topology", &self.topology, "--stream", &self.stream, "--zk-root", &self.root])
            .args(["--spout-tasks", "1", "--zk-session-timeout-ms", &self.session_timeout_ms.to_string()])
            .arg("--spout-config")
            .arg(&self.spout_config)
            .arg("--read-log")
            .arg(&read_log)
            .arg("--deliveries")
            .arg(&deliveries)
            .env("SQUALL_ZK", &self.zk)
            .env("SQUALL_KINESIS_ENDPOINT", &self.endpoint)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        Ok(Worker { name: name.into(), child: Some(child), read_log, deliveries })
    }
}

/// Shards a read log says the task holds now (acquired and not released since).
fn held(entries: &[ReadLogEntry]) -> BTreeMap<String, String> {
    let mut h = BTreeMap::new();
    for e in entries {
        match e.event.as_str() {
            "acquire" => {
                h.insert(e.shard.clone(), e.task.clone());
            }
            "release" | "finish" if h.get(&e.shard) == Some(&e.task) => {
                h.remove(&e.shard);
            }
            _ => {}
        }
    }
    h
}

async fn wait_for<F: FnMut() -> bool>(what: &str, timeout: Duration, mut f: F) -> anyhow::Result<()> {
    let start = Instant::now();
    while !f() {
        if start.elapsed() > timeout {
            bail!("timed out after {:?} waiting for {what}", timeout);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// First `records` event of `shard` by the worker at or after `since_ms`.
fn first_records(w: &Worker, shard: &str, since_ms: i64) -> Option<i64> {
    w.reads().iter().find(|e| e.event == "records" && e.shard == shard && e.t_ms >= since_ms).map(|e| e.t_ms)
}

fn first_event(w: &Worker, event: &str, shard: &str, since_ms: i64) -> Option<i64> {
    w.reads().iter().find(|e| e.event == event && e.shard == shard && e.t_ms >= since_ms).map(|e| e.t_ms)
}

// ---------------------------------------------------------------------------------------------
// (c) reshard latency

async fn reshard(env: &Env) -> anyhow::Result<()> {
    println!("\n## (c) reshard latency (kinesis-local; kinesalite has no ChildShards)\n");
    env.need_audit_bin()?;
    let endpoint = env.kinesis_local.clone();
    let client = client(&endpoint).await?;
    let stream = create_stream(&client, &endpoint, 2, "bench-reshard").await?;
    let _producer = Producer::start(&client, &stream, 40.0);
    let cluster = Cluster::new(env, &endpoint, &stream, 10_000)?;
    let w = cluster.start("w1")?;
    let initial: Vec<String> =
        squall::kinesis::list_shards(&client, &endpoint, &stream).await?.into_iter().map(|s| s.shard_id).collect();
    wait_for("the worker reading both shards", Duration::from_secs(30), || {
        let r = w.reads();
        initial.iter().all(|s| r.iter().any(|e| e.event == "records" && &e.shard == s))
    })
    .await?;
    println!(
        "| split | parent | split -> parent end (ms) | end -> finish (ms) | end -> child acquire (ms) | end -> child first read (ms) | **end -> first child record delivered (ms)** |"
    );
    println!("| ---: | --- | ---: | ---: | ---: | ---: | ---: |");
    let mut lat = Vec::new();
    for round in 0..4 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let shards = squall::kinesis::list_shards(&client, &endpoint, &stream).await?;
        let parent = shards.iter().find(|s| !s.closed).context("no open shard")?.shard_id.clone();
        let t_split = now_ms();
        squall::kinesis::split_shard(&client, &endpoint, &stream, &parent).await?;
        let children: Vec<String> = squall::kinesis::list_shards(&client, &endpoint, &stream)
            .await?
            .into_iter()
            .filter(|s| s.parents().any(|p| p == parent))
            .map(|s| s.shard_id)
            .collect();
        let mut first_delivery = None;
        wait_for("a delivery from a child shard", Duration::from_secs(60), || {
            first_delivery = deliveries(std::slice::from_ref(&w.deliveries))
                .iter()
                .filter(|d| children.contains(&d.shard))
                .map(|d| d.t_us)
                .min();
            first_delivery.is_some()
        })
        .await?;
        let end = first_event(&w, "end", &parent, t_split).context("no end event")?;
        let finish = first_event(&w, "finish", &parent, t_split).unwrap_or(end);
        let acquire = children.iter().filter_map(|c| first_event(&w, "acquire", c, t_split)).min().unwrap_or(end);
        let read = children.iter().filter_map(|c| first_records(&w, c, t_split)).min().unwrap_or(end);
        let delivered_ms = first_delivery.unwrap_or(0) as f64 / 1e3;
        let l = delivered_ms - end as f64;
        lat.push(l);
        println!(
            "| {} | {parent} | {} | {} | {} | {} | **{l:.0}** |",
            round + 1,
            end - t_split,
            finish - end,
            acquire - end,
            read - end
        );
    }
    println!();
    println!(
        "(c) reshard latency, parent end -> first child record delivered: median {:.0} ms, max {:.0} ms (target <= 1000 ms; KCL polls parents every 10 s)",
        median(&lat),
        max(&lat)
    );
    drop(w);
    cleanup(&cluster, &client, &endpoint).await;
    Ok(())
}

async fn cleanup(cluster: &Cluster, client: &Client, endpoint: &str) {
    if let Ok(zk) = zk_client(&cluster.zk).await {
        zk_delete_tree(&zk, &cluster.root).await;
    }
    delete_stream(client, endpoint, &cluster.stream).await;
    let _ = std::fs::remove_dir_all(&cluster.dir);
}

// ---------------------------------------------------------------------------------------------
// (d) failover and handoff, (e) ZooKeeper writes

/// For every shard `to` acquired at or after `since`: (acquire - reference, first read - reference).
fn moved(to: &Worker, since_ms: i64, reference_ms: i64) -> Vec<(String, i64, i64)> {
    let reads = to.reads();
    let mut out = Vec::new();
    let mut shards: Vec<&str> =
        reads.iter().filter(|e| e.event == "acquire" && e.t_ms >= since_ms).map(|e| e.shard.as_str()).collect();
    shards.dedup();
    for s in shards {
        let acq = first_event(to, "acquire", s, since_ms).unwrap_or(since_ms);
        let rd = first_records(to, s, acq).unwrap_or(i64::MAX);
        out.push((s.to_string(), acq - reference_ms, rd.saturating_sub(reference_ms)));
    }
    out
}

/// The time of the newest task znode (its creation, ZooKeeper's clock = this host's).
async fn newest_task_ctime(zk: &zookeeper_client::Client, cluster: &Cluster) -> Option<i64> {
    let dir = format!("{}/topologies/{}/tasks", cluster.root, cluster.topology);
    let mut best = None;
    for t in zk.list_children(&dir).await.unwrap_or_default() {
        if let Ok(Some(st)) = zk.check_stat(&format!("{dir}/{t}")).await {
            best = best.max(Some(st.ctime));
        }
    }
    best
}

struct Moves {
    kind: &'static str,
    acquire: Vec<f64>,
    read: Vec<f64>,
}

impl Moves {
    fn add(&mut self, m: &[(String, i64, i64)]) -> (f64, f64) {
        let a = m.iter().map(|x| x.1 as f64).fold(f64::NAN, f64::max);
        let r = m.iter().map(|x| x.2 as f64).fold(f64::NAN, f64::max);
        self.acquire.push(a);
        self.read.push(r);
        (a, r)
    }
}

async fn failover(env: &Env) -> anyhow::Result<()> {
    println!("\n## (d) failover and handoff latency, (e) ZooKeeper writes (kinesis-local, 2 workers, 4 shards)\n");
    env.need_audit_bin()?;
    const SESSION_MS: u64 = 10_000;
    let endpoint = env.kinesis_local.clone();
    let client = client(&endpoint).await?;
    let stream = create_stream(&client, &endpoint, 4, "bench-failover").await?;
    let _producer = Producer::start(&client, &stream, 60.0);
    let cluster = Cluster::new(env, &endpoint, &stream, SESSION_MS)?;
    let zk = zk_client(&env.zk).await?;
    let a = cluster.start("a")?;
    wait_for("worker a reading all 4 shards", Duration::from_secs(30), || {
        let r = a.reads();
        held(&r).len() == 4 && r.iter().filter(|e| e.event == "records").count() >= 4
    })
    .await?;
    let mut join = Moves { kind: "join (new worker starts)", acquire: vec![], read: vec![] };
    let mut leave = Moves { kind: "leave (SIGTERM, graceful)", acquire: vec![], read: vec![] };
    let mut crash = Moves { kind: "crash (SIGKILL)", acquire: vec![], read: vec![] };
    let mut zk_rows = Vec::new();
    println!("| event | shards moved | per shard: (to acquire ms, to first read ms) |");
    println!("| --- | ---: | --- |");
    for round in 0..2 {
        // Join: b starts; 2 shards move from a to b.
        let spawn_ms = now_ms();
        let b = cluster.start(&format!("b{round}"))?;
        wait_for("the rebalance after b joined", Duration::from_secs(30), || {
            let (ha, hb) = (held(&a.reads()), held(&b.reads()));
            ha.len() == 2 && hb.len() == 2 && hb.keys().all(|s| first_records(&b, s, spawn_ms).is_some())
        })
        .await?;
        let joined = newest_task_ctime(&zk, &cluster).await.unwrap_or(spawn_ms);
        let m = moved(&b, spawn_ms, joined);
        let (ja, jr) = join.add(&m);
        println!(
            "| join {} (from b's task znode; process start -> znode {} ms) | {} | {:?} |",
            round + 1,
            joined - spawn_ms,
            m.len(),
            m.iter().map(|x| (x.1, x.2)).collect::<Vec<_>>()
        );
        let _ = (ja, jr);

        // (e) steady state with both workers: checkpoint writes over a window.
        if round == 0 {
            tokio::time::sleep(Duration::from_secs(3)).await;
            let window = Duration::from_secs(10);
            let topo_path = format!("{}/topologies/{}", cluster.root, cluster.topology);
            let (t0, c0) = zk_versions(&zk, &topo_path).await;
            let zx0 = zxid(&env.zk).await;
            let t_start = Instant::now();
            tokio::time::sleep(window).await;
            let (t1, c1) = zk_versions(&zk, &topo_path).await;
            let zx1 = zxid(&env.zk).await;
            let secs = t_start.elapsed().as_secs_f64();
            let intervals = secs / 1.0; // checkpoint_interval_ms default 1000
            let per_shard: Vec<f64> =
                c1.iter().map(|(s, v)| f64::from(v - c0.get(s).copied().unwrap_or(*v)) / intervals).collect();
            let cp_writes: i64 = c1.iter().map(|(s, v)| i64::from(v - c0.get(s).copied().unwrap_or(*v))).sum();
            zk_rows.push(format!(
                "(e) {:.1} s window, {} shards, checkpoint interval 1 s: {cp_writes} checkpoint writes = {:.2} per shard per interval (max shard {:.2}); all znode versions of the topology: {} = {:.2} per shard per interval; server zxid delta (whole ensemble, includes other clients): {}",
                secs,
                c1.len(),
                cp_writes as f64 / (c1.len() as f64 * intervals),
                max(&per_shard),
                t1 - t0,
                (t1 - t0) as f64 / (c1.len() as f64 * intervals),
                match (zx0, zx1) { (Some(x), Some(y)) => (y - x).to_string(), _ => "n/a".into() }
            ));
        }

        // Leave: SIGTERM b; its shards go back to a.
        let b_shards: Vec<String> = held(&b.reads()).into_keys().collect();
        let t_leave = now_ms();
        b.term();
        wait_for("a re-owning b's shards after SIGTERM", Duration::from_secs(60), || {
            b_shards.iter().all(|s| first_records(&a, s, t_leave).is_some())
        })
        .await?;
        let m = moved(&a, t_leave, t_leave);
        leave.add(&m);
        println!(
            "| leave {} (SIGTERM) | {} | {:?} |",
            round + 1,
            m.len(),
            m.iter().map(|x| (x.1, x.2)).collect::<Vec<_>>()
        );
        let mut b = b;
        b.reap(Duration::from_secs(30));

        // Crash: a second worker joins, then is SIGKILLed.
        let spawn_ms = now_ms();
        let mut c = cluster.start(&format!("c{round}"))?;
        wait_for("the rebalance after c joined", Duration::from_secs(30), || {
            let (ha, hc) = (held(&a.reads()), held(&c.reads()));
            ha.len() == 2 && hc.len() == 2 && hc.keys().all(|s| first_records(&c, s, spawn_ms).is_some())
        })
        .await?;
        let joined = newest_task_ctime(&zk, &cluster).await.unwrap_or(spawn_ms);
        let m = moved(&c, spawn_ms, joined);
        join.add(&m);
        println!("| join {} | {} | {:?} |", round + 1 + 2, m.len(), m.iter().map(|x| (x.1, x.2)).collect::<Vec<_>>());
        tokio::time::sleep(Duration::from_secs(2)).await;
        let c_shards: Vec<String> = held(&c.reads()).into_keys().collect();
        let t_kill = now_ms();
        c.kill();
        wait_for("a re-owning c's shards after SIGKILL", Duration::from_secs(60), || {
            c_shards.iter().all(|s| first_records(&a, s, t_kill).is_some())
        })
        .await?;
        let m = moved(&a, t_kill, t_kill);
        crash.add(&m);
        println!(
            "| crash {} (SIGKILL) | {} | {:?} |",
            round + 1,
            m.len(),
            m.iter().map(|x| (x.1, x.2)).collect::<Vec<_>>()
        );
        let _ = c.name.len();
    }
    println!();
    println!("| event | samples | to acquire, median / max (ms) | to first read, median / max (ms) | target |");
    println!("| --- | ---: | ---: | ---: | --- |");
    for (m, target) in [
        (&crash, format!("<= session timeout + 1 s = {} ms", SESSION_MS + 1000)),
        (&join, "<= 1000 ms".into()),
        (&leave, "<= 1000 ms".into()),
    ] {
        println!(
            "| {} | {} | {:.0} / {:.0} | **{:.0} / {:.0}** | {target} |",
            m.kind,
            m.read.len(),
            median(&m.acquire),
            max(&m.acquire),
            median(&m.read),
            max(&m.read)
        );
    }
    println!();
    for r in zk_rows {
        println!("{r}");
    }
    drop(a);
    cleanup(&cluster, &client, &endpoint).await;
    Ok(())
}

/// The server's last zxid (`srvr`), counting every write transaction of the ensemble.
async fn zxid(connect: &str) -> Option<i64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = connect.split(',').next()?;
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(b"srvr").await.ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    let line = out.lines().find(|l| l.starts_with("Zxid:"))?;
    i64::from_str_radix(line.trim_start_matches("Zxid:").trim().trim_start_matches("0x"), 16).ok()
}

// ---------------------------------------------------------------------------------------------
// (f) memory of a worker owning 50 shards with a backlog

fn proc_status(pid: u32) -> HashMap<String, f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let n: f64 = v.split_whitespace().next()?.parse().ok()?;
            Some((k.to_string(), n))
        })
        .collect()
}

fn rss_kib(pid: u32) -> f64 {
    proc_status(pid).get("VmRSS").copied().unwrap_or(f64::NAN)
}

/// Counts the lines of a growing file, reading only what was appended since the last call.
struct LineCounter {
    path: PathBuf,
    offset: u64,
    lines: u64,
}

impl LineCounter {
    fn new(path: &Path) -> Self {
        Self { path: path.to_path_buf(), offset: 0, lines: 0 }
    }

    fn poll(&mut self) -> u64 {
        use std::io::{Read, Seek, SeekFrom};
        let Ok(mut f) = std::fs::File::open(&self.path) else { return self.lines };
        if f.seek(SeekFrom::Start(self.offset)).is_err() {
            return self.lines;
        }
        let mut buf = Vec::new();
        if let Ok(n) = f.read_to_end(&mut buf) {
            self.offset += n as u64;
            self.lines += buf.iter().filter(|&&b| b == b'\n').count() as u64;
        }
        self.lines
    }
}

/// Puts `per_shard` audit records of `size` bytes into every shard of `stream` with `in_flight`
/// concurrent PutRecords calls of 500 records. Each record carries its shard's starting hash key
/// as ExplicitHashKey, and each call spreads its records evenly over the shards, so every shard
/// ends with exactly `per_shard` records. Returns the producer run id and the time taken.
async fn fill_backlog(
    client: &Client,
    stream: &str,
    per_shard: u64,
    size: usize,
    in_flight: usize,
) -> anyhow::Result<(String, Duration)> {
    use aws_sdk_kinesis::primitives::Blob;
    use aws_sdk_kinesis::types::PutRecordsRequestEntry;
    let mut hash_keys = Vec::new();
    let mut token = None;
    loop {
        let req = match token.take() {
            Some(t) => client.list_shards().next_token(t),
            None => client.list_shards().stream_name(stream),
        };
        let out = req.send().await.map_err(|e| {
            anyhow::anyhow!("listing the shards of {stream}: {}", aws_sdk_kinesis::error::DisplayErrorContext(e))
        })?;
        for s in out.shards() {
            hash_keys.push(s.hash_key_range().map(|r| r.starting_hash_key().to_string()).unwrap_or_default());
        }
        match out.next_token() {
            Some(t) => token = Some(t.to_string()),
            None => break,
        }
    }
    let shards = hash_keys.len() as u64;
    if shards == 0 {
        bail!("stream {stream} has no shards");
    }
    let total = per_shard * shards;
    let run = unique("backlog");
    let hash_keys = Arc::new(hash_keys);
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..in_flight {
        let (client, stream, run) = (client.clone(), stream.to_string(), run.clone());
        let (hash_keys, next, done) = (hash_keys.clone(), next.clone(), done.clone());
        set.spawn(async move {
            loop {
                let first = next.fetch_add(500, Ordering::Relaxed);
                if first >= total {
                    return Ok::<(), anyhow::Error>(());
                }
                // Record i goes to shard i % shards, as the shard's (i / shards)-th record.
                let mut entries: Vec<PutRecordsRequestEntry> = (first..(first + 500).min(total))
                    .map(|i| {
                        let shard = (i % shards) as usize;
                        let key = format!("backlog-{shard}");
                        let data = squall::kinesis::payload::AuditPayload::new(&run, &key, i / shards, size).to_bytes();
                        PutRecordsRequestEntry::builder()
                            .partition_key(key)
                            .explicit_hash_key(&hash_keys[shard])
                            .data(Blob::new(data))
                            .build()
                            .context("building a PutRecords entry")
                    })
                    .collect::<anyhow::Result<_>>()?;
                let mut attempts = 0;
                while !entries.is_empty() {
                    attempts += 1;
                    match client.put_records().stream_name(&stream).set_records(Some(entries.clone())).send().await {
                        Ok(out) => {
                            let failed: Vec<_> = out
                                .records()
                                .iter()
                                .zip(entries)
                                .filter(|(r, _)| r.error_code().is_some())
                                .map(|(_, e)| e)
                                .collect();
                            entries = failed;
                        }
                        Err(e) if attempts < 5 => {
                            eprintln!(
                                "backlog put on {stream}: {}; retrying",
                                aws_sdk_kinesis::error::DisplayErrorContext(e)
                            );
                        }
                        Err(e) => bail!("backlog put on {stream}: {}", aws_sdk_kinesis::error::DisplayErrorContext(e)),
                    }
                    if !entries.is_empty() {
                        if attempts >= 5 {
                            bail!("backlog put on {stream}: {} records still failing after 5 attempts", entries.len());
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
                let n = done.fetch_add(500, Ordering::Relaxed) + 500;
                if n % (total / 10).max(500) < 500 {
                    println!("  put {n} of {total} records after {:.0} s", start.elapsed().as_secs_f64());
                }
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    Ok((run, start.elapsed()))
}

async fn memory(env: &Env) -> anyhow::Result<()> {
    const SHARDS: i32 = 50;
    const RECORD_BYTES: usize = 1024;
    const IN_FLIGHT: usize = 8;
    const STEADY_SECS: u64 = 30;
    let per_shard: u64 = std::env::var("SQUALL_BENCH_MEMORY_BACKLOG")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(10_000);
    let backlog = per_shard * SHARDS as u64;
    // kinesis-local cannot take 500 MB in useful time: its put cost grows with the records the
    // stream holds (500-record PutRecords take ~4 s at 2,000 records per shard, ~2 h to fill).
    let engine = std::env::var("SQUALL_BENCH_MEMORY_ENGINE").unwrap_or_else(|_| "kinesalite".into());
    let endpoint = match engine.as_str() {
        "kinesalite" => env.kinesalite.clone(),
        "kinesis-local" => env.kinesis_local.clone(),
        other => bail!("SQUALL_BENCH_MEMORY_ENGINE is {other:?}; use kinesalite (default) or kinesis-local"),
    };
    println!(
        "\n## (f) resident memory of a worker owning {SHARDS} shards with a backlog of {per_shard} records of 1 KB each ({engine})\n"
    );
    env.need_audit_bin()?;
    let client = client(&endpoint).await?;
    if !reachable(&client).await {
        bail!("{engine} does not answer at {endpoint}: start it (localstack/kinesalite-up, localstack/up)");
    }
    let stream = create_stream(&client, &endpoint, SHARDS, "bench-memory").await?;
    let (run, put_time) = fill_backlog(&client, &stream, per_shard, RECORD_BYTES, IN_FLIGHT).await?;
    println!(
        "backlog: {backlog} records of {RECORD_BYTES} bytes ({:.0} MB) in {SHARDS} shards, put in {:.0} s ({:.0} rec/s; PutRecords of 500, {IN_FLIGHT} in flight)",
        (backlog * RECORD_BYTES as u64) as f64 / 1e6,
        put_time.as_secs_f64(),
        backlog as f64 / put_time.as_secs_f64()
    );

    // Catch-up: the worker starts on the full backlog; VmRSS every 250 ms until every backlog
    // record is delivered (the audit sink writes one line per delivery).
    let cluster = Cluster::new(env, &endpoint, &stream, 10_000)?;
    let w = cluster.start("w")?;
    let pid = w.pid();
    let t0 = Instant::now();
    let mut delivered = LineCounter::new(&w.deliveries);
    let mut catch_up = Vec::new();
    let mut next_report = Duration::from_secs(10);
    let timeout = Duration::from_secs(120 + backlog / 1000);
    println!();
    println!("| time (s) | delivered | VmRSS (MiB) |");
    println!("| ---: | ---: | ---: |");
    loop {
        let n = delivered.poll();
        let rss = rss_kib(pid);
        if rss.is_nan() {
            bail!("worker pid {pid} is gone (log: {})", cluster.dir.join("w.log").display());
        }
        catch_up.push(rss);
        if t0.elapsed() >= next_report {
            println!("| {:.0} | {n} | {:.1} |", t0.elapsed().as_secs_f64(), rss / 1024.0);
            next_report += Duration::from_secs(10);
        }
        if n >= backlog {
            break;
        }
        if t0.elapsed() > timeout {
            bail!("the worker delivered {n} of {backlog} backlog records in {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let caught_up = t0.elapsed();
    let held_shards = held(&w.reads()).len();
    let hwm_catch_up = proc_status(pid).get("VmHWM").copied().unwrap_or(f64::NAN);
    let mut times: Vec<i64> =
        deliveries(std::slice::from_ref(&w.deliveries)).into_iter().filter(|d| d.run == run).map(|d| d.t_us).collect();
    times.sort_unstable();
    let first_to_last = match (times.first(), times.last()) {
        (Some(a), Some(b)) if b > a => (b - a) as f64 / 1e6,
        _ => f64::NAN,
    };

    // Steady state after the catch-up, under a light producer.
    let producer = Producer::start(&client, &stream, 50.0);
    let mut steady = Vec::new();
    for _ in 0..STEADY_SECS {
        tokio::time::sleep(Duration::from_secs(1)).await;
        steady.push(rss_kib(pid));
    }
    let st = proc_status(pid);
    let mib = |kb: f64| kb / 1024.0;
    println!();
    println!(
        "worker pid {pid}: held {held_shards} shards and delivered the {backlog}-record backlog ({} delivery lines of this run, duplicates included) {:.1} s after start; first to last backlog delivery {:.1} s",
        times.len(),
        caught_up.as_secs_f64(),
        first_to_last
    );
    println!();
    println!("| phase | VmRSS median (MiB) | VmRSS max (MiB) |");
    println!("| --- | ---: | ---: |");
    println!(
        "| start-up + catch-up ({backlog} records, {:.0} s) | {:.1} | {:.1} |",
        caught_up.as_secs_f64(),
        mib(median(&catch_up)),
        mib(max(&catch_up))
    );
    println!(
        "| steady after, {STEADY_SECS} s under a 50 rec/s producer | {:.1} | {:.1} |",
        mib(median(&steady)),
        mib(max(&steady))
    );
    println!();
    println!(
        "(f) worker owning {SHARDS} shards, {backlog}-record 1 KB backlog: catch-up {:.0} rec/s from start ({:.0} rec/s first to last delivery); VmRSS catch-up median {:.1} MiB, max {:.1} MiB; VmHWM (peak) {:.1} MiB (at catch-up end {:.1}); steady {:.1} MiB; threads {} (target < 100 MB)",
        backlog as f64 / caught_up.as_secs_f64(),
        times.len().saturating_sub(1) as f64 / first_to_last,
        mib(median(&catch_up)),
        mib(max(&catch_up)),
        mib(st.get("VmHWM").copied().unwrap_or(f64::NAN)),
        mib(hwm_catch_up),
        mib(median(&steady)),
        st.get("Threads").copied().unwrap_or(f64::NAN)
    );
    drop(producer);
    drop(w);
    cleanup(&cluster, &client, &endpoint).await;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// (g) stages: one stage vs two stages through an intermediate stream

/// What the counting bolt saw: how many tuples, the first and last arrival, and (when asked)
/// each tuple's put time and latency (ms).
#[derive(Default)]
struct StageSeen {
    count: AtomicU64,
    times: Mutex<(Option<Instant>, Option<Instant>)>,
    record_latency: bool,
    latencies: Mutex<Vec<(i64, i64)>>,
}

/// The put time a latency producer wrote at the head of a record (`t=<ms>;`).
fn payload_put_ms(data: &[u8]) -> Option<i64> {
    let rest = data.strip_prefix(b"t=")?;
    let end = rest.iter().position(|&b| b == b';')?;
    std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
}

/// One tuple per record: its partition key and its put time (from the payload when a latency
/// producer wrote it, else the record's approximate arrival time).
struct Keyer;

impl Bolt for Keyer {
    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let key = t.get_arc_str("partition_key")?;
        let data = t.get_bytes("data")?;
        let put_ms = match payload_put_ms(&data) {
            Some(ms) => ms,
            None => t.get_i64("arrival_ms")?,
        };
        out.emit([Value::from(key), Value::from(put_ms)])?;
        Ok(())
    }
}

/// The counting bolt (fields grouping on the key): counts per key, and into the shared counter.
struct KeyCount {
    seen: Arc<StageSeen>,
    counts: HashMap<Arc<str>, u64>,
}

impl Bolt for KeyCount {
    async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        let now = Instant::now();
        *self.counts.entry(t.get_arc_str("key")?).or_default() += 1;
        if self.seen.record_latency {
            let put = t.get_i64("t_ms")?;
            self.seen.latencies.lock().unwrap_or_else(|p| p.into_inner()).push((put, now_ms() - put));
        }
        self.seen.count.fetch_add(1, Ordering::Relaxed);
        let mut times = self.seen.times.lock().unwrap_or_else(|p| p.into_inner());
        times.0.get_or_insert(now);
        times.1 = Some(now);
        Ok(())
    }
}

/// Boundary name of the two-stage topology (its intermediate stream is `{topology}-keys`).
const STAGE_BOUNDARY: &str = "keys";
const STAGE_BOUNDARY_SHARDS: i32 = 4;

/// A worker (`squall::stage::run`, in this process) of a fresh topology (own name and
/// ZooKeeper root) reading `source`: spout -> keyer -> count (one stage), or spout -> keyer ->
/// boundary (4 shards) -> count (two stages). `body` runs while it works; then the topology is
/// killed (`squall kill --wait 2`) and the worker awaited. Returns what `body` returned, the
/// topology name and the time from start until the worker stopped (the boundary writer's
/// lifetime, at most). On an error, the intermediate stream is deleted here.
async fn with_stage_worker<T>(
    env: &Env,
    client: &Client,
    endpoint: &str,
    source: &str,
    two: bool,
    seen: Arc<StageSeen>,
    body: impl AsyncFnOnce(&str, Instant) -> anyhow::Result<T>,
) -> anyhow::Result<(T, String, Duration)> {
    let topology = unique(if two { "bench-stage2" } else { "bench-stage1" });
    let root = format!("/{}", unique("squall-bench"));
    let args = squall::WorkerArgs::try_parse_from([
        "worker",
        "--topology",
        &topology,
        "--stream",
        source,
        "--zk",
        &env.zk,
        "--zk-root",
        &root,
        "--endpoint",
        endpoint,
        "--region",
        REGION,
        "--max-spout-pending",
        &std::env::var("SQUALL_BENCH_STAGE_PENDING").unwrap_or_else(|_| "1000".into()),
    ])?;
    let count = move |b: &mut TopologyBuilder, input: &str| {
        b.set_bolt("count", 2, move |_| KeyCount { seen: seen.clone(), counts: HashMap::new() })
            .fields_grouping(input, &["key"]);
    };
    let stages = if two {
        Stages::new("key", |b, spout| {
            b.set_bolt("keyer", 2, |_| Keyer).shuffle_grouping(spout).fields(&["key", "t_ms"]);
        })
        .then(
            Boundary::new(STAGE_BOUNDARY, "keyer", &["key", "t_ms"]).key(&["key"]).shards(STAGE_BOUNDARY_SHARDS),
            "count",
            count,
        )
    } else {
        Stages::new("main", move |b, spout| {
            b.set_bolt("keyer", 2, |_| Keyer).shuffle_grouping(spout).fields(&["key", "t_ms"]);
            count(b, "keyer");
        })
    };
    let start = Instant::now();
    let worker = squall::stage::run(args, stages);
    tokio::pin!(worker);
    let out = tokio::select! {
        w = &mut worker => Err(match w {
            Ok(()) => anyhow::anyhow!("worker of {topology} stopped early"),
            Err(e) => e.context(format!("worker of {topology} stopped early")),
        }),
        r = body(&topology, start) => r,
    };
    let kill = async {
        let cli = squall::cli::Cli::try_parse_from([
            "squall",
            "--zk",
            &env.zk,
            "--zk-root",
            &root,
            "--endpoint",
            endpoint,
            "kill",
            &topology,
            "--wait",
            "2",
        ])?;
        squall::cli::run(cli).await
    };
    let out = match out {
        Ok(t) => tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(&mut worker, kill) })
            .await
            .with_context(|| format!("stopping the worker of {topology}"))
            .and_then(|(w, k)| {
                k.with_context(|| format!("squall kill {topology}"))?;
                w.with_context(|| format!("worker of {topology}"))?;
                Ok(t)
            }),
        Err(e) => Err(e),
    };
    let ran = start.elapsed();
    if let Ok(zk) = zk_client(&env.zk).await {
        zk_delete_tree(&zk, &root).await;
    }
    if out.is_err() && two {
        delete_stream(client, endpoint, &format!("{topology}-{STAGE_BOUNDARY}")).await;
    }
    out.map(|t| (t, topology.clone(), ran))
}

/// What a boundary wrote into its intermediate stream.
#[derive(Debug, Default, Clone)]
struct Written {
    data_records: u64,
    tuples: u64,
    watermarks: u64,
    drains: u64,
    /// Approximate arrival time (ms) of each control record.
    control_arrivals: Vec<i64>,
    /// Per tuple: its put time (`t_ms`) and from then to its record's arrival in the
    /// intermediate stream (ms): the first stage's share of the latency.
    transit: Vec<(i64, i64)>,
}

impl Written {
    fn records(&self) -> u64 {
        self.data_records + self.watermarks + self.drains
    }
    fn control(&self) -> u64 {
        self.watermarks + self.drains
    }
}

/// Reads every record of an intermediate stream from TRIM_HORIZON and classifies it.
async fn read_intermediate(client: &Client, endpoint: &str, stream: &str) -> anyhow::Result<Written> {
    use squall::stage::codec::{Payload, decode};
    let mut w = Written::default();
    for r in squall::audit::read_stream(client, endpoint, stream).await? {
        let rec = decode(&bytes::Bytes::copy_from_slice(r.data().as_ref()), 2)
            .map_err(|e| anyhow::anyhow!("record of {stream} does not decode: {e}"))?;
        let arrival = r.approximate_arrival_timestamp().and_then(|t| t.to_millis().ok()).unwrap_or(0);
        match rec.payload {
            Payload::Data(t) => {
                w.data_records += 1;
                w.tuples += t.len() as u64;
                for v in &t {
                    if let Some(Value::Int(put)) = v.get(1) {
                        w.transit.push((*put, arrival - put));
                    }
                }
            }
            Payload::Watermark => {
                w.watermarks += 1;
                w.control_arrivals.push(arrival);
            }
            Payload::Drain => {
                w.drains += 1;
                w.control_arrivals.push(arrival);
            }
        }
    }
    Ok(w)
}

/// One throughput run: records/s from the worker's start to the last record counted, and from
/// the first to the last; what the boundary wrote (two stages).
struct StageTput {
    total: f64,
    steady: f64,
    startup_ms: f64,
    ran: Duration,
    written: Option<Written>,
}

async fn stage_throughput_run(
    env: &Env,
    client: &Client,
    endpoint: &str,
    source: &str,
    expect: u64,
    two: bool,
) -> anyhow::Result<StageTput> {
    let seen = Arc::new(StageSeen::default());
    let s = seen.clone();
    let ((start, first, last), topology, ran) =
        with_stage_worker(env, client, endpoint, source, two, seen.clone(), async |topology: &str, start: Instant| {
            let deadline = start + Duration::from_secs(300);
            while s.count.load(Ordering::Relaxed) < expect {
                if Instant::now() > deadline {
                    bail!("{topology} counted {} of {expect} records in 300 s", s.count.load(Ordering::Relaxed));
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let (first, last) = *s.times.lock().unwrap_or_else(|p| p.into_inner());
            Ok((start, first.unwrap_or(start), last.unwrap_or(start)))
        })
        .await?;
    let counted = seen.count.load(Ordering::Relaxed);
    if counted != expect {
        println!("  note: {topology} counted {counted} tuples for {expect} records (replays?)");
    }
    let written = if two {
        let stream = format!("{topology}-{STAGE_BOUNDARY}");
        let w = read_intermediate(client, endpoint, &stream).await;
        delete_stream(client, endpoint, &stream).await;
        Some(w?)
    } else {
        None
    };
    Ok(StageTput {
        total: expect as f64 / last.duration_since(start).as_secs_f64().max(1e-6),
        steady: expect.saturating_sub(1) as f64 / last.duration_since(first).as_secs_f64().max(1e-6),
        startup_ms: first.duration_since(start).as_secs_f64() * 1e3,
        ran,
        written,
    })
}

/// A steady producer of latency records: every 25 ms a PutRecords of the records due, keys
/// `lat-0..keys` in turn, each payload `t=<ms>;` (the put time) padded to `size` bytes. `put`
/// counts the records Kinesis accepted. Aborted on drop; [`LatencyProducer::stop`] lets the
/// put in flight finish.
struct LatencyProducer {
    task: Option<tokio::task::JoinHandle<()>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    put: Arc<AtomicU64>,
}

impl LatencyProducer {
    fn start(client: &Client, stream: &str, rate: f64, keys: u64, size: usize) -> Self {
        let (client, stream) = (client.clone(), stream.to_string());
        let put = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (counter, stopped) = (put.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut timer = tokio::time::interval(Duration::from_millis(25));
            timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let (mut n, start) = (0u64, Instant::now());
            while !stopped.load(Ordering::Relaxed) {
                timer.tick().await;
                let due = (start.elapsed().as_secs_f64() * rate) as u64;
                if due <= n {
                    continue;
                }
                let t = now_ms();
                let entries: Vec<_> = (n..due)
                    .filter_map(|i| {
                        let mut data = format!("t={t};").into_bytes();
                        data.resize(size.max(data.len()), b'x');
                        aws_sdk_kinesis::types::PutRecordsRequestEntry::builder()
                            .partition_key(format!("lat-{}", i % keys))
                            .data(aws_sdk_kinesis::primitives::Blob::new(data))
                            .build()
                            .ok()
                    })
                    .collect();
                n = due;
                match client.put_records().stream_name(&stream).set_records(Some(entries)).send().await {
                    Ok(out) => {
                        let ok = out.records().iter().filter(|r| r.error_code().is_none()).count() as u64;
                        counter.fetch_add(ok, Ordering::Relaxed);
                    }
                    Err(e) => {
                        eprintln!("latency producer on {stream}: {}", aws_sdk_kinesis::error::DisplayErrorContext(e))
                    }
                }
            }
        });
        LatencyProducer { task: Some(task), stop, put }
    }

    /// Stops after the put in flight; returns the records Kinesis accepted.
    async fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
        self.put.load(Ordering::Relaxed)
    }
}

impl Drop for LatencyProducer {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

fn percentile(sorted: &[i64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64
}

/// One latency run.
struct StageLatency {
    /// Latencies (ms) of the records put in the measured window.
    latencies: Vec<i64>,
    /// Source records put.
    produced: u64,
    /// From the worker's start to the kill.
    ran: Duration,
    written: Option<Written>,
    /// The measured window of put times (wall ms).
    window: std::ops::Range<i64>,
}

impl StageLatency {
    /// Sorted first-stage latencies (put -> record in the intermediate stream) of the measured
    /// records, and the control records that arrived in the measured window.
    fn boundary(&self) -> (Vec<i64>, u64) {
        let Some(w) = &self.written else { return (Vec::new(), 0) };
        let mut t: Vec<i64> = w.transit.iter().filter(|(put, _)| self.window.contains(put)).map(|x| x.1).collect();
        t.sort_unstable();
        (t, w.control_arrivals.iter().filter(|a| self.window.contains(a)).count() as u64)
    }
}

/// One latency run on a fresh 4-shard source stream (kinesis-local): the worker and the
/// producer start together; records put in the first `warm` are not measured, those put in the
/// next `measure` are; the run ends once every record put was counted.
async fn stage_latency_run(
    env: &Env,
    client: &Client,
    endpoint: &str,
    two: bool,
    rate: f64,
    warm: Duration,
    measure: Duration,
) -> anyhow::Result<StageLatency> {
    let endpoint = endpoint.to_string();
    let source = create_stream(client, &endpoint, 4, "bench-stage-lat").await?;
    let seen = Arc::new(StageSeen { record_latency: true, ..StageSeen::default() });
    let s = seen.clone();
    let result = with_stage_worker(env, client, &endpoint, &source, two, seen, async |topology: &str, _| {
        let producer = LatencyProducer::start(client, &source, rate, 100, 100);
        let t0 = now_ms();
        tokio::time::sleep(warm + measure).await;
        let produced = producer.stop().await;
        let deadline = Instant::now() + Duration::from_secs(60);
        while s.count.load(Ordering::Relaxed) < produced {
            if Instant::now() > deadline {
                bail!(
                    "{topology} counted {} of {produced} records 60 s after the producer stopped",
                    s.count.load(Ordering::Relaxed)
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (from, to) = (t0 + warm.as_millis() as i64, t0 + (warm + measure).as_millis() as i64);
        let latencies: Vec<i64> = s
            .latencies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(put, _)| (from..to).contains(put))
            .map(|(_, l)| *l)
            .collect();
        Ok((latencies, produced, from..to))
    })
    .await;
    let out = match result {
        Ok(((mut latencies, produced, window), topology, ran)) => {
            latencies.sort_unstable();
            let written = if two {
                let stream = format!("{topology}-{STAGE_BOUNDARY}");
                let w = read_intermediate(client, &endpoint, &stream).await;
                delete_stream(client, &endpoint, &stream).await;
                Some(w?)
            } else {
                None
            };
            Ok(StageLatency { latencies, produced, ran, written, window })
        }
        Err(e) => Err(e),
    };
    delete_stream(client, &endpoint, &source).await;
    out
}

async fn stages(env: &Env) -> anyhow::Result<()> {
    // the in-process workers would log at info; the tables are the output here
    squall::logging::init_with("warn");
    println!("\n## (g) stages: one stage vs two stages through an intermediate stream\n");
    println!(
        "Topology: Kinesis spout -> keyer (2 tasks; one tuple per record, keyed by its partition key) -> count (2 tasks, fields grouping on the key), in one stage, or with a boundary ({STAGE_BOUNDARY_SHARDS}-shard intermediate stream, 1 writer) between keyer and count. In-process worker (`squall::stage::run`), product defaults, fresh topology and ZooKeeper root per run."
    );
    const SHARDS: i32 = 4;
    let reps = env.reps.max(3);
    let engines =
        [("kinesis-local", env.kinesis_local.clone(), 5_000u64), ("kinesalite", env.kinesalite.clone(), 25_000)];
    let mut tput_rows = Vec::new();
    let mut cost_rows = Vec::new();
    let mut summary = Vec::new();
    let only = std::env::var("SQUALL_BENCH_STAGE_ENGINES").unwrap_or_default();
    for (engine, endpoint, per_shard) in engines {
        if !only.is_empty() && !only.split(',').any(|e| e == engine) {
            continue;
        }
        let client = client(&endpoint).await?;
        if !reachable(&client).await {
            // a figure missing from a run that succeeds would read as measured: fail instead
            bail!("{engine} does not answer at {endpoint}: start it (localstack/up, localstack/kinesalite-up)");
        }
        let source = create_stream(&client, &endpoint, SHARDS, "bench-stage-src").await?;
        let total = per_shard * SHARDS as u64;
        let took = fill(&client, &endpoint, &source, total, 4).await?;
        println!(
            "{engine}: source {source}, {SHARDS} shards, {total} records (400 keys), filled in {:.1} s; {reps} rounds (one stage, two stages), after one warm-up of each",
            took.as_secs_f64()
        );
        let result: anyhow::Result<()> = async {
            stage_throughput_run(env, &client, &endpoint, &source, total, false).await?;
            stage_throughput_run(env, &client, &endpoint, &source, total, true).await?;
            let (mut one, mut two) = (Vec::new(), Vec::new());
            for round in 0..reps {
                let a = stage_throughput_run(env, &client, &endpoint, &source, total, false).await?;
                let b = stage_throughput_run(env, &client, &endpoint, &source, total, true).await?;
                println!(
                    "  round {round}: one stage {:.0} rec/s ({:.0} steady), two stages {:.0} rec/s ({:.0} steady)",
                    a.total, a.steady, b.total, b.steady
                );
                one.push(a);
                two.push(b);
            }
            let col = |v: &[StageTput], f: fn(&StageTput) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
            let ratio = |f: fn(&StageTput) -> f64| {
                one.iter().zip(&two).map(|(a, b)| f(b) / f(a)).collect::<Vec<_>>()
            };
            let (ratio_t, ratio_s) = (ratio(|r| r.total), ratio(|r| r.steady));
            tput_rows.push(format!(
                "| {engine} | {total} | {:.0} | {:.0} | **{:.2}** | {:.0} | {:.0} | {:.2} | {:.0} / {:.0} |",
                col(&one, |r| r.total),
                col(&two, |r| r.total),
                median(&ratio_t),
                col(&one, |r| r.steady),
                col(&two, |r| r.steady),
                median(&ratio_s),
                col(&one, |r| r.startup_ms),
                col(&two, |r| r.startup_ms),
            ));
            summary.push(format!(
                "(g) {engine}: two stages / one stage, records/s from start: {:.2} (per round {:?}); steady {:.2} (per round {:?})",
                median(&ratio_t),
                ratio_t.iter().map(|r| (r * 100.0).round() / 100.0).collect::<Vec<_>>(),
                median(&ratio_s),
                ratio_s.iter().map(|r| (r * 100.0).round() / 100.0).collect::<Vec<_>>(),
            ));
            let written: Vec<(Written, Duration)> = two.iter().filter_map(|r| r.written.clone().map(|w| (w, r.ran))).collect();
            cost_rows.push(cost_row(&format!("throughput, {engine}, backlog"), total, &written));
            Ok(())
        }
        .await;
        delete_stream(&client, &endpoint, &source).await;
        result?;
    }
    println!();
    println!("### throughput: records/s until every record was counted (medians of {reps} interleaved rounds)\n");
    println!(
        "| engine | records | one stage rec/s | two stages rec/s | two / one (median of per-round) | one stage steady | two stages steady | steady two / one | start-up to first count, one / two (ms) |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in &tput_rows {
        println!("{r}");
    }

    // Latency, on kinesis-local unless SQUALL_BENCH_STAGE_LATENCY_ENGINE=kinesalite.
    let lat_engine = std::env::var("SQUALL_BENCH_STAGE_LATENCY_ENGINE").unwrap_or_else(|_| "kinesis-local".into());
    let lat_endpoint = match lat_engine.as_str() {
        "kinesis-local" => env.kinesis_local.clone(),
        "kinesalite" => env.kinesalite.clone(),
        other => bail!("SQUALL_BENCH_STAGE_LATENCY_ENGINE is {other:?}; use kinesis-local (default) or kinesalite"),
    };
    let client = client(&lat_endpoint).await?;
    if !reachable(&client).await {
        bail!("{lat_engine} does not answer at {lat_endpoint}: start it (localstack/up, localstack/kinesalite-up)");
    }
    const RATE: f64 = 200.0;
    let (warm, measure) = (Duration::from_secs(5), Duration::from_secs(20));
    let rounds: usize = std::env::var("SQUALL_BENCH_STAGE_LATENCY_REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(2);
    if rounds == 0 {
        println!("\nlatency skipped (SQUALL_BENCH_STAGE_LATENCY_REPS=0)");
        print_stage_cost(&cost_rows, &summary);
        return Ok(());
    }
    println!(
        "\nlatency ({lat_engine}): {RATE} rec/s of 100 bytes, 100 keys, into a fresh 4-shard source per run; {} s warm-up not measured, then {} s measured; {rounds} rounds (one stage, two stages)",
        warm.as_secs(),
        measure.as_secs()
    );
    let (mut one, mut two) = (Vec::new(), Vec::new());
    let mut lat_rows = Vec::new();
    for round in 0..rounds {
        for is_two in [false, true] {
            let r = stage_latency_run(env, &client, &lat_endpoint, is_two, RATE, warm, measure).await?;
            let label = if is_two { "two stages" } else { "one stage" };
            println!(
                "  round {round}: {label}: {} records put, {} measured, p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
                r.produced,
                r.latencies.len(),
                percentile(&r.latencies, 0.5),
                percentile(&r.latencies, 0.99),
                percentile(&r.latencies, 1.0)
            );
            lat_rows.push((round, label, percentile(&r.latencies, 0.5), percentile(&r.latencies, 0.99)));
            if is_two { two.push(r) } else { one.push(r) }
        }
    }
    let pooled = |v: &[StageLatency]| {
        let mut all: Vec<i64> = v.iter().flat_map(|r| r.latencies.iter().copied()).collect();
        all.sort_unstable();
        all
    };
    let (a, b) = (pooled(&one), pooled(&two));
    println!();
    println!("### latency from put to the counting bolt ({lat_engine}, {RATE} rec/s, pooled over {rounds} rounds)\n");
    println!("| topology | records measured | p50 (ms) | p99 (ms) | max (ms) |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for (label, v) in [("one stage", &a), ("two stages", &b)] {
        println!(
            "| {label} | {} | {:.0} | {:.0} | {:.0} |",
            v.len(),
            percentile(v, 0.5),
            percentile(v, 0.99),
            percentile(v, 1.0)
        );
    }
    println!(
        "| **two - one** | | **{:+.0}** | **{:+.0}** | |",
        percentile(&b, 0.5) - percentile(&a, 0.5),
        percentile(&b, 0.99) - percentile(&a, 0.99)
    );
    let mut first: Vec<i64> = two.iter().flat_map(|r| r.boundary().0).collect();
    first.sort_unstable();
    println!(
        "| two stages, put -> record in the intermediate stream (its approximate arrival time) | {} | {:.0} | {:.0} | {:.0} |",
        first.len(),
        percentile(&first, 0.5),
        percentile(&first, 0.99),
        percentile(&first, 1.0)
    );
    let in_window: Vec<u64> = two.iter().map(|r| r.boundary().1).collect();
    println!();
    println!(
        "control records written while the producer ran (measured window, every shard receiving data), per two-stage run: {in_window:?}"
    );
    summary.push(format!(
        "(g) latency {lat_engine} {RATE} rec/s: one stage p50 {:.0} / p99 {:.0} ms; two stages p50 {:.0} / p99 {:.0} ms; per run {:?}",
        percentile(&a, 0.5),
        percentile(&a, 0.99),
        percentile(&b, 0.5),
        percentile(&b, 0.99),
        lat_rows
    ));
    let produced: u64 = two.iter().map(|r| r.produced).sum::<u64>() / two.len().max(1) as u64;
    let written: Vec<(Written, Duration)> = two.iter().filter_map(|r| r.written.clone().map(|w| (w, r.ran))).collect();
    cost_rows.push(cost_row(&format!("steady {RATE} rec/s, {lat_engine}"), produced, &written));
    print_stage_cost(&cost_rows, &summary);
    Ok(())
}

fn print_stage_cost(cost_rows: &[String], summary: &[String]) {
    println!();
    println!(
        "### cost: Kinesis records written into the intermediate stream (read back from it; medians over the two-stage runs)\n"
    );
    println!(
        "P = 1 writer, S = {STAGE_BOUNDARY_SHARDS} shards, watermark interval 1 s: control records <= P x S x T / interval over a writer lifetime of T s.\n"
    );
    println!(
        "| workload | source records | records written (data + control) | per source record | data records | tuples per data record | control records | control / data | bound P*S*T/interval (T) |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in cost_rows {
        println!("{r}");
    }
    println!();
    for s in summary {
        println!("{s}");
    }
}

/// A cost table row: medians over the runs of what the boundary wrote.
fn cost_row(label: &str, source: u64, runs: &[(Written, Duration)]) -> String {
    let m = |f: &dyn Fn(&(Written, Duration)) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    let secs = m(&|r| r.1.as_secs_f64());
    format!(
        "| {label} | {source} | {:.0} ({:.0} + {:.0}) | **{:.3}** | {:.0} | {:.1} | {:.0} | **{:.2}%** | {:.0} ({:.1} s) |",
        m(&|r| r.0.records() as f64),
        m(&|r| r.0.data_records as f64),
        m(&|r| r.0.control() as f64),
        m(&|r| r.0.records() as f64 / source as f64),
        m(&|r| r.0.data_records as f64),
        m(&|r| r.0.tuples as f64 / r.0.data_records.max(1) as f64),
        m(&|r| r.0.control() as f64),
        m(&|r| r.0.control() as f64 * 100.0 / r.0.data_records.max(1) as f64),
        1.0 * STAGE_BOUNDARY_SHARDS as f64 * secs / 1.0,
        secs
    )
}

// ---------------------------------------------------------------------------------------------

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let env = Env::load()?;
    let wanted: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let run = |s: &str| wanted.is_empty() || wanted.iter().any(|w| w == s);
    let started = Instant::now();
    println!("# Squall Kinesis benchmarks");
    println!(
        "kinesis-local {}, kinesalite {}, ZooKeeper {}, {} cores",
        env.kinesis_local,
        env.kinesalite,
        env.zk,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    let mut failed = Vec::new();
    if run("throughput")
        && let Err(e) = throughput(&env).await
    {
        failed.push(format!("throughput: {e:#}"));
    }
    if run("reshard")
        && let Err(e) = reshard(&env).await
    {
        failed.push(format!("reshard: {e:#}"));
    }
    if run("failover")
        && let Err(e) = failover(&env).await
    {
        failed.push(format!("failover: {e:#}"));
    }
    if run("memory")
        && let Err(e) = memory(&env).await
    {
        failed.push(format!("memory: {e:#}"));
    }
    if run("stages")
        && let Err(e) = stages(&env).await
    {
        failed.push(format!("stages: {e:#}"));
    }
    println!("\nKinesis benchmarks took {:.0} s", started.elapsed().as_secs_f64());
    if !failed.is_empty() {
        bail!("failed sections:\n{}", failed.join("\n"));
    }
    Ok(())
}
