//! Hosts in Linux network namespaces, for tests of real network faults.
//!
//! A [`Net`] is one test's private network: a namespace holding only a bridge (`{prefix}br`), and
//! one namespace per host (`{prefix}{host}`), each with an `eth0` veth whose peer is a port of the
//! bridge, an address `10.213.N.(10+i)/24` and its own loopback. N is the test's own /24. The hosts
//! have no route but their /24 (no default route) and the bridge namespace has no address and no
//! link to the root namespace, so nothing a test does can reach any other address or leave the
//! machine. The test process itself stays in the root namespace and reaches services inside a
//! namespace only through [`Net::expose`] (a relay over a Unix socket, which lives in the file
//! system, not in any network).
//!
//! Faults, all real kernel behaviour:
//! - [`Net::cut`] / [`Net::heal`]: a pair-wise partition. Each side gets a permanent neighbour
//!   (ARP) entry mapping the other's address to a MAC address nobody has, so every packet between
//!   the two is sent into the bridge and silently dropped there (no host takes it): connections
//!   time out exactly as across a real partition, while both keep talking to everyone else. (The
//!   kernel here has no tc actions, no netem and no iptables; bridge port isolation cannot cut one
//!   pair only.) Healing deletes the entries and ARP resolves the real addresses again.
//! - [`Net::isolate`] / [`Net::rejoin`]: the host's bridge port taken down / up (cut from everyone).
//! - latency and loss: a userspace proxy inside the host's namespace (`netproxy.js fault`).
//!
//! Needs no root: the namespaces live inside a user namespace of the test's own (`unshare --user
//! --map-root-user --net --mount`, the "keeper" process), in which the test's uid is root. The
//! names (`ip netns add`) are bind mounts on a tmpfs of the keeper's mount namespace, so nothing
//! appears in the machine's `/run/netns`; every `ip` command and every process of a host is run
//! through `nsenter` into the keeper's namespaces. Needs iproute2 and util-linux (`localstack/up`
//! installs them) and user namespaces enabled for ordinary users; without them [`Net::new`] panics
//! with a message saying so, it never skips. Everything is cleaned up when the `Net` is dropped
//! (also when the test fails): every process in its namespaces is killed, then the keeper, and the
//! namespaces, veth links and bridge go with their last process. A test process killed without
//! cleaning up (SIGKILL) closes the keeper's stdin, which ends it; what it started in the hosts is
//! in the test's process group (`scripts/test-lanes` kills and names it).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, UnixStream};

/// A MAC address no interface of a test network has (locally administered).
const NOWHERE_MAC: &str = "02:00:00:00:de:ad";

static NETS: AtomicU32 = AtomicU32::new(0);

/// One host: its namespace, its address and its bridge port.
#[derive(Clone, Debug)]
pub struct Host {
    pub name: String,
    pub ns: String,
    pub ip: String,
    port: String,
}

/// A test's private network of hosts; torn down on drop.
pub struct Net {
    pub prefix: String,
    pub subnet: u8,
    pub dir: PathBuf,
    bridge_ns: String,
    hosts: BTreeMap<String, Host>,
    children: Mutex<Vec<Child>>,
    relays: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    keeper: Keeper,
}

fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!("{cmd:?} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Panics with a clear message unless `ip` (iproute2), `unshare` and `nsenter` (util-linux) are
/// installed.
pub fn require_netns() {
    for (tool, package) in [("ip", "iproute2"), ("unshare", "util-linux"), ("nsenter", "util-linux")] {
        assert!(
            Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success()),
            "`{tool}` ({package}) not found: run localstack/up (make up), which installs it"
        );
    }
}

/// The user, network and mount namespaces the test network lives in (see the module docs).
struct Keeper {
    child: Child,
}

