//! The bad-input rules of exactly-once keyed state, against the real services (Kinesis, ZooKeeper,
//! DynamoDB as dynalite), with the exactly_once_counts example as a real worker process:
//! - state over DynamoDB's 400 KB item limit fails the tuple that would grow it past the limit,
//!   with an error naming the key and the size, and it dead-letters after its retries; the item
//!   stays below the limit and the inputs that fit are counted;
//! - stored state that no longer deserializes is never overwritten, and the error names the key
//!   and the table;
//! - the store unreachable means back-pressure and retries, never a commit skipped (nor doubled).

use squall_test_support as support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use squall::kinesis::{self, PutOptions};
use squall::state::MAX_ITEM_BYTES;
use support::TestStream;
use support::reliability::{grep_logs, spawn_producer};
use support::state::{self as st, log_field};
use support::tcpproxy::TcpProxy;
use support::workers::{Cluster, scratch};

const DEAD_LETTERED: &str = "emitting it on the dead-letter stream";

/// A spout that dead-letters a record after one replay, quickly.
fn fast_dead_letters() -> serde_json::Value {
    serde_json::json!({"retry": {"max_replays": 1, "replay_min_backoff_ms": 20, "replay_max_backoff_ms": 200}})
}

/// The sequences the spout dead-lettered so far (from the worker logs).
fn dead_lettered(dir: &std::path::Path) -> BTreeSet<String> {
    grep_logs(dir, DEAD_LETTERED).iter().filter_map(|l| log_field(l, "sequence").map(str::to_string)).collect()
}

