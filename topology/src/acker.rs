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

    /// A generator seeded from the process's random hasher keys (random per thread, and
    /// different for every call) and `salt`. No clock: a process whose randomness is seeded (the
    /// simulator) gets the same ids on every run.
    pub fn from_entropy(salt: u64) -> Self {
        use std::hash::BuildHasher;
        let seed = std::collections::hash_map::RandomState::new().hash_one(salt);
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

pub(crate) type U64BuildHasher = BuildHasherDefault<U64Hasher>;

pub(crate) type U64Map<V> = HashMap<u64, V, U64BuildHasher>;

/// Up to this many roots, a child's anchors are searched in place for a root; beyond, through
/// an index (a window's aggregate anchored to thousands of inputs stays linear).
const SCAN_ROOTS: usize = 16;

/// Adds a child anchored to `parents`: for each parent a fresh edge id is XORed into the parent's
/// ack value and into the child's value for each of the parent's roots (Storm's rule). The
/// child's anchors hold each root once, in the order the roots were first seen.
pub fn anchor_child<'a>(parents: impl IntoIterator<Item = (&'a Anchors, &'a mut u64)>, rng: &mut EdgeRng) -> Anchors {
    let mut child = Anchors::new();
    // the position of each root in `child`, once it holds more than `SCAN_ROOTS`
    let mut index: Option<U64Map<usize>> = None;
    for (anchors, ack_val) in parents {
        if anchors.is_empty() {
            continue;
        }
        let edge = rng.next_edge();
        *ack_val ^= edge;
        for &(root, _) in anchors {
            let at = match &index {
                Some(index) => index.get(&root).copied(),
                None => {
                    probe(child.len());
                    child.iter().position(|(r, _)| *r == root)
                }
            };
            match at {
                Some(i) => child[i].1 ^= edge,
                None => {
                    child.push((root, edge));
                    match &mut index {
                        Some(index) => {
                            index.insert(root, child.len() - 1);
                        }
                        None if child.len() > SCAN_ROOTS => {
                            index = Some(child.iter().enumerate().map(|(i, &(r, _))| (r, i)).collect());
                        }
                        None => {}
                    }
                }
            }
        }
    }
    child
}

/// Sorts ack-tree updates by root and XORs those of one root together (they are sent together).
pub(crate) fn merge_roots(updates: &mut Vec<(u64, u64)>) {
    if updates.windows(2).all(|w| w[0].0 < w[1].0) {
        return;
    }
    updates.sort_unstable_by_key(|&(root, _)| root);
    updates.dedup_by(|next, kept| {
        if next.0 == kept.0 {
            kept.1 ^= next.1;
            true
        } else {
            false
        }
    });
}

/// Adds a child anchored to inputs whose ack-tree updates are `updates` (one per root, see
/// [`merge_roots`]): a fresh edge id per root, XORed into the update and given to the child.
pub(crate) fn anchor_to_updates(updates: &mut [(u64, u64)], rng: &mut EdgeRng) -> Anchors {
    updates
        .iter_mut()
        .map(|(root, x)| {
            let edge = rng.next_edge();
            *x ^= edge;
            (*root, edge)
        })
        .collect()
}

