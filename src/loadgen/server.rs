//! What the loaded server and its Redis say: the batch size and tick it admits with, and
//! Redis memory per waiting user while the run goes on.

use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::domain::QueueTarget;
use crate::store::RedisStore;
use crate::store::prelude::*;

/// Samples Redis while the run goes on: growth of `used_memory` per waiting user at the
/// moment most users wait.
pub(super) async fn sample_redis(store: RedisStore, target: QueueTarget, cancel: CancellationToken) -> Option<f64> {
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
        let resp = build_client().request(req).await.map_err(|e| format!("no HTTP answer from {uri}: {e}"))?;
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

/// The client of the probe (the simulation has its own, `http.rs`).
fn build_client() -> Client<HttpConnector, Full<Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_keepalive(Some(Duration::from_secs(30)));
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1)
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector)
}
