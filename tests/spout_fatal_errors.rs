//! Errors retrying cannot fix (access denied, the stream's KMS key, a deleted stream or shard),
//! injected on GetRecords by the fault proxy as the HTTP 400 JSON answers Kinesis gives: the reader
//! backs off exponentially up to `retry.fatal_max_backoff_ms` (60 s by default; shorter here),
//! logs each attempt once at ERROR with the fix, and the worker's published status says the shard
//! is failing, that retrying cannot fix it, since when, and what to do. Once the cause is gone it
//! resumes by itself and nothing is lost.

use squall_test_support as support;

use std::time::{Duration, Instant};

use squall::kinesis::{self, PutOptions};
use support::TestStream;
use support::faultproxy::{FaultPlan, FaultProxy};
use support::workers::{Cluster, scratch};

const MIN_MS: u64 = 100;
const CAP_MS: u64 = 1_600;

/// Parses a Debug-printed Duration such as `1.5s`, `812.3ms`, `95µs`.
fn parse_duration(s: &str) -> Option<Duration> {
    let (num, unit) = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).map(|i| s.split_at(i))?;
    let v: f64 = num.parse().ok()?;
    let secs = match unit {
        "s" => v,
        "ms" => v / 1e3,
        "µs" | "us" => v / 1e6,
        "ns" => v / 1e9,
        _ => return None,
    };
    Some(Duration::from_secs_f64(secs))
}

/// The `next_attempt_in` of every ERROR line of the log that contains `needle`.
fn logged_backoffs(log: &str, needle: &str) -> Vec<Duration> {
    log.lines()
        .filter(|l| l.contains("ERROR") && l.contains(needle))
        .filter_map(|l| {
            let v = l.split("next_attempt_in=").nth(1)?.split_whitespace().next()?;
            parse_duration(v)
        })
        .collect()
}

/// The shard statuses (`shards` of the worker status znode) of the only worker of the cluster.
async fn shard_statuses(zk: &zookeeper_client::Client, cluster: &Cluster) -> serde_json::Value {
    let dir = format!("{}/topologies/{}/workers", cluster.zk_root, cluster.topology);
    let workers = zk.list_children(&dir).await.unwrap_or_default();
    let Some(w) = workers.first() else { return serde_json::Value::Null };
    let Ok((data, _)) = zk.get_data(&format!("{dir}/{w}")).await else { return serde_json::Value::Null };
    serde_json::from_slice::<serde_json::Value>(&data).map(|v| v["shards"].clone()).unwrap_or_default()
}

