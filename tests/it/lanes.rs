//! Lanes of one target (`[[targets.types.lanes]]`, `vq lane add`): each tick's batch shared by
//! weight (70/30 within one user a tick), a lane without users leaving its share to the
//! others, a presale lane admitted before the public, access codes used once and bound to
//! their user, 100 buyers racing one single-use code across two instances, signed claims
//! (forged, expired, another user's or lane's refused, the buyer kept in the public lane), a
//! buyer moving from the public lane to theirs with one place, on one redis-server, on a real
//! 3-primary Redis Cluster and on the embedded store; and what a lane costs Redis.

use redis::FromRedisValue;
use vq::config::{LaneSettings, Settings};
use vq::domain::{LaneName, Ms, QueueTarget, SaleSchedule, UserId, Users};
use vq::store::prelude::*;
use vq::store::{AnyStore, EnterOutcome, JoinOutcome, ScheduleOutcome};

use crate::support::{
    RedisCluster, RedisServer, VqProcess, cluster_settings, next_tick, open_store, test_settings, tick_room, wait_until,
};

/// The key the tests' shop signs lane claims with (`lane_secret_env`).
const LANE_KEY: &str = "lanes-test-shop-key-0123456789";

fn target() -> QueueTarget {
    "LIMITED_DROP:9".parse().unwrap()
}

fn members() -> LaneName {
    "members".parse().unwrap()
}

fn user(u: u64) -> UserId {
    format!("buyer-{u}").parse().unwrap()
}

/// The key prefix of a lane's part (the public lane's is the target's own).
fn prefix(lane: &str) -> String {
    match lane {
        "public" => "queue:{LIMITED_DROP:9}:".to_owned(),
        l => format!("queue:{{LIMITED_DROP:9~{l}}}:"),
    }
}

/// limited-drop with a `members` lane taking 70 % of each batch.
fn with_members(s: &mut Settings, opens_before_s: u64) {
    let t = s.targets.types.iter_mut().find(|t| t.slug == "limited-drop").expect("shipped type");
    t.lanes = vec![LaneSettings { name: "members".into(), share: 70, opens_before_s }];
}

/// Where a test runs: one redis-server, a 3-primary cluster, or the embedded store.
enum Redis {
    Server(RedisServer),
    Cluster(RedisCluster),
    Embedded,
}

impl Redis {
    fn settings(&self) -> Settings {
        let mut s = match self {
            Redis::Server(r) => test_settings(Some(r)),
            Redis::Cluster(c) => cluster_settings(c),
            Redis::Embedded => test_settings(None),
        };
        s.redis.timeout_ms = 5000;
        s
    }

    /// A command on Redis (not on the embedded store, whose keys the tests read through it).
    async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        match self {
            Redis::Server(r) => cmd.query_async(&mut r.conn().await).await.unwrap(),
            Redis::Cluster(c) => cmd.query_async(&mut c.conn().await).await.unwrap(),
            Redis::Embedded => panic!("the embedded store's keys are read through the store"),
        }
    }
}

/// Enters users `users` in `lane` (joined with a verified claim's lane for those not public).
async fn enter_in(store: &AnyStore, lane: LaneName, users: impl IntoIterator<Item = u64>) {
    store.register_active(target()).await.unwrap();
    for u in users {
        if !lane.is_public() {
            let j = store.join_lane(target(), &user(u), "", Some(lane)).await.unwrap();
            assert_eq!(j, JoinOutcome::Joined(lane));
        }
        let o = store.enter(target(), user(u), &"tok").await.unwrap();
        let EnterOutcome::Waiting(w) = o else { panic!("user {u}: {o:?}") };
        assert_eq!(w.lane, Some(lane), "user {u} waits in {lane}");
    }
}

/// The users still waiting in the public lane and in the members' lane.
async fn marks(store: &AnyStore) -> (u64, u64) {
    let (public_waiting, _) = store.lane_holds(target(), LaneName::PUBLIC).await.unwrap();
    let (members_waiting, _) = store.lane_holds(target(), members()).await.unwrap();
    (public_waiting, members_waiting)
}

/// 70/30 over ticks: with both lanes full, each tick of 10 admits 7 members and 3 of the
/// public; with one user a tick, the lanes stay within one user of 70/30 however many ticks.
async fn the_batch_is_shared_by_weight(redis: Redis) {
    the_batch_is_shared_by_weight_over(redis, 1).await;
}

