//! Configuration of the Kinesis spout: serde (JSON file or defaults + flags), validated once, then
//! used to build the running spout.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::coord::{ZkAuth, ZkConfig};
use crate::kinesis::KinesisEndpoint;

/// Where reading starts the first time a topology reads a stream. It applies once, to the shards
/// that exist then, and is persisted at once in their checkpoints; shards that appear later
/// (children of a split or merge) always start at TRIM_HORIZON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE", tag = "type")]
pub enum InitialPosition {
    /// The oldest retained record.
    #[default]
    TrimHorizon,
    /// Records that arrive after the first start. Persisted as AT_TIMESTAMP(first start), so a
    /// restart before the first record arrives still loses nothing; closed shards are skipped.
    /// The first start's time is the Kinesis service's (from the `Date` header of its answers)
    /// when this worker's clock is off by more than a second: a clock ahead would skip what is
    /// written until the service's clock catches up.
    Latest,
    /// Records that arrived at or after this time (milliseconds since the epoch, compared with
    /// the Kinesis service's clock). A time later than the service's clock is refused by Kinesis
    /// until the service's clock passes it; the reader retries until then.
    AtTimestamp {
        /// Milliseconds since the Unix epoch.
        millis: i64,
    },
}

impl std::str::FromStr for InitialPosition {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "trim-horizon" => Ok(Self::TrimHorizon),
            "latest" => Ok(Self::Latest),
            other => {
                let ms = other.strip_prefix("at-timestamp:").unwrap_or(other);
                ms.parse::<i64>().map(|millis| Self::AtTimestamp { millis }).map_err(|_| {
                    format!("{s:?} is not an initial position; use trim-horizon, latest or at-timestamp:<millis since epoch>")
                })
            }
        }
    }
}

/// How the spout reads its shards: polling (GetRecords, the default) or enhanced fan-out.
///
/// Written `polling` or `efo:NAME` (in JSON, a string; on the command line, `--consumer`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Consumer {
    /// GetShardIterator + GetRecords per owned shard (shares the shard's 2 MB/s read limit with
    /// every other polling consumer).
    #[default]
    Polling,
    /// Enhanced fan-out: registers the stream consumer `NAME` (idempotently) and subscribes to
    /// each owned shard (SubscribeToShard, an HTTP/2 event stream with a dedicated 2 MB/s).
    Efo {
        /// The stream consumer's name (1-128 of a-z, A-Z, 0-9, _ . -).
        name: String,
    },
}

impl Consumer {
    /// The consumer name of an EFO consumer.
    pub fn efo_name(&self) -> Option<&str> {
        match self {
            Consumer::Polling => None,
            Consumer::Efo { name } => Some(name),
        }
    }
}

impl fmt::Display for Consumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Consumer::Polling => f.write_str("polling"),
            Consumer::Efo { name } => write!(f, "efo:{name}"),
        }
    }
}

/// Whether `name` is a valid Kinesis stream consumer name.
pub(crate) fn consumer_name_ok(name: &str) -> bool {
    !name.is_empty() && name.len() <= 128 && name.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
}

impl std::str::FromStr for Consumer {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("polling") {
            return Ok(Consumer::Polling);
        }
        match s.split_once(':') {
            Some((kind, name)) if kind.eq_ignore_ascii_case("efo") => {
                if consumer_name_ok(name) {
                    Ok(Consumer::Efo { name: name.to_string() })
                } else {
                    Err(format!(
                        "{name:?} is not a Kinesis stream consumer name: use 1-128 characters of a-z, A-Z, 0-9, _ . - \
                         (e.g. --consumer efo:my-app)"
                    ))
                }
            }
            _ => Err(format!("{s:?} is not a consumer; use `polling` (the default) or `efo:NAME` (enhanced fan-out)")),
        }
    }
}

