//! One target spread over three shards (`targets.types.*.shards = 3`), on one redis-server and
//! on a real 3-primary Redis Cluster: the shards' keys on three nodes, at most the batch per
//! tick in all with two pumps racing, one place and one token per user whichever instance
//! they come through, the cap across shards, the opening order verifiable from the one
//! published seed, pause / resume / close / clear on every shard, and the figures of every
//! shard in the stats and the record. The embedded store keeps a sharded type in one shard.

use std::collections::{BTreeMap, HashMap, HashSet};

use redis::FromRedisValue;
use sha2::{Digest, Sha256};
use vq::config::Settings;
use vq::domain::{
    AnswerClass, QueueTarget, QueueTargetType, SaleControl, SaleSchedule, UserId, hex, opening_order, shard_tag,
    tag_slot, user_shard,
};
use vq::pump::Pump;
use vq::store::prelude::*;
use vq::store::{AnyStore, ClearOutcome, EnterOutcome, RecordedPurchase, ScheduleOutcome, StatusOutcome};

use crate::support::{RedisCluster, RedisServer, cluster_settings, next_tick, open_store, test_settings, tick_room};
use vq::domain::{Ms, Users};

const SHARDS: u8 = 3;

fn target() -> QueueTarget {
    "LIMITED_DROP:7".parse().unwrap()
}

/// The key prefix of shard `s` of the target.
fn prefix(s: u8) -> String {
    format!("queue:{{{}}}:", shard_tag("LIMITED_DROP:7", s, SHARDS))
}

fn user(u: u64) -> UserId {
    format!("buyer-{u}").parse().unwrap()
}

fn shard_of(u: u64) -> u8 {
    user_shard(user(u).as_str(), SHARDS)
}

/// Where the test runs: one redis-server or a 3-primary cluster.
enum Redis {
    Server(RedisServer),
    Cluster(RedisCluster),
}

impl Redis {
    fn server() -> Self {
        Redis::Server(RedisServer::spawn())
    }

    fn cluster() -> Self {
        Redis::Cluster(RedisCluster::spawn())
    }

    /// Test settings with limited-drop spread over [`SHARDS`] shards.
    fn settings(&self) -> Settings {
        let mut s = match self {
            Redis::Server(r) => test_settings(Some(r)),
            Redis::Cluster(c) => cluster_settings(c),
        };
        s.redis.timeout_ms = 5000;
        shard_type(&mut s);
        s
    }

    async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        match self {
            Redis::Server(r) => cmd.query_async(&mut r.conn().await).await.unwrap(),
            Redis::Cluster(c) => cmd.query_async(&mut c.conn().await).await.unwrap(),
        }
    }

    async fn zscore(&self, key: &str, member: &str) -> Option<u64> {
        self.query::<Option<f64>>(redis::cmd("ZSCORE").arg(key).arg(member)).await.map(|s| s as u64)
    }

    async fn hget(&self, key: &str, field: &str) -> Option<String> {
        self.query(redis::cmd("HGET").arg(key).arg(field)).await
    }
}

fn shard_type(s: &mut Settings) {
    let t = s.targets.types.iter_mut().find(|t| t.slug == "limited-drop").expect("shipped type");
    t.shards = Some(u64::from(SHARDS));
}

/// Enters each user (and lists the target in `queue:active` for the pump, as the service does).
async fn enter_all(store: &AnyStore, users: impl IntoIterator<Item = u64>) -> Vec<(u64, EnterOutcome)> {
    store.register_active(target()).await.unwrap();
    let mut out = Vec::new();
    for u in users {
        out.push((u, store.enter(target(), user(u), &"tok").await.unwrap()));
    }
    out
}

