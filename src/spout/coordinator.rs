//! The state manager of one spout task: registration, leader duties (shard discovery), assignment,
//! leases, reader lifecycle, fenced checkpoints, shard end, handoff and ZooKeeper session loss.
//!
//! It runs as one background task per spout task, a `select!` loop over ZooKeeper change events,
//! reader events, session health, control from the spout, and a short tick. All ZooKeeper I/O
//! happens here; the spout's hot path only touches the shared [`Tracker`] briefly.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::config::{InitialPosition, KinesisSpoutConfig};
use super::reader::{ReaderCtx, ReaderEvent};
use super::tracker::Tracker;
use crate::coord::{
    Acquire, ChangeEvent, Checkpoint, CheckpointPosition, CoordError, Lease, SessionAlarm, SessionStatus, ShardList,
    ShardRecord, TaskInfo, ZkConfig, ZkStore, assign, leader, now_ms, readable_shards,
};
use crate::kinesis;

/// Session health as the coordinator sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Health {
    Ok,
    /// Disconnected for more than half the session timeout: stop fetching, leases may be gone.
    Unsafe,
    /// Expired or closed: rebuild everything.
    Lost,
}

/// A shard this task holds a lease on.
struct Owned {
    lease: Lease,
    epoch: u64,
    cp_version: i32,
    /// Last sequence written as checkpoint (or read at acquisition).
    written: Option<String>,
    last_write: Instant,
    reader: CancellationToken,
    reader_task: Option<tokio::task::JoinHandle<()>>,
    /// Handoff in progress: release when nothing is in flight or at this deadline.
    releasing: Option<Instant>,
}

pub(crate) struct Coordinator {
    pub cfg: Arc<KinesisSpoutConfig>,
    pub zk: ZkConfig,
    pub info: TaskInfo,
    pub tracker: Arc<Mutex<Tracker>>,
    pub reader: Arc<ReaderCtx>,
    pub reader_events: mpsc::UnboundedReceiver<ReaderEvent>,
    /// Desired activation (from the spout's activate/deactivate).
    pub active: watch::Receiver<bool>,
    /// What the readers obey: active and session healthy. Shared with the session monitor, which
    /// closes it at once when the session becomes unsafe, even while this loop waits on ZooKeeper.
    pub fetch_allowed: Arc<watch::Sender<bool>>,
    /// The task's ZooKeeper node name, published for the spout (status, logs).
    pub task_name: Arc<Mutex<String>>,
    /// Readers and the session monitor: owned, awaited before `run` returns.
    pub tasks: tokio_util::task::TaskTracker,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Per-session state.
struct Session {
    store: Arc<ZkStore>,
    task: String,
    events: mpsc::Receiver<ChangeEvent>,
    health: watch::Receiver<Health>,
    monitor: CancellationToken,
    owned: HashMap<Arc<str>, Owned>,
    is_leader: bool,
    last_discovery: Option<Instant>,
    discovery_wanted: bool,
    dirty: bool,
    last_sync: Instant,
    finished_seen: usize,
    last_warn: Option<(String, Instant)>,
}

impl Coordinator {
    /// Runs until `cancel`; then hands every shard back (final checkpoint, release) and closes
    /// the session. `first` is the already-connected store from `open` (so a bad connect string
    /// fails the spout's open with a clear error).
    pub async fn run(mut self, first: ZkStore, cancel: CancellationToken) {
        let mut next_store = Some(first);
        loop {
            let store = match next_store.take() {
                Some(s) => s,
                None => match self.reconnect(&cancel).await {
                    Some(s) => s,
                    None => {
                        self.tasks.close();
                        self.tasks.wait().await;
                        return;
                    }
                },
            };
            let outcome = self.run_session(store, &cancel).await;
            match outcome {
                SessionEnd::Shutdown => {
                    self.tasks.close();
                    self.tasks.wait().await;
                    return;
                }
                SessionEnd::Lost => {
                    tracing::warn!(topology = %self.cfg.topology, stream = %self.cfg.stream,
                        "ZooKeeper session lost: stopped reading every shard; reconnecting, re-registering and re-acquiring");
                }
            }
        }
    }

