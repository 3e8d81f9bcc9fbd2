//! Watermarks and drain across a stage boundary (examples/windowed_counts.rs with
//! `--boundary-shards`): the windows run in the second stage, behind an intermediate Kinesis
//! stream, and see the watermark carried across it. A drain crosses the boundary, also when the
//! intermediate stream was split and a writer of it is a zombie that comes back after DRAINED.

use squall_test_support as support;

use std::time::Duration;

use squall::kinesis::{self, PutOptions};
use support::TestStream;
use support::ops::{RoundTrips, assert_watermarks_monotonic, json_lines, squall_run};
use support::workers::{Cluster, Worker, example_bin, read_deliveries, read_log_entries, scratch};

fn files(cluster: &Cluster, suffix: &str) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = cluster
        .dir
        .read_dir()
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    v.sort();
    v
}

/// Starts worker `name` of `windowed_counts` in two stages (1 s windows, 2 intermediate shards),
/// logging fired windows to `{name}.windows.jsonl` and watermarks to `{name}.watermarks.jsonl`.
fn start_windows(cluster: &Cluster, name: &str) -> Worker {
    let out = cluster.dir.join(format!("{name}.windows.jsonl"));
    let wms = cluster.dir.join(format!("{name}.watermarks.jsonl"));
    cluster.start_example(
        &example_bin("windowed_counts"),
        name,
        1,
        &[
            "--window-ms",
            "1000",
            "--boundary-shards",
            "2",
            "--out",
            out.to_str().unwrap(),
            "--watermarks",
            wms.to_str().unwrap(),
        ],
    )
}

async fn delete_intermediate(cluster: &Cluster) {
    let endpoint = support::kinesis_endpoint();
    let client = endpoint.client().await.unwrap();
    let _ = kinesis::delete_stream(&client, &endpoint.label(), &format!("{}-keys", cluster.topology)).await;
}

