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
    /// Appends target task indices (each `< target_tasks`) for a tuple with these values. An
    /// index out of range makes the emit fail ([`EmitError::RouterTaskOutOfRange`]): nothing
    /// is sent.
    ///
    /// [`EmitError::RouterTaskOutOfRange`]: crate::EmitError::RouterTaskOutOfRange
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

    /// [`AnyRouter::route_one`] for a record emitted with `emit_record`, without encoding its
    /// values; `None` when its values must be routed instead.
    #[inline(always)]
    pub(crate) fn route_one_record<T: serde::Serialize + ?Sized>(&mut self, rec: &T) -> Option<usize> {
        match self {
            AnyRouter::RoundRobin(r) => Some(r.next_index()),
            AnyRouter::Fields(r) => r.index_record(rec),
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
#[inline]
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

impl ByFields {
    /// The task of a record emitted with `emit_record`, the same as [`ByFields::index`] of its
    /// values, without encoding them: the key field is hashed straight from the record. `None`
    /// when the key is not a single field of primitive type in a struct, tuple struct or tuple
    /// (route the record's values instead).
    #[inline(always)]
    pub(crate) fn index_record<T: serde::Serialize + ?Sized>(&self, rec: &T) -> Option<usize> {
        let [field] = *self.idx else { return None };
        let mut h = KeyHasher::default();
        match rec.serialize(record_key::KeySer { field, h: &mut h }) {
            Ok(true) => Some(bucket(h.finish(), self.n)),
            _ => None,
        }
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

/// Hashes one field of a record as [`Value::hash_into`] hashes the value `typed::to_values`
/// encodes it into (same variant tags, same words), without building the value. Anything the
/// encoder would not make a primitive value of (bytes, 128-bit integers, nested values) is
/// refused, and the caller routes the encoded values instead.
mod record_key {
    use std::fmt;
    use std::hash::{Hash, Hasher};

    use serde::ser::{self, Impossible, Serialize, Serializer};

    use super::KeyHasher;

    /// Not a key this hasher reads: route the encoded values.
    #[derive(Debug)]
    pub(super) struct NotKey;

    impl fmt::Display for NotKey {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("not a primitive key field")
        }
    }

    impl std::error::Error for NotKey {}

    impl ser::Error for NotKey {
        fn custom<M: fmt::Display>(_msg: M) -> Self {
            NotKey
        }
    }

    /// The record: hashes field number `field`; `Ok(true)` once it was found.
    pub(super) struct KeySer<'a> {
        pub(super) field: usize,
        pub(super) h: &'a mut KeyHasher,
    }

    /// The record's fields, counted as the encoder counts them.
    pub(super) struct KeyFields<'a> {
        field: usize,
        pos: usize,
        found: bool,
        h: &'a mut KeyHasher,
    }

    impl KeyFields<'_> {
        #[inline(always)]
        fn next<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), NotKey> {
            if self.pos == self.field {
                value.serialize(LeafSer(self.h))?;
                self.found = true;
            }
            self.pos += 1;
            Ok(())
        }
    }

    macro_rules! refuse {
        ($ok:ty; $($method:ident($($arg:ty),*)),* $(,)?) => {$(
            fn $method(self, $(_: $arg),*) -> Result<$ok, NotKey> {
                Err(NotKey)
            }
        )*};
    }

    /// Numbers, hashed as the 64-bit value they encode into.
    macro_rules! widen {
        ($($method:ident($ty:ty) => $hash:ident),* $(,)?) => {$(
            fn $method(self, v: $ty) -> Result<(), NotKey> {
                self.$hash(v.into())
            }
        )*};
    }

    impl<'a> Serializer for KeySer<'a> {
        type Ok = bool;
        type Error = NotKey;
        type SerializeSeq = Impossible<bool, NotKey>;
        type SerializeTuple = KeyFields<'a>;
        type SerializeTupleStruct = KeyFields<'a>;
        type SerializeTupleVariant = Impossible<bool, NotKey>;
        type SerializeMap = Impossible<bool, NotKey>;
        type SerializeStruct = KeyFields<'a>;
        type SerializeStructVariant = Impossible<bool, NotKey>;

        refuse! { bool;
            serialize_bool(bool), serialize_i8(i8), serialize_i16(i16), serialize_i32(i32),
            serialize_i64(i64), serialize_i128(i128), serialize_u8(u8), serialize_u16(u16),
            serialize_u32(u32), serialize_u64(u64), serialize_u128(u128), serialize_f32(f32),
            serialize_f64(f64), serialize_char(char), serialize_str(&str), serialize_bytes(&[u8]),
            serialize_none(), serialize_unit(), serialize_unit_struct(&'static str),
            serialize_unit_variant(&'static str, u32, &'static str),
        }

        fn serialize_some<T: Serialize + ?Sized>(self, _value: &T) -> Result<bool, NotKey> {
            Err(NotKey)
        }
        #[inline(always)]
        fn serialize_newtype_struct<T: Serialize + ?Sized>(
            self,
            _name: &'static str,
            value: &T,
        ) -> Result<bool, NotKey> {
            value.serialize(self)
        }
        fn serialize_newtype_variant<T: Serialize + ?Sized>(
            self,
            _name: &'static str,
            _index: u32,
            _variant: &'static str,
            _value: &T,
        ) -> Result<bool, NotKey> {
            Err(NotKey)
        }
        fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, NotKey> {
            Err(NotKey)
        }
        #[inline(always)]
        fn serialize_tuple(self, _len: usize) -> Result<KeyFields<'a>, NotKey> {
            Ok(KeyFields { field: self.field, pos: 0, found: false, h: self.h })
        }
        #[inline(always)]
        fn serialize_tuple_struct(self, _name: &'static str, _len: usize) -> Result<KeyFields<'a>, NotKey> {
            Ok(KeyFields { field: self.field, pos: 0, found: false, h: self.h })
        }
        fn serialize_tuple_variant(
            self,
            _name: &'static str,
            _index: u32,
            _variant: &'static str,
            _len: usize,
        ) -> Result<Self::SerializeTupleVariant, NotKey> {
            Err(NotKey)
        }
        fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, NotKey> {
            Err(NotKey)
        }
        #[inline(always)]
        fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<KeyFields<'a>, NotKey> {
            Ok(KeyFields { field: self.field, pos: 0, found: false, h: self.h })
        }
        fn serialize_struct_variant(
            self,
            _name: &'static str,
            _index: u32,
            _variant: &'static str,
            _len: usize,
        ) -> Result<Self::SerializeStructVariant, NotKey> {
            Err(NotKey)
        }
    }

    impl ser::SerializeStruct for KeyFields<'_> {
        type Ok = bool;
        type Error = NotKey;
        #[inline(always)]
        fn serialize_field<T: Serialize + ?Sized>(&mut self, _key: &'static str, value: &T) -> Result<(), NotKey> {
            self.next(value)
        }
        /// The encoder keeps a skipped field's position as `Null`.
        fn skip_field(&mut self, _key: &'static str) -> Result<(), NotKey> {
            self.next(&())
        }
        #[inline(always)]
        fn end(self) -> Result<bool, NotKey> {
            Ok(self.found)
        }
    }

    impl ser::SerializeTuple for KeyFields<'_> {
        type Ok = bool;
        type Error = NotKey;
        fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), NotKey> {
            self.next(value)
        }
        fn end(self) -> Result<bool, NotKey> {
            Ok(self.found)
        }
    }

    impl ser::SerializeTupleStruct for KeyFields<'_> {
        type Ok = bool;
        type Error = NotKey;
        fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), NotKey> {
            self.next(value)
        }
        fn end(self) -> Result<bool, NotKey> {
            Ok(self.found)
        }
    }

    /// One field's value, hashed as `Value::hash_into` hashes its encoding.
    struct LeafSer<'a>(&'a mut KeyHasher);

    impl LeafSer<'_> {
        #[inline(always)]
        fn int(self, i: i64) -> Result<(), NotKey> {
            if i >= 0 {
                self.0.write_u8(3);
                self.0.write_u64(i as u64);
            } else {
                self.0.write_u8(2);
                self.0.write_i64(i);
            }
            Ok(())
        }
        #[inline(always)]
        fn uint(self, u: u64) -> Result<(), NotKey> {
            self.0.write_u8(3);
            self.0.write_u64(u);
            Ok(())
        }
        #[inline(always)]
        fn float(self, f: f64) -> Result<(), NotKey> {
            self.0.write_u8(4);
            self.0.write_u64(f.to_bits());
            Ok(())
        }
        #[inline(always)]
        fn null(self) -> Result<(), NotKey> {
            self.0.write_u8(0);
            Ok(())
        }
    }

    impl Serializer for LeafSer<'_> {
        type Ok = ();
        type Error = NotKey;
        type SerializeSeq = Impossible<(), NotKey>;
        type SerializeTuple = Impossible<(), NotKey>;
        type SerializeTupleStruct = Impossible<(), NotKey>;
        type SerializeTupleVariant = Impossible<(), NotKey>;
        type SerializeMap = Impossible<(), NotKey>;
        type SerializeStruct = Impossible<(), NotKey>;
        type SerializeStructVariant = Impossible<(), NotKey>;

        refuse! { ();
            serialize_i128(i128), serialize_u128(u128), serialize_bytes(&[u8]),
        }
        refuse! { Impossible<(), NotKey>;
            serialize_seq(Option<usize>), serialize_tuple(usize),
            serialize_tuple_struct(&'static str, usize),
            serialize_tuple_variant(&'static str, u32, &'static str, usize),
            serialize_map(Option<usize>), serialize_struct(&'static str, usize),
            serialize_struct_variant(&'static str, u32, &'static str, usize),
        }

        fn serialize_bool(self, v: bool) -> Result<(), NotKey> {
            self.0.write_u8(1);
            self.0.write_u8(u8::from(v));
            Ok(())
        }
        widen! {
            serialize_i8(i8) => int, serialize_i16(i16) => int, serialize_i32(i32) => int,
            serialize_i64(i64) => int, serialize_u8(u8) => uint, serialize_u16(u16) => uint,
            serialize_u32(u32) => uint, serialize_u64(u64) => uint, serialize_f32(f32) => float,
            serialize_f64(f64) => float,
        }
        fn serialize_char(self, v: char) -> Result<(), NotKey> {
            self.serialize_str(v.encode_utf8(&mut [0; 4]))
        }
        #[inline(always)]
        fn serialize_str(self, v: &str) -> Result<(), NotKey> {
            // as `Value::Str(Arc<str>)`: an `Arc<str>` hashes as its `str`
            self.0.write_u8(5);
            v.hash(self.0);
            Ok(())
        }
        fn serialize_none(self) -> Result<(), NotKey> {
            self.null()
        }
        fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), NotKey> {
            value.serialize(self)
        }
        fn serialize_unit(self) -> Result<(), NotKey> {
            self.null()
        }
        fn serialize_unit_struct(self, _name: &'static str) -> Result<(), NotKey> {
            self.null()
        }
        fn serialize_unit_variant(self, _name: &'static str, _index: u32, variant: &'static str) -> Result<(), NotKey> {
            self.serialize_str(variant)
        }
        fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _name: &'static str, value: &T) -> Result<(), NotKey> {
            value.serialize(self)
        }
        fn serialize_newtype_variant<T: Serialize + ?Sized>(
            self,
            _name: &'static str,
            _index: u32,
            _variant: &'static str,
            _value: &T,
        ) -> Result<(), NotKey> {
            Err(NotKey)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize)]
    enum Kind {
        Small,
        #[allow(dead_code)]
        Big(u8),
    }

    #[derive(serde::Serialize)]
    struct Id(u32);

    #[derive(serde::Serialize)]
    struct Inner {
        a: u8,
    }

    /// One field of every kind the record key hasher reads, and some it refuses.
    #[derive(serde::Serialize)]
    struct Rec {
        s: String,
        i: i32,
        neg: i64,
        u: u8,
        big: u64,
        f: f32,
        d: f64,
        b: bool,
        c: char,
        none: Option<u64>,
        some: Option<String>,
        unit: (),
        kind: Kind,
        id: Id,
        #[serde(skip_serializing_if = "Option::is_none")]
        skipped: Option<u64>,
        arc: std::sync::Arc<str>,
        #[serde(with = "serde_bytes_like")]
        bytes: Vec<u8>,
        nested: Inner,
        wide: i128,
    }

    mod serde_bytes_like {
        pub fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(v)
        }
    }

    /// A record's key field routes exactly as the value it encodes into: the same task for
    /// every field the hasher reads (over many records, two emitting tasks' routers and
    /// several task counts); the fields it refuses answer `None` (their values are routed).
    #[test]
    fn a_record_key_routes_as_its_encoded_value() {
        let names = [
            "s", "i", "neg", "u", "big", "f", "d", "b", "c", "none", "some", "unit", "kind", "id", "skipped", "arc",
            "bytes", "nested", "wide",
        ];
        let fields = Fields::new(&names);
        for k in 0..200u64 {
            let r = Rec {
                s: format!("w{k}"),
                i: k as i32 - 100,
                neg: -(k as i64) * 7919,
                u: k as u8,
                big: k.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                f: k as f32 / 3.0,
                d: k as f64 * 1.5,
                b: k % 2 == 0,
                c: char::from(b'a' + (k % 26) as u8),
                none: None,
                some: (k % 3 != 0).then(|| format!("s{k}")),
                unit: (),
                kind: Kind::Small,
                id: Id(k as u32),
                skipped: (k % 2 == 0).then_some(k),
                arc: std::sync::Arc::from(format!("a{k}")),
                bytes: vec![k as u8],
                nested: Inner { a: k as u8 },
                wide: i128::from(k),
            };
            let values = crate::typed::to_values(&r).unwrap();
            assert_eq!(values.len(), names.len());
            for (i, name) in names.iter().enumerate() {
                for n in [2, 3, 7] {
                    let g = FieldsGrouping::new(&[*name]);
                    let by_values = ByFields::new(&g, &fields, ctx(n)).index(&values);
                    let by_record = ByFields::new(&g, &fields, ctx(n)).index_record(&r);
                    match *name {
                        "bytes" | "nested" | "wide" => assert_eq!(by_record, None, "{name} is refused"),
                        _ => assert_eq!(by_record, Some(by_values), "field {i} `{name}` of record {k}, {n} tasks"),
                    }
                }
            }
        }
        // several key fields: routed by values
        let g = FieldsGrouping::new(&["s", "i"]);
        let r = Rec {
            s: "x".into(),
            i: 1,
            neg: 0,
            u: 0,
            big: 0,
            f: 0.0,
            d: 0.0,
            b: false,
            c: 'x',
            none: None,
            some: None,
            unit: (),
            kind: Kind::Small,
            id: Id(0),
            skipped: None,
            arc: "x".into(),
            bytes: vec![],
            nested: Inner { a: 0 },
            wide: 0,
        };
        assert_eq!(ByFields::new(&g, &fields, ctx(3)).index_record(&r), None);
    }

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
