//! The window [`Bolt`], the [`WindowSpec`] that makes it, and the [`WindowStats`] its tasks
//! share.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::aggregate::WindowAggregate;
use super::bounds::{Window, WindowKind};
use super::config::{AckMode, LatePolicy};
use super::state::{Fired, HeldInput, Placement, WindowState};
use crate::builder::BoltDeclarer;
use crate::component::{Bolt, ComponentError, TaskContext, Watermark};
use crate::output::{AckHandle, BoltOutput};
use crate::tuple::Tuple;
use crate::value::Values;

/// Counters of the window bolts made by one [`WindowSpec`], summed over their tasks.
#[derive(Debug, Default)]
pub struct WindowStats {
    inputs: AtomicU64,
    late: AtomicU64,
    fired: AtomicU64,
    refinements: AtomicU64,
    emit_errors: AtomicU64,
    panics: AtomicU64,
    open_panes: AtomicU64,
    held: AtomicU64,
}

impl WindowStats {
    /// Inputs folded into a window (open, or within the allowed lateness).
    pub fn inputs(&self) -> u64 {
        self.inputs.load(Ordering::Relaxed)
    }

    /// Late inputs, past every window's allowed lateness (sent to the late stream or dropped).
    pub fn late(&self) -> u64 {
        self.late.load(Ordering::Relaxed)
    }

    /// (key, window) aggregates emitted, refinements included.
    pub fn fired(&self) -> u64 {
        self.fired.load(Ordering::Relaxed)
    }

    /// Of [`WindowStats::fired`], the refinements: aggregates emitted again for a window that
    /// late inputs within the allowed lateness updated.
    pub fn refinements(&self) -> u64 {
        self.refinements.load(Ordering::Relaxed)
    }

    /// Aggregates not emitted because the emit failed (undeclared stream, wrong field count) or
    /// [`WindowAggregate::emit`] panicked; their inputs were failed.
    pub fn emit_errors(&self) -> u64 {
        self.emit_errors.load(Ordering::Relaxed)
    }

    /// Of [`WindowStats::emit_errors`], the panics of [`WindowAggregate::emit`].
    pub fn panics(&self) -> u64 {
        self.panics.load(Ordering::Relaxed)
    }

    /// (key, window) panes kept now: waiting to fire, or fired and kept for the allowed
    /// lateness.
    pub fn open_panes(&self) -> u64 {
        self.open_panes.load(Ordering::Relaxed)
    }

    /// Inputs held now (with [`AckMode::OnFire`]), each counted once.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }
}

/// A validated window configuration, shared by the spec and its bolts.
#[derive(Debug)]
pub(crate) struct Spec<A> {
    pub(crate) kind: WindowKind,
    pub(crate) time_field: String,
    pub(crate) key_fields: Vec<String>,
    pub(crate) allowed_lateness_ms: u64,
    pub(crate) late: LatePolicy,
    pub(crate) late_stream: String,
    pub(crate) output_stream: String,
    pub(crate) ack: AckMode,
    pub(crate) aggregate: A,
    pub(crate) output_fields: Vec<String>,
    pub(crate) late_fields: Vec<String>,
    pub(crate) stats: Arc<WindowStats>,
}

/// A validated window (tumbling, sliding or session): makes the bolt instances (one per task)
/// and declares their streams. Cheap to clone; the clones share one [`WindowStats`]. Built by
/// [`TumblingWindowConfig::build`](super::TumblingWindowConfig::build),
/// [`SlidingWindowConfig::build`](super::SlidingWindowConfig::build) or
/// [`SessionWindowConfig::build`](super::SessionWindowConfig::build).
#[derive(Debug)]
pub struct WindowSpec<A> {
    pub(crate) spec: Arc<Spec<A>>,
}

/// The name of [`WindowSpec`] from when windows were only tumbling.
pub type TumblingWindow<A> = WindowSpec<A>;

/// The name of [`WindowBolt`] from when windows were only tumbling.
pub type TumblingWindowBolt<A> = WindowBolt<A>;

impl<A> Clone for WindowSpec<A> {
    fn clone(&self) -> Self {
        WindowSpec { spec: self.spec.clone() }
    }
}

