//! `GET /openapi.json` describes what vq answers: every route it serves is in the document,
//! and real answers carry exactly the documented fields (required ones present, nothing
//! undocumented). `openapi_document_passes_the_validator_and_schemathesis` checks the document
//! and fuzzes the live API with the Python tools `scripts/test.sh` installs.

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;
use strum::IntoEnumIterator;

use crate::support::{RedisServer, TestApp, VqProcess, flag_on, spawn_app, test_settings};

async fn document(app: &TestApp) -> Value {
    let r = app.client.get(app.url("/openapi.json")).send().await.expect("openapi");
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    r.json().await.expect("json")
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object().expect("object").keys().cloned().collect()
}

/// The property names of a schema and its required ones.
fn schema(doc: &Value, name: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let s = &doc["components"]["schemas"][name];
    let props = keys(&s["properties"]);
    let required = s["required"].as_array().expect("required").iter().map(|r| r.as_str().unwrap().to_owned()).collect();
    (props, required)
}

pub(crate) fn conforms(doc: &Value, name: &str, answer: &Value) {
    let (props, required) = schema(doc, name);
    let got = keys(answer);
    assert!(
        got.is_subset(&props),
        "{name}: undocumented fields {:?} in {answer}",
        got.difference(&props).collect::<Vec<_>>()
    );
    assert!(
        required.is_subset(&got),
        "{name}: missing {:?} in {answer}",
        required.difference(&got).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn the_document_lists_every_route_and_real_answers_match_its_schemas() {
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    s.queue.max_capacity = 1;
    let app = spawn_app(s, false).await;
    flag_on(&redis).await;
    let doc = document(&app).await;
    assert_eq!(doc["openapi"], "3.0.3");
    let paths = keys(&doc["paths"]);
    for path in [
        "/virtual-queues/{type}/{id}/entries",
        "/virtual-queues/{type}/{id}/entries/me",
        "/virtual-queues/{type}/{id}/stats",
        "/gate/verify",
        "/gate/release",
        "/healthz",
        "/readyz",
        "/openapi.json",
        "/limited-drops/{dropId}/orders",
        "/waiting-room/{type}/{id}",
    ] {
        assert!(paths.contains(path), "{path} undocumented");
    }
    let json = |r: reqwest::Response| async move { r.json::<Value>().await.expect("json") };
    let waiting = json(app.enter("limited-drop/42", 1).await).await;
    assert_eq!(waiting["status"], "WAITING");
    conforms(&doc, "Status", &waiting);
    conforms(&doc, "Status", &json(app.poll("limited-drop/42", 1).await).await);
    let full = app.enter("limited-drop/42", 2).await;
    assert_eq!(full.status(), 429);
    conforms(&doc, "Error", &json(full).await);
    conforms(&doc, "Error", &json(app.poll("limited-drop/42", 3).await).await);
    let stats = app.client.get(app.url("/virtual-queues/limited-drop/42/stats")).send().await.unwrap();
    conforms(&doc, "Stats", &json(stats).await);
    let ready = app.client.get(app.url("/readyz")).send().await.unwrap();
    let ready = json(ready).await;
    conforms(&doc, "Ready", &ready);
    let flag_props = keys(&doc["components"]["schemas"]["Ready"]["properties"]["flag"]["properties"]);
    assert!(keys(&ready["flag"]).is_subset(&flag_props), "{ready}");
    let codes: BTreeSet<String> = doc["components"]["schemas"]["Error"]["properties"]["code"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();
    // Every code the server can send is documented, and every documented code is one.
    let sent: BTreeSet<String> = vq::http::ErrorCode::iter().map(|c| c.as_str().to_owned()).collect();
    assert_eq!(sent, codes, "ErrorCode and the document's Error.code differ");
}

/// The Python tools live in the virtual environment `scripts/test.sh` creates.
fn venv_tool(name: &str) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/target/venv/bin/").to_owned() + name;
    assert!(
        std::path::Path::new(&path).exists(),
        "{path} is missing: scripts/test.sh installs it (python3 -m venv target/venv && target/venv/bin/pip install openapi-spec-validator schemathesis)"
    );
    path
}

#[tokio::test]
async fn openapi_document_passes_the_validator_and_schemathesis() {
    let doc = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json");
    let out = Command::new(venv_tool("openapi-spec-validator")).arg(doc).output().expect("run openapi-spec-validator");
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));

    let redis = RedisServer::spawn();
    let vq = VqProcess::serve(&redis, &[]).await;
    flag_on(&redis).await;
    let scratch = tempfile::tempdir().expect("tempdir");
    // Every generated request to vq's own operations gets a documented answer, never a 5xx but
    // from /gate/release, whose answer is the purchase API's failure as the proxy reports it.
    let config = "[[operations]]\ninclude-operation-id = \"gateRelease\"\nchecks.not_a_server_error.enabled = false\n";
    std::fs::write(scratch.path().join("schemathesis.toml"), config).expect("write schemathesis.toml");
    let out = Command::new(venv_tool("schemathesis"))
        // A fixed seed keeps the suite repeatable; SCHEMATHESIS_SEED picks another to explore.
        .args(["run", &format!("{}/openapi.json", vq.addr), "--max-examples", "50"])
        .args(["--seed", &std::env::var("SCHEMATHESIS_SEED").unwrap_or_else(|_| "1".into())])
        .args(["--exclude-operation-id", "purchaseLimitedDrop"])
        .env("NO_COLOR", "1")
        // It keeps a cache of what it found in its working directory: not in the checkout.
        .current_dir(scratch.path())
        .output()
        .expect("run schemathesis");
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}
