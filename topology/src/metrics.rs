//! Per-task counters, aggregated per component into a [`TopologyMetrics`] snapshot.
//!
//! Each task owns its counters and is their only writer (relaxed load + store, no locked
//! instructions on the hot path); readers sum over the tasks of a component.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use serde::Serialize;

const SUB: usize = 4;
const BUCKETS: usize = 64 * SUB;

#[inline]
fn bump(a: &AtomicU64, n: u64) {
    a.store(a.load(Relaxed).wrapping_add(n), Relaxed);
}

fn bucket_of(ns: u64) -> usize {
    if ns < SUB as u64 {
        return ns as usize;
    }
    let log = 63 - ns.leading_zeros() as usize;
    let sub = ((ns >> (log - 2)) & 3) as usize;
    log * SUB + sub
}

fn bucket_upper(b: usize) -> u64 {
    if b < SUB {
        return b as u64;
    }
    let log = b / SUB;
    let sub = (b % SUB) as u64;
    let base = 1u64 << log;
    base.saturating_add((sub + 1) * (base / 4))
}

/// A user counter, registered with [`crate::TaskContext::counter`]: summed over the component's
/// tasks in [`ComponentMetrics::counters`]. Cheap to clone; may be moved to other tasks.
#[derive(Clone, Debug, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    /// Adds `n`.
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }

    /// Adds 1.
    #[inline]
    pub fn incr(&self) {
        self.add(1);
    }

    /// The current value (this task's).
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// Log-linear buckets (4 per power of two, within 25%) of non-negative values.
#[derive(Debug)]
struct Cells {
    count: AtomicU64,
    sum: AtomicU64,
    max: AtomicU64,
    buckets: Box<[AtomicU64]>,
}

impl Default for Cells {
    fn default() -> Self {
        Cells {
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            max: AtomicU64::new(0),
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

/// A user histogram, registered with [`crate::TaskContext::histogram`]: merged over the
/// component's tasks in [`ComponentMetrics::histograms`] (count, mean, max, p50, p99). Values
/// are unsigned integers (e.g. microseconds, bytes). Cheap to clone; may be moved to other tasks.
#[derive(Clone, Debug, Default)]
pub struct Histogram(Arc<Cells>);

impl Histogram {
    /// Records one value.
    pub fn record(&self, v: u64) {
        let c = &self.0;
        c.count.fetch_add(1, Relaxed);
        c.sum.fetch_add(v, Relaxed);
        c.max.fetch_max(v, Relaxed);
        c.buckets[bucket_of(v).min(BUCKETS - 1)].fetch_add(1, Relaxed);
    }

    /// Records a duration in microseconds.
    pub fn record_duration(&self, d: Duration) {
        self.record(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    }
}

/// A user histogram merged over a component's tasks.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HistogramSummary {
    /// Values recorded.
    pub count: u64,
    /// Sum of the values.
    pub sum: u64,
    /// Mean.
    pub mean: u64,
    /// Largest value.
    pub max: u64,
    /// Median (upper bound of a bucket, within 25%).
    pub p50: u64,
    /// 99th percentile (upper bound of a bucket, within 25%).
    pub p99: u64,
    /// The merged log-linear cells (4 per power of two) that are not empty, ascending:
    /// `(upper, count)`, each counting values below `upper` (and at or above the previous
    /// cell's). For exporters (e.g. Prometheus histograms); not serialized.
    #[serde(skip)]
    pub cells: Vec<(u64, u64)>,
}

/// The user metrics of one task, by name.
#[derive(Debug, Default)]
pub(crate) struct UserMetrics {
    counters: std::sync::Mutex<Vec<(String, Counter)>>,
    histograms: std::sync::Mutex<Vec<(String, Histogram)>>,
}

impl UserMetrics {
    pub(crate) fn counter(&self, name: &str) -> Counter {
        let mut v = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, c)) = v.iter().find(|(n, _)| n == name) {
            return c.clone();
        }
        let c = Counter::default();
        v.push((name.to_owned(), c.clone()));
        c
    }

    pub(crate) fn histogram(&self, name: &str) -> Histogram {
        let mut v = self.histograms.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, h)) = v.iter().find(|(n, _)| n == name) {
            return h.clone();
        }
        let h = Histogram::default();
        v.push((name.to_owned(), h.clone()));
        h
    }
}

