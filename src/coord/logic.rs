//! Pure coordination logic: which shards may be read, who reads them, who leads.
//!
//! The leader evaluates these and writes the result to the `assignment` znode; leases keep
//! reading exclusive while workers' views of it differ for a moment.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use super::model::{Assignment, Checkpoint, ShardList, WatermarkReport};
use super::paths::sequence_of;

/// Shards that may be read now, sorted by id.
///
/// A shard is readable when it is not finished and each parent is either finished or no longer in
/// the list (trimmed past retention). A merge child waits for both parents. A shard without a
/// checkpoint is not finished.
pub fn readable_shards(list: &ShardList, checkpoints: &BTreeMap<String, Checkpoint>) -> Vec<String> {
    let finished: BTreeSet<String> = checkpoints.iter().filter(|(_, c)| c.finished).map(|(k, _)| k.clone()).collect();
    readable(list, &finished)
}

/// [`readable_shards`] with the set of finished shards (the `finished/` markers) as input.
pub fn readable(list: &ShardList, finished_set: &BTreeSet<String>) -> Vec<String> {
    let present: BTreeSet<&str> = list.shards.iter().map(|s| s.shard_id.as_str()).collect();
    let finished = |id: &str| finished_set.contains(id);
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

/// What keeps the leader from writing an assignment now: empty when every shard that may hold
/// unread records is known, with its starting position persisted. Otherwise one reason per gap,
/// naming the shard:
/// - a finished shard of the list whose children the list does not (or not all) name: a finished
///   shard was closed by a split or a merge, so its hash range lives on in children whose
///   records arrived after it closed. The union of the children's hash ranges must cover the
///   parent's (a listing that returned one child of a split is a gap too);
/// - otherwise, when the newest shards of the list (those it names no child of) do not cover
///   the whole hash key space: a listing left out a shard that is neither finished nor named as
///   anyone's parent (an open shard missing from the first listing), whose records no task
///   would read and no watermark would hold back;
/// - a readable shard without a starting position (`positioned`: shards with a checkpoint).
///
/// An assignment written over such a list would leave those records unassigned, and its tasks
/// would report a committed watermark that nothing of those records holds back: windows would
/// fire without them (issue #31, point 4). So the leader writes nothing until a listing closes
/// every gap; the previous assignment stays, in which the finished shard is still assigned to
/// the task that finished it, whose watermark stays unknown (it owns fewer shards than
/// assigned) until the next assignment.
pub fn lineage_gaps(list: &ShardList, finished: &BTreeSet<String>, positioned: &BTreeSet<String>) -> Vec<String> {
    let mut gaps = Vec::new();
    let range = |s: &super::model::ShardRecord| -> Option<(u128, u128)> {
        Some((s.starting_hash_key.parse().ok()?, s.ending_hash_key.parse().ok()?))
    };
    for parent in list.shards.iter().filter(|s| finished.contains(&s.shard_id)) {
        let children: Vec<&super::model::ShardRecord> =
            list.shards.iter().filter(|c| c.parents().any(|p| p == parent.shard_id)).collect();
        let covered = match (range(parent), children.iter().map(|c| range(c)).collect::<Option<Vec<_>>>()) {
            (Some(p), Some(mut kids)) => first_uncovered(p, &mut kids).is_none(),
            // Hash keys that do not parse (never from Kinesis): at least one child.
            _ => !children.is_empty(),
        };
        if !covered {
            let names: Vec<&str> = children.iter().map(|c| c.shard_id.as_str()).collect();
            gaps.push(if names.is_empty() {
                format!("shard {} finished, but the shard list names none of its children yet", parent.shard_id)
            } else {
                format!(
                    "shard {} finished, but the children the shard list names ({}) do not cover its hash range",
                    parent.shard_id,
                    names.join(", ")
                )
            });
        }
    }
    if gaps.is_empty() && !list.shards.is_empty() {
        let named_parents: BTreeSet<&str> = list.shards.iter().flat_map(|s| s.parents()).collect();
        let newest: Option<Vec<(u128, u128)>> =
            list.shards.iter().filter(|s| !named_parents.contains(s.shard_id.as_str())).map(range).collect();
        if let Some(from) = newest.and_then(|mut n| first_uncovered((0, u128::MAX), &mut n)) {
            gaps.push(format!(
                "the shard list's newest shards do not cover the hash key space from hash key {from}: a listing \
                 left out an open shard"
            ));
        }
    }
    for s in readable(list, finished) {
        if !positioned.contains(&s) {
            gaps.push(format!("shard {s} is readable but its starting position is not persisted yet"));
        }
    }
    gaps
}

/// The lowest hash key of the inclusive range `parent` that none of the inclusive ranges `kids`
/// covers; `None` when they cover it all.
fn first_uncovered(parent: (u128, u128), kids: &mut [(u128, u128)]) -> Option<u128> {
    kids.sort_unstable();
    let mut next = parent.0; // the lowest hash key not covered yet
    for &(start, end) in kids.iter() {
        if start > next {
            break;
        }
        if end >= parent.1 {
            return None;
        }
        next = next.max(end + 1);
    }
    Some(next)
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

/// Sticky, balanced assignment (in the manner of Kafka's cooperative-sticky assignor).
///
/// Every live task gets a quota of `floor(N/T)` or `ceil(N/T)` shards; the `N mod T` ceiling
/// quotas go to the tasks holding the most shards in `previous` (ties by task order), so that as
/// few shards as possible move. Each task keeps its previous shards up to its quota; the surplus,
/// the shards of tasks that left and new shards are dealt round-robin to tasks below quota, a
/// shard going to its `hints` task (e.g. a child to its parent's reader) when that one has room.
///
/// Consequences, each checked by a property test:
/// - loads differ by at most one, every readable shard is assigned exactly once;
/// - with an empty `previous` it equals [`assign`] (round-robin by index);
/// - a task joining moves exactly its quota (at most `ceil(N/T)`) shards;
/// - a task leaving moves only that task's shards;
/// - a split parent finishing moves nothing but where its children go; the first parent of a merge
///   finishing (one shard fewer) moves at most one more shard, and only when that is the only way
///   to keep loads within one.
pub fn sticky_assign(
    previous: &BTreeMap<String, Vec<String>>,
    tasks: &[String],
    readable: &[String],
    hints: &BTreeMap<String, String>,
) -> BTreeMap<String, Vec<String>> {
    let mut order: Vec<&str> = tasks.iter().map(String::as_str).collect();
    order.sort_by(|a, b| task_cmp(a, b));
    order.dedup();
    let mut out: BTreeMap<String, Vec<String>> = order.iter().map(|t| (t.to_string(), Vec::new())).collect();
    if order.is_empty() {
        return out;
    }
    let readable_set: BTreeSet<&str> = readable.iter().map(String::as_str).collect();
    // What each live task keeps of its previous shards (still readable, not claimed twice).
    let mut claimed: BTreeSet<&str> = BTreeSet::new();
    let mut kept: Vec<Vec<&str>> = order
        .iter()
        .map(|t| {
            let mut mine: Vec<&str> = previous
                .get(*t)
                .into_iter()
                .flatten()
                .map(String::as_str)
                .filter(|s| readable_set.contains(s))
                .collect();
            mine.sort_unstable();
            mine.retain(|s| claimed.insert(s));
            mine
        })
        .collect();
    let n = readable_set.len();
    let t = order.len();
    let (base, extra) = (n / t, n % t);
    // Ceiling quotas go to the tasks that hold the most now (stable: ties keep task order).
    let mut by_load: Vec<usize> = (0..t).collect();
    by_load.sort_by(|&a, &b| kept[b].len().cmp(&kept[a].len()).then(a.cmp(&b)));
    let mut quota = vec![base; t];
    for &i in by_load.iter().take(extra) {
        quota[i] = base + 1;
    }
    // Surplus back to the pool, with every readable shard nobody kept.
    let mut pool: Vec<&str> = Vec::new();
    for (i, mine) in kept.iter_mut().enumerate() {
        while mine.len() > quota[i] {
            if let Some(s) = mine.pop() {
                claimed.remove(s);
                pool.push(s);
            }
        }
    }
    pool.extend(readable_set.iter().copied().filter(|s| !claimed.contains(s)));
    pool.sort_unstable();
    pool.dedup();
    let index: BTreeMap<&str, usize> = order.iter().enumerate().map(|(i, t)| (*t, i)).collect();
    let mut next = 0usize;
    for shard in pool {
        let hinted =
            hints.get(shard).and_then(|h| index.get(h.as_str())).copied().filter(|&i| kept[i].len() < quota[i]);
        let i = match hinted {
            Some(i) => i,
            None => {
                // Round-robin over tasks with room; one exists since sum(quota) == n.
                let mut i = next % t;
                while kept[i].len() >= quota[i] {
                    i = (i + 1) % t;
                }
                next = i + 1;
                i
            }
        };
        kept[i].push(shard);
    }
    for (i, t) in order.iter().enumerate() {
        let mut shards: Vec<String> = kept[i].iter().map(|s| s.to_string()).collect();
        shards.sort();
        out.insert(t.to_string(), shards);
    }
    out
}

/// How many shards changed owner between two assignments (shards in both).
pub fn moved(before: &BTreeMap<String, Vec<String>>, after: &BTreeMap<String, Vec<String>>) -> usize {
    let owner = |m: &BTreeMap<String, Vec<String>>| -> BTreeMap<String, String> {
        m.iter().flat_map(|(t, ss)| ss.iter().map(move |s| (s.clone(), t.clone()))).collect()
    };
    let (a, b) = (owner(before), owner(after));
    a.iter().filter(|(s, t)| b.get(*s).is_some_and(|u| u != *t)).count()
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

/// A stream's committed watermark from its current `assignment` and the reports of its tasks
/// (task node name -> report; tasks without a report absent): the minimum of the watermarks
/// reported by every task the assignment lists (tasks with no shards included), each reported for
/// the assignment's own generation. A report of another generation is not used: after a
/// rebalance or a split it may cover shards its task no longer holds, while their new owner has
/// not reported yet. `Err` says what is missing (each task, with the generation), or that the
/// assignment is in error or lists no task.
pub fn committed_watermark(
    assignment: &Assignment,
    reports: &BTreeMap<String, WatermarkReport>,
) -> Result<i64, String> {
    let g = assignment.generation;
    if let Some(e) = &assignment.error {
        return Err(format!("assignment generation {g} is in error: {e}"));
    }
    if assignment.tasks.is_empty() {
        return Err(format!("assignment generation {g} lists no task"));
    }
    let mut missing = Vec::new();
    let mut min: Option<i64> = None;
    for task in assignment.tasks.keys() {
        match reports.get(task) {
            None => missing.push(format!("task {task} has no watermark report (assignment generation {g})")),
            Some(r) if r.generation != g => missing.push(format!(
                "task {task} reported for assignment generation {}, not the current generation {g}",
                r.generation
            )),
            Some(WatermarkReport { watermark_ms: None, .. }) => missing.push(format!(
                "task {task} has no committed watermark yet for assignment generation {g} (a shard not taken or \
                 nothing read from it yet)"
            )),
            Some(WatermarkReport { watermark_ms: Some(w), .. }) => min = Some(min.map_or(*w, |m| m.min(*w))),
        }
    }
    match min {
        Some(w) if missing.is_empty() => Ok(w),
        _ => Err(missing.join("; ")),
    }
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
        fn sticky_is_balanced_complete_and_round_robin_at_first(tasks in task_names(), shards in shard_names()) {
            let (none, no_hints) = (BTreeMap::new(), BTreeMap::new());
            let a = sticky_assign(&none, &tasks, &shards, &no_hints);
            prop_assert_eq!(&a, &assign(&tasks, &shards), "first placement is round-robin");
            // Stable: recomputing from its own result changes nothing.
            prop_assert_eq!(&sticky_assign(&a, &tasks, &shards, &no_hints), &a);
        }

        #[test]
        fn sticky_join_leave_and_reshard_move_little(
            tasks in task_names().prop_filter("two or more", |t| t.len() >= 2),
            shards in shard_names(),
            pick in any::<prop::sample::Index>(),
            parent in any::<prop::sample::Index>(),
        ) {
            let (empty, none) = (BTreeMap::new(), BTreeMap::new());
            let base = sticky_assign(&empty, &tasks, &shards, &none);
            let check = |a: &BTreeMap<String, Vec<String>>, tasks: &[String], shards: &[String]| -> Result<(), TestCaseError> {
                let loads: Vec<usize> = a.values().map(Vec::len).collect();
                let (max, min) = (loads.iter().max().copied().unwrap_or(0), loads.iter().min().copied().unwrap_or(0));
                prop_assert!(max - min <= 1, "loads {:?}", loads);
                prop_assert_eq!(a.len(), tasks.len());
                let mut all: Vec<&String> = a.values().flatten().collect();
                all.sort();
                let mut want: Vec<&String> = shards.iter().collect();
                want.sort();
                want.dedup();
                prop_assert_eq!(all, want, "each readable shard exactly once");
                Ok(())
            };
            // Join: at most ceil(N/T) moves, and the newcomer gets its quota.
            let mut joined = tasks.clone();
            joined.push("task-9999999999".to_string());
            let after = sticky_assign(&base, &joined, &shards, &none);
            check(&after, &joined, &shards)?;
            let n = shards.len();
            let t = joined.len();
            prop_assert!(moved(&base, &after) <= n.div_ceil(t), "join moved {} of {} over {} tasks", moved(&base, &after), n, t);
            prop_assert_eq!(moved(&base, &after), after["task-9999999999"].len());
            // Leave: only the leaver's shards move.
            let leaver = tasks[pick.index(tasks.len())].clone();
            let left: Vec<String> = tasks.iter().filter(|t| **t != leaver).cloned().collect();
            let after = sticky_assign(&base, &left, &shards, &none);
            check(&after, &left, &shards)?;
            let mut survivors = base.clone();
            survivors.remove(&leaver);
            prop_assert_eq!(moved(&survivors, &after), 0, "a leave moved other tasks' shards");
            if !shards.is_empty() {
                // A split: the parent finishes, two children appear, hinted to the parent's owner.
                let p = shards[parent.index(shards.len())].clone();
                let owner = base.iter().find(|(_, v)| v.contains(&p)).map(|(k, _)| k.clone()).unwrap();
                let mut next: Vec<String> = shards.iter().filter(|s| **s != p).cloned().collect();
                let kids = [format!("{p}-a"), format!("{p}-b")];
                next.extend(kids.iter().cloned());
                let hints: BTreeMap<String, String> = kids.iter().map(|k| (k.clone(), owner.clone())).collect();
                let after = sticky_assign(&base, &tasks, &next, &hints);
                check(&after, &tasks, &next)?;
                prop_assert_eq!(moved(&base, &after), 0, "a split moved shards other than the children");
                // A merge's first parent finishing: one shard fewer moves at most one other.
                let fewer: Vec<String> = shards.iter().filter(|s| **s != p).cloned().collect();
                let after = sticky_assign(&base, &tasks, &fewer, &none);
                check(&after, &tasks, &fewer)?;
                prop_assert!(moved(&base, &after) <= 1, "one shard fewer moved {}", moved(&base, &after));
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

    fn ranged(id: &str, parents: &[&str], start: u128, end: u128, closed: bool) -> ShardRecord {
        ShardRecord {
            shard_id: id.into(),
            parent_shard_id: parents.first().map(|p| p.to_string()),
            adjacent_parent_shard_id: parents.get(1).map(|p| p.to_string()),
            starting_hash_key: start.to_string(),
            ending_hash_key: end.to_string(),
            closed,
        }
    }

    fn set(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_finished_shard_whose_children_are_not_listed_is_a_gap() {
        let half = u128::MAX / 2;
        let stale =
            ShardList::new(vec![ranged("s0", &[], 0, half, false), ranged("s1", &[], half + 1, u128::MAX, false)], 0);
        let all = set(&["s0", "s1", "s2", "s3"]);
        assert!(lineage_gaps(&stale, &set(&[]), &all).is_empty(), "nothing finished: nothing missing");
        // s1 split into s2, s3 and finished, but the list predates the split
        let gaps = lineage_gaps(&stale, &set(&["s1"]), &all);
        assert_eq!(gaps, ["shard s1 finished, but the shard list names none of its children yet"]);
        // a listing that returned one child of the split
        let quarter = half + 1 + half / 2;
        let one = ShardList::new(
            vec![
                ranged("s0", &[], 0, half, false),
                ranged("s1", &[], half + 1, u128::MAX, true),
                ranged("s2", &["s1"], half + 1, quarter, false),
            ],
            0,
        );
        let gaps = lineage_gaps(&one, &set(&["s1"]), &all);
        assert_eq!(gaps, ["shard s1 finished, but the children the shard list names (s2) do not cover its hash range"]);
        let mut both = one.clone();
        both.shards.push(ranged("s3", &["s1"], quarter + 1, u128::MAX, false));
        assert!(lineage_gaps(&both, &set(&["s1"]), &all).is_empty());
        // a child without a persisted starting position
        let gaps = lineage_gaps(&both, &set(&["s1"]), &set(&["s0", "s1", "s2"]));
        assert_eq!(gaps, ["shard s3 is readable but its starting position is not persisted yet"]);
        // a merge child covers both parents: the first parent finishing is no gap
        let merged = ShardList::new(
            vec![
                ranged("s0", &[], 0, half, true),
                ranged("s1", &[], half + 1, u128::MAX, true),
                ranged("s4", &["s0", "s1"], 0, u128::MAX, false),
            ],
            0,
        );
        assert!(lineage_gaps(&merged, &set(&["s0"]), &set(&["s0", "s1", "s4"])).is_empty());
        // a parent trimmed from the list: nothing to check
        let trimmed = ShardList::new(vec![ranged("s4", &["s0", "s1"], 0, u128::MAX, false)], 0);
        assert!(lineage_gaps(&trimmed, &set(&["s0", "s1"]), &set(&["s4"])).is_empty());
    }

    #[test]
    fn a_first_listing_without_an_open_shard_is_a_gap() {
        // found by the simulator (seed 13): a first ListShards left out an open shard; the
        // assignment over the others let the committed watermark pass its records
        let third = u128::MAX / 3;
        let listed = ShardList::new(
            vec![ranged("s0", &[], 0, third, false), ranged("s2", &[], 2 * third + 1, u128::MAX, false)],
            0,
        );
        let all = set(&["s0", "s1", "s2"]);
        let gaps = lineage_gaps(&listed, &set(&[]), &all);
        assert_eq!(
            gaps,
            [format!(
                "the shard list's newest shards do not cover the hash key space from hash key {}: a listing left \
                 out an open shard",
                third + 1
            )]
        );
        let mut whole = listed.clone();
        whole.shards.push(ranged("s1", &[], third + 1, 2 * third, false));
        assert!(lineage_gaps(&whole, &set(&[]), &all).is_empty());
        // the last shard missing: the gap starts after the first
        let first_only = ShardList::new(vec![ranged("s0", &[], 0, third, false)], 0);
        assert!(lineage_gaps(&first_only, &set(&[]), &all)[0].contains(&format!("from hash key {}", third + 1)));
    }

    /// A resharding history over the whole hash key space: each step splits an open shard at a
    /// point inside it or merges two adjacent open shards. Each shard: (record, step created,
    /// step closed).
    fn history() -> impl Strategy<Value = Vec<(ShardRecord, usize, Option<usize>)>> {
        let roots = 1usize..4;
        let steps = proptest::collection::vec((any::<bool>(), any::<prop::sample::Index>(), 1u128..u128::MAX), 0..12);
        (roots, steps).prop_map(|(n, steps)| {
            let mut shards: Vec<(ShardRecord, usize, Option<usize>)> = Vec::new();
            let width = u128::MAX / n as u128;
            for i in 0..n {
                let start = i as u128 * width;
                let end = if i + 1 == n { u128::MAX } else { start + width - 1 };
                shards.push((ranged(&format!("shardId-{i:012}"), &[], start, end, false), 0, None));
            }
            for (step, (split, pick, cut)) in steps.into_iter().enumerate() {
                let step = step + 1;
                let mut open: Vec<usize> = (0..shards.len()).filter(|i| shards[*i].2.is_none()).collect();
                open.sort_by_key(|i| shards[*i].0.starting_hash_key.parse::<u128>().unwrap());
                let bounds = |i: usize| {
                    let r = &shards[i].0;
                    (r.starting_hash_key.parse::<u128>().unwrap(), r.ending_hash_key.parse::<u128>().unwrap())
                };
                let next_id =
                    |shards: &Vec<(ShardRecord, usize, Option<usize>)>| format!("shardId-{:012}", shards.len());
                if split || open.len() < 2 {
                    let p = open[pick.index(open.len())];
                    let (start, end) = bounds(p);
                    if start == end {
                        continue;
                    }
                    let at = start + cut % (end - start); // start..end-1: both halves non-empty
                    shards[p].2 = Some(step);
                    let pid = shards[p].0.shard_id.clone();
                    let a = ranged(&next_id(&shards), &[&pid], start, at, false);
                    shards.push((a, step, None));
                    let b = ranged(&next_id(&shards), &[&pid], at + 1, end, false);
                    shards.push((b, step, None));
                } else {
                    let i = pick.index(open.len() - 1);
                    let (x, y) = (open[i], open[i + 1]);
                    let (start, end) = (bounds(x).0, bounds(y).1);
                    shards[x].2 = Some(step);
                    shards[y].2 = Some(step);
                    let (px, py) = (shards[x].0.shard_id.clone(), shards[y].0.shard_id.clone());
                    let m = ranged(&next_id(&shards), &[&px, &py], start, end, false);
                    shards.push((m, step, None));
                }
            }
            shards
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// Whatever the leader's list lags behind (a listing as of step `k`, while readers
        /// finished shards closed later), when `lineage_gaps` finds nothing, every hash key's
        /// unread records are held: the first unfinished shard of the key's lineage, or an
        /// unfinished ancestor of it that it waits for, is readable, so assigned, and its
        /// owner's committed watermark holds everything that arrived after. And with the whole
        /// history listed there is never a gap (the leader is never stuck).
        #[test]
        fn without_gaps_every_hash_key_has_a_readable_holder(
            h in history(),
            view_at in any::<prop::sample::Index>(),
            finish in proptest::collection::vec(any::<bool>(), 40),
            keys in proptest::collection::vec(any::<u128>(), 16),
        ) {
            let last = h.iter().map(|(_, c, _)| *c).max().unwrap_or(0);
            let k = view_at.index(last + 1);
            // Finished: closed shards (in the full history) whose parents finished first, and
            // that the view lists (a shard is read only once listed and assigned).
            let by_id: BTreeMap<&str, &(ShardRecord, usize, Option<usize>)> =
                h.iter().map(|e| (e.0.shard_id.as_str(), e)).collect();
            let mut finished = BTreeSet::new();
            for (i, (r, created, closed)) in h.iter().enumerate() {
                if closed.is_some() && *created <= k && finish[i % finish.len()]
                    && r.parents().all(|p| finished.contains(p))
                {
                    finished.insert(r.shard_id.clone());
                }
            }
            let view = ShardList::new(
                h.iter()
                    .filter(|(_, c, _)| *c <= k)
                    .map(|(r, _, closed)| ShardRecord { closed: closed.is_some_and(|s| s <= k), ..r.clone() })
                    .collect(),
                0,
            );
            let positioned: BTreeSet<String> = view.shards.iter().map(|s| s.shard_id.clone()).collect();
            let gaps = lineage_gaps(&view, &finished, &positioned);
            if k == last {
                prop_assert!(gaps.is_empty(), "the whole history listed, yet gaps: {:?}", gaps);
            }
            if !gaps.is_empty() {
                return Ok(());
            }
            let assigned: BTreeSet<String> = readable(&view, &finished).into_iter().collect();
            let range = |r: &ShardRecord| -> (u128, u128) {
                (r.starting_hash_key.parse().unwrap(), r.ending_hash_key.parse().unwrap())
            };
            let mut probes = keys.clone();
            probes.extend(h.iter().flat_map(|(r, _, _)| [range(r).0, range(r).1]));
            for key in probes {
                // The key's lineage: the shards holding it, oldest first; the first unfinished.
                let mut chain: Vec<&ShardRecord> =
                    h.iter().map(|e| &e.0).filter(|r| range(r).0 <= key && key <= range(r).1).collect();
                chain.sort_by_key(|r| by_id[r.shard_id.as_str()].1);
                let Some(first) = chain.iter().find(|r| !finished.contains(&r.shard_id)) else { continue };
                // It or an unfinished ancestor it waits for must be assigned.
                let mut todo = vec![first.shard_id.as_str()];
                let mut seen = BTreeSet::new();
                let mut held = false;
                while let Some(id) = todo.pop() {
                    if !seen.insert(id) || finished.contains(id) {
                        continue;
                    }
                    if assigned.contains(id) {
                        held = true;
                        break;
                    }
                    todo.extend(by_id[id].0.parents());
                }
                prop_assert!(held, "hash key {} (first unfinished shard {}) is held by no assigned shard; view at step {}, finished {:?}, assigned {:?}",
                    key, first.shard_id, k, finished, assigned);
            }
        }
    }

    #[test]
    fn committed_watermark_needs_a_report_of_the_current_generation_from_every_listed_task() {
        let a = Assignment {
            generation: 7,
            leader: "task-0000000001".into(),
            tasks: [
                ("task-0000000001".to_string(), vec!["shardId-0".to_string()]),
                ("task-0000000002".to_string(), vec!["shardId-1".to_string()]),
                ("task-0000000003".to_string(), vec![]),
            ]
            .into_iter()
            .collect(),
            updated_at_ms: 0,
            error: None,
            rebalance: None,
        };
        let report = |generation, w| WatermarkReport { generation, watermark_ms: w, updated_at_ms: 0 };
        let mut reports: BTreeMap<String, WatermarkReport> = BTreeMap::new();
        let e = committed_watermark(&a, &reports).unwrap_err();
        assert!(e.contains("task task-0000000001 has no watermark report (assignment generation 7)"), "{e}");
        assert!(e.contains("task-0000000003"), "a task with no shard counts too: {e}");
        reports.insert("task-0000000001".into(), report(7, Some(500)));
        reports.insert("task-0000000002".into(), report(6, Some(100)));
        reports.insert("task-0000000003".into(), report(7, Some(900)));
        let e = committed_watermark(&a, &reports).unwrap_err();
        assert_eq!(e, "task task-0000000002 reported for assignment generation 6, not the current generation 7");
        reports.insert("task-0000000002".into(), report(7, None));
        let e = committed_watermark(&a, &reports).unwrap_err();
        assert!(
            e.starts_with("task task-0000000002 has no committed watermark yet for assignment generation 7"),
            "{e}"
        );
        reports.insert("task-0000000002".into(), report(7, Some(300)));
        assert_eq!(committed_watermark(&a, &reports), Ok(300), "the minimum");
        reports.insert("task-0000000009".into(), report(3, Some(1)));
        assert_eq!(committed_watermark(&a, &reports), Ok(300), "a task the assignment does not list is not counted");
        let e = committed_watermark(&Assignment { error: Some("stream re-created".into()), ..a.clone() }, &reports)
            .unwrap_err();
        assert_eq!(e, "assignment generation 7 is in error: stream re-created");
        let e = committed_watermark(&Assignment { tasks: BTreeMap::new(), ..a }, &reports).unwrap_err();
        assert_eq!(e, "assignment generation 7 lists no task");
    }
}
