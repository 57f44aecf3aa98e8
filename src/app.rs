//! Assembles a running `vq serve`: store, service, flag refresher, pump, event delivery and HTTP server, all
//! stopped by one `CancellationToken`. Tests call [`run`] with a listener bound to port 0.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{HttpSettings, Settings, StoreKind, redact_credentials};
use crate::domain::InstanceReport;
use crate::http::edge::Edge;
use crate::http::gate::Gate;
use crate::http::page::Page;
use crate::http::{AppState, router};
use crate::pump::Pump;
use crate::service::{QueueService, now_epoch_ms};
use crate::store::prelude::*;
use crate::store::{AnyStore, FlagAck, RedisStore};
use crate::token::Secret;

/// Opens the configured store: Redis Cluster when `redis.cluster_nodes` is set, else the
/// Redis at `redis.url`. Both connect lazily, so this succeeds while Redis is down (vq fails
/// open and reconnects by itself).
pub fn open_store(settings: &Settings) -> anyhow::Result<AnyStore> {
    Ok(match settings.store {
        StoreKind::Redis => match settings.redis_cluster_nodes() {
            Some(nodes) => RedisStore::connect_cluster(&nodes, settings.limits(), settings.redis_timeout())
                .with_context(|| format!("invalid redis.cluster_nodes {}", redact_credentials(&nodes.join(","))))?,
            None => RedisStore::connect(&settings.redis.url, settings.limits(), settings.redis_timeout())
                .map_err(|e| invalid_redis_url(&settings.redis.url.to_string(), &e))?,
        },
        StoreKind::Memory => RedisStore::embedded(settings.limits(), crate::clock::system())
            .context("the embedded store did not start")?,
    })
}

/// A `redis.url` the Redis client refuses, said once (the client's own text repeats itself:
/// "Redis URL did not parse - InvalidClientConfig: Redis URL did not parse - …").
fn invalid_redis_url(shown: &str, e: &crate::store::StoreError) -> anyhow::Error {
    match e {
        crate::store::StoreError::Backend(b) if b.invalid_config => anyhow::anyhow!(
            "invalid redis.url `{shown}` (VQ_REDIS__URL): not a Redis URL; expected redis://[user:password@]host[:port][/db], \
             rediss://… for TLS or redis+unix:///path/to/socket"
        ),
        other => anyhow::anyhow!("invalid redis.url `{shown}` (VQ_REDIS__URL): {other}"),
    }
}

/// How long an instance's flag acknowledgement lives: an instance whose record is gone has
/// stopped refreshing (dead, or cut off from Redis).
pub const FLAG_ACK_TTL_MS: u64 = 3000;

/// Writes this instance's acknowledgement of `flag` (for the confirmed rollback of `vq flag
/// off`); `applied` keeps the version applied and since when, so an unchanged flag keeps its
/// first time.
async fn acknowledge_flag(
    service: &QueueService,
    instance_id: &str,
    flag: crate::service::AppliedFlag,
    applied: &mut Option<(u64, u64)>,
) {
    let (v, at) = match *applied {
        Some((v, at)) if v == flag.version => (v, at),
        _ => (flag.version, now_epoch_ms()),
    };
    *applied = Some((v, at));
    let ack = FlagAck {
        instance: instance_id.to_owned(),
        version: v,
        applied_at_ms: at,
        kept_missing: flag.kept_missing,
        state: flag.state,
        silent_ms: None,
    };
    let _ = service.store.ack_flag(ack, FLAG_ACK_TTL_MS).await;
}

/// Keeps the service's copy of the flag fresh and acknowledges the version applied, every
/// `flag.refresh_ms` from the start-up read on (`applied`); on Redis errors the last value
/// stays.
async fn refresh_flag_loop(
    service: Arc<QueueService>,
    instance_id: String,
    mut applied: Option<(u64, u64)>,
    cancel: CancellationToken,
) {
    let every = Duration::from_millis(service.settings().flag.refresh_ms);
    let mut failing = false;
    // Present from start, also while Redis is down and no refresh has worked yet.
    crate::metrics::set_flag_missing(service.flag_missing());
    loop {
        tokio::select! {
            () = cancel.cancelled() => {
                // Stopping on purpose: not an instance that failed to apply the flag.
                let _ = service.store.withdraw_flag_ack(&instance_id).await;
                return;
            }
            () = tokio::time::sleep(every) => {}
        }
        if let Err(e) = service.refresh_targets().await {
            tracing::debug!(error = %e, "cannot read the declared targets: keeping the last set read");
        }
        match service.refresh_flag().await {
            Ok(flag) => {
                if failing {
                    failing = false;
                    tracing::info!("flag refresh works again");
                }
                acknowledge_flag(&service, &instance_id, flag, &mut applied).await;
            }
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "cannot read the flag: keeping the last value read");
            }
            Err(_) => {}
        }
    }
}

