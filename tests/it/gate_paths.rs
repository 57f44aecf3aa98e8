//! Spellings of the gated routes, sent as raw request lines (an HTTP client would normalise
//! them), straight to vq and through a real nginx running the shipped configs
//! (`deploy/nginx/*.conf`, ports templated): the upstream never receives one without a valid
//! token, and never the client's own `X-User-Id`.

use crate::rig::{AUTH_LAYER, Nginx, Recorder, Rig, auth_request_conf, send_raw, shipped, token, vq_conf};
use crate::support::free_port;

/// Request targets that a common upstream (Spring, Tomcat, Express, nginx) may route to
/// `POST /limited-drops/{id}/orders` or `/events/{id}/seats/select`, or that vq refuses as
/// ambiguous, or that belong to vq's own namespace: none may reach the upstream untokened.
const SPELLINGS: &[&str] = &[
    "/limited-drops/1/orders",
    "/limited-drops/1/orders/",
    "/limited-drops/1//orders",
    "/limited-drops//1/orders",
    "//limited-drops/1/orders",
    "/limited-drops/1/./orders",
    "/limited-drops/x/../1/orders",
    "/./limited-drops/1/orders",
    "/limited-drops/1/orders/.",
    "/limited-drops/1/orders/x/..",
    "/LIMITED-DROPS/1/orders",
    "/limited-drops/1/Orders",
    "/limited-drops/1/ORDERS.JSON;x=1",
    "/limited-drops/1/%6Frders",
    "/limited-drops/1/%6frders",
    "/%6Cimited-drops/%31/orders",
    "/limited-drops/1/orders%2F",
    "/limited-drops/1/orders%2f",
    "/limited-drops%2F1%2Forders",
    "/limited-drops/1/orders.json",
    "/limited-drops/1/orders%2Ejson",
    "/limited-drops/1/orders.",
    "/limited-drops/1/orders%00",
    "/limited-drops/1/orders%20",
    "/limited-drops/1/orders%09",
    "/limited-drops/1/orders%5C",
    "/limited-drops/1/orders\\",
    "/limited-drops/1/orders;jsessionid=x",
    "/limited-drops;x/1;y/orders;z",
    "/limited-drops/1/orders%3Bjsessionid=x",
    "/limited-drops/1/orders?x=1",
    "/limited-drops/1/orders#x",
    "/x/..;/limited-drops/1/orders",
    "/x/%2E%2E/limited-drops/1/orders",
    "/x/%2e./limited-drops/1/orders",
    "/limited-drop%C5%BF/1/orders",
    "/limited-drops/1/orders%",
    "http://127.0.0.1/limited-drops/1/orders",
    "/events/1/seats/select/",
    "/Events/1/Seats/Select.json",
    "//virtual-queues/limited-drop/1/entries",
    "//virtual-queues/limited-drop/1/entries/me",
    "/VIRTUAL-QUEUES/limited-drop/1/stats",
    "/virtual-queues/nope",
];

const METHODS: &[&str] = &["POST", "PUT", "PATCH", "GET", "DELETE", "HEAD", "OPTIONS", "PURCHASE"];

/// Every spelling with every method, untokened: a 4xx each (never a 5xx), and nothing reaches
/// the upstream.
async fn assert_no_spelling_passes(addr: &str, recorder: &Recorder, headers: &[(&str, &str)]) {
    let mut not_4xx = Vec::new();
    for target in SPELLINGS {
        for method in METHODS {
            let (status, _) = send_raw(addr, method, target, headers).await;
            if !(400..500).contains(&status) {
                not_4xx.push(format!("{method} {target} -> {status}"));
            }
        }
    }
    let seen: Vec<String> = recorder.take().into_iter().map(|s| format!("{} {}", s.method, s.target)).collect();
    assert!(
        seen.is_empty() && not_4xx.is_empty(),
        "the upstream got {} untokened requests: {seen:#?}\nanswers other than 4xx: {not_4xx:#?}",
        seen.len()
    );
}

