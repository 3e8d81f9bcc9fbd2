//! Records emitted as the user's own type (`emit_record`) and read back typed
//! (`Inputs::for_each_record`): they group, order, ack and fail exactly as the same values
//! emitted as tuples do, reach readers of tuples as tuples, and a record that does not fit its
//! stream is an emit error.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use squall_topology::testing::BoltHarness;
use squall_topology::*;

const SECS: Duration = Duration::from_secs(20);

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Event {
    key: String,
    n: u64,
    flag: bool,
}

/// Emits `n` events over `keys` keys, tracked; even-numbered ones as records, odd-numbered ones
/// as values (`emit_tracked(&event)`), so both kinds interleave on every target.
struct Events {
    next: u64,
    n: u64,
    keys: u64,
    records: bool,
    acked: Arc<Mutex<Vec<u64>>>,
    failed: Arc<Mutex<Vec<u64>>>,
}

impl Events {
    fn new(n: u64, keys: u64, log: &Log) -> Self {
        Events { next: 0, n, keys, records: true, acked: log.acked.clone(), failed: log.failed.clone() }
    }
}

/// (task, key, n) in the order each task executed them.
type Seen = Arc<Mutex<Vec<(usize, String, u64)>>>;
/// (key, n, flag, "component/stream/fields") of each tuple read.
type Rows = Arc<Mutex<Vec<(String, u64, bool, String)>>>;

#[derive(Default, Clone)]
struct Log {
    acked: Arc<Mutex<Vec<u64>>>,
    failed: Arc<Mutex<Vec<u64>>>,
    seen: Seen,
}

impl Spout for Events {
    type MsgId = u64;
    async fn next_tuple(&mut self, out: &mut SpoutOutput<u64>) -> Result<(), ComponentError> {
        if self.next == self.n {
            out.finish();
            return Ok(());
        }
        let n = self.next;
        let e = Event { key: format!("k{}", n % self.keys), n, flag: n % 3 == 0 };
        if self.records && n % 2 == 0 {
            out.emit_record_tracked(e, n)?;
        } else {
            out.emit_tracked(&e, n)?;
        }
        self.next += 1;
        Ok(())
    }
    async fn ack(&mut self, id: u64) {
        self.acked.lock().unwrap().push(id);
    }
    async fn fail(&mut self, id: u64) {
        self.failed.lock().unwrap().push(id);
    }
}

/// Reads events typed, logging which task saw which.
struct Typed {
    task: usize,
    seen: Seen,
}

impl Bolt for Typed {
    async fn prepare(&mut self, ctx: &TaskContext) -> Result<(), ComponentError> {
        self.task = ctx.task_index();
        Ok(())
    }
    async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        let e: Event = t.decode()?;
        self.seen.lock().unwrap().push((self.task, e.key, e.n));
        Ok(())
    }
    async fn execute_batch(&mut self, inputs: &mut Inputs, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let (task, seen) = (self.task, self.seen.clone());
        inputs
            .for_each_record(out, |e: &Event, _out| {
                assert_eq!(e.flag, e.n % 3 == 0, "the record arrives whole");
                seen.lock().unwrap().push((task, e.key.clone(), e.n));
                Ok(())
            })
            .await;
        Ok(())
    }
}

fn typed(seen: &Seen) -> impl Fn(&TaskContext) -> Typed + Send + Sync + 'static {
    let seen = seen.clone();
    move |_| Typed { task: 0, seen: seen.clone() }
}

