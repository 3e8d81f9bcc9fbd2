//! KPL de-aggregation end to end, against kinesis-local and ZooKeeper, with audit workers as real
//! processes:
//! - records packed by AWS's reference aggregator (`aws-kinesis-agg` from PyPI, installed by
//!   `localstack/up` through `localstack/kpl-agg-install`; the writers are in `support::kpl`)
//!   flow through a split and a merge with nothing lost and per-key order kept;
//! - both producer styles through a split of a 3-shard stream, 3000 user records each: Lambda-style
//!   (`aws-kinesis-agg`: mixed keys in one aggregate, routed by its first record, never re-sent)
//!   and KPL-like (one aggregate per predicted shard; after the split its stale shard map sends an
//!   aggregate to the wrong child, and it re-sends the whole aggregate). By default
//!   (`kpl_out_of_range: deliver`) nothing is lost in either, user records outside their shard's
//!   range are counted, and the KPL's re-sends are duplicates; with `drop_aggregate` (the KCL's
//!   semantics) the KPL-like producer's stale aggregates are dropped whole and counted, while the
//!   Lambda-style producer loses exactly what is counted as dropped;
//! - a graceful stop in the middle of an aggregate: the next worker resumes after the last acked
//!   user record, and emits none of the acked ones again;
//! - one stale aggregate and the KPL's re-send of it, in both modes (delivered twice / dropped
//!   whole, counted, and delivered once from the re-send);
//! - corrupt aggregates (bad MD5, bad protobuf) are delivered once each as plain records, counted.

use squall_test_support as support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use squall::kinesis::kpl::{self, NewUserRecord};
use squall::kinesis::payload::AuditPayload;
use squall::kinesis::{self, ShardDescription};
use support::TestStream;
use support::kpl::{
    Kpl, KplPut, hex, manifest, put_kpl_like, put_lambda_style, put_one, put_one_seq, put_reference, range,
    reference_aggregate, wait_counters,
};
use support::workers::{Cluster, Scratch, Worker, read_deliveries, scratch};

async fn cleanup(cluster: &Cluster, s: TestStream) {
    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_aggregates_through_a_split_and_a_merge_lose_nothing_and_keep_order() {
    let s = TestStream::create("kpl-reshard", 2).await;
    let dir = scratch("kpl-reshard");
    let cluster = Cluster::new(&s.name, &dir);
    let mut w = cluster.start("w", 2);
    let label = s.label();
    let run = "kplref";
    let keys: Vec<String> = (0..40).map(|i| format!("key-{i}")).collect();
    let mut counts = BTreeMap::new();

    put_reference(&s, run, &keys, 5, 25, &mut counts).await;
    kinesis::split_shard(&s.client, &label, &s.name, "shardId-000000000000").await.unwrap();
    put_reference(&s, run, &keys, 5, 25, &mut counts).await;
    let shards = kinesis::list_shards(&s.client, &label, &s.name).await.unwrap();
    let mut open: Vec<&ShardDescription> = shards.iter().filter(|d| !d.closed).collect();
    open.sort_by_key(|d| range(d).0);
    let (a, b) = (open[0].shard_id.clone(), open[1].shard_id.clone());
    kinesis::merge_shards(&s.client, &label, &s.name, &a, &b).await.unwrap();
    put_reference(&s, run, &keys, 5, 25, &mut counts).await;

    let m = manifest(run, &s.name, &counts);
    assert_eq!(m.total, 600);
    let report = cluster.wait_delivered(std::slice::from_ref(&m), Duration::from_secs(90)).await;
    assert_eq!(report.lost, 0, "lost user records: {report:?}\n{}", cluster.logs());
    assert_eq!(report.order_violations, 0, "per-key order broken: {report:?}");
    assert_eq!(report.duplicates, 0, "nothing failed, so nothing is delivered twice: {report:?}");
    let deliveries = read_deliveries(&cluster.delivery_files());
    assert!(deliveries.iter().any(|d| d.sub_sequence == 24), "user records carry their index in the aggregate");
    let k = wait_counters(&cluster, |c| c.users >= 600).await;
    assert_eq!((k.users, k.out_of_range, k.dropped, k.corrupt), (600, 0, 0, 0), "{k:?}");
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0));
    cleanup(&cluster, s).await;
}

