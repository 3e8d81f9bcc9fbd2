//! What the sink writes: [`SinkRecord`]s made by a [`SinkEncoder`] from tuples (one per input)
//! and, for stage boundaries, from watermarks and drain; [`FieldsEncoder`] is the built-in one.

use bytes::Bytes;
use serde::ser::{SerializeMap, SerializeSeq};

use crate::topology::{ComponentError, Tuple, Value, Watermark};

/// One Kinesis record to put.
#[derive(Clone, PartialEq, Eq)]
pub struct SinkRecord {
    /// The partition key (1-256 characters): records of one key keep their order.
    pub partition_key: String,
    /// A decimal 128-bit hash key that picks the shard instead of the partition key's hash.
    pub explicit_hash_key: Option<String>,
    /// The data blob (at most 1 MiB).
    pub data: Bytes,
}

impl SinkRecord {
    /// A record with a partition key and data.
    pub fn new(partition_key: impl Into<String>, data: impl Into<Bytes>) -> Self {
        Self { partition_key: partition_key.into(), explicit_hash_key: None, data: data.into() }
    }

    /// Sends the record to the shard whose hash range holds `hash_key` (a decimal number).
    pub fn with_explicit_hash_key(mut self, hash_key: impl Into<String>) -> Self {
        self.explicit_hash_key = Some(hash_key.into());
        self
    }

    /// The bytes the record counts for in a PutRecords call (data and keys).
    pub fn size(&self) -> usize {
        self.data.len() + self.partition_key.len() + self.explicit_hash_key.as_ref().map_or(0, String::len)
    }

    /// Checks Kinesis' limits; the message names the offending part.
    pub(crate) fn check(&self) -> Result<(), String> {
        let n = self.partition_key.chars().count();
        if !(1..=256).contains(&n) {
            return Err(format!("partition key has {n} characters; Kinesis needs 1..=256"));
        }
        if self.data.len() > super::config::MAX_RECORD_BYTES {
            return Err(format!("data has {} bytes; a Kinesis record holds at most 1 MiB", self.data.len()));
        }
        if let Some(h) = &self.explicit_hash_key
            && (h.is_empty() || !h.bytes().all(|b| b.is_ascii_digit()) || h.parse::<u128>().is_err())
        {
            return Err(format!("explicit hash key {h:?} is not a decimal number in 0..2^128"));
        }
        Ok(())
    }
}

impl std::fmt::Debug for SinkRecord {
    // the data may be anything (and large): its length only
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkRecord")
            .field("partition_key", &self.partition_key)
            .field("explicit_hash_key", &self.explicit_hash_key)
            .field("data_len", &self.data.len())
            .finish()
    }
}

/// An open shard of the sink's stream, as handed to [`SinkEncoder::on_watermark`] and
/// [`SinkEncoder::on_drain`] (e.g. to write one marker record per shard, with the shard's
/// starting hash key as explicit hash key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenShard {
    /// The shard id, e.g. `shardId-000000000003`.
    pub shard_id: String,
    /// Lowest hash key, a decimal string.
    pub starting_hash_key: String,
    /// Highest hash key, a decimal string.
    pub ending_hash_key: String,
}

/// Turns the sink's inputs into records. Only [`SinkEncoder::encode`] is required.
///
/// Records from the hooks are written in order after every record encoded before them (per
/// key, as always); they belong to no input, so nothing is acked or failed for them.
pub trait SinkEncoder: Send + 'static {
    /// The record of one input tuple. An error fails that input only (it is counted and
    /// logged with the stream's name); the message should name the field.
    fn encode(&mut self, t: &Tuple) -> Result<SinkRecord, ComponentError>;

    /// Whether the hooks need the stream's open shards. When false (the default) the hooks get
    /// an empty slice and the sink never calls ListShards.
    fn needs_shards(&self) -> bool {
        false
    }

    /// Whether records must not overtake a watermark or the drain on their way into the stream.
    /// When true, each watermark the sink receives and its drain start a new epoch: the records
    /// buffered after it (the hook's own first) are put only once every record buffered before
    /// it has been put — acknowledged by Kinesis, or given up — whatever their keys and shards
    /// (so also through throttled records retried later, and shard maps gone stale after a
    /// reshard). A consumer that derives watermarks from the records in each shard needs it; it
    /// costs up to one PutRecords round trip per watermark. False by default: only the per-key
    /// order holds.
    fn watermark_barriers(&self) -> bool {
        false
    }

    /// Records to write when the sink's input watermark advances to `wm`.
    fn on_watermark(&mut self, wm: Watermark, shards: &[OpenShard]) -> Vec<SinkRecord> {
        let _ = (wm, shards);
        Vec::new()
    }

    /// Merges `next` into `into`, two records of one key (partition and explicit hash key)
    /// waiting to be put, `next` encoded after `into`, when the encoder's format can carry
    /// both in one record (an aggregated record, as the KPL writes). The merged record is put,
    /// acked and retried as one, so a hot key costs one record per PutRecords call instead of
    /// one call per record. The sink only offers merges that stay within 1 MiB. Default: never.
    fn combine(&mut self, into: &mut SinkRecord, next: &SinkRecord) -> bool {
        let _ = (into, next);
        false
    }

    /// Records to write when every input drained, before the final flush.
    fn on_drain(&mut self, shards: &[OpenShard]) -> Vec<SinkRecord> {
        let _ = shards;
        Vec::new()
    }
}

