//! `squall ui`: a web status page in the role of the Storm UI, served by the binary itself
//! (no external assets).
//!
//! Layout:
//! - this module: the server, its routes and the request checks;
//! - [`page`]: the HTML, rendered from the CLI's [`StatusReport`](crate::cli::StatusReport),
//!   every value from ZooKeeper escaped.
//!
//! What it reads it reads from ZooKeeper with the CLI's own functions (`squall topology list`,
//! `squall status`), at each request: `/` lists the topologies, `/topology/{name}` shows one
//! (state, workers, each stream's shards with their lineage, owners, checkpoints, lag and
//! errors, stages). A topology's page also shows the live figures of every worker that serves
//! a metrics endpoint ([`live`]: its address is in its status znode; scraped concurrently, 500 ms
//! each, an unreachable one marked so): per shard, what its owner reports (MillisBehindLatest,
//! records read, GetRecords, throttles, read errors), per worker its ZooKeeper session and
//! per-component emitted / acked / failed. A small inline script refreshes the live part every 2 s from
//! `/topology/{name}/live` (an HTML fragment of the same renderer). `/api/topologies` and
//! `/api/topology/{name}` serve the same data as JSON (the `squall status --json` schema).
//!
//! Actions (activate, deactivate, rebalance, drain, kill) are the CLI's functions too, behind a
//! confirmation page whose form POSTs a per-process random token. Every POST must carry that
//! token (compared in constant time) and an `Origin` (or, without one, a `Referer`) whose host
//! is the request's `Host`; anything else is refused with 403 before it touches ZooKeeper. The
//! server listens on loopback unless `--allow-remote`, and then also refuses requests whose
//! `Host` is not a loopback name (DNS rebinding). Pages forbid framing and carry a nonce-based
//! Content-Security-Policy. With `--zk-user` (and `SQUALL_ZK_PASSWORD`) the UI reads and acts
//! with those credentials; without them, a topology whose znodes are creator-only is "not
//! authorized", and the page says how to fix it.

pub(crate) mod live;
pub(crate) mod page;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use axum::Router;
use axum::extract::{Form, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Json, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use subtle::ConstantTimeEq as _;

use crate::cli::topology_ops::{self as ops, Collected};
use crate::coord::{CoordError, ZkConfig};

/// How `squall ui` runs.
#[derive(Debug, Clone)]
pub struct UiConfig {
    /// The address to listen on (port 0: any free port; the chosen one is printed).
    pub listen: SocketAddr,
    /// Allow a non-loopback listen address.
    pub allow_remote: bool,
    /// ZooKeeper: connect string, root and credentials (the password is never shown).
    pub zk: ZkConfig,
}

/// Refuses a non-loopback listen address unless remote access was asked for.
pub fn check_listen(addr: SocketAddr, allow_remote: bool) -> anyhow::Result<()> {
    if addr.ip().is_loopback() || allow_remote {
        return Ok(());
    }
    anyhow::bail!(
        "refusing to listen on {addr}: it is not a loopback address, and the UI has no login (anyone who reaches it \
         can deactivate, drain or kill topologies). Listen on 127.0.0.1 (e.g. --listen 127.0.0.1:8080) and reach it \
         through an SSH tunnel, or pass --allow-remote if the network in front of it is trusted"
    )
}

/// A lifecycle action the UI offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Activate,
    Deactivate,
    Rebalance,
    Drain,
    Kill,
}

impl Action {
    pub(crate) const ALL: [Action; 5] =
        [Action::Activate, Action::Deactivate, Action::Rebalance, Action::Drain, Action::Kill];