/// Users admitted per tick, added up over the shards' own `admissions` lists.
async fn admitted_per_tick(redis: &Redis) -> BTreeMap<u64, u64> {
    let mut per_tick = BTreeMap::new();
    for s in 0..SHARDS {
        let rows: Vec<String> =
            redis.query(redis::cmd("LRANGE").arg(format!("{}admissions", prefix(s))).arg(0).arg(-1)).await;
        for r in rows {
            let (t, n) = r.split_once(':').unwrap();
            *per_tick.entry(t.parse::<u64>().unwrap()).or_default() += n.parse::<u64>().unwrap();
        }
    }
    per_tick
}

#[test]
fn the_shards_tags_fall_in_three_slot_ranges() {
    let ranges: HashSet<u16> =
        (0..SHARDS).map(|s| tag_slot(&shard_tag("LIMITED_DROP:7", s, SHARDS)) * 3 / 16384).collect();
    assert_eq!(ranges.len(), 3);
    assert_eq!(prefix(0), "queue:{LIMITED_DROP:7}:", "shard 0 keeps the target's own tag");
}

#[tokio::test]
async fn on_a_cluster_the_three_shards_keys_live_on_three_nodes_and_each_user_in_one_shard() {
    let redis = Redis::cluster();
    let s = redis.settings();
    let store = open_store(&s);
    for (u, o) in enter_all(&store, 1..=30).await {
        assert!(matches!(o, EnterOutcome::Waiting(_)), "user {u}: {o:?}");
    }
    let Redis::Cluster(cluster) = &redis else { unreachable!() };
    let mut nodes = HashSet::new();
    let mut seqs = 0;
    for s in 0..SHARDS {
        nodes.insert(cluster.node_of(&format!("{}seq", prefix(s))).await);
        let seq: Option<u64> = redis.query(redis::cmd("GET").arg(format!("{}seq", prefix(s)))).await;
        seqs += seq.unwrap_or(0);
    }
    assert_eq!(nodes.len(), 3, "one shard per primary");
    assert_eq!(seqs, 30, "every user given one seq, in one shard");
    for u in 1..=30 {
        for s in 0..SHARDS {
            let held = redis.zscore(&format!("{}waiting", prefix(s)), user(u).as_str()).await.is_some();
            assert_eq!(held, s == shard_of(u), "user {u} in shard {s}");
        }
    }
}

/// Two pumps that both believe they hold the lock, every tick: never more than the batch in
/// all, counted by the shards themselves.
async fn two_pumps_admit_at_most_the_batch_per_tick(redis: Redis) {
    let s = redis.settings();
    let (a, b) = (open_store(&s), open_store(&s));
    enter_all(&a, 1..=90).await;
    let batch = s.queue.batch_size;
    let mut admitted = 0;
    for _ in 0..4 {
        next_tick(s.queue.tick_ms).await;
        tick_room(s.queue.tick_ms, 200).await;
        let (x, y) = tokio::join!(
            a.admit_by(target(), Users(batch), Ms(s.queue.tick_ms), "a"),
            b.admit_by(target(), Users(batch), Ms(s.queue.tick_ms), "b")
        );
        admitted += x.unwrap().admitted + y.unwrap().admitted;
    }
    for s in 0..SHARDS {
        let rows: Vec<String> =
            redis.query(redis::cmd("LRANGE").arg(format!("{}admissions", prefix(s))).arg(0).arg(-1)).await;
        assert!(rows.iter().any(|r| !r.ends_with(":0")), "shard {s} admitted its share: {rows:?}");
    }
    let per_tick = admitted_per_tick(&redis).await;
    assert!(per_tick.values().all(|n| *n <= batch), "at most {batch} a tick across the shards: {per_tick:?}");
    assert_eq!(per_tick.values().sum::<u64>(), admitted);
    assert!(per_tick.values().any(|n| *n == batch), "a full batch admitted in some tick: {per_tick:?}");
    let snap = a.snapshot(target()).await.unwrap();
    assert_eq!(snap.admitted_total, admitted, "the stats count every shard");
    assert_eq!(snap.waiting, 90 - admitted);
}

#[tokio::test]
async fn two_pumps_never_admit_more_than_the_batch_per_tick_across_shards() {
    two_pumps_admit_at_most_the_batch_per_tick(Redis::server()).await;
}

