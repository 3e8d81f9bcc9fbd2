//! The KPL (Kinesis Producer Library) aggregated-record format: de-aggregation for the spout and
//! an aggregator for `squall stream put --aggregate N`.
//!
//! An aggregated Kinesis record is
//!
//! ```text
//! F3 89 9A C2 | protobuf AggregatedRecord | MD5 of the protobuf bytes (16 bytes)
//! ```
//!
//! with the messages (proto2, as the KPL and AWS's `aws-kinesis-agg` write them):
//!
//! ```text
//! message AggregatedRecord {
//!   repeated string partition_key_table     = 1;
//!   repeated string explicit_hash_key_table = 2;
//!   repeated Record records                 = 3;
//! }
//! message Record {
//!   required uint64 partition_key_index     = 1;
//!   optional uint64 explicit_hash_key_index = 2;
//!   required bytes  data                    = 3;
//!   repeated Tag    tags                    = 4;
//! }
//! message Tag { required string key = 1; optional string value = 2; }
//! ```
//!
//! A user record's sub-sequence number is its index in `records`. Its hash key (what decides its
//! shard) is its explicit hash key when it has one, else the MD5 of its partition key read as a
//! big-endian 128-bit integer, exactly as Kinesis routes a plain record.
//!
//! [`deaggregate`] never fails: data without the magic prefix is a plain record; data with the
//! prefix but a wrong MD5, a protobuf that does not decode, a table index out of range or no user
//! record at all is [`Deaggregated::Corrupt`], which the spout delivers whole as one plain record.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use md5::{Digest, Md5};
use prost::Message;

/// The four bytes every aggregated record starts with.
pub const MAGIC: [u8; 4] = [0xF3, 0x89, 0x9A, 0xC2];
/// Length of the MD5 trailer.
pub const DIGEST_LEN: usize = 16;
/// The largest record Kinesis accepts (data plus partition key), which bounds an aggregate.
pub const MAX_RECORD_BYTES: usize = 1024 * 1024;

#[derive(Clone, PartialEq, Message)]
struct AggregatedRecordMsg {
    #[prost(string, repeated, tag = "1")]
    partition_key_table: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    explicit_hash_key_table: Vec<String>,
    #[prost(message, repeated, tag = "3")]
    records: Vec<RecordMsg>,
}

#[derive(Clone, PartialEq, Message)]
struct RecordMsg {
    #[prost(uint64, required, tag = "1")]
    partition_key_index: u64,
    #[prost(uint64, optional, tag = "2")]
    explicit_hash_key_index: Option<u64>,
    #[prost(bytes = "bytes", required, tag = "3")]
    data: Bytes,
    #[prost(message, repeated, tag = "4")]
    tags: Vec<TagMsg>,
}

#[derive(Clone, PartialEq, Message)]
struct TagMsg {
    #[prost(string, required, tag = "1")]
    key: String,
    #[prost(string, optional, tag = "2")]
    value: Option<String>,
}

/// One user record of an aggregate. `data` shares the aggregate's buffer (no copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserRecord {
    /// Its own partition key (shared with the other user records of the same key).
    pub partition_key: Arc<str>,
    /// Its explicit hash key, a decimal string, when the producer set one.
    pub explicit_hash_key: Option<Arc<str>>,
    /// Its payload.
    pub data: Bytes,
}

impl UserRecord {
    /// The 128-bit hash key that decides its shard (see [`hash_key`]).
    pub fn hash_key(&self) -> u128 {
        hash_key(&self.partition_key, self.explicit_hash_key.as_deref())
    }
}

/// What one Kinesis record's data turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deaggregated {
    /// Not an aggregate (no magic prefix): the record is its own, single user record.
    Plain,
    /// A valid aggregate: its user records, in sub-sequence order (at least one).
    Records(Vec<UserRecord>),
    /// Starts with the magic prefix but is not a valid aggregate; the reason says why.
    Corrupt(String),
}

