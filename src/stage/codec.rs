//! The record format of intermediate streams: one Kinesis record per tuple, or one control record
//! (a producer's watermark, or its drain marker).
//!
//! ```text
//! record   = magic:u8 (0x53 'S') version:u8 (1) kind:u8 producer:u64le deployment:str watermark:u64le body
//! kind     = 0 data | 1 watermark | 2 drain
//! watermark= 0 when the producer's low watermark is unknown, else millis + 1
//! body     = (data)    tuple+ (to the end of the record)      (control) nothing
//! tuple    = count:varint value*
//! value    = 0 null | 1 false | 2 true | 3 int:zigzag-varint | 4 uint:varint | 5 float:f64le
//!          | 6 str:len-varint utf8 | 7 bytes:len-varint bytes
//! str      = len:varint utf8
//! ```
//!
//! Varints are LEB128 (7 bits per byte, low first). Field names are not carried: a stage's input
//! declares the fields of the stream the boundary reads from, and a tuple whose value count
//! differs is refused with both counts. A data record carries one or more tuples of one key:
//! the boundary writer appends the tuples of a key buffered behind each other into one record
//! ([`append`], up to 1 MiB), as the KPL aggregates, so a hot key costs one Kinesis record per
//! PutRecords call rather than one call per tuple, and the record is acked, checkpointed and
//! replayed as a whole. Every record carries its producer's low watermark (of its last tuple),
//! so a stage that writes data into a shard needs no separate watermark record for it; control
//! records go only to shards a producer wrote nothing to during a watermark interval. The
//! header costs 3 + 8 + 1 + len(deployment id) + 8 bytes: 32 bytes with the 12-character
//! deployment ids the workers use. A word of 6 letters is 9 bytes of body.

use bytes::Bytes;
use squall_topology::{Value, Values};

/// The first byte of every Squall record.
pub const MAGIC: u8 = 0x53;
/// The format version written.
pub const VERSION: u8 = 1;

/// What a record carries.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    /// Tuples of one key, each with the values of the boundary stream's declared fields, in
    /// the order they were written.
    Data(Vec<Values>),
    /// The producer's low watermark advanced (it is in the header); nothing else.
    Watermark,
    /// The producer drained: it writes nothing more to this shard in this deployment.
    Drain,
}

/// A decoded record.
#[derive(Debug, Clone, PartialEq)]
pub struct StageRecord {
    /// The producing task's id (random per task start, registered in ZooKeeper).
    pub producer: u64,
    /// The deployment the producer belongs to.
    pub deployment: String,
    /// The producer's low watermark when it wrote the record (ms), if known.
    pub watermark: Option<u64>,
    /// Data or control.
    pub payload: Payload,
}

/// Why a record did not decode. Each names what was found and what was expected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DecodeError {
    /// Not a Squall record (another producer wrote to the intermediate stream).
    #[error(
        "not a Squall stage record (first byte {found:#04x}, expected {MAGIC:#04x}): only Squall stage boundaries may write to an intermediate stream"
    )]
    Magic {
        /// The first byte found.
        found: u8,
    },
    /// Written by a newer Squall.
    #[error(
        "stage record format version {found} is not supported (this build reads version {VERSION}): upgrade the consuming workers first"
    )]
    Version {
        /// The version found.
        found: u8,
    },
    /// Cut short or garbled.
    #[error("stage record is malformed: {0}")]
    Malformed(&'static str),
    /// The producer's stream has another number of fields than this stage's input declares.
    #[error(
        "stage record carries {found} values but the stage's input declares {expected} fields; the stages of a topology must be deployed together"
    )]
    FieldCount {
        /// Values in the record.
        found: usize,
        /// Fields declared.
        expected: usize,
    },
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    put_varint(out, s.len() as u64);
    out.extend_from_slice(s);
}

fn header(out: &mut Vec<u8>, kind: u8, producer: u64, deployment: &str, watermark: Option<u64>) {
    out.extend_from_slice(&[MAGIC, VERSION, kind]);
    out.extend_from_slice(&producer.to_le_bytes());
    put_str(out, deployment.as_bytes());
    out.extend_from_slice(&watermark.map_or(0, |w| w.saturating_add(1)).to_le_bytes());
}

/// Encodes one tuple's values as a data record.
pub fn encode_data(producer: u64, deployment: &str, watermark: Option<u64>, values: &[Value]) -> Bytes {
    let mut out = Vec::with_capacity(40 + values.len() * 12);
    header(&mut out, 0, producer, deployment, watermark);
    put_varint(&mut out, values.len() as u64);
    for v in values {
        match v {
            Value::Null => out.push(0),
            Value::Bool(false) => out.push(1),
            Value::Bool(true) => out.push(2),
            Value::Int(i) => {
                out.push(3);
                put_varint(&mut out, ((*i << 1) ^ (*i >> 63)) as u64);
            }
            Value::UInt(u) => {
                out.push(4);
                put_varint(&mut out, *u);
            }
            Value::Float(f) => {
                out.push(5);
                out.extend_from_slice(&f.to_le_bytes());
            }
            Value::Str(s) => {
                out.push(6);
                put_str(&mut out, s.as_bytes());
            }
            Value::Bytes(b) => {
                out.push(7);
                put_str(&mut out, b);
            }
        }
    }
    Bytes::from(out)
}

