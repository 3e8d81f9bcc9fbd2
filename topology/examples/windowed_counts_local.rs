//! Event-time tumbling windows: clicks per user per second of event time.
//!
//! Shows: a spout with two tasks that emit timestamped events (`ts`, ms of event time) and low
//! watermarks. Task 0 is a fast source: it emits all its clicks at once, slightly out of order,
//! with a watermark that trails its highest time by the allowed disorder. Task 1 is a slow,
//! mostly idle source that advances its event time by one second every 150 ms of wall time. The
//! window bolt ([`squall_topology::window`], fields grouping on the user, two tasks) sees the
//! *min* of the two watermarks, so windows fire at the slow source's pace even though the fast
//! one is long done. Each window's counts print as soon as the watermark passes the window's end
//! (never before); the slow source's final straggler (an event older than its own watermark)
//! arrives after its window fired and goes to the `late` stream. The inputs of a window are held
//! and acked only once its counts are emitted (at-least-once); the drain at the end flushes any
//! window still open.
//!
//! Run: `cargo run -p squall-topology --example windowed_counts_local`

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use squall_topology::window::{Count, TumblingWindowConfig};
use squall_topology::*;
use tokio::time::Instant;

const USERS: [&str; 3] = ["ann", "bob", "cyd"];
/// How far out of order the fast source may be, in ms of event time.
const DISORDER_MS: i64 = 250;
/// Seconds of event time the slow source covers.
const SLOW_STEPS: i64 = 6;

enum Source {
    /// Emits `total` clicks at once: click `i` at about `i * 100` ms, up to 180 ms out of order.
    Fast { next: i64, total: i64, max_ts: i64 },
    /// One click per step of 1 s of event time, every 150 ms of wall time; then a straggler.
    Slow { step: i64, due: Instant, done: Arc<AtomicBool> },
}

struct Clicks(Source);

impl Spout for Clicks {
    type MsgId = u64;

    async fn next_tuple(&mut self, out: &mut SpoutOutput<u64>) -> Result<(), ComponentError> {
        match &mut self.0 {
            Source::Fast { next, total, max_ts } => {
                if *next < *total {
                    let i = *next;
                    *next += 1;
                    let ts = i * 100 - (i % 4) * 60;
                    out.emit_tracked(values![USERS[(i * 7 % 3) as usize], ts], i as u64)?;
                    *max_ts = (*max_ts).max(ts);
                    // nothing older than max_ts - DISORDER_MS will follow
                    out.watermark((*max_ts - DISORDER_MS).max(0) as u64);
                }
            }
            Source::Slow { step, due, done } => {
                if *step > SLOW_STEPS || Instant::now() < *due {
                    return Ok(());
                }
                *due += Duration::from_millis(150);
                let id = 1_000_000 + *step as u64;
                if *step == SLOW_STEPS {
                    // a straggler below the watermark this source already sent: late data
                    out.emit_tracked(values!["dee", 900i64], id)?;
                    done.store(true, Ordering::SeqCst);
                } else {
                    out.emit_tracked(values!["dee", *step * 1_000 + 500], id)?;
                    out.watermark((*step as u64 + 1) * 1_000);
                }
                *step += 1;
            }
        }
        Ok(())
    }
}

struct Print;

impl Bolt for Print {
    async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        let (user, start, end) = (t.get_str("user")?, t.get_i64("window_start_ms")?, t.get_i64("window_end_ms")?);
        if t.stream() == "late" {
            println!("  late: {user} at {} ms, window [{start}, {end}) already fired", t.get_i64("event_ms")?);
        } else {
            println!("  window [{start:>5}, {end:>5}) {user}: {}", t.get_u64("count")?);
        }
        Ok(())
    }

    async fn on_watermark(&mut self, wm: Watermark, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        match wm {
            Watermark::MAX => println!("watermark +infinity (drain)"),
            wm => println!("watermark {} ms", wm.millis()),
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let windows = TumblingWindowConfig::new(1_000, "ts", &["user"]).build(Count)?;
    let done = Arc::new(AtomicBool::new(false));

    let mut b = TopologyBuilder::new("windowed-counts");
    let d = done.clone();
    b.set_spout("clicks", 2, move |ctx| {
        Clicks(match ctx.task_index() {
            0 => Source::Fast { next: 0, total: 60, max_ts: 0 },
            _ => Source::Slow { step: 0, due: Instant::now(), done: d.clone() },
        })
    })
    .fields(&["user", "ts"]);
    windows.declare_outputs(b.set_bolt("windows", 2, windows.factory()).fields_grouping("clicks", &["user"]));
    b.set_bolt("print", 1, |_| Print).global_grouping("windows").global_grouping_from("windows", "late");

    let running = run_local(b.build()?, TopologyConfig::default())?;
    // wait for the slow source's straggler to reach the late stream
    while !done.load(Ordering::SeqCst) || windows.stats().late() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!("-- sources done; {} input(s) still held in open windows; draining", windows.stats().held());
    running.drain().await?;
    running.wait().await?;
    let stats = windows.stats();
    println!("{} clicks counted in {} (user, window) counts, {} late", stats.inputs(), stats.fired(), stats.late());
    Ok(())
}
