//! Groupings: how a stream's tuples are spread over the tasks of a subscribing bolt.
//!
//! A [`Grouping`] is a typed strategy checked at build time; each emitting task gets its own
//! [`Router`] from it, which picks target task indices per tuple (timely's pact, Storm's
//! `CustomStreamGrouping`). Implement both traits for a custom grouping.

use std::fmt;
use std::hash::Hasher;

use crate::acker::EdgeRng;
use crate::tuple::Fields;
use crate::value::Value;

/// What a router knows about its place in the topology.
#[derive(Debug, Clone, Copy)]
pub struct RouteContext {
    /// Index of the emitting task within its component.
    pub source_task: usize,
    /// Number of tasks of the subscribing component.
    pub target_tasks: usize,
}

/// Picks target tasks for tuples; one instance per emitting task and subscription.
pub trait Router: Send {
    /// Appends target task indices (each `< target_tasks`) for a tuple with these values.
    fn route(&mut self, values: &[Value], targets: &mut Vec<usize>);
}

/// A grouping strategy.
pub trait Grouping: fmt::Debug + Send + Sync + 'static {
    /// A short name for messages.
    fn name(&self) -> &'static str;

    /// Checks the grouping against the subscribed stream's fields; returns the first field that
    /// is not declared.
    fn check_fields(&self, fields: &Fields) -> Result<(), String> {
        let _ = fields;
        Ok(())
    }

    /// Direct groupings receive only `emit_direct` tuples, at the task the emitter chooses.
    fn is_direct(&self) -> bool {
        false
    }

    /// A router for one emitting task.
    fn router(&self, fields: &Fields, ctx: RouteContext) -> Box<dyn Router>;

    /// The engine's statically dispatched form of a built-in grouping's router; `None` (the
    /// default) makes the engine call [`Grouping::router`]. Not for implementations outside this
    /// crate.
    #[doc(hidden)]
    fn builtin_router(&self, fields: &Fields, ctx: RouteContext) -> Option<BuiltinRouter> {
        let _ = (fields, ctx);
        None
    }
}

/// A built-in router, opaque outside this crate (see [`Grouping::builtin_router`]).
#[doc(hidden)]
pub struct BuiltinRouter(AnyRouter);

/// The router of one subscription as the engine holds it: the built-in single-target routers
/// without a virtual call, everything else boxed.
#[repr(u8)]
pub(crate) enum AnyRouter {
    RoundRobin(RoundRobin),
    Fields(ByFields),
    Dyn(Box<dyn Router>),
}

impl AnyRouter {
    pub(crate) fn new(g: &dyn Grouping, fields: &Fields, ctx: RouteContext) -> Self {
        match g.builtin_router(fields, ctx) {
            Some(BuiltinRouter(r)) => r,
            None => AnyRouter::Dyn(g.router(fields, ctx)),
        }
    }

    /// The one target index of a single-target router (`< target_tasks`), or `None` when the
    /// router may pick any number of targets (use [`AnyRouter::route`]).
    #[inline(always)]
    pub(crate) fn route_one(&mut self, values: &[Value]) -> Option<usize> {
        match self {
            AnyRouter::RoundRobin(r) => Some(r.next_index()),
            AnyRouter::Fields(r) => Some(r.index(values)),
            AnyRouter::Dyn(_) => None,
        }
    }

    #[inline]
    pub(crate) fn route(&mut self, values: &[Value], targets: &mut Vec<usize>) {
        match self {
            AnyRouter::RoundRobin(r) => targets.push(r.next_index()),
            AnyRouter::Fields(r) => targets.push(r.index(values)),
            AnyRouter::Dyn(r) => r.route(values, targets),
        }
    }
}

/// Round-robin over all target tasks, starting at an offset that differs per emitting task.
#[derive(Debug, Clone, Copy, Default)]
pub struct Shuffle;

pub(crate) struct RoundRobin {
    next: usize,
    n: usize,
}

impl RoundRobin {
    fn new(ctx: RouteContext) -> Self {
        let mut rng = EdgeRng::new(ctx.source_task as u64);
        let n = ctx.target_tasks.max(1);
        RoundRobin { next: rng.below(n), n }
    }

    #[inline(always)]
    fn next_index(&mut self) -> usize {
        let i = self.next;
        self.next += 1;
        if self.next == self.n {
            self.next = 0;
        }
        i
    }
}

impl Router for RoundRobin {
    fn route(&mut self, _values: &[Value], targets: &mut Vec<usize>) {
        targets.push(self.next_index());
    }
}

