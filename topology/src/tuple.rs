//! Tuples: values of declared output fields on a named stream, with typed accessors by field name.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use smallvec::SmallVec;

use crate::value::{Value, Values};

/// The name of the stream a component emits on when none is given.
pub const DEFAULT_STREAM: &str = "default";

/// The declared field names of a stream. Cheap to clone.
#[derive(Clone)]
pub struct Fields(Arc<[Field]>);

/// A field name with a precomputed key for fast lookup by name.
struct Field {
    name: Arc<str>,
    /// `name_key(name)`: together with the length, identifies names of up to 8 bytes exactly.
    key: u64,
}

/// A cheap key of a name: for names of up to 8 bytes, equal keys and lengths mean equal names
/// (the loads overlap but cover every byte); longer names are keyed by their first 8 bytes.
#[inline]
fn name_key(b: &[u8]) -> u64 {
    let n = b.len();
    if n >= 8 { u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) } else { short_key(b) }
}

/// A key of up to 7 bytes without a variable-length copy: two overlapping 4-byte loads for 4..=7
/// bytes, first/middle/last byte below that, 0 for none. Shared with the grouping hash's tail.
#[inline(always)]
pub(crate) fn short_key(b: &[u8]) -> u64 {
    let n = b.len();
    if n >= 4 {
        let lo = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let hi = u32::from_le_bytes([b[n - 4], b[n - 3], b[n - 2], b[n - 1]]);
        u64::from(lo) | (u64::from(hi) << 32)
    } else if n > 0 {
        u64::from(b[0]) | (u64::from(b[n / 2]) << 8) | (u64::from(b[n - 1]) << 16)
    } else {
        0
    }
}

impl Fields {
    /// Builds a field list from names.
    pub fn new<S: AsRef<str>>(names: &[S]) -> Self {
        Fields(
            names.iter().map(|n| Field { name: Arc::from(n.as_ref()), key: name_key(n.as_ref().as_bytes()) }).collect(),
        )
    }

    /// The position of a field, if declared.
    #[inline]
    pub fn index_of(&self, name: &str) -> Option<usize> {
        let b = name.as_bytes();
        let key = name_key(b);
        self.0
            .iter()
            .position(|f| f.key == key && f.name.len() == b.len() && (b.len() <= 8 || f.name.as_bytes()[8..] == b[8..]))
    }

    /// Number of fields.
    #[inline]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when no field is declared.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The field names in order.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|f| &*f.name)
    }

    /// The field names as owned strings (for error messages).
    pub fn to_vec(&self) -> Vec<String> {
        self.iter().map(str::to_owned).collect()
    }
}

impl PartialEq for Fields {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for Fields {}

impl fmt::Debug for Fields {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Errors reading a tuple's fields.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TupleError {
    /// The field is not declared on the tuple's stream. The caller's fault; not retryable.
    #[error("unknown field `{field}` on stream `{stream}` of component `{component}`; declared fields: {declared:?}")]
    UnknownField {
        /// Requested field.
        field: String,
        /// Stream of the tuple.
        stream: String,
        /// Component that emitted the tuple.
        component: String,
        /// The fields declared on that stream.
        declared: Vec<String>,
    },
    /// The field holds a value of another type. The caller's fault; not retryable.
    #[error("field `{field}` on stream `{stream}` of component `{component}` is {found}, not {expected}")]
    TypeMismatch {
        /// Requested field.
        field: String,
        /// Stream of the tuple.
        stream: String,
        /// Component that emitted the tuple.
        component: String,
        /// The requested type.
        expected: &'static str,
        /// The type found.
        found: &'static str,
    },
    /// Decoding the tuple into a type ([`Tuple::decode`]) found no value for a field the type
    /// requires. The caller's fault (the type does not match the stream: declare the field on
    /// the stream, or make it an `Option`); not retryable.
    #[error(
        "cannot decode stream `{stream}` of component `{component}` into `{target}`: missing field `{field}`; \
         declared fields: {declared:?}"
    )]
    MissingField {
        /// The field the type requires.
        field: String,
        /// The type decoded into.
        target: &'static str,
        /// Stream of the tuple.
        stream: String,
        /// Component that emitted the tuple.
        component: String,
        /// The fields declared on that stream.
        declared: Vec<String>,
    },
    /// Decoding the tuple into a type ([`Tuple::decode`]) failed: a value out of range for its
    /// field, an unknown enum variant, bad nested JSON, a stream with more or fewer fields than
    /// a tuple type reads. The caller's fault; not retryable.
    #[error(
        "cannot decode {} of stream `{stream}` of component `{component}` into `{target}`: {message}",
        match .field { Some(f) => format!("field `{f}`"), None => "the tuple".to_owned() }
    )]
    Decode {
        /// The field being decoded, when the error is about one.
        field: Option<String>,
        /// The type decoded into.
        target: &'static str,
        /// Stream of the tuple.
        stream: String,
        /// Component that emitted the tuple.
        component: String,
        /// What went wrong.
        message: String,
    },
}

