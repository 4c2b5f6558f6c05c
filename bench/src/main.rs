//! `vfabric-bench`: vfabric's benchmark harness. Every figure is measured beside its baseline in the same
//! invocation and reported as a ratio to it.

mod baselines;
mod migrate;
mod report;
mod rig;
mod stats;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "vfabric-bench",
    version,
    about = "vfabric's benchmark harness: every figure beside its baseline, from the same run"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Pages moved GPU->GPU, GPU<->host and both ways at once, per engine, beside a plain copy of the same bytes.
    Migrate(migrate::MigrateArgs),
}

fn main() -> ExitCode {
    vfabric::logging::init();
    let command_line = std::env::args().collect::<Vec<_>>().join(" ");
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Migrate(args) => migrate::run(args, &command_line).map(|_| ()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
