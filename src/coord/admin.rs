//! Topology-level access for operators (the CLI): which topologies exist under the root, which
//! streams a topology reads, and a [`ZkStore`] per stream for everything else.

use std::sync::Arc;

use zookeeper_client as zk;

use super::config::ZkConfig;
use super::error::CoordError;
use super::paths::{validate_name, validate_root};
use super::session::connect_client;
use super::store::ZkStore;
use super::zkapi::ZkClient;

/// A ZooKeeper session for administration.
pub struct Admin {
    client: Arc<dyn ZkClient>,
    cfg: ZkConfig,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin").field("cfg", &self.cfg).finish_non_exhaustive()
    }
}

impl Admin {
    /// Connects (bounded retry; the error names the connect string).
    pub async fn connect(cfg: &ZkConfig) -> Result<Self, CoordError> {
        cfg.validate()?;
        validate_root(&cfg.root)?;
        let client = connect_client(cfg).await?;
        Ok(Self { client, cfg: cfg.clone() })
    }

    /// The client, for one request (counted in [`super::session::zk_counters`]).
    fn zk(&self) -> &dyn ZkClient {
        super::session::zk_counters().request();
        &*self.client
    }

    fn topologies_dir(&self) -> String {
        format!("{}/topologies", self.cfg.root)
    }

    /// The children of `dir`, sorted; none when it does not exist.
    async fn list_sorted(&self, dir: &str) -> Result<Vec<String>, CoordError> {
        match self.zk().list_children(dir).await {
            Ok(mut v) => {
                v.sort();
                Ok(v)
            }
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(CoordError::zk(dir, "list", e)),
        }
    }

    /// Topology names under the root, sorted.
    pub async fn topologies(&self) -> Result<Vec<String>, CoordError> {
        self.list_sorted(&self.topologies_dir()).await
    }

    /// The streams a topology reads, sorted; [`CoordError::UnknownTopology`] when it does not exist.
    pub async fn streams(&self, topology: &str) -> Result<Vec<String>, CoordError> {
        validate_name("topology name", topology)?;
        let topo = format!("{}/{topology}", self.topologies_dir());
        match self.zk().check_stat(&topo).await {
            Ok(Some(_)) => {}
            Ok(None) => return Err(CoordError::UnknownTopology { topology: topology.to_string(), path: topo }),
            Err(e) => return Err(CoordError::zk(&topo, "stat", e)),
        }
        self.list_sorted(&format!("{topo}/streams")).await
    }

    /// The intermediate streams of a topology in stages ([`crate::stage`]), as ZooKeeper shows
    /// them, sorted: the children of `{topology}/streams/` that have a producer registry
    /// (`{topology}/stages/{stream}`) or a task registry of their own (`streams/{stream}/tasks`).
    /// Only the stage machinery creates either (the writers of a boundary and the readers of a
    /// later stage), never the reader of a source stream, whose tasks register under
    /// `{topology}/tasks`; so this holds with no worker alive.
    pub async fn intermediate_streams(&self, topology: &str) -> Result<Vec<String>, CoordError> {
        let topo = format!("{}/{topology}", self.topologies_dir());
        let mut out = Vec::new();
        for stream in self.streams(topology).await? {
            for marker in [format!("{topo}/stages/{stream}"), format!("{topo}/streams/{stream}/tasks")] {
                match self.zk().check_stat(&marker).await {
                    Ok(Some(_)) => {
                        out.push(stream.clone());
                        break;
                    }
                    Ok(None) => {}
                    Err(e) => return Err(CoordError::zk(&marker, "stat", e)),
                }
            }
        }
        Ok(out)
    }

    /// A store for one stream of an existing topology (its own session).
    pub async fn store(&self, topology: &str, stream: &str) -> Result<ZkStore, CoordError> {
        ZkStore::connect(&self.cfg, topology, stream).await
    }

    /// The first stream of an existing topology (topologies read one stream each), for
    /// topology-level reads and writes such as the lifecycle state.
    pub async fn any_store(&self, topology: &str) -> Result<ZkStore, CoordError> {
        let streams = self.streams(topology).await?;
        let Some(stream) = streams.first() else {
            return Err(CoordError::UnknownTopology {
                topology: topology.to_string(),
                path: format!("{}/{topology}/streams", self.topologies_dir()),
            });
        };
        self.store(topology, stream).await
    }
}
