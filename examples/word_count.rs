//! Kinesis word count: the classic Storm topology over a Kinesis stream. A Kinesis spout reads
//! the records, `split` turns each record's text into words (anchored emits, so a record is acked
//! only when all its words are counted), and `count` keeps per-word counts with fields grouping,
//! so one word always lands on the same task. Counts are logged every few seconds and at the end.
//! With `--deliveries PATH` an audit bolt also subscribes to the spout and records every record, so
//! `squall audit` can prove nothing was lost (the demo does this).
//!
//! Run several workers at once against the same topology name; the stream's shards are spread
//! over all their spout tasks through ZooKeeper, and move when a worker joins or leaves:
//!
//! ```sh
//! make up
//! squall stream create words --shards 4
//! squall stream put words --count 1000 --keys 20
//! cargo run --example word_count -- --topology wc --stream words &
//! cargo run --example word_count -- --topology wc --stream words --spout-tasks 2 &
//! ```

use std::collections::HashMap;
use std::time::{Duration, Instant};

use clap::Parser;
use squall::topology::{Bolt, BoltOutput, ComponentError, TaskContext, Tuple};

#[derive(Debug, Parser)]
#[command(about = "Kinesis word count")]
struct Args {
    #[command(flatten)]
    worker: squall::WorkerArgs,
    /// Counting tasks.
    #[arg(long, default_value_t = 2)]
    counters: usize,
    /// Also record every record delivered (for `squall audit`) in this JSON-lines file; the
    /// records must have been written by `squall stream put`.
    #[arg(long)]
    deliveries: Option<std::path::PathBuf>,
}

/// Splits a record's payload into words. JSON payloads (as `squall stream put` writes) are split
/// on their values; anything else is treated as UTF-8 text.
struct Split;

impl Bolt for Split {
    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let data = t.get_bytes("data")?;
        let text = String::from_utf8_lossy(&data);
        for word in text.split(|c: char| !c.is_alphanumeric() && c != '-').filter(|w| !w.is_empty() && w.len() < 64) {
            out.emit([word.to_lowercase()])?;
        }
        Ok(())
    }
}

#[derive(Default)]
struct Count {
    counts: HashMap<String, u64>,
    task: usize,
    last_log: Option<Instant>,
}

impl Bolt for Count {
    async fn prepare(&mut self, ctx: &TaskContext) -> Result<(), ComponentError> {
        self.task = ctx.task_index();
        Ok(())
    }

    async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        *self.counts.entry(t.get_str("word")?.to_string()).or_default() += 1;
        if self.last_log.is_none_or(|l| l.elapsed() > Duration::from_secs(5)) {
            self.last_log = Some(Instant::now());
            tracing::info!(
                task = self.task,
                distinct = self.counts.len(),
                total = self.counts.values().sum::<u64>(),
                "counting"
            );
        }
        Ok(())
    }

    async fn cleanup(&mut self) {
        let mut top: Vec<_> = self.counts.iter().collect();
        top.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let top: Vec<String> = top.iter().take(10).map(|(w, c)| format!("{w}={c}")).collect();
        tracing::info!(task = self.task, total = self.counts.values().sum::<u64>(), top = %top.join(" "), "final counts");
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let counters = args.counters;
    let log = args.deliveries.as_deref().map(squall::audit::DeliveryLog::open).transpose()?;
    let worker = format!("{}-{}", args.worker.topology, std::process::id());
    squall::run(args.worker, move |b, spout| {
        b.set_bolt("split", 2, |_| Split).shuffle_grouping(spout).fields(&["word"]);
        b.set_bolt("count", counters, |_| Count::default()).fields_grouping("split", &["word"]);
        if let Some(log) = log {
            // A second subscriber of the spout: each record is acked once both bolts are done.
            b.set_bolt("audit", 1, move |_| squall::audit::DeliverySink::new(log.clone(), worker.clone()))
                .fields_grouping(spout, &["partition_key"]);
        }
    })
    .await
}
