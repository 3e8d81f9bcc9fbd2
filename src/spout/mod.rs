//! The Kinesis spout: reads a stream's shards as assigned through ZooKeeper and emits one tracked
//! tuple per record, with at-least-once delivery, fenced checkpoints and correct resharding.
//!
//! - [`config`]: [`KinesisSpoutConfig`] (serde, validated).
//! - `stream`: the worker-level coordinator, one per worker and stream: watches the live tasks
//!   and the assignment, and when the worker hosts the leader, lists shards, persists starting
//!   positions, computes the sticky assignment and collects finished shards.
//! - `coordinator`: the per-task state manager (registration, leases, checkpoints, handoff,
//!   session loss).
//! - [`shared`](SpoutShared): the session and stream coordinator the tasks of one worker share.
//! - `source`: where shards come from (the Kinesis API).
//! - `reader`: one GetRecords loop per owned shard (polling, the default).
//! - `efo`: enhanced fan-out: consumer registration and one SubscribeToShard subscription per
//!   owned shard, renewed from its continuation sequence, with a silence watchdog.
//! - `tracker`: in-flight records per shard, checkpoint computation, replay bookkeeping.
//! - [`readlog`]: an optional JSON-lines read log for audits.
//!
//! Tuples on the default stream carry [`FIELDS`]; records that failed more than
//! `retry.max_replays` times go to [`DEAD_LETTER_STREAM`] with [`DEAD_LETTER_FIELDS`], as tracked
//! tuples of their own ([`SpoutMsgId::DeadLetter`]): a record's checkpoint moves only once its
//! dead-letter tuple is acked, and a failed dead-letter tuple is emitted again after a back-off.
//!
//! # Low watermark
//!
//! Each task emits a low watermark in event time (the records' approximate arrival time): per
//! shard, the oldest record still to be emitted on the default stream (queued, or failed and
//! awaiting its replay), else the newest read, or, for a shard idle and caught up for
//! `watermark_idle_timeout_ms`, the time of that read minus the idle timeout; per task, the
//! minimum over its shards. Records in flight do not hold it: a watermark travels in band behind
//! the tuples emitted before it and cannot overtake them. So a window that holds its inputs until
//! it fires (`AckMode::OnFire`) fires; the price is that a record failing after the watermark
//! passed its time is replayed *late*, and a window sends it to its late stream. The watermark is
//! computed at most every `watermark_interval_ms`, and sent from `next_tuple` and from
//! `Spout::low_watermark`, which the engine polls while it does not call `next_tuple` (at
//! `max_spout_pending`, idle).

pub mod config;
mod coordinator;
pub(crate) use coordinator::registration_token;
mod deagg;
mod efo;
mod reader;
pub mod readlog;
mod shared;
mod source;
pub mod stage_input;
mod stream;
mod tracker;

pub use config::{
    Consumer, EfoSettings, InitialPosition, KinesisSpoutConfig, KplOutOfRange, RetryPolicy, SpoutConfigError,
    ZkSettings,
};
pub use deagg::KplStats;
pub use readlog::ReadLogEntry;
pub use shared::{DEFAULT_GIVE_UP_AFTER, SpoutShared};
pub(crate) use source::registered_api;
pub use source::{
    API_PREFIX, Batch, ConsumerDescription, ConsumerStatus, ShardApi, ShardEvent, ShardEvents, StartAt, SubscribeError,
    register_shard_api, unregister_shard_api,
};
pub use stage_input::{LiveProducers, Producers, StageInputSpec, StageInputStats};
pub use tracker::Record;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use squall_topology::{ComponentError, Spout, SpoutOutput, TaskContext, TopologyBuilder, Values};
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::coord::{TaskInfo, now_ms};
use crate::kinesis::ErrorKind;
use tracker::{FailOutcome, Tracker};

/// Output fields of the spout's default stream. Besides the record: `lease_token`, the sequencer
/// token of the lease the record was read under (later owners of the shard hold higher tokens),
/// and `checkpoint`, a sequence of the shard up to which every record is handled (acked or
/// dead-lettered) and will never be read again by a correct owner (`""` when none is known yet).
/// `stream` is the Kinesis stream the record was read from (a worker reads several with
/// `--stream a --stream b`), and `shard_range` the shard's hash key range (`start-end`, decimal;
/// empty when unknown).
/// Exactly-once state ([`crate::state`]) identifies records by (stream, shard, sequence,
/// sub-sequence), fences zombies with the lease token, prunes its deduplication data with the
/// checkpoint, and tells a shard's ancestors (finished) by the ranges.
pub const FIELDS: [&str; 10] = [
    "partition_key",
    "sequence_number",
    "sub_sequence",
    "shard_id",
    "arrival_ms",
    "data",
    "lease_token",
    "checkpoint",
    "stream",
    "shard_range",
];
/// Fields a stage input appends to each tuple with [`crate::stage::Boundary::exactly_once`]:
/// the intermediate record's shard and sequence, the tuple's index in the record (as its
/// sub-sequence), the lease token, the checkpoint, the intermediate stream and the shard's hash
/// key range, as in [`FIELDS`], and `hash_key`, the record's hash key (of the boundary key it
/// was put with, decimal).
pub const STAGE_RECORD_ID_FIELDS: [&str; 8] =
    ["shard_id", "sequence_number", "sub_sequence", "lease_token", "checkpoint", "stream", "shard_range", "hash_key"];

