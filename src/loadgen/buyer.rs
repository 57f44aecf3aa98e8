//! One simulated buyer (enter, poll until admitted or gone, maybe purchase) and the HTTP
//! exchange every request goes through.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::recorder::{Kind, Recorder};
use super::{Live, MAX_STATUS, Options, REQUEST_TIMEOUT};

pub(super) enum Answer {
    Http(u16, Bytes),
    Failed,
}

/// The fields of the queue API's answer the simulation needs.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusReply {
    pub(super) status: String,
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
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub(super) fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        lo + hi.saturating_sub(lo).mul_f64(self.unit())
    }
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub(super) struct Ctx {
    pub(super) opts: Options,
    pub(super) client: HttpClient,
    pub(super) permits: Semaphore,
    pub(super) start: Instant,
    pub(super) deadline: Instant,
    pub(super) enter_uri: String,
    pub(super) me_uri: String,
    pub(super) purchase_uri: String,
    pub(super) rec: Recorder,
    pub(super) live: Arc<Live>,
}

impl Ctx {
    fn since_start_us(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.start).as_micros() as u64
    }

    /// Sends one request no earlier than `scheduled` and records it, latency counted from
    /// `scheduled` (waiting for a free slot is part of it).
    pub(super) async fn send(
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

    pub(super) async fn purchase(&self, user: u64, token: Option<&str>) {
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
pub(super) async fn simulate_user(ctx: Arc<Ctx>, idx: u64, scheduled: Instant) {
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

pub(super) fn build_client(concurrency: usize) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_keepalive(Some(Duration::from_secs(30)));
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(concurrency)
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector)
}
