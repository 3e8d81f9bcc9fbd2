//! [`ExactlyOnce`]: the bolt that runs a [`KeyedState`] computation with exactly-once state.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use squall_topology::metrics::Counter;
use squall_topology::{
    AckHandle, Bolt, BoltOutput, ComponentError, DEFAULT_STREAM, TaskContext, Timer, Tuple, Values, to_values,
};
use tokio_util::sync::CancellationToken;

use super::dedup::{Applied, Dedup, KeyRange, Origin, ProductionId, RecordId, Verdict, qualified_shard};
use super::store::{
    MAX_BATCH_GET, MAX_ITEM_BYTES, StateEndpoint, StateError, StateStore, StoredItem, TimerAt, WriteOutcome, item_size,
};

/// A keyed computation whose per-key state is kept exactly once (see the [module docs](super)).
///
/// `apply` may run more than once for one input (a conflicting write is redone on the state read
/// again), but only one run's effect is ever committed: it must not have side effects outside
/// `state` and `out`.
pub trait KeyedState: Send + 'static {
    /// The state of one key (stored as JSON; `Default` for a key seen first).
    type State: Serialize + DeserializeOwned + Default + Clone + Send;
    /// What `apply` produces, emitted on the default stream (declare its fields with
    /// [`squall_topology::fields_of`]); use `()` for none.
    type Out: Serialize + DeserializeOwned + Send;

    /// The key of an input. Inputs of one key must reach one task: subscribe with a fields
    /// grouping on what the key is made of.
    fn key(&self, t: &Tuple) -> Result<String, ComponentError>;

    /// Applies one input to its key's state. An error (or a panic) fails the input and leaves the
    /// state as it was before this input.
    fn apply(
        &mut self,
        key: &str,
        state: &mut Self::State,
        t: &Tuple,
        out: &mut Vec<Self::Out>,
    ) -> Result<(), ComponentError>;

    /// The key's timer: the event time (ms since the epoch) at which the key *fires*, e.g. the
    /// end of the window a windowed key names. Asked after each commit's inputs are applied;
    /// `None` (the default) for no timer. A [`super::WindowFirer`] spout fires the key once the
    /// stream's committed watermark reaches it: it freezes the key's state and emits it. Inputs
    /// of a key after it fired are *late*: acked, counted and not applied.
    fn timer(&self, key: &str, state: &Self::State) -> Option<i64> {
        let _ = (key, state);
        None
    }
}

/// Settings of an [`ExactlyOnce`] bolt.
#[derive(Debug, Clone)]
pub struct StateConfig {
    /// The table.
    pub store: StateEndpoint,
    /// Inputs wait at most this long before their keys are committed (the latency bound of
    /// MillWheel's per-key batching). Default 50.
    pub commit_interval_ms: u64,
    /// Commit at once when this many inputs wait. Default 2000.
    pub max_batch_inputs: usize,
    /// Conditional writes in flight at once. Default 32.
    pub write_concurrency: usize,
    /// Longest back-off between retries while the store throttles, errs or is unreachable
    /// (inputs wait; nothing is skipped). Default 5000.
    pub retry_max_backoff_ms: u64,
    /// Weak productions: emit `apply`'s output at once, before the commit, and keep none in the
    /// store. Cheaper; an input redone after a conflict or a crash emits again, so only for
    /// idempotent downstream computations. Default false (strong productions).
    pub weak_productions: bool,
    /// Partitions of the timer index per component (`{scope}#{n}`): spreads timers over
    /// DynamoDB partitions; a [`super::WindowFirer`] of the component must use the same number.
    /// Default 8.
    pub timer_partitions: u32,
    /// Production ids: each strong production is emitted with three more values,
    /// [`PRODUCTION_FIELDS`] (the input record's shard, `{sequence}:{sub_sequence}:{index}`, and
    /// the input's checkpoint), so that an exactly-once bolt after a stage boundary
    /// ([`crate::stage::Boundary::exactly_once`]) applies each production once. Declare the
    /// output fields with them (`Out`'s fields, then these). Default false.
    pub production_ids: bool,
    /// Fault injection for tests: abort the process right after this task's N-th commit is
    /// written and before its inputs are acked (the worst moment to crash). `None` in production.
    #[doc(hidden)]
    pub abort_after_commits: Option<u64>,
}

impl StateConfig {
    /// Defaults for a table.
    pub fn new(store: StateEndpoint) -> Self {
        Self {
            store,
            commit_interval_ms: 50,
            max_batch_inputs: 2000,
            write_concurrency: 32,
            retry_max_backoff_ms: 5000,
            weak_productions: false,
            production_ids: false,
            timer_partitions: 8,
            abort_after_commits: None,
        }
    }
}

