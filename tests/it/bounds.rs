//! Every setting and CLI value has bounds, checked at start or at the command, with an error
//! that names the key, its environment variable and the allowed range.

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::{SECRET, vq_command};

/// Runs vq; one that is still running after 10 s (a value accepted, a server started) is
/// killed, and its output is what it printed until then.
fn vq(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = vq_command();
    cmd.args(args).env_remove("VQ_TOKEN_SECRET_FILE").env("VQ_TOKEN_SECRET", SECRET);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("run vq");
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().expect("wait for vq").is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait_with_output().expect("collect vq output")
}

fn refused(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "stdout: {} stderr: {err}", String::from_utf8_lossy(&out.stdout));
    assert!(!err.contains("panicked"), "{err}");
    err
}

#[test]
fn out_of_range_settings_are_refused_at_start_naming_key_and_range() {
    let cases = [
        ("VQ_REDIS__TIMEOUT_MS", "0", "redis.timeout_ms (VQ_REDIS__TIMEOUT_MS) must be between 10 and 10000, got 0"),
        ("VQ_GATE__TIMEOUT_MS", "0", "gate.timeout_ms (VQ_GATE__TIMEOUT_MS) must be between 100 and 600000, got 0"),
        (
            "VQ_REDIS__WAIT_TIMEOUT_MS",
            "5000",
            "redis.wait_timeout_ms (VQ_REDIS__WAIT_TIMEOUT_MS) must be between 1 and 4000, got 5000",
        ),
        (
            "VQ_REDIS__WAIT_REPLICAS",
            "101",
            "redis.wait_replicas (VQ_REDIS__WAIT_REPLICAS) must be between 0 and 100, got 101",
        ),
        ("VQ_REDIS__WAIT_REPLICAS", "some", "expected \"auto\" or a number of replicas, found \"some\""),
        (
            "VQ_QUEUE__BATCH_SIZE",
            "100000000000000000",
            "queue.batch_size (VQ_QUEUE__BATCH_SIZE) must be between 1 and 100000",
        ),
        ("VQ_QUEUE__BATCH_SIZE", "0", "queue.batch_size (VQ_QUEUE__BATCH_SIZE) must be between 1 and 100000, got 0"),
        ("VQ_QUEUE__TICK_MS", "100", "queue.tick_ms (VQ_QUEUE__TICK_MS) must be between 200 and 60000, got 100"),
        ("VQ_TOKEN__TTL_S", "18446744073709551615", "token.ttl_s (VQ_TOKEN__TTL_S) must be between 1 and 86400"),
        ("VQ_QUEUE__HEARTBEAT_TIMEOUT_S", "0", "queue.heartbeat_timeout_s (VQ_QUEUE__HEARTBEAT_TIMEOUT_S)"),
        ("VQ_QUEUE__KEY_TTL_S", "10", "queue.key_ttl_s (VQ_QUEUE__KEY_TTL_S) must be between 60"),
        ("VQ_GATE__PACE_MAX_TICKS", "1000", "gate.pace_max_ticks (VQ_GATE__PACE_MAX_TICKS) must be between 0 and 60"),
        ("VQ_FLAG__REFRESH_MS", "5000", "flag.refresh_ms (VQ_FLAG__REFRESH_MS) must be between 1 and 1000"),
    ];
    for (key, value, expected) in cases {
        let err = refused(&vq(&["serve", "--listen", "127.0.0.1:0"], &[(key, value)]));
        assert!(err.contains(expected), "{key}={value}: {err}");
    }
    let err = refused(&vq(
        &["serve", "--listen", "127.0.0.1:0"],
        &[("VQ_QUEUE__KEY_TTL_S", "60"), ("VQ_QUEUE__HEARTBEAT_TIMEOUT_S", "60")],
    ));
    assert!(err.contains("queue.key_ttl_s") && err.contains("longer than queue.heartbeat_timeout_s"), "{err}");
}

#[test]
fn out_of_range_cli_values_are_refused_before_anything_is_written() {
    // No Redis listens here: a refused value must not even try to connect.
    let dead = [("VQ_REDIS__URL", "redis://127.0.0.1:9")];
    let err = refused_clap(&vq(&["batch", "set", "100000000000000000"], &dead));
    assert!(err.contains("100000000000000000") && err.contains("1..=100000"), "{err}");
    refused_clap(&vq(&["batch", "set", "0"], &dead));
    let err =
        refused_clap(&vq(&["mint", "--target", "limited-drop:1", "--user", "1", "--ttl", "18446744073709551615"], &[]));
    assert!(err.contains("--ttl") && err.contains("0..=86400"), "{err}");
    let ok = vq(&["mint", "--target", "limited-drop:1", "--user", "1", "--ttl", "86400"], &[]);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
}

/// clap's usage errors exit 2.
fn refused_clap(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{err}");
    err
}
