//! `vq loadgen`: a flash sale, simulated the way the mobile app behaves, against a running
//! `vq serve`.
//!
//! Users arrive along an [`ArrivalCurve`]; each polls every 2–3 s with jitter until admitted,
//! a share abandons (stops polling), and admitted users may call the gated purchase route
//! with their token. Latencies count from the *scheduled* send time, so a server (or this
//! generator) that falls behind shows up in the figures instead of hiding (no coordinated
//! omission). The optional [`Sink`] measures what reaches the downstream.
//!
//! This module does not print: it fills [`Live`] counters while running and returns a
//! [`Report`]; `cli/loadgen.rs` renders both.

mod arrival;
mod report;
mod sink;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use self::arrival::{ArrivalCurve, Arrivals};
pub use self::report::{Bounds, EtaError, FailedBound, LatencySummary, Report, WaitSummary, check_bounds};
pub use self::sink::{Sink, SinkFigures};
use crate::domain::{QueueTarget, QueueTargetType};
use crate::store::{QueueStore, RedisStore};

/// A request that has not answered after this long counts as a transport error (its
/// latency is still recorded).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Status codes are counted in a flat array; anything above is a transport error.
const MAX_STATUS: usize = 600;

/// What to simulate.
#[derive(Debug, Clone)]
pub struct Options {
    /// Base URL of `vq serve` (or the load balancer), without a trailing slash.
    pub url: String,
    pub target: QueueTarget,
    pub users: u64,
    /// User ids are `first_user .. first_user + users`.
    pub first_user: u64,
    pub arrivals: Arrivals,
    /// Length of the whole run: arrivals and polling stop at its end.
    pub duration: Duration,
    /// Each user polls again a uniformly drawn interval in `[min, max]` after an answer.
    pub poll_min: Duration,
    pub poll_max: Duration,
    /// Share of users (0–1) that stop polling after a few polls.
    pub abandon: f64,
    /// Admitted users call the gated purchase route with their token.
    pub purchase: bool,
    /// Requests in flight at most (the connection pool grows to this).
    pub concurrency: usize,
    /// Users still in the queue at the end (waiting or abandoned) leave it (DELETE), so the
    /// next round starts empty.
    pub leave_at_end: bool,
    /// The batch size and tick of the loaded server (from its stats answer, else the local
    /// config), reported and used for ETA checks.
    pub batch_size: u64,
    pub tick_ms: u64,
    pub seed: u64,
    /// Poll when the server says (`pollAfterSeconds`), as the waiting page does, instead of
    /// every `[poll_min, poll_max]` whatever it says.
    pub follow_poll_after: bool,
}

impl Options {
    fn purchase_path(&self) -> String {
        match self.target.kind {
            QueueTargetType::LimitedDrop => format!("/limited-drops/{}/orders", self.target.id),
            QueueTargetType::TicketingEvent => format!("/events/{}/seats/select", self.target.id),
        }
    }
}

/// Counters the live view reads while the run goes on.
pub struct Live {
    pub entered: AtomicU64,
    pub waiting: AtomicI64,
    pub admitted: AtomicU64,
    pub purchased: AtomicU64,
    pub enters_sent: AtomicU64,
    pub polls_sent: AtomicU64,
    /// Poll latencies since the last [`Live::take_recent_poll_p95_ms`].
    recent_poll: Mutex<Histogram<u64>>,
}

impl Default for Live {
    fn default() -> Self {
        Self {
            entered: AtomicU64::new(0),
            waiting: AtomicI64::new(0),
            admitted: AtomicU64::new(0),
            purchased: AtomicU64::new(0),
            enters_sent: AtomicU64::new(0),
            polls_sent: AtomicU64::new(0),
            recent_poll: Mutex::new(micros_histogram()),
        }
    }
}

impl Live {
    /// p95 of the polls answered since the previous call, in ms, and resets the window.
    pub fn take_recent_poll_p95_ms(&self) -> Option<f64> {
        let mut h = self.recent_poll.lock().ok()?;
        let p95 = (!h.is_empty()).then(|| h.value_at_quantile(0.95) as f64 / 1000.0);
        h.reset();
        p95
    }

