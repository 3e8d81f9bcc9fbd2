//! Starting positions and restarts: the configured initial position applies once, to the shards
//! that exist at the topology's first start (LATEST skips closed shards and is persisted as a
//! timestamp); children always start at TRIM_HORIZON; a restart of all workers resumes after the
//! checkpoints with no duplicates after a graceful stop.

use squall_test_support as support;

use std::time::{Duration, Instant};

use squall::coord::{Checkpoint, CheckpointPosition};
use squall::kinesis::{self, PutOptions};
use support::TestStream;
use support::workers::{Cluster, scratch};

async fn put(s: &TestStream, count: u64) -> squall::kinesis::payload::Manifest {
    let opts = PutOptions { count, keys: 30, ..PutOptions::default() };
    kinesis::put_records(&s.client, &s.label(), &s.name, &opts).await.expect("put").manifest
}

async fn checkpoints(zk: &zookeeper_client::Client, cluster: &Cluster) -> Vec<(String, Checkpoint)> {
    let dir = format!("{}/checkpoints", cluster.stream_path());
    let mut out = Vec::new();
    let mut names = zk.list_children(&dir).await.unwrap_or_default();
    names.sort();
    for n in names {
        if let Ok((data, _)) = zk.get_data(&format!("{dir}/{n}")).await {
            out.push((n, serde_json::from_slice(&data).unwrap()));
        }
    }
    out
}

