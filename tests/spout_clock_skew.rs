//! Start positions when the worker's wall clock runs ahead of the Kinesis service's: the worker
//! runs with an injected offset on its clock (`SQUALL_CLOCK_OFFSET_MS`), kinesis-local on this
//! machine's.
//! - LATEST is persisted as the first start's time as the service's clock has it: nothing written
//!   after the first start is skipped (a worker ahead by 60 s would otherwise skip the first
//!   minute), nothing written a while before it is read.
//! - An AT_TIMESTAMP later than the service's clock is refused by Kinesis ("Timestamp cannot be in
//!   the future"): the reader retries it (logged, counted) until the service's clock passes the
//!   timestamp and then reads exactly the records that arrived at or after it; never classed as an
//!   error only an operator can fix. By polling (kinesis-local refuses GetShardIterator) and by
//!   enhanced fan-out (SubscribeToShard; a proxy adds the refusal AWS makes and kinesis-local does
//!   not).

use squall_test_support as support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use aws_sdk_kinesis::types::ShardIteratorType;
use squall::coord::{CLOCK_OFFSET_ENV, Checkpoint, CheckpointPosition};
use squall::kinesis::{self, PutOptions};
use support::TestStream;
use support::clockproxy::ClockProxy;
use support::workers::{Cluster, read_deliveries, scratch};

fn wall_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

async fn put(s: &TestStream, count: u64) -> squall::kinesis::payload::Manifest {
    let opts = PutOptions { count, keys: 20, ..PutOptions::default() };
    kinesis::put_records(&s.client, &s.label(), &s.name, &opts).await.expect("put").manifest
}

/// Every record of the stream: (shard, sequence) -> arrival time (the service's clock, ms).
async fn stored(s: &TestStream) -> BTreeMap<(String, String), i64> {
    let mut out = BTreeMap::new();
    for shard in kinesis::list_shards(&s.client, &s.label(), &s.name).await.unwrap() {
        let it = s
            .client
            .get_shard_iterator()
            .stream_name(&s.name)
            .shard_id(&shard.shard_id)
            .shard_iterator_type(ShardIteratorType::TrimHorizon)
            .send()
            .await
            .unwrap();
        let mut it = it.shard_iterator;
        while let Some(i) = it {
            let r = s.client.get_records().shard_iterator(i).send().await.unwrap();
            for rec in r.records() {
                // Rounded: the SDK reads the JSON number through an f64, and `to_millis` (which
                // truncates) then says 1 ms early about half the time.
                let at =
                    rec.approximate_arrival_timestamp().map_or(0, |t| (t.as_nanos() + 500_000).div_euclid(1_000_000));
                out.insert((shard.shard_id.clone(), rec.sequence_number().to_string()), at as i64);
            }
            if r.records().is_empty() && r.millis_behind_latest().unwrap_or(0) == 0 {
                break;
            }
            it = r.next_shard_iterator;
        }
    }
    out
}

/// How far the Kinesis engine's clock is ahead of this machine's (ms): one record put, its
/// arrival time read back. kinesis-local's clock does not follow steps of the system clock
/// (ARCHITECTURE.md, Starting positions): on a machine whose clock was set after the engine
/// started, the two differ.
async fn engine_offset_ms(s: &TestStream) -> i64 {
    let before = wall_ms();
    put(s, 1).await;
    let after = wall_ms();
    let arrival = stored(s).await.into_values().max().expect("the probe record");
    arrival - (before + after) / 2
}

/// Deliveries so far: (shard, sequence) -> times delivered.
fn delivered(cluster: &Cluster) -> BTreeMap<(String, String), usize> {
    let mut out = BTreeMap::new();
    for d in read_deliveries(&cluster.delivery_files()) {
        *out.entry((d.shard, d.sequence)).or_default() += 1;
    }
    out
}

async fn checkpoints(zk: &zookeeper_client::Client, cluster: &Cluster) -> Vec<(String, Checkpoint)> {
    let dir = format!("{}/checkpoints", cluster.stream_path());
    let mut out = Vec::new();
    for n in zk.list_children(&dir).await.unwrap_or_default() {
        if let Ok((data, _)) = zk.get_data(&format!("{dir}/{n}")).await {
            out.push((n, serde_json::from_slice(&data).unwrap()));
        }
    }
    out
}

