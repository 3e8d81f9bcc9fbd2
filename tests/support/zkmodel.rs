//! An in-memory model of the ZooKeeper server, as Squall uses it: a tree of znodes with data,
//! versions (`version`, `cversion`), zxids (`czxid`, `mzxid`, `pzxid`), persistent, ephemeral and
//! sequential nodes, sessions that own ephemeral nodes and expire, one-shot watches (data, exists,
//! children) and `multi` (all or nothing). It is the server the simulator's workers talk to, and
//! it is kept honest by `tests/zk_model.rs`, which runs random operation sequences against it and
//! against the real ZooKeeper and compares every answer.
//!
//! What it does not model (Squall does not use it, or the simulator injects it on its own): ACLs
//! and authentication, quotas, read-only mode, containers and TTL nodes, persistent recursive
//! watches, the network (a lost or delayed answer is the simulator's fault, not the server's).
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};

use tokio::sync::oneshot;
use zookeeper_client as zk;

/// How a node is created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Persistent,
    Ephemeral,
    PersistentSequential,
    EphemeralSequential,
}

impl Mode {
    fn sequential(self) -> bool {
        matches!(self, Mode::PersistentSequential | Mode::EphemeralSequential)
    }
    fn ephemeral(self) -> bool {
        matches!(self, Mode::Ephemeral | Mode::EphemeralSequential)
    }
}

/// What a watch reports (as `zk::EventType`, without the session events).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Created,
    Deleted,
    DataChanged,
    ChildrenChanged,
    /// The session that set the watch expired or was closed.
    SessionEnded,
}

/// One operation of a `multi`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Check { path: String, version: i32 },
    Create { path: String, data: Vec<u8>, mode: Mode },
    SetData { path: String, data: Vec<u8>, version: Option<i32> },
    Delete { path: String, version: Option<i32> },
}

/// What one operation of a successful `multi` returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpResult {
    Check,
    Create { path: String, stat: zk::Stat },
    SetData { stat: zk::Stat },
    Delete,
}

#[derive(Clone, Debug)]
struct Node {
    data: Vec<u8>,
    stat: zk::Stat,
    children: BTreeSet<String>,
    /// The children created under it so far: the next sequential child's suffix. ZooKeeper 3.8
    /// counts creations and deletions in `cversion` but names sequential children by the
    /// creations alone (a child created, deleted, another created: cversion 3, the next
    /// sequential child `...0000000002`), as measured by `tests/zk_model.rs`.
    seq: i32,
}

#[derive(Default)]
struct Watches {
    data: BTreeMap<String, Vec<(i64, oneshot::Sender<Event>)>>,
    exists: BTreeMap<String, Vec<(i64, oneshot::Sender<Event>)>>,
    children: BTreeMap<String, Vec<(i64, oneshot::Sender<Event>)>>,
}

/// The model server.
pub struct ZkModel {
    nodes: BTreeMap<String, Node>,
    sessions: BTreeSet<i64>,
    next_session: i64,
    zxid: i64,
    /// Milliseconds, moved by the caller (the simulator's clock): ctime and mtime.
    now_ms: i64,
    watches: Watches,
}

impl Default for ZkModel {
    fn default() -> Self {
        Self::new()
    }
}

fn parent_of(path: &str) -> Option<&str> {
    if path == "/" {
        return None;
    }
    match path.rfind('/') {
        Some(0) => Some("/"),
        Some(i) => Some(&path[..i]),
        None => None,
    }
}

