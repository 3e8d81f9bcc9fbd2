//! The serde configuration of window bolts, its validation, and [`WindowError`].

use std::num::NonZeroU64;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::aggregate::WindowAggregate;
use super::bolt::{Spec, TumblingWindow, WindowStats};
use super::{EVENT_TIME_FIELD, WINDOW_END_FIELD, WINDOW_START_FIELD};
use crate::component::ErrorDomain;
use crate::tuple::DEFAULT_STREAM;

/// What happens to a late tuple (its window already fired).
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

/// The configuration of a tumbling window bolt. [`TumblingWindowConfig::build`] validates it.
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
    /// What happens to late tuples.
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

/// An invalid [`TumblingWindowConfig`]: the caller's fault ([`ErrorDomain::User`]), not
/// retryable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WindowError {
    /// `size_ms` is zero.
    #[error("tumbling window size_ms must be positive")]
    ZeroSize,
    /// `time_field` is empty.
    #[error("tumbling window time_field is empty")]
    NoTimeField,
    /// A stream would carry two fields of one name.
    #[error(
        "tumbling window stream `{stream}` would declare field `{field}` twice (key fields, window bounds and aggregate fields must differ)"
    )]
    DuplicateField {
        /// The stream.
        stream: String,
        /// The repeated field.
        field: String,
    },
    /// The late stream and the output stream are the same.
    #[error("tumbling window late_stream and output_stream are both `{stream}`")]
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

impl TumblingWindowConfig {
    /// Windows of `size_ms` over `time_field`, per `key_fields`; defaults for the rest.
    pub fn new(size_ms: u64, time_field: &str, key_fields: &[&str]) -> Self {
        TumblingWindowConfig {
            size_ms,
            time_field: time_field.to_owned(),
            key_fields: key_fields.iter().map(|f| (*f).to_owned()).collect(),
            late: LatePolicy::default(),
            late_stream: default_late_stream(),
            output_stream: default_output_stream(),
            ack: AckMode::default(),
        }
    }

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

    /// Validates the config for `aggregate` and builds the spec that makes the bolts.
    pub fn build<A: WindowAggregate>(&self, aggregate: A) -> Result<TumblingWindow<A>, WindowError> {
        let size = NonZeroU64::new(self.size_ms).ok_or(WindowError::ZeroSize)?;
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
        check_unique(&self.output_stream, &output_fields)?;
        if self.late == LatePolicy::Stream {
            if self.late_stream == self.output_stream {
                return Err(WindowError::SameStream { stream: self.late_stream.clone() });
            }
            check_unique(&self.late_stream, &late_fields)?;
        }
        Ok(TumblingWindow {
            spec: Arc::new(Spec {
                config: self.clone(),
                size,
                aggregate,
                output_fields,
                late_fields,
                stats: Arc::new(WindowStats::default()),
            }),
        })
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
}