async fn the_batch_is_shared_by_weight_over(redis: Redis, shards: u64) {
    let mut s = redis.settings();
    with_members(&mut s, 0);
    s.targets.types.iter_mut().find(|t| t.slug == "limited-drop").unwrap().shards = Some(shards);
    let store = open_store(&s);
    enter_in(&store, LaneName::PUBLIC, 1..=40).await;
    enter_in(&store, members(), 101..=140).await;
    let tick_ms = s.queue.tick_ms;
    let (mut public_left, mut members_left) = (40, 40);
    for t in 0..3 {
        next_tick(tick_ms).await;
        tick_room(tick_ms, 200).await;
        let a = store.admit_by(target(), Users(10), Ms(tick_ms), "a").await.unwrap();
        assert_eq!(a.admitted, 10, "tick {t}: one batch");
        let (p, m) = marks(&store).await;
        assert_eq!((public_left - p, members_left - m), (3, 7), "tick {t}: 3 public and 7 members");
        (public_left, members_left) = (p, m);
    }
    // Batch 1: within one user of the weights at every tick.
    let mut given = 0.0;
    for t in 0..10 {
        next_tick(tick_ms).await;
        tick_room(tick_ms, 200).await;
        let a = store.admit_by(target(), Users(1), Ms(tick_ms), "a").await.unwrap();
        assert_eq!(a.admitted, 1, "tick {t}");
        given += 1.0;
        let (p, m) = marks(&store).await;
        let (pub_in, mem_in) = ((public_left - p) as f64, (members_left - m) as f64);
        assert!(
            (mem_in - 0.7 * given).abs() <= 1.0 && (pub_in - 0.3 * given).abs() <= 1.0,
            "tick {t}: {pub_in} public, {mem_in} members"
        );
    }
}

#[tokio::test]
async fn the_batch_is_shared_by_weight_on_redis() {
    the_batch_is_shared_by_weight(Redis::Server(RedisServer::spawn())).await;
}

#[tokio::test]
async fn on_a_cluster_the_batch_is_shared_by_weight() {
    the_batch_is_shared_by_weight(Redis::Cluster(RedisCluster::spawn())).await;
}

/// Lanes of a sharded type: each lane is three shards on three nodes, the shares the same.
#[tokio::test]
async fn on_a_cluster_lanes_of_a_sharded_type_share_the_batch_by_weight() {
    the_batch_is_shared_by_weight_over(Redis::Cluster(RedisCluster::spawn()), 3).await;
}

#[tokio::test]
async fn on_the_embedded_store_the_batch_is_shared_by_weight() {
    the_batch_is_shared_by_weight(Redis::Embedded).await;
}

/// A lane without users waiting (not open yet, or empty) leaves its share to the public, and
/// never more than the batch is admitted in all.
#[tokio::test]
async fn a_lane_without_users_leaves_its_share_to_the_others() {
    let redis = Redis::Server(RedisServer::spawn());
    let mut s = redis.settings();
    with_members(&mut s, 0);
    let store = open_store(&s);
    enter_in(&store, LaneName::PUBLIC, 1..=30).await;
    enter_in(&store, members(), 101..=102).await;
    next_tick(s.queue.tick_ms).await;
    tick_room(s.queue.tick_ms, 200).await;
    let a = store.admit_by(target(), Users(10), Ms(s.queue.tick_ms), "a").await.unwrap();
    assert_eq!(a.admitted, 10);
    assert_eq!(marks(&store).await, (22, 0), "2 members (all there were) and 8 of the public");
    next_tick(s.queue.tick_ms).await;
    tick_room(s.queue.tick_ms, 200).await;
    store.admit_by(target(), Users(10), Ms(s.queue.tick_ms), "a").await.unwrap();
    assert_eq!(marks(&store).await, (12, 0), "no member left: the public takes the batch");
    // The members' part keys are their own hash tag's; the public's are the target's.
    let held: u64 = redis.query(redis::cmd("ZCARD").arg(format!("{}waiting", prefix("members")))).await;
    assert_eq!(held, 2, "both members were placed in the members' part");
}

