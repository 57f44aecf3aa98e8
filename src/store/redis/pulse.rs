//! Whether Redis answers, and what time Redis says it is, seen from a thread of the instance's
//! own.
//!
//! The request path cannot tell a dead Redis from a busy instance by itself: a request whose
//! answer is late may be waiting behind thousands of others in a starved runtime. So a plain
//! OS thread, outside the Tokio runtime, sends `TIME` to every node on a blocking connection of
//! its own every [`PROBE_EVERY`]; the kernel tells it whether an answer came within
//! [`SILENT_AFTER`] (a socket read timeout), whatever the runtime is doing. A node is *silent*
//! after a refused or failed connection, an error reply (loading, busy script, ...) or no
//! answer within that time; it answers again at the next good probe.
//!
//! The same answers give Redis' clock: the offset of the sample with the shortest round trip
//! of the last few, so tokens and countdowns follow the clock every instance shares.
//!
//! Every [`ROLE_EVERY`] it also asks each node how many replicas it has connected (`ROLE`):
//! the replicas a token or a purchase's claim waits for with `redis.wait_replicas = "auto"`
//! (`durable.rs`), known without a command on the request path.
//!
//! Must not: run on the Tokio runtime, or block a caller (readers take one atomic load while
//! every node answers).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};

use crate::domain::QueueTarget;

/// How often every node is asked.
pub const PROBE_EVERY: Duration = Duration::from_millis(100);
/// A node that has not answered a probe within this long is silent (also the connect timeout).
pub const SILENT_AFTER: Duration = Duration::from_millis(1000);
/// How often a cluster's slot map is read again (new primaries after a failover).
const SLOTS_EVERY: Duration = Duration::from_secs(2);
/// How often each node's connected replicas are counted.
const ROLE_EVERY: Duration = Duration::from_secs(1);
/// Clock samples kept; the one with the shortest round trip gives the offset.
const CLOCK_SAMPLES: usize = 8;
/// An offset not known yet.
const UNKNOWN: i64 = i64::MIN;

/// The probe's findings, shared with the store (the thread ends when the store is dropped).
pub struct Pulse {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    /// Some node is silent now: readers look further only then.
    any_silent: AtomicBool,
    /// Addresses (`host:port`) of the silent nodes.
    silent: RwLock<Vec<String>>,
    /// A cluster's slot ranges and the primary serving each; empty for one server.
    slots: RwLock<Vec<(u16, u16, String)>>,
    /// Redis' clock minus this host's, ms ([`UNKNOWN`] before the first answer).
    offset_ms: AtomicI64,
    /// Replicas each node (`host:port`) has connected, at its last `ROLE`.
    replicas: RwLock<HashMap<String, u64>>,
}

impl Pulse {
    /// Starts probing `nodes` (one server's URL, or some of a cluster's nodes: the rest are
    /// found in its slot map).
    pub fn start(nodes: &[String], cluster: bool) -> Result<Self, redis::RedisError> {
        let infos = nodes.iter().map(|n| n.as_str().into_connection_info()).collect::<Result<Vec<_>, _>>()?;
        let shared = Arc::new(Shared { offset_ms: AtomicI64::new(UNKNOWN), ..Shared::default() });
        let probe = Probe {
            shared: shared.clone(),
            template: infos.first().cloned(),
            nodes: infos.into_iter().map(|info| (addr_of(&info), Node { info, conn: None })).collect(),
            cluster,
            samples: VecDeque::with_capacity(CLOCK_SAMPLES),
        };
        std::thread::Builder::new()
            .name("vq-redis-pulse".into())
            .spawn(move || probe.run())
            .map_err(|e| redis::RedisError::from(std::io::Error::other(e)))?;
        Ok(Self { shared })
    }

    /// No probe: the embedded server in this process, which always answers, has no replicas
    /// and keeps this host's time.
    pub fn idle() -> Self {
        Self { shared: Arc::new(Shared { offset_ms: AtomicI64::new(0), ..Shared::default() }) }
    }

    /// Whether the node holding `target`'s keys (any node, without a target, or when the slot
    /// map is not known) failed its last probe: Redis is down, refusing or stalled, as opposed
    /// to this instance being slow to read its answers.
    pub fn silent(&self, target: Option<QueueTarget>) -> bool {
        // The tag only once a node is silent: this runs for every request.
        self.any_silent() && self.silent_tag(target.map(super::keys::tag).as_deref())
    }

