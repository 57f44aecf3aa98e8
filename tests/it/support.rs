//! Test harness: a real `redis-server` per test on a free loopback port, and `vq serve`
//! in-process on 127.0.0.1:0 (or as a real process for multi-instance tests).

#![allow(dead_code)]

use std::net::TcpListener as StdListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use tokio_util::sync::CancellationToken;
use vq::app::{ServeOptions, run};
use vq::config::{Overrides, Settings, StoreKind};
use vq::store::{AnyStore, MemoryStore, RedisStore};
use vq::token::Secret;

pub const SECRET: &str = "it-secret-0123456789abcdef0123456789";

pub fn secret() -> Secret {
    Secret::new(SECRET.as_bytes().to_vec()).expect("test secret is long enough")
}

pub fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0").expect("bind port 0").local_addr().expect("addr").port()
}

/// A `redis-server` child on a free port, killed on drop. A missing redis-server fails the
/// test loudly: `scripts/test.sh` installs it.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    pub fn spawn() -> Self {
        Self::spawn_on(free_port())
    }

    pub fn spawn_on(port: u16) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (scripts/test.sh installs it: apt-get install -y redis-server)");
        let server = Self { port, child: Some(child), _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let pong = redis::Client::open(server.url())
                .and_then(|c| c.get_connection())
                .and_then(|mut conn| redis::cmd("PING").query::<String>(&mut conn));
            if pong.is_ok() {
                break;
            }
            assert!(Instant::now() < deadline, "redis-server did not answer PING on port {port}");
            std::thread::sleep(Duration::from_millis(10));
        }
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to test redis")
    }

    /// Kills the process (like a crash).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Settings for tests: small ticks so pump behaviour shows within a second or two.
pub fn test_settings(redis: Option<&RedisServer>) -> Settings {
    let mut s = Settings::load(None, &Overrides::default()).expect("default settings");
    match redis {
        Some(r) => s.redis.url = r.url(),
        None => s.store = StoreKind::Memory,
    }
    s.queue.tick_ms = 500;
    s.queue.batch_size = 10;
    s.flag.refresh_ms = 100;
    s
}

pub fn open_store(settings: &Settings) -> AnyStore {
    match settings.store {
        StoreKind::Redis => AnyStore::Redis(
            RedisStore::connect(&settings.redis.url, settings.limits(), Duration::from_millis(500)).expect("store"),
        ),
        StoreKind::Memory => AnyStore::Memory(MemoryStore::new(settings.limits())),
    }
}

/// `vq serve` running in this test process.
pub struct TestApp {
    pub addr: String,
    pub client: reqwest::Client,
    cancel: CancellationToken,
    handle: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

pub async fn spawn_app(settings: Settings, pump: bool) -> TestApp {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = format!("http://{}", listener.local_addr().expect("addr"));
    let cancel = CancellationToken::new();
    let handle = tokio::spawn(run(
        listener,
        Arc::new(settings),
        secret(),
        ServeOptions { pump, flag_on: false },
        cancel.clone(),
    ));
    TestApp { addr, client: reqwest::Client::new(), cancel, handle: Some(handle) }
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.addr, path)
    }

    pub async fn enter(&self, target: &str, user: u64) -> reqwest::Response {
        self.client
            .post(self.url(&format!("/virtual-queues/{target}/entries")))
            .header("X-User-Id", user.to_string())
            .send()
            .await
            .expect("enter request")
    }

    pub async fn poll(&self, target: &str, user: u64) -> reqwest::Response {
        self.client
            .get(self.url(&format!("/virtual-queues/{target}/entries/me")))
            .header("X-User-Id", user.to_string())
            .send()
            .await
            .expect("poll request")
    }

    pub async fn leave(&self, target: &str, user: u64) -> reqwest::Response {
        self.client
            .delete(self.url(&format!("/virtual-queues/{target}/entries/me")))
            .header("X-User-Id", user.to_string())
            .send()
            .await
            .expect("leave request")
    }

    pub async fn json(&self, resp: reqwest::Response) -> serde_json::Value {
        resp.json().await.expect("json body")
    }

    pub async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(h) = self.handle.take() {
            let _ = h.await;
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Turns the queue on for everyone, as `vq flag on` does, and waits for the app to see it.
pub async fn flag_on(redis: &RedisServer) {
    let mut c = redis.conn().await;
    let _: () = c.hset_multiple("virtual-queue:flag", &[("enabled", "1"), ("percent", "100")]).await.expect("hset");
    let _: i64 = c.hincr("virtual-queue:flag", "version", 1).await.expect("hincr");
    tokio::time::sleep(Duration::from_millis(250)).await;
}

/// Path of the vq binary built for the integration tests.
pub fn vq_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_vq"))
}

/// A `vq` child process, killed on drop.
pub struct VqProcess {
    pub child: Child,
    pub addr: String,
}

impl VqProcess {
    /// Starts `vq serve` on a free port with the test secret and the given env, and waits
    /// until /healthz answers.
    pub async fn serve(redis: &RedisServer, envs: &[(&str, String)]) -> Self {
        let port = free_port();
        let mut cmd = Command::new(vq_bin());
        cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .env("VQ_TOKEN_SECRET", SECRET)
            .env("VQ_REDIS__URL", redis.url())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn vq serve");
        let addr = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while client.get(format!("{addr}/healthz")).send().await.is_err() {
            assert!(Instant::now() < deadline, "vq serve did not come up on {addr}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Self { child, addr }
    }
}

impl Drop for VqProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