impl Grouping for Shuffle {
    fn name(&self) -> &'static str {
        "shuffle"
    }
    fn router(&self, _fields: &Fields, ctx: RouteContext) -> Box<dyn Router> {
        Box::new(RoundRobin::new(ctx))
    }
    fn builtin_router(&self, _fields: &Fields, ctx: RouteContext) -> Option<BuiltinRouter> {
        Some(BuiltinRouter(AnyRouter::RoundRobin(RoundRobin::new(ctx))))
    }
}

/// Like [`Shuffle`], but prefers tasks in the emitter's worker process. A local topology runs in
/// one process, so every task is local and this is a shuffle.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalOrShuffle;

impl Grouping for LocalOrShuffle {
    fn name(&self) -> &'static str {
        "local_or_shuffle"
    }
    fn router(&self, fields: &Fields, ctx: RouteContext) -> Box<dyn Router> {
        Shuffle.router(fields, ctx)
    }
    fn builtin_router(&self, fields: &Fields, ctx: RouteContext) -> Option<BuiltinRouter> {
        Shuffle.builtin_router(fields, ctx)
    }
}

/// Tuples with equal values in the named fields go to the same task.
#[derive(Debug, Clone)]
pub struct FieldsGrouping {
    fields: Vec<String>,
}

impl FieldsGrouping {
    /// Groups by these fields.
    pub fn new<S: AsRef<str>>(fields: &[S]) -> Self {
        FieldsGrouping { fields: fields.iter().map(|f| f.as_ref().to_owned()).collect() }
    }
}

/// The task a key goes to under fields grouping: a fixed hash of the values, so every emitting
/// task agrees.
pub fn fields_task(key: &[&Value], n: usize) -> usize {
    let mut h = KeyHasher::default();
    for v in key {
        v.hash_into(&mut h);
    }
    bucket(h.finish(), n)
}

/// Maps a hash to `0..n` (multiply-shift on the well-mixed high bits).
#[inline(always)]
fn bucket(h: u64, n: usize) -> usize {
    ((u128::from(h) * n as u128) >> 64) as usize
}

pub(crate) struct ByFields {
    idx: Vec<usize>,
    n: usize,
}

impl ByFields {
    fn new(g: &FieldsGrouping, fields: &Fields, ctx: RouteContext) -> Self {
        let idx = g.fields.iter().filter_map(|f| fields.index_of(f)).collect();
        ByFields { idx, n: ctx.target_tasks.max(1) }
    }

    #[inline(always)]
    fn index(&self, values: &[Value]) -> usize {
        let mut h = KeyHasher::default();
        if let [i] = *self.idx {
            // the usual single-field key
            values.get(i).unwrap_or(&Value::Null).hash_into(&mut h);
        } else {
            for &i in &self.idx {
                values.get(i).unwrap_or(&Value::Null).hash_into(&mut h);
            }
        }
        bucket(h.finish(), self.n)
    }
}

impl Router for ByFields {
    #[inline]
    fn route(&mut self, values: &[Value], targets: &mut Vec<usize>) {
        targets.push(self.index(values));
    }
}

impl Grouping for FieldsGrouping {
    fn name(&self) -> &'static str {
        "fields"
    }
    fn check_fields(&self, fields: &Fields) -> Result<(), String> {
        match self.fields.iter().find(|f| fields.index_of(f).is_none()) {
            Some(f) => Err(f.clone()),
            None if self.fields.is_empty() => Err(String::new()),
            None => Ok(()),
        }
    }
    fn router(&self, fields: &Fields, ctx: RouteContext) -> Box<dyn Router> {
        Box::new(ByFields::new(self, fields, ctx))
    }
    fn builtin_router(&self, fields: &Fields, ctx: RouteContext) -> Option<BuiltinRouter> {
        Some(BuiltinRouter(AnyRouter::Fields(ByFields::new(self, fields, ctx))))
    }
}

/// Every task gets every tuple.
#[derive(Debug, Clone, Copy, Default)]
pub struct All;

struct ToAll(usize);

impl Router for ToAll {
    fn route(&mut self, _values: &[Value], targets: &mut Vec<usize>) {
        targets.extend(0..self.0);
    }
}

impl Grouping for All {
    fn name(&self) -> &'static str {
        "all"
    }
    fn router(&self, _fields: &Fields, ctx: RouteContext) -> Box<dyn Router> {
        Box::new(ToAll(ctx.target_tasks))
    }
}

/// Every tuple goes to task 0.
#[derive(Debug, Clone, Copy, Default)]
pub struct Global;

struct ToFirst;

impl Router for ToFirst {
    fn route(&mut self, _values: &[Value], targets: &mut Vec<usize>) {
        targets.push(0);
    }
}

