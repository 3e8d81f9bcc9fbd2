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
    let shards =
        squall::kinesis::list_shards(&stream.client, &stream.label(), &stream.name).await.expect("list shards");
    let mut out = Vec::new();
    for s in shards {
        let mut it = stream
            .client
            .get_shard_iterator()
            .stream_name(&stream.name)
            .shard_id(&s.shard_id)
            .shard_iterator_type(aws_sdk_kinesis::types::ShardIteratorType::TrimHorizon)
            .send()
            .await
            .expect("iterator")
            .shard_iterator;
        while let Some(i) = it.take() {
            let r = stream.client.get_records().shard_iterator(i).limit(10_000).send().await.expect("get records");
            if r.records().is_empty() {
                break;
            }
            it = r.next_shard_iterator().map(String::from);
            out.extend(r.records().iter().cloned());
        }
    }
    out
}

/// Starts worker `name` of `word_count_global` writing its count deltas to `output`
/// (flushed every 500 ms).
pub fn start_word_count_global(cluster: &Cluster, name: &str, output: &str) -> Worker {
    cluster.start_example(&example_bin("word_count_global"), name, 1, &["--output", output, "--flush-ms", "500"])
}
