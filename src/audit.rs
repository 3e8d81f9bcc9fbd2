//! End-to-end audit: compare what producers wrote (manifests of `squall stream put`) with what a
//! topology delivered (delivery logs of `examples/audit.rs`): produced, delivered, lost,
//! duplicates, and per-key order violations.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::kinesis::payload::{AuditPayload, Manifest};
use squall_topology::{Bolt, BoltOutput, ComponentError, TaskContext, Tuple};

/// A shared, append-only JSON-lines file of deliveries. Each line is one `write` on an O_APPEND
/// file, so it survives a SIGKILL of the process once `execute` returned (and the tuple was acked).
#[derive(Clone, Debug)]
pub struct DeliveryLog(Arc<Mutex<std::fs::File>>);

impl DeliveryLog {
    /// Opens (creates) the file for appending.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| anyhow::anyhow!("opening the delivery log {}: {e}", path.display()))?;
        Ok(Self(Arc::new(Mutex::new(f))))
    }

    /// Appends one JSON value as a line.
    pub fn append(&self, value: &impl Serialize) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(value).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let mut f = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f.write_all(&line)
    }
}

/// A bolt that records every Kinesis spout tuple carrying an [`AuditPayload`] in a
/// [`DeliveryLog`] before acking it. Subscribe it to the spout (fields grouping on
/// `partition_key` keeps each key on one task).
pub struct DeliverySink {
    log: DeliveryLog,
    worker: String,
}

impl DeliverySink {
    /// A sink writing to `log`, naming `worker` in each line.
    pub fn new(log: DeliveryLog, worker: impl Into<String>) -> Self {
        Self { log, worker: worker.into() }
    }

    /// Parses the tuple's payload; the error says what is wrong.
    pub fn payload(t: &Tuple) -> Result<AuditPayload, ComponentError> {
        let data = t.get_bytes("data")?;
        serde_json::from_slice(&data).map_err(|e| {
            ComponentError::fatal(format!(
                "record {} of shard {} is not an audit payload (written by `squall stream put`): {e}",
                t.get_str("sequence_number").unwrap_or("?"),
                t.get_str("shard_id").unwrap_or("?")
            ))
        })
    }

    /// Records one delivery.
    pub fn record(&self, t: &Tuple, p: AuditPayload) -> Result<(), ComponentError> {
        let d = Delivery {
            run: p.run,
            key: p.key,
            seq: p.seq,
            shard: t.get_str("shard_id")?.to_string(),
            sequence: t.get_str("sequence_number")?.to_string(),
            sub_sequence: t.get_u64("sub_sequence")?,
            stream: t.get_str("stream").map(str::to_string).unwrap_or_default(),
            worker: self.worker.clone(),
            arrival_ms: t.get_i64("arrival_ms").unwrap_or(0),
            t_us: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_micros() as i64)
                .unwrap_or(0),
        };
        self.log.append(&d).map_err(|e| ComponentError::retryable(format!("writing the delivery log: {e}")))
    }
}

impl Bolt for DeliverySink {
    async fn prepare(&mut self, ctx: &TaskContext) -> Result<(), ComponentError> {
        self.worker = format!("{}#{}", self.worker, ctx.task_index());
        Ok(())
    }

    async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        let p = Self::payload(&t)?;
        self.record(&t, p)
    }
}

/// One delivery, as the audit sink writes it (one JSON object per line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// Producer run id.
    pub run: String,
    /// Partition key.
    pub key: String,
    /// Per-key sequence number from the producer.
    pub seq: u64,
    /// Shard it was read from.
    pub shard: String,
    /// Kinesis sequence number.
    pub sequence: String,
    /// KPL sub-sequence (the user record's index in its aggregate; 0 for plain records).
    #[serde(default)]
    pub sub_sequence: u64,
    /// Stream it was read from (the tuple's `stream` field; empty in older logs).
    #[serde(default)]
    pub stream: String,
    /// Worker that delivered it.
    pub worker: String,
    /// The record's approximate arrival time in Kinesis (ms since the epoch; 0 in older logs):
    /// `t_us / 1000 - arrival_ms` is the record's end-to-end lag.
    #[serde(default)]
    pub arrival_ms: i64,
    /// Microseconds since the epoch at delivery.
    pub t_us: i64,
}

/// The audit's verdict.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditReport {
    /// Records the manifests say were written.
    pub produced: u64,
    /// Delivery lines of those runs (duplicates included).
    pub delivered: u64,
    /// Distinct records delivered.
    pub distinct: u64,
    /// Records written and never delivered.
    pub lost: u64,
    /// Deliveries beyond the first of a record.
    pub duplicates: u64,
    /// First deliveries of a key that came after a later sequence of the same key.
    pub order_violations: u64,
    /// Deliveries of runs no manifest names (ignored).
    pub foreign: u64,
    /// Up to 10 lost records, `run/key/seq`.
    pub lost_examples: Vec<String>,
    /// Up to 10 order violations, `run/key: seq after later`.
    pub order_examples: Vec<String>,
}

