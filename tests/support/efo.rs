//! What the workers of a cluster say of how they read their shards (enhanced fan-out or
//! polling), sampled over a run: a shard's counters belong to its current owner and go with it,
//! so a test samples while it runs and keeps the highest figures seen per shard.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use squall::coord::{ShardRuntime, WorkerStatus};

use super::workers::Cluster;

/// The shard status every live worker of the cluster publishes, merged (shard -> runtime; a
/// shard of another stream than the primary one, e.g. a stage's intermediate stream, is keyed
/// `{stream}/{shard}`).
pub async fn shard_status(zk: &zookeeper_client::Client, cluster: &Cluster) -> BTreeMap<String, ShardRuntime> {
    let dir = format!("{}/topologies/{}/workers", cluster.zk_root, cluster.topology);
    let mut out = BTreeMap::new();
    for w in zk.list_children(&dir).await.unwrap_or_default() {
        if let Ok((data, _)) = zk.get_data(&format!("{dir}/{w}")).await
            && let Ok(st) = serde_json::from_slice::<WorkerStatus>(&data)
        {
            out.extend(st.shards);
        }
    }
    out
}

/// The highest counters seen per shard, over every owner it had while sampled.
#[derive(Debug, Default, Clone)]
pub struct Seen(pub BTreeMap<String, ShardRuntime>);

impl Seen {
    /// Takes one sample.
    pub async fn sample(&mut self, zk: &zookeeper_client::Client, cluster: &Cluster) {
        for (shard, rt) in shard_status(zk, cluster).await {
            let e = self.0.entry(shard).or_insert_with(|| rt.clone());
            e.get_records_calls = e.get_records_calls.max(rt.get_records_calls);
            e.records_read = e.records_read.max(rt.records_read);
            if let Some(efo) = rt.efo {
                let mine = e.efo.get_or_insert_with(Default::default);
                mine.events = mine.events.max(efo.events);
                mine.subscriptions = mine.subscriptions.max(efo.subscriptions);
                mine.resubscriptions = mine.resubscriptions.max(efo.resubscriptions);
                mine.watchdog = mine.watchdog.max(efo.watchdog);
                mine.in_use = mine.in_use.max(efo.in_use);
            }
        }
    }

    /// Samples every 500 ms until `done` or the timeout.
    pub async fn watch(
        &mut self,
        zk: &zookeeper_client::Client,
        cluster: &Cluster,
        timeout: Duration,
        done: impl Fn(&Seen) -> bool,
    ) {
        let start = Instant::now();
        while start.elapsed() < timeout {
            self.sample(zk, cluster).await;
            if done(self) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Whether `shard` was seen read by subscriptions (at least one opened, an event received).
    pub fn subscribed(&self, shard: &str) -> bool {
        self.0.get(shard).and_then(|r| r.efo.as_ref()).is_some_and(|e| e.subscriptions > 0 && e.events > 0)
    }

    /// The shards of `shards` not read by subscriptions only: not subscribed, or polled
    /// (GetRecords calls > 0) by any owner seen. Empty when all were.
    pub fn not_by_subscription_only(&self, shards: &[String]) -> Vec<String> {
        shards
            .iter()
            .filter(|sh| !self.subscribed(sh) || self.0.get(sh.as_str()).is_none_or(|r| r.get_records_calls > 0))
            .map(|sh| format!("{sh}: {:?}", self.0.get(sh.as_str())))
            .collect()
    }
}