/// The non-empty cells of merged buckets, as `(exclusive upper bound, count)`.
fn cells(buckets: &[u64]) -> Vec<(u64, u64)> {
    buckets.iter().enumerate().filter(|(_, n)| **n > 0).map(|(i, n)| (bucket_upper(i), *n)).collect()
}

/// A cheap, cloneable handle on a running topology's counters: [`MetricsHandle::snapshot`]
/// reads them without the topology handle (e.g. from a metrics endpoint).
#[derive(Debug, Clone)]
pub struct MetricsHandle(pub(crate) Arc<MetricsRegistry>);

impl MetricsHandle {
    /// A snapshot of every component's counters (the same as `RunningTopology::metrics`).
    pub fn snapshot(&self) -> TopologyMetrics {
        self.0.snapshot()
    }
}

/// The rank-`q` value (upper bucket bound) of merged buckets.
fn quantile(buckets: &[u64], q: f64, max: u64) -> u64 {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return 0;
    }
    let rank = ((total as f64 * q).ceil() as u64).max(1);
    let mut seen = 0;
    for (i, b) in buckets.iter().enumerate() {
        seen += b;
        if seen >= rank {
            return bucket_upper(i).min(max);
        }
    }
    max
}

/// The counters of one task.
#[derive(Debug)]
pub(crate) struct TaskMetrics {
    pub(crate) user: UserMetrics,
    pub(crate) emitted: AtomicU64,
    pub(crate) executed: AtomicU64,
    pub(crate) acked: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) timed_out: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) pending: AtomicU64,
    lat_sum_ns: AtomicU64,
    lat_max_ns: AtomicU64,
    lat_count: AtomicU64,
    lat_buckets: Box<[AtomicU64]>,
}

impl Default for TaskMetrics {
    fn default() -> Self {
        TaskMetrics {
            user: UserMetrics::default(),
            emitted: AtomicU64::new(0),
            executed: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            pending: AtomicU64::new(0),
            lat_sum_ns: AtomicU64::new(0),
            lat_max_ns: AtomicU64::new(0),
            lat_count: AtomicU64::new(0),
            lat_buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl TaskMetrics {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        if n > 0 {
            bump(counter, n);
        }
    }

    pub(crate) fn set(counter: &AtomicU64, v: u64) {
        counter.store(v, Relaxed);
    }

    /// Records one execute latency (single writer).
    #[cfg(test)]
    pub(crate) fn record_latency(&self, d: Duration) {
        self.record_latency_batch(d, 1);
    }

    /// Records `n` executes that took `total` together, each at the mean (single writer). The
    /// executor times batches rather than each tuple: a clock read per tuple costs more than a
    /// small bolt's execute.
    pub(crate) fn record_latency_batch(&self, total: Duration, n: u64) {
        if n == 0 {
            return;
        }
        let total_ns = u64::try_from(total.as_nanos()).unwrap_or(u64::MAX);
        let ns = total_ns / n;
        bump(&self.lat_count, n);
        bump(&self.lat_sum_ns, total_ns);
        if ns > self.lat_max_ns.load(Relaxed) {
            self.lat_max_ns.store(ns, Relaxed);
        }
        bump(&self.lat_buckets[bucket_of(ns).min(BUCKETS - 1)], n);
    }
}

/// Whether a component is a spout or a bolt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ComponentKind {
    /// A spout.
    Spout,
    /// A bolt.
    Bolt,
}

/// Execute latency of a bolt component.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Number of executes measured.
    pub count: u64,
    /// Mean, in nanoseconds.
    pub mean_ns: u64,
    /// Maximum, in nanoseconds. Executes are timed per input batch (each tuple of a batch is
    /// recorded at the batch mean), so max and p99 are over batch means.
    pub max_ns: u64,
    /// 99th percentile, in nanoseconds (upper bound of a histogram bucket, within 25%).
    pub p99_ns: u64,
    /// Sum of the measured latencies, in nanoseconds.
    #[serde(skip)]
    pub sum_ns: u64,
    /// The merged log-linear cells (4 per power of two) that are not empty, ascending:
    /// `(upper_ns, count)`, each counting latencies below `upper_ns` (and at or above the
    /// previous cell's). For exporters (e.g. Prometheus histograms); not serialized.
    #[serde(skip)]
    pub cells: Vec<(u64, u64)>,
}

