//! [`KinesisSinkConfig`]: serde, defaults for everything but the stream, validated once.

use serde::{Deserialize, Serialize};

use crate::kinesis::KinesisEndpoint;

/// Kinesis' limit of records per PutRecords call.
pub const MAX_RECORDS_PER_CALL: usize = 500;
/// Kinesis' limit of bytes per PutRecords call (data and partition keys).
pub const MAX_BYTES_PER_CALL: usize = 5 * 1024 * 1024;
/// Kinesis' limit of one record's data blob.
pub const MAX_RECORD_BYTES: usize = 1024 * 1024;

/// Configuration of a [`KinesisSink`](super::KinesisSink). Every key but `stream` has a default;
/// unknown keys are an error.
///
/// ```
/// let cfg: squall::sink::KinesisSinkConfig = serde_json::from_str(r#"{
///     "stream": "results",
///     "kinesis": { "endpoint": "http://127.0.0.1:4566", "region": "us-east-1" },
///     "linger_ms": 20
/// }"#).unwrap();
/// cfg.validate().unwrap();
/// assert_eq!(cfg.max_batch_records, 500);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KinesisSinkConfig {
    /// The stream written to. It must exist: the sink does not create it.
    pub stream: String,
    /// Where Kinesis lives (LocalStack, kinesis-local, a proxy, or `aws`).
    pub kinesis: KinesisEndpoint,
    /// Records per PutRecords call, 1..=500 (default 500, Kinesis' limit).
    pub max_batch_records: usize,
    /// Bytes (data, partition and explicit hash keys) per PutRecords call, up to 5 MiB (the
    /// default, Kinesis' limit). A record larger than this goes in a call of its own.
    pub max_batch_bytes: usize,
    /// Bound on the bytes buffered plus the bytes of the call in flight (default 8 MiB). At the
    /// bound `execute` waits for the call in flight (backpressure on the sink's inputs). At least
    /// `max_batch_bytes`.
    pub max_in_flight_bytes: usize,
    /// A partial batch is put this long after its oldest record arrived (default 50 ms). 0 puts
    /// whatever is buffered as soon as no call is in flight.
    pub linger_ms: u64,
    /// First back-off after throttling or a retryable failure (default 100 ms).
    pub retry_min_backoff_ms: u64,
    /// Cap of the back-off, which doubles with each call in a row that put nothing, with
    /// jitter (default 5000 ms). After a call that put some records and had others throttled
    /// (per-record throttling: some shards over their limit), the rest are retried after
    /// `retry_min_backoff_ms`.
    pub retry_max_backoff_ms: u64,
    /// Fault injection (tests): abort the process once this many records were put, before the
    /// last one's inputs are acked (so they are replayed, and put again). `None` in production;
    /// not part of the JSON configuration.
    #[serde(skip)]
    pub abort_after_puts: Option<u64>,
}

impl Default for KinesisSinkConfig {
    fn default() -> Self {
        Self {
            stream: String::new(),
            kinesis: KinesisEndpoint::default(),
            max_batch_records: MAX_RECORDS_PER_CALL,
            max_batch_bytes: MAX_BYTES_PER_CALL,
            max_in_flight_bytes: 8 * 1024 * 1024,
            linger_ms: 50,
            retry_min_backoff_ms: 100,
            retry_max_backoff_ms: 5_000,
            abort_after_puts: None,
        }
    }
}

/// A configuration value that is wrong; names the key and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid Kinesis sink configuration: `{key}` {reason}")]
pub struct SinkConfigError {
    /// The config key.
    pub key: &'static str,
    /// What is wrong and how to fix it.
    pub reason: String,
}

impl KinesisSinkConfig {
    /// Defaults for everything but the stream and the endpoint.
    pub fn new(stream: impl Into<String>, kinesis: KinesisEndpoint) -> Self {
        Self { stream: stream.into(), kinesis, ..Self::default() }
    }

