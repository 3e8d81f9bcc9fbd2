//! The worker's Prometheus endpoint (`--metrics-addr`): `GET /metrics` in the Prometheus text
//! format (0.0.4), encoded by `prometheus-client`, served by `axum`.
//!
//! A scrape reads in-memory state only, the same the worker publishes as its status
//! (`squall status`): the engine's per-component counters and histograms
//! ([`squall_topology::MetricsHandle`]), each spout task's counters and per-shard reading status
//! ([`crate::spout::SpoutRegistry`]), and the process's ZooKeeper counters
//! ([`crate::coord::zk_counters`]). It never sends a ZooKeeper or AWS request.
//!
//! [`FAMILIES`] is the catalog: every family the endpoint exposes, always (with no sample until
//! there is something to count). docs/metrics.md documents each and the Grafana dashboard
//! (deploy/grafana/squall.json) uses only these; `tests/metrics_catalog.rs` checks both.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use squall_topology::{ComponentKind, MetricsHandle};
use tokio_util::sync::CancellationToken;

use crate::coord::{SharedSession, now_ms, zk_counters};
use crate::spout::SpoutRegistry;

/// The `Content-Type` of a scrape's answer.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The type of a metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (resets when the worker restarts, or the series' task changes).
    Counter,
    /// A value now.
    Gauge,
    /// Cumulative buckets (`_bucket{le}`, `_sum`, `_count`).
    Histogram,
}

/// One metric family of the endpoint.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    /// The exposed name (counters end in `_total`).
    pub name: &'static str,
    /// Its type.
    pub kind: Kind,
    /// Its labels.
    pub labels: &'static [&'static str],
    /// One line of help.
    pub help: &'static str,
}

const COMPONENT: &[&str] = &["topology", "component"];
const SPOUT_TASK: &[&str] = &["topology", "component", "stream", "task"];
const SHARD: &[&str] = &["topology", "stream", "shard", "task"];

