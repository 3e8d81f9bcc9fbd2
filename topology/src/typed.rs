//! Typed tuples through serde: a Rust struct becomes a tuple's [`Values`], and a [`Tuple`]
//! decodes back into the struct, by field name.
//!
//! - [`to_values`] encodes any `Serialize` record into the values of one tuple, one value per
//!   field in declaration order (the order [`fields_of`] returns, so the two agree).
//! - [`from_tuple`] (or [`Tuple::decode`]) decodes a tuple: a struct reads the tuple as a map
//!   from the stream's field names to values, so the struct's field order need not match the
//!   stream's, and the struct may read a subset of the stream's fields.
//! - [`fields_of`] lists a struct's field names, to declare a stream's fields from the type.
//!
//! # Encoding
//!
//! | Rust (serde data model)                         | [`Value`]                        |
//! |-------------------------------------------------|----------------------------------|
//! | struct, tuple struct, tuple, sequence (top)     | one value per field, in order    |
//! | newtype struct `W(x)`                           | as `x` (transparent)             |
//! | `i8`..`i64`; `i128` that fits                   | `Int` (`UInt` for an `i128` above `i64::MAX`) |
//! | `u8`..`u64`; `u128` that fits                   | `UInt`                           |
//! | `f32`, `f64`                                    | `Float`                          |
//! | `bool`                                          | `Bool`                           |
//! | `char`, `&str`, `String`                        | `Str`                            |
//! | bytes (`serialize_bytes`, e.g. `serde_bytes`)   | `Bytes`                          |
//! | `None`, `()`, unit struct                       | `Null`                           |
//! | `Some(x)`                                       | as `x`                           |
//! | unit enum variant `E::A`                        | `Str("A")` (the serialized name) |
//! | a nested struct, map, sequence, tuple, or enum variant with data, inside a field | `Str` of its JSON |
//!
//! A top-level primitive (`to_values(&7u64)`) is one value. A top-level map or enum variant with
//! data is refused ([`TypedError::NotARecord`]): a map has no declared field order. A field
//! skipped by `#[serde(skip_serializing_if = ..)]` is encoded as `Null`, so positions hold.
//! `u128`/`i128` values beyond 64 bits are refused ([`TypedError::IntegerOutOfRange`]).
//!
//! Encoding allocates nothing beyond the values themselves (the `Arc<str>` of a string, the
//! buffer of a byte string, the list of values when a record has more than two fields); a nested
//! value costs its JSON string.
//!
//! # Decoding
//!
//! Numbers convert as the typed getters ([`Tuple::get_i64`] ...) do: an `Int` reads as an
//! unsigned integer when non-negative, a `UInt` as a signed one when it fits, any integer as a
//! float (narrower integers are range-checked). `Null` reads as `None` (and an absent field of
//! type `Option` is `None`). A `&'de str` or `&'de [u8]` field borrows from the tuple: no copy.
//! A `Str` field read as a struct, map, sequence, tuple, or enum variant with data is parsed as
//! JSON, the inverse of the encoding above; a `Bytes` value reads as a sequence of `u8` too.
//! A tuple struct, tuple or `Vec` reads the tuple's values in stream order; a single primitive
//! reads a one-field stream.
//!
//! Errors are [`TupleError`]s naming the field, stream, emitting component and target type:
//! [`TupleError::MissingField`], [`TupleError::TypeMismatch`], [`TupleError::Decode`].
//!
//! Limits of the nested JSON encoding: floats inside a nested value go through JSON (serde_json's
//! best-effort float parsing; top-level float fields are exact); a nested value of a type that
//! decodes through `deserialize_any` (`#[serde(untagged)]` or internally tagged enums,
//! `serde_json::Value`) reads the field as the plain string it is stored as.
//!
//! # Example
//!
//! ```
//! use serde::{Deserialize, Serialize};
//! use squall_topology::Tuple;
//! use squall_topology::typed::{fields_of, to_values};
//!
//! #[derive(Serialize, Deserialize, Debug, PartialEq)]
//! struct Word {
//!     word: String,
//!     count: u64,
//! }
//!
//! let fields = fields_of::<Word>()?; // declare the stream from the type
//! assert_eq!(fields, ["word", "count"]);
//!
//! let w = Word { word: "cat".into(), count: 3 };
//! let values = to_values(&w)?; // what `emit` sends
//! assert_eq!(values.len(), 2);
//!
//! let t = Tuple::new_for_test("count", "default", &fields, values);
//! assert_eq!(t.decode::<Word>()?, w);
//! assert_eq!(t.get_u64("count")?, 3); // the getters still work
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use serde::Deserialize;
use serde::de::value::{BorrowedStrDeserializer, SeqDeserializer};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{self, Impossible, Serialize, Serializer};
use smallvec::SmallVec;

use crate::tuple::{Tuple, TupleError};
use crate::value::{Value, Values};

/// Errors encoding a value into tuple values ([`to_values`]) or reading a type's field names
/// ([`fields_of`]). All are the caller's fault (the type does not fit a tuple); none is
/// retryable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TypedError {
    /// An `i128`/`u128` value does not fit the tuple's 64-bit integers.
    #[error(
        "{} of `{type_name}` holds {value}, which does not fit in 64 bits; \
         use an i64/u64 field or serialize it as a string",
        field_label(.field)
    )]
    IntegerOutOfRange {
        /// The encoded type.
        type_name: &'static str,
        /// The field (name, or position in a tuple), `None` for a top-level value.
        field: Option<String>,
        /// The value, in decimal.
        value: String,
    },
    /// The top-level value is not a record: a map (no declared field order) or an enum variant
    /// with data.
    #[error("`{type_name}` is {found}, not a record of fields; encode a struct (wrap the value in one)")]
    NotARecord {
        /// The encoded type.
        type_name: &'static str,
        /// What the value serialized as.
        found: &'static str,
    },
    /// A nested value could not be encoded as JSON (e.g. a map with non-string keys).
    #[error("{} of `{type_name}` is nested and cannot be encoded as JSON: {source}", field_label(.field))]
    NestedJson {
        /// The encoded type.
        type_name: &'static str,
        /// The field (name, or position in a tuple), `None` for a top-level value.
        field: Option<String>,
        /// serde_json's error.
        #[source]
        source: serde_json::Error,
    },
    /// The type's `Serialize` implementation failed.
    #[error("{} of `{type_name}` failed to serialize: {message}", field_label(.field))]
    Serialize {
        /// The encoded type.
        type_name: &'static str,
        /// The field (name, or position in a tuple), `None` for a top-level value.
        field: Option<String>,
        /// The implementation's message.
        message: String,
    },
    /// [`fields_of`] was given a type that does not deserialize as a struct with named fields.
    #[error(
        "`{type_name}` is not a struct with named fields (it deserializes as {found}); \
         fields_of needs a struct without #[serde(flatten)], or declare the fields by hand"
    )]
    NotAStruct {
        /// The type.
        type_name: &'static str,
        /// What it deserializes as.
        found: String,
    },
}

