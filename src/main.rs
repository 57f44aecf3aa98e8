use std::process::ExitCode;

use clap::Parser;

/// mimalloc, not glibc's malloc: under the flash sale's load (`scripts/bench.sh sale`, 256
/// connections) glibc's arena locks and chunk consolidation took ~15 % of vq's CPU; with mimalloc
/// a request costs ~7 % less CPU in vq and in loadgen, which share this binary.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    vq::cli::main(vq::cli::Cli::parse())
}
