//! Change notifications and session state, as the spout runtime sees them.

use std::time::Duration;

use zookeeper_client as zk;

/// What changed under the topology path (from one persistent recursive watch).
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChangeEvent {
    /// A task registered or went away: recompute leader and assignment.
    Tasks,
    /// The shard list changed.
    Shards,
    /// The checkpoint of this shard was created, changed or deleted.
    Checkpoint(String),
    /// A lease of this shard was created or deleted (e.g. the old owner released it).
    Owners(String),
    /// The topology lifecycle state changed.
    State,
    /// A drain notification was written (`squall drain`).
    Drain,
    /// The connection dropped; events may be missed until [`ChangeEvent::Reconnected`].
    Disconnected,
    /// The connection is back (same session). Events during the outage may have been lost
    /// (ZOOKEEPER-4698): re-read tasks, shards and checkpoints.
    Reconnected,
    /// The session expired (or the store was closed): leases and the task registration are gone.
    /// Stop reading, build a new store, register and re-acquire. No more events follow.
    SessionLost,
}

/// Maps a node path to an event for this topology and stream; `None` for paths nobody needs.
pub(crate) fn classify(topology: &str, stream: &str, path: &str) -> Option<ChangeEvent> {
    let rest = path.strip_prefix(topology)?.strip_prefix('/')?;
    let mut parts = rest.split('/');
    match (parts.next()?, parts.next(), parts.next(), parts.next()) {
        ("state", None, _, _) => Some(ChangeEvent::State),
        ("drain", None, _, _) => Some(ChangeEvent::Drain),
        ("tasks", _, _, _) => Some(ChangeEvent::Tasks),
        ("streams", Some(s), Some(kind), id) if s == stream => match (kind, id) {
            ("shards", None) => Some(ChangeEvent::Shards),
            ("checkpoints", Some(id)) => Some(ChangeEvent::Checkpoint(id.to_string())),
            ("owners", Some(id)) => Some(ChangeEvent::Owners(id.to_string())),
            _ => None,
        },
        _ => None,
    }
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
    inner: zk::StateWatcher,
    session_timeout: Duration,
}

impl SessionWatch {
    pub(crate) fn new(inner: zk::StateWatcher, session_timeout: Duration) -> Self {
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

    /// Resolves when the runtime must stop fetching: disconnected for longer than
    /// `session_timeout / 2`, or a terminal state. Use it in the runtime's `select!`.
    pub async fn wait_unsafe(&mut self) -> SessionAlarm {
        let grace = self.session_timeout / 2;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_paths() {
        let t = "/r/topologies/wc";
        assert_eq!(classify(t, "s", "/r/topologies/wc/tasks/task-0000000001"), Some(ChangeEvent::Tasks));
        assert_eq!(classify(t, "s", "/r/topologies/wc/tasks"), Some(ChangeEvent::Tasks));
        assert_eq!(classify(t, "s", "/r/topologies/wc/state"), Some(ChangeEvent::State));
        assert_eq!(classify(t, "s", "/r/topologies/wc/streams/s/shards"), Some(ChangeEvent::Shards));
        assert_eq!(
            classify(t, "s", "/r/topologies/wc/streams/s/checkpoints/sh-1"),
            Some(ChangeEvent::Checkpoint("sh-1".into()))
        );
        assert_eq!(
            classify(t, "s", "/r/topologies/wc/streams/s/owners/sh-1/lease-0000000003"),
            Some(ChangeEvent::Owners("sh-1".into()))
        );
        assert_eq!(classify(t, "s", "/r/topologies/wc/streams/other/shards"), None);
        assert_eq!(classify(t, "s", "/r/topologies/wc/streams/s/checkpoints"), None);
        assert_eq!(classify(t, "s", "/r/topologies/wc"), None);
        assert_eq!(classify(t, "s", "/r/topologies/wcx/state"), None);
    }
}
