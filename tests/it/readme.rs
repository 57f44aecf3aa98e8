//! The README's main command, `scripts/dev.sh`, run as a user would (debug build, on the
//! test's own Redis and port).

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{RedisServer, free_port};

#[tokio::test]
async fn dev_script_serves_with_the_queue_on_and_stops_cleanly() {
    let redis = RedisServer::spawn();
    let port = free_port();
    let root = env!("CARGO_MANIFEST_DIR");
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new(format!("{root}/scripts/dev.sh"))
        .current_dir(root)
        .env("DEV_PROFILE", "debug")
        .env("VQ_LISTEN", format!("127.0.0.1:{port}"))
        .env("VQ_REDIS__URL", redis.url())
        .env_remove("VQ_TOKEN_SECRET")
        .stdout(Stdio::null())
        .stderr(log.reopen().unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/virtual-queues/limited-drop/42/entries");
    let deadline = Instant::now() + Duration::from_secs(240);
    let body = loop {
        if let Ok(r) = client.post(&url).header("X-User-Id", "1").send().await {
            break r.json::<serde_json::Value>().await.unwrap();
        }
        assert!(child.try_wait().unwrap().is_none(), "dev.sh exited: {}", std::fs::read_to_string(log.path()).unwrap());
        assert!(Instant::now() < deadline, "dev.sh did not serve in time");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(body["status"], "WAITING", "the script turns the queue on");
    let said = std::fs::read_to_string(log.path()).unwrap();
    assert!(said.contains("generated a development token secret"), "{said}");
    assert!(said.contains("curl -s -X POST"), "{said}");
    let pgid = child.id().to_string();
    // bash's builtin kill signals a whole process group given as `-- -PGID`.
    let _ = Command::new("bash").args(["-c", &format!("kill -TERM -- -{pgid}")]).status();
    let stop = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < stop,
            "dev.sh did not stop on SIGTERM: {}",
            std::fs::read_to_string(log.path()).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(client.post(&url).header("X-User-Id", "1").send().await.is_err(), "vq serve stopped too");
}
