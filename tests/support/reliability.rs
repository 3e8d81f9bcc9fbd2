//! Shared pieces of the reliability tests: a background producer, a checkpoint watcher that records
//! every version of every checkpoint znode it sees, and log scanning.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use squall::coord::{Checkpoint, CheckpointPosition, sequence_cmp};
use squall::kinesis::payload::Manifest;
use squall::kinesis::{self, PutOptions};

/// Starts the test producer in the background: `count` records over `keys` keys at `rate`/s.
pub fn spawn_producer(
    client: &aws_sdk_kinesis::Client,
    label: &str,
    stream: &str,
    count: u64,
    keys: u64,
    rate: f64,
) -> tokio::task::JoinHandle<Manifest> {
    let (client, label, stream) = (client.clone(), label.to_string(), stream.to_string());
    tokio::spawn(async move {
        let opts = PutOptions { count, keys, rate: Some(rate), ..PutOptions::default() };
        kinesis::put_records(&client, &label, &stream, &opts).await.expect("producer").manifest
    })
}

/// One observed version of a checkpoint znode.
#[derive(Clone, Debug)]
pub struct Observed {
    pub shard: String,
    pub version: i32,
    pub mtime_ms: i64,
    pub cp: Checkpoint,
}

/// Polls every checkpoint znode of a stream (every 40 ms) and keeps every version it sees.
/// Survives connection loss and session expiry (it reconnects).
pub struct CheckpointWatcher {
    pub seen: Arc<Mutex<Vec<Observed>>>,
    stop: tokio_util::sync::CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl CheckpointWatcher {
    pub fn start(connect: &str, stream_path: &str, auth: Option<(&str, &str)>) -> CheckpointWatcher {
        let seen = Arc::new(Mutex::new(Vec::<Observed>::new()));
        let stop = tokio_util::sync::CancellationToken::new();
        let (connect, dir) = (connect.to_string(), format!("{stream_path}/checkpoints"));
        let auth = auth.map(|(u, p)| format!("{u}:{p}").into_bytes());
        let (s2, stop2) = (seen.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut last: BTreeMap<String, i32> = BTreeMap::new();
            'outer: while !stop2.is_cancelled() {
                let mut c = zookeeper_client::Client::connector()
                    .with_session_timeout(Duration::from_secs(10))
                    .with_connection_timeout(Duration::from_secs(2));
                if let Some(a) = &auth {
                    c = c.with_auth("digest", a);
                }
                let client = match tokio::time::timeout(Duration::from_secs(3), c.connect(&connect)).await {
                    Ok(Ok(c)) => c,
                    _ => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                };
                while !stop2.is_cancelled() {
                    if client.state().is_terminated() {
                        continue 'outer;
                    }
                    if let Ok(children) = client.list_children(&dir).await {
                        for shard in children {
                            let Ok((data, stat)) = client.get_data(&format!("{dir}/{shard}")).await else { continue };
                            if last.get(&shard) == Some(&stat.version) {
                                continue;
                            }
                            last.insert(shard.clone(), stat.version);
                            if let Ok(cp) = serde_json::from_slice::<Checkpoint>(&data) {
                                s2.lock().unwrap().push(Observed {
                                    shard,
                                    version: stat.version,
                                    mtime_ms: stat.mtime,
                                    cp,
                                });
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(40)).await;
                }
            }
        });
        CheckpointWatcher { seen, stop, task: Some(task) }
    }

    /// Stops polling; returns every observation.
    pub async fn finish(mut self) -> Vec<Observed> {
        self.stop.cancel();
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
        self.seen.lock().unwrap().clone()
    }
}

/// Checks that no checkpoint ever moved backwards, nor was un-finished, as versions increased.
/// Returns the violations.
pub fn backwards_moves(obs: &[Observed]) -> Vec<String> {
    let mut by_shard: BTreeMap<&str, Vec<&Observed>> = BTreeMap::new();
    for o in obs {
        by_shard.entry(o.shard.as_str()).or_default().push(o);
    }
    let mut v = Vec::new();
    for (shard, mut list) in by_shard {
        list.sort_by_key(|o| o.version);
        for w in list.windows(2) {
            let (a, b) = (&w[0].cp, &w[1].cp);
            if a.finished && !b.finished {
                v.push(format!("{shard}: v{} finished, v{} not", w[0].version, w[1].version));
            }
            if let (
                CheckpointPosition::AfterSequence { sequence: sa, .. },
                CheckpointPosition::AfterSequence { sequence: sb, .. },
            ) = (&a.position, &b.position)
                && sequence_cmp(sb, sa).is_lt()
            {
                v.push(format!("{shard}: v{} at {sa} -> v{} at {sb} (backwards)", w[0].version, w[1].version));
            }
            if matches!(a.position, CheckpointPosition::AfterSequence { .. })
                && !matches!(b.position, CheckpointPosition::AfterSequence { .. })
            {
                v.push(format!(
                    "{shard}: v{} {} -> v{} {} (backwards)",
                    w[0].version, a.position, w[1].version, b.position
                ));
            }
        }
    }
    v
}

/// Lines of a file containing `needle`.
pub fn count_lines(path: &Path, needle: &str) -> usize {
    std::fs::read_to_string(path).unwrap_or_default().lines().filter(|l| l.contains(needle)).count()
}

/// Every line of every `*.log` file of `dir` that contains `needle`.
pub fn grep_logs(dir: &Path, needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "log") {
            for l in std::fs::read_to_string(&p).unwrap_or_default().lines() {
                if l.contains(needle) {
                    out.push(format!("{}: {l}", p.display()));
                }
            }
        }
    }
    out
}

