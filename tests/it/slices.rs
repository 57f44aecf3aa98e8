//! No Redis call walks the whole queue: admission, the heartbeat flush and the count of expired
//! tokens go in calls of a bounded number of users (`vq::store::slices`), repeated until the
//! work is done, and every invariant holds across the calls (one batch per tick, whatever the
//! instances, and a caller that stops mid-tick blocks nobody). Counted, never timed.

use std::sync::Arc;

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use vq::domain::{QueueTarget, UserId};
use vq::store::prelude::*;
use vq::store::slices::{ADMIT_SLICE, TOKENS_EXPIRE_SLICE, VIEW_DEPARTED_MAX, VIEW_USERS_PER_CALL};
use vq::store::{AnyStore, RedisStore};

use crate::support::{RedisServer, lua_as_sent, next_tick, open_store, test_settings, tick_room};
use vq::domain::{Ms, Users};

const P: &str = "queue:{LIMITED_DROP:1}:";

fn target() -> QueueTarget {
    "limited-drop:1".parse().expect("target")
}

/// Puts users 1..=n in the target's queue (seq = user id), their last poll at `beat` ms, 2000
/// per script call.
async fn load_waiting(redis: &RedisServer, n: u64, beat: u64) {
    let mut c = redis.conn().await;
    let load = redis::Script::new(
        "for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
           redis.call('ZADD', KEYS[1], i, i)
           redis.call('ZADD', KEYS[2], ARGV[3], i)
         end
         redis.call('SET', KEYS[3], ARGV[2])
         return 1",
    );
    for from in (1..=n).step_by(2000) {
        let _: u64 = load
            .key(format!("{P}waiting"))
            .key(format!("{P}heartbeat"))
            .key(format!("{P}seq"))
            .arg(from)
            .arg((from + 1999).min(n))
            .arg(beat)
            .invoke_async(&mut c)
            .await
            .expect("load users");
    }
}

async fn reset_stats(c: &mut MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(c).await.expect("config resetstat");
}

/// Calls of `command` Redis ran to the end since the last `CONFIG RESETSTAT` (`INFO
/// commandstats`; a script's first `FCALL` on a node without the library fails and is sent again).
async fn calls(c: &mut MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(c).await.expect("info");
    let line = info.lines().find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:"))).unwrap_or("");
    let field = |name: &str| -> u64 {
        line.split(',').find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok()).unwrap_or(0)
    };
    field("calls") - field("failed_calls")
}

fn redis_store(store: &AnyStore) -> &RedisStore {
    store
}

#[tokio::test]
async fn a_batch_of_several_slices_is_admitted_exactly_once_per_tick_across_instances() {
    let redis = RedisServer::spawn();
    let s = Arc::new(test_settings(Some(&redis)));
    load_waiting(&redis, 3000, 1000).await;
    let (a, b) = (open_store(&s), open_store(&s));
    let batch = 2 * ADMIT_SLICE + ADMIT_SLICE / 2;
    let mut c = redis.conn().await;
    tick_room(s.queue.tick_ms, s.queue.tick_ms / 2).await;
    reset_stats(&mut c).await;
    let first = a.admit_by(target(), Users(batch), Ms(s.queue.tick_ms), "a").await.unwrap();
    assert!(first.advanced);
    assert_eq!((first.admitted, first.mark), (batch, batch), "the whole batch, in its tick");
    assert_eq!(calls(&mut c, "fcall").await, 3, "two full slices and a half one");
    let second = b.admit_by(target(), Users(batch), Ms(s.queue.tick_ms), "b").await.unwrap();
    assert!(!second.advanced, "another instance cannot start the tick again");
    assert_eq!(second.admitted, 0);

    // The tick's bookkeeping is one tick's: one admissions entry, one ledger row, its counts.
    let admissions: Vec<String> = c.lrange(format!("{P}admissions"), 0, -1).await.unwrap();
    assert_eq!(admissions, vec![format!("{}:{batch}", first.tick)]);
    let ledger: Vec<String> = c.lrange(format!("{P}ledger"), 0, -1).await.unwrap();
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    let row: Vec<&str> = ledger[0].split('|').collect();
    assert_eq!((row[0], row[2], row[3], row[4], row[5]), ("admit", "0", &*batch.to_string(), &*batch.to_string(), "a"));
    let admitted: u64 = c.hget(format!("{P}waits"), "admitted").await.unwrap();
    let in_tick: u64 = c.hget(format!("{P}record"), format!("t:{}", first.tick)).await.unwrap();
    assert_eq!((admitted, in_tick), (batch, batch));

    next_tick(s.queue.tick_ms).await;
    let third = b.admit_by(target(), Users(batch), Ms(s.queue.tick_ms), "b").await.unwrap();
    assert_eq!((third.admitted, third.mark), (batch, 2 * batch), "the next tick, another batch");
}

