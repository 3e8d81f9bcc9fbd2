//! The `squall` command line: stream helpers for LocalStack (and AWS), and topology operations.

/// Like `println!`, but a closed stdout (e.g. `| head`) is not a panic.
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($t)*);
    }};
}

mod progress;
mod status_text;
mod stream;
mod topology;

pub use topology::{
    CommittedWatermarkReport, ResetTarget, ShardReport, StageReport, StatusReport, StreamReport, TopologySummary,
    WorkerReport,
};

/// The topology operations of the CLI that the web UI ([`crate::ui`]) and programs (the
/// simulator's operator) run too: the same functions, reporting their messages to a
/// [`Progress`](topology_ops::Progress) such as [`Collected`](topology_ops::Collected) instead of
/// stdout.
pub mod topology_ops {
    pub use super::topology::{Collected, Progress, drain_topology, kill_topology, rebalance_topology, set_active};
    pub(crate) use super::topology::{REBALANCE_GATHER_SECS, StatusReader, reader_survives};
}

use clap::{Parser, Subcommand};

use crate::kinesis::KinesisEndpoint;

/// Squall: Storm-style topologies over Amazon Kinesis, coordinated through ZooKeeper.
#[derive(Debug, Parser)]
#[command(name = "squall", version, about, propagate_version = true)]
pub struct Cli {
    /// Kinesis endpoint URL, or `aws` for the SDK's own endpoint resolution and credential chain.
    #[arg(long, global = true, env = "SQUALL_KINESIS_ENDPOINT", default_value = crate::kinesis::DEFAULT_ENDPOINT)]
    pub endpoint: String,
    /// AWS region.
    #[arg(long, global = true, env = "SQUALL_REGION", default_value = crate::kinesis::DEFAULT_REGION)]
    pub region: String,
    /// ZooKeeper connect string.
    #[arg(long, global = true, env = "SQUALL_ZK", default_value = "127.0.0.1:2181")]
    pub zk: String,
    /// ZooKeeper root path under which Squall keeps its state.
    #[arg(long, global = true, env = "SQUALL_ZK_ROOT", default_value = "/squall")]
    pub zk_root: String,
    /// ZooKeeper digest-auth user (the password comes from SQUALL_ZK_PASSWORD only).
    #[arg(long, global = true, env = "SQUALL_ZK_USER")]
    pub zk_user: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Kinesis stream helpers (create, describe, put, split, merge, scale, delete).
    #[command(subcommand)]
    Stream(stream::StreamCommand),
    /// Topologies under the root.
    #[command(subcommand)]
    Topology(TopologyCommand),
    /// Resume fetching from the checkpoints.
    Activate {
        /// Topology name.
        topology: String,
    },
    /// Stop fetching (within 1 s); acks, fails and checkpoints go on; shards are handed back.
    Deactivate {
        /// Topology name.
        topology: String,
    },
    /// Deactivate, let every shard be handed back and re-assigned, restore the previous state.
    Rebalance {
        /// Topology name.
        topology: String,
        /// Seconds to wait for shards to be handed back.
        #[arg(long, default_value_t = 30)]
        wait: u64,
        /// Seconds the leader waits for the tasks that were registered before to register again,
        /// before it assigns from scratch over those that did.
        #[arg(long, default_value_t = topology::REBALANCE_GATHER_SECS)]
        gather: u64,
    },
    /// Deactivate, wait for in-flight tuples (up to --wait or the message timeout), checkpoint,
    /// and stop every worker (exit 0).
    Kill {
        /// Topology name.
        topology: String,
        /// Seconds workers wait for in-flight tuples.
        #[arg(long)]
        wait: Option<u64>,
    },
    /// Drain (Samza): spouts stop fetching, in-flight tuples finish, windows flush, checkpoints
    /// are written, the topology becomes DRAINED and its workers exit 0.
    Drain {
        /// Topology name.
        topology: String,
        /// Wait up to this many seconds for DRAINED.
        #[arg(long)]
        wait: Option<u64>,
    },
    /// State, workers, shards (owner, checkpoint, lag, errors), counters, and stages (their
    /// intermediate streams, producers and lag).
    Status {
        /// Topology name.
        topology: String,
        /// Print JSON (stable schema: see README).
        #[arg(long)]
        json: bool,
        /// Print the status again every SECS seconds (default 2) until interrupted; on a
        /// terminal the screen is redrawn, when piped each status follows the last.
        #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "2")]
        watch: Option<u64>,
    },
    /// Waits until the topology is settled: ACTIVE, --workers live workers, and every unfinished
    /// shard assigned to a live task (spread evenly) and leased by it. Run it after replacing each
    /// worker of a rolling deploy: it returns once the handoff is over. Exits non-zero on timeout,
    /// naming what is not settled.
    WaitSettled {
        /// Topology name.
        topology: String,
        /// The number of live workers to wait for.
        #[arg(long)]
        workers: Option<usize>,
        /// Seconds to wait.
        #[arg(long, default_value_t = 120)]
        timeout: u64,
    },
    /// Checkpoint operations.
    #[command(subcommand)]
    Checkpoints(CheckpointsCommand),
    /// A web status page (the Storm UI's role): topologies, workers, each stream's shards with
    /// their lineage, owners, checkpoints, lag and errors, stages; refreshed every 2 s. Its
    /// actions (activate, deactivate, rebalance, drain, kill) ask for confirmation and accept
    /// only same-origin POSTs carrying the page's token. Uses --zk, --zk-root and --zk-user.
    Ui {
        /// The address to listen on (port 0: any free port, printed at start).
        #[arg(long, env = "SQUALL_UI_LISTEN", default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Allow a non-loopback --listen address. The UI has no login: whoever reaches it can
        /// deactivate, drain or kill topologies.
        #[arg(long)]
        allow_remote: bool,
    },
    /// Compare producer manifests with delivery logs: produced, delivered, lost, duplicates, order
    /// violations, as one JSON object. Exits non-zero when anything was lost.
    Audit {
        /// Manifest files written by `squall stream put --manifest`.
        #[arg(long, num_args = 1.., required_unless_present = "windows")]
        manifest: Vec<std::path::PathBuf>,
        /// Delivery logs written by `examples/audit.rs --deliveries`.
        #[arg(long, num_args = 1.., required_unless_present_any = ["counts", "windows"])]
        deliveries: Vec<std::path::PathBuf>,
        /// Instead, compare the windows an exactly-once window count fired into a results stream
        /// (`exactly_once_counts --window-ms N --fire-to RESULTS`) with the true per-window counts
        /// of the input stream (every record read back, windowed by its arrival time): every
        /// window must have fired with its count, and nothing else. Copies of one window (a
        /// replayed firing) are fine when their counts agree. Needs --stream, --window-ms, --fired.
        #[arg(long, conflicts_with_all = ["deliveries", "counts"], requires_all = ["stream", "window_ms", "fired"])]
        windows: bool,
        /// The input stream (with --windows).
        #[arg(long)]
        stream: Option<String>,
        /// The window length in ms (with --windows).
        #[arg(long)]
        window_ms: Option<u64>,
        /// The results stream the windows were fired into (with --windows).
        #[arg(long)]
        fired: Option<String>,
        /// Instead of delivery logs, compare the per-key counts an exactly-once counting
        /// component (`examples/exactly_once_counts.rs`) keeps in the state table with the
        /// manifests' counts: every key must match exactly. Needs --topology and --component.
        #[arg(long, conflicts_with = "deliveries", requires_all = ["topology", "component"])]
        counts: bool,
        /// Topology of the counting component (with --counts).
        #[arg(long)]
        topology: Option<String>,
        /// The counting component (with --counts).
        #[arg(long)]
        component: Option<String>,
        /// DynamoDB endpoint of the state table: http(s)://host:port, or `aws`.
        #[arg(long, env = "SQUALL_STATE_ENDPOINT", default_value = "http://127.0.0.1:4569")]
        state_endpoint: String,
        /// The state table.
        #[arg(long, env = "SQUALL_STATE_TABLE", default_value = "squall-state")]
        state_table: String,
    },
}