/// The stream on which records that exhausted their replays are emitted.
pub const DEAD_LETTER_STREAM: &str = "dead_letter";
/// Fields of the dead-letter stream: the record's fields plus how many times it failed.
pub const DEAD_LETTER_FIELDS: [&str; 11] = [
    "partition_key",
    "sequence_number",
    "sub_sequence",
    "shard_id",
    "arrival_ms",
    "data",
    "lease_token",
    "checkpoint",
    "stream",
    "shard_range",
    "failures",
];

/// A record's identity in the spout: its shard and sequence, plus the ownership epoch so acks
/// from before a handoff are never applied to a later ownership.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KinesisMsgId {
    /// Shard id.
    pub shard_id: Arc<str>,
    /// Sequence number.
    pub sequence: Arc<str>,
    /// KPL sub-sequence (the user record's index in its aggregate; 0 for plain records).
    pub sub_sequence: u64,
    epoch: u64,
}

/// The message id of a tracked spout tuple.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SpoutMsgId {
    /// A record, on the default stream.
    Record(KinesisMsgId),
    /// The dead-letter tuple of a record that exhausted its replays, on [`DEAD_LETTER_STREAM`].
    /// The record counts as handled (its checkpoint may move) only once this tuple is acked.
    DeadLetter(KinesisMsgId),
}

/// Per-shard reading status (lag and errors), for `squall status`.
#[derive(Debug, Clone, Default)]
pub struct ShardStatus {
    /// The last MillisBehindLatest Kinesis reported.
    pub millis_behind_latest: Option<i64>,
    /// The last error reading the shard (it names the shard, the stream and, when retrying
    /// cannot fix it, the fix), cleared by the next successful read.
    pub last_error: Option<String>,
    /// The kind of the last error (`None` after a successful read).
    pub error_kind: Option<ErrorKind>,
    /// `Some(false)` when retrying cannot fix the last error (access denied, KMS key, deleted
    /// stream or shard, invalid argument): an operator must act. `None` after a successful read.
    pub retryable: Option<bool>,
    /// Since when (ms since the epoch) the shard has been failing with errors of that kind.
    pub error_since_ms: Option<i64>,
    /// Errors so far.
    pub errors: u64,
    /// Records read so far (Kinesis records: a KPL aggregate counts once).
    pub records_read: u64,
    /// Bytes of record data read so far.
    pub bytes_read: u64,
    /// Reads refused by throttling so far (after the SDK's own retries).
    pub throttles: u64,
    /// Errors so far, by kind (throttles included).
    pub errors_by_kind: Vec<(ErrorKind, u64)>,
    /// When (ms since the epoch) this task last wrote the shard's checkpoint.
    pub last_checkpoint_ms: Option<i64>,
    /// The shard is read by enhanced fan-out.
    pub efo_reader: bool,
    /// GetRecords calls made for this shard (polling, and the end-of-shard check of EFO).
    pub get_records_calls: u64,
    /// Enhanced fan-out: events received (empty ones included).
    pub efo_events: u64,
    /// Enhanced fan-out: subscriptions opened (SubscribeToShard calls that succeeded).
    pub efo_subscriptions: u64,
    /// Enhanced fan-out: subscriptions renewed after one ended (by Kinesis after 5 minutes, by
    /// `efo.renew_after_ms`, by the watchdog or after an error).
    pub efo_resubscriptions: u64,
    /// Enhanced fan-out: subscriptions dropped by the silence watchdog.
    pub efo_watchdog: u64,
    /// Enhanced fan-out: SubscribeToShard refused with ResourceInUse (a previous subscription to
    /// the shard still live), retried after a back-off.
    pub efo_in_use: u64,
    /// Enhanced fan-out: times the consumer was found deregistered and registered again.
    pub efo_reregistered: u64,
}

impl ShardStatus {
    /// Counts an error of `kind`.
    pub(crate) fn count_error(&mut self, kind: ErrorKind) {
        self.errors += 1;
        if kind == ErrorKind::Throttled {
            self.throttles += 1;
        }
        match self.errors_by_kind.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => self.errors_by_kind.push((kind, 1)),
        }
    }

    /// A successful read: no current error.
    pub(crate) fn clear_error(&mut self) {
        self.last_error = None;
        self.error_kind = None;
        self.retryable = None;
        self.error_since_ms = None;
    }
}

/// Counters of one spout task.
#[derive(Debug, Default)]
pub struct SpoutStats {
    /// Tuples emitted for the first time.
    pub emitted: AtomicU64,
    /// Tuples re-emitted after a failure.
    pub replayed: AtomicU64,
    /// Tuples acked.
    pub acked: AtomicU64,
    /// Tuples failed (each failure).
    pub failed: AtomicU64,
    /// Records sent to the dead-letter stream (each once, when its replays are exhausted).
    pub dead_lettered: AtomicU64,
    /// Dead-letter tuples acked (their records are then handled).
    pub dead_letters_acked: AtomicU64,
    /// Dead-letter tuples that failed (each is emitted again after a back-off).
    pub dead_letters_failed: AtomicU64,
    /// Shard leases the task holds now (a gauge, updated by its coordinator).
    pub leases_held: AtomicU64,
    /// KPL de-aggregation: aggregates, user records, hash-range drops, corrupt aggregates.
    pub kpl: KplStats,
}

