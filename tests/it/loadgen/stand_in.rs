//! The purchase contract against a stand-in for vq serve and its gate: admitted users buy on
//! the gated route with their own token, and what reaches the sink is counted.

use super::*;

/// What the stand-in server saw of purchase requests: (path, X-User-Id, X-Entry-Token).
type Seen = Arc<Mutex<Vec<(String, String, String)>>>;

/// A stand-in for vq serve + gate: every enter is admitted at once with a per-user token,
/// purchase routes record their headers and answer 200 (after forwarding to `upstream`, as
/// the gate does, when one is given).
pub(super) async fn stand_in(upstream: Option<String>) -> (String, Seen) {
    let seen: Seen = Arc::default();
    let s = seen.clone();
    let client = reqwest::Client::new();
    let app = Router::new().fallback(move |uri: Uri, headers: HeaderMap| {
        let (s, client, upstream) = (s.clone(), client.clone(), upstream.clone());
        async move {
            let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
            if uri.path().starts_with("/virtual-queues/") {
                let user = h("x-user-id");
                return format!(
                    "{{\"status\":\"ADMITTED\",\"position\":null,\"aheadCount\":0,\"etaSeconds\":0,\
                     \"entryToken\":\"tok-{user}\",\"tokenExpiresAt\":\"2030-01-01T00:00:00Z\"}}"
                );
            }
            s.lock().unwrap().push((uri.path().to_owned(), h("x-user-id"), h("x-entry-token")));
            if let Some(up) = upstream {
                client.post(format!("{up}{}", uri.path())).send().await.unwrap();
            }
            "{}".to_owned()
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, seen)
}

pub(super) fn options(url: String, target: &str) -> Options {
    let target = target.parse::<QueueTarget>().unwrap();
    let routes = vq::gate::GateRoutes::compile(&vq::config::Settings::default().gate.routes).unwrap();
    Options {
        url,
        target,
        users: 20,
        first_user: 100,
        arrivals: Arrivals { curve: ArrivalCurve::Constant, rate: 200.0, warmup: Duration::ZERO },
        duration: Duration::from_secs(1),
        poll_min: Duration::from_millis(100),
        poll_max: Duration::from_millis(150),
        abandon: 0.0,
        purchase: true,
        purchase_path: routes.path_of(target).unwrap(),
        purchase_times: 1,
        conversion: 1.0,
        concurrency: 8,
        leave_at_end: false,
        batch_size: 100,
        tick_ms: 2000,
        seed: 1,
        follow_poll_after: false,
        opening_in: None,
    }
}

#[tokio::test]
async fn admitted_users_purchase_on_the_gated_route_with_their_own_token() {
    for (target, path) in
        [("limited-drop:9", "/limited-drops/9/orders"), ("ticketing-event:9", "/events/9/seats/select")]
    {
        let (url, seen) = stand_in(None).await;
        let report = vq::loadgen::run(options(url, target), Arc::new(Live::default()), None, None).await;
        assert_eq!(report.admitted, 20);
        assert_eq!((report.purchase_attempts, report.purchases), (20, 20));
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 20);
        for (p, user, token) in seen {
            assert_eq!(p, path);
            assert_eq!(token, format!("tok-{user}"), "each user sends the token it was given");
        }
    }
}

#[tokio::test]
async fn purchases_that_reach_the_sink_are_counted_as_downstream_arrivals() {
    let sink = Sink::start("127.0.0.1:0".parse().unwrap(), 60_000, Default::default()).await.unwrap();
    let (url, _) = stand_in(Some(format!("http://{}", sink.addr))).await;
    let report = vq::loadgen::run(options(url, "limited-drop:9"), Arc::new(Live::default()), None, Some(&sink)).await;
    assert_eq!(report.purchases, 20);
    assert_eq!(report.downstream_total, Some(20));
    // 60 s windows: all 20 in one window, or split in two if a boundary passed.
    assert!(report.downstream_max_per_tick.unwrap() >= 10, "{report:?}");
    assert!(report.downstream_rate_per_sec.unwrap() > 0.0);
}

/// The batch size and tick in the report are the loaded server's, not loadgen's own config
/// (which here says 100 per 2000 ms).
#[tokio::test]
async fn loadgen_reports_the_batch_size_and_tick_of_the_server_it_loads() {
    let redis = RedisServer::spawn();
    let envs = [("VQ_QUEUE__TICK_MS", "1000".to_owned()), ("VQ_QUEUE__BATCH_SIZE", "7".to_owned())];
    let server = VqProcess::serve(&redis, &envs).await;
    flag_on(&redis).await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let args = loadgen_args(&server.addr, json.to_str().unwrap(), &[]);
    let out = crate::support::vq_command().args(&args).env("VQ_REDIS__URL", redis.url()).output().expect("run loadgen");
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let report = read_json(&json);
    assert_eq!((report["batchSize"].as_u64(), report["tickMs"].as_u64()), (Some(7), Some(1000)), "{report}");
}