/// Splits a Kinesis record's data into its user records (see the module docs).
pub fn deaggregate(data: &Bytes) -> Deaggregated {
    if data.len() < MAGIC.len() || data[..MAGIC.len()] != MAGIC {
        return Deaggregated::Plain;
    }
    if data.len() < MAGIC.len() + DIGEST_LEN {
        return Deaggregated::Corrupt(format!(
            "{} bytes: too short for the magic prefix and the {DIGEST_LEN}-byte MD5 trailer",
            data.len()
        ));
    }
    let body = data.slice(MAGIC.len()..data.len() - DIGEST_LEN);
    let digest = &data[data.len() - DIGEST_LEN..];
    if Md5::digest(&body).as_slice() != digest {
        return Deaggregated::Corrupt("MD5 of the protobuf body does not match its trailer".into());
    }
    let msg = match AggregatedRecordMsg::decode(body) {
        Ok(m) => m,
        Err(e) => return Deaggregated::Corrupt(format!("the protobuf AggregatedRecord does not decode: {e}")),
    };
    if msg.records.is_empty() {
        return Deaggregated::Corrupt("the aggregate holds no user record".into());
    }
    let pks: Vec<Arc<str>> = msg.partition_key_table.into_iter().map(Arc::from).collect();
    let ehks: Vec<Arc<str>> = msg.explicit_hash_key_table.into_iter().map(Arc::from).collect();
    let mut out = Vec::with_capacity(msg.records.len());
    for (i, r) in msg.records.into_iter().enumerate() {
        let Some(pk) = usize::try_from(r.partition_key_index).ok().and_then(|k| pks.get(k)) else {
            return Deaggregated::Corrupt(format!(
                "user record {i}: partition key index {} is outside the table of {} keys",
                r.partition_key_index,
                pks.len()
            ));
        };
        let ehk = match r.explicit_hash_key_index {
            None => None,
            Some(k) => match usize::try_from(k).ok().and_then(|k| ehks.get(k)) {
                Some(e) => Some(e.clone()),
                None => {
                    return Deaggregated::Corrupt(format!(
                        "user record {i}: explicit hash key index {k} is outside the table of {} keys",
                        ehks.len()
                    ));
                }
            },
        };
        out.push(UserRecord { partition_key: pk.clone(), explicit_hash_key: ehk, data: r.data });
    }
    Deaggregated::Records(out)
}

/// The MD5 of a partition key as a big-endian 128-bit integer: where Kinesis routes it.
pub fn partition_key_hash(partition_key: &str) -> u128 {
    u128::from_be_bytes(Md5::digest(partition_key.as_bytes()).into())
}

/// A record's hash key: its explicit hash key when set and a valid decimal 128-bit integer, else
/// [`partition_key_hash`] of its partition key.
pub fn hash_key(partition_key: &str, explicit_hash_key: Option<&str>) -> u128 {
    explicit_hash_key.and_then(|e| e.parse::<u128>().ok()).unwrap_or_else(|| partition_key_hash(partition_key))
}

/// A user record to aggregate.
#[derive(Debug, Clone, Copy)]
pub struct NewUserRecord<'a> {
    /// Partition key.
    pub partition_key: &'a str,
    /// Explicit hash key (decimal), if any.
    pub explicit_hash_key: Option<&'a str>,
    /// Payload.
    pub data: &'a [u8],
}

/// An aggregate ready to put: the partition key and explicit hash key to put it with (those of
/// its first user record, as the KPL does) and its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Aggregate {
    /// The first user record's partition key.
    pub partition_key: String,
    /// The first user record's explicit hash key, if any.
    pub explicit_hash_key: Option<String>,
    /// Magic, protobuf, MD5.
    pub data: Bytes,
}

/// Why records could not be aggregated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AggregateError {
    /// Nothing to aggregate.
    #[error("cannot aggregate zero user records")]
    Empty,
    /// The aggregate would exceed the Kinesis record limit.
    #[error(
        "an aggregate of {records} user records is {bytes} bytes, over the Kinesis limit of {MAX_RECORD_BYTES} bytes per record; aggregate fewer records per Kinesis record"
    )]
    TooLarge {
        /// User records in it.
        records: usize,
        /// Its size with the partition key.
        bytes: usize,
    },
}

