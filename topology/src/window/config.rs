//! The serde configuration of window bolts, its validation, and [`WindowError`].

use std::num::NonZeroU64;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::aggregate::WindowAggregate;
use super::bolt::{Spec, WindowSpec, WindowStats};
use super::bounds::WindowKind;
use super::{EVENT_TIME_FIELD, WINDOW_END_FIELD, WINDOW_START_FIELD};
use crate::component::ErrorDomain;
use crate::tuple::DEFAULT_STREAM;

/// What happens to a late tuple: one none of whose windows is open or within the allowed
/// lateness.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LatePolicy {
    /// Emit it on the late stream, anchored to the input (acked once the late stream's
    /// subscribers processed it).
    #[default]
    Stream,
    /// Ack it and only count it.
    Drop,
}

/// When inputs are acked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AckMode {
    /// Hold every input until its window fires; anchor the aggregate to them (at-least-once).
    #[default]
    OnFire,
    /// Ack inputs when `execute` returns; emit aggregates unanchored (at most once, nothing held).
    OnReceive,
}

fn default_late_stream() -> String {
    "late".to_owned()
}

fn default_output_stream() -> String {
    DEFAULT_STREAM.to_owned()
}

/// The settings every window kind shares: setters and the common view `build` validates.
macro_rules! shared_settings {
    () => {
        /// Sets the late policy.
        pub fn late(mut self, late: LatePolicy) -> Self {
            self.late = late;
            self
        }

        /// Sets the ack mode.
        pub fn ack(mut self, ack: AckMode) -> Self {
            self.ack = ack;
            self
        }

        /// Sets the allowed lateness in ms.
        pub fn allowed_lateness(mut self, ms: u64) -> Self {
            self.allowed_lateness_ms = ms;
            self
        }

        fn common(&self) -> Common<'_> {
            Common {
                time_field: &self.time_field,
                key_fields: &self.key_fields,
                allowed_lateness_ms: self.allowed_lateness_ms,
                late: self.late,
                late_stream: &self.late_stream,
                output_stream: &self.output_stream,
                ack: self.ack,
            }
        }
    };
}

/// The configuration of a tumbling window bolt: fixed, non-overlapping windows of `size_ms`.
/// [`TumblingWindowConfig::build`] validates it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TumblingWindowConfig {
    /// Window length in ms; must be positive.
    pub size_ms: u64,
    /// The event-time field: integer ms (signed, or unsigned up to `i64::MAX`).
    pub time_field: String,
    /// The key fields; empty means one window per period for all tuples.
    #[serde(default)]
    pub key_fields: Vec<String>,
    /// How long (ms of event time) a fired window is kept: an input arriving before the
    /// watermark passes `end + allowed_lateness_ms` is folded in and the window fires again (a
    /// refinement). Default 0: a window is dropped when it fires.
    #[serde(default)]
    pub allowed_lateness_ms: u64,
    /// What happens to late tuples (past the allowed lateness).
    #[serde(default)]
    pub late: LatePolicy,
    /// The stream late tuples go to with [`LatePolicy::Stream`]. Default `"late"`.
    #[serde(default = "default_late_stream")]
    pub late_stream: String,
    /// The stream aggregates go to. Default `"default"`.
    #[serde(default = "default_output_stream")]
    pub output_stream: String,
    /// When inputs are acked.
    #[serde(default)]
    pub ack: AckMode,
}

impl TumblingWindowConfig {
    /// Windows of `size_ms` over `time_field`, per `key_fields`; defaults for the rest.
    pub fn new(size_ms: u64, time_field: &str, key_fields: &[&str]) -> Self {
        TumblingWindowConfig {
            size_ms,
            time_field: time_field.to_owned(),
            key_fields: key_fields.iter().map(|f| (*f).to_owned()).collect(),
            allowed_lateness_ms: 0,
            late: LatePolicy::default(),
            late_stream: default_late_stream(),
            output_stream: default_output_stream(),
            ack: AckMode::default(),
        }
    }

    shared_settings!();

