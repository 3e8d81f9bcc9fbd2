//! What the tasks of one [`super::KinesisSpout`] declaration share inside a worker process: the
//! ZooKeeper session (one per worker), the stream coordinator (one per worker and stream) and
//! the enhanced fan-out consumer (registered once per worker and stream, not once per task:
//! RegisterStreamConsumer is limited to a few calls per second per account). The first task to
//! open starts them; the last to close stops them.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use super::config::{EfoSettings, KinesisSpoutConfig};
use super::efo::{EfoCtx, EfoError};
use super::source::ShardSource;
use super::stream::StreamHandle;
use crate::coord::{CoordError, SharedSession};

/// How long a worker keeps trying to build a new ZooKeeper session before it gives up (and exits
/// with an error, so that its supervisor restarts it), unless the worker sets its own.
pub const DEFAULT_GIVE_UP_AFTER: Duration = Duration::from_secs(120);

#[derive(Default)]
struct Inner {
    session: Option<Arc<SharedSession>>,
    /// The session was made here (not handed in by the worker): close it with the last task.
    own_session: bool,
    stream: Option<Arc<StreamHandle>>,
    efo: Option<Arc<EfoCtx>>,
    open_tasks: usize,
}

/// Shared by the tasks of one spout declaration (cloned into each task).
#[derive(Clone, Default)]
pub struct SpoutShared {
    inner: Arc<Mutex<Inner>>,
}

impl std::fmt::Debug for SpoutShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpoutShared").finish_non_exhaustive()
    }
}

impl SpoutShared {
    /// Tasks use `session` (the worker's) instead of connecting their own.
    pub fn with_session(session: Arc<SharedSession>) -> Self {
        let inner = Inner { session: Some(session), ..Inner::default() };
        Self { inner: Arc::new(Mutex::new(inner)) }
    }

    /// A task opens: connects the session and starts the stream coordinator if it is the first.
    pub(crate) async fn attach(
        &self,
        cfg: &Arc<KinesisSpoutConfig>,
        source: ShardSource,
    ) -> Result<(Arc<SharedSession>, Arc<StreamHandle>), CoordError> {
        let mut inner = self.inner.lock().await;
        let session = match &inner.session {
            Some(s) => s.clone(),
            None => {
                let s = SharedSession::connect(&cfg.zookeeper.to_zk_config(), DEFAULT_GIVE_UP_AFTER).await?;
                inner.session = Some(s.clone());
                inner.own_session = true;
                s
            }
        };
        let stream = match &inner.stream {
            Some(h) => h.clone(),
            None => {
                let h = StreamHandle::start(cfg.clone(), session.clone(), source);
                inner.stream = Some(h.clone());
                h
            }
        };
        inner.open_tasks += 1;
        Ok((session, stream))
    }

    /// The enhanced fan-out consumer `name` of the source's stream, registered (when missing)
    /// and ACTIVE: the first task to ask makes sure of it, the others wait for it and share it.
    pub(crate) async fn efo(
        &self,
        source: &ShardSource,
        name: &str,
        settings: &EfoSettings,
    ) -> Result<Arc<EfoCtx>, EfoError> {
        let mut inner = self.inner.lock().await;
        if let Some(ctx) = inner.efo.as_ref().filter(|c| c.consumer == name) {
            return Ok(ctx.clone());
        }
        let ctx = Arc::new(super::efo::register(source, name, settings).await?);
        inner.efo = Some(ctx.clone());
        Ok(ctx)
    }

    /// A task closed: the last one stops the stream coordinator (and closes the session if it
    /// was made here).
    pub(crate) async fn detach(&self) {
        let mut inner = self.inner.lock().await;
        inner.open_tasks = inner.open_tasks.saturating_sub(1);
        if inner.open_tasks > 0 {
            return;
        }
        inner.efo = None;
        if let Some(h) = inner.stream.take() {
            h.stop().await;
        }
        if inner.own_session {
            if let Some(s) = inner.session.take() {
                s.close().await;
            }
            inner.own_session = false;
        }
    }
}
