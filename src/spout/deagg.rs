//! KPL de-aggregation of one GetRecords batch, between the reader and the tracker's queue.
//!
//! - A Kinesis record in the KPL aggregated format ([`crate::kinesis::kpl`]) becomes one
//!   [`Record`] per user record, each with its own partition key, the aggregate's sequence number
//!   and arrival time, and its index in the aggregate as sub-sequence. Payloads share the
//!   aggregate's buffer.
//! - After a reshard, the KPL may have packed user records for a sibling shard into an aggregate
//!   (its shard map was stale); it puts those again to the right shard. As KCL does, a user record
//!   whose hash key (its explicit hash key, else the MD5 of its partition key) is outside the
//!   shard's hash range is dropped here and counted. The explicit hash key is used only for this;
//!   tuples do not carry it.
//! - A record with the magic prefix that is not a valid aggregate (bad MD5, bad protobuf) is
//!   delivered whole as one plain record (sub-sequence 0), counted, and logged with its stream,
//!   shard and sequence number: never lost.
//! - Resuming from a checkpoint: the reader starts AT the checkpointed sequence, and user records
//!   at or below the checkpoint (sequence, sub-sequence) are skipped here.

use std::sync::atomic::{AtomicU64, Ordering};

use super::tracker::{Record, SeqKey};
use crate::coord::sequence_cmp;
use crate::kinesis::ShardDescription;
use crate::kinesis::kpl::{self, Deaggregated};

/// A shard's hash key range, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HashRange {
    pub start: u128,
    pub end: u128,
}

impl HashRange {
    /// The range ListShards gave the shard; `None` when a bound is not a decimal 128-bit integer.
    pub fn of(shard: &ShardDescription) -> Option<Self> {
        Some(Self { start: shard.starting_hash_key.parse().ok()?, end: shard.ending_hash_key.parse().ok()? })
    }

    pub fn contains(&self, hash: u128) -> bool {
        (self.start..=self.end).contains(&hash)
    }
}

/// KPL counters of one spout task.
#[derive(Debug, Default)]
pub struct KplStats {
    /// Valid aggregates read (not counting one read again wholly below a resume checkpoint).
    pub aggregates: AtomicU64,
    /// User records taken out of aggregates (before the hash-range filter), not counting those at
    /// or below the checkpoint a reader resumed from (they were counted when first read).
    pub user_records: AtomicU64,
    /// User records dropped because their hash key is outside the shard's hash range.
    pub out_of_range: AtomicU64,
    /// Records with the KPL magic prefix that were not valid aggregates, delivered whole.
    pub corrupt: AtomicU64,
}

/// What one batch held, besides the records to queue.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchCounts {
    pub aggregates: u64,
    pub user_records: u64,
    pub out_of_range: u64,
    pub corrupt: u64,
    /// User records skipped as at or below the checkpoint the reader resumed from.
    pub skipped: u64,
}

/// Whether any record of the batch looks aggregated (the hash range is needed then).
pub(crate) fn any_aggregate(records: &[Record]) -> bool {
    records.iter().any(|r| r.data.starts_with(&kpl::MAGIC))
}

/// Splits aggregates into user records, filters by `range` (when known) and skips what is at or
/// below `skip` (cleared once the batch passed it). Logs corrupt aggregates and drops.
pub(crate) fn split(
    stream: &str,
    records: Vec<Record>,
    range: Option<HashRange>,
    skip: &mut Option<SeqKey>,
) -> (Vec<Record>, BatchCounts) {
    let mut c = BatchCounts::default();
    let mut out = Vec::with_capacity(records.len());
    // Whether a record is at or below the checkpoint the reader resumed from (counted as
    // skipped); clears the skip once the batch passed it.
    let mut skipped = |r: &Record, c: &mut BatchCounts| {
        if let Some(k) = skip.as_ref() {
            if r.key() <= *k {
                c.skipped += 1;
                return true;
            }
            if sequence_cmp(&r.sequence, &k.0).is_gt() {
                *skip = None;
            }
        }
        false
    };
    for r in records {
        match kpl::deaggregate(&r.data) {
            Deaggregated::Plain => {
                if !skipped(&r, &mut c) {
                    out.push(r);
                }
            }
            Deaggregated::Corrupt(reason) => {
                if skipped(&r, &mut c) {
                    continue;
                }
                c.corrupt += 1;
                tracing::warn!(stream = %stream, shard = %r.shard_id, sequence = %r.sequence, bytes = r.data.len(), %reason,
                    "record starts with the KPL magic bytes but is not a valid aggregate: delivered whole as one plain record");
                out.push(r);
            }
            Deaggregated::Records(users) => {
                // counted once per ownership: user records at or below the checkpoint the
                // reader resumed from were counted when first read
                let mut dropped = 0u64;
                let mut taken = 0u64;
                for (i, u) in users.into_iter().enumerate() {
                    let user = Record {
                        shard_id: r.shard_id.clone(),
                        sequence: r.sequence.clone(),
                        sub_sequence: i as u64,
                        partition_key: u.partition_key.clone(),
                        arrival_ms: r.arrival_ms,
                        data: u.data.clone(),
                    };
                    if skipped(&user, &mut c) {
                        continue;
                    }
                    taken += 1;
                    if range.is_some_and(|range| !range.contains(u.hash_key())) {
                        dropped += 1;
                        continue;
                    }
                    out.push(user);
                }
                if taken > 0 {
                    c.aggregates += 1;
                    c.user_records += taken;
                }
                if dropped > 0 {
                    c.out_of_range += dropped;
                    tracing::info!(stream = %stream, shard = %r.shard_id, sequence = %r.sequence, dropped,
                        "dropped user records of a KPL aggregate whose hash keys are outside the shard's hash range (they belong to a sibling shard after a reshard; the producer puts them there)");
                }
            }
        }
    }
    (out, c)
}

