//! One simulated run: a fleet of workers (each `squall::run`, the product's worker: lifecycle,
//! shared ZooKeeper session, spout coordinator, readers, tracker and engine) over the models, with
//! producers, faults and checks, all drawn from one seed and run on tokio's paused clock on one
//! thread.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use squall::stage::{Boundary, Stages};
use squall::state::{
    ExactlyOnce, FIRE_FIELDS, FirerConfig, KeyedState, StateConfig, StateEndpoint, Tumbling, Window, WindowAggregate,
    WindowFirer, with_production_fields,
};
use squall::topology::{Bolt, BoltOutput, ComponentError, Tuple, Value};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

use crate::kinesis::SimKinesis;
use crate::state::SimState;
use crate::world::{Cut, Faults, Net, Rng, Shared, World, lock};
use crate::zk::{SimConnector, tick_sessions};

/// The shape of a run, drawn from its seed.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Scenario {
    pub workers: u32,
    pub spout_tasks: usize,
    pub shards: u32,
    pub keys: u32,
    /// Records put per second.
    pub rate: u64,
    pub faults: Faults,
    pub partitions: bool,
    pub freezes: bool,
    pub crashes: bool,
    pub reshards: bool,
    pub joins: bool,
    /// The workers' wall clock minus the services' (ms).
    pub skew_ms: i64,
    /// `--initial-position`: trim-horizon, latest, or at-timestamp:MILLIS (the services' clock).
    pub initial: String,
    /// AT_TIMESTAMP: records put before this simulated ms (since the start) may be skipped.
    pub at_ms: Option<u64>,
    /// An exactly-once bolt counts records per key in the state table (with TRIM_HORIZON only:
    /// its counts must equal the records put).
    pub exactly_once: bool,
    /// The streams the topology reads: `s`, or `s` and `t` (with TRIM_HORIZON only). Both have
    /// the same shard ids and the same keys: exactly-once state must tell their records apart.
    pub streams: Vec<String>,
    /// `committed_watermark_interval_ms` (0: off): the spout tasks report their committed
    /// watermarks and the leader publishes the stream's, which the checks hold against the
    /// records not delivered yet.
    pub committed_interval_ms: u64,
    /// With exactly-once: count per key and tumbling window of arrival time of this many ms (0:
    /// per key), and fire each window (a `WindowFirer` spout per worker) once the streams'
    /// committed watermark passes its end: each window must fire with its exact count.
    pub window_ms: u64,
    /// An operator deactivates the topology and activates it again (0.5-5 s later), and drains it
    /// once, at fault times (`squall deactivate|activate|drain`, the CLI's own operations).
    pub operator: bool,
    /// Two stages over an intermediate stream (`sim-mid`, this many shards; 0: one stage). The
    /// first hands each record on to the boundary writer (at-least-once: `{key, n, stream}`, which
    /// the second stage's sink checks), or, with exactly-once, counts it and emits a strong
    /// production `{key, n: 1}` that the second stage sums per key, exactly once again.
    #[serde(default)]
    pub mid_shards: u32,
    /// With exactly-once stages: a third stage. The second re-emits each tally it applies as a
    /// strong production of its own into `sim-mid2`, which the third sums again (a production
    /// re-sent keeps the id it was first sent with).
    #[serde(default)]
    pub third: bool,
    /// The producer is an aggregating one that is not the KPL: each tick's records of a key go
    /// as one KPL aggregate, put with an explicit hash key of its own per key (a fixed point, so
    /// a key keeps one shard lineage), not its user records' keys: most user records land in a
    /// shard whose hash range does not hold them, and the spout must deliver them all (its
    /// default `kpl_out_of_range: deliver`), each once per its (sequence, sub-sequence).
    #[serde(default)]
    pub kpl: bool,
    /// Workers leave gracefully at fault times (their process's shutdown, as on SIGTERM:
    /// deactivate, wait for in-flight tuples, final checkpoints, shards handed back), and the
    /// supervisor starts a new one (a rolling restart).
    #[serde(default)]
    pub leaves: bool,
    /// The coordinator's `resync_interval_ms` (0: its default, 30 s). Half the runs set it past
    /// the run's end: what the product does at the safety net's pace must not be what delivers
    /// a record, fires a window or obeys the operator (a read whose answer was lost and never
    /// read again shows as a stall for good).
    #[serde(default)]
    pub resync_ms: u64,
    /// The operator's deactivations are rebalances (`squall rebalance`: deactivate, wait for
    /// every shard to be handed back, assign from scratch, activate) in this share of them, and
    /// its drain is a `squall kill` instead in this share of runs (the supervisor starts the
    /// workers again; they deploy anew).
    #[serde(default)]
    pub rebalances: f64,
    #[serde(default)]
    pub kill: bool,
    /// With a third stage: it sums one global total (every tally under the key `all`) instead
    /// of per key, so one key reads every shard of the second intermediate stream (a production
    /// dedup floor must hold only for the keys of the shard it was read from).
    #[serde(default)]
    pub global_finals: bool,
    /// The spouts read by enhanced fan-out (`--consumer efo:sim`: one stream consumer per
    /// stream, SubscribeToShard per owned shard) instead of polling; its faults: subscriptions
    /// that go silent, fail mid-stream, or whose answer is lost, and the consumer deregistered
    /// under the running workers.
    #[serde(default)]
    pub efo: bool,
    /// With enhanced fan-out: `efo.renew_after_ms` (0: none, Kinesis's 5 minutes), and
    /// `efo.silence_timeout_ms` (the watchdog).
    #[serde(default)]
    pub efo_renew_ms: u64,
    #[serde(default)]
    pub efo_silence_ms: u64,
    /// A bolt beside the checking sink takes up to this many ms per tuple (0: none), of the
    /// spout's tuples and of the window firer's firings: trees complete late, so handoffs,
    /// drains, checkpoints and firings wait on tuples in flight.
    #[serde(default)]
    pub slow_ms: u64,
}