#[tokio::test]
async fn on_a_cluster_two_pumps_never_admit_more_than_the_batch_per_tick_across_shards() {
    two_pumps_admit_at_most_the_batch_per_tick(Redis::cluster()).await;
}

/// A user re-entering through another instance finds their place; once admitted, one token
/// whichever instance asks.
async fn one_place_and_one_token_per_user(redis: Redis) {
    let s = redis.settings();
    let (a, b) = (open_store(&s), open_store(&s));
    let first = enter_all(&a, 1..=12).await;
    let again = enter_all(&b, 1..=12).await;
    let mut positions = HashSet::new();
    for ((u, x), (_, y)) in first.iter().zip(&again) {
        let (EnterOutcome::Waiting(x), EnterOutcome::Waiting(y)) = (x, y) else { panic!("user {u}: {x:?} {y:?}") };
        assert_eq!(x.seq, y.seq, "user {u} keeps their place");
        assert!(positions.insert(x.seq), "user {u}: no position given twice");
    }
    next_tick(s.queue.tick_ms).await;
    let admit = a.admit_by(target(), Users(20), Ms(s.queue.tick_ms), "a").await.unwrap();
    assert_eq!(admit.admitted, 12);
    for u in 1..=12 {
        let StatusOutcome::Admitted(t) = a.status(target(), user(u), &"token-a").await.unwrap() else { panic!() };
        assert_eq!(t, "token-a");
        let EnterOutcome::Admitted(t) = b.enter(target(), user(u), &"token-b").await.unwrap() else { panic!() };
        assert_eq!(t, "token-a", "user {u}: one token");
        for s in 0..SHARDS {
            let key = format!("{}token:{}", prefix(s), user(u));
            let held: Option<String> = redis.query(redis::cmd("GET").arg(&key)).await;
            assert_eq!(held.is_some(), s == shard_of(u), "user {u}'s token only in their shard");
        }
    }
    // Their purchases, settled at once (those of a shard share a MULTI): each token's use
    // counted in the user's shard, each purchase in the whole target's record (settled with the
    // token's use or, across shards, on its own).
    let recorded = RecordedPurchase { tick: 5, answer: AnswerClass::Success };
    let settles: Vec<_> = (1..=12)
        .map(|u| {
            let a = a.clone();
            tokio::spawn(async move { a.confirm_token_used(target(), user(u), true, Some(recorded)).await })
        })
        .collect();
    for settle in settles {
        settle.await.expect("settle task").unwrap();
    }
    let r = a.target_record(target()).await.unwrap().expect("a record");
    assert_eq!(r.tokens_used, 12);
    assert_eq!(r.purchases[&5].get(AnswerClass::Success), 12, "{:?}", r.purchases);
}

#[tokio::test]
async fn a_user_has_one_place_and_one_token_across_instances_and_shards() {
    one_place_and_one_token_per_user(Redis::server()).await;
}

#[tokio::test]
async fn on_a_cluster_a_user_has_one_place_and_one_token_across_instances_and_shards() {
    one_place_and_one_token_per_user(Redis::cluster()).await;
}

#[tokio::test]
async fn the_cap_is_split_across_the_shards_and_adds_up_to_the_types() {
    let redis = Redis::server();
    let mut s = redis.settings();
    s.targets.types.iter_mut().find(|t| t.slug == "limited-drop").unwrap().max_capacity = Some(10);
    let store = open_store(&s);
    let outcomes = enter_all(&store, 1..=60).await;
    let mut per_shard: HashMap<u8, u64> = HashMap::new();
    for (u, o) in &outcomes {
        if matches!(o, EnterOutcome::Waiting(_)) {
            *per_shard.entry(shard_of(*u)).or_default() += 1;
        }
    }
    // Caps 4, 3, 3: each shard holds 20 users or so, so each fills.
    assert_eq!(per_shard, HashMap::from([(0, 4), (1, 3), (2, 3)]), "{outcomes:?}");
    assert_eq!(outcomes.iter().filter(|(_, o)| matches!(o, EnterOutcome::Full)).count(), 50);
    store.publish_capacity(target()).await.unwrap();
    assert_eq!(store.snapshot(target()).await.unwrap().capacity, Some(10));
}