/// A spout configuration with `kpl_out_of_range` set (`None`: the default).
fn cluster_with(s: &TestStream, dir: &Scratch, mode: Option<&str>) -> Cluster {
    match mode {
        Some(m) => Cluster::with_spout_config(&s.name, dir, serde_json::json!({ "kpl_out_of_range": m })),
        None => Cluster::new(&s.name, dir),
    }
}

/// 3000 user records from Lambda-style producers (AWS's `aws-kinesis-agg`: mixed keys in one
/// aggregate, routed by the first record's key, never re-sent) into a 3-shard stream through a
/// split, read with `kpl_out_of_range` = `mode`. Returns the audit, the counters and how many user
/// records landed in a shard whose range does not hold their key.
async fn lambda_style_through_a_split(name: &str, mode: Option<&str>) -> (squall::audit::AuditReport, Kpl, u64) {
    let s = TestStream::create(name, 3).await;
    let dir = scratch(name);
    let cluster = cluster_with(&s, &dir, mode);
    let mut w = cluster.start("w", 2);
    let run = "kpllambda";
    let keys: Vec<String> = (0..60).map(|i| format!("key-{i}")).collect();
    let mut counts = BTreeMap::new();
    let mut outside = put_lambda_style(&s, run, &keys, 25, 25, &mut counts).await;
    kinesis::split_shard(&s.client, &s.label(), &s.name, "shardId-000000000000").await.unwrap();
    outside += put_lambda_style(&s, run, &keys, 25, 25, &mut counts).await;
    let m = manifest(run, &s.name, &counts);
    assert_eq!(m.total, 3000);
    assert!(outside > 1000, "most user records of a mixed aggregate belong to other shards: {outside}");
    let k = wait_counters(&cluster, |c| c.users >= 3000).await;
    let report = cluster.wait_delivered(std::slice::from_ref(&m), Duration::from_secs(10)).await;
    if mode.is_none() {
        assert_eq!(
            report.lost,
            0,
            "{} of 3000 user records lost ({outside} were outside the hash range of the shard they landed in; {k:?}): \
             {report:?}\n{}",
            report.lost,
            cluster.logs()
        );
    }
    eprintln!("lambda-style, kpl_out_of_range {mode:?}: {report:?}\n  {k:?}, {outside} landed outside their shard");
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0));
    cleanup(&cluster, s).await;
    (report, k, outside)
}

/// Lambda-style producers through a split, by default: every user record is delivered, those
/// outside the hash range of the shard they were read from counted (and delivered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lambda_style_aggregates_of_mixed_keys_through_a_split_lose_nothing() {
    let (report, k, outside) = lambda_style_through_a_split("kpl-lambda", None).await;
    assert_eq!(report.lost, 0, "{report:?}");
    assert_eq!(report.duplicates, 0, "nothing is sent twice, so nothing is delivered twice: {report:?}");
    assert_eq!(
        (k.users, k.out_of_range, k.dropped, k.dropped_aggregates, k.corrupt),
        (3000, outside, 0, 0, 0),
        "every user record outside its shard's range counted, none dropped: {k:?}"
    );
}

/// The cost of the opt-in KCL semantics with such a producer, made visible: the records are
/// lost, and every lost one is counted as dropped (with its aggregate) and logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lambda_style_aggregates_with_drop_aggregate_lose_only_what_is_counted_as_dropped() {
    let (report, k, outside) = lambda_style_through_a_split("kpl-lambda-drop", Some("drop_aggregate")).await;
    assert!(report.lost > 0, "mixed aggregates are dropped whole: {report:?}");
    assert_eq!(report.lost, k.dropped, "every lost user record is counted as dropped: {report:?} {k:?}");
    assert_eq!(k.out_of_range, outside, "{k:?}");
    assert!(k.dropped_aggregates > 0 && k.dropped >= k.out_of_range, "{k:?}");
    assert_eq!(report.duplicates, 0, "{report:?}");
}

