//! Exactly-once stages through reshards of their source and intermediate streams, under
//! throttling, against kinesis-local, ZooKeeper and dynalite, with workers of
//! `examples/exactly_once_counts.rs --two-stages`: two source streams with the same keys
//! (`--stream B`), the state store throttling and failing (a fault proxy), Kinesis throttling
//! reads and failing single entries of the writers' puts (a fault proxy as the workers' Kinesis
//! endpoint), a source shard split and its children merged, and a shard of the intermediate
//! stream split while both workers read it (ListShards failing for the worker that takes its
//! children) and its children merged. The floors that prune production ids are scoped by the hash range of the
//! intermediate shard they were read from; here that range is split and merged under them, and
//! for a while unknown to the readers. Stage `totals` keyed by the boundary's key, and by region
//! (one key reading every intermediate shard). Both stages must count exactly.
//!
//! (Apart from `state_stages_compose.rs`: its single-key global total sits near DynamoDB's item
//! limit while it lags, and fails when these heavier tests load the shared services at the same
//! time.)

use squall_test_support as support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use squall::kinesis::payload::Manifest;
use squall::kinesis::{self, ShardDescription};
use squall::state::dedup::KeyRange;
use squall::state::{Dedup, StateEndpoint, StateStore};
use support::TestStream;
use support::faultproxy::{FaultPlan, FaultProxy};
use support::reliability::spawn_producer;
use support::state::{count_in, start_counts, wait_reading};
use support::workers::{Cluster, scratch};

/// Data records per shard of `stream` (control records of the stage writers left out), read back
/// from TRIM_HORIZON on every shard, closed ones too.
async fn data_records_per_shard(stream: &TestStream) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for shard in kinesis::list_shards(&stream.client, &stream.label(), &stream.name).await.unwrap() {
        let mut n = 0;
        let mut it = stream
            .client
            .get_shard_iterator()
            .stream_name(&stream.name)
            .shard_id(&shard.shard_id)
            .shard_iterator_type(aws_sdk_kinesis::types::ShardIteratorType::TrimHorizon)
            .send()
            .await
            .unwrap_or_else(|e| panic!("iterator of {} {}: {e:?}", stream.name, shard.shard_id))
            .shard_iterator;
        while let Some(i) = it.take() {
            let r = stream.client.get_records().shard_iterator(i).limit(10_000).send().await.unwrap();
            let caught_up = r.records().is_empty() && r.millis_behind_latest().unwrap_or(0) == 0;
            n += r.records().iter().filter(|r| r.partition_key() != "squall-control").count();
            if caught_up {
                break;
            }
            it = r.next_shard_iterator().map(String::from);
        }
        out.insert(shard.shard_id, n);
    }
    out
}

/// Whether a worker log says it reads `shard` of `stream`.
fn reads_shard(log: &Path, stream: &str, shard: &str) -> bool {
    std::fs::read_to_string(log).unwrap_or_default().lines().any(|l| {
        l.contains("reading shard")
            && l.contains(&format!("stream={stream} "))
            && l.contains(&format!("shard={shard} "))
    })
}

/// Waits (`guard` at most) until one of `logs` says it reads `shard` of `stream`.
async fn wait_shard_read(cluster: &Cluster, logs: &[&Path], stream: &str, shard: &str, guard: Duration) {
    let start = Instant::now();
    while !logs.iter().any(|l| reads_shard(l, stream, shard)) {
        assert!(start.elapsed() < guard, "{shard} of {stream} was never read\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The children of `parent` in a shard list.
fn children<'a>(list: &'a [ShardDescription], parent: &str) -> Vec<&'a ShardDescription> {
    list.iter().filter(|d| d.parents().any(|p| p == parent)).collect()
}

/// Writes one round of `count` records over the 20 keys to each of the two streams at once
/// (background producers); the manifests are saved as `{dir}/manifest-{round}-{a|b}.json`.
fn produce_round(a: &TestStream, b: &TestStream, count: u64) -> tokio::task::JoinHandle<(Manifest, Manifest)> {
    let pa = spawn_producer(&a.client, &a.label(), &a.name, count, 20, 100.0);
    let pb = spawn_producer(&b.client, &b.label(), &b.name, count, 20, 100.0);
    tokio::spawn(async move { (pa.await.unwrap(), pb.await.unwrap()) })
}

/// The key of stage `totals` of a production of partition key `key`, by `--totals-by`.
fn totals_key(by: &str, key: &str) -> String {
    match by {
        "all" => "all".to_string(),
        "region" => {
            let h = key.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100000001b3));
            format!("region-{}", h % 3)
        }
        _ => key.to_string(),
    }
}