    async fn reconnect(&self, cancel: &CancellationToken) -> Option<ZkStore> {
        let mut delay = Duration::from_millis(200);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return None,
                r = ZkStore::connect(&self.zk, &self.cfg.topology, &self.cfg.stream) => match r {
                    Ok(s) => return Some(s),
                    Err(e) => tracing::warn!(error = %e, "reconnecting to ZooKeeper failed; retrying"),
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => return None,
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }

    fn set_fetch(&self, health: Health) {
        let allowed = *self.active.borrow() && health == Health::Ok;
        self.fetch_allowed.send_if_modified(|v| {
            let changed = *v != allowed;
            *v = allowed;
            changed
        });
    }

    async fn run_session(&mut self, store: ZkStore, cancel: &CancellationToken) -> SessionEnd {
        let store = Arc::new(store);
        let mut info = self.info.clone();
        info.since_ms = now_ms();
        let setup = async {
            let events = store.watch().await?;
            let task = store.register_task(&info).await?;
            Ok::<_, CoordError>((events, task))
        };
        let (events, task) = match setup.await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "registering the spout task in ZooKeeper failed");
                tokio::time::sleep(Duration::from_millis(500)).await;
                return if cancel.is_cancelled() { SessionEnd::Shutdown } else { SessionEnd::Lost };
            }
        };
        *lock(&self.task_name) = task.clone();
        tracing::info!(topology = %self.cfg.topology, stream = %self.cfg.stream, task = %task, "spout task registered");
        let (health_tx, health) = watch::channel(Health::Ok);
        let monitor = cancel.child_token();
        self.tasks.spawn(monitor_session(
            store.session_state(),
            health_tx,
            self.fetch_allowed.clone(),
            monitor.clone(),
        ));
        let mut s = Session {
            store,
            task,
            events,
            health,
            monitor,
            owned: HashMap::new(),
            is_leader: false,
            last_discovery: None,
            discovery_wanted: false,
            dirty: true,
            last_sync: Instant::now(),
            finished_seen: 0,
            last_warn: None,
        };
        self.set_fetch(Health::Ok);
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let resync = KinesisSpoutConfig::ms(self.cfg.resync_interval_ms);
        // Losing a channel because we are shutting down is a shutdown, not a lost session.
        let lost =
            |cancel: &CancellationToken| if cancel.is_cancelled() { SessionEnd::Shutdown } else { SessionEnd::Lost };
        let end = loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => break SessionEnd::Shutdown,
                ev = s.events.recv() => match ev {
                    None | Some(ChangeEvent::SessionLost) => break lost(cancel),
                    Some(ChangeEvent::Disconnected) => {}
                    Some(_) => s.dirty = true,
                },
                ev = self.reader_events.recv() => {
                    if let Some(ReaderEvent::Ended { shard, epoch, children }) = ev {
                        if s.owned.get(&shard).is_some_and(|o| o.epoch == epoch) {
                            tracing::debug!(shard = %shard, ?children, "shard end reported");
                            s.discovery_wanted = true;
                        }
                    }
                }
                r = s.health.changed() => {
                    if r.is_err() { break lost(cancel); }
                    let h = *s.health.borrow();
                    self.set_fetch(h);
                    match h {
                        Health::Lost => break lost(cancel),
                        Health::Unsafe => {}
                        Health::Ok => { tracing::info!("ZooKeeper connection back: fetching again"); s.dirty = true; }
                    }
                }
                r = self.active.changed() => {
                    if r.is_ok() {
                        let h = *s.health.borrow();
                        self.set_fetch(h);
                        s.dirty = true;
                    }
                }
                _ = tick.tick() => {}
            }
            if *s.health.borrow() != Health::Ok {
                continue;
            }
            // Each part runs even when another failed: a broken checkpoint must not stop the
            // leader's discovery, which is what repairs it.
            let mut first_err: Option<CoordError> = None;
            if s.dirty || s.last_sync.elapsed() >= resync {
                if let Err(e) = self.sync(&mut s).await {
                    first_err.get_or_insert(e);
                }
            }
            if let Err(e) = self.maintain(&mut s, false).await {
                first_err.get_or_insert(e);
            }
            if s.is_leader {
                let due = s
                    .last_discovery
                    .is_none_or(|t| t.elapsed() >= KinesisSpoutConfig::ms(self.cfg.shard_discovery_interval_ms));
                if due || s.discovery_wanted {
                    s.discovery_wanted = false;
                    s.last_discovery = Some(Instant::now());
                    if let Err(e) = self.discover(&s).await {
                        first_err.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = first_err {
                if e.is_session_lost() {
                    break lost(cancel);
                }
                // The same failure repeats every tick: say it once per 10 s.
                let msg = e.to_string();
                if s.last_warn.as_ref().is_none_or(|(m, t)| *m != msg || t.elapsed() >= Duration::from_secs(10)) {
                    tracing::warn!(error = %msg, "coordination step failed; retrying");
                    s.last_warn = Some((msg, Instant::now()));
                }
                s.dirty = true;
            }
        };
        match end {
            SessionEnd::Shutdown => self.shutdown(&mut s).await,
            SessionEnd::Lost => self.drop_everything(&mut s).await,
        }
        s.monitor.cancel();
        self.set_fetch(Health::Lost);
        if matches!(end, SessionEnd::Shutdown) {
            // Close the session for real before the process may exit: the task node and any lease
            // vanish at once instead of after the session timeout.
            if let Ok(store) = Arc::try_unwrap(s.store) {
                store.close_gracefully().await;
            }
        }
        end
    }

    /// Session lost: stop reading everything and forget it. The leases are gone with the session;
    /// in-flight records will be read again by the next owners from the checkpoints.
    async fn drop_everything(&self, s: &mut Session) {
        let owned: Vec<(Arc<str>, Owned)> = s.owned.drain().collect();
        for (_, o) in &owned {
            o.reader.cancel();
        }
        for (shard, mut o) in owned {
            if let Some(h) = o.reader_task.take() {
                let _ = tokio::time::timeout(Duration::from_secs(10), h).await;
            }
            lock(&self.tracker).remove(&shard);
            lock(&self.reader.status).remove(&shard);
            self.reader.read_log.release(&s.task, &shard);
        }
    }

    /// Graceful stop: final checkpoints of what was acked, then release every lease.
    async fn shutdown(&self, s: &mut Session) {
        let shards: Vec<Arc<str>> = s.owned.keys().cloned().collect();
        for shard in &shards {
            self.begin_release(s, shard, Duration::ZERO);
        }
        if let Err(e) = self.maintain(s, true).await {
            tracing::warn!(error = %e, "final checkpoints at shutdown failed; the next owner resumes from the last written ones");
        }
        self.drop_everything(s).await;
        // Dropping the last reference to the store closes the session: the task node goes.
    }

    /// Reads tasks, shards and checkpoints; computes this task's shards; acquires and releases.
    async fn sync(&self, s: &mut Session) -> Result<(), CoordError> {
        s.dirty = false;
        s.last_sync = Instant::now();
        let tasks: Vec<String> = s.store.live_tasks().await?.into_iter().map(|(n, _)| n).collect();
        let was_leader = s.is_leader;
        s.is_leader = leader(&tasks) == Some(s.task.as_str());
        if s.is_leader && !was_leader {
            tracing::info!(task = %s.task, "this spout task is the leader: it lists the stream's shards");
            s.discovery_wanted = true;
        }
        if !tasks.contains(&s.task) {
            // Our registration is gone: the session must have expired; the watch will say so.
            return Ok(());
        }
        let Some(list) = s.store.read_shard_list().await? else {
            s.discovery_wanted |= s.is_leader;
            return Ok(());
        };
        let versioned = s.store.read_checkpoints().await?;
        let finished = versioned.values().filter(|c| c.value.finished).count();
        if finished != s.finished_seen {
            s.finished_seen = finished;
            // A shard finished somewhere: its children may need listing.
            s.discovery_wanted |= s.is_leader;
        }
        let cps: BTreeMap<String, Checkpoint> = versioned.iter().map(|(k, v)| (k.clone(), v.value.clone())).collect();
        let readable: Vec<String> =
            readable_shards(&list.value, &cps).into_iter().filter(|id| cps.contains_key(id)).collect();
        let assignment = assign(&tasks, &readable);
        // A deactivated task holds no shard: it hands everything back (after its in-flight tuples
        // are acked) so that an operator can rewind checkpoints, and re-acquires on activation.
        let active = *self.active.borrow();
        let mine: HashSet<&str> = if active {
            assignment.get(&s.task).map(|v| v.iter().map(String::as_str).collect()).unwrap_or_default()
        } else {
            HashSet::new()
        };
        // Hand off what is no longer ours.
        let to_release: Vec<Arc<str>> = s
            .owned
            .iter()
            .filter(|(id, o)| o.releasing.is_none() && !mine.contains(id.as_ref()))
            .map(|(id, _)| id.clone())
            .collect();
        let handoff = KinesisSpoutConfig::ms(self.cfg.handoff_timeout_ms);
        for shard in to_release {
            tracing::info!(task = %s.task, shard = %shard, "shard assigned elsewhere: handing it off");
            self.begin_release(s, &shard, handoff);
        }
        // Take what is ours and free.
        for shard in mine {
            if s.owned.contains_key(shard) {
                continue;
            }
            self.acquire(s, shard).await?;
        }
        Ok(())
    }

    async fn acquire(&self, s: &mut Session, shard: &str) -> Result<(), CoordError> {
        let lease = match s.store.try_acquire(shard).await? {
            Acquire::Acquired(lease) => lease,
            Acquire::HeldBy { holder_path, .. } => {
                tracing::debug!(shard, holder = %holder_path, "shard still held by its previous owner; waiting for the release");
                return Ok(());
            }
        };
        // Read the checkpoint only now: the previous owner wrote its last one before releasing.
        let Some(cp) = s.store.read_checkpoint(shard).await? else {
            s.store.release(lease).await?;
            return Ok(());
        };
        if cp.value.finished {
            s.store.release(lease).await?;
            s.dirty = true;
            return Ok(());
        }
        let id: Arc<str> = shard.into();
        let epoch = lock(&self.tracker).start(&id);
        let token = CancellationToken::new();
        let written = match &cp.value.position {
            CheckpointPosition::AfterSequence { sequence, .. } => Some(sequence.clone()),
            _ => None,
        };
        tracing::info!(task = %s.task, shard, from = %cp.value.position, "reading shard");
        self.reader.read_log.acquire(&s.task, shard, &cp.value.position.to_string());
        let reader_task =
            self.tasks.spawn(self.reader.clone().run(id.clone(), epoch, cp.value.position.clone(), token.clone()));
        s.owned.insert(
            id,
            Owned {
                lease,
                epoch,
                cp_version: cp.version,
                written,
                last_write: Instant::now(),
                reader: token,
                reader_task: Some(reader_task),
                releasing: None,
            },
        );
        Ok(())
    }

    fn begin_release(&self, s: &mut Session, shard: &Arc<str>, wait: Duration) {
        if let Some(o) = s.owned.get_mut(shard) {
            o.reader.cancel();
            let deadline = Instant::now() + wait;
            o.releasing = Some(o.releasing.map_or(deadline, |d| d.min(deadline)));
            let mut t = lock(&self.tracker);
            if let Some(tr) = t.get_mut(shard) {
                tr.stopping = true;
                tr.queued.clear();
            }
        }
    }

    /// Checkpoints, shard ends and releases. `force` writes every moved checkpoint now.
    async fn maintain(&self, s: &mut Session, force: bool) -> Result<(), CoordError> {
        let interval = KinesisSpoutConfig::ms(self.cfg.checkpoint_interval_ms);
        let ids: Vec<Arc<str>> = s.owned.keys().cloned().collect();
        for shard in ids {
            let (safe, ended_done, unsettled, last_emitted) = {
                let t = lock(&self.tracker);
                match t.get(&shard) {
                    Some(tr) => (
                        t.peek_checkpoint(&shard),
                        tr.ended && tr.queued.is_empty() && tr.inflight() == 0,
                        tr.unsettled(),
                        tr.last_emitted.clone(),
                    ),
                    None => (None, false, 0, None),
                }
            };
            let Some(o) = s.owned.get(&shard) else { continue };
            let releasing = o.releasing;
            if ended_done && releasing.is_none() {
                self.finish(s, &shard, last_emitted).await?;
                continue;
            }
            let moved = safe.as_deref().is_some_and(|seq| o.written.as_deref() != Some(seq));
            let release_now = releasing.is_some_and(|d| unsettled == 0 || Instant::now() >= d);
            if moved && (force || release_now || o.last_write.elapsed() >= interval) {
                if let Some(seq) = &safe {
                    if !self.write_checkpoint(s, &shard, seq).await? {
                        continue; // fenced: the shard was dropped
                    }
                }
            }
            if release_now {
                self.release(s, &shard).await?;
            }
        }
        Ok(())
    }

    /// Writes a fenced checkpoint. Ok(false) when fenced (the shard is dropped).
    async fn write_checkpoint(&self, s: &mut Session, shard: &Arc<str>, seq: &str) -> Result<bool, CoordError> {
        let Some(o) = s.owned.get_mut(shard) else { return Ok(false) };
        let cp = Checkpoint {
            position: CheckpointPosition::AfterSequence { sequence: seq.to_string(), sub_sequence: 0 },
            finished: false,
            updated_at_ms: now_ms(),
            writer: Some(s.task.clone()),
        };
        match s.store.write_checkpoint(&o.lease, &cp, o.cp_version).await {
            Ok(v) => {
                o.cp_version = v;
                o.written = Some(seq.to_string());
                o.last_write = Instant::now();
                Ok(true)
            }
            Err(
                e @ (CoordError::Fenced { .. }
                | CoordError::VersionConflict { .. }
                | CoordError::CheckpointBackwards { .. }),
            ) => {
                tracing::warn!(shard = %shard, error = %e, "checkpoint refused: this task no longer owns the shard; stopped reading it");
                if let Some(mut o) = s.owned.remove(shard) {
                    o.reader.cancel();
                    if let Some(h) = o.reader_task.take() {
                        let _ = tokio::time::timeout(Duration::from_secs(10), h).await;
                    }
                    let _ = s.store.release(o.lease).await;
                }
                lock(&self.tracker).remove(shard);
                self.reader.read_log.release(&s.task, shard);
                s.dirty = true;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// The shard was read to its end and everything of it acked: checkpoint it as finished (fenced),
    /// release it, and let the leader list the children.
    async fn finish(&self, s: &mut Session, shard: &Arc<str>, last: Option<Arc<str>>) -> Result<(), CoordError> {
        let Some(o) = s.owned.get(shard) else { return Ok(()) };
        let position = match last.map(|l| l.to_string()).or_else(|| o.written.clone()) {
            Some(sequence) => CheckpointPosition::AfterSequence { sequence, sub_sequence: 0 },
            None => CheckpointPosition::TrimHorizon,
        };
        let cp = Checkpoint { position, finished: true, updated_at_ms: now_ms(), writer: Some(s.task.clone()) };
        match s.store.write_checkpoint(&o.lease, &cp, o.cp_version).await {
            Ok(_) => {
                tracing::info!(task = %s.task, shard = %shard, "shard finished: read to its end and every record acked");
                self.reader.read_log.finish(&s.task, shard);
            }
            Err(
                e @ (CoordError::Fenced { .. }
                | CoordError::VersionConflict { .. }
                | CoordError::NoCheckpoint { .. }
                | CoordError::Malformed { .. }),
            ) => {
                tracing::warn!(shard = %shard, error = %e, "could not mark the shard finished; it will be read again");
            }
            Err(e) => return Err(e),
        }
        self.release(s, shard).await?;
        s.discovery_wanted = true;
        s.dirty = true;
        Ok(())
    }

    async fn release(&self, s: &mut Session, shard: &Arc<str>) -> Result<(), CoordError> {
        if let Some(mut o) = s.owned.remove(shard) {
            o.reader.cancel();
            // The reader must have stopped before another task may take the shard.
            if let Some(h) = o.reader_task.take() {
                let _ = tokio::time::timeout(Duration::from_secs(10), h).await;
            }
            lock(&self.tracker).remove(shard);
            lock(&self.reader.status).remove(shard);
            self.reader.read_log.release(&s.task, shard);
            s.store.release(o.lease).await?;
            tracing::info!(task = %s.task, shard = %shard, "shard released");
            s.dirty = true;
        }
        Ok(())
    }

    /// Leader only: ListShards, persist first-start positions and children's TRIM_HORIZON, and
    /// keep the shard list znode equal to the stream's shards.
    async fn discover(&self, s: &Session) -> Result<(), CoordError> {
        let label = self.reader.endpoint.clone();
        let shards = match kinesis::list_shards(&self.reader.client, &label, &self.cfg.stream).await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(stream = %self.cfg.stream, error = %e, "listing the stream's shards failed; retrying at the next discovery");
                return Ok(());
            }
        };
        let records: Vec<ShardRecord> = shards
            .iter()
            .map(|d| ShardRecord {
                shard_id: d.shard_id.clone(),
                parent_shard_id: d.parent_shard_id.clone(),
                adjacent_parent_shard_id: d.adjacent_parent_shard_id.clone(),
                starting_hash_key: d.starting_hash_key.clone(),
                ending_hash_key: d.ending_hash_key.clone(),
                closed: d.closed,
            })
            .collect();
        let list = ShardList::new(records, now_ms());
        let existing = s.store.read_shard_list().await?;
        let first_start = existing.is_none();
        let cps = s.store.read_checkpoints().await?;
        // Persist every starting position before the list names the shard.
        for sh in &list.shards {
            if cps.contains_key(&sh.shard_id) {
                continue;
            }
            let cp = if first_start {
                initial_checkpoint(self.cfg.initial_position, sh.closed)
            } else {
                Checkpoint::at(CheckpointPosition::TrimHorizon, now_ms())
            };
            let stored = s.store.init_checkpoint(&sh.shard_id, &cp).await?;
            tracing::info!(shard = %sh.shard_id, position = %stored.value.position, finished = stored.value.finished, "new shard: starting position persisted");
        }
        let unchanged = existing.as_ref().is_some_and(|e| e.value.shards == list.shards);
        if !unchanged {
            match s.store.write_shard_list(&list, existing.as_ref().map(|e| e.version)).await {
                Ok(_) => {
                    tracing::info!(stream = %self.cfg.stream, shards = list.shards.len(), "shard list updated in ZooKeeper")
                }
                Err(CoordError::VersionConflict { .. }) => {
                    tracing::debug!("shard list changed concurrently; will list again");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The checkpoint a shard gets at the topology's first start on the stream.
pub(crate) fn initial_checkpoint(pos: InitialPosition, closed: bool) -> Checkpoint {
    let now = now_ms();
    match pos {
        InitialPosition::TrimHorizon => Checkpoint::at(CheckpointPosition::TrimHorizon, now),
        InitialPosition::AtTimestamp { millis } => Checkpoint::at(CheckpointPosition::AtTimestamp { millis }, now),
        InitialPosition::Latest if closed => {
            // Nothing new will ever arrive in a closed shard: it is done.
            Checkpoint { finished: true, ..Checkpoint::at(CheckpointPosition::TrimHorizon, now) }
        }
        InitialPosition::Latest => Checkpoint::at(CheckpointPosition::AtTimestamp { millis: now }, now),
    }
}

enum SessionEnd {
    Shutdown,
    Lost,
}

async fn monitor_session(
    mut sw: crate::coord::SessionWatch,
    tx: watch::Sender<Health>,
    fetch: Arc<watch::Sender<bool>>,
    cancel: CancellationToken,
) {
    loop {
        let alarm = tokio::select! {
            _ = cancel.cancelled() => return,
            a = sw.wait_unsafe() => a,
        };
        match alarm {
            SessionAlarm::Terminal(_) => {
                fetch.send_replace(false);
                tracing::warn!("ZooKeeper session ended: stopped fetching");
                let _ = tx.send(Health::Lost);
                return;
            }
            SessionAlarm::DisconnectedTooLong => {
                // Stop the readers now: the coordinator's loop may be blocked in a ZooKeeper call.
                fetch.send_replace(false);
                tracing::warn!("ZooKeeper disconnected for more than half the session timeout: stopped fetching");
                let _ = tx.send(Health::Unsafe);
                loop {
                    let st = tokio::select! {
                        _ = cancel.cancelled() => return,
                        st = sw.changed() => st,
                    };
                    if st.is_terminal() {
                        fetch.send_replace(false);
                        let _ = tx.send(Health::Lost);
                        return;
                    }
                    if st == SessionStatus::Connected || st == SessionStatus::ConnectedReadOnly {
                        let _ = tx.send(Health::Ok);
                        break;
                    }
                }
            }
        }
    }
}
