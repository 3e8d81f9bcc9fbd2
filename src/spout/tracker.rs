//! Per-shard bookkeeping of emitted records: what is in flight, what may be checkpointed, what must
//! be replayed. Pure logic shared by the spout (emit, ack, fail) and the coordinator (checkpoint,
//! shard end, handoff) behind one short-held mutex.
//!
//! The checkpoint of a shard is the highest sequence number whose record and every earlier emitted
//! record of that shard are acked (Storm spout / KCL semantics). Records are emitted in shard order,
//! so in-flight records form a queue; acks may arrive in any order.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::coord::sequence_cmp;

/// One Kinesis record, as read.
#[derive(Debug, Clone)]
pub struct Record {
    /// Shard it came from.
    pub shard_id: Arc<str>,
    /// Sequence number (decimal string, up to 56 digits).
    pub sequence: Arc<str>,
    /// KPL sub-sequence (0 for plain records).
    pub sub_sequence: u64,
    /// Partition key.
    pub partition_key: Arc<str>,
    /// Approximate arrival timestamp, milliseconds since the epoch.
    pub arrival_ms: i64,
    /// Payload.
    pub data: Bytes,
}

/// Sort key for decimal sequence numbers of any length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SeqKey(pub Arc<str>);

impl Ord for SeqKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        sequence_cmp(&self.0, &other.0)
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
}

/// State of one owned shard within one ownership epoch.
#[derive(Debug)]
pub(crate) struct ShardTrack {
    pub epoch: u64,
    inflight: BTreeMap<SeqKey, Entry>,
    /// Highest sequence with it and everything before it acked, not yet returned by `take_checkpoint`.
    safe: Option<Arc<str>>,
    /// Highest sequence handed to the spout (emitted at least once).
    pub last_emitted: Option<Arc<str>>,
    /// The reader saw the end of the shard (null NextShardIterator).
    pub ended: bool,
    /// Handoff or shutdown in progress: nothing new is emitted, replays are dropped.
    pub stopping: bool,
    /// Records read but not yet emitted.
    pub queued: VecDeque<Record>,
    /// Arrival time of the newest record read (ms since the epoch).
    pub newest_arrival: Option<i64>,
    /// When the last record was read.
    pub last_record_at: Instant,
    /// Wall time (ms) of the last GetRecords that returned nothing and was caught up with the
    /// shard's tip (MillisBehindLatest 0).
    pub caught_up_ms: Option<i64>,
}

impl ShardTrack {
    fn new(epoch: u64) -> Self {
        Self {
            epoch,
            inflight: BTreeMap::new(),
            safe: None,
            last_emitted: None,
            ended: false,
            stopping: false,
            queued: VecDeque::new(),
            newest_arrival: None,
            last_record_at: Instant::now(),
            caught_up_ms: None,
        }
    }

    /// The shard's low watermark (ms): the arrival time of its oldest record still queued or in
    /// flight; else of the newest record read. A shard with no new record for `idle` whose reader
    /// is caught up with the tip stops holding the watermark back: it reports the time of its last
    /// caught-up read minus `idle` (any later record arrives after that). `None`: unknown yet.
    pub fn watermark(&self, idle: Duration) -> Option<i64> {
        let pending = self
            .inflight
            .values()
            .filter(|e| !e.acked)
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
        while let Some(first) = self.inflight.first_entry() {
            if !first.get().acked {
                break;
            }
            let (k, _) = first.remove_entry();
            self.safe = Some(k.0);
        }
    }
}

/// What `fail` decided.
#[derive(Debug)]
pub(crate) enum FailOutcome {
    /// Replay it after this many failures (1 = first failure).
    Replay(u32),
    /// The retry limit was reached: emit it on the dead-letter stream; it now counts as acked.
    DeadLetter(u32, Record),
    /// Stale (older epoch, shard handed off, unknown): ignore.
    Ignore,
}

/// Every shard this spout task owns.
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    shards: HashMap<Arc<str>, ShardTrack>,
    next_epoch: u64,
}

impl Tracker {
    /// Starts tracking a newly owned shard; returns its epoch.
    pub fn start(&mut self, shard: &Arc<str>) -> u64 {
        self.next_epoch += 1;
        let epoch = self.next_epoch;
        self.shards.insert(shard.clone(), ShardTrack::new(epoch));
        epoch
    }

