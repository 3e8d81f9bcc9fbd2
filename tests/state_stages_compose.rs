//! Exactly-once stages where they meet other features, against kinesis-local, ZooKeeper and
//! dynalite, with workers of `examples/exactly_once_counts.rs`:
//! - three exactly-once stages (`--three-stages`: `counts` -> `totals` -> `finals`), with the
//!   writers of both boundaries aborting right after a put, before its inputs are acked, so both
//!   intermediate streams hold productions twice: a stage that sees a copy of a production it
//!   applied re-sends what it made under the ids it first made it with, so every stage counts
//!   exactly (a copy re-sent under a new id would be applied twice by the next stage);
//! - a stage keyed coarser than its boundary (`--totals-by all`: one global total; `region`: one
//!   of three regions) while one intermediate shard lags (its reader frozen for 3 s): a floor
//!   carried by the productions of one intermediate shard says nothing of another's, so the
//!   lagging shard's productions are still applied.

use squall_test_support as support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use squall::kinesis::payload::Manifest;
use squall::stage::codec::{self, Payload};
use squall::state::{StateEndpoint, StateStore};
use squall::topology::Value;
use support::TestStream;
use support::reliability::spawn_producer;
use support::state::{count_in, start_counts, wait_reading};
use support::workers::{Cluster, scratch};

/// Fields of the example's productions: key, region, n and the production fields.
const PRODUCTION_WIDTH: usize = 7;

/// Production id -> number of intermediate records holding it, read back from the stream.
async fn production_copies(stream: &TestStream) -> BTreeMap<(String, String), usize> {
    let mut copies = BTreeMap::new();
    for r in support::stages::read_records(stream).await {
        let data = bytes::Bytes::copy_from_slice(r.data().as_ref());
        let Ok(rec) = codec::decode(&data, PRODUCTION_WIDTH) else { continue };
        if let Payload::Data(tuples) = rec.payload {
            for t in tuples {
                if let (Value::Str(shard), Value::Str(id)) = (&t[3], &t[4]) {
                    *copies.entry((shard.to_string(), id.to_string())).or_insert(0) += 1;
                }
            }
        }
    }
    copies
}