    fn parse(s: &str) -> Option<Action> {
        Self::ALL.into_iter().find(|a| a.name() == s)
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Action::Activate => "activate",
            Action::Deactivate => "deactivate",
            Action::Rebalance => "rebalance",
            Action::Drain => "drain",
            Action::Kill => "kill",
        }
    }

    pub(crate) fn label(self) -> &'static str {
        match self {
            Action::Activate => "Activate",
            Action::Deactivate => "Deactivate",
            Action::Rebalance => "Rebalance",
            Action::Drain => "Drain",
            Action::Kill => "Kill",
        }
    }

    pub(crate) fn dangerous(self) -> bool {
        matches!(self, Action::Drain | Action::Kill)
    }

    /// What it does (static HTML), as `squall --help` says it.
    pub(crate) fn explain(self) -> &'static str {
        match self {
            Action::Activate => "Spouts resume fetching from their checkpoints (<code>squall activate</code>).",
            Action::Deactivate => {
                "Spouts stop fetching within 1 s; acks, fails and checkpoints go on, and shards are handed back \
                 (<code>squall deactivate</code>)."
            }
            Action::Rebalance => {
                "Deactivates, waits until every shard is handed back, lets the leader assign them afresh \
                 (round-robin), then restores the previous state (<code>squall rebalance</code>)."
            }
            Action::Drain => {
                "Spouts stop fetching, in-flight tuples finish, windows flush, checkpoints are written; the \
                 topology becomes DRAINED and its workers exit 0 (<code>squall drain</code>). Only starting the \
                 workers again deploys it again."
            }
            Action::Kill => {
                "Deactivates, waits for in-flight tuples, checkpoints, and stops every worker (exit 0); this page \
                 waits until they are gone (<code>squall kill</code>). Only starting the workers again deploys it \
                 again."
            }
        }
    }

    fn wait_hint(self) -> Option<&'static str> {
        match self {
            Action::Activate | Action::Deactivate => None,
            Action::Rebalance => Some("how long to wait for shards to be handed back (default 30)"),
            Action::Drain => Some("wait this long for DRAINED (default: do not wait)"),
            Action::Kill => Some("how long workers wait for in-flight tuples (default: their message timeout)"),
        }
    }
}

struct AppState {
    zk: ZkConfig,
    /// The per-process CSRF token every POST must carry.
    token: String,
    /// The listen port (for the Host check).
    port: u16,
    /// Check that `Host` names a loopback address (false with --allow-remote).
    loopback_only: bool,
    /// Scrapes the workers' metrics endpoints.
    scraper: live::Scraper,
    /// The ZooKeeper sessions every page and API read shares (opened at the first read, replaced
    /// after a read failed other than by a wrong topology name): the live pages refresh every
    /// few seconds, and a session per read would be a session creation and close, writes
    /// through the ensemble's leader, per refresh and viewer.
    reader: tokio::sync::Mutex<Option<Arc<ops::StatusReader>>>,
}

impl AppState {
    /// The shared reader, connected when there is none.
    async fn reader(&self) -> anyhow::Result<Arc<ops::StatusReader>> {
        let mut guard = self.reader.lock().await;
        if let Some(r) = guard.as_ref() {
            return Ok(r.clone());
        }
        let r = Arc::new(ops::StatusReader::connect(&self.zk).await?);
        *guard = Some(r.clone());
        Ok(r)
    }

    /// Drops `used` after its read failed with `e`, unless the failure was the name's.
    async fn read_failed(&self, used: &Arc<ops::StatusReader>, e: &anyhow::Error) {
        if ops::reader_survives(e) {
            return;
        }
        let mut guard = self.reader.lock().await;
        if guard.as_ref().is_some_and(|r| Arc::ptr_eq(r, used)) {
            *guard = None;
        }
    }

    /// The status of topology `name`.
    async fn status_report(&self, name: &str) -> anyhow::Result<crate::cli::StatusReport> {
        let reader = self.reader().await?;
        let r = reader.report(name).await;
        if let Err(e) = &r {
            self.read_failed(&reader, e).await;
        }
        r
    }

    /// Every topology under the root.
    async fn topologies(&self) -> anyhow::Result<Vec<crate::cli::TopologySummary>> {
        let reader = self.reader().await?;
        let r = reader.topologies().await;
        if let Err(e) = &r {
            self.read_failed(&reader, e).await;
        }
        r
    }
}

type Shared = Arc<AppState>;

fn random_hex(bytes: usize) -> String {
    use rand::RngCore as _;
    let mut b = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Serves the UI until SIGINT or SIGTERM.
pub async fn serve(cfg: UiConfig) -> anyhow::Result<()> {
    check_listen(cfg.listen, cfg.allow_remote)?;
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("binding the web UI to {}", cfg.listen))?;
    let addr = listener.local_addr().context("the web UI's listen address")?;
    let state = Arc::new(AppState {
        zk: cfg.zk.clone(),
        token: random_hex(32),
        port: addr.port(),
        loopback_only: !cfg.allow_remote,
        scraper: live::scraper(),
        reader: tokio::sync::Mutex::new(None),
    });
    {
        use std::io::Write as _;
        let auth = cfg.zk.auth.as_ref().map(|a| format!(", as ZooKeeper user {}", a.user())).unwrap_or_default();
        let _ = writeln!(
            std::io::stdout().lock(),
            "squall ui: serving http://{addr}/ (ZooKeeper {}, root {}{auth}); Ctrl-C stops it",
            cfg.zk.connect,
            cfg.zk.root
        );
    }
    axum::serve(listener, router(state)).with_graceful_shutdown(shutdown()).await.context("serving the web UI")?;
    Ok(())
}