fn field_label(field: &Option<String>) -> String {
    match field {
        Some(f) => format!("field `{f}`"),
        None => "the value".to_owned(),
    }
}

// ---------------------------------------------------------------------------------------------
// Encoding

/// Encodes a record into the values of one tuple: one value per field, in declaration order.
/// See the [module docs](self) for the mapping.
pub fn to_values<T: Serialize + ?Sized>(v: &T) -> Result<Values, TypedError> {
    let mut out = SmallVec::new();
    match v.serialize(RecordSer { out: &mut out }) {
        Ok(()) => Ok(Values(out)),
        Err(e) => Err(e.into_typed(std::any::type_name::<T>())),
    }
}

/// A field of an encoded record: its name, or its position in a tuple or sequence.
#[derive(Debug, Clone, Copy)]
enum FieldRef {
    Name(&'static str),
    Index(usize),
}

impl FieldRef {
    fn into_string(self) -> String {
        match self {
            FieldRef::Name(n) => n.to_owned(),
            FieldRef::Index(i) => i.to_string(),
        }
    }
}

/// The serializers' error. Small (one pointer) so `Result<Value, SerError>` stays small.
#[derive(Debug)]
enum SerError {
    /// Not an error: the value is a compound (struct, map, sequence, variant with data), which
    /// the enclosing record encodes as JSON. Never leaves this module.
    Nested,
    Failed(Box<SerFailure>),
}

#[derive(Debug)]
struct SerFailure {
    field: Option<FieldRef>,
    kind: SerFailureKind,
}

#[derive(Debug)]
enum SerFailureKind {
    OutOfRange(String),
    NotARecord(&'static str),
    Json(serde_json::Error),
    Custom(String),
}

impl SerError {
    #[cold]
    fn fail(kind: SerFailureKind) -> Self {
        SerError::Failed(Box::new(SerFailure { field: None, kind }))
    }

    /// Attributes the error to `field` unless it already names one.
    #[cold]
    fn at(mut self, field: FieldRef) -> Self {
        if let SerError::Failed(f) = &mut self {
            f.field.get_or_insert(field);
        }
        self
    }

    #[cold]
    fn into_typed(self, type_name: &'static str) -> TypedError {
        let SerError::Failed(f) = self else {
            // Unreachable: `RecordFields` turns `Nested` into JSON. Reported, not panicked.
            return TypedError::Serialize {
                type_name,
                field: None,
                message: "internal error: a nested value escaped its record".to_owned(),
            };
        };
        let field = f.field.map(FieldRef::into_string);
        match f.kind {
            SerFailureKind::OutOfRange(value) => TypedError::IntegerOutOfRange { type_name, field, value },
            SerFailureKind::NotARecord(found) => TypedError::NotARecord { type_name, found },
            SerFailureKind::Json(source) => TypedError::NestedJson { type_name, field, source },
            SerFailureKind::Custom(message) => TypedError::Serialize { type_name, field, message },
        }
    }
}

impl fmt::Display for SerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SerError::Nested => f.write_str("nested value"),
            SerError::Failed(e) => match &e.kind {
                SerFailureKind::OutOfRange(v) => write!(f, "{v} does not fit in 64 bits"),
                SerFailureKind::NotARecord(found) => write!(f, "{found} is not a record"),
                SerFailureKind::Json(e) => write!(f, "{e}"),
                SerFailureKind::Custom(m) => f.write_str(m),
            },
        }
    }
}

impl std::error::Error for SerError {}

impl ser::Error for SerError {
    fn custom<M: fmt::Display>(msg: M) -> Self {
        SerError::fail(SerFailureKind::Custom(msg.to_string()))
    }
}

fn int128(v: i128) -> Result<Value, SerError> {
    if let Ok(i) = i64::try_from(v) {
        Ok(Value::Int(i))
    } else if let Ok(u) = u64::try_from(v) {
        Ok(Value::UInt(u))
    } else {
        Err(SerError::fail(SerFailureKind::OutOfRange(v.to_string())))
    }
}

/// Encodes the value of one field. Compounds answer [`SerError::Nested`].
struct ValueSer;

impl Serializer for ValueSer {
    type Ok = Value;
    type Error = SerError;
    type SerializeSeq = Impossible<Value, SerError>;
    type SerializeTuple = Impossible<Value, SerError>;
    type SerializeTupleStruct = Impossible<Value, SerError>;
    type SerializeTupleVariant = Impossible<Value, SerError>;
    type SerializeMap = Impossible<Value, SerError>;
    type SerializeStruct = Impossible<Value, SerError>;
    type SerializeStructVariant = Impossible<Value, SerError>;

