//! The embedded keyspace and Lua host (`src/store/embedded/`) against a real `redis-server`:
//! the same commands go to both and the answers must be the same, errors included (TTL edges,
//! a container deleted with its last element, sorted-set ties, XADD's MAXLEN, SET's options,
//! Lua's reply conversions).

use std::sync::Arc;

use redis::Value;
use vq::clock::ManualClock;
use vq::store::embedded::{Embedded, Reply};

use crate::support::RedisServer;

/// A real server's answer in the embedded store's terms.
fn reply_of(r: redis::RedisResult<Value>) -> Reply {
    match r {
        Ok(v) => value_reply(v),
        Err(e) => Reply::Error(match (e.code(), e.detail()) {
            (Some(code), Some(detail)) => format!("{code} {detail}"),
            (Some(code), None) => code.to_owned(),
            _ => format!("{e}"),
        }),
    }
}

fn value_reply(v: Value) -> Reply {
    match v {
        Value::Nil => Reply::Nil,
        Value::Int(i) => Reply::Int(i),
        Value::BulkString(b) => Reply::Bulk(b),
        Value::Okay => Reply::Status("OK".into()),
        Value::SimpleString(s) => Reply::Status(s),
        Value::Array(items) => Reply::Array(items.into_iter().map(value_reply).collect()),
        Value::ServerError(e) => reply_of(Err(e.into())),
        other => panic!("a RESP2 reply: {other:?}"),
    }
}

/// How an answer is compared: as sent, or as a multiset (a set's members).
#[derive(Clone, Copy, PartialEq)]
enum Order {
    Kept,
    /// An array in any order.
    Any,
}

/// A script error's message without Redis' ` script: …` suffix (where in which function).
fn trimmed(r: Reply) -> Reply {
    match r {
        Reply::Error(e) => Reply::Error(e.split(" script: ").next().unwrap_or_default().to_owned()),
        other => other,
    }
}

fn normalized(r: Reply, order: Order) -> Reply {
    match (r, order) {
        (Reply::Array(mut items), Order::Any) => {
            items.sort_by_key(|p| format!("{p:?}"));
            Reply::Array(items)
        }
        (r, _) => trimmed(r),
    }
}

struct Both {
    redis: redis::aio::MultiplexedConnection,
    embedded: Embedded,
    _server: RedisServer,
}

impl Both {
    /// A fresh redis-server, and the embedded store on a clock standing at this host's now
    /// (so that relative TTLs read the same on both).
    async fn start() -> Self {
        let server = RedisServer::spawn();
        let redis = server.conn().await;
        let embedded = Embedded::start(Arc::new(ManualClock::at_system_now())).expect("embedded store");
        Self { redis, embedded, _server: server }
    }

    /// Sends `cmd` to both; panics unless both answer the same. Returns the answer.
    async fn same(&mut self, cmd: &[&str], order: Order) -> Reply {
        let mut c = redis::cmd(cmd[0]);
        for a in &cmd[1..] {
            c.arg(*a);
        }
        let real = normalized(reply_of(c.query_async(&mut self.redis).await), order);
        let args: Vec<Vec<u8>> = cmd.iter().map(|a| a.as_bytes().to_vec()).collect();
        let ours = normalized(self.embedded.one(args).await, order);
        assert_eq!(ours, real, "{cmd:?}");
        real
    }

    async fn all(&mut self, cmds: &[&[&str]]) {
        for cmd in cmds {
            self.same(cmd, Order::Kept).await;
        }
    }
}

