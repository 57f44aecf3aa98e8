//! Assembles a running `vq serve`: store, service, flag refresher, pump and HTTP server, all
//! stopped by one `CancellationToken`. Tests call [`run`] with a listener bound to port 0.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Settings, StoreKind};
use crate::http::{AppState, router};
use crate::pump::Pump;
use crate::service::QueueService;
use crate::store::{AnyStore, MemoryStore, RedisStore};
use crate::token::Secret;

/// Opens the configured store. The Redis store connects lazily, so this succeeds while
/// Redis is down (vq fails open and reconnects by itself).
pub fn open_store(settings: &Settings) -> anyhow::Result<AnyStore> {
    Ok(match settings.store {
        StoreKind::Redis => AnyStore::Redis(
            RedisStore::connect(&settings.redis.url, settings.limits(), settings.redis_timeout())
                .with_context(|| format!("invalid redis.url {}", settings.redis.url))?,
        ),
        StoreKind::Memory => AnyStore::Memory(MemoryStore::new(settings.limits())),
    })
}

/// Keeps the service's copy of the flag fresh; on Redis errors the last value stays.
async fn refresh_flag_loop(service: Arc<QueueService>, cancel: CancellationToken) {
    let every = Duration::from_millis(service.settings().flag.refresh_ms);
    let mut failing = false;
    loop {
        match service.refresh_flag().await {
            Ok(_) if failing => {
                failing = false;
                tracing::info!("flag refresh works again");
            }
            Ok(_) => {}
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "cannot read the flag: keeping the last value read");
            }
            Err(_) => {}
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}

/// Installs the metrics recorder and folds histogram samples into buckets every few seconds.
async fn metrics_upkeep_loop(cancel: CancellationToken) {
    crate::metrics::install();
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(5)) => crate::metrics::upkeep(),
        }
    }
}

pub struct ServeOptions {
    pub pump: bool,
}

/// Serves until `cancel`, then drains: the pump finishes its tick, in-flight requests end.
pub async fn run(
    listener: TcpListener,
    settings: Arc<Settings>,
    secret: Secret,
    opts: ServeOptions,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let store = open_store(&settings)?;
    let instance_id = settings.instance_id();
    let service = Arc::new(QueueService::new(store.clone(), secret, settings.clone()));
    // Read the flag once before serving, so the first requests see it (if Redis answers).
    let _ = service.refresh_flag().await;

    let tracker = TaskTracker::new();
    tracker.spawn(refresh_flag_loop(service.clone(), cancel.clone()));
    tracker.spawn(metrics_upkeep_loop(cancel.clone()));
    if opts.pump {
        let pump = Pump::new(store, settings.clone(), instance_id.clone());
        tracker.spawn(pump.run(cancel.clone()));
    }
    tracker.close();

    let app = router(Arc::new(AppState { service }));
    tracing::info!(addr = %listener.local_addr()?, instance = %instance_id, pump = opts.pump, "vq serve listening");
    axum::serve(listener, app)
        .with_graceful_shutdown(cancel.clone().cancelled_owned())
        .await
        .context("http server failed")?;
    cancel.cancel();
    if tokio::time::timeout(Duration::from_secs(5), tracker.wait()).await.is_err() {
        tracing::warn!("background tasks did not stop within 5 s");
    }
    Ok(())
}

/// Cancels `cancel` on SIGTERM or Ctrl-C.
pub fn cancel_on_signal(cancel: CancellationToken) {
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    cancel.cancel();
                    return;
                }
            };
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        tracing::info!("shutting down");
        cancel.cancel();
    });
}
