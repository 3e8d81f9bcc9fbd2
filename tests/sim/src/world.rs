//! The simulated world every worker of a run shares: the models of ZooKeeper and Kinesis, the
//! network between each worker and them, the seed's random stream, the trace, and the checks of
//! the invariants made as the run goes.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use squall::coord::{
    Assignment, Checkpoint, CheckpointPosition, PublishedWatermark, WatermarkReport, committed_watermark, sequence_cmp,
};
use squall_test_support::kinesismodel::KinesisModel;
use squall_test_support::statemodel::StateModel;
use squall_test_support::zkmodel::ZkModel;
use tokio::sync::watch;
use tokio::time::Instant;
use zookeeper_client as zk;

/// SplitMix64: the run's one random stream (every choice the simulator makes).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }
    /// `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

/// The events of a run: hashed as they come (the run's fingerprint), the last ones kept to be
/// printed when a check fails.
pub struct Trace {
    hasher: DefaultHasher,
    tail: VecDeque<String>,
    pub events: u64,
    /// Print every event as it comes (`SQUALL_SIM_TRACE=1`).
    pub echo: bool,
}

/// How many of the last events a failing run prints.
pub const TRACE_TAIL: usize = 300;

impl Trace {
    fn new() -> Self {
        // DefaultHasher::new() has fixed keys: the same events give the same hash in every process.
        let echo = std::env::var("SQUALL_SIM_TRACE").is_ok_and(|v| v == "1");
        Trace { hasher: DefaultHasher::new(), tail: VecDeque::new(), events: 0, echo }
    }
    pub fn hash(&self) -> u64 {
        self.hasher.finish()
    }
    pub fn tail(&self) -> Vec<String> {
        self.tail.iter().cloned().collect()
    }
}

/// How a cut worker's calls end while the cut lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// Cut from ZooKeeper only: its calls fail with ConnectionLoss; Kinesis answers.
    ZkFails,
    /// Frozen off both: every call (and watch) waits for the end of the cut, then goes on;
    /// answers in flight arrive late.
    Hang,
}

/// One worker's place in the network.
#[derive(Debug, Default)]
pub struct Net {
    pub crashed: bool,
    /// (kind, since ms, until ms).
    pub cut: Option<(Cut, i64, i64)>,
}

/// The server's and client's view of one session.
pub struct SimSession {
    pub worker: u32,
    pub timeout_ms: i64,
    pub state: watch::Sender<zk::SessionState>,
    /// Closed by its client (dropped): gone, no expiry due.
    pub closed: bool,
}

/// The faults a run injects, drawn from its seed.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Faults {
    /// A ZooKeeper request fails without reaching the server.
    pub zk_lost_before: f64,
    /// A ZooKeeper request is applied, and its answer lost.
    pub zk_lost_after: f64,
    /// A Kinesis call is throttled.
    pub throttle: f64,
    /// A ListShards answer leaves out one shard.
    pub listing_omits: f64,
    /// A state table call is throttled.
    #[serde(default)]
    pub state_throttle: f64,
    /// A state table call is applied, and its answer lost.
    #[serde(default)]
    pub state_lost_after: f64,
    /// A PutRecords call (a stage writer's) is applied, and its answer lost.
    #[serde(default)]
    pub put_lost_after: f64,
    /// An enhanced fan-out subscription goes silent after a few events (its connection hangs:
    /// no event, no error, no end).
    #[serde(default)]
    pub efo_silent: f64,
    /// An enhanced fan-out event is an error instead (InternalFailure: the subscription ends).
    #[serde(default)]
    pub efo_error: f64,
    /// A SubscribeToShard is applied and its answer lost (the next one within 5 s is refused:
    /// ResourceInUse).
    #[serde(default)]
    pub efo_subscribe_lost: f64,
    /// Whether faults are on (off once the fault phase is over).
    pub on: bool,
}

/// A record the producers put: key `k`, its `n`th record.
pub type RecordId = (String, u64);

