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
    /// A start timestamp (AT_TIMESTAMP of GetShardIterator or SubscribeToShard) later than the
    /// service's clock: "Timestamp cannot be in the future" (kinesis-local), "The timestampInMillis
    /// parameter cannot be greater than the currentTimestampInMillis" (AWS). The clock the
    /// timestamp was taken from (this worker's, for LATEST) runs ahead of the service's. It fixes
    /// itself once the service's clock passes the timestamp: retry the same call after a back-off.
    #[error(
        "{op} on stream {stream:?} refused the start timestamp{} as later than the Kinesis service's clock{}: {message}",
        timestamp_ms.map(|t| format!(" AT_TIMESTAMP {t} ({})", iso_ms(t))).unwrap_or_default(),
        service_ms.map(|s| format!(" ({s}, {} ms earlier)", timestamp_ms.map_or(0, |t| t - s))).unwrap_or_default()
    )]
    TimestampAhead {
        /// Operation.
        op: &'static str,
        /// Stream name.
        stream: String,
        /// The refused timestamp (ms since the epoch), when the caller named it.
        timestamp_ms: Option<i64>,
        /// The service's clock then (ms since the epoch), when its message says (AWS does).
        service_ms: Option<i64>,
        /// Service message.
        message: String,
    },
    /// Throttled (ProvisionedThroughputExceeded, LimitExceeded, KMSThrottling): retry with back-off.
    #[error("{op} on stream {stream:?} throttled: {message}")]
    Throttled {
        /// Operation.
        op: &'static str,
        /// Stream name.
        stream: String,
        /// Service message.
        message: String,
    },
    /// A shard iterator expired (after 5 minutes) or is no longer valid: get a new one.
    #[error("shard iterator expired or invalid for stream {stream:?}: {message}; a new one is needed")]
    IteratorExpired {
        /// Stream name.
        stream: String,
        /// Service message.
        message: String,
    },
    /// The credentials are not allowed to make the call (AccessDenied). Retrying cannot fix it.
    #[error(
        "{op} on stream {stream:?} at {endpoint} denied: {message}. Check that the IAM policy of the worker's credentials allows kinesis:{op} on the stream's ARN (arn:aws:kinesis:REGION:ACCOUNT:stream/{stream})"
    )]
    AccessDenied {
        /// Operation.
        op: &'static str,
        /// Stream name.
        stream: String,
        /// The endpoint label.
        endpoint: String,
        /// Service message.
        message: String,
    },
    /// The stream's KMS key refuses the call (KMSAccessDenied, KMSDisabled, KMSNotFound,
    /// KMSInvalidState, KMSOptInRequired). Retrying cannot fix it.
    #[error(
        "{op} on stream {stream:?} refused by the stream's KMS key ({code}): {message}. Check the KMS key: it must exist, be enabled, and its key policy must allow kms:Decrypt (and kms:GenerateDataKey for producers) to the worker's credentials"
    )]
    Kms {
        /// Operation.
        op: &'static str,
        /// Stream name.
        stream: String,
        /// The error code, e.g. `KMSDisabledException`.
        code: String,
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

/// What kind of failure a [`KinesisError`] is, which decides what a caller does about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// Throttled: retry the same call after a capped back-off.
    Throttled,
    /// A transport failure or a server error: retry the same call after a capped back-off.
    Transient,
    /// The shard iterator expired or is invalid: get a new one, then retry.
    IteratorInvalid,
    /// A start timestamp later than the service's clock (a clock ahead of the service's): retry
    /// the same call after a back-off; it succeeds once the service's clock passes it.
    TimestampAhead,
    /// The credentials are not allowed (IAM policy). Retrying cannot fix it.
    AccessDenied,
    /// The stream's KMS key refuses (disabled, missing, not allowed). Retrying cannot fix it.
    KmsKey,
    /// The stream or shard does not exist (never created, or deleted). Retrying cannot fix it.
    NotFound,
    /// The request is invalid for the stream's current state. Retrying cannot fix it.
    InvalidArgument,
    /// A configuration value is wrong. Retrying cannot fix it.
    Config,
    /// Waiting for the stream timed out.
    Timeout,
}

impl ErrorKind {
    /// Whether retrying the same call later can succeed. False for the kinds an operator must
    /// fix (IAM policy, KMS key, a deleted stream, an invalid request or configuration), and for
    /// an invalid iterator (a new one is needed, not a retry).
    pub fn is_retryable(self) -> bool {
        matches!(self, ErrorKind::Throttled | ErrorKind::Transient | ErrorKind::TimestampAhead)
    }

    /// The kinds only an operator can fix.
    pub fn needs_operator(self) -> bool {
        matches!(
            self,
            ErrorKind::AccessDenied
                | ErrorKind::KmsKey
                | ErrorKind::NotFound
                | ErrorKind::InvalidArgument
                | ErrorKind::Config
        )
    }

