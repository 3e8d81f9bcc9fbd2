//! The HTML of the web UI, rendered on the server from a [`StatusReport`] (one renderer: the live
//! script only swaps in fragments this module renders). Every value read from ZooKeeper
//! (topology names, shard ids, worker hosts, errors, ...) goes through [`esc`] (text and
//! attributes) or [`url_segment`] (links); nothing is loaded from elsewhere.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use aws_sdk_kinesis::primitives::{DateTime, DateTimeFormat};

use crate::cli::{
    CommittedWatermarkReport, ShardReport, StageReport, StatusReport, StreamReport, TopologySummary, WorkerReport,
};

use super::Action;
use super::live::{LiveView, WorkerMetrics};

/// HTML-escapes text for element content and quoted attribute values.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Percent-encodes one path segment (everything but the unreserved characters).
pub(crate) fn url_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The path of a topology's page.
pub(crate) fn topology_path(name: &str) -> String {
    format!("/topology/{}", url_segment(name))
}

/// Milliseconds since the epoch as an RFC 3339 UTC time.
fn time(ms: i64) -> String {
    DateTime::from_millis(ms).fmt(DateTimeFormat::DateTime).unwrap_or_else(|_| ms.to_string())
}

const STYLE: &str = "
body{font-family:'Liberation Sans',Arial,sans-serif;margin:0;color:#1d2330;background:#f5f6f8;font-size:14px}
header{background:#1f3a5f;color:#fff;padding:10px 20px;display:flex;gap:20px;align-items:baseline}
header a{color:#fff;text-decoration:none;font-weight:bold;font-size:18px}
header .where{color:#c8d3e3;font-size:12px}
main{padding:12px 20px}
h1{font-size:20px;margin:6px 0 10px}h2{font-size:16px;margin:18px 0 6px}h3{font-size:14px;margin:12px 0 4px}
table{border-collapse:collapse;background:#fff;margin:4px 0 10px}
th,td{border:1px solid #d5d9e0;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#e9edf3;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums}
code,.mono{font-family:'Liberation Mono',monospace;font-size:12px}
.badge{display:inline-block;padding:1px 8px;border-radius:9px;color:#fff;font-weight:bold;font-size:12px}
.s-ACTIVE{background:#2e7d32}.s-INACTIVE{background:#8d6e00}.s-DRAINING{background:#1565c0}
.s-DRAINED{background:#546e7a}.s-KILLED{background:#b71c1c}.s-none{background:#9e9e9e}
.summary span{margin-right:18px}
.err{color:#b71c1c}.muted{color:#6b7280}
.box{background:#fff;border:1px solid #d5d9e0;padding:10px 14px;margin:10px 0;max-width:900px}
.box.bad{border-color:#b71c1c;background:#fdecea}.box.good{border-color:#2e7d32;background:#edf7ed}
.actions{margin-bottom:8px}
.actions a,.actions button{display:inline-block;margin-right:8px;padding:5px 12px;border:1px solid #1f3a5f;
 border-radius:4px;background:#fff;color:#1f3a5f;text-decoration:none;font-size:13px;cursor:pointer}
.actions a.danger,.actions button.danger{border-color:#b71c1c;color:#b71c1c}
#live-status{font-size:12px}
svg.lineage{background:#fff;border:1px solid #d5d9e0;display:block;margin:4px 0 8px}
svg .node rect{stroke:#1f3a5f;stroke-width:1.2}
svg .node.open rect{fill:#e3f2e5}svg .node.closed rect{fill:#fff4d6}svg .node.finished rect{fill:#e6e8eb}
svg .node.failing rect{stroke:#b71c1c;stroke-width:2.5}
svg .node text{font-family:'Liberation Mono',monospace;font-size:11px;fill:#1d2330}
svg .node text.sub{fill:#4b5563}
svg .edge{fill:none;stroke:#5b6b82;stroke-width:1.4}
svg .legend text{font-family:'Liberation Sans',Arial,sans-serif;font-size:11px;fill:#4b5563}
";

/// The live script: fetches the fragment named by `#live[data-src]` at once and every 2 s, and
/// swaps it in (the server renders and escapes it); shows when it last succeeded.
const SCRIPT: &str = "
(function(){
  var live=document.getElementById('live');
  if(!live){return;}
  var src=live.getAttribute('data-src'), status=document.getElementById('live-status'), n=0;
  function done(){setTimeout(tick,2000);}
  function tick(){
    fetch(src,{cache:'no-store',credentials:'same-origin'}).then(function(r){
      return r.text().then(function(t){
        live.innerHTML=t; n+=1; live.setAttribute('data-updates',String(n));
        status.textContent=(r.ok?'live: updated ':'live: error at ')+new Date().toISOString()+' (every 2 s)';
        status.className=r.ok?'muted':'err';
      });
    }).catch(function(e){
      status.textContent='live: cannot reach squall ui ('+e+'); retrying every 2 s';
      status.className='err';
    }).then(done,done);
  }
  tick();
})();
";

/// A whole page. `nonce` is the response's CSP nonce for the inline style and script.
pub(crate) fn layout(title: &str, where_: &str, nonce: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
<title>{title} - Squall</title><style nonce=\"{nonce}\">{STYLE}</style></head>\
<body><header><a href=\"/\">Squall</a><span class=\"where\">{where_}</span></header><main>{body}</main>\
<script nonce=\"{nonce}\">{SCRIPT}</script></body></html>\n",
        title = esc(title),
        where_ = esc(where_),
    )
}

fn state_badge(state: Option<&str>) -> String {
    match state {
        Some(s) if matches!(s, "ACTIVE" | "INACTIVE" | "DRAINING" | "DRAINED" | "KILLED") => {
            format!("<span class=\"badge s-{s}\" data-state=\"{s}\">{s}</span>")
        }
        Some(s) => format!("<span class=\"badge s-none\" data-state=\"{0}\">{0}</span>", esc(s)),
        None => "<span class=\"badge s-none\" data-state=\"\">no state</span>".into(),
    }
}

/// The live part of `/`: the topologies with their state and deployment.
pub(crate) fn index_fragment(list: &[TopologySummary], root: &str) -> String {
    let mut h = String::new();
    if list.is_empty() {
        let _ = write!(h, "<p class=\"muted\">No topologies under <code>{}</code> yet: start a worker.</p>", esc(root));
        return h;
    }
    h.push_str("<table id=\"topologies\"><tr><th>topology</th><th>state</th><th>deployment</th></tr>");
    for t in list {
        let _ = write!(
            h,
            "<tr data-topology=\"{name}\"><td><a href=\"{href}\">{name}</a></td><td>{badge}</td><td class=\"mono\">{dep}</td></tr>",
            name = esc(&t.topology),
            href = esc(&topology_path(&t.topology)),
            badge = state_badge(t.state.as_deref()),
            dep = esc(t.deployment_id.as_deref().unwrap_or("-")),
        );
    }
    h.push_str("</table>");
    h
}

/// An error box (the message is data: escaped).
pub(crate) fn error_box(title: &str, message: &str) -> String {
    format!(
        "<div class=\"box bad\" id=\"error\"><b>{}</b><br><span class=\"mono\">{}</span></div>",
        esc(title),
        esc(message)
    )
}

/// The body of `/`.
pub(crate) fn index_page(fragment: &str) -> String {
    format!(
        "<h1>Topologies</h1><div id=\"live-status\" class=\"muted\">live: loading</div>\
<div id=\"live\" data-src=\"/live\">{fragment}</div>"
    )
}

/// The body of a topology's page: the actions, then the live part.
pub(crate) fn topology_page(name: &str, fragment: &str) -> String {
    let mut h = String::new();
    let _ = write!(h, "<h1>Topology <span id=\"topology-name\">{}</span></h1>", esc(name));
    h.push_str("<div class=\"actions\" id=\"actions\">");
    for a in Action::ALL {
        let _ = write!(
            h,
            "<a href=\"{}/confirm/{}\" class=\"{}\" data-action=\"{}\">{}</a>",
            esc(&topology_path(name)),
            a.name(),
            if a.dangerous() { "danger" } else { "" },
            a.name(),
            a.label()
        );
    }
    h.push_str("</div>");
    let _ = write!(
        h,
        "<div id=\"live-status\" class=\"muted\">live: loading</div><div id=\"live\" data-src=\"{}/live\">{fragment}</div>",
        esc(&topology_path(name))
    );
    h
}

/// The live part of a topology's page.
/// The live part of a topology's page: the ZooKeeper data of `r`, with the figures the workers'
/// metrics endpoints answered (`live`) beside it.
pub(crate) fn topology_fragment(r: &StatusReport, live: &LiveView) -> String {
    let mut h = String::new();
    let all_streams: Vec<&StreamReport> =
        r.streams.iter().chain(r.stages.iter().filter_map(|s| s.stream.as_ref())).collect();
    let max_lag = all_streams.iter().flat_map(|s| s.shards.iter()).filter_map(|sh| sh.millis_behind_latest).max();
    let shards: usize = all_streams.iter().map(|s| s.shards.len()).sum();
    let failing = all_streams.iter().flat_map(|s| s.shards.iter()).filter(|sh| sh.error.is_some()).count();
    let _ = write!(
        h,
        "<div class=\"summary\" id=\"summary\"><span>state {badge}</span><span>deployment <code id=\"deployment\">{dep}</code></span>\
<span>workers <b>{workers}</b></span><span>shards <b>{shards}</b></span>\
<span>max MillisBehindLatest <b id=\"max-lag\">{lag}</b></span><span>shards with errors <b class=\"{ecls}\">{failing}</b></span></div>",
        badge = state_badge(Some(&r.state)),
        dep = esc(if r.deployment_id.is_empty() { "-" } else { &r.deployment_id }),
        workers = r.workers.len(),
        lag = max_lag.map(|m| format!("{m} ms")).unwrap_or_else(|| "-".into()),
        ecls = if failing > 0 { "err" } else { "" },
    );
    workers(&mut h, &r.workers, live);
    for s in &r.streams {
        let _ = write!(h, "<h2>Stream <span class=\"mono\">{}</span></h2>", esc(&s.stream));
        stream(&mut h, s, live);
    }
    if !r.stages.is_empty() {
        stages(&mut h, &r.stages, r.workers.is_empty(), live);
    }
    h
}

fn workers(h: &mut String, workers: &[WorkerReport], live: &LiveView) {
    let _ = write!(h, "<h2>Workers ({})</h2>", workers.len());
    if workers.is_empty() {
        h.push_str("<p class=\"muted\">No live worker.</p>");
        return;
    }
    h.push_str("<table id=\"workers\"><tr><th>worker</th><th>host</th><th>pid</th><th>tasks</th><th>since (UTC)</th><th>components</th><th>live (its /metrics)</th></tr>");
    for w in workers {
        let _ = write!(
            h,
            "<tr data-worker=\"{id}\"><td class=\"mono\">{id}</td><td>{host}</td><td class=\"num\">{pid}</td><td class=\"mono\">{tasks}</td><td>{since}</td><td>",
            id = esc(&w.worker_id),
            host = esc(&w.host),
            pid = w.pid,
            tasks = esc(&w.tasks.join(", ")),
            since = esc(&time(w.since_ms)),
        );
        components(h, &w.components);
        if let Some(k) = &w.kpl {
            let _ = write!(
                h,
                "<div class=\"muted\">KPL: {} aggregates, {} user records, {} outside the hash range, {} dropped in {} \
                 whole aggregates, {} corrupt</div>",
                k.aggregates, k.user_records, k.out_of_range, k.dropped, k.dropped_aggregates, k.corrupt
            );
        }
        h.push_str("</td>");
        worker_live(h, live.workers.get(&w.worker_id));
        h.push_str("</tr>");
    }
    h.push_str("</table>");
}

/// A worker's cell of live figures: its ZooKeeper session and per-component counters from its
/// endpoint, or why there are none.
fn worker_live(h: &mut String, m: Option<&WorkerMetrics>) {
    match m {
        None | Some(WorkerMetrics::NotServed) => h.push_str(
            "<td data-metrics=\"none\"><span class=\"muted\">no endpoint (started without --metrics-addr)</span></td>",
        ),
        Some(WorkerMetrics::Unreachable { addr, why }) => {
            let _ = write!(
                h,
                "<td data-metrics=\"unreachable\" data-metrics-addr=\"{a}\"><b class=\"err\">unreachable</b> \
<span class=\"mono\">{a}</span><div class=\"mono muted\">{why}</div></td>",
                a = esc(addr),
                why = esc(why),
            );
        }
        Some(WorkerMetrics::Live(l)) => {
            let zk = match l.zk_connected {
                Some(true) => "<b>connected</b>",
                Some(false) => "<b class=\"err\">disconnected</b>",
                None => "<span class=\"muted\">no session yet</span>",
            };
            let _ = write!(
                h,
                "<td data-metrics=\"ok\" data-metrics-addr=\"{a}\" data-zk-connected=\"{c}\"><div class=\"mono\">{a}</div>\
<div>ZooKeeper {zk}, {req} requests, {exp} session expirations</div>",
                a = esc(&l.addr),
                c = l.zk_connected.map_or("", |c| if c { "1" } else { "0" }),
                req = l.zk_requests,
                exp = l.zk_expirations,
            );
            if !l.components.is_empty() {
                h.push_str("<table class=\"counters\"><tr><th>component</th><th>emitted</th><th>acked</th><th>failed</th></tr>");
                for (name, c) in &l.components {
                    let _ = write!(
                        h,
                        "<tr data-live-component=\"{n}\" data-acked=\"{acked}\"><td class=\"mono\">{n}</td><td class=\"num\">{emitted}</td>\
<td class=\"num\">{acked}</td><td class=\"num{fcls}\">{failed}</td></tr>",
                        n = esc(name),
                        emitted = c.emitted,
                        acked = c.acked,
                        failed = c.failed,
                        fcls = if c.failed > 0 { " err" } else { "" },
                    );
                }
                h.push_str("</table>");
            }
            h.push_str("</td>");
        }
    }
}

/// Per-component counters: one row per component, one column per numeric counter any
/// component has, and the rest (user counters, latency histograms) summed up in a last column.
fn components(h: &mut String, v: &serde_json::Value) {
    let Some(obj) = v.as_object().filter(|o| !o.is_empty()) else {
        h.push_str("<span class=\"muted\">-</span>");
        return;
    };
    let preferred = ["emitted", "executed", "acked", "failed", "timed_out", "pending"];
    let mut cols: Vec<String> = preferred.iter().map(|s| s.to_string()).collect();
    let mut extra = BTreeSet::new();
    for m in obj.values().filter_map(|m| m.as_object()) {
        extra.extend(
            m.iter().filter(|(k, v)| v.is_number() && !preferred.contains(&k.as_str())).map(|(k, _)| k.clone()),
        );
    }
    cols.extend(extra);
    cols.retain(|c| obj.values().any(|m| m.get(c).is_some_and(serde_json::Value::is_number)));
    h.push_str("<table class=\"counters\"><tr><th>component</th>");
    for c in &cols {
        let _ = write!(h, "<th>{}</th>", esc(c));
    }
    h.push_str("<th>more</th></tr>");
    for (name, m) in obj {
        let _ = write!(h, "<tr><td class=\"mono\">{}</td>", esc(name));
        for c in &cols {
            let cell = m.get(c).filter(|v| v.is_number()).map_or_else(|| "-".to_string(), |v| v.to_string());
            let _ = write!(h, "<td class=\"num\">{}</td>", esc(&cell));
        }
        let more: Vec<String> = m
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, v)| !(v.is_number() && cols.contains(k)))
            .filter_map(|(k, v)| summary(k, v))
            .collect();
        let _ = write!(h, "<td class=\"mono\">{}</td></tr>", esc(&or_dash(&more.join("; "))));
    }
    h.push_str("</table>");
}

/// A short text for a non-scalar counter: a latency histogram by its count, mean and p99; a
/// map of user counters as `name=value`; nothing for an empty one.
fn summary(name: &str, v: &serde_json::Value) -> Option<String> {
    let ms = |ns: &serde_json::Value| ns.as_f64().map(|n| format!("{:.2} ms", n / 1e6));
    match v {
        serde_json::Value::Object(o) if o.is_empty() => None,
        serde_json::Value::Object(o) if o.contains_key("p99_ns") => Some(format!(
            "{name}: n={} mean {} p99 {}",
            o.get("count").map_or_else(|| "?".into(), |c| c.to_string()),
            o.get("mean_ns").and_then(ms).unwrap_or_else(|| "?".into()),
            o.get("p99_ns").and_then(ms).unwrap_or_else(|| "?".into()),
        )),
        serde_json::Value::Object(o) => {
            let kv: Vec<String> = o
                .iter()
                .map(|(k, v)| match v {
                    serde_json::Value::Object(_) | serde_json::Value::Array(_) => summary(k, v).unwrap_or_default(),
                    v => format!("{k}={v}"),
                })
                .collect();
            Some(format!("{name}: {}", kv.join(", ")))
        }
        serde_json::Value::Null => None,
        v => Some(format!("{name}={v}")),
    }
}

fn stream(h: &mut String, s: &StreamReport, live: &LiveView) {
    if let Some(e) = &s.error {
        h.push_str(&error_box("Nothing of this stream is read", e));
    }
    let _ = write!(
        h,
        "<div class=\"muted\">live tasks reading it: <span class=\"mono\">{}</span></div>",
        esc(&if s.tasks.is_empty() { "none".to_string() } else { s.tasks.join(", ") })
    );
    match &s.committed_watermark {
        Some(CommittedWatermarkReport { watermark_ms: Some(w), .. }) => {
            let _ = write!(
                h,
                "<div class=\"muted\">committed watermark: <span class=\"mono\">{}</span></div>",
                esc(&time(*w))
            );
        }
        Some(CommittedWatermarkReport { unavailable: Some(why), .. }) => {
            let _ = write!(h, "<div class=\"muted\">committed watermark unknown: {}</div>", esc(why));
        }
        _ => {}
    }
    if s.shards.is_empty() {
        h.push_str("<p class=\"muted\">No shard list in ZooKeeper yet.</p>");
        return;
    }
    lineage(h, s);
    let children = children_of(&s.shards);
    let _ = write!(
        h,
        "<table class=\"shards\" data-stream=\"{}\"><tr><th>shard</th><th>state</th><th>parents</th><th>children</th><th>owner</th><th>assigned to</th><th>checkpoint</th><th>MillisBehindLatest</th><th>GetRecords</th>\
<th title=\"from the owner's /metrics\">live lag ms</th><th title=\"from the owner's /metrics\">records read</th>\
<th title=\"from the owner's /metrics\">throttles</th><th title=\"from the owner's /metrics: failed reads of every kind\">read errors</th><th>error</th></tr>",
        esc(&s.stream)
    );
    for sh in &s.shards {
        let kids = children.get(sh.shard_id.as_str()).map(|k| k.join(", ")).unwrap_or_default();
        let now = live.shard(&s.stream, &sh.shard_id, sh.owner.as_deref());
        let live_attrs = match now {
            Some((worker, l)) => format!(
                " data-live-from=\"{}\" data-live-records=\"{}\" data-live-throttles=\"{}\" data-live-errors=\"{}\"",
                esc(worker),
                l.records_read,
                l.throttles,
                l.read_errors
            ),
            None => String::new(),
        };
        let _ = write!(
            h,
            "<tr data-shard=\"{id}\" data-owner=\"{owner_attr}\" data-parents=\"{parents}\" data-children=\"{kids}\"{live_attrs}>\
<td class=\"mono\">{id}</td><td>{state}</td><td class=\"mono\">{parents_text}</td><td class=\"mono\">{kids_text}</td>\
<td class=\"mono\">{owner}</td><td class=\"mono\">{assigned}</td><td class=\"mono\">{cp}</td><td class=\"num\">{lag}</td><td class=\"num\">{calls}</td>{live_cells}<td>",
            id = esc(&sh.shard_id),
            owner_attr = esc(sh.owner.as_deref().unwrap_or("")),
            parents = esc(&sh.parent_shard_ids.join(" ")),
            kids = esc(&kids.replace(", ", " ")),
            state = esc(&sh.state),
            parents_text = esc(&or_dash(&sh.parent_shard_ids.join(", "))),
            kids_text = esc(&or_dash(&kids)),
            owner = esc(sh.owner.as_deref().unwrap_or("-")),
            assigned = esc(sh.assigned_to.as_deref().unwrap_or("-")),
            cp = esc(sh.checkpoint.as_deref().unwrap_or("-")),
            lag = sh.millis_behind_latest.map(|m| m.to_string()).unwrap_or_else(|| "-".into()),
            calls = sh.get_records_calls,
            live_cells = live_cells(now.map(|(_, l)| l)),
        );
        if let Some(e) = &sh.error {
            let _ = write!(
                h,
                "<div class=\"err\"><b>{kind}</b>{retry}{since}</div><div class=\"mono shard-error\">{e}</div>",
                kind = esc(sh.error_kind.as_deref().unwrap_or("error")),
                retry = if sh.retryable { " (retrying)" } else { " (not retryable: an operator must act)" },
                since = sh.error_since_ms.map(|ms| format!(" since {}", esc(&time(ms)))).unwrap_or_default(),
                e = esc(e),
            );
        } else {
            h.push_str("<span class=\"muted\">-</span>");
        }
        h.push_str("</td></tr>");
    }
    h.push_str("</table>");
}

/// The shard row's cells of its owner's live figures ("-" when its owner's worker serves no
/// reachable endpoint).
fn live_cells(l: Option<&super::live::ShardLive>) -> String {
    match l {
        None => {
            "<td class=\"num muted\" colspan=\"4\" title=\"its owner's worker serves no reachable /metrics\">-</td>"
                .into()
        }
        Some(l) => format!(
            "<td class=\"num\">{lag}</td><td class=\"num\">{rec}</td><td class=\"num{tcls}\">{thr}</td><td class=\"num{ecls}\">{err}</td>",
            lag = l.behind_latest_ms.map_or_else(|| "-".to_string(), |m| m.to_string()),
            rec = l.records_read,
            thr = l.throttles,
            err = l.read_errors,
            tcls = if l.throttles > 0 { " err" } else { "" },
            ecls = if l.read_errors > 0 { " err" } else { "" },
        ),
    }
}

fn or_dash(s: &str) -> String {
    if s.is_empty() { "-".into() } else { s.to_string() }
}

/// Each shard's children: the shards of the list naming it as a parent.
fn children_of(shards: &[ShardReport]) -> BTreeMap<&str, Vec<&str>> {
    let mut out: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for sh in shards {
        for p in &sh.parent_shard_ids {
            if let Some(parent) = shards.iter().find(|s| &s.shard_id == p) {
                out.entry(parent.shard_id.as_str()).or_default().push(sh.shard_id.as_str());
            }
        }
    }
    out
}

const NODE_W: usize = 190;
const NODE_H: usize = 44;
const COL_GAP: usize = 60;
const ROW_GAP: usize = 12;
const PAD: usize = 10;

/// The shard lineage as an SVG graph: one column per generation (a shard sits one column right
/// of its rightmost parent), parents joined to their children by curves.
fn lineage(h: &mut String, s: &StreamReport) {
    let ids: BTreeSet<&str> = s.shards.iter().map(|sh| sh.shard_id.as_str()).collect();
    // Generations: the list is in Kinesis order, but do not rely on parents coming first.
    let mut depth: BTreeMap<&str, usize> = BTreeMap::new();
    for _ in 0..s.shards.len() + 1 {
        let mut changed = false;
        for sh in &s.shards {
            let d = sh
                .parent_shard_ids
                .iter()
                .filter(|p| ids.contains(p.as_str()))
                .map(|p| depth.get(p.as_str()).map_or(1, |d| d + 1))
                .max()
                .unwrap_or(0);
            if depth.get(sh.shard_id.as_str()) != Some(&d) {
                depth.insert(sh.shard_id.as_str(), d);
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let columns = depth.values().copied().max().unwrap_or(0) + 1;
    // Rows: roots by id; later generations ordered by their parents' rows, then by id.
    let mut row: BTreeMap<&str, usize> = BTreeMap::new();
    let mut rows_per_col = vec![0usize; columns];
    for (col, count) in rows_per_col.iter_mut().enumerate() {
        let mut in_col: Vec<&ShardReport> = s.shards.iter().filter(|sh| depth[sh.shard_id.as_str()] == col).collect();
        in_col.sort_by_key(|sh| {
            let parent_row = sh.parent_shard_ids.iter().filter_map(|p| row.get(p.as_str()).copied()).min();
            (parent_row, sh.shard_id.clone())
        });
        for sh in in_col {
            row.insert(sh.shard_id.as_str(), *count);
            *count += 1;
        }
    }
    let rows = rows_per_col.iter().copied().max().unwrap_or(1);
    let pos = |id: &str| {
        let (c, r) = (depth[id], row[id]);
        (PAD + c * (NODE_W + COL_GAP), PAD + r * (NODE_H + ROW_GAP))
    };
    let width = 2 * PAD + columns * NODE_W + (columns - 1) * COL_GAP;
    let height = 2 * PAD + rows * NODE_H + (rows - 1) * ROW_GAP + 18;
    let _ = write!(
        h,
        "<svg class=\"lineage\" data-stream=\"{}\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" role=\"img\"><title>shard lineage of {}</title>",
        esc(&s.stream),
        esc(&s.stream)
    );
    for sh in &s.shards {
        for p in sh.parent_shard_ids.iter().filter(|p| ids.contains(p.as_str())) {
            let (px, py) = pos(p);
            let (cx, cy) = pos(&sh.shard_id);
            let (x1, y1, x2, y2) = (px + NODE_W, py + NODE_H / 2, cx, cy + NODE_H / 2);
            let mid = (x1 + x2) / 2;
            let _ = write!(
                h,
                "<path class=\"edge\" data-parent=\"{}\" data-child=\"{}\" d=\"M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}\"/>",
                esc(p),
                esc(&sh.shard_id)
            );
        }
    }
    for sh in &s.shards {
        let (x, y) = pos(&sh.shard_id);
        let lag = sh.millis_behind_latest.map(|m| format!(" · {m} ms")).unwrap_or_default();
        let _ = write!(
            h,
            "<g class=\"node {state}{failing}\" data-shard=\"{id}\" data-owner=\"{owner_attr}\"><title>{id} ({state_text}), owner {owner}{err}</title>\
<rect x=\"{x}\" y=\"{y}\" width=\"{NODE_W}\" height=\"{NODE_H}\" rx=\"5\"/>\
<text x=\"{tx}\" y=\"{ty1}\">{id}</text><text class=\"sub\" x=\"{tx}\" y=\"{ty2}\">{owner}{lag}</text></g>",
            state =
                if matches!(sh.state.as_str(), "open" | "closed" | "finished") { sh.state.as_str() } else { "open" },
            state_text = esc(&sh.state),
            failing = if sh.error.is_some() { " failing" } else { "" },
            id = esc(&sh.shard_id),
            owner_attr = esc(sh.owner.as_deref().unwrap_or("")),
            owner = esc(sh.owner.as_deref().unwrap_or("no owner")),
            err = sh.error.as_deref().map(|e| format!("; error: {}", esc(e))).unwrap_or_default(),
            tx = x + 8,
            ty1 = y + 17,
            ty2 = y + 34,
        );
    }
    let ly = height - 6;
    let _ = write!(
        h,
        "<g class=\"legend\"><text x=\"{PAD}\" y=\"{ly}\">green: open · yellow: closed (read to its end next) · grey: finished · red border: failing</text></g></svg>"
    );
}

fn stages(h: &mut String, stages: &[StageReport], no_worker: bool, live: &LiveView) {
    let _ = write!(h, "<h2>Stages ({})</h2>", stages.len());
    if no_worker {
        h.push_str("<p class=\"muted\">No live worker: stage names and counters are unknown; the intermediate streams are those ZooKeeper shows.</p>");
    }
    h.push_str("<table id=\"stages\"><tr><th>#</th><th>stage</th><th>reads</th><th>workers</th><th>producers</th><th>max lag ms</th><th>sum lag ms</th><th>shards with lag</th><th>watermarks</th><th>drain markers</th><th>stale drain markers</th><th>malformed</th></tr>");
    let opt = |v: Option<i64>| v.map(|m| m.to_string()).unwrap_or_else(|| "-".into());
    for (i, st) in stages.iter().enumerate() {
        let _ = write!(
            h,
            "<tr><td class=\"num\">{n}</td><td>{name}</td><td class=\"mono\">{kind} {input}</td><td class=\"num\">{workers}</td><td class=\"num\">{producers}</td>\
<td class=\"num\">{max}</td><td class=\"num\">{sum}</td><td class=\"num\">{with}</td><td class=\"num\">{wm}</td><td class=\"num\">{dm}</td><td class=\"num\">{sdm}</td><td class=\"num\">{mal}</td></tr>",
            n = i + 1,
            name = esc(st.name.as_deref().unwrap_or("(no live worker runs it)")),
            kind = if st.intermediate { "intermediate" } else { "source" },
            input = esc(&st.input_stream),
            workers = st.workers,
            producers = st.producers.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            max = opt(st.max_millis_behind_latest),
            sum = opt(st.sum_millis_behind_latest),
            with = st.shards_with_lag,
            wm = st.watermark_records,
            dm = st.drain_markers,
            sdm = st.stale_drain_markers,
            mal = st.malformed,
        );
    }
    h.push_str("</table>");
    for st in stages {
        if let Some(s) = &st.stream {
            let _ = write!(
                h,
                "<h3>Intermediate stream <span class=\"mono\">{}</span> (stage {})</h3>",
                esc(&s.stream),
                esc(st.name.as_deref().unwrap_or("?"))
            );
            stream(h, s, live);
        }
    }
}

/// The body of a confirmation page: what the action does, and a POST form carrying the token.
pub(crate) fn confirm_page(name: &str, action: Action, token: &str) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<h1>{label} topology <span class=\"mono\">{name}</span>?</h1><div class=\"box\">{what}</div>\
<form method=\"post\" action=\"{path}/{action}\" class=\"actions\" id=\"confirm\">\
<input type=\"hidden\" name=\"token\" value=\"{token}\">",
        label = action.label(),
        name = esc(name),
        what = action.explain(),
        path = esc(&topology_path(name)),
        action = action.name(),
        token = esc(token),
    );
    if let Some(hint) = action.wait_hint() {
        let _ = write!(
            h,
            "<p><label>wait (seconds, optional): <input type=\"number\" min=\"0\" max=\"3600\" name=\"wait\"></label> <span class=\"muted\">{hint}</span></p>"
        );
    }
    let _ = write!(
        h,
        "<button type=\"submit\" class=\"{cls}\" id=\"confirm-button\">{label} {name}</button> <a href=\"{path}\">Cancel</a></form>",
        cls = if action.dangerous() { "danger" } else { "" },
        label = action.label(),
        name = esc(name),
        path = esc(&topology_path(name)),
    );
    h
}

/// The body of an action's result page.
pub(crate) fn result_page(name: &str, action: Action, outcome: &Result<Vec<(bool, String)>, String>) -> String {
    let mut h = String::new();
    let _ = write!(h, "<h1>{} topology <span class=\"mono\">{}</span></h1>", action.label(), esc(name));
    match outcome {
        Ok(lines) => {
            h.push_str("<div class=\"box good\" id=\"result\" data-ok=\"true\">");
            for (warn, line) in lines {
                let _ = write!(h, "<div class=\"mono{}\">{}</div>", if *warn { " err" } else { "" }, esc(line));
            }
            h.push_str("</div>");
        }
        Err(e) => {
            let _ = write!(
                h,
                "<div class=\"box bad\" id=\"result\" data-ok=\"false\"><b>{} failed</b><br><span class=\"mono\">{}</span></div>",
                action.label(),
                esc(e)
            );
        }
    }
    let _ = write!(h, "<p><a href=\"{}\">Back to the topology</a></p>", esc(&topology_path(name)));
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::ShardReport;

    fn shard(id: &str, parents: &[&str], owner: Option<&str>) -> ShardReport {
        ShardReport {
            parent_shard_ids: parents.iter().map(|p| p.to_string()).collect(),
            owner: owner.map(str::to_string),
            millis_behind_latest: Some(5),
            ..ShardReport::open_for_test(id)
        }
    }

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(esc("<a href=\"x\">'&'</a>"), "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
        assert_eq!(url_segment("a b/<c>"), "a%20b%2F%3Cc%3E");
        assert_eq!(topology_path("wc-1_x.y~"), "/topology/wc-1_x.y~");
    }

    #[test]
    fn hostile_values_from_zookeeper_are_escaped_everywhere() {
        let evil = "<script>alert(1)</script>\"'";
        let mut sh = shard(evil, &[evil], Some(evil));
        sh.error = Some(evil.into());
        sh.error_kind = Some(evil.into());
        sh.checkpoint = Some(evil.into());
        let r = StatusReport {
            topology: evil.into(),
            state: evil.into(),
            deployment_id: evil.into(),
            workers: vec![WorkerReport {
                worker_id: evil.into(),
                host: evil.into(),
                pid: 1,
                tasks: vec![evil.into()],
                since_ms: 0,
                components: serde_json::json!({ evil: { "emitted": evil, evil: 1 } }),
                kpl: None,
                metrics_addr: Some(evil.into()),
            }],
            streams: vec![StreamReport {
                stream: evil.into(),
                error: Some(evil.into()),
                tasks: vec![evil.into()],
                shards: vec![sh],
                committed_watermark: Some(CommittedWatermarkReport {
                    watermark_ms: None,
                    unavailable: Some(evil.into()),
                }),
            }],
            stages: Vec::new(),
        };
        let mut live = LiveView::default();
        live.workers.insert(evil.into(), WorkerMetrics::Unreachable { addr: evil.into(), why: evil.into() });
        let html = topology_fragment(&r, &live)
            + &topology_page(evil, "")
            + &index_fragment(
                &[TopologySummary {
                    topology: evil.into(),
                    state: Some(evil.into()),
                    deployment_id: Some(evil.into()),
                }],
                evil,
            )
            + &confirm_page(evil, Action::Kill, "t")
            + &result_page(evil, Action::Kill, &Err(evil.into()))
            + &result_page(evil, Action::Kill, &Ok(vec![(true, evil.into())]));
        assert!(!html.contains("<script"), "{html}");
        assert!(!html.contains("\"'"), "an unescaped quote: {html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    }

    #[test]
    fn component_counters_show_numbers_as_columns_and_sum_up_the_rest() {
        let v = serde_json::json!({
            "sink": {"emitted": 0, "acked": 70, "counters": {}, "errors": 2,
                     "execute_latency": {"count": 70, "mean_ns": 210024, "p99_ns": 466625, "max_ns": 500000}},
            "count": {"acked": 5, "counters": {"words": 12}}
        });
        let mut h = String::new();
        components(&mut h, &v);
        assert!(
            h.contains("<th>acked</th>") && h.contains("<th>errors</th>") && !h.contains("<th>counters</th>"),
            "{h}"
        );
        assert!(h.contains("execute_latency: n=70 mean 0.21 ms p99 0.47 ms"), "{h}");
        assert!(h.contains("counters: words=12"), "{h}");
    }

    #[test]
    fn lineage_places_children_right_of_parents_and_draws_each_edge() {
        let s = StreamReport {
            stream: "s".into(),
            error: None,
            tasks: vec![],
            // children listed before their parent: the layout must not depend on the order
            shards: vec![
                shard("c1", &["p"], Some("task-1")),
                shard("c2", &["p"], None),
                shard("p", &[], Some("task-0")),
                shard("m", &["c1", "c2"], None),
            ],
            committed_watermark: None,
        };
        let mut h = String::new();
        lineage(&mut h, &s);
        for (p, c) in [("p", "c1"), ("p", "c2"), ("c1", "m"), ("c2", "m")] {
            assert!(h.contains(&format!("data-parent=\"{p}\" data-child=\"{c}\"")), "edge {p}->{c}: {h}");
        }
        assert_eq!(h.matches("class=\"edge\"").count(), 4);
        let x_of = |id: &str| {
            let at = h.find(&format!("data-shard=\"{id}\"")).unwrap();
            let rest = &h[at..];
            let x = rest.find("<rect x=\"").unwrap() + 9;
            rest[x..].split('"').next().unwrap().parse::<usize>().unwrap()
        };
        assert!(x_of("p") < x_of("c1") && x_of("c1") == x_of("c2") && x_of("c2") < x_of("m"));
    }
}