struct Input {
    tuple: Tuple,
    id: RecordId,
    handle: AckHandle,
}

/// What became of one input in a commit round.
enum Fate {
    /// Applied: emit these (strong productions, encoded) once written, then ack.
    Applied(Vec<Values>),
    /// Already applied (or handled) earlier: re-send what it produced, under the identity it
    /// was first produced with, and ack.
    Duplicate(Option<Applied>),
    /// Fenced (an earlier owner's read) or failed: fail it.
    Fail,
}

/// A round's inputs of one key, each with its fate, in arrival order.
type Fates = Vec<(Input, Fate)>;

struct Write {
    key: String,
    pk: String,
    expected: Option<u64>,
    state: Vec<u8>,
    dedup: Vec<u8>,
    timer: Option<TimerAt>,
    inputs: Vec<(Input, Fate)>,
}

struct Metrics {
    commits: Counter,
    applied: Counter,
    duplicates: Counter,
    refused: Counter,
    conflicts: Counter,
    retries: Counter,
    failed: Counter,
    reads: Counter,
    late: Counter,
}

struct Running {
    store: StateStore,
    scope: String,
    cancel: CancellationToken,
    m: Metrics,
}

/// A bolt running a [`KeyedState`] computation over Kinesis spout tuples with exactly-once
/// state in DynamoDB. Its inputs must carry the Kinesis spout's fields (`shard_id`,
/// `sequence_number`, `sub_sequence`, `lease_token`, `checkpoint`): they identify each record
/// exactly and fence zombie readers.
pub struct ExactlyOnce<K: KeyedState> {
    cfg: StateConfig,
    logic: K,
    run: Option<Running>,
    pending: HashMap<String, Vec<Input>>,
    waiting: usize,
    armed: bool,
    next_token: u64,
    commits: u64,
}

impl<K: KeyedState> std::fmt::Debug for ExactlyOnce<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExactlyOnce").field("cfg", &self.cfg).field("waiting", &self.waiting).finish_non_exhaustive()
    }
}

/// The fields a production carries after `Out`'s with [`StateConfig::production_ids`]: the
/// source shard qualified by its stream (`{stream}/{shard}`), the production id
/// (`{sequence}:{sub_sequence}:{index}`), the producing stage's checkpoint of the source shard
/// (empty when unknown) and the source shard's hash key range (`start-end`, empty when unknown).
/// A production re-sent because its input was seen again carries the values it was first
/// emitted with.
pub const PRODUCTION_FIELDS: [&str; 4] = ["production_shard", "production_id", "production_floor", "production_range"];

/// `Out`'s fields followed by [`PRODUCTION_FIELDS`]: the output fields of a bolt with
/// [`StateConfig::production_ids`], and the fields of the boundary after it.
pub fn with_production_fields(fields: &[&str]) -> Vec<String> {
    fields.iter().copied().chain(PRODUCTION_FIELDS).map(str::to_string).collect()
}

fn field_error(t: &Tuple, e: impl std::fmt::Display) -> ComponentError {
    if t.fields().index_of("production_id").is_some() {
        return ComponentError::fatal(format!(
            "exactly-once state over another stage's productions needs the intermediate record's ids (fields \
             shard_id, sequence_number, sub_sequence, lease_token, checkpoint); a tuple from component `{}` stream \
             `{}` has none: {e}. Declare the boundary with Boundary::exactly_once()",
            t.source_component(),
            t.stream()
        ));
    }
    ComponentError::fatal(format!(
        "exactly-once state needs inputs from the Kinesis spout's default stream (fields shard_id, \
         sequence_number, sub_sequence, lease_token, checkpoint); a tuple from component `{}` stream `{}` \
         has none: {e}. Subscribe the bolt to the Kinesis spout",
        t.source_component(),
        t.stream()
    ))
}

