//! The hot path's Redis budget: what each step of a buyer's life costs Redis, counted on a real
//! `redis-server` (`CONFIG RESETSTAT`, then `INFO commandstats`), never timed.
//!
//! The budget lives in [`BUDGET`], one row per step. A change that adds Redis work to a step
//! fails [`every_step_of_a_buyers_life_stays_within_the_redis_budget`] until that row is raised on
//! purpose.
//!
//! What is counted: script calls (`EVALSHA`, `EVAL`, `FCALL` and their `_RO` forms; every one
//! must be an `FCALL` of vq's library, which runs no prelude per call) and Redis
//! commands, those scripts run inside Redis (`INFO commandstats` counts them too) and those sent
//! on their own, but not the script calls themselves and not `TIME`, `ROLE` or `CLUSTER SLOTS`:
//! the store's liveness probe sends them from a thread of its own, whatever the test does
//! (`TIME` every 100 ms, the others now and then; a script reads Redis' clock once, with its
//! call). The test drives `QueueService` and the pump directly (no
//! HTTP server, so no flag refresh or background sync runs between the counts), one user at a
//! time where a step is exact, and many users at once where coalescing shares calls (bounded
//! from above there: how many users share a call depends on timing).

use std::sync::Arc;

use vq::config::Settings;
use vq::domain::{QueueTarget, UserId};
use vq::pump::Pump;
use vq::service::{ClaimMode, GatePass, QueueService, QueueStatus};

use crate::support::{RedisServer, flag_on_before_start, open_store, secret, test_settings};

/// One step of a buyer's life, and what one unit of it may cost Redis.
struct Budget {
    step: Step,
    /// Script calls per unit, at most.
    scripts: f64,
    /// Redis commands per unit (inside scripts or not; see the module's doc), at most.
    commands: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// A new user's enter while nobody else enters (no coalescing): per user.
    EnterAlone,
    /// New users entering at once ([`CROWD`] of them; coalesced): per user.
    EnterCrowd,
    /// A waiting user's enter again: per user.
    ReEnter,
    /// A waiting user's poll answered from the instance's copy of the mark: per poll.
    PollLocal,
    /// A waiting user's poll that asks Redis (`status.lua`; near the front): per poll.
    PollStatus,
    /// The heartbeats of the polls answered locally (`view.lua`): per sync of
    /// [`LOCAL_POLLS`] users' heartbeats.
    Heartbeat,
    /// A pump tick admitting one batch ([`BATCH`] users) of one target: per admitted user.
    Admission,
    /// The poll of an admitted user that issues their token: per user.
    TokenIssue,
    /// Admitted users' polls at once (coalesced), each issuing its user's token: per user.
    TokenIssueCrowd,
    /// A purchase through the gate: claim, pacing, settling after a 2xx, the record's count.
    Purchase,
    /// Purchases through the gate at once (claims coalesced): per purchase.
    PurchaseCrowd,
    /// The same with purchase limits on (`purchases_per_admission` = 2,
    /// `purchases_per_user` = 2): each buyer buys twice with one token; per purchase.
    PurchaseLimited,
    /// A waiting user's leave: per user.
    Leave,
}

