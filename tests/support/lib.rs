//! Shared integration-test support: endpoints from the environment (set by `make test`, defaults
//! match `localstack/up`), unique stream names and ZooKeeper roots per test, and clean-up.
//!
//! A crate of its own (`squall-test-support`, a dev-dependency of `squall`) so that it is
//! compiled once for all integration test binaries rather than once inside each of them. The
//! tests name it `support` (`use squall_test_support as support;`).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

pub mod clockproxy;
pub mod efo;
pub mod ensemble;
pub mod faultproxy;
pub mod kinesismodel;
pub mod kpl;
pub mod netns;
pub mod ops;
pub mod reliability;
pub mod stages;
pub mod stallproxy;
pub mod state;
pub mod statemodel;
pub mod tcpproxy;
pub mod workers;
pub mod zkmodel;

use squall::kinesis::KinesisEndpoint;

/// The repository's root folder (this crate lives in `tests/support`).
pub fn repo_root() -> &'static std::path::Path {
    std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The build's `target/<profile>` folder: the running test executable is
/// `target/<profile>/deps/<test>-<hash>`.
pub fn profile_dir() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    exe.parent().and_then(std::path::Path::parent).expect("target dir").to_path_buf()
}

/// The `squall` binary of the build the running test belongs to: the test executable is
/// `target/<profile>/deps/<test>-<hash>`, the binary `target/<profile>/squall` (cargo builds a
/// package's binaries before its integration tests).
pub fn squall_bin() -> std::path::PathBuf {
    let bin = profile_dir().join("squall");
    assert!(bin.exists(), "{} missing: run `cargo build --bins` (cargo test builds it)", bin.display());
    bin
}

/// The Kinesis endpoint under test (`SQUALL_KINESIS_ENDPOINT`, default LocalStack on 4566).
pub fn kinesis_endpoint() -> KinesisEndpoint {
    let url = std::env::var("SQUALL_KINESIS_ENDPOINT").unwrap_or_else(|_| squall::kinesis::DEFAULT_ENDPOINT.into());
    KinesisEndpoint::new(url, "us-east-1")
}

/// The DynamoDB endpoint of the keyed-state store under test (`SQUALL_STATE_ENDPOINT`, default
/// dynalite on 4569).
pub fn state_endpoint() -> String {
    std::env::var("SQUALL_STATE_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:4569".into())
}

/// The ZooKeeper connect string under test (`SQUALL_ZK`, default 127.0.0.1:2181).
pub fn zk_connect() -> String {
    std::env::var("SQUALL_ZK").unwrap_or_else(|_| "127.0.0.1:2181".into())
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A name no other test (in this or a parallel run) uses: prefix, pid, counter, random suffix.
pub fn unique_name(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let r: u32 = rand::random::<u32>() & 0xffff;
    format!("{prefix}-{}-{n}-{r:04x}", std::process::id())
}

/// A ZooKeeper root path of this test's own, e.g. `/squall-test-coord-1234-0-ab12`.
pub fn unique_zk_root(prefix: &str) -> String {
    format!("/{}", unique_name(&format!("squall-test-{prefix}")))
}

/// A Kinesis spout configuration for an in-process test topology: `topology` reading `stream`
/// on the local Kinesis engine, coordinated under `zk_root` on the local ZooKeeper, with a 6 s
/// session and a 100 ms idle poll; tests set the rest.
pub fn spout_config(topology: &str, stream: &str, zk_root: &str) -> squall::spout::KinesisSpoutConfig {
    let mut cfg = squall::spout::KinesisSpoutConfig::new(topology.to_string(), stream.to_string());
    cfg.kinesis = kinesis_endpoint();
    cfg.zookeeper.connect = zk_connect();
    cfg.zookeeper.root = zk_root.to_string();
    cfg.zookeeper.session_timeout_ms = 6000;
    cfg.idle_poll_interval_ms = 100;
    cfg
}

/// A stream created for one test, deleted when the test calls [`TestStream::delete`] or, best effort,
/// when it is dropped.
pub struct TestStream {
    pub name: String,
    pub endpoint: KinesisEndpoint,
    pub client: aws_sdk_kinesis::Client,
    deleted: bool,
}

impl TestStream {
    /// Creates a stream with a unique name and `shards` shards, and waits until ACTIVE.
    pub async fn create(prefix: &str, shards: i32) -> TestStream {
        Self::create_on(kinesis_endpoint(), prefix, shards, "Are the services up (make up)?").await
    }

    /// Creates a stream with a unique name on the Kinesis engine at `url` (e.g. one in a test
    /// network, reached through a relay).
    pub async fn create_at(url: &str, prefix: &str, shards: i32) -> TestStream {
        Self::create_on(KinesisEndpoint::new(url.to_string(), "us-east-1"), prefix, shards, "").await
    }

    async fn create_on(endpoint: KinesisEndpoint, prefix: &str, shards: i32, hint: &str) -> TestStream {
        let client = endpoint.client().await.expect("kinesis client");
        let name = unique_name(prefix);
        squall::kinesis::create_stream(&client, &endpoint.label(), &name, shards)
            .await
            .unwrap_or_else(|e| panic!("creating test stream {name} at {}: {e}. {hint}", endpoint.label()));
        TestStream { name, endpoint, client, deleted: false }
    }

    /// Forgets the stream without deleting it (its engine goes away with the test).
    pub fn forget(mut self) {
        self.deleted = true;
    }

    /// The endpoint label for error messages and helpers.
    pub fn label(&self) -> String {
        self.endpoint.label()
    }

    /// Adopts an existing stream `name` (e.g. an intermediate stream a topology created): read it
    /// with the test's helpers; deleted like the others.
    pub async fn existing(name: &str) -> TestStream {
        let endpoint = kinesis_endpoint();
        let client = endpoint.client().await.expect("kinesis client");
        TestStream { name: name.to_string(), endpoint, client, deleted: false }
    }

    /// Deletes the stream now.
    pub async fn delete(mut self) {
        self.deleted = true;
        let _ = squall::kinesis::delete_stream(&self.client, &self.endpoint.label(), &self.name).await;
    }
}

impl Drop for TestStream {
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        let name = self.name.clone();
        let endpoint = self.endpoint.clone();
        // Own thread and runtime: works from inside or outside a tokio runtime.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            rt.block_on(async move {
                if let Ok(client) = endpoint.client().await {
                    let _ = tokio::time::timeout(
                        Duration::from_secs(5),
                        squall::kinesis::delete_stream(&client, &endpoint.label(), &name),
                    )
                    .await;
                }
            });
        })
        .join();
    }
}

/// Connects a raw ZooKeeper client (for tests that inspect or tamper with znodes).
pub async fn zk_client() -> zookeeper_client::Client {
    zookeeper_client::Client::connector()
        .with_session_timeout(Duration::from_secs(6))
        .connect(&zk_connect())
        .await
        .unwrap_or_else(|e| panic!("connecting to ZooKeeper at {}: {e}. Are the services up (make up)?", zk_connect()))
}

/// Deletes a znode and everything below it (test clean-up).
pub async fn zk_delete_tree(client: &zookeeper_client::Client, path: &str) {
    let mut stack = vec![path.to_string()];
    let mut order = Vec::new();
    while let Some(p) = stack.pop() {
        if let Ok(children) = client.list_children(&p).await {
            for c in children {
                stack.push(if p == "/" { format!("/{c}") } else { format!("{p}/{c}") });
            }
        }
        order.push(p);
    }
    for p in order.into_iter().rev() {
        let _ = client.delete(&p, None).await;
    }
}