/// admit.lua as the store sends it, with a slice and a continuation: returns its reply.
async fn admit_slice(c: &mut MultiplexedConnection, batch: u64, tick_ms: u64, continuation: &str) -> Vec<String> {
    // The KEYS in the order the script's header lists them (`-- KEYS[i] queue:{T}:name`).
    let text = include_str!("../../lua/admit.lua");
    let names =
        text.lines().filter_map(|l| l.strip_prefix("-- KEYS[")?.split_once("queue:{T}:")?.1.split_whitespace().next());
    let script = redis::Script::new(&lua_as_sent(text));
    let mut inv = script.prepare_invoke();
    for n in names {
        inv.key(format!("{P}{n}"));
    }
    let args = [batch.to_string(), tick_ms.to_string(), "3600".into(), "x".into(), "100".into()];
    inv.arg(&args).arg(&["0", "0", "0", "0"]).arg("3600").arg("60:1").arg(60).arg(100).arg(0);
    inv.arg(ADMIT_SLICE).arg(continuation);
    inv.invoke_async(c).await.expect("admit.lua")
}

#[tokio::test]
async fn a_caller_stopping_mid_tick_blocks_nobody_and_its_continuation_ends_with_the_tick() {
    let redis = RedisServer::spawn();
    load_waiting(&redis, 5000, 1000).await;
    let mut c = redis.conn().await;
    let (tick_ms, batch) = (1000, 3 * ADMIT_SLICE);
    tick_room(tick_ms, tick_ms / 2).await;
    let r = admit_slice(&mut c, batch, tick_ms, "").await;
    assert_eq!((&*r[0], &*r[3], &*r[7]), ("1", &*ADMIT_SLICE.to_string(), "1"), "one slice, more to do: {r:?}");
    let stale = r[8].clone();
    assert!(!stale.is_empty());
    // Another caller in the same tick cannot start it again: the slices are the tick's.
    let again = admit_slice(&mut c, batch, tick_ms, "").await;
    assert_eq!((&*again[0], &*again[3]), ("0", "0"), "{again:?}");
    // Continued: a second slice, then the third and last.
    let r = admit_slice(&mut c, batch, tick_ms, &stale).await;
    assert_eq!((&*r[0], &*r[3], &*r[7]), ("1", &*ADMIT_SLICE.to_string(), "1"), "{r:?}");
    // The same continuation twice is refused: the tick's entry moved on.
    let twice = admit_slice(&mut c, batch, tick_ms, &stale).await;
    assert_eq!((&*twice[0], &*twice[3]), ("0", "0"), "{twice:?}");
    let unfinished = r[8].clone();

    // The caller stops (crashed): the next tick starts afresh, with a whole batch.
    next_tick(tick_ms).await;
    let late = admit_slice(&mut c, batch, tick_ms, &unfinished).await;
    assert_eq!((&*late[0], &*late[3]), ("0", "0"), "a tick's continuation ends with it: {late:?}");
    let mut admitted = 0;
    let mut cont = String::new();
    let mut slices = 0;
    loop {
        let r = admit_slice(&mut c, batch, tick_ms, &cont).await;
        assert_eq!(r[0], "1", "{r:?}");
        let n: u64 = r[3].parse().unwrap();
        assert!(n <= ADMIT_SLICE);
        admitted += n;
        slices += 1;
        if r[7] != "1" {
            break;
        }
        cont = r[8].clone();
    }
    assert_eq!((admitted, slices), (batch, 3));
    let mark: u64 = c.get(format!("{P}admitted_count")).await.unwrap();
    assert_eq!(mark, 2 * ADMIT_SLICE + batch);
}

