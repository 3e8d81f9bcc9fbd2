//! Fairness between the shards of one spout task: one shard with a 10,000-record backlog must not
//! starve the task's other shards. One worker (one spout task) owns a 6-shard stream; 10,000
//! records are put into one shard first (explicit hash key), then records trickle into the five
//! others while the backlog drains through a slow sink. Each trickling record must be delivered
//! within one GetRecords batch (`records_per_get`) of backlog deliveries after it was read, not
//! after the backlog.

use squall_test_support as support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use squall::coord::sequence_cmp;
use squall::kinesis::{self, PutOptions};
use support::TestStream;
use support::workers::{Cluster, read_deliveries, read_log_entries, scratch};

const BACKLOG: u64 = 10_000;
const RECORDS_PER_GET: u64 = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_with_a_backlog_does_not_starve_the_others() {
    let s = TestStream::create("fair", 6).await;
    let dir = scratch("fair");
    let shards = kinesis::list_shards(&s.client, &s.label(), &s.name).await.unwrap();
    let backlog_shard = shards[0].shard_id.clone();
    let t0 = Instant::now();
    let backlog = PutOptions {
        count: BACKLOG,
        keys: 500,
        key_prefix: "backlog-".into(),
        explicit_hash_key: Some(shards[0].starting_hash_key.clone()),
        ..PutOptions::default()
    };
    let backlog = kinesis::put_records(&s.client, &s.label(), &s.name, &backlog).await.unwrap().manifest;
    eprintln!("put the {BACKLOG}-record backlog into {backlog_shard} in {:?}", t0.elapsed());

    let cluster = Cluster::with_spout_config(&s.name, &dir, serde_json::json!({"records_per_get": RECORDS_PER_GET}));
    // A slow sink (1 ms per record per task) and few tuples in flight: the backlog takes seconds
    // to drain and its queue stays full meanwhile.
    let mut w = cluster.start_with("w", 1, &["--sink-delay-ms", "1", "--max-spout-pending", "100"]);
    let start = Instant::now();
    loop {
        let reads = read_log_entries(&cluster.read_logs());
        if reads.iter().any(|e| e.event == "records" && e.shard == backlog_shard) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the backlog was never read\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Trickle into the five other shards while the backlog drains.
    let mut producers = Vec::new();
    for (i, sh) in shards.iter().enumerate().skip(1) {
        let opts = PutOptions {
            count: 40,
            keys: 4,
            rate: Some(8.0),
            key_prefix: format!("trickle{i}-"),
            explicit_hash_key: Some(sh.starting_hash_key.clone()),
            ..PutOptions::default()
        };
        let (client, label, name) = (s.client.clone(), s.label(), s.name.clone());
        producers.push(tokio::spawn(async move { kinesis::put_records(&client, &label, &name, &opts).await }));
    }
    let mut manifests = vec![backlog];
    for p in producers {
        manifests.push(p.await.unwrap().expect("trickle put").manifest);
    }
    let report = cluster.wait_delivered(&manifests, Duration::from_secs(120)).await;
    assert_eq!(report.lost, 0, "{report:?}\n{}", cluster.logs());

    // For every trickling record: the backlog records delivered between its read and its delivery.
    let reads: Vec<_> = read_log_entries(&cluster.read_logs()).into_iter().filter(|e| e.event == "records").collect();
    let read_at = |shard: &str, seq: &str| -> Option<i64> {
        reads
            .iter()
            .find(|e| {
                e.shard == shard
                    && e.first.as_deref().is_some_and(|f| sequence_cmp(f, seq).is_le())
                    && e.last.as_deref().is_some_and(|l| sequence_cmp(seq, l).is_le())
            })
            .map(|e| e.t_ms * 1000)
    };
    let mut deliveries = read_deliveries(&cluster.delivery_files());
    deliveries.sort_by_key(|d| d.t_us);
    let mut first: HashMap<(String, u64), usize> = HashMap::new();
    for (i, d) in deliveries.iter().enumerate() {
        first.entry((d.key.clone(), d.seq)).or_insert(i);
    }
    let backlog_times: Vec<i64> =
        deliveries.iter().filter(|d| d.shard == backlog_shard).map(|d| d.t_us).collect::<Vec<_>>();
    let last_backlog = *backlog_times.iter().max().unwrap();
    let mut waits: Vec<(usize, i64)> = Vec::new(); // (backlog deliveries in between, delay in ms)
    for &i in first.values() {
        let d = &deliveries[i];
        if d.shard == backlog_shard {
            continue;
        }
        let read = read_at(&d.shard, &d.sequence).expect("every delivered record was read");
        if read > last_backlog {
            continue; // read after the backlog drained: nothing to compete with
        }
        let between = backlog_times.iter().filter(|t| **t >= read && **t < d.t_us).count();
        waits.push((between, (d.t_us - read) / 1000));
    }
    waits.sort();
    let n = waits.len();
    let (max_between, max_delay) = (waits.last().map_or(0, |w| w.0), waits.iter().map(|w| w.1).max().unwrap_or(0));
    let median = waits.get(n / 2).map_or(0, |w| w.0);
    let backlog_span_ms = (last_backlog - backlog_times.iter().min().unwrap()) / 1000;
    eprintln!(
        "FAIRNESS: {n} trickling records read while the backlog ({BACKLOG} records, drained over {backlog_span_ms} ms) \
         was draining; backlog deliveries between a trickling record's read and its delivery: median {median}, \
         max {max_between} (one batch = {RECORDS_PER_GET}); read-to-delivery delay max {max_delay} ms"
    );
    // The scenario happened: many trickling records competed with the backlog.
    assert!(n >= 50, "only {n} trickling records were read while the backlog drained\n{}", cluster.logs());
    assert!(
        max_between <= RECORDS_PER_GET as usize,
        "a trickling record waited behind {max_between} backlog deliveries (more than one batch of {RECORDS_PER_GET})"
    );
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0), "{}", cluster.logs());
    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}
