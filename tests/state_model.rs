//! The state table model (`squall_test_support::statemodel`, the DynamoDB of the simulator) kept
//! honest against dynalite: random sequences of the operations keyed state uses (conditional puts
//! with and without timers, freezes, timer clears, strongly consistent batch reads, timer-index
//! queries, scope scans), run through the same `StateApi` against a fresh dynalite table and the
//! model from the same seed; every answer is compared. A failure prints the seed, the step and
//! both answers. `SQUALL_STATE_MODEL_SEEDS` (default 6) sequences of 40 steps, or
//! `SQUALL_STATE_MODEL_SEED` for one.
//!
//! What the comparison leaves out: `updated_ms` (never read back), and the timer index's lag
//! (dynalite's index is immediately consistent; the model runs with none here, and the simulator
//! gives it one).

use squall_test_support as support;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use squall::state::{NewItem, StateApi, StateStore, TimerAt};
use support::statemodel::LocalState;

const PKS: [&str; 5] = ["s/a", "s/b", "s/c", "t/a", "t/d"];

fn scope_of(pk: &str) -> &str {
    pk.split('/').next().unwrap_or("")
}

fn key_of(pk: &str) -> &str {
    pk.split('/').nth(1).unwrap_or("")
}

async fn run_sequence(seed: u64, steps: usize) {
    let url = support::state_endpoint();
    let table = support::unique_name("statemodel");
    let real = support::state::open(&url, &table).await;
    let model = LocalState::default();
    let mut rng = StdRng::seed_from_u64(seed);
    let api_real: &StateStore = &real;
    for step in 0..steps {
        let pk = PKS[rng.random_range(0..PKS.len())];
        let (what, a, b): (String, String, String) = match rng.random_range(0..6) {
            0 | 1 => {
                // a put: at the version the model holds, a wrong one, or "absent"
                let held = model.get_many(&[pk.to_string()]).await.unwrap().get(pk).map(|i| i.version);
                let expected = match rng.random_range(0..4) {
                    0 => None,
                    1 => Some(rng.random_range(1..4)),
                    _ => held,
                };
                let timer = rng.random_bool(0.5).then(|| TimerAt {
                    partition: format!("{}#{}", scope_of(pk), rng.random_range(0..2)),
                    fire_at: rng.random_range(0..100),
                });
                let state = vec![rng.random::<u8>(); rng.random_range(0..4)];
                let dedup = vec![rng.random::<u8>(); rng.random_range(0..4)];
                let a = api_real
                    .put(pk, scope_of(pk), key_of(pk), expected, state.clone(), dedup.clone(), timer.as_ref())
                    .await;
                let item = NewItem {
                    pk,
                    scope: scope_of(pk),
                    key: key_of(pk),
                    expected,
                    state: state.clone(),
                    dedup: dedup.clone(),
                    timer: timer.as_ref(),
                    updated_ms: 0,
                };
                let b = model.put(item).await;
                (format!("put {pk} expected {expected:?} timer {timer:?}"), format!("{a:?}"), format!("{b:?}"))
            }
            2 => {
                let held = model.get_many(&[pk.to_string()]).await.unwrap().get(pk).map(|i| i.version);
                let expected = if rng.random_bool(0.7) { held.unwrap_or(1) } else { rng.random_range(1..4) };
                let a = api_real.freeze(pk, expected, "task-1").await;
                // the real store stamps its own clock: compare the rest
                let b = model.freeze(pk, expected, "task-1", 0).await;
                (format!("freeze {pk} at {expected}"), format!("{a:?}"), format!("{b:?}"))
            }
            3 => {
                let a = api_real.clear_timer(pk).await;
                let b = model.clear_timer(pk).await;
                (format!("clear_timer {pk}"), format!("{a:?}"), format!("{b:?}"))
            }
            4 => {
                let part = format!("{}#{}", ["s", "t"][rng.random_range(0..2)], rng.random_range(0..2));
                let (upto, limit) = (rng.random_range(0..120), rng.random_range(1..4));
                // Items with the same sort key come in no promised order (dynalite's is not the
                // table key's): compare the fire times in order, and the items themselves when
                // the limit did not cut a group of equal times.
                let view = |r: Result<Vec<(String, i64)>, squall::state::StateError>| {
                    r.map(|mut v| {
                        let cut = v.len() == limit;
                        v.sort_by(|x, y| x.1.cmp(&y.1).then_with(|| x.0.cmp(&y.0)));
                        let times: Vec<i64> = v.iter().map(|(_, t)| *t).collect();
                        (times, if cut { Vec::new() } else { v })
                    })
                };
                let a = view(api_real.due_timers(&part, upto, limit).await);
                let b = view(model.due_timers(&part, upto, limit).await);
                (format!("due_timers {part} upto {upto} limit {limit}"), format!("{a:?}"), format!("{b:?}"))
            }
            _ => {
                if rng.random_bool(0.5) {
                    let pks: Vec<String> = PKS.iter().filter(|_| rng.random_bool(0.6)).map(|p| p.to_string()).collect();
                    let sorted = |r: Result<std::collections::HashMap<String, squall::state::StoredItem>, _>| {
                        r.map(|m| {
                            let mut v: Vec<_> = m
                                .into_iter()
                                .map(|(k, mut i)| {
                                    i.fired_at_ms = i.fired_at_ms.map(|_| 0);
                                    (k, i)
                                })
                                .collect();
                            v.sort_by(|x, y| x.0.cmp(&y.0));
                            v
                        })
                    };
                    let a = sorted(api_real.get_many(&pks).await);
                    let b = sorted(model.get_many(&pks).await);
                    (format!("get_many {pks:?}"), format!("{a:?}"), format!("{b:?}"))
                } else {
                    let scope = ["s", "t"][rng.random_range(0..2)];
                    let sorted = |r: Result<Vec<squall::state::ScopeItem>, _>| {
                        r.map(|mut v| {
                            v.sort();
                            v
                        })
                    };
                    let a = sorted(api_real.scan_scope(scope).await);
                    let b = sorted(model.scan_scope(scope).await);
                    (format!("scan_scope {scope}"), format!("{a:?}"), format!("{b:?}"))
                }
            }
        };
        if a != b {
            support::state::delete_table(&real).await;
        }
        assert_eq!(a, b, "seed {seed}, step {step}: {what}: dynalite (left) and the model (right) differ");
    }
    support::state::delete_table(&real).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_model_answers_as_dynalite_does() {
    let seeds: Vec<u64> = match std::env::var("SQUALL_STATE_MODEL_SEED") {
        Ok(s) => vec![s.parse().expect("SQUALL_STATE_MODEL_SEED is a number")],
        Err(_) => {
            (1..=std::env::var("SQUALL_STATE_MODEL_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(6)).collect()
        }
    };
    for seed in seeds {
        run_sequence(seed, 40).await;
    }
}
