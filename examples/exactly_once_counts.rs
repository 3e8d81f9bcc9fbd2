//! Exactly-once counts per partition key, kept in DynamoDB: a Kinesis spout over a stream written
//! by `squall stream put`, and an [`ExactlyOnce`] bolt counting records per key. Whatever fails
//! (workers killed mid-commit, paused past their ZooKeeper session, the store throttling, the
//! stream split or merged), every key's count in the table ends equal to the number of records
//! written with that key, which `squall audit --counts` checks against the producer's manifest:
//!
//! ```sh
//! squall stream create counts-demo --shards 4
//! squall stream put counts-demo --count 5000 --keys 100 --manifest m.json
//! cargo run --example exactly_once_counts -- --topology counts --stream counts-demo &
//! cargo run --example exactly_once_counts -- --topology counts --stream counts-demo &
//! squall audit --counts --manifest m.json --topology counts --component counts
//! ```
//!
//! It shows: a [`KeyedState`] computation (key, state type, apply), the state table settings
//! (`--state-endpoint`, `--state-table`, created on first start), MillWheel's per-key commit
//! batching (`--commit-interval-ms`), and that the bolt needs nothing else to be exactly-once: the
//! spout's tuples carry the record ids, lease tokens and checkpoints it deduplicates and fences
//! with. `--window-ms N` counts per key and tumbling event-time window instead (items `key@start`):
//! exactly-once window aggregates, materialized in the table. With `--fire-to RESULTS` as well,
//! each window *fires* once the stream's committed watermark passes its end (a `WindowFirer` spout
//! per worker; the spout config needs `committed_watermark_interval_ms` > 0), and its final count
//! is put to the stream RESULTS, checked against the input stream by
//! `squall audit --windows --stream counts-demo --window-ms N --fired RESULTS`. `--at-least-once` runs the same count with a plain bolt that adds each record to the
//! table with an unconditional `ADD` (the baseline of the benchmark; it over-counts after
//! failures).
//!
//! `--two-stages` runs the count as two stages: stage `counts` counts per key as above and, for
//! every record it applies, emits a strong production `{key, n: 1}` with its production id into an
//! intermediate Kinesis stream ([`Boundary::exactly_once`], `{topology}-tally`, partitioned by
//! key); stage `totals` sums `n` per key, exactly once again (items of topology
//! `{topology}.totals`, component `totals`). Both tables of counts must equal the manifest:
//!
//! ```sh
//! cargo run --example exactly_once_counts -- --topology counts2 --stream counts-demo --two-stages &
//! squall audit --counts --manifest m.json --topology counts2.totals --component totals
//! ```
//!
//! `--three-stages` adds a third: `totals` re-emits each tally it applies as a strong production
//! of its own into a second intermediate stream (`{topology}-relay`), and stage `finals` sums them
//! again (items of topology `{topology}.finals`, component `finals`): a production re-sent by a
//! stage keeps the id it was first emitted with, so every stage counts exactly. `--totals-by
//! region|all` keys `totals` (and `finals`) coarser than the boundary's key: per region (one of
//! three, from a hash of the key) or one global total, so one key of `totals` reads from every
//! intermediate shard.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use clap::Parser;
use serde::Serialize;
use squall::sink::{FieldsEncoder, KinesisSink, KinesisSinkConfig};
use squall::stage::{Boundary, Stages};
use squall::state::{
    ExactlyOnce, FIRE_FIELDS, FirerConfig, KeyedState, StateConfig, StateEndpoint, StateStore, Tumbling, Window,
    WindowAggregate, WindowFirer, with_production_fields,
};
use squall::topology::{AckHandle, Bolt, BoltOutput, ComponentError, TaskContext, Timer, Tuple};

