//! vq's scripts as Redis functions (`src/store/redis/scripts.rs`): one library, loaded on a
//! node when a call finds it missing (first use, a restart without persistence, `FUNCTION
//! FLUSH`), and EVALSHA where Redis refuses functions.

use std::sync::Arc;
use std::time::Duration;

use vq::domain::{QueueTarget, UserId};
use vq::store::prelude::*;
use vq::store::{AnyStore, EnterOutcome, StatusOutcome};

use crate::support::{RedisServer, function_libraries, open_store, test_settings, wait_until};

fn target() -> QueueTarget {
    "limited-drop:1".parse().expect("target")
}

/// The function libraries the server holds, by name.
async fn libraries(redis: &RedisServer) -> Vec<String> {
    function_libraries(&mut redis.conn().await).await
}

/// Calls of `command` (`commandstats` name: `fcall`, `evalsha`, `function|load`) since start.
async fn calls(redis: &RedisServer, command: &str) -> u64 {
    let mut c = redis.conn().await;
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut c).await.expect("commandstats");
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

async fn enter_waits(store: &AnyStore, user: u64) -> u64 {
    match store.enter(target(), UserId::from(user), &"tok").await {
        Ok(EnterOutcome::Waiting(w)) => w.seq,
        other => panic!("user {user}: {other:?}"),
    }
}

async fn poll_waits(store: &AnyStore, user: u64) {
    match store.status(target(), UserId::from(user), &"tok").await {
        Ok(StatusOutcome::Waiting(_)) => {}
        other => panic!("user {user}: {other:?}"),
    }
}

/// One library, `vq_<hash>`, holding every script as `vq_<hash>_<script>`: the calls are
/// FCALLs, none an EVALSHA.
#[tokio::test]
async fn scripts_run_as_functions_of_one_library_named_by_a_hash() {
    let redis = RedisServer::spawn();
    let store = open_store(&test_settings(Some(&redis)));
    assert_eq!(enter_waits(&store, 1).await, 1);
    poll_waits(&store, 1).await;
    let libs = libraries(&redis).await;
    assert_eq!(libs.len(), 1, "{libs:?}");
    let hash = libs[0].strip_prefix("vq_").expect("vq_<hash>");
    assert!(hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()), "{libs:?}");
    let mut c = redis.conn().await;
    let list: redis::Value =
        redis::cmd("FUNCTION").arg("LIST").arg("LIBRARYNAME").arg(&libs[0]).query_async(&mut c).await.unwrap();
    let text = format!("{list:?}");
    for script in ["enter", "status", "admit", "user_hold", "events_lease", "token_claim"] {
        assert!(text.contains(&format!("{}_{script}", libs[0])), "{script} missing: {text}");
    }
    assert!(calls(&redis, "fcall").await >= 2);
    assert_eq!(calls(&redis, "evalsha").await, 0);
}

/// Redis restarted without persistence holds no function: the next calls load the library
/// and go on.
#[tokio::test]
async fn a_redis_restarted_mid_run_gets_the_library_again_and_calls_go_on() {
    let mut redis = RedisServer::spawn();
    let port = redis.port;
    let store = open_store(&test_settings(Some(&redis)));
    assert_eq!(enter_waits(&store, 1).await, 1);
    redis.kill();
    let redis = RedisServer::spawn_on(port);
    wait_until(Duration::from_secs(10), "the store reconnects", async || store.ping().await.is_ok()).await;
    assert!(libraries(&redis).await.is_empty());
    // Every call from here on succeeds, the first one loading the library.
    // (Its seqs start past those this instance saw: `fence.rs`.)
    let seq = enter_waits(&store, 1).await;
    assert_eq!(enter_waits(&store, 2).await, seq + 1);
    poll_waits(&store, 1).await;
    assert_eq!(libraries(&redis).await.len(), 1);
    assert_eq!(calls(&redis, "function|load").await, 1);
    assert_eq!(calls(&redis, "evalsha").await, 0);
}

/// `FUNCTION FLUSH` while enters and polls run: none fails, each node-less call loads the
/// library (concurrent loads find it there) and runs again (a call that finds it flushed again
/// after each of its loads runs once as EVALSHA); once the flushes stop, calls are FCALLs.
#[tokio::test]
async fn function_flush_mid_run_fails_no_call() {
    let redis = RedisServer::spawn();
    let store = Arc::new(open_store(&test_settings(Some(&redis))));
    let tasks: Vec<_> = (0..8u64)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..60u64 {
                    let user = 1000 * (t + 1) + i;
                    enter_waits(&store, user).await;
                    poll_waits(&store, user).await;
                }
            })
        })
        .collect();
    let mut c = redis.conn().await;
    let mut flushes = 0;
    while !tasks.iter().all(|t| t.is_finished()) {
        let _: () = redis::cmd("FUNCTION").arg("FLUSH").query_async(&mut c).await.expect("flush");
        flushes += 1;
        // As fast as one connection flushes: calls find the library gone between their load
        // and their run again, often.
        tokio::task::yield_now().await;
    }
    for task in tasks {
        task.await.expect("no call failed");
    }
    assert!(flushes >= 2, "flushed while the calls ran");
    assert!(calls(&redis, "function|load").await >= 2, "loaded again after a flush");
    // No lasting switch to EVALSHA: the next calls are FCALLs of the loaded library.
    let (evalsha, fcall) = (calls(&redis, "evalsha").await, calls(&redis, "fcall").await);
    enter_waits(&store, 99_999).await;
    poll_waits(&store, 99_999).await;
    assert_eq!(calls(&redis, "evalsha").await, evalsha);
    assert!(calls(&redis, "fcall").await >= fcall + 2);
}

/// A Redis that refuses functions (an ACL: one user without `FUNCTION`, so the library cannot
/// be loaded; one without `FCALL` either) gets every script as EVALSHA, and vq works.
#[tokio::test]
async fn where_redis_refuses_functions_scripts_go_as_evalsha() {
    let redis = RedisServer::spawn();
    let mut c = redis.conn().await;
    for (user, rules) in [("noload", "-function"), ("nofcall", "-function -fcall -fcall_ro")] {
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER").arg(user).arg("on").arg(">pw").arg("~*").arg("&*").arg("+@all");
        for rule in rules.split(' ') {
            cmd.arg(rule);
        }
        let _: () = cmd.query_async(&mut c).await.expect("acl setuser");
    }
    for (n, user) in ["noload", "nofcall"].into_iter().enumerate() {
        let mut settings = test_settings(Some(&redis));
        settings.redis.url = format!("redis://{user}:pw@127.0.0.1:{}", redis.port).into();
        let store = open_store(&settings);
        let before = calls(&redis, "evalsha").await;
        let first = 10 * n as u64;
        for u in first + 1..=first + 3 {
            enter_waits(&store, u).await;
            poll_waits(&store, u).await;
        }
        // Once refused, scripts go straight to EVALSHA: one FCALL tried, per connection.
        assert!(calls(&redis, "evalsha").await >= before + 6, "{user}");
        assert!(libraries(&redis).await.is_empty(), "{user}");
    }
}

/// A Redis without the commands (as before 7.0: "unknown command"): the same.
#[tokio::test]
async fn where_redis_has_no_functions_scripts_go_as_evalsha() {
    let redis = RedisServer::spawn_with(&["--rename-command", "FCALL", "", "--rename-command", "FUNCTION", ""]);
    let store = open_store(&test_settings(Some(&redis)));
    for u in 1..=3 {
        assert_eq!(enter_waits(&store, u).await, u);
        poll_waits(&store, u).await;
    }
    assert!(calls(&redis, "evalsha").await >= 6);
}
