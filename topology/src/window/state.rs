//! The bookkeeping of windows, free of engine types (unit- and property-tested on its own).
//!
//! A *pane* is one (key, window): its accumulator, how many inputs it folded, and the inputs it
//! still holds. Every pane is either *pending* (not fired yet, or updated by an allowed late
//! input since it fired) or *retained* (fired, kept until the watermark passes its end plus the
//! allowed lateness). A held input is shared ([`Arc`]) by every pane it was added to (several
//! sliding windows); each pane gives its reference away when it fires, and the firing that gives
//! away the last one acks (or fails) the input.
//!
//! # Panic safety
//!
//! User code runs in [`WindowState::add`] (`init`, `fold`, `merge`) and in the `eval` closure of
//! [`WindowState::advance`], [`WindowState::flush`] and [`WindowState::fire_updated`]. A panic in
//! any of them leaves the bookkeeping consistent (counters never underflow; a pane, its count and
//! its held inputs agree): `add` changes the structure only after every fold and merge of the
//! input succeeded (a sliding input's accumulator is made for each of its windows before any pane
//! counts or holds it), and the firing calls evaluate every due pane before changing anything,
//! so a panic there fires nothing and leaves the state as it was. Accumulator *contents* are as
//! the panicking code left them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::bounds::{Kind, Window, WindowKind};
#[cfg(doc)]
use crate::output::AckHandle;
use crate::value::{Value, Values};

/// A key: the values of the key fields. Hashes with [`Value::hash_into`]; floats compare by bit
/// pattern, consistently with their hash.
#[derive(Clone, Debug)]
struct Key(Values);

impl Hash for Key {
    fn hash<S: Hasher>(&self, h: &mut S) {
        h.write_usize(self.0.len());
        for v in self.0.iter() {
            v.hash_into(h);
        }
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.0.len() == other.0.len()
            && self.0.iter().zip(other.0.iter()).all(|(a, b)| match (a, b) {
                (Value::Float(x), Value::Float(y)) => x.to_bits() == y.to_bits(),
                _ => a == b,
            })
    }
}

impl Eq for Key {}

/// A held input, shared by the panes it was added to. Whoever holds the last reference when the
/// panes let go of it acks it, or fails it if [`HeldInput::fail`] was called on any reference.
#[derive(Debug)]
pub struct HeldInput<H> {
    handle: H,
    /// Panes of the state still holding a reference.
    panes: AtomicUsize,
    failed: AtomicBool,
}

impl<H> HeldInput<H> {
    fn new(handle: H) -> Arc<Self> {
        Arc::new(HeldInput { handle, panes: AtomicUsize::new(0), failed: AtomicBool::new(false) })
    }

    /// The input handle (to anchor emits to).
    pub fn handle(&self) -> &H {
        &self.handle
    }

    /// Marks the input failed: released, it is failed rather than acked.
    pub fn fail(&self) {
        self.failed.store(true, Ordering::Relaxed);
    }

    /// Whether [`HeldInput::fail`] was called.
    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Lets go of one reference. For the last one, returns the handle and whether it failed:
    /// ack it, or fail it.
    pub fn release(this: Arc<Self>) -> Option<(H, bool)> {
        Arc::into_inner(this).map(|h| (h.handle, h.failed.into_inner()))
    }
}

/// One (key, window): its accumulator and its held inputs.
#[derive(Debug)]
struct Pane<Acc, H> {
    window: Window,
    key: Values,
    acc: Acc,
    /// Inputs folded in, over the pane's life.
    count: u64,
    /// Inputs held, not yet given away by a firing.
    inputs: Vec<Arc<HeldInput<H>>>,
    /// Fired at least once.
    fired: bool,
}

/// Where [`WindowState::add`] put an input.
#[derive(Debug, PartialEq)]
pub enum Placement<H> {
    /// Folded in. The window is the input's last window: its one tumbling window, the latest of
    /// its sliding windows, or its session (after merging).
    Open(Window),
    /// Every window of the input is past its allowed lateness: nothing was recorded; the key and
    /// input are handed back.
    Late {
        /// The input's last (expired) window; for sessions, the session the input alone would
        /// open, `[ts, ts + gap)`.
        window: Window,
        /// The key given to `add`.
        key: Values,
        /// The input handle given to `add`.
        input: Option<H>,
    },
}

/// One (key, window) that fired.
#[derive(Debug)]
pub struct Fired<T, H> {
    /// The window.
    pub window: Window,
    /// The key values.
    pub key: Values,
    /// What `eval` made of the accumulator.
    pub output: T,
    /// How many inputs the pane folded in, over its life (also when none were held).
    pub count: u64,
    /// The held inputs the pane gives away, in arrival order (a merged session: its parts in
    /// order of start, then the input that bridged them): every input added since it last
    /// fired. Anchor the output to them, then [`HeldInput::release`] each.
    pub inputs: Vec<Arc<HeldInput<H>>>,
    /// The pane fired before: this is a refinement for late inputs within the allowed lateness.
    pub refinement: bool,
}

/// The windows of one task, keyed; generic over the accumulator and the held input handle `H`
/// (an [`AckHandle`] in the bolt). No engine types: this is the logic the bolt wraps.
#[derive(Debug)]
pub struct WindowState<Acc, H> {
    kind: WindowKind,
    lateness: u64,
    watermark: Option<u64>,
    panes: HashMap<u64, Pane<Acc, H>>,
    /// Panes to fire once the watermark reaches their end, by (end, start, seq): by window end,
    /// then by key arrival within the window.
    pending: BTreeSet<(i128, i128, u64)>,
    /// Fired panes kept for the allowed lateness, by (end + lateness, seq).
    retained: BTreeSet<(i128, u64)>,
    /// Tumbling and sliding: the pane of (window start, key).
    aligned: HashMap<(i128, Key), u64>,
    /// Sessions: the panes of a key by start.
    sessions: HashMap<Key, BTreeMap<i128, u64>>,
    next_seq: u64,
    held: usize,
}

impl<Acc, H> WindowState<Acc, H> {
    /// No window, no watermark yet, no allowed lateness.
    pub fn new(kind: WindowKind) -> Self {
        WindowState {
            kind,
            lateness: 0,
            watermark: None,
            panes: HashMap::new(),
            pending: BTreeSet::new(),
            retained: BTreeSet::new(),
            aligned: HashMap::new(),
            sessions: HashMap::new(),
            next_seq: 0,
            held: 0,
        }
    }

    /// Keeps fired windows for `ms` of event time past their end: inputs arriving meanwhile are
    /// folded in and the window fires again.
    pub fn with_allowed_lateness(mut self, ms: u64) -> Self {
        self.lateness = ms;
        self
    }

    /// How event times map to windows.
    pub fn kind(&self) -> WindowKind {
        self.kind
    }

    /// The allowed lateness in ms.
    pub fn allowed_lateness(&self) -> u64 {
        self.lateness
    }

    /// The highest watermark seen (`None` before the first).
    pub fn watermark(&self) -> Option<u64> {
        self.watermark
    }