#[derive(Debug, Parser)]
#[command(about = "Exactly-once per-key counts in DynamoDB")]
struct Args {
    #[command(flatten)]
    worker: squall::WorkerArgs,
    /// DynamoDB endpoint of the state table: http(s)://host:port (dynalite, LocalStack) or `aws`.
    #[arg(long, env = "SQUALL_STATE_ENDPOINT", default_value = "http://127.0.0.1:4569")]
    state_endpoint: String,
    /// The state table (created on first start).
    #[arg(long, env = "SQUALL_STATE_TABLE", default_value = "squall-state")]
    state_table: String,
    /// Counting tasks.
    #[arg(long, default_value_t = 2)]
    counters: usize,
    /// Longest wait of an input before its key is committed (ms).
    #[arg(long, default_value_t = 50)]
    commit_interval_ms: u64,
    /// Count at-least-once instead (unconditional ADD per key per interval; the benchmark's baseline).
    #[arg(long)]
    at_least_once: bool,
    /// Fault injection (tests): abort right after this many commits of a task, before acking.
    #[arg(long, hide = true)]
    abort_after_commits: Option<u64>,
    /// Fault injection (tests): the state of this key grows by `--pad-bytes` per record (a count and
    /// a padding string), to reach DynamoDB's item limit. Every other key keeps a plain count.
    #[arg(long, hide = true)]
    pad_key: Option<String>,
    /// Bytes the state of `--pad-key` grows by per record.
    #[arg(long, hide = true, default_value_t = 0)]
    pad_bytes: usize,
    /// Count per key and tumbling event-time window of this many ms (the record's arrival time):
    /// the state of key K's window starting at S is item `K@S`. Windows are materialized in the
    /// table, exactly once; with `--fire-to`, each fires once the stream's committed watermark
    /// passes its end.
    #[arg(long)]
    window_ms: Option<u64>,
    /// With `--window-ms`: fire each window when the stream's committed watermark passes its end
    /// (a `WindowFirer` spout, one task per worker) and put its final count to this Kinesis
    /// stream, one JSON record `{key, window_start, count, fire_key, fire_at}` per window,
    /// partitioned by `fire_key` (`key@start`, unique per window: deduplicate by it). The spout
    /// must publish the committed watermark: `committed_watermark_interval_ms` > 0 in
    /// `--spout-config`.
    #[arg(long, requires = "window_ms", conflicts_with_all = ["two_stages", "at_least_once", "pad_key"])]
    fire_to: Option<String>,
    /// Two stages across an intermediate Kinesis stream: per-key counts (stage `counts`) emit
    /// `{key, n: 1}` per record, summed per key exactly once by stage `totals`.
    #[arg(long, conflicts_with = "window_ms")]
    two_stages: bool,
    /// Shards of the intermediate stream of `--two-stages` (when Squall creates it).
    #[arg(long, default_value_t = 2)]
    boundary_shards: i32,
    /// Fault injection (tests): like `--abort-after-commits`, for a task of the `totals` stage.
    #[arg(long, hide = true)]
    abort_totals_after_commits: Option<u64>,
    /// Fault injection (tests): the boundary's writer aborts once it has put this many records
    /// into the intermediate stream, before their inputs are acked (they are replayed and their
    /// productions put again).
    #[arg(long, hide = true)]
    abort_after_puts: Option<u64>,
    /// Fault injection (tests): the `totals` stage fails the first attempt of about this percent
    /// of the productions (by production id), so they are replayed after later ones.
    #[arg(long, hide = true, default_value_t = 0)]
    totals_fail_percent: u64,
    /// Three stages: `totals` re-emits each tally it applies into a second intermediate stream,
    /// summed again by stage `finals`.
    #[arg(long, conflicts_with_all = ["two_stages", "window_ms", "at_least_once", "pad_key"])]
    three_stages: bool,
    /// The key of `totals` (and `finals`): `key` (the boundary's key), `region` (one of three,
    /// from a hash of the key) or `all` (one global total).
    #[arg(long, default_value = "key", value_parser = ["key", "region", "all"])]
    totals_by: String,
    /// Fault injection (tests): like `--abort-after-puts`, for the writer of the second boundary
    /// of `--three-stages`.
    #[arg(long, hide = true)]
    abort_relay_after_puts: Option<u64>,
    /// Fault injection (tests), with `--window-ms`: fail the first attempt of about PERCENT
    /// percent of the records of stream STREAM (by sequence number), so they are replayed after
    /// the spout's replay back-off: `STREAM:PERCENT`.
    #[arg(long, hide = true)]
    fail_stream_percent: Option<String>,
}