/// What the checks keep.
#[derive(Default)]
pub struct Checks {
    pub violations: Vec<String>,
    /// Records put, per key: how many (their `n` are `0..count`).
    pub put: BTreeMap<String, u64>,
    /// Per key: when each of its records was put (ms since the start).
    pub put_at: BTreeMap<String, Vec<u64>>,
    /// Records put before this (ms since the start) may be skipped by the initial position:
    /// AT_TIMESTAMP's time; for LATEST, set when the topology's first start is recorded.
    pub required_from_ms: Option<u64>,
    /// LATEST: a record put up to this long after the first start may be skipped (the start is
    /// the worker's clock capped at the service's, which it knows to within about 50 ms).
    pub latest_slack_ms: u64,
    /// Per key: every `n` delivered at least once.
    pub delivered: BTreeMap<String, BTreeSet<u64>>,
    pub deliveries: u64,
    /// The last accepted checkpoint per checkpoint path.
    pub checkpoints: BTreeMap<String, Checkpoint>,
    pub checkpoint_writes: u64,
    pub fenced_writes: u64,
    /// Per shard: the worker whose session holds its lowest lease.
    pub lease_holder: BTreeMap<String, u32>,
    /// When a worker stopped holding a shard's lease (released, or its session ended).
    pub lease_lost: BTreeMap<(String, u32), i64>,
    /// Per `stream/shard`, the checkpoint its holder's hold began from (the holder changed and
    /// the previous one can write no more): `None` for no checkpoint, `Some(None)` finished.
    pub hold_from: BTreeMap<String, Option<Option<(String, u64)>>>,
    /// Deliveries of a record the hold's starting checkpoint covered.
    pub covered_again: u64,
    /// Per key: each record's arrival time (the service's clock, ms), by its `n`.
    pub arrival: BTreeMap<String, Vec<i64>>,
    /// Per stream: records put and not delivered yet, by arrival time (the service's clock, ms),
    /// `(arrival, "{stream}/{key}", n)`.
    pub undelivered: BTreeMap<String, BTreeSet<(i64, String, u64)>>,
    /// Per stream: the highest committed watermark checked (computed from the tasks' reports, or
    /// published by the leader).
    pub committed_checked: BTreeMap<String, i64>,
    /// Committed watermarks checked against the records not delivered.
    pub committed_checks: u64,
    /// Stages: per key, every `n` the next stage's sink got at least once (through the
    /// intermediate stream).
    pub downstream: BTreeMap<String, BTreeSet<u64>>,
    /// Stages: per key, its records' `n` in the order they were first written into the
    /// intermediate stream (a replay may write them out of their put order; the next stage must
    /// deliver them in this order, as it reads each key from one shard lineage).
    pub mid_order: BTreeMap<String, Vec<u64>>,
    /// Stages: per key, the `n` written into the intermediate stream at least once.
    pub mid_written: BTreeMap<String, BTreeSet<u64>>,
    /// The in-band low watermark each sink task (worker, task index) got last.
    pub inband: BTreeMap<(u32, usize), u64>,
    /// Per worker: since when the lifecycle state it last read says INACTIVE.
    pub inactive_since: BTreeMap<u32, i64>,
    /// Records delivered first by a worker that knew the topology INACTIVE (past the slack).
    pub delivered_inactive: u64,
    /// Per window (`key@start`): the count of each firing.
    pub fired: BTreeMap<String, Vec<u64>>,
    pub firings: u64,
}

impl Checks {
    /// How many of `key`'s first records the initial position may skip: neither required nor
    /// ordered by the checks.
    pub fn optional(&self, key: &str) -> u64 {
        let Some(at) = self.put_at.get(key) else { return 0 };
        match self.required_from_ms {
            Some(from) => at.iter().take_while(|t| **t < from).count() as u64,
            // LATEST before the first start: nothing is required yet.
            None => at.len() as u64,
        }
    }
}

/// How long after a worker read INACTIVE a first delivery is still a record in flight.
const INACTIVE_SLACK_MS: i64 = 500;

