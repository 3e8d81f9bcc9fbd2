//! DynamoDB (the state table) for the simulated workers: the product's [`StateApi`] over the
//! shared model ([`squall_test_support::statemodel`]), with latency, throttling, writes applied
//! whose answer is lost (the caller sees a timeout it retries), a timer index that lags the
//! items, freezes and crashes.

use std::collections::HashMap;
use std::time::Duration;

use futures::future::BoxFuture;
use squall::state::{NewItem, ScopeItem, StateApi, StateError, StoredItem, WriteOutcome};

use crate::world::{Shared, World, lock, wait_network};

/// One worker's state table.
pub struct SimState {
    pub world: Shared,
    pub worker: u32,
}

impl SimState {
    /// One call: there, `op` on the model (unless throttled), back; a lost answer after the
    /// model applied it fails the call as a timeout would.
    async fn call<T: Send>(
        &self,
        what: String,
        op: impl FnOnce(&mut World) -> T + Send,
        said: impl Fn(&T) -> String + Send,
    ) -> Result<T, StateError> {
        let d = lock(&self.world).latency();
        tokio::time::sleep(d).await;
        wait_network(&self.world, self.worker).await;
        let (result, lost) = {
            let mut w = lock(&self.world);
            let (throttle, lose) = (w.faults.state_throttle, w.faults.state_lost_after);
            let now = w.now_ms();
            w.state.set_now(now);
            if w.faults.on && w.rng.chance(throttle) {
                w.injected("dynamodb throttled");
                w.event(format!("w{} dynamodb {what}: throttled", self.worker));
                return Err(StateError::Retryable {
                    table: "sim".into(),
                    op: "simulated",
                    message: "ProvisionedThroughputExceededException (simulated)".into(),
                });
            }
            // The timer index lags each write by up to 300 ms.
            w.state.index_lag_ms = w.rng.range(0, 300) as i64;
            let r = op(&mut w);
            let lost = w.faults.on && w.rng.chance(lose);
            if lost {
                w.injected("dynamodb answer lost");
            }
            w.event(format!(
                "w{} dynamodb {what}: {}{}",
                self.worker,
                said(&r),
                if lost { " (answer lost)" } else { "" }
            ));
            (r, lost)
        };
        if lost {
            tokio::time::sleep(Duration::from_millis(1000)).await;
            return Err(StateError::Retryable { table: "sim".into(), op: "simulated", message: "timed out".into() });
        }
        let d = lock(&self.world).latency();
        tokio::time::sleep(d).await;
        wait_network(&self.world, self.worker).await;
        Ok(result)
    }
}

impl StateApi for SimState {
    fn ensure_table(&self) -> BoxFuture<'_, Result<(), StateError>> {
        Box::pin(async { Ok(()) })
    }
    fn ensure_timer_index(&self) -> BoxFuture<'_, Result<(), StateError>> {
        Box::pin(async { Ok(()) })
    }
    fn get_many<'a>(&'a self, pks: &'a [String]) -> BoxFuture<'a, Result<HashMap<String, StoredItem>, StateError>> {
        Box::pin(self.call(
            format!("get {} items", pks.len()),
            move |w| w.state.get_many(pks),
            |r| format!("{}", r.len()),
        ))
    }
    fn put<'a>(&'a self, item: NewItem<'a>) -> BoxFuture<'a, Result<WriteOutcome, StateError>> {
        let what = format!("put {} at {:?}", item.pk, item.expected);
        Box::pin(self.call(what, move |w| w.state.put(&item), |r| format!("{r:?}")))
    }
    fn due_timers<'a>(
        &'a self,
        partition: &'a str,
        upto: i64,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(String, i64)>, StateError>> {
        Box::pin(self.call(
            format!("due timers {partition} upto {upto}"),
            move |w| w.state.due_timers(partition, upto, limit),
            |r| format!("{}", r.len()),
        ))
    }
    fn freeze<'a>(
        &'a self,
        pk: &'a str,
        expected: u64,
        by: &'a str,
        fired_ms: i64,
    ) -> BoxFuture<'a, Result<WriteOutcome, StateError>> {
        Box::pin(self.call(
            format!("freeze {pk} at {expected}"),
            move |w| w.state.freeze(pk, expected, by, fired_ms),
            |r| format!("{r:?}"),
        ))
    }
    fn clear_timer<'a>(&'a self, pk: &'a str) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(self.call(format!("clear timer {pk}"), move |w| w.state.clear_timer(pk), |_| "ok".into()))
    }
    fn scan_scope<'a>(&'a self, scope: &'a str) -> BoxFuture<'a, Result<Vec<ScopeItem>, StateError>> {
        Box::pin(self.call(format!("scan {scope}"), move |w| w.state.scan_scope(scope), |r| format!("{}", r.len())))
    }
}
