//! The in-process runner (Storm's LocalCluster): [`run_local`] starts a topology on the current
//! tokio runtime and returns a [`RunningTopology`] handle.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::builder::Topology;
use crate::config::TopologyConfig;
use crate::executor::{self, Shared, SpoutCommand, TopologyError};
use crate::metrics::{MetricsRegistry, TopologyMetrics};

/// Runs topologies inside this process; shutting the cluster down stops all of them.
#[derive(Debug, Default)]
pub struct LocalCluster {
    cancel: CancellationToken,
    trackers: Mutex<Vec<TaskTracker>>,
}

impl LocalCluster {
    /// An empty cluster.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts `topology` on the current tokio runtime. Fails if the config is invalid or a
    /// component factory panics.
    pub fn submit(&self, topology: Topology, config: TopologyConfig) -> Result<RunningTopology, TopologyError> {
        let cancel = self.cancel.child_token();
        let tracker = TaskTracker::new();
        let message_timeout = config.message_timeout();
        let started = match executor::start(&topology, config, &cancel, &tracker) {
            Ok(s) => s,
            Err(e) => {
                cancel.cancel();
                tracker.close();
                return Err(e);
            }
        };
        tracker.close();
        self.trackers.lock().unwrap_or_else(|p| p.into_inner()).push(tracker.clone());
        Ok(RunningTopology {
            name: topology.name.to_string(),
            cancel,
            tracker,
            spout_ctrl: started.spout_ctrl,
            metrics: started.metrics,
            shared: started.shared,
            message_timeout,
        })
    }

    /// Cancels every topology of this cluster and waits for all their tasks.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        let trackers = std::mem::take(&mut *self.trackers.lock().unwrap_or_else(|p| p.into_inner()));
        for t in trackers {
            t.wait().await;
        }
    }
}

/// Starts `topology` in this process (on the current tokio runtime).
///
/// ```
/// # use squall_topology::*;
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// struct Once(bool);
/// impl Spout for Once {
///     type MsgId = ();
///     async fn next_tuple(&mut self, out: &mut SpoutOutput<()>) -> Result<(), ComponentError> {
///         if !std::mem::replace(&mut self.0, true) { out.emit_tracked(["hi"], ())?; }
///         Ok(())
///     }
/// }
/// struct Print;
/// impl Bolt for Print {
///     async fn execute(&mut self, t: Tuple, _: &mut BoltOutput) -> Result<(), ComponentError> {
///         assert_eq!(t.get_str("msg")?, "hi");
///         Ok(())
///     }
/// }
/// let mut b = TopologyBuilder::new("hello");
/// b.set_spout("s", 1, |_| Once(false)).fields(&["msg"]);
/// b.set_bolt("p", 1, |_| Print).shuffle_grouping("s");
/// let running = run_local(b.build().unwrap(), TopologyConfig::default()).unwrap();
/// while running.metrics().component("s").unwrap().acked < 1 {
///     tokio::time::sleep(std::time::Duration::from_millis(1)).await;
/// }
/// running.drain().await.unwrap();
/// running.wait().await.unwrap();
/// # }
/// ```
pub fn run_local(topology: Topology, config: TopologyConfig) -> Result<RunningTopology, TopologyError> {
    // The topology is owned by its handle: dropping the cluster does not stop it.
    let cluster = LocalCluster::new();
    cluster.submit(topology, config)
}

/// A handle to a running topology. Dropping it cancels the topology's tasks.
#[derive(Debug)]
pub struct RunningTopology {
    name: String,
    cancel: CancellationToken,
    tracker: TaskTracker,
    spout_ctrl: Vec<mpsc::Sender<SpoutCommand>>,
    metrics: Arc<MetricsRegistry>,
    shared: Arc<Shared>,
    message_timeout: Duration,
}