pub struct World {
    pub rng: Rng,
    pub zk: ZkModel,
    pub kinesis: KinesisModel,
    pub state: StateModel,
    pub trace: Trace,
    pub faults: Faults,
    pub net: BTreeMap<u32, Net>,
    pub sessions: BTreeMap<i64, SimSession>,
    pub checks: Checks,
    /// The simulated wall clock at the start (ms since the epoch) and tokio's (paused) instant then.
    pub epoch_ms: i64,
    pub start: Instant,
    /// The topology's znode (its streams are under `streams/`), for the checks.
    pub topo_path: String,
    /// The streams the topology reads (the first is the primary).
    pub streams: Vec<String>,
    /// The intermediate streams between its stages (read by the later stages' spouts).
    pub intermediate: Vec<String>,
    /// Counters of injected faults, by kind (the report's scenario mix).
    pub injected: BTreeMap<&'static str, u64>,
    /// Per worker: the largest offset of a `Date` its Kinesis answers carried (the service's
    /// clock, whole seconds) from the worker's clock when the answer came.
    pub date_offset: BTreeMap<u32, i64>,
    pid_tag: String,
}

pub type Shared = Arc<Mutex<World>>;

impl World {
    pub fn new(seed: u64, epoch_ms: i64, topo_path: String, streams: Vec<String>) -> Self {
        World {
            rng: Rng::new(seed),
            zk: ZkModel::new(),
            kinesis: KinesisModel::new(),
            state: StateModel::new(),
            trace: Trace::new(),
            faults: Faults::default(),
            net: BTreeMap::new(),
            sessions: BTreeMap::new(),
            checks: Checks::default(),
            epoch_ms,
            start: Instant::now(),
            topo_path,
            streams,
            intermediate: Vec::new(),
            injected: BTreeMap::new(),
            date_offset: BTreeMap::new(),
            pid_tag: format!("-{}-", std::process::id()),
        }
    }

    /// A stream's znode.
    pub fn stream_path(&self, stream: &str) -> String {
        format!("{}/streams/{stream}", self.topo_path)
    }

    /// Simulated milliseconds since the epoch (the services' clock).
    pub fn now_ms(&self) -> i64 {
        self.epoch_ms + self.start.elapsed().as_millis() as i64
    }

    /// Records an event in the trace.
    pub fn event(&mut self, what: impl Into<String>) {
        // Worker ids name the process (host-pid-suffix): the same in every run of a seed but
        // for the pid, which the trace leaves out.
        let what = what.into().replace(&self.pid_tag, "-PID-");
        let line = format!("{:>9} {what}", self.start.elapsed().as_millis());
        line.hash(&mut self.trace.hasher);
        self.trace.events += 1;
        if self.trace.echo {
            println!("{line}");
        }
        self.trace.tail.push_back(line);
        if self.trace.tail.len() > TRACE_TAIL {
            self.trace.tail.pop_front();
        }
    }

    /// Records a broken invariant (and the event).
    pub fn violation(&mut self, what: String) {
        self.event(format!("VIOLATION {what}"));
        if self.checks.violations.len() < 50 {
            self.checks.violations.push(what);
        }
    }

    pub fn injected(&mut self, kind: &'static str) {
        *self.injected.entry(kind).or_default() += 1;
    }

    /// A latency of one leg of a call, 1-20 ms (long tail to 200 ms).
    pub fn latency(&mut self) -> Duration {
        let ms = if self.rng.chance(0.02) { self.rng.range(20, 200) } else { self.rng.range(1, 20) };
        Duration::from_millis(ms)
    }

    pub fn net(&self, worker: u32) -> (bool, Option<Cut>) {
        let n = self.net.get(&worker);
        let now = self.now_ms();
        let cut = n.and_then(|n| n.cut).filter(|(_, _, until)| now < *until).map(|(c, _, _)| c);
        (n.is_some_and(|n| n.crashed), cut)
    }

    // ----- checks made as the run goes -----