/// Who runs this spout: identifies the worker process in ZooKeeper.
#[derive(Debug, Clone)]
pub struct WorkerIdentity {
    /// Unique per worker process.
    pub worker_id: String,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
}

impl WorkerIdentity {
    /// This process: host name, pid and a random suffix.
    pub fn current() -> Self {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "localhost".into());
        let pid = std::process::id();
        let suffix = &crate::random::hex_id(6);
        Self { worker_id: format!("{host}-{pid}-{suffix}"), host, pid }
    }
}

/// What a worker can see of one of its spout tasks (for status publication).
#[derive(Debug, Clone)]
pub struct SpoutTaskHandle {
    stream: Arc<str>,
    task_name: Arc<Mutex<String>>,
    status: Arc<Mutex<HashMap<Arc<str>, ShardStatus>>>,
    stats: Arc<SpoutStats>,
}

impl SpoutTaskHandle {
    /// The stream the task reads.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The task's ZooKeeper node name (empty until registered).
    pub fn task_name(&self) -> String {
        lock(&self.task_name).clone()
    }

    /// Reading status of every shard the task owns now.
    pub fn shards(&self) -> Vec<(String, ShardStatus)> {
        lock(&self.status).iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    }

    /// The task's counters.
    pub fn stats(&self) -> &SpoutStats {
        &self.stats
    }
}

/// The spout tasks of one worker, filled in as the engine creates them.
#[derive(Debug, Clone, Default)]
pub struct SpoutRegistry(Arc<Mutex<Vec<SpoutTaskHandle>>>);

impl SpoutRegistry {
    /// Every spout task created so far.
    pub fn tasks(&self) -> Vec<SpoutTaskHandle> {
        lock(&self.0).clone()
    }
}