/// Equal keys reach the same task whether emitted as records or as values (the record's key
/// field is hashed as its value would be); per key, the events arrive in emit order across the
/// switches between record batches and tuple batches; every tree is acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_and_values_group_order_and_ack_alike() {
    let log = Log::default();
    let mut b = TopologyBuilder::new("records-mixed");
    let l = log.clone();
    b.set_spout("events", 1, move |_| Events::new(2000, 37, &l)).fields_of::<Event>();
    b.set_bolt("typed", 3, typed(&log.seen)).fields_grouping("events", &["key"]);
    let running = run_local(b.build().unwrap(), TopologyConfig::default()).unwrap();
    tokio::time::timeout(SECS, running.wait()).await.expect("the topology ends by itself").unwrap();

    let seen = log.seen.lock().unwrap();
    assert_eq!(seen.len(), 2000);
    let mut task_of: HashMap<&str, usize> = HashMap::new();
    let mut last: HashMap<&str, u64> = HashMap::new();
    for (task, key, n) in seen.iter() {
        let t = *task_of.entry(key).or_insert(*task);
        assert_eq!(t, *task, "key {key}: records and values went to different tasks");
        if let Some(prev) = last.insert(key, *n) {
            assert!(prev < *n, "key {key}: {n} executed after {prev}");
        }
    }
    let tasks: std::collections::HashSet<usize> = task_of.values().copied().collect();
    assert_eq!(tasks.len(), 3, "37 keys spread over the 3 tasks");
    let mut acked = log.acked.lock().unwrap().clone();
    acked.sort_unstable();
    assert_eq!(acked, (0..2000).collect::<Vec<_>>(), "every tree acked");
    assert!(log.failed.lock().unwrap().is_empty());
    let m = running.metrics();
    assert_eq!(m.component("typed").unwrap().executed, 2000);
    assert_eq!(m.component("typed").unwrap().acked, 2000);
}

/// Reads events as tuples (`execute`, by field name).
struct AsTuples(Rows);

impl Bolt for AsTuples {
    async fn execute(&mut self, t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.0.lock().unwrap().push((
            t.get_str("key")?.to_owned(),
            t.get_u64("n")?,
            t.get_bool("flag")?,
            format!("{}/{}/{:?}", t.source_component(), t.stream(), t.fields()),
        ));
        Ok(())
    }
}

/// Records reach a reader of tuples as the tuples they encode into (single subscriber: sent as
/// record batches and turned into tuples on arrival), and two subscribers each get every record
/// (sent as values).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_reach_tuple_readers_and_several_subscribers() {
    for subscribers in [1usize, 2] {
        let log = Log::default();
        let rows: Rows = Default::default();
        let mut b = TopologyBuilder::new("records-tuples");
        let l = log.clone();
        b.set_spout("events", 1, move |_| Events { records: true, ..Events::new(500, 5, &l) }).fields_of::<Event>();
        let r = rows.clone();
        b.set_bolt("tuples", 2, move |_| AsTuples(r.clone())).shuffle_grouping("events");
        if subscribers == 2 {
            b.set_bolt("typed", 2, typed(&log.seen)).fields_grouping("events", &["key"]);
        }
        let running = run_local(b.build().unwrap(), TopologyConfig::default()).unwrap();
        tokio::time::timeout(SECS, running.wait()).await.expect("the topology ends by itself").unwrap();
        let mut rows = rows.lock().unwrap().clone();
        rows.sort_by_key(|r| r.1);
        assert_eq!(rows.len(), 500, "{subscribers} subscriber(s)");
        for (i, (key, n, flag, source)) in rows.iter().enumerate() {
            assert_eq!(*n, i as u64);
            assert_eq!(key, &format!("k{}", n % 5));
            assert_eq!(*flag, n % 3 == 0);
            assert_eq!(source, r#"events/default/["key", "n", "flag"]"#);
        }
        if subscribers == 2 {
            assert_eq!(log.seen.lock().unwrap().len(), 500);
        }
        assert_eq!(log.acked.lock().unwrap().len(), 500);
    }
}

#[derive(Serialize)]
struct Wrong {
    key: String,
}

/// Emits one record of the wrong shape, then a good one, and reports what `emit_record` said.
struct EmitsWrong(Arc<Mutex<Vec<String>>>);

impl Bolt for EmitsWrong {
    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let e: Event = t.decode()?;
        let wrong = out.emit_record(Wrong { key: e.key.clone() });
        self.0.lock().unwrap().push(match wrong {
            Err(err) => err.to_string(),
            Ok(()) => "accepted".to_owned(),
        });
        out.emit_record(e)?;
        Ok(())
    }
}

