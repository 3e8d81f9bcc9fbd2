//! [`ZkStore`]: the ZooKeeper side of the spout's state manager, for one topology reading one
//! stream, over a (possibly shared) [`ZkSession`].
//!
//! Cost per operation (ZooKeeper requests), the numbers ARCHITECTURE.md's cost model is built on:
//! a checkpoint write is 1 (one transaction), finishing a shard 1, taking a free lease 3 (list,
//! create, list), waiting for a held one 2 (list, one `exists` watch) and no write, releasing 1.
//! Publishing a committed watermark report is 1 (2 the first time, 3 when its directory is
//! created); reading the stream's committed watermark is 2 plus 1 per task of the assignment.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use backon::Retryable;
use tokio::sync::mpsc;
use tracing::{debug, warn};
use zookeeper_client as zk;

use super::config::ZkConfig;
use super::error::{CoordError, is_transient};
use super::logic::{committed_watermark, task_cmp};
use super::model::{
    Assignment, Checkpoint, CheckpointPosition, DrainRequest, FirerInfo, FirstStart, LeaseInfo, PublishedWatermark,
    RebalanceRequest, ShardList, TaskInfo, TopologyState, Versioned, WatermarkReport, WorkerStatus, decode, encode,
    now_ms,
};
use super::paths::{LEASE_PREFIX, TASK_PREFIX, TopologyPaths, lease_holder, sequence_of, validate_name};
use super::session::{InjectedFault, ZkOp, ZkSession, short_backoff};
use super::watch::{ChangeEvent, SessionWatch};
use super::zkapi::{CreateMode, OneshotWatch, ZkClient};

/// Largest shard list the store writes. ZooKeeper refuses znodes over `jute.maxbuffer`
/// (1 MB by default); at ~200 bytes per shard this is a few thousand shards.
pub const MAX_SHARD_LIST_BYTES: usize = 900 * 1024;

/// Capacity of the channel [`ZkStore::watch`] returns.
const WATCH_CHANNEL: usize = 256;

/// A lease on one shard: the lease znode this holder created and found lowest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub shard_id: String,
    /// Full path of the lease znode; checkpoint writes are fenced on its existence.
    pub path: String,
}

/// Result of [`ZkStore::try_acquire`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquire {
    /// The holder owns the shard now.
    Acquired(Lease),
    /// Another holder has the shard; [`ZkStore::watch_lease`] on `holder_path` says when it goes.
    HeldBy { shard_id: String, holder_path: String },
}

/// The current owner of a shard, as [`ZkStore::shard_owners`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseOwner {
    /// The lowest lease znode.
    pub path: String,
    /// Its holder: a task node name (`task-N`), `cli-{session}` for operator tools, or a session
    /// id for leases written by older versions.
    pub holder: String,
}

/// What a [`ZkStore::watch`] should follow: one znode each, its data or its list of children,
/// never anything deeper, so hot checkpoint writes reach no watcher.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchOn {
    /// `tasks/`: a task registered or went away.
    Tasks,
    /// `streams/{stream}/assignment`.
    Assignment,
    /// `streams/{stream}/finished/`: a shard finished (the leader's cheap signal).
    Finished,
    /// `state`.
    State,
    /// `drain`.
    Drain,
}

/// Connection to ZooKeeper for one topology reading one stream. Cheap to clone; clones share the
/// session. Dropping the last reference to the session closes it: its ephemeral nodes (task
/// registrations, leases) disappear at once.
#[derive(Clone, Debug)]
pub struct ZkStore {
    session: Arc<ZkSession>,
    paths: TopologyPaths,
}

impl ZkStore {
    /// Connects a session of its own (bounded retry with back-off), then creates the persistent
    /// layout (idempotent).
    ///
    /// With `cfg.auth`, the session authenticates with digest auth and every znode the store
    /// creates gets creator-only ACLs.
    pub async fn connect(cfg: &ZkConfig, topology: &str, stream: &str) -> Result<Self, CoordError> {
        cfg.validate()?;
        let paths = TopologyPaths::new(&cfg.root, topology, stream)?;
        let session = ZkSession::connect(cfg).await?;
        Self::open_paths(session, paths).await
    }

    /// A store over an existing (shared) session; creates the persistent layout (idempotent).
    pub async fn open(session: Arc<ZkSession>, root: &str, topology: &str, stream: &str) -> Result<Self, CoordError> {
        let paths = TopologyPaths::new(root, topology, stream)?;
        Self::open_paths(session, paths).await
    }

    /// [`ZkStore::open`] for the input of a later stage (an intermediate stream): its tasks
    /// register under the stream (see [`TopologyPaths::for_stage_input`]).
    pub async fn open_stage_input(
        session: Arc<ZkSession>,
        root: &str,
        topology: &str,
        stream: &str,
    ) -> Result<Self, CoordError> {
        let paths = TopologyPaths::for_stage_input(root, topology, stream)?;
        Self::open_paths(session, paths).await
    }

    /// [`ZkStore::open`] for a further source stream of a topology reading several: its tasks
    /// register under the stream (see [`TopologyPaths::for_source_stream`]).
    pub async fn open_source_stream(
        session: Arc<ZkSession>,
        root: &str,
        topology: &str,
        stream: &str,
    ) -> Result<Self, CoordError> {
        let paths = TopologyPaths::for_source_stream(root, topology, stream)?;
        Self::open_paths(session, paths).await
    }

    /// A store on `session` for the producer registry of an intermediate stream, without the
    /// layout checks of [`ZkStore::open`] (the registry calls create their directory when it is
    /// missing): registering or following producers costs only its own requests.
    pub fn for_producers(
        session: Arc<ZkSession>,
        root: &str,
        topology: &str,
        stream: &str,
    ) -> Result<Self, CoordError> {
        Ok(Self { session, paths: TopologyPaths::new(root, topology, stream)? })
    }

    async fn open_paths(session: Arc<ZkSession>, paths: TopologyPaths) -> Result<Self, CoordError> {
        let store = Self { session, paths };
        store.create_layout().await?;
        Ok(store)
    }

    async fn create_layout(&self) -> Result<(), CoordError> {
        let options = CreateMode::Persistent;
        for dir in self.paths.persistent_dirs() {
            // Usually there already: one cheap check instead of a mkdir per path segment.
            if let Ok(Some(_)) = self.client().check_stat(dir).await {
                continue;
            }
            let op = || async { self.client().mkdir(dir, &options).await };
            op.retry(short_backoff()).when(is_transient).await.map_err(|e| CoordError::zk(dir, "mkdir", e))?;
        }
        // `exists` needs no permission: check now that this session may read the layout, so
        // missing or wrong credentials fail here, naming the path, rather than later.
        // A lost answer (ConnectionLoss) is retried like the mkdirs above: one lost request must
        // not stop a worker's start (the simulator's seed 88 did, six times in a row).
        let tasks = self.paths.tasks();
        let list = || async { self.client().list_children(tasks).await };
        list.retry(short_backoff()).when(is_transient).await.map_err(|e| CoordError::zk(tasks, "list", e))?;
        Ok(())
    }

    /// The client, for one request: every call counts one ZooKeeper request in
    /// [`super::session::zk_counters`] (a `mkdir` counts once whatever its depth).
    pub(crate) fn client(&self) -> &dyn ZkClient {
        super::session::zk_counters().request();
        &*self.session.client
    }

    /// The session this store uses.
    pub fn session(&self) -> &Arc<ZkSession> {
        &self.session
    }

    /// The znode layout of this topology and stream.
    pub fn paths(&self) -> &TopologyPaths {
        &self.paths
    }

    /// The session id, as written into leases and (by convention) checkpoints' `writer`.
    pub fn session_name(&self) -> &str {
        self.session.name()
    }

    /// The session timeout the server granted (it clamps the requested one).
    pub fn session_timeout(&self) -> Duration {
        self.session.timeout()
    }

    /// Observes Connected / Disconnected / Expired. After [`super::SessionStatus::Expired`] the
    /// store is unusable: build a new one.
    pub fn session_state(&self) -> SessionWatch {
        self.session.state()
    }

    /// Drops this reference (the session closes when it was the last one). The close is sent by
    /// the client's background task: another session may still see this one's ephemeral nodes
    /// for a moment. Use [`Self::close_gracefully`] when they must be gone on return.
    pub fn close(self) {
        drop(self);
    }

    /// Closes the session (when this is its last reference) and waits until the server confirmed
    /// it, so ephemeral nodes are gone for everyone before this returns.
    pub async fn close_gracefully(self) {
        self.session.close_gracefully().await;
    }

    /// Runs `op` unless an injected fault says otherwise (see [`super::FaultHook`]).
    async fn guarded<T, E, F>(&self, op: ZkOp, path: &str, f: impl FnOnce() -> F) -> Result<T, E>
    where
        F: std::future::Future<Output = Result<T, E>>,
        E: From<InjectedError>,
    {
        match self.session.fault(op, path) {
            Some(InjectedFault::Before(e)) => Err(InjectedError(e).into()),
            Some(InjectedFault::After(e)) => {
                let _ = f().await;
                Err(InjectedError(e).into())
            }
            None => f().await,
        }
    }