/// The Kinesis spout. Build one per task with [`KinesisSpout::declare`].
pub struct KinesisSpout {
    cfg: Arc<KinesisSpoutConfig>,
    /// `cfg.stream`, shared by every tuple's `stream` field.
    stream_name: Arc<str>,
    /// Where the shards come from (set in `open`): its clock bounds the watermarks.
    source: Option<source::ShardSource>,
    worker: WorkerIdentity,
    tracker: Arc<Mutex<Tracker>>,
    space: Arc<Notify>,
    /// Replays and dead-letter re-emissions, by due time.
    replays: BinaryHeap<Reverse<(Instant, u64)>>,
    replay_ids: HashMap<u64, SpoutMsgId>,
    next_replay: u64,
    /// Records whose dead-letter tuple is to be emitted for the first time.
    dead_letters: VecDeque<KinesisMsgId>,
    active: watch::Sender<bool>,
    stats: Arc<SpoutStats>,
    status: Arc<Mutex<HashMap<Arc<str>, ShardStatus>>>,
    task_name: Arc<Mutex<String>>,
    coordinator: Option<(CancellationToken, tokio::task::JoinHandle<()>)>,
    shared: SpoutShared,
    attached: bool,
    /// When the task's watermark is computed next (at most once per `watermark_interval_ms`).
    next_watermark: Instant,
    /// The last watermark computed, returned by `low_watermark` until the next computation.
    last_watermark: Option<u64>,
    draining: bool,
    /// Set when this spout reads a stage's input (an intermediate stream).
    stage: Option<stage_input::StageInput>,
    next_drain_check: Instant,
    /// Whether the worker's leases can be trusted now (set in `open`): no watermark is handed
    /// on while they cannot.
    liveness: Option<Arc<crate::coord::Liveness>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl KinesisSpout {
    /// A spout for one task, with a ZooKeeper session of its own; nothing connects until the
    /// engine opens it. [`KinesisSpout::declare`] makes the tasks of a worker share one.
    pub fn new(cfg: Arc<KinesisSpoutConfig>, worker: WorkerIdentity) -> Self {
        Self::with_shared(cfg, worker, SpoutShared::default())
    }

    /// A spout task sharing `shared` (session and stream coordinator) with its siblings.
    pub fn with_shared(cfg: Arc<KinesisSpoutConfig>, worker: WorkerIdentity, shared: SpoutShared) -> Self {
        Self {
            stream_name: Arc::from(cfg.stream.as_str()),
            source: None,
            cfg,
            worker,
            tracker: Arc::default(),
            space: Arc::new(Notify::new()),
            replays: BinaryHeap::new(),
            replay_ids: HashMap::new(),
            next_replay: 0,
            dead_letters: VecDeque::new(),
            active: watch::channel(true).0,
            stats: Arc::default(),
            status: Arc::default(),
            task_name: Arc::default(),
            coordinator: None,
            shared,
            attached: false,
            next_watermark: Instant::now(),
            last_watermark: None,
            draining: false,
            stage: None,
            next_drain_check: Instant::now(),
            liveness: None,
        }
    }

    /// Declares the spout as component `id` with `parallelism` tasks in this worker, with its
    /// default stream ([`FIELDS`]) and dead-letter stream ([`DEAD_LETTER_FIELDS`]).
    pub fn declare(
        builder: &mut TopologyBuilder,
        id: &str,
        parallelism: usize,
        cfg: KinesisSpoutConfig,
        worker: WorkerIdentity,
    ) {
        Self::declare_with_registry(builder, id, parallelism, cfg, worker, SpoutRegistry::default());
    }

    /// [`KinesisSpout::declare`], recording each task in `registry` so the worker can publish
    /// its status.
    pub fn declare_with_registry(
        builder: &mut TopologyBuilder,
        id: &str,
        parallelism: usize,
        cfg: KinesisSpoutConfig,
        worker: WorkerIdentity,
        registry: SpoutRegistry,
    ) {
        Self::declare_shared(builder, id, parallelism, cfg, worker, registry, SpoutShared::default());
    }

    /// [`KinesisSpout::declare_with_registry`] whose tasks share `shared`, e.g. the worker's own
    /// ZooKeeper session ([`SpoutShared::with_session`]). The tasks of one declaration always
    /// share one session and one stream coordinator.
    pub fn declare_shared(
        builder: &mut TopologyBuilder,
        id: &str,
        parallelism: usize,
        cfg: KinesisSpoutConfig,
        worker: WorkerIdentity,
        registry: SpoutRegistry,
        shared: SpoutShared,
    ) {
        let cfg = Arc::new(cfg);
        builder
            .set_spout(id, parallelism, move |_ctx: &TaskContext| {
                KinesisSpout::with_shared(cfg.clone(), worker.clone(), shared.clone()).registered(&registry)
            })
            .fields(&FIELDS)
            .output(DEAD_LETTER_STREAM, &DEAD_LETTER_FIELDS);
    }

    /// Records this task in `registry` (for the worker's status).
    fn registered(self, registry: &SpoutRegistry) -> Self {
        lock(&registry.0).push(SpoutTaskHandle {
            stream: self.stream_name.clone(),
            task_name: self.task_name.clone(),
            status: self.status.clone(),
            stats: self.stats.clone(),
        });
        self
    }

    /// Declares one spout component `id` reading every stream of `cfgs` (one configuration per
    /// stream), with `per_stream` tasks for each: task `i` reads stream `i / per_stream`. Each
    /// stream has its own coordinator (shard list, assignment over the tasks reading it,
    /// leases, checkpoints under `streams/{stream}/`); tuples say which stream (`stream`).
    pub fn declare_streams(
        builder: &mut TopologyBuilder,
        id: &str,
        per_stream: usize,
        cfgs: Vec<KinesisSpoutConfig>,
        worker: WorkerIdentity,
        registry: SpoutRegistry,
        session: Arc<crate::coord::SharedSession>,
    ) {
        let per_stream = per_stream.max(1);
        let streams: Vec<(Arc<KinesisSpoutConfig>, SpoutShared)> =
            cfgs.into_iter().map(|c| (Arc::new(c), SpoutShared::with_session(session.clone()))).collect();
        let n = streams.len();
        builder
            .set_spout(id, per_stream * n, move |ctx: &TaskContext| {
                let (cfg, shared) = &streams[(ctx.task_index() / per_stream).min(n.saturating_sub(1))];
                KinesisSpout::with_shared(cfg.clone(), worker.clone(), shared.clone()).registered(&registry)
            })
            .fields(&FIELDS)
            .output(DEAD_LETTER_STREAM, &DEAD_LETTER_FIELDS);
    }

    /// Declares the spout reading a stage's input, the intermediate stream `cfg.stream` (which
    /// must have `stage_input` set): its default stream carries the boundary stream's fields
    /// (`spec.fields`), decoded from Squall stage records. `stats` receives each task's
    /// stage-input counters.
    #[allow(clippy::too_many_arguments)]
    pub fn declare_stage_input(
        builder: &mut TopologyBuilder,
        id: &str,
        parallelism: usize,
        cfg: KinesisSpoutConfig,
        worker: WorkerIdentity,
        registry: SpoutRegistry,
        shared: SpoutShared,
        spec: StageInputSpec,
        stats: Arc<Mutex<Vec<Arc<StageInputStats>>>>,
    ) {
        let cfg = Arc::new(KinesisSpoutConfig { stage_input: true, ..cfg });
        let mut fields = spec.fields.clone();
        if spec.record_ids {
            fields.extend(STAGE_RECORD_ID_FIELDS.iter().map(|f| f.to_string()));
        }
        builder
            .set_spout(id, parallelism, move |_ctx: &TaskContext| {
                let mut spout = KinesisSpout::with_shared(cfg.clone(), worker.clone(), shared.clone());
                let input = stage_input::StageInput::new(spec.clone(), &cfg.stream);
                lock(&stats).push(input.stats.clone());
                spout.stage = Some(input);
                spout.registered(&registry)
            })
            .fields(&fields)
            .output(DEAD_LETTER_STREAM, &DEAD_LETTER_FIELDS);
    }

    /// This task's counters.
    pub fn stats(&self) -> Arc<SpoutStats> {
        self.stats.clone()
    }

    fn values(&self, r: &tracker::Record, own: Option<&tracker::Ownership>) -> Values {
        let mut v = Values::new();
        v.push(r.partition_key.clone());
        v.push(r.sequence.clone());
        v.push(r.sub_sequence);
        v.push(r.shard_id.clone());
        v.push(r.arrival_ms);
        v.push(r.data.clone());
        v.push(own.map_or(0, |o| o.lease_token));
        // `sequence` or `sequence:sub_sequence` (see `SeqKey::floor_text`).
        v.push(own.and_then(|o| o.floor.clone()).unwrap_or_else(|| Arc::from("")));
        v.push(self.stream_name.clone());
        v.push(own.and_then(|o| o.range.clone()).unwrap_or_else(|| Arc::from("")));
        v
    }

    fn dead_letter_values(&self, r: &tracker::Record, own: Option<&tracker::Ownership>, failures: u32) -> Values {
        let mut v = self.values(r, own);
        v.push(failures);
        v
    }

    /// Schedules `id` to be emitted again after the replay back-off of its `failures`th failure.
    fn schedule(&mut self, id: SpoutMsgId, failures: u32) -> Duration {
        let delay = self.replay_delay(failures);
        self.next_replay += 1;
        self.replay_ids.insert(self.next_replay, id);
        self.replays.push(Reverse((Instant::now() + delay, self.next_replay)));
        delay
    }

    fn replay_delay(&self, failures: u32) -> Duration {
        let min = self.cfg.retry.replay_min_backoff_ms.max(1);
        let max = self.cfg.retry.replay_max_backoff_ms.max(min);
        let base = min.saturating_mul(1u64 << failures.saturating_sub(1).min(20)).min(max);
        // Full jitter over the upper half keeps replays of a burst from arriving together.
        let jitter = crate::random::up_to(base / 2);
        Duration::from_millis(base / 2 + jitter)
    }
}

impl KinesisSpout {
    /// Emits a record's tuples (one, or several for an aggregated stage record) as one tracked
    /// spout tuple.
    fn emit_record(
        out: &mut SpoutOutput<SpoutMsgId>,
        mut tuples: Vec<Values>,
        id: SpoutMsgId,
    ) -> Result<(), squall_topology::EmitError> {
        if tuples.len() == 1 {
            out.emit_tracked(tuples.pop().unwrap_or_default(), id)
        } else {
            out.emit_tracked_all(squall_topology::DEFAULT_STREAM, tuples, id).map(|_| ())
        }
    }

