//! A malformed `shards` znode under a running leader, then resharding. Two workers read a 2-shard
//! stream with the initial position LATEST (it applies at the topology's first start only; shards
//! found later start at TRIM_HORIZON). The shards znode is overwritten with invalid JSON, then:
//! - split A: the leader notices the broken list (it checks the znode's version at each discovery),
//!   says so at ERROR level naming the znode, rewrites it from ListShards, and split A's children
//!   are read and delivered; it never lists shards in a tight loop meanwhile;
//! - split B while ListShards is held back by the fault proxy (so its children's records are
//!   written before any listing can see them): its children must start at TRIM_HORIZON;
//! - the operator deletes the znode, as the Malformed error advises: the leader writes it again
//!   and nothing is lost.
//!
//! Every expectation is checked after the whole scenario ran, and all failures are reported
//! together.

use squall_test_support as support;

use std::time::{Duration, Instant};

use squall::kinesis::{self, ShardDescription, payload::Manifest};
use support::TestStream;
use support::faultproxy::{FaultPlan, FaultProxy};
use support::ops::{
    list_shards, listed_shards, log_lines, put_to_shard, squall_run, wait_for, znode_exists, znode_json,
};
use support::workers::{Cluster, read_log_entries, scratch};

const GUARD: Duration = Duration::from_secs(90);

