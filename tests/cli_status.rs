//! What an operator sees: `squall status` as a compact table with the topology-wide largest
//! MillisBehindLatest, `squall status --watch`, and progress of long operations on a terminal
//! (a pseudo-terminal made by `script`) but not when piped.

use squall_test_support as support;

use std::process::Command;
use std::time::Duration;

use squall::kinesis::{self, PutOptions};
use support::TestStream;
use support::ops::squall;
use support::workers::{Cluster, scratch};

/// Runs `squall ARGS` on a pseudo-terminal (`script`), as an operator at a terminal would, for
/// at most `secs` (`--watch` never ends by itself): everything it wrote to the terminal.
fn on_terminal(cluster: &Cluster, secs: u32, args: &[&str]) -> (bool, String) {
    let cmd = ["timeout".to_string(), secs.to_string(), env!("CARGO_BIN_EXE_squall").to_string()]
        .into_iter()
        .chain(args.iter().map(|a| a.to_string()))
        .collect::<Vec<_>>()
        .join(" ");
    let out = Command::new("script")
        .args(["-qefc", &cmd, "/dev/null"])
        .env("SQUALL_ZK", support::zk_connect())
        .env("SQUALL_ZK_ROOT", &cluster.zk_root)
        .env("SQUALL_KINESIS_ENDPOINT", support::kinesis_endpoint().endpoint)
        .env("TERM", "xterm")
        .env_remove("RUST_LOG")
        .output()
        .expect("run script (util-linux) for a pseudo-terminal");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_table_watch_and_progress_on_a_terminal_only() {
    let s = TestStream::create("clistatus", 3).await;
    let dir = scratch("clistatus");
    let cluster = Cluster::new(&s.name, &dir);
    let opts = PutOptions { count: 300, keys: 30, ..PutOptions::default() };
    let first = kinesis::put_records(&s.client, &s.label(), &s.name, &opts).await.unwrap().manifest;
    let mut w = cluster.start("w", 2);
    let r = cluster.wait_delivered(std::slice::from_ref(&first), Duration::from_secs(60)).await;
    assert_eq!(r.lost, 0, "{r:?}\n{}", cluster.logs());
    // every shard reports a lag once read (a status is written every checkpoint interval, 300 ms)
    let asked = std::time::Instant::now();
    let json = loop {
        let out = squall(&cluster).args(["status", &cluster.topology, "--json"]).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status json");
        let shards = v["streams"][0]["shards"].as_array().cloned().unwrap_or_default();
        if shards.len() == 3 && shards.iter().all(|sh| sh["millis_behind_latest"].is_i64() && sh["owner"].is_string()) {
            break v;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(30),
            "after 30 s `squall status --json` still shows a shard without a lag or an owner: {v}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };

    // the table: the headline names the largest lag, each shard a row with its owner
    let out = squall(&cluster).args(["status", &cluster.topology]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with(&format!("topology {}  state ACTIVE", cluster.topology)), "{text}");
    let max = json["streams"][0]["shards"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|sh| sh["millis_behind_latest"].as_i64())
        .max();
    assert!(
        lines[1].starts_with(&format!("max MillisBehindLatest {} ms (stream {}", max.unwrap(), s.name))
            && lines[1].ends_with("shards with errors 0"),
        "{text}"
    );
    assert!(text.contains(&format!("stream {}: 3 shards (3 open, 0 finished)", s.name)), "{text}");
    for sh in json["streams"][0]["shards"].as_array().unwrap() {
        let (id, owner) = (sh["shard_id"].as_str().unwrap(), sh["owner"].as_str().unwrap());
        assert!(
            text.lines().any(|l| l.contains(id) && l.contains(owner) && l.contains("open")),
            "{id} {owner}: {text}"
        );
    }
    assert!(!text.contains('\x1b'), "no terminal escapes when piped: {text:?}");

    // --watch, piped: one status after another, no screen clearing, all read over the one pair
    // of ZooKeeper sessions opened at the start (each session opened is logged at debug)
    let sessions_opened = |stderr: &[u8]| String::from_utf8_lossy(stderr).matches("ZooKeeper session opened").count();
    let mut child = squall(&cluster)
        .args(["status", &cluster.topology, "--watch", "1"])
        .env("RUST_LOG", "warn,squall::coord=debug")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let n = text.lines().filter(|l| l.starts_with("topology ")).count();
    assert!(n >= 3, "--watch 1 printed {n} statuses in 3.5 s: {text}");
    assert!(!text.contains('\x1b'), "no screen clearing when piped");
    assert_eq!(sessions_opened(&out.stderr), 2, "{n} statuses: {}", String::from_utf8_lossy(&out.stderr));
    // wait-settled polls every 250 ms over one pair of sessions too: 3 workers never come, so
    // it polls until its 2 s timeout and fails naming why
    let out = squall(&cluster)
        .args(["wait-settled", &cluster.topology, "--workers", "3", "--timeout", "2"])
        .env("RUST_LOG", "warn,squall::coord=debug")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("did not settle within 2 s"), "{err}");
    assert_eq!(sessions_opened(&out.stderr), 2, "{err}");
    // on a terminal it redraws (clear screen + home) with the time
    let (_, tty) = on_terminal(&cluster, 3, &["status", &cluster.topology, "--watch", "1"]);
    assert!(tty.contains("\x1b[2J\x1b[H") && tty.contains("Ctrl-C stops"), "{tty:?}");
    let rc = squall(&cluster).args(["status", &cluster.topology, "--watch", "0"]).output().unwrap();
    assert!(!rc.status.success() && String::from_utf8_lossy(&rc.stderr).contains("--watch 0"));

    // progress: `stream put --count` draws a bar on a terminal and nothing when piped
    let piped = squall(&cluster).args(["stream", "put", &s.name, "--count", "300", "--rate", "150"]).output().unwrap();
    assert!(piped.status.success(), "{}", String::from_utf8_lossy(&piped.stderr));
    let err = String::from_utf8_lossy(&piped.stderr);
    assert!(err.trim().is_empty(), "a piped put writes no progress: {err:?}");
    assert!(String::from_utf8_lossy(&piped.stdout).starts_with("put 300 records"));
    let (ok, tty) = on_terminal(&cluster, 120, &["stream", "put", &s.name, "--count", "300", "--rate", "150"]);
    assert!(ok, "{tty}");
    let name = &s.name;
    assert!(tty.contains(&format!("put {name} [")) && tty.contains("/300"), "no progress bar on a terminal: {tty:?}");
    assert!(tty.contains("put 300 records"), "{tty:?}");

    // a kill's wait shows a spinner on a terminal
    let (ok, tty) = on_terminal(&cluster, 120, &["kill", &cluster.topology, "--wait", "5"]);
    assert!(ok, "{tty}\n{}", cluster.logs());
    assert!(tty.contains("waiting for the workers to stop") && tty.contains("killed; every worker stopped"), "{tty:?}");
    assert_eq!(w.stop(Duration::from_secs(30)), Some(0));

    let zk = support::zk_client().await;
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}
