//! [`WindowFirer`]: the spout that fires keyed-state timers once the stream's committed
//! watermark passes them (MillWheel's timers, persistent in the state table).
//!
//! # How a key fires
//! An [`super::ExactlyOnce`] bolt whose [`super::KeyedState::timer`] gives a key a fire time
//! writes it with its item: attributes `tpart` (`{scope}#{n}`) and `fire_at`, which put the item
//! in the table's sparse index [`super::store::TIMER_INDEX`]. The firers, one task per worker,
//! register in ZooKeeper (`firers/{component}/`, ephemeral sequential) and share the timer
//! partitions: the i-th of n live firers (by sequence) takes the partitions p with p mod n = i, so
//! firing scales out with the workers (set `timer_partitions` to at least the number of workers).
//! Each polls every `poll_interval_ms`:
//! 1. It reads the stream's *committed* watermark W from ZooKeeper, as the stream's leader last
//!    published it ([`crate::coord::ZkStore::published_watermark`]: one znode, computed by the
//!    leader every `committed_watermark_interval_ms` from the tasks' reports): every record that arrived before W has
//!    been acked, which for an `ExactlyOnce` bolt means committed. Records are windowed by their
//!    arrival time, so no input of a key whose timer is at or below W is still to come.
//! 2. It queries each of its timer partitions for timers at or below W, reads the items (strongly
//!    consistent) and *freezes* each unfired one (`write_concurrency` at a time): one
//!    conditional UpdateItem sets `fired` and raises the version, so a write of the key that
//!    raced it conflicts, reads it again and finds it fired (such inputs are *late*: acked,
//!    counted, not applied).
//! 3. It emits the frozen state through [`OnFire::fire`] as a tracked tuple, with the key and
//!    the fire time ([`FIRE_FIELDS`]).
//! 4. When that tuple's tree completes, it takes the timer out of the index (UpdateItem REMOVE,
//!    in bulk at the next poll, or when the firer closes: after a drain or a stop, whose acks
//!    the engine delivers first, so a clean stop leaves no delivered firing to emit again).
//!    A failed tuple, or a firer that died before the ack, leaves the timer in the index: the
//!    key is found and emitted again, with the same frozen state. Downstream, `fire_key`
//!    identifies a firing exactly; a consumer that must count each once deduplicates by it.
//!
//! While the firers change (one joins, or one's session expires), two may briefly take the same
//! partition, and a zombie firer (its session expired while it was stopped) may go on with its
//! round: either can only emit a frozen state again, since freezing is conditional on the
//! version and a frozen state never changes. A key another firer froze (the item records who,
//! `fired_by`, and when, `fired_ms`) is in flight there and is left to it while that firer is
//! registered: it confirms it, or fails and fires it again itself, however long its round and
//! the firing's tree take. Once its registration is gone and the message timeout passed since
//! the freeze, it is taken to be lost with its firer, and whoever holds the partition fires it
//! (`fire_in_flight_elsewhere` counts the keys left to another firer). So a firer joining while
//! firings run does not put them twice.
//!
//! # Costs
//! Per poll and firer: one ZooKeeper read of the published watermark (flat in the number of spout
//! tasks: the leader reads their reports once per interval for every firer), one list of the
//! firers, and one Query per timer partition of its share when the watermark moved (none
//! otherwise). Per fired key: one BatchGetItem share (100 keys
//! per call), one UpdateItem to freeze and one to confirm. Nothing per record.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use serde::Serialize;
use serde::de::DeserializeOwned;
use squall_topology::metrics::Counter;
use squall_topology::{ComponentError, Spout, SpoutOutput, TaskContext, Value, to_values};

use super::bolt::{StateConfig, scope};
use super::store::{MAX_BATCH_GET, StateError, StateStore, WriteOutcome};
use crate::coord::{ZkConfig, ZkStore};

/// The fields a fired tuple carries after `Out`'s: the key (unique per firing within the
/// component: a window's key names the window) and its fire time (ms since the epoch).
pub const FIRE_FIELDS: [&str; 2] = ["fire_key", "fire_at"];

/// How often a firer that has no watermark looks whether it can fire at all.
const REFUSAL_CHECK: Duration = Duration::from_secs(5);

/// How often keys whose state did not deserialize are read again.
const UNREADABLE_RETRY: Duration = Duration::from_secs(60);

