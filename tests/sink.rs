//! The Kinesis sink against kinesis-local (`localstack/up`): a topology writes through
//! `KinesisSink`, the test reads the stream back with GetRecords. Faults (per-record failures,
//! throttled calls, latency) come from the fault proxy between the sink and kinesis-local.

use squall_test_support as support;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use aws_sdk_kinesis::types::ShardIteratorType;
use squall::kinesis::KinesisEndpoint;
use squall::sink::{FieldsEncoder, KinesisSink, KinesisSinkConfig, metric};
use squall::topology::{
    ComponentError, Spout, SpoutOutput, TopologyBuilder, TopologyConfig, TopologyMetrics, run_local,
};
use support::TestStream;
use support::faultproxy::{FaultPlan, FaultProxy};

#[derive(Default)]
struct Tally {
    acked: AtomicU64,
    failed: AtomicU64,
}

/// Emits `n` tracked tuples (key, payload): tuple `i` has key `k{i % keys}` and payload
/// `k{key}:{i / keys}:{padding}`, so each key's payloads count up from 0. Failed tuples are
/// replayed when `replay`.
struct Numbers {
    n: u64,
    keys: u64,
    pad: usize,
    next: u64,
    replay: bool,
    again: VecDeque<u64>,
    tally: Arc<Tally>,
}

impl Numbers {
    fn values(&self, i: u64) -> (String, String) {
        let key = format!("k{}", i % self.keys);
        let payload = format!("{key}:{}:{}", i / self.keys, "x".repeat(self.pad));
        (key, payload)
    }
}

impl Spout for Numbers {
    type MsgId = u64;

    async fn next_tuple(&mut self, out: &mut SpoutOutput<u64>) -> Result<(), ComponentError> {
        let i = match self.again.pop_front() {
            Some(i) => i,
            None if self.next < self.n => {
                self.next += 1;
                self.next - 1
            }
            None => return Ok(()),
        };
        let (k, p) = self.values(i);
        out.emit_tracked([k, p], i)?;
        Ok(())
    }

    async fn ack(&mut self, _id: u64) {
        self.tally.acked.fetch_add(1, Ordering::Relaxed);
    }

    async fn fail(&mut self, id: u64) {
        self.tally.failed.fetch_add(1, Ordering::Relaxed);
        if self.replay {
            self.again.push_back(id);
        }
    }
}

struct Run {
    tally: Arc<Tally>,
    metrics: TopologyMetrics,
    elapsed: Duration,
}

/// Runs spout -> sink (`sink_tasks` tasks, fields grouping on the key) until every tuple is
/// acked (or, without replay, acked or failed), then drains.
async fn run(cfg: KinesisSinkConfig, n: u64, keys: u64, pad: usize, sink_tasks: usize, replay: bool) -> Run {
    let tally = Arc::new(Tally::default());
    let t = tally.clone();
    let mut b = TopologyBuilder::new("sink-test");
    b.set_spout("numbers", 1, move |_| Numbers {
        n,
        keys,
        pad,
        next: 0,
        replay,
        again: VecDeque::new(),
        tally: t.clone(),
    })
    .fields(&["key", "payload"]);
    b.set_bolt("sink", sink_tasks, move |_| {
        KinesisSink::new(cfg.clone(), FieldsEncoder::new(&["key"]).data_field("payload"))
    })
    .fields_grouping("numbers", &["key"]);
    let start = Instant::now();
    // kinesis-local takes 100-300 ms per PutRecords call: a long message timeout keeps spout
    // timeouts (replays the sink did not ask for) out of the counts
    let config = TopologyConfig { message_timeout_ms: 120_000, ..TopologyConfig::default() };
    let running = run_local(b.build().unwrap(), config).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (a, f) = (tally.acked.load(Ordering::Relaxed), tally.failed.load(Ordering::Relaxed));
        if a == n || (!replay && a + f >= n) {
            break;
        }
        assert!(Instant::now() < deadline, "timed out: acked {a}, failed {f} of {n}; {:?}", running.metrics());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    running.drain().await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), running.wait()).await.expect("drained in time").unwrap();
    Run { tally, metrics: running.metrics(), elapsed: start.elapsed() }
}