/// The region of a key (`region-0` .. `region-2`): a stable hash of the key.
fn region_of(key: &str) -> String {
    let h = key.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100000001b3));
    format!("region-{}", h % 3)
}

/// A production of the first of `--two-stages`: one record of `key` (in `region`) counted.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Tally {
    key: String,
    region: String,
    n: u64,
}

/// The fields of a [`Tally`].
const TALLY_FIELDS: [&str; 3] = ["key", "region", "n"];

/// The first of `--two-stages`: counts per partition key and emits a [`Tally`] per record.
struct CountAndTally;

impl KeyedState for CountAndTally {
    type State = u64;
    type Out = Tally;

    fn key(&self, t: &Tuple) -> Result<String, ComponentError> {
        Ok(t.get_str("partition_key")?.to_string())
    }

    fn apply(&mut self, key: &str, n: &mut u64, _t: &Tuple, out: &mut Vec<Tally>) -> Result<(), ComponentError> {
        *n += 1;
        out.push(Tally { key: key.to_string(), region: region_of(key), n: 1 });
        Ok(())
    }
}

/// The second of `--two-stages`: sums the tallies per key (or per region, or all in one, with
/// `--totals-by`). With `fail_percent`, the first attempt of about that percent of the
/// productions fails (a transient error of the user's computation): they come back as replays,
/// after later productions of their key. With `relay`, each tally applied is emitted again (the
/// third of `--three-stages` sums those).
struct SumTallies {
    fail_percent: u64,
    failed_once: std::collections::HashSet<String>,
    by: String,
    relay: bool,
}

impl SumTallies {
    fn new(by: &str, fail_percent: u64, relay: bool) -> Self {
        Self { fail_percent, failed_once: Default::default(), by: by.to_string(), relay }
    }
}

impl KeyedState for SumTallies {
    type State = u64;
    type Out = Tally;

    fn key(&self, t: &Tuple) -> Result<String, ComponentError> {
        Ok(match self.by.as_str() {
            "region" => t.get_str("region")?.to_string(),
            "all" => "all".to_string(),
            _ => t.get_str("key")?.to_string(),
        })
    }

    fn apply(&mut self, _key: &str, total: &mut u64, t: &Tuple, out: &mut Vec<Tally>) -> Result<(), ComponentError> {
        if self.fail_percent > 0 {
            let id = t.get_str("production_id")?;
            let h = id.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100000001b3));
            if h % 100 < self.fail_percent && self.failed_once.insert(id.to_string()) {
                tracing::info!(production = id, "fault injection: failing the first attempt of a production");
                return Err(ComponentError::retryable(format!("injected failure of production {id}")));
            }
        }
        let n = t.get_u64("n")?;
        *total += n;
        if self.relay {
            out.push(Tally { key: t.get_str("key")?.to_string(), region: t.get_str("region")?.to_string(), n });
        }
        Ok(())
    }
}

/// Subscribes a bolt summing tallies to `input` with the grouping `--totals-by` needs: by the
/// field its key is made of, or global for one total.
fn group_tallies(d: &mut squall::topology::BoltDeclarer<'_>, input: &str, by: &str) {
    match by {
        "region" => {
            d.fields_grouping(input, &["region"]);
        }
        "all" => {
            d.global_grouping(input);
        }
        _ => {
            d.fields_grouping(input, &["key"]);
        }
    }
}

/// Counts records per partition key.
struct CountByKey;

impl KeyedState for CountByKey {
    type State = u64;
    type Out = ();