/// A record that does not fit its stream's fields is the same emit error as values that do not,
/// named in full; the good record after it goes out, and its reader gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_of_the_wrong_shape_is_an_emit_error() {
    let log = Log::default();
    let errors: Arc<Mutex<Vec<String>>> = Default::default();
    let mut b = TopologyBuilder::new("records-wrong");
    let l = log.clone();
    b.set_spout("events", 1, move |_| Events::new(10, 2, &l)).fields_of::<Event>();
    let e = errors.clone();
    b.set_bolt("relay", 1, move |_| EmitsWrong(e.clone())).shuffle_grouping("events").fields_of::<Event>();
    b.set_bolt("typed", 1, typed(&log.seen)).shuffle_grouping("relay");
    let running = run_local(b.build().unwrap(), TopologyConfig::default()).unwrap();
    tokio::time::timeout(SECS, running.wait()).await.expect("the topology ends by itself").unwrap();
    let errors = errors.lock().unwrap();
    assert_eq!(errors.len(), 10);
    for e in errors.iter() {
        assert!(e.contains("emitted 1 values on stream `default`, which declares 3 fields"), "{e}");
        assert!(e.contains("relay"), "{e}");
    }
    assert_eq!(log.seen.lock().unwrap().len(), 10, "the good records went out");
    assert_eq!(log.acked.lock().unwrap().len(), 10);
}

/// Emits values, some of which are not events (a string where `n` is a number).
struct Mixed {
    next: u64,
    log: Log,
}

impl Spout for Mixed {
    type MsgId = u64;
    async fn next_tuple(&mut self, out: &mut SpoutOutput<u64>) -> Result<(), ComponentError> {
        if self.next == 20 {
            out.finish();
            return Ok(());
        }
        let n = self.next;
        if n % 4 == 0 {
            out.emit_tracked(values![format!("k{n}"), "not a number", n % 3 == 0], n)?;
        } else {
            out.emit_tracked(values![format!("k{n}"), n, n % 3 == 0], n)?;
        }
        self.next += 1;
        Ok(())
    }
    async fn ack(&mut self, id: u64) {
        self.log.acked.lock().unwrap().push(id);
    }
    async fn fail(&mut self, id: u64) {
        self.log.failed.lock().unwrap().push(id);
    }
}

/// `for_each_record` over tuples decodes each; one that does not decode is failed (its spout
/// tuple replayed) and counted, the others are acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn for_each_record_decodes_tuples_and_fails_the_ones_that_do_not_decode() {
    let log = Log::default();
    let mut b = TopologyBuilder::new("records-decode");
    let l = log.clone();
    b.set_spout("events", 1, move |_| Mixed { next: 0, log: l.clone() }).fields(&["key", "n", "flag"]);
    b.set_bolt("typed", 1, typed(&log.seen)).shuffle_grouping("events");
    let running = run_local(b.build().unwrap(), TopologyConfig::default()).unwrap();
    tokio::time::timeout(SECS, running.wait()).await.expect("the topology ends by itself").unwrap();
    let mut failed = log.failed.lock().unwrap().clone();
    failed.sort_unstable();
    assert_eq!(failed, vec![0, 4, 8, 12, 16]);
    assert_eq!(log.acked.lock().unwrap().len(), 15);
    let m = running.metrics();
    let typed = m.component("typed").unwrap();
    assert_eq!((typed.executed, typed.acked, typed.failed, typed.errors), (20, 15, 5, 5));
}

/// Holds every other record (acking it at the end of the batch) and fails every fifth.
struct Holds;

impl Bolt for Holds {
    async fn execute(&mut self, _t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        unreachable!("every input is read with for_each_record")
    }
    async fn execute_batch(&mut self, inputs: &mut Inputs, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let mut held = Vec::new();
        inputs
            .for_each_record(out, |e: &Event, out| {
                if e.n % 5 == 0 {
                    return Err(ComponentError::retryable(format!("event {} refused", e.n)));
                }
                if e.n % 2 == 0 {
                    held.push(out.defer_ack()?);
                }
                Ok(())
            })
            .await;
        for h in held {
            out.ack(h);
        }
        Ok(())
    }
}

