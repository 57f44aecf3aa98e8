//! `/gate/verify` for forward-auth proxies other than nginx: a real Caddy running the shipped
//! `deploy/caddy/Caddyfile` in front of the purchase API stand-in (no spelling of a gated
//! route passes without a valid token; a valid one passes, with the user the login set), the
//! headers Traefik and Caddy name the original request with, and Envoy's form (the original
//! path appended to `/gate/verify`). A check whose headers name two requests is refused.
//!
//! Through both shipped proxies (nginx `auth_request`, Caddy `forward_auth`) the gate keeps
//! its promises: a token buys once, a purchase API failure gives it back (the proxy's release
//! call, which clients cannot make), admitted buyers reach the purchase API one batch per tick,
//! and paths with `#`, a leading `//` or `%23` are refused.

use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::forwarding::rerouting_headers;
use crate::rig::{Nginx, Rig, auth_request_conf, send_raw, token};
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
    // A check that passes claims the token: each form gets a user and token of its own.
    for (n, (path, named)) in (20u64..).zip([
        ("/gate/verify", Some("X-Forwarded-Uri")),
        ("/gate/verify", Some("X-Original-URI")),
        ("/gate/verify/limited-drops/1/orders", None),
        ("/gate/verify/LIMITED-DROPS/1/orders/", None),
    ]) {
        let (u, t) = (n.to_string(), token(n));
        let user = ("X-User-Id", u.as_str());
        let mut without = vec![user];
        let mut with = vec![user, ("X-Entry-Token", t.as_str())];
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

/// The shipped nginx `auth_request` config and the shipped Caddyfile, both asking `rig`'s vq
/// (with the stand-in login) and forwarding to `shop`.
struct Proxies {
    nginx: Nginx,
    caddy: Caddy,
}

impl Proxies {
    async fn start(rig: &Rig, shop: &str) -> Self {
        let port = free_port();
        let nginx = Nginx::start(auth_request_conf(rig.vq(), shop, port, true), port).await;
        let caddy = Caddy::start(rig.vq(), shop).await;
        Self { nginx, caddy }
    }

    fn each(&self) -> [(&'static str, String); 2] {
        [("nginx", self.nginx.addr()), ("caddy", self.caddy.addr())]
    }
}

/// One purchase of `LIMITED_DROP:1` as `user` with `token` through the proxy at `addr` (and
/// `extra` headers): the status and the answer.
async fn buy(addr: &str, method: &str, path: &str, user: u64, token: &str, extra: &[(&str, &str)]) -> (u16, String) {
    let u = user.to_string();
    let mut headers = vec![("X-Authenticated-User", u.as_str()), ("X-Entry-Token", token)];
    headers.extend(extra);
    send_raw(addr, method, path, &headers).await
}

#[tokio::test]
async fn a_token_buys_once_through_either_forward_auth_proxy() {
    let rig = Rig::start().await;
    let proxies = Proxies::start(&rig, &rig.backend).await;
    for (user, (name, addr)) in (30u64..).zip(proxies.each()) {
        let t = token(user);
        // The same purchase five times in a row, in the spellings and methods a buyer would
        // try, then five at once.
        let mut statuses = Vec::new();
        for (path, method) in SPELLINGS.iter().zip(["POST", "POST", "PUT", "GET", "PATCH"]) {
            statuses.push(buy(&addr, method, path, user, &t, &[]).await.0);
        }
        let at_once: Vec<_> = (0..5)
            .map(|_| {
                let (addr, t) = (addr.clone(), t.clone());
                tokio::spawn(async move { buy(&addr, "POST", "/limited-drops/1/orders", user, &t, &[]).await.0 })
            })
            .collect();
        for task in at_once {
            statuses.push(task.await.unwrap());
        }
        assert_eq!(statuses[0], 200, "{name}: {statuses:?}");
        assert!(statuses[1..].iter().all(|s| *s == 403), "{name}: {statuses:?}");
        let seen = rig.recorder.take();
        assert_eq!(seen.len(), 1, "{name}: the purchase API got the same purchase {} times", seen.len());

        // A bought token stays bought: the release route is not reachable through the proxy.
        let (status, _) = buy(&addr, "POST", "/gate/release", user, &t, &[("X-Vq-Release", "x")]).await;
        assert_eq!(status, 200, "{name}: /gate/release from outside is the backend's path");
        assert_eq!(rig.recorder.take()[0].target, "/gate/release", "{name}");
        assert_eq!(buy(&addr, "POST", "/limited-drops/1/orders", user, &t, &[]).await.0, 403, "{name}");
        assert!(rig.recorder.take().is_empty(), "{name}");
    }
}

#[tokio::test]
async fn a_failed_purchase_gives_the_token_back_through_either_forward_auth_proxy() {
    let rig = Rig::start().await;
    let echo = crate::gate::spawn_echo().await;
    let proxies = Proxies::start(&rig, echo.trim_start_matches("http://")).await;
    let order = "/limited-drops/1/orders";
    for (user, (name, addr)) in (40u64..).zip(proxies.each()) {
        let t = token(user);
        // The purchase API fails (the stand-in answers the status asked for): the buyer is told
        // and may retry, as often as it fails.
        for failure in ["503", "500", "502"] {
            let (status, text) = buy(&addr, "POST", order, user, &t, &[("X-Echo-Status", failure)]).await;
            assert_eq!(status.to_string(), failure, "{name}: {text}");
            assert!(text.contains("valid again"), "{name} {failure}: {text}");
            assert!(!text.contains("x-vq-release"), "{name}: the receipt reached the buyer: {text}");
        }
        // With a body, as purchases have.
        let u = user.to_string();
        let with_body = format!(
            "POST {order} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Authenticated-User: {u}\r\n\
             X-Entry-Token: {t}\r\nX-Echo-Status: 503\r\nContent-Type: application/json\r\n\
             Content-Length: 10\r\n\r\n{{\"qty\": 1}}"
        );
        let (status, text) = crate::rig::send_bytes(&addr, with_body.into_bytes()).await;
        assert_eq!(status, 503, "{name}: {text}");
        assert!(text.contains("valid again"), "{name} with a body: {text}");
        // It buys once.
        let (status, text) = buy(&addr, "POST", order, user, &t, &[]).await;
        assert_eq!(status, 200, "{name}: {text}");
        assert!(!text.to_ascii_lowercase().contains("x-vq-release"), "{name}: the purchase API saw the receipt");
        // Then nothing gives it back: a failing purchase is refused before the purchase API.
        let (status, _) = buy(&addr, "POST", order, user, &t, &[("X-Echo-Status", "503")]).await;
        assert_eq!(status, 403, "{name}");
        // A receipt of the bought claim (as if leaked) sent by the client on a failing request:
        // the proxy drops it, nothing is released.
        let leaked = vq::release::sign(
            &crate::support::secret(),
            &vq::release::Receipt {
                until_ms: vq::service::now_epoch_ms() + 60_000,
                nonce: format!("leak{user}"),
                target: "LIMITED_DROP:1".parse().unwrap(),
                user: vq::domain::UserId::from(user),
                token: t.clone(),
                previous: None,
            },
        );
        let (status, text) =
            buy(&addr, "POST", "/products/1", user, &t, &[("X-Echo-Status", "500"), ("X-Vq-Release", &leaked)]).await;
        assert_eq!(status, 500, "{name}: {text}");
        let (status, text) = buy(&addr, "POST", order, user, &t, &[]).await;
        assert_eq!(status, 403, "{name}: a client's receipt released the bought token: {text}");
    }

    // The purchase API unreachable: the buyer gets a 502 and the token back.
    let dead = format!("127.0.0.1:{}", free_port());
    let down = Proxies::start(&rig, &dead).await;
    for (user, (name, addr)) in (50u64..).zip(down.each()) {
        let t = token(user);
        for _ in 0..2 {
            let (status, text) = buy(&addr, "POST", order, user, &t, &[]).await;
            assert_eq!(status, 502, "{name}: {text}");
            assert!(text.contains("valid again"), "{name}: {text}");
        }
        let (status, text) = buy(&proxies.each()[0].1, "POST", order, user, &t, &[]).await;
        assert_eq!(status, 200, "{name}: the token released after the purchase API was down buys: {text}");
    }
}

#[tokio::test]
async fn a_release_receipt_is_vqs_own_and_releases_once() {
    let rig = Rig::start().await;
    let vq = rig.vq();
    let t = token(60);
    let check = [("X-User-Id", "60"), ("X-Entry-Token", t.as_str()), ("X-Original-URI", "/limited-drops/1/orders")];
    let (status, text) = send_raw(vq, "GET", "/gate/verify", &check).await;
    assert_eq!(status, 204, "{text}");
    let receipt = text
        .lines()
        .find_map(|l| l.strip_prefix("x-vq-release: "))
        .expect("the 204 carries the receipt")
        .trim()
        .to_owned();
    assert_eq!(send_raw(vq, "GET", "/gate/verify", &check).await.0, 403, "claimed");

    // Altered, forged or repeated receipts: refused, nothing released.
    let mut altered = receipt.clone();
    altered.insert(3, 'A');
    for bad in [altered.as_str(), "abc.def", "x"] {
        let (status, text) = send_raw(vq, "GET", "/gate/release", &[("X-Vq-Release", bad)]).await;
        assert_eq!(status, 403, "{bad}: {text}");
    }
    let twice = [("X-Vq-Release", receipt.as_str()), ("X-Vq-Release", receipt.as_str())];
    assert_eq!(send_raw(vq, "GET", "/gate/release", &twice).await.0, 403);
    assert_eq!(send_raw(vq, "GET", "/gate/verify", &check).await.0, 403, "still claimed");

    // The real one releases, once: the proxy's failure status is the buyer's answer.
    let release = [("X-Vq-Release", receipt.as_str()), ("X-Vq-Upstream-Status", "503")];
    let (status, text) = send_raw(vq, "GET", "/gate/release", &release).await;
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("valid again"), "{text}");
    assert_eq!(send_raw(vq, "GET", "/gate/verify", &check).await.0, 204, "released, claimed again");
    let (status, text) = send_raw(vq, "GET", "/gate/release", &release).await;
    assert_eq!(status, 503, "{text}");
    assert!(!text.contains("valid again"), "a receipt releases once: {text}");
    assert_eq!(send_raw(vq, "GET", "/gate/verify", &check).await.0, 403, "the second claim stands");

    // Without a receipt (an ungated path failed): the failure, nothing released.
    let (status, text) = send_raw(vq, "GET", "/gate/release", &[]).await;
    assert_eq!(status, 502, "{text}");
}

#[tokio::test]
async fn admitted_buyers_reach_the_purchase_api_one_batch_per_tick_through_either_proxy() {
    const BUYERS: u64 = 300;
    const BATCH: u64 = 50;
    let rig = Rig::start_with(|s| {
        s.queue.tick_ms = crate::pacing::TICK_MS;
        s.queue.batch_size = BATCH;
        s.gate.pace_max_ticks = 20;
    })
    .await;
    let echo = crate::gate::spawn_echo().await;
    let proxies = Proxies::start(&rig, echo.trim_start_matches("http://")).await;
    let client = reqwest::Client::new();
    for (first, (name, addr)) in [1000u64, 2000].into_iter().zip(proxies.each()) {
        // 300 admitted buyers buy at once.
        let tasks: Vec<_> = (first..first + BUYERS)
            .map(|user| {
                let (client, url, t) = (client.clone(), format!("http://{addr}/limited-drops/1/orders"), token(user));
                tokio::spawn(async move {
                    let req = client
                        .post(url)
                        .header("X-Authenticated-User", user.to_string())
                        .header("X-Entry-Token", t)
                        .timeout(std::time::Duration::from_secs(30));
                    let r = req.send().await.expect("purchase");
                    (r.status().as_u16(), r.json::<serde_json::Value>().await.unwrap_or_default())
                })
            })
            .collect();
        let mut arrivals = Vec::new();
        for task in tasks {
            let (status, v) = task.await.unwrap();
            assert_eq!(status, 200, "{name}: {v}");
            arrivals.push(v["receivedAtMs"].as_u64().expect("the stand-in's arrival time"));
        }
        let load = crate::pacing::load_per_tick_of(&arrivals, BATCH);
        assert!(
            load.values().all(|n| *n <= BATCH),
            "{name}: at most {BATCH} purchases reach the purchase API per tick: {load:?}"
        );
        assert_eq!(arrivals.len() as u64, BUYERS, "{name}");
    }
}

/// Paths some servers read as another path than a checker that cuts or collapses them: a `#`
/// (nginx forwards it as sent), a leading `//` (a host name to URL parsers), an encoded `#`.
const HASH_AND_SLASH_FORMS: [&str; 11] = [
    "/x#/../limited-drops/1/orders",
    "/limited-drops/1/orders#",
    "/limited-drops/1/orders#x",
    "/products/1#/../../limited-drops/1/orders",
    "/products/1?a=b#/../limited-drops/1/orders",
    "//limited-drops/1/orders",
    "//shop.example/limited-drops/1/orders",
    "///limited-drops/1/orders",
    "/limited-drops/1/orders%23",
    "/x%23/../limited-drops/1/orders",
    "/limited-drops/1%23/orders",
];

#[tokio::test]
async fn hash_and_double_slash_paths_are_refused_through_either_proxy_and_directly() {
    let rig = Rig::start().await;
    let proxies = Proxies::start(&rig, &rig.backend).await;
    for (user, (name, addr)) in (70u64..).zip(proxies.each()) {
        // With a valid token, so that only the path can be the reason.
        let t = token(user);
        for path in HASH_AND_SLASH_FORMS {
            for method in ["POST", "GET"] {
                let (status, text) = buy(&addr, method, path, user, &t, &[]).await;
                assert!(matches!(status, 400 | 403), "{name} {method} {path}: {text}");
            }
        }
        let seen: Vec<String> = rig.recorder.take().into_iter().map(|s| s.target).collect();
        assert!(seen.is_empty(), "{name}: the backend got {seen:?}");
        // None of them claimed the token: it buys now.
        assert_eq!(buy(&addr, "POST", "/limited-drops/1/orders", user, &t, &[]).await.0, 200, "{name}");
        assert_eq!(rig.recorder.take().len(), 1);
    }

    // Directly: the check, named in each proxy's way, and vq's own gate.
    let vq = rig.vq();
    let t = token(80);
    let who = [("X-User-Id", "80"), ("X-Entry-Token", t.as_str())];
    for form in HASH_AND_SLASH_FORMS {
        for header in ORIGINAL_URI_NAMES {
            let (status, text) = send_raw(vq, "GET", "/gate/verify", &[who[0], who[1], (header, form)]).await;
            assert_eq!(status, 403, "{header}: {form}: {text}");
        }
        if !form.contains('#') {
            // Envoy's form (a raw `#` never reaches a handler: the request line is cut there).
            let (status, text) = send_raw(vq, "GET", &format!("/gate/verify{form}"), &who).await;
            assert_eq!(status, 403, "/gate/verify{form}: {text}");
            let (status, text) = send_raw(vq, "POST", form, &who).await;
            assert_eq!(status, 400, "{form}: {text}");
        }
    }
    assert!(rig.recorder.take().is_empty());
    let ok = [who[0], who[1], ("X-Original-URI", "/limited-drops/1/orders")];
    assert_eq!(send_raw(vq, "GET", "/gate/verify", &ok).await.0, 204, "the refusals were the paths'");
}

const ORIGINAL_URI_NAMES: [&str; 2] = ["X-Original-URI", "X-Forwarded-Uri"];
