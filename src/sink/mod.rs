//! The Kinesis sink: [`KinesisSink`], a bolt that writes one record per input to a Kinesis
//! stream with PutRecords.
//!
//! TODO docs
mod backend;
mod bolt;
mod config;
mod encoder;
mod queue;

pub use bolt::{KinesisSink, metric};
pub use config::{KinesisSinkConfig, MAX_BYTES_PER_CALL, MAX_RECORD_BYTES, MAX_RECORDS_PER_CALL, SinkConfigError};
pub use encoder::{FieldsEncoder, OpenShard, SinkEncoder, SinkRecord};