impl Grouping for Global {
    fn name(&self) -> &'static str {
        "global"
    }
    fn router(&self, _fields: &Fields, _ctx: RouteContext) -> Box<dyn Router> {
        Box::new(ToFirst)
    }
}

/// The emitter picks the task with `emit_direct`; plain emits skip direct subscribers.
#[derive(Debug, Clone, Copy, Default)]
pub struct Direct;

struct Nowhere;

impl Router for Nowhere {
    fn route(&mut self, _values: &[Value], _targets: &mut Vec<usize>) {}
}

impl Grouping for Direct {
    fn name(&self) -> &'static str {
        "direct"
    }
    fn is_direct(&self) -> bool {
        true
    }
    fn router(&self, _fields: &Fields, _ctx: RouteContext) -> Box<dyn Router> {
        Box::new(Nowhere)
    }
}

/// A fast, fixed (unkeyed) hasher for grouping keys.
#[derive(Default)]
struct KeyHasher(u64);

impl KeyHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for KeyHasher {
    #[inline]
    fn finish(&self) -> u64 {
        // murmur3 fmix64 so the high bits (used for the task choice) are well mixed
        let mut z = self.0;
        z = (z ^ (z >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
        z = (z ^ (z >> 33)).wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        z ^ (z >> 33)
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut b = bytes;
        while b.len() >= 8 {
            self.add(u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]));
            b = &b[8..];
        }
        // the tail, without a variable-length copy: overlapping loads cover every byte, and the
        // length is mixed in
        let n = b.len();
        if n > 0 {
            self.add(crate::tuple::short_key(b) ^ ((n as u64) << 59));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_i64(&mut self, i: i64) {
        self.add(i as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(n: usize) -> RouteContext {
        RouteContext { source_task: 0, target_tasks: n }
    }

    #[test]
    fn shuffle_covers_all_tasks_evenly() {
        let f = Fields::new(&["x"]);
        let mut r = Shuffle.router(&f, ctx(3));
        let mut t = vec![];
        for _ in 0..9 {
            r.route(&[], &mut t);
        }
        for task in 0..3 {
            assert_eq!(t.iter().filter(|&&x| x == task).count(), 3);
        }
    }

    #[test]
    fn fields_grouping_is_stable_and_checks_fields() {
        let f = Fields::new(&["word", "n"]);
        let g = FieldsGrouping::new(&["word"]);
        assert_eq!(g.check_fields(&f), Ok(()));
        assert_eq!(FieldsGrouping::new(&["wrd"]).check_fields(&f), Err("wrd".to_owned()));
        let mut a = g.router(&f, ctx(5));
        let mut b = g.router(&f, RouteContext { source_task: 3, target_tasks: 5 });
        let (mut ta, mut tb) = (vec![], vec![]);
        for w in ["a", "b", "c", "dd", "a"] {
            a.route(&[Value::from(w), Value::Int(1)], &mut ta);
            b.route(&[Value::from(w), Value::Int(2)], &mut tb);
        }
        assert_eq!(ta, tb);
        assert_eq!(ta[0], ta[4]);
        assert_eq!(ta[0], fields_task(&[&Value::from("a")], 5));
    }

    #[test]
    fn builtin_routers_match_the_boxed_ones() {
        let f = Fields::new(&["word", "n"]);
        let groupings: [&dyn Grouping; 4] = [&Shuffle, &LocalOrShuffle, &FieldsGrouping::new(&["word"]), &All];
        for g in groupings {
            let c = RouteContext { source_task: 1, target_tasks: 3 };
            let mut boxed = g.router(&f, c);
            let mut any = AnyRouter::new(g, &f, c);
            let (mut tb, mut ta, mut one) = (vec![], vec![], vec![]);
            for w in ["a", "b", "c", "dd", "a", "eee"] {
                let v = [Value::from(w), Value::Int(1)];
                boxed.route(&v, &mut tb);
                match any.route_one(&v) {
                    Some(i) => one.push(i),
                    None => any.route(&v, &mut ta),
                }
            }
            ta.extend(one);
            assert_eq!(ta, tb, "{}", g.name());
        }
    }

    #[test]
    fn all_global_direct() {
        let f = Fields::new(&["x"]);
        let mut t = vec![];
        All.router(&f, ctx(3)).route(&[], &mut t);
        assert_eq!(t, vec![0, 1, 2]);
        t.clear();
        Global.router(&f, ctx(3)).route(&[], &mut t);
        assert_eq!(t, vec![0]);
        t.clear();
        Direct.router(&f, ctx(3)).route(&[], &mut t);
        assert!(t.is_empty() && Direct.is_direct());
    }
}
