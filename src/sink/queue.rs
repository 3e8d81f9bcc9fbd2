//! The sink's buffer and its ordering rules, apart from any I/O.
//!
//! Records wait in one FIFO per key (partition key and explicit hash key). A batch takes at
//! most the head record of each key, and only of keys with no record in flight; a record whose
//! put failed goes back to the head of its key's FIFO. So a record is never put before an
//! earlier record of its key has been put (Kinesis keeps one key's records in order, since they
//! go to one shard), and a failed record is retried before any later record of its key.
//!
//! Epochs: [`Queue::barrier`] starts a new epoch; records pushed after it are put only once
//! every record pushed before it has been put (acknowledged by Kinesis, or given up). So a
//! record never lands in a shard ahead of a record pushed before the barrier, whatever their
//! keys and whichever shards Kinesis maps them to, through throttled records retried later and
//! stale shard maps after a reshard. The stage writer raises a barrier at each watermark and at
//! drain: the next stage derives its watermark from the records of each producer in each shard,
//! which therefore never passes a record still to come (see `crate::stage::writer`). Within an
//! epoch only the per-key order holds.

use std::collections::{BTreeMap, HashMap, VecDeque};

use tokio::time::Instant;

use super::encoder::SinkRecord;

type Key = (String, Option<String>);

/// A record waiting to be put (or in flight), with what to ack once it is: `T`.
#[derive(Debug)]
pub(crate) struct Entry<T> {
    pub record: SinkRecord,
    pub tag: T,
    pub size: usize,
    /// When it was first buffered (linger).
    pub since: Instant,
    /// Its epoch (set when pushed).
    epoch: u64,
}

impl<T> Entry<T> {
    pub fn new(record: SinkRecord, tag: T, since: Instant) -> Self {
        Entry { size: record.size(), record, tag, since, epoch: 0 }
    }

    fn key(&self) -> Key {
        (self.record.partition_key.clone(), self.record.explicit_hash_key.clone())
    }
}

#[derive(Debug)]
struct KeyState<T> {
    fifo: VecDeque<Entry<T>>,
    in_flight: bool,
    /// Listed in `ready` (under the epoch of its head record).
    listed: bool,
}

impl<T> Default for KeyState<T> {
    fn default() -> Self {
        KeyState { fifo: VecDeque::new(), in_flight: false, listed: false }
    }
}

/// Per-key FIFOs, the keys ready to send in (roughly) arrival order per epoch, and byte counts.
#[derive(Debug)]
pub(crate) struct Queue<T> {
    keys: HashMap<Key, KeyState<T>>,
    /// Keys with a buffered record and none in flight, by the epoch of their head record.
    ready: BTreeMap<u64, VecDeque<Key>>,
    /// Records buffered or in flight, per epoch: the lowest epoch here is the one being put.
    outstanding: BTreeMap<u64, usize>,
    /// The epoch of records pushed now.
    epoch: u64,
    buffered: usize,
    buffered_bytes: usize,
    in_flight_bytes: usize,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Queue {
            keys: HashMap::new(),
            ready: BTreeMap::new(),
            outstanding: BTreeMap::new(),
            epoch: 0,
            buffered: 0,
            buffered_bytes: 0,
            in_flight_bytes: 0,
        }
    }
}

impl<T> Queue<T> {
    /// Records buffered (not in flight).
    pub fn buffered(&self) -> usize {
        self.buffered
    }

    /// Bytes buffered plus bytes in flight.
    pub fn total_bytes(&self) -> usize {
        self.buffered_bytes + self.in_flight_bytes
    }

    pub fn buffered_bytes(&self) -> usize {
        self.buffered_bytes
    }

    /// The keys that may send now: those whose head record is of the lowest epoch with records
    /// outstanding.
    fn open(&self) -> Option<&VecDeque<Key>> {
        let (epoch, _) = self.outstanding.first_key_value()?;
        self.ready.get(epoch)
    }

    /// True when a batch could be taken now.
    pub fn has_ready(&self) -> bool {
        self.open().is_some_and(|r| !r.is_empty())
    }