impl Keeper {
    fn start() -> Keeper {
        // /run/netns on a tmpfs of this mount namespace: `ip netns add` needs a folder it may write,
        // and the machine's own /run/netns (root's) stays untouched.
        let script = "set -e; if [ -d /run/netns ]; then mount -t tmpfs squall-netns /run/netns; \
                      else mount -t tmpfs squall-run /run; mkdir /run/netns; fi; echo ready; exec cat >/dev/null";
        let mut child = Command::new("unshare")
            .args(["--user", "--map-root-user", "--net", "--mount", "--propagation", "private", "sh", "-c", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting `unshare` (util-linux) for the test network: {e}"));
        let mut line = String::new();
        let mut out = std::io::BufReader::new(child.stdout.take().expect("keeper stdout"));
        let _ = std::io::BufRead::read_line(&mut out, &mut line);
        if line.trim() != "ready" {
            let _ = child.kill();
            let out = child.wait_with_output().ok();
            let err = out.map(|o| String::from_utf8_lossy(&o.stderr).into_owned()).unwrap_or_default();
            panic!(
                "cannot create a user namespace for the test network (`unshare --user --map-root-user --net \
                 --mount`): {}. User namespaces must be enabled for this user (sysctl user.max_user_namespaces > 0, \
                 and kernel.unprivileged_userns_clone=1 where that setting exists; in a container, a seccomp \
                 profile that allows unshare)",
                err.trim()
            );
        }
        Keeper { child }
    }

    /// `nsenter` into the keeper's namespaces, running `program` as root of its user namespace:
    /// this process's uid is mapped to root there, so it keeps its credentials
    /// (`--preserve-credentials`: `unshare --map-root-user` denies setgroups in the namespace).
    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.args(["-t", &self.child.id().to_string(), "--user", "--mount", "--net", "--preserve-credentials", "--"])
            .arg(program);
        c
    }

    fn ip(&self, args: &[&str]) -> Result<String, String> {
        run(self.command("ip").args(args))
    }

    /// Kills every process in namespace `ns`, then deletes it.
    fn delete_ns(&self, ns: &str) {
        for _ in 0..3 {
            let pids = self.ip(&["netns", "pids", ns]).unwrap_or_default();
            if pids.trim().is_empty() {
                break;
            }
            for pid in pids.split_whitespace() {
                let _ = Command::new("kill").args(["-KILL", pid]).stderr(Stdio::null()).status();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.ip(&["netns", "del", ns]);
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Net {
    /// Creates the network with the named hosts (short names, at most 4 characters: `z1`, `w1`,
    /// `k`). Files (logs, sockets) go to `dir`.
    pub fn new(dir: &Path, hosts: &[&str]) -> Net {
        require_netns();
        let keeper = Keeper::start();
        let n = NETS.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let prefix = format!("sq{pid}n{n}");
        let subnet = ((pid.wrapping_mul(7).wrapping_add(n)) % 200 + 20) as u8;
        let bridge_ns = format!("{prefix}br");
        let mut net = Net {
            prefix: prefix.clone(),
            subnet,
            dir: dir.to_path_buf(),
            bridge_ns: bridge_ns.clone(),
            hosts: BTreeMap::new(),
            children: Mutex::new(Vec::new()),
            relays: Mutex::new(Vec::new()),
            keeper,
        };
        let ip = |args: &[&str]| net.keeper.ip(args);
        std::fs::create_dir_all(dir).unwrap();
        let fail = |e: String| -> ! {
            panic!("cannot build the test network (network namespaces, veth, bridge) here: {e}");
        };
        ip(&["netns", "add", &bridge_ns]).unwrap_or_else(|e| fail(e));
        ip(&["-n", &bridge_ns, "link", "add", "br0", "type", "bridge"]).unwrap_or_else(|e| fail(e));
        ip(&["-n", &bridge_ns, "link", "set", "br0", "up"]).unwrap_or_else(|e| fail(e));
        for (i, h) in hosts.iter().enumerate() {
            assert!(h.len() <= 4, "host name {h} longer than 4 characters");
            let ns = format!("{prefix}{h}");
            let port = format!("p{i}");
            let addr = format!("10.213.{subnet}.{}", 10 + i);
            ip(&["netns", "add", &ns]).unwrap_or_else(|e| fail(e));
            // Known from here on, so that a failure below still deletes it (drop).
            net.hosts.insert(
                h.to_string(),
                Host { name: h.to_string(), ns: ns.clone(), ip: addr.clone(), port: port.clone() },
            );
            // The veth is created with each end directly in its namespace: it never exists in
            // the root namespace.
            ip(&["link", "add", "eth0", "netns", &ns, "type", "veth", "peer", "name", &port, "netns", &bridge_ns])
                .unwrap_or_else(|e| fail(e));
            ip(&["-n", &bridge_ns, "link", "set", &port, "master", "br0"]).unwrap_or_else(|e| fail(e));
            ip(&["-n", &bridge_ns, "link", "set", &port, "up"]).unwrap_or_else(|e| fail(e));
            ip(&["-n", &ns, "addr", "add", &format!("{addr}/24"), "dev", "eth0"]).unwrap_or_else(|e| fail(e));
            ip(&["-n", &ns, "link", "set", "eth0", "up"]).unwrap_or_else(|e| fail(e));
            ip(&["-n", &ns, "link", "set", "lo", "up"]).unwrap_or_else(|e| fail(e));
            let routes = ip(&["-n", &ns, "route", "show"]).unwrap_or_else(|e| fail(e));
            assert!(!routes.contains("default"), "host {ns} has a default route: {routes}");
        }
        net
    }

    pub fn host(&self, h: &str) -> &Host {
        self.hosts.get(h).unwrap_or_else(|| panic!("no host {h} in this test network"))
    }

    pub fn ip(&self, h: &str) -> String {
        self.host(h).ip.clone()
    }

    /// `ip netns exec NS program` (in the keeper's namespaces): a command run in host `h`'s
    /// namespace, as root of the test's user namespace. `nsenter` and `ip netns exec` both exec, so
    /// the child's pid is the program's own.
    pub fn command(&self, h: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = self.keeper.command("ip");
        c.args(["netns", "exec", &self.host(h).ns]).arg(program);
        c
    }

    /// `ip ARGS` in the keeper's namespaces.
    fn ipcmd(&self, args: &[&str]) -> Result<String, String> {
        self.keeper.ip(args)
    }

    /// The same program, arguments, environment and working directory as `cmd`, run in host
    /// `h`'s namespace, output appended to `log`.
    pub fn wrap(&self, h: &str, cmd: &Command, log: &Path) -> Command {
        let mut c = self.command(h, cmd.get_program());
        c.args(cmd.get_args());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        if let Some(d) = cmd.get_current_dir() {
            c.current_dir(d);
        }
        let f = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
        c.stdin(Stdio::null()).stdout(f.try_clone().unwrap()).stderr(f);
        c
    }

    /// Starts a helper process the network owns (killed on drop).
    pub fn spawn(&self, h: &str, cmd: &Command, log: &Path) -> u32 {
        let child = self.wrap(h, cmd, log).spawn().unwrap_or_else(|e| panic!("starting {cmd:?} in {h}: {e}"));
        let pid = child.id();
        self.children.lock().unwrap().push(child);
        pid
    }

    /// Kills helper process `pid` (SIGKILL) started by [`Net::spawn`].
    pub fn kill(&self, pid: u32) {
        let mut children = self.children.lock().unwrap();
        if let Some(i) = children.iter().position(|c| c.id() == pid) {
            let mut c = children.remove(i);
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Whether host `from` can open a TCP connection to `ip:port` within `timeout`.
    pub fn can_connect(&self, from: &str, ip: &str, port: u16, timeout: Duration) -> bool {
        let secs = timeout.as_secs().max(1).to_string();
        self.command(from, "nc")
            .args(["-z", "-w", &secs, ip, &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Waits until something in host `h` listens on `ip:port` (checked from inside `h`).
    pub fn wait_listening(&self, h: &str, ip: &str, port: u16, timeout: Duration) {
        let start = Instant::now();
        while !self.can_connect(h, ip, port, Duration::from_secs(1)) {
            assert!(start.elapsed() < timeout, "nothing listens on {ip}:{port} in {h} after {timeout:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `127.0.0.1:P` of the root namespace, forwarded to `ip:port` as seen from inside host `h`
    /// (a relay in `h` on a Unix socket, and a listener of this process). Faults between hosts
    /// never affect it: it does not cross the bridge.
    pub async fn expose(&self, h: &str, ip: &str, port: u16) -> String {
        let sock = self.dir.join(format!("relay-{h}-{port}.sock"));
        let _ = std::fs::remove_file(&sock);
        let mut cmd = Command::new(node());
        cmd.arg(netproxy_js()).arg("relay").arg(&sock).arg(ip).arg(port.to_string());
        self.spawn(h, &cmd, &self.dir.join(format!("relay-{h}-{port}.log")));
        let start = Instant::now();
        while !sock.exists() {
            assert!(start.elapsed() < Duration::from_secs(10), "relay socket {} never appeared", sock.display());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let sock = sock.clone();
                tokio::spawn(async move {
                    if let Ok(mut up) = UnixStream::connect(&sock).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut up).await;
                    }
                });
            }
        });
        self.relays.lock().unwrap().push(task);
        addr
    }

    /// Starts a latency/loss proxy in host `h` on `127.0.0.1:listen` forwarding to `ip:port`;
    /// returns the path of its counters file (see `netproxy.js`).
    #[allow(clippy::too_many_arguments)]
    pub fn fault_proxy(
        &self,
        h: &str,
        listen: u16,
        ip: &str,
        port: u16,
        delay_ms: u64,
        jitter_ms: u64,
        loss_percent: f64,
        rto_ms: u64,
    ) -> PathBuf {
        let stats = self.dir.join(format!("fault-{h}-{listen}.json"));
        let mut cmd = Command::new(node());
        cmd.arg(netproxy_js())
            .arg("fault")
            .args([listen.to_string(), ip.to_string(), port.to_string()])
            .args([delay_ms.to_string(), jitter_ms.to_string(), loss_percent.to_string(), rto_ms.to_string()])
            .arg(&stats);
        self.spawn(h, &cmd, &self.dir.join(format!("fault-{h}-{listen}.log")));
        self.wait_listening(h, "127.0.0.1", listen, Duration::from_secs(10));
        stats
    }

    /// Partitions hosts `a` and `b` from each other (both directions); both keep every other link.
    pub fn cut(&self, a: &str, b: &str) {
        let (ha, hb) = (self.host(a), self.host(b));
        for (from, to) in [(ha, hb), (hb, ha)] {
            self.ipcmd(&[
                "-n",
                &from.ns,
                "neigh",
                "replace",
                &to.ip,
                "lladdr",
                NOWHERE_MAC,
                "nud",
                "permanent",
                "dev",
                "eth0",
            ])
            .unwrap_or_else(|e| panic!("cutting {a} from {b}: {e}"));
        }
    }

    /// Ends the partition of `a` and `b`.
    pub fn heal(&self, a: &str, b: &str) {
        let (ha, hb) = (self.host(a), self.host(b));
        for (from, to) in [(ha, hb), (hb, ha)] {
            let _ = self.ipcmd(&["-n", &from.ns, "neigh", "del", &to.ip, "dev", "eth0"]);
        }
    }

    /// Takes host `h`'s bridge port down: cut from every other host.
    pub fn isolate(&self, h: &str) {
        self.ipcmd(&["-n", &self.bridge_ns, "link", "set", &self.host(h).port, "down"]).unwrap();
    }

    pub fn rejoin(&self, h: &str) {
        self.ipcmd(&["-n", &self.bridge_ns, "link", "set", &self.host(h).port, "up"]).unwrap();
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for t in self.relays.lock().unwrap().drain(..) {
            t.abort();
        }
        for mut c in self.children.lock().unwrap().drain(..) {
            let _ = c.kill();
            let _ = c.wait();
        }
        for h in self.hosts.values() {
            self.keeper.delete_ns(&h.ns);
        }
        self.keeper.delete_ns(&self.bridge_ns);
        let left: Vec<String> = self
            .ipcmd(&["netns", "list"])
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with(&self.prefix))
            .map(String::from)
            .collect();
        if !left.is_empty() {
            eprintln!("netns: could not delete {left:?} (they go with the keeper)");
        }
    }
}

/// The node binary (installed by `localstack/up`).
pub fn node() -> String {
    "node".into()
}

fn netproxy_js() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("netproxy.js")
}

/// The state directory of `localstack/up` (`SQUALL_STATE_DIR`, default `.squall`).
fn state_dir() -> PathBuf {
    std::env::var_os("SQUALL_STATE_DIR").map(PathBuf::from).unwrap_or_else(|| super::repo_root().join(".squall"))
}

/// kinesis-local (the Kinesis engine LocalStack runs) on `ip:4566` of host `h`. `localstack/up`
/// installs it patched to bind 127.0.0.1; a copy of its single `main.js` is bound to the host's
/// address instead. Returns the endpoint URL as seen from the root namespace (through
/// [`Net::expose`]).
pub async fn start_kinesis(net: &Net, h: &str) -> String {
    let installed = state_dir().join("npm/node_modules/kinesis-local");
    let main = std::fs::read_to_string(installed.join("main.js"))
        .unwrap_or_else(|e| panic!("{}/main.js: {e}: run localstack/up (make up) first", installed.display()));
    let ip = net.ip(h);
    // The listen address (localstack/up's patch made it 127.0.0.1).
    let bind = "Host$().em(\"127.0.0.1\")";
    assert_eq!(main.matches(bind).count(), 1, "unexpected kinesis-local build: no single `{bind}` in its main.js");
    let dir = net.dir.join("kinesis");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("main.js"), main.replace(bind, &format!("Host$().em(\"{ip}\")"))).unwrap();
    let mut cmd = Command::new(node());
    cmd.arg(dir.join("main.js")).current_dir(&dir);
    for (k, v) in [
        ("KINESIS_MOCK_PLAIN_PORT", "4566"),
        ("KINESIS_MOCK_TLS_PORT", "4567"),
        ("LOG_LEVEL", "WARN"),
        ("SHARD_LIMIT", "1000"),
    ] {
        cmd.env(k, v);
    }
    for k in [
        "CREATE_STREAM_DURATION",
        "DELETE_STREAM_DURATION",
        "SPLIT_SHARD_DURATION",
        "MERGE_SHARDS_DURATION",
        "UPDATE_SHARD_COUNT_DURATION",
        "REGISTER_STREAM_CONSUMER_DURATION",
    ] {
        cmd.env(k, "0ms");
    }
    cmd.env("KINESIS_MOCK_CERT_PATH", installed.join("server.json"));
    net.spawn(h, &cmd, &dir.join("kinesis.log"));
    net.wait_listening(h, &ip, 4566, Duration::from_secs(60));
    format!("http://{}", net.expose(h, &ip, 4566).await)
}

/// A 3-node (or n-node) ZooKeeper ensemble, one server per host, on `ip:2181` (peers 2888/3888).
pub struct NetZk {
    pub hosts: Vec<String>,
    /// Connect string through the relays, for the test's own clients (root namespace).
    pub observer_connect: String,
    relay_ports: Vec<u16>,
    pids: Vec<u32>,
}

impl NetZk {
    pub async fn start(net: &Net, hosts: &[&str]) -> NetZk {
        let jar = "/usr/share/java/zookeeper.jar";
        assert!(Path::new(jar).exists(), "{jar} missing: run localstack/up (make up) first");
        let mut pids = Vec::new();
        for (i, h) in hosts.iter().enumerate() {
            let id = i + 1;
            let ndir = net.dir.join(format!("zk{id}"));
            let data = ndir.join("data");
            std::fs::create_dir_all(&data).unwrap();
            std::fs::write(data.join("myid"), format!("{id}\n")).unwrap();
            let mut cfg = format!(
                "tickTime=500\ninitLimit=20\nsyncLimit=4\ndataDir={}\nclientPort=2181\nclientPortAddress={}\n\
                 admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,stat,mntr\nautopurge.purgeInterval=0\n\
                 maxClientCnxns=0\n",
                data.display(),
                net.ip(h)
            );
            if hosts.len() > 1 {
                for (j, hj) in hosts.iter().enumerate() {
                    cfg.push_str(&format!("server.{}={}:2888:3888\n", j + 1, net.ip(hj)));
                }
            }
            std::fs::write(ndir.join("zoo.cfg"), cfg).unwrap();
            let mut cmd = Command::new("java");
            cmd.args(["-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss512k"])
                .args(["-Dzookeeper.jmx.log4j.disable=true", "-Dzookeeper.admin.enableServer=false"])
                .arg("-cp")
                .arg(format!("{jar}:/usr/share/java/slf4j-simple.jar"))
                .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
                .arg(ndir.join("zoo.cfg"))
                .current_dir(&ndir);
            pids.push(net.spawn(h, &cmd, &ndir.join("server.log")));
        }
        let mut relay_ports = Vec::new();
        for h in hosts {
            let addr = net.expose(h, &net.ip(h), 2181).await;
            relay_ports.push(addr.rsplit_once(':').unwrap().1.parse().unwrap());
        }
        let zk = NetZk {
            hosts: hosts.iter().map(|s| s.to_string()).collect(),
            observer_connect: relay_ports.iter().map(|p| format!("127.0.0.1:{p}")).collect::<Vec<_>>().join(","),
            relay_ports,
            pids,
        };
        let start = Instant::now();
        while !((0..hosts.len()).all(|i| zk.mode(i).is_some()) && zk.leader().is_some()) {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "ZooKeeper ensemble in namespaces not serving after 60 s"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        zk
    }

    /// Connect string for processes inside the test network: `ip:2181,...`.
    pub fn connect(&self, net: &Net) -> String {
        self.hosts.iter().map(|h| format!("{}:2181", net.ip(h))).collect::<Vec<_>>().join(",")
    }

    /// `srvr` mode of server `i` ("leader", "follower"), None when not serving.
    pub fn mode(&self, i: usize) -> Option<String> {
        let out = super::ensemble::four_letter(self.relay_ports[i], "srvr")?;
        out.lines().find_map(|l| l.strip_prefix("Mode: ").map(|m| m.trim().to_string()))
    }

    pub fn leader(&self) -> Option<usize> {
        (0..self.hosts.len()).find(|&i| matches!(self.mode(i).as_deref(), Some("leader") | Some("standalone")))
    }
}
