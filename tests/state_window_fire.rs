//! Exactly-once windows fired downstream, against kinesis-local, ZooKeeper and dynalite: workers
//! of `examples/exactly_once_counts.rs --window-ms 1000 --fire-to RESULTS` count records per key
//! and 1 s window of arrival time in DynamoDB, and a `WindowFirer` spout in each worker fires
//! each window once the stream's committed watermark (from ZooKeeper) passes its end, putting
//! its final count to a results stream. Meanwhile the worker that fires aborts right after a
//! commit, one worker is SIGSTOPped past its ZooKeeper session and resumed (its late writes must
//! be refused), one is SIGKILLed, the store throttles and answers 500s (fault proxy), and the
//! input stream is split and merged. At the end, the results stream, deduplicated by `fire_key`,
//! must hold every window of the input stream with its true count: none missing, none fired
//! early (a window fired before all its records were committed would freeze a smaller count, and
//! its later records would be late), none with another count. In steady state, a planted key
//! whose stored state no state type reads must be reported once (log, `fire_errors`) and never
//! fired, while every other window fires.

use squall_test_support as support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use squall::kinesis;
use squall::state::{TimerAt, WriteOutcome, timer_partition};
use support::TestStream;
use support::faultproxy::{FaultPlan, FaultProxy};
use support::reliability::spawn_producer;
use support::state::{abort_then_start_zombie, count_in, start_counts, wait_reading};
use support::workers::{Cluster, scratch};

const WINDOW_MS: u64 = 1000;