/// 3000 user records from a KPL-like producer (one aggregate per predicted shard) into a
/// 3-shard stream through a split, its shard map stale for the first round after it; read with
/// `kpl_out_of_range` = `mode`.
async fn kpl_like_through_a_split(name: &str, mode: Option<&str>) -> (squall::audit::AuditReport, Kpl, KplPut) {
    let s = TestStream::create(name, 3).await;
    let dir = scratch(name);
    let cluster = cluster_with(&s, &dir, mode);
    let mut w = cluster.start("w", 2);
    let run = "kpllike";
    let keys: Vec<String> = (0..60).map(|i| format!("key-{i}")).collect();
    let mut counts = BTreeMap::new();
    let map = kinesis::list_shards(&s.client, &s.label(), &s.name).await.unwrap();
    let before = put_kpl_like(&s, run, &keys, 25, 25, &map, &mut counts).await;
    assert_eq!((before.resent, before.outside), (0, 0), "a fresh map: every aggregate where predicted");
    kinesis::split_shard(&s.client, &s.label(), &s.name, "shardId-000000000000").await.unwrap();
    // The same (now stale) map: the aggregates predicted for the split shard land on a child.
    let stale = put_kpl_like(&s, run, &keys, 25, 25, &map, &mut counts).await;
    assert!(stale.resent > 0 && stale.outside > 0, "{stale:?}");
    let m = manifest(run, &s.name, &counts);
    assert_eq!(m.total, 3000);
    let k = wait_counters(&cluster, |c| c.users >= 3000 + stale.resent).await;
    let report = cluster.wait_delivered(std::slice::from_ref(&m), Duration::from_secs(30)).await;
    assert_eq!(report.lost, 0, "{report:?} {k:?} {stale:?}\n{}", cluster.logs());
    eprintln!("kpl-like, kpl_out_of_range {mode:?}: {report:?}\n  {k:?}, {stale:?}");
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0));
    cleanup(&cluster, s).await;
    (report, k, stale)
}

/// By default a KPL-like producer loses nothing through a split; the price is its re-sends
/// delivered a second time (the documented cost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kpl_like_aggregates_through_a_split_lose_nothing_and_resends_are_duplicates_by_default() {
    let (report, k, stale) = kpl_like_through_a_split("kpl-like", None).await;
    assert_eq!(report.lost, 0);
    assert_eq!(report.duplicates, stale.resent, "each re-sent user record delivered twice: {report:?} {stale:?}");
    assert_eq!((k.users, k.out_of_range, k.dropped), (3000 + stale.resent, stale.outside, 0), "{k:?}");
}

