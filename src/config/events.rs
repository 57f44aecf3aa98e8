//! `[events]`: the event logs and the webhooks they are delivered to.

use serde::{Deserialize, Serialize};

/// The environment variable holding the secret of `events.webhook_urls` (and of every
/// `[[events.webhooks]]` without a `secret_env` of its own).
pub const EVENTS_SECRET_ENV: &str = "VQ_EVENTS_SECRET";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventsSettings {
    /// Entries each event log keeps, about (Redis trims with `XADD MAXLEN ~`).
    pub max_len: u64,
    /// An `admission.milestone` event each time a target's admitted users pass a multiple of
    /// this; 0: none.
    pub admitted_every: u64,
    /// Webhooks by URL alone, each signed with the secret in `VQ_EVENTS_SECRET`.
    pub webhook_urls: Vec<String>,
    pub webhooks: Vec<WebhookSettings>,
    /// One delivery attempt, connection to answer; past it the attempt failed (and is retried).
    pub timeout_ms: u64,
    /// The first retry's wait; each next one doubles, up to `retry_max_ms`.
    pub retry_min_ms: u64,
    pub retry_max_ms: u64,
    /// How often the delivering instance looks for new events.
    pub poll_ms: u64,
}

/// One webhook (`[[events.webhooks]]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSettings {
    /// Names the webhook in its cursor, lease, logs and metrics: keep it when the URL changes,
    /// and the webhook goes on where it was. Letters, digits, `-` and `_`.
    pub name: String,
    /// `http://host[:port]/path`.
    pub url: String,
    /// The environment variable holding its signing secret (default `VQ_EVENTS_SECRET`); not
    /// starting with `VQ_` unless it is that one (those are configuration keys).
    #[serde(default)]
    pub secret_env: Option<String>,
}

impl Default for EventsSettings {
    fn default() -> Self {
        Self {
            max_len: 10_000,
            admitted_every: 1000,
            webhook_urls: Vec::new(),
            webhooks: Vec::new(),
            timeout_ms: 5000,
            retry_min_ms: 500,
            retry_max_ms: 60_000,
            poll_ms: 500,
        }
    }
}

impl EventsSettings {
    /// Every webhook: `[[events.webhooks]]`, then `events.webhook_urls` (named by their URL).
    pub fn all_webhooks(&self) -> Vec<WebhookSettings> {
        let by_url =
            self.webhook_urls.iter().map(|u| WebhookSettings { name: u.clone(), url: u.clone(), secret_env: None });
        self.webhooks.iter().cloned().chain(by_url).collect()
    }
}

impl WebhookSettings {
    /// The environment variable holding its secret.
    pub fn secret_env(&self) -> &str {
        self.secret_env.as_deref().unwrap_or(EVENTS_SECRET_ENV)
    }
}

/// Whether `url` is an `http://` URL with a host that vq can deliver to; why not, otherwise.
pub(super) fn webhook_url_problem(url: &str) -> Option<&'static str> {
    if url.starts_with("https://") {
        return Some("https is not supported: vq's client speaks plain HTTP (deliver to a relay on the same host)");
    }
    let Ok(uri) = url.parse::<axum::http::Uri>() else { return Some("not a URL") };
    if uri.scheme_str() != Some("http") {
        return Some("not an http:// URL");
    }
    match uri.host() {
        Some(h) if !h.is_empty() => None,
        _ => Some("no host"),
    }
}

/// Whether `name` can name a webhook.
pub(super) fn is_webhook_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}