/// The header length of a record (up to the body), checking it is a data record.
fn data_header_len(data: &[u8]) -> Result<usize, DecodeError> {
    let mut r = Reader { b: data, data: &Bytes::new() };
    let magic = r.byte()?;
    if magic != MAGIC {
        return Err(DecodeError::Magic { found: magic });
    }
    if r.byte()? != VERSION {
        return Err(DecodeError::Version { found: data[1] });
    }
    if r.byte()? != 0 {
        return Err(DecodeError::Malformed("not a data record"));
    }
    r.take(8)?;
    let n = r.len()?;
    r.take(n)?;
    r.take(8)?;
    Ok(data.len() - r.b.len())
}

/// Appends the tuples of data record `next` to data record `into` (both of one producer, `next`
/// written after `into`); `into` takes `next`'s watermark. Copies only `next`'s body when
/// `into`'s buffer is not shared.
pub fn append(into: &mut Bytes, next: &Bytes) -> Result<(), DecodeError> {
    let head = data_header_len(into)?;
    let next_head = data_header_len(next)?;
    if into[3..head - 8] != next[3..next_head - 8] {
        return Err(DecodeError::Malformed("records of different producers or deployments"));
    }
    let mut m = bytes::BytesMut::from(std::mem::take(into));
    m[head - 8..head].copy_from_slice(&next[next_head - 8..next_head]);
    m.extend_from_slice(&next[next_head..]);
    *into = m.freeze();
    Ok(())
}

/// Encodes a control record: the producer's watermark, or its drain marker.
pub fn encode_control(producer: u64, deployment: &str, watermark: Option<u64>, drain: bool) -> Bytes {
    let mut out = Vec::with_capacity(32);
    header(&mut out, if drain { 2 } else { 1 }, producer, deployment, watermark);
    Bytes::from(out)
}

struct Reader<'a> {
    b: &'a [u8],
    data: &'a Bytes,
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Result<u8, DecodeError> {
        let (&x, rest) = self.b.split_first().ok_or(DecodeError::Malformed("record cut short"))?;
        self.b = rest;
        Ok(x)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.b.len() < n {
            return Err(DecodeError::Malformed("record cut short"));
        }
        let (x, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(x)
    }

    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let x = self.byte()?;
            v |= u64::from(x & 0x7f) << shift;
            if x & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(DecodeError::Malformed("varint longer than 10 bytes"))
    }

    fn len(&mut self) -> Result<usize, DecodeError> {
        let n = self.varint()?;
        usize::try_from(n).ok().filter(|n| *n <= self.b.len()).ok_or(DecodeError::Malformed("length past the end"))
    }

    fn str(&mut self) -> Result<&'a str, DecodeError> {
        let n = self.len()?;
        std::str::from_utf8(self.take(n)?).map_err(|_| DecodeError::Malformed("string is not UTF-8"))
    }
}

/// Decodes a record; `fields` is the number of fields the stage's input declares.
pub fn decode(data: &Bytes, fields: usize) -> Result<StageRecord, DecodeError> {
    let mut r = Reader { b: data, data };
    let magic = r.byte()?;
    if magic != MAGIC {
        return Err(DecodeError::Magic { found: magic });
    }
    let version = r.byte()?;
    if version != VERSION {
        return Err(DecodeError::Version { found: version });
    }
    let kind = r.byte()?;
    let producer = u64::from_le_bytes(r.take(8)?.try_into().map_err(|_| DecodeError::Malformed("producer"))?);
    let deployment = r.str()?.to_owned();
    let watermark =
        u64::from_le_bytes(r.take(8)?.try_into().map_err(|_| DecodeError::Malformed("watermark"))?).checked_sub(1);
    let payload = match kind {
        0 => {
            let mut tuples = Vec::new();
            loop {
                let n = r.len_values()?;
                if n != fields {
                    return Err(DecodeError::FieldCount { found: n, expected: fields });
                }
                let mut values = Values::new();
                for _ in 0..n {
                    values.push(r.value()?);
                }
                tuples.push(values);
                if r.b.is_empty() {
                    break;
                }
            }
            Payload::Data(tuples)
        }
        1 => Payload::Watermark,
        2 => Payload::Drain,
        _ => return Err(DecodeError::Malformed("unknown record kind")),
    };
    if !r.b.is_empty() {
        return Err(DecodeError::Malformed("trailing bytes"));
    }
    Ok(StageRecord { producer, deployment, watermark, payload })
}

