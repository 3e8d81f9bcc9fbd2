//! Garbage collection of shards trimmed past retention. kinesis-local never trims closed shards,
//! so the workers reach Kinesis through the fault proxy, which can hide named shards as trimmed
//! ones are: left out of ListShards answers, and ResourceNotFound to GetShardIterator (which the
//! leader asks before it collects a shard the listings leave out). Two workers read a 2-shard stream; a shard is split, its parent is read to
//! its end and finished (finished marker, read-log `finish`) and its children are read; then the
//! proxy hides the parent. The test shows that the hiding reached the leader (the proxy rewrote
//! ListShards answers) and then that the leader removed `checkpoints/{parent}` and
//! `finished/{parent}` and dropped the parent from the `shards` znode, while the children keep
//! flowing and nothing is lost; `owners/{parent}` stays, empty and never re-created (its
//! sequence is the shard's lease token, which must never restart). Before that, a parent hidden
//! from one listing only is not collected (one listing is not proof that a shard left). Second, an open, unfinished shard hidden for
//! several discoveries keeps its checkpoint (it is not collected) and is read again, losing
//! nothing, once ListShards returns it.

use squall_test_support as support;

use std::time::{Duration, Instant};

use squall::kinesis;
use squall::kinesis::payload::Manifest;
use support::TestStream;
use support::faultproxy::{FaultPlan, FaultProxy};
use support::ops::{list_shards, listed_shards, log_lines, put_to_shard, wait_for, znode_exists, znode_json};
use support::workers::{Cluster, read_log_entries, scratch};