    /// Checks every value; the error names the key and the fix.
    pub fn validate(&self) -> Result<(), SinkConfigError> {
        let err = |key, reason: String| Err(SinkConfigError { key, reason });
        let s = &self.stream;
        if s.is_empty() || s.len() > 128 || !s.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)) {
            return err("stream", format!("{s:?} is not a Kinesis stream name (1-128 of a-z, A-Z, 0-9, _ . -)"));
        }
        if let Err(e) = self.kinesis.validate() {
            return err("kinesis", e.to_string());
        }
        if !(1..=MAX_RECORDS_PER_CALL).contains(&self.max_batch_records) {
            return err(
                "max_batch_records",
                format!(
                    "is {}; use 1..=500 (Kinesis takes at most 500 records per PutRecords call)",
                    self.max_batch_records
                ),
            );
        }
        if !(1..=MAX_BYTES_PER_CALL).contains(&self.max_batch_bytes) {
            return err(
                "max_batch_bytes",
                format!(
                    "is {}; use 1..=5242880 (Kinesis takes at most 5 MiB per PutRecords call, the default)",
                    self.max_batch_bytes
                ),
            );
        }
        if self.max_in_flight_bytes < self.max_batch_bytes {
            return err(
                "max_in_flight_bytes",
                format!(
                    "is {}; it must be at least max_batch_bytes ({}); 8388608 (8 MiB) is the default",
                    self.max_in_flight_bytes, self.max_batch_bytes
                ),
            );
        }
        if self.linger_ms > 60_000 {
            return err("linger_ms", format!("is {}; use 0..=60000 (50 is the default)", self.linger_ms));
        }
        if self.retry_min_backoff_ms == 0 || self.retry_min_backoff_ms > self.retry_max_backoff_ms {
            return err(
                "retry_min_backoff_ms",
                format!(
                    "is {}; it must be positive and at most retry_max_backoff_ms ({})",
                    self.retry_min_backoff_ms, self.retry_max_backoff_ms
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> KinesisSinkConfig {
        KinesisSinkConfig::new("out", KinesisEndpoint::default())
    }

    #[test]
    fn defaults_are_valid_and_kinesis_limits() {
        let c = ok();
        c.validate().unwrap();
        assert_eq!((c.max_batch_records, c.max_batch_bytes, c.max_in_flight_bytes), (500, 5 << 20, 8 << 20));
        assert_eq!(c.linger_ms, 50);
    }

    #[test]
    fn bad_values_name_the_key() {
        type Change = Box<dyn Fn(&mut KinesisSinkConfig)>;
        let cases: Vec<(&str, Change)> = vec![
            ("stream", Box::new(|c| c.stream = String::new())),
            ("stream", Box::new(|c| c.stream = "a b".into())),
            ("kinesis", Box::new(|c| c.kinesis.endpoint = "localhost:4566".into())),
            ("max_batch_records", Box::new(|c| c.max_batch_records = 501)),
            ("max_batch_records", Box::new(|c| c.max_batch_records = 0)),
            ("max_batch_bytes", Box::new(|c| c.max_batch_bytes = 6 << 20)),
            ("max_in_flight_bytes", Box::new(|c| c.max_in_flight_bytes = 1024)),
            ("linger_ms", Box::new(|c| c.linger_ms = 120_000)),
            ("retry_min_backoff_ms", Box::new(|c| c.retry_min_backoff_ms = 0)),
            ("retry_min_backoff_ms", Box::new(|c| c.retry_max_backoff_ms = 10)),
        ];
        for (key, f) in cases {
            let mut c = ok();
            f(&mut c);
            let e = c.validate().unwrap_err();
            assert_eq!(e.key, key, "{e}");
            assert!(e.to_string().contains(key), "{e}");
        }
    }

    #[test]
    fn unknown_keys_are_refused() {
        let e = serde_json::from_str::<KinesisSinkConfig>(r#"{"stream":"x","lingr_ms":5}"#).unwrap_err();
        assert!(e.to_string().contains("lingr_ms"), "{e}");
    }
}
