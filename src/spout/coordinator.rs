//! The per-task side of coordination: registration, leases, reader lifecycle, fenced
//! checkpoints, shard end, handoff and session loss, for one spout task.
//!
//! It runs as one background task per spout task: a `select!` loop over the worker's
//! [`StreamView`] (session generation, health, assignment), lease and checkpoint watches, reader
//! events, control from the spout, and a short tick. The worker-level [`super::stream`]
//! coordinator decides who reads what; this loop only takes, reads and hands back its own shards.
//!
//! ZooKeeper requests it makes: a checkpoint write is one transaction; taking a free shard three
//! requests plus one checkpoint read; waiting for a shard another task still holds one `exists`
//! watch and no write; releasing one delete. Nothing per tick unless a checkpoint moved.
//!
//! # Committed watermark
//!
//! With `committed_watermark_interval_ms` > 0 (and not reading a stage's intermediate stream),
//! the task publishes its committed watermark ([`Tracker::task_committed_watermark`]) with the
//! generation of the assignment it last reconciled with, as a [`WatermarkReport`] in the EPHEMERAL
//! znode `streams/{stream}/watermarks/{task}` of its worker's session, while it is registered.
//! Cost: at most one `setData` per task per interval, and none while the report (generation,
//! watermark) is unchanged; the first report of a task node creates it (one more request, and one
//! more when the directory is missing). Unregistering (deactivation, shutdown) deletes it (one
//! request); a lost session takes it along. Readers: [`crate::coord::ZkStore::committed_watermark`].

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::config::KinesisSpoutConfig;
use super::reader::{ReaderCtx, ReaderEvent};
use super::stream::{StreamCommand, StreamHandle, StreamView};
use super::tracker::{SeqKey, Tracker};
use crate::coord::{
    Acquire, Checkpoint, CheckpointPosition, CoordError, Health, Lease, TaskInfo, Versioned, WatermarkReport, ZkStore,
    now_ms,
};

/// A shard this task holds a lease on.
struct Owned {
    lease: Lease,
    epoch: u64,
    /// The checkpoint as stored (last read or written), with its version.
    cp: Versioned<Checkpoint>,
    last_write: Instant,
    reader: CancellationToken,
    reader_task: Option<tokio::task::JoinHandle<()>>,
    /// Handoff in progress: release when nothing is in flight or at this deadline.
    releasing: Option<Instant>,
}

/// A shard assigned to this task that it cannot read now.
struct Blocked {
    /// Retry no earlier than this (a watch may wake it sooner), and no later, watch or not: a
    /// watch event can be lost (a disconnection, a watch that ended), so a watched shard is
    /// looked at again at `retry_at` too.
    retry_at: Instant,
    /// The cancel of its watch (lease holder or checkpoint), if any.
    watch: Option<CancellationToken>,
    /// Finished here: wait for the leader's next assignment (it drops the shard) instead of
    /// taking it again. The assignment generation it was blocked in.
    until_new_assignment: Option<u64>,
}

impl Blocked {
    /// Whether the shard is still to be left alone at `now`, under assignment `generation`.
    fn waiting(&self, now: Instant, generation: Option<u64>) -> bool {
        match self.until_new_assignment {
            Some(g) => Some(g) == generation && now < self.retry_at,
            None => now < self.retry_at,
        }
    }
}

/// Why a blocked shard wakes up.
#[derive(Debug)]
enum Wake {
    /// The lease it waited for is gone, or its checkpoint changed.
    Shard(Arc<str>),
}

