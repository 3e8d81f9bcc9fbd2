//! The producer registry of an intermediate stream, followed by a worker: which tasks write into
//! it now (`{topology}/stages/{stream}/producers/{producer:016x}-{deployment}`, ephemeral).
//!
//! One one-shot children watch per worker and stream, re-armed after it fires: a producer coming
//! or going costs each following worker one listing; an idle registry costs nothing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::coord::now_ms;
use crate::coord::{SharedSession, ZkStore};
use crate::spout::{LiveProducers, Producers};

/// Follows the registry of `stream` until `cancel`; the receiver holds `None` until the first
/// listing. Survives ZooKeeper session loss (it lists again on the new session). Await the task
/// after cancelling it before closing the session: it holds the session while it watches.
pub fn follow_producers(
    session: &SharedSession,
    root: String,
    topology: String,
    stream: String,
    cancel: CancellationToken,
) -> (watch::Receiver<LiveProducers>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(None);
    let mut views = session.subscribe();
    let task = tokio::spawn(async move {
        loop {
            let view = views.borrow_and_update().clone();
            let listed = async {
                let Some(s) = view.session.clone() else {
                    return Err::<(), String>("no ZooKeeper session".to_string());
                };
                let store = ZkStore::for_producers(s, &root, &topology, &stream).map_err(|e| e.to_string())?;
                loop {
                    let listed_at_ms = now_ms();
                    let (live, watcher) = store.watch_producers(&stream).await.map_err(|e| e.to_string())?;
                    tx.send_replace(Some(Arc::new(Producers { live, listed_at_ms })));
                    let ev = watcher.changed().await;
                    if ev.event_type == zookeeper_client::EventType::Session {
                        return Err("session event".to_string());
                    }
                }
            };
            // A closed session channel (the worker's session dropped: it is stopping) ends the
            // follower: `changed` would return at once from then on, a busy loop.
            tokio::select! {
                _ = cancel.cancelled() => return,
                r = listed => {
                    if let Err(e) = r {
                        tracing::debug!(stream = %stream, error = %e, "following the producer registry: retrying");
                    }
                }
                r = views.changed() => match r {
                    Ok(()) => continue,
                    Err(_) => return,
                },
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                r = views.changed() => if r.is_err() { return },
            }
        }
    });
    (rx, task)
}

/// A fixed registry (tests, and stages whose producers are known).
pub fn fixed(live: BTreeMap<u64, String>) -> watch::Receiver<LiveProducers> {
    watch::channel(Some(Arc::new(Producers { live, listed_at_ms: now_ms() }))).1
}