    fn reset(&self) {
        for c in [&self.entered, &self.admitted, &self.purchased, &self.enters_sent, &self.polls_sent] {
            c.store(0, Ordering::Relaxed);
        }
        self.waiting.store(0, Ordering::Relaxed);
    }
}

fn micros_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("static histogram bounds are valid")
}

use crate::clock::now_epoch_ms as epoch_ms;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Enter = 0,
    Poll = 1,
    Purchase = 2,
    Leave = 3,
}

const KINDS: [(Kind, &str); 4] =
    [(Kind::Enter, "enter"), (Kind::Poll, "poll"), (Kind::Purchase, "purchase"), (Kind::Leave, "leave")];

/// Counters of one kind of request.
struct KindStats {
    latency_us: Mutex<Histogram<u64>>,
    statuses: Vec<AtomicU64>,
    transport_errors: AtomicU64,
}

impl KindStats {
    fn new() -> Self {
        Self {
            latency_us: Mutex::new(micros_histogram()),
            statuses: (0..MAX_STATUS).map(|_| AtomicU64::new(0)).collect(),
            transport_errors: AtomicU64::new(0),
        }
    }

    fn counts(&self) -> BTreeMap<String, u64> {
        let mut m: BTreeMap<String, u64> = self
            .statuses
            .iter()
            .enumerate()
            .filter_map(|(code, n)| {
                let n = n.load(Ordering::Relaxed);
                (n > 0).then(|| (code.to_string(), n))
            })
            .collect();
        let t = self.transport_errors.load(Ordering::Relaxed);
        if t > 0 {
            m.insert("transportError".into(), t);
        }
        m
    }
}

/// Everything measured during one run, shared by the user tasks.
struct Recorder {
    kinds: [KindStats; 4],
    /// How late enters left against their schedule, µs.
    enter_lag_us: Mutex<Histogram<u64>>,
    /// µs since the run's start; u64::MAX / 0 until set.
    first_enter_sent: AtomicU64,
    last_enter_sent: AtomicU64,
    last_enter_answered: AtomicU64,
    enters_answered: AtomicU64,
    waits_ms: Mutex<Histogram<u64>>,
    eta_errors_ms: Mutex<Vec<i64>>,
    queue_full: AtomicU64,
    direct_admitted: AtomicU64,
    abandoned: AtomicU64,
    evicted_seen: AtomicU64,
    still_waiting: AtomicU64,
    purchase_attempts: AtomicU64,
}

impl Recorder {
    fn new() -> Self {
        Self {
            kinds: [KindStats::new(), KindStats::new(), KindStats::new(), KindStats::new()],
            enter_lag_us: Mutex::new(micros_histogram()),
            first_enter_sent: AtomicU64::new(u64::MAX),
            last_enter_sent: AtomicU64::new(0),
            last_enter_answered: AtomicU64::new(0),
            enters_answered: AtomicU64::new(0),
            waits_ms: Mutex::new(Histogram::new_with_bounds(1, 24 * 3_600_000, 3).expect("valid bounds")),
            eta_errors_ms: Mutex::new(Vec::new()),
            queue_full: AtomicU64::new(0),
            direct_admitted: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            evicted_seen: AtomicU64::new(0),
            still_waiting: AtomicU64::new(0),
            purchase_attempts: AtomicU64::new(0),
        }
    }
}

enum Answer {
    Http(u16, Bytes),
    Failed,
}

/// The fields of the queue API's answer the simulation needs.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusReply {
    status: String,
    #[serde(default)]
    eta_seconds: Option<u64>,
    #[serde(default)]
    entry_token: Option<String>,
    #[serde(default)]
    poll_after_seconds: Option<u64>,
}

fn parse_reply(body: &[u8]) -> Option<StatusReply> {
    serde_json::from_slice(body).ok()
}

