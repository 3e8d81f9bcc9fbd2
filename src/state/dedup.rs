//! Exact deduplication and fencing data kept with each key's state (pure logic, no I/O).
//!
//! # Identity
//! A record is identified by its *qualified* shard, `{stream}/{shard}` (every stream has a
//! `shardId-000000000000`: a key counted from two streams must never mix their floors, applied
//! ids or lease tokens), its sequence number and its sub-sequence (its index in a KPL aggregate).
//!
//! # Per shard
//! Per qualified shard the item keeps:
//! - `floor`: a position up to which every record of the shard is handled (the spout's
//!   checkpoint as carried by the latest tuple: `sequence`, or `sequence:sub_sequence` inside a
//!   KPL aggregate); no correct owner reads those records again, so anything at or below it,
//!   compared as (sequence, sub-sequence), is a duplicate;
//! - `applied`: the exact ids (sequence and sub-sequence) of the records applied to this key above
//!   the floor, each with the productions it made (re-sent if the record is seen again, because
//!   its tuple tree may not have completed); pruned as the floor moves past them;
//! - `token`: the highest lease sequencer token that wrote for the shard; a record read under a
//!   lower token comes from an earlier (zombie) owner and is refused;
//! - `range`: the shard's hash key range, when the tuples carry it (`shard_range`).
//!
//! # Finished shards, and what keeps the item bounded across reshards
//! A child shard is read only once every parent finished (every record read and handled), so a
//! shard is finished as soon as any shard that descends from it has been read. Descent is read
//! from hash key ranges and shard ids: two shards of one stream whose ranges overlap are one the
//! other's ancestor (at any moment the open shards split the key space between them; a shard
//! created later over part of an older one's range descends from it), and the later one has the
//! higher shard index (Kinesis numbers shards in creation order). So when a record of shard X
//! arrives, every entry of an overlapping shard with a lower index is an ancestor of X, finished:
//! it is dropped (its candidates take effect, below). And a record of X while an entry of an
//! overlapping shard with a *higher* index exists is a record of a finished shard: every record of
//! it was handled before the descendant was read, and only a zombie reads it now; it is refused
//! ([`Verdict::Finished`]), as a lower lease token is. The entries left never overlap
//! each other: at most one per open shard this key reads from, whatever the number of reshards.
//! Tuples without a range (`shard_range`) keep their entries (correct, not pruned).
//!
//! # Productions of another stage
//! Inputs that are another stage's strong productions (read from a stage boundary's intermediate
//! stream, [`ProductionId`]) are deduplicated by production id instead, per *source* shard of the
//! stage that made them (`productions`); the intermediate shard they were read from is only fenced
//! (`shards`, token, and finished as above). A production id is the identity the production was
//! *first* emitted with: a stage that applies a production and later sees a copy of it re-sends
//! what it made under the ids it first made it with ([`Origin`]), so the next stage recognizes
//! every copy, however many exactly-once stages are chained.
//!
//! Production floors need more care, because the producing stage's checkpoint (carried by every
//! production) says that every production of the records below it was *put*, not that this stage
//! applied it:
//! - A floor carried by a production read at position `q` of intermediate shard `X` waits as a
//!   candidate, and takes effect once this stage's own checkpoint of `X` passed `q` (or `X`
//!   finished): a production failed here and replayed is not skipped.
//! - It then holds only for productions whose hash key (the intermediate record's, carried as
//!   `hash_key`) lies in `X`'s hash key range: every production below the floor with such a key
//!   was put before the one that carried the floor into `X` or one of its ancestors (one key, one
//!   shard; a child is read only after its parents finished), so it was read here before. A key of
//!   this stage coarser than the boundary's key (a per-region or a global total) reads from many
//!   intermediate shards at once, and a floor of one says nothing of another, lagging one. So
//!   floors are kept per hash range ([`RangeFloor`]), and an applied id is pruned only by a floor
//!   whose range holds its hash key. When `X`'s range is unknown (the tuple carries none), the
//!   floor holds for the carrying production's own hash key only, never for the whole key space:
//!   that would skip the productions of a lagging other shard, and of a replay there.
//! - A source shard whose descendant's production took effect in range R has had every
//!   production in R handled here (they were all put before the descendant was read): it is done
//!   in R (floor [`DONE`]). An entry left with nothing but such floors is dropped once its
//!   descendants are done in each of its ranges too: they stand for it. So one key keeps a
//!   bounded number of entries however often the producing stage's source stream is resharded.
//!
//! "Highest sequence applied" alone would be wrong: a record failed downstream is replayed after
//! later records of its key, and would be skipped and lost. The floor only moves when the spout's
//! checkpoint moves, which is when every record below it was acked, that is, committed here.
//!
//! # Data written before stream-qualified ids
//! Entries keyed by a bare shard id (written before ids were qualified by stream) are taken by the
//! first input of that shard id, whatever its stream (exact for a topology that reads one stream,
//! the only kind whose state was exact then). A production floor written for the whole source
//! shard becomes a floor over the whole key space.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::coord::sequence_cmp;

/// A hash key range of a shard, both ends included. Written as `start-end` (decimal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyRange {
    /// Lowest hash key.
    pub start: u128,
    /// Highest hash key.
    pub end: u128,
}

impl KeyRange {
    /// The whole key space.
    pub const ALL: KeyRange = KeyRange { start: 0, end: u128::MAX };

    /// Parses `start-end` (decimal; what the spout's `shard_range` field carries).
    pub fn parse(text: &str) -> Option<Self> {
        let (a, b) = text.split_once('-')?;
        let (start, end) = (a.parse().ok()?, b.parse().ok()?);
        (start <= end).then_some(Self { start, end })
    }

    /// `start-end`, as [`KeyRange::parse`] reads it.
    pub fn text(&self) -> String {
        format!("{}-{}", self.start, self.end)
    }

    /// Whether `hash` is in the range.
    pub fn contains(&self, hash: u128) -> bool {
        (self.start..=self.end).contains(&hash)
    }

    /// Whether the two ranges share a hash key.
    pub fn overlaps(&self, other: &KeyRange) -> bool {
        self.start <= other.end && other.start <= self.end
    }
}

impl Serialize for KeyRange {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text())
    }
}

impl<'de> Deserialize<'de> for KeyRange {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        KeyRange::parse(&text)
            .ok_or_else(|| serde::de::Error::custom(format!("not a hash key range `start-end`: {text:?}")))
    }
}

/// `{stream}/{shard}`: the identity of a shard across the streams a topology reads.
pub fn qualified_shard(stream: &str, shard: &str) -> Arc<str> {
    if stream.is_empty() {
        return Arc::from(shard);
    }
    Arc::from(format!("{stream}/{shard}"))
}

/// The stream part of a qualified shard (`""` for a bare shard id).
fn stream_of(qualified: &str) -> &str {
    qualified.rsplit_once('/').map_or("", |(s, _)| s)
}

/// The shard id part of a qualified shard.
fn bare(qualified: &str) -> &str {
    qualified.rsplit_once('/').map_or(qualified, |(_, s)| s)
}

