//! The two Kinesis calls the sink makes, behind a small trait: the SDK client in production, a
//! registered [`ShardApi`] (`sim://api/NAME`: the simulator's model of Kinesis), an in-memory fake
//! in unit tests.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;

use super::encoder::{OpenShard, SinkRecord};
use crate::kinesis::{KinesisError, ShardDescription};
use crate::spout::ShardApi;

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A per-record failure of a PutRecords call (its `ErrorCode` and `ErrorMessage`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryError {
    pub code: String,
    pub message: String,
}

/// The outcome of one PutRecords call: per record (in request order), `None` when it was
/// written; or the error of the whole call.
pub(crate) type PutOutcome = Result<Vec<Option<EntryError>>, KinesisError>;

/// Asked once more just before each attempt of a PutRecords call is transmitted (the sink's
/// [`super::PutGate`] is asked when the call starts; a process frozen in between, SIGSTOP or a long
/// pause, would otherwise send its request when it resumes, whatever the gate says by then).
/// False: the attempt is not sent and the call fails (the sink, whose check it is, knows why).
pub type TransmitCheck = Arc<dyn Fn() -> bool + Send + Sync>;

pub(crate) trait Backend: Send + Sync + 'static {
    /// One PutRecords call; `check`, when given, is asked before each attempt is transmitted.
    fn put_records(&self, records: Vec<SinkRecord>, check: Option<TransmitCheck>) -> BoxFuture<PutOutcome>;
    /// The stream's open shards.
    fn open_shards(&self) -> BoxFuture<Result<Vec<OpenShard>, KinesisError>>;
}

/// The SDK client and the stream it writes.
pub(crate) struct SdkBackend {
    pub client: aws_sdk_kinesis::Client,
    pub stream: String,
    /// The endpoint label for error messages.
    pub endpoint: String,
}

/// The SDK interceptor asking a [`TransmitCheck`] in `read_before_transmit`, the last hook before
/// the request goes to the HTTP client (each retry attempt passes it again).
struct TransmitGate(TransmitCheck);

impl std::fmt::Debug for TransmitGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TransmitGate")
    }
}

impl aws_sdk_kinesis::config::Intercept for TransmitGate {
    fn name(&self) -> &'static str {
        "squall-transmit-gate"
    }

    fn read_before_transmit(
        &self,
        _context: &aws_sdk_kinesis::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &aws_sdk_kinesis::config::RuntimeComponents,
        _cfg: &mut aws_sdk_kinesis::config::ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        if (self.0)() { Ok(()) } else { Err("the writer's put gate closed before transmission".into()) }
    }
}

impl Backend for SdkBackend {
    fn put_records(&self, records: Vec<SinkRecord>, check: Option<TransmitCheck>) -> BoxFuture<PutOutcome> {
        let (client, stream, endpoint) = (self.client.clone(), self.stream.clone(), self.endpoint.clone());
        Box::pin(async move {
            let entries = records
                .into_iter()
                .map(|r| {
                    PutRecordsRequestEntry::builder()
                        .partition_key(r.partition_key)
                        .set_explicit_hash_key(r.explicit_hash_key)
                        .data(Blob::new(Vec::from(r.data)))
                        .build()
                        .map_err(|e| KinesisError::Config { field: "record".into(), reason: e.to_string() })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let n = entries.len();
            let request = client.put_records().stream_name(&stream).set_records(Some(entries));
            let out = match check {
                Some(check) => request.customize().interceptor(TransmitGate(check)).send().await,
                None => request.send().await,
            }
            .map_err(|e| KinesisError::from_sdk("PutRecords", &stream, &endpoint, e))?;
            let results: Vec<Option<EntryError>> = out
                .records()
                .iter()
                .map(|r| {
                    r.error_code().map(|c| EntryError {
                        code: c.to_string(),
                        message: r.error_message().unwrap_or_default().to_string(),
                    })
                })
                .collect();
            Ok(padded(results, n))
        })
    }

    fn open_shards(&self) -> BoxFuture<Result<Vec<OpenShard>, KinesisError>> {
        let (client, stream, endpoint) = (self.client.clone(), self.stream.clone(), self.endpoint.clone());
        Box::pin(async move { Ok(open_of(crate::kinesis::list_shards(&client, &endpoint, &stream).await?)) })
    }
}

/// An answer with fewer results than `n` records, padded: the missing ones are retried.
fn padded(mut results: Vec<Option<EntryError>>, n: usize) -> Vec<Option<EntryError>> {
    results.resize_with(n, || {
        Some(EntryError { code: "MissingResult".into(), message: "no result for the record".into() })
    });
    results
}

/// The open shards of a listing.
fn open_of(shards: Vec<ShardDescription>) -> Vec<OpenShard> {
    shards
        .into_iter()
        .filter(|s| !s.closed)
        .map(|s| OpenShard {
            shard_id: s.shard_id,
            starting_hash_key: s.starting_hash_key,
            ending_hash_key: s.ending_hash_key,
        })
        .collect()
}

/// A registered [`ShardApi`] (`sim://api/NAME`) and the stream it writes.
pub(crate) struct ApiBackend {
    pub api: Arc<dyn ShardApi>,
    pub stream: String,
}

impl Backend for ApiBackend {
    fn put_records(&self, records: Vec<SinkRecord>, check: Option<TransmitCheck>) -> BoxFuture<PutOutcome> {
        let (api, stream) = (self.api.clone(), self.stream.clone());
        Box::pin(async move {
            let n = records.len();
            Ok(padded(api.put_records(&stream, records, check).await?, n))
        })
    }

    fn open_shards(&self) -> BoxFuture<Result<Vec<OpenShard>, KinesisError>> {
        let (api, stream) = (self.api.clone(), self.stream.clone());
        Box::pin(async move { Ok(open_of(api.list_shards(&stream).await?)) })
    }
}