#[tokio::test]
async fn strings_and_set_options_answer_as_redis_does() {
    let mut b = Both::start().await;
    b.all(&[
        &["GET", "s"],
        &["SET", "s", "1"],
        &["GET", "s"],
        &["SET", "s", "2", "NX"],
        &["SET", "s", "3", "XX", "GET"],
        &["SET", "t", "3", "XX"],
        &["SET", "t", "3", "NX", "EX", "100"],
        &["TTL", "t"],
        &["SET", "t", "4", "KEEPTTL"],
        &["TTL", "t"],
        &["SET", "t", "5"],
        &["TTL", "t"],
        &["SET", "t", "5", "EX", "0"],
        &["SET", "t", "5", "EX", "10", "PX", "10"],
        &["SET", "t", "5", "NX", "XX"],
        &["SET", "t", "5", "BOGUS"],
        &["SET", "t", "5", "PXAT", "1000"],
        &["GET", "t"],
        &["INCRBY", "n", "5"],
        &["INCRBY", "n", "-7"],
        &["INCRBY", "s", "x"],
        &["SET", "f", "1.5"],
        &["INCRBY", "f", "1"],
        &["INCRBY", "n", "9223372036854775807"],
        &["MGET", "s", "nope", "n"],
        &["EXISTS", "s", "nope", "n", "s"],
        &["DEL", "s", "nope"],
        &["UNLINK", "n", "f"],
        &["EXISTS", "s"],
        &["RENAME", "nope", "x"],
        &["SET", "a", "1", "EX", "50"],
        &["RENAME", "a", "b"],
        &["TTL", "b"],
        &["GET", "a"],
        &["GET", "b"],
        &["SET", "k", "v", "EX", "5"],
        &["SET", "k", "v2", "PX", "1"],
        &["PING"],
        &["NOSUCHCOMMAND", "x"],
        &["GET"],
    ])
    .await;
}

/// The waiting users' heartbeats are 32-bit fields of a string (`BITFIELD u32 #seq`, a run of
/// new users' fields written with `SETRANGE`, read back in slices with `GETRANGE`): both answer
/// as Redis does, past the end of the string included.
#[tokio::test]
async fn bitfields_and_byte_ranges_answer_as_redis_does() {
    let mut b = Both::start().await;
    b.all(&[
        &["BITFIELD", "b", "GET", "u32", "#3"],
        &["EXISTS", "b"],
        &["BITFIELD", "b", "SET", "u32", "#3", "4294967295", "SET", "u32", "#1", "258"],
        &["GETRANGE", "b", "0", "-1"],
        &["BITFIELD", "b", "GET", "u32", "#1", "GET", "u32", "#3", "GET", "u32", "#9", "GET", "u8", "5"],
        &["BITFIELD", "b", "SET", "u32", "#1", "0", "SET", "u16", "7", "65535"],
        &["GETRANGE", "b", "0", "-1"],
        &["GETRANGE", "b", "4", "11"],
        &["GETRANGE", "b", "12", "100"],
        &["GETRANGE", "b", "-3", "-1"],
        &["GETRANGE", "b", "5", "2"],
        &["GETRANGE", "nope", "0", "10"],
        &["BITFIELD", "z", "SET", "u32", "#0", "0"],
        &["GETRANGE", "z", "0", "-1"],
        &["BITFIELD", "b", "GET", "u64", "0"],
        &["BITFIELD", "b", "BOGUS", "u8", "0"],
        &["BITFIELD", "b", "GET", "u8"],
        &["SET", "s", "x"],
        &["HSET", "h", "f", "v"],
        &["BITFIELD", "h", "GET", "u8", "0"],
        &["GETRANGE", "h", "0", "1"],
        &["SETRANGE", "r", "8", "abcd"],
        &["GETRANGE", "r", "0", "-1"],
        &["BITFIELD", "r", "GET", "u32", "#2"],
        &["SETRANGE", "r", "2", "xy"],
        &["SETRANGE", "r", "0", ""],
        &["GETRANGE", "r", "0", "-1"],
        &["SETRANGE", "empty", "5", ""],
        &["EXISTS", "empty"],
        &["SETRANGE", "r", "-1", "x"],
        &["SETRANGE", "r", "x", "x"],
        &["SETRANGE", "h", "0", "x"],
        &["SETRANGE", "r"],
    ])
    .await;
}

