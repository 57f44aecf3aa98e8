//! The HTTP/1.1 exchange of the simulation: a pool of keep-alive connections to one server,
//! each lent to one request at a time. The task that sends a request writes it and reads the
//! answer on the connection itself, so a request costs one write and one read (or more for a
//! long answer), with no channel to a connection task and no per-request timer.
//!
//! It speaks only what `vq serve` (or a load balancer in front of it) answers: a status
//! line, headers, a body framed by `content-length`, `transfer-encoding: chunked` or the end
//! of the connection. It does not do TLS, HTTP/2, redirects or proxies. The answer's head and
//! chunk sizes are parsed by `httparse` (hyper's parser); the rest is this file.
//!
//! Why not hyper's or reqwest's client (reqwest is built on it): loadgen shares the machine
//! with the server it loads, so whatever CPU it spends per request is taken from the server's
//! figures. hyper-util's pooled client costs a pool lock, a hash, a channel hop to a connection
//! task and a timer per request; side by side in the 100k-user sale (`scripts/bench.sh sale`,
//! 2026-12-04) loadgen took a median 28.5 µs of CPU per request with it and 19.5 µs with this
//! pool, and vq answered 12.3k enters/s of the 20k offered instead of 19.4k.
//! docs/benchmarks.md has the runs and this parser's own before/after.

use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::{Instant, Sleep};

/// An answer larger than this is refused (vq's answers are a few hundred bytes).
const MAX_ANSWER: usize = 1 << 20;

/// How one request went.
pub(super) enum Exchange {
    /// Status and body.
    Answered(u16, Vec<u8>),
    /// No HTTP answer: refused, reset, closed, malformed, or none within the timeout.
    Failed,
}

/// Keep-alive connections to one server, at most `concurrency` of them in use at once.
pub(super) struct Pool {
    /// `host:port` to connect to, also sent as the `host` header.
    authority: String,
    timeout: Duration,
    /// One permit per request in flight: the `--concurrency` bound.
    permits: Semaphore,
    /// Connections not lent out; a request takes one (or opens one) and gives it back
    /// when the server kept it open. Held only to push or pop.
    idle: Mutex<Vec<Conn>>,
}

/// One open connection with its read buffer and its request timer.
struct Conn {
    stream: TcpStream,
    /// Bytes read from the stream; `buf[..filled]` are valid.
    buf: Vec<u8>,
    filled: usize,
    /// The request head being written.
    head: Vec<u8>,
    /// Reset for each request: moving an armed deadline later costs no timer-wheel insert.
    timer: Pin<Box<Sleep>>,
    /// Whether a request was already answered on this connection (a server may have
    /// closed it while it was idle).
    reused: bool,
}

/// How the body of an answer ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

/// A parsed answer head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Head {
    status: u16,
    /// Length of the head, blank line included.
    len: usize,
    framing: Framing,
    close: bool,
}

impl Pool {
    /// `authority` is `host:port` (the scheme is always http).
    pub(super) fn new(authority: String, concurrency: usize, timeout: Duration) -> Self {
        Self { authority, timeout, permits: Semaphore::new(concurrency.max(1)), idle: Mutex::new(Vec::new()) }
    }

    /// Waits for one of the `concurrency` slots; a request is sent while its slot is held.
    pub(super) async fn slot(&self) -> Option<SemaphorePermit<'_>> {
        self.permits.acquire().await.ok()
    }

    /// Whether every slot is taken (a request now would wait).
    pub(super) fn all_busy(&self) -> bool {
        self.permits.available_permits() == 0
    }

    /// Sends `method path` with the given headers and reads the answer, within the timeout
    /// (connecting included). The caller holds a [`Pool::slot`].
    pub(super) async fn request(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Exchange {
        let deadline = Instant::now() + self.timeout;
        let pooled = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        let retry_on_fresh = pooled.is_some();
        let mut conn = match pooled {
            Some(c) => c,
            None => match self.connect(deadline).await {
                Some(c) => c,
                None => return Exchange::Failed,
            },
        };
        let mut outcome = conn.exchange(&self.authority, method, path, headers, deadline).await;
        // A kept-alive connection the server closed while it sat idle gives no answer at all:
        // the request goes once more on a new connection, as HTTP clients do.
        if retry_on_fresh && matches!(outcome, Outcome::ClosedBeforeAnswer) {
            conn = match self.connect(deadline).await {
                Some(c) => c,
                None => return Exchange::Failed,
            };
            outcome = conn.exchange(&self.authority, method, path, headers, deadline).await;
        }
        match outcome {
            Outcome::Answered { status, body, keep } => {
                if keep && let Ok(mut idle) = self.idle.lock() {
                    conn.reused = true;
                    idle.push(conn);
                }
                Exchange::Answered(status, body)
            }
            Outcome::ClosedBeforeAnswer | Outcome::Failed => Exchange::Failed,
        }
    }

    async fn connect(&self, deadline: Instant) -> Option<Conn> {
        let mut timer = Box::pin(tokio::time::sleep_until(deadline));
        let stream = tokio::select! {
            s = TcpStream::connect(self.authority.as_str()) => s.ok()?,
            () = timer.as_mut() => return None,
        };
        stream.set_nodelay(true).ok()?;
        Some(Conn { stream, buf: vec![0; 4096], filled: 0, head: Vec::with_capacity(256), timer, reused: false })
    }
}

