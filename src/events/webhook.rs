//! Delivering the event logs to a webhook: each event POSTed as JSON, signed with the
//! webhook's secret (HMAC-SHA256 over `timestamp.body`), retried with exponential backoff
//! until it is taken (a 2xx), in each log's order, at least once: the id
//! (`X-Vq-Event-Id`) is what the receiver deduplicates by.
//!
//! One instance delivers to a webhook at a time: the holder of its lease (renewed before
//! every attempt and while waiting to retry). Where each log was delivered to is stored
//! (the webhook's cursor), so another instance, or this one restarted, goes on from there.
//! Every attempt is bounded by `events.timeout_ms`; nothing but this task waits for it.

use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::domain::{Event, EventId};
use crate::store::prelude::*;
use crate::store::{AnyStore, StoreError};
use crate::token::Secret;

/// The scheme of `X-Vq-Signature` (`v1=<hex>`): HMAC-SHA256 of `<X-Vq-Timestamp>.<body>`.
pub const SIGNATURE_VERSION: &str = "v1";

/// Events read from a log per round.
const PAGE: usize = 100;

/// One webhook, ready to deliver to.
#[derive(Clone)]
pub struct Webhook {
    pub name: String,
    pub url: String,
    secret: Secret,
}

/// Why the webhooks cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("events webhook `{name}`: its signing secret {env} is not set (export {env}=<at least 32 random bytes>)")]
    NoSecret { name: String, env: String },
    #[error("events webhook `{name}`: {source}")]
    BadSecret { name: String, source: crate::token::SecretError },
}

impl Webhook {
    pub fn new(name: impl Into<String>, url: impl Into<String>, secret: Secret) -> Self {
        Self { name: name.into(), url: url.into(), secret }
    }
}

/// The configured webhooks with their secrets from the environment (each names its variable;
/// `VQ_EVENTS_SECRET` by default). A missing or weak secret is an error naming it.
pub fn webhooks_from_env(settings: &Settings) -> Result<Vec<Webhook>, WebhookError> {
    settings
        .events
        .all_webhooks()
        .into_iter()
        .map(|w| {
            let env = w.secret_env().to_owned();
            let value = std::env::var(&env)
                .ok()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| WebhookError::NoSecret { name: w.name.clone(), env: env.clone() })?;
            let secret = Secret::from_source(value.into_bytes(), &env)
                .map_err(|source| WebhookError::BadSecret { name: w.name.clone(), source })?;
            Ok(Webhook::new(w.name, w.url, secret))
        })
        .collect()
}

/// `X-Vq-Signature` of `body` sent at `timestamp` (epoch s): `v1=` and the lowercase hex
/// HMAC-SHA256 of `<timestamp>.<body>` with the webhook's secret.
pub fn sign(secret: &Secret, timestamp: u64, body: &str) -> String {
    let payload = format!("{timestamp}.{body}");
    format!("{SIGNATURE_VERSION}={}", crate::domain::hex(&secret.sign(payload.as_bytes())))
}

/// How a delivery waits and retries (`[events]`).
#[derive(Debug, Clone, Copy)]
pub struct DeliveryOptions {
    pub timeout: Duration,
    pub retry_min: Duration,
    pub retry_max: Duration,
    pub poll: Duration,
}

impl DeliveryOptions {
    pub fn of(settings: &Settings) -> Self {
        let e = &settings.events;
        Self {
            timeout: Duration::from_millis(e.timeout_ms),
            retry_min: Duration::from_millis(e.retry_min_ms),
            retry_max: Duration::from_millis(e.retry_max_ms),
            poll: Duration::from_millis(e.poll_ms),
        }
    }

    /// The lease outlives an attempt and the poll between renewals.
    fn lease_ms(&self) -> u64 {
        (self.timeout + self.poll * 2).as_millis() as u64 + 1000
    }

    /// The wait after the `failures`-th failed attempt in a row: `retry_min` doubled each
    /// time, at most `retry_max`.
    pub fn backoff(&self, failures: u32) -> Duration {
        let doubled = self.retry_min.saturating_mul(1u32 << failures.saturating_sub(1).min(20));
        doubled.min(self.retry_max)
    }
}

/// The delivery of every event log to one webhook, by whichever instance holds its lease.
pub struct Delivery {
    store: AnyStore,
    webhook: Webhook,
    options: DeliveryOptions,
    /// This instance, in the lease.
    holder: String,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// Why an event is not delivered now.
enum Stop {
    /// Another instance holds the lease, or the instance is stopping.
    Yield,
    Store(StoreError),
}

impl From<StoreError> for Stop {
    fn from(e: StoreError) -> Self {
        Stop::Store(e)
    }
}

impl Delivery {
    pub fn new(store: AnyStore, webhook: Webhook, options: DeliveryOptions, holder: String) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(options.timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(connector);
        Self { store, webhook, options, holder, client }
    }