#[tokio::test]
async fn the_gate_lets_no_spelling_of_a_purchase_through_without_a_token() {
    let rig = Rig::start().await;
    assert_no_spelling_passes(rig.vq(), &rig.recorder, &[("X-User-Id", "7")]).await;
    // Another user's token and a token for another drop change nothing.
    let other = token(8);
    assert_no_spelling_passes(rig.vq(), &rig.recorder, &[("X-User-Id", "7"), ("X-Entry-Token", &other)]).await;

    // A valid token passes, and the upstream gets the path the gate checked.
    let t = token(7);
    let (status, text) =
        send_raw(rig.vq(), "POST", "/limited-drops/x/../1//Orders?q=1", &[("X-User-Id", "7"), ("X-Entry-Token", &t)])
            .await;
    assert_eq!(status, 200, "{text}");
    let seen = rig.recorder.take();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!((seen[0].method.as_str(), seen[0].target.as_str()), ("POST", "/limited-drops/1/Orders?q=1"));
    // Used once, the token opens no other spelling or method.
    let used = [("X-User-Id", "7"), ("X-Entry-Token", t.as_str())];
    assert_no_spelling_passes(rig.vq(), &rig.recorder, &used).await;
}

#[tokio::test]
async fn every_method_on_a_gated_route_needs_a_token() {
    let rig = Rig::start().await;
    for (user, method) in (20u64..).zip(METHODS) {
        let u = user.to_string();
        let (status, text) = send_raw(rig.vq(), method, "/limited-drops/1/orders", &[("X-User-Id", &u)]).await;
        assert_eq!(status, 403, "{method} without a token: {text}");
        let t = token(user);
        let (status, _) =
            send_raw(rig.vq(), method, "/limited-drops/1/orders", &[("X-User-Id", &u), ("X-Entry-Token", &t)]).await;
        assert_eq!(status, 200, "{method} with a token is the upstream's to answer");
    }
    let seen = rig.recorder.take();
    assert_eq!(seen.iter().map(|s| s.method.as_str()).collect::<Vec<_>>(), METHODS);
}

#[tokio::test]
async fn a_repeated_identity_header_is_refused_on_every_route() {
    let rig = Rig::start().await;
    let t = token(9);
    let twice = [("X-User-Id", "9"), ("X-User-Id", "8")];
    for (method, target) in [
        ("POST", "/virtual-queues/limited-drop/1/entries"),
        ("GET", "/virtual-queues/limited-drop/1/entries/me"),
        ("DELETE", "/virtual-queues/limited-drop/1/entries/me"),
        ("POST", "/limited-drops/1/orders"),
        ("GET", "/products/1"),
        ("GET", "/virtual-queues/limited-drop/1/stats"),
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/metrics"),
        ("GET", "/openapi.json"),
        ("GET", "/waiting-room/limited-drop/1"),
    ] {
        let (status, text) = send_raw(rig.vq(), method, target, &[twice[0], twice[1], ("X-Entry-Token", &t)]).await;
        assert_eq!(status, 400, "{method} {target}: {text}");
        assert!(text.contains("\"code\":\"INVALID_REQUEST\"") && text.contains("more than once"), "{text}");
    }
    let tokens = [("X-User-Id", "9"), ("X-Entry-Token", t.as_str()), ("X-Entry-Token", "other")];
    let (status, text) = send_raw(rig.vq(), "POST", "/limited-drops/1/orders", &tokens).await;
    assert_eq!(status, 400, "{text}");
    // nginx turns a 400 of /gate/verify into a 500: there it is a 403 with the reason.
    let verify = [twice[0], twice[1], ("X-Entry-Token", &t), ("X-Original-URI", "/limited-drops/1/orders")];
    let (status, text) = send_raw(rig.vq(), "GET", "/gate/verify", &verify).await;
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("more than once"), "{text}");
    assert!(rig.recorder.take().is_empty());
    // Sent once, the same token passes.
    let (status, _) =
        send_raw(rig.vq(), "POST", "/limited-drops/1/orders", &[("X-User-Id", "9"), ("X-Entry-Token", &t)]).await;
    assert_eq!(status, 200);
}