/// Every family the endpoint exposes, in the order it exposes them.
pub const FAMILIES: &[Family] = &[
    Family { name: "squall_build_info", kind: Kind::Gauge, labels: &["version"], help: "Always 1; the Squall version" },
    Family {
        name: "squall_component_tasks",
        kind: Kind::Gauge,
        labels: COMPONENT,
        help: "Tasks of the component in this worker",
    },
    Family {
        name: "squall_component_emitted_total",
        kind: Kind::Counter,
        labels: COMPONENT,
        help: "Tuples emitted (one per emit call)",
    },
    Family {
        name: "squall_component_executed_total",
        kind: Kind::Counter,
        labels: COMPONENT,
        help: "Inputs executed (bolts) or next_tuple calls (spouts)",
    },
    Family {
        name: "squall_component_acked_total",
        kind: Kind::Counter,
        labels: COMPONENT,
        help: "Acked tuple trees (spouts) or acked inputs (bolts)",
    },
    Family {
        name: "squall_component_failed_total",
        kind: Kind::Counter,
        labels: COMPONENT,
        help: "Failed tuple trees (spouts, timeouts included) or failed inputs (bolts)",
    },
    Family {
        name: "squall_component_timed_out_total",
        kind: Kind::Counter,
        labels: COMPONENT,
        help: "Tuple trees failed by the message timeout (spouts)",
    },
    Family {
        name: "squall_component_errors_total",
        kind: Kind::Counter,
        labels: COMPONENT,
        help: "Errors returned or panics raised by the component's hooks",
    },
    Family {
        name: "squall_component_pending",
        kind: Kind::Gauge,
        labels: COMPONENT,
        help: "Tracked tuple trees in flight (spouts)",
    },
    Family {
        name: "squall_component_process_latency_seconds",
        kind: Kind::Histogram,
        labels: COMPONENT,
        help: "Execute latency of a bolt's inputs (timed per input batch, each input at the batch mean)",
    },
    Family {
        name: "squall_component_user_counter_total",
        kind: Kind::Counter,
        labels: &["topology", "component", "name"],
        help: "A component's own counter (TaskContext::counter), summed over its tasks",
    },
    Family {
        name: "squall_component_user_histogram",
        kind: Kind::Histogram,
        labels: &["topology", "component", "name"],
        help: "A component's own histogram (TaskContext::histogram), merged over its tasks; values in the unit it records",
    },
    Family {
        name: "squall_spout_replayed_total",
        kind: Kind::Counter,
        labels: SPOUT_TASK,
        help: "Kinesis records emitted again after a failure",
    },
    Family {
        name: "squall_spout_dead_lettered_total",
        kind: Kind::Counter,
        labels: SPOUT_TASK,
        help: "Kinesis records sent to the dead-letter stream after their replays ran out",
    },
    Family {
        name: "squall_spout_leases_held",
        kind: Kind::Gauge,
        labels: SPOUT_TASK,
        help: "Shard leases the spout task holds now",
    },
    Family {
        name: "squall_spout_kpl_aggregates_total",
        kind: Kind::Counter,
        labels: SPOUT_TASK,
        help: "Valid KPL aggregates read",
    },
    Family {
        name: "squall_spout_kpl_user_records_total",
        kind: Kind::Counter,
        labels: SPOUT_TASK,
        help: "User records taken out of KPL aggregates (delivered or dropped)",
    },
    Family {
        name: "squall_spout_kpl_out_of_range_total",
        kind: Kind::Counter,
        labels: SPOUT_TASK,
        help: "KPL user records outside the hash range of the shard they were read from (delivered unless kpl_out_of_range is drop_aggregate)",
    },
    Family {
        name: "squall_spout_kpl_dropped_total",
        kind: Kind::Counter,
        labels: SPOUT_TASK,
        help: "KPL user records dropped with their whole aggregate (kpl_out_of_range: drop_aggregate only)",
    },
    Family {
        name: "squall_spout_kpl_dropped_aggregates_total",
        kind: Kind::Counter,
        labels: SPOUT_TASK,
        help: "KPL aggregates dropped whole for holding a user record outside the shard's hash range (kpl_out_of_range: drop_aggregate only)",
    },
    Family {
        name: "squall_spout_kpl_corrupt_total",
        kind: Kind::Counter,
        labels: SPOUT_TASK,
        help: "Records with the KPL magic bytes that were not valid aggregates, delivered whole",
    },
    Family {
        name: "squall_shard_behind_latest_seconds",
        kind: Kind::Gauge,
        labels: SHARD,
        help: "The last MillisBehindLatest Kinesis reported for the shard, in seconds",
    },
    Family {
        name: "squall_shard_records_read_total",
        kind: Kind::Counter,
        labels: SHARD,
        help: "Kinesis records read from the shard by its current owner (a KPL aggregate counts once)",
    },
    Family {
        name: "squall_shard_bytes_read_total",
        kind: Kind::Counter,
        labels: SHARD,
        help: "Bytes of record data read from the shard by its current owner",
    },
    Family {
        name: "squall_shard_get_records_total",
        kind: Kind::Counter,
        labels: SHARD,
        help: "GetRecords calls for the shard by its current owner",
    },
    Family {
        name: "squall_shard_throttles_total",
        kind: Kind::Counter,
        labels: SHARD,
        help: "Reads of the shard refused by throttling (after the AWS SDK's own retries)",
    },
    Family {
        name: "squall_shard_read_errors_total",
        kind: Kind::Counter,
        labels: &["topology", "stream", "shard", "task", "kind"],
        help: "Failed reads of the shard, by error kind (throttled included)",
    },
    Family {
        name: "squall_shard_checkpoint_age_seconds",
        kind: Kind::Gauge,
        labels: SHARD,
        help: "Seconds since this worker last wrote the shard's checkpoint",
    },
    Family {
        name: "squall_zookeeper_requests_total",
        kind: Kind::Counter,
        labels: &["topology"],
        help: "Requests this worker sent to ZooKeeper",
    },
    Family {
        name: "squall_zookeeper_connected",
        kind: Kind::Gauge,
        labels: &["topology"],
        help: "1 while the worker's ZooKeeper session is healthy and connected, else 0",
    },
    Family {
        name: "squall_zookeeper_session_expirations_total",
        kind: Kind::Counter,
        labels: &["topology"],
        help: "ZooKeeper sessions of this worker that ended and were replaced",
    },
];