impl<A: WindowAggregate> WindowSpec<A> {
    /// A new bolt instance (for one task).
    pub fn bolt(&self) -> WindowBolt<A> {
        WindowBolt {
            spec: self.spec.clone(),
            state: WindowState::new(self.spec.kind).with_allowed_lateness(self.spec.allowed_lateness_ms),
            reported_panes: 0,
            reported_held: 0,
        }
    }

    /// A factory for [`crate::TopologyBuilder::set_bolt`].
    pub fn factory(&self) -> impl Fn(&TaskContext) -> WindowBolt<A> + Send + Sync + 'static {
        let this = self.clone();
        move |_| this.bolt()
    }

    /// Declares the output stream and, with [`LatePolicy::Stream`], the late stream.
    pub fn declare_outputs(&self, bolt: &mut BoltDeclarer<'_>) {
        let s = &self.spec;
        bolt.output(&s.output_stream, &s.output_fields.iter().map(String::as_str).collect::<Vec<_>>());
        if s.late == LatePolicy::Stream {
            bolt.output(&s.late_stream, &s.late_fields.iter().map(String::as_str).collect::<Vec<_>>());
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

    /// How event times map to windows.
    pub fn kind(&self) -> WindowKind {
        self.spec.kind
    }

    /// The counters of every bolt this spec made.
    pub fn stats(&self) -> Arc<WindowStats> {
        self.spec.stats.clone()
    }
}

/// What the bolt makes of a fired pane: the aggregate's values, or the panic of its `emit`.
type Output = Result<Values, Box<dyn Any + Send>>;

/// The window bolt; make it with [`WindowSpec::bolt`] or [`WindowSpec::factory`]. See the
/// [module docs](super) for its semantics.
#[derive(Debug)]
pub struct WindowBolt<A: WindowAggregate> {
    spec: Arc<Spec<A>>,
    state: WindowState<A::Acc, AckHandle>,
    reported_panes: usize,
    reported_held: usize,
}

impl<A: WindowAggregate> WindowBolt<A> {
    /// This task's windows.
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
        let s = &self.spec;
        match (s.late, input) {
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
                        out.emit_anchored(&[&h], &s.late_stream, v)?;
                        out.ack(h);
                    }
                    None => out.emit_to(&s.late_stream, v)?,
                }
            }
        }
        Ok(())
    }

    /// The output of a fired pane; a panic of the aggregate's `emit` is caught, to be resumed
    /// once every other fired pane is emitted.
    fn eval(aggregate: &A) -> impl FnMut(&Window, &Values, &A::Acc) -> Output + '_ {
        move |_, _, acc| catch_unwind(AssertUnwindSafe(|| aggregate.emit(acc)))
    }

    /// Emits the fired panes, anchored to the inputs each gives away, then releases those
    /// inputs: an input is acked by the last of its windows to fire, or failed if any of their
    /// emits failed. A pane whose `emit` panicked is not emitted and fails its inputs; the other
    /// panes are emitted all the same, then the first panic is resumed (the engine logs it).
    /// Full output batches are sent as they fill (waiting for room downstream), so a firing of
    /// many panes holds at most a batch per target, not every aggregate, until it ends.
    async fn emit_fired(
        &mut self,
        fired: Vec<Fired<Output, AckHandle>>,
        out: &mut BoltOutput,
    ) -> Result<(), ComponentError> {
        let spec = &*self.spec;
        let mut first_err = None;
        let mut panic = None;
        for f in fired {
            let r = match f.output {
                Ok(agg) => {
                    let mut v = f.key;
                    v.push(f.window.start_ms());
                    v.push(f.window.end_ms());
                    for x in agg.iter() {
                        v.push(x.clone());
                    }
                    let stream = &spec.output_stream;
                    if f.inputs.is_empty() {
                        out.emit_unanchored_to(stream, v)
                    } else {
                        let refs: Vec<&AckHandle> = f.inputs.iter().map(|h| h.handle()).collect();
                        out.emit_anchored(&refs, stream, v)
                    }
                    .map_err(ComponentError::from)
                }
                Err(p) => {
                    spec.stats.panics.fetch_add(1, Ordering::Relaxed);
                    panic.get_or_insert(p);
                    Err(ComponentError::fatal("window aggregate emit panicked"))
                }
            };
            match r {
                Ok(()) => {
                    spec.stats.fired.fetch_add(1, Ordering::Relaxed);
                    if f.refinement {
                        spec.stats.refinements.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Err(e) => {
                    spec.stats.emit_errors.fetch_add(1, Ordering::Relaxed);
                    for h in &f.inputs {
                        h.fail();
                    }
                    first_err.get_or_insert(e);
                }
            }
            for h in f.inputs {
                if let Some((h, failed)) = HeldInput::release(h) {
                    if failed { out.fail(h) } else { out.ack(h) }
                }
            }
            if out.has_ready() {
                // stopped: the rest is buffered and dropped with the task
                let _ = out.send_ready().await;
            }
        }
        self.report();
        if let Some(p) = panic {
            resume_unwind(p);
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Publishes this task's gauges into the shared stats.
    fn report(&mut self) {
        let s = &self.spec.stats;
        for (now, last, gauge) in [
            (self.state.panes(), &mut self.reported_panes, &s.open_panes),
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

impl<A: WindowAggregate> Bolt for WindowBolt<A> {
    async fn execute(&mut self, input: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let spec = self.spec.clone();
        let ts = input.get_i64(&spec.time_field)?;
        let key = spec.key_fields.iter().map(|f| input.get(f).cloned()).collect::<Result<Values, _>>()?;
        let handle = match spec.ack {
            AckMode::OnFire => Some(out.defer_ack()?),
            AckMode::OnReceive => None,
        };
        let agg = &spec.aggregate;
        // if `add` fails or panics, nothing is recorded, and the engine fails the deferred input
        let placed =
            self.state.add(key, ts, handle, || agg.init(), |acc| agg.add(acc, &input), |a, b| agg.merge(a, b))?;
        match placed {
            Placement::Open(_) => {
                spec.stats.inputs.fetch_add(1, Ordering::Relaxed);
                // an input within the allowed lateness updates windows that already fired
                let refined = self.state.fire_updated(Self::eval(agg));
                self.emit_fired(refined, out).await
            }
            Placement::Late { window, key, input } => self.late(window, key, ts, input, out),
        }
    }

    async fn on_watermark(&mut self, wm: Watermark, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let spec = self.spec.clone();
        let fired = self.state.advance(wm.millis(), Self::eval(&spec.aggregate));
        self.emit_fired(fired, out).await
    }

    async fn on_drain(&mut self, out: &mut BoltOutput) -> Result<(), ComponentError> {
        let spec = self.spec.clone();
        let fired = self.state.flush(Self::eval(&spec.aggregate));
        self.emit_fired(fired, out).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TopologyConfig;
    use crate::testing::BoltHarness;
    use crate::values;
    use crate::window::{Count, TumblingWindowConfig};

    /// A window bolt that notes how many full batches wait in its output after each firing.
    struct ReadyAfterFire {
        window: WindowBolt<Count>,
        ready: Vec<usize>,
    }

    impl Bolt for ReadyAfterFire {
        async fn execute(&mut self, input: Tuple, out: &mut BoltOutput) -> Result<(), ComponentError> {
            self.window.execute(input, out).await
        }

        async fn on_watermark(&mut self, wm: Watermark, out: &mut BoltOutput) -> Result<(), ComponentError> {
            let r = self.window.on_watermark(wm, out).await;
            self.ready.push(out.outbox.ready.len());
            r
        }
    }

    /// Issue 33, point 16: a firing sends its aggregates as batches fill (with backpressure),
    /// so what waits to be sent stays within a batch, however many panes fire.
    #[tokio::test]
    async fn a_firing_sends_as_it_goes() {
        let spec = TumblingWindowConfig::new(1_000, "ts", &["user"]).build(Count).unwrap();
        let probe = ReadyAfterFire { window: spec.bolt(), ready: Vec::new() };
        let mut h = BoltHarness::new(probe)
            .input("clicks", "default", &["user", "ts"])
            .output("default", spec.output_fields())
            .output("late", spec.late_fields())
            .topology_config(TopologyConfig { batch_size: 4, channel_capacity: 2, ..TopologyConfig::default() })
            .prepare()
            .await
            .unwrap();
        let ids = h.execute_batch((0..1_000u64).map(|i| values![format!("u{i}"), 100i64])).await.unwrap();
        h.watermark(Watermark(1_000)).await.unwrap();
        assert_eq!(
            (h.bolt().unwrap().ready.clone(), h.emitted().len(), h.acked().len()),
            (vec![0], 1_000, ids.len()),
            "(full batches waiting after the firing, aggregates emitted, inputs acked)"
        );
    }
}
