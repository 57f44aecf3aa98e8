//! The built-in purchase API stand-in (`--sink ADDR`): counts arrivals per tick window, so
//! the downstream rate behind the gate is measured, not assumed, and, with a capacity
//! (`--sink-capacity`), behaves as a purchase API that can take only so much.
//!
//! Without a capacity it answers 200 to any request at once. With one, it is a single server
//! that completes `capacity` purchases per second, first come first served: a purchase waits
//! for the ones before it, so its latency is its place in the backlog divided by the capacity
//! (latency grows with load), and a purchase that would wait longer than `max_wait` is
//! answered 503 with `Retry-After: 1` at once (the purchase API backing off). The capacity may
//! change during the run (`50,20@30s,50@60s`), counted from the sink's start.
//!
//! Windows are aligned on the wall clock (`epoch_ms / tick_ms`), as the pump's ticks are on
//! Redis' clock; on one machine the two agree. It also counts repeats: requests whose
//! `X-Entry-Token` it has received before (a token the gate let buy twice), and, per second,
//! the purchases it served and refused and their latencies. It keeps no other state.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The sink's capacity over the run: purchases per second from an offset of the sink's start
/// on, e.g. `50,20@30s,50@60s` (50/s, 20/s from 30 s, 50/s again from 60 s).
#[derive(Debug, Clone, PartialEq)]
pub struct CapacitySchedule {
    /// (offset, purchases per second), the first at offset 0, offsets increasing.
    steps: Vec<(Duration, f64)>,
}

impl CapacitySchedule {
    /// Purchases per second `since` the sink's start.
    pub fn at(&self, since: Duration) -> f64 {
        self.steps.iter().take_while(|(from, _)| *from <= since).last().map_or(self.steps[0].1, |(_, c)| *c)
    }
}

impl FromStr for CapacitySchedule {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut steps: Vec<(Duration, f64)> = Vec::new();
        for (i, part) in s.split(',').map(str::trim).enumerate() {
            let (rate, at) = match part.split_once('@') {
                Some((r, a)) => (r, Some(a)),
                None => (part, None),
            };
            let rate: f64 =
                rate.parse().ok().filter(|r: &f64| *r > 0.0 && r.is_finite()).ok_or_else(|| {
                    format!("'{part}': the capacity must be a positive number of purchases per second")
                })?;
            let at = match at {
                None if i == 0 => Duration::ZERO,
                None => return Err(format!("'{part}': every capacity after the first needs @SECONDS, e.g. 20@30s")),
                Some(a) => a
                    .strip_suffix('s')
                    .unwrap_or(a)
                    .parse::<f64>()
                    .ok()
                    .filter(|x| *x >= 0.0 && x.is_finite())
                    .map(Duration::from_secs_f64)
                    .ok_or_else(|| format!("'{part}': @{a} is not a number of seconds, e.g. @30s"))?,
            };
            if i == 0 && at != Duration::ZERO {
                return Err(format!("'{part}': the first capacity holds from the start (no @, or @0s)"));
            }
            if steps.last().is_some_and(|(prev, _)| *prev >= at) {
                return Err(format!("'{part}': the changes must come in increasing order of time"));
            }
            steps.push((at, rate));
        }
        Ok(Self { steps })
    }
}

impl fmt::Display for CapacitySchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (at, rate)) in self.steps.iter().enumerate() {
            match i {
                0 => write!(f, "{rate}")?,
                _ => write!(f, ",{rate}@{}s", at.as_secs_f64())?,
            }
        }
        Ok(())
    }
}

/// How the sink behaves (`--sink-capacity`, `--sink-max-wait-ms`).
#[derive(Debug, Clone, Default)]
pub struct SinkModel {
    /// `None`: answers every request 200 at once.
    pub capacity: Option<CapacitySchedule>,
    /// A purchase that would wait longer than this for its turn is refused (503).
    pub max_wait: Duration,
}

