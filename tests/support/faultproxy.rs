//! A fault-injecting HTTP/1.1 proxy for tests: it sits between the spout and the Kinesis engine
//! (set the worker's `--endpoint` to [`FaultProxy::url`]) and, per request and at set rates,
//! answers with ProvisionedThroughputExceededException (HTTP 400 with the JSON body the AWS SDK
//! classifies as throttling), answers with another client error of a given code (HTTP 400, e.g.
//! AccessDeniedException, ResourceNotFoundException, KMSDisabledException), answers HTTP 500,
//! resets the connection, or adds latency before forwarding. It listens on 127.0.0.1 only,
//! injects at most `max_faults` faults and none after `active_for`, and counts everything it did,
//! per operation too (the X-Amz-Target), with the time of every request.
//!
//! Partial failures: at rate `partial`, a PutRecords request loses some of its entries on the
//! way (each with probability `partial_entries`, at least one): the proxy forwards the rest (the
//! JSON `Records` array rewritten, Content-Length fixed) and splices a failed entry
//! (`ProvisionedThroughputExceededException`) into the answer at each dropped position, with
//! `FailedRecordCount` raised to match, as Kinesis answers when some shards are throttled. When
//! every entry is dropped it answers itself (HTTP 200, every entry failed).
//!
//! It can also hide shards: [`FaultProxy::hide_shards`] removes the named shards from every
//! ListShards answer (the JSON body is rewritten and its Content-Length fixed), which is how a
//! test simulates shards trimmed past the retention period (kinesis-local keeps closed shards).
//!
//! In front of DynamoDB, [`FaultProxy::stale_index`] makes Query answers on a global secondary
//! index eventually consistent, as DynamoDB's are and dynalite's are not: an item the index
//! listed in an earlier answer and no longer has (its index keys were removed) is still listed,
//! with the keys it had, for the given lag after it was last seen (when the query's key condition
//! `tpart = :p AND fire_at <= :w` still selects it). [`FaultProxy::stale_items`] counts them.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Fault rates (each in 0..=1, drawn per request in this order) and bounds.
#[derive(Clone, Debug)]
pub struct FaultPlan {
    pub throttle: f64,
    pub server_error: f64,
    pub reset: f64,
    pub latency: f64,
    pub latency_ms: u64,
    /// Rate of PutRecords requests given partial failures (see the module docs).
    pub partial: f64,
    /// In such a request, the chance of each entry to fail.
    pub partial_entries: f64,
    /// A request given partial failures fails at least one entry (true by default). With false
    /// and `partial` 1, each entry of every PutRecords fails with probability `partial_entries`
    /// (per-record throttling at that rate); a request none of whose entries drew a failure is
    /// forwarded as it is, and not counted as a fault.
    pub partial_at_least_one: bool,
    /// Rate of HTTP 400 answers with `client_error_code` as `__type`.
    pub client_error: f64,
    /// The error code of those answers, e.g. "AccessDeniedException".
    pub client_error_code: String,
    /// Faults only for these X-Amz-Target operations (e.g. "GetRecords"); empty = every operation.
    pub only_ops: Vec<String>,
    /// No more faults after this many.
    pub max_faults: u64,
    /// No more faults after this long.
    pub active_for: Duration,
}

impl Default for FaultPlan {
    fn default() -> Self {
        FaultPlan {
            throttle: 0.0,
            server_error: 0.0,
            reset: 0.0,
            latency: 0.0,
            latency_ms: 0,
            partial: 0.0,
            partial_entries: 0.3,
            partial_at_least_one: true,
            client_error: 0.0,
            client_error_code: "AccessDeniedException".into(),
            only_ops: Vec::new(),
            max_faults: u64::MAX,
            active_for: Duration::from_secs(3600),
        }
    }
}