/// An idle source shard and an idle intermediate shard do not hold the second stage's windows
/// back longer than the product's terms. A window ending at `E` can fire once the first stage's
/// watermark passed `E` (the active shard: a record with an arrival time at or after `E` was
/// read, seen here as its delivery in the first stage; the idle shard: `E` plus the idle timeout,
/// an idle poll and a watermark interval), then the boundary carries it: a writer watermark
/// interval, a put waiting behind the put in flight (two PutRecords round trips), an idle poll
/// and a GetRecords round trip of the second stage's reader, a watermark interval, and
/// `HOPS_MS` for the in-process hops of both stages on a machine running other tests. The
/// round trips are the service's, sampled during the run (the engine answers one request at a
/// time, and the other tests of this binary load it): each window is bounded with the longest
/// call in flight between its end and its firing. Every figure is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn across_a_boundary_an_idle_shard_does_not_stall_windows_and_they_fire_in_event_time_order() {
    const HOPS_MS: i64 = 1000;
    const WRITER_INTERVAL_MS: i64 = 1000; // the boundary's default watermark_interval_ms
    // 2 source shards, one idle (a single key); 2 intermediate shards, one idle (one key)
    let s = TestStream::create("sidle", 2).await;
    let probe = TestStream::create("sidle-probe", 1).await;
    let dir = scratch("sidle");
    let (idle_ms, poll_ms, interval_ms) = (1000, 100, 200);
    let cluster = Cluster::with_spout_config(
        &s.name,
        &dir,
        serde_json::json!({
            "watermark_idle_timeout_ms": idle_ms,
            "idle_poll_interval_ms": poll_ms,
            "watermark_interval_ms": interval_ms,
        }),
    );
    let (out, wms) = (dir.join("w.windows.jsonl"), dir.join("w.watermarks.jsonl"));
    let inter = format!("{}-keys", cluster.topology);
    let mut w = start_windows(&cluster, "w");
    let rtts = RoundTrips::start(&s.client, &[&s.name, &inter], Some(&probe.name), Duration::from_millis(250));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let opts = PutOptions { count: 400, keys: 1, rate: Some(60.0), ..PutOptions::default() };
    kinesis::put_records(&s.client, &s.label(), &s.name, &opts).await.unwrap();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let rtts = rtts.stop().await;
    assert!(rtts.count(false) >= 20 && rtts.count(true) >= 10, "round trips sampled: {}", rtts.0.len());
    let fired: Vec<_> = json_lines(&out).into_iter().filter(|l| l.get("late").is_none()).collect();
    assert!(fired.len() >= 4, "windows fired while shards were idle: {fired:?}\n{}", cluster.logs());
    // when the first stage delivered the first record that arrived at or after each instant
    let mut delivered: Vec<(i64, i64)> =
        read_deliveries(&cluster.delivery_files()).iter().map(|d| (d.arrival_ms, d.t_us / 1000)).collect();
    delivered.sort_unstable();
    let mut first_after: Vec<(i64, i64)> = Vec::with_capacity(delivered.len());
    for &(arrival, at) in delivered.iter().rev() {
        let at = first_after.last().map_or(at, |&(_, later)| at.min(later));
        first_after.push((arrival, at));
    }
    first_after.reverse();
    let data_ready = |end: i64| {
        let i = first_after.partition_point(|&(a, _)| a < end);
        first_after.get(i).map(|&(_, at)| at)
    };
    let mut report = Vec::new();
    for f in &fired {
        let (end, at) = (f["window_end_ms"].as_i64().unwrap(), f["fired_at_ms"].as_i64().unwrap());
        assert!(at >= end, "a window fired before its end: {f}");
        let idle_ready = end + idle_ms + poll_ms + interval_ms;
        let ready = data_ready(end).map_or(idle_ready, |d| d.max(idle_ready));
        let (put, get) = (rtts.max_during(true, end, at), rtts.max_during(false, end, at));
        let limit = ready + WRITER_INTERVAL_MS + 2 * put + poll_ms + get + interval_ms + HOPS_MS;
        report.push(format!("{}/{}", at - end, limit - end));
        assert!(
            at <= limit,
            "window fired {} ms after its end, past the bound of {} ms: first stage's watermark past its end \
             {} ms after it (data read {:?} ms after it; idle shard {} ms = idle timeout {idle_ms} + idle poll \
             {poll_ms} + watermark interval {interval_ms}), then writer interval {WRITER_INTERVAL_MS} + 2 x \
             PutRecords {put} + idle poll {poll_ms} + GetRecords {get} + watermark interval {interval_ms} + hops \
             {HOPS_MS}: {f}\n{}",
            at - end,
            limit - end,
            ready - end,
            data_ready(end).map(|d| d - end),
            idle_ready - end,
            cluster.logs()
        );
    }
    let (put_max, put_median) = rtts.max_and_median(true);
    let (get_max, get_median) = rtts.max_and_median(false);
    eprintln!(
        "across the boundary: {} windows fired, delay/bound ms: {}; PutRecords max {put_max} median {put_median}, \
         GetRecords max {get_max} median {get_median} ({} and {} sampled)",
        fired.len(),
        report.join(" "),
        rtts.count(true),
        rtts.count(false)
    );
    // event-time order: the one output task sees windows of the key in order of their end
    let ends: Vec<i64> = fired.iter().map(|f| f["window_end_ms"].as_i64().unwrap()).collect();
    assert!(ends.windows(2).all(|p| p[0] < p[1]), "windows fired out of event-time order: {ends:?}");
    let total: u64 = fired.iter().map(|f| f["count"].as_u64().unwrap()).sum();
    assert!(total > 300, "most records counted in fired windows: {total}");
    assert!(assert_watermarks_monotonic(&wms) > 5, "watermarks observed");
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0), "{}", cluster.logs());
    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    delete_intermediate(&cluster).await;
    s.delete().await;
    probe.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_crosses_the_boundary_and_ignores_a_stale_deployments_marker() {
    let s = TestStream::create("sdrain", 3).await;
    let dir = scratch("sdrain");
    let cluster = Cluster::with_spout_config(&s.name, &dir, serde_json::json!({"watermark_idle_timeout_ms": 1000}));
    let mut a = start_windows(&cluster, "a");
    let mut b = start_windows(&cluster, "b");
    let producer = {
        let (client, label, name) = (s.client.clone(), s.label(), s.name.clone());
        tokio::spawn(async move {
            let opts = PutOptions { count: 3000, keys: 12, rate: Some(150.0), ..PutOptions::default() };
            kinesis::put_records(&client, &label, &name, &opts).await.expect("put").manifest
        })
    };
    let wait_delivered = |n: usize| {
        let cluster = &cluster;
        async move {
            let start = std::time::Instant::now();
            while read_deliveries(&cluster.delivery_files()).len() < n {
                assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "fewer than {n} delivered in 60 s\n{}",
                    cluster.logs()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    wait_delivered(100).await;

    // a drain marker of another deployment in every shard of the intermediate stream
    let inter = format!("{}-keys", cluster.topology);
    let shards = kinesis::list_shards(&s.client, &s.label(), &inter).await.expect("the intermediate stream exists");
    let stale = squall::stage::codec::encode_control(0x57a1e, "stale0000000", Some(1), true);
    for sh in shards.iter().filter(|sh| !sh.closed) {
        s.client
            .put_record()
            .stream_name(&inter)
            .partition_key("stale")
            .explicit_hash_key(&sh.starting_hash_key)
            .data(aws_sdk_kinesis::primitives::Blob::new(stale.to_vec()))
            .send()
            .await
            .expect("put a stale marker");
    }
    wait_delivered(300).await;
    assert!(a.is_running() && b.is_running(), "a stale marker stopped a worker\n{}", cluster.logs());

    let (rc, out, err) = squall_run(&cluster, &["drain", &cluster.topology, "--wait", "90"]);
    assert_eq!(rc, 0, "{out}{err}\n{}", cluster.logs());
    assert_eq!(a.stop(Duration::from_secs(30)), Some(0), "worker exits 0 after the drain\n{}", cluster.logs());
    assert_eq!(b.stop(Duration::from_secs(30)), Some(0));
    let (_, st, _) = squall_run(&cluster, &["status", &cluster.topology, "--json"]);
    let st: serde_json::Value = serde_json::from_str(&st).unwrap();
    assert_eq!(st["state"], "DRAINED");
    // whole logs (`cluster.logs()` keeps only their ends)
    let logs: String = files(&cluster, ".log").iter().map(|p| std::fs::read_to_string(p).unwrap_or_default()).collect();
    let ignored = logs.matches("ignoring a drain marker of another deployment").count();
    assert!(ignored >= 2, "the stale markers (one per intermediate shard) were read and ignored: {ignored}");

    // everything the first stage delivered went through the boundary and was counted by the
    // windows flushed at the drain
    let delivered = read_deliveries(&cluster.delivery_files());
    assert!(
        delivered.len() >= 300 && delivered.len() < 3000,
        "the drain came under load: {} delivered",
        delivered.len()
    );
    let windows = files(&cluster, ".windows.jsonl");
    let counted: u64 = windows
        .iter()
        .flat_map(|p| json_lines(p))
        .filter(|l| l.get("late").is_none())
        .map(|l| l["count"].as_u64().unwrap())
        .sum();
    let late = windows.iter().flat_map(|p| json_lines(p)).filter(|l| l.get("late").is_some()).count() as u64;
    assert_eq!(
        counted + late,
        delivered.len() as u64,
        "the second stage counted every record the first delivered before draining\n{}",
        cluster.logs()
    );
    for p in files(&cluster, ".watermarks.jsonl") {
        assert_watermarks_monotonic(&p);
        let last = json_lines(&p).last().cloned().unwrap();
        assert_eq!(last["watermark"].as_u64(), Some(u64::MAX), "+infinity watermark at the drain");
    }
    producer.abort();
    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    delete_intermediate(&cluster).await;
    s.delete().await;
}

/// The ZooKeeper session of the worker with process id `pid`: the ephemeral owner of its status
/// znode (every node of the worker, its producer registrations too, is of that session). Waits
/// for its first status.
async fn worker_session(zk: &zookeeper_client::Client, cluster: &Cluster, pid: u32) -> i64 {
    let dir = format!("{}/topologies/{}/workers", cluster.zk_root, cluster.topology);
    let start = std::time::Instant::now();
    loop {
        for w in zk.list_children(&dir).await.unwrap_or_default() {
            let path = format!("{dir}/{w}");
            if support::ops::znode_json(zk, &path).await.is_some_and(|v| v["pid"].as_u64() == Some(u64::from(pid)))
                && let Ok(Some(st)) = zk.check_stat(&path).await
            {
                return st.ephemeral_owner;
            }
        }
        assert!(start.elapsed() < Duration::from_secs(30), "worker {pid} published no status\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The producers of intermediate stream `stream` registered by ZooKeeper session `session`.
async fn producers_of(zk: &zookeeper_client::Client, cluster: &Cluster, stream: &str, session: i64) -> Vec<u64> {
    let dir = format!("{}/topologies/{}/stages/{stream}/producers", cluster.zk_root, cluster.topology);
    let mut out = Vec::new();
    for p in zk.list_children(&dir).await.unwrap_or_default() {
        if let Ok(Some(st)) = zk.check_stat(&format!("{dir}/{p}")).await
            && st.ephemeral_owner == session
        {
            let id = p.split('-').next().and_then(|h| u64::from_str_radix(h, 16).ok());
            out.push(id.unwrap_or_else(|| panic!("producer node {p}: expected {{producer:016x}}-{{deployment}}")));
        }
    }
    out
}

/// Data tuples of this deployment's records in `shard` of intermediate stream `stream` after
/// sequence `after` (all when `None`) that arrived before `before_ms`.
async fn tuples_after(s: &TestStream, stream: &str, shard: &str, after: Option<&str>, before_ms: i64) -> u64 {
    use aws_sdk_kinesis::types::ShardIteratorType;
    let req = s.client.get_shard_iterator().stream_name(stream).shard_id(shard);
    let req = match after {
        Some(seq) => req.shard_iterator_type(ShardIteratorType::AfterSequenceNumber).starting_sequence_number(seq),
        None => req.shard_iterator_type(ShardIteratorType::TrimHorizon),
    };
    let mut it = req.send().await.expect("GetShardIterator").shard_iterator;
    let mut n = 0;
    while let Some(i) = it.take() {
        let r = s.client.get_records().shard_iterator(i).limit(10_000).send().await.expect("GetRecords");
        for rec in r.records() {
            let arrived = rec.approximate_arrival_timestamp().and_then(|t| t.to_millis().ok()).unwrap_or(0);
            if arrived >= before_ms {
                return n;
            }
            if let Ok(d) = squall::stage::codec::decode(&bytes::Bytes::copy_from_slice(rec.data().as_ref()), 2)
                && let squall::stage::codec::Payload::Data(values) = d.payload
            {
                n += values.len() as u64;
            }
        }
        if r.records().is_empty() && r.millis_behind_latest().unwrap_or(0) == 0 {
            break;
        }
        it = r.next_shard_iterator().map(String::from);
    }
    n
}

/// The shards of `stream` whose lease belongs to ZooKeeper session `session`.
async fn shards_held(zk: &zookeeper_client::Client, cluster: &Cluster, stream: &str, session: i64) -> Vec<String> {
    let dir = format!("{}/topologies/{}/streams/{stream}/owners", cluster.zk_root, cluster.topology);
    let seq = |n: &str| n.rsplit_once('-').and_then(|(_, d)| d.parse::<u64>().ok()).unwrap_or(u64::MAX);
    let mut out = Vec::new();
    for shard in zk.list_children(&dir).await.unwrap_or_default() {
        let mut leases = zk.list_children(&format!("{dir}/{shard}")).await.unwrap_or_default();
        leases.sort_by_key(|n| seq(n));
        if let Some(first) = leases.first()
            && let Ok(Some(st)) = zk.check_stat(&format!("{dir}/{shard}/{first}")).await
            && st.ephemeral_owner == session
        {
            out.push(shard);
        }
    }
    out
}

/// The open shards of `stream` whose lease belongs to ZooKeeper session `session`, and the
/// number of open shards.
async fn open_shards_held(
    s: &TestStream,
    zk: &zookeeper_client::Client,
    cluster: &Cluster,
    stream: &str,
    session: i64,
) -> (usize, usize) {
    let open: Vec<String> = kinesis::list_shards(&s.client, &s.label(), stream)
        .await
        .unwrap()
        .into_iter()
        .filter(|d| !d.closed)
        .map(|d| d.shard_id)
        .collect();
    let dir = format!("{}/topologies/{}/streams/{stream}/owners", cluster.zk_root, cluster.topology);
    let seq = |n: &str| n.rsplit_once('-').and_then(|(_, d)| d.parse::<u64>().ok()).unwrap_or(u64::MAX);
    let mut held = 0;
    for shard in &open {
        let mut leases = zk.list_children(&format!("{dir}/{shard}")).await.unwrap_or_default();
        leases.sort_by_key(|n| seq(n));
        if let Some(first) = leases.first()
            && let Ok(Some(st)) = zk.check_stat(&format!("{dir}/{shard}/{first}")).await
            && st.ephemeral_owner == session
        {
            held += 1;
        }
    }
    (held, open.len())
}

/// A drain across a split intermediate stream with a zombie writer. Two `windowed_counts
/// --boundary-shards 2` workers; a shard of `{topology}-keys` is split under load and a child is
/// read; b (a writer of the intermediate stream, and a reader of both streams) is SIGSTOPped past
/// its ZooKeeper session, so a takes its shards, and the topology is drained while b is frozen.
/// b's producers left the registry with their session: a's second stage drains only once it has
/// consumed the intermediate shards past their departure. After DRAINED, b is resumed: it must
/// hand nothing on (no read, no window, no data record put into the intermediate stream: the
/// deployment is over), the windows count every tuple put into the intermediate stream, a's
/// writer put every record a's first stage delivered, and the next deployment loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_across_a_split_intermediate_stream_with_a_zombie_writer_hands_nothing_on_after_it() {
    let t0 = std::time::Instant::now();
    let mark = |what: &str| eprintln!("[{:>6.1} s] {what}", t0.elapsed().as_secs_f64());
    let s = TestStream::create("szdrain", 3).await;
    let dir = scratch("szdrain");
    let cluster = Cluster::with_spout_config(&s.name, &dir, serde_json::json!({"watermark_idle_timeout_ms": 1000}));
    let mut a = start_windows(&cluster, "a");
    let mut b = start_windows(&cluster, "b");
    let producer = {
        let (client, label, name) = (s.client.clone(), s.label(), s.name.clone());
        tokio::spawn(async move {
            let opts = PutOptions { count: 4500, keys: 12, rate: Some(150.0), ..PutOptions::default() };
            kinesis::put_records(&client, &label, &name, &opts).await.expect("put").manifest
        })
    };
    let delivered_by = |w: &Worker| read_deliveries(std::slice::from_ref(&w.deliveries)).len();
    let guard = std::time::Instant::now();
    while delivered_by(&a) < 100 || delivered_by(&b) < 100 {
        assert!(guard.elapsed() < Duration::from_secs(60), "a and b never both delivered\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // split an intermediate shard under load; wait until a child was read (its checkpoint moved)
    let inter = format!("{}-keys", cluster.topology);
    let parent = "shardId-000000000000";
    kinesis::split_shard(&s.client, &s.label(), &inter, parent).await.expect("split the intermediate stream");
    let children: Vec<String> = kinesis::list_shards(&s.client, &s.label(), &inter)
        .await
        .unwrap()
        .into_iter()
        .filter(|d| d.parent_shard_id.as_deref() == Some(parent))
        .map(|d| d.shard_id)
        .collect();
    assert_eq!(children.len(), 2, "{children:?}");
    let zk = support::zk_client().await;
    let cps = format!("{}/topologies/{}/streams/{inter}/checkpoints", cluster.zk_root, cluster.topology);
    support::ops::wait_for(&cluster, "a child of the split intermediate shard read", Duration::from_secs(60), || {
        let (zk, cps, children) = (&zk, &cps, &children);
        async move {
            for c in children {
                let cp = support::ops::znode_json(zk, &format!("{cps}/{c}")).await;
                if cp.is_some_and(|cp| cp["position"]["type"] == "AFTER_SEQUENCE") {
                    return Some(());
                }
            }
            None
        }
    })
    .await;
    mark(&format!("{inter}: {parent} split into {children:?}, a child read"));

    // b: a writer (its producers) and a reader; frozen past its session
    let (session_a, session_b) =
        (worker_session(&zk, &cluster, a.pid()).await, worker_session(&zk, &cluster, b.pid()).await);
    let (a_producers, b_producers) =
        (producers_of(&zk, &cluster, &inter, session_a).await, producers_of(&zk, &cluster, &inter, session_b).await);
    assert!(!a_producers.is_empty() && !b_producers.is_empty(), "{a_producers:?} {b_producers:?}");
    let (b_held, _) = open_shards_held(&s, &zk, &cluster, &s.name, session_b).await;
    let (b_held_inter, _) = open_shards_held(&s, &zk, &cluster, &inter, session_b).await;
    assert!(
        b_held > 0 && b_held_inter > 0,
        "b reads both streams: {b_held} source, {b_held_inter} intermediate shards"
    );
    b.pause();
    let paused_at = squall::coord::now_ms();
    // where a takes b's intermediate shards over: b's checkpoints (b, frozen, writes none)
    let mut b_inter = Vec::new();
    for shard in shards_held(&zk, &cluster, &inter, session_b).await {
        let cp = support::ops::znode_json(&zk, &format!("{cps}/{shard}")).await;
        let after = cp.and_then(|cp| cp["position"]["sequence"].as_str().map(str::to_string));
        b_inter.push((shard, after));
    }
    mark(&format!(
        "SIGSTOP b (producers {b_producers:x?}; {b_held} source and {b_held_inter} intermediate shards, checkpoints \
         {b_inter:?})"
    ));
    // a takes every open shard of both streams once b's session expired
    support::ops::wait_for(&cluster, "a holding every shard", Duration::from_secs(60), || {
        let (s, zk, cluster, inter) = (&s, &zk, &cluster, &inter);
        async move {
            let (x, n) = open_shards_held(s, zk, cluster, &s.name, session_a).await;
            let (y, m) = open_shards_held(s, zk, cluster, inter, session_a).await;
            (x == n && y == m).then_some(())
        }
    })
    .await;
    mark("b's session expired; a holds every shard");

    let (rc, out, err) = squall_run(&cluster, &["drain", &cluster.topology, "--wait", "90"]);
    assert_eq!(rc, 0, "{out}{err}\n{}", cluster.logs());
    mark(&format!("drained: {}", out.trim()));
    assert_eq!(a.stop(Duration::from_secs(30)), Some(0), "a exits 0 after the drain\n{}", cluster.logs());
    let (_, st, _) = squall_run(&cluster, &["status", &cluster.topology, "--json"]);
    let st: serde_json::Value = serde_json::from_str(&st).unwrap();
    assert_eq!(st["state"], "DRAINED");
    let deployment = st["deployment_id"].as_str().unwrap().to_string();

    // the zombie comes back after DRAINED: it leaves without handing anything on
    let resumed_at = squall::coord::now_ms();
    b.resume();
    mark("SIGCONT b");
    let guard = std::time::Instant::now();
    while b.is_running() && guard.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let b_exit = b.stop(Duration::from_secs(30));
    mark(&format!("b exited: {b_exit:?}"));
    let b_log = std::fs::read_to_string(dir.join("b.log")).unwrap_or_default();
    let after: Vec<_> = read_log_entries(std::slice::from_ref(&b.read_log))
        .into_iter()
        .filter(|e| e.t_ms >= resumed_at && matches!(e.event.as_str(), "acquire" | "records"))
        .collect();
    let b_windows_after: Vec<_> = json_lines(&dir.join("b.windows.jsonl"))
        .into_iter()
        .filter(|l| l["fired_at_ms"].as_i64().or(l["at_ms"].as_i64()).unwrap_or(0) >= resumed_at)
        .collect();

    // the intermediate stream, read back: b's producers put no data record after SIGCONT
    let inter_stream = TestStream::existing(&inter).await;
    let mut tuples_before = 0u64;
    let (mut a_tuples, mut b_tuples, mut b_after, mut b_control_after) = (0u64, 0u64, Vec::new(), 0u64);
    for r in support::stages::read_records(&inter_stream).await {
        let arrived = r.approximate_arrival_timestamp().and_then(|t| t.to_millis().ok()).unwrap_or(0);
        let Ok(rec) = squall::stage::codec::decode(&bytes::Bytes::copy_from_slice(r.data().as_ref()), 2) else {
            continue;
        };
        let zombie = b_producers.contains(&rec.producer);
        if let squall::stage::codec::Payload::Data(values) = &rec.payload {
            let n = values.len() as u64;
            if rec.deployment == deployment && arrived < resumed_at {
                tuples_before += n;
            }
            if a_producers.contains(&rec.producer) {
                a_tuples += n;
            }
            if zombie {
                b_tuples += n;
                if arrived >= resumed_at {
                    b_after.push((r.sequence_number().to_string(), arrived, n));
                }
            }
        } else if zombie && arrived >= resumed_at {
            b_control_after += 1;
        }
    }
    mark(&format!(
        "after SIGCONT, b: reads {}, windows {}, data records put {} ({} tuples), control records {b_control_after}",
        after.len(),
        b_windows_after.len(),
        b_after.len(),
        b_after.iter().map(|x| x.2).sum::<u64>()
    ));
    assert!(
        after.is_empty() && b_windows_after.is_empty() && b_after.is_empty(),
        "the zombie handed on after the drain: read {after:?}; windows {b_windows_after:?}; data records put {b_after:?}\n{b_log}"
    );
    assert_eq!(b_exit, Some(0), "the zombie exits 0 (its deployment drained)\n{b_log}");

    // everything put into the intermediate stream before the drain was counted, and a's writer
    // put every record a's first stage delivered (what b delivered and never put, a read again).
    // Counted twice at most: what b's second stage had read past its checkpoints when it froze
    // (a reads it again from there: at-least-once, as after any crash)
    let windows: Vec<serde_json::Value> =
        ["a", "b"].iter().flat_map(|n| json_lines(&dir.join(format!("{n}.windows.jsonl")))).collect();
    let counted: u64 = windows.iter().filter(|l| l.get("late").is_none()).map(|l| l["count"].as_u64().unwrap()).sum();
    let late = windows.iter().filter(|l| l.get("late").is_some()).count() as u64;
    let (da, db) = (delivered_by(&a) as u64, delivered_by(&b) as u64);
    let mut read_again = 0;
    for (shard, after) in &b_inter {
        read_again += tuples_after(&inter_stream, &inter, shard, after.as_deref(), paused_at).await;
    }
    mark(&format!(
        "first stage delivered a {da}, b {db}; intermediate data tuples {tuples_before} (a's {a_tuples}, b's \
         {b_tuples}); windows counted {counted}, late {late}; b's second stage had {read_again} past its checkpoints"
    ));
    assert_eq!(a_tuples, da, "a's writer put every record a's first stage delivered");
    assert!(b_tuples <= db, "b put only what it delivered");
    assert!(
        counted + late >= tuples_before && counted + late <= tuples_before + read_again,
        "the second stage counted every tuple put into the intermediate stream before the drain, twice at most \
         those b's second stage had read past its checkpoints ({read_again}): counted {counted} + late {late}, \
         tuples {tuples_before}\n{}",
        cluster.logs()
    );

    // the next deployment loses nothing
    let manifest = producer.await.unwrap();
    let mut c = start_windows(&cluster, "c");
    let r = cluster.wait_delivered(std::slice::from_ref(&manifest), Duration::from_secs(90)).await;
    assert_eq!(r.lost, 0, "{r:?}\n{}", cluster.logs());
    mark(&format!("next deployment: {r:?}"));
    assert_eq!(c.stop(Duration::from_secs(30)), Some(0));
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    delete_intermediate(&cluster).await;
    inter_stream.forget();
    s.delete().await;
}