    /// Stops tracking (after release); later acks of that epoch are ignored.
    pub fn remove(&mut self, shard: &str) -> Option<ShardTrack> {
        self.shards.remove(shard)
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
        match self.live(shard, epoch) {
            Some(t) if !t.stopping => {
                if let Some(newest) = records.iter().map(|r| r.arrival_ms).max() {
                    t.newest_arrival = Some(t.newest_arrival.map_or(newest, |n| n.max(newest)));
                    t.last_record_at = Instant::now();
                }
                t.queued.extend(records);
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
    pub fn watermark(&self, idle: Duration) -> Option<i64> {
        let mut min: Option<i64> = None;
        for t in self.shards.values().filter(|t| !t.stopping) {
            let w = t.watermark(idle)?;
            min = Some(min.map_or(w, |m| m.min(w)));
        }
        min
    }

    /// True when no shard is owned (or every owned one is being handed off).
    pub fn owns_nothing(&self) -> bool {
        self.shards.values().all(|t| t.stopping)
    }

    /// Marks the shard's end as read. Returns false when stale.
    pub fn mark_ended(&mut self, shard: &str, epoch: u64) -> bool {
        match self.live(shard, epoch) {
            Some(t) => {
                t.ended = true;
                true
            }
            None => false,
        }
    }

    /// Takes the next queued record of any non-stopping shard (round-robin is not needed: each
    /// shard's queue is bounded by its reader's channel) and registers it as in flight.
    pub fn next_to_emit(&mut self) -> Option<(Record, u64)> {
        for t in self.shards.values_mut() {
            if t.stopping {
                continue;
            }
            if let Some(r) = t.queued.pop_front() {
                t.last_emitted = Some(r.sequence.clone());
                t.inflight.insert(
                    SeqKey(r.sequence.clone()),
                    Entry { record: r.clone(), acked: false, failures: 0, abandoned: false },
                );
                return Some((r, t.epoch));
            }
        }
        None
    }

    /// Records the ack of one record.
    pub fn ack(&mut self, shard: &str, epoch: u64, sequence: &Arc<str>) -> bool {
        let Some(t) = self.live(shard, epoch) else { return false };
        match t.inflight.get_mut(&SeqKey(sequence.clone())) {
            Some(e) => {
                e.acked = true;
                t.advance();
                true
            }
            None => false,
        }
    }

    /// Records the failure of one record and decides what happens to it.
    pub fn fail(&mut self, shard: &str, epoch: u64, sequence: &Arc<str>, max_retries: u32) -> FailOutcome {
        let Some(t) = self.live(shard, epoch) else { return FailOutcome::Ignore };
        let stopping = t.stopping;
        let Some(e) = t.inflight.get_mut(&SeqKey(sequence.clone())) else { return FailOutcome::Ignore };
        if e.acked {
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
            e.acked = true;
            let record = e.record.clone();
            t.advance();
            FailOutcome::DeadLetter(n, record)
        } else {
            FailOutcome::Replay(n)
        }
    }

    /// The record to replay, if its shard and epoch are still live and it is still unacked.
    pub fn replay_record(&self, shard: &str, epoch: u64, sequence: &Arc<str>) -> Option<Record> {
        let t = self.shards.get(shard).filter(|t| t.epoch == epoch && !t.stopping)?;
        let e = t.inflight.get(&SeqKey(sequence.clone()))?;
        (!e.acked).then(|| e.record.clone())
    }

    /// The new safe checkpoint of a shard since the last call, if it moved.
    #[cfg(test)]
    pub fn take_checkpoint(&mut self, shard: &str) -> Option<Arc<str>> {
        self.shards.get_mut(shard)?.safe.take()
    }

    /// Peeks the safe checkpoint without consuming it.
    pub fn peek_checkpoint(&self, shard: &str) -> Option<Arc<str>> {
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
        assert!(t.ack(&s, e, &seq(1)));
        assert_eq!(t.take_checkpoint(&s), None, "record 1 is not acked yet");
        assert!(t.ack(&s, e, &seq(0)));
        assert_eq!(t.take_checkpoint(&s), Some(seq(1)));
        assert_eq!(t.take_checkpoint(&s), None, "taken once");
        assert!(matches!(t.fail(&s, e, &seq(2), 1), FailOutcome::Replay(1)));
        assert!(t.replay_record(&s, e, &seq(2)).is_some());
        assert!(matches!(t.fail(&s, e, &seq(2), 1), FailOutcome::DeadLetter(2, r) if r.sequence == seq(2)));
        assert_eq!(t.take_checkpoint(&s), Some(seq(2)), "a dead-lettered record counts as handled");
        assert_eq!(t.total_inflight(), 0);
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
        assert!(!t.ack(&s, e1, &r.sequence));
        assert!(matches!(t.fail(&s, e1, &r.sequence, 3), FailOutcome::Ignore));
        assert!(!t.enqueue(&s, e1, vec![rec(&s, 2)]));
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
        t.ack(&s, e, &long.sequence);
        assert_eq!(t.take_checkpoint(&s), None, "99 < 100 numerically, though not as text");
        t.ack(&s, e, &short.sequence);
        assert_eq!(t.take_checkpoint(&s).as_deref(), Some("100"));
    }

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
        let (r2, _) = t.next_to_emit().unwrap();
        t.ack(&s, e, &r2.sequence);
        assert_eq!(t.watermark(idle), Some(100), "the oldest in flight holds it");
        t.ack(&s, e, &r1.sequence);
        assert_eq!(t.watermark(idle), Some(300), "then the oldest queued");
        let (r3, _) = t.next_to_emit().unwrap();
        t.ack(&s, e, &r3.sequence);
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
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
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
            for o in order {
                let i = (o as usize) % n;
                if o % 3 == 0 {
                    if let FailOutcome::DeadLetter(..) = t.fail(&s, e, &recs[i].sequence, max_retries) { handled[i] = true; }
                } else if t.ack(&s, e, &recs[i].sequence) || handled[i] {
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
}
