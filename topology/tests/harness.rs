//! The test harness (`squall_topology::testing`) on bolts and spouts that exercise each contract
//! point: anchoring, held inputs, dropped handles, errors and panics, direct emits, timers,
//! watermarks, drain, `execute_batch`, spout acks, fails and timeouts, and the window bolt.

use std::collections::VecDeque;
use std::time::Duration;

use serde::Deserialize;
use squall_topology::testing::{BoltHarness, HarnessError, InputId, SpoutHarness};
use squall_topology::window::{Count, TumblingWindowConfig};
use squall_topology::*;

/// A bolt run by its inputs: `[cmd, arg]`.
#[derive(Default)]
struct Script {
    held: Vec<AckHandle>,
}

impl Bolt for Script {
    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let arg = t.get_str("arg")?.to_owned();
        match t.get_str("cmd")? {
            "emit" => out.emit([arg])?,
            "emit2" => {
                out.emit([format!("{arg}-a")])?;
                out.emit_to("side", [format!("{arg}-b")])?;
            }
            "unanchored" => out.emit_unanchored([arg])?,
            "hold" => self.held.push(out.defer_ack()?),
            "join" => {
                let held = std::mem::take(&mut self.held);
                out.emit_anchored(&held.iter().collect::<Vec<_>>(), "default", [arg])?;
                held.into_iter().for_each(|h| out.ack(h));
            }
            "fail_held" => std::mem::take(&mut self.held).into_iter().for_each(|h| out.fail(h)),
            "drop_held" => self.held.clear(),
            "err" => {
                out.emit([arg])?;
                return Err(ComponentError::retryable("told to"));
            }
            "panic" => panic!("told to"),
            "direct" => out.emit_direct(arg.parse().unwrap_or(0), "direct", [arg])?,
            "schedule" => out.schedule_after(Duration::from_millis(arg.parse().unwrap_or(0)), 7),
            other => return Err(ComponentError::fatal(format!("unknown command {other}"))),
        }
        Ok(())
    }

    /// Emits which timer fired; acks what is held, anchored to it (a batch flush).
    async fn on_timer(&mut self, timer: Timer, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let held = std::mem::take(&mut self.held);
        if held.is_empty() {
            out.emit_unanchored_to("timers", [format!("{timer:?}")])?;
        } else {
            out.emit_anchored(&held.iter().collect::<Vec<_>>(), "timers", [format!("{timer:?}")])?;
        }
        held.into_iter().for_each(|h| out.ack(h));
        Ok(())
    }

    async fn on_watermark(&mut self, wm: Watermark, out: &mut BoltOutput) -> Result<(), ComponentError> {
        out.emit_unanchored_to("wm", [wm.millis()])?;
        Ok(())
    }

    async fn on_drain(&mut self, out: &mut BoltOutput) -> Result<(), ComponentError> {
        out.emit_unanchored_to("timers", ["drained"])?;
        Ok(())
    }
}

async fn script() -> BoltHarness<Script> {
    script_with(ComponentConfig::default()).await
}

async fn script_with(config: ComponentConfig) -> BoltHarness<Script> {
    BoltHarness::new(Script::default())
        .component_id("script")
        .input("src", "default", &["cmd", "arg"])
        .input("other", "control", &["cmd", "arg"])
        .output("default", &["v"])
        .output("side", &["v"])
        .output("timers", &["timer"])
        .output("wm", &["wm"])
        .direct_output("direct", &["v"], 3)
        .config(config)
        .prepare()
        .await
        .expect("prepare")
}