/// What the proxy did.
#[derive(Default, Debug)]
pub struct Counters {
    pub requests: AtomicU64,
    pub forwarded: AtomicU64,
    pub throttled: AtomicU64,
    pub server_errors: AtomicU64,
    pub resets: AtomicU64,
    pub delayed: AtomicU64,
    pub upstream_errors: AtomicU64,
    pub client_errors: AtomicU64,
    /// ListShards answers from which hidden shards were removed.
    pub hidden_listings: AtomicU64,
    /// GetShardIterator requests on a hidden shard, answered ResourceNotFound.
    pub hidden_iterators: AtomicU64,
    /// PutRecords answers with injected per-record failures.
    pub partial_calls: AtomicU64,
    /// Index entries listed in Query answers after the index no longer had them (stale reads).
    pub stale_items: AtomicU64,
    /// Entries failed in those answers (not forwarded).
    pub partial_entries: AtomicU64,
}

/// What the proxy saw of one operation.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct OpCounts {
    /// Requests received.
    pub requests: u64,
    /// Requests answered with an injected fault (latency included).
    pub faults: u64,
}

/// A snapshot of [`Counters`].
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Snapshot {
    pub requests: u64,
    pub forwarded: u64,
    pub throttled: u64,
    pub server_errors: u64,
    pub resets: u64,
    pub delayed: u64,
    pub upstream_errors: u64,
    pub client_errors: u64,
    pub hidden_listings: u64,
    pub partial_calls: u64,
    pub partial_entries: u64,
}

impl Snapshot {
    pub fn faults(&self) -> u64 {
        self.throttled + self.server_errors + self.resets + self.delayed + self.client_errors + self.partial_calls
    }
}

struct Shared {
    plan: std::sync::Mutex<FaultPlan>,
    counters: Counters,
    by_op: std::sync::Mutex<BTreeMap<String, OpCounts>>,
    /// (time since start, operation, fault injected?) of every request, at most `LOG_CAP`.
    log: std::sync::Mutex<Vec<(Duration, String, bool)>>,
    started: Instant,
    enabled: AtomicBool,
    upstream: SocketAddr,
    /// Shard ids removed from ListShards answers.
    hidden: std::sync::Mutex<Vec<String>>,
    /// Left out of ListShards answers only (GetShardIterator still answers for them).
    omitted: std::sync::Mutex<Vec<String>>,
    /// Per shard id: ListShards answers it was removed from.
    hidden_counts: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
    /// Requests per operation (X-Amz-Target).
    per_op: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
    /// How long an index entry stays listed after the index lost it (`None`: not stale).
    stale_lag: std::sync::Mutex<Option<Duration>>,
    index_seen: std::sync::Mutex<IndexSeen>,
}

/// Index entries seen in Query answers: (table, index, partition value) -> item key `pk` -> (the
/// entry as answered, its sort key value, when the index itself last answered it).
type IndexSeen = BTreeMap<(String, String, String), BTreeMap<String, (serde_json::Value, i128, Instant)>>;

