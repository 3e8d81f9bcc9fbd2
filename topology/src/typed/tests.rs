//! Round trips through both directions, the errors, and a property test.

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde::{Deserialize, Serialize};

use super::*;
use crate::value::{Value, Values};
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
            "borrowed", "owned", "u", "i", "f", "b", "some", "none", "bytes", "raw", "kind", "shape", "inner", "list",
            "map", "c", "unit"
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
    assert!(msg.contains("field `extra`") && msg.contains("Strict`") && msg.contains("deny_unknown_fields"), "{msg}");

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
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("no way"))
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
