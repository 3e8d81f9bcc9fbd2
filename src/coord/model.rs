//! The JSON documents stored in znodes.
//!
//! Unknown fields are accepted (a newer Squall may add fields); missing or mistyped fields are
//! reported as [`CoordError::Malformed`] naming the znode.

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::error::CoordError;
use super::logic::sequence_cmp;

/// One shard as the leader last listed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRecord {
    pub shard_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_shard_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adjacent_parent_shard_id: Option<String>,
    pub starting_hash_key: String,
    pub ending_hash_key: String,
    /// The shard has an ending sequence number (split, merged or resharded away).
    pub closed: bool,
}

impl ShardRecord {
    /// The parents of this shard (none, one for a split child, two for a merge child).
    pub fn parents(&self) -> impl Iterator<Item = &str> {
        self.parent_shard_id.iter().chain(self.adjacent_parent_shard_id.iter()).map(String::as_str)
    }
}

/// The `shards` znode: every shard of the stream, sorted by `shard_id`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardList {
    pub shards: Vec<ShardRecord>,
    pub updated_at_ms: i64,
    /// The stream's creation time (DescribeStreamSummary) when the list was first written: a
    /// stream deleted and re-created under the same name has the same shard ids but another
    /// creation time, and its checkpoints would point into the old stream's sequence numbers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_created_ms: Option<i64>,
}

impl ShardList {
    /// Builds a list sorted by shard id (the stored form).
    pub fn new(mut shards: Vec<ShardRecord>, updated_at_ms: i64) -> Self {
        shards.sort_by(|a, b| a.shard_id.cmp(&b.shard_id));
        Self { shards, updated_at_ms, stream_created_ms: None }
    }

    /// Looks up one shard (binary search; the list is sorted).
    pub fn get(&self, shard_id: &str) -> Option<&ShardRecord> {
        self.shards
            .binary_search_by(|s| s.shard_id.as_str().cmp(shard_id))
            .ok()
            .map(|i| &self.shards[i])
            .or_else(|| self.shards.iter().find(|s| s.shard_id == shard_id))
    }
}

/// Where reading of a shard resumes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CheckpointPosition {
    /// From the oldest record still retained.
    TrimHorizon,
    /// From the first record at or after this time. LATEST at the first start is persisted as
    /// `AtTimestamp(first start)` so a restart before the first record loses nothing.
    AtTimestamp { millis: i64 },
    /// After this user record: (sequence number as a decimal string, KPL sub-sequence). The
    /// spout reads AT the sequence again and skips the user records at or below the position, so
    /// a checkpoint can stop in the middle of an aggregate.
    AfterSequence { sequence: String, sub_sequence: u64 },
}

impl fmt::Display for CheckpointPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckpointPosition::TrimHorizon => f.write_str("TRIM_HORIZON"),
            CheckpointPosition::AtTimestamp { millis } => write!(f, "AT_TIMESTAMP {millis}"),
            CheckpointPosition::AfterSequence { sequence, sub_sequence } => {
                write!(f, "AFTER_SEQUENCE {sequence}/{sub_sequence}")
            }
        }
    }
}

/// The `checkpoints/{shardId}` znode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub position: CheckpointPosition,
    /// The shard was read to its end and every record of it acked; children may start.
    pub finished: bool,
    pub updated_at_ms: i64,
    /// Which task wrote it (for operators); free-form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer: Option<String>,
}

impl Checkpoint {
    /// An unfinished checkpoint at `position`.
    pub fn at(position: CheckpointPosition, updated_at_ms: i64) -> Self {
        Self { position, finished: false, updated_at_ms, writer: None }
    }

    /// Checks what can be checked without the stored value.
    pub(crate) fn validate(&self, shard_id: &str) -> Result<(), CoordError> {
        if let CheckpointPosition::AfterSequence { sequence, .. } = &self.position
            && (sequence.is_empty() || !sequence.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(CoordError::InvalidCheckpoint {
                shard_id: shard_id.to_string(),
                reason: format!("sequence number {sequence:?} is not a decimal number"),
            });
        }
        Ok(())
    }