/// A pre-queue over three shards, opened: each shard places its users in the order of the
/// one seed, whose commitment was published, so the whole order restricted to a shard is
/// that shard's order.
async fn the_opening_order_is_verifiable_from_the_one_seed(redis: Redis) {
    let s = redis.settings();
    let store = open_store(&s);
    let now = vq::service::now_epoch_ms();
    let schedule = SaleSchedule { opens_at_ms: now + 1500, prequeue_from_ms: Some(now - 1000), closes_at_ms: None };
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).unwrap();
    let ScheduleOutcome::Scheduled { commitment } = store.schedule_sale(target(), schedule, seed).await.unwrap() else {
        panic!("not scheduled")
    };
    let users: Vec<u64> = (1..=45).collect();
    for (u, o) in enter_all(&store, users.clone()).await {
        assert!(matches!(o, EnterOutcome::PreQueue(_)), "user {u}: {o:?}");
    }
    let wait = schedule.opens_at_ms.saturating_sub(vq::service::now_epoch_ms()) + 10;
    tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
    next_tick(s.queue.tick_ms).await;
    Pump::new(store.clone(), std::sync::Arc::new(s.clone()), "p".into()).tick().await.unwrap();

    let ledger = store.sale_ledger(target()).await.unwrap();
    let opening = ledger.iter().find_map(|r| match r {
        vq::domain::LedgerEntry::Opening { prequeued, .. } => Some(*prequeued),
        _ => None,
    });
    assert_eq!(opening, Some(45), "one opening row for every shard: {ledger:?}");
    let sale = store.read_sale(target()).await.unwrap().expect("the sale").record;
    assert_eq!(sale.prequeued, Some(45), "the users frozen in every shard");
    assert!(sale.opened_at_ms.is_some(), "every shard's order written");
    let published = redis.hget(&format!("{}sale", prefix(0)), "seed").await.expect("seed revealed");
    assert_eq!(hex(&Sha256::digest(vq::domain::unhex(&published).unwrap())), commitment);
    assert_eq!(published, hex(&seed));
    let seed = vq::domain::unhex(&published).unwrap();
    let all: Vec<UserId> = users.iter().map(|u| user(*u)).collect();
    let whole = opening_order(&seed, &all);
    for s in 0..SHARDS {
        assert_eq!(redis.hget(&format!("{}sale", prefix(s)), "seed").await, Some(published.clone()), "shard {s}");
        let mut placed = Vec::new();
        for u in &all {
            if let Some(seq) = redis.zscore(&format!("{}waiting", prefix(s)), u.as_str()).await {
                placed.push((seq, u.clone()));
            }
        }
        placed.sort();
        let placed: Vec<UserId> = placed.into_iter().map(|(_, u)| u).collect();
        let expected: Vec<UserId> = whole.iter().filter(|u| user_shard(u.as_str(), SHARDS) == s).cloned().collect();
        assert_eq!(placed, expected, "shard {s} in the seed's order");
    }
}

#[tokio::test]
async fn the_opening_order_across_shards_is_verifiable_from_the_published_seed() {
    the_opening_order_is_verifiable_from_the_one_seed(Redis::server()).await;
}

#[tokio::test]
async fn on_a_cluster_the_opening_order_across_shards_is_verifiable_from_the_published_seed() {
    the_opening_order_is_verifiable_from_the_one_seed(Redis::cluster()).await;
}

