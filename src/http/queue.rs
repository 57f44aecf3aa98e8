//! Handlers of the queue API and the health probes.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::{ApiError, AppState, ErrorCode, SharedState, TargetPath, User};
use crate::domain::{format_instant, poll_after_seconds};
use crate::service::{EntryCheck, LaneProof, QueueStats, QueueStatus};
use crate::store::prelude::*;

/// `Retry-After` of a 503 while Redis is unreachable: the flag refresher probes it every second.
const STORE_RETRY_AFTER_S: u64 = 2;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusBody {
    status: &'static str,
    position: Option<u64>,
    ahead_count: u64,
    /// `None` (null) while the sale is paused: nobody is admitted until it resumes, so any
    /// estimate would be a promise the queue does not keep.
    eta_seconds: Option<u64>,
    entry_token: Option<String>,
    token_expires_at: Option<String>,
    /// Seconds until the next poll, for waiting and pre-queued users (also sent as `Retry-After`).
    #[serde(skip_serializing_if = "Option::is_none")]
    poll_after_seconds: Option<u64>,
    /// The sale's opening (SCHEDULED, PRE_QUEUE), ISO-8601.
    #[serde(skip_serializing_if = "Option::is_none")]
    opens_at: Option<String>,
    /// When entries start being recorded (SCHEDULED), ISO-8601.
    #[serde(skip_serializing_if = "Option::is_none")]
    prequeue_opens_at: Option<String>,
    /// Why the sale is closed (CLOSED).
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    /// Present (true) while the sale is paused: nobody is admitted until it resumes.
    #[serde(skip_serializing_if = "Option::is_none")]
    paused: Option<bool>,
    /// `identity.mode = "visitor"`: who the visitor is, for apps that keep no cookies (sent
    /// back as `X-Visitor-Token`).
    #[serde(skip_serializing_if = "Option::is_none")]
    visitor_token: Option<String>,
    /// CHALLENGE: the proof of work to solve before entering.
    #[serde(skip_serializing_if = "Option::is_none")]
    challenge: Option<ChallengeBody>,
    /// WAITING in a target with lanes: the lane (`public` or one a code or claim joined), in
    /// which `position` and `aheadCount` count.
    #[serde(skip_serializing_if = "Option::is_none")]
    lane: Option<String>,
}

/// The enter request's optional body: a proof of a lane.
#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct EnterBody {
    /// An access code the shop issued (`vq lane codes import`).
    lane_code: Option<String>,
    /// A lane claim the shop signed (as `X-VQ-Lane` carries it).
    lane_claim: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ChallengeBody {
    seed: String,
    bits: u8,
    expires_at: String,
}

impl StatusBody {
    fn sale(status: &'static str) -> Self {
        Self {
            status,
            position: None,
            ahead_count: 0,
            eta_seconds: Some(0),
            entry_token: None,
            token_expires_at: None,
            poll_after_seconds: None,
            opens_at: None,
            prequeue_opens_at: None,
            message: None,
            paused: None,
            visitor_token: None,
            challenge: None,
            lane: None,
        }
    }
}

impl From<QueueStatus> for StatusBody {
    fn from(s: QueueStatus) -> Self {
        let admitted = if matches!(s, QueueStatus::Admitted(_)) { "ADMITTED" } else { "DIRECT_ADMITTED" };
        match s {
            QueueStatus::Waiting { position, ahead, eta_seconds, paused, lane } => Self {
                position: Some(position),
                lane: lane.map(|l| l.shown().to_owned()),
                ahead_count: ahead,
                eta_seconds: (!paused).then_some(eta_seconds),
                paused: paused.then_some(true),
                ..Self::sale("WAITING")
            },
            QueueStatus::Admitted(t) | QueueStatus::DirectAdmitted(t) => Self {
                token_expires_at: Some(format_instant(t.expires_at * 1000)),
                entry_token: Some(t.raw),
                ..Self::sale(admitted)
            },
            QueueStatus::PreQueue { opens_at_ms, paused } => Self {
                eta_seconds: (!paused).then_some(0),
                opens_at: Some(format_instant(opens_at_ms)),
                paused: paused.then_some(true),
                ..Self::sale("PRE_QUEUE")
            },
            QueueStatus::Scheduled { opens_at_ms, prequeue_from_ms } => Self {
                opens_at: Some(format_instant(opens_at_ms)),
                prequeue_opens_at: Some(format_instant(prequeue_from_ms.unwrap_or(opens_at_ms))),
                ..Self::sale("SCHEDULED")
            },
            QueueStatus::Closed { message } => Self { message: Some(message), ..Self::sale("CLOSED") },
        }
    }
}

