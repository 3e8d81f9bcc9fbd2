//! The Kinesis sink: [`KinesisSink`], a bolt that writes one record per input to a Kinesis
//! stream with PutRecords, the usual end of a topology (and the writer side of a stage boundary:
//! an intermediate stream read by the next stage's spout).
//!
//! # What it guarantees
//!
//! - **At-least-once.** An input is held ([`AckHandle`](crate::topology::AckHandle)) until
//!   Kinesis answered that its record was written, and only then acked. A record whose put
//!   failed in a way retrying can fix (throttling, a per-record `ProvisionedThroughputExceeded`
//!   or `InternalFailure`, a transport or server error) is put again after a capped exponential
//!   back-off with jitter (`retry_min_backoff_ms`..`retry_max_backoff_ms`); its input stays
//!   held. A record that cannot be written (the stream does not exist, access denied, a KMS
//!   key refusing) fails its input, and every input buffered with it, so the spout replays them;
//!   the error names the stream and the fix, logged at most once per back-off period. An input
//!   whose tuple does not encode ([`SinkEncoder::encode`] fails) is failed alone, counted, and
//!   logged with the stream's name and the encoder's message (which names the field). Duplicates
//!   come only from a call whose answer was lost after Kinesis wrote its records, and from spout
//!   replays.
//! - **Per-key order.** Records of one key (partition key and explicit hash key) are written in
//!   the order the sink received them. The rule: a PutRecords call holds at most one record per
//!   key, and a key's next record is sent only once the record before it was written; a failed
//!   record goes back to the head of its key's queue, ahead of every later record of its key.
//!   Kinesis does not order the records of one call against each other when some fail, so this
//!   is what keeps a retry from overtaking. Upstream, route one key to one sink task (fields
//!   grouping on the key). An input failed by the sink is replayed by the spout and may then
//!   come after later records of its key, as with any replay.
//! - **Watermark barriers (stage boundaries).** An encoder whose records carry watermarks that a
//!   consumer reads in band ([`SinkEncoder::watermark_barriers`], the stage writer's) also gets
//!   order across keys: each watermark, and the drain, starts an epoch whose records (the
//!   hook's own first) go out only once every record buffered before it was written, whatever
//!   their keys and shards; records are not combined across it.
//! - **Bounded memory.** Bytes buffered plus bytes in flight never exceed
//!   `max_in_flight_bytes` (one record larger than the bound is let in alone). At the bound
//!   `execute` waits for the call in flight: backpressure on the sink's inputs.
//! - **Flushed at drain.** `on_drain` puts everything buffered and waits for it; a partial batch
//!   otherwise goes `linger_ms` after its oldest record arrived. When the topology is stopped
//!   without a drain, held inputs are failed (and replayed).
//!
//! # How it writes, and what it costs
//!
//! One PutRecords call is in flight per sink task while the next batch accumulates. A batch goes
//! when `max_batch_records` keys have a record ready or `max_batch_bytes` are buffered, or when
//! its oldest record has waited `linger_ms`. Since a call holds one record per key, the number
//! of calls is at least `records / min(distinct keys ready, max_batch_records)`: with many keys a
//! call carries up to 500 records (one call per 500 records), while one hot key gets one record
//! per call, each after the previous call's answer (one round trip per record).
//! Spread hot traffic over more keys (e.g. `user|bucket`) when a single key must go faster.
//! ListShards is never called per record: the open shards given to [`SinkEncoder::on_watermark`]
//! and [`SinkEncoder::on_drain`] are cached and refreshed at most every 10 s, and only for an
//! encoder whose [`SinkEncoder::needs_shards`] says so.
//!
//! Its user metrics ([`metric`]) show with the engine's counters: records put, calls, retried
//! and throttled records, failed inputs, encode errors, backpressure waits, and histograms of
//! pending bytes (its max is the most the sink held) and records per call.
//!
//! # Layout
//!
//! - `config`: [`KinesisSinkConfig`] (serde, validated; [`SinkConfigError`] names the key).
//! - `encoder`: [`SinkRecord`], [`OpenShard`], the [`SinkEncoder`] trait and [`FieldsEncoder`].
//! - `queue` (private): per-key FIFOs and the batching rule above, without I/O.
//! - `backend` (private): the PutRecords and ListShards calls behind a trait (the SDK client, a
//!   registered [`crate::spout::ShardApi`] for `sim://api/NAME` endpoints, or an in-memory fake in
//!   unit tests).
//! - `bolt`: [`KinesisSink`] itself: holding inputs, the call in flight, timers, back-off.
//!
//! # Example
//!
//! ```no_run
//! use squall::kinesis::KinesisEndpoint;
//! use squall::sink::{FieldsEncoder, KinesisSink, KinesisSinkConfig};
//! use squall::topology::TopologyBuilder;
//!
//! let mut cfg = KinesisSinkConfig::new("word-counts", KinesisEndpoint::default());
//! cfg.linger_ms = 20;
//! cfg.validate().expect("valid sink config");
//! let mut b = TopologyBuilder::new("word-count");
//! // ... a bolt "count" emitting (word, count)
//! // partition key: the word; data: {"word":..,"count":..} as JSON
//! b.set_bolt("sink", 2, move |_| KinesisSink::new(cfg.clone(), FieldsEncoder::new(&["word"])))
//!     .fields_grouping("count", &["word"]);
//! ```
mod backend;
mod bolt;
mod config;
mod encoder;
mod queue;

pub use backend::{EntryError as PutEntryError, TransmitCheck};
pub use bolt::{KinesisSink, PutGate, metric};
pub use config::{KinesisSinkConfig, MAX_BYTES_PER_CALL, MAX_RECORD_BYTES, MAX_RECORDS_PER_CALL, SinkConfigError};
pub use encoder::{FieldsEncoder, OpenShard, SinkEncoder, SinkRecord};
