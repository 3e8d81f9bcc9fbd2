//! Exactly-once windows fired once, where the window firer meets two other features, against
//! kinesis-local, ZooKeeper and dynalite, with workers of
//! `examples/exactly_once_counts.rs --window-ms 1000 --fire-to RESULTS`:
//! - a timer index that is eventually consistent, as DynamoDB's global secondary indexes are
//!   (dynalite's is not: a fault proxy keeps listing index entries for a while after the index
//!   lost them): a window whose firing was delivered and whose timer was taken out of the index
//!   must not fire again when a stale index read still lists it;
//! - several input streams: one key's windows count records of both, so a window fires only
//!   once the committed watermark of every stream passed its end (the minimum), even while one
//!   stream's records wait for a replay;
//! - a firer that joins while another's firings are in flight: it leaves them to that firer (no
//!   window put twice);
//! - a worker whose clock runs ahead of the Kinesis service's: an idle shard's watermark (the
//!   time of its last caught-up read minus the idle timeout) is taken on the service's clock as
//!   far as the worker knows it, so records stamped by the service after an idle spell are not
//!   late.

use squall_test_support as support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use support::TestStream;
use support::faultproxy::{FaultPlan, FaultProxy};
use support::reliability::spawn_producer;
use support::state::{count_in, start_counts, start_counts_with_env, wait_reading};
use support::workers::{Cluster, scratch};

const WINDOW_MS: u64 = 1000;