/// What a key's state becomes when its timer fires.
pub trait OnFire: Send + 'static {
    /// The key's state, as the [`super::KeyedState`] stores it.
    type State: DeserializeOwned + Send;
    /// The fired tuple's values ([`squall_topology::fields_of`] declares its fields; add
    /// [`FIRE_FIELDS`] after them).
    type Out: Serialize + Send;

    /// The output for `key`, fired at `fire_at` with its final `state`. Called again, with the
    /// same state, when a firing is replayed.
    fn fire(&mut self, key: &str, fire_at: i64, state: Self::State) -> Self::Out;
}

/// Settings of a [`WindowFirer`].
#[derive(Debug, Clone)]
pub struct FirerConfig {
    /// The state table and timer partitions: the same as the component's [`StateConfig`].
    pub state: StateConfig,
    /// The [`super::ExactlyOnce`] component whose timers this fires.
    pub component: String,
    /// ZooKeeper, where the committed watermark and the firers' registrations live.
    pub zk: ZkConfig,
    /// The source streams whose committed watermarks drive the timers: the topology's streams
    /// (`--stream a --stream b`); a key fires once the minimum of their committed watermarks
    /// passes its time (records of every stream may land in one key). Their spouts must publish
    /// them: `committed_watermark_interval_ms` > 0 in the Kinesis spout's config. Timers fire by a
    /// source stream's records' arrival times: a component of a later stage (reading an
    /// intermediate stream, whose readers publish no committed watermark) cannot use them: the
    /// firer refuses to start there, naming the fix.
    pub streams: Vec<String>,
    /// How often the firer looks for due timers (ms). Default 500.
    pub poll_interval_ms: u64,
    /// A watermark that has not been available for this long is logged as a warning, with the
    /// reason (ms). Default 30000.
    pub stall_warning_ms: u64,
    /// How long the firer's start keeps trying to reach ZooKeeper (its session, and the check
    /// of where it runs) while it is away or the session expires, before the task fails (ms):
    /// as the worker's `--zk-give-up-after-ms`. Default 120000. A worker stopping meanwhile
    /// ends the wait.
    pub zk_give_up_after_ms: u64,
}

impl FirerConfig {
    /// Defaults for a component of a topology reading `stream`.
    pub fn new(state: StateConfig, component: impl Into<String>, zk: ZkConfig, stream: impl Into<String>) -> Self {
        Self {
            state,
            component: component.into(),
            zk,
            streams: vec![stream.into()],
            poll_interval_ms: 500,
            stall_warning_ms: 30_000,
            zk_give_up_after_ms: 120_000,
        }
    }

    /// The topology reads these streams (the first is its primary stream): timers wait for the
    /// minimum of their committed watermarks.
    pub fn with_streams<S: Into<String>>(mut self, streams: impl IntoIterator<Item = S>) -> Self {
        let streams: Vec<String> = streams.into_iter().map(Into::into).collect();
        if !streams.is_empty() {
            self.streams = streams;
        }
        self
    }

    /// The primary stream (the first).
    fn primary(&self) -> &str {
        self.streams.first().map_or("", String::as_str)
    }
}

struct Metrics {
    fired: Counter,
    /// Index entries of timers the item no longer holds (stale index reads), skipped.
    stale: Counter,
    confirmed: Counter,
    replayed: Counter,
    /// Firings whose tuple tree failed or timed out (emitted again by a later round).
    failed: Counter,
    conflicts: Counter,
    errors: Counter,
    /// Keys found frozen by another firer within the message timeout (its firing in flight
    /// there: a firer that joined, or whose share changed, while it ran), left to it.
    elsewhere: Counter,
}

struct Open {
    zk: ZkStore,
    /// The stores of the further streams, on `zk`'s session.
    more: Vec<ZkStore>,
    topology: String,
    store: StateStore,
    scope: String,
    m: Metrics,
}

