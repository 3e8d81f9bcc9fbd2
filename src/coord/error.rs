//! The one error type of the coordination layer.

use zookeeper_client as zk;

/// Whose problem an error is, so callers can decide between retrying, rebuilding and giving up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorDomain {
    /// ZooKeeper unreachable, session lost, server trouble: usually transient.
    Infrastructure,
    /// Another participant got there first (version race, lease held, fenced): re-read and decide again.
    Coordination,
    /// Stored data is unreadable: an operator has to repair or reset it.
    Data,
    /// The caller passed something invalid: a bug or a bad configuration.
    Caller,
}

/// Errors of [`super::ZkStore`] and the coordination helpers.
///
/// Every message names the znode path (or connect string) involved and says how to fix it.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    #[error("invalid ZooKeeper configuration: {reason}")]
    InvalidConfig { reason: String },

    #[error("invalid {what} {name:?}: {reason}")]
    InvalidName { what: &'static str, name: String, reason: &'static str },

    #[error(
        "cannot connect to ZooKeeper at {connect}: {source}; check that ZooKeeper is running there \
         (`localstack/up` starts one on 127.0.0.1:2181) and that SQUALL_ZK names it"
    )]
    Connect {
        connect: String,
        #[source]
        source: zk::Error,
    },

    #[error(
        "ZooKeeper session expired: its task registration and leases are gone; stop reading, \
         build a new ZkStore, register again and re-acquire leases"
    )]
    SessionExpired,

    #[error("ZooKeeper session is closed (the store was shut down); build a new ZkStore")]
    SessionClosed,

    #[error(
        "fenced: the lease {lease_path} on shard {shard_id} no longer exists (session expired or lease released), \
         so another task may own the shard; stop reading shard {shard_id} and drop its in-flight state"
    )]
    Fenced { shard_id: String, lease_path: String },

    #[error(
        "version conflict on {path}: another writer changed it (expected {}); re-read it and decide again",
        match .expected { Some(v) => format!("version {v}"), None => "no node".to_string() }
    )]
    VersionConflict { path: String, expected: Option<i32> },

    #[error("malformed data in {path}: {reason}; delete the znode or run `squall checkpoints reset` to rewrite it")]
    Malformed { path: String, reason: String },

    #[error(
        "not authorized to access {path}: it was created with other credentials (creator-only ACL); \
         configure the same ZooKeeper digest auth as the topology that created it"
    )]
    NotAuthorized { path: String },

    #[error("ZooKeeper {op} on {path} failed: {source}")]
    Zk {
        path: String,
        op: &'static str,
        #[source]
        source: zk::Error,
    },

    #[error(
        "{path} would hold {bytes} bytes, over the {limit}-byte limit (ZooKeeper's jute.maxbuffer is 1 MB); \
         a stream this large needs the shard list split across znodes"
    )]
    TooLarge { path: String, bytes: usize, limit: usize },

    #[error(
        "refusing to move checkpoint {path} of shard {shard_id} backwards from {current} to {proposed}; \
         a rewind must go through `squall checkpoints reset` while the topology is stopped"
    )]
    CheckpointBackwards { shard_id: String, path: String, current: String, proposed: String },

    #[error("invalid checkpoint for shard {shard_id}: {reason}")]
    InvalidCheckpoint { shard_id: String, reason: String },

    #[error("no checkpoint at {path} for shard {shard_id}; call init_checkpoint before writing one")]
    NoCheckpoint { shard_id: String, path: String },

    #[error(
        "shards {} are still leased by running tasks; deactivate or kill the topology and wait for its \
         workers to stop before resetting checkpoints",
        .shards.join(", ")
    )]
    LeasesHeld { shards: Vec<String> },

    #[error(
        "unknown topology {topology:?}: no {path} in ZooKeeper; `squall topology list` shows the topologies \
         under this root (check --zk-root / SQUALL_ZK_ROOT)"
    )]
    UnknownTopology { topology: String, path: String },
}