impl Scenario {
    /// The scenario of `seed`: `rng` draws what it always drew; the exactly-once workload comes
    /// from a stream of its own, so adding it left every earlier seed's run as it was.
    pub fn draw(seed: u64, rng: &mut Rng) -> Self {
        let mut s = Self::draw_base(rng);
        let mut extra = Rng::new(seed ^ 0xE0E0_0E0E_5A5A_A5A5);
        if s.initial == "trim-horizon" && extra.chance(0.5) {
            s.exactly_once = true;
            s.faults.state_throttle = if extra.chance(0.5) { 0.03 } else { 0.0 };
            s.faults.state_lost_after = if extra.chance(0.5) { 0.02 } else { 0.0 };
        }
        if s.initial == "trim-horizon" && extra.chance(0.4) {
            s.streams.push("t".into());
        }
        // Features added later draw from streams of their own too.
        let mut later = Rng::new(seed ^ 0x3C3C_C3C3_9696_6969);
        if later.chance(0.5) {
            s.committed_interval_ms = [200, 500, 1000][later.below(3) as usize];
        }
        if s.exactly_once && later.chance(0.5) {
            s.window_ms = [500, 1000, 2000][later.below(3) as usize];
            if s.committed_interval_ms == 0 {
                s.committed_interval_ms = 500;
            }
        }
        s.operator = later.chance(0.3);
        let mut staged = Rng::new(seed ^ 0x7B7B_B7B7_2D2D_D2D2);
        if s.window_ms == 0 && staged.chance(0.3) {
            s.mid_shards = staged.range(1, 3) as u32;
            s.faults.put_lost_after = if staged.chance(0.5) { 0.03 } else { 0.0 };
            s.third = s.exactly_once && staged.chance(0.5);
        }
        s.kpl = Rng::new(seed ^ 0x4B50_4C4B_504C_4B50).chance(0.25);
        s.leaves = Rng::new(seed ^ 0x1EA7_E5E5_1EA7_E5E5).chance(0.2);
        if Rng::new(seed ^ 0x5E5E_E5E5_0C0C_C0C0).chance(0.5) {
            s.resync_ms = 3_600_000;
        }
        if s.operator {
            let mut op = Rng::new(seed ^ 0x0DE7_7ED0_B1B1_1B1B);
            s.rebalances = if op.chance(0.5) { 0.4 } else { 0.0 };
            s.kill = op.chance(0.3);
        }
        s.global_finals = s.third && Rng::new(seed ^ 0x61_0BA1_7071_A15A).chance(0.5);
        let mut efo = Rng::new(seed ^ 0xEF0E_F0EF_0EF0_EF0E);
        if efo.chance(0.3) {
            s.efo = true;
            // (AWS refuses a subscription within 5 s of the last one: renewing sooner only
            // waits out ResourceInUse)
            s.efo_renew_ms = if efo.chance(0.5) { efo.range(5000, 12000) } else { 0 };
            s.efo_silence_ms = efo.range(2000, 8000);
            if efo.chance(0.5) {
                s.faults.efo_silent = 0.03;
            }
            s.faults.efo_error = if efo.chance(0.5) { 0.01 } else { 0.0 };
            s.faults.efo_subscribe_lost = if efo.chance(0.5) { 0.02 } else { 0.0 };
        }
        s
    }

    fn draw_base(rng: &mut Rng) -> Self {
        let mut faults = Faults { on: true, ..Faults::default() };
        if rng.chance(0.5) {
            faults.zk_lost_before = 0.01;
            faults.zk_lost_after = 0.01;
        }
        if rng.chance(0.4) {
            faults.throttle = 0.05;
        }
        if rng.chance(0.3) {
            faults.listing_omits = 0.2;
        }
        Scenario {
            workers: rng.range(1, 3) as u32,
            spout_tasks: rng.range(1, 2) as usize,
            shards: rng.range(1, 4) as u32,
            keys: rng.range(3, 20) as u32,
            rate: rng.range(5, 40),
            faults,
            partitions: rng.chance(0.5),
            freezes: rng.chance(0.4),
            crashes: rng.chance(0.4),
            reshards: rng.chance(0.5),
            joins: rng.chance(0.4),
            skew_ms: if rng.chance(0.3) { rng.range(0, 4000) as i64 - 2000 } else { 0 },
            initial: String::new(),
            at_ms: None,
            exactly_once: false,
            streams: vec!["s".into()],
            committed_interval_ms: 0,
            window_ms: 0,
            operator: false,
            mid_shards: 0,
            third: false,
            kpl: false,
            leaves: false,
            resync_ms: 0,
            rebalances: 0.0,
            kill: false,
            global_finals: false,
            efo: false,
            efo_renew_ms: 0,
            efo_silence_ms: 0,
            slow_ms: 0,
        }
        .with_initial_position(rng)
    }

    /// LATEST starts at the topology's first start (the checks learn when from its znode);
    /// AT_TIMESTAMP at a time 2-4 s in.
    fn with_initial_position(mut self, rng: &mut Rng) -> Self {
        let r = rng.below(10);
        (self.initial, self.at_ms) = if r < 6 {
            ("trim-horizon".into(), None)
        } else if r < 8 {
            ("latest".into(), None)
        } else {
            let at = rng.range(2_000, 4_000);
            (format!("at-timestamp:{}", EPOCH_MS + at as i64), Some(at))
        };
        self
    }
}

/// What a run found, printed by the child process for the parent (one JSON line).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Outcome {
    pub seed: u64,
    /// The hash of every event of the run, in order (hex).
    pub trace_hash: String,
    pub events: u64,
    pub sim_ms: u64,
    /// Simulated time summed over the workers alive.
    pub worker_ms: u64,
    pub records: u64,
    pub deliveries: u64,
    pub checkpoint_writes: u64,
    pub fenced_writes: u64,
    /// Committed watermarks checked against the records not delivered.
    #[serde(default)]
    pub committed_checks: u64,
    /// Windows fired (each firing, duplicates included).
    #[serde(default)]
    pub firings: u64,
    /// The topology's stages (1, or 2-3 over intermediate streams).
    #[serde(default)]
    pub stages: u32,
    pub injected: BTreeMap<String, u64>,
    pub scenario: String,
    pub violations: Vec<String>,
    /// The last events before the end (or the first violation's run end).
    pub tail: Vec<String>,
}

/// Producers put records for this long.
const PRODUCE_MS: u64 = 30_000;
/// Faults come between these times.
const FAULTS_FROM_MS: u64 = 2_000;
const FAULTS_UNTIL_MS: u64 = 28_000;
/// After the producers stop and the faults end, every record must be delivered (and the
/// coordination settled, the counts and windows complete) within this much simulated time
/// (liveness). The slowest of thousands of seeds took 14 s; what the product does in the
/// background at most every 30 s (the coordinator's resync) must not be what delivers a record:
/// a stall that waits for it is a bug (a shard handed back and not taken again, one failing
/// checkpoint holding back the others).
const SETTLE_MS: u64 = 40_000;
const SESSION_TIMEOUT_MS: u64 = 4_000;
/// The services' clock at the start of every run.
const EPOCH_MS: i64 = 1_790_000_000_000;
/// The intermediate stream of a staged run (topology `sim`, boundary `mid`).
const MID: &str = "sim-mid";
/// The second intermediate stream of a three-stage run (boundary `mid2`).
const MID2: &str = "sim-mid2";
/// The scopes of the exactly-once counts: one stage's, and the second stage's of a staged run.
const COUNTS_SCOPE: &str = "sim/eo";
const TOTALS_SCOPE: &str = "sim.down/totals";
const FINALS_SCOPE: &str = "sim.fin/finals";

/// The exactly-once workload: records per key, in the state table.
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

/// The first stage of a staged exactly-once run: counts per key, and emits a strong production
/// `{key, n: 1}` per record applied.
struct CountAndTally;

impl KeyedState for CountAndTally {
    type State = u64;
    type Out = Tally;

    fn key(&self, t: &Tuple) -> Result<String, ComponentError> {
        Ok(t.get_str("partition_key")?.to_string())
    }

    fn apply(&mut self, key: &str, n: &mut u64, _t: &Tuple, out: &mut Vec<Tally>) -> Result<(), ComponentError> {
        *n += 1;
        out.push(Tally { key: key.to_string(), n: 1 });
        Ok(())
    }
}

/// A production of [`CountAndTally`].
#[derive(serde::Serialize, serde::Deserialize)]
struct Tally {
    key: String,
    n: u64,
}

const TALLY_FIELDS: [&str; 2] = ["key", "n"];

/// The second stage of a staged exactly-once run (and the third of three): sums the tallies
/// per key; with `relay`, emits each tally it applies again (to the third stage).
struct SumTallies {
    relay: bool,
    /// Everything under one key, [`GLOBAL_KEY`].
    global: bool,
}