fn manifest_counts(path: &Path) -> BTreeMap<String, u64> {
    let m: Manifest = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    m.counts.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_stages_count_exactly_with_productions_put_twice_on_both_boundaries() {
    let t0 = Instant::now();
    let mark = |what: &str| eprintln!("[{:>6.1} s] {what}", t0.elapsed().as_secs_f64());
    let s = TestStream::create("eo-3st", 2).await;
    let dir = scratch("eo-3st");
    let cluster = Cluster::with_spout_config(&s.name, &dir, serde_json::json!({ "checkpoint_interval_ms": 200 }));
    let table = support::unique_name("eo-3st");
    let url = support::state_endpoint();
    let store = StateStore::open(&StateEndpoint::new(url.clone(), table.clone())).await.expect("state table");
    let three = ["--three-stages", "--boundary-shards", "2"];
    let start = |name: &str, extra: &[&str]| {
        let args: Vec<&str> = three.iter().chain(extra).copied().collect();
        start_counts(&cluster, name, &url, &table, &args)
    };

    let producer = spawn_producer(&s.client, &s.label(), &s.name, 3000, 20, 200.0);
    // e1, alone, aborts right after its writer put its 10th record into the first intermediate
    // stream: the next owner re-reads the source records, finds them applied and sends their
    // productions again (a second copy of each in `tally`)
    let mut e1 = start("e1", &["--abort-after-puts", "10"]);
    assert!(e1.wait_exit(Duration::from_secs(60)).is_some(), "e1 never put its 10th record\n{}", cluster.logs());
    assert_eq!(count_in(&e1.log, "abort_after_puts: aborting after a record was put"), 1, "{}", e1.log_text());
    mark("e1 aborted after a put into the first intermediate stream");
    // e2, alone, the same on the second boundary (`relay`)
    let mut e2 = start("e2", &["--abort-relay-after-puts", "10"]);
    assert!(e2.wait_exit(Duration::from_secs(60)).is_some(), "e2 never put its 10th relay record\n{}", cluster.logs());
    assert_eq!(count_in(&e2.log, "abort_after_puts: aborting after a record was put"), 1, "{}", e2.log_text());
    mark("e2 aborted after a put into the second intermediate stream");
    let mut a = start("a", &[]);
    let mut c = start("c", &[]);
    wait_reading(&a, &cluster).await;

    let manifest: Manifest = producer.await.unwrap();
    let manifest_path = dir.join("manifest.json");
    std::fs::write(&manifest_path, serde_json::to_string(&manifest).unwrap()).unwrap();
    mark(&format!("producer done: {} records over {} keys", manifest.total, manifest.counts.len()));
    let want = manifest_counts(&manifest_path);
    let topo = cluster.topology.clone();
    let stages = [
        (topo.clone(), "counts", want.clone()),
        (format!("{topo}.totals"), "totals", want.clone()),
        (format!("{topo}.finals"), "finals", want.clone()),
    ];
    let got = support::state::wait_exact(&store, &stages, Duration::from_secs(120)).await;
    mark("counts settled (or timed out)");

    // ---- the faults really happened: both intermediate streams hold productions twice ----
    let tally = TestStream::existing(&format!("{topo}-tally")).await;
    let relay = TestStream::existing(&format!("{topo}-relay")).await;
    let (c1, c2) = (production_copies(&tally).await, production_copies(&relay).await);
    let (r1, r2) = (c1.values().filter(|n| **n > 1).count(), c2.values().filter(|n| **n > 1).count());
    eprintln!(
        "productions in tally: {} ({r1} held by more than one record); in relay: {} ({r2} held twice)",
        c1.len(),
        c2.len()
    );
    assert!(r1 > 0, "no production was put twice into the first intermediate stream: the test proves nothing");
    assert!(r2 > 0, "no production was put twice into the second intermediate stream: the test proves nothing");

    // ---- exactly once, in all three stages ----
    for ((topology, component, want), got) in stages.iter().zip(&got) {
        let off: Vec<(&String, u64, u64)> = want
            .iter()
            .filter_map(|(k, n)| {
                let g = got.get(k).copied().unwrap_or(0);
                (g != *n).then_some((k, g, *n))
            })
            .collect();
        assert!(off.is_empty(), "{topology}/{component}: (key, counted, written) differ: {off:?}\n{}", cluster.logs());
    }
    assert_eq!(c1.len(), 3000, "one production per source record in tally, each with its id");
    assert_eq!(c2.len(), 3000, "one production per tally in relay, each with its first id");
    for p in [&mut a, &mut c] {
        p.stop(Duration::from_secs(15));
    }
    tally.delete().await;
    relay.delete().await;
    s.delete().await;
}

/// Two stages whose second is keyed by `by` (`all` or `region`), one intermediate shard lagging.
async fn coarse_totals_count_exactly_with_a_lagging_intermediate_shard(by: &str) {
    let t0 = Instant::now();
    let mark = |what: &str| eprintln!("[{:>6.1} s] {what}", t0.elapsed().as_secs_f64());
    let s = TestStream::create(&format!("eo-coarse-{by}"), 2).await;
    let dir = scratch(&format!("eo-coarse-{by}"));
    let cluster = Cluster::with_spout_config(&s.name, &dir, serde_json::json!({ "checkpoint_interval_ms": 200 }));
    let table = support::unique_name("eo-coarse");
    let url = support::state_endpoint();
    let store = StateStore::open(&StateEndpoint::new(url.clone(), table.clone())).await.expect("state table");
    let flags = ["--two-stages", "--boundary-shards", "2", "--totals-by", by];
    let mut a = start_counts(&cluster, "a", &url, &table, &flags);
    let mut b = start_counts(&cluster, "b", &url, &table, &flags);
    let tally = format!("{}-tally", cluster.topology);
    // both read an intermediate shard (two shards, one spout task each)
    let reads_tally = |p: &support::reliability::Proc| {
        std::fs::read_to_string(&p.log)
            .unwrap_or_default()
            .lines()
            .any(|l| l.contains("reading shard") && l.contains(&format!("stream={tally}")))
    };
    let deadline = Instant::now() + Duration::from_secs(40);
    while !(reads_tally(&a) && reads_tally(&b)) {
        assert!(Instant::now() < deadline, "both workers never read the intermediate stream\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let producer = spawn_producer(&s.client, &s.label(), &s.name, 3000, 30, 250.0);
    // b's readers lag: frozen 3 s (within its 4 s session: it keeps its shards), three times
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        b.pause();
        mark("SIGSTOP b");
        tokio::time::sleep(Duration::from_secs(3)).await;
        b.resume();
        mark("SIGCONT b");
    }
    let manifest: Manifest = producer.await.unwrap();
    mark(&format!("producer done: {} records", manifest.total));
    let mut want: BTreeMap<String, u64> = BTreeMap::new();
    for (k, n) in &manifest.counts {
        let key = match by {
            "all" => "all".to_string(),
            _ => {
                let h = k.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100000001b3));
                format!("region-{}", h % 3)
            }
        };
        *want.entry(key).or_default() += n;
    }
    let totals = format!("{}.totals", cluster.topology);
    let stages = [
        (cluster.topology.clone(), "counts", manifest.counts.clone().into_iter().collect()),
        (totals, "totals", want.clone()),
    ];
    let got = support::state::wait_exact(&store, &stages, Duration::from_secs(120)).await;
    mark("counts settled (or timed out)");
    let dup: usize = [&a, &b].iter().map(|p| count_in(&p.log, "duplicate production skipped")).sum();
    eprintln!("totals by {by}: {:?} (written {want:?}); duplicate productions skipped: {dup}", got[1]);
    assert_eq!(got[0], stages[0].2, "stage counts\n{}", cluster.logs());
    assert_eq!(got[1], want, "stage totals by {by}: none lost, none twice\n{}", cluster.logs());
    for p in [&mut a, &mut b] {
        p.stop(Duration::from_secs(15));
    }
    TestStream::existing(&tally).await.delete().await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_total_counts_exactly_while_an_intermediate_shard_lags() {
    coarse_totals_count_exactly_with_a_lagging_intermediate_shard("all").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn totals_per_region_count_exactly_while_an_intermediate_shard_lags() {
    coarse_totals_count_exactly_with_a_lagging_intermediate_shard("region").await;
}
