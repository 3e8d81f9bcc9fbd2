//! Property tests (256 cases each): replay under faults, fields grouping, max pending (the ack-tree
//! property is a unit test of the private `acker` module).

mod common;

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use proptest::prelude::*;
use squall_topology::*;

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap()
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    None,
    Err,
    Panic,
    Hang,
}

fn fault(seed: u64, stage: u8, id: u64, attempt: u32, rate: u8) -> Fault {
    if attempt >= 3 {
        return Fault::None; // eventual success
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (seed, stage, id, attempt).hash(&mut h);
    let v = h.finish();
    if (v % 100) as u8 >= rate {
        return Fault::None;
    }
    match (v >> 8) % 3 {
        0 => Fault::Err,
        1 => Fault::Panic,
        _ => Fault::Hang,
    }
}

struct FaultBolt {
    stage: u8,
    seed: u64,
    rate: u8,
    attempts: Arc<Mutex<HashMap<u64, u32>>>,
    fanout: u64,
    seen: Arc<Mutex<HashSet<u64>>>,
}

impl Bolt for FaultBolt {
    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let id = t.get_u64("id")?;
        let attempt = {
            let mut a = self.attempts.lock().unwrap();
            let n = a.entry(id).or_default();
            *n += 1;
            *n - 1
        };
        match fault(self.seed, self.stage, id, attempt, self.rate) {
            Fault::Err => return Err(ComponentError::retryable("injected")),
            Fault::Panic => panic!("injected panic"),
            Fault::Hang => {
                let _never_acked = out.defer_ack()?;
                return Ok(());
            }
            Fault::None => {}
        }
        self.seen.lock().unwrap().insert(id);
        for k in 0..self.fanout {
            // children keyed by (id * 8 + k) so the next stage tracks attempts per child
            out.emit(values![id * 8 + k])?;
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// With random errors, panics and hangs (timeouts) in two bolt stages, every spout message is
    /// eventually acked exactly once, after replays, and none is lost.
    #[test]
    fn every_message_is_eventually_acked_despite_faults(
        n in 1u64..40,
        spouts in 1usize..3,
        p1 in 1usize..4,
        p2 in 1usize..4,
        fanout in 1u64..4,
        rate in 0u8..60,
        seed in any::<u64>(),
        batch_size in 1usize..16,
    ) {
        quiet_injected_panics();
        let rt = paused_runtime();
        let log = Arc::new(Mutex::new(SpoutLog::default()));
        let seen2 = Arc::new(Mutex::new(HashSet::new()));
        let l2 = log.clone();
        let mut b = TopologyBuilder::new("faults");
        b.set_spout("s", spouts, move |ctx| {
            let (i, p) = (ctx.task_index() as u64, ctx.parallelism() as u64);
            ReplaySpout::new((0..n).filter(move |id| id % p == i), l2.clone())
        })
        .fields(&["id"]);
        let a1 = Arc::new(Mutex::new(HashMap::new()));
        let seen1 = Arc::new(Mutex::new(HashSet::new()));
        b.set_bolt("one", p1, move |_| FaultBolt { stage: 1, seed, rate, attempts: a1.clone(), fanout, seen: seen1.clone() })
            .shuffle_grouping("s")
            .fields(&["id"]);
        let a2 = Arc::new(Mutex::new(HashMap::new()));
        let s2 = seen2.clone();
        b.set_bolt("two", p2, move |_| FaultBolt { stage: 2, seed, rate, attempts: a2.clone(), fanout: 0, seen: s2.clone() })
            .fields_grouping("one", &["id"]);
        let topology = b.build().unwrap();
        let config = TopologyConfig { message_timeout_ms: 500, timeout_check_interval_ms: 20, batch_size, ..Default::default() };
        let done = rt.block_on(async {
            let running = run_local(topology, config).unwrap();
            let ok = wait_until(Duration::from_secs(600), || log.lock().unwrap().acked.len() as u64 >= n).await;
            // let stray replays settle, then stop
            tokio::time::sleep(Duration::from_secs(2)).await;
            running.cancel().await.unwrap();
            ok
        });
        prop_assert!(done, "not every message was acked");
        let log = log.lock().unwrap();
        prop_assert!(log.violations.is_empty(), "{:?}", log.violations);
        let mut acked = log.acked.clone();
        acked.sort_unstable();
        prop_assert_eq!(acked, (0..n).collect::<Vec<_>>(), "each message acked exactly once");
        // nothing lost: every child of every message reached the last stage
        let seen2 = seen2.lock().unwrap();
        for id in 0..n {
            for k in 0..fanout {
                prop_assert!(seen2.contains(&(id * 8 + k)), "child {} of {} never processed", k, id);
            }
        }
    }
}

/// Emits each key of its list once, untracked.
struct Keys(Vec<String>);

impl Spout for Keys {
    type MsgId = ();
    async fn next_tuple(&mut self, out: &mut SpoutOutput<()>) -> Result<(), ComponentError> {
        if let Some(k) = self.0.pop() {
            out.emit(values![k, 1u64])?;
        }
        Ok(())
    }
}

struct WhereKey(Arc<Mutex<Vec<(String, usize)>>>, usize);

impl Bolt for WhereKey {
    async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.0.lock().unwrap().push((t.get_str("key")?.to_owned(), self.1));
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Equal keys from any emitting task reach the same task of a fields-grouped bolt.
    #[test]
    fn fields_grouping_sends_equal_keys_to_one_task(
        keys in proptest::collection::vec("[a-e]{1,3}", 1..120),
        emitters in 1usize..4,
        consumers in 1usize..7,
    ) {
        let rt = paused_runtime();
        let rec = Arc::new(Mutex::new(Vec::new()));
        let total = keys.len();
        let keys = Arc::new(keys);
        let mut b = TopologyBuilder::new("fields");
        b.set_spout("k", emitters, move |ctx| {
            Keys(keys.iter().skip(ctx.task_index()).step_by(ctx.parallelism()).cloned().collect())
        })
        .fields(&["key", "n"]);
        let r = rec.clone();
        b.set_bolt("by_key", consumers, move |ctx| WhereKey(r.clone(), ctx.task_index())).fields_grouping("k", &["key"]);
        let topology = b.build().unwrap();
        let ok = rt.block_on(async {
            let running = run_local(topology, TopologyConfig::default()).unwrap();
            let ok = wait_until(Duration::from_secs(60), || rec.lock().unwrap().len() == total).await;
            running.cancel().await.unwrap();
            ok
        });
        prop_assert!(ok);
        let mut task_of: HashMap<String, usize> = HashMap::new();
        for (k, t) in rec.lock().unwrap().iter() {
            let first = *task_of.entry(k.clone()).or_insert(*t);
            prop_assert_eq!(first, *t, "key {} went to tasks {} and {}", k, first, t);
            prop_assert_eq!(*t, grouping::fields_task(&[&Value::from(k.as_str())], consumers));
        }
    }
}

/// Acks a random subset of inputs late (held across several executes) and fails none.
struct LateAcker {
    held: Vec<AckHandle>,
    hold: usize,
    rng: u64,
}

impl Bolt for LateAcker {
    async fn execute(&mut self, _t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.rng = self.rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        if (self.rng >> 33) % 2 == 0 {
            self.held.push(out.defer_ack()?);
        }
        if (self.rng >> 40) % 4 == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        while self.held.len() > self.hold {
            let h = self.held.remove(0);
            out.ack(h);
        }
        Ok(())
    }
    async fn on_watermark(&mut self, _wm: Watermark, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A spout task never has more than `max_spout_pending` tracked tuples in flight.
    #[test]
    fn max_pending_is_never_exceeded(
        n in 1u64..300,
        max_pending in 1usize..20,
        per_call in 1usize..6,
        hold in 0usize..4,
        bolts in 1usize..4,
        seed in any::<u64>(),
    ) {
        let rt = paused_runtime();
        let log = Arc::new(Mutex::new(SpoutLog::default()));
        let l2 = log.clone();
        let mut b = TopologyBuilder::new("pending");
        b.set_spout("s", 1, move |_| {
            let mut s = ReplaySpout::new(0..n, l2.clone());
            s.per_call = per_call;
            s.max_pending = max_pending;
            s
        })
        .fields(&["id"]);
        b.set_bolt("late", bolts, move |ctx| LateAcker { held: Vec::new(), hold, rng: seed ^ ctx.task_index() as u64 })
            .shuffle_grouping("s");
        let topology = b.build().unwrap();
        // a short timeout flushes inputs held by tasks that stopped receiving
        let config = TopologyConfig { max_spout_pending: max_pending, message_timeout_ms: 300, timeout_check_interval_ms: 10, ..Default::default() };
        let ok = rt.block_on(async {
            let running = run_local(topology, config).unwrap();
            let ok = wait_until(Duration::from_secs(600), || log.lock().unwrap().acked.len() as u64 == n).await;
            let pending = running.metrics().component("s").unwrap().pending;
            running.cancel().await.unwrap();
            ok && pending == 0
        });
        prop_assert!(ok, "not all acked");
        let log = log.lock().unwrap();
        prop_assert!(log.violations.is_empty(), "{:?}", log.violations);
        prop_assert!(log.max_outstanding <= max_pending, "outstanding {} > max {}", log.max_outstanding, max_pending);
    }
}
