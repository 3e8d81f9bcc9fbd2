//! The Prometheus endpoint of real workers: two audit workers read a 4-shard stream, each with
//! `--metrics-addr`, through a fault proxy that throttles GetRecords for a while once the shards
//! are spread. The test puts records, waits until all were delivered, scrapes `/metrics` over
//! HTTP, parses it with a Prometheus text parser (`prometheus-parse`) and checks the values
//! against what it did: records read over all shards == records put, spout acks == sink acks ==
//! the sink's own `deliveries` counter == deliveries, throttles reached the spout (at least one,
//! at most the proxy injected), leases held per worker == shards it owns in ZooKeeper, and every
//! family docs/metrics.md documents has samples. Also: 404 off `/metrics`, and a bad
//! `--metrics-addr` stops the worker before it connects to anything.

use squall_test_support as support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use squall::kinesis::{self, PutOptions};
use support::TestStream;
use support::faultproxy::{FaultPlan, FaultProxy};
use support::workers::{Cluster, live_tasks, owners, scratch};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One HTTP/1.1 GET: (status code, content type, body).
async fn get(port: u16, path: &str) -> std::io::Result<(u16, String, String)> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes()).await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await??;
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let ctype = head
        .lines()
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("content-type")).map(|(_, v)| v.trim()))
        .unwrap_or_default()
        .to_string();
    Ok((status, ctype, body.to_string()))
}

/// A parsed scrape.
struct Scrape {
    text: String,
    parsed: prometheus_parse::Scrape,
}

impl Scrape {
    async fn of(port: u16) -> Scrape {
        let (status, ctype, body) = get(port, "/metrics").await.expect("scraping /metrics");
        assert_eq!(status, 200, "{body}");
        assert!(ctype.starts_with("text/plain; version=0.0.4"), "content type {ctype:?}");
        let parsed =
            prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("parsing the scrape");
        // Every sample line was understood by the parser (it skips what it cannot parse):
        // count the histogram bucket lines as the parser groups them.
        let sample_lines = body.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).count();
        let parsed_lines: usize = parsed
            .samples
            .iter()
            .map(|s| match &s.value {
                prometheus_parse::Value::Histogram(b) => b.len(),
                _ => 1,
            })
            .sum();
        assert_eq!(parsed_lines, sample_lines, "the parser did not understand every sample line:\n{body}");
        Scrape { text: body, parsed }
    }

    /// Samples of metric `name` whose labels include `with`.
    fn values(&self, name: &str, with: &[(&str, &str)]) -> Vec<(BTreeMap<String, String>, f64)> {
        self.parsed
            .samples
            .iter()
            .filter(|s| s.metric == name)
            .filter(|s| with.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .filter_map(|s| {
                let v = match s.value {
                    prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => v,
                    prometheus_parse::Value::Untyped(v) => v,
                    _ => return None,
                };
                let labels = s.labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
                Some((labels, v))
            })
            .collect()
    }

    fn sum(&self, name: &str, with: &[(&str, &str)]) -> f64 {
        self.values(name, with).iter().map(|(_, v)| v).sum()
    }

    /// Histogram samples of `name` with their (le, cumulative count) buckets.
    fn histograms(&self, name: &str) -> Vec<Vec<(f64, f64)>> {
        self.parsed
            .samples
            .iter()
            .filter(|s| s.metric == name)
            .filter_map(|s| match &s.value {
                prometheus_parse::Value::Histogram(b) => Some(b.iter().map(|c| (c.less_than, c.count)).collect()),
                _ => None,
            })
            .collect()
    }

    /// Families with at least one sample (histograms by their base name).
    fn families_with_samples(&self) -> BTreeSet<String> {
        self.parsed.samples.iter().map(|s| s.metric.clone()).collect()
    }
}

