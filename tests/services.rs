//! The local services behave as Squall relies on: Kinesis (LocalStack's engine) and ZooKeeper on
//! loopback, started by `localstack/up`.

use squall_test_support as support;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use aws_sdk_kinesis::types::ShardIteratorType;
use squall::kinesis::{self, PutOptions, payload::AuditPayload};
use support::TestStream;
use zookeeper_client as zk;

/// Reads every record of every shard from TRIM_HORIZON until the shard is drained.
async fn read_all(s: &TestStream) -> Vec<(String, AuditPayload)> {
    let shards = kinesis::list_shards(&s.client, &s.label(), &s.name).await.unwrap();
    let mut out = Vec::new();
    for shard in shards {
        let mut it = s
            .client
            .get_shard_iterator()
            .stream_name(&s.name)
            .shard_id(&shard.shard_id)
            .shard_iterator_type(ShardIteratorType::TrimHorizon)
            .send()
            .await
            .unwrap()
            .shard_iterator
            .unwrap();
        let mut empty = 0;
        loop {
            let r = s.client.get_records().shard_iterator(&it).limit(1000).send().await.unwrap();
            for rec in r.records() {
                let p: AuditPayload = serde_json::from_slice(rec.data().as_ref()).unwrap();
                out.push((shard.shard_id.clone(), p));
            }
            if r.records().is_empty() {
                empty += 1;
            }
            match r.next_shard_iterator() {
                Some(n) if empty < 2 => it = n.to_string(),
                _ => break,
            }
        }
    }
    out
}

#[tokio::test]
async fn thousand_records_put_and_read_back_in_per_key_order() {
    let s = TestStream::create("svc-put", 2).await;
    let opts = PutOptions { count: 1000, keys: 25, ..PutOptions::default() };
    let report = kinesis::put_records(&s.client, &s.label(), &s.name, &opts).await.unwrap();
    assert_eq!(report.manifest.total, 1000);
    assert_eq!(report.manifest.counts.values().sum::<u64>(), 1000);

    let got = read_all(&s).await;
    assert_eq!(got.len(), 1000, "every record read back");
    let mut per_key: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut shards_of_key: BTreeMap<String, HashSet<String>> = BTreeMap::new();
    for (shard, p) in &got {
        assert_eq!(p.run, report.manifest.run);
        per_key.entry(p.key.clone()).or_default().push(p.seq);
        shards_of_key.entry(p.key.clone()).or_default().insert(shard.clone());
    }
    for (key, seqs) in &per_key {
        let want: Vec<u64> = (0..report.manifest.counts[key]).collect();
        assert_eq!(seqs, &want, "key {key}: records in producer order, none missing");
        assert_eq!(shards_of_key[key].len(), 1, "key {key} maps to one shard");
    }
    let used: HashSet<&String> = got.iter().map(|(s, _)| s).collect();
    assert_eq!(used.len(), 2, "25 keys spread over both shards");
    s.delete().await;
}

#[tokio::test]
async fn split_shows_children_with_their_parent() {
    let s = TestStream::create("svc-split", 2).await;
    let before = kinesis::list_shards(&s.client, &s.label(), &s.name).await.unwrap();
    assert_eq!(before.len(), 2);
    assert!(before.iter().all(|x| !x.closed && x.parent_shard_id.is_none()));

    let at = kinesis::split_shard(&s.client, &s.label(), &s.name, "shardId-000000000000").await.unwrap();
    let after = kinesis::list_shards(&s.client, &s.label(), &s.name).await.unwrap();
    assert_eq!(after.len(), 4, "{after:?}");
    let parent = after.iter().find(|x| x.shard_id == "shardId-000000000000").unwrap();
    assert!(parent.closed, "the split parent is closed");
    let children: Vec<_> =
        after.iter().filter(|x| x.parent_shard_id.as_deref() == Some("shardId-000000000000")).collect();
    assert_eq!(children.len(), 2, "two children name the parent: {after:?}");
    assert!(children.iter().all(|c| !c.closed));
    // The children exactly cover the parent's hash range, split at the midpoint.
    let mut ranges: Vec<(u128, u128)> =
        children.iter().map(|c| (c.starting_hash_key.parse().unwrap(), c.ending_hash_key.parse().unwrap())).collect();
    ranges.sort();
    assert_eq!(ranges[0].0, parent.starting_hash_key.parse::<u128>().unwrap());
    assert_eq!(ranges[1].1, parent.ending_hash_key.parse::<u128>().unwrap());
    assert_eq!(ranges[0].1 + 1, ranges[1].0);
    assert_eq!(ranges[1].0.to_string(), at);

    // Merging the two children gives one shard with both as parents.
    let (a, b) = (&children[0].shard_id, &children[1].shard_id);
    kinesis::merge_shards(&s.client, &s.label(), &s.name, a, b).await.unwrap();
    let merged = kinesis::list_shards(&s.client, &s.label(), &s.name).await.unwrap();
    let m = merged.iter().find(|x| x.adjacent_parent_shard_id.is_some()).expect("a merge child");
    let parents: HashSet<&str> = m.parents().collect();
    assert_eq!(parents, HashSet::from([a.as_str(), b.as_str()]));
    s.delete().await;
}

#[tokio::test]
async fn split_of_unknown_shard_names_it() {
    let s = TestStream::create("svc-bad", 1).await;
    let err = kinesis::split_shard(&s.client, &s.label(), &s.name, "shardId-000000000042").await.unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("shardId-000000000042") && msg.contains(&s.name), "{msg}");
    s.delete().await;
}

#[tokio::test]
async fn zookeeper_versioned_set_refuses_stale_version() {
    let client = support::zk_client().await;
    let root = support::unique_zk_root("svc");
    let opts = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    client.create(&root, b"v0", &opts).await.unwrap();
    let (_, stat) = client.get_data(&root).await.unwrap();
    let v1 = client.set_data(&root, b"v1", Some(stat.version)).await.unwrap();
    assert_eq!(v1.version, stat.version + 1);
    // A writer that still holds the old version is refused.
    let err = client.set_data(&root, b"stale", Some(stat.version)).await.unwrap_err();
    assert!(matches!(err, zk::Error::BadVersion), "{err:?}");
    let (data, _) = client.get_data(&root).await.unwrap();
    assert_eq!(data, b"v1");
    support::zk_delete_tree(&client, &root).await;
}

#[tokio::test]
async fn zookeeper_ephemeral_node_goes_with_its_session() {
    let observer = support::zk_client().await;
    let root = support::unique_zk_root("svc-eph");
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    observer.create(&root, b"", &persistent).await.unwrap();

    let owner = support::zk_client().await;
    let eph = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    let path = format!("{root}/owner");
    owner.create(&path, b"me", &eph).await.unwrap();
    assert!(observer.check_stat(&path).await.unwrap().is_some());

    drop(owner); // the last clone closes the session
    let mut gone = false;
    for _ in 0..50 {
        if observer.check_stat(&path).await.unwrap().is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "the ephemeral node disappears once its session is closed");
    support::zk_delete_tree(&observer, &root).await;
}