fn record_id(t: &Tuple) -> Result<RecordId, ComponentError> {
    let floor = t.get_arc_str("checkpoint").map_err(|e| field_error(t, e))?;
    let production = match t.fields().index_of("production_id") {
        None => None,
        Some(_) => {
            let bad = |e: String| {
                ComponentError::fatal(format!(
                    "a production from component `{}` stream `{}` has malformed production fields: {e}; they are \
                     written by an ExactlyOnce bolt with StateConfig::production_ids",
                    t.source_component(),
                    t.stream()
                ))
            };
            let shard = t.get_arc_str("production_shard").map_err(|e| bad(e.to_string()))?;
            let id = t.get_str("production_id").map_err(|e| bad(e.to_string()))?;
            let pfloor = t.get_arc_str("production_floor").map_err(|e| bad(e.to_string()))?;
            let range = optional_str(t, "production_range").map_err(bad)?;
            Some(ProductionId::parse(shard, id, pfloor, range.unwrap_or_default()).map_err(bad)?)
        }
    };
    let shard = t.get_str("shard_id").map_err(|e| field_error(t, e))?;
    // qualified by the stream the record was read from: every stream has a shardId-000000000000
    let stream = optional_str(t, "stream").map_err(|e| field_error(t, e))?.unwrap_or_default();
    let range = match optional_str(t, "shard_range").map_err(|e| field_error(t, e))? {
        None | Some("") => None,
        Some(r) => {
            Some(KeyRange::parse(r).ok_or_else(|| field_error(t, format!("shard_range {r:?} is not `start-end`")))?)
        }
    };
    let hash = match optional_str(t, "hash_key").map_err(|e| field_error(t, e))? {
        None | Some("") => None,
        Some(h) => {
            Some(h.parse::<u128>().map_err(|_| field_error(t, format!("hash_key {h:?} is not a 128-bit number")))?)
        }
    };
    Ok(RecordId {
        shard: qualified_shard(stream, shard),
        sequence: t.get_arc_str("sequence_number").map_err(|e| field_error(t, e))?,
        sub_sequence: t.get_u64("sub_sequence").map_err(|e| field_error(t, e))?,
        lease_token: t.get_u64("lease_token").map_err(|e| field_error(t, e))?,
        floor: (!floor.is_empty()).then_some(floor),
        range,
        hash,
        production,
    })
}

/// A string field the tuple may not have (`None` then).
fn optional_str<'a>(t: &'a Tuple, field: &str) -> Result<Option<&'a str>, String> {
    match t.fields().index_of(field) {
        None => Ok(None),
        Some(_) => t.get_str(field).map(Some).map_err(|e| e.to_string()),
    }
}

impl<K: KeyedState> ExactlyOnce<K> {
    /// A bolt running `logic` with its state in `cfg.store`; the table is opened (and created
    /// when missing) in `prepare`.
    pub fn new(cfg: StateConfig, logic: K) -> Self {
        Self { cfg, logic, run: None, pending: HashMap::new(), waiting: 0, armed: false, next_token: 0, commits: 0 }
    }

    /// The computation.
    pub fn logic(&self) -> &K {
        &self.logic
    }

    /// The item key of `key` in `scope`.
    pub fn item_key(scope: &str, key: &str) -> String {
        format!("{scope}/{key}")
    }

    fn backoff(&self, attempt: u32) -> Duration {
        let ms = 50u64.saturating_mul(1 << attempt.min(10)).min(self.cfg.retry_max_backoff_ms.max(50));
        Duration::from_millis(ms)
    }

