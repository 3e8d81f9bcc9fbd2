//! [`ZkStore`]: the ZooKeeper side of the spout's state manager.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};
use zookeeper_client as zk;

use super::config::ZkConfig;
use super::error::{CoordError, is_transient};
use super::logic::task_cmp;
use super::model::{
    Checkpoint, CheckpointPosition, DrainRequest, LeaseInfo, ShardList, TaskInfo, TopologyState, Versioned,
    WorkerStatus, decode, encode, now_ms,
};
use super::paths::{LEASE_PREFIX, TASK_PREFIX, TopologyPaths, sequence_of, validate_name};
use super::watch::{ChangeEvent, SessionWatch, classify};

/// Largest shard list the store writes. ZooKeeper refuses znodes over `jute.maxbuffer`
/// (1 MB by default); at ~200 bytes per shard this is a few thousand shards.
pub const MAX_SHARD_LIST_BYTES: usize = 900 * 1024;

/// Capacity of the channel [`ZkStore::watch`] returns.
const WATCH_CHANNEL: usize = 1024;

/// A lease on one shard: the lease znode this task created and found lowest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub shard_id: String,
    /// Full path of the lease znode; checkpoint writes are fenced on its existence.
    pub path: String,
}

/// Result of [`ZkStore::try_acquire`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquire {
    /// This task owns the shard now.
    Acquired(Lease),
    /// Another session holds the shard; wait for [`ChangeEvent::Owners`] and try again.
    HeldBy { shard_id: String, holder_path: String },
}

/// Connection to ZooKeeper for one topology reading one stream.
///
/// Dropping the store closes the session: its task registration and leases disappear at once.
#[derive(Debug)]
pub struct ZkStore {
    client: zk::Client,
    paths: TopologyPaths,
    acls: zk::Acls<'static>,
    writer: String,
}

impl ZkStore {
    /// Connects (bounded retry with back-off), then creates the persistent layout (idempotent).
    ///
    /// With `cfg.auth`, the session authenticates with digest auth and every znode the store
    /// creates gets creator-only ACLs.
    pub async fn connect(cfg: &ZkConfig, topology: &str, stream: &str) -> Result<Self, CoordError> {
        cfg.validate()?;
        let paths = TopologyPaths::new(&cfg.root, topology, stream)?;
        let client = connect_client(cfg).await?;
        let acls = if cfg.auth.is_some() { zk::Acls::creator_all() } else { zk::Acls::anyone_all() };
        let writer = format!("{:#x}", client.session_id().0);
        let store = Self { client, paths, acls, writer };
        store.create_layout().await?;
        info!(
            connect = %cfg.connect,
            topology = store.paths.topology(),
            session = %store.writer,
            timeout_ms = store.client.session_timeout().as_millis() as u64,
            "connected to ZooKeeper"
        );
        Ok(store)
    }

    async fn create_layout(&self) -> Result<(), CoordError> {
        let options = zk::CreateMode::Persistent.with_acls(self.acls);
        for dir in self.paths.persistent_dirs() {
            let op = || async { self.client.mkdir(dir, &options).await };
            op.retry(short_backoff()).when(is_transient).await.map_err(|e| CoordError::zk(dir, "mkdir", e))?;
        }
        Ok(())
    }

    /// The znode layout of this topology and stream.
    pub fn paths(&self) -> &TopologyPaths {
        &self.paths
    }

    /// The session id, as written into leases and (by convention) checkpoints' `writer`.
    pub fn session_name(&self) -> &str {
        &self.writer
    }

    /// The session timeout the server granted (it clamps the requested one).
    pub fn session_timeout(&self) -> Duration {
        self.client.session_timeout()
    }

    /// Observes Connected / Disconnected / Expired. After [`super::SessionStatus::Expired`] the
    /// store is unusable: build a new one.
    pub fn session_state(&self) -> SessionWatch {
        SessionWatch::new(self.client.state_watcher(), self.client.session_timeout())
    }