fn sink_cfg(stream: &str, endpoint: KinesisEndpoint) -> KinesisSinkConfig {
    let mut c = KinesisSinkConfig::new(stream, endpoint);
    c.linger_ms = 20;
    c.retry_min_backoff_ms = 20;
    c.retry_max_backoff_ms = 300;
    c
}

/// Every record of the stream, per shard in order: the payloads.
async fn read_all(s: &TestStream) -> Vec<Vec<String>> {
    let shards = squall::kinesis::list_shards(&s.client, &s.label(), &s.name).await.unwrap();
    let mut out = Vec::new();
    for sh in shards {
        let mut it = s
            .client
            .get_shard_iterator()
            .stream_name(&s.name)
            .shard_id(&sh.shard_id)
            .shard_iterator_type(ShardIteratorType::TrimHorizon)
            .send()
            .await
            .unwrap()
            .shard_iterator()
            .map(str::to_string);
        let mut records = Vec::new();
        while let Some(i) = it {
            let r = s.client.get_records().shard_iterator(i).limit(10_000).send().await.unwrap();
            records.extend(r.records().iter().map(|r| String::from_utf8(r.data().as_ref().to_vec()).unwrap()));
            if r.records().is_empty() && r.millis_behind_latest().unwrap_or(0) == 0 {
                break;
            }
            it = r.next_shard_iterator().map(str::to_string);
        }
        out.push(records);
    }
    out
}

/// Checks what the stream holds against what the spout produced (`n` tuples over `keys` keys):
/// every record is there, and for each key the first occurrences come in the produced order.
/// Returns the number of records read (more than `n` means duplicates, which at-least-once
/// allows after a retry whose answer was lost).
fn check_stream(shards: &[Vec<String>], n: u64, keys: u64) -> usize {
    let mut per_key: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for shard in shards {
        for p in shard {
            let mut parts = p.splitn(3, ':');
            let (k, seq) = (parts.next().unwrap(), parts.next().unwrap().parse::<u64>().unwrap());
            per_key.entry(k.to_string()).or_default().push(seq);
        }
    }
    for k in 0..keys {
        let key = format!("k{k}");
        let want = (0..n).filter(|i| i % keys == k).count() as u64;
        let seqs = per_key.get(&key).cloned().unwrap_or_default();
        let mut firsts = Vec::new();
        for s in seqs {
            if !firsts.contains(&s) {
                firsts.push(s);
            }
        }
        let expected: Vec<u64> = (0..want).collect();
        assert_eq!(firsts, expected, "key {key}: first occurrences out of order or missing");
    }
    shards.iter().map(Vec::len).sum()
}

