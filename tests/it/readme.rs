//! The README's main command, `scripts/dev.sh`, run as a user would (debug build, on the
//! test's own port).

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::NamedTempFile;

use crate::support::{RedisServer, free_port};

/// Starts `scripts/dev.sh` in its own process group with the debug build, stderr to `log`.
/// `scripts/dev.sh` running in a process group of its own; a test that fails before
/// [`stop`] still stops the group (SIGTERM: the script stops what it started), so a failed
/// assertion leaves no redis-server, stand-in or vq serve behind.
struct DevSh(Child);

impl std::ops::Deref for DevSh {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for DevSh {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for DevSh {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let pgid = self.0.id();
            let _ = Command::new("bash").args(["-c", &format!("kill -TERM -- -{pgid}")]).status();
            let _ = self.0.wait();
        }
    }
}

fn dev_sh(port: u16, envs: &[(&str, String)], log: &NamedTempFile) -> DevSh {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut cmd = Command::new(format!("{root}/scripts/dev.sh"));
    cmd.current_dir(root)
        .env("DEV_PROFILE", "debug")
        .env("VQ_LISTEN", format!("127.0.0.1:{port}"))
        .env_remove("VQ_REDIS__URL")
        .env_remove("VQ_TOKEN_SECRET")
        .stdout(Stdio::null())
        .stderr(log.reopen().unwrap())
        .process_group(0);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    DevSh(cmd.spawn().unwrap())
}

fn said(log: &NamedTempFile) -> String {
    std::fs::read_to_string(log.path()).unwrap()
}