/// The key of a global total.
const GLOBAL_KEY: &str = "all";

impl KeyedState for SumTallies {
    type State = u64;
    type Out = Tally;

    fn key(&self, t: &Tuple) -> Result<String, ComponentError> {
        if self.global {
            return Ok(GLOBAL_KEY.to_string());
        }
        Ok(t.get_str("key")?.to_string())
    }

    fn apply(&mut self, key: &str, total: &mut u64, t: &Tuple, out: &mut Vec<Tally>) -> Result<(), ComponentError> {
        let n = t.get_u64("n")?;
        *total += n;
        if self.relay {
            out.push(Tally { key: key.to_string(), n });
        }
        Ok(())
    }
}

/// The fields the first stage of a staged at-least-once run hands on per record.
const RELAY_FIELDS: [&str; 3] = ["key", "n", "stream"];

/// The first stage of a staged at-least-once run: each record's `{key, n, stream}` to the
/// boundary writer.
struct Relay;

impl Bolt for Relay {
    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let (key, n) = record_of(&t)?;
        let stream = t.get_str("stream")?.to_string();
        out.emit(vec![Value::from(key), Value::from(n), Value::from(stream)])
            .map_err(|e| ComponentError::fatal(format!("relay: {e}")))?;
        Ok(())
    }
}

/// The sink of the second stage of a staged at-least-once run.
struct StageSink {
    world: Shared,
    worker: u32,
}