    /// The lowest lease node under a shard's `owners/` directory (the one that holds the shard).
    pub fn lowest_lease(&self, owners_dir: &str) -> Option<String> {
        self.zk
            .list_children_any(owners_dir)
            .into_iter()
            .min_by_key(|n| n.rsplit('-').next().and_then(|s| s.parse::<u64>().ok()).unwrap_or(u64::MAX))
    }

    /// Whether `shard` of `stream` finished: its finished marker, or a finished checkpoint.
    pub fn finished(&self, stream: &str, shard: &str) -> bool {
        let sp = self.stream_path(stream);
        self.zk.exists_any(&format!("{sp}/finished/{shard}"))
            || self
                .zk
                .data_any(&format!("{sp}/checkpoints/{shard}"))
                .and_then(|d| serde_json::from_slice::<Checkpoint>(&d).ok())
                .is_some_and(|c| c.finished)
    }

    /// Recomputes who holds each shard's lease (after a change under `owners/`, or a session's
    /// end): the worker of the session that owns the lowest lease node.
    pub fn refresh_holders(&mut self) {
        for stream in self.streams.iter().chain(&self.intermediate).cloned().collect::<Vec<_>>() {
            self.refresh_holders_of(&stream);
        }
    }

    fn refresh_holders_of(&mut self, stream: &str) {
        let dir = format!("{}/owners", self.stream_path(stream));
        let now = self.now_ms();
        for shard_id in self.zk.list_children_any(&dir) {
            let shard = format!("{stream}/{shard_id}");
            let sdir = format!("{dir}/{shard_id}");
            let holder = self
                .lowest_lease(&sdir)
                .and_then(|n| self.zk.owner_any(&format!("{sdir}/{n}")))
                .and_then(|session| self.sessions.get(&session).map(|s| s.worker));
            let before = self.checks.lease_holder.get(&shard).copied();
            if before != holder {
                if let Some(p) = before {
                    self.checks.lease_lost.insert((shard.clone(), p), now);
                }
                match holder {
                    Some(h) => {
                        self.checks.lease_holder.insert(shard.clone(), h);
                        self.checks.lease_lost.remove(&(shard.clone(), h));
                        // where the new hold starts: the last checkpoint (the previous holder's
                        // lease is gone, so it can write no more)
                        let from = self
                            .zk
                            .data_any(&format!("{}/checkpoints/{shard_id}", self.stream_path(stream)))
                            .and_then(|d| serde_json::from_slice::<Checkpoint>(&d).ok())
                            .map(|c| match c.position {
                                _ if c.finished => None,
                                CheckpointPosition::AfterSequence { sequence, sub_sequence } => {
                                    Some((sequence, sub_sequence))
                                }
                                // TRIM_HORIZON, AT_TIMESTAMP: covers nothing
                                _ => Some((String::new(), 0)),
                            });
                        self.checks.hold_from.insert(shard.clone(), from);
                    }
                    None => {
                        self.checks.lease_holder.remove(&shard);
                    }
                }
            }
        }
    }

