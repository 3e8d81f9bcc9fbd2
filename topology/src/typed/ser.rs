//! Encoding: a serde `Serializer` whose top level appends one [`Value`] per record field.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use serde::ser::{self, Impossible, Serialize, Serializer};
use smallvec::SmallVec;

use super::TypedError;
use crate::value::{Value, Values};

pub(super) fn to_values<T: Serialize + ?Sized>(v: &T) -> Result<Values, TypedError> {
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