/// The user as the stand-in login sets it, and the client's own (ignored) header as well.
const AS_USER_7: [(&str, &str); 2] = [("X-Authenticated-User", "7"), ("X-User-Id", "7")];

#[tokio::test]
async fn nginx_with_vq_conf_lets_no_spelling_through_without_a_token() {
    let rig = Rig::start().await;
    let port = free_port();
    let nginx = Nginx::start(vq_conf(rig.vq(), port, true), port).await;
    assert_no_spelling_passes(&nginx.addr(), &rig.recorder, &AS_USER_7).await;
    let t = token(7);
    let (status, text) =
        send_raw(&nginx.addr(), "POST", "/limited-drops/1/orders", &[AS_USER_7[0], ("X-Entry-Token", &t)]).await;
    assert_eq!(status, 200, "{text}\n{}", nginx.error_log());
    let seen = rig.recorder.take();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].target, "/limited-drops/1/orders");
}

#[tokio::test]
async fn nginx_with_auth_request_conf_lets_no_spelling_through_without_a_token() {
    let rig = Rig::start().await;
    let port = free_port();
    let nginx = Nginx::start(auth_request_conf(rig.vq(), &rig.backend, port, true), port).await;
    assert_no_spelling_passes(&nginx.addr(), &rig.recorder, &AS_USER_7).await;
    let t = token(7);
    let (status, text) =
        send_raw(&nginx.addr(), "POST", "/limited-drops/1/orders", &[AS_USER_7[0], ("X-Entry-Token", &t)]).await;
    assert_eq!(status, 200, "{text}\n{}", nginx.error_log());
    let (status, _) = send_raw(&nginx.addr(), "GET", "/products/1", &AS_USER_7).await;
    assert_eq!(status, 200, "paths that are not gated pass");
    let seen = rig.recorder.take();
    let targets: Vec<&str> = seen.iter().map(|s| s.target.as_str()).collect();
    assert_eq!(targets, ["/limited-drops/1/orders", "/products/1"]);
}

#[tokio::test]
async fn both_nginx_configs_drop_the_clients_own_user_id() {
    let rig = Rig::start().await;
    // One user per config: the proxy gate uses its token up.
    for (user, name) in [(7, "vq.conf"), (6, "auth-request.conf")] {
        let t = token(user);
        let u = user.to_string();
        for login in [false, true] {
            let port = free_port();
            let site = match name {
                "vq.conf" => vq_conf(rig.vq(), port, login),
                _ => auth_request_conf(rig.vq(), &rig.backend, port, login),
            };
            assert!(shipped(name).contains(AUTH_LAYER), "{name} marks where the auth layer sets the user");
            let nginx = Nginx::start(site, port).await;
            // As shipped, nobody is authenticated: the client naming itself the user, with the
            // user's token, is not that user.
            let claims = [("X-User-Id", u.as_str()), ("X-Entry-Token", t.as_str())];
            let (status, text) = send_raw(&nginx.addr(), "POST", "/limited-drops/1/orders", &claims).await;
            if !login {
                assert_eq!(status, 403, "{name}: {text}");
                let (status, text) =
                    send_raw(&nginx.addr(), "POST", "/virtual-queues/limited-drop/1/entries", &claims).await;
                assert_eq!(status, 400, "{name}: enter without an authenticated user: {text}");
                assert!(rig.recorder.take().is_empty(), "{name}");
                continue;
            }
            assert_eq!(status, 403, "{name}: the client's header is not the authenticated user: {text}");
            // The authenticated user, while the client claims 8 (twice): the upstream sees the
            // authenticated one only.
            let (status, text) = send_raw(
                &nginx.addr(),
                "POST",
                "/limited-drops/1/orders",
                &[("X-Authenticated-User", &u), ("X-User-Id", "8"), ("X-User-Id", "9"), ("X-Entry-Token", &t)],
            )
            .await;
            assert_eq!(status, 200, "{name}: {text}");
            let seen = rig.recorder.take();
            assert_eq!(seen.len(), 1, "{name}: {seen:?}");
            assert_eq!(seen[0].all("x-user-id"), [u.as_str()], "{name}");
        }
    }
}