/// The budget. Each row is what its step costs today, measured by the test below (it prints
/// every step's figures). To raise a row: measure the change side by side against the build
/// before (`scripts/bench.sh pair`, alternating runs, medians, steal time), put those figures in
/// the commit message, and raise the row in the same commit. When a change makes a step
/// cheaper, lower its row to what the test prints, so the budget keeps the gain.
///
/// With `queue.max_queues_per_user` on (the default, 10).
const BUDGET: &[Budget] = &[
    // enter.lua, which counts the queues the user holds in the same call (HMGET of the
    // current and the previous generation, HSET; the generation's PEXPIREAT only with its
    // first write, HOLD_MARK in prelude.lua) beside its own 9 (the user's token key read in
    // the MGET of the target's counters).
    Budget { step: Step::EnterAlone, scripts: 1.0, commands: 12.0 },
    // enter.lua per target, each call carrying the users gathered while earlier ones were in
    // flight (about 100 here: 0.01 calls and 0.19 commands per user; the bound allows 8 on a
    // loaded machine).
    Budget { step: Step::EnterCrowd, scripts: 0.125, commands: 1.75 },
    // enter.lua finds the user (5), who is not counted again.
    Budget { step: Step::ReEnter, scripts: 1.0, commands: 5.0 },
    Budget { step: Step::PollLocal, scripts: 0.0, commands: 0.0 },
    Budget { step: Step::PollStatus, scripts: 1.0, commands: 5.0 },
    Budget { step: Step::Heartbeat, scripts: 1.0, commands: 5.0 },
    // Per tick: the targets' sets, the lock, admit.lua, tokens_expire.lua and evict.lua (3
    // script calls, about 55 commands), shared by the batch; a little room for the waits
    // falling into more than one bucket. evict.lua's share: the stale users of the heartbeat
    // ZSET and the sweep's state (MGET), and, once per quarter of the timeout, a sweep's start
    // (the first waiting seq, the beats' expiry, one GETRANGE, the sweep's new state): 6
    // commands in this tick, where one ZRANGEBYSCORE of the heartbeat ZSET was.
    Budget { step: Step::Admission, scripts: 0.06, commands: 1.2 },
    // status.lua, which stores the token the poll carries once it finds the user admitted
    // (MGET of what the token key holds, whose used mark it keeps; SET, ZREM×2, HINCRBY×2,
    // EXPIRE×2, HSET, ZADD) and drops the target from the user's count of queues on a single
    // server (HGET, HDEL).
    Budget { step: Step::TokenIssue, scripts: 1.0, commands: 16.0 },
    // status.lua per call of the users gathered while earlier calls were in flight: per user
    // the token's SET and the count's HGET and HDEL, per call the poll's reads (their token keys
    // in one MGET) and the token's other writes (ZREM×2, HINCRBY×2, EXPIRE×2, HSET, ZADD). The
    // 29 users here share one call (3.45 commands each); the bound allows about eight calls on a loaded machine. With each
    // user paying the token's writes alone it is 11.14.
    Budget { step: Step::TokenIssueCrowd, scripts: 0.3, commands: 6.5 },
    // token_claim.lua (GET, ZSCORE, SET of the used mark; the user's set of used tokens only
    // when a second token's mark replaces the first's), which reserves the purchase's place in
    // a tick first (GET HINCRBY, and HDEL PEXPIRE for a tick's first), then one MULTI after the
    // 2xx: the claim confirmed and the purchase's count in the record (HINCRBY×3 EXPIRE ZREM).
    Budget { step: Step::Purchase, scripts: 1.0, commands: 12.5 },
    // As Purchase, and token_claim.lua counts the user (HGET, HINCRBY, EXPIRE) and the token
    // (HINCRBY, PEXPIRETIME, PEXPIREAT the first time): its first purchase does not mark the
    // token used, its second does, moving the mark of the queue token the buyer used before
    // into their set of used tokens (PTTL, ZREMRANGEBYSCORE, ZADD, ZRANGE, PEXPIREAT).
    // Purchases at once: token_claim.lua per call of the claims gathered while earlier ones
    // were in flight (per claim GET, ZSCORE, SET and the tick's HINCRBY; per call the tick's
    // budget), then one MULTI per call of the purchases settled together (the counts by how
    // many, the purchases' ticks, EXPIRE, one ZREM of every queue token). The 29 purchases here
    // share one call of each (4.28 commands each); the bound allows about eight of each on a
    // loaded machine. Each purchase in calls of its own is Purchase's 12.
    Budget { step: Step::PurchaseCrowd, scripts: 0.3, commands: 6.5 },
    Budget { step: Step::PurchaseLimited, scripts: 1.0, commands: LIMITED_PURCHASE_COMMANDS },
    // leave.lua, which drops the target from the user's count of queues in the same call on a
    // single server (HGET, HDEL).
    Budget { step: Step::Leave, scripts: 1.0, commands: 10.0 },
];

