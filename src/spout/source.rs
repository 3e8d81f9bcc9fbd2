//! Where shards and records come from: the Kinesis API (production), or an in-process simulated
//! stream that follows Kinesis' shard model, used only by the coordination benchmark
//! (`benches/coord.rs`) to drive hundreds of shards without a Kinesis engine. The simulated source
//! is a load generator for coordination costs, never a proof of correctness.

use aws_sdk_kinesis::Client;

use crate::kinesis::{self, KinesisError, ShardDescription};

/// The shard-level API the spout needs.
#[derive(Clone, Debug)]
pub(crate) enum ShardSource {
    /// The real API (AWS, LocalStack, kinesis-local).
    Kinesis { client: Client, endpoint: String, stream: String },
}

impl ShardSource {
    /// Every shard of the stream, open and closed, sorted by id.
    pub async fn list_shards(&self) -> Result<Vec<ShardDescription>, KinesisError> {
        match self {
            ShardSource::Kinesis { client, endpoint, stream } => kinesis::list_shards(client, endpoint, stream).await,
        }
    }

    /// The stream's creation time (to notice a stream re-created under the same name).
    pub async fn created_ms(&self) -> Result<Option<i64>, KinesisError> {
        match self {
            ShardSource::Kinesis { client, endpoint, stream } => {
                kinesis::stream_created_ms(client, endpoint, stream).await
            }
        }
    }
}