/// Enters user 1 once vq answers; the body of the first answer.
async fn first_enter(child: &mut Child, port: u16, log: &NamedTempFile) -> serde_json::Value {
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/virtual-queues/limited-drop/42/entries");
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        if let Ok(r) = client.post(&url).header("X-User-Id", "1").send().await {
            return r.json::<serde_json::Value>().await.unwrap();
        }
        assert!(child.try_wait().unwrap().is_none(), "dev.sh exited: {}", said(log));
        assert!(Instant::now() < deadline, "dev.sh did not serve in time");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// SIGTERM to the script's process group, as Ctrl-C in a terminal would; waits for the end.
async fn stop(child: &mut Child, log: &NamedTempFile) {
    let pgid = child.id().to_string();
    // bash's builtin kill signals a whole process group given as `-- -PGID`.
    let _ = Command::new("bash").args(["-c", &format!("kill -TERM -- -{pgid}")]).status();
    let stop = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < stop, "dev.sh did not stop on SIGTERM: {}", said(log));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (at most `secs`) for the script to end by itself; its exit status.
async fn ended(child: &mut Child, log: &NamedTempFile, secs: u64) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < deadline, "dev.sh did not end: {}", said(log));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_for_text(log: &NamedTempFile, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !said(log).contains(text) {
        assert!(Instant::now() < deadline, "`{text}` never printed: {}", said(log));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn dev_script_serves_with_the_queue_on_and_stops_cleanly() {
    let redis = RedisServer::spawn();
    let port = free_port();
    let log = NamedTempFile::new().unwrap();
    let mut child = dev_sh(port, &[("VQ_REDIS__URL", redis.url())], &log);
    let body = first_enter(&mut child, port, &log).await;
    assert_eq!(body["status"], "WAITING", "the script turns the queue on");
    // The last line of what the script prints once vq serves (the lines come in separate writes).
    wait_for_text(&log, "Ctrl-C stops it.").await;
    assert!(said(&log).contains("generated a development token secret"), "{}", said(&log));
    assert!(said(&log).contains(&format!("using the Redis at {}", redis.url())), "{}", said(&log));
    assert!(said(&log).contains(&format!("export VQ_REDIS__URL={}", redis.url())), "{}", said(&log));
    works_end_to_end(port, &log).await;
    stop(&mut child, &log).await;
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/virtual-queues/limited-drop/42/entries");
    assert!(client.post(&url).header("X-User-Id", "1").send().await.is_err(), "vq serve stopped too");
}

/// What the script prints works: the waiting page's URL opens in a browser (no X-User-Id),
/// and user 1, once admitted, buys through the gate (a purchase API stands in behind it).
async fn works_end_to_end(port: u16, log: &NamedTempFile) {
    wait_for_text(log, "waiting-room").await;
    let text = said(log);
    let page = text
        .split_whitespace()
        .find(|w| w.starts_with("http://") && w.contains("/waiting-room/"))
        .unwrap_or_else(|| panic!("no waiting-page URL printed: {text}"));
    assert!(page.contains("?user="), "{page}");
    let client = reqwest::Client::new();
    let resp = client.get(page).send().await.unwrap();
    assert_eq!(resp.status(), 200, "the printed waiting page opens without X-User-Id: {page}");
    assert!(resp.text().await.unwrap().contains("<html"), "an HTML page");

    let me = format!("http://127.0.0.1:{port}/virtual-queues/limited-drop/42/entries/me");
    let deadline = Instant::now() + Duration::from_secs(10);
    let token = loop {
        let b: serde_json::Value = client.get(&me).header("X-User-Id", "1").send().await.unwrap().json().await.unwrap();
        if let Some(t) = b["entryToken"].as_str() {
            break t.to_owned();
        }
        assert!(Instant::now() < deadline, "user 1 never admitted: {b}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let buy = client
        .post(format!("http://127.0.0.1:{port}/limited-drops/42/orders"))
        .header("X-User-Id", "1")
        .header("X-Entry-Token", token)
        .body("{}")
        .send()
        .await
        .unwrap();
    let status = buy.status();
    assert_eq!(status, 200, "the purchase reaches the stand-in: {}", buy.text().await.unwrap());
}

/// Without VQ_REDIS__URL the script never uses whatever answers on 6379: it starts its own
/// redis-server on a free port and stops it on exit.
#[tokio::test]
async fn dev_script_starts_a_private_redis_on_a_free_port_and_stops_it() {
    let port = free_port();
    let log = NamedTempFile::new().unwrap();
    let mut child = dev_sh(port, &[], &log);
    assert_eq!(first_enter(&mut child, port, &log).await["status"], "WAITING");
    let text = said(&log);
    let redis_port: u16 = text
        .split("started a private redis-server on 127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no private redis-server announced: {text}"));
    assert_ne!(redis_port, 6379);
    // Printed with the lines to try, once vq answers: maybe just after the first enter.
    let export = format!("export VQ_REDIS__URL=redis://127.0.0.1:{redis_port}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !said(&log).contains(&export) && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let text = said(&log);
    assert!(text.contains(&export), "the operator commands' Redis is printed: {text}");
    assert!(std::net::TcpStream::connect(("127.0.0.1", redis_port)).is_ok());
    stop(&mut child, &log).await;
    assert!(std::net::TcpStream::connect(("127.0.0.1", redis_port)).is_err(), "its redis-server is stopped");
}

/// A busy listen address ends the script with a plain reason, before any "Try:" lines.
#[tokio::test]
async fn dev_script_on_a_busy_port_says_so_without_the_try_lines() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    let redis = RedisServer::spawn();
    let log = NamedTempFile::new().unwrap();
    let mut child = dev_sh(port, &[("VQ_REDIS__URL", redis.url())], &log);
    let status = ended(&mut child, &log, 240).await;
    let text = said(&log);
    assert_eq!(status.code(), Some(1), "{text}");
    assert!(text.contains(&format!("something already listens on 127.0.0.1:{port}")), "{text}");
    assert!(!text.contains("Try:"), "{text}");
}

/// Without a redis-server, and no way to install one (no apt-get on the PATH, as when apt is
/// locked or absent), the script starts nothing, exits 1 and says what would work: a Redis
/// URL, or the embedded store with what it cannot do.
#[tokio::test]
async fn dev_script_without_redis_server_refuses_and_says_what_works() {
    // A PATH with every command of this machine but redis-server and the package tools.
    let bin = tempfile::tempdir().unwrap();
    let left_out = ["redis-server", "redis-cli", "apt-get", "apt", "sudo"];
    for dir in ["/usr/local/bin", "/usr/bin", "/bin"] {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let name = entry.file_name();
            let link = bin.path().join(&name);
            if !left_out.contains(&name.to_str().unwrap_or("")) && !link.exists() {
                std::os::unix::fs::symlink(entry.path(), link).unwrap();
            }
        }
    }
    let log = NamedTempFile::new().unwrap();
    let path = bin.path().display().to_string();
    let mut child = dev_sh(free_port(), &[("PATH", path)], &log);
    let status = ended(&mut child, &log, 30).await;
    let text = said(&log);
    assert_eq!(status.code(), Some(1), "{text}");
    assert!(text.contains("no redis-server on this machine") && text.contains("Nothing was started"), "{text}");
    assert!(text.contains("VQ_REDIS__URL") && text.contains("VQ_STORE=memory"), "names both ways on: {text}");
    assert!(text.contains("no operator command reaches it"), "says what the embedded store cannot do: {text}");
    assert!(!text.contains("Try:") && !text.contains("building vq"), "{text}");
}

/// On a fresh machine (no `VQ_REDIS__URL`, a private Redis), the operator lines the script
/// prints, run as printed in a shell of their own (nothing of the server's configuration), show
/// the buyers waiting in the target the script declares only in vq serve's environment.
#[tokio::test]
async fn the_operator_lines_dev_sh_prints_show_the_waiting_buyers() {
    let port = free_port();
    let log = NamedTempFile::new().unwrap();
    let mut child = dev_sh(port, &[("VQ_QUEUE__BATCH_SIZE", "1".to_owned())], &log);
    assert_eq!(first_enter(&mut child, port, &log).await["status"], "WAITING");
    let client = reqwest::Client::new();
    for user in 2..=40 {
        let url = format!("http://127.0.0.1:{port}/virtual-queues/limited-drop/42/entries");
        let r = client.post(url).header("X-User-Id", user.to_string()).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
    wait_for_text(&log, "Ctrl-C stops it.").await;
    let text = said(&log);
    let lines: Vec<&str> = text
        .split("==> Operator commands talk to this Redis")
        .nth(1)
        .unwrap_or_else(|| panic!("no operator lines printed: {text}"))
        .lines()
        .skip(1)
        .take(2)
        .map(str::trim)
        .collect();
    assert!(lines[0].starts_with("export VQ_REDIS__URL=") && lines[1].contains(" stats"), "{lines:?}");
    let shell = lines.join("\n");
    let out = Command::new("env")
        .args(["-i", &format!("PATH={}", std::env::var("PATH").unwrap_or_default()), "bash", "-c", &shell])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    stop(&mut child, &log).await;
    assert!(out.status.success(), "{shell}\n{shown}");
    assert!(shown.contains("1 target(s)") && shown.contains("LIMITED_DROP:42"), "{shell}\n{shown}");
    assert!(shown.contains("from configuration of"), "{shown}");
    let row = shown.lines().find(|l| l.contains("│ LIMITED_DROP:42")).unwrap_or_else(|| panic!("{shown}"));
    let waiting: u64 = row.split('┆').nth(1).and_then(|c| c.split_whitespace().next()?.parse().ok()).unwrap_or(0);
    assert!(waiting >= 30, "the buyers wait there: {row}");
}
