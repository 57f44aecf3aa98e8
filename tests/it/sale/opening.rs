//! The fair opening: the order is the HMAC of the published seed, it happens exactly once
//! under lock loss and racing pumps, and pre-queued users who stop polling are evicted.

use super::*;
use vq::domain::{Ms, Users};

#[tokio::test]
async fn the_opening_order_is_the_hmac_of_the_published_seed_and_later_users_come_after() {
    let redis = RedisServer::spawn();
    let (app, s) = app_on(&redis).await;
    let store = open_store(&s);
    let opens_at = schedule(&store, 1500, Some(-1000), None).await;
    let users: Vec<u64> = (1..=40).map(|u| u * 7919).collect();
    for u in &users {
        assert_eq!(app.json(app.enter(T, *u).await).await["status"], "PRE_QUEUE");
    }
    let before = show_json(&redis);
    assert_eq!(before["state"], "pre-queue");
    let commitment = before["seedCommitment"].as_str().expect("commitment published").to_owned();
    assert!(before.get("seed").is_none() && before.get("prequeued").is_none(), "seed hidden: {before}");

    until(opens_at).await;
    let late = app.json(app.enter(T, 5).await).await;
    assert_eq!(late["position"], 41, "{late}");
    let pump = Pump::new(open_store(&s), s.clone(), "p".into());
    next_tick(s.queue.tick_ms).await;
    let _ = pump.tick().await.unwrap();

    let after = show_json(&redis);
    let seed = unhex(after["seed"].as_str().expect("seed revealed"));
    assert_eq!(lower_hex(&Sha256::digest(&seed)), commitment, "the seed matches the commitment");
    assert_eq!(after["prequeued"], 40);
    assert_eq!(after["seedCommitment"].as_str(), Some(commitment.as_str()));
    let placed = seqs(&redis).await;
    for (i, u) in expected_order(&seed, &users).iter().enumerate() {
        assert_eq!(placed[u], i as u64 + 1, "user {u}");
    }
    assert_eq!(placed[&5], 41);
    // The positions users see are those seqs (beyond the first batch, admitted).
    let last = expected_order(&seed, &users)[39];
    let b = app.json(app.poll(T, last).await).await;
    assert_eq!((b["status"].as_str(), b["position"].as_u64()), (Some("WAITING"), Some(40)), "{b}");
}

