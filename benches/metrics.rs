//! What the Prometheus endpoint costs (`cargo bench --bench metrics`, part of `make bench`):
//! records per second delivered by an audit worker process (Kinesis spout -> sink, acking on)
//! reading a pre-filled 4-shard stream from its start, without `--metrics-addr` and with it plus
//! a scraper fetching `/metrics` every second. Both read the same stream (filled once), with the
//! same build, interleaved (off, on, off, on, ...); the figure is the ratio of the medians. Rate
//! = records / (last delivery - first delivery), from the deliveries' own timestamps, so worker
//! start-up and shard assignment are not counted. The order alternates per round (off-on,
//! on-off, ...): the second run of a round finds the Kinesis engine warmer.
//!
//! The throughput ratio is noisy on a shared box (a few % between rounds), so the bench also
//! measures the endpoint's cost directly: the worker process's own CPU time (utime + stime from
//! `/proc/PID/stat`) over 2000 back-to-back scrapes of a worker that owns the 4 shards, minus its
//! CPU over the same wall time without scrapes, per scrape. At one scrape per second, that CPU
//! time over 1 s bounds the share of one core the endpoint takes from the worker; divided by
//! the worker's own CPU while it reads at full speed (utime + stime from its first delivery to
//! its last, in the runs without the endpoint) it is the share of the worker's work.
//!
//! `SQUALL_BENCH_REPS` (rounds, default 5), `SQUALL_BENCH_METRICS_RECORDS` (records in the
//! stream, default 20000) and `SQUALL_BENCH_SCRAPE_MS` (scrape interval, default 1000) set the
//! size. Needs ZooKeeper and a Kinesis engine (`localstack/up`; `SQUALL_KINESIS_ENDPOINT`, e.g.
//! kinesalite from `localstack/kinesalite-up`, the faster engine that leaves the worker more of
//! the CPU) and the audit example (`cargo build --release --examples`, or the debug build).

mod common;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// One blocking scrape: the body's length, or None.
fn scrape(port: u16) -> Option<usize> {
    try_scrape(port).ok()
}

/// One blocking scrape: the body's length, or what went wrong.
fn try_scrape(port: u16) -> Result<usize, String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(2))).map_err(|e| e.to_string())?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).map_err(|e| format!("read ({} bytes so far): {e}", buf.len()))?;
    let text = String::from_utf8_lossy(&buf);
    if !text.starts_with("HTTP/1.1 200") {
        return Err(format!("answer: {:?}", text.chars().take(200).collect::<String>()));
    }
    Ok(text.split_once("\r\n\r\n").map_or(0, |(_, b)| b.len()))
}

struct Run {
    rate: f64,
    scrapes: u64,
    scrape_bytes: u64,
    /// The worker's CPU (cores) from its first delivery to its last.
    cores: f64,
}