const GUARD: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_shards_that_leave_the_stream_are_collected_and_open_ones_are_not() {
    let s = TestStream::create("gc", 2).await;
    let dir = scratch("gc");
    let cluster = Cluster::new(&s.name, &dir);
    let proxy = FaultProxy::start(&support::kinesis_endpoint().endpoint, FaultPlan::default()).await;
    let endpoint = proxy.url();
    let args = ["--endpoint", endpoint.as_str()];
    let zk = support::zk_client().await;
    let mut w1 = cluster.start_with("w1", 1, &args);
    let mut w2 = cluster.start_with("w2", 1, &args);
    let stream_path = cluster.stream_path();
    let shards = list_shards(&s.client, &s.name).await;
    let (parent, other) = (shards[0].clone(), shards[1].clone());
    let put = |hash: String, tag: String, count: u64| {
        let (client, name) = (s.client.clone(), s.name.clone());
        async move { put_to_shard(&client, &name, &hash, &format!("{tag}-"), count, 4).await }
    };

    // 1. Both shards flow.
    let mut manifests: Vec<Manifest> = vec![
        put(parent.starting_hash_key.clone(), "p".into(), 30).await,
        put(other.starting_hash_key.clone(), "o".into(), 30).await,
    ];
    let r = cluster.wait_delivered(&manifests, GUARD).await;
    assert_eq!(r.lost, 0, "{r:?}\n{}", cluster.logs());

    // 2. Split the parent: it finishes, its children are read.
    let p = parent.shard_id.clone();
    kinesis::split_shard(&s.client, &s.label(), &s.name, &p).await.unwrap();
    let children: Vec<_> = list_shards(&s.client, &s.name)
        .await
        .into_iter()
        .filter(|c| c.parent_shard_id.as_deref() == Some(p.as_str()))
        .collect();
    assert_eq!(children.len(), 2);
    for c in &children {
        manifests.push(put(c.starting_hash_key.clone(), format!("c1-{}", c.shard_id), 20).await);
    }
    let r = cluster.wait_delivered(&manifests, GUARD).await;
    assert_eq!(r.lost, 0, "after the split: {r:?}\n{}", cluster.logs());
    wait_for(&cluster, "the parent's finished marker and read-log `finish`", GUARD, || async {
        let marker = znode_exists(&zk, &format!("{stream_path}/finished/{p}")).await;
        let logged = read_log_entries(&cluster.read_logs()).iter().any(|e| e.shard == p && e.event == "finish");
        (marker && logged).then_some(())
    })
    .await;
    let cp = znode_json(&zk, &format!("{stream_path}/checkpoints/{p}")).await.expect("parent checkpoint");
    assert_eq!(cp["finished"], true, "{cp}");
    assert!(znode_exists(&zk, &format!("{stream_path}/owners/{p}")).await, "owners/{p} never existed");
    assert!(listed_shards(&zk, &cluster).await.contains(&p));

    // 3a. One listing that omits the finished parent is not proof that it left: it stays.
    let owners_before = zk.check_stat(&format!("{stream_path}/owners/{p}")).await.unwrap().expect("owners/{p}");
    proxy.hide_shards(&[p.as_str()]);
    wait_for(&cluster, "the leader listing the shards without the parent", GUARD, || async {
        let noticed = !log_lines(&cluster, &["finished shard missing from ListShards", &p]).is_empty()
            || !znode_exists(&zk, &format!("{stream_path}/checkpoints/{p}")).await;
        noticed.then_some(())
    })
    .await;
    proxy.hide_shards(&[]);
    let blip = proxy.hidden_listings_of(&p);
    let seen_again = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let collected_once = log_lines(&cluster, &["shard finished and left the stream", &p]);
    assert!(
        collected_once.is_empty(),
        "the parent was collected after {blip} listing(s) omitted it (then re-read from TRIM_HORIZON): {collected_once:?}"
    );
    assert!(
        znode_exists(&zk, &format!("{stream_path}/checkpoints/{p}")).await
            && znode_exists(&zk, &format!("{stream_path}/finished/{p}")).await
            && listed_shards(&zk, &cluster).await.contains(&p),
        "the parent was collected after {blip} listing(s) omitted it\n{}",
        cluster.logs()
    );
    eprintln!("parent {p} hidden from {blip} listing(s), then listed again: kept ({:?} later)", seen_again.elapsed());

    // 3b. Listings that keep leaving the finished parent out for 10 s (past the 5 s and two
    // listings after which a shard the listings leave out is collected) while GetShardIterator
    // still answers for it (a listing that flaps, not a trimmed shard): the leader asks, and keeps it.
    let omitted_at = Instant::now();
    let (listings_before, iterators_before) = (proxy.hidden_listings_of(&p), proxy.requests_of("GetShardIterator"));
    proxy.omit_from_listings(&[p.as_str()]);
    while proxy.hidden_listings_of(&p) < listings_before + 3 || omitted_at.elapsed() < Duration::from_secs(10) {
        assert!(omitted_at.elapsed() < GUARD, "the leader stopped listing shards\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    proxy.omit_from_listings(&[]);
    let omissions = proxy.hidden_listings_of(&p) - listings_before;
    let asked = proxy.requests_of("GetShardIterator") - iterators_before;
    eprintln!(
        "parent {p} left out of {omissions} listings over {:?} (GetShardIterator asked {asked} times)",
        omitted_at.elapsed()
    );
    assert!(
        znode_exists(&zk, &format!("{stream_path}/checkpoints/{p}")).await
            && znode_exists(&zk, &format!("{stream_path}/finished/{p}")).await
            && listed_shards(&zk, &cluster).await.contains(&p),
        "the parent was collected while GetShardIterator still answered for it ({omissions} listings left it out)\n{}",
        cluster.logs()
    );
    assert!(asked > 0, "the leader never asked GetShardIterator about the omitted parent\n{}", cluster.logs());

    // 3. The parent leaves the stream (as after the retention period): it is collected, all but
    // its `owners/` directory, whose sequence is the shard's lease token (never re-created).
    let hidden_at = Instant::now();
    proxy.hide_shards(&[p.as_str()]);
    let collected = wait_for(&cluster, "the leader collecting the hidden finished parent", GUARD, || async {
        let gone = !znode_exists(&zk, &format!("{stream_path}/checkpoints/{p}")).await
            && !znode_exists(&zk, &format!("{stream_path}/finished/{p}")).await
            && !listed_shards(&zk, &cluster).await.contains(&p);
        gone.then(|| hidden_at.elapsed())
    })
    .await;
    let owners_after = zk.check_stat(&format!("{stream_path}/owners/{p}")).await.unwrap().expect("owners/{p} kept");
    assert_eq!(owners_after.czxid, owners_before.czxid, "owners/{p} was re-created: its lease tokens restarted");
    assert!(owners_after.cversion >= owners_before.cversion, "{owners_before:?} -> {owners_after:?}");
    assert!(zk.list_children(&format!("{stream_path}/owners/{p}")).await.unwrap().is_empty(), "no lease left on {p}");
    let listings = proxy.hidden_listings_of(&p);
    eprintln!("parent {p} collected {collected:?} after it left ListShards ({listings} listings hid it)");
    assert!(listings > 0, "the proxy never hid {p} from a ListShards answer");
    let logged = log_lines(&cluster, &["shard finished and left the stream", &p]);
    assert!(!logged.is_empty(), "no log line about collecting {p}\n{}", cluster.logs());
    eprintln!("{}", logged[0]);
    // The children keep flowing and stay listed.
    let listed = listed_shards(&zk, &cluster).await;
    assert!(children.iter().all(|c| listed.contains(&c.shard_id)), "{listed:?}");
    for c in &children {
        manifests.push(put(c.starting_hash_key.clone(), format!("c2-{}", c.shard_id), 20).await);
    }
    let r = cluster.wait_delivered(&manifests, GUARD).await;
    assert_eq!(r.lost, 0, "after collecting the parent: {r:?}\n{}", cluster.logs());
    assert!(!znode_exists(&zk, &format!("{stream_path}/checkpoints/{p}")).await, "the parent's checkpoint came back");

    // 4. An open, unfinished shard hidden for several discoveries is not collected. (The parent
    // stays hidden: a trimmed shard never comes back.)
    let o = other.shard_id.clone();
    let cp_path = format!("{stream_path}/checkpoints/{o}");
    let cp_before = znode_json(&zk, &cp_path).await.expect("checkpoint of the open shard");
    proxy.hide_shards(&[p.as_str(), o.as_str()]);
    let hidden = Instant::now();
    let mut checked = 0;
    while proxy.hidden_listings_of(&o) < 5 {
        let cp = znode_json(&zk, &cp_path).await;
        assert!(
            cp.as_ref().is_some_and(|c| c["finished"] == false),
            "the open shard {o}'s checkpoint was removed or finished while it was hidden: {cp:?}\n{}",
            cluster.logs()
        );
        checked += 1;
        assert!(hidden.elapsed() < GUARD, "the leader stopped listing shards\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    manifests.push(put(other.starting_hash_key.clone(), "o2".into(), 30).await);
    eprintln!(
        "open shard {o} hidden from {} listings over {:?}: its checkpoint stayed ({checked} checks; {cp_before} -> {:?}); \
         shard list while hidden: {:?}",
        proxy.hidden_listings_of(&o),
        hidden.elapsed(),
        znode_json(&zk, &cp_path).await,
        listed_shards(&zk, &cluster).await
    );
    assert!(znode_exists(&zk, &format!("{stream_path}/checkpoints/{o}")).await);
    proxy.hide_shards(&[p.as_str()]);
    let back = Instant::now();
    let r = cluster.wait_delivered(&manifests, GUARD).await;
    eprintln!(
        "COORD gc: {} (open shard read again {:?} after it came back)",
        serde_json::to_string(&r).unwrap(),
        back.elapsed()
    );
    assert_eq!(r.lost, 0, "{r:?}\n{}", cluster.logs());
    assert_eq!(r.order_violations, 0, "{r:?}");
    assert!(listed_shards(&zk, &cluster).await.contains(&o));
    assert!(!listed_shards(&zk, &cluster).await.contains(&p), "the collected parent came back into the list");

    assert!(w1.is_running() && w2.is_running(), "a worker died\n{}", cluster.logs());
    assert_eq!(w1.stop(Duration::from_secs(30)), Some(0));
    assert_eq!(w2.stop(Duration::from_secs(30)), Some(0));
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}
