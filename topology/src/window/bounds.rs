//! The bounds math of windows: which windows an event time falls in (tumbling, sliding,
//! session), alignment, negative timestamps, the edges of the `i64` range.

use std::num::NonZeroU64;

use super::aggregate::saturate_i64;
use super::config::WindowError;
#[cfg(doc)]
use crate::component::Watermark;

/// At most this many sliding windows hold one event (`size_ms / slide_ms`): each event is folded
/// into every one of them.
pub const MAX_WINDOWS_PER_EVENT: u64 = 1_000;

/// How event times map to windows; validated when made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowKind(Kind);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Tumbling { size: NonZeroU64 },
    Sliding { size: NonZeroU64, slide: NonZeroU64 },
    Session { gap: NonZeroU64 },
}

impl WindowKind {
    /// Fixed, non-overlapping windows of `size` ms, aligned at the epoch.
    pub fn tumbling(size: NonZeroU64) -> WindowKind {
        WindowKind(Kind::Tumbling { size })
    }

    /// Windows of `size` ms starting every `slide` ms (aligned at the epoch): each event falls
    /// in `size / slide` of them. `slide` must divide `size` and `size / slide` be at most
    /// [`MAX_WINDOWS_PER_EVENT`]. With `slide == size` this is a tumbling window.
    pub fn sliding(size: NonZeroU64, slide: NonZeroU64) -> Result<WindowKind, WindowError> {
        let (size_ms, slide_ms) = (size.get(), slide.get());
        if slide_ms > size_ms {
            return Err(WindowError::SlideAboveSize { size_ms, slide_ms });
        }
        if size_ms % slide_ms != 0 {
            return Err(WindowError::SlideNotDivisor { size_ms, slide_ms });
        }
        if size_ms / slide_ms > MAX_WINDOWS_PER_EVENT {
            return Err(WindowError::TooManyWindows { size_ms, slide_ms, max: MAX_WINDOWS_PER_EVENT });
        }
        Ok(WindowKind(Kind::Sliding { size, slide }))
    }

    /// Per-key sessions: events less than `gap` ms apart (transitively) share a session
    /// `[first event, last event + gap)`.
    pub fn session(gap: NonZeroU64) -> WindowKind {
        WindowKind(Kind::Session { gap })
    }

    pub(crate) fn kind(self) -> Kind {
        self.0
    }
}

/// The bounds `[start, end)` of one window, in ms of event time.
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

    /// The sliding windows of `size` every `slide` (`slide` divides `size`) that hold `ts`, by
    /// start (and end) ascending: `size / slide` of them.
    pub(crate) fn sliding(ts: i64, size: NonZeroU64, slide: NonZeroU64) -> impl Iterator<Item = Window> {
        let (size, slide) = (i128::from(size.get()), i128::from(slide.get()));
        let last = i128::from(ts).div_euclid(slide) * slide;
        let n = size / slide;
        (0..n).rev().map(move |i| {
            let start = last - i * slide;
            Window { start, end: start + size }
        })
    }

    pub(crate) fn from_bounds(start: i128, end: i128) -> Window {
        Window { start, end }
    }

    /// The session a lone event at `ts` opens: `[ts, ts + gap)`.
    pub(crate) fn session(ts: i64, gap: NonZeroU64) -> Window {
        let start = i128::from(ts);
        Window { start, end: start + i128::from(gap.get()) }
    }

    /// The smallest window holding both.
    pub(crate) fn union(self, other: Window) -> Window {
        Window { start: self.start.min(other.start), end: self.end.max(other.end) }
    }

    /// Whether the two share a point (half-open bounds: `[0, 5)` and `[5, 9)` do not).
    pub(crate) fn overlaps(&self, other: &Window) -> bool {
        self.start < other.end && other.start < self.end
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

    /// Whether watermark `wm` is past the window's allowed lateness: `wm >= end + lateness`
    /// (and [`Watermark::MAX`] is past every window's). With lateness 0 this is
    /// [`Window::closed_by`].
    pub fn expired_by(&self, wm: u64, lateness_ms: u64) -> bool {
        wm == u64::MAX || self.end + i128::from(lateness_ms) <= i128::from(wm)
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

    #[test]
    fn expired_by_adds_the_lateness() {
        let w = Window::containing(1_500, size(1_000));
        assert!(!w.expired_by(2_000, 1) && w.expired_by(2_001, 1));
        assert!(w.expired_by(2_000, 0) && w.expired_by(u64::MAX, u64::MAX));
        assert!(!w.expired_by(u64::MAX - 1, u64::MAX), "exact in i128, no overflow");
    }

    #[test]
    fn sliding_windows_hold_the_event_size_over_slide_times() {
        let got: Vec<_> = Window::sliding(1_234, size(1_000), size(250)).map(|w| (w.start(), w.end())).collect();
        assert_eq!(got, [(250, 1_250), (500, 1_500), (750, 1_750), (1_000, 2_000)]);
        let neg: Vec<_> = Window::sliding(-1, size(10), size(5)).map(|w| (w.start(), w.end())).collect();
        assert_eq!(neg, [(-10, 0), (-5, 5)]);
        let same: Vec<_> = Window::sliding(7, size(10), size(10)).collect();
        assert_eq!(same, [Window::containing(7, size(10))], "slide == size is tumbling");
        for ts in [-1_001, -1, 0, 1, 999, 1_000, i64::MAX, i64::MIN] {
            for w in Window::sliding(ts, size(1_000), size(100)) {
                assert!(w.contains(ts), "{w:?} {ts}");
            }
            assert_eq!(Window::sliding(ts, size(1_000), size(100)).count(), 10);
        }
    }

    #[test]
    fn sliding_kind_validates_the_slide() {
        assert!(WindowKind::sliding(size(10), size(5)).is_ok());
        assert!(WindowKind::sliding(size(10), size(10)).is_ok());
        assert_eq!(
            WindowKind::sliding(size(10), size(20)).unwrap_err(),
            WindowError::SlideAboveSize { size_ms: 10, slide_ms: 20 }
        );
        assert_eq!(
            WindowKind::sliding(size(10), size(3)).unwrap_err(),
            WindowError::SlideNotDivisor { size_ms: 10, slide_ms: 3 }
        );
        assert_eq!(
            WindowKind::sliding(size(10_000), size(1)).unwrap_err(),
            WindowError::TooManyWindows { size_ms: 10_000, slide_ms: 1, max: MAX_WINDOWS_PER_EVENT }
        );
    }

    #[test]
    fn sessions_overlap_only_when_closer_than_the_gap() {
        let a = Window::session(0, size(5));
        assert_eq!((a.start(), a.end()), (0, 5));
        assert!(a.overlaps(&Window::session(4, size(5))));
        assert!(!a.overlaps(&Window::session(5, size(5))), "[0, 5) and [5, 10) do not touch");
        assert!(Window::session(-3, size(5)).overlaps(&a));
        assert_eq!(a.union(Window::session(4, size(5))), Window::session(0, size(9)));
    }
}