    fn key(&self, t: &Tuple) -> Result<String, ComponentError> {
        Ok(t.get_str("partition_key")?.to_string())
    }

    fn apply(&mut self, _key: &str, n: &mut u64, _t: &Tuple, _out: &mut Vec<()>) -> Result<(), ComponentError> {
        *n += 1;
        Ok(())
    }
}

/// `--window-ms`: counts per partition key and tumbling window of arrival time (which a replay
/// keeps), run as [`Tumbling`] windows: items `{key}@{window start}`, fired as a [`WindowCount`].
/// With `fail`, the first attempt of about that percent of one stream's records fails.
#[derive(Clone, Default)]
struct CountPerWindow {
    fail: Option<(String, u64)>,
    failed_once: std::collections::HashSet<String>,
}

/// A fired window: its final count.
#[derive(Debug, Serialize)]
struct WindowCount {
    key: String,
    window_start: i64,
    count: u64,
}

impl WindowAggregate for CountPerWindow {
    type Acc = u64;
    type Out = WindowCount;

    fn key(&self, t: &Tuple) -> Result<String, ComponentError> {
        Ok(t.get_str("partition_key")?.to_string())
    }

    fn add(&mut self, n: &mut u64, t: &Tuple) -> Result<(), ComponentError> {
        if let Some((stream, percent)) = &self.fail
            && t.get_str("stream")? == stream
        {
            let seq = t.get_str("sequence_number")?;
            let h = seq.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100000001b3));
            if h % 100 < *percent && self.failed_once.insert(seq.to_string()) {
                tracing::info!(stream = %stream, sequence = seq, "fault injection: failing the first attempt of a record");
                return Err(ComponentError::retryable(format!("injected failure of record {seq} of {stream}")));
            }
        }
        *n += 1;
        Ok(())
    }

    fn result(&mut self, key: &str, w: Window, count: u64) -> WindowCount {
        WindowCount { key: key.to_string(), window_start: w.start_ms, count }
    }
}

/// [`CountByKey`], except that the state of `pad_key` is `{"count": N, "pad": "xx..."}`, its
/// padding growing by `pad_bytes` per record (tests of the item size limit). The other keys'
/// states are plain JSON numbers, as `CountByKey` stores them.
struct PaddedCount {
    pad_key: String,
    pad_bytes: usize,
}

impl KeyedState for PaddedCount {
    type State = serde_json::Value;
    type Out = ();

    fn key(&self, t: &Tuple) -> Result<String, ComponentError> {
        CountByKey.key(t)
    }

    fn apply(
        &mut self,
        key: &str,
        s: &mut serde_json::Value,
        _t: &Tuple,
        _out: &mut Vec<()>,
    ) -> Result<(), ComponentError> {
        if key != self.pad_key {
            *s = serde_json::Value::from(s.as_u64().unwrap_or(0) + 1);
            return Ok(());
        }
        let count = s.get("count").and_then(serde_json::Value::as_u64).unwrap_or(0) + 1;
        let mut pad = s.get("pad").and_then(serde_json::Value::as_str).unwrap_or("").to_string();
        pad.push_str(&"x".repeat(self.pad_bytes));
        *s = serde_json::json!({"count": count, "pad": pad});
        Ok(())
    }
}

/// The at-least-once baseline: per key, the records of an interval are added with one
/// unconditional UpdateItem `ADD`, then acked. A failure after the write and before the ack
/// replays them and counts them again.
struct AtLeastOnceCount {
    ep: StateEndpoint,
    store: Option<StateStore>,
    scope: String,
    interval: std::time::Duration,
    pending: HashMap<String, Vec<AckHandle>>,
    armed: bool,
}