/// The creation index of a shard (`shardId-000000000012` -> 12): Kinesis numbers a stream's
/// shards in the order it creates them, so a descendant has a higher index than its ancestors.
fn shard_index(qualified: &str) -> Option<u64> {
    let id = bare(qualified);
    let digits = id.strip_prefix("shardId-").unwrap_or(id);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Whether shard `later` (range `later_range`) descends from shard `earlier` (range
/// `earlier_range`): same stream, overlapping ranges, higher index. `false` when a range or an
/// index is unknown.
fn descends(later: &str, later_range: Option<KeyRange>, earlier: &str, earlier_range: Option<KeyRange>) -> bool {
    let (Some(lr), Some(er)) = (later_range, earlier_range) else { return false };
    if later == earlier || stream_of(later) != stream_of(earlier) || !lr.overlaps(&er) {
        return false;
    }
    matches!((shard_index(later), shard_index(earlier)), (Some(l), Some(e)) if l > e)
}

/// The identity of an input record and the ownership it was read under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordId {
    /// Source shard, qualified by its stream (`{stream}/{shard}`, see [`qualified_shard`]).
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
    /// The shard's hash key range, when the tuple carries it.
    pub range: Option<KeyRange>,
    /// The record's hash key, when known (records of an intermediate stream: the hash of the
    /// boundary key they were put with).
    pub hash: Option<u128>,
    /// When the record is another stage's production (read from an intermediate stream), its
    /// production id: then the fields above identify the intermediate record, which is fenced
    /// by its lease token, and duplicates are found by this id.
    pub production: Option<ProductionId>,
}

/// The id of a strong production made by an exactly-once stage: the source record that made it
/// and its index among that record's productions, plus the producing stage's checkpoint of the
/// source shard when it was first emitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProductionId {
    /// The source shard of the producing stage, qualified by its stream.
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
    /// The source shard's hash key range, when known.
    pub range: Option<KeyRange>,
}

impl ProductionId {
    /// Parses the production fields of a tuple: `production_shard`, `production_id`
    /// (`{sequence}:{sub_sequence}:{index}`), `production_floor` (empty when unknown) and
    /// `production_range` (`start-end`, empty when unknown).
    pub fn parse(shard: Arc<str>, id: &str, floor: Arc<str>, range: &str) -> Result<Self, String> {
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
        let range = match range {
            "" => None,
            r => Some(
                KeyRange::parse(r)
                    .ok_or_else(|| format!("production {id:?} has a production_range {r:?} that is not `start-end`"))?,
            ),
        };
        Ok(Self {
            shard,
            sequence: Arc::from(seq),
            sub_sequence: sub,
            id: id.to_string(),
            floor: (!floor.is_empty()).then_some(floor),
            range,
        })
    }
}

impl RecordId {
    /// The exact id stored in `applied`: `sequence:sub_sequence`.
    pub fn key(&self) -> String {
        format!("{}:{}", self.sequence, self.sub_sequence)
    }

    /// The identity productions made from this input are emitted under, the first time.
    pub fn origin(&self) -> Origin {
        Origin {
            shard: self.shard.to_string(),
            position: self.key(),
            floor: self.floor.as_deref().unwrap_or_default().to_string(),
            range: self.range,
        }
    }
}

/// The identity productions of an input were first emitted under: its shard (qualified), its
/// `sequence:sub_sequence`, the checkpoint it carried and the shard's range. A production's id
/// is `{position}:{index}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    /// Qualified shard.
    #[serde(rename = "s")]
    pub shard: String,
    /// `sequence:sub_sequence`.
    #[serde(rename = "q")]
    pub position: String,
    /// The checkpoint carried (empty when unknown).
    #[serde(rename = "f", default, skip_serializing_if = "String::is_empty")]
    pub floor: String,
    /// The shard's hash key range, when known.
    #[serde(rename = "r", default, skip_serializing_if = "Option::is_none")]
    pub range: Option<KeyRange>,
}

/// What one applied input made, kept until a floor passes it: its productions (serialized
/// `Out` values, re-sent when the input is seen again), the identity they were first emitted
/// under (for inputs that are productions themselves: a copy arrives under another intermediate
/// record), and the input's hash key (for productions: which range floors may prune it).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Applied {
    /// The productions.
    pub out: Vec<serde_json::Value>,
    /// Where they were first emitted from (none: from the input's own id).
    pub origin: Option<Origin>,
    /// The input's hash key, when known.
    pub hash: Option<u128>,
}

impl Applied {
    fn new(out: Vec<serde_json::Value>) -> Self {
        Self { out, origin: None, hash: None }
    }
}

/// The stored form: a bare array of productions (what items written before origins hold, and
/// still the form of an input that is not a production), or `{p, o, h}` (productions when any,
/// their origin then, and the hash key in hex).
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum AppliedForm {
    Bare(Vec<serde_json::Value>),
    Full {
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        p: Vec<serde_json::Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        o: Option<Origin>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        h: Option<String>,
    },
}

impl Serialize for Applied {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.origin.is_none() && self.hash.is_none() {
            return self.out.serialize(s);
        }
        AppliedForm::Full { p: self.out.clone(), o: self.origin.clone(), h: self.hash.map(|h| format!("{h:x}")) }
            .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Applied {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match AppliedForm::deserialize(d)? {
            AppliedForm::Bare(out) => Applied::new(out),
            AppliedForm::Full { p, o, h } => {
                let hash = match h {
                    None => None,
                    Some(h) => Some(
                        u128::from_str_radix(&h, 16)
                            .map_err(|_| serde::de::Error::custom(format!("bad hash key {h:?}")))?,
                    ),
                };
                Applied { out: p, origin: o, hash }
            }
        })
    }
}

/// What the item says of one input.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Not applied yet: apply it.
    Fresh,
    /// Already applied (or handled): skip it, and re-send these productions (none once pruned).
    Duplicate(Option<Applied>),
    /// Read under a lease older than the one that last wrote for its shard: refuse it.
    Fenced {
        /// The token stored for the shard.
        stored: u64,
    },
    /// A record of a shard that finished (a descendant of it was read since): only a zombie
    /// reads it now; refuse it.
    Finished {
        /// The descendant whose entry shows it.
        descendant: String,
    },
}

impl Verdict {
    /// A duplicate with nothing to re-send.
    pub fn handled() -> Self {
        Verdict::Duplicate(None)
    }
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
    pub applied: BTreeMap<String, Applied>,
    /// The shard's hash key range, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<KeyRange>,
}

/// A floor carried by a production, waiting for this stage's checkpoint of the intermediate
/// shard it was read from to pass where it was read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FloorCandidate {
    /// The producing stage's checkpoint of the source shard (empty when the production carried
    /// none: it still tells that the source shard's ancestors are done in the range).
    pub floor: String,
    /// The intermediate shard the production was read from (qualified).
    pub shard: String,
    /// Its position there.
    pub sequence: String,
    /// The hash key range the floor holds for once in effect: the intermediate shard's, or only
    /// the carrying production's hash key when the shard's range was unknown (none: written
    /// before ranges were known, the whole space).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<KeyRange>,
}

/// A production floor in effect for the productions whose hash key lies in `range`. The floor
/// [`DONE`] covers every production.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RangeFloor {
    /// The intermediate hash key range it holds for.
    #[serde(rename = "r")]
    pub range: KeyRange,
    /// Every production of a source record up to this position is handled here.
    #[serde(rename = "f")]
    pub floor: String,
}

/// A floor that covers every production (the source shard is done in the range).
pub const DONE: &str = "*";

/// Deduplication data of the productions of one source shard (of the producing stage), within
/// one key's item.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProductionDedup {
    /// A floor over the whole key space, as written before floors were kept per range; read
    /// into `floors`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor: Option<String>,
    /// Floors in effect, per intermediate hash key range; no two with the same range.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub floors: Vec<RangeFloor>,
    /// Floors waiting to take effect (at most [`MAX_CANDIDATES`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<FloorCandidate>,
    /// Production ids applied and not yet passed by a floor, with what their application made.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub applied: BTreeMap<String, Applied>,
    /// The source shard's hash key range, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<KeyRange>,
}

/// Floor candidates kept per source shard; a newer one replaces the last when full (dropping a
/// candidate only delays pruning).
pub const MAX_CANDIDATES: usize = 4;