    // ----- tasks -----

    /// Registers a live task: an EPHEMERAL_SEQUENTIAL `tasks/task-N` znode whose data names this
    /// session and `token`, a fresh id of this registration attempt. Returns its node name.
    ///
    /// When this fails with an error whose outcome is unknown (the connection was lost after the
    /// request went out: the server may have created the node), keep `token` and call
    /// [`ZkStore::find_task`] before registering again: a create the server applied and whose
    /// answer was lost is then adopted (or removed), never left as a second, ghost registration
    /// of the session, which the leader would give shards nobody reads (and which, lowest in
    /// sequence, would leave the stream without a leader). Curator's "protected" create.
    pub async fn register_task(&self, info: &TaskInfo, token: &str) -> Result<String, CoordError> {
        let prefix = self.paths.task_prefix();
        let info =
            TaskInfo { session: self.session.name().to_string(), registration: token.to_string(), ..info.clone() };
        let data = encode(&prefix, &info)?;
        let options = CreateMode::EphemeralSequential;
        let (_, seq) = self
            .guarded(ZkOp::Create, &prefix, || self.client().create(&prefix, &data, &options))
            .await
            .map_err(|e| CoordError::zk(&prefix, "create", e))?;
        let name = format!("{TASK_PREFIX}{seq}");
        debug!(task = %name, "registered task");
        Ok(name)
    }

    /// The task node this session created with registration `token`, if there is one (see
    /// [`ZkStore::register_task`]). Syncs first, so a create the server applied is seen even
    /// through a server that lagged behind; then one listing and one read per task node.
    pub async fn find_task(&self, token: &str) -> Result<Option<String>, CoordError> {
        let dir = self.paths.tasks().to_string();
        let session = self.session.name().to_string();
        self.find_registration(&dir, |data| {
            serde_json::from_slice::<TaskInfo>(data).is_ok_and(|i| i.registration == token && i.session == session)
        })
        .await
    }

    /// The first node under `dir` (by sequence) whose data `mine` recognises, after a sync.
    async fn find_registration(&self, dir: &str, mine: impl Fn(&[u8]) -> bool) -> Result<Option<String>, CoordError> {
        self.client().sync(dir).await.map_err(|e| CoordError::zk(dir, "sync", e))?;
        let mut names = match self.client().list_children(dir).await {
            Ok(n) => n,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(e) => return Err(CoordError::zk(dir, "list", e)),
        };
        names.retain(|n| n.starts_with(TASK_PREFIX));
        names.sort_by(|a, b| task_cmp(a, b));
        let reads: Vec<_> = names
            .iter()
            .map(|n| {
                let path = format!("{dir}/{n}");
                let fut = self.client().get_data(&path);
                (n, path, fut)
            })
            .collect();
        let mut found = None;
        for (name, path, fut) in reads {
            match fut.await {
                Ok((data, _)) if found.is_none() && mine(&data) => found = Some(name.clone()),
                Ok(_) | Err(zk::Error::NoNode) => {}
                Err(e) => return Err(CoordError::zk(&path, "get", e)),
            }
        }
        Ok(found)
    }

    /// Removes a task registration (a task of a shared session stops while the session goes on).
    /// Removing one that is gone is fine.
    pub async fn unregister_task(&self, name: &str) -> Result<(), CoordError> {
        validate_name("task name", name)?;
        self.delete_guarded(&self.paths.task(name)).await
    }

    /// Whether task node `name` exists, after a sync (so a delete the server applied is seen even
    /// through a server that lagged behind, as [`ZkStore::find_task`]). Two requests. After an
    /// unregistration whose outcome is unknown, this tells whether the task is still registered.
    pub async fn task_exists(&self, name: &str) -> Result<bool, CoordError> {
        validate_name("task name", name)?;
        let dir = self.paths.tasks();
        self.client().sync(dir).await.map_err(|e| CoordError::zk(dir, "sync", e))?;
        let path = self.paths.task(name);
        let stat = self.client().check_stat(&path).await.map_err(|e| CoordError::zk(&path, "stat", e))?;
        Ok(stat.is_some())
    }

    /// The live task node names, sorted by sequence (the first is the leader). One request.
    pub async fn task_names(&self) -> Result<Vec<String>, CoordError> {
        let dir = self.paths.tasks();
        let mut names: Vec<String> =
            self.client().list_children(dir).await.map_err(|e| CoordError::zk(dir, "list", e))?;
        names.retain(|n| n.starts_with(TASK_PREFIX));
        names.sort_by(|a, b| task_cmp(a, b));
        Ok(names)
    }

    /// Registers a window firer of `component` ([`crate::state::WindowFirer`]): an
    /// EPHEMERAL_SEQUENTIAL `firers/{component}/task-N` znode (its parent created when missing)
    /// whose data names this session and `token`, a fresh id of this registration attempt.
    /// Returns its node name. The live firers share the timer partitions in sequence order.
    /// After an error whose outcome is unknown, call [`ZkStore::find_firer`] with the same token
    /// before registering again (as for [`ZkStore::register_task`]).
    pub async fn register_firer(&self, component: &str, token: &str) -> Result<String, CoordError> {
        validate_name("component name", component)?;
        let dir = self.paths.firers(component);
        if !matches!(self.client().check_stat(&dir).await, Ok(Some(_))) {
            let options = CreateMode::Persistent;
            let op = || async { self.client().mkdir(&dir, &options).await };
            op.retry(short_backoff()).when(is_transient).await.map_err(|e| CoordError::zk(&dir, "mkdir", e))?;
        }
        let prefix = format!("{dir}/{TASK_PREFIX}");
        let data =
            encode(&prefix, &FirerInfo { session: self.session.name().to_string(), registration: token.into() })?;
        let options = CreateMode::EphemeralSequential;
        let (_, seq) = self
            .guarded(ZkOp::Create, &prefix, || self.client().create(&prefix, &data, &options))
            .await
            .map_err(|e| CoordError::zk(&prefix, "create", e))?;
        Ok(format!("{TASK_PREFIX}{seq}"))
    }

    /// The firer node of `component` this session created with registration `token`, if there
    /// is one (see [`ZkStore::register_firer`]).
    pub async fn find_firer(&self, component: &str, token: &str) -> Result<Option<String>, CoordError> {
        validate_name("component name", component)?;
        let dir = self.paths.firers(component);
        let session = self.session.name().to_string();
        self.find_registration(&dir, |data| {
            serde_json::from_slice::<FirerInfo>(data).is_ok_and(|i| i.registration == token && i.session == session)
        })
        .await
    }

    /// Removes a window firer registration of `component` (gone already is fine).
    pub async fn unregister_firer(&self, component: &str, name: &str) -> Result<(), CoordError> {
        validate_name("component name", component)?;
        validate_name("firer name", name)?;
        self.delete_quietly(&format!("{}/{name}", self.paths.firers(component))).await
    }