/// A worker process of the audit example started with extra environment variables (e.g.
/// `SQUALL_ZK_PASSWORD`, which must not appear on a command line). Same file names as
/// [`super::workers::Cluster::start`], so the cluster's audit and read-log helpers see it.
pub struct Proc {
    pub name: String,
    pub child: Option<std::process::Child>,
    pub log: std::path::PathBuf,
}

pub fn spawn_worker(
    cluster: &super::workers::Cluster,
    name: &str,
    tasks: usize,
    extra: &[&str],
    envs: &[(&str, &str)],
) -> Proc {
    let (mut cmd, log_path) = cluster.worker_command(&super::workers::audit_bin(), name, tasks, extra);
    cmd.env_remove("SQUALL_ZK_USER").env_remove("SQUALL_ZK_PASSWORD");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("start audit worker");
    Proc { name: name.to_string(), child: Some(child), log: log_path }
}

fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status();
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
    pub fn pause(&self) {
        signal(self.pid(), "STOP");
    }
    pub fn resume(&self) {
        signal(self.pid(), "CONT");
    }
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
    /// SIGTERM and wait for the exit code (None: killed after the timeout).
    pub fn stop(&mut self, timeout: Duration) -> Option<i32> {
        let child = self.child.as_mut()?;
        signal(child.id(), "TERM");
        let start = std::time::Instant::now();
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                self.child = None;
                return st.code();
            }
            if start.elapsed() > timeout {
                self.kill();
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    /// Waits for the process to exit by itself (None: still running after the timeout).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let child = self.child.as_mut()?;
        let start = std::time::Instant::now();
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                self.child = None;
                return Some(st.code().unwrap_or(-1));
            }
            if start.elapsed() > timeout {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            signal(c.id(), "CONT");
        }
        self.kill();
    }
}

/// A manifest without the given keys (for audits that expect those keys elsewhere).
pub fn manifest_without(m: &Manifest, keys: &[&str]) -> Manifest {
    let mut m = m.clone();
    for k in keys {
        if let Some(n) = m.counts.remove(*k) {
            m.total -= n;
        }
    }
    m
}