/// What the sink did in one second of the run.
#[derive(Debug, Default, Clone)]
struct Second {
    served: u64,
    refused: u64,
    latencies_ms: Vec<u32>,
}

/// Arrivals per tick window.
#[derive(Debug, Default)]
struct Counts {
    /// window index (epoch_ms / tick_ms) → arrivals
    windows: BTreeMap<u64, u64>,
    /// Every `X-Entry-Token` received, and how many requests brought one already seen.
    tokens: HashSet<Box<[u8]>>,
    repeats: u64,
    /// Epoch ms at which the single server is free again (capacity model).
    free_at_ms: f64,
    /// Epoch second → what was served and refused in it.
    seconds: BTreeMap<u64, Second>,
}

struct Shared {
    counts: Mutex<Counts>,
    tick_ms: u64,
    started_ms: u64,
    model: SinkModel,
}

/// A running sink; stops when dropped or when [`Sink::stop`] is called.
pub struct Sink {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    cancel: CancellationToken,
}

/// What the sink saw between two instants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SinkFigures {
    pub total: u64,
    pub max_per_tick: u64,
    pub rate_per_sec: f64,
    /// Requests (over the whole run) with a token received before.
    pub repeated_tokens: u64,
    /// Purchases answered 503 for want of capacity (only with a capacity).
    pub refused: u64,
    /// P95 of the served purchases' latency at the sink, ms.
    pub p95_ms: Option<u32>,
}

/// What the sink did in one second (epoch second `second`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SinkSecond {
    pub second: u64,
    /// The capacity in force at the second's start (`None`: unlimited).
    pub capacity: Option<f64>,
    pub served: u64,
    /// Answered 503 (over capacity).
    pub refused: u64,
    /// P95 of the served purchases' latency at the sink, ms.
    pub p95_ms: Option<u32>,
}

use crate::clock::now_epoch_ms as now_ms;

async fn purchase(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let now = now_ms();
    let wait = {
        let Ok(mut c) = shared.counts.lock() else { return StatusCode::INTERNAL_SERVER_ERROR.into_response() };
        *c.windows.entry(now / shared.tick_ms).or_default() += 1;
        let wait = match &shared.model.capacity {
            None => Some(0.0),
            Some(schedule) => {
                let per_sec = schedule.at(Duration::from_millis(now.saturating_sub(shared.started_ms)));
                let start = c.free_at_ms.max(now as f64);
                let done = start + 1000.0 / per_sec;
                let wait = done - now as f64;
                (wait <= shared.model.max_wait.as_millis() as f64).then(|| {
                    c.free_at_ms = done;
                    wait
                })
            }
        };
        // A refused purchase bought nothing: the gate gives its token back, and its retry is
        // the first purchase with it. Only served ones count for tokens bought twice.
        if wait.is_some()
            && let Some(token) = headers.get("x-entry-token")
            && !c.tokens.insert(token.as_bytes().into())
        {
            c.repeats += 1;
        }
        let second = c.seconds.entry(now / 1000).or_default();
        match wait {
            Some(ms) => {
                second.served += 1;
                second.latencies_ms.push(ms.ceil() as u32);
            }
            None => second.refused += 1,
        }
        wait
    };
    match wait {
        Some(ms) => {
            if ms >= 1.0 {
                tokio::time::sleep(Duration::from_secs_f64(ms / 1000.0)).await;
            }
            "{\"sink\":\"ok\"}".into_response()
        }
        None => (StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, "1")], "{\"sink\":\"over capacity\"}")
            .into_response(),
    }
}

