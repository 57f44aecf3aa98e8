//! Secrets with the real `vq` binary: a Redis password never reaches a screen or a log,
//! secret errors name their source, and a key rotation keeps the retired key's tokens valid.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use vq::domain::UserId;
use vq::token::{Secret, mint, verify_signature};

use crate::support::{RedisServer, SECRET, VqProcess, flag_on, free_port, vq_command};

const PASSWORD: &str = "S3cretPw9xq";

fn vq(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = vq_command();
    cmd.args(args).env_remove("VQ_TOKEN_SECRET").env_remove("VQ_TOKEN_SECRET_FILE").env("RUST_LOG", "debug");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("run vq")
}

fn all_output(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// `redis-server --requirepass` on a free port, killed on drop.
struct AuthRedis {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl AuthRedis {
    fn spawn(password: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--requirepass", password])
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server");
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not listen");
            std::thread::sleep(Duration::from_millis(10));
        }
        Self { child, port, _dir: dir }
    }
}

impl Drop for AuthRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const CLI: [&[&str]; 7] = [
    &["stats"],
    &["stats", "--json"],
    &["flag", "status"],
    &["flag", "on"],
    &["batch", "show"],
    &["batch", "set", "5"],
    &["loadgen", "--users", "1", "--duration", "1", "--quiet", "--sweep-batch", "5", "--url", "http://127.0.0.1:1"],
];

#[test]
fn redis_password_never_appears_on_screen_or_in_errors() {
    let dead = format!("redis://vquser:{PASSWORD}@127.0.0.1:{}", free_port());
    let auth = AuthRedis::spawn(PASSWORD);
    let right = format!("redis://:{PASSWORD}@127.0.0.1:{}", auth.port);
    let wrong = format!("redis://:Wr0ngPw77zz@127.0.0.1:{}", auth.port);
    for url in [&dead, &right, &wrong] {
        for args in CLI {
            let out = vq(args, &[("VQ_REDIS__URL", url)]);
            let text = all_output(&out);
            assert!(!text.contains(PASSWORD) && !text.contains("Wr0ngPw77zz"), "vq {args:?} with {url}:\n{text}");
        }
        let out = vq(&["stats"], &[("VQ_REDIS__CLUSTER_NODES", url)]);
        assert!(!all_output(&out).contains(PASSWORD), "{}", all_output(&out));
    }
    // The URL is still shown, with its password redacted.
    let out = vq(&["stats"], &[("VQ_REDIS__URL", &dead)]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("redis://vquser:***@127.0.0.1:"), "{}", all_output(&out));
    let out = vq(&["stats"], &[("VQ_REDIS__URL", &right)]);
    assert!(out.status.success(), "{}", all_output(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("redis://:***@127.0.0.1:"), "{}", all_output(&out));
}

#[tokio::test]
async fn redis_password_never_appears_in_serve_logs() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let port = free_port();
    let url = format!("redis://vquser:{PASSWORD}@127.0.0.1:{}", free_port());
    let mut child = vq_command()
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .env("VQ_REDIS__URL", &url)
        .env("VQ_TOKEN_SECRET", SECRET)
        .env("RUST_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.get(format!("http://127.0.0.1:{port}/healthz")).send().await.is_err() {
        assert!(Instant::now() < deadline, "vq serve did not come up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let enter = format!("http://127.0.0.1:{port}/virtual-queues/limited-drop/1/entries");
    let r = client.post(enter).header("X-User-Id", "1").send().await.unwrap();
    assert_eq!(r.status(), 200, "fails open with Redis down");
    let _ = client.get(format!("http://127.0.0.1:{port}/readyz")).send().await.unwrap();
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains(PASSWORD), "{text}");
}

#[test]
fn secret_errors_name_the_file_and_refuse_secrets_without_entropy() {
    let serve = ["serve", "--listen", "127.0.0.1:0"];
    let out = vq(&serve, &[("VQ_TOKEN_SECRET_FILE", "/nonexistent/vq-secret")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(err.contains("VQ_TOKEN_SECRET_FILE=/nonexistent/vq-secret") && err.contains("No such file"), "{err}");
    assert!(!err.contains("is not set"), "{err}");
    let spaces = " ".repeat(33);
    for (bad, says) in [
        (spaces.as_str(), "only whitespace"),
        ("\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t", "only whitespace"),
        ("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "distinct"),
        ("abababababababababababababababababab", "distinct"),
    ] {
        for var in ["VQ_TOKEN_SECRET", "VQ_TOKEN_SECRET_PREVIOUS"] {
            let out = vq(&serve, &[("VQ_TOKEN_SECRET", SECRET), (var, bad)]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{var}={bad:?} accepted");
            assert!(err.contains(var) && err.contains(says) && !err.contains(bad), "{err}");
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secret");
    std::fs::write(&file, format!("{}\n", "z".repeat(40))).unwrap();
    let out = vq(&serve, &[("VQ_TOKEN_SECRET_FILE", file.to_str().unwrap())]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(file.to_str().unwrap()) && err.contains("distinct"), "{err}");
    let out = vq(&serve, &[("VQ_TOKEN_SECRET", SECRET), ("VQ_TOKEN_SECRET_PREVIOUS", SECRET)]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("equals VQ_TOKEN_SECRET"), "{}", all_output(&out));
}

const NEW: &str = "new-secret-after-rotation-0123456789";

async fn purchase(p: &VqProcess, token: &str) -> u16 {
    reqwest::Client::new()
        .post(format!("{}/limited-drops/1/orders", p.addr))
        .header("X-User-Id", "3")
        .header("X-Entry-Token", token)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn token_signed_with_the_previous_key_passes_the_gate_during_a_rotation() {
    let redis = RedisServer::spawn();
    let upstream = crate::gate::spawn_echo().await;
    let gate = ("VQ_GATE__UPSTREAM", upstream.clone());
    let rotated = [gate.clone(), ("VQ_TOKEN_SECRET", NEW.to_owned()), ("VQ_TOKEN_SECRET_PREVIOUS", SECRET.to_owned())];
    let rotating = VqProcess::serve(&redis, &rotated).await;
    let only_new = VqProcess::serve(&redis, &[gate, ("VQ_TOKEN_SECRET", NEW.to_owned())]).await;
    // A token of the old key, as an instance not yet restarted issued it.
    let now = vq::service::now_epoch_ms() / 1000;
    let old_secret = Secret::new(SECRET.as_bytes().to_vec()).unwrap();
    let old = mint(&old_secret, "LIMITED_DROP:1".parse().unwrap(), &UserId::from(3), now, 300).raw;
    // Every new token is signed with the current key (flag off: DIRECT_ADMITTED with a token).
    let r = reqwest::Client::new()
        .post(format!("{}/virtual-queues/limited-drop/2/entries", rotating.addr))
        .header("X-User-Id", "9")
        .send()
        .await
        .unwrap();
    let v: serde_json::Value = r.json().await.unwrap();
    let fresh = v["entryToken"].as_str().expect("a token");
    assert!(verify_signature(&Secret::new(NEW.as_bytes().to_vec()).unwrap(), fresh).is_ok());
    assert!(verify_signature(&old_secret, fresh).is_err());
    flag_on(&redis).await; // returns once both instances acknowledged the flag
    assert_eq!(purchase(&only_new, &old).await, 403, "without the previous key the old token fails");
    assert_eq!(purchase(&rotating, &old).await, 200, "with it as VQ_TOKEN_SECRET_PREVIOUS it passes");
    let expired = mint(&old_secret, "LIMITED_DROP:1".parse().unwrap(), &UserId::from(3), now - 400, 300).raw;
    assert_eq!(purchase(&rotating, &expired).await, 403, "until it expires");

    let minted = vq(&["mint", "--target", "limited-drop:1", "--user", "3"], &rotated_env());
    let t = String::from_utf8_lossy(&minted.stdout).trim().to_owned();
    assert!(verify_signature(&Secret::new(NEW.as_bytes().to_vec()).unwrap(), &t).is_ok(), "vq mint signs with NEW");
}

fn rotated_env() -> [(&'static str, &'static str); 2] {
    [("VQ_TOKEN_SECRET", NEW), ("VQ_TOKEN_SECRET_PREVIOUS", SECRET)]
}

#[test]
fn verify_says_which_key_matched() {
    let old = vq(&["mint", "--target", "limited-drop:1", "--user", "3"], &[("VQ_TOKEN_SECRET", SECRET)]);
    let old = String::from_utf8_lossy(&old.stdout).trim().to_owned();
    let new = vq(&["mint", "--target", "limited-drop:1", "--user", "3"], &rotated_env());
    let new = String::from_utf8_lossy(&new.stdout).trim().to_owned();
    let out = vq(&["verify", &old], &rotated_env());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("previous key") && text.contains("valid"), "{text}");
    let out = vq(&["verify", &new, "--json"], &rotated_env());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["valid"].as_bool(), v["key"].as_str()), (Some(true), Some("current")), "{v}");
    let out = vq(&["verify", &old, "--json"], &rotated_env());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["key"], "previous", "{v}");
    // Once the previous key is removed, its tokens are refused.
    let out = vq(&["verify", &old], &[("VQ_TOKEN_SECRET", NEW)]);
    assert_eq!(out.status.code(), Some(1), "{}", all_output(&out));
}
