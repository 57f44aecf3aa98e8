//! `vq stats --watch` in a real terminal (tmux, on a socket of its own): the serving
//! instances, where the target comes from, the trend since the last refresh, and a Redis
//! stopped and restarted under it.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use super::flag_on_and_enter;
use crate::support::{RedisServer, VqProcess, free_port, vq_bin};

/// A tmux server of this test's own (its socket in a temp dir), killed on drop.
struct Tmux {
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmux {
    /// Starts `command` in a 160×50 terminal.
    fn start(command: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("tmux.sock");
        let ok = Command::new("tmux")
            .arg("-S")
            .arg(&socket)
            .args(["new-session", "-d", "-x", "160", "-y", "50", command])
            .status()
            .expect("run tmux");
        assert!(ok.success(), "tmux started");
        Self { socket, _dir: dir }
    }

    fn screen(&self) -> String {
        let out =
            Command::new("tmux").arg("-S").arg(&self.socket).args(["capture-pane", "-p"]).output().expect("capture");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits (≤ `secs`) until the screen shows every one of `texts`; returns it.
    async fn shows(&self, texts: &[&str], secs: u64) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let screen = self.screen();
            if texts.iter().all(|t| screen.contains(t)) {
                return screen;
            }
            assert!(Instant::now() < deadline, "the terminal never showed {texts:?}:\n{screen}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux").arg("-S").arg(&self.socket).arg("kill-server").status();
    }
}

#[tokio::test]
async fn stats_watch_in_a_terminal_names_the_instances_shows_the_trend_and_rides_out_a_redis_restart() {
    let port = free_port();
    let mut redis = RedisServer::spawn_on(port);
    let envs = [
        ("VQ_INSTANCE_ID", "vq-a".to_owned()),
        ("VQ_TARGETS__DECLARED", "[\"limited-drop:42\"]".to_owned()),
        ("VQ_TARGETS__RANGES", "[]".to_owned()),
        ("VQ_QUEUE__BATCH_SIZE", "2".to_owned()),
        ("VQ_QUEUE__TICK_MS", "500".to_owned()),
        ("VQ_FLAG__REFRESH_MS", "100".to_owned()),
    ];
    let server = VqProcess::serve(&redis, &envs).await;
    flag_on_and_enter(&redis, &server.addr, 1..=40).await;
    // The operator's shell: nothing but the Redis URL (and a tick for the redraw).
    let tmux = Tmux::start(&format!(
        "env -i TERM=xterm VQ_REDIS__URL={} VQ_QUEUE__TICK_MS=500 {} stats --watch --wide",
        redis.url(),
        vq_bin().display()
    ));
    let screen = tmux
        .shows(&["serving vq-a  no drift", "LIMITED_DROP:42 from configuration of vq-a", "since last refresh"], 15)
        .await;
    assert!(screen.contains("admitted +2") || screen.contains("admitted +4"), "the trend of admissions:\n{screen}");
    assert!(screen.contains("waiting -"), "the line shrinks:\n{screen}");

    redis.kill();
    tmux.shows(&["unreachable", "retrying every tick"], 15).await;
    let redis = RedisServer::spawn_on(port);
    // The instance reports itself again. A Redis restarted empty gets buyers again, as a sale
    // does: one enter every half second (an instance re-adds a target to the active set at
    // most every 5 s, so the restart may wait that long to show).
    flag_on_and_enter(&redis, &server.addr, 1..=20).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut user = 21;
    while !tmux.screen().contains("LIMITED_DROP:42 from configuration of vq-a") {
        assert!(Instant::now() < deadline, "the target never came back:\n{}", tmux.screen());
        flag_on_and_enter(&redis, &server.addr, user..=user).await;
        user += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let screen = tmux.shows(&["serving vq-a  no drift"], 5).await;
    assert!(!screen.contains("unreachable"), "redrawn once Redis is back:\n{screen}");
}