    /// Whether any window firer of the topology is live (one listing of `firers/`, one per
    /// component): the leader publishes the committed watermark only while one reads it.
    pub async fn any_live_firer(&self) -> Result<bool, CoordError> {
        let dir = format!("{}/firers", self.paths.topology());
        let components = match self.client().list_children(&dir).await {
            Ok(c) => c,
            Err(zk::Error::NoNode) => return Ok(false),
            Err(e) => return Err(CoordError::zk(&dir, "list", e)),
        };
        for c in components {
            if !self.firers(&c).await?.is_empty() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The live window firers of `component`, sorted by sequence (the order their timer
    /// partitions are shared in). One request.
    pub async fn firers(&self, component: &str) -> Result<Vec<String>, CoordError> {
        validate_name("component name", component)?;
        let dir = self.paths.firers(component);
        let mut names: Vec<String> = match self.client().list_children(&dir).await {
            Ok(n) => n,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(CoordError::zk(&dir, "list", e)),
        };
        names.retain(|n| n.starts_with(TASK_PREFIX));
        names.sort_by(|a, b| task_cmp(a, b));
        Ok(names)
    }

    /// Live tasks (node name, info), sorted by sequence (the first is the leader).
    pub async fn live_tasks(&self) -> Result<Vec<(String, TaskInfo)>, CoordError> {
        let names = self.task_names().await?;
        // Requests are sent when the futures are created, so these reads are pipelined.
        let reads: Vec<_> = names
            .iter()
            .map(|n| (n, self.paths.task(n)))
            .map(|(n, p)| {
                let fut = self.client().get_data(&p);
                (n, p, fut)
            })
            .collect();
        let mut out = Vec::with_capacity(reads.len());
        for (name, path, fut) in reads {
            match fut.await {
                Ok((data, _)) => out.push((name.clone(), decode::<TaskInfo>(&path, "task info", &data)?)),
                Err(zk::Error::NoNode) => {} // went away since the listing
                Err(e) => return Err(CoordError::zk(&path, "get", e)),
            }
        }
        Ok(out)
    }

    // ----- drain -----

    /// Writes (or overwrites) the drain notification.
    pub async fn write_drain(&self, req: &DrainRequest) -> Result<(), CoordError> {
        let path = self.paths.drain();
        let data = encode(&path, req)?;
        match self.client().set_data(&path, &data, None).await {
            Ok(_) => Ok(()),
            Err(zk::Error::NoNode) => {
                let options = CreateMode::Persistent;
                self.create_or_set(&path, &data, &options).await
            }
            Err(e) => Err(CoordError::zk(&path, "set", e)),
        }
    }

    /// Reads the drain notification, if any.
    pub async fn read_drain(&self) -> Result<Option<DrainRequest>, CoordError> {
        Ok(self.read_json::<DrainRequest>(&self.paths.drain(), "drain notification").await?.map(|v| v.value))
    }

    /// Deletes this worker's status znode (before it checks whether it was the last one).
    pub async fn remove_worker(&self, worker_id: &str) -> Result<(), CoordError> {
        let path = self.paths.worker(worker_id);
        self.delete_quietly(&path).await
    }

    // ----- workers -----

    /// Publishes this worker's status in an EPHEMERAL `workers/{worker_id}` znode (created on
    /// the first call, overwritten after).
    pub async fn publish_worker(&self, status: &WorkerStatus) -> Result<(), CoordError> {
        validate_name("worker id", &status.worker_id)?;
        let path = self.paths.worker(&status.worker_id);
        let data = encode(&path, status)?;
        match self.client().set_data(&path, &data, None).await {
            Ok(_) => Ok(()),
            Err(zk::Error::NoNode) => {
                let options = CreateMode::Ephemeral;
                match self.client().create(&path, &data, &options).await {
                    Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
                    Err(e) => Err(CoordError::zk(&path, "create", e)),
                }
            }
            Err(e) => Err(CoordError::zk(&path, "set", e)),
        }
    }

    // ----- stage producers -----

    /// Registers a task writing into the intermediate stream `stream`: an EPHEMERAL znode
    /// `stages/{stream}/producers/{producer:016x}-{deployment}` (everything a consumer needs is
    /// in the name, so one listing reads the registry). Registering twice is fine.
    pub async fn register_producer(&self, stream: &str, producer: u64, deployment: &str) -> Result<(), CoordError> {
        validate_name("stream name", stream)?;
        validate_name("deployment id", deployment)?;
        let dir = self.paths.producers(stream);
        let path = format!("{dir}/{producer:016x}-{deployment}");
        let options = CreateMode::Ephemeral;
        match self.client().create(&path, &[], &options).await {
            Ok(_) | Err(zk::Error::NodeExists) => return Ok(()),
            Err(zk::Error::NoNode) => {}
            Err(e) => return Err(CoordError::zk(&path, "create", e)),
        }
        let dir_options = CreateMode::Persistent;
        self.client().mkdir(&dir, &dir_options).await.map_err(|e| CoordError::zk(&dir, "mkdir", e))?;
        match self.client().create(&path, &[], &options).await {
            Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
            Err(e) => Err(CoordError::zk(&path, "create", e)),
        }
    }

    /// Removes a producer registration (gone already is fine).
    pub async fn unregister_producer(&self, stream: &str, producer: u64, deployment: &str) -> Result<(), CoordError> {
        validate_name("stream name", stream)?;
        validate_name("deployment id", deployment)?;
        self.delete_quietly(&format!("{}/{producer:016x}-{deployment}", self.paths.producers(stream))).await
    }

    /// The live producers of `stream` (producer id -> deployment id), and a one-shot watch on
    /// the registry's children (fires when a producer comes or goes, or the directory appears).
    pub async fn watch_producers(&self, stream: &str) -> Result<(BTreeMap<u64, String>, OneshotWatch), CoordError> {
        let dir = self.paths.producers(stream);
        match self.client().list_and_watch_children(&dir).await {
            Ok((names, watcher)) => Ok((parse_producers(&names), watcher)),
            Err(zk::Error::NoNode) => {
                let (_, watcher) =
                    self.client().check_and_watch_stat(&dir).await.map_err(|e| CoordError::zk(&dir, "watch", e))?;
                // created meanwhile: list it (the watch fires too)
                Ok((BTreeMap::new(), watcher))
            }
            Err(e) => Err(CoordError::zk(&dir, "list", e)),
        }
    }

    /// The live producers of `stream` (producer id -> deployment id), read once without a watch
    /// (for operators); none when the registry does not exist yet.
    pub async fn producers(&self, stream: &str) -> Result<BTreeMap<u64, String>, CoordError> {
        validate_name("stream name", stream)?;
        let dir = self.paths.producers(stream);
        match self.client().list_children(&dir).await {
            Ok(names) => Ok(parse_producers(&names)),
            Err(zk::Error::NoNode) => Ok(BTreeMap::new()),
            Err(e) => Err(CoordError::zk(&dir, "list", e)),
        }
    }

    /// Every live worker's status, sorted by worker id.
    pub async fn workers(&self) -> Result<Vec<WorkerStatus>, CoordError> {
        let dir = self.paths.workers();
        let mut names = match self.client().list_children(dir).await {
            Ok(n) => n,
            Err(zk::Error::NoNode) => return Ok(Vec::new()),
            Err(e) => return Err(CoordError::zk(dir, "list", e)),
        };
        names.sort();
        let mut out = Vec::new();
        for n in names {
            let path = self.paths.worker(&n);
            if let Some(v) = self.read_json::<WorkerStatus>(&path, "worker status").await? {
                out.push(v.value);
            }
        }
        Ok(out)
    }

    /// Whether any worker is registered (one listing; [`ZkStore::workers`] reads every status).
    pub async fn any_worker(&self) -> Result<bool, CoordError> {
        let dir = self.paths.workers();
        match self.client().list_children(dir).await {
            Ok(n) => Ok(!n.is_empty()),
            Err(zk::Error::NoNode) => Ok(false),
            Err(e) => Err(CoordError::zk(dir, "list", e)),
        }
    }

    /// The current owner of every leased shard: shard id -> the lowest lease (path and holder:
    /// the task named in the lease node, or the lease's writer session for old-style leases).
    pub async fn shard_owners(&self) -> Result<BTreeMap<String, LeaseOwner>, CoordError> {
        let dir = self.paths.owners();
        let shards = match self.client().list_children(dir).await {
            Ok(n) => n,
            Err(zk::Error::NoNode) => return Ok(BTreeMap::new()),
            Err(e) => return Err(CoordError::zk(dir, "list", e)),
        };
        // Pipelined: every listing is sent before the first answer is awaited.
        let lists: Vec<_> = shards
            .into_iter()
            .map(|shard| {
                let sdir = self.paths.owner_dir(&shard);
                let fut = self.client().list_children(&sdir);
                (shard, sdir, fut)
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|(shard, sdir, fut)| async move { (shard, sdir.clone(), fut.await) })
            .collect();
        let mut out = BTreeMap::new();
        for fut in lists {
            let (shard, sdir, res) = fut.await;
            let mut leases = match res {
                Ok(n) => n,
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(CoordError::zk(&sdir, "list", e)),
            };
            leases.retain(|n| n.starts_with(LEASE_PREFIX) && sequence_of(n).is_some());
            leases.sort_by_key(|n| sequence_of(n));
            for lease in leases {
                let path = format!("{sdir}/{lease}");
                let holder = match lease_holder(&lease) {
                    Some(h) => Some(h.to_string()),
                    None => match self.read_json::<LeaseInfo>(&path, "lease").await {
                        Ok(Some(v)) => Some(v.value.task.unwrap_or(v.value.writer)),
                        Ok(None) => None,
                        Err(e @ CoordError::Malformed { .. }) => Some(format!("unknown ({e})")),
                        Err(e) => return Err(e),
                    },
                };
                if let Some(holder) = holder {
                    out.insert(shard.clone(), LeaseOwner { path, holder });
                    break;
                }
            }
        }
        Ok(out)
    }

    // ----- committed watermarks -----

    /// Publishes the committed watermark report of spout task `task` (its task node name) in the
    /// EPHEMERAL znode `streams/{stream}/watermarks/{task}`, owned by this store's session: one
    /// `setData` once it exists; the first report creates it (and the `watermarks` directory when
    /// missing).
    pub async fn publish_watermark(&self, task: &str, report: &WatermarkReport) -> Result<(), CoordError> {
        validate_name("task name", task)?;
        let path = self.paths.watermark(task);
        let data = encode(&path, report)?;
        match self.client().set_data(&path, &data, None).await {
            Ok(_) => return Ok(()),
            Err(zk::Error::NoNode) => {}
            Err(e) => return Err(CoordError::zk(&path, "set", e)),
        }
        let options = CreateMode::Ephemeral;
        match self.client().create(&path, &data, &options).await {
            Ok(_) => return Ok(()),
            // Created meanwhile (a lost answer to our own create): overwrite it.
            Err(zk::Error::NodeExists) => {
                return self
                    .client()
                    .set_data(&path, &data, None)
                    .await
                    .map(|_| ())
                    .map_err(|e| CoordError::zk(&path, "set", e));
            }
            Err(zk::Error::NoNode) => {}
            Err(e) => return Err(CoordError::zk(&path, "create", e)),
        }
        let dir = self.paths.watermarks_dir();
        let dir_options = CreateMode::Persistent;
        match self.client().create(dir, &[], &dir_options).await {
            Ok(_) | Err(zk::Error::NodeExists) => {}
            Err(e) => return Err(CoordError::zk(dir, "create", e)),
        }
        self.create_or_set(&path, &data, &options).await
    }

    /// Creates `path` with `data`, or sets its data when it exists already.
    async fn create_or_set(&self, path: &str, data: &[u8], options: &CreateMode) -> Result<(), CoordError> {
        match self.client().create(path, data, options).await {
            Ok(_) => Ok(()),
            Err(zk::Error::NodeExists) => {
                self.client().set_data(path, data, None).await.map(|_| ()).map_err(|e| CoordError::zk(path, "set", e))
            }
            Err(e) => Err(CoordError::zk(path, "create", e)),
        }
    }

    /// Removes the committed watermark report of `task` (gone already is fine). One request.
    pub async fn remove_watermark(&self, task: &str) -> Result<(), CoordError> {
        validate_name("task name", task)?;
        self.delete_quietly(&self.paths.watermark(task)).await
    }

    /// Whether `stream` is an intermediate stream between two stages of topology `topology` (its
    /// producer registry `{root}/topologies/{topology}/stages/{stream}` exists), or, with
    /// `stream` `None`, whether the topology has any stage boundary at all.
    pub async fn stage_stream_exists(&self, topology: &str, stream: Option<&str>) -> Result<bool, CoordError> {
        validate_name("topology name", topology)?;
        let dir = format!("{}/topologies/{topology}/stages", self.paths.root());
        match stream {
            Some(s) => {
                validate_name("stream name", s)?;
                let path = format!("{dir}/{s}");
                match self.client().check_stat(&path).await {
                    Ok(found) => Ok(found.is_some()),
                    Err(e) => Err(CoordError::zk(&path, "exists", e)),
                }
            }
            None => match self.client().list_children(&dir).await {
                Ok(children) => Ok(!children.is_empty()),
                Err(zk::Error::NoNode) => Ok(false),
                Err(e) => Err(CoordError::zk(&dir, "list", e)),
            },
        }
    }

    /// The stream's committed watermark: Ok(Ok(ms)) when the current assignment (no error set) has a report
    /// of its own generation with Some(watermark) from every task it lists (tasks with no shards included),
    /// the minimum of those; Ok(Err(reason)) naming what is missing (which task, which generation) otherwise.
    ///
    /// Every record of the stream with an arrival time below it has been acked (see
    /// [`crate::coord::committed_watermark`], which decides from what is read here). Reports of
    /// another generation than the assignment's are not used. It may move back after a handoff
    /// (the new owner reads again, from the checkpoint, records acked already); a value once
    /// returned stays true, so a reader may keep the highest it saw. Cost: one assignment read, one
    /// `getChildren` of `watermarks/`, and one `getData` per task the assignment lists that has a
    /// report (pipelined); no watch, no write.
    pub async fn committed_watermark(&self) -> Result<Result<i64, String>, CoordError> {
        Ok(self.read_committed_watermark(false).await?.unwrap_or_else(|| Err("no report".into())))
    }

    /// The committed watermark as the leader last published it (`streams/{stream}/committed`):
    /// one request, whatever the number of tasks; what a window firer reads. Computed here
    /// ([`ZkStore::committed_watermark`]) while none is published yet (a leader of an earlier
    /// version, or before the leader's first publication).
    pub async fn published_watermark(&self) -> Result<Result<i64, String>, CoordError> {
        match self.read_json::<PublishedWatermark>(&self.paths.committed(), "published committed watermark").await? {
            Some(p) => Ok(match (p.value.watermark_ms, p.value.why) {
                (Some(w), _) => Ok(w),
                (None, why) => Err(why.unwrap_or_else(|| "no committed watermark".into())),
            }),
            None => self.committed_watermark().await,
        }
    }

    /// The leader publishes the committed watermark it computed (`streams/{stream}/committed`,
    /// unversioned: only the leader writes it; a deposed leader's late write is still a true,
    /// older reading).
    pub async fn publish_committed(&self, p: &PublishedWatermark) -> Result<(), CoordError> {
        let path = self.paths.committed();
        let data = encode(&path, p)?;
        match self.client().set_data(&path, &data, None).await {
            Ok(_) => Ok(()),
            Err(zk::Error::NoNode) => {
                let options = CreateMode::Persistent;
                match self.client().create(&path, &data, &options).await {
                    Ok(_) => Ok(()),
                    Err(zk::Error::NodeExists) => self
                        .client()
                        .set_data(&path, &data, None)
                        .await
                        .map(|_| ())
                        .map_err(|e| CoordError::zk(&path, "set", e)),
                    Err(e) => Err(CoordError::zk(&path, "create", e)),
                }
            }
            Err(e) => Err(CoordError::zk(&path, "set", e)),
        }
    }

    /// [`ZkStore::committed_watermark`], or `None` when no spout task of the stream publishes a
    /// report (the feature is off: `squall status` then shows nothing). Same cost.
    pub async fn published_committed_watermark(&self) -> Result<Option<Result<i64, String>>, CoordError> {
        self.read_committed_watermark(true).await
    }

    /// The committed watermark; `None` only with `none_unpublished` when no report exists.
    async fn read_committed_watermark(
        &self,
        none_unpublished: bool,
    ) -> Result<Option<Result<i64, String>>, CoordError> {
        let stream = self.paths.stream_name();
        let dir = self.paths.watermarks_dir();
        let published: BTreeSet<String> = match self.client().list_children(dir).await {
            Ok(names) => names.into_iter().collect(),
            Err(zk::Error::NoNode) => BTreeSet::new(),
            Err(e) => return Err(CoordError::zk(dir, "list", e)),
        };
        if none_unpublished && published.is_empty() {
            return Ok(None);
        }
        let Some(assignment) = self.read_assignment().await? else {
            return Ok(Some(Err(format!("stream {stream}: no assignment yet"))));
        };
        let assignment = assignment.value;
        // Requests are sent when the futures are created, so these reads are pipelined.
        let reads: Vec<_> = assignment
            .tasks
            .keys()
            .filter(|t| published.contains(*t))
            .map(|t| {
                let path = self.paths.watermark(t);
                let fut = self.client().get_data(&path);
                (t, path, fut)
            })
            .collect();
        let mut reports = BTreeMap::new();
        for (task, path, fut) in reads {
            match fut.await {
                Ok((data, _)) => {
                    reports.insert(task.clone(), decode::<WatermarkReport>(&path, "watermark report", &data)?);
                }
                Err(zk::Error::NoNode) => {} // went away since the listing
                Err(e) => return Err(CoordError::zk(&path, "get", e)),
            }
        }
        Ok(Some(committed_watermark(&assignment, &reports).map_err(|why| format!("stream {stream}: {why}"))))
    }

    // ----- topology state -----

    /// Reads the lifecycle state, if ever written.
    pub async fn read_state(&self) -> Result<Option<Versioned<TopologyState>>, CoordError> {
        self.read_json(self.paths.state(), "topology state").await
    }

    /// Writes the lifecycle state; `expected_version: None` means it must not exist yet.
    pub async fn write_state(&self, state: &TopologyState, expected_version: Option<i32>) -> Result<i32, CoordError> {
        let path = self.paths.state().to_string();
        let data = encode(&path, state)?;
        self.cas_write(&path, &data, expected_version).await
    }

    // ----- shard list -----

    /// Reads the shard list, if the leader wrote one yet.
    pub async fn read_shard_list(&self) -> Result<Option<Versioned<ShardList>>, CoordError> {
        self.read_json(self.paths.shards(), "shard list").await
    }

    /// Writes the shard list (compare-and-set). `expected_version: None` means it must not exist
    /// yet. A lost race returns [`CoordError::VersionConflict`]; lists over
    /// [`MAX_SHARD_LIST_BYTES`] are refused with [`CoordError::TooLarge`].
    pub async fn write_shard_list(&self, list: &ShardList, expected_version: Option<i32>) -> Result<i32, CoordError> {
        let path = self.paths.shards().to_string();
        let mut sorted = list.clone();
        sorted.shards.sort_by(|a, b| a.shard_id.cmp(&b.shard_id));
        let data = encode(&path, &sorted)?;
        if data.len() > MAX_SHARD_LIST_BYTES {
            return Err(CoordError::TooLarge { path, bytes: data.len(), limit: MAX_SHARD_LIST_BYTES });
        }
        self.cas_write(&path, &data, expected_version).await
    }

    // ----- assignment -----

    /// Reads the assignment, if a leader wrote one.
    pub async fn read_assignment(&self) -> Result<Option<Versioned<Assignment>>, CoordError> {
        self.read_json(self.paths.assignment(), "assignment").await
    }

    /// Writes the assignment as leader `leader_task`: ONE transaction that checks the leader's
    /// task node still exists and compare-and-sets the assignment (`expected_version: None`: it
    /// must not exist). A leader whose session expired or that unregistered writes nothing
    /// ([`CoordError::Fenced`]); a lost race is [`CoordError::VersionConflict`].
    pub async fn write_assignment(
        &self,
        leader_task: &str,
        assignment: &Assignment,
        expected_version: Option<i32>,
    ) -> Result<i32, CoordError> {
        validate_name("task name", leader_task)?;
        let path = self.paths.assignment().to_string();
        let task_path = self.paths.task(leader_task);
        let data = encode(&path, assignment)?;
        if data.len() > MAX_SHARD_LIST_BYTES {
            return Err(CoordError::TooLarge { path, bytes: data.len(), limit: MAX_SHARD_LIST_BYTES });
        }
        let options = CreateMode::Persistent;
        let mut txn = self.client().new_multi_writer();
        txn.add_check_version(&task_path, 0).map_err(|e| CoordError::zk(&task_path, "check", e))?;
        match expected_version {
            None => txn.add_create(&path, &data, &options),
            Some(v) => txn.add_set_data(&path, &data, Some(v)),
        }
        .map_err(|e| CoordError::zk(&path, "assign", e))?;
        match txn.commit().await {
            Ok(results) => match results.into_iter().nth(1) {
                Some(zk::MultiWriteResult::SetData { stat }) => Ok(stat.version),
                Some(zk::MultiWriteResult::Create { stat, .. }) => Ok(stat.version),
                other => Err(CoordError::Zk {
                    path,
                    op: "multi",
                    source: zk::Error::UnexpectedError(format!("unexpected transaction result {other:?}")),
                }),
            },
            Err(zk::MultiWriteError::OperationFailed {
                index: 0,
                source: zk::Error::NoNode | zk::Error::BadVersion,
            }) => Err(CoordError::Fenced { shard_id: "(assignment)".into(), lease_path: task_path }),
            Err(zk::MultiWriteError::OperationFailed {
                index: 1,
                source: zk::Error::BadVersion | zk::Error::NoNode | zk::Error::NodeExists,
            }) => Err(CoordError::VersionConflict { path, expected: expected_version }),
            Err(
                zk::MultiWriteError::OperationFailed { source, .. } | zk::MultiWriteError::RequestFailed { source },
            ) => Err(CoordError::zk(&path, "multi", source)),
        }
    }

    /// Replaces the assignment with `request` (no task named), so that the leader computes the
    /// next one from scratch once the tasks are back: what `squall rebalance` does once no shard
    /// is leased. Compare-and-set against the stored version (an unreadable assignment is
    /// overwritten too); retried when a leader wrote in between. Returns the generation written.
    pub async fn request_rebalance(&self, request: &RebalanceRequest) -> Result<u64, CoordError> {
        let path = self.paths.assignment().to_string();
        let mut attempts = 0;
        loop {
            let (generation, version) = match self.read_assignment().await {
                Ok(Some(a)) => (a.value.generation, Some(a.version)),
                Ok(None) => (0, None),
                Err(CoordError::Malformed { .. }) => (
                    0,
                    self.client()
                        .check_stat(&path)
                        .await
                        .map_err(|e| CoordError::zk(&path, "stat", e))?
                        .map(|s| s.version),
                ),
                Err(e) => return Err(e),
            };
            let next = Assignment {
                generation: generation + 1,
                leader: "squall rebalance".into(),
                updated_at_ms: now_ms(),
                rebalance: Some(request.clone()),
                ..Assignment::default()
            };
            match self.cas_write(&path, &encode(&path, &next)?, version).await {
                Ok(_) => return Ok(next.generation),
                Err(CoordError::VersionConflict { .. }) if attempts < 5 => attempts += 1,
                Err(e) => return Err(e),
            }
        }
    }

    // ----- finished markers -----

    /// The shards with a `finished/{shard}` marker. One request.
    pub async fn list_finished(&self) -> Result<BTreeSet<String>, CoordError> {
        let dir = self.paths.finished_dir();
        match self.client().list_children(dir).await {
            Ok(v) => Ok(v.into_iter().collect()),
            Err(zk::Error::NoNode) => Ok(BTreeSet::new()),
            Err(e) => Err(CoordError::zk(dir, "list", e)),
        }
    }

    /// Creates a `finished/{shard}` marker (idempotent). Only needed to repair data written by
    /// older versions; [`ZkStore::write_checkpoint`] creates it with the finished checkpoint.
    pub async fn mark_finished(&self, shard_id: &str) -> Result<(), CoordError> {
        validate_name("shard id", shard_id)?;
        let path = self.paths.finished(shard_id);
        let options = CreateMode::Persistent;
        match self.client().create(&path, &[], &options).await {
            Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
            Err(e) => Err(CoordError::zk(&path, "create", e)),
        }
    }

    /// Garbage collection of a shard that finished and left the stream: deletes its checkpoint
    /// and its finished marker, in that order, so that a partial run leaves a state the next run
    /// completes. Its `owners/{shard}` directory is kept, empty, so that its lease tokens never
    /// restart. A lease still under `owners/{shard}` (it should not be there) stops the
    /// collection of that shard.
    pub async fn forget_shard(&self, shard_id: &str) -> Result<(), CoordError> {
        validate_name("shard id", shard_id)?;
        // `owners/{shard}` stays (empty): its sequential counter is the shard's lease token, which
        // exactly-once fencing relies on never going back; a shard that came back would start
        // again at 0 under a re-created directory. Only no lease may be held.
        let dir = self.paths.owner_dir(shard_id);
        match self.client().list_children(&dir).await {
            Ok(leases) if leases.iter().any(|l| l.starts_with(LEASE_PREFIX)) => {
                return Err(CoordError::LeasesHeld { shards: vec![shard_id.to_string()] });
            }
            Ok(_) | Err(zk::Error::NoNode) => {}
            Err(e) => return Err(CoordError::zk(&dir, "list", e)),
        }
        self.delete_quietly(&self.paths.checkpoint(shard_id)).await?;
        self.delete_quietly(&self.paths.finished(shard_id)).await
    }

    // ----- checkpoints -----

    /// The shard ids with a checkpoint znode. One request.
    pub async fn checkpoint_ids(&self) -> Result<BTreeSet<String>, CoordError> {
        let dir = self.paths.checkpoints();
        let names = self.client().list_children(dir).await.map_err(|e| CoordError::zk(dir, "list", e))?;
        Ok(names.into_iter().collect())
    }

    /// Every checkpoint of the stream, by shard id; fails as a whole on the first malformed one.
    /// Coordination never calls it (see [`ZkStore::scan_checkpoints`]); tools and tests do.
    pub async fn read_checkpoints(&self) -> Result<BTreeMap<String, Versioned<Checkpoint>>, CoordError> {
        let mut out = BTreeMap::new();
        for (shard, r) in self.scan_checkpoints().await? {
            out.insert(shard, r?);
        }
        Ok(out)
    }

    /// Every checkpoint of the stream, each with its own result: a malformed checkpoint is an
    /// error for its shard only. Pipelined reads (N + 1 requests).
    pub async fn scan_checkpoints(
        &self,
    ) -> Result<BTreeMap<String, Result<Versioned<Checkpoint>, CoordError>>, CoordError> {
        let names = self.checkpoint_ids().await?;
        let reads: Vec<_> = names
            .into_iter()
            .map(|n| {
                let path = self.paths.checkpoint(&n);
                let fut = self.client().get_data(&path);
                (n, path, fut)
            })
            .collect();
        let mut out = BTreeMap::new();
        for (shard, path, fut) in reads {
            match fut.await {
                Ok((data, stat)) => {
                    let value = decode::<Checkpoint>(&path, "checkpoint", &data)
                        .map(|value| Versioned { value, version: stat.version });
                    out.insert(shard, value);
                }
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(CoordError::zk(&path, "get", e)),
            }
        }
        Ok(out)
    }

    /// One shard's checkpoint, if any.
    pub async fn read_checkpoint(&self, shard_id: &str) -> Result<Option<Versioned<Checkpoint>>, CoordError> {
        validate_name("shard id", shard_id)?;
        let path = self.paths.checkpoint(shard_id);
        match self.guarded(ZkOp::GetData, &path, || self.client().get_data(&path)).await {
            Ok((data, stat)) => {
                Ok(Some(Versioned { value: decode(&path, "checkpoint", &data)?, version: stat.version }))
            }
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(CoordError::zk(&path, "get", e)),
        }
    }

    /// A one-shot watch that fires when the shard's checkpoint znode changes or goes (e.g. an
    /// operator repaired a malformed one). One request.
    pub async fn watch_checkpoint(&self, shard_id: &str) -> Result<OneshotWatch, CoordError> {
        validate_name("shard id", shard_id)?;
        let path = self.paths.checkpoint(shard_id);
        let (_, watcher) =
            self.client().check_and_watch_stat(&path).await.map_err(|e| CoordError::zk(&path, "watch", e))?;
        Ok(watcher)
    }

    /// Persists the starting decision for a shard once: creates the checkpoint if absent, and
    /// otherwise returns the one already stored (the first decision wins). Also creates the
    /// shard's `owners/` directory, so taking a lease needs no extra request.
    pub async fn init_checkpoint(&self, shard_id: &str, cp: &Checkpoint) -> Result<Versioned<Checkpoint>, CoordError> {
        validate_name("shard id", shard_id)?;
        cp.validate(shard_id)?;
        let path = self.paths.checkpoint(shard_id);
        let data = encode(&path, cp)?;
        let options = CreateMode::Persistent;
        let dir = self.paths.owner_dir(shard_id);
        match self.client().create(&dir, &[], &options).await {
            Ok(_) | Err(zk::Error::NodeExists) => {}
            Err(e) => return Err(CoordError::zk(&dir, "create", e)),
        }
        match self.guarded(ZkOp::Create, &path, || self.client().create(&path, &data, &options)).await {
            Ok((stat, _)) => Ok(Versioned { value: cp.clone(), version: stat.version }),
            Err(zk::Error::NodeExists) => match self.read_json(&path, "checkpoint").await? {
                Some(existing) => Ok(existing),
                // Deleted right after we saw it: a reset in progress. Let the caller retry.
                None => Err(CoordError::VersionConflict { path, expected: Some(0) }),
            },
            Err(e) => Err(CoordError::zk(&path, "create", e)),
        }
    }

    /// The first start in progress on the stream, if one is ([`FirstStart`]). One request.
    pub async fn first_start(&self) -> Result<Option<FirstStart>, CoordError> {
        Ok(self.read_json::<FirstStart>(&self.paths.first_start(), "first start").await?.map(|v| v.value))
    }

    /// Records that the topology's first start on the stream begins, with `start`, unless one is
    /// recorded already (a leader that began it and lost its session or crashed): returns the one
    /// in force.
    pub async fn begin_first_start(&self, start: &FirstStart) -> Result<FirstStart, CoordError> {
        let path = self.paths.first_start();
        let data = encode(&path, start)?;
        let options = CreateMode::Persistent;
        match self.client().create(&path, &data, &options).await {
            Ok(_) => Ok(start.clone()),
            Err(zk::Error::NodeExists) => Ok(self.first_start().await?.unwrap_or_else(|| start.clone())),
            Err(e) => Err(CoordError::zk(&path, "create", e)),
        }
    }

    /// The first start is complete (the shard list is written): removes its record.
    pub async fn end_first_start(&self) -> Result<(), CoordError> {
        self.delete_quietly(&self.paths.first_start()).await
    }

    /// Fenced checkpoint write: ONE transaction of `check_version(lease.path, 0)` and
    /// `set_data(checkpoint, current.version)`; a finished checkpoint also creates the shard's
    /// `finished/` marker in the same transaction. No read first: `current` is what the writer
    /// last read or wrote, and the version check proves it is still what is stored.
    ///
    /// * [`CoordError::Fenced`] when the lease znode is gone (session expired, lease released):
    ///   a zombie never overwrites the new owner's checkpoint.
    /// * [`CoordError::VersionConflict`] when the checkpoint is not at `current.version`.
    /// * [`CoordError::CheckpointBackwards`] (nothing written) when it would move back from
    ///   `current`.
    pub async fn write_checkpoint(
        &self,
        lease: &Lease,
        cp: &Checkpoint,
        current: &Versioned<Checkpoint>,
    ) -> Result<i32, CoordError> {
        let shard_id = lease.shard_id.as_str();
        validate_name("shard id", shard_id)?;
        cp.validate(shard_id)?;
        let path = self.paths.checkpoint(shard_id);
        if !lease.path.starts_with(&self.paths.lease_prefix(shard_id)) {
            return Err(CoordError::Fenced { shard_id: shard_id.to_string(), lease_path: lease.path.clone() });
        }
        if cp.moves_back_from(&current.value) {
            return Err(CoordError::CheckpointBackwards {
                shard_id: shard_id.to_string(),
                path,
                current: describe(&current.value),
                proposed: describe(cp),
            });
        }
        let mark = cp.finished && !current.value.finished;
        match self.commit_checkpoint(lease, &path, cp, current.version, mark).await {
            // The marker is there already (a repair, or data from an older version): fine.
            Err(CoordError::Zk { source: zk::Error::NodeExists, .. }) if mark => {
                self.commit_checkpoint(lease, &path, cp, current.version, false).await
            }
            Err(conflict @ CoordError::VersionConflict { .. }) => {
                self.after_own_lost_write(lease, &path, cp, current, mark).await.unwrap_or(Err(conflict))
            }
            other => other,
        }
    }

    /// A version conflict on a checkpoint we hold the lease of. If the version in the way is this
    /// writer's own (an earlier write of ours took effect but its answer was lost to a connection
    /// loss, so the caller never learnt its version: a flapping link does this), write again on
    /// top of it, still fenced by the lease in the same transaction. None when the version in
    /// the way is someone else's, finished, or ahead of `cp`: the conflict stands.
    async fn after_own_lost_write(
        &self,
        lease: &Lease,
        path: &str,
        cp: &Checkpoint,
        current: &Versioned<Checkpoint>,
        mark: bool,
    ) -> Option<Result<i32, CoordError>> {
        let stored = self.read_checkpoint(&lease.shard_id).await.ok()??;
        let ours = cp.writer.is_some() && stored.value.writer == cp.writer;
        if !ours || stored.version <= current.version || stored.value.finished || cp.moves_back_from(&stored.value) {
            return None;
        }
        debug!(shard = %lease.shard_id, version = stored.version, "checkpoint: our own earlier write took effect (its answer was lost); writing on top of it");
        let mark = mark && !stored.value.finished;
        Some(self.commit_checkpoint(lease, path, cp, stored.version, mark).await)
    }

    async fn commit_checkpoint(
        &self,
        lease: &Lease,
        path: &str,
        cp: &Checkpoint,
        expected_version: i32,
        mark: bool,
    ) -> Result<i32, CoordError> {
        let shard_id = lease.shard_id.as_str();
        let data = encode(path, cp)?;
        let marker = self.paths.finished(shard_id);
        let options = CreateMode::Persistent;
        let mut txn = self.client().new_multi_writer();
        txn.add_check_version(&lease.path, 0).map_err(|e| CoordError::zk(&lease.path, "check", e))?;
        txn.add_set_data(path, &data, Some(expected_version)).map_err(|e| CoordError::zk(path, "set", e))?;
        if mark {
            txn.add_create(&marker, &[], &options).map_err(|e| CoordError::zk(&marker, "create", e))?;
        }
        match self.guarded(ZkOp::Multi, path, || txn.commit()).await {
            Ok(results) => match results.into_iter().nth(1) {
                Some(zk::MultiWriteResult::SetData { stat }) => Ok(stat.version),
                other => Err(CoordError::Zk {
                    path: path.to_string(),
                    op: "multi",
                    source: zk::Error::UnexpectedError(format!("unexpected transaction result {other:?}")),
                }),
            },
            Err(zk::MultiWriteError::OperationFailed {
                index: 0,
                source: zk::Error::NoNode | zk::Error::BadVersion,
            }) => {
                warn!(shard = shard_id, lease = %lease.path, "checkpoint write fenced: lease is gone");
                Err(CoordError::Fenced { shard_id: shard_id.to_string(), lease_path: lease.path.clone() })
            }
            Err(zk::MultiWriteError::OperationFailed { index: 1, source: zk::Error::BadVersion }) => {
                Err(CoordError::VersionConflict { path: path.to_string(), expected: Some(expected_version) })
            }
            Err(zk::MultiWriteError::OperationFailed { index: 1, source: zk::Error::NoNode }) => {
                Err(CoordError::NoCheckpoint { shard_id: shard_id.to_string(), path: path.to_string() })
            }
            Err(zk::MultiWriteError::OperationFailed { index, source }) => {
                let failed = match index {
                    0 => lease.path.clone(),
                    1 => path.to_string(),
                    _ => marker,
                };
                Err(CoordError::zk(&failed, "multi", source))
            }
            Err(zk::MultiWriteError::RequestFailed { source }) => Err(CoordError::zk(path, "multi", source)),
        }
    }

    /// Rewinds every checkpoint of the stream (every checkpoint znode and every shard in the
    /// shard list) to `position`, unfinished, in one transaction that also removes their finished
    /// markers and forgets the stream's recorded creation time (so a stream re-created under the
    /// same name is accepted). Refused with [`CoordError::LeasesHeld`] while any task holds a
    /// lease: the store takes a lease on every shard itself first, so no task can start reading
    /// mid-reset. Returns the number written.
    pub async fn reset_checkpoints(&self, position: &CheckpointPosition) -> Result<usize, CoordError> {
        let holder = format!("cli-{}", self.session.name());
        let cp = Checkpoint {
            position: position.clone(),
            finished: false,
            updated_at_ms: now_ms(),
            writer: Some(format!("reset by {}", self.session.name())),
        };
        let mut shards: BTreeSet<String> = self.checkpoint_ids().await?;
        let list = self.read_shard_list().await?;
        if let Some(list) = &list {
            shards.extend(list.value.shards.iter().map(|s| s.shard_id.clone()));
        }
        for s in &shards {
            cp.validate(s)?;
        }
        let mut leases = Vec::new();
        let mut held = Vec::new();
        for shard in &shards {
            match self.try_acquire(shard, &holder).await {
                Ok(Acquire::Acquired(lease)) => leases.push(lease),
                Ok(Acquire::HeldBy { shard_id, .. }) => held.push(shard_id),
                Err(e) => {
                    self.release_all(leases).await;
                    let _ = self.cleanup_leases(shard, &holder).await;
                    return Err(e);
                }
            }
        }
        if !held.is_empty() {
            self.release_all(leases).await;
            return Err(CoordError::LeasesHeld { shards: held });
        }
        let result = self.write_reset(&shards, &leases, &cp, list).await;
        self.release_all(leases).await;
        result.map(|()| shards.len())
    }

    async fn write_reset(
        &self,
        shards: &BTreeSet<String>,
        leases: &[Lease],
        cp: &Checkpoint,
        list: Option<Versioned<ShardList>>,
    ) -> Result<(), CoordError> {
        let dir = self.paths.checkpoints().to_string();
        let existing = self.checkpoint_ids().await?;
        let finished = self.list_finished().await?;
        let data = encode(&dir, cp)?;
        let options = CreateMode::Persistent;
        let mut txn = self.client().new_multi_writer();
        for lease in leases {
            txn.add_check_version(&lease.path, 0).map_err(|e| CoordError::zk(&lease.path, "check", e))?;
        }
        for shard in shards {
            let path = self.paths.checkpoint(shard);
            if existing.contains(shard) {
                txn.add_set_data(&path, &data, None)
            } else {
                txn.add_create(&path, &data, &options)
            }
            .map_err(|e| CoordError::zk(&path, "reset", e))?;
            if finished.contains(shard) {
                let marker = self.paths.finished(shard);
                txn.add_delete(&marker, None).map_err(|e| CoordError::zk(&marker, "reset", e))?;
            }
        }
        if let Some(list) = list.filter(|l| l.value.stream_created_ms.is_some()) {
            let path = self.paths.shards().to_string();
            let value = ShardList { stream_created_ms: None, ..list.value };
            let bytes = encode(&path, &value)?;
            txn.add_set_data(&path, &bytes, Some(list.version)).map_err(|e| CoordError::zk(&path, "reset", e))?;
        }
        txn.commit().await.map(|_| ()).map_err(|e| match e {
            zk::MultiWriteError::OperationFailed {
                source: zk::Error::NodeExists | zk::Error::NoNode | zk::Error::BadVersion,
                ..
            } => CoordError::VersionConflict { path: dir.clone(), expected: None },
            zk::MultiWriteError::OperationFailed { source, .. } | zk::MultiWriteError::RequestFailed { source } => {
                CoordError::zk(&dir, "reset", source)
            }
        })
    }

    async fn release_all(&self, leases: Vec<Lease>) {
        for lease in leases {
            if let Err(e) = self.release(lease).await {
                warn!(error = %e, "releasing lease after reset failed; it vanishes with the session");
            }
        }
    }

    // ----- leases -----

    /// Tries to take the shard for `holder` (a task node name, or `cli-...`).
    ///
    /// Looks first (one listing): a shard someone holds is answered with
    /// [`Acquire::HeldBy`] without any write, so a waiting task costs one watch
    /// ([`ZkStore::watch_lease`]) and nothing else. When the holder already holds it (a retry), its
    /// lease is returned. Otherwise creates `owners/{shard}/lease-{holder}-N`
    /// (EPHEMERAL_SEQUENTIAL) and lists again: the lowest sequence owns the shard; a loser of a race
    /// deletes its own node before answering [`Acquire::HeldBy`].
    ///
    /// On an error the holder may have left a lease behind (a create whose answer was lost):
    /// [`ZkStore::cleanup_leases`] removes it, and callers must call it until it succeeds.
    pub async fn try_acquire(&self, shard_id: &str, holder: &str) -> Result<Acquire, CoordError> {
        validate_name("shard id", shard_id)?;
        validate_name("lease holder", holder)?;
        let dir = self.paths.owner_dir(shard_id);
        let leases = match self.leases(&dir).await {
            Ok(l) => l,
            Err(CoordError::Zk { source: zk::Error::NoNode, .. }) => {
                let options = CreateMode::Persistent;
                match self.client().create(&dir, &[], &options).await {
                    Ok(_) | Err(zk::Error::NodeExists) => Vec::new(),
                    Err(e) => return Err(CoordError::zk(&dir, "create", e)),
                }
            }
            Err(e) => return Err(e),
        };
        if let Some(decided) = self.decide(shard_id, &dir, &leases, holder) {
            return Ok(decided);
        }
        let prefix = self.paths.lease_prefix_for(shard_id, holder);
        let info = LeaseInfo {
            writer: self.session.name().to_string(),
            session_id: self.session.name().to_string(),
            since_ms: now_ms(),
            task: Some(holder.to_string()),
        };
        let data = encode(&prefix, &info)?;
        let options = CreateMode::EphemeralSequential;
        self.guarded(ZkOp::Create, &prefix, || self.client().create(&prefix, &data, &options))
            .await
            .map_err(|e| CoordError::zk(&prefix, "create", e))?;
        // Ours is there now, so the listing decides: lowest sequence wins.
        let leases = self.leases(&dir).await?;
        match self.decide(shard_id, &dir, &leases, holder) {
            Some(Acquire::Acquired(lease)) => {
                debug!(shard = shard_id, lease = %lease.path, "lease acquired");
                Ok(Acquire::Acquired(lease))
            }
            Some(held) => {
                // Lost a race: take our own node back so it never blocks anyone.
                self.cleanup_leases(shard_id, holder).await?;
                Ok(held)
            }
            // Our node is gone already: the session must have ended.
            None => Err(CoordError::Fenced { shard_id: shard_id.to_string(), lease_path: format!("{prefix}(gone)") }),
        }
    }

    /// The lease node names under `dir`, sorted by sequence.
    async fn leases(&self, dir: &str) -> Result<Vec<String>, CoordError> {
        let mut leases = self
            .guarded(ZkOp::List, dir, || self.client().list_children(dir))
            .await
            .map_err(|e| CoordError::zk(dir, "list", e))?;
        leases.retain(|n| n.starts_with(LEASE_PREFIX) && sequence_of(n).is_some());
        leases.sort_by_key(|n| sequence_of(n));
        Ok(leases)
    }

    /// Who owns the shard given its sorted leases; `None` when there is no lease.
    fn decide(&self, shard_id: &str, dir: &str, leases: &[String], holder: &str) -> Option<Acquire> {
        let lowest = leases.first()?;
        let path = format!("{dir}/{lowest}");
        Some(if lease_holder(lowest) == Some(holder) {
            Acquire::Acquired(Lease { shard_id: shard_id.to_string(), path })
        } else {
            Acquire::HeldBy { shard_id: shard_id.to_string(), holder_path: path }
        })
    }

    /// Deletes every lease node of `holder` on the shard (after a failed or lost acquisition).
    /// Returns how many it deleted.
    pub async fn cleanup_leases(&self, shard_id: &str, holder: &str) -> Result<usize, CoordError> {
        validate_name("shard id", shard_id)?;
        let dir = self.paths.owner_dir(shard_id);
        let leases = match self.leases(&dir).await {
            Ok(l) => l,
            Err(CoordError::Zk { source: zk::Error::NoNode, .. }) => return Ok(0),
            Err(e) => return Err(e),
        };
        let mut n = 0;
        for name in leases.iter().filter(|n| lease_holder(n) == Some(holder)) {
            self.delete_guarded(&format!("{dir}/{name}")).await?;
            n += 1;
        }
        Ok(n)
    }

    /// A one-shot watch on a lease znode held by someone else: it fires when the lease goes
    /// (released, or its session expired). `None` when it is already gone. One request.
    pub async fn watch_lease(&self, holder_path: &str) -> Result<Option<OneshotWatch>, CoordError> {
        if !holder_path.starts_with(self.paths.owners()) {
            return Err(CoordError::InvalidName {
                what: "lease path",
                name: holder_path.to_string(),
                reason: "is not under this stream's owners/",
            });
        }
        let (stat, watcher) = self
            .guarded(ZkOp::Exists, holder_path, || self.client().check_and_watch_stat(holder_path))
            .await
            .map_err(|e| CoordError::zk(holder_path, "watch", e))?;
        Ok(stat.map(|_| watcher))
    }

    async fn delete_quietly(&self, path: &str) -> Result<(), CoordError> {
        match self.client().delete(path, None).await {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(e) => Err(CoordError::zk(path, "delete", e)),
        }
    }

    /// Deletes `path` under the session's fault hook (tests inject lost answers here); a node
    /// already gone is fine.
    async fn delete_guarded(&self, path: &str) -> Result<(), CoordError> {
        match self.guarded(ZkOp::Delete, path, || self.client().delete(path, None)).await {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(e) => Err(CoordError::zk(path, "delete", e)),
        }
    }

    /// Releases a lease (deletes its znode). Releasing a lease that is already gone is fine. On
    /// an error the lease may still be there: callers retry until it succeeds (or the session
    /// ends, which removes it too).
    pub async fn release(&self, lease: Lease) -> Result<(), CoordError> {
        if !lease.path.starts_with(self.paths.owners()) {
            return Err(CoordError::InvalidName {
                what: "lease path",
                name: lease.path,
                reason: "is not under this stream's owners/",
            });
        }
        self.delete_guarded(&lease.path).await?;
        debug!(shard = %lease.shard_id, lease = %lease.path, "lease released");
        Ok(())
    }

    // ----- watch -----

    /// Follows `targets` and merges their changes into one channel of [`ChangeEvent`]s, plus the
    /// session's Disconnected / Reconnected / SessionLost ([`ChangeEvent::SessionLost`] is the
    /// last event). Each target is a one-shot watch re-armed after it fires (one request) and
    /// before the event is passed on, so a consumer that reads after an event never misses a later
    /// change. Only the watched znode itself is followed (its data, or its list of children),
    /// never anything deeper, so hot checkpoint writes reach no watcher.
    ///
    /// One-shot rather than persistent watches: the client restores one-shot watches after
    /// reconnecting to another server (and the server then reports what changed meanwhile), while
    /// zookeeper-client 0.11 does not re-register persistent watches on reconnection (its
    /// `resend_watches` never sends the persistent ones), so a persistent watch would fall silent
    /// after the first ZooKeeper server failover.
    pub async fn watch(&self, targets: &[WatchOn]) -> Result<mpsc::Receiver<ChangeEvent>, CoordError> {
        let (tx, rx) = mpsc::channel(WATCH_CHANNEL);
        for target in targets {
            let (path, event, children) = match target {
                WatchOn::Tasks => (self.paths.tasks().to_string(), ChangeEvent::Tasks, true),
                WatchOn::Assignment => (self.paths.assignment().to_string(), ChangeEvent::Assignment, false),
                WatchOn::Finished => (self.paths.finished_dir().to_string(), ChangeEvent::Finished, true),
                WatchOn::State => (self.paths.state().to_string(), ChangeEvent::State, false),
                WatchOn::Drain => (self.paths.drain(), ChangeEvent::Drain, false),
            };
            let first =
                arm(&*self.session.client, &path, children).await.map_err(|e| CoordError::zk(&path, "watch", e))?;
            // The task holds the session only while it re-arms (so dropping the store still
            // closes it); it ends with the receiver or the session.
            let weak = Arc::downgrade(&self.session);
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut watcher = first;
                loop {
                    let ev = tokio::select! {
                        _ = tx.closed() => return,
                        ev = watcher.changed() => ev,
                    };
                    if ev.event_type == zk::EventType::Session {
                        // Terminal: the session forwarder reports it.
                        return;
                    }
                    // Re-arm first, then report: whoever reads after the event also sees later
                    // changes, or gets another event.
                    // A transient error is retried at once; another (the node's ACL changed
                    // under us, say) is said, and retried every 5 s: the watch never ends
                    // silently while its session lives, and every retry reports the event (the
                    // reader re-reads what the watch covers).
                    let mut warned = false;
                    let rearmed = loop {
                        let Some(session) = weak.upgrade() else { return };
                        let armed = arm(&*session.client, &path, children).await;
                        drop(session);
                        match armed {
                            Ok(w) => break w,
                            Err(zk::Error::SessionExpired | zk::Error::ClientClosed) => return,
                            Err(e) => {
                                let wait = if is_transient(&e) {
                                    Duration::from_millis(200)
                                } else {
                                    if !warned {
                                        tracing::warn!(path = %path, error = %e,
                                            "watching a coordination znode failed; retrying every 5 s (check its ACL)");
                                        warned = true;
                                    }
                                    if tx.send(event.clone()).await.is_err() {
                                        return;
                                    }
                                    Duration::from_secs(5)
                                };
                                tokio::select! {
                                    _ = tx.closed() => return,
                                    _ = tokio::time::sleep(wait) => {}
                                }
                            }
                        }
                    };
                    if warned {
                        tracing::info!(path = %path, "watching the coordination znode works again");
                    }
                    if tx.send(event.clone()).await.is_err() {
                        return;
                    }
                    watcher = rearmed;
                }
            });
        }
        // Session events, once for the whole channel.
        let mut state = self.session.client.state_watcher();
        tokio::spawn(async move {
            loop {
                let st = tokio::select! {
                    _ = tx.closed() => return,
                    st = state.changed() => st,
                };
                let change = match st {
                    s if s.is_terminated() => ChangeEvent::SessionLost,
                    zk::SessionState::Disconnected => ChangeEvent::Disconnected,
                    zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => ChangeEvent::Reconnected,
                    _ => continue,
                };
                let terminal = change == ChangeEvent::SessionLost;
                if tx.send(change).await.is_err() || terminal {
                    return;
                }
            }
        });
        Ok(rx)
    }

    // ----- helpers -----

    async fn read_json<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        what: &str,
    ) -> Result<Option<Versioned<T>>, CoordError> {
        match self.client().get_data(path).await {
            Ok((data, stat)) => Ok(Some(Versioned { value: decode(path, what, &data)?, version: stat.version })),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(CoordError::zk(path, "get", e)),
        }
    }

    async fn cas_write(&self, path: &str, data: &[u8], expected_version: Option<i32>) -> Result<i32, CoordError> {
        match expected_version {
            None => {
                let options = CreateMode::Persistent;
                match self.client().create(path, data, &options).await {
                    Ok((stat, _)) => Ok(stat.version),
                    Err(zk::Error::NodeExists) => {
                        Err(CoordError::VersionConflict { path: path.to_string(), expected: None })
                    }
                    Err(e) => Err(CoordError::zk(path, "create", e)),
                }
            }
            Some(v) => match self.client().set_data(path, data, Some(v)).await {
                Ok(stat) => Ok(stat.version),
                Err(zk::Error::BadVersion | zk::Error::NoNode) => {
                    Err(CoordError::VersionConflict { path: path.to_string(), expected: Some(v) })
                }
                Err(e) => Err(CoordError::zk(path, "set", e)),
            },
        }
    }
}

/// An injected client error, converted into the error type of the guarded call.
struct InjectedError(zk::Error);

impl From<InjectedError> for zk::Error {
    fn from(e: InjectedError) -> Self {
        e.0
    }
}

impl From<InjectedError> for zk::MultiWriteError {
    fn from(e: InjectedError) -> Self {
        zk::MultiWriteError::RequestFailed { source: e.0 }
    }
}

/// Sets a one-shot watch on `path`: on its list of children (`children`), or on the node itself
/// (created, changed or deleted; the node may not exist yet). One request.
async fn arm(client: &dyn ZkClient, path: &str, children: bool) -> Result<OneshotWatch, zk::Error> {
    let counters = super::session::zk_counters();
    if children {
        counters.request();
        match client.list_and_watch_children(path).await {
            Ok((_, watcher)) => return Ok(watcher),
            // Not there yet: watch for its creation instead.
            Err(zk::Error::NoNode) => {}
            Err(e) => return Err(e),
        }
    }
    counters.request();
    let (_, watcher) = client.check_and_watch_stat(path).await?;
    Ok(watcher)
}

/// Producer registry node names `{producer:016x}-{deployment}`; others are skipped.
fn parse_producers(names: &[String]) -> BTreeMap<u64, String> {
    names
        .iter()
        .filter_map(|n| {
            let (id, dep) = n.split_once('-')?;
            Some((u64::from_str_radix(id, 16).ok()?, dep.to_string()))
        })
        .collect()
}

fn describe(cp: &Checkpoint) -> String {
    if cp.finished { format!("{} (finished)", cp.position) } else { cp.position.to_string() }
}
