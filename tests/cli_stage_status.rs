//! `squall status` of a topology in stages (examples/word_count_global.rs, two workers): the
//! stages, the intermediate stream with its shards (owners, checkpoints, lag), its live
//! producers and the control-record counters; and, once every worker stopped, what ZooKeeper
//! still shows.

use squall_test_support as support;

use std::collections::BTreeMap;
use std::time::Duration;

use squall::kinesis::{self, PutOptions, payload::Manifest};
use support::TestStream;
use support::ops::{squall_ok, status_json, wait_for};
use support::stages::{read_json_records, start_word_count_global};
use support::workers::{Cluster, Worker, scratch};

/// Workers started, and writer tasks per worker (the example's boundary has the default 1).
const WORKERS: usize = 2;
const WRITERS: usize = 1;
/// Shards of the intermediate stream (the example's default `--boundary-shards`).
const BOUNDARY_SHARDS: usize = 4;

/// The sum of the count deltas in the output stream.
async fn counted(out: &TestStream) -> u64 {
    read_json_records(out).await.iter().map(|row| row["delta"].as_u64().expect("a delta")).sum()
}

/// Every record has two words (its key and `d{seq % 7}`).
fn words(m: &Manifest) -> u64 {
    2 * m.total
}

/// The stage reading `stream` in a status report.
fn stage<'a>(st: &'a serde_json::Value, stream: &str) -> Option<&'a serde_json::Value> {
    st["stages"].as_array()?.iter().find(|s| s["input_stream"] == stream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_stages_their_intermediate_stream_producers_and_lag() {
    let src = TestStream::create("stst-src", 2).await;
    let out = TestStream::create("stst-out", 1).await;
    let dir = scratch("stst");
    let cluster = Cluster::new(&src.name, &dir);
    let inter = format!("{}-words", cluster.topology);
    let opts = PutOptions { count: 200, keys: 12, ..PutOptions::default() };
    let manifest = kinesis::put_records(&src.client, &src.label(), &src.name, &opts).await.expect("put").manifest;
    let mut workers: Vec<Worker> =
        (0..WORKERS).map(|i| start_word_count_global(&cluster, &format!("w{i}"), &out.name)).collect();
    let want = words(&manifest);
    wait_for(&cluster, "every word counted", Duration::from_secs(120), || async {
        (counted(&out).await >= want).then_some(())
    })
    .await;

    // Workers publish their status every few seconds: wait until both report both stages and
    // every shard of the intermediate stream is owned and reports its lag.
    let st = wait_for(&cluster, "a status with both stages fully reported", Duration::from_secs(60), || async {
        let st = status_json(&cluster);
        let later = stage(&st, &inter)?;
        let shards = later["stream"]["shards"].as_array()?;
        let complete = st["workers"].as_array()?.len() == WORKERS
            && later["workers"] == WORKERS
            && later["producers"] == WORKERS * WRITERS
            && shards.len() == BOUNDARY_SHARDS
            && shards.iter().all(|s| s["owner"].is_string() && s["millis_behind_latest"].is_i64());
        complete.then_some(st)
    })
    .await;

    // the source stream alone in `streams`, as before stages
    let streams = st["streams"].as_array().unwrap();
    assert_eq!(streams.len(), 1, "only the source stream is listed in streams: {st:#}");
    assert_eq!(streams[0]["stream"], src.name.as_str());
    assert_eq!(streams[0]["shards"].as_array().unwrap().len(), 2);

    let stages = st["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 2, "{st:#}");
    let first = &stages[0];
    assert_eq!(first["name"], "split");
    assert_eq!(first["input_stream"], src.name.as_str());
    assert_eq!(first["intermediate"], false);
    assert_eq!(first["workers"], WORKERS);
    assert!(first["stream"].is_null() && first["producers"].is_null(), "{first:#}");
    assert!(first["max_millis_behind_latest"].is_i64(), "the source stream's lag is summed up: {first:#}");

    let later = &stages[1];
    assert_eq!(later["name"], "count");
    assert_eq!(later["input_stream"], inter.as_str());
    assert_eq!(later["intermediate"], true);
    assert_eq!(later["producers"], WORKERS * WRITERS, "one producer per writer task per worker: {later:#}");
    let view = &later["stream"];
    assert_eq!(view["stream"], inter.as_str());
    assert!(view["error"].is_null(), "{view:#}");
    let shards = view["shards"].as_array().unwrap();
    let mut lags = Vec::new();
    let mut owners: BTreeMap<String, usize> = BTreeMap::new();
    for sh in shards {
        let owner = sh["owner"].as_str().unwrap();
        assert!(owner.starts_with("task-"), "the owner is a task of the stage input: {sh:#}");
        *owners.entry(owner.to_string()).or_default() += 1;
        assert_eq!(sh["state"], "open");
        let cp = sh["checkpoint"].as_str().unwrap_or_default();
        assert!(cp.starts_with("AFTER_SEQUENCE") || cp == "TRIM_HORIZON", "checkpoint of {sh:#}");
        assert!(sh["error"].is_null(), "{sh:#}");
        lags.push(sh["millis_behind_latest"].as_i64().unwrap());
    }
    assert_eq!(later["shards_with_lag"], BOUNDARY_SHARDS);
    assert_eq!(later["max_millis_behind_latest"].as_i64(), lags.iter().copied().max());
    assert_eq!(later["sum_millis_behind_latest"].as_i64(), Some(lags.iter().sum()));
    // the owners are the tasks the workers report for the stage, `{stream}/task-N`
    let reported: Vec<String> = st["workers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|w| w["tasks"].as_array().unwrap().iter().filter_map(|t| t.as_str().map(str::to_string)))
        .collect();
    for owner in owners.keys() {
        assert!(reported.contains(&format!("{inter}/{owner}")), "owner {owner} is a live stage task: {reported:?}");
    }
    // counters summed over workers: writers send watermarks to the shards they wrote nothing to
    for c in ["watermark_records", "drain_markers", "stale_drain_markers", "malformed"] {
        assert!(later[c].is_u64(), "{c}: {later:#}");
    }
    assert_eq!(later["malformed"], 0);
    assert_eq!(later["drain_markers"], 0);

    let text = squall_ok(&cluster, &["status", &cluster.topology]);
    println!("{text}");
    assert!(text.contains(&format!("intermediate stream {inter}: {BOUNDARY_SHARDS} shards")), "{text}");
    assert!(text.contains("stage 1 split") && text.contains("stage 2 count"), "{text}");
    assert!(text.contains(&format!("producers writing {inter}: {}", WORKERS * WRITERS)), "{text}");

    for w in &mut workers {
        assert_eq!(w.stop(Duration::from_secs(60)), Some(0), "worker {} exits cleanly:\n{}", w.name, cluster.logs());
    }

    // no worker alive: ZooKeeper still shows the intermediate stream, its shards and checkpoints.
    // A worker's ephemeral znodes (status, producers) may outlive its exit up to its session
    // timeout when its session was not closed gracefully.
    let st = wait_for(&cluster, "the stopped workers' znodes gone", Duration::from_secs(30), || async {
        let st = status_json(&cluster);
        let gone = st["workers"].as_array().is_some_and(|w| w.is_empty())
            && stage(&st, &inter).is_some_and(|s| s["producers"] == 0);
        gone.then_some(st)
    })
    .await;
    assert_eq!(st["streams"].as_array().unwrap().len(), 1, "{st:#}");
    let later = stage(&st, &inter).unwrap_or_else(|| panic!("the intermediate stream from ZooKeeper: {st:#}"));
    assert!(later["name"].is_null() && later["workers"] == 0, "{later:#}");
    assert_eq!(later["intermediate"], true);
    assert_eq!(later["producers"], 0, "the producers went with their workers: {later:#}");
    let shards = later["stream"]["shards"].as_array().unwrap();
    assert_eq!(shards.len(), BOUNDARY_SHARDS);
    assert!(shards.iter().all(|s| s["owner"].is_null() && s["checkpoint"].is_string()), "{later:#}");
    let first = stage(&st, &src.name).unwrap_or_else(|| panic!("the first stage: {st:#}"));
    assert_eq!(first["intermediate"], false);
    let text = squall_ok(&cluster, &["status", &cluster.topology]);
    println!("{text}");
    assert!(text.contains("no live worker") && text.contains(&format!("intermediate stream {inter}")), "{text}");

    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    let _ = kinesis::delete_stream(&src.client, &src.label(), &inter).await;
    src.delete().await;
    out.delete().await;
}
