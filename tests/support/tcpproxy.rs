//! A TCP proxy that can be cut and restored: put it between a worker and ZooKeeper (give the
//! worker `--zk` = [`TcpProxy::addr`]) to partition the worker from ZooKeeper without touching the
//! shared server. Cutting drops every open connection and closes each new one at once (the
//! listening port stays, so [`TcpProxy::restore`] reconnects on the same address). Listens on
//! 127.0.0.1 only. (A copy of the `CuttableProxy` of `tests/coord_store.rs`, restorable.)
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

struct Shared {
    open: AtomicBool,
    conns: Mutex<Vec<JoinHandle<()>>>,
    accepted: AtomicU64,
    refused: AtomicU64,
}

/// The running proxy; everything stops when it is dropped.
pub struct TcpProxy {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl TcpProxy {
    /// Starts forwarding to `upstream` (`host:port`, loopback).
    pub async fn start(upstream: &str) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the TCP proxy");
        let addr = listener.local_addr().expect("proxy address").to_string();
        let shared = Arc::new(Shared {
            open: AtomicBool::new(true),
            conns: Mutex::new(Vec::new()),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        });
        let (sh, upstream) = (shared.clone(), upstream.to_string());
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !sh.open.load(Ordering::SeqCst) {
                    sh.refused.fetch_add(1, Ordering::Relaxed);
                    drop(inbound);
                    continue;
                }
                sh.accepted.fetch_add(1, Ordering::Relaxed);
                let up = upstream.clone();
                let handle = tokio::spawn(async move {
                    if let Ok(mut upstream) = TcpStream::connect(&up).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut upstream).await;
                    }
                });
                let mut conns = sh.conns.lock().unwrap();
                conns.retain(|h| !h.is_finished());
                conns.push(handle);
            }
        });
        TcpProxy { addr, shared, accept }
    }

    /// Drops every connection; new ones are closed at once until [`TcpProxy::restore`].
    pub fn cut(&self) {
        self.shared.open.store(false, Ordering::SeqCst);
        for h in self.shared.conns.lock().unwrap().drain(..) {
            h.abort();
        }
    }

    /// Forwards new connections again.
    pub fn restore(&self) {
        self.shared.open.store(true, Ordering::SeqCst);
    }

    /// Connections forwarded so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    /// Connections closed at once because the proxy was cut (reconnect attempts).
    pub fn refused(&self) -> u64 {
        self.shared.refused.load(Ordering::Relaxed)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}