/// The fired windows in the results stream: `fire_key` -> the counts it was fired with (more
/// than one entry: the same window put more than once), and per window the time from its end to
/// the arrival of its first result in the results stream (ms).
async fn fired(results: &TestStream) -> (BTreeMap<String, Vec<u64>>, BTreeMap<String, i64>) {
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut delay = BTreeMap::new();
    for r in support::stages::read_records(results).await {
        let v: serde_json::Value = serde_json::from_slice(r.data().as_ref()).expect("a fired window is JSON");
        let key = v["fire_key"].as_str().expect("fire_key").to_string();
        let (k, start) = (v["key"].as_str().unwrap(), v["window_start"].as_i64().unwrap());
        assert_eq!(key, format!("{k}@{start}"), "fire_key names the key and its window: {v}");
        assert_eq!(v["fire_at"].as_i64().unwrap(), start + WINDOW_MS as i64, "a window fires at its end: {v}");
        let arrived = r.approximate_arrival_timestamp().and_then(|t| t.to_millis().ok()).unwrap_or(0);
        delay.entry(key.clone()).or_insert(arrived - v["fire_at"].as_i64().unwrap());
        out.entry(key).or_default().push(v["count"].as_u64().expect("count"));
    }
    (out, delay)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_fire_once_with_exact_counts_after_abort_zombie_sigkill_store_faults_split_and_merge() {
    let t0 = Instant::now();
    let mark = |what: &str| eprintln!("[{:>6.1} s] {what}", t0.elapsed().as_secs_f64());
    let s = TestStream::create("eo-fire", 2).await;
    let results = TestStream::create("eo-fired", 1).await;
    let dir = scratch("eo-fire");
    let cluster = Cluster::with_spout_config(
        &s.name,
        &dir,
        serde_json::json!({ "checkpoint_interval_ms": 200, "committed_watermark_interval_ms": 300 }),
    );
    let table = support::unique_name("eo-fire");
    let proxy = FaultProxy::start(
        &support::state_endpoint(),
        FaultPlan { throttle: 0.03, server_error: 0.03, max_faults: 200, ..FaultPlan::default() },
    )
    .await;
    let url = proxy.url();
    let store = support::state::open(&support::state_endpoint(), &table).await;
    let fire = ["--window-ms", "1000", "--fire-to", results.name.as_str()];

    let producer = spawn_producer(&s.client, &s.label(), &s.name, 3000, 20, 250.0);
    // 1. b, alone (it reads every shard and fires every partition), aborts right after its 20th
    //    written commit, before acking its inputs; a (to be frozen) and c start
    let (_b, mut a, mut c) = abort_then_start_zombie(&cluster, &url, &table, &fire, "20").await;
    mark("b aborted after a written commit; a holds uncommitted inputs");

    // 2. split, 3. a zombie past its session (4 s)
    let first = kinesis::list_shards(&s.client, &s.label(), &s.name).await.unwrap()[0].shard_id.clone();
    kinesis::split_shard(&s.client, &s.label(), &s.name, &first).await.unwrap();
    mark(&format!("split {first}"));
    a.pause();
    mark("SIGSTOP a");
    tokio::time::sleep(Duration::from_secs(8)).await;
    a.resume();
    mark("SIGCONT a");
    // 4. SIGKILL c, start a replacement; 5. merge
    c.kill();
    mark("SIGKILL c");
    let mut c2 = start_counts(&cluster, "c2", &url, &table, &fire);
    let (x, y) = support::ops::adjacent_open(&s).await.expect("two adjacent open shards");
    kinesis::merge_shards(&s.client, &s.label(), &s.name, &x, &y).await.unwrap();
    mark(&format!("merge {x} + {y}"));
    let manifest = producer.await.unwrap();
    mark(&format!("producer done: {} records", manifest.total));

    let truth = support::state::window_truth(&s, WINDOW_MS).await;
    assert_eq!(truth.values().sum::<u64>(), 3000, "the stream holds every record put");
    // every window fires once the watermark passes its end (idle shards: after the idle timeout)
    let start = Instant::now();
    let (got, delay) = loop {
        let (got, delay) = fired(&results).await;
        if truth.keys().all(|k| got.contains_key(k)) || start.elapsed() > Duration::from_secs(120) {
            break (got, delay);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    mark(&format!("{} of {} windows fired (or timed out)", got.len(), truth.len()));

    // ---- the faults really happened ----
    let faults = proxy.counters();
    eprintln!("store proxy: {faults:?}");
    assert!(faults.throttled > 0 && faults.server_errors > 0, "no store faults injected: {faults:?}");
    let refused = support::state::wait_refused(&a).await;
    assert!(refused > 0, "the zombie's late writes were not refused\n{}", a.log_text());
    let listed = kinesis::list_shards(&s.client, &s.label(), &s.name).await.unwrap();
    assert_eq!(listed.len(), 2 + 2 + 1, "the split and the merge not seen in the shard list: {listed:?}");

    // ---- every window fired, with its exact count, and never with another ----
    let logs = ["a", "b", "c", "c2"].map(|n| dir.join(format!("{n}.log")));
    let late: usize = logs.iter().map(|l| count_in(l, "late input")).sum();
    let put_twice = got.values().filter(|v| v.len() > 1).count();
    eprintln!(
        "{} windows over 20 keys; refused {refused}; windows put more than once {put_twice}; late inputs {late}",
        truth.len()
    );
    let missing: Vec<_> = truth.keys().filter(|k| !got.contains_key(*k)).take(10).collect();
    let wrong: Vec<_> = truth
        .iter()
        .filter_map(|(k, n)| got.get(k).filter(|c| c.iter().any(|c| c != n)).map(|c| (k, *n, c.clone())))
        .take(10)
        .collect();
    let unknown: Vec<_> = got.keys().filter(|k| !truth.contains_key(*k)).take(10).collect();
    assert!(
        missing.is_empty() && wrong.is_empty() && unknown.is_empty(),
        "fired windows differ from the stream: missing {missing:?}; (window, true, fired) {wrong:?}; unknown \
         {unknown:?}\n{}",
        cluster.logs()
    );
    assert_eq!(late, 0, "inputs arrived after their window fired\n{}", cluster.logs());
    assert!(truth.len() > 20, "records spread over several windows per key: {}", truth.len());
    let mut d: Vec<i64> = delay.values().copied().collect();
    d.sort_unstable();
    eprintln!(
        "window end -> result in the results stream: median {} ms, p90 {} ms, max {} ms",
        d[d.len() / 2],
        d[d.len() * 9 / 10],
        d[d.len() - 1]
    );
    // the table agrees, and every fired window's timer was confirmed (taken out of the index)
    let counted = support::state::counts(&support::state::items(&store, &cluster.topology).await);
    assert_eq!(counted, truth, "the table's window counts");
    let scope = squall::state::scope(&cluster.topology, support::state::COMPONENT);
    let start = Instant::now();
    let pending = loop {
        let mut pending = 0;
        for n in 0..8 {
            pending += store.due_timers(&format!("{scope}#{n}"), i64::MAX, 10_000).await.unwrap().len();
        }
        if pending == 0 || start.elapsed() > Duration::from_secs(30) {
            break pending;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(pending, 0, "timers left in the index after every window fired and was put");
    for p in [&mut a, &mut c2] {
        p.stop(Duration::from_secs(15));
    }
    s.delete().await;
    results.delete().await;
}

/// Without faults: two workers, every window fires with its exact count; prints how long after
/// its end each window's result reached the results stream (the figure ARCHITECTURE.md quotes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_fire_soon_after_their_end_in_steady_state() {
    let t0 = Instant::now();
    let s = TestStream::create("eo-fire-steady", 2).await;
    let results = TestStream::create("eo-fired-steady", 1).await;
    let dir = scratch("eo-fire-steady");
    let cluster = Cluster::with_spout_config(
        &s.name,
        &dir,
        serde_json::json!({ "checkpoint_interval_ms": 200, "committed_watermark_interval_ms": 300 }),
    );
    let table = support::unique_name("eo-fire-steady");
    let url = support::state_endpoint();
    let fire = ["--window-ms", "1000", "--fire-to", results.name.as_str()];
    let mut a = start_counts(&cluster, "a", &url, &table, &fire);
    let mut b = start_counts(&cluster, "b", &url, &table, &fire);
    wait_reading(&a, &cluster).await;
    // a key of the windows whose stored state no state type reads, with a timer due at once:
    // it must be reported (logged, counted) and never fired, and must not hold back the others
    let scope = squall::state::scope(&cluster.topology, support::state::COMPONENT);
    let corrupt = "corrupt@0";
    let timer = TimerAt { partition: timer_partition(&scope, corrupt, 8), fire_at: 1 };
    let store = support::state::open(&url, &table).await;
    let planted = store
        .put(&format!("{scope}/{corrupt}"), &scope, corrupt, None, b"not json".to_vec(), b"{}".to_vec(), Some(&timer))
        .await
        .expect("plant an unreadable key");
    assert_eq!(planted, WriteOutcome::Written);
    let manifest = spawn_producer(&s.client, &s.label(), &s.name, 2000, 20, 250.0).await.unwrap();
    let truth = support::state::window_truth(&s, WINDOW_MS).await;
    assert_eq!(truth.values().sum::<u64>(), manifest.total);
    let start = Instant::now();
    let (got, delay) = loop {
        let (got, delay) = fired(&results).await;
        if truth.keys().all(|k| got.contains_key(k)) || start.elapsed() > Duration::from_secs(60) {
            break (got, delay);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let exact: BTreeMap<String, u64> = got.iter().map(|(k, c)| (k.clone(), c[0])).collect();
    assert_eq!(exact, truth, "fired windows and their counts\n{}", cluster.logs());
    assert!(got.values().all(|c| c.iter().all(|n| *n == c[0])), "a window fired with two counts: {got:?}");
    // the unreadable key: reported once by the firer that owns its partition, never fired
    let reports: usize = [&a, &b]
        .iter()
        .map(|p| count_in(&p.log, &format!("timer of key `{corrupt}` in table `{table}` cannot fire")))
        .sum();
    assert_eq!(reports, 1, "the unreadable key is logged once, naming it and the table\n{}", cluster.logs());
    assert!(!got.contains_key(corrupt), "a key whose state does not read was fired");
    // the firers read the committed watermark the leader publishes (one znode, not every report)
    let zk = support::zk_client().await;
    let published = support::ops::znode_json(&zk, &format!("{}/committed", cluster.stream_path())).await;
    assert!(
        published.as_ref().is_some_and(|p| p["watermark_ms"].as_i64().is_some()),
        "the leader publishes the committed watermark while firers run: {published:?}"
    );
    // `squall status` shows the stream's committed watermark
    let (code, out, err) = support::ops::squall_run(&cluster, &["status", &cluster.topology]);
    assert_eq!(code, 0, "squall status: {err}");
    let line = out.lines().find(|l| l.trim_start().starts_with("committed watermark")).unwrap_or_default();
    assert!(line.contains(" behind)"), "status shows the committed watermark and its lag: {line:?}\n{out}");
    // both workers' firers fired: the timer partitions are shared (read from the workers'
    // published counters)
    let start = Instant::now();
    let per_worker = loop {
        let (_, out, _) = support::ops::squall_run(&cluster, &["status", &cluster.topology, "--json"]);
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_default();
        let counter = |name: &str| -> Vec<u64> {
            v["workers"]
                .as_array()
                .map(|ws| ws.iter().map(|w| w["components"]["fire"]["counters"][name].as_u64().unwrap_or(0)).collect())
                .unwrap_or_default()
        };
        let (per_worker, errors) = (counter("fire_emitted"), counter("fire_errors").iter().sum::<u64>());
        // the workers publish their counters when they change: wait until they show every window
        let all = per_worker.iter().sum::<u64>() >= truth.len() as u64;
        if (per_worker.len() == 2 && all && errors == 1) || start.elapsed() > Duration::from_secs(40) {
            assert_eq!(errors, 1, "the unreadable key is counted once in fire_errors: {v}");
            break per_worker;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!("windows fired per worker: {per_worker:?}");
    assert!(
        per_worker.len() == 2
            && per_worker.iter().all(|n| *n > 0)
            && per_worker.iter().sum::<u64>() >= truth.len() as u64,
        "both workers fire their share of the windows: {per_worker:?}"
    );
    // the CLI audit agrees, and says so when the windows do not match (another window length)
    let audit = |window: &str| {
        support::ops::squall_run(
            &cluster,
            &["audit", "--windows", "--stream", &s.name, "--window-ms", window, "--fired", &results.name],
        )
    };
    let (code, out, err) = audit("1000");
    assert_eq!(code, 0, "squall audit --windows: {out}\n{err}");
    let report: squall::audit::WindowsReport = serde_json::from_str(out.trim()).expect("the audit's JSON report");
    assert!(report.exact() && report.records == manifest.total && report.windows == truth.len(), "{report:?}");
    let (code, _, err) = audit("500");
    assert_ne!(code, 0, "windows of 500 ms cannot match what fired for 1 s windows");
    assert!(err.contains("missing") && err.contains(&results.name), "the error names what differs: {err}");
    let mut d: Vec<i64> = delay.values().copied().collect();
    d.sort_unstable();
    eprintln!(
        "{} windows; window end -> result in the results stream: median {} ms, p90 {} ms, max {} ms (the last \
         windows wait for the idle timeout, 5 s); run {:.1} s",
        d.len(),
        d[d.len() / 2],
        d[d.len() * 9 / 10],
        d[d.len() - 1],
        t0.elapsed().as_secs_f64()
    );
    for p in [&mut a, &mut b] {
        p.stop(Duration::from_secs(15));
    }
    s.delete().await;
    results.delete().await;
}