/// The fault plan of the workers' Kinesis proxy: 5% of the reads (source and intermediate
/// streams) and of the PutRecords calls throttled, ~10% of the entries of the other PutRecords
/// calls failed one by one; with `list_outage`, every ListShards throttled instead.
fn kinesis_faults(list_outage: bool) -> FaultPlan {
    if list_outage {
        return FaultPlan { throttle: 1.0, only_ops: vec!["ListShards".into()], ..FaultPlan::default() };
    }
    FaultPlan {
        throttle: 0.05,
        partial: 1.0,
        partial_entries: 0.1,
        partial_at_least_one: false,
        only_ops: vec!["GetRecords".into(), "PutRecords".into()],
        ..FaultPlan::default()
    }
}

/// Two exactly-once stages (`totals` keyed by `by`) over two source streams A and B with the
/// same keys, through a split and a merge of A, a split of an intermediate shard and a merge of
/// its children, with the store and Kinesis behind fault proxies; ListShards fails for the worker
/// that reads the split shard (and does not lead the intermediate stream) when it comes to take
/// the children, so it cannot learn their hash key ranges then. Both stages must count exactly,
/// and every production floor `totals` keeps must hold within one intermediate shard's range.
async fn two_stages_through_reshards_and_throttling(by: &str) {
    let t0 = Instant::now();
    let mark = |what: &str| eprintln!("[{:>6.1} s] {what}", t0.elapsed().as_secs_f64());
    let sa = TestStream::create("eo-rs-a", 2).await;
    let sb = TestStream::create("eo-rs-b", 2).await;
    let dir = scratch(&format!("eo-rs-{by}"));
    // a failed record comes back 2.5-5 s later, after later productions of its key (and their
    // floors) were applied
    let cluster = Cluster::with_spout_config(
        &sa.name,
        &dir,
        serde_json::json!({ "checkpoint_interval_ms": 200, "retry": { "replay_min_backoff_ms": 5000 } }),
    );
    let table = support::unique_name("eo-rs");
    let ep = StateEndpoint::new(support::state_endpoint(), table.clone());
    let store = StateStore::open(&ep).await.expect("state table");
    // the store throttles and answers 500s
    let store_proxy = FaultProxy::start(
        &support::state_endpoint(),
        FaultPlan { throttle: 0.03, server_error: 0.03, max_faults: 300, ..FaultPlan::default() },
    )
    .await;
    // each worker reaches Kinesis through its own proxy (the same faults), so that ListShards
    // can fail for one worker only
    let kinesis_a = FaultProxy::start(&support::kinesis_endpoint().endpoint, kinesis_faults(false)).await;
    let kinesis_b = FaultProxy::start(&support::kinesis_endpoint().endpoint, kinesis_faults(false)).await;
    let store_url = store_proxy.url();
    let flags = |kinesis: &FaultProxy| -> Vec<String> {
        let mut f: Vec<String> =
            ["--two-stages", "--boundary-shards", "2", "--totals-fail-percent", "5", "--totals-by", by]
                .iter()
                .map(|s| s.to_string())
                .collect();
        f.extend(["--stream".to_string(), sb.name.clone(), "--endpoint".to_string(), kinesis.url()]);
        f
    };
    let start_worker = |name: &str, kinesis: &FaultProxy| {
        let f = flags(kinesis);
        start_counts(&cluster, name, &store_url, &table, &f.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let mut a = start_worker("a", &kinesis_a);
    let mut b = start_worker("b", &kinesis_b);
    wait_reading(&a, &cluster).await;
    wait_reading(&b, &cluster).await;
    let tally = TestStream::existing(&format!("{}-tally", cluster.topology)).await;
    let logs = [a.log.as_path(), b.log.as_path()];
    // both read the intermediate stream (two shards, one spout task each)
    let deadline = Instant::now() + Duration::from_secs(60);
    while !logs.iter().all(|l| reads_tally(l, &tally.name)) {
        assert!(Instant::now() < deadline, "both workers never read the intermediate stream\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // the worker that does not lead the intermediate stream (the leader lists its shards)
    let leads = |l: &Path| {
        std::fs::read_to_string(l)
            .unwrap_or_default()
            .lines()
            .any(|line| line.contains("this worker leads") && line.contains(&format!("stream={}", tally.name)))
    };
    let (follower, follower_log, follower_proxy) =
        if leads(&a.log) { ("b", b.log.clone(), &kinesis_b) } else { ("a", a.log.clone(), &kinesis_a) };
    mark(&format!("both workers read the intermediate stream; {follower} does not lead it"));
    let mut manifests: Vec<Manifest> = Vec::new();

    // ---- round 1: split a source shard and an intermediate shard under load ----
    let round = produce_round(&sa, &sb, 700);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let a0 = kinesis::list_shards(&sa.client, &sa.label(), &sa.name).await.unwrap()[0].shard_id.clone();
    kinesis::split_shard(&sa.client, &sa.label(), &sa.name, &a0).await.unwrap();
    mark(&format!("split {a0} of the source stream A"));
    // the intermediate shard the follower reads: a split's children go to their parent's reader
    let x = std::fs::read_to_string(&follower_log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("reading shard") && l.contains(&format!("stream={} ", tally.name)))
        .find_map(|l| l.split("shard=").nth(1).and_then(|r| r.split(' ').next()).map(str::to_string))
        .expect("the follower reads an intermediate shard");
    // from now on ListShards fails for the follower: it cannot learn the children's hash key
    // ranges when it comes to take them (the leader lists them)
    follower_proxy.set_plan(kinesis_faults(true));
    let outage = Instant::now();
    let keys: Vec<String> = (0..20).map(|i| format!("key-{i}")).collect();
    kinesis::split_shard(&tally.client, &tally.label(), &tally.name, &x).await.unwrap();
    let listed = kinesis::list_shards(&tally.client, &tally.label(), &tally.name).await.unwrap();
    let split_children: Vec<String> = children(&listed, &x).iter().map(|d| d.shard_id.clone()).collect();
    assert_eq!(split_children.len(), 2, "the split of {x} not in the shard list: {listed:?}");
    let in_child = |c: &str| {
        let d = listed.iter().find(|d| d.shard_id == c).unwrap();
        let (lo, hi): (u128, u128) = (d.starting_hash_key.parse().unwrap(), d.ending_hash_key.parse().unwrap());
        keys.iter().filter(|k| (lo..=hi).contains(&squall::stage::writer::explicit_hash_key(k))).count()
    };
    mark(&format!(
        "ListShards fails for {follower}; split {x} of the intermediate stream (its children hold {} and {} keys)",
        in_child(&split_children[0]),
        in_child(&split_children[1])
    ));
    // until the follower came to take a child: it found the child's range unknown (or, before
    // the readers waited for ranges, took it without one)
    let start = Instant::now();
    while !split_children.iter().any(|c| {
        reads_shard(&follower_log, &tally.name, c)
            || std::fs::read_to_string(&follower_log).unwrap_or_default().lines().any(|line| {
                line.contains("hash key range")
                    && line.contains("is unknown")
                    && line.contains(&tally.name)
                    && line.contains(&format!("{c} "))
            })
    }) {
        assert!(start.elapsed() < Duration::from_secs(90), "{follower} never came to take a child\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    follower_proxy.set_plan(kinesis_faults(false));
    let listings_failed = follower_proxy.op("ListShards").faults;
    mark(&format!(
        "ListShards answers {follower} again ({listings_failed} failed in {:.1} s)",
        outage.elapsed().as_secs_f64()
    ));
    for c in &split_children {
        wait_shard_read(&cluster, &logs, &tally.name, c, Duration::from_secs(90)).await;
    }
    mark(&format!("the split's children {split_children:?} are read"));
    let (ma, mb) = round.await.unwrap();
    manifests.extend([ma, mb]);
    mark("round 1 written");

    // ---- round 2: merge the source stream's children and the intermediate shard's children ----
    let round = produce_round(&sa, &sb, 700);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let listed_a = kinesis::list_shards(&sa.client, &sa.label(), &sa.name).await.unwrap();
    let a_children: Vec<String> = children(&listed_a, &a0).iter().map(|d| d.shard_id.clone()).collect();
    assert_eq!(a_children.len(), 2, "the split of {a0} not in the shard list: {listed_a:?}");
    kinesis::merge_shards(&sa.client, &sa.label(), &sa.name, &a_children[0], &a_children[1]).await.unwrap();
    mark(&format!("merge {a_children:?} of the source stream A"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    kinesis::merge_shards(&tally.client, &tally.label(), &tally.name, &split_children[0], &split_children[1])
        .await
        .unwrap();
    mark(&format!("merge {split_children:?} of the intermediate stream"));
    let (ma, mb) = round.await.unwrap();
    manifests.extend([ma, mb]);
    mark("round 2 written");
    let listed = kinesis::list_shards(&tally.client, &tally.label(), &tally.name).await.unwrap();
    let merged = listed
        .iter()
        .find(|d| d.parents().count() == 2 && split_children.iter().all(|c| d.parents().any(|p| p == c)))
        .unwrap_or_else(|| panic!("the merge of {split_children:?} not in the shard list: {listed:?}"))
        .shard_id
        .clone();
    wait_shard_read(&cluster, &logs, &tally.name, &merged, Duration::from_secs(90)).await;
    mark(&format!("the merge's child {merged} is read"));

    // ---- round 3: through the merged shards ----
    let (ma, mb) = produce_round(&sa, &sb, 600).await.unwrap();
    manifests.extend([ma, mb]);
    mark("round 3 written");
    let mut per_key: BTreeMap<String, u64> = BTreeMap::new();
    let mut want: BTreeMap<String, u64> = BTreeMap::new();
    for m in &manifests {
        for (k, n) in &m.counts {
            *per_key.entry(k.clone()).or_default() += n;
            *want.entry(totals_key(by, k)).or_default() += n;
        }
    }
    let stages = [
        (cluster.topology.clone(), "counts", per_key.clone()),
        (format!("{}.totals", cluster.topology), "totals", want.clone()),
    ];
    let got = support::state::wait_exact(&store, &stages, Duration::from_secs(180)).await;
    mark("counts settled (or timed out)");

    // ---- the faults really happened ----
    let store_faults = store_proxy.counters();
    let sum_op = |op: &str| {
        let (x, y) = (kinesis_a.op(op), kinesis_b.op(op));
        support::faultproxy::OpCounts { requests: x.requests + y.requests, faults: x.faults + y.faults }
    };
    let (reads, puts) = (sum_op("GetRecords"), sum_op("PutRecords"));
    let (ka, kb) = (kinesis_a.counters(), kinesis_b.counters());
    let kc = support::faultproxy::Snapshot {
        partial_calls: ka.partial_calls + kb.partial_calls,
        partial_entries: ka.partial_entries + kb.partial_entries,
        ..ka
    };
    eprintln!("store proxy: {store_faults:?}");
    eprintln!(
        "kinesis proxy: GetRecords {reads:?}; PutRecords {puts:?}, entries failed {} in {} calls; ListShards {:?}",
        kc.partial_entries,
        kc.partial_calls,
        sum_op("ListShards")
    );
    assert!(store_faults.throttled > 0 && store_faults.server_errors > 0, "no store faults: {store_faults:?}");
    assert!(reads.faults > 0, "no GetRecords throttled: {reads:?}");
    assert!(puts.faults > 0 && kc.partial_entries > 0, "no PutRecords entry failed: {puts:?} {kc:?}");
    let sum = |needle: &str| -> usize { logs.iter().map(|l| count_in(l, needle)).sum() };
    let injected = sum("fault injection: failing the first attempt");
    let dup_productions = sum("duplicate production skipped");
    let refused = sum("state write refused");
    // intermediate shards whose reader found ListShards failing when it came to take them
    let listing_failed = logs
        .iter()
        .flat_map(|l| std::fs::read_to_string(l).unwrap_or_default().lines().map(str::to_string).collect::<Vec<_>>())
        .filter(|l| l.contains("hash key range") && l.contains("is unknown") && l.contains(&tally.name))
        .count();
    let per_shard = data_records_per_shard(&tally).await;
    eprintln!(
        "productions failed on their first attempt: {injected}; duplicate productions skipped: {dup_productions}; \
         refused: {refused}; intermediate shards taken while ListShards failed: {listing_failed}; intermediate data records \
         per shard: {per_shard:?}"
    );
    assert!(injected > 0, "no production failed on its first attempt\n{}", cluster.logs());
    assert!(listing_failed > 0, "no intermediate shard was taken while ListShards failed: the outage proved nothing");
    // every production floor `totals` keeps holds within the hash key range of one intermediate
    // shard: a floor read from one shard says nothing of another (a coarse key reads them all)
    let shard_ranges: Vec<KeyRange> = listed
        .iter()
        .map(|d| KeyRange { start: d.starting_hash_key.parse().unwrap(), end: d.ending_hash_key.parse().unwrap() })
        .collect();
    let scope = squall::state::scope(&format!("{}.totals", cluster.topology), "totals");
    let mut floors = 0;
    let mut wide = Vec::new();
    for (key, _, _) in store.scan_scope(&scope).await.unwrap() {
        let pk = format!("{scope}/{key}");
        let item = store.get_many(std::slice::from_ref(&pk)).await.unwrap().remove(&pk).expect("the item");
        let dedup: Dedup = serde_json::from_slice(&item.dedup).expect("deduplication data");
        for (source, p) in &dedup.productions {
            let ranges = p.floors.iter().map(|f| (f.range, f.floor.as_str()));
            let candidates = p.candidates.iter().map(|c| (c.range.unwrap_or(KeyRange::ALL), "candidate"));
            for (r, f) in ranges.chain(candidates) {
                floors += 1;
                if !shard_ranges.iter().any(|s| s.start <= r.start && r.end <= s.end) {
                    wide.push(format!("{key}: source {source}: {f} over {}", r.text()));
                }
            }
        }
    }
    eprintln!(
        "production floors and candidates kept by `totals`: {floors}, wider than an intermediate shard: {wide:?}"
    );
    assert!(wide.is_empty(), "production floors held beyond the intermediate shard they were read from: {wide:#?}");
    // the reshards, in the shard lists
    let listed_a = kinesis::list_shards(&sa.client, &sa.label(), &sa.name).await.unwrap();
    assert_eq!(listed_a.len(), 2 + 2 + 1, "source stream A: a split and a merge: {listed_a:?}");
    assert_eq!(listed.len(), 2 + 2 + 1, "intermediate stream: a split and a merge: {listed:?}");
    // productions went through the children of the split and through the merge's child, which
    // were read (exact totals below then mean they were applied)
    for c in split_children.iter().chain([&merged]) {
        assert!(per_shard.get(c).copied().unwrap_or(0) > 0, "no production in {c}: {per_shard:?}");
        assert!(logs.iter().any(|l| reads_shard(l, &tally.name, c)), "{c} never read");
    }

    // ---- exactly once, in both stages, against both streams' manifests ----
    eprintln!("totals by {by}: {:?} (written {want:?})", got[1]);
    assert_eq!(per_key.values().sum::<u64>(), 4000);
    for ((topology, component, want), got) in stages.iter().zip(&got) {
        let off: Vec<(&String, u64, u64)> = want
            .iter()
            .filter_map(|(k, n)| {
                let g = got.get(k).copied().unwrap_or(0);
                (g != *n).then_some((k, g, *n))
            })
            .collect();
        let extra: Vec<&String> = got.keys().filter(|k| !want.contains_key(*k)).collect();
        assert!(
            off.is_empty() && extra.is_empty(),
            "{topology}/{component}: (key, counted, written) differ: {off:?}; unknown keys {extra:?}\n{}",
            cluster.logs()
        );
    }
    assert!(dup_productions > 0, "no production was recognized as already applied\n{}", cluster.logs());
    eprintln!("total run {:.1} s", t0.elapsed().as_secs_f64());
    for p in [&mut a, &mut b] {
        p.stop(Duration::from_secs(15));
    }
    tally.delete().await;
    sa.delete().await;
    sb.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stages_over_two_streams_count_exactly_through_source_and_intermediate_reshards_and_throttling() {
    two_stages_through_reshards_and_throttling("key").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regional_totals_over_two_streams_count_exactly_through_source_and_intermediate_reshards_and_throttling() {
    two_stages_through_reshards_and_throttling("region").await;
}

/// Whether a worker log says it reads a shard of the intermediate stream `tally`.
fn reads_tally(log: &Path, tally: &str) -> bool {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .any(|l| l.contains("reading shard") && l.contains(&format!("stream={tally}")))
}
