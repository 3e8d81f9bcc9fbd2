//! The DynamoDB table behind keyed state: one item per key, written with one conditional
//! PutItem (see the [module docs](super) for the schema and the protocol).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use aws_config::{BehaviorVersion, Region};
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, CreateGlobalSecondaryIndexAction, GlobalSecondaryIndex,
    GlobalSecondaryIndexUpdate, IndexStatus, KeySchemaElement, KeyType, KeysAndAttributes, Projection, ProjectionType,
    ScalarAttributeType, TableStatus,
};
use serde::{Deserialize, Serialize};

/// DynamoDB's limit on one item (names and values of every attribute).
pub const MAX_ITEM_BYTES: usize = 400 * 1024;
/// Keys per BatchGetItem call (DynamoDB's limit).
pub const MAX_BATCH_GET: usize = 100;
/// The sparse global secondary index of pending timers: partition key `tpart` (S, `{scope}#{n}`),
/// sort key `fire_at` (N); only items with a pending or unconfirmed timer are in it.
pub const TIMER_INDEX: &str = "timers";

/// Where the state table lives.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateEndpoint {
    /// `http(s)://host:port` (dynalite, LocalStack) or `aws` (the SDK's default endpoint).
    pub endpoint: String,
    /// AWS region.
    pub region: String,
    /// Table name (3 to 255 characters of `[A-Za-z0-9_.-]`).
    pub table: String,
}

impl fmt::Debug for StateEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // holds no credentials (they come from the SDK's chain)
        f.debug_struct("StateEndpoint")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("table", &self.table)
            .finish()
    }
}

impl StateEndpoint {
    /// A table at an endpoint, in `us-east-1`.
    pub fn new(endpoint: impl Into<String>, table: impl Into<String>) -> Self {
        Self { endpoint: endpoint.into(), region: "us-east-1".into(), table: table.into() }
    }

    /// Checks the names; the error names the bad one and the fix.
    pub fn validate(&self) -> Result<(), StateError> {
        let ok = (3..=255).contains(&self.table.len())
            && self.table.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
        if !ok {
            return Err(StateError::Config(format!(
                "state table name `{}` is invalid: DynamoDB table names are 3 to 255 characters of letters, digits, \
                 `_`, `-` and `.` (set --state-table)",
                self.table
            )));
        }
        if self.endpoint != "aws"
            && !(self.endpoint.starts_with("http://")
                || self.endpoint.starts_with("https://")
                || self.endpoint.starts_with(SIM_SCHEME))
        {
            return Err(StateError::Config(format!(
                "state endpoint `{}` is invalid: use http(s)://host:port (dynalite, LocalStack) or `aws` (set \
                 --state-endpoint)",
                self.endpoint
            )));
        }
        if self.region.is_empty() {
            return Err(StateError::Config("the state store's region is empty (set --region)".into()));
        }
        Ok(())
    }

    /// A DynamoDB client for this endpoint: the SDK's default credential chain, or fixed dummy
    /// credentials for a local endpoint when the environment names none.
    pub async fn client(&self) -> Result<Client, StateError> {
        self.validate()?;
        let mut loader = aws_config::defaults(BehaviorVersion::latest()).region(Region::new(self.region.clone()));
        if self.endpoint != "aws" {
            loader = loader.endpoint_url(self.endpoint.clone());
            if !crate::kinesis::credentials_configured() {
                loader = loader.credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
                    "test",
                    "test",
                    None,
                    None,
                    "squall-static",
                ));
            }
        }
        let timeouts = aws_config::timeout::TimeoutConfig::builder()
            .connect_timeout(Duration::from_secs(3))
            .operation_attempt_timeout(Duration::from_secs(10))
            .build();
        let shared = loader.timeout_config(timeouts).load().await;
        Ok(Client::from_conf(aws_sdk_dynamodb::config::Builder::from(&shared).build()))
    }
}