    /// Commits every waiting key, until each input is acked or failed (retrying while the store
    /// is unavailable: back-pressure, never a skipped commit). Returns early only when the
    /// topology stops (the dropped handles fail their inputs).
    async fn flush(&mut self, out: &mut BoltOutput) {
        if self.pending.is_empty() {
            return;
        }
        let Some(run) = self.run.take() else { return };
        let mut work: Vec<(String, Vec<Input>)> = self.pending.drain().collect();
        self.waiting = 0;
        let mut attempt = 0u32;
        while !work.is_empty() {
            if run.cancel.is_cancelled() {
                break;
            }
            // 1. read every key's item (strongly consistent), 100 per call
            let pks: Vec<String> = work.iter().map(|(k, _)| Self::item_key(&run.scope, k)).collect();
            let chunks: Vec<Vec<String>> = pks.chunks(MAX_BATCH_GET).map(<[String]>::to_vec).collect();
            let reads = super::concurrently(chunks, self.cfg.write_concurrency, |c| {
                let store = run.store.clone();
                async move { store.get_many(&c).await }
            })
            .await;
            run.m.reads.add(reads.len() as u64);
            let mut items = HashMap::with_capacity(pks.len());
            let mut read_error: Option<StateError> = None;
            for r in reads {
                match r {
                    Ok(m) => items.extend(m),
                    Err(e) => read_error = Some(e),
                }
            }
            if let Some(e) = read_error {
                if e.is_retryable() {
                    run.m.retries.incr();
                    tracing::warn!(error = %e, keys = work.len(), "reading keyed state failed; retrying (inputs wait)");
                    if !sleep(&run.cancel, self.backoff(attempt)).await {
                        break;
                    }
                    attempt += 1;
                    continue;
                }
                tracing::error!(error = %e, keys = work.len(), "reading keyed state failed: failing the inputs");
                for (_, inputs) in work.drain(..) {
                    for i in inputs {
                        run.m.failed.incr();
                        out.fail(i.handle);
                    }
                }
                break;
            }
            // 2. apply, per key, what is new
            let mut writes = Vec::new();
            for (key, inputs) in work.drain(..) {
                let pk = Self::item_key(&run.scope, &key);
                if let Some(w) = self.apply_key(&run, key, pk, inputs, &items, out) {
                    writes.push(w);
                }
            }
            // 3. write, each key one conditional PutItem
            let results = super::concurrently(writes, self.cfg.write_concurrency, |mut w| {
                let store = run.store.clone();
                let scope = run.scope.clone();
                async move {
                    let (state, dedup) = (std::mem::take(&mut w.state), std::mem::take(&mut w.dedup));
                    let r = store.put(&w.pk, &scope, &w.key, w.expected, state, dedup, w.timer.as_ref()).await;
                    (w, r)
                }
            })
            .await;
            let mut retry = false;
            tracing::debug!(writes = results.len(), "state commit round written");
            for (w, r) in results {
                match r {
                    Ok(WriteOutcome::Written) => {
                        run.m.commits.incr();
                        self.commits += 1;
                        if self.cfg.abort_after_commits.is_some_and(|n| self.commits >= n) {
                            tracing::warn!(key = %w.key, commits = self.commits,
                                "abort_after_commits: aborting after a written commit, before its inputs are acked");
                            std::process::abort();
                        }
                        self.settle(w.inputs, &run, out);
                    }
                    Ok(WriteOutcome::Conflict) => {
                        // another writer got there first: read again, judge again
                        run.m.conflicts.incr();
                        work.push((w.key, w.inputs.into_iter().map(|(i, _)| i).collect()));
                    }
                    Err(e) if e.is_retryable() => {
                        run.m.retries.incr();
                        tracing::warn!(key = %w.key, error = %e, "committing keyed state failed; retrying (inputs wait)");
                        retry = true;
                        work.push((w.key, w.inputs.into_iter().map(|(i, _)| i).collect()));
                    }
                    Err(e) => {
                        tracing::error!(key = %w.key, error = %e, "committing keyed state failed: failing its inputs");
                        for (i, _) in w.inputs {
                            run.m.failed.incr();
                            out.fail(i.handle);
                        }
                    }
                }
            }
            if retry {
                if !sleep(&run.cancel, self.backoff(attempt)).await {
                    break;
                }
                attempt += 1;
            } else {
                attempt = 0;
            }
        }
        self.run = Some(run);
    }

    /// Decodes a key's stored item (state and deduplication data; defaults when there is none),
    /// or says why it cannot be read.
    fn decode(item: Option<&StoredItem>) -> Result<(K::State, Dedup), String> {
        let Some(it) = item else { return Ok((K::State::default(), Dedup::default())) };
        if it.version == 0 {
            // every write stores 1 or more: with no readable version the write's condition can
            // never hold (it would conflict forever)
            return Err("its version attribute `ver` is missing or not a whole number".into());
        }
        let state = serde_json::from_slice::<K::State>(&it.state)
            .map_err(|e| format!("its state does not deserialize into the bolt's state type: {e}"))?;
        let dedup = serde_json::from_slice::<Dedup>(&it.dedup)
            .map_err(|e| format!("its deduplication data is unreadable: {e}"))?;
        Ok((state, dedup))
    }

