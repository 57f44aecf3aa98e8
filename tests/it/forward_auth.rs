//! `/gate/verify` for forward-auth proxies other than nginx: a real Caddy running the shipped
//! `deploy/caddy/Caddyfile` in front of the purchase API stand-in (no spelling of a gated
//! route passes without a valid token; a valid one passes, with the user the login set), the
//! headers Traefik and Caddy name the original request with, and Envoy's form (the original
//! path appended to `/gate/verify`). A check whose headers name two requests is refused.

use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::forwarding::rerouting_headers;
use crate::rig::{Rig, send_raw, token};
use crate::support::free_port;

/// `caddy run` with the shipped Caddyfile (its auth layer replaced by the test's stand-in
/// login: the user comes in `X-Authenticated-User`), in a temp dir, killed on drop.
struct Caddy {
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Caddy {
    async fn start(vq: &str, shop: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let shipped =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/caddy/Caddyfile")).unwrap();
        let login = "request_header -X-User-Id";
        assert!(shipped.contains(login), "the Caddyfile's auth layer moved");
        let conf = shipped.replace(login, "request_header X-User-Id {http.request.header.X-Authenticated-User}");
        let file = dir.path().join("Caddyfile");
        std::fs::write(&file, conf).unwrap();
        let port = free_port();
        let child = Command::new("caddy")
            .args(["run", "--adapter", "caddyfile", "--config"])
            .arg(&file)
            .env("VQ_CADDY_LISTEN", format!("127.0.0.1:{port}"))
            .env("VQ_UPSTREAMS", vq)
            .env("SHOP_UPSTREAM", shop)
            .env("HOME", dir.path())
            .env("XDG_DATA_HOME", dir.path())
            .env("XDG_CONFIG_HOME", dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("caddy must be installed (apt-get install -y caddy; scripts/test.sh does)");
        let mut caddy = Self { port, child, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            let exited = caddy.child.try_wait().unwrap().is_some();
            assert!(!exited && Instant::now() < deadline, "caddy did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        caddy
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Caddy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Spellings of the gated `/limited-drops/1/orders` that servers route alike.
const SPELLINGS: [&str; 8] = [
    "/limited-drops/1/orders",
    "/LIMITED-DROPS/1/orders",
    "/limited-drops/1/orders/",
    "/limited-drops//1/orders",
    "/limited-drops/%31/orders",
    "/limited-drops/1/./orders",
    "/limited-drops/1/orders;x=1",
    "/limited-drops/1/orders.json",
];

#[tokio::test]
async fn caddy_forward_auth_lets_through_only_checked_purchases() {
    let rig = Rig::start().await;
    let caddy = Caddy::start(rig.vq(), &rig.backend).await;
    let addr = caddy.addr();

    // Without a token, or with a client-sent header naming a harmless request: no spelling
    // of the purchase reaches the purchase API.
    for path in SPELLINGS {
        for extra in [None, Some(("X-Original-URI", "/")), Some(("X-Forwarded-Uri", "/"))] {
            let mut headers = vec![("X-Authenticated-User", "7")];
            headers.extend(extra);
            let (status, text) = send_raw(&addr, "POST", path, &headers).await;
            assert!(matches!(status, 400 | 403), "{path} {extra:?}: {text}");
        }
    }
    assert!(rig.recorder.take().is_empty(), "a purchase without a token reached the purchase API");

    // Another user's token, and a forged one: refused.
    let (other, mut forged) = (token(8), token(7));
    forged.pop();
    for t in [other.as_str(), forged.as_str()] {
        let (status, text) =
            send_raw(&addr, "POST", "/limited-drops/1/orders", &[("X-Authenticated-User", "7"), ("X-Entry-Token", t)])
                .await;
        assert_eq!(status, 403, "{text}");
    }
    assert!(rig.recorder.take().is_empty());

    // A valid token passes, with the login's user and none of the client's re-routing headers.
    let t = token(7);
    let rerouting = rerouting_headers();
    let mut headers: Vec<(&str, &str)> =
        rerouting.iter().filter(|(k, _)| !k.contains('_')).map(|(k, v)| (k.as_str(), *v)).collect();
    headers.extend([("X-Authenticated-User", "7"), ("X-Entry-Token", t.as_str()), ("X-User-Id", "9")]);
    let (status, text) = send_raw(&addr, "POST", "/limited-drops/1/orders", &headers).await;
    assert_eq!(status, 200, "{text}");
    let seen = rig.recorder.take();
    assert_eq!(seen.len(), 1, "{seen:#?}");
    assert_eq!(seen[0].all("x-user-id"), ["7"], "the user the login set, never the client's");
    let leaked: Vec<_> =
        seen[0].headers.iter().filter(|(k, _)| rerouting.iter().any(|(r, _)| r.eq_ignore_ascii_case(k))).collect();
    assert!(leaked.is_empty(), "re-routing headers reached the purchase API: {leaked:?}");
    assert_ne!(seen[0].all("host"), ["127.0.0.1"], "the client's Host reached the purchase API");

    // The queue API goes to vq, never through the check.
    let (status, text) =
        send_raw(&addr, "POST", "/virtual-queues/limited-drop/1/entries", &[("X-Authenticated-User", "7")]).await;
    assert_eq!(status, 200, "{text}");
}

#[tokio::test]
async fn gate_verify_reads_each_proxys_header_and_refuses_two_requests_named() {
    let rig = Rig::start().await;
    let vq = rig.vq();
    let t = token(7);
    let user = ("X-User-Id", "7");
    let with_token = [user, ("X-Entry-Token", t.as_str())];
    // Traefik and Caddy: X-Forwarded-Uri; nginx: X-Original-URI; Envoy: the path appended.
    for (path, named) in [
        ("/gate/verify", Some("X-Forwarded-Uri")),
        ("/gate/verify", Some("X-Original-URI")),
        ("/gate/verify/limited-drops/1/orders", None),
        ("/gate/verify/LIMITED-DROPS/1/orders/", None),
    ] {
        let mut without = vec![user];
        let mut with = with_token.to_vec();
        if let Some(name) = named {
            without.push((name, "/limited-drops/1/orders?x=1"));
            with.push((name, "/limited-drops/1/orders?x=1"));
        }
        let (status, text) = send_raw(vq, "GET", path, &without).await;
        assert_eq!(status, 403, "{path} {named:?} without a token: {text}");
        let (status, text) = send_raw(vq, "GET", path, &with).await;
        assert_eq!(status, 204, "{path} {named:?} with a valid token: {text}");
    }
    // An ungated request passes; Envoy's form of it too.
    assert_eq!(send_raw(vq, "GET", "/gate/verify/limited-drops/1", &[user]).await.0, 204);
    // Two names for two requests: refused, whichever pair.
    for (path, headers) in [
        ("/gate/verify", vec![("X-Original-URI", "/"), ("X-Forwarded-Uri", "/limited-drops/1/orders")]),
        ("/gate/verify", vec![("X-Forwarded-Uri", "/limited-drops/1/orders"), ("X-Original-URI", "/")]),
        ("/gate/verify", vec![("X-Forwarded-Uri", "/limited-drops/1/orders"), ("X-Forwarded-Uri", "/")]),
        ("/gate/verify/limited-drops/1/orders", vec![("X-Forwarded-Uri", "/")]),
        ("/gate/verify/about", vec![("X-Original-URI", "/limited-drops/1/orders")]),
    ] {
        let mut all = headers.clone();
        all.extend(with_token);
        let (status, text) = send_raw(vq, "GET", path, &all).await;
        assert_eq!(status, 403, "{path} {headers:?}: {text}");
        assert!(text.contains("different requests"), "{text}");
    }
    // None at all: refused, saying what is missing.
    let (status, text) = send_raw(vq, "GET", "/gate/verify", &with_token).await;
    assert_eq!(status, 403);
    assert!(text.contains("missing X-Original-URI"), "{text}");
}
