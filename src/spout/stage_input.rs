//! The Kinesis spout reading a stage's input: the intermediate stream a stage boundary writes
//! (see [`crate::stage`]). Records are Squall stage records ([`crate::stage::codec`]): data
//! records become tuples of the boundary stream's fields; control records are consumed here.
//!
//! # Watermark (MillWheel)
//!
//! Every record carries its producer's low watermark. Per shard, the spout keeps the watermark of
//! the last record it *emitted* (or consumed, for control records) from each producer: records of
//! one producer are in order within a shard, so everything still queued behind is at or after
//! it. A shard's watermark is the minimum over the live producers of the current deployment
//! (the producer registry in ZooKeeper) that have not drained in that shard; it is unknown while
//! such a producer has not been seen in the shard yet (each producer writes a watermark record at
//! least once per interval to every shard it wrote no data to, so this lasts one interval). A
//! producer that left (its registry node is gone: drained, stopped or dead after its session
//! expired) holds the shard as a live one does until the shard was *consumed past* its
//! departure: everything it wrote was put before the first listing that no longer showed it,
//! and is surely read once the reader consumed a record of the shard that arrived
//! [`VISIBILITY_MARGIN_MS`] after that listing, or was caught up with the tip that long after it
//! with nothing queued. Then it no longer holds anything back (its records may still be read, but
//! none is still to come). Producers that left before this input's first listing are unknown to
//! it: every shard's watermark stays unknown until the shard was consumed past that listing.
//! A shard no producer holds reports the current time minus the idle timeout, like a task
//! without shards; so does a shard read to its end (a reshard of the intermediate stream closed
//! it) once every record of it was taken and the idle timeout passed since its end was read: a
//! window holding its last records until it fires must fire for them to be acked, and only then
//! does it finish and are its children read (see the tracker's module docs). The task's
//! watermark is the minimum over its shards, unknown while an assigned shard is not owned yet.
//!
//! # Drain markers
//!
//! A drain marker of the current deployment marks its producer as drained in that shard; a marker
//! of another deployment is ignored (counted). A producer removes its registration once its
//! markers are durably written. While the topology drains, a shard is drained when nothing of
//! it is queued and every producer of the current deployment, registered or seen in the shard,
//! either left a marker in it or has left the registry *and* the shard's reader was caught up
//! with the tip (an empty read, MillisBehindLatest 0) after a listing that no longer showed the
//! producer: everything it wrote was read then. The second case covers a producer that died,
//! and a shard that changed owner after its previous owner consumed the markers (the new owner
//! reads from the checkpoint, past them). A task whose shards are all drained ends its stream.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use squall_topology::Values;
use tokio::sync::watch;

use super::tracker::Record;
use crate::stage::codec::{self, Payload};

/// How long after a producer's last put its records are surely visible to GetRecords (AWS
/// documents a typical propagation delay under 1 s): a caught-up read counts as having seen
/// everything a departed producer wrote only if it happened this long after the listing.
pub const VISIBILITY_MARGIN_MS: i64 = 3_000;

/// One listing of an intermediate stream's producer registry
/// (`{topology}/stages/{stream}/producers`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Producers {
    /// Producer id -> deployment id.
    pub live: BTreeMap<u64, String>,
    /// Wall time (ms) of the listing: a producer absent from it wrote its last record before.
    pub listed_at_ms: i64,
}

/// The live producers, `None` until the first listing.
pub type LiveProducers = Option<Arc<Producers>>;

/// What a stage's input spout is told by the stage runtime.
#[derive(Debug, Clone)]
pub struct StageInputSpec {
    /// The boundary stream's fields (the spout's default stream declares them).
    pub fields: Vec<String>,
    /// Append the intermediate record's ids to every tuple ([`super::STAGE_RECORD_ID_FIELDS`]),
    /// for an exactly-once bolt after the boundary.
    pub record_ids: bool,
    /// The current deployment id: drain markers of other deployments are ignored, and only
    /// producers of this deployment hold the watermark.
    pub deployment: String,
    /// The producer registry, kept current by the worker.
    pub producers: watch::Receiver<LiveProducers>,
    /// Set by the worker when the topology drains: the spout keeps reading until every shard
    /// it owns is drained (see the module docs), then ends its stream.
    pub drain: watch::Receiver<bool>,
}

