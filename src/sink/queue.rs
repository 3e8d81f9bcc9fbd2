//! The sink's buffer and its ordering rule, apart from any I/O.
//!
//! Records wait in one FIFO per key (partition key and explicit hash key). A batch takes at
//! most the head record of each key, and only of keys with no record in flight; a record whose
//! put failed goes back to the head of its key's FIFO. So a record is never put before an
//! earlier record of its key has been put (Kinesis keeps one key's records in order, since they
//! go to one shard), and a failed record is retried before any later record of its key.

use std::collections::{HashMap, VecDeque};

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
}

impl<T> Entry<T> {
    pub fn new(record: SinkRecord, tag: T, since: Instant) -> Self {
        Entry { size: record.size(), record, tag, since }
    }

    fn key(&self) -> Key {
        (self.record.partition_key.clone(), self.record.explicit_hash_key.clone())
    }
}

#[derive(Debug)]
struct KeyState<T> {
    fifo: VecDeque<Entry<T>>,
    in_flight: bool,
    /// Listed in `ready`.
    listed: bool,
}

impl<T> Default for KeyState<T> {
    fn default() -> Self {
        KeyState { fifo: VecDeque::new(), in_flight: false, listed: false }
    }
}

/// Per-key FIFOs, the keys ready to send in (roughly) arrival order, and byte counts.
#[derive(Debug)]
pub(crate) struct Queue<T> {
    keys: HashMap<Key, KeyState<T>>,
    /// Keys with a buffered record and none in flight.
    ready: VecDeque<Key>,
    buffered: usize,
    buffered_bytes: usize,
    in_flight_bytes: usize,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Queue { keys: HashMap::new(), ready: VecDeque::new(), buffered: 0, buffered_bytes: 0, in_flight_bytes: 0 }
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

    /// True when a batch could be taken now.
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Keys ready: the records the next batch can hold at most.
    pub fn ready_keys(&self) -> usize {
        self.ready.len()
    }

    /// When the oldest ready record was buffered (about: the head of the first ready key).
    pub fn oldest_ready(&self) -> Option<Instant> {
        self.ready.iter().take(8).filter_map(|k| self.keys.get(k)?.fifo.front().map(|e| e.since)).min()
    }

    /// Appends a record behind every buffered record of its key.
    pub fn push(&mut self, e: Entry<T>) {
        self.buffered += 1;
        self.buffered_bytes += e.size;
        let key = e.key();
        let st = self.keys.entry(key.clone()).or_default();
        st.fifo.push_back(e);
        if !st.in_flight && !st.listed {
            st.listed = true;
            self.ready.push_back(key);
        }
    }

    /// Appends a record behind every buffered record of its key, or into the last of them when
    /// `combine(last, next)` merges it there (the sink then puts both as one record, and acks
    /// both tags' inputs once it is put).
    pub fn push_combining<X>(&mut self, e: Entry<Vec<X>>, combine: impl FnOnce(&mut SinkRecord, &SinkRecord) -> bool)
    where
        T: From<Vec<X>> + AsMut<Vec<X>>,
    {
        if let Some(last) = self.keys.get_mut(&e.key()).and_then(|st| st.fifo.back_mut()) {
            let before = last.size;
            if combine(&mut last.record, &e.record) {
                last.size = last.record.size();
                last.tag.as_mut().extend(e.tag);
                self.buffered_bytes = self.buffered_bytes + last.size - before;
                return;
            }
        }
        self.push(Entry { record: e.record, tag: T::from(e.tag), size: e.size, since: e.since });
    }

    /// A batch: the head record of ready keys, in order, up to `max_records` and `max_bytes`
    /// (a first record larger than `max_bytes` goes alone). Its keys are now in flight.
    pub fn take_batch(&mut self, max_records: usize, max_bytes: usize) -> Vec<Entry<T>> {
        let mut batch = Vec::new();
        let mut bytes = 0;
        while batch.len() < max_records {
            let Some(key) = self.ready.pop_front() else { break };
            let Some(st) = self.keys.get_mut(&key) else { continue };
            let size = st.fifo.front().map_or(0, |e| e.size);
            if !batch.is_empty() && bytes + size > max_bytes {
                self.ready.push_front(key);
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
        batch
    }

    /// A record of the last batch was put (or failed for good): its key may send its next.
    pub fn release(&mut self, e: &Entry<T>) {
        self.in_flight_bytes -= e.size;
        let key = e.key();
        let Some(st) = self.keys.get_mut(&key) else { return };
        st.in_flight = false;
        if st.fifo.is_empty() {
            self.keys.remove(&key);
        } else if !st.listed {
            st.listed = true;
            self.ready.push_back(key);
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
            let st = self.keys.entry(key.clone()).or_default();
            st.in_flight = false;
            st.fifo.push_front(e);
            if st.listed {
                // already listed (cannot happen while in flight); keep one listing
                continue;
            }
            st.listed = true;
            self.ready.push_front(key);
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