#[tokio::test]
async fn expiry_options_and_edges_answer_as_redis_does() {
    let mut b = Both::start().await;
    b.all(&[
        &["TTL", "none"],
        &["PEXPIRETIME", "none"],
        &["EXPIRE", "none", "10"],
        &["SET", "k", "v"],
        &["TTL", "k"],
        &["PEXPIRETIME", "k"],
        &["EXPIRE", "k", "100", "GT"],
        &["EXPIRE", "k", "100", "XX"],
        &["EXPIRE", "k", "100", "NX"],
        &["TTL", "k"],
        &["EXPIRE", "k", "50", "GT"],
        &["EXPIRE", "k", "200", "GT"],
        &["TTL", "k"],
        &["EXPIRE", "k", "20", "LT"],
        &["TTL", "k"],
        &["EXPIRE", "k", "5", "NX"],
        &["EXPIRE", "k", "5", "BOGUS"],
        &["PEXPIREAT", "k", "4102444800000"],
        &["PEXPIRETIME", "k"],
        &["EXPIREAT", "k", "4102444801"],
        &["PEXPIRETIME", "k"],
        &["EXPIRE", "k", "x"],
        // A time in the past deletes the key at once.
        &["PEXPIREAT", "k", "1000"],
        &["EXISTS", "k"],
        &["HSET", "h", "a", "1"],
        &["EXPIRE", "h", "0"],
        &["EXISTS", "h"],
        &["SET", "j", "1", "EX", "10"],
        &["EXPIRE", "j", "-1"],
        &["GET", "j"],
    ])
    .await;
}

#[tokio::test]
async fn hashes_answer_as_redis_does_and_go_with_their_last_field() {
    let mut b = Both::start().await;
    b.all(&[
        &["HSET", "h", "a", "1", "b", "2"],
        &["HSET", "h", "a", "3", "c", "4"],
        &["HSET", "h", "a"],
        &["HGET", "h", "a"],
        &["HGET", "h", "z"],
        &["HGET", "none", "a"],
        &["HMGET", "h", "a", "z", "c"],
        &["HMGET", "none", "a"],
        &["HSETNX", "h", "a", "9"],
        &["HSETNX", "h", "d", "9"],
        &["HINCRBY", "h", "n", "5"],
        &["HINCRBY", "h", "n", "-2"],
        &["HINCRBY", "h", "n", "x"],
        &["HSET", "h", "f", "1.5"],
        &["HINCRBY", "h", "f", "1"],
        &["EXPIRE", "h", "100"],
        &["HDEL", "h", "a", "b", "zz"],
        &["TTL", "h"],
        &["HDEL", "h", "c", "d", "n", "f"],
        &["EXISTS", "h"],
        &["HDEL", "h", "a"],
        &["SET", "s", "x"],
        &["HSET", "s", "a", "1"],
        &["HGET", "s", "a"],
        &["GET", "s"],
    ])
    .await;
    // A small hash answers in the order its fields came, a deleted one leaving no gap.
    b.all(&[
        &["HSET", "g", "x", "1", "y", "2", "z", "3", "w", "4"],
        &["HDEL", "g", "y"],
        &["HSET", "g", "v", "5", "x", "6"],
        &["HGETALL", "g"],
        &["HKEYS", "g"],
    ])
    .await;
    b.same(&["HGETALL", "none"], Order::Kept).await;
}