    /// A short snake_case name (`access_denied`, `kms_key`, ...), as in status JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Throttled => "throttled",
            ErrorKind::Transient => "transient",
            ErrorKind::IteratorInvalid => "iterator_invalid",
            ErrorKind::TimestampAhead => "timestamp_ahead",
            ErrorKind::AccessDenied => "access_denied",
            ErrorKind::KmsKey => "kms_key",
            ErrorKind::NotFound => "not_found",
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::Config => "config",
            ErrorKind::Timeout => "timeout",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl KinesisError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            KinesisError::Config { .. } => ErrorKind::Config,
            KinesisError::Unreachable { .. } | KinesisError::Service { .. } => ErrorKind::Transient,
            KinesisError::StreamNotFound { .. } | KinesisError::ShardNotFound { .. } => ErrorKind::NotFound,
            KinesisError::Refused { .. } => ErrorKind::InvalidArgument,
            KinesisError::Throttled { .. } => ErrorKind::Throttled,
            KinesisError::IteratorExpired { .. } => ErrorKind::IteratorInvalid,
            KinesisError::TimestampAhead { .. } => ErrorKind::TimestampAhead,
            KinesisError::AccessDenied { .. } => ErrorKind::AccessDenied,
            KinesisError::Kms { .. } => ErrorKind::KmsKey,
            KinesisError::Timeout { .. } => ErrorKind::Timeout,
        }
    }

    /// Names the start timestamp of a [`KinesisError::TimestampAhead`] (other errors unchanged).
    pub fn with_start_timestamp(mut self, millis: i64) -> Self {
        if let KinesisError::TimestampAhead { timestamp_ms, .. } = &mut self {
            *timestamp_ms = Some(millis);
        }
        self
    }

    /// Whether retrying the same call later can succeed (throttling, transport and server
    /// errors, a start timestamp ahead of the service's clock). See [`ErrorKind::is_retryable`].
    pub fn is_retryable(&self) -> bool {
        self.kind().is_retryable()
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
        Self::classify(op, stream, endpoint, err.code().unwrap_or_default(), message)
    }

    /// Classifies a service error by its code (`__type`, without a namespace).
    pub fn classify(op: &'static str, stream: &str, endpoint: &str, code: &str, message: String) -> Self {
        let code = code.rsplit('#').next().unwrap_or(code);
        let stream = stream.to_string();
        let endpoint = endpoint.to_string();
        match code {
            "ResourceNotFoundException" => KinesisError::StreamNotFound { stream, endpoint },
            "ProvisionedThroughputExceededException"
            | "LimitExceededException"
            | "ThrottlingException"
            | "KMSThrottlingException" => KinesisError::Throttled { op, stream, message },
            "ExpiredIteratorException" => KinesisError::IteratorExpired { stream, message },
            // AWS answers an iterator it cannot use (malformed, of another stream) with
            // InvalidArgumentException naming the iterator: a new iterator fixes it.
            "InvalidArgumentException" if op == "GetRecords" && message.to_ascii_lowercase().contains("iterator") => {
                KinesisError::IteratorExpired { stream, message }
            }
            "AccessDeniedException" | "AccessDenied" | "UnrecognizedClientException" | "NotAuthorized" => {
                KinesisError::AccessDenied { op, stream, endpoint, message }
            }
            "KMSAccessDeniedException"
            | "KMSDisabledException"
            | "KMSNotFoundException"
            | "KMSInvalidStateException"
            | "KMSOptInRequired"
            | "KMSOptInRequiredException" => KinesisError::Kms { op, stream, code: code.to_string(), message },
            // A start timestamp later than the service's clock: kinesis-local says "Timestamp
            // cannot be in the future", AWS "The timestampInMillis parameter cannot be greater
            // than the currentTimestampInMillis. timestampInMillis: T, currentTimestampInMillis: N".
            "InvalidArgumentException" if timestamp_ahead(&message) => {
                let service_ms = number_after(&message, "currentTimestampInMillis:");
                KinesisError::TimestampAhead { op, stream, timestamp_ms: None, service_ms, message }
            }
            "InvalidArgumentException" | "ResourceInUseException" | "ValidationException" => {
                KinesisError::Refused { op, stream, message }
            }
            _ => KinesisError::Service { op, stream, endpoint, message },
        }
    }
}

/// Whether an InvalidArgumentException's message refuses a timestamp ahead of the service's clock.
fn timestamp_ahead(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("timestamp") && (m.contains("in the future") || m.contains("cannot be greater than the current"))
}