    /// Whether any node failed its last probe: one atomic read, for the request path to ask
    /// before it works out which node it needs.
    pub fn any_silent(&self) -> bool {
        self.shared.any_silent.load(Ordering::Relaxed)
    }

    /// The nodes (`host:port`) that failed the last probe, in no set order.
    pub fn silent_nodes(&self) -> Vec<String> {
        self.shared.silent.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether the node holding the keys of hash tag `tag` (any node, without one, or when
    /// the slot map is not known) failed its last probe.
    pub fn silent_tag(&self, tag: Option<&str>) -> bool {
        if !self.any_silent() {
            return false;
        }
        let silent = self.shared.silent.read().unwrap_or_else(|e| e.into_inner());
        let slots = self.shared.slots.read().unwrap_or_else(|e| e.into_inner());
        let Some(tag) = tag.filter(|_| !slots.is_empty()) else { return !silent.is_empty() };
        let slot = key_slot(tag.as_bytes());
        match slots.iter().find(|(lo, hi, _)| (*lo..=*hi).contains(&slot)) {
            Some((_, _, addr)) => silent.iter().any(|s| s == addr),
            None => !silent.is_empty(),
        }
    }

    /// The replicas connected to the primary holding `target`'s keys at its last count (the
    /// most of any node while the slot map is not known); 0 before the first count.
    pub fn replicas(&self, target: QueueTarget) -> u64 {
        let replicas = self.shared.replicas.read().unwrap_or_else(|e| e.into_inner());
        let slots = self.shared.slots.read().unwrap_or_else(|e| e.into_inner());
        let slot = key_slot(super::keys::tag(target).as_bytes());
        match slots.iter().find(|(lo, hi, _)| (*lo..=*hi).contains(&slot)) {
            Some((_, _, addr)) => replicas.get(addr).copied().unwrap_or(0),
            None => replicas.values().copied().max().unwrap_or(0),
        }
    }

    /// Redis' clock minus this host's, in ms, once a probe has been answered.
    pub fn clock_offset_ms(&self) -> Option<i64> {
        Some(self.shared.offset_ms.load(Ordering::Relaxed)).filter(|o| *o != UNKNOWN)
    }
}

impl Drop for Pulse {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}

struct Node {
    info: ConnectionInfo,
    conn: Option<redis::Connection>,
}

/// The probing thread's own state.
struct Probe {
    shared: Arc<Shared>,
    /// Credentials and settings for nodes found in the slot map.
    template: Option<ConnectionInfo>,
    nodes: HashMap<String, Node>,
    cluster: bool,
    /// (round trip, offset) of the latest answers.
    samples: VecDeque<(u64, i64)>,
}

impl Probe {
    fn run(mut self) {
        let mut slots_read: Option<Instant> = None;
        let mut roles_read: Option<Instant> = None;
        while !self.shared.stop.load(Ordering::Relaxed) {
            let mut silent = Vec::new();
            let addrs: Vec<String> = self.nodes.keys().cloned().collect();
            for addr in addrs {
                if !self.probe(&addr) {
                    silent.push(addr);
                }
            }
            self.shared.any_silent.store(!silent.is_empty(), Ordering::Relaxed);
            *self.shared.silent.write().unwrap_or_else(|e| e.into_inner()) = silent;
            if self.cluster && slots_read.is_none_or(|at| at.elapsed() >= SLOTS_EVERY) {
                slots_read = Some(Instant::now());
                self.read_slots();
            }
            if roles_read.is_none_or(|at| at.elapsed() >= ROLE_EVERY) {
                roles_read = Some(Instant::now());
                self.count_replicas();
            }
            std::thread::sleep(PROBE_EVERY);
        }
    }

    /// One `TIME` to one node; false when it did not answer in time (or refused, or erred).
    fn probe(&mut self, addr: &str) -> bool {
        let Some(node) = self.nodes.get_mut(addr) else { return false };
        if node.conn.is_none() {
            node.conn = open(&node.info).ok();
        }
        let Some(conn) = node.conn.as_mut() else { return false };
        let sent = epoch_ms_f64();
        let asked = Instant::now();
        match redis::cmd("TIME").query::<(u64, u64)>(conn) {
            Ok((secs, micros)) => {
                let rtt = asked.elapsed().as_millis() as u64;
                let redis_ms = secs as f64 * 1000.0 + micros as f64 / 1000.0;
                let offset = (redis_ms - (sent + epoch_ms_f64()) / 2.0).round() as i64;
                self.sample(rtt, offset);
                true
            }
            Err(_) => {
                // A late answer must not be read as the next probe's: start afresh.
                node.conn = None;
                false
            }
        }
    }

    fn sample(&mut self, rtt: u64, offset: i64) {
        if self.samples.len() == CLOCK_SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back((rtt, offset));
        if let Some((_, best)) = self.samples.iter().min_by_key(|(rtt, _)| *rtt) {
            self.shared.offset_ms.store(*best, Ordering::Relaxed);
        }
    }

    /// `ROLE` of every node that answers: a primary lists its connected replicas (a replica
    /// has none of its own). A node that does not answer keeps its last count.
    fn count_replicas(&mut self) {
        let mut counts = Vec::new();
        for (addr, node) in &mut self.nodes {
            let Some(conn) = node.conn.as_mut() else { continue };
            match redis::cmd("ROLE").query::<redis::Value>(conn) {
                Ok(role) => counts.push((addr.clone(), connected_replicas(&role))),
                // A late answer must not be read as the next probe's.
                Err(_) => node.conn = None,
            }
        }
        let mut replicas = self.shared.replicas.write().unwrap_or_else(|e| e.into_inner());
        replicas.extend(counts);
    }

    /// Reads `CLUSTER SLOTS` from a node that answers: which primary serves which slots, and
    /// any primary not probed yet.
    fn read_slots(&mut self) {
        let Some(template) = self.template.clone() else { return };
        for node in self.nodes.values_mut() {
            let Some(conn) = node.conn.as_mut() else { continue };
            let Ok(ranges) = redis::cmd("CLUSTER").arg("SLOTS").query::<Vec<redis::Value>>(conn) else { continue };
            let slots: Vec<(u16, u16, String)> = ranges.iter().filter_map(slot_range).collect();
            for (_, _, addr) in &slots {
                if !self.nodes.contains_key(addr)
                    && let Some((host, port)) = addr.rsplit_once(':').and_then(|(h, p)| Some((h, p.parse().ok()?)))
                {
                    let info = template.clone().set_addr(ConnectionAddr::Tcp(host.to_owned(), port));
                    self.nodes.insert(addr.clone(), Node { info, conn: None });
                }
            }
            *self.shared.slots.write().unwrap_or_else(|e| e.into_inner()) = slots;
            return;
        }
    }
}

/// A blocking connection whose reads and writes give up after [`SILENT_AFTER`].
fn open(info: &ConnectionInfo) -> Result<redis::Connection, redis::RedisError> {
    let conn = redis::Client::open(info.clone())?.get_connection_with_timeout(SILENT_AFTER)?;
    conn.set_read_timeout(Some(SILENT_AFTER))?;
    conn.set_write_timeout(Some(SILENT_AFTER))?;
    Ok(conn)
}

fn addr_of(info: &ConnectionInfo) -> String {
    match info.addr() {
        ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
        other => other.to_string(),
    }
}

/// `[start, end, [host, port, ...], replicas...]` → (start, end, "host:port") of the primary.
fn slot_range(v: &redis::Value) -> Option<(u16, u16, String)> {
    use redis::Value;
    let Value::Array(items) = v else { return None };
    let int = |v: &Value| match v {
        Value::Int(n) => u16::try_from(*n).ok(),
        _ => None,
    };
    let (lo, hi) = (int(items.first()?)?, int(items.get(1)?)?);
    let Value::Array(primary) = items.get(2)? else { return None };
    let host = match primary.first()? {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        _ => return None,
    };
    let port = primary.get(1).and_then(|p| match p {
        Value::Int(n) => u16::try_from(*n).ok(),
        _ => None,
    })?;
    Some((lo, hi, format!("{host}:{port}")))
}

/// `ROLE`'s answer → the replicas a primary lists (`["master", offset, [[ip, port, offset], ...]]`);
/// 0 for a replica.
fn connected_replicas(role: &redis::Value) -> u64 {
    use redis::Value;
    let Value::Array(items) = role else { return 0 };
    let is_primary = matches!(items.first(), Some(Value::BulkString(b)) if b == b"master");
    match items.get(2) {
        Some(Value::Array(replicas)) if is_primary => replicas.len() as u64,
        _ => 0,
    }
}

/// The Redis Cluster slot of a key: CRC16 (XMODEM) of its hash tag, modulo 16384.
fn key_slot(tag: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in tag {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc % 16384
}

fn epoch_ms_f64() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_slots_are_redis_cluster_slots() {
        // Values from `CLUSTER KEYSLOT` of Redis 7.
        assert_eq!(key_slot(b"123456789"), 12739);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"LIMITED_DROP:1"), 12348);
    }
}