impl Serialize for Consumer {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Consumer {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What the spout does with a KPL aggregate that holds user records whose hash key (explicit hash
/// key, else MD5 of the partition key) is outside the hash range of the shard it was read from.
/// Either way they are counted (`kpl.out_of_range` in `squall status`,
/// `squall_spout_kpl_out_of_range_total`).
///
/// Two producers put such aggregates, and each choice costs something with one of them:
/// - AWS's aggregation library (`aws-kinesis-agg`, typical of Lambda producers) packs user
///   records of ANY keys into one aggregate, routed by the first record's key, and never sends
///   them again: dropping them loses them for good (the KCL's oldest data-loss trap,
///   awslabs/kinesis-aggregation#11).
/// - The KPL packs only records it predicts for one shard; when an aggregate lands on another
///   shard (its shard map was stale after a reshard) it sends the WHOLE aggregate's user records
///   again, to the right shards: delivering them delivers those records twice.
///
/// Written `deliver` or `drop_aggregate` (JSON key `kpl_out_of_range`; worker flag
/// `--kpl-out-of-range`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KplOutOfRange {
    /// Deliver every user record of every aggregate (the default): nothing is lost whatever wrote
    /// it; after a reshard a KPL producer with a stale shard map causes duplicates (the records
    /// of its re-sent aggregates, delivered again from their own shards).
    #[default]
    Deliver,
    /// The KCL's behaviour: an aggregate holding any user record outside the shard's hash range
    /// is dropped whole (every user record of it), counted (`kpl.dropped`,
    /// `kpl.dropped_aggregates`) and logged. No duplicates from the KPL's re-sends, but records of
    /// producers that never re-send (`aws-kinesis-agg`, Lambda) are LOST.
    DropAggregate,
}

impl KplOutOfRange {
    /// The configuration word.
    pub fn as_str(self) -> &'static str {
        match self {
            KplOutOfRange::Deliver => "deliver",
            KplOutOfRange::DropAggregate => "drop_aggregate",
        }
    }
}

impl fmt::Display for KplOutOfRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for KplOutOfRange {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().replace('-', "_").as_str() {
            "deliver" => Ok(KplOutOfRange::Deliver),
            "drop_aggregate" => Ok(KplOutOfRange::DropAggregate),
            _ => Err(format!(
                "kpl_out_of_range {s:?} is not a choice: use `deliver` (the default: every user record delivered, \
                 duplicates possible after a reshard with a KPL producer) or `drop_aggregate` (the KCL's: an \
                 aggregate holding a user record outside the shard's hash range dropped whole; loses the records \
                 of producers that never re-send, such as aws-kinesis-agg)"
            )),
        }
    }
}

