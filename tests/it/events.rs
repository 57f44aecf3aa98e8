//! Events a shop subscribes to, end to end: `vq serve` processes deliver a sale's events to a
//! real HTTP receiver in order and signed; a receiver that was down gets what it missed, each
//! once, from one of two instances; a receiver that hangs leaves admission as it was; and
//! `vq events` prints the logs.

use std::io::BufRead;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use hmac::{Hmac, Mac};
use redis::AsyncCommands;
use serde_json::Value;
use sha2::Sha256;
use vq::domain::{QueueTarget, SaleControl, SaleSchedule, SaleSource};
use vq::store::AnyStore;
use vq::store::prelude::*;

use crate::support::{RedisServer, VqProcess, flag_on_before_start, free_port, open_store, test_settings, vq_command};

const EVENTS_SECRET: &str = "events-secret-9f8e7d6c5b4a3928171605f4e3d2c1b0";
const T: &str = "limited-drop/42";

/// The events of a sale scheduled with a pre-queue, opened with three users and a batch of
/// two (a milestone every two admitted), paused and resumed: the tests on both stores and on
/// `vq serve` processes expect these, then the close.
pub const SALE_TO_RESUME: [&str; 8] = [
    "sale.scheduled",
    "sale.prequeue_opened",
    "sale.opened",
    "admission.first",
    "admission.milestone",
    "queue.emptied",
    "sale.paused",
    "sale.resumed",
];

fn t() -> QueueTarget {
    "limited-drop:42".parse().unwrap()
}

/// One request the receiver took.
#[derive(Debug, Clone)]
struct Received {
    /// `X-Vq-Event-Id`.
    id: String,
    body: Value,
    /// The signature is HMAC-SHA256 of `timestamp.body` with the secret, and the id header
    /// the body's id.
    signed: bool,
}

impl Received {
    fn kind(&self) -> &str {
        self.body["type"].as_str().unwrap_or_default()
    }
}

/// What the receiver saw, shared across its restarts.
#[derive(Clone, Default)]
struct Inbox {
    got: Arc<Mutex<Vec<Received>>>,
    /// Requests that arrived, taken or not.
    requests: Arc<AtomicU64>,
    /// Never answer (the request hangs until vq gives up).
    hang: Arc<AtomicBool>,
}

impl Inbox {
    fn got(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }

    fn kinds(&self) -> Vec<String> {
        self.got().iter().map(|r| r.kind().to_owned()).collect()
    }