/// Errors of the state store.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Bad configuration; the message names the setting and the fix.
    #[error("{0}")]
    Config(String),
    /// Throttled, a server error, or the store unreachable: retry after a back-off.
    #[error("state table `{table}`: {op} failed, will retry: {message}")]
    Retryable { table: String, op: &'static str, message: String },
    /// An error retrying cannot fix (access denied, no such table, validation); names the fix.
    #[error("state table `{table}`: {op} failed: {message}")]
    Fatal { table: String, op: &'static str, message: String },
}

impl StateError {
    /// True when a retry may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StateError::Retryable { .. })
    }

    fn classify<E: ProvideErrorMetadata + fmt::Debug>(table: &str, op: &'static str, e: SdkError<E>) -> StateError {
        let (table, message) = (table.to_string(), Self::describe(&e));
        match &e {
            SdkError::ServiceError(s) => {
                let code = s.err().code().unwrap_or("");
                let status = s.raw().status().as_u16();
                let retry = status >= 500
                    || matches!(
                        code,
                        "ProvisionedThroughputExceededException"
                            | "ThrottlingException"
                            | "RequestLimitExceeded"
                            | "InternalServerError"
                            | "ServiceUnavailable"
                            | "LimitExceededException"
                    );
                if retry {
                    StateError::Retryable { table, op, message }
                } else if code == "ResourceNotFoundException" {
                    StateError::Fatal {
                        table: table.clone(),
                        op,
                        message: format!(
                            "{message}; the table does not exist (it is created on start: check --state-table and \
                             --state-endpoint)"
                        ),
                    }
                } else if code == "AccessDeniedException" || code == "UnrecognizedClientException" {
                    StateError::Fatal {
                        table,
                        op,
                        message: format!("{message}; grant dynamodb:{op} on the table to these credentials"),
                    }
                } else {
                    StateError::Fatal { table, op, message }
                }
            }
            // timeouts, connection refused, malformed answers: the store is unreachable now
            _ => StateError::Retryable { table, op, message },
        }
    }

    fn describe<E: ProvideErrorMetadata + fmt::Debug>(e: &SdkError<E>) -> String {
        match e {
            SdkError::ServiceError(s) => {
                format!("{}: {}", s.err().code().unwrap_or("unknown error"), s.err().message().unwrap_or(""))
            }
            SdkError::DispatchFailure(d) => format!("cannot reach the store: {d:?}"),
            SdkError::TimeoutError(_) => "timed out".into(),
            other => format!("{other:?}"),
        }
    }
}

/// One key's item as read.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredItem {
    /// Version, raised by each write (the write's condition): 1 or more. 0 when the item has no
    /// `ver` attribute that reads as a whole number (not written by the bolt, or damaged): such
    /// an item cannot be read, nor written over.
    pub version: u64,
    /// The user state, serialized (JSON).
    pub state: Vec<u8>,
    /// Deduplication and fencing data (JSON of [`super::Dedup`]).
    pub dedup: Vec<u8>,
    /// Fired: its timer fired and its state is frozen (inputs after that are late).
    pub fired: bool,
    /// When it was frozen (ms since the epoch, the freezing firer's clock); `None` when not
    /// fired, or frozen by a version that did not record it.
    pub fired_at_ms: Option<i64>,
    /// The registration (`firers/{component}/` node) of the firer that froze it; `None` when
    /// not fired, or frozen by a version that did not record it.
    pub fired_by: Option<String>,
    /// Its timer as the item holds it (`tpart`, `fire_at`): none once it was taken out of the
    /// index (a fired key whose firing was delivered), or when it never had one. The index is
    /// eventually consistent on DynamoDB: it may still list a timer the item no longer has.
    pub timer: Option<TimerAt>,
}

/// A key's timer: the item is found through [`TIMER_INDEX`] in partition `partition` once the
/// committed watermark reaches `fire_at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerAt {
    /// `{scope}#{n}`, n in `0..timer_partitions`.
    pub partition: String,
    /// Event time (ms since the epoch) at which it fires.
    pub fire_at: i64,
}

/// The outcome of a conditional write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Written.
    Written,
    /// The item changed since it was read (another writer): read again and redo.
    Conflict,
}