#[derive(Clone, Debug)]
enum Data {
    /// One field, bytes or a string.
    Field(String),
    /// Every field as a JSON object.
    Json,
}

/// The built-in encoder: the partition key from one or more named fields (their text joined by
/// a separator, `|` by default), the data from one named field (bytes or a string) or, by
/// default, the whole tuple as a JSON object of its fields (bytes that are not UTF-8 become an
/// array of numbers).
///
/// ```
/// use squall::sink::{FieldsEncoder, SinkEncoder};
/// use squall::topology::{Tuple, Value};
/// let t = Tuple::new_for_test("s", "default", &["user", "n"], vec![Value::from("ann"), Value::from(3u64)].into());
/// let mut e = FieldsEncoder::new(&["user"]);
/// let r = e.encode(&t).unwrap();
/// assert_eq!(r.partition_key, "ann");
/// assert_eq!(&r.data[..], br#"{"user":"ann","n":3}"#);
/// ```
#[derive(Clone, Debug)]
pub struct FieldsEncoder {
    key_fields: Vec<String>,
    separator: String,
    data: Data,
    hash_key_field: Option<String>,
}

impl FieldsEncoder {
    /// Partition key from `key_fields` (at least one); data: the tuple as JSON.
    pub fn new<S: AsRef<str>>(key_fields: &[S]) -> Self {
        Self {
            key_fields: key_fields.iter().map(|s| s.as_ref().to_owned()).collect(),
            separator: "|".into(),
            data: Data::Json,
            hash_key_field: None,
        }
    }

    /// The data is this field's value (bytes, or a string's UTF-8).
    pub fn data_field(mut self, field: impl Into<String>) -> Self {
        self.data = Data::Field(field.into());
        self
    }

    /// The separator between key fields (default `|`).
    pub fn separator(mut self, sep: impl Into<String>) -> Self {
        self.separator = sep.into();
        self
    }

    /// The explicit hash key is this field's value (a decimal number, as string or integer).
    pub fn explicit_hash_key_field(mut self, field: impl Into<String>) -> Self {
        self.hash_key_field = Some(field.into());
        self
    }

    fn text(t: &Tuple, field: &str, what: &str) -> Result<String, ComponentError> {
        let bad = |why: &str| ComponentError::fatal(format!("{what} field {field:?} {why}"));
        Ok(match t.get(field)? {
            Value::Str(s) => s.to_string(),
            Value::Int(i) => i.to_string(),
            Value::UInt(u) => u.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Float(x) => x.to_string(),
            Value::Bytes(b) => String::from_utf8(b.to_vec()).map_err(|_| bad("holds bytes that are not UTF-8"))?,
            Value::Null => return Err(bad("is null")),
        })
    }
}

impl SinkEncoder for FieldsEncoder {
    fn encode(&mut self, t: &Tuple) -> Result<SinkRecord, ComponentError> {
        if self.key_fields.is_empty() {
            return Err(ComponentError::fatal("FieldsEncoder has no key fields; name at least one"));
        }
        let mut key = String::new();
        for (i, f) in self.key_fields.iter().enumerate() {
            if i > 0 {
                key.push_str(&self.separator);
            }
            key.push_str(&Self::text(t, f, "partition key")?);
        }
        let data = match &self.data {
            Data::Field(f) => match t.get(f)? {
                Value::Bytes(b) => Bytes::clone(b),
                Value::Str(s) => Bytes::copy_from_slice(s.as_bytes()),
                v => {
                    return Err(ComponentError::fatal(format!(
                        "data field {f:?} is {}; it must be bytes or str",
                        v.type_name()
                    )));
                }
            },
            Data::Json => Bytes::from(
                serde_json::to_vec(&JsonTuple(t))
                    .map_err(|e| ComponentError::fatal_from("tuple does not encode as JSON", e))?,
            ),
        };
        let explicit_hash_key = match &self.hash_key_field {
            Some(f) => Some(Self::text(t, f, "explicit hash key")?),
            None => None,
        };
        Ok(SinkRecord { partition_key: key, explicit_hash_key, data })
    }
}

