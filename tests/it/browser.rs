//! The waiting page in a real headless browser: Debian's chromium driven by chromedriver over
//! the WebDriver protocol. `scripts/test.sh` installs both; where they cannot be installed it
//! leaves these tests out of the run and says so. A missing browser fails a test that runs.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use vq::domain::{QueueTarget, UserId};

use crate::support::{RedisServer, TestApp, flag_on, free_port, secret, spawn_app, test_settings};

const DRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

/// One chromedriver (its own process group, with the chromium it starts) and one session.
struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::Client,
}

impl Browser {
    /// chromedriver and a session; a missing browser fails the test (`scripts/test.sh` leaves
    /// these tests out of the run where chromium cannot be installed, and says so).
    async fn start() -> Self {
        assert!(
            std::path::Path::new(DRIVER).exists(),
            "{DRIVER} is missing: apt-get install -y chromium chromium-driver (scripts/test.sh does)"
        );
        let port = free_port();
        let driver = Command::new(DRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("start chromedriver");
        let base = format!("http://127.0.0.1:{port}");
        // A driver that stops answering fails the call that waited on it, named, instead of
        // hanging the test (WebDriver's own script timeout is 30 s).
        let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("webdriver client");
        let deadline = Instant::now() + Duration::from_secs(20);
        while http.get(format!("{base}/status")).send().await.is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not come up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--lang=en-US"]}
        }}});
        let mut browser = Self { driver, base, session: String::new(), http };
        let v = browser.call(reqwest::Method::POST, "/session", caps).await;
        browser.session = v["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {v}")).to_owned();
        browser
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let url = format!("{}{path}", self.base);
        let mut req = self.http.request(method, url);
        if !body.is_null() {
            req = req.json(&body);
        }
        let r = req.send().await.expect("webdriver request");
        let v: Value = r.json().await.expect("webdriver json");
        assert!(v["value"].get("error").is_none(), "webdriver {path}: {v}");
        v["value"].clone()
    }

    async fn goto(&self, url: &str) {
        self.call(reqwest::Method::POST, &format!("/session/{}/url", self.session), json!({"url": url})).await;
    }

    async fn url(&self) -> String {
        let v = self.call(reqwest::Method::GET, &format!("/session/{}/url", self.session), Value::Null).await;
        v.as_str().unwrap_or_default().to_owned()
    }

    async fn eval(&self, script: &str) -> Value {
        self.call(
            reqwest::Method::POST,
            &format!("/session/{}/execute/sync", self.session),
            json!({"script": script, "args": []}),
        )
        .await
    }

    /// The page's state: `data-vq-status`, `data-vq-position` and the message line.
    async fn state(&self) -> (String, String, String) {
        let v = self
            .eval(
                "var r = document.getElementById('vq-root'); if (!r) return ['', '', ''];
                 return [r.getAttribute('data-vq-status'), r.getAttribute('data-vq-position'),
                         document.getElementById('vq-message').textContent];",
            )
            .await;
        let s = |i: usize| v[i].as_str().unwrap_or_default().to_owned();
        (s(0), s(1), s(2))
    }

    /// Evaluates `script` until its value satisfies `done` (bounded, `secs`): a wait on what
    /// the page shows, never a fixed sleep.
    async fn wait_eval(&self, script: &str, secs: u64, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let v = self.eval(script).await;
            if done(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "`{script}` never gave what was awaited; last {v}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the page's status is `status` (or the browser left the page for `leaves_to`).
    async fn wait_status(&self, status: &str, secs: u64) -> (String, String, String) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let st = self.state().await;
            if st.0 == status {
                return st;
            }
            assert!(Instant::now() < deadline, "page never showed {status}; last {st:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn wait_url_starting(&self, prefix: &str, secs: u64) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let url = self.url().await;
            if url.starts_with(prefix) {
                return url;
            }
            assert!(Instant::now() < deadline, "never sent to {prefix}; at {url}, page state {:?}", self.state().await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // chromedriver and the chromium it started share its process group.
        let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", self.driver.id())]).status();
        let _ = self.driver.wait();
    }
}

/// A gated app with a pump, `?user=` allowed, and `return_url` pointing at an echo server.
async fn page_app(redis: &RedisServer, tweak: impl FnOnce(&mut vq::config::Settings)) -> (TestApp, String) {
    let shop = crate::gate::spawn_echo().await;
    let mut s = test_settings(Some(redis));
    s.queue.batch_size = 1;
    s.page.allow_query_user = true;
    s.page.return_url = Some(format!("{shop}/drops/{{id}}/buy?entryToken={{token}}&user={{user}}"));
    tweak(&mut s);
    let app = spawn_app(s, true).await;
    (app, shop)
}

fn token_in(url: &str) -> String {
    let query = url.split_once('?').map(|(_, q)| q).unwrap_or_default();
    let raw = query.split('&').find_map(|kv| kv.strip_prefix("entryToken=")).expect("entryToken in the return URL");
    raw.replace("%2E", ".").replace("%2e", ".")
}

fn verifies(token: &str, user: u64) {
    let target: QueueTarget = "LIMITED_DROP:42".parse().unwrap();
    let now = vq::service::now_epoch_ms() / 1000;
    vq::token::verify(&secret(), token, target, &UserId::from(user), now)
        .expect("the token the page forwarded verifies");
}

#[tokio::test]
async fn a_buyer_waits_on_the_page_and_lands_on_the_shop_with_a_token_that_verifies() {
    let redis = RedisServer::spawn();
    let (app, shop) = page_app(&redis, |_| {}).await;
    flag_on(&redis).await;
    let browser = Browser::start().await;
    // Two buyers ahead: the page's user waits two ticks, polling as told.
    for u in [901, 902] {
        assert_eq!(app.enter("limited-drop/42", u).await.status(), 200);
    }
    browser.goto(&app.url("/waiting-room/limited-drop/42?user=7")).await;
    let (_, position, message) = browser.wait_status("WAITING", 20).await;
    assert_eq!(position, "3", "the page shows the fixed seq");
    assert!(message.contains("Keep this page open"), "{message}");
    let eta = browser.eval("return document.getElementById('vq-eta').textContent").await;
    assert_eq!(eta, "under a minute");
    let url = browser.wait_url_starting(&format!("{shop}/drops/42/buy?entryToken="), 30).await;
    assert!(url.ends_with("&user=7"), "{url}");
    verifies(&token_in(&url), 7);
}

#[tokio::test]
async fn a_full_queue_shows_retrying_then_lets_the_buyer_in() {
    let redis = RedisServer::spawn();
    let (app, shop) = page_app(&redis, |s| {
        s.queue.max_capacity = 1;
        s.queue.batch_size = 100;
        s.queue.tick_ms = 60_000;
    })
    .await;
    flag_on(&redis).await;
    let browser = Browser::start().await;
    assert_eq!(app.enter("limited-drop/42", 901).await.status(), 200);
    browser.goto(&app.url("/waiting-room/limited-drop/42?user=8")).await;
    let (_, _, message) = browser.wait_status("QUEUE_FULL", 20).await;
    assert!(message.contains("The queue is full"), "{message}");
    // A place frees up; the page retries after Retry-After and gets it.
    assert_eq!(app.leave("limited-drop/42", 901).await.status(), 204);
    let (_, position, _) = browser.wait_status("WAITING", 20).await;
    assert!(!position.is_empty());
    drop(shop);
}

#[tokio::test]
async fn with_redis_down_the_page_goes_on_direct_admitted() {
    let mut redis = RedisServer::spawn();
    let (app, shop) = page_app(&redis, |_| {}).await;
    flag_on(&redis).await;
    let browser = Browser::start().await;
    redis.kill();
    browser.goto(&app.url("/waiting-room/limited-drop/42?user=9")).await;
    let url = browser.wait_url_starting(&format!("{shop}/drops/42/buy?entryToken="), 30).await;
    verifies(&token_in(&url), 9);
}

#[tokio::test]
async fn the_page_speaks_korean_or_english_and_trusts_only_the_configured_identity() {
    let redis = RedisServer::spawn();
    let (app, _) = page_app(&redis, |s| s.page.allow_query_user = false).await;
    let get = |lang: &'static str, user: Option<&'static str>, path: &'static str| {
        let mut r = app.client.get(app.url(path)).header("Accept-Language", lang);
        if let Some(u) = user {
            r = r.header("X-User-Id", u);
        }
        r.send()
    };
    let ko = get("ko-KR,ko;q=0.9,en;q=0.8", Some("5"), "/waiting-room/limited-drop/42").await.unwrap();
    assert_eq!(ko.status(), 200);
    assert_eq!(ko.headers()["cache-control"], "no-store");
    let body = ko.text().await.unwrap();
    assert!(body.contains("lang=\"ko\"") && body.contains("대기열에 들어와 있습니다"), "{body}");
    let en = get("en-US", Some("5"), "/waiting-room/limited-drop/42").await.unwrap().text().await.unwrap();
    assert!(en.contains("You are in the queue"));
    assert!(!en.contains("{{"), "every placeholder is filled");
    let query_user = get("en", None, "/waiting-room/limited-drop/42?user=5").await.unwrap();
    assert_eq!(query_user.status(), 400, "?user= is off by default");
    let v: Value = query_user.json().await.unwrap();
    assert!(v["detail"].as_str().unwrap().contains("page.allow_query_user"), "{v}");
    assert_eq!(get("en", None, "/waiting-room/concert/1").await.unwrap().status(), 404, "a type not configured");
    assert_eq!(get("en", None, "/waiting-room/Concert/1").await.unwrap().status(), 400, "not a type");
}

/// A web app served from another origin calls vq from a real browser: allowed with
/// `http.cors_origins`, refused by the browser without it.
#[tokio::test]
async fn a_web_app_on_another_origin_can_call_the_queue_api_only_when_allowed() {
    async fn app_page() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        let html = "<!doctype html><title>shop</title><p>shop</p>";
        tokio::spawn(async move {
            axum::serve(listener, axum::Router::new().fallback(move || async move { axum::response::Html(html) })).await
        });
        addr
    }
    let redis = RedisServer::spawn();
    let shop = app_page().await;
    let allowed = shop.clone();
    let (vq, _) = page_app(&redis, |s| s.http.cors_origins = Some(allowed)).await;
    let (closed, _) = page_app(&redis, |_| {}).await;
    flag_on(&redis).await;
    let browser = Browser::start().await;
    browser.goto(&format!("{shop}/")).await;
    let call = |base: String| {
        format!(
            "return fetch('{base}/virtual-queues/limited-drop/42/entries', {{method: 'POST', headers: {{'X-User-Id': '11'}}}})
               .then(r => r.json()).then(b => b.status).catch(e => 'refused: ' + e.name);"
        )
    };
    assert_eq!(browser.eval(&call(vq.addr.clone())).await, "WAITING");
    let refused = browser.eval(&call(closed.addr.clone())).await;
    assert!(refused.as_str().unwrap().starts_with("refused"), "{refused}");
}

