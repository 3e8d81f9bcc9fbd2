//! The executors: one tokio task per component instance, wired with bounded channels.
//!
//! Data path: each bolt task has one bounded input channel of [`Envelope`]s (batches of tuples,
//! watermarks and drain markers, in order per sending task). Each spout task has a bounded ack
//! channel (ack-tree updates from bolts) and a control channel (activate, deactivate, drain).
//! A full input channel blocks the sender (backpressure up to the spouts); spout tasks keep
//! draining their ack channel while blocked, so acks cannot deadlock with data.

pub(crate) mod bolt;
pub(crate) mod spout;

use std::collections::{BTreeSet, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::acker::AckBatch;
use crate::builder::{Kind, Topology};
use crate::component::{ComponentError, TaskContext, Wakeup};
use crate::config::{ConfigError, TopologyConfig};
use crate::grouping::{AnyRouter, RouteContext};
use crate::metrics::{ComponentKind, MetricsRegistry, TaskMetrics};
use crate::output::route::{BatchPool, Envelope, OutStream, Outbox, Route, Target};
use crate::tuple::StreamMeta;

/// Why a topology stopped or could not start. `Clone`, so every waiter sees it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TopologyError {
    /// The configuration is invalid (the submitter's fault).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A component hook returned an error that stops the topology (`open`, `prepare`, or a
    /// non-retryable `next_tuple` error).
    #[error("task {task} of `{component}` failed in {hook}: {message}")]
    TaskFailed {
        /// The component.
        component: String,
        /// The task index.
        task: usize,
        /// The hook that failed.
        hook: &'static str,
        /// The error, with its causes.
        message: String,
        /// Whether the component said retrying may help.
        retryable: bool,
    },
    /// A task panicked outside the hooks the engine isolates (bolt `execute`).
    #[error("task {task} of `{component}` panicked: {message}")]
    TaskPanicked {
        /// The component.
        component: String,
        /// The task index.
        task: usize,
        /// The panic message.
        message: String,
    },
    /// The topology is no longer running.
    #[error("topology `{topology}` is not running")]
    Stopped {
        /// The topology.
        topology: String,
    },
}

impl TopologyError {
    pub(crate) fn failed(ctx: &TaskContext, hook: &'static str, e: &ComponentError) -> Self {
        let mut message = e.to_string();
        let mut src = std::error::Error::source(e);
        while let Some(s) = src {
            message.push_str(": ");
            message.push_str(&s.to_string());
            src = s.source();
        }
        TopologyError::TaskFailed {
            component: ctx.component.to_string(),
            task: ctx.task_index,
            hook,
            message,
            retryable: e.is_retryable(),
        }
    }

    pub(crate) fn panicked(ctx: &TaskContext, payload: &(dyn std::any::Any + Send)) -> Self {
        TopologyError::TaskPanicked {
            component: ctx.component.to_string(),
            task: ctx.task_index,
            message: panic_message(payload),
        }
    }
}

pub(crate) type TaskFailure = TopologyError;

pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// Commands to a spout task.
#[derive(Debug)]
pub(crate) enum SpoutCommand {
    Activate,
    Deactivate,
    Drain,
    /// Answered once every command sent before it is applied, with the task's counters published
    /// after them (its pending count then includes every tuple it emitted before).
    Barrier(tokio::sync::oneshot::Sender<()>),
}

pub(crate) struct SpoutWiring {
    pub(crate) outbox: Outbox,
    pub(crate) slot: usize,
    pub(crate) max_pending: usize,
    pub(crate) ack_rx: mpsc::Receiver<AckBatch>,
    pub(crate) ctrl_rx: mpsc::Receiver<SpoutCommand>,
    pub(crate) metrics: Arc<TaskMetrics>,
}

pub(crate) struct BoltWiring {
    pub(crate) outbox: Outbox,
    pub(crate) rx: mpsc::Receiver<Envelope>,
    /// Where the task hands back the buffers of the batches it executed.
    pub(crate) pool: Arc<BatchPool>,
    pub(crate) upstream: Vec<usize>,
    pub(crate) ack_txs: Arc<[mpsc::Sender<AckBatch>]>,
    pub(crate) metrics: Arc<TaskMetrics>,
    pub(crate) tick: Option<std::time::Duration>,
}

/// State shared by a running topology's tasks and its handle.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub(crate) errors: Mutex<Vec<TopologyError>>,
    pub(crate) live_tasks: AtomicUsize,
}

impl Shared {
    pub(crate) fn push_error(&self, e: TopologyError) {
        self.errors.lock().unwrap_or_else(|p| p.into_inner()).push(e);
    }

