//! `vq batch` and `vq loadgen --sweep-batch`: the runtime batch size set, shown and cleared,
//! and a sweep that sets each size on its target and restores it.

use redis::AsyncCommands;

use super::{read_json, serve_env, vq};
use crate::support::{RedisServer, VqProcess, flag_on};

#[tokio::test]
async fn sweep_sets_each_batch_size_on_the_target_and_restores_it() {
    let redis = RedisServer::spawn();
    let server = VqProcess::serve(&redis, &serve_env()).await;
    flag_on(&redis).await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("sweep.json");
    let out = vq(
        &redis,
        &[
            "loadgen",
            "--url",
            &server.addr,
            "--target",
            "limited-drop:8",
            "--users",
            "200",
            "--rate",
            "200",
            "--arrival",
            "constant",
            "--duration",
            "2",
            "--poll-min-ms",
            "200",
            "--poll-max-ms",
            "300",
            "--sweep-batch",
            "2,40",
            "--json",
            json.to_str().unwrap(),
            "--quiet",
        ],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rounds = read_json(&json)["rounds"].as_array().unwrap().clone();
    assert_eq!(rounds.len(), 2);
    assert_eq!(rounds[0]["batchSize"], 2);
    assert_eq!(rounds[1]["batchSize"], 40);
    assert!(
        rounds[1]["admitted"].as_u64().unwrap() > rounds[0]["admitted"].as_u64().unwrap(),
        "a bigger batch admits more: {rounds:#?}"
    );
    let mut c = redis.conn().await;
    let left: Option<u64> = c.get("queue:{LIMITED_DROP:8}:batch_size").await.unwrap();
    assert_eq!(left, None, "the per-target batch size is restored after the sweep");
}

#[tokio::test]
async fn batch_command_sets_shows_and_clears_the_runtime_batch_size() {
    let redis = RedisServer::spawn();
    let mut c = redis.conn().await;
    assert!(vq(&redis, &["batch", "set", "50", "--target", "limited-drop:3"]).status.success());
    let per_target: Option<u64> = c.get("queue:{LIMITED_DROP:3}:batch_size").await.unwrap();
    assert_eq!(per_target, Some(50));
    assert!(vq(&redis, &["batch", "set", "70"]).status.success());
    let global: Option<u64> = c.get("queue:config:batch_size").await.unwrap();
    assert_eq!(global, Some(70));

    let show = vq(&redis, &["batch", "show", "--target", "limited-drop:3"]);
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(text.contains("in force for LIMITED_DROP:3: 50"), "{text}");
    let show = vq(&redis, &["batch", "show"]);
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(text.contains("in force: 70"), "{text}");
    assert!(text.contains("per-target runtime batch sizes (active targets): LIMITED_DROP:3: 50"), "{text}");

    assert!(vq(&redis, &["batch", "clear", "--target", "limited-drop:3"]).status.success());
    assert!(vq(&redis, &["batch", "clear"]).status.success());
    let per_target: Option<u64> = c.get("queue:{LIMITED_DROP:3}:batch_size").await.unwrap();
    let global: Option<u64> = c.get("queue:config:batch_size").await.unwrap();
    assert_eq!((per_target, global), (None, None));
    let bad = vq(&redis, &["batch", "set", "0"]);
    assert!(!bad.status.success());
}
