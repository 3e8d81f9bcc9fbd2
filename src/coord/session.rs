//! ZooKeeper sessions: [`ZkSession`] (one connected client) and [`SharedSession`] (the one
//! session of a worker process, shared by its spout tasks and its lifecycle loop, rebuilt after
//! expiry).
//!
//! One session per worker, not one per spout task: fewer connections (ZooKeeper's default
//! `maxClientCnxns` is 60 per address), one ping stream, and one place that knows whether the
//! session is still safe. Fencing does not depend on it: every lease is its own znode, so two tasks
//! of one worker never pass for each other.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use backon::{ExponentialBuilder, Retryable};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use zookeeper_client as zk;

use super::config::ZkConfig;
use super::error::CoordError;
use super::watch::{SessionAlarm, SessionStatus, SessionWatch};
use super::zkapi::{RealClient, ZkClient, registered};

/// Process-wide ZooKeeper counters, read by the metrics endpoint ([`zk_counters`]).
#[derive(Debug, Default)]
pub struct ZkCounters {
    requests: AtomicU64,
    expirations: AtomicU64,
}

impl ZkCounters {
    /// Requests sent to ZooKeeper by this process (reads, writes, transactions, watches set).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Sessions of this process that ended (expired) and were replaced by a new one.
    pub fn expirations(&self) -> u64 {
        self.expirations.load(Ordering::Relaxed)
    }

    /// Counts one request (called where the coordination code calls the client).
    pub(crate) fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }
}

/// This process's ZooKeeper counters.
pub fn zk_counters() -> &'static ZkCounters {
    static COUNTERS: OnceLock<ZkCounters> = OnceLock::new();
    COUNTERS.get_or_init(ZkCounters::default)
}

/// A ZooKeeper operation, as seen by an injected-fault hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ZkOp {
    Create,
    Delete,
    List,
    Exists,
    GetData,
    Multi,
}

/// What an injected fault does to one operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InjectedFault {
    /// Fail without sending the request.
    Before(zk::Error),
    /// Send the request (it takes effect on the server), then report this error: the caller
    /// cannot know whether it happened, as after a real connection loss.
    After(zk::Error),
}

/// A fault-injection hook: called before each lease and checkpoint operation with the operation
/// and the znode path. For tests only; a session has none unless one is installed.
pub type FaultHook = Arc<dyn Fn(ZkOp, &str) -> Option<InjectedFault> + Send + Sync>;

/// One connected ZooKeeper session. Dropping the last reference closes it.
pub struct ZkSession {
    pub(crate) client: Arc<dyn ZkClient>,
    name: String,
    faults: Mutex<Option<FaultHook>>,
}

impl fmt::Debug for ZkSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkSession").field("session", &self.name).finish_non_exhaustive()
    }
}

impl ZkSession {
    /// Connects (bounded retry with back-off; the error names the connect string).
    pub async fn connect(cfg: &ZkConfig) -> Result<Arc<Self>, CoordError> {
        cfg.validate()?;
        let client = connect_client(cfg).await?;
        let name = format!("{:#x}", client.session_id());
        info!(
            connect = %cfg.connect,
            session = %name,
            timeout_ms = client.session_timeout().as_millis() as u64,
            "connected to ZooKeeper"
        );
        Ok(Arc::new(Self { client, name, faults: Mutex::new(None) }))
    }

    /// The session id in hex, as written into leases and task registrations.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The session timeout the server granted (it clamps the requested one).
    pub fn timeout(&self) -> Duration {
        self.client.session_timeout()
    }

    /// Observes Connected / Disconnected / Expired.
    pub fn state(&self) -> SessionWatch {
        SessionWatch::new(self.client.state_watcher(), self.client.session_timeout())
    }

    /// Installs a fault-injection hook (tests only). See [`FaultHook`].
    pub fn inject_faults(&self, hook: Option<FaultHook>) {
        *self.faults.lock().unwrap_or_else(|p| p.into_inner()) = hook;
    }