/// What a purchase may cost Redis with purchase limits on ([`Step::PurchaseLimited`]).
const LIMITED_PURCHASE_COMMANDS: f64 = 19.5;

/// New users entering at once in [`Step::EnterCrowd`].
const CROWD: u64 = 200;
/// The batch a tick admits.
const BATCH: u64 = 50;
/// Polls answered locally before one heartbeat sync.
const LOCAL_POLLS: u64 = 40;

fn target() -> QueueTarget {
    "limited-drop:1".parse().expect("target")
}

/// Script calls and other commands Redis ran since the last `CONFIG RESETSTAT`.
#[derive(Debug, Default)]
struct Usage {
    scripts: u64,
    /// Script calls sent as text or its hash (`EVAL`, `EVALSHA`): each runs the prelude again,
    /// where an `FCALL` of the loaded library does not.
    evals: u64,
    commands: u64,
    /// Every command counted, by name (printed, for whoever changes a row).
    by_name: Vec<(String, u64)>,
}

async fn reset(redis: &RedisServer) {
    let mut c = redis.conn().await;
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut c).await.expect("config resetstat");
}

async fn usage(redis: &RedisServer) -> Usage {
    let mut c = redis.conn().await;
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut c).await.expect("info commandstats");
    let mut u = Usage::default();
    for line in info.lines() {
        let Some((name, rest)) = line.strip_prefix("cmdstat_").and_then(|l| l.split_once(':')) else { continue };
        let calls: u64 = rest
            .strip_prefix("calls=")
            .and_then(|r| r.split(',').next())
            .and_then(|n| n.parse().ok())
            .expect("calls= in a commandstats line");
        match name {
            "evalsha" | "eval" | "evalsha_ro" | "eval_ro" => {
                u.scripts += calls;
                u.evals += calls;
            }
            "fcall" | "fcall_ro" => u.scripts += calls,
            // The liveness probe's (see the module's doc) and the test's own.
            "time" | "role" | "cluster|slots" | "info" => {}
            n if n.starts_with("config|") => {}
            _ => u.commands += calls,
        }
        u.by_name.push((name.to_owned(), calls));
    }
    u
}

/// What one step cost, per unit.
struct Measured {
    step: Step,
    scripts: f64,
    evals: u64,
    commands: f64,
    by_name: String,
}

impl Measured {
    fn of(step: Step, usage: Usage, units: u64) -> Self {
        let per = |n: u64| n as f64 / units as f64;
        let by_name = usage.by_name.iter().map(|(n, c)| format!("{n} {:.2}", per(*c))).collect::<Vec<_>>().join(", ");
        Self { step, scripts: per(usage.scripts), evals: usage.evals, commands: per(usage.commands), by_name }
    }
}

fn settings(redis: &RedisServer) -> Settings {
    let mut s = test_settings(Some(redis));
    // Long ticks: the instance's copy of the mark stays fresh through the test (no background
    // sync runs here), and one admission per target fits in one tick.
    s.queue.tick_ms = 10_000;
    s.queue.batch_size = BATCH;
    s
}

fn user(name: &str) -> UserId {
    name.parse().expect("user id")
}

async fn waiting_seq(service: &QueueService, u: &UserId) -> u64 {
    match service.enter(target(), u).await {
        Ok(QueueStatus::Waiting { position, .. }) => position,
        other => panic!("{u}: {other:?}"),
    }
}

async fn admitted_token(service: &QueueService, u: &UserId) -> String {
    match service.status(target(), u).await {
        Ok(QueueStatus::Admitted(token)) => token.raw,
        other => panic!("{u}: {other:?}"),
    }
}

/// [`LOCAL_POLLS`] polls answered from the instance's copy, then the sync that sends their
/// heartbeats: [`Step::PollLocal`] and [`Step::Heartbeat`].
async fn local_polls_and_their_sync(
    redis: &RedisServer,
    service: &QueueService,
    far: &[UserId],
    measured: &mut Vec<Measured>,
) {
    reset(redis).await;
    for u in far {
        local_poll(service, u).await;
    }
    measured.push(Measured::of(Step::PollLocal, usage(redis).await, LOCAL_POLLS));
    reset(redis).await;
    service.sync_local_views().await;
    measured.push(Measured::of(Step::Heartbeat, usage(redis).await, 1));
}

