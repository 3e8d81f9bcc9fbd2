//! What the Kinesis service's clock says, learned from the `Date` header of its answers (every
//! client [`super::KinesisEndpoint::client`] builds records it), per endpoint.
//!
//! A start position taken from this worker's clock is wrong by however far that clock is off the
//! service's: LATEST is persisted as AT_TIMESTAMP(first start), and a worker 60 s ahead would skip
//! the first minute of records, its GetShardIterator refused ("Timestamp cannot be in the future")
//! until then. So LATEST takes the service's time when the worker's clock is off by more than
//! what a `Date` header can tell (see [`latest_start_ms`]).
//!
//! A `Date` header has a resolution of 1 s, truncated: the service's clock, when the answer
//! arrives, is at or after it. Each answer bounds the service's clock from below by
//! `date - local time of receipt` added to the local clock ([`service_now_lower`]); the largest
//! such bound of the last 10 minutes is kept, and dropped for a new one when they disagree by more
//! than 2 s (a clock was stepped). The largest bound is tight (within the answer's travel time)
//! when an answer comes just after the service's clock ticked to a new second: a few answers
//! spread over a second sharpen it from 1 s to the spacing between them
//! (`ShardSource::sharpen_service_clock`: 50 ms).

use std::collections::HashMap;
use std::sync::Mutex;

use aws_sdk_kinesis::config::interceptors::BeforeDeserializationInterceptorContextRef;
use aws_sdk_kinesis::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_kinesis::primitives::{DateTime, DateTimeFormat};

use crate::coord::now_ms;

/// How long an observation stays usable.
const KEEP_MS: i64 = 10 * 60 * 1000;
/// The resolution of a `Date` header.
pub const DATE_RESOLUTION_MS: i64 = 1_000;
/// Two lower bounds further apart than this mean a clock was stepped: the newer one wins.
const STEP_MS: i64 = 2 * DATE_RESOLUTION_MS;

#[derive(Debug, Clone, Copy)]
struct Bound {
    /// The service's clock minus the local clock is at least this.
    offset_ms: i64,
    /// Local time of the observation that set it.
    at_ms: i64,
}

fn bounds() -> &'static Mutex<HashMap<String, Bound>> {
    static B: std::sync::OnceLock<Mutex<HashMap<String, Bound>>> = std::sync::OnceLock::new();
    B.get_or_init(Default::default)
}

/// Notes an answer from `endpoint` dated `date_ms` (its `Date` header) received at local time
/// `local_ms`.
pub(crate) fn observe(endpoint: &str, date_ms: i64, local_ms: i64) {
    let offset_ms = date_ms - local_ms;
    let mut b = bounds().lock().unwrap_or_else(|p| p.into_inner());
    let keep = match b.get(endpoint) {
        Some(old) => {
            local_ms - old.at_ms < KEEP_MS && old.offset_ms >= offset_ms && old.offset_ms - offset_ms <= STEP_MS
        }
        None => false,
    };
    if !keep {
        b.insert(endpoint.to_string(), Bound { offset_ms, at_ms: local_ms });
    }
}

/// A lower bound of the service's clock now (ms since the epoch), from `endpoint`'s answers of
/// the last 10 minutes; `None` before any.
pub fn service_now_lower(endpoint: &str) -> Option<i64> {
    let now = now_ms();
    let b = bounds().lock().unwrap_or_else(|p| p.into_inner());
    b.get(endpoint).filter(|o| now - o.at_ms < KEEP_MS).map(|o| now + o.offset_ms)
}

/// The time to persist LATEST as, given this worker's clock `now` and a lower bound of the
/// service's clock `service_lower` (the spout sharpens it to about 50 ms first): the service's
/// bound whenever there is one, and the skew (worker minus bound) when the two differ by more than
/// a `Date` header can tell (1 s), to be warned about; `now` when there is no bound.
///
/// The bound is never later than the service's true time, so nothing written after the first
/// start is skipped, whatever this worker's clock says; at most the bound's error (about 50 ms
/// once sharpened) is read from before it. A worker's own time, even one ahead by less than the
/// header's resolution, would skip what was written in the moment it is ahead (the simulator's
/// seed 650: a worker 525 ms ahead skipped the records of the first 525 ms).
pub fn latest_start_ms(now: i64, service_lower: Option<i64>) -> (i64, Option<i64>) {
    match service_lower {
        Some(s) => (s, ((now - s).abs() > DATE_RESOLUTION_MS).then_some(now - s)),
        None => (now, None),
    }
}

/// The interceptor that records each answer's `Date` header for [`observe`].
#[derive(Debug)]
pub(crate) struct DateHeader {
    /// The endpoint's label (what `ShardSource` and errors name it by).
    pub endpoint: String,
}

impl Intercept for DateHeader {
    fn name(&self) -> &'static str {
        "squall::kinesis::clock::DateHeader"
    }

    fn read_after_transmit(
        &self,
        context: &BeforeDeserializationInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let date = context.response().headers().get("date");
        if let Some(t) = date.and_then(|d| DateTime::from_str(d, DateTimeFormat::HttpDate).ok())
            && let Ok(ms) = t.to_millis()
        {
            observe(&self.endpoint, ms, now_ms());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tightest_recent_lower_bound_is_kept_and_a_step_replaces_it() {
        let ep = "test://bounds";
        observe(ep, 10_000, 10_400); // service >= local - 400
        observe(ep, 11_000, 10_900); // service >= local + 100: tighter
        observe(ep, 11_000, 11_700); // service >= local - 700: looser, kept the tighter
        assert_eq!(bounds().lock().unwrap()[ep].offset_ms, 100);
        observe(ep, 20_000, 25_000); // 5 s lower: a clock was stepped
        assert_eq!(bounds().lock().unwrap()[ep].offset_ms, -5_000);
        // an observation older than 10 minutes is replaced
        observe(ep, 25_000 + KEEP_MS, 25_000 + KEEP_MS + 10_000);
        assert_eq!(bounds().lock().unwrap()[ep].offset_ms, -10_000);
        assert!(service_now_lower("test://never").is_none());
    }

    #[test]
    fn latest_takes_the_service_time_and_says_when_the_worker_clock_is_clearly_off() {
        // in step within the header's resolution: the service's bound, nothing to say
        assert_eq!(latest_start_ms(10_000, Some(9_300)), (9_300, None));
        assert_eq!(latest_start_ms(10_000, Some(10_000)), (10_000, None));
        // ahead by less than the resolution: still the service's bound (the worker's own time
        // would skip what was written in the 525 ms it is ahead)
        assert_eq!(latest_start_ms(10_525, Some(10_000)), (10_000, None));
        // no answer from the service yet: the worker's own time
        assert_eq!(latest_start_ms(10_000, None), (10_000, None));
        // 60 s ahead: the service's
        assert_eq!(latest_start_ms(70_000, Some(10_000)), (10_000, Some(60_000)));
        // behind the service's lower bound: the service's
        assert_eq!(latest_start_ms(10_000, Some(12_000)), (12_000, Some(-2_000)));
    }
}