/// Pause, resume, close and clear reach every shard.
async fn the_sale_controls_reach_every_shard(redis: Redis) {
    let s = redis.settings();
    let store = open_store(&s);
    let now = vq::service::now_epoch_ms();
    let schedule = SaleSchedule { opens_at_ms: now - 1000, prequeue_from_ms: None, closes_at_ms: None };
    assert!(matches!(
        store.schedule_sale(target(), schedule, [7; 32]).await.unwrap(),
        ScheduleOutcome::Scheduled { .. }
    ));
    enter_all(&store, 1..=30).await;
    let pump = Pump::new(store.clone(), std::sync::Arc::new(s.clone()), "p".into());

    assert!(store.control_sale(target(), SaleControl::Pause).await.unwrap());
    for s in 0..SHARDS {
        assert!(redis.hget(&format!("{}sale", prefix(s)), "paused").await.is_some(), "shard {s} paused");
    }
    next_tick(s.queue.tick_ms).await;
    pump.tick().await.unwrap();
    assert_eq!(store.snapshot(target()).await.unwrap().admitted_total, 0, "paused: nobody admitted on any shard");

    assert!(store.control_sale(target(), SaleControl::Resume).await.unwrap());
    next_tick(s.queue.tick_ms).await;
    pump.tick().await.unwrap();
    let admitted = store.snapshot(target()).await.unwrap().admitted_total;
    assert!(admitted > 0 && admitted <= s.queue.batch_size, "resumed: one batch at most ({admitted})");

    let close = SaleControl::Close { message: "sold out".into(), source: vq::domain::SaleSource::Command };
    assert!(store.control_sale(target(), close).await.unwrap());
    // A newcomer of each shard is told the sale is closed.
    let mut told = HashSet::new();
    for u in 100..200 {
        if told.insert(shard_of(u)) {
            let o = store.enter(target(), user(u), &"t").await.unwrap();
            assert!(matches!(o, EnterOutcome::Closed(_)), "shard {}: {o:?}", shard_of(u));
        }
    }
    assert_eq!(told.len(), 3);
    assert_eq!(store.clear_sale(target(), true).await.unwrap(), ClearOutcome::Cleared);
    for s in 0..SHARDS {
        assert_eq!(redis.hget(&format!("{}sale", prefix(s)), "opens_at").await, None, "shard {s} cleared");
    }
    // The record adds up every shard's arrivals.
    let record = store.target_record(target()).await.unwrap().expect("a record");
    assert_eq!(record.arrivals.values().sum::<u64>(), 30);
    assert_eq!(record.admitted, admitted);
    let ledger = store.sale_ledger(target()).await.unwrap();
    assert_eq!(vq::domain::ledger_admitted(&ledger), admitted, "the ledger's admissions of every shard: {ledger:?}");
}

#[tokio::test]
async fn pause_resume_close_and_clear_reach_every_shard() {
    the_sale_controls_reach_every_shard(Redis::server()).await;
}

#[tokio::test]
async fn on_a_cluster_pause_resume_close_and_clear_reach_every_shard() {
    the_sale_controls_reach_every_shard(Redis::cluster()).await;
}