    /// True when writing `self` over `current` would move the shard backwards.
    ///
    /// A finished checkpoint may always be written (shard end). Otherwise: a finished shard is never
    /// reopened, and an `AfterSequence` checkpoint only moves forward (by sequence, then
    /// sub-sequence); replacing an `AfterSequence` with a start position is a rewind too.
    /// Ending-sequence sentinels never take part: only stored checkpoints are compared.
    pub fn moves_back_from(&self, current: &Checkpoint) -> bool {
        use CheckpointPosition::*;
        if self.finished {
            return false;
        }
        if current.finished {
            return true;
        }
        match (&current.position, &self.position) {
            (
                AfterSequence { sequence: cur, sub_sequence: cur_sub },
                AfterSequence { sequence: new, sub_sequence: new_sub },
            ) => sequence_cmp(new, cur).then(new_sub.cmp(cur_sub)).is_lt(),
            (AfterSequence { .. }, TrimHorizon | AtTimestamp { .. }) => true,
            _ => false,
        }
    }
}

/// A value with the znode version it was read at (for compare-and-set writes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned<T> {
    pub value: T,
    pub version: i32,
}

/// The data of a `tasks/task-N` znode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskInfo {
    pub worker_id: String,
    pub host: String,
    pub pid: u32,
    pub task_index: u32,
    pub since_ms: i64,
    /// The task's ZooKeeper session (hex), set by `register_task`; matches its leases' `writer`.
    #[serde(default)]
    pub session: String,
    /// The id of the registration attempt that created the node, set by `register_task`: after
    /// a create whose answer was lost, its task finds the node by it (`ZkStore::find_task`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub registration: String,
}

/// The data of `streams/{stream}/first_start`: the topology's first start on the stream, in
/// progress. Written before the first starting position is persisted and removed once the shard
/// list is written, so a first start cut short (a crash, a lost connection between the ~2N
/// creates) is resumed by the next leader with the same decision: every shard of that start gets
/// the configured initial position, LATEST the same time, not TRIM_HORIZON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirstStart {
    /// LATEST of this first start as a time (ms since the epoch, the service's clock); 0 when
    /// the initial position is not LATEST.
    pub latest_ms: i64,
    /// When it began (ms since the epoch).
    pub started_at_ms: i64,
}

/// The data of `streams/{stream}/committed`: the stream's committed watermark as the leader last
/// computed it from the spout tasks' reports (every `committed_watermark_interval_ms`), so that a
/// reader (a window firer) reads one znode instead of the assignment and every task's report.
/// A reading stays true once true (acks are never taken back), so a stale one only delays.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedWatermark {
    /// The committed watermark (ms since the epoch), or `None` with `why`.
    #[serde(default)]
    pub watermark_ms: Option<i64>,
    /// Why there is none (no report yet, a task without one, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// When the leader computed it (ms since the epoch).
    pub computed_at_ms: i64,
}

/// The data of a `firers/{component}/task-N` znode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirerInfo {
    /// The firer's ZooKeeper session (hex).
    pub session: String,
    /// The id of the registration attempt that created the node (see [`TaskInfo::registration`]).
    #[serde(default)]
    pub registration: String,
}

/// Reading status of one shard, as its owning task last saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRuntime {
    /// The task reading it.
    pub task: String,
    /// Last MillisBehindLatest from GetRecords.
    #[serde(default)]
    pub millis_behind_latest: Option<i64>,
    /// Last read error, cleared by the next successful read.
    #[serde(default)]
    pub last_error: Option<String>,
    /// Records read by this owner.
    #[serde(default)]
    pub records_read: u64,
    /// False when the last error is one that retrying cannot fix (access denied, a broken
    /// checkpoint, a deleted stream): an operator must act.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub retryable: bool,
    /// Since when (ms since the epoch) the shard has been failing, if it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_since_ms: Option<i64>,
    /// The kind of the last error (`access_denied`, `kms_key`, `not_found`, `throttled`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<String>,
    /// GetRecords calls for this shard by this owner.
    #[serde(default)]
    pub get_records_calls: u64,
    /// Enhanced fan-out counters (absent when the shard is polled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efo: Option<EfoRuntime>,
}

/// Enhanced fan-out counters of one shard, by its current owner.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EfoRuntime {
    /// Events received (empty ones included).
    pub events: u64,
    /// Subscriptions opened.
    pub subscriptions: u64,
    /// Subscriptions renewed after one ended.
    pub resubscriptions: u64,
    /// Subscriptions dropped by the silence watchdog.
    pub watchdog: u64,
    /// SubscribeToShard refused with ResourceInUse, retried.
    pub in_use: u64,
    /// The consumer found deregistered and registered again.
    #[serde(default)]
    pub reregistered: u64,
}

