//! Enhanced fan-out (`--consumer efo:NAME`) against kinesis-local: the spout registers the stream
//! consumer, subscribes to every owned shard and keeps the whole spout contract.
//!
//! - through a split, two workers lose nothing and keep per-key order; children are read only after
//!   their parent's end (read log); the open shards were read by subscriptions only (no GetRecords);
//! - a graceful stop and a new worker resume exactly from the checkpoints: no duplicate;
//! - subscriptions renewed every 2 s (`efo.renew_after_ms`; kinesis-local ends them only after
//!   5 minutes) continue from the continuation sequence: nothing lost, nothing duplicated;
//! - a subscription that goes silent (a proxy stops forwarding its bytes) is dropped by the watchdog
//!   (`efo.silence_timeout_ms`, 3 s here) and renewed: nothing lost, nothing duplicated;
//! - a bad consumer name stops the worker with an error naming it and the fix; so does a consumer
//!   that cannot be registered (here: the stream does not exist), naming the consumer, the stream
//!   and the fix.
//!
//! kinesis-local sends no ChildShards and always a continuation sequence: the parent's end is found
//! by the reader's fallback (ListShards says closed, then GetRecords to the null iterator).

use squall_test_support as support;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use squall::coord::ShardRuntime;
use squall::kinesis::{self, PutOptions};
use support::TestStream;
use support::reliability::spawn_producer;
use support::stallproxy::StallProxy;
use support::workers::{Cluster, audit_bin, read_log_entries, read_log_violations, scratch};

async fn put(s: &TestStream, count: u64) -> squall::kinesis::payload::Manifest {
    let opts = PutOptions { count, keys: 50, ..PutOptions::default() };
    kinesis::put_records(&s.client, &s.label(), &s.name, &opts).await.expect("put").manifest
}

/// Keeps the highest counters seen per shard while `f` holds (status is refreshed every few s).
fn merge_max(seen: &mut BTreeMap<String, ShardRuntime>, now: BTreeMap<String, ShardRuntime>) {
    for (shard, rt) in now {
        let e = seen.entry(shard).or_insert_with(|| rt.clone());
        e.get_records_calls = e.get_records_calls.max(rt.get_records_calls);
        e.records_read = e.records_read.max(rt.records_read);
        if let Some(efo) = rt.efo {
            let mine = e.efo.get_or_insert_with(Default::default);
            mine.events = mine.events.max(efo.events);
            mine.subscriptions = mine.subscriptions.max(efo.subscriptions);
            mine.resubscriptions = mine.resubscriptions.max(efo.resubscriptions);
            mine.watchdog = mine.watchdog.max(efo.watchdog);
            mine.in_use = mine.in_use.max(efo.in_use);
        }
    }
}