/// Waits until the published status of `shard` has a last_error containing every needle.
async fn wait_status(
    zk: &zookeeper_client::Client,
    cluster: &Cluster,
    shard: &str,
    needles: &[&str],
    timeout: Duration,
) -> String {
    let start = Instant::now();
    loop {
        let st = shard_statuses(zk, cluster).await;
        let err = st[shard]["last_error"].as_str().unwrap_or_default().to_string();
        if needles.iter().all(|n| err.contains(n)) {
            return err;
        }
        assert!(start.elapsed() < timeout, "status of {shard} never showed {needles:?}: {st}\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfixable_errors_back_off_to_the_cap_and_show_in_the_status() {
    let s = TestStream::create("fatal", 1).await;
    let dir = scratch("fatal");
    let shard = "shardId-000000000000";
    let proxy = FaultProxy::start(&support::kinesis_endpoint().endpoint, FaultPlan::default()).await;
    let cluster = Cluster::with_spout_config(
        &s.name,
        &dir,
        serde_json::json!({"retry": {"call_min_backoff_ms": MIN_MS, "call_max_backoff_ms": 200, "fatal_max_backoff_ms": CAP_MS}}),
    );
    let zk = support::zk_client().await;
    let url = proxy.url();
    let mut w = cluster.start_with("w", 1, &["--endpoint", &url]);
    let put = |count| {
        let opts = PutOptions { count, keys: 5, ..PutOptions::default() };
        let (client, label, name) = (s.client.clone(), s.label(), s.name.clone());
        async move { kinesis::put_records(&client, &label, &name, &opts).await.expect("put").manifest }
    };
    let m1 = put(50).await;
    let r = cluster.wait_delivered(std::slice::from_ref(&m1), Duration::from_secs(60)).await;
    assert_eq!(r.lost, 0, "{r:?}\n{}", cluster.logs());

    // 1. AccessDenied on every GetRecords, for long enough to reach the cap and stay there.
    let denied_from = proxy.elapsed();
    proxy.set_plan(FaultPlan {
        client_error: 1.0,
        client_error_code: "AccessDeniedException".into(),
        only_ops: vec!["GetRecords".into()],
        ..FaultPlan::default()
    });
    let m2 = put(50).await;
    let err =
        wait_status(&zk, &cluster, shard, &["not retryable (access_denied) since", "IAM"], Duration::from_secs(30))
            .await;
    eprintln!("status last_error: {err}");
    assert!(err.contains(shard) && err.contains(&s.name) && err.contains("kinesis:GetRecords"), "{err}");
    let start = Instant::now();
    while proxy.counters().client_errors < 12 {
        assert!(start.elapsed() < Duration::from_secs(60), "too few GetRecords attempts: {:?}", proxy.counters());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    proxy.set_plan(FaultPlan::default());
    let denied = proxy.counters().client_errors;
    let times: Vec<Duration> = proxy
        .request_times("GetRecords")
        .into_iter()
        .filter(|(t, f)| *f && *t >= denied_from)
        .map(|(t, _)| t)
        .collect();
    let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    let log = std::fs::read_to_string(dir.join("w.log")).unwrap();
    let delays = logged_backoffs(&log, "AccessDenied");
    eprintln!(
        "BACKOFF access denied: {denied} attempts; gaps between attempts {:?}; logged back-offs {:?}",
        gaps.iter().map(|g| g.as_millis()).collect::<Vec<_>>(),
        delays.iter().map(|d| d.as_millis()).collect::<Vec<_>>()
    );
    // The faults happened and each attempt was logged once at ERROR (no flood).
    assert!(times.len() >= 12, "{times:?}");
    assert!(
        delays.len() >= times.len() - 1 && delays.len() <= times.len(),
        "{} ERROR lines for {} attempts",
        delays.len(),
        times.len()
    );
    // The back-off doubles from the minimum to the cap (with up to 20% jitter below), never above.
    for (i, d) in delays.iter().enumerate() {
        let step = Duration::from_millis((MIN_MS << i.min(20)).min(CAP_MS));
        assert!(*d <= step && *d >= step.mul_f64(0.79), "back-off {i}: {d:?} for a step of {step:?}: {delays:?}");
    }
    assert!(delays.iter().filter(|d| **d >= Duration::from_millis(CAP_MS).mul_f64(0.79)).count() >= 5, "{delays:?}");
    // Attempts are never closer than their back-off (requests counted over time).
    for (i, g) in gaps.iter().enumerate() {
        assert!(
            *g >= delays[i].saturating_sub(Duration::from_millis(5)),
            "attempt {} came {g:?} after the previous",
            i + 1
        );
    }
    // It resumes by itself: everything put meanwhile is delivered, and the error is cleared.
    let resumed = Instant::now();
    let r = cluster.wait_delivered(&[m1.clone(), m2.clone()], Duration::from_secs(60)).await;
    eprintln!("BACKOFF resumed {:?} after the cause was removed", resumed.elapsed());
    assert_eq!(r.lost, 0, "{r:?}\n{}", cluster.logs());

    // 2. The stream or shard deleted (ResourceNotFound) and the KMS key disabled: the same, with
    // their own fixes.
    let mut all = vec![m1, m2];
    for (code, kind, fix) in [
        ("ResourceNotFoundException", "not_found", "squall checkpoints reset"),
        ("KMSDisabledException", "kms_key", "KMS key"),
    ] {
        proxy.set_plan(FaultPlan {
            client_error: 1.0,
            client_error_code: code.into(),
            only_ops: vec!["GetRecords".into()],
            ..FaultPlan::default()
        });
        all.push(put(20).await);
        let needle = format!("not retryable ({kind}) since");
        let err = wait_status(&zk, &cluster, shard, &[&needle, fix, shard], Duration::from_secs(30)).await;
        eprintln!("{code}: status last_error: {err}");
        let before = proxy.counters().client_errors;
        assert!(before > 0, "no {code} injected");
        proxy.set_plan(FaultPlan::default());
        let r = cluster.wait_delivered(&all, Duration::from_secs(60)).await;
        assert_eq!(r.lost, 0, "after {code}: {r:?}\n{}", cluster.logs());
    }
    // Each kind was logged at ERROR with its fix.
    let log = std::fs::read_to_string(dir.join("w.log")).unwrap();
    for (what, fix) in [("does not exist", "squall checkpoints reset"), ("KMSDisabledException", "Check the KMS key")] {
        let lines = logged_backoffs(&log, what).len();
        let with_fix = log.lines().filter(|l| l.contains("ERROR") && l.contains(what) && l.contains(fix)).count();
        assert!(lines > 0 && with_fix == lines, "{what}: {lines} ERROR lines, {with_fix} naming the fix");
    }
    // Once reading works again the status has no error.
    let start = Instant::now();
    loop {
        let st = shard_statuses(&zk, &cluster).await;
        if st[shard].is_object() && st[shard]["last_error"].is_null() {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "the error stayed in the status: {st}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(w.is_running(), "the worker died\n{}", cluster.logs());
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0), "{}", cluster.logs());
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}
