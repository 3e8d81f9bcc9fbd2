//! Running audit workers (examples/audit.rs) as real processes, reading what they delivered and
//! what they read, and inspecting shard ownership in ZooKeeper.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use squall::audit::{AuditReport, Delivery};
use squall::kinesis::payload::Manifest;
use squall::spout::ReadLogEntry;

/// The audit example binary (`target/<profile>/examples/audit`).
pub fn audit_bin() -> PathBuf {
    example_bin("audit")
}

/// An example binary the tests run as workers. `cargo test --test NAME` builds the squall binary
/// but not the examples, so one may be missing or older than the sources: both fail here, saying
/// what to run, rather than testing yesterday's code.
pub fn example_bin(name: &str) -> PathBuf {
    let bin = super::profile_dir().join("examples").join(name);
    let fix = "run `make it NAME=<test>` (or `cargo build --examples` before `cargo test --test <test>`)";
    let built = std::fs::metadata(&bin)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| panic!("{} missing: {fix}", bin.display()));
    if let Some((newest, path)) = newest_source(&bin) {
        assert!(built >= newest, "{} is older than {} (edited after the build): {fix}", bin.display(), path.display());
    }
    bin
}

/// The newest of the source files `bin` was built from, as cargo's dep-info file beside it
/// (`bin.d`: `bin: file file ...`, spaces in names escaped) lists them.
fn newest_source(bin: &Path) -> Option<(std::time::SystemTime, PathBuf)> {
    let info = std::fs::read_to_string(bin.with_extension("d")).ok()?;
    let deps = info.lines().next()?.split_once(": ")?.1.replace("\\ ", "\u{0}");
    deps.split_whitespace()
        .map(|f| PathBuf::from(f.replace('\u{0}', " ")))
        .filter_map(|f| Some((std::fs::metadata(&f).and_then(|m| m.modified()).ok()?, f)))
        .max()
}

/// A scratch directory for one test's files (workers' logs, deliveries, manifests), removed when
/// the last handle to it goes (a [`Cluster`] built on it holds one) and the test did not fail. A
/// failing test keeps it, saying where, so its logs can be read.
pub fn scratch(name: &str) -> Scratch {
    let path = std::env::temp_dir().join(super::unique_name(name));
    std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("scratch directory {}: {e}", path.display()));
    Scratch(std::sync::Arc::new(ScratchDir(path)))
}

/// See [`scratch`]; derefs to its path. Clones share the directory: it is removed when the last
/// one is dropped, so a helper that returns a [`Cluster`] keeps its files for the caller.
#[derive(Clone, Debug)]
pub struct Scratch(std::sync::Arc<ScratchDir>);

#[derive(Debug)]
struct ScratchDir(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0.0
    }
}

impl AsRef<std::ffi::OsStr> for Scratch {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.0.as_os_str()
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("test scratch directory kept for a look: {}", self.0.display());
        } else if let Err(e) = std::fs::remove_dir_all(&self.0) {
            eprintln!("test scratch directory {} not removed: {e}", self.0.display());
        }
    }
}

/// Settings shared by the workers of one test.
#[derive(Clone, Debug)]
pub struct Cluster {
    pub topology: String,
    pub stream: String,
    pub zk_root: String,
    pub dir: PathBuf,
    pub session_timeout_ms: u64,
    pub initial_position: String,
    pub spout_config: PathBuf,
    pub message_timeout_ms: u64,
    /// Keeps `dir` while the cluster (or a clone) lives.
    _dir: Scratch,
}

impl Cluster {
    pub fn new(stream: &str, dir: &Scratch) -> Cluster {
        Self::with_spout_config(stream, dir, serde_json::json!({}))
    }

