//! The one seam between Squall's coordination and a ZooKeeper server: [`ZkClient`], the dozen
//! operations the coordination uses, and [`ZkConnector`], which opens sessions.
//!
//! Production reaches ZooKeeper through [`RealClient`] (the `zookeeper-client` crate). The
//! simulator (`tests/sim/`) implements the same trait over its in-memory model, so the coordination
//! code it runs is the product's, not a copy. A connect string `sim://NAME` selects the connector
//! registered under `NAME` ([`register_connector`]); every other connect string is a real ensemble.
//!
//! The trait speaks the crate's own error, [`zk::Error`], and stat, [`zk::Stat`] (plain data that
//! any implementation can build); watches and session states come as this module's types, since
//! the crate's watcher types cannot be built outside it.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use zookeeper_client as zk;

use super::config::ZkConfig;

/// A ZooKeeper call's future.
pub type ZkResult<'a, T> = BoxFuture<'a, Result<T, zk::Error>>;

/// How a znode is created. ACLs are the client's (open, or creator-only with digest auth).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateMode {
    Persistent,
    Ephemeral,
    EphemeralSequential,
}

/// The counter ZooKeeper appended to a sequential node's name, formatted as ZooKeeper does
/// (ten digits, nineteen beyond `i32::MAX`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sequence(pub i64);

impl fmt::Display for Sequence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 <= i64::from(i32::MAX) { write!(f, "{:010}", self.0) } else { write!(f, "{:019}", self.0) }
    }
}

/// What a one-shot watch reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    /// `Session` when the session ended (or the client closed) before the node changed.
    pub event_type: zk::EventType,
    pub path: String,
}

/// A one-shot watch: resolves once, with the change (or the session's end).
pub struct OneshotWatch(BoxFuture<'static, WatchEvent>);

impl OneshotWatch {
    /// A watch that resolves with `fut`.
    pub fn new(fut: impl Future<Output = WatchEvent> + Send + 'static) -> Self {
        Self(Box::pin(fut))
    }

    /// Waits for the event.
    pub async fn changed(self) -> WatchEvent {
        self.0.await
    }
}

impl fmt::Debug for OneshotWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OneshotWatch")
    }
}

/// A source of session states, as a client implementation provides it.
pub trait StateSource: Send + Sync {
    /// The latest state.
    fn peek(&self) -> zk::SessionState;
    /// The next state; after a terminal one, that state again at once.
    fn changed(&mut self) -> BoxFuture<'_, zk::SessionState>;
    /// An independent follower from the current state on.
    fn clone_box(&self) -> Box<dyn StateSource>;
}

/// Follows a session's state (Connected, Disconnected, Expired, Closed, AuthFailed).
pub struct StateWatcher(Box<dyn StateSource>);

impl StateWatcher {
    pub fn new(source: impl StateSource + 'static) -> Self {
        Self(Box::new(source))
    }

    /// The latest state.
    pub fn peek_state(&self) -> zk::SessionState {
        self.0.peek()
    }

    /// Waits for the next state.
    pub async fn changed(&mut self) -> zk::SessionState {
        self.0.changed().await
    }
}

impl Clone for StateWatcher {
    fn clone(&self) -> Self {
        Self(self.0.clone_box())
    }
}

impl fmt::Debug for StateWatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("StateWatcher").field(&self.peek_state()).finish()
    }
}

/// [`StateSource`] over a tokio watch channel (a terminal state is delivered again once the
/// sender is gone).
pub struct WatchStates(pub tokio::sync::watch::Receiver<zk::SessionState>);

impl StateSource for WatchStates {
    fn peek(&self) -> zk::SessionState {
        *self.0.borrow()
    }
    fn changed(&mut self) -> BoxFuture<'_, zk::SessionState> {
        Box::pin(async move {
            match self.0.changed().await {
                Ok(()) => *self.0.borrow_and_update(),
                Err(_) => *self.0.borrow(),
            }
        })
    }
    fn clone_box(&self) -> Box<dyn StateSource> {
        Box::new(WatchStates(self.0.clone()))
    }
}