/// splitmix64: per-user jitter and choices, reproducible from the seed, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        lo + hi.saturating_sub(lo).mul_f64(self.unit())
    }
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

struct Ctx {
    opts: Options,
    client: HttpClient,
    permits: Semaphore,
    start: Instant,
    deadline: Instant,
    enter_uri: String,
    me_uri: String,
    purchase_uri: String,
    rec: Recorder,
    live: Arc<Live>,
}

impl Ctx {
    fn since_start_us(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.start).as_micros() as u64
    }

    /// Sends one request no earlier than `scheduled` and records it, latency counted from
    /// `scheduled` (waiting for a free slot is part of it).
    async fn send(
        &self,
        kind: Kind,
        method: Method,
        uri: &str,
        user: u64,
        token: Option<&str>,
        scheduled: Instant,
    ) -> Answer {
        let stats = &self.rec.kinds[kind as usize];
        let mut builder = Request::builder().method(method).uri(uri).header("x-user-id", user);
        if let Some(t) = token {
            builder = builder.header("x-entry-token", t);
        }
        let Ok(req) = builder.body(Full::new(Bytes::new())) else {
            stats.transport_errors.fetch_add(1, Ordering::Relaxed);
            return Answer::Failed;
        };
        let _permit = self.permits.acquire().await.ok();
        let sent = Instant::now();
        match kind {
            Kind::Enter => {
                self.live.enters_sent.fetch_add(1, Ordering::Relaxed);
                let at = self.since_start_us(sent);
                self.rec.first_enter_sent.fetch_min(at, Ordering::Relaxed);
                self.rec.last_enter_sent.fetch_max(at, Ordering::Relaxed);
                if let Ok(mut h) = self.rec.enter_lag_us.lock() {
                    h.saturating_record(sent.saturating_duration_since(scheduled).as_micros() as u64);
                }
            }
            Kind::Poll => {
                self.live.polls_sent.fetch_add(1, Ordering::Relaxed);
            }
            Kind::Purchase | Kind::Leave => {}
        }
        let exchange = Box::pin(async {
            let resp = self.client.request(req).await.ok()?;
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.ok()?.to_bytes();
            Some((status, body))
        });
        let result = tokio::time::timeout(REQUEST_TIMEOUT, exchange).await.ok().flatten();
        let done = Instant::now();
        let latency_us = done.saturating_duration_since(scheduled).as_micros() as u64;
        if let Ok(mut h) = stats.latency_us.lock() {
            h.saturating_record(latency_us);
        }
        if kind == Kind::Poll
            && let Ok(mut h) = self.live.recent_poll.lock()
        {
            h.saturating_record(latency_us);
        }
        if kind == Kind::Enter {
            self.rec.enters_answered.fetch_add(u64::from(result.is_some()), Ordering::Relaxed);
            self.rec.last_enter_answered.fetch_max(self.since_start_us(done), Ordering::Relaxed);
        }
        match result {
            Some((status, body)) if usize::from(status) < MAX_STATUS => {
                stats.statuses[usize::from(status)].fetch_add(1, Ordering::Relaxed);
                Answer::Http(status, body)
            }
            _ => {
                stats.transport_errors.fetch_add(1, Ordering::Relaxed);
                Answer::Failed
            }
        }
    }

    async fn purchase(&self, user: u64, token: Option<&str>) {
        if !self.opts.purchase {
            return;
        }
        self.rec.purchase_attempts.fetch_add(1, Ordering::Relaxed);
        let answer = self.send(Kind::Purchase, Method::POST, &self.purchase_uri, user, token, Instant::now()).await;
        if let Answer::Http(s, _) = answer
            && (200..300).contains(&s)
        {
            self.live.purchased.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// With `leave_at_end`, the user leaves the queue (DELETE) once the run is over.
    async fn leave_at_deadline(&self, user: u64) {
        if self.opts.leave_at_end {
            tokio::time::sleep_until(self.deadline).await;
            self.send(Kind::Leave, Method::DELETE, &self.me_uri, user, None, Instant::now()).await;
        }
    }

    fn record_admitted(&self, entered_at: Instant, eta_ms: Option<u64>) {
        self.live.admitted.fetch_add(1, Ordering::Relaxed);
        let wait_ms = Instant::now().saturating_duration_since(entered_at).as_millis() as u64;
        if let Ok(mut h) = self.rec.waits_ms.lock() {
            h.saturating_record(wait_ms.max(1));
        }
        if let Some(eta) = eta_ms
            && let Ok(mut e) = self.rec.eta_errors_ms.lock()
        {
            e.push(eta as i64 - wait_ms as i64);
        }
    }
}

/// One simulated buyer: enter, poll with jitter until admitted (or abandon, eviction, end of
/// run), then maybe purchase.
async fn simulate_user(ctx: Arc<Ctx>, idx: u64, scheduled: Instant) {
    let user = ctx.opts.first_user + idx;
    let mut rng = Rng(ctx.opts.seed ^ idx.wrapping_mul(0xD6E8_FEB8_6659_FD93));
    let abandon_after = (rng.unit() < ctx.opts.abandon).then(|| rng.next() % 3);
    let reply = match ctx.send(Kind::Enter, Method::POST, &ctx.enter_uri, user, None, scheduled).await {
        Answer::Http(200, body) => parse_reply(&body),
        Answer::Http(429, _) => {
            ctx.rec.queue_full.fetch_add(1, Ordering::Relaxed);
            return;
        }
        _ => return,
    };
    let Some(reply) = reply else { return };
    ctx.live.entered.fetch_add(1, Ordering::Relaxed);
    let entered_at = Instant::now();
    match reply.status.as_str() {
        "DIRECT_ADMITTED" => {
            ctx.rec.direct_admitted.fetch_add(1, Ordering::Relaxed);
            ctx.purchase(user, reply.entry_token.as_deref()).await;
            return;
        }
        "ADMITTED" => {
            ctx.record_admitted(entered_at, None);
            ctx.purchase(user, reply.entry_token.as_deref()).await;
            return;
        }
        _ => {}
    }
    let eta_ms = reply.eta_seconds.map(|s| s * 1000);
    let mut told = reply.poll_after_seconds;
    ctx.live.waiting.fetch_add(1, Ordering::Relaxed);
    let stop_waiting = || ctx.live.waiting.fetch_sub(1, Ordering::Relaxed);
    let mut last = entered_at;
    let mut polls = 0u64;
    loop {
        if abandon_after.is_some_and(|n| polls >= n) {
            ctx.rec.abandoned.fetch_add(1, Ordering::Relaxed);
            stop_waiting();
            // Still in the queue until evicted: a sweep's next round must not inherit them.
            ctx.leave_at_deadline(user).await;
            return;
        }
        let next = match told.filter(|_| ctx.opts.follow_poll_after) {
            // The server's interval, spread over a quarter of a second as browsers would be.
            Some(s) => last + Duration::from_secs(s) + rng.between(Duration::ZERO, Duration::from_millis(250)),
            None => last + rng.between(ctx.opts.poll_min, ctx.opts.poll_max),
        };
        if next >= ctx.deadline {
            ctx.rec.still_waiting.fetch_add(1, Ordering::Relaxed);
            stop_waiting();
            ctx.leave_at_deadline(user).await;
            return;
        }
        tokio::time::sleep_until(next).await;
        let answer = ctx.send(Kind::Poll, Method::GET, &ctx.me_uri, user, None, next).await;
        polls += 1;
        last = Instant::now();
        match answer {
            Answer::Http(200, body) => match parse_reply(&body) {
                Some(r) if r.status == "ADMITTED" => {
                    stop_waiting();
                    ctx.record_admitted(entered_at, eta_ms);
                    ctx.purchase(user, r.entry_token.as_deref()).await;
                    return;
                }
                Some(r) if r.status == "DIRECT_ADMITTED" => {
                    stop_waiting();
                    ctx.rec.direct_admitted.fetch_add(1, Ordering::Relaxed);
                    ctx.purchase(user, r.entry_token.as_deref()).await;
                    return;
                }
                Some(r) => told = r.poll_after_seconds,
                None => {}
            },
            Answer::Http(404, _) => {
                ctx.rec.evicted_seen.fetch_add(1, Ordering::Relaxed);
                stop_waiting();
                return;
            }
            // Like the app: an error or timeout is retried at the next poll.
            _ => {}
        }
    }
}

/// Samples Redis while the run goes on: growth of `used_memory` per waiting user at the
/// moment most users wait.
async fn sample_redis(store: RedisStore, target: QueueTarget, cancel: CancellationToken) -> Option<f64> {
    let base_mem = store.used_memory_bytes().await.ok()?;
    let base_waiting = store.snapshot(target).await.ok()?.waiting;
    let mut best: Option<(u64, f64)> = None;
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        let (Ok(mem), Ok(snap)) = (store.used_memory_bytes().await, store.snapshot(target).await) else { continue };
        let added = snap.waiting.saturating_sub(base_waiting);
        if added >= 100 && best.is_none_or(|(w, _)| added > w) {
            best = Some((added, mem.saturating_sub(base_mem) as f64 / added as f64));
        }
    }
    best.map(|(_, b)| b)
}

