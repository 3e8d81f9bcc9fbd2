//! ZooKeeper for the simulated workers: the product's [`ZkClient`] over the shared model
//! ([`squall_test_support::zkmodel`]), with the network in between: latency on each leg, requests
//! lost before the server saw them or after it applied them (the caller cannot tell which), cuts
//! (the client turns Disconnected, the server expires the session after its timeout, the client
//! learns it when the cut ends), and crashes (nothing of the worker reaches the server again).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use squall::coord::ZkConfig;
use squall::coord::zkapi::{
    CreateMode, MultiOp, OneshotWatch, Sequence, StateWatcher, WatchEvent, WatchStates, ZkClient, ZkConnector, ZkResult,
};
use squall_test_support::zkmodel::{Event, Mode, Op, OpResult};
use tokio::sync::{oneshot, watch};
use zookeeper_client as zk;

use crate::world::{Cut, Shared, SimSession, World, lock};

/// Opens the sessions of one worker.
pub struct SimConnector {
    pub world: Shared,
    pub worker: u32,
}

/// One session of one worker.
pub struct SimZk {
    world: Shared,
    worker: u32,
    session: i64,
    timeout: Duration,
    states: watch::Receiver<zk::SessionState>,
}

/// What the network does to one request.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fate {
    Delivered,
    LostBefore,
    LostAfter,
}

