//! The bookkeeping of open windows, free of engine types (unit- and property-tested on its own).

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::num::NonZeroU64;

use super::bounds::Window;
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

/// One (key, window): its accumulator and its held inputs.
#[derive(Debug)]
struct Pane<Acc, H> {
    key: Values,
    acc: Acc,
    inputs: Vec<H>,
    count: u64,
}

/// The panes of one open window, in the order their keys were first seen.
#[derive(Debug)]
struct OpenWindow<Acc, H> {
    window: Window,
    index: HashMap<Key, usize>,
    panes: Vec<Pane<Acc, H>>,
}

/// Where [`WindowState::add`] put an input.
#[derive(Debug, PartialEq)]
pub enum Placement<H> {
    /// Folded into this open window.
    Open(Window),
    /// The watermark already closed the window: nothing was recorded; the key and input are
    /// handed back.
    Late {
        /// The (closed) window of the input's time.
        window: Window,
        /// The key given to `add`.
        key: Values,
        /// The input handle given to `add`.
        input: Option<H>,
    },
}

/// One (key, window) that fired.
#[derive(Debug)]
pub struct Fired<Acc, H> {
    /// The window.
    pub window: Window,
    /// The key values.
    pub key: Values,
    /// The accumulator.
    pub acc: Acc,
    /// The held inputs, in arrival order.
    pub inputs: Vec<H>,
    /// How many inputs were folded in (also when none were held).
    pub count: u64,
}

/// The open tumbling windows of one task, keyed; generic over the accumulator and the held input
/// handle `H` (an [`AckHandle`] in the bolt). No engine types: this is the logic the bolt wraps.
#[derive(Debug)]
pub struct WindowState<Acc, H> {
    size: NonZeroU64,
    watermark: Option<u64>,
    /// Open windows by their end.
    open: BTreeMap<i128, OpenWindow<Acc, H>>,
    panes: usize,
    held: usize,
}

impl<Acc, H> WindowState<Acc, H> {
    /// No open window, no watermark yet.
    pub fn new(size: NonZeroU64) -> Self {
        WindowState { size, watermark: None, open: BTreeMap::new(), panes: 0, held: 0 }
    }

    /// The window size in ms.
    pub fn size(&self) -> NonZeroU64 {
        self.size
    }

    /// The highest watermark seen (`None` before the first).
    pub fn watermark(&self) -> Option<u64> {
        self.watermark
    }

    /// The window of event time `ts`.
    pub fn window_of(&self, ts: i64) -> Window {
        Window::containing(ts, self.size)
    }

    /// Whether the watermark already closed `window`.
    pub fn is_closed(&self, window: Window) -> bool {
        self.watermark.is_some_and(|wm| window.closed_by(wm))
    }

    /// Number of open (key, window) panes.
    pub fn open_panes(&self) -> usize {
        self.panes
    }

    /// Number of open windows.
    pub fn open_windows(&self) -> usize {
        self.open.len()
    }