/// Waits until every sequence of `want` was dead-lettered (or the timeout); returns them all.
async fn wait_dead_lettered(dir: &std::path::Path, want: &BTreeSet<String>, timeout: Duration) -> BTreeSet<String> {
    let start = Instant::now();
    loop {
        let got = dead_lettered(dir);
        if want.is_subset(&got) || start.elapsed() > timeout {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Healthy records: `count` over `keys` keys named `key-N`; returns the expected counts.
async fn put_healthy(s: &TestStream, count: u64, keys: u64) -> BTreeMap<String, u64> {
    let opts = PutOptions { count, keys, ..PutOptions::default() };
    let m = kinesis::put_records(&s.client, &s.label(), &s.name, &opts).await.expect("put healthy records").manifest;
    m.counts.into_iter().collect()
}

async fn clean_up(cluster: &Cluster, s: TestStream, store: &squall::state::StateStore) {
    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
    st::delete_table(store).await;
}

fn b(bytes: &[u8]) -> AttributeValue {
    AttributeValue::B(bytes.to_vec().into())
}

/// (b) Stored state that no longer deserializes: one key's state is not JSON of a count, another
/// key's version attribute is not a number. Their records fail (and dead-letter) with an error
/// naming the key and the table; both items are left exactly as they were; every other key
/// counts exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_stored_state_is_never_overwritten() {
    let s = TestStream::create("state-corrupt", 2).await;
    let dir = scratch("state-corrupt");
    let cluster = Cluster::with_spout_config(&s.name, &dir, fast_dead_letters());
    let (url, table) = (support::state_endpoint(), st::unique_table("corrupt"));
    let store = st::open(&url, &table).await;
    let scope = squall::state::scope(&cluster.topology, st::COMPONENT);

    // The poisoned items, written as the schema says, with bad content.
    let bad_state = "bad-state";
    let bad_ver = "bad-ver";
    let poisoned = [
        (bad_state, vec![("ver", AttributeValue::N("7".into())), ("state", b(b"{\"not\": \"a count\""))]),
        (bad_ver, vec![("ver", AttributeValue::S("3".into())), ("state", b(b"5"))]),
    ];
    for (key, attrs) in &poisoned {
        let mut put = store
            .client()
            .expect("a DynamoDB table")
            .put_item()
            .table_name(&table)
            .item("pk", AttributeValue::S(st::item_key(&cluster.topology, key)))
            .item("scope", AttributeValue::S(scope.clone()))
            .item("key", AttributeValue::S(key.to_string()))
            .item("dedup", b(b"{}"))
            .item("updated_ms", AttributeValue::N("1".into()));
        for (name, v) in attrs {
            put = put.item(*name, v.clone());
        }
        put.send().await.expect("put a poisoned item");
    }
    let mut before = BTreeMap::new();
    for (key, _) in &poisoned {
        before.insert(*key, st::raw_item(&store, &st::item_key(&cluster.topology, key)).await.expect("poisoned item"));
    }

    let mut poison_seqs = BTreeSet::new();
    for (key, _) in &poisoned {
        poison_seqs.extend(st::put_key(&s.client, &s.name, key, 4).await);
    }
    let healthy = put_healthy(&s, 200, 10).await;
    let mut w = st::start_counts(&cluster, "w1", &url, &table, &[]);

    // The fault: every poisoned record fails until it is dead-lettered, with the named error.
    let dead = wait_dead_lettered(&dir, &poison_seqs, Duration::from_secs(60)).await;
    assert!(
        poison_seqs.is_subset(&dead),
        "poisoned records not dead-lettered: {:?}\n{}",
        poison_seqs.difference(&dead).collect::<Vec<_>>(),
        w.log_text()
    );
    assert_eq!(dead, poison_seqs, "healthy records were dead-lettered\n{}", w.log_text());
    let errors: Vec<(&str, usize)> = poisoned
        .iter()
        .map(|(key, _)| {
            let needle = format!("stored state of key `{key}` in table `{table}` cannot be read");
            (*key, grep_logs(&dir, &needle).len())
        })
        .collect();
    for (key, n) in &errors {
        assert!(*n > 0, "no error naming key {key} and table {table}\n{}", w.log_text());
    }

    // Survival: every other key counts exactly, and stays so.
    let c = st::wait_counts(&store, &cluster.topology, &healthy, Duration::from_secs(60)).await;
    let got: BTreeMap<String, u64> =
        c.iter().filter(|(k, _)| healthy.contains_key(*k)).map(|(k, n)| (k.clone(), *n)).collect();
    assert_eq!(got, healthy, "healthy counts\n{}", w.log_text());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0), "worker exit\n{}", w.log_text());
    let items = st::items(&store, &cluster.topology).await;
    let after = st::counts(&items);
    for (k, n) in &healthy {
        assert_eq!(after.get(k), Some(n), "{k} after the stop");
    }
    // The poisoned items are untouched: every attribute as written.
    for (key, _) in &poisoned {
        let now = st::raw_item(&store, &st::item_key(&cluster.topology, key)).await.expect("poisoned item gone");
        assert_eq!(&now, &before[key], "the poisoned item of {key} was overwritten");
    }
    eprintln!(
        "CORRUPT STATE: {} poisoned records over {} keys dead-lettered, errors naming key and table {errors:?}, {} \
         healthy records over {} keys counted exactly, poisoned items unchanged",
        poison_seqs.len(),
        poisoned.len(),
        healthy.values().sum::<u64>(),
        healthy.len()
    );
    clean_up(&cluster, s, &store).await;
}

