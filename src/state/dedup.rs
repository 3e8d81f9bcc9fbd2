//! Exact deduplication and fencing data kept with each key's state (pure logic, no I/O).
//!
//! Per source shard the item keeps:
//! - `floor`: a position up to which every record of the shard is handled (the spout's
//!   checkpoint as carried by the latest tuple: `sequence`, or `sequence:sub_sequence` inside a
//!   KPL aggregate); no correct owner reads those records again, so anything at or below it,
//!   compared as (sequence, sub-sequence), is a duplicate;
//! - `applied`: the exact ids (sequence and sub-sequence) of the records applied to this key above
//!   the floor, each with the productions it made (re-sent if the record is seen again, because
//!   its tuple tree may not have completed); pruned as the floor moves past them;
//! - `token`: the highest lease sequencer token that wrote for the shard; a record read under a
//!   lower token comes from an earlier (zombie) owner and is refused.
//!
//! "Highest sequence applied" alone would be wrong: a record failed downstream is replayed after
//! later records of its key, and would be skipped and lost. The floor only moves when the spout's
//! checkpoint moves, which is when every record below it was acked, that is, committed here.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::coord::sequence_cmp;

/// The identity of an input record and the ownership it was read under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordId {
    /// Source shard.
    pub shard: Arc<str>,
    /// Sequence number (decimal string).
    pub sequence: Arc<str>,
    /// KPL sub-sequence (0 for plain records).
    pub sub_sequence: u64,
    /// Sequencer token of the lease the record was read under.
    pub lease_token: u64,
    /// Every record of the shard up to this position is handled (none when unknown):
    /// `sequence` (sub-sequence 0) or `sequence:sub_sequence`.
    pub floor: Option<Arc<str>>,
}

impl RecordId {
    /// The exact id stored in `applied`: `sequence:sub_sequence`.
    pub fn key(&self) -> String {
        format!("{}:{}", self.sequence, self.sub_sequence)
    }
}

/// What the item says of one input.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Not applied yet: apply it.
    Fresh,
    /// Already applied: skip it, and re-send these productions (empty once pruned).
    Duplicate(Vec<serde_json::Value>),
    /// Read under a lease older than the one that last wrote for its shard: refuse it.
    Fenced {
        /// The token stored for the shard.
        stored: u64,
    },
}

/// Deduplication and fencing data of one shard, within one key's item.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ShardDedup {
    /// Everything up to this sequence is handled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor: Option<String>,
    /// Highest lease token that wrote for this shard.
    #[serde(default)]
    pub token: u64,
    /// Applied ids above the floor, with their productions.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub applied: BTreeMap<String, Vec<serde_json::Value>>,
}

/// Deduplication and fencing data of one key, per source shard.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Dedup {
    /// Per source shard id.
    #[serde(default)]
    pub shards: BTreeMap<String, ShardDedup>,
}

/// Splits `sequence[:sub_sequence]` (a floor, or an id of `applied`) into its two parts; a
/// missing or unreadable sub-sequence is 0.
fn position(text: &str) -> (&str, u64) {
    match text.split_once(':') {
        Some((seq, sub)) => (seq, sub.parse().unwrap_or(0)),
        None => (text, 0),
    }
}

/// Whether `(sequence, sub_sequence)` is at or below `floor` (`sequence[:sub_sequence]`):
/// numerically by sequence, then by sub-sequence. A user record of a KPL aggregate whose earlier
/// user records are below the floor is not itself below it.
fn at_or_below(sequence: &str, sub_sequence: u64, floor: &str) -> bool {
    let (fseq, fsub) = position(floor);
    sequence_cmp(sequence, fseq).then(sub_sequence.cmp(&fsub)) != Ordering::Greater
}

impl Dedup {
    /// Judges one input against what is stored.
    pub fn judge(&self, id: &RecordId) -> Verdict {
        let Some(s) = self.shards.get(&*id.shard) else { return Verdict::Fresh };
        if s.token > id.lease_token {
            return Verdict::Fenced { stored: s.token };
        }
        if s.floor.as_deref().is_some_and(|f| at_or_below(&id.sequence, id.sub_sequence, f)) {
            return Verdict::Duplicate(Vec::new());
        }
        match s.applied.get(&id.key()) {
            Some(p) => Verdict::Duplicate(p.clone()),
            None => Verdict::Fresh,
        }
    }

    /// Records an input as applied, with its productions, and raises the shard's token.
    pub fn record(&mut self, id: &RecordId, productions: Vec<serde_json::Value>) {
        let s = self.shards.entry(id.shard.to_string()).or_default();
        s.token = s.token.max(id.lease_token);
        s.applied.insert(id.key(), productions);
    }

    /// Raises the shard's token and floor to the input's (never lowers them), pruning the ids the
    /// floor passed. Applies to fresh and duplicate inputs alike.
    pub fn advance(&mut self, id: &RecordId) {
        let s = self.shards.entry(id.shard.to_string()).or_default();
        s.token = s.token.max(id.lease_token);
        let Some(floor) = id.floor.as_deref().filter(|f| !f.is_empty()) else { return };
        let (seq, sub) = position(floor);
        if s.floor.as_deref().is_some_and(|old| at_or_below(seq, sub, old)) {
            return;
        }
        s.floor = Some(floor.to_string());
        s.applied.retain(|k, _| {
            let (seq, sub) = position(k);
            !at_or_below(seq, sub, floor)
        });
    }