    /// Like [`Cluster::new`], with extra spout configuration keys (e.g. `retry`); a key set to
    /// null is removed, so the spout's default applies.
    pub fn with_spout_config(stream: &str, dir: &Scratch, extra: serde_json::Value) -> Cluster {
        let spout_config = dir.join("spout.json");
        let mut cfg = serde_json::json!({
            "topology": "x", "stream": "x",
            "shard_discovery_interval_ms": 1000,
            "checkpoint_interval_ms": 300,
            "idle_poll_interval_ms": 100,
            "resync_interval_ms": 2000,
            "handoff_timeout_ms": 10000
        });
        if let (Some(c), Some(e)) = (cfg.as_object_mut(), extra.as_object()) {
            c.extend(e.clone());
            // A null removes a key: the spout's default applies.
            c.retain(|_, v| !v.is_null());
        }
        std::fs::write(&spout_config, cfg.to_string()).unwrap();
        Cluster {
            topology: super::unique_name("topo"),
            stream: stream.to_string(),
            zk_root: super::unique_zk_root("spout"),
            dir: dir.to_path_buf(),
            session_timeout_ms: 4000,
            initial_position: "trim-horizon".into(),
            spout_config,
            message_timeout_ms: 10_000,
            _dir: dir.clone(),
        }
    }

    /// Starts a worker named `name` with `tasks` spout tasks.
    pub fn start(&self, name: &str, tasks: usize) -> Worker {
        self.start_with(name, tasks, &[])
    }

    pub fn start_with(&self, name: &str, tasks: usize, extra: &[&str]) -> Worker {
        self.start_example(&audit_bin(), name, tasks, extra)
    }

    /// The command that starts worker `name` of this cluster running `bin`: the standard worker
    /// flags, `--deliveries` and `--read-log` in the test directory, output to `{name}.log`.
    /// Returns it with the log's path.
    pub fn worker_command(&self, bin: &Path, name: &str, tasks: usize, extra: &[&str]) -> (Command, PathBuf) {
        let deliveries = self.dir.join(format!("{name}.deliveries.jsonl"));
        let read_log = self.dir.join(format!("{name}.reads.jsonl"));
        let log_path = self.dir.join(format!("{name}.log"));
        let log = std::fs::File::create(&log_path).unwrap();
        let mut cmd = Command::new(bin);
        cmd.args(["--topology", &self.topology, "--stream", &self.stream, "--zk-root", &self.zk_root])
            .args(["--spout-tasks", &tasks.to_string()])
            .args(["--zk-session-timeout-ms", &self.session_timeout_ms.to_string()])
            .args(["--initial-position", &self.initial_position])
            .args(["--message-timeout-ms", &self.message_timeout_ms.to_string()])
            .arg("--spout-config")
            .arg(&self.spout_config)
            .arg("--deliveries")
            .arg(&deliveries)
            .arg("--read-log")
            .arg(&read_log)
            .args(extra)
            .env("SQUALL_ZK", super::zk_connect())
            .env("SQUALL_KINESIS_ENDPOINT", super::kinesis_endpoint().endpoint)
            .env("RUST_LOG", "info,squall=debug,squall::spout::stream=trace")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        (cmd, log_path)
    }

    /// Starts worker `name` running the example binary `bin` (which takes the standard worker
    /// flags and `--deliveries`).
    pub fn start_example(&self, bin: &Path, name: &str, tasks: usize, extra: &[&str]) -> Worker {
        self.start_example_env(bin, name, tasks, extra, &[])
    }

    /// Like [`Cluster::start_with`], with extra environment variables for the worker (e.g.
    /// `SQUALL_CLOCK_OFFSET_MS`).
    pub fn start_with_env(&self, name: &str, tasks: usize, extra: &[&str], env: &[(&str, &str)]) -> Worker {
        self.start_example_env(&audit_bin(), name, tasks, extra, env)
    }

    fn start_example_env(&self, bin: &Path, name: &str, tasks: usize, extra: &[&str], env: &[(&str, &str)]) -> Worker {
        let (mut cmd, log) = self.worker_command(bin, name, tasks, extra);
        cmd.envs(env.iter().copied());
        let child = cmd.spawn().expect("start worker");
        Worker {
            name: name.to_string(),
            child: Some(child),
            deliveries: self.dir.join(format!("{name}.deliveries.jsonl")),
            read_log: self.dir.join(format!("{name}.reads.jsonl")),
            log,
        }
    }

