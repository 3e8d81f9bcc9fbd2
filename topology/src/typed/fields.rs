//! Field names: a `Deserializer` that answers the first request with what was asked for,
//! capturing the `fields` serde's derive passes to `deserialize_struct`.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use super::TypedError;

pub(super) fn fields_of<'de, T: Deserialize<'de>>() -> Result<Vec<&'static str>, TypedError> {
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