    /// Validates the config for `aggregate` and builds the spec that makes the bolts.
    pub fn build<A: WindowAggregate>(&self, aggregate: A) -> Result<WindowSpec<A>, WindowError> {
        let size = NonZeroU64::new(self.size_ms).ok_or(WindowError::ZeroSize)?;
        self.common().build(WindowKind::tumbling(size), aggregate)
    }
}

/// The configuration of a sliding window bolt: windows of `size_ms` starting every `slide_ms`,
/// so each input counts in `size_ms / slide_ms` windows. [`SlidingWindowConfig::build`]
/// validates it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlidingWindowConfig {
    /// Window length in ms; must be positive and a multiple of `slide_ms`.
    pub size_ms: u64,
    /// How far apart windows start, in ms: positive, at most `size_ms`, dividing it, and
    /// `size_ms / slide_ms` at most [`MAX_WINDOWS_PER_EVENT`](super::MAX_WINDOWS_PER_EVENT).
    pub slide_ms: u64,
    /// The event-time field: integer ms (signed, or unsigned up to `i64::MAX`).
    pub time_field: String,
    /// The key fields; empty means one window per period for all tuples.
    #[serde(default)]
    pub key_fields: Vec<String>,
    /// How long (ms of event time) a fired window is kept: an input arriving before the
    /// watermark passes `end + allowed_lateness_ms` is folded in and the window fires again (a
    /// refinement). Default 0: a window is dropped when it fires.
    #[serde(default)]
    pub allowed_lateness_ms: u64,
    /// What happens to late tuples (past the allowed lateness).
    #[serde(default)]
    pub late: LatePolicy,
    /// The stream late tuples go to with [`LatePolicy::Stream`]. Default `"late"`.
    #[serde(default = "default_late_stream")]
    pub late_stream: String,
    /// The stream aggregates go to. Default `"default"`.
    #[serde(default = "default_output_stream")]
    pub output_stream: String,
    /// When inputs are acked.
    #[serde(default)]
    pub ack: AckMode,
}

impl SlidingWindowConfig {
    /// Windows of `size_ms` every `slide_ms` over `time_field`, per `key_fields`; defaults for
    /// the rest.
    pub fn new(size_ms: u64, slide_ms: u64, time_field: &str, key_fields: &[&str]) -> Self {
        SlidingWindowConfig {
            size_ms,
            slide_ms,
            time_field: time_field.to_owned(),
            key_fields: key_fields.iter().map(|f| (*f).to_owned()).collect(),
            allowed_lateness_ms: 0,
            late: LatePolicy::default(),
            late_stream: default_late_stream(),
            output_stream: default_output_stream(),
            ack: AckMode::default(),
        }
    }

    shared_settings!();

    /// Validates the config for `aggregate` and builds the spec that makes the bolts.
    pub fn build<A: WindowAggregate>(&self, aggregate: A) -> Result<WindowSpec<A>, WindowError> {
        let size = NonZeroU64::new(self.size_ms).ok_or(WindowError::ZeroSize)?;
        let slide = NonZeroU64::new(self.slide_ms).ok_or(WindowError::ZeroSlide)?;
        self.common().build(WindowKind::sliding(size, slide)?, aggregate)
    }
}

/// The configuration of a session window bolt: per key, inputs less than `gap_ms` apart
/// (transitively) form one session `[first, last + gap_ms)`. [`SessionWindowConfig::build`]
/// validates it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionWindowConfig {
    /// The inactivity gap in ms that ends a session; must be positive.
    pub gap_ms: u64,
    /// The event-time field: integer ms (signed, or unsigned up to `i64::MAX`).
    pub time_field: String,
    /// The key fields; empty means one window per session for all tuples.
    #[serde(default)]
    pub key_fields: Vec<String>,
    /// How long (ms of event time) a fired window is kept: an input arriving before the
    /// watermark passes `end + allowed_lateness_ms` is folded in and the window fires again (a
    /// refinement). Default 0: a window is dropped when it fires.
    #[serde(default)]
    pub allowed_lateness_ms: u64,
    /// What happens to late tuples (past the allowed lateness).
    #[serde(default)]
    pub late: LatePolicy,
    /// The stream late tuples go to with [`LatePolicy::Stream`]. Default `"late"`.
    #[serde(default = "default_late_stream")]
    pub late_stream: String,
    /// The stream aggregates go to. Default `"default"`.
    #[serde(default = "default_output_stream")]
    pub output_stream: String,
    /// When inputs are acked.
    #[serde(default)]
    pub ack: AckMode,
}

