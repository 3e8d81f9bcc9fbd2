//! Connection settings for the coordination store.

use std::fmt;
use std::time::Duration;

use super::error::CoordError;
use super::paths::validate_root;

/// Default connect string when nothing is configured (`SQUALL_ZK` overrides it in the CLI and tests).
pub const DEFAULT_CONNECT: &str = "127.0.0.1:2181";
/// Default root znode under which every topology lives.
pub const DEFAULT_ROOT: &str = "/squall";
/// Default requested session timeout. The server clamps it into
/// `[minSessionTimeout, maxSessionTimeout]` (by default 2..20 x tickTime).
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// How to reach ZooKeeper and where Squall keeps its state.
///
/// `Debug` never shows the password of [`ZkAuth`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZkConfig {
    /// ZooKeeper connect string, `host:port[,host:port...]`, e.g. `127.0.0.1:2181`.
    pub connect: String,
    /// Absolute root znode, e.g. `/squall`. Topologies live under `{root}/topologies/{name}`.
    pub root: String,
    /// Requested session timeout. Leases (ephemeral znodes) of a crashed worker vanish after it.
    pub session_timeout: Duration,
    /// Optional digest authentication. When set, every znode the store creates gets
    /// creator-only ACLs, so only clients with the same identity can read or change it.
    pub auth: Option<ZkAuth>,
}

impl ZkConfig {
    /// A config with the default root and session timeout and no authentication.
    pub fn new(connect: impl Into<String>) -> Self {
        Self {
            connect: connect.into(),
            root: DEFAULT_ROOT.to_string(),
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            auth: None,
        }
    }

    /// Replaces the root znode.
    pub fn with_root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// Replaces the requested session timeout.
    pub fn with_session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// Enables digest authentication.
    pub fn with_auth(mut self, auth: ZkAuth) -> Self {
        self.auth = Some(auth);
        self
    }

    /// Checks the settings once, before anything connects.
    pub fn validate(&self) -> Result<(), CoordError> {
        if self.connect.trim().is_empty() {
            return Err(CoordError::InvalidConfig {
                reason: "the ZooKeeper connect string is empty; set it to host:port, e.g. 127.0.0.1:2181 (SQUALL_ZK)"
                    .to_string(),
            });
        }
        validate_root(&self.root)?;
        if self.session_timeout < Duration::from_millis(100) {
            return Err(CoordError::InvalidConfig {
                reason: format!(
                    "session timeout {:?} is too short; use at least a few seconds (the server clamps it to 2..20 x tickTime)",
                    self.session_timeout
                ),
            });
        }
        if let Some(auth) = &self.auth
            && (auth.user.is_empty() || auth.user.contains(':'))
        {
            return Err(CoordError::InvalidConfig {
                reason: "digest auth user must be non-empty and must not contain ':'".to_string(),
            });
        }
        Ok(())
    }
}

/// ZooKeeper digest credentials (`user:password`).
#[derive(Clone, PartialEq, Eq)]
pub struct ZkAuth {
    user: String,
    password: Secret,
}

impl ZkAuth {
    /// Digest credentials for `user`.
    pub fn digest(user: impl Into<String>, password: impl Into<String>) -> Self {
        Self { user: user.into(), password: Secret::new(password) }
    }

    /// The user name (not secret).
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The `user:password` bytes the digest scheme expects.
    pub(crate) fn digest_bytes(&self) -> Vec<u8> {
        format!("{}:{}", self.user, self.password.expose()).into_bytes()
    }
}

impl fmt::Debug for ZkAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkAuth").field("user", &self.user).field("password", &self.password).finish()
    }
}

impl fmt::Display for ZkAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "digest:{}:{}", self.user, self.password)
    }
}

/// A string that never appears in `Debug` or `Display` output.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself; only for handing it to the client library (never log it).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_hide_the_password() {
        let cfg = ZkConfig::new("127.0.0.1:2181").with_auth(ZkAuth::digest("squall", "hunter2-very-secret"));
        let debug = format!("{cfg:?}");
        let pretty = format!("{cfg:#?}");
        let display = format!("{}", cfg.auth.as_ref().unwrap());
        for out in [&debug, &pretty, &display] {
            assert!(!out.contains("hunter2"), "password leaked: {out}");
        }
        assert!(debug.contains("squall"), "user should be visible: {debug}");
        assert!(debug.contains("redacted"));
        assert_eq!(cfg.auth.unwrap().digest_bytes(), b"squall:hunter2-very-secret".to_vec());
    }

    #[test]
    fn validate_rejects_bad_settings() {
        assert!(ZkConfig::new("").validate().is_err());
        assert!(ZkConfig::new("h:1").with_root("squall").validate().is_err());
        assert!(ZkConfig::new("h:1").with_root("/squall/").validate().is_err());
        assert!(ZkConfig::new("h:1").with_session_timeout(Duration::from_millis(1)).validate().is_err());
        assert!(ZkConfig::new("h:1").with_auth(ZkAuth::digest("a:b", "p")).validate().is_err());
        assert!(ZkConfig::new("h:1").validate().is_ok());
        assert!(ZkConfig::new("h:1").with_root("/a/b").validate().is_ok());
    }
}