/// Reads manifests and delivery logs and compares them.
pub fn audit(manifests: &[impl AsRef<Path>], deliveries: &[impl AsRef<Path>]) -> anyhow::Result<AuditReport> {
    let mut ms = Vec::new();
    for p in manifests {
        let p = p.as_ref();
        let text = std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("reading manifest {}: {e}", p.display()))?;
        let m: Manifest = serde_json::from_str(&text).map_err(|e| {
            anyhow::anyhow!("manifest {} is not a `squall stream put --manifest` file: {e}", p.display())
        })?;
        ms.push(m);
    }
    let mut ds = Vec::new();
    for p in deliveries {
        let p = p.as_ref();
        let f = std::fs::File::open(p).map_err(|e| anyhow::anyhow!("reading deliveries {}: {e}", p.display()))?;
        for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            // A worker killed mid-write can leave a torn last line: skip it, say so.
            match serde_json::from_str::<Delivery>(&line) {
                Ok(d) => ds.push(d),
                Err(e) => {
                    tracing::warn!(file = %p.display(), line = i + 1, error = %e, "skipping a malformed delivery line")
                }
            }
        }
    }
    Ok(compare(&ms, ds))
}

/// Compares manifests with deliveries (any order; sorted by time here).
pub fn compare(manifests: &[Manifest], mut deliveries: Vec<Delivery>) -> AuditReport {
    let mut r = AuditReport::default();
    let mut expected: HashMap<(&str, &str), u64> = HashMap::new();
    for m in manifests {
        for (k, c) in &m.counts {
            *expected.entry((m.run.as_str(), k.as_str())).or_default() += c;
            r.produced += c;
        }
    }
    deliveries.sort_by_key(|d| d.t_us);
    let runs: HashSet<&str> = manifests.iter().map(|m| m.run.as_str()).collect();
    let mut seen: HashSet<(String, String, u64)> = HashSet::new();
    let mut max_first: HashMap<(String, String), u64> = HashMap::new();
    for d in &deliveries {
        if !runs.contains(d.run.as_str()) {
            r.foreign += 1;
            continue;
        }
        r.delivered += 1;
        if !seen.insert((d.run.clone(), d.key.clone(), d.seq)) {
            r.duplicates += 1;
            continue;
        }
        let hi = max_first.entry((d.run.clone(), d.key.clone())).or_insert(d.seq);
        if d.seq < *hi {
            r.order_violations += 1;
            if r.order_examples.len() < 10 {
                r.order_examples.push(format!("{}/{}: {} after {}", d.run, d.key, d.seq, hi));
            }
        } else {
            *hi = d.seq;
        }
    }
    r.distinct = seen.len() as u64;
    let mut lost_by_key: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
    for ((run, key), count) in &expected {
        for s in 0..*count {
            if !seen.contains(&(run.to_string(), key.to_string(), s)) {
                r.lost += 1;
                lost_by_key.entry((run.to_string(), key.to_string())).or_default().push(s);
            }
        }
    }
    r.lost_examples =
        lost_by_key.iter().flat_map(|((run, k), v)| v.iter().map(move |s| format!("{run}/{k}/{s}"))).take(10).collect();
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(key: &str, seq: u64, t: i64) -> Delivery {
        Delivery {
            run: "r".into(),
            key: key.into(),
            seq,
            shard: "s".into(),
            sequence: "1".into(),
            sub_sequence: 0,
            stream: String::new(),
            worker: "w".into(),
            arrival_ms: 0,
            t_us: t,
        }
    }

    #[test]
    fn counts_loss_duplicates_and_order() {
        let m = Manifest {
            run: "r".into(),
            stream: "s".into(),
            counts: [("a".into(), 3), ("b".into(), 2)].into(),
            total: 5,
        };
        let ds = vec![d("a", 0, 1), d("a", 2, 2), d("a", 1, 3), d("a", 2, 4), d("b", 0, 5), d("x", 0, 6)];
        let mut foreign = d("a", 0, 7);
        foreign.run = "other".into();
        let mut all = ds;
        all.push(foreign);
        let r = compare(&[m], all);
        assert_eq!(r.produced, 5);
        assert_eq!(r.duplicates, 1);
        assert_eq!(r.order_violations, 1, "a/1 first delivered after a/2");
        assert_eq!(r.lost, 1, "b/1 never delivered ({:?})", r.lost_examples);
        assert_eq!(r.lost_examples, vec!["r/b/1".to_string()]);
        assert_eq!(r.foreign, 1);
        // x/0 is in no manifest count but its run is known: delivered, not lost, not expected.
        assert_eq!(r.distinct, 5);
    }
}

