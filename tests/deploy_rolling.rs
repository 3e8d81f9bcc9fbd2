//! A rolling deploy under steady load: 4 workers read a 12-shard stream while a producer puts
//! records at a steady rate; each worker in turn is stopped with SIGTERM (a graceful stop: in-flight
//! tuples acked, final checkpoints, shards released), once it has exited its replacement is
//! started, and `squall wait-settled --workers 4` must return (exit 0) once the handoff is over,
//! which the test checks against ZooKeeper itself. The audit of every record put must show nothing
//! lost, no duplicate delivered and per-key order kept.
//!
//! Measured and reported (not asserted against a time): how long each stop took, how long until
//! the shards were spread over 4 live tasks again, and the end-to-end lag (delivery time minus the
//! record's Kinesis arrival time) before the deploy, during it and after the last replacement,
//! with the time the lag took to come back to its level from before the deploy. Asserted beyond
//! the audit: every shard is read again after the deploy (the p99 lag of the last 4 s of load is
//! below 4 s, where a shard left unread would show its records' whole wait).

use squall_test_support as support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use squall::audit::Delivery;
use squall::kinesis::payload::Manifest;
use squall::kinesis::{self, PutOptions};
use support::TestStream;
use support::workers::{Cluster, live_tasks, owners, read_deliveries, scratch};

const SHARDS: usize = 12;
const WORKERS: usize = 4;
/// Records per second of the steady producer.
const RATE: f64 = 150.0;
/// The p99 lag of the last 4 s of load must stay below this: a shard left unread after the deploy
/// shows its records' whole wait (seconds); a read shard's lag is its call spacing (~200 ms,
/// ~1 s on a machine loaded by another test binary).
const TAIL_LAG_BOUND_MS: i64 = 4_000;

/// Puts at `RATE` in one-second runs until `stop`; returns every run's manifest.
fn steady_producer(s: &TestStream, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Vec<Manifest>> {
    let (client, label, name) = (s.client.clone(), s.label(), s.name.clone());
    tokio::spawn(async move {
        let mut manifests = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let opts = PutOptions { count: RATE as u64, keys: 48, rate: Some(RATE), ..PutOptions::default() };
            manifests.push(kinesis::put_records(&client, &label, &name, &opts).await.expect("steady put").manifest);
        }
        manifests
    })
}

/// True when every shard is owned by one of `n` live tasks, spread with max - min <= 1.
async fn balanced(zk: &zookeeper_client::Client, cluster: &Cluster, n: usize) -> bool {
    let tasks = live_tasks(zk, cluster).await;
    let o = owners(zk, cluster).await;
    if tasks.len() != n || o.len() != SHARDS || !o.values().all(|x| tasks.contains(x)) {
        return false;
    }
    let mut per: BTreeMap<&str, usize> = tasks.iter().map(|t| (t.as_str(), 0)).collect();
    for x in o.values() {
        *per.entry(x.as_str()).or_default() += 1;
    }
    let (min, max) = (per.values().min().copied().unwrap_or(0), per.values().max().copied().unwrap_or(0));
    max - min <= 1
}

async fn wait_balanced(
    zk: &zookeeper_client::Client,
    cluster: &Cluster,
    n: usize,
    limit: Duration,
) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if balanced(zk, cluster, n).await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    None
}

