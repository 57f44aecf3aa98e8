//! Spellings of the gated routes, sent as raw request lines (an HTTP client would normalise
//! them), straight to vq and through a real nginx running the shipped configs
//! (`deploy/nginx/*.conf`, ports templated): the upstream never receives one without a valid
//! token, and never the client's own `X-User-Id`.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri};
use std::io::{Read, Write};
use std::net::TcpStream;
use vq::domain::UserId;
use vq::token::mint;

use crate::support::{RedisServer, TestApp, flag_on, free_port, secret, spawn_app, test_settings};

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

/// What the upstream received.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    target: String,
    user_ids: Vec<String>,
}

/// An upstream that answers 200 to everything and records what it got.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Seen>>>);

impl Recorder {
    /// The recorder and its `host:port`.
    async fn spawn() -> (Self, String) {
        async fn record(State(rec): State<Recorder>, method: Method, uri: Uri, headers: HeaderMap) -> &'static str {
            let user_ids = headers.get_all("x-user-id").iter().map(|v| v.to_str().unwrap_or("?").to_owned()).collect();
            rec.0.lock().unwrap().push(Seen { method: method.to_string(), target: uri.to_string(), user_ids });
            "{\"upstream\":true}"
        }
        let rec = Self::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let app = axum::Router::new().fallback(record).with_state(rec.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (rec, addr)
    }

    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// Sends one request exactly as written (`Connection: close`, no body) and returns the status
/// (0 when the server closed without answering) and the whole answer.
async fn send_raw(addr: &str, method: &str, target: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut req =
        format!("{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: 0\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let (addr, what) = (addr.to_owned(), format!("{method} {target}"));
    tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(&addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        stream.write_all(req.as_bytes()).unwrap();
        let mut buf = Vec::new();
        if let Err(e) = stream.read_to_end(&mut buf) {
            assert!(e.kind() == std::io::ErrorKind::ConnectionReset, "{what}: no answer within 5 s ({e})");
        }
        let text = String::from_utf8_lossy(&buf).into_owned();
        let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        (status, text)
    })
    .await
    .unwrap()
}

fn token(user: u64) -> String {
    let now = vq::service::now_epoch_ms() / 1000;
    mint(&secret(), "LIMITED_DROP:1".parse().unwrap(), UserId(user), now, 300).raw
}

/// Redis with the queue on, the recorder, and vq in front of it.
struct Rig {
    _redis: RedisServer,
    app: TestApp,
    recorder: Recorder,
    backend: String,
}

impl Rig {
    async fn start() -> Self {
        let redis = RedisServer::spawn();
        let (recorder, backend) = Recorder::spawn().await;
        let mut s = test_settings(Some(&redis));
        s.gate.upstream = Some(format!("http://{backend}"));
        s.gate.timeout_ms = 2000;
        let app = spawn_app(s, false).await;
        flag_on(&redis).await;
        Self { _redis: redis, app, recorder, backend }
    }

    fn vq(&self) -> &str {
        self.app.addr.trim_start_matches("http://")
    }
}

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

/// `/usr/sbin/nginx` with one shipped server config, in a temp prefix dir, killed on drop.
struct Nginx {
    port: u16,
    child: Child,
    dir: tempfile::TempDir,
}

impl Nginx {
    async fn start(site: String, port: u16) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();
        std::fs::write(dir.path().join("site.conf"), site).unwrap();
        let conf = format!(
            "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
             events {{ worker_connections 256; }}\n\
             http {{\n  access_log {d}/access.log;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  \
             fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  \
             include {d}/site.conf;\n}}\n"
        );
        std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
        let child = Command::new("/usr/sbin/nginx")
            .args(["-p", &d, "-e", &format!("{d}/error.log"), "-c", &format!("{d}/nginx.conf")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx must be installed at /usr/sbin/nginx (apt-get install -y nginx)");
        let mut nginx = Self { port, child, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            let exited = nginx.child.try_wait().unwrap().is_some();
            assert!(!exited && Instant::now() < deadline, "nginx did not start: {}", nginx.error_log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        nginx
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The marked place in both shipped configs where the auth layer sets the user id.
const AUTH_LAYER: &str = "set $vq_user_id \"\";";
/// The test's stand-in for a login: the authenticated user comes in `X-Authenticated-User`.
const STAND_IN_LOGIN: &str = "set $vq_user_id $http_x_authenticated_user;";

fn shipped(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/nginx").join(name);
    std::fs::read_to_string(path).unwrap()
}

/// `deploy/nginx/vq.conf` with its three replicas all pointing at `vq`.
fn vq_conf(vq: &str, listen: u16, login: bool) -> String {
    let conf = shipped("vq.conf")
        .replace("vq1:8080", vq)
        .replace("vq2:8080", vq)
        .replace("vq3:8080", vq)
        .replace("listen 80;", &format!("listen 127.0.0.1:{listen};"));
    if login { conf.replace(AUTH_LAYER, STAND_IN_LOGIN) } else { conf }
}

/// `deploy/nginx/auth-request.conf` asking `vq` and forwarding to `backend`.
fn auth_request_conf(vq: &str, backend: &str, listen: u16, login: bool) -> String {
    let conf = shipped("auth-request.conf")
        .replace("@LISTEN@", &listen.to_string())
        .replace("@VQ@", &format!("server {vq};"))
        .replace("@BACKEND@", backend);
    if login { conf.replace(AUTH_LAYER, STAND_IN_LOGIN) } else { conf }
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
            assert_eq!(seen[0].user_ids, [u.as_str()], "{name}");
        }
    }
}