/// What the loaded server says about the target before the run: the batch size and tick it
/// admits with decide the ETA check and the downstream bound, and only the server knows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerFacts {
    pub batch_size: u64,
    pub tick_ms: u64,
}

/// Asks `GET …/stats` of `target` at `url`. `Err` when no HTTP answer comes within 5 s (a
/// wrong URL, a dead server); `Ok(None)` when the server answers without its figures (e.g.
/// 503 while its Redis is down).
pub async fn probe(url: &str, target: QueueTarget) -> Result<Option<ServerFacts>, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Figures {
        batch_size: u64,
        tick_ms: u64,
    }
    let uri = format!("{}/virtual-queues/{}/{}/stats", url.trim_end_matches('/'), target.kind.slug(), target.id);
    let req = Request::get(&uri).body(Full::new(Bytes::new())).map_err(|e| format!("{uri}: {e}"))?;
    let exchange = async {
        let resp = build_client(1).request(req).await.map_err(|e| format!("no HTTP answer from {uri}: {e}"))?;
        let ok = resp.status().is_success();
        let body = resp.into_body().collect().await.map_err(|e| format!("{uri}: {e}"))?.to_bytes();
        Ok::<_, String>(ok.then(|| serde_json::from_slice::<Figures>(&body).ok()).flatten())
    };
    let figures = tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .map_err(|_| format!("no HTTP answer from {uri} within 5 s"))??;
    Ok(figures.map(|f| ServerFacts { batch_size: f.batch_size, tick_ms: f.tick_ms }))
}