#[cfg(test)]
thread_local! {
    /// Roots compared by [`anchor_child`]'s in-place search, on this thread.
    static PROBES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Counts the roots an in-place search compares (tests only).
#[inline(always)]
fn probe(compared: usize) {
    #[cfg(test)]
    PROBES.with(|p| p.set(p.get() + compared));
    #[cfg(not(test))]
    let _ = compared;
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
/// Roots come from a per-task sequence ([`make_root`]), so they are kept in a ring indexed by
/// `root - base` (no hashing): a new root is pushed at the back, completed roots leave holes,
/// and the holes at the front are popped. Roots out of sequence, and old roots that would keep
/// a mostly empty ring alive (a tree that takes long to complete), live in a hash map instead,
/// so memory stays bounded by the number of pending trees. Deadlines grow with the sequence
/// (`now + timeout`), so the ring's front holds the next to expire.
///
/// Each root completes at most once: the first of ack, fail or timeout removes it, and later
/// updates for it are ignored.
#[derive(Debug)]
pub struct PendingTrees<M> {
    ring: VecDeque<Option<Entry<M>>>,
    /// The root of `ring[0]`.
    base: u64,
    /// Live entries in `ring`.
    in_ring: usize,
    others: U64Map<Entry<M>>,
}

impl<M> Default for PendingTrees<M> {
    fn default() -> Self {
        PendingTrees { ring: VecDeque::new(), base: 0, in_ring: 0, others: U64Map::default() }
    }
}

impl<M> PendingTrees<M> {
    /// Number of trees in flight.
    pub fn len(&self) -> usize {
        self.in_ring + self.others.len()
    }

    /// True when nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Starts tracking `root` with initial value `xor` (the XOR of the edges sent).
    #[inline]
    pub fn insert(&mut self, root: u64, msg: M, xor: u64, deadline: Instant) {
        let entry = Entry { msg, xor, deadline };
        if self.ring.is_empty() {
            self.base = root;
        }
        let idx = root.wrapping_sub(self.base);
        if idx == self.ring.len() as u64 && (self.others.is_empty() || !self.others.contains_key(&root)) {
            self.ring.push_back(Some(entry));
            self.in_ring += 1;
            // a ring mostly made of holes: move its oldest live entries out
            if self.ring.len() > 4 * self.in_ring + 64 {
                self.thin();
            }
        } else {
            self.insert_other(root, entry);
        }
    }

    #[cold]
    #[inline(never)]
    fn insert_other(&mut self, root: u64, entry: Entry<M>) {
        // a root already in the ring moves to the map
        if self.take_slot(root).is_none() {
            self.pop_holes();
        }
        self.others.insert(root, entry);
    }

    /// Moves the live entries of the ring's older half to the map.
    #[cold]
    #[inline(never)]
    fn thin(&mut self) {
        let keep = self.ring.len() / 2;
        while self.ring.len() > keep {
            let root = self.base;
            self.base = self.base.wrapping_add(1);
            if let Some(Some(e)) = self.ring.pop_front() {
                self.in_ring -= 1;
                self.others.insert(root, e);
            }
        }
        self.pop_holes();
    }

    #[inline]
    fn pop_holes(&mut self) {
        while let Some(None) = self.ring.front() {
            self.ring.pop_front();
            self.base = self.base.wrapping_add(1);
        }
    }

    #[inline]
    fn slot(&mut self, root: u64) -> Option<&mut Option<Entry<M>>> {
        let idx = root.wrapping_sub(self.base);
        if idx < self.ring.len() as u64 { self.ring.get_mut(idx as usize) } else { None }
    }

    /// Removes a ring entry, popping the holes at the front.
    #[inline]
    fn take_slot(&mut self, root: u64) -> Option<Entry<M>> {
        let e = self.slot(root)?.take()?;
        self.in_ring -= 1;
        self.pop_holes();
        Some(e)
    }

    /// The message id of a pending root.
    pub fn get(&self, root: u64) -> Option<&M> {
        let idx = root.wrapping_sub(self.base);
        let in_ring = if idx < self.ring.len() as u64 { self.ring.get(idx as usize) } else { None };
        match in_ring {
            Some(Some(e)) => Some(&e.msg),
            _ => self.others.get(&root).map(|e| &e.msg),
        }
    }

    /// XORs an update into a root; returns the message id when the tree completes.
    #[inline]
    pub fn apply(&mut self, root: u64, xor: u64) -> Option<M> {
        if let Some(Some(e)) = self.slot(root) {
            e.xor ^= xor;
            return if e.xor == 0 { self.take_slot(root).map(|e| e.msg) } else { None };
        }
        if self.others.is_empty() { None } else { self.apply_other(root, xor) }
    }

    #[cold]
    #[inline(never)]
    fn apply_other(&mut self, root: u64, xor: u64) -> Option<M> {
        // one lookup: the entry is removed through the same slot when the tree completes
        match self.others.entry(root) {
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
        match self.take_slot(root) {
            Some(e) => Some(e.msg),
            None => self.others.remove(&root).map(|e| e.msg),
        }
    }

    /// Moves the deadline of the `n` roots from `first` on (a run of one task's sequence) to
    /// `deadline`, a time at or after every deadline pending: the ring stays in deadline order.
    /// For tuples whose emit was held back by a wait (a `next_tuple` that awaited an outside
    /// read after emitting, or before emitting with the clock read before the call).
    #[cold]
    #[inline(never)]
    pub fn extend_deadlines(&mut self, first: u64, n: u64, deadline: Instant) {
        let from = first.wrapping_sub(self.base);
        let start = if from < self.ring.len() as u64 { from as usize } else { 0 };
        // roots before `base` already left the ring (completed or expired); those at or after
        // `first` and below `first + n` are the run
        for (i, slot) in self.ring.iter_mut().enumerate().skip(start) {
            let root = self.base.wrapping_add(i as u64);
            if root.wrapping_sub(first) < n
                && let Some(e) = slot
            {
                e.deadline = e.deadline.max(deadline);
            }
        }
        if !self.others.is_empty() {
            for (root, e) in self.others.iter_mut() {
                if root.wrapping_sub(first) < n {
                    e.deadline = e.deadline.max(deadline);
                }
            }
        }
    }

    /// Removes the trees whose deadline is at or before `now`, appending their message ids.
    pub fn expire(&mut self, now: Instant, out: &mut Vec<M>) {
        // the ring is in deadline order: expire from the front
        while let Some(front) = self.ring.front() {
            match front {
                Some(e) if e.deadline > now => break,
                Some(_) => {
                    if let Some(Some(e)) = self.ring.pop_front() {
                        self.in_ring -= 1;
                        out.push(e.msg);
                    }
                }
                None => {
                    self.ring.pop_front();
                }
            }
            self.base = self.base.wrapping_add(1);
        }
        if !self.others.is_empty() {
            let expired: Vec<u64> = self.others.iter().filter(|(_, e)| e.deadline <= now).map(|(r, _)| *r).collect();
            for r in expired {
                if let Some(e) = self.others.remove(&r) {
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
    fn extend_deadlines_moves_only_the_run_and_keeps_deadline_order() {
        let now = Instant::now();
        let (t1, t2, later) =
            (now + Duration::from_secs(1), now + Duration::from_secs(2), now + Duration::from_secs(9));
        let mut p = PendingTrees::default();
        for r in 10..14 {
            p.insert(r, r, 1, t1);
        }
        for r in 14..18 {
            p.insert(r, r, 1, t2);
        }
        // a root of the run completed meanwhile; one out of sequence lives in the map
        assert_eq!(p.apply(15, 1), Some(15));
        p.insert(40, 40, 1, t2);
        p.extend_deadlines(14, 4, later);
        p.extend_deadlines(40, 1, later);
        let mut out = Vec::new();
        p.expire(now + Duration::from_secs(3), &mut out);
        out.sort_unstable();
        assert_eq!(out, vec![10, 11, 12, 13], "the roots before the run keep their deadline");
        p.expire(later, &mut out);
        out.sort_unstable();
        assert_eq!(out, vec![10, 11, 12, 13, 14, 16, 17, 40]);
        assert!(p.is_empty());
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
    fn ring_stays_bounded() {
        let now = Instant::now();
        let mut p = PendingTrees::default();
        for i in 0..10_000u64 {
            p.insert(i, i, 1, now);
            assert_eq!(p.apply(i, 1), Some(i));
        }
        assert!(p.ring.len() <= 1);
        // one tree that never completes does not keep a ring of holes alive
        p.insert(10_000, 10_000, 1, now + Duration::from_secs(60));
        for i in 10_001..20_000u64 {
            p.insert(i, i, 1, now);
            assert_eq!(p.apply(i, 1), Some(i));
        }
        assert!(p.ring.len() <= 4 * p.in_ring + 65, "{}", p.ring.len());
        assert_eq!(p.len(), 1);
        assert_eq!(p.get(10_000), Some(&10_000));
        assert_eq!(p.apply(10_000, 1), Some(10_000));
        assert!(p.is_empty());
    }

    #[test]
    fn out_of_sequence_roots() {
        let now = Instant::now();
        let mut p = PendingTrees::default();
        for r in [5u64, 3, 6, 100, 7, 5] {
            p.insert(r, r, r, now + Duration::from_secs(r));
        }
        // 5 was inserted twice: the second replaces the first
        assert_eq!(p.len(), 5);
        assert_eq!(p.apply(3, 3), Some(3));
        assert_eq!(p.apply(5, 5), Some(5));
        assert_eq!(p.apply(5, 5), None);
        assert_eq!(p.fail(100), Some(100));
        let mut out = vec![];
        p.expire(now + Duration::from_secs(6), &mut out);
        assert_eq!(out, vec![6]);
        p.expire(now + Duration::from_secs(7), &mut out);
        assert_eq!(out, vec![6, 7]);
        assert!(p.is_empty());
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

    /// Issue 33, point 16: a child anchored to many inputs of distinct roots (a window's
    /// aggregate) finds each root in constant time once it holds more than a few: the roots
    /// compared grow linearly, not with the square of the inputs (the old linear search compared
    /// 400,000,000 roots here). The child holds each root once, in order.
    #[test]
    fn anchor_child_is_linear_in_the_roots() {
        let mut rng = EdgeRng::new(7);
        let n = 20_000u64;
        // each root twice, as two inputs of one spout tuple would be
        let parents: Vec<Anchors> = (0..2 * n).map(|i| [(make_root(1, i % n), i + 1)].into_iter().collect()).collect();
        let mut vals = vec![0u64; parents.len()];
        PROBES.with(|p| p.set(0));
        let child = anchor_child(parents.iter().zip(vals.iter_mut()), &mut rng);
        let probes = PROBES.with(|p| p.get());
        assert!(probes <= SCAN_ROOTS * SCAN_ROOTS, "{probes} roots compared for {} parents", parents.len());
        assert_eq!(
            child.iter().map(|&(r, _)| r).collect::<Vec<_>>(),
            (0..n).map(|i| make_root(1, i)).collect::<Vec<_>>()
        );
        // the two parents of a root and the child's anchor to it cancel out
        for (i, &(_, v)) in child.iter().enumerate() {
            assert_eq!(v, vals[i] ^ vals[i + n as usize]);
        }
    }

    #[test]
    fn merged_updates_anchor_a_child_once_per_root() {
        let mut updates = vec![(5u64, 1u64), (3, 2), (5, 4), (9, 8), (3, 16)];
        merge_roots(&mut updates);
        assert_eq!(updates, [(3, 18), (5, 5), (9, 8)]);
        let before = updates.clone();
        let child = anchor_to_updates(&mut updates, &mut EdgeRng::new(3));
        assert_eq!(child.iter().map(|&(r, _)| r).collect::<Vec<_>>(), [3, 5, 9]);
        for ((b, a), c) in before.iter().zip(&updates).zip(&child) {
            assert_eq!(b.1 ^ a.1, c.1, "the child's edge is XORed into its root's update");
        }
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
