//! `vq serve`: the queue API, the gate and (unless `--no-pump`) the pump.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::{ConfigArg, init_tracing, server_runtime};
use crate::app::{ServeOptions, cancel_on_signal, run as run_app};
use crate::config::{Overrides, StoreKind, secret_from_env};

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  VQ_TOKEN_SECRET=$(head -c 32 /dev/urandom | base64) vq serve\n  vq serve --config vq.toml --listen 0.0.0.0:8080 --no-pump"
)]
pub struct Args {
    #[command(flatten)]
    config: ConfigArg,
    /// Address to listen on (overrides `listen`)
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Do not run the admission pump in this process (run `vq pump` elsewhere)
    #[arg(long)]
    no_pump: bool,
    /// Turn the queue on for every user at start-up (trial runs; `vq flag` does it in production)
    #[arg(long)]
    flag_on: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let settings = args.config.load(&Overrides { listen: args.listen })?;
    let secret = secret_from_env()?;
    init_tracing(&settings.log.format);
    if settings.store == StoreKind::Memory {
        tracing::warn!(
            "store = memory: the queue lives in this process only. SINGLE INSTANCE ONLY: do not run several vq serve on it, and state is lost on restart"
        );
        for t in settings.target_types().unwrap_or_default().into_iter().filter(|t| settings.type_shards(*t) > 1) {
            tracing::warn!(
                target_type = %t.slug(),
                shards = settings.type_shards(t),
                "targets.types.*.shards is a Redis setting: the embedded store keeps each target in one shard"
            );
        }
    }
    let settings = Arc::new(settings);
    server_runtime(settings.threads)?.block_on(async move {
        let listener = listen(settings.listen).with_context(|| format!("cannot listen on {}", settings.listen))?;
        let cancel = CancellationToken::new();
        cancel_on_signal(cancel.clone());
        run_app(listener, settings, secret, ServeOptions { pump: !args.no_pump, flag_on: args.flag_on }, cancel).await
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Connections the kernel completes and holds for vq to accept: a burst of connections (a
/// sale's opening, a flood) beyond it has SYNs dropped, which a proxy in front with a short
/// connect timeout takes for a failing replica. The kernel caps it at `net.core.somaxconn`.
const LISTEN_BACKLOG: u32 = 4096;

fn listen(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}
