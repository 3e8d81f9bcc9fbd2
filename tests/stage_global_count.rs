//! A word count that is global across workers (examples/word_count_global.rs): three worker
//! processes, the words going through an intermediate Kinesis stream partitioned by word.
//!
//! The true counts come from the put manifests (the words of a record are its partition key and
//! `d{seq % 7}`), never from the system under test; the counts are the sums of the deltas the
//! count tasks put into the output stream. With KPL producers the truth is the stream itself,
//! read back and de-aggregated (a KPL re-send is a new Kinesis record, read again).
//!
//! And the same across two source streams, with a split and a merge of one, Kinesis throttling
//! reads and failing single entries of every put (a fault proxy as the workers' Kinesis
//! endpoint), and a worker frozen past its ZooKeeper session (a zombie) that must hand nothing
//! on once it thaws.

use squall_test_support as support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use squall::kinesis::payload::AuditPayload;
use squall::kinesis::{self, PutOptions, payload::Manifest};
use support::TestStream;
use support::efo::Seen;
use support::faultproxy::{FaultPlan, FaultProxy};
use support::kpl::KplProducer;
use support::reliability::spawn_producer;
use support::stages::{read_json_records, start_word_count_global};
use support::workers::{Cluster, Worker, example_bin, read_log_entries, scratch};

/// Each word's true count, from the manifests.
fn true_counts(manifests: &[Manifest]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for m in manifests {
        for (key, n) in &m.counts {
            *out.entry(key.clone()).or_default() += n;
            for seq in 0..*n {
                *out.entry(format!("d{}", seq % 7)).or_default() += 1;
            }
        }
    }
    out
}

/// One delta row of the output stream.
#[derive(Debug, serde::Deserialize)]
struct Row {
    word: String,
    delta: u64,
    worker: String,
    task: usize,
}

/// Every delta row of the output stream.
async fn read_rows(out: &TestStream) -> Vec<Row> {
    read_json_records(out).await.into_iter().map(|v| serde_json::from_value(v).expect("a delta row")).collect()
}

fn sums(rows: &[Row]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for r in rows {
        *out.entry(r.word.clone()).or_default() += r.delta;
    }
    out
}

async fn put(src: &TestStream, count: u64, keys: u64) -> Manifest {
    let opts = PutOptions { count, keys, ..PutOptions::default() };
    kinesis::put_records(&src.client, &src.label(), &src.name, &opts).await.expect("put").manifest
}

