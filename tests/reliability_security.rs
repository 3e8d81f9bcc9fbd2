//! Security, end to end with real processes: workers with ZooKeeper digest authentication
//! (`--zk-user`, password only in `SQUALL_ZK_PASSWORD`); every znode the topology creates has a
//! creator-only ACL; a client without credentials can neither read nor change them; the CLI without
//! (or with wrong) credentials says "not authorized"; no credential appears in any log line (worker
//! logs at debug level, CLI output at debug level) or in the Debug output of the configuration.

use squall_test_support as support;

use std::process::Command;
use std::time::Duration;

use clap::Parser;
use squall::kinesis::{self, PutOptions};
use support::TestStream;
use support::reliability::{grep_logs, spawn_worker};
use support::workers::{Cluster, scratch};
use zookeeper_client as zk;

const USER: &str = "squall-ops";
const PASSWORD: &str = "Zq7-credential-do-not-log-4f1c";

async fn walk(client: &zk::Client, root: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_string()];
    while let Some(p) = stack.pop() {
        for c in client.list_children(&p).await.unwrap_or_else(|e| panic!("list {p}: {e}")) {
            stack.push(format!("{p}/{c}"));
        }
        out.push(p);
    }
    out.sort();
    out
}

fn cli(cluster: &Cluster, args: &[&str], creds: Option<(&str, &str)>) -> (i32, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_squall"));
    c.args(args)
        .env("SQUALL_ZK", support::zk_connect())
        .env("SQUALL_ZK_ROOT", &cluster.zk_root)
        .env("SQUALL_KINESIS_ENDPOINT", support::kinesis_endpoint().endpoint)
        .env("RUST_LOG", "debug")
        .env_remove("SQUALL_ZK_USER")
        .env_remove("SQUALL_ZK_PASSWORD");
    if let Some((u, p)) = creds {
        c.env("SQUALL_ZK_USER", u).env("SQUALL_ZK_PASSWORD", p);
    }
    let out = c.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_auth_creator_only_acls_cli_refusal_and_no_credential_in_logs() {
    let s = TestStream::create("rel-sec", 2).await;
    let dir = scratch("rel-sec");
    let cluster = Cluster::new(&s.name, &dir);
    let env = [("SQUALL_ZK_USER", USER), ("SQUALL_ZK_PASSWORD", PASSWORD)];
    let mut w1 = spawn_worker(&cluster, "w1", 1, &[], &env);
    let mut w2 = spawn_worker(&cluster, "w2", 1, &["--zk-user", USER], &env[1..]);
    let opts = PutOptions { count: 300, keys: 10, ..PutOptions::default() };
    let m = kinesis::put_records(&s.client, &s.label(), &s.name, &opts).await.unwrap().manifest;
    let r = cluster.wait_delivered(std::slice::from_ref(&m), Duration::from_secs(60)).await;
    assert_eq!(r.lost, 0, "{r:?}\n{}", cluster.logs());

    // Every znode under the topology's root: exactly one ACL, digest, this user.
    let authed = zk::Client::connector()
        .with_auth("digest", format!("{USER}:{PASSWORD}").as_bytes())
        .connect(&support::zk_connect())
        .await
        .unwrap();
    let nodes = walk(&authed, &cluster.zk_root).await;
    let kinds = ["/state", "/tasks/task-", "/shards", "/checkpoints/", "/owners/", "/lease-"];
    for k in kinds {
        assert!(nodes.iter().any(|n| n.contains(k)), "no {k} znode among {nodes:#?}");
    }
    for n in &nodes {
        let (acls, _) = authed.get_acl(n).await.unwrap();
        assert_eq!(acls.len(), 1, "{n}: {acls:?}");
        assert!(acls[0].scheme() == "digest" && acls[0].id().starts_with(&format!("{USER}:")), "{n}: {acls:?}");
    }
    eprintln!("{} znodes, all creator-only", nodes.len());

    // Without credentials: no read, no write, no listing.
    let raw = support::zk_client().await;
    let cp = nodes.iter().find(|n| n.contains("/checkpoints/")).unwrap();
    assert_eq!(raw.get_data(cp).await.unwrap_err(), zk::Error::NoAuth);
    assert_eq!(raw.set_data(cp, b"{}", None).await.unwrap_err(), zk::Error::NoAuth);
    assert_eq!(raw.list_children(&cluster.zk_root).await.unwrap_err(), zk::Error::NoAuth);

    // The CLI: not authorized without or with wrong credentials; fine with them.
    for creds in [None, Some((USER, "wrong-password")), Some(("someone-else", PASSWORD))] {
        let (rc, out) = cli(&cluster, &["status", &cluster.topology], creds);
        assert_ne!(rc, 0, "status with {creds:?} succeeded: {out}");
        assert!(out.contains("not authorized"), "status with {creds:?}: {out}");
        eprintln!("status with {:?}: exit {rc}: {}", creds.map(|c| c.0), out.lines().last().unwrap_or(""));
        assert!(!out.contains(PASSWORD), "CLI output leaks the password: {out}");
    }
    let (rc, out) = cli(&cluster, &["status", &cluster.topology], Some((USER, PASSWORD)));
    assert_eq!(rc, 0, "status with the right credentials: {out}");
    assert!(!out.contains(PASSWORD), "CLI output leaks the password: {out}");

    assert_eq!(w1.stop(Duration::from_secs(30)), Some(0));
    assert_eq!(w2.stop(Duration::from_secs(30)), Some(0));
    // No worker log line carries the password (logs are at debug level).
    let leaks = grep_logs(&dir, PASSWORD);
    assert!(leaks.is_empty(), "password in logs: {leaks:#?}");
    let lines: usize = ["w1", "w2"]
        .iter()
        .map(|w| std::fs::read_to_string(dir.join(format!("{w}.log"))).unwrap().lines().count())
        .sum();
    assert!(lines > 20, "suspiciously few log lines ({lines}) to search");
    support::zk_delete_tree(&authed, &cluster.zk_root).await;
    s.delete().await;
}

fn parse_worker_args() -> squall::WorkerArgs {
    #[derive(Parser)]
    struct Args {
        #[command(flatten)]
        worker: squall::WorkerArgs,
    }
    let argv = ["w", "--topology", "t", "--stream", "s", "--zk-user", USER, "--zk-password", PASSWORD];
    Args::parse_from(argv).worker
}

/// The Debug output of the spout and coordination configuration built from the worker flags.
#[test]
fn config_debug_output_hides_the_password() {
    let cfg = parse_worker_args().spout_config().unwrap();
    let zk = cfg.zookeeper.to_zk_config();
    for (what, text) in [("KinesisSpoutConfig", format!("{cfg:?} {cfg:#?}")), ("ZkConfig", format!("{zk:?} {zk:#?}"))] {
        assert!(!text.contains(PASSWORD), "{what} Debug output shows the password: {text}");
        assert!(text.contains(USER), "{what} Debug output should name the user: {text}");
    }
}

/// The worker flags themselves: `squall::WorkerArgs` derives `Debug` (and so does the audit
/// example's `Args` around it); the password is a `coord::Secret`, whose `Debug` is redacted, so
/// `{args:?}` must not show it.
#[test]
fn worker_args_debug_output_hides_the_password() {
    let args = parse_worker_args();
    let text = format!("{args:?} {args:#?}");
    assert!(!text.contains(PASSWORD), "WorkerArgs Debug output shows the password: {text}");
}
