//! A TCP proxy in front of the Kinesis engine that can silence the enhanced fan-out subscriptions
//! open at a given moment without closing them: [`StallProxy::stall_streams`] stops forwarding the
//! server's bytes on every connection that carries an event stream (its response head names
//! `application/vnd.amazon.eventstream`), as a subscription that hangs on the network would. Other
//! connections, and event streams opened later, pass. A stalled connection is closed when the
//! client closes it. Listens on 127.0.0.1 only.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const EVENT_STREAM: &[u8] = b"application/vnd.amazon.eventstream";

#[derive(Default)]
struct Shared {
    /// The stall flag of every connection that carried an event stream.
    streams: Mutex<Vec<Arc<AtomicBool>>>,
}

/// The running proxy; it stops when dropped.
pub struct StallProxy {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl StallProxy {
    /// Forwards to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> StallProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the stall proxy");
        let url = format!("http://{}", listener.local_addr().expect("proxy address"));
        let shared = Arc::new(Shared::default());
        let (sh, upstream) = (shared.clone(), upstream.to_string());
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let (sh, up) = (sh.clone(), upstream.clone());
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(&up).await else { return };
                    let (mut cr, mut cw) = inbound.into_split();
                    let (mut sr, mut sw) = outbound.into_split();
                    let c2s = tokio::io::copy(&mut cr, &mut sw);
                    let s2c = async {
                        let stalled = Arc::new(AtomicBool::new(false));
                        let mut marked = false;
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match sr.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if !marked && buf[..n].windows(EVENT_STREAM.len()).any(|w| w == EVENT_STREAM) {
                                marked = true;
                                sh.streams.lock().unwrap().push(stalled.clone());
                            }
                            while stalled.load(Ordering::SeqCst) {
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                            if cw.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    };
                    // Either side closing ends the connection (a stalled one when the client leaves).
                    tokio::select! {
                        _ = c2s => {}
                        _ = s2c => {}
                    }
                });
            }
        });
        StallProxy { url, shared, accept }
    }

    /// Silences every event stream seen so far; returns how many.
    pub fn stall_streams(&self) -> usize {
        let mut streams = self.shared.streams.lock().unwrap();
        for s in streams.iter() {
            s.store(true, Ordering::SeqCst);
        }
        let n = streams.len();
        streams.clear();
        n
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}
