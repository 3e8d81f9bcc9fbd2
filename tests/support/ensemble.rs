//! A ZooKeeper ensemble of our own for fault-injection tests: N servers of the Debian package's
//! ZooKeeper (the jar `localstack/up` installs), on 127.0.0.1 only, on free ports, with their own
//! data directories, so a test can SIGKILL, SIGSTOP and restart servers without touching the shared
//! ZooKeeper other tests use. tickTime is 500 ms, so sessions of 1..10 s are allowed.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ZK_JAR: &str = "/usr/share/java/zookeeper.jar";
const SLF4J_JAR: &str = "/usr/share/java/slf4j-simple.jar";

/// A free TCP port on 127.0.0.1 for a server started later: drawn below the kernel's range of
/// ephemeral ports (`ip_local_port_range`, 32768 up by default) and checked by binding it.
/// A port the kernel handed out (`bind(0)`) and released goes back to the pool every outgoing
/// connection draws its local port from: on a busy machine one of them can take it before the
/// server binds, and the server never serves.
pub fn free_port() -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next().and_then(|p| p.parse::<u16>().ok()))
        .unwrap_or(32768);
    let (from, to) = (10_000u16, low.clamp(12_000, 32_768));
    for _ in 0..200 {
        let port = from + (rand::random::<u16>() % (to - from));
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

/// One server of the ensemble.
pub struct ZkNode {
    pub id: usize,
    pub client_port: u16,
    pub dir: PathBuf,
    child: Option<Child>,
}

/// A running ensemble; every server is killed when it is dropped.
pub struct Ensemble {
    pub nodes: Vec<ZkNode>,
    pub dir: PathBuf,
}

impl Ensemble {
    /// Starts `n` servers (1 = standalone) under `dir` and waits until every one serves. A server
    /// that exits while starting (a port taken after it was chosen) or an ensemble not serving in
    /// 60 s is stopped and started again on new ports, up to 3 times; the last failure's panic
    /// carries the end of every server's log.
    pub fn start(n: usize, dir: &Path) -> Ensemble {
        let mut failures = Vec::new();
        for attempt in 1..=3 {
            let mut e = Self::start_once(n, &dir.join(format!("start{attempt}")));
            match e.try_wait_serving(Duration::from_secs(60)) {
                Ok(()) => return e,
                Err(why) => {
                    eprintln!("ensemble: start {attempt} of 3 failed: {why}");
                    failures.push(format!("start {attempt}: {why}"));
                }
            }
        }
        panic!("ZooKeeper ensemble not serving after 3 starts; logs in {}:\n{}", dir.display(), failures.join("\n"));
    }

    fn start_once(n: usize, dir: &Path) -> Ensemble {
        assert!(
            Path::new(ZK_JAR).exists(),
            "{ZK_JAR} missing: run localstack/up (make up) first; it installs the Debian zookeeper package"
        );
        let ports: Vec<(u16, u16, u16)> = (0..n).map(|_| (free_port(), free_port(), free_port())).collect();
        let mut nodes = Vec::new();
        for (i, (client, _, _)) in ports.iter().enumerate() {
            let id = i + 1;
            let ndir = dir.join(format!("zk{id}"));
            let data = ndir.join("data");
            std::fs::create_dir_all(&data).unwrap();
            std::fs::write(data.join("myid"), format!("{id}\n")).unwrap();
            let mut cfg = format!(
                "tickTime=500\ninitLimit=20\nsyncLimit=5\ndataDir={}\nclientPort={client}\n\
                 clientPortAddress=127.0.0.1\nadmin.enableServer=false\n\
                 4lw.commands.whitelist=ruok,srvr,stat,mntr\nautopurge.purgeInterval=0\n\
                 maxClientCnxns=0\n",
                data.display()
            );
            if n > 1 {
                for (j, (_, peer, election)) in ports.iter().enumerate() {
                    cfg.push_str(&format!("server.{}=127.0.0.1:{peer}:{election}\n", j + 1));
                }
            }
            std::fs::write(ndir.join("zoo.cfg"), cfg).unwrap();
            nodes.push(ZkNode { id, client_port: *client, dir: ndir, child: None });
        }
        let mut e = Ensemble { nodes, dir: dir.to_path_buf() };
        for i in 0..n {
            e.spawn(i);
        }
        e
    }

    /// Waits until every running server serves and one leads; `Err` (with each server's last
    /// log lines) at once when a server exited, or after `timeout`.
    fn try_wait_serving(&mut self, timeout: Duration) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let running: Vec<usize> = (0..self.nodes.len()).filter(|&i| self.nodes[i].child.is_some()).collect();
            if running.iter().all(|&i| self.mode(i).is_some()) && self.leader().is_some() {
                return Ok(());
            }
            let exited: Vec<String> = self
                .nodes
                .iter_mut()
                .filter_map(|n| {
                    let status = n.child.as_mut()?.try_wait().ok().flatten()?;
                    Some(format!("server {} (client port {}) exited: {status}", n.id, n.client_port))
                })
                .collect();
            if !exited.is_empty() || start.elapsed() >= timeout {
                let why = if exited.is_empty() { format!("not serving after {timeout:?}") } else { exited.join("; ") };
                return Err(format!("{why}\n{}", self.log_tails()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The last 15 lines of each server's log.
    fn log_tails(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                let log = std::fs::read_to_string(n.dir.join("server.log")).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(15)..].join("\n  ");
                format!("server {} ({}):\n  {tail}", n.id, n.dir.join("server.log").display())
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn spawn(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let log = std::fs::OpenOptions::new().create(true).append(true).open(node.dir.join("server.log")).unwrap();
        let child = Command::new("java")
            .args(["-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss512k"])
            .args(["-Dzookeeper.jmx.log4j.disable=true", "-Dzookeeper.admin.enableServer=false"])
            .arg("-cp")
            .arg(format!("{ZK_JAR}:{SLF4J_JAR}"))
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(node.dir.join("zoo.cfg"))
            .current_dir(&node.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start java (ZooKeeper)");
        node.child = Some(child);
    }

    /// The connect string, every server: `127.0.0.1:a,127.0.0.1:b,...`.
    pub fn connect(&self) -> String {
        self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.client_port)).collect::<Vec<_>>().join(",")
    }

    /// `srvr` mode of server `i`: "leader", "follower", "standalone", or None when not serving.
    pub fn mode(&self, i: usize) -> Option<String> {
        let out = four_letter(self.nodes[i].client_port, "srvr")?;
        out.lines().find_map(|l| l.strip_prefix("Mode: ").map(|m| m.trim().to_string()))
    }

    /// Index of the current leader (or the standalone server).
    pub fn leader(&self) -> Option<usize> {
        (0..self.nodes.len()).find(|&i| matches!(self.mode(i).as_deref(), Some("leader") | Some("standalone")))
    }

    /// Waits until every running server serves, and (n > 1) one of them leads.
    pub fn wait_serving(&self, timeout: Duration) {
        let start = Instant::now();
        loop {
            let running: Vec<usize> = (0..self.nodes.len()).filter(|&i| self.nodes[i].child.is_some()).collect();
            if running.iter().all(|&i| self.mode(i).is_some()) && self.leader().is_some() {
                return;
            }
            assert!(
                start.elapsed() < timeout,
                "ZooKeeper ensemble not serving after {timeout:?}; logs in {}",
                self.dir.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until some server leads; returns its index and the time it took.
    pub fn wait_leader(&self, timeout: Duration) -> Option<(usize, Duration)> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Some(l) = self.leader() {
                return Some((l, start.elapsed()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// SIGKILL server `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGKILL every server (a full outage).
    pub fn kill_all(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }

    /// Restarts server `i` with its data directory (after [`Ensemble::kill`]).
    pub fn restart(&mut self, i: usize) {
        assert!(self.nodes[i].child.is_none(), "server {} still runs", i + 1);
        self.spawn(i);
    }

    /// Restarts every stopped server and waits until the ensemble serves.
    pub fn restart_all(&mut self) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].child.is_none() {
                self.spawn(i);
            }
        }
        self.wait_serving(Duration::from_secs(60));
    }

    pub fn is_running(&self, i: usize) -> bool {
        self.nodes[i].child.is_some()
    }
}

impl Drop for Ensemble {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// Sends a four-letter word and returns the answer (None when nothing answers).
pub fn four_letter(port: u16, word: &str) -> Option<String> {
    let addr = format!("127.0.0.1:{port}").parse().ok()?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    s.write_all(word.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    if out.is_empty() { None } else { Some(out) }
}