/// The state table's operations, as the exactly-once bolt and the window firer use them: the one
/// seam between keyed state and DynamoDB. [`StateStore`] reaches the real table through it (the
/// AWS SDK), or, for an endpoint `sim://NAME`, the implementation registered under `NAME`
/// ([`register_state_api`]: the simulator's model of the table).
pub trait StateApi: Send + Sync + 'static {
    /// Creates the table when it does not exist (with [`TIMER_INDEX`]) and waits until it is
    /// ACTIVE.
    fn ensure_table(&self) -> BoxFuture<'_, Result<(), StateError>>;
    /// Makes sure the table has [`TIMER_INDEX`].
    fn ensure_timer_index(&self) -> BoxFuture<'_, Result<(), StateError>>;
    /// Strongly consistent reads of up to [`MAX_BATCH_GET`] items; absent keys are absent.
    fn get_many<'a>(&'a self, pks: &'a [String]) -> BoxFuture<'a, Result<HashMap<String, StoredItem>, StateError>>;
    /// Writes an item (replacing it) if its version is still `item.expected` (`None`: it must not
    /// exist); version `expected + 1`, in [`TIMER_INDEX`] with a timer.
    fn put<'a>(&'a self, item: NewItem<'a>) -> BoxFuture<'a, Result<WriteOutcome, StateError>>;
    /// Up to `limit` timers of `partition` due at `upto` or before, earliest first, from the
    /// index (eventually consistent).
    fn due_timers<'a>(
        &'a self,
        partition: &'a str,
        upto: i64,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(String, i64)>, StateError>>;
    /// Sets `fired` (at `fired_ms`, by `by`) and raises the version, if it is still `expected`.
    fn freeze<'a>(
        &'a self,
        pk: &'a str,
        expected: u64,
        by: &'a str,
        fired_ms: i64,
    ) -> BoxFuture<'a, Result<WriteOutcome, StateError>>;
    /// Takes a fired item's timer out of the index; nothing when it is not fired.
    fn clear_timer<'a>(&'a self, pk: &'a str) -> BoxFuture<'a, Result<(), StateError>>;
    /// Every item of `scope`: key, version and state.
    fn scan_scope<'a>(&'a self, scope: &'a str) -> BoxFuture<'a, Result<Vec<ScopeItem>, StateError>>;
}

/// An item of a scope as a scan reads it: key, version, state.
pub type ScopeItem = (String, u64, Vec<u8>);

/// One item to write ([`StateApi::put`]).
#[derive(Debug, Clone)]
pub struct NewItem<'a> {
    pub pk: &'a str,
    pub scope: &'a str,
    pub key: &'a str,
    pub expected: Option<u64>,
    pub state: Vec<u8>,
    pub dedup: Vec<u8>,
    pub timer: Option<&'a TimerAt>,
    /// The writer's clock (`updated_ms`, for operators).
    pub updated_ms: i64,
}

/// The scheme of state endpoints that name a registered [`StateApi`].
pub const SIM_SCHEME: &str = "sim://";

type Registry = std::sync::Mutex<std::collections::BTreeMap<String, Arc<dyn StateApi>>>;

fn state_apis() -> &'static Registry {
    static APIS: std::sync::OnceLock<Registry> = std::sync::OnceLock::new();
    APIS.get_or_init(Default::default)
}

/// Makes the state endpoint `sim://NAME` reach `api` (the simulator's model of the table).
pub fn register_state_api(name: &str, api: Arc<dyn StateApi>) {
    state_apis().lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_string(), api);
}

/// The state table.
#[derive(Clone)]
pub struct StateStore {
    api: Arc<dyn StateApi>,
    table: String,
    /// The DynamoDB client, when the table is DynamoDB's.
    client: Option<Client>,
}

impl fmt::Debug for StateStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateStore").field("table", &self.table).finish_non_exhaustive()
    }
}

