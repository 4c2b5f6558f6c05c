//! What a node's fabric is made of, worked out before anything is made: the device layer opened, the GPUs the
//! node's section names checked, and each arena's size. [`Fabric::for_node`](super::Fabric::for_node) makes the
//! arenas from it; `vfabric info` only prints it (making the host tier means pinning all of it: seconds per
//! tens of gigabytes, for nothing when the question is what the node has).

use std::sync::Arc;

use vfabric_allocator::{Location, COMPRESSED_BLOCK};
use vfabric_transport::{open, DeviceError, DeviceKind, DeviceLayer, OpenOptions};

use crate::config::{ClusterConfig, ConfigError};
use crate::error::FabricError;
use crate::units::ByteSize;

/// A node's devices and the arenas its fabric would make there.
pub struct NodePlan {
    pub(super) layer: Arc<dyn DeviceLayer>,
    pub(super) fallback: Option<DeviceError>,
    /// Each arena's location and size in bytes (whole frames): the node's GPUs', then host memory's, then the
    /// packed tier's when the configuration has one.
    pub arenas: Vec<(Location, u64)>,
    /// The storage tier's size in bytes (whole pages), when the configuration has one.
    pub storage: Option<u64>,
    /// The page size.
    pub page_size: u64,
}

impl NodePlan {
    /// Opens the device layer the configuration names and sizes node `node`'s arenas (its index in the
    /// `[[node]]` list): each GPU's the budget, host memory's the host arena. Refuses a GPU the node's section
    /// names that is not there, and a budget larger than its GPU.
    pub fn for_node(config: &ClusterConfig, node: u16) -> Result<NodePlan, FabricError> {
        let opened = open(&OpenOptions {
            backend: config.device.backend,
            emulated_gpus: config.device.emulated_gpus,
            emulated_gpu_memory: config.device.emulated_gpu_memory.bytes(),
            emulated_host_link: config.device.emulated_host_link.bytes(),
        })?;
        let layer = opened.layer;
        let ps = config.memory.page().bytes();
        let all: Vec<u16> = layer.gpus().iter().map(|g| g.index).collect();
        let gpus = match config.nodes.get(usize::from(node)).and_then(|n| n.gpus.clone()) {
            Some(wanted) => {
                if let Some(&g) = wanted.iter().find(|g| !all.contains(g)) {
                    return Err(FabricError::DeviceUnavailable(Location::Gpu(g)));
                }
                wanted
            }
            None => all,
        };
        let mut arenas = Vec::new();
        for &g in &gpus {
            let total = layer.gpus()[usize::from(g)].total_memory;
            if let Some(budget) = config.memory.gpu_budget.filter(|b| b.bytes() > total) {
                // Asking for more than the GPU has is a mistake to say, not to shrink quietly.
                return Err(FabricError::Config(ConfigError::Invalid {
                    origin: config.cluster.name.clone(),
                    message: format!("memory.gpu_budget {budget} is more than gpu{g} has ({})", ByteSize(total)),
                }));
            }
            arenas.push((Location::Gpu(g), config.memory.gpu_arena_bytes(total) / ps * ps));
        }
        arenas.push((Location::Host, config.memory.host_arena.bytes() / ps * ps));
        for (_, bytes, element) in config.memory.packed_arenas() {
            let slot = Location::Packed(element).frame_bytes(ps);
            if bytes >= slot {
                arenas.push((Location::Packed(element), bytes / slot * slot));
            }
        }
        let compressed = config.memory.compressed_arena.bytes() / COMPRESSED_BLOCK * COMPRESSED_BLOCK;
        if compressed > 0 {
            arenas.push((Location::Compressed, compressed));
        }
        let storage = config.storage.as_ref().map(|s| s.size.bytes() / ps * ps);
        tracing::debug!(node, gpus = gpus.len(), ?arenas, storage, "node planned");
        Ok(NodePlan { layer, fallback: opened.fallback_reason, arenas, storage, page_size: ps })
    }

    /// One line that says what the device layer is (backend and GPUs).
    pub fn describe(&self) -> String {
        self.layer.describe()
    }

    /// Which device layer runs: CUDA, or the emulated device.
    pub fn device_kind(&self) -> DeviceKind {
        self.layer.kind()
    }

    /// Why the emulated device stands in for CUDA, when `backend = "auto"` found no usable GPU.
    pub fn fallback_reason(&self) -> Option<&DeviceError> {
        self.fallback.as_ref()
    }

    /// Whether NCCL could be loaded.
    pub fn nccl_available(&self) -> bool {
        self.layer.nccl_available()
    }
}
