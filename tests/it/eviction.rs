//! Eviction keeps up with abandonment: a huge number of stale users is cleared within a few
//! ticks, in bounded slices, so Redis never blocks on one call.

use std::sync::Arc;

use redis::AsyncCommands;
use vq::pump::{EVICT_SLICE, Pump};

use crate::support::{RedisServer, next_tick, open_store, test_settings};

const STALE: u64 = 60_000;

/// Puts `n` users in target 1's queue whose last poll was long ago, 2000 per script call.
async fn load_stale_users(redis: &RedisServer, n: u64) {
    let mut c = redis.conn().await;
    let load = redis::Script::new(
        "for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
           redis.call('ZADD', KEYS[1], i, i)
           redis.call('ZADD', KEYS[2], 1000, i)
         end
         redis.call('SET', KEYS[3], ARGV[2])
         return 1",
    );
    for from in (1..=n).step_by(2000) {
        let _: u64 = load
            .key("queue:{LIMITED_DROP:1}:waiting")
            .key("queue:{LIMITED_DROP:1}:heartbeat")
            .key("queue:{LIMITED_DROP:1}:seq")
            .arg(from)
            .arg((from + 1999).min(n))
            .invoke_async(&mut c)
            .await
            .unwrap();
    }
    let _: u64 = c.sadd("queue:active", "LIMITED_DROP:1").await.unwrap();
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