/// One operation of a transaction ([`ZkClient::multi`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MultiOp {
    Check { path: String, version: i32 },
    Create { path: String, data: Vec<u8>, mode: CreateMode },
    SetData { path: String, data: Vec<u8>, version: Option<i32> },
    Delete { path: String, version: Option<i32> },
}

/// The ZooKeeper operations Squall's coordination uses. One session per client: dropping the
/// last reference closes the session (its ephemeral nodes go at once).
///
/// Reads and writes other than `create` send their request when called, not when first polled,
/// and their futures borrow only the client: the store pipelines reads by calling several and
/// awaiting them together.
pub trait ZkClient: Send + Sync + 'static {
    /// The session id (written into leases and registrations in hex).
    fn session_id(&self) -> i64;
    /// The session timeout the server granted.
    fn session_timeout(&self) -> Duration;
    /// The session's current state.
    fn state(&self) -> zk::SessionState;
    /// Follows the session's state.
    fn state_watcher(&self) -> StateWatcher;
    /// Creates a node; the sequence is meaningful for sequential nodes only.
    fn create<'a>(&'a self, path: &'a str, data: &'a [u8], mode: &'a CreateMode) -> ZkResult<'a, (zk::Stat, Sequence)>;
    /// Creates `path` and its missing ancestors (persistent); an existing node is no error.
    fn mkdir<'a>(&'a self, path: &'a str, mode: &'a CreateMode) -> ZkResult<'a, ()> {
        Box::pin(async move {
            let ends: Vec<usize> =
                path.match_indices('/').map(|(i, _)| i).filter(|&i| i > 0).chain(std::iter::once(path.len())).collect();
            for i in ends {
                match self.create(&path[..i], &[], mode).await {
                    Ok(_) | Err(zk::Error::NodeExists) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        })
    }
    fn delete<'a>(&'a self, path: &str, version: Option<i32>) -> ZkResult<'a, ()>;
    fn get_data<'a>(&'a self, path: &str) -> ZkResult<'a, (Vec<u8>, zk::Stat)>;
    fn set_data<'a>(&'a self, path: &str, data: &[u8], version: Option<i32>) -> ZkResult<'a, zk::Stat>;
    fn list_children<'a>(&'a self, path: &str) -> ZkResult<'a, Vec<String>>;
    fn check_stat<'a>(&'a self, path: &str) -> ZkResult<'a, Option<zk::Stat>>;
    /// Waits until the server this client talks to has applied every write the leader had
    /// committed when the sync arrived.
    fn sync<'a>(&'a self, path: &str) -> ZkResult<'a, ()>;
    fn list_and_watch_children<'a>(&'a self, path: &str) -> ZkResult<'a, (Vec<String>, OneshotWatch)>;
    fn check_and_watch_stat<'a>(&'a self, path: &str) -> ZkResult<'a, (Option<zk::Stat>, OneshotWatch)>;
    /// All of `ops` or none.
    fn multi(&self, ops: Vec<MultiOp>) -> BoxFuture<'_, Result<Vec<zk::MultiWriteResult>, zk::MultiWriteError>>;
}

impl dyn ZkClient {
    /// A transaction to fill and commit.
    pub fn new_multi_writer(&self) -> MultiWriter<'_> {
        MultiWriter { client: self, ops: Vec::new() }
    }
}

/// A transaction being built (the crate's `MultiWriter`, for any [`ZkClient`]).
pub struct MultiWriter<'a> {
    client: &'a dyn ZkClient,
    ops: Vec<MultiOp>,
}