async fn children_of(s: &TestStream, parent: &str) -> Vec<ShardDescription> {
    let all = list_shards(&s.client, &s.name).await;
    let c: Vec<ShardDescription> = all.into_iter().filter(|c| c.parent_shard_id.as_deref() == Some(parent)).collect();
    assert_eq!(c.len(), 2, "children of {parent}: {c:?}");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_while_the_shard_list_znode_is_malformed() {
    let s = TestStream::create("shardlist", 2).await;
    let dir = scratch("shardlist");
    let mut cluster = Cluster::new(&s.name, &dir);
    cluster.initial_position = "latest".into();
    let proxy = FaultProxy::start(&support::kinesis_endpoint().endpoint, FaultPlan::default()).await;
    let url = proxy.url();
    let args = ["--endpoint", url.as_str()];
    let zk = support::zk_client().await;
    let mut w1 = cluster.start_with("w1", 1, &args);
    let mut w2 = cluster.start_with("w2", 1, &args);
    let stream_path = cluster.stream_path();
    let list_path = format!("{stream_path}/shards");
    let shards = list_shards(&s.client, &s.name).await;
    let mut failures: Vec<String> = Vec::new();

    // Both shards are read (LATEST: records written once their readers started).
    wait_for(&cluster, "both shards acquired", GUARD, || async {
        let e = read_log_entries(&cluster.read_logs());
        shards.iter().all(|sh| e.iter().any(|x| x.shard == sh.shard_id && x.event == "acquire")).then_some(())
    })
    .await;
    let mut manifests: Vec<Manifest> = Vec::new();
    for sh in &shards {
        manifests
            .push(put_to_shard(&s.client, &s.name, &sh.starting_hash_key, &format!("a-{}-", sh.shard_id), 20, 4).await);
    }
    let r = cluster.wait_delivered(&manifests, GUARD).await;
    assert_eq!(r.lost, 0, "before the fault: {r:?}\n{}", cluster.logs());

    // 1. The fault: the shards znode is malformed. Split A of shard 0.
    zk.set_data(&list_path, b"[1, 2", None).await.unwrap();
    let broken_at = Instant::now();
    let listings_before = proxy.requests_of("ListShards");
    let a = shards[0].shard_id.clone();
    kinesis::split_shard(&s.client, &s.label(), &s.name, &a).await.unwrap();
    let a_children = children_of(&s, &a).await;
    let mut a_manifests = Vec::new();
    for c in &a_children {
        a_manifests
            .push(put_to_shard(&s.client, &s.name, &c.starting_hash_key, &format!("ca-{}-", c.shard_id), 20, 4).await);
    }
    wait_for(&cluster, "split A's children discovered (checkpoints created)", GUARD, || async {
        let mut all = true;
        for c in &a_children {
            all &= znode_exists(&zk, &format!("{stream_path}/checkpoints/{}", c.shard_id)).await;
        }
        all.then_some(())
    })
    .await;
    // The fault took effect: the leader saw the broken znode (logged, naming it) and rewrote it.
    wait_for(&cluster, "the leader logging the malformed shard list", GUARD, || async {
        (!log_lines(&cluster, &["malformed", &list_path]).is_empty()).then_some(())
    })
    .await;
    let rewritten = wait_for(&cluster, "the leader rewriting the malformed shard list", GUARD, || async {
        let listed = listed_shards(&zk, &cluster).await;
        a_children.iter().all(|c| listed.contains(&c.shard_id)).then_some(listed)
    })
    .await;
    let broken_for = broken_at.elapsed();
    let listings_broken = proxy.requests_of("ListShards") - listings_before;
    eprintln!(
        "the malformed {list_path} was logged and rewritten from ListShards within {broken_for:?} ({listings_broken} listings meanwhile): {rewritten:?}"
    );
    // Periodic discovery is every second here, event-driven ones at most every 200 ms: a handful per
    // second at most (a leader looping on the broken list made 75 per second). The count also holds
    // each worker's one lookup of the children's hash key ranges as it takes one (its cached
    // ranges do not name them yet): at most one per worker. The repair often takes ~150 ms, too
    // short to be a rate: a loop is more than 10 leader calls in any second, so the budget is 10
    // per second of the time broken, 10 at least.
    let workers = 2;
    let leader_calls = listings_broken.saturating_sub(workers);
    let budget = (10.0 * broken_for.as_secs_f64()).max(10.0);
    if leader_calls as f64 > budget {
        failures.push(format!(
            "ListShards called {listings_broken} times in {broken_for:?} while the list was broken ({leader_calls} beyond \
             the workers' range lookups, budget {budget:.0}): the leader loops"
        ));
    }
    let (rc, out, err) = squall_run(&cluster, &["status", &cluster.topology, "--json"]);
    eprintln!("`squall status --json` after the repair: exit {rc}: {}{}", &out[..out.len().min(200)], err.trim());
    let started = Instant::now();
    let listings = proxy.requests_of("ListShards");
    let r = cluster.wait_delivered(&a_manifests, Duration::from_secs(30)).await;
    let listings = proxy.requests_of("ListShards") - listings;
    eprintln!(
        "split A's children: {} of {} delivered after {:?}; the leader called ListShards {listings} times meanwhile ({:.1}/s)",
        r.distinct,
        r.produced,
        started.elapsed(),
        listings as f64 / started.elapsed().as_secs_f64()
    );
    if r.lost > 0 {
        let assignment = znode_json(&zk, &format!("{stream_path}/assignment")).await;
        failures.push(format!(
            "split A's children were not read within 30 s after {list_path} was broken ({} of {} records lost); assignment: {assignment:?}",
            r.lost, r.produced
        ));
    }

    // 2. Split B of shard 1 while ListShards is held back: its children's records are written
    // before any listing can see the children.
    proxy.set_plan(FaultPlan { throttle: 1.0, only_ops: vec!["ListShards".into()], ..FaultPlan::default() });
    let held = proxy.counters().throttled;
    wait_for(&cluster, "the leader's ListShards held back", GUARD, || async {
        (proxy.counters().throttled >= held + 2).then_some(())
    })
    .await;
    let b = shards[1].shard_id.clone();
    kinesis::split_shard(&s.client, &s.label(), &s.name, &b).await.unwrap();
    let b_children = children_of(&s, &b).await;
    let mut b_manifests = Vec::new();
    for c in &b_children {
        b_manifests
            .push(put_to_shard(&s.client, &s.name, &c.starting_hash_key, &format!("cb-{}-", c.shard_id), 20, 4).await);
    }
    proxy.set_plan(FaultPlan::default());
    eprintln!("split B: {} ListShards calls held back", proxy.counters().throttled);
    let b_positions = wait_for(&cluster, "split B's children discovered (checkpoints created)", GUARD, || async {
        let mut out = Vec::new();
        for c in &b_children {
            let cp = znode_json(&zk, &format!("{stream_path}/checkpoints/{}", c.shard_id)).await?;
            out.push((c.shard_id.clone(), cp["position"].clone()));
        }
        Some(out)
    })
    .await;
    eprintln!("split B's children start at {b_positions:?}");
    for (c, pos) in &b_positions {
        if pos["type"] != "TRIM_HORIZON" {
            failures.push(format!(
                "child {c} of split B, discovered after the topology's first start, starts at {pos} instead of TRIM_HORIZON"
            ));
        }
    }

    // 3. The operator's fix as the error advises: delete the znode. The leader writes it again.
    zk.delete(&list_path, None).await.unwrap();
    let fixed = Instant::now();
    wait_for(&cluster, "the leader rewriting the deleted shard list", GUARD, || async {
        let listed = listed_shards(&zk, &cluster).await;
        b_children.iter().all(|c| listed.contains(&c.shard_id)).then_some(())
    })
    .await;
    eprintln!("shard list rewritten {:?} after its deletion", fixed.elapsed());
    let all: Vec<Manifest> = manifests.iter().chain(&a_manifests).chain(&b_manifests).cloned().collect();
    let r = cluster.wait_delivered(&all, GUARD).await;
    eprintln!("COORD shard-list: {}", serde_json::to_string(&r).unwrap());
    let lost_b = cluster.audit(&b_manifests);
    if r.lost > 0 {
        failures.push(format!(
            "{} of {} records lost ({} of split B's children's {}): {:?}",
            r.lost, r.produced, lost_b.lost, lost_b.produced, r.lost_examples
        ));
    }

    assert!(w1.is_running() && w2.is_running(), "a worker died\n{}", cluster.logs());
    assert_eq!(w1.stop(Duration::from_secs(30)), Some(0));
    assert_eq!(w2.stop(Duration::from_secs(30)), Some(0));
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
