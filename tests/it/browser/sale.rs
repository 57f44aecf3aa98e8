//! The waiting page through the sale lifecycle, in the real browser: the pre-queue's
//! countdown and the opening, a page that waits for the pre-queue to open and joins by
//! itself, pause and resume, and a close whose message is shown as text and stops the polls.

use vq::domain::{SaleControl, SaleSchedule, SaleSource};
use vq::store::prelude::*;
use vq::store::{AnyStore, ScheduleOutcome};

use super::*;
use crate::support::open_store;

fn target() -> QueueTarget {
    "LIMITED_DROP:42".parse().unwrap()
}

/// Schedules the page's target: pre-queue from `prequeue_in` ms (negative: already open),
/// opening `opens_in` ms from now.
async fn schedule(store: &AnyStore, prequeue_in: i64, opens_in: u64) {
    let now = vq::service::now_epoch_ms();
    let s = SaleSchedule {
        opens_at_ms: now + opens_in,
        prequeue_from_ms: Some((now as i64 + prequeue_in) as u64),
        closes_at_ms: None,
    };
    let outcome = store.schedule_sale(target(), s, [9; 32]).await.unwrap();
    assert!(matches!(outcome, ScheduleOutcome::Scheduled { .. }), "{outcome:?}");
}

const MESSAGE: &str = "return document.getElementById('vq-message').textContent";

async fn message(browser: &Browser) -> String {
    browser.eval(MESSAGE).await.as_str().unwrap().to_owned()
}

/// Waits until the message line satisfies `done` (bounded, `secs`).
async fn wait_message(browser: &Browser, secs: u64, done: impl Fn(&str) -> bool) -> String {
    let m = browser.wait_eval(MESSAGE, secs, |v| v.as_str().is_some_and(&done)).await;
    m.as_str().unwrap().to_owned()
}

/// Counts the page's requests in `window.vqCalls` from now on.
const COUNT_CALLS: &str = "window.vqCalls = 0; var f = window.fetch; \
    window.fetch = function () { window.vqCalls++; return f.apply(this, arguments); }; return 0";

/// What a tab coming back to the front does: a page with a poll pending sends it at once.
/// Answers the page's request count once that poll, if any, has been sent.
const WAKE: &str = "document.dispatchEvent(new Event('visibilitychange')); \
    return new Promise(function (r) { setTimeout(function () { r(window.vqCalls); }, 200); })";

/// The countdown's seconds in "… opens in 1 min 5 s (at …)" / "opens in 8 s".
fn seconds_left(message: &str) -> u64 {
    let t = message.split(" opens in ").nth(1).and_then(|r| r.split(" (at ").next()).unwrap_or_else(|| {
        panic!("no countdown in {message:?}");
    });
    let mut total = 0;
    let words: Vec<&str> = t.split(' ').collect();
    for pair in words.chunks(2) {
        let n: u64 = pair[0].parse().unwrap_or_else(|_| panic!("{message:?}"));
        total += n * match pair.get(1).copied() {
            Some("h") => 3600,
            Some("min") => 60,
            _ => 1,
        };
    }
    total
}

#[tokio::test]
async fn the_page_counts_down_the_pre_queue_then_lands_on_the_shop_after_the_opening() {
    let redis = RedisServer::spawn();
    let (app, shop) = page_app(&redis, |_| {}).await;
    flag_on(&redis).await;
    let store = open_store(&test_settings(Some(&redis)));
    schedule(&store, -1000, 8000).await;
    let browser = Browser::start().await;
    browser.goto(&app.url("/waiting-room/limited-drop/42?user=21")).await;
    browser.wait_status("PRE_QUEUE", 20).await;
    let opens_at = browser.eval("return document.getElementById('vq-root').getAttribute('data-vq-opens-at')").await;
    assert!(opens_at.as_str().is_some_and(|s| s.ends_with('Z')), "{opens_at}");
    let first = message(&browser).await;
    assert!(first.starts_with("You are in the pre-queue"), "{first}");
    let left = seconds_left(&first);
    // 8 s ahead, counted against the server's `Date` header, which has whole seconds: up to
    // one more second on screen.
    assert!((1..=9).contains(&left), "{first}");
    // The countdown moves on screen between polls.
    let later = wait_message(&browser, 5, |m| m.contains(" opens in ") && seconds_left(m) < left).await;
    assert!(later.contains("(at "), "{later}");
    let url = browser.wait_url_starting(&format!("{shop}/drops/42/buy?entryToken="), 40).await;
    verifies(&token_in(&url), 21);
}

#[tokio::test]
async fn a_page_opened_before_the_pre_queue_joins_it_by_itself() {
    let redis = RedisServer::spawn();
    let (app, _) = page_app(&redis, |_| {}).await;
    flag_on(&redis).await;
    let store = open_store(&test_settings(Some(&redis)));
    schedule(&store, 3000, 60_000).await;
    let browser = Browser::start().await;
    browser.goto(&app.url("/waiting-room/limited-drop/42?user=22")).await;
    browser.wait_status("SCHEDULED", 20).await;
    let m = message(&browser).await;
    assert!(m.starts_with("The waiting room opens in"), "{m}");
    assert_eq!(store.snapshot(target()).await.unwrap().prequeued, 0, "not recorded before the pre-queue");
    browser.wait_status("PRE_QUEUE", 20).await;
    assert_eq!(store.snapshot(target()).await.unwrap().prequeued, 1, "the page entered once the pre-queue opened");
}

