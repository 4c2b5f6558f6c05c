//! What the fabric checks share: a fabric from a configuration, its GPUs and their frames, the bytes under a
//! lease read through its pointers, and a configuration with a storage tier.

use vfabric::{ClusterConfig, Fabric, Lease, LeasePtr};
use vfabric_transport::Location;

/// The embedded fabric of `cfg` (a panic naming the error when it cannot start).
pub fn fabric(cfg: &ClusterConfig) -> Fabric {
    Fabric::embedded(cfg).unwrap_or_else(|e| panic!("starting the fabric: {e}"))
}

/// The fabric's GPUs.
pub fn gpus(f: &Fabric) -> Vec<Location> {
    f.devices().into_iter().filter(|l| matches!(l, Location::Gpu(_))).collect()
}

/// Frames the fabric manages at `loc`.
pub fn frames_of(f: &Fabric, loc: Location) -> u64 {
    f.stats().directory.devices.iter().find(|d| d.location == loc).map_or(0, |d| u64::from(d.frames))
}

/// Reads the device copies under a lease, through its pointers: a device-to-host copy from each pointer.
pub fn read_through_lease(f: &Fabric, lease: &Lease) -> Vec<u8> {
    let ps = f.page_size();
    let ptrs: Vec<u64> = match lease.ptr() {
        LeasePtr::Contiguous { ptr, len } => (0..len / ps).map(|i| ptr + i * ps).collect(),
        LeasePtr::Pages(v) => v.clone(),
    };
    let mut out = vec![0u8; ptrs.len() * ps as usize];
    for (i, p) in ptrs.iter().enumerate() {
        let out = &mut out[i * ps as usize..(i + 1) * ps as usize];
        f.read_device(lease.device(), *p, out).expect("read through the lease");
    }
    out
}

/// `cfg` with GPU budgets of 16 pages, host memory of 8 pages and a storage tier of `slots` pages in the file `path` (a
/// filesystem with O_DIRECT), and that path.
pub fn with_storage(cfg: &ClusterConfig, path: &std::path::Path, slots: u64) -> (ClusterConfig, std::path::PathBuf) {
    let mut cfg = cfg.clone();
    let ps = cfg.memory.page_size.bytes();
    // A GPU budget of the emulated suite's size on every device layer: the tier's slots are counted for it.
    cfg.memory.gpu_budget = Some(vfabric::ByteSize(16 * ps));
    cfg.memory.host_arena = vfabric::ByteSize(8 * ps);
    let size = vfabric::ByteSize(slots * ps);
    cfg.storage = Some(vfabric::config::StorageSection { path: path.to_owned(), size, depth: 16 });
    (cfg, path.to_owned())
}

/// Writes `seed`'s pattern over the whole region from the host, 8 MiB a call.
pub fn write_pattern(f: &Fabric, r: &vfabric::Region, seed: u64) {
    let chunk = 8u64 << 20;
    let mut off = 0;
    while off < r.len {
        let n = chunk.min(r.len - off);
        f.write(r, off, &vfabric::pattern::bytes(seed, off, n as usize)).expect("write");
        off += n;
    }
}
