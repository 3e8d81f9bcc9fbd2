//! The window [`Bolt`] and the [`WindowStats`] its tasks share.

use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::aggregate::WindowAggregate;
use super::bounds::Window;
use super::config::{AckMode, LatePolicy, TumblingWindowConfig};
use super::state::{Fired, Placement, WindowState};
use crate::builder::BoltDeclarer;
use crate::component::{Bolt, ComponentError, TaskContext, Watermark};
use crate::output::{AckHandle, BoltOutput};
use crate::tuple::Tuple;
use crate::value::Values;

/// Counters of the window bolts made by one [`TumblingWindow`], summed over their tasks.
#[derive(Debug, Default)]
pub struct WindowStats {
    inputs: AtomicU64,
    late: AtomicU64,
    fired: AtomicU64,
    emit_errors: AtomicU64,
    open_panes: AtomicU64,
    held: AtomicU64,
}

impl WindowStats {
    /// Inputs folded into an open window.
    pub fn inputs(&self) -> u64 {
        self.inputs.load(Ordering::Relaxed)
    }

    /// Late inputs (sent to the late stream or dropped).
    pub fn late(&self) -> u64 {
        self.late.load(Ordering::Relaxed)
    }

    /// (key, window) aggregates emitted.
    pub fn fired(&self) -> u64 {
        self.fired.load(Ordering::Relaxed)
    }

    /// Aggregates whose emit failed (undeclared stream, wrong field count); their inputs were
    /// failed.
    pub fn emit_errors(&self) -> u64 {
        self.emit_errors.load(Ordering::Relaxed)
    }

    /// Open (key, window) panes now.
    pub fn open_panes(&self) -> u64 {
        self.open_panes.load(Ordering::Relaxed)
    }

    /// Inputs held now (with [`AckMode::OnFire`]).
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }
}

#[derive(Debug)]
pub(crate) struct Spec<A> {
    pub(crate) config: TumblingWindowConfig,
    pub(crate) size: NonZeroU64,
    pub(crate) aggregate: A,
    pub(crate) output_fields: Vec<String>,
    pub(crate) late_fields: Vec<String>,
    pub(crate) stats: Arc<WindowStats>,
}

/// A validated tumbling window: makes the bolt instances (one per task) and declares their
/// streams. Cheap to clone; the clones share one [`WindowStats`].
#[derive(Debug)]
pub struct TumblingWindow<A> {
    pub(crate) spec: Arc<Spec<A>>,
}

impl<A> Clone for TumblingWindow<A> {
    fn clone(&self) -> Self {
        TumblingWindow { spec: self.spec.clone() }
    }
}

impl<A: WindowAggregate> TumblingWindow<A> {
    /// A new bolt instance (for one task).
    pub fn bolt(&self) -> TumblingWindowBolt<A> {
        TumblingWindowBolt {
            spec: self.spec.clone(),
            state: WindowState::new(self.spec.size),
            reported_panes: 0,
            reported_held: 0,
        }
    }

    /// A factory for [`crate::TopologyBuilder::set_bolt`].
    pub fn factory(&self) -> impl Fn(&TaskContext) -> TumblingWindowBolt<A> + Send + Sync + 'static {
        let this = self.clone();
        move |_| this.bolt()
    }

    /// Declares the output stream and, with [`LatePolicy::Stream`], the late stream.
    pub fn declare_outputs(&self, bolt: &mut BoltDeclarer<'_>) {
        let c = &self.spec.config;
        bolt.output(&c.output_stream, &self.spec.output_fields.iter().map(String::as_str).collect::<Vec<_>>());
        if c.late == LatePolicy::Stream {
            bolt.output(&c.late_stream, &self.spec.late_fields.iter().map(String::as_str).collect::<Vec<_>>());
        }
    }

    /// The aggregate stream's fields: key fields, `window_start_ms`, `window_end_ms`, then the
    /// aggregate's fields.
    pub fn output_fields(&self) -> &[String] {
        &self.spec.output_fields
    }

    /// The late stream's fields: key fields, `event_ms`, `window_start_ms`, `window_end_ms`.
    pub fn late_fields(&self) -> &[String] {
        &self.spec.late_fields
    }

    /// The configuration.
    pub fn config(&self) -> &TumblingWindowConfig {
        &self.spec.config
    }

    /// The counters of every bolt this spec made.
    pub fn stats(&self) -> Arc<WindowStats> {
        self.spec.stats.clone()
    }
}

