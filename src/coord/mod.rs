//! ZooKeeper coordination for the Kinesis spout: task registry, shard list, checkpoints,
//! per-shard leases with fenced checkpoint writes, and change notifications.
//!
//! # Layout
//! - [`config`] – [`ZkConfig`] / [`ZkAuth`] (password redacted in `Debug`/`Display`).
//! - [`paths`] – [`TopologyPaths`], the znode layout (see there).
//! - [`model`] – the JSON documents stored in znodes.
//! - [`logic`] – pure functions every task evaluates identically: [`readable_shards`], [`assign`],
//!   [`leader`], [`sequence_cmp`].
//! - [`store`] – [`ZkStore`], all ZooKeeper I/O.
//! - [`watch`] – [`ChangeEvent`] and [`SessionWatch`].
//! - [`error`] – [`CoordError`].
//!
//! # Safety argument in one paragraph
//! A task reads a shard only while it holds the lowest `owners/{shard}/lease-N` znode, which is
//! ephemeral to its session. Each checkpoint write is one transaction that checks that exact lease
//! znode still exists and that the checkpoint is at the version the writer read. When the session
//! expires, ZooKeeper deletes the lease, so a zombie's later write fails as
//! [`CoordError::Fenced`]; a new owner's lease has another path, so it cannot be confused with the
//! old one. A worker disconnected longer than half its session timeout must stop fetching
//! ([`SessionWatch::wait_unsafe`]).
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

pub use admin::Admin;
pub use config::{Secret, ZkAuth, ZkConfig};
pub use error::{CoordError, ErrorDomain};
pub use logic::{assign, leader, moved, readable, readable_shards, sequence_cmp, sticky_assign, task_cmp};
pub use model::{
    Assignment, Checkpoint, CheckpointPosition, DrainRequest, LeaseInfo, Lifecycle, ShardList, ShardRecord,
    ShardRuntime, TaskInfo, TopologyState, Versioned, WorkerStatus, now_ms,
};
pub use paths::TopologyPaths;
pub use session::{FaultHook, Health, InjectedFault, Liveness, SessionView, SharedSession, ZkOp, ZkSession};
pub use store::{Acquire, Lease, LeaseOwner, MAX_SHARD_LIST_BYTES, WatchOn, ZkStore};
pub use watch::{ChangeEvent, SessionAlarm, SessionStatus, SessionWatch};