/// Waits until `done(sums)` holds; returns the last rows.
async fn wait_rows(out: &TestStream, timeout: Duration, done: impl Fn(&BTreeMap<String, u64>) -> bool) -> Vec<Row> {
    let start = Instant::now();
    loop {
        let rows = read_rows(out).await;
        if done(&sums(&rows)) || start.elapsed() > timeout {
            return rows;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn cleanup(cluster: &Cluster, streams: Vec<TestStream>) {
    let endpoint = support::kinesis_endpoint();
    let client = endpoint.client().await.unwrap();
    let _ = kinesis::delete_stream(&client, &endpoint.label(), &format!("{}-words", cluster.topology)).await;
    for s in streams {
        s.delete().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_count_each_word_exactly_once_and_by_one_task_cluster_wide() {
    let src = TestStream::create("wcg-src", 4).await;
    let out = TestStream::create("wcg-out", 1).await;
    let dir = scratch("wcg");
    let cluster = Cluster::new(&src.name, &dir);
    let manifests = vec![put(&src, 600, 24).await];
    let truth = true_counts(&manifests);
    let mut workers: Vec<Worker> =
        (0..3).map(|i| start_word_count_global(&cluster, &format!("w{i}"), &out.name)).collect();
    let rows = wait_rows(&out, Duration::from_secs(120), |s| *s == truth).await;
    let got = sums(&rows);
    for w in &mut workers {
        assert_eq!(w.stop(Duration::from_secs(60)), Some(0), "worker {} exits cleanly:\n{}", w.name, cluster.logs());
    }
    assert_eq!(got, truth, "without faults each word's count equals its true count:\n{}", cluster.logs());
    // one task cluster-wide per word: every delta of a word came from one (worker, task)
    let mut holders: BTreeMap<&str, BTreeSet<(&str, usize)>> = BTreeMap::new();
    for r in &rows {
        holders.entry(&r.word).or_default().insert((&r.worker, r.task));
    }
    let shared: Vec<_> = holders.iter().filter(|(_, h)| h.len() > 1).collect();
    assert!(shared.is_empty(), "words counted by more than one task: {shared:?}");
    let workers_used: BTreeSet<&str> = holders.values().flatten().map(|(w, _)| *w).collect();
    // 4 intermediate shards over 3 workers: each worker reads at least one, and the key hash
    // sends words to every shard
    assert_eq!(workers_used.len(), 3, "the counting is spread over every worker: {workers_used:?}");
    cleanup(&cluster, vec![src, out]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_of_the_intermediate_stream_and_a_killed_worker_lose_no_count() {
    let src = TestStream::create("wcgf-src", 4).await;
    let out = TestStream::create("wcgf-out", 1).await;
    let dir = scratch("wcgf");
    let cluster = Cluster::new(&src.name, &dir);
    let mut manifests = vec![put(&src, 400, 24).await];
    let mut workers: Vec<Worker> =
        (0..3).map(|i| start_word_count_global(&cluster, &format!("w{i}"), &out.name)).collect();
    // the first counts are out, and the worker to be killed counts some words (it reads
    // shards of the intermediate stream): its crash matters
    let victim = format!("-{}", workers[1].pid());
    let start = Instant::now();
    while !read_rows(&out).await.iter().any(|r| r.worker.ends_with(&victim)) {
        assert!(start.elapsed() < Duration::from_secs(90), "worker 1 counted nothing in 90 s:\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // split a shard of the intermediate stream while the topology runs, then crash a worker
    let inter = format!("{}-words", cluster.topology);
    let shards = kinesis::list_shards(&src.client, &src.label(), &inter).await.expect("intermediate shards");
    let parent = shards.iter().find(|s| !s.closed).expect("an open shard").shard_id.clone();
    kinesis::split_shard(&src.client, &src.label(), &inter, &parent).await.expect("split");
    let after = kinesis::list_shards(&src.client, &src.label(), &inter).await.unwrap();
    assert!(after.iter().any(|s| s.parents().any(|p| p == parent)), "the split happened: {after:?}");
    manifests.push(put(&src, 200, 24).await);
    workers[1].kill();
    assert!(!workers[1].is_running(), "worker 1 was killed");
    manifests.push(put(&src, 200, 24).await);

    let truth = true_counts(&manifests);
    let rows =
        wait_rows(&out, Duration::from_secs(150), |s| truth.iter().all(|(w, n)| s.get(w).copied().unwrap_or(0) >= *n))
            .await;
    let got = sums(&rows);
    let short: Vec<_> = truth
        .iter()
        .filter(|(w, n)| got.get(*w).copied().unwrap_or(0) < **n)
        .map(|(w, n)| (w, n, got.get(w)))
        .collect();
    assert!(
        short.is_empty(),
        "words counted fewer times than they occur (word, true, counted): {short:?}\n{}",
        cluster.logs()
    );
    for (i, w) in workers.iter_mut().enumerate() {
        if i != 1 {
            assert_eq!(w.stop(Duration::from_secs(60)), Some(0), "worker {} exits cleanly", w.name);
        }
    }
    cleanup(&cluster, vec![src, out]).await;
}

/// Each word's true count in a stream of audit records written by KPL producers: its user
/// records, read back and de-aggregated (what the spout emits, a KPL re-send included).
async fn true_counts_of_stream(src: &TestStream) -> (BTreeMap<String, u64>, u64) {
    let mut out = BTreeMap::new();
    let records = support::kpl::deaggregated(src).await;
    for r in &records {
        let p: AuditPayload = serde_json::from_slice(&r.data).expect("an audit payload");
        *out.entry(p.key).or_default() += 1;
        *out.entry(format!("d{}", p.seq % 7)).or_default() += 1;
    }
    (out, records.len() as u64)
}

/// At-least-once stages over enhanced fan-out: two `word_count_global --consumer efo:NAME`
/// workers read a source written by both KPL producer styles (a KPL-like one whose stale shard
/// map after a split makes it re-send whole aggregates, and a Lambda-style one with mixed keys
/// per aggregate) through a split of a source shard; the intermediate stream is read by enhanced
/// fan-out too. No word is counted fewer times than its user records occur in the stream, and
/// every open source shard and every shard of the intermediate stream was read by
/// subscriptions, with no GetRecords call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_least_once_stages_over_efo_and_both_kpl_styles_through_a_split_lose_no_count() {
    let src = TestStream::create("wcg-efo-src", 3).await;
    let out = TestStream::create("wcg-efo-out", 1).await;
    let dir = scratch("wcg-efo");
    let cluster = Cluster::new(&src.name, &dir);
    let zk = support::zk_client().await;
    let consumer = format!("efo:{}-app", src.name);
    let bin = support::workers::example_bin("word_count_global");
    let flags = ["--output", out.name.as_str(), "--flush-ms", "500", "--consumer", consumer.as_str()];
    let mut workers: Vec<Worker> = (0..2).map(|i| cluster.start_example(&bin, &format!("w{i}"), 1, &flags)).collect();
    let kpl_keys: Vec<String> = (0..12).map(|i| format!("kpl-{i}")).collect();
    let lambda_keys: Vec<String> = (0..12).map(|i| format!("lam-{i}")).collect();
    let producer = KplProducer::start(&src, kpl_keys, lambda_keys, 2, 8, Duration::from_millis(300)).await;
    let mut seen = Seen::default();
    let start = Instant::now();
    while read_rows(&out).await.is_empty() {
        assert!(start.elapsed() < Duration::from_secs(90), "nothing counted in 90 s:\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    producer.wait_rounds(3).await;
    seen.sample(&zk, &cluster).await;
    // split a source shard; the KPL-like producer's map is stale for 3 rounds
    producer.split("shardId-000000000000").await;
    producer.wait_rounds(3).await;
    producer.refresh_map();
    seen.sample(&zk, &cluster).await;
    producer.wait_rounds(6).await;
    let produced = producer.finish().await;

    let (truth, user_records) = true_counts_of_stream(&src).await;
    assert!(produced.kpl.resent > 0 && produced.lambda_outside > 0 && produced.kpl.outside > 0, "{produced:?}");
    let meant: u64 = produced.kpl_like.values().chain(produced.lambda.values()).sum();
    assert_eq!(user_records, meant + produced.kpl.resent, "the stream holds what was meant and the re-sends");
    let rows =
        wait_rows(&out, Duration::from_secs(150), |s| truth.iter().all(|(w, n)| s.get(w).copied().unwrap_or(0) >= *n))
            .await;
    let got = sums(&rows);
    let short: Vec<_> = truth
        .iter()
        .filter(|(w, n)| got.get(*w).copied().unwrap_or(0) < **n)
        .map(|(w, n)| (w, n, got.get(w)))
        .collect();
    let over: u64 = truth.iter().map(|(w, n)| got.get(w).copied().unwrap_or(0).saturating_sub(*n)).sum();
    eprintln!(
        "{user_records} user records ({meant} meant, {} re-sent in {} aggregates; out of their shard's range: {} \
         KPL-like, {} Lambda-style), {} words; counted over the truth: {over}",
        produced.kpl.resent,
        produced.kpl.resent_aggregates,
        produced.kpl.outside,
        produced.lambda_outside,
        truth.len()
    );
    assert!(
        short.is_empty(),
        "words counted fewer times than they occur (word, true, counted): {short:?}\n{}",
        cluster.logs()
    );
    let unknown: Vec<_> = got.keys().filter(|w| !truth.contains_key(*w)).collect();
    assert!(unknown.is_empty(), "words counted that are not in the stream: {unknown:?}");

    // read by subscriptions: the open source shards and the intermediate stream's shards
    let listed = kinesis::list_shards(&src.client, &src.label(), &src.name).await.unwrap();
    assert_eq!(listed.len(), 3 + 2, "the split not seen in the shard list: {listed:?}");
    let mut must: Vec<String> = listed.iter().filter(|d| !d.closed).map(|d| d.shard_id.clone()).collect();
    let inter = format!("{}-words", cluster.topology);
    let inter_shards = kinesis::list_shards(&src.client, &src.label(), &inter).await.unwrap();
    must.extend(inter_shards.iter().map(|d| format!("{inter}/{}", d.shard_id)));
    seen.watch(&zk, &cluster, Duration::from_secs(20), |seen| must.iter().all(|sh| seen.subscribed(sh))).await;
    eprintln!("EFO status seen: {}", serde_json::to_string(&seen.0).unwrap());
    let polled = seen.not_by_subscription_only(&must);
    assert!(polled.is_empty(), "shards not read by subscriptions only: {polled:#?}");
    let k = support::kpl::kpl_counters(&cluster).await;
    assert!(k.out_of_range > 0 && k.dropped == 0, "{k:?}");

    for w in &mut workers {
        assert_eq!(w.stop(Duration::from_secs(60)), Some(0), "worker {} exits cleanly:\n{}", w.name, cluster.logs());
    }
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    cleanup(&cluster, vec![src, out]).await;
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Lines of a log file containing `needle`.
fn count_in(path: &std::path::Path, needle: &str) -> usize {
    std::fs::read_to_string(path).unwrap_or_default().lines().filter(|l| l.contains(needle)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sources_a_source_split_a_zombie_and_throttling_lose_no_count() {
    let t0 = Instant::now();
    let mark = |what: &str| eprintln!("[{:>6.1} s] {what}", t0.elapsed().as_secs_f64());
    let src_a = TestStream::create("wcgz-a", 3).await;
    let src_b = TestStream::create("wcgz-b", 3).await;
    let out = TestStream::create("wcgz-out", 1).await;
    let dir = scratch("wcgz");
    let cluster = Cluster::new(&src_a.name, &dir);
    // Kinesis throttles 5% of the reads (source and intermediate streams) and of the PutRecords
    // calls (intermediate and output streams), and fails ~10% of the entries of the other
    // PutRecords calls one by one
    let proxy = FaultProxy::start(
        &support::kinesis_endpoint().endpoint,
        FaultPlan {
            throttle: 0.05,
            partial: 1.0,
            partial_entries: 0.1,
            partial_at_least_one: false,
            only_ops: vec!["GetRecords".into(), "PutRecords".into()],
            ..FaultPlan::default()
        },
    )
    .await;
    let url = proxy.url();
    let flags = ["--output", &out.name, "--flush-ms", "500", "--stream", &src_b.name, "--endpoint", &url];
    let mut workers: Vec<Worker> =
        (0..3).map(|i| cluster.start_example(&example_bin("word_count_global"), &format!("w{i}"), 1, &flags)).collect();
    let mut manifests: Vec<Manifest> = Vec::new();

    // ---- round 1: both sources written; a source shard split; a worker frozen past its session ----
    let pa = spawn_producer(&src_a.client, &src_a.label(), &src_a.name, 1000, 24, 100.0);
    let pb = spawn_producer(&src_b.client, &src_b.label(), &src_b.name, 1000, 24, 100.0);
    // the worker to freeze counts words (it reads intermediate shards) and reads source records
    let victim = format!("-{}", workers[1].pid());
    let start = Instant::now();
    let victim_reads = |log: &std::path::Path| read_log_entries(&[log.to_path_buf()]);
    while !(read_rows(&out).await.iter().any(|r| r.worker.ends_with(&victim))
        && victim_reads(&workers[1].read_log).iter().any(|e| e.event == "records"))
    {
        assert!(start.elapsed() < Duration::from_secs(90), "worker 1 counted nothing in 90 s:\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    mark("w1 counts words and reads source records");
    let a0 = kinesis::list_shards(&src_a.client, &src_a.label(), &src_a.name).await.unwrap()[0].shard_id.clone();
    kinesis::split_shard(&src_a.client, &src_a.label(), &src_a.name, &a0).await.expect("split");
    mark(&format!("split {a0} of source A"));
    // its source tasks (the task names it read under before it froze)
    let before = victim_reads(&workers[1].read_log);
    let frozen_tasks: BTreeSet<String> = before.iter().map(|e| e.task.clone()).collect();
    let held: BTreeSet<String> = before.iter().filter(|e| e.event == "records").map(|e| e.shard.clone()).collect();
    workers[1].pause();
    mark(&format!("SIGSTOP w1 (tasks {frozen_tasks:?}, read {held:?})"));
    tokio::time::sleep(Duration::from_secs(8)).await;
    workers[1].resume();
    let resumed_at = now_ms();
    mark("SIGCONT w1 after 8 s (session 4 s)");
    manifests.push(pa.await.unwrap());
    manifests.push(pb.await.unwrap());
    mark("round 1 written");

    // ---- round 2: the split's children merged, both sources written again ----
    let listed = kinesis::list_shards(&src_a.client, &src_a.label(), &src_a.name).await.unwrap();
    let kids: Vec<String> =
        listed.iter().filter(|d| d.parents().any(|p| p == a0)).map(|d| d.shard_id.clone()).collect();
    assert_eq!(kids.len(), 2, "the split of {a0} not in the shard list: {listed:?}");
    kinesis::merge_shards(&src_a.client, &src_a.label(), &src_a.name, &kids[0], &kids[1]).await.expect("merge");
    mark(&format!("merge {kids:?} of source A"));
    manifests.push(put(&src_a, 500, 24).await);
    manifests.push(put(&src_b, 500, 24).await);
    mark("round 2 written");

    let truth = true_counts(&manifests);
    let rows =
        wait_rows(&out, Duration::from_secs(180), |s| truth.iter().all(|(w, n)| s.get(w).copied().unwrap_or(0) >= *n))
            .await;
    mark("every word counted (or timed out)");
    let got = sums(&rows);

    // ---- the faults really happened ----
    let (reads, puts, c) = (proxy.op("GetRecords"), proxy.op("PutRecords"), proxy.counters());
    eprintln!(
        "kinesis proxy: GetRecords {reads:?}; PutRecords {puts:?}, entries failed {} in {} calls",
        c.partial_entries, c.partial_calls
    );
    assert!(reads.faults > 0, "no GetRecords throttled: {reads:?}");
    assert!(puts.faults > 0 && c.partial_entries > 0, "no PutRecords entry failed: {puts:?} {c:?}");
    let listed = kinesis::list_shards(&src_a.client, &src_a.label(), &src_a.name).await.unwrap();
    assert_eq!(listed.len(), 3 + 2 + 1, "source A: a split and a merge: {listed:?}");
    let zlog = dir.join("w1.log");
    assert!(
        count_in(&zlog, "this process was paused") > 0 && count_in(&zlog, "ZooKeeper session ended") > 0,
        "w1 was not frozen past its session\n{}",
        std::fs::read_to_string(&zlog).unwrap_or_default()
    );
    // the zombie handed on no source record under the tasks it had before it froze (a task
    // registered again since acquires its shards anew; the read log does not name the stream,
    // whose tasks are numbered apart)
    let entries = victim_reads(&workers[1].read_log);
    let acquired_again: BTreeSet<&str> =
        entries.iter().filter(|e| e.event == "acquire" && e.t_ms >= resumed_at).map(|e| e.task.as_str()).collect();
    let zombie_reads: Vec<String> = entries
        .iter()
        .filter(|e| {
            e.event == "records"
                && frozen_tasks.contains(&e.task)
                && !acquired_again.contains(e.task.as_str())
                && e.t_ms >= resumed_at
        })
        .map(|e| format!("{} {} {} {:?}..{:?}", e.t_ms, e.task, e.shard, e.first, e.last))
        .collect();
    let read_again = entries.iter().filter(|e| e.event == "records" && e.t_ms >= resumed_at).count();
    eprintln!(
        "zombie: records handed on under its old tasks after SIGCONT: {}; read batches under new tasks since: \
         {read_again}",
        zombie_reads.len()
    );
    assert!(zombie_reads.is_empty(), "the zombie handed on records after it resumed: {zombie_reads:#?}");
    // no record ran out of replays (a dead-lettered record's words are handled without being
    // counted): throttling slows the topology down, it must not make it give records up
    let dead: usize =
        (0..3).map(|i| count_in(&dir.join(format!("w{i}.log")), "emitting it on the dead-letter stream")).sum();
    eprintln!("records dead-lettered after their last replay: {dead}");
    assert_eq!(dead, 0, "records gave up on under throttling\n{}", cluster.logs());

    // ---- at least once: no word counted fewer times than it occurs in both sources ----
    let short: Vec<_> = truth
        .iter()
        .filter(|(w, n)| got.get(*w).copied().unwrap_or(0) < **n)
        .map(|(w, n)| (w, n, got.get(w)))
        .collect();
    let over: u64 = truth.iter().map(|(w, n)| got.get(w).copied().unwrap_or(0).saturating_sub(*n)).sum();
    eprintln!(
        "words {}, true total {}, counted total {}, over-counted (replays) {over}",
        truth.len(),
        truth.values().sum::<u64>(),
        got.values().sum::<u64>()
    );
    assert!(
        short.is_empty(),
        "words counted fewer times than they occur (word, true, counted): {short:?}\n{}",
        cluster.logs()
    );
    assert_eq!(truth.values().sum::<u64>(), 2 * 3000, "two words per record");
    eprintln!("total run {:.1} s", t0.elapsed().as_secs_f64());
    for w in &mut workers {
        assert_eq!(w.stop(Duration::from_secs(60)), Some(0), "worker {} exits cleanly:\n{}", w.name, cluster.logs());
    }
    cleanup(&cluster, vec![src_a, src_b, out]).await;
}