/// Packs user records into one aggregated record, byte for byte as the KPL (and
/// `aws-kinesis-agg`) do: keys deduplicated into tables in order of first use, an explicit hash
/// key index only on records that have one.
pub fn aggregate(records: &[NewUserRecord<'_>]) -> Result<Aggregate, AggregateError> {
    let first = records.first().ok_or(AggregateError::Empty)?;
    let mut msg = AggregatedRecordMsg::default();
    let index = |table: &mut Vec<String>, key: &str| -> u64 {
        let i = table.iter().position(|k| k == key).unwrap_or_else(|| {
            table.push(key.to_string());
            table.len() - 1
        });
        i as u64
    };
    for r in records {
        let partition_key_index = index(&mut msg.partition_key_table, r.partition_key);
        let explicit_hash_key_index = r.explicit_hash_key.map(|e| index(&mut msg.explicit_hash_key_table, e));
        msg.records.push(RecordMsg {
            partition_key_index,
            explicit_hash_key_index,
            data: Bytes::copy_from_slice(r.data),
            tags: Vec::new(),
        });
    }
    let body_len = msg.encoded_len();
    let mut buf = BytesMut::with_capacity(MAGIC.len() + body_len + DIGEST_LEN);
    buf.extend_from_slice(&MAGIC);
    // Writing into a BytesMut with enough capacity cannot fail.
    msg.encode(&mut buf).map_err(|_| AggregateError::TooLarge { records: records.len(), bytes: usize::MAX })?;
    let digest = Md5::digest(&buf[MAGIC.len()..]);
    buf.extend_from_slice(&digest);
    let bytes = buf.len() + first.partition_key.len();
    if bytes > MAX_RECORD_BYTES {
        return Err(AggregateError::TooLarge { records: records.len(), bytes });
    }
    Ok(Aggregate {
        partition_key: first.partition_key.to_string(),
        explicit_hash_key: first.explicit_hash_key.map(str::to_string),
        data: buf.freeze(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Written by AWS's reference aggregator, `aws-kinesis-agg` 1.2.3 (PyPI):
    /// `add_user_record("alpha", b"one")`, `add_user_record("beta", b"two",
    /// "170141183460469231731687303715884105728")`, `add_user_record("alpha", b"three")`,
    /// `clear_and_get().get_contents()`.
    const REFERENCE: [u8; 105] = [
        0xf3, 0x89, 0x9a, 0xc2, 0x0a, 0x05, 0x61, 0x6c, 0x70, 0x68, 0x61, 0x0a, 0x04, 0x62, 0x65, 0x74, 0x61, 0x12,
        0x27, 0x31, 0x37, 0x30, 0x31, 0x34, 0x31, 0x31, 0x38, 0x33, 0x34, 0x36, 0x30, 0x34, 0x36, 0x39, 0x32, 0x33,
        0x31, 0x37, 0x33, 0x31, 0x36, 0x38, 0x37, 0x33, 0x30, 0x33, 0x37, 0x31, 0x35, 0x38, 0x38, 0x34, 0x31, 0x30,
        0x35, 0x37, 0x32, 0x38, 0x1a, 0x07, 0x08, 0x00, 0x1a, 0x03, 0x6f, 0x6e, 0x65, 0x1a, 0x09, 0x08, 0x01, 0x10,
        0x00, 0x1a, 0x03, 0x74, 0x77, 0x6f, 0x1a, 0x09, 0x08, 0x00, 0x1a, 0x05, 0x74, 0x68, 0x72, 0x65, 0x65, 0xeb,
        0x69, 0x57, 0x5c, 0xe8, 0xc2, 0xfe, 0x45, 0x0e, 0xe8, 0x9e, 0xd7, 0xe9, 0xa8, 0x73, 0x17,
    ];
    const EHK: &str = "170141183460469231731687303715884105728";

    fn reference_input() -> Vec<NewUserRecord<'static>> {
        vec![
            NewUserRecord { partition_key: "alpha", explicit_hash_key: None, data: b"one" },
            NewUserRecord { partition_key: "beta", explicit_hash_key: Some(EHK), data: b"two" },
            NewUserRecord { partition_key: "alpha", explicit_hash_key: None, data: b"three" },
        ]
    }

    fn records(d: Deaggregated) -> Vec<UserRecord> {
        match d {
            Deaggregated::Records(r) => r,
            other => panic!("expected user records, got {other:?}"),
        }
    }

    #[test]
    fn decodes_the_reference_aggregators_bytes() {
        let out = records(deaggregate(&Bytes::from_static(&REFERENCE)));
        let got: Vec<(&str, Option<&str>, &[u8])> =
            out.iter().map(|r| (&*r.partition_key, r.explicit_hash_key.as_deref(), &r.data[..])).collect();
        assert_eq!(
            got,
            vec![("alpha", None, &b"one"[..]), ("beta", Some(EHK), &b"two"[..]), ("alpha", None, &b"three"[..])]
        );
        assert_eq!(out[1].hash_key(), 1u128 << 127, "the explicit hash key decides");
        assert_eq!(out[0].hash_key(), partition_key_hash("alpha"));
    }

    #[test]
    fn our_aggregator_writes_the_reference_bytes() {
        let agg = aggregate(&reference_input()).unwrap();
        assert_eq!(&agg.data[..], &REFERENCE[..], "byte for byte what aws-kinesis-agg writes");
        assert_eq!((agg.partition_key.as_str(), agg.explicit_hash_key), ("alpha", None));
    }

    #[test]
    fn round_trips_many_records() {
        let keys: Vec<String> = (0..37).map(|i| format!("key-{}", i % 7)).collect();
        let ehks: Vec<String> = (0..37).map(|i| (u128::MAX / 37 * i).to_string()).collect();
        let datas: Vec<Vec<u8>> = (0..37).map(|i| vec![i as u8; i * 3]).collect();
        let input: Vec<NewUserRecord<'_>> = (0..37)
            .map(|i| NewUserRecord {
                partition_key: &keys[i],
                explicit_hash_key: (i % 3 == 0).then_some(ehks[i].as_str()),
                data: &datas[i],
            })
            .collect();
        let agg = aggregate(&input).unwrap();
        let out = records(deaggregate(&agg.data));
        assert_eq!(out.len(), 37);
        for (i, r) in out.iter().enumerate() {
            assert_eq!(&*r.partition_key, keys[i]);
            assert_eq!(r.explicit_hash_key.as_deref(), input[i].explicit_hash_key);
            assert_eq!(&r.data[..], &datas[i][..]);
        }
    }

    #[test]
    fn plain_and_corrupt_data_are_told_apart() {
        assert_eq!(deaggregate(&Bytes::from_static(b"{\"k\":1}")), Deaggregated::Plain);
        assert_eq!(deaggregate(&Bytes::new()), Deaggregated::Plain);
        assert_eq!(deaggregate(&Bytes::from_static(&MAGIC[..3])), Deaggregated::Plain);
        // Bad MD5: one flipped bit in the trailer.
        let mut bad_md5 = REFERENCE.to_vec();
        *bad_md5.last_mut().unwrap() ^= 1;
        assert!(matches!(deaggregate(&Bytes::from(bad_md5)), Deaggregated::Corrupt(m) if m.contains("MD5")));
        // Bad protobuf with a correct MD5.
        let mut bad_pb = MAGIC.to_vec();
        let body = [0x1a, 0xff, 0x01, 0x08];
        bad_pb.extend_from_slice(&body);
        bad_pb.extend_from_slice(&Md5::digest(body));
        assert!(matches!(deaggregate(&Bytes::from(bad_pb)), Deaggregated::Corrupt(m) if m.contains("protobuf")));
        // Too short.
        let mut short = MAGIC.to_vec();
        short.extend_from_slice(&[0; 5]);
        assert!(matches!(deaggregate(&Bytes::from(short)), Deaggregated::Corrupt(m) if m.contains("too short")));
        // A partition key index outside the table.
        let msg = AggregatedRecordMsg {
            partition_key_table: vec!["a".into()],
            explicit_hash_key_table: vec![],
            records: vec![RecordMsg {
                partition_key_index: 3,
                explicit_hash_key_index: None,
                data: Bytes::new(),
                tags: vec![],
            }],
        };
        let body = msg.encode_to_vec();
        let mut bad_index = MAGIC.to_vec();
        bad_index.extend_from_slice(&body);
        bad_index.extend_from_slice(&Md5::digest(&body));
        assert!(matches!(deaggregate(&Bytes::from(bad_index)), Deaggregated::Corrupt(m) if m.contains("index 3")));
        // No user record at all.
        let mut empty = MAGIC.to_vec();
        empty.extend_from_slice(&Md5::digest([]));
        assert!(matches!(deaggregate(&Bytes::from(empty)), Deaggregated::Corrupt(m) if m.contains("no user record")));
    }

    #[test]
    fn user_records_share_the_aggregates_buffer() {
        let agg = aggregate(&reference_input()).unwrap();
        let out = records(deaggregate(&agg.data));
        let range = agg.data.as_ptr() as usize..agg.data.as_ptr() as usize + agg.data.len();
        assert!(out.iter().all(|r| range.contains(&(r.data.as_ptr() as usize))), "no copy of the payloads");
    }

    #[test]
    fn hash_keys_follow_kinesis() {
        // MD5("") = d41d8cd98f00b204e9800998ecf8427e
        assert_eq!(partition_key_hash(""), 0xd41d8cd98f00b204e9800998ecf8427e);
        assert_eq!(hash_key("x", Some("42")), 42);
        assert_eq!(hash_key("x", Some("not a number")), partition_key_hash("x"));
    }

    #[test]
    fn too_large_aggregates_are_refused() {
        let big = vec![0u8; 600 * 1024];
        let r = NewUserRecord { partition_key: "k", explicit_hash_key: None, data: &big };
        assert!(matches!(aggregate(&[r, r]), Err(AggregateError::TooLarge { records: 2, .. })));
        assert_eq!(aggregate(&[]), Err(AggregateError::Empty));
    }
}