/// Counters of a stage input (shared with the worker's status).
#[derive(Debug, Default)]
pub struct StageInputStats {
    /// Watermark control records consumed.
    pub watermark_records: AtomicU64,
    /// Drain markers of this deployment consumed.
    pub drain_markers: AtomicU64,
    /// Drain markers of another deployment, ignored.
    pub stale_drain_markers: AtomicU64,
    /// Records that did not decode (logged with shard and sequence, skipped).
    pub malformed: AtomicU64,
}

#[derive(Debug, Default)]
struct ShardInput {
    epoch: u64,
    /// Producer -> the watermark of its last record consumed from this shard.
    wms: HashMap<u64, u64>,
    /// Producers of this deployment seen in this shard.
    seen: HashSet<u64>,
    /// Producers whose drain marker of this deployment was consumed from this shard.
    drained: HashSet<u64>,
    /// The latest arrival time (ms) of the records consumed from this shard.
    consumed_ms: Option<i64>,
}

/// How far a shard owned by the task has been read (from its tracker), for the rule on
/// producers that left.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ReadProgress {
    /// Wall time (ms) of the reader's last read that was caught up with the tip (nothing
    /// returned, MillisBehindLatest 0).
    pub caught_up_ms: Option<i64>,
    /// Records of the shard are read and not consumed yet.
    pub queued: bool,
    /// The shard's end was read.
    pub ended: bool,
    /// The shard's end was read at least the idle timeout ago.
    pub ended_idle: bool,
}

/// Most producers that left remembered (the oldest are forgotten first).
const MAX_DEPARTED: usize = 4096;

/// What the input learnt from the registry listings it saw.
#[derive(Debug, Default)]
struct Registry {
    /// The last listing looked at.
    last: Option<Arc<Producers>>,
    /// When the first listing looked at was made: a producer that left before is unknown here.
    first_ms: Option<i64>,
    /// Producers of the current deployment that left, each with the time of the first listing
    /// that no longer showed it (everything it wrote was put before).
    departed: HashMap<u64, i64>,
}

/// What to do with a record taken from a shard's queue.
#[derive(Debug)]
pub(crate) enum Step {
    /// Emit these tuples (a data record), as one tracked spout tuple.
    Emit(Vec<Values>),
    /// Consumed here (a control record, or a malformed one): ack it at once.
    Consumed,
}

/// A shard's watermark.
#[derive(Debug, PartialEq, Eq)]
enum ShardWm {
    Known(u64),
    Unknown,
    /// No live producer of this deployment holds it.
    Free,
}

/// The stage-input state of one spout task.
#[derive(Debug)]
pub(crate) struct StageInput {
    spec: StageInputSpec,
    fields: usize,
    shards: HashMap<Arc<str>, ShardInput>,
    registry: Registry,
    pub(crate) stats: Arc<StageInputStats>,
    stream: String,
}

impl StageInput {
    pub(crate) fn new(spec: StageInputSpec, stream: &str) -> Self {
        Self {
            fields: spec.fields.len(),
            spec,
            shards: HashMap::new(),
            registry: Registry::default(),
            stats: Arc::default(),
            stream: stream.into(),
        }
    }

    /// Takes in a new registry listing: producers of the current deployment that are no longer
    /// listed have left (at that listing's time); one listed again is live again.
    fn observe(&mut self) {
        let Some(now) = self.spec.producers.borrow().clone() else { return };
        if self.registry.last.as_ref().is_some_and(|l| Arc::ptr_eq(l, &now)) {
            return;
        }
        self.registry.first_ms.get_or_insert(now.listed_at_ms);
        let dep = &self.spec.deployment;
        if let Some(prev) = &self.registry.last {
            for (id, _) in prev.live.iter().filter(|(id, d)| *d == dep && !now.live.contains_key(*id)) {
                self.registry.departed.entry(*id).or_insert(now.listed_at_ms);
            }
        }
        for (id, _) in now.live.iter().filter(|(_, d)| *d == dep) {
            self.registry.departed.remove(id);
        }
        self.registry.last = Some(now);
        forget_oldest(&mut self.registry.departed);
    }

