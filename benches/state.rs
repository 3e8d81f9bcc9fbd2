//! Exactly-once keyed state benchmark (`cargo bench --bench state`, part of `make bench`):
//! exactly-once counts vs at-least-once counts on the same topology and stream, and what each
//! costs in DynamoDB requests.
//!
//! Sections (run all, or name some: `cargo bench --bench state -- compare requests`):
//!
//! - `compare`: one 4-shard stream, pre-filled once with N records over K keys
//!   (`squall::kinesis::put_records`, 4 producers; default 100,000 over 200 on kinesalite, 20,000
//!   over 200 on kinesis-local, whose puts slow down as a stream fills). Then, interleaved over several
//!   rounds (the order alternating each round), a worker process of `examples/exactly_once_counts`
//!   reads it from TRIM_HORIZON with a fresh topology name, ZooKeeper root and table, once in
//!   exactly-once mode (`ExactlyOnce` bolt: BatchGetItem + one conditional PutItem per key per
//!   commit) and once with `--at-least-once` (one unconditional UpdateItem ADD per key per
//!   interval, the baseline). Each run is timed from the worker's start until the table's counts
//!   sum to N (a consistent Scan of the run's items: every 100 ms until the first count, then
//!   every second, then every 50 ms from shortly before the end the rate so far predicts);
//!   records/s, and the ratio exactly-once / at-least-once per round and its median. Straight to
//!   dynalite, no proxy.
//! - `requests`: one run of each mode through a counting HTTP proxy in front of dynalite: DynamoDB
//!   requests per record by operation (X-Amz-Target), bytes per request, latency per operation,
//!   the share of the run with a read / a write / nothing in flight, and the CPU time of dynalite,
//!   the Kinesis engine and the worker.
//! - `batching`: exactly-once with `--commit-interval-ms` 10, 50 and 200 (and the baseline at the
//!   same intervals), through the proxy: writes per record and records/s on the backlog.
//! - `ops`: what one request of each kind costs dynalite outside any topology (wall time at 32 in
//!   flight, and dynalite's CPU time): the at-least-once UpdateItem ADD, the exactly-once
//!   conditional PutItem with a dedup blob as the bolt writes it and with a small one, an
//!   unconditional PutItem, and the bolt's BatchGetItem of 100 items.
//! - `steady`: the same intervals and 1000 ms under a live producer (2,000 rec/s for 10 s into a
//!   fresh empty stream per run), through the proxy: writes per record when the input, not the
//!   spout's in-flight bound, decides how many records of a key a commit holds.
//! - `diagnose`: one run of each mode with ONE counting task (`--counters 1`), through the proxy,
//!   so that the requests of a commit round are one task's: per round, the time reading, writing
//!   and between rounds (the commit interval and taking input); then one run of each mode with
//!   `--max-spout-pending 5000` (the spout's in-flight bound, which caps what a round can hold).
//!
//! Needs ZooKeeper and dynalite on loopback (`localstack/up`), kinesalite (`localstack/kinesalite-up`;
//! without it, kinesis-local) and the example built in the same profile:
//! `cargo build --release --example exactly_once_counts`. Environment:
//! `SQUALL_BENCH_STATE_ENGINE` (`kinesalite` or `kinesis-local`; default kinesalite when it
//! answers), `SQUALL_KINESALITE_ENDPOINT` (default `http://127.0.0.1:4568`),
//! `SQUALL_KINESIS_ENDPOINT` (`http://127.0.0.1:4566`), `SQUALL_STATE_ENDPOINT`
//! (`http://127.0.0.1:4569`), `SQUALL_ZK` (`127.0.0.1:2181`), `SQUALL_BENCH_STATE_ROUNDS`
//! (compare rounds, default 3), `SQUALL_BENCH_STATE_RECORDS` (N), `SQUALL_BENCH_STATE_KEYS` (K,
//! default 200).

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use aws_sdk_dynamodb::types::AttributeValue;
use common::{median, unique, zk_client, zk_delete_tree};
use squall::kinesis::{KinesisEndpoint, PutOptions};
use squall::state::{StateEndpoint, StateStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const REGION: &str = "us-east-1";
const SHARDS: i32 = 4;
const COMPONENT: &str = "counts";

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[(((sorted.len() - 1) as f64) * p).round() as usize]
}

fn round2(v: &[f64]) -> Vec<f64> {
    v.iter().map(|r| (r * 100.0).round() / 100.0).collect()
}

struct Env {
    /// The Kinesis engine of the source stream: `kinesalite` or `kinesis-local`.
    engine: String,
    kinesis: String,
    dynamo: String,
    zk: String,
    example: PathBuf,
    dir: PathBuf,
    rounds: usize,
    records: u64,
    keys: u64,
    clk_tck: f64,
    /// pids of the services, for their CPU time (None when not found).
    dynalite_pid: Option<u32>,
    kinesis_pid: Option<u32>,
}

impl Env {
    async fn load() -> anyhow::Result<Self> {
        let var = |k: &str, d: &str| std::env::var(k).ok().filter(|v| !v.is_empty()).unwrap_or_else(|| d.into());
        // target/<profile>/deps/state-HASH -> target/<profile>/examples/exactly_once_counts
        let exe = std::env::current_exe()?;
        let profile_dir = exe.parent().and_then(Path::parent).context("bench binary has no target dir")?;
        let example = profile_dir.join("examples").join("exactly_once_counts");
        if !example.exists() {
            bail!(
                "{} missing: build it first with `cargo build --release --example exactly_once_counts` (make bench does)",
                example.display()
            );
        }
        let dir = std::env::temp_dir().join(unique("squall-bench-state"));
        std::fs::create_dir_all(&dir)?;
        let dynamo = var("SQUALL_STATE_ENDPOINT", "http://127.0.0.1:4569");
        let kinesis_local = var("SQUALL_KINESIS_ENDPOINT", "http://127.0.0.1:4566");
        let kinesalite = var("SQUALL_KINESALITE_ENDPOINT", "http://127.0.0.1:4568");
        // kinesalite by default: it takes a 100,000-record backlog in seconds and reads faster than
        // the state store writes, so the stream is not what is measured; kinesis-local when
        // kinesalite does not answer (or when asked), with a smaller backlog (its puts slow down
        // as a stream fills)
        let engine = match std::env::var("SQUALL_BENCH_STATE_ENGINE").ok().filter(|v| !v.is_empty()) {
            Some(e) if e == "kinesalite" || e == "kinesis-local" => e,
            Some(other) => bail!("SQUALL_BENCH_STATE_ENGINE is {other:?}; use kinesalite or kinesis-local"),
            None if reachable(&kinesalite).await => "kinesalite".to_string(),
            None => "kinesis-local".to_string(),
        };
        let (kinesis, default_records) =
            if engine == "kinesalite" { (kinesalite, "100000") } else { (kinesis_local, "20000") };
        let clk_tck = Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0);
        let port = |url: &str| url.rsplit(':').next().unwrap_or("").trim_end_matches('/').to_string();
        let dynalite_pid = find_pid(&["dynalite", &format!("--port\0{}", port(&dynamo))]);
        let kinesis_pid = find_pid(&[engine.as_str()]);
        Ok(Self {
            engine,
            kinesis,
            dynamo,
            zk: var("SQUALL_ZK", "127.0.0.1:2181"),
            example,
            dir,
            rounds: var("SQUALL_BENCH_STATE_ROUNDS", "3").parse().unwrap_or(3).max(1),
            records: var("SQUALL_BENCH_STATE_RECORDS", default_records).parse().unwrap_or(20_000).max(1),
            keys: var("SQUALL_BENCH_STATE_KEYS", "200").parse().unwrap_or(200).max(1),
            clk_tck,
            dynalite_pid,
            kinesis_pid,
        })
    }
}