/// Latency bucket bounds: powers of two nanoseconds, 2^10 (about 1 us) to 2^35 (about 34 s).
/// Each of the engine's cells (4 per power of two) lies inside one of them, so the buckets are
/// exact (but for a latency of exactly a power of two, counted in the next bucket).
const LATENCY_BOUNDS_NS: std::ops::RangeInclusive<u32> = 10..=35;
/// User histogram bucket bounds: powers of two, 2^0 to 2^40.
const USER_BOUNDS: std::ops::RangeInclusive<u32> = 0..=40;

/// Parses `--metrics-addr`: a bare port listens on loopback, `host:port` is taken as given.
pub fn parse_metrics_addr(s: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse::<SocketAddr>().map_err(|_| {
        format!(
            "{s:?} is neither a port nor an IP address with a port: pass a port (9464, served on 127.0.0.1:9464) \
             or IP:PORT (0.0.0.0:9464 for every interface, [::1]:9464)"
        )
    })
}

/// Checks `--metrics-advertise`: a host name or an IP address, without a port.
pub fn parse_advertise_host(s: &str) -> Result<String, String> {
    let s = s.trim();
    let bare = s.trim_start_matches('[').trim_end_matches(']');
    let ok = !s.is_empty()
        && (bare.parse::<std::net::IpAddr>().is_ok()
            || s.split('.')
                .all(|l| !l.is_empty() && l.len() <= 63 && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')));
    if ok {
        Ok(bare.to_string())
    } else {
        Err(format!(
            "{s:?} is not a host name or IP address: pass the name or IP other machines reach this worker by \
             (e.g. the pod IP, 10.0.3.7, or worker-1.internal), without a port"
        ))
    }
}

/// The `host:port` a worker publishes for its endpoint listening on `bound` (the port really
/// bound): `advertise` when given, else the bound IP, or `hostname` when the bound IP is
/// unspecified (`0.0.0.0` or `::` cannot be dialed).
pub fn advertised_addr(bound: SocketAddr, advertise: Option<&str>, hostname: &str) -> String {
    let host = match advertise {
        Some(h) => h.to_string(),
        None if bound.ip().is_unspecified() => hostname.to_string(),
        None => bound.ip().to_string(),
    };
    if host.parse::<std::net::Ipv6Addr>().is_ok() {
        format!("[{host}]:{}", bound.port())
    } else {
        format!("{host}:{}", bound.port())
    }
}

/// What a stage of the worker exposes: its engine counters and its Kinesis spout tasks.
#[derive(Debug, Clone)]
pub struct StageSource {
    /// The stage's topology name (`T`, or `T.stage` for later stages).
    pub topology: String,
    /// The component id of the stage's Kinesis spout.
    pub spout: String,
    /// The stage's spout tasks.
    pub spouts: SpoutRegistry,
    /// The stage's engine counters.
    pub engine: MetricsHandle,
}

/// What a worker's endpoint reads; filled in as the worker starts (a scrape before that shows
/// every family without samples).
#[derive(Debug, Default)]
pub struct WorkerSource {
    topology: String,
    stages: OnceLock<Vec<StageSource>>,
    session: OnceLock<Arc<SharedSession>>,
}

impl WorkerSource {
    /// Nothing to read yet, for topology `topology`.
    pub fn new(topology: impl Into<String>) -> Self {
        WorkerSource { topology: topology.into(), ..Default::default() }
    }

    /// The worker's stages (once).
    pub fn set_stages(&self, stages: Vec<StageSource>) {
        let _ = self.stages.set(stages);
    }

    /// The worker's ZooKeeper session (once).
    pub fn set_session(&self, session: Arc<SharedSession>) {
        let _ = self.session.set(session);
    }

    /// Every sample now, by family name.
    fn gather(&self) -> BTreeMap<&'static str, Vec<(Labels, Sample)>> {
        let mut out: BTreeMap<&'static str, Vec<(Labels, Sample)>> = BTreeMap::new();
        let mut put = |name: &'static str, labels: Labels, v: Sample| out.entry(name).or_default().push((labels, v));
        put("squall_build_info", vec![("version", env!("CARGO_PKG_VERSION").to_string())], Sample::Int(1));
        let topo = || vec![("topology", self.topology.clone())];
        let zk = zk_counters();
        put("squall_zookeeper_requests_total", topo(), Sample::Int(zk.requests()));
        put("squall_zookeeper_session_expirations_total", topo(), Sample::Int(zk.expirations()));
        if let Some(s) = self.session.get() {
            put("squall_zookeeper_connected", topo(), Sample::Int(u64::from(s.connected())));
        }
        let now = now_ms();
        for stage in self.stages.get().into_iter().flatten() {
            let snapshot = stage.engine.snapshot();
            for (id, c) in &snapshot.components {
                let l = || vec![("topology", stage.topology.clone()), ("component", id.clone())];
                put("squall_component_tasks", l(), Sample::Int(c.tasks as u64));
                put("squall_component_emitted_total", l(), Sample::Int(c.emitted));
                put("squall_component_executed_total", l(), Sample::Int(c.executed));
                put("squall_component_acked_total", l(), Sample::Int(c.acked));
                put("squall_component_failed_total", l(), Sample::Int(c.failed));
                put("squall_component_timed_out_total", l(), Sample::Int(c.timed_out));
                put("squall_component_errors_total", l(), Sample::Int(c.errors));
                put("squall_component_pending", l(), Sample::Int(c.pending));
                if c.kind == ComponentKind::Bolt {
                    let lat = &c.execute_latency;
                    put(
                        "squall_component_process_latency_seconds",
                        l(),
                        Sample::Hist {
                            sum: lat.sum_ns as f64 / 1e9,
                            count: lat.count,
                            buckets: buckets(&lat.cells, LATENCY_BOUNDS_NS, 1e-9),
                        },
                    );
                }
                for (name, v) in &c.counters {
                    let mut labels = l();
                    labels.push(("name", name.clone()));
                    put("squall_component_user_counter_total", labels, Sample::Int(*v));
                }
                for (name, h) in &c.histograms {
                    let mut labels = l();
                    labels.push(("name", name.clone()));
                    let buckets = buckets(&h.cells, USER_BOUNDS, 1.0);
                    put(
                        "squall_component_user_histogram",
                        labels,
                        Sample::Hist { sum: h.sum as f64, count: h.count, buckets },
                    );
                }
            }
            for t in stage.spouts.tasks() {
                let (stream, task) = (t.stream().to_string(), t.task_name());
                let l = || {
                    vec![
                        ("topology", stage.topology.clone()),
                        ("component", stage.spout.clone()),
                        ("stream", stream.clone()),
                        ("task", task.clone()),
                    ]
                };
                let stats = t.stats();
                let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
                put("squall_spout_replayed_total", l(), Sample::Int(load(&stats.replayed)));
                put("squall_spout_dead_lettered_total", l(), Sample::Int(load(&stats.dead_lettered)));
                put("squall_spout_leases_held", l(), Sample::Int(load(&stats.leases_held)));
                let kpl = &stats.kpl;
                put("squall_spout_kpl_aggregates_total", l(), Sample::Int(load(&kpl.aggregates)));
                put("squall_spout_kpl_user_records_total", l(), Sample::Int(load(&kpl.user_records)));
                put("squall_spout_kpl_out_of_range_total", l(), Sample::Int(load(&kpl.out_of_range)));
                put("squall_spout_kpl_dropped_total", l(), Sample::Int(load(&kpl.dropped)));
                put("squall_spout_kpl_dropped_aggregates_total", l(), Sample::Int(load(&kpl.dropped_aggregates)));
                put("squall_spout_kpl_corrupt_total", l(), Sample::Int(load(&kpl.corrupt)));
                for (shard, st) in t.shards() {
                    let l = || {
                        vec![
                            ("topology", stage.topology.clone()),
                            ("stream", stream.clone()),
                            ("shard", shard.clone()),
                            ("task", task.clone()),
                        ]
                    };
                    if let Some(ms) = st.millis_behind_latest {
                        put("squall_shard_behind_latest_seconds", l(), Sample::Float(ms as f64 / 1000.0));
                    }
                    put("squall_shard_records_read_total", l(), Sample::Int(st.records_read));
                    put("squall_shard_bytes_read_total", l(), Sample::Int(st.bytes_read));
                    put("squall_shard_get_records_total", l(), Sample::Int(st.get_records_calls));
                    put("squall_shard_throttles_total", l(), Sample::Int(st.throttles));
                    for (kind, n) in &st.errors_by_kind {
                        let mut labels = l();
                        labels.push(("kind", kind.to_string()));
                        put("squall_shard_read_errors_total", labels, Sample::Int(*n));
                    }
                    if let Some(at) = st.last_checkpoint_ms {
                        let age = (now - at).max(0) as f64 / 1000.0;
                        put("squall_shard_checkpoint_age_seconds", l(), Sample::Float(age));
                    }
                }
            }
        }
        out
    }
}

type Labels = Vec<(&'static str, String)>;

#[derive(Debug)]
enum Sample {
    Int(u64),
    Float(f64),
    /// Non-cumulative buckets `(upper bound, count)`, the last at +Inf (the encoder sums them).
    Hist {
        sum: f64,
        count: u64,
        buckets: Vec<(f64, u64)>,
    },
}

/// Maps log-linear cells `(exclusive upper, count)` onto the power-of-two bounds `2^k` for k in
/// `exps`, times `scale` (e.g. 1e-9 for nanoseconds to seconds), plus +Inf.
fn buckets(cells: &[(u64, u64)], exps: std::ops::RangeInclusive<u32>, scale: f64) -> Vec<(f64, u64)> {
    let bounds: Vec<u64> = exps.map(|k| 1u64 << k).collect();
    let mut counts = vec![0u64; bounds.len() + 1];
    for &(upper, n) in cells {
        let i = bounds.partition_point(|b| *b < upper);
        counts[i] += n;
    }
    bounds.iter().map(|b| *b as f64 * scale).chain([f64::INFINITY]).zip(counts).collect()
}

/// The collector the registry calls on each scrape.
#[derive(Debug)]
struct WorkerCollector(Arc<WorkerSource>);

impl Collector for WorkerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let mut samples = self.0.gather();
        for f in FAMILIES {
            let (name, ty) = match f.kind {
                Kind::Counter => (f.name.strip_suffix("_total").unwrap_or(f.name), MetricType::Counter),
                Kind::Gauge => (f.name, MetricType::Gauge),
                Kind::Histogram => (f.name, MetricType::Histogram),
            };
            let mut m = encoder.encode_descriptor(name, f.help, None, ty)?;
            for (labels, v) in samples.remove(f.name).unwrap_or_default() {
                let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
                let mut e = m.encode_family(&labels)?;
                match (f.kind, v) {
                    (Kind::Counter, Sample::Int(v)) => e.encode_counter::<NoLabelSet, _, u64>(&v, None)?,
                    (Kind::Counter, Sample::Float(v)) => e.encode_counter::<NoLabelSet, _, f64>(&v, None)?,
                    (Kind::Gauge, Sample::Int(v)) => e.encode_gauge(&v)?,
                    (Kind::Gauge, Sample::Float(v)) => e.encode_gauge(&v)?,
                    (Kind::Histogram, Sample::Hist { sum, count, buckets }) => {
                        e.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?
                    }
                    _ => return Err(fmt::Error),
                }
            }
        }
        debug_assert!(samples.is_empty(), "samples of families missing from FAMILIES: {:?}", samples.keys());
        Ok(())
    }
}

