//! Opening a device layer: the choice between the backends, made above them so that neither the traits nor the
//! backends know of each other.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::cuda::node::CudaNode;
use super::emulated::node::EmulatedNode;
use super::error::DeviceError;
use super::layer::DeviceLayer;

/// Which backend to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// CUDA when a driver and a GPU are present, the emulated device otherwise (and say why).
    #[default]
    Auto,
    /// CUDA, or an error.
    Cuda,
    /// The emulated device.
    Emulated,
}

/// A name that is not a [`Backend`] (`--device` on the command line, `device.backend` in a configuration).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a device layer: use auto, cuda or emulated")]
pub struct ParseBackendError(pub String);

impl std::str::FromStr for Backend {
    type Err = ParseBackendError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Backend::Auto),
            "cuda" => Ok(Backend::Cuda),
            "emulated" => Ok(Backend::Emulated),
            _ => Err(ParseBackendError(s.to_string())),
        }
    }
}

/// How to open the device layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenOptions {
    /// Which backend.
    pub backend: Backend,
    /// How many GPUs the emulated device pretends to have.
    pub emulated_gpus: u16,
    /// How much memory each emulated GPU has, in bytes (arenas beyond it fail as a full GPU would).
    pub emulated_gpu_memory: u64,
    /// Bytes a second each way between an emulated GPU and host memory; 0: as fast as memory copies go.
    pub emulated_host_link: u64,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions { backend: Backend::Auto, emulated_gpus: 2, emulated_gpu_memory: 4 << 30, emulated_host_link: 0 }
    }
}

/// An opened device layer, and why it is the emulated one when CUDA was wanted but could not be used.
pub struct Opened {
    /// The device layer.
    pub layer: Arc<dyn DeviceLayer>,
    /// Set when [`Backend::Auto`] fell back to the emulated device: the reason CUDA could not be used.
    pub fallback_reason: Option<DeviceError>,
}

/// Opens the device layer that `options` ask for.
pub fn open(options: &OpenOptions) -> Result<Opened, DeviceError> {
    let emulated = || -> Arc<dyn DeviceLayer> {
        Arc::new(
            EmulatedNode::new(options.emulated_gpus, options.emulated_gpu_memory)
                .with_host_link(options.emulated_host_link),
        )
    };
    match options.backend {
        Backend::Emulated => Ok(Opened { layer: emulated(), fallback_reason: None }),
        Backend::Cuda => Ok(Opened { layer: Arc::new(CudaNode::open()?), fallback_reason: None }),
        Backend::Auto => match CudaNode::open() {
            Ok(node) => Ok(Opened { layer: Arc::new(node), fallback_reason: None }),
            Err(e) => {
                tracing::info!(reason = %e, "no usable GPU: running on the emulated device");
                Ok(Opened { layer: emulated(), fallback_reason: Some(e) })
            }
        },
    }
}
