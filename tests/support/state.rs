//! Running the exactly-once counting example (examples/exactly_once_counts.rs) as real worker
//! processes against a state table, and reading that table.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use squall::state::{StateEndpoint, StateStore};

use super::reliability::Proc;
use super::workers::{Cluster, example_bin};

/// Lines of the file at `path` that contain `needle` (0 when it cannot be read).
pub fn count_in(path: &std::path::Path, needle: &str) -> usize {
    std::fs::read_to_string(path).unwrap_or_default().lines().filter(|l| l.contains(needle)).count()
}

/// Waits (30 s at most) until worker `p` of `cluster` logs that it reads a shard.
pub async fn wait_reading(p: &Proc, cluster: &Cluster) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while count_in(&p.log, "reading shard") == 0 {
        assert!(Instant::now() < deadline, "{} never read a shard\n{}", p.name, cluster.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The commit interval of a worker that a test freezes into a zombie (ms): long enough that it
/// always holds applied, uncommitted inputs a moment after a commit (see [`wait_committing`]).
pub const ZOMBIE_COMMIT_INTERVAL_MS: &str = "3000";

/// Waits (30 s at most) until worker `p` of `cluster`, running with a commit interval of
/// [`ZOMBIE_COMMIT_INTERVAL_MS`], commits in steady state (a commit round after its first), then
/// 1.2 s more: it has read records since (its reader polls at least every second) and holds them
/// uncommitted for another ~2 s. Call before freezing it, so that the zombie has late writes to
/// be refused.
pub async fn wait_committing(p: &Proc, cluster: &Cluster) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let written = || count_in(&p.log, "state commit round written");
    while written() == 0 {
        assert!(Instant::now() < deadline, "{} never committed\n{}", p.name, cluster.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = written();
    while written() == first {
        assert!(Instant::now() < deadline, "{} committed only once\n{}", p.name, cluster.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
}

/// Waits (15 s at most) until the resumed zombie `p` has had a write refused (it flushes what
/// it held when it resumes, which may come after the other workers finished); returns how many.
pub async fn wait_refused(p: &Proc) -> usize {
    let start = Instant::now();
    while count_in(&p.log, "state write refused") == 0 && start.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    count_in(&p.log, "state write refused")
}

/// The opening of the window chaos tests: worker `b`, alone (it reads every shard), aborts right
/// after its `abort_after`-th written commit, before acking its inputs (asserted); then worker
/// `a` (commit interval [`ZOMBIE_COMMIT_INTERVAL_MS`], to be frozen into a zombie) and worker `c`
/// start, and this returns once `a` holds uncommitted inputs ([`wait_committing`]). `flags` go to
/// every worker. Returns (b, a, c).
pub async fn abort_then_start_zombie(
    cluster: &Cluster,
    url: &str,
    table: &str,
    flags: &[&str],
    abort_after: &str,
) -> (Proc, Proc, Proc) {
    let mut b = start_counts(cluster, "b", url, table, &[flags, &["--abort-after-commits", abort_after]].concat());
    let code = b.wait_exit(Duration::from_secs(40));
    assert!(code.is_some(), "b never reached its {abort_after}th commit\n{}", cluster.logs());
    assert_eq!(count_in(&b.log, "abort_after_commits: aborting after a written commit"), 1, "{}", b.log_text());
    let a =
        start_counts(cluster, "a", url, table, &[flags, &["--commit-interval-ms", ZOMBIE_COMMIT_INTERVAL_MS]].concat());
    let c = start_counts(cluster, "c", url, table, flags);
    wait_reading(&a, cluster).await;
    wait_committing(&a, cluster).await;
    (b, a, c)
}

/// The component id of the counting bolt in the example.
pub const COMPONENT: &str = "counts";

/// A unique state table for one test (deleted by [`delete_table`]).
pub fn unique_table(prefix: &str) -> String {
    super::unique_name(&format!("squall-test-{prefix}"))
}

/// The table `table` at `endpoint` (default: [`super::state_endpoint`]).
pub fn endpoint(url: &str, table: &str) -> StateEndpoint {
    StateEndpoint::new(url, table)
}

/// Starts worker `name` of `cluster` running the exactly-once counting example, with its state
/// in `table` at `state_endpoint`; `extra` flags follow the standard ones. Same log file as
/// [`Cluster::worker_command`] (`{name}.log` in the test directory), no `--deliveries` (the
/// example does not take it).
pub fn start_counts(cluster: &Cluster, name: &str, state_endpoint: &str, table: &str, extra: &[&str]) -> Proc {
    start_counts_with_env(cluster, name, state_endpoint, table, extra, &[])
}

/// [`start_counts`] with environment variables set for the worker (e.g. a clock offset).
pub fn start_counts_with_env(
    cluster: &Cluster,
    name: &str,
    state_endpoint: &str,
    table: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Proc {
    let log = cluster.dir.join(format!("{name}.log"));
    let file = std::fs::File::create(&log).unwrap();
    let mut cmd = std::process::Command::new(example_bin("exactly_once_counts"));
    cmd.args(["--topology", &cluster.topology, "--stream", &cluster.stream, "--zk-root", &cluster.zk_root])
        .args(["--spout-tasks", "1"])
        .args(["--zk-session-timeout-ms", &cluster.session_timeout_ms.to_string()])
        .args(["--initial-position", &cluster.initial_position])
        .args(["--message-timeout-ms", &cluster.message_timeout_ms.to_string()])
        .arg("--spout-config")
        .arg(&cluster.spout_config)
        .args(["--state-endpoint", state_endpoint, "--state-table", table])
        .args(extra)
        .env("SQUALL_ZK", super::zk_connect())
        .env("SQUALL_KINESIS_ENDPOINT", super::kinesis_endpoint().endpoint)
        .env_remove("SQUALL_STATE_ENDPOINT")
        .env_remove("SQUALL_STATE_TABLE")
        .env("RUST_LOG", "info,squall=debug")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file);
    let child = cmd.spawn().expect("start the exactly_once_counts worker");
    Proc { name: name.to_string(), child: Some(child), log }
}

/// Opens (and creates) the table.
pub async fn open(url: &str, table: &str) -> StateStore {
    StateStore::open(&endpoint(url, table))
        .await
        .unwrap_or_else(|e| panic!("opening state table {table} at {url}: {e}. Are the services up (make up)?"))
}

/// Every item of the counting bolt of `topology`: key -> (version, state bytes).
pub async fn items(store: &StateStore, topology: &str) -> BTreeMap<String, (u64, Vec<u8>)> {
    let scope = squall::state::scope(topology, COMPONENT);
    let rows = store.scan_scope(&scope).await.unwrap_or_else(|e| panic!("scanning {scope}: {e}"));
    rows.into_iter().map(|(k, v, s)| (k, (v, s))).collect()
}

/// The counts of the keys whose state is a JSON number.
pub fn counts(items: &BTreeMap<String, (u64, Vec<u8>)>) -> BTreeMap<String, u64> {
    items.iter().filter_map(|(k, (_, s))| serde_json::from_slice::<u64>(s).ok().map(|n| (k.clone(), n))).collect()
}

/// Polls until every key of `expected` has exactly its count (or the timeout); returns the last
/// counts read.
pub async fn wait_counts(
    store: &StateStore,
    topology: &str,
    expected: &BTreeMap<String, u64>,
    timeout: Duration,
) -> BTreeMap<String, u64> {
    let start = Instant::now();
    loop {
        let c = counts(&items(store, topology).await);
        if expected.iter().all(|(k, n)| c.get(k) == Some(n)) || start.elapsed() > timeout {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One raw item, by its partition key `pk`: every attribute (strongly consistent).
pub async fn raw_item(store: &StateStore, pk: &str) -> Option<std::collections::HashMap<String, AttributeValue>> {
    store
        .client()
        .expect("a DynamoDB table")
        .get_item()
        .table_name(store.table())
        .key("pk", AttributeValue::S(pk.to_string()))
        .consistent_read(true)
        .send()
        .await
        .expect("GetItem")
        .item
}

/// The item key of `key` for the counting bolt of `topology`.
pub fn item_key(topology: &str, key: &str) -> String {
    format!("{}/{key}", squall::state::scope(topology, COMPONENT))
}

/// Deletes the table (clean-up, best effort).
pub async fn delete_table(store: &StateStore) {
    if let Some(client) = store.client() {
        let _ = client.delete_table().table_name(store.table()).send().await;
    }
}

/// Puts `n` records with partition key `key`, one by one; returns their sequence numbers.
pub async fn put_key(client: &aws_sdk_kinesis::Client, stream: &str, key: &str, n: usize) -> Vec<String> {
    let mut seqs = Vec::with_capacity(n);
    for i in 0..n {
        let r = client
            .put_record()
            .stream_name(stream)
            .partition_key(key)
            .data(aws_sdk_kinesis::primitives::Blob::new(format!("{key}/{i}")))
            .send()
            .await
            .unwrap_or_else(|e| panic!("putting a record of {key}: {e:?}"));
        seqs.push(r.sequence_number().to_string());
    }
    seqs
}

/// The value of `field=` in a structured log line (up to the next space), if any.
pub fn log_field<'a>(line: &'a str, field: &str) -> Option<&'a str> {
    let at = line.find(&format!(" {field}="))? + field.len() + 2;
    let rest = &line[at..];
    Some(rest.split(' ').next().unwrap_or(rest))
}

/// The true per-window counts of a stream: every record, read from TRIM_HORIZON on every shard
/// (closed ones too), counted under `{partition_key}@{window start}` by its approximate arrival
/// time, as `exactly_once_counts --window-ms` keys them.
pub async fn window_truth(stream: &super::TestStream, window_ms: u64) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for rec in super::stages::read_records(stream).await {
        let at = rec.approximate_arrival_timestamp().and_then(|t| t.to_millis().ok()).unwrap_or(0);
        let at = u64::try_from(at).unwrap_or(0);
        *out.entry(format!("{}@{}", rec.partition_key(), at - at % window_ms)).or_default() += 1;
    }
    out
}

/// Every window fired into the results stream of a `WindowFirer` (`exactly_once_counts
/// --fire-to`): `fire_key` -> the counts it was put with (one per copy, so a window put twice
/// shows two).
pub async fn fired_windows(results: &super::TestStream) -> BTreeMap<String, Vec<u64>> {
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for r in super::stages::read_records(results).await {
        let v: serde_json::Value = serde_json::from_slice(r.data().as_ref()).expect("a fired window is JSON");
        let key = v["fire_key"].as_str().expect("fire_key").to_string();
        out.entry(key).or_default().push(v["count"].as_u64().expect("count"));
    }
    out
}

/// The state of every item of `component` in `topology` whose state is a number: key -> value.
pub async fn numbers(store: &StateStore, topology: &str, component: &str) -> BTreeMap<String, u64> {
    let scope = squall::state::scope(topology, component);
    let rows = store.scan_scope(&scope).await.unwrap_or_else(|e| panic!("scanning {scope}: {e}"));
    rows.into_iter().filter_map(|(k, _, s)| serde_json::from_slice::<u64>(&s).ok().map(|n| (k, n))).collect()
}

/// Polls until every (topology, component) holds exactly its expected numbers (or `timeout`
/// passed); the last readings, in the order of `stages`.
pub async fn wait_exact(
    store: &StateStore,
    stages: &[(String, &str, BTreeMap<String, u64>)],
    timeout: Duration,
) -> Vec<BTreeMap<String, u64>> {
    let start = Instant::now();
    loop {
        let mut got = Vec::new();
        for (topology, component, _) in stages {
            got.push(numbers(store, topology, component).await);
        }
        if stages.iter().zip(&got).all(|((_, _, want), g)| g == want) || start.elapsed() > timeout {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