    /// Judges and applies one key's inputs against its stored item; returns the write to make,
    /// or `None` when nothing is to be written (the inputs are settled here then).
    fn apply_key(
        &mut self,
        run: &Running,
        key: String,
        pk: String,
        inputs: Vec<Input>,
        items: &HashMap<String, StoredItem>,
        out: &mut BoltOutput,
    ) -> Option<Write> {
        let table = run.store.table();
        let item = items.get(&pk);
        let (mut state, mut dedup) = match Self::decode(item) {
            Ok(v) => v,
            Err(why) => {
                // never overwritten: the inputs fail (and dead-letter after their retries)
                tracing::error!(key = %key, table = %table, item = %pk,
                    "stored state of key `{key}` in table `{table}` cannot be read ({why}); it is left as it is and \
                     the key's inputs fail. Fix or delete the item, or deploy a state type that reads it");
                for i in inputs {
                    run.m.failed.incr();
                    out.fail(i.handle);
                }
                return None;
            }
        };
        if item.is_some_and(|i| i.fired) {
            self.late(run, &key, &mut dedup, inputs, out);
            return None;
        }
        let (mut fates, mut fresh) = self.judge_apply(run, &key, &mut state, &mut dedup, inputs, None, out);
        if fresh == 0 {
            // nothing new to store: duplicates are acked (their productions re-sent), the rest fail
            self.settle(fates, run, out);
            return None;
        }
        let mut encoded = serde_json::to_vec(&state).map(|s| (s, serde_json::to_vec(&dedup).unwrap_or_default()));
        let too_big = |(s, d): &(Vec<u8>, Vec<u8>)| item_size(&pk, &run.scope, &key, s.len(), d.len()) > MAX_ITEM_BYTES;
        if encoded.as_ref().is_ok_and(too_big) {
            // Some inputs grow the item past DynamoDB's limit: redo the round from the stored
            // item, measuring after each input, so that only the inputs that would take it over
            // fail (the others of the round are committed).
            let sent: Vec<bool> =
                fates.iter().map(|(_, f)| self.cfg.weak_productions && matches!(f, Fate::Applied(_))).collect();
            let inputs: Vec<Input> = fates.into_iter().map(|(i, _)| i).collect();
            let Ok((s, d)) = Self::decode(item) else { unreachable!("decoded above") };
            (state, dedup) = (s, d);
            let limit = Limit { pk: &pk, table, weak_sent: &sent };
            (fates, fresh) = self.judge_apply(run, &key, &mut state, &mut dedup, inputs, Some(limit), out);
            if fresh == 0 {
                self.settle(fates, run, out);
                return None;
            }
            encoded = serde_json::to_vec(&state).map(|s| (s, serde_json::to_vec(&dedup).unwrap_or_default()));
        }
        let (state_bytes, dedup_bytes) = match encoded {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(key = %key, error = %e, "keyed state does not serialize: the inputs fail");
                fail_fresh(&mut fates);
                self.settle(fates, run, out);
                return None;
            }
        };
        let timer = self.logic.timer(&key, &state).map(|fire_at| TimerAt {
            partition: timer_partition(&run.scope, &key, self.cfg.timer_partitions),
            fire_at,
        });
        Some(Write {
            key,
            pk,
            expected: item.map(|i| i.version),
            state: state_bytes,
            dedup: dedup_bytes,
            timer,
            inputs: fates,
        })
    }

    /// Inputs of a key that fired (its state is frozen): duplicates are acked as usual (their
    /// productions re-sent), fenced ones fail, and new ones are *late*: acked, counted and
    /// logged, not applied.
    fn late(&mut self, run: &Running, key: &str, dedup: &mut Dedup, inputs: Vec<Input>, out: &mut BoltOutput) {
        let mut fates = Vec::with_capacity(inputs.len());
        for input in inputs {
            match judge_seen(run, key, dedup, input) {
                Judged::Seen(input, fate) => fates.push((input, fate)),
                Judged::Fresh(input) => {
                    run.m.late.incr();
                    tracing::warn!(key = %key, shard = %input.id.shard, sequence = %input.id.sequence,
                        "late input: key `{key}` already fired (its state is frozen); the input is acked and not \
                         applied");
                    out.ack(input.handle);
                }
            }
        }
        self.settle(fates, run, out);
    }

    /// Judges each input against `dedup` and applies the fresh ones to `state`, in arrival order;
    /// returns their fates and how many were applied. With a `limit`, the item is measured after
    /// each fresh input, and one that would take it past DynamoDB's item limit (or make the
    /// state unserializable) fails alone: state and deduplication data stay as before it.
    #[allow(clippy::too_many_arguments)]
    fn judge_apply(
        &mut self,
        run: &Running,
        key: &str,
        state: &mut K::State,
        dedup: &mut Dedup,
        inputs: Vec<Input>,
        limit: Option<Limit<'_>>,
        out: &mut BoltOutput,
    ) -> (Fates, usize) {
        let mut fates: Fates = Vec::with_capacity(inputs.len());
        let mut fresh = 0usize;
        for (n, input) in inputs.into_iter().enumerate() {
            match judge_seen(run, key, dedup, input) {
                Judged::Seen(input, fate) => fates.push((input, fate)),
                Judged::Fresh(input) => {
                    let before = state.clone();
                    let mut produced = Vec::new();
                    let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
                        self.logic.apply(key, state, &input.tuple, &mut produced)
                    }));
                    match r {
                        Ok(Ok(())) => {
                            let weak = self.cfg.weak_productions;
                            // every production must encode, as a tuple and as stored JSON, before
                            // the input counts as applied: nothing is committed that cannot be sent
                            let encoded = match encode_all(&produced) {
                                Ok(e) => e,
                                Err(e) => {
                                    *state = before;
                                    tracing::error!(key = %key, shard = %input.id.shard, sequence = %input.id.sequence,
                                        error = %e, "a production of this input cannot be emitted: the input fails \
                                         (and dead-letters after its retries); fix the bolt's output type");
                                    fates.push((input, Fate::Fail));
                                    continue;
                                }
                            };
                            let sent = limit.as_ref().is_some_and(|l| l.weak_sent.get(n).copied().unwrap_or(false));
                            if weak
                                && !sent
                                && let Err(e) = self.emit_all(out, &input, &input.id.origin(), encoded.values.clone())
                            {
                                *state = before;
                                tracing::error!(key = %key, shard = %input.id.shard, sequence = %input.id.sequence,
                                    error = %e, "a production of this input cannot be emitted: the input fails (and \
                                     dead-letters after its retries); fix the bolt's output type or declared fields");
                                fates.push((input, Fate::Fail));
                                continue;
                            }
                            let dedup_before = limit.as_ref().map(|_| dedup.clone());
                            dedup.record(&input.id, if weak { Vec::new() } else { encoded.json });
                            dedup.advance(&input.id);
                            if let (Some(l), Some(dedup_before)) = (&limit, dedup_before)
                                && !l.fits(run, key, state, dedup, &input)
                            {
                                *state = before;
                                *dedup = dedup_before;
                                fates.push((input, Fate::Fail));
                                continue;
                            }
                            fresh += 1;
                            fates.push((input, Fate::Applied(if weak { Vec::new() } else { encoded.values })));
                        }
                        Ok(Err(e)) => {
                            *state = before;
                            tracing::warn!(key = %key, error = %e, "applying an input to keyed state failed: the input fails");
                            fates.push((input, Fate::Fail));
                        }
                        Err(_) => {
                            *state = before;
                            tracing::error!(key = %key, "applying an input to keyed state panicked: the input fails");
                            fates.push((input, Fate::Fail));
                        }
                    }
                }
            }
        }
        (fates, fresh)
    }

    /// Emits the productions of `input` (encoded), anchored to it, with the production ids of
    /// `origin` when configured (`{position}:{index}`). The first emit error ends it.
    fn emit_all(
        &self,
        out: &mut BoltOutput,
        input: &Input,
        origin: &Origin,
        values: Vec<Values>,
    ) -> Result<(), String> {
        for (index, mut v) in values.into_iter().enumerate() {
            if self.cfg.production_ids {
                v.push(origin.shard.as_str());
                v.push(format!("{}:{index}", origin.position));
                v.push(origin.floor.as_str());
                v.push(origin.range.map(|r| r.text()).unwrap_or_default());
            } else if v.is_empty() {
                continue;
            }
            out.emit_anchored(&[&input.handle], DEFAULT_STREAM, v).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// After a commit (or when none was needed): sends strong productions anchored to their
    /// inputs, then acks them; fails what failed. An input whose productions cannot be sent
    /// (an emit error, stored productions that no longer decode) fails: it is replayed, and
    /// dead-letters after its retries, never acked with its productions missing.
    fn settle(&self, fates: Vec<(Input, Fate)>, run: &Running, out: &mut BoltOutput) {
        for (input, fate) in fates {
            let sent = match fate {
                Fate::Applied(values) => {
                    run.m.applied.incr();
                    self.emit_all(out, &input, &input.id.origin(), values)
                }
                Fate::Duplicate(None) => Ok(()),
                Fate::Duplicate(Some(applied)) => {
                    let origin = applied.origin.clone().unwrap_or_else(|| input.id.origin());
                    decode_stored::<K::Out>(applied.out).and_then(|values| self.emit_all(out, &input, &origin, values))
                }
                Fate::Fail => {
                    run.m.failed.incr();
                    out.fail(input.handle);
                    continue;
                }
            };
            match sent {
                Ok(()) => out.ack(input.handle),
                Err(e) => {
                    run.m.failed.incr();
                    tracing::error!(shard = %input.id.shard, sequence = %input.id.sequence, error = %e,
                        "the productions of an input cannot be sent: the input fails (replayed, and dead-lettered \
                         after its retries). Fix the bolt's output type or its declared fields");
                    out.fail(input.handle);
                }
            }
        }
    }
}

/// Productions encoded: as tuple values and as the JSON stored with the input.
struct Encoded {
    values: Vec<Values>,
    json: Vec<serde_json::Value>,
}

fn encode_all<O: Serialize>(produced: &[O]) -> Result<Encoded, String> {
    let mut e = Encoded { values: Vec::with_capacity(produced.len()), json: Vec::with_capacity(produced.len()) };
    for p in produced {
        e.values.push(to_values(p).map_err(|err| format!("a production does not encode as a tuple: {err}"))?);
        e.json.push(serde_json::to_value(p).map_err(|err| format!("a production does not serialize: {err}"))?);
    }
    Ok(e)
}

/// Stored productions, decoded into the bolt's output type and encoded as tuple values.
fn decode_stored<O: Serialize + DeserializeOwned>(stored: Vec<serde_json::Value>) -> Result<Vec<Values>, String> {
    stored
        .into_iter()
        .map(|v| {
            let p = serde_json::from_value::<O>(v)
                .map_err(|e| format!("a stored production no longer decodes into the bolt's output type: {e}"))?;
            to_values(&p).map_err(|e| format!("a stored production does not encode as a tuple: {e}"))
        })
        .collect()
}

/// What [`judge_seen`] made of an input.
enum Judged {
    /// Fenced or a duplicate: its fate.
    Seen(Input, Fate),
    /// Not applied yet.
    Fresh(Input),
}

/// Judges one input against `dedup`. One refused by the lease-token fence (its reader is a
/// zombie) fails, and one already applied is a duplicate (its productions re-sent): both counted
/// and logged, with their fate. A fresh input is handed back.
fn judge_seen(run: &Running, key: &str, dedup: &mut Dedup, mut input: Input) -> Judged {
    dedup.adopt(&mut input.id);
    dedup.promote(&input.id);
    match dedup.judge(&input.id) {
        Verdict::Fenced { stored } => {
            run.m.refused.incr();
            tracing::warn!(key = %key, shard = %input.id.shard, sequence = %input.id.sequence,
                token = input.id.lease_token, stored,
                "state write refused: the record was read under lease token {} of shard {}, and a later owner \
                 (token {stored}) already wrote this key; this task is a zombie for that shard",
                input.id.lease_token, input.id.shard);
            Judged::Seen(input, Fate::Fail)
        }
        Verdict::Finished { descendant } => {
            run.m.refused.incr();
            tracing::warn!(key = %key, shard = %input.id.shard, sequence = %input.id.sequence, %descendant,
                "state write refused: the record is of shard {}, which finished (its descendant {descendant} has been \
                 read since, so every record of it was handled); only a zombie reads it now",
                input.id.shard);
            Judged::Seen(input, Fate::Fail)
        }
        Verdict::Duplicate(p) => {
            run.m.duplicates.incr();
            match &input.id.production {
                Some(pid) => tracing::debug!(key = %key, shard = %input.id.shard, sequence = %input.id.sequence,
                    source_shard = %pid.shard, production = %pid.id,
                    "duplicate production skipped: it was already applied to this key"),
                None => tracing::debug!(key = %key, shard = %input.id.shard, sequence = %input.id.sequence,
                    "duplicate input skipped: the record was already applied to this key"),
            }
            dedup.advance(&input.id);
            Judged::Seen(input, Fate::Duplicate(p))
        }
        Verdict::Fresh => Judged::Fresh(input),
    }
}

/// The timer index partition of `key` in `scope`: `{scope}#{n}`, n a stable hash of the key
/// modulo `partitions` (FNV-1a: the same in every process and build).
pub fn timer_partition(scope: &str, key: &str, partitions: u32) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{scope}#{}", h % u64::from(partitions.max(1)))
}