fn name_of(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn zero_stat() -> zk::Stat {
    zk::Stat {
        czxid: 0,
        mzxid: 0,
        pzxid: 0,
        ctime: 0,
        mtime: 0,
        version: 0,
        cversion: 0,
        aversion: 0,
        ephemeral_owner: 0,
        data_length: 0,
        num_children: 0,
    }
}

fn valid(path: &str) -> bool {
    path == "/" || (path.starts_with('/') && !path.ends_with('/') && !path.contains("//"))
}

impl ZkModel {
    /// An empty server: only `/` (and no `/zookeeper`: the model lists only what it was given).
    pub fn new() -> Self {
        let mut nodes = BTreeMap::new();
        nodes.insert("/".to_string(), Node { data: Vec::new(), stat: zero_stat(), children: BTreeSet::new(), seq: 0 });
        ZkModel { nodes, sessions: BTreeSet::new(), next_session: 1, zxid: 0, now_ms: 0, watches: Watches::default() }
    }

    /// Sets the time stamped on creations and changes.
    pub fn set_now(&mut self, ms: i64) {
        self.now_ms = ms;
    }

    /// Opens a session; its id.
    pub fn open_session(&mut self) -> i64 {
        let id = self.next_session;
        self.next_session += 1;
        self.sessions.insert(id);
        id
    }

    /// Whether the session is open.
    pub fn session_alive(&self, session: i64) -> bool {
        self.sessions.contains(&session)
    }

    /// Ends a session (expired by the server, or closed by its client): its ephemeral nodes are
    /// deleted (each a change of its own, firing watches), and its watches fire `SessionEnded`.
    pub fn end_session(&mut self, session: i64) {
        if !self.sessions.remove(&session) {
            return;
        }
        let mine: Vec<String> =
            self.nodes.iter().filter(|(_, n)| n.stat.ephemeral_owner == session).map(|(p, _)| p.clone()).collect();
        for path in mine {
            let _ = self.remove(&path);
        }
        for map in [&mut self.watches.data, &mut self.watches.exists, &mut self.watches.children] {
            for list in map.values_mut() {
                let (gone, keep): (Vec<_>, Vec<_>) = std::mem::take(list).into_iter().partition(|(s, _)| *s == session);
                *list = keep;
                for (_, tx) in gone {
                    let _ = tx.send(Event::SessionEnded);
                }
            }
        }
    }

    fn check_session(&self, session: i64) -> Result<(), zk::Error> {
        if self.sessions.contains(&session) { Ok(()) } else { Err(zk::Error::SessionExpired) }
    }

    fn fire(map: &mut BTreeMap<String, Vec<(i64, oneshot::Sender<Event>)>>, path: &str, ev: Event) {
        if let Some(list) = map.remove(path) {
            for (_, tx) in list {
                let _ = tx.send(ev);
            }
        }
    }

    /// The checks of a create, without doing it: the path it would get.
    fn plan_create(&self, path: &str, mode: Mode, session: i64) -> Result<String, zk::Error> {
        if !valid(path) || path == "/" {
            return Err(zk::Error::BadArguments(&"invalid path"));
        }
        let parent = parent_of(path).ok_or(zk::Error::BadArguments(&"invalid path"))?;
        let p = self.nodes.get(parent).ok_or(zk::Error::NoNode)?;
        if p.stat.ephemeral_owner != 0 {
            return Err(zk::Error::NoChildrenForEphemerals);
        }
        let full = if mode.sequential() { format!("{path}{:010}", p.seq) } else { path.to_string() };
        if self.nodes.contains_key(&full) {
            return Err(zk::Error::NodeExists);
        }
        let _ = session;
        Ok(full)
    }

    fn do_create(&mut self, full: &str, data: &[u8], mode: Mode, session: i64) -> zk::Stat {
        self.zxid += 1;
        let z = self.zxid;
        let stat = zk::Stat {
            czxid: z,
            mzxid: z,
            pzxid: z,
            ctime: self.now_ms,
            mtime: self.now_ms,
            version: 0,
            cversion: 0,
            aversion: 0,
            ephemeral_owner: if mode.ephemeral() { session } else { 0 },
            data_length: data.len() as i32,
            num_children: 0,
        };
        self.nodes.insert(full.to_string(), Node { data: data.to_vec(), stat, children: BTreeSet::new(), seq: 0 });
        let parent = parent_of(full).unwrap_or("/").to_string();
        if let Some(p) = self.nodes.get_mut(&parent) {
            p.children.insert(name_of(full).to_string());
            p.stat.cversion += 1;
            p.seq += 1;
            p.stat.pzxid = z;
            p.stat.num_children = p.children.len() as i32;
        }
        Self::fire(&mut self.watches.exists, full, Event::Created);
        Self::fire(&mut self.watches.data, full, Event::Created);
        Self::fire(&mut self.watches.children, &parent, Event::ChildrenChanged);
        stat
    }

    /// Creates a node; its path (with the sequence for a sequential node) and stat.
    pub fn create(
        &mut self,
        session: i64,
        path: &str,
        data: &[u8],
        mode: Mode,
    ) -> Result<(String, zk::Stat), zk::Error> {
        self.check_session(session)?;
        let full = self.plan_create(path, mode, session)?;
        let stat = self.do_create(&full, data, mode, session);
        Ok((full, stat))
    }

    fn plan_delete(&self, path: &str, version: Option<i32>) -> Result<(), zk::Error> {
        if path == "/" || !valid(path) {
            return Err(zk::Error::BadArguments(&"invalid path"));
        }
        let n = self.nodes.get(path).ok_or(zk::Error::NoNode)?;
        if version.is_some_and(|v| v != n.stat.version) {
            return Err(zk::Error::BadVersion);
        }
        if !n.children.is_empty() {
            return Err(zk::Error::NotEmpty);
        }
        Ok(())
    }

    fn remove(&mut self, path: &str) -> Result<(), zk::Error> {
        self.nodes.remove(path).ok_or(zk::Error::NoNode)?;
        self.zxid += 1;
        let z = self.zxid;
        let parent = parent_of(path).unwrap_or("/").to_string();
        if let Some(p) = self.nodes.get_mut(&parent) {
            p.children.remove(name_of(path));
            p.stat.cversion += 1;
            p.stat.pzxid = z;
            p.stat.num_children = p.children.len() as i32;
        }
        Self::fire(&mut self.watches.exists, path, Event::Deleted);
        Self::fire(&mut self.watches.data, path, Event::Deleted);
        Self::fire(&mut self.watches.children, path, Event::Deleted);
        Self::fire(&mut self.watches.children, &parent, Event::ChildrenChanged);
        Ok(())
    }

    /// Deletes a node (at `version`, or any).
    pub fn delete(&mut self, session: i64, path: &str, version: Option<i32>) -> Result<(), zk::Error> {
        self.check_session(session)?;
        self.plan_delete(path, version)?;
        self.remove(path)
    }

    fn plan_set(&self, path: &str, version: Option<i32>) -> Result<(), zk::Error> {
        let n = self.nodes.get(path).ok_or(zk::Error::NoNode)?;
        if version.is_some_and(|v| v != n.stat.version) {
            return Err(zk::Error::BadVersion);
        }
        Ok(())
    }

    fn do_set(&mut self, path: &str, data: &[u8]) -> zk::Stat {
        self.zxid += 1;
        let (z, now) = (self.zxid, self.now_ms);
        let n = self.nodes.get_mut(path).expect("planned");
        n.data = data.to_vec();
        n.stat.version += 1;
        n.stat.mzxid = z;
        n.stat.mtime = now;
        n.stat.data_length = data.len() as i32;
        let stat = n.stat;
        Self::fire(&mut self.watches.exists, path, Event::DataChanged);
        Self::fire(&mut self.watches.data, path, Event::DataChanged);
        stat
    }

    /// Sets a node's data (at `version`, or any); its new stat.
    pub fn set_data(
        &mut self,
        session: i64,
        path: &str,
        data: &[u8],
        version: Option<i32>,
    ) -> Result<zk::Stat, zk::Error> {
        self.check_session(session)?;
        self.plan_set(path, version)?;
        Ok(self.do_set(path, data))
    }

    /// A node's data and stat.
    pub fn get_data(&self, session: i64, path: &str) -> Result<(Vec<u8>, zk::Stat), zk::Error> {
        self.check_session(session)?;
        let n = self.nodes.get(path).ok_or(zk::Error::NoNode)?;
        Ok((n.data.clone(), n.stat))
    }

    /// A node's stat, `None` when it does not exist.
    pub fn check_stat(&self, session: i64, path: &str) -> Result<Option<zk::Stat>, zk::Error> {
        self.check_session(session)?;
        Ok(self.nodes.get(path).map(|n| n.stat))
    }

    /// A node's children (names), in no promised order (sorted here).
    pub fn list_children(&self, session: i64, path: &str) -> Result<Vec<String>, zk::Error> {
        self.check_session(session)?;
        let n = self.nodes.get(path).ok_or(zk::Error::NoNode)?;
        Ok(n.children.iter().cloned().collect())
    }

    /// `check_stat`, with a one-shot watch that fires on the node's creation, deletion or data
    /// change.
    pub fn check_and_watch_stat(
        &mut self,
        session: i64,
        path: &str,
    ) -> Result<(Option<zk::Stat>, oneshot::Receiver<Event>), zk::Error> {
        let stat = self.check_stat(session, path)?;
        let (tx, rx) = oneshot::channel();
        self.watches.exists.entry(path.to_string()).or_default().push((session, tx));
        Ok((stat, rx))
    }

    /// `get_data`, with a one-shot watch that fires on the node's deletion or data change.
    pub fn get_and_watch_data(
        &mut self,
        session: i64,
        path: &str,
    ) -> Result<(Vec<u8>, zk::Stat, oneshot::Receiver<Event>), zk::Error> {
        let (data, stat) = self.get_data(session, path)?;
        let (tx, rx) = oneshot::channel();
        self.watches.data.entry(path.to_string()).or_default().push((session, tx));
        Ok((data, stat, rx))
    }

    /// `list_children`, with a one-shot watch that fires when a child is added or removed, or
    /// the node is deleted.
    pub fn list_and_watch_children(
        &mut self,
        session: i64,
        path: &str,
    ) -> Result<(Vec<String>, oneshot::Receiver<Event>), zk::Error> {
        let children = self.list_children(session, path)?;
        let (tx, rx) = oneshot::channel();
        self.watches.children.entry(path.to_string()).or_default().push((session, tx));
        Ok((children, rx))
    }

    /// Runs every operation or none: the first that fails is returned with its index, as
    /// ZooKeeper answers a failed `multi`; later operations see the effects of earlier ones.
    pub fn multi(&mut self, session: i64, ops: &[Op]) -> Result<Vec<OpResult>, (usize, zk::Error)> {
        self.check_session(session).map_err(|e| (0, e))?;
        // Plan on a copy, so the checks of later operations see the earlier ones.
        let saved = (self.nodes.clone(), self.zxid);
        let saved_watches = std::mem::take(&mut self.watches);
        let mut out = Vec::with_capacity(ops.len());
        let mut failed = None;
        for (i, op) in ops.iter().enumerate() {
            let r = match op {
                Op::Check { path, version } => match self.nodes.get(path) {
                    None => Err(zk::Error::NoNode),
                    Some(n) if n.stat.version != *version => Err(zk::Error::BadVersion),
                    Some(_) => Ok(OpResult::Check),
                },
                Op::Create { path, data, mode } => self.plan_create(path, *mode, session).map(|full| {
                    let stat = self.do_create(&full, data, *mode, session);
                    OpResult::Create { path: full, stat }
                }),
                Op::SetData { path, data, version } => {
                    self.plan_set(path, *version).map(|()| OpResult::SetData { stat: self.do_set(path, data) })
                }
                Op::Delete { path, version } => {
                    self.plan_delete(path, *version).and_then(|()| self.remove(path)).map(|()| OpResult::Delete)
                }
            };
            match r {
                Ok(r) => out.push(r),
                Err(e) => {
                    failed = Some((i, e));
                    break;
                }
            }
        }
        // Watches of the planning copy fired into nothing (they were taken away); restore them
        // and either roll back, or apply again for real so the watches fire once.
        self.watches = saved_watches;
        let done_nodes = std::mem::replace(&mut self.nodes, saved.0);
        self.zxid = saved.1;
        if let Some(f) = failed {
            return Err(f);
        }
        drop(done_nodes);
        // A multi is one transaction in ZooKeeper (one zxid for all of it); applying the
        // operations one by one again gives each its own zxid, which only the zxids' values show
        // (the differential test compares versions and structure, not zxid values).
        let mut results = Vec::with_capacity(ops.len());
        for op in ops {
            results.push(match op {
                Op::Check { .. } => OpResult::Check,
                Op::Create { path, data, mode } => {
                    let full = self.plan_create(path, *mode, session).expect("planned");
                    let stat = self.do_create(&full, data, *mode, session);
                    OpResult::Create { path: full, stat }
                }
                Op::SetData { path, data, .. } => OpResult::SetData { stat: self.do_set(path, data) },
                Op::Delete { path, .. } => {
                    self.remove(path).expect("planned");
                    OpResult::Delete
                }
            });
        }
        Ok(results)
    }

    /// A node's children, read by an observer outside any session (the simulator's checks).
    pub fn list_children_any(&self, path: &str) -> Vec<String> {
        self.nodes.get(path).map(|n| n.children.iter().cloned().collect()).unwrap_or_default()
    }

    /// A node's ephemeral owner (0: persistent), when it exists (an observer's read).
    pub fn owner_any(&self, path: &str) -> Option<i64> {
        self.nodes.get(path).map(|n| n.stat.ephemeral_owner)
    }

    /// Whether a node exists (an observer's read).
    pub fn exists_any(&self, path: &str) -> bool {
        self.nodes.contains_key(path)
    }

    /// A node's data (an observer's read).
    pub fn data_any(&self, path: &str) -> Option<Vec<u8>> {
        self.nodes.get(path).map(|n| n.data.clone())
    }

    /// Every path (for checks and traces).
    pub fn paths(&self) -> Vec<String> {
        self.nodes.keys().cloned().collect()
    }
}