    /// Keys ready: the records the next batch can hold at most.
    pub fn ready_keys(&self) -> usize {
        self.open().map_or(0, VecDeque::len)
    }

    /// When the oldest ready record was buffered (about: the head of the first ready key).
    pub fn oldest_ready(&self) -> Option<Instant> {
        self.open()?.iter().take(8).filter_map(|k| self.keys.get(k)?.fifo.front().map(|e| e.since)).min()
    }

    /// Starts a new epoch: records pushed from now on are put only once every record pushed
    /// before has been put (or given up), and are not combined into those.
    pub fn barrier(&mut self) {
        if self.outstanding.contains_key(&self.epoch) {
            self.epoch += 1;
        }
    }

    fn list(&mut self, key: Key, epoch: u64, front: bool) {
        let r = self.ready.entry(epoch).or_default();
        if front { r.push_front(key) } else { r.push_back(key) }
    }

    fn settled(&mut self, epoch: u64) {
        if let Some(n) = self.outstanding.get_mut(&epoch) {
            *n -= 1;
            if *n == 0 {
                self.outstanding.remove(&epoch);
            }
        }
    }

    /// Appends a record behind every buffered record of its key.
    pub fn push(&mut self, mut e: Entry<T>) {
        self.buffered += 1;
        self.buffered_bytes += e.size;
        e.epoch = self.epoch;
        *self.outstanding.entry(e.epoch).or_default() += 1;
        let key = e.key();
        let st = self.keys.entry(key.clone()).or_default();
        st.fifo.push_back(e);
        if !st.in_flight && !st.listed {
            st.listed = true;
            let head = st.fifo.front().map_or(self.epoch, |h| h.epoch);
            self.list(key, head, false);
        }
    }

    /// Appends a record behind every buffered record of its key, or into the last of them when
    /// it is of the current epoch and `combine(last, next)` merges it there (the sink then puts
    /// both as one record, and acks both tags' inputs once it is put). Never across a barrier:
    /// the merged record may carry what `next` says (the stage codec gives it `next`'s
    /// watermark), which must not go out with the records from before the barrier.
    pub fn push_combining<X>(&mut self, e: Entry<Vec<X>>, combine: impl FnOnce(&mut SinkRecord, &SinkRecord) -> bool)
    where
        T: From<Vec<X>> + AsMut<Vec<X>>,
    {
        let epoch = self.epoch;
        if let Some(last) = self.keys.get_mut(&e.key()).and_then(|st| st.fifo.back_mut()).filter(|l| l.epoch == epoch) {
            let before = last.size;
            if combine(&mut last.record, &e.record) {
                last.size = last.record.size();
                last.tag.as_mut().extend(e.tag);
                self.buffered_bytes = self.buffered_bytes + last.size - before;
                return;
            }
        }
        self.push(Entry { record: e.record, tag: T::from(e.tag), size: e.size, since: e.since, epoch: 0 });
    }

    /// A batch: the head record of ready keys of the open epoch, in order, up to `max_records`
    /// and `max_bytes` (a first record larger than `max_bytes` goes alone). Its keys are now in
    /// flight.
    pub fn take_batch(&mut self, max_records: usize, max_bytes: usize) -> Vec<Entry<T>> {
        let mut batch = Vec::new();
        let Some((&epoch, _)) = self.outstanding.first_key_value() else { return batch };
        let Some(ready) = self.ready.get_mut(&epoch) else { return batch };
        let mut bytes = 0;
        while batch.len() < max_records {
            let Some(key) = ready.pop_front() else { break };
            let Some(st) = self.keys.get_mut(&key) else { continue };
            let size = st.fifo.front().map_or(0, |e| e.size);
            if !batch.is_empty() && bytes + size > max_bytes {
                ready.push_front(key);
                break;
            }
            st.listed = false;
            let Some(e) = st.fifo.pop_front() else { continue };
            st.in_flight = true;
            bytes += e.size;
            self.buffered -= 1;
            self.buffered_bytes -= e.size;
            self.in_flight_bytes += e.size;
            batch.push(e);
        }
        if ready.is_empty() {
            self.ready.remove(&epoch);
        }
        batch
    }