/// The item size check of a round redone input by input (see `ExactlyOnce::judge_apply`).
struct Limit<'a> {
    pk: &'a str,
    table: &'a str,
    /// Per input of the round: its weak productions were emitted already, in the first pass.
    weak_sent: &'a [bool],
}

impl Limit<'_> {
    /// Whether the key's item fits in DynamoDB's limit with `input` applied; when not, logs the
    /// error naming the key and the size.
    fn fits<S: Serialize>(&self, run: &Running, key: &str, state: &S, dedup: &Dedup, input: &Input) -> bool {
        let (shard, sequence) = (&input.id.shard, &input.id.sequence);
        let mut state_len = ByteCount(0);
        if let Err(e) = serde_json::to_writer(&mut state_len, state) {
            tracing::error!(key = %key, error = %e, %shard, %sequence,
                "keyed state does not serialize with this input: the input fails");
            return false;
        }
        let mut dedup_len = ByteCount(0);
        let _ = serde_json::to_writer(&mut dedup_len, dedup);
        let size = item_size(self.pk, &run.scope, key, state_len.0, dedup_len.0);
        if size <= MAX_ITEM_BYTES {
            return true;
        }
        let table = self.table;
        tracing::error!(key = %key, table = %table, size, %shard, %sequence,
            "state of key `{key}` would be {size} bytes with this input, over DynamoDB's item limit of {MAX_ITEM_BYTES} \
             bytes (table `{table}`): the input fails (and dead-letters after its retries). Keep less state per key, \
             or split the key");
        false
    }
}

