//! The GPUs of a CUDA node as the driver shows them: contexts, properties and which GPUs reach which. The node
//! and its mover share them, so they live apart from both.

use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::context::GpuContext;
use super::driver::{self, from_result};
use super::vmm::granularity;
use crate::device::error::DeviceError;
use crate::device::layer::GpuInfo;

/// Every GPU of the node, each through its primary context.
pub(crate) struct NodeInner {
    pub(crate) contexts: Vec<Arc<GpuContext>>,
    pub(crate) gpus: Vec<GpuInfo>,
    /// `peers[a]`: the GPUs (a included) that can load and store GPU a's memory.
    pub(crate) peers: Vec<Vec<u16>>,
    pub(crate) nccl: bool,
}

impl NodeInner {
    /// Loads the driver and opens every GPU; what `CudaNode::open` does.
    pub(crate) fn discover() -> Result<Self, DeviceError> {
        driver::init()?;
        let count = result::device::get_count().map_err(from_result("cuDeviceGetCount"))?;
        if count <= 0 {
            return Err(DeviceError::NoGpu);
        }
        let count = u16::try_from(count).map_err(|_| DeviceError::InvalidArgument(format!("{count} GPUs")))?;
        let mut contexts = Vec::new();
        let mut gpus = Vec::new();
        for g in 0..count {
            let ctx = Arc::new(GpuContext::retain(g)?);
            use sys::CUdevice_attribute::*;
            if ctx.attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED)? != 1 {
                return Err(DeviceError::Unsupported { gpu: g, feature: "virtual memory management" });
            }
            if ctx.attribute(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)? != 1 {
                return Err(DeviceError::Unsupported { gpu: g, feature: "unified addressing" });
            }
            let fd_export = ctx.attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)? == 1;
            let multiprocessors = ctx.attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(0) as u32;
            let name = result::device::get_name(ctx.device()).map_err(from_result("cuDeviceGetName"))?;
            // SAFETY: the device handle is valid.
            let total = unsafe { result::device::total_mem(ctx.device()) }.map_err(from_result("cuDeviceTotalMem"))?;
            gpus.push(GpuInfo {
                index: g,
                name,
                total_memory: total as u64,
                multiprocessors,
                granularity: granularity(g, fd_export)?,
                fd_export,
            });
            contexts.push(ctx);
        }
        let mut peers = Vec::new();
        for a in 0..count {
            let mut can = vec![a];
            for b in (0..count).filter(|&b| b != a) {
                let mut ok: std::ffi::c_int = 0;
                // SAFETY: both ordinals are valid devices.
                unsafe {
                    driver::cu!(cuDeviceCanAccessPeer(
                        &mut ok,
                        contexts[usize::from(b)].device(),
                        contexts[usize::from(a)].device()
                    ))?
                };
                if ok == 1 {
                    can.push(b);
                }
            }
            peers.push(can);
        }
        let nccl = driver::nccl_present();
        tracing::info!(gpus = count, nccl, "CUDA device layer opened");
        Ok(NodeInner { contexts, gpus, peers, nccl })
    }

    pub(crate) fn context(&self, gpu: u16) -> Result<&Arc<GpuContext>, DeviceError> {
        self.contexts.get(usize::from(gpu)).ok_or(DeviceError::NoSuchGpu { gpu, count: self.contexts.len() })
    }
}