/// The answer to enter and poll: a waiting user is told when to poll next, in the body and
/// as `Retry-After`.
fn answer(st: &AppState, user: &User, status: QueueStatus) -> Response {
    let q = &st.service.settings().queue;
    let poll_after = match &status {
        QueueStatus::Waiting { eta_seconds, .. } => {
            Some(poll_after_seconds(*eta_seconds, q.tick_ms, q.heartbeat_timeout_s))
        }
        // A pre-queued user heartbeats like a waiting one; the opening is their ETA.
        QueueStatus::PreQueue { opens_at_ms, .. } => {
            let until_s = opens_at_ms.saturating_sub(st.service.now_ms()) / 1000;
            Some(poll_after_seconds(until_s, q.tick_ms, q.heartbeat_timeout_s))
        }
        QueueStatus::Admitted(_)
        | QueueStatus::DirectAdmitted(_)
        | QueueStatus::Scheduled { .. }
        | QueueStatus::Closed { .. } => None,
    };
    let mut body = StatusBody::from(status);
    body.poll_after_seconds = poll_after;
    body.visitor_token = user.visitor.as_ref().map(|(token, _)| token.clone());
    let mut resp = Json(body).into_response();
    if let Some(s) = poll_after {
        resp.headers_mut().insert(header::RETRY_AFTER, s.into());
    }
    resp
}

/// `X-Pow-Seed` and `X-Pow-Nonce`: a solution when both are there (either alone is not one,
/// and is ignored); a nonce of another form than 1 to 64 letters and digits is a 400. The
/// rest is [`crate::pow::check`]'s.
fn pow_solution(headers: &HeaderMap) -> Result<Option<(&str, &str)>, ApiError> {
    let text = |name: &str| headers.get(name).map(|v| v.to_str().unwrap_or("\u{0}"));
    let nonce = text("x-pow-nonce");
    if nonce.is_some_and(|n| !crate::pow::is_nonce(n)) {
        return Err(ApiError::invalid("X-Pow-Nonce: expected 1 to 64 letters and digits"));
    }
    Ok(text("x-pow-seed").zip(nonce))
}

/// The proof of a lane an enter brings: `laneCode` or `laneClaim` in a JSON body, or the
/// claim in `X-VQ-Lane`; none without a body or header. A body that is not such JSON is a 400.
fn lane_proof(headers: &HeaderMap, body: &[u8]) -> Result<Option<LaneProof>, ApiError> {
    let parsed: EnterBody = match body.iter().all(u8::is_ascii_whitespace) {
        true => EnterBody::default(),
        false => serde_json::from_slice(body).map_err(|e| {
            ApiError::invalid(format!("the enter body must be JSON such as {{\"laneCode\": \"…\"}}: {e}"))
        })?,
    };
    let header = match headers.get("x-vq-lane").map(|v| v.to_str()) {
        Some(Ok(v)) => Some(v.to_owned()),
        Some(Err(_)) => {
            return Err(ApiError::new(ErrorCode::LaneClaimInvalid, "X-VQ-Lane: not visible ASCII".to_owned()));
        }
        None => None,
    };
    Ok(match (parsed.lane_code, parsed.lane_claim.or(header)) {
        (Some(code), _) => Some(LaneProof::Code(code)),
        (None, Some(claim)) => Some(LaneProof::Claim(claim)),
        (None, None) => None,
    })
}

