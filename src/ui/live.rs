//! The workers' live figures for the UI: each live worker that publishes a metrics address
//! (`--metrics-addr`, in its status znode) is scraped at `GET /metrics` when a topology's page
//! is rendered, all at once, each within [`SCRAPE_TIMEOUT`]; the answer is parsed with
//! `prometheus-parse` into per-shard reading figures and per-worker counters. A worker that
//! cannot be reached (refused, timed out, not a Prometheus answer) is marked unreachable with
//! the reason; the page renders the ZooKeeper data either way.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::cli::WorkerReport;

/// How long one worker's scrape may take (connect, answer, body).
pub(crate) const SCRAPE_TIMEOUT: Duration = Duration::from_millis(500);
/// The largest answer read (a worker with thousands of shards answers a few MB).
const MAX_BODY: usize = 16 << 20;

/// The HTTP client the UI scrapes with (one per process, connections pooled).
pub(crate) type Scraper = Client<HttpConnector, Empty<Bytes>>;

pub(crate) fn scraper() -> Scraper {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(SCRAPE_TIMEOUT));
    http.set_nodelay(true);
    Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(http)
}

/// What one worker's endpoint said.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum WorkerMetrics {
    /// The worker publishes no metrics address (no `--metrics-addr`).
    NotServed,
    /// Its address did not answer a scrape.
    Unreachable { addr: String, why: String },
    /// Its figures now.
    Live(Box<Live>),
}

/// A worker's figures from one scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Live {
    pub addr: String,
    /// `squall_zookeeper_connected` (absent before the session is up).
    pub zk_connected: Option<bool>,
    pub zk_requests: u64,
    pub zk_expirations: u64,
    /// Per component (summed over the worker's stages): emitted, acked, failed.
    pub components: BTreeMap<String, ComponentLive>,
    /// The shards its spout tasks own.
    pub shards: Vec<ShardLive>,
}

/// A component's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct ComponentLive {
    pub emitted: u64,
    pub acked: u64,
    pub failed: u64,
}

/// One shard as its owner's endpoint reports it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ShardLive {
    pub stream: String,
    pub shard: String,
    pub task: String,
    /// Milliseconds (from `squall_shard_behind_latest_seconds`).
    pub behind_latest_ms: Option<u64>,
    pub records_read: u64,
    pub bytes_read: u64,
    pub get_records: u64,
    pub throttles: u64,
    /// Failed reads, every kind (throttles included).
    pub read_errors: u64,
}

/// The live figures of every worker of a topology, by worker id.
#[derive(Debug, Clone, Default)]
pub(crate) struct LiveView {
    pub workers: BTreeMap<String, WorkerMetrics>,
}

impl LiveView {
    /// The figures of `shard` of `stream` from the endpoint of the worker running its owner task
    /// (`owner`, as in the shard table), with that worker's id; None when the owner's worker
    /// serves no reachable endpoint.
    pub(crate) fn shard(&self, stream: &str, shard: &str, owner: Option<&str>) -> Option<(&str, &ShardLive)> {
        let owner = owner?;
        self.workers.iter().find_map(|(id, w)| match w {
            WorkerMetrics::Live(l) => l
                .shards
                .iter()
                .find(|s| s.stream == stream && s.shard == shard && s.task == owner)
                .map(|s| (id.as_str(), s)),
            _ => None,
        })
    }
}

/// Scrapes every worker of `workers` that publishes an address, concurrently.
pub(crate) async fn scrape_workers(client: &Scraper, workers: &[WorkerReport]) -> LiveView {
    let scrapes = workers.iter().map(|w| async move {
        let m = match &w.metrics_addr {
            None => WorkerMetrics::NotServed,
            Some(addr) => match tokio::time::timeout(SCRAPE_TIMEOUT, scrape(client, addr)).await {
                Ok(Ok(live)) => WorkerMetrics::Live(Box::new(live)),
                Ok(Err(why)) => WorkerMetrics::Unreachable { addr: addr.clone(), why },
                Err(_) => WorkerMetrics::Unreachable {
                    addr: addr.clone(),
                    why: format!("no answer within {} ms", SCRAPE_TIMEOUT.as_millis()),
                },
            },
        };
        (w.worker_id.clone(), m)
    });
    LiveView { workers: futures::future::join_all(scrapes).await.into_iter().collect() }
}

async fn scrape(client: &Scraper, addr: &str) -> Result<Live, String> {
    let uri: axum::http::Uri =
        format!("http://{addr}/metrics").parse().map_err(|e| format!("{addr:?} is not a host:port ({e})"))?;
    let resp = client.get(uri).await.map_err(|e| {
        // the connector's error (refused, unreachable, timed out) is the source
        let mut why = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            why = format!("{why}: {s}");
            src = s.source();
        }
        why
    })?;
    if !resp.status().is_success() {
        return Err(format!("GET /metrics answered {}", resp.status()));
    }
    let body = Limited::new(resp.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| format!("reading the answer: {e}"))?
        .to_bytes();
    let text = std::str::from_utf8(&body).map_err(|_| "the answer is not UTF-8 text".to_string())?;
    parse(addr, text)
}

