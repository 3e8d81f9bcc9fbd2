//! `squall ui` end to end: real workers (examples/audit.rs), ZooKeeper, a Kinesis stream, the
//! `squall` binary serving the page, and Debian's chromium (headless, installed by
//! `localstack/up`) loading it. The page shows the shards of a running topology with their
//! owners after its live script ran; after `squall stream split` the lineage shows the parent
//! and its two children; deactivate and activate work through the confirmation page (its token
//! taken from the page chromium rendered), and change the state in ZooKeeper; a POST without
//! the token, with a foreign Origin or with none is refused (403) and changes nothing. With
//! digest auth, the UI started without credentials cannot act and says why; with them it can.
//! Live figures: a worker with `--metrics-addr 127.0.0.1:0` publishes the port it really got, and
//! the page shows, for each shard it owns, the records read its `/metrics` reports (equal to what
//! the test put into that shard) and its ZooKeeper session and spout acks; a second worker whose
//! published address refuses connections (`--metrics-advertise 127.0.0.2`, checked) is shown as
//! unreachable, its shard without live figures, and the rest of the page is intact.
//! Screenshots are kept in the test's scratch directory (their paths are printed).

use squall_test_support as support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use squall::kinesis::{self, PutOptions};
use support::TestStream;
use support::reliability::spawn_worker;
use support::workers::{Cluster, scratch};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use zookeeper_client as zk;