impl Reader<'_> {
    fn len_values(&mut self) -> Result<usize, DecodeError> {
        // every value takes at least one byte
        self.len()
    }

    fn value(&mut self) -> Result<Value, DecodeError> {
        Ok(match self.byte()? {
            0 => Value::Null,
            1 => Value::Bool(false),
            2 => Value::Bool(true),
            3 => {
                let z = self.varint()?;
                Value::Int(((z >> 1) as i64) ^ -((z & 1) as i64))
            }
            4 => Value::UInt(self.varint()?),
            5 => {
                Value::Float(f64::from_le_bytes(self.take(8)?.try_into().map_err(|_| DecodeError::Malformed("float"))?))
            }
            6 => Value::Str(self.str()?.into()),
            7 => {
                let n = self.len()?;
                let start = self.data.len() - self.b.len();
                self.take(n)?;
                // a slice of the record's buffer: no copy
                Value::from(self.data.slice(start..start + n))
            }
            _ => return Err(DecodeError::Malformed("unknown value tag")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn value() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::Int),
            any::<u64>().prop_map(Value::UInt),
            any::<f64>().prop_filter("NaN never equals itself", |f| !f.is_nan()).prop_map(Value::Float),
            ".{0,40}".prop_map(|s| Value::Str(s.into())),
            proptest::collection::vec(any::<u8>(), 0..64).prop_map(Value::from),
        ]
    }

    proptest! {
        #[test]
        fn data_round_trips(values in proptest::collection::vec(value(), 0..8), producer in any::<u64>(), wm in proptest::option::of(0u64..u64::MAX - 1)) {
            let rec = encode_data(producer, "d3adb33f0001", wm, &values);
            let back = decode(&rec, values.len()).unwrap();
            prop_assert_eq!(back.producer, producer);
            prop_assert_eq!(back.deployment.as_str(), "d3adb33f0001");
            prop_assert_eq!(back.watermark, wm);
            prop_assert_eq!(back.payload, Payload::Data(vec![values.into_iter().collect()]));
        }

        #[test]
        fn appended_records_carry_every_tuple_in_order(
            tuples in proptest::collection::vec(proptest::collection::vec(value(), 2), 1..20),
        ) {
            let mut rec = encode_data(3, "dep", Some(1), &tuples[0]);
            for (i, t) in tuples.iter().enumerate().skip(1) {
                append(&mut rec, &encode_data(3, "dep", Some(1 + i as u64), t)).unwrap();
            }
            let back = decode(&rec, 2).unwrap();
            prop_assert_eq!(back.watermark, Some(tuples.len() as u64));
            let want: Vec<Values> = tuples.into_iter().map(|t| t.into_iter().collect()).collect();
            prop_assert_eq!(back.payload, Payload::Data(want));
        }

        #[test]
        fn garbage_never_panics(data in proptest::collection::vec(any::<u8>(), 0..80), fields in 0usize..4) {
            let _ = decode(&Bytes::from(data), fields);
        }

        #[test]
        fn every_truncation_is_an_error(values in proptest::collection::vec(value(), 1..6), cut in any::<prop::sample::Index>()) {
            let rec = encode_data(7, "dep", Some(5), &values);
            let cut = cut.index(rec.len());
            prop_assert!(decode(&rec.slice(..cut), values.len()).is_err());
        }
    }

    #[test]
    fn control_records_and_errors_name_the_problem() {
        let wm = encode_control(9, "dep1", Some(1234), false);
        assert_eq!(
            decode(&wm, 3).unwrap(),
            StageRecord { producer: 9, deployment: "dep1".into(), watermark: Some(1234), payload: Payload::Watermark }
        );
        let drain = encode_control(9, "dep1", None, true);
        assert_eq!(decode(&drain, 3).unwrap().payload, Payload::Drain);
        assert_eq!(decode(&drain, 3).unwrap().watermark, None);
        let e = decode(&Bytes::from_static(b"{\"json\":1}"), 1).unwrap_err();
        assert!(e.to_string().contains("not a Squall stage record"), "{e}");
        let data = encode_data(1, "d", None, &[Value::from("word"), Value::UInt(1)]);
        assert!(
            append(&mut data.clone(), &encode_data(2, "d", None, &[Value::Null, Value::Null])).is_err(),
            "producers differ"
        );
        assert!(append(&mut data.clone(), &drain).is_err(), "not a data record");
        let e = decode(&data, 1).unwrap_err();
        assert_eq!(e, DecodeError::FieldCount { found: 2, expected: 1 });
        let mut v2 = data.to_vec();
        v2[1] = 2;
        assert!(decode(&Bytes::from(v2), 2).unwrap_err().to_string().contains("version 2"));
    }

    #[test]
    fn a_word_record_is_small() {
        let rec = encode_data(u64::MAX, "0123456789ab", Some(1_764_590_000_000), &[Value::from("word42")]);
        // 3 + 8 + 13 + 8 (watermark) + 1 + 8
        assert_eq!(rec.len(), 41, "{rec:?}");
    }
}
