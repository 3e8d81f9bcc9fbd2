//! Helpers shared by the Kinesis and coordination benchmarks.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;

/// The median of `v` (NaN when empty).
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let m = s.len() / 2;
    if s.len() % 2 == 1 { s[m] } else { (s[m - 1] + s[m]) / 2.0 }
}

/// A name no other run uses: prefix, pid, counter, random suffix.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{n}-{:04x}", std::process::id(), rand::random::<u16>())
}

/// A ZooKeeper client for observing (not part of what is measured).
pub async fn zk_client(connect: &str) -> anyhow::Result<zookeeper_client::Client> {
    zookeeper_client::Client::connector()
        .with_session_timeout(Duration::from_secs(20))
        .connect(connect)
        .await
        .with_context(|| format!("connecting to ZooKeeper at {connect}"))
}

/// Deletes a znode tree (best effort): the benchmarks' own ZooKeeper roots.
pub async fn zk_delete_tree(zk: &zookeeper_client::Client, root: &str) {
    let mut stack = vec![root.to_string()];
    let mut order = Vec::new();
    while let Some(p) = stack.pop() {
        for c in zk.list_children(&p).await.unwrap_or_default() {
            stack.push(format!("{p}/{c}"));
        }
        order.push(p);
    }
    for p in order.iter().rev() {
        let _ = zk.delete(p, None).await;
    }
}