impl RunningTopology {
    /// The topology's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    async fn command(&self, cmd: fn() -> SpoutCommand) -> Result<(), TopologyError> {
        if let Some(e) = self.shared.first_error() {
            return Err(e);
        }
        if self.cancel.is_cancelled() {
            return Err(TopologyError::Stopped { topology: self.name.clone() });
        }
        for tx in &self.spout_ctrl {
            // a spout task that already finished (drained) ignores commands
            let _ = tx.send(cmd()).await;
        }
        Ok(())
    }

    /// Returns once every spout task has applied the commands sent before and published its
    /// counters after them (a task that finished counts as done).
    async fn barrier(&self) {
        let mut answers = Vec::with_capacity(self.spout_ctrl.len());
        for tx in &self.spout_ctrl {
            let (done, answer) = tokio::sync::oneshot::channel();
            if tx.send(SpoutCommand::Barrier(done)).await.is_ok() {
                answers.push(answer);
            }
        }
        for answer in answers {
            // an error: the task stopped (and dropped the command)
            let _ = answer.await;
        }
    }

    /// Activates the spouts: `next_tuple` is called again.
    pub async fn activate(&self) -> Result<(), TopologyError> {
        self.command(|| SpoutCommand::Activate).await
    }

    /// Deactivates the spouts: `next_tuple` is no longer called; acks, fails and timeouts still
    /// reach them.
    pub async fn deactivate(&self) -> Result<(), TopologyError> {
        self.command(|| SpoutCommand::Deactivate).await
    }

    /// Drains the topology: spouts run their `drain` hook and stop producing, a +infinity
    /// watermark and a drain marker flow in band behind the data; each bolt calls `on_drain` once
    /// all its inputs drained; spouts finish when their pending trees complete or time out.
    /// Await [`RunningTopology::wait`] for the end.
    pub async fn drain(&self) -> Result<(), TopologyError> {
        self.command(|| SpoutCommand::Drain).await
    }

    /// A snapshot of every component's counters.
    pub fn metrics(&self) -> TopologyMetrics {
        self.metrics.snapshot()
    }

    /// A handle that reads the same counters as [`RunningTopology::metrics`], for a metrics
    /// endpoint that must not hold the topology.
    pub fn metrics_handle(&self) -> crate::metrics::MetricsHandle {
        crate::metrics::MetricsHandle(self.metrics.clone())
    }

    /// Tracked tuples in flight over all spout tasks.
    pub fn pending(&self) -> u64 {
        self.metrics.snapshot().components.values().map(|c| c.pending).sum()
    }

    /// True once every task has stopped.
    pub fn is_finished(&self) -> bool {
        self.tracker.is_empty()
    }

    /// Waits until every task has stopped (after a drain, a failure or a cancel) and reports the
    /// first task failure.
    pub async fn wait(&self) -> Result<(), TopologyError> {
        self.tracker.wait().await;
        match self.shared.first_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Storm's kill: deactivates the spouts, waits up to `wait` for pending tuples to complete,
    /// then cancels every task and joins them. Reports the first task failure, if any.
    pub async fn kill(self, wait: Duration) -> Result<(), TopologyError> {
        let _ = self.command(|| SpoutCommand::Deactivate).await;
        let deadline = tokio::time::Instant::now() + wait;
        // The published pending counts lag a spout in the middle of a burst (it publishes after
        // it): read them only once every spout has taken the deactivation. Else the tasks were
        // cancelled with acks of completed tuples on their way to the spout, which then never
        // saw them (a Kinesis spout checkpointed short of records its sink had written).
        let _ = tokio::time::timeout_at(deadline, self.barrier()).await;
        while self.pending() > 0 && !self.is_finished() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.cancel.cancel();
        self.wait().await
    }

    /// [`RunningTopology::kill`] with the message timeout as the wait.
    pub async fn shutdown(self) -> Result<(), TopologyError> {
        let wait = self.message_timeout;
        self.kill(wait).await
    }

    /// Cancels every task now without waiting for pending tuples, and joins them.
    pub async fn cancel(self) -> Result<(), TopologyError> {
        self.cancel.cancel();
        self.wait().await
    }
}

impl Drop for RunningTopology {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}