/// Counts the bytes written to it.
struct ByteCount(usize);

impl std::io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The scope of a component's items in the table: `{topology}/{component}`.
pub fn scope(topology: &str, component: &str) -> String {
    format!("{topology}/{component}")
}

/// Sleeps out a back-off; false when the topology stops meanwhile.
async fn sleep(cancel: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        biased;
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

fn fail_fresh(fates: &mut [(Input, Fate)]) {
    for (_, f) in fates.iter_mut() {
        if matches!(f, Fate::Applied(_)) {
            *f = Fate::Fail;
        }
    }
}

impl<K: KeyedState> Bolt for ExactlyOnce<K> {
    async fn prepare(&mut self, ctx: &TaskContext) -> Result<(), ComponentError> {
        if !ctx.config().acking {
            return Err(ComponentError::fatal(format!(
                "exactly-once state (component `{}` of topology `{}`) needs acking: with `acking: false` every \
                 record is acked to the spout as it is emitted, so its checkpoint passes it before its commit is \
                 written, and a failure loses it. Set `acking: true` in the topology config (the default)",
                ctx.component_id(),
                ctx.topology_name()
            )));
        }
        let store = StateStore::open(&self.cfg.store).await.map_err(|e| {
            if e.is_retryable() {
                ComponentError::retryable(format!("opening the state store: {e}"))
            } else {
                ComponentError::fatal(format!("opening the state store: {e}"))
            }
        })?;
        let m = Metrics {
            commits: ctx.counter("state_commits"),
            applied: ctx.counter("state_applied"),
            duplicates: ctx.counter("state_duplicates"),
            refused: ctx.counter("state_refused"),
            conflicts: ctx.counter("state_conflicts"),
            retries: ctx.counter("state_retries"),
            failed: ctx.counter("state_failed"),
            reads: ctx.counter("state_reads"),
            late: ctx.counter("state_late"),
        };
        let scope = scope(ctx.topology_name(), ctx.component_id());
        self.run = Some(Running { store, scope, cancel: ctx.cancellation(), m });
        Ok(())
    }

    async fn execute(&mut self, t: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let id = record_id(&t)?;
        let key = self.logic.key(&t)?;
        let handle = out.defer_ack().map_err(|e| ComponentError::fatal(e.to_string()))?;
        self.pending.entry(key).or_default().push(Input { tuple: t, id, handle });
        self.waiting += 1;
        if self.waiting >= self.cfg.max_batch_inputs {
            self.flush(out).await;
        } else if !self.armed {
            self.armed = true;
            self.next_token += 1;
            out.schedule_after(Duration::from_millis(self.cfg.commit_interval_ms), self.next_token);
        }
        Ok(())
    }

    async fn on_timer(&mut self, timer: Timer, out: &mut BoltOutput) -> Result<(), ComponentError> {
        if let Timer::Wakeup(token) = timer {
            if token == self.next_token {
                self.armed = false;
            }
            self.flush(out).await;
        }
        Ok(())
    }

    async fn on_drain(&mut self, out: &mut BoltOutput) -> Result<(), ComponentError> {
        self.flush(out).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Count;

    impl KeyedState for Count {
        type State = u64;
        type Out = ();
        fn key(&self, _t: &Tuple) -> Result<String, ComponentError> {
            Ok(String::new())
        }
        fn apply(&mut self, _k: &str, n: &mut u64, _t: &Tuple, _o: &mut Vec<()>) -> Result<(), ComponentError> {
            *n += 1;
            Ok(())
        }
    }

    fn item(version: u64, state: &[u8], dedup: &[u8]) -> StoredItem {
        StoredItem {
            version,
            state: state.to_vec(),
            dedup: dedup.to_vec(),
            fired: false,
            fired_at_ms: None,
            fired_by: None,
            timer: None,
        }
    }

    #[test]
    fn decodes_what_the_bolt_writes_and_refuses_the_rest() {
        type E = ExactlyOnce<Count>;
        assert_eq!(E::decode(None).unwrap(), (0, Dedup::default()));
        assert_eq!(E::decode(Some(&item(3, b"7", b"{}"))).unwrap(), (7, Dedup::default()));
        // no readable version: a write conditioned on it could never succeed
        let e = E::decode(Some(&item(0, b"7", b"{}"))).unwrap_err();
        assert!(e.contains("`ver`"), "{e}");
        let e = E::decode(Some(&item(3, b"\"seven\"", b"{}"))).unwrap_err();
        assert!(e.contains("state does not deserialize"), "{e}");
        let e = E::decode(Some(&item(3, b"7", b""))).unwrap_err();
        assert!(e.contains("deduplication data"), "{e}");
    }
}