impl Bolt for StageSink {
    async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        let (key, n, stream) = (t.get_str("key")?.to_string(), t.get_u64("n")?, t.get_str("stream")?.to_string());
        let crashed = {
            let mut w = lock(&self.world);
            let crashed = w.net(self.worker).0;
            if !crashed {
                w.deliver_downstream(self.worker, &stream, &key, n);
            }
            crashed
        };
        if crashed {
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

/// The key and number of a producer's record (`key:n`).
fn record_of(t: &Tuple) -> Result<(String, u64), ComponentError> {
    let data = t.get_bytes("data")?;
    let text = String::from_utf8_lossy(&data).to_string();
    text.split_once(':')
        .and_then(|(k, n)| Some((k.to_string(), n.parse::<u64>().ok()?)))
        .ok_or_else(|| ComponentError::fatal(format!("not a simulator record: {text:?}")))
}

/// The windowed workload: records per key and tumbling window of arrival time.
#[derive(Clone, Default)]
struct CountPerWindow;

/// A fired window.
#[derive(serde::Serialize)]
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

    fn add(&mut self, n: &mut u64, _t: &Tuple) -> Result<(), ComponentError> {
        *n += 1;
        Ok(())
    }

    fn result(&mut self, key: &str, window: Window, count: u64) -> WindowCount {
        WindowCount { key: key.to_string(), window_start: window.start_ms, count }
    }
}

/// Per window (`key@start`, start in the services' clock): the records put into it, over every
/// stream (what each firing must count).
fn expected_windows(w: &World, size_ms: u64) -> BTreeMap<String, u64> {
    let size = size_ms as i64;
    let mut out = BTreeMap::new();
    for (id, arrivals) in &w.checks.arrival {
        let key = id.split_once('/').map_or(id.as_str(), |(_, k)| k);
        for a in arrivals {
            *out.entry(format!("{key}@{}", a - a.rem_euclid(size))).or_default() += 1;
        }
    }
    out
}

/// Windows that have not fired with their expected count (every firing of a window must carry
/// it; a window fired with a count of its own is wrong too).
fn wrong_windows(w: &World, size_ms: u64) -> Vec<String> {
    let expected = expected_windows(w, size_ms);
    let mut wrong = Vec::new();
    for (window, n) in &expected {
        match w.checks.fired.get(window) {
            None => wrong.push(format!("{window} ({n} records) never fired")),
            Some(counts) if counts.iter().any(|c| c != n) => {
                wrong.push(format!("{window} fired with {counts:?}, {n} records in it"))
            }
            Some(_) => {}
        }
    }
    for (window, counts) in &w.checks.fired {
        if !expected.contains_key(window) {
            wrong.push(format!("{window} fired with {counts:?}, but no record is in it"));
        }
    }
    wrong
}

/// Liveness of the coordination once the faults ended: for each stream read (sources and
/// intermediate streams), an assignment without error over exactly the tasks registered, loads
/// within one shard of each other, and each assigned shard that is not finished held by the
/// lease of the task it is assigned to. `Err` says what is not so yet.
/// Where the in-band low watermark of the live workers' sink tasks stands short of the last
/// record put: once the producers stopped, idle shards stop holding it back after the idle
/// timeout (5 s) and ended ones at once, so within the liveness bound it passes every record
/// (a shard holding it for good would stall every window and timer downstream).
fn inband_stalled(w: &World, live: &[u32]) -> Vec<String> {
    let last = w.checks.arrival.values().flat_map(|a| a.iter()).max().copied().unwrap_or(0).max(0) as u64;
    let mut out = Vec::new();
    for id in live {
        for task in 0..SINK_TASKS {
            match w.checks.inband.get(&(*id, task)) {
                Some(wm) if *wm >= last => {}
                Some(wm) => out.push(format!("w{id}'s sink task {task} at {wm}, {} ms short", last - wm)),
                None => out.push(format!("w{id}'s sink task {task} got none")),
            }
        }
    }
    out
}

fn assignment_settled(w: &World) -> Result<(), String> {
    // the primary stream's tasks register under the topology, the other source streams' under
    // `source-tasks`, an intermediate stream's (read by a later stage) under `tasks`
    let dirs = w.streams.iter().enumerate().map(|(i, stream)| {
        let sp = w.stream_path(stream);
        (stream, if i == 0 { format!("{}/tasks", w.topo_path) } else { format!("{sp}/source-tasks") })
    });
    let dirs = dirs.chain(w.intermediate.iter().map(|stream| (stream, format!("{}/tasks", w.stream_path(stream)))));
    for (stream, tasks_dir) in dirs.collect::<Vec<_>>() {
        let sp = w.stream_path(stream);
        let live: std::collections::BTreeSet<String> = w.zk.list_children_any(&tasks_dir).into_iter().collect();
        let Some(a) =
            w.zk.data_any(&format!("{sp}/assignment"))
                .and_then(|d| serde_json::from_slice::<squall::coord::Assignment>(&d).ok())
        else {
            return Err(format!("{stream}: no assignment"));
        };
        if let Some(e) = &a.error {
            return Err(format!("{stream}: assignment generation {} in error: {e}", a.generation));
        }
        let listed: std::collections::BTreeSet<String> = a.tasks.keys().cloned().collect();
        if listed != live {
            return Err(format!(
                "{stream}: assignment generation {} lists tasks {listed:?}, registered are {live:?}",
                a.generation
            ));
        }
        let loads: Vec<usize> = a.tasks.values().map(Vec::len).collect();
        if loads.iter().max().unwrap_or(&0) - loads.iter().min().unwrap_or(&0) > 1 {
            return Err(format!("{stream}: assignment generation {} unbalanced: {:?}", a.generation, a.tasks));
        }
        for (task, shards) in &a.tasks {
            for shard in shards {
                if w.finished(stream, shard) {
                    continue;
                }
                let lowest = w.lowest_lease(&format!("{sp}/owners/{shard}"));
                if !lowest.as_deref().is_some_and(|l| l.starts_with(&format!("lease-{task}-"))) {
                    return Err(format!(
                        "{stream}/{shard}: assigned to {task} (generation {}), held by {lowest:?}",
                        a.generation
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The bolt behind every worker's window firer: records each firing.
struct FiredSink {
    world: Shared,
    worker: u32,
}

impl Bolt for FiredSink {
    async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        let window = format!("{}@{}", t.get_str("key")?, t.get_i64("window_start")?);
        let count = t.get_i64("count")? as u64;
        let crashed = {
            let mut w = lock(&self.world);
            let crashed = w.net(self.worker).0;
            if !crashed {
                w.event(format!("w{} fired {window}: {count}", self.worker));
                w.checks.firings += 1;
                w.checks.fired.entry(window).or_default().push(count);
            }
            crashed
        };
        if crashed {
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

/// A bolt that takes time (0 to `max_ms` of simulated time per tuple, drawn from the seed) beside
/// the checking sink: the spout's tuple trees, and a window firer's firings, complete only once
/// it is done, so handoffs, drains, checkpoints and firings wait on tuples in flight.
struct Slow {
    world: Shared,
    worker: u32,
    max_ms: u64,
}

impl Bolt for Slow {
    async fn execute(&mut self, _t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        let ms = lock(&self.world).rng.range(0, self.max_ms);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        if lock(&self.world).net(self.worker).0 {
            // A crashed process does nothing more.
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

/// Per key: the records put with it, over every stream (what exactly-once must count).
fn expected_counts(w: &World) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (id, n) in &w.checks.put {
        let key = id.split_once('/').map_or(id.as_str(), |(_, k)| k);
        *out.entry(key.to_string()).or_default() += n;
    }
    out
}

/// Per key: the count the state table holds in `scope`.
fn counts(w: &World, scope: &str) -> BTreeMap<String, u64> {
    w.state
        .items()
        .into_iter()
        .filter(|(_, s, _, _)| s == scope)
        .map(|(_, _, key, item)| (key, serde_json::from_slice(&item.state).unwrap_or(0)))
        .collect()
}

/// Keys whose count in `scope` is not the records put with them.
fn wrong_counts(w: &World, scope: &str) -> Vec<String> {
    let (counted, expected) = (counts(w, scope), expected_counts(w));
    expected
        .iter()
        .filter(|(k, n)| counted.get(*k).copied().unwrap_or(0) != **n)
        .map(|(k, n)| format!("{k}: {} counted for {n} put", counted.get(k).copied().unwrap_or(0)))
        .chain(counted.keys().filter(|k| !expected.contains_key(*k)).map(|k| format!("{k}: counted, never put")))
        .collect()
}

/// [`wrong_counts`] of the third stage: per key, or its one global total.
fn wrong_finals(w: &World, global: bool) -> Vec<String> {
    if !global {
        return wrong_counts(w, FINALS_SCOPE);
    }
    let expected: u64 = expected_counts(w).values().sum();
    let counted = counts(w, FINALS_SCOPE);
    let total = counted.get(GLOBAL_KEY).copied().unwrap_or(0);
    let mut wrong: Vec<String> = counted
        .keys()
        .filter(|k| k.as_str() != GLOBAL_KEY)
        .map(|k| format!("{k}: counted, never a key of the global total"))
        .collect();
    if total != expected {
        wrong.push(format!("{GLOBAL_KEY}: {total} counted for {expected} put"));
    }
    wrong
}

/// Records (`stream/key:n`) the second stage of a staged at-least-once run has not got.
fn missing_downstream(w: &World) -> Vec<String> {
    let mut out = Vec::new();
    for (k, count) in &w.checks.put {
        for n in w.checks.optional(k)..*count {
            if !w.checks.downstream.get(k).is_some_and(|d| d.contains(&n)) {
                out.push(format!("{k}:{n}"));
            }
        }
    }
    out
}

/// Puts records `ns` of `key` as one KPL aggregate with an explicit hash key of the key's own
/// routing point (not the user records' hash), as an aggregating producer that is not the KPL
/// may; counts the user records that land outside their shard's hash range.
fn put_aggregate(w: &mut World, stream: &str, key: &str, ns: &[u64]) {
    use squall::kinesis::kpl;
    let datas: Vec<String> = ns.iter().map(|i| format!("{key}:{i}")).collect();
    let users: Vec<kpl::NewUserRecord<'_>> = datas
        .iter()
        .map(|d| kpl::NewUserRecord { partition_key: key, explicit_hash_key: None, data: d.as_bytes() })
        .collect();
    let agg = match kpl::aggregate(&users) {
        Ok(a) => a,
        Err(e) => return w.violation(format!("aggregating {} records of {stream}/{key}: {e}", ns.len())),
    };
    let route = kpl::partition_key_hash(&format!("route/{key}"));
    match w.kinesis.put_record(stream, &agg.partition_key, &agg.data, Some(route)) {
        Ok((shard, seq)) => {
            let own = kpl::partition_key_hash(key);
            let outside = w
                .kinesis
                .list_shards(stream)
                .unwrap_or_default()
                .iter()
                .find(|s| s.shard_id == shard)
                .is_some_and(|s| own < s.start_hash || own > s.end_hash);
            for _ in ns.iter().filter(|_| outside) {
                w.injected("kpl user record outside its shard");
            }
            let list = ns.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
            w.event(format!(
                "put {stream}/{key}:[{list}] as one KPL aggregate -> {shard} {seq}{}",
                if outside { " (outside the shard's hash range)" } else { "" }
            ));
        }
        Err(e) => w.violation(format!("the model refused a put: {e:?}")),
    }
}

/// The sink of every worker: checks each delivery.
struct Sink {
    world: Shared,
    worker: u32,
    task: usize,
}

/// Sink tasks per worker.
const SINK_TASKS: usize = 2;

/// The enhanced fan-out consumer's name (`--consumer efo:sim`).
const EFO_CONSUMER: &str = "sim";

impl Bolt for Sink {
    async fn prepare(&mut self, ctx: &squall::topology::TaskContext) -> Result<(), ComponentError> {
        self.task = ctx.task_index();
        Ok(())
    }

    async fn on_watermark(
        &mut self,
        wm: squall::topology::Watermark,
        _out: &mut BoltOutput,
    ) -> Result<(), ComponentError> {
        lock(&self.world).checks.inband.insert((self.worker, self.task), wm.millis());
        Ok(())
    }

    async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        let (key, n) = record_of(&t)?;
        let (shard, sequence) = (t.get_str("shard_id")?.to_string(), t.get_str("sequence_number")?.to_string());
        let sub = t.get_u64("sub_sequence")?;
        let stream = t.get_str("stream")?.to_string();
        let crashed = {
            let mut w = lock(&self.world);
            let crashed = w.net(self.worker).0;
            if !crashed {
                w.deliver(self.worker, &stream, &key, n, &shard, (&sequence, sub));
            }
            crashed
        };
        if crashed {
            // A crashed process does nothing more.
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    worker: squall::WorkerArgs,
}

struct Fleet {
    world: Shared,
    name: String,
    scenario: Scenario,
    handles: BTreeMap<u32, JoinHandle<()>>,
    started: BTreeMap<u32, Instant>,
    next_id: u32,
    /// Simulated ms of workers that ended.
    worker_ms: u64,
    /// The workers' `--spout-config` file, if the scenario needs one (removed at the end).
    spout_config: Option<std::path::PathBuf>,
    /// Whether the operator drained (or killed) the deployment already (once per run).
    drained: bool,
    /// Which of the operator's deactivations are rebalances (a stream of its own).
    op_rng: Rng,
    /// An operator's command runs: one at a time (two operators' commands at once do not
    /// compose: a rebalance begun during another's, or during a deactivation, takes INACTIVE for
    /// the state to restore).
    operating: Rc<Cell<bool>>,
    /// Each running worker's shutdown (a graceful stop, as on SIGTERM).
    stops: BTreeMap<u32, tokio::sync::oneshot::Sender<()>>,
}

impl Fleet {
    fn start_worker(&mut self) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        let endpoint = format!("{}-w{id}", self.name);
        squall::coord::zkapi::register_connector(
            &endpoint,
            Arc::new(SimConnector { world: self.world.clone(), worker: id }),
        );
        squall::spout::register_shard_api(&endpoint, Arc::new(SimKinesis { world: self.world.clone(), worker: id }));
        squall::state::register_state_api(&endpoint, Arc::new(SimState { world: self.world.clone(), worker: id }));
        let eo = self.scenario.exactly_once.then(|| {
            StateConfig::new(StateEndpoint {
                endpoint: format!("sim://{endpoint}"),
                region: "us-east-1".into(),
                table: "sim".into(),
            })
        });
        lock(&self.world).net.insert(id, Net::default());
        let mut flags = vec![
            "sim".to_string(),
            "--topology=sim".into(),
            format!("--stream={}", self.scenario.streams.join(",")),
            format!("--zk=sim://{endpoint}"),
            "--zk-root=/squall".into(),
            format!("--zk-session-timeout-ms={SESSION_TIMEOUT_MS}"),
            "--zk-give-up-after-ms=600000".into(),
            format!("--endpoint=sim://api/{endpoint}"),
            format!("--spout-tasks={}", self.scenario.spout_tasks),
            "--message-timeout-ms=10000".into(),
            format!("--initial-position={}", self.scenario.initial),
            // Idle spouts poll every 10 ms instead of every 1: a tenth of the wake-ups, which
            // are most of a run's CPU.
            "--spout-idle-sleep-us=10000".into(),
        ];
        if let Some(path) = &self.spout_config {
            flags.push(format!("--spout-config={}", path.display()));
        }
        if self.scenario.efo {
            flags.push(format!("--consumer=efo:{EFO_CONSUMER}"));
        }
        let args = Cli::parse_from(flags).worker;
        let world = self.world.clone();
        let sink_world = self.world.clone();
        let fired_world = self.world.clone();
        let window_ms = self.scenario.window_ms;
        let firer_zk = args.spout_config().expect("the workers' spout configuration").zookeeper.to_zk_config();
        let streams = self.scenario.streams.clone();
        lock(&world).event(format!("w{id} starts"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        self.stops.insert(id, stop);
        // a dropped sender (the run's end) is no shutdown
        let shutdown = async move {
            if stopped.await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let (mid_shards, third, down_world) = (self.scenario.mid_shards, self.scenario.third, self.world.clone());
        let (slow_ms, slow_world) = (self.scenario.slow_ms, self.world.clone());
        let global_finals = self.scenario.global_finals;
        let handle = tokio::task::spawn_local(async move {
            let staged_eo = eo.clone().filter(|_| mid_shards > 0);
            let first = Stages::new("main", move |b, spout| {
                b.set_bolt("sink", SINK_TASKS, move |_| Sink { world: sink_world.clone(), worker: id, task: 0 })
                    .fields_grouping(spout, &["partition_key"]);
                let mut fires = false;
                match eo {
                    Some(cfg) if mid_shards > 0 => {
                        let mut cfg = cfg;
                        cfg.production_ids = true;
                        let fields = with_production_fields(&TALLY_FIELDS);
                        b.set_bolt("eo", 2, move |_| ExactlyOnce::new(cfg.clone(), CountAndTally))
                            .fields_grouping(spout, &["partition_key"])
                            .fields(&fields.iter().map(String::as_str).collect::<Vec<_>>());
                    }
                    Some(cfg) if window_ms > 0 => {
                        let windows = Tumbling::new(window_ms, CountPerWindow);
                        let for_bolt = windows.clone();
                        let eo_cfg = cfg.clone();
                        b.set_bolt("eo", 2, move |_| ExactlyOnce::new(eo_cfg.clone(), for_bolt.clone()))
                            .fields_grouping(spout, &["partition_key"]);
                        let firer = FirerConfig::new(cfg, "eo", firer_zk, streams[0].clone()).with_streams(streams);
                        let fields: Vec<&str> =
                            ["key", "window_start", "count"].into_iter().chain(FIRE_FIELDS).collect();
                        b.set_spout("fire", 1, move |_| WindowFirer::new(firer.clone(), windows.clone()))
                            .fields(&fields);
                        b.set_bolt("fired", 1, move |_| FiredSink { world: fired_world.clone(), worker: id })
                            .shuffle_grouping("fire");
                        fires = true;
                    }
                    Some(cfg) => {
                        b.set_bolt("eo", 2, move |_| ExactlyOnce::new(cfg.clone(), CountByKey))
                            .fields_grouping(spout, &["partition_key"]);
                    }
                    None if mid_shards > 0 => {
                        b.set_bolt("relay", 2, |_| Relay)
                            .fields_grouping(spout, &["partition_key"])
                            .fields(&RELAY_FIELDS);
                    }
                    None => {}
                }
                if slow_ms > 0 {
                    let world = slow_world.clone();
                    let mut d =
                        b.set_bolt("slow", 2, move |_| Slow { world: world.clone(), worker: id, max_ms: slow_ms });
                    d.shuffle_grouping(spout);
                    if fires {
                        d.shuffle_grouping("fire");
                    }
                }
            });
            let stages = match staged_eo {
                _ if mid_shards == 0 => first,
                Some(cfg) => {
                    let (mut second, last) = (cfg.clone(), cfg);
                    second.production_ids = third;
                    let two = first.then(
                        Boundary::new("mid", "eo", &TALLY_FIELDS)
                            .key(&["key"])
                            .shards(mid_shards as i32)
                            .exactly_once(),
                        "down",
                        move |b, input| {
                            let fields = with_production_fields(&TALLY_FIELDS);
                            let mut d = b.set_bolt("totals", 2, move |_| {
                                ExactlyOnce::new(second.clone(), SumTallies { relay: third, global: false })
                            });
                            d.fields_grouping(input, &["key"]);
                            if third {
                                d.fields(&fields.iter().map(String::as_str).collect::<Vec<_>>());
                            }
                        },
                    );
                    if third {
                        two.then(
                            Boundary::new("mid2", "totals", &TALLY_FIELDS)
                                .key(&["key"])
                                .shards(mid_shards as i32)
                                .exactly_once(),
                            "fin",
                            move |b, input| {
                                let mut d = b.set_bolt("finals", 2, move |_| {
                                    ExactlyOnce::new(last.clone(), SumTallies { relay: false, global: global_finals })
                                });
                                if global_finals {
                                    d.global_grouping(input);
                                } else {
                                    d.fields_grouping(input, &["key"]);
                                }
                            },
                        )
                    } else {
                        two
                    }
                }
                None => first.then(
                    Boundary::new("mid", "relay", &RELAY_FIELDS).key(&["key"]).shards(mid_shards as i32),
                    "down",
                    move |b, input| {
                        b.set_bolt("sink", 2, move |_| StageSink { world: down_world.clone(), worker: id })
                            .fields_grouping(input, &["key"]);
                    },
                ),
            };
            let r = squall::stage::run_until(args, stages, shutdown).await;
            let mut w = lock(&world);
            let crashed = w.net(id).0;
            match r {
                _ if crashed => {}
                Ok(()) => w.event(format!("w{id} exited: ok")),
                // Nothing in a run gives a worker cause to give up (ZooKeeper's give-up time is
                // longer than the run): an exit with an error is a fault it did not survive.
                Err(e) => w.violation(format!("w{id} exited with an error: {e:#}")),
            }
        });
        self.handles.insert(id, handle);
        self.started.insert(id, Instant::now());
        id
    }

    /// Workers that run (neither crashed nor exited).
    fn live(&self) -> Vec<u32> {
        let w = lock(&self.world);
        self.handles.iter().filter(|(id, h)| !w.net(**id).0 && !h.is_finished()).map(|(id, _)| *id).collect()
    }

    fn crash(&mut self, id: u32) {
        {
            let mut w = lock(&self.world);
            let now = w.now_ms();
            let net = w.net.entry(id).or_default();
            net.crashed = true;
            net.cut = Some((Cut::Hang, now, i64::MAX));
            w.injected("crash");
            w.event(format!("FAULT w{id} crashes"));
        }
        if let Some(h) = self.handles.get(&id) {
            h.abort();
        }
        if let Some(t) = self.started.remove(&id) {
            self.worker_ms += t.elapsed().as_millis() as u64;
        }
    }
}

/// Runs one seed to its end on this thread (a fresh current-thread runtime on a paused clock).
pub fn run_seed(seed: u64) -> Outcome {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    // The workers' futures are not Send (a topology's build closure): they run on a LocalSet.
    let out = rt.block_on(tokio::task::LocalSet::new().run_until(run(seed)));
    drop(rt);
    out
}

async fn run(seed: u64) -> Outcome {
    let mut rng = Rng::new(seed);
    let scenario = Scenario::draw(seed, &mut rng);
    let name = format!("sim{seed}");
    let epoch_ms = EPOCH_MS;
    let world: Shared =
        Arc::new(Mutex::new(World::new(seed, epoch_ms, "/squall/topologies/sim".into(), scenario.streams.clone())));
    let start = lock(&world).start;
    let skew = scenario.skew_ms;
    squall::coord::set_thread_clock(Some(Arc::new(move || epoch_ms + skew + start.elapsed().as_millis() as i64)));
    {
        let mut w = lock(&world);
        w.faults = scenario.faults.clone();
        (w.checks.required_from_ms, w.checks.latest_slack_ms) = match (scenario.initial.as_str(), scenario.at_ms) {
            ("latest", _) => (None, 200),
            (_, Some(at)) => (Some(at), 0),
            _ => (Some(0), 0),
        };
        w.kinesis.set_now(epoch_ms);
        for stream in &scenario.streams {
            w.kinesis.create_stream(stream, scenario.shards).expect("stream");
        }
        w.zk.set_now(epoch_ms);
        if scenario.mid_shards > 0 {
            w.intermediate.push(MID.to_string());
        }
        if scenario.third {
            w.intermediate.push(MID2.to_string());
        }
        w.event(format!("seed {seed}: {scenario:?}"));
    }
    let mut fleet = Fleet {
        world: world.clone(),
        name,
        scenario: scenario.clone(),
        handles: BTreeMap::new(),
        started: BTreeMap::new(),
        next_id: 1,
        worker_ms: 0,
        spout_config: None,
        drained: false,
        op_rng: Rng::new(seed ^ 0x0B0B_B0B0_7E7E_E7E7),
        operating: Rc::default(),
        stops: BTreeMap::new(),
    };
    if scenario.committed_interval_ms > 0 || scenario.resync_ms > 0 || scenario.efo {
        let path = std::env::temp_dir().join(format!("squall-sim-{}-{seed}.json", std::process::id()));
        let mut cfg = serde_json::json!({});
        if scenario.committed_interval_ms > 0 {
            cfg["committed_watermark_interval_ms"] = scenario.committed_interval_ms.into();
        }
        if scenario.resync_ms > 0 {
            cfg["resync_interval_ms"] = scenario.resync_ms.into();
        }
        if scenario.efo {
            cfg["efo"] = serde_json::json!({"silence_timeout_ms": scenario.efo_silence_ms});
            if scenario.efo_renew_ms > 0 {
                cfg["efo"]["renew_after_ms"] = scenario.efo_renew_ms.into();
            }
        }
        std::fs::write(&path, cfg.to_string()).expect("writing the workers' spout configuration");
        fleet.spout_config = Some(path);
    }

    // The server's session clock.
    let ticker = {
        let world = world.clone();
        tokio::spawn(async move {
            loop {
                sleep(Duration::from_millis(50)).await;
                tick_sessions(&mut lock(&world));
            }
        })
    };
    // The producers.
    let producer = {
        let world = world.clone();
        let (keys, rate, streams, kpl) = (scenario.keys, scenario.rate, scenario.streams.clone(), scenario.kpl);
        tokio::spawn(async move {
            let mut carry = 0u64;
            while start.elapsed() < Duration::from_millis(PRODUCE_MS) {
                sleep(Duration::from_millis(100)).await;
                let mut w = lock(&world);
                carry += rate;
                let n = carry / 10;
                carry %= 10;
                let now = w.now_ms();
                w.kinesis.set_now(now);
                // with `kpl`: this tick's user records per (stream, key), in put order
                let mut aggregates: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
                for _ in 0..n {
                    let key = format!("k{}", w.rng.below(u64::from(keys)));
                    let stream = streams[w.rng.below(streams.len() as u64) as usize].clone();
                    // the checks number records per stream and key
                    let id = format!("{stream}/{key}");
                    let count = w.checks.put.entry(id.clone()).or_default();
                    let i = *count;
                    *count += 1;
                    let t = start.elapsed().as_millis() as u64;
                    w.checks.put_at.entry(id.clone()).or_default().push(t);
                    w.checks.undelivered.entry(stream.clone()).or_default().insert((now, id.clone(), i));
                    w.checks.arrival.entry(id.clone()).or_default().push(now);
                    if kpl {
                        aggregates.entry((stream, key)).or_default().push(i);
                        continue;
                    }
                    let put = w.kinesis.put_record(&stream, &key, format!("{key}:{i}").as_bytes(), None);
                    match put {
                        Ok((shard, seq)) => w.event(format!("put {id}:{i} -> {shard} {seq}")),
                        Err(e) => w.violation(format!("the model refused a put: {e:?}")),
                    }
                }
                for ((stream, key), ns) in aggregates {
                    put_aggregate(&mut w, &stream, &key, &ns);
                }
            }
        })
    };

    for _ in 0..scenario.workers {
        fleet.start_worker();
        let d = lock(&world).rng.range(0, 500);
        sleep(Duration::from_millis(d)).await;
    }

    // Faults.
    sleep(Duration::from_millis(FAULTS_FROM_MS).saturating_sub(start.elapsed())).await;
    while start.elapsed() < Duration::from_millis(FAULTS_UNTIL_MS) {
        let d = lock(&world).rng.range(500, 4000);
        sleep(Duration::from_millis(d)).await;
        // Workers that left a drained deployment are started again (a supervisor's restart).
        while fleet.live().len() < scenario.workers as usize {
            fleet.start_worker();
        }
        inject(&mut fleet);
    }
    {
        let mut w = lock(&world);
        w.faults.on = false;
        let now = w.now_ms();
        for net in w.net.values_mut() {
            if !net.crashed {
                net.cut = None;
            }
        }
        w.event(format!("faults end at {}", now - epoch_ms));
    }
    // At least as many workers as at the start.
    while fleet.live().len() < scenario.workers as usize {
        fleet.start_worker();
    }

    // Liveness: every record delivered within SETTLE_MS after the producers stopped.
    let _ = producer.await;
    let deadline = Duration::from_millis(PRODUCE_MS.max(FAULTS_UNTIL_MS) + SETTLE_MS);
    loop {
        let live = fleet.live();
        let done = {
            let w = lock(&world);
            w.checks.put.iter().all(|(k, count)| {
                let from = w.checks.optional(k);
                (from..*count).all(|n| w.checks.delivered.get(k).is_some_and(|d| d.contains(&n)))
            }) && match (scenario.exactly_once, scenario.window_ms, scenario.mid_shards) {
                (false, _, 0) => true,
                (false, _, _) => missing_downstream(&w).is_empty(),
                (true, 0, 0) => wrong_counts(&w, COUNTS_SCOPE).is_empty(),
                (true, 0, _) => {
                    wrong_counts(&w, COUNTS_SCOPE).is_empty()
                        && wrong_counts(&w, TOTALS_SCOPE).is_empty()
                        && (!scenario.third || wrong_finals(&w, scenario.global_finals).is_empty())
                }
                (true, size, _) => wrong_windows(&w, size).is_empty(),
            } && assignment_settled(&w).is_ok()
                && inband_stalled(&w, &live).is_empty()
        };
        if done || start.elapsed() >= deadline {
            break;
        }
        // Workers that left a drained deployment are started again (a supervisor's restart:
        // they deploy it anew).
        while fleet.live().len() < scenario.workers as usize {
            fleet.start_worker();
        }
        sleep(Duration::from_millis(500)).await;
    }
    let sim_ms = start.elapsed().as_millis() as u64;
    let live = fleet.live();
    for (_, t) in std::mem::take(&mut fleet.started) {
        fleet.worker_ms += t.elapsed().as_millis() as u64;
    }
    let mut w = lock(&world);
    let mut lost = Vec::new();
    let mut records = 0;
    for (k, count) in &w.checks.put {
        records += count;
        for n in w.checks.optional(k)..*count {
            if !w.checks.delivered.get(k).is_some_and(|d| d.contains(&n)) {
                lost.push(format!("{k}:{n}"));
            }
        }
    }
    if !lost.is_empty() {
        let what = format!(
            "liveness: {} of {records} records not delivered {} s after the producers stopped and the faults ended (first: {})",
            lost.len(),
            SETTLE_MS / 1000,
            lost.iter().take(8).cloned().collect::<Vec<_>>().join(", ")
        );
        w.violation(what);
    }
    if let Err(what) = assignment_settled(&w) {
        let what = format!(
            "liveness: the coordination did not settle {} s after the producers stopped and the faults ended: {what}",
            SETTLE_MS / 1000
        );
        w.violation(what);
    }
    let stalled = inband_stalled(&w, &live);
    if !stalled.is_empty() {
        let what = format!(
            "liveness: the in-band low watermark did not pass the last record {} s after the producers stopped and the faults ended: {}",
            SETTLE_MS / 1000,
            stalled.join("; ")
        );
        w.violation(what);
    }
    if scenario.window_ms > 0 {
        let wrong = wrong_windows(&w, scenario.window_ms);
        if !wrong.is_empty() {
            let what = format!(
                "windows wrong: {} of {}: {}",
                wrong.len(),
                expected_windows(&w, scenario.window_ms).len(),
                wrong.iter().take(8).cloned().collect::<Vec<_>>().join("; ")
            );
            w.violation(what);
        }
    } else if scenario.exactly_once {
        let scopes: &[(&str, &str)] = match (scenario.mid_shards, scenario.third) {
            (0, _) => &[(COUNTS_SCOPE, "the")],
            (_, false) => &[
                (COUNTS_SCOPE, "the first stage's"),
                (TOTALS_SCOPE, "the second stage's (over the intermediate stream)"),
            ],
            (_, true) => &[
                (COUNTS_SCOPE, "the first stage's"),
                (TOTALS_SCOPE, "the second stage's (over the intermediate stream)"),
                (FINALS_SCOPE, "the third stage's (over the second intermediate stream)"),
            ],
        };
        for (scope, which) in scopes {
            let wrong =
                if *scope == FINALS_SCOPE { wrong_finals(&w, scenario.global_finals) } else { wrong_counts(&w, scope) };
            if !wrong.is_empty() {
                let what = format!(
                    "exactly-once counts wrong in {which} table for {} keys: {}",
                    wrong.len(),
                    wrong.join(", ")
                );
                w.violation(what);
            }
        }
    } else if scenario.mid_shards > 0 {
        let missing = missing_downstream(&w);
        if !missing.is_empty() {
            let what = format!(
                "liveness: {} of {records} records never reached the second stage (through {MID}) {} s after the producers stopped and the faults ended (first: {})",
                missing.len(),
                SETTLE_MS / 1000,
                missing.iter().take(8).cloned().collect::<Vec<_>>().join(", ")
            );
            w.violation(what);
        }
    }
    let deliveries = w.checks.deliveries;
    w.event(format!("end: {records} records, {deliveries} deliveries"));
    ticker.abort();
    for h in fleet.handles.values() {
        h.abort();
    }
    let out = Outcome {
        seed,
        trace_hash: format!("{:016x}", w.trace.hash()),
        events: w.trace.events,
        sim_ms,
        worker_ms: fleet.worker_ms,
        records,
        deliveries: w.checks.deliveries,
        checkpoint_writes: w.checks.checkpoint_writes,
        fenced_writes: w.checks.fenced_writes,
        committed_checks: w.checks.committed_checks,
        firings: w.checks.firings,
        stages: 1 + u32::from(scenario.mid_shards > 0) + u32::from(scenario.third),
        injected: w.injected.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        scenario: format!("{scenario:?}"),
        violations: w.checks.violations.clone(),
        tail: w.trace.tail(),
    };
    drop(w);
    if let Some(path) = &fleet.spout_config {
        let _ = std::fs::remove_file(path);
    }
    squall::coord::set_thread_clock(None);
    out
}

/// The operator's command (`squall deactivate` then `squall activate` `back_after` ms later, or
/// `squall drain`), through the CLI's own operations, over a ZooKeeper session of its own that
/// no fault touches.
async fn operate(world: Shared, name: String, kind: &'static str, back_after: u64) {
    use squall::cli::topology_ops::{Collected, drain_topology, kill_topology, rebalance_topology, set_active};
    let endpoint = format!("{name}-operator");
    squall::coord::zkapi::register_connector(&endpoint, Arc::new(SimConnector { world: world.clone(), worker: 0 }));
    lock(&world).net.insert(0, Net::default());
    let cfg = squall::coord::ZkConfig::new(format!("sim://{endpoint}"))
        .with_root("/squall")
        .with_session_timeout(Duration::from_millis(SESSION_TIMEOUT_MS));
    let mut out = Collected::default();
    let steps: Vec<(&str, u64)> = match kind {
        "drain" => vec![("drain", 0)],
        "kill" => vec![("kill", 0)],
        "rebalance" => vec![("rebalance", 0)],
        _ => vec![("deactivate", 0), ("activate", back_after)],
    };
    for (step, after) in steps {
        sleep(Duration::from_millis(after)).await;
        // The command is run again until it goes through, as an operator would.
        for attempt in 1..=10 {
            let r = match step {
                "drain" => drain_topology(&cfg, "sim", None, &mut out).await,
                // waits up to 10 s for the shards to be handed back, the leader 2 s for the tasks
                "rebalance" => rebalance_topology(&cfg, "sim", 10, 2, &mut out).await,
                // the workers get 2 s for their in-flight tuples
                "kill" => kill_topology(&cfg, "sim", Some(2), &mut out).await,
                s => set_active(&cfg, "sim", s == "activate", &mut out).await,
            };
            // A kill that marked the topology KILLED is done even when its wait for the workers
            // to stop ran out: the supervisor starts them again meanwhile (they deploy anew).
            let done = match &r {
                Ok(()) => true,
                Err(e) => step == "kill" && format!("{e:#}").contains("marked KILLED"),
            };
            match r {
                Ok(()) => lock(&world).event(format!("operator: {step} done")),
                Err(e) => lock(&world).event(format!("operator: {step} failed (attempt {attempt}): {e:#}")),
            }
            if done {
                break;
            }
            sleep(Duration::from_millis(500)).await;
        }
    }
}

/// One fault, chosen among the scenario's kinds.
fn inject(fleet: &mut Fleet) {
    let s = fleet.scenario.clone();
    let mut kinds: Vec<&str> = Vec::new();
    if s.partitions {
        kinds.push("partition");
    }
    if s.freezes {
        kinds.push("freeze");
    }
    if s.crashes {
        kinds.push("crash");
    }
    if s.reshards {
        kinds.push("reshard");
    }
    if s.joins {
        kinds.push("join");
    }
    if s.leaves {
        kinds.push("leave");
    }
    if s.efo && lock(&fleet.world).injected.get("efo consumer deregistered").is_none_or(|n| *n < 2) {
        kinds.push("deregister");
    }
    if s.operator && !fleet.operating.get() {
        kinds.push("deactivate");
        if !fleet.drained {
            kinds.push("drain");
        }
    }
    if kinds.is_empty() {
        return;
    }
    let live = fleet.live();
    let world = fleet.world.clone();
    let mut w = lock(&world);
    let kind = kinds[w.rng.below(kinds.len() as u64) as usize];
    let pick = |w: &mut World| live.get(w.rng.below(live.len() as u64) as usize).copied();
    match kind {
        "partition" | "freeze" => {
            let Some(id) = pick(&mut w) else { return };
            let ms = w.rng.range(500, 9000) as i64;
            let now = w.now_ms();
            let cut = if kind == "partition" { Cut::ZkFails } else { Cut::Hang };
            if let Some(net) = w.net.get_mut(&id)
                && net.cut.is_none_or(|(_, _, until)| until <= now)
            {
                net.cut = Some((cut, now, now + ms));
                w.injected(if kind == "partition" { "partition from zk" } else { "freeze" });
                w.event(format!("FAULT w{id} {kind} for {ms} ms"));
            }
        }
        "crash" => {
            if live.len() < 2 && fleet.handles.len() > 6 {
                return;
            }
            let Some(id) = pick(&mut w) else { return };
            drop(w);
            fleet.crash(id);
            // Its replacement (a new process, a new worker id).
            fleet.start_worker();
        }
        "leave" => {
            let Some(id) = pick(&mut w) else { return };
            let Some(stop) = fleet.stops.remove(&id) else { return };
            w.injected("leave");
            w.event(format!("FAULT w{id} leaves (its process shuts down, as on SIGTERM)"));
            let _ = stop.send(());
        }
        "join" => {
            if live.len() >= 4 {
                return;
            }
            w.injected("join");
            w.event("FAULT a worker joins");
            drop(w);
            fleet.start_worker();
        }
        "deactivate" | "drain" => {
            let back_after = w.rng.range(500, 5000);
            // rebalances and kills come from a stream of their own: the runs without them draw
            // what they drew before
            let kind = match kind {
                "deactivate" if s.rebalances > 0.0 && fleet.op_rng.chance(s.rebalances) => "rebalance",
                "drain" if s.kill => "kill",
                k => k,
            };
            w.injected(kind);
            w.event(format!("FAULT the operator {kind}s the topology"));
            drop(w);
            if kind == "drain" || kind == "kill" {
                fleet.drained = true;
            }
            let (world, name) = (fleet.world.clone(), fleet.name.clone());
            let operating = fleet.operating.clone();
            operating.set(true);
            tokio::task::spawn_local(async move {
                operate(world, name, kind, back_after).await;
                operating.set(false);
            });
        }
        "deregister" => {
            // someone deletes the stream consumer under the running workers (they register it
            // again)
            let now = w.now_ms();
            w.kinesis.set_now(now);
            let stream = s.streams[w.rng.below(s.streams.len() as u64) as usize].clone();
            let r = w.kinesis.stream_arn(&stream).and_then(|arn| w.kinesis.deregister_consumer(&arn, EFO_CONSUMER));
            w.injected("efo consumer deregistered");
            w.event(format!("FAULT the stream consumer {EFO_CONSUMER} of {stream} is deregistered: {r:?}"));
        }
        "reshard" => {
            let now = w.now_ms();
            w.kinesis.set_now(now);
            // a source stream, or (once a worker created it) an intermediate one
            let mut streams = w.streams.clone();
            streams.extend(w.intermediate.iter().filter(|s| w.kinesis.list_shards(s).is_ok()).cloned());
            let stream = streams[w.rng.below(streams.len() as u64) as usize].clone();
            let open: Vec<_> = w
                .kinesis
                .list_shards(&stream)
                .unwrap_or_default()
                .into_iter()
                .filter(|s| s.end_seq.is_none())
                .collect();
            if open.len() >= 2 && w.rng.chance(0.4) {
                // Merge two adjacent open shards.
                let mut sorted = open.clone();
                sorted.sort_by_key(|s| s.start_hash);
                let i = w.rng.below(sorted.len() as u64 - 1) as usize;
                let (a, b) = (sorted[i].shard_id.clone(), sorted[i + 1].shard_id.clone());
                let r = w.kinesis.merge_shards(&stream, &a, &b);
                w.injected("merge");
                w.event(format!("FAULT merge {stream}/{a} + {b}: {r:?}"));
            } else if open.len() < 8 {
                let sh = open[w.rng.below(open.len() as u64) as usize].clone();
                let mid = sh.start_hash / 2 + sh.end_hash / 2;
                let r = w.kinesis.split_shard(&stream, &sh.shard_id, mid);
                w.injected("split");
                w.event(format!("FAULT split {stream}/{} at {mid}: {r:?}", sh.shard_id));
            }
        }
        _ => {}
    }
}