async fn reachable(endpoint: &str) -> bool {
    let Ok(client) = KinesisEndpoint::new(endpoint, REGION).client().await else { return false };
    tokio::time::timeout(Duration::from_secs(3), client.list_streams().send()).await.is_ok_and(|r| r.is_ok())
}

/// The first process whose command line holds every one of `needles` (NUL-separated arguments).
fn find_pid(needles: &[&str]) -> Option<u32> {
    let mut pids: Vec<u32> =
        std::fs::read_dir("/proc").ok()?.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    pids.sort_unstable();
    pids.into_iter().find(|pid| {
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd);
        needles.iter().all(|n| cmd.contains(n))
    })
}

/// CPU time (user + system) of a process so far, in seconds.
fn cpu_secs(pid: Option<u32>, clk_tck: f64) -> f64 {
    let Some(pid) = pid else { return f64::NAN };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // fields after the command (which may hold spaces) in parentheses: utime and stime are the
    // 14th and 15th fields of the line, the 12th and 13th after ")"
    let Some((_, rest)) = stat.rsplit_once(')') else { return f64::NAN };
    let f: Vec<&str> = rest.split_whitespace().collect();
    match (f.get(11).and_then(|v| v.parse::<f64>().ok()), f.get(12).and_then(|v| v.parse::<f64>().ok())) {
        (Some(u), Some(s)) => (u + s) / clk_tck,
        _ => f64::NAN,
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

// ---------------------------------------------------------------------------------------------
// A counting HTTP/1.1 proxy in front of dynalite (after tests/support/faultproxy.rs, without the
// faults): per request its operation (X-Amz-Target), its start, how long upstream took to answer,
// and the bytes each way.

#[derive(Clone, Debug)]
struct Req {
    op: String,
    /// Since the proxy started.
    start: Duration,
    took: Duration,
    req_bytes: usize,
    resp_bytes: usize,
}

struct Proxy {
    addr: SocketAddr,
    log: Arc<Mutex<Vec<Req>>>,
    started: Instant,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: &str) -> anyhow::Result<Proxy> {
        let hostport = upstream.trim_start_matches("http://").trim_end_matches('/');
        let upstream: SocketAddr =
            tokio::net::lookup_host(hostport).await?.next().with_context(|| format!("resolving {upstream}"))?;
        if !upstream.ip().is_loopback() {
            bail!("the counting proxy only forwards to loopback, not {upstream}");
        }
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let log: Arc<Mutex<Vec<Req>>> = Arc::default();
        let started = Instant::now();
        let l = log.clone();
        let task = tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let l = l.clone();
                tokio::spawn(async move {
                    let _ = serve(sock, upstream, started, &l).await;
                });
            }
        });
        Ok(Proxy { addr, log, started, task })
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The requests that started in `from..to` (times since the proxy started).
    fn requests(&self, from: Duration, to: Duration) -> Vec<Req> {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        log.iter().filter(|r| r.start >= from && r.start < to).cloned().collect()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Message {
    head: Vec<u8>,
    body: Vec<u8>,
}

impl Message {
    fn header(&self, name: &str) -> Option<String> {
        let text = String::from_utf8_lossy(&self.head);
        text.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }
}

/// Reads one message from `s` (with `buf` holding bytes already read). None at a clean EOF.
async fn read_message(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Option<Message>> {
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        if buf.len() > 64 * 1024 {
            return Err(std::io::Error::other("header too large"));
        }
        let mut chunk = [0u8; 8192];
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return if buf.is_empty() { Ok(None) } else { Err(std::io::ErrorKind::UnexpectedEof.into()) };
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head: Vec<u8> = buf.drain(..head_end).collect();
    let mut msg = Message { head, body: Vec::new() };
    if let Some(len) = msg.header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        while buf.len() < len {
            let mut chunk = vec![0u8; (len - buf.len()).min(1 << 20)];
            let n = s.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        msg.body = buf.drain(..len).collect();
    } else if msg.header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            if let Some(end) = chunked_end(buf) {
                msg.body = buf.drain(..end).collect();
                break;
            }
            let mut chunk = [0u8; 8192];
            let n = s.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    }
    Ok(Some(msg))
}

/// Length of a complete chunked body at the start of `b`, if complete.
fn chunked_end(b: &[u8]) -> Option<usize> {
    let mut i = 0;
    loop {
        let line_end = b[i..].windows(2).position(|w| w == b"\r\n")? + i;
        let size_text = std::str::from_utf8(&b[i..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        i = line_end + 2;
        if size == 0 {
            loop {
                let e = b[i..].windows(2).position(|w| w == b"\r\n")? + i;
                let empty = e == i;
                i = e + 2;
                if empty {
                    return Some(i);
                }
            }
        }
        if b.len() < i + size + 2 {
            return None;
        }
        i += size + 2;
    }
}

/// Forwards one client connection's requests on its own upstream connection, logging each.
async fn serve(
    mut client: TcpStream,
    upstream_addr: SocketAddr,
    started: Instant,
    log: &Mutex<Vec<Req>>,
) -> std::io::Result<()> {
    let _ = client.set_nodelay(true);
    let mut cbuf = Vec::new();
    let mut upstream: Option<(TcpStream, Vec<u8>)> = None;
    loop {
        let Some(req) = read_message(&mut client, &mut cbuf).await? else { return Ok(()) };
        let op = req.header("x-amz-target").and_then(|t| t.rsplit('.').next().map(str::to_string)).unwrap_or_default();
        let start = started.elapsed();
        let mut attempt = 0;
        let resp = loop {
            if upstream.is_none() {
                let s = TcpStream::connect(upstream_addr).await?;
                let _ = s.set_nodelay(true);
                upstream = Some((s, Vec::new()));
            }
            let (up, ubuf) = upstream.as_mut().expect("connected above");
            let sent = async {
                up.write_all(&req.head).await?;
                up.write_all(&req.body).await?;
                read_message(up, ubuf).await
            }
            .await;
            match sent {
                Ok(Some(r)) => break r,
                // a kept-alive upstream connection closed under us: one fresh attempt
                Ok(None) | Err(_) if attempt == 0 => {
                    upstream = None;
                    attempt += 1;
                }
                Ok(None) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Err(e) => return Err(e),
            }
        };
        let took = started.elapsed() - start;
        if resp.header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close")) {
            upstream = None;
        }
        client.write_all(&resp.head).await?;
        client.write_all(&resp.body).await?;
        log.lock().unwrap_or_else(|p| p.into_inner()).push(Req {
            op,
            start,
            took,
            req_bytes: req.head.len() + req.body.len(),
            resp_bytes: resp.head.len() + resp.body.len(),
        });
    }
}

// ---------------------------------------------------------------------------------------------
// One run: a worker process of the example counts the stream into a fresh table.

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    ExactlyOnce,
    AtLeastOnce,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::ExactlyOnce => "exactly-once",
            Mode::AtLeastOnce => "at-least-once",
        }
    }
}

