//! The KEYS and ARGV of `enter.lua` and `status.lua` as `scripts/bench.sh lua` sends them,
//! built from vq's declarations (`vq::store::layout`, checked against the scripts' headers by
//! vq's tests), so the benchmark keeps no argument list of its own: the target keys before the
//! users' (one line, names after `queue:{T}:`), then the arguments before the users (one line,
//! separated by tabs). `status.lua` takes a token for each user after the users.
//! The benchmark's own choices are the values set here: a capacity nobody reaches, no fence,
//! a 2 s tick, a 30-day record, no count of the queues each user holds.
//!
//! Usage: cargo run --example script_args -- enter|status

use vq::store::layout::{self, EnterArgs, ScriptArgs, StatusArgs};

fn main() {
    let op = std::env::args().nth(1).unwrap_or_default();
    let (keys, argv) = match op.as_str() {
        "enter" => (
            layout::ENTER_KEYS,
            EnterArgs {
                capacity: 100_000_000,
                key_ttl_s: 1800,
                seq_seen: 0,
                seq_to: 0,
                mark_seen: 0,
                tick_ms: 2000,
                record_ttl_s: 30 * 86_400,
                hold_max: 0,
                // Unread with hold_max 0.
                hold_target: "",
                hold_generation: 0,
                hold_generation_ms: 0,
            }
            .argv(),
        ),
        "status" => (
            layout::STATUS_KEYS,
            StatusArgs {
                mark_seen: 0,
                key_ttl_s: 1800,
                token_ttl_s: 300,
                record_ttl_s: 30 * 86_400,
                hold_target: "",
                hold_generation: 0,
                hold_generation_ms: 0,
            }
            .argv(),
        ),
        _ => {
            eprintln!("usage: script_args enter|status");
            std::process::exit(2);
        }
    };
    println!("{}", keys.join(" "));
    let argv: Vec<String> = argv.iter().map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    // Tab-separated: an argument may be empty.
    println!("{}", argv.join("\t"));
}
