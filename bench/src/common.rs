//! Options every benchmark takes: which cluster configuration, and which device layer.

use std::path::PathBuf;

use clap::Args;
use vfabric::ClusterConfig;
use vfabric_transport::Backend;

/// `--config` and `--device`.
#[derive(Args, Debug, Clone)]
pub struct ConfigArgs {
    /// Cluster configuration (default: the embedded cluster-configs/local.toml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Device layer: auto, cuda or emulated (default: the configuration's).
    #[arg(long)]
    pub device: Option<Backend>,
}

impl ConfigArgs {
    /// The configuration, with the device layer asked for on the command line.
    pub fn load(&self) -> Result<ClusterConfig, String> {
        let mut cfg = ClusterConfig::load(self.config.as_deref()).map_err(|e| e.to_string())?;
        if let Some(b) = self.device {
            cfg.device.backend = b;
        }
        Ok(cfg)
    }
}
