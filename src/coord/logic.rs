//! Pure coordination logic: which shards may be read, who reads them, who leads.
//!
//! Every task computes these from the same inputs (live tasks, shard list, checkpoints) and gets
//! the same answer, so no assignment znode is needed; leases make it safe while views differ.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use super::model::{Checkpoint, ShardList};
use super::paths::sequence_of;

/// Shards that may be read now, sorted by id.
///
/// A shard is readable when it is not finished and each parent is either finished or no longer in
/// the list (trimmed past retention). A merge child waits for both parents. A shard without a
/// checkpoint is not finished.
pub fn readable_shards(list: &ShardList, checkpoints: &BTreeMap<String, Checkpoint>) -> Vec<String> {
    let present: BTreeSet<&str> = list.shards.iter().map(|s| s.shard_id.as_str()).collect();
    let finished = |id: &str| checkpoints.get(id).is_some_and(|c| c.finished);
    let mut out: Vec<String> = list
        .shards
        .iter()
        .filter(|s| !finished(&s.shard_id))
        .filter(|s| s.parents().all(|p| finished(p) || !present.contains(p)))
        .map(|s| s.shard_id.clone())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Orders task node names by their sequence number (then by name).
pub fn task_cmp(a: &str, b: &str) -> Ordering {
    match (sequence_of(a), sequence_of(b)) {
        (Some(x), Some(y)) => x.cmp(&y).then_with(|| a.cmp(b)),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

/// Round-robin assignment of sorted readable shards over tasks sorted by sequence.
///
/// Every task is a key (possibly with no shards); each shard appears exactly once; task loads
/// differ by at most one; the result depends only on the sets of tasks and shards.
pub fn assign(tasks: &[String], readable: &[String]) -> BTreeMap<String, Vec<String>> {
    let mut sorted_tasks: Vec<&str> = tasks.iter().map(String::as_str).collect();
    sorted_tasks.sort_by(|a, b| task_cmp(a, b));
    sorted_tasks.dedup();
    let mut shards: Vec<&str> = readable.iter().map(String::as_str).collect();
    shards.sort();
    shards.dedup();
    let mut out: BTreeMap<String, Vec<String>> = sorted_tasks.iter().map(|t| (t.to_string(), Vec::new())).collect();
    if sorted_tasks.is_empty() {
        return out;
    }
    for (i, shard) in shards.iter().enumerate() {
        let task = sorted_tasks[i % sorted_tasks.len()];
        if let Some(list) = out.get_mut(task) {
            list.push(shard.to_string());
        }
    }
    out
}

/// The leader: the live task with the lowest sequence.
pub fn leader(tasks: &[String]) -> Option<&str> {
    tasks.iter().map(String::as_str).min_by(|a, b| task_cmp(a, b))
}

/// Compares Kinesis sequence numbers given as decimal strings of any length
/// (`"9223372036854775807" < "49590338271490256608559692538361571095921575989136588898"`).
///
/// Leading zeros are ignored. Non-digit input still gets a total order (by length, then bytes)
/// but is never a valid sequence number.
pub fn sequence_cmp(a: &str, b: &str) -> Ordering {
    let a = a.trim_start_matches('0');
    let b = b.trim_start_matches('0');
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coord::model::{CheckpointPosition, ShardRecord};
    use proptest::prelude::*;

    fn shard(id: &str, parent: Option<&str>, adjacent: Option<&str>) -> ShardRecord {
        ShardRecord {
            shard_id: id.into(),
            parent_shard_id: parent.map(Into::into),
            adjacent_parent_shard_id: adjacent.map(Into::into),
            starting_hash_key: "0".into(),
            ending_hash_key: "1".into(),
            closed: false,
        }
    }

    fn done() -> Checkpoint {
        Checkpoint { position: CheckpointPosition::TrimHorizon, finished: true, updated_at_ms: 0, writer: None }
    }

    fn open() -> Checkpoint {
        Checkpoint::at(CheckpointPosition::TrimHorizon, 0)
    }

    #[test]
    fn split_and_merge_lineage() {
        // s0 splits into s1, s2; s1 and s2 merge into s3.
        let list = ShardList::new(
            vec![
                shard("s0", None, None),
                shard("s1", Some("s0"), None),
                shard("s2", Some("s0"), None),
                shard("s3", Some("s1"), Some("s2")),
            ],
            0,
        );
        let mut cps = BTreeMap::new();
        assert_eq!(readable_shards(&list, &cps), vec!["s0"]);
        cps.insert("s0".to_string(), done());
        assert_eq!(readable_shards(&list, &cps), vec!["s1", "s2"]);
        cps.insert("s1".to_string(), done());
        cps.insert("s2".to_string(), open());
        assert_eq!(readable_shards(&list, &cps), vec!["s2"], "merge child waits for both parents");
        cps.insert("s2".to_string(), done());
        assert_eq!(readable_shards(&list, &cps), vec!["s3"]);
        // Parents trimmed from the stream count as finished.
        let trimmed = ShardList::new(vec![shard("s3", Some("s1"), Some("s2"))], 0);
        assert_eq!(readable_shards(&trimmed, &BTreeMap::new()), vec!["s3"]);
    }

    #[test]
    fn assign_examples() {
        let tasks = vec!["task-0000000010".to_string(), "task-0000000002".to_string()];
        let shards: Vec<String> = ["c", "a", "b"].iter().map(|s| s.to_string()).collect();
        let a = assign(&tasks, &shards);
        assert_eq!(a["task-0000000002"], vec!["a", "c"]);
        assert_eq!(a["task-0000000010"], vec!["b"]);
        assert!(assign(&[], &shards).is_empty());
        let a = assign(&tasks, &[]);
        assert_eq!(a.len(), 2);
        assert!(a.values().all(Vec::is_empty));
    }

    #[test]
    fn leader_is_lowest_sequence() {
        let tasks = vec!["task-0000000010".to_string(), "task-0000000009".to_string()];
        assert_eq!(leader(&tasks), Some("task-0000000009"));
        // A 19-digit sequence (after 2^31 creations) still orders numerically.
        let tasks = vec!["task-2147483648000000000".to_string(), "task-0000000003".to_string()];
        assert_eq!(leader(&tasks), Some("task-0000000003"));
        assert_eq!(leader(&[]), None);
    }

    #[test]
    fn sequence_examples() {
        let real = "49590338271490256608559692538361571095921575989136588898";
        assert_eq!(sequence_cmp("9223372036854775807", real), Ordering::Less);
        assert_eq!(sequence_cmp(real, real), Ordering::Equal);
        assert_eq!(sequence_cmp("0010", "9"), Ordering::Greater);
        assert_eq!(sequence_cmp("000", "0"), Ordering::Equal);
    }

    fn task_names() -> impl Strategy<Value = Vec<String>> {
        proptest::collection::btree_set(0u32..1000, 0..12)
            .prop_map(|s| s.into_iter().map(|n| format!("task-{n:010}")).collect::<Vec<_>>())
            .prop_shuffle()
    }

    fn shard_names() -> impl Strategy<Value = Vec<String>> {
        proptest::collection::btree_set("shardId-[0-9]{3}", 0..60)
            .prop_map(|s| s.into_iter().collect::<Vec<_>>())
            .prop_shuffle()
    }

    /// A random lineage: each new shard is a root, a split child of one earlier shard, or a merge
    /// child of two; some shards are trimmed from the list; some have finished checkpoints.
    fn lineage() -> impl Strategy<Value = (ShardList, BTreeMap<String, Checkpoint>, BTreeMap<String, Vec<String>>)> {
        proptest::collection::vec(
            (0u8..3, any::<prop::sample::Index>(), any::<prop::sample::Index>(), any::<bool>(), 0u8..4),
            1..40,
        )
        .prop_map(|specs| {
            let mut records: Vec<ShardRecord> = Vec::new();
            let mut parents_of: BTreeMap<String, Vec<String>> = BTreeMap::new();
            let mut cps = BTreeMap::new();
            let mut trimmed = BTreeSet::new();
            for (i, (kind, p1, p2, fin, cp_kind)) in specs.into_iter().enumerate() {
                let id = format!("shardId-{i:012}");
                let (p, q) = if records.is_empty() || kind == 0 {
                    (None, None)
                } else if kind == 1 {
                    (Some(records[p1.index(records.len())].shard_id.clone()), None)
                } else {
                    let a = records[p1.index(records.len())].shard_id.clone();
                    let b = records[p2.index(records.len())].shard_id.clone();
                    if a == b { (Some(a), None) } else { (Some(a), Some(b)) }
                };
                parents_of.insert(id.clone(), p.iter().chain(q.iter()).cloned().collect());
                let mut r = shard(&id, p.as_deref(), q.as_deref());
                r.closed = fin;
                records.push(r);
                match cp_kind {
                    0 => {}
                    1 => {
                        cps.insert(id.clone(), open());
                    }
                    2 => {
                        cps.insert(id.clone(), done());
                    }
                    _ => {
                        trimmed.insert(id.clone());
                    }
                }
            }
            let kept = records.into_iter().filter(|r| !trimmed.contains(&r.shard_id)).collect();
            (ShardList::new(kept, 0), cps, parents_of)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn assign_is_balanced_complete_and_deterministic(tasks in task_names(), shards in shard_names()) {
            let a = assign(&tasks, &shards);
            if tasks.is_empty() {
                prop_assert!(a.is_empty());
            } else {
                prop_assert_eq!(a.len(), tasks.len(), "every task is a key");
                for t in &tasks { prop_assert!(a.contains_key(t)); }
                let loads: Vec<usize> = a.values().map(Vec::len).collect();
                let (max, min) = (loads.iter().max().unwrap(), loads.iter().min().unwrap());
                prop_assert!(max - min <= 1, "loads {:?}", loads);
                let mut all: Vec<&String> = a.values().flatten().collect();
                prop_assert_eq!(all.len(), shards.len(), "each shard exactly once");
                all.sort();
                all.dedup();
                prop_assert_eq!(all.len(), shards.len());
                // Deterministic: input order does not matter.
                let mut rt = tasks.clone(); rt.reverse();
                let mut rs = shards.clone(); rs.reverse();
                prop_assert_eq!(&assign(&rt, &rs), &a);
                // The leader gets the first shard.
                if let (Some(l), Some(first)) = (leader(&tasks), shards.iter().min()) {
                    prop_assert_eq!(a[l].first(), Some(first));
                }
            }
        }

        #[test]
        fn readable_never_before_parents((list, cps, parents_of) in lineage()) {
            let readable = readable_shards(&list, &cps);
            let present: BTreeSet<&str> = list.shards.iter().map(|s| s.shard_id.as_str()).collect();
            let finished = |id: &str| cps.get(id).is_some_and(|c| c.finished);
            let mut sorted = readable.clone(); sorted.sort();
            prop_assert_eq!(&sorted, &readable, "sorted");
            for id in &readable {
                prop_assert!(present.contains(id.as_str()), "only listed shards");
                prop_assert!(!finished(id), "finished shard {} offered", id);
                for p in &parents_of[id] {
                    prop_assert!(finished(p) || !present.contains(p.as_str()),
                        "child {} readable while parent {} unfinished", id, p);
                }
            }
            // Completeness: every unfinished shard whose parents are all done is offered.
            for s in &list.shards {
                let ready = !finished(&s.shard_id)
                    && parents_of[&s.shard_id].iter().all(|p| finished(p) || !present.contains(p.as_str()));
                prop_assert_eq!(ready, readable.contains(&s.shard_id), "shard {}", &s.shard_id);
            }
        }

        #[test]
        fn sequence_cmp_matches_numbers(a in any::<u128>(), b in any::<u128>(), za in 0usize..3, zb in 0usize..3) {
            let sa = format!("{}{a}", "0".repeat(za));
            let sb = format!("{}{b}", "0".repeat(zb));
            prop_assert_eq!(sequence_cmp(&sa, &sb), a.cmp(&b));
        }

        #[test]
        fn sequence_cmp_long_strings(a in "[1-9][0-9]{0,60}", b in "[1-9][0-9]{0,60}") {
            let expected = a.len().cmp(&b.len()).then_with(|| a.cmp(&b));
            prop_assert_eq!(sequence_cmp(&a, &b), expected);
            prop_assert_eq!(sequence_cmp(&b, &a), expected.reverse());
        }
    }
}
