//! Per-shard bookkeeping of emitted records: what is in flight, what may be checkpointed, what must
//! be replayed. Pure logic shared by the spout (emit, ack, fail) and the coordinator (checkpoint,
//! shard end, handoff) behind one short-held mutex.
//!
//! The checkpoint of a shard is the highest (sequence number, sub-sequence) whose user record and
//! every earlier emitted user record of that shard are acked (Storm spout / KCL semantics). A KPL
//! aggregate is one Kinesis record holding many user records, each emitted, acked and tracked on
//! its own under the aggregate's sequence and its index in it (plain records have sub-sequence 0),
//! so the checkpoint can stop in the middle of an aggregate and never skips an unacked user record.
//! Records are emitted in shard order, so in-flight records form a queue; acks may arrive in any
//! order.
//!
//! - Shards are served round-robin, one record per turn: a shard with a backlog cannot starve the
//!   task's other shards (nor hold back their watermark).
//! - Each shard's queue of read-but-unemitted records knows its memory footprint
//!   ([`Queue::bytes`]); the reader sizes its reads to the room left.
//! - A record that exhausted its replays is *dead-lettering*: it stays in flight (the checkpoint
//!   waits) until its dead-letter tuple is acked, and that tuple is emitted again if it fails.
//!
//! # Low watermark
//!
//! A shard's low watermark ([`ShardTrack::watermark`]) is held by the records it has still to
//! emit on the default stream: records queued (read, not yet emitted) and records failed and
//! awaiting their replay. Records in flight (emitted, not yet acked) do not hold it: watermarks
//! travel in band behind the tuples emitted before them (every bolt forwards a watermark only
//! after the tuples that preceded it), so a later watermark cannot overtake an emitted tuple.
//! Holding it for in-flight records would deadlock any bolt that keeps its inputs unacked until
//! the watermark passes them (a window acking on fire) against that very watermark.
//!
//! The price: a record that fails after the watermark passed its time is replayed *late*: the
//! windows over its time may already have fired. A window bolt routes it to its late stream
//! (see `squall_topology::window`), which is how at-least-once shows through windows without
//! checkpointed state. Dead-lettering records do not hold the watermark either: they leave the
//! default stream. The same holds for records a handoff abandons (the next owner reads them
//! again from the checkpoint, after its own watermark may have passed them).
//!
//! A shard whose end was read (a split or merge closed it) holds the watermark at its newest
//! record, so that it does not pass the records arriving in its children meanwhile; but only
//! for the idle timeout after its end was read ([`Tracker::task_watermark`]). Its children are
//! read once every record of it is acked, and a window holding the shard's last records until
//! it fires (its end is after them) would otherwise wait for that very watermark: the window
//! never fires, the records are never acked, the shard never finishes, its children are never
//! read, and the task's watermark never moves again. After the idle timeout it reports, like an
//! idle caught-up shard, the current time minus the idle timeout (it can receive nothing more);
//! records of its children that arrived before the watermark passed them are then late. A shard
//! whose records are acked as they are emitted finishes (and leaves the task) well before that.
//!
//! # Committed watermark
//!
//! The committed watermark ([`ShardTrack::committed_watermark`],
//! [`Tracker::task_committed_watermark`]) is published out of band (through ZooKeeper, see the
//! coordinator) for exactly-once window firing: every record read below it is acked. So every
//! emitted record that is not acked holds it as well, whatever it waits for (its ack, its replay,
//! its dead-letter tuple's ack, the next owner after a handoff). It never travels in band, so it
//! cannot deadlock a bolt the way the low watermark would.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;

use crate::coord::sequence_cmp;

/// One Kinesis record, as read.
#[derive(Debug, Clone)]
pub struct Record {
    /// Shard it came from.
    pub shard_id: Arc<str>,
    /// Sequence number (decimal string, up to 56 digits).
    pub sequence: Arc<str>,
    /// KPL sub-sequence: the user record's index in its aggregate (0 for plain records).
    pub sub_sequence: u64,
    /// Partition key.
    pub partition_key: Arc<str>,
    /// Approximate arrival timestamp, milliseconds since the epoch.
    pub arrival_ms: i64,
    /// Payload.
    pub data: Bytes,
}

/// Memory a queued record holds besides its payload, key and sequence: the struct, the
/// reference-counted strings' headers, allocator overhead, its slot in the queue.
pub(crate) const RECORD_OVERHEAD: usize = 192;

impl Record {
    /// Its position in the shard: (sequence, sub-sequence).
    pub(crate) fn key(&self) -> SeqKey {
        SeqKey(self.sequence.clone(), self.sub_sequence)
    }

    /// Estimated memory this record holds while queued (payload, key, sequence, overhead). The
    /// user records of one aggregate each count their own payload slice (they share the
    /// aggregate's buffer, so the sum is the aggregate's size), key and sequence, plus the
    /// overhead each of them costs: never less than what the queue really holds.
    pub(crate) fn mem_size(&self) -> usize {
        self.data.len() + self.partition_key.len() + self.sequence.len() + RECORD_OVERHEAD
    }
}

/// A shard's records read but not yet emitted, in shard order, with their estimated memory.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    records: VecDeque<Record>,
    bytes: usize,
}

impl Queue {
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Estimated memory of the queued records ([`Record::mem_size`] summed).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn clear(&mut self) {
        self.records.clear();
        self.bytes = 0;
    }

    pub fn iter(&self) -> impl Iterator<Item = &Record> {
        self.records.iter()
    }

    fn push_back(&mut self, r: Record) {
        self.bytes += r.mem_size();
        self.records.push_back(r);
    }

    fn pop_front(&mut self) -> Option<Record> {
        let r = self.records.pop_front()?;
        self.bytes = self.bytes.saturating_sub(r.mem_size());
        Some(r)
    }
}

/// A user record's position in its shard: (sequence number, sub-sequence), ordered numerically
/// by sequence (decimal strings of any length), then by sub-sequence.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct SeqKey(pub Arc<str>, pub u64);

impl SeqKey {
    /// The form carried by tuples' `checkpoint` field: `sequence` for sub-sequence 0, else
    /// `sequence:sub_sequence` (see [`crate::state`]'s deduplication floor).
    pub fn floor_text(&self) -> Arc<str> {
        if self.1 == 0 { self.0.clone() } else { Arc::from(format!("{}:{}", self.0, self.1)) }
    }
}

impl Ord for SeqKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        sequence_cmp(&self.0, &other.0).then(self.1.cmp(&other.1))
    }
}
impl PartialOrd for SeqKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

#[derive(Debug)]
struct Entry {
    record: Record,
    acked: bool,
    failures: u32,
    /// Failed during a handoff: it will not be replayed here; the next owner reads it again.
    abandoned: bool,
    /// It exhausted its replays: its dead-letter tuple is in flight (or waiting to be emitted
    /// again); it counts as handled only once that tuple is acked.
    dead_lettering: bool,
    /// Failures of its dead-letter tuple.
    dead_letter_failures: u32,
    /// Failed and to be emitted again on the default stream (replay scheduled, not yet taken by
    /// `replay_record`): it holds the shard's watermark like a queued record.
    awaiting_replay: bool,
}

