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
//!
//! Layout: this file holds the options, the live counters and the run; `buyer.rs` one
//! simulated buyer, `http.rs` its keep-alive HTTP/1.1 pool, `recorder.rs` what a run
//! measures, `summary.rs` the report made of it, `server.rs` what the server and its Redis
//! say, `opening.rs` a simulated sale opening, `arrival.rs` the arrival curves, `report.rs`
//! the report's form and bounds, `sink.rs` the downstream.

mod arrival;
mod buyer;
mod http;
mod opening;
mod recorder;
mod report;
mod server;
mod sink;
mod summary;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use self::arrival::{ArrivalCurve, Arrivals};
use self::buyer::{Ctx, simulate_user};
use self::http::Pool;
pub use self::opening::rank_correlation;
use self::opening::schedule_opening;
use self::recorder::{Recorder, ShardedHistogram};
pub use self::report::{
    Bounds, ClientFigures, EtaError, FailedBound, LatencySummary, OpeningFigures, OrderError, PowFigures, Report,
    TimelinePoint, WaitSummary, check_bounds, client_limit,
};
pub use self::server::{ServerFacts, probe};
use self::server::{batch_in_force, sample_redis};
pub use self::sink::{CapacitySchedule, Sink, SinkFigures, SinkModel, SinkSecond};
use self::summary::{build_report, timeline};
use crate::domain::QueueTarget;
use crate::store::RedisStore;
use crate::store::prelude::*;

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
    /// That route's path for the target (`POST`), from `gate.routes`.
    pub purchase_path: String,
    /// Times each buyer sends the purchase (one after the other, as a buyer clicking "buy"
    /// again): a token must buy once however often it is sent.
    pub purchase_times: u32,
    /// Share of admitted buyers (0–1) who buy; the others never use their token (no-shows),
    /// drawn per user from the seed.
    pub conversion: f64,
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
    /// Simulate a sale's opening: the run schedules the target's sale (pre-queue from its
    /// start, opening this long after it, through Redis) so that users arriving before the
    /// opening gather in the pre-queue; the report shows how their places relate to their
    /// arrival order ([`OpeningFigures`]).
    pub opening_in: Option<Duration>,
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
    recent_poll: ShardedHistogram,
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
            recent_poll: ShardedHistogram::micros(),
        }
    }
}

impl Live {
    /// p95 of the polls answered since the previous call, in ms, and resets the window.
    pub fn take_recent_poll_p95_ms(&self) -> Option<f64> {
        let h = self.recent_poll.merged(true);
        (!h.is_empty()).then(|| h.value_at_quantile(0.95) as f64 / 1000.0)
    }

    fn reset(&self) {
        for c in [&self.entered, &self.admitted, &self.purchased, &self.enters_sent, &self.polls_sent] {
            c.store(0, Ordering::Relaxed);
        }
        self.waiting.store(0, Ordering::Relaxed);
    }
}

use crate::clock::now_epoch_ms as epoch_ms;

/// `host:port` of a base URL `http://host[:port]` (port 80 when it names none).
fn authority(base: &str) -> String {
    let rest = base.strip_prefix("http://").unwrap_or(base);
    let host = rest.split('/').next().unwrap_or(rest);
    // A port is what follows the last colon, unless that colon is inside an IPv6 literal.
    if host.rsplit_once(':').is_some_and(|(_, p)| !p.contains(']')) { host.to_owned() } else { format!("{host}:80") }
}

/// CPU seconds (user + system) this process has used so far, from `/proc/self/stat`; `None`
/// where there is no procfs.
fn own_cpu_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name, in parentheses, may hold spaces: fields are counted after it.
    let after = stat.rsplit_once(')')?.1;
    let mut fields = after.split_whitespace();
    // utime and stime are fields 14 and 15 of the line, 12th and 13th after the name.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // The kernel reports them in USER_HZ, which is 100 on Linux.
    Some((utime + stime) as f64 / 100.0)
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
    if let (Some(opens_in), Some(store)) = (opts.opening_in, &redis) {
        schedule_opening(store, opts.target, opens_in, opts.seed).await;
    }
    let start = Instant::now() + Duration::from_millis(20);
    let ctx = Arc::new(Ctx {
        pool: Pool::new(authority(&base), opts.concurrency, REQUEST_TIMEOUT),
        start,
        deadline: start + opts.duration,
        enter_path: format!("/virtual-queues/{slug}/{id}/entries"),
        me_path: format!("/virtual-queues/{slug}/{id}/entries/me"),
        purchase_path: opts.purchase_path.clone(),
        rec: Recorder::new(),
        live,
        opts,
    });
    let wall_start = epoch_ms() + 20;
    let cpu_start = own_cpu_secs();

    let cancel = CancellationToken::new();
    let sampler = redis.map(|r| tokio::spawn(sample_redis(r, ctx.opts.target, cancel.clone())));
    // With a sink, the batch in force once a second, from the server's stats answer, for the
    // timeline beside what the sink served.
    let batches = sink.map(|_| tokio::spawn(sample_batches(base.clone(), ctx.opts.target, cancel.clone())));

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
        ctx.rec.timer_lag_us.record(Instant::now().saturating_duration_since(at).as_micros() as u64);
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
    let cpu_secs = match (cpu_start, own_cpu_secs()) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };
    let batches = match batches {
        Some(h) => h.await.unwrap_or_default(),
        None => BTreeMap::new(),
    };
    let timeline = sink.map(|s| timeline(&s.seconds(wall_start, wall_end), &batches, wall_start)).unwrap_or_default();
    let sink = sink.map(|s| s.figures(wall_start, wall_end));
    let mut report = build_report(&ctx, scheduled_users, batch_size, redis_bytes, sink, elapsed, cpu_secs);
    report.timeline = timeline;
    report
}

/// The batch the server's stats answer gives, once a second until `cancel`: epoch second →
/// batch (the last answer of that second).
async fn sample_batches(base: String, target: QueueTarget, cancel: CancellationToken) -> BTreeMap<u64, u64> {
    let mut seen = BTreeMap::new();
    loop {
        if let Ok(Some(facts)) = probe(&base, target).await {
            seen.insert(epoch_ms() / 1000, facts.batch_size);
        }
        tokio::select! {
            () = cancel.cancelled() => break,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
    seen
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