/// A presale: the members' lane opens 2 s before the public; its users are admitted while
/// the public's wait pre-queued, and the public only from its own opening.
#[tokio::test]
async fn a_presale_lane_is_admitted_before_the_public() {
    let redis = Redis::Server(RedisServer::spawn());
    let mut s = redis.settings();
    with_members(&mut s, 2);
    let store = open_store(&s);
    let now = vq::service::now_epoch_ms();
    let opens_at = now + 3000;
    let schedule = SaleSchedule { opens_at_ms: opens_at, prequeue_from_ms: Some(now - 5000), closes_at_ms: None };
    let ScheduleOutcome::Scheduled { .. } = store.schedule_sale(target(), schedule, [7u8; 32]).await.unwrap() else {
        panic!("not scheduled")
    };
    store.register_active(target()).await.unwrap();
    for u in 1..=5 {
        assert!(matches!(store.enter(target(), user(u), &"t").await.unwrap(), EnterOutcome::PreQueue(_)));
    }
    for u in 101..=105 {
        store.join_lane(target(), &user(u), "", Some(members())).await.unwrap();
        assert!(matches!(store.enter(target(), user(u), &"t").await.unwrap(), EnterOutcome::PreQueue(_)));
    }
    let pump = vq::pump::Pump::new(store.clone(), std::sync::Arc::new(s.clone()), "p".into());
    // Tick until the members are all admitted: the public's opening has not come yet.
    wait_until(std::time::Duration::from_secs(10), "the members admitted", async || {
        next_tick(s.queue.tick_ms).await;
        pump.tick().await.unwrap();
        store.lane_holds(target(), members()).await.unwrap() == (0, 0)
    })
    .await;
    let (public_waiting, public_prequeued) = store.lane_holds(target(), LaneName::PUBLIC).await.unwrap();
    assert_eq!(public_waiting, 0, "nobody of the public waits (or was admitted) before its opening");
    let _ = public_prequeued;
    wait_until(std::time::Duration::from_secs(10), "the public admitted after its opening", async || {
        next_tick(s.queue.tick_ms).await;
        pump.tick().await.unwrap();
        store.lane_holds(target(), LaneName::PUBLIC).await.unwrap() == (0, 0)
    })
    .await;
    // One seed for every lane: the members' part was scheduled with the public's seed.
    let seed: Option<String> =
        redis.query(redis::cmd("HGET").arg(format!("{}sale", prefix("members"))).arg("seed")).await;
    let public_seed: Option<String> =
        redis.query(redis::cmd("HGET").arg(format!("{}sale", prefix("public"))).arg("seed")).await;
    assert_eq!(seed, public_seed);
    // Every admission of the public came at or after its opening's tick; the members' first
    // came before it (the lane opened 2 s, four ticks, earlier).
    let ticks = async |lane: &str| -> Vec<u64> {
        let rows: Vec<String> =
            redis.query(redis::cmd("LRANGE").arg(format!("{}admissions", prefix(lane))).arg(0).arg(-1)).await;
        rows.iter().filter(|r| !r.ends_with(":0")).filter_map(|r| r.split_once(':')?.0.parse().ok()).collect()
    };
    let opening_tick = opens_at / s.queue.tick_ms;
    let (public, lane) = (ticks("public").await, ticks("members").await);
    assert!(
        !public.is_empty() && public.iter().all(|t| *t >= opening_tick),
        "public {public:?}, opening {opening_tick}"
    );
    assert!(lane.iter().min().is_some_and(|t| *t < opening_tick), "members {lane:?}, opening {opening_tick}");
    // Each lane's pre-queued users were placed in the one seed's order (verifiable from the
    // published seed, as a target without lanes is).
    for (lane, users) in [("members", 101..=105u64), ("public", 1..=5u64)] {
        let placed: Vec<String> =
            redis.query(redis::cmd("ZRANGE").arg(format!("{}waiting", prefix(lane))).arg(0).arg(-1)).await;
        let users: Vec<UserId> = users.map(user).collect();
        let order: Vec<String> = vq::domain::opening_order(&[7u8; 32], &users).iter().map(|u| u.to_string()).collect();
        assert_eq!(placed, order, "{lane} placed in the seed's order");
    }
    let lane_opens: Option<String> =
        redis.query(redis::cmd("HGET").arg(format!("{}sale", prefix("members"))).arg("opens_at")).await;
    assert_eq!(lane_opens, Some((opens_at - 2000).to_string()), "the members' lane opens 2 s before");
}

/// A configuration file giving limited-drop a `members` lane of 70 % and the shop's claim key
/// in `LANES_TEST_KEY`.
fn lanes_config(dir: &tempfile::TempDir) -> String {
    let conf = dir.path().join("vq.toml");
    std::fs::write(
        &conf,
        "[[targets.types]]\nslug = \"limited-drop\"\nlane_secret_env = \"LANES_TEST_KEY\"\n\n\
         [[targets.types.lanes]]\nname = \"members\"\nshare = 70\n\n[[targets.types]]\nslug = \"ticketing-event\"\n",
    )
    .unwrap();
    conf.to_str().unwrap().to_owned()
}

/// `vq serve` with [`lanes_config`] (the queue on once started).
async fn lanes_instance(redis: &RedisServer, conf: &str) -> VqProcess {
    VqProcess::serve_args(redis, &["--config", conf], &[("LANES_TEST_KEY", LANE_KEY.to_owned())]).await
}

const ENTRIES: &str = "/virtual-queues/limited-drop/9/entries";

/// An enter of `u` through `base`, with a JSON body when given and `X-VQ-Lane` when given.
async fn enter(
    client: &reqwest::Client,
    base: &str,
    u: u64,
    body: Option<serde_json::Value>,
    claim: Option<&str>,
) -> (u16, serde_json::Value) {
    let mut req = client.post(format!("{base}{ENTRIES}")).header("X-User-Id", user(u).to_string());
    if let Some(b) = body {
        req = req.json(&b);
    }
    if let Some(c) = claim {
        req = req.header("X-VQ-Lane", c);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(serde_json::Value::Null))
}