/// The registry a worker's endpoint encodes: every family of [`FAMILIES`], read from `source`
/// on each encode.
pub fn registry(source: Arc<WorkerSource>) -> Registry {
    let mut r = Registry::default();
    r.register_collector(Box::new(WorkerCollector(source)));
    r
}

/// Encodes `registry` in the Prometheus text format.
pub fn encode(registry: &Registry) -> Result<String, fmt::Error> {
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, registry)?;
    Ok(out)
}

/// The HTTP server of the endpoint; it stops when dropped.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    cancel: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl MetricsServer {
    /// Listens on `addr` (the error names the flag and the fix) and serves `GET /metrics` from
    /// `source`; every other path is 404.
    pub async fn start(addr: SocketAddr, source: Arc<WorkerSource>) -> anyhow::Result<MetricsServer> {
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            anyhow::anyhow!(
                "--metrics-addr {addr}: cannot listen there ({e}); pick a free port or address \
                 (SQUALL_METRICS_ADDR), or leave it unset to serve no metrics"
            )
        })?;
        let addr = listener.local_addr().unwrap_or(addr);
        let registry = Arc::new(registry(source));
        let app = axum::Router::new().route("/metrics", axum::routing::get(scrape)).with_state(registry);
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await;
            if let Err(e) = served {
                tracing::warn!(error = %e, "the metrics endpoint stopped");
            }
        });
        tracing::info!(%addr, "serving Prometheus metrics on http://{addr}/metrics");
        Ok(MetricsServer { addr, cancel, task: Some(task) })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving and waits (up to 1 s) for the server task.
    pub async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), t).await;
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