impl Entry {
    fn new(record: Record) -> Self {
        Entry {
            record,
            acked: false,
            failures: 0,
            abandoned: false,
            dead_lettering: false,
            dead_letter_failures: 0,
            awaiting_replay: false,
        }
    }
}

/// State of one owned shard within one ownership epoch.
#[derive(Debug)]
pub(crate) struct ShardTrack {
    id: Arc<str>,
    pub epoch: u64,
    /// The lease's sequencer token (the sequential number of its lease znode): later owners of the
    /// shard hold higher tokens, so a store can refuse the writes of an earlier (zombie) owner.
    pub lease_token: u64,
    /// Everything up to this position is handled (the checkpoint this ownership started from,
    /// then each new safe point): never read again by a correct owner. Unlike `safe`, never
    /// taken; carried by each tuple (as [`SeqKey::floor_text`]) so exactly-once state can prune
    /// its deduplication data.
    pub floor: Option<Arc<str>>,
    /// The shard's hash key range (`start-end`), carried by each tuple (`shard_range`) so that
    /// exactly-once state can tell a shard's ancestors from its siblings. `None` when unknown.
    pub range: Option<Arc<str>>,
    inflight: BTreeMap<SeqKey, Entry>,
    /// Highest position with it and everything before it acked, not yet returned by `take_checkpoint`.
    safe: Option<SeqKey>,
    /// Highest position handed to the spout (emitted at least once).
    pub last_emitted: Option<SeqKey>,
    /// The reader saw the end of the shard (null NextShardIterator).
    pub ended: bool,
    /// Wall time (ms) when the end was read.
    pub ended_ms: Option<i64>,
    /// Handoff or shutdown in progress: nothing new is emitted, replays are dropped.
    pub stopping: bool,
    /// Records read but not yet emitted.
    pub queued: Queue,
    /// In the tracker's round-robin list of shards with queued records.
    scheduled: bool,
    /// Arrival time of the newest record read (ms since the epoch).
    pub newest_arrival: Option<i64>,
    /// When the last record was read.
    pub last_record_at: Instant,
    /// Wall time (ms) of the last GetRecords that returned nothing and was caught up with the
    /// shard's tip (MillisBehindLatest 0).
    pub caught_up_ms: Option<i64>,
}

impl ShardTrack {
    fn new(id: Arc<str>, epoch: u64) -> Self {
        Self {
            id,
            epoch,
            lease_token: 0,
            floor: None,
            range: None,
            inflight: BTreeMap::new(),
            safe: None,
            last_emitted: None,
            ended: false,
            ended_ms: None,
            stopping: false,
            queued: Queue::default(),
            scheduled: false,
            newest_arrival: None,
            last_record_at: Instant::now(),
            caught_up_ms: None,
        }
    }

    /// The shard's low watermark (ms): the arrival time of its oldest record still to be emitted
    /// on the default stream (queued, or failed and awaiting its replay); else of the newest record
    /// read. Records in flight do not hold it (see the module docs: an emitted tuple cannot be
    /// overtaken by a later watermark; a replay after the watermark passed is late). A shard with
    /// no new record for `idle` whose reader is caught up with the tip stops holding the watermark
    /// back: it reports the time of its last caught-up read minus `idle` (any later record arrives
    /// after that). `None`: unknown yet.
    pub fn watermark(&self, idle: Duration) -> Option<i64> {
        self.low_mark(idle, |e| e.awaiting_replay && !e.acked)
    }

    /// [`ShardTrack::watermark`] at wall time `now_ms`, with the rule for a shard whose end was
    /// read (see the module docs): once nothing of it is queued or awaiting a replay and its end
    /// was read `idle` ago or more, it can receive nothing more and reports at least `now_ms -
    /// idle`, so windows holding its last records until they fire can fire, the records be
    /// acked, the shard finish and its children be read.
    pub fn watermark_at(&self, idle: Duration, now_ms: i64) -> Option<i64> {
        let w = self.watermark(idle);
        let idle_ms = i64::try_from(idle.as_millis()).unwrap_or(i64::MAX);
        let ended_idle = self.ended_ms.is_some_and(|e| now_ms.saturating_sub(e) >= idle_ms)
            && self.queued.is_empty()
            && !self.inflight.values().any(|e| e.awaiting_replay && !e.acked);
        if !ended_idle {
            return w;
        }
        let idle_wm = now_ms.saturating_sub(idle_ms);
        Some(w.map_or(idle_wm, |w| w.max(idle_wm)))
    }

    /// The shard's committed watermark (ms): like [`ShardTrack::watermark`], but every record
    /// emitted and not acked holds it too, whatever it awaits: its ack, its replay, the ack of its
    /// dead-letter tuple (a dead-lettering record is in flight until then), or, abandoned by a
    /// handoff, being read again by the next owner. So every record of the shard read by this
    /// ownership with an arrival time below it is acked (its tuple tree completed). Same fallback
    /// (the newest record read, the idle caught-up rule). `None`: unknown yet.
    pub fn committed_watermark(&self, idle: Duration) -> Option<i64> {
        self.low_mark(idle, |e| !e.acked)
    }

    /// The oldest arrival among in-flight entries that `holds` and queued records; else the newest
    /// read or the idle caught-up time.
    fn low_mark(&self, idle: Duration, holds: impl Fn(&Entry) -> bool) -> Option<i64> {
        // Arrival times are approximate (not strictly ordered within a shard): scan them all.
        // The spout calls this at most once per watermark interval, the coordinator at most once
        // per tick.
        let pending = self
            .inflight
            .values()
            .filter(|e| holds(e))
            .map(|e| e.record.arrival_ms)
            .chain(self.queued.iter().map(|r| r.arrival_ms))
            .min();
        if let Some(p) = pending {
            return Some(p);
        }
        let idle_ms = i64::try_from(idle.as_millis()).unwrap_or(i64::MAX);
        let idle_wm = match self.caught_up_ms {
            Some(c) if self.last_record_at.elapsed() >= idle => Some(c.saturating_sub(idle_ms)),
            _ => None,
        };
        match (self.newest_arrival, idle_wm) {
            (Some(n), Some(i)) => Some(n.max(i)),
            (n, i) => n.or(i),
        }
    }

    /// Records emitted and not yet acked (or replay-pending).
    pub fn inflight(&self) -> usize {
        self.inflight.len()
    }

    /// In-flight records still waiting for an ack or a fail.
    pub fn unsettled(&self) -> usize {
        self.inflight.values().filter(|e| !e.acked && !e.abandoned).count()
    }

    /// Drains acked records off the front of the queue; remembers the highest as safe.
    fn advance(&mut self) {
        let mut moved = None;
        while let Some(first) = self.inflight.first_entry() {
            if !first.get().acked {
                break;
            }
            let (k, _) = first.remove_entry();
            moved = Some(k);
        }
        if let Some(k) = moved {
            self.floor = Some(k.floor_text());
            self.safe = Some(k);
        }
    }
}

/// The ownership a record is emitted under.
#[derive(Debug, Clone)]
pub(crate) struct Ownership {
    pub epoch: u64,
    pub lease_token: u64,
    pub floor: Option<Arc<str>>,
    /// The shard's hash key range, `start-end` (see `ShardTrack::range`).
    pub range: Option<Arc<str>>,
}