/// What `squall audit --counts` found: per-key counts in the state table against the manifests.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CountsReport {
    /// Keys in the manifests or the table.
    pub keys: usize,
    /// Records the manifests say were written.
    pub expected_total: u64,
    /// Sum of the counts in the table.
    pub counted_total: u64,
    /// Keys whose count differs.
    pub mismatched: usize,
    /// Keys counted more often than written (duplicates applied).
    pub over: usize,
    /// Keys counted less often than written (records lost).
    pub under: usize,
    /// Up to 10 mismatches: (key, expected, counted).
    pub examples: Vec<(String, u64, u64)>,
}

/// Compares the per-key counts `component` of `topology` keeps in the state table (each item's
/// state a JSON number) with the manifests' per-key record counts.
pub async fn audit_counts(
    manifests: &[std::path::PathBuf],
    ep: &crate::state::StateEndpoint,
    topology: &str,
    component: &str,
) -> anyhow::Result<CountsReport> {
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for path in manifests {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading the manifest {}: {e}", path.display()))?;
        let m: Manifest = serde_json::from_str(&text).map_err(|e| {
            anyhow::anyhow!("the manifest {} is not a `squall stream put` manifest: {e}", path.display())
        })?;
        for (k, n) in m.counts {
            *expected.entry(k).or_default() += n;
        }
    }
    let store = crate::state::StateStore::new(ep.client().await?, ep.table.clone());
    let scope = crate::state::scope(topology, component);
    let mut counted: BTreeMap<String, u64> = BTreeMap::new();
    for (key, _, state) in store.scan_scope(&scope).await? {
        let n: u64 = serde_json::from_slice(&state).map_err(|e| {
            anyhow::anyhow!("the state of key `{key}` in table `{}` (scope {scope}) is not a count: {e}", ep.table)
        })?;
        counted.insert(key, n);
    }
    let keys: HashSet<&String> = expected.keys().chain(counted.keys()).collect();
    let mut r = CountsReport {
        keys: keys.len(),
        expected_total: expected.values().sum(),
        counted_total: counted.values().sum(),
        mismatched: 0,
        over: 0,
        under: 0,
        examples: Vec::new(),
    };
    let mut keys: Vec<&String> = keys.into_iter().collect();
    keys.sort();
    for k in keys {
        let (e, c) = (expected.get(k).copied().unwrap_or(0), counted.get(k).copied().unwrap_or(0));
        if e != c {
            r.mismatched += 1;
            if c > e {
                r.over += 1;
            } else {
                r.under += 1;
            }
            if r.examples.len() < 10 {
                r.examples.push((k.clone(), e, c));
            }
        }
    }
    Ok(r)
}

/// What `squall audit --windows` found: the windows fired into a results stream against the true
/// per-window counts of the input stream.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WindowsReport {
    /// Records of the input stream (every shard, closed ones too).
    pub records: u64,
    /// Windows the input's records fall in (`{partition key}@{window start}`).
    pub windows: usize,
    /// Distinct windows in the results stream.
    pub fired: usize,
    /// Windows of the input with no result.
    pub missing: usize,
    /// Windows whose result (any of its copies) has another count than the input's.
    pub wrong: usize,
    /// Results for windows the input does not have.
    pub unknown: usize,
    /// Windows put more than once (each copy with the same count: a firing replayed, which a
    /// consumer deduplicates by `fire_key`).
    pub put_more_than_once: usize,
    /// Up to 10 differences: (window, true count, the counts fired).
    pub examples: Vec<(String, u64, Vec<u64>)>,
}

impl WindowsReport {
    /// True when every window fired, each with its true count only, and nothing else fired.
    pub fn exact(&self) -> bool {
        self.missing == 0 && self.wrong == 0 && self.unknown == 0
    }
}

/// Every record of `stream`, read from TRIM_HORIZON on every shard (closed ones to their end,
/// open ones up to their tip), shard after shard. For audits, tests and tools, not the data path.
pub async fn read_stream(
    client: &aws_sdk_kinesis::Client,
    label: &str,
    stream: &str,
) -> anyhow::Result<Vec<aws_sdk_kinesis::types::Record>> {
    let mut out = Vec::new();
    for shard in crate::kinesis::list_shards(client, label, stream).await? {
        let mut it = client
            .get_shard_iterator()
            .stream_name(stream)
            .shard_id(&shard.shard_id)
            .shard_iterator_type(aws_sdk_kinesis::types::ShardIteratorType::TrimHorizon)
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("GetShardIterator of stream {stream} shard {}: {e:?}", shard.shard_id))?
            .shard_iterator;
        while let Some(i) = it.take() {
            let r = client
                .get_records()
                .shard_iterator(i)
                .limit(10_000)
                .send()
                .await
                .map_err(|e| anyhow::anyhow!("GetRecords of stream {stream} shard {}: {e:?}", shard.shard_id))?;
            let caught_up = r.records().is_empty() && r.millis_behind_latest().unwrap_or(0) == 0;
            out.extend(r.records().iter().cloned());
            if caught_up {
                break;
            }
            it = r.next_shard_iterator().map(String::from);
        }
    }
    Ok(out)
}

