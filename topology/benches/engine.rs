//! Engine throughput: spout -> split -> count (fields grouping), acking on and off, against a
//! bare tokio channel pipeline doing the same work, interleaved in the same run (the box is
//! noisy), plus a sustained acked run that reports RSS to show memory stays flat.
//!
//! Shape (both sides): 1 spout task, 2 split tasks (round robin), 2 count tasks (hash of the word);
//! each sentence has 8 words from a 64-word vocabulary; split allocates an `Arc<str>` per word;
//! count updates a `HashMap<Arc<str>, u64>`. The bare pipeline batches 64 items per channel
//! message, like the engine's default `batch_size`, and routes words with the engine's fields
//! hash ([`grouping::fields_task`]). Both sides are timed the same way: from before the tasks are
//! spawned until every task has finished (the engine's spout ends its stream with
//! `SpoutOutput::finish`, and the clock stops when `RunningTopology::wait` returns). The
//! per-input work is written the same way on both sides: inline in the loop over a batch (the
//! engine's bolts in the closure of `Inputs::for_each`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};

// Both pipelines run on mimalloc: with glibc malloc, frees of memory allocated on another thread
// dominate both profiles (see BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use squall_topology::*;
use tokio::sync::mpsc;

const WORDS_PER_SENTENCE: u64 = 8;
const SENTENCES: u64 = 200_000;

fn corpus() -> Arc<Vec<Arc<str>>> {
    let vocab: Vec<String> = (0..64).map(|i| format!("word{i:02}x")).collect();
    let mut x = 12345u64;
    let sentences = (0..1024)
        .map(|_| {
            let words: Vec<&str> = (0..WORDS_PER_SENTENCE)
                .map(|_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    vocab[(x >> 58) as usize].as_str()
                })
                .collect();
            Arc::from(words.join(" "))
        })
        .collect();
    Arc::new(sentences)
}

/// The words of a sentence (split at each space), as `str::split(' ')` yields them. Every
/// pipeline splits with this iterator, inlined into its loop: whether the compiler inlines
/// `str::split`'s iterator into a loop depends on how many loops in the binary use it, and that
/// differed between the pipelines (by ~28 instructions per word).
#[inline(always)]
fn words(sentence: &str) -> Words<'_> {
    Words(Some(sentence))
}

struct Words<'a>(Option<&'a str>);

impl<'a> Iterator for Words<'a> {
    type Item = &'a str;

    #[inline(always)]
    fn next(&mut self) -> Option<&'a str> {
        let s = self.0?;
        match s.as_bytes().iter().position(|&b| b == b' ') {
            Some(i) => {
                self.0 = Some(&s[i + 1..]);
                Some(&s[..i])
            }
            None => {
                self.0 = None;
                Some(s)
            }
        }
    }
}

struct SentenceSpout {
    corpus: Arc<Vec<Arc<str>>>,
    next: u64,
    limit: u64,
    tracked: bool,
    records: bool,
}

impl Spout for SentenceSpout {
    type MsgId = u64;
    async fn next_tuple(&mut self, out: &mut SpoutOutput<u64>) -> Result<(), ComponentError> {
        if self.next >= self.limit {
            out.finish();
            return Ok(());
        }
        let sentence = self.corpus[(self.next % 1024) as usize].clone();
        if self.records {
            if self.tracked {
                out.emit_record_tracked(records::Sentence { sentence }, self.next)?;
            } else {
                out.emit_record(records::Sentence { sentence })?;
            }
            self.next += 1;
            return Ok(());
        }
        let s = Value::Str(sentence);
        if self.tracked {
            out.emit_tracked(Values::from(s), self.next)?;
        } else {
            out.emit(s)?;
        }
        self.next += 1;
        Ok(())
    }
}

struct Split;

// The bolts' per-input logic is written inline in the loop, as the bare pipeline's is and as
// `Inputs::for_each`'s documentation shows; `execute` (the one-by-one fallback) repeats it.
impl Bolt for Split {
    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        for w in words(t.get_str("sentence")?) {
            out.emit(Value::Str(Arc::from(w)))?;
        }
        Ok(())
    }

    async fn execute_batch(&mut self, inputs: &mut Inputs, out: &mut BoltOutput) -> Result<(), ComponentError> {
        inputs
            .for_each(out, |t, out| {
                for w in words(t.get_str("sentence")?) {
                    out.emit(Value::Str(Arc::from(w)))?;
                }
                Ok(())
            })
            .await;
        Ok(())
    }
}

#[derive(Default)]
struct Count(HashMap<Arc<str>, u64>);

