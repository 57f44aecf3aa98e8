//! Pause and resume across ticks, the three ways a sale closes, and the ledger.

use super::*;

#[tokio::test]
async fn pause_holds_admission_across_ticks_and_resume_releases_it() {
    let redis = RedisServer::spawn();
    let (app, s) = app_on(&redis).await;
    for u in 1..=25 {
        app.enter(T, u).await;
    }
    let store = open_store(&s);
    assert!(store.control_sale(target(), SaleControl::Pause).await.unwrap());
    let b = poll_until(&app, 25, |b| b["paused"] == true).await;
    assert_eq!(b["status"], "WAITING");
    documented("Status", &b);
    assert_eq!(app.json(app.enter(T, 26).await).await["paused"], true);
    let pump = Pump::new(open_store(&s), s.clone(), "p".into());
    for _ in 0..3 {
        next_tick(s.queue.tick_ms).await;
        let t = pump.tick().await.unwrap();
        let a = t[0].as_ref().unwrap().admit.unwrap();
        assert_eq!((a.advanced, a.admitted, a.mark), (false, 0, 0), "paused: nobody admitted");
    }
    assert!(!store.control_sale(target(), SaleControl::Pause).await.unwrap(), "pausing twice changes nothing");
    assert!(store.control_sale(target(), SaleControl::Resume).await.unwrap());
    poll_until(&app, 25, |b| b.get("paused").is_none()).await;
    next_tick(s.queue.tick_ms).await;
    let t = pump.tick().await.unwrap();
    assert_eq!(t[0].as_ref().unwrap().admit.unwrap().admitted, 10);
    let kinds: Vec<String> = store
        .sale_ledger(target())
        .await
        .unwrap()
        .iter()
        .map(|e| serde_json::to_value(e).unwrap()["kind"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kinds, ["admission", "resume", "pause"], "newest first");
}

#[tokio::test]
async fn a_closed_sale_answers_closed_and_admitted_users_keep_their_tokens() {
    let redis = RedisServer::spawn();
    let (app, s) = app_on(&redis).await;
    for u in 1..=15 {
        app.enter(T, u).await;
    }
    let pump = Pump::new(open_store(&s), s.clone(), "p".into());
    next_tick(s.queue.tick_ms).await;
    let _ = pump.tick().await.unwrap();
    let admitted = app.json(app.poll(T, 1).await).await;
    assert_eq!(admitted["status"], "ADMITTED");
    let out = cli(&redis, &["sale", "close", "limited-drop:7", "--message", "Sold out"]);
    assert!(out.status.success(), "{}", stderr(&out));
    poll_until(&app, 15, |b| b["status"] == "CLOSED").await;
    for resp in [app.enter(T, 99).await, app.poll(T, 15).await, app.enter(T, 15).await] {
        let (code, retry, b) = body(&app, resp).await;
        assert_eq!((code, b["status"].as_str(), b["message"].as_str()), (200, Some("CLOSED"), Some("Sold out")), "{b}");
        assert!(retry.is_none() && b.get("pollAfterSeconds").is_none(), "closed: stop polling");
        documented("Status", &b);
    }
    // Admitted before the close: user 1 keeps the token, user 2 (not polled yet) gets one.
    let again = app.json(app.poll(T, 1).await).await;
    assert_eq!(again["entryToken"], admitted["entryToken"]);
    let late = app.json(app.poll(T, 2).await).await;
    assert_eq!(late["status"], "ADMITTED", "{late}");
    let token = late["entryToken"].as_str().unwrap();
    vq::token::verify(&secret(), token, target(), &UserId::from(2), now_ms() / 1000).expect("the token still verifies");
    next_tick(s.queue.tick_ms).await;
    let t = pump.tick().await.unwrap();
    assert_eq!(t[0].as_ref().unwrap().admit.unwrap().admitted, 0, "nobody admitted after the close");
    let shown = show_json(&redis);
    assert_eq!((shown["state"].as_str(), shown["closeSource"].as_str()), (Some("closed"), Some("command")));
}

#[tokio::test]
async fn closes_at_closes_the_sale_and_the_ledger_says_by_schedule() {
    let redis = RedisServer::spawn();
    let (app, s) = app_on(&redis).await;
    let store = open_store(&s);
    let opens_at = schedule(&store, 300, None, Some(1300)).await;
    until(opens_at).await;
    assert_eq!(app.json(app.enter(T, 1).await).await["status"], "WAITING");
    until(opens_at + 1000).await;
    let b = app.json(app.poll(T, 1).await).await;
    assert_eq!(b["status"], "CLOSED", "{b}");
    assert_eq!(app.json(app.enter(T, 2).await).await["status"], "CLOSED");
    let pump = Pump::new(open_store(&s), s.clone(), "p".into());
    let _ = pump.tick().await.unwrap();
    let ledger = store.sale_ledger(target()).await.unwrap();
    assert!(
        matches!(&ledger[0], vq::domain::LedgerEntry::Close { source: vq::domain::SaleSource::Schedule, .. }),
        "{ledger:?}"
    );
}

#[tokio::test]
async fn the_purchase_api_closes_the_sale_with_its_header_which_the_buyer_never_sees() {
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    s.gate.upstream = Some(spawn_closing_upstream("Sold out, sorry").await);
    s.gate.pace = false;
    let s = Arc::new(s);
    let app = spawn_app((*s).clone(), false).await;
    flag_on(&redis).await;
    for u in 1..=12 {
        app.enter(T, u).await;
    }
    let pump = Pump::new(open_store(&s), s.clone(), "p".into());
    next_tick(s.queue.tick_ms).await;
    let _ = pump.tick().await.unwrap();
    let token = app.json(app.poll(T, 1).await).await["entryToken"].as_str().unwrap().to_owned();
    let resp = app
        .client
        .post(app.url("/limited-drops/7/orders"))
        .header("X-User-Id", "1")
        .header("X-Entry-Token", &token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    assert!(resp.headers().get("x-queue-close").is_none(), "stripped from the buyer's response");
    let b = poll_until(&app, 12, |b| b["status"] == "CLOSED").await;
    assert_eq!((b["status"].as_str(), b["message"].as_str()), (Some("CLOSED"), Some("Sold out, sorry")), "{b}");
    let ledger = open_store(&s).sale_ledger(target()).await.unwrap();
    assert!(
        matches!(&ledger[0], vq::domain::LedgerEntry::Close { source, message, .. }
            if *source == vq::domain::SaleSource::PurchaseApi && message == "Sold out, sorry"),
        "{ledger:?}"
    );
}

/// A purchase API that sells the last item: 201 with `X-Queue-Close: <message>`.
async fn spawn_closing_upstream(message: &'static str) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().fallback(move || async move {
        (axum::http::StatusCode::CREATED, [("X-Queue-Close", message)], "{\"order\":1}")
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test]
async fn the_ledger_records_every_step_and_its_admissions_sum_to_admitted_count() {
    let redis = RedisServer::spawn();
    let (app, s) = app_on(&redis).await;
    for u in 1..=34 {
        app.enter(T, u).await;
    }
    let a = Pump::new(open_store(&s), s.clone(), "pump-a".into());
    let b = Pump::new(open_store(&s), s.clone(), "pump-b".into());
    for i in 0..5 {
        next_tick(s.queue.tick_ms).await;
        let _ = if i % 2 == 0 { a.tick().await } else { b.tick().await }.unwrap();
    }
    let out = cli(&redis, &["sale", "ledger", "limited-drop:7", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let stats = app.json(app.client.get(app.url(&format!("/virtual-queues/{T}/stats"))).send().await.unwrap()).await;
    assert_eq!(stats["admittedCount"], 34);
    assert_eq!(report["admitted"], 34, "{report}");
    assert_eq!(report["admittedCount"], 34);
    let rows = report["entries"].as_array().unwrap();
    let sum: u64 = rows.iter().filter(|r| r["kind"] == "admission").map(|r| r["admitted"].as_u64().unwrap()).sum();
    assert_eq!(sum, 34);
    assert_eq!(rows.len(), 4, "10 + 10 + 10 + 4, idle ticks are not rows: {rows:?}");
    assert_eq!((rows[0]["markBefore"].as_u64(), rows[0]["markAfter"].as_u64()), (Some(0), Some(10)));
    assert_eq!(rows[0]["instance"], "pump-a");
    assert_eq!(rows[1]["instance"], "pump-b");
    assert!(rows.windows(2).all(|w| w[0]["markAfter"] == w[1]["markBefore"]), "contiguous marks");
    let text = stdout(&cli(&redis, &["sale", "ledger", "limited-drop:7"]));
    assert!(text.contains("admitted in the ledger: 34; stats admittedCount: 34"), "{text}");
}