impl Default for ShardRuntime {
    fn default() -> Self {
        Self {
            task: String::new(),
            millis_behind_latest: None,
            last_error: None,
            records_read: 0,
            retryable: true,
            error_since_ms: None,
            error_kind: None,
            get_records_calls: 0,
            efo: None,
        }
    }
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// The `workers/{workerId}` znode: a live worker's status, refreshed every few seconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerStatus {
    pub worker_id: String,
    pub host: String,
    pub pid: u32,
    pub since_ms: i64,
    pub updated_at_ms: i64,
    /// The worker's spout task nodes (`task-N`).
    #[serde(default)]
    pub tasks: Vec<String>,
    /// Shards its tasks own, with lag and errors.
    #[serde(default)]
    pub shards: std::collections::BTreeMap<String, ShardRuntime>,
    /// Per-component counters (the engine's metrics snapshot).
    #[serde(default)]
    pub components: serde_json::Value,
    /// The worker's stages when the topology has several ([`crate::stage`]): each stage's input
    /// stream and its control-record counters. Empty for a single-stage topology.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<StageRuntime>,
    /// KPL de-aggregation counters of the worker's spout tasks (absent when it read no aggregate).
    #[serde(default, skip_serializing_if = "KplRuntime::is_empty")]
    pub kpl: KplRuntime,
    /// The worker's primary source stream: its shards are keyed by shard id in `shards` (and its
    /// tasks by name in `tasks`); those of any other stream by `{stream}/{id}`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stream: String,
    /// Where the worker's Prometheus endpoint (`--metrics-addr`) can be dialed, `host:port`
    /// (the port it really listens on; see `--metrics-advertise`); absent without an endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_addr: Option<String>,
}

/// KPL de-aggregation counters of a worker, since it started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KplRuntime {
    /// Valid aggregates read.
    pub aggregates: u64,
    /// User records taken out of them (delivered or dropped).
    pub user_records: u64,
    /// User records whose hash key is outside the hash range of the shard they were read from:
    /// delivered with `kpl_out_of_range: deliver` (the default), dropped with their aggregate with
    /// `drop_aggregate` (then also in `dropped`). Before Squall delivered them by default this
    /// counted drops.
    pub out_of_range: u64,
    /// User records dropped with their whole aggregate (`kpl_out_of_range: drop_aggregate` only).
    #[serde(default)]
    pub dropped: u64,
    /// Aggregates dropped whole (`kpl_out_of_range: drop_aggregate` only).
    #[serde(default)]
    pub dropped_aggregates: u64,
    /// Records with the KPL magic bytes that were not valid aggregates (bad MD5 or protobuf),
    /// delivered whole as plain records.
    pub corrupt: u64,
}

impl KplRuntime {
    fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// One stage of a worker, in its status.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageRuntime {
    /// The stage's name.
    pub name: String,
    /// The stream it reads: the source stream, or an intermediate stream.
    pub input: String,
    /// Watermark control records its input consumed.
    #[serde(default)]
    pub watermark_records: u64,
    /// Drain markers of this deployment its input consumed.
    #[serde(default)]
    pub drain_markers: u64,
    /// Drain markers of other deployments, ignored.
    #[serde(default)]
    pub stale_drain_markers: u64,
    /// Records of its input that were not valid stage records (skipped, logged).
    #[serde(default)]
    pub malformed: u64,
}

/// Topology lifecycle states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Lifecycle {
    Active,
    Inactive,
    Draining,
    Drained,
    Killed,
}

/// The `state` znode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopologyState {
    pub state: Lifecycle,
    pub deployment_id: String,
    pub updated_at_ms: i64,
    /// With `Killed`: how long workers wait for in-flight tuples before stopping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kill_wait_ms: Option<u64>,
}

/// The data of a lease znode (for operators; ownership is decided by the sequence only, and the
/// holder is also part of the node name).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseInfo {
    pub writer: String,
    pub session_id: String,
    pub since_ms: i64,
    /// The holder (a task node name, or `cli-{session}` for operator tools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
}