    /// The fault to inject into `op` on `path`, if a hook is installed and wants one.
    pub(crate) fn fault(&self, op: ZkOp, path: &str) -> Option<InjectedFault> {
        let hook = self.faults.lock().unwrap_or_else(|p| p.into_inner()).clone();
        hook.and_then(|h| h(op, path))
    }

    /// Closes the session once the last other reference is gone and waits (up to 3 s) until the
    /// server confirmed it, so ephemeral nodes are gone for everyone. Other references keep the
    /// session open; then this returns at once.
    pub async fn close_gracefully(self: Arc<Self>) {
        let mut watcher = self.client.state_watcher();
        if Arc::strong_count(&self) > 1 {
            return;
        }
        drop(self);
        let wait = async {
            loop {
                if watcher.changed().await.is_terminated() {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(3), wait).await;
    }
}

/// Whether a failed connect may succeed later: the server could not be reached (not refused
/// credentials, not bad arguments).
pub(crate) fn unreachable(e: &CoordError) -> bool {
    matches!(e, CoordError::Connect { source, .. } if !matches!(source, zk::Error::AuthFailed | zk::Error::BadArguments(_)))
}

pub(crate) fn short_backoff() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(2))
        .with_max_times(5)
        .with_jitter_seed(crate::random::u64())
}

/// The connection timeout given to the ZooKeeper client for a session timeout.
pub(crate) fn connection_timeout(session_timeout: Duration) -> Duration {
    session_timeout.min(Duration::from_secs(5))
}

/// How long after it last heard from the server the client reports Disconnected, with
/// [`connection_timeout`]: zookeeper-client uses the configured connection timeout when it is at
/// most 3/5 of the session timeout, else 2/5 of the session timeout.
pub(crate) fn disconnect_detection(session_timeout: Duration) -> Duration {
    let configured = connection_timeout(session_timeout);
    if configured > session_timeout * 3 / 5 { session_timeout * 2 / 5 } else { configured }
}

pub(crate) async fn connect_client(cfg: &ZkConfig) -> Result<Arc<dyn ZkClient>, CoordError> {
    if let Some(connector) =
        registered(&cfg.connect).map_err(|source| CoordError::Connect { connect: cfg.connect.clone(), source })?
    {
        return connector
            .connect(cfg)
            .await
            .map_err(|source| CoordError::Connect { connect: cfg.connect.clone(), source });
    }
    let attempt = || async {
        let mut connector = zk::Client::connector()
            .with_session_timeout(cfg.session_timeout)
            .with_connection_timeout(connection_timeout(cfg.session_timeout))
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
        .map(|client| {
            debug!(connect = %cfg.connect, session = %format!("{:#x}", client.session_id().0), "ZooKeeper session opened");
            Arc::new(RealClient::new(client, cfg.auth.is_some())) as Arc<dyn ZkClient>
        })
}

/// Whether the shared session may be relied on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// Connected: leases are safe.
    Ok,
    /// Disconnected for more than half the session timeout: stop fetching, leases may be gone.
    Unsafe,
    /// The session expired; a new one is being built. Every lease and registration is gone.
    Lost,
    /// No session could be built for longer than the give-up time (or the credentials are
    /// refused): the worker must exit with an error so its supervisor restarts it.
    Failed(String),
}

/// The state of a [`SharedSession`] at one moment.
#[derive(Clone, Debug)]
pub struct SessionView {
    /// Bumped each time a new session replaces an expired one.
    pub generation: u64,
    /// The session of this generation; `None` while a new one is being built.
    pub session: Option<Arc<ZkSession>>,
    pub health: Health,
}

