//! The shipped nginx configs (`deploy/nginx/vq.conf`, `deploy/nginx/auth-request.conf`) in
//! front of the purchase API stand-in: what it receives is what the gate checked, as with vq
//! alone (`forwarding.rs`), and the waiting page answers through both.

use crate::forwarding::{BAD_BODIES, framed, rerouting_headers, rerouting_seen};
use crate::rig::{Nginx, Rig, Seen, auth_request_conf, send_bytes, send_raw, token, vq_conf};
use crate::support::{free_port, secret};

const CONFIGS: [&str; 2] = ["vq.conf", "auth-request.conf"];

/// nginx running `name` with the stand-in login in front of `rig`.
async fn nginx(rig: &Rig, name: &str) -> Nginx {
    let port = free_port();
    let site = match name {
        "vq.conf" => vq_conf(rig.vq(), port, true),
        _ => auth_request_conf(rig.vq(), &rig.backend, port, true),
    };
    Nginx::start(site, port).await
}

/// A request with `Host: evil.example` and `headers`, as raw bytes.
fn request(method: &str, target: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut r =
        format!("{method} {target} HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\nContent-Length: 0\r\n");
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("\r\n");
    r.into_bytes()
}

#[tokio::test]
async fn both_nginx_configs_forward_only_what_the_gate_checked() {
    let rig = Rig::start_with(|s| s.gate.pace = false).await;
    for (user, name) in (60u64..).step_by(2).zip(CONFIGS) {
        let nginx = nginx(&rig, name).await;
        let log = || nginx.error_log();
        // `Connection` naming the identity headers drops neither.
        let (u, t) = (user.to_string(), token(user));
        let who = [("X-Authenticated-User", u.as_str()), ("X-Entry-Token", t.as_str())];
        let trick = [who[0], who[1], ("Connection", "X-User-Id, X-Entry-Token")];
        let (status, text) = send_bytes(&nginx.addr(), request("POST", "/limited-drops/1/orders", &trick)).await;
        assert_eq!(status, 200, "{name}: {text}\n{}", log());
        let seen = rig.recorder.take();
        assert_eq!(seen.len(), 1, "{name}: {seen:#?}");
        assert_eq!((seen[0].all("x-user-id"), seen[0].all("x-entry-token")), (vec![u.as_str()], vec![t.as_str()]));

        // No re-routing header (either spelling) and no client Host, on a gated purchase and
        // on a path that is not gated.
        let (u, t) = ((user + 1).to_string(), token(user + 1));
        let rerouting = rerouting_headers();
        let mut sent: Vec<(&str, &str)> = rerouting.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        sent.extend([("X-Authenticated-User", u.as_str()), ("X-Entry-Token", t.as_str()), ("X_User_Id", "8")]);
        for target in ["/limited-drops/1/orders", "/limited-drops/1"] {
            let (status, text) = send_bytes(&nginx.addr(), request("POST", target, &sent)).await;
            assert_eq!(status, 200, "{name} {target}: {text}\n{}", log());
        }
        let seen = rig.recorder.take();
        let targets: Vec<&str> = seen.iter().map(|s| s.target.as_str()).collect();
        assert_eq!(targets, ["/limited-drops/1/orders", "/limited-drops/1"], "{name}");
        for s in &seen {
            assert_eq!(rerouting_seen(s), Vec::<String>::new(), "{name} {}", s.target);
            assert_eq!(s.all("host"), [rig.backend.as_str()], "{name} {}: the purchase API's own name", s.target);
            assert_eq!(s.all("x-user-id"), [u.as_str()], "{name}");
            assert!(s.all("x_user_id").is_empty(), "{name}");
        }
    }
}

/// What nginx made of a malformed body: a 4xx, or a body it decoded itself and sent on
/// re-framed (nginx reads bare-LF chunk lines), never a 5xx.
#[tokio::test]
async fn malformed_bodies_through_either_nginx_config_are_never_a_5xx() {
    let rig = Rig::start_with(|s| s.gate.pace = false).await;
    for (user, name) in (70u64..).step_by(20).zip(CONFIGS) {
        let nginx = nginx(&rig, name).await;
        for (user, (what, framing)) in (user..).zip(BAD_BODIES) {
            let (u, t) = (user.to_string(), token(user));
            let who = [("X-Authenticated-User", u.as_str()), ("X-Entry-Token", t.as_str())];
            for target in ["/limited-drops/1/orders", "/limited-drops/1"] {
                let (status, text) = send_bytes(&nginx.addr(), framed(target, &who, framing)).await;
                let seen: Vec<Seen> = rig.recorder.take();
                let context = format!("{name}, {what} on {target}: {text}\n{seen:#?}\n{}", nginx.error_log());
                if status == 200 {
                    // Decoded by nginx, then sent on with a Content-Length: vq and the purchase
                    // API see the same body.
                    assert_eq!(seen.len(), 1, "{context}");
                    assert_eq!(seen[0].body.as_deref(), Ok(&b"hello"[..]), "{context}");
                    assert_eq!((seen[0].all("content-length"), seen[0].all("transfer-encoding")), (vec!["5"], vec![]));
                } else {
                    assert_eq!(status, 400, "{context}");
                    assert!(seen.iter().all(|s| s.body.is_err()), "{context}");
                }
                // nginx's 501 for a coding it does not know, mapped to the client's 400 (the rest are
                // nginx's own 400 pages).
                if *what == "Transfer-Encoding: chunked, chunked" {
                    assert!(text.contains("\"code\":\"INVALID_REQUEST\""), "{context}");
                }
            }
        }
    }
}