/// The `assignment` znode: which live task reads which readable shard. The leader writes it
/// (fenced on its task node); `squall rebalance` replaces it with a [`RebalanceRequest`] once
/// every shard was handed back. Every worker watches it. Tasks missing from `tasks` read nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// Bumped on every write.
    pub generation: u64,
    /// The leader task that wrote it.
    pub leader: String,
    /// Task node name -> shard ids, each sorted.
    pub tasks: std::collections::BTreeMap<String, Vec<String>>,
    pub updated_at_ms: i64,
    /// Set when the leader refuses to assign anything (e.g. the stream was re-created under the
    /// same name); says what to do. Every task stops reading while it is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Set by `squall rebalance` (with no task named): the next assignment is computed from
    /// scratch, once the tasks are back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebalance: Option<RebalanceRequest>,
}

/// A `squall rebalance` waiting for the tasks to register again. The leader assigns nothing
/// until `tasks` tasks are registered, or `gather_ms` passed since it first saw the request;
/// then it assigns round-robin over the sorted tasks and shards, not sticky. Gathering first
/// makes the result the same however the re-registrations are spread in time: a from-scratch
/// assignment over the first task back, then sticky joins of the others, is balanced but not
/// round-robin.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebalanceRequest {
    /// The tasks registered on the stream before the rebalance deactivated the topology.
    pub tasks: usize,
    /// How long the leader waits for them, from when it first sees the request.
    pub gather_ms: u64,
}

impl Assignment {
    /// The shards assigned to `task` (none when absent).
    pub fn shards_of(&self, task: &str) -> &[String] {
        self.tasks.get(task).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The owner the assignment names for every shard.
    pub fn owner_of(&self) -> std::collections::BTreeMap<&str, &str> {
        self.tasks.iter().flat_map(|(t, shards)| shards.iter().map(move |s| (s.as_str(), t.as_str()))).collect()
    }
}

/// The `streams/{stream}/watermarks/{task}` znode (EPHEMERAL, in the task's session): a spout
/// task's committed watermark, as of the assignment generation it last reconciled with. The
/// stream's committed watermark is the minimum over the tasks of the current assignment, counted
/// only when every one of them reported for that generation ([`super::ZkStore::committed_watermark`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatermarkReport {
    /// The generation of the assignment the task last reconciled with: the report covers the
    /// shards that assignment gives the task, and no other.
    pub generation: u64,
    /// Every record of those shards with an arrival time (ms since the epoch) below it is acked;
    /// `None` while unknown (a shard not taken yet, or nothing read from it yet).
    pub watermark_ms: Option<i64>,
    /// When the task wrote it (ms since the epoch).
    pub updated_at_ms: i64,
}

/// Parses znode data, naming the path in the error.
pub(crate) fn decode<T: DeserializeOwned>(path: &str, what: &str, data: &[u8]) -> Result<T, CoordError> {
    if data.is_empty() {
        return Err(CoordError::Malformed {
            path: path.to_string(),
            reason: format!("empty znode, expected {what} JSON"),
        });
    }
    serde_json::from_slice(data)
        .map_err(|e| CoordError::Malformed { path: path.to_string(), reason: format!("not valid {what} JSON ({e})") })
}

/// Serializes a value (our own types never fail to serialize).
pub(crate) fn encode<T: Serialize>(path: &str, value: &T) -> Result<Vec<u8>, CoordError> {
    serde_json::to_vec(value)
        .map_err(|e| CoordError::Malformed { path: path.to_string(), reason: format!("cannot serialize: {e}") })
}

/// A wall clock that replaces the system clock on one thread ([`set_thread_clock`]).
pub type WallClock = std::sync::Arc<dyn Fn() -> i64 + Send + Sync>;

thread_local! {
    static THREAD_CLOCK: std::cell::RefCell<Option<WallClock>> = const { std::cell::RefCell::new(None) };
}

/// Makes [`now_ms`] read `clock` on this thread (`None`: the system clock again). The simulator
/// runs a whole fleet on one thread and gives it simulated time this way; nothing else sets it.
pub fn set_thread_clock(clock: Option<WallClock>) {
    THREAD_CLOCK.with(|c| *c.borrow_mut() = clock);
}