/// The spout that fires timers of an [`super::ExactlyOnce`] component (see the module docs).
/// Run one task per worker: the live firers share the timer partitions, and take over those of
/// a worker that goes away. Its message ids are item keys.
pub struct WindowFirer<F: OnFire> {
    cfg: FirerConfig,
    logic: F,
    open: Option<Open>,
    /// This task's registration under `firers/{component}/`.
    node: Option<String>,
    next_poll: Instant,
    /// Emitted and not yet acked or failed.
    in_flight: HashSet<Arc<str>>,
    /// Acked, the timer still to be taken out of the index (at the next poll).
    unconfirmed: Vec<Arc<str>>,
    /// The id of a registration whose create failed with an unknown outcome (see
    /// `ZkStore::register_firer`): looked up before registering again.
    unconfirmed_registration: Option<String>,
    /// The share of the last poll (logged when it changes).
    last_share: Option<(usize, usize)>,
    /// The live firers' registrations, as the last poll listed them.
    live_firers: Vec<String>,
    /// The watermark and share of the last complete query round, and whether a failure asks
    /// for another.
    last_round: Option<(i64, (usize, usize))>,
    rescan: bool,
    /// Keys whose state does not deserialize (logged once each), left out of the rounds until
    /// `unreadable_retry`, when they are read again (a fixed item then fires).
    unreadable: HashSet<Arc<str>>,
    unreadable_retry: Instant,
    /// Since when the watermark has been unavailable, and whether that was logged.
    stalled_since: Option<(Instant, bool)>,
    /// The highest committed watermark read.
    highest: Option<i64>,
    /// When to look again whether this firer can fire at all (while no watermark is available).
    next_refusal_check: Instant,
    /// This firer's firings that failed or timed out: emitted again at once (their item was
    /// frozen recently, by this firer).
    own_failed: HashSet<Arc<str>>,
    /// How long after its freeze a firing not confirmed is taken to be lost by the firer that
    /// froze it (the topology's message timeout, plus a poll): fired again by whoever holds its
    /// partition then. Set at `open`.
    refire_after_ms: i64,
}

impl<F: OnFire> std::fmt::Debug for WindowFirer<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowFirer")
            .field("cfg", &self.cfg)
            .field("node", &self.node)
            .field("in_flight", &self.in_flight.len())
            .finish_non_exhaustive()
    }
}

fn component_error(what: &str, e: impl std::fmt::Display, retryable: bool) -> ComponentError {
    if retryable {
        ComponentError::retryable(format!("{what}: {e}"))
    } else {
        ComponentError::fatal(format!("{what}: {e}"))
    }
}

impl<F: OnFire> WindowFirer<F> {
    /// A firer of `cfg.component`'s timers, emitting what `logic` makes of each fired state.
    pub fn new(cfg: FirerConfig, logic: F) -> Self {
        Self {
            cfg,
            logic,
            open: None,
            node: None,
            next_poll: Instant::now(),
            in_flight: HashSet::new(),
            unconfirmed: Vec::new(),
            unconfirmed_registration: None,
            last_share: None,
            live_firers: Vec::new(),
            last_round: None,
            rescan: false,
            unreadable: HashSet::new(),
            unreadable_retry: Instant::now() + UNREADABLE_RETRY,
            stalled_since: None,
            highest: None,
            next_refusal_check: Instant::now() + REFUSAL_CHECK,
            own_failed: HashSet::new(),
            refire_after_ms: 0,
        }
    }

    /// This task's share of the timer partitions: its place among the live firers and their
    /// number (registering first when it is not registered: at start, and after its ZooKeeper
    /// session was lost). `None` while it is not registered.
    async fn share(&mut self, o: &Open) -> Result<Option<(usize, usize)>, crate::coord::CoordError> {
        if self.node.is_none() {
            // a registration whose answer was lost may have been applied: adopt its node, never
            // leave it as a second (ghost) firer that takes a share of the partitions nobody fires
            if let Some(token) = self.unconfirmed_registration.clone() {
                if let Some(node) = o.zk.find_firer(&self.cfg.component, &token).await? {
                    tracing::info!(component = %self.cfg.component, node = %node,
                        "a window firer registration whose answer was lost was applied: adopting its node");
                    self.node = Some(node);
                }
                self.unconfirmed_registration = None;
            }
        }
        if self.node.is_none() {
            let token = crate::spout::registration_token();
            self.unconfirmed_registration = Some(token.clone());
            self.node = Some(o.zk.register_firer(&self.cfg.component, &token).await?);
            self.unconfirmed_registration = None;
        }
        let firers = o.zk.firers(&self.cfg.component).await?;
        self.live_firers.clone_from(&firers);
        let me = self.node.as_deref().unwrap_or_default();
        match firers.iter().position(|f| f == me) {
            Some(i) => {
                if self.last_share != Some((i, firers.len())) {
                    // while the firers change, two may briefly take the same partition (module docs)
                    tracing::info!(component = %self.cfg.component, node = %me, place = i, firers = firers.len(),
                        in_flight = self.in_flight.len(),
                        "window firer takes the timer partitions p with p mod {} = {i}", firers.len());
                    self.last_share = Some((i, firers.len()));
                }
                Ok(Some((i, firers.len())))
            }
            None => {
                // the registration went with an expired session: register again next poll
                tracing::warn!(component = %self.cfg.component, node = %me,
                    "window firer registration is gone (ZooKeeper session lost); registering again");
                self.node = None;
                Ok(None)
            }
        }
    }