/// `squall topology ...`
#[derive(Debug, Subcommand)]
pub enum TopologyCommand {
    /// List the topologies and their states.
    List,
}

/// `squall checkpoints ...`
#[derive(Debug, Subcommand)]
pub enum CheckpointsCommand {
    /// Rewind every checkpoint of a stream (the topology must be deactivated).
    Reset {
        /// Topology name.
        topology: String,
        /// Stream name.
        #[arg(long)]
        stream: String,
        /// trim-horizon, latest, or an RFC 3339 timestamp.
        #[arg(long)]
        to: ResetTarget,
    },
}

impl Cli {
    /// The Kinesis endpoint these flags name.
    pub fn kinesis(&self) -> KinesisEndpoint {
        KinesisEndpoint::new(self.endpoint.clone(), self.region.clone())
    }
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match &cli.command {
        Command::Stream(cmd) => stream::run(&cli, cmd).await,
        Command::Topology(TopologyCommand::List) => topology::list(&cli).await,
        Command::Activate { topology } => topology::activate(&cli, topology, true).await,
        Command::Deactivate { topology } => topology::activate(&cli, topology, false).await,
        Command::Rebalance { topology, wait, gather } => topology::rebalance(&cli, topology, *wait, *gather).await,
        Command::Kill { topology, wait } => topology::kill(&cli, topology, *wait).await,
        Command::Drain { topology, wait } => topology::drain(&cli, topology, *wait).await,
        Command::Status { topology, json, watch } => topology::status(&cli, topology, *json, *watch).await,
        Command::WaitSettled { topology, workers, timeout } => {
            topology::wait_settled(&cli, topology, *workers, *timeout).await
        }
        Command::Ui { listen, allow_remote } => {
            let cfg =
                crate::ui::UiConfig { listen: *listen, allow_remote: *allow_remote, zk: topology::zk_config(&cli) };
            crate::ui::serve(cfg).await
        }
        Command::Checkpoints(CheckpointsCommand::Reset { topology, stream, to }) => {
            topology::reset(&cli, topology, stream, to).await
        }
        Command::Audit { windows: true, stream, window_ms, fired, .. } => {
            let ep = cli.kinesis();
            let (label, client) = (ep.label(), ep.client().await?);
            let (stream, fired) = (stream.as_deref().unwrap_or(""), fired.as_deref().unwrap_or(""));
            let truth = crate::audit::window_truth(&client, &label, stream, window_ms.unwrap_or(0)).await?;
            let got = crate::audit::fired_windows(&client, &label, fired).await?;
            let report = crate::audit::compare_windows(&truth, &got);
            outln!("{}", serde_json::to_string(&report)?);
            if !report.exact() {
                anyhow::bail!(
                    "{} of {} windows of stream {stream} differ from what fired into {fired}: {} missing, {} with \
                     another count, {} unknown (e.g. {:?})",
                    report.missing + report.wrong,
                    report.windows,
                    report.missing,
                    report.wrong,
                    report.unknown,
                    report.examples
                );
            }
            Ok(())
        }
        Command::Audit { manifest, counts: true, topology, component, state_endpoint, state_table, .. } => {
            let ep = crate::state::StateEndpoint {
                endpoint: state_endpoint.clone(),
                region: cli.region.clone(),
                table: state_table.clone(),
            };
            let (topology, component) = (topology.as_deref().unwrap_or(""), component.as_deref().unwrap_or(""));
            let report = crate::audit::audit_counts(manifest, &ep, topology, component).await?;
            outln!("{}", serde_json::to_string(&report)?);
            if report.mismatched > 0 {
                anyhow::bail!(
                    "{} of {} keys have counts that differ from the manifests (over {}, under {}; e.g. {:?})",
                    report.mismatched,
                    report.keys,
                    report.over,
                    report.under,
                    report.examples
                );
            }
            Ok(())
        }
        Command::Audit { manifest, deliveries, .. } => {
            let report = crate::audit::audit(manifest, deliveries)?;
            outln!("{}", serde_json::to_string(&report)?);
            if report.lost > 0 {
                anyhow::bail!(
                    "{} of {} records were lost (e.g. {:?})",
                    report.lost,
                    report.produced,
                    report.lost_examples
                );
            }
            Ok(())
        }
    }
}