/// Polls answered from the instance's copy must not reach Redis.
async fn local_poll(service: &QueueService, u: &UserId) {
    match service.status(target(), u).await {
        Ok(QueueStatus::Waiting { .. }) => {}
        other => panic!("{u}: {other:?}"),
    }
}

/// A purchase as the gate makes it (`http/gate.rs`): claim, pace, forward (a 2xx here), settle
/// the claim and count it in the record.
async fn purchase(service: &QueueService, u: &UserId, token: &str) {
    let claim = match service.gate_check(target(), Some(u.clone()), Some(token), ClaimMode::Claim).await {
        Ok(GatePass::Verified { claim: Some(claim) }) => claim,
        other => panic!("{u}: {other:?}"),
    };
    assert_eq!(service.pace_purchase(target(), Some(&claim)).await, vq::service::Pace::Now, "{u}");
    service.settle_purchase(claim, service.purchase_tick(), Some(200)).await;
}

/// A buyer's whole life on another target, so every script is loaded and every connection
/// open before anything is counted (a first call's loading of the library and connection
/// set-up are no step's cost).
async fn warm_up(redis: &RedisServer, service: &QueueService, pump: &Pump) {
    let t: QueueTarget = "limited-drop:2".parse().expect("target");
    let (a, b) = (user("warm-a"), user("warm-b"));
    for u in [&a, &b] {
        assert!(matches!(service.enter(t, u).await, Ok(QueueStatus::Waiting { .. })));
    }
    pump.tick().await.expect("warm-up tick");
    let token = match service.status(t, &a).await {
        Ok(QueueStatus::Admitted(token)) => token.raw,
        other => panic!("{other:?}"),
    };
    let claim = match service.gate_check(t, Some(a.clone()), Some(&token), ClaimMode::Claim).await {
        Ok(GatePass::Verified { claim: Some(claim) }) => claim,
        other => panic!("{other:?}"),
    };
    service.pace_purchase(t, Some(&claim)).await;
    service.settle_purchase(claim, service.purchase_tick(), Some(200)).await;
    service.sync_local_views().await;
    service.leave(t, &b).await;
    // The pump walks only the measured target from now on.
    let mut c = redis.conn().await;
    let _: () = redis::cmd("SREM").arg("queue:active").arg(t.to_string()).query_async(&mut c).await.expect("srem");
}