/// Waits (60 s at most) until every window of `truth` fired; the results then.
async fn wait_fired(results: &TestStream, truth: &BTreeMap<String, u64>) -> BTreeMap<String, Vec<u64>> {
    let start = Instant::now();
    loop {
        let got = support::state::fired_windows(results).await;
        if truth.keys().all(|k| got.contains_key(k)) || start.elapsed() > Duration::from_secs(60) {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_fires_once_when_a_stale_timer_index_still_lists_it() {
    let s = TestStream::create("eo-stale-index", 2).await;
    let results = TestStream::create("eo-stale-fired", 1).await;
    let dir = scratch("eo-stale-index");
    let cluster = Cluster::with_spout_config(
        &s.name,
        &dir,
        serde_json::json!({ "checkpoint_interval_ms": 200, "committed_watermark_interval_ms": 300 }),
    );
    let table = support::unique_name("eo-stale-index");
    // the workers reach the store through a proxy whose index answers lag 4 s behind the items
    let proxy = FaultProxy::start(&support::state_endpoint(), FaultPlan::default()).await;
    proxy.stale_index(Duration::from_secs(4));
    let url = proxy.url();
    let fire = ["--window-ms", "1000", "--fire-to", results.name.as_str()];
    let mut a = start_counts(&cluster, "a", &url, &table, &fire);
    let mut b = start_counts(&cluster, "b", &url, &table, &fire);
    wait_reading(&a, &cluster).await;
    let manifest = spawn_producer(&s.client, &s.label(), &s.name, 1500, 15, 200.0).await.unwrap();
    let truth = support::state::window_truth(&s, WINDOW_MS).await;
    assert_eq!(truth.values().sum::<u64>(), manifest.total);
    let got = wait_fired(&results, &truth).await;
    // the stale reads went on for a while after the last window fired
    tokio::time::sleep(Duration::from_secs(5)).await;
    let got_after = support::state::fired_windows(&results).await;
    let stale = proxy.stale_items();
    eprintln!("index entries listed after the index lost them: {stale}; {} windows", truth.len());
    assert!(stale > 0, "the proxy served no stale index entry: the fault did not happen");
    let exact: BTreeMap<String, u64> = got.iter().map(|(k, c)| (k.clone(), c[0])).collect();
    assert_eq!(exact, truth, "fired windows and their counts\n{}", cluster.logs());
    let twice: Vec<(&String, &Vec<u64>)> = got_after.iter().filter(|(_, c)| c.len() > 1).collect();
    assert!(
        twice.is_empty(),
        "{} of {} windows fired more than once (stale index entries fired again): {:?}",
        twice.len(),
        truth.len(),
        twice.iter().take(5).collect::<Vec<_>>()
    );
    for p in [&mut a, &mut b] {
        p.stop(Duration::from_secs(15));
    }
    s.delete().await;
    results.delete().await;
}

/// A firer that joins while another firer's firings are in flight (a proxy holds every put to
/// the results stream 1.5 s) leaves them to it: no window is put twice. (The other firer's share
/// halves when this one registers; the keys it froze and has in flight land in the newcomer's
/// partitions.) Asserted first: the newcomer found keys frozen by the other and in flight
/// (`fire_in_flight_elsewhere`), so the race happened. The state store answers in 600 ms, as a
/// loaded one does (CI runs' did): no firing may time out for the time its firer spent reading
/// and freezing before emitting it (before the engine counted a timeout from its emit, with
/// 250 ms 71 of 135 firings timed out and 32 windows were put twice), and a firing in flight at
/// a live firer for longer than the timeout since its freeze is still left to it (before the
/// item recorded who froze it, 37 of 120 windows were put twice, no firing failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_firer_joining_while_firings_are_in_flight_puts_no_window_twice() {
    let s = TestStream::create("eo-join", 2).await;
    let results = TestStream::create("eo-join-fired", 1).await;
    let dir = scratch("eo-join");
    let cluster = Cluster::with_spout_config(
        &s.name,
        &dir,
        serde_json::json!({ "checkpoint_interval_ms": 200, "committed_watermark_interval_ms": 300 }),
    );
    let table = support::unique_name("eo-join");
    let plan =
        FaultPlan { latency: 1.0, latency_ms: 1500, only_ops: vec!["PutRecords".into()], ..FaultPlan::default() };
    let proxy = FaultProxy::start(&support::kinesis_endpoint().endpoint, plan).await;
    let endpoint = proxy.url();
    // and the state store answers in 600 ms (a loaded dynalite): a firer's round of reads and
    // freezes takes longer than the 10 s timeout, which must not count against its firings, nor
    // make the other firer take them for lost
    let slow = FaultPlan { latency: 1.0, latency_ms: 600, ..FaultPlan::default() };
    let state = FaultProxy::start(&support::state_endpoint(), slow).await;
    let url = state.url();
    let args = ["--window-ms", "1000", "--fire-to", results.name.as_str(), "--endpoint", endpoint.as_str()];
    let mut a = start_counts(&cluster, "a", &url, &table, &args);
    wait_reading(&a, &cluster).await;
    let producer = spawn_producer(&s.client, &s.label(), &s.name, 1500, 15, 200.0);
    // a fires (its puts held 1.5 s each) before b joins
    let start = Instant::now();
    while support::state::fired_windows(&results).await.len() < 3 {
        assert!(start.elapsed() < Duration::from_secs(60), "a fired nothing in 60 s\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut b = start_counts(&cluster, "b", &url, &table, &args);
    let manifest = producer.await.unwrap();
    let truth = support::state::window_truth(&s, WINDOW_MS).await;
    assert_eq!(truth.values().sum::<u64>(), manifest.total);
    let got = wait_fired(&results, &truth).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let got_after = support::state::fired_windows(&results).await;
    let counter = |name: &str| -> u64 {
        let (_, out, _) = support::ops::squall_run(&cluster, &["status", &cluster.topology, "--json"]);
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_default();
        v["workers"]
            .as_array()
            .map(|ws| ws.iter().map(|w| w["components"]["fire"]["counters"][name].as_u64().unwrap_or(0)).sum())
            .unwrap_or(0)
    };
    // the workers publish their counters when they change, every 2 s at most
    let start = Instant::now();
    let mut elsewhere = counter("fire_in_flight_elsewhere");
    while elsewhere == 0 && start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        elsewhere = counter("fire_in_flight_elsewhere");
    }
    let (failed, twice): (u64, Vec<(&String, &Vec<u64>)>) =
        (counter("fire_failed"), got_after.iter().filter(|(_, c)| c.len() > 1).collect());
    eprintln!(
        "firer joining: {} windows; keys left to the other firer {elsewhere}; firings failed {failed}; put twice {}",
        truth.len(),
        twice.len()
    );
    assert!(elsewhere > 0, "the joining firer never met a firing in flight at the other: the race did not happen");
    let exact: BTreeMap<String, u64> = got.iter().map(|(k, c)| (k.clone(), c[0])).collect();
    assert_eq!(exact, truth, "fired windows and their counts\n{}", cluster.logs());
    assert_eq!(
        failed,
        0,
        "a firing failed or timed out (put again by design): the run says nothing\n{}",
        cluster.logs()
    );
    assert!(
        twice.is_empty(),
        "{} of {} windows put twice after a firer joined: {:?}",
        twice.len(),
        truth.len(),
        twice.iter().take(5).collect::<Vec<_>>()
    );
    for p in [&mut a, &mut b] {
        p.stop(Duration::from_secs(15));
    }
    s.delete().await;
    results.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_over_two_streams_wait_for_the_committed_watermark_of_both() {
    let a = TestStream::create("eo-fire-two-a", 2).await;
    let b = TestStream::create("eo-fire-two-b", 2).await;
    let results = TestStream::create("eo-fire-two-fired", 1).await;
    let dir = scratch("eo-fire-two");
    // a failed record waits 2.5-5 s for its replay: its stream's committed watermark holds there
    let cluster = Cluster::with_spout_config(
        &a.name,
        &dir,
        serde_json::json!({
            "checkpoint_interval_ms": 200,
            "committed_watermark_interval_ms": 300,
            "retry": { "replay_min_backoff_ms": 5000, "replay_max_backoff_ms": 5000 }
        }),
    );
    let table = support::unique_name("eo-fire-two");
    let url = support::state_endpoint();
    // the first attempt of ~20% of stream b's records fails
    let fail = format!("{}:20", b.name);
    let flags = ["--window-ms", "1000", "--fire-to", results.name.as_str(), "--stream", b.name.as_str()];
    let flags: Vec<&str> = flags.iter().copied().chain(["--fail-stream-percent", fail.as_str()]).collect();
    let mut w1 = start_counts(&cluster, "w1", &url, &table, &flags);
    let mut w2 = start_counts(&cluster, "w2", &url, &table, &flags);
    wait_reading(&w1, &cluster).await;
    // the same keys in both streams
    let pa = spawn_producer(&a.client, &a.label(), &a.name, 1200, 10, 150.0);
    let pb = spawn_producer(&b.client, &b.label(), &b.name, 1200, 10, 150.0);
    let (ma, mb) = (pa.await.unwrap(), pb.await.unwrap());
    let mut truth = support::state::window_truth(&a, WINDOW_MS).await;
    for (k, n) in support::state::window_truth(&b, WINDOW_MS).await {
        *truth.entry(k).or_default() += n;
    }
    assert_eq!(truth.values().sum::<u64>(), ma.total + mb.total);
    let got = wait_fired(&results, &truth).await;
    let injected: usize =
        [&w1, &w2].iter().map(|w| count_in(&w.log, "fault injection: failing the first attempt")).sum();
    let late: usize = [&w1, &w2].iter().map(|w| count_in(&w.log, "late input: key")).sum();
    eprintln!("failures injected into stream b: {injected}; late inputs: {late}; windows: {}", truth.len());
    assert!(injected > 20, "too few failures injected into stream b ({injected}): the fault did not happen");
    let exact: BTreeMap<String, u64> = got.iter().map(|(k, c)| (k.clone(), c[0])).collect();
    let short: Vec<(&String, u64, u64)> =
        truth.iter().filter_map(|(k, n)| exact.get(k).filter(|g| *g != n).map(|g| (k, *g, *n))).collect();
    assert_eq!(late, 0, "{late} inputs arrived after their window fired; windows short (key, fired, true): {short:?}");
    assert_eq!(exact, truth, "fired windows and their counts over both streams\n{}", cluster.logs());
    for p in [&mut w1, &mut w2] {
        p.stop(Duration::from_secs(15));
    }
    a.delete().await;
    b.delete().await;
    results.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_after_idle_spells_are_not_late_when_the_workers_clock_runs_ahead() {
    let s = TestStream::create("eo-fire-skew", 2).await;
    let results = TestStream::create("eo-fire-skew-fired", 1).await;
    let dir = scratch("eo-fire-skew");
    let cluster = Cluster::with_spout_config(
        &s.name,
        &dir,
        serde_json::json!({
            "checkpoint_interval_ms": 200,
            "committed_watermark_interval_ms": 300,
            "watermark_idle_timeout_ms": 1500
        }),
    );
    let table = support::unique_name("eo-fire-skew");
    let url = support::state_endpoint();
    let fire = ["--window-ms", "1000", "--fire-to", results.name.as_str()];
    // both workers' clocks run 10 s ahead of the Kinesis engine's
    let ahead = [(squall::coord::CLOCK_OFFSET_ENV, "10000")];
    let mut a = start_counts_with_env(&cluster, "a", &url, &table, &fire, &ahead);
    let mut b = start_counts_with_env(&cluster, "b", &url, &table, &fire, &ahead);
    wait_reading(&a, &cluster).await;
    // bursts separated by idle spells longer than the idle timeout: every shard goes idle
    let mut total = 0;
    for _ in 0..4 {
        total += spawn_producer(&s.client, &s.label(), &s.name, 200, 10, 150.0).await.unwrap().total;
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let truth = support::state::window_truth(&s, WINDOW_MS).await;
    assert_eq!(truth.values().sum::<u64>(), total);
    let got = wait_fired(&results, &truth).await;
    let shifted: usize = [&a, &b].iter().map(|w| count_in(&w.log, "SQUALL_CLOCK_OFFSET_MS")).sum();
    assert!(shifted > 0, "the workers' clocks were not shifted: the fault did not happen\n{}", cluster.logs());
    let late: usize = [&a, &b].iter().map(|w| count_in(&w.log, "late input: key")).sum();
    let exact: BTreeMap<String, u64> = got.iter().map(|(k, c)| (k.clone(), c[0])).collect();
    let short: Vec<(&String, u64, u64)> =
        truth.iter().filter_map(|(k, n)| exact.get(k).filter(|g| *g != n).map(|g| (k, *g, *n))).collect();
    eprintln!("late inputs: {late}; windows: {}; short: {}", truth.len(), short.len());
    assert_eq!(late, 0, "{late} inputs arrived after their window fired; windows short (key, fired, true): {short:?}");
    assert_eq!(exact, truth, "fired windows and their counts\n{}", cluster.logs());
    for p in [&mut a, &mut b] {
        p.stop(Duration::from_secs(15));
    }
    s.delete().await;
    results.delete().await;
}
