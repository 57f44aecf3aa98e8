//! An in-process keyspace with Redis' semantics for the commands vq sends (those of `lua/`
//! and of `store/redis/`'s glue): strings, hashes, sorted sets, lists, sets and streams, each
//! key with an optional expiry read against the store's [`Clock`](crate::clock::Clock).
//!
//! Redis is the reference: `tests/it/embedded.rs` sends the same commands here and to a real
//! `redis-server` and compares the answers, errors included. What it must not do: answer a
//! command it does not implement as if it did (an unknown command is Redis' `ERR unknown
//! command`), or keep an empty container (Redis deletes a hash, set, list or sorted set whose
//! last element goes).

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::ops::Bound;

use super::reply::{NOT_FLOAT, NOT_INTEGER, Reply, SYNTAX, WRONGTYPE};
use crate::clock::SharedClock;

/// A sorted set's score, ordered as Redis orders them (no NaN is ever stored).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Score(f64);

impl Eq for Score {}

impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Score {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Members by score, ties by member bytes (Redis' order), and each member's score.
#[derive(Debug, Default, Clone)]
struct ZSet {
    scores: HashMap<Vec<u8>, f64>,
    order: BTreeSet<(Score, Vec<u8>)>,
}

impl ZSet {
    fn insert(&mut self, member: Vec<u8>, score: f64) {
        if let Some(old) = self.scores.insert(member.clone(), score) {
            self.order.remove(&(Score(old), member.clone()));
        }
        self.order.insert((Score(score), member));
    }

    fn remove(&mut self, member: &[u8]) -> bool {
        match self.scores.remove(member) {
            Some(old) => {
                self.order.remove(&(Score(old), member.to_vec()));
                true
            }
            None => false,
        }
    }

    fn len(&self) -> usize {
        self.scores.len()
    }

    /// Members with `min <= score <= max` (each end exclusive where said), lowest first.
    fn by_score(&self, min: Edge, max: Edge) -> impl DoubleEndedIterator<Item = &(Score, Vec<u8>)> {
        let lo = match min {
            Edge { value, exclusive: false } if value == f64::NEG_INFINITY => Bound::Unbounded,
            Edge { value, exclusive: false } => Bound::Included((Score(value), Vec::new())),
            Edge { value, exclusive: true } => Bound::Included((Score(value.next_up()), Vec::new())),
        };
        let hi = match max {
            Edge { value, exclusive: false } if value == f64::INFINITY => Bound::Unbounded,
            Edge { value, exclusive: false } => Bound::Excluded((Score(value.next_up()), Vec::new())),
            Edge { value, exclusive: true } => Bound::Excluded((Score(value), Vec::new())),
        };
        let empty = min.value > max.value
            || (min.value == max.value && (min.exclusive || max.exclusive))
            || (min.exclusive && min.value == f64::INFINITY)
            || (max.exclusive && max.value == f64::NEG_INFINITY);
        let range = if empty { None } else { Some(self.order.range((lo, hi))) };
        range.into_iter().flatten()
    }
}

/// One end of a score range: `5`, `(5`, `-inf`, `+inf`.
#[derive(Debug, Clone, Copy)]
struct Edge {
    value: f64,
    exclusive: bool,
}

/// A hash's fields.
type Fields = HashMap<Vec<u8>, Vec<u8>>;

/// A stream entry's id.
type StreamId = (u64, u64);

#[derive(Debug, Default, Clone)]
struct Stream {
    entries: VecDeque<(StreamId, Vec<Vec<u8>>)>,
    last: StreamId,
}

#[derive(Debug, Clone)]
enum Data {
    Str(Vec<u8>),
    Hash(Fields),
    ZSet(ZSet),
    List(VecDeque<Vec<u8>>),
    Set(HashSet<Vec<u8>>),
    Stream(Stream),
}

#[derive(Debug, Clone)]
struct Entry {
    data: Data,
    /// When the key expires, in epoch ms; `None`: never.
    expires_at: Option<u64>,
}

/// Every key, on the store's clock.
pub struct Keyspace {
    keys: HashMap<Vec<u8>, Entry>,
    clock: SharedClock,
    /// "Now" frozen for the length of a script, as Redis does.
    frozen_now: Option<u64>,
    /// When expired keys nobody touched are next swept out (ms).
    next_sweep: u64,
}

/// How often keys that expired untouched are removed (Redis samples them; this walks all).
const SWEEP_EVERY_MS: u64 = 1_000;

type Args<'a> = &'a [Vec<u8>];

impl Keyspace {
    pub fn new(clock: SharedClock) -> Self {
        Self { keys: HashMap::new(), clock, frozen_now: None, next_sweep: 0 }
    }

    /// Now, in epoch ms: the clock's, or the time frozen for a script.
    pub fn now_ms(&self) -> u64 {
        self.frozen_now.unwrap_or_else(|| self.clock.now_ms())
    }

    /// Freezes "now" (a script starts) or lets it run again (`None`: the script ended).
    pub fn freeze_time(&mut self, at: Option<u64>) {
        self.frozen_now = at;
    }

    /// The number of live keys.
    pub fn len(&mut self) -> usize {
        self.sweep(true);
        self.keys.len()
    }

    /// Removes the keys whose time has passed; at most once per [`SWEEP_EVERY_MS`] unless
    /// `now`.
    fn sweep(&mut self, force: bool) {
        let now = self.now_ms();
        if !force && now < self.next_sweep {
            return;
        }
        self.next_sweep = now.saturating_add(SWEEP_EVERY_MS);
        self.keys.retain(|_, e| e.expires_at.is_none_or(|at| at > now));
    }

    /// A live key (an expired one is removed first, as Redis does when a key is touched).
    fn live(&mut self, key: &[u8]) -> Option<&mut Entry> {
        let now = self.now_ms();
        if self.keys.get(key).is_some_and(|e| e.expires_at.is_some_and(|at| at <= now)) {
            self.keys.remove(key);
        }
        self.keys.get_mut(key)
    }

    fn exists(&mut self, key: &[u8]) -> bool {
        self.live(key).is_some()
    }

    /// Removes `key` if its container is empty.
    fn drop_if_empty(&mut self, key: &[u8]) {
        let empty = match self.keys.get(key).map(|e| &e.data) {
            Some(Data::Hash(h)) => h.is_empty(),
            Some(Data::ZSet(z)) => z.len() == 0,
            Some(Data::List(l)) => l.is_empty(),
            Some(Data::Set(s)) => s.is_empty(),
            _ => false,
        };
        if empty {
            self.keys.remove(key);
        }
    }

    /// Runs one command (`args[0]` its name) and answers it.
    pub fn exec(&mut self, args: Args) -> Reply {
        self.sweep(false);
        let Some(name) = args.first() else { return Reply::err("ERR empty command") };
        let raw = String::from_utf8_lossy(name);
        let name = raw.to_ascii_uppercase();
        let a = &args[1..];
        match self.dispatch(&name, a) {
            Err(Fail::Unknown) => {
                let first: String = a.iter().take(3).map(|x| format!("'{}' ", String::from_utf8_lossy(x))).collect();
                Reply::Error(format!("ERR unknown command '{raw}', with args beginning with: {first}"))
            }
            Ok(r) => r,
            Err(Fail::Arity) => {
                Reply::Error(format!("ERR wrong number of arguments for '{}' command", name.to_lowercase()))
            }
            Err(Fail::Reply(r)) => r,
        }
    }

    fn dispatch(&mut self, name: &str, a: Args) -> Result<Reply, Fail> {
        match name {
            // Server.
            "PING" => Ok(match a {
                [] => Reply::Status("PONG".into()),
                [m] => Reply::Bulk(m.clone()),
                _ => return Err(Fail::Arity),
            }),
            "TIME" => {
                arity(a, 0, 0)?;
                let now = self.now_ms();
                Ok(Reply::bulks([
                    (now / 1000).to_string().into_bytes(),
                    ((now % 1000) * 1000).to_string().into_bytes(),
                ]))
            }
            "DBSIZE" => Ok(Reply::Int(self.len() as i64)),
            "FLUSHALL" | "FLUSHDB" => {
                self.keys.clear();
                Ok(Reply::ok())
            }
            // Generic keys.
            "DEL" | "UNLINK" => {
                arity(a, 1, usize::MAX)?;
                let mut n = 0;
                for k in a {
                    if self.exists(k) {
                        self.keys.remove(k);
                        n += 1;
                    }
                }
                Ok(Reply::Int(n))
            }
            "EXISTS" => {
                arity(a, 1, usize::MAX)?;
                Ok(Reply::Int(a.iter().filter(|k| self.exists(k)).count() as i64))
            }
            "TYPE" => {
                arity(a, 1, 1)?;
                let t = match self.live(&a[0]).map(|e| &e.data) {
                    None => "none",
                    Some(Data::Str(_)) => "string",
                    Some(Data::Hash(_)) => "hash",
                    Some(Data::ZSet(_)) => "zset",
                    Some(Data::List(_)) => "list",
                    Some(Data::Set(_)) => "set",
                    Some(Data::Stream(_)) => "stream",
                };
                Ok(Reply::Status(t.into()))
            }
            "EXPIRE" | "PEXPIRE" | "EXPIREAT" | "PEXPIREAT" => self.expire(name, a),
            "TTL" | "PTTL" | "EXPIRETIME" | "PEXPIRETIME" => {
                arity(a, 1, 1)?;
                let now = self.now_ms();
                let Some(e) = self.live(&a[0]) else { return Ok(Reply::Int(-2)) };
                let Some(at) = e.expires_at else { return Ok(Reply::Int(-1)) };
                let left = at.saturating_sub(now) as i64;
                Ok(Reply::Int(match name {
                    "TTL" => (left + 500) / 1000,
                    "PTTL" => left,
                    "EXPIRETIME" => (at / 1000) as i64,
                    _ => at as i64,
                }))
            }
            "PERSIST" => {
                arity(a, 1, 1)?;
                Ok(Reply::Int(match self.live(&a[0]) {
                    Some(e) if e.expires_at.is_some() => {
                        e.expires_at = None;
                        1
                    }
                    _ => 0,
                }))
            }
            "RENAME" => {
                arity(a, 2, 2)?;
                if !self.exists(&a[0]) {
                    return Err(Fail::Reply(Reply::err("ERR no such key")));
                }
                let e = self.keys.remove(&a[0]).expect("checked above");
                self.keys.insert(a[1].clone(), e);
                Ok(Reply::ok())
            }
            // Strings.
            "GET" => {
                arity(a, 1, 1)?;
                Ok(match self.live(&a[0]) {
                    None => Reply::Nil,
                    Some(Entry { data: Data::Str(s), .. }) => Reply::Bulk(s.clone()),
                    Some(_) => return Err(wrongtype()),
                })
            }
            "MGET" => {
                arity(a, 1, usize::MAX)?;
                let mut out = Vec::with_capacity(a.len());
                for k in a {
                    out.push(match self.live(k) {
                        Some(Entry { data: Data::Str(s), .. }) => Reply::Bulk(s.clone()),
                        _ => Reply::Nil,
                    });
                }
                Ok(Reply::Array(out))
            }
            "SET" => self.set_string(a),
            "SETEX" | "PSETEX" => {
                arity(a, 3, 3)?;
                let t = int(&a[1])?;
                if t <= 0 {
                    return Err(Fail::Reply(Reply::Error(format!(
                        "ERR invalid expire time in '{}' command",
                        name.to_lowercase()
                    ))));
                }
                let ms = if name == "SETEX" { t.saturating_mul(1000) } else { t } as u64;
                let at = self.now_ms().saturating_add(ms);
                self.keys.insert(a[0].clone(), Entry { data: Data::Str(a[2].clone()), expires_at: Some(at) });
                Ok(Reply::ok())
            }
            "INCR" | "DECR" | "INCRBY" | "DECRBY" => {
                let by = match name {
                    "INCR" => {
                        arity(a, 1, 1)?;
                        1
                    }
                    "DECR" => {
                        arity(a, 1, 1)?;
                        -1
                    }
                    "INCRBY" => {
                        arity(a, 2, 2)?;
                        int(&a[1])?
                    }
                    _ => {
                        arity(a, 2, 2)?;
                        int(&a[1])?.checked_neg().ok_or_else(|| Fail::Reply(Reply::err(NOT_INTEGER)))?
                    }
                };
                let current = match self.live(&a[0]) {
                    None => 0,
                    Some(Entry { data: Data::Str(s), .. }) => int(s)?,
                    Some(_) => return Err(wrongtype()),
                };
                let next = current
                    .checked_add(by)
                    .ok_or_else(|| Fail::Reply(Reply::err("ERR increment or decrement would overflow")))?;
                let bytes = next.to_string().into_bytes();
                match self.live(&a[0]) {
                    Some(e) => e.data = Data::Str(bytes),
                    None => {
                        self.keys.insert(a[0].clone(), Entry { data: Data::Str(bytes), expires_at: None });
                    }
                }
                Ok(Reply::Int(next))
            }
            // Hashes.
            "HSET" | "HMSET" => {
                if a.len() < 3 || a.len().is_multiple_of(2) {
                    return Err(Fail::Arity);
                }
                let h = self.hash_mut(&a[0])?;
                let mut added = 0;
                for pair in a[1..].chunks(2) {
                    if h.insert(pair[0].clone(), pair[1].clone()).is_none() {
                        added += 1;
                    }
                }
                Ok(if name == "HMSET" { Reply::ok() } else { Reply::Int(added) })
            }
            "HSETNX" => {
                arity(a, 3, 3)?;
                let h = self.hash_mut(&a[0])?;
                if h.contains_key(&a[1]) {
                    return Ok(Reply::Int(0));
                }
                h.insert(a[1].clone(), a[2].clone());
                Ok(Reply::Int(1))
            }
            "HGET" => {
                arity(a, 2, 2)?;
                Ok(self.hash(&a[0])?.and_then(|h| h.get(&a[1])).map_or(Reply::Nil, |v| Reply::Bulk(v.clone())))
            }
            "HMGET" => {
                arity(a, 2, usize::MAX)?;
                let h = self.hash(&a[0])?;
                Ok(Reply::Array(
                    a[1..]
                        .iter()
                        .map(|f| h.and_then(|h| h.get(f)).map_or(Reply::Nil, |v| Reply::Bulk(v.clone())))
                        .collect(),
                ))
            }
            "HGETALL" | "HKEYS" | "HVALS" => {
                arity(a, 1, 1)?;
                let Some(h) = self.hash(&a[0])? else { return Ok(Reply::Array(Vec::new())) };
                let mut out = Vec::new();
                for (k, v) in h {
                    if name != "HVALS" {
                        out.push(Reply::Bulk(k.clone()));
                    }
                    if name != "HKEYS" {
                        out.push(Reply::Bulk(v.clone()));
                    }
                }
                Ok(Reply::Array(out))
            }
            "HLEN" => {
                arity(a, 1, 1)?;
                Ok(Reply::Int(self.hash(&a[0])?.map_or(0, |h| h.len() as i64)))
            }
            "HEXISTS" => {
                arity(a, 2, 2)?;
                Ok(Reply::Int(self.hash(&a[0])?.is_some_and(|h| h.contains_key(&a[1])) as i64))
            }
            "HDEL" => {
                arity(a, 2, usize::MAX)?;
                if self.hash(&a[0])?.is_none() {
                    return Ok(Reply::Int(0));
                }
                let h = self.hash_mut(&a[0])?;
                let n = a[1..].iter().filter(|f| h.remove(*f).is_some()).count();
                self.drop_if_empty(&a[0]);
                Ok(Reply::Int(n as i64))
            }
            "HINCRBY" => {
                arity(a, 3, 3)?;
                let by = int(&a[2])?;
                let h = self.hash_mut(&a[0])?;
                let current = match h.get(&a[1]) {
                    None => 0,
                    Some(v) => {
                        parse_int(v).ok_or_else(|| Fail::Reply(Reply::err("ERR hash value is not an integer")))?
                    }
                };
                let next = current
                    .checked_add(by)
                    .ok_or_else(|| Fail::Reply(Reply::err("ERR increment or decrement would overflow")))?;
                h.insert(a[1].clone(), next.to_string().into_bytes());
                Ok(Reply::Int(next))
            }
            // Sorted sets.
            "ZADD" => self.zadd(a),
            "ZREM" => {
                arity(a, 2, usize::MAX)?;
                if self.zset(&a[0])?.is_none() {
                    return Ok(Reply::Int(0));
                }
                let z = self.zset_mut(&a[0])?;
                let n = a[1..].iter().filter(|m| z.remove(m)).count();
                self.drop_if_empty(&a[0]);
                Ok(Reply::Int(n as i64))
            }
            "ZCARD" => {
                arity(a, 1, 1)?;
                Ok(Reply::Int(self.zset(&a[0])?.map_or(0, |z| z.len() as i64)))
            }
            "ZSCORE" => {
                arity(a, 2, 2)?;
                Ok(self
                    .zset(&a[0])?
                    .and_then(|z| z.scores.get(&a[1]))
                    .map_or(Reply::Nil, |s| Reply::Bulk(fmt_score(*s))))
            }
            "ZMSCORE" => {
                arity(a, 2, usize::MAX)?;
                let z = self.zset(&a[0])?;
                Ok(Reply::Array(
                    a[1..]
                        .iter()
                        .map(|m| z.and_then(|z| z.scores.get(m)).map_or(Reply::Nil, |s| Reply::Bulk(fmt_score(*s))))
                        .collect(),
                ))
            }
            "ZCOUNT" => {
                arity(a, 3, 3)?;
                let (min, max) = (edge(&a[1])?, edge(&a[2])?);
                Ok(Reply::Int(self.zset(&a[0])?.map_or(0, |z| z.by_score(min, max).count() as i64)))
            }
            "ZRANGEBYSCORE" | "ZREVRANGEBYSCORE" => self.zrange_by_score(name == "ZREVRANGEBYSCORE", a),
            "ZRANGE" => self.zrange(a),
            "ZREMRANGEBYSCORE" => {
                arity(a, 3, 3)?;
                let (min, max) = (edge(&a[1])?, edge(&a[2])?);
                let Some(z) = self.zset(&a[0])? else { return Ok(Reply::Int(0)) };
                let gone: Vec<Vec<u8>> = z.by_score(min, max).map(|(_, m)| m.clone()).collect();
                let z = self.zset_mut(&a[0])?;
                for m in &gone {
                    z.remove(m);
                }
                self.drop_if_empty(&a[0]);
                Ok(Reply::Int(gone.len() as i64))
            }
            "ZREMRANGEBYRANK" => {
                arity(a, 3, 3)?;
                let (start, stop) = (int(&a[1])?, int(&a[2])?);
                let Some(z) = self.zset(&a[0])? else { return Ok(Reply::Int(0)) };
                let Some((from, to)) = rank_range(start, stop, z.len()) else { return Ok(Reply::Int(0)) };
                let gone: Vec<Vec<u8>> =
                    z.order.iter().skip(from).take(to - from + 1).map(|(_, m)| m.clone()).collect();
                let z = self.zset_mut(&a[0])?;
                for m in &gone {
                    z.remove(m);
                }
                self.drop_if_empty(&a[0]);
                Ok(Reply::Int(gone.len() as i64))
            }
            // Lists.
            "LPUSH" | "RPUSH" => {
                arity(a, 2, usize::MAX)?;
                let l = self.list_mut(&a[0])?;
                for v in &a[1..] {
                    if name == "LPUSH" {
                        l.push_front(v.clone());
                    } else {
                        l.push_back(v.clone());
                    }
                }
                Ok(Reply::Int(l.len() as i64))
            }
            "LLEN" => {
                arity(a, 1, 1)?;
                Ok(Reply::Int(self.list(&a[0])?.map_or(0, |l| l.len() as i64)))
            }
            "LINDEX" => {
                arity(a, 2, 2)?;
                let i = int(&a[1])?;
                let Some(l) = self.list(&a[0])? else { return Ok(Reply::Nil) };
                Ok(list_index(i, l.len()).and_then(|i| l.get(i)).map_or(Reply::Nil, |v| Reply::Bulk(v.clone())))
            }
            "LSET" => {
                arity(a, 3, 3)?;
                let i = int(&a[1])?;
                if self.list(&a[0])?.is_none() {
                    return Err(Fail::Reply(Reply::err("ERR no such key")));
                }
                let l = self.list_mut(&a[0])?;
                match list_index(i, l.len()) {
                    Some(i) if i < l.len() => {
                        l[i] = a[2].clone();
                        Ok(Reply::ok())
                    }
                    _ => Err(Fail::Reply(Reply::err("ERR index out of range"))),
                }
            }
            "LRANGE" => {
                arity(a, 3, 3)?;
                let (start, stop) = (int(&a[1])?, int(&a[2])?);
                let Some(l) = self.list(&a[0])? else { return Ok(Reply::Array(Vec::new())) };
                let Some((from, to)) = rank_range(start, stop, l.len()) else { return Ok(Reply::Array(Vec::new())) };
                Ok(Reply::bulks(l.iter().skip(from).take(to - from + 1).cloned()))
            }
            "LTRIM" => {
                arity(a, 3, 3)?;
                let (start, stop) = (int(&a[1])?, int(&a[2])?);
                if self.list(&a[0])?.is_none() {
                    return Ok(Reply::ok());
                }
                let l = self.list_mut(&a[0])?;
                match rank_range(start, stop, l.len()) {
                    Some((from, to)) => {
                        l.truncate(to + 1);
                        l.drain(..from);
                    }
                    None => l.clear(),
                }
                self.drop_if_empty(&a[0]);
                Ok(Reply::ok())
            }
            // Sets.
            "SADD" => {
                arity(a, 2, usize::MAX)?;
                let s = self.members_mut(&a[0])?;
                Ok(Reply::Int(a[1..].iter().filter(|m| s.insert((*m).clone())).count() as i64))
            }
            "SREM" => {
                arity(a, 2, usize::MAX)?;
                if self.members(&a[0])?.is_none() {
                    return Ok(Reply::Int(0));
                }
                let s = self.members_mut(&a[0])?;
                let n = a[1..].iter().filter(|m| s.remove(*m)).count();
                self.drop_if_empty(&a[0]);
                Ok(Reply::Int(n as i64))
            }
            "SMEMBERS" => {
                arity(a, 1, 1)?;
                Ok(Reply::bulks(
                    self.members(&a[0])?.map(|s| s.iter().cloned().collect::<Vec<_>>()).unwrap_or_default(),
                ))
            }
            "SISMEMBER" => {
                arity(a, 2, 2)?;
                Ok(Reply::Int(self.members(&a[0])?.is_some_and(|s| s.contains(&a[1])) as i64))
            }
            "SCARD" => {
                arity(a, 1, 1)?;
                Ok(Reply::Int(self.members(&a[0])?.map_or(0, |s| s.len() as i64)))
            }
            // Streams.
            "XADD" => self.xadd(a),
            "XRANGE" => self.xrange(a),
            "XLEN" => {
                arity(a, 1, 1)?;
                Ok(Reply::Int(self.stream(&a[0])?.map_or(0, |s| s.entries.len() as i64)))
            }
            _ => Err(Fail::Unknown),
        }
    }

    fn expire(&mut self, name: &str, a: Args) -> Result<Reply, Fail> {
        arity(a, 2, 3)?;
        let t = int(&a[1])?;
        let now = self.now_ms() as i64;
        let at = match name {
            "EXPIRE" => now.saturating_add(t.saturating_mul(1000)),
            "PEXPIRE" => now.saturating_add(t),
            "EXPIREAT" => t.saturating_mul(1000),
            _ => t,
        };
        let opt = a.get(2).map(|o| String::from_utf8_lossy(o).to_ascii_uppercase());
        let Some(e) = self.live(&a[0]) else { return Ok(Reply::Int(0)) };
        let current = e.expires_at.map(|c| c as i64);
        let allowed = match opt.as_deref() {
            None => true,
            Some("NX") => current.is_none(),
            Some("XX") => current.is_some(),
            // No expiry counts as an infinite one.
            Some("GT") => current.is_some_and(|c| at > c),
            Some("LT") => current.is_none_or(|c| at < c),
            Some(o) => return Err(Fail::Reply(Reply::Error(format!("ERR Unsupported option {o}")))),
        };
        if !allowed {
            return Ok(Reply::Int(0));
        }
        if at <= now {
            self.keys.remove(&a[0]);
        } else {
            e.expires_at = Some(at as u64);
        }
        Ok(Reply::Int(1))
    }

    fn set_string(&mut self, a: Args) -> Result<Reply, Fail> {
        arity(a, 2, usize::MAX)?;
        let now = self.now_ms();
        let (mut nx, mut xx, mut get, mut keepttl) = (false, false, false, false);
        let mut expires_at = None;
        let mut i = 2;
        while i < a.len() {
            let opt = String::from_utf8_lossy(&a[i]).to_ascii_uppercase();
            match opt.as_str() {
                "NX" => nx = true,
                "XX" => xx = true,
                "GET" => get = true,
                "KEEPTTL" => keepttl = true,
                "EX" | "PX" | "EXAT" | "PXAT" => {
                    let Some(v) = a.get(i + 1) else { return Err(Fail::Reply(Reply::err(SYNTAX))) };
                    if expires_at.is_some() {
                        return Err(Fail::Reply(Reply::err(SYNTAX)));
                    }
                    let t = int(v)?;
                    if t <= 0 {
                        return Err(Fail::Reply(Reply::err("ERR invalid expire time in 'set' command")));
                    }
                    let t = t as u64;
                    expires_at = Some(match opt.as_str() {
                        "EX" => now.saturating_add(t.saturating_mul(1000)),
                        "PX" => now.saturating_add(t),
                        "EXAT" => t.saturating_mul(1000),
                        _ => t,
                    });
                    i += 1;
                }
                _ => return Err(Fail::Reply(Reply::err(SYNTAX))),
            }
            i += 1;
        }
        if (nx && xx) || (keepttl && expires_at.is_some()) {
            return Err(Fail::Reply(Reply::err(SYNTAX)));
        }
        let old = match self.live(&a[0]) {
            None => None,
            Some(Entry { data: Data::Str(s), expires_at }) => Some((Some(s.clone()), *expires_at)),
            Some(e) if get => {
                let _ = e;
                return Err(wrongtype());
            }
            Some(e) => Some((None, e.expires_at)),
        };
        let previous =
            if get { old.as_ref().and_then(|(v, _)| v.clone()).map_or(Reply::Nil, Reply::Bulk) } else { Reply::ok() };
        if (nx && old.is_some()) || (xx && old.is_none()) {
            return Ok(if get { previous } else { Reply::Nil });
        }
        let ttl = if keepttl { old.and_then(|(_, t)| t) } else { expires_at };
        if ttl.is_some_and(|at| at <= now) {
            self.keys.remove(&a[0]);
        } else {
            self.keys.insert(a[0].clone(), Entry { data: Data::Str(a[1].clone()), expires_at: ttl });
        }
        Ok(previous)
    }

    fn zadd(&mut self, a: Args) -> Result<Reply, Fail> {
        arity(a, 3, usize::MAX)?;
        let (mut nx, mut xx, mut gt, mut lt, mut ch) = (false, false, false, false, false);
        let mut i = 1;
        while i < a.len() {
            match String::from_utf8_lossy(&a[i]).to_ascii_uppercase().as_str() {
                "NX" => nx = true,
                "XX" => xx = true,
                "GT" => gt = true,
                "LT" => lt = true,
                "CH" => ch = true,
                _ => break,
            }
            i += 1;
        }
        let pairs = &a[i..];
        if pairs.is_empty() || !pairs.len().is_multiple_of(2) {
            return Err(Fail::Reply(Reply::err(SYNTAX)));
        }
        if nx && xx {
            return Err(Fail::Reply(Reply::err("ERR XX and NX options at the same time are not compatible")));
        }
        if (gt && lt) || (nx && (gt || lt)) {
            return Err(Fail::Reply(Reply::err("ERR GT, LT, and/or NX options at the same time are not compatible")));
        }
        let mut parsed = Vec::with_capacity(pairs.len() / 2);
        for p in pairs.chunks(2) {
            parsed.push((score(&p[0])?, p[1].clone()));
        }
        let z = self.zset_mut(&a[0])?;
        let (mut added, mut changed) = (0, 0);
        for (s, m) in parsed {
            match z.scores.get(&m).copied() {
                None if !xx => {
                    z.insert(m, s);
                    added += 1;
                }
                None => {}
                Some(old) => {
                    if nx || (gt && s <= old) || (lt && s >= old) || s == old {
                        continue;
                    }
                    z.insert(m, s);
                    changed += 1;
                }
            }
        }
        self.drop_if_empty(&a[0]);
        Ok(Reply::Int(if ch { added + changed } else { added }))
    }

    fn zrange_by_score(&mut self, rev: bool, a: Args) -> Result<Reply, Fail> {
        arity(a, 3, 7)?;
        let (lo, hi) = if rev { (edge(&a[2])?, edge(&a[1])?) } else { (edge(&a[1])?, edge(&a[2])?) };
        let (withscores, offset, count) = range_options(&a[3..])?;
        let Some(z) = self.zset(&a[0])? else { return Ok(Reply::Array(Vec::new())) };
        let it = z.by_score(lo, hi);
        let items: Box<dyn Iterator<Item = &(Score, Vec<u8>)>> = if rev { Box::new(it.rev()) } else { Box::new(it) };
        Ok(scored(items.skip(offset).take(count), withscores))
    }

    fn zrange(&mut self, a: Args) -> Result<Reply, Fail> {
        arity(a, 3, 4)?;
        let (start, stop) = (int(&a[1])?, int(&a[2])?);
        let withscores = match a.get(3) {
            None => false,
            Some(o) if o.eq_ignore_ascii_case(b"WITHSCORES") => true,
            Some(_) => return Err(Fail::Reply(Reply::err(SYNTAX))),
        };
        let Some(z) = self.zset(&a[0])? else { return Ok(Reply::Array(Vec::new())) };
        let Some((from, to)) = rank_range(start, stop, z.len()) else { return Ok(Reply::Array(Vec::new())) };
        Ok(scored(z.order.iter().skip(from).take(to - from + 1), withscores))
    }

    fn xadd(&mut self, a: Args) -> Result<Reply, Fail> {
        arity(a, 2, usize::MAX)?;
        let mut i = 1;
        let mut maxlen = None;
        if a[i].eq_ignore_ascii_case(b"MAXLEN") {
            i += 1;
            let approx = match a.get(i).map(Vec::as_slice) {
                Some(b"~") => true,
                Some(b"=") => false,
                _ => {
                    i -= 1;
                    false
                }
            };
            i += 1;
            let n = a.get(i).ok_or(Fail::Reply(Reply::err(SYNTAX)))?;
            let n = int(n)?;
            if n < 0 {
                return Err(Fail::Reply(Reply::err("ERR The MAXLEN argument must be >= 0.")));
            }
            maxlen = Some((n as usize, approx));
            i += 1;
        }
        let id = a.get(i).ok_or(Fail::Arity)?;
        let fields = &a[i + 1..];
        if fields.is_empty() || !fields.len().is_multiple_of(2) {
            return Err(Fail::Arity);
        }
        if id.as_slice() != b"*" {
            return Err(Fail::Reply(Reply::err("ERR the embedded store assigns stream ids itself ('*')")));
        }
        let now = self.now_ms();
        let s = self.stream_mut(&a[0])?;
        let next = if now > s.last.0 { (now, 0) } else { (s.last.0, s.last.1 + 1) };
        s.last = next;
        s.entries.push_back((next, fields.to_vec()));
        if let Some((max, approx)) = maxlen {
            // `~` trims whole nodes of a radix tree, as Redis does with its default of 100
            // entries per node: the oldest hundred at a time, while the rest stays at `max` or
            // more.
            let drop = if approx {
                (s.entries.len().saturating_sub(max) / STREAM_NODE) * STREAM_NODE
            } else {
                s.entries.len().saturating_sub(max)
            };
            s.entries.drain(..drop);
        }
        Ok(Reply::Bulk(fmt_id(next)))
    }

    fn xrange(&mut self, a: Args) -> Result<Reply, Fail> {
        arity(a, 3, 5)?;
        let lo = stream_edge(&a[1], false)?;
        let hi = stream_edge(&a[2], true)?;
        let count = match &a[3..] {
            [] => usize::MAX,
            [c, n] if c.eq_ignore_ascii_case(b"COUNT") => usize::try_from(int(n)?).unwrap_or(0),
            _ => return Err(Fail::Reply(Reply::err(SYNTAX))),
        };
        let Some(s) = self.stream(&a[0])? else { return Ok(Reply::Array(Vec::new())) };
        let out = s
            .entries
            .iter()
            .filter(|(id, _)| lo.is_some_and(|lo| *id >= lo) && hi.is_some_and(|hi| *id <= hi))
            .take(count)
            .map(|(id, f)| Reply::Array(vec![Reply::Bulk(fmt_id(*id)), Reply::bulks(f.iter().cloned())]))
            .collect();
        Ok(Reply::Array(out))
    }

    fn typed<T>(&mut self, key: &[u8], pick: impl FnOnce(&Data) -> Option<&T>) -> Result<Option<&T>, Fail> {
        match self.live(key) {
            None => Ok(None),
            Some(e) => pick(&e.data).map(Some).ok_or_else(wrongtype),
        }
    }

    fn typed_mut<T>(
        &mut self,
        key: &[u8],
        fresh: impl FnOnce() -> Data,
        pick: impl FnOnce(&mut Data) -> Option<&mut T>,
    ) -> Result<&mut T, Fail> {
        if self.live(key).is_none() {
            self.keys.insert(key.to_vec(), Entry { data: fresh(), expires_at: None });
        }
        let e = self.keys.get_mut(key).expect("inserted above");
        pick(&mut e.data).ok_or_else(wrongtype)
    }

    fn hash(&mut self, key: &[u8]) -> Result<Option<&Fields>, Fail> {
        self.typed(key, |d| if let Data::Hash(h) = d { Some(h) } else { None })
    }

    fn hash_mut(&mut self, key: &[u8]) -> Result<&mut Fields, Fail> {
        self.typed_mut(key, || Data::Hash(HashMap::new()), |d| if let Data::Hash(h) = d { Some(h) } else { None })
    }

    fn zset(&mut self, key: &[u8]) -> Result<Option<&ZSet>, Fail> {
        self.typed(key, |d| if let Data::ZSet(z) = d { Some(z) } else { None })
    }

    fn zset_mut(&mut self, key: &[u8]) -> Result<&mut ZSet, Fail> {
        self.typed_mut(key, || Data::ZSet(ZSet::default()), |d| if let Data::ZSet(z) = d { Some(z) } else { None })
    }

    fn list(&mut self, key: &[u8]) -> Result<Option<&VecDeque<Vec<u8>>>, Fail> {
        self.typed(key, |d| if let Data::List(l) = d { Some(l) } else { None })
    }

    fn list_mut(&mut self, key: &[u8]) -> Result<&mut VecDeque<Vec<u8>>, Fail> {
        self.typed_mut(key, || Data::List(VecDeque::new()), |d| if let Data::List(l) = d { Some(l) } else { None })
    }

    fn members(&mut self, key: &[u8]) -> Result<Option<&HashSet<Vec<u8>>>, Fail> {
        self.typed(key, |d| if let Data::Set(s) = d { Some(s) } else { None })
    }

    fn members_mut(&mut self, key: &[u8]) -> Result<&mut HashSet<Vec<u8>>, Fail> {
        self.typed_mut(key, || Data::Set(HashSet::new()), |d| if let Data::Set(s) = d { Some(s) } else { None })
    }

    fn stream(&mut self, key: &[u8]) -> Result<Option<&Stream>, Fail> {
        self.typed(key, |d| if let Data::Stream(s) = d { Some(s) } else { None })
    }

    fn stream_mut(&mut self, key: &[u8]) -> Result<&mut Stream, Fail> {
        self.typed_mut(
            key,
            || Data::Stream(Stream::default()),
            |d| if let Data::Stream(s) = d { Some(s) } else { None },
        )
    }
}

/// Entries per node of a stream's radix tree (Redis' `stream-node-max-entries` default).
const STREAM_NODE: usize = 100;

/// Why a command did not run: the wrong number of arguments, or an error reply.
enum Fail {
    Arity,
    Unknown,
    Reply(Reply),
}

fn wrongtype() -> Fail {
    Fail::Reply(Reply::err(WRONGTYPE))
}

fn arity(a: Args, min: usize, max: usize) -> Result<(), Fail> {
    if a.len() < min || a.len() > max { Err(Fail::Arity) } else { Ok(()) }
}

fn parse_int(b: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(b).ok()?;
    // Redis takes no sign `+`, no spaces, no leading zeros.
    if s.is_empty() || s.starts_with('+') || (s.len() > 1 && s.starts_with('0')) || s.starts_with("-0") {
        return None;
    }
    s.parse().ok()
}

fn int(b: &[u8]) -> Result<i64, Fail> {
    parse_int(b).ok_or_else(|| Fail::Reply(Reply::err(NOT_INTEGER)))
}

fn parse_float(b: &[u8]) -> Option<f64> {
    let s = std::str::from_utf8(b).ok()?;
    let v = match s.to_ascii_lowercase().as_str() {
        "inf" | "+inf" | "infinity" | "+infinity" => f64::INFINITY,
        "-inf" | "-infinity" => f64::NEG_INFINITY,
        t if t.contains("nan") || t.is_empty() || t.trim() != t => return None,
        t => t.parse().ok()?,
    };
    Some(v)
}

fn score(b: &[u8]) -> Result<f64, Fail> {
    parse_float(b).ok_or_else(|| Fail::Reply(Reply::err(NOT_FLOAT)))
}

fn edge(b: &[u8]) -> Result<Edge, Fail> {
    let (exclusive, rest) = match b.first() {
        Some(b'(') => (true, &b[1..]),
        _ => (false, b),
    };
    let value = parse_float(rest).ok_or_else(|| Fail::Reply(Reply::err("ERR min or max is not a float")))?;
    Ok(Edge { value, exclusive })
}

/// `WITHSCORES` and `LIMIT offset count` after a score range.
fn range_options(a: Args) -> Result<(bool, usize, usize), Fail> {
    let (mut withscores, mut offset, mut count) = (false, 0, usize::MAX);
    let mut i = 0;
    while i < a.len() {
        if a[i].eq_ignore_ascii_case(b"WITHSCORES") {
            withscores = true;
            i += 1;
        } else if a[i].eq_ignore_ascii_case(b"LIMIT") && a.len() >= i + 3 {
            let (o, c) = (int(&a[i + 1])?, int(&a[i + 2])?);
            if o < 0 {
                return Ok((withscores, usize::MAX, 0));
            }
            offset = o as usize;
            count = if c < 0 { usize::MAX } else { c as usize };
            i += 3;
        } else {
            return Err(Fail::Reply(Reply::err(SYNTAX)));
        }
    }
    Ok((withscores, offset, count))
}

fn scored<'a>(items: impl Iterator<Item = &'a (Score, Vec<u8>)>, withscores: bool) -> Reply {
    let mut out = Vec::new();
    for (s, m) in items {
        out.push(Reply::Bulk(m.clone()));
        if withscores {
            out.push(Reply::Bulk(fmt_score(s.0)));
        }
    }
    Reply::Array(out)
}

/// `start..=stop` (negative from the end) clamped to a sequence of `len`; `None` if empty.
fn rank_range(start: i64, stop: i64, len: usize) -> Option<(usize, usize)> {
    let len = len as i64;
    let start = if start < 0 { (len + start).max(0) } else { start };
    let stop = if stop < 0 { len + stop } else { stop.min(len - 1) };
    if start > stop || start >= len || stop < 0 { None } else { Some((start as usize, stop as usize)) }
}

fn list_index(i: i64, len: usize) -> Option<usize> {
    let i = if i < 0 { len as i64 + i } else { i };
    usize::try_from(i).ok()
}

/// A score as Redis 7.0 writes it: an integer below 2^52 in digits, anything else as C's
/// `%.17g` (`1.5`, `1e+20`, `inf`).
pub fn fmt_score(s: f64) -> Vec<u8> {
    if s.fract() == 0.0 && s.abs() < 4_503_599_627_370_496.0 {
        return format!("{}", s as i64).into_bytes();
    }
    g17(s).into_bytes()
}

/// C's `printf("%.17g", v)`: 17 significant digits, trailing zeros dropped, an exponent
/// (`e+20`, `e-05`) below 1e-4 or from 1e17 on. Redis 7.0 writes numbers so (scores, and a
/// script's number sent as a command's argument).
pub fn g17(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0".into() } else { "0".into() };
    }
    let sci = format!("{v:.16e}");
    let (mantissa, exp) = sci.split_once('e').expect("an exponent");
    let exp: i32 = exp.parse().expect("a number");
    let trim = |m: &str| -> String {
        if m.contains('.') { m.trim_end_matches('0').trim_end_matches('.').to_owned() } else { m.to_owned() }
    };
    if !(-4..17).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{}e{sign}{:02}", trim(mantissa), exp.abs());
    }
    let decimals = usize::try_from(16 - exp).unwrap_or(0);
    trim(&format!("{v:.decimals$}"))
}

