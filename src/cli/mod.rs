//! Command line: one file per subcommand, each an `Args` struct and a `run`. The only
//! place in vq that prints.

mod batch;
mod config_error;
mod events;
mod flag;
mod fleet;
mod lane;
mod loadgen;
mod pow;
mod pump;
mod sale;
mod serve;
mod stats;
mod target;
mod token;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::{LogFormat, Overrides, Settings, redact_credentials};

#[derive(Parser)]
#[command(name = "vq", version, about = "A virtual waiting room for flash sales", long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the queue API (and the pump, unless --no-pump)
    Serve(serve::Args),
    /// Run the admission pump only
    Pump(pump::Args),
    /// Dashboard of every active queue, read from Redis (--watch, --json)
    Stats(stats::Args),
    /// Show or change the virtual-queue.enabled flag
    Flag(flag::Args),
    /// Create an entry token
    Mint(token::MintArgs),
    /// Decode and check an entry token, saying why it fails
    Verify(token::VerifyArgs),
    /// Show or set the batch size at runtime, globally or per target
    Batch(batch::Args),
    /// Show or set the proof-of-work difficulty at entry, at runtime
    Pow(pow::Args),
    /// Simulate a flash sale against a running vq serve and report
    Loadgen(loadgen::Args),
    /// A target's sale: schedule, pre-queue, pause, close, ledger
    Sale(sale::Args),
    /// Declare the targets queues answer for: add, list, remove
    Target(target::Args),
    /// A target's lanes (presales, members first): add, list, remove, access codes
    Lane(lane::Args),
    /// The serving instances side by side: declarations, settings, drift (--check)
    Fleet(fleet::Args),
    /// The event logs as JSON lines: sale changes, outflow, milestones (--follow, --since)
    Events(events::Args),
}

/// `--config FILE`, shared by every command that reads settings.
#[derive(clap::Args, Clone, Default)]
pub struct ConfigArg {
    /// Path of a vq.toml (default: built-in defaults, then VQ_… environment)
    #[arg(long, value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,
}

impl ConfigArg {
    pub fn load(&self, overrides: &Overrides) -> anyhow::Result<Settings> {
        Settings::load(self.config.as_deref(), overrides)
            .map_err(|e| anyhow::anyhow!("configuration: {}", config_error::describe(&e)))
    }

    /// Settings for an operator command that works on the shared Redis (`vq flag`, `pump`,
    /// `stats`, `batch`): the embedded store lives inside one `vq serve`, out of its reach.
    pub fn load_shared(&self, command: &str) -> anyhow::Result<Settings> {
        let settings = self.load(&Overrides::default())?;
        if settings.store == crate::config::StoreKind::Memory {
            anyhow::bail!("vq {command} needs store = redis: the embedded store lives inside one vq serve");
        }
        Ok(settings)
    }
}

/// Log output that never fails nor blocks: tracing-appender's non-blocking writer, lossy,
/// queues each line for one thread that writes it to stderr; a line that does not fit (stderr
/// stalled) is dropped, and the thread ignores a failed write (stderr closed, a log collector
/// that died). Writing directly would block every thread that logs behind a stalled reader,
/// and tracing's fmt layer reports a failed write with `eprintln!`, which panics on a closed
/// stderr in whatever task was logging — a request handler or the signal handler.
const LOG_QUEUE_LINES: usize = 10_000;

/// The log writer's guard: dropped before the process exits, it writes what is queued (for
/// about a second at most).
static LOG_GUARD: std::sync::Mutex<Option<tracing_appender::non_blocking::WorkerGuard>> = std::sync::Mutex::new(None);

/// Writes the queued log lines, so the last lines before an exit are not lost.
fn flush_logs() {
    let guard = LOG_GUARD.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    drop(guard);
}

fn init_tracing(format: &LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(LOG_QUEUE_LINES)
        .thread_name("vq-log")
        .finish(std::io::stderr());
    *LOG_GUARD.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(guard);
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer).with_ansi(ansi);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// The runtime of the short commands: one worker per core.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    server_runtime(0)
}

/// The runtime of the long-running commands, sized by the `threads` setting: 0 = one worker
/// per core, 1 = a single-threaded runtime, n = n workers.
fn server_runtime(threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = match threads {
        0 => tokio::runtime::Builder::new_multi_thread(),
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
    };
    Ok(builder.enable_all().build()?)
}

/// Output closed by its reader (`vq flag status | head -1`): the command is done. `println!`
/// panics on a closed stdout; this hook turns that panic into a quiet exit 0 (and the same
/// panic of `eprintln!` on a closed stderr into exit 1: the command was reporting an error).
fn exit_quietly_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message =
            payload.downcast_ref::<String>().map(String::as_str).or_else(|| payload.downcast_ref::<&str>().copied());
        if let Some(m) = message.filter(|m| is_broken_pipe_text(m)) {
            if m.starts_with("failed printing to stdout") {
                std::process::exit(0);
            }
            if m.starts_with("failed printing to stderr") {
                std::process::exit(1);
            }
        }
        default(info);
    }));
}

fn is_broken_pipe_text(message: &str) -> bool {
    message.contains("Broken pipe") || message.contains("broken pipe")
}

/// Runs a command; errors are printed as one line on stderr with exit code 1 (commands that
/// define their own codes, like verify, return them).
pub fn main(cli: Cli) -> ExitCode {
    exit_quietly_on_closed_stdout();
    let result = match cli.command {
        Command::Serve(a) => serve::run(a),
        Command::Pump(a) => pump::run(a),
        Command::Stats(a) => stats::run(a),
        Command::Flag(a) => flag::run(a),
        Command::Mint(a) => token::mint(a),
        Command::Verify(a) => token::verify(a),
        Command::Batch(a) => batch::run(a),
        Command::Pow(a) => pow::run(a),
        Command::Loadgen(a) => loadgen::run(a),
        Command::Sale(a) => sale::run(a),
        Command::Target(a) => target::run(a),
        Command::Lane(a) => lane::run(a),
        Command::Fleet(a) => fleet::run(a),
        Command::Events(a) => events::run(a),
    };
    flush_logs();
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The Redis this command talks to, for messages: credentials replaced by `***`.
pub(crate) fn redis_location(settings: &Settings) -> String {
    match settings.redis_cluster_nodes() {
        Some(nodes) => format!("cluster {}", redact_credentials(&nodes.join(","))),
        None => settings.redis.url.to_string(),
    }
}
