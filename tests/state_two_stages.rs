//! Exactly-once keyed state through two stages, against kinesis-local, ZooKeeper and dynalite:
//! workers of `examples/exactly_once_counts.rs --two-stages` count records per partition key in
//! stage `counts`, which emits a production `{key, n: 1}` with its production id per record it
//! applies into an intermediate Kinesis stream; stage `totals` sums them per key. One worker
//! aborts right after a `totals` commit is written (before its inputs are acked: the
//! intermediate records come back), one right after a `counts` commit, one right after its
//! writer put an intermediate record (its productions are put again), one is SIGSTOPped past
//! its ZooKeeper session and resumed (a zombie in both stages: its late writes must be refused),
//! one is SIGKILLed, and `totals` fails the first attempt of ~5% of the productions (replayed
//! after later ones). The intermediate stream must really hold productions twice (read back from
//! it), and both stages' counts must still equal the producer's manifest: none lost, none
//! counted twice.

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
use support::state::{ZOMBIE_COMMIT_INTERVAL_MS, count_in, start_counts, wait_committing, wait_reading, wait_refused};
use support::workers::{Cluster, scratch};

/// Polls until both stages' counts match the manifest (or the timeout); the last reports.
async fn wait_both(
    manifest: &Path,
    ep: &StateEndpoint,
    topology: &str,
    timeout: Duration,
) -> (squall::audit::CountsReport, squall::audit::CountsReport) {
    let start = Instant::now();
    let totals_topology = format!("{topology}.totals");
    loop {
        let m = [manifest.to_path_buf()];
        let first = squall::audit::audit_counts(&m, ep, topology, "counts").await.unwrap();
        let second = squall::audit::audit_counts(&m, ep, &totals_topology, "totals").await.unwrap();
        if (first.mismatched == 0 && second.mismatched == 0) || start.elapsed() > timeout {
            return (first, second);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Production id -> number of intermediate records holding it, read back from the stream.
async fn production_copies(stream: &TestStream) -> BTreeMap<(String, String), usize> {
    let mut copies = BTreeMap::new();
    for r in support::stages::read_records(stream).await {
        let data = bytes::Bytes::copy_from_slice(r.data().as_ref());
        // fields: key, region, n, production_shard, production_id, production_floor, production_range
        let Ok(rec) = codec::decode(&data, 7) else { continue };
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_are_exact_through_two_stages_after_aborts_zombie_and_sigkill() {
    let t0 = Instant::now();
    let mark = |what: &str| eprintln!("[{:>6.1} s] {what}", t0.elapsed().as_secs_f64());
    let s = TestStream::create("eo-2st", 2).await;
    let dir = scratch("eo-2st");
    let cluster = Cluster::with_spout_config(&s.name, &dir, serde_json::json!({ "checkpoint_interval_ms": 200 }));
    let table = support::unique_name("eo-2st");
    let url = support::state_endpoint();
    let ep = StateEndpoint::new(url.clone(), table.clone());
    StateStore::open(&ep).await.expect("state table");
    // every worker's `totals` fails the first attempt of ~5% of the productions: they are
    // replayed after later productions of their key, whose producer floors already cover them
    let two = ["--two-stages", "--boundary-shards", "2", "--totals-fail-percent", "5"];
    let with = |extra: &[&str]| -> Vec<String> { two.iter().chain(extra).map(|s| s.to_string()).collect() };
    let start = |name: &str, extra: &[&str]| {
        let args = with(extra);
        start_counts(&cluster, name, &url, &table, &args.iter().map(String::as_str).collect::<Vec<_>>())
    };

    let producer = spawn_producer(&s.client, &s.label(), &s.name, 4000, 20, 200.0);
    // 1. b, alone, aborts right after its 15th written `totals` commit, before acking: the
    //    intermediate records of that commit are read again by the next owner
    let mut b = start("b", &["--abort-totals-after-commits", "15"]);
    let code = b.wait_exit(Duration::from_secs(60));
    assert!(code.is_some(), "b never reached its 15th totals commit\n{}", cluster.logs());
    assert_eq!(count_in(&b.log, "abort_after_commits: aborting after a written commit"), 1, "{}", b.log_text());
    mark(&format!("b aborted after a written totals commit (exit {code:?})"));
    // 2. d, alone, aborts right after its 20th written `counts` commit
    let mut d = start("d", &["--abort-after-commits", "20"]);
    let code = d.wait_exit(Duration::from_secs(60));
    assert!(code.is_some(), "d never reached its 20th counts commit\n{}", cluster.logs());
    assert_eq!(count_in(&d.log, "abort_after_commits: aborting after a written commit"), 1, "{}", d.log_text());
    mark(&format!("d aborted after a written counts commit (exit {code:?})"));
    // 2b. e, alone, aborts right after its writer put its 10th record into the intermediate
    //     stream, before that record's inputs are acked: their source records are read again by
    //     the next owner, which finds them applied and sends their productions again, so the
    //     intermediate stream holds those productions twice (what `totals` must apply once)
    let mut e = start("e", &["--abort-after-puts", "10"]);
    let code = e.wait_exit(Duration::from_secs(60));
    assert!(code.is_some(), "e never put its 10th intermediate record\n{}", cluster.logs());
    assert_eq!(count_in(&e.log, "abort_after_puts: aborting after a record was put"), 1, "{}", e.log_text());
    mark(&format!("e aborted after putting an intermediate record (exit {code:?})"));
    // 3. a commits slowly, and is frozen a moment after a commit round in steady state: past
    //    the replays of the aborted workers' records (duplicates write nothing, so a zombie
    //    holding only those would have nothing to be refused), holding fresh, uncommitted inputs
    let mut a = start("a", &["--commit-interval-ms", ZOMBIE_COMMIT_INTERVAL_MS]);
    let mut c = start("c", &[]);
    wait_reading(&a, &cluster).await;
    wait_committing(&a, &cluster).await;
    a.pause();
    mark("SIGSTOP a");
    tokio::time::sleep(Duration::from_secs(9)).await;
    a.resume();
    mark("SIGCONT a");
    tokio::time::sleep(Duration::from_secs(1)).await;
    c.kill();
    mark("SIGKILL c");
    let mut c2 = start("c2", &[]);

    let manifest: Manifest = producer.await.unwrap();
    let manifest_path = dir.join("manifest.json");
    std::fs::write(&manifest_path, serde_json::to_string(&manifest).unwrap()).unwrap();
    mark(&format!("producer done: {} records over {} keys", manifest.total, manifest.counts.len()));
    let (first, second) = wait_both(&manifest_path, &ep, &cluster.topology, Duration::from_secs(120)).await;
    mark("counts settled (or timed out)");

    eprintln!("counts: {first:?}\ntotals: {second:?}");
    // ---- the faults really happened ----
    let logs = ["a", "b", "c", "c2", "d", "e"].map(|n| dir.join(format!("{n}.log")));
    // the resumed zombie flushes what it held: its writes are refused (wait for them to be tried)
    let refused = wait_refused(&a).await;
    let injected: usize = logs.iter().map(|l| count_in(l, "fault injection: failing the first attempt")).sum();
    let dup_productions: usize = logs.iter().map(|l| count_in(l, "duplicate production skipped")).sum();
    let inter = TestStream::existing(&format!("{}-tally", cluster.topology)).await;
    let copies = production_copies(&inter).await;
    let repeated = copies.values().filter(|n| **n > 1).count();
    eprintln!(
        "refused writes of the zombie a: {refused}; productions failed on their first attempt: {injected}; \
         duplicate productions skipped: {dup_productions}; productions in the intermediate stream: {} ({repeated} \
         held by more than one record)",
        copies.len()
    );
    assert!(injected > 0, "no production failed on its first attempt\n{}", cluster.logs());
    assert!(
        count_in(&a.log, "this process was paused") > 0 && count_in(&a.log, "ZooKeeper session ended") > 0,
        "the zombie was not frozen past its session\n{}",
        a.log_text()
    );
    assert!(refused > 0, "the zombie's late writes were not refused\n{}", a.log_text());
    assert!(dup_productions > 0, "no production was recognized as already applied\n{}", cluster.logs());
    assert!(repeated > 0, "no production was put twice into the intermediate stream: the test proves nothing");
    assert_eq!(copies.len(), 4000, "one production per source record, each with its id");

    // ---- exactly once, in both stages ----
    for (stage, r) in [("counts", &first), ("totals", &second)] {
        assert_eq!(r.expected_total, 4000);
        assert_eq!(
            (r.mismatched, r.over, r.under),
            (0, 0, 0),
            "stage {stage}: counts differ from the manifest: {r:?}\n{}",
            cluster.logs()
        );
        assert_eq!(r.counted_total, r.expected_total, "stage {stage}");
    }
    eprintln!("total run {:.1} s", t0.elapsed().as_secs_f64());
    for p in [&mut a, &mut c2] {
        p.stop(Duration::from_secs(15));
    }
    inter.delete().await;
    s.delete().await;
}
