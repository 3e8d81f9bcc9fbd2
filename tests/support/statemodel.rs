//! An in-memory model of the DynamoDB state table as `squall::state::StateStore` uses it: one
//! item per key with a version, conditional writes (put if the version is still the one read, or
//! if absent; freeze if the version is still the one read; clear a timer if fired), strongly
//! consistent reads, a scan of a scope, and the sparse timer index, which DynamoDB keeps
//! *eventually* consistent: a change reaches the index after `index_lag_ms` (0 by default; the
//! simulator draws it per write). Kept honest by `tests/state_model.rs`, which runs random
//! operation sequences against it and against dynalite through the same `StateApi` and compares
//! every answer (dynalite's index is immediately consistent, so that test runs it with no lag).
//!
//! What it does not model: item size limits (the bolt checks them before writing), throttling and
//! lost answers (the simulator injects them), table creation.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use squall::state::{NewItem, ScopeItem, StateApi, StateError, StoredItem, TimerAt, WriteOutcome};

#[derive(Clone, Debug, PartialEq)]
struct Item {
    scope: String,
    key: String,
    stored: StoredItem,
}

/// The model table.
#[derive(Default)]
pub struct StateModel {
    items: BTreeMap<String, Item>,
    /// The timer index as queries see it: pk -> timer.
    index: BTreeMap<String, TimerAt>,
    /// Index changes not visible yet: (visible from ms, pk, the item's timer then).
    pending: Vec<(i64, String, Option<TimerAt>)>,
    /// The clock (ms), moved by the caller.
    now_ms: i64,
    /// How long an item's change takes to reach the index.
    pub index_lag_ms: i64,
}

impl StateModel {
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock: index changes due by then become visible.
    pub fn set_now(&mut self, ms: i64) {
        self.now_ms = ms;
        let (due, later): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.pending).into_iter().partition(|(at, ..)| *at <= ms);
        self.pending = later;
        for (_, pk, timer) in due {
            match timer {
                Some(t) => self.index.insert(pk, t),
                None => self.index.remove(&pk),
            };
        }
    }

    fn index_change(&mut self, pk: &str, timer: Option<TimerAt>) {
        self.pending.push((self.now_ms + self.index_lag_ms, pk.to_string(), timer));
        let now = self.now_ms;
        self.set_now(now);
    }

    pub fn get_many(&self, pks: &[String]) -> HashMap<String, StoredItem> {
        pks.iter().filter_map(|pk| self.items.get(pk).map(|i| (pk.clone(), i.stored.clone()))).collect()
    }

    pub fn put(&mut self, item: &NewItem<'_>) -> WriteOutcome {
        let current = self.items.get(item.pk).map(|i| i.stored.version);
        let ok = match (item.expected, current) {
            (None, None) => true,
            (Some(v), Some(c)) => v == c,
            _ => false,
        };
        if !ok {
            return WriteOutcome::Conflict;
        }
        // PutItem replaces the whole item: a fired flag or timer not written is gone.
        let stored = StoredItem {
            version: item.expected.map_or(1, |v| v + 1),
            state: item.state.clone(),
            dedup: item.dedup.clone(),
            fired: false,
            fired_at_ms: None,
            fired_by: None,
            timer: item.timer.cloned(),
        };
        self.items.insert(
            item.pk.to_string(),
            Item { scope: item.scope.to_string(), key: item.key.to_string(), stored: stored.clone() },
        );
        self.index_change(item.pk, stored.timer);
        WriteOutcome::Written
    }

    pub fn due_timers(&self, partition: &str, upto: i64, limit: usize) -> Vec<(String, i64)> {
        let mut due: Vec<(String, i64)> = self
            .index
            .iter()
            .filter(|(_, t)| t.partition == partition && t.fire_at <= upto)
            .map(|(pk, t)| (pk.clone(), t.fire_at))
            .collect();
        // by the index's sort key; DynamoDB promises no order among equal ones (the model takes
        // the table's key, dynalite another)
        due.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        due.truncate(limit);
        due
    }

    pub fn freeze(&mut self, pk: &str, expected: u64, by: &str, fired_ms: i64) -> WriteOutcome {
        match self.items.get_mut(pk) {
            Some(i) if i.stored.version == expected => {
                i.stored.fired = true;
                i.stored.version = expected + 1;
                i.stored.fired_at_ms = Some(fired_ms);
                i.stored.fired_by = Some(by.to_string());
                WriteOutcome::Written
            }
            _ => WriteOutcome::Conflict,
        }
    }

    pub fn clear_timer(&mut self, pk: &str) {
        let cleared = match self.items.get_mut(pk) {
            Some(i) if i.stored.fired => {
                i.stored.timer = None;
                true
            }
            _ => false,
        };
        if cleared {
            self.index_change(pk, None);
        }
    }

    pub fn scan_scope(&self, scope: &str) -> Vec<ScopeItem> {
        self.items
            .values()
            .filter(|i| i.scope == scope)
            .map(|i| (i.key.clone(), i.stored.version, i.stored.state.clone()))
            .collect()
    }

    /// Every item: (pk, scope, key, stored) (for checks).
    pub fn items(&self) -> Vec<(String, String, String, StoredItem)> {
        self.items.iter().map(|(pk, i)| (pk.clone(), i.scope.clone(), i.key.clone(), i.stored.clone())).collect()
    }
}

/// The model as a [`StateApi`], answering at once (the differential test's side).
#[derive(Clone, Default)]
pub struct LocalState(pub Arc<Mutex<StateModel>>);

impl LocalState {
    fn m(&self) -> std::sync::MutexGuard<'_, StateModel> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl StateApi for LocalState {
    fn ensure_table(&self) -> BoxFuture<'_, Result<(), StateError>> {
        Box::pin(async { Ok(()) })
    }
    fn ensure_timer_index(&self) -> BoxFuture<'_, Result<(), StateError>> {
        Box::pin(async { Ok(()) })
    }
    fn get_many<'a>(&'a self, pks: &'a [String]) -> BoxFuture<'a, Result<HashMap<String, StoredItem>, StateError>> {
        Box::pin(async move { Ok(self.m().get_many(pks)) })
    }
    fn put<'a>(&'a self, item: NewItem<'a>) -> BoxFuture<'a, Result<WriteOutcome, StateError>> {
        Box::pin(async move { Ok(self.m().put(&item)) })
    }
    fn due_timers<'a>(
        &'a self,
        partition: &'a str,
        upto: i64,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(String, i64)>, StateError>> {
        Box::pin(async move { Ok(self.m().due_timers(partition, upto, limit)) })
    }
    fn freeze<'a>(
        &'a self,
        pk: &'a str,
        expected: u64,
        by: &'a str,
        fired_ms: i64,
    ) -> BoxFuture<'a, Result<WriteOutcome, StateError>> {
        Box::pin(async move { Ok(self.m().freeze(pk, expected, by, fired_ms)) })
    }
    fn clear_timer<'a>(&'a self, pk: &'a str) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(async move {
            self.m().clear_timer(pk);
            Ok(())
        })
    }
    fn scan_scope<'a>(&'a self, scope: &'a str) -> BoxFuture<'a, Result<Vec<ScopeItem>, StateError>> {
        Box::pin(async move { Ok(self.m().scan_scope(scope)) })
    }
}