/// Whether this process may trust its leases right now, checked by readers just before they hand
/// records on.
///
/// A process that was paused (SIGSTOP, a long GC-like stall, a starved VM) may have lost its
/// session on the server without knowing yet: after it resumes, a reader whose GetRecords was in
/// flight must not pass those records on before the session is confirmed. A ticker records a
/// heartbeat every 100 ms; when it sees a gap of more than a third of the session timeout it marks
/// the process suspect *before* refreshing the heartbeat, and clears it only after a round trip to
/// ZooKeeper confirmed the session. A reader that finds the heartbeat stale (the ticker has not run
/// since the pause) or the process suspect drops the batch and fetches it again later.
///
/// Nor are leases trusted while the session is not healthy ([`Health::Ok`]): from the moment it
/// turns unsafe (disconnected past its grace, half a session timeout before the server can expire
/// it) nothing is handed on, so a worker cut from ZooKeeper does not emit its queued records while
/// another may already own its shards.
#[derive(Debug)]
pub struct Liveness {
    last_tick_ms: AtomicU64,
    suspect: AtomicBool,
    stale_after_ms: u64,
    /// The session's health is Ok (set with every published view).
    healthy: AtomicBool,
    /// The generation of the session `healthy` speaks of: leases taken in an earlier one are
    /// gone, however healthy the new session is.
    generation: AtomicU64,
    /// What the heartbeat's milliseconds count from (tokio's clock: simulated time in the
    /// simulator).
    base: Instant,
}

impl Liveness {
    fn new(session_timeout: Duration, generation: u64) -> Self {
        Self {
            base: Instant::now(),
            last_tick_ms: AtomicU64::new(0),
            suspect: AtomicBool::new(false),
            stale_after_ms: (session_timeout.as_millis() as u64 / 3).max(300),
            healthy: AtomicBool::new(true),
            generation: AtomicU64::new(generation),
        }
    }

    /// True when leases can be trusted now (the session healthy, no pause noticed, heartbeat
    /// fresh).
    pub fn trusted(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
            && !self.suspect.load(Ordering::Acquire)
            && self.mono_ms().saturating_sub(self.last_tick_ms.load(Ordering::Acquire)) < self.stale_after_ms
    }

    /// Milliseconds since this was built.
    fn mono_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64
    }

    /// True when the leases taken in session `generation` can be trusted now: [`Self::trusted`],
    /// and that session is still the current one. After a session expired and a new one was
    /// built, the new one is healthy while the tasks of the old one have not noticed yet (their
    /// coordinators act on the next view): what their readers fetched under the old leases is not
    /// handed on.
    pub fn trusted_in(&self, generation: u64) -> bool {
        self.generation.load(Ordering::Acquire) == generation && self.trusted()
    }
}

async fn tick_liveness(live: Arc<Liveness>, view: watch::Sender<SessionView>, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = live.mono_ms();
        let gap = now.saturating_sub(live.last_tick_ms.load(Ordering::Acquire));
        if gap >= live.stale_after_ms {
            // Suspect first, then the fresh heartbeat: a reader never sees one without the other.
            live.suspect.store(true, Ordering::Release);
            live.last_tick_ms.store(now, Ordering::Release);
            warn!(paused_ms = gap, "this process was paused: verifying the ZooKeeper session before reading on");
        } else {
            live.last_tick_ms.store(now, Ordering::Release);
        }
        // Otherwise the session monitor sees the expiry (or the disconnection) and the round trip
        // succeeds only on the next generation's session.
        if live.suspect.load(Ordering::Acquire) {
            if confirm(&view).await {
                info!("ZooKeeper session confirmed: reading on");
                live.suspect.store(false, Ordering::Release);
            }
            // The round trip is not a pause.
            live.last_tick_ms.store(live.mono_ms(), Ordering::Release);
        }
    }
}

/// One round trip on a connected, healthy session.
async fn confirm(view: &watch::Sender<SessionView>) -> bool {
    let v = view.borrow().clone();
    let Some(s) = v.session.filter(|_| v.health == Health::Ok) else { return false };
    if s.client.state() != zk::SessionState::SyncConnected {
        return false;
    }
    zk_counters().request();
    matches!(tokio::time::timeout(Duration::from_secs(5), s.client.check_stat("/")).await, Ok(Ok(_)))
}