impl MultiWriter<'_> {
    pub fn add_check_version(&mut self, path: &str, version: i32) -> Result<(), zk::Error> {
        self.ops.push(MultiOp::Check { path: path.to_string(), version });
        Ok(())
    }
    pub fn add_create(&mut self, path: &str, data: &[u8], mode: &CreateMode) -> Result<(), zk::Error> {
        self.ops.push(MultiOp::Create { path: path.to_string(), data: data.to_vec(), mode: *mode });
        Ok(())
    }
    pub fn add_set_data(&mut self, path: &str, data: &[u8], version: Option<i32>) -> Result<(), zk::Error> {
        self.ops.push(MultiOp::SetData { path: path.to_string(), data: data.to_vec(), version });
        Ok(())
    }
    pub fn add_delete(&mut self, path: &str, version: Option<i32>) -> Result<(), zk::Error> {
        self.ops.push(MultiOp::Delete { path: path.to_string(), version });
        Ok(())
    }
    /// Sends the transaction.
    pub async fn commit(self) -> Result<Vec<zk::MultiWriteResult>, zk::MultiWriteError> {
        self.client.multi(self.ops).await
    }
}

/// Opens sessions.
pub trait ZkConnector: Send + Sync + 'static {
    fn connect<'a>(&'a self, cfg: &'a ZkConfig) -> BoxFuture<'a, Result<Arc<dyn ZkClient>, zk::Error>>;
}

/// The scheme of connect strings that name a registered connector.
pub const SIM_SCHEME: &str = "sim://";

fn connectors() -> &'static Mutex<BTreeMap<String, Arc<dyn ZkConnector>>> {
    static C: OnceLock<Mutex<BTreeMap<String, Arc<dyn ZkConnector>>>> = OnceLock::new();
    C.get_or_init(Default::default)
}

/// Makes `sim://NAME` connect through `connector` (the simulator's model of ZooKeeper).
pub fn register_connector(name: &str, connector: Arc<dyn ZkConnector>) {
    connectors().lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_string(), connector);
}

/// Forgets `sim://NAME`.
pub fn unregister_connector(name: &str) {
    connectors().lock().unwrap_or_else(|p| p.into_inner()).remove(name);
}

/// The registered connector a `sim://NAME` connect string names; `Err` names the string when
/// none is registered; `Ok(None)` for a real connect string.
pub(crate) fn registered(connect: &str) -> Result<Option<Arc<dyn ZkConnector>>, zk::Error> {
    let Some(name) = connect.strip_prefix(SIM_SCHEME) else { return Ok(None) };
    match connectors().lock().unwrap_or_else(|p| p.into_inner()).get(name) {
        Some(c) => Ok(Some(c.clone())),
        None => Err(zk::Error::BadArguments(
            &"connect string sim://NAME names no registered ZooKeeper model (only the simulator registers them)",
        )),
    }
}

/// The real client, with the ACLs of the session's nodes.
pub struct RealClient {
    client: zk::Client,
    acls: zk::Acls<'static>,
}

impl RealClient {
    pub fn new(client: zk::Client, auth: bool) -> Self {
        let acls = if auth { zk::Acls::creator_all() } else { zk::Acls::anyone_all() };
        Self { client, acls }
    }

    fn options(&self, mode: &CreateMode) -> zk::CreateOptions<'static> {
        match mode {
            CreateMode::Persistent => zk::CreateMode::Persistent.with_acls(self.acls),
            CreateMode::Ephemeral => zk::CreateMode::Ephemeral.with_acls(self.acls),
            CreateMode::EphemeralSequential => zk::CreateMode::EphemeralSequential.with_acls(self.acls),
        }
    }
}

struct RealStates(zk::StateWatcher);

impl StateSource for RealStates {
    fn peek(&self) -> zk::SessionState {
        self.0.peek_state()
    }
    fn changed(&mut self) -> BoxFuture<'_, zk::SessionState> {
        Box::pin(self.0.changed())
    }
    fn clone_box(&self) -> Box<dyn StateSource> {
        Box::new(RealStates(self.0.clone()))
    }
}

