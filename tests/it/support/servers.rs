//! The servers tests run against: a `redis-server` per test on a free loopback port, a Redis
//! Cluster of three, and a relay in front of Redis that a test can stall.

use std::net::TcpListener as StdListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

    /// On a free port, with more `redis-server` arguments (`--rename-command FCALL ""`, …).
    pub fn spawn_with(extra: &[&str]) -> Self {
        let mut last = String::new();
        for _ in 0..5 {
            match Self::try_spawn_with(free_port(), extra) {
                Ok(server) => return server,
                Err(e) => last = e,
            }
        }
        panic!("redis-server did not start on five free ports; last: {last}");
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

impl RedisCluster {
    /// Kills the node on `port` (by its PID, as started here): its slots go unserved.
    pub fn kill_node(&mut self, port: u16) {
        let i = self.ports.iter().position(|p| *p == port).expect("a node of this cluster");
        let _ = self.children[i].kill();
        let _ = self.children[i].wait();
    }

    /// Stops the node on `port` (SIGSTOP to its PID): it keeps its connections but answers
    /// nothing, as a stalled host would. Killed with the rest on drop.
    pub fn stall_node(&mut self, port: u16) {
        let i = self.ports.iter().position(|p| *p == port).expect("a node of this cluster");
        let status = Command::new("kill").args(["-STOP", &self.children[i].id().to_string()]).status();
        assert!(status.is_ok_and(|s| s.success()), "SIGSTOP to node {port}");
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
