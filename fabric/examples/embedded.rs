//! The embedded fabric from a Rust program: a region placed on GPU 0, written from the host, leased on a GPU
//! (the pointer a kernel would use), migrated, read back. Runs on the emulated device where there is no GPU.
//!
//!     cargo run --release -p vfabric --example embedded

use vfabric::{ByteSize, ClusterConfig, Fabric, FabricError, LeasePtr, Location, Mode, Placement};

fn main() -> Result<(), FabricError> {
    let fabric = Fabric::embedded(&ClusterConfig::embedded_local())?;
    if let Some(why) = fabric.fallback_reason() {
        println!("no usable GPU ({why}): running on the emulated device");
    }
    let gpus: Vec<Location> = fabric.devices().into_iter().filter(|l| matches!(l, Location::Gpu(_))).collect();
    let (first, last) = (gpus[0], gpus[gpus.len() - 1]);

    // A 64 MiB region whose pages live on the first GPU.
    let region = fabric.alloc(64 << 20, Placement::on(first))?;
    let data: Vec<u8> = (0..region.len).map(|i| (i % 251) as u8).collect();
    fabric.write(&region, 0, &data)?;

    // Lease the first 8 MiB on the last GPU for reading: the pages are replicated there.
    let lease = fabric.acquire(&region, 0..(8 << 20), last, Mode::Read)?;
    match lease.ptr() {
        LeasePtr::Contiguous { ptr, len } => println!("{last}: {} at device pointer {ptr:#x}", ByteSize(*len)),
        LeasePtr::Pages(ptrs) => println!("{last}: {} pages, first at {:#x}", ptrs.len(), ptrs[0]),
    }
    fabric.release(lease)?;

    // Move the whole region to the last GPU, then read it back on the host.
    fabric.migrate(&region, last)?;
    let mut back = vec![0u8; data.len()];
    fabric.read(&region, 0, &mut back)?;
    assert_eq!(back, data);
    let t = fabric.traffic();
    println!(
        "read back {} intact; fetched {}, migrated {}, evicted {}",
        ByteSize(back.len() as u64),
        ByteSize(t.fetched),
        ByteSize(t.migrated),
        ByteSize(t.evicted)
    );
    fabric.free(&region)?;
    Ok(())
}
