//! The token format is a public contract: an independent HMAC-SHA256 (Python's hmac) must
//! verify a token that vq issued, and vq's verdicts must be the ones the shared test vectors
//! (`clients/test-vectors.json`, checked by the Java, Node and Python verifiers too) state.

mod vectors;

use std::process::Command;
use std::sync::Arc;

use serde_json::{Value, json};
use vq::domain::{QueueTarget, UserId};
use vq::token::{self, Secret, TokenError};

use crate::support::{RedisServer, SECRET, flag_on, open_store, spawn_app, test_settings, wait_for};

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
    // Admitted by the first tick after the one it entered in.
    let v = wait_for(std::time::Duration::from_secs(5), "user 7 admitted by a tick", async || {
        pump.tick().await.unwrap();
        Some(app.json(app.poll("limited-drop/42", 7).await).await).filter(|v| v["status"] == "ADMITTED")
    })
    .await;
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

// The shared test vectors of clients/ (the Java, Node and Python verifiers check the same
// file): vq's own verdict must be the one the file states for every case.

const VECTORS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/test-vectors.json");

fn vectors_file() -> Value {
    let text = std::fs::read_to_string(VECTORS).expect("clients/test-vectors.json");
    serde_json::from_str(&text).expect("clients/test-vectors.json is JSON")
}

/// The keys a case's verifier holds: `["current"]`, or `["current", "previous"]` (a rotation).
fn case_secret(file: &Value, case: &Value) -> Secret {
    let keys: Vec<&str> = case["keys"].as_array().unwrap().iter().map(|k| k.as_str().unwrap()).collect();
    let key = |name: &str| {
        let text = file["secrets"][name].as_str().unwrap();
        Secret::from_source(text.as_bytes().to_vec(), name).unwrap()
    };
    match keys[..] {
        ["current"] => key("current"),
        ["current", "previous"] => key("current").with_previous(key("previous")).unwrap(),
        _ => panic!("{}: keys must be [current] or [current, previous]", case["name"]),
    }
}

fn verdict_code(e: &TokenError) -> &'static str {
    match e {
        TokenError::Missing => "missing",
        TokenError::NoUser => "no_user",
        TokenError::Malformed(_) => "malformed",
        TokenError::BadSignature => "bad_signature",
        TokenError::Expired { .. } => "expired",
        TokenError::WrongType { .. } => "wrong_type",
        TokenError::WrongTarget { .. } => "wrong_target",
        TokenError::WrongUser => "wrong_user",
        TokenError::AlreadyUsed => "already_used",
    }
}

/// vq's verdict on one case, checked the way the gate checks a request (`service::gate`): the
/// target as the route gives it, the user id as `X-User-Id` says it (unparsable: no user),
/// then a non-empty token, then `token::verify`.
fn vq_verdict(file: &Value, case: &Value) -> Value {
    let secret = case_secret(file, case);
    let expect = |k: &str| case["expect"][k].as_str().unwrap();
    let target = match QueueTarget::from_parts(expect("type"), expect("id")) {
        Ok(t) => t,
        Err(e) => return json!({ "verdict": "invalid_target", "detail": e.to_string() }),
    };
    let raw = case["token"].as_str().unwrap();
    let now = case["now"].as_str().unwrap().parse().unwrap();
    let checked = expect("user").parse::<UserId>().map_err(|_| TokenError::NoUser).and_then(|user| {
        if raw.is_empty() { Err(TokenError::Missing) } else { token::verify(&secret, raw, target, &user, now) }
    });
    match checked {
        Ok(c) => {
            let (_, key) = token::verify_signature_with_key(&secret, raw).unwrap();
            json!({
                "verdict": "valid",
                "key": key.as_str(),
                "claims": {
                    "type": c.target.kind.as_str(), "id": c.target.id.to_string(),
                    "user": c.user.to_string(), "expiresAt": c.expires_at.to_string(),
                },
            })
        }
        Err(e) => json!({ "verdict": verdict_code(&e), "detail": e.to_string() }),
    }
}

/// The fields of a case that state the verdict (what `vq_verdict` answers).
fn stated_verdict(case: &Value) -> Value {
    let mut v = serde_json::Map::new();
    for k in ["verdict", "detail", "key", "claims"] {
        if let Some(x) = case.get(k) {
            v.insert(k.into(), x.clone());
        }
    }
    Value::Object(v)
}

fn secret_rule_verdict(secret: &str) -> &'static str {
    use vq::token::SecretError;
    match Secret::from_source(secret.as_bytes().to_vec(), "s") {
        Ok(_) => "accepted",
        Err(SecretError::TooShort { .. }) => "too_short",
        Err(SecretError::Whitespace { .. }) => "whitespace",
        Err(SecretError::LowEntropy { .. }) => "low_entropy",
        Err(e) => panic!("unexpected secret error {e}"),
    }
}

#[test]
fn shared_token_vectors_state_vqs_own_verdicts() {
    let file = vectors_file();
    let cases = file["cases"].as_array().unwrap();
    assert!(cases.len() > 40, "the vectors file lost its cases");
    let mut wrong = Vec::new();
    for case in cases {
        let (ours, stated) = (vq_verdict(&file, case), stated_verdict(case));
        if ours != stated {
            wrong.push(format!("{}: vq says {ours}, the file {stated}", case["name"]));
        }
    }
    for rule in file["secretRules"].as_array().unwrap() {
        let ours = secret_rule_verdict(rule["secret"].as_str().unwrap());
        if ours != rule["verdict"] {
            wrong.push(format!("secret rule {}: vq says {ours}, the file {}", rule["name"], rule["verdict"]));
        }
    }
    assert!(wrong.is_empty(), "clients/test-vectors.json disagrees with vq:\n{}", wrong.join("\n"));
}
