//! The record format of intermediate streams: one Kinesis record per tuple, or one control record
//! (a producer's watermark, or its drain marker).
//!
//! ```text
//! record   = magic:u8 (0x53 'S') version:u8 (1) kind:u8 producer:u64le deployment:str watermark:varint body
//! kind     = 0 data | 1 watermark | 2 drain
//! watermark= 0 when the producer's low watermark is unknown, else millis + 1
//! body     = (data)    count:varint value*      (control) nothing
//! value    = 0 null | 1 false | 2 true | 3 int:zigzag-varint | 4 uint:varint | 5 float:f64le
//!          | 6 str:len-varint utf8 | 7 bytes:len-varint bytes
//! str      = len:varint utf8
//! ```
//!
//! Varints are LEB128 (7 bits per byte, low first). Field names are not carried: a stage's input
//! declares the fields of the stream the boundary reads from, and a record whose value count
//! differs is refused with both counts. Every record carries its producer's low watermark, so a
//! stage that writes data into a shard needs no separate watermark record for it; control
//! records go only to shards a producer wrote nothing to during a watermark interval. The
//! header costs 3 + 8 + 1 + len(deployment id) + 1..10 bytes: 25 to 34 bytes with the
//! 12-character deployment ids the workers use. A word of 6 letters is 8 bytes of body.

use bytes::Bytes;
use squall_topology::{Value, Values};

/// The first byte of every Squall record.
pub const MAGIC: u8 = 0x53;
/// The format version written.
pub const VERSION: u8 = 1;

/// What a record carries.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    /// One tuple's values, in the order of the boundary stream's declared fields.
    Data(Values),
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
    #[error("stage record format version {found} is not supported (this build reads version {VERSION}): upgrade the consuming workers first")]
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
    put_varint(out, watermark.map_or(0, |w| w.saturating_add(1)));
}

/// Encodes one tuple's values as a data record.
pub fn encode_data(producer: u64, deployment: &str, watermark: Option<u64>, values: &[Value]) -> Bytes {
    let mut out = Vec::with_capacity(32 + values.len() * 12);
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
    let watermark = r.varint()?.checked_sub(1);
    let payload = match kind {
        0 => {
            let n = r.len_values()?;
            if n != fields {
                return Err(DecodeError::FieldCount { found: n, expected: fields });
            }
            let mut values = Values::new();
            for _ in 0..n {
                values.push(r.value()?);
            }
            Payload::Data(values)
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
            5 => Value::Float(f64::from_le_bytes(
                self.take(8)?.try_into().map_err(|_| DecodeError::Malformed("float"))?,
            )),
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
            prop_assert_eq!(back.payload, Payload::Data(values.into_iter().collect()));
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
        let e = decode(&data, 1).unwrap_err();
        assert_eq!(e, DecodeError::FieldCount { found: 2, expected: 1 });
        let mut v2 = data.to_vec();
        v2[1] = 2;
        assert!(decode(&Bytes::from(v2), 2).unwrap_err().to_string().contains("version 2"));
    }

    #[test]
    fn a_word_record_is_small() {
        let rec = encode_data(u64::MAX, "0123456789ab", Some(1_764_590_000_000), &[Value::from("word42")]);
        // 3 + 8 + 13 + 6 (watermark) + 1 + 8
        assert_eq!(rec.len(), 39, "{rec:?}");
    }
}