    fn shard(&mut self, shard: &Arc<str>, epoch: u64) -> &mut ShardInput {
        let s = self.shards.entry(shard.clone()).or_default();
        if s.epoch != epoch {
            // a new ownership reads again from the checkpoint: start over
            *s = ShardInput { epoch, ..ShardInput::default() };
        }
        s
    }

    /// Decodes a record taken from its shard's queue and applies what it says.
    pub(crate) fn on_record(&mut self, rec: &Record, epoch: u64) -> Step {
        let decoded = match codec::decode(&rec.data, self.fields) {
            Ok(d) => d,
            Err(e) => {
                let n = self.stats.malformed.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_power_of_two() {
                    tracing::error!(stream = %self.stream, shard = %rec.shard_id, sequence = %rec.sequence, malformed = n,
                        error = %e, "skipping a record of the intermediate stream that is not a valid stage record");
                }
                return Step::Consumed;
            }
        };
        let current = decoded.deployment == self.spec.deployment;
        if current {
            // a producer of this deployment that no listing this input saw shows: it left
            // before the latest listing (or, before any, now)
            self.observe();
            let listed = self.registry.last.as_ref().map(|p| (p.live.contains_key(&decoded.producer), p.listed_at_ms));
            if !listed.is_some_and(|(live, _)| live) {
                let at = listed.map_or_else(crate::coord::now_ms, |(_, at)| at);
                self.registry.departed.entry(decoded.producer).or_insert(at);
                forget_oldest(&mut self.registry.departed);
            }
        }
        let s = self.shard(&rec.shard_id, epoch);
        s.consumed_ms = Some(s.consumed_ms.map_or(rec.arrival_ms, |c| c.max(rec.arrival_ms)));
        if current {
            s.seen.insert(decoded.producer);
            if let Some(wm) = decoded.watermark {
                let e = s.wms.entry(decoded.producer).or_insert(wm);
                *e = (*e).max(wm);
            }
        }
        match decoded.payload {
            Payload::Data(values) => Step::Emit(values),
            Payload::Watermark => {
                self.stats.watermark_records.fetch_add(1, Ordering::Relaxed);
                Step::Consumed
            }
            Payload::Drain if current => {
                s.drained.insert(decoded.producer);
                self.stats.drain_markers.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(stream = %self.stream, shard = %rec.shard_id, producer = decoded.producer, "drain marker");
                Step::Consumed
            }
            Payload::Drain => {
                self.stats.stale_drain_markers.fetch_add(1, Ordering::Relaxed);
                tracing::info!(stream = %self.stream, shard = %rec.shard_id, marker = %decoded.deployment,
                    current = %self.spec.deployment, "ignoring a drain marker of another deployment");
                Step::Consumed
            }
        }
    }

    /// The live producers of the current deployment in the listing last observed (the one the
    /// departures were taken from); `None` before the first registry listing.
    fn live(&self) -> Option<Vec<u64>> {
        let p = self.registry.last.as_ref()?;
        Some(p.live.iter().filter(|(_, d)| **d == self.spec.deployment).map(|(p, _)| *p).collect())
    }

    /// Whether tuples carry the intermediate record's ids.
    pub(crate) fn record_ids(&self) -> bool {
        self.spec.record_ids
    }

    /// True once the worker asked the topology to drain.
    pub(crate) fn drain_requested(&self) -> bool {
        *self.spec.drain.borrow()
    }

    /// Whether the shard was consumed past wall time `t`: everything put into it before `t`
    /// (visible to a read [`VISIBILITY_MARGIN_MS`] later) has been taken from its queue.
    fn consumed_past(s: Option<&ShardInput>, read: ReadProgress, t: i64) -> bool {
        let after = t.saturating_add(VISIBILITY_MARGIN_MS);
        s.and_then(|s| s.consumed_ms).is_some_and(|c| c > after)
            || (!read.queued && (read.ended || read.caught_up_ms.is_some_and(|c| c > after)))
    }

