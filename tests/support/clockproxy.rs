//! A proxy in front of the Kinesis engine that adds a check AWS makes and kinesis-local leaves out
//! for enhanced fan-out: a SubscribeToShard whose starting position is AT_TIMESTAMP later than now
//! (the engine's clock: this machine's plus an offset the test measured) is answered HTTP 400 `InvalidArgumentException` "Timestamp cannot be in
//! the future", as kinesis-local answers GetShardIterator (AWS: "The timestampInMillis parameter
//! cannot be greater than the currentTimestampInMillis"). Everything else is forwarded; a
//! connection whose answer has no Content-Length (an event stream) is spliced both ways from then
//! on. Counts the refusals. Listens on 127.0.0.1 only.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The running proxy; it stops when dropped.
pub struct ClockProxy {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    refused: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

impl ClockProxy {
    /// Forwards to `upstream` (`host:port`); the engine's clock is this machine's plus
    /// `engine_offset_ms`.
    pub async fn start(upstream: &str, engine_offset_ms: i64) -> ClockProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the clock proxy");
        let url = format!("http://{}", listener.local_addr().expect("proxy address"));
        let refused = Arc::new(AtomicU64::new(0));
        let (count, upstream) = (refused.clone(), upstream.to_string());
        let accept = tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let (count, upstream) = (count.clone(), upstream.clone());
                tokio::spawn(async move {
                    let _ = serve(sock, &upstream, &count, engine_offset_ms).await;
                });
            }
        });
        ClockProxy { url, refused, accept }
    }

    /// SubscribeToShard calls refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

impl Drop for ClockProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Reads one HTTP/1.1 message head (through the blank line) and, when it has a Content-Length,
/// its body. `None` at a clean EOF.
async fn read_message(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Option<(String, Vec<u8>, bool)>> {
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        let mut chunk = [0u8; 8192];
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return if buf.is_empty() { Ok(None) } else { Err(std::io::ErrorKind::UnexpectedEof.into()) };
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    buf.drain(..head_end);
    let len = head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case("content-length").then(|| v.trim().parse::<usize>().ok()).flatten()
    });
    let Some(len) = len else { return Ok(Some((head, Vec::new(), false))) };
    while buf.len() < len {
        let mut chunk = vec![0u8; len - buf.len()];
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(Some((head, buf.drain(..len).collect(), true)))
}

/// Whether the request is a SubscribeToShard at a timestamp later than now (this machine's
/// clock plus `offset_ms`).
fn in_the_future(head: &str, body: &[u8], offset_ms: i64) -> bool {
    let subscribe = head.lines().any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("x-amz-target") && v.trim().ends_with(".SubscribeToShard")
        })
    });
    if !subscribe {
        return false;
    }
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(body) else { return false };
    let pos = &doc["StartingPosition"];
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64()
        + offset_ms as f64 / 1000.0;
    pos["Type"] == "AT_TIMESTAMP" && pos["Timestamp"].as_f64().is_some_and(|ts| ts > now)
}

async fn serve(mut client: TcpStream, upstream: &str, refused: &AtomicU64, offset_ms: i64) -> std::io::Result<()> {
    let mut cbuf = Vec::new();
    let mut up: Option<(TcpStream, Vec<u8>)> = None;
    loop {
        let Some((head, body, _)) = read_message(&mut client, &mut cbuf).await? else { return Ok(()) };
        if in_the_future(&head, &body, offset_ms) {
            refused.fetch_add(1, Ordering::Relaxed);
            let body = r#"{"__type":"InvalidArgumentException","message":"Timestamp cannot be in the future"}"#;
            let answer = format!(
                "HTTP/1.1 400 Bad Request\r\nContent-Type: application/x-amz-json-1.1\r\nx-amzn-RequestId: clock-proxy\r\n\
                 Content-Length: {}\r\n\r\n{body}",
                body.len()
            );
            client.write_all(answer.as_bytes()).await?;
            continue;
        }
        if up.is_none() {
            up = Some((TcpStream::connect(upstream).await?, Vec::new()));
        }
        let (server, sbuf) = up.as_mut().unwrap();
        server.write_all(head.as_bytes()).await?;
        server.write_all(&body).await?;
        let Some((rhead, rbody, sized)) = read_message(server, sbuf).await? else { return Ok(()) };
        client.write_all(rhead.as_bytes()).await?;
        client.write_all(&rbody).await?;
        if !sized {
            // An event stream (or any unsized answer): pass everything through from now on.
            let (mut server, sbuf) = up.take().unwrap();
            client.write_all(&sbuf).await?;
            server.write_all(&cbuf).await?;
            tokio::io::copy_bidirectional(&mut client, &mut server).await?;
            return Ok(());
        }
    }
}
