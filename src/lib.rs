//! Squall: Storm-style topologies over Amazon Kinesis.
pub use squall_topology as topology;
