//! Memory is bounded in bytes: one worker process owns 50 shards, each holding a backlog of 1,600
//! records of 1 KB (80 MB in all), behind a consumer that takes one record per second, so every
//! reader fills its shard's queue to the bound and the queues stay full. The worker's VmRSS,
//! sampled from /proc all along, stays under 100 MB with the default configuration
//! (`records_per_get` 10000, `max_queued_bytes_per_shard` 1 MiB), and no shard has more than
//! 1 MiB worth of records read: without the byte bound every reader would take its whole
//! backlog (up to 10,000 records, 10 MB, per shard).
//!
//! `make soak` runs the 50 shards; `make test` runs 12 (the same per-shard bound, 20 MB of
//! backlog).
//!
//! Sampling ends once every shard was read and no read happened for 5 s (all queues full).
//! `SQUALL_MEMORY_BASELINE=1` first runs the same with the byte bound lifted (1 GiB per shard),
//! for comparison; `SQUALL_MEMORY_BACKLOG=N` sets the records per shard. Putting the backlog
//! takes most of the time (kinesis-local spends about 0.65 ms of CPU on each 1 KB record).

use squall_test_support as support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use squall::kinesis::payload::Manifest;
use squall::kinesis::{self, PutOptions};
use support::TestStream;
use support::workers::{Cluster, read_log_entries, scratch};

const LIMIT_KB: u64 = 100 * 1024;

fn vm_rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

struct Sample {
    /// Peak VmRSS (KB).
    peak_kb: u64,
    /// VmRSS when the queues were full (KB).
    full_kb: u64,
    /// Records read per shard.
    read: HashMap<String, u64>,
    took: Duration,
}

/// Starts one worker of a fresh topology on the stream, behind a one-record-per-second consumer,
/// and samples its VmRSS until every shard was read and no read happened for 5 s.
async fn fill_and_sample(
    name: &str,
    s: &TestStream,
    shards: usize,
    manifest: &Manifest,
    extra: serde_json::Value,
) -> Sample {
    let dir = scratch(name);
    let cluster = Cluster::with_spout_config(&s.name, &dir, extra);
    let start = Instant::now();
    let mut w = cluster.start_with("w", 1, &["--sink-delay-ms", "1000", "--sinks", "1", "--max-spout-pending", "1"]);
    let pid = w.pid();
    let stop = tokio_util::sync::CancellationToken::new();
    let sampler = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut peak = 0u64;
            while !stop.is_cancelled() {
                if let Some(kb) = vm_rss_kb(pid) {
                    peak = peak.max(kb);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            peak
        })
    };
    let (read, full_kb) = loop {
        let reads: Vec<_> =
            read_log_entries(&cluster.read_logs()).into_iter().filter(|e| e.event == "records").collect();
        let mut read: HashMap<String, u64> = HashMap::new();
        for e in &reads {
            *read.entry(e.shard.clone()).or_default() += e.count.unwrap_or(0) as u64;
        }
        let quiet = reads.last().is_some_and(|e| squall::coord::now_ms() - e.t_ms >= 5_000);
        if read.len() == shards && quiet {
            break (read, vm_rss_kb(pid).unwrap_or(0));
        }
        assert!(w.is_running(), "{name}: the worker died\n{}", cluster.logs());
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "{name}: {} of {shards} shards read\n{}",
            read.len(),
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let took = start.elapsed();
    stop.cancel();
    let peak_kb = sampler.await.unwrap();
    let delivered = cluster.audit(std::slice::from_ref(manifest)).distinct;
    eprintln!("{name}: queues full after {took:?}; {} records read, {delivered} delivered", read.values().sum::<u64>());
    w.kill();
    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    Sample { peak_kb, full_kb, read, took }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_shards_of_1kb_backlog_hold_1_mib_each_and_stay_under_100_mb() {
    backlog(12).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "soak: make soak"]
async fn fifty_shards_of_1kb_backlog_stay_under_100_mb() {
    backlog(50).await;
}

async fn backlog(shards_n: usize) {
    let per_shard: u64 = std::env::var("SQUALL_MEMORY_BACKLOG").ok().and_then(|v| v.parse().ok()).unwrap_or(1_600);
    let s = TestStream::create("memory", shards_n as i32).await;
    let shards = kinesis::list_shards(&s.client, &s.label(), &s.name).await.unwrap();
    let t0 = Instant::now();
    // 1 KB payloads, the same number of records in every shard (explicit hash keys), one run id.
    let run = support::unique_name("memory");
    let mut manifests = Vec::new();
    for (i, sh) in shards.iter().enumerate() {
        let opts = PutOptions {
            count: per_shard,
            keys: 500,
            size: 1024,
            key_prefix: format!("s{i}-"),
            run: run.clone(),
            explicit_hash_key: Some(sh.starting_hash_key.clone()),
            ..PutOptions::default()
        };
        manifests.push(kinesis::put_records(&s.client, &s.label(), &s.name, &opts).await.unwrap().manifest);
    }
    let manifest = Manifest {
        run,
        stream: s.name.clone(),
        counts: manifests.iter().flat_map(|m| m.counts.clone()).collect(),
        total: manifests.iter().map(|m| m.total).sum(),
    };
    eprintln!("put {} records of 1 KB into {shards_n} shards in {:?}", manifest.total, t0.elapsed());
    let mb = |kb: u64| kb as f64 / 1024.0;

    if std::env::var_os("SQUALL_MEMORY_BASELINE").is_some() {
        let b = fill_and_sample(
            "memory-baseline",
            &s,
            shards_n,
            &manifest,
            serde_json::json!({"max_queued_bytes_per_shard": 1u64 << 30}),
        )
        .await;
        eprintln!(
            "MEMORY baseline (no byte bound): peak VmRSS {:.1} MB ({:.1} MB with the queues full), max {} records read in a shard, after {:?}",
            mb(b.peak_kb),
            mb(b.full_kb),
            b.read.values().max().unwrap_or(&0),
            b.took
        );
    }
    let m = fill_and_sample("memory", &s, shards_n, &manifest, serde_json::json!({})).await;
    let max_read = *m.read.values().max().unwrap_or(&0);
    eprintln!(
        "MEMORY: one worker, {shards_n} shards x {per_shard} records of 1 KB, default config: peak VmRSS {:.1} MB \
         ({:.1} MB with the queues full), {} records read in all, at most {max_read} in a shard, after {:?}",
        mb(m.peak_kb),
        mb(m.full_kb),
        m.read.values().sum::<u64>(),
        m.took
    );
    // Each queue holds at most 1 MiB: about 800 records of 1 KB plus their overhead.
    assert!(per_shard > 1_000, "the backlog must be larger than a queue's bound");
    assert!(max_read <= 1_000, "a shard had {max_read} records read though its queue is bounded at 1 MiB");
    assert!(m.peak_kb < LIMIT_KB, "peak VmRSS {:.1} MB is over 100 MB", mb(m.peak_kb));
    s.delete().await;
}