/// The running proxy; stops accepting when dropped.
pub struct FaultProxy {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy to `upstream` (an `http://127.0.0.1:PORT` URL) with `plan`.
    pub async fn start(upstream: &str, plan: FaultPlan) -> FaultProxy {
        let hostport = upstream.trim_start_matches("http://").trim_end_matches('/');
        let upstream: SocketAddr = tokio::net::lookup_host(hostport)
            .await
            .ok()
            .and_then(|mut a| a.next())
            .unwrap_or_else(|| panic!("fault proxy: cannot resolve upstream {upstream}"));
        assert!(upstream.ip().is_loopback(), "the fault proxy only forwards to loopback, not {upstream}");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind fault proxy");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            plan: std::sync::Mutex::new(plan),
            counters: Counters::default(),
            by_op: Default::default(),
            log: Default::default(),
            started: Instant::now(),
            enabled: AtomicBool::new(true),
            upstream,
            hidden: std::sync::Mutex::new(Vec::new()),
            omitted: std::sync::Mutex::new(Vec::new()),
            hidden_counts: std::sync::Mutex::new(Default::default()),
            per_op: std::sync::Mutex::new(Default::default()),
            stale_lag: std::sync::Mutex::new(None),
            index_seen: std::sync::Mutex::new(Default::default()),
        });
        let sh = shared.clone();
        let task = tokio::spawn(async move {
            let live = Arc::new(AtomicU64::new(0));
            while let Ok((sock, _)) = listener.accept().await {
                // Bounded: at most 256 client connections at once.
                if live.load(Ordering::Relaxed) >= 256 {
                    continue;
                }
                live.fetch_add(1, Ordering::Relaxed);
                let (sh, live) = (sh.clone(), live.clone());
                tokio::spawn(async move {
                    let _ = serve(sock, &sh).await;
                    live.fetch_sub(1, Ordering::Relaxed);
                });
            }
        });
        FaultProxy { addr, shared, task }
    }

    /// The URL to give the spout as its Kinesis endpoint.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops or resumes injecting faults (forwarding goes on).
    pub fn set_enabled(&self, on: bool) {
        self.shared.enabled.store(on, Ordering::SeqCst);
    }

    /// Replaces the plan.
    pub fn set_plan(&self, plan: FaultPlan) {
        *self.shared.plan.lock().unwrap() = plan;
    }

    /// From now on, ListShards answers leave out these shards (replaces the previous set; an
    /// empty slice hides nothing).
    pub fn hide_shards(&self, shard_ids: &[&str]) {
        *self.shared.hidden.lock().unwrap() = shard_ids.iter().map(|s| s.to_string()).collect();
    }

    /// From now on, ListShards answers leave out these shards, while GetShardIterator still
    /// answers for them: a listing that flaps, not a trimmed shard (replaces the previous set).
    pub fn omit_from_listings(&self, shard_ids: &[&str]) {
        *self.shared.omitted.lock().unwrap() = shard_ids.iter().map(|s| s.to_string()).collect();
    }

    /// From now on, Query answers on a secondary index (DynamoDB) keep listing an entry for `lag`
    /// after the index lost it (see the module docs).
    pub fn stale_index(&self, lag: Duration) {
        *self.shared.stale_lag.lock().unwrap() = Some(lag);
    }

    /// Index entries listed after the index no longer had them, so far.
    pub fn stale_items(&self) -> u64 {
        self.shared.counters.stale_items.load(Ordering::Relaxed)
    }

    /// Requests of one operation (e.g. "ListShards") so far, faulted or forwarded.
    pub fn requests_of(&self, op: &str) -> u64 {
        self.shared.per_op.lock().unwrap().get(op).copied().unwrap_or(0)
    }

    /// ListShards answers `shard_id` was removed from so far.
    pub fn hidden_listings_of(&self, shard_id: &str) -> u64 {
        self.shared.hidden_counts.lock().unwrap().get(shard_id).copied().unwrap_or(0)
    }

    pub fn counters(&self) -> Snapshot {
        let c = &self.shared.counters;
        Snapshot {
            requests: c.requests.load(Ordering::Relaxed),
            forwarded: c.forwarded.load(Ordering::Relaxed),
            throttled: c.throttled.load(Ordering::Relaxed),
            server_errors: c.server_errors.load(Ordering::Relaxed),
            resets: c.resets.load(Ordering::Relaxed),
            delayed: c.delayed.load(Ordering::Relaxed),
            upstream_errors: c.upstream_errors.load(Ordering::Relaxed),
            client_errors: c.client_errors.load(Ordering::Relaxed),
            hidden_listings: c.hidden_listings.load(Ordering::Relaxed),
            partial_calls: c.partial_calls.load(Ordering::Relaxed),
            partial_entries: c.partial_entries.load(Ordering::Relaxed),
        }
    }

    /// Requests and faults per operation (`GetRecords`, `GetShardIterator`, ...).
    pub fn ops(&self) -> BTreeMap<String, OpCounts> {
        self.shared.by_op.lock().unwrap().clone()
    }

    /// Requests and faults of one operation.
    pub fn op(&self, op: &str) -> OpCounts {
        self.ops().get(op).copied().unwrap_or_default()
    }

    /// Every request so far of `op`: (time since the proxy started, fault injected?).
    pub fn request_times(&self, op: &str) -> Vec<(Duration, bool)> {
        self.shared.log.lock().unwrap().iter().filter(|(_, o, _)| o == op).map(|(t, _, f)| (*t, *f)).collect()
    }

    /// Time since the proxy started (the clock of [`FaultProxy::request_times`]).
    pub fn elapsed(&self) -> Duration {
        self.shared.started.elapsed()
    }
}