    /// The committed watermark: the minimum over the streams of each one's committed watermark,
    /// the highest such minimum read so far (a reading can be lower after a handoff, whose new
    /// owner reads acked records again; every reading stays true), or `None` (logging why when
    /// it has been unavailable long).
    async fn watermark(&mut self, o: &Open) -> Option<i64> {
        let mut min: Option<i64> = None;
        let mut why = None;
        for zk in std::iter::once(&o.zk).chain(&o.more) {
            match zk.published_watermark().await {
                Ok(Ok(w)) => min = Some(min.map_or(w, |m| m.min(w))),
                Ok(Err(reason)) => why = Some(reason),
                Err(e) => why = Some(e.to_string()),
            }
            if why.is_some() {
                break;
            }
        }
        let why = match (min, why) {
            (Some(w), None) => {
                self.stalled_since = None;
                let w = self.highest.map_or(w, |h| h.max(w));
                self.highest = Some(w);
                return Some(w);
            }
            (_, Some(why)) => why,
            (None, None) => "no stream".to_string(),
        };
        let (since, logged) = self.stalled_since.get_or_insert((Instant::now(), false));
        if !*logged && since.elapsed() >= Duration::from_millis(self.cfg.stall_warning_ms) {
            *logged = true;
            let streams = self.cfg.streams.join(", ");
            tracing::warn!(component = %self.cfg.component, streams = %streams, reason = %why,
                "no committed watermark of stream(s) {streams} for {} s: timers of `{}` cannot fire ({why}). The \
                 Kinesis spout publishes it when committed_watermark_interval_ms > 0",
                since.elapsed().as_secs(), self.cfg.component);
        }
        None
    }

    /// Why this firer can never fire, if it cannot: it runs in a later stage of a staged topology
    /// (`{topology}.{stage}`: timers fire by a source stream's committed watermark, published only
    /// by the first stage's spout), or one of its streams is an intermediate stream between two
    /// stages (whose readers publish no committed watermark). Checked at open and again while no
    /// watermark is available (a stage's registry appears when its writers start).
    async fn refusal(
        cfg: &FirerConfig,
        zk: &ZkStore,
        topology: &str,
    ) -> Result<Option<String>, crate::coord::CoordError> {
        let fix = "Fire windows in the first stage, over the source streams (`--stream`), or window a later \
                   stage in-band (squall_topology windows, which follow the stage's low watermark)";
        for stream in &cfg.streams {
            if zk.stage_stream_exists(topology, Some(stream)).await? {
                return Ok(Some(format!(
                    "window firer of component `{}`: stream `{stream}` is an intermediate stream between two stages \
                     of topology `{topology}`; its readers publish no committed watermark, so no timer would ever \
                     fire. {fix}",
                    cfg.component
                )));
            }
        }
        if let Some((base, stage)) = topology.rsplit_once('.')
            && zk.stage_stream_exists(base, None).await?
        {
            return Ok(Some(format!(
                "window firer of component `{}` runs in stage `{stage}` of topology `{base}`: timers fire by the \
                 committed watermark of the topology's source streams, which only its first stage publishes, so no \
                 timer would ever fire. {fix}",
                cfg.component
            )));
        }
        Ok(None)
    }

    /// Connects the primary stream's store and the further streams' on its session.
    async fn connect(cfg: &FirerConfig, topology: &str) -> Result<(ZkStore, Vec<ZkStore>), crate::coord::CoordError> {
        let zk = ZkStore::connect(&cfg.zk, topology, cfg.primary()).await?;
        let mut more = Vec::with_capacity(cfg.streams.len().saturating_sub(1));
        for stream in cfg.streams.iter().skip(1) {
            more.push(ZkStore::open_source_stream(zk.session().clone(), &cfg.zk.root, topology, stream).await?);
        }
        Ok((zk, more))
    }

