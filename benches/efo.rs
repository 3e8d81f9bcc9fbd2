//! Delivery latency, polling vs enhanced fan-out (`cargo bench --bench efo`, part of `make bench`):
//! two audit worker processes read the SAME 2-shard kinesis-local stream at the same time, one as
//! a polling topology (the defaults: 5 GetRecords per second at most, 1 s after an empty read),
//! one as an EFO topology (`--consumer efo:NAME`), each with its own topology name and ZooKeeper
//! root, while a producer puts audit records at a steady rate. Latency = the delivery's time in
//! the sink bolt - the time the PutRecords call carrying the record returned, per record and per
//! consumer. Records put in the first `SQUALL_BENCH_EFO_WARM_S` (default 5) seconds are not
//! measured; the next `SQUALL_BENCH_EFO_MEASURE_S` (default 20) are. Each of the
//! `SQUALL_BENCH_REPS` (default 3) rounds uses a fresh stream and alternates which worker starts
//! first; percentiles are pooled over the rounds and given per round.
//!
//! Needs ZooKeeper and kinesis-local (`localstack/up`) and the audit example
//! (`cargo build --release --examples`, or the debug build).

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use squall::audit::Delivery;
use squall::kinesis::payload::AuditPayload;
use squall::kinesis::{self, KinesisEndpoint};

const RATE: f64 = 100.0;
const KEYS: u64 = 50;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn audit_bin() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target");
    let release = root.join("release/examples/audit");
    if release.exists() { release } else { root.join("debug/examples/audit") }
}

fn now_ms() -> i64 {
    squall::coord::now_ms()
}

/// Starts an audit worker of its own topology on `stream`, with `extra` flags.
fn worker(ep: &KinesisEndpoint, stream: &str, deliveries: &Path, extra: &[&str]) -> anyhow::Result<Child> {
    let zk = std::env::var("SQUALL_ZK").unwrap_or_else(|_| "127.0.0.1:2181".into());
    Ok(Command::new(audit_bin())
        .args(["--topology", &common::unique("t"), "--stream", stream, "--zk", &zk])
        .args(["--zk-root", &format!("/squall-bench-{}", common::unique("efo")), "--endpoint", &ep.endpoint])
        .args(["--spout-tasks", "1", "--deliveries", deliveries.to_str().unwrap_or_default()])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?)
}

