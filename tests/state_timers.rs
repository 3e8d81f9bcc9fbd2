//! Persistent timers of keyed state in the real DynamoDB stand-in (dynalite): the sparse timer
//! index, freezing a key for firing, confirming it, and adding the index to a table created
//! before timers existed.

use squall_test_support as support;

use aws_sdk_dynamodb::types::{AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType};
use squall::state::{StateStore, TIMER_INDEX, TimerAt, WriteOutcome, timer_partition};
use support::state as st;

fn timer(scope: &str, key: &str, at: i64) -> TimerAt {
    TimerAt { partition: timer_partition(scope, key, 4), fire_at: at }
}

/// Every timer due at `w` or before, over the 4 partitions of `scope`.
async fn due(store: &StateStore, scope: &str, w: i64) -> Vec<(String, i64)> {
    let mut all = Vec::new();
    for n in 0..4 {
        all.extend(store.due_timers(&format!("{scope}#{n}"), w, 1000).await.expect("query the timer index"));
    }
    all.sort();
    all
}

#[tokio::test]
async fn timers_are_found_when_due_frozen_once_and_cleared_when_confirmed() {
    let table = st::unique_table("timers");
    let store = st::open(&support::state_endpoint(), &table).await;
    let scope = "topo/win";
    let pk = |k: &str| format!("{scope}/{k}");
    for (k, at) in [("a@0", 1000), ("b@0", 1000), ("a@1000", 2000), ("plain", 0)] {
        let t = (k != "plain").then(|| timer(scope, k, at));
        let w = store.put(&pk(k), scope, k, None, b"1".to_vec(), b"{}".to_vec(), t.as_ref()).await.unwrap();
        assert_eq!(w, WriteOutcome::Written);
    }
    // the index is eventually consistent in DynamoDB; dynalite answers at once
    assert_eq!(due(&store, scope, 999).await, vec![], "nothing is due before the first fire time");
    assert_eq!(due(&store, scope, 1000).await, vec![(pk("a@0"), 1000), (pk("b@0"), 1000)]);
    assert_eq!(due(&store, scope, 5000).await.len(), 3, "a key without a timer is not in the index");

    // freezing is conditional on the version read
    assert_eq!(
        store.freeze(&pk("a@0"), 7, "task-0000000000").await.unwrap(),
        WriteOutcome::Conflict,
        "a stale version"
    );
    assert_eq!(store.freeze(&pk("a@0"), 1, "task-0000000000").await.unwrap(), WriteOutcome::Written);
    let items = store.get_many(&[pk("a@0"), pk("b@0")]).await.unwrap();
    assert!(items[&pk("a@0")].fired && items[&pk("a@0")].version == 2, "{:?}", items[&pk("a@0")]);
    assert!(!items[&pk("b@0")].fired);
    // a write of the key that read it before the freeze conflicts (and then sees it fired)
    let racing = store.put(&pk("a@0"), scope, "a@0", Some(1), b"2".to_vec(), b"{}".to_vec(), None).await.unwrap();
    assert_eq!(racing, WriteOutcome::Conflict);
    // frozen but not confirmed: still found, so a firing that was not delivered is found again
    assert_eq!(due(&store, scope, 1000).await.len(), 2);

    store.clear_timer(&pk("a@0")).await.unwrap();
    store.clear_timer(&pk("a@0")).await.expect("clearing twice is fine");
    assert_eq!(due(&store, scope, 1000).await, vec![(pk("b@0"), 1000)]);
    // an unfired key's timer is not cleared by mistake
    store.clear_timer(&pk("b@0")).await.unwrap();
    assert_eq!(due(&store, scope, 1000).await, vec![(pk("b@0"), 1000)]);
    let items = store.get_many(&[pk("a@0")]).await.unwrap();
    assert_eq!(items[&pk("a@0")].state, b"1", "the frozen state is kept");
    st::delete_table(&store).await;
}

/// A table created before timers existed: `ensure_timer_index` adds the index where DynamoDB
/// can (AWS), and where it cannot (dynalite accepts UpdateTable but adds nothing) the error names
/// the table, the index and the fix.
#[tokio::test]
async fn a_table_created_without_the_timer_index_gets_it_or_a_clear_error() {
    let table = st::unique_table("timers-old");
    let ep = st::endpoint(&support::state_endpoint(), &table);
    let client = ep.client().await.unwrap();
    client
        .create_table()
        .table_name(&table)
        .attribute_definitions(
            AttributeDefinition::builder().attribute_name("pk").attribute_type(ScalarAttributeType::S).build().unwrap(),
        )
        .key_schema(KeySchemaElement::builder().attribute_name("pk").key_type(KeyType::Hash).build().unwrap())
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .expect("create a table the old way");
    let store = st::open(&support::state_endpoint(), &table).await;
    match store.ensure_timer_index().await {
        Ok(()) => {
            let scope = "topo/win";
            let t = timer(scope, "k@0", 10);
            let pk = format!("{scope}/k@0");
            store.put(&pk, scope, "k@0", None, b"1".to_vec(), b"{}".to_vec(), Some(&t)).await.unwrap();
            assert_eq!(due(&store, scope, 10).await, vec![(pk, 10)]);
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&table) && msg.contains(TIMER_INDEX) && msg.contains("use a new table"),
                "the error names the table, the index and the fix: {msg}"
            );
        }
    }
    // a table made by StateStore::open has the index from the start
    let fresh = st::open(&support::state_endpoint(), &st::unique_table("timers-new")).await;
    fresh.ensure_timer_index().await.expect("a new table has the timer index");
    st::delete_table(&fresh).await;
    st::delete_table(&store).await;
}

