//! Coordination benchmark (`cargo bench --bench coord`, part of `make bench`): what ZooKeeper
//! pays for Squall's coordination, and how it grows with shards, tasks and checkpoints.
//!
//! Sections (run all, or name some: `cargo bench --bench coord -- kinesis scale moves`):
//!
//! - `kinesis` (a): 200 shards read by 20 tasks (4 worker processes x 5) on kinesis-local, idle
//!   and under a steady producer: ZooKeeper requests per second (server-wide `zk_packets_received`
//!   from `mntr`, nothing else talking to it), per worker, and per checkpoint write (checkpoint
//!   writes = growth of the checkpoint znodes' versions over the same window).
//! - `scale` (b): 1000 shards, 10 -> 100 tasks (1 -> 10 worker processes x 10 tasks), records
//!   from an in-process simulated stream (`--endpoint sim://...`, see `squall::spout` docs). This
//!   is a COORDINATION-ONLY harness: it follows Kinesis' shard model (sequence numbers, iterators,
//!   limits, MillisBehindLatest) to drive real ZooKeeper coordination at a scale the local Kinesis
//!   engine cannot hold; it never proves correctness. Per step: requests per second, per
//!   checkpoint write, per worker; and per worker process RSS and CPU.
//! - `moves` (c): on the `scale` set-up at 100 tasks, one task joins, then leaves (SIGTERM): shards
//!   moved (assignment before vs after) and the time from the event (the task node's creation, the
//!   SIGTERM) until every moved shard is leased by the task the assignment names.
//!
//! - `watermark` (d): the cost of the committed watermark (`committed_watermark_interval_ms`):
//!   20 shards read by 10 tasks (2 workers x 5) on kinesis-local, idle and under a producer, with
//!   the reports off, then on (every 1000 ms), one after the other: ZooKeeper requests per second
//!   and per task, and the difference per task.
//!
//! - `firers` (e): what window firers (`squall::state::WindowFirer`) cost ZooKeeper at 10 and at
//!   20 tasks (2 and 4 workers x 5, 20 shards, committed watermark reports every 1000 ms): the
//!   bench process runs 2, then 6 firers' ZooKeeper calls (each registered on a session of its
//!   own, every 500 ms: list the firers, read the committed watermark), reading the watermark the
//!   leader publishes (one znode), then computing it from the reports as firers did before (the
//!   assignment and one read per task). Idle; the cost of one more firer (the slope from 2 to 6)
//!   and what having firers at all costs (the leader's publication), against the workers alone.
//!
//! Workers are this binary re-run with `--worker` and the standard worker flags (a no-op bolt).
//! Needs ZooKeeper and kinesis-local on loopback (`make bench` starts them) with room for 200 more
//! shards (`SQUALL_KINESIS_SHARD_LIMIT`, 1000 by default in `localstack/up`).

mod common;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use common::{unique, zk_client, zk_delete_tree};
use squall::coord::{Assignment, moved, now_ms};
use squall::kinesis::{KinesisEndpoint, PutOptions};
use squall::topology::{Bolt, BoltOutput, ComponentError, Tuple};

const REGION: &str = "us-east-1";

/// The no-op bolt of the bench workers.
struct Noop;