impl Serialize for KplOutOfRange {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for KplOutOfRange {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Enhanced fan-out settings (used with `consumer: "efo:NAME"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EfoSettings {
    /// How long the spout waits for a newly registered consumer to become ACTIVE (ms; AWS takes
    /// a few seconds). The spout fails with an error naming the consumer and the stream after it.
    #[serde(default = "default_efo_register_timeout_ms")]
    pub register_timeout_ms: u64,
    /// A subscription silent for this long (no event, not even an empty one: Kinesis sends one
    /// every few seconds) is dropped and renewed from its continuation sequence (ms).
    #[serde(default = "default_efo_silence_timeout_ms")]
    pub silence_timeout_ms: u64,
    /// Renew every subscription after this long (ms), before Kinesis ends it (5 minutes). None by
    /// default: a subscription is renewed when Kinesis ends it. Tests set a few seconds.
    #[serde(default)]
    pub renew_after_ms: Option<u64>,
    /// At most one ListShards call per this interval per task (ms) to learn whether a shard
    /// that an empty event showed caught up is closed (an emulator that never sends ChildShards
    /// needs it; see ARCHITECTURE.md).
    #[serde(default = "default_efo_end_check_ms")]
    pub end_check_interval_ms: u64,
}

fn default_efo_register_timeout_ms() -> u64 {
    60_000
}
fn default_efo_silence_timeout_ms() -> u64 {
    35_000
}
fn default_efo_end_check_ms() -> u64 {
    5_000
}

impl Default for EfoSettings {
    fn default() -> Self {
        Self {
            register_timeout_ms: default_efo_register_timeout_ms(),
            silence_timeout_ms: default_efo_silence_timeout_ms(),
            renew_after_ms: None,
            end_check_interval_ms: default_efo_end_check_ms(),
        }
    }
}

/// ZooKeeper settings of the spout.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZkSettings {
    /// Connect string, `host:port[,host:port...]`.
    #[serde(default = "default_zk")]
    pub connect: String,
    /// Root znode under which Squall keeps its state.
    #[serde(default = "default_root")]
    pub root: String,
    /// Session timeout in milliseconds: a crashed worker's shards are taken over after it.
    #[serde(default = "default_session_ms")]
    pub session_timeout_ms: u64,
    /// Digest-auth user (optional).
    #[serde(default)]
    pub auth_user: Option<String>,
    /// Digest-auth password (optional; never logged or printed).
    #[serde(default)]
    pub auth_password: Option<String>,
}

impl fmt::Debug for ZkSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkSettings")
            .field("connect", &self.connect)
            .field("root", &self.root)
            .field("session_timeout_ms", &self.session_timeout_ms)
            .field("auth_user", &self.auth_user)
            .field("auth_password", &self.auth_password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

fn default_zk() -> String {
    crate::coord::config::DEFAULT_CONNECT.to_string()
}
fn default_root() -> String {
    crate::coord::config::DEFAULT_ROOT.to_string()
}
fn default_session_ms() -> u64 {
    10_000
}

impl Default for ZkSettings {
    fn default() -> Self {
        Self {
            connect: default_zk(),
            root: default_root(),
            session_timeout_ms: default_session_ms(),
            auth_user: None,
            auth_password: None,
        }
    }
}

impl ZkSettings {
    /// The coordination store's config.
    pub fn to_zk_config(&self) -> ZkConfig {
        let mut cfg = ZkConfig::new(self.connect.clone())
            .with_root(self.root.clone())
            .with_session_timeout(Duration::from_millis(self.session_timeout_ms));
        if let Some(user) = &self.auth_user {
            cfg = cfg.with_auth(ZkAuth::digest(user.clone(), self.auth_password.clone().unwrap_or_default()));
        }
        cfg
    }
}

/// Retry policy for failed tuples and for Kinesis calls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// Replays of a failed tuple before it goes to the dead-letter stream.
    #[serde(default = "default_max_replays")]
    pub max_replays: u32,
    /// First replay delay (doubles per failure, with jitter).
    #[serde(default = "default_replay_min_ms")]
    pub replay_min_backoff_ms: u64,
    /// Cap of the replay delay.
    #[serde(default = "default_replay_max_ms")]
    pub replay_max_backoff_ms: u64,
    /// First back-off after a throttled or failed Kinesis call (also the first one after an
    /// error retrying cannot fix).
    #[serde(default = "default_call_min_ms")]
    pub call_min_backoff_ms: u64,
    /// Cap of the back-off after throttles and transport or server errors (which reuse the same
    /// shard iterator).
    #[serde(default = "default_call_max_ms")]
    pub call_max_backoff_ms: u64,
    /// Cap of the back-off after an error retrying cannot fix: access denied (IAM policy), the
    /// stream's KMS key refusing, the stream or shard deleted, an invalid argument. The reader
    /// keeps trying (so it resumes by itself once an operator fixed the cause), doubling the
    /// wait up to this cap, and logs each attempt at ERROR with the fix.
    #[serde(default = "default_fatal_max_ms")]
    pub fatal_max_backoff_ms: u64,
}

fn default_max_replays() -> u32 {
    5
}
fn default_replay_min_ms() -> u64 {
    100
}
fn default_replay_max_ms() -> u64 {
    10_000
}
fn default_call_min_ms() -> u64 {
    100
}
fn default_call_max_ms() -> u64 {
    5_000
}
fn default_fatal_max_ms() -> u64 {
    60_000
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_replays: default_max_replays(),
            replay_min_backoff_ms: default_replay_min_ms(),
            replay_max_backoff_ms: default_replay_max_ms(),
            call_min_backoff_ms: default_call_min_ms(),
            call_max_backoff_ms: default_call_max_ms(),
            fatal_max_backoff_ms: default_fatal_max_ms(),
        }
    }
}

/// The Kinesis spout's configuration.
///
/// ```
/// let cfg: squall::spout::KinesisSpoutConfig = serde_json::from_str(r#"{
///     "topology": "clicks", "stream": "clicks",
///     "initial_position": {"type": "LATEST"},
///     "zookeeper": {"connect": "127.0.0.1:2181"}
/// }"#).unwrap();
/// cfg.validate().unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KinesisSpoutConfig {
    /// Topology name: the ZooKeeper state lives under `{root}/topologies/{topology}`.
    pub topology: String,
    /// Kinesis stream to read.
    pub stream: String,
    /// Kinesis endpoint and region (credentials come from the aws-config chain).
    #[serde(default)]
    pub kinesis: KinesisEndpoint,
    /// Where reading starts at the topology's first start on the stream.
    #[serde(default)]
    pub initial_position: InitialPosition,
    /// Records per GetRecords call (1..=10000; 10000 by default, as KCL: a smaller value caps a
    /// shard's read rate, e.g. 1000 at 5 calls per second is 5,000 records/s). It is also the
    /// bound, in records, of a shard's queue of read-but-unemitted records.
    #[serde(default = "default_records_per_get")]
    pub records_per_get: i32,
    /// Bound, in bytes, of each owned shard's queue of records read but not yet emitted (payload,
    /// partition key, sequence number and about 200 bytes of overhead per record); 1 MiB by
    /// default, so a worker owning 50 shards queues at most about 50 MiB. The reader fetches
    /// while the queue is at most half full and sizes each GetRecords call's Limit to the room
    /// left, from its estimate of the shard's record size. Raise it for many small records read
    /// at high rates, lower it for many shards per worker. At least 65536; a queue always takes
    /// at least one record, whatever its size.
    #[serde(default = "default_max_queued_bytes")]
    pub max_queued_bytes_per_shard: u64,
    /// Bytes of GetRecords responses a spout task's readers may be fetching at once (estimated:
    /// each call reserves its Limit times the shard's estimated record size, until its records
    /// are queued); 8 MiB by default. It bounds the transient memory of many shards fetching
    /// together (a response is held as JSON and decoded before it is queued): 50 readers each
    /// fetching 1 MiB at the same moment would otherwise hold 50 MiB of responses on top of the
    /// queues. At least 65536; a call larger than the whole budget waits until it is free.
    #[serde(default = "default_max_read_bytes_in_flight")]
    pub max_read_bytes_in_flight: u64,
    /// Wait after a GetRecords call that returned nothing (ms): an idle shard costs one call
    /// per interval. 1000 by default (a record arriving in an idle shard waits up to this long).
    #[serde(default = "default_idle_poll_ms")]
    pub idle_poll_interval_ms: u64,
    /// GetRecords calls per shard in any one second (1..=5: Kinesis allows 5 per second per
    /// shard). A reader catching up calls again at once while the second has room; at the
    /// shard's tip its calls go `1020 / n` ms apart (204 ms at 5).
    #[serde(default = "default_max_gets_per_second")]
    pub max_get_calls_per_second: u32,
    /// How often a moved checkpoint is written (ms); at most one write per shard per interval.
    #[serde(default = "default_checkpoint_ms")]
    pub checkpoint_interval_ms: u64,
    /// How often the leader lists the stream's shards (ms). A read that reaches a shard's end
    /// triggers a listing at once.
    #[serde(default = "default_discovery_ms")]
    pub shard_discovery_interval_ms: u64,
    /// Full re-read of ZooKeeper state even without notifications (ms), a safety net.
    #[serde(default = "default_resync_ms")]
    pub resync_interval_ms: u64,
    /// How long a handoff waits for in-flight tuples before releasing anyway (ms). The rest are
    /// replayed by the next owner from the checkpoint.
    #[serde(default = "default_handoff_ms")]
    pub handoff_timeout_ms: u64,
    /// Retry and replay policy.
    #[serde(default)]
    pub retry: RetryPolicy,
    /// ZooKeeper.
    #[serde(default)]
    pub zookeeper: ZkSettings,
    /// Optional JSON-lines read log (shard, first/last sequence, time) for audits and tests.
    #[serde(default)]
    pub read_log: Option<String>,
    /// A shard with no new record for this long (ms), whose reader is caught up with its tip,
    /// stops holding the low watermark back.
    #[serde(default = "default_idle_timeout_ms")]
    pub watermark_idle_timeout_ms: u64,
    /// How often the spout task emits its low watermark (ms).
    #[serde(default = "default_watermark_interval_ms")]
    pub watermark_interval_ms: u64,
    /// How often (ms) each spout task may publish its committed watermark (every record of its
    /// shards with an arrival time below it acked) to ZooKeeper, `streams/{stream}/watermarks/{task}`,
    /// from which [`crate::coord::ZkStore::committed_watermark`] computes the stream's. 0 (the
    /// default): not published. Otherwise at least 100; a task writes at most once per interval,
    /// and only when its report (assignment generation, watermark) changed: one ZooKeeper write
    /// per task per interval at most. Not published by the readers of a stage's intermediate
    /// stream (their records' arrival times are not event times of the source).
    #[serde(default)]
    pub committed_watermark_interval_ms: u64,
    /// This spout reads the intermediate stream of a stage boundary (set by
    /// [`crate::stage`], not by hand): its records are Squall stage records (decoded into the
    /// boundary stream's fields; control records update watermarks and drain), and its tasks
    /// register under the stream (`streams/{stream}/tasks`), apart from the other stages'.
    #[serde(default)]
    pub stage_input: bool,
    /// Its tasks register under the stream (`streams/{stream}/source-tasks`) instead of the topology's
    /// `tasks/`, so the stream's shards are assigned over the tasks reading it alone. Set by the
    /// worker for every source stream but the primary when it reads several (`--stream a
    /// --stream b`), not by hand.
    #[serde(default)]
    pub stream_tasks: bool,
    /// `polling` (the default) or `efo:NAME` (enhanced fan-out through the stream consumer NAME,
    /// registered when missing).
    #[serde(default)]
    pub consumer: Consumer,
    /// Enhanced fan-out tuning (subscription renewal, silence watchdog, registration wait).
    #[serde(default)]
    pub efo: EfoSettings,
    /// KPL aggregates holding user records outside the shard's hash range: `deliver` (the
    /// default: nothing lost; duplicates after a reshard with a stale KPL producer) or
    /// `drop_aggregate` (the KCL's: dropped whole, counted and logged; loses the records of
    /// producers that never re-send, such as `aws-kinesis-agg` in Lambda). See [`KplOutOfRange`].
    #[serde(default)]
    pub kpl_out_of_range: KplOutOfRange,
}

/// The shortest `committed_watermark_interval_ms` other than 0 (the coordinator's tick).
pub const MIN_COMMITTED_WATERMARK_INTERVAL_MS: u64 = 100;

fn default_idle_timeout_ms() -> u64 {
    5_000
}
fn default_watermark_interval_ms() -> u64 {
    200
}

fn default_records_per_get() -> i32 {
    10_000
}
fn default_max_queued_bytes() -> u64 {
    1 << 20
}
fn default_max_read_bytes_in_flight() -> u64 {
    8 << 20
}
fn default_idle_poll_ms() -> u64 {
    1_000
}
fn default_max_gets_per_second() -> u32 {
    5
}
fn default_checkpoint_ms() -> u64 {
    1_000
}
fn default_discovery_ms() -> u64 {
    10_000
}
fn default_resync_ms() -> u64 {
    5_000
}
fn default_handoff_ms() -> u64 {
    30_000
}

/// A configuration value that is wrong; names the key and the fix.
#[derive(Debug, thiserror::Error)]
#[error("invalid spout configuration: `{key}` {reason}")]
pub struct SpoutConfigError {
    /// The config key.
    pub key: &'static str,
    /// What is wrong and how to fix it.
    pub reason: String,
}

impl KinesisSpoutConfig {
    /// Defaults for everything but the names.
    pub fn new(topology: impl Into<String>, stream: impl Into<String>) -> Self {
        Self {
            topology: topology.into(),
            stream: stream.into(),
            kinesis: KinesisEndpoint::default(),
            initial_position: InitialPosition::default(),
            records_per_get: default_records_per_get(),
            max_queued_bytes_per_shard: default_max_queued_bytes(),
            max_read_bytes_in_flight: default_max_read_bytes_in_flight(),
            idle_poll_interval_ms: default_idle_poll_ms(),
            max_get_calls_per_second: default_max_gets_per_second(),
            checkpoint_interval_ms: default_checkpoint_ms(),
            shard_discovery_interval_ms: default_discovery_ms(),
            resync_interval_ms: default_resync_ms(),
            handoff_timeout_ms: default_handoff_ms(),
            retry: RetryPolicy::default(),
            zookeeper: ZkSettings::default(),
            read_log: None,
            watermark_idle_timeout_ms: default_idle_timeout_ms(),
            watermark_interval_ms: default_watermark_interval_ms(),
            committed_watermark_interval_ms: 0,
            stage_input: false,
            stream_tasks: false,
            consumer: Consumer::default(),
            efo: EfoSettings::default(),
            kpl_out_of_range: KplOutOfRange::default(),
        }
    }