async fn poll(client: &reqwest::Client, base: &str, u: u64) -> serde_json::Value {
    let r = client.get(format!("{base}{ENTRIES}/me")).header("X-User-Id", user(u).to_string()).send().await.unwrap();
    r.json().await.unwrap()
}

/// Where `u` holds a place: in the public lane's `waiting`, in the members', or both.
async fn places(redis: &RedisServer, u: u64) -> (bool, bool) {
    let mut c = redis.conn().await;
    let mut held = Vec::new();
    for lane in ["public", "members"] {
        let key = format!("{}waiting", prefix(lane));
        let s: Option<f64> = redis::cmd("ZSCORE").arg(key).arg(user(u).as_str()).query_async(&mut c).await.unwrap();
        held.push(s.is_some());
    }
    (held[0], held[1])
}

/// An access code for one user: a wrong code and a code another user bound are refused with
/// a clear 4xx, the buyer staying in the public lane; the right one moves the buyer from the
/// public lane to the members' (one place), and entering again with it uses nothing.
#[tokio::test]
async fn a_single_use_code_lets_one_buyer_into_the_lane_and_nobody_else() {
    let redis = RedisServer::spawn();
    let dir = tempfile::tempdir().unwrap();
    let conf = lanes_config(&dir);
    let vq = lanes_instance(&redis, &conf).await;
    crate::support::flag_on(&redis).await;
    let store = open_store(&test_settings(Some(&redis)));
    let hash = vq::lane::code_hash(target(), "FAN-0001");
    assert_eq!(store.import_codes(target(), members(), std::slice::from_ref(&hash), 1).await.unwrap(), 1);
    let client = reqwest::Client::new();
    let base = &vq.addr;

    let (st, b) = enter(&client, base, 1, None, None).await;
    assert_eq!((st, b["status"].as_str(), b["lane"].as_str()), (200, Some("WAITING"), Some("public")), "{b}");
    let (st, b) = enter(&client, base, 1, Some(serde_json::json!({"laneCode": "FAN-9999"})), None).await;
    assert_eq!((st, b["code"].as_str()), (403, Some("LANE_CODE_INVALID")), "{b}");
    assert_eq!(poll(&client, base, 1).await["lane"], "public", "a wrong code leaves the buyer where they were");

    let (st, b) = enter(&client, base, 1, Some(serde_json::json!({"laneCode": "FAN-0001"})), None).await;
    assert_eq!((st, b["lane"].as_str(), b["position"].as_u64()), (200, Some("members"), Some(1)), "{b}");
    assert_eq!(places(&redis, 1).await, (false, true), "moved: one place, in the members' lane");
    let (st, b) = enter(&client, base, 1, Some(serde_json::json!({"laneCode": "FAN-0001"})), None).await;
    assert_eq!((st, b["lane"].as_str(), b["position"].as_u64()), (200, Some("members"), Some(1)), "idempotent: {b}");

    let (st, b) = enter(&client, base, 2, None, None).await;
    assert_eq!((st, b["lane"].as_str()), (200, Some("public")));
    let (st, b) = enter(&client, base, 2, Some(serde_json::json!({"laneCode": "FAN-0001"})), None).await;
    assert_eq!((st, b["code"].as_str()), (409, Some("LANE_CODE_USED")), "{b}");
    assert_eq!(places(&redis, 2).await, (true, false), "the buyer stays in the public lane");
    let (st, b) = enter(&client, base, 3, Some(serde_json::json!({"laneCode": "FAN-0001"})), None).await;
    assert_eq!((st, b["code"].as_str()), (409, Some("LANE_CODE_USED")), "a new buyer gets no place either: {b}");
    assert_eq!(places(&redis, 3).await, (false, false));
    let (st, b) = enter(&client, base, 3, Some(serde_json::json!({"laneCode": 7})), None).await;
    assert_eq!((st, b["code"].as_str()), (400, Some("INVALID_REQUEST")), "{b}");

    let codes = store.export_codes(target()).await.unwrap();
    assert_eq!(codes, vec![(hash, "members".to_owned(), 0, 1)], "stored hashed: no use left, one user bound");
}

