//! A stream deleted and re-created under the same name is refused until an operator resets its
//! checkpoints. Two workers read stream S; S is deleted and created again with the same name and
//! shard count (same shard ids, another creation time). The test shows the refusal really happened
//! (`squall status --json` streams[].error names `squall checkpoints reset`, the assignment znode
//! has empty task lists and the error, a worker logged an ERROR, no lease is held and nothing of the
//! new stream is read or delivered while refused), then the documented recovery: `squall
//! deactivate`, `squall checkpoints reset TOPOLOGY --stream S --to trim-horizon`, `squall activate`
//! delivers every record of the new stream (also those written right after the re-creation, before
//! the leader noticed). It also runs the reset command exactly as the error
//! message spells it, and fails if that command does not work.

use squall_test_support as support;

use std::time::{Duration, Instant};

use squall::coord::now_ms;
use squall::kinesis::{self, payload::Manifest};
use support::TestStream;
use support::ops::{list_shards, log_lines, put_to_shard, squall_ok, squall_run, status_json, wait_for, znode_json};
use support::workers::{Cluster, owners, read_log_entries, scratch};

const GUARD: Duration = Duration::from_secs(90);

async fn put_each(s: &TestStream, tag: &str, count: u64) -> Vec<Manifest> {
    let mut out = Vec::new();
    for sh in list_shards(&s.client, &s.name).await {
        out.push(
            put_to_shard(&s.client, &s.name, &sh.starting_hash_key, &format!("{tag}-{}-", sh.shard_id), count, 4).await,
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recreated_stream_is_refused_until_its_checkpoints_are_reset() {
    let s = TestStream::create("recreate", 2).await;
    let dir = scratch("recreate");
    let cluster = Cluster::new(&s.name, &dir);
    let zk = support::zk_client().await;
    let mut w1 = cluster.start("w1", 1);
    let mut w2 = cluster.start("w2", 1);
    let old = put_each(&s, "old", 30).await;
    let r = cluster.wait_delivered(&old, GUARD).await;
    assert_eq!(r.lost, 0, "{r:?}\n{}", cluster.logs());
    let created_before = kinesis::stream_created_ms(&s.client, &s.label(), &s.name).await.unwrap();

    // Delete S and create it again under the same name (once the delete completed: a create of a
    // stream still being deleted fails).
    kinesis::delete_stream(&s.client, &s.label(), &s.name).await.unwrap();
    let t0 = Instant::now();
    wait_for(&cluster, "the stream's deletion", GUARD, || async {
        kinesis::stream_created_ms(&s.client, &s.label(), &s.name).await.is_err().then_some(())
    })
    .await;
    kinesis::create_stream(&s.client, &s.label(), &s.name, 2).await.unwrap();
    let recreated = Instant::now();
    let created_after = kinesis::stream_created_ms(&s.client, &s.label(), &s.name).await.unwrap();
    eprintln!("stream deleted and re-created in {:?}: created {created_before:?} -> {created_after:?}", t0.elapsed());
    assert_ne!(created_before, created_after, "the engine gave the new stream the old creation time");
    // Records written at once, before the leader can have noticed: they must survive the reset.
    let early = put_each(&s, "new0", 10).await;

    // The leader refuses it.
    let st = wait_for(&cluster, "the refusal in `squall status --json`", GUARD, || async {
        let st = status_json(&cluster);
        (!st["streams"][0]["error"].is_null()).then_some(st)
    })
    .await;
    let error = st["streams"][0]["error"].as_str().unwrap().to_string();
    eprintln!("refused {:?} after the re-creation: {error}", recreated.elapsed());
    assert!(error.contains("squall checkpoints reset"), "the error does not name the fix: {error}");
    assert!(error.contains(&s.name), "the error does not name the stream: {error}");
    let assignment = znode_json(&zk, &format!("{}/assignment", cluster.stream_path())).await.expect("assignment");
    let assigned: usize = assignment["tasks"].as_object().unwrap().values().map(|v| v.as_array().unwrap().len()).sum();
    assert_eq!(assigned, 0, "shards still assigned while refused: {assignment}");
    assert!(assignment["error"].as_str().is_some_and(|e| e == error), "{assignment}");
    let errors = log_lines(&cluster, &["ERROR", "was deleted and re-created", &s.name]);
    assert!(!errors.is_empty(), "no ERROR line in the worker logs\n{}", cluster.logs());
    eprintln!("{}", errors[0]);
    wait_for(&cluster, "every lease handed back after the refusal", GUARD, || async {
        owners(&zk, &cluster).await.is_empty().then_some(())
    })
    .await;
    let quiet_from = now_ms();

    // Nothing of the new stream is read while refused (several discovery intervals).
    let refused_batch = put_each(&s, "new1", 30).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let reads: Vec<_> = read_log_entries(&cluster.read_logs())
        .into_iter()
        .filter(|e| e.t_ms > quiet_from && matches!(e.event.as_str(), "acquire" | "records"))
        .collect();
    assert!(reads.is_empty(), "the re-created stream was read while refused: {reads:?}");
    let r = cluster.audit(&refused_batch);
    assert_eq!(r.distinct, 0, "records of the re-created stream were delivered while refused: {r:?}");
    assert!(owners(&zk, &cluster).await.is_empty());

    // The recovery. First the command exactly as the error message spells it.
    squall_ok(&cluster, &["deactivate", &cluster.topology]);
    let suggested = error
        .split('`')
        .find(|part| part.starts_with("squall checkpoints reset"))
        .expect("a `squall checkpoints reset ...` command in the error")
        .to_string();
    let words: Vec<&str> = suggested.split_whitespace().skip(1).collect();
    let (rc, out, err) = squall_run(&cluster, &words);
    eprintln!("the error's command `{suggested}`: exit {rc}: {}{}", out.trim(), err.trim());
    let suggested_worked = rc == 0;
    if !suggested_worked {
        let (_, usage, _) = squall_run(&cluster, &["checkpoints", "reset", "--help"]);
        eprintln!("`squall checkpoints reset --help`:\n{usage}");
        squall_ok(&cluster, &["checkpoints", "reset", &cluster.topology, "--stream", &s.name, "--to", "trim-horizon"]);
    }
    squall_ok(&cluster, &["activate", &cluster.topology]);
    let activated = Instant::now();
    let after = put_each(&s, "new2", 30).await;
    let put_took = activated.elapsed();
    let all: Vec<Manifest> = early.iter().chain(&refused_batch).chain(&after).cloned().collect();
    let r = cluster.wait_delivered(&all, GUARD).await;
    eprintln!(
        "COORD recreate: {} (activated, put for {put_took:?}, all delivered {:?} after the activation)",
        serde_json::to_string(&r).unwrap(),
        activated.elapsed()
    );
    assert_eq!(r.lost, 0, "after the reset: {r:?}\n{}", cluster.logs());
    assert_eq!(r.order_violations, 0, "{r:?}");
    let st = status_json(&cluster);
    assert!(st["streams"][0]["error"].is_null(), "the refusal is still reported after the reset: {st}");

    assert!(w1.is_running() && w2.is_running(), "a worker died\n{}", cluster.logs());
    assert_eq!(w1.stop(Duration::from_secs(30)), Some(0));
    assert_eq!(w2.stop(Duration::from_secs(30)), Some(0));
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
    assert!(
        suggested_worked,
        "the refusal's error names `{suggested}`, which the CLI rejects: {}{}",
        out.trim(),
        err.trim()
    );
}
