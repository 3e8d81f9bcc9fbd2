//! Event-time windows over Kinesis: records are counted per partition key in tumbling windows of
//! their approximate arrival time. The spout emits low watermarks (MillWheel): per shard the
//! arrival time of its oldest record not yet emitted (queued, or failed and awaiting its replay),
//! or of the newest read; per task the minimum over its shards; a shard with no new records for
//! `watermark_idle_timeout_ms` stops holding it back. A window fires when the watermark passes its
//! end. Windows hold their inputs until they fire (`AckMode::OnFire`, the default): a failed
//! aggregate replays its inputs, which then arrive late and are printed as such. Records in flight
//! do not hold the spout's watermark, so held inputs do not stop it; size `--max-spout-pending`
//! above the records a spout task reads per window. `squall drain` flushes the open windows
//! (+infinity watermark, then `on_drain`) before the workers exit.
//!
//! ```sh
//! squall stream create clicks --shards 2
//! squall stream put clicks --count 2000 --keys 5 --rate 100 &
//! cargo run --example windowed_counts -- --topology windows --stream clicks --window-ms 1000
//! squall drain windows --wait 30
//! ```
//!
//! With `--boundary-shards N` it runs in two stages: `forward` sends each record's key and
//! arrival time through an intermediate Kinesis stream of N shards, partitioned by key, and the
//! windows read it in the second stage. The watermark crosses the boundary in band (each record
//! carries its producer's, and idle shards get watermark records), so windows fire as in one
//! stage, and a drain flushes both stages in turn.
//!
//! `--out PATH` appends each fired window as a JSON line, `--watermarks PATH` each watermark a
//! window task saw, `--deliveries PATH` every record (for `squall audit`).

use std::path::PathBuf;

use clap::Parser;
use squall::audit::{DeliveryLog, DeliverySink};
use squall::stage::{Boundary, Stages};
use squall::topology::window::{Count, TumblingWindowConfig};
use squall::topology::{Bolt, BoltOutput, ComponentError, TaskContext, Tuple, Watermark};

#[derive(Debug, Parser)]
#[command(about = "Per-key counts in event-time tumbling windows over a Kinesis stream")]
struct Args {
    #[command(flatten)]
    worker: squall::WorkerArgs,
    /// Window size in milliseconds.
    #[arg(long, default_value_t = 1000)]
    window_ms: u64,
    /// Window tasks.
    #[arg(long, default_value_t = 2)]
    window_tasks: usize,
    /// Append fired windows here (JSON lines); they are always logged.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Append every watermark the output task sees here (JSON lines).
    #[arg(long)]
    watermarks: Option<PathBuf>,
    /// Record every delivered record here (for `squall audit`).
    #[arg(long)]
    deliveries: Option<PathBuf>,
    /// Run in two stages: the records' keys and times go through an intermediate Kinesis stream
    /// of this many shards (partitioned by key) to the windows, which then see the watermark
    /// carried across the boundary. 0: one stage.
    #[arg(long, default_value_t = 0)]
    boundary_shards: i32,
}

/// Stage one of the two-stage form: forwards each record's key and arrival time.
struct Forward;

impl Bolt for Forward {
    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        out.emit(squall::topology::values![t.get_str("partition_key")?.to_string(), t.get_i64("arrival_ms")?])?;
        Ok(())
    }
}

/// Prints (and optionally records) fired windows and late records, and the watermarks it sees.
struct Output {
    out: Option<DeliveryLog>,
    watermarks: Option<DeliveryLog>,
    task: usize,
}

impl Bolt for Output {
    async fn prepare(&mut self, ctx: &TaskContext) -> Result<(), ComponentError> {
        self.task = ctx.task_index();
        Ok(())
    }

    async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        let now = squall::coord::now_ms();
        let line = if t.stream() == "late" {
            serde_json::json!({
                "late": true, "key": t.get_str("partition_key")?, "event_ms": t.get_i64("event_ms")?,
                "window_start_ms": t.get_i64("window_start_ms")?, "at_ms": now,
            })
        } else {
            serde_json::json!({
                "key": t.get_str("partition_key")?, "window_start_ms": t.get_i64("window_start_ms")?,
                "window_end_ms": t.get_i64("window_end_ms")?, "count": t.get_u64("count")?, "fired_at_ms": now,
            })
        };
        tracing::info!(window = %line, "window");
        if let Some(out) = &self.out {
            out.append(&line).map_err(|e| ComponentError::retryable(format!("writing --out: {e}")))?;
        }
        Ok(())
    }

    async fn on_watermark(&mut self, wm: Watermark, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        if let Some(w) = &self.watermarks {
            let line =
                serde_json::json!({"task": self.task, "watermark": wm.millis(), "at_ms": squall::coord::now_ms()});
            w.append(&line).map_err(|e| ComponentError::retryable(format!("writing --watermarks: {e}")))?;
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let out = args.out.as_deref().map(DeliveryLog::open).transpose()?;
    let watermarks = args.watermarks.as_deref().map(DeliveryLog::open).transpose()?;
    let deliveries = args.deliveries.as_deref().map(DeliveryLog::open).transpose()?;
    // Inputs are held until their window fires (AckMode::OnFire, the default): at-least-once
    // through the window. This works over the Kinesis spout because records in flight do not hold
    // its watermark (only records still to be emitted do), and the spout keeps sending watermarks
    // while it sits at max pending.
    let windows = TumblingWindowConfig::new(args.window_ms, "arrival_ms", &["partition_key"])
        .build(Count)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let worker = format!("{}-{}", args.worker.topology, std::process::id());
    let window_tasks = args.window_tasks;
    let windowed = move |b: &mut squall::topology::TopologyBuilder, input: &str| {
        let mut w = b.set_bolt("windows", window_tasks, windows.factory());
        w.fields_grouping(input, &["partition_key"]);
        windows.declare_outputs(&mut w);
        b.set_bolt("output", 1, move |_| Output { out: out.clone(), watermarks: watermarks.clone(), task: 0 })
            .global_grouping("windows")
            .global_grouping_from("windows", "late");
    };
    let audit = move |b: &mut squall::topology::TopologyBuilder, spout: &str| {
        if let Some(log) = deliveries {
            b.set_bolt("audit", 1, move |_| DeliverySink::new(log.clone(), worker.clone()))
                .fields_grouping(spout, &["partition_key"]);
        }
    };
    if args.boundary_shards == 0 {
        return squall::run(args.worker, move |b, spout| {
            windowed(b, spout);
            audit(b, spout);
        })
        .await;
    }
    // two stages: the windows read the intermediate stream, keyed like the windows
    let stages = Stages::new("forward", move |b, spout| {
        b.set_bolt("forward", 2, |_| Forward).shuffle_grouping(spout).fields(&["partition_key", "arrival_ms"]);
        audit(b, spout);
    })
    .then(
        Boundary::new("keys", "forward", &["partition_key", "arrival_ms"])
            .key(&["partition_key"])
            .shards(args.boundary_shards),
        "windows",
        windowed,
    );
    squall::stage::run(args.worker, stages).await
}
