//! The token format is a public contract: an independent HMAC-SHA256 (Python's hmac) must
//! verify a token that vq issued.

use std::process::Command;
use std::sync::Arc;

use crate::support::{RedisServer, SECRET, flag_on, open_store, spawn_app, test_settings};

const CHECK: &str = r#"
import base64, hashlib, hmac, sys
secret, token = sys.argv[1].encode(), sys.argv[2]
p64, s64 = token.split(".")
pad = lambda s: s + "=" * (-len(s) % 4)
payload = base64.urlsafe_b64decode(pad(p64))
sig = base64.urlsafe_b64decode(pad(s64))
ok = hmac.compare_digest(hmac.new(secret, payload, hashlib.sha256).digest(), sig)
print(payload.decode() if ok else "BAD")
"#;

#[tokio::test]
async fn token_from_a_poll_verifies_with_python_hmac() {
    let redis = RedisServer::spawn();
    let s = test_settings(Some(&redis));
    let app = spawn_app(s.clone(), false).await;
    flag_on(&redis).await;
    app.enter("limited-drop/42", 7).await;
    let pump = vq::pump::Pump::new(open_store(&s), Arc::new(s.clone()), "t".into());
    tokio::time::sleep(std::time::Duration::from_millis(510)).await;
    pump.tick().await.unwrap();
    let v = app.json(app.poll("limited-drop/42", 7).await).await;
    assert_eq!(v["status"], "ADMITTED");
    let token = v["entryToken"].as_str().unwrap();
    assert!(!token.contains('=') && !token.contains('+') && !token.contains('/'));
    let out = Command::new("python3").args(["-c", CHECK, SECRET, token]).output().expect("python3");
    let text = String::from_utf8_lossy(&out.stdout);
    let fields: Vec<&str> = text.trim().split('|').collect();
    assert_eq!(fields[..3], ["LIMITED_DROP", "42", "7"], "python said: {text}");
    let exp: u64 = fields[3].parse().unwrap();
    let now = vq::service::now_epoch_ms() / 1000;
    assert!(exp > now + 290 && exp <= now + 301);
    let out =
        Command::new("python3").args(["-c", CHECK, "another-secret-of-enough-length-000", token]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "BAD");
}