#[tokio::test]
async fn every_step_of_a_buyers_life_stays_within_the_redis_budget() {
    let redis = RedisServer::spawn();
    flag_on_before_start(&redis).await;
    let settings = Arc::new(settings(&redis));
    let store = open_store(&settings);
    let service = QueueService::new(store.clone(), secret(), settings.clone());
    service.refresh_flag().await.expect("flag");
    let pump = Pump::new(store, settings.clone(), "budget".into());
    warm_up(&redis, &service, &pump).await;
    // The first enter of a target also registers it (once per instance and minute): not an
    // enter's cost.
    let first = user("first");
    waiting_seq(&service, &first).await;

    let mut measured = Vec::new();
    let mut seq_of: Vec<(UserId, u64)> = vec![(first, 1)];

    // New users, one at a time.
    reset(&redis).await;
    let alone: Vec<UserId> = (1..=5).map(|i| user(&format!("alone-{i}"))).collect();
    for u in &alone {
        let seq = waiting_seq(&service, u).await;
        seq_of.push((u.clone(), seq));
    }
    measured.push(Measured::of(Step::EnterAlone, usage(&redis).await, alone.len() as u64));

    // New users, all at once.
    let service = Arc::new(service);
    reset(&redis).await;
    let tasks: Vec<_> = (1..=CROWD)
        .map(|i| {
            let service = service.clone();
            tokio::spawn(async move {
                let u = user(&format!("crowd-{i}"));
                let seq = waiting_seq(&service, &u).await;
                (u, seq)
            })
        })
        .collect();
    for task in tasks {
        seq_of.push(task.await.expect("enter task"));
    }
    measured.push(Measured::of(Step::EnterCrowd, usage(&redis).await, CROWD));
    seq_of.sort_by_key(|(_, seq)| *seq);
    let seqs: Vec<u64> = seq_of.iter().map(|(_, s)| *s).collect();
    assert_eq!(seqs, (1..=seq_of.len() as u64).collect::<Vec<_>>(), "one seq each, without gaps");
    let by_seq = |range: std::ops::RangeInclusive<u64>| -> Vec<UserId> {
        seq_of.iter().filter(|(_, s)| range.contains(s)).map(|(u, _)| u.clone()).collect()
    };
    // Users past two batches of the mark (0) are answered from the copy; those within ask Redis.
    let (admitted, near, far) = (by_seq(2..=21), by_seq(BATCH + 1..=BATCH + 20), by_seq(2 * BATCH + 1..=200));

    // Enter again.
    reset(&redis).await;
    for u in &near {
        waiting_seq(&service, u).await;
    }
    measured.push(Measured::of(Step::ReEnter, usage(&redis).await, near.len() as u64));

    // Polls near the front: status.lua.
    reset(&redis).await;
    for u in &near {
        match service.status(target(), u).await {
            Ok(QueueStatus::Waiting { .. }) => {}
            other => panic!("{u}: {other:?}"),
        }
    }
    measured.push(Measured::of(Step::PollStatus, usage(&redis).await, near.len() as u64));

    // Polls far back: the copy (after one sync, which gives the instance its first copy).
    service.sync_local_views().await;
    local_polls_and_their_sync(&redis, &service, &far[..LOCAL_POLLS as usize], &mut measured).await;

    // One tick admits the first batch.
    reset(&redis).await;
    let ticked = pump.tick().await.expect("tick");
    let admit = ticked[0].as_ref().expect("target tick").admit.expect("admitted");
    assert_eq!((admit.advanced, admit.admitted), (true, BATCH), "{ticked:?}");
    measured.push(Measured::of(Step::Admission, usage(&redis).await, BATCH));

    // Admitted users' polls issue their tokens.
    let mut tokens = Vec::new();
    reset(&redis).await;
    for u in &admitted {
        tokens.push(admitted_token(&service, u).await);
    }
    measured.push(Measured::of(Step::TokenIssue, usage(&redis).await, admitted.len() as u64));

    // The rest of the batch polls at once.
    let crowd = by_seq(admitted.len() as u64 + 2..=BATCH);
    reset(&redis).await;
    let tasks: Vec<_> = crowd
        .iter()
        .cloned()
        .map(|u| {
            let service = service.clone();
            tokio::spawn(async move { admitted_token(&service, &u).await })
        })
        .collect();
    let mut crowd_tokens = Vec::new();
    for task in tasks {
        crowd_tokens.push(task.await.expect("token task"));
    }
    measured.push(Measured::of(Step::TokenIssueCrowd, usage(&redis).await, crowd.len() as u64));

    // Their purchases through the gate.
    reset(&redis).await;
    for (u, token) in admitted.iter().zip(&tokens) {
        purchase(&service, u, token).await;
    }
    measured.push(Measured::of(Step::Purchase, usage(&redis).await, admitted.len() as u64));

    // The crowd's purchases at once.
    reset(&redis).await;
    let tasks: Vec<_> = crowd
        .iter()
        .cloned()
        .zip(crowd_tokens)
        .map(|(u, token)| {
            let service = service.clone();
            tokio::spawn(async move { purchase(&service, &u, &token).await })
        })
        .collect();
    for task in tasks {
        task.await.expect("purchase task");
    }
    measured.push(Measured::of(Step::PurchaseCrowd, usage(&redis).await, crowd.len() as u64));

    // The same buyers through an instance with purchase limits on, each with a token of its
    // own (stateless, valid a second longer than the queue's) bought with twice.
    let mut with_limits = (*settings).clone();
    with_limits.queue.purchases_per_admission = 2;
    with_limits.queue.purchases_per_user = 2;
    let limited = QueueService::new(open_store(&with_limits), secret(), Arc::new(with_limits));
    limited.refresh_flag().await.expect("flag");
    let now = vq::service::now_epoch_ms() / 1000;
    let fresh = |u: &UserId| vq::token::mint(&secret(), target(), u, now, settings.token.ttl_s + 1).raw;
    let warm = user("limited-warm");
    purchase(&limited, &warm, &fresh(&warm)).await;
    reset(&redis).await;
    for u in &admitted {
        let token = fresh(u);
        purchase(&limited, u, &token).await;
        purchase(&limited, u, &token).await;
    }
    measured.push(Measured::of(Step::PurchaseLimited, usage(&redis).await, 2 * admitted.len() as u64));

    // Waiting users leave.
    let leaving = &far[..10];
    reset(&redis).await;
    for u in leaving {
        service.leave(target(), u).await;
    }
    measured.push(Measured::of(Step::Leave, usage(&redis).await, leaving.len() as u64));

    let mut over = Vec::new();
    for m in &measured {
        let b = BUDGET.iter().find(|b| b.step == m.step).expect("every step has a budget row");
        eprintln!(
            "budget {:?}: {:.2} script calls (budget {}), {:.2} commands (budget {}); per unit: {}",
            m.step, m.scripts, b.scripts, m.commands, b.commands, m.by_name
        );
        // Every script call is an FCALL of the loaded library: none pays for the prelude.
        if m.evals > 0 {
            over.push(format!("{:?}: {} script calls as EVAL/EVALSHA, not FCALL", m.step, m.evals));
        }
        // A hundredth of slack for the crowd's averages.
        if m.scripts > b.scripts + 0.005 || m.commands > b.commands + 0.005 {
            over.push(format!(
                "{:?}: {:.2} script calls, {:.2} commands per unit (budget {}, {})",
                m.step, m.scripts, m.commands, b.scripts, b.commands
            ));
        }
    }
    assert!(over.is_empty(), "over the hot path's Redis budget (tests/it/budget.rs, BUDGET): {over:#?}");
}