#[derive(Clone, Debug)]
struct Spec {
    mode: Mode,
    commit_interval_ms: u64,
    counters: usize,
    max_spout_pending: Option<usize>,
    proxied: bool,
}

impl Spec {
    fn new(mode: Mode) -> Self {
        Spec { mode, commit_interval_ms: 50, counters: 2, max_spout_pending: None, proxied: false }
    }

    /// The mode, and what differs from the defaults.
    fn label(&self) -> String {
        let mut s = self.mode.label().to_string();
        if self.counters != 2 {
            s.push_str(&format!(", {} counting task{}", self.counters, if self.counters == 1 { "" } else { "s" }));
        }
        if let Some(p) = self.max_spout_pending {
            s.push_str(&format!(", max pending {p}"));
        }
        s
    }
}

struct RunResult {
    spec: Spec,
    /// Records counted (N, or what the live producer put).
    records: u64,
    /// What the table's counts summed to at the end (exactly-once: always `records`).
    counted: u64,
    /// Live runs: from the producer's last put until the counts summed to what it put.
    lag: Option<Duration>,
    /// From the worker's start until the counts summed to N.
    took: Duration,
    /// From the first count seen in the table until the counts summed to N.
    counting: Duration,
    /// Requests of the run (proxied runs), from the worker's start to the end.
    requests: Vec<Req>,
    worker_cpu: f64,
    dynalite_cpu: f64,
    kinesis_cpu: f64,
    /// Mean size of an item's `state` / `dedup` attribute at the end (exactly-once).
    item_bytes: (f64, f64),
    load: String,
}

impl RunResult {
    fn rate(&self) -> f64 {
        self.records as f64 / self.took.as_secs_f64().max(1e-6)
    }
    /// Data writes (PutItem, UpdateItem) per record.
    fn writes_per_record(&self) -> f64 {
        (self.op_count("PutItem") + self.op_count("UpdateItem")) as f64 / self.records as f64
    }
    fn ops(&self) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for r in &self.requests {
            *m.entry(r.op.clone()).or_default() += 1;
        }
        m
    }
    fn op_count(&self, op: &str) -> u64 {
        self.requests.iter().filter(|r| r.op == op).count() as u64
    }
}

/// The sum of the counts of `scope`'s items (exactly-once: `state`, JSON; at-least-once:
/// `count`, a number), and the items; with a consistent Scan of just those attributes.
async fn table_total(store: &StateStore, scope: &str, mode: Mode) -> anyhow::Result<(u64, usize)> {
    let attr = match mode {
        Mode::ExactlyOnce => "state",
        Mode::AtLeastOnce => "count",
    };
    let (mut sum, mut items) = (0u64, 0usize);
    let mut start: Option<std::collections::HashMap<String, AttributeValue>> = None;
    loop {
        let r = store
            .client()
            .expect("a DynamoDB table")
            .scan()
            .table_name(store.table())
            .consistent_read(true)
            .filter_expression("#s = :s")
            .projection_expression("#v")
            .expression_attribute_names("#s", "scope")
            .expression_attribute_names("#v", attr)
            .expression_attribute_values(":s", AttributeValue::S(scope.to_string()))
            .set_exclusive_start_key(start.take())
            .send()
            .await
            .map_err(|e| {
                anyhow::anyhow!("scanning {}: {}", store.table(), aws_sdk_dynamodb::error::DisplayErrorContext(e))
            })?;
        for item in r.items() {
            items += 1;
            sum += match item.get(attr) {
                Some(AttributeValue::B(b)) => serde_json::from_slice::<u64>(b.as_ref()).unwrap_or(0),
                Some(AttributeValue::N(n)) => n.parse().unwrap_or(0),
                _ => 0,
            };
        }
        match r.last_evaluated_key() {
            Some(k) if !k.is_empty() => start = Some(k.clone()),
            _ => return Ok((sum, items)),
        }
    }
}

/// Mean sizes of the `state` and `dedup` attributes of `scope`'s items.
async fn item_sizes(store: &StateStore, scope: &str) -> (f64, f64) {
    let Ok(items) = store
        .client()
        .expect("a DynamoDB table")
        .scan()
        .table_name(store.table())
        .filter_expression("#s = :s")
        .expression_attribute_names("#s", "scope")
        .expression_attribute_values(":s", AttributeValue::S(scope.to_string()))
        .send()
        .await
    else {
        return (f64::NAN, f64::NAN);
    };
    let (mut state, mut dedup, mut n) = (0usize, 0usize, 0usize);
    for item in items.items() {
        n += 1;
        if let Some(AttributeValue::B(b)) = item.get("state") {
            state += b.as_ref().len();
        }
        if let Some(AttributeValue::B(b)) = item.get("dedup") {
            dedup += b.as_ref().len();
        }
    }
    (state as f64 / n.max(1) as f64, dedup as f64 / n.max(1) as f64)
}

struct Worker(Option<Child>);

