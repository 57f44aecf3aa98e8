//! One suite, two stores: the embedded store must behave like the Redis scripts, or it goes.

use std::time::{Duration, Instant};

use vq::config::Settings;
use vq::domain::{QueueTarget, UserId};
use vq::store::{AnyStore, EnterOutcome, FlagAck, QueueStore, StatusOutcome, TokenClaim};

use crate::support::{RedisServer, next_tick, open_store, test_settings};

fn t() -> QueueTarget {
    "limited-drop:42".parse().expect("target")
}

async fn with_both(check: impl AsyncFn(AnyStore, u64)) {
    with_both_configured(|_| {}, check).await;
}

/// Runs `check` on a Redis store, then on the embedded one, both configured alike (capacity 5,
/// then `configure`); the store under test is printed first, so a failure names it.
async fn with_both_configured(configure: impl Fn(&mut Settings), check: impl AsyncFn(AnyStore, u64)) {
    let redis = RedisServer::spawn();
    for mut s in [test_settings(Some(&redis)), test_settings(None)] {
        s.queue.max_capacity = 5;
        configure(&mut s);
        eprintln!("conformance: {:?} store", s.store);
        check(open_store(&s), 500).await;
    }
}

/// Target keys live 1 s after their last refresh, so expiry is seen within a test.
fn short_key_ttl(s: &mut Settings) {
    s.queue.key_ttl_s = 1;
}