    /// Waits (20 s at most) until `done` holds for what was received.
    async fn wait_until(&self, what: &str, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got = self.got();
            if done(&got) {
                return got;
            }
            assert!(Instant::now() < deadline, "the receiver never got {what}; it got {:?}", self.kinds());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn signature(timestamp: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(EVENTS_SECRET.as_bytes()).unwrap();
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1={}", vq::domain::hex(&mac.finalize().into_bytes()))
}

async fn hook(State(inbox): State<Inbox>, headers: HeaderMap, body: Bytes) -> StatusCode {
    inbox.requests.fetch_add(1, Ordering::SeqCst);
    if inbox.hang.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let signed = header("x-vq-signature") == signature(&header("x-vq-timestamp"), &body);
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    // The id header is the body's id.
    let signed = signed && body["id"] == header("x-vq-event-id").as_str();
    inbox.got.lock().unwrap().push(Received { id: header("x-vq-event-id"), body, signed });
    StatusCode::OK
}

/// A webhook receiver on a loopback port: stopped and started again on the same port.
struct Receiver {
    port: u16,
    inbox: Inbox,
    running: Option<(tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>)>,
}

impl Receiver {
    async fn start(inbox: Inbox, port: u16) -> Self {
        let mut r = Self { port, inbox, running: None };
        r.restart().await;
        r
    }

    async fn restart(&mut self) {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", self.port)).await.expect("bind the receiver");
        let app = axum::Router::new().route("/hook", axum::routing::post(hook)).with_state(self.inbox.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
        });
        self.running = Some((stop, task));
    }

    /// Stops listening and closes its connections.
    async fn stop(&mut self) {
        if let Some((stop, task)) = self.running.take() {
            let _ = stop.send(());
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }
}

/// A `vq serve` delivering to `url`, with short ticks and retries.
fn events_env(url: &str) -> Vec<(&'static str, String)> {
    vec![
        ("VQ_EVENTS__WEBHOOK_URLS", format!("[\"{url}\"]")),
        ("VQ_EVENTS_SECRET", EVENTS_SECRET.to_owned()),
        ("VQ_EVENTS__POLL_MS", "100".to_owned()),
        ("VQ_EVENTS__RETRY_MIN_MS", "100".to_owned()),
        ("VQ_EVENTS__RETRY_MAX_MS", "400".to_owned()),
        ("VQ_EVENTS__TIMEOUT_MS", "1000".to_owned()),
        ("VQ_QUEUE__TICK_MS", "200".to_owned()),
    ]
}

/// A receiver for `inbox`, a `vq serve` on `redis` delivering to it (with `extra` settings),
/// and a store on the same Redis for the test's own changes.
async fn serving(
    redis: &RedisServer,
    inbox: &Inbox,
    extra: &[(&'static str, &str)],
) -> (Receiver, VqProcess, AnyStore) {
    let receiver = Receiver::start(inbox.clone(), free_port()).await;
    let mut env = events_env(&receiver.url());
    env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    let vq = VqProcess::serve(redis, &env).await;
    (receiver, vq, open_store(&test_settings(Some(redis))))
}

/// The lines a child prints on stdout, as they come.
fn stdout_lines(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().expect("stdout piped");
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

async fn enter(vq: &VqProcess, user: u64) -> Value {
    let r = reqwest::Client::new()
        .post(format!("{}/virtual-queues/{T}/entries", vq.addr))
        .header("X-User-Id", user.to_string())
        .send()
        .await
        .expect("enter");
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

/// Every event signed, once, and in its log's order (ids `<log>/<ms>-<seq>`).
fn assert_signed_once_in_order(got: &[Received]) {
    assert!(got.iter().all(|r| r.signed), "a signature does not verify: {got:?}");
    let place = |r: &Received| {
        let (_, id) = r.id.rsplit_once('/').unwrap();
        let (ms, seq) = id.split_once('-').unwrap();
        (ms.parse::<u64>().unwrap(), seq.parse::<u64>().unwrap())
    };
    assert!(got.windows(2).all(|w| place(&w[0]) < place(&w[1])), "not once each in order: {got:?}");
}

#[tokio::test]
async fn a_webhook_gets_every_event_of_a_scheduled_sale_in_order_and_signed() {
    let redis = RedisServer::spawn();
    flag_on_before_start(&redis).await;
    let inbox = Inbox::default();
    let extra = [("VQ_QUEUE__BATCH_SIZE", "2"), ("VQ_EVENTS__ADMITTED_EVERY", "2")];
    let (_receiver, vq, store) = serving(&redis, &inbox, &extra).await;
    let now = store.now_ms();
    let schedule = SaleSchedule { opens_at_ms: now + 1500, prequeue_from_ms: Some(now - 100), closes_at_ms: None };
    store.schedule_sale(t(), schedule, [9; 32]).await.unwrap();
    for u in 1..=3 {
        assert_eq!(enter(&vq, u).await["status"], "PRE_QUEUE");
    }
    inbox.wait_until("queue.emptied", |g| g.iter().any(|r| r.kind() == "queue.emptied")).await;
    assert!(store.control_sale(t(), SaleControl::Pause).await.unwrap());
    assert!(store.control_sale(t(), SaleControl::Resume).await.unwrap());
    let close = SaleControl::Close { message: "Thank you".into(), source: SaleSource::Command };
    assert!(store.control_sale(t(), close).await.unwrap());
    let got = inbox.wait_until("sale.closed", |g| g.iter().any(|r| r.kind() == "sale.closed")).await;
    assert_eq!(inbox.kinds(), [&SALE_TO_RESUME[..], &["sale.closed"]].concat());
    assert_signed_once_in_order(&got);
    assert_eq!(got[2].body["data"]["prequeued"], 3);
    assert_eq!(got[8].body["data"]["message"], "Thank you");
    assert_eq!(got[0].body["target"], "limited-drop:42");
}

#[tokio::test]
async fn a_receiver_that_was_down_gets_what_it_missed_once_each_from_one_of_two_instances() {
    let redis = RedisServer::spawn();
    let inbox = Inbox::default();
    let mut receiver = Receiver::start(inbox.clone(), free_port()).await;
    let env = events_env(&receiver.url());
    let instances = [VqProcess::serve(&redis, &env).await, VqProcess::serve(&redis, &env).await];
    let store = open_store(&test_settings(Some(&redis)));
    let later = SaleSchedule { opens_at_ms: store.now_ms() + 3_600_000, prequeue_from_ms: None, closes_at_ms: None };
    store.schedule_sale(t(), later, [1; 32]).await.unwrap();
    inbox.wait_until("sale.scheduled", |g| g.len() == 1).await;

    receiver.stop().await;
    assert!(store.control_sale(t(), SaleControl::Pause).await.unwrap());
    assert!(store.control_sale(t(), SaleControl::Resume).await.unwrap());
    let close = SaleControl::Close { message: String::new(), source: SaleSource::Command };
    assert!(store.control_sale(t(), close).await.unwrap());
    assert_eq!(store.clear_sale(t(), true).await.unwrap(), vq::store::ClearOutcome::Cleared);
    // Down for 30 s: every instance that tries is refused, and retries (backing off to 400 ms
    // here; the default backs off to a minute).
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(inbox.got().len(), 1);
    receiver.restart().await;
    inbox.wait_until("what it missed", |g| g.len() >= 5).await;
    // Time for a second delivery of any of them, if there were one.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(inbox.kinds(), ["sale.scheduled", "sale.paused", "sale.resumed", "sale.closed", "sale.cleared"]);
    assert_signed_once_in_order(&inbox.got());

    // The instance that delivered counted the refused attempts and the retries.
    let mut counted = [0u64; 3];
    for vq in &instances {
        let text = reqwest::get(format!("{}/metrics", vq.addr)).await.unwrap().text().await.unwrap();
        for (i, outcome) in ["delivered", "failed", "retried"].iter().enumerate() {
            let line = text
                .lines()
                .find(|l| {
                    l.starts_with("virtual_queue_webhook_deliveries_total")
                        && l.contains(&format!("outcome=\"{outcome}\""))
                })
                .unwrap_or_else(|| panic!("no {outcome} series from the start: {text}"));
            counted[i] += line.rsplit(' ').next().unwrap().parse::<u64>().unwrap();
        }
    }
    assert_eq!(counted[0], 5, "delivered, across both instances");
    assert!(counted[1] >= 1 && counted[2] >= 1, "failed and retried while it was down: {counted:?}");
}

#[tokio::test]
async fn a_webhook_that_hangs_does_not_change_what_each_tick_admits() {
    let redis = RedisServer::spawn();
    flag_on_before_start(&redis).await;
    let inbox = Inbox::default();
    inbox.hang.store(true, Ordering::SeqCst);
    // Each attempt hangs far longer than the whole admission takes.
    let extra = [("VQ_EVENTS__TIMEOUT_MS", "60000"), ("VQ_QUEUE__BATCH_SIZE", "5")];
    let (_receiver, vq, store) = serving(&redis, &inbox, &extra).await;
    // Paused while the line forms (a pause alone holds admission), then let go at once.
    assert!(store.control_sale(t(), SaleControl::Pause).await.unwrap());
    for u in 1..=40 {
        assert_eq!(enter(&vq, u).await["status"], "WAITING");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while inbox.requests.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the pause was never sent to the webhook");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(store.control_sale(t(), SaleControl::Resume).await.unwrap());
    let mut conn = redis.conn().await;
    let key = "queue:{LIMITED_DROP:42}:admissions";
    let deadline = Instant::now() + Duration::from_secs(20);
    let per_tick = loop {
        let rows: Vec<String> = conn.lrange(key, 0, -1).await.unwrap();
        let mut per_tick: Vec<(u64, u64)> = rows
            .iter()
            .filter_map(|r| r.split_once(':'))
            .map(|(t, n)| (t.parse().unwrap(), n.parse().unwrap()))
            .filter(|(_, n)| *n > 0)
            .collect();
        per_tick.sort();
        if per_tick.iter().map(|(_, n)| n).sum::<u64>() == 40 {
            break per_tick;
        }
        assert!(Instant::now() < deadline, "admission stalled behind the hanging webhook: {per_tick:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(per_tick.iter().map(|(_, n)| *n).collect::<Vec<_>>(), [5; 8], "one batch per tick: {per_tick:?}");
    // Still hanging on the first event it was sent; requests are answered meanwhile.
    assert_eq!(inbox.requests.load(Ordering::SeqCst), 1);
    assert!(inbox.got().is_empty());
    let poll = reqwest::Client::new()
        .get(format!("{}/virtual-queues/{T}/entries/me", vq.addr))
        .header("X-User-Id", "40")
        .send()
        .await
        .unwrap();
    assert_eq!(poll.status(), 200);
}

/// `vq events` on the test's Redis.
fn vq_events(redis: &RedisServer, args: &[&str]) -> std::process::Command {
    let mut cmd = vq_command();
    cmd.arg("events").args(args).env("VQ_REDIS__URL", redis.url());
    cmd
}

#[tokio::test]
async fn vq_events_prints_the_logs_as_json_lines_and_follows_new_ones() {
    let redis = RedisServer::spawn();
    let store = open_store(&test_settings(Some(&redis)));
    let later = SaleSchedule { opens_at_ms: store.now_ms() + 3_600_000, prequeue_from_ms: None, closes_at_ms: None };
    store.schedule_sale(t(), later, [1; 32]).await.unwrap();
    // Later than the schedule by the store's clock (logs are merged by time).
    tokio::time::sleep(Duration::from_millis(5)).await;
    let degraded = vq::domain::EventKind::Degraded { instance: "i-1".into(), answer: "failed_open".into(), count: 2 };
    store.append_instance_event(store.now_ms(), &degraded).await.unwrap();

    let out = vq_events(&redis, &[]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(
        lines.iter().map(|l| l["type"].as_str().unwrap()).collect::<Vec<_>>(),
        ["sale.scheduled", "store.degraded"]
    );
    assert_eq!(lines[1]["data"]["count"], 2);
    let first = lines[0]["id"].as_str().unwrap().to_owned();

    let mut follow = vq_events(&redis, &["--follow", "--target", "limited-drop:42"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let rx = stdout_lines(&mut follow);
    let next = || serde_json::from_str::<Value>(&rx.recv_timeout(Duration::from_secs(10)).unwrap()).unwrap();
    assert_eq!(next()["id"], first.as_str());
    assert!(store.control_sale(t(), SaleControl::Pause).await.unwrap());
    assert_eq!(next()["type"], "sale.paused", "followed as it happened");
    let _ = follow.kill();
    let _ = follow.wait();

    let out = vq_events(&redis, &["--since", &first]).output().unwrap();
    let types: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(types, ["store.degraded", "sale.paused"], "only what came after");

    let out = vq_events(&redis, &["--target", "limited-drop:100000"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "an undeclared target");
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a declared target"));

    let out = vq_events(&redis, &["--since", "yesterday"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`yesterday` is not an event id"), "{err}");
}

#[tokio::test]
async fn a_webhook_without_its_secret_or_with_a_bad_url_stops_vq_at_start_naming_it() {
    for (env, said) in [
        (vec![("VQ_EVENTS__WEBHOOK_URLS", "[\"http://127.0.0.1:9/hook\"]")], "VQ_EVENTS_SECRET is not set"),
        (vec![("VQ_EVENTS__WEBHOOK_URLS", "[\"https://hooks.example/x\"]")], "events.webhook_urls[0]"),
        (vec![("VQ_EVENTS__WEBHOOK_URLS", "[\"hooks.example/x\"]")], "must be an http:// URL"),
        (vec![("VQ_EVENTS__TIMEOUT_MS", "5")], "events.timeout_ms"),
        (vec![("VQ_EVENTS__RETRY_MAX_MS", "10")], "events.retry_max_ms (10) must be at least events.retry_min_ms"),
    ] {
        let mut cmd = vq_command();
        cmd.args(["serve", "--listen", "127.0.0.1:0"])
            .env("VQ_TOKEN_SECRET", crate::support::SECRET)
            .env("VQ_REDIS__URL", "redis://127.0.0.1:1")
            .env_remove("VQ_EVENTS_SECRET");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(!out.status.success(), "{said}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(said), "expected `{said}` in: {err}");
    }
}

/// The receiver of the README's Events section (its `python` block), as written.
fn readme_receiver() -> String {
    let readme = include_str!("../../README.md");
    let section = &readme[readme.find("\n## Events\n").expect("README has an Events section")..];
    let start = section.find("```python\n").expect("a python block") + "```python\n".len();
    let end = start + section[start..].find("```").expect("its end");
    section[start..end].to_owned()
}

#[tokio::test]
async fn the_readmes_receiver_checks_and_prints_what_vq_sends() {
    let redis = RedisServer::spawn();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("receiver.py"), readme_receiver()).unwrap();
    let port = free_port();
    let mut python = std::process::Command::new("python3")
        .arg("receiver.py")
        .arg(port.to_string())
        .current_dir(dir.path())
        .env("VQ_EVENTS_SECRET", EVENTS_SECRET)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 runs the README's receiver");
    let rx = stdout_lines(&mut python);
    let url = format!("http://127.0.0.1:{port}/hooks/vq");
    let _vq = VqProcess::serve(&redis, &events_env(&url)).await;
    let store = open_store(&test_settings(Some(&redis)));
    let later = SaleSchedule { opens_at_ms: store.now_ms() + 3_600_000, prequeue_from_ms: None, closes_at_ms: None };
    store.schedule_sale(t(), later, [1; 32]).await.unwrap();
    let out =
        vq_command().args(["sale", "pause", "limited-drop:42"]).env("VQ_REDIS__URL", redis.url()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let next = || rx.recv_timeout(Duration::from_secs(15)).expect("the receiver printed an event");
    assert!(next().starts_with("sale.scheduled limited-drop:42 {\"opensAtMs\": "));
    assert_eq!(next(), "sale.paused limited-drop:42 {\"source\": \"command\"}");
    let _ = python.kill();
    let _ = python.wait();
}

#[tokio::test]
async fn on_a_redis_cluster_each_target_logs_on_its_node_and_one_delivery_sends_them_all() {
    use crate::support::{RedisCluster, cluster_settings};
    let cluster = RedisCluster::spawn();
    let mut settings = cluster_settings(&cluster);
    settings.events.admitted_every = 1;
    let store = open_store(&settings);
    let targets: Vec<QueueTarget> = (1..=6).map(|id| format!("limited-drop:{id}").parse().unwrap()).collect();
    let later = SaleSchedule { opens_at_ms: store.now_ms() + 3_600_000, prequeue_from_ms: None, closes_at_ms: None };
    for t in &targets[..3] {
        store.schedule_sale(*t, later, [2; 32]).await.unwrap();
        assert!(store.control_sale(*t, SaleControl::Pause).await.unwrap());
    }
    // The others admit, with no sale: a first admission each.
    for t in &targets[3..] {
        for u in 1..=2u64 {
            store.enter(*t, vq::domain::UserId::from(u), &"tok").await.unwrap();
        }
        store.register_active(*t).await.unwrap();
    }
    let pump = vq::pump::Pump::new(store.clone(), Arc::new(settings.clone()), "c".into());
    pump.tick().await.unwrap();
    let mut expected: Vec<(String, &str)> = Vec::new();
    for t in &targets[..3] {
        expected.push((format!("limited-drop:{}", t.id), "sale.scheduled"));
        expected.push((format!("limited-drop:{}", t.id), "sale.paused"));
    }
    for t in &targets[3..] {
        expected.push((format!("limited-drop:{}", t.id), "admission.first"));
        expected.push((format!("limited-drop:{}", t.id), "admission.milestone"));
    }
    expected.sort();
    let mut seen = std::collections::HashMap::new();
    let read = vq::events::read_new(&store, vq::domain::EventId::ZERO, &mut seen).await.unwrap();
    let mut logged: Vec<(String, &str)> = read.iter().map(|e| (e.log.name(), e.kind.name())).collect();
    logged.sort();
    assert_eq!(logged, expected);

    // One delivery, its lease and cursors on the cluster too.
    let inbox = Inbox::default();
    let _receiver = Receiver::start(inbox.clone(), free_port()).await;
    let secret = vq::token::Secret::from_source(EVENTS_SECRET.as_bytes().to_vec(), "VQ_EVENTS_SECRET").unwrap();
    let webhook = vq::events::Webhook::new("shop", format!("http://127.0.0.1:{}/hook", _receiver.port), secret);
    let options = vq::events::DeliveryOptions {
        timeout: Duration::from_secs(1),
        retry_min: Duration::from_millis(100),
        retry_max: Duration::from_millis(400),
        poll: Duration::from_millis(100),
    };
    let cancel = tokio_util::sync::CancellationToken::new();
    let delivery = vq::events::Delivery::new(store.clone(), webhook, options, "i-1".into());
    let task = tokio::spawn(delivery.run(cancel.clone()));
    let got = inbox.wait_until("every event", |g| g.len() >= expected.len()).await;
    assert!(got.iter().all(|r| r.signed));
    let delivered: std::collections::HashSet<&str> = got.iter().map(|r| r.id.as_str()).collect();
    assert_eq!((delivered.len(), got.len()), (expected.len(), expected.len()), "once each: {got:?}");
    assert!(!store.lease_events("shop", "i-2", 1000).await.unwrap(), "i-1 holds the webhook");
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn answers_given_without_redis_are_one_event_once_redis_is_back() {
    let mut redis = RedisServer::spawn();
    let port = redis.port;
    flag_on_before_start(&redis).await;
    let inbox = Inbox::default();
    let (_receiver, vq, _) = serving(&redis, &inbox, &[]).await;
    redis.kill();
    for u in 1..=5 {
        assert_eq!(enter(&vq, u).await["status"], "DIRECT_ADMITTED");
    }
    let _back = RedisServer::spawn_on(port);
    let got = inbox
        .wait_until("store.degraded", |g| {
            g.iter()
                .filter(|r| r.kind() == "store.degraded")
                .map(|r| r.body["data"]["count"].as_u64().unwrap())
                .sum::<u64>()
                >= 5
        })
        .await;
    let degraded: Vec<&Received> = got.iter().filter(|r| r.kind() == "store.degraded").collect();
    assert!(degraded.iter().all(|r| r.body["data"]["answer"] == "failed_open" && r.signed), "{degraded:?}");
    assert!(degraded.iter().all(|r| r.id.starts_with("vq/") && r.body.get("target").is_none()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let counted: u64 = inbox
        .got()
        .iter()
        .filter(|r| r.kind() == "store.degraded")
        .map(|r| r.body["data"]["count"].as_u64().unwrap())
        .sum();
    assert_eq!(counted, 5, "each answer counted once");
}

#[tokio::test]
async fn an_instance_whose_clock_is_off_says_so_once() {
    const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
    assert!(std::path::Path::new(FAKETIME).exists(), "{FAKETIME} is missing: scripts/test.sh installs faketime");
    let redis = RedisServer::spawn();
    let inbox = Inbox::default();
    let behind = [("LD_PRELOAD", FAKETIME), ("FAKETIME", "-50s"), ("FAKETIME_DONT_FAKE_MONOTONIC", "1")];
    let (_receiver, _vq, _) = serving(&redis, &inbox, &behind).await;
    let got = inbox.wait_until("clock.drift", |g| g.iter().any(|r| r.kind() == "clock.drift")).await;
    let drift = &got.iter().find(|r| r.kind() == "clock.drift").unwrap().body;
    assert_eq!(drift["data"]["off"], true);
    let offset = drift["data"]["offsetMs"].as_i64().unwrap();
    assert!((45_000..55_000).contains(&offset), "Redis' clock minus the instance's: {offset}");
    assert!(drift["id"].as_str().unwrap().starts_with("vq/"));
    // Said once while it stays off (the upkeep looks every two seconds).
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(inbox.kinds().iter().filter(|k| *k == "clock.drift").count(), 1, "{:?}", inbox.kinds());
}

#[tokio::test]
async fn when_the_delivering_instance_dies_the_other_goes_on_from_its_cursor() {
    let redis = RedisServer::spawn();
    let inbox = Inbox::default();
    let mut receiver = Receiver::start(inbox.clone(), free_port()).await;
    let env = events_env(&receiver.url());
    let mut instances = vec![VqProcess::serve(&redis, &env).await, VqProcess::serve(&redis, &env).await];
    let store = open_store(&test_settings(Some(&redis)));
    let later = SaleSchedule { opens_at_ms: store.now_ms() + 3_600_000, prequeue_from_ms: None, closes_at_ms: None };
    store.schedule_sale(t(), later, [1; 32]).await.unwrap();
    assert!(store.control_sale(t(), SaleControl::Pause).await.unwrap());
    inbox.wait_until("the first two", |g| g.len() == 2).await;

    // The receiver goes down; the instance holding the lease dies while it retries.
    receiver.stop().await;
    assert!(store.control_sale(t(), SaleControl::Resume).await.unwrap());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut conn = redis.conn().await;
    let holder: String = conn.get(format!("queue:events:lease:{}", receiver.url())).await.unwrap();
    let dying = instances
        .iter()
        .position(|p| holder.ends_with(&format!("-{}", p.child.id())))
        .unwrap_or_else(|| panic!("the lease names one of the instances: {holder}"));
    drop(instances.remove(dying));
    let close = SaleControl::Close { message: String::new(), source: SaleSource::Command };
    assert!(store.control_sale(t(), close).await.unwrap());
    receiver.restart().await;
    inbox.wait_until("the rest", |g| g.len() >= 4).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(inbox.kinds(), ["sale.scheduled", "sale.paused", "sale.resumed", "sale.closed"]);
    assert_signed_once_in_order(&inbox.got());
    let now_holder: String = conn.get(format!("queue:events:lease:{}", receiver.url())).await.unwrap();
    assert_ne!(now_holder, holder, "the survivor took the lease");
}
