//! One client against everyone else: a client holding 1,000+ connections whose bodies never
//! arrive (from one address or fifty, or with heads that never end), or waiting on a slow
//! endpoint of the app behind vq, or hammering the queue API as one user, does not get other
//! buyers' polls shed — against one `vq serve`, and through the shipped nginx config with three
//! replicas, where a replica that sheds stays in the pool. A body that does not arrive in time
//! is answered 400 and frees its place.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::rig::{AUTH_LAYER, Nginx, STAND_IN_LOGIN, shipped};
use crate::support::{RedisServer, VqProcess, flag_on, free_port};

/// Connections of the flooding client: more than the default `http.max_in_flight`.
const FLOOD: usize = 1030;

/// Raises this process' open-file limit (which what it spawns inherits) to `n`.
fn raise_nofile(n: u64) {
    let soft = || {
        let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
        limits.lines().find(|l| l.starts_with("Max open files"))?.split_whitespace().nth(3)?.parse::<u64>().ok()
    };
    if soft().is_some_and(|s| s >= n) {
        return;
    }
    let pid = std::process::id().to_string();
    let _ = std::process::Command::new("prlimit").args(["--pid", &pid, &format!("--nofile={n}:")]).status();
    assert!(soft().is_some_and(|s| s >= n), "the open-file limit is below {n} and cannot be raised: ulimit -n {n}");
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The app behind vq: answers `delay` after a whole request arrived; `holding` counts the
/// requests whose head it has and that it has not answered.
struct Shop {
    url: String,
    holding: Arc<AtomicUsize>,
}

struct Holding(Arc<AtomicUsize>);

impl Drop for Holding {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn shop(delay: Duration) -> Shop {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let holding = Arc::new(AtomicUsize::new(0));
    let counter = holding.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(answer_once(s, counter.clone(), delay));
        }
    });
    Shop { url, holding }
}

async fn answer_once(mut s: TcpStream, holding: Arc<AtomicUsize>, delay: Duration) -> Option<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    };
    holding.fetch_add(1, Ordering::SeqCst);
    let _held = Holding(holding);
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let len: usize =
        head.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
    while buf.len() < head_end + len {
        let n = s.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    }
    tokio::time::sleep(delay).await;
    s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok").await.ok()
}

