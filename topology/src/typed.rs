//! Typed tuples through serde: a Rust struct becomes a tuple's [`Values`], and a [`Tuple`]
//! decodes back into the struct, by field name.
//!
//! - [`to_values`] encodes any `Serialize` record into the values of one tuple, one value per
//!   field in declaration order (the order [`fields_of`] returns, so the two agree).
//! - [`from_tuple`] (or [`Tuple::decode`]) decodes a tuple: a struct reads the tuple as a map
//!   from the stream's field names to values, so the struct's field order need not match the
//!   stream's, and the struct may read a subset of the stream's fields.
//! - [`fields_of`] lists a struct's field names, to declare a stream's fields from the type.
//! - [`BoltOutput::emit_record`](crate::BoltOutput::emit_record) and
//!   [`Inputs::for_each_record`](crate::Inputs::for_each_record) skip the encoding where they
//!   can: the record travels as itself, and is encoded as below only for a reader of tuples.
//!
//! The serializer is in `typed/ser.rs`, the deserializer in `typed/de.rs`, the field-name tracer
//! in `typed/fields.rs`; this file holds the public functions and [`TypedError`].
//!
//! # Encoding
//!
//! | Rust (serde data model)                         | [`Value`](crate::Value)          |
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

use serde::{Deserialize, Serialize};

use crate::tuple::{Tuple, TupleError};
use crate::value::Values;

mod de;
mod fields;
mod ser;
#[cfg(test)]
mod tests;

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

/// Encodes a record into the values of one tuple: one value per field, in declaration order.
/// See the [module docs](self) for the mapping.
pub fn to_values<T: Serialize + ?Sized>(v: &T) -> Result<Values, TypedError> {
    ser::to_values(v)
}

/// Decodes a tuple into `T`: a struct by field name, a tuple struct, tuple or `Vec` in stream
/// order, a primitive from a one-field stream. See the [module docs](self). [`Tuple::decode`]
/// calls this.
pub fn from_tuple<'de, T: Deserialize<'de>>(t: &'de Tuple) -> Result<T, TupleError> {
    de::from_tuple(t)
}

/// The field names of a struct, in declaration order (their serialized names, after
/// `#[serde(rename)]`): the order [`to_values`] encodes them in, to declare a stream's fields.
///
/// Read from the `fields` list serde's derive passes to `deserialize_struct`; a newtype struct
/// is seen through. Anything else (a tuple struct, a map, a struct with `#[serde(flatten)]`, an
/// enum, a primitive) is [`TypedError::NotAStruct`]. Fields skipped with `#[serde(skip)]` are not
/// listed (and not encoded).
pub fn fields_of<'de, T: Deserialize<'de>>() -> Result<Vec<&'static str>, TypedError> {
    fields::fields_of::<T>()
}

/// The field names a record serializes with, in order; `None` for a value whose fields have no
/// names (see `typed/fields.rs`).
pub(crate) fn record_field_names<T: Serialize + ?Sized>(v: &T) -> Option<Vec<&'static str>> {
    fields::record_field_names(v)
}

/// What `emit` accepts: dynamic values ([`Values`], [`Value`](crate::Value), `Vec<Value>`, an
/// array of values) or a reference to any `Serialize` record, encoded with [`to_values`]:
/// `out.emit(&Word { .. })`.
pub trait IntoValues {
    /// The values of one tuple.
    fn into_values(self) -> Result<Values, TypedError>;
}

impl IntoValues for Values {
    #[inline(always)]
    fn into_values(self) -> Result<Values, TypedError> {
        Ok(self)
    }
}

impl IntoValues for crate::Value {
    #[inline(always)]
    fn into_values(self) -> Result<Values, TypedError> {
        Ok(Values::from(self))
    }
}

impl IntoValues for Vec<crate::Value> {
    #[inline]
    fn into_values(self) -> Result<Values, TypedError> {
        Ok(Values::from(self))
    }
}

impl<T: Into<crate::Value>, const N: usize> IntoValues for [T; N] {
    #[inline]
    fn into_values(self) -> Result<Values, TypedError> {
        Ok(Values::from(self))
    }
}

impl<R: Serialize + ?Sized> IntoValues for &R {
    #[inline]
    fn into_values(self) -> Result<Values, TypedError> {
        to_values(self)
    }
}
