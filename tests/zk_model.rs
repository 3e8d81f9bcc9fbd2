//! The ZooKeeper model (`squall_test_support::zkmodel`, the server of the simulator) kept honest
//! against the real ZooKeeper: random sequences of the operations Squall uses (creates of every
//! mode Squall uses, deletes and sets with and without versions, reads, listings, one-shot
//! watches, `multi`, a session closed with its ephemeral nodes), from two sessions, run against
//! both from the same seed; every answer is compared (errors, created paths with their sequence
//! numbers, data, versions, child versions and counts, ephemeral owners, children, and which
//! watches fired with what). A failure prints the seed, the step and both answers.
//!
//! What the comparison leaves out: zxid and time values (the model counts its own; the real
//! server's depend on everything else it serves), and the order in which the real client
//! delivers watch events (only what fired, checked at the end of a sequence).

use squall_test_support as support;

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::zkmodel::{Event, Mode, Op, OpResult, ZkModel};
use zookeeper_client as zk;

const NAMES: [&str; 7] = ["a", "b", "c", "a/x", "a/y", "b/x", "q/s-"];

fn create_mode(m: Mode) -> zk::CreateMode {
    match m {
        Mode::Persistent => zk::CreateMode::Persistent,
        Mode::Ephemeral => zk::CreateMode::Ephemeral,
        Mode::PersistentSequential => zk::CreateMode::PersistentSequential,
        Mode::EphemeralSequential => zk::CreateMode::EphemeralSequential,
    }
}

/// What the comparison looks at in a stat.
fn stat(s: &zk::Stat, owner: &dyn Fn(i64) -> &'static str) -> String {
    format!(
        "v{} cv{} n{} len{} owner {}",
        s.version,
        s.cversion,
        s.num_children,
        s.data_length,
        if s.ephemeral_owner == 0 { "-" } else { owner(s.ephemeral_owner) }
    )
}

fn err(e: &zk::Error) -> String {
    match e {
        zk::Error::BadArguments(_) => "BadArguments".into(),
        other => format!("{other:?}"),
    }
}

fn event(e: &zk::WatchedEvent) -> Event {
    match e.event_type {
        zk::EventType::NodeCreated => Event::Created,
        zk::EventType::NodeDeleted => Event::Deleted,
        zk::EventType::NodeDataChanged => Event::DataChanged,
        zk::EventType::NodeChildrenChanged => Event::ChildrenChanged,
        _ => Event::SessionEnded,
    }
}

/// One random step.
#[derive(Debug, Clone)]
enum Step {
    Create(usize, String, Vec<u8>, Mode),
    Delete(usize, String, Option<i32>),
    Set(usize, String, Vec<u8>, Option<i32>),
    Get(usize, String),
    Exists(usize, String),
    Children(usize, String),
    WatchExists(usize, String),
    WatchData(usize, String),
    WatchChildren(usize, String),
    Multi(usize, Vec<Op>),
}