/// Samples the status until `done` or the timeout.
async fn watch_status(
    zk: &zookeeper_client::Client,
    cluster: &Cluster,
    seen: &mut BTreeMap<String, ShardRuntime>,
    timeout: Duration,
    done: impl Fn(&BTreeMap<String, ShardRuntime>) -> bool,
) {
    let start = Instant::now();
    while start.elapsed() < timeout {
        merge_max(seen, support::efo::shard_status(zk, cluster).await);
        if done(seen) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn consumer_flag(s: &TestStream) -> String {
    format!("efo:{}-app", s.name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn efo_through_a_split_loses_nothing_and_keeps_order() {
    let s = TestStream::create("efo-split", 2).await;
    let dir = scratch("efo-split");
    let cluster = Cluster::new(&s.name, &dir);
    let zk = support::zk_client().await;
    let consumer = consumer_flag(&s);
    let mut w1 = cluster.start_with("w1", 1, &["--consumer", &consumer]);
    let mut w2 = cluster.start_with("w2", 1, &["--consumer", &consumer]);
    let label = s.label();

    // The split happens while a producer writes (100 a second for 6 s) and the subscriptions
    // deliver (asserted).
    let producer = support::reliability::spawn_producer(&s.client, &label, &s.name, 600, 40, 100.0);
    let delivered = cluster.wait_more_delivered(0).await;
    kinesis::split_shard(&s.client, &label, &s.name, "shardId-000000000000").await.unwrap();
    assert!(!producer.is_finished(), "the producer had finished before the split: it was not under load");
    eprintln!("split after {delivered} deliveries, with the producer writing");
    let manifests = vec![producer.await.unwrap()];
    let report = cluster.wait_delivered(&manifests, Duration::from_secs(90)).await;
    assert_eq!(report.lost, 0, "lost records: {report:?}\n{}", cluster.logs());
    assert_eq!(report.order_violations, 0, "per-key order broken: {report:?}");

    // Every open shard (the children and shard 1) was read by subscriptions, never by GetRecords.
    let shards = kinesis::list_shards(&s.client, &label, &s.name).await.unwrap();
    let open: Vec<String> = shards.iter().filter(|d| !d.closed).map(|d| d.shard_id.clone()).collect();
    assert_eq!(open.len(), 3, "{shards:?}");
    let mut seen = BTreeMap::new();
    watch_status(&zk, &cluster, &mut seen, Duration::from_secs(20), |seen| {
        open.iter()
            .all(|sh| seen.get(sh).and_then(|r| r.efo.as_ref()).is_some_and(|e| e.subscriptions > 0 && e.events > 0))
    })
    .await;
    eprintln!("EFO split status: {}", serde_json::to_string(&seen).unwrap());
    for sh in &open {
        let rt = seen.get(sh).unwrap_or_else(|| panic!("no status for {sh}: {seen:?}"));
        let efo = rt.efo.as_ref().unwrap_or_else(|| panic!("{sh} not read by EFO: {rt:?}"));
        assert!(efo.subscriptions > 0 && efo.events > 0, "{sh}: {efo:?}");
        assert_eq!(rt.get_records_calls, 0, "{sh} was polled: {rt:?}");
    }

    // Parents finished before any child record was read; one reader at a time.
    let parents: HashMap<String, Vec<String>> =
        shards.iter().map(|sh| (sh.shard_id.clone(), sh.parents().map(str::to_string).collect())).collect();
    let entries = read_log_entries(&cluster.read_logs());
    let violations = read_log_violations(&entries, &parents);
    assert!(violations.is_empty(), "read-log violations: {violations:#?}");
    assert!(entries.iter().any(|e| e.event == "end" && e.shard == "shardId-000000000000"), "the parent never ended");

    assert_eq!(w1.stop(Duration::from_secs(30)), Some(0), "{}", cluster.logs());
    assert_eq!(w2.stop(Duration::from_secs(30)), Some(0), "{}", cluster.logs());
    eprintln!("EFO split audit: {}", serde_json::to_string(&report).unwrap());
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn efo_restart_resumes_exactly_from_the_checkpoint() {
    let s = TestStream::create("efo-restart", 2).await;
    let dir = scratch("efo-restart");
    let cluster = Cluster::new(&s.name, &dir);
    let zk = support::zk_client().await;
    let consumer = consumer_flag(&s);
    let mut first = cluster.start_with("first", 2, &["--consumer", &consumer]);
    let m1 = put(&s, 400).await;
    let report = cluster.wait_delivered(std::slice::from_ref(&m1), Duration::from_secs(60)).await;
    assert_eq!(report.lost, 0, "{report:?}\n{}", cluster.logs());
    let mut seen = BTreeMap::new();
    watch_status(&zk, &cluster, &mut seen, Duration::from_secs(20), |seen| {
        seen.len() == 2 && seen.values().all(|r| r.efo.as_ref().is_some_and(|e| e.subscriptions > 0))
    })
    .await;
    assert_eq!(first.stop(Duration::from_secs(30)), Some(0), "{}", cluster.logs());

    // A new worker, more records: each shard resumes at its checkpoint, nothing delivered twice.
    let mut second = cluster.start_with("second", 2, &["--consumer", &consumer]);
    let m2 = put(&s, 200).await;
    let manifests = [m1, m2];
    let report = cluster.wait_delivered(&manifests, Duration::from_secs(60)).await;
    assert_eq!(report.lost, 0, "{report:?}\n{}", cluster.logs());
    watch_status(&zk, &cluster, &mut seen, Duration::from_secs(20), |_| false).await;
    // Late duplicates would show after the last delivery: look again after a while.
    let report = cluster.audit(&manifests);
    eprintln!("EFO restart audit: {}", serde_json::to_string(&report).unwrap());
    eprintln!("EFO restart status: {}", serde_json::to_string(&seen).unwrap());
    assert_eq!(report.lost, 0, "{report:?}");
    assert_eq!(report.duplicates, 0, "a restart delivered records twice: {report:?}\n{}", cluster.logs());
    for (sh, rt) in &seen {
        assert!(rt.efo.as_ref().is_some_and(|e| e.subscriptions > 0), "{sh}: {rt:?}");
        assert_eq!(rt.get_records_calls, 0, "{sh} was polled: {rt:?}");
    }
    assert_eq!(second.stop(Duration::from_secs(30)), Some(0), "{}", cluster.logs());
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn efo_renewed_subscriptions_continue_from_the_continuation_sequence() {
    let s = TestStream::create("efo-renew", 2).await;
    let dir = scratch("efo-renew");
    let cluster = Cluster::with_spout_config(&s.name, &dir, serde_json::json!({"efo": {"renew_after_ms": 2000}}));
    let zk = support::zk_client().await;
    let consumer = consumer_flag(&s);
    let mut w = cluster.start_with("w", 1, &["--consumer", &consumer]);
    // ~15 s of records at 100/s, across several renewals of each subscription.
    let producer = spawn_producer(&s.client, &s.label(), &s.name, 1500, 40, 100.0);
    let mut seen = BTreeMap::new();
    while !producer.is_finished() {
        merge_max(&mut seen, support::efo::shard_status(&zk, &cluster).await);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let manifest = producer.await.unwrap();
    let report = cluster.wait_delivered(std::slice::from_ref(&manifest), Duration::from_secs(60)).await;
    watch_status(&zk, &cluster, &mut seen, Duration::from_secs(6), |_| false).await;
    let report_late = cluster.audit(std::slice::from_ref(&manifest));
    eprintln!("EFO renew audit: {}", serde_json::to_string(&report_late).unwrap());
    eprintln!("EFO renew status: {}", serde_json::to_string(&seen).unwrap());
    assert_eq!(report.lost, 0, "{report:?}\n{}", cluster.logs());
    assert_eq!(report_late.duplicates, 0, "renewals delivered records twice: {report_late:?}");
    assert_eq!(report_late.order_violations, 0, "{report_late:?}");
    assert_eq!(seen.len(), 2, "{seen:?}");
    for (sh, rt) in &seen {
        let efo = rt.efo.as_ref().unwrap_or_else(|| panic!("{sh} not read by EFO: {rt:?}"));
        // Every 2 s, plus the ResourceInUse back-off while kinesis-local frees the previous one.
        assert!(efo.resubscriptions >= 2, "{sh}: too few renewals {efo:?}");
        assert_eq!(rt.get_records_calls, 0, "{sh} was polled: {rt:?}");
    }
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0), "{}", cluster.logs());
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn efo_watchdog_renews_a_silent_subscription() {
    let s = TestStream::create("efo-watchdog", 2).await;
    let dir = scratch("efo-watchdog");
    let cluster = Cluster::with_spout_config(&s.name, &dir, serde_json::json!({"efo": {"silence_timeout_ms": 3000}}));
    let zk = support::zk_client().await;
    let upstream = support::kinesis_endpoint().endpoint.trim_start_matches("http://").to_string();
    let proxy = StallProxy::start(&upstream).await;
    let consumer = consumer_flag(&s);
    let mut w = cluster.start_with("w", 1, &["--consumer", &consumer, "--endpoint", &proxy.url]);
    let producer = spawn_producer(&s.client, &s.label(), &s.name, 1000, 40, 100.0);
    // Once both shards deliver, the subscriptions hang: no byte of theirs reaches the worker.
    let start = Instant::now();
    let mut seen = BTreeMap::new();
    watch_status(&zk, &cluster, &mut seen, Duration::from_secs(30), |seen| {
        seen.len() == 2 && seen.values().all(|r| r.records_read > 0 && r.efo.as_ref().is_some_and(|e| e.events > 0))
    })
    .await;
    let stalled = proxy.stall_streams();
    assert_eq!(stalled, 2, "event streams open when stalled ({:?} after the start)", start.elapsed());
    while !producer.is_finished() {
        merge_max(&mut seen, support::efo::shard_status(&zk, &cluster).await);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let manifest = producer.await.unwrap();
    let report = cluster.wait_delivered(std::slice::from_ref(&manifest), Duration::from_secs(60)).await;
    watch_status(&zk, &cluster, &mut seen, Duration::from_secs(15), |seen| {
        seen.values().all(|r| r.efo.as_ref().is_some_and(|e| e.watchdog > 0 && e.resubscriptions > 0))
    })
    .await;
    let report_late = cluster.audit(std::slice::from_ref(&manifest));
    eprintln!("EFO watchdog audit: {}", serde_json::to_string(&report_late).unwrap());
    eprintln!("EFO watchdog status: {}", serde_json::to_string(&seen).unwrap());
    assert_eq!(report.lost, 0, "{report:?}\n{}", cluster.logs());
    assert_eq!(report_late.duplicates, 0, "{report_late:?}");
    for (sh, rt) in &seen {
        let efo = rt.efo.as_ref().unwrap_or_else(|| panic!("{sh} not read by EFO: {rt:?}"));
        assert!(efo.watchdog > 0 && efo.resubscriptions > 0, "{sh}: the watchdog never fired: {efo:?}");
        assert_eq!(rt.get_records_calls, 0, "{sh} was polled: {rt:?}");
    }
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0), "{}", cluster.logs());
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn efo_bad_consumer_name_exits_with_the_fix() {
    let dir = scratch("efo-bad");
    let cluster = Cluster::new("efo-bad-stream", &dir);
    let (mut cmd, log) = cluster.worker_command(&audit_bin(), "w", 1, &["--consumer", "efo:no spaces!"]);
    let status = cmd.status().expect("run the worker");
    let text = std::fs::read_to_string(log).unwrap();
    assert!(!status.success(), "{text}");
    assert!(text.contains("no spaces!") && text.contains("a-z, A-Z, 0-9"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn efo_registration_failure_exits_naming_the_consumer_the_stream_and_the_fix() {
    let dir = scratch("efo-nostream");
    let stream = support::unique_name("efo-nostream");
    let cluster = Cluster::new(&stream, &dir);
    let (mut cmd, log) = cluster.worker_command(&audit_bin(), "w", 1, &["--consumer", "efo:app"]);
    let mut child = cmd.spawn().expect("run the worker");
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "the worker did not exit");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let text = std::fs::read_to_string(log).unwrap();
    assert!(!status.success(), "{text}");
    let line =
        text.lines().find(|l| l.contains("cannot register the stream consumer")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("\"app\"") && line.contains(&stream) && line.contains("--consumer polling"), "{line}");
    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
}

/// Registration costs the account's RegisterStreamConsumer budget (about 5 calls per second)
/// once, not once per task: a worker of 4 spout tasks describes the consumer first, registers it
/// once, and retries LimitExceeded (2 refused here by a fault proxy) instead of failing; a second
/// worker finds the consumer and registers nothing. (The fault proxy speaks HTTP/1.1: the event
/// streams of SubscribeToShard do not pass it, so this test stops at the registration.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn efo_registration_is_described_first_made_once_and_retried_on_limit_exceeded() {
    use support::faultproxy::{FaultPlan, FaultProxy};
    let s = TestStream::create("efo-reg", 4).await;
    let dir = scratch("efo-reg");
    let cluster = Cluster::new(&s.name, &dir);
    let plan = FaultPlan {
        client_error: 1.0,
        client_error_code: "LimitExceededException".into(),
        only_ops: vec!["RegisterStreamConsumer".into()],
        max_faults: 2,
        ..FaultPlan::default()
    };
    let proxy = FaultProxy::start(&support::kinesis_endpoint().endpoint, plan).await;
    let endpoint = proxy.url();
    let consumer = consumer_flag(&s);
    let args = ["--consumer", consumer.as_str(), "--endpoint", endpoint.as_str()];
    let active = |w: &support::workers::Worker| w.log_text().matches("stream consumer ACTIVE").count();
    let mut w1 = cluster.start_with("w1", 4, &args);
    let guard = Instant::now();
    while active(&w1) == 0 || w1.log_text().matches("spout task registered").count() < 4 {
        assert!(w1.is_running(), "the worker exited (registration failed?)\n{}", w1.log_text());
        assert!(guard.elapsed() < Duration::from_secs(30), "no ACTIVE consumer in 30 s\n{}", w1.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(proxy.counters().client_errors, 2, "LimitExceeded injected twice");
    let registers_w1 = proxy.requests_of("RegisterStreamConsumer");
    let mut w2 = cluster.start_with("w2", 4, &args);
    let guard = Instant::now();
    while active(&w2) == 0 {
        assert!(w2.is_running(), "the second worker exited\n{}", w2.log_text());
        assert!(guard.elapsed() < Duration::from_secs(30), "no ACTIVE consumer in 30 s\n{}", w2.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let registers = proxy.requests_of("RegisterStreamConsumer");
    eprintln!(
        "EFO registration: RegisterStreamConsumer {registers_w1} by the first worker's 4 tasks (2 refused), {} by \
         the second; DescribeStreamConsumer {}; ACTIVE once per worker ({}, {})",
        registers - registers_w1,
        proxy.requests_of("DescribeStreamConsumer"),
        active(&w1),
        active(&w2)
    );
    assert_eq!(registers_w1, 3, "one registration for the worker's 4 tasks, retried twice");
    assert_eq!(registers, registers_w1, "the second worker found the consumer and registered nothing");
    assert_eq!((active(&w1), active(&w2)), (1, 1), "one registration context per worker");
    w1.kill();
    w2.kill();
    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}

/// A consumer deregistered under a running worker (an operator, a clean-up job) is registered
/// again and the shards are read on: SubscribeToShard's ResourceNotFound is not a deleted stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn efo_consumer_deregistered_under_a_running_worker_is_registered_again() {
    let s = TestStream::create("efo-dereg", 2).await;
    let dir = scratch("efo-dereg");
    let cluster = Cluster::with_spout_config(&s.name, &dir, serde_json::json!({"efo": {"renew_after_ms": 2000}}));
    let consumer = consumer_flag(&s);
    let name = consumer.trim_start_matches("efo:").to_string();
    let mut w = cluster.start_with("w", 1, &["--consumer", &consumer]);
    let m1 = put(&s, 200).await;
    let r = cluster.wait_delivered(std::slice::from_ref(&m1), Duration::from_secs(60)).await;
    assert_eq!(r.lost, 0, "{r:?}\n{}", cluster.logs());
    let arn = support::ops::stream_arn(&s.client, &s.name).await;
    s.client.deregister_stream_consumer().stream_arn(&arn).consumer_name(&name).send().await.expect("deregister");
    // past a renewal (2 s): the next subscriptions name the deregistered consumer
    tokio::time::sleep(Duration::from_secs(5)).await;
    let m2 = put(&s, 200).await;
    let r = cluster.wait_delivered(&[m1, m2], Duration::from_secs(60)).await;
    let log = cluster.logs();
    let again = log.matches("registered again").count();
    eprintln!("EFO deregistered: 'registered again' lines {again}; {}", serde_json::to_string(&r).unwrap());
    assert_eq!(r.lost, 0, "records lost after the consumer was deregistered: {r:?}\n{log}");
    assert!(again > 0, "the consumer was never registered again\n{log}");
    assert!(w.is_running(), "the worker exited\n{log}");
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0), "{}", cluster.logs());
    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}