impl AtLeastOnceCount {
    async fn flush(&mut self, out: &mut BoltOutput) {
        let Some(store) = self.store.clone() else { return };
        let batch: Vec<(String, Vec<AckHandle>)> = self.pending.drain().collect();
        let writes = batch.iter().map(|(key, hs)| {
            let store = store.clone();
            let pk = format!("{}/{key}", self.scope);
            let (scope, key, n) = (self.scope.clone(), key.clone(), hs.len());
            async move {
                // the baseline speaks DynamoDB's ADD directly (its prepare refused anything else)
                let Some(client) = store.client() else { return false };
                client
                    .update_item()
                    .table_name(store.table())
                    .key("pk", AttributeValue::S(pk))
                    .update_expression("SET #s = :scope, #k = :key ADD #c :n")
                    .expression_attribute_names("#s", "scope")
                    .expression_attribute_names("#k", "key")
                    .expression_attribute_names("#c", "count")
                    .expression_attribute_values(":scope", AttributeValue::S(scope))
                    .expression_attribute_values(":key", AttributeValue::S(key))
                    .expression_attribute_values(":n", AttributeValue::N(n.to_string()))
                    .send()
                    .await
                    .is_ok()
            }
        });
        let results = futures::future::join_all(writes).await;
        for ((_, hs), ok) in batch.into_iter().zip(results) {
            for h in hs {
                if ok { out.ack(h) } else { out.fail(h) }
            }
        }
    }
}