/// Puts audit records at `RATE` per second until `stop`, every 20 ms the records due; returns the
/// time (ms) each (key, seq) was acknowledged by Kinesis.
async fn produce(
    client: aws_sdk_kinesis::Client,
    stream: String,
    run: String,
    until: Instant,
) -> HashMap<(String, u64), i64> {
    let put: Arc<Mutex<HashMap<(String, u64), i64>>> = Arc::default();
    let mut timer = tokio::time::interval(Duration::from_millis(20));
    let (mut n, start) = (0u64, Instant::now());
    while Instant::now() < until {
        timer.tick().await;
        let due = (start.elapsed().as_secs_f64() * RATE) as u64;
        if due <= n {
            continue;
        }
        let ids: Vec<(String, u64)> = (n..due).map(|i| (format!("k{}", i % KEYS), i / KEYS)).collect();
        n = due;
        let entries: Vec<_> = ids
            .iter()
            .filter_map(|(key, seq)| {
                let data = serde_json::to_vec(&AuditPayload::new(&run, key, *seq, 100)).ok()?;
                aws_sdk_kinesis::types::PutRecordsRequestEntry::builder()
                    .partition_key(key)
                    .data(aws_sdk_kinesis::primitives::Blob::new(data))
                    .build()
                    .ok()
            })
            .collect();
        match client.put_records().stream_name(&stream).set_records(Some(entries)).send().await {
            Ok(out) => {
                let t = now_ms();
                let mut put = put.lock().unwrap_or_else(|p| p.into_inner());
                for (id, r) in ids.into_iter().zip(out.records()) {
                    if r.error_code().is_none() {
                        put.insert(id, t);
                    }
                }
            }
            Err(e) => eprintln!("producer on {stream}: {}", aws_sdk_kinesis::error::DisplayErrorContext(e)),
        }
    }
    std::mem::take(&mut *put.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Latencies (ms) of the measured records in a delivery file (first delivery of each record).
fn latencies(path: &Path, put: &HashMap<(String, u64), i64>, window: &std::ops::Range<i64>) -> Vec<i64> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut first: HashMap<(String, u64), i64> = HashMap::new();
    for d in text.lines().filter_map(|l| serde_json::from_str::<Delivery>(l).ok()) {
        let t = d.t_us / 1000;
        let e = first.entry((d.key, d.seq)).or_insert(t);
        *e = (*e).min(t);
    }
    let mut v: Vec<i64> =
        put.iter().filter(|(_, t)| window.contains(t)).filter_map(|(id, t)| first.get(id).map(|d| d - t)).collect();
    v.sort_unstable();
    v
}

fn pct(sorted: &[i64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[(((sorted.len() - 1) as f64) * p).round() as usize] as f64
}

/// One round: both workers on a fresh stream; (polling, efo) latencies and records measured.
async fn round(
    ep: &KinesisEndpoint,
    efo_first: bool,
    warm: Duration,
    measure: Duration,
) -> anyhow::Result<[Vec<i64>; 2]> {
    let client = ep.client().await?;
    let label = ep.label();
    let stream = common::unique("efobench");
    kinesis::create_stream(&client, &label, &stream, 2).await?;
    let dir = std::env::temp_dir().join(common::unique("efobench"));
    std::fs::create_dir_all(&dir)?;
    let (dp, de) = (dir.join("polling.jsonl"), dir.join("efo.jsonl"));
    let consumer = format!("efo:{stream}-bench");
    let mut children = Vec::new();
    let order: [bool; 2] = if efo_first { [true, false] } else { [false, true] };
    for efo in order {
        let c =
            if efo { worker(ep, &stream, &de, &["--consumer", &consumer])? } else { worker(ep, &stream, &dp, &[])? };
        children.push(c);
    }
    // Both workers own their shards before anything is measured (the warm-up).
    let run = common::unique("run");
    let t0 = now_ms();
    let put = produce(client.clone(), stream.clone(), run, Instant::now() + warm + measure).await;
    let window = (t0 + warm.as_millis() as i64)..(t0 + (warm + measure).as_millis() as i64);
    let measured = put.values().filter(|t| window.contains(t)).count();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut lp, mut le) = (Vec::new(), Vec::new());
    while Instant::now() < deadline {
        lp = latencies(&dp, &put, &window);
        le = latencies(&de, &put, &window);
        if lp.len() >= measured && le.len() >= measured {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    let _ = kinesis::delete_stream(&client, &label, &stream).await;
    let _ = std::fs::remove_dir_all(&dir);
    anyhow::ensure!(
        lp.len() >= measured && le.len() >= measured,
        "delivered {} (polling) and {} (efo) of {measured} measured records within 60 s",
        lp.len(),
        le.len()
    );
    Ok([lp, le])
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let ep = KinesisEndpoint::new(
        std::env::var("SQUALL_KINESIS_ENDPOINT").unwrap_or_else(|_| kinesis::DEFAULT_ENDPOINT.into()),
        kinesis::DEFAULT_REGION,
    );
    let reps = env_u64("SQUALL_BENCH_REPS", 3);
    let warm = Duration::from_secs(env_u64("SQUALL_BENCH_EFO_WARM_S", 5));
    let measure = Duration::from_secs(env_u64("SQUALL_BENCH_EFO_MEASURE_S", 20));
    println!(
        "efo latency: {RATE} rec/s of ~100 bytes, {KEYS} keys, 2 shards (kinesis-local), {} s warm-up, {} s measured, {reps} rounds, audit worker {}",
        warm.as_secs(),
        measure.as_secs(),
        audit_bin().display()
    );
    let (mut all_p, mut all_e) = (Vec::new(), Vec::new());
    for rep in 0..reps {
        let [p, e] = round(&ep, rep % 2 == 1, warm, measure).await?;
        println!(
            "efo round {rep} ({} first): polling p50 {:.0} / p99 {:.0} ms, EFO p50 {:.0} / p99 {:.0} ms ({} records)",
            if rep % 2 == 1 { "efo" } else { "polling" },
            pct(&p, 0.5),
            pct(&p, 0.99),
            pct(&e, 0.5),
            pct(&e, 0.99),
            p.len()
        );
        all_p.extend(p);
        all_e.extend(e);
    }
    all_p.sort_unstable();
    all_e.sort_unstable();
    println!(
        "efo: put -> bolt latency, pooled over {reps} rounds ({} records each consumer): polling p50 {:.0} / p99 {:.0} / max {:.0} ms; EFO p50 {:.0} / p99 {:.0} / max {:.0} ms",
        all_p.len(),
        pct(&all_p, 0.5),
        pct(&all_p, 0.99),
        pct(&all_p, 1.0),
        pct(&all_e, 0.5),
        pct(&all_e, 0.99),
        pct(&all_e, 1.0)
    );
    Ok(())
}