/// The event log is the whole target's, on shard 0: the sale's changes once (the other
/// shards keep no log), and the admission milestones counted over every shard — the first
/// admission, each multiple of `events.admitted_every` passed by the target's total, and the
/// line gone once the shards together hold less than a batch.
async fn the_event_log_is_the_whole_targets(redis: Redis) {
    let mut s = redis.settings();
    s.events.admitted_every = 20;
    let store = open_store(&s);
    // An always-open target paused and resumed: the sale's changes.
    assert!(store.control_sale(target(), SaleControl::Pause).await.unwrap());
    assert!(store.control_sale(target(), SaleControl::Resume).await.unwrap());
    enter_all(&store, 1..=45).await;
    let batch = s.queue.batch_size;
    assert_eq!(batch, 10);
    let mut per_tick = Vec::new();
    for _ in 0..6 {
        next_tick(s.queue.tick_ms).await;
        tick_room(s.queue.tick_ms, 200).await;
        per_tick.push(store.admit_by(target(), Users(batch), Ms(s.queue.tick_ms), "p").await.unwrap().admitted);
    }
    assert_eq!(per_tick, [10, 10, 10, 10, 5, 0], "a full batch a tick across the shards");

    let events =
        store.read_events(vq::domain::EventLog::Target(target()), vq::domain::EventId::ZERO, 1000).await.unwrap();
    let kinds: Vec<String> = events.iter().map(|e| format!("{:?}", e.kind)).collect();
    use vq::domain::EventKind as K;
    let count = |f: &dyn Fn(&K) -> bool| events.iter().filter(|e| f(&e.kind)).count();
    assert_eq!(count(&|k| matches!(k, K::SalePaused { .. })), 1, "{kinds:#?}");
    assert_eq!(count(&|k| matches!(k, K::SaleResumed { .. })), 1, "{kinds:#?}");
    let firsts: Vec<u64> = events
        .iter()
        .filter_map(|e| if let K::FirstAdmission { admitted } = e.kind { Some(admitted) } else { None })
        .collect();
    assert_eq!(firsts, [10], "the target's first admission, its whole batch: {kinds:#?}");
    let milestones: Vec<u64> = events
        .iter()
        .filter_map(|e| if let K::AdmissionMilestone { admitted } = e.kind { Some(admitted) } else { None })
        .collect();
    assert_eq!(milestones, [20, 40], "the target's total passing 20 and 40: {kinds:#?}");
    let emptied: Vec<u64> =
        events.iter().filter_map(|e| if let K::QueueEmptied { mark } = e.kind { Some(mark) } else { None }).collect();
    assert_eq!(emptied.len(), 1, "the line gone once, in the tick that admitted 5: {kinds:#?}");
    for sh in 1..SHARDS {
        let exists: u64 = redis.query(redis::cmd("EXISTS").arg(format!("{}events", prefix(sh)))).await;
        assert_eq!(exists, 0, "shard {sh} keeps no event log of its own");
    }
}

#[tokio::test]
async fn the_event_log_holds_the_whole_targets_sale_changes_and_milestones() {
    the_event_log_is_the_whole_targets(Redis::server()).await;
}

#[tokio::test]
async fn on_a_cluster_the_event_log_holds_the_whole_targets_sale_changes_and_milestones() {
    the_event_log_is_the_whole_targets(Redis::cluster()).await;
}