mod report;
mod sale;

impl Browser {
    /// The page's cookie named `name`, as the browser holds it (HttpOnly ones too).
    async fn cookie(&self, name: &str) -> Option<Value> {
        let v = self.call(reqwest::Method::GET, &format!("/session/{}/cookie", self.session), Value::Null).await;
        v.as_array()?.iter().find(|c| c["name"] == name).cloned()
    }

    async fn set_cookie(&self, cookie: Value) {
        let path = format!("/session/{}/cookie", self.session);
        self.call(reqwest::Method::POST, &path, json!({ "cookie": cookie })).await;
    }

    async fn refresh(&self) {
        self.call(reqwest::Method::POST, &format!("/session/{}/refresh", self.session), json!({})).await;
    }
}

/// Visitor mode: the page works without any identity from a proxy. A fresh browser gets a
/// signed cookie and a place, a reload keeps it, a second browser gets another place, and an
/// altered cookie makes a new visitor, never someone else.
#[tokio::test]
async fn visitors_get_a_cookie_and_a_place_that_a_reload_keeps_and_an_altered_cookie_loses() {
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    s.identity.mode = vq::config::IdentityMode::Visitor;
    // No pump: everyone stays waiting, so positions tell the visitors apart.
    let app = spawn_app(s, false).await;
    flag_on(&redis).await;
    let a = Browser::start().await;
    let page = app.url("/waiting-room/limited-drop/42");
    a.goto(&page).await;
    assert_eq!(a.wait_status("WAITING", 20).await.1, "1");
    let cookie = a.cookie("__Host-vq_visitor").await.expect("the page set the visitor cookie");
    assert_eq!((cookie["httpOnly"].as_bool(), cookie["secure"].as_bool()), (Some(true), Some(true)), "{cookie}");
    assert_eq!(cookie["sameSite"], "Lax", "{cookie}");
    let value = cookie["value"].as_str().unwrap().to_owned();
    assert!(a.eval("return document.cookie").await.as_str().unwrap().is_empty(), "HttpOnly: not readable by scripts");

    a.refresh().await;
    assert_eq!(a.wait_status("WAITING", 20).await.1, "1", "a reload keeps the place");
    assert_eq!(a.cookie("__Host-vq_visitor").await.unwrap()["value"], value.as_str());

    let b = Browser::start().await;
    b.goto(&page).await;
    assert_eq!(b.wait_status("WAITING", 20).await.1, "2", "another browser is another visitor");
    assert_ne!(b.cookie("__Host-vq_visitor").await.unwrap()["value"], value.as_str());

    // One character of the signature changed: not visitor 1 any more, a new one.
    let last = value.chars().last().unwrap();
    let altered = format!("{}{}", &value[..value.len() - 1], if last == 'A' { 'B' } else { 'A' });
    let mut forged = cookie.clone();
    forged["value"] = json!(altered);
    a.set_cookie(forged).await;
    a.refresh().await;
    assert_eq!(a.wait_status("WAITING", 20).await.1, "3", "an altered cookie is a new visitor");
    let renewed = a.cookie("__Host-vq_visitor").await.unwrap()["value"].as_str().unwrap().to_owned();
    assert!(renewed != value && renewed != altered, "a new visitor gets a new cookie");
}