fn real_watch(w: zk::OneshotWatcher) -> OneshotWatch {
    OneshotWatch::new(async move {
        let ev = w.changed().await;
        WatchEvent { event_type: ev.event_type, path: ev.path }
    })
}

impl ZkClient for RealClient {
    fn session_id(&self) -> i64 {
        self.client.session_id().0
    }
    fn session_timeout(&self) -> Duration {
        self.client.session_timeout()
    }
    fn state(&self) -> zk::SessionState {
        self.client.state()
    }
    fn state_watcher(&self) -> StateWatcher {
        StateWatcher::new(RealStates(self.client.state_watcher()))
    }
    fn create<'a>(&'a self, path: &'a str, data: &'a [u8], mode: &'a CreateMode) -> ZkResult<'a, (zk::Stat, Sequence)> {
        Box::pin(async move {
            let options = self.options(mode);
            let (stat, seq) = self.client.create(path, data, &options).await?;
            // The crate's sequence prints as ZooKeeper names it; parse it back into the number.
            Ok((stat, Sequence(seq.to_string().parse().unwrap_or(-1))))
        })
    }
    fn mkdir<'a>(&'a self, path: &'a str, mode: &'a CreateMode) -> ZkResult<'a, ()> {
        Box::pin(async move {
            let options = self.options(mode);
            self.client.mkdir(path, &options).await
        })
    }
    fn delete<'a>(&'a self, path: &str, version: Option<i32>) -> ZkResult<'a, ()> {
        Box::pin(self.client.delete(path, version))
    }
    fn get_data<'a>(&'a self, path: &str) -> ZkResult<'a, (Vec<u8>, zk::Stat)> {
        Box::pin(self.client.get_data(path))
    }
    fn set_data<'a>(&'a self, path: &str, data: &[u8], version: Option<i32>) -> ZkResult<'a, zk::Stat> {
        Box::pin(self.client.set_data(path, data, version))
    }
    fn list_children<'a>(&'a self, path: &str) -> ZkResult<'a, Vec<String>> {
        Box::pin(self.client.list_children(path))
    }
    fn check_stat<'a>(&'a self, path: &str) -> ZkResult<'a, Option<zk::Stat>> {
        Box::pin(self.client.check_stat(path))
    }
    fn sync<'a>(&'a self, path: &str) -> ZkResult<'a, ()> {
        Box::pin(self.client.sync(path))
    }
    fn list_and_watch_children<'a>(&'a self, path: &str) -> ZkResult<'a, (Vec<String>, OneshotWatch)> {
        let call = self.client.list_and_watch_children(path);
        Box::pin(async move {
            let (children, w) = call.await?;
            Ok((children, real_watch(w)))
        })
    }
    fn check_and_watch_stat<'a>(&'a self, path: &str) -> ZkResult<'a, (Option<zk::Stat>, OneshotWatch)> {
        let call = self.client.check_and_watch_stat(path);
        Box::pin(async move {
            let (stat, w) = call.await?;
            Ok((stat, real_watch(w)))
        })
    }
    fn multi(&self, ops: Vec<MultiOp>) -> BoxFuture<'_, Result<Vec<zk::MultiWriteResult>, zk::MultiWriteError>> {
        Box::pin(async move {
            let mut txn = self.client.new_multi_writer();
            for op in &ops {
                match op {
                    MultiOp::Check { path, version } => txn.add_check_version(path, *version)?,
                    MultiOp::Create { path, data, mode } => txn.add_create(path, data, &self.options(mode))?,
                    MultiOp::SetData { path, data, version } => txn.add_set_data(path, data, *version)?,
                    MultiOp::Delete { path, version } => txn.add_delete(path, *version)?,
                }
            }
            txn.commit().await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_print_as_zookeeper_names_them() {
        assert_eq!(Sequence(7).to_string(), "0000000007");
        assert_eq!(Sequence(i64::from(i32::MAX) + 1).to_string(), "0000000002147483648");
    }
}
