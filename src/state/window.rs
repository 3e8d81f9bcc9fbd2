//! Exactly-once tumbling windows over the Kinesis spout: [`Tumbling`] turns a
//! [`WindowAggregate`] (a key, an accumulator, a result) into both halves of a fired window:
//! the [`KeyedState`] an [`super::ExactlyOnce`] bolt commits (one item per key and window,
//! `{key}@{window start}`, with a timer at the window's end) and the [`OnFire`] logic of the
//! [`super::WindowFirer`] that emits its result once the stream's committed watermark passes the
//! end.
//!
//! Windows are over the records' approximate arrival time (the spout's `arrival_ms` field): the
//! time the committed watermark bounds, so no input of a window can come after it fired. A
//! replayed record keeps its arrival time, so it lands in the same window, where it is recognized
//! as already applied.
//!
//! ```no_run
//! use squall::state::{ExactlyOnce, StateConfig, Tumbling, Window, WindowAggregate, WindowFirer};
//! use squall::topology::{ComponentError, Tuple};
//!
//! #[derive(Clone)]
//! struct Count;
//!
//! #[derive(serde::Serialize)]
//! struct KeyCount { key: String, start: i64, count: u64 }
//!
//! impl WindowAggregate for Count {
//!     type Acc = u64;
//!     type Out = KeyCount;
//!     fn key(&self, t: &Tuple) -> Result<String, ComponentError> {
//!         Ok(t.get_str("partition_key")?.to_string())
//!     }
//!     fn add(&mut self, n: &mut u64, _t: &Tuple) -> Result<(), ComponentError> {
//!         *n += 1;
//!         Ok(())
//!     }
//!     fn result(&mut self, key: &str, w: Window, n: u64) -> KeyCount {
//!         KeyCount { key: key.to_string(), start: w.start_ms, count: n }
//!     }
//! }
//! # fn wire(cfg: StateConfig, firer: squall::state::FirerConfig) {
//! let minute = Tumbling::new(60_000, Count);
//! let bolt = ExactlyOnce::new(cfg, minute.clone()); // commits each key's window exactly once
//! let spout = WindowFirer::new(firer, minute); // fires each window once it is complete
//! # }
//! ```

use serde::Serialize;
use serde::de::DeserializeOwned;
use squall_topology::{ComponentError, Tuple};

use super::bolt::KeyedState;
use super::fire::OnFire;

/// A window: `[start_ms, end_ms)` of arrival time, ms since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
pub struct Window {
    /// First millisecond in it.
    pub start_ms: i64,
    /// First millisecond after it.
    pub end_ms: i64,
}

/// An aggregate per key and window.
pub trait WindowAggregate: Send + 'static {
    /// The accumulator of one key's window (stored as JSON; `Default` when the window opens).
    type Acc: Serialize + DeserializeOwned + Default + Clone + Send;
    /// What a fired window emits (its fields declared with [`squall_topology::fields_of`], then
    /// [`super::FIRE_FIELDS`]).
    type Out: Serialize + Send;

    /// The key of an input (subscribe the bolt with a fields grouping on what it is made of).
    fn key(&self, t: &Tuple) -> Result<String, ComponentError>;

    /// Adds an input to its key's window. An error (or panic) fails the input and leaves the
    /// accumulator as it was.
    fn add(&mut self, acc: &mut Self::Acc, t: &Tuple) -> Result<(), ComponentError>;

    /// The output of a complete window. Called again with the same accumulator when a firing is
    /// replayed.
    fn result(&mut self, key: &str, window: Window, acc: Self::Acc) -> Self::Out;
}

/// Tumbling windows of `size_ms` over arrival time for a [`WindowAggregate`]: the
/// [`KeyedState`] of the bolt and the [`OnFire`] of the firer (give each a clone).
#[derive(Debug, Clone)]
pub struct Tumbling<A> {
    size_ms: i64,
    agg: A,
}

impl<A> Tumbling<A> {
    /// Windows of `size_ms` (at least 1) aligned on the epoch.
    pub fn new(size_ms: u64, agg: A) -> Self {
        Self { size_ms: i64::try_from(size_ms.max(1)).unwrap_or(i64::MAX), agg }
    }

