//! At-least-once tracking: Storm's XOR ack trees, kept by the spout task that owns each root.
//!
//! Every tracked spout tuple gets a root id; every copy of a tuple sent to a task gets a random
//! 64-bit edge id. The spout XORs the edge ids of the copies it sends into the root's value; a bolt
//! that acks an input sends `edge(input) ^ edges(children anchored to it)` for each root of the
//! input. The value returns to 0 exactly when every edge has been acked (up to a 2^-64 chance of a
//! false zero). The root id's high bits name the spout task, so bolts send updates straight to
//! that task's ack channel: there are no separate acker tasks.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use tokio::time::Instant;

pub(crate) use crate::tuple::Anchors;

const SEQ_BITS: u32 = 40;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;

/// Builds a root id from the owning spout task's ack slot and a per-task sequence number.
pub fn make_root(slot: usize, seq: u64) -> u64 {
    ((slot as u64) << SEQ_BITS) | (seq & SEQ_MASK)
}

/// The ack slot (spout task) owning a root id.
pub fn root_slot(root: u64) -> usize {
    (root >> SEQ_BITS) as usize
}

/// A small, fast generator of non-zero edge ids (SplitMix64), one per task.
#[derive(Debug, Clone)]
pub struct EdgeRng(u64);

impl EdgeRng {
    /// A generator seeded from `seed` (mixed, so nearby seeds give unrelated streams).
    pub fn new(seed: u64) -> Self {
        EdgeRng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    /// A generator seeded from the process's random hasher keys, the clock and `salt`.
    pub fn from_entropy(salt: u64) -> Self {
        use std::hash::BuildHasher;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let seed = std::collections::hash_map::RandomState::new().hash_one((nanos, salt));
        EdgeRng::new(seed)
    }

    /// The next non-zero edge id.
    #[inline]
    pub fn next_edge(&mut self) -> u64 {
        loop {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            if z != 0 {
                return z;
            }
        }
    }

    /// A value in `0..n` (n > 0).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        ((self.next_edge() as u128 * n as u128) >> 64) as usize
    }
}

/// Identity-like hasher for u64 keys that are already well spread (root ids, task ids).
#[derive(Default, Clone, Copy)]
pub(crate) struct U64Hasher(u64);

impl Hasher for U64Hasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(*b)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

pub(crate) type U64Map<V> = HashMap<u64, V, BuildHasherDefault<U64Hasher>>;

/// Adds a child anchored to `parents`: for each parent a fresh edge id is XORed into the parent's
/// ack value and into the child's value for each of the parent's roots (Storm's rule).
pub fn anchor_child<'a>(parents: impl IntoIterator<Item = (&'a Anchors, &'a mut u64)>, rng: &mut EdgeRng) -> Anchors {
    let mut child = Anchors::new();
    for (anchors, ack_val) in parents {
        if anchors.is_empty() {
            continue;
        }
        let edge = rng.next_edge();
        *ack_val ^= edge;
        for &(root, _) in anchors {
            match child.iter_mut().find(|(r, _)| *r == root) {
                Some((_, v)) => *v ^= edge,
                None => child.push((root, edge)),
            }
        }
    }
    child
}

/// The `(root, xor)` updates that ack a tuple with the given anchors and accumulated ack value.
#[inline]
pub fn ack_updates(anchors: &Anchors, ack_val: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
    anchors.iter().map(move |&(root, edge)| (root, edge ^ ack_val))
}

/// Ack-tree updates sent by a bolt task to one spout task.
#[derive(Debug, Default)]
pub(crate) struct AckBatch {
    /// `(root, xor)` updates.
    pub(crate) xors: Vec<(u64, u64)>,
    /// Roots to fail.
    pub(crate) fails: Vec<u64>,
}

impl AckBatch {
    pub(crate) fn is_empty(&self) -> bool {
        self.xors.is_empty() && self.fails.is_empty()
    }
}

#[derive(Debug)]
struct Entry<M> {
    msg: M,
    xor: u64,
    deadline: Instant,
}

/// The pending trees of one spout task, with their message ids and deadlines.
///
/// Each root completes at most once: the first of ack, fail or timeout removes it, and later
/// updates for it are ignored.
#[derive(Debug)]
pub struct PendingTrees<M> {
    entries: U64Map<Entry<M>>,
    deadlines: VecDeque<(Instant, u64)>,
}

impl<M> Default for PendingTrees<M> {
    fn default() -> Self {
        PendingTrees { entries: U64Map::default(), deadlines: VecDeque::new() }
    }
}