async fn wait_checkpoints(zk: &zookeeper_client::Client, cluster: &Cluster, n: usize) -> Vec<(String, Checkpoint)> {
    let start = Instant::now();
    loop {
        let cps = checkpoints(zk, cluster).await;
        if cps.len() >= n {
            return cps;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "checkpoints never initialized\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_skips_old_records_and_closed_shards_but_children_start_at_trim_horizon() {
    let s = TestStream::create("latest", 2).await;
    let old = put(&s, 200).await;
    kinesis::split_shard(&s.client, &s.label(), &s.name, "shardId-000000000000").await.unwrap();
    let old2 = put(&s, 100).await;
    let dir = scratch("latest");
    let mut cluster = Cluster::new(&s.name, &dir);
    cluster.initial_position = "latest".into();
    let zk = support::zk_client().await;
    let mut w = cluster.start("w", 2);
    let cps = wait_checkpoints(&zk, &cluster, 4).await;
    // Every shard starts at the first start's time, the closed one too (it may have closed after
    // the first start when a first start cut short is resumed: then it holds records to read).
    // Not marked finished at the start: a finished checkpoint here was written by the task that
    // read the closed shard to its end (it holds nothing after the timestamp, so that can take
    // a few milliseconds, before this first look), never by the leader's first start.
    for (shard, cp) in &cps {
        assert!(
            matches!(cp.position, CheckpointPosition::AtTimestamp { .. }) && (!cp.finished || cp.writer.is_some()),
            "LATEST is persisted as a timestamp, not as a shard finished at the start: {shard} {cp:?}"
        );
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let new1 = put(&s, 200).await;
    // A split after the first start: its children start at TRIM_HORIZON, so records written to
    // them before anyone reads them are not lost (Arroyo's bug).
    kinesis::split_shard(&s.client, &s.label(), &s.name, "shardId-000000000001").await.unwrap();
    let new2 = put(&s, 200).await;
    let report = cluster.wait_delivered(&[new1, new2], Duration::from_secs(60)).await;
    assert_eq!(report.lost, 0, "{report:?}\n{}", cluster.logs());
    let with_old = cluster.audit(&[old.clone(), old2.clone()]);
    assert_eq!(with_old.distinct, 0, "records from before the first start were delivered: {with_old:?}");
    let cps = checkpoints(&zk, &cluster).await;
    let closed = cps.iter().find(|(id, _)| id == "shardId-000000000000").map(|(_, cp)| cp);
    assert!(
        closed.is_some_and(|cp| cp.finished),
        "the shard closed before the first start was read to its end (nothing of it delivered): {closed:?}"
    );
    let children: Vec<_> = cps.iter().filter(|(id, _)| id.as_str() > "shardId-000000000003").collect();
    assert_eq!(children.len(), 2, "{cps:?}");
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0));
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}

/// The latest arrival time of the stream's records (ms), by the Kinesis engine's clock.
async fn last_arrival_ms(s: &TestStream) -> i64 {
    let mut last = 0;
    for shard in kinesis::list_shards(&s.client, &s.label(), &s.name).await.unwrap() {
        let it = s
            .client
            .get_shard_iterator()
            .stream_name(&s.name)
            .shard_id(&shard.shard_id)
            .shard_iterator_type(aws_sdk_kinesis::types::ShardIteratorType::TrimHorizon)
            .send()
            .await
            .unwrap();
        let mut it = it.shard_iterator;
        while let Some(i) = it {
            let r = s.client.get_records().shard_iterator(i).send().await.unwrap();
            for rec in r.records() {
                // Rounded: the SDK reads the JSON number through an f64, and `to_millis` (which
                // truncates) then says 1 ms early about half the time.
                let at =
                    rec.approximate_arrival_timestamp().map_or(0, |t| (t.as_nanos() + 500_000).div_euclid(1_000_000));
                last = last.max(at as i64);
            }
            if r.records().is_empty() {
                break;
            }
            it = r.next_shard_iterator;
        }
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_timestamp_starts_there() {
    let s = TestStream::create("atts", 2).await;
    let before = put(&s, 150).await;
    // The timestamp by the Kinesis engine's clock, which AT_TIMESTAMP is compared with (this
    // process's clock may differ: kinesis-local's clock does not follow steps of the system clock).
    let t = last_arrival_ms(&s).await + 500;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = put(&s, 150).await;
    let dir = scratch("atts");
    let mut cluster = Cluster::new(&s.name, &dir);
    cluster.initial_position = format!("at-timestamp:{t}");
    let mut w = cluster.start("w", 1);
    let report = cluster.wait_delivered(std::slice::from_ref(&after), Duration::from_secs(60)).await;
    assert_eq!(report.lost, 0, "{report:?}\n{}", cluster.logs());
    assert_eq!(cluster.audit(&[before]).distinct, 0, "records before the timestamp were delivered");
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0));
    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_of_all_workers_resumes_after_the_checkpoints() {
    let s = TestStream::create("restart", 3).await;
    let dir = scratch("restart");
    let cluster = Cluster::new(&s.name, &dir);
    let first = put(&s, 300).await;
    let mut a = cluster.start("a1", 1);
    let mut b = cluster.start("b1", 2);
    let r = cluster.wait_delivered(std::slice::from_ref(&first), Duration::from_secs(60)).await;
    assert_eq!(r.lost, 0, "{r:?}\n{}", cluster.logs());
    assert_eq!(a.stop(Duration::from_secs(30)), Some(0), "{}", cluster.logs());
    assert_eq!(b.stop(Duration::from_secs(30)), Some(0), "{}", cluster.logs());

    // After the graceful stop, every shard's checkpoint is at its last record.
    let zk = support::zk_client().await;
    let cps = checkpoints(&zk, &cluster).await;
    assert_eq!(cps.len(), 3);
    let delivered = support::workers::read_deliveries(&cluster.delivery_files());
    for (shard, cp) in &cps {
        let last = delivered
            .iter()
            .filter(|d| &d.shard == shard)
            .map(|d| d.sequence.clone())
            .max_by(|x, y| squall::coord::sequence_cmp(x, y));
        match (&cp.position, last) {
            (CheckpointPosition::AfterSequence { sequence, .. }, Some(last)) => assert_eq!(sequence, &last, "{shard}"),
            (pos, last) => assert!(last.is_none(), "{shard}: checkpoint {pos} but records were delivered"),
        }
    }

    let second = put(&s, 300).await;
    let _a = cluster.start("a2", 2);
    let _b = cluster.start("b2", 1);
    let r = cluster.wait_delivered(&[first, second], Duration::from_secs(60)).await;
    assert_eq!(r.lost, 0, "{r:?}\n{}", cluster.logs());
    assert_eq!(r.duplicates, 0, "a restart after a graceful stop re-delivered records: {r:?}");
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}