/// The adaptive outflow's no-show counters are the whole target's: tokens used and expired on
/// every shard (shard 0 alone would show a third of them, and another shard's no-shows none).
#[tokio::test]
async fn the_adaptive_outflow_counts_the_tokens_ended_on_every_shard() {
    let redis = Redis::server();
    let store = open_store(&redis.settings());
    for (sh, used, expired) in [(0u8, 4u64, 1u64), (1, 0, 7), (2, 5, 2)] {
        let _: () = redis
            .query(
                redis::cmd("HSET")
                    .arg(format!("{}waits", prefix(sh)))
                    .arg("tokens_used")
                    .arg(used)
                    .arg("tokens_expired")
                    .arg(expired),
            )
            .await;
    }
    let interval = store.now_ms() / 600 + 5;
    match store.claim_outflow(target(), interval).await.unwrap() {
        vq::store::OutflowClaim::Decide { counters, .. } => {
            assert_eq!((counters.used, counters.expired), (9, 10), "every shard's tokens")
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn the_embedded_store_keeps_a_sharded_type_in_one_shard() {
    let mut s = test_settings(None);
    shard_type(&mut s);
    let store = open_store(&s);
    assert_eq!(store.parts(target()), vec![target()]);
    for (i, (u, o)) in enter_all(&store, 1..=20).await.into_iter().enumerate() {
        let EnterOutcome::Waiting(w) = o else { panic!("user {u}: {o:?}") };
        assert_eq!(w.seq, i as u64 + 1, "one line, numbered 1, 2, 3 …");
    }
    let admit = store.admit_by(target(), Users(10), Ms(s.queue.tick_ms), "p").await.unwrap();
    assert_eq!(admit.admitted, 10);
    assert_eq!(QueueTargetType::LIMITED_DROP, target().kind);
}

/// Polls answered from the instance's copy of each shard: a waiting user far back is told the
/// position their enter gave (the whole target's numbers) without a script call, and after a
/// tick admitted on copies one tick old every admitted user learns it at their first poll.
#[tokio::test]
async fn polls_answered_from_each_shards_copy_keep_positions_and_miss_no_admission() {
    let redis = Redis::server();
    let Redis::Server(server) = &redis else { unreachable!() };
    crate::support::flag_on_before_start(server).await;
    let mut s = redis.settings();
    s.queue.tick_ms = 10_000;
    s.queue.batch_size = 30;
    let s = std::sync::Arc::new(s);
    let store = open_store(&s);
    let service = vq::service::QueueService::new(store.clone(), crate::support::secret(), s.clone());
    service.refresh_flag().await.unwrap();
    let mut positions = HashMap::new();
    for u in 1..=400 {
        match service.enter(target(), &user(u)).await.unwrap() {
            vq::service::QueueStatus::Waiting { position, .. } => positions.insert(u, position),
            other => panic!("user {u}: {other:?}"),
        };
    }
    let distinct: HashSet<u64> = positions.values().copied().collect();
    assert_eq!(distinct.len(), 400, "no position given twice");
    service.sync_local_views().await;
    let _: () = redis.query(redis::cmd("CONFIG").arg("RESETSTAT")).await;
    for u in 1..=400 {
        match service.status(target(), &user(u)).await.unwrap() {
            vq::service::QueueStatus::Waiting { position, .. } => assert_eq!(position, positions[&u], "user {u}"),
            other => panic!("user {u}: {other:?}"),
        }
    }
    let stats: String = redis.query(redis::cmd("INFO").arg("commandstats")).await;
    let calls: u64 = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_fcall:calls="))
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    // Within two batches (60) of each shard's mark, about 180 users ask Redis; the rest not.
    assert!(calls < 250, "{calls} of 400 polls asked Redis");
    // One tick admits 30 across the shards; the copies are a tick old.
    let admit = store.admit_by(target(), Users(30), Ms(s.queue.tick_ms), "p").await.unwrap();
    assert_eq!(admit.admitted, 30);
    let mut told = 0;
    for u in 1..=400 {
        let shard = shard_of(u);
        let mark: u64 = redis.query(redis::cmd("GET").arg(format!("{}admitted_count", prefix(shard)))).await;
        let seq = redis.zscore(&format!("{}waiting", prefix(shard)), user(u).as_str()).await.unwrap();
        match service.status(target(), &user(u)).await.unwrap() {
            vq::service::QueueStatus::Admitted(_) => {
                assert!(seq <= mark, "user {u}");
                told += 1;
            }
            vq::service::QueueStatus::Waiting { .. } => assert!(seq > mark, "user {u} admitted but told waiting"),
            other => panic!("user {u}: {other:?}"),
        }
    }
    assert_eq!(told, 30);
}

/// `vq sale` reaches every shard only with the fleet's shard count: a command run with another
/// `shards` than the serving instances' is refused, and says why.
#[tokio::test]
async fn operator_commands_refuse_to_run_with_another_shard_count_than_the_fleets() {
    let redis = RedisServer::spawn();
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("vq.toml");
    std::fs::write(
        &conf,
        "[[targets.types]]\nslug = \"limited-drop\"\nshards = 3\n\n[[targets.types]]\nslug = \"ticketing-event\"\n",
    )
    .unwrap();
    let conf = conf.to_str().unwrap();
    let _serving = crate::support::VqProcess::serve_args(&redis, &["--config", conf], &[]).await;
    let run_cmd = |with_conf: bool, args: &[&str]| {
        let mut c = crate::support::vq_command();
        c.args(args);
        if with_conf {
            c.args(["--config", conf]);
        }
        c.env("VQ_REDIS__URL", redis.url()).env("VQ_TARGETS__RANGES", crate::support::test_ranges_env());
        c.output().unwrap()
    };
    let run = |with_conf: bool| run_cmd(with_conf, &["sale", "pause", "limited-drop:7"]);
    // The instance's report reaches Redis within its 2-s round.
    crate::support::wait_until(std::time::Duration::from_secs(10), "the fleet report", async || {
        let o = run(false);
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("shards")
    })
    .await;
    let refused = run(false);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("over 3 shards on the serving instance") && err.contains("over 1 here"), "{err}");
    let ok = run(true);
    assert!(!String::from_utf8_lossy(&ok.stderr).contains("shards"), "{}", String::from_utf8_lossy(&ok.stderr));
    // The other commands that read or change a target's shards: stats (which would show one
    // shard's figures as the target's) and a target's pinned batch.
    for args in [&["stats", "--target", "limited-drop:7"][..], &["batch", "set", "7", "--target", "limited-drop:7"][..]]
    {
        let refused = run_cmd(false, args);
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success() && err.contains("over 3 shards on the serving instance"), "{args:?}: {err}");
        let ok = run_cmd(true, args);
        assert!(ok.status.success(), "{args:?}: {}", String::from_utf8_lossy(&ok.stderr));
    }
}

/// A shard's node gone: its users fail open (DIRECT_ADMITTED) as an unsharded target's would,
/// or are refused with `on_store_failure = "closed"`; the users of the other shards keep
/// queueing on their nodes. Shard 0's node too, which also holds the target-wide state (the
/// admission lock, pacing, the ledger) and, like any node, some users' counts of queues.
#[tokio::test]
async fn on_a_cluster_a_shards_node_gone_fails_its_users_open_or_closed_and_the_others_queue() {
    for (lost, closed) in [(2u8, false), (2, true), (0, false), (0, true)] {
        let mut cluster = RedisCluster::spawn();
        let mut s = cluster_settings(&cluster);
        shard_type(&mut s);
        s.redis.timeout_ms = 1000;
        if closed {
            s.queue.on_store_failure = vq::config::OnStoreFailure::Closed;
        }
        let app = crate::support::spawn_app(s, false).await;
        crate::support::cluster_flag_on(&cluster).await;
        let path = "limited-drop/7";
        for u in 1..=6 {
            let v = app.json(app.enter(path, user(u)).await).await;
            assert_eq!(v["status"], "WAITING", "user {u}: {v}");
        }
        let gone = cluster.node_of(&format!("{}seq", prefix(lost))).await;
        cluster.kill_node(gone);
        // Once the instance's liveness probe finds the node silent, what the requests below
        // meet is the probe's answer for their own shard.
        app.wait_silent(gone).await;
        let mut seen = HashSet::new();
        for u in 100..200 {
            let shard = shard_of(u);
            if !seen.insert(shard) {
                continue;
            }
            let r = app.enter(path, user(u)).await;
            let status = r.status().as_u16();
            let v: serde_json::Value = r.json().await.unwrap_or_default();
            match (shard == lost, closed) {
                (true, false) => assert_eq!(v["status"], "DIRECT_ADMITTED", "shard {lost}'s node gone: fail open: {v}"),
                (true, true) => assert_eq!((status, v["code"].as_str()), (503, Some("QUEUE_UNAVAILABLE")), "{v}"),
                _ => assert_eq!(v["status"], "WAITING", "shard {shard}'s node answers (shard {lost}'s gone): {v}"),
            }
        }
        assert_eq!(seen.len(), 3);
        // The users who waited before the node went keep their place in the live shards.
        for u in (1..=6).filter(|u| shard_of(*u) != lost) {
            let v = app.json(app.poll(path, user(u)).await).await;
            assert_eq!(v["status"], "WAITING", "user {u} of shard {} polls: {v}", shard_of(u));
        }
        app.stop().await;
    }
}