/// The batch size in force for `target`: its runtime value, else the global one, else config.
pub async fn batch_in_force(store: &RedisStore, target: QueueTarget, configured: u64) -> Option<u64> {
    let snap = store.snapshot(target).await.ok()?;
    let global = store.global_batch_size().await.ok()?;
    Some(crate::domain::batch_in_force(snap.batch_override, global, configured))
}

fn build_client(concurrency: usize) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_keepalive(Some(Duration::from_secs(30)));
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(concurrency)
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector)
}

/// Runs one simulation to its end and reports. `redis`, when given, is used for the batch
/// size in force and the memory figure; `sink` for the downstream figures.
pub async fn run(opts: Options, live: Arc<Live>, redis: Option<RedisStore>, sink: Option<&Sink>) -> Report {
    live.reset();
    let base = opts.url.trim_end_matches('/').to_owned();
    let slug = opts.target.kind.slug();
    let id = opts.target.id;
    // The server's answer first (a sweep round changes the batch size); Redis, then the
    // options, only when the server cannot say.
    let batch_size = match (probe(&base, opts.target).await, &redis) {
        (Ok(Some(facts)), _) => facts.batch_size,
        (_, Some(r)) => batch_in_force(r, opts.target, opts.batch_size).await.unwrap_or(opts.batch_size),
        (_, None) => opts.batch_size,
    };
    let start = Instant::now() + Duration::from_millis(20);
    let ctx = Arc::new(Ctx {
        client: build_client(opts.concurrency),
        permits: Semaphore::new(opts.concurrency.max(1)),
        start,
        deadline: start + opts.duration,
        enter_uri: format!("{base}/virtual-queues/{slug}/{id}/entries"),
        me_uri: format!("{base}/virtual-queues/{slug}/{id}/entries/me"),
        purchase_uri: format!("{base}{}", opts.purchase_path()),
        rec: Recorder::new(),
        live,
        opts,
    });
    let wall_start = epoch_ms() + 20;

    let cancel = CancellationToken::new();
    let sampler = redis.map(|r| tokio::spawn(sample_redis(r, ctx.opts.target, cancel.clone())));

    let tracker = TaskTracker::new();
    let mut scheduled_users = 0u64;
    for i in 0..ctx.opts.users {
        let offset = ctx.opts.arrivals.offset(i);
        if offset >= ctx.opts.duration {
            break;
        }
        let at = start + offset;
        if at > Instant::now() {
            tokio::time::sleep_until(at).await;
        }
        tracker.spawn(simulate_user(ctx.clone(), i, at));
        scheduled_users += 1;
    }
    tracker.close();
    tracker.wait().await;
    let wall_end = epoch_ms();
    cancel.cancel();
    let redis_bytes = match sampler {
        Some(h) => h.await.ok().flatten(),
        None => None,
    };
    let elapsed = Instant::now().saturating_duration_since(start);
    let sink = sink.map(|s| s.figures(wall_start, wall_end));
    build_report(&ctx, scheduled_users, batch_size, redis_bytes, sink, elapsed)
}