#[tokio::test]
async fn sorted_sets_order_ties_by_member_and_answer_as_redis_does() {
    let mut b = Both::start().await;
    b.all(&[
        &["ZADD", "z", "1", "b", "1", "a", "2", "c", "0.5", "d", "1", "aa"],
        &["ZADD", "z", "1", "b"],
        &["ZADD", "z", "NX", "9", "b", "3", "e"],
        &["ZADD", "z", "XX", "4", "e", "5", "new"],
        &["ZADD", "z", "GT", "CH", "1", "e", "6", "e"],
        &["ZADD", "z", "LT", "CH", "7", "e"],
        &["ZADD", "z", "NX", "XX", "1", "q"],
        &["ZADD", "z", "x", "q"],
        &["ZADD", "z", "1"],
        &["ZRANGE", "z", "0", "-1", "WITHSCORES"],
        &["ZRANGE", "z", "-1", "-1", "WITHSCORES"],
        &["ZRANGE", "z", "2", "1"],
        &["ZRANGE", "z", "10", "20"],
        &["ZRANGE", "none", "-1", "-1", "WITHSCORES"],
        &["ZCARD", "z"],
        &["ZSCORE", "z", "d"],
        &["ZSCORE", "z", "nope"],
        &["ZMSCORE", "z", "a", "nope", "d"],
        &["ZMSCORE", "none", "a", "b"],
        &["ZCOUNT", "z", "-inf", "+inf"],
        &["ZCOUNT", "z", "(1", "6"],
        &["ZCOUNT", "z", "1", "(2"],
        &["ZCOUNT", "z", "(1", "(1"],
        &["ZCOUNT", "z", "x", "1"],
        &["ZRANGEBYSCORE", "z", "1", "1"],
        &["ZRANGEBYSCORE", "z", "(0.5", "+inf", "WITHSCORES", "LIMIT", "0", "3"],
        &["ZRANGEBYSCORE", "z", "-inf", "+inf", "LIMIT", "2", "2"],
        &["ZRANGEBYSCORE", "z", "-inf", "+inf", "LIMIT", "1", "-1"],
        &["ZREVRANGEBYSCORE", "z", "+inf", "-inf", "WITHSCORES"],
        &["ZREVRANGEBYSCORE", "z", "1", "-inf", "LIMIT", "0", "1"],
        &["ZREVRANGEBYSCORE", "z", "(2", "(0.5"],
        &["ZREM", "z", "a", "nope"],
        &["ZREMRANGEBYRANK", "z", "0", "1"],
        &["ZRANGE", "z", "0", "-1", "WITHSCORES"],
        &["ZREMRANGEBYSCORE", "z", "(1", "6"],
        &["ZRANGE", "z", "0", "-1", "WITHSCORES"],
        &["ZADD", "big", "1733450000123", "x", "-3", "y", "inf", "i", "1e20", "e", "2.25", "f"],
        &["ZRANGE", "big", "0", "-1", "WITHSCORES"],
        &["ZREMRANGEBYRANK", "big", "0", "-1"],
        &["EXISTS", "big"],
        &["ZADD", "one", "1", "m"],
        &["ZREM", "one", "m"],
        &["EXISTS", "one"],
        &["ZREMRANGEBYRANK", "none", "0", "-1"],
        &["SET", "s", "1"],
        &["ZADD", "s", "1", "m"],
        &["ZSCORE", "s", "m"],
    ])
    .await;
}