impl Bolt for Count {
    async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        let w = t.get_str("word")?;
        match self.0.get_mut(w) {
            Some(n) => *n += 1,
            None => {
                self.0.insert(t.get_arc_str("word")?, 1);
            }
        }
        Ok(())
    }

    // A tight loop over the batch: no future per tuple.
    async fn execute_batch(&mut self, inputs: &mut Inputs, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let counts = &mut self.0;
        inputs
            .for_each(out, |t, _| {
                let w = t.get_str("word")?;
                match counts.get_mut(w) {
                    Some(n) => *n += 1,
                    None => {
                        counts.insert(t.get_arc_str("word")?, 1);
                    }
                }
                Ok(())
            })
            .await;
        Ok(())
    }
}

/// The records pipeline's types and bolts, in a module of their own: the compiler then places
/// their code apart from the other pipelines' (what it inlines of `str::split` depends on how
/// many functions around it call it).
mod records {
    use std::collections::HashMap;
    use std::sync::Arc;

    use squall_topology::*;

    /// The record types of the records pipeline (`emit_record` / `for_each_record`).
    #[derive(serde::Serialize, serde::Deserialize)]
    pub(crate) struct Sentence {
        pub(crate) sentence: Arc<str>,
    }

    #[derive(serde::Serialize, serde::Deserialize)]
    pub(crate) struct Word {
        pub(crate) word: Arc<str>,
    }

    /// The split and count bolts of the records pipeline: the same work, on the user's own types.
    pub(crate) struct SplitRecords;

    impl Bolt for SplitRecords {
        async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
            for w in super::words(&t.decode::<Sentence>()?.sentence) {
                out.emit_record(Word { word: Arc::from(w) })?;
            }
            Ok(())
        }

        async fn execute_batch(&mut self, inputs: &mut Inputs, out: &mut BoltOutput) -> Result<(), ComponentError> {
            inputs
                .for_each_record(out, |s: &Sentence, out| {
                    for w in super::words(&s.sentence) {
                        out.emit_record(Word { word: Arc::from(w) })?;
                    }
                    Ok(())
                })
                .await;
            Ok(())
        }
    }

    #[derive(Default)]
    pub(crate) struct CountRecords(HashMap<Arc<str>, u64>);

    impl Bolt for CountRecords {
        async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
            *self.0.entry(t.decode::<Word>()?.word).or_default() += 1;
            Ok(())
        }

        async fn execute_batch(&mut self, inputs: &mut Inputs, out: &mut BoltOutput) -> Result<(), ComponentError> {
            let counts = &mut self.0;
            inputs
                .for_each_record(out, |w: &Word, _| {
                    match counts.get_mut(&*w.word) {
                        Some(n) => *n += 1,
                        None => {
                            counts.insert(w.word.clone(), 1);
                        }
                    }
                    Ok(())
                })
                .await;
            Ok(())
        }
    }
}

/// How the engine pipeline emits and reads: dynamic values, or the user's own record types.
#[derive(Clone, Copy, PartialEq)]
enum Api {
    Values,
    Records,
}

fn topology(tracked: bool, limit: u64, api: Api) -> Topology {
    let corpus = corpus();
    let records = api == Api::Records;
    let mut b = TopologyBuilder::new("bench");
    b.set_spout("spout", 1, move |_| SentenceSpout { corpus: corpus.clone(), next: 0, limit, tracked, records })
        .fields(&["sentence"]);
    match api {
        Api::Values => {
            b.set_bolt("split", 2, |_| Split).shuffle_grouping("spout").fields(&["word"]);
            b.set_bolt("count", 2, |_| Count::default()).fields_grouping("split", &["word"]);
        }
        Api::Records => {
            b.set_bolt("split", 2, |_| records::SplitRecords).shuffle_grouping("spout").fields(&["word"]);
            b.set_bolt("count", 2, |_| records::CountRecords::default()).fields_grouping("split", &["word"]);
        }
    }
    b.build().expect("valid")
}

fn bench_config(acking: bool) -> TopologyConfig {
    TopologyConfig { acking, max_spout_pending: 4096, ..TopologyConfig::default() }
}

/// Runs the engine from start until every task has finished (the spout finishes its stream after
/// `sentences`, the bolts drain behind it); returns words/s.
async fn run_engine(acking: bool, sentences: u64, api: Api) -> f64 {
    let start = Instant::now();
    let running = run_local(topology(acking, sentences, api), bench_config(acking)).expect("config");
    running.wait().await.expect("clean run");
    let secs = start.elapsed().as_secs_f64();
    let target = sentences * WORDS_PER_SENTENCE;
    let m = running.metrics();
    assert_eq!(m.component("count").map_or(0, |c| c.executed), target);
    if acking {
        assert_eq!(m.component("spout").map_or(0, |c| c.acked), sentences);
    }
    target as f64 / secs
}