/// How often a serving instance reports itself to the fleet (`store::FleetOps`), and how long
/// a report lives: a target that only a stopped instance declared leaves the operator
/// commands' view within [`FLEET_REPORT_TTL_MS`] (at once when it stops with SIGTERM).
pub const FLEET_REPORT_EVERY_MS: u64 = 2000;
pub const FLEET_REPORT_TTL_MS: u64 = 10_000;

/// Reports this instance (its declarations and the settings that must agree) every
/// [`FLEET_REPORT_EVERY_MS`], reads the others' reports and sets the drift gauge; withdraws
/// the report on shutdown. Off the request path: a Redis error only skips a round.
async fn report_to_fleet_loop(service: Arc<QueueService>, report: InstanceReport, cancel: CancellationToken) {
    let mut drifting: Vec<String> = Vec::new();
    loop {
        let _ = service.store.report_instance(&report, FLEET_REPORT_TTL_MS).await;
        if let Ok(fleet) = service.store.fleet().await {
            let now: Vec<String> = crate::domain::drift(&fleet).into_iter().map(|d| d.setting).collect();
            crate::metrics::set_fleet_drift(now.len());
            if now != drifting && !now.is_empty() {
                tracing::warn!(settings = %now.join(", "), "the instances of this fleet disagree on settings: `vq fleet` shows who holds what");
            }
            drifting = now;
        }
        tokio::select! {
            () = cancel.cancelled() => {
                let _ = service.store.withdraw_instance(&report.instance).await;
                return;
            }
            () = tokio::time::sleep(Duration::from_millis(FLEET_REPORT_EVERY_MS)) => {}
        }
    }
}

/// Sends the heartbeats of polls answered from this instance's copy of the mark and refreshes
/// the copies (`queue.local_polls`), every quarter tick.
async fn sync_local_views_loop(service: Arc<QueueService>, cancel: CancellationToken) {
    let every = crate::service::local_sync_every(service.settings().queue.tick_ms);
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            () = tokio::time::sleep(every) => service.sync_local_views().await,
        }
    }
    // The last heartbeats of polls answered before the shutdown.
    service.sync_local_views().await;
}

/// Adds the purchases the gate refused to the targets' records once per tick, off the request
/// path, so a flood of refused purchases is one write per target and tick per instance.
async fn flush_refusals_loop(service: Arc<QueueService>, cancel: CancellationToken) {
    let every = Duration::from_millis(service.settings().queue.tick_ms);
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            () = tokio::time::sleep(every) => service.flush_refusals().await,
        }
    }
    // The refusals counted before the shutdown.
    service.flush_refusals().await;
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

