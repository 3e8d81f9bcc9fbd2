//! `squall stream ...` and `localstack/up` driven as a user would, including their error cases.

use squall_test_support as support;

use std::process::Command;

fn squall() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_squall"));
    c.env("SQUALL_KINESIS_ENDPOINT", support::kinesis_endpoint().endpoint).env("RUST_LOG", "warn");
    c
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().expect("run squall");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn create_put_describe_split_merge_scale_delete() {
    let name = support::unique_name("cli");
    let dir = support::workers::scratch("cli");
    let manifest = dir.join("manifest.json");
    let (rc, out, err) = run(squall().args(["stream", "create", &name, "--shards", "2"]));
    assert_eq!(rc, 0, "{out}{err}");
    let (rc, out, err) = run(squall()
        .args(["stream", "put", &name, "--count", "300", "--keys", "7", "--size", "200"])
        .arg("--manifest")
        .arg(&manifest));
    assert_eq!(rc, 0, "{out}{err}");
    let m: squall::kinesis::payload::Manifest = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    assert_eq!(m.total, 300);
    assert_eq!(m.counts.len(), 7);
    assert_eq!(m.counts.values().sum::<u64>(), 300);
    assert_eq!(m.stream, name);

    let (rc, out, _) = run(squall().args(["stream", "split", &name, "shardId-000000000001"]));
    assert_eq!(rc, 0, "{out}");
    let (rc, out, _) = run(squall().args(["stream", "describe", &name, "--json"]));
    assert_eq!(rc, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let shards = v["shards"].as_array().unwrap();
    assert_eq!(shards.len(), 4);
    let kids: Vec<&str> = shards
        .iter()
        .filter(|s| s["parent_shard_id"] == "shardId-000000000001")
        .map(|s| s["shard_id"].as_str().unwrap())
        .collect();
    assert_eq!(kids.len(), 2);
    let (rc, out, err) = run(squall().args(["stream", "merge", &name, kids[0], kids[1]]));
    assert_eq!(rc, 0, "{out}{err}");
    let (rc, out, err) = run(squall().args(["stream", "scale", &name, "--shards", "4"]));
    assert_eq!(rc, 0, "{out}{err}");
    let (rc, out, _) = run(squall().args(["stream", "describe", &name]));
    assert_eq!(rc, 0);
    assert!(out.contains("4 open"), "{out}");
    let (rc, _, err) = run(squall().args(["stream", "delete", &name]));
    assert_eq!(rc, 0, "{err}");
}

#[test]
fn create_on_unreachable_endpoint_names_it() {
    // A port with nothing listening: bind, read the port, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let (rc, out, err) = run(squall().args(["--endpoint", &endpoint, "stream", "create", "x", "--shards", "1"]));
    assert_ne!(rc, 0, "{out}");
    assert!(err.contains(&endpoint) && err.contains("cannot reach Kinesis"), "{err}");
}

#[test]
fn bad_arguments_are_named() {
    let (rc, _, err) = run(squall().args(["stream", "create", "x", "--shards", "0"]));
    assert_ne!(rc, 0);
    assert!(err.contains("shards"), "{err}");
    let (rc, _, err) = run(squall().args(["--endpoint", "localhost:4566", "stream", "describe", "x"]));
    assert_ne!(rc, 0);
    assert!(err.contains("endpoint") && err.contains("localhost:4566"), "{err}");
    let name = support::unique_name("cli-missing");
    let (rc, _, err) = run(squall().args(["stream", "describe", &name]));
    assert_ne!(rc, 0);
    assert!(err.contains(&name) && err.contains("does not exist"), "{err}");
    let (rc, _, err) = run(squall().args(["stream", "split", &name, "shardId-000000000000"]));
    assert_ne!(rc, 0);
    assert!(err.contains(&name), "{err}");
}

#[test]
fn localstack_up_refuses_a_taken_port_and_names_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let state = support::workers::scratch("squall-state");
    let up = concat!(env!("CARGO_MANIFEST_DIR"), "/localstack/up");
    let out = Command::new(up)
        .env("SQUALL_STATE_DIR", &state)
        .env("SQUALL_ZK_PORT", port.to_string())
        .env("SQUALL_KINESIS_PORT", free().to_string())
        .env("SQUALL_KINESIS_TLS_PORT", free().to_string())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains(&format!("port {port}")) && err.contains("SQUALL_ZK_PORT"), "{err}");
    drop(taken);
}

#[test]
fn every_service_listener_is_on_loopback_only() {
    let ports: Vec<String> =
        [("SQUALL_KINESIS_PORT", "4566"), ("SQUALL_KINESIS_TLS_PORT", "4567"), ("SQUALL_ZK_PORT", "2181")]
            .iter()
            .map(|(k, d)| std::env::var(k).unwrap_or_else(|_| d.to_string()))
            .collect();
    let out = Command::new("ss").args(["-Htln"]).output().expect("ss (iproute2) is installed by localstack/up");
    let text = String::from_utf8_lossy(&out.stdout);
    for port in &ports {
        let locals: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split_whitespace().nth(3))
            .filter(|local| local.rsplit(':').next() == Some(port.as_str()))
            .collect();
        assert!(!locals.is_empty(), "nothing listens on port {port}: are the services up?\n{text}");
        for local in locals {
            let host = &local[..local.len() - port.len() - 1];
            assert!(
                host == "127.0.0.1" || host == "[::ffff:127.0.0.1]" || host == "[::1]",
                "port {port} listens on {host}, not loopback only"
            );
        }
    }
}

#[test]
fn audit_exits_non_zero_on_loss_and_zero_otherwise() {
    let dir = support::workers::scratch("audit-cli");
    let manifest = dir.join("m.json");
    std::fs::write(&manifest, r#"{"run":"r1","stream":"s","counts":{"k":2},"total":2}"#).unwrap();
    let line = |seq: u64, t: i64| {
        format!(r#"{{"run":"r1","key":"k","seq":{seq},"shard":"s0","sequence":"1","worker":"w","t_us":{t}}}"#)
    };
    let partial = dir.join("d1.jsonl");
    std::fs::write(&partial, format!("{}\n", line(0, 1))).unwrap();
    let (rc, out, err) = run(squall().arg("audit").arg("--manifest").arg(&manifest).arg("--deliveries").arg(&partial));
    assert_ne!(rc, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["lost"], 1);
    assert!(err.contains("lost"), "{err}");
    let full = dir.join("d2.jsonl");
    std::fs::write(&full, format!("{}\n{}\n{}\n", line(1, 2), line(0, 3), line(1, 4))).unwrap();
    let (rc, out, err) =
        run(squall().arg("audit").arg("--manifest").arg(&manifest).arg("--deliveries").arg(&partial).arg(&full));
    assert_eq!(rc, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (v["lost"].as_u64(), v["duplicates"].as_u64(), v["order_violations"].as_u64()),
        (Some(0), Some(2), Some(0))
    );
    let (rc, _, err) =
        run(squall().arg("audit").arg("--manifest").arg(dir.join("nope.json")).arg("--deliveries").arg(&full));
    assert_ne!(rc, 0);
    assert!(err.contains("nope.json"), "{err}");
}
