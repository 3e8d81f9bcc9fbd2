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

use crate::kinesis::KinesisEndpoint;
use crate::spout::{InitialPosition, KinesisSpout, KinesisSpoutConfig, WorkerIdentity};

/// The component id of the Kinesis spout that [`run`] declares.
pub const SPOUT_ID: &str = "kinesis";

/// Standard worker flags; each also reads an environment variable.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// Topology name (its state lives in ZooKeeper under {zk-root}/topologies/{topology}).
    #[arg(long, env = "SQUALL_TOPOLOGY")]
    pub topology: String,
    /// Kinesis stream to read.
    #[arg(long, env = "SQUALL_STREAM")]
    pub stream: String,
    /// ZooKeeper connect string.
    #[arg(long, env = "SQUALL_ZK", default_value = "127.0.0.1:2181")]
    pub zk: String,
    /// ZooKeeper root znode.
    #[arg(long, env = "SQUALL_ZK_ROOT", default_value = "/squall")]
    pub zk_root: String,
    /// ZooKeeper session timeout in milliseconds (a crashed worker's shards move after it).
    #[arg(long, env = "SQUALL_ZK_SESSION_TIMEOUT_MS", default_value_t = 10_000)]
    pub zk_session_timeout_ms: u64,
    /// ZooKeeper digest-auth user (optional).
    #[arg(long, env = "SQUALL_ZK_USER")]
    pub zk_user: Option<String>,
    /// ZooKeeper digest-auth password (optional; never logged).
    #[arg(long, env = "SQUALL_ZK_PASSWORD", hide_env_values = true)]
    pub zk_password: Option<String>,
    /// Kinesis endpoint URL, or `aws`.
    #[arg(long, env = "SQUALL_KINESIS_ENDPOINT", default_value = crate::kinesis::DEFAULT_ENDPOINT)]
    pub endpoint: String,
    /// AWS region.
    #[arg(long, env = "SQUALL_REGION", default_value = crate::kinesis::DEFAULT_REGION)]
    pub region: String,
    /// Spout tasks in this worker.
    #[arg(long, env = "SQUALL_SPOUT_TASKS", default_value_t = 1)]
    pub spout_tasks: usize,
    /// Initial position at the topology's first start: trim-horizon, latest, at-timestamp:<ms>.
    #[arg(long, env = "SQUALL_INITIAL_POSITION", default_value = "trim-horizon")]
    pub initial_position: InitialPosition,
    /// Message timeout in milliseconds (a tuple not fully acked by then is failed and replayed).
    #[arg(long, env = "SQUALL_MESSAGE_TIMEOUT_MS", default_value_t = 30_000)]
    pub message_timeout_ms: u64,
    /// Max tracked tuples in flight per spout task.
    #[arg(long, env = "SQUALL_MAX_SPOUT_PENDING", default_value_t = 1000)]
    pub max_spout_pending: usize,
    /// JSON file with further spout settings (a `KinesisSpoutConfig`; flags override names,
    /// endpoints and ZooKeeper settings).
    #[arg(long, env = "SQUALL_SPOUT_CONFIG")]
    pub spout_config: Option<PathBuf>,
    /// Append a JSON-lines read log here (shard, sequences, times) for audits.
    #[arg(long, env = "SQUALL_READ_LOG")]
    pub read_log: Option<String>,
}

impl WorkerArgs {
    /// The spout configuration these flags describe (file first, then flags).
    pub fn spout_config(&self) -> anyhow::Result<KinesisSpoutConfig> {
        let mut cfg = match &self.spout_config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading the spout configuration {}", path.display()))?;
                let mut v: serde_json::Value = serde_json::from_str(&text)
                    .with_context(|| format!("parsing the spout configuration {}", path.display()))?;
                if let Some(o) = v.as_object_mut() {
                    o.entry("topology").or_insert_with(|| self.topology.clone().into());
                    o.entry("stream").or_insert_with(|| self.stream.clone().into());
                }
                serde_json::from_value::<KinesisSpoutConfig>(v)
                    .with_context(|| format!("invalid spout configuration in {}", path.display()))?
            }
            None => KinesisSpoutConfig::new(self.topology.clone(), self.stream.clone()),
        };
        cfg.topology = self.topology.clone();
        cfg.stream = self.stream.clone();
        cfg.kinesis = KinesisEndpoint::new(self.endpoint.clone(), self.region.clone());
        cfg.initial_position = self.initial_position;
        cfg.zookeeper.connect = self.zk.clone();
        cfg.zookeeper.root = self.zk_root.clone();
        cfg.zookeeper.session_timeout_ms = self.zk_session_timeout_ms;
        cfg.zookeeper.auth_user = self.zk_user.clone();
        cfg.zookeeper.auth_password = self.zk_password.clone();
        if self.read_log.is_some() {
            cfg.read_log = self.read_log.clone();
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// The engine configuration these flags describe.
    pub fn topology_config(&self) -> anyhow::Result<TopologyConfig> {
        let cfg = TopologyConfig {
            message_timeout_ms: self.message_timeout_ms,
            max_spout_pending: self.max_spout_pending,
            ..TopologyConfig::default()
        };
        cfg.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(cfg)
    }
}

/// Runs a worker: declares the Kinesis spout as [`SPOUT_ID`] with `--spout-tasks` tasks, lets
/// `build` add bolts (it gets the builder and the spout's id), starts the topology, and runs
/// until SIGINT or SIGTERM. Then it stops like Storm's kill: deactivates the spouts, waits up to
/// the message timeout for in-flight tuples, writes final checkpoints, releases its shards and
/// returns `Ok` (exit code 0). A task failure (e.g. ZooKeeper unreachable) returns the error.
pub async fn run<F>(args: WorkerArgs, build: F) -> anyhow::Result<()>
where
    F: FnOnce(&mut TopologyBuilder, &str),
{
    crate::logging::init();
    let spout_cfg = args.spout_config()?;
    let topo_cfg = args.topology_config()?;
    let mut builder = TopologyBuilder::new(args.topology.clone());
    KinesisSpout::declare(&mut builder, SPOUT_ID, args.spout_tasks, spout_cfg, WorkerIdentity::current());
    build(&mut builder, SPOUT_ID);
    let topology = builder.build().map_err(|e| anyhow::anyhow!("{e}"))?;
    let running = run_local(topology, topo_cfg).map_err(|e| anyhow::anyhow!("{e}"))?;
    tracing::info!(topology = %args.topology, stream = %args.stream, spout_tasks = args.spout_tasks, "worker started");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        r = running.wait() => {
            return r.map_err(|e| anyhow::anyhow!("topology {} stopped: {e}", args.topology));
        }
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
        _ = term.recv() => tracing::info!("SIGTERM: stopping"),
    }
    running
        .kill(Duration::from_millis(args.message_timeout_ms))
        .await
        .map_err(|e| anyhow::anyhow!("stopping topology {}: {e}", args.topology))?;
    tracing::info!(topology = %args.topology, "worker stopped");
    Ok(())
}