/// Where a stream's tuples come from; shared by every tuple a task emits on that stream.
#[derive(Debug)]
pub(crate) struct StreamMeta {
    pub(crate) component: Arc<str>,
    pub(crate) task: usize,
    pub(crate) stream: Arc<str>,
    pub(crate) fields: Fields,
}

impl StreamMeta {
    /// The process-wide interned copy of this metadata. Tuples point at it without reference
    /// counting: a shared refcount bumped by the emitting thread and dropped by the receiving
    /// one bounces a cache line per tuple. The interner holds one entry per distinct (component,
    /// task, stream, fields), so memory is bounded by the topologies' shapes, not by their runs.
    pub(crate) fn intern(self) -> &'static StreamMeta {
        type Key = (String, usize, String, Vec<String>);
        static INTERNED: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<Key, &'static StreamMeta>>> =
            std::sync::OnceLock::new();
        let key = (self.component.to_string(), self.task, self.stream.to_string(), self.fields.to_vec());
        let mut map = INTERNED.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
        map.entry(key).or_insert_with(|| Box::leak(Box::new(self)))
    }
}

/// Ack-tree membership of one tuple copy: `(root id, edge id)` pairs. Empty when untracked.
pub(crate) type Anchors = SmallVec<[(u64, u64); 1]>;

/// A tuple delivered to a bolt. Cheap to clone: the stream metadata is shared, and values are
/// cheap to clone (strings and byte strings are reference counted).
///
/// Values are stored inline (a batch of tuples is one allocation), not behind a per-tuple `Arc`.
#[derive(Clone)]
pub struct Tuple {
    pub(crate) meta: &'static StreamMeta,
    pub(crate) values: Values,
    pub(crate) anchors: Anchors,
}

impl Tuple {
    /// Builds a free-standing tuple, e.g. to unit-test a bolt's `execute` without a topology.
    pub fn new_for_test(component: &str, stream: &str, fields: &[&str], values: Values) -> Tuple {
        Tuple {
            meta: StreamMeta {
                component: Arc::from(component),
                task: 0,
                stream: Arc::from(stream),
                fields: Fields::new(fields),
            }
            .intern(),
            values,
            anchors: Anchors::new(),
        }
    }

    /// The id of the component that emitted this tuple.
    pub fn source_component(&self) -> &str {
        &self.meta.component
    }

    /// The task index (0-based within its component) that emitted this tuple.
    pub fn source_task(&self) -> usize {
        self.meta.task
    }

    /// The stream this tuple was emitted on.
    pub fn stream(&self) -> &str {
        &self.meta.stream
    }

    /// The declared fields of the stream.
    pub fn fields(&self) -> &Fields {
        &self.meta.fields
    }

    /// All values in field order.
    pub fn values(&self) -> &Values {
        &self.values
    }

    /// True when the tuple is part of an ack tree (anchored to a tracked spout tuple).
    pub fn is_tracked(&self) -> bool {
        !self.anchors.is_empty()
    }

    /// The value of a field by name.
    #[inline]
    pub fn get(&self, field: &str) -> Result<&Value, TupleError> {
        match self.meta.fields.index_of(field) {
            Some(i) => Ok(self.values.get(i).unwrap_or(&Value::Null)),
            None => Err(self.unknown(field)),
        }
    }

    /// The value at a field position (see [`Fields::index_of`]); `Null` past the end.
    #[inline]
    pub fn get_at(&self, index: usize) -> &Value {
        self.values.get(index).unwrap_or(&Value::Null)
    }

    #[cold]
    #[inline(never)]
    fn unknown(&self, field: &str) -> TupleError {
        let meta = self.meta;
        TupleError::UnknownField {
            field: field.to_owned(),
            stream: meta.stream.to_string(),
            component: meta.component.to_string(),
            declared: meta.fields.to_vec(),
        }
    }