/// Claims the shop signs: forged, expired, made for another user or for a lane the target
/// does not have are refused 403 LANE_CLAIM_INVALID and the buyer stays in the public lane; a
/// valid one (in `X-VQ-Lane`) moves them to the members' lane.
#[tokio::test]
async fn a_signed_claim_moves_its_user_and_nothing_else_does() {
    let redis = RedisServer::spawn();
    let dir = tempfile::tempdir().unwrap();
    let conf = lanes_config(&dir);
    let vq = lanes_instance(&redis, &conf).await;
    crate::support::flag_on(&redis).await;
    let client = reqwest::Client::new();
    let base = &vq.addr;
    let now_s = vq::service::now_epoch_ms() / 1000;
    let key = LANE_KEY.as_bytes();
    let (st, _) = enter(&client, base, 5, None, None).await;
    assert_eq!(st, 200);
    let vip: LaneName = "vip".parse().unwrap();
    let refused = [
        ("forged", vq::lane::sign_claim(b"not-the-shops-key", target(), members(), &user(5), now_s + 600)),
        ("expired", vq::lane::sign_claim(key, target(), members(), &user(5), now_s - 1)),
        ("another user's", vq::lane::sign_claim(key, target(), members(), &user(6), now_s + 600)),
        ("another lane", vq::lane::sign_claim(key, target(), vip, &user(5), now_s + 600)),
        ("garbage", "members.x.y".to_owned()),
    ];
    for (what, claim) in refused {
        let (st, b) = enter(&client, base, 5, None, Some(&claim)).await;
        assert_eq!((st, b["code"].as_str()), (403, Some("LANE_CLAIM_INVALID")), "{what}: {b}");
        assert_eq!(places(&redis, 5).await, (true, false), "{what}: the buyer stays in the public lane");
    }
    let good = vq::lane::sign_claim(key, target(), members(), &user(5), now_s + 600);
    let (st, b) = enter(&client, base, 5, None, Some(&good)).await;
    assert_eq!((st, b["lane"].as_str()), (200, Some("members")), "{b}");
    assert_eq!(places(&redis, 5).await, (false, true));
    assert_eq!(poll(&client, base, 5).await["lane"], "members");
    let (st, b) = enter(&client, base, 6, Some(serde_json::json!({"laneClaim": good})), None).await;
    assert_eq!((st, b["code"].as_str()), (403, Some("LANE_CLAIM_INVALID")), "user 5's claim is not user 6's: {b}");
}