fn build_report(
    ctx: &Ctx,
    scheduled_users: u64,
    batch_size: u64,
    redis_bytes: Option<f64>,
    sink: Option<SinkFigures>,
    elapsed: Duration,
) -> Report {
    let o = &ctx.opts;
    let r = &ctx.rec;
    let latency =
        |k: Kind| r.kinds[k as usize].latency_us.lock().map(|h| LatencySummary::from_micros(&h)).unwrap_or_default();
    let mut status_counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_kind = BTreeMap::new();
    for (k, name) in KINDS {
        let counts = r.kinds[k as usize].counts();
        for (code, n) in &counts {
            *status_counts.entry(code.clone()).or_default() += n;
        }
        if !counts.is_empty() {
            by_kind.insert(name.to_owned(), counts);
        }
    }
    let enters_sent = ctx.live.enters_sent.load(Ordering::Relaxed);
    let first = r.first_enter_sent.load(Ordering::Relaxed);
    let last = r.last_enter_sent.load(Ordering::Relaxed);
    let offered =
        if enters_sent > 1 && last > first { (enters_sent - 1) as f64 / ((last - first) as f64 / 1e6) } else { 0.0 };
    let answered = r.enters_answered.load(Ordering::Relaxed);
    let last_answer = r.last_enter_answered.load(Ordering::Relaxed);
    let achieved =
        if answered > 1 && last_answer > first { answered as f64 / ((last_answer - first) as f64 / 1e6) } else { 0.0 };
    let scheduled_rate = o.arrivals.scheduled_rate(scheduled_users);
    let lag_p99_ms = r.enter_lag_us.lock().map(|h| h.value_at_quantile(0.99) as f64 / 1000.0).unwrap_or(0.0);
    let rate_shortfall = (scheduled_users > 1 && (offered < 0.95 * scheduled_rate || lag_p99_ms > 100.0)).then(|| {
        format!(
            "could not offer the requested rate: scheduled {scheduled_rate:.0} enters/s, sent {offered:.0}/s, \
             p99 send lag {lag_p99_ms:.0} ms (latencies still count from the schedule)"
        )
    });
    let admitted = ctx.live.admitted.load(Ordering::Relaxed);
    let secs = o.duration.as_secs_f64();
    // Requests in flight at the deadline finish after it: rates use the real length.
    let elapsed_secs = elapsed.as_secs_f64().max(secs);
    let eta = r.eta_errors_ms.lock().map(|e| EtaError::from_errors_ms(&e)).unwrap_or_default();
    Report {
        url: o.url.clone(),
        target: o.target.to_string(),
        arrival: format!("{:?}", o.arrivals.curve).to_lowercase(),
        users: o.users,
        users_scheduled: scheduled_users,
        duration_secs: secs,
        requested_enter_rate: o.arrivals.rate,
        scheduled_enter_rate: scheduled_rate,
        offered_enter_rate: offered,
        achieved_enter_rate: achieved,
        enter_send_lag_p99_ms: lag_p99_ms,
        rate_shortfall,
        enter: latency(Kind::Enter),
        poll: latency(Kind::Poll),
        poll_rate_per_sec: ctx.live.polls_sent.load(Ordering::Relaxed) as f64 / elapsed_secs.max(1e-3),
        follow_poll_after: o.follow_poll_after,
        purchase: latency(Kind::Purchase),
        status_counts,
        status_counts_by_kind: by_kind,
        entered: ctx.live.entered.load(Ordering::Relaxed),
        queue_full: r.queue_full.load(Ordering::Relaxed),
        direct_admitted: r.direct_admitted.load(Ordering::Relaxed),
        admitted,
        abandoned: r.abandoned.load(Ordering::Relaxed),
        evicted_seen: r.evicted_seen.load(Ordering::Relaxed),
        still_waiting: r.still_waiting.load(Ordering::Relaxed),
        purchase_attempts: r.purchase_attempts.load(Ordering::Relaxed),
        purchases: ctx.live.purchased.load(Ordering::Relaxed),
        downstream_max_per_tick: sink.map(|s| s.max_per_tick),
        downstream_total: sink.map(|s| s.total),
        downstream_rate_per_sec: sink.map(|s| s.rate_per_sec),
        admitted_rate_per_sec: if elapsed_secs > 0.0 { admitted as f64 / elapsed_secs } else { 0.0 },
        elapsed_secs,
        batch_size,
        tick_ms: o.tick_ms,
        wait_seconds: r.waits_ms.lock().map(|h| WaitSummary::from_millis(&h)).unwrap_or_default(),
        eta_error_seconds: eta,
        redis_bytes_per_waiting_user: redis_bytes,
    }
}

/// Runs one short round per batch size on the same target, setting the target's runtime
/// batch size through the store before each; restores the previous value afterwards. Users
/// still in the queue at the end of a round (waiting or abandoned) leave it, so each round
/// starts with an empty queue.
pub async fn sweep(
    opts: Options,
    sizes: &[u64],
    live: Arc<Live>,
    store: RedisStore,
    sink: Option<&Sink>,
    mut on_round: impl FnMut(u64),
) -> Result<Vec<Report>, crate::store::StoreError> {
    let previous = store.snapshot(opts.target).await?.batch_override;
    let mut reports = Vec::with_capacity(sizes.len());
    let mut outcome = Ok(());
    for (round, &size) in sizes.iter().enumerate() {
        if let Err(e) = store.set_batch_size(Some(opts.target), Some(size)).await {
            outcome = Err(e);
            break;
        }
        on_round(size);
        let mut o = opts.clone();
        o.first_user = opts.first_user + round as u64 * opts.users;
        o.leave_at_end = true;
        o.seed = opts.seed.wrapping_add(round as u64);
        reports.push(run(o, live.clone(), Some(store.clone()), sink).await);
    }
    store.set_batch_size(Some(opts.target), previous).await?;
    outcome.map(|()| reports)
}