impl Bolt for AtLeastOnceCount {
    async fn prepare(&mut self, ctx: &TaskContext) -> Result<(), ComponentError> {
        let store = StateStore::open(&self.ep).await.map_err(|e| ComponentError::retryable(e.to_string()))?;
        if store.client().is_none() {
            return Err(ComponentError::fatal(format!(
                "--at-least-once counts with DynamoDB's ADD: the state endpoint {} is not DynamoDB",
                self.ep.endpoint
            )));
        }
        self.store = Some(store);
        self.scope = squall::state::scope(ctx.topology_name(), ctx.component_id());
        Ok(())
    }

    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let key = t.get_str("partition_key")?.to_string();
        let h = out.defer_ack().map_err(|e| ComponentError::fatal(e.to_string()))?;
        self.pending.entry(key).or_default().push(h);
        if !self.armed {
            self.armed = true;
            out.schedule_after(self.interval, 0);
        }
        Ok(())
    }

    async fn on_timer(&mut self, _t: Timer, out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.armed = false;
        self.flush(out).await;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let ep = StateEndpoint {
        endpoint: args.state_endpoint.clone(),
        region: args.worker.region.clone(),
        table: args.state_table,
    };
    ep.validate()?;
    let mut cfg = StateConfig::new(ep.clone());
    cfg.commit_interval_ms = args.commit_interval_ms;
    cfg.abort_after_commits = args.abort_after_commits;
    let (counters, at_least_once, interval) =
        (args.counters, args.at_least_once, std::time::Duration::from_millis(args.commit_interval_ms));
    let (pad_key, pad_bytes) = (args.pad_key, args.pad_bytes);
    let window_ms = args.window_ms.filter(|w| *w > 0);
    let fail_stream = match &args.fail_stream_percent {
        None => None,
        Some(v) => {
            let (stream, percent) = v
                .split_once(':')
                .and_then(|(s, p)| Some((s.to_string(), p.parse::<u64>().ok()?)))
                .ok_or_else(|| anyhow::anyhow!("--fail-stream-percent {v:?}: expected STREAM:PERCENT"))?;
            Some((stream, percent))
        }
    };
    let firing = match &args.fire_to {
        Some(to) => {
            let spout = args.worker.spout_config()?;
            anyhow::ensure!(
                spout.committed_watermark_interval_ms > 0,
                "--fire-to needs the stream's committed watermark: set committed_watermark_interval_ms (e.g. 500) in \
                 --spout-config"
            );
            let firer = FirerConfig::new(cfg.clone(), "counts", spout.zookeeper.to_zk_config(), spout.stream.clone())
                .with_streams(args.worker.stream.clone());
            let sink = KinesisSinkConfig::new(to.clone(), spout.kinesis.clone());
            sink.validate()?;
            Some((firer, sink))
        }
        None => None,
    };
    if args.two_stages || args.three_stages {
        let mut first = cfg.clone();
        first.production_ids = true;
        let mut second = cfg.clone();
        second.abort_after_commits = args.abort_totals_after_commits;
        second.production_ids = args.three_stages;
        let third = cfg;
        let out_fields = with_production_fields(&TALLY_FIELDS);
        let out_fields2 = out_fields.clone();
        let (totals_fail_percent, by, by3, three) =
            (args.totals_fail_percent, args.totals_by.clone(), args.totals_by.clone(), args.three_stages);
        let stages = Stages::new("counts", move |b, spout| {
            b.set_bolt("counts", counters, move |_| ExactlyOnce::new(first.clone(), CountAndTally))
                .fields_grouping(spout, &["partition_key"])
                .fields(&out_fields.iter().map(String::as_str).collect::<Vec<_>>());
        })
        .then(
            Boundary::new("tally", "counts", &TALLY_FIELDS)
                .key(&["key"])
                .shards(args.boundary_shards)
                .exactly_once()
                .abort_after_puts(args.abort_after_puts),
            "totals",
            move |b, input| {
                let by2 = by.clone();
                let mut d = b.set_bolt("totals", counters, move |_| {
                    ExactlyOnce::new(second.clone(), SumTallies::new(&by2, totals_fail_percent, three))
                });
                group_tallies(&mut d, input, &by);
                if three {
                    d.fields(&out_fields2.iter().map(String::as_str).collect::<Vec<_>>());
                }
            },
        );
        let stages = if three {
            stages.then(
                Boundary::new("relay", "totals", &TALLY_FIELDS)
                    .key(&["key"])
                    .shards(args.boundary_shards)
                    .exactly_once()
                    .abort_after_puts(args.abort_relay_after_puts),
                "finals",
                move |b, input| {
                    let by = by3.clone();
                    let mut d = b.set_bolt("finals", counters, move |_| {
                        ExactlyOnce::new(third.clone(), SumTallies::new(&by, 0, false))
                    });
                    group_tallies(&mut d, input, &by3);
                },
            )
        } else {
            stages
        };
        return squall::stage::run(args.worker, stages).await;
    }
    squall::run(args.worker, move |b, spout| {
        if at_least_once {
            let ep = ep.clone();
            b.set_bolt("counts", counters, move |_| AtLeastOnceCount {
                ep: ep.clone(),
                store: None,
                scope: String::new(),
                interval,
                pending: HashMap::new(),
                armed: false,
            })
            .fields_grouping(spout, &["partition_key"]);
        } else if let Some(pad_key) = pad_key {
            b.set_bolt("counts", counters, move |_| {
                ExactlyOnce::new(cfg.clone(), PaddedCount { pad_key: pad_key.clone(), pad_bytes })
            })
            .fields_grouping(spout, &["partition_key"]);
        } else if let Some(w) = window_ms {
            let windows = Tumbling::new(w, CountPerWindow { fail: fail_stream.clone(), ..CountPerWindow::default() });
            let for_bolt = windows.clone();
            b.set_bolt("counts", counters, move |_| ExactlyOnce::new(cfg.clone(), for_bolt.clone()))
                .fields_grouping(spout, &["partition_key"]);
            if let Some((firer, sink)) = firing {
                let fields: Vec<&str> = ["key", "window_start", "count"].into_iter().chain(FIRE_FIELDS).collect();
                b.set_spout("fire", 1, move |_| WindowFirer::new(firer.clone(), windows.clone())).fields(&fields);
                b.set_bolt("fired", 1, move |_| KinesisSink::new(sink.clone(), FieldsEncoder::new(&["fire_key"])))
                    .shuffle_grouping("fire");
            }
        } else {
            b.set_bolt("counts", counters, move |_| ExactlyOnce::new(cfg.clone(), CountByKey))
                .fields_grouping(spout, &["partition_key"]);
        }
    })
    .await
}