/// Waits out a cut or a crash of `worker`: `Err` when the call fails as it would on a broken
/// connection, never returns for a crashed worker.
async fn network(world: &Shared, worker: u32) -> Result<(), zk::Error> {
    loop {
        let (crashed, cut) = lock(world).net(worker);
        if crashed {
            return std::future::pending().await;
        }
        match cut {
            None => return Ok(()),
            Some(Cut::ZkFails) => {
                // The client gives up on the request after its connection timeout.
                tokio::time::sleep(Duration::from_millis(1000)).await;
                return Err(zk::Error::ConnectionLoss);
            }
            Some(Cut::Hang) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

impl SimZk {
    /// One request: there, applied by `op` on the model, back.
    async fn call<T: Send>(
        &self,
        what: String,
        op: impl FnOnce(&mut World, i64) -> Result<T, zk::Error> + Send,
    ) -> Result<T, zk::Error> {
        let (there, back, fate) = {
            let mut w = lock(&self.world);
            let (there, back) = (w.latency(), w.latency());
            let (before, after) = (w.faults.zk_lost_before, w.faults.zk_lost_after);
            let fate = if !w.faults.on {
                Fate::Delivered
            } else if w.rng.chance(before) {
                w.injected("zk lost before");
                Fate::LostBefore
            } else if w.rng.chance(after) {
                w.injected("zk lost after");
                Fate::LostAfter
            } else {
                Fate::Delivered
            };
            (there, back, fate)
        };
        tokio::time::sleep(there).await;
        network(&self.world, self.worker).await?;
        let result = {
            let mut w = lock(&self.world);
            let now = w.now_ms();
            w.zk.set_now(now);
            if fate == Fate::LostBefore {
                w.event(format!("w{} zk {what}: lost before the server", self.worker));
                return Err(zk::Error::ConnectionLoss);
            }
            let r = op(&mut w, self.session);
            if what.contains("/owners/") || what.starts_with("multi") {
                w.refresh_holders();
            }
            let said = match &r {
                Ok(_) => "ok".to_string(),
                Err(e) => format!("{e:?}"),
            };
            w.event(format!(
                "w{} zk {what}: {said}{}",
                self.worker,
                if fate == Fate::LostAfter { " (answer lost)" } else { "" }
            ));
            r
        };
        if fate == Fate::LostAfter {
            tokio::time::sleep(Duration::from_millis(200)).await;
            return Err(zk::Error::ConnectionLoss);
        }
        tokio::time::sleep(back).await;
        network(&self.world, self.worker).await?;
        result
    }

    fn watch(&self, rx: oneshot::Receiver<Event>, path: String) -> OneshotWatch {
        let (world, worker) = (self.world.clone(), self.worker);
        OneshotWatch::new(async move {
            let ev = rx.await.unwrap_or(Event::SessionEnded);
            // The notification crosses the network too.
            while network(&world, worker).await.is_err() {}
            let event_type = match ev {
                Event::Created => zk::EventType::NodeCreated,
                Event::Deleted => zk::EventType::NodeDeleted,
                Event::DataChanged => zk::EventType::NodeDataChanged,
                Event::ChildrenChanged => zk::EventType::NodeChildrenChanged,
                Event::SessionEnded => zk::EventType::Session,
            };
            lock(&world).event(format!("w{worker} watch {path}: {event_type:?}"));
            WatchEvent { event_type, path }
        })
    }
}

impl Drop for SimZk {
    fn drop(&mut self) {
        let mut w = lock(&self.world);
        // A crashed process closes nothing: its session expires on the server.
        if w.net(self.worker).0 {
            return;
        }
        if let Some(s) = w.sessions.get_mut(&self.session) {
            s.closed = true;
            let _ = s.state.send(zk::SessionState::Closed);
        }
        if w.zk.session_alive(self.session) {
            w.zk.end_session(self.session);
            w.refresh_holders();
            let (worker, session) = (self.worker, self.session);
            w.event(format!("w{worker} zk session {session:#x} closed"));
        }
    }
}

fn mode(m: &CreateMode) -> Mode {
    match m {
        CreateMode::Persistent => Mode::Persistent,
        CreateMode::Ephemeral => Mode::Ephemeral,
        CreateMode::EphemeralSequential => Mode::EphemeralSequential,
    }
}

/// The sequence a sequential node's name ends with.
fn sequence_of(path: &str) -> i64 {
    let digits: String = path.chars().rev().take_while(|c| c.is_ascii_digit()).collect();
    digits.chars().rev().collect::<String>().parse().unwrap_or(-1)
}

impl ZkClient for SimZk {
    fn session_id(&self) -> i64 {
        self.session
    }
    fn session_timeout(&self) -> Duration {
        self.timeout
    }
    fn state(&self) -> zk::SessionState {
        *self.states.borrow()
    }
    fn state_watcher(&self) -> StateWatcher {
        StateWatcher::new(WatchStates(self.states.clone()))
    }
    fn create<'a>(&'a self, path: &'a str, data: &'a [u8], m: &'a CreateMode) -> ZkResult<'a, (zk::Stat, Sequence)> {
        let worker = self.worker;
        Box::pin(self.call(format!("create {path}"), move |w, s| {
            let (full, stat) = w.zk.create(s, path, data, mode(m))?;
            w.accepted_write(worker, &full, data, None);
            Ok((stat, Sequence(sequence_of(&full))))
        }))
    }
    fn delete<'a>(&'a self, path: &str, version: Option<i32>) -> ZkResult<'a, ()> {
        let path = path.to_string();
        Box::pin(self.call(format!("delete {path}"), move |w, s| w.zk.delete(s, &path, version)))
    }
    fn get_data<'a>(&'a self, path: &str) -> ZkResult<'a, (Vec<u8>, zk::Stat)> {
        let path = path.to_string();
        Box::pin(async move {
            let what = format!("get {path}");
            let r = self.call(what, |w, s| w.zk.get_data(s, &path)).await;
            // what the worker knows of the lifecycle state, once the answer reached it
            if let Ok((data, _)) = &r
                && path.ends_with("/topologies/sim/state")
            {
                lock(&self.world).state_read(self.worker, data);
            }
            r
        })
    }
    fn set_data<'a>(&'a self, path: &str, data: &[u8], version: Option<i32>) -> ZkResult<'a, zk::Stat> {
        let (path, data) = (path.to_string(), data.to_vec());
        let worker = self.worker;
        Box::pin(self.call(format!("set {path}"), move |w, s| {
            let stat = w.zk.set_data(s, &path, &data, version)?;
            w.accepted_write(worker, &path, &data, None);
            Ok(stat)
        }))
    }
    fn list_children<'a>(&'a self, path: &str) -> ZkResult<'a, Vec<String>> {
        let path = path.to_string();
        Box::pin(self.call(format!("list {path}"), move |w, s| w.zk.list_children(s, &path)))
    }
    fn check_stat<'a>(&'a self, path: &str) -> ZkResult<'a, Option<zk::Stat>> {
        let path = path.to_string();
        Box::pin(self.call(format!("stat {path}"), move |w, s| w.zk.check_stat(s, &path)))
    }
    fn sync<'a>(&'a self, path: &str) -> ZkResult<'a, ()> {
        let path = path.to_string();
        // The model is one server: every write is applied everywhere at once.
        Box::pin(self.call(format!("sync {path}"), move |w, s| w.zk.check_stat(s, "/").map(|_| ())))
    }
    fn list_and_watch_children<'a>(&'a self, path: &str) -> ZkResult<'a, (Vec<String>, OneshotWatch)> {
        let path = path.to_string();
        Box::pin(async move {
            let p = path.clone();
            let (children, rx) =
                self.call(format!("list+watch {path}"), move |w, s| w.zk.list_and_watch_children(s, &p)).await?;
            Ok((children, self.watch(rx, path)))
        })
    }
    fn check_and_watch_stat<'a>(&'a self, path: &str) -> ZkResult<'a, (Option<zk::Stat>, OneshotWatch)> {
        let path = path.to_string();
        Box::pin(async move {
            let p = path.clone();
            let (stat, rx) =
                self.call(format!("stat+watch {path}"), move |w, s| w.zk.check_and_watch_stat(s, &p)).await?;
            Ok((stat, self.watch(rx, path)))
        })
    }
    fn multi(&self, ops: Vec<MultiOp>) -> BoxFuture<'_, Result<Vec<zk::MultiWriteResult>, zk::MultiWriteError>> {
        let worker = self.worker;
        let what = format!("multi {}", ops.iter().map(op_name).collect::<Vec<_>>().join(", "));
        Box::pin(async move {
            let model_ops: Vec<Op> = ops
                .iter()
                .map(|op| match op {
                    MultiOp::Check { path, version } => Op::Check { path: path.clone(), version: *version },
                    MultiOp::Create { path, data, mode: m } => {
                        Op::Create { path: path.clone(), data: data.clone(), mode: mode(m) }
                    }
                    MultiOp::SetData { path, data, version } => {
                        Op::SetData { path: path.clone(), data: data.clone(), version: *version }
                    }
                    MultiOp::Delete { path, version } => Op::Delete { path: path.clone(), version: *version },
                })
                .collect();
            let r = self
                .call(what, move |w, s| match w.zk.multi(s, &model_ops) {
                    Ok(results) => {
                        let lease = model_ops.iter().find_map(|op| match op {
                            Op::Check { path, .. } if path.contains("/owners/") => Some(path.clone()),
                            _ => None,
                        });
                        for op in &model_ops {
                            match op {
                                Op::SetData { path, data, .. } | Op::Create { path, data, .. } => {
                                    w.accepted_write(worker, path, data, lease.as_deref())
                                }
                                _ => {}
                            }
                        }
                        Ok(Ok(results))
                    }
                    Err((index, source)) => {
                        if model_ops.iter().any(|op| matches!(op, Op::Check { path, .. } if path.contains("/owners/")))
                            && index == 0
                        {
                            w.checks.fenced_writes += 1;
                        }
                        Ok(Err(zk::MultiWriteError::OperationFailed { index, source }))
                    }
                })
                .await;
            match r {
                Err(source) => Err(zk::MultiWriteError::RequestFailed { source }),
                Ok(Err(e)) => Err(e),
                Ok(Ok(results)) => Ok(results
                    .into_iter()
                    .map(|r| match r {
                        OpResult::Check => zk::MultiWriteResult::Check,
                        OpResult::Create { path, stat } => zk::MultiWriteResult::Create { path, stat },
                        OpResult::SetData { stat } => zk::MultiWriteResult::SetData { stat },
                        OpResult::Delete => zk::MultiWriteResult::Delete,
                    })
                    .collect()),
            }
        })
    }
}

