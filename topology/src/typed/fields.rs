//! Field names: a `Deserializer` that answers the first request with what was asked for,
//! capturing the `fields` serde's derive passes to `deserialize_struct`; and a `Serializer` that
//! lists the field names a record serializes with, without serializing their values.

use std::fmt;

use serde::Deserialize;
use serde::Serialize;
use serde::de::{self, Deserializer, Visitor};
use serde::ser::{self, Impossible, Serializer};

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

/// The field names `v` serializes with, in order (a newtype or `Some` seen through, fields
/// skipped by `skip_serializing_if` included: they keep their position): `None` for a value
/// whose fields have no names (a tuple, tuple struct, sequence or primitive).
pub(crate) fn record_field_names<T: Serialize + ?Sized>(v: &T) -> Option<Vec<&'static str>> {
    v.serialize(NameLister).ok()
}

/// Lists a struct's field names; anything else is [`Unnamed`].
struct NameLister;

/// A value without field names (or a `Serialize` that failed).
#[derive(Debug)]
struct Unnamed;

impl fmt::Display for Unnamed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value without field names")
    }
}

impl std::error::Error for Unnamed {}

impl ser::Error for Unnamed {
    fn custom<M: fmt::Display>(_msg: M) -> Self {
        Unnamed
    }
}

/// The names of a struct's fields, as serialized.
struct Names(Vec<&'static str>);

impl ser::SerializeStruct for Names {
    type Ok = Vec<&'static str>;
    type Error = Unnamed;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, _value: &T) -> Result<(), Unnamed> {
        self.0.push(key);
        Ok(())
    }
    fn skip_field(&mut self, key: &'static str) -> Result<(), Unnamed> {
        self.0.push(key);
        Ok(())
    }
    fn end(self) -> Result<Vec<&'static str>, Unnamed> {
        Ok(self.0)
    }
}

macro_rules! unnamed {
    ($($method:ident($($ty:ty),*)),* $(,)?) => {$(
        fn $method(self, $(_: $ty),*) -> Result<Vec<&'static str>, Unnamed> {
            Err(Unnamed)
        }
    )*};
}

impl Serializer for NameLister {
    type Ok = Vec<&'static str>;
    type Error = Unnamed;
    type SerializeSeq = Impossible<Vec<&'static str>, Unnamed>;
    type SerializeTuple = Impossible<Vec<&'static str>, Unnamed>;
    type SerializeTupleStruct = Impossible<Vec<&'static str>, Unnamed>;
    type SerializeTupleVariant = Impossible<Vec<&'static str>, Unnamed>;
    type SerializeMap = Impossible<Vec<&'static str>, Unnamed>;
    type SerializeStruct = Names;
    type SerializeStructVariant = Impossible<Vec<&'static str>, Unnamed>;

    unnamed! {
        serialize_bool(bool), serialize_i8(i8), serialize_i16(i16), serialize_i32(i32), serialize_i64(i64),
        serialize_i128(i128), serialize_u8(u8), serialize_u16(u16), serialize_u32(u32), serialize_u64(u64),
        serialize_u128(u128), serialize_f32(f32), serialize_f64(f64), serialize_char(char), serialize_str(&str),
        serialize_bytes(&[u8]), serialize_none(), serialize_unit(), serialize_unit_struct(&'static str),
        serialize_unit_variant(&'static str, u32, &'static str),
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<Vec<&'static str>, Unnamed> {
        value.serialize(self)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<Vec<&'static str>, Unnamed> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<Vec<&'static str>, Unnamed> {
        Err(Unnamed)
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, Unnamed> {
        Err(Unnamed)
    }
    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, Unnamed> {
        Err(Unnamed)
    }
    fn serialize_tuple_struct(self, _name: &'static str, _len: usize) -> Result<Self::SerializeTupleStruct, Unnamed> {
        Err(Unnamed)
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, Unnamed> {
        Err(Unnamed)
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, Unnamed> {
        Err(Unnamed)
    }
    fn serialize_struct(self, _name: &'static str, len: usize) -> Result<Names, Unnamed> {
        Ok(Names(Vec::with_capacity(len)))
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, Unnamed> {
        Err(Unnamed)
    }
}

#[cfg(test)]
mod tests {
    use super::record_field_names;

    #[derive(serde::Serialize)]
    struct Named {
        b: u64,
        #[serde(rename = "x")]
        a: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        c: Option<u8>,
        #[serde(skip)]
        _d: u8,
    }

    #[derive(serde::Serialize)]
    struct Wrapper(Named);

    #[derive(serde::Serialize)]
    struct Pair(u64, u64);

    #[test]
    fn record_field_names_in_serialization_order() {
        let n = Named { b: 1, a: "a".into(), c: None, _d: 0 };
        assert_eq!(record_field_names(&n), Some(vec!["b", "x", "c"]));
        assert_eq!(record_field_names(&Wrapper(n)), Some(vec!["b", "x", "c"]));
        assert_eq!(record_field_names(&Pair(1, 2)), None);
        assert_eq!(record_field_names(&(1u8, "x")), None);
        assert_eq!(record_field_names(&7u64), None);
    }
}