fn random_step(rng: &mut StdRng, root: &str, created: &[String]) -> Step {
    let s = rng.random_range(0..2usize);
    let pick = |rng: &mut StdRng| -> String {
        if !created.is_empty() && rng.random_bool(0.5) {
            created[rng.random_range(0..created.len())].clone()
        } else {
            format!("{root}/{}", NAMES[rng.random_range(0..NAMES.len())])
        }
    };
    let data = |rng: &mut StdRng| -> Vec<u8> { (0..rng.random_range(0..6)).map(|_| rng.random::<u8>()).collect() };
    let version = |rng: &mut StdRng| -> Option<i32> {
        match rng.random_range(0..3) {
            0 => None,
            1 => Some(0),
            _ => Some(rng.random_range(0..3)),
        }
    };
    let mode = |rng: &mut StdRng| -> Mode {
        [Mode::Persistent, Mode::Ephemeral, Mode::PersistentSequential, Mode::EphemeralSequential]
            [rng.random_range(0..4usize)]
    };
    match rng.random_range(0..20) {
        0..=5 => {
            let p = format!("{root}/{}", NAMES[rng.random_range(0..NAMES.len())]);
            Step::Create(s, p, data(rng), mode(rng))
        }
        6..=8 => Step::Delete(s, pick(rng), version(rng)),
        9..=10 => Step::Set(s, pick(rng), data(rng), version(rng)),
        11 => Step::Get(s, pick(rng)),
        12 => Step::Exists(s, pick(rng)),
        13 => Step::Children(s, if rng.random_bool(0.5) { root.to_string() } else { pick(rng) }),
        14 => Step::WatchExists(s, pick(rng)),
        15 => Step::WatchData(s, pick(rng)),
        16 => Step::WatchChildren(s, if rng.random_bool(0.5) { root.to_string() } else { pick(rng) }),
        _ => {
            let n = rng.random_range(1..4);
            let ops = (0..n)
                .map(|_| match rng.random_range(0..4) {
                    0 => Op::Check { path: pick(rng), version: rng.random_range(0..2) },
                    1 => Op::Create {
                        path: format!("{root}/{}", NAMES[rng.random_range(0..NAMES.len())]),
                        data: data(rng),
                        mode: [Mode::Persistent, Mode::Ephemeral, Mode::PersistentSequential][rng.random_range(0..3)],
                    },
                    2 => Op::SetData { path: pick(rng), data: data(rng), version: version(rng) },
                    _ => Op::Delete { path: pick(rng), version: version(rng) },
                })
                .collect();
            Step::Multi(s, ops)
        }
    }
}