/// The tumbling window bolt; make it with [`TumblingWindow::bolt`] or
/// [`TumblingWindow::factory`]. See the [module docs](self) for its semantics.
#[derive(Debug)]
pub struct TumblingWindowBolt<A: WindowAggregate> {
    spec: Arc<Spec<A>>,
    state: WindowState<A::Acc, AckHandle>,
    reported_panes: usize,
    reported_held: usize,
}

impl<A: WindowAggregate> TumblingWindowBolt<A> {
    /// This task's open windows.
    pub fn state(&self) -> &WindowState<A::Acc, AckHandle> {
        &self.state
    }

    fn late(
        &self,
        window: Window,
        key: Values,
        ts: i64,
        input: Option<AckHandle>,
        out: &mut BoltOutput,
    ) -> Result<(), ComponentError> {
        self.spec.stats.late.fetch_add(1, Ordering::Relaxed);
        let c = &self.spec.config;
        match (c.late, input) {
            (LatePolicy::Drop, Some(h)) => out.ack(h),
            (LatePolicy::Drop, None) => {} // acked when execute returns
            (LatePolicy::Stream, input) => {
                let mut v = key;
                v.push(ts);
                v.push(window.start_ms());
                v.push(window.end_ms());
                match input {
                    // on error the held input is failed by the engine as execute returns Err
                    Some(h) => {
                        out.emit_anchored(&[&h], &c.late_stream, v)?;
                        out.ack(h);
                    }
                    None => out.emit_to(&c.late_stream, v)?,
                }
            }
        }
        Ok(())
    }

    /// Emits the fired panes, then acks their inputs (fails them if the emit was refused).
    fn emit_fired(&mut self, fired: Vec<Fired<A::Acc, AckHandle>>, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let spec = &*self.spec;
        let mut first_err = None;
        for f in fired {
            let mut v = f.key;
            v.push(f.window.start_ms());
            v.push(f.window.end_ms());
            for x in spec.aggregate.emit(&f.acc).iter() {
                v.push(x.clone());
            }
            let stream = &spec.config.output_stream;
            let r = if f.inputs.is_empty() {
                out.emit_unanchored_to(stream, v)
            } else {
                let refs: Vec<&AckHandle> = f.inputs.iter().collect();
                out.emit_anchored(&refs, stream, v)
            };
            match r {
                Ok(()) => {
                    spec.stats.fired.fetch_add(1, Ordering::Relaxed);
                    for h in f.inputs {
                        out.ack(h);
                    }
                }
                Err(e) => {
                    spec.stats.emit_errors.fetch_add(1, Ordering::Relaxed);
                    for h in f.inputs {
                        out.fail(h);
                    }
                    first_err.get_or_insert(e);
                }
            }
        }
        self.report();
        match first_err {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Publishes this task's gauges into the shared stats.
    fn report(&mut self) {
        let s = &self.spec.stats;
        for (now, last, gauge) in [
            (self.state.open_panes(), &mut self.reported_panes, &s.open_panes),
            (self.state.held(), &mut self.reported_held, &s.held),
        ] {
            if now >= *last {
                gauge.fetch_add((now - *last) as u64, Ordering::Relaxed);
            } else {
                gauge.fetch_sub((*last - now) as u64, Ordering::Relaxed);
            }
            *last = now;
        }
    }
}

impl<A: WindowAggregate> Bolt for TumblingWindowBolt<A> {
    async fn execute(&mut self, input: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let spec = self.spec.clone();
        let c = &spec.config;
        let ts = input.get_i64(&c.time_field)?;
        let key = c.key_fields.iter().map(|f| input.get(f).cloned()).collect::<Result<Values, _>>()?;
        let handle = match c.ack {
            AckMode::OnFire => Some(out.defer_ack()?),
            AckMode::OnReceive => None,
        };
        let agg = &spec.aggregate;
        // if `add` fails, the deferred input is failed by the engine as execute returns Err
        match self.state.add(key, ts, handle, || agg.init(), |acc| agg.add(acc, &input))? {
            Placement::Open(_) => {
                spec.stats.inputs.fetch_add(1, Ordering::Relaxed);
                self.report();
                Ok(())
            }
            Placement::Late { window, key, input } => self.late(window, key, ts, input, out),
        }
    }

    async fn on_watermark(&mut self, wm: Watermark, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let fired = self.state.advance(wm.millis());
        self.emit_fired(fired, out)
    }

    async fn on_drain(&mut self, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let fired = self.state.flush();
        self.emit_fired(fired, out)
    }
}