/// The budget of a target spread over [`SHARDS`] shards (`targets.types.*.shards`), per
/// unit as in [`BUDGET`]. Enter, poll, token and leave go to the user's shard with the
/// scripts of an unsharded target; the instance keeps a copy of each shard's mark, and its
/// heartbeat sync is one call per shard. A tick costs more, shared by the batch: the plan (the pinned
/// batch, each shard's mark and waiting count, the plan's `SET NX GET`), admit.lua,
/// evict.lua and tokens_expire.lua once per shard, and admit_milestones.lua once (the whole
/// target's milestones: 4 commands).
const SHARDED_BUDGET: &[Budget] = &[
    // On one server the shard's enter.lua counts the queues held, as in BUDGET.
    Budget { step: Step::EnterAlone, scripts: 1.0, commands: 12.0 },
    Budget { step: Step::ReEnter, scripts: 1.0, commands: 5.0 },
    Budget { step: Step::PollStatus, scripts: 1.0, commands: 5.0 },
    Budget { step: Step::PollLocal, scripts: 0.0, commands: 0.0 },
    // One view.lua per shard with polls answered here, and one GET of the target's pinned
    // batch per shard after the first.
    Budget { step: Step::Heartbeat, scripts: 3.0, commands: 17.0 },
    // Per tick: 10 script calls and about 172 commands for 50 users (evict.lua per shard as in
    // BUDGET: the sweep's state, and at a sweep's start its first seq, expiry, read and state).
    Budget { step: Step::Admission, scripts: 0.2, commands: 3.5 },
    Budget { step: Step::TokenIssue, scripts: 3.0, commands: 17.0 },
    Budget { step: Step::Leave, scripts: 2.0, commands: 10.0 },
];

/// The shards of the sharded budget's target.
const SHARDS: u8 = 3;