impl Worker {
    fn pid(&self) -> Option<u32> {
        self.0.as_ref().map(Child::id)
    }
    fn alive(&mut self) -> bool {
        self.0.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
    /// SIGTERM, then up to `timeout` for it to stop, then SIGKILL.
    fn stop(&mut self, timeout: Duration) {
        let Some(mut c) = self.0.take() else { return };
        let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).status();
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A producer writing while the worker runs (the stream starts empty): `count` records at `rate`
/// records/s over the bench's K keys.
#[derive(Clone, Copy, Debug)]
struct Feed {
    rate: f64,
    count: u64,
}

type Produced = anyhow::Result<(u64, Instant)>;

async fn run_once(env: &Env, stream: &str, spec: &Spec, feed: Option<Feed>) -> anyhow::Result<RunResult> {
    let expect = feed.map_or(env.records, |f| f.count);
    let topology = unique(match spec.mode {
        Mode::ExactlyOnce => "bench-eo",
        Mode::AtLeastOnce => "bench-alo",
    });
    let root = format!("/{}", unique("squall-bench"));
    let table = unique("bench-state");
    // the table is created before the clock starts (fresh, empty; the worker finds it ACTIVE)
    let store = StateStore::open(&StateEndpoint::new(env.dynamo.clone(), table.clone()))
        .await
        .with_context(|| format!("creating table {table} on {}", env.dynamo))?;
    let proxy = if spec.proxied { Some(Proxy::start(&env.dynamo).await?) } else { None };
    let state_endpoint = proxy.as_ref().map_or_else(|| env.dynamo.clone(), Proxy::url);
    let log_path = env.dir.join(format!("{topology}.log"));
    let log = std::fs::File::create(&log_path)?;
    let mut cmd = Command::new(&env.example);
    cmd.args(["--topology", &topology, "--stream", stream, "--zk", &env.zk, "--zk-root", &root])
        .args(["--endpoint", &env.kinesis, "--region", REGION])
        .args(["--state-endpoint", &state_endpoint, "--state-table", &table])
        .args(["--commit-interval-ms", &spec.commit_interval_ms.to_string()])
        .args(["--counters", &spec.counters.to_string()]);
    if let Some(p) = spec.max_spout_pending {
        cmd.args(["--max-spout-pending", &p.to_string()]);
    }
    if spec.mode == Mode::AtLeastOnce {
        cmd.arg("--at-least-once");
    }
    cmd.env("RUST_LOG", "warn").stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
    let cpu0 = (cpu_secs(env.dynalite_pid, env.clk_tck), cpu_secs(env.kinesis_pid, env.clk_tck));
    let proxy_t0 = proxy.as_ref().map(|p| p.started.elapsed()).unwrap_or_default();
    let start = Instant::now();
    let mut worker = Worker(Some(cmd.spawn().with_context(|| format!("starting {}", env.example.display()))?));
    // the live producer's outcome: records put and when it finished
    let produced: Arc<Mutex<Option<Produced>>> = Arc::default();
    let producer = feed.map(|f| {
        let (env_kinesis, stream, keys, produced) =
            (env.kinesis.clone(), stream.to_string(), env.keys, produced.clone());
        tokio::spawn(async move {
            let r = async {
                let client = KinesisEndpoint::new(&env_kinesis, REGION).client().await?;
                let (n, _, _) = produce(&client, &env_kinesis, &stream, f.count, keys, Some(f.rate)).await?;
                anyhow::Ok((n, Instant::now()))
            }
            .await;
            *produced.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        })
    });
    let scope = squall::state::scope(&topology, COMPONENT);
    let deadline = start + Duration::from_secs(300);
    let mut first: Option<Instant> = None;
    let mut worker_cpu = f64::NAN;
    let result: anyhow::Result<u64> = async {
        loop {
            let (sum, _) = table_total(&store, &scope, spec.mode).await?;
            let now = Instant::now();
            if sum > 0 && first.is_none() {
                first = Some(now);
            }
            if let Some(Err(e)) = produced.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                bail!("{topology}: the live producer failed: {e:#}");
            }
            if sum >= expect {
                worker_cpu = cpu_secs(worker.pid(), env.clk_tck);
                return Ok(sum);
            }
            if now > deadline {
                bail!(
                    "{topology}: the table counts {sum} of {expect} records after 300 s (log {})",
                    log_path.display()
                );
            }
            if !worker.alive() {
                bail!(
                    "{topology}: the worker stopped with {sum} of {expect} records counted (log {})",
                    log_path.display()
                );
            }
            // A Scan of 200 items costs dynalite (single-threaded) ~10-20 ms, as much as ~30
            // writes: poll the empty table often (cheap) to see the first count, then once a
            // second, and only close to the end extrapolated from the rate so far, every 50 ms.
            let wait = match first {
                None => Duration::from_millis(100),
                Some(f) => {
                    let rate = sum as f64 / now.duration_since(f).as_secs_f64().max(0.1);
                    let left = (expect - sum) as f64 / rate.max(1.0);
                    if left > 1.5 {
                        Duration::from_secs(1)
                    } else if left > 0.3 {
                        Duration::from_secs_f64(left - 0.2)
                    } else {
                        Duration::from_millis(50)
                    }
                }
            };
            tokio::time::sleep(wait).await;
        }
    }
    .await;
    let (took, done) = (start.elapsed(), Instant::now());
    if let Some(p) = producer {
        p.abort();
    }
    let lag = match produced.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
        Some(Ok((_, at))) => Some(done.saturating_duration_since(*at)),
        _ => None,
    };
    let cpu1 = (cpu_secs(env.dynalite_pid, env.clk_tck), cpu_secs(env.kinesis_pid, env.clk_tck));
    let requests = proxy.as_ref().map(|p| p.requests(proxy_t0, p.started.elapsed())).unwrap_or_default();
    if let Some(dir) = std::env::var_os("SQUALL_BENCH_STATE_DUMP").filter(|_| spec.proxied) {
        // every request of the run, for a closer look: operation, start and latency (us), bytes
        let lines: Vec<String> = requests
            .iter()
            .map(|r| {
                format!(
                    "{},{},{},{},{}",
                    r.op,
                    (r.start - proxy_t0).as_micros(),
                    r.took.as_micros(),
                    r.req_bytes,
                    r.resp_bytes
                )
            })
            .collect();
        let name = spec.label().replace([',', ' '], "_");
        let path = PathBuf::from(dir).join(format!("{name}-{}ms-{topology}.csv", spec.commit_interval_ms));
        std::fs::write(&path, lines.join("\n"))?;
    }
    let load = load_average();
    worker.stop(Duration::from_secs(20));
    let item_bytes =
        if spec.mode == Mode::ExactlyOnce { item_sizes(&store, &scope).await } else { (f64::NAN, f64::NAN) };
    drop(proxy);
    if let Ok(zk) = zk_client(&env.zk).await {
        zk_delete_tree(&zk, &root).await;
    }
    if let Some(client) = store.client() {
        let _ = client.delete_table().table_name(&table).send().await;
    }
    let counted = result?;
    if counted > expect {
        println!(
            "  note: {} {topology} counted {counted} for {expect} records ({})",
            spec.mode.label(),
            if spec.mode == Mode::ExactlyOnce { "an exactly-once BUG" } else { "at-least-once replays" }
        );
    }
    let _ = std::fs::remove_file(&log_path);
    Ok(RunResult {
        spec: spec.clone(),
        records: expect,
        counted,
        lag,
        took,
        counting: took - first.map_or(Duration::ZERO, |f| f.duration_since(start)),
        requests,
        worker_cpu,
        dynalite_cpu: cpu1.0 - cpu0.0,
        kinesis_cpu: cpu1.1 - cpu0.1,
        item_bytes,
        load,
    })
}

// ---------------------------------------------------------------------------------------------
// Request analysis

/// Total length of the union of `[start, start + took)` of `reqs`.
fn busy(reqs: &[&Req]) -> Duration {
    let mut iv: Vec<(Duration, Duration)> = reqs.iter().map(|r| (r.start, r.start + r.took)).collect();
    iv.sort();
    let (mut total, mut cur): (Duration, Option<(Duration, Duration)>) = (Duration::ZERO, None);
    for (s, e) in iv {
        cur = match cur {
            Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total += ce - cs;
                Some((s, e))
            }
            None => Some((s, e)),
        };
    }
    if let Some((cs, ce)) = cur {
        total += ce - cs;
    }
    total
}

const READ_OPS: [&str; 1] = ["BatchGetItem"];
const WRITE_OPS: [&str; 2] = ["PutItem", "UpdateItem"];