/// Proof of work: the page solves the challenge in a worker, enters with the solution and
/// waits; the server holds a place for it only after the solution.
#[tokio::test]
async fn the_page_solves_the_proof_of_work_and_enters() {
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    s.entry.pow_bits = 14;
    s.page.allow_query_user = true;
    let app = spawn_app(s, false).await;
    flag_on(&redis).await;
    let browser = Browser::start().await;
    browser.goto(&app.url("/waiting-room/limited-drop/42?user=pow-buyer")).await;
    let (_, position, _) = browser.wait_status("WAITING", 30).await;
    assert_eq!(position, "1");
    let tries = browser.eval("return document.getElementById('vq-root').getAttribute('data-vq-pow-tries')").await;
    let tries: u64 = tries.as_str().expect("the page solved a challenge").parse().unwrap();
    assert!(tries >= 1, "{tries}");
    // The place is the solver's: a poll by the same user finds it.
    let v = app.json(app.poll("limited-drop/42", "pow-buyer").await).await;
    assert_eq!((&v["status"], &v["position"]), (&"WAITING".into(), &1.into()), "{v}");
}

/// Not a check: what the proof of work costs a buyer's browser here. `scripts/bench.sh pow`
/// runs it: POW_BITS (18) and POW_RUNS (9) page loads, each a new user with a new challenge;
/// prints each solve (the worker's own time and hashes) and the median.
#[tokio::test]
#[ignore = "a measurement: scripts/bench.sh pow"]
async fn measure_pow_in_chromium() {
    let bits: u8 = std::env::var("POW_BITS").ok().and_then(|b| b.parse().ok()).unwrap_or(18);
    let runs: u32 = std::env::var("POW_RUNS").ok().and_then(|b| b.parse().ok()).unwrap_or(9);
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    s.entry.pow_bits = bits;
    s.page.allow_query_user = true;
    let app = spawn_app(s, false).await;
    flag_on(&redis).await;
    let browser = Browser::start().await;
    let mut ms = Vec::new();
    for run in 0..runs {
        browser.goto(&app.url(&format!("/waiting-room/limited-drop/42?user=measure-{run}"))).await;
        browser.wait_status("WAITING", 300).await;
        let v = browser
            .eval(
                "var r = document.getElementById('vq-root');
                 return [r.getAttribute('data-vq-pow-ms'), r.getAttribute('data-vq-pow-tries')];",
            )
            .await;
        let n = |i: usize| v[i].as_str().unwrap_or_default().parse::<u64>().unwrap_or(0);
        let (took, tries) = (n(0), n(1));
        println!("pow chromium run {run}: {bits} bits, {tries} hashes, {took} ms");
        ms.push(took);
    }
    ms.sort_unstable();
    println!("pow chromium median: {} ms over {runs} solves at {bits} bits", ms[ms.len() / 2]);
}