    /// Whether the watermark already closed `window` (it fired, or would have had it inputs).
    pub fn is_closed(&self, window: Window) -> bool {
        self.watermark.is_some_and(|wm| window.closed_by(wm))
    }

    fn is_expired(&self, window: Window) -> bool {
        self.watermark.is_some_and(|wm| window.expired_by(wm, self.lateness))
    }

    /// Number of (key, window) panes waiting to fire.
    pub fn open_panes(&self) -> usize {
        self.pending.len()
    }

    /// Number of panes kept: waiting to fire, or fired and kept for the allowed lateness.
    pub fn panes(&self) -> usize {
        self.panes.len()
    }

    /// Number of windows with a pane waiting to fire.
    pub fn open_windows(&self) -> usize {
        self.windows().count()
    }

    /// The windows with a pane waiting to fire, by end.
    pub fn windows(&self) -> impl Iterator<Item = Window> + '_ {
        let mut last = None;
        self.pending.iter().filter_map(move |&(end, start, _)| {
            let w = (end, start);
            if last == Some(w) {
                return None;
            }
            last = Some(w);
            Some(Window::from_bounds(start, end))
        })
    }

    /// Number of held input handles (each counted once, however many windows hold it).
    pub fn held(&self) -> usize {
        self.held
    }

    /// Folds an input with event time `ts` into the panes of (`key`, each of its windows that is
    /// not past its allowed lateness), creating panes with `init`, and holds `input` until the
    /// last of them fires. An input none of whose windows is open is handed back untouched
    /// ([`Placement::Late`]).
    ///
    /// `fold` folds the input into an accumulator; it must leave it as it was when it fails. If
    /// it fails, nothing is recorded and `input` is dropped. Tumbling windows fold into the pane
    /// in place; sliding windows fold into a fresh accumulator once and `merge` it into each
    /// window's pane; a session input folds into the session it joins (or a new one) and
    /// `merge`s the sessions it bridges into one.
    pub fn add<E>(
        &mut self,
        key: Values,
        ts: i64,
        input: Option<H>,
        init: impl Fn() -> Acc,
        fold: impl FnOnce(&mut Acc) -> Result<(), E>,
        merge: impl Fn(&mut Acc, &Acc),
    ) -> Result<Placement<H>, E> {
        match self.kind.kind() {
            Kind::Tumbling { size } => {
                let window = Window::containing(ts, size);
                if self.is_expired(window) {
                    return Ok(Placement::Late { window, key, input });
                }
                self.add_tumbling(key, window, input, init, fold)?;
                Ok(Placement::Open(window))
            }
            Kind::Sliding { size, slide } => {
                let mut last = None;
                let mut open = Vec::new();
                for w in Window::sliding(ts, size, slide) {
                    last = Some(w);
                    if !self.is_expired(w) {
                        open.push(w);
                    }
                }
                let last = last.unwrap_or_else(|| Window::containing(ts, size)); // n >= 1 windows
                if open.is_empty() {
                    return Ok(Placement::Late { window: last, key, input });
                }
                let mut delta = init();
                fold(&mut delta)?;
                let key = Key(key);
                // Every window's accumulator is made before any pane changes, so that a panic in
                // `init` or `merge` records nothing (no pane holds or counts the input the engine
                // fails): new panes first, each from `init` and the input's accumulator, then the
                // merges into the panes there are (a panic there leaves the ones merged before it
                // as the panic left them, like a panicking fold).
                let mut targets = Vec::with_capacity(open.len());
                for w in open {
                    let id = (w.start(), key.clone());
                    match self.aligned.get(&id).copied().filter(|s| self.panes.contains_key(s)) {
                        Some(seq) => targets.push((id, Target::Pane(seq))),
                        None => {
                            let mut acc = init();
                            merge(&mut acc, &delta);
                            targets.push((id, Target::New(w, acc)));
                        }
                    }
                }
                for (_, target) in &targets {
                    if let Target::Pane(seq) = target {
                        if let Some(pane) = self.panes.get_mut(seq) {
                            merge(&mut pane.acc, &delta);
                        }
                    }
                }
                // no user code from here
                let input = input.map(HeldInput::new);
                for (id, target) in targets {
                    self.commit_aligned(id, target, input.as_ref());
                }
                Ok(Placement::Open(last))
            }
            Kind::Session { gap } => self.add_session(key, Window::session(ts, gap), input, init, fold, merge),
        }
    }

    fn add_tumbling<E>(
        &mut self,
        key: Values,
        window: Window,
        input: Option<H>,
        init: impl Fn() -> Acc,
        fold: impl FnOnce(&mut Acc) -> Result<(), E>,
    ) -> Result<(), E> {
        let id = (window.start(), Key(key));
        if let Some(&seq) = self.aligned.get(&id) {
            if let Some(pane) = self.panes.get_mut(&seq) {
                fold(&mut pane.acc)?;
                pane.count += 1;
                if let Some(h) = input {
                    Self::hold(&mut self.held, pane, HeldInput::new(h));
                }
                self.touch(seq);
                return Ok(());
            }
        }
        // a new pane: user code runs before anything is recorded
        let mut acc = init();
        fold(&mut acc)?;
        let seq = self.insert(window, id.1.0.clone(), acc);
        self.aligned.insert(id, seq);
        if let Some(pane) = self.panes.get_mut(&seq) {
            pane.count += 1;
            if let Some(h) = input {
                Self::hold(&mut self.held, pane, HeldInput::new(h));
            }
        }
        Ok(())
    }

    /// Records a sliding input in one of its windows, whose accumulator is made already.
    fn commit_aligned(&mut self, id: (i128, Key), target: Target<Acc>, input: Option<&Arc<HeldInput<H>>>) {
        let seq = match target {
            Target::Pane(seq) => seq,
            Target::New(window, acc) => {
                let seq = self.insert(window, id.1.0.clone(), acc);
                self.aligned.insert(id, seq);
                seq
            }
        };
        // each pane is consistent on its own: its accumulator, count and inputs agree
        if let Some(pane) = self.panes.get_mut(&seq) {
            pane.count += 1;
            if let Some(h) = input {
                Self::hold(&mut self.held, pane, h.clone());
            }
        }
        self.touch(seq);
    }

    fn add_session<E>(
        &mut self,
        key: Values,
        proto: Window,
        input: Option<H>,
        init: impl Fn() -> Acc,
        fold: impl FnOnce(&mut Acc) -> Result<(), E>,
        merge: impl Fn(&mut Acc, &Acc),
    ) -> Result<Placement<H>, E> {
        let k = Key(key);
        // the key's sessions the input's own session overlaps, by start: sessions of one key
        // are disjoint, so walk down from the last starting before its end
        let mut bridged: Vec<u64> = Vec::new();
        if let Some(by_start) = self.sessions.get(&k) {
            for (_, &seq) in by_start.range(..proto.end()).rev() {
                match self.panes.get(&seq) {
                    Some(p) if p.window.overlaps(&proto) => bridged.push(seq),
                    Some(_) => break,
                    None => {}
                }
            }
        }
        bridged.reverse();
        let Some((&first, others)) = bridged.split_first() else {
            if self.is_expired(proto) {
                return Ok(Placement::Late { window: proto, key: k.0, input });
            }
            let mut acc = init();
            fold(&mut acc)?;
            let seq = self.insert(proto, k.0.clone(), acc);
            self.sessions.entry(k).or_default().insert(proto.start(), seq);
            if let Some(pane) = self.panes.get_mut(&seq) {
                pane.count += 1;
                if let Some(h) = input {
                    Self::hold(&mut self.held, pane, HeldInput::new(h));
                }
            }
            return Ok(Placement::Open(proto));
        };
        // the survivor's bounds as indexed, before it grows
        let old = match self.panes.get_mut(&first) {
            Some(pane) => {
                fold(&mut pane.acc)?;
                pane.window
            }
            None => return Ok(Placement::Late { window: proto, key: k.0, input }), // unreachable
        };
        if !others.is_empty() {
            // merge the bridged sessions into the first while all are out of the map; a panic
            // in `merge` puts them back as they were
            let mut out = Restore { panes: &mut self.panes, taken: Vec::new() };
            for &seq in std::iter::once(&first).chain(others) {
                if let Some(p) = out.panes.remove(&seq) {
                    out.taken.push((seq, p));
                }
            }
            if let Some(((_, head), rest)) = out.taken.split_first_mut() {
                for (_, p) in rest.iter() {
                    merge(&mut head.acc, &p.acc);
                }
            }
            let mut taken = std::mem::take(&mut out.taken).into_iter();
            drop(out);
            let Some((seq, mut head)) = taken.next() else {
                return Ok(Placement::Late { window: proto, key: k.0, input });
            };
            for (other, p) in taken {
                self.unindex(other, &p);
                head.window = head.window.union(p.window);
                head.count += p.count;
                head.inputs.extend(p.inputs);
                head.fired |= p.fired;
            }
            self.panes.insert(seq, head);
        }
        // the survivor grows to hold the input (and what it bridged): re-index it
        let Some(pane) = self.panes.get_mut(&first) else {
            return Ok(Placement::Late { window: proto, key: k.0, input });
        };
        pane.window = pane.window.union(proto);
        pane.count += 1;
        if let Some(h) = input {
            Self::hold(&mut self.held, pane, HeldInput::new(h));
        }
        let window = pane.window;
        if let Some(by_start) = self.sessions.get_mut(&k) {
            by_start.remove(&old.start());
            by_start.insert(window.start(), first);
        }
        self.pending.remove(&(old.end(), old.start(), first));
        self.retained.remove(&(old.end() + i128::from(self.lateness), first));
        self.pending.insert((window.end(), window.start(), first));
        Ok(Placement::Open(window))
    }

    fn insert(&mut self, window: Window, key: Values, acc: Acc) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.panes.insert(seq, Pane { window, key, acc, count: 0, inputs: Vec::new(), fired: false });
        self.pending.insert((window.end(), window.start(), seq));
        seq
    }

    fn hold(held: &mut usize, pane: &mut Pane<Acc, H>, input: Arc<HeldInput<H>>) {
        if input.panes.fetch_add(1, Ordering::Relaxed) == 0 {
            *held += 1;
        }
        pane.inputs.push(input);
    }

    /// A pane that got an input: if it fired and was kept, it fires again.
    fn touch(&mut self, seq: u64) {
        if let Some(p) = self.panes.get(&seq) {
            if p.fired && self.retained.remove(&(p.window.end() + i128::from(self.lateness), seq)) {
                self.pending.insert((p.window.end(), p.window.start(), seq));
            }
        }
    }

    /// Removes a pane's index entries (pending, retained, the key's lookup).
    fn unindex(&mut self, seq: u64, p: &Pane<Acc, H>) {
        let w = p.window;
        self.pending.remove(&(w.end(), w.start(), seq));
        self.retained.remove(&(w.end() + i128::from(self.lateness), seq));
        let k = Key(p.key.clone());
        match self.kind.kind() {
            Kind::Session { .. } => {
                if let Some(by_start) = self.sessions.get_mut(&k) {
                    if by_start.get(&w.start()) == Some(&seq) {
                        by_start.remove(&w.start());
                    }
                    if by_start.is_empty() {
                        self.sessions.remove(&k);
                    }
                }
            }
            _ => {
                self.aligned.remove(&(w.start(), k));
            }
        }
    }

    /// Advances the watermark to `wm` and fires every pane it closes (`end <= wm`) that has not
    /// fired or was updated since, by window end, then by key arrival within the window; then
    /// drops the fired panes past their allowed lateness. `eval` makes each pane's output from
    /// its window, key and accumulator. A watermark not above the current one is ignored and
    /// fires nothing.
    pub fn advance<T>(&mut self, wm: u64, eval: impl FnMut(&Window, &Values, &Acc) -> T) -> Vec<Fired<T, H>> {
        if self.watermark.is_some_and(|w| wm <= w) {
            return Vec::new();
        }
        self.fire(wm, eval)
    }

    /// Fires every pane (the stream ended), drops them all and closes all windows for the future.
    pub fn flush<T>(&mut self, eval: impl FnMut(&Window, &Values, &Acc) -> T) -> Vec<Fired<T, H>> {
        self.fire(u64::MAX, eval)
    }

    /// Fires the closed panes that allowed late inputs updated since the last firing
    /// (refinements), without moving the watermark. [`WindowState::add`] makes them; fire them
    /// right after it.
    pub fn fire_updated<T>(&mut self, eval: impl FnMut(&Window, &Values, &Acc) -> T) -> Vec<Fired<T, H>> {
        match self.watermark {
            Some(wm) if self.pending.first().is_some_and(|&(end, ..)| closes(end, wm)) => self.fire(wm, eval),
            _ => Vec::new(),
        }
    }

    fn fire<T>(&mut self, wm: u64, mut eval: impl FnMut(&Window, &Values, &Acc) -> T) -> Vec<Fired<T, H>> {
        // evaluate first, change nothing until every output is made: a panic leaves all as it was
        let due: Vec<(i128, i128, u64)> =
            self.pending.iter().take_while(|&&(end, ..)| closes(end, wm)).copied().collect();
        let mut outputs = Vec::with_capacity(due.len());
        for &(_, _, seq) in &due {
            if let Some(p) = self.panes.get(&seq) {
                outputs.push((seq, eval(&p.window, &p.key, &p.acc)));
            }
        }
        self.watermark = Some(wm);
        for entry in &due {
            self.pending.remove(entry);
        }
        let lateness = i128::from(self.lateness);
        let mut fired = Vec::with_capacity(outputs.len());
        for (seq, output) in outputs {
            let Some(p) = self.panes.get_mut(&seq) else { continue };
            let refinement = std::mem::replace(&mut p.fired, true);
            let inputs = std::mem::take(&mut p.inputs);
            for h in &inputs {
                if h.panes.fetch_sub(1, Ordering::Relaxed) == 1 {
                    self.held -= 1;
                }
            }
            let (window, count) = (p.window, p.count);
            let key = if window.expired_by(wm, self.lateness) {
                match self.panes.remove(&seq) {
                    Some(p) => {
                        self.unindex(seq, &p);
                        p.key
                    }
                    None => continue,
                }
            } else {
                self.retained.insert((window.end() + lateness, seq));
                p.key.clone()
            };
            fired.push(Fired { window, key, output, count, inputs, refinement });
        }
        while let Some(&(expiry, seq)) = self.retained.first() {
            if !closes(expiry, wm) {
                break;
            }
            self.retained.pop_first();
            if let Some(p) = self.panes.remove(&seq) {
                self.unindex(seq, &p);
            }
        }
        fired
    }
}