#[test]
fn timer_partitions_are_stable_and_spread() {
    // the same in every process: a firer and a bolt of different builds agree
    assert_eq!(timer_partition("t/c", "user-1@60000", 8), timer_partition("t/c", "user-1@60000", 8));
    let parts: std::collections::BTreeSet<String> =
        (0..200).map(|i| timer_partition("t/c", &format!("k{i}@0"), 8)).collect();
    assert_eq!(parts.len(), 8, "200 keys reach all 8 partitions: {parts:?}");
    assert!(parts.iter().all(|p| p.starts_with("t/c#")));
}

/// Counts per `{partition_key}@{window start}` of 1 s windows, firing at the window's end.
struct WindowCount;

impl squall::state::KeyedState for WindowCount {
    type State = u64;
    type Out = ();
    fn key(&self, t: &squall::topology::Tuple) -> Result<String, squall::topology::ComponentError> {
        let at = t.get_i64("arrival_ms")?;
        Ok(format!("{}@{}", t.get_str("partition_key")?, at - at % 1000))
    }
    fn apply(
        &mut self,
        _key: &str,
        n: &mut u64,
        _t: &squall::topology::Tuple,
        _out: &mut Vec<()>,
    ) -> Result<(), squall::topology::ComponentError> {
        *n += 1;
        Ok(())
    }
    fn timer(&self, key: &str, _n: &u64) -> Option<i64> {
        key.rsplit_once('@').and_then(|(_, s)| s.parse::<i64>().ok()).map(|s| s + 1000)
    }
}

/// The bolt side, driven by the engine's test harness against dynalite: a commit writes the
/// key's timer; once the key fired (frozen), a new input is late (acked, not applied) and a
/// replayed one is still recognized as a duplicate.
#[tokio::test]
async fn a_commit_sets_the_timer_and_inputs_after_the_firing_are_late() {
    use squall::state::{ExactlyOnce, StateConfig};
    use squall::topology::testing::BoltHarness;
    use squall::topology::{Value, Values};

    let table = st::unique_table("timers-late");
    let store = st::open(&support::state_endpoint(), &table).await;
    let cfg = StateConfig::new(st::endpoint(&support::state_endpoint(), &table));
    let fields =
        ["shard_id", "sequence_number", "sub_sequence", "lease_token", "checkpoint", "partition_key", "arrival_ms"];
    let mut h = BoltHarness::new(ExactlyOnce::new(cfg, WindowCount))
        .input("spout", "default", &fields)
        .prepare()
        .await
        .expect("prepare (opens the table)");
    let rec = |seq: u64, at: i64| -> Values {
        vec![
            Value::from("shardId-000000000000"),
            Value::from(format!("{seq:056}")),
            Value::UInt(0),
            Value::UInt(1),
            Value::from(""),
            Value::from("k"),
            Value::Int(at),
        ]
        .into()
    };
    for seq in 1..=3 {
        h.execute(rec(seq, 5_000 + seq as i64)).await.unwrap();
    }
    // past the commit interval (50 ms): the round is committed
    h.advance(std::time::Duration::from_millis(100)).await.unwrap();
    assert_eq!((h.acked().len(), h.failed().len()), (3, 0));
    let scope = squall::state::scope(h.context().topology_name(), h.context().component_id());
    let pk = format!("{scope}/k@5000");
    assert_eq!(due(&store, &scope, 5_999).await, vec![], "the window [5000, 6000) is not due before its end");
    assert_eq!(due(&store, &scope, 6_000).await, vec![(pk.clone(), 6_000)], "the commit wrote the timer");

    // the firer freezes it
    let version = store.get_many(std::slice::from_ref(&pk)).await.unwrap()[&pk].version;
    assert_eq!(store.freeze(&pk, version, "task-0000000000").await.unwrap(), WriteOutcome::Written);
    // a new input of the window, and a replay of one already applied
    h.execute(rec(4, 5_500)).await.unwrap();
    h.execute(rec(2, 5_002)).await.unwrap();
    h.drain().await.unwrap();
    assert_eq!((h.acked().len(), h.failed().len()), (5, 0), "late and duplicate inputs are acked");
    let item = store.get_many(std::slice::from_ref(&pk)).await.unwrap()[&pk].clone();
    assert_eq!((item.state.as_slice(), item.fired, item.version), (&b"3"[..], true, version + 1), "frozen at 3");
    assert_eq!(h.context().counter("state_late").get(), 1, "one late input counted");
    assert_eq!(h.context().counter("state_duplicates").get(), 1, "the replay recognized");
    st::delete_table(&store).await;
}