/// With the KCL's semantics (opt-in) the same producer loses nothing and its re-sends are not
/// duplicates: each aggregate holding a user record of the sibling shard is dropped whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kpl_like_aggregates_through_a_split_with_drop_aggregate_lose_nothing_and_drop_the_stale_aggregates() {
    let (report, k, stale) = kpl_like_through_a_split("kpl-like-drop", Some("drop_aggregate")).await;
    assert_eq!(report.lost, 0);
    assert_eq!(
        report.duplicates,
        stale.resent - stale.resent_mixed,
        "only a re-sent aggregate whose records all hashed into the shard it landed on is delivered twice: {stale:?}"
    );
    assert_eq!((k.out_of_range, k.dropped), (stale.outside, stale.resent_mixed), "{k:?} {stale:?}");
    assert!(k.dropped_aggregates > 0, "{k:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_restart_mid_aggregate_emits_no_acked_user_record_again() {
    let s = TestStream::create("kpl-restart", 1).await;
    let dir = scratch("kpl-restart");
    let cluster = Cluster::new(&s.name, &dir);
    let run = "kplrestart";
    // One aggregate of 40 user records over 4 keys, packed by our aggregator.
    let payloads: Vec<(String, Vec<u8>)> = (0..40u64)
        .map(|i| {
            let key = format!("key-{}", i % 4);
            let p = AuditPayload::new(run, &key, i / 4, 0).to_bytes();
            (key, p)
        })
        .collect();
    let users: Vec<NewUserRecord<'_>> =
        payloads.iter().map(|(k, d)| NewUserRecord { partition_key: k, explicit_hash_key: None, data: d }).collect();
    let agg = kpl::aggregate(&users).unwrap();
    put_one(&s, &(agg.partition_key.clone(), None, agg.data.to_vec())).await;
    let counts: BTreeMap<String, u64> = (0..4).map(|k| (format!("key-{k}"), 10)).collect();
    let m = manifest(run, &s.name, &counts);

    // A slow sink and two tuples in flight: the stop comes in the middle of the aggregate.
    let slow = ["--sink-delay-ms", "150", "--max-spout-pending", "2", "--sinks", "1"];
    let mut w1 = cluster.start_with("w1", 1, &slow);
    let first = dir.join("w1.deliveries.jsonl");
    for _ in 0..200 {
        if read_deliveries(std::slice::from_ref(&first)).len() >= 8 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(w1.stop(Duration::from_secs(30)), Some(0), "{}", cluster.logs());
    let before: Vec<u64> = read_deliveries(std::slice::from_ref(&first)).iter().map(|d| d.sub_sequence).collect();
    let before_set: BTreeSet<u64> = before.iter().copied().collect();
    assert_eq!(before.len(), before_set.len(), "no duplicate before the restart: {before:?}");
    assert!((8..40).contains(&before.len()), "stopped mid-aggregate: {} of 40 delivered", before.len());
    assert_eq!(before_set, (0..before.len() as u64).collect(), "acked in order up to the stop");
    // The checkpoint carries the last acked user record's sub-sequence.
    let zk = support::zk_client().await;
    let cp_path = format!("{}/checkpoints/shardId-000000000000", cluster.stream_path());
    let cp = support::ops::znode_json(&zk, &cp_path).await.expect("checkpoint written");
    assert_eq!(cp["position"]["sub_sequence"].as_u64(), Some(before.len() as u64 - 1), "{cp}");

    let mut w2 = cluster.start("w2", 1);
    let report = cluster.wait_delivered(std::slice::from_ref(&m), Duration::from_secs(60)).await;
    assert_eq!(report.lost, 0, "{report:?}\n{}", cluster.logs());
    let again: Vec<u64> = read_deliveries(std::slice::from_ref(&dir.join("w2.deliveries.jsonl")))
        .iter()
        .map(|d| d.sub_sequence)
        .collect();
    let emitted_again: Vec<u64> = again.iter().copied().filter(|s| before_set.contains(s)).collect();
    assert_eq!(emitted_again, Vec::<u64>::new(), "user records acked before the stop were emitted again");
    let mut rest = again.clone();
    rest.sort_unstable();
    assert_eq!(rest, (before.len() as u64..40).collect::<Vec<_>>(), "the restart delivers exactly the rest");
    assert_eq!(report.duplicates, 0, "{report:?}");
    assert_eq!(w2.stop(Duration::from_secs(30)), Some(0));
    cleanup(&cluster, s).await;
}

/// After a split, an aggregate packed with a stale KPL shard map: 5 user records of the low
/// child and, at index 2, a stray one of the high child, put (first key low) to the low child;
/// then, as the KPL does when a record lands on another shard than predicted, the WHOLE aggregate
/// again, each user record to its own child. Read with `kpl_out_of_range` = `mode`.
async fn stale_aggregate_and_its_resend(
    name: &str,
    mode: Option<&str>,
) -> (Cluster, TestStream, Worker, String, String, Kpl) {
    let s = TestStream::create(name, 1).await;
    let dir = scratch(name);
    let cluster = cluster_with(&s, &dir, mode);
    let label = s.label();
    kinesis::split_shard(&s.client, &label, &s.name, "shardId-000000000000").await.unwrap();
    let shards = kinesis::list_shards(&s.client, &label, &s.name).await.unwrap();
    let mut open: Vec<&ShardDescription> = shards.iter().filter(|d| !d.closed).collect();
    open.sort_by_key(|d| range(d).0);
    let (low, high) = (open[0], open[1]);
    let in_low = |k: &String| (range(low).0..=range(low).1).contains(&kpl::partition_key_hash(k));
    let low_keys: Vec<String> = (0..).map(|i| format!("key-{i}")).filter(in_low).take(5).collect();
    let stray = (0..).map(|i| format!("stray-{i}")).find(|k| !in_low(k)).unwrap();
    let run = "kplrange";
    let mut payloads: Vec<(String, Vec<u8>)> =
        low_keys.iter().map(|k| (k.clone(), AuditPayload::new(run, k, 0, 0).to_bytes())).collect();
    payloads.insert(2, (stray.clone(), AuditPayload::new(run, &stray, 0, 0).to_bytes()));
    let stale = reference_aggregate(std::slice::from_ref(&payloads)).remove(0);
    assert_eq!(put_one(&s, &stale).await, low.shard_id);
    // The KPL's re-send of the whole aggregate, grouped by the fresh map.
    let (mine, theirs): (Vec<_>, Vec<_>) = payloads.iter().cloned().partition(|(k, _)| in_low(k));
    for (group, shard) in [(mine, &low.shard_id), (theirs, &high.shard_id)] {
        let again = reference_aggregate(&[group]).remove(0);
        assert_eq!(&put_one(&s, &again).await, shard);
    }
    let counts: BTreeMap<String, u64> = payloads.iter().map(|(k, _)| (k.clone(), 1)).collect();
    let m = manifest(run, &s.name, &counts);

    let w = cluster.start("w", 2);
    let k = wait_counters(&cluster, |c| c.users >= 12).await;
    let report = cluster.wait_delivered(std::slice::from_ref(&m), Duration::from_secs(60)).await;
    assert_eq!(report.lost, 0, "{report:?}\n{}", cluster.logs());
    (cluster, s, w, stray, high.shard_id.clone(), k)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_kpl_aggregate_is_delivered_whole_by_default_and_its_resend_again() {
    let (cluster, s, mut w, stray, high, k) = stale_aggregate_and_its_resend("kpl-range", None).await;
    let deliveries = read_deliveries(&cluster.delivery_files());
    let stray_from: BTreeSet<&str> = deliveries.iter().filter(|d| d.key == stray).map(|d| d.shard.as_str()).collect();
    assert_eq!(stray_from.len(), 2, "the stray record from the low child (the stale aggregate) and from {high}");
    let dups =
        deliveries.len() as u64 - deliveries.iter().map(|d| (&d.key, d.seq)).collect::<BTreeSet<_>>().len() as u64;
    assert_eq!(dups, 6, "the whole stale aggregate delivered, and its re-send: the documented cost");
    assert_eq!((k.users, k.out_of_range, k.dropped, k.dropped_aggregates), (12, 1, 0, 0), "{k:?}");
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0));
    cleanup(&cluster, s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_drop_aggregate_a_stale_kpl_aggregate_is_dropped_whole_counted_and_its_resend_delivered_once() {
    let (cluster, s, mut w, stray, high, k) =
        stale_aggregate_and_its_resend("kpl-range-drop", Some("drop_aggregate")).await;
    let deliveries = read_deliveries(&cluster.delivery_files());
    assert_eq!(deliveries.len(), 6, "each user record once, from the re-send: {deliveries:?}");
    let stray_from: Vec<&str> = deliveries.iter().filter(|d| d.key == stray).map(|d| d.shard.as_str()).collect();
    assert_eq!(stray_from, vec![high.as_str()], "delivered by its own shard only");
    assert_eq!(
        (k.users, k.out_of_range, k.dropped, k.dropped_aggregates, k.corrupt),
        (12, 1, 6, 1, 0),
        "the whole aggregate (6 user records, 1 outside the range) dropped and counted: {k:?}"
    );
    assert!(cluster.logs().contains("dropped whole KPL aggregates"), "the drop is logged\n{}", cluster.logs());
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0));
    cleanup(&cluster, s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_aggregates_are_delivered_once_as_plain_records_and_counted() {
    let s = TestStream::create("kpl-corrupt", 1).await;
    let dir = scratch("kpl-corrupt");
    let cluster = Cluster::new(&s.name, &dir);
    let run = "kplcorrupt";
    let payload = |k: &str, seq: u64| AuditPayload::new(run, k, seq, 0).to_bytes();
    let good =
        reference_aggregate(&[vec![("key-0".into(), payload("key-0", 0)), ("key-1".into(), payload("key-1", 0))]])
            .remove(0);
    // Bad MD5: the trailer's last byte flipped.
    let mut bad_md5 = good.2.clone();
    *bad_md5.last_mut().unwrap() ^= 0x55;
    // Bad protobuf, with an MD5 that matches it.
    let body = [0x1a, 0xff, 0x01, 0x08];
    let mut bad_pb = kpl::MAGIC.to_vec();
    bad_pb.extend_from_slice(&body);
    bad_pb.extend_from_slice(&md5_of(&body));
    put_one(&s, &("key-9".into(), None, payload("key-9", 0))).await;
    let md5_seq = put_one_seq(&s, &("x".into(), None, bad_md5.clone())).await;
    let pb_seq = put_one_seq(&s, &("y".into(), None, bad_pb.clone())).await;
    put_one(&s, &good).await;
    let counts: BTreeMap<String, u64> = ["key-0", "key-1", "key-9"].iter().map(|k| (k.to_string(), 1)).collect();
    let m = manifest(run, &s.name, &counts);

    let non_audit = dir.join("non-audit.jsonl");
    let mut w = cluster.start_with("w", 1, &["--non-audit", non_audit.to_str().unwrap()]);
    let report = cluster.wait_delivered(std::slice::from_ref(&m), Duration::from_secs(60)).await;
    assert_eq!((report.lost, report.duplicates), (0, 0), "{report:?}\n{}", cluster.logs());
    let k = wait_counters(&cluster, |c| c.corrupt >= 2).await;
    assert_eq!(k.corrupt, 2, "both corrupt aggregates counted");
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0));
    let plain: Vec<serde_json::Value> = support::ops::json_lines(&non_audit);
    let got: BTreeSet<(String, u64, String)> = plain
        .iter()
        .map(|v| {
            (
                v["sequence"].as_str().unwrap().to_string(),
                v["sub_sequence"].as_u64().unwrap(),
                v["data_hex"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(plain.len(), 2, "each delivered once: {plain:?}");
    let want: BTreeSet<(String, u64, String)> =
        [(md5_seq.clone(), 0, hex(&bad_md5)), (pb_seq.clone(), 0, hex(&bad_pb))].into_iter().collect();
    assert_eq!(got, want, "whole, as plain records");
    let logs = cluster.logs();
    for seq in [&md5_seq, &pb_seq] {
        assert!(
            logs.lines().any(|l| l.contains("not a valid aggregate") && l.contains(seq.as_str())),
            "logged with its sequence {seq}\n{logs}"
        );
    }
    cleanup(&cluster, s).await;
}

fn md5_of(bytes: &[u8]) -> [u8; 16] {
    use md5::Digest as _;
    md5::Md5::digest(bytes).into()
}