fn fmt_id((ms, seq): StreamId) -> Vec<u8> {
    format!("{ms}-{seq}").into_bytes()
}

/// A stream range's end: `-`, `+`, `ms`, `ms-seq`, each start exclusive after `(`. `None`: a
/// range that holds nothing (`(` past the largest id).
fn stream_edge(b: &[u8], upper: bool) -> Result<Option<StreamId>, Fail> {
    let bad = || Fail::Reply(Reply::err("ERR Invalid stream ID specified as stream command argument"));
    match b {
        b"-" => return Ok(Some((0, 0))),
        b"+" => return Ok(Some((u64::MAX, u64::MAX))),
        _ => {}
    }
    let (exclusive, rest) = match b.first() {
        Some(b'(') => (true, &b[1..]),
        _ => (false, b),
    };
    let s = std::str::from_utf8(rest).map_err(|_| bad())?;
    let id = match s.split_once('-') {
        Some((ms, seq)) => (ms.parse().map_err(|_| bad())?, seq.parse().map_err(|_| bad())?),
        None => (s.parse().map_err(|_| bad())?, if upper { u64::MAX } else { 0 }),
    };
    if !exclusive {
        return Ok(Some(id));
    }
    Ok(if upper {
        if id == (0, 0) {
            None
        } else if id.1 == 0 {
            Some((id.0 - 1, u64::MAX))
        } else {
            Some((id.0, id.1 - 1))
        }
    } else if id.1 == u64::MAX {
        if id.0 == u64::MAX { None } else { Some((id.0 + 1, 0)) }
    } else {
        Some((id.0, id.1 + 1))
    })
}