/// What `fail` decided.
#[derive(Debug)]
pub(crate) enum FailOutcome {
    /// Replay it after this many failures (1 = first failure).
    Replay(u32),
    /// The retry limit was reached after this many failures: emit it on the dead-letter stream as
    /// a tracked tuple. It stays in flight (the checkpoint waits) until that tuple is acked.
    DeadLetter(u32),
    /// Stale (older epoch, shard handed off, unknown): ignore.
    Ignore,
}

/// Every shard this spout task owns.
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    shards: HashMap<Arc<str>, ShardTrack>,
    /// Shards with queued records, in the order they are served (round-robin).
    ready: VecDeque<Arc<str>>,
    next_epoch: u64,
    /// How many shards the last assignment gave this task; `None` before the first.
    assigned: Option<usize>,
    /// The ZooKeeper session generation the task's coordinator holds its leases in; `None`
    /// between sessions. Readers and the spout hand nothing on unless it is the worker's
    /// current, trusted session ([`crate::coord::Liveness::trusted_in`]).
    session_generation: Option<u64>,
}

impl Tracker {
    /// Records the session generation the task's leases are held in (`None`: none held).
    pub fn set_session_generation(&mut self, generation: Option<u64>) {
        self.session_generation = generation;
    }

    /// See [`Tracker::set_session_generation`].
    pub fn session_generation(&self) -> Option<u64> {
        self.session_generation
    }

    /// Records how many shards the assignment gives this task (the coordinator calls this each
    /// time it reconciles), so the watermark knows whether shards are still to come.
    pub fn set_assigned(&mut self, n: usize) {
        self.assigned = Some(n);
    }

    /// Forgets the assignment's share of this task: its watermark is unknown (`None`) until the
    /// next [`Tracker::set_assigned`]. For a task the current assignment does not list (not
    /// registered under its session yet, or registered after the assignment was written).
    pub fn set_assignment_unknown(&mut self) {
        self.assigned = None;
    }

    /// The task's low watermark, given `now_ms`: the minimum over its owned shards; a task the
    /// assignment gives no shard reports `now_ms - idle` (it holds nothing back); `None` while
    /// unknown: before the first assignment, while an assigned shard is not taken yet (its
    /// backlog, read from TRIM_HORIZON or a checkpoint, may be older than anything else), or
    /// while an owned shard has read nothing.
    pub fn task_watermark(&self, idle: Duration, now_ms: i64) -> Option<i64> {
        self.task_mark(idle, now_ms, |t, idle| t.watermark_at(idle, now_ms))
    }

    /// The task's committed watermark, given `now_ms`: [`ShardTrack::committed_watermark`] (every
    /// emitted, unacked record holds it) with exactly the coverage rules of
    /// [`Tracker::task_watermark`]. Shards being handed off are not counted: their unacked records
    /// are behind the checkpoint the next owner reads from, and that owner's watermark is unknown
    /// until it took the shard and read from there.
    pub fn task_committed_watermark(&self, idle: Duration, now_ms: i64) -> Option<i64> {
        self.task_mark(idle, now_ms, ShardTrack::committed_watermark)
    }

    /// The coverage rules of [`Tracker::task_watermark`] over the per-shard mark `shard_mark`.
    fn task_mark(
        &self,
        idle: Duration,
        now_ms: i64,
        shard_mark: impl Fn(&ShardTrack, Duration) -> Option<i64>,
    ) -> Option<i64> {
        let owned = self.shards.values().filter(|t| !t.stopping).count();
        match self.assigned {
            Some(0) if owned == 0 => Some(now_ms.saturating_sub(i64::try_from(idle.as_millis()).unwrap_or(i64::MAX))),
            Some(n) if owned >= n && owned > 0 => self.min_over_owned(|t| shard_mark(t, idle)),
            _ => None,
        }
    }

    /// True once the task owns every shard the last assignment gives it.
    pub fn owns_assigned(&self) -> bool {
        let owned = self.shards.values().filter(|t| !t.stopping).count();
        self.assigned.is_some_and(|n| owned >= n)
    }

    /// Starts tracking a newly owned shard; returns its epoch.
    #[cfg(test)]
    pub fn start(&mut self, shard: &Arc<str>) -> u64 {
        self.start_owned(shard, 0, None)
    }

    /// Starts tracking a newly owned shard under a lease with sequencer token `lease_token`,
    /// read from `floor` (the checkpointed position, everything up to it handled); returns its
    /// epoch.
    pub fn start_owned(&mut self, shard: &Arc<str>, lease_token: u64, floor: Option<SeqKey>) -> u64 {
        self.next_epoch += 1;
        let epoch = self.next_epoch;
        let mut track = ShardTrack::new(shard.clone(), epoch);
        track.lease_token = lease_token;
        track.floor = floor.map(|f| f.floor_text());
        if self.shards.insert(shard.clone(), track).is_some() {
            self.ready.retain(|s| s != shard);
        }
        epoch
    }

    /// Notes the hash key range (`start-end`) of the shard owned in `epoch`.
    pub fn set_range(&mut self, shard: &str, epoch: u64, range: Option<Arc<str>>) {
        if let Some(t) = self.shards.get_mut(shard).filter(|t| t.epoch == epoch) {
            t.range = range;
        }
    }

    /// Stops tracking (after release); later acks of that epoch are ignored.
    pub fn remove(&mut self, shard: &str) -> Option<ShardTrack> {
        let t = self.shards.remove(shard)?;
        if t.scheduled {
            self.ready.retain(|s| s.as_ref() != shard);
        }
        Some(t)
    }

    pub fn get(&self, shard: &str) -> Option<&ShardTrack> {
        self.shards.get(shard)
    }

    pub fn get_mut(&mut self, shard: &str) -> Option<&mut ShardTrack> {
        self.shards.get_mut(shard)
    }

    fn live(&mut self, shard: &str, epoch: u64) -> Option<&mut ShardTrack> {
        self.shards.get_mut(shard).filter(|t| t.epoch == epoch)
    }

    /// Queues records read from a shard (in shard order). Returns false when stale.
    pub fn enqueue(&mut self, shard: &str, epoch: u64, records: Vec<Record>) -> bool {
        match self.shards.get_mut(shard).filter(|t| t.epoch == epoch) {
            Some(t) if !t.stopping => {
                if let Some(newest) = records.iter().map(|r| r.arrival_ms).max() {
                    t.newest_arrival = Some(t.newest_arrival.map_or(newest, |n| n.max(newest)));
                    t.last_record_at = Instant::now();
                }
                for r in records {
                    t.queued.push_back(r);
                }
                if !t.scheduled && !t.queued.is_empty() {
                    t.scheduled = true;
                    self.ready.push_back(t.id.clone());
                }
                true
            }
            _ => false,
        }
    }

    /// Notes a GetRecords that returned nothing while caught up with the shard's tip.
    pub fn mark_caught_up(&mut self, shard: &str, epoch: u64, wall_ms: i64) {
        if let Some(t) = self.live(shard, epoch) {
            t.caught_up_ms = Some(wall_ms);
        }
    }