impl SessionWindowConfig {
    /// Sessions with gap `gap_ms` over `time_field`, per `key_fields`; defaults for the rest.
    pub fn new(gap_ms: u64, time_field: &str, key_fields: &[&str]) -> Self {
        SessionWindowConfig {
            gap_ms,
            time_field: time_field.to_owned(),
            key_fields: key_fields.iter().map(|f| (*f).to_owned()).collect(),
            allowed_lateness_ms: 0,
            late: LatePolicy::default(),
            late_stream: default_late_stream(),
            output_stream: default_output_stream(),
            ack: AckMode::default(),
        }
    }

    shared_settings!();

    /// Validates the config for `aggregate` and builds the spec that makes the bolts.
    pub fn build<A: WindowAggregate>(&self, aggregate: A) -> Result<WindowSpec<A>, WindowError> {
        let gap = NonZeroU64::new(self.gap_ms).ok_or(WindowError::ZeroGap)?;
        self.common().build(WindowKind::session(gap), aggregate)
    }
}

/// The settings every window kind shares, borrowed from its config.
struct Common<'a> {
    time_field: &'a str,
    key_fields: &'a [String],
    allowed_lateness_ms: u64,
    late: LatePolicy,
    late_stream: &'a str,
    output_stream: &'a str,
    ack: AckMode,
}

impl Common<'_> {
    fn build<A: WindowAggregate>(&self, kind: WindowKind, aggregate: A) -> Result<WindowSpec<A>, WindowError> {
        if self.time_field.is_empty() {
            return Err(WindowError::NoTimeField);
        }
        let key = self.key_fields.iter().cloned();
        let output_fields: Vec<String> = key
            .clone()
            .chain([WINDOW_START_FIELD.to_owned(), WINDOW_END_FIELD.to_owned()])
            .chain(aggregate.fields())
            .collect();
        let late_fields: Vec<String> = key
            .chain([EVENT_TIME_FIELD.to_owned(), WINDOW_START_FIELD.to_owned(), WINDOW_END_FIELD.to_owned()])
            .collect();
        check_unique(self.output_stream, &output_fields)?;
        if self.late == LatePolicy::Stream {
            if self.late_stream == self.output_stream {
                return Err(WindowError::SameStream { stream: self.late_stream.to_owned() });
            }
            check_unique(self.late_stream, &late_fields)?;
        }
        Ok(WindowSpec {
            spec: Arc::new(Spec {
                kind,
                time_field: self.time_field.to_owned(),
                key_fields: self.key_fields.to_vec(),
                allowed_lateness_ms: self.allowed_lateness_ms,
                late: self.late,
                late_stream: self.late_stream.to_owned(),
                output_stream: self.output_stream.to_owned(),
                ack: self.ack,
                aggregate,
                output_fields,
                late_fields,
                stats: Arc::new(WindowStats::default()),
            }),
        })
    }
}