fn counter(m: &TopologyMetrics, name: &str) -> u64 {
    m.component("sink").and_then(|c| c.counters.get(name).copied()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_arrives_in_key_order_and_every_input_is_acked() {
    let s = TestStream::create("sink-basic", 4).await;
    let (n, keys) = (1500, 50);
    let r = run(sink_cfg(&s.name, s.endpoint.clone()), n, keys, 20, 2, true).await;
    assert_eq!(r.tally.acked.load(Ordering::Relaxed), n);
    assert_eq!(r.tally.failed.load(Ordering::Relaxed), 0);
    let read = check_stream(&read_all(&s).await, n, keys);
    assert_eq!(read as u64, n, "no fault: exactly once");
    assert_eq!(counter(&r.metrics, metric::RECORDS_PUT), n);
    let calls = counter(&r.metrics, metric::PUT_CALLS);
    assert!(calls * 5 < n, "records are batched: {calls} calls for {n} records");
    eprintln!("basic: {n} records in {calls} calls, {:?}", r.elapsed);
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_partial_failures_are_retried_without_reordering() {
    let s = TestStream::create("sink-partial", 4).await;
    let plan =
        FaultPlan { partial: 0.5, partial_entries: 0.3, only_ops: vec!["PutRecords".into()], ..FaultPlan::default() };
    let proxy = FaultProxy::start(&s.endpoint.endpoint, plan).await;
    let (n, keys) = (1000, 100);
    let r = run(sink_cfg(&s.name, KinesisEndpoint::new(proxy.url(), "us-east-1")), n, keys, 20, 2, true).await;
    let c = proxy.counters();
    assert!(c.partial_calls > 0 && c.partial_entries > 0, "the proxy injected no partial failure: {c:?}");
    assert!(counter(&r.metrics, metric::RETRIED_RECORDS) >= c.partial_entries, "{:?}", r.metrics.component("sink"));
    let read = check_stream(&read_all(&s).await, n, keys);
    assert!(read as u64 >= n);
    assert_eq!(r.tally.acked.load(Ordering::Relaxed), n);
    assert_eq!(r.tally.failed.load(Ordering::Relaxed), 0);
    eprintln!(
        "partial: {} calls with {} failed entries injected; {read} records read for {n}; {:?}",
        c.partial_calls, c.partial_entries, r.elapsed
    );
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttled_calls_back_off_and_everything_arrives() {
    let s = TestStream::create("sink-throttle", 2).await;
    // First every PutRecords request is throttled, 6 in a row: with at most 2 calls in flight,
    // one call has all 3 of the SDK's attempts throttled, so the sink itself sees a throttled
    // call and backs off (at a 50 % rate alone, 3 in a row is a matter of chance). Then half of
    // the requests are throttled.
    let only = vec!["PutRecords".to_string()];
    let burst = FaultPlan { throttle: 1.0, max_faults: 6, only_ops: only.clone(), ..FaultPlan::default() };
    let proxy = Arc::new(FaultProxy::start(&s.endpoint.endpoint, burst).await);
    let p = proxy.clone();
    let switch = tokio::spawn(async move {
        while p.counters().throttled < 6 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        p.set_plan(FaultPlan { throttle: 0.5, only_ops: only, ..FaultPlan::default() });
    });
    let (n, keys) = (600, 50);
    let r = run(sink_cfg(&s.name, KinesisEndpoint::new(proxy.url(), "us-east-1")), n, keys, 20, 2, true).await;
    switch.abort();
    let c = proxy.counters();
    assert!(c.throttled > 6, "the proxy throttled no more than its first burst: {c:?}");
    // the SDK retries a throttled call itself (up to 3 attempts): the sink sees the rest
    assert!(counter(&r.metrics, metric::THROTTLED) > 0, "{:?}", r.metrics.component("sink"));
    let read = check_stream(&read_all(&s).await, n, keys);
    assert_eq!(read as u64, n, "a throttled call wrote nothing: exactly once");
    assert_eq!(r.tally.acked.load(Ordering::Relaxed), n);
    assert_eq!(r.tally.failed.load(Ordering::Relaxed), 0);
    eprintln!("throttle: {} throttled calls; {:?}", c.throttled, r.elapsed);
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_buffered_and_in_flight_stay_under_the_bound_with_a_slow_endpoint() {
    let s = TestStream::create("sink-bound", 2).await;
    let plan = FaultPlan { latency: 1.0, latency_ms: 150, only_ops: vec!["PutRecords".into()], ..FaultPlan::default() };
    let proxy = FaultProxy::start(&s.endpoint.endpoint, plan).await;
    let (n, keys, pad) = (300, 60, 1000);
    let mut cfg = sink_cfg(&s.name, KinesisEndpoint::new(proxy.url(), "us-east-1"));
    cfg.max_batch_bytes = 16 * 1024;
    cfg.max_in_flight_bytes = 32 * 1024;
    let r = run(cfg, n, keys, pad, 1, true).await;
    let sink = r.metrics.component("sink").unwrap();
    let peak = sink.histograms[metric::PENDING_BYTES].max;
    assert!(peak <= 32 * 1024, "peak {peak} bytes above the bound");
    assert!(peak > 16 * 1024, "the bound was never approached (peak {peak}): the test shows nothing");
    assert!(counter(&r.metrics, metric::BACKPRESSURE_WAITS) > 0, "{sink:?}");
    assert!(proxy.counters().delayed > 0);
    check_stream(&read_all(&s).await, n, keys);
    assert_eq!(r.tally.acked.load(Ordering::Relaxed), n);
    eprintln!("bound: peak {peak} bytes (bound 32768); {:?}", r.elapsed);
    s.delete().await;
}

/// Log lines of every test in this binary (a global subscriber; tests filter by stream name).
fn captured() -> &'static Mutex<Vec<u8>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let w = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter("squall=info")
            .with_ansi(false)
            .with_writer(move || Writer(w.clone()))
            .finish();
        let _ = tracing::subscriber::set_global_default(subscriber);
        buf
    })
}

struct Writer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Writer {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_stream_fails_the_inputs_and_says_to_create_it() {
    let logs = captured();
    let name = support::unique_name("sink-missing");
    let n = 40;
    let r = run(sink_cfg(&name, support::kinesis_endpoint()), n, 5, 10, 1, false).await;
    assert_eq!(r.tally.failed.load(Ordering::Relaxed), n, "every input failed, for the spout to replay");
    assert_eq!(r.tally.acked.load(Ordering::Relaxed), 0);
    assert_eq!(counter(&r.metrics, metric::FAILED_INPUTS), n);
    let text = String::from_utf8_lossy(&logs.lock().unwrap()).to_string();
    let line = text
        .lines()
        .find(|l| l.contains(&name) && l.contains("does not exist"))
        .unwrap_or_else(|| panic!("no log line names the missing stream {name}:\n{text}"));
    assert!(line.contains(&format!("squall stream create {name}")), "the fix is named: {line}");
    // at most once per back-off period: far fewer lines than failed inputs
    let lines = text.lines().filter(|l| l.contains(&name)).count();
    assert!(lines < n as usize, "{lines} log lines for {n} inputs");
}

/// A put gate that is open when the sink prepares and when its first call starts, and closed when
/// that call is about to be sent, as for a writer frozen in between past its ZooKeeper session;
/// from its fourth answer on it is open again under a new epoch.
#[derive(Debug, Default)]
struct FreezeBetweenStartAndSend {
    asks: AtomicU64,
}

impl squall::sink::PutGate for FreezeBetweenStartAndSend {
    fn epoch(&self) -> Option<u64> {
        match self.asks.fetch_add(1, Ordering::Relaxed) {
            0 | 1 => Some(1),
            2 => None,
            _ => Some(2),
        }
    }
}

/// The gate is asked again in the SDK's `read_before_transmit` hook: a call that started under an
/// open gate and finds it closed when its request is about to go out sends nothing (the stream
/// holds the record once, put by the replay under the new epoch, not twice), is counted, and its
/// input fails once the gate answers with a new epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_gate_closed_before_transmission_sends_nothing() {
    let s = TestStream::create("sink-gate", 1).await;
    let tally = Arc::new(Tally::default());
    let gate = Arc::new(FreezeBetweenStartAndSend::default());
    let t = tally.clone();
    let mut b = TopologyBuilder::new("sink-gate-test");
    b.set_spout("numbers", 1, move |_| Numbers {
        n: 1,
        keys: 1,
        pad: 0,
        next: 0,
        replay: true,
        again: VecDeque::new(),
        tally: t.clone(),
    })
    .fields(&["key", "payload"]);
    let (cfg, g) = (sink_cfg(&s.name, s.endpoint.clone()), gate.clone());
    b.set_bolt("sink", 1, move |_| {
        KinesisSink::new(cfg.clone(), FieldsEncoder::new(&["key"]).data_field("payload")).with_put_gate(g.clone())
    })
    .fields_grouping("numbers", &["key"]);
    let config = TopologyConfig { message_timeout_ms: 120_000, ..TopologyConfig::default() };
    let running = run_local(b.build().unwrap(), config).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while tally.acked.load(Ordering::Relaxed) < 1 {
        assert!(Instant::now() < deadline, "not acked in 60 s: {:?}", running.metrics());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    running.drain().await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), running.wait()).await.expect("drained in time").unwrap();
    let m = running.metrics();
    let refused = counter(&m, metric::REFUSED_AT_TRANSMIT);
    let failed = tally.failed.load(Ordering::Relaxed);
    let read: usize = read_all(&s).await.iter().map(Vec::len).sum();
    eprintln!(
        "gate asked {} times; refused at transmission {refused}; inputs failed {failed}; records in the stream {read}",
        gate.asks.load(Ordering::Relaxed)
    );
    assert_eq!(refused, 1, "the first call was refused at transmission");
    assert_eq!(failed, 1, "its input failed when the epoch changed, and was replayed");
    assert_eq!(read, 1, "the refused call sent nothing: the stream holds the replay's record only");
    s.delete().await;
}