/// Documented family names (docs/metrics.md table rows).
fn documented() -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md")).unwrap();
    doc.lines()
        .filter_map(|l| l.strip_prefix("| `squall_"))
        .filter_map(|l| l.split_once('`').map(|(n, _)| format!("squall_{n}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scraped_metrics_match_what_the_workers_did() {
    const PUT: u64 = 400;
    const THROTTLES: u64 = 24;
    let s = TestStream::create("metrics", 4).await;
    let dir = scratch("metrics");
    // Throttle every GetRecords (the SDK retries each call up to 3 times) for the first
    // THROTTLES requests once enabled; nothing else.
    let plan = FaultPlan {
        throttle: 1.0,
        only_ops: vec!["GetRecords".into()],
        max_faults: THROTTLES,
        active_for: Duration::from_secs(3600),
        ..FaultPlan::default()
    };
    let proxy = FaultProxy::start(&support::kinesis_endpoint().endpoint, plan).await;
    proxy.set_enabled(false);
    let cluster = Cluster::with_spout_config(
        &s.name,
        &dir,
        serde_json::json!({"retry": {"call_min_backoff_ms": 50, "call_max_backoff_ms": 500}}),
    );
    let url = proxy.url();
    let ports = [free_port(), free_port()];
    let (p1, p2) = (ports[0].to_string(), ports[1].to_string());
    let mut w1 = cluster.start_with("w1", 1, &["--endpoint", &url, "--metrics-addr", &p1]);
    let mut w2 = cluster.start_with("w2", 1, &["--endpoint", &url, "--metrics-addr", &format!("127.0.0.1:{p2}")]);
    let zk = support::zk_client().await;

    // Spread and settled: 2 tasks, 2 shards each, for a while (no handoff later resets the
    // per-shard counters).
    let start = Instant::now();
    let mut stable_since: Option<(Instant, BTreeMap<String, String>)> = None;
    loop {
        assert!(start.elapsed() < Duration::from_secs(60), "shards never settled\n{}", cluster.logs());
        let o = owners(&zk, &cluster).await;
        let t = live_tasks(&zk, &cluster).await;
        let mut per: BTreeMap<&str, usize> = BTreeMap::new();
        for x in o.values() {
            *per.entry(x.as_str()).or_default() += 1;
        }
        let spread = t.len() == 2 && o.len() == 4 && per.len() == 2 && per.values().all(|n| *n == 2);
        match (&stable_since, spread) {
            (Some((since, prev)), true) if *prev == o => {
                if since.elapsed() > Duration::from_secs(2) {
                    break;
                }
            }
            (_, true) => stable_since = Some((Instant::now(), o)),
            _ => stable_since = None,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Before any fault: the endpoint answers, 404 elsewhere.
    let (status, _, _) = get(ports[0], "/nope").await.unwrap();
    assert_eq!(status, 404);

    proxy.set_enabled(true);
    let faults = Instant::now();
    while proxy.counters().throttled < THROTTLES && faults.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    proxy.set_enabled(false);
    let injected = proxy.counters().throttled;
    assert!(injected >= 3, "too few throttles injected: {injected}");

    let opts = PutOptions { count: PUT, keys: 40, size: 64, ..PutOptions::default() };
    let report = kinesis::put_records(&s.client, &s.label(), &s.name, &opts).await.unwrap();
    let audit = cluster.wait_delivered(std::slice::from_ref(&report.manifest), Duration::from_secs(60)).await;
    assert_eq!(audit.lost, 0, "{audit:?}\n{}", cluster.logs());
    let delivered = support::workers::read_deliveries(&cluster.delivery_files()).len() as f64;

    // The counters catch up within a moment of the last delivery (acks, checkpoints).
    let deadline = Instant::now() + Duration::from_secs(15);
    let (s1, s2) = loop {
        let (a, b) = (Scrape::of(ports[0]).await, Scrape::of(ports[1]).await);
        let read = a.sum("squall_shard_records_read_total", &[]) + b.sum("squall_shard_records_read_total", &[]);
        let acked = a.sum("squall_component_acked_total", &[("component", "kinesis")])
            + b.sum("squall_component_acked_total", &[("component", "kinesis")]);
        let checkpointed = a.values("squall_shard_checkpoint_age_seconds", &[]).len()
            + b.values("squall_shard_checkpoint_age_seconds", &[]).len();
        if (read == PUT as f64 && acked == delivered && checkpointed == 4) || Instant::now() > deadline {
            break (a, b);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let both = |name: &str, with: &[(&str, &str)]| s1.sum(name, with) + s2.sum(name, with);
    let zk_owners = owners(&zk, &cluster).await;

    let read = both("squall_shard_records_read_total", &[]);
    let bytes = both("squall_shard_bytes_read_total", &[]);
    let spout_acked = both("squall_component_acked_total", &[("component", "kinesis")]);
    let sink_acked = both("squall_component_acked_total", &[("component", "sink")]);
    let user_deliveries = both("squall_component_user_counter_total", &[("component", "sink"), ("name", "deliveries")]);
    let throttles = both("squall_shard_throttles_total", &[]);
    let throttled_errors = both("squall_shard_read_errors_total", &[("kind", "throttled")]);
    let gets = both("squall_shard_get_records_total", &[]);
    let zk_requests = both("squall_zookeeper_requests_total", &[]);
    eprintln!(
        "METRICS put {PUT}, delivered {delivered}, read {read} ({bytes} bytes), acked spout {spout_acked} sink {sink_acked} \
         user counter {user_deliveries}; throttles {throttles} of {injected} injected, GetRecords {gets}; \
         ZooKeeper requests {zk_requests}; owners {zk_owners:?}"
    );
    assert_eq!(read, PUT as f64, "records read over all shards\n{}\n{}", s1.text, s2.text);
    assert!(bytes >= (PUT * 64) as f64, "bytes read {bytes}");
    assert_eq!(delivered, PUT as f64, "a duplicate delivery (no fault should cause one)");
    assert_eq!(spout_acked, delivered, "spout acks");
    assert_eq!(sink_acked, delivered, "sink acks");
    assert_eq!(user_deliveries, delivered, "the sink's own counter");
    assert!(
        throttles >= 1.0 && throttles <= injected as f64,
        "throttles seen by the spout {throttles}, injected {injected} (the SDK retries some)"
    );
    assert_eq!(throttled_errors, throttles, "read errors of kind throttled are the throttles");
    assert!(gets > 0.0 && zk_requests > 0.0);
    assert_eq!(both("squall_zookeeper_connected", &[]), 2.0);
    assert_eq!(both("squall_build_info", &[]), 2.0);
    // Leases: each worker's gauge is the number of shards its tasks own in ZooKeeper.
    for (w, sc) in [("w1", &s1), ("w2", &s2)] {
        let held = sc.values("squall_spout_leases_held", &[]);
        let tasks: BTreeSet<String> = held.iter().map(|(l, _)| l["task"].clone()).collect();
        let owned = zk_owners.values().filter(|t| tasks.contains(*t)).count();
        let gauge: f64 = held.iter().map(|(_, v)| v).sum();
        assert_eq!(
            gauge, owned as f64,
            "{w}: leases held {gauge} vs shards owned in ZooKeeper {owned} ({zk_owners:?})"
        );
        assert_eq!(owned, 2, "{w}");
    }
    // Latency histograms: cumulative, +Inf == _count == executed inputs.
    let hists = s1.histograms("squall_component_process_latency_seconds");
    assert!(!hists.is_empty());
    for h in hists.iter().chain(s2.histograms("squall_component_process_latency_seconds").iter()) {
        assert!(h.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1), "{h:?}");
        assert_eq!(h.last().map(|b| b.0), Some(f64::INFINITY));
    }
    let sink_count = both("squall_component_process_latency_seconds_count", &[("component", "sink")]);
    assert_eq!(sink_count, both("squall_component_executed_total", &[("component", "sink")]));
    // Every documented family has samples.
    let seen: BTreeSet<String> = s1.families_with_samples().union(&s2.families_with_samples()).cloned().collect();
    let docs = documented();
    assert!(docs.len() >= 20);
    let missing: Vec<&String> = docs.iter().filter(|f| !seen.contains(*f)).collect();
    assert!(missing.is_empty(), "documented but not scraped: {missing:?}\n{}", s1.text);

    assert_eq!(w1.stop(Duration::from_secs(30)), Some(0));
    assert_eq!(w2.stop(Duration::from_secs(30)), Some(0));
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_metrics_addr_stops_the_worker_before_it_connects() {
    let dir = scratch("metrics-bad");
    let cluster = Cluster::new("no-such-stream", &dir);
    // ZooKeeper and Kinesis unreachable: the flag must fail first.
    for (value, code, needle) in [("nine", 2, "--metrics-addr"), ("1.2.3.4:5", 1, "--metrics-addr 1.2.3.4:5")] {
        let (mut cmd, log) =
            cluster.worker_command(&support::workers::audit_bin(), "bad", 1, &["--metrics-addr", value]);
        cmd.env("SQUALL_ZK", "127.0.0.1:1").env("SQUALL_KINESIS_ENDPOINT", "http://127.0.0.1:1");
        let started = Instant::now();
        let status = cmd.status().unwrap();
        let out = std::fs::read_to_string(&log).unwrap();
        assert_eq!(status.code(), Some(code), "{value}: {out}");
        assert!(out.contains(needle), "{value}: the error names the flag: {out}");
        assert!(started.elapsed() < Duration::from_secs(5), "{value}: it tried to connect first");
        assert!(!out.contains("ZooKeeper connect failed"), "{value}: {out}");
    }
}