    /// Every delivery file of this test's directory.
    pub fn delivery_files(&self) -> Vec<PathBuf> {
        files_ending(&self.dir, ".deliveries.jsonl")
    }

    /// Every read log of this test's directory.
    pub fn read_logs(&self) -> Vec<PathBuf> {
        files_ending(&self.dir, ".reads.jsonl")
    }

    /// Waits until more than `before` records were delivered (the workers are reading: a fault
    /// made now overlaps their work); returns how many. Fails after 30 s without one.
    pub async fn wait_more_delivered(&self, before: usize) -> usize {
        let start = Instant::now();
        loop {
            let n = read_deliveries(&self.delivery_files()).len();
            if n > before {
                return n;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "no delivery for 30 s (still {n})\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Audits the deliveries so far against the manifests.
    pub fn audit(&self, manifests: &[Manifest]) -> AuditReport {
        squall::audit::compare(manifests, read_deliveries(&self.delivery_files()))
    }

    /// Waits until nothing is lost (or the timeout), returning the last report.
    pub async fn wait_delivered(&self, manifests: &[Manifest], timeout: Duration) -> AuditReport {
        let start = Instant::now();
        loop {
            let r = self.audit(manifests);
            if r.lost == 0 || start.elapsed() > timeout {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The worker logs, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for f in files_ending(&self.dir, ".log") {
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            out.push_str(&format!("==== {} (last 40 lines)\n", f.display()));
            for l in tail.into_iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    pub fn stream_path(&self) -> String {
        format!("{}/topologies/{}/streams/{}", self.zk_root, self.topology, self.stream)
    }
}

fn files_ending(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> =
        std::fs::read_dir(dir).map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect()).unwrap_or_default();
    v.retain(|p| p.to_string_lossy().ends_with(suffix));
    v.sort();
    v
}

pub fn read_deliveries(files: &[PathBuf]) -> Vec<Delivery> {
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        out.extend(text.lines().filter_map(|l| serde_json::from_str::<Delivery>(l).ok()));
    }
    out
}

pub fn read_log_entries(files: &[PathBuf]) -> Vec<ReadLogEntry> {
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        out.extend(text.lines().filter_map(|l| serde_json::from_str::<ReadLogEntry>(l).ok()));
    }
    out.sort_by_key(|e| e.t_ms);
    out
}

/// A running worker process.
pub struct Worker {
    pub name: String,
    child: Option<Child>,
    pub deliveries: PathBuf,
    pub read_log: PathBuf,
    /// Its output (`{name}.log`).
    pub log: PathBuf,
}

impl Worker {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// SIGTERM, then wait for the exit code (graceful stop).
    pub fn stop(&mut self, timeout: Duration) -> Option<i32> {
        let child = self.child.as_mut()?;
        unsafe_signal(child.id(), "TERM");
        let start = Instant::now();
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                self.child = None;
                return st.code();
            }
            if start.elapsed() > timeout {
                let _ = child.kill();
                let _ = child.wait();
                self.child = None;
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL: a crash.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGSTOP / SIGCONT: freeze and thaw (a zombie).
    pub fn pause(&self) {
        unsafe_signal(self.pid(), "STOP");
    }
    pub fn resume(&self) {
        unsafe_signal(self.pid(), "CONT");
    }

    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// What the worker logged so far (its `{name}.log` in the cluster's directory).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Sends a signal with the `kill` command (no unsafe code in tests).
fn unsafe_signal(pid: u32, sig: &str) {
    let _ = Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status();
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Current owner task of each shard, from ZooKeeper: the lowest lease (by sequence). Its holder is
/// the task named in the lease node (`lease-{task}-N`); for a bare `lease-N` it is the task whose
/// session created it, or `session-{id}` when no task has that session. Shards without a lease are
/// absent.
pub async fn owners(zk: &zookeeper_client::Client, cluster: &Cluster) -> BTreeMap<String, String> {
    let stream = cluster.stream_path();
    let tasks_dir = format!("{}/topologies/{}/tasks", cluster.zk_root, cluster.topology);
    let mut session_to_task: HashMap<i64, String> = HashMap::new();
    for t in zk.list_children(&tasks_dir).await.unwrap_or_default() {
        if let Ok(Some(st)) = zk.check_stat(&format!("{tasks_dir}/{t}")).await {
            session_to_task.insert(st.ephemeral_owner, t);
        }
    }
    let seq = |n: &str| n.rsplit_once('-').and_then(|(_, d)| d.parse::<u64>().ok()).unwrap_or(u64::MAX);
    let mut out = BTreeMap::new();
    let owners_dir = format!("{stream}/owners");
    for shard in zk.list_children(&owners_dir).await.unwrap_or_default() {
        let dir = format!("{owners_dir}/{shard}");
        let mut leases = zk.list_children(&dir).await.unwrap_or_default();
        leases.sort_by_key(|n| seq(n));
        let Some(first) = leases.first() else { continue };
        let named = first.strip_prefix("lease-").and_then(|r| r.rsplit_once('-')).map(|(h, _)| h.to_string());
        if let Some(holder) = named.filter(|h| !h.is_empty()) {
            out.insert(shard, holder);
        } else if let Ok(Some(st)) = zk.check_stat(&format!("{dir}/{first}")).await {
            let task = session_to_task
                .get(&st.ephemeral_owner)
                .cloned()
                .unwrap_or_else(|| format!("session-{:x}", st.ephemeral_owner));
            out.insert(shard, task);
        }
    }
    out
}

/// Live task names.
pub async fn live_tasks(zk: &zookeeper_client::Client, cluster: &Cluster) -> Vec<String> {
    let tasks_dir = format!("{}/topologies/{}/tasks", cluster.zk_root, cluster.topology);
    let mut v = zk.list_children(&tasks_dir).await.unwrap_or_default();
    v.sort();
    v
}

/// Checks "no child read before all its parents finished" and "never two readers of one shard"
/// on the read logs. `parents` maps child -> parents. Returns the violations.
pub fn read_log_violations(entries: &[ReadLogEntry], parents: &HashMap<String, Vec<String>>) -> Vec<String> {
    let mut v = Vec::new();
    let mut finished_at: HashMap<&str, i64> = HashMap::new();
    for e in entries {
        if e.event == "finish" {
            finished_at.entry(e.shard.as_str()).or_insert(e.t_ms);
        }
    }
    for e in entries.iter().filter(|e| e.event == "records") {
        for p in parents.get(&e.shard).into_iter().flatten() {
            match finished_at.get(p.as_str()) {
                Some(t) if *t <= e.t_ms => {}
                Some(t) => {
                    v.push(format!("{} read {} at {} before parent {p} finished at {t}", e.task, e.shard, e.t_ms))
                }
                None => v.push(format!("{} read {} at {} but parent {p} never finished", e.task, e.shard, e.t_ms)),
            }
        }
    }
    // Exclusive reading: between a task's acquire and its release of a shard, no other task's
    // records events for that shard.
    let mut holder: HashMap<&str, &str> = HashMap::new();
    for e in entries {
        match e.event.as_str() {
            "acquire" => {
                if let Some(h) = holder.get(e.shard.as_str())
                    && *h != e.task
                {
                    v.push(format!("{} acquired {} at {} while {h} held it", e.task, e.shard, e.t_ms));
                }
                holder.insert(e.shard.as_str(), e.task.as_str());
            }
            "release" if holder.get(e.shard.as_str()) == Some(&e.task.as_str()) => {
                holder.remove(e.shard.as_str());
            }
            "records" => {
                if let Some(h) = holder.get(e.shard.as_str())
                    && *h != e.task
                {
                    v.push(format!("{} read {} at {} while {h} held it", e.task, e.shard, e.t_ms));
                }
            }
            _ => {}
        }
    }
    v
}
