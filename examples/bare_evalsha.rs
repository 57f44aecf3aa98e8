//! Calibration for `scripts/bench.sh`: a bare axum handler doing one EVALSHA (`return 1`)
//! per request through a redis-rs ConnectionManager: the ceiling this machine gives any
//! Redis-backed HTTP handler, to compare vq's enter and poll against.
//!
//! Every path and method gets that handler, so wrk's enter and poll scripts can be sent to it
//! too: the same calibration under the requests vq gets (their client-side cost included).
//! `GET /no-redis` answers without Redis: the cost of HTTP alone on this machine, the floor
//! under any request whatever the server does with it.
//!
//! Usage: cargo run --release --example bare_evalsha -- REDIS_URL LISTEN_ADDR

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use redis::Script;
use redis::aio::ConnectionManager;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:8099".into());
    let conn = ConnectionManager::new(redis::Client::open(url)?).await?;
    async fn handler(State(mut conn): State<ConnectionManager>) -> String {
        let script = Script::new("return 1");
        let reply: Result<i64, _> = script.invoke_async(&mut conn).await;
        match reply {
            Ok(v) => v.to_string(),
            Err(e) => e.to_string(),
        }
    }
    let app = Router::new()
        .route("/", get(handler))
        .route("/no-redis", get(|| async { "1" }))
        .fallback(handler)
        .with_state(conn);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    axum::serve(listener, app).await?;
    Ok(())
}