fn print_requests(runs: &[&RunResult]) {
    println!();
    println!(
        "| mode | interval ms | records/s | PutItem / record | UpdateItem / record | BatchGetItem / record | all requests / record | records per write | other requests (start-up) |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
    for r in runs {
        let n = r.records as f64;
        let ops = r.ops();
        let data: u64 = ["PutItem", "UpdateItem", "BatchGetItem"].iter().map(|o| r.op_count(o)).sum();
        let writes = r.op_count("PutItem") + r.op_count("UpdateItem");
        let other: Vec<String> = ops
            .iter()
            .filter(|(k, _)| !["PutItem", "UpdateItem", "BatchGetItem"].contains(&k.as_str()))
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        println!(
            "| {} | {} | {:.0} | {:.4} | {:.4} | {:.4} | **{:.4}** | {:.1} | {} |",
            r.spec.label(),
            r.spec.commit_interval_ms,
            r.rate(),
            r.op_count("PutItem") as f64 / n,
            r.op_count("UpdateItem") as f64 / n,
            r.op_count("BatchGetItem") as f64 / n,
            data as f64 / n,
            n / writes.max(1) as f64,
            other.join(", ")
        );
    }
}

fn print_latency(runs: &[&RunResult]) {
    println!();
    println!(
        "| mode | operation | requests | bytes sent / received per request | latency mean / p50 / p99 (ms) | sum of latencies (s) |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: |");
    for r in runs {
        for op in ["BatchGetItem", "PutItem", "UpdateItem"] {
            let reqs: Vec<&Req> = r.requests.iter().filter(|q| q.op == op).collect();
            if reqs.is_empty() {
                continue;
            }
            let mut ms: Vec<f64> = reqs.iter().map(|q| q.took.as_secs_f64() * 1e3).collect();
            ms.sort_by(|a, b| a.total_cmp(b));
            let k = reqs.len() as f64;
            println!(
                "| {} | {op} | {} | {:.0} / {:.0} | {:.2} / {:.2} / {:.2} | {:.2} |",
                r.spec.label(),
                reqs.len(),
                reqs.iter().map(|q| q.req_bytes).sum::<usize>() as f64 / k,
                reqs.iter().map(|q| q.resp_bytes).sum::<usize>() as f64 / k,
                ms.iter().sum::<f64>() / k,
                percentile(&ms, 0.5),
                percentile(&ms, 0.99),
                ms.iter().sum::<f64>() / 1e3
            );
        }
    }
    println!();
    println!(
        "| mode | run (s) | a read in flight | a write in flight | any data request in flight | none in flight | dynalite CPU (s, % of run) | Kinesis engine CPU (s) | worker CPU (s) | CPU ms per 1000 records: dynalite / worker | item state / dedup bytes (mean) |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in runs {
        let secs = r.took.as_secs_f64();
        let pct = |ops: &[&str]| {
            let reqs: Vec<&Req> = r.requests.iter().filter(|q| ops.contains(&q.op.as_str())).collect();
            busy(&reqs).as_secs_f64() * 100.0 / secs
        };
        let all: Vec<&str> = READ_OPS.iter().chain(WRITE_OPS.iter()).copied().collect();
        let any = pct(&all);
        let per_k = |cpu: f64| cpu * 1e3 * 1000.0 / r.records as f64;
        println!(
            "| {} | {:.1} | {:.0}% | {:.0}% | {:.0}% | {:.0}% | {:.1} ({:.0}%) | {:.1} | {:.1} | {:.0} / {:.0} | {:.0} / {:.0} |",
            r.spec.label(),
            secs,
            pct(&READ_OPS),
            pct(&WRITE_OPS),
            any,
            100.0 - any,
            r.dynalite_cpu,
            r.dynalite_cpu * 100.0 / secs,
            r.kinesis_cpu,
            r.worker_cpu,
            per_k(r.dynalite_cpu),
            per_k(r.worker_cpu),
            r.item_bytes.0,
            r.item_bytes.1
        );
    }
}

/// Commit rounds of a run with ONE counting task: a round starts with a read that starts after
/// every request before it ended (exactly-once), or with a write that starts more than 5 ms after
/// every request before it ended (at-least-once: the bolt sends a round's writes one after
/// another while the first ones are answered; rounds are a commit interval apart).
/// Per round: (reading, writing, from its end to the next round's start).
fn rounds_of(r: &RunResult) -> Vec<(Duration, Duration, Duration)> {
    let mut reqs: Vec<&Req> =
        r.requests.iter().filter(|q| READ_OPS.contains(&q.op.as_str()) || WRITE_OPS.contains(&q.op.as_str())).collect();
    reqs.sort_by_key(|q| q.start);
    let mut rounds: Vec<Vec<&Req>> = Vec::new();
    let mut end = Duration::ZERO;
    for q in reqs {
        let opens = match r.spec.mode {
            Mode::ExactlyOnce => q.op == "BatchGetItem" && q.start >= end,
            Mode::AtLeastOnce => q.start > end + Duration::from_millis(5),
        };
        if rounds.is_empty() || opens {
            rounds.push(Vec::new());
        }
        end = end.max(q.start + q.took);
        rounds.last_mut().expect("pushed above").push(q);
    }
    let spans: Vec<(Duration, Duration, Duration)> = rounds
        .iter()
        .map(|rd| {
            let start = rd.iter().map(|q| q.start).min().unwrap_or_default();
            let reads_end = rd
                .iter()
                .filter(|q| READ_OPS.contains(&q.op.as_str()))
                .map(|q| q.start + q.took)
                .max()
                .unwrap_or(start);
            let end = rd.iter().map(|q| q.start + q.took).max().unwrap_or(start);
            (start, reads_end, end)
        })
        .collect();
    spans
        .iter()
        .enumerate()
        .map(|(i, &(start, reads_end, end))| {
            let next = spans.get(i + 1).map_or(end, |s| s.0);
            (reads_end - start, end - reads_end, next.saturating_sub(end))
        })
        .collect()
}

fn print_rounds(runs: &[&RunResult]) {
    println!();
    println!(
        "| run | records/s | rounds | records / round | writes / round | round: reading ms (mean) | writing ms (mean) | between rounds ms (mean) | share of the run: reading / writing / between / before the first round |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
    for r in runs {
        let rounds = rounds_of(r);
        let k = rounds.len().max(1) as f64;
        let sum = |f: fn(&(Duration, Duration, Duration)) -> Duration| {
            rounds.iter().map(f).map(|d| d.as_secs_f64()).sum::<f64>()
        };
        let (read, write, between) = (sum(|x| x.0), sum(|x| x.1), sum(|x| x.2));
        let secs = r.took.as_secs_f64();
        let before = r
            .requests
            .iter()
            .filter(|q| q.op == "BatchGetItem" || WRITE_OPS.contains(&q.op.as_str()))
            .map(|q| q.start)
            .min();
        let before = before.map_or(0.0, |b| b.as_secs_f64());
        let writes = r.op_count("PutItem") + r.op_count("UpdateItem");
        println!(
            "| {} | {:.0} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0}% / {:.0}% / {:.0}% / {:.0}% |",
            r.spec.label(),
            r.rate(),
            rounds.len(),
            r.records as f64 / k,
            writes as f64 / k,
            read * 1e3 / k,
            write * 1e3 / k,
            between * 1e3 / k,
            read * 100.0 / secs,
            write * 100.0 / secs,
            between * 100.0 / secs,
            before * 100.0 / secs
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Sections

async fn compare(env: &Env, stream: &str, summary: &mut Vec<String>) -> anyhow::Result<()> {
    println!(
        "\n## compare: exactly-once vs at-least-once counts, {} interleaved rounds (straight to dynalite)\n",
        env.rounds
    );
    let (mut eo, mut alo, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    let (mut eo_c, mut alo_c) = (Vec::new(), Vec::new());
    let mut exact = Vec::new();
    println!(
        "| round | first | exactly-once rec/s (s) | at-least-once rec/s (s) | **ratio** | exactly-once / at-least-once from the first count | load average |"
    );
    println!("| ---: | --- | ---: | ---: | ---: | ---: | --- |");
    for round in 0..env.rounds {
        let order = if round % 2 == 0 {
            [Mode::ExactlyOnce, Mode::AtLeastOnce]
        } else {
            [Mode::AtLeastOnce, Mode::ExactlyOnce]
        };
        let mut got: BTreeMap<&str, RunResult> = BTreeMap::new();
        for m in order {
            got.insert(m.label(), run_once(env, stream, &Spec::new(m), None).await?);
        }
        let (e, a) = (&got["exactly-once"], &got["at-least-once"]);
        exact.push(format!("{} / {}", e.counted, a.counted));
        let n = env.records as f64;
        let (ce, ca) = (n / e.counting.as_secs_f64().max(1e-6), n / a.counting.as_secs_f64().max(1e-6));
        eo.push(e.rate());
        alo.push(a.rate());
        eo_c.push(ce);
        alo_c.push(ca);
        ratio.push(e.rate() / a.rate());
        println!(
            "| {} | {} | {:.0} ({:.1}) | {:.0} ({:.1}) | **{:.2}** | {:.2} ({:.0} / {:.0}) | {} |",
            round + 1,
            order[0].label(),
            e.rate(),
            e.took.as_secs_f64(),
            a.rate(),
            a.took.as_secs_f64(),
            e.rate() / a.rate(),
            ce / ca,
            ce,
            ca,
            e.load
        );
    }
    let cratio: Vec<f64> = eo_c.iter().zip(&alo_c).map(|(e, a)| e / a).collect();
    println!(
        "| **median** | | **{:.0}** | **{:.0}** | **{:.2}** | {:.2} ({:.0} / {:.0}) | |",
        median(&eo),
        median(&alo),
        median(&ratio),
        median(&cratio),
        median(&eo_c),
        median(&alo_c)
    );
    println!("\ncounted at the end (exactly-once / at-least-once) per round, of {}: {}", env.records, exact.join(", "));
    let met = if median(&ratio) >= 0.5 { "met" } else { "NOT met" };
    summary.push(format!(
        "compare: exactly-once {:.0} rec/s, at-least-once {:.0} rec/s, ratio {:.2} (per round {:?}; target >= 0.5 on dynalite: {met})",
        median(&eo),
        median(&alo),
        median(&ratio),
        round2(&ratio)
    ));
    Ok(())
}

async fn requests(env: &Env, stream: &str, summary: &mut Vec<String>) -> anyhow::Result<()> {
    println!("\n## requests: DynamoDB requests per record, through a counting proxy (commit interval 50 ms)\n");
    let mut runs = Vec::new();
    for m in [Mode::ExactlyOnce, Mode::AtLeastOnce] {
        let spec = Spec { proxied: true, ..Spec::new(m) };
        runs.push(run_once(env, stream, &spec, None).await?);
    }
    let refs: Vec<&RunResult> = runs.iter().collect();
    print_requests(&refs);
    print_latency(&refs);
    let n = env.records as f64;
    let (e, a) = (&runs[0], &runs[1]);
    summary.push(format!(
        "requests per record at 50 ms: exactly-once PutItem {:.4} + BatchGetItem {:.4}; at-least-once UpdateItem {:.4}; proxied rec/s {:.0} vs {:.0} (ratio {:.2})",
        e.op_count("PutItem") as f64 / n,
        e.op_count("BatchGetItem") as f64 / n,
        a.op_count("UpdateItem") as f64 / n,
        e.rate(),
        a.rate(),
        e.rate() / a.rate()
    ));
    Ok(())
}

async fn batching(env: &Env, stream: &str, summary: &mut Vec<String>) -> anyhow::Result<()> {
    println!("\n## batching: --commit-interval-ms 10 / 50 / 200, through the counting proxy\n");
    let mut runs = Vec::new();
    for interval in [10, 50, 200] {
        for m in [Mode::ExactlyOnce, Mode::AtLeastOnce] {
            let spec = Spec { proxied: true, commit_interval_ms: interval, ..Spec::new(m) };
            let r = run_once(env, stream, &spec, None).await?;
            println!(
                "  {} {interval} ms: {:.0} rec/s, {} writes",
                m.label(),
                r.rate(),
                r.op_count("PutItem") + r.op_count("UpdateItem")
            );
            runs.push(r);
        }
    }
    let refs: Vec<&RunResult> = runs.iter().collect();
    print_requests(&refs);
    let mut parts = Vec::new();
    for pair in runs.chunks(2) {
        let (e, a) = (&pair[0], &pair[1]);
        parts.push(format!(
            "{} ms: exactly-once {:.3} writes/record {:.0} rec/s, at-least-once {:.3} writes/record {:.0} rec/s, ratio {:.2}",
            e.spec.commit_interval_ms,
            e.writes_per_record(),
            e.rate(),
            a.writes_per_record(),
            a.rate(),
            e.rate() / a.rate()
        ));
    }
    summary.push(format!("batching: {}", parts.join("; ")));
    Ok(())
}

/// One kind of request, sent `rounds` times for each of `keys` keys (a round's keys
/// concurrently, `concurrency` at a time, rounds one after another): wall time and dynalite CPU
/// per request.
async fn op_cost<F, Fut>(env: &Env, keys: usize, rounds: usize, concurrency: usize, f: F) -> anyhow::Result<(f64, f64)>
where
    F: Fn(usize, usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    use futures::StreamExt;
    let cpu0 = cpu_secs(env.dynalite_pid, env.clk_tck);
    let start = Instant::now();
    for round in 0..rounds {
        let results: Vec<anyhow::Result<()>> =
            futures::stream::iter((0..keys).map(|k| f(round, k))).buffer_unordered(concurrency).collect().await;
        results.into_iter().collect::<anyhow::Result<()>>()?;
    }
    let n = (keys * rounds) as f64;
    let cpu = cpu_secs(env.dynalite_pid, env.clk_tck) - cpu0;
    Ok((start.elapsed().as_secs_f64() * 1e3 / n, cpu * 1e3 / n))
}

/// What one request of each kind costs dynalite, outside any topology: 200 keys x 20 rounds,
/// 32 in flight (the bolt's `write_concurrency`).
async fn ops(env: &Env, summary: &mut Vec<String>) -> anyhow::Result<()> {
    const KEYS: usize = 200;
    const ROUNDS: usize = 20;
    println!(
        "\n## ops: one request of each kind against dynalite, no topology ({KEYS} keys x {ROUNDS} rounds, 32 in flight, straight to dynalite)\n"
    );
    let table = unique("bench-state-ops");
    let store = StateStore::open(&StateEndpoint::new(env.dynamo.clone(), table.clone())).await?;
    let scope = "bench/ops".to_string();
    // a dedup blob like the bolt's at max pending 1000 (~600 bytes: 4 shards, a floor and ~5
    // applied ids each) and a small one (floors only)
    let dedup = |applied: usize| -> Vec<u8> {
        let mut d = squall::state::Dedup::default();
        for shard in 0..4 {
            let sd = d.shards.entry(format!("bench/shardId-00000000000{shard}")).or_default();
            sd.floor = Some(format!("4968074214199423889193696863274580293552738217778112{shard:04}"));
            sd.token = 7;
            for i in 0..applied {
                sd.applied
                    .insert(format!("49680742141994238891936968632745802935527382177781{i:06}:0"), Default::default());
            }
        }
        serde_json::to_vec(&d).unwrap_or_default()
    };
    let (big, small) = (dedup(1), dedup(0));
    let result: anyhow::Result<Vec<(String, f64, f64)>> = async {
        let mut rows = Vec::new();
        let client = store.client().expect("a DynamoDB table").clone();
        // two passes over every kind; the first warms dynalite up, the second is reported
        for pass in 0..2 {
            rows.clear();
            let base = pass * ROUNDS;
            let (wall, cpu) = op_cost(env, KEYS, ROUNDS, 32, |_, k| {
                let (client, table, pk) = (client.clone(), table.clone(), format!("{scope}/alo-{k}"));
                async move {
                    client
                        .update_item()
                        .table_name(table)
                        .key("pk", AttributeValue::S(pk))
                        .update_expression("SET #s = :scope, #k = :key ADD #c :n")
                        .expression_attribute_names("#s", "scope")
                        .expression_attribute_names("#k", "key")
                        .expression_attribute_names("#c", "count")
                        .expression_attribute_values(":scope", AttributeValue::S("bench/ops".into()))
                        .expression_attribute_values(":key", AttributeValue::S(format!("key-{k}")))
                        .expression_attribute_values(":n", AttributeValue::N("5".into()))
                        .send()
                        .await
                        .map(|_| ())
                        .map_err(|e| anyhow::anyhow!("{}", aws_sdk_dynamodb::error::DisplayErrorContext(e)))
                }
            })
            .await?;
            rows.push(("UpdateItem ADD (at-least-once)".to_string(), wall, cpu));
            for (label, blob, prefix) in [
                (format!("conditional PutItem, dedup {} bytes (exactly-once)", big.len()), &big, "eo"),
                (format!("conditional PutItem, dedup {} bytes (floors only)", small.len()), &small, "eo-small"),
            ] {
                let (wall, cpu) = op_cost(env, KEYS, ROUNDS, 32, |round, k| {
                    let (store, scope, blob) = (store.clone(), scope.clone(), blob.clone());
                    let (pk, key) = (format!("{scope}/{prefix}-{k}"), format!("{prefix}-{k}"));
                    async move {
                        let expected = (base + round > 0).then_some((base + round) as u64);
                        match store.put(&pk, &scope, &key, expected, b"42".to_vec(), blob, None).await? {
                            squall::state::WriteOutcome::Written => Ok(()),
                            squall::state::WriteOutcome::Conflict => bail!("unexpected conflict on {pk}"),
                        }
                    }
                })
                .await?;
                rows.push((label, wall, cpu));
            }
            let (wall, cpu) = op_cost(env, KEYS, ROUNDS, 32, |_, k| {
                let (client, table, blob) = (client.clone(), table.clone(), big.clone());
                async move {
                    client
                        .put_item()
                        .table_name(table)
                        .item("pk", AttributeValue::S(format!("bench/ops/plain-{k}")))
                        .item("scope", AttributeValue::S("bench/ops".into()))
                        .item("key", AttributeValue::S(format!("plain-{k}")))
                        .item("ver", AttributeValue::N("1".into()))
                        .item("state", AttributeValue::B(b"42".to_vec().into()))
                        .item("dedup", AttributeValue::B(blob.into()))
                        .item("updated_ms", AttributeValue::N("0".into()))
                        .send()
                        .await
                        .map(|_| ())
                        .map_err(|e| anyhow::anyhow!("{}", aws_sdk_dynamodb::error::DisplayErrorContext(e)))
                }
            })
            .await?;
            rows.push((format!("unconditional PutItem, dedup {} bytes", big.len()), wall, cpu));
            // the bolt's read: BatchGetItem of 100 keys, strongly consistent
            let (wall, cpu) = op_cost(env, 2, ROUNDS, 2, |_, half| {
                let store = store.clone();
                let pks: Vec<String> =
                    (half * 100..half * 100 + 100).map(|k| format!("{}/eo-{k}", "bench/ops")).collect();
                async move {
                    let got = store.get_many(&pks).await?;
                    if got.len() != pks.len() {
                        bail!("BatchGetItem returned {} of {} items", got.len(), pks.len());
                    }
                    Ok(())
                }
            })
            .await?;
            rows.push(("BatchGetItem of 100 items (exactly-once read)".to_string(), wall, cpu));
            // the bench's own poll, for scale: a consistent Scan of the whole table (4 x 200 items)
            let (wall, cpu) = op_cost(env, 1, ROUNDS, 1, |_, _| {
                let store = store.clone();
                async move { table_total(&store, "bench/ops", Mode::ExactlyOnce).await.map(|_| ()) }
            })
            .await?;
            rows.push((
                format!("Scan of {} items (the bench's poll of a run's table holds {})", 4 * KEYS, env.keys),
                wall,
                cpu,
            ));
        }
        Ok(rows)
    }
    .await;
    if let Some(client) = store.client() {
        let _ = client.delete_table().table_name(&table).send().await;
    }
    let rows = result?;
    println!("| request | wall ms per request (32 in flight) | dynalite CPU ms per request |");
    println!("| --- | ---: | ---: |");
    for (label, wall, cpu) in &rows {
        println!("| {label} | {wall:.2} | {cpu:.2} |");
    }
    summary.push(format!(
        "ops, dynalite CPU ms per request: {}",
        rows.iter().map(|(l, _, c)| format!("{l} {c:.2}")).collect::<Vec<_>>().join("; ")
    ));
    Ok(())
}

/// Live input rate of the `steady` section (records/s) and how long the producer runs (s).
const STEADY_RATE: f64 = 2000.0;
const STEADY_SECS: u64 = 10;

async fn steady(env: &Env, summary: &mut Vec<String>) -> anyhow::Result<()> {
    let count = (STEADY_RATE as u64) * STEADY_SECS;
    println!(
        "\n## steady: a live producer at {STEADY_RATE} rec/s over {} keys for {STEADY_SECS} s ({count} records) into a fresh empty stream per run, --commit-interval-ms 10 / 50 / 200 / 1000, through the counting proxy\n",
        env.keys
    );
    let client = KinesisEndpoint::new(&env.kinesis, REGION).client().await?;
    let mut runs = Vec::new();
    for interval in [10, 50, 200, 1000] {
        for m in [Mode::ExactlyOnce, Mode::AtLeastOnce] {
            let stream = unique("bench-state-live");
            squall::kinesis::create_stream(&client, &env.kinesis, &stream, SHARDS)
                .await
                .with_context(|| format!("creating stream {stream}"))?;
            let spec = Spec { proxied: true, commit_interval_ms: interval, ..Spec::new(m) };
            let r = run_once(env, &stream, &spec, Some(Feed { rate: STEADY_RATE, count })).await;
            let _ = squall::kinesis::delete_stream(&client, &env.kinesis, &stream).await;
            runs.push(r?);
        }
    }
    println!(
        "| mode | interval ms | writes / record | records per write | BatchGetItem / record | all requests / record | counted after the last put (ms) | item dedup bytes (mean) |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in &runs {
        let n = r.records as f64;
        let data = r.op_count("PutItem") + r.op_count("UpdateItem") + r.op_count("BatchGetItem");
        println!(
            "| {} | {} | **{:.3}** | {:.1} | {:.4} | {:.3} | {:.0} | {:.0} |",
            r.spec.label(),
            r.spec.commit_interval_ms,
            r.writes_per_record(),
            1.0 / r.writes_per_record().max(1e-9),
            r.op_count("BatchGetItem") as f64 / n,
            data as f64 / n,
            r.lag.map_or(f64::NAN, |l| l.as_secs_f64() * 1e3),
            r.item_bytes.1
        );
    }
    let parts: Vec<String> = runs
        .chunks(2)
        .map(|p| {
            format!(
                "{} ms: exactly-once {:.3}, at-least-once {:.3}",
                p[0].spec.commit_interval_ms,
                p[0].writes_per_record(),
                p[1].writes_per_record()
            )
        })
        .collect();
    summary.push(format!("steady {STEADY_RATE} rec/s, writes per record: {}", parts.join("; ")));
    Ok(())
}

async fn diagnose(env: &Env, stream: &str, summary: &mut Vec<String>) -> anyhow::Result<()> {
    println!("\n## diagnose: where a commit round's time goes (one counting task, through the proxy)\n");
    let mut runs = Vec::new();
    for m in [Mode::ExactlyOnce, Mode::AtLeastOnce] {
        let spec = Spec { proxied: true, counters: 1, ..Spec::new(m) };
        runs.push(run_once(env, stream, &spec, None).await?);
    }
    let refs: Vec<&RunResult> = runs.iter().collect();
    print_rounds(&refs);
    print_latency(&refs);
    summary.push(format!(
        "diagnose, 1 counting task: exactly-once {:.0} rec/s, at-least-once {:.0} rec/s (ratio {:.2})",
        runs[0].rate(),
        runs[1].rate(),
        runs[0].rate() / runs[1].rate()
    ));

    println!(
        "\n## diagnose: both modes with --max-spout-pending 5000 (2 counting tasks, through the proxy): the spout's in-flight bound lifted\n"
    );
    let mut runs = Vec::new();
    for m in [Mode::ExactlyOnce, Mode::AtLeastOnce] {
        let spec = Spec { proxied: true, max_spout_pending: Some(5000), ..Spec::new(m) };
        runs.push(run_once(env, stream, &spec, None).await?);
    }
    let refs: Vec<&RunResult> = runs.iter().collect();
    print_requests(&refs);
    print_latency(&refs);
    summary.push(format!(
        "diagnose, max spout pending 5000: exactly-once {:.0} rec/s, at-least-once {:.0} rec/s (ratio {:.2})",
        runs[0].rate(),
        runs[1].rate(),
        runs[0].rate() / runs[1].rate()
    ));
    Ok(())
}

/// Writes `count` records over `keys` keys with 4 concurrent producers (`keys / 4` keys each,
/// distinct prefixes), at `rate` records/s in all or as fast as they go: records written,
/// distinct keys, time taken.
async fn produce(
    client: &aws_sdk_kinesis::Client,
    endpoint: &str,
    stream: &str,
    count: u64,
    keys: u64,
    rate: Option<f64>,
) -> anyhow::Result<(u64, usize, Duration)> {
    let producers = 4u64.min(keys);
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for p in 0..producers {
        let opts = PutOptions {
            count: count / producers + u64::from(p < count % producers),
            keys: keys / producers + u64::from(p < keys % producers),
            rate: rate.map(|r| r / producers as f64),
            size: 100,
            key_prefix: format!("p{p}-key-"),
            ..PutOptions::default()
        };
        let (client, endpoint, stream) = (client.clone(), endpoint.to_string(), stream.to_string());
        set.spawn(async move { squall::kinesis::put_records(&client, &endpoint, &stream, &opts).await });
    }
    let (mut total, mut distinct) = (0, 0);
    while let Some(r) = set.join_next().await {
        let report = r??;
        total += report.manifest.total;
        distinct += report.manifest.counts.len();
    }
    Ok((total, distinct, start.elapsed()))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let env = Env::load().await?;
    let wanted: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let run = |s: &str| wanted.is_empty() || wanted.iter().any(|w| w == s);
    let started = Instant::now();
    println!("# Squall exactly-once state benchmark");
    println!(
        "{} {} (pid {:?}), dynalite {} (pid {:?}), ZooKeeper {}, {} cores, load average {}",
        env.engine,
        env.kinesis,
        env.kinesis_pid,
        env.dynamo,
        env.dynalite_pid,
        env.zk,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        load_average()
    );
    if !reachable(&env.kinesis).await {
        bail!("{} does not answer at {}: start it (localstack/up, localstack/kinesalite-up)", env.engine, env.kinesis);
    }
    let client = KinesisEndpoint::new(&env.kinesis, REGION).client().await?;
    let stream = unique("bench-state");
    squall::kinesis::create_stream(&client, &env.kinesis, &stream, SHARDS)
        .await
        .with_context(|| format!("creating stream {stream}"))?;
    let result: anyhow::Result<Vec<String>> = async {
        let backlog = ["compare", "requests", "batching", "diagnose"].iter().any(|s| run(s));
        let (put, keys, took) = if backlog {
            produce(&client, &env.kinesis, &stream, env.records, env.keys, None).await?
        } else {
            (env.records, env.keys as usize, Duration::ZERO)
        };
        println!(
            "stream {stream} on {}: {SHARDS} shards, {put} records over {keys} keys (~100-byte payloads), put in {:.1} s; worker: examples/exactly_once_counts (1 spout task, 2 counting tasks with a fields grouping on the key, max spout pending 1000, commit interval 50 ms, unless stated)",
            env.engine,
            took.as_secs_f64()
        );
        if put != env.records {
            bail!("put {put} records, not {}", env.records);
        }
        let mut summary = Vec::new();
        let mut failed = Vec::new();
        if run("compare")
            && let Err(e) = compare(&env, &stream, &mut summary).await {
                failed.push(format!("compare: {e:#}"));
            }
        if run("requests")
            && let Err(e) = requests(&env, &stream, &mut summary).await {
                failed.push(format!("requests: {e:#}"));
            }
        if run("batching")
            && let Err(e) = batching(&env, &stream, &mut summary).await {
                failed.push(format!("batching: {e:#}"));
            }
        if run("ops")
            && let Err(e) = ops(&env, &mut summary).await {
                failed.push(format!("ops: {e:#}"));
            }
        if run("steady")
            && let Err(e) = steady(&env, &mut summary).await {
                failed.push(format!("steady: {e:#}"));
            }
        if run("diagnose")
            && let Err(e) = diagnose(&env, &stream, &mut summary).await {
                failed.push(format!("diagnose: {e:#}"));
            }
        println!();
        for s in &summary {
            println!("{s}");
        }
        if !failed.is_empty() {
            bail!("failed sections:\n{}", failed.join("\n"));
        }
        Ok(summary)
    }
    .await;
    let _ = squall::kinesis::delete_stream(&client, &env.kinesis, &stream).await;
    let _ = std::fs::remove_dir_all(&env.dir);
    println!("\nstate benchmark took {:.0} s", started.elapsed().as_secs_f64());
    result.map(|_| ())
}
