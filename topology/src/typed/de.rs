//! Decoding: a serde `Deserializer` over a borrowed [`Tuple`]: a map of field names to values,
//! or a sequence of values; strings and bytes are lent, not copied.

use std::fmt;

use serde::Deserialize;
use serde::de::value::{BorrowedStrDeserializer, SeqDeserializer};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::tuple::{Tuple, TupleError};
use crate::value::Value;

pub(super) fn from_tuple<'de, T: Deserialize<'de>>(t: &'de Tuple) -> Result<T, TupleError> {
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
