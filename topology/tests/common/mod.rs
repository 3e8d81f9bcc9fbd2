//! Shared test components: a replaying spout that checks ack/fail exactly-once delivery.
#![allow(dead_code)]

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use squall_topology::*;

/// What a [`ReplaySpout`] task observed.
#[derive(Debug, Default)]
pub struct SpoutLog {
    pub acked: Vec<u64>,
    pub failed: Vec<u64>,
    /// ack/fail for an id that was not outstanding (delivered twice or never emitted)
    pub violations: Vec<String>,
    /// largest number of outstanding tracked tuples seen
    pub max_outstanding: usize,
    pub emits: u64,
    pub closed: bool,
}

/// Emits each queued id as a tracked tuple `[id]` and re-queues it on fail.
pub struct ReplaySpout {
    pub queue: VecDeque<u64>,
    pub outstanding: HashSet<u64>,
    pub log: Arc<Mutex<SpoutLog>>,
    /// tracked emits per next_tuple call (bounded by pending_room)
    pub per_call: usize,
    pub max_pending: usize,
}

impl ReplaySpout {
    pub fn new(ids: impl IntoIterator<Item = u64>, log: Arc<Mutex<SpoutLog>>) -> Self {
        ReplaySpout {
            queue: ids.into_iter().collect(),
            outstanding: HashSet::new(),
            log,
            per_call: 1,
            max_pending: usize::MAX,
        }
    }
}

impl Spout for ReplaySpout {
    type MsgId = u64;

    async fn next_tuple(&mut self, out: &mut SpoutOutput<u64>) -> Result<(), ComponentError> {
        let n = self.per_call.min(out.pending_room());
        for _ in 0..n {
            let Some(id) = self.queue.pop_front() else { break };
            self.outstanding.insert(id);
            out.emit_tracked(values![id], id)?;
            let mut log = self.log.lock().unwrap();
            log.emits += 1;
            log.max_outstanding = log.max_outstanding.max(self.outstanding.len());
            assert!(out.pending() <= self.max_pending, "engine pending {} > max {}", out.pending(), self.max_pending);
        }
        Ok(())
    }

    async fn ack(&mut self, id: u64) {
        let mut log = self.log.lock().unwrap();
        if !self.outstanding.remove(&id) {
            log.violations.push(format!("ack of {id} not outstanding"));
        }
        log.acked.push(id);
    }

    async fn fail(&mut self, id: u64) {
        let mut log = self.log.lock().unwrap();
        if !self.outstanding.remove(&id) {
            log.violations.push(format!("fail of {id} not outstanding"));
        }
        log.failed.push(id);
        self.queue.push_back(id);
    }

    async fn close(&mut self) {
        self.log.lock().unwrap().closed = true;
    }
}

/// Silences the default panic message for panics whose message contains "injected".
pub fn quiet_injected_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let msg = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            if !msg.contains("injected") {
                prev(info);
            }
        }));
    });
}

/// Polls `cond` every millisecond (virtual time when paused) until it holds or `limit` passes.
pub async fn wait_until(limit: std::time::Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while !cond() {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    true
}

/// The topology's counters once `settled` holds of them, or the last snapshot read when `limit`
/// passes first (the caller's assertions then show what they were). Counters are published by
/// each task after it acted (a spout's after its `ack` hooks ran, a bolt's after its acks went
/// out): a test that saw the effect of an ack waits for the count of it, as any reader of
/// metrics does, rather than read a snapshot taken between the two.
pub async fn metrics_when(
    running: &RunningTopology,
    limit: std::time::Duration,
    mut settled: impl FnMut(&TopologyMetrics) -> bool,
) -> TopologyMetrics {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let m = running.metrics();
        if settled(&m) || tokio::time::Instant::now() >= deadline {
            return m;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}