    /// Takes the timers of acked firings out of the index, `write_concurrency` at a time; those
    /// that fail stay for the next poll.
    async fn confirm_pending(&mut self, o: &Open) {
        let acked = std::mem::take(&mut self.unconfirmed);
        let results = super::concurrently(acked, self.cfg.state.write_concurrency, |pk| {
            let store = o.store.clone();
            async move {
                let r = store.clear_timer(&pk).await;
                (pk, r)
            }
        })
        .await;
        for (pk, r) in results {
            match r {
                Ok(()) => o.m.confirmed.incr(),
                Err(e) => {
                    tracing::debug!(item = %pk, error = %e, "removing a fired timer failed; retrying at the next poll");
                    self.unconfirmed.push(pk);
                }
            }
        }
    }

    /// One round: every due timer not in flight, frozen and emitted (up to the spout's room).
    async fn fire_due(
        &mut self,
        o: &Open,
        w: i64,
        (me, firers): (usize, usize),
        out: &mut SpoutOutput<Arc<str>>,
    ) -> Result<(), StateError> {
        if Instant::now() >= self.unreadable_retry {
            self.unreadable.clear();
            self.unreadable_retry = Instant::now() + UNREADABLE_RETRY;
        }
        let mut room = out.pending_room();
        let mut complete = true;
        let partitions = self.cfg.state.timer_partitions.max(1) as usize;
        let prefix = format!("{}/", o.scope);
        // This firer's own firings that were not delivered (failed downstream, or frozen with the
        // answer lost) are emitted again from their items first, whoever's share their partition
        // is now: another firer leaves a key frozen by a live firer to it.
        let own: Vec<String> = self
            .own_failed
            .iter()
            .filter(|pk| !self.in_flight.contains(*pk))
            .take(room)
            .map(|pk| pk.to_string())
            .collect();
        for chunk in own.chunks(MAX_BATCH_GET) {
            let items = o.store.get_many(chunk).await?;
            for pk in chunk {
                self.own_failed.remove(pk.as_str());
                let Some(item) = items.get(pk) else { continue };
                let mine = item.fired && item.fired_by.is_some() && item.fired_by.as_deref() == self.node.as_deref();
                // not frozen (the freeze did not take effect), or delivered meanwhile: the rounds
                // below find it if it is still due
                let Some(timer) = item.timer.as_ref().filter(|_| mine) else { continue };
                o.m.replayed.incr();
                if self.emit(o, out, &prefix, pk, timer.fire_at, &item.state)? {
                    room = room.saturating_sub(1);
                }
            }
        }
        for n in (0..partitions).filter(|n| n % firers.max(1) == me) {
            if room == 0 {
                complete = false;
                break;
            }
            let partition = format!("{}#{n}", o.scope);
            // ask for more than the room: some may be in flight already, and keys whose state
            // cannot be read stay due (logged once) without taking the room of the others
            let skipped = self.in_flight.len() + self.unreadable.len();
            let due = o.store.due_timers(&partition, w, room + skipped).await?;
            let due: Vec<(String, i64)> = due
                .into_iter()
                .filter(|(pk, _)| !self.in_flight.contains(pk.as_str()) && !self.unreadable.contains(pk.as_str()))
                .take(room)
                .collect();
            if due.len() == room {
                complete = false;
            }
            for chunk in due.chunks(MAX_BATCH_GET) {
                let pks: Vec<String> = chunk.iter().map(|(pk, _)| pk.clone()).collect();
                let mut items = o.store.get_many(&pks).await?;
                // The index is eventually consistent (on DynamoDB; dynalite hides it): it may
                // still list a timer the item no longer has (taken out once its firing was
                // delivered: firing it again would emit it twice) or has moved. The item, read
                // strongly, decides: only a timer it still holds, due at `w`, fires.
                items.retain(|pk, item| {
                    let due = item.timer.as_ref().is_some_and(|t| t.fire_at <= w);
                    if !due {
                        o.m.stale.incr();
                        tracing::debug!(item = %pk, timer = ?item.timer, watermark = w,
                            "the timer index listed a timer the item no longer holds (or not due): skipped");
                    }
                    due
                });
                // freeze the unfired ones, write_concurrency at a time
                let to_freeze: Vec<(String, u64)> = chunk
                    .iter()
                    .filter_map(|(pk, _)| items.get(pk).filter(|i| !i.fired).map(|i| (pk.clone(), i.version)))
                    .collect();
                let by: Arc<str> = Arc::from(self.node.as_deref().unwrap_or_default());
                let frozen = super::concurrently(to_freeze, self.cfg.state.write_concurrency, |(pk, version)| {
                    let store = o.store.clone();
                    let by = by.clone();
                    async move {
                        let r = store.freeze(&pk, version, &by).await;
                        (pk, r)
                    }
                })
                .await;
                // A freeze that failed (throttled, an error) leaves its key due for the next round;
                // the keys this round did freeze are emitted all the same: left unemitted, each
                // would look like this firer's own delivered firing from then on, and never fire.
                let mut outcome = std::collections::HashMap::with_capacity(frozen.len());
                let mut failed: Option<StateError> = None;
                for (pk, r) in frozen {
                    match r {
                        Ok(o) => {
                            outcome.insert(pk, Some(o));
                        }
                        Err(e) => {
                            // Its answer may have been lost after the freeze took effect: if
                            // the next round finds it frozen by this firer, it emits it then.
                            self.own_failed.insert(Arc::from(pk.as_str()));
                            outcome.insert(pk, None);
                            failed.get_or_insert(e);
                        }
                    }
                }
                for (pk, fire_at) in chunk {
                    let Some(item) = items.get(pk) else { continue };
                    match outcome.get(pk) {
                        // frozen by this round
                        Some(Some(WriteOutcome::Written)) => {
                            self.own_failed.remove(pk.as_str());
                        }
                        // its freeze failed: the next round tries again
                        Some(None) => {
                            complete = false;
                            continue;
                        }
                        Some(Some(WriteOutcome::Conflict)) => {
                            // written since the read: the next round reads it again
                            o.m.conflicts.incr();
                            complete = false;
                            continue;
                        }
                        // frozen before: a firing not confirmed. This firer's own failed firing is
                        // emitted again at once, and its own delivered one (acked, the timer to be
                        // taken out at the next poll) is left. One frozen by another firer that is
                        // still registered is in flight there (a firer that joined, or whose share
                        // changed, while it ran): left to it, which confirms it or fails and fires
                        // it again, however long its round and the firing's tree take. One frozen
                        // by a firer that is gone (its session expired) is fired here once the
                        // message timeout passed since the freeze (a firer whose registration was
                        // rebuilt may still have it in flight until then).
                        None => {
                            let mine = self.own_failed.remove(pk.as_str());
                            let by = item.fired_by.as_deref();
                            let by_me = by.is_some_and(|b| Some(b) == self.node.as_deref());
                            let by_live = by.is_some_and(|b| !by_me && self.live_firers.iter().any(|f| f == b));
                            let recent = item
                                .fired_at_ms
                                .is_some_and(|t| crate::coord::now_ms().saturating_sub(t) < self.refire_after_ms);
                            if !mine && (by_me || by_live || recent) {
                                if !by_me {
                                    o.m.elsewhere.incr();
                                }
                                complete = false;
                                continue;
                            }
                            o.m.replayed.incr()
                        }
                    }
                    if self.emit(o, out, &prefix, pk, *fire_at, &item.state)? {
                        room = room.saturating_sub(1);
                    }
                }
                if let Some(e) = failed {
                    return Err(e);
                }
            }
        }
        if complete {
            self.last_round = Some((w, (me, firers)));
            self.rescan = false;
        }
        Ok(())
    }
}

