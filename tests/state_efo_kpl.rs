//! Exactly-once over enhanced fan-out reading KPL aggregates of both producer styles, against
//! kinesis-local, ZooKeeper and dynalite: workers of `examples/exactly_once_counts.rs
//! --consumer efo:NAME` count the user records of a 3-shard stream per partition key while two
//! producers write into it, round after round (`support::kpl::KplProducer`):
//! - a KPL-like producer (one aggregate per shard its map predicts, packed by AWS's reference
//!   aggregator); after a split its map is stale for a few rounds, so aggregates land on a child
//!   that does not hold all their keys, and it sends each such aggregate again WHOLE as new
//!   Kinesis records, each user record to its own child;
//! - a Lambda-style producer (`aws-kinesis-agg`: keys mixed in one aggregate, routed by the
//!   first record's key, never sent again): most user records are outside the hash range of the
//!   shard they are in, and one key is read from every shard at once.
//!
//! Meanwhile worker `b`, alone, aborts right after a written commit, before acking (its records
//! are read again from a checkpoint inside an aggregate: the replays must be recognized), shard 0
//! is split, and worker `c` (which reads shards and holds uncommitted inputs) is SIGKILLed and
//! replaced. The truth is the stream itself, read back and de-aggregated with the spout's own
//! de-aggregation: exactly-once counts each user record of each Kinesis record once, and a KPL
//! re-send is a new Kinesis record, so its user records count again (the documented cost; the
//! producer's intent is checked apart: truth minus intent is exactly what the KPL-like
//! producer re-sent, and nothing for the Lambda-style one).
//!
//! Three runs of the one scenario:
//! - `exactly_once_counts`: every key's count in the table equals the truth;
//! - `--window-ms 1000 --fire-to RESULTS` (committed watermark every 300 ms): every window (by
//!   the aggregate's arrival time) fires with its true count, and no input is late;
//! - `--two-stages --boundary-shards 2`: the intermediate stream is read by enhanced fan-out too,
//!   and both stages' counts equal the truth.
//!
//! Each also checks that the faults happened (the abort, re-sent aggregates, out-of-range user
//! records counted by the spout, the split, the SIGKILLed worker had read and committed), and
//! that every open shard, and every shard of the intermediate stream, was read by subscriptions
//! with no GetRecords call (kinesis-local never names a shard's end in an event: a closed parent
//! is finished by polling, so it is left out).

use squall_test_support as support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use squall::kinesis;
use support::TestStream;
use support::efo::Seen;
use support::kpl::{KplProducer, counts_of, deaggregated, kpl_counters};
use support::reliability::Proc;
use support::state::{ZOMBIE_COMMIT_INTERVAL_MS, count_in, start_counts, wait_committing, wait_reading};
use support::workers::{Cluster, scratch};

const WINDOW_MS: u64 = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Counts per key.
    Counts,
    /// Counts per key and 1 s window, fired to a results stream.
    Windows,
    /// Counts per key, then summed again by a second stage over an intermediate stream.
    TwoStages,
}