/// Publishes how far this host's clock is from Redis' (`virtual_queue_clock_offset_seconds`)
/// and warns while it is more than [`crate::service::CLOCK_OFF_MS`] off. Decisions do not
/// depend on it (they use Redis' clock), but an operator should know a host's clock is wrong.
async fn clock_watch_loop(service: Arc<QueueService>, cancel: CancellationToken) {
    let mut warned = false;
    loop {
        let measured = service.clock_offset_ms();
        if let Some(offset) = measured {
            crate::metrics::set_clock_offset(offset);
            let off = offset.unsigned_abs() > crate::service::CLOCK_OFF_MS;
            if off && !warned {
                tracing::warn!(
                    offset_ms = offset,
                    "this host's clock is {} ms {} Redis' clock: vq decides by Redis' clock, but fix this host's time sync (NTP)",
                    offset.unsigned_abs(),
                    if offset > 0 { "behind" } else { "ahead of" }
                );
            } else if !off && warned {
                tracing::info!(offset_ms = offset, "this host's clock agrees with Redis' clock again");
            }
            warned = off;
        }
        // Until the probe's first answer, look again soon: the gauge exists from start.
        let wait = if measured.is_some() { Duration::from_secs(2) } else { Duration::from_millis(50) };
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

pub struct ServeOptions {
    pub pump: bool,
    /// Write "queue on for everyone" to the store at start-up (trial runs).
    pub flag_on: bool,
}

/// Serves until `cancel`, then drains: the pump finishes its tick, in-flight requests end
/// within `http.drain_timeout_ms`.
pub async fn run(
    listener: TcpListener,
    settings: Arc<Settings>,
    secret: Secret,
    opts: ServeOptions,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let store = open_store(&settings)?;
    let instance_id = settings.instance_id();
    let report = settings.instance_report(&instance_id, &secret.key_ids())?;
    // Before anything starts: a webhook without its secret is a configuration error.
    let webhooks = crate::events::webhooks_from_env(&settings)?;
    let service = Arc::new(QueueService::new(store.clone(), secret, settings.clone()));
    if opts.flag_on {
        // A few tries: a busy machine can make one call outlast the timeout.
        for attempt in 1..=10 {
            match store.change_flag(crate::domain::FlagChange::On { percent: 100 }).await {
                Ok(v) => {
                    tracing::info!(version = v, "queue turned on for every user (--flag-on)");
                    break;
                }
                Err(e) if attempt == 10 => tracing::warn!(error = %e, "--flag-on: could not write the flag"),
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }
    // Read the flag once before serving, so the first requests see it (if Redis answers), and
    // acknowledge it before the first answer: an instance that serves is one that `vq flag`
    // (and its confirmation that every live instance applied a change) counts.
    let mut applied = None;
    if let Ok(flag) = service.refresh_flag().await {
        acknowledge_flag(&service, &instance_id, flag, &mut applied).await;
    }
    let _ = service.refresh_targets().await;

    let tracker = TaskTracker::new();
    tracker.spawn(refresh_flag_loop(service.clone(), instance_id.clone(), applied, cancel.clone()));
    tracker.spawn(metrics_upkeep_loop(cancel.clone()));
    tracker.spawn(report_to_fleet_loop(service.clone(), report, cancel.clone()));
    tracker.spawn(clock_watch_loop(service.clone(), cancel.clone()));
    tracker.spawn(flush_refusals_loop(service.clone(), cancel.clone()));
    if settings.queue.local_polls {
        tracker.spawn(sync_local_views_loop(service.clone(), cancel.clone()));
    }
    tracker.spawn(crate::events::upkeep_loop(service.clone(), instance_id.clone(), cancel.clone()));
    crate::metrics::register_webhooks(&webhooks.iter().map(|w| w.name.clone()).collect::<Vec<_>>());
    for webhook in webhooks {
        let options = crate::events::DeliveryOptions::of(&settings);
        let delivery = crate::events::Delivery::new(store.clone(), webhook, options, instance_id.clone());
        tracker.spawn(delivery.run(cancel.clone()));
    }
    if opts.pump {
        let pump =
            Pump::new(store, settings.clone(), instance_id.clone()).publishing_batches(service.outflow_batches());
        tracker.spawn(pump.run(cancel.clone()));
    }
    tracker.close();

    let gate = Gate::new(&settings.gate, settings.http.body_read_timeout())?;
    let page = Page::new(&settings.page).map_err(|e| anyhow::anyhow!(e))?;
    let cors = settings.http.cors_origin_list().map_err(|e| anyhow::anyhow!(e))?;
    let edge = Edge::new(cors, &settings.http, crate::gate::GateRoutes::compile(&settings.gate.routes)?);
    let app = router(Arc::new(AppState { service, gate, page }), edge);
    tracing::info!(addr = %listener.local_addr()?, instance = %instance_id, pump = opts.pump, "vq serve listening");
    serve_http(listener, app, &settings.http, &cancel).await;
    cancel.cancel();
    if tokio::time::timeout(Duration::from_secs(5), tracker.wait()).await.is_err() {
        tracing::warn!("background tasks did not stop within 5 s");
    }
    Ok(())
}

/// Accepts HTTP/1.1 connections until `cancel`, then drains: in-flight requests finish, idle
/// connections close at once, and whatever is still open after `http.drain_timeout_ms` is
/// dropped. A connection that has not sent a complete request head within
/// `http.header_read_timeout_ms` (of opening, or of its previous response) is closed, so slow
/// senders and idle keep-alive connections cannot hold the server or its shutdown.
async fn serve_http(listener: TcpListener, app: axum::Router, http: &HttpSettings, cancel: &CancellationToken) {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(http.header_read_timeout()).keep_alive(true);
    let graceful = GracefulShutdown::new();
    // One task per connection, kept here so the drain can wait for them and then drop them.
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            biased;
            () = cancel.cancelled() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    // The peer's address, for the edge's share of places by client.
                    let app = app.clone();
                    let service = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                        req.extensions_mut().insert(axum::extract::ConnectInfo(peer));
                        // A Router is always ready: no `poll_ready` needed.
                        tower::Service::call(&mut app.clone(), req)
                    });
                    let conn = builder.serve_connection(TokioIo::new(stream), service);
                    let conn = graceful.watch(conn);
                    conns.spawn(async move {
                        if let Err(e) = conn.await {
                            tracing::debug!(error = %e, "connection closed with an error");
                        }
                    });
                }
                // Out of file descriptors or a connection reset before accept: keep serving.
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    let open = conns.len();
    if tokio::time::timeout(http.drain_timeout(), graceful.shutdown()).await.is_err() {
        tracing::warn!(
            open = conns.len(),
            drain_ms = http.drain_timeout_ms,
            "connections still open after the drain time: dropping them"
        );
    } else if open > 0 {
        tracing::info!(connections = open, "drained");
    }
    conns.shutdown().await;
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