/// Counters of one component, summed over its tasks.
///
/// For a spout, `acked`/`failed`/`timed_out` count tracked tuple trees (timed-out trees are also
/// counted as failed) and `pending` the trees in flight. For a bolt, `executed` counts inputs and
/// `acked`/`failed` the inputs it acked or failed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ComponentMetrics {
    /// Spout or bolt.
    pub kind: ComponentKind,
    /// Number of tasks.
    pub tasks: usize,
    /// Tuples emitted (one per emit call, however many tasks receive it).
    pub emitted: u64,
    /// Inputs executed (bolts) or `next_tuple` calls (spouts).
    pub executed: u64,
    /// Acked trees (spouts) or acked inputs (bolts).
    pub acked: u64,
    /// Failed trees (spouts, including timeouts) or failed inputs (bolts).
    pub failed: u64,
    /// Trees failed by the message timeout (spouts).
    pub timed_out: u64,
    /// Errors returned or panics raised by the component's hooks.
    pub errors: u64,
    /// Tracked tuples in flight (spouts).
    pub pending: u64,
    /// Execute latency (bolts).
    pub execute_latency: LatencySummary,
    /// The component's own counters ([`crate::TaskContext::counter`]), summed over its tasks.
    pub counters: BTreeMap<String, u64>,
    /// The component's own histograms ([`crate::TaskContext::histogram`]), merged over its tasks.
    pub histograms: BTreeMap<String, HistogramSummary>,
}

/// A snapshot of every component's counters.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopologyMetrics {
    /// Per component id.
    pub components: BTreeMap<String, ComponentMetrics>,
}

impl TopologyMetrics {
    /// The counters of one component.
    pub fn component(&self, id: &str) -> Option<&ComponentMetrics> {
        self.components.get(id)
    }
}

/// The counters of every task, grouped by component.
#[derive(Debug, Default)]
pub(crate) struct MetricsRegistry {
    pub(crate) components: Vec<(String, ComponentKind, Vec<Arc<TaskMetrics>>)>,
}