/// One client's flood: connections from `sources` in turn, each sending `request`, waiting
/// for the head of an answer or the close, pausing, and again (at most 30 times, until stopped).
struct Flood {
    /// Answers by status (`closed`: closed without one).
    answers: Arc<Mutex<BTreeMap<String, u64>>>,
    /// A 503 answer carried `Retry-After`.
    retry_after: Arc<AtomicBool>,
    open: Arc<AtomicUsize>,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Flood {
    /// `request`'s `{i}` is replaced by the connection's number.
    fn start(to: SocketAddr, sources: &[Ipv4Addr], request: &str) -> Self {
        let flood = Self {
            answers: Arc::default(),
            retry_after: Arc::default(),
            open: Arc::default(),
            stop: CancellationToken::new(),
            tasks: Vec::new(),
        };
        let tasks = (0..FLOOD)
            .map(|i| {
                let (source, request) = (sources[i % sources.len()], request.replace("{i}", &i.to_string()));
                let (answers, retry_after, open, stop) =
                    (flood.answers.clone(), flood.retry_after.clone(), flood.open.clone(), flood.stop.clone());
                tokio::spawn(async move {
                    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
                    for _ in 0..30 {
                        let answer = tokio::select! {
                            () = stop.cancelled() => return,
                            a = tokio::time::timeout_at(deadline, send(to, source, request.as_bytes(), &open)) => a,
                        };
                        let Ok(answer) = answer else { return };
                        if answer.starts_with("HTTP/1.1 503") && answer.to_ascii_lowercase().contains("retry-after:") {
                            retry_after.store(true, Ordering::SeqCst);
                        }
                        let status = answer.get(9..12).unwrap_or("closed").to_owned();
                        *answers.lock().unwrap().entry(status).or_default() += 1;
                        tokio::select! {
                            () = stop.cancelled() => return,
                            () = tokio::time::sleep(Duration::from_secs(2)) => {}
                        }
                    }
                })
            })
            .collect();
        Self { tasks, ..flood }
    }

    async fn stop(self) -> BTreeMap<String, u64> {
        self.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        self.answers.lock().unwrap().clone()
    }
}

/// Sends `request` from `source`; returns what came back up to the end of the answer's head.
async fn send(to: SocketAddr, source: Ipv4Addr, request: &[u8], open: &AtomicUsize) -> String {
    let Ok(socket) = TcpSocket::new_v4() else { return String::new() };
    if socket.bind(SocketAddr::from((source, 0))).is_err() {
        return String::new();
    }
    let Ok(mut s) = socket.connect(to).await else { return String::new() };
    open.fetch_add(1, Ordering::SeqCst);
    let mut got = Vec::new();
    if s.write_all(request).await.is_ok() {
        let mut chunk = [0u8; 2048];
        while find(&got, b"\r\n\r\n").is_none() {
            match s.read(&mut chunk).await {
                Ok(n) if n > 0 => got.extend_from_slice(&chunk[..n]),
                _ => break,
            }
        }
    }
    open.fetch_sub(1, Ordering::SeqCst);
    String::from_utf8_lossy(&got).into_owned()
}

/// Waits (bounded) until `ready` holds.
async fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(Instant::now() < deadline, "{what}: not within 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Buyers `users` enter `limited-drop/1` at `base`, identified by `id_header`.
async fn enter_all(base: &str, id_header: &str, users: std::ops::Range<u64>) {
    let client = reqwest::Client::new();
    for u in users {
        let url = format!("{base}/virtual-queues/limited-drop/1/entries");
        let r = client.post(url).header(id_header, format!("buyer-{u}")).send().await.expect("enter");
        assert_eq!(r.status(), 200, "buyer {u} entered");
    }
}

/// Each buyer polls five times, 200 ms apart; the answers by status (0: no answer).
async fn poll_all(base: &str, id_header: &str, users: std::ops::Range<u64>) -> BTreeMap<u16, u64> {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let tasks: Vec<_> = users
        .map(|u| {
            let (client, url, id_header) =
                (client.clone(), format!("{base}/virtual-queues/limited-drop/1/entries/me"), id_header.to_owned());
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for _ in 0..5 {
                    let r = client.get(&url).header(&id_header, format!("buyer-{u}")).send().await;
                    statuses.push(r.map_or(0, |r| r.status().as_u16()));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                statuses
            })
        })
        .collect();
    let mut out = BTreeMap::new();
    for t in tasks {
        for s in t.await.unwrap() {
            *out.entry(s).or_default() += 1;
        }
    }
    out
}

fn share_ok(polls: &BTreeMap<u16, u64>) -> f64 {
    let all: u64 = polls.values().sum();
    polls.get(&200).copied().unwrap_or(0) as f64 / all.max(1) as f64
}

fn addr_of(url: &str) -> SocketAddr {
    url.trim_start_matches("http://").parse().unwrap()
}

/// A request to a path that is not gated, announcing 100 bytes of body and sending one.
const SLOW_BODY: &str = "POST /shop/cart HTTP/1.1\r\nHost: shop\r\nContent-Length: 100\r\n\r\nX";
/// The same, from another user on each connection.
const SLOW_BODY_USERS: &str =
    "POST /shop/cart HTTP/1.1\r\nHost: shop\r\nX-User-Id: bot-{i}\r\nContent-Length: 100\r\n\r\nX";
/// A request head that never ends.
const SLOW_HEAD: &str = "POST /shop/cart HTTP/1.1\r\nHost: shop\r\nContent-Length: 100\r\n";

#[tokio::test]
async fn a_thousand_slow_requests_of_one_client_shed_no_buyer() {
    raise_nofile(8192);
    let redis = RedisServer::spawn();
    let shop = shop(Duration::ZERO).await;
    let envs = [
        ("VQ_GATE__UPSTREAM", shop.url.clone()),
        ("VQ_HTTP__MAX_IN_FLIGHT", "512".to_owned()),
        ("VQ_HTTP__MAX_FORWARDED_IN_FLIGHT", "512".to_owned()),
        ("VQ_HTTP__BODY_READ_TIMEOUT_MS", "3000".to_owned()),
        ("VQ_HTTP__HEADER_READ_TIMEOUT_MS", "3000".to_owned()),
        ("VQ_FLAG__REFRESH_MS", "100".to_owned()),
    ];
    let vq = VqProcess::serve(&redis, &envs).await;
    flag_on(&redis).await;
    enter_all(&vq.addr, "X-User-Id", 0..40).await;
    let one = [Ipv4Addr::LOCALHOST];
    let fifty: Vec<Ipv4Addr> = (2..52).map(|i| Ipv4Addr::new(127, 0, 0, i)).collect();
    // One address and one user per connection: no client holds more than a buyer.
    let each: Vec<Ipv4Addr> = (0..FLOOD).map(|i| Ipv4Addr::new(127, 1, (i / 250) as u8, (i % 250 + 1) as u8)).collect();
    let variations: [(&str, &[Ipv4Addr], &str); 4] = [
        ("slow bodies, one address", &one, SLOW_BODY),
        ("slow bodies, 50 addresses", &fifty, SLOW_BODY),
        ("slow bodies, an address and a user per connection", &each, SLOW_BODY_USERS),
        ("slow heads", &one, SLOW_HEAD),
    ];
    for (what, sources, request) in variations {
        let flood = Flood::start(addr_of(&vq.addr), sources, request);
        if request != SLOW_HEAD {
            // The flood holds as many places as the instance gives it.
            wait_for(what, || shop.holding.load(Ordering::SeqCst) >= 500).await;
        } else {
            wait_for(what, || flood.open.load(Ordering::SeqCst) >= FLOOD - 10).await;
        }
        let polls = poll_all(&vq.addr, "X-User-Id", 0..40).await;
        let held = shop.holding.load(Ordering::SeqCst);
        let answers = flood.stop().await;
        let context = format!("{what}: buyers' polls {polls:?}, the flood's answers {answers:?}, shop holding {held}");
        eprintln!("{context}");
        assert!(share_ok(&polls) >= 0.95, "{context}");
        wait_for("the flood's requests ended", || shop.holding.load(Ordering::SeqCst) == 0).await;
    }
}

/// One user polling on 96 connections at once against a budget of 24, beside 20 other users
/// polling: their polls take that user's places, not the other way round.
#[tokio::test]
async fn one_users_heavy_queue_traffic_does_not_shed_other_users() {
    let redis = RedisServer::spawn();
    let envs = [("VQ_HTTP__MAX_IN_FLIGHT", "24".to_owned()), ("VQ_FLAG__REFRESH_MS", "100".to_owned())];
    let vq = VqProcess::serve(&redis, &envs).await;
    flag_on(&redis).await;
    enter_all(&vq.addr, "X-User-Id", 0..20).await;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let r = client.post(format!("{}/virtual-queues/limited-drop/1/entries", vq.addr)).header("X-User-Id", "heavy");
    assert_eq!(r.send().await.unwrap().status(), 200);
    let stop = CancellationToken::new();
    let heavy: Arc<Mutex<BTreeMap<u16, u64>>> = Arc::default();
    let done = Arc::new(AtomicUsize::new(0));
    let url = format!("{}/virtual-queues/limited-drop/1/entries/me", vq.addr);
    let tasks: Vec<_> = (0..96)
        .map(|_| {
            let (client, url, stop, heavy, done) =
                (client.clone(), url.clone(), stop.clone(), heavy.clone(), done.clone());
            tokio::spawn(async move {
                for _ in 0..2000 {
                    let r = tokio::select! {
                        () = stop.cancelled() => return,
                        r = client.get(&url).header("X-User-Id", "heavy").send() => r,
                    };
                    *heavy.lock().unwrap().entry(r.map_or(0, |r| r.status().as_u16())).or_default() += 1;
                    done.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    wait_for("the heavy user's polls", || done.load(Ordering::SeqCst) >= 500).await;
    let polls = poll_all(&vq.addr, "X-User-Id", 0..20).await;
    stop.cancel();
    for t in tasks {
        let _ = t.await;
    }
    let heavy = heavy.lock().unwrap().clone();
    let context = format!("other users' polls {polls:?}, the heavy user's {heavy:?}");
    eprintln!("{context}");
    assert!(heavy.get(&503).is_some_and(|n| *n > 0), "the budget was full: the heavy user was shed: {context}");
    assert!(share_ok(&polls) >= 0.95, "{context}");
}

/// With a forwarding budget of one, a body that stops arriving is answered 400 once
/// `http.body_read_timeout_ms` has passed, and the place it held is free again.
#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_is_refused_and_frees_its_place() {
    let redis = RedisServer::spawn();
    let shop = shop(Duration::ZERO).await;
    let envs = [
        ("VQ_GATE__UPSTREAM", shop.url.clone()),
        ("VQ_HTTP__MAX_FORWARDED_IN_FLIGHT", "1".to_owned()),
        ("VQ_HTTP__BODY_READ_TIMEOUT_MS", "1000".to_owned()),
        ("VQ_GATE__TIMEOUT_MS", "60000".to_owned()),
        ("VQ_HTTP__HEADER_READ_TIMEOUT_MS", "60000".to_owned()),
    ];
    let vq = VqProcess::serve(&redis, &envs).await;
    let to = addr_of(&vq.addr);
    let mut slow = TcpStream::connect(to).await.unwrap();
    slow.write_all(SLOW_BODY.as_bytes()).await.unwrap();
    wait_for("the slow request reached the shop", || shop.holding.load(Ordering::SeqCst) == 1).await;
    let complete = b"POST /shop/cart HTTP/1.1\r\nHost: shop\r\nContent-Length: 1\r\nConnection: close\r\n\r\nX";
    let open = AtomicUsize::new(0);
    let busy = send(to, Ipv4Addr::LOCALHOST, complete, &open).await;
    assert!(busy.starts_with("HTTP/1.1 503"), "the one place is held: {busy}");

    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), slow.read_to_end(&mut got)).await;
    let text = String::from_utf8_lossy(&got);
    assert!(read.is_ok(), "no answer within 20 s to a body that stopped: {text}");
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains("INVALID_REQUEST") && text.contains("http.body_read_timeout_ms"), "{text}");
    let after = send(to, Ipv4Addr::LOCALHOST, complete, &open).await;
    assert!(after.starts_with("HTTP/1.1 200"), "the place is free again: {after}");
}

/// `deploy/nginx/vq.conf` in front of three replicas and a shop endpoint that never answers in
/// time: one client's 1,030 requests to it are shed (503 with `Retry-After`), while every
/// replica stays in the pool and the buyers' polls are answered.
#[tokio::test]
async fn through_nginx_a_flood_on_a_slow_endpoint_sheds_no_buyer_and_no_replica() {
    raise_nofile(8192);
    let redis = RedisServer::spawn();
    let shop = shop(Duration::from_secs(60)).await;
    let envs = [
        ("VQ_GATE__UPSTREAM", shop.url.clone()),
        ("VQ_HTTP__MAX_IN_FLIGHT", "128".to_owned()),
        ("VQ_HTTP__MAX_FORWARDED_IN_FLIGHT", "128".to_owned()),
        ("VQ_FLAG__REFRESH_MS", "100".to_owned()),
    ];
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(VqProcess::serve(&redis, &envs).await);
    }
    flag_on(&redis).await;
    let port = free_port();
    let mut site = shipped("vq.conf")
        .replace(AUTH_LAYER, STAND_IN_LOGIN)
        .replace("listen 80;", &format!("listen 127.0.0.1:{port};"));
    for (i, r) in replicas.iter().enumerate() {
        site = site.replace(&format!("vq{}:8080", i + 1), r.addr.trim_start_matches("http://"));
    }
    let nginx = Nginx::start_sized(site, port, 4096).await;
    let base = format!("http://{}", nginx.addr());
    enter_all(&base, "X-Authenticated-User", 0..40).await;

    // Each of the flood's requests from another (logged-in) user: nobody holds more than a buyer.
    let request = "GET /limited-drops/1 HTTP/1.1\r\nHost: shop\r\nX-Authenticated-User: bot-{i}\r\n\r\n";
    let flood = Flood::start(addr_of(&base), &[Ipv4Addr::LOCALHOST], request);
    wait_for("the flood holds the replicas' forwarding places", || shop.holding.load(Ordering::SeqCst) >= 380).await;
    let polls = poll_all(&base, "X-Authenticated-User", 0..40).await;
    let retry_after = flood.retry_after.load(Ordering::SeqCst);
    let answers = flood.stop().await;
    let log = nginx.error_log();
    let down = log.matches("no live upstreams").count();
    let other: Vec<&str> = log.lines().filter(|l| !l.contains("no live upstreams")).take(5).collect();
    let context = format!(
        "buyers' polls {polls:?}, the flood's answers {answers:?}, {down} × no live upstreams, else {other:#?}"
    );
    eprintln!("{context}");
    assert!(share_ok(&polls) >= 0.95, "{context}");
    assert_eq!(down, 0, "{context}");
    assert!(
        answers.get("503").is_some_and(|n| *n > 0) && retry_after,
        "the flood was shed with Retry-After: {context}"
    );
}