impl CoordError {
    /// True when the same call may succeed if retried later (after a back-off, or after re-reading
    /// the current version for a [`CoordError::VersionConflict`]).
    pub fn is_retryable(&self) -> bool {
        match self {
            CoordError::Connect { .. } | CoordError::VersionConflict { .. } | CoordError::LeasesHeld { .. } => true,
            CoordError::Zk { source, .. } => is_transient(source),
            _ => false,
        }
    }

    /// True when the session is gone for good: build a new store, re-register, re-acquire.
    pub fn is_session_lost(&self) -> bool {
        matches!(self, CoordError::SessionExpired | CoordError::SessionClosed)
    }

    /// Whose problem this is.
    pub fn domain(&self) -> ErrorDomain {
        match self {
            CoordError::Connect { .. }
            | CoordError::SessionExpired
            | CoordError::SessionClosed
            | CoordError::Zk { .. } => ErrorDomain::Infrastructure,
            CoordError::Fenced { .. }
            | CoordError::VersionConflict { .. }
            | CoordError::LeasesHeld { .. }
            | CoordError::CheckpointBackwards { .. } => ErrorDomain::Coordination,
            CoordError::Malformed { .. } | CoordError::NotAuthorized { .. } | CoordError::TooLarge { .. } => {
                ErrorDomain::Data
            }
            CoordError::InvalidConfig { .. }
            | CoordError::InvalidName { .. }
            | CoordError::InvalidCheckpoint { .. }
            | CoordError::NoCheckpoint { .. }
            | CoordError::UnknownTopology { .. } => ErrorDomain::Caller,
        }
    }

    /// A ZooKeeper error worth retrying after a back-off (a lost connection or answer, a
    /// timeout, throttling): the request may or may not have been applied.
    pub fn is_transient(&self) -> bool {
        matches!(self, CoordError::Zk { source, .. } if is_transient(source))
    }

    /// Maps a client error on `path` during `op`, turning the well-known ones into their own variants.
    pub(crate) fn zk(path: &str, op: &'static str, source: zk::Error) -> Self {
        match source {
            zk::Error::NoAuth => CoordError::NotAuthorized { path: path.to_string() },
            zk::Error::SessionExpired => CoordError::SessionExpired,
            zk::Error::ClientClosed => CoordError::SessionClosed,
            source => CoordError::Zk { path: path.to_string(), op, source },
        }
    }
}

/// Client errors worth retrying after a back-off.
pub(crate) fn is_transient(err: &zk::Error) -> bool {
    matches!(err, zk::Error::ConnectionLoss | zk::Error::Timeout | zk::Error::Throttled | zk::Error::NoHosts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_path_and_the_fix() {
        let e = CoordError::Malformed { path: "/s/t/checkpoints/shard-1".into(), reason: "not JSON".into() };
        let m = e.to_string();
        assert!(m.contains("/s/t/checkpoints/shard-1") && m.contains("squall checkpoints reset"), "{m}");
        assert_eq!(e.domain(), ErrorDomain::Data);
        assert!(!e.is_retryable());

        let e = CoordError::zk("/a", "get", zk::Error::NoAuth);
        assert!(matches!(&e, CoordError::NotAuthorized { path } if path == "/a"));
        let e = CoordError::zk("/a", "get", zk::Error::ConnectionLoss);
        assert!(e.is_retryable() && e.to_string().contains("/a"));
        assert!(CoordError::zk("/a", "get", zk::Error::SessionExpired).is_session_lost());
        let e = CoordError::VersionConflict { path: "/x".into(), expected: None };
        assert!(e.to_string().contains("no node") && e.is_retryable());
        let e = CoordError::LeasesHeld { shards: vec!["s1".into(), "s2".into()] };
        assert!(e.to_string().contains("s1, s2"));
    }
}