/// "Never two readers of one shard at once", robust to crashed and frozen tasks (which never log a
/// release): per (task, shard), the reading interval runs from `acquire` to its last `records` or
/// `end` event of that ownership; two tasks' intervals on one shard must not overlap.
pub fn reading_overlaps(entries: &[squall::spout::ReadLogEntry]) -> Vec<String> {
    let intervals = reading_intervals(entries);
    let mut v = Vec::new();
    for (shard, ivs) in intervals {
        for (i, a) in ivs.iter().enumerate() {
            for b in &ivs[i + 1..] {
                if a.0 != b.0 && a.1 < b.2 && b.1 < a.2 {
                    v.push(format!("{shard}: {} read {}..{} while {} read {}..{}", a.0, a.1, a.2, b.0, b.1, b.2));
                }
            }
        }
    }
    v
}

/// "No child read before all its parents finished": every `records` event of a shard comes after
/// a `finish` event of each parent. `parents` maps child -> parents.
pub fn child_before_parent(
    entries: &[squall::spout::ReadLogEntry],
    parents: &std::collections::HashMap<String, Vec<String>>,
) -> Vec<String> {
    let mut finished: BTreeMap<&str, i64> = BTreeMap::new();
    for e in entries.iter().filter(|e| e.event == "finish") {
        finished.entry(e.shard.as_str()).or_insert(e.t_ms);
    }
    let mut v = Vec::new();
    for e in entries.iter().filter(|e| e.event == "records") {
        for p in parents.get(&e.shard).into_iter().flatten() {
            match finished.get(p.as_str()) {
                Some(t) if *t <= e.t_ms => {}
                other => {
                    v.push(format!("{} read {} at {} but parent {p} finished at {other:?}", e.task, e.shard, e.t_ms))
                }
            }
        }
    }
    v
}

/// Task node names whose TaskInfo pid is `pid`.
pub async fn tasks_of(zk: &zookeeper_client::Client, cluster: &super::workers::Cluster, pid: u32) -> Vec<String> {
    let dir = format!("{}/topologies/{}/tasks", cluster.zk_root, cluster.topology);
    let mut out = Vec::new();
    for t in zk.list_children(&dir).await.unwrap_or_default() {
        if let Ok((data, _)) = zk.get_data(&format!("{dir}/{t}")).await {
            let v: serde_json::Value = serde_json::from_slice(&data).unwrap_or_default();
            if v["pid"].as_u64() == Some(pid as u64) {
                out.push(t);
            }
        }
    }
    out
}

