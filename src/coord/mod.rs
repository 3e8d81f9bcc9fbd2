//! ZooKeeper coordination for the Kinesis spout: the worker's shared session, task registry,
//! shard list, the leader's assignment, checkpoints, finished markers, per-shard leases with fenced
//! checkpoint writes, and change notifications.
//!
//! # Layout
//! - [`config`] – [`ZkConfig`] / [`ZkAuth`] (password redacted in `Debug`/`Display`).
//! - [`session`] – [`ZkSession`] (one connected session) and [`SharedSession`] (the one session of
//!   a worker process: health, rebuild after expiry, give-up; [`Liveness`] for paused processes).
//! - [`paths`] – [`TopologyPaths`], the znode layout (see there).
//! - [`model`] – the JSON documents stored in znodes ([`Assignment`], [`Checkpoint`], ...).
//! - [`logic`] – pure functions: [`readable`], [`sticky_assign`], [`assign`] (round-robin),
//!   [`leader`], [`sequence_cmp`], [`committed_watermark`] (a stream's committed watermark from
//!   the assignment and the tasks' reports).
//! - [`store`] – [`ZkStore`], all ZooKeeper I/O for one topology and stream, over a shared session.
//! - [`watch`] – [`ChangeEvent`] and [`SessionWatch`].
//! - [`admin`] – [`Admin`], topology-level access for the CLI.
//! - [`zkapi`] – [`zkapi::ZkClient`], the one seam to a ZooKeeper server: the real client, or the
//!   simulator's model (`sim://NAME` connect strings).
//! - [`error`] – [`CoordError`].
//!
//! # Safety argument in one paragraph
//! A task reads a shard only while it holds the lowest `owners/{shard}/lease-{task}-N` znode, which
//! is ephemeral to its worker's session. Each checkpoint write is one transaction that checks that
//! exact lease znode still exists and that the checkpoint is at the version the writer last read or
//! wrote. When the session expires, ZooKeeper deletes the lease, so a zombie's later write fails as
//! [`CoordError::Fenced`]; a new owner's lease has another path, so it cannot be confused with the
//! old one, and two tasks of one worker (one session) never pass for each other because the holder
//! is named in the lease. A worker disconnected longer than half its session timeout, or paused,
//! stops handing records on ([`SharedSession`], [`Liveness`]).
//!
//! # Cost
//! Checkpoints are watched by nobody: a write is one request. Only cold znodes are watched
//! (`tasks/`, `assignment`, `finished/` by the leader, `state`, `drain`), with one-shot watches
//! re-armed on each event. See ARCHITECTURE.md (cost model) and BENCHMARKS.md (coordination).
//!
//! The `shards` znode holds the whole shard list in one JSON document, so it must stay under
//! ZooKeeper's 1 MB `jute.maxbuffer`: [`MAX_SHARD_LIST_BYTES`] (900 KB, a few thousand shards).

pub mod admin;
pub mod config;
pub mod error;
pub mod logic;
pub mod model;
pub mod paths;
pub mod session;
pub mod store;
pub mod watch;
pub mod zkapi;

pub use admin::Admin;
pub use config::{Secret, ZkAuth, ZkConfig};
pub use error::{CoordError, ErrorDomain};
pub use logic::{
    assign, committed_watermark, leader, lineage_gaps, moved, readable, readable_shards, sequence_cmp, sticky_assign,
    task_cmp,
};
pub use model::{
    Assignment, Checkpoint, CheckpointPosition, DrainRequest, EfoRuntime, FirerInfo, FirstStart, KplRuntime, LeaseInfo,
    Lifecycle, PublishedWatermark, RebalanceRequest, ShardList, ShardRecord, ShardRuntime, StageRuntime, TaskInfo,
    TopologyState, Versioned, WallClock, WatermarkReport, WorkerStatus, now_ms, set_thread_clock,
};
#[doc(hidden)]
pub use model::{CLOCK_OFFSET_ENV, clock_offset_ms};
pub use paths::TopologyPaths;
pub use session::{
    FaultHook, Health, InjectedFault, Liveness, SessionView, SharedSession, ZkCounters, ZkOp, ZkSession, zk_counters,
};
pub use store::{Acquire, Lease, LeaseOwner, MAX_SHARD_LIST_BYTES, WatchOn, ZkStore};
pub use watch::{ChangeEvent, SessionAlarm, SessionStatus, SessionWatch};