const LOG_CAP: usize = 1_000_000;

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

enum Fault {
    None,
    Throttle,
    ClientError(String),
    ServerError,
    Reset,
    Delay(Duration),
    /// Per-record failures of a PutRecords request, each entry with this chance (and at least
    /// one when the flag is set).
    Partial(f64, bool),
}

fn choose(sh: &Shared, op: &str) -> Fault {
    let plan = sh.plan.lock().unwrap().clone();
    let c = &sh.counters;
    let injected = c.throttled.load(Ordering::Relaxed)
        + c.server_errors.load(Ordering::Relaxed)
        + c.resets.load(Ordering::Relaxed)
        + c.delayed.load(Ordering::Relaxed)
        + c.client_errors.load(Ordering::Relaxed)
        + c.partial_calls.load(Ordering::Relaxed);
    if !sh.enabled.load(Ordering::SeqCst)
        || injected >= plan.max_faults
        || sh.started.elapsed() >= plan.active_for
        || (!plan.only_ops.is_empty() && !plan.only_ops.iter().any(|o| o == op))
    {
        return Fault::None;
    }
    let mut x: f64 = rand::random::<f64>();
    for (rate, fault) in [
        (plan.throttle, Fault::Throttle),
        (plan.client_error, Fault::ClientError(plan.client_error_code.clone())),
        (plan.server_error, Fault::ServerError),
        (plan.reset, Fault::Reset),
        (plan.latency, Fault::Delay(Duration::from_millis(plan.latency_ms))),
        (
            if op == "PutRecords" { plan.partial } else { 0.0 },
            Fault::Partial(plan.partial_entries, plan.partial_at_least_one),
        ),
    ] {
        if x < rate {
            return fault;
        }
        x -= rate;
    }
    Fault::None
}

/// One HTTP/1.1 message: head (up to and including the blank line) and body.
struct Message {
    head: Vec<u8>,
    body: Vec<u8>,
}

impl Message {
    fn header(&self, name: &str) -> Option<String> {
        let text = String::from_utf8_lossy(&self.head);
        text.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }
}