pub(crate) struct Coordinator {
    pub cfg: Arc<KinesisSpoutConfig>,
    pub info: TaskInfo,
    pub tracker: Arc<Mutex<Tracker>>,
    pub reader: Arc<ReaderCtx>,
    pub reader_events: mpsc::UnboundedReceiver<ReaderEvent>,
    /// Desired activation (from the spout's activate/deactivate).
    pub active: watch::Receiver<bool>,
    /// What the readers obey: active, registered and session healthy.
    pub fetch_allowed: Arc<watch::Sender<bool>>,
    /// The task's ZooKeeper node name, published for the spout (status, logs).
    pub task_name: Arc<Mutex<String>>,
    /// Readers and helpers: owned, awaited before `run` returns.
    pub tasks: tokio_util::task::TaskTracker,
    /// The worker's stream coordinator (shared by its tasks).
    pub stream: Arc<StreamHandle>,
    /// The worker's session, followed directly (not through the stream coordinator, which may
    /// be waiting on ZooKeeper) to close the readers' gate the moment it turns unsafe.
    pub session: watch::Receiver<crate::coord::SessionView>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// This task in one session generation: its registration, and everything it holds there.
struct Session {
    generation: u64,
    store: ZkStore,
    /// The task node name (the last one, while it hands shards back after unregistering).
    task: String,
    /// Registered now. A deactivated task unregisters, so the leader assigns nothing to it; it
    /// registers again (a new name) once active and holding nothing.
    registered: bool,
    owned: HashMap<Arc<str>, Owned>,
    blocked: HashMap<Arc<str>, Blocked>,
    /// Leases whose delete failed (or whose create's outcome is unknown): removed at the next
    /// ticks until ZooKeeper confirms, so no lease ever outlives its use.
    cleanup: BTreeSet<Arc<str>>,
    /// The id of a registration whose create failed with an unknown outcome: the server may have
    /// created its node. Looked up (adopted or removed) before this task registers again.
    unconfirmed_registration: Option<String>,
    /// The delete of this task's node failed with an unknown outcome (its answer lost): the task
    /// may no longer be registered though `registered` says so. Looked up before anything else
    /// once active again; deleted again while deactivated.
    unconfirmed_unregistration: bool,
    pending_release: Vec<Lease>,
    /// The generation of the assignment last reconciled with.
    assignment_generation: Option<u64>,
    /// The committed watermark report last published by this task node, and when.
    report: Option<Reported>,
    last_warn: Option<(String, Instant)>,
}

/// A committed watermark report written (or attempted: a failed write waits for the interval too).
struct Reported {
    /// (generation, watermark) of the last successful write; `None` after a failed first write.
    written: Option<(u64, Option<i64>)>,
    at: Instant,
}

/// How a session of this task ended.
enum End {
    Shutdown,
    Lost,
}

impl Coordinator {
    /// Runs until `cancel`; then hands every shard back (final checkpoint, release) and removes
    /// its registration.
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut view_rx = self.stream.view.clone();
        let (wake_tx, mut wake_rx) = mpsc::unbounded_channel::<Wake>();
        // Close the readers' gate at once when the session turns unsafe, even while this loop
        // waits on ZooKeeper.
        self.tasks.spawn(guard_fetch(self.session.clone(), self.fetch_allowed.clone(), cancel.clone()));
        loop {
            // A session of the current generation.
            let mut s = loop {
                let view = view_rx.borrow_and_update().clone();
                self.set_fetch(false);
                if let (Some(store), Health::Ok) = (&view.store, &view.health) {
                    break Session {
                        generation: view.generation,
                        store: store.clone(),
                        task: String::new(),
                        registered: false,
                        owned: HashMap::new(),
                        blocked: HashMap::new(),
                        cleanup: BTreeSet::new(),
                        unconfirmed_registration: None,
                        unconfirmed_unregistration: false,
                        pending_release: Vec::new(),
                        assignment_generation: None,
                        report: None,
                        last_warn: None,
                    };
                }
                tokio::select! {
                    _ = cancel.cancelled() => {
                        self.tasks.close();
                        self.tasks.wait().await;
                        return;
                    }
                    r = view_rx.changed() => if r.is_err() { return },
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            };
            lock(&self.tracker).set_session_generation(Some(s.generation));
            let end = self.run_session(&mut s, &mut view_rx, &wake_tx, &mut wake_rx, &cancel).await;
            lock(&self.tracker).set_session_generation(None);
            match end {
                End::Shutdown => {
                    self.shutdown(&mut s).await;
                    self.set_fetch(false);
                    self.tasks.close();
                    self.tasks.wait().await;
                    return;
                }
                End::Lost => {
                    tracing::warn!(task = %s.task, "ZooKeeper session lost: stopped reading every shard; re-registering and re-acquiring");
                    self.last_attempt(&mut s).await;
                    self.drop_everything(&mut s).await;
                    // Wait for the next session's view (never spin on the lost one's store).
                    while view_rx.borrow().generation == s.generation {
                        tokio::select! {
                            _ = cancel.cancelled() => break,
                            r = view_rx.changed() => if r.is_err() { return },
                            _ = tokio::time::sleep(Duration::from_millis(500)) => break,
                        }
                    }
                }
            }
        }
    }

    /// Registers (active, holding nothing) or unregisters (deactivated) as needed.
    ///
    /// A registration whose create failed may still have been applied by the server (its answer
    /// lost with the connection): its id is kept and the node looked up first, then adopted (or
    /// removed, when the task is deactivated meanwhile), so a session never holds a second, ghost
    /// registration of one task.
    async fn registration(&self, s: &mut Session) -> Result<(), CoordError> {
        let active = *self.active.borrow();
        if active && s.registered && s.unconfirmed_unregistration {
            // Activated again after an unregistration whose answer was lost: if the server
            // applied it, the task is not registered (the leader assigns it nothing, and its
            // watermark, unknown without an assignment, would hold back everything downstream
            // for good); it registers again below.
            if s.store.task_exists(&s.task).await? {
                tracing::info!(task = %s.task, "an unregistration whose answer was lost was not applied: still registered");
            } else {
                tracing::info!(task = %s.task, "an unregistration whose answer was lost was applied: registering again");
                self.unregistered(s).await;
            }
            s.unconfirmed_unregistration = false;
        }
        if active && !s.registered && s.owned.is_empty() && s.pending_release.is_empty() && s.cleanup.is_empty() {
            let adopted = match s.unconfirmed_registration.clone() {
                Some(token) => s.store.find_task(&token).await?,
                None => None,
            };
            let task = match adopted {
                Some(task) => {
                    tracing::info!(task = %task, "a registration whose answer was lost was applied: adopting its node");
                    s.unconfirmed_registration = None;
                    task
                }
                None => {
                    let token = registration_token();
                    s.unconfirmed_registration = Some(token.clone());
                    let info = TaskInfo { since_ms: now_ms(), ..self.info.clone() };
                    let task = s.store.register_task(&info, &token).await?;
                    s.unconfirmed_registration = None;
                    task
                }
            };
            *lock(&self.task_name) = task.clone();
            let _ =
                self.stream.commands.send(StreamCommand::Registered { generation: s.generation, task: task.clone() });
            tracing::info!(topology = %self.cfg.topology, stream = %self.cfg.stream, task = %task, "spout task registered");
            s.task = task;
            s.registered = true;
            s.report = None;
        } else if !active && s.registered {
            // The leader moves its shards to active tasks (they wait on the leases, which are
            // released once in-flight tuples are acked and checkpointed).
            // (a delete of a node already gone succeeds: retrying after a lost answer is safe)
            s.unconfirmed_unregistration = true;
            s.store.unregister_task(&s.task).await?;
            s.unconfirmed_unregistration = false;
            self.unregistered(s).await;
            tracing::info!(task = %s.task, "spout task deactivated: unregistered, handing its shards back");
        } else if !active && let Some(token) = s.unconfirmed_registration.clone() {
            if let Some(stray) = s.store.find_task(&token).await? {
                s.store.unregister_task(&stray).await?;
                tracing::info!(task = %stray, "removed a registration whose answer was lost (the task is deactivated)");
            }
            s.unconfirmed_registration = None;
        }
        Ok(())
    }