async fn shutdown() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

fn router(state: Shared) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/live", get(index_live))
        .route("/api/topologies", get(api_topologies))
        .route("/api/topology/{name}", get(api_topology))
        .route("/topology/{name}", get(topology))
        .route("/topology/{name}/live", get(topology_live))
        .route("/topology/{name}/confirm/{action}", get(confirm))
        .route("/topology/{name}/{action}", post(act))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// The per-response CSP nonce, put into the request by [`guard`].
#[derive(Clone)]
struct Nonce(String);

/// Every request: the Host check (loopback names only, unless --allow-remote), the Origin
/// check of every POST, and the security headers of every response.
async fn guard(State(st): State<Shared>, mut req: Request, next: Next) -> Response {
    let headers = req.headers();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("").to_string();
    if st.loopback_only && !loopback_host(&host, st.port) {
        return refuse(format!(
            "Host {host:?} is not a loopback name of this server (port {}): refused (DNS rebinding?). \
             Open it as http://127.0.0.1:{}/ or start squall ui with --allow-remote",
            st.port, st.port
        ));
    }
    if req.method() == axum::http::Method::POST
        && let Err(why) = same_origin(headers, &host)
    {
        return refuse(why);
    }
    let nonce = random_hex(16);
    req.extensions_mut().insert(Nonce(nonce.clone()));
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    let csp = format!(
        "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; connect-src 'self'; \
         img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    );
    if let Ok(v) = HeaderValue::from_str(&csp) {
        h.insert(header::CONTENT_SECURITY_POLICY, v);
    }
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// `host[:port]` names this server on loopback.
fn loopback_host(host: &str, port: u16) -> bool {
    let (name, p) = split_host_port(host);
    let port_ok = match p {
        Some(p) => p == port.to_string(),
        None => port == 80,
    };
    let name = name.to_ascii_lowercase();
    let name_ok = name == "localhost"
        || name.ends_with(".localhost")
        || name
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    port_ok && name_ok
}

/// Splits `host[:port]` (IPv6 in brackets).
fn split_host_port(host: &str) -> (&str, Option<&str>) {
    if let Some(rest) = host.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((ip, tail)) => (&host[..ip.len() + 2], tail.strip_prefix(':')),
            None => (host, None),
        };
    }
    match host.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (host, None),
    }
}

/// The authority (`host[:port]`) of an absolute http(s) URL.
fn authority(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"))?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    Some(&rest[..end]).filter(|a| !a.is_empty())
}

/// A POST must come from a page of this server: its Origin (or, when a browser sent none, its
/// Referer) names the same host and port as its Host header.
fn same_origin(headers: &HeaderMap, host: &str) -> Result<(), String> {
    let get = |h| headers.get(h).and_then(|v: &HeaderValue| v.to_str().ok());
    let (what, value) = match (get(header::ORIGIN), get(header::REFERER)) {
        (Some(o), _) => ("Origin", o),
        (None, Some(r)) => ("Referer", r),
        (None, None) => {
            return Err("a POST without Origin or Referer header: refused (cross-site request protection)".into());
        }
    };
    match authority(value) {
        Some(a) if !host.is_empty() && a.eq_ignore_ascii_case(host) => Ok(()),
        _ => Err(format!(
            "cross-site request refused: {what} {value:?} is not this server ({host:?}); use the buttons of the UI's own pages"
        )),
    }
}

fn refuse(why: String) -> Response {
    (StatusCode::FORBIDDEN, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], why + "\n").into_response()
}

fn html(status: StatusCode, title: &str, st: &AppState, nonce: &Nonce, body: &str) -> Response {
    let where_ = format!("ZooKeeper {} root {}", st.zk.connect, st.zk.root);
    (status, Html(page::layout(title, &where_, &nonce.0, body))).into_response()
}