    /// The values of a record replayed after a failure: decoded again when reading a stage's
    /// input (a record that was emitted once decodes again).
    fn replay_values(&mut self, rec: &tracker::Record, epoch: u64) -> Option<Vec<Values>> {
        match &mut self.stage {
            None => {
                let own = lock(&self.tracker).ownership(&rec.shard_id, epoch);
                Some(vec![self.values(rec, own.as_ref())])
            }
            Some(stage) => match stage.on_record(rec, epoch) {
                stage_input::Step::Emit(mut values) => {
                    if stage.record_ids() {
                        let own = lock(&self.tracker).ownership(&rec.shard_id, epoch);
                        Self::append_record_ids(&mut values, rec, own.as_ref(), &self.stream_name);
                    }
                    Some(values)
                }
                stage_input::Step::Consumed => None,
            },
        }
    }

    /// Appends the intermediate record's ids ([`STAGE_RECORD_ID_FIELDS`]) to each of its tuples;
    /// a tuple's sub-sequence is its index in the record.
    fn append_record_ids(
        tuples: &mut [Values],
        r: &tracker::Record,
        own: Option<&tracker::Ownership>,
        stream: &Arc<str>,
    ) {
        let token = own.map_or(0, |o| o.lease_token);
        let floor = own.and_then(|o| o.floor.clone()).unwrap_or_else(|| Arc::from(""));
        let range = own.and_then(|o| o.range.clone()).unwrap_or_else(|| Arc::from(""));
        // the record was put with the explicit hash key of its boundary key, its partition key
        let hash: Arc<str> = Arc::from(crate::stage::writer::explicit_hash_key(&r.partition_key).to_string());
        for (i, v) in tuples.iter_mut().enumerate() {
            v.push(r.shard_id.clone());
            v.push(r.sequence.clone());
            v.push(i as u64);
            v.push(token);
            v.push(floor.clone());
            v.push(stream.clone());
            v.push(range.clone());
            v.push(hash.clone());
        }
    }

    /// A stage input while the topology drains: true when the task owns every shard assigned to
    /// it and each is drained (see `stage_input`). A shard whose end was read counts as read
    /// to the end.
    fn stage_drained(&self) -> bool {
        let Some(stage) = &self.stage else { return false };
        let t = lock(&self.tracker);
        if !t.owns_assigned() {
            return false;
        }
        t.owned_epochs().all(|(shard, epoch)| {
            let Some(track) = t.get(shard) else { return true };
            let read = if track.ended { Some(i64::MAX) } else { track.caught_up_ms };
            stage.shard_drained(shard, epoch, !track.queued.is_empty(), read)
        })
    }