impl<M> PendingTrees<M> {
    /// Number of trees in flight.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Starts tracking `root` with initial value `xor` (the XOR of the edges sent).
    pub fn insert(&mut self, root: u64, msg: M, xor: u64, deadline: Instant) {
        self.entries.insert(root, Entry { msg, xor, deadline });
        self.deadlines.push_back((deadline, root));
        // Acked roots leave stale deadline records behind; compact so memory stays bounded by
        // the number of pending trees.
        if self.deadlines.len() > 2 * self.entries.len() + 64 {
            // Trees mostly complete in emit order: drop the stale records at the front first
            // (one lookup each), and scan the whole queue only when that is not enough.
            while let Some(&(d, r)) = self.deadlines.front() {
                if self.entries.get(&r).is_some_and(|e| e.deadline == d) {
                    break;
                }
                self.deadlines.pop_front();
            }
            if self.deadlines.len() > self.entries.len() + self.entries.len() / 2 + 64 {
                let entries = &self.entries;
                self.deadlines.retain(|(d, r)| entries.get(r).is_some_and(|e| e.deadline == *d));
            }
        }
    }

    /// The message id of a pending root.
    pub fn get(&self, root: u64) -> Option<&M> {
        self.entries.get(&root).map(|e| &e.msg)
    }

    /// XORs an update into a root; returns the message id when the tree completes.
    pub fn apply(&mut self, root: u64, xor: u64) -> Option<M> {
        // one lookup: the entry is removed through the same slot when the tree completes
        match self.entries.entry(root) {
            std::collections::hash_map::Entry::Occupied(mut o) => {
                let e = o.get_mut();
                e.xor ^= xor;
                if e.xor == 0 { Some(o.remove().msg) } else { None }
            }
            std::collections::hash_map::Entry::Vacant(_) => None,
        }
    }

    /// Fails a root; returns its message id if it was still pending.
    pub fn fail(&mut self, root: u64) -> Option<M> {
        self.entries.remove(&root).map(|e| e.msg)
    }