/// Deduplication and fencing data of one key, per source shard.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Dedup {
    /// Per qualified shard id (for productions: per intermediate shard, the token only).
    #[serde(default)]
    pub shards: BTreeMap<String, ShardDedup>,
    /// Productions of another stage, per qualified source shard of that stage.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub productions: BTreeMap<String, ProductionDedup>,
}

/// Splits `sequence[:sub_sequence]` (a floor, or an id of `applied`) into its two parts; a
/// missing or unreadable sub-sequence is 0.
fn position(text: &str) -> (&str, u64) {
    match text.split_once(':') {
        Some((seq, sub)) => (seq, sub.split(':').next().and_then(|s| s.parse().ok()).unwrap_or(0)),
        None => (text, 0),
    }
}

/// Whether `(sequence, sub_sequence)` is at or below `floor` (`sequence[:sub_sequence]`, or
/// [`DONE`]): numerically by sequence, then by sub-sequence. A user record of a KPL aggregate
/// whose earlier user records are below the floor is not itself below it.
fn at_or_below(sequence: &str, sub_sequence: u64, floor: &str) -> bool {
    if floor == DONE {
        return true;
    }
    let (fseq, fsub) = position(floor);
    sequence_cmp(sequence, fseq).then(sub_sequence.cmp(&fsub)) != Ordering::Greater
}

/// Whether position `pos` (`sequence[:sub_sequence]`, or [`DONE`]) is at or below `floor` (the
/// same forms).
fn position_at_or_below(pos: &str, floor: &str) -> bool {
    if floor == DONE {
        return true;
    }
    if pos == DONE {
        return false;
    }
    let (seq, sub) = position(pos);
    at_or_below(seq, sub, floor)
}

/// The source record's position in a production id `sequence:sub_sequence:index`.
fn production_position(id: &str) -> (&str, u64) {
    let mut parts = id.split(':');
    let seq = parts.next().unwrap_or(id);
    (seq, parts.next().and_then(|s| s.parse().ok()).unwrap_or(0))
}

/// The key of `map` that stands for qualified shard `key`: itself, or an entry written under
/// its bare shard id before ids were qualified (moved to `key`), or, for a bare `key` (a
/// production of a producer that did not qualify), the one qualified entry of that shard id.
fn resolve<T>(map: &mut BTreeMap<String, T>, key: &str) -> String {
    if map.contains_key(key) {
        return key.to_string();
    }
    match key.rsplit_once('/') {
        Some((_, shard)) => {
            if let Some(v) = map.remove(shard) {
                tracing::debug!(shard = %key, "deduplication data written under the bare shard id {shard} taken for {key}");
                map.insert(key.to_string(), v);
            }
            key.to_string()
        }
        None => {
            let suffix = format!("/{key}");
            let mut found = map.keys().filter(|k| k.ends_with(&suffix));
            match (found.next(), found.next()) {
                (Some(k), None) => k.clone(),
                _ => key.to_string(),
            }
        }
    }
}

/// [`resolve`] without moving anything (for judging).
fn lookup<'a, T>(map: &'a BTreeMap<String, T>, key: &str) -> Option<&'a T> {
    if let Some(v) = map.get(key) {
        return Some(v);
    }
    match key.rsplit_once('/') {
        Some((_, shard)) => map.get(shard),
        None => {
            let suffix = format!("/{key}");
            let mut found = map.iter().filter(|(k, _)| k.ends_with(&suffix));
            match (found.next(), found.next()) {
                (Some((_, v)), None) => Some(v),
                _ => None,
            }
        }
    }
}

impl Dedup {
    /// Takes entries written under bare shard ids (before ids were qualified by stream) for the
    /// input's qualified shards, and names a bare shard id of the input (a tuple without its
    /// stream) by the one qualified entry of that id. Call before judging an input.
    pub fn adopt(&mut self, id: &mut RecordId) {
        let key = resolve(&mut self.shards, &id.shard);
        if *key != *id.shard {
            id.shard = Arc::from(key);
        }
        if let Some(p) = &mut id.production {
            let key = resolve(&mut self.productions, &p.shard);
            if *key != *p.shard {
                p.shard = Arc::from(key);
            }
        }
    }

    /// The entry of a shard that descends from the record's shard, if any: then the record's
    /// shard is finished (the descendant was read, so every ancestor was read and handled).
    fn finished_by(&self, id: &RecordId) -> Option<&str> {
        id.range?;
        self.shards.iter().find(|(k, s)| descends(k, s.range, &id.shard, id.range)).map(|(k, _)| k.as_str())
    }

    /// Judges one input against what is stored.
    pub fn judge(&self, id: &RecordId) -> Verdict {
        if let Some(s) = lookup(&self.shards, &id.shard)
            && s.token > id.lease_token
        {
            return Verdict::Fenced { stored: s.token };
        }
        if let Some(d) = self.finished_by(id) {
            return Verdict::Finished { descendant: d.to_string() };
        }
        if let Some(p) = &id.production {
            return self.judge_production(id, p);
        }
        let Some(s) = lookup(&self.shards, &id.shard) else { return Verdict::Fresh };
        if s.floor.as_deref().is_some_and(|f| at_or_below(&id.sequence, id.sub_sequence, f)) {
            return Verdict::handled();
        }
        match s.applied.get(&id.key()) {
            Some(p) => Verdict::Duplicate(Some(p.clone())),
            None => Verdict::Fresh,
        }
    }

    /// Records an input as applied, with its productions (serialized `Out` values), and raises
    /// the shard's token.
    pub fn record(&mut self, id: &RecordId, productions: Vec<serde_json::Value>) {
        let s = self.shards.entry(id.shard.to_string()).or_default();
        s.token = s.token.max(id.lease_token);
        match &id.production {
            Some(p) => {
                // the identity its productions are re-sent under (none to re-send: none kept), the
                // checkpoint left out (a re-sent copy carries none: it only delays pruning), so an
                // entry stays small where a key holds many (a global total)
                let origin = (!productions.is_empty()).then(|| Origin { floor: String::new(), ..id.origin() });
                let applied = Applied { out: productions, origin, hash: id.hash };
                let d = self.productions.entry(p.shard.to_string()).or_default();
                if d.range.is_none() {
                    d.range = p.range;
                }
                d.applied.insert(p.id.clone(), applied);
            }
            None => {
                s.applied.insert(id.key(), Applied::new(productions));
            }
        }
    }