/// An invalid window configuration: the caller's fault ([`ErrorDomain::User`]), not retryable.
/// Each message names the field and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WindowError {
    /// `size_ms` is zero.
    #[error("window size_ms must be positive: set it to the window length in ms")]
    ZeroSize,
    /// `slide_ms` is zero.
    #[error("sliding window slide_ms must be positive: set it to how far apart windows start, in ms")]
    ZeroSlide,
    /// `slide_ms` is above `size_ms`: events would fall between windows.
    #[error(
        "sliding window slide_ms ({slide_ms}) is above size_ms ({size_ms}): events between windows would be lost; use slide_ms <= size_ms"
    )]
    SlideAboveSize {
        /// The window length.
        size_ms: u64,
        /// The slide.
        slide_ms: u64,
    },
    /// `slide_ms` does not divide `size_ms`.
    #[error(
        "sliding window size_ms ({size_ms}) is not a multiple of slide_ms ({slide_ms}): pick a slide_ms that divides size_ms"
    )]
    SlideNotDivisor {
        /// The window length.
        size_ms: u64,
        /// The slide.
        slide_ms: u64,
    },
    /// Each event would fall in more than `max` windows.
    #[error(
        "sliding window size_ms / slide_ms is {} ({size_ms} / {slide_ms}), above {max}: each event is folded into that many windows; use a longer slide_ms", size_ms / slide_ms
    )]
    TooManyWindows {
        /// The window length.
        size_ms: u64,
        /// The slide.
        slide_ms: u64,
        /// The most windows per event.
        max: u64,
    },
    /// `gap_ms` is zero.
    #[error("session window gap_ms must be positive: set it to the inactivity gap that ends a session, in ms")]
    ZeroGap,
    /// `time_field` is empty.
    #[error("window time_field is empty: name the field holding the event time in ms")]
    NoTimeField,
    /// A stream would carry two fields of one name.
    #[error(
        "window stream `{stream}` would declare field `{field}` twice (key fields, window bounds and aggregate fields must differ): rename the key field or the stream's fields"
    )]
    DuplicateField {
        /// The stream.
        stream: String,
        /// The repeated field.
        field: String,
    },
    /// The late stream and the output stream are the same.
    #[error("window late_stream and output_stream are both `{stream}`: give them different names")]
    SameStream {
        /// The stream name.
        stream: String,
    },
}

impl WindowError {
    /// Always false: fix the configuration.
    pub fn is_retryable(&self) -> bool {
        false
    }

    /// Always [`ErrorDomain::User`].
    pub fn domain(&self) -> ErrorDomain {
        ErrorDomain::User
    }
}

