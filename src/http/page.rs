//! The waiting page, `GET /waiting-room/{type}/{id}`: a self-contained HTML page (no CDN, no
//! build step) whose script enters the queue, polls as the server says and sends the admitted
//! buyer to `page.return_url`. Text is Korean or English by `Accept-Language`.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{Html, IntoResponse, Response};
use serde_json::json;

use super::{ApiError, SharedState, TargetPath, User};
use crate::config::{IdentityMode, PageSettings};
use crate::domain::{USER_ID_RULE, UserId};

const DEFAULT_TEMPLATE: &str = include_str!("../../assets/waiting-room.html");
const SCRIPT: &str = include_str!("../../assets/waiting-room.js");
/// Placeholders a custom `page.template` must hold.
const REQUIRED: [&str; 2] = ["{{config}}", "{{script}}"];

/// The page template, read once at start.
pub struct Page {
    template: String,
    settings: PageSettings,
}

impl Page {
    pub fn new(settings: &PageSettings) -> Result<Self, String> {
        let template = match &settings.template {
            None => DEFAULT_TEMPLATE.to_owned(),
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("page.template: cannot read {}: {e}", path.display()))?;
                if let Some(missing) = REQUIRED.iter().find(|p| !text.contains(*p)) {
                    return Err(format!("page.template {} must contain {missing}", path.display()));
                }
                text
            }
        };
        Ok(Self { template, settings: settings.clone() })
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Lang {
    En,
    Ko,
}

/// The first of Korean or English in the client's `Accept-Language`, by weight; English
/// when neither is asked for.
fn language(headers: &HeaderMap) -> Lang {
    let Some(accept) = headers.get(header::ACCEPT_LANGUAGE).and_then(|v| v.to_str().ok()) else {
        return Lang::En;
    };
    let mut best: Option<(f32, Lang)> = None;
    for item in accept.split(',') {
        let mut parts = item.trim().split(';');
        let tag = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let q = parts.find_map(|p| p.trim().strip_prefix("q=").and_then(|q| q.parse::<f32>().ok())).unwrap_or(1.0);
        let lang = match tag.split('-').next() {
            Some("ko") => Lang::Ko,
            Some("en") => Lang::En,
            _ => continue,
        };
        if q > 0.0 && best.is_none_or(|(b, _)| q > b) {
            best = Some((q, lang));
        }
    }
    best.map_or(Lang::En, |(_, l)| l)
}

fn texts(lang: Lang) -> serde_json::Value {
    match lang {
        Lang::En => json!({
            "title": "You are in the queue",
            "position": "your number",
            "ahead": "ahead of you",
            "eta": "estimated wait",
            "noscript": "This page needs JavaScript to hold your place in the queue.",
            "entering": "Joining the queue…",
            "checking": "Checking this browser before giving it a place… {n}%",
            "waiting": "Keep this page open: it moves on by itself when it is your turn.",
            "etaUnderMinute": "under a minute",
            "etaMinutes": "about {n} min",
            "full": "The queue is full — retrying shortly.",
            "reentering": "Your place had expired — joining the queue again.",
            "offline": "The waiting room does not answer — retrying in {n} s.",
            "busy": "Many buyers at once — you keep your place; retrying in a moment.",
            "admitted": "It is your turn!",
            "prequeue": "You are in the pre-queue. The sale opens in {t} (at {at}); then places are drawn at random among everyone here.",
            "scheduled": "The waiting room opens in {t} (at {at}); this page joins it by itself.",
            "paused": "The sale is paused — you keep your place.",
            "closed": "The sale is closed.",
            "hours": "{n} h",
            "minutes": "{n} min",
            "seconds": "{n} s",
        }),
        Lang::Ko => json!({
            "title": "대기열에 들어와 있습니다",
            "position": "내 순번",
            "ahead": "앞 대기 인원",
            "eta": "예상 대기 시간",
            "noscript": "대기 순서를 유지하려면 JavaScript가 필요합니다.",
            "entering": "대기열에 들어가는 중…",
            "checking": "순번을 드리기 전에 브라우저를 확인하는 중… {n}%",
            "waiting": "이 페이지를 열어 두세요. 차례가 되면 자동으로 이동합니다.",
            "etaUnderMinute": "1분 이내",
            "etaMinutes": "약 {n}분",
            "full": "대기열이 가득 찼습니다 — 잠시 후 다시 시도합니다.",
            "reentering": "대기 순서가 만료되어 다시 대기열에 들어갑니다.",
            "offline": "대기실이 응답하지 않습니다 — {n}초 후 다시 시도합니다.",
            "busy": "접속자가 많습니다 — 순서는 그대로 유지되며 잠시 후 다시 시도합니다.",
            "admitted": "차례가 되었습니다!",
            "prequeue": "사전 대기열에 들어와 있습니다. 판매는 {t} 후({at})에 시작되며, 그때 여기 있는 모든 분의 순서를 무작위로 정합니다.",
            "scheduled": "대기실은 {t} 후({at})에 열립니다. 이 페이지가 자동으로 들어갑니다.",
            "paused": "판매가 일시 중지되었습니다 — 순서는 그대로 유지됩니다.",
            "closed": "판매가 종료되었습니다.",
            "hours": "{n}시간",
            "minutes": "{n}분",
            "seconds": "{n}초",
        }),
    }
}