/// A paused sale and a buyer `user` waiting on the page: nobody is admitted until the test
/// resumes or closes it. `None` when the browser tests are skipped.
struct Paused {
    _redis: RedisServer,
    _app: TestApp,
    shop: String,
    store: AnyStore,
    browser: Browser,
}

async fn paused_page(user: u64) -> Paused {
    let redis = RedisServer::spawn();
    let (app, shop) = page_app(&redis, |_| {}).await;
    flag_on(&redis).await;
    let store = open_store(&test_settings(Some(&redis)));
    assert!(store.control_sale(target(), SaleControl::Pause).await.unwrap());
    let browser = Browser::start().await;
    browser.goto(&app.url(&format!("/waiting-room/limited-drop/42?user={user}"))).await;
    browser.wait_status("WAITING", 20).await;
    Paused { _redis: redis, _app: app, shop, store, browser }
}

#[tokio::test]
async fn a_paused_sale_says_so_and_the_page_goes_on_after_the_resume() {
    let Paused { store, browser, shop, _redis, _app } = paused_page(23).await;
    let m = wait_message(&browser, 10, |m| m.contains("paused")).await;
    assert_eq!(m, "The sale is paused — you keep your place.");
    let eta = browser.eval("return document.getElementById('vq-eta').textContent").await;
    assert_eq!(eta, "–", "no estimate while nobody is admitted");
    assert!(store.control_sale(target(), SaleControl::Resume).await.unwrap());
    let url = browser.wait_url_starting(&format!("{shop}/drops/42/buy?entryToken="), 40).await;
    verifies(&token_in(&url), 23);
}

#[tokio::test]
async fn a_closed_sale_shows_its_message_as_text_and_the_page_stops_polling() {
    // Paused, so the buyer waits until the close reaches them.
    let Paused { store, browser, _redis, _app, .. } = paused_page(24).await;
    // While waiting, a poll is pending: woken, the page sends it at once.
    browser.eval(COUNT_CALLS).await;
    browser.wait_eval(WAKE, 10, |calls| calls.as_u64() >= Some(1)).await;
    let text = "<b>Sold</b> out & thanks";
    let close = SaleControl::Close { message: text.into(), source: SaleSource::Command };
    assert!(store.control_sale(target(), close).await.unwrap());
    browser.wait_status("CLOSED", 30).await;
    assert_eq!(message(&browser).await, text, "the message as text");
    let markup = browser.eval("return document.querySelectorAll('#vq-message *').length").await;
    assert_eq!(markup, 0, "no element made from the server's text");
    // Closed, no poll is pending: woken the same way, the page sends nothing.
    browser.eval(COUNT_CALLS).await;
    assert_eq!(browser.eval(WAKE).await, 0, "a closed page does not poll");
    assert_eq!(browser.state().await.0, "CLOSED");
}

/// A buyer who switches to another tab keeps polling from the hidden one (its timers run in
/// a worker) and keeps the place; back in front, the page goes on.
#[tokio::test]
async fn a_page_in_a_background_tab_keeps_polling_and_its_place() {
    let Paused { store, browser, shop, _redis, _app: app } = paused_page(25).await;
    // The hidden page's polls are counted in localStorage too, which the other tab (same
    // origin) reads while the page stays in the background.
    browser
        .eval(
            "window.vqSeen = []; window.vqHiddenCalls = 0; localStorage.setItem('vqHiddenCalls', '0');
             document.addEventListener('visibilitychange', function () { vqSeen.push(document.visibilityState); });
             var f = window.fetch;
             window.fetch = function () {
               if (document.hidden) { vqHiddenCalls++; localStorage.setItem('vqHiddenCalls', String(vqHiddenCalls)); }
               return f.apply(this, arguments);
             };
             return 0",
        )
        .await;
    let page = browser.call(reqwest::Method::GET, &format!("/session/{}/window", browser.session), Value::Null).await;
    let tab = browser
        .call(reqwest::Method::POST, &format!("/session/{}/window/new", browser.session), json!({"type": "tab"}))
        .await;
    let windows = format!("/session/{}/window", browser.session);
    browser.call(reqwest::Method::POST, &windows, json!({"handle": tab["handle"]})).await;
    // Paused: the place holds; the page is told to poll every tick (2 s) or so. Wait, from the
    // other tab, until the hidden page has polled twice.
    browser.goto(&app.url("/healthz")).await;
    let hidden_polls = "return Number(localStorage.getItem('vqHiddenCalls'))";
    browser.wait_eval(hidden_polls, 20, |n| n.as_u64() >= Some(2)).await;
    browser.call(reqwest::Method::POST, &windows, json!({"handle": page})).await;
    let seen = browser.eval("return [window.vqSeen, window.vqHiddenCalls]").await;
    assert_eq!(seen[0][0], "hidden", "the tab was in the background: {seen}");
    let calls = seen[1].as_u64().unwrap();
    assert!(calls >= 2, "polls while hidden: {seen}");
    assert_eq!(browser.state().await.0, "WAITING", "the place is kept");
    assert!(store.control_sale(target(), SaleControl::Resume).await.unwrap());
    let url = browser.wait_url_starting(&format!("{shop}/drops/42/buy?entryToken="), 40).await;
    verifies(&token_in(&url), 25);
}
