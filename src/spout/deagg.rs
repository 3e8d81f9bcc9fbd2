//! KPL de-aggregation of one GetRecords batch, between the reader and the tracker's queue.
//!
//! - A Kinesis record in the KPL aggregated format ([`crate::kinesis::kpl`]) becomes one
//!   [`Record`] per user record, each with its own partition key, the aggregate's sequence number
//!   and arrival time, and its index in the aggregate as sub-sequence. Payloads share the
//!   aggregate's buffer.
//! - User records whose hash key (their explicit hash key, else the MD5 of their partition key)
//!   is outside the hash range of the shard they were read from are counted (`out_of_range`),
//!   and then, by [`KplOutOfRange`]:
//!   - `deliver` (the default): delivered like the others. Nothing is lost whoever wrote the
//!     aggregate. AWS's aggregation library (`aws-kinesis-agg`, Lambda producers) packs records
//!     of any keys into one aggregate routed by its first record and never sends them again, so
//!     this is the only choice that loses none of theirs. The cost: after a reshard, a KPL whose
//!     shard map was stale sends the whole aggregate's user records again to their own shards,
//!     and those records are delivered twice.
//!   - `drop_aggregate` (opt-in, the KCL's semantics, `AggregatorUtil::deaggregate`): an
//!     aggregate holding any user record outside the range is dropped whole, because the KPL
//!     re-sends the whole aggregate, not one record. Counted (`dropped`, `dropped_aggregates`)
//!     and logged at WARN per batch. No duplicates from KPL re-sends; the records of producers
//!     that never re-send are lost.
//!
//!   The explicit hash key is used only for this; tuples do not carry it. When ListShards does
//!   not name the shard (its range is unknown) nothing is counted or dropped.
//! - A record with the magic prefix that is not a valid aggregate (bad MD5, bad protobuf) is
//!   delivered whole as one plain record (sub-sequence 0), counted, and logged with its stream,
//!   shard and sequence number: never lost.
//! - Resuming from a checkpoint: the reader starts AT the checkpointed sequence, and user records
//!   at or below the checkpoint (sequence, sub-sequence) are skipped here.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use super::config::KplOutOfRange;
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

/// KPL counters of one spout task. User records outside their shard's hash range are counted in
/// `out_of_range` whatever `kpl_out_of_range` says; what was dropped (only with
/// `drop_aggregate`) is counted apart, in `dropped` and `dropped_aggregates`, so no counter
/// changes its meaning with the configuration.
#[derive(Debug, Default)]
pub struct KplStats {
    /// Valid aggregates read (not counting one read again wholly below a resume checkpoint).
    pub aggregates: AtomicU64,
    /// User records taken out of aggregates (delivered or dropped), not counting those at or
    /// below the checkpoint a reader resumed from (they were counted when first read).
    pub user_records: AtomicU64,
    /// User records whose hash key is outside the hash range of the shard they were read from
    /// (delivered with `kpl_out_of_range: deliver`, dropped with their aggregate with
    /// `drop_aggregate`).
    pub out_of_range: AtomicU64,
    /// User records dropped, with the whole aggregate, because it held a user record outside the
    /// shard's hash range (`kpl_out_of_range: drop_aggregate` only; in-range ones included).
    pub dropped: AtomicU64,
    /// Aggregates dropped whole (`kpl_out_of_range: drop_aggregate` only).
    pub dropped_aggregates: AtomicU64,
    /// Records with the KPL magic prefix that were not valid aggregates, delivered whole.
    pub corrupt: AtomicU64,
    /// When (ms since the epoch) delivered out-of-range user records were last logged at INFO.
    out_of_range_logged_ms: AtomicI64,
}

/// What one batch held, besides the records to queue.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchCounts {
    pub aggregates: u64,
    pub user_records: u64,
    pub out_of_range: u64,
    pub dropped: u64,
    pub dropped_aggregates: u64,
    pub corrupt: u64,
    /// User records skipped as at or below the checkpoint the reader resumed from.
    pub skipped: u64,
}

/// Whether any record of the batch looks aggregated (the hash range is needed then).
pub(crate) fn any_aggregate(records: &[Record]) -> bool {
    records.iter().any(|r| r.data.starts_with(&kpl::MAGIC))
}

