//! KPL de-aggregation throughput (`cargo bench --bench kpl`, part of `make bench`): user records
//! per second delivered by an audit worker process (Kinesis spout -> sink, acking on) reading a
//! pre-filled 4-shard kinesis-local stream, plain records vs KPL aggregates of 100 user records
//! (`squall stream put --aggregate 100`'s producer), interleaved plain, aggregated, plain,
//! aggregated..., medians. Rate = user records / (last delivery - first delivery), from the
//! deliveries' own timestamps, so worker start-up and shard assignment are not counted.
//!
//! `SQUALL_BENCH_REPS` (default 2) and `SQUALL_BENCH_KPL_RECORDS` (user records per run, default
//! 5000) set the size. Needs ZooKeeper and kinesis-local (`localstack/up`) and the audit example
//! (`cargo build --release --examples`, or the debug build).

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use squall::audit::Delivery;
use squall::kinesis::{self, KinesisEndpoint, PutOptions};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn audit_bin() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target");
    let release = root.join("release/examples/audit");
    if release.exists() { release } else { root.join("debug/examples/audit") }
}

/// One run: a fresh stream filled with `users` user records (`aggregate` per Kinesis record, 0 =
/// plain), read by a fresh worker; user records per second.
async fn run(ep: &KinesisEndpoint, users: u64, aggregate: usize) -> anyhow::Result<f64> {
    let client = ep.client().await?;
    let label = ep.label();
    let stream = common::unique("kplbench");
    kinesis::create_stream(&client, &label, &stream, 4).await?;
    let opts = PutOptions { count: users, keys: 200, size: 100, aggregate, ..PutOptions::default() };
    kinesis::put_records(&client, &label, &stream, &opts).await?;
    let dir = std::env::temp_dir().join(common::unique("kplbench"));
    std::fs::create_dir_all(&dir)?;
    let deliveries = dir.join("d.jsonl");
    let zk = std::env::var("SQUALL_ZK").unwrap_or_else(|_| "127.0.0.1:2181".into());
    let mut child = Command::new(audit_bin())
        .args(["--topology", &common::unique("t"), "--stream", &stream, "--zk", &zk])
        .args(["--zk-root", &format!("/squall-bench-{}", common::unique("kpl")), "--endpoint", &ep.endpoint])
        .args(["--spout-tasks", "2", "--deliveries", deliveries.to_str().unwrap_or_default()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let start = Instant::now();
    let mut lines: Vec<Delivery> = Vec::new();
    while start.elapsed() < Duration::from_secs(300) {
        let text = std::fs::read_to_string(&deliveries).unwrap_or_default();
        if text.lines().count() as u64 >= users {
            lines = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = kinesis::delete_stream(&client, &label, &stream).await;
    let _ = std::fs::remove_dir_all(&dir);
    anyhow::ensure!(lines.len() as u64 >= users, "only {} of {users} user records delivered in 300 s", lines.len());
    let first = lines.iter().map(|d| d.t_us).min().unwrap_or(0);
    let last = lines.iter().map(|d| d.t_us).max().unwrap_or(0);
    Ok(users as f64 / ((last - first).max(1) as f64 / 1e6))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let ep = KinesisEndpoint::new(
        std::env::var("SQUALL_KINESIS_ENDPOINT").unwrap_or_else(|_| kinesis::DEFAULT_ENDPOINT.into()),
        kinesis::DEFAULT_REGION,
    );
    let reps = env_u64("SQUALL_BENCH_REPS", 2);
    let users = env_u64("SQUALL_BENCH_KPL_RECORDS", 5000);
    let (mut plain, mut agg) = (Vec::new(), Vec::new());
    for rep in 0..reps {
        let p = run(&ep, users, 0).await?;
        let a = run(&ep, users, 100).await?;
        println!("kpl rep {rep}: plain {p:.0} user records/s, aggregated x100 {a:.0} user records/s");
        plain.push(p);
        agg.push(a);
    }
    let (p, a) = (common::median(&plain), common::median(&agg));
    println!(
        "kpl: {users} user records, 4 shards, kinesis-local: plain {p:.0}/s, KPL aggregates of 100 {a:.0}/s (median of {reps}), ratio {:.2}",
        a / p
    );
    Ok(())
}
