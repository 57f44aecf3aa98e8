//! `vq pump`: the admission pump alone, for a dedicated worker.

use std::process::ExitCode;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{ConfigArg, init_tracing, server_runtime};
use crate::app::{cancel_on_signal, open_store};
use crate::pump::Pump;

#[derive(clap::Args)]
#[command(after_help = "Example:\n  VQ_REDIS__URL=redis://10.0.0.5:6379 vq pump")]
pub struct Args {
    #[command(flatten)]
    config: ConfigArg,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let settings = args.config.load_shared("pump")?;
    init_tracing(&settings.log.format);
    let settings = Arc::new(settings);
    server_runtime(settings.threads)?.block_on(async move {
        let store = open_store(&settings)?;
        let cancel = CancellationToken::new();
        cancel_on_signal(cancel.clone());
        Pump::new(store, settings.clone(), settings.instance_id()).run(cancel).await;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}