impl Bolt for Noop {
    async fn execute(&mut self, _t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        Ok(())
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    if let Some(i) = args.iter().position(|a| a == "--worker") {
        let mut worker_args = vec![args[0].clone()];
        worker_args.extend(args[i + 1..].iter().cloned());
        let w = squall::WorkerArgs::parse_from(worker_args);
        return rt.block_on(squall::run(w, |b, spout| {
            b.set_bolt("noop", 2, |_| Noop).shuffle_grouping(spout);
        }));
    }
    let sections: Vec<String> = args.iter().skip(1).filter(|a| !a.starts_with('-')).cloned().collect();
    let want = |s: &str| sections.is_empty() || sections.iter().any(|x| x == s);
    rt.block_on(async {
        let env = Env::load()?;
        println!("# Coordination benchmark (ZooKeeper {}, Kinesis {})", env.zk, env.kinesis);
        if want("kinesis") {
            kinesis_section(&env).await?;
        }
        if want("scale") || want("moves") {
            scale_section(&env, want("scale"), want("moves")).await?;
        }
        if want("watermark") {
            watermark_section(&env).await?;
        }
        if want("firers") {
            firers_section(&env).await?;
        }
        Ok(())
    })
}

struct Env {
    zk: String,
    kinesis: String,
    exe: PathBuf,
    dir: PathBuf,
}

impl Env {
    fn load() -> anyhow::Result<Self> {
        let var = |k: &str, d: &str| std::env::var(k).ok().filter(|v| !v.is_empty()).unwrap_or_else(|| d.into());
        let dir = std::env::temp_dir().join(unique("squall-coord-bench"));
        std::fs::create_dir_all(&dir)?;
        Ok(Self {
            zk: var("SQUALL_ZK", "127.0.0.1:2181"),
            kinesis: var("SQUALL_KINESIS_ENDPOINT", "http://127.0.0.1:4566"),
            exe: std::env::current_exe()?,
            dir,
        })
    }
}

/// A topology under test: name, root, stream, and its worker processes.
struct Cluster<'a> {
    env: &'a Env,
    topology: String,
    root: String,
    stream: String,
    endpoint: String,
    spout_config: PathBuf,
    workers: Vec<(String, Child)>,
}

impl<'a> Cluster<'a> {
    fn new(env: &'a Env, stream: &str, endpoint: &str, spout: serde_json::Value) -> anyhow::Result<Self> {
        let topology = unique("bench-coord");
        let spout_config = env.dir.join(format!("{topology}.json"));
        std::fs::write(&spout_config, spout.to_string())?;
        Ok(Self {
            env,
            root: format!("/{}", unique("squall-bench-coord")),
            topology,
            stream: stream.to_string(),
            endpoint: endpoint.to_string(),
            spout_config,
            workers: Vec::new(),
        })
    }

    fn stream_path(&self) -> String {
        format!("{}/topologies/{}/streams/{}", self.root, self.topology, self.stream)
    }

    fn tasks_dir(&self) -> String {
        format!("{}/topologies/{}/tasks", self.root, self.topology)
    }

    fn start(&mut self, tasks: usize) -> anyhow::Result<u32> {
        let name = format!("w{}", self.workers.len());
        let log = std::fs::File::create(self.env.dir.join(format!("{}-{name}.log", self.topology)))?;
        let child = Command::new(&self.env.exe)
            .arg("--worker")
            .args(["--topology", &self.topology, "--stream", &self.stream, "--zk-root", &self.root])
            .args(["--zk", &self.env.zk, "--endpoint", &self.endpoint])
            .args(["--spout-tasks", &tasks.to_string(), "--max-spout-pending", "5000"])
            .arg("--spout-config")
            .arg(&self.spout_config)
            .env("RUST_LOG", "warn,squall=info")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting a bench worker")?;
        let pid = child.id();
        self.workers.push((name, child));
        Ok(pid)
    }