/// The integer after `label` in `message`, if any.
fn number_after(message: &str, label: &str) -> Option<i64> {
    let rest = &message[message.find(label)? + label.len()..];
    let digits: String = rest.trim_start().chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// `millis` as an RFC 3339 time, for messages.
pub(crate) fn iso_ms(millis: i64) -> String {
    use aws_sdk_kinesis::primitives::{DateTime, DateTimeFormat};
    DateTime::from_millis(millis).fmt(DateTimeFormat::DateTime).unwrap_or_else(|_| millis.to_string())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(code: &str, message: &str) -> KinesisError {
        KinesisError::classify("GetRecords", "clicks", "http://127.0.0.1:4566", code, message.to_string())
    }

    #[test]
    fn errors_retrying_cannot_fix_are_classified_and_name_the_fix() {
        let e = classify("AccessDeniedException", "User: arn:aws:iam::1:user/x is not authorized");
        assert_eq!(e.kind(), ErrorKind::AccessDenied);
        assert!(!e.is_retryable() && e.kind().needs_operator());
        let text = e.to_string();
        assert!(
            text.contains("kinesis:GetRecords") && text.contains("stream/clicks") && text.contains("IAM"),
            "{text}"
        );

        for code in [
            "KMSAccessDeniedException",
            "KMSDisabledException",
            "KMSNotFoundException",
            "KMSInvalidStateException",
            "KMSOptInRequired",
        ] {
            let e = classify(code, "key problem");
            assert_eq!(e.kind(), ErrorKind::KmsKey, "{code}");
            assert!(!e.is_retryable() && e.to_string().contains(code) && e.to_string().contains("KMS key"), "{e}");
        }
        let e = classify("KMSThrottlingException", "slow down");
        assert_eq!(e.kind(), ErrorKind::Throttled);
        assert!(e.is_retryable());

        let e = classify("com.amazonaws.kinesis#ResourceNotFoundException", "Stream clicks not found");
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert!(!e.is_retryable() && e.to_string().contains("does not exist"), "{e}");

        let e = classify("InvalidArgumentException", "Limit must be at most 10000");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(!e.is_retryable() && e.kind().needs_operator());
    }

    #[test]
    fn iterator_errors_want_a_new_iterator_and_the_rest_is_retryable() {
        assert_eq!(classify("ExpiredIteratorException", "Iterator expired").kind(), ErrorKind::IteratorInvalid);
        let e = classify("InvalidArgumentException", "Invalid ShardIterator: not a valid iterator");
        assert_eq!(e.kind(), ErrorKind::IteratorInvalid);
        assert!(!e.is_retryable() && !e.kind().needs_operator());
        // A bad starting sequence number for GetShardIterator is not fixed by a new iterator.
        let e = KinesisError::classify(
            "GetShardIterator",
            "clicks",
            "http://x",
            "InvalidArgumentException",
            "StartingSequenceNumber 1 used in GetShardIterator on shard shardId-0 is invalid".into(),
        );
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        for code in ["ProvisionedThroughputExceededException", "LimitExceededException", "ThrottlingException"] {
            assert_eq!(classify(code, "rate").kind(), ErrorKind::Throttled, "{code}");
        }
        let e = classify("InternalFailure", "boom");
        assert_eq!(e.kind(), ErrorKind::Transient);
        assert!(e.is_retryable());
        assert_eq!(classify("", "HTTP 500 with no body").kind(), ErrorKind::Transient);
    }

    #[test]
    fn a_timestamp_ahead_of_the_service_clock_is_retryable_and_other_invalid_arguments_are_not() {
        // kinesis-local (GetShardIterator) and, through a proxy, SubscribeToShard.
        for op in ["GetShardIterator", "SubscribeToShard"] {
            let e = KinesisError::classify(
                op,
                "clicks",
                "http://x",
                "InvalidArgumentException",
                "Timestamp cannot be in the future".into(),
            )
            .with_start_timestamp(1_796_323_644_157);
            assert_eq!(e.kind(), ErrorKind::TimestampAhead, "{op}");
            assert!(e.is_retryable() && !e.kind().needs_operator());
            let m = e.to_string();
            assert!(m.contains("1796323644157") && m.contains("2026-12-03T") && m.contains("clicks"), "{m}");
        }
        // AWS names the service's clock.
        let e = KinesisError::classify(
            "GetShardIterator",
            "clicks",
            "http://x",
            "InvalidArgumentException",
            "The timestampInMillis parameter cannot be greater than the currentTimestampInMillis. \
             timestampInMillis: 1612801873966, currentTimestampInMillis: 1612801873011"
                .into(),
        )
        .with_start_timestamp(1_612_801_873_966);
        assert_eq!(e.kind(), ErrorKind::TimestampAhead);
        assert!(matches!(e, KinesisError::TimestampAhead { service_ms: Some(1_612_801_873_011), .. }));
        assert!(e.to_string().contains("955 ms earlier"), "{e}");
        assert_eq!(ErrorKind::TimestampAhead.as_str(), "timestamp_ahead");
        // Other invalid arguments stay errors only an operator can fix.
        for msg in ["Timestamp must be provided for ShardIteratorType AT_TIMESTAMP", "Limit must be at most 10000"] {
            let e = KinesisError::classify(
                "GetShardIterator",
                "clicks",
                "http://x",
                "InvalidArgumentException",
                msg.into(),
            );
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{msg}");
            assert!(!e.is_retryable() && e.kind().needs_operator());
        }
        // with_start_timestamp leaves other errors alone.
        let e = classify("ExpiredIteratorException", "x").with_start_timestamp(5);
        assert_eq!(e.kind(), ErrorKind::IteratorInvalid);
    }
}