    /// The low watermark over every owned shard; `None` while any shard's is unknown, or when
    /// no shard is owned.
    #[cfg(test)]
    pub fn watermark(&self, idle: Duration) -> Option<i64> {
        self.min_over_owned(|t| t.watermark(idle))
    }

    /// The minimum of `mark` over every owned shard (not stopping); `None` while any is unknown,
    /// or when no shard is owned.
    fn min_over_owned(&self, mark: impl Fn(&ShardTrack) -> Option<i64>) -> Option<i64> {
        let mut min: Option<i64> = None;
        for t in self.shards.values().filter(|t| !t.stopping) {
            let w = mark(t)?;
            min = Some(min.map_or(w, |m| m.min(w)));
        }
        min
    }

    /// The shards owned now (not stopping) with their epochs.
    pub fn owned_epochs(&self) -> impl Iterator<Item = (&Arc<str>, u64)> + '_ {
        self.shards.values().filter(|t| !t.stopping).map(|t| (&t.id, t.epoch))
    }

    /// Marks the shard's end as read (at wall time `wall_ms`). Returns false when stale.
    pub fn mark_ended(&mut self, shard: &str, epoch: u64, wall_ms: i64) -> bool {
        match self.live(shard, epoch) {
            Some(t) => {
                t.ended = true;
                t.ended_ms.get_or_insert(wall_ms);
                true
            }
            None => false,
        }
    }

    /// Takes the next queued record and registers it as in flight. Shards with queued records
    /// take turns, one record each (round-robin), so a shard with a backlog delays another
    /// shard's record by at most one record per shard, never by its backlog.
    #[cfg(test)]
    pub fn next_to_emit(&mut self) -> Option<(Record, u64)> {
        self.next_to_emit_owned().map(|(r, o)| (r, o.epoch))
    }

    /// [`Tracker::next_to_emit`], with the ownership the record is emitted under.
    pub fn next_to_emit_owned(&mut self) -> Option<(Record, Ownership)> {
        // Every turn either emits or drops a stale entry, so this ends within `ready.len()` turns.
        for _ in 0..self.ready.len() {
            let id = self.ready.pop_front()?;
            let Some(t) = self.shards.get_mut(&id) else { continue };
            let next = if t.stopping { None } else { t.queued.pop_front() };
            let Some(r) = next else {
                t.scheduled = false;
                continue;
            };
            if t.queued.is_empty() {
                t.scheduled = false;
            } else {
                self.ready.push_back(id);
            }
            t.last_emitted = Some(r.key());
            t.inflight.insert(r.key(), Entry::new(r.clone()));
            let own = Ownership {
                epoch: t.epoch,
                lease_token: t.lease_token,
                floor: t.floor.clone(),
                range: t.range.clone(),
            };
            return Some((r, own));
        }
        None
    }

    /// The ownership of `shard` in `epoch`, while it lasts.
    pub fn ownership(&self, shard: &str, epoch: u64) -> Option<Ownership> {
        let t = self.shards.get(shard).filter(|t| t.epoch == epoch)?;
        Some(Ownership { epoch, lease_token: t.lease_token, floor: t.floor.clone(), range: t.range.clone() })
    }

    /// Records the ack of one record, or of its dead-letter tuple: either way it is handled.
    pub fn ack(&mut self, shard: &str, epoch: u64, sequence: &Arc<str>, sub_sequence: u64) -> bool {
        let Some(t) = self.live(shard, epoch) else { return false };
        match t.inflight.get_mut(&SeqKey(sequence.clone(), sub_sequence)) {
            Some(e) => {
                e.acked = true;
                t.advance();
                true
            }
            None => false,
        }
    }

    /// Records the failure of one record and decides what happens to it.
    pub fn fail(
        &mut self,
        shard: &str,
        epoch: u64,
        sequence: &Arc<str>,
        sub_sequence: u64,
        max_retries: u32,
    ) -> FailOutcome {
        let Some(t) = self.live(shard, epoch) else { return FailOutcome::Ignore };
        let stopping = t.stopping;
        let Some(e) = t.inflight.get_mut(&SeqKey(sequence.clone(), sub_sequence)) else { return FailOutcome::Ignore };
        if e.acked || e.dead_lettering {
            return FailOutcome::Ignore;
        }
        e.failures += 1;
        let n = e.failures;
        if stopping {
            // Handoff: it will be read again by the next owner from the checkpoint.
            e.abandoned = true;
            return FailOutcome::Ignore;
        }
        if n > max_retries {
            e.dead_lettering = true;
            FailOutcome::DeadLetter(n)
        } else {
            e.awaiting_replay = true;
            FailOutcome::Replay(n)
        }
    }

    /// Records the failure of a record's dead-letter tuple. Returns how many times it failed (it
    /// is to be emitted again after a back-off), or `None` when stale: older epoch, handed off
    /// (the next owner reads the record again from the checkpoint), or already handled.
    pub fn fail_dead_letter(&mut self, shard: &str, epoch: u64, sequence: &Arc<str>, sub_sequence: u64) -> Option<u32> {
        let t = self.live(shard, epoch)?;
        let stopping = t.stopping;
        let e = t.inflight.get_mut(&SeqKey(sequence.clone(), sub_sequence))?;
        if e.acked || !e.dead_lettering {
            return None;
        }
        e.dead_letter_failures += 1;
        if stopping {
            e.abandoned = true;
            return None;
        }
        Some(e.dead_letter_failures)
    }

    /// Takes the record to replay, if its shard and epoch are still live and it is still unacked
    /// (and not on its way to the dead-letter stream): it is in flight again, and no longer holds
    /// the shard's watermark.
    pub fn replay_record(&mut self, shard: &str, epoch: u64, sequence: &Arc<str>, sub_sequence: u64) -> Option<Record> {
        let t = self.shards.get_mut(shard).filter(|t| t.epoch == epoch && !t.stopping)?;
        let e = t.inflight.get_mut(&SeqKey(sequence.clone(), sub_sequence))?;
        if e.acked || e.dead_lettering {
            return None;
        }
        e.awaiting_replay = false;
        Some(e.record.clone())
    }

    /// The record whose dead-letter tuple is to be emitted (again), with its failures, if its
    /// shard and epoch are still live and the dead-letter tuple is not acked yet.
    pub fn dead_letter_record(
        &self,
        shard: &str,
        epoch: u64,
        sequence: &Arc<str>,
        sub_sequence: u64,
    ) -> Option<(Record, u32)> {
        let t = self.shards.get(shard).filter(|t| t.epoch == epoch && !t.stopping)?;
        let e = t.inflight.get(&SeqKey(sequence.clone(), sub_sequence))?;
        (!e.acked && e.dead_lettering).then(|| (e.record.clone(), e.failures))
    }

    /// The sequence of the new safe checkpoint of a shard since the last call, if it moved.
    #[cfg(test)]
    pub fn take_checkpoint(&mut self, shard: &str) -> Option<Arc<str>> {
        self.take_checkpoint_key(shard).map(|k| k.0)
    }

    /// The new safe checkpoint (sequence, sub-sequence) of a shard since the last call, if it moved.
    #[cfg(test)]
    pub fn take_checkpoint_key(&mut self, shard: &str) -> Option<SeqKey> {
        self.shards.get_mut(shard)?.safe.take()
    }

    /// Peeks the safe checkpoint without consuming it.
    pub fn peek_checkpoint(&self, shard: &str) -> Option<SeqKey> {
        self.shards.get(shard)?.safe.clone()
    }

    /// Total records in flight over all shards.
    #[cfg(test)]
    pub fn total_inflight(&self) -> usize {
        self.shards.values().map(|t| t.inflight.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rec(shard: &Arc<str>, seq: u64) -> Record {
        Record {
            shard_id: shard.clone(),
            // Real sequence numbers are long decimal strings of varying length.
            sequence: format!("4968{seq}").into(),
            sub_sequence: 0,
            partition_key: "k".into(),
            arrival_ms: 0,
            data: Bytes::new(),
        }
    }

    #[test]
    fn checkpoint_waits_for_the_oldest_record() {
        let mut t = Tracker::default();
        let s: Arc<str> = "shardId-0".into();
        let e = t.start(&s);
        assert!(t.enqueue(&s, e, (1..=3).map(|i| rec(&s, i)).collect()));
        let emitted: Vec<_> = std::iter::from_fn(|| t.next_to_emit()).collect();
        assert_eq!(emitted.len(), 3);
        let seq = |i: usize| emitted[i].0.sequence.clone();
        assert!(t.ack(&s, e, &seq(1), 0));
        assert_eq!(t.take_checkpoint(&s), None, "record 1 is not acked yet");
        assert!(t.ack(&s, e, &seq(0), 0));
        assert_eq!(t.take_checkpoint(&s), Some(seq(1)));
        assert_eq!(t.take_checkpoint(&s), None, "taken once");
        assert!(matches!(t.fail(&s, e, &seq(2), 0, 1), FailOutcome::Replay(1)));
        assert!(t.replay_record(&s, e, &seq(2), 0).is_some());
        assert!(matches!(t.fail(&s, e, &seq(2), 0, 1), FailOutcome::DeadLetter(2)));
        let (r, failures) = t.dead_letter_record(&s, e, &seq(2), 0).expect("its dead-letter tuple is to be emitted");
        assert_eq!((r.sequence.clone(), failures), (seq(2), 2));
        assert!(t.replay_record(&s, e, &seq(2), 0).is_none(), "no longer replayed on the default stream");
        assert_eq!(t.take_checkpoint(&s), None, "not handled until its dead-letter tuple is acked");
        assert_eq!(t.get(&s).unwrap().unsettled(), 1);
        assert!(t.ack(&s, e, &seq(2), 0), "the dead-letter tuple's ack");
        assert_eq!(t.take_checkpoint(&s), Some(seq(2)), "a dead-lettered record counts as handled once acked");
        assert_eq!(t.total_inflight(), 0);
    }

    #[test]
    fn a_failed_dead_letter_tuple_is_emitted_again_and_holds_the_checkpoint() {
        let mut t = Tracker::default();
        let s: Arc<str> = "shardId-0".into();
        let e = t.start(&s);
        t.enqueue(&s, e, (1..=2).map(|i| rec(&s, i)).collect());
        let (r1, _) = t.next_to_emit().unwrap();
        let (r2, _) = t.next_to_emit().unwrap();
        assert!(t.ack(&s, e, &r2.sequence, 0));
        assert!(matches!(t.fail(&s, e, &r1.sequence, 0, 0), FailOutcome::DeadLetter(1)));
        for n in 1..=3 {
            assert_eq!(t.fail_dead_letter(&s, e, &r1.sequence, 0), Some(n), "emit it again after a back-off");
            assert_eq!(t.take_checkpoint(&s), None, "a failed dead letter never moves the checkpoint");
            let (again, failures) = t.dead_letter_record(&s, e, &r1.sequence, 0).unwrap();
            assert_eq!((again.sequence, failures), (r1.sequence.clone(), 1), "the record's own failures");
        }
        assert!(
            matches!(t.fail(&s, e, &r1.sequence, 0, 0), FailOutcome::Ignore),
            "a record fail while dead-lettering changes nothing"
        );
        assert!(t.ack(&s, e, &r1.sequence, 0));
        assert_eq!(t.take_checkpoint(&s), Some(r2.sequence.clone()));
        assert_eq!(t.fail_dead_letter(&s, e, &r1.sequence, 0), None, "handled: stale");
        assert!(t.dead_letter_record(&s, e, &r1.sequence, 0).is_none());
    }

    #[test]
    fn a_dead_letter_pending_at_handoff_is_left_to_the_next_owner() {
        let mut t = Tracker::default();
        let s: Arc<str> = "shardId-0".into();
        let e = t.start(&s);
        t.enqueue(&s, e, vec![rec(&s, 1)]);
        let (r, _) = t.next_to_emit().unwrap();
        assert!(matches!(t.fail(&s, e, &r.sequence, 0, 0), FailOutcome::DeadLetter(1)));
        t.get_mut(&s).unwrap().stopping = true;
        assert!(t.dead_letter_record(&s, e, &r.sequence, 0).is_none(), "not emitted again while handing off");
        assert_eq!(t.get(&s).unwrap().unsettled(), 1, "the handoff waits for it");
        assert_eq!(t.fail_dead_letter(&s, e, &r.sequence, 0), None);
        assert_eq!(t.get(&s).unwrap().unsettled(), 0, "abandoned: the next owner reads it again");
        assert_eq!(t.take_checkpoint(&s), None, "its checkpoint never moved");
    }

    #[test]
    fn a_backlog_does_not_starve_a_trickling_shard() {
        let mut t = Tracker::default();
        let shards: Vec<Arc<str>> = (0..4).map(|i| Arc::from(format!("shardId-{i}"))).collect();
        let epochs: Vec<u64> = shards.iter().map(|s| t.start(s)).collect();
        // Shard 0 has a 10,000-record backlog, queued first.
        t.enqueue(&shards[0], epochs[0], (0..10_000).map(|i| rec(&shards[0], i)).collect());
        for _ in 0..100 {
            t.next_to_emit().unwrap();
        }
        // Then one record arrives in each other shard: each is emitted within one round.
        for (s, e) in shards.iter().zip(&epochs).skip(1) {
            t.enqueue(s, *e, vec![rec(s, 1)]);
        }
        let next: Vec<Arc<str>> = (0..4).map(|_| t.next_to_emit().unwrap().0.shard_id).collect();
        for s in &shards[1..] {
            assert!(next.contains(s), "{s} waited behind the backlog: {next:?}");
        }
        // And the backlog keeps flowing, in order.
        let rest: Vec<Record> = std::iter::from_fn(|| t.next_to_emit()).map(|(r, _)| r).collect();
        assert!(rest.iter().all(|r| r.shard_id == shards[0]));
        assert_eq!(rest.len() + 100 + 4, 10_000 + 3);
    }

    #[test]
    fn queued_bytes_follow_the_queue() {
        let mut t = Tracker::default();
        let s: Arc<str> = "shardId-0".into();
        let e = t.start(&s);
        let big = |i| Record { data: Bytes::from(vec![0u8; 1000]), ..rec(&s, i) };
        t.enqueue(&s, e, (0..10).map(big).collect());
        let one = big(0).mem_size();
        assert!(one >= 1000 + RECORD_OVERHEAD);
        assert_eq!(t.get(&s).unwrap().queued.bytes(), 10 * one);
        t.next_to_emit().unwrap();
        assert_eq!(t.get(&s).unwrap().queued.bytes(), 9 * one);
        t.get_mut(&s).unwrap().queued.clear();
        assert_eq!(t.get(&s).unwrap().queued.bytes(), 0);
        assert!(t.next_to_emit().is_none(), "a cleared queue is skipped");
        // A shard released and owned again is served once per turn, not twice.
        t.remove(&s);
        let e2 = t.start(&s);
        let s2: Arc<str> = "shardId-1".into();
        let e3 = t.start(&s2);
        t.enqueue(&s, e2, (0..3).map(|i| rec(&s, i)).collect());
        t.enqueue(&s2, e3, (0..3).map(|i| rec(&s2, i)).collect());
        let order: Vec<Arc<str>> = std::iter::from_fn(|| t.next_to_emit()).map(|(r, _)| r.shard_id).collect();
        assert_eq!(order, vec![s.clone(), s2.clone(), s.clone(), s2.clone(), s.clone(), s2.clone()]);
    }

    #[test]
    fn stale_epochs_are_ignored() {
        let mut t = Tracker::default();
        let s: Arc<str> = "shardId-0".into();
        let e1 = t.start(&s);
        t.enqueue(&s, e1, vec![rec(&s, 1)]);
        let (r, _) = t.next_to_emit().unwrap();
        t.remove(&s);
        let e2 = t.start(&s);
        assert_ne!(e1, e2);
        assert!(!t.ack(&s, e1, &r.sequence, 0));
        assert!(matches!(t.fail(&s, e1, &r.sequence, 0, 3), FailOutcome::Ignore));
        assert!(!t.enqueue(&s, e1, vec![rec(&s, 2)]));
    }

    /// The user records of a KPL aggregate share its sequence: each is tracked on its own, and
    /// the checkpoint stops at the last user record with everything before it acked.
    #[test]
    fn the_checkpoint_stops_inside_an_aggregate_and_never_skips_an_unacked_user_record() {
        let mut t = Tracker::default();
        let s: Arc<str> = "shardId-0".into();
        let e = t.start(&s);
        let user = |seq: u64, sub: u64| Record { sub_sequence: sub, ..rec(&s, seq) };
        t.enqueue(&s, e, vec![user(1, 0), user(2, 0), user(2, 1), user(2, 2), user(3, 0)]);
        let emitted: Vec<Record> = std::iter::from_fn(|| t.next_to_emit()).map(|(r, _)| r).collect();
        assert_eq!(emitted.len(), 5, "one in-flight entry per user record");
        assert_eq!(t.get(&s).unwrap().inflight(), 5);
        let k = |r: &Record| (r.sequence.clone(), r.sub_sequence);
        for i in [0, 1, 3] {
            let (seq, sub) = k(&emitted[i]);
            assert!(t.ack(&s, e, &seq, sub));
        }
        assert_eq!(t.take_checkpoint_key(&s), Some(emitted[1].key()), "(2, 0): (2, 1) is not acked yet");
        assert!(!t.ack(&s, e, &emitted[2].sequence, 7), "an unknown sub-sequence is not an ack");
        assert!(matches!(t.fail(&s, e, &emitted[2].sequence, 1, 3), FailOutcome::Replay(1)));
        let again = t.replay_record(&s, e, &emitted[2].sequence, 1).expect("the failed user record");
        assert_eq!(again.key(), emitted[2].key());
        assert_eq!(t.take_checkpoint_key(&s), None);
        assert!(t.ack(&s, e, &emitted[2].sequence, 1));
        assert_eq!(t.take_checkpoint_key(&s), Some(emitted[3].key()), "(2, 2): the whole aggregate");
        assert_eq!(t.get(&s).unwrap().floor.as_deref(), Some(&*format!("{}:2", emitted[3].sequence)));
        assert!(t.ack(&s, e, &emitted[4].sequence, 0));
        assert_eq!(t.take_checkpoint_key(&s), Some(emitted[4].key()));
        assert_eq!(
            t.get(&s).unwrap().floor.as_deref(),
            Some(&*emitted[4].sequence),
            "sub-sequence 0: the sequence alone"
        );
        assert_eq!(t.get(&s).unwrap().last_emitted, Some(emitted[4].key()));
    }

    #[test]
    fn sequence_numbers_of_different_lengths_order_numerically() {
        let mut t = Tracker::default();
        let s: Arc<str> = "shardId-0".into();
        let e = t.start(&s);
        let short = Record { sequence: "99".into(), ..rec(&s, 0) };
        let long = Record { sequence: "100".into(), ..rec(&s, 0) };
        t.enqueue(&s, e, vec![short.clone(), long.clone()]);
        t.next_to_emit();
        t.next_to_emit();
        t.ack(&s, e, &long.sequence, 0);
        assert_eq!(t.take_checkpoint(&s), None, "99 < 100 numerically, though not as text");
        t.ack(&s, e, &short.sequence, 0);
        assert_eq!(t.take_checkpoint(&s).as_deref(), Some("100"));
    }

    /// The watermark is held by records still to be emitted on the default stream (queued, or
    /// failed and awaiting their replay), not by records in flight: a watermark cannot overtake a
    /// tuple emitted before it, and holding it for in-flight records deadlocks a window that acks
    /// its inputs when the watermark passes them.
    #[test]
    fn watermark_is_oldest_pending_then_newest_then_idle() {
        let mut t = Tracker::default();
        let s: Arc<str> = "shardId-0".into();
        let e = t.start(&s);
        let idle = Duration::from_millis(50);
        assert_eq!(t.watermark(idle), None, "unknown until something is read");
        let mk = |seq: u64, at: i64| Record { arrival_ms: at, ..rec(&s, seq) };
        t.enqueue(&s, e, vec![mk(1, 100), mk(2, 200), mk(3, 300)]);
        assert_eq!(t.watermark(idle), Some(100), "queued records hold it");
        let (r1, _) = t.next_to_emit().unwrap();
        assert_eq!(t.watermark(idle), Some(200), "emitted: no longer held by it, the oldest queued holds it");
        let (r2, _) = t.next_to_emit().unwrap();
        assert_eq!(t.watermark(idle), Some(300), "in flight does not hold it; queued does");
        assert!(matches!(t.fail(&s, e, &r1.sequence, 0, 1), FailOutcome::Replay(1)));
        assert_eq!(t.watermark(idle), Some(100), "failed and awaiting its replay: holds it");
        let replayed = t.replay_record(&s, e, &r1.sequence, 0).expect("replayed");
        assert_eq!(replayed.sequence, r1.sequence);
        assert_eq!(t.watermark(idle), Some(300), "replayed: in flight again, no longer holds it");
        assert!(matches!(t.fail(&s, e, &r1.sequence, 0, 1), FailOutcome::DeadLetter(2)));
        assert_eq!(t.watermark(idle), Some(300), "dead-lettering: leaves the default stream, does not hold it");
        t.ack(&s, e, &r2.sequence, 0);
        t.ack(&s, e, &r1.sequence, 0);
        assert_eq!(t.watermark(idle), Some(300), "the oldest queued");
        let (r3, _) = t.next_to_emit().unwrap();
        assert_eq!(t.watermark(idle), Some(300), "nothing queued, r3 in flight: the newest read");
        t.ack(&s, e, &r3.sequence, 0);
        assert_eq!(t.watermark(idle), Some(300), "nothing pending: the newest read");
        t.mark_caught_up(&s, e, 10_000);
        assert_eq!(t.watermark(idle), Some(300), "not idle yet");
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(t.watermark(idle), Some(10_000 - 50), "idle: no longer held back");
        let s2: Arc<str> = "shardId-1".into();
        let e2 = t.start(&s2);
        assert_eq!(t.watermark(idle), None, "a new shard with nothing read yet: unknown");
        t.enqueue(&s2, e2, vec![Record { arrival_ms: 5_000, ..rec(&s2, 1) }]);
        assert_eq!(t.watermark(idle), Some(5_000), "minimum over shards");
        let (r, _) = t.next_to_emit().unwrap();
        assert_eq!(t.watermark(idle), Some(5_000), "its only record in flight: the newest read");
        assert!(matches!(t.fail(&s2, e2, &r.sequence, 0, 3), FailOutcome::Replay(1)));
        t.get_mut(&s2).unwrap().stopping = true;
        assert_eq!(t.watermark(idle), Some(10_000 - 50), "a shard being handed off holds nothing");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Round-robin: between a shard getting records (or its last emission) and its next
        /// emission, every other shard is served at most once.
        #[test]
        fn shards_take_turns(ops in proptest::collection::vec((0usize..5, 0u64..40), 1..200)) {
            let mut t = Tracker::default();
            let shards: Vec<Arc<str>> = (0..5).map(|i| Arc::from(format!("shardId-{i}"))).collect();
            let epochs: Vec<u64> = shards.iter().map(|s| t.start(s)).collect();
            let mut next_seq = [0u64; 5];
            // Emissions by others since each shard's records arrived or it was last served.
            let mut waited: [Option<usize>; 5] = [None; 5];
            let mut queued = [0u64; 5];
            for (shard, k) in ops {
                if k < 15 {
                    let recs: Vec<Record> = (0..k).map(|j| rec(&shards[shard], next_seq[shard] + j)).collect();
                    next_seq[shard] += k;
                    queued[shard] += k;
                    t.enqueue(&shards[shard], epochs[shard], recs);
                    if queued[shard] > 0 && waited[shard].is_none() {
                        waited[shard] = Some(0);
                    }
                } else {
                    for _ in 0..(k - 15) {
                        let Some((r, _)) = t.next_to_emit() else {
                            prop_assert!(queued.iter().all(|q| *q == 0));
                            break;
                        };
                        let i = shards.iter().position(|s| *s == r.shard_id).unwrap();
                        queued[i] -= 1;
                        for (j, w) in waited.iter_mut().enumerate() {
                            if let Some(w) = w.as_mut().filter(|_| j != i) {
                                *w += 1;
                                prop_assert!(*w <= 4, "shard {} waited {} emissions of others", j, w);
                            }
                        }
                        waited[i] = (queued[i] > 0).then_some(0);
                    }
                }
            }
        }

        /// Whatever the order of acks and fails, the checkpoint is always the highest sequence with
        /// every earlier record handled, and never moves back.
        #[test]
        fn checkpoint_is_highest_contiguous_handled(n in 1usize..40, order in proptest::collection::vec(any::<u32>(), 1..120), max_retries in 0u32..3) {
            let mut t = Tracker::default();
            let s: Arc<str> = "shardId-0".into();
            let e = t.start(&s);
            t.enqueue(&s, e, (0..n as u64).map(|i| rec(&s, i)).collect());
            let recs: Vec<Record> = std::iter::from_fn(|| t.next_to_emit()).map(|(r, _)| r).collect();
            let mut handled = vec![false; n];
            let mut last_cp: Option<usize> = None;
            // Acks apply to a record or to its dead-letter tuple alike; a fail of a dead-lettering
            // record is a fail of its dead-letter tuple.
            let mut dead_lettering = vec![false; n];
            for o in order {
                let i = (o as usize) % n;
                if o % 3 == 0 {
                    if dead_lettering[i] {
                        let _ = t.fail_dead_letter(&s, e, &recs[i].sequence, 0);
                    } else if let FailOutcome::DeadLetter(..) = t.fail(&s, e, &recs[i].sequence, 0, max_retries) {
                        dead_lettering[i] = true;
                    }
                } else if t.ack(&s, e, &recs[i].sequence, 0) || handled[i] {
                    handled[i] = true;
                }
                let want = handled.iter().position(|h| !h).unwrap_or(n).checked_sub(1);
                if let Some(cp) = t.take_checkpoint(&s) {
                    let idx = recs.iter().position(|r| r.sequence == cp).unwrap();
                    prop_assert_eq!(Some(idx), want);
                    prop_assert!(last_cp.is_none_or(|l| idx > l));
                    last_cp = Some(idx);
                } else {
                    prop_assert_eq!(want, last_cp);
                }
            }
        }
    }

    /// The committed watermark is held by every emitted record not acked yet (in flight,
    /// awaiting a replay, dead-lettering), where the in-band watermark is not; acks move it.
    #[test]
    fn committed_watermark_is_held_by_unacked_records_the_in_band_one_is_not() {
        let mut t = Tracker::default();
        let s: Arc<str> = "shardId-0".into();
        let e = t.start(&s);
        let idle = Duration::from_secs(60);
        let mk = |seq: u64, at: i64| Record { arrival_ms: at, ..rec(&s, seq) };
        let track = |t: &Tracker| (t.get(&s).unwrap().watermark(idle), t.get(&s).unwrap().committed_watermark(idle));
        assert_eq!(track(&t), (None, None), "unknown until something is read");
        t.enqueue(&s, e, vec![mk(1, 100), mk(2, 200), mk(3, 300), mk(4, 400)]);
        assert_eq!(track(&t), (Some(100), Some(100)), "queued records hold both");
        let (r1, _) = t.next_to_emit().unwrap();
        let (r2, _) = t.next_to_emit().unwrap();
        let (r3, _) = t.next_to_emit().unwrap();
        assert_eq!(track(&t), (Some(400), Some(100)), "emitted, unacked: holds the committed watermark only");
        assert!(t.ack(&s, e, &r2.sequence, 0));
        assert_eq!(track(&t), (Some(400), Some(100)), "a later ack does not move it past an unacked record");
        assert!(t.ack(&s, e, &r1.sequence, 0));
        assert_eq!(track(&t), (Some(400), Some(300)), "acked: the oldest unacked holds it");
        assert!(matches!(t.fail(&s, e, &r3.sequence, 0, 1), FailOutcome::Replay(1)));
        assert_eq!(track(&t), (Some(300), Some(300)), "awaiting its replay: holds both");
        t.replay_record(&s, e, &r3.sequence, 0).expect("replayed");
        assert_eq!(track(&t), (Some(400), Some(300)), "replayed, in flight again: holds the committed one only");
        assert!(matches!(t.fail(&s, e, &r3.sequence, 0, 1), FailOutcome::DeadLetter(2)));
        assert_eq!(track(&t), (Some(400), Some(300)), "dead-lettering: in flight until its dead-letter tuple is acked");
        assert_eq!(t.fail_dead_letter(&s, e, &r3.sequence, 0), Some(1));
        assert_eq!(track(&t), (Some(400), Some(300)), "its dead-letter tuple failed: still held");
        assert!(t.ack(&s, e, &r3.sequence, 0), "the dead-letter tuple's ack");
        assert_eq!(track(&t), (Some(400), Some(400)), "handled: the oldest queued");
        let (r4, _) = t.next_to_emit().unwrap();
        assert_eq!(track(&t), (Some(400), Some(400)), "its only record in flight, nothing older: held at it");
        t.enqueue(&s, e, vec![mk(5, 500)]);
        assert_eq!(track(&t), (Some(500), Some(400)));
        let (r5, _) = t.next_to_emit().unwrap();
        assert!(t.ack(&s, e, &r5.sequence, 0));
        assert_eq!(track(&t), (Some(500), Some(400)), "r4 still unacked");
        assert!(t.ack(&s, e, &r4.sequence, 0));
        assert_eq!(track(&t), (Some(500), Some(500)), "nothing unacked: the newest read");
        // A record abandoned by a handoff is read again by the next owner: it still holds the
        // shard's committed watermark (the task's leaves a shard being handed off out).
        let s2: Arc<str> = "shardId-1".into();
        let e2 = t.start(&s2);
        t.enqueue(&s2, e2, vec![Record { arrival_ms: 50, ..rec(&s2, 1) }, Record { arrival_ms: 60, ..rec(&s2, 2) }]);
        let (a, _) = t.next_to_emit().unwrap();
        let (b, _) = t.next_to_emit().unwrap();
        assert!(t.ack(&s2, e2, &b.sequence, 0));
        t.get_mut(&s2).unwrap().stopping = true;
        assert!(matches!(t.fail(&s2, e2, &a.sequence, 0, 3), FailOutcome::Ignore));
        assert_eq!(t.get(&s2).unwrap().committed_watermark(idle), Some(50), "abandoned, not acked: holds it");
        assert_eq!(t.get(&s2).unwrap().watermark(idle), Some(60));
    }

    /// The task's committed watermark follows the coverage rules of the in-band one, over the
    /// committed per-shard marks.
    #[test]
    fn task_committed_watermark_has_the_coverage_rules_of_task_watermark() {
        let idle = Duration::from_secs(5);
        let now = 100_000;
        let mut t = Tracker::default();
        let both = |t: &Tracker| (t.task_watermark(idle, now), t.task_committed_watermark(idle, now));
        assert_eq!(both(&t), (None, None), "no assignment seen yet");
        t.set_assigned(0);
        assert_eq!(both(&t), (Some(95_000), Some(95_000)), "assigned nothing: holds nothing back");
        t.set_assigned(2);
        let a: Arc<str> = Arc::from("a");
        let ea = t.start(&a);
        assert_eq!(both(&t), (None, None), "a shard assigned but not taken yet");
        let b: Arc<str> = Arc::from("b");
        let eb = t.start(&b);
        assert_eq!(both(&t), (None, None), "taken, nothing read yet");
        t.enqueue(&a, ea, vec![Record { arrival_ms: 1_000, ..rec(&a, 1) }, Record { arrival_ms: 3_000, ..rec(&a, 2) }]);
        assert_eq!(both(&t), (None, None), "shard b read nothing yet");
        t.enqueue(&b, eb, vec![Record { arrival_ms: 2_000, ..rec(&b, 1) }]);
        assert_eq!(both(&t), (Some(1_000), Some(1_000)), "the minimum over the shards");
        let (ra, _) = t.next_to_emit().unwrap();
        let (rb, _) = t.next_to_emit().unwrap();
        assert_eq!((ra.arrival_ms, rb.arrival_ms), (1_000, 2_000));
        assert_eq!(both(&t), (Some(2_000), Some(1_000)), "emitted, unacked: the committed one stays");
        assert!(t.ack(&a, ea, &ra.sequence, 0));
        assert_eq!(both(&t), (Some(2_000), Some(2_000)), "acked: moved to b's unacked record");
        assert!(t.ack(&b, eb, &rb.sequence, 0));
        assert_eq!(both(&t), (Some(2_000), Some(2_000)), "b's newest read");
        t.get_mut(&b).unwrap().stopping = true;
        assert_eq!(both(&t), (None, None), "handing b off: fewer owned than assigned");
        t.set_assigned(1);
        assert_eq!(both(&t), (Some(3_000), Some(3_000)), "a alone: its queued record");
    }

    /// A shard read to its end holds the in-band watermark at its newest record (its children's
    /// records are not read yet) for the idle timeout after its end was read, then stops
    /// holding it even while its last records are in flight: a window holding them until it
    /// fires must fire for them to be acked, the shard to finish and its children to be read.
    /// The committed watermark keeps holding (nothing in band waits on it).
    #[test]
    fn an_ended_shard_stops_holding_the_watermark_for_its_records_in_flight_after_the_idle_timeout() {
        let idle = Duration::from_secs(1);
        let mut t = Tracker::default();
        t.set_assigned(1);
        let s: Arc<str> = "shardId-0".into();
        let e = t.start(&s);
        let mk = |seq: u64, at: i64| Record { arrival_ms: at, ..rec(&s, seq) };
        t.enqueue(&s, e, vec![mk(1, 10_000), mk(2, 10_100)]);
        t.next_to_emit();
        assert!(t.mark_ended(&s, e, 10_500));
        let track = |t: &Tracker, now: i64| (t.task_watermark(idle, now), t.task_committed_watermark(idle, now));
        assert_eq!(track(&t, 20_000), (Some(10_100), Some(10_000)), "a record still queued holds it");
        let (r2, _) = t.next_to_emit().unwrap();
        assert_eq!(track(&t, 11_400), (Some(10_100), Some(10_000)), "within the idle timeout: its newest record");
        assert_eq!(track(&t, 11_600), (Some(10_600), Some(10_000)), "ended long enough: now minus the idle timeout");
        assert_eq!(track(&t, 30_000), (Some(29_000), Some(10_000)), "it moves on while its records are in flight");
        assert!(matches!(t.fail(&s, e, &r2.sequence, 0, 3), FailOutcome::Replay(1)));
        assert_eq!(track(&t, 30_000), (Some(10_100), Some(10_000)), "a record awaiting its replay holds it");
    }

    #[test]
    fn task_watermark_waits_for_assigned_shards() {
        let idle = Duration::from_secs(5);
        let mut t = Tracker::default();
        assert_eq!(t.task_watermark(idle, 100_000), None, "no assignment seen yet");
        t.set_assigned(0);
        assert_eq!(t.task_watermark(idle, 100_000), Some(95_000), "assigned nothing: holds nothing back");
        t.set_assigned(2);
        let a: Arc<str> = Arc::from("a");
        t.start(&a);
        assert_eq!(t.task_watermark(idle, 100_000), None, "a shard assigned but not taken yet: its backlog may be old");
        let b: Arc<str> = Arc::from("b");
        t.start(&b);
        assert_eq!(t.task_watermark(idle, 100_000), None, "taken, nothing read yet");
    }
}
