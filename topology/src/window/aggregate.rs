//! What a window computes: the [`WindowAggregate`] trait and the ready-made [`Count`] and [`Sum`].

use crate::component::ComponentError;
use crate::tuple::Tuple;
use crate::value::{Value, Values};

/// What a window computes per key: an accumulator folded over the window's inputs (and merged,
/// for sliding and session windows) and turned into output values when the window fires.
pub trait WindowAggregate: Clone + Send + Sync + 'static {
    /// The per-(key, window) state.
    type Acc: Send + 'static;

    /// The names of the values [`WindowAggregate::emit`] returns, in order.
    fn fields(&self) -> Vec<String>;

    /// A fresh accumulator for a (key, window) that just received its first input.
    fn init(&self) -> Self::Acc;

    /// Folds one input in. On error the input is failed (and replayed by a replaying spout);
    /// `acc` must then be left as it was. If it panics, the engine fails the input too, and the
    /// accumulator is kept as the panic left it.
    fn add(&self, acc: &mut Self::Acc, input: &Tuple) -> Result<(), ComponentError>;

    /// Folds `other` into `into`, as if `into` had also folded `other`'s inputs. Sliding windows
    /// fold an input once and merge it into each of its windows; sessions merge when an input
    /// bridges them. Tumbling windows never call it. Must be associative, with [`init`] as
    /// identity: `merge(init(), x) == x`.
    ///
    /// [`init`]: WindowAggregate::init
    fn merge(&self, into: &mut Self::Acc, other: &Self::Acc);

    /// The output values of a fired window, one per [`WindowAggregate::fields`] entry. If it
    /// panics, that window's aggregate is not emitted and its held inputs are failed; the other
    /// windows firing with it are emitted (see the [module docs](super)).
    fn emit(&self, acc: &Self::Acc) -> Values;
}

/// Counts the inputs: emits `count` (u64).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Count;

impl WindowAggregate for Count {
    type Acc = u64;

    fn fields(&self) -> Vec<String> {
        vec!["count".to_owned()]
    }

    fn init(&self) -> u64 {
        0
    }

    fn add(&self, acc: &mut u64, _input: &Tuple) -> Result<(), ComponentError> {
        *acc += 1;
        Ok(())
    }

    fn merge(&self, into: &mut u64, other: &u64) {
        *into = into.saturating_add(*other);
    }

    fn emit(&self, acc: &u64) -> Values {
        Values::from([*acc])
    }
}

/// Sums an integer field (signed or unsigned): emits `sum` (i64, saturating at the `i64` range;
/// the running sum itself is exact).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sum {
    field: String,
}

impl Sum {
    /// Sums `field`.
    pub fn new(field: impl Into<String>) -> Self {
        Sum { field: field.into() }
    }
}

impl WindowAggregate for Sum {
    type Acc = i128;

    fn fields(&self) -> Vec<String> {
        vec!["sum".to_owned()]
    }

    fn init(&self) -> i128 {
        0
    }

    fn add(&self, acc: &mut i128, input: &Tuple) -> Result<(), ComponentError> {
        let v = match input.get(&self.field)? {
            Value::Int(i) => i128::from(*i),
            Value::UInt(u) => i128::from(*u),
            // reports the type mismatch, naming the field, stream and component
            _ => i128::from(input.get_i64(&self.field)?),
        };
        // |v| < 2^64, so 2^63 additions cannot overflow i128: saturate to be total anyway
        *acc = acc.saturating_add(v);
        Ok(())
    }

    fn merge(&self, into: &mut i128, other: &i128) {
        *into = into.saturating_add(*other);
    }

    fn emit(&self, acc: &i128) -> Values {
        Values::from([saturate_i64(*acc)])
    }
}

pub(crate) fn saturate_i64(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::values;

    #[test]
    fn aggregates() {
        let t = Tuple::new_for_test("s", "default", &["n", "u", "w"], values![-5i64, u64::MAX, "x"]);
        let mut n = Count.init();
        Count.add(&mut n, &t).unwrap();
        Count.add(&mut n, &t).unwrap();
        assert_eq!(Count.emit(&n), values![2u64]);
        let mut m = Count.init();
        Count.merge(&mut m, &n);
        Count.merge(&mut m, &n);
        assert_eq!(Count.emit(&m), values![4u64]);
        let sum = Sum::new("n");
        let mut acc = sum.init();
        sum.add(&mut acc, &t).unwrap();
        sum.add(&mut acc, &t).unwrap();
        assert_eq!(sum.emit(&acc), values![-10i64]);
        let mut m = sum.init();
        sum.merge(&mut m, &acc);
        sum.merge(&mut m, &7);
        assert_eq!(sum.emit(&m), values![-3i64]);
        let big = Sum::new("u");
        let mut acc = big.init();
        big.add(&mut acc, &t).unwrap();
        assert_eq!(acc, i128::from(u64::MAX));
        assert_eq!(big.emit(&acc), values![i64::MAX], "saturates when emitted");
        let bad = Sum::new("w");
        let mut acc = bad.init();
        let e = bad.add(&mut acc, &t).unwrap_err().to_string();
        assert!(e.contains("`w`") && e.contains("not int"), "{e}");
        assert_eq!(acc, 0);
        assert!(Sum::new("missing").add(&mut acc, &t).unwrap_err().to_string().contains("unknown field"));
    }
}
