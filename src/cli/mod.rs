//! The `squall` command line: stream helpers for LocalStack (and AWS), and topology operations.

mod stream;

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
    /// Compare producer manifests with delivery logs: produced, delivered, lost, duplicates, order
    /// violations, as one JSON object. Exits non-zero when anything was lost.
    Audit {
        /// Manifest files written by `squall stream put --manifest`.
        #[arg(long, num_args = 1.., required = true)]
        manifest: Vec<std::path::PathBuf>,
        /// Delivery logs written by `examples/audit.rs --deliveries`.
        #[arg(long, num_args = 1.., required = true)]
        deliveries: Vec<std::path::PathBuf>,
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
        Command::Audit { manifest, deliveries } => {
            let report = crate::audit::audit(manifest, deliveries)?;
            println!("{}", serde_json::to_string(&report)?);
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