#[tokio::test]
async fn a_sharded_targets_steps_stay_within_the_sharded_budget() {
    let redis = RedisServer::spawn();
    flag_on_before_start(&redis).await;
    let mut s = settings(&redis);
    s.targets.types.iter_mut().find(|t| t.slug == "limited-drop").expect("shipped type").shards = Some(SHARDS.into());
    let settings = Arc::new(s);
    let store = open_store(&settings);
    let service = QueueService::new(store.clone(), secret(), settings.clone());
    service.refresh_flag().await.expect("flag");
    let pump = Pump::new(store, settings.clone(), "budget".into());
    warm_up(&redis, &service, &pump).await;
    // A first user in every shard (a shard's first seq sets its keys' expiry: not an enter's
    // cost, as in the unsharded budget).
    for i in 1..=12 {
        waiting_seq(&service, &user(&format!("first-{i}"))).await;
    }
    let mut measured = Vec::new();

    reset(&redis).await;
    let alone: Vec<UserId> = (1..=5).map(|i| user(&format!("alone-{i}"))).collect();
    for u in &alone {
        waiting_seq(&service, u).await;
    }
    measured.push(Measured::of(Step::EnterAlone, usage(&redis).await, alone.len() as u64));
    let more: Vec<UserId> = (1..=400).map(|i| user(&format!("more-{i}"))).collect();
    let mut far = Vec::new();
    for u in &more {
        // Past two batches of its shard's mark (0), a user's polls are answered from the
        // instance's copy of that shard.
        let shard_seq = (waiting_seq(&service, u).await - 1) / u64::from(SHARDS) + 1;
        if shard_seq > 2 * BATCH + 10 {
            far.push(u.clone());
        }
    }

    reset(&redis).await;
    for u in &more[..20] {
        waiting_seq(&service, u).await;
    }
    measured.push(Measured::of(Step::ReEnter, usage(&redis).await, 20));

    reset(&redis).await;
    for u in &more[100..120] {
        match service.status(target(), u).await {
            Ok(QueueStatus::Waiting { .. }) => {}
            other => panic!("{u}: {other:?}"),
        }
    }
    measured.push(Measured::of(Step::PollStatus, usage(&redis).await, 20));

    service.sync_local_views().await;
    local_polls_and_their_sync(&redis, &service, &far[..LOCAL_POLLS as usize], &mut measured).await;

    reset(&redis).await;
    let ticked = pump.tick().await.expect("tick");
    let admit = ticked[0].as_ref().expect("target tick").admit.expect("admitted");
    assert_eq!(admit.admitted, BATCH, "one batch across the shards: {ticked:?}");
    measured.push(Measured::of(Step::Admission, usage(&redis).await, BATCH));

    // The users admitted, read from each shard (not counted): seq at or below its mark.
    let mut c = redis.conn().await;
    let mut admitted = Vec::new();
    for u in alone.iter().chain(&more) {
        let tag = vq::domain::shard_tag("LIMITED_DROP:1", vq::domain::user_shard(u.as_str(), SHARDS), SHARDS);
        let mark: u64 =
            redis::cmd("GET").arg(format!("queue:{{{tag}}}:admitted_count")).query_async(&mut c).await.expect("mark");
        let seq: Option<u64> = redis::cmd("ZSCORE")
            .arg(format!("queue:{{{tag}}}:waiting"))
            .arg(u.as_str())
            .query_async(&mut c)
            .await
            .expect("seq");
        if seq.is_some_and(|s| s <= mark) {
            admitted.push(u.clone());
        }
    }
    let admitted = &admitted[..20];
    reset(&redis).await;
    for u in admitted {
        admitted_token(&service, u).await;
    }
    measured.push(Measured::of(Step::TokenIssue, usage(&redis).await, admitted.len() as u64));

    let leaving = &more[300..310];
    reset(&redis).await;
    for u in leaving {
        service.leave(target(), u).await;
    }
    measured.push(Measured::of(Step::Leave, usage(&redis).await, leaving.len() as u64));

    let mut over = Vec::new();
    for m in &measured {
        let b = SHARDED_BUDGET.iter().find(|b| b.step == m.step).expect("every step has a budget row");
        eprintln!(
            "sharded budget {:?}: {:.2} script calls (budget {}), {:.2} commands (budget {}); per unit: {}",
            m.step, m.scripts, b.scripts, m.commands, b.commands, m.by_name
        );
        if m.evals > 0 || m.scripts > b.scripts + 0.005 || m.commands > b.commands + 0.005 {
            over.push(format!("{:?}: {:.2} script calls, {:.2} commands per unit", m.step, m.scripts, m.commands));
        }
    }
    assert!(over.is_empty(), "over the sharded budget (tests/it/budget.rs, SHARDED_BUDGET): {over:#?}");
}

