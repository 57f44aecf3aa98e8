//! The real `vq serve` against clients that misbehave and outputs that are gone: it closes
//! slow and idle connections, stops on SIGTERM within the drain time whatever clients hold,
//! and keeps serving (and stopping) when stderr or stdout is a closed pipe.

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use std::io::{Read, Write};
use std::net::TcpStream;

use crate::support::{RedisServer, SECRET, free_port, vq_command};

/// A `vq serve` child whose stdio the test chooses; killed on drop.
struct Serve {
    child: Child,
    port: u16,
}

impl Serve {
    async fn start(redis: &RedisServer, envs: &[(&str, &str)], stderr: Stdio) -> Self {
        let port = free_port();
        let mut cmd = vq_command();
        cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .env("VQ_REDIS__URL", redis.url())
            .env("VQ_TOKEN_SECRET", SECRET)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(stderr);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn vq serve");
        let serve = Self { child, port };
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while client.get(serve.url("/healthz")).send().await.is_err() {
            assert!(Instant::now() < deadline, "vq serve did not come up on port {port}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        serve
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn connect(&self) -> TcpStream {
        TcpStream::connect(("127.0.0.1", self.port)).expect("connect")
    }

    fn sigterm(&self) {
        let ok = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().expect("kill");
        assert!(ok.success());
    }

    /// Waits for the process to exit, up to `limit` (a generous bound, not a speed check).
    async fn exit_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        wait_exit(&mut self.child, limit).await
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn wait_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

const HALF_HEAD: &[u8] = b"POST /virtual-queues/limited-drop/1/entries HTTP/1.1\r\nHost: vq\r\nX-User-Id: 1\r\n";

/// Reads until the server closes the connection; `None` if it is still open after `limit`.
fn closed_by_server(conn: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
    conn.set_read_timeout(Some(limit)).unwrap();
    let mut got = Vec::new();
    match conn.read_to_end(&mut got) {
        Ok(_) => Some(got),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Some(got),
        Err(_) => None,
    }
}

#[tokio::test]
async fn half_sent_request_head_is_closed_after_the_header_read_timeout() {
    let redis = RedisServer::spawn();
    let vq = Serve::start(&redis, &[("VQ_HTTP__HEADER_READ_TIMEOUT_MS", "500")], Stdio::null()).await;
    let mut conn = vq.connect();
    conn.write_all(HALF_HEAD).unwrap();
    assert!(closed_by_server(&mut conn, Duration::from_secs(15)).is_some(), "half-sent head still open");

    // Slowloris: one header byte every 100 ms never completes the head, and is cut off too.
    let mut conn = vq.connect();
    conn.write_all(HALF_HEAD).unwrap();
    conn.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut trickle = || {
        for _ in 0..150 {
            if conn.write_all(b"X").is_err() {
                return true;
            }
            let mut byte = [0u8; 1];
            match conn.read(&mut byte) {
                Ok(0) => return true,
                Err(e) if e.kind() != std::io::ErrorKind::WouldBlock && e.kind() != std::io::ErrorKind::TimedOut => {
                    return true;
                }
                _ => {}
            }
        }
        false
    };
    assert!(trickle(), "a head trickled byte by byte kept the connection open for 15 s");

    // An idle keep-alive connection is closed too, after its answered request.
    let mut conn = vq.connect();
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: vq\r\n\r\n").unwrap();
    let got = closed_by_server(&mut conn, Duration::from_secs(15)).expect("idle keep-alive still open");
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"), "{}", String::from_utf8_lossy(&got));
}

#[tokio::test]
async fn sigterm_exits_within_the_drain_time_whatever_clients_hold() {
    let redis = RedisServer::spawn();
    // A header timeout far beyond the test: only the drain bound can end these connections.
    let envs = [("VQ_HTTP__HEADER_READ_TIMEOUT_MS", "600000"), ("VQ_HTTP__DRAIN_TIMEOUT_MS", "1000")];
    let mut vq = Serve::start(&redis, &envs, Stdio::null()).await;
    let mut held = Vec::new();
    for _ in 0..5 {
        let mut c = vq.connect();
        c.write_all(HALF_HEAD).unwrap();
        held.push(c);
    }
    for _ in 0..50 {
        let mut c = vq.connect();
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: vq\r\n\r\n").unwrap();
        let mut buf = [0u8; 256];
        assert!(c.read(&mut buf).unwrap() > 0);
        held.push(c);
    }
    // A connection opened but silent.
    held.push(vq.connect());
    vq.sigterm();
    let status = vq.exit_within(Duration::from_secs(30)).await;
    assert!(status.is_some_and(|s| s.success()), "vq serve did not exit after SIGTERM: {status:?}");
    drop(held);
}

/// An upstream that tells the test when a request reached it, then answers after 1 s.
fn slow_upstream() -> (String, std::sync::mpsc::Receiver<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = tx.send(());
                std::thread::sleep(Duration::from_secs(1));
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\nconnection: close\r\n\r\nordered");
            });
        }
    });
    (addr, rx)
}