/// Text for HTML: `&`, `<`, `>`, `"` escaped.
fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The user the page is for: `X-User-Id` (set by the authenticating proxy; sent twice, the
/// edge layer has refused the request), or `?user=` when `page.allow_query_user` is on.
fn user(headers: &HeaderMap, query: &HashMap<String, String>, settings: &PageSettings) -> Result<UserId, ApiError> {
    match headers.get("x-user-id") {
        Some(v) => {
            let text =
                v.to_str().map_err(|_| ApiError::invalid(format!("X-User-Id is not a user id: {USER_ID_RULE}")))?;
            text.parse().map_err(|e| ApiError::invalid(format!("X-User-Id: {e}")))
        }
        None => match query.get("user") {
            Some(u) if settings.allow_query_user => u.parse().map_err(|e| ApiError::invalid(format!("?user: {e}"))),
            Some(_) => Err(ApiError::invalid(
                "?user= is off (page.allow_query_user = false): the page takes the user from X-User-Id, set by the authenticating proxy",
            )),
            None => {
                Err(ApiError::invalid("missing X-User-Id header: the authenticating proxy in front of vq must set it"))
            }
        },
    }
}

pub async fn waiting_room(
    State(st): State<SharedState>,
    TargetPath(target): TargetPath,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let page = &st.page;
    let user = match st.service.settings().identity.mode {
        IdentityMode::Header => User { id: user(&headers, &query, &page.settings)?, visitor: None },
        IdentityMode::Visitor => User::visitor(&headers, &st)?,
    };
    let lang = language(&headers);
    let text = texts(lang);
    let config = json!({
        "type": &*target.kind.slug(),
        "id": target.id,
        "user": user.id.as_str(),
        // Visitor mode: the page sends no X-User-Id; its cookie names the visitor.
        "visitor": user.visitor.is_some(),
        "returnUrl": page.settings.return_url,
        "embedOrigin": page.settings.embed_origin,
        "text": text,
    });
    // Inside <script>, `</` would end the element: JSON allows `\/` for `/`.
    let config = config.to_string().replace("</", "<\\/");
    let label = |k: &str| html_escape(text[k].as_str().unwrap_or_default());
    let html = page
        .template
        .replace("{{lang}}", if lang == Lang::Ko { "ko" } else { "en" })
        .replace("{{title}}", &label("title"))
        .replace("{{position_label}}", &label("position"))
        .replace("{{ahead_label}}", &label("ahead"))
        .replace("{{eta_label}}", &label("eta"))
        .replace("{{noscript}}", &label("noscript"))
        .replace("{{script}}", SCRIPT)
        .replace("{{config}}", &config);
    let mut resp = Html(html).into_response();
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::VARY, HeaderValue::from_static("Accept-Language, X-User-Id, Cookie"));
    h.insert(header::HeaderName::from_static("x-content-type-options"), HeaderValue::from_static("nosniff"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; script-src 'unsafe-inline' blob:; worker-src blob:; style-src 'unsafe-inline'; connect-src 'self'"),
    );
    Ok(user.set_cookie(st.service.settings(), resp))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT_LANGUAGE, v.parse().unwrap());
        h
    }

    #[test]
    fn language_follows_accept_language_weights() {
        assert_eq!(language(&HeaderMap::new()), Lang::En);
        assert_eq!(language(&accept("ko-KR,ko;q=0.9,en-US;q=0.8")), Lang::Ko);
        assert_eq!(language(&accept("en-US,en;q=0.9,ko;q=0.8")), Lang::En);
        assert_eq!(language(&accept("fr-FR, ko;q=0.5")), Lang::Ko);
        assert_eq!(language(&accept("en;q=0.2, ko;q=0.7")), Lang::Ko);
        assert_eq!(language(&accept("de")), Lang::En);
        assert_eq!(language(&accept("ko;q=0")), Lang::En);
    }

    #[test]
    fn both_languages_have_every_text() {
        let (en, ko) = (texts(Lang::En), texts(Lang::Ko));
        let keys = |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&en), keys(&ko));
    }

    #[test]
    fn a_custom_template_needs_its_placeholders() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("page.html");
        std::fs::write(&path, "<html>{{config}}</html>").unwrap();
        let s = PageSettings { template: Some(path.clone()), ..Default::default() };
        assert!(Page::new(&s).err().unwrap().contains("{{script}}"));
        std::fs::write(&path, "<html>{{config}}<script>{{script}}</script></html>").unwrap();
        assert!(Page::new(&s).is_ok());
        let s = PageSettings { template: Some(dir.path().join("nope.html")), ..Default::default() };
        assert!(Page::new(&s).err().unwrap().contains("nope.html"));
    }
}