async fn scrape(
    axum::extract::State(registry): axum::extract::State<Arc<Registry>>,
) -> axum::response::Response<axum::body::Body> {
    use axum::response::IntoResponse;
    match encode(&registry) {
        Ok(body) => ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response(),
        Err(_) => axum::http::StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_ports_are_loopback_and_addresses_are_kept() {
        assert_eq!(parse_metrics_addr("9464").unwrap(), "127.0.0.1:9464".parse().unwrap());
        assert_eq!(parse_metrics_addr("0.0.0.0:9100").unwrap(), "0.0.0.0:9100".parse().unwrap());
        assert_eq!(parse_metrics_addr("[::1]:9100").unwrap(), "[::1]:9100".parse().unwrap());
        for bad in ["", "x", "99999", "localhost", "1.2.3.4", "1.2.3.4:x"] {
            let e = parse_metrics_addr(bad).unwrap_err();
            assert!(e.contains("9464") && e.contains("IP:PORT"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_published_address_is_dialable() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(advertised_addr(a("127.0.0.1:9464"), None, "h1"), "127.0.0.1:9464");
        assert_eq!(advertised_addr(a("10.0.3.7:9464"), None, "h1"), "10.0.3.7:9464");
        assert_eq!(advertised_addr(a("0.0.0.0:9464"), None, "h1"), "h1:9464");
        assert_eq!(advertised_addr(a("[::]:9464"), None, "h1"), "h1:9464");
        assert_eq!(advertised_addr(a("0.0.0.0:9464"), Some("10.0.3.7"), "h1"), "10.0.3.7:9464");
        assert_eq!(advertised_addr(a("[::]:9464"), Some("fd00::7"), "h1"), "[fd00::7]:9464");
        assert_eq!(parse_advertise_host("worker-1.internal").unwrap(), "worker-1.internal");
        assert_eq!(parse_advertise_host("[fd00::7]").unwrap(), "fd00::7");
        assert_eq!(parse_advertise_host(" 10.0.3.7 ").unwrap(), "10.0.3.7");
        for bad in ["", "10.0.3.7:9464", "http://x", "a..b", "a b"] {
            let e = parse_advertise_host(bad).unwrap_err();
            assert!(e.contains("without a port"), "{bad}: {e}");
        }
    }

    #[test]
    fn cells_map_onto_cumulative_power_of_two_buckets() {
        // cells [768, 1024) and [1024, 1280) and one past the last bound
        let b = buckets(&[(1024, 3), (1280, 2), (u64::MAX, 1)], 10..=11, 1.0);
        assert_eq!(b, vec![(1024.0, 3), (2048.0, 2), (f64::INFINITY, 1)]);
        // tiny cells (upper = the value) land in the first bucket
        assert_eq!(buckets(&[(0, 1), (3, 1)], 0..=2, 1.0), vec![(1.0, 1), (2.0, 0), (4.0, 1), (f64::INFINITY, 0)]);
    }

    #[test]
    fn an_empty_source_exposes_every_family_once() {
        let text = encode(&registry(Arc::new(WorkerSource::new("t")))).unwrap();
        for f in FAMILIES {
            let ty = match f.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
                Kind::Histogram => "histogram",
            };
            assert_eq!(text.matches(&format!("# TYPE {} {ty}\n", f.name)).count(), 1, "{}\n{text}", f.name);
        }
        assert!(text.contains("squall_build_info{version=\""), "{text}");
        assert!(text.contains("squall_zookeeper_requests_total{topology=\"t\"}"), "{text}");
    }
}