    #[cold]
    #[inline(never)]
    fn mismatch(&self, field: &str, expected: &'static str, found: &Value) -> TupleError {
        TupleError::TypeMismatch {
            field: field.to_owned(),
            stream: self.meta.stream.to_string(),
            component: self.meta.component.to_string(),
            expected,
            found: found.type_name(),
        }
    }

    /// Decodes the tuple into a serde type: a struct by field name, zero-copy for `&str` fields
    /// (see [`typed`](crate::typed)).
    pub fn decode<'de, T: serde::Deserialize<'de>>(&'de self) -> Result<T, TupleError> {
        crate::typed::from_tuple(self)
    }

    /// A string field.
    #[inline]
    pub fn get_str(&self, field: &str) -> Result<&str, TupleError> {
        match self.get(field)? {
            Value::Str(s) => Ok(s),
            v => Err(self.mismatch(field, "str", v)),
        }
    }

    /// A string field as a shared `Arc<str>` (no copy).
    #[inline]
    pub fn get_arc_str(&self, field: &str) -> Result<Arc<str>, TupleError> {
        match self.get(field)? {
            Value::Str(s) => Ok(s.clone()),
            v => Err(self.mismatch(field, "str", v)),
        }
    }

    /// A signed integer field (an unsigned value that fits is accepted).
    pub fn get_i64(&self, field: &str) -> Result<i64, TupleError> {
        match self.get(field)? {
            Value::Int(i) => Ok(*i),
            Value::UInt(u) if i64::try_from(*u).is_ok() => Ok(*u as i64),
            v => Err(self.mismatch(field, "int", v)),
        }
    }

    /// An unsigned integer field (a non-negative signed value is accepted).
    pub fn get_u64(&self, field: &str) -> Result<u64, TupleError> {
        match self.get(field)? {
            Value::UInt(u) => Ok(*u),
            Value::Int(i) if *i >= 0 => Ok(*i as u64),
            v => Err(self.mismatch(field, "uint", v)),
        }
    }

    /// A float field (integers are converted).
    pub fn get_f64(&self, field: &str) -> Result<f64, TupleError> {
        match self.get(field)? {
            Value::Float(f) => Ok(*f),
            Value::Int(i) => Ok(*i as f64),
            Value::UInt(u) => Ok(*u as f64),
            v => Err(self.mismatch(field, "float", v)),
        }
    }

    /// A boolean field.
    pub fn get_bool(&self, field: &str) -> Result<bool, TupleError> {
        match self.get(field)? {
            Value::Bool(b) => Ok(*b),
            v => Err(self.mismatch(field, "bool", v)),
        }
    }

    /// A bytes field (cheap clone of the shared buffer).
    pub fn get_bytes(&self, field: &str) -> Result<Bytes, TupleError> {
        match self.get(field)? {
            Value::Bytes(b) => Ok(Bytes::clone(b)),
            v => Err(self.mismatch(field, "bytes", v)),
        }
    }
}

impl fmt::Debug for Tuple {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let meta = self.meta;
        f.debug_struct("Tuple")
            .field("component", &meta.component)
            .field("task", &meta.task)
            .field("stream", &meta.stream)
            .field("fields", &meta.fields)
            .field("values", &self.values)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t() -> Tuple {
        Tuple::new_for_test(
            "split",
            "words",
            &["word", "n", "u", "f", "b"],
            crate::values!["hello", -3i64, 7u64, 0.5f64, Bytes::from_static(b"ab")],
        )
    }

    #[test]
    fn typed_accessors() {
        let t = t();
        assert_eq!(t.get_str("word").unwrap(), "hello");
        assert_eq!(t.get_i64("n").unwrap(), -3);
        assert_eq!(t.get_u64("u").unwrap(), 7);
        assert_eq!(t.get_i64("u").unwrap(), 7);
        assert_eq!(t.get_f64("f").unwrap(), 0.5);
        assert_eq!(&t.get_bytes("b").unwrap()[..], b"ab");
        assert_eq!(t.stream(), "words");
        assert_eq!(t.source_component(), "split");
        assert!(t.get_u64("n").is_err());
    }

    #[test]
    fn unknown_field_error_names_everything() {
        let err = t().get("wrod").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("`wrod`"), "{msg}");
        assert!(msg.contains("`words`"), "{msg}");
        assert!(msg.contains("`split`"), "{msg}");
        assert!(msg.contains("\"word\""), "{msg}");
    }

    #[test]
    fn type_mismatch_error() {
        let msg = t().get_str("n").unwrap_err().to_string();
        assert!(msg.contains("is int, not str"), "{msg}");
    }
}
