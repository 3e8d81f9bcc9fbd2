//! The worker-level side of coordination: one [`StreamCoordinator`] per worker process and
//! stream, shared by the worker's spout tasks.
//!
//! It keeps the worker's view of the cold coordination state — the live tasks and the
//! `assignment` — from two persistent, non-recursive watches, and publishes it to the worker's
//! tasks. When the lowest live task is one of this worker's, it also does the leader's duties:
//! listing shards, persisting starting positions, computing the sticky assignment, collecting
//! finished shards that left the stream, and refusing a stream re-created under the same name.
//!
//! Costs (ZooKeeper requests), which ARCHITECTURE.md turns into the cost model:
//! - a task joining or leaving: one listing per worker, plus the leader's assignment write and one
//!   read of it per worker;
//! - a shard finishing: one listing by the leader, then as for a join;
//! - a checkpoint write: nothing here (checkpoints are not watched);
//! - idle: one `exists` per `resync_interval_ms` (a safety net), nothing else.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::config::{InitialPosition, KinesisSpoutConfig};
use super::source::ShardSource;
use crate::coord::{
    Assignment, ChangeEvent, Checkpoint, CheckpointPosition, CoordError, FirstStart, Health, SessionView, ShardList,
    ShardRecord, SharedSession, Versioned, WatchOn, ZkStore, lineage_gaps, now_ms, readable, sticky_assign,
};

/// A leader that holds the assignment back this long (the listings keep missing a finished
/// shard's children) warns.
const HELD_WARN_AFTER: Duration = Duration::from_secs(30);

/// What the worker's tasks see.
#[derive(Clone, Debug)]
pub(crate) struct StreamView {
    /// The session generation this view belongs to.
    pub generation: u64,
    /// The store of that generation; `None` while no session is up.
    pub store: Option<ZkStore>,
    pub health: Health,
    /// The latest assignment read (or written) by this worker.
    pub assignment: Option<Arc<Assignment>>,
}

/// Messages from the worker's tasks.
#[derive(Debug)]
pub(crate) enum StreamCommand {
    /// A task registered in session `generation` under this node name.
    Registered { generation: u64, task: String },
    /// A task unregistered (it stopped).
    Unregistered { task: String },
    /// A reader of this worker reached a shard's end: list the children now if this worker leads
    /// (other workers' leaders learn it from the finished marker).
    ShardEnded,
}

