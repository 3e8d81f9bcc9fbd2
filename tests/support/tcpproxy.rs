//! A TCP proxy that can be cut and restored: put it between a worker and ZooKeeper (give the
//! worker `--zk` = [`TcpProxy::addr`]) to partition the worker from ZooKeeper without touching the
//! shared server. Cutting drops every open connection and closes each new one at once (the
//! listening port stays, so [`TcpProxy::restore`] reconnects on the same address). Silencing
//! ([`TcpProxy::silence`]) is the other kind of partition: connections stay open and nothing
//! crosses them, no reset or close, so the client notices only by its own timeouts. Listens on
//! 127.0.0.1 only. (A copy of the `CuttableProxy` of `tests/coord_store.rs`, restorable.)
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

struct Shared {
    open: AtomicBool,
    silent: AtomicBool,
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
            silent: AtomicBool::new(false),
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
                let sh2 = sh.clone();
                let handle = tokio::spawn(async move {
                    while sh2.silent.load(Ordering::SeqCst) {
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    }
                    if let Ok(upstream) = TcpStream::connect(&up).await {
                        let (ir, iw) = inbound.into_split();
                        let (ur, uw) = upstream.into_split();
                        tokio::select! {
                            _ = pump(ir, uw, sh2.clone()) => {}
                            _ = pump(ur, iw, sh2) => {}
                        }
                    } else {
                        let _ = inbound.shutdown().await;
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

    /// Silences every connection, open and new: nothing is forwarded and nothing is closed, as
    /// on a network that drops every packet. [`TcpProxy::restore`] lets the bytes through again.
    pub fn silence(&self) {
        self.shared.silent.store(true, Ordering::SeqCst);
    }

    /// Forwards new connections again (after a cut), and the held bytes (after a silence).
    pub fn restore(&self) {
        self.shared.silent.store(false, Ordering::SeqCst);
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

/// Copies `r` to `w`, holding what it read while the proxy is silent.
async fn pump(mut r: tokio::net::tcp::OwnedReadHalf, mut w: tokio::net::tcp::OwnedWriteHalf, sh: Arc<Shared>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while sh.silent.load(Ordering::SeqCst) {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        if w.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}
