//! Many targets: one buyer holds a place in at most `queue.max_queues_per_user` queues, and
//! the pump's round over 1,000 declared targets (a measurement, run by hand).

use std::sync::Arc;

use redis::AsyncCommands;

use crate::support::{RedisServer, flag_on, open_store, spawn_app, test_settings};

/// One buyer holds a place in at most `queue.max_queues_per_user` queues at once: past it an
/// enter answers 409 TOO_MANY_QUEUES naming their queues and writes nothing, also when all
/// their enters race; re-entering a queue they wait in is no new place; leaving one, or
/// being admitted from one, frees a place. On both stores.
#[tokio::test]
async fn a_buyer_waits_in_at_most_max_queues_per_user_queues() {
    let redis = RedisServer::spawn();
    for mut s in [test_settings(Some(&redis)), test_settings(None)] {
        s.queue.max_queues_per_user = 3;
        let store = s.store.clone();
        let app = crate::support::spawn_app_flag_on(s.clone(), false).await;
        let status = async |target: &str, user: u64| {
            let r = app.enter(target, user).await;
            let code = r.status().as_u16();
            let v = app.json(r).await;
            (code, v["status"].as_str().or(v["code"].as_str()).unwrap_or("").to_owned(), v)
        };
        for id in 1..=3 {
            assert_eq!(status(&format!("limited-drop/{id}"), 7).await.1, "WAITING", "{store:?} target {id}");
        }
        let (code, what, v) = status("ticketing-event/4", 7).await;
        assert_eq!((code, what.as_str()), (409, "TOO_MANY_QUEUES"), "{store:?}: {v}");
        let detail = v["detail"].as_str().unwrap();
        for named in ["limited-drop/1", "limited-drop/2", "limited-drop/3", "leave one"] {
            assert!(detail.contains(named), "{store:?}: {detail}");
        }
        assert_eq!(status("limited-drop/2", 7).await.1, "WAITING", "{store:?}: re-entering is no new place");
        assert_eq!(status("ticketing-event/4", 8).await.1, "WAITING", "{store:?}: another buyer");
        let gone = app.client.delete(app.url("/virtual-queues/limited-drop/1/entries/me")).header("X-User-Id", "7");
        assert_eq!(gone.send().await.unwrap().status(), 204);
        assert_eq!(status("ticketing-event/4", 7).await.1, "WAITING", "{store:?}: a place left is free");
        assert_eq!(status("limited-drop/5", 7).await.1, "TOO_MANY_QUEUES", "{store:?}");

        // An attacker's enters to 20 targets at once: 3 places, whichever wins.
        let mut enters = tokio::task::JoinSet::new();
        for id in 21..=40 {
            let req = app.client.post(app.url(&format!("/virtual-queues/limited-drop/{id}/entries")));
            enters.spawn(req.header("X-User-Id", "9").send());
        }
        let mut tally = std::collections::BTreeMap::<u16, u32>::new();
        while let Some(r) = enters.join_next().await {
            *tally.entry(r.unwrap().unwrap().status().as_u16()).or_default() += 1;
        }
        assert_eq!(tally, [(200, 3), (409, 17)].into(), "{store:?}");
        app.stop().await;
    }

    // Admitted from a queue (Redis: the test admits by hand, the pump being off), the buyer
    // may join another once the token is collected.
    let mut s = test_settings(Some(&redis));
    s.queue.max_queues_per_user = 1;
    let app = spawn_app(s.clone(), false).await;
    assert_eq!(app.json(app.enter("limited-drop/60", 11).await).await["status"], "WAITING");
    assert_eq!(app.enter("limited-drop/61", 11).await.status(), 409);
    crate::support::next_tick(s.queue.tick_ms).await;
    vq::store::QueueOps::admit(
        &open_store(&s),
        "limited-drop:60".parse().unwrap(),
        vq::domain::Users(10),
        vq::domain::Ms(s.queue.tick_ms),
    )
    .await
    .unwrap();
    assert_eq!(app.enter("limited-drop/61", 11).await.status(), 409, "admitted, not yet told: still a place");
    assert_eq!(app.json(app.poll("limited-drop/60", 11).await).await["status"], "ADMITTED");
    assert_eq!(app.json(app.enter("limited-drop/61", 11).await).await["status"], "WAITING", "told: the place is free");
}

/// The pump's work per tick for 1,000 declared targets, 5 with queues: run by hand with
/// `cargo nextest run --run-ignored only -E 'test(/measure_pump_round/)' --no-capture`.
#[tokio::test]
#[ignore = "a measurement, not a check"]
async fn measure_pump_round_for_1000_declared_targets() {
    let redis = RedisServer::spawn();
    let mut settings = test_settings(Some(&redis));
    settings.queue.max_targets = 1000;
    settings.targets.ranges = vec!["limited-drop:1-1000".into()];
    let store = open_store(&settings);
    let pump = vq::pump::Pump::new(store.clone(), Arc::new(settings.clone()), "measure".into());
    let app = spawn_app(settings.clone(), false).await;
    flag_on(&redis).await;
    // Five real queues of 100 users each.
    for id in 1..=5 {
        for user in 1..=100 {
            app.enter(&format!("limited-drop/{id}"), user).await;
        }
    }
    let (redis, tick_ms) = (&redis, settings.queue.tick_ms);
    let rounds = |label: &'static str| {
        let pump = &pump;
        async move {
            let mut took = Vec::new();
            for _ in 0..10 {
                crate::support::next_tick(tick_ms).await;
                let started = std::time::Instant::now();
                let round = pump.tick().await.expect("tick");
                took.push(started.elapsed());
                assert!(round.iter().all(Result::is_ok));
            }
            took.sort();
            let targets: u64 = redis.conn().await.scard("queue:active").await.unwrap();
            eprintln!(
                "{label}: {targets} targets in queue:active, pump round median {:?}, max {:?}",
                took[took.len() / 2],
                took[took.len() - 1]
            );
        }
    };
    rounds("1,000 declared, 5 active").await;
    // Every other declared target entered once (idle since): within queue.key_ttl_s they stay
    // in queue:active, the worst case for 1,000 declared targets.
    for id in 6..=1000 {
        app.enter(&format!("limited-drop/{id}"), 1).await;
    }
    rounds("1,000 declared, all entered once, 5 with queues").await;
}