/// A tuple as a JSON object of its fields, in declared order.
struct JsonTuple<'a>(&'a Tuple);

struct JsonValue<'a>(&'a Value);

impl serde::Serialize for JsonTuple<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let fields = self.0.fields();
        let mut m = s.serialize_map(Some(fields.len()))?;
        for (i, name) in fields.iter().enumerate() {
            m.serialize_entry(name, &JsonValue(self.0.get_at(i)))?;
        }
        m.end()
    }
}

impl serde::Serialize for JsonValue<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Null => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(i) => s.serialize_i64(*i),
            Value::UInt(u) => s.serialize_u64(*u),
            Value::Float(x) if x.is_finite() => s.serialize_f64(*x),
            Value::Float(_) => s.serialize_unit(),
            Value::Str(v) => s.serialize_str(v),
            Value::Bytes(b) => match std::str::from_utf8(b) {
                Ok(text) => s.serialize_str(text),
                Err(_) => {
                    let mut seq = s.serialize_seq(Some(b.len()))?;
                    for byte in b.iter() {
                        seq.serialize_element(byte)?;
                    }
                    seq.end()
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuple(fields: &[&str], values: Vec<Value>) -> Tuple {
        Tuple::new_for_test("spout", "default", fields, values.into())
    }

    #[test]
    fn key_from_several_fields_and_data_from_one() {
        let t = tuple(&["a", "b", "body"], vec![Value::from("x"), Value::from(7i64), Value::from(b"raw".to_vec())]);
        let r = FieldsEncoder::new(&["a", "b"]).data_field("body").encode(&t).unwrap();
        assert_eq!(r.partition_key, "x|7");
        assert_eq!(&r.data[..], b"raw");
        let r = FieldsEncoder::new(&["a", "b"]).separator("/").data_field("a").encode(&t).unwrap();
        assert_eq!((r.partition_key.as_str(), &r.data[..]), ("x/7", &b"x"[..]));
    }

    #[test]
    fn whole_tuple_as_json_in_field_order() {
        let t = tuple(
            &["z", "a", "f", "n", "b"],
            vec![Value::from("s"), Value::Null, Value::Float(1.5), Value::from(-2i64), Value::from(vec![0xffu8, 1])],
        );
        let r = FieldsEncoder::new(&["z"]).encode(&t).unwrap();
        assert_eq!(std::str::from_utf8(&r.data).unwrap(), r#"{"z":"s","a":null,"f":1.5,"n":-2,"b":[255,1]}"#);
    }

    #[test]
    fn errors_name_the_field() {
        let t = tuple(&["k", "n"], vec![Value::Null, Value::from(1u64)]);
        let e = FieldsEncoder::new(&["k"]).encode(&t).unwrap_err();
        assert!(e.to_string().contains("\"k\" is null"), "{e}");
        let e = FieldsEncoder::new(&["missing"]).encode(&t).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
        let t = tuple(&["k", "n"], vec![Value::from("a"), Value::from(1u64)]);
        let e = FieldsEncoder::new(&["k"]).data_field("n").encode(&t).unwrap_err();
        assert!(e.to_string().contains("data field \"n\" is uint"), "{e}");
    }

    #[test]
    fn records_are_checked_against_kinesis_limits() {
        assert!(SinkRecord::new("k", vec![0u8; 10]).check().is_ok());
        assert!(SinkRecord::new("", vec![0u8; 10]).check().unwrap_err().contains("partition key"));
        assert!(SinkRecord::new("k", vec![0u8; (1 << 20) + 1]).check().unwrap_err().contains("1 MiB"));
        assert!(SinkRecord::new("k", "x").with_explicit_hash_key("12a").check().is_err());
        assert!(
            SinkRecord::new("k", "x").with_explicit_hash_key("340282366920938463463374607431768211455").check().is_ok()
        );
        assert!(!format!("{:?}", SinkRecord::new("k", "secret-data")).contains("secret"));
    }
}