impl<F: OnFire> WindowFirer<F> {
    /// Emits key `pk`'s frozen `state`, firing at `fire_at`, as a tracked tuple; false when it
    /// cannot (its state does not deserialize: logged once, left pending; or its output does not
    /// encode).
    fn emit(
        &mut self,
        o: &Open,
        out: &mut SpoutOutput<Arc<str>>,
        prefix: &str,
        pk: &str,
        fire_at: i64,
        state: &[u8],
    ) -> Result<bool, StateError> {
        let pk: Arc<str> = Arc::from(pk);
        let key = pk.strip_prefix(prefix).unwrap_or(&pk).to_string();
        let state = match serde_json::from_slice::<F::State>(state) {
            Ok(s) => s,
            Err(e) => {
                if self.unreadable.insert(pk.clone()) {
                    o.m.errors.incr();
                    let table = o.store.table();
                    tracing::error!(key = %key, table = %table, error = %e,
                        "timer of key `{key}` in table `{table}` cannot fire: its state does not \
                         deserialize into the firer's state type ({e}); it stays pending (read again \
                         every minute). Deploy a state type that reads it, or fix the item");
                }
                return Ok(false);
            }
        };
        let produced = self.logic.fire(&key, fire_at, state);
        let mut values = match to_values(&produced) {
            Ok(v) => v,
            Err(e) => {
                o.m.errors.incr();
                tracing::error!(key = %key, error = %e, "a fired output does not encode as a tuple");
                return Ok(false);
            }
        };
        values.push(Value::from(key.as_str()));
        values.push(Value::Int(fire_at));
        if let Err(e) = out.emit_tracked(values, pk.clone()) {
            return Err(StateError::Config(format!("emitting a fired key: {e}")));
        }
        o.m.fired.incr();
        self.in_flight.insert(pk);
        Ok(true)
    }
}