/// The one ZooKeeper session of a worker process, shared by its spout tasks and its lifecycle
/// loop. It watches the session and publishes [`SessionView`]s: `Unsafe` after half the session
/// timeout disconnected, `Lost` when it expired, then a new generation once a new session is up,
/// or `Failed` when none could be built within `give_up_after`.
///
/// A worker that must re-read its lifecycle state before its coordination uses a new session
/// (a drain or a new deployment may have come while it had none) calls
/// [`SharedSession::hold_new_sessions`]: a later generation is then only used by the spouts'
/// coordinators (and whatever asks [`SharedSession::admitted`]) once the worker called
/// [`SharedSession::admit`] for it.
#[derive(Debug)]
pub struct SharedSession {
    cfg: ZkConfig,
    view: watch::Sender<SessionView>,
    cancel: CancellationToken,
    liveness: Arc<Liveness>,
    /// New generations wait for [`SharedSession::admit`].
    hold: AtomicBool,
    /// The highest generation admitted (the first is).
    admitted: watch::Sender<u64>,
}

impl SharedSession {
    /// Connects the first session and starts watching it. A ZooKeeper that cannot be reached is
    /// tried again (each failure logged with the connect string) for `give_up_after`, as a lost
    /// session is: a worker started while ZooKeeper is briefly away (a rolling restart) waits for
    /// it rather than exiting into its supervisor's back-off. Refused credentials or arguments, or
    /// no session by then, are returned, naming the connect string.
    pub async fn connect(cfg: &ZkConfig, give_up_after: Duration) -> Result<Arc<Self>, CoordError> {
        let started = Instant::now();
        let mut delay = Duration::from_millis(200);
        let first = loop {
            let left = give_up_after.saturating_sub(started.elapsed()).max(Duration::from_millis(100));
            let attempt = tokio::time::timeout(left, ZkSession::connect(cfg)).await.unwrap_or_else(|_| {
                Err(CoordError::Connect { connect: cfg.connect.clone(), source: zk::Error::Timeout })
            });
            match attempt {
                Ok(session) => break session,
                Err(e) if started.elapsed() >= give_up_after || !unreachable(&e) => return Err(e),
                Err(e) => warn!(connect = %cfg.connect, error = %e, retry_in = ?delay,
                    give_up_in = ?give_up_after.saturating_sub(started.elapsed()),
                    "connecting to ZooKeeper failed; retrying until the give-up time (--zk-give-up-after-ms)"),
            }
            tokio::time::sleep(delay.min(give_up_after.saturating_sub(started.elapsed()))).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        };
        let (view, _) = watch::channel(SessionView { generation: 1, session: Some(first.clone()), health: Health::Ok });
        let liveness = Arc::new(Liveness::new(first.timeout(), 1));
        let shared = Arc::new(Self {
            cfg: cfg.clone(),
            view,
            cancel: CancellationToken::new(),
            liveness,
            hold: AtomicBool::new(false),
            admitted: watch::channel(1).0,
        });
        tokio::spawn(tick_liveness(shared.liveness.clone(), shared.view.clone(), shared.cancel.clone()));
        tokio::spawn(monitor(
            shared.cfg.clone(),
            shared.view.clone(),
            shared.liveness.clone(),
            first,
            give_up_after,
            shared.cancel.clone(),
        ));
        Ok(shared)
    }

    /// Whether leases can be trusted right now (see [`Liveness`]).
    pub fn liveness(&self) -> Arc<Liveness> {
        self.liveness.clone()
    }

    /// From now on, a new session (after an expiry) is used by the coordination only once
    /// [`SharedSession::admit`] was called for its generation. The first session is admitted.
    pub fn hold_new_sessions(&self) {
        self.hold.store(true, Ordering::Release);
    }

