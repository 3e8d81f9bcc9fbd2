//! Every random number of the worker path comes from here: ids (workers, deployments,
//! registrations, producers), replay and back-off jitter.
//!
//! The source is std's hasher keys, which the OS gives each thread (`getrandom`), so a process
//! whose OS randomness is replaced gives the same numbers on every run: the simulator
//! (`tests/sim/`) seeds it per run and replays a run from its seed. (The `rand` and `uuid` crates
//! read the OS through a path of their own that it cannot seed.)

use std::hash::{BuildHasher, Hasher};

/// A random `u64`.
pub fn u64() -> u64 {
    // Each `RandomState` of a thread has keys of its own (std bumps them per state).
    std::collections::hash_map::RandomState::new().build_hasher().finish()
}

/// A random number in `[0, 1)`.
pub fn unit_f64() -> f64 {
    (u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// A random number in `0..=max`.
pub fn up_to(max: u64) -> u64 {
    if max == u64::MAX { u64() } else { u64() % (max + 1) }
}

/// `len` random hex digits (at most 32): ids of workers, deployments and registrations.
pub fn hex_id(len: usize) -> String {
    let v = (u128::from(u64()) << 64) | u128::from(u64());
    let s = format!("{v:032x}");
    s[..len.min(32)].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_differ_and_stay_in_range() {
        assert_ne!(u64(), u64());
        assert_ne!(hex_id(32), hex_id(32));
        assert_eq!(hex_id(12).len(), 12);
        assert!((0..1000).all(|_| up_to(5) <= 5));
        assert!((0..1000).map(|_| unit_f64()).all(|f| (0.0..1.0).contains(&f)));
    }
}