impl<F: OnFire> Spout for WindowFirer<F> {
    type MsgId = Arc<str>;

    async fn open(&mut self, ctx: &TaskContext) -> Result<(), ComponentError> {
        if !ctx.config().acking {
            return Err(ComponentError::fatal(format!(
                "window firer of component `{}` (topology `{}`) needs acking: a firing's timer leaves the index only \
                 once its tuple's tree completed, and with `acking: false` that is as soon as it is emitted, so a \
                 failed firing is lost. Set `acking: true` in the topology config (the default)",
                self.cfg.component,
                ctx.topology_name()
            )));
        }
        // A lost answer or a throttled call does not stop the worker: each step is tried again
        // (5 times, 100 ms to 2 s apart) while its error is transient.
        use backon::Retryable as _;
        let topology = ctx.topology_name();
        let store = (|| StateStore::open(&self.cfg.state.store))
            .retry(crate::coord::session::short_backoff())
            .when(StateError::is_retryable)
            .await
            .map_err(|e| component_error("window firer: opening the state store", &e, e.is_retryable()))?;
        (|| store.ensure_timer_index())
            .retry(crate::coord::session::short_backoff())
            .when(StateError::is_retryable)
            .await
            .map_err(|e| component_error("window firer: the state table's timer index", &e, e.is_retryable()))?;
        // The session and the check of where this firer runs, together: a session that expires
        // meanwhile (the worker paused while it opened) is replaced by a new one; ZooKeeper away
        // (a partition as the worker starts) is waited for up to `zk_give_up_after_ms`, as the
        // worker's own start waits (the engine ends the wait when the worker stops).
        let connect_and_check = || async {
            let (zk, more) = Self::connect(&self.cfg, topology).await?;
            let refusal = Self::refusal(&self.cfg, &zk, topology).await?;
            Ok::<_, crate::coord::CoordError>((zk, more, refusal))
        };
        let give_up = Duration::from_millis(self.cfg.zk_give_up_after_ms);
        let (zk, more, refusal) = connect_and_check
            .retry(crate::coord::session::short_backoff().with_max_times(usize::MAX).with_total_delay(Some(give_up)))
            .when(|e: &crate::coord::CoordError| {
                e.is_transient() || e.is_session_lost() || crate::coord::session::unreachable(e)
            })
            .notify(|e, after| {
                tracing::warn!(error = %e, retry_in = ?after, "window firer: ZooKeeper did not answer while it started; trying again")
            })
            .await
            .map_err(|e| {
                component_error("window firer: connecting to ZooKeeper and reading the topology's stages", e, true)
            })?;
        if let Some(why) = refusal {
            return Err(ComponentError::fatal(why));
        }
        let m = Metrics {
            fired: ctx.counter("fire_emitted"),
            stale: ctx.counter("fire_stale_index"),
            confirmed: ctx.counter("fire_confirmed"),
            replayed: ctx.counter("fire_replayed"),
            failed: ctx.counter("fire_failed"),
            conflicts: ctx.counter("fire_conflicts"),
            errors: ctx.counter("fire_errors"),
            elsewhere: ctx.counter("fire_in_flight_elsewhere"),
        };
        let timeout = i64::try_from(ctx.config().message_timeout_ms).unwrap_or(i64::MAX);
        self.refire_after_ms = timeout.saturating_add(i64::try_from(self.cfg.poll_interval_ms).unwrap_or(0));
        let scope = scope(ctx.topology_name(), &self.cfg.component);
        self.open = Some(Open { zk, more, topology: ctx.topology_name().to_string(), store, scope, m });
        Ok(())
    }