impl StateStore {
    /// The table through `client`.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        let table = table.into();
        let api = Arc::new(Dynamo { client: client.clone(), table: table.clone() });
        Self { api, table, client: Some(client) }
    }

    /// Connects to `ep` and makes sure the table exists (created with on-demand billing when
    /// missing; several workers may race to create it).
    pub async fn open(ep: &StateEndpoint) -> Result<Self, StateError> {
        let store = match ep.endpoint.strip_prefix(SIM_SCHEME) {
            Some(name) => {
                let api =
                    state_apis().lock().unwrap_or_else(|p| p.into_inner()).get(name).cloned().ok_or_else(|| {
                        StateError::Config(format!(
                            "state endpoint `{}` names no registered model (only the simulator registers them)",
                            ep.endpoint
                        ))
                    })?;
                Self { api, table: ep.table.clone(), client: None }
            }
            None => Self::new(ep.client().await?, ep.table.clone()),
        };
        store.ensure_table().await?;
        Ok(store)
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The DynamoDB client (`None` for a registered model).
    pub fn client(&self) -> Option<&Client> {
        self.client.as_ref()
    }

    /// Creates the table when it does not exist (with [`TIMER_INDEX`]) and waits until it is
    /// ACTIVE (up to 60 s).
    pub async fn ensure_table(&self) -> Result<(), StateError> {
        self.api.ensure_table().await
    }

    /// Makes sure the table has [`TIMER_INDEX`] (timers need it): a table created before timers
    /// existed gets it with UpdateTable, and this waits while DynamoDB builds it (up to 15 min).
    /// dynalite cannot add an index to a table: the error then says to use a new table.
    pub async fn ensure_timer_index(&self) -> Result<(), StateError> {
        self.api.ensure_timer_index().await
    }

    /// Reads up to [`MAX_BATCH_GET`] items with strongly consistent reads; absent keys are absent
    /// from the answer.
    pub async fn get_many(&self, pks: &[String]) -> Result<HashMap<String, StoredItem>, StateError> {
        self.api.get_many(pks).await
    }

    /// Writes a key's item if its version is still `expected` (`None`: the item must not exist).
    /// The new item has version `expected + 1`; with a `timer`, it is in [`TIMER_INDEX`].
    #[allow(clippy::too_many_arguments)]
    pub async fn put(
        &self,
        pk: &str,
        scope: &str,
        key: &str,
        expected: Option<u64>,
        state: Vec<u8>,
        dedup: Vec<u8>,
        timer: Option<&TimerAt>,
    ) -> Result<WriteOutcome, StateError> {
        let updated_ms = crate::coord::now_ms();
        self.api.put(NewItem { pk, scope, key, expected, state, dedup, timer, updated_ms }).await
    }

    /// Up to `limit` timers of `partition` due at `upto` or before, earliest first: item key and
    /// fire time. The index is eventually consistent: read the items strongly before using them.
    pub async fn due_timers(&self, partition: &str, upto: i64, limit: usize) -> Result<Vec<(String, i64)>, StateError> {
        self.api.due_timers(partition, upto, limit).await
    }

    /// Freezes a key's item for firing: sets `fired` and raises the version, if the version is
    /// still `expected` (a later write of the key conflicts then, and sees it fired). The timer
    /// stays in [`TIMER_INDEX`] until [`StateStore::clear_timer`], so a firing not confirmed is
    /// found again.
    pub async fn freeze(&self, pk: &str, expected: u64, by: &str) -> Result<WriteOutcome, StateError> {
        self.api.freeze(pk, expected, by, crate::coord::now_ms()).await
    }

    /// Takes a fired key's timer out of [`TIMER_INDEX`] (its firing was delivered). Idempotent.
    pub async fn clear_timer(&self, pk: &str) -> Result<(), StateError> {
        self.api.clear_timer(pk).await
    }

    /// Every item of `scope` (a topology's component): key, version and state bytes. A full
    /// scan, for audits and tools, not for the data path.
    pub async fn scan_scope(&self, scope: &str) -> Result<Vec<(String, u64, Vec<u8>)>, StateError> {
        self.api.scan_scope(scope).await
    }
}

/// The table in DynamoDB, through the AWS SDK.
struct Dynamo {
    client: Client,
    table: String,
}

impl StateApi for Dynamo {
    fn ensure_table(&self) -> BoxFuture<'_, Result<(), StateError>> {
        Box::pin(Dynamo::ensure_table(self))
    }
    fn ensure_timer_index(&self) -> BoxFuture<'_, Result<(), StateError>> {
        Box::pin(Dynamo::ensure_timer_index(self))
    }
    fn get_many<'a>(&'a self, pks: &'a [String]) -> BoxFuture<'a, Result<HashMap<String, StoredItem>, StateError>> {
        Box::pin(Dynamo::get_many(self, pks))
    }
    fn put<'a>(&'a self, item: NewItem<'a>) -> BoxFuture<'a, Result<WriteOutcome, StateError>> {
        Box::pin(Dynamo::put(self, item))
    }
    fn due_timers<'a>(
        &'a self,
        partition: &'a str,
        upto: i64,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(String, i64)>, StateError>> {
        Box::pin(Dynamo::due_timers(self, partition, upto, limit))
    }
    fn freeze<'a>(
        &'a self,
        pk: &'a str,
        expected: u64,
        by: &'a str,
        fired_ms: i64,
    ) -> BoxFuture<'a, Result<WriteOutcome, StateError>> {
        Box::pin(Dynamo::freeze(self, pk, expected, by, fired_ms))
    }
    fn clear_timer<'a>(&'a self, pk: &'a str) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(Dynamo::clear_timer(self, pk))
    }
    fn scan_scope<'a>(&'a self, scope: &'a str) -> BoxFuture<'a, Result<Vec<ScopeItem>, StateError>> {
        Box::pin(Dynamo::scan_scope(self, scope))
    }
}

