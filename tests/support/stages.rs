//! Helpers for the tests of staged topologies (examples/word_count_global.rs).
#![allow(dead_code)]

use super::TestStream;
use super::workers::{Cluster, Worker, example_bin};

/// Every record of `stream`, read from TRIM_HORIZON on each shard (closed ones too), parsed as JSON.
pub async fn read_json_records(stream: &TestStream) -> Vec<serde_json::Value> {
    read_records(stream)
        .await
        .iter()
        .map(|r| serde_json::from_slice(r.data().as_ref()).expect("a JSON record"))
        .collect()
}

/// Every record of `stream`, read from TRIM_HORIZON on each shard (closed ones too).
pub async fn read_records(stream: &TestStream) -> Vec<aws_sdk_kinesis::types::Record> {
    squall::audit::read_stream(&stream.client, &stream.label(), &stream.name)
        .await
        .unwrap_or_else(|e| panic!("reading stream {} back: {e}", stream.name))
}

/// Starts worker `name` of `word_count_global` writing its count deltas to `output`
/// (flushed every 500 ms).
pub fn start_word_count_global(cluster: &Cluster, name: &str, output: &str) -> Worker {
    cluster.start_example(&example_bin("word_count_global"), name, 1, &["--output", output, "--flush-ms", "500"])
}