/// New users arriving one about every millisecond, each answered by Redis before the next
/// comes: with `redis.coalesce_wait_ms`, a call waits for the users the rate brings and
/// carries several, where each would otherwise go alone and pay a call's fixed work by itself.
/// (The wait is wide here, 20 ms, so a loaded machine's late timers still fall inside it.)
#[tokio::test]
async fn enters_arriving_a_millisecond_apart_wait_to_share_their_calls() {
    const STEADY: u64 = 100;
    let redis = RedisServer::spawn();
    let mut seqs = steady_enters(&redis, 20, 1, 1, STEADY).await;
    seqs.sort_unstable();
    assert_eq!(seqs, (2..=STEADY + 1).collect::<Vec<_>>(), "one seq each, without gaps");
    let used = usage(&redis).await;
    assert!(used.scripts * 4 <= STEADY, "{} script calls for {STEADY} enters: {:?}", used.scripts, used.by_name);
}

/// The same for a target over three shards: each shard's calls get a third of the users, so a
/// drain holding them waits for a share per shard, up to three times the wait, and each
/// shard's call carries about what one unsharded call would. Waiting only as long as an
/// unsharded target does, 150 users at this pace made 31 calls (a drain of ~16 split three
/// ways); waiting per shard, 13; with the users four times as far apart, as on a loaded
/// machine, 47–49 and 17–19. (The wait is wide, 50 ms, so late timers fall inside it.)
#[tokio::test]
async fn enters_of_a_sharded_target_wait_to_share_each_shards_calls() {
    const STEADY: u64 = 150;
    let redis = RedisServer::spawn();
    steady_enters(&redis, 50, SHARDS, 12, STEADY).await;
    let used = usage(&redis).await;
    assert!(
        used.scripts * 6 <= STEADY,
        "{} script calls for {STEADY} enters over {SHARDS} shards: {:?}",
        used.scripts,
        used.by_name
    );
}

/// A service with `redis.coalesce_wait_ms` = `wait_ms` and limited-drop over `shards`; `first`
/// users entered before the counts are reset (each shard's first seq sets its keys' expiry: not
/// an enter's cost), then `steady` new users entering one about every millisecond. Their seqs.
async fn steady_enters(redis: &RedisServer, wait_ms: u64, shards: u8, first: u64, steady: u64) -> Vec<u64> {
    flag_on_before_start(redis).await;
    let mut s = settings(redis);
    s.redis.coalesce_wait_ms = wait_ms;
    if shards > 1 {
        s.targets.types.iter_mut().find(|t| t.slug == "limited-drop").expect("shipped type").shards =
            Some(shards.into());
    }
    let settings = Arc::new(s);
    let service = Arc::new(QueueService::new(open_store(&settings), secret(), settings.clone()));
    service.refresh_flag().await.expect("flag");
    for i in 1..=first {
        waiting_seq(&service, &user(&format!("first-{i}"))).await;
    }
    reset(redis).await;
    let mut tasks = Vec::new();
    for i in 1..=steady {
        let service = service.clone();
        tasks.push(tokio::spawn(async move { waiting_seq(&service, &user(&format!("steady-{i}"))).await }));
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let mut seqs = Vec::new();
    for task in tasks {
        seqs.push(task.await.expect("enter task"));
    }
    seqs
}