/// Untracked records (acking off) are read in a loop that counts inputs in bulk: a held input
/// is acked when its handle is, a failed one is counted as failed, and the counters add up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untracked_record_batches_count_held_and_failed_inputs() {
    let log = Log::default();
    let mut b = TopologyBuilder::new("records-untracked");
    let l = log.clone();
    b.set_spout("events", 1, move |_| Events { records: true, ..Events::new(1000, 7, &l) }).fields_of::<Event>();
    b.set_bolt("holds", 2, |_| Holds).shuffle_grouping("events");
    let config = TopologyConfig { acking: false, ..TopologyConfig::default() };
    let running = run_local(b.build().unwrap(), config).unwrap();
    tokio::time::timeout(SECS, running.wait()).await.expect("the topology ends by itself").unwrap();
    let m = running.metrics();
    let holds = m.component("holds").unwrap();
    assert_eq!(holds.executed, 1000);
    assert_eq!(holds.failed, 200, "every fifth event");
    assert_eq!(holds.errors, 200);
    assert_eq!(holds.acked, 800, "the others, the held ones when their handles are acked");
}

/// Panics on every seventh record.
struct Panics;

impl Bolt for Panics {
    async fn execute(&mut self, _t: Tuple, _out: &mut BoltOutput) -> Result<(), ComponentError> {
        unreachable!("every input is read with for_each_record")
    }
    async fn execute_batch(&mut self, inputs: &mut Inputs, out: &mut BoltOutput) -> Result<(), ComponentError> {
        inputs
            .for_each_record(out, |e: &Event, _out| {
                assert!(e.n % 7 != 3, "event {} rejected by a panic", e.n);
                Ok(())
            })
            .await;
        Ok(())
    }
}

/// A panic inside `for_each_record` fails the input being executed, the task goes on with the
/// rest of the batch, and the counters add up (tracked and untracked batches alike).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_for_each_record_fails_its_input_and_the_counters_add_up() {
    quiet_panics();
    for acking in [false, true] {
        let log = Log::default();
        let mut b = TopologyBuilder::new("records-panics");
        let l = log.clone();
        b.set_spout("events", 1, move |_| Events::new(700, 7, &l)).fields_of::<Event>();
        b.set_bolt("panics", 2, |_| Panics).shuffle_grouping("events");
        let config = TopologyConfig { acking, ..TopologyConfig::default() };
        let running = run_local(b.build().unwrap(), config).unwrap();
        tokio::time::timeout(SECS, running.wait()).await.expect("the topology ends by itself").unwrap();
        let m = running.metrics();
        let p = m.component("panics").unwrap();
        assert_eq!((p.executed, p.acked, p.failed, p.errors), (700, 600, 100, 100), "acking {acking}");
        if acking {
            let mut failed = log.failed.lock().unwrap().clone();
            failed.sort_unstable();
            assert_eq!(failed, (0..700).filter(|n| n % 7 == 3).collect::<Vec<_>>());
            assert_eq!(log.acked.lock().unwrap().len(), 600);
        }
    }
}

/// Keeps the expected panics of these tests out of the output.
fn quiet_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !info.to_string().contains("rejected by a panic") {
            default(info);
        }
    }));
}

/// `Event`'s fields, in another order.
#[derive(Serialize)]
struct Reordered {
    n: u64,
    key: String,
    flag: bool,
}

impl From<Event> for Reordered {
    fn from(e: Event) -> Self {
        Reordered { n: e.n, key: e.key, flag: e.flag }
    }
}

/// Relays each event as a `Reordered` record, and reports what `emit_record` said.
struct EmitsReordered(Arc<Mutex<Vec<String>>>);

