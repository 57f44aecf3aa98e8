//! The built-in counting upstream (`--sink ADDR`): answers 200 to any request and counts
//! arrivals per tick window, so the downstream rate behind the gate is measured, not assumed.
//!
//! Windows are aligned on the wall clock (`epoch_ms / tick_ms`), as the pump's ticks are on
//! Redis' clock; on one machine the two agree. It also counts repeats: requests whose
//! `X-Entry-Token` it has received before (a token the gate let buy twice). It is a measuring
//! device, not a backend: it keeps no state but the counts and the tokens seen.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Arrivals per tick window.
#[derive(Debug, Default)]
struct Counts {
    /// window index (epoch_ms / tick_ms) → arrivals
    windows: BTreeMap<u64, u64>,
    /// Every `X-Entry-Token` received, and how many requests brought one already seen.
    tokens: HashSet<Box<[u8]>>,
    repeats: u64,
}

/// A running sink; stops when dropped or when [`Sink::stop`] is called.
pub struct Sink {
    pub addr: SocketAddr,
    tick_ms: u64,
    counts: Arc<Mutex<Counts>>,
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
}

use crate::clock::now_epoch_ms as now_ms;

async fn count(State((counts, tick_ms)): State<(Arc<Mutex<Counts>>, u64)>, headers: HeaderMap) -> &'static str {
    let window = now_ms() / tick_ms;
    if let Ok(mut c) = counts.lock() {
        *c.windows.entry(window).or_default() += 1;
        if let Some(token) = headers.get("x-entry-token")
            && !c.tokens.insert(token.as_bytes().into())
        {
            c.repeats += 1;
        }
    }
    "{\"sink\":\"ok\"}"
}

impl Sink {
    /// Binds `addr` and serves in the background on the current runtime.
    pub async fn start(addr: SocketAddr, tick_ms: u64) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let counts = Arc::new(Mutex::new(Counts::default()));
        let cancel = CancellationToken::new();
        let app = Router::new().fallback(count).with_state((counts.clone(), tick_ms.max(1)));
        let stop = cancel.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await;
        });
        Ok(Self { addr, tick_ms: tick_ms.max(1), counts, cancel })
    }

    /// The current wall-clock instant in ms, to bound [`Sink::figures`].
    pub fn now_ms(&self) -> u64 {
        now_ms()
    }

    /// Arrivals in the windows that overlap `[from_ms, to_ms]`.
    pub fn figures(&self, from_ms: u64, to_ms: u64) -> SinkFigures {
        let (first, last) = (from_ms / self.tick_ms, to_ms / self.tick_ms);
        let Ok(c) = self.counts.lock() else {
            return SinkFigures { total: 0, max_per_tick: 0, rate_per_sec: 0.0, repeated_tokens: 0 };
        };
        let range = c.windows.range(first..=last);
        let (total, max) = range.fold((0, 0), |(t, m), (_, n)| (t + n, m.max(*n)));
        let secs = (to_ms.saturating_sub(from_ms)) as f64 / 1000.0;
        let rate_per_sec = if secs > 0.0 { total as f64 / secs } else { 0.0 };
        SinkFigures { total, max_per_tick: max, rate_per_sec, repeated_tokens: c.repeats }
    }

    pub fn stop(&self) {
        self.cancel.cancel();
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}