    /// A delivery to a sink bolt of `worker`: per key, no record before an earlier one of its key;
    /// and only from a shard whose lease the worker holds (a zombie hands nothing on).
    pub fn deliver(&mut self, worker: u32, stream: &str, key: &str, n: u64, shard: &str, at: (&str, u64)) {
        let now = self.now_ms();
        let (sequence, sub) = at;
        let held = format!("{stream}/{shard}");
        // A hold hands on nothing its starting checkpoint covers: every record at or below it
        // was processed (a reader resuming inside a KPL aggregate skips the user records at or
        // below it; a renewed subscription starts after the last event handed on).
        if self.checks.lease_holder.get(&held) == Some(&worker)
            && let Some(Some(from)) = self.checks.hold_from.get(&held)
        {
            let covered = match from {
                None => Some("the shard had finished".to_string()),
                Some((seq, s)) if !seq.is_empty() && sequence_cmp(sequence, seq).then(sub.cmp(s)).is_le() => {
                    Some(format!("its checkpoint was after {seq}/{s}"))
                }
                Some(_) => None,
            };
            if let Some(why) = covered {
                self.checks.covered_again += 1;
                self.violation(format!(
                    "checkpointed record handed on again: w{worker} handed on {stream}/{key}:{n} ({shard} {sequence}/{sub}) \
                     in a hold that began when {why}"
                ));
            }
        }
        // per-key order is per stream: keys are `{stream}/{key}` in the checks
        let key = &format!("{stream}/{key}");
        if self.checks.lease_holder.get(&held) != Some(&worker) {
            let since = self.checks.lease_lost.get(&(held.clone(), worker)).map(|t| now - t);
            // A record in flight when the lease went is handed on at the same simulated instant
            // (processing takes no simulated time); 100 ms is slack for the engine's own timers.
            if since.is_none_or(|ms| ms > 100) {
                let what = match since {
                    Some(ms) => format!("{ms} ms after it lost the shard's lease"),
                    None => "a shard whose lease it never held".to_string(),
                };
                self.violation(format!("zombie: w{worker} handed on {key}:{n} of {shard} {what}"));
            }
        }
        self.checks.deliveries += 1;
        let from = self.checks.optional(key);
        let seen = self.checks.delivered.entry(key.to_string()).or_default();
        let first = seen.insert(n);
        if first
            && let Some(arrival) = self.checks.arrival.get(key).and_then(|a| a.get(n as usize))
            && let Some(u) = self.checks.undelivered.get_mut(stream)
        {
            u.remove(&(*arrival, key.clone(), n));
        }
        // Per-key order within a shard's lineage: the first delivery of n comes after a delivery
        // of every earlier record of its key.
        let missing = (n > from && first).then(|| (from..n).rev().find(|m| !seen.contains(m))).flatten();
        self.event(format!(
            "w{worker} deliver {key}:{n} {shard} {sequence}/{sub}{}",
            if first { "" } else { " again" }
        ));
        if let Some(m) = missing {
            self.violation(format!(
                "per-key order: w{worker} delivered {key}:{n} (shard {shard}, sequence {sequence}) before {key}:{m}"
            ));
        }
        // Nothing new is handed on while inactive: the spouts stop at once (records in flight
        // at that instant reach the sink at once too: processing takes no simulated time; the
        // slack is for the engine's own channels and timers).
        if first
            && let Some(since) = self.checks.inactive_since.get(&worker).copied()
            && now - since > INACTIVE_SLACK_MS
        {
            self.checks.delivered_inactive += 1;
            self.violation(format!(
                "delivered while inactive: w{worker} delivered {key}:{n} (shard {shard}) for the first time {} ms after it read the topology INACTIVE",
                now - since
            ));
        }
    }

    /// A worker read the lifecycle state: INACTIVE starts its inactive spell, anything else
    /// ends it.
    pub fn state_read(&mut self, worker: u32, data: &[u8]) {
        let inactive = serde_json::from_slice::<serde_json::Value>(data)
            .is_ok_and(|v| v.get("state").and_then(|s| s.as_str()) == Some("INACTIVE"));
        if inactive {
            let now = self.now_ms();
            self.checks.inactive_since.entry(worker).or_insert(now);
        } else {
            self.checks.inactive_since.remove(&worker);
        }
    }

    /// A record written into the intermediate stream (`key` is `{stream}/{key}`).
    pub fn written_mid(&mut self, key: &str, n: u64) {
        if self.checks.mid_written.entry(key.to_string()).or_default().insert(n) {
            self.checks.mid_order.entry(key.to_string()).or_default().push(n);
        }
    }

