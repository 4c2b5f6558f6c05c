//! The `vfabric` command.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use vfabric::{ClusterConfig, Fabric};
use vfabric_transport::Backend;

#[derive(Parser)]
#[command(
    name = "vfabric",
    version,
    about = "A distributed GPU memory fabric: one address space over every GPU, host and drive"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a region into GPU memory, move it GPU -> GPU -> host -> GPU, verify every byte, show how fast.
    /// Runs on the emulated device (and says so) where there is no GPU.
    Demo {
        /// Cluster configuration (default: the embedded cluster-configs/local.toml).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Device layer, overriding the configuration: auto, cuda or emulated.
        #[arg(long)]
        device: Option<Backend>,
    },
    /// Show the devices of this node and the arenas the configuration would create on them.
    Info {
        /// Cluster configuration (default: the embedded cluster-configs/local.toml).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Device layer, overriding the configuration: auto, cuda or emulated.
        #[arg(long)]
        device: Option<Backend>,
    },
    /// Check a cluster configuration file and print it with every default filled in.
    CheckConfig {
        /// The file.
        path: PathBuf,
    },
}

fn load(config: Option<PathBuf>, device: Option<Backend>) -> Result<ClusterConfig, String> {
    let mut cfg = ClusterConfig::load(config.as_deref()).map_err(|e| e.to_string())?;
    if let Some(b) = device {
        cfg.device.backend = b;
    }
    Ok(cfg)
}

fn main() -> ExitCode {
    vfabric::logging::init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo { config, device } => load(config, device).and_then(|cfg| {
            let r = vfabric::demo::run(&cfg, &mut std::io::stdout()).map_err(|e| e.to_string())?;
            if r.all_verified() {
                Ok(())
            } else {
                Err("some pages did not arrive intact".into())
            }
        }),
        Command::Info { config, device } => load(config, device).and_then(|cfg| {
            let fabric = Fabric::embedded(&cfg).map_err(|e| e.to_string())?;
            if let Some(why) = fabric.fallback_reason() {
                println!("no usable GPU ({why}): the emulated device stands in");
            }
            println!("{}", fabric.layer().describe());
            println!("NCCL: {}", if fabric.layer().nccl_available() { "available" } else { "not found" });
            let ps = fabric.page_size();
            for d in fabric.stats().directory.devices {
                let bytes = u64::from(d.frames) * ps;
                println!(
                    "  {}: arena {} = {} frames of {}",
                    d.location,
                    vfabric::ByteSize(bytes),
                    d.frames,
                    vfabric::ByteSize(ps)
                );
            }
            Ok(())
        }),
        Command::CheckConfig { path } => ClusterConfig::from_file(&path).map_err(|e| e.to_string()).and_then(|cfg| {
            let text = toml_text(&cfg)?;
            println!("{text}");
            Ok(())
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn toml_text(cfg: &ClusterConfig) -> Result<String, String> {
    toml::to_string_pretty(cfg).map_err(|e| e.to_string())
}