    /// Lets the coordination use the session of `generation` (and earlier ones).
    pub fn admit(&self, generation: u64) {
        self.admitted.send_if_modified(|a| {
            let more = generation > *a;
            *a = (*a).max(generation);
            more
        });
    }

    /// Whether the coordination may use the session of `generation`.
    pub fn admitted(&self, generation: u64) -> bool {
        !self.hold.load(Ordering::Acquire) || *self.admitted.borrow() >= generation
    }

    /// Follows the admitted generation.
    pub fn admissions(&self) -> watch::Receiver<u64> {
        self.admitted.subscribe()
    }

    /// The configuration the sessions are built from.
    pub fn config(&self) -> &ZkConfig {
        &self.cfg
    }

    /// True when the current session is healthy and its client connected to a server.
    pub fn connected(&self) -> bool {
        let v = self.view.borrow();
        v.health == Health::Ok
            && v.session.as_ref().is_some_and(|s| s.client.state() == zk::SessionState::SyncConnected)
    }

    /// The current view.
    pub fn current(&self) -> SessionView {
        self.view.borrow().clone()
    }

    /// Follows the views.
    pub fn subscribe(&self) -> watch::Receiver<SessionView> {
        self.view.subscribe()
    }

    /// Stops watching and closes the current session (ephemeral nodes vanish at once) once every
    /// other holder dropped it.
    pub async fn close(&self) {
        self.cancel.cancel();
        let session = self.view.send_replace(SessionView {
            generation: u64::MAX,
            session: None,
            health: Health::Failed("closed".into()),
        });
        self.liveness.generation.store(u64::MAX, Ordering::Release);
        self.liveness.healthy.store(false, Ordering::Release);
        if let Some(s) = session.session {
            s.close_gracefully().await;
        }
    }
}

