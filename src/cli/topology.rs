//! `squall topology list | activate | deactivate | rebalance | kill | status | checkpoints reset`:
//! operating topologies through their state in ZooKeeper, which every worker watches and obeys.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, bail};
use aws_sdk_kinesis::primitives::{DateTime, DateTimeFormat};
use serde::Serialize;
use tokio::time::Instant;

use super::Cli;
use crate::coord::{
    Admin, CheckpointPosition, CoordError, DrainRequest, Lifecycle, RebalanceRequest, StageRuntime, TopologyState,
    WorkerStatus, ZkAuth, ZkConfig, ZkSession, ZkStore, now_ms,
};

/// Where `checkpoints reset` rewinds to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResetTarget {
    /// The oldest retained record.
    TrimHorizon,
    /// Now: only records that arrive from now on.
    Latest,
    /// Records that arrived at or after this time (ms since the epoch).
    At(i64),
}

impl std::str::FromStr for ResetTarget {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "trim-horizon" | "TRIM_HORIZON" => Ok(Self::TrimHorizon),
            "latest" | "LATEST" => Ok(Self::Latest),
            other => DateTime::from_str(other, DateTimeFormat::DateTimeWithOffset)
                .or_else(|_| DateTime::from_str(other, DateTimeFormat::DateTime))
                .ok()
                .and_then(|d| d.to_millis().ok())
                .map(Self::At)
                .ok_or_else(|| {
                    format!(
                        "{other:?} is not a reset target: use trim-horizon, latest or an RFC 3339 timestamp such as 2026-11-30T09:00:00Z"
                    )
                }),
        }
    }
}

/// Where an operation's messages go: the CLI prints them (warnings on stderr), the web UI
/// ([`crate::ui`]) shows them on its result page.
pub trait Progress: Send {
    /// A line of the operation's outcome (stdout for the CLI).
    fn out(&mut self, line: String);
    /// A warning (stderr for the CLI).
    fn warn(&mut self, line: String);
    /// What the operation is waiting for, as it changes (the CLI shows a spinner on a terminal).
    fn waiting(&mut self, _what: String) {}
    /// The wait is over (with or without success).
    fn done_waiting(&mut self) {}
}

/// The CLI's [`Progress`]: prints each line as it comes; a wait shows a spinner on stderr when
/// it is a terminal.
#[derive(Default)]
struct Print {
    spinner: Option<indicatif::ProgressBar>,
}

impl Progress for Print {
    fn out(&mut self, line: String) {
        self.done_waiting();
        outln!("{line}");
    }
    fn warn(&mut self, line: String) {
        self.done_waiting();
        eprintln!("{line}");
    }
    fn waiting(&mut self, what: String) {
        match &self.spinner {
            Some(s) => s.set_message(what),
            None => self.spinner = Some(super::progress::spinner(&what)),
        }
    }
    fn done_waiting(&mut self) {
        if let Some(s) = self.spinner.take() {
            s.finish_and_clear();
        }
    }
}

/// A collected [`Progress`]: every line, warnings marked.
#[derive(Debug, Default)]
pub struct Collected {
    /// `(is_warning, line)` in order.
    pub lines: Vec<(bool, String)>,
}

impl Progress for Collected {
    fn out(&mut self, line: String) {
        self.lines.push((false, line));
    }
    fn warn(&mut self, line: String) {
        self.lines.push((true, line));
    }
}

pub(crate) fn zk_config(cli: &Cli) -> ZkConfig {
    let mut cfg = ZkConfig::new(cli.zk.clone()).with_root(cli.zk_root.clone());
    if let Some(user) = &cli.zk_user {
        cfg = cfg.with_auth(ZkAuth::digest(user.clone(), std::env::var("SQUALL_ZK_PASSWORD").unwrap_or_default()));
    }
    cfg
}

async fn admin(cfg: &ZkConfig) -> anyhow::Result<Admin> {
    Ok(Admin::connect(cfg).await?)
}

async fn state_of(store: &ZkStore, topology: &str) -> anyhow::Result<(TopologyState, i32)> {
    match store.read_state().await? {
        Some(v) => Ok((v.value, v.version)),
        None => Err(no_state(topology)),
    }
}

/// The error of a topology whose lifecycle state does not exist.
fn no_state(topology: &str) -> anyhow::Error {
    anyhow::anyhow!("topology {topology:?} has no lifecycle state yet: start a worker for it first")
}

