//! What the purchase API receives from vq's gate: the request the gate checked, and only that.
//! No request header can drop or respell the identity headers, none of the headers that
//! frameworks re-route or re-method a request by reaches the purchase API, `Host` is vq's
//! setting, and a body the client framed wrongly is the client's 400, never a 5xx.

use crate::rig::{Rig, Seen, send_bytes, send_raw, token};

/// Headers that Spring, Symfony, Laravel, Rails (Rack), Express, ASP.NET, IIS or a proxy's
/// conventions read as the request's real path, method or host.
pub const REROUTING: &[&str] = &[
    "X-Original-URL",
    "X-Rewrite-URL",
    "X-Original-URI",
    "X-Forwarded-Uri",
    "X-Forwarded-Path",
    "X-Envoy-Original-Path",
    "X-HTTP-Method-Override",
    "X-HTTP-Method",
    "X-Method-Override",
    "X-Forwarded-Host",
];

/// The re-routing headers as a client would send them to reach the purchase route, each also
/// spelt with underscores (CGI-style servers read `X_Original_URL` as `X-Original-URL`).
pub fn rerouting_headers() -> Vec<(String, &'static str)> {
    let mut all = Vec::new();
    for name in REROUTING {
        let value = match *name {
            n if n.contains("Method") => "DELETE",
            "X-Forwarded-Host" => "admin.example",
            _ => "/limited-drops/1/orders",
        };
        all.push((name.to_string(), value));
        all.push((name.replace('-', "_"), value));
    }
    all
}

/// The re-routing headers (either spelling) that the upstream received.
pub fn rerouting_seen(seen: &Seen) -> Vec<String> {
    let names: Vec<String> = REROUTING.iter().map(|n| n.to_ascii_lowercase()).collect();
    seen.headers
        .iter()
        .filter(|(k, _)| names.contains(&k.replace('_', "-")))
        .map(|(k, v)| format!("{k}: {v}"))
        .collect()
}

async fn pace_off() -> Rig {
    Rig::start_with(|s| s.gate.pace = false).await
}

#[tokio::test]
async fn a_connection_header_naming_an_identity_header_is_refused_on_every_route() {
    let rig = pace_off().await;
    for (user, connection) in (30u64..).zip([
        "X-User-Id, X-Entry-Token",
        "keep-alive, x-user-id",
        "X-Entry-Token",
        " X-ENTRY-TOKEN ,close",
        "x_user_id",
    ]) {
        let (u, t) = (user.to_string(), token(user));
        let who = [("X-User-Id", u.as_str()), ("X-Entry-Token", t.as_str()), ("Connection", connection)];
        for (method, target) in [
            ("POST", "/limited-drops/1/orders"),
            ("GET", "/products/1"),
            ("POST", "/virtual-queues/limited-drop/1/entries"),
            ("GET", "/waiting-room/limited-drop/1"),
        ] {
            let (status, text) = send_raw(rig.vq(), method, target, &who).await;
            assert_eq!(status, 400, "Connection: {connection} on {method} {target}: {text}");
            assert!(text.contains("\"code\":\"INVALID_REQUEST\"") && text.contains("Connection names"), "{text}");
        }
        // nginx turns a 400 of /gate/verify into a 500: there it is a 403 with the reason.
        let verify = [who[0], who[1], who[2], ("X-Original-URI", "/limited-drops/1/orders")];
        let (status, text) = send_raw(rig.vq(), "GET", "/gate/verify", &verify).await;
        assert_eq!(status, 403, "{text}");
        assert!(text.contains("Connection names"), "{text}");
    }
    let seen = rig.recorder.take();
    assert!(seen.is_empty(), "the purchase API got {seen:#?}");
    // Other connection options still go: the purchase API sees the identity as sent.
    let t = token(40);
    let who = [("X-User-Id", "40"), ("X-Entry-Token", t.as_str()), ("Connection", "X-Trace, keep-alive")];
    let (status, text) =
        send_raw(rig.vq(), "POST", "/limited-drops/1/orders", &[who[0], who[1], who[2], ("X-Trace", "1")]).await;
    assert_eq!(status, 200, "{text}");
    let seen = rig.recorder.take();
    assert_eq!((seen[0].all("x-user-id"), seen[0].all("x-entry-token")), (vec!["40"], vec![t.as_str()]));
    assert!(seen[0].all("x-trace").is_empty(), "a header named in Connection is hop-by-hop: {seen:?}");
}

