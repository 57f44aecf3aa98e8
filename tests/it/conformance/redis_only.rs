//! What only the Redis store can get wrong, checked on Redis alone: calls coalesced into shared
//! script calls, queues larger than Lua unpacks in one go, and how long the adaptive outflow's
//! per-interval keys live. Redis' `TIME` cannot be
//! stepped: the steps wait on its clock ([`Time::of_redis`]).

use super::*;
use vq::domain::{Ms, Users};

/// Calls made at once reach Redis coalesced into shared script calls (a user may even be in
/// one call twice): every answer must still be the one the user would get alone.
#[tokio::test]
async fn concurrent_enters_and_polls_answer_each_user_as_if_alone() {
    let redis = RedisServer::spawn();
    let s = open_store(&test_settings(Some(&redis)));
    let time = Time::of_redis(&s);
    let users = 1..=200u64;
    let mut tasks = Vec::new();
    // Each user's two calls are made one after the other, so they often share a script call.
    for u in users.clone() {
        for round in 0..2 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                match s.enter(t(), UserId::from(u), &format!("e{u}-{round}").as_str()).await.unwrap() {
                    EnterOutcome::Waiting(w) => (u, w.seq, w.ahead),
                    o => panic!("user {u}: {o:?}"),
                }
            }));
        }
    }
    let mut seq_of = std::collections::HashMap::new();
    for task in tasks {
        let (u, seq, ahead) = task.await.unwrap();
        assert_eq!(ahead, seq - 1, "user {u}: nobody left, nobody admitted");
        assert_eq!(*seq_of.entry(u).or_insert(seq), seq, "user {u} keeps one seq");
    }
    let mut seqs: Vec<u64> = seq_of.values().copied().collect();
    seqs.sort_unstable();
    assert_eq!(seqs, users.clone().collect::<Vec<_>>(), "no gap, no duplicate");

    let tick_ms = 500;
    time.next_tick(tick_ms).await;
    assert_eq!(s.admit(t(), Users(50), Ms(tick_ms)).await.unwrap().mark, 50);
    let mut tasks = Vec::new();
    for u in users.clone() {
        for round in 0..2 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                (u, s.status(t(), UserId::from(u), &format!("p{u}-{round}").as_str()).await.unwrap())
            }));
        }
    }
    let mut token_of = std::collections::HashMap::new();
    for task in tasks {
        let (u, outcome) = task.await.unwrap();
        let seq = seq_of[&u];
        match outcome {
            StatusOutcome::Admitted(token) if seq <= 50 => {
                assert!(token.starts_with(&format!("p{u}-")), "user {u}: {token}");
                assert_eq!(*token_of.entry(u).or_insert(token.clone()), token, "user {u}: one token");
            }
            StatusOutcome::Waiting(w) if seq > 50 => assert_eq!((w.seq, w.ahead), (seq, seq - 51), "user {u}"),
            o => panic!("user {u} (seq {seq}): {o:?}"),
        }
    }
    let snap = s.snapshot(t()).await.unwrap();
    assert_eq!((snap.tokens_issued, snap.waiting), (50, 150));
    let mut c = redis.conn().await;
    let stats: String = redis::cmd("INFO").arg("commandstats").query_async(&mut c).await.unwrap();
    let calls: u64 =
        stats.lines().find_map(|l| l.strip_prefix("cmdstat_fcall:calls=")?.split(',').next()?.parse().ok()).unwrap();
    assert!(calls < 400, "800 enters and polls went out in {calls} script calls: they were not coalesced");
}