    /// SIGTERM the last worker and wait for it.
    fn stop_last(&mut self) -> anyhow::Result<()> {
        if let Some((_, mut child)) = self.workers.pop() {
            signal(child.id(), "TERM");
            let start = Instant::now();
            while child.try_wait()?.is_none() {
                if start.elapsed() > Duration::from_secs(60) {
                    let _ = child.kill();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    fn pids(&self) -> Vec<u32> {
        self.workers.iter().map(|(_, c)| c.id()).collect()
    }
}

impl Drop for Cluster<'_> {
    fn drop(&mut self) {
        for (_, c) in &mut self.workers {
            signal(c.id(), "TERM");
        }
        for (_, c) in &mut self.workers {
            let start = Instant::now();
            while matches!(c.try_wait(), Ok(None)) && start.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status();
}

/// `zk_packets_received` from the four-letter `mntr` command (retried: the server may be busy).
fn zk_packets(connect: &str) -> anyhow::Result<u64> {
    let addr = connect.split(',').next().unwrap_or(connect);
    for _ in 0..20 {
        if let Ok(mut s) = std::net::TcpStream::connect(addr) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(3)));
            let _ = s.write_all(b"mntr");
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            if let Some(v) = out.lines().find_map(|l| l.strip_prefix("zk_packets_received")) {
                return Ok(v.trim().parse()?);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("no `mntr` answer from ZooKeeper at {addr} (4lw.commands.whitelist must allow mntr)")
}

/// Sum of the versions of every checkpoint znode: each checkpoint write adds one.
async fn checkpoint_writes(zk: &zookeeper_client::Client, stream_path: &str) -> anyhow::Result<i64> {
    let dir = format!("{stream_path}/checkpoints");
    let names = zk.list_children(&dir).await?;
    let futs: Vec<_> = names.iter().map(|n| zk.check_stat(&format!("{dir}/{n}"))).collect::<Vec<_>>();
    let mut total = 0i64;
    for f in futs {
        if let Ok(Some(st)) = f.await {
            total += i64::from(st.version);
        }
    }
    Ok(total)
}

async fn assignment(zk: &zookeeper_client::Client, c: &Cluster<'_>) -> Option<Assignment> {
    let (data, _) = zk.get_data(&format!("{}/assignment", c.stream_path())).await.ok()?;
    serde_json::from_slice(&data).ok()
}

/// The holder named in the lowest lease of a shard.
async fn holder(zk: &zookeeper_client::Client, c: &Cluster<'_>, shard: &str) -> Option<String> {
    let mut leases = zk.list_children(&format!("{}/owners/{shard}", c.stream_path())).await.ok()?;
    let seq = |n: &str| n.rsplit_once('-').and_then(|(_, d)| d.parse::<u64>().ok()).unwrap_or(u64::MAX);
    leases.sort_by_key(|n| seq(n));
    let first = leases.first()?;
    first.strip_prefix("lease-").and_then(|r| r.rsplit_once('-')).map(|(h, _)| h.to_string())
}

/// Waits until the assignment names `tasks` tasks covering `shards` shards and the shards in
/// `check` (all when `None`) are leased by their assigned task. Returns it and when that held.
async fn settle(
    zk: &zookeeper_client::Client,
    c: &Cluster<'_>,
    tasks: usize,
    shards: usize,
    check: Option<&[String]>,
    limit: Duration,
) -> anyhow::Result<(Assignment, i64)> {
    let start = Instant::now();
    loop {
        if let Some(a) = assignment(zk, c).await {
            let named: usize = a.tasks.values().map(Vec::len).sum();
            if a.tasks.len() == tasks && named == shards {
                let owner = a.owner_of();
                let list: Vec<String> = match check {
                    Some(l) => l.to_vec(),
                    None => owner.keys().map(|s| s.to_string()).collect(),
                };
                let mut ok = true;
                for s in &list {
                    if holder(zk, c, s).await.as_deref() != owner.get(s.as_str()).copied() {
                        ok = false;
                        break;
                    }
                }
                if ok {
                    return Ok((a, now_ms()));
                }
            }
        }
        if start.elapsed() > limit {
            bail!(
                "never settled on {tasks} tasks x {shards} shards within {limit:?} (logs in {})",
                c.env.dir.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// utime + stime (ms) and VmRSS (KiB) of a process.
fn proc_usage(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok()?;
    Some((ticks * 10, rss))
}

/// One measured window.
struct Window {
    secs: f64,
    packets: u64,
    writes: i64,
    cpu_ms: u64,
    rss_kib: Vec<u64>,
}

impl Window {
    fn per_s(&self) -> f64 {
        self.packets as f64 / self.secs
    }
    fn per_write(&self) -> f64 {
        if self.writes > 0 { self.packets as f64 / self.writes as f64 } else { f64::NAN }
    }
}

async fn measure(zk: &zookeeper_client::Client, c: &Cluster<'_>, secs: u64) -> anyhow::Result<Window> {
    let w0 = checkpoint_writes(zk, &c.stream_path()).await?;
    let cpu0: u64 = c.pids().iter().filter_map(|p| proc_usage(*p)).map(|u| u.0).sum();
    let p0 = zk_packets(&c.env.zk)?;
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let p1 = zk_packets(&c.env.zk)?;
    let secs = t0.elapsed().as_secs_f64();
    let usage: Vec<(u64, u64)> = c.pids().iter().filter_map(|p| proc_usage(*p)).collect();
    let w1 = checkpoint_writes(zk, &c.stream_path()).await?;
    let cpu1: u64 = usage.iter().map(|u| u.0).sum();
    Ok(Window {
        secs,
        packets: p1.saturating_sub(p0),
        writes: w1 - w0,
        cpu_ms: cpu1.saturating_sub(cpu0),
        rss_kib: usage.iter().map(|u| u.1).collect(),
    })
}

fn spout_config(extra: serde_json::Value) -> serde_json::Value {
    let mut cfg = serde_json::json!({"topology": "x", "stream": "x"});
    if let (Some(c), Some(e)) = (cfg.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    cfg
}

/// (a) 200 shards x 20 tasks on kinesis-local, idle and loaded.
async fn kinesis_section(env: &Env) -> anyhow::Result<()> {
    const SHARDS: i32 = 200;
    const WORKERS: usize = 4;
    const TASKS: usize = 5;
    println!("\n## (a) {SHARDS} shards x {} tasks ({WORKERS} workers x {TASKS}) on kinesis-local\n", WORKERS * TASKS);
    let client = KinesisEndpoint::new(env.kinesis.clone(), REGION).client().await?;
    let stream = unique("bench-coord");
    squall::kinesis::create_stream(&client, &env.kinesis, &stream, SHARDS)
        .await
        .with_context(|| format!("creating a {SHARDS}-shard stream (raise SQUALL_KINESIS_SHARD_LIMIT?)"))?;
    let zk = zk_client(&env.zk).await?;
    let result = async {
        let mut c = Cluster::new(env, &stream, &env.kinesis, spout_config(serde_json::json!({})))?;
        let started = Instant::now();
        for _ in 0..WORKERS {
            c.start(TASKS)?;
        }
        settle(&zk, &c, WORKERS * TASKS, SHARDS as usize, None, Duration::from_secs(180)).await?;
        println!("every shard owned as assigned {:.1} s after the workers started", started.elapsed().as_secs_f64());
        tokio::time::sleep(Duration::from_secs(5)).await;
        let idle = measure(&zk, &c, 30).await?;
        // Steady load: 400 records/s over 2000 keys (2 per shard per second).
        let producer = {
            let (client, endpoint, stream) = (client.clone(), env.kinesis.clone(), stream.clone());
            tokio::spawn(async move {
                let opts = PutOptions { count: 24_000, keys: 2000, rate: Some(400.0), ..PutOptions::default() };
                squall::kinesis::put_records(&client, &endpoint, &stream, &opts).await
            })
        };
        tokio::time::sleep(Duration::from_secs(10)).await;
        let loaded = measure(&zk, &c, 30).await?;
        producer.abort();
        let root = c.root.clone();
        println!("| state | ZooKeeper requests/s | per worker/s | checkpoint writes/s | requests per checkpoint write | worker CPU % | worker RSS MiB |");
        println!("|---|---:|---:|---:|---:|---:|---:|");
        for (name, w) in [("idle", &idle), ("loaded (400 rec/s)", &loaded)] {
            println!(
                "| {name} | {:.1} | {:.2} | {:.1} | {:.2} | {:.0} | {} |",
                w.per_s(),
                w.per_s() / WORKERS as f64,
                w.writes as f64 / w.secs,
                w.per_write(),
                w.cpu_ms as f64 / 10.0 / w.secs / WORKERS as f64,
                w.rss_kib.iter().map(|k| (k / 1024).to_string()).collect::<Vec<_>>().join("/")
            );
        }
        drop(c);
        zk_delete_tree(&zk, &root).await;
        Ok::<_, anyhow::Error>(())
    }
    .await;
    let _ = squall::kinesis::delete_stream(&client, &env.kinesis, &stream).await;
    result
}

/// (d) The committed watermark's ZooKeeper cost: the same cluster with the reports off, then on.
async fn watermark_section(env: &Env) -> anyhow::Result<()> {
    const SHARDS: i32 = 20;
    const WORKERS: usize = 2;
    const TASKS: usize = 5;
    const INTERVAL_MS: u64 = 1000;
    let tasks = WORKERS * TASKS;
    println!(
        "\n## (d) committed watermark: {SHARDS} shards x {tasks} tasks ({WORKERS} workers x {TASKS}), reports off vs \
         every {INTERVAL_MS} ms\n"
    );
    let client = KinesisEndpoint::new(env.kinesis.clone(), REGION).client().await?;
    let stream = unique("bench-wm");
    squall::kinesis::create_stream(&client, &env.kinesis, &stream, SHARDS).await?;
    let zk = zk_client(&env.zk).await?;
    let mut rows = Vec::new();
    let result = async {
        for interval in [0, INTERVAL_MS] {
            let cfg = spout_config(serde_json::json!({ "committed_watermark_interval_ms": interval }));
            let mut c = Cluster::new(env, &stream, &env.kinesis, cfg)?;
            for _ in 0..WORKERS {
                c.start(TASKS)?;
            }
            settle(&zk, &c, tasks, SHARDS as usize, None, Duration::from_secs(120)).await?;
            tokio::time::sleep(Duration::from_secs(5)).await;
            let idle = measure(&zk, &c, 20).await?;
            let producer = {
                let (client, endpoint, stream) = (client.clone(), env.kinesis.clone(), stream.clone());
                tokio::spawn(async move {
                    let opts = PutOptions { count: 6_000, keys: 200, rate: Some(200.0), ..PutOptions::default() };
                    squall::kinesis::put_records(&client, &endpoint, &stream, &opts).await
                })
            };
            tokio::time::sleep(Duration::from_secs(5)).await;
            let loaded = measure(&zk, &c, 20).await?;
            producer.abort();
            let root = c.root.clone();
            drop(c);
            zk_delete_tree(&zk, &root).await;
            rows.push((interval, idle, loaded));
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    let _ = squall::kinesis::delete_stream(&client, &env.kinesis, &stream).await;
    result?;
    println!(
        "| committed_watermark_interval_ms | idle requests/s | idle per task/s | loaded (200 rec/s) requests/s | loaded per task/s |"
    );
    println!("|---:|---:|---:|---:|---:|");
    for (interval, idle, loaded) in &rows {
        println!(
            "| {interval} | {:.1} | {:.2} | {:.1} | {:.2} |",
            idle.per_s(),
            idle.per_s() / tasks as f64,
            loaded.per_s(),
            loaded.per_s() / tasks as f64
        );
    }
    if let [(_, i0, l0), (_, i1, l1)] = rows.as_slice() {
        println!(
            "\nThe reports cost {:.2} requests per task per second idle and {:.2} loaded (at most 1 per task per \
             interval: one setData each time the task's watermark changed).",
            (i1.per_s() - i0.per_s()) / tasks as f64,
            (l1.per_s() - l0.per_s()) / tasks as f64
        );
    }
    Ok(())
}

/// The ZooKeeper calls of `firers` window firers, each on a session of its own, every 500 ms for
/// `secs`: list the firers, read the committed watermark (`published`: the one znode the leader
/// writes; otherwise computed from the assignment and every task's report).
async fn run_firers(env: &Env, c: &Cluster<'_>, firers: usize, published: bool, secs: u64) -> anyhow::Result<()> {
    let cfg = squall::coord::ZkConfig::new(env.zk.clone()).with_root(&c.root);
    let mut stores = Vec::new();
    for i in 0..firers {
        let s = squall::coord::ZkStore::connect(&cfg, &c.topology, &c.stream).await?;
        s.register_firer("counts", &format!("bench-{i}")).await?;
        stores.push(s);
    }
    let until = Instant::now() + Duration::from_secs(secs);
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    while Instant::now() < until {
        tick.tick().await;
        for s in &stores {
            s.firers("counts").await?;
            let w = if published { s.published_watermark().await? } else { s.committed_watermark().await? };
            if let Err(why) = w {
                bail!("no committed watermark: {why}");
            }
        }
    }
    Ok(())
}

/// (e) a window firer's ZooKeeper cost, flat in tasks.
async fn firers_section(env: &Env) -> anyhow::Result<()> {
    const SHARDS: i32 = 20;
    const TASKS: usize = 5;
    const SECS: u64 = 20;
    println!(
        "\n## (e) window firers: 2 and 6 firers' ZooKeeper calls every 500 ms, {SHARDS} shards, committed \
         watermark reports every 1000 ms\n"
    );
    let client = KinesisEndpoint::new(env.kinesis.clone(), REGION).client().await?;
    let stream = unique("bench-firers");
    squall::kinesis::create_stream(&client, &env.kinesis, &stream, SHARDS).await?;
    let zk = zk_client(&env.zk).await?;
    let mut rows = Vec::new();
    let result = async {
        for workers in [2usize, 4] {
            let tasks = workers * TASKS;
            let cfg = spout_config(serde_json::json!({ "committed_watermark_interval_ms": 1000 }));
            let mut c = Cluster::new(env, &stream, &env.kinesis, cfg)?;
            for _ in 0..workers {
                c.start(TASKS)?;
            }
            settle(&zk, &c, tasks, SHARDS as usize, None, Duration::from_secs(120)).await?;
            tokio::time::sleep(Duration::from_secs(5)).await;
            let alone = measure(&zk, &c, SECS).await?.per_s();
            let mut row = vec![tasks as f64, alone];
            for published in [true, false] {
                let mut at = Vec::new();
                for firers in [2usize, 6] {
                    let (w, r) = tokio::join!(measure(&zk, &c, SECS), run_firers(env, &c, firers, published, SECS));
                    r?;
                    at.push(w?.per_s());
                    // the firers' sessions closed; their nodes go with them
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                let per_firer = (at[1] - at[0]) / 4.0;
                row.push(per_firer);
                row.push(at[0] - alone - 2.0 * per_firer);
            }
            let root = c.root.clone();
            drop(c);
            zk_delete_tree(&zk, &root).await;
            rows.push(row);
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    let _ = squall::kinesis::delete_stream(&client, &env.kinesis, &stream).await;
    result?;
    println!(
        "| tasks | workers alone, requests/s | published: per firer | published: fixed (the leader's publication) | \
         computed by each firer: per firer | computed: fixed |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!("| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |", r[0], r[1], r[2], r[3], r[4], r[5]);
    }
    Ok(())
}

/// (b) and (c): 1000 simulated shards, 10 -> 100 tasks; then one task joins and leaves.
async fn scale_section(env: &Env, scale: bool, moves: bool) -> anyhow::Result<()> {
    const SHARDS: usize = 1000;
    const PER_WORKER: usize = 10;
    let epoch = now_ms();
    // One record per shard per second, ~200 bytes: every shard's checkpoint moves every second.
    let endpoint = format!("sim://shards={SHARDS},rate=1,bytes=200,epoch_ms={epoch}");
    println!("\n## (b) {SHARDS} shards, 10 -> 100 tasks, simulated stream (coordination-only harness: `{endpoint}`)\n");
    let zk = zk_client(&env.zk).await?;
    let mut c = Cluster::new(env, "sim-1000", &endpoint, spout_config(serde_json::json!({})))?;
    let mut rows = Vec::new();
    for workers in [1usize, 2, 5, 10] {
        while c.workers.len() < workers {
            c.start(PER_WORKER)?;
        }
        let tasks = workers * PER_WORKER;
        let start = Instant::now();
        settle(&zk, &c, tasks, SHARDS, None, Duration::from_secs(300)).await?;
        let settled = start.elapsed();
        tokio::time::sleep(Duration::from_secs(5)).await;
        if !scale {
            continue;
        }
        let w = measure(&zk, &c, 20).await?;
        rows.push((workers, tasks, settled, w));
    }
    if scale {
        println!(
            "| workers | tasks | settled after | ZooKeeper requests/s | per worker/s | checkpoint writes/s | requests per checkpoint write | CPU % per worker | RSS MiB per worker (max) |"
        );
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for (workers, tasks, settled, w) in &rows {
            println!(
                "| {workers} | {tasks} | {:.1} s | {:.0} | {:.1} | {:.0} | {:.2} | {:.0} | {} |",
                settled.as_secs_f64(),
                w.per_s(),
                w.per_s() / *workers as f64,
                w.writes as f64 / w.secs,
                w.per_write(),
                w.cpu_ms as f64 / 10.0 / w.secs / *workers as f64,
                w.rss_kib.iter().max().copied().unwrap_or(0) / 1024
            );
        }
    }
    if moves {
        println!("\n## (c) shards moved and time to converge, {SHARDS} shards over 100 tasks\n");
        let (before, _) = settle(&zk, &c, 100, SHARDS, None, Duration::from_secs(120)).await?;
        // Join: one worker with one task.
        c.start(1)?;
        let (after, _) = wait_assignment(&zk, &c, 101).await?;
        let newcomer = after.tasks.keys().find(|t| !before.tasks.contains_key(*t)).cloned().context("no new task")?;
        let joined = zk.check_stat(&format!("{}/{newcomer}", c.tasks_dir())).await?.context("task node")?.ctime;
        let moved_join: Vec<String> = changed(&before, &after);
        let (_, at) = settle(&zk, &c, 101, SHARDS, Some(&moved_join), Duration::from_secs(120)).await?;
        let join_ms = at - joined;
        // Leave: SIGTERM it.
        let sigterm = now_ms();
        c.stop_last()?;
        let (back, _) = wait_assignment(&zk, &c, 100).await?;
        let moved_leave: Vec<String> = changed(&after, &back);
        let (_, at) = settle(&zk, &c, 100, SHARDS, Some(&moved_leave), Duration::from_secs(120)).await?;
        let leave_ms = at - sigterm;
        let mut survivors = after.tasks.clone();
        survivors.remove(&newcomer);
        println!("| event | shards moved | limit | moves among other tasks | converged after |");
        println!("|---|---:|---:|---:|---:|");
        println!(
            "| join (100 -> 101 tasks) | {} | ceil(N/T)+1 = {} | {} | {join_ms} ms |",
            moved_join.len(),
            SHARDS.div_ceil(101) + 1,
            moved(&before.tasks, &after.tasks) - moved_join.len()
        );
        println!(
            "| leave (101 -> 100 tasks, SIGTERM) | {} | its own {} | {} | {leave_ms} ms |",
            moved_leave.len(),
            after.tasks[&newcomer].len(),
            moved(&survivors, &back.tasks)
        );
    }
    let root = c.root.clone();
    drop(c);
    zk_delete_tree(&zk, &root).await;
    Ok(())
}

/// Waits for an assignment over `tasks` tasks.
async fn wait_assignment(
    zk: &zookeeper_client::Client,
    c: &Cluster<'_>,
    tasks: usize,
) -> anyhow::Result<(Assignment, i64)> {
    let start = Instant::now();
    loop {
        if let Some(a) = assignment(zk, c).await
            && a.tasks.len() == tasks
        {
            return Ok((a, now_ms()));
        }
        if start.elapsed() > Duration::from_secs(120) {
            bail!("no assignment over {tasks} tasks");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Shards whose owner differs between two assignments (or that only one names).
fn changed(a: &Assignment, b: &Assignment) -> Vec<String> {
    let (x, y) = (a.owner_of(), b.owner_of());
    let mut out: Vec<String> = y.iter().filter(|(s, t)| x.get(*s) != Some(*t)).map(|(s, _)| s.to_string()).collect();
    out.sort();
    out
}