/// LATEST with the worker's clock `offset_ms` ahead of the service's.
async fn latest_with_the_clock_ahead(offset_ms: i64) {
    let s = TestStream::create("skew-latest", 2).await;
    let old = put(&s, 100).await;
    // The service's clock is read from its answers' Date header (1 s resolution): records put
    // more than a second before the first start are not read.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let dir = scratch("skew-latest");
    let mut cluster = Cluster::new(&s.name, &dir);
    cluster.initial_position = "latest".into();
    let offset = offset_ms.to_string();
    let mut w = cluster.start_with_env("w", 2, &[], &[(CLOCK_OFFSET_ENV, &offset)]);
    let zk = support::zk_client().await;
    let started = Instant::now();
    let cps = loop {
        let cps = checkpoints(&zk, &cluster).await;
        if cps.len() == 2 {
            break cps;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "checkpoints never initialized\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The fault: the worker's clock is ahead (it says so at start).
    assert!(
        cluster.logs().contains(&format!("shifted by {offset_ms} ms")),
        "the worker runs with its clock {offset_ms} ms ahead\n{}",
        cluster.logs()
    );
    let new = put(&s, 200).await;
    let report = cluster.wait_delivered(std::slice::from_ref(&new), Duration::from_secs(30)).await;
    assert_eq!(
        report.lost,
        0,
        "records written after the first start were skipped (worker clock {offset_ms} ms ahead): {report:?}\n{}",
        cluster.logs()
    );
    assert_eq!(report.duplicates, 0, "{report:?}");
    assert_eq!(cluster.audit(std::slice::from_ref(&old)).distinct, 0, "records from before the first start were read");
    // The start position is the service's time of the first start, not the worker's.
    for (shard, cp) in &cps {
        let CheckpointPosition::AtTimestamp { millis } = cp.position else {
            panic!("LATEST is persisted as a timestamp: {shard} {cp:?}")
        };
        assert!(
            cp.updated_at_ms - millis >= offset_ms - 2_000,
            "{shard}: persisted AT_TIMESTAMP {millis}, written at {} by the worker's clock",
            cp.updated_at_ms
        );
    }
    assert_eq!(
        support::ops::log_lines(&cluster, &["ahead of the Kinesis service's clock", "LATEST persisted as"]).len(),
        1,
        "the skew is reported once, when LATEST is persisted\n{}",
        cluster.logs()
    );
    assert!(
        !cluster.logs().contains("Timestamp cannot be in the future"),
        "the persisted LATEST is never ahead of the service's clock\n{}",
        cluster.logs()
    );
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0));
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_with_the_worker_clock_5s_ahead_skips_nothing_written_after_the_first_start() {
    latest_with_the_clock_ahead(5_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_with_the_worker_clock_60s_ahead_skips_nothing_written_after_the_first_start() {
    latest_with_the_clock_ahead(60_000).await;
}

/// AT_TIMESTAMP `offset_ms` ahead of the service's clock (taken on the worker, whose clock runs
/// that far ahead), read by polling or, through `ClockProxy`, by enhanced fan-out.
async fn at_timestamp_ahead_of_the_service(offset_ms: i64, efo: bool) {
    let s = TestStream::create("skew-atts", 2).await;
    let dir = scratch("skew-atts");
    let mut cluster = Cluster::new(&s.name, &dir);
    let engine = engine_offset_ms(&s).await;
    let t = wall_ms() + engine + offset_ms;
    cluster.initial_position = format!("at-timestamp:{t}");
    // Records arrive from before the start until 3 s after the timestamp (the engine's clock).
    let producer = {
        let (client, label, name) = (s.client.clone(), s.label(), s.name.clone());
        tokio::spawn(async move {
            while wall_ms() + engine < t + 3_000 {
                let opts = PutOptions { count: 10, keys: 20, ..PutOptions::default() };
                kinesis::put_records(&client, &label, &name, &opts).await.expect("put");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let proxy = match efo {
        true => {
            let upstream = support::kinesis_endpoint().endpoint;
            Some(ClockProxy::start(upstream.trim_start_matches("http://"), engine).await)
        }
        false => None,
    };
    let consumer = format!("efo:{}-app", s.name);
    let mut extra: Vec<&str> = Vec::new();
    if let Some(p) = &proxy {
        extra.extend(["--consumer", consumer.as_str(), "--endpoint", p.url.as_str()]);
    }
    let offset = offset_ms.to_string();
    let mut w = cluster.start_with_env("w", 2, &extra, &[(CLOCK_OFFSET_ENV, &offset)]);

    // The fault: Kinesis refused the timestamp as later than its clock.
    let seen = Instant::now();
    while !cluster.logs().contains("Timestamp cannot be in the future") {
        assert!(
            seen.elapsed() < Duration::from_secs(20),
            "Kinesis never refused AT_TIMESTAMP {t} ({offset_ms} ms ahead)\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if let Some(p) = &proxy {
        assert!(p.refused() > 0, "SubscribeToShard was refused");
    }
    producer.await.unwrap();
    let all = stored(&s).await;
    let want: BTreeSet<(String, String)> = all.iter().filter(|(_, at)| **at >= t).map(|(k, _)| k.clone()).collect();
    let before = all.len() - want.len();
    assert!(!want.is_empty() && before > 0, "records on both sides of {t}: {} after, {before} before", want.len());
    // Nothing at or after the timestamp is lost once the service's clock passed it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let missing = loop {
        let got = delivered(&cluster);
        let missing: Vec<_> = want.iter().filter(|k| !got.contains_key(*k)).collect();
        if missing.is_empty() || Instant::now() > deadline {
            break missing.len();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(
        missing,
        0,
        "{missing} of {} records at or after AT_TIMESTAMP {t} ({offset_ms} ms ahead of the service at the start) \
         not delivered 20 s after the producer stopped\n{}",
        want.len(),
        cluster.logs()
    );
    let got = delivered(&cluster);
    let early: Vec<_> = got.keys().filter(|k| !want.contains(*k)).collect();
    assert!(early.is_empty(), "{} records from before {t} delivered: {early:?}", early.len());
    assert!(got.values().all(|n| *n == 1), "duplicates");
    let logs = support::ops::log_lines(&cluster, &["retrying cannot fix it"]);
    assert!(
        logs.is_empty(),
        "a timestamp ahead of the service's clock fixes itself; not an operator's error: {logs:?}"
    );
    assert!(
        !support::ops::log_lines(&cluster, &["ahead of the Kinesis service's clock"]).is_empty(),
        "the refusal is logged with its likely cause\n{}",
        cluster.logs()
    );
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0));
    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_timestamp_5s_ahead_of_the_service_clock_is_retried_until_it_passes() {
    at_timestamp_ahead_of_the_service(5_000, false).await;
}

/// The 5 s case in a minute's wait (`make soak`; `make test` runs the 5 s ones).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "soak: make soak"]
async fn at_timestamp_60s_ahead_of_the_service_clock_is_retried_until_it_passes() {
    at_timestamp_ahead_of_the_service(60_000, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_timestamp_ahead_of_the_service_clock_with_enhanced_fan_out_is_retried_until_it_passes() {
    at_timestamp_ahead_of_the_service(10_000, true).await;
}