/// Reads one message from `s` (with `buf` holding bytes already read). None at a clean EOF.
async fn read_message(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Option<Message>> {
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        if buf.len() > 64 * 1024 {
            return Err(std::io::Error::other("header too large"));
        }
        let mut chunk = [0u8; 8192];
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return if buf.is_empty() { Ok(None) } else { Err(std::io::ErrorKind::UnexpectedEof.into()) };
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head: Vec<u8> = buf.drain(..head_end).collect();
    let mut msg = Message { head, body: Vec::new() };
    if let Some(len) = msg.header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        while buf.len() < len {
            let mut chunk = vec![0u8; (len - buf.len()).min(1 << 20)];
            let n = s.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        msg.body = buf.drain(..len).collect();
    } else if msg.header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        // Keep the chunked framing as it is; read until the terminating chunk and trailers.
        loop {
            if let Some(end) = chunked_end(buf) {
                msg.body = buf.drain(..end).collect();
                break;
            }
            let mut chunk = [0u8; 8192];
            let n = s.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    }
    Ok(Some(msg))
}

/// Length of a complete chunked body at the start of `b`, if complete.
fn chunked_end(b: &[u8]) -> Option<usize> {
    let mut i = 0;
    loop {
        let line_end = b[i..].windows(2).position(|w| w == b"\r\n")? + i;
        let size_text = std::str::from_utf8(&b[i..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        i = line_end + 2;
        if size == 0 {
            // Trailers end with an empty line.
            loop {
                let e = b[i..].windows(2).position(|w| w == b"\r\n")? + i;
                let empty = e == i;
                i = e + 2;
                if empty {
                    return Some(i);
                }
            }
        }
        if b.len() < i + size + 2 {
            return None;
        }
        i += size + 2;
    }
}

fn response(status: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/x-amz-json-1.1\r\nx-amzn-RequestId: fault-proxy\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

async fn serve(mut client: TcpStream, sh: &Shared) -> std::io::Result<()> {
    let _ = client.set_nodelay(true);
    let mut cbuf = Vec::new();
    let mut upstream: Option<(TcpStream, Vec<u8>)> = None;
    loop {
        let Some(mut req) = read_message(&mut client, &mut cbuf).await? else { return Ok(()) };
        sh.counters.requests.fetch_add(1, Ordering::Relaxed);
        let op = req.header("x-amz-target").and_then(|t| t.rsplit('.').next().map(str::to_string)).unwrap_or_default();
        *sh.per_op.lock().unwrap().entry(op.clone()).or_default() += 1;
        let fault = choose(sh, &op);
        // positions of entries failed by a partial fault, and the request's entry count
        let mut splice: Option<(Vec<usize>, usize)> = None;
        {
            // a partial fault that may fail no entry is counted once it failed some
            let injected = !matches!(fault, Fault::None | Fault::Partial(_, false));
            let mut by_op = sh.by_op.lock().unwrap();
            let c = by_op.entry(op.clone()).or_default();
            c.requests += 1;
            c.faults += u64::from(injected);
            drop(by_op);
            let mut log = sh.log.lock().unwrap();
            if log.len() < LOG_CAP {
                log.push((sh.started.elapsed(), op.clone(), injected));
            }
        }
        // A hidden shard is a trimmed one: GetShardIterator on it answers ResourceNotFound, as
        // Kinesis does for a shard past retention.
        if op == "GetShardIterator" {
            let hidden = sh.hidden.lock().unwrap().clone();
            let asked = serde_json::from_slice::<serde_json::Value>(&req.body)
                .ok()
                .and_then(|v| v.get("ShardId").and_then(|s| s.as_str()).map(str::to_string));
            if let Some(id) = asked.filter(|id| hidden.contains(id)) {
                sh.counters.hidden_iterators.fetch_add(1, Ordering::Relaxed);
                let body = format!(
                    r#"{{"__type":"ResourceNotFoundException","message":"Shard {id} does not exist (hidden by the fault proxy: trimmed)"}}"#
                );
                client.write_all(&response("400 Bad Request", &body)).await?;
                continue;
            }
        }
        match fault {
            Fault::ClientError(code) => {
                sh.counters.client_errors.fetch_add(1, Ordering::Relaxed);
                let body =
                    format!(r#"{{"__type":"{code}","message":"{code} for {op} (injected by the fault proxy)"}}"#);
                client.write_all(&response("400 Bad Request", &body)).await?;
                continue;
            }
            Fault::Throttle => {
                sh.counters.throttled.fetch_add(1, Ordering::Relaxed);
                let body = r#"{"__type":"ProvisionedThroughputExceededException","message":"Rate exceeded for shard (injected by the fault proxy)"}"#;
                client.write_all(&response("400 Bad Request", body)).await?;
                continue;
            }
            Fault::ServerError => {
                sh.counters.server_errors.fetch_add(1, Ordering::Relaxed);
                let body = r#"{"__type":"InternalFailure","message":"injected by the fault proxy"}"#;
                client.write_all(&response("500 Internal Server Error", body)).await?;
                continue;
            }
            Fault::Reset => {
                sh.counters.resets.fetch_add(1, Ordering::Relaxed);
                // Linger 0 + close = RST instead of FIN.
                let _ = client.set_zero_linger();
                drop(client);
                return Ok(());
            }
            Fault::Delay(d) => {
                sh.counters.delayed.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(d).await;
            }
            Fault::None => {}
            Fault::Partial(rate, at_least_one) => {
                if let Some((kept, failed, total)) = drop_entries(&req, rate, at_least_one) {
                    sh.counters.partial_calls.fetch_add(1, Ordering::Relaxed);
                    if !at_least_one {
                        // counted here, once entries were failed (see the accounting above)
                        let mut by_op = sh.by_op.lock().unwrap();
                        by_op.entry(op.clone()).or_default().faults += 1;
                    }
                    sh.counters.partial_entries.fetch_add(failed.len() as u64, Ordering::Relaxed);
                    match kept {
                        Some(r) => {
                            req = r;
                            splice = Some((failed, total));
                        }
                        None => {
                            // every entry failed: answer without forwarding
                            let records: Vec<serde_json::Value> = (0..total).map(|_| failed_entry()).collect();
                            let body = serde_json::json!({ "FailedRecordCount": total, "Records": records });
                            client.write_all(&response("200 OK", &body.to_string())).await?;
                            continue;
                        }
                    }
                }
            }
        }
        // Forward on this client's upstream connection (opened on first use, reopened after EOF).
        let mut attempt = 0;
        let resp = loop {
            if upstream.is_none() {
                let s = TcpStream::connect(sh.upstream).await?;
                let _ = s.set_nodelay(true);
                upstream = Some((s, Vec::new()));
            }
            let (up, ubuf) = upstream.as_mut().unwrap();
            let sent = async {
                up.write_all(&req.head).await?;
                up.write_all(&req.body).await?;
                read_message(up, ubuf).await
            }
            .await;
            match sent {
                Ok(Some(r)) => break r,
                Ok(None) | Err(_) if attempt == 0 => {
                    // A kept-alive upstream connection closed under us: one fresh attempt.
                    upstream = None;
                    attempt += 1;
                }
                Ok(None) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Err(e) => {
                    sh.counters.upstream_errors.fetch_add(1, Ordering::Relaxed);
                    return Err(e);
                }
            }
        };
        if resp.header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close")) {
            upstream = None;
        }
        let resp = match &splice {
            Some((failed, total)) => splice_failures(&resp, failed, *total).unwrap_or(resp),
            None => resp,
        };
        let mut hidden = sh.hidden.lock().unwrap().clone();
        hidden.extend(sh.omitted.lock().unwrap().iter().cloned());
        let resp = if op == "ListShards" && !hidden.is_empty() {
            match hide(&resp, &hidden) {
                Some((r, removed)) => {
                    sh.counters.hidden_listings.fetch_add(1, Ordering::Relaxed);
                    let mut counts = sh.hidden_counts.lock().unwrap();
                    for id in removed {
                        *counts.entry(id).or_default() += 1;
                    }
                    r
                }
                None => resp,
            }
        } else {
            resp
        };
        let lag = *sh.stale_lag.lock().unwrap();
        let resp = match lag {
            Some(lag) if op == "Query" => match stale_query(sh, &req, &resp, lag) {
                Some((r, added)) => {
                    sh.counters.stale_items.fetch_add(added, Ordering::Relaxed);
                    r
                }
                None => resp,
            },
            _ => resp,
        };
        client.write_all(&resp.head).await?;
        client.write_all(&resp.body).await?;
        sh.counters.forwarded.fetch_add(1, Ordering::Relaxed);
    }
}

/// The body of a response with its chunked framing removed, if it was chunked.
fn plain_body(m: &Message) -> Option<Vec<u8>> {
    if !m.header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        return Some(m.body.clone());
    }
    let (b, mut i, mut out) = (&m.body, 0, Vec::new());
    loop {
        let line_end = b[i..].windows(2).position(|w| w == b"\r\n")? + i;
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[i..line_end]).ok()?.split(';').next()?.trim(), 16).ok()?;
        i = line_end + 2;
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(b.get(i..i + size)?);
        i += size + 2;
    }
}

/// A PutRecords entry failed by the proxy.
fn failed_entry() -> serde_json::Value {
    serde_json::json!({
        "ErrorCode": "ProvisionedThroughputExceededException",
        "ErrorMessage": "Rate exceeded for shard (injected by the fault proxy)"
    })
}

/// `head` (a request or status line and headers) with a new body: Content-Length set,
/// Transfer-Encoding and a body checksum (DynamoDB's x-amz-crc32) dropped.
fn with_body(head: &[u8], body: Vec<u8>) -> Message {
    let text = String::from_utf8_lossy(head).to_string();
    let mut out = String::new();
    for (i, line) in text.split("\r\n").enumerate() {
        let name = line.split(':').next().unwrap_or("").trim();
        let dropped = ["content-length", "transfer-encoding", "x-amz-crc32"];
        if line.is_empty() || (i > 0 && dropped.iter().any(|d| name.eq_ignore_ascii_case(d))) {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    Message { head: out.into_bytes(), body }
}

/// Drops entries of a PutRecords request, each with chance `rate` (at least one): the request
/// to forward (None when every entry was dropped), the dropped positions, the entry count.
fn drop_entries(req: &Message, rate: f64, at_least_one: bool) -> Option<(Option<Message>, Vec<usize>, usize)> {
    let mut doc: serde_json::Value = serde_json::from_slice(&plain_body(req)?).ok()?;
    let records = doc.get_mut("Records")?.as_array_mut()?;
    let total = records.len();
    if total == 0 {
        return None;
    }
    let mut failed: Vec<usize> = (0..total).filter(|_| rand::random::<f64>() < rate).collect();
    if failed.is_empty() {
        if !at_least_one {
            return None;
        }
        failed.push(rand::random::<u32>() as usize % total);
    }
    let mut i = 0;
    records.retain(|_| {
        let keep = !failed.contains(&i);
        i += 1;
        keep
    });
    if records.is_empty() {
        return Some((None, failed, total));
    }
    let body = serde_json::to_vec(&doc).ok()?;
    Some((Some(with_body(&req.head, body)), failed, total))
}

/// A PutRecords answer for the forwarded entries, with a failed entry spliced in at each of
/// `failed` (positions in the original request of `total` entries) and FailedRecordCount
/// raised. None when the answer is not a successful JSON one (it is passed on as it is).
fn splice_failures(resp: &Message, failed: &[usize], total: usize) -> Option<Message> {
    let text = String::from_utf8_lossy(&resp.head).to_string();
    if !text.starts_with("HTTP/1.1 200") || resp.header("content-encoding").is_some() {
        return None;
    }
    let mut doc: serde_json::Value = serde_json::from_slice(&plain_body(resp)?).ok()?;
    let forwarded = std::mem::take(doc.get_mut("Records")?.as_array_mut()?);
    if forwarded.len() + failed.len() != total {
        return None;
    }
    let mut forwarded = forwarded.into_iter();
    let records: Vec<serde_json::Value> = (0..total)
        .map(|i| if failed.contains(&i) { Some(failed_entry()) } else { forwarded.next() })
        .collect::<Option<_>>()?;
    let before = doc.get("FailedRecordCount").and_then(|v| v.as_u64()).unwrap_or(0);
    doc["FailedRecordCount"] = serde_json::json!(before + failed.len() as u64);
    doc["Records"] = serde_json::Value::Array(records);
    Some(with_body(&resp.head, serde_json::to_vec(&doc).ok()?))
}

/// A ListShards answer without the `hidden` shards, with a fresh Content-Length (no chunking),
/// and the ids it removed. None when it is not a successful, plain JSON answer naming one of them.
fn hide(resp: &Message, hidden: &[String]) -> Option<(Message, Vec<String>)> {
    let text = String::from_utf8_lossy(&resp.head).to_string();
    if !text.starts_with("HTTP/1.1 200") || resp.header("content-encoding").is_some() {
        return None;
    }
    let mut doc: serde_json::Value = serde_json::from_slice(&plain_body(resp)?).ok()?;
    let shards = doc.get_mut("Shards")?.as_array_mut()?;
    let mut removed = Vec::new();
    shards.retain(|s| match s["ShardId"].as_str() {
        Some(id) if hidden.iter().any(|h| h == id) => {
            removed.push(id.to_string());
            false
        }
        _ => true,
    });
    if removed.is_empty() {
        return None;
    }
    let body = serde_json::to_vec(&doc).ok()?;
    let mut head = String::new();
    for (i, line) in text.split("\r\n").enumerate() {
        let name = line.split(':').next().unwrap_or("").trim();
        if line.is_empty()
            || (i > 0
                && (name.eq_ignore_ascii_case("content-length") || name.eq_ignore_ascii_case("transfer-encoding")))
        {
            continue;
        }
        head.push_str(line);
        head.push_str("\r\n");
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    Some((Message { head: head.into_bytes(), body }, removed))
}

/// A Query answer on a secondary index made eventually consistent: the entries the index listed
/// before under the same partition value and lost less than `lag` ago are listed again (when
/// the sort key condition `<= :w` still selects them). Returns the answer and how many it added.
/// Only the key condition `P = :p AND S <= :w` (what the window firer asks) is understood; any
/// other query passes unchanged.
fn stale_query(sh: &Shared, req: &Message, resp: &Message, lag: Duration) -> Option<(Message, u64)> {
    let text = String::from_utf8_lossy(&resp.head).to_string();
    if !text.starts_with("HTTP/1.1 200") || resp.header("content-encoding").is_some() {
        return None;
    }
    let q: serde_json::Value = serde_json::from_slice(&req.body).ok()?;
    let (table, index) = (q["TableName"].as_str()?.to_string(), q["IndexName"].as_str()?.to_string());
    let cond = q["KeyConditionExpression"].as_str()?;
    let (pcond, scond) = cond.split_once(" AND ")?;
    let (pname, _) = pcond.split_once(" = ")?;
    let (sname, _) = scond.split_once(" <= ")?;
    let (pname, sname) = (pname.trim().to_string(), sname.trim().to_string());
    let pvalue = q["ExpressionAttributeValues"][":p"]["S"].as_str()?.to_string();
    let upto: i128 = q["ExpressionAttributeValues"][":w"]["N"].as_str()?.parse().ok()?;
    let mut doc: serde_json::Value = serde_json::from_slice(&plain_body(resp)?).ok()?;
    let items = doc.get_mut("Items")?.as_array_mut()?;
    let now = Instant::now();
    let mut seen = sh.index_seen.lock().unwrap();
    let known = seen.entry((table, index, pvalue)).or_default();
    let mut listed = std::collections::BTreeSet::new();
    for it in items.iter() {
        let (Some(pk), Some(at)) = (it["pk"]["S"].as_str(), it[sname.as_str()]["N"].as_str()) else { continue };
        listed.insert(pk.to_string());
        known.insert(pk.to_string(), (it.clone(), at.parse().unwrap_or(0), now));
    }
    let mut added = 0u64;
    known.retain(|pk, (it, at, last)| {
        if now.duration_since(*last) > lag {
            return false;
        }
        if !listed.contains(pk) && *at <= upto && it[pname.as_str()].is_object() {
            items.push(it.clone());
            added += 1;
        }
        true
    });
    if added == 0 {
        return None;
    }
    let n = items.len();
    doc["Count"] = serde_json::json!(n);
    doc["ScannedCount"] = serde_json::json!(n);
    Some((with_body(&resp.head, serde_json::to_vec(&doc).ok()?), added))
}