fn op_name(op: &MultiOp) -> String {
    match op {
        MultiOp::Check { path, version } => format!("check {path}@{version}"),
        MultiOp::Create { path, .. } => format!("create {path}"),
        MultiOp::SetData { path, version, .. } => format!("set {path}@{version:?}"),
        MultiOp::Delete { path, .. } => format!("delete {path}"),
    }
}

impl ZkConnector for SimConnector {
    fn connect<'a>(&'a self, cfg: &'a ZkConfig) -> BoxFuture<'a, Result<Arc<dyn ZkClient>, zk::Error>> {
        Box::pin(async move {
            let there = lock(&self.world).latency();
            tokio::time::sleep(there).await;
            network(&self.world, self.worker).await?;
            let mut w = lock(&self.world);
            let session = w.zk.open_session();
            let timeout_ms = cfg.session_timeout.as_millis() as i64;
            let (tx, rx) = watch::channel(zk::SessionState::SyncConnected);
            w.sessions.insert(session, SimSession { worker: self.worker, timeout_ms, state: tx, closed: false });
            w.event(format!("w{} zk session {session:#x} opened", self.worker));
            Ok(Arc::new(SimZk {
                world: self.world.clone(),
                worker: self.worker,
                session,
                timeout: cfg.session_timeout,
                states: rx,
            }) as Arc<dyn ZkClient>)
        })
    }
}