/// Splits aggregates into user records, counts those outside `range` (when known) and drops
/// the aggregates holding one when `mode` says so, and skips what is at or below `skip`
/// (cleared once the batch passed it). Logs corrupt aggregates and drops.
pub(crate) fn split(
    stream: &str,
    records: Vec<Record>,
    range: Option<HashRange>,
    mode: KplOutOfRange,
    skip: &mut Option<SeqKey>,
) -> (Vec<Record>, BatchCounts) {
    let mut c = BatchCounts::default();
    let mut out = Vec::with_capacity(records.len());
    // The first and last sequence of the aggregates dropped in this batch.
    let mut dropped_span: Option<(std::sync::Arc<str>, std::sync::Arc<str>)> = None;
    let mut shard = None;
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
                // Outside the shard's hash range, per user record (none when the range is unknown).
                let outside: Vec<bool> =
                    users.iter().map(|u| range.is_some_and(|range| !range.contains(u.hash_key()))).collect();
                // The KCL's semantics: the KPL re-sends the whole aggregate, so the whole
                // aggregate goes, in-range user records included.
                let drop_whole = mode == KplOutOfRange::DropAggregate && outside.contains(&true);
                // counted once per ownership: user records at or below the checkpoint the
                // reader resumed from were counted when first read
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
                    c.out_of_range += u64::from(outside[i]);
                    if !drop_whole {
                        out.push(user);
                    }
                }
                if taken > 0 {
                    c.aggregates += 1;
                    c.user_records += taken;
                    if drop_whole {
                        c.dropped += taken;
                        c.dropped_aggregates += 1;
                        let first = dropped_span.take().map_or_else(|| r.sequence.clone(), |(first, _)| first);
                        dropped_span = Some((first, r.sequence.clone()));
                        shard.get_or_insert_with(|| r.shard_id.clone());
                    }
                }
            }
        }
    }
    if let (Some((first, last)), Some(shard)) = (dropped_span, shard) {
        tracing::warn!(stream = %stream, shard = %shard, first_sequence = %first, last_sequence = %last,
            aggregates = c.dropped_aggregates, user_records = c.dropped, out_of_range = c.out_of_range,
            "dropped whole KPL aggregates holding user records outside the shard's hash range \
             (kpl_out_of_range: drop_aggregate, the KCL's semantics: a KPL with a stale shard map re-sends the whole \
             aggregate to the right shards; a producer that never re-sends, such as aws-kinesis-agg, LOSES these \
             records: set kpl_out_of_range to deliver for it)");
    }
    (out, c)
}

