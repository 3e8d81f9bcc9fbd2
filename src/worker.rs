//! The worker entry point for user binaries: standard flags and environment, a Kinesis spout
//! declared for you, your bolts added by a closure, and a clean stop on SIGINT/SIGTERM.
//!
//! ```no_run
//! use clap::Parser;
//! use squall::topology::{Bolt, BoltOutput, ComponentError, Tuple};
//!
//! struct Print;
//! impl Bolt for Print {
//!     async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
//!         println!("{}", t.get_str("partition_key")?);
//!         Ok(())
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> anyhow::Result<()> {
//!     let args = squall::WorkerArgs::parse();
//!     squall::run(args, |b, spout| {
//!         b.set_bolt("print", 1, |_| Print).shuffle_grouping(spout);
//!     })
//!     .await
//! }
//! ```

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use squall_topology::{TopologyBuilder, TopologyConfig, run_local};

use std::sync::{Arc, Mutex};

use crate::coord::{
    ChangeEvent, CoordError, Health, Lifecycle, ShardRuntime, SharedSession, StageRuntime, TopologyState, WatchOn,
    WorkerStatus, ZkStore, now_ms,
};
use crate::kinesis::KinesisEndpoint;
use crate::sink::{KinesisSink, KinesisSinkConfig};
use crate::spout::{
    InitialPosition, KinesisSpout, KinesisSpoutConfig, SpoutRegistry, SpoutShared, StageInputSpec, StageInputStats,
    WorkerIdentity,
};
use crate::stage::writer::{ProducerRegistrar, StageEncoder, StageWriter};

/// The component id of the Kinesis spout that [`run`] declares.
pub const SPOUT_ID: &str = "kinesis";

/// Standard worker flags; each also reads an environment variable.
#[derive(Debug, Clone, clap::Parser)]
#[command(about = "A Squall worker")]
pub struct WorkerArgs {
    /// Topology name (its state lives in ZooKeeper under {zk-root}/topologies/{topology}).
    #[arg(long, env = "SQUALL_TOPOLOGY")]
    pub topology: String,
    /// Kinesis stream to read; repeat (`--stream a --stream b`, or `SQUALL_STREAM=a,b`) to read
    /// several in one topology: each has its own shard list, assignment, leases and checkpoints,
    /// and tuples say which stream (`stream`). The first is the primary (the lifecycle state and
    /// the worker status live under it).
    #[arg(long = "stream", env = "SQUALL_STREAM", value_delimiter = ',', required = true, num_args = 1)]
    pub stream: Vec<String>,
    /// ZooKeeper connect string.
    #[arg(long, env = "SQUALL_ZK", default_value = "127.0.0.1:2181")]
    pub zk: String,
    /// ZooKeeper root znode.
    #[arg(long, env = "SQUALL_ZK_ROOT", default_value = "/squall")]
    pub zk_root: String,
    /// ZooKeeper session timeout in milliseconds (a crashed worker's shards move after it).
    #[arg(long, env = "SQUALL_ZK_SESSION_TIMEOUT_MS", default_value_t = 10_000)]
    pub zk_session_timeout_ms: u64,
    /// How long the worker tries to reach ZooKeeper, at its start and after its session expired,
    /// before it gives up and exits with an error (non-zero), so that its supervisor restarts it.
    #[arg(long, env = "SQUALL_ZK_GIVE_UP_AFTER_MS", default_value_t = 120_000)]
    pub zk_give_up_after_ms: u64,
    /// ZooKeeper digest-auth user (optional).
    #[arg(long, env = "SQUALL_ZK_USER")]
    pub zk_user: Option<String>,
    /// ZooKeeper digest-auth password (optional; never logged, redacted in Debug).
    #[arg(long, env = "SQUALL_ZK_PASSWORD", hide_env_values = true, value_parser = parse_secret)]
    pub zk_password: Option<crate::coord::Secret>,
    /// Kinesis endpoint URL, or `aws`.
    #[arg(long, env = "SQUALL_KINESIS_ENDPOINT", default_value = crate::kinesis::DEFAULT_ENDPOINT)]
    pub endpoint: String,
    /// AWS region.
    #[arg(long, env = "SQUALL_REGION", default_value = crate::kinesis::DEFAULT_REGION)]
    pub region: String,
    /// Spout tasks in this worker.
    #[arg(long, env = "SQUALL_SPOUT_TASKS", default_value_t = 1)]
    pub spout_tasks: usize,
    /// Initial position at the topology's first start: trim-horizon, latest, at-timestamp:MILLIS.
    #[arg(long, env = "SQUALL_INITIAL_POSITION", default_value = "trim-horizon")]
    pub initial_position: InitialPosition,
    /// Message timeout in milliseconds (a tuple not fully acked by then is failed and replayed).
    #[arg(long, env = "SQUALL_MESSAGE_TIMEOUT_MS", default_value_t = 30_000)]
    pub message_timeout_ms: u64,
    /// Max tracked tuples in flight per spout task.
    #[arg(long, env = "SQUALL_MAX_SPOUT_PENDING", default_value_t = 1000)]
    pub max_spout_pending: usize,
    /// How long an idle spout task sleeps before it asks for tuples again, in microseconds
    /// (Storm's `topology.sleep.spout.wait.strategy.time.ms`): longer costs less CPU when idle
    /// and adds up to that much latency.
    #[arg(long, env = "SQUALL_SPOUT_IDLE_SLEEP_US", default_value_t = 1000)]
    pub spout_idle_sleep_us: u64,
    /// JSON file with further spout settings (a `KinesisSpoutConfig`; flags override names,
    /// endpoints and ZooKeeper settings).
    #[arg(long, env = "SQUALL_SPOUT_CONFIG")]
    pub spout_config: Option<PathBuf>,
    /// Append a JSON-lines read log here (shard, sequences, times) for audits.
    #[arg(long, env = "SQUALL_READ_LOG")]
    pub read_log: Option<String>,
    /// How shards are read: `polling` (GetRecords, the default) or `efo:NAME` (enhanced fan-out
    /// through the stream consumer NAME, registered when missing). Overrides the spout config.
    #[arg(long, env = "SQUALL_CONSUMER")]
    pub consumer: Option<crate::spout::Consumer>,
    /// KPL aggregates holding user records outside the hash range of the shard they were read
    /// from: `deliver` (the default: nothing lost; after a reshard a KPL producer's re-sends are
    /// delivered again) or `drop_aggregate` (the KCL's: dropped whole, counted and logged; LOSES
    /// the records of producers that never re-send, such as aws-kinesis-agg in Lambda).
    /// Overrides the spout config.
    #[arg(long, env = "SQUALL_KPL_OUT_OF_RANGE")]
    pub kpl_out_of_range: Option<crate::spout::KplOutOfRange>,
    /// Serve Prometheus metrics on `GET /metrics` at this address: a port (`9464`, served on
    /// 127.0.0.1) or `IP:PORT` (`0.0.0.0:9464` for every interface). Off unless set. See
    /// docs/metrics.md.
    #[arg(long, env = "SQUALL_METRICS_ADDR", value_parser = crate::metrics::parse_metrics_addr)]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// The host name or IP others (`squall ui`) dial to reach the metrics endpoint; the worker
    /// publishes `HOST:PORT` in its status znode. Default: the `--metrics-addr` IP, or this
    /// host's name when that IP is unspecified (`0.0.0.0`, `::`).
    #[arg(long, env = "SQUALL_METRICS_ADVERTISE", value_parser = crate::metrics::parse_advertise_host)]
    pub metrics_advertise: Option<String>,
}

fn parse_secret(s: &str) -> Result<crate::coord::Secret, std::convert::Infallible> {
    Ok(crate::coord::Secret::new(s))
}

impl WorkerArgs {
    /// The primary (first) stream.
    pub fn primary_stream(&self) -> &str {
        self.stream.first().map_or("", String::as_str)
    }

    /// Checks the stream list: at least one, no repeats.
    pub fn validate_streams(&self) -> anyhow::Result<()> {
        if self.stream.iter().all(|s| s.is_empty()) {
            anyhow::bail!("topology {}: no stream to read; pass --stream NAME (repeat it for several)", self.topology);
        }
        for (i, s) in self.stream.iter().enumerate() {
            if self.stream[..i].contains(s) {
                anyhow::bail!(
                    "topology {}: stream {s:?} is given twice in --stream; list each stream once",
                    self.topology
                );
            }
        }
        Ok(())
    }

    /// The spout configuration of the primary stream (file first, then flags).
    pub fn spout_config(&self) -> anyhow::Result<KinesisSpoutConfig> {
        self.spout_config_for(self.primary_stream())
    }

    /// The spout configuration of `stream` (file first, then flags).
    pub fn spout_config_for(&self, stream: &str) -> anyhow::Result<KinesisSpoutConfig> {
        let mut cfg = match &self.spout_config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading the spout configuration {}", path.display()))?;
                let mut v: serde_json::Value = serde_json::from_str(&text)
                    .with_context(|| format!("parsing the spout configuration {}", path.display()))?;
                if let Some(o) = v.as_object_mut() {
                    o.entry("topology").or_insert_with(|| self.topology.clone().into());
                    o.insert("stream".into(), stream.into());
                }
                serde_json::from_value::<KinesisSpoutConfig>(v)
                    .with_context(|| format!("invalid spout configuration in {}", path.display()))?
            }
            None => KinesisSpoutConfig::new(self.topology.clone(), stream.to_string()),
        };
        cfg.topology = self.topology.clone();
        cfg.stream = stream.to_string();
        cfg.kinesis = KinesisEndpoint::new(self.endpoint.clone(), self.region.clone());
        cfg.initial_position = self.initial_position;
        cfg.zookeeper.connect = self.zk.clone();
        cfg.zookeeper.root = self.zk_root.clone();
        cfg.zookeeper.session_timeout_ms = self.zk_session_timeout_ms;
        cfg.zookeeper.auth_user = self.zk_user.clone();
        cfg.zookeeper.auth_password = self.zk_password.as_ref().map(|p| p.expose().to_string());
        if self.read_log.is_some() {
            cfg.read_log = self.read_log.clone();
        }
        if let Some(c) = &self.consumer {
            cfg.consumer = c.clone();
        }
        if let Some(k) = self.kpl_out_of_range {
            cfg.kpl_out_of_range = k;
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// The engine configuration these flags describe.
    pub fn topology_config(&self) -> anyhow::Result<TopologyConfig> {
        let cfg = TopologyConfig {
            message_timeout_ms: self.message_timeout_ms,
            max_spout_pending: self.max_spout_pending,
            idle_sleep_us: self.spout_idle_sleep_us,
            ..TopologyConfig::default()
        };
        cfg.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(cfg)
    }
}

/// Runs a worker: declares the Kinesis spout as [`SPOUT_ID`] with `--spout-tasks` tasks, lets
/// `build` add bolts (it gets the builder and the spout's id), starts the topology and obeys the
/// topology's lifecycle state in ZooKeeper (`squall activate|deactivate|rebalance|kill`) until
/// SIGINT, SIGTERM or a kill. Then it stops like Storm's kill: deactivates the spouts, waits up to
/// the message timeout (or the kill's `--wait`) for in-flight tuples, writes final checkpoints,
/// releases its shards and returns `Ok` (exit code 0). A task failure (e.g. ZooKeeper
/// unreachable) returns the error.
///
/// A worker that starts while the topology is new, KILLED or DRAINED starts a new deployment:
/// state ACTIVE with a fresh deployment id. One that starts while it is INACTIVE starts
/// deactivated. One that starts while it is DRAINING waits for the drain to end, then deploys
/// anew (it marks the drain DRAINED itself once no worker of the deployment is left for 2 s).
pub async fn run<F>(args: WorkerArgs, build: F) -> anyhow::Result<()>
where
    F: FnOnce(&mut TopologyBuilder, &str),
{
    run_stages(args, crate::stage::Stages::new("main", build)).await
}

/// [`run`] for a topology in stages ([`crate::stage`]): every stage runs in this worker, each
/// reading its input through the ZooKeeper-coordinated Kinesis spout (the source stream for the
/// first, an intermediate stream for the others), and the lifecycle applies to all of them.
/// Intermediate streams missing at start are created with their boundary's shard count.
///
/// A drain stops the first stage's spouts; each later stage keeps reading its input until
/// every upstream producer's drain marker (of this deployment) was read from every shard, then
/// drains in turn; the worker is drained when every stage is.
pub async fn run_stages(args: WorkerArgs, stages: crate::stage::Stages<'_>) -> anyhow::Result<()> {
    run_stages_until(args, stages, std::future::pending()).await
}

/// [`run_stages`] in a process that has a shutdown of its own (a service embedding the worker,
/// a supervisor in the same process): when `shutdown` completes the worker stops as on SIGTERM
/// (deactivates, waits for in-flight tuples up to the message timeout, writes final checkpoints,
/// releases its shards, closes its session) and returns `Ok`. SIGINT and SIGTERM still stop it.
pub async fn run_stages_until(
    args: WorkerArgs,
    stages: crate::stage::Stages<'_>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut shutdown = std::pin::pin!(shutdown);
    crate::logging::init();
    let clock_offset = crate::coord::clock_offset_ms().map_err(|e| anyhow::anyhow!("{e}"))?;
    if clock_offset != 0 {
        tracing::warn!(
            offset_ms = clock_offset,
            "{}: this worker's wall clock is shifted by {clock_offset} ms (fault injection for tests)",
            crate::coord::CLOCK_OFFSET_ENV
        );
    }
    args.validate_streams()?;
    let spout_cfg = args.spout_config()?;
    // every stream's configuration is checked before anything connects
    for stream in args.stream.iter().skip(1) {
        args.spout_config_for(stream)?;
    }
    let mut topo_cfg = args.topology_config()?;
    for b in stages.boundaries() {
        b.validate(&args.topology).map_err(|e| anyhow::anyhow!("topology {}: {e}", args.topology))?;
    }
    let zk = spout_cfg.zookeeper.to_zk_config();
    let identity = WorkerIdentity::current();
    let since = now_ms();
    // The metrics endpoint listens before anything connects: a busy address fails at once.
    let metrics = Arc::new(crate::metrics::WorkerSource::new(args.topology.clone()));
    let metrics_server = match args.metrics_addr {
        Some(addr) => Some(crate::metrics::MetricsServer::start(addr, metrics.clone()).await?),
        None => None,
    };
    let metrics_addr = metrics_server
        .as_ref()
        .map(|m| crate::metrics::advertised_addr(m.local_addr(), args.metrics_advertise.as_deref(), &identity.host));

    // One ZooKeeper session for the whole worker: its lifecycle loop and every spout task.
    let session = SharedSession::connect(&zk, Duration::from_millis(args.zk_give_up_after_ms))
        .await
        .map_err(|e| anyhow::anyhow!("worker of topology {}: {e}", args.topology))?;
    // After an expiry, the worker re-reads its lifecycle state before its tasks use the new
    // session (see the new-generation arm of the loop below).
    session.hold_new_sessions();
    metrics.set_session(session.clone());
    // Followed from here on: a session that expires while the worker starts is replaced before
    // the lifecycle loop runs, and the loop sees the replacement.
    let mut sessions = session.subscribe();
    let (mut store, mut generation, state) = open_lifecycle(&mut sessions, &args).await?;
    session.admit(generation);
    tracing::info!(topology = %args.topology, state = ?state.state, deployment = %state.deployment_id, "deployment");
    topo_cfg.start_active = state.state != Lifecycle::Inactive;
    let deployment = state.deployment_id.clone();

    let engines = Engines::start(&args, stages, spout_cfg, &topo_cfg, &identity, &session, &deployment).await?;
    metrics.set_stages(engines.metrics_sources());
    tracing::info!(topology = %args.topology, streams = %args.stream.join(","), spout_tasks = args.spout_tasks,
        stages = engines.stages.len(), "worker started");

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let mut events = loop {
        match watch_lifecycle(&store).await {
            Ok(events) => break Some(events),
            // The session expired after the deployment was read: the loop below watches again on
            // the next one (its new-generation arm), as after any expiry.
            Err(e) if e.is_session_lost() => {
                tracing::warn!(error = %e, "the worker's ZooKeeper session was lost while it started; waiting for the new one");
                break None;
            }
            // ZooKeeper away longer than the watch's short retries (a partition while the worker
            // starts, found by the simulator, seed 5791): try again on the same session until it
            // is replaced (the loop below watches on the new one) or gives up. The session
            // channel is only looked at, not marked seen: the loop's session arm must see a change.
            Err(e) if e.is_transient() => {
                {
                    let view = sessions.borrow();
                    if let Health::Failed(msg) = &view.health {
                        anyhow::bail!("worker of topology {}: {msg}", args.topology);
                    }
                    if view.generation != generation {
                        break None;
                    }
                }
                tracing::warn!(error = %e, "ZooKeeper did not answer while the worker armed its lifecycle watch; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => anyhow::bail!("worker of topology {}: {e}", args.topology),
        }
    };
    let mut publish = tokio::time::interval(Duration::from_secs(2));
    publish.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut published: Option<(WorkerStatus, tokio::time::Instant)> = None;
    let mut last_state = state.state;
    let mut wait = Duration::from_millis(args.message_timeout_ms);
    let status = |engines: &Engines| worker_status(&identity, since, engines, metrics_addr.clone());
    let mut draining = false;
    let mut failure: Option<String> = None;
    // The deployment drained while this worker had no session: it leaves without handing on
    // anything it held (see the new-generation arm).
    let mut abandon = false;
    // What this worker obeys is read again now that it is watched: a state written between the
    // first read (the deployment above) and the watch's arming raises no event.
    let mut reread = Reread::default();
    check_drain(&store, &engines, &deployment, &mut draining, &mut reread).await;
    let mut stop_at_once =
        obey_state(&store, &engines, &deployment, draining, &mut last_state, &mut wait, &mut reread).await;
    let stop_reason = loop {
        if let Some(reason) = stop_at_once.take() {
            break reason;
        }
        tokio::select! {
            r = engines.wait() => {
                if draining && r.is_ok() {
                    finish_drain(&store, &identity.worker_id, &deployment).await;
                    engines.stop_followers().await;
                    drop(events);
                    drop(store);
                    session.close().await;
                    tracing::info!(topology = %args.topology, "drained: every in-flight tuple acked, checkpoints written; worker stopped");
                    return Ok(());
                }
                engines.stop_followers().await;
                return r.map_err(|e| anyhow::anyhow!("topology {} stopped: {e}", args.topology));
            }
            _ = tokio::signal::ctrl_c() => break "SIGINT",
            _ = term.recv() => break "SIGTERM",
            _ = &mut shutdown => break "shutdown requested",
            _ = publish.tick() => {
                // Publish when something changed, and at least every 30 s: an idle worker costs
                // ZooKeeper almost nothing.
                let now = status(&engines);
                let due = published.as_ref().is_none_or(|(prev, at)| {
                    at.elapsed() >= Duration::from_secs(30) || !same_status(prev, &now)
                });
                if due {
                    match store.publish_worker(&now).await {
                        Ok(()) => published = Some((now, tokio::time::Instant::now())),
                        Err(e) => tracing::debug!(error = %e, "publishing the worker status failed"),
                    }
                }
            }
            r = sessions.changed() => {
                if r.is_err() { break "ZooKeeper session closed"; }
                let v = sessions.borrow_and_update().clone();
                if let Health::Failed(msg) = &v.health {
                    failure = Some(msg.clone());
                    break "ZooKeeper unreachable";
                }
                if v.generation != generation
                    && let Some(s) = v.session.clone() {
                        // A new session after expiry: watch again and re-read what we obey.
                        match reopen_retrying(s, &args).await {
                            Ok((s, ev)) => {
                                store = s;
                                events = Some(ev);
                                generation = v.generation;
                                published = None;
                                // Every lease, registration and producer of this worker went with
                                // the old session; its tasks wait (held) until it is known what
                                // the topology became meanwhile.
                                if !draining && drain_requested(&store, &deployment).await {
                                    // The deployment drains (or drained) without this worker: the
                                    // others took no shard of it (a drain acquires nothing), and
                                    // everything it still holds belongs to leases it lost; what
                                    // it read but did not checkpoint, the next deployment reads
                                    // again. Draining here would hand on that stale state (its
                                    // windows flushed, its writers' records and markers put after
                                    // the others drained), and reading would take shards.
                                    abandon = true;
                                    break "the deployment drained while this worker's ZooKeeper session was lost";
                                }
                                if let Some(reason) = obey_state(
                                    &store, &engines, &deployment, draining, &mut last_state, &mut wait, &mut reread,
                                )
                                .await
                                {
                                    break reason;
                                }
                                session.admit(generation);
                                engines.register_producers_again().await;
                                check_drain(&store, &engines, &deployment, &mut draining, &mut reread).await;
                            }
                            Err(e) => {
                                // Not left held for good: the tasks go on as they did before
                                // the hold (their own ZooKeeper calls fail the same way now).
                                tracing::warn!(error = %e, "watching the topology state on the new session failed; \
                                    the tasks use it without the lifecycle check, retried at the next session change");
                                session.admit(v.generation);
                            }
                        }
                    }
            }
            // A read of the state or the drain notification failed (its answer lost): read both
            // again, or the change its event announced would wait for the next change.
            _ = tokio::time::sleep_until(reread.at.unwrap_or_else(tokio::time::Instant::now)), if reread.at.is_some() => {
                reread.at = None;
                check_drain(&store, &engines, &deployment, &mut draining, &mut reread).await;
                if let Some(reason) =
                    obey_state(&store, &engines, &deployment, draining, &mut last_state, &mut wait, &mut reread).await
                {
                    break reason;
                }
                if reread.at.is_none() {
                    reread.failures = 0;
                }
            }
            ev = recv_opt(&mut events) => match ev {
                Some(ChangeEvent::Drain) => check_drain(&store, &engines, &deployment, &mut draining, &mut reread).await,
                Some(ChangeEvent::State) | Some(ChangeEvent::Reconnected) => {
                    check_drain(&store, &engines, &deployment, &mut draining, &mut reread).await;
                    if let Some(reason) =
                        obey_state(&store, &engines, &deployment, draining, &mut last_state, &mut wait, &mut reread).await
                    {
                        break reason;
                    }
                }
                Some(ChangeEvent::SessionLost) | None => {
                    tracing::warn!("the worker's ZooKeeper session was lost; waiting for the new one");
                    // Parked until the session monitor publishes the next generation.
                    events = None;
                }
                Some(_) => {}
            },
        }
    };
    if abandon {
        tracing::warn!(topology = %args.topology, deployment = %deployment,
            "{stop_reason}: leaving without handing anything on (no shard taken, nothing flushed or put); what \
             this worker read and did not checkpoint is read again by the next deployment");
        let stopped = engines.kill(Duration::ZERO).await;
        finish_drain(&store, &identity.worker_id, &deployment).await;
        drop(events);
        drop(store);
        session.close().await;
        stopped.map_err(|e| anyhow::anyhow!("stopping topology {}: {e}", args.topology))?;
        tracing::info!(topology = %args.topology, "worker left its drained deployment");
        return Ok(());
    }
    tracing::info!(reason = stop_reason, ?wait, "stopping: deactivating, waiting for in-flight tuples");
    let stopped = engines.kill(wait).await;
    drop(events);
    drop(store);
    session.close().await;
    if let Some(msg) = failure {
        anyhow::bail!("worker of topology {} stopped: {msg}", args.topology);
    }
    stopped.map_err(|e| anyhow::anyhow!("stopping topology {}: {e}", args.topology))?;
    tracing::info!(topology = %args.topology, "worker stopped");
    Ok(())
}

/// The stage-input counters of each input task of a stage.
type InputStats = Arc<Mutex<Vec<Arc<StageInputStats>>>>;

/// One running stage of this worker.
struct StageRun {
    name: String,
    /// The component id of the stage's Kinesis spout.
    spout: String,
    /// The stream the stage reads (the source stream, or an intermediate stream).
    input: String,
    running: squall_topology::RunningTopology,
    registry: SpoutRegistry,
    /// Stage-input counters of each input task (later stages).
    input_stats: InputStats,
    /// Registrar of the producers writing this stage's output boundary, if any.
    registrar: Option<ProducerRegistrar>,
}

/// Every stage this worker runs, and what connects them.
struct Engines {
    stages: Vec<StageRun>,
    /// Tells later stages' inputs that the topology drains.
    drain: tokio::sync::watch::Sender<bool>,
    followers: tokio_util::sync::CancellationToken,
    /// The producer-registry followers (they hold the session while they watch).
    follower_tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Engines {
    #[allow(clippy::too_many_arguments)]
    async fn start(
        args: &WorkerArgs,
        stages: crate::stage::Stages<'_>,
        spout_cfg: KinesisSpoutConfig,
        topo_cfg: &TopologyConfig,
        identity: &WorkerIdentity,
        session: &Arc<SharedSession>,
        deployment: &str,
    ) -> anyhow::Result<Engines> {
        let (drain, _) = tokio::sync::watch::channel(false);
        let followers = tokio_util::sync::CancellationToken::new();
        let mut follower_tasks = Vec::new();
        if !stages.rest.is_empty() {
            ensure_intermediate_streams(args, &stages, &spout_cfg).await?;
        }
        // builders first: a stage's output writer is added once the next boundary is known
        // (name, input stream, builder, registry, input stats, the registrar of its output boundary)
        #[allow(clippy::type_complexity)]
        let mut built: Vec<(
            String,
            String,
            String,
            TopologyBuilder,
            SpoutRegistry,
            InputStats,
            Option<ProducerRegistrar>,
        )> = Vec::new();
        let (first_name, first_build) = stages.first;
        let registry = SpoutRegistry::default();
        let mut builder = TopologyBuilder::new(args.topology.clone());
        // one spout component over every source stream, `--spout-tasks` tasks per stream
        let mut cfgs = vec![spout_cfg.clone()];
        for stream in args.stream.iter().skip(1) {
            // its tasks register under the stream: its shards are assigned over them alone
            cfgs.push(KinesisSpoutConfig { stream_tasks: true, ..args.spout_config_for(stream)? });
        }
        KinesisSpout::declare_streams(
            &mut builder,
            SPOUT_ID,
            args.spout_tasks,
            cfgs,
            identity.clone(),
            registry.clone(),
            session.clone(),
        );
        first_build(&mut builder, SPOUT_ID);
        built.push((
            first_name,
            SPOUT_ID.to_string(),
            args.primary_stream().to_string(),
            builder,
            registry,
            Arc::default(),
            None,
        ));
        for (boundary, name, build) in stages.rest {
            let stream = boundary.stream_name(&args.topology);
            // the writer, in the previous stage
            let registrar = ProducerRegistrar::new(session.clone(), &args.zk_root, &args.topology, &stream, deployment);
            let prev = built.last_mut().expect("the first stage is built");
            let sink_cfg = KinesisSinkConfig {
                abort_after_puts: boundary.abort_after_puts,
                ..KinesisSinkConfig::new(stream.clone(), spout_cfg.kinesis.clone())
            };
            sink_cfg.validate().map_err(|e| anyhow::anyhow!("boundary {}: {e}", boundary.name))?;
            let (key, dep, reg) = (boundary.key.clone(), deployment.to_string(), registrar.clone());
            let interval = Duration::from_millis(boundary.watermark_interval_ms);
            prev.6 = Some(registrar);
            prev.3
                .set_bolt(&boundary.writer_id(), boundary.writers, move |_| {
                    let producer = crate::random::u64();
                    let encoder = StageEncoder::new(producer, dep.clone(), key.clone(), interval);
                    StageWriter::new(KinesisSink::new(sink_cfg.clone(), encoder), producer, reg.clone())
                })
                .fields_grouping_from(
                    &boundary.from,
                    &boundary.stream,
                    &boundary.key.iter().map(String::as_str).collect::<Vec<_>>(),
                );
            // the stage reading it
            let (producers, follower) = crate::stage::registry::follow_producers(
                session,
                args.zk_root.clone(),
                args.topology.clone(),
                stream.clone(),
                followers.clone(),
            );
            follower_tasks.push(follower);
            let spec = StageInputSpec {
                fields: boundary.fields.clone(),
                record_ids: boundary.exactly_once,
                deployment: deployment.to_string(),
                producers,
                drain: drain.subscribe(),
            };
            let cfg = KinesisSpoutConfig {
                stream: stream.clone(),
                stage_input: true,
                // everything written into an intermediate stream is read, whatever the source's
                // initial position
                initial_position: InitialPosition::TrimHorizon,
                read_log: None,
                ..spout_cfg.clone()
            };
            let registry = SpoutRegistry::default();
            let stats: InputStats = Arc::default();
            let mut builder = TopologyBuilder::new(format!("{}.{name}", args.topology));
            let input_id = boundary.input_id();
            KinesisSpout::declare_stage_input(
                &mut builder,
                &input_id,
                args.spout_tasks,
                cfg,
                identity.clone(),
                registry.clone(),
                SpoutShared::with_session(session.clone()),
                spec,
                stats.clone(),
            );
            build(&mut builder, &input_id);
            built.push((name, input_id, stream, builder, registry, stats, None));
        }
        let mut out = Vec::new();
        for (name, spout, input, builder, registry, input_stats, registrar) in built {
            let topology = builder.build().map_err(|e| anyhow::anyhow!("stage {name}: {e}"))?;
            let running = run_local(topology, topo_cfg.clone()).map_err(|e| anyhow::anyhow!("stage {name}: {e}"))?;
            out.push(StageRun { name, spout, input, running, registry, input_stats, registrar });
        }
        Ok(Engines { stages: out, drain, followers, follower_tasks: std::sync::Mutex::new(follower_tasks) })
    }

    /// What the metrics endpoint reads of each stage.
    fn metrics_sources(&self) -> Vec<crate::metrics::StageSource> {
        self.stages
            .iter()
            .map(|s| crate::metrics::StageSource {
                topology: s.running.name().to_string(),
                spout: s.spout.clone(),
                spouts: s.registry.clone(),
                engine: s.running.metrics_handle(),
            })
            .collect()
    }

    /// Returns when every stage finished, or at once when one failed (its error).
    async fn wait(&self) -> Result<(), squall_topology::TopologyError> {
        use futures::StreamExt;
        let mut waits: futures::stream::FuturesUnordered<_> = self.stages.iter().map(|s| s.running.wait()).collect();
        while let Some(r) = waits.next().await {
            r?;
        }
        Ok(())
    }

    async fn activate(&self) {
        for s in &self.stages {
            let _ = s.running.activate().await;
        }
    }

    async fn deactivate(&self) {
        for s in &self.stages {
            let _ = s.running.deactivate().await;
        }
    }

    /// Drains the first stage (its spouts stop reading); later stages drain once their inputs
    /// saw every upstream producer's drain marker. A drain finishes what is in flight, so the
    /// later stages read on even when the topology was deactivated before it: they are activated
    /// (a deactivated deployment's intermediate streams are otherwise never read to the drain
    /// markers, and it stays DRAINING for good, which no `activate` may end).
    async fn drain(&self) -> Result<(), squall_topology::TopologyError> {
        self.drain.send_replace(true);
        for s in self.stages.iter().skip(1) {
            let _ = s.running.activate().await;
        }
        self.stages[0].running.drain().await
    }

    async fn kill(self, wait: Duration) -> Result<(), squall_topology::TopologyError> {
        self.stop_followers().await;
        // every stage stops at once (each waits for its own in-flight tuples)
        let kills: Vec<_> = self.stages.into_iter().map(|s| tokio::spawn(s.running.kill(wait))).collect();
        let mut result = Ok(());
        for k in kills {
            match k.await {
                Ok(Err(e)) if result.is_ok() => result = Err(e),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "stopping a stage panicked"),
            }
        }
        result
    }

    /// Stops the producer-registry followers and waits for them, so that closing the session
    /// right after really closes it (its ephemeral znodes go at once).
    async fn stop_followers(&self) {
        self.followers.cancel();
        let tasks = std::mem::take(&mut *lock(&self.follower_tasks));
        for t in tasks {
            let _ = t.await;
        }
    }

    async fn register_producers_again(&self) {
        for r in self.stages.iter().filter_map(|s| s.registrar.as_ref()) {
            if let Err(e) = r.register_all().await {
                tracing::warn!(error = %e, "registering the boundary writers again on the new session failed");
            }
        }
    }
}

/// Creates the intermediate streams that do not exist yet (another worker may create one at the
/// same moment: that is fine). Each call is tried again (5 times, 100 ms to 2 s apart) while its
/// error is retryable (throttling, a lost connection or answer): a worker does not fail its start
/// on one refused call.
async fn ensure_intermediate_streams(
    args: &WorkerArgs,
    stages: &crate::stage::Stages<'_>,
    cfg: &KinesisSpoutConfig,
) -> anyhow::Result<()> {
    use crate::kinesis::KinesisError;
    use backon::Retryable as _;
    enum Api {
        /// A registered model of Kinesis (`sim://api/NAME`, the simulator's).
        Model(Arc<dyn crate::spout::ShardApi>),
        Sdk(aws_sdk_kinesis::Client, String),
    }
    let api = match crate::spout::registered_api(&cfg.kinesis.endpoint) {
        Some(api) => Api::Model(api?),
        None => Api::Sdk(cfg.kinesis.client().await?, cfg.kinesis.label()),
    };
    let backoff = crate::coord::session::short_backoff;
    for b in stages.boundaries() {
        let stream = b.stream_name(&args.topology);
        let exists = || async {
            let r = match &api {
                Api::Model(api) => api.list_shards(&stream).await.map(|_| ()),
                Api::Sdk(client, endpoint) => {
                    crate::kinesis::describe_stream(client, endpoint, &stream).await.map(|_| ())
                }
            };
            match r {
                Ok(()) => Ok(true),
                Err(KinesisError::StreamNotFound { .. }) => Ok(false),
                Err(e) => Err(e),
            }
        };
        let known = exists
            .retry(backoff())
            .when(KinesisError::is_retryable)
            .await
            .map_err(|e| anyhow::anyhow!("intermediate stream {stream} of boundary {}: {e}", b.name))?;
        if known {
            continue;
        }
        tracing::info!(stream = %stream, shards = b.shards, boundary = %b.name, "creating the intermediate stream");
        let create = || async {
            match &api {
                Api::Model(api) => api.create_stream(&stream, b.shards).await,
                Api::Sdk(client, endpoint) => crate::kinesis::create_stream(client, endpoint, &stream, b.shards).await,
            }
        };
        if let Err(e) = create.retry(backoff()).when(KinesisError::is_retryable).await {
            // created by another worker meanwhile?
            let there = match &api {
                Api::Model(_) => exists.retry(backoff()).when(KinesisError::is_retryable).await.unwrap_or(false),
                Api::Sdk(client, endpoint) => {
                    crate::kinesis::wait_active(client, endpoint, &stream, Duration::from_secs(60)).await.is_ok()
                }
            };
            if !there {
                anyhow::bail!("creating intermediate stream {stream}: {e}");
            }
        }
    }
    Ok(())
}

async fn recv_opt(rx: &mut Option<tokio::sync::mpsc::Receiver<ChangeEvent>>) -> Option<ChangeEvent> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Opens the worker's store on the current session and settles the deployment: the store, the
/// session generation it is on, and the lifecycle state. A session that expires meanwhile (a
/// worker paused while it started) is not an error: the next generation is used, as the lifecycle
/// loop does after any expiry. `sessions` is marked seen up to the generation returned.
async fn open_lifecycle(
    sessions: &mut tokio::sync::watch::Receiver<crate::coord::SessionView>,
    args: &WorkerArgs,
) -> anyhow::Result<(ZkStore, u64, TopologyState)> {
    let topology = &args.topology;
    loop {
        let view = sessions.borrow_and_update().clone();
        if let Health::Failed(msg) = &view.health {
            anyhow::bail!("worker of topology {topology}: {msg}");
        }
        if let Some(s) = view.session {
            let opened = async {
                let store = ZkStore::open(s, &args.zk_root, topology, args.primary_stream()).await?;
                let state = loop {
                    let state = ensure_deployment(&store).await?;
                    if state.state != Lifecycle::Draining {
                        break state;
                    }
                    wait_out_drain(&store, topology, &state.deployment_id).await?;
                };
                anyhow::Ok((store, state))
            }
            .await;
            match opened {
                Ok((store, state)) => return Ok((store, view.generation, state)),
                Err(e) if e.downcast_ref::<CoordError>().is_some_and(CoordError::is_session_lost) => {
                    tracing::warn!(error = %e, generation = view.generation,
                        "the worker's ZooKeeper session was lost while it started; waiting for the new one");
                }
                // ZooKeeper away longer than the short retries of each step (a partition while
                // the worker starts): try again on the same session, or the next one, until the
                // session gives up (`--zk-give-up-after-ms`, Health::Failed above)
                Err(e) if e.downcast_ref::<CoordError>().is_some_and(CoordError::is_transient) => {
                    tracing::warn!(error = %e, generation = view.generation,
                        "ZooKeeper did not answer while the worker started; trying again");
                    tokio::select! {
                        r = sessions.changed() => if r.is_err() {
                            anyhow::bail!("worker of topology {topology}: its ZooKeeper session was closed while it started");
                        },
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                    continue;
                }
                Err(e) => anyhow::bail!("worker of topology {topology}: {e}"),
            }
        }
        if sessions.changed().await.is_err() {
            anyhow::bail!("worker of topology {topology}: its ZooKeeper session was closed while it started");
        }
    }
}

/// Watches the lifecycle state and the drain node; a lost answer is retried (5 tries, 100 ms to
/// 2 s apart), so one lost request does not stop a worker's start.
async fn watch_lifecycle(store: &ZkStore) -> Result<tokio::sync::mpsc::Receiver<ChangeEvent>, CoordError> {
    use backon::Retryable as _;
    (|| store.watch(&[WatchOn::State, WatchOn::Drain]))
        .retry(crate::coord::session::short_backoff())
        .when(CoordError::is_transient)
        .await
}

async fn reopen(
    session: std::sync::Arc<crate::coord::ZkSession>,
    args: &WorkerArgs,
) -> Result<(ZkStore, tokio::sync::mpsc::Receiver<ChangeEvent>), CoordError> {
    let store = ZkStore::open(session, &args.zk_root, &args.topology, args.primary_stream()).await?;
    let events = store.watch(&[WatchOn::State, WatchOn::Drain]).await?;
    Ok((store, events))
}

/// [`reopen`], tried 5 times 500 ms apart.
async fn reopen_retrying(
    session: std::sync::Arc<crate::coord::ZkSession>,
    args: &WorkerArgs,
) -> Result<(ZkStore, tokio::sync::mpsc::Receiver<ChangeEvent>), CoordError> {
    let mut attempt = 1;
    loop {
        match reopen(session.clone(), args).await {
            Err(e) if attempt < 5 => {
                tracing::debug!(error = %e, attempt, "watching the topology state on the new session failed; retrying");
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            r => return r,
        }
    }
}

/// Reads the lifecycle state and obeys it. Returns why to stop, if it says to.
///
/// A worker that drains ignores ACTIVE and INACTIVE: a drain runs to its end (the CLI refuses
/// both over DRAINING, but `squall drain` writes its notification before the state, so a
/// `deactivate` can land between the two). Deactivating would stop the later stages, which a
/// drain needs reading until every drain marker arrived: the worker would never drain, and the
/// deployment never be DRAINED (simulator seed 195).
async fn obey_state(
    store: &ZkStore,
    running: &Engines,
    deployment: &str,
    draining: bool,
    last_state: &mut Lifecycle,
    wait: &mut Duration,
    reread: &mut Reread,
) -> Option<&'static str> {
    let st = match store.read_state().await {
        Ok(Some(st)) => st.value,
        Ok(None) => return None,
        Err(e) => {
            reread.failed("the topology state", &e);
            return None;
        }
    };
    if st.deployment_id != deployment {
        tracing::info!(deployment = %st.deployment_id, "a new deployment started; this worker leaves");
        return Some("a new deployment");
    }
    if st.state == *last_state {
        return None;
    }
    tracing::info!(from = ?last_state, to = ?st.state, "topology state changed");
    *last_state = st.state;
    if draining && matches!(st.state, Lifecycle::Active | Lifecycle::Inactive) {
        tracing::warn!(state = ?st.state, deployment,
            "this worker drains: the drain runs to its end, the state is not obeyed (it was written over the drain)");
        return None;
    }
    match st.state {
        Lifecycle::Active => running.activate().await,
        Lifecycle::Inactive => running.deactivate().await,
        Lifecycle::Killed => {
            if let Some(ms) = st.kill_wait_ms {
                *wait = Duration::from_millis(ms);
            }
            return Some("squall kill");
        }
        Lifecycle::Draining | Lifecycle::Drained => {}
    }
    None
}

/// Equal but for the time of the snapshot.
/// Whether `b` says nothing new over `a`: the counters an idle worker moves (its polls of idle
/// shards, the empty events of its subscriptions) do not count, or an idle worker would publish
/// at every tick (2 s) instead of every 30 s.
fn same_status(a: &WorkerStatus, b: &WorkerStatus) -> bool {
    let idle_counters = |s: &WorkerStatus| {
        let mut s = s.clone();
        s.updated_at_ms = 0;
        for sh in s.shards.values_mut() {
            sh.get_records_calls = 0;
            if let Some(e) = sh.efo.as_mut() {
                e.events = 0;
            }
        }
        s
    };
    idle_counters(a) == idle_counters(b)
}

/// A read of what a worker obeys (its lifecycle state, the drain notification) that failed:
/// when to read both again. The watch that announced a change fired once; without a second read
/// the worker would keep the old state until the next change (simulator seed 2815: an activation
/// whose read was lost left a worker inactive, its window firer holding a third of the timers).
#[derive(Debug, Default)]
struct Reread {
    at: Option<tokio::time::Instant>,
    failures: u32,
}

impl Reread {
    /// Notes a failed read of `what`: read again after 200 ms, doubling with each failure in a
    /// row up to 5 s.
    fn failed(&mut self, what: &str, e: &dyn std::fmt::Display) {
        self.failures = self.failures.saturating_add(1);
        let ms = (200u64 << self.failures.min(5).saturating_sub(1)).min(5_000);
        tracing::warn!(error = %e, retry_in_ms = ms, "reading {what} failed; reading it again");
        let at = tokio::time::Instant::now() + Duration::from_millis(ms);
        self.at = Some(self.at.map_or(at, |cur| cur.min(at)));
    }
}

/// Obeys a drain notification of this deployment (once); ignores one of another deployment.
async fn check_drain(store: &ZkStore, running: &Engines, deployment: &str, draining: &mut bool, reread: &mut Reread) {
    if *draining {
        return;
    }
    match store.read_drain().await {
        Ok(Some(req)) if req.deployment_id == deployment => {
            tracing::info!(deployment, "drain notification: draining");
            if let Err(e) = running.drain().await {
                reread.failed("the drain notification (draining the topology failed)", &e);
                return;
            }
            *draining = true;
        }
        Ok(Some(req)) => {
            tracing::debug!(notification = %req.deployment_id, this = deployment, "ignoring a drain notification of another deployment");
        }
        Ok(None) => {}
        Err(e) => reread.failed("the drain notification", &e),
    }
}

/// Whether a drain of `deployment` was requested (false when it cannot be read: the state
/// read next decides).
async fn drain_requested(store: &ZkStore, deployment: &str) -> bool {
    match store.read_drain().await {
        Ok(Some(req)) => req.deployment_id == deployment,
        Ok(None) => false,
        Err(e) => {
            tracing::warn!(error = %e, "reading the drain notification failed");
            false
        }
    }
}

/// After this worker drained: remove its status znode; the last worker to go marks the topology
/// DRAINED (each checks after removing itself, so the last one always sees none left).
async fn finish_drain(store: &ZkStore, worker_id: &str, deployment: &str) {
    if let Err(e) = store.remove_worker(worker_id).await {
        tracing::warn!(error = %e, "removing the worker status failed");
    }
    for _ in 0..10 {
        match store.workers().await {
            Ok(w) if w.is_empty() => {}
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(error = %e, "listing workers failed");
                return;
            }
        }
        let Ok(Some(cur)) = store.read_state().await else { return };
        if cur.value.state != Lifecycle::Draining || cur.value.deployment_id != deployment {
            return;
        }
        let next = TopologyState { state: Lifecycle::Drained, updated_at_ms: now_ms(), ..cur.value };
        match store.write_state(&next, Some(cur.version)).await {
            Ok(_) => {
                tracing::info!(deployment, "the last worker drained: topology DRAINED");
                return;
            }
            Err(CoordError::VersionConflict { .. }) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "marking the topology DRAINED failed");
                return;
            }
        }
    }
}

/// How long no worker of a draining deployment may be registered before a starting worker marks
/// it DRAINED itself (as `squall drain --wait` does): a worker that started just before the drain
/// publishes its status within this time.
const DRAIN_ORPHANED_AFTER: Duration = Duration::from_secs(2);

/// A worker starting while the topology drains does not join the drain: it waits, unregistered,
/// until the deployment is DRAINED (or another one started), then deploys anew. Joining it would
/// add producers and readers to a deployment that is finishing, and with a supervisor that
/// restarts each worker as it exits, the workers of a long drain would overlap for ever: the last
/// worker to go marks the deployment DRAINED, and none would ever be the last. When no worker of
/// the deployment is registered for [`DRAIN_ORPHANED_AFTER`] (all drained, or died while
/// draining), it marks the deployment DRAINED itself; what a dead worker read and did not
/// checkpoint, the next deployment reads again.
async fn wait_out_drain(store: &ZkStore, topology: &str, deployment: &str) -> Result<(), CoordError> {
    tracing::info!(
        topology,
        deployment,
        "the topology is draining: this worker waits for the drain to end, then deploys anew"
    );
    let started = tokio::time::Instant::now();
    let mut empty_since: Option<tokio::time::Instant> = None;
    let mut told = started;
    loop {
        let Some(cur) = store.read_state().await? else { return Ok(()) };
        if cur.value.state != Lifecycle::Draining || cur.value.deployment_id != deployment {
            tracing::info!(topology, deployment, waited_ms = started.elapsed().as_millis() as u64,
                state = ?cur.value.state, "the drain ended");
            return Ok(());
        }
        if !store.any_worker().await? {
            let since = *empty_since.get_or_insert_with(tokio::time::Instant::now);
            if since.elapsed() >= DRAIN_ORPHANED_AFTER {
                let next = TopologyState { state: Lifecycle::Drained, updated_at_ms: now_ms(), ..cur.value };
                match store.write_state(&next, Some(cur.version)).await {
                    Ok(_) => {
                        tracing::info!(
                            topology,
                            deployment,
                            "no worker of the draining deployment is left: topology DRAINED"
                        );
                        return Ok(());
                    }
                    // changed meanwhile: read again
                    Err(CoordError::VersionConflict { .. }) => continue,
                    Err(e) => return Err(e),
                }
            }
        } else {
            empty_since = None;
        }
        if told.elapsed() >= Duration::from_secs(30) {
            told = tokio::time::Instant::now();
            tracing::info!(
                topology,
                deployment,
                waited_s = started.elapsed().as_secs(),
                "still waiting for the drain to end before deploying anew"
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Reads the lifecycle state, starting a new deployment (ACTIVE, fresh id) when there is none or
/// the last one was killed or drained.
pub async fn ensure_deployment(store: &ZkStore) -> anyhow::Result<TopologyState> {
    let mut lost = 0;
    for _ in 0..20 {
        let current = match store.read_state().await {
            Ok(c) => c,
            // A lost answer: read again (a create whose answer was lost is found then).
            Err(e) if e.is_transient() && lost < 8 => {
                lost += 1;
                tokio::time::sleep(Duration::from_millis(200 * lost)).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let expected = match &current {
            Some(v) if !matches!(v.value.state, Lifecycle::Killed | Lifecycle::Drained) => return Ok(v.value.clone()),
            Some(v) => Some(v.version),
            None => None,
        };
        let fresh = TopologyState {
            state: Lifecycle::Active,
            deployment_id: crate::random::hex_id(12),
            updated_at_ms: now_ms(),
            kill_wait_ms: None,
        };
        match store.write_state(&fresh, expected).await {
            Ok(_) => return Ok(fresh),
            Err(CoordError::VersionConflict { .. }) => continue, // another worker started it; re-read
            Err(e) if e.is_transient() && lost < 8 => {
                lost += 1;
                tokio::time::sleep(Duration::from_millis(200 * lost)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("could not settle the topology state: too many concurrent writers")
}

fn worker_status(id: &WorkerIdentity, since: i64, engines: &Engines, metrics_addr: Option<String>) -> WorkerStatus {
    let mut tasks = Vec::new();
    let mut shards = std::collections::BTreeMap::new();
    let mut components = serde_json::Map::new();
    let mut stages = Vec::new();
    let mut kpl = crate::coord::KplRuntime::default();
    let primary = engines.stages.first().map_or("", |s| s.input.as_str());
    for (i, stage) in engines.stages.iter().enumerate() {
        for t in stage.registry.tasks() {
            let name = t.task_name();
            let k = &t.stats().kpl;
            let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
            kpl.aggregates += load(&k.aggregates);
            kpl.user_records += load(&k.user_records);
            kpl.out_of_range += load(&k.out_of_range);
            kpl.dropped += load(&k.dropped);
            kpl.dropped_aggregates += load(&k.dropped_aggregates);
            kpl.corrupt += load(&k.corrupt);
            for (shard, st) in t.shards() {
                // shards of another stream than the primary (a later stage's input, a further
                // source stream) are named with their stream: shard ids repeat across streams
                let key = if i == 0 && t.stream() == primary { shard } else { format!("{}/{shard}", t.stream()) };
                shards.insert(
                    key,
                    ShardRuntime {
                        task: name.clone(),
                        millis_behind_latest: st.millis_behind_latest,
                        last_error: st.last_error,
                        records_read: st.records_read,
                        retryable: st.retryable.unwrap_or(true),
                        error_since_ms: st.error_since_ms,
                        error_kind: st.error_kind.map(|k| k.to_string()),
                        get_records_calls: st.get_records_calls,
                        efo: st.efo_reader.then_some(crate::coord::EfoRuntime {
                            events: st.efo_events,
                            subscriptions: st.efo_subscriptions,
                            resubscriptions: st.efo_resubscriptions,
                            watchdog: st.efo_watchdog,
                            in_use: st.efo_in_use,
                            reregistered: st.efo_reregistered,
                        }),
                    },
                );
            }
            if !name.is_empty() {
                tasks.push(if i == 0 && t.stream() == primary { name } else { format!("{}/{name}", t.stream()) });
            }
        }
        if let Ok(serde_json::Value::Object(m)) = serde_json::to_value(stage.running.metrics().components) {
            components.extend(m);
        }
        let input_stats = lock(&stage.input_stats).clone();
        let sum = |f: fn(&StageInputStats) -> &std::sync::atomic::AtomicU64| {
            input_stats.iter().map(|s| f(s).load(std::sync::atomic::Ordering::Relaxed)).sum::<u64>()
        };
        stages.push(StageRuntime {
            name: stage.name.clone(),
            input: stage.input.clone(),
            watermark_records: sum(|s| &s.watermark_records),
            drain_markers: sum(|s| &s.drain_markers),
            stale_drain_markers: sum(|s| &s.stale_drain_markers),
            malformed: sum(|s| &s.malformed),
        });
    }
    WorkerStatus {
        worker_id: id.worker_id.clone(),
        host: id.host.clone(),
        pid: id.pid,
        since_ms: since,
        updated_at_ms: now_ms(),
        tasks,
        shards,
        components: serde_json::Value::Object(components),
        stages: if stages.len() > 1 { stages } else { Vec::new() },
        kpl,
        stream: primary.to_string(),
        metrics_addr,
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[test]
    fn an_idle_workers_polls_are_not_a_status_change() {
        let mut a = crate::coord::WorkerStatus {
            worker_id: "w".into(),
            host: "h".into(),
            pid: 1,
            since_ms: 1,
            updated_at_ms: 2,
            tasks: vec!["task-0000000001".into()],
            shards: Default::default(),
            components: serde_json::json!({}),
            stages: Vec::new(),
            kpl: Default::default(),
            stream: "s".into(),
            metrics_addr: None,
        };
        a.shards.insert("shardId-000000000000".into(), crate::coord::ShardRuntime::default());
        let mut idle = a.clone();
        idle.updated_at_ms = 9;
        let sh = idle.shards.get_mut("shardId-000000000000").unwrap();
        sh.get_records_calls += 15;
        sh.efo = None;
        assert!(super::same_status(&a, &idle), "polls of an idle shard are not news");
        let mut read = idle.clone();
        read.shards.get_mut("shardId-000000000000").unwrap().records_read = 3;
        assert!(!super::same_status(&a, &read), "records read are");
        let mut moved = idle.clone();
        moved.tasks.push("task-0000000002".into());
        assert!(!super::same_status(&a, &moved), "a new task is");
    }

    #[derive(Debug, Parser)]
    struct Cmd {
        #[command(flatten)]
        worker: super::WorkerArgs,
    }

    #[test]
    fn the_zookeeper_password_never_shows_in_debug_or_config_debug() {
        let cmd = Cmd::try_parse_from([
            "w",
            "--topology",
            "t",
            "--stream",
            "s",
            "--zk-user",
            "u",
            "--zk-password",
            "pa55-hunter2",
        ])
        .unwrap();
        assert!(!format!("{cmd:?}").contains("pa55-hunter2"), "{cmd:?}");
        let cfg = cmd.worker.spout_config().unwrap();
        assert_eq!(cfg.zookeeper.auth_password.as_deref(), Some("pa55-hunter2"));
        assert!(!format!("{cfg:?}").contains("pa55-hunter2"));
        assert!(!format!("{:?}", cfg.zookeeper.to_zk_config()).contains("pa55-hunter2"));
    }

    #[test]
    fn bad_flags_name_the_setting() {
        let cmd = Cmd::try_parse_from(["w", "--topology", "t", "--stream", "bad stream"]).unwrap();
        let e = cmd.worker.spout_config().unwrap_err().to_string();
        assert!(e.contains("stream") && e.contains("bad stream"), "{e}");
        let e = Cmd::try_parse_from(["w", "--topology", "t", "--stream", "s", "--initial-position", "soon"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("soon") && e.contains("trim-horizon"), "{e}");
    }
}
