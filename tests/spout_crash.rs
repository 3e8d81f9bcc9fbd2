//! Crash: SIGKILL a worker mid-stream. Its shards are read again by the survivor within the
//! session timeout + 2 s; nothing is lost; the only duplicates are records the dead worker had
//! not checkpointed when it died.

use squall_test_support as support;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use squall::coord::{Checkpoint, CheckpointPosition, sequence_cmp};
use squall::kinesis::{self, PutOptions};
use support::TestStream;
use support::workers::{Cluster, live_tasks, owners, read_deliveries, scratch};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_failover_within_session_timeout_and_duplicates_only_uncheckpointed() {
    let s = TestStream::create("crash", 4).await;
    let dir = scratch("crash");
    let cluster = Cluster::new(&s.name, &dir);
    let zk = support::zk_client().await;
    let mut victim = cluster.start("victim", 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut survivor = cluster.start("survivor", 1);

    // A producer at ~300 records/s for ~6 s, running while the worker dies.
    let producer = {
        let (client, label, name) = (s.client.clone(), s.label(), s.name.clone());
        tokio::spawn(async move {
            let opts = PutOptions { count: 1800, keys: 40, rate: Some(300.0), ..PutOptions::default() };
            kinesis::put_records(&client, &label, &name, &opts).await.expect("put").manifest
        })
    };
    // Wait until both own shards and the victim has delivered something.
    let start = Instant::now();
    loop {
        let o = owners(&zk, &cluster).await;
        let t = live_tasks(&zk, &cluster).await;
        let delivered = read_deliveries(std::slice::from_ref(&victim.deliveries)).len();
        if t.len() == 2 && o.len() == 4 && o.values().filter(|x| **x == t[0]).count() == 2 && delivered > 50 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "never settled\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let victim_task = live_tasks(&zk, &cluster).await[0].clone();
    let victim_shards: Vec<String> =
        owners(&zk, &cluster).await.into_iter().filter(|(_, t)| *t == victim_task).map(|(s, _)| s).collect();
    assert_eq!(victim_shards.len(), 2);

    victim.kill();
    let killed = Instant::now();
    // The victim's checkpoints as it died (nobody else can write them before its session expires).
    let mut at_death: HashMap<String, Checkpoint> = HashMap::new();
    for sh in &victim_shards {
        let (data, _) = zk.get_data(&format!("{}/checkpoints/{sh}", cluster.stream_path())).await.unwrap();
        at_death.insert(sh.clone(), serde_json::from_slice(&data).unwrap());
    }

    // Failover: the survivor owns every shard.
    let limit = Duration::from_millis(cluster.session_timeout_ms) + Duration::from_secs(2);
    let mut failover = None;
    while killed.elapsed() < limit + Duration::from_secs(10) {
        let o = owners(&zk, &cluster).await;
        if o.len() == 4 && o.values().all(|t| *t != victim_task) {
            failover = Some(killed.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let failover = failover.unwrap_or_else(|| panic!("shards never re-owned\n{}", cluster.logs()));
    eprintln!("failover after SIGKILL: {failover:?} (session timeout {} ms)", cluster.session_timeout_ms);
    assert!(failover <= limit, "failover took {failover:?}, limit {limit:?}");

    let manifest = producer.await.unwrap();
    let report = cluster.wait_delivered(std::slice::from_ref(&manifest), Duration::from_secs(60)).await;
    assert_eq!(report.lost, 0, "{report:?}\n{}", cluster.logs());
    eprintln!("crash audit: {}", serde_json::to_string(&report).unwrap());

    // Every duplicate is a record of the victim's shards after its last checkpoint.
    let all = read_deliveries(&cluster.delivery_files());
    let mut count: BTreeMap<(String, String, u64), Vec<&squall::audit::Delivery>> = BTreeMap::new();
    for d in &all {
        count.entry((d.run.clone(), d.key.clone(), d.seq)).or_default().push(d);
    }
    let mut dups = 0;
    for ((_, key, seq), ds) in count.iter().filter(|(_, v)| v.len() > 1) {
        dups += ds.len() - 1;
        let d = ds[0];
        let cp = at_death
            .get(&d.shard)
            .unwrap_or_else(|| panic!("{key}/{seq} duplicated from {}, not a victim shard", d.shard));
        if let CheckpointPosition::AfterSequence { sequence, .. } = &cp.position {
            assert!(
                sequence_cmp(&d.sequence, sequence).is_gt(),
                "{key}/{seq} (sequence {}) was checkpointed ({sequence}) yet delivered again",
                d.sequence
            );
        }
    }
    assert_eq!(dups as u64, report.duplicates);

    assert_eq!(survivor.stop(Duration::from_secs(30)), Some(0));
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}