    /// A record of the last batch was put (or failed for good): its key may send its next.
    pub fn release(&mut self, e: &Entry<T>) {
        self.in_flight_bytes -= e.size;
        self.settled(e.epoch);
        let key = e.key();
        let Some(st) = self.keys.get_mut(&key) else { return };
        st.in_flight = false;
        if st.fifo.is_empty() {
            self.keys.remove(&key);
        } else if !st.listed {
            st.listed = true;
            let head = st.fifo.front().map_or(self.epoch, |h| h.epoch);
            self.list(key, head, false);
        }
    }

    /// Records of the last batch to put again: each goes back to the head of its key's FIFO,
    /// and their keys to the front of the ready list, in the batch's order.
    pub fn requeue(&mut self, entries: Vec<Entry<T>>) {
        for e in entries.into_iter().rev() {
            self.in_flight_bytes -= e.size;
            self.buffered += 1;
            self.buffered_bytes += e.size;
            let key = e.key();
            let epoch = e.epoch;
            let st = self.keys.entry(key.clone()).or_default();
            st.in_flight = false;
            st.fifo.push_front(e);
            if st.listed {
                // already listed (cannot happen while in flight); keep one listing
                continue;
            }
            st.listed = true;
            self.list(key, epoch, true);
        }
    }

    /// The buffered records (not those in flight), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &Entry<T>> {
        self.keys.values().flat_map(|st| st.fifo.iter())
    }

    /// Every buffered record (not those in flight), in no particular order.
    pub fn take_all(&mut self) -> Vec<Entry<T>> {
        let mut out = Vec::with_capacity(self.buffered);
        self.ready.clear();
        self.keys.retain(|_, st| {
            out.extend(st.fifo.drain(..));
            st.listed = false;
            st.in_flight
        });
        for e in &out {
            self.settled(e.epoch);
        }
        self.buffered = 0;
        self.buffered_bytes = 0;
        out
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    fn entry(key: &str, seq: u32, size: usize) -> Entry<(String, u32)> {
        Entry::new(SinkRecord::new(key, vec![0u8; size]), (key.to_string(), seq), Instant::now())
    }

    #[test]
    fn one_record_per_key_per_batch_in_arrival_order() {
        let mut q = Queue::default();
        for (k, s) in [("a", 0), ("a", 1), ("b", 0), ("c", 0), ("b", 1)] {
            q.push(entry(k, s, 10));
        }
        let b: Vec<_> = q.take_batch(500, 1 << 20).into_iter().map(|e| e.tag).collect();
        assert_eq!(b, [("a".into(), 0), ("b".into(), 0), ("c".into(), 0)]);
        // a and b are in flight: nothing of theirs goes out
        assert!(q.take_batch(500, 1 << 20).is_empty());
        assert_eq!(q.buffered(), 2);
    }

    #[test]
    fn a_failed_record_goes_before_later_records_of_its_key() {
        let mut q = Queue::default();
        q.push(entry("a", 0, 10));
        q.push(entry("b", 0, 10));
        let batch = q.take_batch(500, 1 << 20);
        q.push(entry("a", 1, 10));
        let (failed, ok): (Vec<_>, Vec<_>) = batch.into_iter().partition(|e| e.tag.0 == "a");
        for e in &ok {
            q.release(e);
        }
        q.requeue(failed);
        let b: Vec<_> = q.take_batch(500, 1 << 20).into_iter().map(|e| e.tag).collect();
        assert_eq!(b, [("a".into(), 0)]);
        assert_eq!(q.total_bytes(), 2 * 11, "a:0 in flight, a:1 buffered");
    }

    #[test]
    fn batches_respect_records_and_bytes_and_an_oversized_record_goes_alone() {
        let mut q = Queue::default();
        for i in 0..10 {
            q.push(entry(&format!("k{i}"), 0, 100));
        }
        assert_eq!(q.take_batch(4, 1 << 20).len(), 4);
        assert_eq!(q.take_batch(500, 250).len(), 2);
        let mut q2 = Queue::default();
        q2.push(entry("big", 0, 1000));
        q2.push(entry("small", 0, 10));
        assert_eq!(q2.take_batch(500, 100).len(), 1);
        assert_eq!(q2.take_batch(500, 100).len(), 1);
    }

    #[test]
    fn take_all_leaves_in_flight_keys() {
        let mut q = Queue::default();
        q.push(entry("a", 0, 1));
        let b = q.take_batch(1, 100);
        q.push(entry("a", 1, 1));
        q.push(entry("b", 0, 1));
        assert_eq!(q.take_all().len(), 2);
        assert_eq!((q.buffered(), q.total_bytes()), (0, 2));
        q.release(&b[0]);
        assert_eq!(q.total_bytes(), 0);
        assert!(!q.has_ready());
    }

    #[test]
    fn a_barrier_holds_later_records_until_every_earlier_one_is_put() {
        let mut q = Queue::default();
        q.push(entry("a", 0, 10));
        q.push(entry("b", 0, 10));
        q.barrier();
        q.push(entry("control", 0, 10));
        q.push(entry("a", 1, 10));
        q.push(entry("c", 0, 10));
        let batch = q.take_batch(500, 1 << 20);
        let tags: Vec<_> = batch.iter().map(|e| e.tag.clone()).collect();
        assert_eq!(tags, [("a".into(), 0), ("b".into(), 0)], "only the records from before the barrier");
        // b is throttled: it goes again, alone; nothing after the barrier goes before it is put
        let (failed, ok): (Vec<_>, Vec<_>) = batch.into_iter().partition(|e| e.tag.0 == "b");
        for e in &ok {
            q.release(e);
        }
        q.requeue(failed);
        let retry = q.take_batch(500, 1 << 20);
        assert_eq!(retry.iter().map(|e| e.tag.clone()).collect::<Vec<_>>(), [("b".into(), 0)]);
        assert!(q.take_batch(500, 1 << 20).is_empty(), "b in flight: the next epoch waits");
        q.release(&retry[0]);
        let next: Vec<_> = q.take_batch(500, 1 << 20).into_iter().map(|e| e.tag).collect();
        assert_eq!(next, [("control".into(), 0), ("c".into(), 0), ("a".into(), 1)]);
        // a barrier with nothing outstanding since the last one opens no empty epoch
        let mut q2: Queue<(String, u32)> = Queue::default();
        q2.barrier();
        q2.barrier();
        q2.push(entry("x", 0, 1));
        assert_eq!(q2.take_batch(500, 1 << 20).len(), 1);
    }

    #[test]
    fn records_combine_within_an_epoch_only_and_take_all_settles_epochs() {
        let mut q: Queue<Vec<u32>> = Queue::default();
        let e = |k: &str, n: u32| Entry::new(SinkRecord::new(k, vec![0u8; 4]), vec![n], Instant::now());
        q.push_combining(e("a", 0), |_, _| true);
        q.push_combining(e("a", 1), |_, _| true);
        q.barrier();
        // not combined into a:0+1, of the epoch before the barrier
        q.push_combining(e("a", 2), |_, _| true);
        q.push_combining(e("a", 3), |_, _| true);
        q.push(e("b", 4));
        let first: Vec<_> = q.take_batch(500, 1 << 20).into_iter().map(|e| e.tag).collect();
        assert_eq!(first, [vec![0, 1]], "combined within the first epoch");
        // failing everything buffered settles their epochs: later records are not stuck
        assert_eq!(q.take_all().len(), 2, "a:2+3 and b:4");
        q.push(e("c", 5));
        assert!(q.take_batch(500, 1 << 20).is_empty(), "a:0+1 still in flight");
    }

    proptest! {
        /// Random keys, barriers and per-record failures: every record is put once, each key's
        /// in order, and the epochs in order: no record is put before every record pushed
        /// before a barrier it follows (so, whatever shards the keys map to, no record lands
        /// in a shard ahead of one pushed before the last barrier before it).
        #[test]
        fn epochs_hold_under_random_failures(
            pushes in proptest::collection::vec((0u8..6, proptest::bool::weighted(0.15)), 1..200),
            fail in proptest::collection::vec(proptest::bool::weighted(0.2), 64),
            max_records in 1usize..8,
        ) {
            let mut q = Queue::default();
            let mut next_seq: BTreeMap<String, u32> = BTreeMap::new();
            // (key, seq) -> its epoch (the number of barriers pushed before it)
            let mut epoch_of: BTreeMap<(String, u32), usize> = BTreeMap::new();
            let mut barriers = 0usize;
            let mut put: Vec<(String, u32)> = Vec::new();
            let (mut pushed, mut round) = (0, 0usize);
            while pushed < pushes.len() || q.total_bytes() > 0 {
                for _ in 0..3 {
                    if pushed < pushes.len() {
                        let (k, barrier) = pushes[pushed];
                        if barrier {
                            q.barrier();
                            barriers += 1;
                        }
                        let k = format!("k{k}");
                        let s = next_seq.entry(k.clone()).or_default();
                        epoch_of.insert((k.clone(), *s), barriers);
                        q.push(entry(&k, *s, 1));
                        *s += 1;
                        pushed += 1;
                    }
                }
                let batch = q.take_batch(max_records, 1 << 20);
                let mut again = Vec::new();
                for e in batch {
                    round += 1;
                    if fail[round % fail.len()] && !round.is_multiple_of(7) {
                        again.push(e);
                    } else {
                        put.push(e.tag.clone());
                        q.release(&e);
                    }
                }
                q.requeue(again);
            }
            prop_assert_eq!(put.len(), pushes.len(), "every record put once");
            let epochs: Vec<usize> = put.iter().map(|t| epoch_of[t]).collect();
            prop_assert!(epochs.windows(2).all(|w| w[0] <= w[1]), "a record overtook an earlier epoch: {:?}", epochs);
            for (k, n) in &next_seq {
                let seqs: Vec<u32> = put.iter().filter(|(pk, _)| pk == k).map(|(_, s)| *s).collect();
                prop_assert_eq!(seqs, (0..*n).collect::<Vec<_>>(), "key {}", k);
            }
        }
    }

    proptest! {
        /// Random keys and random per-record failures: every record is put, and for each key
        /// the records are put in the order they were pushed (no record put twice, since a put
        /// that "fails" here is not written).
        #[test]
        fn per_key_order_holds_under_random_failures(
            keys in proptest::collection::vec(0u8..6, 1..200),
            fail in proptest::collection::vec(any::<bool>(), 64),
            max_records in 1usize..8,
        ) {
            let mut q = Queue::default();
            let mut next_seq: BTreeMap<String, u32> = BTreeMap::new();
            let mut put: BTreeMap<String, Vec<u32>> = BTreeMap::new();
            let mut pushed = 0;
            let mut round = 0usize;
            while pushed < keys.len() || q.total_bytes() > 0 {
                // push a few, then one call
                for _ in 0..3 {
                    if pushed < keys.len() {
                        let k = format!("k{}", keys[pushed]);
                        let s = next_seq.entry(k.clone()).or_default();
                        q.push(entry(&k, *s, 1));
                        *s += 1;
                        pushed += 1;
                    }
                }
                let batch = q.take_batch(max_records, 1 << 20);
                let mut again = Vec::new();
                for e in batch {
                    round += 1;
                    if fail[round % fail.len()] && !round.is_multiple_of(5) {
                        again.push(e);
                    } else {
                        put.entry(e.tag.0.clone()).or_default().push(e.tag.1);
                        q.release(&e);
                    }
                }
                q.requeue(again);
            }
            for (k, seqs) in &put {
                let want: Vec<u32> = (0..next_seq[k]).collect();
                prop_assert_eq!(seqs, &want, "key {}", k);
            }
            prop_assert_eq!(put.values().map(Vec::len).sum::<usize>(), keys.len());
        }
    }
}
