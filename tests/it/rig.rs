//! What the proxy tests share: a purchase API stand-in that records exactly the requests it
//! received, raw requests over a `TcpStream` (an HTTP client would normalise them), vq in
//! front of the stand-in, and a real nginx running a shipped config (`deploy/nginx/*.conf`,
//! ports templated).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri};
use http_body_util::BodyExt;
use vq::domain::UserId;
use vq::token::mint;

use crate::support::{RedisServer, TestApp, flag_on, secret, spawn_app, test_settings};

/// What the upstream received: the request line, every header as sent (names lower-case, in
/// order), and the body, or why reading it failed.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Result<Vec<u8>, String>,
}

impl Seen {
    /// Every value of header `name` (lower-case).
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.headers.iter().filter(|(k, _)| k == name).map(|(_, v)| v.as_str()).collect()
    }
}

/// An upstream that reads the whole body, records the request, and answers 200.
#[derive(Clone, Default)]
pub struct Recorder(Arc<Mutex<Vec<Seen>>>);

impl Recorder {
    /// The recorder and its `host:port`.
    pub async fn spawn() -> (Self, String) {
        async fn record(
            State(rec): State<Recorder>,
            method: Method,
            uri: Uri,
            headers: HeaderMap,
            body: Body,
        ) -> &'static str {
            let headers = headers
                .iter()
                .map(|(k, v)| (k.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
                .collect();
            let body = body.collect().await.map(|b| b.to_bytes().to_vec()).map_err(|e| e.to_string());
            rec.0.lock().unwrap().push(Seen { method: method.to_string(), target: uri.to_string(), headers, body });
            "{\"upstream\":true}"
        }
        let rec = Self::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let app = axum::Router::new().fallback(record).with_state(rec.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (rec, addr)
    }

    pub fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// Sends one request exactly as written (`Connection: close`, no body) and returns the status
/// (0 when the server closed without answering) and the whole answer.
pub async fn send_raw(addr: &str, method: &str, target: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut req =
        format!("{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: 0\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    send_bytes(addr, req.into_bytes()).await
}

/// Sends `request` as it is (head and body), reads until the server closes (5 s at most), and
/// returns the status (0 when the server closed without answering) and the whole answer.
pub async fn send_bytes(addr: &str, request: Vec<u8>) -> (u16, String) {
    let addr = addr.to_owned();
    let what = String::from_utf8_lossy(&request).lines().next().unwrap_or_default().to_owned();
    tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(&addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        stream.write_all(&request).unwrap();
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

/// A token of `LIMITED_DROP:1` for `user`, valid for five minutes.
pub fn token(user: u64) -> String {
    let now = vq::service::now_epoch_ms() / 1000;
    mint(&secret(), "LIMITED_DROP:1".parse().unwrap(), &UserId::from(user), now, 300).raw
}

/// Redis with the queue on, the recorder, and vq in front of it.
pub struct Rig {
    _redis: RedisServer,
    pub app: TestApp,
    pub recorder: Recorder,
    pub backend: String,
}

impl Rig {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// Like [`Rig::start`], with `change` applied to vq's settings.
    pub async fn start_with(change: impl FnOnce(&mut vq::config::Settings)) -> Self {
        let redis = RedisServer::spawn();
        let (recorder, backend) = Recorder::spawn().await;
        let mut s = test_settings(Some(&redis));
        s.gate.upstream = Some(format!("http://{backend}"));
        s.gate.timeout_ms = 2000;
        change(&mut s);
        let app = spawn_app(s, false).await;
        flag_on(&redis).await;
        Self { _redis: redis, app, recorder, backend }
    }

    pub fn redis(&self) -> &RedisServer {
        &self._redis
    }

    pub fn vq(&self) -> &str {
        self.app.addr.trim_start_matches("http://")
    }
}

/// `/usr/sbin/nginx` with one shipped server config, in a temp prefix dir, killed on drop.
pub struct Nginx {
    port: u16,
    child: Child,
    dir: tempfile::TempDir,
}

impl Nginx {
    pub async fn start(site: String, port: u16) -> Self {
        Self::start_sized(site, port, 2048).await
    }

    /// Like [`Nginx::start`], with room for `worker_connections` connections (clients and
    /// upstreams together).
    pub async fn start_sized(site: String, port: u16, worker_connections: u32) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();
        std::fs::write(dir.path().join("site.conf"), site).unwrap();
        let conf = format!(
            "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
             events {{ worker_connections {worker_connections}; }}\n\
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

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn error_log(&self) -> String {
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
pub const AUTH_LAYER: &str = "set $vq_user_id \"\";";
/// The test's stand-in for a login: the authenticated user comes in `X-Authenticated-User`.
pub const STAND_IN_LOGIN: &str = "set $vq_user_id $http_x_authenticated_user;";

pub fn shipped(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/nginx").join(name);
    std::fs::read_to_string(path).unwrap()
}

/// `deploy/nginx/vq.conf` with its three replicas all pointing at `vq`.
pub fn vq_conf(vq: &str, listen: u16, login: bool) -> String {
    let conf = shipped("vq.conf")
        .replace("vq1:8080", vq)
        .replace("vq2:8080", vq)
        .replace("vq3:8080", vq)
        .replace("listen 80;", &format!("listen 127.0.0.1:{listen};"));
    if login { conf.replace(AUTH_LAYER, STAND_IN_LOGIN) } else { conf }
}

/// `deploy/nginx/auth-request.conf` asking `vq` and forwarding to `backend`.
pub fn auth_request_conf(vq: &str, backend: &str, listen: u16, login: bool) -> String {
    let conf = shipped("auth-request.conf")
        .replace("@LISTEN@", &listen.to_string())
        .replace("@VQ@", &format!("server {vq};"))
        .replace("@BACKEND@", backend);
    if login { conf.replace(AUTH_LAYER, STAND_IN_LOGIN) } else { conf }
}