/// A presale link (`?laneCode=…`) puts its buyer in the lane, and the page shows the lane next
/// to the position; a code already used by another buyer is refused and the page goes on in
/// the public lane, saying which code it was refused with.
#[tokio::test]
async fn a_presale_link_puts_the_buyer_in_the_lane_and_a_used_code_leaves_the_next_in_public() {
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    s.page.allow_query_user = true;
    let t = s.targets.types.iter_mut().find(|t| t.slug == "limited-drop").unwrap();
    t.lanes = vec![vq::config::LaneSettings { name: "members".into(), share: 70, opens_before_s: 0 }];
    let store = crate::support::open_store(&s);
    let app = spawn_app(s, false).await;
    flag_on(&redis).await;
    let target: QueueTarget = "LIMITED_DROP:42".parse().unwrap();
    let members = "members".parse().unwrap();
    let hashes = ["FAN-1", "FAN-2"].map(|c| vq::lane::code_hash(target, c));
    store.import_codes(target, members, &hashes, 1).await.unwrap();
    // FAN-2 is used by another buyer first.
    let r = app
        .client
        .post(app.url("/virtual-queues/limited-drop/42/entries"))
        .header("X-User-Id", "950")
        .json(&json!({"laneCode": "FAN-2"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let browser = Browser::start().await;
    browser.goto(&app.url("/waiting-room/limited-drop/42?user=7&laneCode=FAN-1")).await;
    let (_, position, _) = browser.wait_status("WAITING", 20).await;
    assert_eq!(position, "2", "behind buyer 950 in the members' lane");
    let lane = browser.eval("return [document.getElementById('vq-root').getAttribute('data-vq-lane'), document.getElementById('vq-lane').textContent]").await;
    assert_eq!(lane, json!(["members", " · members"]));
    browser.goto(&app.url("/waiting-room/limited-drop/42?user=8&laneCode=FAN-2")).await;
    browser.wait_status("WAITING", 20).await;
    let seen = browser
        .eval("var r = document.getElementById('vq-root'); return [r.getAttribute('data-vq-lane'), r.getAttribute('data-vq-lane-refused')]")
        .await;
    assert_eq!(seen, json!(["public", "LANE_CODE_USED"]), "the used code refused, the buyer in the public lane");
}