    fn shard_wm(&self, shard: &str, epoch: u64, read: ReadProgress, live: &[u64]) -> ShardWm {
        // read to its end, every record taken, the idle timeout passed: nothing can arrive in it
        // any more, and a window holding its last records until it fires must be able to fire
        // (its children are read only once they are acked: see the tracker's module docs)
        if read.ended_idle && !read.queued {
            return ShardWm::Free;
        }
        let s = self.shards.get(shard).filter(|s| s.epoch == epoch);
        let past = |t: i64| Self::consumed_past(s, read, t);
        // producers that left before the first listing are unknown: their records may be ahead
        if !self.registry.first_ms.is_some_and(past) {
            return ShardWm::Unknown;
        }
        let departed = self.registry.departed.iter().filter(|(p, _)| !live.contains(p));
        let holders = live.iter().map(|p| (p, None)).chain(departed.map(|(p, t)| (p, Some(*t))));
        let mut min: Option<u64> = None;
        for (p, left) in holders {
            if s.is_some_and(|s| s.drained.contains(p)) || left.is_some_and(past) {
                continue;
            }
            match s.and_then(|s| s.wms.get(p)) {
                Some(w) => min = Some(min.map_or(*w, |m| m.min(*w))),
                None => return ShardWm::Unknown,
            }
        }
        min.map_or(ShardWm::Free, ShardWm::Known)
    }

    /// The task's watermark over the shards it owns (`owned`: shard, epoch and how far it was
    /// read), given that every assigned shard is owned and read (`ready`); `free` is what a
    /// shard no producer holds reports.
    pub(crate) fn task_watermark<'a>(
        &mut self,
        owned: impl Iterator<Item = (&'a Arc<str>, u64, ReadProgress)>,
        ready: bool,
        free: u64,
    ) -> Option<u64> {
        if !ready {
            return None;
        }
        self.observe();
        let live = self.live()?;
        let mut min: Option<u64> = None;
        for (shard, epoch, read) in owned {
            let w = match self.shard_wm(shard, epoch, read, &live) {
                ShardWm::Known(w) => w,
                ShardWm::Unknown => return None,
                ShardWm::Free => free,
            };
            min = Some(min.map_or(w, |m| m.min(w)));
        }
        // a task without shards holds nothing back
        Some(min.unwrap_or(free))
    }

    /// True when the shard is drained (see the module docs): nothing of it `queued`, and every
    /// producer of the current deployment registered or seen in it left a marker, or left the
    /// registry before the reader's last caught-up read (`caught_up_ms`).
    pub(crate) fn shard_drained(&self, shard: &str, epoch: u64, queued: bool, caught_up_ms: Option<i64>) -> bool {
        if queued {
            return false;
        }
        let Some(p) = self.spec.producers.borrow().clone() else { return false };
        let s = self.shards.get(shard).filter(|s| s.epoch == epoch);
        let marked = |id: &u64| s.is_some_and(|s| s.drained.contains(id));
        let live_ok = p.live.iter().filter(|(_, d)| **d == self.spec.deployment).all(|(id, _)| marked(id));
        let gone_read = caught_up_ms.is_some_and(|c| c > p.listed_at_ms.saturating_add(VISIBILITY_MARGIN_MS));
        let seen_ok = s.is_none_or(|s| s.seen.iter().all(|id| marked(id) || (!p.live.contains_key(id) && gone_read)));
        // nothing seen in this ownership: everything written before the listing must be read
        let unseen_ok = s.is_some_and(|s| !s.seen.is_empty()) || gone_read;
        live_ok && seen_ok && unseen_ok
    }
}