/// The server's and the clients' clocks for sessions, run every 50 ms of simulated time: a cut or
/// crashed worker's client turns Disconnected once it has not heard from the server for 2/5 of
/// its session timeout; the server expires its session once it has not heard from it for the
/// timeout; when the cut ends the client learns whether its session survived.
pub fn tick_sessions(w: &mut World) {
    let now = w.now_ms();
    let ids: Vec<i64> = w.sessions.keys().copied().collect();
    for id in ids {
        let s = &w.sessions[&id];
        if s.closed {
            continue;
        }
        let worker = s.worker;
        let timeout = s.timeout_ms;
        let net = w.net.get(&worker);
        let crashed = net.is_some_and(|n| n.crashed);
        let cut = net.and_then(|n| n.cut).filter(|(_, _, until)| now < *until).map(|(_, since, _)| since);
        let silent_since = match (crashed, cut) {
            (true, _) => net.and_then(|n| n.cut.map(|c| c.1)).unwrap_or(now),
            (false, Some(since)) => since,
            (false, None) => {
                // Connected: back to SyncConnected, or Expired when the server ended it meanwhile.
                let alive = w.zk.session_alive(id);
                let s = &w.sessions[&id];
                let want = if alive { zk::SessionState::SyncConnected } else { zk::SessionState::Expired };
                if *s.state.borrow() != want && !s.state.borrow().is_terminated() {
                    let _ = s.state.send(want);
                    w.event(format!("w{worker} zk session {id:#x} {want:?}"));
                }
                continue;
            }
        };
        let silent = now - silent_since;
        if w.zk.session_alive(id) && silent >= timeout {
            w.zk.end_session(id);
            w.refresh_holders();
            w.event(format!("zk server expired session {id:#x} of w{worker}"));
        }
        let s = &w.sessions[&id];
        if !crashed && silent >= timeout * 2 / 5 && *s.state.borrow() == zk::SessionState::SyncConnected {
            let _ = s.state.send(zk::SessionState::Disconnected);
            w.event(format!("w{worker} zk session {id:#x} Disconnected"));
        }
    }
}