    /// A delivery to the sink of the stage after the boundary, through the intermediate stream:
    /// per key, not before a record first written into the intermediate stream ahead of it (the
    /// next stage reads each key from one shard lineage, in order; the first stage's replays may
    /// write a key's records out of their put order, which the product does not promise to keep).
    pub fn deliver_downstream(&mut self, worker: u32, stream: &str, key: &str, n: u64) {
        let key = &format!("{stream}/{key}");
        self.checks.deliveries += 1;
        let seen = self.checks.downstream.entry(key.to_string()).or_default();
        let first = seen.insert(n);
        let order = self.checks.mid_order.get(key).map(Vec::as_slice).unwrap_or_default();
        let missing = if first {
            match order.iter().position(|m| *m == n) {
                Some(i) => order[..i].iter().rev().find(|m| !seen.contains(m)).map(|m| m.to_string()),
                None => Some("anything: it was never written into the intermediate stream".to_string()),
            }
        } else {
            None
        };
        self.event(format!("w{worker} downstream {key}:{n}{}", if first { "" } else { " again" }));
        if let Some(m) = missing {
            self.violation(format!(
                "per-key order across the stage boundary: w{worker}'s next stage got {key}:{n} before {key}:{m} \
                 (written into the intermediate stream before it)"
            ));
        }
    }

    /// `(stream, shard)` of a checkpoint znode's path.
    fn is_checkpoint(&self, path: &str) -> Option<(String, String)> {
        let rest = path.strip_prefix(&self.topo_path)?.strip_prefix("/streams/")?;
        let (stream, shard) = rest.split_once("/checkpoints/")?;
        (!shard.contains('/')).then(|| (stream.to_string(), shard.to_string()))
    }

    /// The stream of a task's watermark report or of the leader's published committed watermark.
    fn is_watermark(&self, path: &str) -> Option<String> {
        let rest = path.strip_prefix(&self.topo_path)?.strip_prefix("/streams/")?;
        let (stream, rest) = rest.split_once('/')?;
        (rest == "committed" || rest.starts_with("watermarks/")).then(|| stream.to_string())
    }

    /// The committed watermark never passes a record not acked: every record of `stream` that
    /// arrived before the committed watermark, computed from the tasks' reports as
    /// `ZkStore::committed_watermark` does and as the leader published it, has been delivered
    /// (a record's tuple tree completes only after the sink executed it). Records the initial
    /// position may skip excepted.
    fn check_committed(&mut self, worker: u32, stream: &str) {
        let sp = self.stream_path(stream);
        let computed = self
            .zk
            .data_any(&format!("{sp}/assignment"))
            .and_then(|d| serde_json::from_slice::<Assignment>(&d).ok())
            .and_then(|a| {
                let dir = format!("{sp}/watermarks");
                let reports: BTreeMap<String, WatermarkReport> = self
                    .zk
                    .list_children_any(&dir)
                    .into_iter()
                    .filter_map(|t| {
                        let r = serde_json::from_slice(&self.zk.data_any(&format!("{dir}/{t}"))?).ok()?;
                        Some((t, r))
                    })
                    .collect();
                committed_watermark(&a, &reports).ok()
            });
        let published = self
            .zk
            .data_any(&format!("{sp}/committed"))
            .and_then(|d| serde_json::from_slice::<PublishedWatermark>(&d).ok())
            .and_then(|p| p.watermark_ms);
        for (what, w) in [("computed from the tasks' reports", computed), ("published by the leader", published)] {
            let Some(w) = w else { continue };
            if self.checks.committed_checked.get(stream).is_some_and(|c| *c >= w) {
                continue;
            }
            self.checks.committed_checked.insert(stream.to_string(), w);
            self.checks.committed_checks += 1;
            let passed = self.checks.undelivered.get(stream).and_then(|u| {
                u.iter().take_while(|(a, _, _)| *a < w).find(|(_, k, n)| *n >= self.checks.optional(k)).cloned()
            });
            if let Some((arrival, key, n)) = passed {
                self.violation(format!(
                    "committed watermark of {stream} {what} ({} ms, after w{worker}'s write) passes {key}:{n}, \
                     which arrived at {} ms and was never delivered",
                    w - self.epoch_ms,
                    arrival - self.epoch_ms
                ));
            }
        }
    }