/// `squall wait-settled TOPOLOGY --workers N`: (exit 0, its output).
async fn wait_settled(cluster: &Cluster, workers: usize) -> (bool, String) {
    let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_squall"));
    c.env("SQUALL_ZK", support::zk_connect())
        .env("SQUALL_ZK_ROOT", &cluster.zk_root)
        .env("SQUALL_KINESIS_ENDPOINT", support::kinesis_endpoint().endpoint)
        .env_remove("RUST_LOG")
        .args(["wait-settled", &cluster.topology, "--workers", &workers.to_string(), "--timeout", "60"]);
    let out = c.output().await.expect("run squall wait-settled");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// End-to-end lag of one delivery (ms).
fn lag(d: &Delivery) -> i64 {
    d.t_us / 1000 - d.arrival_ms
}

fn percentile(v: &mut [i64], p: f64) -> i64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// p50 / p99 / max lag of the records that arrived in `[from, to)` (ms since the epoch).
fn lag_between(ds: &[Delivery], from: i64, to: i64) -> (usize, i64, i64, i64) {
    let mut v: Vec<i64> = ds.iter().filter(|d| d.arrival_ms >= from && d.arrival_ms < to).map(lag).collect();
    let n = v.len();
    let (p50, p99) = (percentile(&mut v, 0.5), percentile(&mut v, 0.99));
    (n, p50, p99, v.last().copied().unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_deploy_under_load_loses_nothing_and_delivers_no_duplicate() {
    let s = TestStream::create("rolling", SHARDS as i32).await;
    let dir = scratch("rolling");
    let cluster = Cluster::new(&s.name, &dir);
    let zk = support::zk_client().await;

    let mut workers: Vec<_> = (0..WORKERS).map(|i| cluster.start(&format!("w{i}"), 1)).collect();
    let spread = wait_balanced(&zk, &cluster, WORKERS, Duration::from_secs(30)).await;
    assert!(spread.is_some(), "{SHARDS} shards never spread over {WORKERS} workers\n{}", cluster.logs());
    // a topology short of a worker is not settled: the command says why and exits non-zero
    let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_squall"));
    c.env("SQUALL_ZK", support::zk_connect()).env("SQUALL_ZK_ROOT", &cluster.zk_root).env_remove("RUST_LOG").args([
        "wait-settled",
        &cluster.topology,
        "--workers",
        "5",
        "--timeout",
        "1",
    ]);
    let out = c.output().await.expect("run squall wait-settled");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("4 of 5 workers are live"), "wait-settled --workers 5: {err}");

    let stop = Arc::new(AtomicBool::new(false));
    let producer = steady_producer(&s, stop.clone());
    // the level before the deploy: 8 s of steady load after a 3 s warm-up
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before_from = now_ms();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let deploy_from = now_ms();

    let mut replacements = Vec::new();
    for (i, w) in workers.iter_mut().enumerate() {
        let t0 = Instant::now();
        let code = w.stop(Duration::from_secs(60));
        let stopped = t0.elapsed();
        assert_eq!(code, Some(0), "worker w{i} did not stop cleanly on SIGTERM\n{}", cluster.logs());
        *w = cluster.start(&format!("w{i}-new"), 1);
        let started = Instant::now();
        let settled = wait_settled(&cluster, WORKERS).await;
        assert!(settled.0, "squall wait-settled failed after replacing w{i}: {}\n{}", settled.1, cluster.logs());
        let rebalanced = started.elapsed();
        // what the command said is true: every shard owned by one of 4 live tasks, spread
        assert!(
            balanced(&zk, &cluster, WORKERS).await,
            "wait-settled returned but ZooKeeper shows the shards not spread over {WORKERS} live tasks: {:?}",
            owners(&zk, &cluster).await
        );
        eprintln!(
            "replaced w{i}: stop {stopped:?}, settled {rebalanced:?} after the new worker started: {}",
            settled.1.trim()
        );
        replacements.push((stopped, rebalanced, t0.elapsed()));
    }
    let deploy_to = now_ms();

    // keep the load on for 12 s more
    tokio::time::sleep(Duration::from_secs(12)).await;
    stop.store(true, Ordering::Relaxed);
    let manifests = producer.await.expect("producer");
    let put: u64 = manifests.iter().map(|m| m.total).sum();

    // The lags are taken once every record put was delivered (lost 0 is asserted below), so a
    // record held back by the deploy counts with its whole delay instead of being left out.
    let report = cluster.wait_delivered(&manifests, Duration::from_secs(60)).await;
    let ds = read_deliveries(&cluster.delivery_files());
    let level = lag_between(&ds, before_from, deploy_from);
    // When the lag came back to its level: the first second after the deploy from which every
    // full second's p99 stays within 1.5x the level's p99 + 100 ms.
    let back_after_ms = {
        let (end, bound) = (deploy_to + 10_000, level.2 * 3 / 2 + 100);
        (deploy_to..end)
            .step_by(1000)
            .find(|&t| (t..end).step_by(1000).all(|s| lag_between(&ds, s, s + 1000).2 <= bound))
            .map(|t| t - deploy_to)
    };
    let during = lag_between(&ds, deploy_from, deploy_to);
    let after = lag_between(&ds, deploy_to, deploy_to + 10_000);
    eprintln!("rolling deploy audit ({put} records put): {}", serde_json::to_string(&report).unwrap());
    eprintln!(
        "lag ms (records, p50, p99, max): before {level:?}, during {during:?}, 10 s after the last replacement {after:?}"
    );
    eprintln!("replacements (stop, spread again, total): {replacements:?}");
    eprintln!(
        "lag back to its level (p99 per second <= 1.5x the level's + 100 ms) {back_after_ms:?} ms after the last replacement"
    );
    assert_eq!(report.lost, 0, "records lost in the rolling deploy: {report:?}\n{}", cluster.logs());
    assert_eq!(report.duplicates, 0, "duplicates delivered in the rolling deploy: {report:?}\n{}", cluster.logs());
    assert_eq!(report.order_violations, 0, "per-key order broken: {report:?}");
    assert!(level.0 > 0 && during.0 > 0, "load before and during the deploy: {level:?} {during:?}");
    // Not asserted: how soon the lag is back at its level (a timing figure, reported above; on a
    // machine shared with another test binary its p99 can stay above 1.5x a quiet level for
    // seconds). Asserted: after the deploy every shard is read by a live owner again. A shard
    // left unread since the last replacement holds its records until someone takes it, past the
    // end of the load; the lag of the records put in the last 4 s of load would then be seconds
    // (the test's load stops 12 s after the last replacement).
    let tail = lag_between(&ds, deploy_to + 8_000, deploy_to + 12_000);
    eprintln!("lag ms of the last 4 s of load (records, p50, p99, max): {tail:?}");
    assert!(
        tail.0 > 0 && tail.2 < TAIL_LAG_BOUND_MS,
        "the lag of the records put in the last 4 s of load (p99 {} ms of {} records) is not below {TAIL_LAG_BOUND_MS} \
         ms: a shard was not read again after the deploy\n{}",
        tail.2,
        tail.0,
        cluster.logs()
    );

    for w in workers.iter_mut() {
        assert_eq!(w.stop(Duration::from_secs(60)), Some(0));
    }
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}