/// Waits (asynchronously) until `p` exits by itself; its exit code, `None` after `timeout`.
async fn exited(p: &mut Proc, timeout: Duration) -> Option<i32> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if let Some(code) = p.wait_exit(Duration::ZERO) {
            return Some(code);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// (keys counted short, keys counted over, records missing, records counted twice) of `got`
/// against `truth`; keys not in the truth count as over.
fn differences(truth: &BTreeMap<String, u64>, got: &BTreeMap<String, u64>) -> (Vec<String>, Vec<String>, u64, u64) {
    let (mut short, mut over, mut lost, mut extra) = (Vec::new(), Vec::new(), 0, 0);
    for (k, n) in truth {
        let g = got.get(k).copied().unwrap_or(0);
        if g < *n {
            short.push(format!("{k}: {g} < {n}"));
            lost += n - g;
        } else if g > *n {
            over.push(format!("{k}: {g} > {n}"));
            extra += g - n;
        }
    }
    for (k, g) in got.iter().filter(|(k, _)| !truth.contains_key(*k)) {
        over.push(format!("{k}: {g} (not in the stream)"));
        extra += g;
    }
    (short, over, lost, extra)
}

async fn exactly_once_over_efo_and_kpl(mode: Mode) {
    let t0 = Instant::now();
    let mark = |what: &str| eprintln!("[{:>6.1} s] {mode:?}: {what}", t0.elapsed().as_secs_f64());
    let s = TestStream::create("eo-efo-kpl", 3).await;
    let results = match mode {
        Mode::Windows => Some(TestStream::create("eo-efo-kpl-fired", 1).await),
        _ => None,
    };
    let dir = scratch("eo-efo-kpl");
    let mut spout = serde_json::json!({ "checkpoint_interval_ms": 200 });
    if mode == Mode::Windows {
        spout["committed_watermark_interval_ms"] = 300.into();
    }
    let cluster = Cluster::with_spout_config(&s.name, &dir, spout);
    let table = support::unique_name("eo-efo-kpl");
    let url = support::state_endpoint();
    let store = support::state::open(&url, &table).await;
    let zk = support::zk_client().await;
    let consumer = format!("efo:{}-app", s.name);
    let mut flags: Vec<String> = vec!["--consumer".into(), consumer];
    match (mode, &results) {
        (Mode::Windows, Some(r)) => flags.extend(["--window-ms", "1000", "--fire-to", &r.name].map(String::from)),
        (Mode::TwoStages, _) => flags.extend(["--two-stages", "--boundary-shards", "2"].map(String::from)),
        _ => {}
    }
    let start = |name: &str, extra: &[&str]| {
        let args: Vec<&str> = flags.iter().map(String::as_str).chain(extra.iter().copied()).collect();
        start_counts(&cluster, name, &url, &table, &args)
    };
    let mut seen = Seen::default();

    let kpl_keys: Vec<String> = (0..16).map(|i| format!("kpl-{i}")).collect();
    let lambda_keys: Vec<String> = (0..16).map(|i| format!("lam-{i}")).collect();
    let producer =
        KplProducer::start(&s, kpl_keys.clone(), lambda_keys.clone(), 3, 8, Duration::from_millis(300)).await;

    // 1. b, alone (it reads every shard), aborts right after its 25th written commit, before
    //    acking its inputs: they come back, read again from checkpoints inside aggregates
    let mut b = start("b", &["--abort-after-commits", "25"]);
    let code = exited(&mut b, Duration::from_secs(90)).await;
    assert!(code.is_some(), "b never reached its 25th commit\n{}", cluster.logs());
    assert_eq!(count_in(&b.log, "abort_after_commits: aborting after a written commit"), 1, "{}", b.log_text());
    mark(&format!("b aborted after a written commit (exit {code:?}), {} rounds put", producer.rounds()));

    // 2. a, and c, which commits slowly (inputs wait 3 s): it holds uncommitted inputs when killed
    let mut a = start("a", &[]);
    let mut c = start("c", &["--commit-interval-ms", ZOMBIE_COMMIT_INTERVAL_MS]);
    wait_reading(&a, &cluster).await;
    wait_reading(&c, &cluster).await;
    seen.sample(&zk, &cluster).await;

    // 3. split shard 0; the KPL-like producer's map is stale for 3 rounds
    producer.split("shardId-000000000000").await;
    mark("split shardId-000000000000");
    producer.wait_rounds(3).await;
    producer.refresh_map();
    seen.sample(&zk, &cluster).await;

    // 4. SIGKILL c once it committed and holds uncommitted inputs again; a replacement starts
    wait_committing(&c, &cluster).await;
    let c_reads: Vec<String> = std::fs::read_to_string(&c.log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("reading shard"))
        .filter_map(|l| support::state::log_field(l, "shard").map(str::to_string))
        .collect();
    seen.sample(&zk, &cluster).await;
    c.kill();
    mark(&format!("SIGKILL c (it had read {c_reads:?})"));
    let mut c2 = start("c2", &[]);
    producer.wait_rounds(5).await;
    let produced = producer.finish().await;
    mark(&format!("producers done: {} rounds", produced.rounds));

    // ---- the truth: the stream, de-aggregated ----
    let records = deaggregated(&s).await;
    let window = (mode == Mode::Windows).then_some(WINDOW_MS);
    let truth = counts_of(&records, window);
    let per_key = counts_of(&records, None);
    let intent_kpl: u64 = produced.kpl_like.values().sum();
    let intent_lambda: u64 = produced.lambda.values().sum();
    let outside = records.iter().filter(|r| r.outside).count() as u64;
    mark(&format!(
        "stream: {} user records ({intent_kpl} KPL-like + {intent_lambda} Lambda-style meant, {} re-sent in {} \
         aggregates), {} out of their shard's range, {} keys{}",
        records.len(),
        produced.kpl.resent,
        produced.kpl.resent_aggregates,
        outside,
        per_key.len(),
        window.map(|_| format!(", {} windows", truth.len())).unwrap_or_default(),
    ));

    // ---- the producers did what the scenario needs ----
    assert!(records.iter().all(|r| r.aggregated), "every record of the stream is a KPL aggregate");
    assert!(produced.kpl.resent > 0 && produced.kpl.resent_aggregates > 0, "no aggregate re-sent: {:?}", produced.kpl);
    assert!(produced.kpl.outside > 0 && produced.lambda_outside > 0, "{produced:?}");
    assert_eq!(outside, produced.kpl.outside + produced.lambda_outside, "user records outside their shard's range");
    assert_eq!(records.len() as u64, intent_kpl + intent_lambda + produced.kpl.resent);
    for k in &lambda_keys {
        assert_eq!(per_key.get(k), produced.lambda.get(k), "a Lambda-style key is in the stream as often as written");
    }
    let kpl_in_stream: u64 = kpl_keys.iter().map(|k| per_key.get(k).copied().unwrap_or(0)).sum();
    assert_eq!(kpl_in_stream - intent_kpl, produced.kpl.resent, "the KPL-like producer's keys: intent + re-sends");
    let listed = kinesis::list_shards(&s.client, &s.label(), &s.name).await.unwrap();
    assert_eq!(listed.len(), 3 + 2, "the split not seen in the shard list: {listed:?}");
    let open: Vec<String> = listed.iter().filter(|d| !d.closed).map(|d| d.shard_id.clone()).collect();

    // ---- exactly once ----
    let wait_start = Instant::now();
    let (counted, totals, fired_windows) = loop {
        let counted = support::state::numbers(&store, &cluster.topology, "counts").await;
        let totals = match mode {
            Mode::TwoStages => {
                Some(support::state::numbers(&store, &format!("{}.totals", cluster.topology), "totals").await)
            }
            _ => None,
        };
        let fired_windows = match &results {
            Some(r) => Some(support::state::fired_windows(r).await),
            None => None,
        };
        let done = counted == truth
            && totals.as_ref().is_none_or(|t| *t == truth)
            && fired_windows.as_ref().is_none_or(|f| truth.keys().all(|k| f.contains_key(k)));
        if done || wait_start.elapsed() > Duration::from_secs(150) {
            break (counted, totals, fired_windows);
        }
        seen.sample(&zk, &cluster).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    mark("counts settled (or timed out)");
    let logs = ["a", "b", "c", "c2"].map(|n| dir.join(format!("{n}.log")));
    let duplicates: usize = logs.iter().map(|l| count_in(l, "duplicate input skipped")).sum();
    let late: usize = logs.iter().map(|l| count_in(l, "late input")).sum();
    let status = kpl_counters(&cluster).await;
    let (short, over, lost, extra) = differences(&truth, &counted);
    eprintln!(
        "{mode:?}: table vs stream: {} items, lost {lost}, counted twice {extra}; duplicates skipped {duplicates}; \
         late inputs {late}; KPL status of the live workers {status:?}",
        truth.len()
    );
    assert!(
        short.is_empty() && over.is_empty(),
        "counts differ from the de-aggregated stream: short {:?}; over {:?}\n{}",
        &short[..short.len().min(10)],
        &over[..over.len().min(10)],
        cluster.logs()
    );
    if let Some(totals) = &totals {
        let (short, over, lost, extra) = differences(&truth, totals);
        eprintln!("{mode:?}: totals stage vs stream: lost {lost}, counted twice {extra}");
        assert!(
            short.is_empty() && over.is_empty(),
            "the second stage's counts differ from the stream: short {:?}; over {:?}\n{}",
            &short[..short.len().min(10)],
            &over[..over.len().min(10)],
            cluster.logs()
        );
    }
    if let Some(got) = &fired_windows {
        let missing: Vec<_> = truth.keys().filter(|k| !got.contains_key(*k)).take(10).collect();
        let wrong: Vec<_> = truth
            .iter()
            .filter_map(|(k, n)| got.get(k).filter(|c| c.iter().any(|c| c != n)).map(|c| (k, *n, c.clone())))
            .take(10)
            .collect();
        let unknown: Vec<_> = got.keys().filter(|k| !truth.contains_key(*k)).take(10).collect();
        let put_twice = got.values().filter(|v| v.len() > 1).count();
        eprintln!("{mode:?}: {} windows fired ({put_twice} put more than once, same count)", got.len());
        assert!(
            missing.is_empty() && wrong.is_empty() && unknown.is_empty(),
            "fired windows differ from the stream: missing {missing:?}; (window, true, fired) {wrong:?}; unknown \
             {unknown:?}\n{}",
            cluster.logs()
        );
        assert_eq!(late, 0, "inputs arrived after their window fired\n{}", cluster.logs());
        assert!(truth.len() > per_key.len(), "records spread over several windows per key: {}", truth.len());
    }
    // b's last commit was written and never acked: its records came back and were recognized
    assert!(duplicates > 0, "no replayed record was recognized as already applied\n{}", cluster.logs());
    // the spout counted the user records outside their shard's range (and, above, delivered them)
    assert!(status.out_of_range > 0 && status.users > 0, "{status:?}");
    assert_eq!((status.dropped, status.corrupt), (0, 0), "{status:?}");
    // the killed worker mattered: it read shards, and committed
    assert!(!c_reads.is_empty(), "c read no shard before it was killed\n{}", c.log_text());
    // the workers after b and c resumed from checkpoints inside aggregates (`from=AFTER_SEQUENCE
    // {sequence}/{sub-sequence}`), whose user records up to the sub-sequence are skipped
    let source = format!("stream={} ", s.name);
    let resumes: Vec<String> = support::ops::log_lines(&cluster, &["reading shard", &source, "from=AFTER_SEQUENCE"])
        .iter()
        .filter_map(|l| l.rsplit_once('/').map(|(_, sub)| sub.trim().to_string()))
        .collect();
    eprintln!("{mode:?}: resumed at sub-sequences {resumes:?}");
    assert!(
        resumes.iter().any(|sub| sub.parse::<u64>().is_ok_and(|n| n > 0)),
        "no worker resumed from a checkpoint inside an aggregate: {resumes:?}"
    );

    // ---- read by subscriptions ----
    let mut must: Vec<String> = open.clone();
    if mode == Mode::TwoStages {
        let tally = format!("{}-tally", cluster.topology);
        let inter = kinesis::list_shards(&s.client, &s.label(), &tally).await.unwrap();
        assert_eq!(inter.len(), 2, "{inter:?}");
        must.extend(inter.iter().map(|d| format!("{tally}/{}", d.shard_id)));
    }
    seen.watch(&zk, &cluster, Duration::from_secs(20), |seen| must.iter().all(|sh| seen.subscribed(sh))).await;
    eprintln!("{mode:?}: EFO status seen: {}", serde_json::to_string(&seen.0).unwrap());
    let polled = seen.not_by_subscription_only(&must);
    assert!(polled.is_empty(), "shards not read by subscriptions only: {polled:#?}");

    // ---- the deduplication data stays bounded ----
    if mode != Mode::Windows {
        let scope = squall::state::scope(&cluster.topology, "counts");
        let pks: Vec<String> = per_key.keys().map(|k| format!("{scope}/{k}")).collect();
        let items = store.get_many(&pks).await.unwrap();
        let entries: BTreeMap<&str, usize> = per_key
            .keys()
            .filter_map(|k| {
                let i = items.get(&format!("{scope}/{k}"))?;
                let d = serde_json::from_slice::<squall::state::Dedup>(&i.dedup).expect("dedup data");
                Some((k.as_str(), d.shards.len()))
            })
            .collect();
        eprintln!("{mode:?}: shard entries per key: {entries:?}");
        assert_eq!(entries.len(), per_key.len());
        // Lambda-style keys are read from every open shard; a finished parent's entry goes once
        // a descendant's record of the key was applied
        assert!(entries.values().all(|n| *n <= open.len()), "finished shards' entries kept: {entries:?}");
    }
    eprintln!(
        "{mode:?} figures: user records {}, keys {}, windows {}, re-sent user records {} ({} aggregates), out of \
         range {outside} (status {}), late {late}, lost 0, duplicates skipped {duplicates}; run {:.1} s",
        records.len(),
        per_key.len(),
        if window.is_some() { truth.len() } else { 0 },
        produced.kpl.resent,
        produced.kpl.resent_aggregates,
        status.out_of_range,
        t0.elapsed().as_secs_f64()
    );
    for p in [&mut a, &mut c2] {
        p.stop(Duration::from_secs(15));
    }
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    if mode == Mode::TwoStages {
        TestStream::existing(&format!("{}-tally", cluster.topology)).await.delete().await;
    }
    if let Some(r) = results {
        r.delete().await;
    }
    support::state::delete_table(&store).await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_counts_over_efo_and_both_kpl_styles_through_a_split_abort_and_sigkill() {
    exactly_once_over_efo_and_kpl(Mode::Counts).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_windows_fire_once_over_efo_and_both_kpl_styles_through_a_split_abort_and_sigkill() {
    exactly_once_over_efo_and_kpl(Mode::Windows).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_exactly_once_stages_over_efo_and_both_kpl_styles_through_a_split_abort_and_sigkill() {
    exactly_once_over_efo_and_kpl(Mode::TwoStages).await;
}