    /// Checks every value; the error names the key and the fix.
    pub fn validate(&self) -> Result<(), SpoutConfigError> {
        let err = |key, reason: String| Err(SpoutConfigError { key, reason });
        let name_ok = |s: &str| {
            !s.is_empty() && s.len() <= 128 && s.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
        };
        if !name_ok(&self.topology) {
            return err("topology", format!("{:?} must be 1-128 characters of a-z, A-Z, 0-9, _ . -", self.topology));
        }
        if !name_ok(&self.stream) {
            return err(
                "stream",
                format!("{:?} is not a Kinesis stream name (1-128 of a-z, A-Z, 0-9, _ . -)", self.stream),
            );
        }
        if let Err(e) = self.kinesis.validate() {
            return err("kinesis", e.to_string());
        }
        if !(1..=10_000).contains(&self.records_per_get) {
            return err("records_per_get", format!("is {}; Kinesis allows 1..=10000", self.records_per_get));
        }
        if !(65_536..=1 << 30).contains(&self.max_queued_bytes_per_shard) {
            return err(
                "max_queued_bytes_per_shard",
                format!(
                    "is {}; use 65536..=1073741824 bytes (1048576, 1 MiB, is the default: about 1 MiB of queued records per owned shard)",
                    self.max_queued_bytes_per_shard
                ),
            );
        }
        if !(65_536..=1 << 40).contains(&self.max_read_bytes_in_flight) {
            return err(
                "max_read_bytes_in_flight",
                format!(
                    "is {}; use at least 65536 bytes (8388608, 8 MiB, is the default)",
                    self.max_read_bytes_in_flight
                ),
            );
        }
        if !(1..=5).contains(&self.max_get_calls_per_second) {
            return err(
                "max_get_calls_per_second",
                format!(
                    "is {}; use 1..=5 (Kinesis allows 5 GetRecords calls per second per shard)",
                    self.max_get_calls_per_second
                ),
            );
        }
        for (key, v) in [
            ("idle_poll_interval_ms", self.idle_poll_interval_ms),
            ("checkpoint_interval_ms", self.checkpoint_interval_ms),
            ("shard_discovery_interval_ms", self.shard_discovery_interval_ms),
            ("resync_interval_ms", self.resync_interval_ms),
            ("watermark_idle_timeout_ms", self.watermark_idle_timeout_ms),
            ("watermark_interval_ms", self.watermark_interval_ms),
            ("efo.register_timeout_ms", self.efo.register_timeout_ms),
            ("efo.silence_timeout_ms", self.efo.silence_timeout_ms),
            ("efo.end_check_interval_ms", self.efo.end_check_interval_ms),
            ("efo.renew_after_ms", self.efo.renew_after_ms.unwrap_or(1)),
        ] {
            if v == 0 {
                return err(key, "is 0; give a positive number of milliseconds".into());
            }
        }
        if (1..MIN_COMMITTED_WATERMARK_INTERVAL_MS).contains(&self.committed_watermark_interval_ms) {
            return err(
                "committed_watermark_interval_ms",
                format!(
                    "is {}; use 0 (not published) or at least {MIN_COMMITTED_WATERMARK_INTERVAL_MS} milliseconds \
                     (each task writes to ZooKeeper at most once per interval)",
                    self.committed_watermark_interval_ms
                ),
            );
        }
        if self.retry.replay_min_backoff_ms > self.retry.replay_max_backoff_ms {
            return err("retry.replay_min_backoff_ms", "is above retry.replay_max_backoff_ms".into());
        }
        if self.retry.call_min_backoff_ms > self.retry.call_max_backoff_ms || self.retry.call_min_backoff_ms == 0 {
            return err("retry.call_min_backoff_ms", "must be positive and at most retry.call_max_backoff_ms".into());
        }
        if self.retry.fatal_max_backoff_ms < self.retry.call_min_backoff_ms {
            return err(
                "retry.fatal_max_backoff_ms",
                format!(
                    "is {}; it must be at least retry.call_min_backoff_ms ({}); 60000 is the default",
                    self.retry.fatal_max_backoff_ms, self.retry.call_min_backoff_ms
                ),
            );
        }
        if self.zookeeper.connect.trim().is_empty() {
            return err("zookeeper.connect", "is empty; set host:port, e.g. 127.0.0.1:2181 (SQUALL_ZK)".into());
        }
        if !self.zookeeper.root.starts_with('/')
            || (self.zookeeper.root.len() > 1 && self.zookeeper.root.ends_with('/'))
        {
            return err(
                "zookeeper.root",
                format!("{:?} must be an absolute znode path like /squall", self.zookeeper.root),
            );
        }
        if self.zookeeper.session_timeout_ms < 1000 {
            return err(
                "zookeeper.session_timeout_ms",
                format!("is {}; use at least 1000", self.zookeeper.session_timeout_ms),
            );
        }
        if self.zookeeper.auth_user.is_some() != self.zookeeper.auth_password.is_some() {
            return err("zookeeper.auth_user", "and zookeeper.auth_password must be set together".into());
        }
        if let Consumer::Efo { name } = &self.consumer {
            if !consumer_name_ok(name) {
                return err(
                    "consumer",
                    format!("efo:{name:?}: the consumer name must be 1-128 characters of a-z, A-Z, 0-9, _ . -"),
                );
            }
            // (a registered model, sim://api/NAME, has enhanced fan-out; the generated stream not)
            if self.kinesis.endpoint.starts_with(super::source::SIM_SCHEME)
                && !self.kinesis.endpoint.starts_with(super::source::API_PREFIX)
            {
                return err("consumer", "efo is not supported by the simulated stream; use polling".into());
            }
        }
        if let InitialPosition::AtTimestamp { millis } = self.initial_position
            && millis < 0
        {
            return err("initial_position", format!("timestamp {millis} is before 1970"));
        }
        Ok(())
    }