fn attr_bytes(item: &HashMap<String, AttributeValue>, name: &str) -> Vec<u8> {
    match item.get(name) {
        Some(AttributeValue::B(b)) => b.as_ref().to_vec(),
        _ => Vec::new(),
    }
}

impl Dynamo {
    /// Creates the table when it does not exist (with [`TIMER_INDEX`]) and waits until it is
    /// ACTIVE (up to 60 s).
    pub async fn ensure_table(&self) -> Result<(), StateError> {
        let t = &self.table;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let mut created = false;
        loop {
            match self.client.describe_table().table_name(t).send().await {
                Ok(d) => {
                    if d.table().and_then(|t| t.table_status()) == Some(&TableStatus::Active) {
                        return Ok(());
                    }
                }
                Err(SdkError::ServiceError(s)) if s.err().is_resource_not_found_exception() && !created => {
                    let r = self
                        .client
                        .create_table()
                        .table_name(t)
                        .set_attribute_definitions(Some(Self::attributes(true)?))
                        .key_schema(Self::key("pk", KeyType::Hash)?)
                        .global_secondary_indexes(Self::timer_index()?)
                        .billing_mode(BillingMode::PayPerRequest)
                        .send()
                        .await;
                    match r {
                        Ok(_) => tracing::info!(table = %t, "created the state table (on-demand billing)"),
                        // another worker created it first
                        Err(SdkError::ServiceError(s)) if s.err().is_resource_in_use_exception() => {}
                        Err(e) => return Err(StateError::classify(t, "CreateTable", e)),
                    }
                    created = true;
                }
                Err(e) => {
                    let e = StateError::classify(t, "DescribeTable", e);
                    if !e.is_retryable() {
                        return Err(e);
                    }
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(StateError::Fatal {
                    table: t.clone(),
                    op: "DescribeTable",
                    message: "the table did not become ACTIVE within 60 s".into(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Makes sure the table has [`TIMER_INDEX`] (timers need it): a table created before timers
    /// existed gets it with UpdateTable, and this waits while DynamoDB builds it (up to 15 min).
    /// dynalite cannot add an index to a table: the error then says to use a new table.
    pub async fn ensure_timer_index(&self) -> Result<(), StateError> {
        let t = &self.table;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15 * 60);
        let mut asked = false;
        loop {
            let d = self
                .client
                .describe_table()
                .table_name(t)
                .send()
                .await
                .map_err(|e| StateError::classify(t, "DescribeTable", e))?;
            let index = d
                .table()
                .map(|t| t.global_secondary_indexes())
                .unwrap_or_default()
                .iter()
                .find(|i| i.index_name() == Some(TIMER_INDEX))
                .cloned();
            match index {
                Some(i) if i.index_status() == Some(&IndexStatus::Active) => return Ok(()),
                Some(_) => {}
                None if !asked => {
                    self.add_timer_index().await?;
                    asked = true;
                }
                None => return Err(self.no_timer_index("adding it did not take")),
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(StateError::Fatal {
                    table: t.clone(),
                    op: "DescribeTable",
                    message: format!("the index `{TIMER_INDEX}` did not become ACTIVE within 15 minutes"),
                });
            }
            tokio::time::sleep(Duration::from_millis(if asked { 1000 } else { 100 })).await;
        }
    }

    fn key(name: &str, kind: KeyType) -> Result<KeySchemaElement, StateError> {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
            .map_err(|e| StateError::Config(e.to_string()))
    }

    fn attributes(with_pk: bool) -> Result<Vec<AttributeDefinition>, StateError> {
        let mut attrs = vec![("tpart", ScalarAttributeType::S), ("fire_at", ScalarAttributeType::N)];
        if with_pk {
            attrs.insert(0, ("pk", ScalarAttributeType::S));
        }
        attrs
            .into_iter()
            .map(|(n, k)| {
                AttributeDefinition::builder()
                    .attribute_name(n)
                    .attribute_type(k)
                    .build()
                    .map_err(|e| StateError::Config(e.to_string()))
            })
            .collect()
    }

    /// The timer index.
    fn timer_index() -> Result<GlobalSecondaryIndex, StateError> {
        GlobalSecondaryIndex::builder()
            .index_name(TIMER_INDEX)
            .key_schema(Self::key("tpart", KeyType::Hash)?)
            .key_schema(Self::key("fire_at", KeyType::Range)?)
            .projection(Projection::builder().projection_type(ProjectionType::KeysOnly).build())
            .build()
            .map_err(|e| StateError::Config(e.to_string()))
    }

    /// Asks DynamoDB to add [`TIMER_INDEX`] to a table created before timers existed.
    async fn add_timer_index(&self) -> Result<(), StateError> {
        let t = &self.table;
        let i = Self::timer_index()?;
        let create = CreateGlobalSecondaryIndexAction::builder()
            .index_name(i.index_name())
            .set_key_schema(Some(i.key_schema().to_vec()))
            .set_projection(i.projection().cloned())
            .build()
            .map_err(|e| StateError::Config(e.to_string()))?;
        let r = self
            .client
            .update_table()
            .table_name(t)
            .set_attribute_definitions(Some(Self::attributes(false)?))
            .global_secondary_index_updates(GlobalSecondaryIndexUpdate::builder().create(create).build())
            .send()
            .await;
        match r {
            Ok(_) => {
                tracing::info!(table = %t, index = TIMER_INDEX, "adding the timer index to the state table");
                Ok(())
            }
            // another worker is adding it
            Err(SdkError::ServiceError(s)) if s.err().is_resource_in_use_exception() => Ok(()),
            // dynalite: it wants provisioned throughput even for an on-demand table (and then adds
            // nothing)
            Err(SdkError::ServiceError(s)) if s.err().message().unwrap_or("").contains("provisionedThroughput") => {
                Err(self.no_timer_index(&format!("adding it was refused: {}", s.err().message().unwrap_or(""))))
            }
            Err(e) => Err(StateError::classify(t, "UpdateTable", e)),
        }
    }

    fn no_timer_index(&self, why: &str) -> StateError {
        StateError::Fatal {
            table: self.table.clone(),
            op: "UpdateTable",
            message: format!(
                "the table has no index `{TIMER_INDEX}`, which timers need, and {why} (dynalite cannot add an index to \
                 a table): use a new table (--state-table), which is created with the index, or add the index \
                 `{TIMER_INDEX}` (partition key tpart S, sort key fire_at N, keys only)"
            ),
        }
    }

    /// Reads up to [`MAX_BATCH_GET`] items with strongly consistent reads; absent keys are absent
    /// from the answer. Unprocessed keys are asked again until none is left.
    pub async fn get_many(&self, pks: &[String]) -> Result<HashMap<String, StoredItem>, StateError> {
        let mut out = HashMap::with_capacity(pks.len());
        let mut keys: Vec<HashMap<String, AttributeValue>> =
            pks.iter().map(|pk| HashMap::from([("pk".to_string(), AttributeValue::S(pk.clone()))])).collect();
        let mut rounds = 0u32;
        while !keys.is_empty() {
            let ka = KeysAndAttributes::builder()
                .set_keys(Some(std::mem::take(&mut keys)))
                .consistent_read(true)
                .build()
                .map_err(|e| StateError::Config(e.to_string()))?;
            let r = self
                .client
                .batch_get_item()
                .request_items(&self.table, ka)
                .send()
                .await
                .map_err(|e| StateError::classify(&self.table, "BatchGetItem", e))?;
            for item in r.responses().and_then(|m| m.get(&self.table)).into_iter().flatten() {
                let Some(AttributeValue::S(pk)) = item.get("pk") else { continue };
                let version = match item.get("ver") {
                    Some(AttributeValue::N(n)) => n.parse().unwrap_or(0),
                    _ => 0,
                };
                let fired = matches!(item.get("fired"), Some(AttributeValue::Bool(true)));
                let fired_at_ms = match item.get("fired_ms") {
                    Some(AttributeValue::N(n)) => n.parse().ok(),
                    _ => None,
                };
                let fired_by = match item.get("fired_by") {
                    Some(AttributeValue::S(b)) => Some(b.clone()),
                    _ => None,
                };
                let timer = match (item.get("tpart"), item.get("fire_at")) {
                    (Some(AttributeValue::S(partition)), Some(AttributeValue::N(at))) => {
                        at.parse().ok().map(|fire_at| TimerAt { partition: partition.clone(), fire_at })
                    }
                    _ => None,
                };
                out.insert(
                    pk.clone(),
                    StoredItem {
                        version,
                        state: attr_bytes(item, "state"),
                        dedup: attr_bytes(item, "dedup"),
                        fired,
                        fired_at_ms,
                        fired_by,
                        timer,
                    },
                );
            }
            if let Some(left) = r.unprocessed_keys().and_then(|m| m.get(&self.table)) {
                keys = left.keys().to_vec();
                rounds += 1;
                if !keys.is_empty() {
                    // DynamoDB leaves keys unprocessed when throttled: back off a little
                    tokio::time::sleep(Duration::from_millis((10u64 << rounds.min(6)).min(500))).await;
                }
            }
        }
        Ok(out)
    }

    /// Writes a key's item if its version is still `expected` (`None`: the item must not exist).
    /// The new item has version `expected + 1`; with a `timer`, it is in [`TIMER_INDEX`].
    async fn put(&self, item: NewItem<'_>) -> Result<WriteOutcome, StateError> {
        let NewItem { pk, scope, key, expected, state, dedup, timer, updated_ms } = item;
        let version = expected.map_or(1, |v| v + 1);
        let mut req = self
            .client
            .put_item()
            .table_name(&self.table)
            .item("pk", AttributeValue::S(pk.to_string()))
            .item("scope", AttributeValue::S(scope.to_string()))
            .item("key", AttributeValue::S(key.to_string()))
            .item("ver", AttributeValue::N(version.to_string()))
            .item("state", AttributeValue::B(state.into()))
            .item("dedup", AttributeValue::B(dedup.into()))
            .item("updated_ms", AttributeValue::N(updated_ms.to_string()));
        if let Some(t) = timer {
            req = req
                .item("tpart", AttributeValue::S(t.partition.clone()))
                .item("fire_at", AttributeValue::N(t.fire_at.to_string()));
        }
        req = match expected {
            None => req.condition_expression("attribute_not_exists(pk)"),
            Some(v) => {
                req.condition_expression("ver = :v").expression_attribute_values(":v", AttributeValue::N(v.to_string()))
            }
        };
        match req.send().await {
            Ok(_) => Ok(WriteOutcome::Written),
            Err(SdkError::ServiceError(s)) if s.err().is_conditional_check_failed_exception() => {
                Ok(WriteOutcome::Conflict)
            }
            Err(e) => Err(StateError::classify(&self.table, "PutItem", e)),
        }
    }

    /// Up to `limit` timers of `partition` due at `upto` or before, earliest first: item key and
    /// fire time. The index is eventually consistent: read the items strongly before using them.
    pub async fn due_timers(&self, partition: &str, upto: i64, limit: usize) -> Result<Vec<(String, i64)>, StateError> {
        let mut out = Vec::new();
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        while out.len() < limit {
            let page = i32::try_from((limit - out.len()).min(1000)).unwrap_or(1000);
            let r = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(TIMER_INDEX)
                .key_condition_expression("tpart = :p AND fire_at <= :w")
                .expression_attribute_values(":p", AttributeValue::S(partition.to_string()))
                .expression_attribute_values(":w", AttributeValue::N(upto.to_string()))
                .limit(page)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| StateError::classify(&self.table, "Query", e))?;
            for item in r.items() {
                if let (Some(AttributeValue::S(pk)), Some(AttributeValue::N(at))) =
                    (item.get("pk"), item.get("fire_at"))
                {
                    out.push((pk.clone(), at.parse().unwrap_or(i64::MAX)));
                }
            }
            match r.last_evaluated_key() {
                Some(k) if !k.is_empty() => start = Some(k.clone()),
                _ => break,
            }
        }
        Ok(out)
    }

    /// Freezes a key's item for firing: sets `fired` and raises the version, if the version is
    /// still `expected` (a later write of the key conflicts then, and sees it fired). The timer
    /// stays in [`TIMER_INDEX`] until [`StateStore::clear_timer`], so a firing not confirmed is
    /// found again.
    async fn freeze(&self, pk: &str, expected: u64, by: &str, fired_ms: i64) -> Result<WriteOutcome, StateError> {
        let r = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(pk.to_string()))
            .update_expression("SET fired = :t, ver = :n, fired_ms = :f, fired_by = :b")
            .condition_expression("ver = :v")
            .expression_attribute_values(":t", AttributeValue::Bool(true))
            .expression_attribute_values(":b", AttributeValue::S(by.to_string()))
            .expression_attribute_values(":f", AttributeValue::N(fired_ms.to_string()))
            .expression_attribute_values(":n", AttributeValue::N((expected + 1).to_string()))
            .expression_attribute_values(":v", AttributeValue::N(expected.to_string()))
            .send()
            .await;
        match r {
            Ok(_) => Ok(WriteOutcome::Written),
            Err(SdkError::ServiceError(s)) if s.err().is_conditional_check_failed_exception() => {
                Ok(WriteOutcome::Conflict)
            }
            Err(e) => Err(StateError::classify(&self.table, "UpdateItem", e)),
        }
    }

    /// Takes a fired key's timer out of [`TIMER_INDEX`] (its firing was delivered). Idempotent.
    pub async fn clear_timer(&self, pk: &str) -> Result<(), StateError> {
        let r = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(pk.to_string()))
            .update_expression("REMOVE tpart, fire_at")
            .condition_expression("fired = :t")
            .expression_attribute_values(":t", AttributeValue::Bool(true))
            .send()
            .await;
        match r {
            Ok(_) => Ok(()),
            // not fired (never frozen): nothing to clear
            Err(SdkError::ServiceError(s)) if s.err().is_conditional_check_failed_exception() => Ok(()),
            Err(e) => Err(StateError::classify(&self.table, "UpdateItem", e)),
        }
    }

    /// Every item of `scope` (a topology's component): key, version and state bytes. A full
    /// scan, for audits and tools, not for the data path.
    pub async fn scan_scope(&self, scope: &str) -> Result<Vec<(String, u64, Vec<u8>)>, StateError> {
        let mut out = Vec::new();
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        loop {
            let r = self
                .client
                .scan()
                .table_name(&self.table)
                .consistent_read(true)
                .filter_expression("#s = :s")
                .expression_attribute_names("#s", "scope")
                .expression_attribute_values(":s", AttributeValue::S(scope.to_string()))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| StateError::classify(&self.table, "Scan", e))?;
            for item in r.items() {
                let Some(AttributeValue::S(key)) = item.get("key") else { continue };
                let version = match item.get("ver") {
                    Some(AttributeValue::N(n)) => n.parse().unwrap_or(0),
                    _ => 0,
                };
                out.push((key.clone(), version, attr_bytes(item, "state")));
            }
            match r.last_evaluated_key() {
                Some(k) if !k.is_empty() => start = Some(k.clone()),
                _ => return Ok(out),
            }
        }
    }
}

/// The size DynamoDB counts for an item with these attribute values (names plus values, plus a
/// little for the numbers).
pub fn item_size(pk: &str, scope: &str, key: &str, state: usize, dedup: usize) -> usize {
    "pk".len()
        + pk.len()
        + "scope".len()
        + scope.len()
        + "key".len()
        + key.len()
        + "state".len()
        + state
        + "dedup".len()
        + dedup
        + "ver".len()
        + 21
        + "updated_ms".len()
        + 21
        // a timer and the fired flag, when set
        + "tpart".len()
        + scope.len()
        + 4
        + "fire_at".len()
        + 21
        + "fired".len()
        + 1
        + "fired_ms".len()
        + 21
        // the freezing firer's registration (`task-` and ten digits)
        + "fired_by".len()
        + 15
}
