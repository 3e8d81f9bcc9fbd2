//! Stages: a topology cut at groupings that must cross workers, connected by intermediate
//! Kinesis streams.

pub mod codec;
pub mod registry;