    #[inline]
    fn serialize_bool(self, v: bool) -> Result<Value, SerError> {
        Ok(Value::Bool(v))
    }
    #[inline]
    fn serialize_i8(self, v: i8) -> Result<Value, SerError> {
        Ok(Value::Int(v.into()))
    }
    #[inline]
    fn serialize_i16(self, v: i16) -> Result<Value, SerError> {
        Ok(Value::Int(v.into()))
    }
    #[inline]
    fn serialize_i32(self, v: i32) -> Result<Value, SerError> {
        Ok(Value::Int(v.into()))
    }
    #[inline]
    fn serialize_i64(self, v: i64) -> Result<Value, SerError> {
        Ok(Value::Int(v))
    }
    fn serialize_i128(self, v: i128) -> Result<Value, SerError> {
        int128(v)
    }
    #[inline]
    fn serialize_u8(self, v: u8) -> Result<Value, SerError> {
        Ok(Value::UInt(v.into()))
    }
    #[inline]
    fn serialize_u16(self, v: u16) -> Result<Value, SerError> {
        Ok(Value::UInt(v.into()))
    }
    #[inline]
    fn serialize_u32(self, v: u32) -> Result<Value, SerError> {
        Ok(Value::UInt(v.into()))
    }
    #[inline]
    fn serialize_u64(self, v: u64) -> Result<Value, SerError> {
        Ok(Value::UInt(v))
    }
    fn serialize_u128(self, v: u128) -> Result<Value, SerError> {
        match u64::try_from(v) {
            Ok(u) => Ok(Value::UInt(u)),
            Err(_) => Err(SerError::fail(SerFailureKind::OutOfRange(v.to_string()))),
        }
    }
    #[inline]
    fn serialize_f32(self, v: f32) -> Result<Value, SerError> {
        Ok(Value::Float(v.into()))
    }
    #[inline]
    fn serialize_f64(self, v: f64) -> Result<Value, SerError> {
        Ok(Value::Float(v))
    }
    fn serialize_char(self, v: char) -> Result<Value, SerError> {
        Ok(Value::Str(Arc::from(&*v.encode_utf8(&mut [0; 4]))))
    }
    #[inline]
    fn serialize_str(self, v: &str) -> Result<Value, SerError> {
        Ok(Value::Str(Arc::from(v)))
    }
    #[inline]
    fn serialize_bytes(self, v: &[u8]) -> Result<Value, SerError> {
        Ok(Value::Bytes(Box::new(Bytes::copy_from_slice(v))))
    }
    #[inline]
    fn serialize_none(self) -> Result<Value, SerError> {
        Ok(Value::Null)
    }
    #[inline]
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<Value, SerError> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<Value, SerError> {
        Ok(Value::Null)
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<Value, SerError> {
        Ok(Value::Null)
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<Value, SerError> {
        Ok(Value::Str(Arc::from(variant)))
    }
    #[inline]
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<Value, SerError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<Value, SerError> {
        Err(SerError::Nested)
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, SerError> {
        Err(SerError::Nested)
    }
    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, SerError> {
        Err(SerError::Nested)
    }
    fn serialize_tuple_struct(self, _name: &'static str, _len: usize) -> Result<Self::SerializeTupleStruct, SerError> {
        Err(SerError::Nested)
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, SerError> {
        Err(SerError::Nested)
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, SerError> {
        Err(SerError::Nested)
    }
    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Self::SerializeStruct, SerError> {
        Err(SerError::Nested)
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, SerError> {
        Err(SerError::Nested)
    }
}

/// Encodes the top-level value: a record's fields, or one primitive.
struct RecordSer<'a> {
    out: &'a mut SmallVec<[Value; 2]>,
}

/// Top-level primitives: one value through [`ValueSer`].
macro_rules! one_value {
    ($($method:ident($ty:ty)),* $(,)?) => {$(
        #[inline]
        fn $method(self, v: $ty) -> Result<(), SerError> {
            self.out.push(ValueSer.$method(v)?);
            Ok(())
        }
    )*};
}

impl<'a> Serializer for RecordSer<'a> {
    type Ok = ();
    type Error = SerError;
    type SerializeSeq = RecordFields<'a>;
    type SerializeTuple = RecordFields<'a>;
    type SerializeTupleStruct = RecordFields<'a>;
    type SerializeTupleVariant = Impossible<(), SerError>;
    type SerializeMap = Impossible<(), SerError>;
    type SerializeStruct = RecordFields<'a>;
    type SerializeStructVariant = Impossible<(), SerError>;

    one_value! {
        serialize_bool(bool), serialize_i8(i8), serialize_i16(i16), serialize_i32(i32), serialize_i64(i64),
        serialize_i128(i128), serialize_u8(u8), serialize_u16(u16), serialize_u32(u32), serialize_u64(u64),
        serialize_u128(u128), serialize_f32(f32), serialize_f64(f64), serialize_char(char), serialize_str(&str),
        serialize_bytes(&[u8]),
    }

    fn serialize_none(self) -> Result<(), SerError> {
        self.out.push(Value::Null);
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), SerError> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), SerError> {
        self.out.push(Value::Null);
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), SerError> {
        self.out.push(Value::Null);
        Ok(())
    }
    fn serialize_unit_variant(self, _name: &'static str, _index: u32, variant: &'static str) -> Result<(), SerError> {
        self.out.push(Value::Str(Arc::from(variant)));
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _name: &'static str, value: &T) -> Result<(), SerError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<(), SerError> {
        Err(SerError::fail(SerFailureKind::NotARecord("an enum variant with data")))
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<RecordFields<'a>, SerError> {
        self.out.reserve_exact(len.unwrap_or(0));
        Ok(RecordFields { out: self.out, index: 0 })
    }
    fn serialize_tuple(self, len: usize) -> Result<RecordFields<'a>, SerError> {
        self.out.reserve_exact(len);
        Ok(RecordFields { out: self.out, index: 0 })
    }
    fn serialize_tuple_struct(self, _name: &'static str, len: usize) -> Result<RecordFields<'a>, SerError> {
        self.out.reserve_exact(len);
        Ok(RecordFields { out: self.out, index: 0 })
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, SerError> {
        Err(SerError::fail(SerFailureKind::NotARecord("an enum variant with data")))
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, SerError> {
        Err(SerError::fail(SerFailureKind::NotARecord("a map")))
    }
    fn serialize_struct(self, _name: &'static str, len: usize) -> Result<RecordFields<'a>, SerError> {
        self.out.reserve_exact(len);
        Ok(RecordFields { out: self.out, index: 0 })
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, SerError> {
        Err(SerError::fail(SerFailureKind::NotARecord("an enum variant with data")))
    }
}

/// The fields of the top-level record, appended in order.
struct RecordFields<'a> {
    out: &'a mut SmallVec<[Value; 2]>,
    index: usize,
}

impl RecordFields<'_> {
    #[inline]
    fn push<T: Serialize + ?Sized>(&mut self, field: FieldRef, value: &T) -> Result<(), SerError> {
        let v = match value.serialize(ValueSer) {
            Ok(v) => v,
            Err(SerError::Nested) => nested_json(value).map_err(|e| e.at(field))?,
            Err(e) => return Err(e.at(field)),
        };
        self.out.push(v);
        Ok(())
    }

    #[inline]
    fn push_next<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), SerError> {
        let field = FieldRef::Index(self.index);
        self.index += 1;
        self.push(field, value)
    }
}

#[cold]
fn nested_json<T: Serialize + ?Sized>(value: &T) -> Result<Value, SerError> {
    match serde_json::to_string(value) {
        Ok(s) => Ok(Value::Str(Arc::from(s))),
        Err(e) => Err(SerError::fail(SerFailureKind::Json(e))),
    }
}

impl ser::SerializeStruct for RecordFields<'_> {
    type Ok = ();
    type Error = SerError;
    #[inline]
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), SerError> {
        self.push(FieldRef::Name(key), value)
    }
    /// A field skipped by `skip_serializing_if` keeps its position as `Null`.
    fn skip_field(&mut self, _key: &'static str) -> Result<(), SerError> {
        self.out.push(Value::Null);
        Ok(())
    }
    fn end(self) -> Result<(), SerError> {
        Ok(())
    }
}

impl ser::SerializeSeq for RecordFields<'_> {
    type Ok = ();
    type Error = SerError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), SerError> {
        self.push_next(value)
    }
    fn end(self) -> Result<(), SerError> {
        Ok(())
    }
}

impl ser::SerializeTuple for RecordFields<'_> {
    type Ok = ();
    type Error = SerError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), SerError> {
        self.push_next(value)
    }
    fn end(self) -> Result<(), SerError> {
        Ok(())
    }
}