fn check_unique(stream: &str, fields: &[String]) -> Result<(), WindowError> {
    for (i, f) in fields.iter().enumerate() {
        if fields[..i].contains(f) {
            return Err(WindowError::DuplicateField { stream: stream.to_owned(), field: f.clone() });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::Count;

    #[test]
    fn config_validates_and_names_fields() {
        let w = TumblingWindowConfig::new(1_000, "ts", &["user", "page"]).build(Count).unwrap();
        assert_eq!(w.output_fields(), ["user", "page", "window_start_ms", "window_end_ms", "count"]);
        assert_eq!(w.late_fields(), ["user", "page", "event_ms", "window_start_ms", "window_end_ms"]);
        assert_eq!(TumblingWindowConfig::new(0, "ts", &[]).build(Count).unwrap_err(), WindowError::ZeroSize);
        assert_eq!(TumblingWindowConfig::new(1, "", &[]).build(Count).unwrap_err(), WindowError::NoTimeField);
        let e = TumblingWindowConfig::new(1, "ts", &["count"]).build(Count).unwrap_err();
        assert_eq!(e, WindowError::DuplicateField { stream: "default".into(), field: "count".into() });
        let e = TumblingWindowConfig::new(1, "ts", &["event_ms"]).build(Count).unwrap_err();
        assert_eq!(e, WindowError::DuplicateField { stream: "late".into(), field: "event_ms".into() });
        // a dropped late stream is not declared, so its fields do not matter
        assert!(TumblingWindowConfig::new(1, "ts", &["event_ms"]).late(LatePolicy::Drop).build(Count).is_ok());
        let mut c = TumblingWindowConfig::new(1, "ts", &[]);
        c.late_stream = "default".into();
        assert_eq!(c.build(Count).unwrap_err(), WindowError::SameStream { stream: "default".into() });
        assert!(!WindowError::ZeroSize.is_retryable());
        assert_eq!(WindowError::ZeroSize.domain(), ErrorDomain::User);
    }

    #[test]
    fn sliding_and_session_configs_validate() {
        let w = SlidingWindowConfig::new(1_000, 250, "ts", &["user"]).build(Count).unwrap();
        assert_eq!(w.output_fields(), ["user", "window_start_ms", "window_end_ms", "count"]);
        let bad = |size, slide| SlidingWindowConfig::new(size, slide, "ts", &[]).build(Count).unwrap_err();
        assert_eq!(bad(0, 1), WindowError::ZeroSize);
        assert_eq!(bad(10, 0), WindowError::ZeroSlide);
        assert_eq!(bad(10, 20), WindowError::SlideAboveSize { size_ms: 10, slide_ms: 20 });
        let e = bad(10, 3);
        assert_eq!(e, WindowError::SlideNotDivisor { size_ms: 10, slide_ms: 3 });
        assert!(e.to_string().contains("slide_ms (3)") && e.to_string().contains("divides"), "{e}");
        let e = bad(1_000_000, 1);
        assert!(e.to_string().contains("1000000 / 1") && e.to_string().contains("above 1000"), "{e}");
        assert_eq!(SessionWindowConfig::new(0, "ts", &[]).build(Count).unwrap_err(), WindowError::ZeroGap);
        assert!(WindowError::ZeroGap.to_string().contains("gap_ms"));
        let e = SessionWindowConfig::new(5, "ts", &["count"]).build(Count).unwrap_err();
        assert_eq!(e, WindowError::DuplicateField { stream: "default".into(), field: "count".into() });
        assert_eq!(SessionWindowConfig::new(5, "", &[]).build(Count).unwrap_err(), WindowError::NoTimeField);
    }

    #[test]
    fn config_serde_defaults_and_rejects_unknown_fields() {
        let c: TumblingWindowConfig =
            serde_json::from_str(r#"{"size_ms": 60000, "time_field": "arrival_ms", "key_fields": ["user"]}"#).unwrap();
        assert_eq!(c, TumblingWindowConfig::new(60_000, "arrival_ms", &["user"]));
        let c: TumblingWindowConfig =
            serde_json::from_str(r#"{"size_ms": 5, "time_field": "t", "late": "drop", "ack": "on_receive"}"#).unwrap();
        assert_eq!((c.late, c.ack), (LatePolicy::Drop, AckMode::OnReceive));
        let e = serde_json::from_str::<TumblingWindowConfig>(r#"{"size_ms": 5, "time_field": "t", "sise": 1}"#);
        assert!(e.unwrap_err().to_string().contains("sise"));
    }

    #[test]
    fn sliding_and_session_serde() {
        let c: SlidingWindowConfig = serde_json::from_str(
            r#"{"size_ms": 60000, "slide_ms": 10000, "time_field": "t", "allowed_lateness_ms": 5}"#,
        )
        .unwrap();
        assert_eq!(c, SlidingWindowConfig::new(60_000, 10_000, "t", &[]).allowed_lateness(5));
        let c: SessionWindowConfig =
            serde_json::from_str(r#"{"gap_ms": 30000, "time_field": "t", "key_fields": ["user"], "late": "drop"}"#)
                .unwrap();
        assert_eq!(c, SessionWindowConfig::new(30_000, "t", &["user"]).late(LatePolicy::Drop));
        let c: TumblingWindowConfig = serde_json::from_str(r#"{"size_ms": 5, "time_field": "t"}"#).unwrap();
        assert_eq!(c.allowed_lateness_ms, 0, "default: today's behaviour");
        let e = serde_json::from_str::<SessionWindowConfig>(r#"{"gap_ms": 5, "time_field": "t", "size_ms": 1}"#);
        assert!(e.unwrap_err().to_string().contains("size_ms"));
        let e = serde_json::from_str::<SlidingWindowConfig>(r#"{"size_ms": 5, "time_field": "t"}"#);
        assert!(e.unwrap_err().to_string().contains("slide_ms"), "a missing field is named");
    }
}