    /// Whether the worker's session can be trusted now (see [`crate::coord::Liveness`]): after
    /// the process was paused, nothing is handed on until the session is confirmed, watermarks
    /// included. A watermark computed before a pause past the session (a zombie's) would fire
    /// windows over records whose leases are gone, which their next owner reads again.
    fn trusted(&self) -> bool {
        self.liveness.as_ref().is_none_or(|l| {
            let generation = lock(&self.tracker).session_generation();
            generation.is_some_and(|g| l.trusted_in(g))
        })
    }

    /// This task's low watermark (see `Tracker::task_watermark`: records queued or awaiting a
    /// replay hold it, records in flight do not; a task assigned no shard reports the current
    /// time minus the idle timeout, so it does not hold downstream watermarks back; shards
    /// assigned but not taken yet keep it unknown, so their backlog is not late). `None`:
    /// unknown yet.
    fn compute_watermark(&mut self) -> Option<u64> {
        let idle = KinesisSpoutConfig::ms(self.cfg.watermark_idle_timeout_ms);
        let now = self.watermark_now();
        if let Some(stage) = &mut self.stage {
            let t = lock(&self.tracker);
            let idle_ms = i64::try_from(idle.as_millis()).unwrap_or(i64::MAX);
            let free = now.saturating_sub(idle_ms);
            let owned = t.owned_epochs().map(|(shard, epoch)| {
                let read =
                    t.get(shard).map_or_else(stage_input::ReadProgress::default, |tr| stage_input::ReadProgress {
                        caught_up_ms: tr.caught_up_ms,
                        queued: !tr.queued.is_empty(),
                        ended: tr.ended,
                        ended_idle: tr.ended_ms.is_some_and(|e| now.saturating_sub(e) >= idle_ms),
                    });
                (shard, epoch, read)
            });
            return stage.task_watermark(owned, t.owns_assigned(), u64::try_from(free).unwrap_or(0));
        }
        let wm = lock(&self.tracker).task_watermark(idle, now);
        wm.filter(|w| *w > 0).map(|w| w as u64)
    }

    /// "Now" for watermarks: on the service's clock as far as it is known
    /// (`ShardSource::watermark_now`); this worker's clock before the spout opened.
    fn watermark_now(&self) -> i64 {
        self.source.as_ref().map_or_else(now_ms, source::ShardSource::watermark_now)
    }

    /// Recomputes the watermark when `watermark_interval_ms` has passed since the last time
    /// (it locks the tracker and scans the owned shards); returns whether it did.
    fn refresh_watermark(&mut self, now: Instant) -> bool {
        if self.draining || now < self.next_watermark {
            return false;
        }
        if !self.trusted() {
            return false;
        }
        self.next_watermark = now + KinesisSpoutConfig::ms(self.cfg.watermark_interval_ms);
        self.last_watermark = self.compute_watermark();
        true
    }
}

impl Spout for KinesisSpout {
    type MsgId = SpoutMsgId;

    async fn open(&mut self, ctx: &TaskContext) -> Result<(), ComponentError> {
        self.cfg.validate().map_err(|e| ComponentError::fatal(e.to_string()))?;
        self.active.send_replace(ctx.config().start_active);
        let source = source::ShardSource::for_endpoint(&self.cfg.kinesis, &self.cfg.stream)
            .await
            .map_err(|e| ComponentError::fatal(e.to_string()))?;
        let efo = match self.cfg.consumer.efo_name() {
            Some(name) => Some(
                self.shared
                    .efo(&source, name, &self.cfg.efo)
                    .await
                    .map_err(|e| ComponentError::fatal(e.to_string()))?,
            ),
            None => None,
        };
        let (session, stream) = self
            .shared
            .attach(&self.cfg, source.clone())
            .await
            .map_err(|e| ComponentError::fatal(format!("Kinesis spout of topology {}: {e}", self.cfg.topology)))?;
        self.attached = true;
        self.liveness = Some(session.liveness());
        let read_log = readlog::ReadLog::open(self.cfg.read_log.as_deref())
            .map_err(|e| ComponentError::fatal(format!("cannot open the read log {:?}: {e}", self.cfg.read_log)))?;
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let (fetch_tx, fetch_rx) = watch::channel(false);
        let read_budget_kib = u32::try_from(self.cfg.max_read_bytes_in_flight / 1024).unwrap_or(u32::MAX);
        let fetch_tx = Arc::new(fetch_tx);
        self.source = Some(source.clone());
        let reader = Arc::new(reader::ReaderCtx {
            source,
            stream: self.cfg.stream.clone(),
            task: self.task_name.clone(),
            records_per_get: self.cfg.records_per_get,
            max_queued_bytes: usize::try_from(self.cfg.max_queued_bytes_per_shard).unwrap_or(usize::MAX),
            read_budget: Arc::new(tokio::sync::Semaphore::new(read_budget_kib as usize)),
            read_budget_kib,
            max_gets_per_second: self.cfg.max_get_calls_per_second,
            idle_poll_interval: KinesisSpoutConfig::ms(self.cfg.idle_poll_interval_ms),
            call_min_backoff: KinesisSpoutConfig::ms(self.cfg.retry.call_min_backoff_ms),
            call_max_backoff: KinesisSpoutConfig::ms(self.cfg.retry.call_max_backoff_ms),
            fatal_max_backoff: KinesisSpoutConfig::ms(self.cfg.retry.fatal_max_backoff_ms),
            tracker: self.tracker.clone(),
            space: self.space.clone(),
            wakeup: ctx.wakeup(),
            events: events_tx,
            fetch_allowed: fetch_rx,
            liveness: session.liveness(),
            status: self.status.clone(),
            read_log,
            stats: self.stats.clone(),
            hash_ranges: tokio::sync::Mutex::default(),
            efo,
            kpl_out_of_range: self.cfg.kpl_out_of_range,
        });
        let coordinator = coordinator::Coordinator {
            cfg: self.cfg.clone(),
            info: TaskInfo {
                worker_id: self.worker.worker_id.clone(),
                host: self.worker.host.clone(),
                pid: self.worker.pid,
                task_index: ctx.task_index() as u32,
                since_ms: now_ms(),
                session: String::new(),
                registration: String::new(),
            },
            tracker: self.tracker.clone(),
            reader,
            reader_events: events_rx,
            active: self.active.subscribe(),
            fetch_allowed: fetch_tx,
            task_name: self.task_name.clone(),
            tasks: tokio_util::task::TaskTracker::new(),
            stream,
            session: session.subscribe(),
        };
        let cancel = ctx.cancellation().child_token();
        let handle = ctx.spawn(coordinator.run(cancel.clone()));
        self.coordinator = Some((cancel, handle));
        Ok(())
    }