/// The same work on bare tokio channels, 64 items per message.
async fn run_bare(sentences: u64) -> f64 {
    const BATCH: usize = 64;
    let corpus = corpus();
    let start = Instant::now();
    let counted = Arc::new(AtomicU64::new(0));
    let mut split_txs = Vec::new();
    let mut count_txs = Vec::new();
    let mut handles = Vec::new();
    let mut count_rxs = Vec::new();
    for _ in 0..2 {
        let (tx, rx) = mpsc::channel::<Vec<Arc<str>>>(64);
        count_txs.push(tx);
        count_rxs.push(rx);
    }
    for mut rx in count_rxs {
        let counted = counted.clone();
        handles.push(tokio::spawn(async move {
            let mut counts: HashMap<Arc<str>, u64> = HashMap::new();
            let mut n = 0;
            while let Some(batch) = rx.recv().await {
                for w in batch {
                    n += 1;
                    match counts.get_mut(&w) {
                        Some(c) => *c += 1,
                        None => {
                            counts.insert(w, 1);
                        }
                    }
                }
            }
            counted.fetch_add(n, Ordering::Relaxed);
        }));
    }
    for _ in 0..2 {
        let (tx, mut rx) = mpsc::channel::<Vec<Arc<str>>>(64);
        split_txs.push(tx);
        let outs = count_txs.clone();
        handles.push(tokio::spawn(async move {
            let mut bufs: Vec<Vec<Arc<str>>> = vec![Vec::with_capacity(BATCH); outs.len()];
            while let Some(batch) = rx.recv().await {
                for s in batch {
                    for w in words(&s) {
                        // the engine's fields grouping hash
                        let v = Value::Str(Arc::from(w));
                        let t = grouping::fields_task(&[&v], outs.len());
                        let Value::Str(w) = v else { unreachable!() };
                        bufs[t].push(w);
                        if bufs[t].len() == BATCH {
                            let b = std::mem::replace(&mut bufs[t], Vec::with_capacity(BATCH));
                            let _ = outs[t].send(b).await;
                        }
                    }
                }
                for (t, b) in bufs.iter_mut().enumerate() {
                    if !b.is_empty() {
                        let _ = outs[t].send(std::mem::take(b)).await;
                    }
                }
            }
        }));
    }
    drop(count_txs);
    // the producer is a task on the runtime's workers, as the engine's spout is (run inline in
    // `block_on`, it would get the calling thread as a third worker the engine does not have)
    handles.push(tokio::spawn(async move {
        let mut buf = Vec::with_capacity(BATCH);
        let mut rr = 0;
        for i in 0..sentences {
            buf.push(corpus[(i % 1024) as usize].clone());
            if buf.len() == BATCH {
                let _ = split_txs[rr].send(std::mem::replace(&mut buf, Vec::with_capacity(BATCH))).await;
                rr = (rr + 1) % split_txs.len();
            }
        }
        if !buf.is_empty() {
            let _ = split_txs[rr].send(buf).await;
        }
    }));
    for h in handles {
        let _ = h.await;
    }
    let n = counted.load(Ordering::Relaxed);
    assert_eq!(n, sentences * WORDS_PER_SENTENCE);
    n as f64 / start.elapsed().as_secs_f64()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Interleaved rounds of the five pipelines (the order rotates each round), medians and ratios
/// (printed as a Markdown table).
fn interleaved_comparison() {
    const NAMES: [&str; 5] = [
        "bare tokio channels (64/msg)",
        "engine, values, acking off",
        "engine, values, acking on (max pending 4096)",
        "engine, records, acking off",
        "engine, records, acking on (max pending 4096)",
    ];
    let rt = runtime();
    let rounds = 7;
    let mut wps: [Vec<f64>; 5] = Default::default();
    let mut ratios: [Vec<f64>; 5] = Default::default();
    rt.block_on(run_bare(20_000)); // warm-up
    rt.block_on(run_engine(true, 20_000, Api::Values));
    rt.block_on(run_engine(true, 20_000, Api::Records));
    for round in 0..rounds {
        let mut results = [0.0; 5];
        for k in 0..5 {
            let which = (k + round) % 5;
            results[which] = match which {
                0 => rt.block_on(run_bare(SENTENCES)),
                1 => rt.block_on(run_engine(false, SENTENCES, Api::Values)),
                2 => rt.block_on(run_engine(true, SENTENCES, Api::Values)),
                3 => rt.block_on(run_engine(false, SENTENCES, Api::Records)),
                _ => rt.block_on(run_engine(true, SENTENCES, Api::Records)),
            };
        }
        for i in 0..5 {
            wps[i].push(results[i]);
            ratios[i].push(results[i] / results[0]);
        }
    }
    // per-round ratios in round order, before the medians sort them
    let per_round = |r: &[f64]| r.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>().join(" / ");
    let per_round: Vec<String> = ratios.iter().map(|r| per_round(r)).collect();
    println!(
        "\n## Engine: interleaved comparison ({rounds} rounds, {} words per run, medians)\n",
        SENTENCES * WORDS_PER_SENTENCE
    );
    println!("| pipeline | words/s | ratio to bare (median of per-round ratios) |");
    println!("| --- | ---: | ---: |");
    for i in 0..5 {
        println!("| {} | {:.2}M | {:.2} |", NAMES[i], median(&mut wps[i]) / 1e6, median(&mut ratios[i]));
    }
    println!();
    for i in 1..5 {
        println!("Per-round ratios, {}: {}", NAMES[i], per_round[i]);
    }
}

/// A sustained acked run with an endless spout: RSS must stay flat (bounded by max pending and
/// channel capacities).
fn sustained_memory() {
    let rt = runtime();
    rt.block_on(async {
        let running = run_local(topology(true, u64::MAX, Api::Values), bench_config(true)).expect("config");
        let start = Instant::now();
        let mut samples = Vec::new();
        for secs in [1u64, 3, 6, 10] {
            tokio::time::sleep_until(tokio::time::Instant::from_std(start + Duration::from_secs(secs))).await;
            let m = running.metrics();
            samples.push((
                secs,
                rss_kib(),
                m.component("spout").map_or(0, |c| c.acked),
                m.component("spout").map_or(0, |c| c.pending),
            ));
        }
        running.cancel().await.expect("clean stop");
        println!("\n## Engine: sustained acked run (endless spout, max pending 4096)\n");
        println!("| t (s) | RSS (MiB) | sentences acked | pending |");
        println!("| ---: | ---: | ---: | ---: |");
        for (s, rss, acked, pending) in samples {
            println!("| {s} | {:.1} | {acked} | {pending} |", rss as f64 / 1024.0);
        }
    });
}

fn criterion_benches(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("spout_split_count");
    g.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4));
    g.throughput(criterion::Throughput::Elements(50_000 * WORDS_PER_SENTENCE));
    let per_iter = |rt: &tokio::runtime::Runtime, f: &dyn Fn() -> f64, iters: u64| {
        let _ = rt;
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            let wps = f();
            total += Duration::from_secs_f64((50_000 * WORDS_PER_SENTENCE) as f64 / wps);
        }
        total
    };
    g.bench_function("bare", |b| b.iter_custom(|i| per_iter(&rt, &|| rt.block_on(run_bare(50_000)), i)));
    g.bench_function("engine_unacked", |b| {
        b.iter_custom(|i| per_iter(&rt, &|| rt.block_on(run_engine(false, 50_000, Api::Values)), i))
    });
    g.bench_function("engine_acked", |b| {
        b.iter_custom(|i| per_iter(&rt, &|| rt.block_on(run_engine(true, 50_000, Api::Values)), i))
    });
    g.finish();
}