#[tokio::test]
async fn a_heartbeat_flush_of_many_users_goes_in_calls_of_a_bounded_size() {
    let redis = RedisServer::spawn();
    let s = test_settings(Some(&redis));
    let n = 2 * VIEW_USERS_PER_CALL as u64 + 7;
    load_waiting(&redis, n, 1000).await;
    let store = open_store(&s);
    let users: Vec<UserId> = (1..=n).map(UserId::from).collect();
    let mut c = redis.conn().await;
    reset_stats(&mut c).await;
    let sync = redis_store(&store).sync_view(target(), &users).await.unwrap();
    assert!(sync.gone.is_empty(), "{:?}", sync.gone);
    assert_eq!(calls(&mut c, "fcall").await, 3, "two full calls and one of 7 users");
    let now: (u64, u64) = redis::cmd("TIME").query_async(&mut c).await.unwrap();
    let recent = crate::support::beat_tag(&mut c, now.0 * 1000 - 5000).await;
    let tags = crate::support::beat_tags(&mut c, P, &(1..=n).collect::<Vec<_>>()).await;
    assert!(tags.iter().all(|t| *t >= recent), "every user's heartbeat written: {tags:?}");
}

#[tokio::test]
async fn a_copy_of_a_queue_many_users_left_holds_the_lowest_departed_and_says_so() {
    let redis = RedisServer::spawn();
    let s = test_settings(Some(&redis));
    load_waiting(&redis, 10, 1000).await;
    let store = open_store(&s);
    let mut c = redis.conn().await;
    let left = VIEW_DEPARTED_MAX as u64 + 10;
    let seqs: Vec<(u64, u64)> = (11..11 + left).map(|s| (s, s)).collect();
    for part in seqs.chunks(1000) {
        let _: u64 = c.zadd_multiple(format!("{P}departed"), part).await.unwrap();
    }
    let view = redis_store(&store).sync_view(target(), &[]).await.unwrap().view;
    assert_eq!(view.departed.len(), VIEW_DEPARTED_MAX, "one bounded read");
    assert_eq!(view.departed_known_to, Some(10 + VIEW_DEPARTED_MAX as u64));
    assert_eq!(view.ahead(11 + VIEW_DEPARTED_MAX as u64), 10, "exact up to the last departed it holds");

    let _: u64 = c.zrembyscore(format!("{P}departed"), 12, "+inf").await.unwrap();
    let view = redis_store(&store).sync_view(target(), &[]).await.unwrap().view;
    assert_eq!((view.departed, view.departed_known_to), (vec![11], None), "all of them");
}

#[tokio::test]
async fn a_backlog_of_expired_tokens_is_counted_in_bounded_calls() {
    let redis = RedisServer::spawn();
    let s = test_settings(Some(&redis));
    let store = open_store(&s);
    let n = 2 * TOKENS_EXPIRE_SLICE + 3;
    let mut c = redis.conn().await;
    for from in (1..=n).step_by(1000) {
        let members: Vec<(u64, u64)> = (from..=(from + 999).min(n)).map(|u| (1000, u)).collect();
        let _: u64 = c.zadd_multiple(format!("{P}unused"), &members).await.unwrap();
    }
    // One token not expired yet stays.
    let _: u64 = c.zadd(format!("{P}unused"), "later", u64::MAX >> 12).await.unwrap();
    reset_stats(&mut c).await;
    assert_eq!(store.expire_tokens(target()).await.unwrap(), n);
    assert_eq!(calls(&mut c, "fcall").await, 3);
    let left: u64 = c.zcard(format!("{P}unused")).await.unwrap();
    let counted: u64 = c.hget(format!("{P}waits"), "tokens_expired").await.unwrap();
    assert_eq!((left, counted), (1, n));
}
