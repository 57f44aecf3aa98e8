//! Eviction keeps up with abandonment: a huge number of stale users is cleared within a few
//! ticks, in bounded slices, so Redis never blocks on one call.

use std::sync::Arc;

use redis::AsyncCommands;
use vq::pump::{EVICT_SLICE, Pump};
use vq::store::prelude::*;

use crate::support::{RedisServer, next_tick, open_store, test_settings};

const STALE: u64 = 60_000;

const P: &str = "queue:{LIMITED_DROP:1}:";

/// Puts users `from..=to` in target 1's queue (seq = user id) with their last poll `ago_ms`
/// before Redis' clock: in the waiting users' beats (prelude.lua's beat_tag), or, with `legacy`, in
/// the heartbeat ZSET as a queue kept before the beats existed holds it. 2000 per script call.
async fn load_users(redis: &RedisServer, from: u64, to: u64, ago_ms: u64, legacy: bool) {
    let mut c = redis.conn().await;
    let load = redis::Script::new(&crate::support::lua_as_sent(
        "local seqs, beat = {}, now_ms() - tonumber(ARGV[3])
         for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
           redis.call('ZADD', KEYS[1], i, i)
           if ARGV[4] == '1' then
             redis.call('ZADD', KEYS[2], beat, i)
           else
             seqs[#seqs + 1] = i
           end
         end
         beats_set(KEYS[3], seqs, beat_tag(beat))
         if tonumber(redis.call('GET', KEYS[4]) or '0') < tonumber(ARGV[2]) then
           redis.call('SET', KEYS[4], ARGV[2])
         end
         return 1",
    ));
    for part in (from..=to).step_by(2000) {
        let _: u64 = load
            .key(format!("{P}waiting"))
            .key(format!("{P}heartbeat"))
            .key(format!("{P}beats"))
            .key(format!("{P}seq"))
            .arg(part)
            .arg((part + 1999).min(to))
            .arg(ago_ms)
            .arg(if legacy { "1" } else { "0" })
            .invoke_async(&mut c)
            .await
            .unwrap();
    }
    let _: u64 = c.sadd("queue:active", "LIMITED_DROP:1").await.unwrap();
}

/// Puts `n` users in target 1's queue whose last poll was long ago.
async fn load_stale_users(redis: &RedisServer, n: u64) {
    load_users(redis, 1, n, 600_000, false).await;
}

#[tokio::test]
async fn many_stale_users_are_evicted_within_a_few_ticks_in_bounded_slices() {
    let redis = RedisServer::spawn();
    let s = Arc::new(test_settings(Some(&redis)));
    load_stale_users(&redis, STALE).await;
    let pump = Pump::new(open_store(&s), s.clone(), "p".into());
    let mut evicted = 0;
    let mut ticks = 0;
    // How many ticks it takes depends on the machine (each tick's eviction stops before the
    // tick ends); the behaviour is bounded slices and, within a bounded number of ticks, all.
    while evicted < STALE && ticks < 30 {
        next_tick(s.queue.tick_ms).await;
        let results = pump.tick().await.unwrap();
        let t = results[0].as_ref().unwrap();
        assert!(t.locked);
        assert!(t.evicted <= t.evict_calls * EVICT_SLICE, "each call evicts one slice at most: {t:?}");
        evicted += t.evicted;
        ticks += 1;
    }
    assert_eq!(evicted, STALE, "all stale users evicted in {ticks} ticks");
    let mut c = redis.conn().await;
    let waiting: u64 = c.zcard("queue:{LIMITED_DROP:1}:waiting").await.unwrap();
    let total: u64 = c.get("queue:{LIMITED_DROP:1}:evicted").await.unwrap();
    assert_eq!((waiting, total), (0, STALE));
}

/// A queue whose waiting users' heartbeats are still in the heartbeat ZSET (kept by an earlier
/// vq) loses none who polls since: the eviction moves each such heartbeat to the beats with its
/// time unless the user polled since, so only users who really stopped polling are evicted.
#[tokio::test]
async fn heartbeats_kept_in_the_zset_move_to_the_beats_and_evict_only_the_silent() {
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    s.queue.heartbeat_timeout_s = 1;
    let s = Arc::new(s);
    load_users(&redis, 1, 300, 600_000, true).await;
    let store = open_store(&s);
    // Users 1..=100 poll now (an instance of this build: their heartbeats go to the beats).
    for u in 1..=100u64 {
        let o = store.status("limited-drop:1".parse().unwrap(), vq::domain::UserId::from(u), &"tok").await.unwrap();
        assert!(matches!(o, vq::store::StatusOutcome::Waiting(_)), "user {u}: {o:?}");
    }
    let pump = Pump::new(store.clone(), s.clone(), "p".into());
    next_tick(s.queue.tick_ms).await;
    let mut evicted = 0;
    for _ in 0..10 {
        let results = pump.tick().await.unwrap();
        evicted += results[0].as_ref().unwrap().evicted;
        if evicted >= 200 {
            break;
        }
    }
    assert_eq!(evicted, 200, "users 101..=300 stopped polling long ago");
    let mut c = redis.conn().await;
    let left: Vec<String> = c.zrange(format!("{P}waiting"), 0, -1).await.unwrap();
    assert_eq!(left, (1..=100).map(|u| u.to_string()).collect::<Vec<_>>(), "the users who polled stay");
    let zset: u64 = c.exists(format!("{P}heartbeat")).await.unwrap();
    assert_eq!(zset, 0, "no heartbeat of a user with a seq is left in the ZSET");
}

#[test]
#[allow(clippy::result_large_err)] // figment::Jail's closures return figment::Error
fn max_evict_per_tick_is_bounded() {
    use vq::config::{Overrides, Settings};
    figment::Jail::expect_with(|jail| {
        for bad in ["0", "10000001"] {
            jail.set_env("VQ_QUEUE__MAX_EVICT_PER_TICK", bad);
            let e = Settings::load(None, &Overrides::default()).unwrap_err().to_string();
            assert!(e.contains("queue.max_evict_per_tick") && e.contains("10000000"), "{e}");
        }
        jail.set_env("VQ_QUEUE__MAX_EVICT_PER_TICK", "10000000");
        assert!(Settings::load(None, &Overrides::default()).is_ok());
        Ok(())
    });
}