/// Parses a scrape of a worker's endpoint (docs/metrics.md names the families).
pub(crate) fn parse(addr: &str, text: &str) -> Result<Live, String> {
    use prometheus_parse::Value;
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .map_err(|e| format!("not a Prometheus text answer: {e}"))?;
    if !scrape.samples.iter().any(|s| s.metric == "squall_build_info") {
        return Err("not a Squall worker's metrics (no squall_build_info)".into());
    }
    let mut live = Live { addr: addr.to_string(), ..Live::default() };
    let mut shards: BTreeMap<(String, String, String), ShardLive> = BTreeMap::new();
    for s in &scrape.samples {
        let v = match s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
            _ => continue,
        };
        let n = if v.is_finite() && v > 0.0 { v.round() as u64 } else { 0 };
        let label = |k: &str| s.labels.get(k).unwrap_or_default().to_string();
        match s.metric.as_str() {
            "squall_zookeeper_connected" => live.zk_connected = Some(v >= 1.0),
            "squall_zookeeper_requests_total" => live.zk_requests += n,
            "squall_zookeeper_session_expirations_total" => live.zk_expirations += n,
            "squall_component_emitted_total" => live.components.entry(label("component")).or_default().emitted += n,
            "squall_component_acked_total" => live.components.entry(label("component")).or_default().acked += n,
            "squall_component_failed_total" => live.components.entry(label("component")).or_default().failed += n,
            m if m.starts_with("squall_shard_") => {
                let key = (label("stream"), label("shard"), label("task"));
                let sh = shards.entry(key.clone()).or_insert_with(|| ShardLive {
                    stream: key.0,
                    shard: key.1,
                    task: key.2,
                    ..ShardLive::default()
                });
                match m {
                    "squall_shard_behind_latest_seconds" if v.is_finite() && v >= 0.0 => {
                        sh.behind_latest_ms = Some((v * 1000.0).round() as u64)
                    }
                    "squall_shard_records_read_total" => sh.records_read = n,
                    "squall_shard_bytes_read_total" => sh.bytes_read = n,
                    "squall_shard_get_records_total" => sh.get_records = n,
                    "squall_shard_throttles_total" => sh.throttles = n,
                    "squall_shard_read_errors_total" => sh.read_errors += n,
                    _ => {}
                }
            }
            _ => {}
        }
    }
    live.shards = shards.into_values().collect();
    Ok(live)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP squall_build_info Always 1; the Squall version.
# TYPE squall_build_info gauge
squall_build_info{version=\"0.1.0\"} 1
# TYPE squall_component_emitted counter
squall_component_emitted_total{topology=\"t\",component=\"kinesis\"} 40
squall_component_emitted_total{topology=\"t.count\",component=\"kinesis\"} 2
squall_component_acked_total{topology=\"t\",component=\"kinesis\"} 39
squall_component_failed_total{topology=\"t\",component=\"kinesis\"} 1
# TYPE squall_shard_behind_latest_seconds gauge
squall_shard_behind_latest_seconds{topology=\"t\",stream=\"s\",shard=\"shardId-000000000001\",task=\"task-0000000003\"} 1.5
squall_shard_records_read_total{topology=\"t\",stream=\"s\",shard=\"shardId-000000000001\",task=\"task-0000000003\"} 40
squall_shard_throttles_total{topology=\"t\",stream=\"s\",shard=\"shardId-000000000001\",task=\"task-0000000003\"} 2
squall_shard_read_errors_total{topology=\"t\",stream=\"s\",shard=\"shardId-000000000001\",task=\"task-0000000003\",kind=\"throttled\"} 2
squall_shard_read_errors_total{topology=\"t\",stream=\"s\",shard=\"shardId-000000000001\",task=\"task-0000000003\",kind=\"transient\"} 1
squall_zookeeper_requests_total{topology=\"t\"} 77
squall_zookeeper_connected{topology=\"t\"} 1
squall_zookeeper_session_expirations_total{topology=\"t\"} 0
";

    #[test]
    fn a_scrape_becomes_shard_and_worker_figures() {
        let l = parse("h:1", TEXT).unwrap();
        assert_eq!(l.zk_connected, Some(true));
        assert_eq!((l.zk_requests, l.zk_expirations), (77, 0));
        assert_eq!(l.components["kinesis"], ComponentLive { emitted: 42, acked: 39, failed: 1 });
        assert_eq!(l.shards.len(), 1);
        let s = &l.shards[0];
        assert_eq!(
            (s.stream.as_str(), s.shard.as_str(), s.task.as_str()),
            ("s", "shardId-000000000001", "task-0000000003")
        );
        assert_eq!((s.behind_latest_ms, s.records_read, s.throttles, s.read_errors), (Some(1500), 40, 2, 3));

        let mut view = LiveView::default();
        view.workers.insert("w1".into(), WorkerMetrics::Live(Box::new(l)));
        view.workers.insert("w2".into(), WorkerMetrics::Unreachable { addr: "x:1".into(), why: "refused".into() });
        let (w, s) = view.shard("s", "shardId-000000000001", Some("task-0000000003")).unwrap();
        assert_eq!((w, s.records_read), ("w1", 40));
        // another task's shard (a former owner's figures) or no owner: nothing
        assert!(view.shard("s", "shardId-000000000001", Some("task-0000000009")).is_none());
        assert!(view.shard("s", "shardId-000000000001", None).is_none());
        assert!(view.shard("other", "shardId-000000000001", Some("task-0000000003")).is_none());
    }

    #[test]
    fn an_answer_that_is_not_a_squall_worker_is_refused() {
        assert!(parse("h:1", "hello\n").unwrap_err().contains("squall_build_info"));
        assert!(parse("h:1", "node_load1 0.5\n").unwrap_err().contains("not a Squall worker"));
    }
}