    /// The open windows, by end.
    pub fn windows(&self) -> impl Iterator<Item = Window> + '_ {
        self.open.values().map(|w| w.window)
    }

    /// Number of held input handles.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Folds an input with event time `ts` into the pane of (`key`, its window): creates the pane
    /// with `init` if needed, applies `fold` to its accumulator, and holds `input`. A late input
    /// (its window already closed) is handed back untouched. If `fold` fails, nothing is recorded
    /// (a pane created for it is removed) and `input` is dropped.
    pub fn add<E>(
        &mut self,
        key: Values,
        ts: i64,
        input: Option<H>,
        init: impl FnOnce() -> Acc,
        fold: impl FnOnce(&mut Acc) -> Result<(), E>,
    ) -> Result<Placement<H>, E> {
        let window = self.window_of(ts);
        if self.is_closed(window) {
            return Ok(Placement::Late { window, key, input });
        }
        let open = self.open.entry(window.end()).or_insert_with(|| OpenWindow {
            window,
            index: HashMap::new(),
            panes: Vec::new(),
        });
        let (i, created) = match open.index.get(&Key(key.clone())) {
            Some(&i) => (i, false),
            None => {
                let i = open.panes.len();
                open.index.insert(Key(key.clone()), i);
                open.panes.push(Pane { key, acc: init(), inputs: Vec::new(), count: 0 });
                (i, true)
            }
        };
        let pane = &mut open.panes[i];
        if let Err(e) = fold(&mut pane.acc) {
            if created {
                let pane = open.panes.pop();
                if let Some(p) = pane {
                    open.index.remove(&Key(p.key));
                }
                if open.panes.is_empty() {
                    self.open.remove(&window.end());
                }
            }
            return Err(e);
        }
        pane.count += 1;
        if let Some(h) = input {
            pane.inputs.push(h);
            self.held += 1;
        }
        if created {
            self.panes += 1;
        }
        Ok(Placement::Open(window))
    }

    /// Advances the watermark to `wm` and returns the panes of every window it closes (`end <=
    /// wm`), by window end, then by key arrival. A watermark not above the current one is ignored
    /// and fires nothing.
    pub fn advance(&mut self, wm: u64) -> Vec<Fired<Acc, H>> {
        if self.watermark.is_some_and(|w| wm <= w) {
            return Vec::new();
        }
        self.watermark = Some(wm);
        let mut fired = Vec::new();
        while let Some(entry) = self.open.first_entry() {
            if !entry.get().window.closed_by(wm) {
                break;
            }
            let w = entry.remove();
            self.take(w, &mut fired);
        }
        fired
    }

    /// Fires every open window (the stream ended) and closes all windows for the future.
    pub fn flush(&mut self) -> Vec<Fired<Acc, H>> {
        self.watermark = Some(u64::MAX);
        let mut fired = Vec::new();
        for (_, w) in std::mem::take(&mut self.open) {
            self.take(w, &mut fired);
        }
        fired
    }

    fn take(&mut self, w: OpenWindow<Acc, H>, fired: &mut Vec<Fired<Acc, H>>) {
        self.panes -= w.panes.len();
        for p in w.panes {
            self.held -= p.inputs.len();
            fired.push(Fired { window: w.window, key: p.key, acc: p.acc, inputs: p.inputs, count: p.count });
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::values;

    fn incr(n: &mut u64) -> Result<(), ()> {
        *n += 1;
        Ok(())
    }

    fn size(ms: u64) -> NonZeroU64 {
        NonZeroU64::new(ms).unwrap()
    }

    fn add(state: &mut WindowState<u64, u32>, key: &str, ts: i64, id: u32) -> Placement<u32> {
        state.add(values![key], ts, Some(id), || 0, incr).unwrap()
    }

    #[test]
    fn state_fires_only_closed_windows_in_order() {
        let mut s = WindowState::new(size(10));
        assert_eq!(add(&mut s, "b", 15, 0), Placement::Open(Window::containing(15, size(10))));
        add(&mut s, "a", 3, 1);
        add(&mut s, "b", 4, 2);
        add(&mut s, "a", 9, 3);
        add(&mut s, "a", 12, 4);
        assert_eq!((s.open_windows(), s.open_panes(), s.held()), (2, 4, 5));
        assert!(s.advance(9).is_empty(), "no window ends at or below 9");
        let fired = s.advance(10);
        let got: Vec<_> =
            fired.iter().map(|f| (f.key[0].to_string(), f.window.start(), f.acc, f.inputs.clone())).collect();
        assert_eq!(got, [("a".to_owned(), 0, 2, vec![1, 3]), ("b".to_owned(), 0, 1, vec![2])], "keys in arrival order");
        assert_eq!((s.open_windows(), s.open_panes(), s.held()), (1, 2, 2));
        // backwards or equal watermarks fire nothing
        assert!(s.advance(5).is_empty());
        assert!(s.advance(10).is_empty());
        assert_eq!(s.watermark(), Some(10));
        let fired = s.advance(25);
        assert_eq!(fired.iter().map(|f| (f.window.end(), f.count)).collect::<Vec<_>>(), [(20, 1), (20, 1)]);
        assert_eq!((s.open_windows(), s.open_panes(), s.held()), (0, 0, 0));
    }

    #[test]
    fn late_is_relative_to_closed_windows_not_the_watermark() {
        let mut s = WindowState::new(size(10));
        // before any watermark, nothing is late
        assert!(matches!(add(&mut s, "a", -100, 0), Placement::Open(_)));
        s.advance(15);
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
        let fired = s.flush();
        assert_eq!(fired.len(), 1);
        assert_eq!(fired[0].inputs, vec![1]);
        assert!(matches!(add(&mut s, "a", i64::MAX, 3), Placement::Late { .. }), "after flush everything is late");
    }

    #[test]
    fn failed_fold_records_nothing() {
        let mut s: WindowState<u64, u32> = WindowState::new(size(10));
        let r = s.add(values!["a"], 1, Some(0), || 0, |_| Err("bad"));
        assert_eq!(r, Err("bad"));
        assert_eq!((s.open_windows(), s.open_panes(), s.held()), (0, 0, 0));
        add(&mut s, "a", 1, 1);
        let r = s.add(values!["b"], 2, Some(2), || 0, |_| Err("bad"));
        assert_eq!(r, Err("bad"));
        let r = s.add(values!["a"], 3, Some(3), || 0, |_| Err("bad"));
        assert_eq!(r, Err("bad"));
        assert_eq!((s.open_windows(), s.open_panes(), s.held()), (1, 1, 1));
        add(&mut s, "b", 4, 4);
        let fired = s.flush();
        assert_eq!(fired.iter().map(|f| (f.acc, f.inputs.clone())).collect::<Vec<_>>(), [(1, vec![1]), (1, vec![4])]);
    }

    #[test]
    fn keys_compare_by_value_floats_by_bits() {
        let mut s: WindowState<u64, ()> = WindowState::new(size(10));
        let mut put = |k: Values| s.add(k, 0, None, || 0, incr).unwrap();
        put(values!["x", 1i64]);
        put(values!["x", 1i64]);
        put(values!["x", 1u64]); // another type, another key
        put(values![f64::NAN]);
        put(values![f64::NAN]);
        put(Values::new());
        let fired = s.flush();
        assert_eq!(fired.iter().map(|f| f.acc).collect::<Vec<_>>(), [2, 1, 2, 1]);
        assert!(fired.iter().all(|f| f.inputs.is_empty()));
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
                prop_assert_eq!(f.acc as usize, f.inputs.len());
                prop_assert_eq!(f.count as usize, f.inputs.len());
                for id in f.inputs {
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
                let mut s: WindowState<u64, usize> = WindowState::new(size(size_ms));
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
                            let p = s.add(values![u64::from(key)], ts, Some(id), || 0, incr).unwrap();
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
                            let fired = s.advance(w);
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
                check_fired(s.flush(), u64::MAX, &events, &mut seen, &mut last_end, size_ms)?;
                prop_assert_eq!(s.held(), 0);
                prop_assert_eq!(s.open_panes(), 0);
                prop_assert_eq!(seen.len() + late.len(), events.len(), "every event fired once or was late");
                for id in late {
                    prop_assert!(!seen.contains_key(&id));
                }
            }
        }
    }
}