    /// Raises the shard's token and floor to the input's (never lowers them), pruning the ids the
    /// floor passed, and drops the entries of the shard's ancestors (finished). Applies to fresh
    /// and duplicate inputs alike.
    pub fn advance(&mut self, id: &RecordId) {
        if self.finished_by(id).is_some() {
            return;
        }
        let s = self.shards.entry(id.shard.to_string()).or_default();
        s.token = s.token.max(id.lease_token);
        if id.range.is_some() {
            s.range = id.range;
        }
        self.retire_ancestors(id);
        if let Some(p) = &id.production {
            self.add_candidate(id, p);
            return;
        }
        let s = self.shards.entry(id.shard.to_string()).or_default();
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

    /// Drops the entries of the shards the input's shard descends from: they finished before it
    /// was read. Their waiting production floors take effect (every record of theirs is read).
    fn retire_ancestors(&mut self, id: &RecordId) {
        if id.range.is_none() {
            return;
        }
        let retired: Vec<String> = self
            .shards
            .iter()
            .filter(|(k, s)| descends(&id.shard, id.range, k, s.range))
            .map(|(k, _)| k.clone())
            .collect();
        for k in retired {
            self.shards.remove(&k);
            self.promote_from(&k, None);
        }
    }

    /// Ids kept above the floors, over every shard (and every source shard of productions).
    pub fn applied_count(&self) -> usize {
        self.shards.values().map(|s| s.applied.len()).sum::<usize>()
            + self.productions.values().map(|p| p.applied.len()).sum::<usize>()
    }

    fn judge_production(&self, id: &RecordId, p: &ProductionId) -> Verdict {
        // A descendant of the source shard done where the production's hash key lies: so is the
        // source shard. Asked whether or not the source shard has an entry: a dropped entry (its
        // descendants stand for it) comes back empty with the floor-less candidate of a late copy,
        // and the copies after that one must still be found handled.
        let done_by_descendant = || {
            self.productions.iter().any(|(k, d)| {
                descends(k, d.range, &p.shard, p.range)
                    && d.floors.iter().any(|f| {
                        f.floor == DONE
                            && f.range.contains(id.hash.unwrap_or(0))
                            && (id.hash.is_some() || f.range == KeyRange::ALL)
                    })
            })
        };
        let Some(d) = lookup(&self.productions, &p.shard) else {
            return if done_by_descendant() { Verdict::handled() } else { Verdict::Fresh };
        };
        if let Some(v) = d.applied.get(&p.id) {
            return Verdict::Duplicate(Some(v.clone()));
        }
        let legacy = d.floor.as_deref().is_some_and(|f| at_or_below(&p.sequence, p.sub_sequence, f));
        let covered = d
            .floors
            .iter()
            .any(|f| id.hash.is_none_or(|h| f.range.contains(h)) && at_or_below(&p.sequence, p.sub_sequence, &f.floor));
        if legacy || covered || done_by_descendant() { Verdict::handled() } else { Verdict::Fresh }
    }

    /// Lets the floor candidates read from the input's intermediate shard at or below this
    /// stage's checkpoint of it (the input's `floor`) take effect, pruning what they pass. Call
    /// before judging an input that is a production.
    pub fn promote(&mut self, id: &RecordId) {
        if id.production.is_none() {
            return;
        }
        if let Some(checkpoint) = id.floor.as_deref() {
            self.promote_from(&id.shard, Some(checkpoint));
        }
    }

    /// Lets the candidates read from intermediate shard `shard` at or below `checkpoint` (every
    /// one when `None`: the shard finished) take effect.
    fn promote_from(&mut self, shard: &str, checkpoint: Option<&str>) {
        let mut raised: Vec<(String, KeyRange, String)> = Vec::new();
        for (source, d) in self.productions.iter_mut() {
            d.candidates.retain(|c| {
                let due = c.shard == shard && checkpoint.is_none_or(|cp| position_at_or_below(&c.sequence, cp));
                if due {
                    raised.push((source.clone(), c.range.unwrap_or(KeyRange::ALL), c.floor.clone()));
                }
                !due
            });
        }
        for (source, range, floor) in raised {
            self.take_effect(&source, range, &floor);
        }
    }

    /// A floor of source shard `source` takes effect in `range`; every ancestor of `source` is
    /// done in `range` (all its productions were put before any of `source`'s).
    fn take_effect(&mut self, source: &str, range: KeyRange, floor: &str) {
        let source_range = self.productions.get(source).and_then(|d| d.range);
        let ancestors: Vec<String> = self
            .productions
            .iter()
            .filter(|(k, d)| descends(source, source_range, k, d.range))
            .map(|(k, _)| k.clone())
            .collect();
        if !floor.is_empty()
            && let Some(d) = self.productions.get_mut(source)
        {
            d.raise(range, floor);
        }
        for a in ancestors {
            if let Some(d) = self.productions.get_mut(&a) {
                d.raise(range, DONE);
            }
        }
        self.drop_stood_for();
    }

    /// Drops the entries of source shards that hold nothing but [`DONE`] floors, each range of
    /// which their descendants are done in too: those stand for them (a production of the
    /// source shard is then found handled through them, see `judge_production`).
    fn drop_stood_for(&mut self) {
        let stood_for: Vec<String> = self
            .productions
            .iter()
            .filter(|(k, d)| {
                if !d.is_tombstone() {
                    return false;
                }
                let by: Vec<KeyRange> = self
                    .productions
                    .iter()
                    .filter(|(l, e)| descends(l, e.range, k, d.range))
                    .flat_map(|(_, e)| e.floors.iter().filter(|f| f.floor == DONE).map(|f| f.range))
                    .collect();
                d.floors.iter().all(|f| covered(f.range, by.clone()))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in stood_for {
            self.productions.remove(&k);
        }
    }

    /// Notes the floor a production carries as a candidate, to take effect once this stage's
    /// checkpoint of the intermediate shard passes where it was read.
    fn add_candidate(&mut self, id: &RecordId, p: &ProductionId) {
        let floor = p.floor.as_deref().unwrap_or_default();
        let d = self.productions.entry(p.shard.to_string()).or_default();
        if d.range.is_none() {
            d.range = p.range;
        }
        let range = candidate_range(id);
        if !floor.is_empty() && d.floors.iter().any(|f| f.range == range && position_at_or_below(floor, &f.floor)) {
            return;
        }
        if floor.is_empty() && d.range.is_none() {
            // a floor-less candidate only tells of the source's ancestors, which it cannot name
            return;
        }
        // a candidate of the same intermediate shard, for a range holding this one's, with a
        // higher or equal floor read earlier takes effect no later: nothing to add
        let dominated = d.candidates.iter().any(|c| {
            c.shard == *id.shard
                && covered(range, vec![c.range.unwrap_or(KeyRange::ALL)])
                && position_at_or_below(&c.sequence, &id.sequence)
                && (floor.is_empty() || (!c.floor.is_empty() && position_at_or_below(floor, &c.floor)))
        });
        if dominated {
            return;
        }
        let c = FloorCandidate {
            floor: floor.to_string(),
            shard: id.shard.to_string(),
            sequence: id.sequence.to_string(),
            range: Some(range),
        };
        if d.candidates.len() >= MAX_CANDIDATES {
            d.candidates.pop();
        }
        d.candidates.push(c);
    }
}

/// The hash key range a floor carried by production input `id` holds for: the range of the
/// intermediate shard it was read from; when that is unknown (its reader could not learn it), only
/// the input's own hash key, since every production of one hash key goes through one shard and
/// its ancestors, while a key of this stage coarser than the boundary's also reads other shards,
/// which may lag; with neither known (inputs of a producer that carried no hash key), the whole
/// key space, as floors were before they were scoped.
fn candidate_range(id: &RecordId) -> KeyRange {
    match (id.range, id.hash) {
        (Some(range), _) => range,
        (None, Some(hash)) => KeyRange { start: hash, end: hash },
        (None, None) => KeyRange::ALL,
    }
}

impl ProductionDedup {
    /// Nothing left but [`DONE`] floors: every production of the source shard in their ranges is
    /// handled here, none is waiting.
    fn is_tombstone(&self) -> bool {
        self.applied.is_empty()
            && self.candidates.is_empty()
            && self.floor.is_none()
            && !self.floors.is_empty()
            && self.floors.iter().all(|f| f.floor == DONE)
    }

    /// Puts `floor` in effect in `range` (never lowering a floor), prunes the applied ids it
    /// passes and merges floors that another covers.
    fn raise(&mut self, range: KeyRange, floor: &str) {
        if let Some(legacy) = self.floor.take() {
            self.floors.push(RangeFloor { range: KeyRange::ALL, floor: legacy });
        }
        match self.floors.iter_mut().find(|f| f.range == range) {
            Some(f) if position_at_or_below(floor, &f.floor) => {}
            Some(f) => f.floor = floor.to_string(),
            None => self.floors.push(RangeFloor { range, floor: floor.to_string() }),
        }
        let floors = &self.floors;
        self.applied.retain(|k, a| {
            let (seq, sub) = production_position(k);
            !floors.iter().any(|f| a.hash.is_none_or(|h| f.range.contains(h)) && at_or_below(seq, sub, &f.floor))
        });
        // a floor whose range the ranges of higher-or-equal floors cover adds nothing
        let mut i = 0;
        while i < self.floors.len() {
            let f = self.floors[i].clone();
            let others: Vec<KeyRange> = self
                .floors
                .iter()
                .enumerate()
                .filter(|(j, g)| *j != i && position_at_or_below(&f.floor, &g.floor))
                .map(|(_, g)| g.range)
                .collect();
            if covered(f.range, others) {
                self.floors.remove(i);
            } else {
                i += 1;
            }
        }
        self.candidates.retain(|c| {
            c.floor.is_empty()
                || !self
                    .floors
                    .iter()
                    .any(|f| f.range == c.range.unwrap_or(KeyRange::ALL) && position_at_or_below(&c.floor, &f.floor))
        });
    }
}

/// Whether the union of `ranges` covers `target`.
fn covered(target: KeyRange, mut ranges: Vec<KeyRange>) -> bool {
    ranges.sort_by_key(|r| r.start);
    let mut next = target.start;
    for r in ranges {
        if r.start > next {
            break;
        }
        if r.end >= target.end {
            return true;
        }
        if r.end >= next {
            next = r.end + 1;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: &str = "s1";

    fn q(shard: &str) -> Arc<str> {
        qualified_shard(S, shard)
    }

    fn id(shard: &str, seq: &str, token: u64, floor: Option<&str>) -> RecordId {
        RecordId {
            shard: q(shard),
            sequence: Arc::from(seq),
            sub_sequence: 0,
            lease_token: token,
            floor: floor.map(Arc::from),
            range: None,
            hash: None,
            production: None,
        }
    }

    /// What the bolt does with one input: adopt, promote, judge, then record (when fresh) and
    /// advance (unless fenced).
    fn take(d: &mut Dedup, i: &RecordId) -> Verdict {
        let mut i = i.clone();
        d.adopt(&mut i);
        d.promote(&i);
        let v = d.judge(&i);
        if v == Verdict::Fresh {
            d.record(&i, vec![]);
        }
        if !matches!(v, Verdict::Fenced { .. }) {
            d.advance(&i);
        }
        v
    }

    fn dup(v: &Verdict) -> bool {
        matches!(v, Verdict::Duplicate(_))
    }

    #[test]
    fn a_replay_after_later_records_is_still_applied_once() {
        let mut d = Dedup::default();
        // 10 and 12 applied; 11 failed downstream and comes back after them
        for s in ["10", "12"] {
            assert_eq!(take(&mut d, &id("a", s, 1, None)), Verdict::Fresh);
        }
        assert_eq!(d.judge(&id("a", "11", 1, None)), Verdict::Fresh, "a high-water mark would skip it");
        take(&mut d, &id("a", "11", 1, None));
        assert!(dup(&d.judge(&id("a", "11", 1, None))));
        assert!(dup(&d.judge(&id("a", "12", 1, None))));
    }

    #[test]
    fn the_floor_prunes_and_still_recognizes() {
        let mut d = Dedup::default();
        for s in ["5", "9", "100"] {
            d.record(&id("a", s, 1, None), vec![serde_json::json!(s)]);
        }
        d.advance(&id("a", "101", 1, Some("9")));
        assert_eq!(d.applied_count(), 1, "5 and 9 pruned, 100 kept");
        assert_eq!(d.judge(&id("a", "5", 1, None)), Verdict::handled());
        assert_eq!(
            d.judge(&id("a", "100", 1, None)),
            Verdict::Duplicate(Some(Applied::new(vec![serde_json::json!("100")])))
        );
        // a stale floor never lowers it
        d.advance(&id("a", "102", 1, Some("7")));
        assert_eq!(d.shards[&*q("a")].floor.as_deref(), Some("9"));
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
        assert_eq!(d.judge(&sub("a", "200", 1, None)), Verdict::handled());
        assert!(dup(&d.judge(&sub("a", "200", 2, None))));
        assert_eq!(d.judge(&sub("a", "200", 4, None)), Verdict::Fresh, "above the floor, never applied");
        // A floor of sub-sequence 0 ("200") does not cover the aggregate's later user records.
        let mut e = Dedup::default();
        e.advance(&sub("a", "200", 0, Some("200")));
        assert_eq!(e.judge(&sub("a", "200", 0, None)), Verdict::handled());
        assert_eq!(e.judge(&sub("a", "200", 1, None)), Verdict::Fresh);
        // Floors move forward only, by (sequence, sub-sequence); numeric across lengths.
        e.advance(&sub("a", "200", 0, Some("200:5")));
        e.advance(&sub("a", "200", 0, Some("200:2")));
        assert_eq!(e.shards[&*q("a")].floor.as_deref(), Some("200:5"));
        e.advance(&sub("a", "1000", 0, Some("1000")));
        assert_eq!(e.shards[&*q("a")].floor.as_deref(), Some("1000"));
        assert_eq!(e.judge(&sub("a", "999", 9, None)), Verdict::handled());
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

    /// The same shard id in another stream.
    fn other(shard: &str, seq: &str, token: u64, floor: Option<&str>) -> RecordId {
        RecordId { shard: qualified_shard("s2", shard), ..id(shard, seq, token, floor) }
    }

    #[test]
    fn the_same_shard_id_of_two_streams_is_two_shards() {
        let mut d = Dedup::default();
        // stream s1's shard 0 is far ahead: floor 900, token 5
        assert_eq!(take(&mut d, &id("shardId-000000000000", "1000", 5, Some("900"))), Verdict::Fresh);
        // stream s2's shard 0: lower sequences, a lower token, and none of it applied yet
        assert_eq!(take(&mut d, &other("shardId-000000000000", "100", 1, None)), Verdict::Fresh, "not s1's floor");
        assert_eq!(
            take(&mut d, &other("shardId-000000000000", "200", 1, Some("100"))),
            Verdict::Fresh,
            "not s1's token"
        );
        assert!(dup(&take(&mut d, &other("shardId-000000000000", "100", 1, None))), "s2's own floor");
        assert_eq!(d.judge(&other("shardId-000000000000", "300", 0, None)), Verdict::Fenced { stored: 1 });
        assert_eq!(d.shards.len(), 2);
    }

    #[test]
    fn entries_written_under_bare_shard_ids_are_taken_by_their_shard() {
        // an item written before ids were qualified by stream
        let legacy = br#"{"shards":{"shardId-000000000001":{"floor":"50","token":3,"applied":{"60:0":[{"w":1}]}}},
            "productions":{"shardId-000000000007":{"floor":"70","applied":{"80:0:0":[]}}}}"#;
        let mut d: Dedup = serde_json::from_slice(legacy).unwrap();
        let mut r = id("shardId-000000000001", "60", 3, None);
        d.adopt(&mut r);
        assert_eq!(d.judge(&r), Verdict::Duplicate(Some(Applied::new(vec![serde_json::json!({"w": 1})]))));
        assert_eq!(d.judge(&id("shardId-000000000001", "40", 3, None)), Verdict::handled(), "below the floor");
        assert_eq!(d.judge(&id("shardId-000000000001", "70", 2, None)), Verdict::Fenced { stored: 3 });
        assert!(d.shards.contains_key(&*q("shardId-000000000001")) && !d.shards.contains_key("shardId-000000000001"));
        // the legacy production floor holds for the whole key space
        assert_eq!(prod(&mut d, "65", None, "x", "5", 1, None, 7), Verdict::handled());
        assert!(dup(&prod(&mut d, "80", None, "x", "6", 1, None, 7)), "its applied ids too");
        assert_eq!(prod(&mut d, "75", None, "x", "7", 1, None, 7), Verdict::Fresh);
        // and a production of a producer that did not qualify its shard finds the qualified entry
        let mut bare = mk_prod("85", None, "x", "8", 1, None, 7);
        if let Some(p) = &mut bare.production {
            p.shard = Arc::from("shardId-000000000007");
        }
        assert_eq!(take(&mut d, &bare), Verdict::Fresh);
        assert!(dup(&take(&mut d, &bare)));
        assert_eq!(d.productions.keys().collect::<Vec<_>>(), vec!["src/shardId-000000000007"]);
    }

    /// Ranges of a split: the whole space, its two halves.
    const HALF: u128 = u128::MAX / 2;
    fn r(start: u128, end: u128) -> Option<KeyRange> {
        Some(KeyRange { start, end })
    }

    fn ranged(shard: &str, range: Option<KeyRange>, seq: &str, token: u64, floor: Option<&str>) -> RecordId {
        RecordId { range, ..id(shard, seq, token, floor) }
    }

    #[test]
    fn a_parents_entry_goes_once_its_child_is_read_and_its_late_records_are_handled() {
        let mut d = Dedup::default();
        let parent = |seq: &str, token: u64| ranged("shardId-000000000000", r(0, u128::MAX), seq, token, None);
        assert_eq!(take(&mut d, &parent("10", 2)), Verdict::Fresh);
        assert_eq!(take(&mut d, &parent("11", 2)), Verdict::Fresh);
        // the split's lower child: the parent finished before it was read
        let child = ranged("shardId-000000000001", r(0, HALF), "20", 1, None);
        assert_eq!(take(&mut d, &child), Verdict::Fresh);
        assert_eq!(
            d.shards.keys().collect::<Vec<_>>(),
            vec![&*q("shardId-000000000001")],
            "the parent's entry is gone"
        );
        // a zombie of the parent (an older token too) delivers a record late: refused, not applied
        let finished = Verdict::Finished { descendant: q("shardId-000000000001").to_string() };
        assert_eq!(d.judge(&parent("12", 1)), finished);
        assert_eq!(take(&mut d, &parent("11", 2)), finished);
        assert_eq!(d.shards.len(), 1, "no entry comes back for it");
        // the other child does not overlap the first
        assert_eq!(
            take(&mut d, &ranged("shardId-000000000002", r(HALF + 1, u128::MAX), "30", 1, None)),
            Verdict::Fresh
        );
        assert_eq!(d.shards.len(), 2);
        // a merge of both children: both entries go
        assert_eq!(take(&mut d, &ranged("shardId-000000000003", r(0, u128::MAX), "40", 1, None)), Verdict::Fresh);
        assert_eq!(d.shards.keys().collect::<Vec<_>>(), vec![&*q("shardId-000000000003")]);
        // the same shard ids of another stream are not descendants
        let o = RecordId { range: r(0, HALF), ..other("shardId-000000000009", "1", 1, None) };
        assert_eq!(take(&mut d, &o), Verdict::Fresh);
        assert_eq!(d.shards.len(), 2);
    }

    #[test]
    fn one_key_through_thirty_reshards_keeps_a_bounded_item() {
        // a key whose hash is 1000: each reshard splits the shard holding it (its lower half keeps
        // the key) or merges it back with its sibling; the key's records arrive from every shard
        // of the lineage, each with a checkpoint, some replayed, and late ones from finished shards
        let mut d = Dedup::default();
        let mut sizes = Vec::new();
        let mut range = KeyRange::ALL;
        let mut seq = 1000u64;
        for n in 0..=30u64 {
            let shard = format!("shardId-{n:012}");
            for k in 0..20 {
                seq += 1;
                let floor = (k > 2).then(|| (seq - 2).to_string());
                let rec = ranged(&shard, Some(range), &seq.to_string(), 1 + n % 3, floor.as_deref());
                assert_eq!(take(&mut d, &rec), Verdict::Fresh, "reshard {n} record {k}");
                if k % 7 == 0 {
                    assert!(dup(&take(&mut d, &rec)), "a replay is recognized");
                }
            }
            if n > 0 {
                // a late record of the previous shard: handled
                let late = ranged(&format!("shardId-{:012}", n - 1), None, "1", 0, None);
                let late = RecordId { range: Some(KeyRange::ALL), ..late };
                assert!(
                    !matches!(take(&mut d, &late), Verdict::Fresh),
                    "reshard {n}: a late record of a finished shard"
                );
            }
            sizes.push(serde_json::to_vec(&d).unwrap().len());
            range = if n % 2 == 0 {
                KeyRange { start: range.start, end: range.start + (range.end - range.start) / 2 }
            } else {
                KeyRange::ALL
            };
        }
        let max = *sizes.iter().max().unwrap();
        assert!(max < 600, "item size grows with reshards: {sizes:?}");
        assert!(d.shards.len() <= 2, "{:?}", d.shards.keys().collect::<Vec<_>>());
    }

    /// A production of source record `src` (index 0) of source shard `src_shard` (its index
    /// gives its age), carrying the producing stage's floor `pfloor`, read at `xseq` of
    /// intermediate shard `x` under `token`, with this stage's checkpoint `xfloor` of `x`; the
    /// intermediate record's hash key is `hash`.
    #[allow(clippy::too_many_arguments)]
    fn mk_prod(
        src: &str,
        pfloor: Option<&str>,
        x: &str,
        xseq: &str,
        token: u64,
        xfloor: Option<&str>,
        src_shard: u64,
    ) -> RecordId {
        RecordId {
            shard: qualified_shard("inter", x),
            production: Some(
                ProductionId::parse(
                    qualified_shard("src", &format!("shardId-{src_shard:012}")),
                    &format!("{src}:0:0"),
                    Arc::from(pfloor.unwrap_or("")),
                    "",
                )
                .unwrap(),
            ),
            ..id(x, xseq, token, xfloor)
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn prod(
        d: &mut Dedup,
        src: &str,
        pfloor: Option<&str>,
        x: &str,
        xseq: &str,
        token: u64,
        xfloor: Option<&str>,
        src_shard: u64,
    ) -> Verdict {
        take(d, &mk_prod(src, pfloor, x, xseq, token, xfloor, src_shard))
    }

    #[test]
    fn a_production_is_applied_once_whatever_intermediate_record_carries_it() {
        let mut d = Dedup::default();
        assert_eq!(prod(&mut d, "10", None, "x", "100", 1, None, 7), Verdict::Fresh);
        // the producer replayed its source record and put the production again
        assert!(dup(&prod(&mut d, "10", None, "x", "130", 1, None, 7)));
        // this stage replays the first copy
        assert!(dup(&prod(&mut d, "10", None, "x", "100", 1, None, 7)));
        assert_eq!(d.applied_count(), 1);
    }

    #[test]
    fn a_copy_is_answered_with_the_identity_of_the_first_application() {
        let mut d = Dedup::default();
        let first = mk_prod("10", None, "x", "100", 1, Some("90"), 7);
        assert_eq!(d.judge(&first), Verdict::Fresh);
        d.record(&first, vec![serde_json::json!({"n": 1})]);
        d.advance(&first);
        // a copy read elsewhere, later: what the first made, under the first's identity
        let copy = mk_prod("10", None, "y", "555", 1, Some("500"), 7);
        let Verdict::Duplicate(Some(a)) = d.judge(&copy) else { panic!("not a duplicate") };
        assert_eq!(a.out, vec![serde_json::json!({"n": 1})]);
        // the first identity, without the checkpoint it carried then (a re-sent copy carries none)
        assert_eq!(a.origin, Some(Origin { floor: String::new(), ..first.origin() }));
        assert_eq!(a.origin.as_ref().unwrap().position, "100:0");
        // and it survives the store
        let back: Dedup = serde_json::from_slice(&serde_json::to_vec(&d).unwrap()).unwrap();
        assert_eq!(back, d);
        // an input that produced nothing keeps no origin: its entry is the hash key alone
        let mut e = Dedup::default();
        let mut quiet = mk_prod("11", None, "x", "101", 1, Some("90"), 7);
        quiet.hash = Some(0xabc);
        e.record(&quiet, vec![]);
        let text = serde_json::to_string(&e.productions).unwrap();
        assert!(text.contains(r#""11:0:0":{"h":"abc"}"#), "{text}");
    }

    #[test]
    fn a_producer_floor_waits_for_this_stages_checkpoint_of_where_it_was_read() {
        let mut d = Dedup::default();
        assert_eq!(prod(&mut d, "10", None, "x", "100", 1, None, 7), Verdict::Fresh);
        // a later production says the producer's records up to 15 had their productions put
        assert_eq!(prod(&mut d, "20", Some("15"), "x", "200", 1, Some("90"), 7), Verdict::Fresh);
        let src = qualified_shard("src", "shardId-000000000007").to_string();
        assert!(d.productions[&src].floors.is_empty(), "not in effect before this stage's checkpoint passes 200");
        // the production of source record 12 failed here and comes back (its copy at x=150):
        // with the producer's floor in effect it would be skipped and lost
        assert_eq!(prod(&mut d, "12", Some("15"), "x", "150", 1, Some("140"), 7), Verdict::Fresh);
        // this stage's checkpoint of x passes 200: the floor takes effect and prunes 10 and 12
        assert!(dup(&prod(&mut d, "20", Some("15"), "x", "200", 1, Some("200"), 7)));
        assert_eq!(d.productions[&src].floors, vec![RangeFloor { range: KeyRange::ALL, floor: "15".into() }]);
        assert_eq!(d.applied_count(), 1, "10 and 12 pruned, 20 kept");
        // a late copy of 12 (a zombie producer's put) is below the floor
        assert_eq!(prod(&mut d, "12", Some("11"), "x", "300", 1, Some("200"), 7), Verdict::handled());
        // a checkpoint of another intermediate shard promotes nothing of x
        assert_eq!(prod(&mut d, "30", Some("25"), "x", "400", 1, Some("200"), 7), Verdict::Fresh);
        prod(&mut d, "31", Some("25"), "y", "9000", 1, Some("9999"), 7);
        assert_eq!(d.productions[&src].floors[0].floor, "15");
    }

    #[test]
    fn productions_are_fenced_by_the_intermediate_shards_token() {
        let mut d = Dedup::default();
        assert_eq!(prod(&mut d, "10", None, "x", "100", 5, None, 7), Verdict::Fresh);
        assert_eq!(prod(&mut d, "11", None, "x", "110", 4, None, 7), Verdict::Fenced { stored: 5 });
        assert_eq!(prod(&mut d, "11", None, "y", "110", 1, None, 7), Verdict::Fresh, "per intermediate shard");
    }

    /// A production carrying the intermediate record's hash key, read from shard `x` of `range`.
    #[allow(clippy::too_many_arguments)]
    fn hashed(
        src: &str,
        pfloor: Option<&str>,
        x: &str,
        range: KeyRange,
        hash: u128,
        xseq: &str,
        xfloor: Option<&str>,
    ) -> RecordId {
        RecordId { range: Some(range), hash: Some(hash), ..mk_prod(src, pfloor, x, xseq, 1, xfloor, 7) }
    }

    #[test]
    fn a_floor_holds_only_where_the_intermediate_shard_it_was_read_from_holds_keys() {
        // a key of this stage coarser than the boundary's key (a global total): it reads from
        // both halves of the intermediate stream; the upper half lags
        let (low, high) = (KeyRange { start: 0, end: HALF }, KeyRange { start: HALF + 1, end: u128::MAX });
        let mut d = Dedup::default();
        // source records 10..=20 make one production each; 10 went to the lagging upper shard
        assert_eq!(take(&mut d, &hashed("11", None, "lo", low, 5, "100", None)), Verdict::Fresh);
        // a production of 20 carries the producer's floor 15 (every production of 10..=15 put)
        assert_eq!(take(&mut d, &hashed("20", Some("15"), "lo", low, 6, "200", Some("100"))), Verdict::Fresh);
        // this stage's checkpoint of the lower shard passes 200: the floor takes effect there only
        assert!(dup(&take(&mut d, &hashed("20", Some("15"), "lo", low, 6, "200", Some("200")))));
        // the upper shard's production of 10 finally arrives: not covered by the lower's floor
        assert_eq!(
            take(&mut d, &hashed("10", None, "hi", high, HALF + 9, "50", None)),
            Verdict::Fresh,
            "would be lost"
        );
        // while a copy of 11 in the lower half is
        assert_eq!(d.judge(&hashed("11", None, "lo", low, 5, "300", Some("200"))), Verdict::handled());
    }

    #[test]
    fn a_floor_read_where_the_range_is_unknown_holds_only_for_its_own_hash_key() {
        // a key coarser than the boundary's reads from both halves; the lower half's reader took
        // its shard without learning its hash key range (ListShards failed), so its tuples carry
        // none; the upper half lags
        let (low, high) = (KeyRange { start: 0, end: HALF }, KeyRange { start: HALF + 1, end: u128::MAX });
        let rangeless = |src: &str, pfloor: Option<&str>, hash: u128, xseq: &str, xfloor: Option<&str>| RecordId {
            range: None,
            ..hashed(src, pfloor, "lo", low, hash, xseq, xfloor)
        };
        let mut d = Dedup::default();
        assert_eq!(take(&mut d, &rangeless("11", None, 5, "100", None)), Verdict::Fresh);
        // a production of 20 carries the producer's floor 15, and this stage's checkpoint of the
        // lower shard passes where it was read: the floor takes effect
        assert_eq!(take(&mut d, &rangeless("20", Some("15"), 6, "200", Some("100"))), Verdict::Fresh);
        assert!(dup(&take(&mut d, &rangeless("20", Some("15"), 6, "200", Some("200")))));
        // the lagging upper shard's production of 10 (below the floor, put before it) arrives:
        // nothing says it was read here, it must be applied
        assert_eq!(
            take(&mut d, &hashed("10", None, "hi", high, HALF + 9, "50", None)),
            Verdict::Fresh,
            "a floor of a shard of unknown range taken for the whole key space: the production is lost"
        );
        // the floor still holds for the key it was carried with (every production of that hash
        // key went through the shard it was read from, or its ancestors)
        assert_eq!(d.judge(&rangeless("12", None, 6, "300", Some("200"))), Verdict::handled());
    }

    #[test]
    fn ancestors_are_done_only_where_a_descendants_floor_was_read() {
        // the producing stage's source shard 0 split into 1 (and 2); a production of 1, read
        // from the lower intermediate half of unknown range, takes effect: shard 0 is done only
        // for that production's hash key, not in the lagging upper half
        let (low, high) = (KeyRange { start: 0, end: HALF }, KeyRange { start: HALF + 1, end: u128::MAX });
        let of = |mut p: RecordId, src_shard: u64, src_range: KeyRange| {
            if let Some(pid) = &mut p.production {
                pid.shard = qualified_shard("src", &format!("shardId-{src_shard:012}"));
                pid.range = Some(src_range);
            }
            p
        };
        let mut d = Dedup::default();
        // shard 0's production of 5, read from the lower half
        let first = of(RecordId { range: None, ..hashed("5", None, "lo", low, 6, "90", None) }, 0, KeyRange::ALL);
        assert_eq!(take(&mut d, &first), Verdict::Fresh);
        // shard 1's production, read from the lower half (range unknown), takes effect
        let child = |xseq: &str, xfloor: &str| {
            of(
                RecordId { range: None, ..hashed("30", Some("30"), "lo", low, 6, xseq, Some(xfloor)) },
                1,
                KeyRange { start: 0, end: HALF },
            )
        };
        assert_eq!(take(&mut d, &child("100", "95")), Verdict::Fresh);
        assert!(dup(&take(&mut d, &child("100", "100"))));
        // shard 0's production of 7 from the lagging upper half: never applied here
        let late = of(hashed("7", None, "hi", high, HALF + 9, "40", None), 0, KeyRange::ALL);
        assert_eq!(d.judge(&late), Verdict::Fresh, "shard 0 taken as done in the whole key space: lost");
        // while a copy of shard 0's production of 5 in the lower half is handled
        let copy =
            of(RecordId { range: None, ..hashed("5", None, "lo", low, 6, "300", Some("100")) }, 0, KeyRange::ALL);
        assert!(dup(&d.judge(&copy)));
    }

    /// The producing stage's source shard split again and again (`generations` times after
    /// shard 0): each generation's five productions reach this key through one intermediate shard
    /// (`x`, hash key 77, read up to sequence 1000 + 5 per generation). The item's size after each.
    fn reshard_generations(d: &mut Dedup, generations: u64) -> Vec<usize> {
        let x = KeyRange::ALL;
        let mut sizes = Vec::new();
        let mut src_range = KeyRange::ALL;
        let mut seq = 100u64;
        let mut xseq = 1000u64;
        for n in 0..=generations {
            for _ in 0..5 {
                seq += 1;
                xseq += 1;
                let floor = (seq - 1).to_string();
                let mut p = hashed(
                    &seq.to_string(),
                    Some(&floor),
                    "x",
                    x,
                    77,
                    &xseq.to_string(),
                    Some(&(xseq - 1).to_string()),
                );
                if let Some(pid) = &mut p.production {
                    pid.shard = qualified_shard("src", &format!("shardId-{n:012}"));
                    pid.range = Some(src_range);
                }
                assert_eq!(take(d, &p), Verdict::Fresh, "reshard {n}");
            }
            sizes.push(serde_json::to_vec(&d).unwrap().len());
            src_range =
                KeyRange { start: src_range.start, end: src_range.start + (src_range.end - src_range.start) / 2 };
        }
        sizes
    }

    #[test]
    fn production_floors_stay_bounded_as_the_source_stream_reshards() {
        let x = KeyRange::ALL;
        let mut d = Dedup::default();
        let sizes = reshard_generations(&mut d, 30);
        let max = *sizes.iter().max().unwrap();
        assert!(d.productions.len() <= 3, "{:#?}", d.productions);
        assert!(max < 1500, "item size grows with reshards: {sizes:?}");
        // a late copy of a production of a long-finished source shard is still handled
        let mut late = hashed("101", Some("100"), "x", x, 77, "99999", Some("99998"));
        if let Some(pid) = &mut late.production {
            pid.shard = qualified_shard("src", "shardId-000000000000");
            pid.range = Some(KeyRange::ALL);
        }
        assert_eq!(d.judge(&late), Verdict::handled());
    }

    #[test]
    fn every_late_copy_of_a_stood_for_source_shards_productions_is_handled() {
        // shard 0's entry was dropped (its descendants, done, stand for it); late copies of its
        // productions come back, re-sent without a floor (a replay upstream re-sends what it
        // stored): the first one's floor-less candidate brought back an empty entry for shard 0,
        // and the copies after it were taken as fresh (simulator seed 513: a three-stage count
        // over-counted by 3)
        let mut d = Dedup::default();
        reshard_generations(&mut d, 4);
        assert!(!d.productions.contains_key(&*qualified_shard("src", "shardId-000000000000")), "{:#?}", d.productions);
        for (i, seq) in ["101", "102", "103"].into_iter().enumerate() {
            let mut late = hashed(seq, None, "x", KeyRange::ALL, 77, &(50_000 + i).to_string(), Some("49999"));
            if let Some(pid) = &mut late.production {
                pid.shard = qualified_shard("src", "shardId-000000000000");
                pid.range = Some(KeyRange::ALL);
            }
            assert_eq!(take(&mut d, &late), Verdict::handled(), "copy {i} of shard 0's production {seq}");
        }
    }

    #[test]
    fn floor_candidates_are_bounded() {
        let mut d = Dedup::default();
        for i in 0..20u64 {
            let (src, f, xs) = ((100 + i).to_string(), (50 + i).to_string(), (1000 + i).to_string());
            prod(&mut d, &src, Some(&f), "x", &xs, 1, None, 7);
        }
        let s = qualified_shard("src", "shardId-000000000007").to_string();
        assert!(d.productions[&s].candidates.len() <= MAX_CANDIDATES);
        // the oldest candidate is kept (it takes effect first), the newest replaced the last
        let c = &d.productions[&s].candidates;
        assert_eq!((c[0].floor.as_str(), c[c.len() - 1].floor.as_str()), ("50", "69"));
        prod(&mut d, "200", None, "x", "2000", 1, Some("1019"), 7);
        assert_eq!(d.productions[&s].floors[0].floor, "69");
        assert!(d.productions[&s].candidates.is_empty());
    }

    #[test]
    fn production_ids_are_checked() {
        let p = |id: &str| ProductionId::parse(Arc::from("s"), id, Arc::from(""), "");
        assert!(p("49590:0:3").is_ok());
        for bad in ["", "49590", "49590:0", "a:0:1", "1:x:1", "1:0:1:2"] {
            assert!(p(bad).unwrap_err().contains("production id"), "{bad}");
        }
        assert!(ProductionId::parse(Arc::from(""), "1:0:0", Arc::from(""), "").is_err());
        assert!(
            ProductionId::parse(Arc::from("s"), "1:0:0", Arc::from(""), "9-1")
                .unwrap_err()
                .contains("production_range")
        );
        assert_eq!(ProductionId::parse(Arc::from("s"), "1:0:0", Arc::from(""), "1-9").unwrap().range, r(1, 9));
    }

    #[test]
    fn key_ranges_read_and_cover() {
        assert_eq!(KeyRange::parse("0-340282366920938463463374607431768211455"), Some(KeyRange::ALL));
        assert_eq!(KeyRange::parse("5-4"), None);
        assert_eq!(KeyRange::parse("x-4"), None);
        assert!(covered(
            KeyRange::ALL,
            vec![KeyRange { start: HALF + 1, end: u128::MAX }, KeyRange { start: 0, end: HALF }]
        ));
        assert!(!covered(KeyRange::ALL, vec![KeyRange { start: 0, end: HALF }]));
        assert!(!covered(KeyRange::ALL, vec![KeyRange { start: 0, end: 5 }, KeyRange { start: 7, end: u128::MAX }]));
        assert_eq!(shard_index("s/shardId-000000000012"), Some(12));
        assert_eq!(shard_index("shardId-x"), None);
    }

    #[test]
    fn round_trips_through_json() {
        let mut d = Dedup::default();
        d.record(&id("shardId-000000000001", "4960", 3, None), vec![serde_json::json!({"w": 1})]);
        d.advance(&RecordId { range: Some(KeyRange::ALL), ..id("shardId-000000000001", "4961", 3, Some("4959")) });
        prod(&mut d, "77", Some("70"), "x", "5", 2, None, 7);
        take(&mut d, &hashed("78", Some("71"), "x", KeyRange::ALL, 99, "6", Some("6")));
        assert!(!d.productions.is_empty());
        let back: Dedup = serde_json::from_slice(&serde_json::to_vec(&d).unwrap()).unwrap();
        assert_eq!(back, d);
    }
}