fn value_strs(h: &BoltHarness<Script>, stream: &str) -> Vec<String> {
    h.emitted_on(stream)
        .map(|e| e.tuple().get_str(e.tuple().fields().iter().next().unwrap()).unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn emits_are_anchored_to_the_current_input_and_inputs_are_acked() {
    let mut h = script().await;
    let a = h.execute(["emit", "x"]).await.unwrap();
    let b = h.execute_on("other", "control", ["emit2", "y"]).await.unwrap();
    let c = h.execute(["unanchored", "z"]).await.unwrap();
    h.execute_untracked(["emit", "u"]).await.unwrap();

    let e = h.emitted();
    assert_eq!(e.len(), 5);
    assert_eq!((e[0].stream.as_str(), e[0].anchored_to.as_slice()), ("default", &[a][..]));
    assert_eq!((e[1].stream.as_str(), e[1].anchored_to.as_slice()), ("default", &[b][..]));
    assert_eq!((e[2].stream.as_str(), e[2].anchored_to.as_slice()), ("side", &[b][..]));
    assert!(e[3].anchored_to.is_empty(), "emit_unanchored");
    assert!(e[4].anchored_to.is_empty(), "an untracked input's emits are unanchored");
    assert!(e.iter().all(|e| e.direct_task.is_none()));
    assert_eq!(value_strs(&h, "default"), ["x", "y-a", "z", "u"]);
    assert_eq!(h.emitted()[2].tuple().source_component(), "script");

    assert_eq!(h.acked(), [a, b, c]);
    assert!(h.failed().is_empty() && h.held().is_empty());
    let n = h.counters();
    assert_eq!((n.executed, n.emitted, n.acked, n.failed, n.errors), (4, 5, 4, 0, 0));
    assert_eq!(h.take_emitted().len(), 5);
    assert!(h.emitted().is_empty());
}

#[tokio::test]
async fn held_inputs_are_acked_or_failed_later_and_multi_anchored() {
    let mut h = script().await;
    let a = h.execute(["hold", ""]).await.unwrap();
    let b = h.execute(["hold", ""]).await.unwrap();
    assert_eq!(h.held(), [a, b]);
    assert!(h.acked().is_empty());

    let j = h.execute(["join", "ab"]).await.unwrap();
    let joined = &h.emitted()[0];
    assert_eq!(joined.anchored_to, [a, b], "emit_anchored to both held inputs");
    assert_eq!(h.acked(), [a, b, j]);
    assert!(h.held().is_empty());

    let c = h.execute(["hold", ""]).await.unwrap();
    h.execute(["fail_held", ""]).await.unwrap();
    assert_eq!(h.failed(), [c]);
}

#[tokio::test]
async fn a_dropped_ack_handle_fails_its_input() {
    let mut h = script().await;
    let a = h.execute(["hold", ""]).await.unwrap();
    let d = h.execute(["drop_held", ""]).await.unwrap();
    assert_eq!(h.failed(), [a]);
    assert_eq!(h.acked(), [d]);

    // held at cleanup: the bolt is dropped with the handle
    let b = h.execute(["hold", ""]).await.unwrap();
    h.cleanup().await.unwrap();
    assert_eq!(h.failed(), [a, b]);
    assert!(h.bolt().is_none());
    assert!(matches!(h.execute(["emit", "x"]).await, Err(HarnessError::Stopped { state: "cleaned up", .. })));
}

#[tokio::test]
async fn an_error_or_a_panic_fails_the_input_and_the_task_keeps_running() {
    let mut h = script().await;
    let e = h.execute(["err", "before the error"]).await.unwrap();
    let p = h.execute(["panic", ""]).await.unwrap();
    let u = h.execute(["what", ""]).await.unwrap(); // a fatal error only fails the input too
    let ok = h.execute(["emit", "after"]).await.unwrap();
    assert_eq!(h.failed(), [e, p, u]);
    assert_eq!(h.acked(), [ok]);
    let n = h.counters();
    assert_eq!((n.errors, n.panics, n.failed), (3, 1, 3));
    // what was emitted before the error stays emitted, anchored to the failed input
    assert_eq!(h.emitted()[0].anchored_to, [e]);
}

#[tokio::test]
async fn direct_emits_name_their_task_and_out_of_range_fails() {
    let mut h = script().await;
    let a = h.execute(["direct", "2"]).await.unwrap();
    let b = h.execute(["direct", "3"]).await.unwrap(); // the subscriber has 3 tasks
    let e = h.emitted();
    assert_eq!(e.len(), 1);
    assert_eq!((e[0].stream.as_str(), e[0].direct_task, e[0].anchored_to.as_slice()), ("direct", Some(2), &[a][..]));
    assert_eq!(h.acked(), [a]);
    assert_eq!(h.failed(), [b]);
}

#[tokio::test]
async fn bad_inputs_are_harness_errors() {
    let mut h = script().await;
    let e = h.execute(["emit"]).await.unwrap_err();
    assert!(matches!(e, HarnessError::FieldCount { got: 1, .. }), "{e}");
    let e = h.execute_on("src", "nope", ["emit", "x"]).await.unwrap_err();
    assert!(e.to_string().contains("src/default"), "{e}");
    let mut none = BoltHarness::new(Script::default()).output("default", &["v"]).prepare().await.unwrap();
    assert!(matches!(none.execute(["emit", "x"]).await, Err(HarnessError::NoInput { .. })));
}

#[tokio::test(start_paused = true)]
async fn scheduled_wakeups_and_ticks_fire_as_time_advances() {
    let mut h = script_with(ComponentConfig::default().with_tick(Duration::from_millis(100))).await;
    h.execute(["schedule", "50"]).await.unwrap();
    let held = h.execute(["hold", ""]).await.unwrap();
    assert_eq!(h.scheduled(), 1);
    h.advance(Duration::from_millis(49)).await.unwrap();
    assert_eq!(h.emitted_on("timers").count(), 0);
    h.advance(Duration::from_millis(1)).await.unwrap();
    let fired = h.emitted_on("timers").collect::<Vec<_>>();
    assert_eq!(fired.len(), 1);
    assert_eq!(fired[0].tuple().get_str("timer").unwrap(), "Wakeup(7)");
    assert_eq!(fired[0].anchored_to, [held], "on_timer emits anchored to the held input");
    assert_eq!(h.acked().last(), Some(&held));

    h.advance(Duration::from_millis(300)).await.unwrap(); // ticks at 100, 200, 300
    assert_eq!(value_strs(&h, "timers"), ["Wakeup(7)", "Tick", "Tick", "Tick"]);
    h.tick().await.unwrap();
    assert_eq!(h.emitted_on("timers").count(), 5);
}

#[tokio::test]
async fn watermarks_are_forwarded_in_order_and_drain_ends_the_task() {
    let mut h = script().await;
    h.watermark(Watermark(100)).await.unwrap();
    h.watermark(Watermark(50)).await.unwrap(); // not above: ignored, as in the executor
    h.watermark(Watermark(200)).await.unwrap();
    assert_eq!(h.watermarks_out(), [Watermark(100), Watermark(200)]);
    assert_eq!(value_strs_u64(&h, "wm"), [100, 200]);
    assert!(!h.drained());

    h.drain().await.unwrap();
    assert!(h.drained());
    assert_eq!(h.watermarks_out(), [Watermark(100), Watermark(200), Watermark::MAX]);
    assert_eq!(value_strs_u64(&h, "wm"), [100, 200], "the +infinity watermark ahead of the drain is not on_watermark");
    assert_eq!(value_strs(&h, "timers"), ["drained"]);
    assert!(matches!(h.execute(["emit", "x"]).await, Err(HarnessError::Stopped { state: "drained", .. })));
    h.cleanup().await.unwrap();
}

fn value_strs_u64(h: &BoltHarness<Script>, stream: &str) -> Vec<u64> {
    h.emitted_on(stream).map(|e| e.tuple().get_u64("wm").unwrap()).collect()
}

/// Sums a batch; an input that is not a number fails alone.
#[derive(Default)]
struct BatchSum {
    batches: Vec<usize>,
}

impl Bolt for BatchSum {
    async fn execute(&mut self, _t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        unreachable!("execute_batch takes every input")
    }

    async fn execute_batch(&mut self, inputs: &mut Inputs, out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.batches.push(inputs.len());
        let mut sum = 0;
        while let Some(t) = inputs.next(out).await {
            match t.get_u64("n") {
                Ok(n) => {
                    sum += n;
                    out.emit([sum])?;
                }
                Err(e) => inputs.fail_current(out, &e.into()),
            }
        }
        Ok(())
    }
}

#[derive(Deserialize, Debug, PartialEq)]
struct Sum {
    sum: u64,
}

#[tokio::test]
async fn execute_batch_override_with_fail_current() {
    let mut h = BoltHarness::new(BatchSum::default())
        .input("numbers", "default", &["n"])
        .output("default", &["sum"])
        .prepare()
        .await
        .unwrap();
    let ids = h.execute_batch([values![1u64], values!["two"], values![3u64]]).await.unwrap();
    assert_eq!(ids, [InputId(0), InputId(1), InputId(2)]);
    assert_eq!(h.bolt().unwrap().batches, [3]);
    assert_eq!(h.acked(), [ids[0], ids[2]]);
    assert_eq!(h.failed(), [ids[1]]);
    let sums: Vec<Sum> = h.emitted().iter().map(|e| e.decode().unwrap()).collect();
    assert_eq!(sums, [Sum { sum: 1 }, Sum { sum: 4 }]);
    assert_eq!(h.emitted()[1].anchored_to, [ids[2]]);
    assert_eq!(h.counters().errors, 1);
}

/// The default `execute_batch`: a panic fails the input being executed, the rest run.
#[tokio::test]
async fn a_panic_mid_batch_fails_only_its_input() {
    let mut h = script().await;
    let ids = h.execute_batch([values!["emit", "a"], values!["panic", ""], values!["emit", "c"]]).await.unwrap();
    assert_eq!(h.failed(), [ids[1]]);
    assert_eq!(h.acked(), [ids[0], ids[2]]);
    assert_eq!(value_strs(&h, "default"), ["a", "c"]);
    assert_eq!(h.emitted()[1].anchored_to, [ids[2]]);
}

#[tokio::test]
async fn window_bolt_fires_on_the_watermark_anchored_to_its_inputs() {
    let spec = TumblingWindowConfig::new(1_000, "ts", &["user"]).build(Count).unwrap();
    let mut h = BoltHarness::new(spec.bolt())
        .component_id("win")
        .input("clicks", "default", &["user", "ts"])
        .output("default", spec.output_fields())
        .output("late", spec.late_fields())
        .prepare()
        .await
        .unwrap();
    let al1 = h.execute(values!["al", 100i64]).await.unwrap();
    let bo = h.execute(values!["bo", 500i64]).await.unwrap();
    let al2 = h.execute(values!["al", 300i64]).await.unwrap();
    let al3 = h.execute(values!["al", 1_200i64]).await.unwrap();
    assert!(h.emitted().is_empty());
    assert_eq!(h.held(), [al1, bo, al2, al3], "held until their window fires");

    h.watermark(Watermark(1_000)).await.unwrap();
    #[derive(Deserialize, Debug, PartialEq)]
    struct Agg<'a> {
        user: &'a str,
        window_start_ms: i64,
        window_end_ms: i64,
        count: u64,
    }
    let fired: Vec<(Agg<'_>, &[InputId])> =
        h.emitted().iter().map(|e| (e.decode().unwrap(), e.anchored_to.as_slice())).collect();
    assert_eq!(
        fired,
        [
            (Agg { user: "al", window_start_ms: 0, window_end_ms: 1_000, count: 2 }, &[al1, al2][..]),
            (Agg { user: "bo", window_start_ms: 0, window_end_ms: 1_000, count: 1 }, &[bo][..]),
        ]
    );
    let mut acked = h.acked().to_vec();
    acked.sort();
    assert_eq!(acked, [al1, bo, al2], "acked when their window fired");
    assert_eq!(h.held(), [al3]);
    assert_eq!(h.watermarks_out(), [Watermark(1_000)]);

    // a late click goes to the late stream, anchored to itself
    let late = h.execute(values!["al", 10i64]).await.unwrap();
    let l = h.emitted_on("late").next().unwrap();
    assert_eq!(l.anchored_to, [late]);

    h.drain().await.unwrap();
    let last = h.emitted_on("default").last().unwrap();
    assert_eq!(last.decode::<Agg<'_>>().unwrap().window_start_ms, 1_000);
    assert_eq!(last.anchored_to, [al3]);
    assert!(h.held().is_empty());
    assert!(h.failed().is_empty());
    assert_eq!(spec.stats().fired(), 3);
}

/// A spout of scripted numbers; tracked unless `untracked`.
#[derive(Default)]
struct Numbers {
    queue: VecDeque<u64>,
    untracked: bool,
    acked: Vec<u64>,
    failed: Vec<u64>,
    low: Option<u64>,
    drain_emits: Option<u64>,
    fatal_on: Option<u64>,
    retry_on: Option<u64>,
}

impl Spout for Numbers {
    type MsgId = u64;

    async fn next_tuple(&mut self, out: &mut SpoutOutput<u64>) -> Result<(), ComponentError> {
        let Some(n) = self.queue.pop_front() else { return Ok(()) };
        if self.fatal_on == Some(n) {
            return Err(ComponentError::fatal("fatal"));
        }
        if self.retry_on == Some(n) {
            return Err(ComponentError::retryable("later"));
        }
        if n >= 100 {
            out.emit_direct((n % 100) as usize, "direct", [n], Some(n))?;
        } else if self.untracked {
            out.emit([n])?;
        } else {
            out.emit_tracked([n], n)?;
        }
        out.watermark(n * 10);
        Ok(())
    }

    async fn ack(&mut self, n: u64) {
        self.acked.push(n);
    }

    async fn fail(&mut self, n: u64) {
        self.failed.push(n);
    }

    async fn drain(&mut self, out: &mut SpoutOutput<u64>) -> Result<(), ComponentError> {
        if let Some(n) = self.drain_emits {
            out.emit_tracked([n], n)?;
        }
        Ok(())
    }

    fn low_watermark(&mut self) -> Option<u64> {
        self.low
    }
}

async fn numbers(spout: Numbers, max_pending: usize) -> SpoutHarness<Numbers> {
    SpoutHarness::new(spout)
        .component_id("numbers")
        .output("default", &["n"])
        .direct_output("direct", &["n"], 2)
        .config(ComponentConfig { max_spout_pending: Some(max_pending), ..Default::default() })
        .topology_config(TopologyConfig { message_timeout_ms: 1_000, ..Default::default() })
        .open()
        .await
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn spout_ack_fail_and_timeout_reach_the_spout_once() {
    let mut h = numbers(Numbers { queue: (0..5).collect(), ..Default::default() }, 3).await;
    for _ in 0..3 {
        assert_eq!(h.next_tuple().await.unwrap(), 1);
    }
    assert_eq!((h.pending(), h.room()), (3, 0));
    let e = h.next_tuple().await.unwrap_err();
    assert!(matches!(e, HarnessError::AtMaxPending { pending: 3, .. }), "{e}");

    h.ack(&0).await.unwrap();
    assert!(matches!(h.ack(&0).await, Err(HarnessError::NotPending { .. })), "acked already");
    assert!(matches!(h.fail(&42).await, Err(HarnessError::NotPending { .. })), "never emitted");
    h.fail(&1).await.unwrap();
    assert_eq!((h.pending(), h.room()), (1, 2));
    assert_eq!(h.spout().unwrap().acked, [0]);
    assert_eq!(h.spout().unwrap().failed, [1]);

    h.advance(Duration::from_millis(500)).await.unwrap();
    h.next_tuple().await.unwrap(); // 3, emitted 500 ms after 2
    h.advance(Duration::from_millis(499)).await.unwrap();
    assert_eq!(h.failed(), [1], "nothing timed out yet");
    h.advance(Duration::from_millis(1)).await.unwrap();
    assert_eq!(h.failed(), [1, 2], "2 timed out, 3 has 500 ms left");
    assert_eq!(h.counters().timed_out, 1);
    h.advance(Duration::from_millis(500)).await.unwrap();
    assert_eq!(h.failed(), [1, 2, 3]);
    assert_eq!(h.failed(), h.spout().unwrap().failed.as_slice());

    h.next_tuple().await.unwrap(); // 4
    h.timeout_all().await.unwrap();
    assert_eq!(h.failed(), [1, 2, 3, 4]);
    assert_eq!(h.acked(), [0]);
    let ids: Vec<_> = h.emitted().iter().map(|e| e.msg_id).collect();
    assert_eq!(ids, [Some(0), Some(1), Some(2), Some(3), Some(4)]);
    let c = h.counters();
    assert_eq!((c.emitted, c.acked, c.failed, c.timed_out), (5, 1, 4, 3));
    assert_eq!(h.spout().unwrap().failed, [1, 2, 3, 4]);
}

#[tokio::test]
async fn spout_untracked_direct_and_acking_off() {
    let mut h = numbers(Numbers { queue: [7, 101].into(), untracked: true, ..Default::default() }, 10).await;
    h.next_tuple().await.unwrap();
    h.next_tuple().await.unwrap();
    let e = h.emitted();
    assert_eq!((e[0].msg_id, e[0].direct_task, e[0].stream.as_str()), (None, None, "default"));
    assert_eq!((e[1].msg_id, e[1].direct_task, e[1].stream.as_str()), (Some(101), Some(1), "direct"));
    assert_eq!(h.pending(), 1);
    h.ack_all().await.unwrap();
    assert_eq!(h.acked(), [101]);

    let mut off = SpoutHarness::new(Numbers { queue: [5].into(), ..Default::default() })
        .output("default", &["n"])
        .topology_config(TopologyConfig { acking: false, ..Default::default() })
        .open()
        .await
        .unwrap();
    off.next_tuple().await.unwrap();
    assert_eq!(off.acked(), [5], "acked as soon as it is sent");
    assert_eq!(off.pending(), 0);
    assert_eq!(off.spout().unwrap().acked, [5]);
}

#[tokio::test]
async fn spout_watermarks_low_watermark_and_drain() {
    let mut h = numbers(Numbers { queue: [1, 3].into(), drain_emits: Some(9), ..Default::default() }, 10).await;
    assert_eq!(h.watermark().await.unwrap(), None);
    h.next_tuple().await.unwrap();
    assert_eq!(h.watermarks_out(), [Watermark(10)]);
    h.spout_mut().unwrap().low = Some(25);
    assert_eq!(h.watermark().await.unwrap(), Some(Watermark(25)), "polled while not calling next_tuple");
    h.spout_mut().unwrap().low = Some(20);
    assert_eq!(h.watermark().await.unwrap(), Some(Watermark(25)), "never backwards");
    h.next_tuple().await.unwrap(); // 3: watermark 30
    assert_eq!(h.watermarks_out(), [Watermark(10), Watermark(25), Watermark(30)]);

    h.drain().await.unwrap();
    assert!(h.drained() && !h.is_finished());
    assert_eq!(h.watermarks_out().last(), Some(&Watermark::MAX));
    assert_eq!(h.emitted().last().unwrap().msg_id, Some(9), "the drain hook's final tuple");
    assert!(matches!(h.next_tuple().await, Err(HarnessError::Stopped { state: "drained", .. })));
    h.ack(&9).await.unwrap(); // acks still reach a draining spout
    assert_eq!(h.acked(), [9]);
    h.drain().await.unwrap(); // once
    assert_eq!(h.watermarks_out().iter().filter(|w| **w == Watermark::MAX).count(), 1);
    h.close().await.unwrap();
    assert!(h.spout().is_none());
}

#[tokio::test]
async fn spout_errors_and_activation() {
    let mut h =
        numbers(Numbers { queue: [1, 2, 3].into(), retry_on: Some(1), fatal_on: Some(2), ..Default::default() }, 10)
            .await;
    assert_eq!(h.next_tuple().await.unwrap(), 0, "a retryable error is counted");
    assert_eq!(h.counters().errors, 1);
    let e = h.next_tuple().await.unwrap_err();
    assert!(matches!(e, HarnessError::Task(TopologyError::TaskFailed { hook: "next_tuple", .. })), "{e}");
    h.deactivate().await.unwrap();
    assert!(matches!(h.next_tuple().await, Err(HarnessError::Inactive { .. })));
    h.activate().await.unwrap();
    assert_eq!(h.next_tuple().await.unwrap(), 1);
}

/// Emits `n` tuples from one input.
struct Burst(u64);

impl Bolt for Burst {
    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let base = t.get_u64("n")?;
        for i in 0..self.0 {
            out.emit([base + i])?;
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_hook_that_emits_more_than_the_channel_holds_waits_for_room_and_completes() {
    let cfg = TopologyConfig { channel_capacity: 1, batch_size: 2, ..Default::default() };
    let mut h = BoltHarness::new(Burst(1_000))
        .input("src", "default", &["n"])
        .output("default", &["n"])
        .topology_config(cfg)
        .prepare()
        .await
        .unwrap();
    let a = h.execute([0u64]).await.unwrap();
    let b = h.execute_batch([[10_000u64], [20_000u64]]).await.unwrap();
    assert_eq!(h.emitted().len(), 3_000);
    let ns: Vec<u64> = h.emitted().iter().map(|e| e.tuple().get_u64("n").unwrap()).collect();
    assert!(ns[..1_000].iter().copied().eq(0..1_000), "in emit order");
    assert!(h.emitted()[1_000..2_000].iter().all(|e| e.anchored_to == [b[0]]));
    assert_eq!(h.acked(), [a, b[0], b[1]]);
}

#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
struct Doubled {
    v: u64,
    label: String,
}

/// Emits each input's number doubled as a record of its own type.
struct EmitsRecords;

impl Bolt for EmitsRecords {
    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let v = t.get_u64("n")?;
        out.emit_record(Doubled { v: v * 2, label: format!("n{v}") })?;
        Ok(())
    }
}

/// The harness captures records emitted with `emit_record` as the tuples they encode into,
/// anchored to their inputs like any emit.
#[tokio::test]
async fn the_harness_captures_emitted_records_as_tuples() {
    let mut h = BoltHarness::new(EmitsRecords)
        .input("numbers", "default", &["n"])
        .output("default", &["v", "label"])
        .prepare()
        .await
        .unwrap();
    let ids = h.execute_batch([values![1u64], values![2u64], values![5u64]]).await.unwrap();
    let emitted = h.take_emitted();
    assert_eq!(emitted.len(), 3);
    for (e, (id, n)) in emitted.iter().zip(ids.iter().zip([1u64, 2, 5])) {
        assert_eq!(e.decode::<Doubled>().unwrap(), Doubled { v: n * 2, label: format!("n{n}") });
        assert_eq!(e.stream, "default");
        assert_eq!(e.anchored_to, [*id]);
    }
    assert_eq!(h.acked(), &ids[..]);
}