impl KplStats {
    pub(crate) fn add(&self, c: &BatchCounts) {
        self.aggregates.fetch_add(c.aggregates, Ordering::Relaxed);
        self.user_records.fetch_add(c.user_records, Ordering::Relaxed);
        self.out_of_range.fetch_add(c.out_of_range, Ordering::Relaxed);
        self.corrupt.fetch_add(c.corrupt, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;

    use super::*;
    use crate::kinesis::kpl::{NewUserRecord, aggregate, partition_key_hash};

    fn kinesis_record(seq: &str, data: Bytes) -> Record {
        Record {
            shard_id: Arc::from("shardId-000000000001"),
            sequence: Arc::from(seq),
            sub_sequence: 0,
            partition_key: Arc::from("agg"),
            arrival_ms: 7,
            data,
        }
    }

    fn agg(keys: &[&str], ehk: &[Option<&str>]) -> Bytes {
        let recs: Vec<NewUserRecord<'_>> = keys
            .iter()
            .zip(ehk)
            .map(|(k, e)| NewUserRecord { partition_key: k, explicit_hash_key: *e, data: k.as_bytes() })
            .collect();
        aggregate(&recs).unwrap().data
    }

    #[test]
    fn aggregates_become_user_records_with_sub_sequences() {
        let records = vec![
            kinesis_record("100", Bytes::from_static(b"plain")),
            kinesis_record("200", agg(&["a", "b", "c"], &[None, None, None])),
        ];
        let (out, c) = split("s", records, None, &mut None);
        let got: Vec<(&str, u64, &str)> =
            out.iter().map(|r| (&*r.sequence, r.sub_sequence, &*r.partition_key)).collect();
        assert_eq!(got, vec![("100", 0, "agg"), ("200", 0, "a"), ("200", 1, "b"), ("200", 2, "c")]);
        assert_eq!(&out[2].data[..], b"b");
        assert!(out.iter().all(|r| r.arrival_ms == 7));
        assert_eq!(c, BatchCounts { aggregates: 1, user_records: 3, ..BatchCounts::default() });
        // Memory: each user record counts its own slice, key, sequence and overhead, which is at
        // least the bytes the batch holds.
        let mem_after: usize = out.iter().map(Record::mem_size).sum();
        assert!(
            mem_after >= out.iter().map(|r| r.data.len()).sum::<usize>() + 4 * super::super::tracker::RECORD_OVERHEAD
        );
    }

    #[test]
    fn user_records_outside_the_hash_range_are_dropped_and_counted() {
        let low = u128::MAX / 4;
        let high = (u128::MAX / 4 * 3).to_string();
        let range = HashRange { start: 0, end: u128::MAX / 2 };
        let in_key = (0..).map(|i| format!("k{i}")).find(|k| range.contains(partition_key_hash(k))).unwrap();
        let out_key = (0..).map(|i| format!("k{i}")).find(|k| !range.contains(partition_key_hash(k))).unwrap();
        let low_s = low.to_string();
        let data =
            agg(&[&in_key, "sibling", &out_key, "mine"], &[None, Some(high.as_str()), None, Some(low_s.as_str())]);
        let (out, c) = split("s", vec![kinesis_record("5", data)], Some(range), &mut None);
        let got: Vec<(u64, &str)> = out.iter().map(|r| (r.sub_sequence, &*r.partition_key)).collect();
        assert_eq!(got, vec![(0, in_key.as_str()), (3, "mine")], "sub-sequences stay the indexes in the aggregate");
        assert_eq!((c.user_records, c.out_of_range), (4, 2));
    }

    #[test]
    fn corrupt_aggregates_are_delivered_whole() {
        let good = agg(&["a", "b"], &[None, None]);
        let mut bad = good.to_vec();
        bad[6] ^= 0xff;
        let (out, c) = split("s", vec![kinesis_record("9", Bytes::from(bad.clone()))], None, &mut None);
        assert_eq!(out.len(), 1);
        assert_eq!((&out[0].data[..], out[0].sub_sequence, &*out[0].partition_key), (&bad[..], 0, "agg"));
        assert_eq!(c.corrupt, 1);
    }

    #[test]
    fn resuming_skips_what_the_checkpoint_covers() {
        let records = vec![
            kinesis_record("200", agg(&["a", "b", "c", "d"], &[None; 4])),
            kinesis_record("300", Bytes::from_static(b"x")),
        ];
        let mut skip = Some(SeqKey(Arc::from("200"), 1));
        let (out, c) = split("s", records.clone(), None, &mut skip);
        let got: Vec<(&str, u64)> = out.iter().map(|r| (&*r.sequence, r.sub_sequence)).collect();
        assert_eq!(got, vec![("200", 2), ("200", 3), ("300", 0)]);
        assert_eq!(c.skipped, 2);
        assert_eq!(skip, None, "passed: cleared");
        // A plain record's checkpoint skips exactly that record.
        let mut skip = Some(SeqKey(Arc::from("300"), 0));
        let (out, _) = split("s", records, None, &mut skip);
        assert!(out.is_empty());
        assert!(skip.is_some(), "nothing after it yet");
    }
}