/// Waits (bounded, 10 s) until `done` holds; false if it never did.
async fn eventually(done: impl AsyncFn() -> bool) -> bool {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        if done().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

fn seq(o: EnterOutcome) -> u64 {
    match o {
        EnterOutcome::Waiting(w) => w.seq,
        other => panic!("expected waiting, got {other:?}"),
    }
}

#[tokio::test]
async fn enter_is_idempotent_and_numbers_in_order() {
    with_both(async |s, _| {
        assert_eq!(seq(s.enter(t(), UserId(7), &"tok").await.unwrap()), 1);
        assert_eq!(seq(s.enter(t(), UserId(8), &"tok").await.unwrap()), 2);
        assert_eq!(seq(s.enter(t(), UserId(7), &"tok").await.unwrap()), 1, "same user keeps the seq");
        match s.enter(t(), UserId(9), &"tok").await.unwrap() {
            EnterOutcome::Waiting(w) => assert_eq!((w.ahead, w.mark), (2, 0)),
            o => panic!("{o:?}"),
        }
    })
    .await;
}

#[tokio::test]
async fn full_queue_refuses_new_users_but_not_waiting_ones() {
    with_both(async |s, _| {
        for u in 1..=5 {
            seq(s.enter(t(), UserId(u), &"tok").await.unwrap());
        }
        assert_eq!(s.enter(t(), UserId(6), &"tok").await.unwrap(), EnterOutcome::Full);
        assert_eq!(seq(s.enter(t(), UserId(3), &"tok").await.unwrap()), 3);
        assert!(s.leave(t(), UserId(1)).await.unwrap());
        assert_eq!(seq(s.enter(t(), UserId(6), &"tok").await.unwrap()), 6, "a leaver frees a place");
    })
    .await;
}

#[tokio::test]
async fn admit_counts_only_users_still_waiting_and_runs_once_per_tick() {
    with_both(async |s, tick_ms| {
        for u in 1..=5 {
            s.enter(t(), UserId(u), &"tok").await.unwrap();
        }
        assert!(s.leave(t(), UserId(2)).await.unwrap());
        next_tick(tick_ms).await;
        let a = s.admit(t(), 2, tick_ms).await.unwrap();
        assert!(a.advanced);
        assert_eq!((a.admitted, a.mark), (2, 3), "users 1 and 3: the leaver used no slot");
        let again = s.admit(t(), 2, tick_ms).await.unwrap();
        assert!(!again.advanced, "a second call in the same tick admits nobody");
        assert_eq!(again.mark, 3);
        // User 4 has nobody waiting ahead now, but is not admitted before the next tick.
        match s.status(t(), UserId(4), &"tok4").await.unwrap() {
            StatusOutcome::Waiting(w) => assert_eq!((w.seq, w.ahead, w.mark), (4, 0, 3)),
            o => panic!("{o:?}"),
        }
        next_tick(tick_ms).await;
        let b = s.admit(t(), 2, tick_ms).await.unwrap();
        assert_eq!((b.admitted, b.mark), (2, 5));
        next_tick(tick_ms).await;
        let c = s.admit(t(), 2, tick_ms).await.unwrap();
        assert_eq!((c.admitted, c.mark), (0, 5), "never above the last seq");
        let snap = s.snapshot(t()).await.unwrap();
        assert_eq!(snap.admitted_total, 4);
        assert_eq!(snap.waits.count, 4);
    })
    .await;
}

#[tokio::test]
async fn admitted_user_gets_one_token_and_leaves_the_queue() {
    with_both(async |s, tick_ms| {
        s.enter(t(), UserId(1), &"first").await.unwrap();
        s.enter(t(), UserId(2), &"first").await.unwrap();
        next_tick(tick_ms).await;
        s.admit(t(), 1, tick_ms).await.unwrap();
        assert_eq!(s.status(t(), UserId(1), &"issued").await.unwrap(), StatusOutcome::Admitted("issued".into()));
        assert_eq!(s.status(t(), UserId(1), &"other").await.unwrap(), StatusOutcome::Admitted("issued".into()));
        assert_eq!(s.enter(t(), UserId(1), &"other").await.unwrap(), EnterOutcome::Admitted("issued".into()));
        let snap = s.snapshot(t()).await.unwrap();
        assert_eq!(snap.waiting, 1, "user 2 still waits; user 1 left the queue");
        assert_eq!(snap.tokens_issued, 1, "one token, however often it is read");
        assert_eq!(s.status(t(), UserId(3), &"x").await.unwrap(), StatusOutcome::NotInQueue);
    })
    .await;
}

#[tokio::test]
async fn users_who_stop_polling_are_evicted_in_bounded_steps() {
    with_both(async |s, tick_ms| {
        for u in 1..=4 {
            s.enter(t(), UserId(u), &"tok").await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        s.status(t(), UserId(4), &"tok").await.unwrap();
        assert_eq!(s.evict(t(), 200, 2).await.unwrap(), 2, "bounded per call");
        assert_eq!(s.evict(t(), 200, 10).await.unwrap(), 1);
        assert_eq!(s.evict(t(), 200, 10).await.unwrap(), 0, "user 4 polled recently");
        assert_eq!(s.status(t(), UserId(1), &"tok").await.unwrap(), StatusOutcome::NotInQueue);
        // An evicted user re-enters at the back with a new seq (FR-8).
        assert_eq!(seq(s.enter(t(), UserId(1), &"tok").await.unwrap()), 5);
        next_tick(tick_ms).await;
        let a = s.admit(t(), 10, tick_ms).await.unwrap();
        assert_eq!(a.admitted, 2, "evicted users use no admission slot");
        assert_eq!(s.snapshot(t()).await.unwrap().evicted, 3);
    })
    .await;
}

#[tokio::test]
async fn admission_lock_is_exclusive_until_it_expires() {
    with_both(async |s, _| {
        assert!(s.try_lock_admission(t(), "a", 200).await.unwrap());
        assert!(!s.try_lock_admission(t(), "b", 200).await.unwrap());
        assert_eq!(s.snapshot(t()).await.unwrap().lock_holder.as_deref(), Some("a"));
        tokio::time::sleep(Duration::from_millis(260)).await;
        assert!(s.try_lock_admission(t(), "b", 200).await.unwrap());
    })
    .await;
}

#[tokio::test]
async fn flag_and_batch_size_round_trip() {
    with_both(async |s, tick_ms| {
        assert!(!s.read_flag().await.unwrap().enabled);
        let v1 =
            s.write_flag(vec![("enabled".into(), "1".into()), ("percent".into(), "40".into())], vec![]).await.unwrap();
        let v2 = s.write_flag(vec![("target:LIMITED_DROP:42".into(), "off".into())], vec![]).await.unwrap();
        assert_eq!(v2, v1 + 1);
        let f = s.read_flag().await.unwrap();
        assert!(f.enabled);
        assert_eq!((f.percent, f.version, f.overrides.len()), (40, v2, 1));
        s.write_flag(vec![], vec!["target:LIMITED_DROP:42".into()]).await.unwrap();
        assert!(s.read_flag().await.unwrap().overrides.is_empty());

        s.set_batch_size(None, Some(7)).await.unwrap();
        assert_eq!(s.global_batch_size().await.unwrap(), Some(7));
        s.set_batch_size(Some(t()), Some(1)).await.unwrap();
        for u in 1..=3 {
            s.enter(t(), UserId(u), &"tok").await.unwrap();
        }
        next_tick(tick_ms).await;
        let a = s.admit(t(), 100, tick_ms).await.unwrap();
        assert_eq!((a.admitted, a.batch), (1, 1), "the target's runtime batch size wins");
    })
    .await;
}

#[tokio::test]
async fn active_targets_are_registered_and_listed() {
    with_both(async |s, _| {
        let other: QueueTarget = "ticketing-event:7".parse().unwrap();
        s.register_active(t()).await.unwrap();
        s.register_active(other).await.unwrap();
        s.register_active(t()).await.unwrap();
        let mut active = s.active_targets().await.unwrap();
        active.sort();
        assert_eq!(active, vec![t(), other]);
        s.enter(t(), UserId(1), &"tok").await.unwrap();
        assert!(!s.forget_if_expired(t()).await.unwrap(), "live target stays");
        assert!(s.forget_if_expired(other).await.unwrap(), "target without keys goes");
        assert_eq!(s.active_targets().await.unwrap(), vec![t()]);
    })
    .await;
}

#[tokio::test]
async fn ahead_counts_only_users_still_waiting_between_the_mark_and_the_user() {
    with_both(async |s, tick_ms| {
        let ahead = async |u: u64| match s.status(t(), UserId(u), &"tok").await.unwrap() {
            StatusOutcome::Waiting(w) => w.ahead,
            o => panic!("user {u}: {o:?}"),
        };
        for u in 1..=5 {
            s.enter(t(), UserId(u), &"tok").await.unwrap();
        }
        assert!(s.leave(t(), UserId(2)).await.unwrap());
        assert_eq!(ahead(5).await, 3, "1, 3 and 4: the leaver is not ahead");
        tokio::time::sleep(Duration::from_millis(300)).await;
        for u in [1, 4, 5] {
            s.status(t(), UserId(u), &"tok").await.unwrap();
        }
        assert_eq!(s.evict(t(), 200, 10).await.unwrap(), 1, "user 3 stopped polling");
        assert_eq!(ahead(5).await, 2, "1 and 4");
        next_tick(tick_ms).await;
        assert_eq!(s.admit(t(), 1, tick_ms).await.unwrap().mark, 1);
        assert_eq!(ahead(5).await, 1, "only 4: 1 is admitted");
        match s.enter(t(), UserId(6), &"tok").await.unwrap() {
            EnterOutcome::Waiting(w) => assert_eq!((w.seq, w.ahead), (6, 2), "4 and 5 wait before a newcomer"),
            o => panic!("{o:?}"),
        }
        next_tick(tick_ms).await;
        assert_eq!(s.admit(t(), 1, tick_ms).await.unwrap().mark, 4, "the next live user, past the departed");
        assert_eq!(ahead(5).await, 0);
        assert_eq!(ahead(6).await, 1);
        match s.enter(t(), UserId(7), &"tok").await.unwrap() {
            EnterOutcome::Waiting(w) => assert_eq!((w.seq, w.ahead), (7, 2), "5 and 6"),
            o => panic!("{o:?}"),
        }
    })
    .await;
}

/// Calls made at once reach Redis coalesced into shared script calls (a user may even be in
/// one call twice): every answer must still be the one the user would get alone.
#[tokio::test]
async fn concurrent_enters_and_polls_answer_each_user_as_if_alone() {
    let redis = RedisServer::spawn();
    let s = open_store(&test_settings(Some(&redis)));
    let users = 1..=200u64;
    let mut tasks = Vec::new();
    // Each user's two calls are made one after the other, so they often share a script call.
    for u in users.clone() {
        for round in 0..2 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                match s.enter(t(), UserId(u), &format!("e{u}-{round}").as_str()).await.unwrap() {
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
    next_tick(tick_ms).await;
    assert_eq!(s.admit(t(), 50, tick_ms).await.unwrap().mark, 50);
    let mut tasks = Vec::new();
    for u in users.clone() {
        for round in 0..2 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                (u, s.status(t(), UserId(u), &format!("p{u}-{round}").as_str()).await.unwrap())
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
        stats.lines().find_map(|l| l.strip_prefix("cmdstat_evalsha:calls=")?.split(',').next()?.parse().ok()).unwrap();
    assert!(calls < 400, "800 enters and polls went out in {calls} script calls: they were not coalesced");
}

/// A Redis store with users 1..=9000 waiting, entered at once (more than Lua unpacks in one go).
async fn redis_store_with_9000_waiting() -> (RedisServer, AnyStore) {
    let redis = RedisServer::spawn();
    let mut settings = test_settings(Some(&redis));
    settings.queue.max_capacity = 100_000;
    let s = open_store(&settings);
    let mut tasks = Vec::new();
    for u in 1..=9000u64 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move { s.enter(t(), UserId(u), &"tok").await.unwrap() }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    (redis, s)
}

/// The eviction bound is the operator's (`queue.max_evict_per_tick`): a large one must not hit
/// Lua's limit on unpacked values (about 8000).
#[tokio::test]
async fn eviction_with_a_large_bound_removes_every_stale_user() {
    let (_redis, s) = redis_store_with_9000_waiting().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.evict(t(), 200, 20_000).await.unwrap(), 9000);
    let snap = s.snapshot(t()).await.unwrap();
    assert_eq!((snap.waiting, snap.evicted), (0, 9000));
    match s.enter(t(), UserId(1), &"tok").await.unwrap() {
        EnterOutcome::Waiting(w) => assert_eq!((w.seq, w.ahead), (9001, 0), "the evicted are not ahead"),
        o => panic!("{o:?}"),
    }
}

/// The batch size is the operator's (`vq batch set`): admitting a large batch must not hit
/// Lua's limit on unpacked values either.
#[tokio::test]
async fn a_large_batch_is_admitted_in_one_tick() {
    let (_redis, s) = redis_store_with_9000_waiting().await;
    next_tick(500).await;
    let a = s.admit(t(), 20_000, 500).await.unwrap();
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
    for u in 1..=3 {
        s.enter(t(), UserId(u), &"tok").await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    for u in 4..=5 {
        s.enter(t(), UserId(u), &"tok").await.unwrap();
    }
    // Seq 6 given the way a vq without entry times did.
    let mut c = redis.conn().await;
    let _: u64 = redis::cmd("INCR").arg("queue:{LIMITED_DROP:42}:seq").query_async(&mut c).await.unwrap();
    let _: u64 =
        redis::cmd("ZADD").arg("queue:{LIMITED_DROP:42}:waiting").arg(6).arg(66).query_async(&mut c).await.unwrap();
    next_tick(500).await;
    assert_eq!(s.admit(t(), 3, 500).await.unwrap().admitted, 3);
    let snap = s.snapshot(t()).await.unwrap();
    assert_eq!(snap.waits.count, 3);
    assert!(snap.waits.sum_ms >= 3 * 700, "users 1-3 entered 700 ms before 4-5: {:?}", snap.waits);
    let entry_times = async |c: &mut redis::aio::MultiplexedConnection| -> u64 {
        redis::cmd("ZCARD").arg("queue:{LIMITED_DROP:42}:entry_times").query_async(c).await.unwrap()
    };
    assert_eq!(entry_times(&mut c).await, 2, "users 4 and 5 keep theirs");
    next_tick(500).await;
    let a = s.admit(t(), 10, 500).await.unwrap();
    assert_eq!((a.admitted, a.mark), (3, 6));
    let snap = s.snapshot(t()).await.unwrap();
    assert_eq!(snap.waits.count, 5, "seq 6 has no entry time");
    assert!(snap.waits.sum_ms < 5 * 3000, "each wait is under 3 s: {:?}", snap.waits);
    assert_eq!(entry_times(&mut c).await, 1, "only the call holding the latest seq is kept");
}

/// A token that bought stays used whichever other tokens its user claims; releasing one gives
/// back that one only.
#[tokio::test]
async fn every_used_token_stays_used_and_a_release_gives_back_only_its_own() {
    use vq::store::TokenClaim;
    with_both(async |s, _| {
        let (u, ttl) = (UserId(7), 300);
        let claimed = |c: TokenClaim| matches!(c, TokenClaim::Claimed { .. });
        assert!(claimed(s.claim_token(t(), u, "A", ttl).await.unwrap()));
        let b = s.claim_token(t(), u, "B", ttl).await.unwrap();
        let TokenClaim::Claimed { previous } = b else { panic!("B: {b:?}") };
        assert_eq!(s.claim_token(t(), u, "A", ttl).await.unwrap(), TokenClaim::AlreadyUsed);
        assert!(s.token_used(t(), u, "A").await.unwrap());
        s.release_token(t(), u, "B", previous).await.unwrap();
        assert!(!s.token_used(t(), u, "B").await.unwrap());
        assert_eq!(s.claim_token(t(), u, "A", ttl).await.unwrap(), TokenClaim::AlreadyUsed, "A stays used");
        assert!(claimed(s.claim_token(t(), u, "B", ttl).await.unwrap()));
        assert_eq!(s.claim_token(t(), u, "B", ttl).await.unwrap(), TokenClaim::AlreadyUsed);
        assert!(claimed(s.claim_token(t(), UserId(8), "A", ttl).await.unwrap()), "per user");
    })
    .await;
}

/// Redis forgets a target through its keys' TTL, which `admit.lua` refreshes only while
/// someone waits: the pump ticking over an empty queue does not keep it alive.
#[tokio::test]
async fn a_target_is_kept_while_anyone_waits_and_forgotten_a_key_ttl_after() {
    let configure = |s: &mut Settings| {
        short_key_ttl(s);
        s.queue.max_capacity = 8;
    };
    with_both_configured(configure, async |s, _| {
        // Ticks of 250 ms, well inside the key TTL (1 s) even on a loaded machine.
        let tick_ms = 250;
        s.register_active(t()).await.unwrap();
        for u in 1..=8 {
            s.enter(t(), UserId(u), &"tok").await.unwrap();
        }
        // Eight ticks of one admission each: 2 s, twice the key TTL, with someone waiting.
        for _ in 1..=8 {
            next_tick(tick_ms).await;
            let a = s.admit(t(), 1, tick_ms).await.unwrap();
            assert_eq!(a.admitted, 1);
            for u in 1..=8 {
                s.status(t(), UserId(u), &"tok").await.unwrap();
            }
            assert!(!s.forget_if_expired(t()).await.unwrap(), "users waited until this tick");
        }
        assert_eq!(s.snapshot(t()).await.unwrap().waiting, 0);
        // Nobody waits now: ticking on does not keep the target.
        let forgotten = eventually(async || {
            next_tick(tick_ms).await;
            s.admit(t(), 1, tick_ms).await.unwrap();
            s.forget_if_expired(t()).await.unwrap()
        })
        .await;
        assert!(forgotten, "an idle target is forgotten although the pump ticks");
        assert!(s.active_targets().await.unwrap().is_empty());
    })
    .await;
}

/// An idle target's queue keys expire by themselves, forgotten or not: it starts again at
/// seq 1, and those who waited in it are no longer in the queue.
#[tokio::test]
async fn an_idle_target_starts_again_at_seq_1_once_its_keys_expire() {
    with_both_configured(short_key_ttl, async |s, _| {
        for u in 1..=3 {
            s.enter(t(), UserId(u), &"tok").await.unwrap();
        }
        assert!(eventually(async || s.snapshot(t()).await.unwrap().seq == 0).await, "the keys never expired");
        assert_eq!(s.status(t(), UserId(1), &"tok").await.unwrap(), StatusOutcome::NotInQueue);
        assert_eq!(seq(s.enter(t(), UserId(3), &"tok").await.unwrap()), 1);
        assert_eq!(s.snapshot(t()).await.unwrap().waiting, 1);
    })
    .await;
}

/// Forgetting a target drops its queue, not what lives in keys of their own: stored tokens
/// and used marks (the token's lifetime), the runtime batch size (no expiry), the lock.
#[tokio::test]
async fn forgetting_a_target_keeps_its_tokens_used_marks_and_batch_size() {
    with_both_configured(short_key_ttl, async |s, tick_ms| {
        s.register_active(t()).await.unwrap();
        s.set_batch_size(Some(t()), Some(3)).await.unwrap();
        s.enter(t(), UserId(1), &"tok1").await.unwrap();
        next_tick(tick_ms).await;
        assert_eq!(s.admit(t(), 10, tick_ms).await.unwrap().batch, 3);
        assert_eq!(s.status(t(), UserId(1), &"tok1").await.unwrap(), StatusOutcome::Admitted("tok1".into()));
        assert!(matches!(s.claim_token(t(), UserId(2), "B", 300).await.unwrap(), TokenClaim::Claimed { .. }));
        assert!(eventually(async || s.forget_if_expired(t()).await.unwrap()).await, "never forgotten");
        assert!(s.try_lock_admission(t(), "a", 60_000).await.unwrap());
        assert_eq!(s.enter(t(), UserId(1), &"other").await.unwrap(), EnterOutcome::Admitted("tok1".into()));
        assert_eq!(s.claim_token(t(), UserId(2), "B", 300).await.unwrap(), TokenClaim::AlreadyUsed);
        assert!(s.token_used(t(), UserId(2), "B").await.unwrap());
        assert_eq!(s.snapshot(t()).await.unwrap().batch_override, Some(3));
        assert!(s.forget_if_expired(t()).await.unwrap(), "tokens do not keep the queue");
        assert!(!s.try_lock_admission(t(), "b", 60_000).await.unwrap(), "the lock outlives the queue");
    })
    .await;
}

#[tokio::test]
async fn the_capacity_in_force_is_known_once_published_and_expires_with_the_target() {
    with_both_configured(short_key_ttl, async |s, _| {
        assert_eq!(s.snapshot(t()).await.unwrap().capacity, None, "no instance published one");
        s.publish_capacity(t()).await.unwrap();
        assert_eq!(s.snapshot(t()).await.unwrap().capacity, Some(5));
        assert!(eventually(async || s.snapshot(t()).await.unwrap().capacity.is_none()).await, "never expired");
    })
    .await;
}

/// The claim/release cycle around one purchase, with the token the queue issued.
#[tokio::test]
async fn a_claimed_queue_token_is_still_the_users_and_a_release_restores_it() {
    with_both(async |s, tick_ms| {
        let u = UserId(1);
        s.enter(t(), u, &"tok").await.unwrap();
        next_tick(tick_ms).await;
        s.admit(t(), 1, tick_ms).await.unwrap();
        assert_eq!(s.status(t(), u, &"tok").await.unwrap(), StatusOutcome::Admitted("tok".into()));
        assert!(!s.token_used(t(), u, "tok").await.unwrap());
        let claim = s.claim_token(t(), u, "tok", 300).await.unwrap();
        assert_eq!(claim, TokenClaim::Claimed { previous: Some("tok".into()) });
        assert!(s.token_used(t(), u, "tok").await.unwrap());
        assert_eq!(s.status(t(), u, &"x").await.unwrap(), StatusOutcome::Admitted("tok".into()), "used, still theirs");
        assert_eq!(s.enter(t(), u, &"x").await.unwrap(), EnterOutcome::Admitted("tok".into()));
        s.release_token(t(), u, "tok", Some("tok".into())).await.unwrap();
        assert!(!s.token_used(t(), u, "tok").await.unwrap());
        assert_eq!(s.status(t(), u, &"x").await.unwrap(), StatusOutcome::Admitted("tok".into()));
        assert_eq!(
            s.claim_token(t(), u, "tok", 300).await.unwrap(),
            TokenClaim::Claimed { previous: Some("tok".into()) }
        );
        // A stateless token (no stored one): released, nothing is left behind.
        let claim = s.claim_token(t(), UserId(2), "direct", 300).await.unwrap();
        assert_eq!(claim, TokenClaim::Claimed { previous: None });
        s.release_token(t(), UserId(2), "direct", None).await.unwrap();
        assert!(!s.token_used(t(), UserId(2), "direct").await.unwrap());
        assert_eq!(s.status(t(), UserId(2), &"x").await.unwrap(), StatusOutcome::NotInQueue);
        s.confirm_token_used(t(), true).await.unwrap();
        s.confirm_token_used(t(), true).await.unwrap();
        s.confirm_token_used(t(), false).await.unwrap();
        let snap = s.snapshot(t()).await.unwrap();
        assert_eq!((snap.tokens_issued, snap.tokens_used, snap.direct_tokens_used), (1, 2, 1));
    })
    .await;
}

#[tokio::test]
async fn a_used_mark_lives_as_long_as_its_token() {
    with_both(async |s, _| {
        let u = UserId(3);
        assert!(matches!(s.claim_token(t(), u, "short", 1).await.unwrap(), TokenClaim::Claimed { .. }));
        assert_eq!(s.claim_token(t(), u, "short", 1).await.unwrap(), TokenClaim::AlreadyUsed);
        assert!(eventually(async || !s.token_used(t(), u, "short").await.unwrap()).await, "the mark never expired");
        assert!(matches!(s.claim_token(t(), u, "short", 1).await.unwrap(), TokenClaim::Claimed { .. }));
    })
    .await;
}

/// The gate's pacing: a tick holds one batch of purchases, the next ones wait for a later
/// tick up to `ahead` ticks, then there is no room.
#[tokio::test]
async fn pace_purchase_fills_the_current_tick_then_the_next_then_refuses() {
    with_both(async |s, _| {
        let tick_ms = 1000;
        next_tick(tick_ms).await;
        for _ in 0..2 {
            let slot = s.pace_purchase(t(), 2, tick_ms, 1).await.unwrap().expect("room now");
            assert_eq!(slot.starts_in_ms, 0, "{slot:?}");
            assert!(slot.ends_in_ms > 0 && slot.ends_in_ms <= tick_ms, "{slot:?}");
        }
        for _ in 0..2 {
            let slot = s.pace_purchase(t(), 2, tick_ms, 1).await.unwrap().expect("room next tick");
            assert!(slot.starts_in_ms > 0 && slot.starts_in_ms <= tick_ms, "{slot:?}");
            assert_eq!(slot.ends_in_ms - slot.starts_in_ms, tick_ms, "{slot:?}");
        }
        assert_eq!(s.pace_purchase(t(), 2, tick_ms, 1).await.unwrap(), None, "both ticks full");
        // The target's runtime batch size is its budget.
        let other: QueueTarget = "ticketing-event:7".parse().unwrap();
        s.set_batch_size(Some(other), Some(1)).await.unwrap();
        assert!(s.pace_purchase(other, 100, tick_ms, 0).await.unwrap().is_some());
        assert_eq!(s.pace_purchase(other, 100, tick_ms, 0).await.unwrap(), None);
    })
    .await;
}

#[tokio::test]
async fn flag_acknowledgements_are_listed_by_instance_until_they_expire() {
    with_both(async |s, _| {
        let ack = |instance: &str, version, ms: u64| FlagAck {
            instance: instance.into(),
            version,
            applied_at_ms: ms,
            kept_missing: instance == "b",
            state: "on 40%: a:b".into(),
        };
        assert!(s.flag_acks().await.unwrap().is_empty());
        // (Redis expires the whole hash with the last acknowledgement written, so the longer
        // lived one goes last; instances all write with one lifetime.)
        s.ack_flag(ack("a", 3, 1), 300).await.unwrap();
        s.ack_flag(ack("b", 41, 2), 60_000).await.unwrap();
        let acks = s.flag_acks().await.unwrap();
        assert_eq!(acks.len(), 2);
        assert_eq!(acks[0], FlagAck { state: "on 40%  a b".into(), ..ack("a", 3, 1) }, "':' cannot be stored");
        assert_eq!(acks[1], FlagAck { state: "on 40%  a b".into(), ..ack("b", 41, 2) });
        assert!(eventually(async || s.flag_acks().await.unwrap().len() == 1).await, "a's never expired");
        assert_eq!(s.flag_acks().await.unwrap()[0].instance, "b");
        s.ack_flag(ack("b", 42, 3), 60_000).await.unwrap();
        assert_eq!(s.flag_acks().await.unwrap()[0].version, 42, "one acknowledgement per instance");
        assert_eq!(s.write_flag(vec![("enabled".into(), "1".into())], vec![]).await.unwrap(), 43, "above every ack");
    })
    .await;
}

#[tokio::test]
async fn batch_sizes_are_set_and_cleared_globally_and_per_target() {
    with_both(async |s, tick_ms| {
        assert_eq!(s.global_batch_size().await.unwrap(), None);
        s.set_batch_size(None, Some(7)).await.unwrap();
        assert_eq!(s.global_batch_size().await.unwrap(), Some(7));
        s.set_batch_size(None, None).await.unwrap();
        assert_eq!(s.global_batch_size().await.unwrap(), None);
        s.set_batch_size(Some(t()), Some(2)).await.unwrap();
        match s.enter(t(), UserId(1), &"tok").await.unwrap() {
            EnterOutcome::Waiting(w) => assert_eq!(w.batch_override, Some(2)),
            o => panic!("{o:?}"),
        }
        assert_eq!(s.snapshot(t()).await.unwrap().batch_override, Some(2));
        s.set_batch_size(Some(t()), None).await.unwrap();
        match s.status(t(), UserId(1), &"tok").await.unwrap() {
            StatusOutcome::Waiting(w) => assert_eq!(w.batch_override, None),
            o => panic!("{o:?}"),
        }
        next_tick(tick_ms).await;
        let a = s.admit(t(), 4, tick_ms).await.unwrap();
        assert_eq!((a.batch, a.admitted), (4, 1));
        let snap = s.snapshot(t()).await.unwrap();
        assert_eq!((snap.batch_override, snap.admissions.first().copied()), (None, Some((a.tick, 1))));
    })
    .await;
}

/// A stored token that expired no longer admits: its user enters again at the back.
#[tokio::test]
async fn a_user_whose_token_expired_enters_again_at_the_back() {
    with_both_configured(
        |s| s.token.ttl_s = 1,
        async |s, tick_ms| {
            s.enter(t(), UserId(1), &"tok").await.unwrap();
            s.enter(t(), UserId(2), &"tok").await.unwrap();
            next_tick(tick_ms).await;
            s.admit(t(), 1, tick_ms).await.unwrap();
            assert_eq!(s.status(t(), UserId(1), &"tok1").await.unwrap(), StatusOutcome::Admitted("tok1".into()));
            let expired =
                eventually(async || s.status(t(), UserId(1), &"x").await.unwrap() == StatusOutcome::NotInQueue);
            assert!(expired.await, "the token never expired");
            match s.enter(t(), UserId(1), &"tok").await.unwrap() {
                EnterOutcome::Waiting(w) => assert_eq!((w.seq, w.ahead), (3, 1), "behind user 2"),
                o => panic!("{o:?}"),
            }
        },
    )
    .await;
}

/// Admitted users who never poll again are evicted like waiting ones, and get no token.
#[tokio::test]
async fn an_admitted_user_who_stops_polling_is_evicted_without_a_token() {
    with_both(async |s, tick_ms| {
        s.enter(t(), UserId(1), &"tok").await.unwrap();
        s.enter(t(), UserId(2), &"tok").await.unwrap();
        next_tick(tick_ms).await;
        assert_eq!(s.admit(t(), 1, tick_ms).await.unwrap().mark, 1);
        tokio::time::sleep(Duration::from_millis(300)).await;
        s.status(t(), UserId(2), &"tok").await.unwrap();
        assert_eq!(s.evict(t(), 200, 10).await.unwrap(), 1);
        assert_eq!(s.status(t(), UserId(1), &"tok").await.unwrap(), StatusOutcome::NotInQueue);
        let snap = s.snapshot(t()).await.unwrap();
        assert_eq!((snap.evicted, snap.tokens_issued, snap.waiting, snap.admitted_total), (1, 0, 1, 1));
    })
    .await;
}

/// The wait histogram is bucketed as `domain::wait_bucket` says, in both stores.
#[tokio::test]
async fn waits_are_bucketed_by_the_domain_rule() {
    with_both(async |s, tick_ms| {
        s.enter(t(), UserId(1), &"tok").await.unwrap();
        tokio::time::sleep(Duration::from_millis(1100)).await;
        next_tick(tick_ms).await;
        assert_eq!(s.admit(t(), 1, tick_ms).await.unwrap().admitted, 1);
        let waits = s.snapshot(t()).await.unwrap().waits;
        assert_eq!(waits.count, 1);
        assert!(waits.sum_ms >= 1100, "{waits:?}");
        let bucket = vq::domain::wait_bucket(waits.sum_ms / 1000);
        assert_eq!(waits.buckets, std::collections::BTreeMap::from([(bucket, 1)]), "{waits:?}");
    })
    .await;
}
