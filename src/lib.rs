//! Squall: Storm-style topologies over Amazon Kinesis, coordinated through ZooKeeper.
//!
//! Workers are plain processes running a whole topology; they share nothing but ZooKeeper, which
//! spreads the stream's shards over every live spout task. See ARCHITECTURE.md for the data path
//! and the ZooKeeper layout, and [`worker`] for a runnable example.
//!
//! Layout:
//! - [`topology`]: the engine (re-export of `squall-topology`): spouts, bolts, groupings, acking,
//!   watermarks, drain, windows.
//! - [`spout`]: the Kinesis spout: the worker's stream coordinator (the leader's discovery, sticky
//!   assignment and garbage collection), the task coordinator (leases, fenced checkpoints,
//!   handoff, resharding), shard readers (GetRecords polling, or enhanced fan-out subscriptions
//!   with `--consumer efo:NAME`), KPL de-aggregation (one tuple per user record, sub-sequence
//!   checkpoints, user records outside the shard's hash range counted and delivered, or dropped
//!   with their aggregate when opted in), in-flight tracking, low watermarks. A worker reads one
//!   stream or several (`--stream a --stream b`), each coordinated on its own.
//! - [`coord`]: ZooKeeper access: the worker's shared session, layout, task registry, shard list,
//!   assignment, checkpoints, leases, watches.
//! - [`worker`]: [`run`] and [`WorkerArgs`], the entry point of user worker binaries.
//! - [`metrics`]: the worker's Prometheus endpoint (`--metrics-addr`): the catalog of metric
//!   families, read from in-memory state on each scrape.
//! - [`kinesis`]: Kinesis client construction, shard listing, stream helpers, the test producer,
//!   and the KPL aggregated-record format ([`kinesis::kpl`]).
//! - [`sink`]: the Kinesis sink bolt: batched PutRecords, inputs acked once put, per-key order
//!   kept through retries, bounded bytes in flight.
//! - [`state`]: exactly-once keyed state in DynamoDB (MillWheel): [`state::KeyedState`] and the
//!   [`state::ExactlyOnce`] bolt, exact deduplication of replays, zombie writers fenced by lease
//!   tokens, and across stages ([`stage::Boundary::exactly_once`]) by production id.
//! - [`stage`]: a topology cut into stages connected by intermediate Kinesis streams.
//! - [`audit`]: delivery logs and the produced/delivered/lost/duplicates/order comparison.
//! - [`cli`]: the `squall` command line.
//! - [`ui`]: `squall ui`, the web status page (read from ZooKeeper) and its lifecycle actions,
//!   which run the CLI's own operations.
//! - [`logging`]: tracing set-up for binaries and workers.

pub use squall_topology as topology;

pub mod audit;
pub mod cli;
pub mod coord;
pub mod kinesis;
pub mod logging;
pub mod metrics;
pub mod random;
pub mod sink;
pub mod spout;
pub mod stage;
pub mod state;
pub mod ui;
pub mod worker;

pub use worker::{SPOUT_ID, WorkerArgs, run};