    /// A write the server accepted on `path` (set, create, or part of a multi whose lease check was
    /// `lease`): checkpoints never move back, and are written only under the shard's lowest lease.
    pub fn accepted_write(&mut self, worker: u32, path: &str, data: &[u8], lease: Option<&str>) {
        if self.checks.required_from_ms.is_none()
            && path == format!("{}/first_start", self.stream_path(&self.streams[0]))
        {
            let at = self.start.elapsed().as_millis() as u64 + self.checks.latest_slack_ms;
            self.checks.required_from_ms = Some(at);
            self.event(format!("w{worker} first start recorded: records put from {at} ms on are required"));
        }
        if let Some(stream) = self.is_watermark(path) {
            self.check_committed(worker, &stream);
        }
        let Some((stream, shard)) = self.is_checkpoint(path) else { return };
        let Ok(cp) = serde_json::from_slice::<Checkpoint>(data) else {
            self.violation(format!("w{worker} wrote an unreadable checkpoint at {path}"));
            return;
        };
        self.checks.checkpoint_writes += 1;
        self.event(format!(
            "w{worker} checkpoint {stream}/{shard} {} finished={}",
            position(&cp.position),
            cp.finished
        ));
        if let Some(prev) = self.checks.checkpoints.get(path)
            && moved_back(&prev.position, &cp.position, prev.finished, cp.finished)
        {
            let what = format!(
                "checkpoint of {stream}/{shard} moved back: {} (finished {}) -> {} (finished {}), by w{worker}",
                position(&prev.position),
                prev.finished,
                position(&cp.position),
                cp.finished
            );
            self.violation(what);
        }
        if let Some(lease) = lease {
            let dir = format!("{}/owners/{shard}", self.stream_path(&stream));
            let holder = self.lowest_lease(&dir);
            let mine = lease.rsplit('/').next().unwrap_or(lease);
            if holder.as_deref() != Some(mine) {
                self.violation(format!(
                    "w{worker} wrote the checkpoint of {stream}/{shard} under lease {mine}, which does not hold it (holder: {holder:?})"
                ));
            }
        }
        self.checks.checkpoints.insert(path.to_string(), cp);
    }

    /// A shard iterator asked for `shard`: every parent must have finished first.
    pub fn iterator_asked(&mut self, worker: u32, stream: &str, shard: &str, parents: &[String]) {
        for p in parents {
            if !self.finished(stream, p) {
                self.violation(format!("w{worker} read child {stream}/{shard} before its parent {p} finished"));
            }
        }
    }
}

fn position(p: &CheckpointPosition) -> String {
    match p {
        CheckpointPosition::AfterSequence { sequence, sub_sequence } => format!("after {sequence}/{sub_sequence}"),
        other => format!("{other:?}"),
    }
}

/// Whether a checkpoint going from `a` to `b` moved back.
fn moved_back(a: &CheckpointPosition, b: &CheckpointPosition, a_fin: bool, b_fin: bool) -> bool {
    if a_fin && !b_fin {
        return true;
    }
    match (a, b) {
        (
            CheckpointPosition::AfterSequence { sequence: sa, sub_sequence: ua },
            CheckpointPosition::AfterSequence { sequence: sb, sub_sequence: ub },
        ) => sequence_cmp(sa, sb).then(ua.cmp(ub)).is_gt(),
        (CheckpointPosition::AfterSequence { .. }, _) => true,
        _ => false,
    }
}

/// Waits out `worker`'s freeze (its calls to Kinesis and the state table hang until it ends);
/// never returns for a crashed worker. A cut from ZooKeeper alone does not stop these calls.
pub async fn wait_network(world: &Shared, worker: u32) {
    loop {
        let (crashed, cut) = lock(world).net(worker);
        if crashed {
            return std::future::pending().await;
        }
        if cut != Some(Cut::Hang) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Locks the world (a poisoned lock is a failed check elsewhere: go on with it).
pub fn lock(w: &Shared) -> MutexGuard<'_, World> {
    w.lock().unwrap_or_else(|p| p.into_inner())
}