#[tokio::test]
async fn the_waiting_page_answers_through_both_nginx_configs() {
    let rig = Rig::start().await;
    for name in CONFIGS {
        let nginx = nginx(&rig, name).await;
        let me = [("X-Authenticated-User", "7")];
        let (status, text) = send_raw(&nginx.addr(), "GET", "/waiting-room/limited-drop/1", &me).await;
        assert_eq!(status, 200, "{name}: {text}\n{}", nginx.error_log());
        assert!(text.contains("text/html") && text.contains("\"user\":\"7\""), "{name}: vq's page: {text}");
        // What the page loads: its script and styles are inline; it calls the queue API.
        let (status, text) = send_raw(&nginx.addr(), "POST", "/virtual-queues/limited-drop/1/entries", &me).await;
        assert_eq!(status, 200, "{name}: {text}");
        let (status, text) = send_raw(&nginx.addr(), "GET", "/virtual-queues/limited-drop/1/entries/me", &me).await;
        assert_eq!(status, 200, "{name}: {text}");
    }
    let seen = rig.recorder.take();
    assert!(seen.is_empty(), "the purchase API got the page's requests: {seen:#?}");
}

/// Visitor mode behind either shipped config, set up as docs/deploy.md says (the AUTH LAYER
/// left empty; `auth-request.conf` taking the visitor's id from the check): a visitor enters
/// without any identity from nginx, buys with their cookie, and the purchase API learns the
/// visitor's id whatever the client claims; another visitor's cookie does not buy.
#[tokio::test]
async fn visitors_enter_and_buy_through_both_nginx_configs() {
    let rig = Rig::start_with(|s| {
        s.gate.pace = false;
        s.identity.mode = vq::config::IdentityMode::Visitor;
    })
    .await;
    for name in CONFIGS {
        let port = free_port();
        let site = match name {
            "vq.conf" => vq_conf(rig.vq(), port, false),
            // The shipped line for visitor mode, uncommented.
            _ => auth_request_conf(rig.vq(), &rig.backend, port, false).replace(
                "# auth_request_set $vq_user_id $upstream_http_x_user_id;",
                "auth_request_set $vq_user_id $upstream_http_x_user_id;",
            ),
        };
        let nginx = Nginx::start(site, port).await;
        let enter = |cookie: Option<String>| {
            let addr = nginx.addr();
            async move {
                let headers: Vec<(&str, &str)> = cookie.as_deref().map(|c| vec![("Cookie", c)]).unwrap_or_default();
                send_raw(&addr, "POST", "/virtual-queues/limited-drop/1/entries", &headers).await
            }
        };
        let (status, text) = enter(None).await;
        assert_eq!(status, 200, "{name}: {text}\n{}", nginx.error_log());
        let visitor_token = text
            .lines()
            .find_map(|l| l.strip_prefix("set-cookie: __Host-vq_visitor=")?.split(';').next())
            .unwrap_or_else(|| panic!("{name}: no visitor cookie: {text}"))
            .to_owned();
        let (_, other) = enter(None).await;
        let other_token =
            other.lines().find_map(|l| l.strip_prefix("set-cookie: __Host-vq_visitor=")?.split(';').next());
        let visitor = visitor_token.split_once('.').unwrap().0.to_owned();
        let now = vq::service::now_epoch_ms() / 1000;
        let entry =
            vq::token::mint(&secret(), "LIMITED_DROP:1".parse().unwrap(), &visitor.parse().unwrap(), now, 300).raw;

        let buy = |cookie: String| {
            let addr = nginx.addr();
            let entry = entry.clone();
            async move {
                let h = [("Cookie", cookie.as_str()), ("X-Entry-Token", entry.as_str()), ("X-User-Id", "someone-else")];
                send_raw(&addr, "POST", "/limited-drops/1/orders", &h).await
            }
        };
        let (status, text) = buy(format!("__Host-vq_visitor={}", other_token.unwrap())).await;
        assert_eq!(status, 403, "{name}: another visitor's cookie: {text}");
        let (status, text) = buy(format!("__Host-vq_visitor={visitor_token}")).await;
        assert_eq!(status, 200, "{name}: {text}\n{}", nginx.error_log());
        let seen = rig.recorder.take();
        assert_eq!(seen.len(), 1, "{name}: {seen:#?}");
        assert_eq!(seen[0].all("x-user-id"), [visitor.as_str()], "{name}: the purchase API hears of the visitor");
    }
}
