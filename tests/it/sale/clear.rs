//! `vq sale clear` keeps the places of users who lined up: refused while the pre-queue holds
//! users unless `--force`; and every sale command names its target positionally or with
//! `--target`, as `vq flag`, `batch` and `stats` do.

use super::*;

#[tokio::test]
async fn clear_is_refused_while_users_are_pre_queued_unless_forced() {
    let redis = RedisServer::spawn();
    let (app, _s) = app_on(&redis).await;
    let store = open_store(&test_settings(Some(&redis)));
    schedule(&store, 600_000, Some(-1000), None).await;
    for u in 1..=3 {
        let b = app.json(app.enter(T, u).await).await;
        assert_eq!(b["status"], "PRE_QUEUE", "{b}");
    }

    let out = cli(&redis, &["sale", "clear", "limited-drop:7"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains("3 users would lose their place") && err.contains("--force"), "{err}");
    assert!(err.contains("vq sale close"), "names the alternative: {err}");
    for u in 1..=3 {
        assert_eq!(app.json(app.poll(T, u).await).await["status"], "PRE_QUEUE", "user {u} keeps the place");
    }

    let out = cli(&redis, &["sale", "clear", "--target", "limited-drop:7", "--force"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("cleared"), "{}", stdout(&out));
    let b = poll_until(&app, 1, |b| b["code"] == "NOT_IN_QUEUE").await;
    assert_eq!(b["code"], "NOT_IN_QUEUE", "forced: the pre-queue is dropped");
}

#[tokio::test]
async fn clear_without_pre_queued_users_needs_no_force() {
    let redis = RedisServer::spawn();
    let (_app, _s) = app_on(&redis).await;
    let store = open_store(&test_settings(Some(&redis)));
    schedule(&store, 600_000, Some(-1000), None).await;
    let out = cli(&redis, &["sale", "clear", "limited-drop:7"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[tokio::test]
async fn every_sale_command_takes_the_target_as_an_argument_or_with_target() {
    let redis = RedisServer::spawn();
    let (_app, _s) = app_on(&redis).await;
    let store = open_store(&test_settings(Some(&redis)));
    schedule(&store, 600_000, None, None).await;
    for (args, said) in [
        (&["sale", "pause", "--target", "limited-drop:7"][..], "paused"),
        (&["sale", "resume", "--target", "limited-drop:7"], "resumed"),
        (&["sale", "pause", "limited-drop:7"], "paused"),
        (&["sale", "show", "--target", "limited-drop:7"], "LIMITED_DROP:7"),
        (&["sale", "ledger", "--target", "limited-drop:7"], "ledger"),
        (&["sale", "close", "--target", "limited-drop:7", "--message", "Sold out"], "closed"),
    ] {
        let out = cli(&redis, args);
        assert!(out.status.success(), "vq {args:?}: {}", stderr(&out));
        assert!(stdout(&out).contains(said), "vq {args:?}: {}", stdout(&out));
    }
    let both = cli(&redis, &["sale", "pause", "limited-drop:7", "--target", "limited-drop:7"]);
    assert_eq!(both.status.code(), Some(2), "one target, named once");
    let neither = cli(&redis, &["sale", "pause"]);
    assert_eq!(neither.status.code(), Some(2));
    assert!(stderr(&neither).contains("--target"), "the usage names --target: {}", stderr(&neither));
}