enum Outcome {
    Answered {
        status: u16,
        body: Vec<u8>,
        keep: bool,
    },
    /// The connection ended before any byte of an answer came.
    ClosedBeforeAnswer,
    Failed,
}

impl Conn {
    async fn exchange(
        &mut self,
        authority: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        deadline: Instant,
    ) -> Outcome {
        self.head.clear();
        for part in [method, " ", path, " HTTP/1.1\r\nhost: ", authority, "\r\n"] {
            self.head.extend_from_slice(part.as_bytes());
        }
        for (name, value) in headers {
            for part in [name, ": ", value, "\r\n"] {
                self.head.extend_from_slice(part.as_bytes());
            }
        }
        if method != "GET" {
            self.head.extend_from_slice(b"content-length: 0\r\n");
        }
        self.head.extend_from_slice(b"\r\n");
        self.timer.as_mut().reset(deadline);
        let Conn { stream, buf, filled, head, timer, reused } = self;
        let reused = *reused;
        tokio::select! {
            o = round_trip(stream, head, buf, filled, reused) => o,
            () = timer.as_mut() => Outcome::Failed,
        }
    }
}

async fn round_trip(stream: &TcpStream, head: &[u8], buf: &mut Vec<u8>, filled: &mut usize, reused: bool) -> Outcome {
    let closed = |got: usize| if reused && got == 0 { Outcome::ClosedBeforeAnswer } else { Outcome::Failed };
    let mut written = 0;
    while written < head.len() {
        match stream.try_write(&head[written..]) {
            Ok(n) => written += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if stream.writable().await.is_err() {
                    return Outcome::Failed;
                }
            }
            Err(_) => return closed(0),
        }
    }
    *filled = 0;
    loop {
        if let Some(answer) = parse_answer(&buf[..*filled], false) {
            if matches!(answer, Outcome::Answered { keep: true, .. }) {
                // The server sends nothing more before the next request: forget the socket's
                // read readiness now, so the next answer's first read waits for the reactor
                // instead of being a read that finds nothing (a syscall less per request).
                // Only the readiness already seen is cleared, never a later one or a close.
                let _ = stream.try_io(Interest::READABLE, || Err::<(), _>(std::io::ErrorKind::WouldBlock.into()));
            }
            return answer;
        }
        if *filled == buf.len() {
            if buf.len() >= MAX_ANSWER {
                return Outcome::Failed;
            }
            buf.resize(buf.len() * 2, 0);
        }
        match stream.try_read(&mut buf[*filled..]) {
            Ok(0) => {
                return match parse_answer(&buf[..*filled], true) {
                    Some(answer) => answer,
                    None => closed(*filled),
                };
            }
            Ok(n) => *filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if stream.readable().await.is_err() {
                    return Outcome::Failed;
                }
            }
            Err(_) => return closed(*filled),
        }
    }
}

/// The complete answer in `bytes`, if it is complete (`eof`: the server closed the
/// connection after these bytes). A malformed answer is `Failed`.
fn parse_answer(bytes: &[u8], eof: bool) -> Option<Outcome> {
    let head = match parse_head(bytes) {
        Ok(Some(h)) => h,
        Ok(None) => return None,
        Err(()) => return Some(Outcome::Failed),
    };
    let rest = &bytes[head.len..];
    let (body, keep) = match head.framing {
        Framing::Length(n) => (rest.get(..n)?.to_vec(), !head.close),
        Framing::Chunked => match dechunk(rest) {
            Ok(Some(body)) => (body, !head.close),
            Ok(None) => return None,
            Err(()) => return Some(Outcome::Failed),
        },
        Framing::UntilClose if eof => (rest.to_vec(), false),
        Framing::UntilClose => return None,
    };
    Some(Outcome::Answered { status: head.status, body, keep })
}

/// Headers an answer may carry (vq sends about ten); more is a malformed answer.
const MAX_HEADERS: usize = 64;