#[tokio::test]
async fn an_identity_header_spelt_with_underscores_is_refused() {
    let rig = pace_off().await;
    let t = token(7);
    for (name, value) in [("X_User_Id", "8"), ("x_entry_token", "forged"), ("X-User_Id", "8")] {
        for target in ["/limited-drops/1/orders", "/products/1", "/virtual-queues/limited-drop/1/entries"] {
            let headers = [("X-User-Id", "7"), ("X-Entry-Token", t.as_str()), (name, value)];
            let (status, text) = send_raw(rig.vq(), "POST", target, &headers).await;
            assert_eq!(status, 400, "{name} on {target}: {text}");
            assert!(text.contains("\"code\":\"INVALID_REQUEST\"") && text.contains("spell it"), "{text}");
        }
    }
    assert!(rig.recorder.take().is_empty());
}

#[tokio::test]
async fn no_rerouting_header_reaches_the_purchase_api() {
    let rig = pace_off().await;
    let headers = rerouting_headers();
    let t = token(7);
    let mut sent: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    sent.extend([("X-User-Id", "7"), ("X-Entry-Token", t.as_str()), ("X-Custom", "kept")]);
    for (method, target) in [("POST", "/limited-drops/1/orders"), ("GET", "/"), ("GET", "/products/1")] {
        let (status, text) = send_raw(rig.vq(), method, target, &sent).await;
        assert_eq!(status, 200, "{method} {target}: {text}");
    }
    let seen = rig.recorder.take();
    let got: Vec<(&str, &str)> = seen.iter().map(|s| (s.method.as_str(), s.target.as_str())).collect();
    assert_eq!(got, [("POST", "/limited-drops/1/orders"), ("GET", "/"), ("GET", "/products/1")]);
    for s in &seen {
        assert_eq!(rerouting_seen(s), Vec::<String>::new(), "{} {}", s.method, s.target);
        assert_eq!(s.all("x-custom"), ["kept"], "other headers pass as sent");
    }
}

#[tokio::test]
async fn the_purchase_api_gets_the_configured_host_never_the_clients() {
    let rig = pace_off().await;
    let t = token(7);
    let evil = [("Host", "evil.example"), ("X-User-Id", "7"), ("X-Entry-Token", t.as_str())];
    // send_raw's own Host comes first: hyper takes the first of two, so send one only here.
    let raw = |target: &str| {
        let mut r = format!("POST {target} HTTP/1.1\r\nConnection: close\r\nContent-Length: 0\r\n");
        for (k, v) in evil {
            r.push_str(&format!("{k}: {v}\r\n"));
        }
        r.push_str("\r\n");
        r.into_bytes()
    };
    for target in ["/limited-drops/1/orders", "/products/1"] {
        let (status, text) = send_bytes(rig.vq(), raw(target)).await;
        assert_eq!(status, 200, "{text}");
    }
    let hosts: Vec<Vec<String>> =
        rig.recorder.take().iter().map(|s| s.all("host").iter().map(|h| h.to_string()).collect()).collect();
    assert_eq!(hosts, [[rig.backend.clone()], [rig.backend.clone()]], "default: the upstream's authority");

    let rig = Rig::start_with(|s| s.gate.upstream_host = Some("shop.internal:8443".into())).await;
    let (status, text) = send_bytes(rig.vq(), raw("/products/1")).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(rig.recorder.take()[0].all("host"), ["shop.internal:8443"]);
}

