//! CUDA virtual memory management: reserved address ranges, physical chunks, mappings, access and sharing.
//!
//! Each type releases what it holds on drop. An arena drops its mappings before its chunks and its chunks before
//! its range, which is the order the driver requires.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use cudarc::driver::sys;

use super::driver::cu;
use crate::device::error::DeviceError;

type Handle = sys::CUmemGenericAllocationHandle;

fn prop(gpu: u16, exportable: bool) -> sys::CUmemAllocationProp {
    // SAFETY: CUmemAllocationProp is a plain C struct for which all-zero is a valid (default) value; it has a
    // raw pointer field and no Default impl.
    let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes = if exportable {
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    } else {
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
    };
    p.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = i32::from(gpu);
    p
}

/// The smallest size (and alignment) of a physical chunk on `gpu`: 2 MiB on Hopper.
pub fn granularity(gpu: u16, exportable: bool) -> Result<u64, DeviceError> {
    let p = prop(gpu, exportable);
    let mut g: usize = 0;
    // SAFETY: `p` and `g` are valid for the call.
    unsafe {
        cu!(cuMemGetAllocationGranularity(
            &mut g,
            &p,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM
        ))?;
    }
    Ok(g as u64)
}

/// A reserved range of virtual addresses, freed on drop.
#[derive(Debug)]
pub struct VirtualRange {
    base: sys::CUdeviceptr,
    len: usize,
}

impl VirtualRange {
    /// Reserves `len` bytes of address space aligned to `align`.
    pub fn reserve(len: u64, align: u64) -> Result<Self, DeviceError> {
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: `base` is a valid out pointer.
        unsafe { cu!(cuMemAddressReserve(&mut base, len as usize, align as usize, 0, 0))? };
        Ok(VirtualRange { base, len: len as usize })
    }

    /// The first address.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Its size in bytes.
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for VirtualRange {
    fn drop(&mut self) {
        // SAFETY: reserved in `reserve`, freed once; mappings inside were dropped first.
        if let Err(e) = unsafe { cu!(cuMemAddressFree(self.base, self.len)) } {
            tracing::warn!(error = %e, "releasing a reserved range failed");
        }
    }
}

/// Physical memory on one GPU, released on drop (the memory itself lives on while it is still mapped).
#[derive(Debug)]
pub struct PhysicalChunk {
    handle: Handle,
    gpu: u16,
    len: u64,
    exportable: bool,
}

impl PhysicalChunk {
    /// Creates `len` bytes (a multiple of the granularity) of device memory on `gpu`; `exportable` chunks can be
    /// shared with other processes as POSIX file descriptors.
    pub fn create(gpu: u16, len: u64, exportable: bool) -> Result<Self, DeviceError> {
        let p = prop(gpu, exportable);
        let mut handle: Handle = 0;
        // SAFETY: `p` and `handle` are valid for the call.
        unsafe { cu!(cuMemCreate(&mut handle, len as usize, &p, 0))? };
        Ok(PhysicalChunk { handle, gpu, len, exportable })
    }

    /// Imports a chunk that another process (or this one) exported with [`PhysicalChunk::export_fd`]. The
    /// descriptor stays the caller's.
    pub fn import_fd(fd: BorrowedFd<'_>, gpu: u16, len: u64) -> Result<Self, DeviceError> {
        let mut handle: Handle = 0;
        // SAFETY: the driver reads the descriptor number passed by value in the pointer argument, as the
        // POSIX handle type specifies; it does not take ownership of the descriptor.
        unsafe {
            cu!(cuMemImportFromShareableHandle(
                &mut handle,
                fd.as_raw_fd() as isize as *mut std::ffi::c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
            ))?
        };
        Ok(PhysicalChunk { handle, gpu, len, exportable: true })
    }

    /// Exports the chunk as a POSIX file descriptor that another process can import (sent over a Unix socket).
    pub fn export_fd(&self) -> Result<OwnedFd, DeviceError> {
        if !self.exportable {
            return Err(DeviceError::Unsupported {
                gpu: self.gpu,
                feature: "exporting this chunk as a file descriptor",
            });
        }
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: `fd` is a valid out location of the size the POSIX handle type writes.
        unsafe {
            cu!(cuMemExportToShareableHandle(
                &mut fd as *mut std::ffi::c_int as *mut std::ffi::c_void,
                self.handle,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0
            ))?
        };
        if fd < 0 {
            return Err(DeviceError::InvalidArgument(format!("the driver exported descriptor {fd}")));
        }
        // SAFETY: the driver returned a new descriptor that this process now owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// The GPU whose memory this is.
    pub fn gpu(&self) -> u16 {
        self.gpu
    }

    /// Its size in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for PhysicalChunk {
    fn drop(&mut self) {
        // SAFETY: created or imported once, released once.
        if let Err(e) = unsafe { cu!(cuMemRelease(self.handle)) } {
            tracing::warn!(gpu = self.gpu, error = %e, "releasing a physical chunk failed");
        }
    }
}

/// A chunk mapped at an address of a reserved range; unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: sys::CUdeviceptr,
    len: usize,
}

impl Mapping {
    /// Maps all of `chunk` at `ptr`, which must lie in a reserved range with room for it.
    pub fn map(ptr: u64, chunk: &PhysicalChunk) -> Result<Self, DeviceError> {
        // SAFETY: the handle is live; the caller reserved `ptr..ptr+len`.
        unsafe { cu!(cuMemMap(ptr, chunk.len as usize, 0, chunk.handle, 0))? };
        Ok(Mapping { ptr, len: chunk.len as usize })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped in `map`, unmapped once.
        if let Err(e) = unsafe { cu!(cuMemUnmap(self.ptr, self.len)) } {
            tracing::warn!(error = %e, "unmapping failed");
        }
    }
}

/// Grants read/write access to `ptr..ptr+len` to each GPU in `gpus`, in one call (one call over the whole range
/// costs what one call per chunk would, and is made once per arena).
pub fn set_access(ptr: u64, len: u64, gpus: &[u16]) -> Result<(), DeviceError> {
    let descs: Vec<sys::CUmemAccessDesc> = gpus
        .iter()
        .map(|&g| sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: i32::from(g),
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        })
        .collect();
    // SAFETY: `descs` outlives the call; the range is mapped.
    unsafe { cu!(cuMemSetAccess(ptr, len as usize, descs.as_ptr(), descs.len())) }
}