impl MetricsRegistry {
    pub(crate) fn snapshot(&self) -> TopologyMetrics {
        let mut components = BTreeMap::new();
        for (id, kind, tasks) in &self.components {
            let sum = |f: fn(&TaskMetrics) -> &AtomicU64| tasks.iter().map(|t| f(t).load(Relaxed)).sum::<u64>();
            let count = sum(|t| &t.lat_count);
            let total = sum(|t| &t.lat_sum_ns);
            let max = tasks.iter().map(|t| t.lat_max_ns.load(Relaxed)).max().unwrap_or(0);
            let mut buckets = vec![0u64; BUCKETS];
            for t in tasks {
                for (b, a) in buckets.iter_mut().zip(t.lat_buckets.iter()) {
                    *b += a.load(Relaxed);
                }
            }
            let bucket_total: u64 = buckets.iter().sum();
            let rank = bucket_total - bucket_total / 100;
            let mut seen = 0;
            let mut p99 = 0;
            for (i, b) in buckets.iter().enumerate() {
                seen += b;
                if seen >= rank && *b > 0 {
                    p99 = bucket_upper(i).min(max);
                    break;
                }
            }
            let mut counters: BTreeMap<String, u64> = BTreeMap::new();
            let mut hists: BTreeMap<String, (u64, u64, u64, Vec<u64>)> = BTreeMap::new();
            for t in tasks {
                for (name, c) in t.user.counters.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                    *counters.entry(name.clone()).or_default() += c.get();
                }
                for (name, h) in t.user.histograms.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                    let e = hists.entry(name.clone()).or_insert_with(|| (0, 0, 0, vec![0; BUCKETS]));
                    e.0 += h.0.count.load(Relaxed);
                    e.1 = e.1.saturating_add(h.0.sum.load(Relaxed));
                    e.2 = e.2.max(h.0.max.load(Relaxed));
                    for (b, a) in e.3.iter_mut().zip(h.0.buckets.iter()) {
                        *b += a.load(Relaxed);
                    }
                }
            }
            let histograms = hists
                .into_iter()
                .map(|(name, (count, sum, max, buckets))| {
                    let summary = HistogramSummary {
                        count,
                        sum,
                        mean: sum.checked_div(count).unwrap_or(0),
                        max,
                        p50: quantile(&buckets, 0.5, max),
                        p99: quantile(&buckets, 0.99, max),
                        cells: cells(&buckets),
                    };
                    (name, summary)
                })
                .collect();
            components.insert(
                id.clone(),
                ComponentMetrics {
                    kind: *kind,
                    tasks: tasks.len(),
                    emitted: sum(|t| &t.emitted),
                    executed: sum(|t| &t.executed),
                    acked: sum(|t| &t.acked),
                    failed: sum(|t| &t.failed),
                    timed_out: sum(|t| &t.timed_out),
                    errors: sum(|t| &t.errors),
                    pending: sum(|t| &t.pending),
                    execute_latency: LatencySummary {
                        count,
                        mean_ns: total.checked_div(count).unwrap_or(0),
                        max_ns: max,
                        p99_ns: p99,
                        sum_ns: total,
                        cells: cells(&buckets),
                    },
                    counters,
                    histograms,
                },
            );
        }
        TopologyMetrics { components }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_bound_values() {
        let mut last = 0;
        for ns in [0u64, 1, 3, 4, 5, 7, 8, 100, 1000, 1_000_000, u64::MAX / 2] {
            let b = bucket_of(ns);
            assert!(b >= last);
            last = b;
            assert!(bucket_upper(b) >= ns, "{ns} -> {b} -> {}", bucket_upper(b));
        }
    }

    #[test]
    fn snapshot_sums_tasks_and_summarizes_latency() {
        let a = Arc::new(TaskMetrics::default());
        let b = Arc::new(TaskMetrics::default());
        TaskMetrics::add(&a.executed, 3);
        TaskMetrics::add(&b.executed, 4);
        for i in 1..=100u64 {
            a.record_latency(Duration::from_micros(i));
        }
        a.user.counter("hits").add(2);
        b.user.counter("hits").add(3);
        assert_eq!(a.user.counter("hits").get(), 2, "one counter per name and task");
        for v in 1..=100u64 {
            a.user.histogram("size").record(v);
        }
        b.user.histogram("size").record(1_000);
        let reg = MetricsRegistry { components: vec![("c".into(), ComponentKind::Bolt, vec![a, b])] };
        let s = reg.snapshot();
        let c = s.component("c").unwrap();
        assert_eq!(c.executed, 7);
        assert_eq!(c.tasks, 2);
        assert_eq!(c.execute_latency.count, 100);
        assert_eq!(c.execute_latency.max_ns, 100_000);
        assert_eq!(c.execute_latency.mean_ns, 50_500);
        assert!(c.execute_latency.p99_ns >= 99_000 && c.execute_latency.p99_ns <= 100_000);
        assert_eq!(c.counters["hits"], 5);
        let h = &c.histograms["size"];
        assert_eq!((h.count, h.sum, h.max), (101, 5050 + 1000, 1000));
        assert!((50..=63).contains(&h.p50), "{h:?}");
        assert!((100..=1000).contains(&h.p99), "{h:?}");
        // the cells: every value counted once, below its cell's bound, bounds ascending
        assert_eq!(h.cells.iter().map(|(_, n)| n).sum::<u64>(), 101);
        assert!(h.cells.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(h.cells.last(), Some(&(1024, 1)), "1000 is in the cell [896, 1024)");
        let lat = &c.execute_latency;
        assert_eq!(lat.cells.iter().map(|(_, n)| n).sum::<u64>(), 100);
        assert_eq!(lat.sum_ns, 5_050_000);
    }
}