/// The head of an answer: `Ok(None)` while incomplete, `Err` when it is not HTTP/1.x.
fn parse_head(bytes: &[u8]) -> Result<Option<Head>, ()> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut answer = httparse::Response::new(&mut headers);
    let len = match answer.parse(bytes).map_err(|_| ())? {
        httparse::Status::Complete(len) => len,
        httparse::Status::Partial if bytes.len() > 64 * 1024 => return Err(()),
        httparse::Status::Partial => return Ok(None),
    };
    let status = answer.code.ok_or(())?;
    let mut length = None;
    let mut chunked = false;
    let mut close = answer.version == Some(0);
    for h in answer.headers.iter() {
        let value = std::str::from_utf8(h.value).map_err(|_| ())?.trim();
        if h.name.eq_ignore_ascii_case("content-length") {
            length = Some(value.parse::<usize>().map_err(|_| ())?);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().ends_with("chunked");
        } else if h.name.eq_ignore_ascii_case("connection") {
            let v = value.to_ascii_lowercase();
            close = v.contains("close") || (close && !v.contains("keep-alive"));
        }
    }
    if (100..200).contains(&status) {
        // vq never sends 1xx; an interim answer would need reading past it.
        return Err(());
    }
    let framing = if status == 204 || status == 304 {
        Framing::Length(0)
    } else if chunked {
        Framing::Chunked
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        Framing::UntilClose
    };
    Ok(Some(Head { status, len, framing, close }))
}

/// A chunked body: `Ok(None)` while incomplete.
fn dechunk(mut bytes: &[u8]) -> Result<Option<Vec<u8>>, ()> {
    let mut body = Vec::new();
    loop {
        let (line, size) = match httparse::parse_chunk_size(bytes).map_err(|_| ())? {
            httparse::Status::Complete(c) => c,
            httparse::Status::Partial => return Ok(None),
        };
        let size = usize::try_from(size).map_err(|_| ())?;
        bytes = &bytes[line..];
        if size == 0 {
            // Trailers, then a blank line.
            let mut trailers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            return match httparse::parse_headers(bytes, &mut trailers).map_err(|_| ())? {
                httparse::Status::Complete(_) => Ok(Some(body)),
                httparse::Status::Partial => Ok(None),
            };
        }
        if bytes.len() < size.saturating_add(2) {
            return Ok(None);
        }
        if &bytes[size..size + 2] != b"\r\n" {
            return Err(());
        }
        body.extend_from_slice(&bytes[..size]);
        bytes = &bytes[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(bytes: &[u8], eof: bool) -> Option<(u16, Vec<u8>, bool)> {
        match parse_answer(bytes, eof)? {
            Outcome::Answered { status, body, keep } => Some((status, body, keep)),
            _ => Some((0, Vec::new(), false)),
        }
    }

    #[test]
    fn an_answer_with_a_length_is_complete_once_its_body_is_there() {
        let full = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\ncontent-length: 4\r\n\r\n{\"a\"";
        for cut in 0..full.len() {
            assert_eq!(answered(&full[..cut], false), None, "cut at {cut}");
        }
        assert_eq!(answered(full, false), Some((200, b"{\"a\"".to_vec(), true)));
    }

    #[test]
    fn a_chunked_answer_is_joined_and_a_close_is_honoured() {
        let full = b"HTTP/1.1 429 Too Many\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3;x=1\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        for cut in 0..full.len() {
            assert_eq!(answered(&full[..cut], false), None, "cut at {cut}");
        }
        assert_eq!(answered(full, false), Some((429, b"abcde".to_vec(), false)));
    }

    #[test]
    fn an_answer_without_framing_ends_with_the_connection() {
        let bytes = b"HTTP/1.0 503 Unavailable\r\n\r\nbusy";
        assert_eq!(answered(bytes, false), None);
        assert_eq!(answered(bytes, true), Some((503, b"busy".to_vec(), false)));
        assert_eq!(answered(b"HTTP/1.1 204 No Content\r\n\r\n", false), Some((204, Vec::new(), true)));
    }

    #[test]
    fn what_is_not_http_fails_instead_of_waiting() {
        assert!(matches!(parse_answer(b"SSH-2.0-OpenSSH\r\n\r\n", false), Some(Outcome::Failed)));
        assert!(matches!(parse_answer(b"HTTP/1.1 abc\r\n\r\n", false), Some(Outcome::Failed)));
        assert!(matches!(parse_answer(b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n", false), Some(Outcome::Failed)));
        assert!(matches!(
            parse_answer(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", false),
            Some(Outcome::Failed)
        ));
    }
}