    /// Delivers until `cancel`: every `events.poll_ms`, if this instance holds the lease, every
    /// new event of every log, in order.
    pub async fn run(self, cancel: CancellationToken) {
        tracing::info!(webhook = %self.webhook.name, url = %self.webhook.url, "event delivery started");
        loop {
            match self.round(&cancel).await {
                Ok(()) | Err(Stop::Yield) => {}
                Err(Stop::Store(e)) => {
                    tracing::debug!(webhook = %self.webhook.name, error = %e, "event delivery: store unavailable")
                }
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(self.options.poll) => {}
            }
        }
    }

    /// One pass over the logs, if this instance holds the lease.
    async fn round(&self, cancel: &CancellationToken) -> Result<(), Stop> {
        if !self.hold_lease().await? {
            return Ok(());
        }
        let name = &self.webhook.name;
        for log in super::event_logs(&self.store).await? {
            let mut after = self.store.event_cursor(name, log).await?.unwrap_or(EventId::ZERO);
            loop {
                let page = self.store.read_events(log, after, PAGE).await?;
                for event in &page {
                    self.deliver(event, cancel).await?;
                    self.store.save_event_cursor(name, log, event.id).await?;
                    after = event.id;
                }
                if page.len() < PAGE {
                    break;
                }
            }
        }
        Ok(())
    }

    async fn hold_lease(&self) -> Result<bool, StoreError> {
        self.store.lease_events(&self.webhook.name, &self.holder, self.options.lease_ms()).await
    }

    /// Sends `event` until the webhook takes it, waiting longer after each failure; stops when
    /// the lease is lost or the instance stops (the event stays for the next holder).
    async fn deliver(&self, event: &Event, cancel: &CancellationToken) -> Result<(), Stop> {
        let name = &self.webhook.name;
        let body = event.to_json();
        let mut failures = 0u32;
        loop {
            if !self.hold_lease().await? {
                return Err(Stop::Yield);
            }
            if failures > 0 {
                crate::metrics::webhook_delivery(name, "retried");
            }
            let attempt = tokio::select! {
                () = cancel.cancelled() => return Err(Stop::Yield),
                result = self.attempt(event, &body) => result,
            };
            match attempt {
                Ok(()) => {
                    crate::metrics::webhook_delivery(name, "delivered");
                    return Ok(());
                }
                Err(why) => {
                    crate::metrics::webhook_delivery(name, "failed");
                    failures += 1;
                    let wait = self.options.backoff(failures);
                    tracing::warn!(
                        webhook = %name, event = %event.wire_id(), attempt = failures, retry_in_ms = wait.as_millis() as u64,
                        "webhook did not take the event: {why}"
                    );
                    self.wait_holding(wait, cancel).await?;
                }
            }
        }
    }

    /// Waits `wait`, renewing the lease every poll; `Stop::Yield` when it is lost or on cancel.
    async fn wait_holding(&self, wait: Duration, cancel: &CancellationToken) -> Result<(), Stop> {
        let until = tokio::time::Instant::now() + wait;
        loop {
            let now = tokio::time::Instant::now();
            if now >= until {
                return Ok(());
            }
            tokio::select! {
                () = cancel.cancelled() => return Err(Stop::Yield),
                () = tokio::time::sleep((until - now).min(self.options.poll)) => {}
            }
            if !self.hold_lease().await? {
                return Err(Stop::Yield);
            }
        }
    }

    /// One POST of `body`, within `events.timeout_ms`; a 2xx takes it.
    async fn attempt(&self, event: &Event, body: &str) -> Result<(), String> {
        let timestamp = self.store.now_ms() / 1000;
        let request = hyper::Request::post(self.webhook.url.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(hyper::header::USER_AGENT, concat!("vq/", env!("CARGO_PKG_VERSION")))
            .header("X-Vq-Event-Id", event.wire_id())
            .header("X-Vq-Event-Type", event.kind.name())
            .header("X-Vq-Timestamp", timestamp.to_string())
            .header("X-Vq-Signature", sign(&self.webhook.secret, timestamp, body))
            .body(Full::new(Bytes::from(body.to_owned())))
            .map_err(|e| format!("cannot build the request: {e}"))?;
        let sent = async {
            let response = self.client.request(request).await.map_err(|e| format!("{e}"))?;
            let status = response.status();
            // The answer's body is not read: dropping it closes the connection if unread.
            if status.is_success() { Ok(()) } else { Err(format!("answered {status}")) }
        };
        match tokio::time::timeout(self.options.timeout, sent).await {
            Ok(result) => result,
            Err(_) => Err(format!("no answer within {} ms", self.options.timeout.as_millis())),
        }
    }
}