/// 100 buyers race one single-use code through two `vq serve` processes: exactly one gets a
/// place in the lane, the 99 others 409 LANE_CODE_USED.
#[tokio::test]
async fn a_hundred_buyers_racing_one_single_use_code_across_two_instances_get_one_lane_place() {
    let redis = RedisServer::spawn();
    let dir = tempfile::tempdir().unwrap();
    let conf = lanes_config(&dir);
    let (a, b) = (lanes_instance(&redis, &conf).await, lanes_instance(&redis, &conf).await);
    crate::support::flag_on(&redis).await;
    let store = open_store(&test_settings(Some(&redis)));
    store.import_codes(target(), members(), &[vq::lane::code_hash(target(), "ONLY-ONE")], 1).await.unwrap();
    let client = reqwest::Client::new();
    let tasks: Vec<_> = (1..=100u64)
        .map(|u| {
            let (client, base) = (client.clone(), if u % 2 == 0 { a.addr.clone() } else { b.addr.clone() });
            tokio::spawn(async move {
                enter(&client, &base, u, Some(serde_json::json!({"laneCode": "ONLY-ONE"})), None).await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    let placed: Vec<_> = answers.iter().filter(|(st, b)| *st == 200 && b["lane"] == "members").collect();
    let used = answers.iter().filter(|(st, b)| *st == 409 && b["code"] == "LANE_CODE_USED").count();
    assert_eq!((placed.len(), used), (1, 99), "{answers:?}");
    let mut c = redis.conn().await;
    let in_lane: u64 =
        redis::cmd("ZCARD").arg(format!("{}waiting", prefix("members"))).query_async(&mut c).await.unwrap();
    assert_eq!(in_lane, 1, "one place in the lane");
}

/// The same race on a real cluster, through two stores: one join.
#[tokio::test]
async fn on_a_cluster_one_single_use_code_joins_one_buyer() {
    let redis = Redis::Cluster(RedisCluster::spawn());
    let mut s = redis.settings();
    with_members(&mut s, 0);
    let (a, b) = (open_store(&s), open_store(&s));
    let hash = vq::lane::code_hash(target(), "ONLY-ONE");
    a.import_codes(target(), members(), std::slice::from_ref(&hash), 1).await.unwrap();
    let tasks: Vec<_> = (1..=100u64)
        .map(|u| {
            let (store, hash) = (if u % 2 == 0 { a.clone() } else { b.clone() }, hash.clone());
            tokio::spawn(async move { store.join_lane(target(), &user(u), &hash, None).await.unwrap() })
        })
        .collect();
    let mut joined = 0;
    for t in tasks {
        match t.await.unwrap() {
            JoinOutcome::Joined(l) => {
                assert_eq!(l, members());
                joined += 1;
            }
            JoinOutcome::Used => {}
            JoinOutcome::Unknown => panic!("the code is known"),
        }
    }
    assert_eq!(joined, 1);
}

/// Redis commands since the last `CONFIG RESETSTAT`, `TIME` (the probe's) left out.
async fn commands(redis: &RedisServer) -> u64 {
    let mut c = redis.conn().await;
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut c).await.unwrap();
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_").and_then(|l| l.split_once(':')))
        .filter(|(name, _)| !matches!(*name, "time" | "info" | "config|resetstat"))
        .filter_map(|(_, rest)| rest.strip_prefix("calls=")?.split(',').next()?.parse::<u64>().ok())
        .sum()
}

/// What a lane costs: a poll of a waiting user of a target with lanes is one command more
/// (the `HGET` of the user's lane) than the same poll of a target without; the target without
/// lanes pays nothing (`tests/it/budget.rs` holds its budget, unchanged).
#[tokio::test]
async fn a_lane_adds_one_command_to_a_poll_and_a_target_without_lanes_none() {
    // The budget: commands a poll of a target with lanes costs beyond one without.
    const LANE_POLL_EXTRA: u64 = 1;
    // The budget: commands an admission tick of a target with one lane costs beyond one
    // without: measured 73 against 48 (the pin, each part's mark and waiting count, the
    // carried shares' GET and SET, the plan's SET, the lane part's admit.lua with its share of
    // the room, and admit_milestones.lua for the whole target).
    const LANE_TICK_EXTRA: u64 = 25;
    let redis = RedisServer::spawn();
    let s = test_settings(Some(&redis));
    let store = open_store(&s);
    let (plain, laned): (QueueTarget, QueueTarget) = ("LIMITED_DROP:8".parse().unwrap(), target());
    store.put_lane(laned, vq::domain::Lane { name: members(), share: 50, opens_before_s: 0 }).await.unwrap();
    for t in [plain, laned] {
        store.enter(t, user(1), &"tok").await.unwrap();
    }
    let mut cost = Vec::new();
    for t in [plain, laned] {
        let mut c = redis.conn().await;
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut c).await.unwrap();
        store.status(t, user(1), &"tok").await.unwrap();
        cost.push(commands(&redis).await);
    }
    assert_eq!(cost[1], cost[0] + LANE_POLL_EXTRA, "poll without lanes {}, with {}", cost[0], cost[1]);
    // A new user's enter: the same one HGET more.
    let mut enter = Vec::new();
    for t in [plain, laned] {
        let mut c = redis.conn().await;
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut c).await.unwrap();
        store.enter(t, user(2), &"tok").await.unwrap();
        enter.push(commands(&redis).await);
    }
    assert_eq!(enter[1], enter[0] + LANE_POLL_EXTRA, "enter without lanes {}, with {}", enter[0], enter[1]);
    // An admission tick (both users of the public lane, the members' lane empty).
    let mut tick = Vec::new();
    for t in [plain, laned] {
        next_tick(s.queue.tick_ms).await;
        tick_room(s.queue.tick_ms, 200).await;
        let mut c = redis.conn().await;
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut c).await.unwrap();
        let a = store.admit_by(t, Users(10), Ms(s.queue.tick_ms), "a").await.unwrap();
        assert_eq!(a.admitted, 2);
        tick.push(commands(&redis).await);
    }
    println!("lane cost: poll {cost:?}, enter {enter:?}, admission tick {tick:?} (without, with one lane)");
    assert!(tick[1] <= tick[0] + LANE_TICK_EXTRA, "a tick without lanes {}, with one lane {}", tick[0], tick[1]);
}