    pub(crate) fn first_error(&self) -> Option<TopologyError> {
        self.errors.lock().unwrap_or_else(|p| p.into_inner()).first().cloned()
    }
}

/// What `start` hands to the running topology's handle.
pub(crate) struct Started {
    pub(crate) spout_ctrl: Vec<mpsc::Sender<SpoutCommand>>,
    pub(crate) metrics: Arc<MetricsRegistry>,
    pub(crate) shared: Arc<Shared>,
}

/// (stream index, consumer component index, grouping)
type Subscription = (usize, usize, Arc<dyn crate::grouping::Grouping>);

/// Wires and spawns every task of `topology` on `tracker`.
pub(crate) fn start(
    topology: &Topology,
    config: TopologyConfig,
    cancel: &CancellationToken,
    tracker: &TaskTracker,
) -> Result<Started, TopologyError> {
    config.validate()?;
    let config = Arc::new(config);
    let comps = &topology.components;

    // topology-wide task ids, and spout ack slots
    let mut base = Vec::with_capacity(comps.len());
    let mut next = 0;
    let mut spout_slot_base = vec![0; comps.len()];
    let mut spout_tasks = 0;
    for (i, c) in comps.iter().enumerate() {
        base.push(next);
        next += c.parallelism;
        if matches!(c.kind, Kind::Spout(_)) {
            spout_slot_base[i] = spout_tasks;
            spout_tasks += c.parallelism;
        }
    }
    let total_tasks = next;

    let mut ack_txs = Vec::with_capacity(spout_tasks);
    let mut ack_rxs = Vec::with_capacity(spout_tasks);
    for _ in 0..spout_tasks {
        let (tx, rx) = mpsc::channel(config.ack_channel_capacity);
        ack_txs.push(tx);
        ack_rxs.push(Some(rx));
    }
    let ack_txs: Arc<[mpsc::Sender<AckBatch>]> = ack_txs.into();

    let mut data_txs: Vec<Option<mpsc::Sender<Envelope>>> = vec![None; total_tasks];
    let mut data_rxs: Vec<Option<mpsc::Receiver<Envelope>>> = (0..total_tasks).map(|_| None).collect();
    let mut pools: Vec<Option<Arc<BatchPool>>> = vec![None; total_tasks];
    for (i, c) in comps.iter().enumerate() {
        if matches!(c.kind, Kind::Bolt(_)) {
            for t in 0..c.parallelism {
                let (tx, rx) = mpsc::channel(config.channel_capacity);
                data_txs[base[i] + t] = Some(tx);
                data_rxs[base[i] + t] = Some(rx);
                // as many buffers as the channel holds batches, plus the senders' own
                let cap = config.channel_capacity + 8;
                pools[base[i] + t] = Some(Arc::new(BatchPool::new(config.batch_size, cap)));
            }
        }
    }

    // subscriptions per source component: (stream, consumer, grouping)
    let mut subs: Vec<Vec<Subscription>> = vec![Vec::new(); comps.len()];
    for (b, c) in comps.iter().enumerate() {
        for input in &c.inputs {
            subs[input.component].push((input.stream, b, input.grouping.clone()));
        }
    }

    let registry = Arc::new(MetricsRegistry {
        components: comps
            .iter()
            .map(|c| {
                let kind = match c.kind {
                    Kind::Spout(_) => ComponentKind::Spout,
                    Kind::Bolt(_) => ComponentKind::Bolt,
                };
                (c.id.to_string(), kind, (0..c.parallelism).map(|_| Arc::new(TaskMetrics::default())).collect())
            })
            .collect(),
    });
    let shared = Arc::new(Shared::default());
    let mut spout_ctrl = Vec::new();
    let mut spawns = Vec::with_capacity(total_tasks);

    for (ci, c) in comps.iter().enumerate() {
        // every task of every subscribing component is a target (watermarks and drain markers go
        // to all of them, whatever the grouping)
        let consumers: BTreeSet<usize> = subs[ci].iter().map(|(_, b, _)| *b).collect();
        let mut target_of: HashMap<(usize, usize), usize> = HashMap::new();
        let mut target_ids = Vec::new();
        for &b in &consumers {
            for t in 0..comps[b].parallelism {
                target_of.insert((b, t), target_ids.len());
                target_ids.push(base[b] + t);
            }
        }
        let upstream: Vec<usize> = {
            let srcs: BTreeSet<usize> = c.inputs.iter().map(|i| i.component).collect();
            let base = &base;
            srcs.iter().flat_map(|&s| (0..comps[s].parallelism).map(move |t| base[s] + t)).collect()
        };
        for task in 0..c.parallelism {
            let task_id = base[ci] + task;
            let streams = c
                .streams
                .iter()
                .enumerate()
                .map(|(si, (name, fields, direct))| OutStream {
                    meta: StreamMeta { component: c.id.clone(), task, stream: name.clone(), fields: fields.clone() }
                        .intern(),
                    direct: *direct,
                    record_type: None,
                    routes: subs[ci]
                        .iter()
                        .filter(|(s, _, _)| *s == si)
                        .map(|(_, b, g)| Route {
                            consumer: comps[*b].id.clone(),
                            grouping: g.name(),
                            router: AnyRouter::new(
                                &**g,
                                fields,
                                RouteContext { source_task: task, target_tasks: comps[*b].parallelism },
                            ),
                            tasks: (0..comps[*b].parallelism).map(|t| target_of[&(*b, t)]).collect(),
                        })
                        .collect(),
                })
                .collect();
            let targets = target_ids
                .iter()
                .filter_map(|&id| Some((data_txs[id].clone()?, pools[id].clone()?)))
                .map(|(tx, pool)| Target { tx, buf: pool.take(), pool, rec: None })
                .collect();
            let outbox = Outbox::new(task_id, c.id.clone(), streams, targets, config.batch_size);
            let metrics = registry.components[ci].2[task].clone();
            let task_metrics = metrics.clone();
            let ctx = TaskContext {
                topology: topology.name.clone(),
                component: c.id.clone(),
                task_index: task,
                parallelism: c.parallelism,
                task_id,
                config: config.clone(),
                component_config: c.config.clone(),
                metrics: task_metrics,
                wakeup: Wakeup::default(),
                cancel: cancel.clone(),
                tracker: tracker.clone(),
            };
            let fut = match &c.kind {
                Kind::Spout(f) => {
                    let slot = spout_slot_base[ci] + task;
                    let (ctrl_tx, ctrl_rx) = mpsc::channel(16);
                    spout_ctrl.push(ctrl_tx);
                    let ack_rx = ack_rxs[slot]
                        .take()
                        .ok_or_else(|| TopologyError::Stopped { topology: topology.name.to_string() })?;
                    let max_pending = c.config.max_spout_pending.unwrap_or(config.max_spout_pending);
                    let wiring = SpoutWiring { outbox, slot, max_pending, ack_rx, ctrl_rx, metrics };
                    let f = f.clone();
                    let c2 = ctx.clone();
                    std::panic::catch_unwind(AssertUnwindSafe(move || f.spawn(c2, wiring)))
                        .map_err(|p| TopologyError::panicked(&ctx, &*p))?
                }
                Kind::Bolt(f) => {
                    let rx = data_rxs[task_id]
                        .take()
                        .ok_or_else(|| TopologyError::Stopped { topology: topology.name.to_string() })?;
                    let pool = pools[task_id]
                        .clone()
                        .ok_or_else(|| TopologyError::Stopped { topology: topology.name.to_string() })?;
                    let wiring = BoltWiring {
                        outbox,
                        rx,
                        pool,
                        upstream: upstream.clone(),
                        ack_txs: ack_txs.clone(),
                        metrics,
                        tick: c.config.tick_interval_ms.map(std::time::Duration::from_millis),
                    };
                    let f = f.clone();
                    let c2 = ctx.clone();
                    std::panic::catch_unwind(AssertUnwindSafe(move || f.spawn(c2, wiring)))
                        .map_err(|p| TopologyError::panicked(&ctx, &*p))?
                }
            };
            spawns.push((ctx, fut));
        }
    }
    drop(data_txs);
    drop(ack_txs);

    shared.live_tasks.store(spawns.len(), Ordering::SeqCst);
    for (ctx, fut) in spawns {
        let shared = shared.clone();
        let cancel = cancel.clone();
        tracker.spawn(async move {
            let r = AssertUnwindSafe(fut).catch_unwind().await;
            let err = match r {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e),
                Err(p) => Some(TopologyError::panicked(&ctx, &*p)),
            };
            if let Some(e) = err {
                tracing::error!(topology = %ctx.topology, component = %ctx.component, task = ctx.task_index, error = %e, "task failed; stopping the topology");
                shared.push_error(e);
                cancel.cancel();
            }
            // the last component task to finish stops the components' background tasks
            if shared.live_tasks.fetch_sub(1, Ordering::SeqCst) == 1 {
                cancel.cancel();
            }
        });
    }
    Ok(Started { spout_ctrl, metrics: registry, shared })
}