    pub(crate) fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_errors_name_the_key() {
        KinesisSpoutConfig::new("t", "s").validate().unwrap();
        let mut c = KinesisSpoutConfig::new("t", "s");
        c.records_per_get = 0;
        assert!(c.validate().unwrap_err().to_string().contains("records_per_get"));
        let mut c = KinesisSpoutConfig::new("t", "bad stream");
        c.records_per_get = 10;
        assert!(c.validate().unwrap_err().to_string().contains("`stream`"));
        let mut c = KinesisSpoutConfig::new("t", "s");
        c.max_get_calls_per_second = 6;
        assert!(c.validate().unwrap_err().to_string().contains("max_get_calls_per_second"));
        let mut c = KinesisSpoutConfig::new("t", "s");
        c.max_queued_bytes_per_shard = 1000;
        assert!(c.validate().unwrap_err().to_string().contains("max_queued_bytes_per_shard"));
        let mut c = KinesisSpoutConfig::new("t", "s");
        c.max_read_bytes_in_flight = 10;
        assert!(c.validate().unwrap_err().to_string().contains("max_read_bytes_in_flight"));
        let mut c = KinesisSpoutConfig::new("t", "s");
        c.retry.fatal_max_backoff_ms = 10;
        assert!(c.validate().unwrap_err().to_string().contains("retry.fatal_max_backoff_ms"));
        let mut c = KinesisSpoutConfig::new("t", "s");
        c.committed_watermark_interval_ms = 50;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("committed_watermark_interval_ms") && e.contains("at least 100"), "{e}");
        c.committed_watermark_interval_ms = 100;
        c.validate().unwrap();
        let e = serde_json::from_str::<KinesisSpoutConfig>(r#"{"topology":"t","stream":"s","recordz":1}"#).unwrap_err();
        assert!(e.to_string().contains("recordz"), "{e}");
    }