#[tokio::test]
async fn lists_sets_and_streams_answer_as_redis_does() {
    let mut b = Both::start().await;
    b.all(&[
        &["LPUSH", "l", "a", "b", "c"],
        &["LINDEX", "l", "0"],
        &["LINDEX", "l", "-1"],
        &["LINDEX", "l", "9"],
        &["LINDEX", "none", "0"],
        &["LSET", "l", "1", "B"],
        &["LSET", "l", "9", "B"],
        &["LSET", "none", "0", "x"],
        &["LRANGE", "l", "0", "-1"],
        &["LTRIM", "l", "0", "1"],
        &["LRANGE", "l", "0", "-1"],
        &["LTRIM", "l", "5", "9"],
        &["EXISTS", "l"],
        &["LTRIM", "none", "0", "1"],
        &["SADD", "s", "a", "b", "a"],
        &["SISMEMBER", "s", "a"],
        &["SREM", "s", "a", "z"],
        &["SREM", "s", "b"],
        &["EXISTS", "s"],
        &["XRANGE", "none", "-", "+"],
    ])
    .await;
    b.same(&["SADD", "m", "x", "y", "z"], Order::Kept).await;
    b.same(&["SMEMBERS", "m"], Order::Any).await;
    // Stream ids come from each store's own clock: compare what does not depend on them.
    for i in 0..250 {
        let row = format!("r{i}");
        let mut c = redis::cmd("XADD");
        c.arg("x").arg("MAXLEN").arg("~").arg(120).arg("*").arg("row").arg(&row);
        let _: String = c.query_async(&mut b.redis).await.expect("xadd");
        let ours = b
            .embedded
            .one(["XADD", "x", "MAXLEN", "~", "120", "*", "row", &row].map(|a| a.as_bytes().to_vec()).to_vec())
            .await;
        assert!(matches!(ours, Reply::Bulk(_)), "{ours:?}");
    }
    b.same(&["XLEN", "x"], Order::Kept).await;
    let rows = |r: Reply| match r {
        Reply::Array(entries) => entries
            .into_iter()
            .map(|e| match e {
                Reply::Array(mut parts) => parts.pop().expect("fields"),
                other => panic!("{other:?}"),
            })
            .collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    let real = rows(reply_of(
        redis::cmd("XRANGE").arg("x").arg("-").arg("+").arg("COUNT").arg(3).query_async(&mut b.redis).await,
    ));
    let ours =
        rows(b.embedded.one(["XRANGE", "x", "-", "+", "COUNT", "3"].map(|a| a.as_bytes().to_vec()).to_vec()).await);
    assert_eq!(ours, real);
}

/// A library that returns each kind of value and raises each kind of error, loaded on both.
const PROBE_LIBRARY: &str = r#"#!lua name=probe
local function conv(keys, argv)
  local kind = argv[1]
  if kind == 'float' then return 3.99 end
  if kind == 'neg' then return -2.5 end
  if kind == 'holes' then return { 1, 'two', nil, 4 } end
  if kind == 'bools' then return { true, false, 'x' } end
  if kind == 'false' then return false end
  if kind == 'true' then return true end
  if kind == 'status' then return { ok = 'FINE' } end
  if kind == 'err' then return { err = 'BAD thing' } end
  if kind == 'error_reply' then return redis.error_reply('unknown sale action x') end
  if kind == 'error_reply_one' then return redis.error_reply('oops') end
  if kind == 'nested' then return { { 1, 2 }, { 'a', { 'b' } } } end
  if kind == 'nil_get' then return { redis.call('GET', keys[1]) == false } end
  if kind == 'numbers' then
    redis.call('SET', keys[1], 1733450000123 + 0.0)
    redis.call('HSET', keys[1] .. 'h', 'f', 12.5, 'g', 100000000000000, 'k', 2 ^ 53)
    return { redis.call('GET', keys[1]), redis.call('HMGET', keys[1] .. 'h', 'f', 'g', 'k') }
  end
  if kind == 'status_in' then return { redis.call('SET', keys[1], 'v') } end
  if kind == 'pcall' then
    redis.call('SET', keys[1], 'v')
    local r = redis.pcall('HGET', keys[1], 'f')
    return { type(r), r.err }
  end
  if kind == 'lua_pcall' then
    redis.call('SET', keys[1], 'v')
    local ok, e = pcall(function() return redis.call('HGET', keys[1], 'f') end)
    return { tostring(ok), type(e), type(e) == 'table' and e.err or e, redis.call('GET', keys[1]) }
  end
  if kind == 'raise' then
    redis.call('SET', keys[1], 'v')
    return redis.call('HGET', keys[1], 'f')
  end
  if kind == 'time' then
    local t = redis.call('TIME')
    return { type(t[1]), type(t[2]), #t }
  end
  if kind == 'scores' then
    redis.call('ZADD', keys[1], 1, 'a', 2.5, 'b')
    return redis.call('ZRANGE', keys[1], 0, -1, 'WITHSCORES')
  end
  return redis.call(unpack(argv, 2))
end
redis.register_function('conv', conv)
redis.register_function{function_name = 'probe_ro', callback = function() return 'ro' end, flags = {'no-writes'}}
"#;

#[tokio::test]
async fn functions_convert_replies_and_errors_as_redis_does() {
    let mut b = Both::start().await;
    b.same(&["FCALL", "conv", "1", "k", "float"], Order::Kept).await;
    b.same(&["FUNCTION", "LOAD", PROBE_LIBRARY], Order::Kept).await;
    b.same(&["FUNCTION", "LOAD", PROBE_LIBRARY], Order::Kept).await;
    b.same(&["FUNCTION", "LOAD", "REPLACE", PROBE_LIBRARY], Order::Kept).await;
    for kind in [
        "float",
        "neg",
        "holes",
        "bools",
        "false",
        "true",
        "status",
        "err",
        "error_reply",
        "error_reply_one",
        "nested",
        "nil_get",
        "numbers",
        "status_in",
        "pcall",
        "lua_pcall",
        "raise",
        "time",
        "scores",
    ] {
        b.same(&["FCALL", "conv", "1", &format!("k{kind}"), kind], Order::Kept).await;
    }
    b.same(&["FCALL", "conv", "1", "kz", "call", "ZADD", "kz", "1", "m"], Order::Kept).await;
    b.same(&["FCALL", "probe_ro", "0"], Order::Kept).await;
    b.same(&["FCALL", "nope", "0"], Order::Kept).await;
    b.same(&["FCALL", "conv", "2", "k"], Order::Kept).await;
    b.same(&["FUNCTION", "FLUSH"], Order::Kept).await;
    b.same(&["FCALL", "probe_ro", "0"], Order::Kept).await;
}