/// `vq lane` refuses what it cannot do with a clear error and a non-zero exit.
#[tokio::test]
async fn vq_lane_refuses_bad_names_shares_and_unknown_lanes() {
    let redis = RedisServer::spawn();
    let run = |args: &[&str]| {
        let mut c = crate::support::vq_command();
        c.arg("lane").args(args).env("VQ_REDIS__URL", redis.url());
        c.output().unwrap()
    };
    for (args, says) in [
        (&["add", "limited-drop:9", "Members", "--share", "70"][..], "not a lane name"),
        (&["add", "limited-drop:9", "members", "--share", "0"][..], "between 1 and 99"),
        (&["add", "limited-drop:9", "members", "--share", "100"][..], "between 1 and 99"),
        (&["remove", "limited-drop:9", "nobody"][..], "has no lane `nobody`"),
        (&["codes", "import", "limited-drop:9", "nobody"][..], "has no lane `nobody`"),
    ] {
        let out = run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert!(run(&["add", "limited-drop:9", "members", "--share", "60"]).status.success());
    let out = run(&["add", "limited-drop:9", "vip", "--share", "40"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("at most 99"));
    let out = run(&["list", "limited-drop:9", "--json"]);
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows[0]["lane"], "public");
    assert_eq!((rows[1]["lane"].as_str(), rows[1]["share"].as_u64()), (Some("members"), Some(60)));
    assert!(run(&["remove", "limited-drop:9", "members"]).status.success());
    // A lane added after the sale was scheduled is scheduled with it (its own opening earlier).
    let opens = vq::domain::format_instant(vq::service::now_epoch_ms() + 3_600_000);
    let opens = format!("{}Z", &opens[..19]);
    let mut c = crate::support::vq_command();
    let out = c
        .args(["sale", "schedule", "limited-drop:9", "--opens-at", &opens])
        .env("VQ_REDIS__URL", redis.url())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run(&["add", "limited-drop:9", "vip", "--share", "20", "--opens-before", "600"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("scheduled with the sale"), "{out:?}");
    let mut conn = redis.conn().await;
    let (public, vip): (Option<u64>, Option<u64>) = redis::pipe()
        .hget(format!("{}sale", prefix("public")), "opens_at")
        .hget(format!("{}sale", prefix("vip")), "opens_at")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(vip, public.map(|p| p - 600_000), "the vip lane opens 10 minutes early");
}

/// `vq lane claim` prints what the shop's side computes: a claim vq verifies for that user.
#[test]
fn vq_lane_claim_prints_a_claim_that_verifies() {
    let redis = RedisServer::spawn();
    let dir = tempfile::tempdir().unwrap();
    let conf = lanes_config(&dir);
    let out = crate::support::vq_command()
        .args(["lane", "--config", &conf, "claim", "limited-drop:9", "members", "--user", "buyer-5"])
        .env("VQ_REDIS__URL", redis.url())
        .env("LANES_TEST_KEY", LANE_KEY)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let claim = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let now = vq::service::now_epoch_ms() / 1000;
    let lane = vq::lane::verify_claim(Some(LANE_KEY.as_bytes()), target(), &user(5), &claim, now);
    assert_eq!(lane, Ok(members()), "{claim}");
}

/// The README's "Presales and lanes" commands, run as written (the `vq serve` they talk to on
/// the test's own port).
#[tokio::test]
async fn the_readmes_presales_and_lanes_commands_run_as_written() {
    let readme = include_str!("../../README.md");
    let section =
        &readme[readme.find("\n### Presales and lanes\n").expect("README has a Presales and lanes section")..];
    let block = section.split("```sh\n").nth(1).and_then(|b| b.split("```").next()).expect("an sh block");
    let redis = RedisServer::spawn();
    let vq = VqProcess::serve(&redis, &[]).await;
    crate::support::flag_on(&redis).await;
    let bin_dir = crate::support::vq_bin().parent().unwrap().to_owned();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let mut outputs = Vec::new();
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let line = line.replace("http://127.0.0.1:8080", &vq.addr);
        let out = std::process::Command::new("bash")
            .args(["-c", &line])
            .env("PATH", &path)
            .env("VQ_REDIS__URL", redis.url())
            .env("VQ_TARGETS__RANGES", crate::support::test_ranges_env())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "`{line}`: {}{text}", String::from_utf8_lossy(&out.stderr));
        outputs.push(text);
    }
    let first: serde_json::Value = serde_json::from_str(&outputs[2]).unwrap();
    assert_eq!((first["status"].as_str(), first["lane"].as_str()), (Some("WAITING"), Some("members")), "{first}");
    let second: serde_json::Value = serde_json::from_str(&outputs[3]).unwrap();
    assert_eq!(second["code"], "LANE_CODE_USED", "{second}");
    assert!(outputs[4].contains("members") && outputs[4].contains("70%"), "{}", outputs[4]);
    assert_eq!(outputs[5].lines().filter(|l| l.contains(" members ")).count(), 2, "{}", outputs[5]);
    assert!(!outputs[5].contains("FAN-7Q2K"), "the codes themselves are never exported");
    let store = open_store(&test_settings(Some(&redis)));
    store.refresh_lanes().await.unwrap();
    let t: QueueTarget = "LIMITED_DROP:42".parse().unwrap();
    let opens: Option<String> = redis::cmd("HGET")
        .arg("queue:{LIMITED_DROP:42~members}:sale")
        .arg("opens_at")
        .query_async(&mut redis.conn().await)
        .await
        .unwrap();
    let public = vq::domain::parse_instant("2026-12-24T10:00:00Z").unwrap();
    assert_eq!(opens, Some((public - 3_600_000).to_string()), "the members' lane opens an hour early");
    assert_eq!(store.lanes_of(t).len(), 1);
    // The sale report gives each lane's own figures.
    let out = crate::support::vq_command()
        .args(["sale", "report", "limited-drop:42", "--json"])
        .env("VQ_REDIS__URL", redis.url())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let lanes: Vec<(&str, u64)> = report["lanes"]
        .as_array()
        .expect("lanes in the report")
        .iter()
        .map(|l| (l["lane"].as_str().unwrap(), l["arrivals"].as_u64().unwrap()))
        .collect();
    assert_eq!(lanes, vec![("public", 0), ("members", 1)], "{report}");
    assert_eq!(report["totals"]["arrivals"], 1);
}

