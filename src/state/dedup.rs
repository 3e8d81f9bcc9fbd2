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
//! Inputs that are another stage's strong productions (read from a stage boundary's intermediate
//! stream, [`ProductionId`]) are deduplicated by production id instead, per *source* shard of the
//! stage that made them (`productions`); the intermediate shard they were read from is only
//! fenced (`shards`, token). Their floor needs one more step, because the producing stage's
//! checkpoint (carried by every production) says that every production of the records below it
//! was *put*, not that this stage applied it: a production failed here and replayed would be
//! skipped. So a floor carried by a production read at position `q` of intermediate shard `X`
//! waits as a candidate, and takes effect once this stage's own checkpoint of `X` passed `q`.
//! Every copy of a production below that floor was put before the production that carried it
//! (the producer's checkpoint only passes a record once its productions are put), into the same
//! shard (one key, one shard; a child is read only after its parents finished), so by then each
//! copy was handled here.
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
    /// When the record is another stage's production (read from an intermediate stream), its
    /// production id: then the fields above identify the intermediate record, which is fenced
    /// by its lease token, and duplicates are found by this id.
    pub production: Option<ProductionId>,
}

/// The id of a strong production made by an exactly-once stage: the source record that made it
/// and its index among that record's productions, plus the producing stage's checkpoint of the
/// source shard when it was emitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProductionId {
    /// The source shard of the producing stage.
    pub shard: Arc<str>,
    /// The source record's sequence number.
    pub sequence: Arc<str>,
    /// The source record's sub-sequence (its index in a KPL aggregate; 0 for plain records).
    pub sub_sequence: u64,
    /// `{sequence}:{sub_sequence}:{index}`: unique per production.
    pub id: String,
    /// The producing stage's checkpoint of `shard` when the production was emitted (none when
    /// unknown): every record up to it had its productions put.
    pub floor: Option<Arc<str>>,
}

impl ProductionId {
    /// Parses the production fields of a tuple: `production_shard`, `production_id`
    /// (`{sequence}:{sub_sequence}:{index}`), `production_floor` (empty when unknown).
    pub fn parse(shard: Arc<str>, id: &str, floor: Arc<str>) -> Result<Self, String> {
        let mut parts = id.split(':');
        let (Some(seq), Some(sub), Some(idx), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return Err(format!("production id {id:?} is not `sequence:sub_sequence:index`"));
        };
        let (Ok(sub), Ok(_)) = (sub.parse::<u64>(), idx.parse::<u64>()) else {
            return Err(format!("production id {id:?} is not `sequence:sub_sequence:index` (decimal numbers)"));
        };
        if seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("production id {id:?} is not `sequence:sub_sequence:index` (decimal numbers)"));
        }
        if shard.is_empty() {
            return Err(format!("production {id:?} has an empty production_shard"));
        }
        Ok(Self {
            shard,
            sequence: Arc::from(seq),
            sub_sequence: sub,
            id: id.to_string(),
            floor: (!floor.is_empty()).then_some(floor),
        })
    }
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

/// A floor carried by a production, waiting for this stage's checkpoint of the intermediate
/// shard it was read from to pass where it was read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FloorCandidate {
    /// The producing stage's checkpoint of the source shard.
    pub floor: String,
    /// The intermediate shard the production was read from.
    pub shard: String,
    /// Its position there.
    pub sequence: String,
}

/// Deduplication data of the productions of one source shard (of the producing stage), within
/// one key's item.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProductionDedup {
    /// Every production of a source record up to this sequence is applied here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor: Option<String>,
    /// Floors waiting to take effect (at most [`MAX_CANDIDATES`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<FloorCandidate>,
    /// Production ids applied above the floor, with what their application produced.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub applied: BTreeMap<String, Vec<serde_json::Value>>,
}

/// Floor candidates kept per source shard; a newer one replaces the last when full (dropping a
/// candidate only delays pruning).
pub const MAX_CANDIDATES: usize = 4;

/// Deduplication and fencing data of one key, per source shard.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Dedup {
    /// Per source shard id (for productions: per intermediate shard, the token only).
    #[serde(default)]
    pub shards: BTreeMap<String, ShardDedup>,
    /// Productions of another stage, per source shard of that stage.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub productions: BTreeMap<String, ProductionDedup>,
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

/// Whether position `pos` (`sequence[:sub_sequence]`) is at or below `floor` (the same form).
fn position_at_or_below(pos: &str, floor: &str) -> bool {
    let (seq, sub) = position(pos);
    at_or_below(seq, sub, floor)
}

/// The source record's position in a production id `sequence:sub_sequence:index`.
fn production_position(id: &str) -> (&str, u64) {
    let mut parts = id.split(':');
    let seq = parts.next().unwrap_or(id);
    (seq, parts.next().and_then(|s| s.parse().ok()).unwrap_or(0))
}