/// An enter. With proof of work on, a new user first gets a challenge (`status` CHALLENGE, no
/// place) and enters with its solution in `X-Pow-Seed` and `X-Pow-Nonce`.
pub async fn enter(
    State(st): State<SharedState>,
    TargetPath(t): TargetPath,
    user: User,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let solution = match pow_solution(&headers) {
        Ok(s) => s,
        Err(e) => return user.set_cookie(st.service.settings(), e.into_response()),
    };
    let proof = match lane_proof(&headers, &body) {
        Ok(p) => p,
        Err(e) => return user.set_cookie(st.service.settings(), e.into_response()),
    };
    let resp = match st.service.entry_check(t, &user.id, solution).await {
        EntryCheck::Proceed => match st.service.enter_with(t, &user.id, proof).await {
            Ok(status) => answer(&st, &user, status),
            Err(e) => ApiError::from(e).into_response(),
        },
        EntryCheck::Challenge(c) => {
            let mut body = StatusBody::sale("CHALLENGE");
            body.eta_seconds = None;
            body.visitor_token = user.visitor.as_ref().map(|(token, _)| token.clone());
            let expires_at = format_instant(c.expires_at * 1000);
            body.challenge = Some(ChallengeBody { seed: c.seed, bits: c.bits, expires_at });
            Json(body).into_response()
        }
        EntryCheck::Refused(e) => ApiError::new(ErrorCode::PowRefused, e.to_string()).into_response(),
    };
    user.set_cookie(st.service.settings(), resp)
}

pub async fn poll(State(st): State<SharedState>, TargetPath(t): TargetPath, user: User) -> Response {
    let resp = match st.service.status(t, &user.id).await {
        Ok(status) => answer(&st, &user, status),
        Err(e) => ApiError::from(e).into_response(),
    };
    user.set_cookie(st.service.settings(), resp)
}

pub async fn leave(State(st): State<SharedState>, TargetPath(t): TargetPath, user: User) -> Response {
    st.service.leave(t, &user.id).await;
    user.set_cookie(st.service.settings(), StatusCode::NO_CONTENT.into_response())
}

pub async fn stats(State(st): State<SharedState>, TargetPath(t): TargetPath) -> Result<Json<QueueStats>, ApiError> {
    st.service.stats(t).await.map(Json).map_err(|e| {
        tracing::warn!(error = %e, "stats unavailable");
        ApiError::new(ErrorCode::StoreUnavailable, "queue figures are unavailable while Redis is unreachable")
            .retry_after(STORE_RETRY_AFTER_S)
    })
}

pub async fn healthz() -> impl IntoResponse {
    Json(serde_json::json!({"status": "ok"}))
}

/// Ready as long as the process serves: with Redis down vq still answers (fail-open), and
/// with the flag hash lost it keeps the last known flag, so the probe reports both (and the
/// Redis nodes its liveness probe finds silent) without taking the instance out of rotation.
pub async fn readyz(State(st): State<SharedState>) -> impl IntoResponse {
    // Answered in time whatever Redis does: a node the liveness probe finds silent is
    // unreachable without asking it (a stalled node would hold a PING for the client's whole
    // response timeout), and the PING is bounded by `redis.timeout_ms`.
    let silent = st.service.store.silent_nodes();
    let ping = tokio::time::timeout(st.service.settings().redis_timeout(), st.service.store.ping());
    let store = if silent.is_empty() && matches!(ping.await, Ok(Ok(()))) { "ok" } else { "unreachable" };
    let applied = st.service.flag();
    let mut flag = serde_json::json!({"version": applied.version, "state": applied.summary(), "missing": false});
    if st.service.flag_missing() {
        flag["missing"] = true.into();
        flag["detail"] = "the flag hash virtual-queue:flag is missing from Redis: this instance keeps its last known \
                          flag; re-assert it with `vq flag on` or `vq flag off`"
            .into();
    }
    // This host's clock against Redis': vq decides by Redis' clock, the operator should still
    // know when a host's clock is wrong.
    let clock = match st.service.clock_offset_ms() {
        None => serde_json::json!({"offsetMs": null, "detail": "not measured yet"}),
        Some(o) if o.unsigned_abs() > crate::service::CLOCK_OFF_MS => serde_json::json!({
            "offsetMs": o,
            "detail": format!(
                "this host's clock is {} ms {} Redis' clock: vq decides by Redis' clock, but fix this host's time sync",
                o.unsigned_abs(),
                if o > 0 { "behind" } else { "ahead of" }
            )
        }),
        Some(o) => serde_json::json!({"offsetMs": o}),
    };
    // The nodes the liveness probe finds silent: their users fail open (or closed) while the
    // rest of a cluster serves.
    Json(serde_json::json!({"status": "ready", "store": store, "flag": flag, "clock": clock, "silentNodes": silent}))
}
