//! A target type added in configuration alone gets its queue, pump, tokens and its own gated
//! route; a type nobody configured is unknown.

use std::time::Duration;

use redis::AsyncCommands;

use super::{cli, keyspace, stderr};
use crate::support::{RedisServer, flag_on, spawn_app, test_settings};

/// A shop adds a kind of sale in configuration alone: `flash-coupon`, with its own gated
/// route, batch and capacity. Its queue, pump, tokens and gate work as the shipped types' do;
/// its token buys nothing on another type's route; a well-formed type nobody configured is
/// as unknown as an undeclared target, and its runtime declaration is refused.
#[tokio::test]
async fn a_type_added_in_configuration_gets_its_queue_and_its_own_gated_route() {
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    s.targets.types.push(vq::config::TargetTypeSettings {
        slug: "flash-coupon".into(),
        batch_size: Some(2),
        max_capacity: Some(5),
        outflow: None,
        batch_min: None,
        batch_max: None,
        max_active: None,
        purchases_per_admission: None,
        purchases_per_user: None,
        shards: None,
        lanes: Vec::new(),
        lane_secret_env: None,
    });
    s.targets.declared = vec!["flash-coupon:7".into()];
    s.gate.routes.push(vq::gate::GateRoute {
        method: "POST".into(),
        path: "/coupons/{couponId}/claim".into(),
        target: "flash-coupon".into(),
    });
    s.gate.upstream = Some(crate::gate::spawn_echo().await);
    let app = spawn_app(s.clone(), true).await;
    flag_on(&redis).await;

    // Capacity 5: the sixth buyer finds the queue full. The six enter within one tick, so the
    // pump (running) admits none of them in between and frees no room.
    crate::support::tick_room(s.queue.tick_ms, s.queue.tick_ms * 3 / 4).await;
    for user in 1..=5 {
        assert_eq!(app.json(app.enter("flash-coupon/7", user).await).await["status"], "WAITING", "user {user}");
    }
    let full = app.enter("flash-coupon/7", 6).await;
    assert_eq!(full.status(), 429);
    assert_eq!(app.json(full).await["code"], "QUEUE_FULL");
    let stats = app.json(app.client.get(app.url("/virtual-queues/flash-coupon/7/stats")).send().await.unwrap()).await;
    assert_eq!((stats["batchSize"].as_u64(), stats["maxCapacity"].as_u64()), (Some(2), Some(5)), "{stats}");
    let waiting: u64 = redis.conn().await.zcard("queue:{FLASH_COUPON:7}:waiting").await.unwrap();
    assert_eq!(waiting, 5);

    // The pump admits two per tick (500 ms): users 1 and 2 first, user 3 not in that tick.
    let mut token = None;
    for _ in 0..40 {
        let v = app.json(app.poll("flash-coupon/7", 1).await).await;
        if v["status"] == "ADMITTED" {
            token = v["entryToken"].as_str().map(str::to_owned);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let token = token.expect("user 1 admitted");
    let mark: u64 = redis.conn().await.get("queue:{FLASH_COUPON:7}:admitted_count").await.unwrap();
    assert_eq!(mark % 2, 0, "admitted in batches of 2, mark {mark}");

    let claim = |path: &str, user: &str, token: Option<&str>| {
        let mut r = app.client.post(app.url(path)).header("X-User-Id", user);
        if let Some(t) = token {
            r = r.header("X-Entry-Token", t);
        }
        r.send()
    };
    // Its own gated route: without a token refused, with it forwarded once.
    let resp = claim("/coupons/7/claim", "1", None).await.unwrap();
    assert_eq!(resp.status(), 403);
    assert_eq!(app.json(resp).await["code"], "QUEUE_BYPASS_DENIED");
    let resp = claim("/coupons/7/claim", "1", Some(&token)).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(app.json(resp).await["path"], "/coupons/7/claim");
    let again = claim("/coupons/7/claim", "1", Some(&token)).await.unwrap();
    assert_eq!(again.status(), 403, "a token buys once");
    // The coupon's token on a drop's route (id 7 is declared there too): the wrong type.
    let resp = claim("/limited-drops/7/orders", "1", Some(&token)).await.unwrap();
    assert_eq!(resp.status(), 403);
    assert!(app.json(resp).await["detail"].as_str().unwrap().contains("FLASH_COUPON"));

    // The gate counts its refusals in the record once a tick, off the request path: the three
    // above land before the keyspace is compared.
    crate::support::wait_until(Duration::from_secs(10), "the refusals counted", async || {
        let mut c = redis.conn().await;
        let no_token: Option<u64> = c.hget("queue:{FLASH_COUPON:7}:record", "rf:no_valid_token").await.unwrap();
        let used: Option<u64> = c.hget("queue:{FLASH_COUPON:7}:record", "rf:token_used").await.unwrap();
        let drop: Option<u64> = c.hget("queue:{LIMITED_DROP:7}:record", "rf:no_valid_token").await.unwrap();
        no_token.is_some() && used.is_some() && drop.is_some()
    })
    .await;
    // A well-formed type nobody configured: 404 like an undeclared target, nothing written;
    // a malformed one: 400.
    let before = keyspace(&redis).await;
    let resp = app.enter("mega-sale/7", 9).await;
    assert_eq!(resp.status(), 404);
    assert_eq!(app.json(resp).await["code"], "UNKNOWN_TARGET");
    for bad in ["Mega_Sale/7", "mega--sale/7", "-mega/7"] {
        let resp = app.enter(bad, 9).await;
        assert_eq!(resp.status(), 400, "{bad}");
        assert_eq!(app.json(resp).await["code"], "INVALID_REQUEST", "{bad}");
    }
    assert_eq!(keyspace(&redis).await, before, "an unknown type wrote something");

    // The CLI: declaring a target of a type the configuration does not name fails, exit 1.
    let out = cli(&redis, &["target", "add", "mega-sale:7"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("not a configured target type"), "{}", stderr(&out));
    assert_eq!(keyspace(&redis).await, before, "a refused declaration wrote something");
}