    /// Notes that the task's node is gone: no committed watermark report, and the stream
    /// coordinator forgets the task.
    async fn unregistered(&self, s: &mut Session) {
        s.registered = false;
        self.remove_report(s).await;
        let _ = self.stream.commands.send(StreamCommand::Unregistered { task: s.task.clone() });
    }

    /// Publishes how many leases the task holds (the metrics endpoint reads it).
    fn publish_leases(&self, s: &Session) {
        self.reader.stats.leases_held.store(s.owned.len() as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Publishes the task's committed watermark report when it is due (see the module docs): at
    /// most once per `committed_watermark_interval_ms`, and only when (generation, watermark)
    /// changed since the last write. Only while registered: the report covers what the assignment
    /// of `s.assignment_generation` gives this task node, which is what the tracker tracks once
    /// reconciled with it.
    async fn publish_watermark(&self, s: &mut Session) -> Result<(), CoordError> {
        let interval = self.cfg.committed_watermark_interval_ms;
        if interval == 0 || self.cfg.stage_input || !s.registered || !*self.active.borrow() {
            return Ok(());
        }
        let Some(generation) = s.assignment_generation else { return Ok(()) };
        if s.report.as_ref().is_some_and(|r| r.at.elapsed() < KinesisSpoutConfig::ms(interval)) {
            return Ok(());
        }
        let idle = KinesisSpoutConfig::ms(self.cfg.watermark_idle_timeout_ms);
        // on the service's clock as far as it is known (see `ShardSource::watermark_now`)
        let now = self.reader.source.watermark_now();
        let watermark = lock(&self.tracker).task_committed_watermark(idle, now);
        let written = s.report.as_ref().and_then(|r| r.written);
        if written == Some((generation, watermark)) {
            return Ok(());
        }
        let report = WatermarkReport { generation, watermark_ms: watermark, updated_at_ms: now };
        s.report = Some(Reported { written, at: Instant::now() });
        s.store.publish_watermark(&s.task, &report).await?;
        s.report = Some(Reported { written: Some((generation, watermark)), at: Instant::now() });
        Ok(())
    }

    /// Deletes the task node's committed watermark report (after unregistering). A failure is only
    /// logged: the node is ephemeral, and a stale report stays true of the generation it names.
    async fn remove_report(&self, s: &mut Session) {
        if s.report.take().is_none() {
            return;
        }
        if let Err(e) = s.store.remove_watermark(&s.task).await {
            tracing::warn!(task = %s.task, error = %e, "removing the committed watermark report failed; it goes with the session");
        }
    }

    fn set_fetch(&self, allowed: bool) {
        self.fetch_allowed.send_if_modified(|v| {
            let changed = *v != allowed;
            *v = allowed;
            changed
        });
    }

    async fn run_session(
        &mut self,
        s: &mut Session,
        view_rx: &mut watch::Receiver<Arc<StreamView>>,
        wake_tx: &mpsc::UnboundedSender<Wake>,
        wake_rx: &mut mpsc::UnboundedReceiver<Wake>,
        cancel: &CancellationToken,
    ) -> End {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let resync = KinesisSpoutConfig::ms(self.cfg.resync_interval_ms);
        let mut last_reconcile = Instant::now();
        let mut reconcile = true;
        loop {
            let view = view_rx.borrow_and_update().clone();
            if view.generation != s.generation || view.store.is_none() {
                return if cancel.is_cancelled() { End::Shutdown } else { End::Lost };
            }
            let healthy = view.health == Health::Ok && self.session.borrow().health == Health::Ok;
            self.set_fetch(healthy && *self.active.borrow());
            if healthy {
                let mut first_err: Option<CoordError> = None;
                let was = s.registered;
                if let Err(e) = self.registration(s).await {
                    first_err.get_or_insert(e);
                }
                reconcile |= was != s.registered;
                if reconcile || last_reconcile.elapsed() >= resync {
                    reconcile = false;
                    last_reconcile = Instant::now();
                    if let Err(e) = self.reconcile(s, &view, wake_tx).await {
                        first_err.get_or_insert(e);
                    }
                }
                let held = s.owned.len();
                if let Err(e) = self.maintain(s, false).await {
                    first_err.get_or_insert(e);
                }
                // A shard handed back may be this task's again already (the assignment moved it
                // back while its handoff waited for in-flight tuples): look at once, not at the
                // next event or resync.
                reconcile |= s.owned.len() < held;
                self.clean_up(s).await;
                self.publish_leases(s);
                if let Err(e) = self.publish_watermark(s).await {
                    if e.is_session_lost() {
                        return if cancel.is_cancelled() { End::Shutdown } else { End::Lost };
                    }
                    warn_once(s, &format!("publishing the committed watermark failed; retrying: {e}"));
                }
                if let Some(e) = first_err {
                    if e.is_session_lost() {
                        return if cancel.is_cancelled() { End::Shutdown } else { End::Lost };
                    }
                    warn_once(s, &format!("coordination step failed; retrying: {e}"));
                    reconcile = true;
                }
            }
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return End::Shutdown,
                r = view_rx.changed() => {
                    if r.is_err() { return End::Shutdown; }
                    reconcile = true;
                }
                Some(Wake::Shard(shard)) = wake_rx.recv() => {
                    if let Some(b) = s.blocked.get_mut(&shard) {
                        b.retry_at = Instant::now();
                        b.watch = None;
                    }
                    reconcile = true;
                }
                ev = self.reader_events.recv() => {
                    if let Some(ReaderEvent::Ended { shard, epoch, children }) = ev
                        && s.owned.get(&shard).is_some_and(|o| o.epoch == epoch) {
                            tracing::debug!(shard = %shard, ?children, "shard end reported");
                            let _ = self.stream.commands.send(StreamCommand::ShardEnded);
                        }
                }
                r = self.active.changed() => {
                    if r.is_ok() { reconcile = true; }
                }
                _ = tick.tick() => {
                    if s.blocked.values().any(|b| Instant::now() >= b.retry_at) {
                        reconcile = true;
                    }
                }
            }
        }
    }

    /// Takes what the assignment gives this task and hands back the rest.
    async fn reconcile(
        &self,
        s: &mut Session,
        view: &StreamView,
        wake_tx: &mpsc::UnboundedSender<Wake>,
    ) -> Result<(), CoordError> {
        let active = *self.active.borrow();
        // A deactivated task holds no shard: it hands everything back (after its in-flight tuples
        // are acked) so an operator can rewind checkpoints; it re-acquires on activation.
        let mine: BTreeSet<Arc<str>> = match &view.assignment {
            Some(a) if active && s.registered && a.error.is_none() => {
                a.shards_of(&s.task).iter().map(|x| Arc::from(x.as_str())).collect()
            }
            _ => BTreeSet::new(),
        };
        match assigned_share(view.assignment.as_deref(), &s.task, s.registered, active) {
            Some(Some(n)) => lock(&self.tracker).set_assigned(n),
            Some(None) => lock(&self.tracker).set_assignment_unknown(),
            None => {}
        }
        let handoff = KinesisSpoutConfig::ms(self.cfg.handoff_timeout_ms);
        let to_release: Vec<Arc<str>> = s
            .owned
            .iter()
            .filter(|(id, o)| o.releasing.is_none() && !mine.contains(*id))
            .map(|(id, _)| id.clone())
            .collect();
        for shard in to_release {
            tracing::info!(task = %s.task, shard = %shard, "shard assigned elsewhere: handing it off");
            self.begin_release(s, &shard, handoff);
        }
        // Forget waits on shards that are no longer ours.
        s.blocked.retain(|id, b| {
            let keep = mine.contains(id);
            if !keep {
                if let Some(w) = &b.watch {
                    w.cancel();
                }
                lock(&self.reader.status).remove(id);
            }
            keep
        });
        let now = Instant::now();
        let generation = view.assignment.as_ref().map(|a| a.generation);
        s.assignment_generation = generation;
        for shard in mine {
            if s.owned.contains_key(&shard) || s.cleanup.contains(&shard) {
                continue;
            }
            let waiting = s.blocked.get(&shard).is_some_and(|b| b.waiting(now, generation));
            if waiting {
                continue;
            }
            if let Err(e) = self.acquire(s, &shard, wake_tx).await {
                if e.is_session_lost() {
                    return Err(e);
                }
                // The create may have happened: remove our lease before trying again.
                s.cleanup.insert(shard.clone());
                block(s, &shard, Duration::from_secs(1), None);
                warn_once(s, &format!("taking shard {shard} failed; retrying: {e}"));
            }
        }
        Ok(())
    }

    async fn acquire(
        &self,
        s: &mut Session,
        shard: &Arc<str>,
        wake_tx: &mpsc::UnboundedSender<Wake>,
    ) -> Result<(), CoordError> {
        // The shard's hash key range goes with its tuples (exactly-once state scopes production
        // floors by it and tells a shard's ancestors by it): learn it before taking the shard, from
        // the task's cache of ListShards (listed once per new shard). While ListShards fails the
        // shard waits, as a shard the leader has not listed yet does.
        let range = match self.reader.hash_range(shard).await {
            Ok(r) => r.map(|r| Arc::from(format!("{}-{}", r.start, r.end))),
            Err(e) => {
                let msg = format!(
                    "the hash key range of shard {shard} of stream {} is unknown (ListShards failed); it is taken once \
                     known: {e}",
                    self.cfg.stream
                );
                {
                    let mut st = lock(&self.reader.status);
                    let entry = st.entry(shard.clone()).or_default();
                    if entry.last_error.as_deref() != Some(e.to_string().as_str()) {
                        entry.errors += 1;
                    }
                    entry.last_error = Some(e.to_string());
                    entry.retryable = Some(true);
                    entry.error_since_ms.get_or_insert(now_ms());
                }
                block(s, shard, Duration::from_secs(1), None);
                warn_once(s, &msg);
                return Ok(());
            }
        };
        // A holder that vanished while we looked gets one more try at once.
        for _ in 0..3 {
            let lease = match s.store.try_acquire(shard, &s.task).await? {
                Acquire::Acquired(lease) => lease,
                Acquire::HeldBy { holder_path, .. } => {
                    // Wait with one watch on the holder's lease: no writes until it goes.
                    match s.store.watch_lease(&holder_path).await? {
                        None => continue,
                        Some(watcher) => {
                            tracing::debug!(shard = %shard, holder = %holder_path, "shard still held by its previous owner; waiting for its release");
                            let token = self.wake_on(watcher, shard, wake_tx);
                            block(s, shard, Duration::from_secs(3600), Some(token));
                            return Ok(());
                        }
                    }
                }
            };
            // Read the checkpoint only now: the previous owner wrote its last one before releasing.
            let cp = match s.store.read_checkpoint(shard).await {
                Ok(Some(cp)) => cp,
                Ok(None) => {
                    // The leader persists starting positions before it assigns, so the checkpoint
                    // was deleted since (an operator's repair of a broken one): the shard starts
                    // over from TRIM_HORIZON, like any shard found later. Create-if-absent, so a
                    // concurrent decision wins.
                    let start = Checkpoint::at(CheckpointPosition::TrimHorizon, now_ms());
                    match s.store.init_checkpoint(shard, &start).await {
                        Ok(cp) => {
                            tracing::warn!(shard = %shard, position = %cp.value.position, "the shard's checkpoint was missing: it starts over from there");
                            cp
                        }
                        Err(e) => {
                            self.release_lease(s, lease).await;
                            return Err(e);
                        }
                    }
                }
                Err(e @ CoordError::Malformed { .. }) => {
                    // Only this shard stops: its error shows in `squall status`, every other shard
                    // flows, and a fix of the znode wakes it up.
                    self.release_lease(s, lease).await;
                    tracing::error!(task = %s.task, shard = %shard, error = %e, "cannot read this shard until its checkpoint is repaired");
                    {
                        let mut st = lock(&self.reader.status);
                        let entry = st.entry(shard.clone()).or_default();
                        if entry.last_error.as_deref() != Some(e.to_string().as_str()) {
                            entry.errors += 1;
                        }
                        entry.last_error = Some(e.to_string());
                        entry.retryable = Some(false);
                        entry.error_since_ms.get_or_insert(now_ms());
                    }
                    let watch = s.store.watch_checkpoint(shard).await.ok().map(|w| self.wake_on(w, shard, wake_tx));
                    // Look again every 30 s even without a change (the watch is one-shot).
                    block(s, shard, Duration::from_secs(30), watch);
                    return Ok(());
                }
                Err(e) => {
                    self.release_lease(s, lease).await;
                    return Err(e);
                }
            };
            if cp.value.finished {
                self.release_lease(s, lease).await;
                block_until_reassigned(s, shard);
                return Ok(());
            }
            s.blocked.remove(shard);
            lock(&self.reader.status).remove(shard);
            let floor = match &cp.value.position {
                CheckpointPosition::AfterSequence { sequence, sub_sequence } => {
                    Some(SeqKey(Arc::from(sequence.as_str()), *sub_sequence))
                }
                _ => None,
            };
            let epoch = lock(&self.tracker).start_owned(shard, lease_token(&lease.path), floor);
            lock(&self.tracker).set_range(shard, epoch, range.clone());
            let token = CancellationToken::new();
            tracing::info!(task = %s.task, stream = %self.cfg.stream, shard = %shard, from = %cp.value.position, "reading shard");
            self.reader.read_log.acquire(&s.task, shard, &cp.value.position.to_string());
            let reader_task = self.tasks.spawn(self.reader.clone().run(
                shard.clone(),
                epoch,
                cp.value.position.clone(),
                token.clone(),
            ));
            s.owned.insert(
                shard.clone(),
                Owned {
                    lease,
                    epoch,
                    cp,
                    last_write: Instant::now(),
                    reader: token,
                    reader_task: Some(reader_task),
                    releasing: None,
                },
            );
            return Ok(());
        }
        block(s, shard, Duration::from_millis(200), None);
        Ok(())
    }

    /// Wakes the shard when `watcher` fires (a lease went, a checkpoint changed); the returned
    /// token cancels the wait.
    fn wake_on(
        &self,
        watcher: crate::coord::zkapi::OneshotWatch,
        shard: &Arc<str>,
        wake_tx: &mpsc::UnboundedSender<Wake>,
    ) -> CancellationToken {
        let token = CancellationToken::new();
        let (t, tx, id) = (token.clone(), wake_tx.clone(), shard.clone());
        self.tasks.spawn(async move {
            tokio::select! {
                _ = t.cancelled() => {}
                _ = watcher.changed() => { let _ = tx.send(Wake::Shard(id)); }
            }
        });
        token
    }

    /// Deletes a lease; on failure it is retried by [`Coordinator::clean_up`] until it is gone.
    async fn release_lease(&self, s: &mut Session, lease: Lease) {
        if let Err(e) = s.store.release(lease.clone()).await {
            tracing::warn!(shard = %lease.shard_id, lease = %lease.path, error = %e, "releasing the lease failed; retrying");
            s.pending_release.push(lease);
        }
    }

    /// Retries failed lease deletes and removes leases left by failed acquisitions.
    async fn clean_up(&self, s: &mut Session) {
        let pending = std::mem::take(&mut s.pending_release);
        for lease in pending {
            if s.store.release(lease.clone()).await.is_err() {
                s.pending_release.push(lease);
            }
        }
        let shards: Vec<Arc<str>> = s.cleanup.iter().filter(|id| !s.owned.contains_key(*id)).cloned().collect();
        for shard in shards {
            if let Ok(n) = s.store.cleanup_leases(&shard, &s.task).await {
                if n > 0 {
                    tracing::info!(shard = %shard, leases = n, "removed a lease left by a failed acquisition");
                }
                s.cleanup.remove(&shard);
            }
        }
    }

    /// Session lost: one last fenced attempt to save what was acked. With the session gone it is
    /// refused (that is the fencing: a worker that lost its session never writes again), and the
    /// log says, per shard, from where the next owner will deliver again.
    async fn last_attempt(&self, s: &mut Session) {
        let ids: Vec<Arc<str>> = s.owned.keys().cloned().collect();
        for shard in ids {
            let Some(o) = s.owned.get(&shard) else { continue };
            let safe = lock(&self.tracker).peek_checkpoint(&shard);
            let position = match safe {
                Some(SeqKey(seq, sub)) => {
                    CheckpointPosition::AfterSequence { sequence: seq.to_string(), sub_sequence: sub }
                }
                None => o.cp.value.position.clone(),
            };
            let cp = Checkpoint { position, finished: false, updated_at_ms: now_ms(), writer: Some(s.task.clone()) };
            match s.store.write_checkpoint(&o.lease, &cp, &o.cp).await {
                Ok(_) => tracing::info!(shard = %shard, "checkpoint written after the session loss"),
                Err(e) => tracing::warn!(
                    task = %s.task, shard = %shard, error = %e,
                    "checkpoint refused after the session loss: the next owner delivers again after {}",
                    o.cp.value.position
                ),
            }
        }
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
        for (_, b) in s.blocked.drain() {
            if let Some(w) = b.watch {
                w.cancel();
            }
        }
        lock(&self.reader.status).clear();
        self.publish_leases(s);
    }

    /// Graceful stop: final checkpoints of what was acked, release every lease, unregister.
    async fn shutdown(&self, s: &mut Session) {
        let shards: Vec<Arc<str>> = s.owned.keys().cloned().collect();
        for shard in &shards {
            self.begin_release(s, shard, Duration::ZERO);
        }
        if let Err(e) = self.maintain(s, true).await {
            tracing::warn!(error = %e, "final checkpoints at shutdown failed; the next owner resumes from the last written ones");
        }
        self.drop_everything(s).await;
        for _ in 0..3 {
            self.clean_up(s).await;
            if s.pending_release.is_empty() && s.cleanup.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if s.registered {
            if let Err(e) = s.store.unregister_task(&s.task).await {
                tracing::warn!(task = %s.task, error = %e, "removing the task registration failed; it goes with the session");
            }
            self.remove_report(s).await;
            let _ = self.stream.commands.send(StreamCommand::Unregistered { task: s.task.clone() });
        }
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
    ///
    /// Shards are taken in order, each on its own: one shard's error (other than a lost
    /// session, which ends them all) does not keep the others from their checkpoints and
    /// releases this tick; the first is returned once every shard had its turn.
    async fn maintain(&self, s: &mut Session, force: bool) -> Result<(), CoordError> {
        let mut ids: Vec<Arc<str>> = s.owned.keys().cloned().collect();
        ids.sort();
        let mut first_err = None;
        for shard in ids {
            if let Err(e) = self.maintain_shard(s, &shard, force).await {
                if e.is_session_lost() {
                    return Err(e);
                }
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    async fn maintain_shard(&self, s: &mut Session, shard: &Arc<str>, force: bool) -> Result<(), CoordError> {
        let interval = KinesisSpoutConfig::ms(self.cfg.checkpoint_interval_ms);
        let (safe, ended_done, unsettled, last_emitted) = {
            let t = lock(&self.tracker);
            match t.get(shard) {
                Some(tr) => (
                    t.peek_checkpoint(shard),
                    tr.ended && tr.queued.is_empty() && tr.inflight() == 0,
                    tr.unsettled(),
                    tr.last_emitted.clone(),
                ),
                None => (None, false, 0, None),
            }
        };
        let Some(o) = s.owned.get(shard) else { return Ok(()) };
        let releasing = o.releasing;
        if ended_done && releasing.is_none() {
            return self.finish(s, shard, last_emitted).await;
        }
        let written = match &o.cp.value.position {
            CheckpointPosition::AfterSequence { sequence, sub_sequence } => Some((sequence.as_str(), *sub_sequence)),
            _ => None,
        };
        let moved = safe.as_ref().is_some_and(|k| written != Some((&*k.0, k.1)));
        let release_now = releasing.is_some_and(|d| unsettled == 0 || Instant::now() >= d);
        if moved
            && (force || release_now || o.last_write.elapsed() >= interval)
            && let Some(seq) = &safe
            && !self.write_checkpoint(s, shard, seq).await?
        {
            return Ok(()); // fenced: the shard was dropped
        }
        if release_now {
            self.release(s, shard).await;
        }
        Ok(())
    }

    /// Writes a fenced checkpoint. Ok(false) when fenced (the shard is dropped).
    async fn write_checkpoint(&self, s: &mut Session, shard: &Arc<str>, at: &SeqKey) -> Result<bool, CoordError> {
        let Some(o) = s.owned.get_mut(shard) else { return Ok(false) };
        let cp = Checkpoint {
            position: CheckpointPosition::AfterSequence { sequence: at.0.to_string(), sub_sequence: at.1 },
            finished: false,
            updated_at_ms: now_ms(),
            writer: Some(s.task.clone()),
        };
        match s.store.write_checkpoint(&o.lease, &cp, &o.cp).await {
            Ok(v) => {
                o.cp = Versioned { value: cp, version: v };
                o.last_write = Instant::now();
                let at = now_ms();
                self.reader.set_status(shard, |st| st.last_checkpoint_ms = Some(at));
                Ok(true)
            }
            Err(
                e @ (CoordError::Fenced { .. }
                | CoordError::VersionConflict { .. }
                | CoordError::CheckpointBackwards { .. }
                | CoordError::NoCheckpoint { .. }),
            ) => {
                tracing::warn!(shard = %shard, error = %e, "checkpoint refused: this task no longer owns the shard; stopped reading it");
                if let Some(mut o) = s.owned.remove(shard) {
                    o.reader.cancel();
                    if let Some(h) = o.reader_task.take() {
                        let _ = tokio::time::timeout(Duration::from_secs(10), h).await;
                    }
                    self.release_lease(s, o.lease).await;
                }
                lock(&self.tracker).remove(shard);
                lock(&self.reader.status).remove(shard);
                self.reader.read_log.release(&s.task, shard);
                block(s, shard, Duration::from_secs(1), None);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// The shard was read to its end and everything of it acked: checkpoint it as finished (fenced;
    /// the same transaction creates its `finished/` marker, which the leader watches), release it.
    async fn finish(&self, s: &mut Session, shard: &Arc<str>, last: Option<SeqKey>) -> Result<(), CoordError> {
        let Some(o) = s.owned.get(shard) else { return Ok(()) };
        let position = match last {
            Some(SeqKey(sequence, sub_sequence)) => {
                CheckpointPosition::AfterSequence { sequence: sequence.to_string(), sub_sequence }
            }
            None => o.cp.value.position.clone(),
        };
        let cp = Checkpoint { position, finished: true, updated_at_ms: now_ms(), writer: Some(s.task.clone()) };
        match s.store.write_checkpoint(&o.lease, &cp, &o.cp).await {
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
        self.release(s, shard).await;
        // The leader drops it from the assignment; do not take it back meanwhile.
        block_until_reassigned(s, shard);
        Ok(())
    }

    async fn release(&self, s: &mut Session, shard: &Arc<str>) {
        if let Some(mut o) = s.owned.remove(shard) {
            o.reader.cancel();
            // The reader must have stopped before another task may take the shard.
            if let Some(h) = o.reader_task.take() {
                let _ = tokio::time::timeout(Duration::from_secs(10), h).await;
            }
            lock(&self.tracker).remove(shard);
            lock(&self.reader.status).remove(shard);
            self.reader.read_log.release(&s.task, shard);
            self.release_lease(s, o.lease).await;
            tracing::info!(task = %s.task, shard = %shard, "shard released");
        }
    }
}

fn block(s: &mut Session, shard: &Arc<str>, wait: Duration, watch: Option<CancellationToken>) {
    let b = Blocked { retry_at: Instant::now() + wait, watch, until_new_assignment: None };
    if let Some(old) = s.blocked.insert(shard.clone(), b)
        && let Some(w) = old.watch
    {
        w.cancel();
    }
}

/// A shard finished here: not taken again until the leader wrote a new assignment (which no
/// longer names it), and at the latest looked at again after 30 s.
fn block_until_reassigned(s: &mut Session, shard: &Arc<str>) {
    let b = Blocked {
        retry_at: Instant::now() + Duration::from_secs(30),
        watch: None,
        until_new_assignment: s.assignment_generation,
    };
    if let Some(old) = s.blocked.insert(shard.clone(), b)
        && let Some(w) = old.watch
    {
        w.cancel();
    }
}

fn warn_once(s: &mut Session, msg: &str) {
    // The same failure repeats every tick: say it once per 10 s.
    if s.last_warn.as_ref().is_none_or(|(m, t)| m != msg || t.elapsed() >= Duration::from_secs(10)) {
        tracing::warn!(task = %s.task, "{msg}");
        s.last_warn = Some((msg.to_string(), Instant::now()));
    }
}

/// Closes the readers' gate as soon as the session is not healthy (the coordinator re-opens it).
async fn guard_fetch(
    mut view: watch::Receiver<crate::coord::SessionView>,
    fetch: Arc<watch::Sender<bool>>,
    cancel: CancellationToken,
) {
    loop {
        if view.borrow_and_update().health != Health::Ok {
            fetch.send_if_modified(|v| std::mem::replace(v, false));
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = view.changed() => if r.is_err() { return },
        }
    }
}

/// A fresh id for one registration attempt (`TaskInfo::registration`).
pub(crate) fn registration_token() -> String {
    crate::random::hex_id(32)
}

/// The sequencer token of a lease: the sequential number ZooKeeper appended to its znode name
/// (`.../lease-{holder}-0000000042` -> 42). Sequential numbers under one parent only grow, so a
/// later owner of a shard always holds a higher token. 0 when the name carries none.
pub(crate) fn lease_token(path: &str) -> u64 {
    let digits = path.rsplit('-').next().unwrap_or("");
    digits.parse().unwrap_or(0)
}

/// What the assignment says of a task's share, for its watermark ([`Tracker::set_assigned`]):
/// `Some(Some(n))` its shard count; `Some(None)` unknown; `None` nothing read yet (leave it).
///
/// A deactivated task holds nothing (0), and so does every task under an assignment with an
/// error (every task stops reading). A task the assignment does not list, or not registered under
/// its current session, is unknown, not 0: after a session expiry the assignment read under the
/// new session is the one the leader wrote without this task, and 0 would let its watermark jump
/// to `now - idle` and fire what its windows hold of shards read under the lost session: a
/// zombie handing windows on after it resumed (`stage_watermark_drain`, zombie writer). A task
/// becomes known once the leader listed it.
pub(crate) fn assigned_share(
    assignment: Option<&crate::coord::Assignment>,
    task: &str,
    registered: bool,
    active: bool,
) -> Option<Option<usize>> {
    if !active {
        return Some(Some(0));
    }
    let a = assignment?;
    if a.error.is_some() {
        return Some(Some(0));
    }
    if !registered {
        return Some(None);
    }
    Some(a.tasks.get(task).map(Vec::len))
}

#[cfg(test)]
mod assigned_share_tests {
    use super::assigned_share;
    use crate::coord::Assignment;

    #[test]
    fn a_task_the_assignment_does_not_list_has_an_unknown_share_not_zero() {
        let a = Assignment {
            tasks: [("task-1".to_string(), vec!["s0".to_string()]), ("task-2".to_string(), vec![])].into(),
            ..Assignment::default()
        };
        assert_eq!(assigned_share(Some(&a), "task-1", true, true), Some(Some(1)));
        assert_eq!(assigned_share(Some(&a), "task-2", true, true), Some(Some(0)), "listed with no shard: 0");
        assert_eq!(
            assigned_share(Some(&a), "task-3", true, true),
            Some(None),
            "registered after the assignment was written (a new session's task): unknown"
        );
        assert_eq!(assigned_share(Some(&a), "task-1", false, true), Some(None), "not registered: unknown");
        assert_eq!(assigned_share(Some(&a), "task-3", false, false), Some(Some(0)), "deactivated: holds nothing");
        assert_eq!(assigned_share(None, "task-1", true, true), None, "no assignment read: unchanged");
        let refused = Assignment { error: Some("re-created".into()), ..a };
        assert_eq!(assigned_share(Some(&refused), "task-3", true, true), Some(Some(0)), "refused: every task stops");
    }
}

#[cfg(test)]
mod blocked_tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use tokio_util::sync::CancellationToken;

    use super::Blocked;

    #[test]
    fn a_watched_shard_is_looked_at_again_at_its_retry_time() {
        let now = Instant::now();
        let b = Blocked {
            retry_at: now + Duration::from_secs(30),
            watch: Some(CancellationToken::new()),
            until_new_assignment: None,
        };
        assert!(b.waiting(now, Some(1)), "left alone until the watch fires or 30 s passed");
        assert!(!b.waiting(now + Duration::from_secs(31), Some(1)), "looked at again after 30 s, watch or not");
        let f = Blocked { retry_at: now + Duration::from_secs(30), watch: None, until_new_assignment: Some(1) };
        assert!(f.waiting(now, Some(1)));
        assert!(!f.waiting(now, Some(2)), "a finished shard is looked at again under a new assignment");
    }
}

#[cfg(test)]
mod lease_token_tests {
    use super::lease_token;

    #[test]
    fn lease_tokens_are_the_sequential_suffix() {
        assert_eq!(lease_token("/squall/t/streams/s/owners/shardId-000000000001/lease-task-3-0000000042"), 42);
        assert_eq!(lease_token("/x/lease-cli-1a2b-0000000007"), 7);
        assert_eq!(lease_token("/x/lease"), 0);
    }
}
