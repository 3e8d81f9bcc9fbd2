//! Kinesis access: client construction (LocalStack or AWS), shard listing, and the stream helpers
//! behind `squall stream` (create, describe, put, split, merge, scale, delete).

mod admin;
pub mod clock;
mod error;
pub mod kpl;
pub mod payload;

pub use admin::{
    PutOptions, PutReport, create_stream, delete_stream, describe_stream, list_shards, merge_shards, put_records,
    scale_stream, split_shard, stream_created_ms, wait_active,
};
pub use error::{ErrorKind, KinesisError, error_chain, sdk_message};

use std::fmt;

use aws_config::BehaviorVersion;
use aws_sdk_kinesis::config::{Credentials, Region};
use serde::{Deserialize, Serialize};

/// Default endpoint: LocalStack (or kinesis-local started by `localstack/up`) on loopback.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:4566";
/// Default AWS region.
pub const DEFAULT_REGION: &str = "us-east-1";

/// Where Kinesis lives and how to authenticate.
///
/// `endpoint` is either a URL (LocalStack, kinesis-local, a proxy) or the word `aws`, which uses the
/// SDK's own endpoint resolution and credential chain. For a custom endpoint with no credentials
/// configured in the environment, static test credentials are used (LocalStack accepts any).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KinesisEndpoint {
    /// `http(s)://host:port` or `aws`. (`sim://...` is the coordination benchmark's simulated
    /// stream, see `squall::spout`; never a real endpoint.)
    #[serde(default = "default_endpoint")]
    pub endpoint: String,
    /// AWS region, e.g. `us-east-1`.
    #[serde(default = "default_region")]
    pub region: String,
}

fn default_endpoint() -> String {
    DEFAULT_ENDPOINT.to_string()
}
fn default_region() -> String {
    DEFAULT_REGION.to_string()
}

impl Default for KinesisEndpoint {
    fn default() -> Self {
        Self { endpoint: default_endpoint(), region: default_region() }
    }
}

impl fmt::Debug for KinesisEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print credentials: this struct holds none, and says so.
        f.debug_struct("KinesisEndpoint").field("endpoint", &self.endpoint).field("region", &self.region).finish()
    }
}

impl KinesisEndpoint {
    /// A custom endpoint URL in the given region.
    pub fn new(endpoint: impl Into<String>, region: impl Into<String>) -> Self {
        Self { endpoint: endpoint.into(), region: region.into() }
    }

    /// True when this is real AWS (`aws`), resolved by the SDK.
    pub fn is_aws(&self) -> bool {
        self.endpoint.eq_ignore_ascii_case("aws")
    }

    /// Checks the endpoint and region; the error names the field and the fix.
    pub fn validate(&self) -> Result<(), KinesisError> {
        if self.region.trim().is_empty() {
            return Err(KinesisError::Config {
                field: "region".into(),
                reason: "is empty; set a region such as us-east-1 (--region or SQUALL_REGION)".into(),
            });
        }
        if !(self.is_aws()
            || self.endpoint.starts_with("http://")
            || self.endpoint.starts_with("https://")
            || self.endpoint.starts_with("sim://"))
        {
            return Err(KinesisError::Config {
                field: "endpoint".into(),
                reason: format!(
                    "{:?} is neither `aws` nor an http(s) URL; use e.g. http://127.0.0.1:4566 for LocalStack",
                    self.endpoint
                ),
            });
        }
        Ok(())
    }

    /// A label for error messages: the URL, or `AWS (region)`.
    pub fn label(&self) -> String {
        if self.is_aws() { format!("AWS Kinesis in {}", self.region) } else { self.endpoint.clone() }
    }

    /// Builds an SDK client for this endpoint.
    pub async fn client(&self) -> Result<aws_sdk_kinesis::Client, KinesisError> {
        self.validate()?;
        let mut loader = aws_config::defaults(BehaviorVersion::latest()).region(Region::new(self.region.clone()));
        if !self.is_aws() {
            loader = loader.endpoint_url(self.endpoint.clone());
            if !credentials_configured() {
                loader = loader.credentials_provider(Credentials::new("test", "test", None, None, "squall-static"));
            }
        }
        // Bounded calls: a request that hangs must not stall a shard's reader for good. Kinesis
        // answers in a second or two even with 10 MB; an emulator under load can take far longer,
        // so each attempt gets 30 s (the SDK retries a timed-out attempt, at most 3 in all).
        let timeouts = aws_config::timeout::TimeoutConfig::builder()
            .connect_timeout(std::time::Duration::from_secs(3))
            .operation_attempt_timeout(std::time::Duration::from_secs(30))
            .build();
        let shared = loader.timeout_config(timeouts).load().await;
        // Every answer's Date header tells the service's clock (for LATEST; see `clock`).
        let conf = aws_sdk_kinesis::config::Builder::from(&shared)
            .interceptor(clock::DateHeader { endpoint: self.label() })
            .build();
        Ok(aws_sdk_kinesis::Client::from_conf(conf))
    }
}

/// True when the environment names credentials for the SDK's chain to find.
pub(crate) fn credentials_configured() -> bool {
    ["AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI"]
        .iter()
        .any(|k| std::env::var_os(k).is_some_and(|v| !v.is_empty()))
}

/// One shard as Squall sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardDescription {
    /// The shard id, e.g. `shardId-000000000003`.
    pub shard_id: String,
    /// The parent shard (split or merge).
    pub parent_shard_id: Option<String>,
    /// The second parent of a merge.
    pub adjacent_parent_shard_id: Option<String>,
    /// Lowest hash key, a decimal string.
    pub starting_hash_key: String,
    /// Highest hash key, a decimal string.
    pub ending_hash_key: String,
    /// First sequence number.
    pub starting_sequence_number: String,
    /// Closed shards (after a split or merge) have an ending sequence number. Do not compare with
    /// it: the emulator returns a sentinel. It only tells open from closed.
    pub closed: bool,
}

impl ShardDescription {
    /// Parent ids, 0, 1 or 2 of them.
    pub fn parents(&self) -> impl Iterator<Item = &str> {
        self.parent_shard_id.as_deref().into_iter().chain(self.adjacent_parent_shard_id.as_deref())
    }

    pub(crate) fn from_sdk(s: &aws_sdk_kinesis::types::Shard) -> Self {
        let (start, end) = s
            .hash_key_range()
            .map(|h| (h.starting_hash_key().to_string(), h.ending_hash_key().to_string()))
            .unwrap_or_default();
        let (starting_sequence_number, closed) = s
            .sequence_number_range()
            .map(|r| (r.starting_sequence_number().to_string(), r.ending_sequence_number().is_some()))
            .unwrap_or_default();
        Self {
            shard_id: s.shard_id().to_string(),
            parent_shard_id: s.parent_shard_id().map(str::to_string),
            adjacent_parent_shard_id: s.adjacent_parent_shard_id().map(str::to_string),
            starting_hash_key: start,
            ending_hash_key: end,
            starting_sequence_number,
            closed,
        }
    }
}
