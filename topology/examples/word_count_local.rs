//! Word count on the in-process runner: what a Squall topology looks like end to end.
//!
//! Shows: a replaying spout (tracked emits, `fail` re-queues the sentence, `ack` forgets it), a
//! split bolt whose emits are anchored to its input, a count bolt fed by fields grouping so each
//! word is counted by one task, a bolt error that fails a tuple and gets it replayed (the task
//! keeps running), the metrics API, and a drain that flushes the counts through `on_drain` before
//! the topology stops.
//!
//! Run: `cargo run -p squall-topology --example word_count_local`

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use squall_topology::*;

const SENTENCES: &[&str] = &[
    "the cow jumped over the moon",
    "an apple a day keeps the doctor away",
    "four score and seven years ago",
    "snow white and the seven dwarfs",
    "i am at two with nature",
];

/// Emits each sentence `rounds` times, tracked by its sequence number; replays failures.
struct SentenceSpout {
    next: u64,
    total: u64,
    replay: VecDeque<u64>,
}

impl Spout for SentenceSpout {
    type MsgId = u64;

    async fn next_tuple(&mut self, out: &mut SpoutOutput<u64>) -> Result<(), ComponentError> {
        let seq = match self.replay.pop_front() {
            Some(seq) => seq,
            None if self.next < self.total => {
                self.next += 1;
                self.next - 1
            }
            None => return Ok(()), // nothing to do: the executor idles until an ack or a timeout
        };
        out.emit_tracked([SENTENCES[seq as usize % SENTENCES.len()]], seq)?;
        Ok(())
    }

    async fn fail(&mut self, seq: u64) {
        self.replay.push_back(seq);
    }
}

/// Splits sentences into words. Fails sentence 7 once to show a replay.
struct SplitBolt {
    failed_once: bool,
}

impl Bolt for SplitBolt {
    async fn execute(&mut self, input: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let sentence = input.get_str("sentence")?;
        if sentence.starts_with("four") && !self.failed_once {
            self.failed_once = true;
            return Err(ComponentError::retryable("simulated downstream hiccup"));
        }
        for word in sentence.split_whitespace() {
            out.emit([word])?; // anchored to `input`: the sentence is acked once every word is counted
        }
        Ok(())
    }
}

/// Counts words; on drain, emits its totals on the "totals" stream.
#[derive(Default)]
struct CountBolt {
    counts: HashMap<String, u64>,
}

impl Bolt for CountBolt {
    async fn execute(&mut self, input: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        *self.counts.entry(input.get_str("word")?.to_owned()).or_default() += 1;
        Ok(())
    }

    async fn on_drain(&mut self, out: &mut BoltOutput) -> Result<(), ComponentError> {
        for (word, n) in self.counts.drain() {
            out.emit_unanchored_to("totals", values![word, n])?;
        }
        Ok(())
    }
}

/// Prints the final totals.
#[derive(Default)]
struct ReportBolt {
    totals: Vec<(String, u64)>,
}

impl Bolt for ReportBolt {
    async fn execute(&mut self, input: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.totals.push((input.get_str("word")?.to_owned(), input.get_u64("count")?));
        Ok(())
    }

    async fn on_drain(&mut self, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.totals.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        println!("top words:");
        for (w, n) in self.totals.iter().take(5) {
            println!("  {w:>8} {n}");
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut builder = TopologyBuilder::new("word-count");
    builder
        .set_spout("sentences", 2, |_| SentenceSpout { next: 0, total: 10_000, replay: VecDeque::new() })
        .fields(&["sentence"]);
    builder.set_bolt("split", 2, |_| SplitBolt { failed_once: false }).shuffle_grouping("sentences").fields(&["word"]);
    builder
        .set_bolt("count", 2, |_| CountBolt::default())
        .fields_grouping("split", &["word"])
        .output("totals", &["word", "count"]);
    builder.set_bolt("report", 1, |_| ReportBolt::default()).global_grouping_from("count", "totals");
    let topology = builder.build()?;

    let config = TopologyConfig { message_timeout_ms: 5_000, ..TopologyConfig::default() };
    let running = run_local(topology, config)?;
    // both spout tasks emit 10 000 sentences each
    while running.metrics().component("sentences").map_or(0, |m| m.acked) < 20_000 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let m = running.metrics();
    for (id, c) in &m.components {
        println!(
            "{id:>10}: emitted {:>6} executed {:>6} acked {:>6} failed {} timed out {} mean execute {} ns",
            c.emitted, c.executed, c.acked, c.failed, c.timed_out, c.execute_latency.mean_ns
        );
    }
    running.drain().await?;
    running.wait().await?;
    Ok(())
}