impl Dedup {
    /// Judges one input against what is stored.
    pub fn judge(&self, id: &RecordId) -> Verdict {
        if let Some(p) = &id.production {
            return self.judge_production(id, p);
        }
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
        match &id.production {
            Some(p) => {
                self.productions.entry(p.shard.to_string()).or_default().applied.insert(p.id.clone(), productions);
            }
            None => {
                s.applied.insert(id.key(), productions);
            }
        }
    }

    /// Raises the shard's token and floor to the input's (never lowers them), pruning the ids the
    /// floor passed. Applies to fresh and duplicate inputs alike.
    pub fn advance(&mut self, id: &RecordId) {
        let s = self.shards.entry(id.shard.to_string()).or_default();
        s.token = s.token.max(id.lease_token);
        if let Some(p) = &id.production {
            self.add_candidate(id, p);
            return;
        }
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

    /// Ids kept above the floors, over every shard (and every source shard of productions).
    pub fn applied_count(&self) -> usize {
        self.shards.values().map(|s| s.applied.len()).sum::<usize>()
            + self.productions.values().map(|p| p.applied.len()).sum::<usize>()
    }

    fn judge_production(&self, id: &RecordId, p: &ProductionId) -> Verdict {
        if let Some(s) = self.shards.get(&*id.shard)
            && s.token > id.lease_token
        {
            return Verdict::Fenced { stored: s.token };
        }
        let Some(d) = self.productions.get(&*p.shard) else { return Verdict::Fresh };
        if d.floor.as_deref().is_some_and(|f| at_or_below(&p.sequence, p.sub_sequence, f)) {
            return Verdict::Duplicate(Vec::new());
        }
        match d.applied.get(&p.id) {
            Some(v) => Verdict::Duplicate(v.clone()),
            None => Verdict::Fresh,
        }
    }

    /// Lets the floor candidates read from the input's intermediate shard at or below this
    /// stage's checkpoint of it (the input's `floor`) take effect, pruning what they pass. Call
    /// before judging an input that is a production.
    pub fn promote(&mut self, id: &RecordId) {
        if id.production.is_none() {
            return;
        }
        let Some(checkpoint) = id.floor.as_deref() else { return };
        for d in self.productions.values_mut() {
            let mut raised: Option<String> = None;
            d.candidates.retain(|c| {
                if c.shard != *id.shard || !position_at_or_below(&c.sequence, checkpoint) {
                    return true;
                }
                if raised.as_deref().is_none_or(|r| !position_at_or_below(&c.floor, r)) {
                    raised = Some(c.floor.clone());
                }
                false
            });
            let Some(floor) = raised else { continue };
            if d.floor.as_deref().is_some_and(|old| position_at_or_below(&floor, old)) {
                continue;
            }
            d.applied.retain(|k, _| {
                let (seq, sub) = production_position(k);
                !at_or_below(seq, sub, &floor)
            });
            d.floor = Some(floor);
            d.candidates.retain(|c| d.floor.as_deref().is_none_or(|f| !position_at_or_below(&c.floor, f)));
        }
    }

    /// Notes the floor a production carries as a candidate, to take effect once this stage's
    /// checkpoint of the intermediate shard passes where it was read.
    fn add_candidate(&mut self, id: &RecordId, p: &ProductionId) {
        let Some(floor) = p.floor.as_deref() else { return };
        let d = self.productions.entry(p.shard.to_string()).or_default();
        if d.floor.as_deref().is_some_and(|f| position_at_or_below(floor, f)) {
            return;
        }
        // a candidate of the same intermediate shard with a higher or equal floor read earlier
        // takes effect no later: nothing to add
        let dominated = d.candidates.iter().any(|c| {
            c.shard == *id.shard
                && position_at_or_below(&c.sequence, &id.sequence)
                && position_at_or_below(floor, &c.floor)
        });
        if dominated {
            return;
        }
        let c =
            FloorCandidate { floor: floor.to_string(), shard: id.shard.to_string(), sequence: id.sequence.to_string() };
        if d.candidates.len() >= MAX_CANDIDATES {
            d.candidates.pop();
        }
        d.candidates.push(c);
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
            production: None,
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

    /// A production of source record `src` (index 0) of source shard `s`, carrying the producing
    /// stage's floor `pfloor`, read at `xseq` of intermediate shard `x` under `token`, with this
    /// stage's checkpoint `xfloor` of `x`.
    fn prod(src: &str, pfloor: Option<&str>, x: &str, xseq: &str, token: u64, xfloor: Option<&str>) -> RecordId {
        RecordId {
            production: Some(
                ProductionId::parse(Arc::from("s"), &format!("{src}:0:0"), Arc::from(pfloor.unwrap_or(""))).unwrap(),
            ),
            ..id(x, xseq, token, xfloor)
        }
    }

    /// What the bolt does with one input: promote, judge, then record (when fresh) and advance.
    fn take(d: &mut Dedup, i: &RecordId) -> Verdict {
        d.promote(i);
        let v = d.judge(i);
        if v == Verdict::Fresh {
            d.record(i, vec![]);
        }
        if !matches!(v, Verdict::Fenced { .. }) {
            d.advance(i);
        }
        v
    }

    #[test]
    fn a_production_is_applied_once_whatever_intermediate_record_carries_it() {
        let mut d = Dedup::default();
        assert_eq!(take(&mut d, &prod("10", None, "x", "100", 1, None)), Verdict::Fresh);
        // the producer replayed its source record and put the production again
        assert!(matches!(take(&mut d, &prod("10", None, "x", "130", 1, None)), Verdict::Duplicate(_)));
        // this stage replays the first copy
        assert!(matches!(take(&mut d, &prod("10", None, "x", "100", 1, None)), Verdict::Duplicate(_)));
        assert_eq!(d.applied_count(), 1);
    }

    #[test]
    fn a_producer_floor_waits_for_this_stages_checkpoint_of_where_it_was_read() {
        let mut d = Dedup::default();
        assert_eq!(take(&mut d, &prod("10", None, "x", "100", 1, None)), Verdict::Fresh);
        // a later production says the producer's records up to 15 had their productions put
        assert_eq!(take(&mut d, &prod("20", Some("15"), "x", "200", 1, Some("90"))), Verdict::Fresh);
        assert_eq!(d.productions["s"].floor, None, "not in effect before this stage's checkpoint passes 200");
        // the production of source record 12 failed here and comes back (its copy at x=150):
        // with the producer's floor in effect it would be skipped and lost
        assert_eq!(take(&mut d, &prod("12", Some("15"), "x", "150", 1, Some("140"))), Verdict::Fresh);
        // this stage's checkpoint of x passes 200: the floor takes effect and prunes 10 and 12
        assert!(matches!(take(&mut d, &prod("20", Some("15"), "x", "200", 1, Some("200"))), Verdict::Duplicate(_)));
        assert_eq!(d.productions["s"].floor.as_deref(), Some("15"));
        assert_eq!(d.applied_count(), 1, "10 and 12 pruned, 20 kept");
        // a late copy of 12 (a zombie producer's put) is below the floor
        assert_eq!(take(&mut d, &prod("12", Some("11"), "x", "300", 1, Some("200"))), Verdict::Duplicate(vec![]));
        // a checkpoint of another intermediate shard promotes nothing of x
        assert_eq!(take(&mut d, &prod("30", Some("25"), "x", "400", 1, Some("200"))), Verdict::Fresh);
        take(&mut d, &prod("31", Some("25"), "y", "9000", 1, Some("9999")));
        assert_eq!(d.productions["s"].floor.as_deref(), Some("15"));
    }

    #[test]
    fn productions_are_fenced_by_the_intermediate_shards_token() {
        let mut d = Dedup::default();
        assert_eq!(take(&mut d, &prod("10", None, "x", "100", 5, None)), Verdict::Fresh);
        assert_eq!(take(&mut d, &prod("11", None, "x", "110", 4, None)), Verdict::Fenced { stored: 5 });
        assert_eq!(take(&mut d, &prod("11", None, "y", "110", 1, None)), Verdict::Fresh, "per intermediate shard");
    }

    #[test]
    fn floor_candidates_are_bounded() {
        let mut d = Dedup::default();
        for i in 0..20u64 {
            let (src, f, xs) = ((100 + i).to_string(), (50 + i).to_string(), (1000 + i).to_string());
            take(&mut d, &prod(&src, Some(&f), "x", &xs, 1, None));
        }
        assert!(d.productions["s"].candidates.len() <= MAX_CANDIDATES);
        // the oldest candidate is kept (it takes effect first), the newest replaced the last
        let c = &d.productions["s"].candidates;
        assert_eq!((c[0].floor.as_str(), c[c.len() - 1].floor.as_str()), ("50", "69"));
        take(&mut d, &prod("200", None, "x", "2000", 1, Some("1019")));
        assert_eq!(d.productions["s"].floor.as_deref(), Some("69"));
        assert!(d.productions["s"].candidates.is_empty());
    }

    #[test]
    fn production_ids_are_checked() {
        let p = |id: &str| ProductionId::parse(Arc::from("s"), id, Arc::from(""));
        assert!(p("49590:0:3").is_ok());
        for bad in ["", "49590", "49590:0", "a:0:1", "1:x:1", "1:0:1:2"] {
            assert!(p(bad).unwrap_err().contains("production id"), "{bad}");
        }
        assert!(ProductionId::parse(Arc::from(""), "1:0:0", Arc::from("")).is_err());
    }

    #[test]
    fn round_trips_through_json() {
        let mut d = Dedup::default();
        d.record(&id("shardId-000000000001", "4960", 3, None), vec![serde_json::json!({"w": 1})]);
        d.advance(&id("shardId-000000000001", "4961", 3, Some("4959")));
        take(&mut d, &prod("77", Some("70"), "x", "5", 2, None));
        assert!(!d.productions.is_empty());
        let back: Dedup = serde_json::from_slice(&serde_json::to_vec(&d).unwrap()).unwrap();
        assert_eq!(back, d);
    }
}
