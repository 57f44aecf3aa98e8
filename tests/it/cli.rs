//! The command line as an operator uses it: real processes, exit codes, stderr.

use std::process::Output;

use crate::support::{SECRET, vq_command};

fn vq(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = vq_command();
    cmd.args(args).env_remove("VQ_TOKEN_SECRET").env_remove("VQ_TOKEN_SECRET_FILE");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("run vq")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn serve_refuses_to_start_without_a_proper_secret_and_never_prints_it() {
    let out = vq(&["serve", "--listen", "127.0.0.1:0"], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("VQ_TOKEN_SECRET") && err.lines().count() == 1, "{err}");
    let out = vq(&["serve", "--listen", "127.0.0.1:0"], &[("VQ_TOKEN_SECRET", "tooshort-s3cr3t")]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("32 bytes") && !err.contains("tooshort-s3cr3t"), "{err}");
}

#[test]
fn unknown_config_keys_are_named() {
    let out = vq(&["serve"], &[("VQ_QUEUE__BATCHSIZE", "5"), ("VQ_TOKEN_SECRET", SECRET)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("batchsize"), "{}", text(&out.stderr));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("vq.toml");
    std::fs::write(&file, "[gate]\nupstrem = \"http://x\"\n").unwrap();
    let out = vq(&["flag", "status", "--config", file.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("upstrem"), "{}", text(&out.stderr));
}

#[test]
fn shipped_vq_toml_loads_as_is() {
    let toml = concat!(env!("CARGO_MANIFEST_DIR"), "/vq.toml");
    let s = vq::config::Settings::load(Some(std::path::Path::new(toml)), &Default::default()).unwrap();
    // Every key of the shipped file says the built-in default: the two cannot drift.
    let shipped = serde_json::to_value(&s).unwrap();
    let defaults = serde_json::to_value(vq::config::Settings::default()).unwrap();
    assert_eq!(shipped, defaults, "vq.toml and the built-in defaults differ");
}

#[test]
fn mint_then_verify_explains_each_outcome() {
    let env = [("VQ_TOKEN_SECRET", SECRET)];
    let out = vq(&["mint", "--target", "limited-drop:42", "--user", "7", "--json"], &env);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["targetType"].as_str(), v["targetId"].as_u64(), v["userId"].as_str()),
        (Some("LIMITED_DROP"), Some(42), Some("7"))
    );
    // Any shop's id: a UUID is minted and verified as sent; another case is another user.
    let uuid = "3f2a9c1e-7b4d-4c1e-9a8f-2b6c1d0e9f3a";
    let out = vq(&["mint", "--target", "limited-drop:42", "--user", uuid, "--json"], &env);
    let minted: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(minted["userId"], uuid);
    let by_uuid = minted["token"].as_str().unwrap();
    assert_eq!(vq(&["verify", by_uuid, "--user", uuid], &env).status.code(), Some(0));
    assert_eq!(vq(&["verify", by_uuid, "--user", &uuid.to_uppercase()], &env).status.code(), Some(1));
    let bad = vq(&["mint", "--target", "limited-drop:42", "--user", "a|b"], &env);
    assert_eq!(bad.status.code(), Some(2), "clap refuses the id");
    assert!(text(&bad.stderr).contains("1 to 128 characters"), "{}", text(&bad.stderr));
    let token = v["token"].as_str().unwrap();

    let ok = vq(&["verify", token, "--target", "limited-drop:42", "--user", "7"], &env);
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok.stdout));
    assert!(text(&ok.stdout).contains("valid"));

    let wrong_user = vq(&["verify", token, "--user", "8"], &env);
    assert_eq!(wrong_user.status.code(), Some(1));
    assert!(text(&wrong_user.stdout).contains("another user"));

    let wrong_target = vq(&["verify", token, "--target", "ticketing-event:42"], &env);
    assert_eq!(wrong_target.status.code(), Some(1));
    assert!(text(&wrong_target.stdout).contains("TICKETING_EVENT"));

    let other_secret = vq(&["verify", token], &[("VQ_TOKEN_SECRET", "another-secret-that-is-long-enough-123")]);
    assert_eq!(other_secret.status.code(), Some(1));
    assert!(text(&other_secret.stdout).contains("signature"));

    let garbage = vq(&["verify", "not-a-token"], &env);
    assert_eq!(garbage.status.code(), Some(1));
    assert!(text(&garbage.stdout).contains("malformed"));

    let expired = vq(&["mint", "--target", "limited-drop:42", "--user", "7", "--ttl", "0"], &env);
    let expired_token = text(&expired.stdout);
    let out = vq(&["verify", expired_token.trim()], &env);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).contains("expired"));

    let unchecked = vq(&["verify", token, "--json"], &[]);
    assert_eq!(unchecked.status.code(), Some(1), "no secret: not proven valid");
    let v: serde_json::Value = serde_json::from_slice(&unchecked.stdout).unwrap();
    assert_eq!(v["signatureChecked"], false);
    assert_eq!(v["userId"], "7", "still decoded");

    let usage = vq(&["verify"], &env);
    assert_eq!(usage.status.code(), Some(2));
    let bad_target = vq(&["mint", "--target", "Concert:1", "--user", "7"], &env);
    assert_eq!(bad_target.status.code(), Some(2));
    assert!(text(&bad_target.stderr).contains("Concert"));
    // Any well-formed type: a token is as good as the configuration that honours it.
    let other = vq(&["mint", "--target", "flash-coupon:1", "--user", "7", "--json"], &env);
    assert_eq!(other.status.code(), Some(0), "{}", text(&other.stderr));
    let v: serde_json::Value = serde_json::from_slice(&other.stdout).unwrap();
    assert_eq!(v["targetType"], "FLASH_COUPON");
}

