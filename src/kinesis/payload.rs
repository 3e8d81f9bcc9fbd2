//! The self-describing records `squall stream put` writes, and the manifest it keeps, so that a
//! consumer (the audit topology, `squall audit`) can check loss and per-key order.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One record's payload: JSON naming the producer run, the partition key and the per-key sequence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditPayload {
    /// Producer run id (unique per `put` invocation).
    pub run: String,
    /// The partition key the record was put with.
    pub key: String,
    /// Per-key sequence number, from 0.
    pub seq: u64,
    /// Padding to reach the requested record size.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pad: String,
}

impl AuditPayload {
    /// The payload padded so its JSON is at least `size` bytes long.
    pub fn new(run: &str, key: &str, seq: u64, size: usize) -> Self {
        let mut p = Self { run: run.to_string(), key: key.to_string(), seq, pad: String::new() };
        let base = serde_json::to_vec(&p).map(|v| v.len()).unwrap_or(0);
        // `"pad":""` plus a comma adds 9 bytes once the field is present.
        if size > base + 9 {
            p.pad = "x".repeat(size - base - 9);
        }
        p
    }

    /// Serialized JSON bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// What a producer run wrote: its run id and the number of records per key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Producer run id.
    pub run: String,
    /// Stream written to.
    pub stream: String,
    /// Records written per partition key (sequences 0..count).
    pub counts: BTreeMap<String, u64>,
    /// Total records written.
    pub total: u64,
}