    /// Closes the session now (same as dropping the store): leases and registration vanish.
    pub fn close(self) {
        drop(self);
    }

    /// Closes the session and waits (up to 3 s) until the server confirmed it, so ephemeral nodes
    /// are gone for everyone before this returns. Use it before a process exits: a session that is
    /// merely dropped at exit lingers on the server until its timeout.
    pub async fn close_gracefully(self) {
        let mut watcher = self.client.state_watcher();
        drop(self);
        let wait = async {
            loop {
                let st = watcher.changed().await;
                if st.is_terminated() {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(3), wait).await;
    }

    // ----- tasks -----

    /// Registers a live task: an EPHEMERAL_SEQUENTIAL `tasks/task-N` znode. Returns its node name.
    pub async fn register_task(&self, info: &TaskInfo) -> Result<String, CoordError> {
        let prefix = self.paths.task_prefix();
        let info = TaskInfo { session: self.writer.clone(), ..info.clone() };
        let data = encode(&prefix, &info)?;
        let options = zk::CreateMode::EphemeralSequential.with_acls(self.acls);
        let (_, seq) =
            self.client.create(&prefix, &data, &options).await.map_err(|e| CoordError::zk(&prefix, "create", e))?;
        let name = format!("{TASK_PREFIX}{seq}");
        debug!(task = %name, "registered task");
        Ok(name)
    }

    /// Live tasks (node name, info), sorted by sequence (the first is the leader).
    pub async fn live_tasks(&self) -> Result<Vec<(String, TaskInfo)>, CoordError> {
        let dir = self.paths.tasks();
        let mut names: Vec<String> =
            self.client.list_children(dir).await.map_err(|e| CoordError::zk(dir, "list", e))?;
        names.retain(|n| n.starts_with(TASK_PREFIX));
        names.sort_by(|a, b| task_cmp(a, b));
        // Requests are sent when the futures are created, so these reads are pipelined.
        let reads: Vec<_> = names
            .iter()
            .map(|n| (n, self.paths.task(n)))
            .map(|(n, p)| {
                let fut = self.client.get_data(&p);
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
        match self.client.set_data(&path, &data, None).await {
            Ok(_) => Ok(()),
            Err(zk::Error::NoNode) => {
                let options = zk::CreateMode::Persistent.with_acls(self.acls);
                match self.client.create(&path, &data, &options).await {
                    Ok(_) => Ok(()),
                    Err(zk::Error::NodeExists) => self
                        .client
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
        match self.client.set_data(&path, &data, None).await {
            Ok(_) => Ok(()),
            Err(zk::Error::NoNode) => {
                let options = zk::CreateMode::Ephemeral.with_acls(self.acls);
                match self.client.create(&path, &data, &options).await {
                    Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
                    Err(e) => Err(CoordError::zk(&path, "create", e)),
                }
            }
            Err(e) => Err(CoordError::zk(&path, "set", e)),
        }
    }

    /// Every live worker's status, sorted by worker id.
    pub async fn workers(&self) -> Result<Vec<WorkerStatus>, CoordError> {
        let dir = self.paths.workers();
        let mut names = match self.client.list_children(dir).await {
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

    /// The current owner of every leased shard: shard id -> (lease path, holder session).
    pub async fn shard_owners(&self) -> Result<BTreeMap<String, (String, String)>, CoordError> {
        let dir = self.paths.owners();
        let shards = match self.client.list_children(dir).await {
            Ok(n) => n,
            Err(zk::Error::NoNode) => return Ok(BTreeMap::new()),
            Err(e) => return Err(CoordError::zk(dir, "list", e)),
        };
        let mut out = BTreeMap::new();
        for shard in shards {
            let sdir = self.paths.owner_dir(&shard);
            let mut leases = match self.client.list_children(&sdir).await {
                Ok(n) => n,
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(CoordError::zk(&sdir, "list", e)),
            };
            leases.retain(|n| n.starts_with(LEASE_PREFIX) && sequence_of(n).is_some());
            leases.sort_by_key(|n| sequence_of(n));
            for lease in leases {
                let path = format!("{sdir}/{lease}");
                if let Some(v) = self.read_json::<LeaseInfo>(&path, "lease").await? {
                    out.insert(shard.clone(), (path, v.value.writer));
                    break;
                }
            }
        }
        Ok(out)
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

    // ----- checkpoints -----

    /// Every checkpoint of the stream, by shard id.
    pub async fn read_checkpoints(&self) -> Result<BTreeMap<String, Versioned<Checkpoint>>, CoordError> {
        let dir = self.paths.checkpoints();
        let names = self.client.list_children(dir).await.map_err(|e| CoordError::zk(dir, "list", e))?;
        let reads: Vec<_> = names
            .into_iter()
            .map(|n| {
                let path = self.paths.checkpoint(&n);
                let fut = self.client.get_data(&path);
                (n, path, fut)
            })
            .collect();
        let mut out = BTreeMap::new();
        for (shard, path, fut) in reads {
            match fut.await {
                Ok((data, stat)) => {
                    let value = decode::<Checkpoint>(&path, "checkpoint", &data)?;
                    out.insert(shard, Versioned { value, version: stat.version });
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
        self.read_json(&self.paths.checkpoint(shard_id), "checkpoint").await
    }

    /// Persists the starting decision for a shard once: creates the checkpoint if absent, and
    /// otherwise returns the one already stored (the first decision wins).
    pub async fn init_checkpoint(&self, shard_id: &str, cp: &Checkpoint) -> Result<Versioned<Checkpoint>, CoordError> {
        validate_name("shard id", shard_id)?;
        cp.validate(shard_id)?;
        let path = self.paths.checkpoint(shard_id);
        let data = encode(&path, cp)?;
        let options = zk::CreateMode::Persistent.with_acls(self.acls);
        match self.client.create(&path, &data, &options).await {
            Ok((stat, _)) => Ok(Versioned { value: cp.clone(), version: stat.version }),
            Err(zk::Error::NodeExists) => match self.read_json(&path, "checkpoint").await? {
                Some(existing) => Ok(existing),
                // Deleted right after we saw it: a reset in progress. Let the caller retry.
                None => Err(CoordError::VersionConflict { path, expected: Some(0) }),
            },
            Err(e) => Err(CoordError::zk(&path, "create", e)),
        }
    }

    /// Fenced checkpoint write: ONE transaction of `check_version(lease.path, 0)` and
    /// `set_data(checkpoint, expected_version)`.
    ///
    /// * [`CoordError::Fenced`] when the lease znode is gone (session expired, lease released):
    ///   a zombie never overwrites the new owner's checkpoint.
    /// * [`CoordError::VersionConflict`] when the checkpoint is not at `expected_version`.
    /// * [`CoordError::CheckpointBackwards`] (nothing written) when it would move back.
    pub async fn write_checkpoint(
        &self,
        lease: &Lease,
        cp: &Checkpoint,
        expected_version: i32,
    ) -> Result<i32, CoordError> {
        let shard_id = lease.shard_id.as_str();
        validate_name("shard id", shard_id)?;
        cp.validate(shard_id)?;
        let path = self.paths.checkpoint(shard_id);
        if !lease.path.starts_with(&self.paths.lease_prefix(shard_id)) {
            return Err(CoordError::Fenced { shard_id: shard_id.to_string(), lease_path: lease.path.clone() });
        }
        // Compare with the stored value; the version check in the transaction guarantees the
        // value we compared with is the one we overwrite.
        let current = match self.client.get_data(&path).await {
            Ok((data, stat)) => {
                Versioned { value: decode::<Checkpoint>(&path, "checkpoint", &data)?, version: stat.version }
            }
            Err(zk::Error::NoNode) => return Err(CoordError::NoCheckpoint { shard_id: shard_id.to_string(), path }),
            Err(e) => return Err(CoordError::zk(&path, "get", e)),
        };
        if current.version != expected_version {
            return Err(CoordError::VersionConflict { path, expected: Some(expected_version) });
        }
        if cp.moves_back_from(&current.value) {
            return Err(CoordError::CheckpointBackwards {
                shard_id: shard_id.to_string(),
                path,
                current: describe(&current.value),
                proposed: describe(cp),
            });
        }
        let data = encode(&path, cp)?;
        let mut txn = self.client.new_multi_writer();
        txn.add_check_version(&lease.path, 0).map_err(|e| CoordError::zk(&lease.path, "check", e))?;
        txn.add_set_data(&path, &data, Some(expected_version)).map_err(|e| CoordError::zk(&path, "set", e))?;
        match txn.commit().await {
            Ok(results) => match results.into_iter().nth(1) {
                Some(zk::MultiWriteResult::SetData { stat }) => Ok(stat.version),
                other => Err(CoordError::Zk {
                    path,
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
                Err(CoordError::VersionConflict { path, expected: Some(expected_version) })
            }
            Err(zk::MultiWriteError::OperationFailed { index: 1, source: zk::Error::NoNode }) => {
                Err(CoordError::NoCheckpoint { shard_id: shard_id.to_string(), path })
            }
            Err(zk::MultiWriteError::OperationFailed { index, source }) => {
                let failed = if index == 0 { lease.path.clone() } else { path };
                Err(CoordError::zk(&failed, "multi", source))
            }
            Err(zk::MultiWriteError::RequestFailed { source }) => Err(CoordError::zk(&path, "multi", source)),
        }
    }

    /// Rewinds every checkpoint of the stream (every checkpoint znode and every shard in the
    /// shard list) to `position`, unfinished, in one transaction. Refused with
    /// [`CoordError::LeasesHeld`] while any task holds a lease: the store takes a lease on every
    /// shard itself first, so no task can start reading mid-reset. Returns the number written.
    pub async fn reset_checkpoints(&self, position: &CheckpointPosition) -> Result<usize, CoordError> {
        let cp = Checkpoint {
            position: position.clone(),
            finished: false,
            updated_at_ms: now_ms(),
            writer: Some(format!("reset by {}", self.writer)),
        };
        let mut shards: BTreeSet<String> = self.read_checkpoints().await?.into_keys().collect();
        if let Some(list) = self.read_shard_list().await? {
            shards.extend(list.value.shards.into_iter().map(|s| s.shard_id));
        }
        for s in &shards {
            cp.validate(s)?;
        }
        let mut leases = Vec::new();
        let mut held = Vec::new();
        for shard in &shards {
            match self.try_acquire(shard).await {
                Ok(Acquire::Acquired(lease)) => leases.push(lease),
                Ok(Acquire::HeldBy { shard_id, .. }) => held.push(shard_id),
                Err(e) => {
                    self.release_all(leases).await;
                    return Err(e);
                }
            }
        }
        if !held.is_empty() {
            self.release_all(leases).await;
            return Err(CoordError::LeasesHeld { shards: held });
        }
        let result = self.write_reset(&shards, &leases, &cp).await;
        self.release_all(leases).await;
        result.map(|()| shards.len())
    }

    async fn write_reset(
        &self,
        shards: &BTreeSet<String>,
        leases: &[Lease],
        cp: &Checkpoint,
    ) -> Result<(), CoordError> {
        let dir = self.paths.checkpoints().to_string();
        let existing: BTreeSet<String> =
            self.client.list_children(&dir).await.map_err(|e| CoordError::zk(&dir, "list", e))?.into_iter().collect();
        let data = encode(&dir, cp)?;
        let options = zk::CreateMode::Persistent.with_acls(self.acls);
        let mut txn = self.client.new_multi_writer();
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
        }
        txn.commit().await.map(|_| ()).map_err(|e| match e {
            zk::MultiWriteError::OperationFailed { source: zk::Error::NodeExists | zk::Error::NoNode, .. } => {
                CoordError::VersionConflict { path: dir.clone(), expected: None }
            }
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

    /// Tries to take the shard: creates `owners/{shard}/lease-N` (EPHEMERAL_SEQUENTIAL). When a
    /// lease with a lower sequence exists, deletes its own and reports the holder. If this very
    /// session already holds the shard (e.g. a retry after connection loss), returns that lease.
    pub async fn try_acquire(&self, shard_id: &str) -> Result<Acquire, CoordError> {
        validate_name("shard id", shard_id)?;
        let dir = self.paths.owner_dir(shard_id);
        let dir_options = zk::CreateMode::Persistent.with_acls(self.acls);
        match self.client.create(&dir, &[], &dir_options).await {
            Ok(_) | Err(zk::Error::NodeExists) => {}
            Err(e) => return Err(CoordError::zk(&dir, "create", e)),
        }
        let prefix = self.paths.lease_prefix(shard_id);
        let info = LeaseInfo { writer: self.writer.clone(), session_id: self.writer.clone(), since_ms: now_ms() };
        let data = encode(&prefix, &info)?;
        let options = zk::CreateMode::EphemeralSequential.with_acls(self.acls);
        let (_, seq) =
            self.client.create(&prefix, &data, &options).await.map_err(|e| CoordError::zk(&prefix, "create", e))?;
        let own_name = format!("{LEASE_PREFIX}{seq}");
        let own_path = format!("{dir}/{own_name}");
        let session = self.client.session_id().0;
        // A lower lease can vanish while we look at it; each pass either decides or sees one fewer.
        for _ in 0..16 {
            let mut leases = self.client.list_children(&dir).await.map_err(|e| CoordError::zk(&dir, "list", e))?;
            leases.retain(|n| n.starts_with(LEASE_PREFIX) && sequence_of(n).is_some());
            leases.sort_by_key(|n| sequence_of(n));
            let Some(lowest) = leases.first() else {
                return Err(CoordError::Fenced { shard_id: shard_id.to_string(), lease_path: own_path });
            };
            if *lowest == own_name {
                debug!(shard = shard_id, lease = %own_path, "lease acquired");
                return Ok(Acquire::Acquired(Lease { shard_id: shard_id.to_string(), path: own_path }));
            }
            let holder_path = format!("{dir}/{lowest}");
            match self.client.check_stat(&holder_path).await.map_err(|e| CoordError::zk(&holder_path, "stat", e))? {
                None => continue,
                Some(stat) => {
                    self.delete_quietly(&own_path).await?;
                    if stat.ephemeral_owner == session {
                        return Ok(Acquire::Acquired(Lease { shard_id: shard_id.to_string(), path: holder_path }));
                    }
                    return Ok(Acquire::HeldBy { shard_id: shard_id.to_string(), holder_path });
                }
            }
        }
        self.delete_quietly(&own_path).await?;
        Err(CoordError::VersionConflict { path: dir, expected: None })
    }

    async fn delete_quietly(&self, path: &str) -> Result<(), CoordError> {
        match self.client.delete(path, None).await {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(e) => Err(CoordError::zk(path, "delete", e)),
        }
    }

    /// Releases a lease (deletes its znode). Releasing a lease that is already gone is fine.
    pub async fn release(&self, lease: Lease) -> Result<(), CoordError> {
        if !lease.path.starts_with(self.paths.owners()) {
            return Err(CoordError::InvalidName {
                what: "lease path",
                name: lease.path,
                reason: "is not under this stream's owners/",
            });
        }
        self.delete_quietly(&lease.path).await?;
        debug!(shard = %lease.shard_id, lease = %lease.path, "lease released");
        Ok(())
    }

    // ----- watch -----

    /// Starts a persistent recursive watch on the topology path. The returned channel carries
    /// [`ChangeEvent`]s; [`ChangeEvent::SessionLost`] is the last one. The watch task ends when
    /// the receiver is dropped or the session ends.
    pub async fn watch(&self) -> Result<mpsc::Receiver<ChangeEvent>, CoordError> {
        let topo = self.paths.topology().to_string();
        let stream = self.paths.stream_name().to_string();
        let mut watcher = self
            .client
            .watch(&topo, zk::AddWatchMode::PersistentRecursive)
            .await
            .map_err(|e| CoordError::zk(&topo, "watch", e))?;
        let (tx, rx) = mpsc::channel(WATCH_CHANNEL);
        // The task holds no Client clone, so dropping the store still closes the session.
        tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    _ = tx.closed() => return,
                    event = watcher.changed() => event,
                };
                let change = if event.event_type == zk::EventType::Session {
                    match event.session_state {
                        zk::SessionState::Disconnected => Some(ChangeEvent::Disconnected),
                        zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                            Some(ChangeEvent::Reconnected)
                        }
                        _ => None, // terminal, below
                    }
                } else {
                    classify(&topo, &stream, &event.path)
                };
                let terminal = event.event_type == zk::EventType::Session && event.session_state.is_terminated();
                let change = if terminal { Some(ChangeEvent::SessionLost) } else { change };
                if let Some(change) = change {
                    if tx.send(change).await.is_err() {
                        return;
                    }
                }
                if terminal {
                    // PersistentWatcher::changed panics after a terminal event: stop here.
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
        match self.client.get_data(path).await {
            Ok((data, stat)) => Ok(Some(Versioned { value: decode(path, what, &data)?, version: stat.version })),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(CoordError::zk(path, "get", e)),
        }
    }

    async fn cas_write(&self, path: &str, data: &[u8], expected_version: Option<i32>) -> Result<i32, CoordError> {
        match expected_version {
            None => {
                let options = zk::CreateMode::Persistent.with_acls(self.acls);
                match self.client.create(path, data, &options).await {
                    Ok((stat, _)) => Ok(stat.version),
                    Err(zk::Error::NodeExists) => {
                        Err(CoordError::VersionConflict { path: path.to_string(), expected: None })
                    }
                    Err(e) => Err(CoordError::zk(path, "create", e)),
                }
            }
            Some(v) => match self.client.set_data(path, data, Some(v)).await {
                Ok(stat) => Ok(stat.version),
                Err(zk::Error::BadVersion | zk::Error::NoNode) => {
                    Err(CoordError::VersionConflict { path: path.to_string(), expected: Some(v) })
                }
                Err(e) => Err(CoordError::zk(path, "set", e)),
            },
        }
    }
}

fn describe(cp: &Checkpoint) -> String {
    if cp.finished { format!("{} (finished)", cp.position) } else { cp.position.to_string() }
}

fn short_backoff() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(2))
        .with_max_times(5)
        .with_jitter()
}

pub(crate) async fn connect_client(cfg: &ZkConfig) -> Result<zk::Client, CoordError> {
    let attempt = || async {
        let mut connector = zk::Client::connector()
            .with_session_timeout(cfg.session_timeout)
            .with_connection_timeout(cfg.session_timeout.min(Duration::from_secs(5)))
            .with_fail_eagerly();
        if let Some(auth) = &cfg.auth {
            connector = connector.with_auth("digest", &auth.digest_bytes());
        }
        // Bound each attempt: without a reachable server the client would keep cycling.
        match tokio::time::timeout(cfg.session_timeout + Duration::from_secs(2), connector.connect(&cfg.connect)).await
        {
            Ok(result) => result,
            Err(_) => Err(zk::Error::Timeout),
        }
    };
    attempt
        .retry(short_backoff().with_max_times(4))
        .when(|e| !matches!(e, zk::Error::AuthFailed | zk::Error::BadArguments(_)))
        .notify(|e, after| warn!(connect = %cfg.connect, error = %e, retry_in = ?after, "ZooKeeper connect failed"))
        .await
        .map_err(|source| CoordError::Connect { connect: cfg.connect.clone(), source })
}
