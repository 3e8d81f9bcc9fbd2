//! What exactly-once state refuses rather than lose or double a record, run in-process
//! (`run_local`) against dynalite:
//! - `ExactlyOnce` and `WindowFirer` refuse to run with acking off (a start error naming the fix):
//!   every record would be acked, and checkpointed, before its commit;
//! - a production that cannot be emitted (its output fields do not match the declared ones) fails
//!   its input instead of a warning and an ack: the input is replayed, never acked with its
//!   productions missing;
//! - a production that does not encode as a tuple fails its input before the commit: nothing is
//!   stored that cannot be sent.

use squall_test_support as support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use squall::state::{
    ExactlyOnce, FirerConfig, KeyedState, OnFire, StateConfig, StateEndpoint, StateStore, WindowFirer,
};
use squall::topology::{
    ComponentError, Spout, SpoutOutput, TopologyBuilder, TopologyConfig, Tuple, Values, run_local, values,
};

/// Emits `n` tuples shaped like the Kinesis spout's (one stream, one shard), tracked, once each;
/// logs acks and fails.
struct Records {
    n: u64,
    next: u64,
    log: Arc<Mutex<(Vec<u64>, Vec<u64>)>>,
}

impl Spout for Records {
    type MsgId = u64;
    async fn next_tuple(&mut self, out: &mut SpoutOutput<u64>) -> Result<(), ComponentError> {
        if self.next == self.n {
            return Ok(());
        }
        let i = self.next;
        let v: Values = values![
            format!("k{}", i % 3),
            format!("{}", 1000 + i),
            0u64,
            "shardId-000000000000",
            1_700_000_000_000i64,
            bytes::Bytes::from_static(b"x"),
            1u64,
            "",
            "refusals",
            ""
        ];
        out.emit_tracked(v, i)?;
        self.next += 1;
        Ok(())
    }
    async fn ack(&mut self, id: u64) {
        self.log.lock().unwrap().0.push(id);
    }
    async fn fail(&mut self, id: u64) {
        self.log.lock().unwrap().1.push(id);
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Pair {
    key: String,
    n: u64,
    /// Empty, or (with `bad`) an entry whose key JSON cannot write: then it does not encode.
    tags: std::collections::BTreeMap<Vec<u8>, u8>,
}

/// Counts per key and produces a `Pair` per input, one that does not encode when `bad`.
struct CountAndProduce {
    bad: bool,
}

impl KeyedState for CountAndProduce {
    type State = u64;
    type Out = Pair;
    fn key(&self, t: &Tuple) -> Result<String, ComponentError> {
        Ok(t.get_str("partition_key")?.to_string())
    }
    fn apply(&mut self, key: &str, n: &mut u64, _t: &Tuple, out: &mut Vec<Pair>) -> Result<(), ComponentError> {
        *n += 1;
        let tags = if self.bad { [(vec![1u8], 1u8)].into() } else { Default::default() };
        out.push(Pair { key: key.to_string(), n: *n, tags });
        Ok(())
    }
}

struct NoFire;

impl OnFire for NoFire {
    type State = u64;
    type Out = Pair;
    fn fire(&mut self, key: &str, _fire_at: i64, state: u64) -> Pair {
        Pair { key: key.to_string(), n: state, tags: Default::default() }
    }
}

type Log = Arc<Mutex<(Vec<u64>, Vec<u64>)>>;

/// Runs `n` records into an `ExactlyOnce` bolt producing a `Pair` per input (one that does not
/// encode when `bad`) whose declared output fields are `fields`; returns the spout's (acked, failed) once every record was answered
/// at least once (30 s at most), and the scope of its items.
async fn run(table: &str, n: u64, bad: bool, fields: &'static [&'static str]) -> (Log, String) {
    let log: Log = Arc::default();
    let cfg = StateConfig::new(StateEndpoint::new(support::state_endpoint(), table));
    let mut b = TopologyBuilder::new(support::unique_name("refusals"));
    let l = log.clone();
    b.set_spout("spout", 1, move |_| Records { n, next: 0, log: l.clone() }).fields(&squall::spout::FIELDS);
    b.set_bolt("counts", 1, move |_| ExactlyOnce::new(cfg.clone(), CountAndProduce { bad }))
        .fields_grouping("spout", &["partition_key"])
        .fields(fields);
    let topology = b.build().unwrap();
    let name = topology.name().to_string();
    let running =
        run_local(topology, TopologyConfig { message_timeout_ms: 60_000, ..TopologyConfig::default() }).unwrap();
    let start = Instant::now();
    loop {
        let (a, f) = log.lock().unwrap().clone();
        let answered: std::collections::BTreeSet<u64> = a.iter().chain(&f).copied().collect();
        if answered.len() as u64 == n || start.elapsed() > Duration::from_secs(30) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = running.kill(Duration::from_millis(100)).await;
    (log, squall::state::scope(&name, "counts"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_state_and_its_firer_refuse_to_run_with_acking_off() {
    let cfg = StateConfig::new(StateEndpoint::new(support::state_endpoint(), "refusals-never-created"));
    let off = TopologyConfig { acking: false, ..TopologyConfig::default() };
    // the bolt
    let log: Log = Arc::default();
    let mut b = TopologyBuilder::new("refuse-acking-off");
    let l = log.clone();
    b.set_spout("spout", 1, move |_| Records { n: 5, next: 0, log: l.clone() }).fields(&squall::spout::FIELDS);
    let c = cfg.clone();
    b.set_bolt("counts", 1, move |_| ExactlyOnce::new(c.clone(), CountAndProduce { bad: false }))
        .fields_grouping("spout", &["partition_key"])
        .fields(&["key", "n", "tags"]);
    let running = run_local(b.build().unwrap(), off.clone()).unwrap();
    let e = tokio::time::timeout(Duration::from_secs(20), running.wait()).await.expect("stops").unwrap_err();
    let e = e.to_string();
    assert!(e.contains("needs acking") && e.contains("`acking: true`") && e.contains("counts"), "{e}");
    // the firer
    let mut zk = squall::coord::ZkConfig::new(support::zk_connect());
    zk.root = format!("/{}", support::unique_name("refusals"));
    let fire = FirerConfig::new(cfg, "counts", zk, "refusals");
    let mut b = TopologyBuilder::new("refuse-acking-off-firer");
    b.set_spout("fire", 1, move |_| WindowFirer::new(fire.clone(), NoFire))
        .fields(&["key", "n", "tags", "fire_key", "fire_at"]);
    let running = run_local(b.build().unwrap(), off).unwrap();
    let e = tokio::time::timeout(Duration::from_secs(20), running.wait()).await.expect("stops").unwrap_err();
    let e = e.to_string();
    assert!(e.contains("window firer") && e.contains("needs acking") && e.contains("`acking: true`"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_production_that_cannot_be_emitted_fails_its_input() {
    let table = support::unique_name("refusals-emit");
    StateStore::open(&StateEndpoint::new(support::state_endpoint(), &table)).await.expect("state table");
    // Pair has three fields; the bolt declares one: every emit of a production is refused
    let (log, _) = run(&table, 6, false, &["key"]).await;
    let (acked, failed) = log.lock().unwrap().clone();
    eprintln!("acked {acked:?}, failed {failed:?}");
    assert!(acked.is_empty(), "inputs acked although their productions were not sent: {acked:?}");
    assert_eq!(failed.len(), 6, "every input fails: {failed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_production_that_does_not_encode_fails_its_input_before_the_commit() {
    let table = support::unique_name("refusals-encode");
    let store = StateStore::open(&StateEndpoint::new(support::state_endpoint(), &table)).await.expect("state table");
    // a map with byte-string keys does not encode (a nested field is JSON, which cannot have them)
    let (log, scope) = run(&table, 6, true, &["key", "n", "tags"]).await;
    let (acked, failed) = log.lock().unwrap().clone();
    eprintln!("acked {acked:?}, failed {failed:?}");
    assert!(acked.is_empty(), "inputs acked although their productions do not encode: {acked:?}");
    assert_eq!(failed.len(), 6, "every input fails: {failed:?}");
    let items = store.scan_scope(&scope).await.unwrap();
    assert!(items.is_empty(), "state committed for inputs whose productions cannot be sent: {items:?}");
}

/// Creates `{root}/topologies/{topology}/stages/{stream}` (what a stage boundary's writers
/// register under).
async fn plant_stage(root: &str, topology: &str, stream: &str) {
    let zk = support::zk_client().await;
    let opts = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    let mut path = String::new();
    for part in root.trim_start_matches('/').split('/').chain(["topologies", topology, "stages", stream]) {
        path.push('/');
        path.push_str(part);
        match zk.create(&path, b"", &opts).await {
            Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
            Err(e) => panic!("creating {path}: {e}"),
        }
    }
}

/// Runs a `WindowFirer` in topology `topology` over `streams`; the error it stops with.
async fn firer_error(root: &str, topology: &str, streams: &[&str]) -> String {
    let table = support::unique_name("refusals-stage");
    let cfg = StateConfig::new(StateEndpoint::new(support::state_endpoint(), &table));
    let mut zk = squall::coord::ZkConfig::new(support::zk_connect());
    zk.root = root.to_string();
    let fire = FirerConfig::new(cfg, "counts", zk, streams[0]).with_streams(streams.iter().copied());
    let mut b = TopologyBuilder::new(topology);
    b.set_spout("fire", 1, move |_| WindowFirer::new(fire.clone(), NoFire))
        .fields(&["key", "n", "tags", "fire_key", "fire_at"]);
    let running = run_local(b.build().unwrap(), TopologyConfig::default()).unwrap();
    let e = tokio::time::timeout(Duration::from_secs(30), running.wait()).await.expect("the firer stops").unwrap_err();
    e.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_firer_that_could_never_fire_refuses_to_start() {
    let root = format!("/{}", support::unique_name("refusals-stage"));
    // over an intermediate stream between two stages: its readers publish no committed watermark
    plant_stage(&root, "topo", "topo-tally").await;
    let e = firer_error(&root, "topo", &["source", "topo-tally"]).await;
    assert!(e.contains("`topo-tally` is an intermediate stream") && e.contains("first stage"), "{e}");
    // in a later stage (topology `topo.totals`): only the first stage publishes one
    let e = firer_error(&root, "topo.totals", &["source"]).await;
    assert!(e.contains("runs in stage `totals` of topology `topo`") && e.contains("first stage"), "{e}");
}