impl ser::SerializeTupleStruct for RecordFields<'_> {
    type Ok = ();
    type Error = SerError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), SerError> {
        self.push_next(value)
    }
    fn end(self) -> Result<(), SerError> {
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Decoding

/// Decodes a tuple into `T`: a struct by field name, a tuple struct, tuple or `Vec` in stream
/// order, a primitive from a one-field stream. See the [module docs](self).
pub fn from_tuple<'de, T: Deserialize<'de>>(t: &'de Tuple) -> Result<T, TupleError> {
    T::deserialize(TupleDe { t }).map_err(|e| e.into_tuple_error(t, std::any::type_name::<T>()))
}

/// The deserializers' error. One pointer, so results stay small.
#[derive(Debug)]
struct DeError(Box<DeFailure>);

#[derive(Debug)]
struct DeFailure {
    /// The tuple field being decoded, when known.
    field: Option<String>,
    kind: DeKind,
}

#[derive(Debug)]
enum DeKind {
    Mismatch { expected: &'static str, found: &'static str },
    Missing(&'static str),
    Message(String),
}

impl DeError {
    #[cold]
    fn new(field: Option<&str>, kind: DeKind) -> Self {
        DeError(Box::new(DeFailure { field: field.map(str::to_owned), kind }))
    }

    #[cold]
    fn message(msg: String) -> Self {
        DeError::new(None, DeKind::Message(msg))
    }

    /// Attributes the error to `field` unless it already names one.
    #[cold]
    fn at(mut self, field: &str) -> Self {
        if self.0.field.is_none() {
            self.0.field = Some(field.to_owned());
        }
        self
    }

    #[cold]
    fn into_tuple_error(self, t: &Tuple, target: &'static str) -> TupleError {
        let DeFailure { field, kind } = *self.0;
        let stream = t.stream().to_owned();
        let component = t.source_component().to_owned();
        match kind {
            DeKind::Mismatch { expected, found } => {
                TupleError::TypeMismatch { field: field.unwrap_or_default(), stream, component, expected, found }
            }
            DeKind::Missing(field) => TupleError::MissingField {
                field: field.to_owned(),
                target,
                stream,
                component,
                declared: t.fields().to_vec(),
            },
            DeKind::Message(message) => TupleError::Decode { field, target, stream, component, message },
        }
    }
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0.kind {
            DeKind::Mismatch { expected, found } => write!(f, "found {found}, expected {expected}"),
            DeKind::Missing(field) => write!(f, "missing field `{field}`"),
            DeKind::Message(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<M: fmt::Display>(msg: M) -> Self {
        DeError::message(msg.to_string())
    }

    fn missing_field(field: &'static str) -> Self {
        DeError::new(None, DeKind::Missing(field))
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        DeError::new(
            Some(field),
            DeKind::Message(format!(
                "the stream's field is not a field of the target type, which denies unknown fields \
                 (its fields: {expected:?}); drop #[serde(deny_unknown_fields)] to ignore it"
            )),
        )
    }
}

/// Past the end of a tuple's values, fields read as `Null` (as [`Tuple::get_at`] does).
static NULL: Value = Value::Null;

/// The whole tuple: a map of field names to values, or a sequence of values.
struct TupleDe<'de> {
    t: &'de Tuple,
}

impl<'de> TupleDe<'de> {
    fn entries(&self) -> Entries<'de, impl Iterator<Item = &'de str>> {
        Entries { names: self.t.fields().iter(), values: self.t.values(), index: 0, pending: None }
    }

    /// The only value of a one-field stream.
    fn single(&self) -> Result<ValueDe<'de>, DeError> {
        let fields = self.t.fields();
        match fields.iter().next() {
            Some(field) if fields.len() == 1 => Ok(ValueDe { v: self.t.get_at(0), field }),
            _ => Err(DeError::message(format!(
                "the target type reads one value but the stream has {} fields ({:?}); decode a struct or tuple",
                fields.len(),
                fields
            ))),
        }
    }

    fn is_single_null(&self) -> bool {
        self.t.fields().len() == 1 && matches!(self.t.get_at(0), Value::Null)
    }

    fn seq<V: Visitor<'de>>(&self, visitor: V) -> Result<V::Value, DeError> {
        let mut entries = self.entries();
        let value = visitor.visit_seq(&mut entries)?;
        let total = self.t.fields().len();
        if entries.index < total {
            return Err(DeError::message(format!(
                "the stream has {total} fields but the target type reads {}",
                entries.index
            )));
        }
        Ok(value)
    }
}

/// Single-value requests on the whole tuple read its one field.
macro_rules! via_single {
    ($($method:ident),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
            self.single()?.$method(visitor)
        }
    )*};
}

impl<'de> Deserializer<'de> for TupleDe<'de> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_map(self.entries())
    }

    via_single! {
        deserialize_bool, deserialize_i8, deserialize_i16, deserialize_i32, deserialize_i64, deserialize_i128,
        deserialize_u8, deserialize_u16, deserialize_u32, deserialize_u64, deserialize_u128, deserialize_f32,
        deserialize_f64, deserialize_char, deserialize_str, deserialize_string, deserialize_bytes,
        deserialize_byte_buf, deserialize_identifier,
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        if self.is_single_null() { visitor.visit_none() } else { visitor.visit_some(self) }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        if self.t.fields().is_empty() || self.is_single_null() {
            visitor.visit_unit()
        } else {
            self.single()?.deserialize_unit(visitor)
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, _name: &'static str, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _name: &'static str, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.seq(visitor)
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, DeError> {
        self.seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_map(self.entries())
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_map(self.entries())
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.single()?.deserialize_enum(name, variants, visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_unit()
    }
}

/// The fields of a tuple, as map entries (name, value) or sequence elements (value).
struct Entries<'de, I> {
    names: I,
    values: &'de [Value],
    /// Fields handed out so far.
    index: usize,
    /// The entry whose key was read and whose value is next.
    pending: Option<(&'de str, &'de Value)>,
}

impl<'de, I: Iterator<Item = &'de str>> Entries<'de, I> {
    #[inline]
    fn next_entry(&mut self) -> Option<(&'de str, &'de Value)> {
        let name = self.names.next()?;
        let value = self.values.get(self.index).unwrap_or(&NULL);
        self.index += 1;
        Some((name, value))
    }
}

impl<'de, I: Iterator<Item = &'de str>> MapAccess<'de> for Entries<'de, I> {
    type Error = DeError;

    #[inline]
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, DeError> {
        match self.next_entry() {
            Some((name, value)) => {
                self.pending = Some((name, value));
                seed.deserialize(BorrowedStrDeserializer::new(name)).map(Some)
            }
            None => Ok(None),
        }
    }

    #[inline]
    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, DeError> {
        let Some((field, v)) = self.pending.take() else {
            return Err(DeError::message("a value was read before its field name".to_owned()));
        };
        seed.deserialize(ValueDe { v, field }).map_err(|e| e.at(field))
    }

    fn size_hint(&self) -> Option<usize> {
        self.names.size_hint().1
    }
}

impl<'de, I: Iterator<Item = &'de str>> SeqAccess<'de> for Entries<'de, I> {
    type Error = DeError;

    #[inline]
    fn next_element_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<Option<S::Value>, DeError> {
        match self.next_entry() {
            Some((field, v)) => seed.deserialize(ValueDe { v, field }).map(Some).map_err(|e| e.at(field)),
            None => Ok(None),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        self.names.size_hint().1
    }
}

/// One field's value.
struct ValueDe<'de> {
    v: &'de Value,
    field: &'de str,
}