/// A running [`StreamCoordinator`]: the view, a command channel, and its stop.
pub(crate) struct StreamHandle {
    pub view: watch::Receiver<Arc<StreamView>>,
    pub commands: mpsc::UnboundedSender<StreamCommand>,
    cancel: CancellationToken,
    join: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl StreamHandle {
    /// Starts the coordinator of `cfg.stream` over `session`.
    pub fn start(cfg: Arc<KinesisSpoutConfig>, session: Arc<SharedSession>, source: ShardSource) -> Arc<Self> {
        let initial = StreamView { generation: 0, store: None, health: Health::Lost, assignment: None };
        let (view_tx, view) = watch::channel(Arc::new(initial));
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let coordinator = StreamCoordinator {
            cfg,
            session,
            source,
            view: view_tx,
            commands: commands_rx,
            local: BTreeSet::new(),
            tasks: Vec::new(),
            assignment: None,
            assignment_broken: false,
            leader: None,
            finished_events: None,
            listing: None,
            listed: None,
            warned: None,
        };
        let join = tokio::spawn(coordinator.run(cancel.clone()));
        Arc::new(Self { view, commands, cancel, join: Mutex::new(Some(join)) })
    }

    /// Stops the coordinator and waits for it.
    pub async fn stop(&self) {
        self.cancel.cancel();
        let join = self.join.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(j) = join {
            let _ = j.await;
        }
    }
}

impl Drop for StreamHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// The leader's state: rebuilt whenever this worker becomes leader.
struct Leader {
    /// The local task that leads (its node fences assignment writes).
    task: String,
    list: Option<Versioned<ShardList>>,
    /// The stored list is unreadable (`list` holds its version, no shards): the next discovery
    /// overwrites it; until then the assignment is left as it is.
    list_broken: bool,
    /// Shards with a checkpoint znode.
    checkpointed: BTreeSet<String>,
    finished: BTreeSet<String>,
    last_discovery: Option<Instant>,
    discovery_wanted: bool,
    /// The stream was re-created under the same name: nothing is assigned.
    refused: Option<String>,
    recompute: bool,
    /// A `squall rebalance` request being gathered for: (its generation, when this leader first
    /// saw it).
    gathering: Option<(u64, Instant)>,
    /// Why the assignment is held back (`lineage_gaps`), since when, and whether that was
    /// warned about (after [`HELD_WARN_AFTER`]).
    held_for: Option<(String, Instant, bool)>,
    /// When the committed watermark was last published, and what (see `publish_committed`).
    committed: Option<(Instant, Option<i64>, Option<String>)>,
    /// Finished shards missing from ListShards: since when, and in how many listings. One
    /// listing that omits a shard is not proof that it left the stream; see [`gc_confirmed`].
    absent: BTreeMap<String, (Instant, u32)>,
    /// Parents that listed shards name and the listing leaves out, unknown to the stored list:
    /// since when, and in how many listings (gone once [`gc_confirmed`]).
    parents_absent: BTreeMap<String, (Instant, u32)>,
    /// Shards known to have left the stream (collected here, or parents confirmed gone): a child
    /// naming one is not held back by it.
    gone: BTreeSet<String>,
}

/// How long a finished shard must be missing from ListShards, in at least two listings, before
/// the leader collects it: never on one listing, and at least a discovery interval (5 s at
/// least) between the first listing without it and the collection.
fn gc_confirmed(first_absent: Instant, listings: u32, discovery_every: Duration) -> bool {
    listings >= 2 && first_absent.elapsed() >= discovery_every.max(Duration::from_secs(5))
}

struct StreamCoordinator {
    cfg: Arc<KinesisSpoutConfig>,
    session: Arc<SharedSession>,
    source: ShardSource,
    view: watch::Sender<Arc<StreamView>>,
    commands: mpsc::UnboundedReceiver<StreamCommand>,
    /// This worker's registered tasks (of the current generation).
    local: BTreeSet<String>,
    /// Live tasks, sorted by sequence.
    tasks: Vec<String>,
    assignment: Option<Versioned<Assignment>>,
    /// The stored assignment is unreadable: the leader must overwrite it.
    assignment_broken: bool,
    leader: Option<Leader>,
    /// The leader's watch on `finished/` (only while this worker leads).
    finished_events: Option<mpsc::Receiver<ChangeEvent>>,
    /// The leader's ListShards in flight: Kinesis calls never block this loop, so joins, leaves
    /// and finished shards are handled while a slow listing runs.
    listing: Option<tokio::task::JoinHandle<Listing>>,
    /// A listing that came back, to apply at the next step.
    listed: Option<Listing>,
    warned: Option<(String, Instant)>,
}

/// What one discovery learned from Kinesis: the shards, and (on periodic discoveries) the
/// stream's creation time.
type Listing = Result<(Vec<crate::kinesis::ShardDescription>, Option<Option<i64>>), crate::kinesis::KinesisError>;

async fn join_opt(h: &mut Option<tokio::task::JoinHandle<Listing>>) -> Option<Listing> {
    match h {
        Some(j) => {
            let r = j.await;
            *h = None;
            r.ok()
        }
        None => std::future::pending().await,
    }
}

async fn recv_opt(rx: &mut Option<mpsc::Receiver<ChangeEvent>>) -> Option<ChangeEvent> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Flags of what must be re-read or recomputed after a batch of events.
#[derive(Default)]
struct Dirty {
    tasks: bool,
    assignment: bool,
    finished: bool,
}

impl StreamCoordinator {
    async fn run(mut self, cancel: CancellationToken) {
        let mut sessions = self.session.subscribe();
        let mut admissions = self.session.admissions();
        let resync = KinesisSpoutConfig::ms(self.cfg.resync_interval_ms);
        let discovery_every = KinesisSpoutConfig::ms(self.cfg.shard_discovery_interval_ms);
        'generations: loop {
            // Wait for a live session the worker admitted (it re-reads its lifecycle state first
            // after an expiry: a drain or a new deployment may have come meanwhile). Until then
            // the tasks see no healthy session: they do not register or take shards. Nor do
            // they while the view still holds the store of an earlier session: it is healthy
            // again only with the store of this one (below), or a task would take the old,
            // dead store for a live one and fail on it, again and again.
            let (generation, session) = loop {
                let v: SessionView = sessions.borrow_and_update().clone();
                admissions.borrow_and_update();
                let admitted = self.session.admitted(v.generation);
                let current = self.view.borrow().generation == v.generation;
                self.publish_health(if admitted && current { &v.health } else { &Health::Lost });
                if let (Some(s), Health::Ok | Health::Unsafe, true) = (v.session.clone(), &v.health, admitted) {
                    break (v.generation, s);
                }
                if matches!(v.health, Health::Failed(_)) {
                    // The worker exits; nothing more to do here.
                    cancel.cancelled().await;
                    return;
                }
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    r = sessions.changed() => if r.is_err() { return },
                    r = admissions.changed() => if r.is_err() { return },
                }
            };
            self.local.clear();
            self.leader = None;
            self.finished_events = None;
            self.stop_listing();
            self.assignment = None;
            let setup = async {
                let (root, topology, stream) = (&self.cfg.zookeeper.root, &self.cfg.topology, &self.cfg.stream);
                let store = if self.cfg.stage_input {
                    ZkStore::open_stage_input(session, root, topology, stream).await?
                } else if self.cfg.stream_tasks {
                    ZkStore::open_source_stream(session, root, topology, stream).await?
                } else {
                    ZkStore::open(session, &self.cfg.zookeeper.root, &self.cfg.topology, &self.cfg.stream).await?
                };
                let events = store.watch(&[WatchOn::Tasks, WatchOn::Assignment]).await?;
                Ok::<_, CoordError>((store, events))
            };
            let (store, mut events) = match setup.await {
                Ok(x) => x,
                Err(e) => {
                    self.warn(&format!("watching the stream's coordination state failed: {e}"));
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    }
                    continue 'generations;
                }
            };
            let health = {
                let now = sessions.borrow();
                if now.generation == generation { now.health.clone() } else { Health::Lost }
            };
            self.view.send_modify(|v| {
                let v = Arc::make_mut(v);
                v.generation = generation;
                v.store = Some(store.clone());
                v.assignment = None;
                v.health = health;
            });
            let mut dirty = Dirty { tasks: true, assignment: true, finished: false };
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut last_resync = Instant::now();
            loop {
                if let Err(e) = self.step(&store, &mut dirty, discovery_every).await {
                    if e.is_session_lost() {
                        continue 'generations;
                    }
                    self.warn(&format!("coordination step failed; retrying: {e}"));
                    // Re-read everything at the next step.
                    dirty = Dirty { tasks: true, assignment: true, finished: true };
                }
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => return,
                    r = sessions.changed() => {
                        if r.is_err() { return; }
                        let v = sessions.borrow().clone();
                        if v.generation != generation || v.session.is_none() {
                            self.publish_health(&Health::Lost);
                            continue 'generations;
                        }
                        self.publish_health(&v.health);
                        if v.health == Health::Ok {
                            // Back from a disconnection: events may have been lost.
                            dirty = Dirty { tasks: true, assignment: true, finished: true };
                        }
                    }
                    ev = events.recv() => match ev {
                        None | Some(ChangeEvent::SessionLost) => {
                            // The session monitor publishes the new generation.
                            let _ = sessions.changed().await;
                            continue 'generations;
                        }
                        Some(ev) => apply(&mut dirty, ev),
                    },
                    listed = join_opt(&mut self.listing) => {
                        if let Some(listed) = listed {
                            self.listed = Some(listed);
                        }
                    }
                    ev = recv_opt(&mut self.finished_events) => match ev {
                        Some(ChangeEvent::SessionLost) | None => {}
                        Some(ev) => apply(&mut dirty, ev),
                    },
                    cmd = self.commands.recv() => match cmd {
                        None => return,
                        Some(cmd) => self.command(cmd, generation, &mut dirty),
                    },
                    _ = tick.tick() => {
                        if last_resync.elapsed() >= resync {
                            last_resync = Instant::now();
                            // Safety net against a lost event: one cheap version check.
                            if let Ok(Some(stat)) = store.client().check_stat(store.paths().assignment()).await
                                && self.assignment.as_ref().map(|a| a.version) != Some(stat.version) {
                                    dirty.assignment = true;
                                }
                        }
                    }
                }
                // Coalesce a burst: take whatever else is already queued, then act once.
                while let Ok(ev) = events.try_recv() {
                    if matches!(ev, ChangeEvent::SessionLost) {
                        continue 'generations;
                    }
                    apply(&mut dirty, ev);
                }
                while let Ok(cmd) = self.commands.try_recv() {
                    self.command(cmd, generation, &mut dirty);
                }
                if let Some(rx) = self.finished_events.as_mut() {
                    while let Ok(ev) = rx.try_recv() {
                        apply(&mut dirty, ev);
                    }
                }
            }
        }
    }

    fn stop_listing(&mut self) {
        if let Some(h) = self.listing.take() {
            h.abort();
        }
        self.listed = None;
    }

    fn command(&mut self, cmd: StreamCommand, generation: u64, dirty: &mut Dirty) {
        match cmd {
            StreamCommand::ShardEnded => {
                if let Some(l) = self.leader.as_mut() {
                    l.discovery_wanted = true;
                }
            }
            StreamCommand::Registered { generation: g, task } if g == generation => {
                self.local.insert(task);
                dirty.tasks = true;
            }
            StreamCommand::Registered { .. } => {}
            StreamCommand::Unregistered { task } => {
                self.local.remove(&task);
                dirty.tasks = true;
            }
        }
    }

    fn publish_health(&self, health: &Health) {
        self.view.send_if_modified(|view| {
            if view.health == *health {
                return false;
            }
            Arc::make_mut(view).health = health.clone();
            true
        });
    }

    /// Reads the stored assignment and publishes it. A malformed one is reported and the last good
    /// assignment stays in force, at the broken znode's version, so that the leader overwrites it.
    async fn reload_assignment(&mut self, store: &ZkStore) -> Result<(), CoordError> {
        match store.read_assignment().await {
            Ok(a) => {
                self.assignment = a;
                self.assignment_broken = false;
                self.publish_assignment();
            }
            Err(e @ CoordError::Malformed { .. }) => {
                self.warn(&format!("{e}; the leader rewrites it"));
                if let Ok(Some(stat)) = store.client().check_stat(store.paths().assignment()).await {
                    let last = self.assignment.take().map(|a| a.value).unwrap_or_default();
                    self.assignment = Some(Versioned { value: last, version: stat.version });
                    self.assignment_broken = true;
                }
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }

    fn publish_assignment(&self) {
        let a = self.assignment.as_ref().map(|a| Arc::new(a.value.clone()));
        self.view.send_modify(|v| Arc::make_mut(v).assignment = a);
    }

    fn warn(&mut self, msg: &str) {
        if self.warned.as_ref().is_none_or(|(m, t)| m != msg || t.elapsed() >= Duration::from_secs(10)) {
            tracing::warn!(stream = %self.cfg.stream, "{msg}");
            self.warned = Some((msg.to_string(), Instant::now()));
        }
    }

    /// Re-reads what changed, follows leadership, and does the leader's work.
    async fn step(&mut self, store: &ZkStore, dirty: &mut Dirty, discovery_every: Duration) -> Result<(), CoordError> {
        if std::mem::take(&mut dirty.tasks) {
            self.tasks = store.task_names().await?;
            if let Some(l) = self.leader.as_mut() {
                l.recompute = true;
            }
        }
        if std::mem::take(&mut dirty.assignment) {
            self.reload_assignment(store).await?;
            if let Some(l) = self.leader.as_mut() {
                l.recompute = true;
            }
        }
        // Leadership: the lowest live task; this worker leads when it is one of ours.
        let lead = self.tasks.first().filter(|t| self.local.contains(*t)).cloned();
        let current = self.leader.as_ref().map(|l| l.task.clone());
        match (current, lead) {
            (Some(c), Some(t)) if c == t => {}
            (_, Some(t)) => {
                tracing::info!(task = %t, stream = %self.cfg.stream, "this worker leads: it lists the stream's shards and assigns them");
                self.leader = None;
                self.finished_events = None;
                self.stop_listing();
                let leader = self.take_lead(store, t).await?;
                self.leader = Some(leader);
            }
            (Some(c), None) => {
                tracing::info!(task = %c, "no longer the leader");
                self.leader = None;
                self.finished_events = None;
                self.stop_listing();
            }
            (None, None) => {}
        }
        let Some(mut leader) = self.leader.take() else { return Ok(()) };
        let result = self.lead(store, &mut leader, dirty, discovery_every).await;
        if matches!(result, Err(CoordError::Fenced { .. })) {
            self.finished_events = None;
            self.stop_listing();
        } else {
            self.leader = Some(leader);
        }
        match result {
            Err(CoordError::Fenced { .. }) => {
                // Our leader task is gone (unregistered or expired): someone else leads.
                dirty.tasks = true;
                Ok(())
            }
            other => other,
        }
    }

    /// Becoming leader: a handful of requests, whatever the number of tasks. Checkpoints are not
    /// read, except those of closed shards without a finished marker (parents being read, or
    /// finished by an earlier version), which are few.
    async fn take_lead(&mut self, store: &ZkStore, task: String) -> Result<Leader, CoordError> {
        self.finished_events = Some(store.watch(&[WatchOn::Finished]).await?);
        let (list, list_broken) = load_list(store).await?;
        let checkpointed = store.checkpoint_ids().await?;
        let mut finished = store.list_finished().await?;
        if let Some(l) = &list {
            let candidates: Vec<&str> = l
                .value
                .shards
                .iter()
                .filter(|s| s.closed && !finished.contains(&s.shard_id))
                .map(|s| s.shard_id.as_str())
                .collect();
            for id in candidates {
                if let Ok(Some(cp)) = store.read_checkpoint(id).await
                    && cp.value.finished
                {
                    store.mark_finished(id).await?;
                    finished.insert(id.to_string());
                }
            }
        }
        Ok(Leader {
            task,
            list,
            list_broken,
            checkpointed,
            finished,
            last_discovery: None,
            discovery_wanted: true,
            refused: None,
            recompute: true,
            gathering: None,
            held_for: None,
            committed: None,
            absent: BTreeMap::new(),
            parents_absent: BTreeMap::new(),
            gone: BTreeSet::new(),
        })
    }

    async fn lead(
        &mut self,
        store: &ZkStore,
        l: &mut Leader,
        dirty: &mut Dirty,
        discovery_every: Duration,
    ) -> Result<(), CoordError> {
        self.publish_committed(store, l).await;
        if std::mem::take(&mut dirty.finished) {
            let finished = store.list_finished().await?;
            tracing::debug!(before = l.finished.len(), now = finished.len(), "finished markers listed");
            if finished != l.finished {
                // A shard finished (its children may need listing) or a reset removed markers.
                l.discovery_wanted |= finished.difference(&l.finished).next().is_some();
                l.finished = finished;
                l.recompute = true;
            }
        }
        if let Some(listed) = self.listed.take() {
            self.discover(store, l, listed).await?;
            // A held assignment looks again after every listing (and asks for the next).
            l.recompute |= l.held_for.is_some();
        }
        let due = l.last_discovery.is_none_or(|t| t.elapsed() >= discovery_every);
        // Event-driven listings at most every 200 ms (ListShards allows 100 per second per stream).
        let spaced = l.last_discovery.is_none_or(|t| t.elapsed() >= Duration::from_millis(200));
        if (due || (l.discovery_wanted && spaced)) && self.listing.is_none() {
            l.discovery_wanted = false;
            l.last_discovery = Some(Instant::now());
            // The creation time only on periodic discoveries (and while refusing): event-driven
            // ones after a shard end need the shards only.
            let describe = due || l.refused.is_some();
            let source = self.source.clone();
            self.listing = Some(tokio::spawn(async move {
                let (shards, created) = if describe {
                    let (a, b) = tokio::join!(source.list_shards(), source.created_ms());
                    (a, Some(b))
                } else {
                    (source.list_shards().await, None)
                };
                let created = match created {
                    Some(c) => Some(c?),
                    None => None,
                };
                Ok((shards?, created))
            }));
        }
        if let Some((generation, since)) = l.gathering
            && let Some(a) = &self.assignment
            && a.value.generation == generation
            && a.value.rebalance.as_ref().is_some_and(|r| since.elapsed() >= Duration::from_millis(r.gather_ms))
        {
            l.recompute = true;
        }
        if std::mem::take(&mut l.recompute) {
            self.assign(store, l).await?;
        }
        Ok(())
    }

    /// ListShards; persist starting positions of new shards; collect finished shards that left
    /// the stream; keep the `shards` znode equal to the stream; refuse a re-created stream.
    async fn discover(&mut self, store: &ZkStore, l: &mut Leader, listing: Listing) -> Result<(), CoordError> {
        let (listed, created) = match listing {
            Ok(x) => x,
            Err(e) => {
                self.warn(&format!("listing the stream's shards failed; retrying at the next discovery: {e}"));
                return Ok(());
            }
        };
        // Unknown on event-driven discoveries: keep what is stored.
        let created = created.unwrap_or(l.list.as_ref().and_then(|v| v.value.stream_created_ms));
        // One cheap check that the stored list is still the one this leader wrote: an operator
        // may have edited, broken or deleted it (or a reset accepted a re-created stream).
        let stored = store.client().check_stat(store.paths().shards()).await.ok().flatten().map(|s| s.version);
        if stored != l.list.as_ref().map(|v| v.version) {
            (l.list, l.list_broken) = load_list(store).await?;
            // A list read from ZooKeeper (an operator's edit, or this leader's own write whose
            // answer was lost) needs an assignment like one written here: before, a lost answer
            // to the first list's create left the topology without an assignment for good (the
            // simulator's seed 102557: nothing read for 146 s).
            l.recompute = true;
        }
        let stored_created = l.list.as_ref().and_then(|v| v.value.stream_created_ms);
        if let (Some(was), Some(now)) = (stored_created, created)
            && was != now
        {
            let msg = format!(
                "stream {} was deleted and re-created (created at {now} ms, the stored shard list is of a stream created at {was} ms): \
                     its checkpoints point into the old stream, so nothing is read. Rewind them with \
                     `squall deactivate {}` then `squall checkpoints reset {} --stream {} --to trim-horizon` then `squall activate {}`",
                self.cfg.stream, self.cfg.topology, self.cfg.topology, self.cfg.stream, self.cfg.topology
            );
            if l.refused.as_deref() != Some(msg.as_str()) {
                tracing::error!(stream = %self.cfg.stream, "{msg}");
                l.refused = Some(msg);
                l.recompute = true;
            }
            return Ok(());
        }
        if l.refused.take().is_some() {
            tracing::info!(stream = %self.cfg.stream, "the stream's checkpoints were reset: reading again");
            l.recompute = true;
        }
        // The topology's first start on the stream: no list and no checkpoint yet, or one begun
        // and cut short (a crash, a lost connection between its creates: its record is still
        // there), which this leader resumes with the same decision. (A list deleted by an
        // operator is not a first start: later shards still start at TRIM_HORIZON.)
        let resumed = if l.list.is_none() { store.first_start().await? } else { None };
        let first_start = l.list.is_none() && (l.checkpointed.is_empty() || resumed.is_some());
        let latest_ms = match (&resumed, first_start) {
            (Some(r), _) => {
                tracing::info!(stream = %self.cfg.stream, latest_ms = r.latest_ms, started_at_ms = r.started_at_ms,
                    "resuming the topology's first start on the stream (it was cut short): the remaining shards get \
                     the same starting position");
                r.latest_ms
            }
            (None, true) => {
                let latest_ms = self.first_start_latest_ms().await;
                store.begin_first_start(&FirstStart { latest_ms, started_at_ms: now_ms() }).await?.latest_ms
            }
            (None, false) => 0,
        };
        let ids: BTreeSet<&str> = listed.iter().map(|s| s.shard_id.as_str()).collect();
        // Persist every starting position before the list names the shard.
        for sh in &listed {
            if l.checkpointed.contains(&sh.shard_id) {
                continue;
            }
            let cp = if first_start {
                initial_checkpoint(self.cfg.initial_position, latest_ms)
            } else {
                Checkpoint::at(CheckpointPosition::TrimHorizon, now_ms())
            };
            let stored = store.init_checkpoint(&sh.shard_id, &cp).await?;
            if stored.value.finished {
                store.mark_finished(&sh.shard_id).await?;
                l.finished.insert(sh.shard_id.clone());
            }
            tracing::info!(shard = %sh.shard_id, position = %stored.value.position, finished = stored.value.finished, "new shard: starting position persisted");
            l.checkpointed.insert(sh.shard_id.clone());
            l.recompute = true;
        }
        // Garbage: finished shards the stream no longer returns (trimmed past retention), once
        // two listings some time apart agree (`gc_confirmed`).
        let discovery_every = KinesisSpoutConfig::ms(self.cfg.shard_discovery_interval_ms);
        l.absent.retain(|shard, _| !ids.contains(shard.as_str()) && l.finished.contains(shard));
        let missing: Vec<String> = l.finished.iter().filter(|s| !ids.contains(s.as_str())).cloned().collect();
        for shard in missing {
            let (since, listings) = l.absent.entry(shard.clone()).or_insert((Instant::now(), 0));
            *listings += 1;
            if !gc_confirmed(*since, *listings, discovery_every) {
                if *listings == 1 {
                    tracing::info!(shard = %shard, "finished shard missing from ListShards: collected if it stays missing");
                }
                continue;
            }
            // Listings that leave a shard out, even several some time apart, are no proof that it
            // left the stream (the simulator's seed 687: two listings 10 s apart omitted a
            // finished parent, it was collected and came back in the next listing as a new shard,
            // read again from TRIM_HORIZON). Kinesis answers GetShardIterator on a shard trimmed
            // past retention with ResourceNotFound: only that collects it.
            match self.shard_gone(&shard).await {
                Some(true) => {}
                Some(false) => {
                    tracing::info!(shard = %shard, "finished shard missing from ListShards is still in the stream \
                        (GetShardIterator answered): kept");
                    l.absent.remove(&shard);
                    continue;
                }
                None => continue,
            }
            match store.forget_shard(&shard).await {
                Ok(()) => {
                    tracing::info!(shard = %shard, "shard finished and left the stream: its checkpoint and marker removed");
                    l.gone.insert(shard.clone());
                    l.finished.remove(&shard);
                    l.checkpointed.remove(&shard);
                    l.absent.remove(&shard);
                }
                Err(e) => self.warn(&format!("removing finished shard {shard} failed; retrying later: {e}")),
            }
        }
        // A parent that a listed shard names and the listing leaves out, and that the stored list
        // does not hold: it left the stream (trimmed past retention) only once two listings some
        // time apart agree. Until then the listing is incomplete: a list written from it would
        // make the child readable at once (`readable` does not wait for a parent absent from the
        // list), before the parent was read to its end (the simulator's seed 584: a first start
        // whose one listing left out a merge child that had been split since). The stored list
        // stays as it is and the stream is listed again.
        let known = |p: &str| l.list.as_ref().is_some_and(|prev| prev.value.shards.iter().any(|x| x.shard_id == p));
        let orphans: BTreeSet<String> = listed
            .iter()
            .flat_map(|s| s.parents())
            .filter(|p| !ids.contains(p) && !l.gone.contains(*p) && !known(p))
            .map(String::from)
            .collect();
        l.parents_absent.retain(|p, _| orphans.contains(p));
        let mut unconfirmed = Vec::new();
        for p in orphans {
            let (since, listings) = l.parents_absent.entry(p.clone()).or_insert((Instant::now(), 0));
            *listings += 1;
            if !gc_confirmed(*since, *listings, discovery_every) {
                unconfirmed.push(p);
                continue;
            }
            match self.shard_gone(&p).await {
                Some(true) => {
                    tracing::info!(shard = %p, "a parent missing from the listings has left the stream (trimmed)");
                    l.parents_absent.remove(&p);
                    l.gone.insert(p);
                }
                Some(false) => {
                    // still there: the next listing should name it
                    l.parents_absent.remove(&p);
                    unconfirmed.push(p);
                }
                None => unconfirmed.push(p),
            }
        }
        if !unconfirmed.is_empty() {
            tracing::info!(stream = %self.cfg.stream, parents = ?unconfirmed,
                "ListShards left out the parents of listed shards: the shard list waits for a listing that names them \
                 (or for two listings some time apart without them)");
            l.discovery_wanted = true;
            return Ok(());
        }
        let mut records: Vec<ShardRecord> = listed
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
        // A shard of the stored list that this listing leaves out stays in the list until it is
        // collected above (finished, and missing from two listings some time apart). A listing
        // that omits a shard once is not proof that it left the stream, and a list without it
        // would make its children readable at once (`readable`: a parent absent from the list
        // does not hold its children back), before it was read to its end (the simulator's seed
        // 215: a merge's parent left out of one listing, its child read before it finished).
        if let Some(prev) = &l.list {
            let kept: Vec<ShardRecord> = prev
                .value
                .shards
                .iter()
                .filter(|s| !ids.contains(s.shard_id.as_str()) && l.checkpointed.contains(&s.shard_id))
                .cloned()
                .collect();
            for s in &kept {
                if !l.finished.contains(&s.shard_id) {
                    tracing::info!(shard = %s.shard_id, "shard missing from ListShards but not finished: kept in the shard list");
                }
            }
            records.extend(kept);
            records.sort_by(|a, b| a.shard_id.cmp(&b.shard_id));
        }
        let mut list = ShardList::new(records, now_ms());
        list.stream_created_ms = stored_created.or(created);
        let unchanged = l
            .list
            .as_ref()
            .is_some_and(|e| e.value.shards == list.shards && e.value.stream_created_ms == list.stream_created_ms);
        if !unchanged {
            match store.write_shard_list(&list, l.list.as_ref().map(|e| e.version)).await {
                Ok(version) => {
                    if std::mem::take(&mut l.list_broken) {
                        tracing::info!(stream = %self.cfg.stream, "the unreadable shard list was rewritten from ListShards");
                    }
                    tracing::info!(stream = %self.cfg.stream, shards = list.shards.len(), "shard list updated in ZooKeeper");
                    l.list = Some(Versioned { value: list, version });
                    l.recompute = true;
                    if first_start {
                        store.end_first_start().await?;
                    }
                }
                Err(CoordError::VersionConflict { .. }) => {
                    // Someone else wrote it (a reset, an old leader): read it and list again.
                    (l.list, l.list_broken) = load_list(store).await?;
                    l.discovery_wanted = true;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Every `committed_watermark_interval_ms`, while a window firer of the topology is live, the
    /// leader computes the stream's committed watermark from the tasks' reports (the assignment
    /// and one read per task) and publishes it in one znode when it changed: each window firer then reads one znode, whatever the number
    /// of tasks, instead of every report (the cluster pays T reads per interval once, not once per
    /// firer). A failure is only logged: the next interval tries again.
    async fn publish_committed(&mut self, store: &ZkStore, l: &mut Leader) {
        let interval = self.cfg.committed_watermark_interval_ms;
        if interval == 0 || self.cfg.stage_input {
            return;
        }
        if l.committed.as_ref().is_some_and(|(at, _, _)| at.elapsed() < KinesisSpoutConfig::ms(interval)) {
            return;
        }
        // only while a window firer reads it (no firer: two requests per interval, not T + 2)
        match store.any_live_firer().await {
            Ok(true) => {}
            Ok(false) => {
                l.committed = Some((Instant::now(), None, Some("no firer".into())));
                return;
            }
            Err(e) => {
                self.warn(&format!("listing the window firers failed; retrying: {e}"));
                return;
            }
        }
        let (w, why) = match store.committed_watermark().await {
            Ok(Ok(w)) => (Some(w), None),
            Ok(Err(why)) => (None, Some(why)),
            Err(e) => {
                self.warn(&format!("computing the committed watermark failed; retrying: {e}"));
                return;
            }
        };
        let unchanged = l.committed.as_ref().is_some_and(|(_, pw, pwhy)| *pw == w && *pwhy == why);
        if !unchanged {
            let p = crate::coord::PublishedWatermark { watermark_ms: w, why: why.clone(), computed_at_ms: now_ms() };
            if let Err(e) = store.publish_committed(&p).await {
                self.warn(&format!("publishing the committed watermark failed; retrying: {e}"));
                return;
            }
        }
        l.committed = Some((Instant::now(), w, why));
    }

    /// LATEST of a first start as a time: the first start's time as the Kinesis service's clock
    /// has it (from the Date header of its answers, ListShards' just now) when this worker's
    /// clock is clearly off: a clock ahead would skip what is written until the service's clock
    /// catches up. 0 when the initial position is not LATEST.
    async fn first_start_latest_ms(&mut self) -> i64 {
        if self.cfg.initial_position != InitialPosition::Latest {
            return 0;
        }
        if self.source.service_now_lower().is_some() {
            // Sharpen the service's clock bound to about 50 ms first, so LATEST reads no more
            // than that from before the first start (about 23 small calls, once per topology).
            self.source.sharpen_service_clock().await;
        }
        let now = now_ms();
        let (at, skew) = crate::kinesis::clock::latest_start_ms(now, self.source.service_now_lower());
        if let Some(skew) = skew {
            let (dir, by) = if skew > 0 { ("ahead of", skew) } else { ("behind", -skew) };
            tracing::warn!(stream = %self.cfg.stream, worker_clock_ms = now, service_clock_ms = at, skew_ms = skew,
                "this worker's clock is about {by} ms {dir} the Kinesis service's clock (from the Date header of \
                 its answers): LATEST persisted as the service's time of the first start, AT_TIMESTAMP {at}, not \
                 this worker's {now}. Check the workers' clocks (NTP, chrony)");
        }
        at
    }

    /// Whether `shard` has left the stream, asked of Kinesis directly: GetShardIterator at
    /// TRIM_HORIZON answers ResourceNotFound for a shard trimmed past retention (`Some(true)`),
    /// an iterator for one still there (`Some(false)`); `None` when the call failed otherwise.
    async fn shard_gone(&self, shard: &str) -> Option<bool> {
        use crate::coord::CheckpointPosition;
        use crate::kinesis::KinesisError;
        let at = CheckpointPosition::TrimHorizon;
        match self.source.shard_iterator(shard, super::source::StartAt::Checkpoint(&at)).await {
            Ok(_) => Some(false),
            Err(KinesisError::StreamNotFound { .. } | KinesisError::ShardNotFound { .. }) => Some(true),
            Err(e) => {
                tracing::debug!(shard, error = %e, "asking whether a shard left the stream failed; asked again later");
                None
            }
        }
    }

    /// Computes the sticky assignment and writes it when it differs from the current one.
    async fn assign(&mut self, store: &ZkStore, l: &mut Leader) -> Result<(), CoordError> {
        let Some(list) = l.list.as_ref().filter(|_| !l.list_broken) else { return Ok(()) };
        let previous = self.assignment.as_ref().map(|a| &a.value);
        // After `squall rebalance`: from scratch, once the tasks are back (or the gathering ran out).
        let rebalance = previous.and_then(|p| p.rebalance.as_ref().map(|r| (p.generation, r)));
        if let Some((generation, request)) = rebalance {
            let gather = Duration::from_millis(request.gather_ms);
            if l.gathering.is_none_or(|(g, _)| g != generation) {
                tracing::info!(
                    generation,
                    tasks = request.tasks,
                    gather_ms = request.gather_ms,
                    "rebalance requested: waiting for the tasks to register again"
                );
                l.gathering = Some((generation, Instant::now()));
            }
            let since = l.gathering.map_or_else(Instant::now, |(_, since)| since);
            let back = self.tasks.len();
            if back < request.tasks {
                if since.elapsed() < gather {
                    tracing::debug!(back, of = request.tasks, "rebalance: waiting for more tasks");
                    return Ok(());
                }
                tracing::warn!(
                    back,
                    of = request.tasks,
                    gather_ms = request.gather_ms,
                    "rebalance: only {back} of {} tasks registered again in time; assigning over those (later ones join sticky)",
                    request.tasks
                );
            }
        }
        let mut next = Assignment {
            generation: previous.map_or(1, |p| p.generation + 1),
            leader: l.task.clone(),
            tasks: BTreeMap::new(),
            updated_at_ms: now_ms(),
            error: l.refused.clone(),
            rebalance: None,
        };
        if l.refused.is_none() {
            // Every shard that may hold unread records must be in the assignment: while the list
            // lags behind a reshard (a finished parent's children not listed yet, or a child's
            // starting position not persisted), the previous assignment stays, and with it the
            // committed watermark (see `lineage_gaps`). A listing is asked for at once.
            let gaps = lineage_gaps(&list.value, &l.finished, &l.checkpointed);
            if !gaps.is_empty() {
                l.discovery_wanted = true;
                let why = gaps.join("; ");
                match &mut l.held_for {
                    Some((w, since, warned)) if *w == why => {
                        if !*warned && since.elapsed() >= HELD_WARN_AFTER {
                            *warned = true;
                            tracing::warn!(stream = %self.cfg.stream, held_ms = since.elapsed().as_millis() as u64,
                                "assignment still held: the listings do not show what a reshard left: {why}");
                        }
                    }
                    _ => {
                        tracing::info!(stream = %self.cfg.stream, "assignment held until a listing shows what a reshard left: {why}");
                        l.held_for = Some((why, Instant::now(), false));
                    }
                }
                return Ok(());
            }
            if l.held_for.take().is_some() {
                tracing::info!(stream = %self.cfg.stream, "the shard list shows every child of the finished shards: assigning");
            }
            let ready: Vec<String> =
                readable(&list.value, &l.finished).into_iter().filter(|s| l.checkpointed.contains(s)).collect();
            let empty = BTreeMap::new();
            let prev_tasks = previous.filter(|_| rebalance.is_none()).map_or(&empty, |p| &p.tasks);
            // A child goes to its parent's reader when that one has room.
            let owner_of = previous.map(|p| p.owner_of()).unwrap_or_default();
            let mut hints = BTreeMap::new();
            for s in &ready {
                if let Some(rec) = list.value.get(s)
                    && let Some(owner) = rec.parents().find_map(|p| owner_of.get(p))
                {
                    hints.insert(s.clone(), owner.to_string());
                }
            }
            next.tasks = sticky_assign(prev_tasks, &self.tasks, &ready, &hints);
        } else {
            next.tasks = self.tasks.iter().map(|t| (t.clone(), Vec::new())).collect();
        }
        if !self.assignment_broken
            && previous.is_some_and(|p| p.rebalance.is_none() && p.tasks == next.tasks && p.error == next.error)
        {
            tracing::debug!(finished = l.finished.len(), "assignment unchanged");
            return Ok(());
        }
        match store.write_assignment(&l.task, &next, self.assignment.as_ref().map(|a| a.version)).await {
            Ok(version) => {
                let moved = previous.map_or(0, |p| crate::coord::moved(&p.tasks, &next.tasks));
                tracing::info!(
                    generation = next.generation,
                    tasks = next.tasks.len(),
                    shards = next.tasks.values().map(Vec::len).sum::<usize>(),
                    moved,
                    from_scratch = rebalance.is_some(),
                    "assignment written"
                );
                l.gathering = None;
                self.assignment = Some(Versioned { value: next, version });
                self.assignment_broken = false;
                self.publish_assignment();
                Ok(())
            }
            Err(CoordError::VersionConflict { .. }) => {
                tracing::debug!("assignment changed under the leader: reading it and computing again");
                // Changed under us (a rebalance deleted it, an old leader): read and recompute.
                self.reload_assignment(store).await?;
                l.recompute = true;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

/// Reads the stored shard list. An unreadable one is reported and replaced by an empty list at
/// its version (so the leader's next write overwrites it), flagged as broken.
async fn load_list(store: &ZkStore) -> Result<(Option<Versioned<ShardList>>, bool), CoordError> {
    match store.read_shard_list().await {
        Ok(list) => Ok((list, false)),
        Err(e @ CoordError::Malformed { .. }) => {
            tracing::error!(error = %e, "the shard list is unreadable: the leader rewrites it from ListShards");
            let stat = store.client().check_stat(store.paths().shards()).await.ok().flatten();
            Ok((stat.map(|st| Versioned { value: ShardList::new(Vec::new(), 0), version: st.version }), true))
        }
        Err(e) => Err(e),
    }
}

fn apply(dirty: &mut Dirty, ev: ChangeEvent) {
    tracing::trace!(event = ?ev, "coordination event");
    match ev {
        ChangeEvent::Tasks => dirty.tasks = true,
        ChangeEvent::Assignment => dirty.assignment = true,
        ChangeEvent::Finished => dirty.finished = true,
        ChangeEvent::Reconnected => {
            dirty.tasks = true;
            dirty.assignment = true;
            dirty.finished = true;
        }
        _ => {}
    }
}

/// The checkpoint a shard gets at the topology's first start on the stream; LATEST starts at
/// `latest_ms` (the first start's time, see `kinesis::clock::latest_start_ms`).
///
/// A closed shard too starts at `latest_ms`, not finished: it may have closed after the first
/// start (a first start cut short and resumed later applies the same `latest_ms` to the shards
/// the reshards of the meantime made and closed), and then it holds records after `latest_ms`.
/// One that closed before holds none after it: its reader finds its end at once. (Marking every
/// closed shard finished lost a resumed first start's records: the simulator's seed 154, a merge
/// child created and closed while the leader was cut off.)
pub(crate) fn initial_checkpoint(pos: InitialPosition, latest_ms: i64) -> Checkpoint {
    let now = now_ms();
    match pos {
        InitialPosition::TrimHorizon => Checkpoint::at(CheckpointPosition::TrimHorizon, now),
        InitialPosition::AtTimestamp { millis } => Checkpoint::at(CheckpointPosition::AtTimestamp { millis }, now),
        InitialPosition::Latest => Checkpoint::at(CheckpointPosition::AtTimestamp { millis: latest_ms }, now),
    }
}
