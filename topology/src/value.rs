//! Tuple values: a small dynamically typed [`Value`] and the [`Values`] a tuple carries.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use bytes::Bytes;
use smallvec::SmallVec;

/// One field value of a tuple. Cheap to clone: strings are `Arc<str>`, byte strings [`Bytes`].
///
/// 24 bytes: byte strings are boxed so that the common variants (numbers, strings) keep tuples
/// small; building one from [`Bytes`] or `Vec<u8>` goes through `Value::from`.
///
/// Equality and the grouping hash treat integers by value: `Int(1) == UInt(1)`, and both go to
/// the same task under fields grouping (a key read as `i64` in one place and `u64` in another
/// is still one key). Other types never equal each other (`Float(1.0) != Int(1)`).
#[derive(Clone, Debug, Default)]
pub enum Value {
    /// No value.
    #[default]
    Null,
    /// A boolean.
    Bool(bool),
    /// A signed integer.
    Int(i64),
    /// An unsigned integer.
    UInt(u64),
    /// A float. Hashes by bit pattern for fields grouping.
    Float(f64),
    /// A UTF-8 string.
    Str(Arc<str>),
    /// Raw bytes (boxed: keeps `Value` at 24 bytes).
    Bytes(Box<Bytes>),
}

impl Value {
    /// The name of this value's type, used in error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::UInt(_) => "uint",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
        }
    }

    /// Feeds the value into a hasher; used by fields grouping. Stable within one build. Equal
    /// values hash equally: a non-negative `Int` hashes as the `UInt` of the same value.
    #[inline(always)]
    pub fn hash_into<H: Hasher>(&self, h: &mut H) {
        match self {
            Value::Null => h.write_u8(0),
            Value::Bool(b) => {
                h.write_u8(1);
                h.write_u8(u8::from(*b));
            }
            Value::Int(i) if *i >= 0 => {
                h.write_u8(3);
                h.write_u64(*i as u64);
            }
            Value::Int(i) => {
                h.write_u8(2);
                h.write_i64(*i);
            }
            Value::UInt(u) => {
                h.write_u8(3);
                h.write_u64(*u);
            }
            Value::Float(f) => {
                h.write_u8(4);
                h.write_u64(f.to_bits());
            }
            Value::Str(s) => {
                h.write_u8(5);
                s.hash(h);
            }
            Value::Bytes(b) => {
                h.write_u8(6);
                b.hash(h);
            }
        }
    }
}

impl PartialEq for Value {
    fn eq(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::Null, Value::Null) => true,
            (Value::Bool(a), Value::Bool(b)) => a == b,
            (Value::Int(a), Value::Int(b)) => a == b,
            (Value::UInt(a), Value::UInt(b)) => a == b,
            (Value::Int(i), Value::UInt(u)) | (Value::UInt(u), Value::Int(i)) => u64::try_from(*i) == Ok(*u),
            (Value::Float(a), Value::Float(b)) => a == b,
            (Value::Str(a), Value::Str(b)) => a == b,
            (Value::Bytes(a), Value::Bytes(b)) => a == b,
            _ => false,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("null"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::UInt(u) => write!(f, "{u}"),
            Value::Float(x) => write!(f, "{x}"),
            Value::Str(s) => f.write_str(s),
            Value::Bytes(b) => write!(f, "<{} bytes>", b.len()),
        }
    }
}

macro_rules! from_impl {
    ($($t:ty => $variant:ident via $conv:expr),* $(,)?) => {
        $(impl From<$t> for Value {
            fn from(v: $t) -> Self {
                #[allow(clippy::redundant_closure_call)]
                Value::$variant(($conv)(v))
            }
        })*
    };
}