#[tokio::test]
async fn in_flight_request_finishes_during_the_drain() {
    let redis = RedisServer::spawn();
    let (upstream, reached) = slow_upstream();
    let envs = [("VQ_GATE__UPSTREAM", upstream.as_str()), ("VQ_HTTP__DRAIN_TIMEOUT_MS", "10000")];
    let mut vq = Serve::start(&redis, &envs, Stdio::null()).await;
    let url = vq.url("/limited-drops/1/orders");
    let purchase = tokio::spawn(async move {
        let r = reqwest::Client::new().post(url).header("X-User-Id", "3").send().await.expect("an answer");
        (r.status().as_u16(), r.text().await.expect("body"))
    });
    let reached = tokio::task::spawn_blocking(move || reached.recv_timeout(Duration::from_secs(10)));
    reached.await.unwrap().expect("the purchase reached the upstream");
    vq.sigterm();
    let (status, body) = purchase.await.unwrap();
    assert_eq!((status, body.as_str()), (200, "ordered"), "the purchase in flight at SIGTERM completed");
    let exit = vq.exit_within(Duration::from_secs(30)).await;
    assert!(exit.is_some_and(|s| s.success()), "{exit:?}");
}

#[tokio::test]
async fn closed_stderr_neither_stops_serving_nor_blocks_sigterm() {
    let redis = RedisServer::spawn();
    // Port 1 refuses: every purchase logs "purchase API unreachable" and answers 502.
    let envs = [("VQ_GATE__UPSTREAM", "http://127.0.0.1:1"), ("RUST_LOG", "info")];
    let mut vq = Serve::start(&redis, &envs, Stdio::piped()).await;
    drop(vq.child.stderr.take()); // the log collector dies
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    for _ in 0..5 {
        let r = client.post(vq.url("/limited-drops/1/orders")).header("X-User-Id", "3").send().await;
        let status = r.map(|r| r.status().as_u16()).map_err(|e| e.to_string());
        assert_eq!(status, Ok(502), "a request that logs got no answer with stderr closed");
    }
    vq.sigterm();
    let exit = vq.exit_within(Duration::from_secs(30)).await;
    assert!(exit.is_some_and(|s| s.success()), "SIGTERM with stderr closed: {exit:?}");
}

#[tokio::test]
async fn stalled_stderr_does_not_block_requests_that_log() {
    let redis = RedisServer::spawn();
    let envs = [("VQ_GATE__UPSTREAM", "http://127.0.0.1:1"), ("RUST_LOG", "info")];
    // stderr is a pipe nobody reads: once its buffer (64 KiB) is full, a write would block.
    let mut vq = Serve::start(&redis, &envs, Stdio::piped()).await;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    for i in 0..1500 {
        let r = client.post(vq.url("/limited-drops/1/orders")).header("X-User-Id", "3").send().await;
        let status = r.map(|r| r.status().as_u16()).map_err(|e| e.to_string());
        assert_eq!(status, Ok(502), "request {i} got no answer behind a stalled stderr");
    }
    vq.sigterm();
    let exit = vq.exit_within(Duration::from_secs(30)).await;
    assert!(exit.is_some_and(|s| s.success()), "SIGTERM with stderr stalled: {exit:?}");
}

/// Runs `vq args` with stdout a pipe whose reader is already gone.
async fn with_closed_stdout(redis: &RedisServer, args: &[&str]) -> (Option<ExitStatus>, String) {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let dir = tempfile::tempdir().unwrap();
    let err_path = dir.path().join("stderr");
    let mut child = vq_command()
        .args(args)
        .env("VQ_REDIS__URL", redis.url())
        .stdout(writer)
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("spawn vq");
    let status = wait_exit(&mut child, Duration::from_secs(30)).await;
    let _ = child.kill();
    let _ = child.wait();
    (status, std::fs::read_to_string(&err_path).unwrap())
}

#[tokio::test]
async fn cli_output_into_a_closed_pipe_exits_quietly() {
    let redis = RedisServer::spawn();
    for args in [&["flag", "status"][..], &["stats", "--watch"], &["stats", "--watch", "--json"], &["stats"]] {
        let (status, stderr) = with_closed_stdout(&redis, args).await;
        assert!(status.is_some(), "vq {args:?} kept running with its stdout closed");
        assert_eq!(status.and_then(|s| s.code()), Some(0), "vq {args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "vq {args:?}: {stderr}");
    }
}

/// A command reporting an error into a closed stderr (a dead log collector) exits 1, not 101
/// with a panic.
#[tokio::test]
async fn cli_errors_into_a_closed_stderr_exit_one() {
    let mut redis = RedisServer::spawn();
    let url = redis.url();
    redis.kill();
    for args in [&["stats"][..], &["stats", "--watch"], &["flag", "status"], &["batch", "show"]] {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let mut child = vq_command()
            .args(args)
            .env("VQ_REDIS__URL", &url)
            .stdout(std::process::Stdio::null())
            .stderr(writer)
            .spawn()
            .expect("spawn vq");
        let status = wait_exit(&mut child, Duration::from_secs(30)).await;
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(status.and_then(|s| s.code()), Some(1), "vq {args:?}");
    }
}