    /// Removes the trees whose deadline is at or before `now`, appending their message ids.
    pub fn expire(&mut self, now: Instant, out: &mut Vec<M>) {
        while let Some(&(d, root)) = self.deadlines.front() {
            if d > now {
                break;
            }
            self.deadlines.pop_front();
            if self.entries.get(&root).is_some_and(|e| e.deadline == d) {
                if let Some(e) = self.entries.remove(&root) {
                    out.push(e.msg);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn root_slots_roundtrip() {
        let r = make_root(17, 12345);
        assert_eq!(root_slot(r), 17);
        assert_ne!(make_root(1, 5), make_root(2, 5));
    }

    #[test]
    fn edges_nonzero_and_spread() {
        let mut rng = EdgeRng::new(0);
        let v: Vec<u64> = (0..1000).map(|_| rng.next_edge()).collect();
        assert!(v.iter().all(|&e| e != 0));
        let set: std::collections::HashSet<_> = v.iter().collect();
        assert_eq!(set.len(), 1000);
        assert!((0..1000).all(|_| rng.below(7) < 7));
    }

    #[test]
    fn tree_lifecycle() {
        let now = Instant::now();
        let mut p = PendingTrees::default();
        p.insert(1, "a", 0b1010, now + Duration::from_secs(1));
        assert_eq!(p.apply(1, 0b1000), None);
        assert_eq!(p.apply(1, 0b0010), Some("a"));
        assert_eq!(p.apply(1, 0b0010), None, "completed root is ignored");
        p.insert(2, "b", 7, now + Duration::from_secs(1));
        assert_eq!(p.fail(2), Some("b"));
        assert_eq!(p.fail(2), None);
        p.insert(3, "c", 7, now + Duration::from_secs(1));
        let mut out = vec![];
        p.expire(now, &mut out);
        assert!(out.is_empty());
        p.expire(now + Duration::from_secs(1), &mut out);
        assert_eq!(out, vec!["c"]);
        assert!(p.is_empty());
    }

    #[test]
    fn deadline_records_are_compacted() {
        let now = Instant::now();
        let mut p = PendingTrees::default();
        for i in 0..10_000u64 {
            p.insert(i, i, 1, now);
            assert_eq!(p.apply(i, 1), Some(i));
        }
        assert!(p.deadlines.len() <= 64 + 1);
    }

    #[test]
    fn multi_anchor_child() {
        let mut rng = EdgeRng::new(1);
        let a: Anchors = [(1u64, 11u64), (2, 22)].into_iter().collect();
        let b: Anchors = [(2u64, 33u64)].into_iter().collect();
        let (mut va, mut vb) = (0u64, 0u64);
        let child = anchor_child([(&a, &mut va), (&b, &mut vb)], &mut rng);
        assert_eq!(child.len(), 2);
        assert_eq!(child[0].1, va);
        assert_eq!(child[1].1, va ^ vb);
    }

    mod props {
        use std::collections::HashSet;
        use std::time::Duration;

        use proptest::prelude::*;

        use super::super::*;

        /// A tuple in a random ack DAG: spout roots or children of up to three earlier nodes.
        #[derive(Debug, Clone)]
        enum Node {
            Root(usize),
            Child(Vec<usize>),
        }

        fn dag() -> impl Strategy<Value = (usize, Vec<Node>)> {
            // every root has at least one tuple (a tracked emit that reaches no task is acked at once)
            (1usize..4).prop_flat_map(|roots| (Just(roots), roots..40usize)).prop_flat_map(|(roots, n)| {
                let nodes: Vec<BoxedStrategy<Node>> = (0..n)
                    .map(|i| {
                        if i < roots {
                            Just(Node::Root(i)).boxed()
                        } else {
                            prop_oneof![
                                (0..roots).prop_map(Node::Root),
                                proptest::collection::vec(0..i, 1..4).prop_map(Node::Child),
                            ]
                            .boxed()
                        }
                    })
                    .collect();
                (Just(roots), nodes)
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// A root's tree completes exactly when the last anchored tuple of it is acked, and never if
            /// one of them is left unacked.
            #[test]
            fn ack_tree_completes_iff_every_edge_is_acked(
                (roots, nodes) in dag(),
                seed in any::<u64>(),
                skip in proptest::collection::vec(any::<bool>(), 40),
                order_seed in any::<u64>(),
            ) {
                let mut rng = EdgeRng::new(seed);
                let now = tokio::time::Instant::now();
                let mut pending = PendingTrees::default();
                let mut root_xor = vec![0u64; roots];
                let root_id = |r: usize| make_root(0, r as u64);
                let mut anchors: Vec<Anchors> = Vec::new();
                let mut ack_vals: Vec<u64> = Vec::new();
                for node in &nodes {
                    let a = match node {
                        Node::Root(r) => {
                            let e = rng.next_edge();
                            root_xor[*r] ^= e;
                            let mut a = Anchors::new();
                            a.push((root_id(*r), e));
                            a
                        }
                        Node::Child(parents) => {
                            let mut uniq = parents.clone();
                            uniq.sort_unstable();
                            uniq.dedup();
                            let mut vals: Vec<u64> = uniq.iter().map(|&p| ack_vals[p]).collect();
                            let a = anchor_child(
                                uniq.iter().map(|&p| &anchors[p]).zip(vals.iter_mut()),
                                &mut rng,
                            );
                            for (p, v) in uniq.iter().zip(vals) {
                                ack_vals[*p] = v;
                            }
                            a
                        }
                    };
                    anchors.push(a);
                    ack_vals.push(0);
                }
                for (r, x) in root_xor.iter().enumerate() {
                    pending.insert(root_id(r), r, *x, now + Duration::from_secs(30));
                }
                // which nodes belong to each root's tree
                let members: Vec<HashSet<usize>> = (0..roots)
                    .map(|r| (0..nodes.len()).filter(|&i| anchors[i].iter().any(|(x, _)| *x == root_id(r))).collect())
                    .collect();
                // ack the non-skipped nodes in a shuffled order
                let mut order: Vec<usize> = (0..nodes.len()).filter(|&i| !skip[i]).collect();
                let mut orng = EdgeRng::new(order_seed);
                for i in (1..order.len()).rev() {
                    let j = (orng.next_edge() % (i as u64 + 1)) as usize;
                    order.swap(i, j);
                }
                let mut acked: HashSet<usize> = HashSet::new();
                let mut completed: HashSet<usize> = HashSet::new();
                for &i in &order {
                    acked.insert(i);
                    for (root, x) in ack_updates(&anchors[i], ack_vals[i]) {
                        if let Some(r) = pending.apply(root, x) {
                            prop_assert!(members[r].is_subset(&acked), "root {r} completed before all its tuples were acked");
                            prop_assert!(completed.insert(r), "root {r} completed twice");
                        }
                    }
                }
                for (r, m) in members.iter().enumerate() {
                    let all = m.is_subset(&acked);
                    prop_assert_eq!(completed.contains(&r), all, "root {} complete={} but all-acked={}", r, completed.contains(&r), all);
                }
                prop_assert_eq!(pending.len(), roots - completed.len());
            }
        }
    }
}