from_impl! {
    bool => Bool via |v| v,
    i64 => Int via |v| v,
    i32 => Int via i64::from,
    u64 => UInt via |v| v,
    u32 => UInt via u64::from,
    usize => UInt via |v: usize| v as u64,
    f64 => Float via |v| v,
    Arc<str> => Str via |v| v,
    &str => Str via Arc::from,
    String => Str via Arc::from,
    Bytes => Bytes via Box::new,
    Vec<u8> => Bytes via |v: Vec<u8>| Box::new(Bytes::from(v)),
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

/// The values of one tuple, in declared field order. Up to two values are stored inline
/// (a tuple with more fields allocates its values).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Values(pub(crate) SmallVec<[Value; 2]>);

impl Values {
    /// An empty list.
    pub fn new() -> Self {
        Values(SmallVec::new())
    }

    /// Appends a value.
    #[inline]
    pub fn push(&mut self, v: impl Into<Value>) {
        self.0.push(v.into());
    }
}

impl std::ops::Deref for Values {
    type Target = [Value];
    #[inline]
    fn deref(&self) -> &[Value] {
        &self.0
    }
}

impl From<Vec<Value>> for Values {
    fn from(v: Vec<Value>) -> Self {
        Values(SmallVec::from_vec(v))
    }
}

impl<T: Into<Value>, const N: usize> From<[T; N]> for Values {
    fn from(v: [T; N]) -> Self {
        Values(v.into_iter().map(Into::into).collect())
    }
}

impl From<Value> for Values {
    #[inline]
    fn from(v: Value) -> Self {
        let mut s = SmallVec::new();
        s.push(v);
        Values(s)
    }
}

impl<T: Into<Value>> FromIterator<T> for Values {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        Values(iter.into_iter().map(Into::into).collect())
    }
}

/// Builds [`Values`] from expressions of mixed types: `values!["word", 1u64]`.
#[macro_export]
macro_rules! values {
    ($($v:expr),* $(,)?) => {{
        let mut vals = $crate::Values::new();
        $(vals.push($v);)*
        vals
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_and_macro() {
        let v = crate::values!["a", 1i64, 2u64, 1.5f64, true, Bytes::from_static(b"x")];
        assert_eq!(v.len(), 6);
        assert_eq!(v[0], Value::Str(Arc::from("a")));
        assert_eq!(v[1], Value::Int(1));
        assert_eq!(v[2], Value::UInt(2));
        assert_eq!(v[3].type_name(), "float");
        assert_eq!(Value::from(None::<i64>), Value::Null);
        let w: Values = ["x", "y"].into();
        assert_eq!(w.len(), 2);
        assert_eq!(format!("{}", w[1]), "y");
    }

    #[test]
    fn value_is_small() {
        assert_eq!(std::mem::size_of::<Value>(), 24);
        assert_eq!(std::mem::size_of::<crate::Tuple>(), 88);
    }

    #[test]
    fn equal_integers_are_one_key_other_types_are_not() {
        use std::collections::hash_map::DefaultHasher;
        let h = |v: &Value| {
            let mut s = DefaultHasher::new();
            v.hash_into(&mut s);
            s.finish()
        };
        assert_eq!(Value::Int(1), Value::UInt(1));
        assert_eq!(h(&Value::Int(1)), h(&Value::UInt(1)));
        assert_eq!(h(&Value::Int(0)), h(&Value::UInt(0)));
        assert_eq!(h(&Value::Int(i64::MAX)), h(&Value::UInt(i64::MAX as u64)));
        assert_ne!(Value::Int(-1), Value::UInt(u64::MAX));
        assert_ne!(h(&Value::Int(-1)), h(&Value::UInt(u64::MAX)));
        assert_ne!(Value::Float(1.0), Value::Int(1));
        assert_ne!(h(&Value::Int(1)), h(&Value::Float(1.0)));
        assert_ne!(h(&Value::Null), h(&Value::Bool(false)));
        assert_eq!(h(&Value::from("k")), h(&Value::from(String::from("k"))));
        // the grouping hash routes them to one task
        for n in [1usize, 2, 7, 64] {
            for i in 0..1000i64 {
                assert_eq!(
                    crate::grouping::fields_task(&[&Value::Int(i)], n),
                    crate::grouping::fields_task(&[&Value::UInt(i as u64)], n)
                );
            }
        }
    }
}