impl<'de> ValueDe<'de> {
    #[cold]
    fn mismatch(&self, expected: &'static str) -> DeError {
        DeError::new(Some(self.field), DeKind::Mismatch { expected, found: self.v.type_name() })
    }

    fn signed<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match *self.v {
            Value::Int(i) => visitor.visit_i64(i),
            Value::UInt(u) => visitor.visit_u64(u),
            _ => Err(self.mismatch("int")),
        }
    }

    fn unsigned<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match *self.v {
            Value::UInt(u) => visitor.visit_u64(u),
            Value::Int(i) => visitor.visit_i64(i),
            _ => Err(self.mismatch("uint")),
        }
    }

    fn float<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match *self.v {
            Value::Float(f) => visitor.visit_f64(f),
            Value::Int(i) => visitor.visit_f64(i as f64),
            Value::UInt(u) => visitor.visit_f64(u as f64),
            _ => Err(self.mismatch("float")),
        }
    }

    fn string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.v {
            Value::Str(s) => visitor.visit_borrowed_str(s),
            Value::Bytes(b) => visitor.visit_borrowed_bytes(b),
            _ => Err(self.mismatch("str")),
        }
    }

    fn bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.v {
            Value::Bytes(b) => visitor.visit_borrowed_bytes(b),
            Value::Str(s) => visitor.visit_borrowed_str(s),
            _ => Err(self.mismatch("bytes")),
        }
    }

    /// A nested value: its JSON string, parsed by `f`.
    fn json<T>(
        self,
        f: impl FnOnce(&mut serde_json::Deserializer<serde_json::de::StrRead<'de>>) -> Result<T, serde_json::Error>,
    ) -> Result<T, DeError> {
        let Value::Str(s) = self.v else {
            return Err(self.mismatch("str holding a nested JSON value"));
        };
        let mut de = serde_json::Deserializer::from_str(s);
        f(&mut de)
            .and_then(|v| de.end().map(|()| v))
            .map_err(|e| DeError::new(Some(self.field), DeKind::Message(format!("in its nested JSON value: {e}"))))
    }
}