/// The stats endpoint gives each lane's figures (the target's adding them up) and `/metrics`
/// a `lane` label, only for the target with lanes.
#[tokio::test]
async fn stats_and_metrics_show_each_lane_only_where_lanes_exist() {
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    with_members(&mut s, 0);
    let store = open_store(&s);
    let app = crate::support::spawn_app(s, false).await;
    crate::support::flag_on(&redis).await;
    store.import_codes(target(), members(), &[vq::lane::code_hash(target(), "M")], 2).await.unwrap();
    for u in 1..=3 {
        assert_eq!(app.enter("limited-drop/9", u).await.status(), 200);
    }
    for u in 4..=5 {
        let r = app
            .client
            .post(app.url(ENTRIES))
            .header("X-User-Id", u.to_string())
            .json(&serde_json::json!({"laneCode": "M"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    assert_eq!(app.enter("ticketing-event/9", 1).await.status(), 200);
    let stats: serde_json::Value =
        app.client.get(app.url("/virtual-queues/limited-drop/9/stats")).send().await.unwrap().json().await.unwrap();
    assert_eq!(stats["waitingCount"], 5, "{stats}");
    let lanes: Vec<(String, u64, u64)> = stats["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (l["lane"].as_str().unwrap().to_owned(), l["share"].as_u64().unwrap(), l["waitingCount"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(lanes, vec![("public".to_owned(), 30, 3), ("members".to_owned(), 70, 2)]);
    let other: serde_json::Value =
        app.client.get(app.url("/virtual-queues/ticketing-event/9/stats")).send().await.unwrap().json().await.unwrap();
    assert!(other.get("lanes").is_none(), "a type without lanes shows none: {other}");
    let metrics = app.client.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("virtual_queue_lane_length{target=\"LIMITED_DROP:9\",lane=\"members\"} 2"), "{metrics}");
    assert!(metrics.contains("virtual_queue_lane_length{target=\"LIMITED_DROP:9\",lane=\"public\"} 3"));
    assert!(!metrics.contains("lane_length{target=\"TICKETING_EVENT:9\""), "no lane label without lanes");
}

/// A lane's buyer is admitted in their lane, gets one token (whichever store asks), and the
/// gate claims it once; two pumps racing a target with lanes admit at most the batch a tick.
#[tokio::test]
async fn a_lanes_buyer_gets_one_token_that_buys_once_and_two_pumps_admit_at_most_the_batch() {
    let redis = Redis::Server(RedisServer::spawn());
    let mut s = redis.settings();
    with_members(&mut s, 0);
    let (a, b) = (open_store(&s), open_store(&s));
    enter_in(&a, LaneName::PUBLIC, 1..=30).await;
    enter_in(&a, members(), 101..=130).await;
    let tick_ms = s.queue.tick_ms;
    let mut admitted = 0;
    for _ in 0..3 {
        next_tick(tick_ms).await;
        tick_room(tick_ms, 200).await;
        let (x, y) = tokio::join!(
            a.admit_by(target(), Users(10), Ms(tick_ms), "a"),
            b.admit_by(target(), Users(10), Ms(tick_ms), "b")
        );
        let n = x.unwrap().admitted + y.unwrap().admitted;
        assert!(n <= 10, "at most the batch a tick across lanes: {n}");
        admitted += n;
    }
    assert_eq!(admitted, 30);
    assert_eq!(marks(&a).await, (21, 9), "3 + 7 a tick");
    let vq::store::StatusOutcome::Admitted(token) = a.status(target(), user(101), &"token-a").await.unwrap() else {
        panic!("member 101 admitted")
    };
    let EnterOutcome::Admitted(again) = b.enter(target(), user(101), &"token-b").await.unwrap() else { panic!() };
    assert_eq!(again, token, "one token");
    let limits = vq::domain::PurchaseLimits::default();
    let first = b.claim_token(target(), user(101), &token, 300, limits).await.unwrap();
    assert!(matches!(first, vq::store::TokenClaim::Claimed { .. }), "{first:?}");
    let second = a.claim_token(target(), user(101), &token, 300, limits).await.unwrap();
    assert_eq!(second, vq::store::TokenClaim::AlreadyUsed);
    let held: Option<String> =
        redis.query(redis::cmd("GET").arg(format!("{}token:{}", prefix("members"), user(101)))).await;
    assert!(held.is_some(), "the token is kept in the lane's part");
}
