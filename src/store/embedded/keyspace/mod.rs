//! An in-process keyspace with Redis' semantics for the commands vq sends (those of `lua/`
//! and of `store/redis/`'s glue): strings, hashes, sorted sets, lists, sets and streams, each
//! key with an optional expiry read against the store's [`Clock`](crate::clock::Clock).
//!
//! Redis is the reference: `tests/it/embedded.rs` sends the same commands here and to a real
//! `redis-server` and compares the answers, errors included. What it must not do: answer a
//! command it does not implement as if it did (an unknown command is Redis' `ERR unknown
//! command`), or keep an empty container (Redis deletes a hash, set, list or sorted set whose
//! last element goes).

mod args;
mod collections;
mod keys;
mod zset;

use std::collections::{HashMap, HashSet, VecDeque};

use indexmap::IndexMap;

pub use self::args::g17;
use self::zset::ZSet;
use super::reply::{Reply, WRONGTYPE};
use crate::clock::SharedClock;

/// A hash's fields, in the order they were added: Redis keeps a small hash (up to
/// `hash-max-listpack-entries`, 128) in that order, and `HGETALL`/`HKEYS` answer in it.
type Fields = IndexMap<Vec<u8>, Vec<u8>>;

/// Up to this many fields a hash keeps its order when one is deleted, as Redis' listpack does;
/// past it Redis' order is its hash table's, any order, and a delete costs O(1) here.
const LISTPACK_ENTRIES: usize = 128;

/// Deletes `field` from `h`: in place up to [`LISTPACK_ENTRIES`] fields, the last moved into
/// its place beyond.
fn remove_field(h: &mut Fields, field: &[u8]) -> bool {
    if h.len() <= LISTPACK_ENTRIES { h.shift_remove(field).is_some() } else { h.swap_remove(field).is_some() }
}

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

    /// Each group of commands in turn: the first that knows `name` runs it.
    fn dispatch(&mut self, name: &str, a: Args) -> Result<Reply, Fail> {
        for group in [Self::key_command, Self::collection_command, Self::zset_command] {
            match group(self, name, a) {
                Err(Fail::Unknown) => continue,
                done => return done,
            }
        }
        Err(Fail::Unknown)
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
        self.typed_mut(key, || Data::Hash(Fields::new()), |d| if let Data::Hash(h) = d { Some(h) } else { None })
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
