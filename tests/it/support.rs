//! Test harness: a real `redis-server` per test on a free loopback port, and `vq serve`
//! in-process on 127.0.0.1:0 (or as a real process for multi-instance tests).
//!
//! One file (over 400 lines): every test module imports its helpers from here, so a newcomer
//! finds how a test gets Redis, a cluster, an app or a process in one place.

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
    /// On a free port; when another process takes that port first (the child exits), on
    /// another one.
    pub fn spawn() -> Self {
        let mut last = String::new();
        for _ in 0..5 {
            match Self::try_spawn_on(free_port()) {
                Ok(server) => return server,
                Err(e) => last = e,
            }
        }
        panic!("redis-server did not start on five free ports; last: {last}");
    }

    /// The redis-server's PID (to stop and continue it: `kill -STOP` / `kill -CONT`).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("a running redis-server").id()
    }

    pub fn spawn_on(port: u16) -> Self {
        Self::try_spawn_on(port).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A replica of the server on `primary_port` (which may be a [`Relay`]'s port), with
    /// persistence off like every test server; waits until its replication link is up.
    pub fn spawn_replica_of(primary_port: u16) -> Self {
        let mut last = String::new();
        for _ in 0..5 {
            match Self::try_spawn_with(free_port(), &["--replicaof", "127.0.0.1", &primary_port.to_string()]) {
                Ok(server) => {
                    server.wait_for_link();
                    return server;
                }
                Err(e) => last = e,
            }
        }
        panic!("replica did not start on five free ports; last: {last}");
    }

    fn wait_for_link(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let info = redis::Client::open(self.url())
                .and_then(|c| c.get_connection())
                .and_then(|mut conn| redis::cmd("INFO").arg("replication").query::<String>(&mut conn))
                .unwrap_or_default();
            if info.contains("master_link_status:up") {
                return;
            }
            assert!(Instant::now() < deadline, "replica {} never synced: {info}", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn try_spawn_on(port: u16) -> Result<Self, String> {
        Self::try_spawn_with(port, &[])
    }

    fn try_spawn_with(port: u16, extra: &[&str]) -> Result<Self, String> {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(extra)
            .current_dir(dir.path());
        let child = launch(cmd, port)?;
        Ok(Self { port, child: Some(child), _dir: dir })
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

/// A TCP relay on a free loopback port to another loopback port, in threads of its own: what
/// a failover moves (a virtual IP, a DNS name) and a replication link the test can hold up.
/// [`Relay::freeze`] drops every byte from the far end from then on (the near end sees a
/// silent, open link: a replica that falls behind); [`Relay::retarget`] closes the open
/// connections and sends new ones to another port.
pub struct Relay {
    pub port: u16,
    state: Arc<RelayState>,
}

struct RelayState {
    to: std::sync::atomic::AtomicU16,
    frozen: std::sync::atomic::AtomicBool,
    generation: std::sync::atomic::AtomicU64,
    stop: std::sync::atomic::AtomicBool,
}

impl Relay {
    pub fn start(to: u16) -> Self {
        use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
        let listener = StdListener::bind("127.0.0.1:0").expect("bind relay");
        let port = listener.local_addr().expect("addr").port();
        let state = Arc::new(RelayState {
            to: AtomicU16::new(to),
            frozen: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let st = state.clone();
        std::thread::spawn(move || {
            for near in listener.incoming() {
                if st.stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(near) = near else { continue };
                let generation = st.generation.load(Ordering::SeqCst);
                let Ok(far) = std::net::TcpStream::connect(("127.0.0.1", st.to.load(Ordering::SeqCst))) else {
                    continue;
                };
                for (from, to, freezes) in [(near.try_clone(), far.try_clone(), false), (Ok(far), Ok(near), true)] {
                    let (Ok(from), Ok(to)) = (from, to) else { continue };
                    let st = st.clone();
                    std::thread::spawn(move || relay_copy(from, to, freezes, generation, &st));
                }
            }
        });
        Self { port, state }
    }

    /// From now on the far end's bytes are dropped, the link stays open.
    pub fn freeze(&self) {
        self.state.frozen.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Closes the open connections (within 100 ms); new ones go to `to`.
    pub fn retarget(&self, to: u16) {
        use std::sync::atomic::Ordering;
        self.state.to.store(to, Ordering::SeqCst);
        self.state.generation.fetch_add(1, Ordering::SeqCst);
    }
}

fn relay_copy(
    mut from: std::net::TcpStream,
    mut to: std::net::TcpStream,
    freezes: bool,
    generation: u64,
    st: &RelayState,
) {
    use std::io::{Read, Write};
    use std::sync::atomic::Ordering;
    let _ = from.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if st.stop.load(Ordering::SeqCst) || st.generation.load(Ordering::SeqCst) != generation {
            break;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if freezes && st.frozen.load(Ordering::SeqCst) {
                    continue;
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(std::net::Shutdown::Both);
    let _ = to.shutdown(std::net::Shutdown::Both);
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.state.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // Wakes the accepting thread so it sees `stop`.
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// A 3-primary Redis Cluster on loopback (`--cluster-replicas 0`), each node on a free
/// port with its bus on another free port; every node is killed on drop.
pub struct RedisCluster {
    pub ports: Vec<u16>,
    children: Vec<Child>,
    _dir: tempfile::TempDir,
}

impl RedisCluster {
    pub fn spawn() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cluster = Self { ports: Vec::new(), children: Vec::new(), _dir: dir };
        let mut tries = 0;
        while cluster.ports.len() < 3 {
            let (port, bus) = (free_port(), free_port());
            let node_dir = cluster._dir.path().join(port.to_string());
            std::fs::create_dir_all(&node_dir).expect("node dir");
            let mut cmd = Command::new("redis-server");
            cmd.args(["--port", &port.to_string(), "--cluster-port", &bus.to_string(), "--bind", "127.0.0.1"])
                .args(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"])
                .args(["--save", "", "--appendonly", "no"])
                .current_dir(&node_dir);
            match launch(cmd, port) {
                Ok(child) => {
                    cluster.ports.push(port);
                    cluster.children.push(child);
                }
                // Another process took one of the two ports first: new ones.
                Err(e) if tries < 5 => {
                    tries += 1;
                    eprintln!("cluster node: {e}; trying other ports");
                }
                Err(e) => panic!("{e}"),
            }
        }
        let addrs: Vec<String> = cluster.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli must be installed (package redis-tools)");
        assert!(out.status.success(), "cluster create failed: {}", String::from_utf8_lossy(&out.stdout));
        // Every node must agree that all slots are served before a client reads the slot map.
        let deadline = Instant::now() + Duration::from_secs(10);
        for port in &cluster.ports {
            loop {
                let info = redis::Client::open(format!("redis://127.0.0.1:{port}"))
                    .and_then(|c| c.get_connection())
                    .and_then(|mut conn| redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut conn))
                    .unwrap_or_default();
                if info.contains("cluster_state:ok") {
                    break;
                }
                assert!(Instant::now() < deadline, "cluster node {port} not ready: {info}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        cluster
    }

    /// The value of `redis.cluster_nodes` / `VQ_REDIS__CLUSTER_NODES`.
    pub fn nodes(&self) -> String {
        self.ports.iter().map(|p| format!("redis://127.0.0.1:{p}")).collect::<Vec<_>>().join(",")
    }

    pub async fn conn(&self) -> redis::cluster_async::ClusterConnection {
        redis::cluster::ClusterClient::new(self.ports.iter().map(|p| format!("redis://127.0.0.1:{p}")))
            .expect("cluster client")
            .get_async_connection()
            .await
            .expect("connect to test cluster")
    }

    /// A plain connection to one node (for per-node commands: CLUSTER, SCRIPT, INFO).
    pub async fn node_conn(&self, port: u16) -> redis::aio::MultiplexedConnection {
        redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to cluster node")
    }

    /// The port of the primary serving `key`'s slot.
    pub async fn node_of(&self, key: &str) -> u16 {
        let mut c = self.node_conn(self.ports[0]).await;
        let slot: i64 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query_async(&mut c).await.expect("keyslot");
        let ranges: Vec<redis::Value> = redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut c).await.expect("slots");
        for r in ranges {
            let redis::Value::Array(items) = r else { continue };
            let (Some(redis::Value::Int(lo)), Some(redis::Value::Int(hi)), Some(redis::Value::Array(primary))) =
                (items.first(), items.get(1), items.get(2))
            else {
                continue;
            };
            if (*lo..=*hi).contains(&slot)
                && let Some(redis::Value::Int(port)) = primary.get(1)
            {
                return u16::try_from(*port).expect("port");
            }
        }
        panic!("no node serves slot {slot}");
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `redis-server` and waits (at most 30 s: a loaded machine starts it slowly) until it
/// answers on `port` as itself (its `process_id`); an error when it exits first or another
/// server holds the port, or it never answers.
fn launch(mut cmd: Command, port: u16) -> Result<Child, String> {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server must be installed (scripts/test.sh installs it: apt-get install -y redis-server)");
    let url = format!("redis://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("redis-server on port {port} exited ({status})"));
        }
        // The server answering must be this child, not another test's that took the port.
        let info = redis::Client::open(url.as_str())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
            .and_then(|mut conn| {
                conn.set_read_timeout(Some(Duration::from_millis(500)))?;
                redis::cmd("INFO").arg("server").query::<String>(&mut conn)
            });
        if let Ok(info) = info {
            if info.lines().any(|l| l.trim() == format!("process_id:{}", child.id())) {
                return Ok(child);
            }
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("port {port} is another redis-server's"));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("redis-server did not answer PING on port {port} within 30 s"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Settings for tests on the cluster: those of [`test_settings`], in Redis Cluster mode.
pub fn cluster_settings(cluster: &RedisCluster) -> Settings {
    let mut s = test_settings(None);
    s.store = StoreKind::Redis;
    s.redis.url = "redis://127.0.0.1:1".into(); // never used in cluster mode
    s.redis.cluster_nodes = Some(cluster.nodes());
    s
}

/// Settings for tests: small ticks so pump behaviour shows within a second or two.
pub fn test_settings(redis: Option<&RedisServer>) -> Settings {
    let mut s = Settings::load(None, &Overrides::default()).expect("default settings");
    match redis {
        Some(r) => s.redis.url = r.url().into(),
        None => s.store = StoreKind::Memory,
    }
    s.queue.tick_ms = 500;
    s.queue.batch_size = 10;
    s.flag.refresh_ms = 100;
    s.redis.timeout_ms = TEST_REDIS_TIMEOUT_MS;
    s.targets.ranges = TEST_TARGET_RANGES.iter().map(|r| (*r).to_owned()).collect();
    s
}

/// The targets the tests' apps and processes declare: ids 1 to 100 of both types. Tests of
/// undeclared targets use ids above 100.
pub const TEST_TARGET_RANGES: [&str; 2] = ["limited-drop:1-100", "ticketing-event:1-100"];

/// [`TEST_TARGET_RANGES`] as the value of `VQ_TARGETS__RANGES`.
pub fn test_ranges_env() -> String {
    format!("[{}]", TEST_TARGET_RANGES.map(|r| format!("\"{r}\"")).join(","))
}

/// `vq` with the tests' declared targets in its environment ([`TEST_TARGET_RANGES`]).
pub fn vq_command() -> Command {
    let mut cmd = Command::new(vq_bin());
    cmd.env("VQ_TARGETS__RANGES", test_ranges_env());
    cmd
}

/// `redis.timeout_ms` of the tests' apps and processes: under the whole suite on two cores a
/// healthy Redis call can take longer than the default 250 ms, and a request would then fail
/// open where a test expects the queue. Tests of fail-open on a slow Redis set their own.
pub const TEST_REDIS_TIMEOUT_MS: u64 = 2000;

pub fn open_store(settings: &Settings) -> AnyStore {
    match settings.store {
        StoreKind::Redis if settings.redis_cluster_nodes().is_some() => AnyStore::Redis(
            RedisStore::connect_cluster(
                &settings.redis_cluster_nodes().expect("checked"),
                settings.limits(),
                Duration::from_millis(500),
            )
            .expect("cluster store"),
        ),
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
    spawn_app_with(settings, ServeOptions { pump, flag_on: false }).await
}

/// [`spawn_app`] with the queue turned on by the app itself (`vq serve --flag-on`), as the
/// embedded store needs.
pub async fn spawn_app_flag_on(settings: Settings, pump: bool) -> TestApp {
    spawn_app_with(settings, ServeOptions { pump, flag_on: true }).await
}

async fn spawn_app_with(settings: Settings, options: ServeOptions) -> TestApp {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = format!("http://{}", listener.local_addr().expect("addr"));
    let cancel = CancellationToken::new();
    let handle = tokio::spawn(run(listener, Arc::new(settings), secret(), options, cancel.clone()));
    TestApp { addr, client: reqwest::Client::new(), cancel, handle: Some(handle) }
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.addr, path)
    }

    pub async fn enter(&self, target: &str, user: impl std::fmt::Display) -> reqwest::Response {
        self.client
            .post(self.url(&format!("/virtual-queues/{target}/entries")))
            .header("X-User-Id", user.to_string())
            .send()
            .await
            .expect("enter request")
    }

    pub async fn poll(&self, target: &str, user: impl std::fmt::Display) -> reqwest::Response {
        self.client
            .get(self.url(&format!("/virtual-queues/{target}/entries/me")))
            .header("X-User-Id", user.to_string())
            .send()
            .await
            .expect("poll request")
    }

    pub async fn leave(&self, target: &str, user: impl std::fmt::Display) -> reqwest::Response {
        self.client
            .delete(self.url(&format!("/virtual-queues/{target}/entries/me")))
            .header("X-User-Id", user.to_string())
            .send()
            .await
            .expect("leave request")
    }

    /// Waits (5 s at most) until `user` entering `target` is queued (`WAITING`): the instance
    /// uses Redis again after an outage, without a restart.
    pub async fn wait_until_queued(&self, target: &str, user: u64) {
        for _ in 0..50 {
            if self.json(self.enter(target, user).await).await["status"] == "WAITING" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the queue did not come back without restarting vq");
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

/// Turns the queue on for everyone, as `vq flag on` does, and waits until every live instance
/// acknowledged it; fails when none did within 5 s (an instance that never saw the flag would
/// make the test's queue silently off). Before any instance runs, [`flag_on_before_start`].
pub async fn flag_on(redis: &RedisServer) {
    let version = write_flag_on(redis).await;
    let store = open_store(&test_settings(Some(redis)));
    let started = Instant::now();
    loop {
        let acks = vq::store::FlagOps::flag_acks(&store).await.unwrap_or_default();
        let live: Vec<_> = acks.iter().filter(|a| a.silent_ms.is_none()).collect();
        if !live.is_empty() && live.iter().all(|a| a.version >= version) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no live instance acknowledged flag version {version} within 5 s: {acks:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Turns the queue on before any instance runs (an instance reads the flag when it starts).
pub async fn flag_on_before_start(redis: &RedisServer) {
    write_flag_on(redis).await;
}

async fn write_flag_on(redis: &RedisServer) -> u64 {
    let mut c = redis.conn().await;
    let _: () = c.hset_multiple("virtual-queue:flag", &[("enabled", "1"), ("percent", "100")]).await.expect("hset");
    c.hincr("virtual-queue:flag", "version", 1).await.expect("hincr")
}

/// Waits, if need be, until at least `need_ms` of the current admission tick of `tick_ms` are
/// left (ticks start at multiples of it), so steps that must share a tick do.
pub async fn tick_room(tick_ms: u64, need_ms: u64) {
    let left = tick_ms - vq::service::now_epoch_ms() % tick_ms;
    if left < need_ms {
        tokio::time::sleep(Duration::from_millis(left + 30)).await;
    }
}

/// Sleeps until 30 ms into the next admission tick of `tick_ms` (ticks start at multiples of it).
pub async fn next_tick(tick_ms: u64) {
    let now = vq::service::now_epoch_ms();
    tokio::time::sleep(Duration::from_millis(tick_ms - now % tick_ms + 30)).await;
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
        let mut all = vec![("VQ_REDIS__URL", redis.url()), ("VQ_REDIS__TIMEOUT_MS", TEST_REDIS_TIMEOUT_MS.to_string())];
        all.extend(envs.iter().cloned());
        Self::serve_env(&all).await
    }

    /// Like [`VqProcess::serve`], with the Redis settings in `envs` too (e.g. cluster mode).
    pub async fn serve_env(envs: &[(&str, String)]) -> Self {
        Self::serve_wrapped(&[], envs).await
    }

    /// Like [`VqProcess::serve_env`], run through `wrapper` (e.g. `nice -n 19`), which must
    /// exec vq (so the child's PID is vq's).
    pub async fn serve_wrapped(wrapper: &[&str], envs: &[(&str, String)]) -> Self {
        let port = free_port();
        let mut cmd = match wrapper {
            [] => vq_command(),
            [program, args @ ..] => {
                let mut c = Command::new(program);
                c.args(args).arg(vq_bin());
                c
            }
        };
        cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .env("VQ_TARGETS__RANGES", test_ranges_env())
            .env("VQ_TOKEN_SECRET", SECRET)
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

/// Three `vq serve` processes on one Redis, with the same settings but for the runtime: each
/// runs another (`threads` 0, 1 and 2), so cluster behaviour is checked on all three.
pub async fn three_instances(redis: &RedisServer, envs: &[(&str, String)]) -> Vec<VqProcess> {
    let mut procs = Vec::new();
    for threads in ["0", "1", "2"] {
        let mut envs = envs.to_vec();
        envs.push(("VQ_THREADS", threads.to_owned()));
        procs.push(VqProcess::serve(redis, &envs).await);
    }
    procs
}

/// Enters users `1..=users` into `target` (`limited-drop/42`), spread over the instances in
/// turn; every enter must answer 200.
pub async fn enter_round_robin(procs: &[VqProcess], target: &str, users: u64) {
    let client = reqwest::Client::new();
    for u in 1..=users {
        let p = &procs[(u % procs.len() as u64) as usize];
        let r = client
            .post(format!("{}/virtual-queues/{target}/entries", p.addr))
            .header("X-User-Id", u.to_string())
            .send()
            .await
            .expect("enter request");
        assert_eq!(r.status(), 200);
    }
}

/// A script of `lua/` as vq sends it (`src/store/redis/scripts.rs`): every script has
/// `lua/prelude.lua` in front.
pub fn lua_as_sent(script: &str) -> String {
    format!("{}\n{script}", include_str!("../../lua/prelude.lua"))
}

/// A port another process holds is never mistaken for a started server.
#[test]
fn a_taken_port_is_refused_not_shared() {
    let held = StdListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    assert!(RedisServer::try_spawn_on(port).is_err(), "a port held by a listener");
    let first = RedisServer::spawn();
    let second = RedisServer::try_spawn_on(first.port);
    assert!(second.is_err(), "a port another redis-server holds");
}