impl Bolt for EmitsReordered {
    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let e: Event = t.decode()?;
        let r = out.emit_record(Reordered::from(e));
        self.0.lock().unwrap().push(match r {
            Err(err) => err.to_string(),
            Ok(()) => "accepted".to_owned(),
        });
        Ok(())
    }
}

/// Issue 33, point 11: a record whose fields are the stream's in another order is an emit error
/// naming the stream, the type and both field lists (before, it went out: tuple readers read
/// `key` from its `n`, failing forever on replay, and a fields grouping hashed the wrong field).
#[tokio::test]
async fn a_record_whose_fields_are_in_another_order_is_an_emit_error() {
    let errors: Arc<Mutex<Vec<String>>> = Default::default();
    let mut h = BoltHarness::new(EmitsReordered(errors.clone()))
        .input("events", "default", &["key", "n", "flag"])
        .output("default", &["key", "n", "flag"])
        .prepare()
        .await
        .unwrap();
    h.execute(values!["k1", 5u64, false]).await.unwrap();
    h.execute(values!["k2", 6u64, true]).await.unwrap();
    let errors = errors.lock().unwrap().clone();
    assert_eq!((errors.len(), h.emitted().len()), (2, 0), "(emit errors, tuples emitted); emits said {errors:?}");
    for e in &errors {
        for part in ["stream `default`", "Reordered", r#"["n", "key", "flag"]"#, r#"["key", "n", "flag"]"#] {
            assert!(e.contains(part), "{part} in: {e}");
        }
    }
}

/// Emits `n` `Reordered` records, tracked, then ends its stream.
struct ReorderedSpout {
    next: u64,
    n: u64,
    log: Log,
    errors: Arc<Mutex<Vec<String>>>,
}

impl Spout for ReorderedSpout {
    type MsgId = u64;
    async fn next_tuple(&mut self, out: &mut SpoutOutput<u64>) -> Result<(), ComponentError> {
        if self.next == self.n {
            out.finish();
            return Ok(());
        }
        let n = self.next;
        self.next += 1;
        let e = Reordered { n, key: format!("k{n}"), flag: false };
        if let Err(err) = out.emit_record_tracked(e, n) {
            self.errors.lock().unwrap().push(err.to_string());
        }
        Ok(())
    }
    async fn ack(&mut self, id: u64) {
        self.log.acked.lock().unwrap().push(id);
    }
    async fn fail(&mut self, id: u64) {
        self.log.failed.lock().unwrap().push(id);
    }
}

/// Point 11 where a record is routed by its values (two subscribers, one with a fields
/// grouping): the same error, and the refused tracked records are failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reordered_record_routed_by_its_values_is_an_emit_error() {
    let log = Log::default();
    let errors: Arc<Mutex<Vec<String>>> = Default::default();
    let mut b = TopologyBuilder::new("records-reordered");
    let (l, e) = (log.clone(), errors.clone());
    b.set_spout("events", 1, move |_| ReorderedSpout { next: 0, n: 5, log: l.clone(), errors: e.clone() })
        .fields_of::<Event>();
    b.set_bolt("typed", 2, typed(&log.seen)).fields_grouping("events", &["key"]);
    let other = Log::default();
    b.set_bolt("other", 1, typed(&other.seen)).shuffle_grouping("events");
    let running = run_local(b.build().unwrap(), TopologyConfig::default()).unwrap();
    tokio::time::timeout(SECS, running.wait()).await.expect("the topology ends by itself").unwrap();
    let errors = errors.lock().unwrap().clone();
    let mut failed = log.failed.lock().unwrap().clone();
    failed.sort_unstable();
    assert_eq!(
        (errors.len(), log.seen.lock().unwrap().len(), other.seen.lock().unwrap().len(), failed),
        (5, 0, 0, vec![0, 1, 2, 3, 4]),
        "(emit errors, seen by each subscriber, failed ids); emits said {errors:?}"
    );
    assert!(errors[0].contains("Reordered") && errors[0].contains("stream `default`"), "{}", errors[0]);
}