#[tokio::test]
async fn the_opening_happens_exactly_once_with_three_instances_losing_the_lock() {
    let redis = RedisServer::spawn();
    let store = open_store(&test_settings(Some(&redis)));
    let envs = [
        ("VQ_QUEUE__TICK_MS", "200".to_owned()),
        ("VQ_QUEUE__BATCH_SIZE", "5".to_owned()),
        ("VQ_FLAG__REFRESH_MS", "100".to_owned()),
    ];
    let procs = three_instances(&redis, &envs).await;
    flag_on(&redis).await;
    // The opening a minute ahead while everyone pre-queues (however slow the machine), then
    // moved to just ahead (rescheduling before the opening keeps the seed).
    schedule(&store, 60_000, Some(-1000), None).await;
    let n: u64 = 2000;
    let users: Vec<u64> = (1..=n).collect();
    // Pre-queue them through all three instances, 8 at a time.
    let client = reqwest::Client::new();
    let mut tasks = tokio::task::JoinSet::new();
    for lane in 0..8u64 {
        let addrs: Vec<String> = procs.iter().map(|p| p.addr.clone()).collect();
        let client = client.clone();
        tasks.spawn(async move {
            for u in (1..=n).filter(|u| u % 8 == lane) {
                let addr = &addrs[(u % 3) as usize];
                let r = client
                    .post(format!("{addr}/virtual-queues/{T}/entries"))
                    .header("X-User-Id", u.to_string())
                    .send()
                    .await
                    .unwrap();
                let b: Value = r.json().await.unwrap();
                assert_eq!(b["status"], "PRE_QUEUE", "user {u}: {b}");
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    schedule(&store, 1000, Some(-1000), None).await;
    // Every instance may take the lock in every tick.
    let lock_thief = {
        let mut c = redis.conn().await;
        tokio::spawn(async move {
            loop {
                let _: Result<u64, _> = c.del("queue:admission:{LIMITED_DROP:7}").await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let mut c = redis.conn().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let opened: bool = c.hexists(format!("{P}sale"), "opened_at").await.unwrap();
        if opened {
            break;
        }
        assert!(Instant::now() < deadline, "the sale did not open");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A few more ticks with the lock stolen: nothing is placed again.
    tokio::time::sleep(Duration::from_millis(600)).await;
    lock_thief.abort();
    drop(procs);

    let seed = unhex(show_json(&redis)["seed"].as_str().unwrap());
    let placed = seqs(&redis).await;
    assert_eq!(placed.len() as u64, n, "every pre-queued user placed, once");
    let distinct: HashSet<u64> = placed.values().copied().collect();
    assert_eq!(distinct.len() as u64, n, "no seq given twice");
    assert!(placed.values().all(|s| (1..=n).contains(s)), "positions 1..N");
    for (i, u) in expected_order(&seed, &users).iter().enumerate() {
        assert_eq!(placed[u], i as u64 + 1, "user {u}");
    }
    let seq: u64 = c.get(format!("{P}seq")).await.unwrap();
    assert_eq!(seq, n, "the counter moved past N once");
    let ledger = store.sale_ledger(target()).await.unwrap();
    let openings = ledger.iter().filter(|e| matches!(e, vq::domain::LedgerEntry::Opening { .. })).count();
    assert_eq!(openings, 1, "one opening in the ledger");
    let departed: u64 = c.zcard(format!("{P}departed")).await.unwrap();
    assert_eq!(departed, 0);
}

#[tokio::test]
async fn the_opening_happens_exactly_once_with_pumps_racing_in_every_tick() {
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    s.queue.tick_ms = 200;
    let s = Arc::new(s);
    let app = spawn_app((*s).clone(), false).await;
    flag_on(&redis).await;
    let store = open_store(&s);
    // A minute ahead while everyone pre-queues, then just ahead (the seed is kept).
    schedule(&store, 60_000, Some(-1000), None).await;
    let n: u64 = 2000;
    let mut tasks = tokio::task::JoinSet::new();
    for lane in 0..8u64 {
        let (client, url) = (app.client.clone(), app.url(&format!("/virtual-queues/{T}/entries")));
        tasks.spawn(async move {
            for u in (1..=n).filter(|u| u % 8 == lane) {
                let r = client.post(&url).header("X-User-Id", u.to_string()).send().await.unwrap();
                assert_eq!(r.json::<Value>().await.unwrap()["status"], "PRE_QUEUE");
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let opens_at = schedule(&store, 1000, Some(-1000), None).await;
    until(opens_at).await;
    // Three pumps tick back to back (not aligned to ticks), the lock is deleted every 20 ms,
    // and new users enter meanwhile, for a second and a half.
    let stop = now_ms() + 1500;
    let mut racers = tokio::task::JoinSet::new();
    for name in ["a", "b", "c"] {
        let pump = Pump::new(open_store(&s), s.clone(), name.into());
        racers.spawn(async move {
            while now_ms() < stop {
                let _ = pump.tick().await;
            }
        });
    }
    let mut c = redis.conn().await;
    racers.spawn(async move {
        while now_ms() < stop {
            let _: Result<u64, _> = c.del("queue:admission:{LIMITED_DROP:7}").await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let (client, url) = (app.client.clone(), app.url(&format!("/virtual-queues/{T}/entries")));
    racers.spawn(async move {
        for u in n + 1..=n + 50 {
            client.post(&url).header("X-User-Id", u.to_string()).send().await.unwrap();
        }
    });
    while let Some(r) = racers.join_next().await {
        r.unwrap();
    }
    let seed = unhex(show_json(&redis)["seed"].as_str().expect("opened"));
    let placed = seqs(&redis).await;
    let users: Vec<u64> = (1..=n).collect();
    for (i, u) in expected_order(&seed, &users).iter().enumerate() {
        assert_eq!(placed.get(u), Some(&(i as u64 + 1)), "pre-queued user {u}");
    }
    let mut late: Vec<u64> = (n + 1..=n + 50).map(|u| placed[&u]).collect();
    late.sort();
    assert_eq!(late, (n + 1..=n + 50).collect::<Vec<_>>(), "later users after the pre-queued, without gaps");
    let distinct: HashSet<u64> = placed.values().copied().collect();
    assert_eq!(distinct.len(), placed.len(), "no seq given twice");
    let ledger = store.sale_ledger(target()).await.unwrap();
    let openings = ledger.iter().filter(|e| matches!(e, vq::domain::LedgerEntry::Opening { .. })).count();
    assert_eq!(openings, 1, "one opening in the ledger");
}

/// An opening larger than one read and one placement call: the frozen pre-queue is read in
/// slices of `OPENING_READ_SLICE` and placed in calls of `OPENING_CHUNK`, in the order the
/// published seed gives.
#[tokio::test]
async fn a_large_opening_is_read_and_placed_in_bounded_calls_in_the_seeds_order() {
    use vq::pump::OPENING_CHUNK;
    use vq::store::slices::OPENING_READ_SLICE;
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    s.queue.tick_ms = 1000;
    let s = Arc::new(s);
    let store = open_store(&s);
    let opens_at = schedule(&store, 1500, Some(-1000), None).await;
    let n = 2 * OPENING_READ_SLICE + OPENING_CHUNK as u64 / 2;
    let users: Vec<u64> = (1..=n).map(|u| u * 7919).collect();
    let mut c = redis.conn().await;
    // Pre-queued straight into Redis (as enter.lua does: arrival -> user, and a heartbeat).
    let far = now_ms() + 3_600_000;
    for part in users.chunks(1000) {
        let arrivals: Vec<(u64, u64)> = part.iter().map(|u| (now_ms(), *u)).collect();
        let beats: Vec<(u64, u64)> = part.iter().map(|u| (far, *u)).collect();
        let _: u64 = c.zadd_multiple(format!("{P}prequeue"), &arrivals).await.unwrap();
        let _: u64 = c.zadd_multiple(format!("{P}heartbeat"), &beats).await.unwrap();
    }
    let _: () = c.set(format!("{P}seq"), 0).await.unwrap();
    let _: u64 = c.sadd("queue:active", "LIMITED_DROP:7").await.unwrap();
    let commitment = show_json(&redis)["seedCommitment"].as_str().expect("commitment").to_owned();

    until(opens_at).await;
    let pump = Pump::new(open_store(&s), s.clone(), "p".into());
    crate::support::tick_room(s.queue.tick_ms, s.queue.tick_ms / 2).await;
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut c).await.unwrap();
    let _ = pump.tick().await.unwrap();
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut c).await.unwrap();
    let calls = |name: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:calls="))?.split(',').next()?.parse().ok())
            .unwrap_or(0)
    };
    assert_eq!(calls("zrange"), n.div_ceil(OPENING_READ_SLICE), "the frozen set read in slices");
    // sale_place.lua looks each chunk up with three ZMSCOREs (and nothing else in the tick does).
    assert_eq!(calls("zmscore"), 3 * n.div_ceil(OPENING_CHUNK as u64), "placed in chunks");

    let after = show_json(&redis);
    let seed = unhex(after["seed"].as_str().expect("seed revealed"));
    assert_eq!(lower_hex(&Sha256::digest(&seed)), commitment);
    assert_eq!(after["prequeued"], n);
    let placed = seqs(&redis).await;
    assert_eq!(placed.len() as u64, n);
    for (i, u) in expected_order(&seed, &users).iter().enumerate() {
        assert_eq!(placed[u], i as u64 + 1, "user {u}");
    }
    let mark: u64 = c.get(format!("{P}admitted_count")).await.unwrap();
    assert_eq!(mark, s.queue.batch_size, "the opening's tick admits one batch");
}

#[tokio::test]
async fn pre_queued_users_who_stop_polling_are_evicted_before_and_after_the_opening() {
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    s.queue.heartbeat_timeout_s = 1;
    s.queue.key_ttl_s = 60;
    s.queue.batch_size = 1;
    let s = Arc::new(s);
    let app = spawn_app((*s).clone(), false).await;
    flag_on(&redis).await;
    let store = open_store(&s);
    let opens_at = schedule(&store, 2500, Some(-1000), None).await;
    for u in 1..=6 {
        app.enter(T, u).await;
    }
    let pump = Pump::new(open_store(&s), s.clone(), "p".into());
    // Users 1..=4 keep polling; 5 and 6 stop and are evicted from the pre-queue.
    let mut c = redis.conn().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        for u in 1..=4 {
            app.poll(T, u).await;
        }
        let _ = pump.tick().await;
        let left: u64 = c.zcard(format!("{P}prequeue")).await.unwrap();
        if left == 4 {
            break;
        }
        assert!(Instant::now() < deadline, "the silent users were not evicted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(app.poll(T, 5).await.status(), 404, "an evicted pre-queued user is unknown");
    // At the opening users 1..=4 are frozen; 3 and 4 stop polling and are evicted before the
    // pump writes the order: their seqs become departed, so aheadCount stays exact.
    until(opens_at).await;
    let late = app.json(app.enter(T, 50).await).await;
    assert_eq!(late["position"], 5, "after the 4 pre-queued: {late}");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        for u in [1, 2, 50] {
            app.poll(T, u).await;
        }
        store.evict(target(), Ms(1000), Users(1000)).await.unwrap();
        let alive: Vec<Option<f64>> =
            redis::cmd("ZMSCORE").arg(format!("{P}heartbeat")).arg(3).arg(4).query_async(&mut c).await.unwrap();
        if alive.iter().all(Option::is_none) {
            break;
        }
        assert!(Instant::now() < deadline, "users 3 and 4 were not evicted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let seq_before: u64 = c.get(format!("{P}seq")).await.unwrap();
    assert_eq!(seq_before, 5);
    let _ = pump.tick().await.unwrap();
    let placed = seqs(&redis).await;
    assert!(placed.contains_key(&1) && placed.contains_key(&2), "{placed:?}");
    assert!(!placed.contains_key(&3) && !placed.contains_key(&4), "{placed:?}");
    // The evicted users' seqs are departed (those the mark passed are dropped with it).
    let mark: u64 = c.get(format!("{P}admitted_count")).await.unwrap();
    let departed: Vec<u64> = c.zrange(format!("{P}departed"), 0, -1).await.unwrap();
    let live: HashSet<u64> = placed.values().copied().collect();
    let unplaced: Vec<u64> = (1..=4).filter(|s| !live.contains(s) && *s > mark).collect();
    assert_eq!(departed, unplaced, "mark {mark}, placed {placed:?}");
    // One user admitted (batch 1): the other live pre-queued user is the only one ahead of 50.
    let b = app.json(app.poll(T, 50).await).await;
    assert_eq!((b["status"].as_str(), b["aheadCount"].as_u64()), (Some("WAITING"), Some(1)), "{b}");
}

#[test]
fn the_cli_refuses_bad_schedules_with_a_clear_message() {
    let redis = RedisServer::spawn();
    let future = vq::domain::format_instant(now_ms() + 3_600_000);
    let later = vq::domain::format_instant(now_ms() + 7_200_000);
    let cases: [(&[&str], &str); 6] = [
        (&["sale", "schedule", "limited-drop:7", "--opens-at", "tomorrow"], "not an ISO-8601 time"),
        (&["sale", "schedule", "limited-drop:7", "--opens-at", "2020-01-01T00:00:00Z"], "in the past"),
        (
            &["sale", "schedule", "limited-drop:7", "--opens-at", &future, "--prequeue-from", &later],
            "not before opens-at",
        ),
        (&["sale", "schedule", "limited-drop:7", "--opens-at", &later, "--closes-at", &future], "not after opens-at"),
        (&["sale", "schedule", "nonsense:7", "--opens-at", &future], "`nonsense` is not a configured target type"),
        (&["sale", "schedule", "Nonsense:7", "--opens-at", &future], "is not a target type"),
    ];
    for (args, expected) in cases {
        let out = cli(&redis, args);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr(&out).contains(expected), "{args:?}: {}", stderr(&out));
    }
    let out = cli(&redis, &["sale", "show", "limited-drop:7"]);
    assert!(!out.status.success() && stderr(&out).contains("has no sale"), "{}", stderr(&out));
    let out = cli(&redis, &["sale", "schedule", "limited-drop:7", "--opens-at", &future]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("seed commitment"), "{}", stdout(&out));
}

#[tokio::test]
async fn scheduling_again_before_the_opening_keeps_the_seed_and_after_it_is_refused() {
    let redis = RedisServer::spawn();
    let store = open_store(&test_settings(Some(&redis)));
    schedule(&store, 400, None, None).await;
    let first = show_json(&redis)["seedCommitment"].clone();
    let opens_at = schedule(&store, 300, None, None).await;
    assert_eq!(show_json(&redis)["seedCommitment"], first, "the published commitment stays valid");
    until(opens_at).await;
    // The first enter at or after the opening freezes the (empty) pre-queue.
    let s = Arc::new(test_settings(Some(&redis)));
    let app = spawn_app((*s).clone(), false).await;
    flag_on(&redis).await;
    app.enter(T, 1).await;
    let s2 = SaleSchedule { opens_at_ms: now_ms() + 10_000, prequeue_from_ms: None, closes_at_ms: None };
    assert!(matches!(store.schedule_sale(target(), s2, [1; 32]).await.unwrap(), ScheduleOutcome::AlreadyOpened { .. }));
    assert!(store.control_sale(target(), SaleControl::Clear).await.unwrap());
    let b = app.json(app.enter(T, 2).await).await;
    assert_eq!(b["status"], "WAITING", "cleared: always open");
}
