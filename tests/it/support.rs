//! Test harness: a real `redis-server` per test on a free loopback port, and `vq serve`
//! in-process on 127.0.0.1:0 (or as a real process for multi-instance tests).
//!
//! Every test module imports its helpers from here, so a newcomer finds how a test gets
//! Redis, a cluster, an app or a process in one place; the servers themselves (Redis, a
//! cluster, a relay that can stall) are in `support/servers.rs`.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use vq::app::{ServeOptions, run};
use vq::config::{Overrides, Settings, StoreKind};
use vq::domain::FlagChange;
use vq::store::{AnyStore, FlagAck, FlagOps};
use vq::token::Secret;

pub const SECRET: &str = "it-secret-0123456789abcdef0123456789";

pub fn secret() -> Secret {
    Secret::new(SECRET.as_bytes().to_vec()).expect("test secret is long enough")
}

mod servers;

pub use self::servers::{RedisCluster, RedisServer, Relay, free_port};

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

/// The store `vq serve` opens with `settings` ([`vq::app::open_store`]).
pub fn open_store(settings: &Settings) -> AnyStore {
    vq::app::open_store(settings).expect("the test settings open a store")
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
        wait_until(Duration::from_secs(5), "the queue back without restarting vq", async || {
            let r = self.enter(target, user).await;
            r.status() == 200 && self.json(r).await["status"] == "WAITING"
        })
        .await;
    }

    /// The token of an admitted `user` of `target`, polling (a heartbeat too) until admitted;
    /// 20 s at most.
    pub async fn admitted_token(&self, target: &str, user: u64) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let b = self.json(self.poll(target, user).await).await;
            if b["status"] == "ADMITTED" {
                return b["entryToken"].as_str().expect("token").to_owned();
            }
            assert!(Instant::now() < deadline, "user {user} never admitted: {b}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits (10 s at most) until this instance's liveness probe reports the Redis node on
    /// 127.0.0.1:`port` silent (`/readyz`'s `silentNodes`).
    pub async fn wait_silent(&self, port: u16) {
        let node = format!("127.0.0.1:{port}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let ready = self.json(self.client.get(self.url("/readyz")).send().await.expect("readyz")).await;
            if ready["silentNodes"].as_array().is_some_and(|n| n.iter().any(|n| n == &node)) {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "the probe never found {node} silent: {ready}");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
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
/// applied it ([`change_flag`]). Before any instance runs, [`flag_on_before_start`].
pub async fn flag_on(redis: &RedisServer) {
    change_flag(redis, FlagChange::On { percent: 100 }).await;
}

/// Writes one operator change of the flag, as `vq flag` does, and waits until every live
/// instance applied it (as `vq flag` judges it, [`FlagAck::applied`]); fails when none did
/// within 5 s (an instance that never saw the change would make the test's queue silently
/// other than it thinks).
pub async fn change_flag(redis: &RedisServer, change: FlagChange) {
    change_flag_in(&open_store(&test_settings(Some(redis))), change).await;
}

/// [`flag_on`] on a Redis Cluster.
pub async fn cluster_flag_on(cluster: &RedisCluster) {
    change_flag_in(&open_store(&cluster_settings(cluster)), FlagChange::On { percent: 100 }).await;
}

/// [`change_flag`] through `store`.
pub async fn change_flag_in(store: &AnyStore, change: FlagChange) {
    let version = store.change_flag(change).await.expect("write the flag");
    wait_flag_applied(store, version, 1).await;
}

/// Waits until `instances` live instances (at least) applied the flag as stored now, and no
/// live one did not, e.g. after `vq flag` in another process; fails after 5 s.
pub async fn flag_applied_by(redis: &RedisServer, instances: usize) {
    let store = open_store(&test_settings(Some(redis)));
    let version = store.read_stored_flag().await.expect("read the flag").map_or(0, |f| f.version);
    wait_flag_applied(&store, version, instances).await;
}

/// Waits until `instances` live instances (at least) applied flag `version`, and no live one
/// did not, as `vq flag` judges it ([`FlagAck::applied`]); fails after 5 s.
async fn wait_flag_applied(store: &AnyStore, version: u64, instances: usize) {
    let what = format!("{instances} live instance(s) at least, all applying flag version {version}");
    wait_until(Duration::from_secs(5), &what, async || {
        let acks = store.flag_acks().await.unwrap_or_default();
        let live: Vec<&FlagAck> = acks.iter().filter(|a| a.silent_ms.is_none()).collect();
        live.len() >= instances && live.iter().all(|a| a.applied(version))
    })
    .await
}

/// Checks `condition` every 20 ms until it gives a value, and returns it; panics naming `what`
/// when it has not within `within`. For a state the test waits for (a flag applied, a tick
/// begun, a process up) instead of a sleep that guesses how long it takes.
pub async fn wait_for<T>(within: Duration, what: &str, mut condition: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = condition().await {
            return v;
        }
        assert!(Instant::now() < deadline, "waited {within:?} for {what}, in vain");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`wait_for`] a condition that holds or not.
pub async fn wait_until(within: Duration, what: &str, mut condition: impl AsyncFnMut() -> bool) {
    wait_for(within, what, async || condition().await.then_some(())).await
}

/// Turns the queue on before any instance runs (an instance reads the flag when it starts).
pub async fn flag_on_before_start(redis: &RedisServer) {
    let store = open_store(&test_settings(Some(redis)));
    store.change_flag(FlagChange::On { percent: 100 }).await.expect("write the flag");
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
        Self::serve_full(wrapper, &[], envs).await
    }

    /// Like [`VqProcess::serve`], with more arguments to `vq serve` (e.g. `--no-pump`).
    pub async fn serve_args(redis: &RedisServer, args: &[&str], envs: &[(&str, String)]) -> Self {
        let mut all = vec![("VQ_REDIS__URL", redis.url()), ("VQ_REDIS__TIMEOUT_MS", TEST_REDIS_TIMEOUT_MS.to_string())];
        all.extend(envs.iter().cloned());
        Self::serve_full(&[], args, &all).await
    }

    async fn serve_full(wrapper: &[&str], args: &[&str], envs: &[(&str, String)]) -> Self {
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
            .args(args)
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
        wait_until(Duration::from_secs(10), &format!("vq serve answering on {addr}"), async || {
            client.get(format!("{addr}/healthz")).send().await.is_ok()
        })
        .await;
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

/// A script of `lua/` as vq sends it as EVALSHA where Redis refuses functions
/// (`src/store/redis/scripts.rs`), and as its function's body runs: after `lua/prelude.lua`.
pub fn lua_as_sent(script: &str) -> String {
    format!("{}\n{script}", include_str!("../../lua/prelude.lua"))
}

/// The names of the function libraries the server on `c` holds (`FUNCTION LIST`).
pub async fn function_libraries(c: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    let list: Vec<redis::Value> = redis::cmd("FUNCTION").arg("LIST").query_async(c).await.expect("function list");
    list.iter()
        .filter_map(|lib| match lib {
            redis::Value::Array(fields) => fields.chunks(2).find_map(|kv| match kv {
                [redis::Value::BulkString(k), redis::Value::BulkString(v)] if k == b"library_name" => {
                    Some(String::from_utf8_lossy(v).into_owned())
                }
                _ => None,
            }),
            _ => None,
        })
        .collect()
}

/// The waiting users' heartbeats as `queue:{T}:beats` holds them (`prelude.lua`'s beat tags, 0
/// for none), for the given seqs of the target whose keys start with `prefix`.
pub async fn beat_tags(c: &mut redis::aio::MultiplexedConnection, prefix: &str, seqs: &[u64]) -> Vec<u64> {
    let mut cmd = redis::cmd("BITFIELD");
    cmd.arg(format!("{prefix}beats"));
    for s in seqs {
        cmd.arg("GET").arg("u32").arg(format!("#{s}"));
    }
    cmd.query_async(c).await.expect("bitfield get")
}

/// The tag `prelude.lua` writes for a poll at `ms` of Redis' clock, asked of the prelude itself.
pub async fn beat_tag(c: &mut redis::aio::MultiplexedConnection, ms: u64) -> u64 {
    redis::cmd("EVAL")
        .arg(lua_as_sent("return beat_tag(tonumber(ARGV[1]))"))
        .arg(0)
        .arg(ms)
        .query_async(c)
        .await
        .expect("beat_tag")
}