/// A Redis store with users 1..=9000 waiting, entered at once (more than Lua unpacks in one go).
async fn redis_store_with_9000_waiting() -> (RedisServer, AnyStore) {
    let redis = RedisServer::spawn();
    let mut settings = test_settings(Some(&redis));
    settings.queue.max_capacity = 100_000;
    // This is about Lua's unpack limit, not about timeouts: the enters go in waves of 500 (each
    // wave still coalesced), so none waits behind thousands of others for its script call,
    // which on a loaded machine can take longer than any timeout a store accepts.
    settings.redis.timeout_ms = 5000;
    let s = open_store(&settings);
    for wave in (1..=9000u64).collect::<Vec<_>>().chunks(500) {
        let mut tasks = Vec::new();
        for &u in wave {
            let s = s.clone();
            tasks.push(tokio::spawn(async move { s.enter(t(), UserId::from(u), &"tok").await.unwrap() }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    }
    (redis, s)
}

/// The eviction bound is the operator's (`queue.max_evict_per_tick`): a large one must not hit
/// Lua's limit on unpacked values (about 8000): each call takes at most 1000 users and a
/// bounded slice of seqs, and says whether more are left.
#[tokio::test]
async fn eviction_with_a_large_bound_removes_every_stale_user() {
    let (_redis, s) = redis_store_with_9000_waiting().await;
    let time = Time::of_redis(&s);
    time.pass(300).await;
    let (mut evicted, mut calls) = (0, 0);
    loop {
        let e = s.evict(t(), Ms(200), Users(20_000)).await.unwrap();
        assert!(e.users <= 1000, "{e:?}");
        evicted += e.users;
        calls += 1;
        if !e.more {
            break;
        }
    }
    assert_eq!((evicted, calls), (9000, 9));
    let snap = s.snapshot(t()).await.unwrap();
    assert_eq!((snap.waiting, snap.evicted), (0, 9000));
    match s.enter(t(), UserId::from(1), &"tok").await.unwrap() {
        EnterOutcome::Waiting(w) => assert_eq!((w.seq, w.ahead), (9001, 0), "the evicted are not ahead"),
        o => panic!("{o:?}"),
    }
}

/// The batch size is the operator's (`vq batch set`): admitting a large batch must not hit
/// Lua's limit on unpacked values either.
#[tokio::test]
async fn a_large_batch_is_admitted_in_one_tick() {
    let (_redis, s) = redis_store_with_9000_waiting().await;
    let time = Time::of_redis(&s);
    time.next_tick(500).await;
    let a = s.admit(t(), Users(20_000), Ms(500)).await.unwrap();
    assert_eq!((a.admitted, a.mark), (9000, 9000));
    let snap = s.snapshot(t()).await.unwrap();
    assert_eq!((snap.waiting, snap.waits.count), (0, 9000));
}

/// A wait is measured from the entry time of the enter.lua call that gave the seq; seqs
/// without one (given by an older vq) are admitted but not counted, and the entry times of
/// users the mark passed are dropped.
#[tokio::test]
async fn waits_come_from_each_call_entry_time_and_are_dropped_behind_the_mark() {
    let redis = RedisServer::spawn();
    let s = open_store(&test_settings(Some(&redis)));
    let time = Time::of_redis(&s);
    let began = Instant::now();
    for u in 1..=3 {
        s.enter(t(), UserId::from(u), &"tok").await.unwrap();
    }
    time.pass(700).await;
    for u in 4..=5 {
        s.enter(t(), UserId::from(u), &"tok").await.unwrap();
    }
    // Seq 6 given the way a vq without entry times did.
    let mut c = redis.conn().await;
    let _: u64 = redis::cmd("INCR").arg("queue:{LIMITED_DROP:42}:seq").query_async(&mut c).await.unwrap();
    let _: u64 =
        redis::cmd("ZADD").arg("queue:{LIMITED_DROP:42}:waiting").arg(6).arg(66).query_async(&mut c).await.unwrap();
    time.next_tick(500).await;
    assert_eq!(s.admit(t(), Users(3), Ms(500)).await.unwrap().admitted, 3);
    let snap = s.snapshot(t()).await.unwrap();
    assert_eq!(snap.waits.count, 3);
    assert!(snap.waits.sum_ms >= 3 * 700, "users 1-3 entered 700 ms before 4-5: {:?}", snap.waits);
    let entry_times = async |c: &mut redis::aio::MultiplexedConnection| -> u64 {
        redis::cmd("ZCARD").arg("queue:{LIMITED_DROP:42}:entry_times").query_async(c).await.unwrap()
    };
    assert_eq!(entry_times(&mut c).await, 2, "users 4 and 5 keep theirs");
    time.next_tick(500).await;
    let a = s.admit(t(), Users(10), Ms(500)).await.unwrap();
    assert_eq!((a.admitted, a.mark), (3, 6));
    let snap = s.snapshot(t()).await.unwrap();
    assert_eq!(snap.waits.count, 5, "seq 6 has no entry time");
    let most = began.elapsed().as_millis() as u64;
    assert!(snap.waits.sum_ms <= 5 * most, "no wait is longer than the test: {:?}, {most} ms", snap.waits);
    assert_eq!(entry_times(&mut c).await, 1, "only the call holding the latest seq is kept");
}

/// An interval's observations stay 10 minutes (the pump reads them after the interval); whom
/// it counted stays only as long as the gate says, every buyer's first purchase renewing it.
#[tokio::test]
async fn an_intervals_buyers_expire_with_the_interval_and_its_observations_later() {
    use redis::AsyncCommands;
    use vq::domain::BuyerObservation;
    let redis = RedisServer::spawn();
    let s = open_store(&test_settings(Some(&redis)));
    let seen = BuyerObservation::default();
    for u in 1..=3u64 {
        s.observe_purchase(t(), 9, &UserId::from(u), seen, 20).await.unwrap();
    }
    let mut c = redis.conn().await;
    let obs: i64 = c.ttl(format!("queue:{{{}}}:outflow:obs:9", t())).await.unwrap();
    let buyers: i64 = c.ttl(format!("queue:{{{}}}:outflow:buyers:9", t())).await.unwrap();
    assert!((590..=600).contains(&obs), "observations: {obs} s");
    assert!((15..=20).contains(&buyers), "buyers: {buyers} s");
    let counted: u64 = c.hlen(format!("queue:{{{}}}:outflow:buyers:9", t())).await.unwrap();
    assert_eq!(counted, 3);
}