/// (a) A key whose state grows by 45,000 bytes per record: 9 records fit in an item, the 10th
/// would take it past 400 KB. The 3 records past the limit fail with an error naming the key
/// and the size, and dead-letter; the 9 before them are counted (not failed with them); the
/// item never exceeds the limit; every other key counts exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_state_fails_only_the_tuples_that_grow_it() {
    const PAD: usize = 45_000;
    const FIT: usize = 9;
    const OVER: usize = 3;
    let s = TestStream::create("state-big", 2).await;
    let dir = scratch("state-big");
    let cluster = Cluster::with_spout_config(&s.name, &dir, fast_dead_letters());
    let (url, table) = (support::state_endpoint(), st::unique_table("big"));
    let store = st::open(&url, &table).await;
    let big = "big";
    let pk = st::item_key(&cluster.topology, big);

    // Watch the big item: the largest size and the counts it ever had.
    let largest = Arc::new(AtomicU64::new(0));
    let polls = Arc::new(AtomicU64::new(0));
    let stop = tokio_util::sync::CancellationToken::new();
    let watcher = {
        let (store, pk, largest, polls, stop) =
            (store.clone(), pk.clone(), largest.clone(), polls.clone(), stop.clone());
        tokio::spawn(async move {
            let mut counts = Vec::new();
            while !stop.is_cancelled() {
                if let Some(item) = st::raw_item(&store, &pk).await {
                    let size: usize = item
                        .iter()
                        .map(|(k, v)| {
                            k.len()
                                + match v {
                                    AttributeValue::B(b) => b.as_ref().len(),
                                    AttributeValue::S(s) | AttributeValue::N(s) => s.len(),
                                    _ => 0,
                                }
                        })
                        .sum();
                    largest.fetch_max(size as u64, Ordering::Relaxed);
                    polls.fetch_add(1, Ordering::Relaxed);
                    if let Some(AttributeValue::B(b)) = item.get("state") {
                        let v: serde_json::Value = serde_json::from_slice(b.as_ref()).unwrap();
                        let n = v["count"].as_u64().unwrap();
                        if counts.last() != Some(&n) {
                            counts.push(n);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            counts
        })
    };

    let seqs = st::put_key(&s.client, &s.name, big, FIT + OVER).await;
    let healthy = put_healthy(&s, 200, 10).await;
    let mut w = st::start_counts(&cluster, "w1", &url, &table, &["--pad-key", big, "--pad-bytes", &PAD.to_string()]);

    // The fault: the records past the limit fail, with an error naming the key and the size.
    let over: BTreeSet<String> = seqs[FIT..].iter().cloned().collect();
    let dead = wait_dead_lettered(&dir, &over, Duration::from_secs(60)).await;
    assert!(over.is_subset(&dead), "records past the limit not dead-lettered\n{}", w.log_text());
    let lines = grep_logs(&dir, &format!("state of key `{big}` would be "));
    let sizes: Vec<u64> = lines.iter().filter_map(|l| log_field(l, "size")?.parse().ok()).collect();
    assert!(!sizes.is_empty(), "no error naming key {big} and the size\n{}", w.log_text());
    assert!(sizes.iter().all(|n| *n > MAX_ITEM_BYTES as u64), "sizes named {sizes:?}");
    assert!(lines.iter().all(|l| l.contains("bytes")), "{lines:?}");

    // Only those: the records that fit are counted, not dead-lettered with them.
    let c = st::wait_counts(&store, &cluster.topology, &healthy, Duration::from_secs(60)).await;
    let got: BTreeMap<String, u64> =
        c.iter().filter(|(k, _)| healthy.contains_key(*k)).map(|(k, n)| (k.clone(), *n)).collect();
    assert_eq!(got, healthy, "healthy counts\n{}", w.log_text());
    let start = Instant::now();
    let big_count = loop {
        let n = st::raw_item(&store, &pk)
            .await
            .and_then(|i| match i.get("state") {
                Some(AttributeValue::B(b)) => serde_json::from_slice::<serde_json::Value>(b.as_ref()).ok(),
                _ => None,
            })
            .and_then(|v| v["count"].as_u64())
            .unwrap_or(0);
        if n == FIT as u64 || start.elapsed() > Duration::from_secs(30) {
            break n;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let dead = dead_lettered(&dir);
    assert_eq!(
        dead,
        over,
        "dead-lettered: the records that fit must not fail with those past the limit\n{}",
        w.log_text()
    );
    assert_eq!(big_count, FIT as u64, "records of {big} counted\n{}", w.log_text());
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0), "worker exit\n{}", w.log_text());
    stop.cancel();
    let counts_seen = watcher.await.unwrap();

    // The item stayed below the limit, and its count only ever grew.
    let item = st::raw_item(&store, &pk).await.expect("big item");
    let state_len = match item.get("state") {
        Some(AttributeValue::B(b)) => b.as_ref().len(),
        _ => 0,
    };
    let largest = largest.load(Ordering::Relaxed);
    assert!(state_len > (FIT * PAD), "state of {big}: {state_len} bytes");
    assert!(largest > 0 && largest < MAX_ITEM_BYTES as u64, "largest item seen {largest} bytes");
    assert!(counts_seen.windows(2).all(|w| w[0] < w[1]), "counts seen {counts_seen:?}");
    assert_eq!(counts_seen.last(), Some(&(FIT as u64)), "counts seen {counts_seen:?}");
    let after = st::counts(&st::items(&store, &cluster.topology).await);
    for (k, n) in &healthy {
        assert_eq!(after.get(k), Some(n), "{k} after the stop");
    }
    eprintln!(
        "OVERSIZED STATE: {big} +{PAD} B per record: {FIT} of {} records counted (state {state_len} B, largest item \
         seen {largest} B < {MAX_ITEM_BYTES} in {} polls, counts seen {counts_seen:?}), {} records dead-lettered, {} \
         errors naming the key and sizes {:?}..{:?}; {} healthy records counted exactly",
        FIT + OVER,
        polls.load(Ordering::Relaxed),
        dead.len(),
        sizes.len(),
        sizes.iter().min(),
        sizes.iter().max(),
        healthy.values().sum::<u64>()
    );
    clean_up(&cluster, s, &store).await;
}

/// (c) The store unreachable for about 5 s while records flow (a TCP proxy in front of dynalite,
/// cut and restored): the bolt retries (back-pressure), and every key ends counted exactly:
/// nothing skipped, nothing doubled, nothing dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_store_means_retries_never_a_skipped_commit() {
    let s = TestStream::create("state-cut", 2).await;
    let dir = scratch("state-cut");
    let cluster = Cluster::new(&s.name, &dir);
    let (url, table) = (support::state_endpoint(), st::unique_table("cut"));
    let store = st::open(&url, &table).await;
    let upstream = url.trim_start_matches("http://").trim_end_matches('/').to_string();
    let proxy = TcpProxy::start(&upstream).await;
    let via_proxy = format!("http://{}", proxy.addr);

    let mut w = st::start_counts(&cluster, "w1", &via_proxy, &table, &[]);
    let producer = spawn_producer(&s.client, &s.label(), &s.name, 1500, 20, 150.0);
    // Wait until commits flow through the proxy.
    let start = Instant::now();
    while st::counts(&st::items(&store, &cluster.topology).await).values().sum::<u64>() < 100 {
        assert!(start.elapsed() < Duration::from_secs(40), "nothing counted\n{}", w.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let retries_before = grep_logs(&dir, "retrying (inputs wait)").len();
    let counted_at_cut = st::counts(&st::items(&store, &cluster.topology).await).values().sum::<u64>();
    let refused_before = proxy.refused();
    proxy.cut();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let counted_in_cut = st::counts(&st::items(&store, &cluster.topology).await).values().sum::<u64>();
    let refused = proxy.refused() - refused_before;
    proxy.restore();
    let retries = grep_logs(&dir, "retrying (inputs wait)").len() - retries_before;
    // The fault happened: the worker's commits met a closed store, and it retried.
    assert!(refused > 0, "no connection reached the cut proxy\n{}", w.log_text());
    assert!(retries > 0, "no retry logged during the cut\n{}", w.log_text());
    // Back-pressure: nothing was committed meanwhile (but what was in flight at the cut), while
    // 750 records were written.
    assert!(counted_in_cut - counted_at_cut < 150, "{counted_at_cut} counted at the cut, {counted_in_cut} after it");
    let manifest = producer.await.unwrap();
    let expected: BTreeMap<String, u64> = manifest.counts.into_iter().collect();

    // Survival: every key exactly, and nothing dead-lettered.
    let c = st::wait_counts(&store, &cluster.topology, &expected, Duration::from_secs(45)).await;
    assert_eq!(c, expected, "counts after the outage\n{}", w.log_text());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0), "worker exit\n{}", w.log_text());
    let after = st::counts(&st::items(&store, &cluster.topology).await);
    assert_eq!(after, expected, "counts after the stop");
    assert!(dead_lettered(&dir).is_empty(), "records dead-lettered\n{}", w.log_text());
    let timeouts = grep_logs(&dir, "timed out").len();
    eprintln!(
        "UNREACHABLE STORE: cut 5 s at {counted_at_cut} counted ({counted_in_cut} when restored), {refused} \
         connections refused, {retries} retry warnings; {} records over {} keys counted exactly; {timeouts} \
         timeout lines; {} accepted connections",
        expected.values().sum::<u64>(),
        expected.len(),
        proxy.accepted()
    );
    drop(proxy);
    clean_up(&cluster, s, &store).await;
}
