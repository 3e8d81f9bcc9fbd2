//! A word count that is global across workers: spout -> split -> (intermediate Kinesis stream,
//! partitioned by word) -> count -> output Kinesis stream. Run several workers: each word is
//! counted by exactly one task in the whole cluster, because the boundary puts every tuple of a
//! word into one shard of the intermediate stream, and one shard is read by one task.
//!
//! `count` holds its inputs and, once a second, emits each word's new count since the last
//! flush as a delta `{word, delta, worker, task}` into the output stream, anchored to the inputs
//! it covers: they are acked (and the intermediate stream's checkpoints move) only once the delta
//! is durably put. A crash before that replays them, so the sum of the deltas of a word is at
//! least its true count, and exactly it without failures.
//!
//! The words of a record written by `squall stream put` are its partition key and `d{seq % 7}`
//! (so the true counts follow from the put manifests).
//!
//! ```sh
//! make up
//! squall stream create words --shards 4
//! squall stream create counts --shards 1
//! squall stream put words --count 1000 --keys 20
//! cargo run --example word_count_global -- --topology wcg --stream words --output counts &
//! cargo run --example word_count_global -- --topology wcg --stream words --output counts &
//! ```

use std::collections::HashMap;

use clap::Parser;
use squall::sink::{FieldsEncoder, KinesisSink, KinesisSinkConfig};
use squall::stage::{Boundary, Stages};
use squall::topology::{AckHandle, Bolt, BoltOutput, ComponentConfig, ComponentError, TaskContext, Timer, Tuple};

#[derive(Debug, Parser)]
#[command(about = "Global word count across workers, through an intermediate Kinesis stream")]
struct Args {
    #[command(flatten)]
    worker: squall::WorkerArgs,
    /// Output stream for the count deltas (JSON records `{word, delta, worker, task}`).
    #[arg(long)]
    output: String,
    /// Counting tasks per worker.
    #[arg(long, default_value_t = 2)]
    counters: usize,
    /// Shards of the intermediate stream when it is created.
    #[arg(long, default_value_t = 4)]
    boundary_shards: i32,
    /// How often `count` flushes its deltas (ms).
    #[arg(long, default_value_t = 1000)]
    flush_ms: u64,
    /// Also record every source record delivered to the first stage (for `squall audit`).
    #[arg(long)]
    deliveries: Option<std::path::PathBuf>,
}

/// The words of a record of `squall stream put`: its key and `d{seq % 7}`.
struct Split;

impl Bolt for Split {
    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let data = t.get_bytes("data")?;
        let p: squall::kinesis::payload::AuditPayload = serde_json::from_slice(&data)
            .map_err(|e| ComponentError::fatal(format!("record is not a `squall stream put` payload: {e}")))?;
        out.emit([p.key])?;
        out.emit([format!("d{}", p.seq % 7)])?;
        Ok(())
    }
}

/// Counts words; flushes deltas anchored to the inputs they cover.
struct Count {
    pending: HashMap<String, (u64, Vec<AckHandle>)>,
    worker: String,
    task: usize,
}

impl Bolt for Count {
    async fn prepare(&mut self, ctx: &TaskContext) -> Result<(), ComponentError> {
        self.task = ctx.task_index();
        Ok(())
    }

    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let word = t.get_str("word")?.to_string();
        let h = out.defer_ack()?;
        let e = self.pending.entry(word).or_default();
        e.0 += 1;
        e.1.push(h);
        Ok(())
    }

    async fn on_timer(&mut self, _timer: Timer, out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.flush(out)
    }

    async fn on_drain(&mut self, out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.flush(out)
    }
}

impl Count {
    fn flush(&mut self, out: &mut BoltOutput) -> Result<(), ComponentError> {
        for (word, (delta, handles)) in self.pending.drain() {
            let anchors: Vec<&AckHandle> = handles.iter().collect();
            let row = serde_json::json!({"word": word, "delta": delta, "worker": self.worker, "task": self.task});
            out.emit_anchored(&anchors, "default", [word.clone(), row.to_string()])?;
            for h in handles {
                out.ack(h);
            }
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let counters = args.counters;
    let worker = format!("{}-{}", squall::spout::WorkerIdentity::current().host, std::process::id());
    let sink_cfg = KinesisSinkConfig::new(
        args.output.clone(),
        squall::kinesis::KinesisEndpoint::new(args.worker.endpoint.clone(), args.worker.region.clone()),
    );
    sink_cfg.validate()?;
    let flush = ComponentConfig { tick_interval_ms: Some(args.flush_ms), ..ComponentConfig::default() };
    let log = args.deliveries.as_deref().map(squall::audit::DeliveryLog::open).transpose()?;
    let audit_worker = worker.clone();
    let stages = Stages::new("split", move |b, spout| {
        b.set_bolt("split", 2, |_| Split).shuffle_grouping(spout).fields(&["word"]);
        if let Some(log) = log {
            b.set_bolt("audit", 1, move |_| squall::audit::DeliverySink::new(log.clone(), audit_worker.clone()))
                .fields_grouping(spout, &["partition_key"]);
        }
    })
    .then(Boundary::new("words", "split", &["word"]).shards(args.boundary_shards), "count", move |b, input| {
        b.set_bolt("count", counters, move |_| Count { pending: HashMap::new(), worker: worker.clone(), task: 0 })
            .fields_grouping(input, &["word"])
            .fields(&["word", "row"])
            .config(flush);
        b.set_bolt("output", 1, move |_| {
            KinesisSink::new(sink_cfg.clone(), FieldsEncoder::new(&["word"]).data_field("row"))
        })
        .shuffle_grouping("count");
    });
    squall::stage::run(args.worker, stages).await
}