/// Sets the lifecycle state with a compare-and-set loop. Returns the previous state.
///
/// A read or write whose answer was lost (ConnectionLoss) is tried again, up to 5 times: a write
/// the server applied is recognised on the next read (the state then equals what was written,
/// stamp included) and its previous state returned, not taken for a no-op over the new one (a
/// `rebalance` retried after a lost answer restored INACTIVE: the simulator's seed 383).
async fn set_state(
    store: &ZkStore,
    topology: &str,
    f: impl Fn(&TopologyState) -> anyhow::Result<TopologyState>,
) -> anyhow::Result<TopologyState> {
    let mut lost = 0u64;
    let mut written: Option<(TopologyState, TopologyState)> = None;
    for _ in 0..20 {
        let (cur, version) = match store.read_state().await {
            Ok(Some(v)) => (v.value, v.version),
            Ok(None) => return Err(no_state(topology)),
            Err(e) if e.is_transient() && lost < 5 => {
                lost += 1;
                tokio::time::sleep(Duration::from_millis(200 * lost)).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if let Some((prev, next)) = written.take()
            && next == cur
        {
            return Ok(prev);
        }
        let mut next = f(&cur)?;
        next.updated_at_ms = now_ms();
        match store.write_state(&next, Some(version)).await {
            Ok(_) => return Ok(cur),
            Err(CoordError::VersionConflict { .. }) => continue,
            Err(e) if e.is_transient() && lost < 5 => {
                lost += 1;
                written = Some((cur, next));
                tokio::time::sleep(Duration::from_millis(200 * lost)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    bail!("the state of topology {topology:?} kept changing under us; try again")
}

fn lifecycle_name(l: Lifecycle) -> &'static str {
    match l {
        Lifecycle::Active => "ACTIVE",
        Lifecycle::Inactive => "INACTIVE",
        Lifecycle::Draining => "DRAINING",
        Lifecycle::Drained => "DRAINED",
        Lifecycle::Killed => "KILLED",
    }
}

fn to(state: Lifecycle, topology: &str) -> impl Fn(&TopologyState) -> anyhow::Result<TopologyState> + '_ {
    move |cur| {
        if matches!(cur.state, Lifecycle::Killed | Lifecycle::Drained) {
            bail!("topology {topology:?} is {}: start its workers again to deploy it", lifecycle_name(cur.state));
        }
        // A drain, once requested, runs to DRAINED: the last worker to drain marks it, and only
        // from DRAINING. Overwritten, the state would never get there, and every worker started
        // later would join the draining deployment and drain at once (the simulator's seed 68).
        if cur.state == Lifecycle::Draining && state != Lifecycle::Draining {
            bail!(
                "topology {topology:?} is DRAINING (deployment {}): it cannot be {} before it is DRAINED; wait for \
                 it (`squall drain {topology} --wait SECONDS`), then start its workers again to deploy it",
                cur.deployment_id,
                if state == Lifecycle::Active { "activated" } else { "deactivated" }
            );
        }
        Ok(TopologyState { state, kill_wait_ms: None, ..cur.clone() })
    }
}

/// A topology under the root, as `squall topology list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct TopologySummary {
    /// Topology name.
    pub topology: String,
    /// ACTIVE, INACTIVE, DRAINING, DRAINED or KILLED; null when it has no readable state yet.
    pub state: Option<String>,
    /// The current deployment id (null with the state).
    pub deployment_id: Option<String>,
}

/// Every topology under the root with its state, sorted by name.
pub(crate) async fn topologies(cfg: &ZkConfig) -> anyhow::Result<Vec<TopologySummary>> {
    list_topologies(&admin(cfg).await?).await
}

async fn list_topologies(admin: &Admin) -> anyhow::Result<Vec<TopologySummary>> {
    let mut out = Vec::new();
    for t in admin.topologies().await? {
        let state = match admin.any_store(&t).await {
            Ok(s) => s.read_state().await.ok().flatten().map(|v| v.value),
            Err(_) => None,
        };
        out.push(TopologySummary {
            topology: t,
            state: state.as_ref().map(|s| lifecycle_name(s.state).to_string()),
            deployment_id: state.map(|s| s.deployment_id),
        });
    }
    Ok(out)
}

pub(super) async fn list(cli: &Cli) -> anyhow::Result<()> {
    let list = topologies(&zk_config(cli)).await?;
    if list.is_empty() {
        outln!("no topologies under {}", cli.zk_root);
    }
    for t in list {
        outln!("{}\t{}", t.topology, t.state.as_deref().unwrap_or("-"));
    }
    Ok(())
}

pub(super) async fn activate(cli: &Cli, topology: &str, active: bool) -> anyhow::Result<()> {
    set_active(&zk_config(cli), topology, active, &mut Print::default()).await
}

/// `squall activate` / `squall deactivate`.
pub async fn set_active(
    cfg: &ZkConfig,
    topology: &str,
    active: bool,
    progress: &mut dyn Progress,
) -> anyhow::Result<()> {
    let admin = admin(cfg).await?;
    let store = admin.any_store(topology).await?;
    let want = if active { Lifecycle::Active } else { Lifecycle::Inactive };
    let prev = set_state(&store, topology, to(want, topology)).await?;
    progress.out(format!("{topology}: {} -> {}", lifecycle_name(prev.state), lifecycle_name(want)));
    Ok(())
}

async fn wait_no_leases(
    admin: &Admin,
    topology: &str,
    wait: Duration,
    progress: &mut dyn Progress,
) -> anyhow::Result<bool> {
    // One session per stream for the whole wait, not one per poll.
    let mut stores = Vec::new();
    for stream in admin.streams(topology).await? {
        stores.push(admin.store(topology, &stream).await?);
    }
    let start = Instant::now();
    loop {
        let mut held = 0;
        for store in &stores {
            held += store.shard_owners().await?.len();
        }
        if held == 0 || start.elapsed() > wait {
            progress.done_waiting();
            return Ok(held == 0);
        }
        progress.waiting(format!("waiting for the shards to be handed back: {held} still leased"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How long (s) the leader waits, by default, for the tasks to register again after a rebalance.
pub(crate) const REBALANCE_GATHER_SECS: u64 = 10;

pub(super) async fn rebalance(cli: &Cli, topology: &str, wait: u64, gather: u64) -> anyhow::Result<()> {
    rebalance_topology(&zk_config(cli), topology, wait, gather, &mut Print::default()).await
}

/// `squall rebalance`: deactivates, waits up to `wait` s for every shard to be handed back, then
/// replaces each stream's assignment with a [`RebalanceRequest`] naming how many tasks were
/// registered before, and restores the previous state. The leader gathers the tasks (up to
/// `gather` s) and assigns from scratch, round-robin.
pub async fn rebalance_topology(
    cfg: &ZkConfig,
    topology: &str,
    wait: u64,
    gather: u64,
    progress: &mut dyn Progress,
) -> anyhow::Result<()> {
    let admin = admin(cfg).await?;
    let store = admin.any_store(topology).await?;
    let start = Instant::now();
    let mut before = Vec::new();
    for stream in admin.streams(topology).await? {
        let tasks = admin.store(topology, &stream).await?.task_names().await?.len();
        before.push((stream, tasks));
    }
    let prev = set_state(&store, topology, to(Lifecycle::Inactive, topology)).await?;
    let moved = async {
        let released = wait_no_leases(&admin, topology, Duration::from_secs(wait), progress).await?;
        if released {
            for (stream, tasks) in &before {
                let request = RebalanceRequest { tasks: *tasks, gather_ms: gather.saturating_mul(1000) };
                admin.store(topology, stream).await?.request_rebalance(&request).await?;
            }
        }
        anyhow::Ok(released)
    }
    .await;
    // The previous state comes back whether or not the middle failed: a rebalance that failed
    // half-way must not leave the topology deactivated (nor one run again take INACTIVE for the
    // state to restore). Not over a drain or a kill written meanwhile (`to` refuses those).
    let restore = prev.state;
    let restored = set_state(&store, topology, to(restore, topology)).await;
    let released = match (moved, restored) {
        (Ok(released), Ok(_)) => released,
        (Err(e), Ok(_)) => {
            return Err(
                e.context(format!("{topology}: rebalance failed; its state is {} again", lifecycle_name(restore)))
            );
        }
        (moved, Err(e)) => bail!(
            "{topology}: the rebalance {} but restoring the state {} failed: {e:#}; it may be left INACTIVE: run \
             `squall activate {topology}` if it should run",
            if moved.is_ok() { "went through" } else { "failed" },
            lifecycle_name(restore)
        ),
    };
    if !released {
        progress.warn(format!(
            "warning: some shards were still leased after {wait} s; they move when their in-flight tuples finish"
        ));
    }
    progress.out(format!(
        "{topology}: rebalanced in {:.2} s (deactivated, shards handed back, state restored to {})",
        start.elapsed().as_secs_f64(),
        lifecycle_name(restore)
    ));
    Ok(())
}

pub(super) async fn kill(cli: &Cli, topology: &str, wait: Option<u64>) -> anyhow::Result<()> {
    kill_topology(&zk_config(cli), topology, wait, &mut Print::default()).await
}

/// `squall kill`: marks the topology KILLED and waits until every worker is gone.
pub async fn kill_topology(
    cfg: &ZkConfig,
    topology: &str,
    wait: Option<u64>,
    progress: &mut dyn Progress,
) -> anyhow::Result<()> {
    let admin = admin(cfg).await?;
    let store = admin.any_store(topology).await?;
    set_state(&store, topology, |cur| {
        Ok(TopologyState { state: Lifecycle::Killed, kill_wait_ms: wait.map(|w| w * 1000), ..cur.clone() })
    })
    .await?;
    // Workers deactivate, wait for in-flight tuples (up to --wait or their message timeout),
    // checkpoint and exit 0. Wait for them to go.
    let limit = Duration::from_secs(wait.unwrap_or(30) + 15);
    let start = Instant::now();
    loop {
        let workers = store.workers().await?;
        let tasks = store.live_tasks().await?;
        progress.waiting(format!("waiting for the workers to stop: {} still running", workers.len()));
        if workers.is_empty() && tasks.is_empty() {
            progress
                .out(format!("{topology}: killed; every worker stopped after {:.2} s", start.elapsed().as_secs_f64()));
            return Ok(());
        }
        if start.elapsed() > limit {
            progress.done_waiting();
            bail!(
                "{topology}: marked KILLED, but {} worker(s) still run after {} s: {}",
                workers.len(),
                limit.as_secs(),
                workers
                    .iter()
                    .map(|w| format!("{} (pid {} on {})", w.worker_id, w.pid, w.host))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(super) async fn drain(cli: &Cli, topology: &str, wait: Option<u64>) -> anyhow::Result<()> {
    drain_topology(&zk_config(cli), topology, wait, &mut Print::default()).await
}

/// `squall drain`: requests the drain, and with `wait` waits for DRAINED.
pub async fn drain_topology(
    cfg: &ZkConfig,
    topology: &str,
    wait: Option<u64>,
    progress: &mut dyn Progress,
) -> anyhow::Result<()> {
    let admin = admin(cfg).await?;
    let store = admin.any_store(topology).await?;
    let (state, _) = state_of(&store, topology).await?;
    if !matches!(state.state, Lifecycle::Active | Lifecycle::Inactive | Lifecycle::Draining) {
        bail!("topology {topology:?} is {}: nothing to drain", lifecycle_name(state.state));
    }
    let deployment = state.deployment_id.clone();
    // The notification first (workers obey it), then the state for operators.
    store.write_drain(&DrainRequest { deployment_id: deployment.clone(), requested_at_ms: now_ms() }).await?;
    set_state(&store, topology, |cur| {
        if cur.deployment_id != deployment {
            bail!("topology {topology:?} was redeployed while draining was requested; nothing drained");
        }
        if cur.state == Lifecycle::Drained {
            return Ok(cur.clone());
        }
        Ok(TopologyState { state: Lifecycle::Draining, ..cur.clone() })
    })
    .await?;
    progress.out(format!("{topology}: draining deployment {deployment}"));
    let Some(wait) = wait else { return Ok(()) };
    let start = Instant::now();
    loop {
        let (st, _) = state_of(&store, topology).await?;
        let workers = store.workers().await?.len();
        progress
            .waiting(format!("waiting for DRAINED: {}, {workers} worker(s) still running", lifecycle_name(st.state)));
        if st.state == Lifecycle::Drained || (st.deployment_id != deployment) {
            progress.out(format!("{topology}: drained after {:.2} s", start.elapsed().as_secs_f64()));
            return Ok(());
        }
        if workers == 0 && start.elapsed() > Duration::from_secs(2) {
            progress.done_waiting();
            // No worker left to mark it: every one has gone, so the drain is complete.
            set_state(&store, topology, |cur| Ok(TopologyState { state: Lifecycle::Drained, ..cur.clone() })).await?;
            progress.out(format!("{topology}: drained (no worker left) after {:.2} s", start.elapsed().as_secs_f64()));
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(wait) {
            progress.done_waiting();
            bail!("{topology}: still draining after {wait} s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(super) async fn reset(cli: &Cli, topology: &str, stream: &str, target: &ResetTarget) -> anyhow::Result<()> {
    let admin = admin(&zk_config(cli)).await?;
    let streams = admin.streams(topology).await?;
    if !streams.iter().any(|s| s == stream) {
        bail!("topology {topology:?} does not read stream {stream:?}; it reads: {}", streams.join(", "));
    }
    let store = admin.store(topology, stream).await?;
    let (state, _) = state_of(&store, topology).await?;
    if !matches!(state.state, Lifecycle::Inactive | Lifecycle::Killed) {
        bail!(
            "topology {topology:?} is {}: refusing to rewind checkpoints of a running topology; run `squall deactivate {topology}` first",
            lifecycle_name(state.state)
        );
    }
    let position = match target {
        ResetTarget::TrimHorizon => CheckpointPosition::TrimHorizon,
        ResetTarget::Latest => CheckpointPosition::AtTimestamp { millis: now_ms() },
        ResetTarget::At(ms) => CheckpointPosition::AtTimestamp { millis: *ms },
    };
    // Deactivated workers hand their shards back once their in-flight tuples are done.
    let start = Instant::now();
    let n = loop {
        match store.reset_checkpoints(&position).await {
            Ok(n) => break n,
            Err(CoordError::LeasesHeld { .. }) if start.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    outln!(
        "{topology}/{stream}: {n} checkpoint(s) reset to {position}; `squall activate {topology}` replays from there"
    );
    Ok(())
}

/// The stable JSON schema of `squall status --json`.
#[derive(Debug, Serialize)]
pub struct StatusReport {
    /// Topology name.
    pub topology: String,
    /// ACTIVE, INACTIVE, DRAINING, DRAINED or KILLED.
    pub state: String,
    /// The current deployment id.
    pub deployment_id: String,
    /// Live workers.
    pub workers: Vec<WorkerReport>,
    /// Source streams read, with their shards (a topology in stages lists its intermediate
    /// streams in `stages`, not here).
    pub streams: Vec<StreamReport>,
    /// The stages of a topology in stages ([`crate::stage`]), first stage first; empty for a
    /// single-stage topology.
    pub stages: Vec<StageReport>,
}

/// A stage in [`StatusReport`].
#[derive(Debug, Serialize)]
pub struct StageReport {
    /// The stage's name, as live workers report it; null when no live worker runs the stage
    /// (it is known from ZooKeeper only).
    pub name: Option<String>,
    /// The stream the stage reads: the source stream (first stage) or an intermediate stream.
    pub input_stream: String,
    /// True for a later stage, reading an intermediate stream.
    pub intermediate: bool,
    /// Live workers running the stage.
    pub workers: usize,
    /// A later stage's intermediate stream with its shards (the same view as `streams`); null
    /// for the first stage, whose source stream is in `streams`.
    pub stream: Option<StreamReport>,
    /// Live producers writing into the intermediate stream (the previous stage's writer tasks,
    /// from the registry `{topology}/stages/{stream}/producers`); null for the first stage.
    pub producers: Option<usize>,
    /// Largest MillisBehindLatest over the input's shards (null when none reports one).
    pub max_millis_behind_latest: Option<i64>,
    /// Sum of MillisBehindLatest over the input's shards (null when none reports one).
    pub sum_millis_behind_latest: Option<i64>,
    /// How many of the input's shards report a MillisBehindLatest.
    pub shards_with_lag: usize,
    /// Watermark control records the stage's input consumed, summed over live workers.
    pub watermark_records: u64,
    /// Drain markers of this deployment the stage's input consumed, summed over live workers.
    pub drain_markers: u64,
    /// Drain markers of other deployments (ignored), summed over live workers.
    pub stale_drain_markers: u64,
    /// Input records that were not valid stage records (skipped), summed over live workers.
    pub malformed: u64,
}

impl StageReport {
    #[allow(clippy::too_many_arguments)]
    fn new(
        name: Option<String>,
        input_stream: String,
        intermediate: bool,
        stream: Option<StreamReport>,
        producers: Option<usize>,
        (max, sum, with_lag): (Option<i64>, Option<i64>, usize),
        counters: StageRuntime,
        workers: usize,
    ) -> Self {
        Self {
            name,
            input_stream,
            intermediate,
            workers,
            stream,
            producers,
            max_millis_behind_latest: max,
            sum_millis_behind_latest: sum,
            shards_with_lag: with_lag,
            watermark_records: counters.watermark_records,
            drain_markers: counters.drain_markers,
            stale_drain_markers: counters.stale_drain_markers,
            malformed: counters.malformed,
        }
    }
}

/// A live worker in [`StatusReport`].
#[derive(Debug, Serialize)]
pub struct WorkerReport {
    /// Worker id.
    pub worker_id: String,
    /// Host.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Spout task nodes.
    pub tasks: Vec<String>,
    /// Start time, ms since the epoch.
    pub since_ms: i64,
    /// Per-component counters.
    pub components: serde_json::Value,
    /// KPL de-aggregation counters (aggregates, user records, hash-range drops, corrupt).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kpl: Option<crate::coord::KplRuntime>,
    /// Where its Prometheus endpoint can be dialed (`host:port`), when it serves one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_addr: Option<String>,
}

/// A stream in [`StatusReport`].
#[derive(Debug, Serialize)]
pub struct StreamReport {
    /// Stream name.
    pub stream: String,
    /// Why nothing of the stream is read, when the leader refuses it (e.g. it was re-created).
    pub error: Option<String>,
    /// The live spout tasks that read the stream (the leader assigns its shards over them).
    pub tasks: Vec<String>,
    /// Every shard in the stored shard list.
    pub shards: Vec<ShardReport>,
    /// The stream's committed watermark, when its spout tasks publish one
    /// (`committed_watermark_interval_ms` > 0): every record that arrived before it is acked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub committed_watermark: Option<CommittedWatermarkReport>,
}

/// The committed watermark of a stream in [`StatusReport`].
#[derive(Debug, Serialize)]
pub struct CommittedWatermarkReport {
    /// The watermark (ms since the epoch), when every task of the current assignment reported.
    pub watermark_ms: Option<i64>,
    /// Why it is unknown now (which task has not reported for which generation).
    pub unavailable: Option<String>,
}

/// A shard in [`StatusReport`].
#[derive(Debug, Serialize)]
pub struct ShardReport {
    /// Shard id.
    pub shard_id: String,
    /// Parents (0, 1 or 2).
    pub parent_shard_ids: Vec<String>,
    /// `open`, `closed` or `finished`.
    pub state: String,
    /// The task holding its lease (`task-N`), if any.
    pub owner: Option<String>,
    /// The task the leader assigned it to, if any.
    pub assigned_to: Option<String>,
    /// Checkpoint position (`TRIM_HORIZON`, `AT_TIMESTAMP ms`, `AFTER_SEQUENCE seq/sub`).
    pub checkpoint: Option<String>,
    /// Read to its end and fully acked.
    pub finished: bool,
    /// Last MillisBehindLatest its reader saw.
    pub millis_behind_latest: Option<i64>,
    /// Last error reading it (or its malformed checkpoint), with the fix.
    pub error: Option<String>,
    /// False when retrying cannot fix the error (an operator must act).
    pub retryable: bool,
    /// The kind of the last read error (`access_denied`, `kms_key`, `not_found`, ...), or
    /// `malformed_checkpoint`.
    pub error_kind: Option<String>,
    /// Since when (ms since the epoch) the shard has been failing.
    pub error_since_ms: Option<i64>,
    /// GetRecords calls by its current owner.
    pub get_records_calls: u64,
    /// Enhanced fan-out counters of its current owner (null when the shard is polled).
    pub efo: Option<crate::coord::EfoRuntime>,
}

#[cfg(test)]
impl ShardReport {
    /// An open shard with no owner, checkpoint, lag or error: the base of the tests' fixtures.
    pub(crate) fn open_for_test(shard_id: &str) -> Self {
        ShardReport {
            shard_id: shard_id.into(),
            parent_shard_ids: Vec::new(),
            state: "open".into(),
            owner: None,
            assigned_to: None,
            checkpoint: None,
            finished: false,
            millis_behind_latest: None,
            error: None,
            retryable: true,
            error_kind: None,
            error_since_ms: None,
            get_records_calls: 0,
            efo: None,
        }
    }
}

/// Reads one stream's shards (list, owners, assignment, checkpoints) from `store`, with the lag
/// and errors the workers report in `runtime` under `key(shard id)`.
async fn stream_report(
    store: &ZkStore,
    stream: &str,
    runtime: &BTreeMap<String, crate::coord::ShardRuntime>,
    key: impl Fn(&str) -> String,
) -> anyhow::Result<StreamReport> {
    let owners = store.shard_owners().await?;
    // One malformed checkpoint is that shard's error, not the whole report's.
    let cps = store.scan_checkpoints().await?;
    // A broken shard list is the stream's error, not the report's: the leader rewrites it.
    let (list, list_error) = match store.read_shard_list().await {
        Ok(l) => (l.map(|l| l.value.shards).unwrap_or_default(), None),
        Err(e @ CoordError::Malformed { .. }) => {
            let known = cps
                .keys()
                .map(|id| crate::coord::ShardRecord {
                    shard_id: id.clone(),
                    parent_shard_id: None,
                    adjacent_parent_shard_id: None,
                    starting_hash_key: String::new(),
                    ending_hash_key: String::new(),
                    closed: false,
                })
                .collect();
            (known, Some(e.to_string()))
        }
        Err(e) => return Err(e.into()),
    };
    let assignment = store.read_assignment().await.ok().flatten().map(|a| a.value);
    let assigned = assignment.as_ref().map(|a| a.owner_of()).unwrap_or_default();
    let mut shards = Vec::new();
    for sh in list {
        let (cp, cp_error) = match cps.get(&sh.shard_id) {
            Some(Ok(c)) => (Some(&c.value), None),
            Some(Err(e)) => (None, Some(e.to_string())),
            None => (None, None),
        };
        let finished = cp.is_some_and(|c| c.finished);
        let rt = runtime.get(&key(&sh.shard_id));
        shards.push(ShardReport {
            parent_shard_ids: sh.parents().map(str::to_string).collect(),
            state: if finished {
                "finished"
            } else if sh.closed {
                "closed"
            } else {
                "open"
            }
            .into(),
            owner: owners.get(&sh.shard_id).map(|o| o.holder.clone()),
            assigned_to: assigned.get(sh.shard_id.as_str()).map(|t| t.to_string()),
            checkpoint: cp.map(|c| c.position.to_string()),
            finished,
            millis_behind_latest: rt.and_then(|r| r.millis_behind_latest),
            error: cp_error.clone().or_else(|| rt.and_then(|r| r.last_error.clone())),
            retryable: cp_error.is_none() && rt.is_none_or(|r| r.retryable),
            error_kind: if cp_error.is_some() {
                Some("malformed_checkpoint".into())
            } else {
                rt.and_then(|r| r.error_kind.clone())
            },
            error_since_ms: rt.and_then(|r| r.error_since_ms),
            get_records_calls: rt.map_or(0, |r| r.get_records_calls),
            efo: rt.and_then(|r| r.efo.clone()),
            shard_id: sh.shard_id,
        });
    }
    let error = assignment.and_then(|a| a.error).or(list_error);
    let tasks = store.task_names().await?;
    let committed_watermark = store.published_committed_watermark().await?.map(|w| match w {
        Ok(w) => CommittedWatermarkReport { watermark_ms: Some(w), unavailable: None },
        Err(why) => CommittedWatermarkReport { watermark_ms: None, unavailable: Some(why) },
    });
    Ok(StreamReport { stream: stream.to_string(), error, tasks, shards, committed_watermark })
}

/// The stages the live workers report, in stage order, their counters summed over workers
/// (keyed by input stream: a stage is known by the stream it reads).
fn worker_stages(workers: &[WorkerStatus]) -> Vec<(StageRuntime, usize)> {
    // The longest list first (every worker of one deployment runs the same stages), then
    // whatever another deployment's worker runs besides.
    let mut order: Vec<&WorkerStatus> = workers.iter().collect();
    order.sort_by_key(|w| std::cmp::Reverse(w.stages.len()));
    let mut out: Vec<(StageRuntime, usize)> = Vec::new();
    for w in order {
        for st in &w.stages {
            match out.iter_mut().find(|(s, _)| s.input == st.input) {
                Some((s, n)) => {
                    s.watermark_records += st.watermark_records;
                    s.drain_markers += st.drain_markers;
                    s.stale_drain_markers += st.stale_drain_markers;
                    s.malformed += st.malformed;
                    *n += 1;
                }
                None => out.push((st.clone(), 1)),
            }
        }
    }
    out
}

/// A stage's lag: max, sum and count of the MillisBehindLatest its input's shards report.
fn stage_lag(stream: &StreamReport) -> (Option<i64>, Option<i64>, usize) {
    let lags: Vec<i64> = stream.shards.iter().filter_map(|s| s.millis_behind_latest).collect();
    (lags.iter().copied().max(), (!lags.is_empty()).then(|| lags.iter().sum()), lags.len())
}

/// The whole status of `topology`, read from ZooKeeper over two sessions of its own (`squall
/// status`). Callers that read it repeatedly keep a [`StatusReader`] instead.
pub(crate) async fn status_report(cfg: &ZkConfig, topology: &str) -> anyhow::Result<StatusReport> {
    StatusReader::connect(cfg).await?.report(topology).await
}

/// Reads topology statuses over one pair of ZooKeeper sessions (the administration session and the
/// stores' session), opened once: `squall status --watch`, `squall wait-settled` and the web UI
/// read a status every few hundred milliseconds or seconds, and opening sessions for each read
/// would make every read two session creations and two closes, each a write through the
/// ensemble's leader.
pub(crate) struct StatusReader {
    cfg: ZkConfig,
    admin: Admin,
    session: std::sync::Arc<ZkSession>,
}

impl StatusReader {
    /// Opens the two sessions.
    pub(crate) async fn connect(cfg: &ZkConfig) -> anyhow::Result<Self> {
        let admin = admin(cfg).await?;
        let session = ZkSession::connect(cfg).await?;
        Ok(Self { cfg: cfg.clone(), admin, session })
    }

    /// The whole status of `topology`.
    pub(crate) async fn report(&self, topology: &str) -> anyhow::Result<StatusReport> {
        read_status(&self.cfg, &self.admin, &self.session, topology).await
    }

    /// Every topology under the root with its state, sorted by name.
    pub(crate) async fn topologies(&self) -> anyhow::Result<Vec<TopologySummary>> {
        list_topologies(&self.admin).await
    }
}

/// Whether a reader whose read failed with `e` may be kept: a wrong or unknown topology name says
/// nothing of the sessions; any other failure (connection loss, an expired session) drops them.
pub(crate) fn reader_survives(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<CoordError>(),
            Some(CoordError::UnknownTopology { .. } | CoordError::InvalidName { .. })
        )
    })
}

/// Reads one status, reconnecting `reader` first when it is `None` (none yet, or dropped after a
/// failed read so that an expired session is replaced).
pub(crate) async fn report_reusing(
    reader: &mut Option<StatusReader>,
    cfg: &ZkConfig,
    topology: &str,
) -> anyhow::Result<StatusReport> {
    if reader.is_none() {
        *reader = Some(StatusReader::connect(cfg).await?);
    }
    let r = reader.as_ref().expect("connected above").report(topology).await;
    if let Err(e) = &r
        && !reader_survives(e)
    {
        *reader = None;
    }
    r
}

async fn read_status(
    cfg: &ZkConfig,
    admin: &Admin,
    session: &std::sync::Arc<ZkSession>,
    topology: &str,
) -> anyhow::Result<StatusReport> {
    let all_streams = admin.streams(topology).await?;
    let mut report = StatusReport {
        topology: topology.to_string(),
        state: "-".into(),
        deployment_id: String::new(),
        workers: Vec::new(),
        streams: Vec::new(),
        stages: Vec::new(),
    };
    let Some(first) = all_streams.first() else { return Ok(report) };
    // One session for every read.
    let base = ZkStore::open(session.clone(), &cfg.root, topology, first).await?;
    if let Some(st) = base.read_state().await? {
        report.state = lifecycle_name(st.value.state).into();
        report.deployment_id = st.value.deployment_id;
    }
    let workers: Vec<WorkerStatus> = base.workers().await?;
    let mut runtime: BTreeMap<String, crate::coord::ShardRuntime> = BTreeMap::new();
    for w in &workers {
        runtime.extend(w.shards.clone());
    }
    let live_stages = worker_stages(&workers);
    // Intermediate streams: the inputs of later stages the workers report, and those ZooKeeper
    // marks as such (a stage no live worker runs any more, or no worker alive at all).
    let mut intermediate: Vec<String> = live_stages.iter().skip(1).map(|(s, _)| s.input.clone()).collect();
    for s in admin.intermediate_streams(topology).await? {
        if !intermediate.contains(&s) && live_stages.first().is_none_or(|(first, _)| first.input != s) {
            intermediate.push(s);
        }
    }
    let sources: Vec<&String> = all_streams.iter().filter(|s| !intermediate.contains(s)).collect();
    let workers_primary = workers.iter().map(|w| w.stream.clone()).find(|s| !s.is_empty());
    for w in workers {
        report.workers.push(WorkerReport {
            worker_id: w.worker_id,
            host: w.host,
            pid: w.pid,
            tasks: w.tasks,
            since_ms: w.since_ms,
            components: w.components,
            kpl: (w.kpl != crate::coord::KplRuntime::default()).then_some(w.kpl),
            metrics_addr: w.metrics_addr,
        });
    }
    // the workers key their primary stream's shards by id, any other stream's by `{stream}/{id}`
    let primary = workers_primary.unwrap_or_else(|| sources.first().map(|s| s.to_string()).unwrap_or_default());
    for stream in &sources {
        let store = ZkStore::open(session.clone(), &cfg.root, topology, stream).await?;
        let report_stream = if **stream == primary {
            stream_report(&store, stream, &runtime, str::to_string).await?
        } else {
            stream_report(&store, stream, &runtime, |shard| format!("{stream}/{shard}")).await?
        };
        report.streams.push(report_stream);
    }
    if intermediate.is_empty() {
        return Ok(report);
    }
    // The first stage: the one the workers report, else (no live worker) one per source stream.
    let firsts: Vec<(Option<String>, String, Option<StageRuntime>, usize)> = match live_stages.first() {
        Some((s, n)) => vec![(Some(s.name.clone()), s.input.clone(), Some(s.clone()), *n)],
        None => sources.iter().map(|s| (None, s.to_string(), None, 0)).collect(),
    };
    for (name, input, rt, n) in firsts {
        let lag = report.streams.iter().find(|s| s.stream == input).map(stage_lag).unwrap_or_default();
        report.stages.push(StageReport::new(name, input, false, None, None, lag, rt.unwrap_or_default(), n));
    }
    for stream in &intermediate {
        let live = live_stages.iter().find(|(s, _)| &s.input == stream);
        let store = ZkStore::open_stage_input(session.clone(), &cfg.root, topology, stream)
            .await
            .with_context(|| format!("opening the intermediate stream {stream:?} of topology {topology:?}"))?;
        let view = stream_report(&store, stream, &runtime, |shard| format!("{stream}/{shard}"))
            .await
            .with_context(|| format!("reading the intermediate stream {stream:?} of topology {topology:?}"))?;
        let producers = store.producers(stream).await?.len();
        let lag = stage_lag(&view);
        report.stages.push(StageReport::new(
            live.map(|(s, _)| s.name.clone()),
            stream.clone(),
            true,
            Some(view),
            Some(producers),
            lag,
            live.map(|(s, _)| s.clone()).unwrap_or_default(),
            live.map_or(0, |(_, n)| *n),
        ));
    }
    Ok(report)
}

/// What keeps a topology from being settled (empty when it is): ACTIVE, `workers` live workers
/// (when given), and in every stream every unfinished shard assigned to a live task of the
/// stream, with the assignment spread (max - min <= 1 shards per task) and each shard whose
/// parents are finished leased by the task it is assigned to. After a worker is replaced in a
/// rolling deploy, settled means the handoff is over: every shard is read again, by its owner.
pub(super) fn unsettled(r: &StatusReport, workers: Option<usize>) -> Vec<String> {
    let mut why = Vec::new();
    if r.state != "ACTIVE" {
        why.push(format!("the topology is {}, not ACTIVE", r.state));
    }
    if let Some(n) = workers
        && r.workers.len() != n
    {
        why.push(format!("{} of {n} workers are live", r.workers.len()));
    }
    // every live worker's spout tasks registered, and every registered task a live worker's: a
    // worker still starting (its task not registered, or its status not published yet) or
    // stopping is not settled, even when the shards look spread over the other tasks
    let listed: BTreeSet<&str> = r.workers.iter().flat_map(|w| w.tasks.iter().map(String::as_str)).collect();
    for w in r.workers.iter().filter(|w| w.tasks.is_empty()) {
        why.push(format!("worker {} reports no registered spout task yet", w.worker_id));
    }
    let streams = || r.streams.iter().chain(r.stages.iter().filter_map(|st| st.stream.as_ref()));
    let mut registered: BTreeSet<String> = BTreeSet::new();
    for s in streams() {
        for t in &s.tasks {
            // a worker names its primary stream's tasks `task-N`, any other stream's `{stream}/task-N`
            let qualified = format!("{}/{t}", s.stream);
            if !listed.contains(t.as_str()) && !listed.contains(qualified.as_str()) {
                why.push(format!(
                    "stream {} task {t} is registered but no live worker reports it (a worker starting or stopping)",
                    s.stream
                ));
            }
            registered.insert(t.clone());
            registered.insert(qualified);
        }
    }
    for t in listed.iter().filter(|t| !registered.contains(**t)) {
        why.push(format!("task {t} of a live worker is not registered (yet)"));
    }
    for s in streams() {
        if let Some(e) = &s.error {
            why.push(format!("stream {}: {e}", s.stream));
            continue;
        }
        let finished: BTreeSet<&str> =
            s.shards.iter().filter(|sh| sh.finished).map(|sh| sh.shard_id.as_str()).collect();
        let mut per_task: BTreeMap<&str, usize> = s.tasks.iter().map(|t| (t.as_str(), 0)).collect();
        for sh in s.shards.iter().filter(|sh| !sh.finished) {
            let Some(a) = sh.assigned_to.as_deref().filter(|a| per_task.contains_key(a)) else {
                why.push(format!("stream {} shard {}: not assigned to a live task", s.stream, sh.shard_id));
                continue;
            };
            *per_task.entry(a).or_default() += 1;
            let readable = sh.parent_shard_ids.iter().all(|p| finished.contains(p.as_str()));
            if readable && sh.owner.as_deref() != Some(a) {
                why.push(format!(
                    "stream {} shard {}: assigned to {a}, leased by {}",
                    s.stream,
                    sh.shard_id,
                    sh.owner.as_deref().unwrap_or("nobody")
                ));
            }
        }
        let (min, max) = (per_task.values().min().copied(), per_task.values().max().copied());
        if let (Some(min), Some(max)) = (min, max)
            && max - min > 1
        {
            why.push(format!(
                "stream {}: shards per task {min}..{max} (not spread yet over {} tasks)",
                s.stream,
                per_task.len()
            ));
        }
    }
    why
}

/// `squall wait-settled`: polls the status until the topology is settled (see [`unsettled`]) or
/// `timeout` passes (an error naming what is not settled).
pub(super) async fn wait_settled(
    cli: &Cli,
    topology: &str,
    workers: Option<usize>,
    timeout: u64,
) -> anyhow::Result<()> {
    let start = std::time::Instant::now();
    let cfg = zk_config(cli);
    // One pair of sessions for the whole wait, not one per poll.
    let reader = StatusReader::connect(&cfg).await?;
    loop {
        let r = reader.report(topology).await?;
        let why = unsettled(&r, workers);
        if why.is_empty() {
            let shards: usize = r.streams.iter().map(|s| s.shards.iter().filter(|sh| !sh.finished).count()).sum();
            outln!(
                "topology {topology} settled after {:.1} s: {} workers, {shards} unfinished source shards each read by the task it is assigned to",
                start.elapsed().as_secs_f64(),
                r.workers.len()
            );
            return Ok(());
        }
        if start.elapsed() >= Duration::from_secs(timeout) {
            anyhow::bail!(
                "topology {topology} did not settle within {timeout} s: {}{}. Check `squall status {topology}` and the workers' logs",
                why.iter().take(10).cloned().collect::<Vec<_>>().join("; "),
                if why.len() > 10 { format!("; and {} more", why.len() - 10) } else { String::new() }
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

pub(super) async fn status(cli: &Cli, topology: &str, json: bool, watch: Option<u64>) -> anyhow::Result<()> {
    let print = |r: &StatusReport| -> anyhow::Result<()> {
        if json {
            outln!("{}", serde_json::to_string_pretty(r).context("serializing the status")?);
        } else {
            outln!("{}", super::status_text::render(r, crate::coord::now_ms()));
        }
        Ok(())
    };
    let Some(every) = watch else { return print(&status_report(&zk_config(cli), topology).await?) };
    if every == 0 {
        bail!("--watch 0: give the seconds between two statuses (1 or more), e.g. --watch 2");
    }
    use std::io::IsTerminal as _;
    let tty = std::io::stdout().is_terminal();
    let mut first = true;
    // One pair of sessions for the whole watch (replaced after a failed read).
    let cfg = zk_config(cli);
    let mut reader = None;
    loop {
        match report_reusing(&mut reader, &cfg, topology).await {
            Ok(r) => {
                if tty {
                    // redraw: clear the screen, cursor home
                    outln!(
                        "\x1b[2J\x1b[H{}  (every {every} s; Ctrl-C stops)",
                        DateTime::from_millis(crate::coord::now_ms()).fmt(DateTimeFormat::DateTime).unwrap_or_default()
                    );
                } else if !first {
                    outln!();
                }
                print(&r)?;
            }
            // the first answer decides (a wrong topology, no ZooKeeper); later ones may be a
            // passing hiccup: say so and keep watching
            Err(e) if first => return Err(e),
            Err(e) => outln!("status failed ({e:#}); trying again in {every} s"),
        }
        first = false;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = tokio::time::sleep(Duration::from_secs(every)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activate_and_deactivate_refuse_a_draining_topology_and_name_the_fix() {
        let cur = |state| TopologyState { state, deployment_id: "d1".into(), updated_at_ms: 1, kill_wait_ms: None };
        for want in [Lifecycle::Active, Lifecycle::Inactive] {
            let e = to(want, "t")(&cur(Lifecycle::Draining)).unwrap_err().to_string();
            assert!(e.contains("\"t\" is DRAINING (deployment d1)") && e.contains("squall drain t --wait"), "{e}");
            assert_eq!(to(want, "t")(&cur(Lifecycle::Active)).unwrap().state, want);
            assert_eq!(to(want, "t")(&cur(Lifecycle::Inactive)).unwrap().state, want);
        }
    }

    fn settled_report(worker_tasks: &[&[&str]], registered: &[&str], owners: &[&str]) -> StatusReport {
        let shards = owners
            .iter()
            .enumerate()
            .map(|(i, o)| ShardReport {
                owner: Some(o.to_string()),
                assigned_to: Some(o.to_string()),
                ..ShardReport::open_for_test(&format!("shardId-{i:012}"))
            })
            .collect();
        StatusReport {
            topology: "t".into(),
            state: "ACTIVE".into(),
            deployment_id: "d".into(),
            workers: worker_tasks
                .iter()
                .enumerate()
                .map(|(i, tasks)| WorkerReport {
                    worker_id: format!("w{i}"),
                    host: "h".into(),
                    pid: 1,
                    tasks: tasks.iter().map(|t| t.to_string()).collect(),
                    since_ms: 0,
                    components: serde_json::Value::Null,
                    kpl: None,
                    metrics_addr: None,
                })
                .collect(),
            streams: vec![StreamReport {
                stream: "s".into(),
                error: None,
                tasks: registered.iter().map(|t| t.to_string()).collect(),
                shards,
                committed_watermark: None,
            }],
            stages: Vec::new(),
        }
    }

    #[test]
    fn settled_needs_every_worker_task_registered_and_every_shard_leased_by_its_assignee() {
        let spread = ["task-1", "task-2", "task-3", "task-1", "task-2", "task-3"];
        let r = settled_report(&[&["task-1"], &["task-2"], &["task-3"]], &["task-1", "task-2", "task-3"], &spread);
        assert!(unsettled(&r, Some(3)).is_empty(), "{:?}", unsettled(&r, Some(3)));
        // a fourth worker whose task is not registered yet: the shards look spread over the
        // other three, but the deploy step is not over
        let r = settled_report(&[&["task-1"], &["task-2"], &["task-3"], &[]], &["task-1", "task-2", "task-3"], &spread);
        let why = unsettled(&r, Some(4));
        assert!(why.iter().any(|w| w.contains("w3 reports no registered spout task")), "{why:?}");
        // a task still registered by a worker that is stopping
        let r = settled_report(&[&["task-1"], &["task-2"]], &["task-1", "task-2", "task-3"], &spread);
        let why = unsettled(&r, None);
        assert!(why.iter().any(|w| w.contains("task task-3 is registered but no live worker reports it")), "{why:?}");
        // reported but not registered yet, and shards not spread
        let r = settled_report(&[&["task-1"], &["task-4"]], &["task-1"], &["task-1", "task-1"]);
        let why = unsettled(&r, Some(2));
        assert!(why.iter().any(|w| w.contains("task task-4 of a live worker is not registered")), "{why:?}");
    }

    #[test]
    fn reset_targets_parse_and_bad_ones_say_what_works() {
        assert_eq!("trim-horizon".parse::<ResetTarget>().unwrap(), ResetTarget::TrimHorizon);
        assert_eq!("latest".parse::<ResetTarget>().unwrap(), ResetTarget::Latest);
        assert_eq!("1970-01-01T00:00:01Z".parse::<ResetTarget>().unwrap(), ResetTarget::At(1000));
        assert_eq!("1970-01-01T01:00:01+01:00".parse::<ResetTarget>().unwrap(), ResetTarget::At(1000));
        let e = "yesterday".parse::<ResetTarget>().unwrap_err();
        assert!(e.contains("RFC 3339") && e.contains("yesterday"), "{e}");
    }
}