/// Request bodies framed wrongly, each after `Transfer-Encoding: chunked` (or the head given).
pub const BAD_BODIES: &[(&str, &str)] = &[
    ("LF-only line ends", "Transfer-Encoding: chunked\r\n\r\n5\nhello\n0\n\n"),
    ("a chunk size that overflows", "Transfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFF\r\nhello\r\n0\r\n\r\n"),
    ("a chunk size that is not hex", "Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"),
    ("a chunk longer than its size", "Transfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n0\r\n\r\n"),
    ("a chunk extension with a bare LF", "Transfer-Encoding: chunked\r\n\r\n5;a\nhello\r\n0\r\n\r\n"),
    ("a chunk without a size", "Transfer-Encoding: chunked\r\n\r\n\r\nhello\r\n0\r\n\r\n"),
    (
        "Transfer-Encoding: chunked twice",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    ),
    ("Transfer-Encoding: chunked, chunked", "Transfer-Encoding: chunked, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
];

/// `method target` with the identity headers given, `Connection: close`, and `framing` (the
/// rest of the head and the body).
pub fn framed(target: &str, who: &[(&str, &str)], framing: &str) -> Vec<u8> {
    let mut r = format!("POST {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    for (k, v) in who {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str(framing);
    r.into_bytes()
}

/// No request reached the upstream with a whole body.
fn assert_no_whole_body(seen: &[Seen]) {
    let whole: Vec<_> = seen.iter().filter(|s| s.body.is_ok()).collect();
    assert!(whole.is_empty(), "the purchase API read a whole body out of a malformed one: {whole:#?}");
}

#[tokio::test]
async fn a_malformed_request_body_is_the_clients_400_never_a_5xx() {
    let rig = pace_off().await;
    for (user, (what, framing)) in (50u64..).zip(BAD_BODIES) {
        let (u, t) = (user.to_string(), token(user));
        let who = [("X-User-Id", u.as_str()), ("X-Entry-Token", t.as_str())];
        for target in ["/limited-drops/1/orders", "/products/1"] {
            let (status, text) = send_bytes(rig.vq(), framed(target, &who, framing)).await;
            assert_eq!(status, 400, "{what} on {target}: {text}");
            assert!(text.contains("\"code\":\"INVALID_REQUEST\""), "{what} on {target}: {text}");
        }
    }
    // Framings hyper refuses before vq sees the request: its own 400, without a body.
    for framing in [
        "Transfer-Encoding: gzip\r\n\r\nhello",
        "Transfer-Encoding: chunked, gzip\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        "Content-Length: 3\r\nContent-Length: 5\r\n\r\nhello",
        "Content-Length: x\r\n\r\nhello",
    ] {
        let (status, text) = send_bytes(rig.vq(), framed("/products/1", &[], framing)).await;
        assert_eq!(status, 400, "{framing:?}: {text}");
    }
    assert_no_whole_body(&rig.recorder.take());
    // The token of a purchase whose body failed is not used up: the purchase API did not answer.
    let t = token(50);
    let (status, text) =
        send_raw(rig.vq(), "POST", "/limited-drops/1/orders", &[("X-User-Id", "50"), ("X-Entry-Token", &t)]).await;
    assert_eq!(status, 200, "{text}");
}

#[tokio::test]
async fn a_body_that_stops_arriving_is_the_clients_400_not_an_upstream_timeout() {
    let rig = Rig::start_with(|s| (s.gate.pace, s.gate.timeout_ms) = (false, 300)).await;
    let t = token(7);
    let who = [("X-User-Id", "7"), ("X-Entry-Token", t.as_str())];
    for target in ["/limited-drops/1/orders", "/products/1"] {
        // Ten bytes announced, three sent, the connection kept open.
        let (status, text) = send_bytes(rig.vq(), framed(target, &who, "Content-Length: 10\r\n\r\nabc")).await;
        assert_eq!(status, 400, "{target}: {text}");
        assert!(text.contains("\"code\":\"INVALID_REQUEST\"") && text.contains("stopped arriving"), "{text}");
    }
    assert_no_whole_body(&rig.recorder.take());
}
