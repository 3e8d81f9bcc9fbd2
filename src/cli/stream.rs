use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;

use super::Cli;
use crate::kinesis::{self, PutOptions, ShardDescription};

/// `squall stream ...`
#[derive(Debug, Subcommand)]
pub enum StreamCommand {
    /// Create a stream and wait until it is ACTIVE.
    Create {
        /// Stream name.
        name: String,
        /// Number of shards.
        #[arg(long, default_value_t = 1)]
        shards: i32,
    },
    /// Show a stream's shards with parents, hash ranges and open/closed.
    Describe {
        /// Stream name.
        name: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Put self-describing records (JSON naming run id, partition key and per-key sequence).
    Put {
        /// Stream name.
        name: String,
        /// Number of records.
        #[arg(long)]
        count: u64,
        /// Number of partition keys.
        #[arg(long, default_value_t = 10)]
        keys: u64,
        /// Records per second (default: as fast as possible).
        #[arg(long)]
        rate: Option<f64>,
        /// Minimum payload size in bytes.
        #[arg(long, default_value_t = 0)]
        size: usize,
        /// Write the run id and the count per key to this file (JSON).
        #[arg(long)]
        manifest: Option<PathBuf>,
        /// Run id to use (default: a fresh random one).
        #[arg(long, default_value = "")]
        run: String,
        /// Pack up to N user records into each Kinesis record, in the KPL aggregated format
        /// (grouped by shard, as the KPL does). The manifest counts user records.
        #[arg(long, value_name = "N", default_value_t = 0)]
        aggregate: usize,
    },
    /// Split a shard at the midpoint of its hash range.
    Split {
        /// Stream name.
        name: String,
        /// Shard id to split.
        shard: String,
    },
    /// Merge two adjacent shards.
    Merge {
        /// Stream name.
        name: String,
        /// First shard id.
        shard_a: String,
        /// Second (adjacent) shard id.
        shard_b: String,
    },
    /// Scale to N open shards (uniform scaling).
    Scale {
        /// Stream name.
        name: String,
        /// Target open shard count.
        #[arg(long)]
        shards: i32,
    },
    /// Delete a stream.
    Delete {
        /// Stream name.
        name: String,
    },
}

pub(super) async fn run(cli: &Cli, cmd: &StreamCommand) -> anyhow::Result<()> {
    let ep = cli.kinesis();
    let label = ep.label();
    let client = ep.client().await?;
    match cmd {
        StreamCommand::Create { name, shards } => {
            kinesis::create_stream(&client, &label, name, *shards).await?;
            outln!("created stream {name} with {shards} shard(s) at {label}");
        }
        StreamCommand::Describe { name, json } => {
            let shards = kinesis::describe_stream(&client, &label, name).await?;
            if *json {
                outln!("{}", serde_json::to_string_pretty(&serde_json::json!({ "stream": name, "shards": shards }))?);
            } else {
                print_shards(name, &shards);
            }
        }
        StreamCommand::Put { name, count, keys, rate, size, manifest, run, aggregate } => {
            let opts = PutOptions {
                count: *count,
                keys: *keys,
                rate: *rate,
                size: *size,
                run: run.clone(),
                aggregate: *aggregate,
                progress: Some(Default::default()),
                ..PutOptions::default()
            };
            // a bar on a terminal (hidden when stderr is not one), fed from the put's counter
            let bar = super::progress::bar(*count, &format!("put {name}"));
            let written = opts.progress.clone().unwrap_or_default();
            let ticker = {
                let bar = bar.clone();
                tokio::spawn(async move {
                    loop {
                        bar.set_position(written.load(std::sync::atomic::Ordering::Relaxed));
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                })
            };
            let put = kinesis::put_records(&client, &label, name, &opts).await;
            ticker.abort();
            bar.finish_and_clear();
            let report = put?;
            if let Some(path) = manifest {
                let text = serde_json::to_string_pretty(&report.manifest)?;
                std::fs::write(path, text).with_context(|| format!("writing the manifest to {}", path.display()))?;
            }
            let secs = report.elapsed.as_secs_f64().max(1e-9);
            let packed = if *aggregate > 1 { format!(" (KPL aggregates of up to {aggregate})") } else { String::new() };
            outln!(
                "put {} records{packed} over {} keys to {name} (run {}) in {:.2} s, {:.0} records/s, {} PutRecords calls, {} retried",
                report.manifest.total,
                report.manifest.counts.len(),
                report.manifest.run,
                secs,
                report.manifest.total as f64 / secs,
                report.calls,
                report.retried
            );
        }
        StreamCommand::Split { name, shard } => {
            let at = kinesis::split_shard(&client, &label, name, shard).await?;
            outln!("split {shard} of {name} at hash key {at}");
        }
        StreamCommand::Merge { name, shard_a, shard_b } => {
            kinesis::merge_shards(&client, &label, name, shard_a, shard_b).await?;
            outln!("merged {shard_a} and {shard_b} of {name}");
        }
        StreamCommand::Scale { name, shards } => {
            kinesis::scale_stream(&client, &label, name, *shards).await?;
            outln!("scaled {name} to {shards} open shard(s)");
        }
        StreamCommand::Delete { name } => {
            kinesis::delete_stream(&client, &label, name).await?;
            outln!("deleted stream {name}");
        }
    }
    Ok(())
}

fn print_shards(stream: &str, shards: &[ShardDescription]) {
    let open = shards.iter().filter(|s| !s.closed).count();
    outln!("stream {stream}: {} shards ({open} open, {} closed)", shards.len(), shards.len() - open);
    outln!("{:<22} {:<8} {:<45} {:>40} {:>40}", "SHARD", "STATE", "PARENTS", "START HASH KEY", "END HASH KEY");
    for s in shards {
        let parents: Vec<&str> = s.parents().collect();
        outln!(
            "{:<22} {:<8} {:<45} {:>40} {:>40}",
            s.shard_id,
            if s.closed { "closed" } else { "open" },
            if parents.is_empty() { "-".to_string() } else { parents.join(",") },
            s.starting_hash_key,
            s.ending_hash_key
        );
    }
}