/// Where a sliding input goes in one of its windows: a pane there is (merged into already), or
/// a new pane with its accumulator.
enum Target<Acc> {
    Pane(u64),
    New(Window, Acc),
}

/// Whether watermark `wm` has reached `bound` (and the +infinity watermark reaches every bound).
fn closes(bound: i128, wm: u64) -> bool {
    wm == u64::MAX || bound <= i128::from(wm)
}

/// Panes taken out of the map for a merge; put back if the merge panics.
struct Restore<'a, Acc, H> {
    panes: &'a mut HashMap<u64, Pane<Acc, H>>,
    taken: Vec<(u64, Pane<Acc, H>)>,
}

impl<Acc, H> Drop for Restore<'_, Acc, H> {
    fn drop(&mut self) {
        for (seq, p) in self.taken.drain(..) {
            self.panes.insert(seq, p);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU64;
    use std::panic::{AssertUnwindSafe, catch_unwind};

    use super::*;
    use crate::values;

    fn incr(n: &mut u64) -> Result<(), ()> {
        *n += 1;
        Ok(())
    }

    fn size(ms: u64) -> NonZeroU64 {
        NonZeroU64::new(ms).unwrap()
    }

    fn sum(a: &mut u64, b: &u64) {
        *a += b;
    }

    fn tumbling(ms: u64) -> WindowKind {
        WindowKind::tumbling(size(ms))
    }

    fn ids<H: Clone>(inputs: &[Arc<HeldInput<H>>]) -> Vec<H> {
        inputs.iter().map(|h| h.handle().clone()).collect()
    }

    /// Fires with the accumulator as the output.
    trait Fire<H> {
        fn adv(&mut self, wm: u64) -> Vec<Fired<u64, H>>;
        fn fl(&mut self) -> Vec<Fired<u64, H>>;
    }

    impl<H> Fire<H> for WindowState<u64, H> {
        fn adv(&mut self, wm: u64) -> Vec<Fired<u64, H>> {
            self.advance(wm, |_, _, a| *a)
        }

        fn fl(&mut self) -> Vec<Fired<u64, H>> {
            self.flush(|_, _, a| *a)
        }
    }

    fn add(state: &mut WindowState<u64, u32>, key: &str, ts: i64, id: u32) -> Placement<u32> {
        state.add(values![key], ts, Some(id), || 0, incr, sum).unwrap()
    }

    #[test]
    fn state_fires_only_closed_windows_in_order() {
        let mut s = WindowState::new(tumbling(10));
        assert_eq!(add(&mut s, "b", 15, 0), Placement::Open(Window::containing(15, size(10))));
        add(&mut s, "a", 3, 1);
        add(&mut s, "b", 4, 2);
        add(&mut s, "a", 9, 3);
        add(&mut s, "a", 12, 4);
        assert_eq!((s.open_windows(), s.open_panes(), s.held()), (2, 4, 5));
        assert!(s.adv(9).is_empty(), "no window ends at or below 9");
        let fired = s.adv(10);
        let got: Vec<_> =
            fired.iter().map(|f| (f.key[0].to_string(), f.window.start(), f.output, ids(&f.inputs))).collect();
        assert_eq!(got, [("a".to_owned(), 0, 2, vec![1, 3]), ("b".to_owned(), 0, 1, vec![2])], "keys in arrival order");
        assert_eq!((s.open_windows(), s.open_panes(), s.held()), (1, 2, 2));
        // backwards or equal watermarks fire nothing
        assert!(s.adv(5).is_empty());
        assert!(s.adv(10).is_empty());
        assert_eq!(s.watermark(), Some(10));
        let fired = s.adv(25);
        assert_eq!(fired.iter().map(|f| (f.window.end(), f.count)).collect::<Vec<_>>(), [(20, 1), (20, 1)]);
        assert_eq!((s.open_windows(), s.open_panes(), s.held()), (0, 0, 0));
    }

    #[test]
    fn late_is_relative_to_closed_windows_not_the_watermark() {
        let mut s = WindowState::new(tumbling(10));
        // before any watermark, nothing is late
        assert!(matches!(add(&mut s, "a", -100, 0), Placement::Open(_)));
        s.adv(15);
        // 12 < watermark 15, but its window [10, 20) is still open: counted
        assert!(matches!(add(&mut s, "a", 12, 1), Placement::Open(_)));
        match add(&mut s, "a", 9, 2) {
            Placement::Late { window, key, input } => {
                assert_eq!((window.start(), window.end()), (0, 10));
                assert_eq!(key, values!["a"]);
                assert_eq!(input, Some(2));
            }
            p => panic!("expected late, got {p:?}"),
        }
        assert_eq!(s.held(), 1);
        let fired = s.fl();
        assert_eq!(fired.len(), 1);
        assert_eq!(ids(&fired[0].inputs), vec![1]);
        assert!(matches!(add(&mut s, "a", i64::MAX, 3), Placement::Late { .. }), "after flush everything is late");
    }

    #[test]
    fn failed_fold_records_nothing() {
        let mut s: WindowState<u64, u32> = WindowState::new(tumbling(10));
        let r = s.add(values!["a"], 1, Some(0), || 0, |_| Err("bad"), sum);
        assert_eq!(r, Err("bad"));
        assert_eq!((s.open_windows(), s.open_panes(), s.held()), (0, 0, 0));
        add(&mut s, "a", 1, 1);
        let r = s.add(values!["b"], 2, Some(2), || 0, |_| Err("bad"), sum);
        assert_eq!(r, Err("bad"));
        let r = s.add(values!["a"], 3, Some(3), || 0, |_| Err("bad"), sum);
        assert_eq!(r, Err("bad"));
        assert_eq!((s.open_windows(), s.open_panes(), s.held()), (1, 1, 1));
        add(&mut s, "b", 4, 4);
        let fired = s.fl();
        assert_eq!(fired.iter().map(|f| (f.output, ids(&f.inputs))).collect::<Vec<_>>(), [(1, vec![1]), (1, vec![4])]);
    }

    #[test]
    fn keys_compare_by_value_floats_by_bits() {
        let mut s: WindowState<u64, ()> = WindowState::new(tumbling(10));
        let mut put = |k: Values| s.add(k, 0, None, || 0, incr, sum).unwrap();
        put(values!["x", 1i64]);
        put(values!["x", 1i64]);
        put(values!["x", 1u64]); // the same integer as another type: the same key
        put(values!["x", 1.0f64]); // a float is another key
        put(values![f64::NAN]);
        put(values![f64::NAN]);
        put(Values::new());
        let fired = s.fl();
        assert_eq!(fired.iter().map(|f| f.output).collect::<Vec<_>>(), [3, 1, 2, 1]);
        assert!(fired.iter().all(|f| f.inputs.is_empty()));
    }

    fn count_of(fired: &[Fired<u64, u32>]) -> Vec<(String, i128, u64, Vec<u32>)> {
        fired.iter().map(|f| (f.key[0].to_string(), f.window.start(), f.output, ids(&f.inputs))).collect()
    }

    fn assert_consistent<H>(s: &WindowState<u64, H>) {
        let held: std::collections::HashSet<*const HeldInput<H>> =
            s.panes.values().flat_map(|p| p.inputs.iter().map(Arc::as_ptr)).collect();
        assert_eq!(s.held(), held.len(), "held counts distinct held inputs");
        for p in s.panes.values() {
            assert!(p.inputs.len() as u64 <= p.count, "a pane holds no more inputs than it counted");
        }
        assert_eq!(s.pending.len() + s.retained.len(), s.panes.len(), "each pane pending or retained");
    }

    /// Old code: a panicking `init` left the key indexed to a pane that was never pushed (the
    /// next key's input was then counted under it); a panicking fold on a new pane left an
    /// uncounted pane, and the pane counter underflowed when it fired.
    #[test]
    fn a_panic_in_init_or_fold_records_nothing() {
        let mut s: WindowState<u64, u32> = WindowState::new(tumbling(10));
        let r = catch_unwind(AssertUnwindSafe(|| s.add(values!["a"], 1, Some(0), || panic!("init"), incr, sum)));
        assert!(r.is_err());
        assert_eq!((s.open_windows(), s.open_panes(), s.held()), (0, 0, 0));
        let fold_panics = |_: &mut u64| -> Result<(), ()> { panic!("fold") };
        let r = catch_unwind(AssertUnwindSafe(|| s.add(values!["c"], 2, Some(1), || 0, fold_panics, sum)));
        assert!(r.is_err());
        assert_eq!((s.open_windows(), s.open_panes(), s.held()), (0, 0, 0));
        add(&mut s, "b", 2, 2);
        add(&mut s, "a", 3, 3);
        // on an existing pane: the count and held inputs do not move
        let r = catch_unwind(AssertUnwindSafe(|| s.add(values!["a"], 4, Some(4), || 0, fold_panics, sum)));
        assert!(r.is_err());
        assert_eq!((s.open_panes(), s.held()), (2, 2));
        assert_consistent(&s);
        let fired = s.fl();
        assert_eq!(count_of(&fired), [("b".to_owned(), 0, 1, vec![2]), ("a".to_owned(), 0, 1, vec![3])]);
        assert_eq!((s.open_panes(), s.held(), s.panes()), (0, 0, 0));
    }

    /// A panic while evaluating the fired panes fires nothing and leaves the watermark where it
    /// was: the next advance fires them all.
    #[test]
    fn a_panic_in_eval_fires_nothing_and_loses_nothing() {
        let mut s: WindowState<u64, u32> = WindowState::new(tumbling(10));
        add(&mut s, "a", 1, 0);
        add(&mut s, "b", 2, 1);
        add(&mut s, "a", 15, 2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            s.advance(20, |_, k, a| if k[0] == crate::Value::from("b") { panic!("emit") } else { *a })
        }));
        assert!(r.is_err());
        assert_eq!(s.watermark(), None);
        assert_eq!((s.open_panes(), s.held()), (3, 3));
        assert_consistent(&s);
        let fired = s.adv(20);
        assert_eq!(
            count_of(&fired),
            [("a".to_owned(), 0, 1, vec![0]), ("b".to_owned(), 0, 1, vec![1]), ("a".to_owned(), 10, 1, vec![2])]
        );
    }

    /// A panic in `merge` while sessions are merged puts them back as they were.
    #[test]
    fn a_panic_in_merge_leaves_the_sessions_apart() {
        let mut s: WindowState<u64, u32> = WindowState::new(WindowKind::session(size(10)));
        s.add(values!["a"], 0, Some(0), || 0, incr, sum).unwrap();
        s.add(values!["a"], 15, Some(1), || 0, incr, sum).unwrap();
        assert_eq!(s.open_panes(), 2);
        // 8 bridges [0, 10) and [15, 25)
        let r = catch_unwind(AssertUnwindSafe(|| s.add(values!["a"], 8, Some(2), || 0, incr, |_, _| panic!("merge"))));
        assert!(r.is_err());
        assert_eq!((s.open_panes(), s.held()), (2, 2));
        assert_consistent(&s);
        let fired = s.fl();
        let got: Vec<_> = fired.iter().map(|f| (f.window.start(), f.window.end(), f.count, ids(&f.inputs))).collect();
        assert_eq!(got, [(0, 10, 1, vec![0]), (15, 25, 1, vec![1])]);
    }

    /// Issue 33, point 14: a panic in `init` or `merge` while a sliding input is merged into its
    /// windows records nothing: before, the windows merged before the panic kept the input (which
    /// the engine fails), counted it, and their later firing anchored to a failed input.
    #[test]
    fn a_panic_in_sliding_init_or_merge_records_nothing() {
        let kind = WindowKind::sliding(size(20), size(10)).unwrap();
        // 15 falls in [0, 20), which 5 opened, and in [10, 30), a new pane
        type Init = Box<dyn Fn() -> u64>;
        type Merge = Box<dyn Fn(&mut u64, &u64)>;
        let panics_on_the_new_pane: [(&str, Init, Merge); 2] = [
            ("merge", Box::new(|| 0), Box::new(|a: &mut u64, b: &u64| if *a == 0 { panic!("merge") } else { *a += b })),
            (
                "init",
                {
                    let calls = std::cell::Cell::new(0);
                    // the first call makes the input's own accumulator; the next, a new pane's
                    Box::new(move || {
                        calls.set(calls.get() + 1);
                        assert!(calls.get() < 2, "init");
                        0
                    })
                },
                Box::new(sum),
            ),
        ];
        for (what, init, merge) in panics_on_the_new_pane {
            let mut s: WindowState<u64, u32> = WindowState::new(kind);
            s.add(values!["a"], 5, Some(0), || 0, incr, sum).unwrap();
            let r = catch_unwind(AssertUnwindSafe(|| s.add(values!["a"], 15, Some(1), &init, incr, &merge)));
            assert!(r.is_err(), "{what} panicked");
            assert_eq!((s.open_panes(), s.held()), (2, 1), "{what}: (panes, held inputs)");
            assert_consistent(&s);
            let fired = s.fl();
            assert_eq!(
                count_of(&fired),
                [("a".to_owned(), -10, 1, vec![0]), ("a".to_owned(), 0, 1, vec![0])],
                "{what}"
            );
        }
    }

    #[test]
    fn sliding_counts_each_input_in_every_window_and_acks_it_after_the_last() {
        let kind = WindowKind::sliding(size(10), size(5)).unwrap();
        let mut s: WindowState<u64, u32> = WindowState::new(kind);
        // 7 is in [0, 10) and [5, 15); 12 in [5, 15) and [10, 20)
        assert_eq!(
            add(&mut s, "a", 7, 0),
            Placement::Open(Window::containing(7, size(5)).union(Window::session(5, size(10))))
        );
        add(&mut s, "a", 12, 1);
        assert_eq!((s.open_windows(), s.open_panes(), s.held()), (3, 3, 2));
        let fired = s.adv(10);
        assert_eq!(count_of(&fired), [("a".to_owned(), 0, 1, vec![0])]);
        assert!(
            fired.into_iter().flat_map(|f| f.inputs).all(|h| HeldInput::release(h).is_none()),
            "7 is still in [5, 15)"
        );
        assert_eq!(s.held(), 2);
        let fired = s.adv(15);
        assert_eq!(count_of(&fired), [("a".to_owned(), 5, 2, vec![0, 1])]);
        let released: Vec<_> = fired.into_iter().flat_map(|f| f.inputs).filter_map(HeldInput::release).collect();
        assert_eq!(released, [(0, false)], "7's last window fired: release it, not 12");
        assert_eq!(s.held(), 1);
        // 3 is late for [0, 10) (fired) but counted in [-5, 5)? no: [-5, 5) ended at 5 <= 15
        assert!(matches!(add(&mut s, "a", 3, 2), Placement::Late { window, .. } if window.end() == 10));
        // 11 is late for [5, 15) but still counted in [10, 20) (as Flink does)
        assert!(matches!(add(&mut s, "a", 11, 3), Placement::Open(w) if w.end() == 20));
        let fired = s.fl();
        assert_eq!(count_of(&fired), [("a".to_owned(), 10, 2, vec![1, 3])]);
        assert_eq!((s.held(), s.panes()), (0, 0));
    }

    #[test]
    fn failed_marks_fail_the_input_when_its_last_window_fires() {
        let kind = WindowKind::sliding(size(10), size(5)).unwrap();
        let mut s: WindowState<u64, u32> = WindowState::new(kind);
        add(&mut s, "a", 7, 0);
        let fired = s.adv(10);
        for f in fired {
            for h in f.inputs {
                h.fail(); // the emit of [0, 10) failed
                assert!(HeldInput::release(h).is_none());
            }
        }
        let fired = s.fl();
        let released: Vec<_> = fired.into_iter().flat_map(|f| f.inputs).filter_map(HeldInput::release).collect();
        assert_eq!(released, [(0, true)], "failed once its last window fired");
    }

    #[test]
    fn sessions_grow_merge_and_fire_at_last_plus_gap() {
        let mut s: WindowState<u64, u32> = WindowState::new(WindowKind::session(size(10)));
        add(&mut s, "a", 0, 0);
        add(&mut s, "a", 25, 1);
        add(&mut s, "b", 5, 2);
        add(&mut s, "a", 9, 3); // joins [0, 10): [0, 19)
        assert_eq!(s.open_panes(), 3);
        let fired = s.adv(18);
        let got: Vec<_> =
            fired.iter().map(|f| (f.key[0].to_string(), f.window.start(), f.window.end(), f.output)).collect();
        assert_eq!(got, [("b".to_owned(), 5, 15, 1)], "[0, 19) needs watermark 19");
        add(&mut s, "a", 17, 4); // bridges [0, 19) and [25, 35): [0, 35)
        assert_eq!((s.open_panes(), s.held()), (1, 4));
        assert!(s.adv(34).is_empty());
        let fired = s.adv(35);
        let got: Vec<_> = fired.iter().map(|f| (f.window.start(), f.window.end(), f.output, ids(&f.inputs))).collect();
        assert_eq!(got, [(0, 35, 4, vec![0, 3, 1, 4])], "merged sessions in order, then the bridging input");
        // 30 + 10 <= 40 and no open session: late, reported as [30, 40)
        s.adv(40);
        assert!(
            matches!(add(&mut s, "a", 30, 5), Placement::Late { window, .. } if (window.start(), window.end()) == (30, 40))
        );
        assert!(matches!(add(&mut s, "a", 31, 6), Placement::Open(_)));
        assert_consistent(&s);
    }

    #[test]
    fn allowed_lateness_keeps_fired_windows_and_refines_them() {
        let mut s: WindowState<u64, u32> = WindowState::new(tumbling(10)).with_allowed_lateness(5);
        add(&mut s, "a", 1, 0);
        let fired = s.adv(12);
        assert_eq!(count_of(&fired), [("a".to_owned(), 0, 1, vec![0])]);
        assert!(!fired[0].refinement);
        assert_eq!((s.open_panes(), s.panes(), s.held()), (0, 1, 0), "kept, inputs given away");
        assert!(s.fire_updated(|_, _, a| *a).is_empty());
        // within lateness (10 + 5 > 12): counted, fires again at once
        assert_eq!(add(&mut s, "a", 2, 1), Placement::Open(Window::containing(2, size(10))));
        add(&mut s, "b", 3, 2); // a key the window had not seen: its first firing
        let fired = s.fire_updated(|_, _, a| *a);
        assert_eq!(count_of(&fired), [("a".to_owned(), 0, 2, vec![1]), ("b".to_owned(), 0, 1, vec![2])]);
        assert_eq!(fired.iter().map(|f| f.refinement).collect::<Vec<_>>(), [true, false]);
        s.adv(15);
        assert_eq!(s.panes(), 0, "dropped at end + lateness");
        assert!(matches!(add(&mut s, "a", 4, 3), Placement::Late { .. }));
        // without lateness the same input is late at once
        let mut s: WindowState<u64, u32> = WindowState::new(tumbling(10));
        add(&mut s, "a", 1, 0);
        s.adv(12);
        assert!(matches!(add(&mut s, "a", 2, 1), Placement::Late { .. }));
        assert_eq!(s.panes(), 0);
    }

    #[test]
    fn a_late_input_can_reopen_a_session() {
        let mut s: WindowState<u64, u32> = WindowState::new(WindowKind::session(size(10))).with_allowed_lateness(20);
        add(&mut s, "a", 0, 0);
        assert_eq!(s.adv(15).len(), 1);
        // 8 joins the kept [0, 10) and extends it to [0, 18): open again, fires at 18
        assert!(matches!(add(&mut s, "a", 8, 1), Placement::Open(w) if w.end() == 18));
        assert!(s.fire_updated(|_, _, a| *a).is_empty());
        let fired = s.adv(18);
        let got: Vec<_> = fired.iter().map(|f| (f.window.end(), f.output, f.refinement, ids(&f.inputs))).collect();
        assert_eq!(got, [(18, 2, true, vec![1])]);
        assert_consistent(&s);
    }

    mod props {
        use std::collections::HashMap;

        use proptest::prelude::*;

        use super::*;

        #[derive(Clone, Debug)]
        enum Op {
            Event { key: u8, ts: i64 },
            Watermark(u64),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                3 => (0u8..4, -300i64..1_500).prop_map(|(key, ts)| Op::Event { key, ts }),
                1 => (0u64..1_600).prop_map(Op::Watermark),
            ]
        }

        /// `[start, end)` of the window of `ts`, from the definition: the multiple of `size` at or
        /// below `ts`.
        fn model_window(ts: i64, size: u64) -> (i128, i128) {
            let (ts, size) = (i128::from(ts), i128::from(size));
            let mut start = ts - ts % size;
            if start > ts {
                start -= size;
            }
            (start, start + size)
        }

        fn model_closed(ts: i64, size: u64, wm: u64) -> bool {
            model_window(ts, size).1 <= i128::from(wm)
        }

        fn check_fired(
            fired: Vec<Fired<u64, usize>>,
            wm: u64,
            events: &[(u8, i64)],
            seen: &mut HashMap<usize, (u8, Window)>,
            last_end: &mut i128,
            size: u64,
        ) -> Result<(), TestCaseError> {
            for f in fired {
                // the oracle is written out here, not Window::closed_by
                prop_assert!(
                    wm == u64::MAX || f.window.end() <= i128::from(wm),
                    "{:?} fired at watermark {}",
                    f.window,
                    wm
                );
                prop_assert!(f.window.end() >= *last_end, "windows fire in end order");
                *last_end = f.window.end();
                prop_assert_eq!(f.output as usize, f.inputs.len());
                prop_assert_eq!(f.count as usize, f.inputs.len());
                for id in ids(&f.inputs) {
                    let (key, ts) = events[id];
                    prop_assert_eq!((f.window.start(), f.window.end()), model_window(ts, size));
                    prop_assert_eq!(&f.key, &values![u64::from(key)]);
                    prop_assert!(seen.insert(id, (key, f.window)).is_none(), "event {} fired twice", id);
                }
            }
            Ok(())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Every event is either late (its window already closed when it arrived) or counted
            /// in exactly one fired pane: its own key and window. No window fires before the
            /// watermark reaches its end, and every window is fired as soon as it does.
            #[test]
            fn every_event_in_exactly_one_window_never_early(size_ms in 1u64..200, ops in prop::collection::vec(op(), 0..200)) {
                let mut s: WindowState<u64, usize> = WindowState::new(tumbling(size_ms));
                let mut events: Vec<(u8, i64)> = Vec::new();
                let mut late = Vec::new();
                let mut seen: HashMap<usize, (u8, Window)> = HashMap::new();
                let mut wm: Option<u64> = None;
                let mut last_end = i128::MIN;
                for op in ops {
                    match op {
                        Op::Event { key, ts } => {
                            let id = events.len();
                            events.push((key, ts));
                            let expect_late = wm.is_some_and(|w| model_closed(ts, size_ms, w));
                            let p = s.add(values![u64::from(key)], ts, Some(id), || 0, incr, sum).unwrap();
                            match p {
                                Placement::Late { input, .. } => {
                                    prop_assert!(expect_late, "event {} at {} wrongly late at {:?}", id, ts, wm);
                                    prop_assert_eq!(input, Some(id));
                                    late.push(id);
                                }
                                Placement::Open(w) => {
                                    prop_assert!(!expect_late, "late event {} at {} accepted at {:?}", id, ts, wm);
                                    prop_assert_eq!((w.start(), w.end()), model_window(ts, size_ms));
                                }
                            }
                        }
                        Op::Watermark(w) => {
                            let fired = s.adv(w);
                            if wm.is_none_or(|c| w > c) {
                                wm = Some(w);
                            } else {
                                prop_assert!(fired.is_empty(), "a watermark not above {:?} fired windows", wm);
                            }
                            let current = wm.unwrap_or(0);
                            prop_assert_eq!(s.watermark(), wm);
                            check_fired(fired, current, &events, &mut seen, &mut last_end, size_ms)?;
                            // nothing left open that the watermark closed
                            for (id, &(key, ts)) in events.iter().enumerate() {
                                if !late.contains(&id) && !seen.contains_key(&id) {
                                    prop_assert!(!model_closed(ts, size_ms, current),
                                        "event {} (key {}, ts {}) still open at watermark {}", id, key, ts, current);
                                }
                            }
                        }
                    }
                }
                check_fired(s.fl(), u64::MAX, &events, &mut seen, &mut last_end, size_ms)?;
                prop_assert_eq!(s.held(), 0);
                prop_assert_eq!(s.open_panes(), 0);
                prop_assert_eq!(seen.len() + late.len(), events.len(), "every event fired once or was late");
                for id in late {
                    prop_assert!(!seen.contains_key(&id));
                }
            }
        }

        /// Releases every fired input as the bolt does; returns the ids released (the last
        /// reference let go).
        fn release_all(fired: Vec<Fired<u64, usize>>) -> Vec<usize> {
            fired.into_iter().flat_map(|f| f.inputs).filter_map(HeldInput::release).map(|(id, _)| id).collect()
        }

        /// The model's sessions of one key: (start, end, ids in time order).
        fn sessions(events: &[(i128, usize)], g: i128) -> Vec<(i128, i128, Vec<usize>)> {
            let mut ev = events.to_vec();
            ev.sort();
            let mut out: Vec<(i128, i128, Vec<usize>)> = Vec::new();
            for (t, id) in ev {
                match out.last_mut() {
                    Some(last) if t < last.1 => {
                        last.1 = last.1.max(t + g);
                        last.2.push(id);
                    }
                    _ => out.push((t, t + g, vec![id])),
                }
            }
            out
        }

        type Panes = HashMap<(u8, i128), Vec<usize>>;

        /// Checks one sliding firing at watermark `at`; records the panes and the releases.
        fn check_sliding(
            fired: Vec<Fired<u64, usize>>,
            at: u64,
            (sz, sl): (i128, i128),
            fired_panes: &mut Panes,
            windows_left: &mut HashMap<usize, usize>,
            released: &mut Vec<usize>,
        ) -> Result<(), TestCaseError> {
            for f in &fired {
                prop_assert!(at == u64::MAX || f.window.end() <= i128::from(at), "{:?} early at {}", f.window, at);
                prop_assert_eq!(f.window.end() - f.window.start(), sz);
                prop_assert_eq!(f.window.start().rem_euclid(sl), 0);
                let Value::UInt(key) = f.key[0] else { unreachable!() };
                let got = ids(&f.inputs);
                prop_assert_eq!(f.output as usize, got.len());
                prop_assert!(fired_panes.insert((key as u8, f.window.start()), got.clone()).is_none(), "fired twice");
                for id in got {
                    *windows_left.get_mut(&id).unwrap() -= 1;
                }
            }
            for id in release_all(fired) {
                prop_assert_eq!(windows_left[&id], 0, "event {} released before its last window fired", id);
                prop_assert!(!released.contains(&id));
                released.push(id);
            }
            Ok(())
        }

        /// Checks one session firing at watermark `at` against the model; returns how many
        /// inputs it released.
        fn check_sessions(
            fired: Vec<Fired<u64, usize>>,
            at: u64,
            g: i128,
            open: &mut HashMap<u8, Vec<(i128, usize)>>,
        ) -> Result<usize, TestCaseError> {
            let mut want: Vec<(u8, i128, i128, Vec<usize>)> = Vec::new();
            for (key, evs) in open.iter_mut() {
                for (st, end, mut ids) in sessions(evs, g) {
                    if at == u64::MAX || end <= i128::from(at) {
                        evs.retain(|(_, i)| !ids.contains(i));
                        ids.sort_unstable();
                        want.push((*key, st, end, ids));
                    }
                }
            }
            let mut got: Vec<(u8, i128, i128, Vec<usize>)> = Vec::new();
            for f in &fired {
                let Value::UInt(key) = f.key[0] else { unreachable!() };
                let mut ids = ids(&f.inputs);
                prop_assert_eq!(f.output as usize, ids.len());
                ids.sort_unstable();
                got.push((key as u8, f.window.start(), f.window.end(), ids));
            }
            let ends: Vec<i128> = fired.iter().map(|f| f.window.end()).collect();
            prop_assert!(ends.windows(2).all(|w| w[0] <= w[1]), "sessions fire in end order");
            want.sort();
            got.sort();
            prop_assert_eq!(&got, &want);
            Ok(release_all(fired).len())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Sliding windows against a model written from the definition: an event is counted
            /// in exactly the windows `[k * slide, k * slide + size)` holding it that were not
            /// closed when it arrived (late if none), each (key, window) fires once, never before
            /// the watermark reaches its end, and as soon as it does, with exactly its events; an
            /// event is released (acked) exactly once, by the firing of its last window.
            #[test]
            fn sliding_windows_match_the_model(slide in 1u64..40, n in 1u64..5, ops in prop::collection::vec(op(), 0..150)) {
                let size_ms = slide * n;
                let kind = WindowKind::sliding(size(size_ms), size(slide)).unwrap();
                let mut s: WindowState<u64, usize> = WindowState::new(kind);
                let (sz, sl) = (i128::from(size_ms), i128::from(slide));
                let mut expected: Panes = HashMap::new();
                let mut fired_panes: Panes = HashMap::new();
                let mut windows_left: HashMap<usize, usize> = HashMap::new();
                let mut released: Vec<usize> = Vec::new();
                let mut wm: Option<u64> = None;
                for (id, op) in ops.into_iter().enumerate() {
                    match op {
                        Op::Event { key, ts } => {
                            let t = i128::from(ts);
                            let mut starts = Vec::new();
                            let mut k = t.div_euclid(sl) * sl;
                            while k + sz > t {
                                if wm.is_none_or(|w| k + sz > i128::from(w)) {
                                    starts.push(k);
                                }
                                k -= sl;
                            }
                            match s.add(values![u64::from(key)], ts, Some(id), || 0, incr, sum).unwrap() {
                                Placement::Late { input, .. } => {
                                    prop_assert!(starts.is_empty(), "event {} at {} late at {:?}", id, ts, wm);
                                    prop_assert_eq!(input, Some(id));
                                }
                                Placement::Open(w) => {
                                    prop_assert!(!starts.is_empty(), "event {} at {} accepted at {:?}", id, ts, wm);
                                    prop_assert_eq!(w.start(), t.div_euclid(sl) * sl);
                                    windows_left.insert(id, starts.len());
                                    for st in starts {
                                        expected.entry((key, st)).or_default().push(id);
                                    }
                                }
                            }
                        }
                        Op::Watermark(w) => {
                            let fired = s.adv(w);
                            if wm.is_none_or(|c| w > c) {
                                wm = Some(w);
                            } else {
                                prop_assert!(fired.is_empty());
                            }
                            let at = wm.unwrap_or(0);
                            check_sliding(fired, at, (sz, sl), &mut fired_panes, &mut windows_left, &mut released)?;
                            // every window the watermark closed has fired
                            for ((key, st), ids) in &expected {
                                if st + sz <= i128::from(at) {
                                    prop_assert_eq!(fired_panes.get(&(*key, *st)), Some(ids));
                                }
                            }
                        }
                    }
                }
                check_sliding(s.fl(), u64::MAX, (sz, sl), &mut fired_panes, &mut windows_left, &mut released)?;
                prop_assert_eq!(&fired_panes, &expected);
                prop_assert_eq!(released.len(), windows_left.len(), "every accepted event released once");
                prop_assert_eq!((s.held(), s.panes()), (0, 0));
            }

            /// Sessions against a brute-force model: the accepted, not yet fired events of a key,
            /// sorted by time and cut where two neighbours are `gap` or more apart, are its open
            /// sessions. A watermark fires exactly the model sessions with `last + gap <= wm`;
            /// an event is late iff it overlaps no open session and `ts + gap <= wm`.
            #[test]
            fn sessions_match_the_brute_force_model(gap in 1u64..120, ops in prop::collection::vec(op(), 0..150)) {
                let mut s: WindowState<u64, usize> = WindowState::new(WindowKind::session(size(gap)));
                let g = i128::from(gap);
                let mut open: HashMap<u8, Vec<(i128, usize)>> = HashMap::new();
                let mut wm: Option<u64> = None;
                let mut accepted = 0usize;
                let mut released = 0;
                for (id, op) in ops.into_iter().enumerate() {
                    match op {
                        Op::Event { key, ts } => {
                            let t = i128::from(ts);
                            let evs = open.entry(key).or_default();
                            let overlaps = sessions(evs, g).iter().any(|(st, end, _)| *st < t + g && t < *end);
                            let expect_late = !overlaps && wm.is_some_and(|w| t + g <= i128::from(w));
                            match s.add(values![u64::from(key)], ts, Some(id), || 0, incr, sum).unwrap() {
                                Placement::Late { window, .. } => {
                                    prop_assert!(expect_late, "event {} at {} wrongly late at {:?}", id, ts, wm);
                                    prop_assert_eq!((window.start(), window.end()), (t, t + g));
                                }
                                Placement::Open(w) => {
                                    prop_assert!(!expect_late, "late event {} at {} accepted at {:?}", id, ts, wm);
                                    evs.push((t, id));
                                    accepted += 1;
                                    let model = sessions(evs, g);
                                    let mine = model.iter().find(|(_, _, ids)| ids.contains(&id)).unwrap();
                                    prop_assert_eq!((w.start(), w.end()), (mine.0, mine.1));
                                }
                            }
                        }
                        Op::Watermark(w) => {
                            let fired = s.adv(w);
                            if wm.is_some_and(|c| w <= c) {
                                prop_assert!(fired.is_empty());
                                continue;
                            }
                            wm = Some(w);
                            released += check_sessions(fired, w, g, &mut open)?;
                        }
                    }
                }
                released += check_sessions(s.fl(), u64::MAX, g, &mut open)?;
                prop_assert_eq!(released, accepted, "every accepted event released once");
                prop_assert_eq!((s.held(), s.panes()), (0, 0));
            }
        }
    }
}