/// Milliseconds since the Unix epoch, by this process's wall clock: the system clock plus the
/// offset of [`CLOCK_OFFSET_ENV`] (0 unless set; read once), or this thread's clock when one was
/// set ([`set_thread_clock`]).
pub fn now_ms() -> i64 {
    if let Some(ms) = THREAD_CLOCK.with(|c| c.borrow().as_ref().map(|f| f())) {
        return ms;
    }
    static OFFSET: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    let offset = *OFFSET.get_or_init(|| clock_offset_ms().unwrap_or(0));
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
        .saturating_add(offset)
}

/// Fault injection for tests: milliseconds added to this process's wall clock ([`now_ms`]), so a
/// worker runs with its clock ahead of (or behind) the Kinesis service's. Not for production.
#[doc(hidden)]
pub const CLOCK_OFFSET_ENV: &str = "SQUALL_CLOCK_OFFSET_MS";

/// The offset [`CLOCK_OFFSET_ENV`] sets (0 when unset); the error names the variable and the fix.
#[doc(hidden)]
pub fn clock_offset_ms() -> Result<i64, String> {
    match std::env::var(CLOCK_OFFSET_ENV) {
        Err(_) => Ok(0),
        Ok(v) if v.trim().is_empty() => Ok(0),
        Ok(v) => v.trim().parse::<i64>().map_err(|_| {
            format!(
                "{CLOCK_OFFSET_ENV}={v:?} is not a whole number of milliseconds; unset it (it shifts this process's \
                 wall clock, for tests only) or give e.g. 60000"
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(seq: &str, sub: u64) -> Checkpoint {
        Checkpoint::at(CheckpointPosition::AfterSequence { sequence: seq.into(), sub_sequence: sub }, 0)
    }

    #[test]
    fn json_round_trip_and_forward_compat() {
        let cp = after("49590338271490256608559692538361571095921575989136588898", 3);
        let json = serde_json::to_string(&cp).unwrap();
        assert!(json.contains(r#""type":"AFTER_SEQUENCE""#), "{json}");
        assert_eq!(decode::<Checkpoint>("/p", "checkpoint", json.as_bytes()).unwrap(), cp);
        // Unknown fields from a newer version are accepted.
        let newer = r#"{"position":{"type":"TRIM_HORIZON","x":1},"finished":false,"updated_at_ms":5,"future":true}"#;
        let cp: Checkpoint = decode("/p", "checkpoint", newer.as_bytes()).unwrap();
        assert_eq!(cp.position, CheckpointPosition::TrimHorizon);
        let err = decode::<Checkpoint>("/s/checkpoints/a", "checkpoint", b"{\"finished\":1").unwrap_err();
        assert!(err.to_string().contains("/s/checkpoints/a"), "{err}");
        assert!(decode::<Checkpoint>("/p", "checkpoint", b"").is_err());
    }

    #[test]
    fn moving_back() {
        let big = "49590338271490256608559692538361571095921575989136588898";
        let sentinel = "9223372036854775807";
        assert!(after(sentinel, 0).moves_back_from(&after(big, 0)), "shorter number is smaller");
        assert!(!after(big, 0).moves_back_from(&after(sentinel, 0)));
        assert!(after(big, 0).moves_back_from(&after(big, 1)));
        assert!(!after(big, 1).moves_back_from(&after(big, 1)), "same position is not backwards");
        assert!(Checkpoint::at(CheckpointPosition::TrimHorizon, 0).moves_back_from(&after(big, 0)));
        assert!(!after("1", 0).moves_back_from(&Checkpoint::at(CheckpointPosition::TrimHorizon, 0)));
        let mut fin = after(big, 0);
        fin.finished = true;
        assert!(after(big, 5).moves_back_from(&fin), "a finished shard is never reopened");
        let mut fin_low = after("1", 0);
        fin_low.finished = true;
        assert!(!fin_low.moves_back_from(&after(big, 0)), "finishing is always allowed");
    }

    #[test]
    fn validate_sequence_digits() {
        assert!(after("12a", 0).validate("s").is_err());
        assert!(after("", 0).validate("s").is_err());
        assert!(after("0012", 0).validate("s").is_ok());
    }
}

/// The `drain` znode: Samza's drain notification. Only workers of this deployment obey it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainRequest {
    /// The deployment to drain.
    pub deployment_id: String,
    /// When it was requested (ms since the epoch).
    pub requested_at_ms: i64,
}