/// The status code and message of a failed read or action, with a hint for ZooKeeper auth.
fn failure(st: &AppState, e: &anyhow::Error) -> (StatusCode, String) {
    let coord = e.chain().find_map(|c| c.downcast_ref::<CoordError>());
    let msg = format!("{e:#}");
    match coord {
        Some(CoordError::NotAuthorized { .. }) => {
            let hint = if st.zk.auth.is_none() {
                "squall ui was started without ZooKeeper credentials: start it with --zk-user USER (or \
                 SQUALL_ZK_USER) and SQUALL_ZK_PASSWORD, the identity the topology's workers use"
            } else {
                "squall ui's ZooKeeper user is not the one the topology's workers use"
            };
            (StatusCode::FORBIDDEN, format!("{msg}. {hint}"))
        }
        Some(CoordError::UnknownTopology { .. } | CoordError::InvalidName { .. }) => (StatusCode::NOT_FOUND, msg),
        _ => (StatusCode::SERVICE_UNAVAILABLE, msg),
    }
}

async fn index(State(st): State<Shared>, axum::Extension(nonce): axum::Extension<Nonce>) -> Response {
    let (status, fragment) = index_fragment(&st).await;
    html(status, "Topologies", &st, &nonce, &page::index_page(&fragment))
}

async fn index_live(State(st): State<Shared>) -> Response {
    let (status, fragment) = index_fragment(&st).await;
    (status, Html(fragment)).into_response()
}

async fn index_fragment(st: &AppState) -> (StatusCode, String) {
    match st.topologies().await {
        Ok(list) => (StatusCode::OK, page::index_fragment(&list, &st.zk.root)),
        Err(e) => {
            let (status, msg) = failure(st, &e);
            (status, page::error_box("Cannot list the topologies", &msg))
        }
    }
}

async fn api_topologies(State(st): State<Shared>) -> Response {
    match st.topologies().await {
        Ok(list) => Json(list).into_response(),
        Err(e) => api_error(&st, &e),
    }
}

async fn api_topology(State(st): State<Shared>, Path(name): Path<String>) -> Response {
    match st.status_report(&name).await {
        Ok(r) => Json(r).into_response(),
        Err(e) => api_error(&st, &e),
    }
}

fn api_error(st: &AppState, e: &anyhow::Error) -> Response {
    let (status, msg) = failure(st, e);
    (status, Json(serde_json::json!({ "error": msg }))).into_response()
}

async fn topology_fragment(st: &AppState, name: &str) -> (StatusCode, String) {
    match st.status_report(name).await {
        Ok(r) => {
            let live = live::scrape_workers(&st.scraper, &r.workers).await;
            (StatusCode::OK, page::topology_fragment(&r, &live))
        }
        Err(e) => {
            let (status, msg) = failure(st, &e);
            (status, page::error_box(&format!("Cannot read topology {name:?}"), &msg))
        }
    }
}

async fn topology(
    State(st): State<Shared>,
    Path(name): Path<String>,
    axum::Extension(nonce): axum::Extension<Nonce>,
) -> Response {
    let (status, fragment) = topology_fragment(&st, &name).await;
    html(status, &name, &st, &nonce, &page::topology_page(&name, &fragment))
}

async fn topology_live(State(st): State<Shared>, Path(name): Path<String>) -> Response {
    let (status, fragment) = topology_fragment(&st, &name).await;
    (status, Html(fragment)).into_response()
}

async fn confirm(
    State(st): State<Shared>,
    Path((name, action)): Path<(String, String)>,
    axum::Extension(nonce): axum::Extension<Nonce>,
) -> Response {
    let Some(action) = Action::parse(&action) else { return not_found().await };
    html(StatusCode::OK, action.label(), &st, &nonce, &page::confirm_page(&name, action, &st.token))
}

#[derive(Debug, Deserialize)]
struct ActionForm {
    #[serde(default)]
    token: String,
    #[serde(default)]
    wait: String,
}