async fn run_seed(seed: u64, steps: usize) {
    let connect = support::zk_connect();
    let root = format!("/squall-zkmodel-{}", uuid::Uuid::new_v4().simple());
    let real = [zk::Client::connect(&connect).await.unwrap(), zk::Client::connect(&connect).await.unwrap()];
    let ids = [real[0].session_id().0, real[1].session_id().0];
    let real_owner = move |id: i64| {
        if id == ids[0] {
            "A"
        } else if id == ids[1] {
            "B"
        } else {
            "?"
        }
    };
    let mut model = ZkModel::new();
    let sessions = [model.open_session(), model.open_session()];
    let model_owner = move |id: i64| {
        if id == sessions[0] {
            "A"
        } else if id == sessions[1] {
            "B"
        } else {
            "?"
        }
    };
    // the test's root, and `q` for the sequential nodes, in both
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    real[0].create(&root, b"", &persistent).await.unwrap();
    real[0].create(&format!("{root}/q"), b"", &persistent).await.unwrap();
    // the model has no /squall-zkmodel-* parent of its own: make the root's chain
    model.create(sessions[0], &root, b"", Mode::Persistent).unwrap();
    model.create(sessions[0], &format!("{root}/q"), b"", Mode::Persistent).unwrap();

    let mut rng = StdRng::seed_from_u64(seed);
    let mut created: Vec<String> = Vec::new();
    let mut real_watches: Vec<(String, zk::OneshotWatcher)> = Vec::new();
    let mut model_watches: Vec<(String, tokio::sync::oneshot::Receiver<Event>)> = Vec::new();
    let mut trace = Vec::new();
    for i in 0..steps {
        let step = random_step(&mut rng, &root, &created);
        let (r, m) = match &step {
            Step::Create(s, path, data, mode) => {
                let opts = create_mode(*mode).with_acls(zk::Acls::anyone_all());
                let r = match real[*s].create(path, data, &opts).await {
                    Ok((st, seq)) => {
                        let full = if matches!(mode, Mode::PersistentSequential | Mode::EphemeralSequential) {
                            format!("{path}{seq}")
                        } else {
                            path.clone()
                        };
                        created.push(full.clone());
                        format!("created {full} {}", stat(&st, &real_owner))
                    }
                    Err(e) => err(&e),
                };
                let m = match model.create(sessions[*s], path, data, *mode) {
                    Ok((full, st)) => format!("created {full} {}", stat(&st, &model_owner)),
                    Err(e) => err(&e),
                };
                (r, m)
            }
            Step::Delete(s, path, v) => (
                real[*s].delete(path, *v).await.map_or_else(|e| err(&e), |()| "deleted".into()),
                model.delete(sessions[*s], path, *v).map_or_else(|e| err(&e), |()| "deleted".into()),
            ),
            Step::Set(s, path, data, v) => (
                real[*s].set_data(path, data, *v).await.map_or_else(|e| err(&e), |st| stat(&st, &real_owner)),
                model.set_data(sessions[*s], path, data, *v).map_or_else(|e| err(&e), |st| stat(&st, &model_owner)),
            ),
            Step::Get(s, path) => (
                real[*s]
                    .get_data(path)
                    .await
                    .map_or_else(|e| err(&e), |(d, st)| format!("{d:?} {}", stat(&st, &real_owner))),
                model
                    .get_data(sessions[*s], path)
                    .map_or_else(|e| err(&e), |(d, st)| format!("{d:?} {}", stat(&st, &model_owner))),
            ),
            Step::Exists(s, path) => (
                real[*s]
                    .check_stat(path)
                    .await
                    .map_or_else(|e| err(&e), |st| st.map_or("none".into(), |st| stat(&st, &real_owner))),
                model
                    .check_stat(sessions[*s], path)
                    .map_or_else(|e| err(&e), |st| st.map_or("none".into(), |st| stat(&st, &model_owner))),
            ),
            Step::Children(s, path) => (
                real[*s].list_children(path).await.map_or_else(
                    |e| err(&e),
                    |mut c| {
                        c.sort();
                        format!("{c:?}")
                    },
                ),
                model.list_children(sessions[*s], path).map_or_else(|e| err(&e), |c| format!("{c:?}")),
            ),
            Step::WatchExists(s, path) => {
                let r = match real[*s].check_and_watch_stat(path).await {
                    Ok((st, w)) => {
                        real_watches.push((format!("exists {path} #{i}"), w));
                        st.map_or("none".into(), |st| stat(&st, &real_owner))
                    }
                    Err(e) => err(&e),
                };
                let m = match model.check_and_watch_stat(sessions[*s], path) {
                    Ok((st, w)) => {
                        model_watches.push((format!("exists {path} #{i}"), w));
                        st.map_or("none".into(), |st| stat(&st, &model_owner))
                    }
                    Err(e) => err(&e),
                };
                (r, m)
            }
            Step::WatchData(s, path) => {
                let r = match real[*s].get_and_watch_data(path).await {
                    Ok((d, st, w)) => {
                        real_watches.push((format!("data {path} #{i}"), w));
                        format!("{d:?} {}", stat(&st, &real_owner))
                    }
                    Err(e) => err(&e),
                };
                let m = match model.get_and_watch_data(sessions[*s], path) {
                    Ok((d, st, w)) => {
                        model_watches.push((format!("data {path} #{i}"), w));
                        format!("{d:?} {}", stat(&st, &model_owner))
                    }
                    Err(e) => err(&e),
                };
                (r, m)
            }
            Step::WatchChildren(s, path) => {
                let r = match real[*s].list_and_watch_children(path).await {
                    Ok((mut c, w)) => {
                        real_watches.push((format!("children {path} #{i}"), w));
                        c.sort();
                        format!("{c:?}")
                    }
                    Err(e) => err(&e),
                };
                let m = match model.list_and_watch_children(sessions[*s], path) {
                    Ok((c, w)) => {
                        model_watches.push((format!("children {path} #{i}"), w));
                        format!("{c:?}")
                    }
                    Err(e) => err(&e),
                };
                (r, m)
            }
            Step::Multi(s, ops) => {
                let mut txn = real[*s].new_multi_writer();
                for op in ops {
                    let ok = match op {
                        Op::Check { path, version } => txn.add_check_version(path, *version).is_ok(),
                        Op::Create { path, data, mode } => {
                            txn.add_create(path, data, &create_mode(*mode).with_acls(zk::Acls::anyone_all())).is_ok()
                        }
                        Op::SetData { path, data, version } => txn.add_set_data(path, data, *version).is_ok(),
                        Op::Delete { path, version } => txn.add_delete(path, *version).is_ok(),
                    };
                    assert!(ok, "seed {seed} step {i}: the client refused to build {op:?}");
                }
                let r = match txn.commit().await {
                    Ok(results) => {
                        let mut out = Vec::new();
                        for res in results {
                            out.push(match res {
                                zk::MultiWriteResult::Check => "check".to_string(),
                                zk::MultiWriteResult::Delete => "delete".to_string(),
                                zk::MultiWriteResult::Create { path, stat: st } => {
                                    created.push(path.clone());
                                    let st = if st.is_invalid() { "?".into() } else { stat(&st, &real_owner) };
                                    format!("create {path} {st}")
                                }
                                zk::MultiWriteResult::SetData { stat: st } => format!("set {}", stat(&st, &real_owner)),
                                other => panic!("seed {seed} step {i}: a result the model does not know: {other:?}"),
                            });
                        }
                        format!("{out:?}")
                    }
                    Err(zk::MultiWriteError::OperationFailed { index, source }) => {
                        format!("op {index}: {}", err(&source))
                    }
                    Err(zk::MultiWriteError::RequestFailed { source }) => format!("request: {}", err(&source)),
                };
                let m = match model.multi(sessions[*s], ops) {
                    Ok(results) => {
                        let out: Vec<String> = results
                            .iter()
                            .map(|res| match res {
                                OpResult::Check => "check".to_string(),
                                OpResult::Delete => "delete".to_string(),
                                OpResult::Create { path, stat: st } => {
                                    // the real server's stat of a create in a multi is not always
                                    // valid (the client marks it): compared only when it is
                                    let real_invalid = r.contains(&format!("create {path} ?"));
                                    let st = if real_invalid { "?".into() } else { stat(st, &model_owner) };
                                    format!("create {path} {st}")
                                }
                                OpResult::SetData { stat: st } => format!("set {}", stat(st, &model_owner)),
                            })
                            .collect();
                        format!("{out:?}")
                    }
                    Err((index, e)) => format!("op {index}: {}", err(&e)),
                };
                (r, m)
            }
        };
        trace.push(format!("{i}: {step:?}\n    real:  {r}\n    model: {m}"));
        assert_eq!(r, m, "seed {seed}, step {i} differs:\n{}", trace.join("\n"));
    }
    // session B closes: its ephemeral nodes go, its watches end
    let b_id = ids[1];
    let [a, b] = real;
    drop(b);
    model.end_session(sessions[1]);
    // the real server removes B's ephemerals once it processed the close: wait for it
    let start = std::time::Instant::now();
    loop {
        let mut left = 0;
        for p in &created {
            if let Ok(Some(st)) = a.check_stat(p).await
                && st.ephemeral_owner == b_id
            {
                left += 1;
            }
        }
        if left == 0 || start.elapsed() > Duration::from_secs(10) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut real_paths = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(p) = stack.pop() {
        real_paths.push(p.clone());
        for c in a.list_children(&p).await.unwrap_or_default() {
            stack.push(format!("{p}/{c}"));
        }
    }
    real_paths.sort();
    let model_paths: Vec<String> = model.paths().into_iter().filter(|p| p.starts_with(&root)).collect();
    assert_eq!(real_paths, model_paths, "seed {seed}: the trees after session B closed\n{}", trace.join("\n"));
    // which watches fired, and with what (the real client delivers asynchronously: give it time)
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut real_fired = BTreeMap::new();
    for (name, w) in real_watches {
        let ev = tokio::time::timeout(Duration::from_millis(20), w.changed()).await.ok().map(|e| event(&e));
        real_fired.insert(name, ev);
    }
    let mut model_fired = BTreeMap::new();
    for (name, mut w) in model_watches {
        model_fired.insert(name, w.try_recv().ok());
    }
    assert_eq!(real_fired, model_fired, "seed {seed}: watches fired\n{}", trace.join("\n"));
    support::zk_delete_tree(&a, &root).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_zookeeper_model_answers_as_zookeeper_does() {
    let seeds: u64 = std::env::var("SQUALL_ZK_MODEL_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(40);
    let first: u64 = std::env::var("SQUALL_ZK_MODEL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    for seed in first..first + seeds {
        run_seed(seed, 60).await;
    }
    eprintln!("ZooKeeper model: {seeds} seeds of 60 steps each agree with ZooKeeper (seeds {first}..)");
}