impl Drop for SharedSession {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Publishes a change of the session view, and whether it is healthy to `live`.
fn publish(view: &watch::Sender<SessionView>, live: &Liveness, f: impl FnOnce(&mut SessionView)) {
    view.send_modify(|v| {
        f(v);
        live.generation.store(v.generation, Ordering::Release);
        live.healthy.store(v.health == Health::Ok, Ordering::Release);
    });
}

async fn monitor(
    cfg: ZkConfig,
    view: watch::Sender<SessionView>,
    live: Arc<Liveness>,
    first: Arc<ZkSession>,
    give_up_after: Duration,
    cancel: CancellationToken,
) {
    let mut state = first.state();
    drop(first);
    loop {
        let alarm = tokio::select! {
            _ = cancel.cancelled() => return,
            a = state.wait_unsafe() => a,
        };
        match alarm {
            SessionAlarm::DisconnectedTooLong => {
                warn!("ZooKeeper disconnected for more than half the session timeout: reads stop until it is back");
                publish(&view, &live, |v| v.health = Health::Unsafe);
                let terminal = loop {
                    let st = tokio::select! {
                        _ = cancel.cancelled() => return,
                        st = state.changed() => st,
                    };
                    if st.is_terminal() {
                        break st;
                    }
                    if matches!(st, SessionStatus::Connected | SessionStatus::ConnectedReadOnly) {
                        info!("ZooKeeper connection back (same session)");
                        publish(&view, &live, |v| v.health = Health::Ok);
                        break SessionStatus::Connected;
                    }
                };
                if !terminal.is_terminal() {
                    continue;
                }
                if !rebuild(&cfg, &view, &live, terminal, give_up_after, &cancel, &mut state).await {
                    return;
                }
            }
            SessionAlarm::Terminal(st) => {
                if !rebuild(&cfg, &view, &live, st, give_up_after, &cancel, &mut state).await {
                    return;
                }
            }
        }
    }
}

/// The session ended: publish `Lost`, then build a new one (new generation) or give up.
/// Returns false when the monitor must stop.
async fn rebuild(
    cfg: &ZkConfig,
    view: &watch::Sender<SessionView>,
    live: &Liveness,
    ended: SessionStatus,
    give_up_after: Duration,
    cancel: &CancellationToken,
    state: &mut SessionWatch,
) -> bool {
    if cancel.is_cancelled() {
        return false;
    }
    if ended == SessionStatus::AuthFailed {
        let msg = format!(
            "ZooKeeper at {} refused the credentials: check the digest user and password (SQUALL_ZK_USER, SQUALL_ZK_PASSWORD)",
            cfg.connect
        );
        tracing::error!("{msg}");
        publish(view, live, |v| {
            v.session = None;
            v.health = Health::Failed(msg);
        });
        return false;
    }
    zk_counters().expirations.fetch_add(1, Ordering::Relaxed);
    warn!(state = ?ended, "ZooKeeper session ended: every lease and registration of this worker is gone; building a new session");
    publish(view, live, |v| {
        v.session = None;
        v.health = Health::Lost;
    });
    let started = Instant::now();
    let mut delay = Duration::from_millis(200);
    loop {
        // Each attempt is bounded by the time left: one attempt retries and waits up to the
        // session timeout per try, so an unbounded one would overshoot `give_up_after` by minutes
        // on a silent network.
        let left = give_up_after.saturating_sub(started.elapsed()).max(Duration::from_millis(100));
        let attempt = tokio::select! {
            _ = cancel.cancelled() => return false,
            r = tokio::time::timeout(left, ZkSession::connect(cfg)) => r.unwrap_or_else(|_| {
                Err(CoordError::Connect { connect: cfg.connect.clone(), source: zk::Error::Timeout })
            }),
        };
        match attempt {
            Ok(session) => {
                *state = session.state();
                info!(session = %session.name(), "new ZooKeeper session: re-registering and re-acquiring");
                publish(view, live, |v| {
                    v.generation += 1;
                    v.session = Some(session);
                    v.health = Health::Ok;
                });
                return true;
            }
            Err(e) if started.elapsed() >= give_up_after || matches!(e, CoordError::NotAuthorized { .. }) => {
                let msg = format!("gave up on ZooKeeper after {:?} without a session: {e}", started.elapsed());
                tracing::error!("{msg}");
                publish(view, live, |v| v.health = Health::Failed(msg));
                return false;
            }
            Err(e) => warn!(error = %e, retry_in = ?delay, "building a new ZooKeeper session failed; retrying"),
        }
        let left = give_up_after.saturating_sub(started.elapsed());
        tokio::select! {
            _ = cancel.cancelled() => return false,
            _ = tokio::time::sleep(delay.min(left)) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(generation: u64, health: Health) -> SessionView {
        SessionView { generation, session: None, health }
    }

    /// The leases of an expired session are not trusted once a new, healthy session replaced
    /// it: a reader of the old session's task (whose coordinator has not noticed yet) hands
    /// nothing on (the chaos test's zombie read under its old task 6 ms after its worker's new
    /// session was confirmed, while another task owned the shard).
    #[test]
    fn leases_of_a_replaced_session_are_not_trusted_by_the_new_ones_health() {
        let live = Liveness::new(Duration::from_secs(10), 1);
        let (tx, _rx) = watch::channel(view(1, Health::Ok));
        publish(&tx, &live, |v| *v = view(1, Health::Ok));
        assert!(live.trusted_in(1));
        publish(&tx, &live, |v| v.health = Health::Lost);
        assert!(!live.trusted_in(1), "lost");
        publish(&tx, &live, |v| {
            v.generation += 1;
            v.health = Health::Ok;
        });
        assert!(live.trusted(), "the new session is healthy");
        assert!(!live.trusted_in(1), "the old session's leases are gone");
        assert!(live.trusted_in(2));
    }
}
