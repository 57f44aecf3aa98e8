use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    vq::cli::main(vq::cli::Cli::parse())
}