    async fn next_tuple(&mut self, out: &mut SpoutOutput<Arc<str>>) -> Result<(), ComponentError> {
        let now = Instant::now();
        if now < self.next_poll {
            return Ok(());
        }
        self.next_poll = now + Duration::from_millis(self.cfg.poll_interval_ms.max(10));
        let Some(mut o) = self.open.take() else { return Ok(()) };
        let r = self.poll(&mut o, out).await;
        self.open = Some(o);
        r
    }

    async fn ack(&mut self, pk: Arc<str>) {
        // confirmed (taken out of the index) in bulk at the next poll
        self.in_flight.remove(&pk);
        self.unconfirmed.push(pk);
    }

    async fn fail(&mut self, pk: Arc<str>) {
        // the timer stays in the index: the next round emits the frozen state again
        self.in_flight.remove(&pk);
        self.own_failed.insert(pk.clone());
        self.rescan = true;
        if let Some(o) = &self.open {
            o.m.failed.incr();
        }
        tracing::info!(component = %self.cfg.component, item = %pk,
            "a firing failed or timed out downstream; its timer stays in the index and the next round emits it again \
             (same frozen state, same fire_key: a consumer that counts each firing once deduplicates by it)");
    }

    async fn close(&mut self) {
        if let Some(o) = self.open.take() {
            // Firings acked since the last poll (at a drain or a stop, the engine delivers the
            // acks of every firing in flight before closing): their timers leave the index now,
            // or the next deployment's firer would emit them again.
            if !self.unconfirmed.is_empty() {
                self.confirm_pending(&o).await;
                if !self.unconfirmed.is_empty() {
                    tracing::warn!(component = %self.cfg.component, left = self.unconfirmed.len(),
                        "window firer stopping: some delivered firings could not be taken out of the timer index; \
                         the next firer emits them again (same frozen state, same fire_key)");
                }
            }
            o.zk.close_gracefully().await;
        }
    }
}

impl<F: OnFire> WindowFirer<F> {
    async fn poll(&mut self, o: &mut Open, out: &mut SpoutOutput<Arc<str>>) -> Result<(), ComponentError> {
        if !self.unconfirmed.is_empty() {
            self.confirm_pending(o).await;
        }
        let share = match self.share(o).await {
            Ok(Some(share)) => share,
            Ok(None) => return Ok(()),
            Err(e) if e.is_session_lost() => {
                // its registration went with the session: a new session, registered again
                tracing::warn!(component = %self.cfg.component, error = %e,
                    "window firer lost its ZooKeeper session; connecting a new one");
                self.node = None;
                match Self::connect(&self.cfg, &o.topology).await {
                    Ok((zk, more)) => {
                        o.more = more;
                        std::mem::replace(&mut o.zk, zk).close()
                    }
                    Err(e) => tracing::warn!(component = %self.cfg.component, error = %e,
                        "window firer cannot connect to ZooKeeper; retrying at the next poll"),
                }
                return Ok(());
            }
            Err(e) => {
                tracing::warn!(component = %self.cfg.component, error = %e, "window firer cannot reach ZooKeeper");
                return Ok(());
            }
        };
        let Some(w) = self.watermark(o).await else {
            // a stage's registry appears when its writers start: look again now and then
            if Instant::now() >= self.next_refusal_check {
                self.next_refusal_check = Instant::now() + REFUSAL_CHECK;
                if let Ok(Some(why)) = Self::refusal(&self.cfg, &o.zk, &o.topology).await {
                    return Err(ComponentError::fatal(why));
                }
            }
            return Ok(());
        };
        if self.last_round == Some((w, share)) && !self.rescan {
            return Ok(());
        }
        if let Err(e) = self.fire_due(o, w, share, out).await {
            o.m.errors.incr();
            tracing::warn!(component = %self.cfg.component, error = %e, "firing timers failed; retrying at the next poll");
        }
        Ok(())
    }
}