/// A running `squall ui` on a free loopback port.
struct Ui {
    child: Child,
    /// `127.0.0.1:PORT`
    addr: String,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Ui {
    fn start(cluster: &Cluster, name: &str, creds: Option<(&str, &str)>) -> Ui {
        let stdout = cluster.dir.join(format!("{name}.stdout"));
        let stderr = cluster.dir.join(format!("{name}.log"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_squall"));
        cmd.args(["ui", "--listen", "127.0.0.1:0"])
            .env("SQUALL_ZK", support::zk_connect())
            .env("SQUALL_ZK_ROOT", &cluster.zk_root)
            .env("RUST_LOG", "debug")
            .env_remove("SQUALL_ZK_USER")
            .env_remove("SQUALL_ZK_PASSWORD")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap());
        if let Some((u, p)) = creds {
            cmd.env("SQUALL_ZK_USER", u).env("SQUALL_ZK_PASSWORD", p);
        }
        let mut child = cmd.spawn().expect("start squall ui");
        let start = Instant::now();
        let addr = loop {
            let text = std::fs::read_to_string(&stdout).unwrap_or_default();
            if let Some(a) = text.split("http://").nth(1).and_then(|r| r.split('/').next()) {
                break a.to_string();
            }
            if let Ok(Some(st)) = child.try_wait() {
                panic!("squall ui exited ({st}): {}", std::fs::read_to_string(&stderr).unwrap_or_default());
            }
            assert!(start.elapsed() < Duration::from_secs(20), "squall ui did not print its address: {text}");
            std::thread::sleep(Duration::from_millis(50));
        };
        Ui { child, addr, stdout, stderr }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
            + &std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Ui {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request over a plain TCP connection: (status, body).
async fn http(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect to squall ui");
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if method == "POST" {
        req.push_str("Content-Type: application/x-www-form-urlencoded\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(120), s.read_to_end(&mut buf)).await.expect("response in time").unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    assert!(!head.to_ascii_lowercase().contains("transfer-encoding: chunked"), "unexpected chunked response: {head}");
    (status, body.to_string())
}

/// The topology's status as the UI's JSON API serves it.
async fn api_status(ui: &Ui, topology: &str) -> serde_json::Value {
    let (code, body) = http(&ui.addr, "GET", &format!("/api/topology/{topology}"), &[], "").await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Runs Debian's chromium headless on `url` with `args`; its stdout. The virtual time budget
/// lets the page's live script run (it polls at once and every 2 s).
async fn chromium(dir: &Path, profile: &str, url: &str, args: &[String]) -> String {
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("chromium")
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions"])
            .args(["--disable-dev-shm-usage", "--virtual-time-budget=5000", "--window-size=1400,1000"])
            .arg(format!("--user-data-dir={}", dir.join(format!("chromium-{profile}")).display()))
            .args(args)
            .arg(url)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("chromium took over 120 s")
    .expect("run chromium (localstack/up installs Debian's chromium)");
    assert!(out.status.success(), "chromium {args:?} {url}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn dump_dom(dir: &Path, url: &str) -> String {
    chromium(dir, "dom", url, &["--dump-dom".to_string()]).await
}

async fn screenshot(dir: &Path, name: &str, url: &str) -> PathBuf {
    let path = dir.join(format!("{name}.png"));
    chromium(dir, "shot", url, &[format!("--screenshot={}", path.display())]).await;
    let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    assert!(len > 10_000, "screenshot {} is missing or empty ({len} bytes)", path.display());
    eprintln!("screenshot: {}", path.display());
    path
}

/// How often the live script replaced the page's live part (`#live[data-updates]`).
fn live_updates(dom: &str) -> u32 {
    dom.split("data-updates=\"").nth(1).and_then(|r| r.split('"').next()).and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// The value of attribute `attr` of the shard table's row of `shard`.
fn row_attr(dom: &str, shard: &str, attr: &str) -> Option<String> {
    let at = dom.find(&format!("<tr data-shard=\"{shard}\""))?;
    let tag = &dom[at..at + dom[at..].find('>')?];
    tag.split(&format!(" {attr}=\"")).nth(1).and_then(|r| r.split('"').next()).map(str::to_string)
}

/// The lifecycle state in ZooKeeper.
async fn zk_state(zk: &zk::Client, cluster: &Cluster) -> String {
    let path = format!("{}/topologies/{}/state", cluster.zk_root, cluster.topology);
    let (data, _) = zk.get_data(&path).await.unwrap_or_else(|e| panic!("read {path}: {e}"));
    let v: serde_json::Value = serde_json::from_slice(&data).unwrap();
    v["state"].as_str().unwrap().to_string()
}

fn form_token(dom: &str) -> String {
    let t = dom.split("name=\"token\" value=\"").nth(1).and_then(|r| r.split('"').next()).expect("token in the form");
    assert_eq!(t.len(), 64, "token {t:?}");
    t.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_shows_owners_and_lineage_and_actions_need_confirmation_token_and_origin() {
    let s = TestStream::create("ui", 2).await;
    let dir = scratch("ui");
    let cluster = Cluster::new(&s.name, &dir);
    let opts = PutOptions { count: 100, keys: 10, ..PutOptions::default() };
    let m = kinesis::put_records(&s.client, &s.label(), &s.name, &opts).await.unwrap().manifest;
    let mut w1 = cluster.start("w1", 1);
    let mut w2 = cluster.start("w2", 1);
    let r = cluster.wait_delivered(std::slice::from_ref(&m), Duration::from_secs(60)).await;
    assert_eq!(r.lost, 0, "{r:?}\n{}", cluster.logs());
    let ui = Ui::start(&cluster, "ui", None);
    let zk = support::zk_client().await;
    let topo = cluster.topology.clone();

    // Wait until both shards are leased (by the UI's JSON API, which is `squall status --json`).
    let start = Instant::now();
    loop {
        let st = api_status(&ui, &topo).await;
        let shards = st["streams"][0]["shards"].as_array().unwrap().clone();
        if shards.len() == 2 && shards.iter().all(|sh| sh["owner"].is_string()) {
            assert_eq!(st["state"], "ACTIVE");
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "shards not leased: {st}\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // `/`: the topology with its state and deployment id.
    let dom = dump_dom(&dir, &ui.url("/")).await;
    assert!(live_updates(&dom) >= 1, "the live script did not run: {dom}");
    let deployment = api_status(&ui, &topo).await["deployment_id"].as_str().unwrap().to_string();
    assert!(dom.contains(&format!("data-topology=\"{topo}\"")), "{dom}");
    assert!(dom.contains("data-state=\"ACTIVE\"") && dom.contains(&deployment), "{dom}");
    screenshot(&dir, "index", &ui.url("/")).await;

    // The topology's page, after its live script ran: every shard with the owner ZooKeeper shows.
    let page = ui.url(&format!("/topology/{topo}"));
    let mut attempts = 0;
    loop {
        let before = support::workers::owners(&zk, &cluster).await;
        let dom = dump_dom(&dir, &page).await;
        let after = support::workers::owners(&zk, &cluster).await;
        if before != after && attempts < 3 {
            attempts += 1;
            continue; // ownership moved while chromium loaded the page
        }
        assert!(live_updates(&dom) >= 1, "the live script did not run: {dom}");
        assert_eq!(after.len(), 2, "{after:?}");
        for (shard, owner) in &after {
            // in the shard table and in the lineage graph
            assert_eq!(row_attr(&dom, shard, "data-owner").as_deref(), Some(owner.as_str()), "{dom}");
            assert!(
                dom.contains(&format!("<g class=\"node open\" data-shard=\"{shard}\" data-owner=\"{owner}\"")),
                "{dom}"
            );
        }
        assert!(dom.contains("data-state=\"ACTIVE\"") && dom.contains(&deployment), "{dom}");
        assert!(dom.contains("data-worker=\"") && dom.contains("max MillisBehindLatest"), "{dom}");
        break;
    }
    screenshot(&dir, "topology", &page).await;

    // Split a shard with the CLI: the lineage shows the parent and its two children.
    let parent = api_status(&ui, &topo).await["streams"][0]["shards"][0]["shard_id"].as_str().unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_squall"))
        .args(["stream", "split", &s.name, &parent])
        .env("SQUALL_KINESIS_ENDPOINT", support::kinesis_endpoint().endpoint)
        .output()
        .unwrap();
    assert!(out.status.success(), "split: {}", String::from_utf8_lossy(&out.stderr));
    let start = Instant::now();
    let children: Vec<String> = loop {
        let st = api_status(&ui, &topo).await;
        let kids: Vec<String> = st["streams"][0]["shards"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|sh| sh["parent_shard_ids"].as_array().unwrap().iter().any(|p| p == parent.as_str()))
            .map(|sh| sh["shard_id"].as_str().unwrap().to_string())
            .collect();
        if kids.len() == 2 {
            break kids;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the split is not in the shard list: {st}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let dom = dump_dom(&dir, &page).await;
    assert!(live_updates(&dom) >= 1, "the live script did not run: {dom}");
    for c in &children {
        assert!(
            dom.contains(&format!("data-parent=\"{parent}\" data-child=\"{c}\"")),
            "no edge {parent} -> {c}: {dom}"
        );
        assert!(dom.contains(&format!("data-shard=\"{c}\"")), "no node {c}");
        assert_eq!(row_attr(&dom, c, "data-parents").as_deref(), Some(parent.as_str()));
    }
    let listed = row_attr(&dom, &parent, "data-children").unwrap();
    assert_eq!(listed.split(' ').collect::<Vec<_>>(), children.iter().map(String::as_str).collect::<Vec<_>>());
    screenshot(&dir, "lineage-after-split", &page).await;

    // Deactivate through the confirmation page (rendered by chromium; its token is used).
    let confirm = ui.url(&format!("/topology/{topo}/confirm/deactivate"));
    let dom = dump_dom(&dir, &confirm).await;
    assert!(dom.contains("id=\"confirm\"") && dom.contains("method=\"post\""), "{dom}");
    assert!(dom.contains(&format!("action=\"/topology/{topo}/deactivate\"")), "{dom}");
    let token = form_token(&dom);
    screenshot(&dir, "confirm-deactivate", &confirm).await;
    let origin = format!("http://{}", ui.addr);
    let post = format!("/topology/{topo}/deactivate");

    // Forged requests: refused with 403, nothing changes.
    type Forged<'a> = (&'a str, Vec<(&'a str, &'a str)>, String);
    let forged: [Forged<'_>; 5] = [
        ("no token", vec![("Origin", origin.as_str())], String::new()),
        ("wrong token", vec![("Origin", origin.as_str())], format!("token={}", "0".repeat(64))),
        ("foreign Origin", vec![("Origin", "http://evil.example")], format!("token={token}")),
        ("foreign Referer", vec![("Referer", "http://evil.example/x")], format!("token={token}")),
        ("no Origin or Referer", vec![], format!("token={token}")),
    ];
    for (what, headers, body) in &forged {
        let (code, text) = http(&ui.addr, "POST", &post, headers, body).await;
        assert_eq!(code, 403, "forged POST ({what}) was not refused: {text}");
        eprintln!("forged POST ({what}): 403 {}", text.trim());
    }
    // A foreign Host (DNS rebinding) cannot even read.
    let (code, _) = http(&ui.addr, "GET", "/", &[("Host", "evil.example")], "").await;
    assert_eq!(code, 403);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(zk_state(&zk, &cluster).await, "ACTIVE", "a refused POST changed the state");

    // The real one.
    let (code, text) = http(&ui.addr, "POST", &post, &[("Origin", &origin)], &format!("token={token}")).await;
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("ACTIVE -&gt; INACTIVE") && text.contains("data-ok=\"true\""), "{text}");
    std::fs::write(dir.join("result-deactivate.html"), &text).unwrap();
    assert_eq!(zk_state(&zk, &cluster).await, "INACTIVE");
    let dom = dump_dom(&dir, &page).await;
    assert!(dom.contains("data-state=\"INACTIVE\""), "{dom}");
    screenshot(&dir, "topology-inactive", &page).await;

    // Activate (a Referer from the confirm page is enough when a client sends no Origin).
    let confirm = ui.url(&format!("/topology/{topo}/confirm/activate"));
    let token2 = form_token(&dump_dom(&dir, &confirm).await);
    assert_eq!(token2, token, "one token per process");
    let (code, text) = http(
        &ui.addr,
        "POST",
        &format!("/topology/{topo}/activate"),
        &[("Referer", &confirm)],
        &format!("token={token}"),
    )
    .await;
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("INACTIVE -&gt; ACTIVE"), "{text}");
    assert_eq!(zk_state(&zk, &cluster).await, "ACTIVE");
    // An unknown action, with a valid token: not found, nothing changes.
    let (code, _) =
        http(&ui.addr, "POST", &format!("/topology/{topo}/delete"), &[("Origin", &origin)], &format!("token={token}"))
            .await;
    assert_eq!(code, 404);
    assert_eq!(zk_state(&zk, &cluster).await, "ACTIVE");

    assert_eq!(w1.stop(Duration::from_secs(30)), Some(0));
    assert_eq!(w2.stop(Duration::from_secs(30)), Some(0));
    drop(ui);
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}

const USER: &str = "squall-ui-ops";
const PASSWORD: &str = "Ui9-credential-do-not-show-7e2a";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_credentials_the_ui_cannot_act_on_a_digest_protected_topology_and_says_why() {
    let s = TestStream::create("ui-auth", 1).await;
    let dir = scratch("ui-auth");
    let cluster = Cluster::new(&s.name, &dir);
    let mut w = spawn_worker(&cluster, "w1", 1, &[], &[("SQUALL_ZK_USER", USER), ("SQUALL_ZK_PASSWORD", PASSWORD)]);
    let authed = zk::Client::connector()
        .with_auth("digest", format!("{USER}:{PASSWORD}").as_bytes())
        .connect(&support::zk_connect())
        .await
        .unwrap();
    let start = Instant::now();
    while authed
        .check_stat(&format!("{}/topologies/{}/state", cluster.zk_root, cluster.topology))
        .await
        .ok()
        .flatten()
        .is_none()
    {
        assert!(start.elapsed() < Duration::from_secs(60), "no state znode: {}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let topo = cluster.topology.clone();
    let origin_of = |ui: &Ui| format!("http://{}", ui.addr);

    // Without credentials: the page says "not authorized" and how to fix it; the action fails
    // with the same message and the state stays ACTIVE.
    let anon = Ui::start(&cluster, "ui-anon", None);
    let (code, text) = http(&anon.addr, "GET", &format!("/topology/{topo}"), &[], "").await;
    assert_eq!(code, 403, "{text}");
    assert!(text.contains("not authorized") && text.contains("without ZooKeeper credentials"), "{text}");
    let token = form_token(&dump_dom(&dir, &anon.url(&format!("/topology/{topo}/confirm/deactivate"))).await);
    let (code, text) = http(
        &anon.addr,
        "POST",
        &format!("/topology/{topo}/deactivate"),
        &[("Origin", &origin_of(&anon))],
        &format!("token={token}"),
    )
    .await;
    assert_eq!(code, 403, "{text}");
    assert!(text.contains("Deactivate failed") && text.contains("not authorized"), "{text}");
    assert!(text.contains("--zk-user"), "the fix is named: {text}");
    let msg = text.split("failed</b><br><span class=\"mono\">").nth(1).unwrap_or("").split('<').next().unwrap_or("");
    eprintln!("deactivate without credentials: 403 {msg}");
    assert_eq!(zk_state(&authed, &cluster).await, "ACTIVE");
    screenshot(&dir, "not-authorized", &anon.url(&format!("/topology/{topo}"))).await;

    // With the workers' credentials: it reads and acts; the password shows nowhere.
    let ui = Ui::start(&cluster, "ui-authed", Some((USER, PASSWORD)));
    let token = form_token(&dump_dom(&dir, &ui.url(&format!("/topology/{topo}/confirm/deactivate"))).await);
    let (code, text) = http(
        &ui.addr,
        "POST",
        &format!("/topology/{topo}/deactivate"),
        &[("Origin", &origin_of(&ui))],
        &format!("token={token}"),
    )
    .await;
    assert_eq!(code, 200, "{text}");
    assert_eq!(zk_state(&authed, &cluster).await, "INACTIVE");
    let dom = dump_dom(&dir, &ui.url(&format!("/topology/{topo}"))).await;
    assert!(dom.contains("data-state=\"INACTIVE\"") && live_updates(&dom) >= 1, "{dom}");
    for (what, text) in [("page", dom), ("result", text), ("ui output", ui.output() + &anon.output())] {
        assert!(!text.contains(PASSWORD), "the password shows in the {what}");
    }
    assert!(ui.output().contains(USER), "the UI names its ZooKeeper user: {}", ui.output());

    assert_eq!(w.stop(Duration::from_secs(30)), Some(0));
    drop((ui, anon));
    support::zk_delete_tree(&authed, &cluster.zk_root).await;
    s.delete().await;
}

/// The value of attribute `attr` of the workers table's row of `worker`'s live cell
/// (`<td data-metrics=...>`).
fn worker_live_attr(dom: &str, worker: &str, attr: &str) -> Option<String> {
    let row = dom.find(&format!("<tr data-worker=\"{worker}\""))?;
    let rest = &dom[row..];
    // each worker row has one cell with data-metrics, after its nested counter tables
    let at = rest.find("<td data-metrics=\"")?;
    let tag = &rest[at..at + rest[at..].find('>')?];
    tag.split(&format!(" {attr}=\"")).nth(1).and_then(|r| r.split('"').next()).map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_shows_live_figures_from_the_workers_metrics_and_marks_an_unreachable_endpoint() {
    const PUT: u64 = 120;
    let s = TestStream::create("ui-live", 2).await;
    let dir = scratch("ui-live");
    let cluster = Cluster::new(&s.name, &dir);
    let opts = PutOptions { count: PUT, keys: 12, ..PutOptions::default() };
    let m = kinesis::put_records(&s.client, &s.label(), &s.name, &opts).await.unwrap().manifest;
    // w1 listens on a port the OS picks: it must publish the port it really listens on.
    let mut w1 = cluster.start_with("w1", 1, &["--metrics-addr", "127.0.0.1:0"]);
    let r = cluster.wait_delivered(std::slice::from_ref(&m), Duration::from_secs(60)).await;
    assert_eq!(r.lost, 0, "{r:?}\n{}", cluster.logs());
    // What w1 read from each shard: the distinct records it delivered (it read everything).
    let mut per_shard: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> = Default::default();
    for d in support::workers::read_deliveries(&cluster.delivery_files()) {
        per_shard.entry(d.shard.clone()).or_default().insert(format!("{}/{}", d.sequence, d.sub_sequence));
    }
    assert_eq!(per_shard.values().map(|v| v.len() as u64).sum::<u64>(), PUT);
    // w2 listens on loopback but advertises 127.0.0.2, where nothing listens: its published
    // metrics address cannot be dialed (a misconfigured --metrics-advertise, a firewall).
    let mut w2 = cluster.start_with("w2", 1, &["--metrics-addr", "127.0.0.1:0", "--metrics-advertise", "127.0.0.2"]);
    let ui = Ui::start(&cluster, "ui-live", None);
    let zk = support::zk_client().await;
    let topo = cluster.topology.clone();

    // Both workers published their address, and each owns one shard.
    let start = Instant::now();
    let (addr1, addr2, id1, id2) = loop {
        let st = api_status(&ui, &topo).await;
        let by_pid = |pid: u32| {
            st["workers"].as_array().unwrap().iter().find(|w| w["pid"] == pid).map(|w| {
                (w["metrics_addr"].as_str().unwrap_or("").to_string(), w["worker_id"].as_str().unwrap().to_string())
            })
        };
        let owners = support::workers::owners(&zk, &cluster).await;
        let distinct: std::collections::BTreeSet<&String> = owners.values().collect();
        if let (Some((a1, i1)), Some((a2, i2))) = (by_pid(w1.pid()), by_pid(w2.pid()))
            && owners.len() == 2
            && distinct.len() == 2
        {
            break (a1, a2, i1, i2);
        }
        assert!(start.elapsed() < Duration::from_secs(60), "not settled: {st}\n{owners:?}\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let port = |a: &str| a.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok()).unwrap_or(0);
    assert!(addr1.starts_with("127.0.0.1:") && port(&addr1) != 0, "w1 published {addr1:?}");
    assert!(addr2.starts_with("127.0.0.2:") && port(&addr2) != 0, "w2 published {addr2:?}");
    // The fault is real: w2's published address refuses connections, while its endpoint itself
    // answers on loopback.
    assert!(tokio::net::TcpStream::connect(&addr2).await.is_err(), "{addr2} accepted a connection");
    let (code, body) = http(&format!("127.0.0.1:{}", port(&addr2)), "GET", "/metrics", &[], "").await;
    assert!(code == 200 && body.contains("squall_build_info"), "w2's endpoint itself: {code} {body}");

    let page = ui.url(&format!("/topology/{topo}"));
    let mut attempts = 0;
    loop {
        let before = support::workers::owners(&zk, &cluster).await;
        let st = api_status(&ui, &topo).await;
        let dom = dump_dom(&dir, &page).await;
        let after = support::workers::owners(&zk, &cluster).await;
        let tasks_of = |id: &str| -> Vec<String> {
            st["workers"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|w| w["worker_id"] == id)
                .flat_map(|w| {
                    w["tasks"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect::<Vec<_>>()
                })
                .collect()
        };
        let (tasks1, tasks2) = (tasks_of(&id1), tasks_of(&id2));
        // A worker's status znode lists its tasks when it is next written (every 2 s): a task
        // can own a shard before its worker's status names it.
        let unlisted = after.values().any(|o| !tasks1.contains(o) && !tasks2.contains(o));
        if (before != after || unlisted) && attempts < 10 {
            attempts += 1;
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue; // ownership moved while chromium loaded the page, or a status lags
        }
        assert!(live_updates(&dom) >= 1, "the live script did not run: {dom}");
        for (shard, owner) in &after {
            // the ZooKeeper data is there either way
            assert_eq!(row_attr(&dom, shard, "data-owner").as_deref(), Some(owner.as_str()), "{dom}");
            if tasks1.contains(owner) {
                // figures from w1's /metrics: what it read of this shard, with no throttles
                assert_eq!(row_attr(&dom, shard, "data-live-from").as_deref(), Some(id1.as_str()), "{dom}");
                let expect = per_shard.get(shard).map_or(0, |v| v.len()).to_string();
                assert_eq!(row_attr(&dom, shard, "data-live-records"), Some(expect), "shard {shard}: {dom}");
                assert_eq!(row_attr(&dom, shard, "data-live-throttles").as_deref(), Some("0"), "{dom}");
                eprintln!(
                    "shard {shard}: records read from w1's /metrics {:?}",
                    row_attr(&dom, shard, "data-live-records")
                );
            } else {
                assert!(tasks2.contains(owner), "owner {owner} of {shard} is neither worker's: {st}");
                assert_eq!(row_attr(&dom, shard, "data-live-records"), None, "w2's shard has live figures: {dom}");
            }
        }
        assert!(after.values().any(|o| tasks1.contains(o)) && after.values().any(|o| tasks2.contains(o)), "{after:?}");
        assert_eq!(worker_live_attr(&dom, &id1, "data-metrics").as_deref(), Some("ok"), "{dom}");
        assert_eq!(worker_live_attr(&dom, &id1, "data-metrics-addr").as_deref(), Some(addr1.as_str()));
        assert_eq!(worker_live_attr(&dom, &id1, "data-zk-connected").as_deref(), Some("1"), "{dom}");
        let acked = dom
            .split("data-live-component=\"kinesis\" data-acked=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .and_then(|n| n.parse::<u64>().ok())
            .expect("the kinesis spout's live counters");
        assert!(acked >= PUT, "w1's spout acked {acked} < {PUT}: {dom}");
        assert_eq!(worker_live_attr(&dom, &id2, "data-metrics").as_deref(), Some("unreachable"), "{dom}");
        assert_eq!(worker_live_attr(&dom, &id2, "data-metrics-addr").as_deref(), Some(addr2.as_str()));
        assert!(dom.contains("data-state=\"ACTIVE\"") && dom.contains("max MillisBehindLatest"), "{dom}");
        break;
    }
    screenshot(&dir, "topology-live", &page).await;
    // Every page, live refresh and API read went over one pair of ZooKeeper sessions (each
    // session the UI opens is logged at debug): the reads above, and three more here.
    for _ in 0..3 {
        assert_eq!(api_status(&ui, &topo).await["state"], "ACTIVE");
    }
    let log = std::fs::read_to_string(&ui.stderr).unwrap();
    assert_eq!(log.matches("ZooKeeper session opened").count(), 2, "{log}");

    assert_eq!(w1.stop(Duration::from_secs(30)), Some(0));
    assert_eq!(w2.stop(Duration::from_secs(30)), Some(0));
    drop(ui);
    support::zk_delete_tree(&zk, &cluster.zk_root).await;
    s.delete().await;
}
