//! The HTML sale report in the real browser: one self-contained file that renders with no
//! request beyond itself, whose charts draw the report's own figures.

use vq::domain::{AnswerClass, SaleControl};
use vq::store::prelude::*;

use super::*;
use crate::support::{next_tick, open_store, vq_command};
use vq::domain::{Ms, Users};

fn target() -> QueueTarget {
    "LIMITED_DROP:42".parse().unwrap()
}

fn report(redis: &RedisServer, args: &[&str]) -> std::process::Output {
    let out = vq_command()
        .args(["sale", "report", "limited-drop:42"])
        .args(args)
        .env("VQ_REDIS__URL", redis.url())
        .output()
        .expect("run vq");
    assert!(out.status.success(), "vq sale report {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

#[tokio::test]
async fn the_html_report_renders_alone_and_its_charts_draw_the_reports_figures() {
    let browser = Browser::start().await;
    let redis = RedisServer::spawn();
    let s = test_settings(Some(&redis));
    let store = open_store(&s);
    // A small sale through the store: arrivals over three ticks, admissions, a pause, answers
    // of every kind from the purchase API.
    store.register_active(target()).await.unwrap();
    let mut user = 0;
    for wave in 1..=3 {
        for _ in 0..wave * 2 {
            user += 1;
            store.enter(target(), UserId::from(user), &"tok").await.unwrap();
        }
        next_tick(s.queue.tick_ms).await;
        store.admit(target(), Users(3), Ms(s.queue.tick_ms)).await.unwrap();
    }
    assert!(store.control_sale(target(), SaleControl::Pause).await.unwrap());
    let tick = vq::service::now_epoch_ms() / s.queue.tick_ms;
    for (i, class) in AnswerClass::ALL.into_iter().enumerate() {
        for _ in 0..=i {
            store.record_purchase(target(), tick + (i as u64 % 2), class).await.unwrap();
        }
    }

    let json: Value = serde_json::from_slice(&report(&redis, &["--json"]).stdout).expect("json");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("report.html");
    report(&redis, &["--html", file.to_str().unwrap()]);
    let html = std::fs::read_to_string(&file).unwrap();
    for external in ["<script", "src=", "href=", "<link", "url("] {
        assert!(!html.contains(external), "the report refers to something outside itself: {external}");
    }

    browser.goto(&format!("file://{}", file.display())).await;
    let drawn = browser
        .eval(
            "var out = {title: document.title, requests: performance.getEntriesByType('resource').length};
             for (var id of ['chart-arrivals', 'chart-admitted', 'chart-purchases', 'chart-waits']) {
               var svg = document.getElementById(id);
               if (!svg) { out[id] = null; continue; }
               var bars = svg.querySelectorAll('rect.bar'), sum = 0, tall = 0;
               bars.forEach(function (b) {
                 sum += Number(b.getAttribute('data-value'));
                 if (b.getBoundingClientRect().height > 0) tall += 1;
               });
               out[id] = {bars: bars.length, sum: sum, tall: tall, height: svg.getBoundingClientRect().height};
             }
             return out;",
        )
        .await;
    assert_eq!(drawn["title"], "LIMITED_DROP:42 sale report", "{drawn}");
    assert_eq!(drawn["requests"], 0, "nothing fetched besides the file: {drawn}");
    let totals = &json["totals"];
    for (id, figure) in [
        ("chart-arrivals", &totals["arrivals"]),
        ("chart-admitted", &totals["admitted"]),
        ("chart-purchases", &totals["purchasesForwarded"]),
        ("chart-waits", &json["waits"]["counted"]),
    ] {
        let chart = &drawn[id];
        assert!(figure.as_u64().unwrap() > 0, "{id}: the sale gave it data: {json}");
        assert_eq!(chart["sum"].as_u64(), figure.as_u64(), "{id} draws the report's figure: {drawn}");
        assert!(chart["bars"].as_u64().unwrap() > 0, "{id}: {drawn}");
        assert_eq!(chart["tall"], chart["bars"], "{id}: every bar has a height on screen: {drawn}");
        assert!(chart["height"].as_f64().unwrap() > 100.0, "{id} is rendered: {drawn}");
    }
    assert_eq!(totals["arrivals"], 12);
    assert_eq!(drawn["chart-purchases"]["bars"], 5, "a part per answer class with purchases in its tick");
}
