use aws_sdk_kinesis::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

/// Errors of the Kinesis helpers. Each names the stream, shard or endpoint involved and the fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KinesisError {
    /// A configuration value is wrong.
    #[error("invalid Kinesis configuration: {field} {reason}")]
    Config {
        /// The config key.
        field: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// The endpoint could not be reached at all.
    #[error(
        "cannot reach Kinesis at {endpoint} ({op}): {message}. Is it running? Start LocalStack Kinesis with `make up` (or localstack/up), or pass --endpoint / SQUALL_KINESIS_ENDPOINT"
    )]
    Unreachable {
        /// The endpoint label.
        endpoint: String,
        /// The operation attempted.
        op: &'static str,
        /// The transport error.
        message: String,
    },
    /// The stream does not exist.
    #[error(
        "stream {stream:?} does not exist at {endpoint}; create it with `squall stream create {stream} --shards N`"
    )]
    StreamNotFound {
        /// Stream name.
        stream: String,
        /// The endpoint label.
        endpoint: String,
    },
    /// The shard does not exist in the stream.
    #[error("shard {shard:?} is not in stream {stream:?}; list the shards with `squall stream describe {stream}`")]
    ShardNotFound {
        /// Stream name.
        stream: String,
        /// Shard id.
        shard: String,
    },
    /// The request is invalid for the stream's current state.
    #[error("{op} on stream {stream:?} refused: {message}")]
    Refused {
        /// Operation.
        op: &'static str,
        /// Stream name.
        stream: String,
        /// Service message.
        message: String,
    },
    /// Throttled (ProvisionedThroughputExceeded, LimitExceeded): retry with back-off.
    #[error("{op} on stream {stream:?} throttled: {message}")]
    Throttled {
        /// Operation.
        op: &'static str,
        /// Stream name.
        stream: String,
        /// Service message.
        message: String,
    },
    /// A shard iterator expired (after 5 minutes): get a new one.
    #[error("shard iterator expired for stream {stream:?}: {message}")]
    IteratorExpired {
        /// Stream name.
        stream: String,
        /// Service message.
        message: String,
    },
    /// Anything else from the service or the transport; usually retryable.
    #[error("{op} on stream {stream:?} at {endpoint} failed: {message}")]
    Service {
        /// Operation.
        op: &'static str,
        /// Stream name.
        stream: String,
        /// The endpoint label.
        endpoint: String,
        /// Service or transport message.
        message: String,
    },
    /// Waiting for the stream timed out.
    #[error("stream {stream:?} did not become {want} within {secs} s")]
    Timeout {
        /// Stream name.
        stream: String,
        /// Desired status.
        want: &'static str,
        /// Seconds waited.
        secs: u64,
    },
}

impl KinesisError {
    /// Whether retrying the same call later can succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, KinesisError::Unreachable { .. } | KinesisError::Throttled { .. } | KinesisError::Service { .. })
    }

    /// Classifies an SDK error for operation `op` on `stream`.
    pub fn from_sdk<E, R>(op: &'static str, stream: &str, endpoint: &str, err: SdkError<E, R>) -> Self
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        R: std::fmt::Debug + Send + Sync + 'static,
    {
        match &err {
            SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) => {
                return KinesisError::Unreachable { endpoint: endpoint.to_string(), op, message: error_chain(&err) };
            }
            _ => {}
        }
        let message = err.message().map(str::to_string).unwrap_or_else(|| sdk_message(&err));
        let code = err.code().unwrap_or_default();
        let stream = stream.to_string();
        match code {
            "ResourceNotFoundException" => KinesisError::StreamNotFound { stream, endpoint: endpoint.to_string() },
            "ProvisionedThroughputExceededException" | "LimitExceededException" | "ThrottlingException" => {
                KinesisError::Throttled { op, stream, message }
            }
            "ExpiredIteratorException" => KinesisError::IteratorExpired { stream, message },
            "InvalidArgumentException" | "ResourceInUseException" | "ValidationException" => {
                KinesisError::Refused { op, stream, message }
            }
            _ => KinesisError::Service { op, stream, endpoint: endpoint.to_string(), message },
        }
    }
}

/// The full message of an SDK error (the bare Display says only "dispatch failure").
pub fn sdk_message<E, R>(err: &SdkError<E, R>) -> String
where
    E: std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    DisplayErrorContext(err).to_string()
}

/// The Display of an error and each of its sources, joined with ": ".
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![err.to_string()];
    let mut cur = err.source();
    while let Some(e) = cur {
        let s = e.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
        cur = e.source();
    }
    parts.join(": ")
}
