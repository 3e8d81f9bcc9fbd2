//! The end-to-end audit topology: a Kinesis spout over a stream written by `squall stream put`,
//! and a sink that appends one JSON line per delivery (run id, partition key, per-key sequence,
//! shard id, sequence number, worker, time) to `--deliveries PATH`. Run several of these workers at
//! once against the same topology name, then compare with the producer's manifest:
//!
//! ```sh
//! squall stream create audit-demo --shards 4
//! squall stream put audit-demo --count 5000 --keys 100 --manifest m.json
//! cargo run --example audit -- --topology audit --stream audit-demo --deliveries d1.jsonl &
//! cargo run --example audit -- --topology audit --stream audit-demo --deliveries d2.jsonl &
//! squall audit --manifest m.json --deliveries d1.jsonl d2.jsonl
//! ```
//!
//! It shows: the worker entry point (`squall::run`), fields grouping on the partition key, and
//! that a sink which writes before it acks gives at-least-once delivery across workers, crashes
//! and resharding. `--fail-every N` fails every N-th first delivery to exercise replay.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use clap::Parser;
use squall::audit::Delivery;
use squall::kinesis::payload::AuditPayload;
use squall::topology::{Bolt, BoltOutput, ComponentError, TaskContext, Tuple};

#[derive(Debug, Parser)]
#[command(about = "Audit topology: records every delivery to a JSON-lines file")]
struct Args {
    #[command(flatten)]
    worker: squall::WorkerArgs,
    /// Append one JSON line per delivery here.
    #[arg(long)]
    deliveries: PathBuf,
    /// Sink tasks.
    #[arg(long, default_value_t = 2)]
    sinks: usize,
    /// Fail every N-th tuple once (0 = never), to exercise replay.
    #[arg(long, default_value_t = 0)]
    fail_every: u64,
}

struct Sink {
    file: Arc<Mutex<std::fs::File>>,
    worker: String,
    fail_every: u64,
    seen: u64,
}

impl Bolt for Sink {
    async fn prepare(&mut self, ctx: &TaskContext) -> Result<(), ComponentError> {
        self.worker = format!("{}#{}", self.worker, ctx.task_index());
        Ok(())
    }

    async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        let data = t.get_bytes("data")?;
        let p: AuditPayload = serde_json::from_slice(&data)
            .map_err(|e| ComponentError::fatal(format!("record is not an audit payload: {e}")))?;
        self.seen += 1;
        if self.fail_every > 0 && self.seen % self.fail_every == 0 {
            return Err(ComponentError::retryable("injected failure (--fail-every)"));
        }
        let d = Delivery {
            run: p.run,
            key: p.key,
            seq: p.seq,
            shard: t.get_str("shard_id")?.to_string(),
            sequence: t.get_str("sequence_number")?.to_string(),
            worker: self.worker.clone(),
            t_us: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_micros() as i64)
                .unwrap_or(0),
        };
        let mut line = serde_json::to_vec(&d).map_err(|e| ComponentError::fatal(e.to_string()))?;
        line.push(b'\n');
        // One write per line on an O_APPEND file: durable against a SIGKILL of this process
        // before the tuple is acked.
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        f.write_all(&line).map_err(|e| ComponentError::retryable(format!("writing the delivery log: {e}")))?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.deliveries)
        .map_err(|e| anyhow::anyhow!("opening --deliveries {}: {e}", args.deliveries.display()))?;
    let file = Arc::new(Mutex::new(file));
    let worker = format!("{}-{}", args.worker.topology, std::process::id());
    let (sinks, fail_every) = (args.sinks, args.fail_every);
    squall::run(args.worker, move |b, spout| {
        b.set_bolt("sink", sinks, move |_| Sink { file: file.clone(), worker: worker.clone(), fail_every, seen: 0 })
            .fields_grouping(spout, &["partition_key"]);
    })
    .await
}