/// Waits until every one of `shards` (held by `victims` when they failed at `since_ms`) is
/// owned by a live task other than the victims that reads it: an `acquire` in that task's
/// read log after `since_ms`, followed by a `records`, `end` or `finish` of the shard. Returns
/// the failover times from the read logs, the latest over the shards: to the acquisition (the
/// new owner holds the lease and starts reading) and to the first read that came back.
pub async fn wait_reowned(
    zk: &zookeeper_client::Client,
    cluster: &super::workers::Cluster,
    victims: &[String],
    shards: &[String],
    since_ms: i64,
    limit: Duration,
) -> (Duration, Duration) {
    // An empty list would be "re-owned" at once, in 0 ms: a failover that measured nothing.
    assert!(!shards.is_empty(), "wait_reowned: the victims {victims:?} held no shard, so no failover can be measured");
    let start = std::time::Instant::now();
    loop {
        let live = super::workers::live_tasks(zk, cluster).await;
        let entries = super::workers::read_log_entries(&cluster.read_logs());
        let mut worst = Some((0i64, 0i64));
        for shard in shards {
            // The first acquisition by another task that was followed by a read of that task (an
            // owner that handed the shard on before reading it, in a rebalance, does not count).
            let read_after = |a: &&squall::spout::ReadLogEntry| {
                entries
                    .iter()
                    .find(|e| {
                        e.shard == *shard
                            && e.task == a.task
                            && e.t_ms >= a.t_ms
                            && matches!(e.event.as_str(), "records" | "end" | "finish" | "release")
                    })
                    .filter(|e| e.event != "release")
            };
            let pair = entries
                .iter()
                .filter(|e| {
                    e.shard == *shard && e.event == "acquire" && e.t_ms >= since_ms && !victims.contains(&e.task)
                })
                .find_map(|a| read_after(&a).map(|r| (a, r)));
            match pair {
                Some((a, r)) if live.contains(&a.task) || r.event == "finish" => {
                    worst = worst.map(|(o, w)| (o.max(a.t_ms - since_ms), w.max(r.t_ms - since_ms)));
                }
                _ => worst = None,
            }
        }
        if let Some((owned, read)) = worst {
            let ms = |v: i64| Duration::from_millis(v.max(0) as u64);
            return (ms(owned), ms(read));
        }
        assert!(
            start.elapsed() < limit,
            "shards {shards:?} of {victims:?} were never read by another task: owners {:?}\n{}",
            super::workers::owners(zk, cluster).await,
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Per (task, shard) reading intervals from the read logs, as [`reading_overlaps`] builds them:
/// shard -> (task, first acquire, last `records`/`end`) for each ownership.
pub fn reading_intervals(entries: &[squall::spout::ReadLogEntry]) -> BTreeMap<String, Vec<(String, i64, i64)>> {
    let mut intervals: BTreeMap<String, Vec<(String, i64, i64)>> = BTreeMap::new();
    let mut open: BTreeMap<(String, String), (i64, i64)> = BTreeMap::new();
    for e in entries {
        let key = (e.shard.clone(), e.task.clone());
        match e.event.as_str() {
            "acquire" => {
                if let Some((s, end)) = open.insert(key.clone(), (e.t_ms, e.t_ms)) {
                    intervals.entry(key.0).or_default().push((key.1, s, end));
                }
            }
            "records" | "end" => {
                let iv = open.entry(key).or_insert((e.t_ms, e.t_ms));
                iv.1 = e.t_ms;
            }
            "release" => {
                if let Some((s, end)) = open.remove(&key) {
                    intervals.entry(key.0).or_default().push((key.1, s, end));
                }
            }
            _ => {}
        }
    }
    for ((shard, task), (s, end)) in open {
        intervals.entry(shard).or_default().push((task, s, end));
    }
    intervals
}

/// The longest time two tasks read one shard at once (ms; 0 when never), and the shard.
pub fn double_read_window(entries: &[squall::spout::ReadLogEntry]) -> (i64, Option<String>) {
    let mut worst = (0, None);
    for (shard, ivs) in reading_intervals(entries) {
        for (i, a) in ivs.iter().enumerate() {
            for b in &ivs[i + 1..] {
                if a.0 != b.0 {
                    let overlap = a.2.min(b.2) - a.1.max(b.1);
                    if overlap > worst.0 {
                        worst = (overlap, Some(shard.clone()));
                    }
                }
            }
        }
    }
    worst
}

/// Checkpoint versions accepted from a fenced owner: a version written by task W of shard S at
/// mtime m while another task X had acquired S after W's last acquisition of S before m (read
/// logs). Each entry describes one such accepted write.
pub fn fenced_writes_accepted(obs: &[Observed], entries: &[squall::spout::ReadLogEntry]) -> Vec<String> {
    let mut v = Vec::new();
    for o in obs {
        let Some(w) = o.cp.writer.as_deref() else { continue };
        let acquires = entries.iter().filter(|e| e.shard == o.shard && e.event == "acquire" && e.t_ms <= o.mtime_ms);
        let own = acquires.clone().filter(|e| e.task == w).map(|e| e.t_ms).max();
        let Some(own) = own else { continue };
        if let Some(x) = acquires.clone().find(|e| e.task != w && e.t_ms > own) {
            v.push(format!(
                "{} v{} written by {w} at {} after {} acquired it at {} (its own acquire {own})",
                o.shard, o.version, o.mtime_ms, x.task, x.t_ms
            ));
        }
    }
    v
}