/// One worker reading the whole stream; records per second (and the scrapes made, if any).
async fn run(ep: &KinesisEndpoint, stream: &str, records: u64, metrics: bool, every: Duration) -> anyhow::Result<Run> {
    let dir = std::env::temp_dir().join(common::unique("metricsbench"));
    std::fs::create_dir_all(&dir)?;
    let deliveries = dir.join("d.jsonl");
    let zk = std::env::var("SQUALL_ZK").unwrap_or_else(|_| "127.0.0.1:2181".into());
    let port = free_port()?;
    let mut cmd = Command::new(audit_bin());
    cmd.args(["--topology", &common::unique("t"), "--stream", stream, "--zk", &zk])
        .args(["--zk-root", &format!("/squall-bench-{}", common::unique("metrics")), "--endpoint", &ep.endpoint])
        .args(["--spout-tasks", "2", "--deliveries", deliveries.to_str().unwrap_or_default()])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if metrics {
        cmd.args(["--metrics-addr", &port.to_string()]);
    }
    let mut child = cmd.spawn()?;
    // the scraper: every `every`, from the start to the end of the run
    let stop = Arc::new(AtomicBool::new(false));
    let (scrapes, bytes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let scraper = metrics.then(|| {
        let (stop, scrapes, bytes) = (stop.clone(), scrapes.clone(), bytes.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some(n) = scrape(port) {
                    scrapes.fetch_add(1, Ordering::Relaxed);
                    bytes.fetch_add(n as u64, Ordering::Relaxed);
                }
                std::thread::sleep(every);
            }
        })
    });
    let start = Instant::now();
    let mut lines: Vec<Delivery> = Vec::new();
    let pid = child.id();
    // the worker's CPU time when its first delivery showed up, and when the last did
    let mut busy_from: Option<(f64, Instant)> = None;
    let mut cores = 0.0;
    while start.elapsed() < Duration::from_secs(300) {
        let text = std::fs::read_to_string(&deliveries).unwrap_or_default();
        let n = text.lines().count() as u64;
        if n > 0 && busy_from.is_none() {
            busy_from = cpu_secs(pid).ok().map(|c| (c, Instant::now()));
        }
        if n >= records {
            if let (Some((c0, t0)), Ok(c1)) = (busy_from, cpu_secs(pid)) {
                cores = (c1 - c0) / t0.elapsed().as_secs_f64().max(1e-3);
            }
            lines = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(s) = scraper {
        let _ = s.join();
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    anyhow::ensure!(lines.len() as u64 >= records, "only {} of {records} records delivered in 300 s", lines.len());
    let first = lines.iter().map(|d| d.t_us).min().unwrap_or(0);
    let last = lines.iter().map(|d| d.t_us).max().unwrap_or(0);
    let scrapes = scrapes.load(Ordering::Relaxed);
    anyhow::ensure!(!metrics || scrapes > 0, "the scraper never got an answer from the metrics endpoint");
    Ok(Run {
        rate: records as f64 / ((last - first).max(1) as f64 / 1e6),
        scrapes,
        scrape_bytes: bytes.load(Ordering::Relaxed),
        cores,
    })
}

/// The process's CPU time (user + system) in seconds, from `/proc/PID/stat`.
fn cpu_secs(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // the fields after the command name in parentheses: state is field 3, utime 14, stime 15
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i - 3).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // USER_HZ is 100 on Linux
    Ok((ticks(14) + ticks(15)) / 100.0)
}

/// CPU seconds the worker spends per scrape: `n` scrapes back to back, minus the worker's CPU
/// over the same wall time without scrapes (its own idle polling).
async fn cpu_per_scrape(ep: &KinesisEndpoint, stream: &str, n: u32) -> anyhow::Result<(f64, f64, usize)> {
    let zk = std::env::var("SQUALL_ZK").unwrap_or_else(|_| "127.0.0.1:2181".into());
    let port = free_port()?;
    let dir = std::env::temp_dir().join(common::unique("metricsbench"));
    std::fs::create_dir_all(&dir)?;
    let log = dir.join("worker.log");
    let mut child = Command::new(audit_bin())
        .args(["--topology", &common::unique("t"), "--stream", stream, "--zk", &zk])
        .args(["--zk-root", &format!("/squall-bench-{}", common::unique("metrics")), "--endpoint", &ep.endpoint])
        .args(["--spout-tasks", "2", "--initial-position", "latest", "--metrics-addr", &port.to_string()])
        .args(["--deliveries", dir.join("d.jsonl").to_str().unwrap_or_default()])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    let pid = child.id();
    let result = async {
        // owning its shards and settled
        let start = Instant::now();
        while scrape(port).is_none() {
            if let Some(st) = child.try_wait()? {
                anyhow::bail!("the worker exited ({st}): {}", std::fs::read_to_string(&log).unwrap_or_default());
            }
            anyhow::ensure!(start.elapsed() < Duration::from_secs(30), "no answer from the worker's endpoint in 30 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        let mut bytes = 0;
        let mut failed = Vec::new();
        let (c0, t0) = (cpu_secs(pid)?, Instant::now());
        for _ in 0..n {
            match try_scrape(port) {
                Ok(b) => bytes = b,
                Err(e) => failed.push(e),
            }
        }
        // a failed scrape (the client's own error, e.g. a reset) still cost the worker its share
        anyhow::ensure!(failed.len() * 10 < n as usize, "{} of {n} scrapes failed: {failed:?}", failed.len());
        if !failed.is_empty() {
            println!("metrics: {} of {n} back-to-back scrapes failed: {:?}", failed.len(), failed.first());
        }
        let (busy_cpu, wall) = (cpu_secs(pid)? - c0, t0.elapsed());
        let c1 = cpu_secs(pid)?;
        tokio::time::sleep(wall).await;
        let idle_cpu = cpu_secs(pid)? - c1;
        Ok::<_, anyhow::Error>((
            (busy_cpu - idle_cpu).max(0.0) / f64::from(n),
            wall.as_secs_f64() / f64::from(n),
            bytes,
        ))
    }
    .await;
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Back-to-back scrapes of the direct CPU measurement (CPU time is counted in 10 ms ticks).
const SCRAPES: u32 = 2000;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let ep = KinesisEndpoint::new(
        std::env::var("SQUALL_KINESIS_ENDPOINT").unwrap_or_else(|_| kinesis::DEFAULT_ENDPOINT.into()),
        kinesis::DEFAULT_REGION,
    );
    let reps = env_u64("SQUALL_BENCH_REPS", 5);
    let records = env_u64("SQUALL_BENCH_METRICS_RECORDS", 20_000);
    let every = Duration::from_millis(env_u64("SQUALL_BENCH_SCRAPE_MS", 1000));
    let client = ep.client().await?;
    let label = ep.label();
    let stream = common::unique("metricsbench");
    kinesis::create_stream(&client, &label, &stream, 4).await?;
    let opts = PutOptions { count: records, keys: 200, size: 100, ..PutOptions::default() };
    kinesis::put_records(&client, &label, &stream, &opts).await?;
    let (mut off, mut on, mut ratios, mut cores) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut result = Ok(());
    for rep in 0..reps {
        // ABBA order: the run that goes second in a round finds the engine warmer, so the
        // order alternates and the medians cancel it.
        let mut pair = Vec::new();
        for metrics in if rep % 2 == 0 { [false, true] } else { [true, false] } {
            match run(&ep, &stream, records, metrics, every).await {
                Ok(r) => pair.push((metrics, r)),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if pair.len() < 2 {
            break;
        }
        pair.sort_by_key(|(metrics, _)| *metrics);
        let (a, b) = (&pair[0].1, &pair[1].1);
        println!(
            "metrics rep {rep} ({}): off {:.0} records/s ({:.2} cores), on {:.0} records/s ({:.2} cores; {} scrapes, {} \
             bytes each), ratio {:.3}",
            if rep % 2 == 0 { "off, on" } else { "on, off" },
            a.rate,
            a.cores,
            b.rate,
            b.cores,
            b.scrapes,
            b.scrape_bytes / b.scrapes.max(1),
            b.rate / a.rate
        );
        off.push(a.rate);
        on.push(b.rate);
        ratios.push(b.rate / a.rate);
        cores.push(a.cores);
    }
    let direct = if result.is_ok() { Some(cpu_per_scrape(&ep, &stream, SCRAPES).await) } else { None };
    let _ = kinesis::delete_stream(&client, &label, &stream).await;
    result?;
    let busy = common::median(&cores);
    if let Some(d) = direct {
        let (cpu, wall, bytes) = d?;
        let per_s = cpu / every.as_secs_f64();
        println!(
            "metrics: the worker's CPU per scrape {:.3} ms ({bytes} bytes; {:.3} ms wall each, {SCRAPES} back to back, idle CPU \
             subtracted): at one scrape per {every:?}, {:.3}% of one core, {:.3}% of the worker's CPU at full \
             throughput ({busy:.2} cores, median of the runs without the endpoint)",
            cpu * 1e3,
            wall * 1e3,
            per_s * 100.0,
            if busy > 0.0 { per_s / busy * 100.0 } else { f64::NAN }
        );
    }
    let (a, b) = (common::median(&off), common::median(&on));
    let (lo, hi) = ratios.iter().fold((f64::MAX, f64::MIN), |(l, h), r| (l.min(*r), h.max(*r)));
    println!(
        "metrics: {records} records, 4 shards, {}: without the endpoint {a:.0}/s, with it scraped every {every:?} {b:.0}/s \
         (median of {} interleaved rounds), ratio of medians {:.3} (cost {:+.1}%); per-round ratios: median {:.3}, \
         range {lo:.3}-{hi:.3}",
        ep.endpoint,
        ratios.len(),
        b / a,
        (1.0 - b / a) * 100.0,
        common::median(&ratios)
    );
    Ok(())
}
