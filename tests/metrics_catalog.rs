//! The metric names cannot drift (no services needed): the families a worker's registry exposes
//! (built by the same function the worker's endpoint uses), the ones docs/metrics.md documents
//! (with their types) and the ones the Grafana dashboard (deploy/grafana/squall.json) queries;
//! and the deploy files (Kubernetes, systemd) set an endpoint where Prometheus and `squall ui` look.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use squall::metrics::{WorkerSource, encode, registry};

/// Family name -> type, from the `# TYPE` lines of an encoded empty registry.
fn registered() -> BTreeMap<String, String> {
    let text = encode(&registry(Arc::new(WorkerSource::new("t")))).unwrap();
    let types: BTreeMap<String, String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect();
    assert!(types.len() >= 20, "too few families registered: {types:?}");
    types
}

/// Every `squall_*` token of `s`.
fn metric_names(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(i) = rest.find("squall_") {
        let tail = &rest[i..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// Every string in the JSON document under a key named `expr`, `query` or `definition`.
fn queries(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr" | "query" | "definition", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => queries(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| queries(v, out)),
        _ => {}
    }
}

/// The series name a PromQL name refers to, if the registry exposes it (histograms expose
/// `_bucket`, `_sum` and `_count`).
fn resolves(name: &str, families: &BTreeMap<String, String>) -> bool {
    if let Some(ty) = families.get(name) {
        return ty != "histogram";
    }
    ["_bucket", "_sum", "_count"].iter().any(|suffix| {
        name.strip_suffix(suffix).is_some_and(|base| families.get(base).is_some_and(|t| t == "histogram"))
    })
}

#[test]
fn the_dashboard_queries_only_registered_metrics() {
    let families = registered();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana/squall.json");
    let dash: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert!(
        dash["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["type"] == "datasource" && v["query"] == "prometheus"),
        "the dashboard needs a Prometheus data source variable"
    );
    let mut exprs = Vec::new();
    queries(&dash, &mut exprs);
    assert!(exprs.len() >= 15, "{exprs:?}");
    let mut used = BTreeSet::new();
    for e in &exprs {
        for name in metric_names(e) {
            assert!(resolves(&name, &families), "the dashboard queries {name:?} (in {e:?}), which no code registers");
            used.insert(name);
        }
    }
    // panels the dashboard promises
    for needed in [
        "squall_shard_records_read_total",
        "squall_shard_behind_latest_seconds",
        "squall_component_acked_total",
        "squall_component_failed_total",
        "squall_spout_replayed_total",
        "squall_spout_dead_lettered_total",
        "squall_component_process_latency_seconds_bucket",
        "squall_shard_get_records_total",
        "squall_shard_throttles_total",
        "squall_spout_leases_held",
        "squall_zookeeper_requests_total",
        "squall_zookeeper_connected",
        "squall_component_user_counter_total",
    ] {
        assert!(used.contains(needed), "no panel queries {needed}");
    }
}

#[test]
fn docs_document_every_registered_family_with_its_type() {
    let families = registered();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md");
    let doc = std::fs::read_to_string(path).unwrap();
    // table rows: | `name` | type | labels | meaning | source |
    let documented: BTreeMap<String, String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `squall_"))
        .filter_map(|l| {
            let (name, rest) = l.split_once('`')?;
            let ty = rest.trim_start_matches([' ', '|']).split('|').next()?.trim();
            Some((format!("squall_{name}"), ty.to_string()))
        })
        .collect();
    assert_eq!(documented, families, "docs/metrics.md (left) and the registry (right) differ");
}

#[test]
fn the_names_follow_prometheus_conventions() {
    for (name, ty) in registered() {
        assert!(name.starts_with("squall_"), "{name}");
        assert_eq!(name.ends_with("_total"), ty == "counter", "{name} {ty}: counters and only counters end in _total");
        assert!(!name.contains("millis") && !name.ends_with("_ms"), "{name}: use base units (seconds)");
    }
}

/// The value after `key` (`key: value` or `KEY=value`) on the first line holding it, unquoted.
fn setting(text: &str, key: &str) -> Option<String> {
    text.lines().map(str::trim).filter(|l| !l.starts_with('#')).find_map(|l| {
        l.strip_prefix(key).map(|v| v.trim_start_matches([':', '=']).trim().trim_matches('"').to_string())
    })
}

#[test]
fn the_deploy_files_serve_metrics_where_prometheus_and_the_ui_look() {
    let root = env!("CARGO_MANIFEST_DIR");
    let k8s = std::fs::read_to_string(format!("{root}/deploy/k8s/deployment.yaml")).unwrap();
    // the worker listens on every interface of the pod, on the port the annotations and the
    // container port name, and publishes the pod IP from the downward API
    let addr = k8s
        .split("- name: SQUALL_METRICS_ADDR")
        .nth(1)
        .and_then(|r| setting(r, "value"))
        .expect("SQUALL_METRICS_ADDR in the pod's env");
    let addr = squall::metrics::parse_metrics_addr(&addr).unwrap();
    assert!(addr.ip().is_unspecified(), "{addr}: kubectl port-forward and the pod IP must both reach it");
    let port = addr.port().to_string();
    assert_eq!(setting(&k8s, "prometheus.io/port").as_deref(), Some(port.as_str()));
    assert_eq!(setting(&k8s, "prometheus.io/scrape").as_deref(), Some("true"));
    assert_eq!(setting(&k8s, "prometheus.io/path").as_deref(), Some("/metrics"));
    let ports = k8s.split("ports:").nth(1).expect("container ports");
    assert_eq!(setting(ports, "- name").as_deref(), Some("metrics"));
    assert_eq!(setting(ports, "containerPort").as_deref(), Some(port.as_str()));
    let advertise = k8s.split("- name: SQUALL_METRICS_ADVERTISE").nth(1).and_then(|r| setting(r, "value"));
    assert_eq!(advertise.as_deref(), Some("$(POD_IP)"));
    let pod_ip = k8s.split("- name: POD_IP").nth(1).expect("POD_IP in the pod's env");
    assert_eq!(setting(pod_ip, "fieldPath").as_deref(), Some("status.podIP"));
    assert!(
        k8s.find("- name: POD_IP") < k8s.find("- name: SQUALL_METRICS_ADVERTISE"),
        "$(POD_IP) expands only after it"
    );

    // systemd: a valid address (loopback by default)
    let env = std::fs::read_to_string(format!("{root}/deploy/systemd/squall-worker.env")).unwrap();
    let addr = setting(&env, "SQUALL_METRICS_ADDR").expect("SQUALL_METRICS_ADDR in squall-worker.env");
    assert!(squall::metrics::parse_metrics_addr(&addr).unwrap().ip().is_loopback(), "{addr}");
}