impl KplStats {
    /// Adds one batch of `shard`'s counts; logs delivered out-of-range user records at INFO at
    /// most once a minute per task (DEBUG otherwise).
    pub(crate) fn add(&self, c: &BatchCounts, stream: &str, shard: &str) {
        self.aggregates.fetch_add(c.aggregates, Ordering::Relaxed);
        self.user_records.fetch_add(c.user_records, Ordering::Relaxed);
        let total = self.out_of_range.fetch_add(c.out_of_range, Ordering::Relaxed) + c.out_of_range;
        self.dropped.fetch_add(c.dropped, Ordering::Relaxed);
        self.dropped_aggregates.fetch_add(c.dropped_aggregates, Ordering::Relaxed);
        self.corrupt.fetch_add(c.corrupt, Ordering::Relaxed);
        // With drop_aggregate every out-of-range user record went with its aggregate (logged by
        // `split`); with deliver, none did.
        let delivered = if c.dropped == 0 { c.out_of_range } else { 0 };
        if delivered > 0 {
            let now = crate::coord::now_ms();
            let last = self.out_of_range_logged_ms.load(Ordering::Relaxed);
            let due = now - last >= 60_000
                && self
                    .out_of_range_logged_ms
                    .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok();
            if due {
                tracing::info!(stream = %stream, shard = %shard, in_this_read = delivered, total_on_this_task = total,
                    "delivered KPL user records whose hash keys are outside the shard's hash range (kpl_out_of_range: \
                     deliver; logged at most once a minute, counted in kpl.out_of_range). A producer that packs records \
                     of any keys into one aggregate (aws-kinesis-agg) puts them there; a KPL with a stale shard map after \
                     a reshard also sends them again to their own shard, where they are delivered a second time");
            } else {
                tracing::debug!(stream = %stream, shard = %shard, delivered,
                    "delivered KPL user records outside the shard's hash range");
            }
        }
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
        let (out, c) = split("s", records, None, KplOutOfRange::Deliver, &mut None);
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

    /// An aggregate for the low half of the hash space holding, at positions 1 and 2, user
    /// records of the high half (an explicit hash key, a partition key), as a stale KPL shard map
    /// or a producer of mixed keys packs it; and the range of the low half.
    fn mixed_aggregate() -> (Bytes, HashRange, String) {
        let range = HashRange { start: 0, end: u128::MAX / 2 };
        let in_key = (0..).map(|i| format!("k{i}")).find(|k| range.contains(partition_key_hash(k))).unwrap();
        let out_key = (0..).map(|i| format!("k{i}")).find(|k| !range.contains(partition_key_hash(k))).unwrap();
        let (low, high) = ((u128::MAX / 4).to_string(), (u128::MAX / 4 * 3).to_string());
        let data = agg(&[&in_key, "sibling", &out_key, "mine"], &[None, Some(high.as_str()), None, Some(low.as_str())]);
        (data, range, in_key)
    }

    #[test]
    fn by_default_user_records_outside_the_hash_range_are_delivered_and_counted() {
        let (data, range, in_key) = mixed_aggregate();
        let plain = kinesis_record("6", Bytes::from_static(b"plain"));
        let (out, c) =
            split("s", vec![kinesis_record("5", data), plain], Some(range), KplOutOfRange::Deliver, &mut None);
        let got: Vec<(&str, u64, &str)> =
            out.iter().map(|r| (&*r.sequence, r.sub_sequence, &*r.partition_key)).collect();
        let out_key = out[2].partition_key.to_string();
        assert_eq!(
            got,
            vec![
                ("5", 0, in_key.as_str()),
                ("5", 1, "sibling"),
                ("5", 2, out_key.as_str()),
                ("5", 3, "mine"),
                ("6", 0, "agg")
            ],
            "every user record delivered, in order"
        );
        assert_eq!(
            c,
            BatchCounts { aggregates: 1, user_records: 4, out_of_range: 2, ..BatchCounts::default() },
            "2 outside the range counted, none dropped"
        );
        let stats = KplStats::default();
        stats.add(&c, "s", "shardId-000000000001");
        assert_eq!(stats.out_of_range.load(Ordering::Relaxed), 2);
        assert_eq!(stats.dropped.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn drop_aggregate_drops_the_whole_aggregate_at_one_user_record_outside_the_range_and_counts_it() {
        let (mixed, range, in_key) = mixed_aggregate();
        let all_in = agg(&[&in_key, &in_key], &[None, None]);
        let records = vec![
            kinesis_record("5", mixed.clone()),
            kinesis_record("6", all_in),
            kinesis_record("7", Bytes::from_static(b"plain")),
            kinesis_record("8", mixed),
        ];
        let (out, c) = split("s", records, Some(range), KplOutOfRange::DropAggregate, &mut None);
        let got: Vec<(&str, u64)> = out.iter().map(|r| (&*r.sequence, r.sub_sequence)).collect();
        assert_eq!(
            got,
            vec![("6", 0), ("6", 1), ("7", 0)],
            "both mixed aggregates dropped whole, in-range records too"
        );
        assert_eq!(
            c,
            BatchCounts {
                aggregates: 3,
                user_records: 10,
                out_of_range: 4,
                dropped: 8,
                dropped_aggregates: 2,
                ..BatchCounts::default()
            }
        );
        let stats = KplStats::default();
        stats.add(&c, "s", "shardId-000000000001");
        assert_eq!((stats.dropped.load(Ordering::Relaxed), stats.dropped_aggregates.load(Ordering::Relaxed)), (8, 2));
    }

    #[test]
    fn without_a_known_range_nothing_is_counted_or_dropped() {
        let (mixed, _, _) = mixed_aggregate();
        for mode in [KplOutOfRange::Deliver, KplOutOfRange::DropAggregate] {
            let (out, c) = split("s", vec![kinesis_record("5", mixed.clone())], None, mode, &mut None);
            assert_eq!(out.len(), 4, "{mode}");
            assert_eq!((c.out_of_range, c.dropped), (0, 0), "{mode}");
        }
    }

    #[test]
    fn drop_aggregate_counts_only_the_user_records_past_a_resume_checkpoint() {
        let (mixed, range, _) = mixed_aggregate();
        let mut skip = Some(SeqKey(Arc::from("5"), 1));
        let (out, c) =
            split("s", vec![kinesis_record("5", mixed)], Some(range), KplOutOfRange::DropAggregate, &mut skip);
        assert!(out.is_empty());
        assert_eq!((c.skipped, c.user_records, c.dropped, c.out_of_range), (2, 2, 2, 1));
    }

    #[test]
    fn corrupt_aggregates_are_delivered_whole() {
        let good = agg(&["a", "b"], &[None, None]);
        let mut bad = good.to_vec();
        bad[6] ^= 0xff;
        let (out, c) =
            split("s", vec![kinesis_record("9", Bytes::from(bad.clone()))], None, KplOutOfRange::Deliver, &mut None);
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
        let (out, c) = split("s", records.clone(), None, KplOutOfRange::Deliver, &mut skip);
        let got: Vec<(&str, u64)> = out.iter().map(|r| (&*r.sequence, r.sub_sequence)).collect();
        assert_eq!(got, vec![("200", 2), ("200", 3), ("300", 0)]);
        assert_eq!(c.skipped, 2);
        assert_eq!(skip, None, "passed: cleared");
        // A plain record's checkpoint skips exactly that record.
        let mut skip = Some(SeqKey(Arc::from("300"), 0));
        let (out, _) = split("s", records, None, KplOutOfRange::Deliver, &mut skip);
        assert!(out.is_empty());
        assert!(skip.is_some(), "nothing after it yet");
    }
}