    async fn next_tuple(&mut self, out: &mut SpoutOutput<SpoutMsgId>) -> Result<(), ComponentError> {
        let now = Instant::now();
        if self.stage.as_ref().is_some_and(|s| s.drain_requested()) && now >= self.next_drain_check {
            self.next_drain_check = now + Duration::from_millis(200);
            if self.stage_drained() {
                tracing::info!(topology = %self.cfg.topology, stream = %self.cfg.stream, task = %lock(&self.task_name),
                    "every shard of this stage input drained: ending the task's stream");
                self.draining = true;
                self.active.send_replace(false);
                out.finish();
                return Ok(());
            }
        }
        if self.refresh_watermark(now)
            && let Some(wm) = self.last_watermark
            && self.trusted()
        {
            out.watermark(wm);
        }
        // Nothing is handed on while the worker's session cannot be trusted (see
        // `Liveness`): a reader whose batch came back as the process was paused may have queued
        // it after its own check; those records stay queued until the session is confirmed, and
        // go with everything else if it was lost.
        if !self.trusted() {
            return Ok(());
        }
        while let Some(id) = self.dead_letters.pop_front() {
            let rec = {
                let t = lock(&self.tracker);
                t.dead_letter_record(&id.shard_id, id.epoch, &id.sequence, id.sub_sequence)
                    .map(|r| (r, t.ownership(&id.shard_id, id.epoch)))
            };
            if let Some(((rec, failures), own)) = rec {
                out.emit_to(
                    DEAD_LETTER_STREAM,
                    self.dead_letter_values(&rec, own.as_ref(), failures),
                    Some(SpoutMsgId::DeadLetter(id)),
                )?;
                return Ok(());
            }
        }
        while let Some(Reverse((due, key))) = self.replays.peek().copied() {
            if due > now {
                break;
            }
            self.replays.pop();
            let Some(id) = self.replay_ids.remove(&key) else { continue };
            match id {
                SpoutMsgId::Record(id) => {
                    let rec = lock(&self.tracker).replay_record(&id.shard_id, id.epoch, &id.sequence, id.sub_sequence);
                    if let Some(tuples) = rec.and_then(|rec| self.replay_values(&rec, id.epoch)) {
                        self.stats.replayed.fetch_add(1, Ordering::Relaxed);
                        Self::emit_record(out, tuples, SpoutMsgId::Record(id))?;
                        return Ok(());
                    }
                }
                SpoutMsgId::DeadLetter(id) => {
                    let rec = {
                        let t = lock(&self.tracker);
                        t.dead_letter_record(&id.shard_id, id.epoch, &id.sequence, id.sub_sequence)
                            .map(|r| (r, t.ownership(&id.shard_id, id.epoch)))
                    };
                    if let Some(((rec, failures), own)) = rec {
                        let v = self.dead_letter_values(&rec, own.as_ref(), failures);
                        out.emit_to(DEAD_LETTER_STREAM, v, Some(SpoutMsgId::DeadLetter(id)))?;
                        return Ok(());
                    }
                }
            }
        }
        loop {
            let next = lock(&self.tracker).next_to_emit_owned();
            let Some((rec, own)) = next else { return Ok(()) };
            let epoch = own.epoch;
            self.space.notify_waiters();
            let tuples = match &mut self.stage {
                None => vec![self.values(&rec, Some(&own))],
                Some(stage) => match stage.on_record(&rec, epoch) {
                    stage_input::Step::Emit(mut tuples) => {
                        if stage.record_ids() {
                            Self::append_record_ids(&mut tuples, &rec, Some(&own), &self.stream_name);
                        }
                        tuples
                    }
                    stage_input::Step::Consumed => {
                        // a control record: handled here, so its checkpoint may move at once
                        lock(&self.tracker).ack(&rec.shard_id, epoch, &rec.sequence, rec.sub_sequence);
                        continue;
                    }
                },
            };
            self.stats.emitted.fetch_add(1, Ordering::Relaxed);
            let id = KinesisMsgId {
                shard_id: rec.shard_id.clone(),
                sequence: rec.sequence.clone(),
                sub_sequence: rec.sub_sequence,
                epoch,
            };
            Self::emit_record(out, tuples, SpoutMsgId::Record(id))?;
            return Ok(());
        }
    }

