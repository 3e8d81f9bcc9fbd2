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
        self.out.reserve(len.unwrap_or(0));
        Ok(RecordFields { out: self.out, index: 0 })
    }
    fn serialize_tuple(self, len: usize) -> Result<RecordFields<'a>, SerError> {
        self.out.reserve(len);
        Ok(RecordFields { out: self.out, index: 0 })
    }
    fn serialize_tuple_struct(self, _name: &'static str, len: usize) -> Result<RecordFields<'a>, SerError> {
        self.out.reserve(len);
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
        self.out.reserve(len);
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
