//! The deterministic simulator of a Squall fleet.
//!
//! A run ([`fleet::run_seed`]) starts several workers, each the product's own `squall::run`
//! (lifecycle loop, shared ZooKeeper session, spout coordinator, readers, tracker, the topology
//! engine and a checking sink bolt), in one process, on one thread, on tokio's paused clock: time
//! moves only when every task waits, so a minute of a fleet takes a fraction of a second.
//! ZooKeeper and Kinesis are the models of `tests/support` ([`squall_test_support::zkmodel`],
//! [`squall_test_support::kinesismodel`], each kept honest by a differential test against the
//! real service), reached through the product's seams (`squall::coord::zkapi::ZkClient`,
//! `squall::spout::ShardApi`) by `sim://` endpoints.
//!
//! One seed fixes every choice: the scenario (workers, shards, keys, rates, which faults), the
//! latencies, the faults and their times, and (because the test binary answers `getrandom(2)`
//! from the seed, see `tests/sim.rs`) every random number of the process: hash maps, tokio's
//! `select!`, ids, jitter. Each seed runs in a process of its own, so nothing of an earlier run
//! (tokio's seed counter, interned names) changes it. The run's events are hashed in order: the
//! same seed gives the same hash.
//!
//! Checked as it runs ([`world::World`]): per-key order (the first delivery of a record comes
//! after one of every earlier record of its key); a checkpoint never moves back; a checkpoint
//! written under a lease is written under the shard's lowest lease (its one owner); a child shard
//! is read only after its parents finished. At the end: every record put was delivered within
//! a bound of simulated time after the faults and producers stopped (nothing lost, liveness); with
//! the exactly-once workload, every key's count in the state table equals the records put with it.

pub mod fleet;
pub mod kinesis;
pub mod state;
pub mod world;
pub mod zk;

pub use fleet::{Outcome, run_seed};