    /// The window an arrival time falls in.
    pub fn window_of(&self, at_ms: i64) -> Window {
        let start = at_ms - at_ms.rem_euclid(self.size_ms);
        Window { start_ms: start, end_ms: start.saturating_add(self.size_ms) }
    }

    /// The item key of `key`'s window `w`: `{key}@{start}`.
    pub fn item_key(key: &str, w: Window) -> String {
        format!("{key}@{}", w.start_ms)
    }

    /// The user key and window of an item key made by [`Tumbling::item_key`].
    pub fn split_key<'k>(&self, item_key: &'k str) -> Option<(&'k str, Window)> {
        let (key, start) = item_key.rsplit_once('@')?;
        let start: i64 = start.parse().ok()?;
        Some((key, Window { start_ms: start, end_ms: start.saturating_add(self.size_ms) }))
    }
}

impl<A: WindowAggregate> KeyedState for Tumbling<A> {
    type State = A::Acc;
    type Out = ();

    fn key(&self, t: &Tuple) -> Result<String, ComponentError> {
        let key = self.agg.key(t)?;
        let at = t.get_i64("arrival_ms").map_err(|e| {
            ComponentError::fatal(format!(
                "tumbling windows need each input's arrival time (field arrival_ms of the Kinesis spout): {e}"
            ))
        })?;
        Ok(Self::item_key(&key, self.window_of(at)))
    }

    fn apply(&mut self, _key: &str, acc: &mut A::Acc, t: &Tuple, _out: &mut Vec<()>) -> Result<(), ComponentError> {
        self.agg.add(acc, t)
    }

    fn timer(&self, key: &str, _acc: &A::Acc) -> Option<i64> {
        self.split_key(key).map(|(_, w)| w.end_ms)
    }
}

impl<A: WindowAggregate> OnFire for Tumbling<A> {
    type State = A::Acc;
    type Out = A::Out;

    fn fire(&mut self, key: &str, fire_at: i64, acc: A::Acc) -> A::Out {
        let (user_key, window) = self
            .split_key(key)
            .unwrap_or((key, Window { start_ms: fire_at.saturating_sub(self.size_ms), end_ms: fire_at }));
        self.agg.result(user_key, window, acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use squall_topology::Value;

    #[derive(Clone)]
    struct Count;

    impl WindowAggregate for Count {
        type Acc = u64;
        type Out = (String, i64, i64, u64);
        fn key(&self, t: &Tuple) -> Result<String, ComponentError> {
            Ok(t.get_str("partition_key")?.to_string())
        }
        fn add(&mut self, n: &mut u64, _t: &Tuple) -> Result<(), ComponentError> {
            *n += 1;
            Ok(())
        }
        fn result(&mut self, key: &str, w: Window, n: u64) -> Self::Out {
            (key.to_string(), w.start_ms, w.end_ms, n)
        }
    }

    fn input(key: &str, at: i64) -> Tuple {
        Tuple::new_for_test(
            "spout",
            "default",
            &["partition_key", "arrival_ms"],
            vec![Value::from(key), Value::Int(at)].into(),
        )
    }

    #[test]
    fn keys_windows_timers_and_results_agree() {
        let mut w = Tumbling::new(1000, Count);
        // a key with '@' in it still splits at the last one
        let k = KeyedState::key(&w, &input("user@example.com", 12_345)).unwrap();
        assert_eq!(k, "user@example.com@12000");
        assert_eq!(w.timer(&k, &0), Some(13_000), "fires at the window's end");
        assert_eq!(KeyedState::key(&w, &input("a", 12_999)).unwrap(), "a@12000");
        assert_eq!(KeyedState::key(&w, &input("a", 13_000)).unwrap(), "a@13000", "the end is exclusive");
        assert_eq!(w.window_of(-1), Window { start_ms: -1000, end_ms: 0 });
        let mut n = 0;
        for _ in 0..3 {
            KeyedState::apply(&mut w, &k, &mut n, &input("user@example.com", 12_345), &mut Vec::new()).unwrap();
        }
        assert_eq!(w.fire(&k, 13_000, n), ("user@example.com".to_string(), 12_000, 13_000, 3));
        let e = KeyedState::key(&w, &Tuple::new_for_test("s", "d", &["partition_key"], vec![Value::from("a")].into()))
            .unwrap_err();
        assert!(e.to_string().contains("arrival_ms"), "{e}");
    }
}
