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
//! and resharding. `--fail-every N` fails the first attempt of every N-th record of a key to exercise replay;
//! `--poison-key`, `--panic-key`, `--dead-letters` and `--fail-dead-letters` exercise the dead-letter
//! stream; `--sink-delay-ms` makes the sink slow (backpressure, fairness and memory tests);
//! `--non-audit PATH` writes records that are not audit payloads there (e.g. corrupt KPL aggregates
//! the spout delivers whole) and acks them, instead of failing them.

use std::path::PathBuf;

use clap::Parser;
use squall::audit::{DeliveryLog, DeliverySink};
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
    /// Fail the first delivery attempt of every record whose per-key sequence is a multiple of N
    /// (0 = never), to exercise replay: each such record fails once and succeeds when replayed.
    #[arg(long, default_value_t = 0)]
    fail_every: u64,
    /// Fail every record of this partition key, every time (a poison record): after the retry
    /// limit the spout sends it to its dead-letter stream.
    #[arg(long)]
    poison_key: Option<String>,
    /// Panic in the bolt on every record of this partition key, every time (a poison record that
    /// crashes the bolt; the engine catches the panic and fails the tuple).
    #[arg(long)]
    panic_key: Option<String>,
    /// Append the dead-letter stream's records here (one JSON line each).
    #[arg(long)]
    dead_letters: Option<PathBuf>,
    /// Fail the first N dead-letter tuples this worker receives (a failing dead-letter sink): the
    /// spout must emit them again, and never count their records as handled before they succeed.
    #[arg(long, default_value_t = 0)]
    fail_dead_letters: u64,
    /// Sleep this long (ms) in the sink before recording each delivery: a slow consumer.
    #[arg(long, default_value_t = 0)]
    sink_delay_ms: u64,
    /// Append records that are not audit payloads here (shard, sequence number, sub-sequence,
    /// hex of the data) and ack them, instead of failing them.
    #[arg(long)]
    non_audit: Option<PathBuf>,
}

/// The delivery sink, plus optional injected failures.
struct Sink {
    inner: DeliverySink,
    fail_every: u64,
    failed_once: std::collections::HashSet<(String, String, u64)>,
    poison_key: Option<String>,
    panic_key: Option<String>,
    delay: std::time::Duration,
    non_audit: Option<DeliveryLog>,
    /// User metrics (`ctx.counter`, `ctx.histogram`): deliveries recorded and their payload
    /// sizes, exposed on `--metrics-addr` and in `squall status`.
    delivered: squall::topology::Counter,
    payload_bytes: squall::topology::Histogram,
}

impl Bolt for Sink {
    async fn prepare(&mut self, ctx: &TaskContext) -> Result<(), ComponentError> {
        self.delivered = ctx.counter("deliveries");
        self.payload_bytes = ctx.histogram("payload_bytes");
        self.inner.prepare(ctx).await
    }

    async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        let p = match (DeliverySink::payload(&t), &self.non_audit) {
            (Ok(p), _) => p,
            (Err(_), Some(log)) => {
                let line = serde_json::json!({
                    "shard": t.get_str("shard_id")?, "sequence": t.get_str("sequence_number")?,
                    "sub_sequence": t.get_u64("sub_sequence")?,
                    "data_hex": t.get_bytes("data")?.iter().map(|b| format!("{b:02x}")).collect::<String>(),
                });
                return log.append(&line).map_err(|e| ComponentError::retryable(format!("writing {e}")));
            }
            (Err(e), None) => return Err(e),
        };
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        if self.poison_key.as_deref() == Some(p.key.as_str()) {
            return Err(ComponentError::retryable(format!("poison record {}/{}", p.key, p.seq)));
        }
        if self.panic_key.as_deref() == Some(p.key.as_str()) {
            panic!("poison record {}/{} (--panic-key)", p.key, p.seq);
        }
        if self.fail_every > 0
            && p.seq % self.fail_every == 0
            && self.failed_once.insert((p.run.clone(), p.key.clone(), p.seq))
        {
            return Err(ComponentError::retryable("injected failure (--fail-every)"));
        }
        let size = t.get_bytes("data")?.len() as u64;
        self.inner.record(&t, p)?;
        self.delivered.incr();
        self.payload_bytes.record(size);
        Ok(())
    }
}

/// Writes what the spout dead-lettered: the payload plus how many times it failed. Fails the
/// first `fail_first` tuples it receives (shared by its tasks).
struct DeadLetterSink {
    log: DeliveryLog,
    fail_first: u64,
    failed: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Bolt for DeadLetterSink {
    async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        let p = DeliverySink::payload(&t)?;
        if self.failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < self.fail_first {
            return Err(ComponentError::retryable(format!(
                "dead letter {}/{} refused (--fail-dead-letters {})",
                p.key, p.seq, self.fail_first
            )));
        }
        let line = serde_json::json!({
            "run": p.run, "key": p.key, "seq": p.seq,
            "shard": t.get_str("shard_id")?, "sequence": t.get_str("sequence_number")?,
            "failures": t.get_u64("failures")?,
        });
        self.log.append(&line).map_err(|e| ComponentError::retryable(format!("writing the dead-letter log: {e}")))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let log = DeliveryLog::open(&args.deliveries)?;
    let dead = args.dead_letters.as_deref().map(DeliveryLog::open).transpose()?;
    let worker = format!("{}-{}", args.worker.topology, std::process::id());
    let (sinks, fail_every, poison_key) = (args.sinks, args.fail_every, args.poison_key.clone());
    let panic_key = args.panic_key.clone();
    let delay = std::time::Duration::from_millis(args.sink_delay_ms);
    let non_audit = args.non_audit.as_deref().map(DeliveryLog::open).transpose()?;
    let (fail_dead, dead_failed) = (args.fail_dead_letters, std::sync::Arc::default());
    squall::run(args.worker, move |b, spout| {
        b.set_bolt("sink", sinks, move |_| Sink {
            inner: DeliverySink::new(log.clone(), worker.clone()),
            fail_every,
            failed_once: Default::default(),
            poison_key: poison_key.clone(),
            panic_key: panic_key.clone(),
            delay,
            non_audit: non_audit.clone(),
            delivered: Default::default(),
            payload_bytes: Default::default(),
        })
        .fields_grouping(spout, &["partition_key"]);
        if let Some(dead) = dead {
            b.set_bolt("dead_letters", 1, move |_| DeadLetterSink {
                log: dead.clone(),
                fail_first: fail_dead,
                failed: std::sync::Arc::clone(&dead_failed),
            })
            .shuffle_grouping_from(spout, squall::spout::DEAD_LETTER_STREAM);
        }
    })
    .await
}