impl<'de> Deserializer<'de> for ValueDe<'de> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.v {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Int(i) => visitor.visit_i64(*i),
            Value::UInt(u) => visitor.visit_u64(*u),
            Value::Float(f) => visitor.visit_f64(*f),
            Value::Str(s) => visitor.visit_borrowed_str(s),
            Value::Bytes(b) => visitor.visit_borrowed_bytes(b),
        }
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match *self.v {
            Value::Bool(b) => visitor.visit_bool(b),
            _ => Err(self.mismatch("bool")),
        }
    }

    fn deserialize_i8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.signed(visitor)
    }
    fn deserialize_i16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.signed(visitor)
    }
    fn deserialize_i32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.signed(visitor)
    }
    fn deserialize_i64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.signed(visitor)
    }
    fn deserialize_i128<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.signed(visitor)
    }
    fn deserialize_u8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.unsigned(visitor)
    }
    fn deserialize_u16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.unsigned(visitor)
    }
    fn deserialize_u32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.unsigned(visitor)
    }
    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.unsigned(visitor)
    }
    fn deserialize_u128<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.unsigned(visitor)
    }
    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.float(visitor)
    }
    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.float(visitor)
    }
    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.string(visitor)
    }
    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.string(visitor)
    }
    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.string(visitor)
    }
    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.bytes(visitor)
    }
    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.bytes(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.v {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.v {
            Value::Null => visitor.visit_unit(),
            _ => Err(self.mismatch("null")),
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, _name: &'static str, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _name: &'static str, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        if let Value::Bytes(b) = self.v {
            let field = self.field;
            return SeqDeserializer::<_, DeError>::new(b.iter().copied())
                .deserialize_any(visitor)
                .map_err(|e| e.at(field));
        }
        self.json(|de| de.deserialize_seq(visitor))
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, DeError> {
        if let Value::Bytes(_) = self.v {
            return self.deserialize_seq(visitor);
        }
        self.json(|de| de.deserialize_tuple(len, visitor))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.json(|de| de.deserialize_tuple_struct(name, len, visitor))
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.json(|de| de.deserialize_map(visitor))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.json(|de| de.deserialize_struct(name, fields, visitor))
    }

    /// A unit variant is stored as its name; a variant with data as JSON (`{"Variant": ..}`).
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        match self.v {
            Value::Str(s) if s.trim_start().starts_with('{') => {
                self.json(|de| de.deserialize_enum(name, variants, visitor))
            }
            Value::Str(s) => visitor.visit_enum(BorrowedStrDeserializer::<DeError>::new(s)),
            _ => Err(self.mismatch("str naming an enum variant")),
        }
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match *self.v {
            Value::UInt(u) => visitor.visit_u64(u),
            _ => self.string(visitor),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_unit()
    }
}

// ---------------------------------------------------------------------------------------------
// Field names

/// The field names of a struct, in declaration order (their serialized names, after
/// `#[serde(rename)]`): the order [`to_values`] encodes them in, to declare a stream's fields.
///
/// Read from the `fields` list serde's derive passes to `deserialize_struct`; a newtype struct
/// is seen through. Anything else (a tuple struct, a map, a struct with `#[serde(flatten)]`, an
/// enum, a primitive) is [`TypedError::NotAStruct`]. Fields skipped with `#[serde(skip)]` are not
/// listed (and not encoded).
pub fn fields_of<'de, T: Deserialize<'de>>() -> Result<Vec<&'static str>, TypedError> {
    let type_name = std::any::type_name::<T>();
    let found = match T::deserialize(FieldTracer) {
        Err(TraceError::Fields(fields)) => return Ok(fields.to_vec()),
        Err(TraceError::NotStruct(found)) => found.to_owned(),
        Err(TraceError::Other(message)) => format!("a type whose Deserialize failed: {message}"),
        Ok(_) => "a type whose Deserialize reads nothing".to_owned(),
    };
    Err(TypedError::NotAStruct { type_name, found })
}

/// Answers the first request with an error that carries what was requested.
struct FieldTracer;

#[derive(Debug)]
enum TraceError {
    Fields(&'static [&'static str]),
    NotStruct(&'static str),
    Other(String),
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceError::Fields(fields) => write!(f, "struct with fields {fields:?}"),
            TraceError::NotStruct(found) => f.write_str(found),
            TraceError::Other(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for TraceError {}

impl de::Error for TraceError {
    fn custom<M: fmt::Display>(msg: M) -> Self {
        TraceError::Other(msg.to_string())
    }
}

macro_rules! not_struct {
    ($found:literal: $($method:ident),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, TraceError> {
            Err(TraceError::NotStruct($found))
        }
    )*};
}

impl<'de> Deserializer<'de> for FieldTracer {
    type Error = TraceError;

    not_struct!("a self-describing value": deserialize_any);
    not_struct!("an Option": deserialize_option);
    not_struct!("a unit": deserialize_unit);
    not_struct!("a sequence": deserialize_seq);
    not_struct!("a map (a struct with #[serde(flatten)] deserializes as one)": deserialize_map);
    not_struct!("a single value":
        deserialize_bool, deserialize_i8, deserialize_i16, deserialize_i32, deserialize_i64, deserialize_i128,
        deserialize_u8, deserialize_u16, deserialize_u32, deserialize_u64, deserialize_u128, deserialize_f32,
        deserialize_f64, deserialize_char, deserialize_str, deserialize_string, deserialize_bytes,
        deserialize_byte_buf, deserialize_identifier, deserialize_ignored_any,
    );

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _visitor: V,
    ) -> Result<V::Value, TraceError> {
        Err(TraceError::NotStruct("a unit struct"))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, TraceError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _len: usize, _visitor: V) -> Result<V::Value, TraceError> {
        Err(TraceError::NotStruct("a tuple"))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        _visitor: V,
    ) -> Result<V::Value, TraceError> {
        Err(TraceError::NotStruct("a tuple struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, TraceError> {
        Err(TraceError::Fields(fields))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, TraceError> {
        Err(TraceError::NotStruct("an enum"))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use serde::{Deserialize, Serialize};

    use super::*;
    use crate::values;

    /// Bytes through `serialize_bytes` (what `serde_bytes` does), without the dependency.
    mod as_bytes {
        use serde::de::{Deserializer, Error, Visitor};
        use std::fmt;

        pub(super) fn serialize<T: AsRef<[u8]>, S: serde::Serializer>(b: &T, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(b.as_ref())
        }

        pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
            struct V;
            impl Visitor<'_> for V {
                type Value = Vec<u8>;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("bytes")
                }
                fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                    Ok(v.to_vec())
                }
            }
            d.deserialize_byte_buf(V)
        }
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq, Clone, Copy)]
    enum Kind {
        Noun,
        #[serde(rename = "verb")]
        Verb,
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
    enum Shape {
        Point,
        Circle(f64),
        Rect { w: u32, h: u32 },
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
    struct Inner {
        x: i32,
        name: String,
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Record<'a> {
        borrowed: &'a str,
        owned: String,
        u: u64,
        i: i64,
        f: f64,
        b: bool,
        some: Option<u32>,
        none: Option<String>,
        #[serde(with = "as_bytes")]
        bytes: Vec<u8>,
        #[serde(serialize_with = "as_bytes::serialize")]
        raw: &'a [u8],
        kind: Kind,
        shape: Shape,
        inner: Inner,
        list: Vec<u16>,
        map: BTreeMap<String, i64>,
        c: char,
        unit: (),
    }

    fn record() -> Record<'static> {
        Record {
            borrowed: "cat",
            owned: "dog".into(),
            u: u64::MAX,
            i: i64::MIN,
            f: -0.25,
            b: true,
            some: Some(7),
            none: None,
            bytes: vec![0, 1, 255],
            raw: b"raw",
            kind: Kind::Verb,
            shape: Shape::Rect { w: 2, h: 3 },
            inner: Inner { x: -1, name: "in".into() },
            list: vec![1, 2, 3],
            map: [("k".to_owned(), 9)].into_iter().collect(),
            c: 'é',
            unit: (),
        }
    }

    fn tuple_of<'de, T: Deserialize<'de> + Serialize>(v: &T) -> Tuple {
        let fields = fields_of::<T>().unwrap();
        Tuple::new_for_test("typed-src", "typed-stream", &fields, to_values(v).unwrap())
    }

    #[test]
    fn encodes_one_value_per_field_in_order() {
        let r = record();
        let values = to_values(&r).unwrap();
        assert_eq!(
            fields_of::<Record<'_>>().unwrap(),
            [
                "borrowed", "owned", "u", "i", "f", "b", "some", "none", "bytes", "raw", "kind", "shape", "inner",
                "list", "map", "c", "unit"
            ]
        );
        let expected: Vec<Value> = vec![
            "cat".into(),
            "dog".into(),
            Value::UInt(u64::MAX),
            Value::Int(i64::MIN),
            Value::Float(-0.25),
            Value::Bool(true),
            Value::UInt(7),
            Value::Null,
            Value::from(vec![0u8, 1, 255]),
            Value::from(b"raw".to_vec()),
            "verb".into(),
            r#"{"Rect":{"w":2,"h":3}}"#.into(),
            r#"{"x":-1,"name":"in"}"#.into(),
            "[1,2,3]".into(),
            r#"{"k":9}"#.into(),
            "é".into(),
            Value::Null,
        ];
        assert_eq!(&values[..], &expected[..]);
    }

    #[test]
    fn roundtrips_every_kind_of_field() {
        let r = record();
        let t = tuple_of(&r);
        assert_eq!(t.decode::<Record<'_>>().unwrap(), r);
        assert_eq!(from_tuple::<Record<'_>>(&t).unwrap(), r);
        for shape in [Shape::Point, Shape::Circle(1.5)] {
            let r = Record { shape: shape.clone(), ..record() };
            assert_eq!(tuple_of(&r).decode::<Record<'_>>().unwrap().shape, shape);
        }
        assert_eq!(tuple_of(&record()).get_str("shape").unwrap(), r#"{"Rect":{"w":2,"h":3}}"#);
    }

    #[test]
    fn borrowed_fields_are_zero_copy() {
        let t = tuple_of(&record());
        let r: Record<'_> = t.decode().unwrap();
        let Value::Str(s) = t.get("borrowed").unwrap() else { panic!("not a str") };
        assert!(std::ptr::eq(r.borrowed.as_ptr(), s.as_ptr()));
        let Value::Bytes(b) = t.get("raw").unwrap() else { panic!("not bytes") };
        assert!(std::ptr::eq(r.raw.as_ptr(), b.as_ptr()));
    }

    #[test]
    fn decoding_is_by_name_not_position() {
        #[derive(Deserialize, Debug, PartialEq)]
        struct Word<'a> {
            word: &'a str,
            count: u64,
        }
        // Stream order differs from the struct's, and the stream has a field the struct ignores.
        let t = Tuple::new_for_test("split", "words", &["count", "lang", "word"], values![3u64, "en", "cat"]);
        assert_eq!(t.decode::<Word<'_>>().unwrap(), Word { word: "cat", count: 3 });
    }

    #[test]
    fn numbers_convert_like_the_getters() {
        #[derive(Deserialize, Debug, PartialEq)]
        struct N {
            i: i64,
            u: u64,
            f: f64,
            g: f32,
            small: u8,
        }
        let t = Tuple::new_for_test("c", "s", &["i", "u", "f", "g", "small"], values![5u64, 6i64, -7i64, 8u64, 9i64]);
        assert_eq!(t.decode::<N>().unwrap(), N { i: 5, u: 6, f: -7.0, g: 8.0, small: 9 });

        let t = Tuple::new_for_test("c", "s", &["i", "u", "f", "g", "small"], values![0i64, -1i64, 0.0, 0.0, 0i64]);
        let msg = t.decode::<N>().unwrap_err().to_string();
        assert!(msg.contains("field `u`") && msg.contains("invalid value: integer `-1`"), "{msg}");

        let t = Tuple::new_for_test("c", "s", &["i", "u", "f", "g", "small"], values![0i64, 0i64, 0.0, 0.0, 256i64]);
        let msg = t.decode::<N>().unwrap_err().to_string();
        assert!(msg.contains("field `small`"), "{msg}");

        let t = Tuple::new_for_test("c", "s", &["i", "u", "f", "g", "small"], values![u64::MAX, 0i64, 0.0, 0.0, 0i64]);
        assert!(t.decode::<N>().unwrap_err().to_string().contains("field `i`"));
    }

    #[test]
    fn absent_and_null_options_are_none() {
        #[derive(Deserialize, Debug, PartialEq)]
        struct O {
            a: Option<u64>,
            b: Option<u64>,
            c: Option<u64>,
        }
        let t = Tuple::new_for_test("c", "s", &["a", "b"], values![Value::Null, 4u64]);
        assert_eq!(t.decode::<O>().unwrap(), O { a: None, b: Some(4), c: None });
    }

    #[test]
    fn missing_field_names_field_type_stream_and_component() {
        #[derive(Deserialize, Debug)]
        #[allow(dead_code)]
        struct Word {
            word: String,
            count: u64,
        }
        let t = Tuple::new_for_test("split", "words", &["word"], values!["cat"]);
        let err = t.decode::<Word>().unwrap_err();
        assert!(matches!(&err, TupleError::MissingField { field, .. } if field == "count"), "{err:?}");
        let msg = err.to_string();
        for part in ["`count`", "`words`", "`split`", "Word`", "[\"word\"]"] {
            assert!(msg.contains(part), "{part} not in: {msg}");
        }
    }

    #[test]
    fn type_mismatch_names_the_field() {
        #[derive(Deserialize, Debug)]
        #[allow(dead_code)]
        struct Word {
            word: String,
            count: u64,
        }
        let t = Tuple::new_for_test("split", "words", &["word", "count"], values!["cat", "three"]);
        let err = t.decode::<Word>().unwrap_err();
        assert_eq!(
            err,
            TupleError::TypeMismatch {
                field: "count".into(),
                stream: "words".into(),
                component: "split".into(),
                expected: "uint",
                found: "str",
            }
        );
    }

    #[test]
    fn decode_errors_name_the_field_and_target() {
        #[derive(Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Strict {
            word: String,
        }
        let t = Tuple::new_for_test("split", "words", &["word", "extra"], values!["cat", 1u64]);
        let err = t.decode::<Strict>().unwrap_err();
        assert!(matches!(&err, TupleError::Decode { field: Some(f), .. } if f == "extra"), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains("field `extra`") && msg.contains("Strict`") && msg.contains("deny_unknown_fields"),
            "{msg}"
        );

        #[derive(Deserialize, Debug)]
        #[allow(dead_code)]
        struct Nested {
            inner: Inner,
            kind: Kind,
        }
        let t = Tuple::new_for_test("c", "s", &["inner", "kind"], values![r#"{"x":1}"#, "Noun"]);
        let msg = t.decode::<Nested>().unwrap_err().to_string();
        assert!(msg.contains("field `inner`") && msg.contains("missing field `name`"), "{msg}");
        let t = Tuple::new_for_test("c", "s", &["inner", "kind"], values![r#"{"x":1,"name":"n"}"#, "Adjective"]);
        let msg = t.decode::<Nested>().unwrap_err().to_string();
        assert!(msg.contains("field `kind`") && msg.contains("unknown variant `Adjective`"), "{msg}");
        let t = Tuple::new_for_test("c", "s", &["inner", "kind"], values![1u64, "Noun"]);
        let err = t.decode::<Nested>().unwrap_err();
        assert!(matches!(&err, TupleError::TypeMismatch { field, found: "uint", .. } if field == "inner"), "{err:?}");
    }

    #[test]
    fn tuples_and_sequences_read_in_stream_order() {
        #[derive(Serialize, Deserialize, Debug, PartialEq)]
        struct Pair(String, i64);
        let t = Tuple::new_for_test("c", "s", &["a", "b"], values!["x", 2i64]);
        assert_eq!(t.decode::<Pair>().unwrap(), Pair("x".into(), 2));
        assert_eq!(t.decode::<(&str, u8)>().unwrap(), ("x", 2));
        assert_eq!(&to_values(&Pair("x".into(), 2)).unwrap()[..], &t.values()[..]);
        assert_eq!(&to_values(&("x", 2i64)).unwrap()[..], &t.values()[..]);

        let msg = t.decode::<(String,)>().unwrap_err().to_string();
        assert!(msg.contains("the stream has 2 fields but the target type reads 1"), "{msg}");
        let err = t.decode::<(String, i64, bool)>().unwrap_err();
        assert!(err.to_string().contains("invalid length 2"), "{err}");

        let t = Tuple::new_for_test("c", "s", &["a", "b", "c"], values![1u64, 2u64, 3u64]);
        assert_eq!(t.decode::<Vec<u64>>().unwrap(), [1, 2, 3]);
        assert_eq!(&to_values(&vec![1u64, 2, 3]).unwrap()[..], &t.values()[..]);
        let m: BTreeMap<&str, u64> = t.decode().unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m["b"], 2);
    }

    #[test]
    fn single_values_and_newtypes() {
        #[derive(Serialize, Deserialize, Debug, PartialEq)]
        struct Count(u64);
        #[derive(Serialize, Deserialize, Debug, PartialEq)]
        struct Wrapped(Inner);

        assert_eq!(&to_values(&7u64).unwrap()[..], &[Value::UInt(7)]);
        assert_eq!(&to_values(&Count(7)).unwrap()[..], &[Value::UInt(7)]);
        assert_eq!(&to_values(&None::<u64>).unwrap()[..], &[Value::Null]);
        assert_eq!(&to_values(&Kind::Noun).unwrap()[..], &[Value::from("Noun")]);
        assert_eq!(&to_values("hi").unwrap()[..], &[Value::from("hi")]);
        let t = Tuple::new_for_test("c", "s", &["n"], values![7u64]);
        assert_eq!(t.decode::<u64>().unwrap(), 7);
        assert_eq!(t.decode::<Count>().unwrap(), Count(7));
        assert_eq!(t.decode::<Option<u64>>().unwrap(), Some(7));
        let t = Tuple::new_for_test("c", "s", &["n"], values![Value::Null]);
        assert_eq!(t.decode::<Option<u64>>().unwrap(), None);
        let t = Tuple::new_for_test("c", "s", &["k"], values!["verb"]);
        assert_eq!(t.decode::<Kind>().unwrap(), Kind::Verb);

        let w = Wrapped(Inner { x: 1, name: "n".into() });
        assert_eq!(fields_of::<Wrapped>().unwrap(), ["x", "name"]);
        assert_eq!(tuple_of(&w).decode::<Wrapped>().unwrap(), w);

        let t = Tuple::new_for_test("c", "s", &["a", "b"], values![1u64, 2u64]);
        let msg = t.decode::<u64>().unwrap_err().to_string();
        assert!(msg.contains("reads one value but the stream has 2 fields"), "{msg}");
    }

    #[test]
    fn bytes_values_read_as_byte_sequences() {
        #[derive(Deserialize, Debug, PartialEq)]
        struct B {
            data: Vec<u8>,
        }
        let t = Tuple::new_for_test("c", "s", &["data"], values![bytes::Bytes::from_static(b"\x01\x02")]);
        assert_eq!(t.decode::<B>().unwrap(), B { data: vec![1, 2] });
    }

    #[test]
    fn skipped_fields_keep_their_position() {
        #[derive(Serialize, Deserialize, Debug, PartialEq)]
        struct S {
            a: u64,
            #[serde(skip_serializing_if = "Option::is_none")]
            b: Option<u64>,
            c: u64,
        }
        let s = S { a: 1, b: None, c: 3 };
        assert_eq!(&to_values(&s).unwrap()[..], &[Value::UInt(1), Value::Null, Value::UInt(3)]);
        assert_eq!(tuple_of(&s).decode::<S>().unwrap(), s);
    }

    #[test]
    fn encode_errors_name_the_field_and_the_fix() {
        #[derive(Serialize)]
        struct Big {
            ok: u128,
            big: u128,
        }
        let err = to_values(&Big { ok: 1, big: u128::MAX }).unwrap_err();
        assert!(matches!(&err, TypedError::IntegerOutOfRange { field: Some(f), .. } if f == "big"), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("field `big`") && msg.contains("Big`") && msg.contains("use an i64/u64"), "{msg}");
        assert_eq!(
            &to_values(&(i128::from(i64::MIN), u128::from(u64::MAX))).unwrap()[..],
            &[Value::Int(i64::MIN), Value::UInt(u64::MAX)]
        );
        let err = to_values(&(0u8, i128::MIN)).unwrap_err();
        assert!(matches!(&err, TypedError::IntegerOutOfRange { field: Some(f), .. } if f == "1"), "{err:?}");

        let err = to_values(&BTreeMap::from([("a", 1)])).unwrap_err();
        assert!(matches!(err, TypedError::NotARecord { found: "a map", .. }), "{err:?}");
        let err = to_values(&Shape::Circle(1.0)).unwrap_err();
        assert!(err.to_string().contains("is an enum variant with data, not a record"), "{err}");

        #[derive(Serialize)]
        struct BadKeys {
            m: BTreeMap<(u8, u8), u8>,
        }
        let err = to_values(&BadKeys { m: BTreeMap::from([((1, 2), 3)]) }).unwrap_err();
        assert!(matches!(&err, TypedError::NestedJson { field: Some(f), .. } if f == "m"), "{err:?}");

        struct Fails;
        impl Serialize for Fails {
            fn serialize<S: Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
                Err(ser::Error::custom("no way"))
            }
        }
        let err = to_values(&(1u8, Fails)).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("field `1` of `{}` failed to serialize: no way", std::any::type_name::<(u8, Fails)>())
        );
    }

    #[test]
    fn fields_of_structs_only() {
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Renamed {
            #[serde(rename = "w")]
            word: String,
            #[serde(skip)]
            cache: u8,
            n: u8,
        }
        assert_eq!(fields_of::<Renamed>().unwrap(), ["w", "n"]);
        assert_eq!(fields_of::<Inner>().unwrap(), ["x", "name"]);

        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Flat {
            #[serde(flatten)]
            inner: Inner,
        }
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Pair(u8, u8);
        for (err, found) in [
            (fields_of::<Flat>().unwrap_err(), "#[serde(flatten)]"),
            (fields_of::<Pair>().unwrap_err(), "a tuple struct"),
            (fields_of::<u64>().unwrap_err(), "a single value"),
            (fields_of::<Kind>().unwrap_err(), "an enum"),
            (fields_of::<Option<Inner>>().unwrap_err(), "an Option"),
        ] {
            assert!(matches!(&err, TypedError::NotAStruct { found: f, .. } if f.contains(found)), "{err:?}");
            assert!(err.to_string().contains("declare the fields by hand"), "{err}");
        }
    }

    #[test]
    fn encoding_does_not_grow_past_the_field_count() {
        let values = to_values(&record()).unwrap();
        assert_eq!(values.0.capacity(), values.len());
        assert!(!values.0.spilled() || values.len() > 2);
        assert!(!to_values(&("a", 1u64)).unwrap().0.spilled());
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
    struct Random {
        s: String,
        i: i64,
        u: u64,
        f: f64,
        b: bool,
        o: Option<i32>,
        #[serde(with = "as_bytes")]
        bytes: Vec<u8>,
        kind: Kind,
        v: Vec<u32>,
        inner: Inner,
        tag: Option<Shape>,
    }

    fn random() -> impl Strategy<Value = Random> {
        let kind = prop_oneof![Just(Kind::Noun), Just(Kind::Verb)];
        let shape = prop_oneof![
            Just(Shape::Point),
            (-1000i32..1000).prop_map(|x| Shape::Circle(f64::from(x) / 4.0)),
            (any::<u32>(), any::<u32>()).prop_map(|(w, h)| Shape::Rect { w, h }),
        ];
        (
            (any::<String>(), any::<i64>(), any::<u64>(), any::<f64>().prop_filter("NaN", |f| !f.is_nan())),
            (any::<bool>(), any::<Option<i32>>(), proptest::collection::vec(any::<u8>(), 0..8), kind),
            (proptest::collection::vec(any::<u32>(), 0..4), any::<i32>(), any::<String>(), proptest::option::of(shape)),
        )
            .prop_map(|((s, i, u, f), (b, o, bytes, kind), (v, x, name, tag))| Random {
                s,
                i,
                u,
                f,
                b,
                o,
                bytes,
                kind,
                v,
                inner: Inner { x, name },
                tag,
            })
    }

    proptest! {
        #[test]
        fn roundtrip_random_records(r in random(), order in Just((0..11).collect::<Vec<usize>>()).prop_shuffle()) {
            let fields = fields_of::<Random>().unwrap();
            let values = to_values(&r).unwrap();
            prop_assert_eq!(values.len(), fields.len());
            // In declaration order.
            let t = Tuple::new_for_test("p", "s", &fields, values.clone());
            prop_assert_eq!(t.decode::<Random>().unwrap(), r.clone());
            // In any stream order: decoding is by name.
            let names: Vec<&str> = order.iter().map(|&i| fields[i]).collect();
            let shuffled: Values = order.iter().map(|&i| values[i].clone()).collect();
            let t = Tuple::new_for_test("p", "s", &names, shuffled);
            prop_assert_eq!(t.decode::<Random>().unwrap(), r);
        }
    }
}