/// The true per-window record counts of an input stream: `{partition key}@{window start}` by
/// each record's approximate arrival time, as `examples/exactly_once_counts.rs --window-ms` keys
/// its windows.
pub async fn window_truth(
    client: &aws_sdk_kinesis::Client,
    label: &str,
    stream: &str,
    window_ms: u64,
) -> anyhow::Result<BTreeMap<String, u64>> {
    anyhow::ensure!(window_ms > 0, "--window-ms must be at least 1");
    let mut out = BTreeMap::new();
    for r in read_stream(client, label, stream).await? {
        let at = r.approximate_arrival_timestamp().and_then(|t| t.to_millis().ok()).unwrap_or(0);
        let at = u64::try_from(at).unwrap_or(0);
        *out.entry(format!("{}@{}", r.partition_key(), at - at % window_ms)).or_default() += 1;
    }
    Ok(out)
}

/// The fired windows in a results stream (records of `exactly_once_counts --fire-to`: JSON with
/// `fire_key` and `count`): window -> the counts of its copies. A record that is not such JSON is
/// an error naming the stream, the shard and the sequence number.
pub async fn fired_windows(
    client: &aws_sdk_kinesis::Client,
    label: &str,
    stream: &str,
) -> anyhow::Result<BTreeMap<String, Vec<u64>>> {
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for r in read_stream(client, label, stream).await? {
        let v: serde_json::Value = serde_json::from_slice(r.data().as_ref()).unwrap_or_default();
        let (Some(key), Some(count)) = (v["fire_key"].as_str(), v["count"].as_u64()) else {
            anyhow::bail!(
                "record {} of stream {stream} is not a fired window (JSON with fire_key and count, as \
                 exactly_once_counts --fire-to writes): check --fired",
                r.sequence_number()
            );
        };
        out.entry(key.to_string()).or_default().push(count);
    }
    Ok(out)
}

/// Compares true per-window counts with the fired windows.
pub fn compare_windows(truth: &BTreeMap<String, u64>, fired: &BTreeMap<String, Vec<u64>>) -> WindowsReport {
    let mut r = WindowsReport {
        records: truth.values().sum(),
        windows: truth.len(),
        fired: fired.len(),
        put_more_than_once: fired.values().filter(|c| c.len() > 1).count(),
        ..WindowsReport::default()
    };
    for (w, n) in truth {
        let bad = match fired.get(w) {
            None => {
                r.missing += 1;
                true
            }
            Some(c) if c.iter().any(|c| c != n) => {
                r.wrong += 1;
                true
            }
            Some(_) => false,
        };
        if bad && r.examples.len() < 10 {
            r.examples.push((w.clone(), *n, fired.get(w).cloned().unwrap_or_default()));
        }
    }
    for (w, c) in fired {
        if !truth.contains_key(w) {
            r.unknown += 1;
            if r.examples.len() < 10 {
                r.examples.push((w.clone(), 0, c.clone()));
            }
        }
    }
    r
}

#[cfg(test)]
mod windows_tests {
    use super::*;

    #[test]
    fn missing_wrong_unknown_and_replayed_windows() {
        let truth: BTreeMap<String, u64> =
            [("a@0", 3), ("a@1000", 2), ("b@0", 1), ("c@0", 4)].map(|(k, n)| (k.to_string(), n)).into();
        let fired: BTreeMap<String, Vec<u64>> = [
            ("a@0", vec![3, 3]), // put twice, same count: fine
            ("a@1000", vec![2]),
            ("b@0", vec![1, 2]), // a copy with another count: wrong
            ("x@0", vec![1]),    // unknown
        ]
        .map(|(k, n)| (k.to_string(), n))
        .into();
        let r = compare_windows(&truth, &fired);
        assert_eq!((r.records, r.windows, r.fired), (10, 4, 4));
        assert_eq!((r.missing, r.wrong, r.unknown, r.put_more_than_once), (1, 1, 1, 2));
        assert!(!r.exact());
        assert_eq!(r.examples.len(), 3, "{:?}", r.examples);
        let ok: BTreeMap<String, Vec<u64>> = truth.iter().map(|(k, n)| (k.clone(), vec![*n])).collect();
        assert!(compare_windows(&truth, &ok).exact());
    }
}
