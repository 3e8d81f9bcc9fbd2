//! Progress of long CLI operations on stderr: a bar for `stream put --count`, a spinner with a
//! message for the waits of `kill`, `drain` and `rebalance`. Drawn only when stderr is a
//! terminal (indicatif hides itself otherwise), so piped output stays quiet.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar counting to `total` (records), with the rate and the time left.
pub(crate) fn bar(total: u64, what: &str) -> ProgressBar {
    let b = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} ({per_sec}, {eta} left)")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    b.set_style(style);
    b.set_message(what.to_string());
    b
}

/// A spinner with a message, ticking by itself.
pub(crate) fn spinner(what: &str) -> ProgressBar {
    let s = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    s.set_style(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    s.set_message(what.to_string());
    s.enable_steady_tick(Duration::from_millis(120));
    s
}