#[test]
fn every_flag_option_has_help_text() {
    for sub in ["on", "off", "clear"] {
        let out = vq(&["flag", sub, "--help"], &[]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let help = text(&out.stdout);
        let line = help.lines().find(|l| l.trim_start().starts_with("--target")).unwrap_or_default();
        assert!(line.trim_start().len() > "--target <T>".len() + 5, "vq flag {sub}: --target has no help:\n{help}");
    }
}

/// Stands in for vq's HTTP port: answers anything with what hyper answers a request it
/// cannot parse (a Redis `PING` included).
fn http_port() -> (u16, std::thread::JoinHandle<()>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        // Each command may connect several times (its connection, the liveness probe,
        // retries): answer every one for the test's length.
        for _ in 0..256 {
            let Ok((mut conn, _)) = listener.accept() else { return };
            let mut buf = [0u8; 256];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
    (port, handle)
}

#[test]
fn a_redis_url_that_is_not_one_or_an_http_port_is_named_plainly_once() {
    let out = vq(&["stats"], &[("VQ_REDIS__URL", "http://127.0.0.1:6379")]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("invalid redis.url `http://127.0.0.1:6379` (VQ_REDIS__URL): not a Redis URL"), "{err}");
    assert!(err.contains("redis://"), "says what a Redis URL looks like: {err}");
    assert_eq!(err.matches("parse").count(), 0, "no repeated client text: {err}");

    let (port, _answers) = http_port();
    let url = format!("redis://127.0.0.1:{port}");
    for args in [&["stats"][..], &["flag", "status"]] {
        let out = vq(args, &[("VQ_REDIS__URL", &url)]);
        assert_eq!(out.status.code(), Some(1), "vq {args:?}");
        let err = text(&out.stderr);
        assert!(err.contains("does not speak the Redis protocol") && err.contains("HTTP port"), "vq {args:?}: {err}");
        assert!(!err.contains("Unexpected"), "vq {args:?}: {err}");
    }
}

#[test]
fn a_bad_number_in_the_configuration_says_what_a_number_is() {
    for value in ["-3", "many"] {
        let out = vq(&["stats"], &[("VQ_QUEUE__BATCH_SIZE", value)]);
        assert_eq!(out.status.code(), Some(1));
        let err = text(&out.stderr);
        assert!(err.contains("queue.batch_size (VQ_QUEUE__BATCH_SIZE"), "{err}");
        assert!(err.contains("must be a whole number, 0 or more"), "{err}");
        assert!(!err.contains("u64"), "{err}");
    }
}
