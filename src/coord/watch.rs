//! Change notifications and session state, as the spout runtime sees them.

use std::time::Duration;

use zookeeper_client as zk;

/// What changed, from the persistent watches of [`super::ZkStore::watch`].
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChangeEvent {
    /// A task registered or went away: the leader recomputes the assignment.
    Tasks,
    /// The assignment changed (or was deleted).
    Assignment,
    /// A finished marker was created or deleted: a shard finished (or was reset).
    Finished,
    /// The topology lifecycle state changed.
    State,
    /// A drain notification was written (`squall drain`).
    Drain,
    /// The connection dropped; events may be missed until [`ChangeEvent::Reconnected`].
    Disconnected,
    /// The connection is back (same session). Events during the outage may have been lost
    /// (ZOOKEEPER-4698): re-read what is watched.
    Reconnected,
    /// The session expired (or the store was closed): leases and the task registration are gone.
    /// Stop reading, build a new store, register and re-acquire. No more events follow.
    SessionLost,
}

/// Session state as the runtime needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionStatus {
    /// Connected; leases are safe.
    Connected,
    /// Connected to a read-only server: reads work, lease and checkpoint writes fail.
    ConnectedReadOnly,
    /// Connection lost; the session may still be alive on the server. After about half the
    /// session timeout the runtime must stop fetching: its leases may already be gone.
    Disconnected,
    /// Terminal: the session expired; build a new store.
    Expired,
    /// Terminal: the store was closed.
    Closed,
    /// Terminal: authentication failed; fix the credentials.
    AuthFailed,
}

impl SessionStatus {
    /// No further change will come; the store is unusable.
    pub fn is_terminal(self) -> bool {
        matches!(self, SessionStatus::Expired | SessionStatus::Closed | SessionStatus::AuthFailed)
    }
}

impl From<zk::SessionState> for SessionStatus {
    fn from(s: zk::SessionState) -> Self {
        match s {
            zk::SessionState::SyncConnected => SessionStatus::Connected,
            zk::SessionState::ConnectedReadOnly => SessionStatus::ConnectedReadOnly,
            zk::SessionState::Disconnected => SessionStatus::Disconnected,
            zk::SessionState::Expired => SessionStatus::Expired,
            zk::SessionState::Closed => SessionStatus::Closed,
            zk::SessionState::AuthFailed => SessionStatus::AuthFailed,
        }
    }
}

/// How long [`SessionWatch::wait_unsafe`] waits after Disconnected.
pub(crate) fn unsafe_grace(session_timeout: Duration) -> Duration {
    (session_timeout / 2)
        .saturating_sub(super::session::disconnect_detection(session_timeout))
        .max(session_timeout / 10)
}

#[cfg(test)]
mod grace_tests {
    use super::*;
    use crate::coord::session::disconnect_detection;

    #[test]
    fn unsafe_comes_half_a_timeout_before_the_server_can_expire_the_session() {
        for ms in [2_000u64, 4_000, 6_000, 10_000, 20_000, 30_000, 60_000] {
            let t = Duration::from_millis(ms);
            let at = disconnect_detection(t) + unsafe_grace(t);
            assert!(at <= t * 6 / 10, "{t:?}: unsafe {at:?} after the last contact");
            assert!(unsafe_grace(t) >= t / 10, "{t:?}: a disconnection shorter than a tenth of it is not unsafe");
        }
        assert_eq!(
            disconnect_detection(Duration::from_secs(4)) + unsafe_grace(Duration::from_secs(4)),
            Duration::from_secs(2)
        );
    }
}

/// What [`SessionWatch::wait_unsafe`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionAlarm {
    /// Disconnected for longer than the grace period: stop fetching (leases may be lost).
    DisconnectedTooLong,
    /// The session ended for good ([`SessionStatus::is_terminal`]).
    Terminal(SessionStatus),
}

/// Observes the session of one store; cheap to create, one per consumer.
#[derive(Clone, Debug)]
pub struct SessionWatch {
    inner: super::zkapi::StateWatcher,
    session_timeout: Duration,
}

impl SessionWatch {
    pub(crate) fn new(inner: super::zkapi::StateWatcher, session_timeout: Duration) -> Self {
        Self { inner, session_timeout }
    }

    /// The latest state.
    pub fn current(&self) -> SessionStatus {
        self.inner.peek_state().into()
    }

    /// Waits for the next state change. Never returns after a terminal state was returned.
    pub async fn changed(&mut self) -> SessionStatus {
        self.inner.changed().await.into()
    }

    /// The session timeout the server granted.
    pub fn session_timeout(&self) -> Duration {
        self.session_timeout
    }

    /// Resolves when the runtime must stop fetching and emitting: half the session timeout after
    /// the client last heard from the server, or a terminal state. Use it in the runtime's
    /// `select!`.
    ///
    /// The client reports Disconnected only some time after it last heard from the server
    /// ([`super::session::disconnect_detection`]: 1.6 s of a 4 s timeout); the grace counts from
    /// there, so that unsafe comes half a session timeout before the server can expire the
    /// session (at least a tenth of it after Disconnected), not a few hundred milliseconds.
    pub async fn wait_unsafe(&mut self) -> SessionAlarm {
        let grace = unsafe_grace(self.session_timeout);
        let mut state = self.current();
        loop {
            if state.is_terminal() {
                return SessionAlarm::Terminal(state);
            }
            if state == SessionStatus::Disconnected {
                match tokio::time::timeout(grace, self.changed()).await {
                    Err(_) => return SessionAlarm::DisconnectedTooLong,
                    Ok(next) => state = next,
                }
            } else {
                state = self.changed().await;
            }
        }
    }
}
