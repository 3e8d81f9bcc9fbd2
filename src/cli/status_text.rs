//! The human output of `squall status`: a headline with the topology-wide largest
//! MillisBehindLatest, then compact tables (workers, components, each stream's shards) and the
//! shards' errors under their stream.

use comfy_table::presets::NOTHING;
use comfy_table::{CellAlignment, Table};

use super::topology::{CommittedWatermarkReport, ShardReport, StatusReport, StreamReport};

fn table(header: &[&str], right: &[usize]) -> Table {
    let mut t = Table::new();
    t.load_style(NOTHING).set_header(header.iter().copied());
    for &i in right {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    t
}

/// Indents every line of a table by two spaces (under its heading).
fn indented(t: &Table) -> String {
    t.to_string().lines().map(|l| format!("  {}", l.trim_end())).collect::<Vec<_>>().join("\n")
}

fn dash(v: Option<impl ToString>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

/// A duration in whole units: `3s`, `4m 05s`, `2h 10m`, `3d 4h`.
pub(crate) fn age(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// Every stream of the report with its shards: the source streams, then the stages'
/// intermediate streams.
fn all_streams(r: &StatusReport) -> impl Iterator<Item = &StreamReport> {
    r.streams.iter().chain(r.stages.iter().filter_map(|s| s.stream.as_ref()))
}

/// The largest MillisBehindLatest over every shard of every stream, with where it is.
pub(crate) fn max_lag(r: &StatusReport) -> Option<(i64, &str, &str)> {
    all_streams(r)
        .flat_map(|s| {
            s.shards
                .iter()
                .filter_map(move |sh| Some((sh.millis_behind_latest?, s.stream.as_str(), sh.shard_id.as_str())))
        })
        .max_by_key(|(lag, _, _)| *lag)
}

fn shard_table(s: &StreamReport) -> String {
    let mut t = table(&["SHARD", "STATE", "PARENTS", "OWNER", "LAG MS", "GETRECORDS", "CHECKPOINT"], &[4, 5]);
    for sh in &s.shards {
        t.add_row(vec![
            sh.shard_id.clone(),
            if sh.error.is_some() { format!("{} !", sh.state) } else { sh.state.clone() },
            if sh.parent_shard_ids.is_empty() { "-".into() } else { sh.parent_shard_ids.join(",") },
            dash(sh.owner.as_deref()),
            dash(sh.millis_behind_latest),
            sh.get_records_calls.to_string(),
            dash(sh.checkpoint.as_deref()),
        ]);
    }
    indented(&t)
}

fn error_line(sh: &ShardReport, now_ms: i64) -> Option<String> {
    let e = sh.error.as_ref()?;
    let kind = sh.error_kind.as_deref().unwrap_or("error");
    let fix = if sh.retryable { "retrying" } else { "not retryable: an operator must act" };
    let since = sh.error_since_ms.map(|t| format!(" for {}", age(now_ms - t))).unwrap_or_default();
    Some(format!("  ! {} {kind} ({fix}){since}: {e}", sh.shard_id))
}

fn stream_section(s: &StreamReport, heading: String, now_ms: i64, out: &mut Vec<String>) {
    let finished = s.shards.iter().filter(|sh| sh.finished).count();
    let open = s.shards.iter().filter(|sh| sh.state == "open").count();
    out.push(format!("{heading}: {} shards ({open} open, {finished} finished)", s.shards.len()));
    if let Some(e) = &s.error {
        out.push(format!("  ERROR {e}"));
    }
    match &s.committed_watermark {
        Some(CommittedWatermarkReport { watermark_ms: Some(w), .. }) => {
            let at = aws_sdk_kinesis::primitives::DateTime::from_millis(*w)
                .fmt(aws_sdk_kinesis::primitives::DateTimeFormat::DateTime)
                .unwrap_or_else(|_| w.to_string());
            out.push(format!("  committed watermark {at} ({} behind)", age(now_ms.saturating_sub(*w))));
        }
        Some(CommittedWatermarkReport { unavailable: Some(why), .. }) => {
            out.push(format!("  committed watermark unknown: {why}"));
        }
        _ => {}
    }
    if !s.shards.is_empty() {
        out.push(shard_table(s));
    }
    out.extend(s.shards.iter().filter_map(|sh| error_line(sh, now_ms)));
}

/// The whole human-readable status, as of `now_ms`.
pub(crate) fn render(r: &StatusReport, now_ms: i64) -> String {
    let mut out = Vec::new();
    out.push(format!(
        "topology {}  state {}  deployment {}  workers {}",
        r.topology,
        r.state,
        if r.deployment_id.is_empty() { "-" } else { &r.deployment_id },
        r.workers.len()
    ));
    let errors: usize = all_streams(r).map(|s| s.shards.iter().filter(|sh| sh.error.is_some()).count()).sum();
    let lag = match max_lag(r) {
        Some((ms, stream, shard)) => format!("max MillisBehindLatest {ms} ms (stream {stream} shard {shard})"),
        None => "max MillisBehindLatest - (no shard reports one)".into(),
    };
    out.push(format!("{lag}  shards with errors {errors}"));

    if !r.workers.is_empty() {
        out.push(String::new());
        let mut t = table(&["WORKER", "HOST", "PID", "TASKS", "UP", "METRICS"], &[2]);
        for w in &r.workers {
            t.add_row(vec![
                w.worker_id.clone(),
                w.host.clone(),
                w.pid.to_string(),
                w.tasks.join(","),
                age(now_ms - w.since_ms),
                // where its Prometheus endpoint is dialed (`--metrics-addr`), "-" without one
                w.metrics_addr.as_ref().map_or_else(|| "-".to_string(), |a| format!("http://{a}/metrics")),
            ]);
        }
        out.push(indented(&t));
        let cols = ["emitted", "executed", "acked", "failed", "timed_out", "pending"];
        let mut t = table(
            &["COMPONENT", "WORKER", "EMITTED", "EXECUTED", "ACKED", "FAILED", "TIMED OUT", "PENDING"],
            &[2, 3, 4, 5, 6, 7],
        );
        let mut any = false;
        for w in &r.workers {
            for (c, m) in w.components.as_object().into_iter().flatten() {
                any = true;
                let mut row = vec![c.clone(), w.worker_id.clone()];
                row.extend(cols.iter().map(|k| m[*k].as_u64().map_or_else(|| "-".into(), |v| v.to_string())));
                t.add_row(row);
            }
        }
        if any {
            out.push(String::new());
            out.push(indented(&t));
        }
        for w in &r.workers {
            if let Some(k) = &w.kpl {
                out.push(format!(
                    "  {} KPL: {} aggregates, {} user records, {} outside their shard's hash range, {} dropped in {} \
                     whole aggregates (kpl_out_of_range: drop_aggregate), {} corrupt (delivered whole)",
                    w.worker_id,
                    k.aggregates,
                    k.user_records,
                    k.out_of_range,
                    k.dropped,
                    k.dropped_aggregates,
                    k.corrupt
                ));
            }
        }
    }
    for s in &r.streams {
        out.push(String::new());
        stream_section(s, format!("stream {}", s.stream), now_ms, &mut out);
    }
    if !r.stages.is_empty() {
        out.push(String::new());
        out.push(format!("stages: {}", r.stages.len()));
        if r.workers.is_empty() {
            out.push(
                "  no live worker: stage names and counters are unknown; the intermediate streams are those ZooKeeper shows"
                    .into(),
            );
        }
        let ms = |v: Option<i64>| v.map(|m| format!("{m} ms")).unwrap_or_else(|| "-".into());
        for (i, st) in r.stages.iter().enumerate() {
            out.push(format!(
                "stage {} {}  reads {} stream {}  workers {}",
                i + 1,
                st.name.as_deref().unwrap_or("(no live worker runs it)"),
                if st.intermediate { "intermediate" } else { "source" },
                st.input_stream,
                st.workers
            ));
            out.push(format!(
                "  lag: max {}  sum {}  ({} shard(s) reporting)",
                ms(st.max_millis_behind_latest),
                ms(st.sum_millis_behind_latest),
                st.shards_with_lag
            ));
            if st.intermediate {
                out.push(format!(
                    "  control records: watermarks {}  drain markers {}  stale drain markers {}  malformed {}",
                    st.watermark_records, st.drain_markers, st.stale_drain_markers, st.malformed
                ));
            }
            if let Some(p) = st.producers {
                out.push(format!("  producers writing {}: {p}", st.input_stream));
            }
            match &st.stream {
                Some(s) => stream_section(s, format!("  intermediate stream {}", s.stream), now_ms, &mut out),
                None => out.push(format!("  (its shards are listed under stream {} above)", st.input_stream)),
            }
        }
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::topology::WorkerReport;

    fn shard(id: &str, lag: Option<i64>, error: Option<&str>) -> ShardReport {
        ShardReport {
            owner: Some("task-0000000001".into()),
            assigned_to: Some("task-0000000001".into()),
            checkpoint: Some("TRIM_HORIZON".into()),
            millis_behind_latest: lag,
            error: error.map(str::to_string),
            retryable: false,
            error_kind: error.map(|_| "access_denied".into()),
            error_since_ms: error.map(|_| 1_000),
            get_records_calls: 7,
            ..ShardReport::open_for_test(id)
        }
    }

    #[test]
    fn headline_names_the_largest_lag_and_errors_sit_under_their_stream() {
        let r = StatusReport {
            topology: "t".into(),
            state: "ACTIVE".into(),
            deployment_id: "d1".into(),
            workers: Vec::new(),
            streams: vec![StreamReport {
                stream: "s".into(),
                error: None,
                tasks: Vec::new(),
                shards: vec![
                    shard("shardId-000000000000", Some(20), None),
                    shard(
                        "shardId-000000000001",
                        Some(1500),
                        Some("AccessDenied on GetRecords; grant kinesis:GetRecords"),
                    ),
                    shard("shardId-000000000002", None, None),
                ],
                committed_watermark: None,
            }],
            stages: Vec::new(),
        };
        let text = render(&r, 66_000);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "topology t  state ACTIVE  deployment d1  workers 0");
        assert_eq!(
            lines[1],
            "max MillisBehindLatest 1500 ms (stream s shard shardId-000000000001)  shards with errors 1"
        );
        assert!(text.contains("stream s: 3 shards (3 open, 0 finished)"), "{text}");
        let row = lines.iter().find(|l| l.contains("shardId-000000000001") && l.contains("TRIM_HORIZON")).unwrap();
        assert!(row.contains("open !") && row.contains("1500"), "{row}");
        assert!(
            text.contains(
                "  ! shardId-000000000001 access_denied (not retryable: an operator must act) for 1m 05s: AccessDenied"
            ),
            "{text}"
        );
        assert_eq!(max_lag(&r), Some((1500, "s", "shardId-000000000001")));
        assert!(!text.contains("committed watermark"), "not shown when no task publishes one: {text}");
    }

    #[test]
    fn committed_watermark_shows_its_lag_or_why_it_is_unknown() {
        let stream = |w: Option<i64>, why: Option<&str>| StreamReport {
            stream: "s".into(),
            error: None,
            tasks: Vec::new(),
            shards: Vec::new(),
            committed_watermark: Some(CommittedWatermarkReport {
                watermark_ms: w,
                unavailable: why.map(str::to_string),
            }),
        };
        let mut out = Vec::new();
        stream_section(&stream(Some(60_000), None), "stream s".into(), 62_500, &mut out);
        assert_eq!(out[1], format!("  committed watermark 1970-01-01T00:01:00Z ({} behind)", age(2_500)));
        out.clear();
        let why = "stream s: task task-0000000001 reported for assignment generation 1, not the current generation 2";
        stream_section(&stream(None, Some(why)), "stream s".into(), 62_500, &mut out);
        assert_eq!(out[1], format!("  committed watermark unknown: {why}"));
    }

    #[test]
    fn workers_table_names_each_workers_metrics_endpoint() {
        let worker = |id: &str, addr: Option<&str>| WorkerReport {
            worker_id: id.into(),
            host: "h".into(),
            pid: 7,
            tasks: vec!["task-0".into()],
            since_ms: 0,
            components: serde_json::json!({}),
            kpl: None,
            metrics_addr: addr.map(str::to_string),
        };
        let r = StatusReport {
            topology: "t".into(),
            state: "ACTIVE".into(),
            deployment_id: "d1".into(),
            workers: vec![worker("w-a", Some("10.0.0.5:9464")), worker("w-b", None)],
            streams: Vec::new(),
            stages: Vec::new(),
        };
        let text = render(&r, 61_000);
        let row = |id: &str| text.lines().find(|l| l.contains(id)).unwrap_or_default().to_string();
        assert!(text.lines().any(|l| l.contains("WORKER") && l.trim_end().ends_with("METRICS")), "{text}");
        assert!(row("w-a").trim_end().ends_with("http://10.0.0.5:9464/metrics"), "{text}");
        assert!(row("w-b").trim_end().ends_with('-'), "{text}");
    }

    #[test]
    fn ages_read_in_whole_units() {
        assert_eq!(age(999), "0s");
        assert_eq!(age(61_000), "1m 01s");
        assert_eq!(age(7_260_000), "2h 01m");
        assert_eq!(age(90_000_000), "1d 1h");
    }
}