    #[test]
    fn call_budget_defaults() {
        let c: KinesisSpoutConfig = serde_json::from_str(r#"{"topology":"t","stream":"s"}"#).unwrap();
        assert_eq!(c.idle_poll_interval_ms, 1000, "an idle shard is polled once a second");
        assert_eq!(c.records_per_get, 10_000, "KCL's default");
        assert_eq!(c.max_queued_bytes_per_shard, 1 << 20);
        assert_eq!(c.max_read_bytes_in_flight, 8 << 20);
        assert_eq!(c.retry.fatal_max_backoff_ms, 60_000);
        assert_eq!(c.committed_watermark_interval_ms, 0, "committed watermarks are not published by default");
        assert_eq!(c, KinesisSpoutConfig::new("t", "s"));
    }

    #[test]
    fn password_never_in_debug() {
        let mut c = KinesisSpoutConfig::new("t", "s");
        c.zookeeper.auth_user = Some("u".into());
        c.zookeeper.auth_password = Some("hunter2-secret".into());
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("hunter2-secret"), "{dbg}");
        assert!(!format!("{:?}", c.zookeeper.to_zk_config()).contains("hunter2-secret"));
    }

    #[test]
    fn consumers_parse_and_bad_names_say_the_fix() {
        assert_eq!("polling".parse::<Consumer>().unwrap(), Consumer::Polling);
        assert_eq!("efo:app-1".parse::<Consumer>().unwrap(), Consumer::Efo { name: "app-1".into() });
        let e = "efo:bad name!".parse::<Consumer>().unwrap_err();
        assert!(e.contains("bad name!") && e.contains("a-z"), "{e}");
        assert!("kafka".parse::<Consumer>().unwrap_err().contains("efo:NAME"));
        let c: KinesisSpoutConfig =
            serde_json::from_str(r#"{"topology":"t","stream":"s","consumer":"efo:x","efo":{"renew_after_ms":3000}}"#)
                .unwrap();
        assert_eq!(c.consumer.efo_name(), Some("x"));
        assert_eq!(c.efo.renew_after_ms, Some(3000));
        c.validate().unwrap();
        let e = serde_json::from_str::<KinesisSpoutConfig>(r#"{"topology":"t","stream":"s","consumer":"efo:"}"#)
            .unwrap_err();
        assert!(e.to_string().contains("consumer name"), "{e}");
    }

    #[test]
    fn kpl_out_of_range_parses_and_bad_values_name_the_key_and_the_choices() {
        let c: KinesisSpoutConfig = serde_json::from_str(r#"{"topology":"t","stream":"s"}"#).unwrap();
        assert_eq!(c.kpl_out_of_range, KplOutOfRange::Deliver, "nothing is dropped by default");
        let c: KinesisSpoutConfig =
            serde_json::from_str(r#"{"topology":"t","stream":"s","kpl_out_of_range":"drop_aggregate"}"#).unwrap();
        assert_eq!(c.kpl_out_of_range, KplOutOfRange::DropAggregate);
        c.validate().unwrap();
        assert_eq!(serde_json::to_value(&c).unwrap()["kpl_out_of_range"], "drop_aggregate");
        assert_eq!("drop-aggregate".parse::<KplOutOfRange>().unwrap(), KplOutOfRange::DropAggregate);
        let e =
            serde_json::from_str::<KinesisSpoutConfig>(r#"{"topology":"t","stream":"s","kpl_out_of_range":"drop"}"#)
                .unwrap_err()
                .to_string();
        assert!(e.contains("kpl_out_of_range") && e.contains("deliver") && e.contains("drop_aggregate"), "{e}");
    }

    #[test]
    fn initial_positions_parse() {
        assert_eq!("latest".parse::<InitialPosition>().unwrap(), InitialPosition::Latest);
        assert_eq!("TRIM_HORIZON".parse::<InitialPosition>().unwrap(), InitialPosition::TrimHorizon);
        assert_eq!("at-timestamp:5".parse::<InitialPosition>().unwrap(), InitialPosition::AtTimestamp { millis: 5 });
        assert!("yesterday".parse::<InitialPosition>().unwrap_err().contains("trim-horizon"));
    }
}