/// Keeps at most [`MAX_DEPARTED`] producers that left, forgetting the earliest to leave.
fn forget_oldest(departed: &mut HashMap<u64, i64>) {
    while departed.len() > MAX_DEPARTED {
        let Some(oldest) = departed.iter().min_by_key(|(_, t)| **t).map(|(p, _)| *p) else { return };
        departed.remove(&oldest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stage::codec::{encode_control, encode_data};
    use squall_topology::Value;

    fn rec(shard: &Arc<str>, data: bytes::Bytes) -> Record {
        rec_at(shard, data, 0)
    }

    fn rec_at(shard: &Arc<str>, data: bytes::Bytes, arrival_ms: i64) -> Record {
        Record {
            shard_id: shard.clone(),
            sequence: "1".into(),
            sub_sequence: 0,
            partition_key: "k".into(),
            arrival_ms,
            data,
        }
    }

    fn producers(live: &[(u64, &str)], at: i64) -> LiveProducers {
        Some(Arc::new(Producers { live: live.iter().map(|(p, d)| (*p, d.to_string())).collect(), listed_at_ms: at }))
    }

    fn input(live: &[(u64, &str)]) -> (StageInput, watch::Sender<LiveProducers>) {
        let (tx, rx) = watch::channel(producers(live, 0));
        let drain = watch::channel(false).1;
        let spec = StageInputSpec {
            fields: vec!["word".into()],
            record_ids: false,
            deployment: "dep".into(),
            producers: rx,
            drain,
        };
        (StageInput::new(spec, "s"), tx)
    }

    /// The task's watermark over one owned shard `a` (epoch 1) read as `read` says.
    fn wm_of(si: &mut StageInput, a: &Arc<str>, read: ReadProgress, free: u64) -> Option<u64> {
        si.task_watermark(std::iter::once((a, 1, read)), true, free)
    }

    /// Read and consumed to the tip at `at`: nothing queued, caught up then.
    fn caught_up(at: i64) -> ReadProgress {
        ReadProgress { caught_up_ms: Some(at), queued: false, ended: false, ended_idle: false }
    }

    #[test]
    fn the_watermark_is_the_minimum_over_live_producers_and_waits_for_each() {
        let (mut si, tx) = input(&[(1, "dep"), (2, "dep"), (3, "old")]);
        let a: Arc<str> = "a".into();
        let read = caught_up(10_000);
        assert_eq!(wm_of(&mut si, &a, read, 5), None, "no producer seen yet");
        // records that arrived after the first listing (at 0) and the visibility margin
        assert!(matches!(
            si.on_record(&rec_at(&a, encode_data(1, "dep", Some(100), &[Value::from("w")]), 3_500), 1),
            Step::Emit(_)
        ));
        assert_eq!(wm_of(&mut si, &a, read, 5), None, "producer 2 not seen yet");
        assert!(matches!(
            si.on_record(&rec_at(&a, encode_control(2, "dep", Some(50), false), 3_500), 1),
            Step::Consumed
        ));
        assert_eq!(wm_of(&mut si, &a, read, 5), Some(50), "min(100, 50)");
        assert_eq!(si.task_watermark(std::iter::empty(), true, 5), Some(5), "no shard: free");
        assert_eq!(si.task_watermark(std::iter::once((&a, 1, read)), false, 5), None, "shards to come");
        // a producer of another deployment never holds it back
        si.on_record(&rec(&a, encode_control(3, "old", Some(1), false)), 1);
        assert_eq!(wm_of(&mut si, &a, read, u64::MAX), Some(50));
        // producer 2 leaves (listing at 1000): it holds the shard until the shard was consumed
        // past its departure (and the visibility margin)
        tx.send_replace(producers(&[(1, "dep")], 1000));
        assert_eq!(wm_of(&mut si, &a, caught_up(3_900), u64::MAX), Some(50), "within the visibility margin");
        let queued = ReadProgress { queued: true, ..caught_up(4_001) };
        assert_eq!(wm_of(&mut si, &a, queued, u64::MAX), Some(50), "records read are still queued");
        assert_eq!(wm_of(&mut si, &a, caught_up(4_001), u64::MAX), Some(100), "consumed past it: 1 alone holds it");
        // producer 2 left, but the reader has not been caught up since: not drained
        si.on_record(&rec(&a, encode_control(1, "dep", Some(150), true)), 1);
        assert!(!si.shard_drained("a", 1, false, Some(900)));
        assert!(!si.shard_drained("a", 1, false, Some(1001)), "within the visibility margin");
        // caught up well after the listing that no longer showed it: drained
        assert!(si.shard_drained("a", 1, false, Some(4001)));
        assert!(!si.shard_drained("a", 1, true, Some(4001)), "records still queued");
        assert_eq!(wm_of(&mut si, &a, caught_up(4_001), u64::MAX), Some(u64::MAX), "nothing holds a drained shard");
    }

    #[test]
    fn a_producer_that_left_holds_the_shard_until_its_records_were_consumed() {
        // two producers; 2 dies (its registration goes with its session at 10 s) while the
        // reader lags behind its last records
        let (mut si, tx) = input(&[(1, "dep"), (2, "dep")]);
        let a: Arc<str> = "a".into();
        let data = |p: u64, wm: u64| encode_data(p, "dep", Some(wm), &[Value::from("w")]);
        si.on_record(&rec_at(&a, data(1, 5_000), 4_000), 1);
        si.on_record(&rec_at(&a, data(2, 4_000), 4_100), 1);
        let lagging = ReadProgress { caught_up_ms: None, queued: true, ended: false, ended_idle: false };
        assert_eq!(wm_of(&mut si, &a, lagging, 99_000), Some(4_000));
        tx.send_replace(producers(&[(1, "dep")], 10_000));
        // producer 1 runs ahead; 2's last records (watermark 9 000, put before 10 000) unread
        si.on_record(&rec_at(&a, data(1, 11_000), 10_500), 1);
        assert_eq!(wm_of(&mut si, &a, lagging, 99_000), Some(4_000), "2 left, its records are still to come");
        si.on_record(&rec_at(&a, data(2, 9_000), 9_900), 1);
        assert_eq!(wm_of(&mut si, &a, lagging, 99_000), Some(9_000));
        // consumed a record that arrived after the departure and the margin: all of 2's are read
        si.on_record(&rec_at(&a, data(1, 14_000), 13_100), 1);
        assert_eq!(wm_of(&mut si, &a, lagging, 99_000), Some(14_000));

        // a shard no live producer writes: "free" (now minus the idle timeout) only once the
        // dead producer's records were consumed, not while they are unread
        let (mut si, tx) = input(&[(2, "dep")]);
        let b: Arc<str> = "b".into();
        si.on_record(&rec_at(&b, data(2, 4_000), 4_100), 1);
        tx.send_replace(producers(&[], 10_000));
        let free = 50_000;
        let lag = ReadProgress { caught_up_ms: Some(5_000), queued: false, ended: false, ended_idle: false };
        assert_eq!(si.task_watermark(std::iter::once((&b, 1, lag)), true, free), Some(4_000), "not free: unread");
        let unseen: Arc<str> = "c".into();
        assert_eq!(
            si.task_watermark(std::iter::once((&unseen, 1, lag)), true, free),
            None,
            "a shard it may have written to and not read past yet: unknown"
        );
        assert_eq!(si.task_watermark(std::iter::once((&b, 1, caught_up(13_001))), true, free), Some(free));
        assert_eq!(si.task_watermark(std::iter::once((&unseen, 1, caught_up(13_001))), true, free), Some(free));
        let ended = ReadProgress { caught_up_ms: None, queued: false, ended: true, ended_idle: false };
        assert_eq!(si.task_watermark(std::iter::once((&unseen, 1, ended)), true, free), Some(free), "read to its end");
    }

    #[test]
    fn producers_that_left_before_the_first_listing_hold_every_shard_until_it_was_consumed_past_it() {
        // a restarted worker: its first listing (at 20 000) shows producer 1 only; a producer
        // that died before may have records in any shard, not read yet
        let (tx, rx) = watch::channel(producers(&[(1, "dep")], 20_000));
        let spec = StageInputSpec {
            fields: vec!["word".into()],
            record_ids: false,
            deployment: "dep".into(),
            producers: rx,
            drain: watch::channel(false).1,
        };
        let mut si = StageInput::new(spec, "s");
        let a: Arc<str> = "a".into();
        let data = |p: u64, wm: u64| encode_data(p, "dep", Some(wm), &[Value::from("w")]);
        si.on_record(&rec_at(&a, data(1, 30_000), 15_000), 1);
        let lagging = ReadProgress { caught_up_ms: None, queued: true, ended: false, ended_idle: false };
        assert_eq!(wm_of(&mut si, &a, lagging, 99_000), None, "not consumed past the first listing yet");
        // producer 9, dead before the listing, shows up: unknown to the registry, it has left
        si.on_record(&rec_at(&a, data(9, 12_000), 16_000), 1);
        si.on_record(&rec_at(&a, data(1, 31_000), 22_900), 1);
        assert_eq!(wm_of(&mut si, &a, lagging, 99_000), None, "within the visibility margin of the listing");
        assert_eq!(wm_of(&mut si, &a, caught_up(23_100), 99_000), Some(31_000), "caught up past it, nothing queued");
        si.on_record(&rec_at(&a, data(1, 32_000), 23_500), 1);
        assert_eq!(wm_of(&mut si, &a, lagging, 99_000), Some(32_000), "consumed past the listing");
        // it registers again (a new session of its worker): live again
        tx.send_replace(producers(&[(1, "dep"), (9, "dep")], 40_000));
        assert_eq!(wm_of(&mut si, &a, lagging, 99_000), Some(12_000));
    }

    #[test]
    fn a_shard_read_to_its_end_is_free_once_the_idle_timeout_passed_since() {
        // a live producer's last record in the shard (it writes into the children now): the
        // shard is held at that record's watermark until the idle timeout after its end
        let (mut si, _tx) = input(&[(1, "dep")]);
        let a: Arc<str> = "a".into();
        si.on_record(&rec_at(&a, encode_data(1, "dep", Some(7_000), &[Value::from("w")]), 5_000), 1);
        let ended =
            |ended_idle: bool, queued: bool| ReadProgress { caught_up_ms: None, queued, ended: true, ended_idle };
        assert_eq!(wm_of(&mut si, &a, ended(false, false), 99_000), Some(7_000), "ended, within the idle timeout");
        assert_eq!(wm_of(&mut si, &a, ended(true, true), 99_000), Some(7_000), "records still queued");
        assert_eq!(wm_of(&mut si, &a, ended(true, false), 99_000), Some(99_000), "ended and idle: free");
    }

    #[test]
    fn drain_waits_for_every_live_producer_marker_and_ignores_stale_markers() {
        let (mut si, tx) = input(&[(1, "dep"), (2, "dep")]);
        let a: Arc<str> = "a".into();
        assert!(!si.shard_drained("a", 1, false, Some(5)), "live producers not marked");
        si.on_record(&rec(&a, encode_control(1, "old", Some(200), true)), 1);
        assert_eq!(si.stats.stale_drain_markers.load(Ordering::Relaxed), 1);
        si.on_record(&rec(&a, encode_control(1, "dep", Some(200), true)), 1);
        assert!(!si.shard_drained("a", 1, false, Some(5)), "producer 2 has not marked");
        si.on_record(&rec(&a, encode_control(2, "dep", Some(200), true)), 1);
        assert!(si.shard_drained("a", 1, false, None));
        // a new ownership reads from the checkpoint, past the markers: drained once the
        // producers left and the reader caught up after that
        tx.send_replace(producers(&[], 50));
        assert!(!si.shard_drained("a", 2, false, None));
        assert!(!si.shard_drained("a", 2, false, Some(40)));
        assert!(si.shard_drained("a", 2, false, Some(3051)));
    }

    #[test]
    fn malformed_records_are_consumed_and_counted() {
        let (mut si, _tx) = input(&[]);
        let a: Arc<str> = "a".into();
        assert!(matches!(si.on_record(&rec(&a, bytes::Bytes::from_static(b"plain")), 1), Step::Consumed));
        assert!(matches!(si.on_record(&rec(&a, encode_data(1, "dep", None, &[])), 1), Step::Consumed));
        assert_eq!(si.stats.malformed.load(Ordering::Relaxed), 2);
    }
}