impl Sink {
    /// Binds `addr` and serves in the background on the current runtime.
    pub async fn start(addr: SocketAddr, tick_ms: u64, model: SinkModel) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            counts: Mutex::new(Counts::default()),
            tick_ms: tick_ms.max(1),
            started_ms: now_ms(),
            model,
        });
        let cancel = CancellationToken::new();
        let app = Router::new().fallback(purchase).with_state(shared.clone());
        let stop = cancel.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await;
        });
        Ok(Self { addr, shared, cancel })
    }

    /// The current wall-clock instant in ms, to bound [`Sink::figures`].
    pub fn now_ms(&self) -> u64 {
        now_ms()
    }

    /// Arrivals in the windows that overlap `[from_ms, to_ms]`.
    pub fn figures(&self, from_ms: u64, to_ms: u64) -> SinkFigures {
        let tick_ms = self.shared.tick_ms;
        let (first, last) = (from_ms / tick_ms, to_ms / tick_ms);
        let Ok(c) = self.shared.counts.lock() else {
            return SinkFigures {
                total: 0,
                max_per_tick: 0,
                rate_per_sec: 0.0,
                repeated_tokens: 0,
                refused: 0,
                p95_ms: None,
            };
        };
        let range = c.windows.range(first..=last);
        let (total, max) = range.fold((0, 0), |(t, m), (_, n)| (t + n, m.max(*n)));
        let secs = (to_ms.saturating_sub(from_ms)) as f64 / 1000.0;
        let rate_per_sec = if secs > 0.0 { total as f64 / secs } else { 0.0 };
        let seconds = c.seconds.range(from_ms / 1000..=to_ms / 1000).map(|(_, s)| s);
        let (refused, mut latencies) = seconds.fold((0, Vec::new()), |(r, mut l), s| {
            l.extend_from_slice(&s.latencies_ms);
            (r + s.refused, l)
        });
        SinkFigures {
            total,
            max_per_tick: max,
            rate_per_sec,
            repeated_tokens: c.repeats,
            refused,
            p95_ms: p95(&mut latencies),
        }
    }

    /// Second by second, what the sink served and refused in `[from_ms, to_ms]`, every second
    /// listed (a second without purchases too).
    pub fn seconds(&self, from_ms: u64, to_ms: u64) -> Vec<SinkSecond> {
        let Ok(c) = self.shared.counts.lock() else { return Vec::new() };
        (from_ms / 1000..=to_ms / 1000)
            .map(|s| {
                let seen = c.seconds.get(&s).cloned().unwrap_or_default();
                let mut l = seen.latencies_ms;
                let since = Duration::from_millis((s * 1000).saturating_sub(self.shared.started_ms));
                SinkSecond {
                    second: s,
                    capacity: self.shared.model.capacity.as_ref().map(|c| c.at(since)),
                    served: seen.served,
                    refused: seen.refused,
                    p95_ms: p95(&mut l),
                }
            })
            .collect()
    }

    pub fn stop(&self) {
        self.cancel.cancel();
    }
}

/// The 95th percentile of `ms` (sorted in place), `None` when empty.
fn p95(ms: &mut [u32]) -> Option<u32> {
    ms.sort_unstable();
    (!ms.is_empty()).then(|| ms[(ms.len() * 95).div_ceil(100).clamp(1, ms.len()) - 1])
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capacity_schedule_changes_at_its_offsets() {
        let s: CapacitySchedule = "50,20@30s,50@60".parse().unwrap();
        assert_eq!(s.at(Duration::ZERO), 50.0);
        assert_eq!(s.at(Duration::from_secs(29)), 50.0);
        assert_eq!(s.at(Duration::from_secs(30)), 20.0);
        assert_eq!(s.at(Duration::from_secs(61)), 50.0);
        assert_eq!(s.to_string(), "50,20@30s,50@60s");
        assert_eq!("7.5".parse::<CapacitySchedule>().unwrap().at(Duration::from_secs(99)), 7.5);
    }

    #[test]
    fn a_bad_capacity_schedule_says_what_is_wrong() {
        for (bad, says) in [
            ("0", "positive"),
            ("50,20", "needs @SECONDS"),
            ("50@5s", "from the start"),
            ("50,20@30s,10@10s", "increasing"),
            ("50,20@soon", "not a number of seconds"),
            ("", "positive"),
        ] {
            let e = bad.parse::<CapacitySchedule>().unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
