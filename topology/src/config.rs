//! [`TopologyConfig`]: the settings of a running topology, validated once before it starts.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Settings of a running topology. Deserializes from e.g. JSON or TOML; unknown keys are rejected
/// and missing keys take their defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopologyConfig {
    /// Track tracked spout tuples through ack trees (at-least-once). When false every tracked
    /// emit is acked to the spout right after it is sent (at-most-once). Default `true`.
    pub acking: bool,
    /// A tracked tuple whose tree is not complete after this many milliseconds is failed.
    /// Default 30 000.
    pub message_timeout_ms: u64,
    /// How often a spout task checks for timed-out tuples, in milliseconds. Default 100.
    pub timeout_check_interval_ms: u64,
    /// At most this many tracked tuples in flight per spout task; `next_tuple` is not called at
    /// the limit. Default 1000.
    pub max_spout_pending: usize,
    /// Capacity, in messages (batches), of each bolt task's input channel. Default 64.
    pub channel_capacity: usize,
    /// Capacity, in messages, of each spout task's ack channel. Default 256.
    pub ack_channel_capacity: usize,
    /// Tuples per channel message: a task buffers up to this many tuples per downstream task
    /// before sending (buffers are also flushed whenever the task waits). Default 64.
    pub batch_size: usize,
    /// Longest time, in microseconds, a tuple may sit in a send buffer of a busy task. Default 1000.
    pub max_batch_delay_us: u64,
    /// How long a spout task waits, in microseconds, after a `next_tuple` call that emitted
    /// nothing, unless woken earlier. Default 1000.
    pub idle_sleep_us: u64,
    /// Start the spouts active. Default `true`.
    pub start_active: bool,
}

impl Default for TopologyConfig {
    fn default() -> Self {
        TopologyConfig {
            acking: true,
            message_timeout_ms: 30_000,
            timeout_check_interval_ms: 100,
            max_spout_pending: 1000,
            channel_capacity: 64,
            ack_channel_capacity: 256,
            batch_size: 64,
            max_batch_delay_us: 1000,
            idle_sleep_us: 1000,
            start_active: true,
        }
    }
}

/// Settings of one component, set with `.config(..)` on its declarer: overrides of the
/// topology's settings, timers, and the component's own settings (read them with
/// [`crate::TaskContext::component_config`]). Unknown keys are rejected.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ComponentConfig {
    /// A bolt's tick: `Bolt::on_timer(Timer::Tick)` every this many milliseconds. Default: no tick.
    pub tick_interval_ms: Option<u64>,
    /// A spout's own `max_spout_pending` (per task). Default: the topology's.
    pub max_spout_pending: Option<usize>,
    /// The component's own settings, free-form (e.g. a table name, a batch size).
    pub settings: std::collections::BTreeMap<String, serde_json::Value>,
}

impl ComponentConfig {
    /// Checks the values; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.tick_interval_ms == Some(0) {
            return Err(ConfigError::Invalid {
                key: "tick_interval_ms",
                value: "0".into(),
                expected: ">= 1 (or unset for no tick)",
            });
        }
        if self.max_spout_pending == Some(0) {
            return Err(ConfigError::Invalid {
                key: "max_spout_pending",
                value: "0".into(),
                expected: ">= 1 (or unset for the topology's)",
            });
        }
        Ok(())
    }

    /// Ticks every `every` (rounded to milliseconds, at least 1).
    pub fn with_tick(mut self, every: Duration) -> Self {
        self.tick_interval_ms = Some(u64::try_from(every.as_millis()).unwrap_or(u64::MAX).max(1));
        self
    }

    /// A setting by key, deserialized into `T`.
    pub fn setting<T: serde::de::DeserializeOwned>(&self, key: &str) -> Option<Result<T, serde_json::Error>> {
        self.settings.get(key).map(|v| T::deserialize(v))
    }
}

/// A configuration value out of range; names the key and the allowed range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A key is out of range.
    #[error("invalid config `{key}` = {value}: {expected}")]
    Invalid {
        /// The config key.
        key: &'static str,
        /// The rejected value.
        value: String,
        /// What is allowed.
        expected: &'static str,
    },
}

impl TopologyConfig {
    /// Checks every value; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        fn positive(key: &'static str, v: u64) -> Result<(), ConfigError> {
            if v == 0 {
                return Err(ConfigError::Invalid { key, value: v.to_string(), expected: "must be at least 1" });
            }
            Ok(())
        }
        positive("message_timeout_ms", self.message_timeout_ms)?;
        positive("timeout_check_interval_ms", self.timeout_check_interval_ms)?;
        positive("max_spout_pending", self.max_spout_pending as u64)?;
        positive("channel_capacity", self.channel_capacity as u64)?;
        positive("ack_channel_capacity", self.ack_channel_capacity as u64)?;
        positive("batch_size", self.batch_size as u64)?;
        if self.batch_size > 65_536 {
            return Err(ConfigError::Invalid {
                key: "batch_size",
                value: self.batch_size.to_string(),
                expected: "at most 65536",
            });
        }
        Ok(())
    }

    /// The message timeout as a [`Duration`].
    pub fn message_timeout(&self) -> Duration {
        Duration::from_millis(self.message_timeout_ms)
    }

    /// The timeout check interval as a [`Duration`].
    pub fn timeout_check_interval(&self) -> Duration {
        Duration::from_millis(self.timeout_check_interval_ms)
    }

    /// The idle sleep as a [`Duration`].
    pub fn idle_sleep(&self) -> Duration {
        Duration::from_micros(self.idle_sleep_us)
    }

    /// The maximum batch delay as a [`Duration`].
    pub fn max_batch_delay(&self) -> Duration {
        Duration::from_micros(self.max_batch_delay_us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_roundtrip() {
        let c = TopologyConfig::default();
        c.validate().unwrap();
        let json = serde_json::to_string(&c).unwrap();
        let back: TopologyConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(c, back);
    }

    #[test]
    fn partial_and_unknown_keys() {
        let c: TopologyConfig = serde_json::from_str(r#"{"acking": false}"#).unwrap();
        assert!(!c.acking);
        assert_eq!(c.max_spout_pending, 1000);
        let err = serde_json::from_str::<TopologyConfig>(r#"{"ackng": false}"#).unwrap_err();
        assert!(err.to_string().contains("ackng"), "{err}");
    }

    #[test]
    fn validation_names_key() {
        let c = TopologyConfig { max_spout_pending: 0, ..Default::default() };
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("max_spout_pending"), "{e}");
    }
}
