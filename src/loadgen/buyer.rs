//! One simulated buyer (enter, poll until admitted or gone, maybe purchase) and the HTTP
//! exchange every request goes through.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

use super::http::{Exchange, Pool};
use super::recorder::{Kind, Recorder};
use super::{Live, MAX_STATUS, Options};

pub(super) enum Answer {
    Http(u16, Vec<u8>),
    Failed,
}

/// The fields of the queue API's answer the simulation needs, borrowed from the body (the
/// fields it ignores are skipped, not copied).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusReply<'a> {
    #[serde(borrow)]
    status: Cow<'a, str>,
    #[serde(default)]
    eta_seconds: Option<u64>,
    #[serde(default, borrow)]
    entry_token: Option<Cow<'a, str>>,
    #[serde(default)]
    poll_after_seconds: Option<u64>,
    #[serde(default)]
    position: Option<u64>,
    #[serde(default, borrow)]
    challenge: Option<ChallengeReply<'a>>,
}

/// A proof-of-work challenge (status CHALLENGE).
#[derive(Deserialize)]
struct ChallengeReply<'a> {
    #[serde(borrow)]
    seed: Cow<'a, str>,
    bits: u8,
}

fn parse_reply(body: &[u8]) -> Option<StatusReply<'_>> {
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

pub(super) struct Ctx {
    pub(super) opts: Options,
    /// The connections, and the `--concurrency` bound on requests in flight.
    pub(super) pool: Pool,
    pub(super) start: Instant,
    pub(super) deadline: Instant,
    /// Paths on the server (`url` holds no path).
    pub(super) enter_path: String,
    pub(super) me_path: String,
    pub(super) purchase_path: String,
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
        method: &str,
        path: &str,
        user: u64,
        token: Option<&str>,
        scheduled: Instant,
    ) -> Answer {
        self.send_with(kind, method, path, user, token, None, scheduled).await
    }

    /// [`Self::send`], with a proof of work's solution (seed, nonce).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn send_with(
        &self,
        kind: Kind,
        method: &str,
        path: &str,
        user: u64,
        token: Option<&str>,
        solution: Option<(&str, &str)>,
        scheduled: Instant,
    ) -> Answer {
        let stats = &self.rec.kinds[kind as usize];
        let mut digits = itoa_buf();
        let user = format_u64(user, &mut digits);
        let mut all = [("x-user-id", user), ("", ""), ("", "")];
        let mut n = 1;
        if let Some(t) = token {
            all[n] = ("x-entry-token", t);
            n += 1;
        }
        if let Some((seed, nonce)) = solution {
            all[n] = ("x-pow-seed", seed);
            all[n + 1] = ("x-pow-nonce", nonce);
            n += 2;
        }
        let headers = &all[..n];
        if self.pool.all_busy() {
            self.rec.waited_for_slot.fetch_add(1, Ordering::Relaxed);
        }
        let _slot = self.pool.slot().await;
        let sent = Instant::now();
        let lag_us = sent.saturating_duration_since(scheduled).as_micros() as u64;
        match kind {
            Kind::Enter => {
                self.live.enters_sent.fetch_add(1, Ordering::Relaxed);
                let at = self.since_start_us(sent);
                self.rec.first_enter_sent.fetch_min(at, Ordering::Relaxed);
                self.rec.last_enter_sent.fetch_max(at, Ordering::Relaxed);
                self.rec.enter_lag_us.record(lag_us);
            }
            Kind::Poll => {
                self.live.polls_sent.fetch_add(1, Ordering::Relaxed);
                self.rec.poll_lag_us.record(lag_us);
            }
            Kind::Purchase | Kind::Leave => {}
        }
        let result = self.pool.request(method, path, headers).await;
        let done = Instant::now();
        let latency_us = done.saturating_duration_since(scheduled).as_micros() as u64;
        stats.latency_us.record(latency_us);
        if kind == Kind::Poll {
            self.live.recent_poll.record(latency_us);
        }
        if kind == Kind::Enter {
            self.rec.enters_answered.fetch_add(u64::from(matches!(result, Exchange::Answered(..))), Ordering::Relaxed);
            self.rec.last_enter_answered.fetch_max(self.since_start_us(done), Ordering::Relaxed);
        }
        match result {
            Exchange::Answered(status, body) if usize::from(status) < MAX_STATUS => {
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
        if self.opts.conversion < 1.0 {
            let mut rng = Rng(self.opts.seed.rotate_left(17) ^ user.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            if rng.unit() >= self.opts.conversion {
                self.rec.no_shows.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        for _ in 0..self.opts.purchase_times {
            self.rec.purchase_attempts.fetch_add(1, Ordering::Relaxed);
            let answer = self.send(Kind::Purchase, "POST", &self.purchase_path, user, token, Instant::now()).await;
            if let Answer::Http(s, _) = answer
                && (200..300).contains(&s)
            {
                self.live.purchased.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// With `leave_at_end`, the user leaves the queue (DELETE) once the run is over.
    async fn leave_at_deadline(&self, user: u64) {
        if self.opts.leave_at_end {
            tokio::time::sleep_until(self.deadline).await;
            self.send(Kind::Leave, "DELETE", &self.me_path, user, None, Instant::now()).await;
        }
    }

    fn record_admitted(&self, entered_at: Instant, eta_ms: Option<u64>) {
        self.live.admitted.fetch_add(1, Ordering::Relaxed);
        let wait_ms = Instant::now().saturating_duration_since(entered_at).as_millis() as u64;
        if let Ok(mut h) = self.rec.waits_ms.lock() {
            h.saturating_record(wait_ms.max(1));
        }
        if let Ok(mut a) = self.rec.admissions.lock() {
            a.push((self.since_start_us(entered_at), self.since_start_us(Instant::now())));
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
    let mut at = scheduled;
    let mut solution: Option<(String, String)> = None;
    // The answer's body, parsed once: the reply borrows from it.
    let mut body;
    let reply = loop {
        let proof = solution.as_ref().map(|(s, n)| (s.as_str(), n.as_str()));
        match ctx.send_with(Kind::Enter, "POST", &ctx.enter_path, user, None, proof, at).await {
            Answer::Http(200, b) => {
                body = b;
                let Some(reply) = parse_reply(&body) else { return };
                match &reply.challenge {
                    // Proof of work: solve off the runtime's threads (a browser solves in a
                    // worker), then enter again with the solution.
                    Some(c) if solution.is_none() => {
                        let (seed, bits) = (c.seed.to_string(), c.bits);
                        let started = std::time::Instant::now();
                        let solved = tokio::task::spawn_blocking(move || {
                            let (nonce, tries) = crate::pow::solve(&seed, bits);
                            (seed, nonce, tries)
                        })
                        .await;
                        let Ok((seed, nonce, tries)) = solved else { return };
                        ctx.rec.pow_solved.fetch_add(1, Ordering::Relaxed);
                        ctx.rec.pow_hashes.fetch_add(tries, Ordering::Relaxed);
                        if let Ok(mut h) = ctx.rec.pow_us.lock() {
                            h.saturating_record(started.elapsed().as_micros().max(1) as u64);
                        }
                        solution = Some((seed, nonce));
                        at = Instant::now();
                    }
                    Some(_) => return,
                    None => break reply,
                }
            }
            // A solution refused (the difficulty raised meanwhile): a new challenge.
            Answer::Http(403, _) if solution.is_some() && Instant::now() < ctx.deadline => {
                solution = None;
                at = Instant::now();
            }
            Answer::Http(429, _) => {
                ctx.rec.queue_full.fetch_add(1, Ordering::Relaxed);
                return;
            }
            // 503 OVERLOADED: the instance is busy; retry as the page does, after Retry-After
            // (1 s) spread over a second.
            Answer::Http(503, _) => {
                at = Instant::now() + Duration::from_secs(1) + rng.between(Duration::ZERO, Duration::from_secs(1));
                if at >= ctx.deadline {
                    return;
                }
                tokio::time::sleep_until(at).await;
            }
            _ => return,
        }
    };
    ctx.live.entered.fetch_add(1, Ordering::Relaxed);
    let entered_at = Instant::now();
    match reply.status.as_ref() {
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
    let opening = ctx.opts.opening_in.is_some();
    // Pre-queued: their place comes with the opening, seen at a poll after it.
    let mut unplaced = reply.status == "PRE_QUEUE";
    if opening && unplaced {
        ctx.rec.prequeued.fetch_add(1, Ordering::Relaxed);
    } else if let (true, "WAITING", Some(place)) = (opening, reply.status.as_ref(), reply.position) {
        ctx.rec.later_places.lock().map(|mut v| v.push((idx, place))).ok();
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
        ctx.rec.timer_lag_us.record(Instant::now().saturating_duration_since(next).as_micros() as u64);
        let answer = ctx.send(Kind::Poll, "GET", &ctx.me_path, user, None, next).await;
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
                Some(r) => {
                    if let (true, "WAITING", Some(place)) = (opening && unplaced, r.status.as_ref(), r.position) {
                        unplaced = false;
                        ctx.rec.prequeued_places.lock().map(|mut v| v.push((idx, place))).ok();
                    }
                    told = r.poll_after_seconds;
                }
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

fn itoa_buf() -> [u8; 20] {
    [0; 20]
}

/// `n` in decimal, written into `buf` (no allocation per request).
fn format_u64(mut n: u64, buf: &mut [u8; 20]) -> &str {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    std::str::from_utf8(&buf[i..]).expect("ascii digits")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_ids_are_written_in_decimal() {
        let mut b = itoa_buf();
        assert_eq!(format_u64(0, &mut b), "0");
        assert_eq!(format_u64(42, &mut b), "42");
        assert_eq!(format_u64(u64::MAX, &mut b), u64::MAX.to_string());
    }

    #[test]
    fn replies_are_read_with_escaped_strings_too() {
        let r = parse_reply(br#"{"status":"ADMITTED","position":null,"entryToken":"a\/b","x":[1,{"y":2}]}"#).unwrap();
        assert_eq!(r.status, "ADMITTED");
        assert_eq!(r.entry_token.as_deref(), Some("a/b"));
    }
}
