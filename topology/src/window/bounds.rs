//! The bounds math of windows: alignment, negative timestamps, the edges of the `i64` range.

use std::num::NonZeroU64;

use super::aggregate::saturate_i64;
#[cfg(doc)]
use crate::component::Watermark;

/// The bounds `[start, end)` of one tumbling window, in ms of event time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Window {
    start: i128,
    end: i128,
}

impl Window {
    /// The window of size `size_ms` that holds event time `ts`: aligned at the epoch, so
    /// `start = floor(ts / size) * size`, also for negative `ts`.
    pub fn containing(ts: i64, size_ms: NonZeroU64) -> Window {
        let size = i128::from(size_ms.get());
        let start = i128::from(ts).div_euclid(size) * size;
        Window { start, end: start + size }
    }

    /// The exact start (inclusive); below `i64::MIN` only for the window holding `i64::MIN`.
    pub fn start(&self) -> i128 {
        self.start
    }

    /// The exact end (exclusive); above `i64::MAX` only for the window holding `i64::MAX`.
    pub fn end(&self) -> i128 {
        self.end
    }

    /// The start as emitted: saturated to the `i64` range.
    pub fn start_ms(&self) -> i64 {
        saturate_i64(self.start)
    }

    /// The end as emitted: saturated to the `i64` range.
    pub fn end_ms(&self) -> i64 {
        saturate_i64(self.end)
    }

    /// Whether `ts` falls in the window.
    pub fn contains(&self, ts: i64) -> bool {
        (self.start..self.end).contains(&i128::from(ts))
    }

    /// Whether watermark `wm` closes the window: `wm >= end`, and [`Watermark::MAX`] closes
    /// every window.
    pub fn closed_by(&self, wm: u64) -> bool {
        wm == u64::MAX || self.end <= i128::from(wm)
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    fn size(ms: u64) -> NonZeroU64 {
        NonZeroU64::new(ms).unwrap()
    }

    #[test]
    fn window_assignment_aligns_at_the_epoch() {
        let w = Window::containing(1_234, size(1_000));
        assert_eq!((w.start(), w.end()), (1_000, 2_000));
        assert!(w.contains(1_000) && w.contains(1_999) && !w.contains(2_000) && !w.contains(999));
        assert_eq!(Window::containing(0, size(1_000)).start(), 0);
        assert_eq!(Window::containing(999, size(1_000)).end(), 1_000);
        assert_eq!(Window::containing(1_000, size(1_000)).start(), 1_000);
        let one = Window::containing(7, size(1));
        assert_eq!((one.start(), one.end()), (7, 8));
    }

    #[test]
    fn negative_timestamps_floor() {
        let w = Window::containing(-1, size(1_000));
        assert_eq!((w.start_ms(), w.end_ms()), (-1_000, 0));
        let w = Window::containing(-1_000, size(1_000));
        assert_eq!((w.start_ms(), w.end_ms()), (-1_000, 0));
        let w = Window::containing(-1_001, size(1_000));
        assert_eq!((w.start_ms(), w.end_ms()), (-2_000, -1_000));
        // a window ending at or below 0 is closed by any watermark
        assert!(Window::containing(-1, size(1_000)).closed_by(0));
        assert!(!Window::containing(0, size(1_000)).closed_by(999));
    }

    #[test]
    fn extremes_are_exact_inside_and_saturate_when_emitted() {
        let s = size(1_000);
        let top = Window::containing(i64::MAX, s);
        assert!(top.contains(i64::MAX));
        assert!(top.end() > i128::from(i64::MAX));
        assert_eq!(top.end_ms(), i64::MAX);
        assert!(!top.closed_by(i64::MAX as u64), "i64::MAX may still arrive at watermark i64::MAX");
        assert!(top.closed_by(u64::MAX));
        let bottom = Window::containing(i64::MIN, s);
        assert!(bottom.contains(i64::MIN));
        assert!(bottom.start() < i128::from(i64::MIN));
        assert_eq!(bottom.start_ms(), i64::MIN);
        let huge = Window::containing(-5, size(u64::MAX));
        assert_eq!(huge.start(), -i128::from(u64::MAX));
        assert_eq!(huge.end(), 0);
        let huge = Window::containing(i64::MAX, size(u64::MAX));
        assert_eq!((huge.start(), huge.end_ms()), (0, i64::MAX));
    }

    #[test]
    fn closed_by_is_watermark_at_least_end() {
        let w = Window::containing(1_500, size(1_000));
        assert!(!w.closed_by(1_999));
        assert!(w.closed_by(2_000));
        assert!(w.closed_by(2_001));
    }
}