    /// Ids kept above the floors, over every shard.
    pub fn applied_count(&self) -> usize {
        self.shards.values().map(|s| s.applied.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(shard: &str, seq: &str, token: u64, floor: Option<&str>) -> RecordId {
        RecordId {
            shard: Arc::from(shard),
            sequence: Arc::from(seq),
            sub_sequence: 0,
            lease_token: token,
            floor: floor.map(Arc::from),
        }
    }

    #[test]
    fn a_replay_after_later_records_is_still_applied_once() {
        let mut d = Dedup::default();
        // 10 and 12 applied; 11 failed downstream and comes back after them
        for s in ["10", "12"] {
            let i = id("a", s, 1, None);
            assert_eq!(d.judge(&i), Verdict::Fresh);
            d.record(&i, vec![]);
        }
        assert_eq!(d.judge(&id("a", "11", 1, None)), Verdict::Fresh, "a high-water mark would skip it");
        d.record(&id("a", "11", 1, None), vec![]);
        assert!(matches!(d.judge(&id("a", "11", 1, None)), Verdict::Duplicate(_)));
        assert!(matches!(d.judge(&id("a", "12", 1, None)), Verdict::Duplicate(_)));
    }

    #[test]
    fn the_floor_prunes_and_still_recognizes() {
        let mut d = Dedup::default();
        for s in ["5", "9", "100"] {
            d.record(&id("a", s, 1, None), vec![serde_json::json!(s)]);
        }
        d.advance(&id("a", "101", 1, Some("9")));
        assert_eq!(d.applied_count(), 1, "5 and 9 pruned, 100 kept");
        assert_eq!(d.judge(&id("a", "5", 1, None)), Verdict::Duplicate(vec![]));
        assert_eq!(d.judge(&id("a", "100", 1, None)), Verdict::Duplicate(vec![serde_json::json!("100")]));
        // a stale floor never lowers it
        d.advance(&id("a", "102", 1, Some("7")));
        assert_eq!(d.shards["a"].floor.as_deref(), Some("9"));
        // numeric, not lexicographic: "10" > "9"
        assert_eq!(d.judge(&id("a", "10", 1, None)), Verdict::Fresh);
    }

    fn sub(shard: &str, seq: &str, sub_sequence: u64, floor: Option<&str>) -> RecordId {
        RecordId { sub_sequence, ..id(shard, seq, 1, floor) }
    }

    #[test]
    fn floors_inside_a_kpl_aggregate_compare_sub_sequences() {
        let mut d = Dedup::default();
        for i in 0..4 {
            d.record(&sub("a", "200", i, None), vec![serde_json::json!(i)]);
        }
        // The checkpoint stopped after user record 1 of aggregate 200.
        d.advance(&sub("a", "200", 3, Some("200:1")));
        assert_eq!(d.applied_count(), 2, "200:0 and 200:1 pruned, 200:2 and 200:3 kept");
        assert_eq!(d.judge(&sub("a", "200", 1, None)), Verdict::Duplicate(vec![]));
        assert_eq!(d.judge(&sub("a", "200", 2, None)), Verdict::Duplicate(vec![serde_json::json!(2)]));
        assert_eq!(d.judge(&sub("a", "200", 4, None)), Verdict::Fresh, "above the floor, never applied");
        // A floor of sub-sequence 0 ("200") does not cover the aggregate's later user records.
        let mut e = Dedup::default();
        e.advance(&sub("a", "200", 0, Some("200")));
        assert_eq!(e.judge(&sub("a", "200", 0, None)), Verdict::Duplicate(vec![]));
        assert_eq!(e.judge(&sub("a", "200", 1, None)), Verdict::Fresh);
        // Floors move forward only, by (sequence, sub-sequence); numeric across lengths.
        e.advance(&sub("a", "200", 0, Some("200:5")));
        e.advance(&sub("a", "200", 0, Some("200:2")));
        assert_eq!(e.shards["a"].floor.as_deref(), Some("200:5"));
        e.advance(&sub("a", "1000", 0, Some("1000")));
        assert_eq!(e.shards["a"].floor.as_deref(), Some("1000"));
        assert_eq!(e.judge(&sub("a", "999", 9, None)), Verdict::Duplicate(vec![]));
    }

    #[test]
    fn a_lower_token_is_fenced_per_shard() {
        let mut d = Dedup::default();
        d.record(&id("a", "1", 7, None), vec![]);
        assert_eq!(d.judge(&id("a", "2", 6, None)), Verdict::Fenced { stored: 7 });
        assert_eq!(d.judge(&id("a", "2", 8, None)), Verdict::Fresh);
        assert_eq!(d.judge(&id("b", "2", 1, None)), Verdict::Fresh, "tokens are per shard");
        d.advance(&id("a", "3", 9, None));
        assert_eq!(d.judge(&id("a", "4", 8, None)), Verdict::Fenced { stored: 9 });
    }

    #[test]
    fn round_trips_through_json() {
        let mut d = Dedup::default();
        d.record(&id("shardId-000000000001", "4960", 3, None), vec![serde_json::json!({"w": 1})]);
        d.advance(&id("shardId-000000000001", "4961", 3, Some("4959")));
        let back: Dedup = serde_json::from_slice(&serde_json::to_vec(&d).unwrap()).unwrap();
        assert_eq!(back, d);
    }
}
