//! The pump: one batch per tick per target, whatever happens to the lock.

use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;
use vq::clock::ManualClock;
use vq::domain::{QueueTarget, UserId};
use vq::pump::Pump;
use vq::store::RedisStore;
use vq::store::prelude::*;

use crate::support::{RedisServer, flag_on, open_store, spawn_app, test_settings, tick_room};

/// The pump's time is its store's: on the embedded store, a step of its clock is a new tick.
#[tokio::test]
async fn a_pump_admits_one_batch_per_tick_of_its_stores_clock() {
    let s = Arc::new(test_settings(None));
    let clock = ManualClock::at_system_now();
    let store = RedisStore::embedded(s.limits(), Arc::new(clock.clone())).expect("embedded store");
    let t: QueueTarget = "limited-drop:1".parse().unwrap();
    for u in 1..=25 {
        store.enter(t, UserId::from(u), &"tok").await.unwrap();
    }
    store.register_active(t).await.unwrap();
    let pump = Pump::new(store.clone(), s.clone(), "p".into());
    let mark = async || {
        pump.tick().await.unwrap();
        store.snapshot(t).await.unwrap().mark
    };
    assert_eq!(mark().await, 10, "one batch");
    assert_eq!(mark().await, 10, "nobody more in the same tick");
    clock.advance(s.queue.tick_ms);
    assert_eq!(mark().await, 20);
    clock.advance(s.queue.tick_ms);
    assert_eq!(mark().await, 25, "the last ones");
}

#[tokio::test]
async fn two_pumps_in_one_tick_admit_one_batch_even_without_the_lock() {
    let redis = RedisServer::spawn();
    let s = Arc::new(test_settings(Some(&redis)));
    let app = spawn_app((*s).clone(), false).await;
    flag_on(&redis).await;
    for u in 1..=50 {
        app.enter("limited-drop/1", u).await;
    }
    let a = Pump::new(open_store(&s), s.clone(), "a".into());
    let b = Pump::new(open_store(&s), s.clone(), "b".into());
    // Both rounds in one tick of Redis' clock, which cannot be stepped: wait for room in it.
    tick_room(s.queue.tick_ms, s.queue.tick_ms / 2).await;
    let first = a.tick().await.unwrap();
    let mut c = redis.conn().await;
    let _: u64 = c.del("queue:admission:{LIMITED_DROP:1}").await.unwrap();
    let second = b.tick().await.unwrap();
    let first = first[0].as_ref().unwrap();
    let second = second[0].as_ref().unwrap();
    assert!(first.locked && second.locked, "b got the deleted lock");
    assert_eq!(first.admit.unwrap().admitted, 10);
    assert!(!second.admit.unwrap().advanced, "admit.lua's tick guard stops the second batch");
    let mark: u64 = c.get("queue:{LIMITED_DROP:1}:admitted_count").await.unwrap();
    assert_eq!(mark, 10);
}

#[tokio::test]
async fn one_broken_target_does_not_stop_the_others() {
    let redis = RedisServer::spawn();
    let s = Arc::new(test_settings(Some(&redis)));
    let app = spawn_app((*s).clone(), false).await;
    flag_on(&redis).await;
    app.enter("limited-drop/1", 1).await;
    app.enter("limited-drop/2", 1).await;
    let mut c = redis.conn().await;
    // Someone overwrote target 1's queue with the wrong type: its scripts fail.
    let _: () = c.set("queue:{LIMITED_DROP:1}:waiting", "oops").await.unwrap();
    let pump = Pump::new(open_store(&s), s.clone(), "p".into());
    let results = pump.tick().await.unwrap();
    assert_eq!(results.len(), 2);
    assert!(results.iter().any(|r| r.is_err()));
    let ok = results.iter().find_map(|r| r.as_ref().ok()).unwrap();
    assert_eq!(ok.target.to_string(), "LIMITED_DROP:2");
    assert_eq!(ok.admit.unwrap().admitted, 1);
}

#[tokio::test]
async fn pump_loop_admits_a_batch_each_tick_and_stops_on_cancel() {
    let redis = RedisServer::spawn();
    let s = test_settings(Some(&redis));
    // Everyone enters before the pump starts (on a loaded machine entering can span a tick,
    // and a tick with fewer than 10 waiting admits them all).
    let entry = spawn_app(s.clone(), false).await;
    flag_on(&redis).await;
    for u in 1..=40 {
        entry.enter("ticketing-event/7", u).await;
    }
    let app = spawn_app(s.clone(), true).await;
    let mut c = redis.conn().await;
    // Until two batches are in (bounded), then: whole batches, each in a tick of its own.
    let started = std::time::Instant::now();
    let mark = loop {
        let mark: u64 = c.get("queue:{TICKETING_EVENT:7}:admitted_count").await.unwrap_or(0);
        if mark >= 20 || started.elapsed() > Duration::from_secs(15) {
            break mark;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    app.stop().await;
    assert!(mark >= 20 && mark.is_multiple_of(10), "whole batches of 10 only: {mark}");
    let log: Vec<String> = c.lrange("queue:{TICKETING_EVENT:7}:admissions", 0, -1).await.unwrap();
    let mut ticks = std::collections::HashSet::new();
    for entry in log.iter().filter(|e| !e.ends_with(":0")) {
        let (tick, n) = entry.split_once(':').unwrap();
        assert!(ticks.insert(tick.to_owned()), "tick {tick} admitted twice: {log:?}");
        assert_eq!(n, "10", "one batch per tick: {log:?}");
    }
    let admitted: u64 = c.get("queue:{TICKETING_EVENT:7}:admitted_count").await.unwrap();
    assert_eq!(admitted, ticks.len() as u64 * 10, "every admission is in the log: {log:?}");
}
