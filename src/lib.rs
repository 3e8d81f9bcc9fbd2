//! Squall: Storm-style topologies over Amazon Kinesis, coordinated through ZooKeeper.
//!
//! Layout:
//! - [`topology`]: the engine (re-export of `squall-topology`): spouts, bolts, groupings, acking.
//! - [`kinesis`]: Kinesis client construction, shard listing, stream helpers and the test producer.
//! - [`cli`]: the `squall` command line.
//! - [`logging`]: tracing set-up for binaries and workers.

pub use squall_topology as topology;

pub mod audit;
pub mod cli;
pub mod coord;
pub mod kinesis;
pub mod logging;
pub mod spout;
pub mod worker;

pub use worker::{SPOUT_ID, WorkerArgs, run};