async fn act(
    State(st): State<Shared>,
    Path((name, action)): Path<(String, String)>,
    axum::Extension(nonce): axum::Extension<Nonce>,
    Form(form): Form<ActionForm>,
) -> Response {
    // (The Origin check ran in `guard`.)
    if !bool::from(form.token.as_bytes().ct_eq(st.token.as_bytes())) {
        return refuse(
            "missing or wrong form token: refused (cross-site request protection). Open the action from the UI's \
             own page and confirm it there"
                .into(),
        );
    }
    let Some(action) = Action::parse(&action) else { return not_found().await };
    let wait = match form.wait.trim() {
        "" => None,
        w => match w.parse::<u64>() {
            Ok(w) if w <= 3600 => Some(w),
            _ => {
                let body =
                    page::result_page(&name, action, &Err(format!("wait {w:?} is not a number of seconds (0-3600)")));
                return html(StatusCode::BAD_REQUEST, action.label(), &st, &nonce, &body);
            }
        },
    };
    let mut out = Collected::default();
    let res = match action {
        Action::Activate => ops::set_active(&st.zk, &name, true, &mut out).await,
        Action::Deactivate => ops::set_active(&st.zk, &name, false, &mut out).await,
        Action::Rebalance => {
            ops::rebalance_topology(&st.zk, &name, wait.unwrap_or(30), ops::REBALANCE_GATHER_SECS, &mut out).await
        }
        Action::Drain => ops::drain_topology(&st.zk, &name, wait, &mut out).await,
        Action::Kill => ops::kill_topology(&st.zk, &name, wait, &mut out).await,
    };
    let (status, outcome) = match res {
        Ok(()) => (StatusCode::OK, Ok(out.lines)),
        Err(e) => {
            let (status, msg) = failure(&st, &e);
            let status = if status == StatusCode::SERVICE_UNAVAILABLE { StatusCode::CONFLICT } else { status };
            (status, Err(msg))
        }
    };
    tracing::info!(topology = %name, action = action.name(), ok = outcome.is_ok(), "web UI action");
    html(status, action.label(), &st, &nonce, &page::result_page(&name, action, &outcome))
}

async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], "not found\n").into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_address_must_be_loopback_unless_allowed() {
        assert!(check_listen("127.0.0.1:8080".parse().unwrap(), false).is_ok());
        assert!(check_listen("[::1]:8080".parse().unwrap(), false).is_ok());
        let e = check_listen("0.0.0.0:8080".parse().unwrap(), false).unwrap_err().to_string();
        assert!(e.contains("0.0.0.0:8080") && e.contains("--allow-remote"), "{e}");
        assert!(check_listen("10.1.2.3:8080".parse().unwrap(), false).is_err());
        assert!(check_listen("0.0.0.0:8080".parse().unwrap(), true).is_ok());
    }

    #[test]
    fn host_header_must_be_a_loopback_name_with_our_port() {
        assert!(loopback_host("127.0.0.1:8080", 8080));
        assert!(loopback_host("localhost:8080", 8080));
        assert!(loopback_host("[::1]:8080", 8080));
        assert!(loopback_host("127.0.0.1", 80));
        assert!(!loopback_host("127.0.0.1:8081", 8080));
        assert!(!loopback_host("evil.example:8080", 8080));
        assert!(!loopback_host("", 8080));
        assert!(!loopback_host("127.0.0.1", 8080));
    }

    #[test]
    fn posts_need_an_origin_or_referer_naming_our_host() {
        let h = |pairs: &[(header::HeaderName, &str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.insert(k.clone(), HeaderValue::from_str(v).unwrap());
            }
            m
        };
        let host = "127.0.0.1:8080";
        assert!(same_origin(&h(&[(header::ORIGIN, "http://127.0.0.1:8080")]), host).is_ok());
        assert!(same_origin(&h(&[(header::REFERER, "http://127.0.0.1:8080/topology/x/confirm/kill")]), host).is_ok());
        assert!(same_origin(&h(&[(header::ORIGIN, "http://evil.example")]), host).is_err());
        assert!(same_origin(&h(&[(header::ORIGIN, "http://127.0.0.1:8080.evil.example")]), host).is_err());
        assert!(same_origin(&h(&[(header::ORIGIN, "null")]), host).is_err());
        // A foreign Origin is not excused by a matching Referer.
        assert!(
            same_origin(
                &h(&[(header::ORIGIN, "http://evil.example"), (header::REFERER, "http://127.0.0.1:8080/")]),
                host
            )
            .is_err()
        );
        assert!(same_origin(&h(&[]), host).is_err());
    }

    #[test]
    fn actions_parse_by_name() {
        for a in Action::ALL {
            assert_eq!(Action::parse(a.name()), Some(a));
        }
        assert_eq!(Action::parse("delete"), None);
    }
}