    /// Polled by the engine whenever it does not call `next_tuple` (at `max_spout_pending`,
    /// idle), up to every idle loop: cheap, it recomputes at most once per
    /// `watermark_interval_ms` and returns the last value in between (the engine ignores values
    /// that do not advance). This is what lets a window holding every in-flight input until it
    /// fires see the watermark that fires it.
    fn low_watermark(&mut self) -> Option<u64> {
        self.refresh_watermark(Instant::now());
        self.last_watermark.filter(|_| self.trusted())
    }

    async fn ack(&mut self, id: SpoutMsgId) {
        match id {
            SpoutMsgId::Record(id) => {
                self.stats.acked.fetch_add(1, Ordering::Relaxed);
                lock(&self.tracker).ack(&id.shard_id, id.epoch, &id.sequence, id.sub_sequence);
            }
            SpoutMsgId::DeadLetter(id) => {
                self.stats.dead_letters_acked.fetch_add(1, Ordering::Relaxed);
                if lock(&self.tracker).ack(&id.shard_id, id.epoch, &id.sequence, id.sub_sequence) {
                    tracing::debug!(stream = %self.cfg.stream, shard = %id.shard_id, sequence = %id.sequence,
                        "dead-letter tuple acked: the record is handled");
                }
            }
        }
    }

    async fn fail(&mut self, id: SpoutMsgId) {
        let id = match id {
            SpoutMsgId::Record(id) => id,
            SpoutMsgId::DeadLetter(id) => {
                self.stats.dead_letters_failed.fetch_add(1, Ordering::Relaxed);
                let failed =
                    lock(&self.tracker).fail_dead_letter(&id.shard_id, id.epoch, &id.sequence, id.sub_sequence);
                if let Some(n) = failed {
                    let (shard, sequence) = (id.shard_id.clone(), id.sequence.clone());
                    let delay = self.schedule(SpoutMsgId::DeadLetter(id), n);
                    // Logged at its 1st, 2nd, 4th, 8th... failure: a dead-letter sink that is down
                    // does not flood the log.
                    if n.is_power_of_two() {
                        tracing::warn!(stream = %self.cfg.stream, shard = %shard, sequence = %sequence, failures = n, ?delay,
                            "the dead-letter tuple failed: emitting it again after a back-off (the record stays unacked, its checkpoint waits)");
                    }
                }
                return;
            }
        };
        self.stats.failed.fetch_add(1, Ordering::Relaxed);
        let outcome =
            lock(&self.tracker).fail(&id.shard_id, id.epoch, &id.sequence, id.sub_sequence, self.cfg.retry.max_replays);
        match outcome {
            FailOutcome::Replay(n) => {
                self.schedule(SpoutMsgId::Record(id), n);
            }
            FailOutcome::DeadLetter(n) => {
                self.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(stream = %self.cfg.stream, shard = %id.shard_id, sequence = %id.sequence, failures = n,
                    "record failed {n} times: emitting it on the dead-letter stream");
                self.dead_letters.push_back(id);
            }
            FailOutcome::Ignore => {}
        }
    }

    async fn drain(&mut self, _out: &mut SpoutOutput<SpoutMsgId>) -> Result<(), ComponentError> {
        // Samza's drain: stop fetching at once; records read but not emitted are dropped (they are
        // after the checkpoint and will be read by the next deployment); in-flight tuples are
        // acked (or replayed) and checkpointed, then the shards are handed back. The engine sends
        // the +infinity watermark and the drain marker behind the last tuple.
        self.draining = true;
        self.active.send_replace(false);
        tracing::info!(topology = %self.cfg.topology, stream = %self.cfg.stream, "draining: stopped fetching");
        Ok(())
    }

    async fn activate(&mut self) {
        self.active.send_replace(true);
    }

    async fn deactivate(&mut self) {
        self.active.send_replace(false);
    }

    async fn close(&mut self) {
        if let Some((cancel, handle)) = self.coordinator.take() {
            cancel.cancel();
            if tokio::time::timeout(Duration::from_secs(30), handle).await.is_err() {
                tracing::warn!(topology = %self.cfg.topology, "the Kinesis spout's coordinator did not stop within 30 s");
            }
        }
        if std::mem::take(&mut self.attached) {
            self.shared.detach().await;
        }
    }
}