criterion_group!(benches, criterion_benches);

/// Runs one pipeline repeatedly (for profilers): `profile-bare`, `profile-unacked`,
/// `profile-acked`, `profile-records-unacked`, `profile-records-acked`, 5 runs unless a count follows (`profile-acked 1` under callgrind).
fn profile_one(which: &str, runs: usize) {
    let rt = runtime();
    for _ in 0..runs {
        let wps = match which {
            "profile-bare" => rt.block_on(run_bare(SENTENCES)),
            "profile-unacked" => rt.block_on(run_engine(false, SENTENCES, Api::Values)),
            "profile-acked" => rt.block_on(run_engine(true, SENTENCES, Api::Values)),
            "profile-records-unacked" => rt.block_on(run_engine(false, SENTENCES, Api::Records)),
            _ => rt.block_on(run_engine(true, SENTENCES, Api::Records)),
        };
        println!("{which}: {:.2}M words/s", wps / 1e6);
    }
}

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| !a.starts_with('-'));
    let filter = args.next();
    if let Some(f) = filter.as_deref().filter(|f| f.starts_with("profile-")) {
        profile_one(f, args.next().and_then(|n| n.parse().ok()).unwrap_or(5));
        return;
    }
    if filter.is_none() || filter.as_deref() == Some("interleaved") {
        interleaved_comparison();
        sustained_memory();
    }
    if filter.as_deref() != Some("interleaved") {
        benches();
        Criterion::default().configure_from_args().final_summary();
    }
}
