//! The device conformance suite on real GPUs, plus what only CUDA does (chunk export and import). Built with
//! `--features gpu` and run on the GPU machine by `scripts/device-run.sh`; CI has no GPU and does not build it.

use std::sync::Arc;

use vfabric_tests::device_suite::{self, Scale};
use vfabric_tests::pattern;
use vfabric_transport::cuda::{CudaNode, GpuArena};
use vfabric_transport::{Arena, ArenaSpec, DeviceError, DeviceLayer, Location};

fn node() -> CudaNode {
    CudaNode::open().expect("this target runs on a machine with GPUs")
}

#[test]
fn arena_lifecycle() {
    device_suite::arena_lifecycle(&node(), Scale::GPU);
}

#[test]
fn arena_errors() {
    device_suite::arena_errors(&node(), Scale::GPU);
}

#[test]
fn moves_by_every_engine() {
    device_suite::moves_by_every_engine(&node(), Scale::GPU);
}

#[test]
fn moves_within_one_arena() {
    device_suite::moves_within_one_arena(&node(), Scale::GPU);
}

#[test]
fn concurrent_transfers() {
    device_suite::concurrent_transfers(&node(), Scale::GPU);
}

#[test]
fn batch_errors() {
    device_suite::batch_errors(&node(), Scale::GPU);
}

#[test]
fn coded_moves_match_the_cpu() {
    vfabric_tests::lossy_suite::coded_moves_match_the_cpu(&node(), Scale::GPU);
}

/// A chunk exported as a file descriptor and imported again maps the same bytes: writes through either address
/// are seen through the other. A bad descriptor or length is a typed error.
#[test]
fn chunk_export_and_import() {
    let node = node();
    for gpu in node.gpus().iter().map(|g| g.index) {
        let a = node
            .create_arena(&ArenaSpec { location: Location::Gpu(gpu), bytes: 256 << 20, chunk_bytes: 64 << 20 })
            .expect("arena");
        let ga = a.as_any().downcast_ref::<GpuArena>().expect("a CUDA arena");
        assert_eq!(ga.chunk_count(), 4);
        let len = ga.chunk_len(1).expect("chunk 1");
        a.write(len, &pattern::bytes(5, 0, len as usize)).expect("write chunk 1");
        let fd = ga.export_chunk(1).expect("export");
        let imported: Arc<dyn Arena> = node.import_chunk(std::os::fd::AsFd::as_fd(&fd), gpu, len).expect("import");
        assert_ne!(imported.device_ptr(), a.device_ptr() + len, "a second address");
        let mut back = vec![0u8; len as usize];
        imported.read(0, &mut back).expect("read imported");
        assert_eq!(pattern::first_mismatch(5, 0, &back), None, "gpu{gpu}: the import sees the exporter's bytes");
        imported.fill(0, 4096, 0x42).expect("write through the import");
        let mut head = vec![0u8; 4096];
        a.read(len, &mut head).expect("read through the exporter");
        assert!(head.iter().all(|&b| b == 0x42), "gpu{gpu}: the exporter sees writes through the import");
        assert!(matches!(ga.export_chunk(9), Err(DeviceError::InvalidArgument(_))));
        assert!(matches!(
            node.import_chunk(std::os::fd::AsFd::as_fd(&fd), gpu, 12345),
            Err(DeviceError::InvalidArgument(_))
        ));
        drop(imported);
        // A descriptor that is not an exported chunk (/dev/null) is refused by the driver.
        let devnull = std::fs::File::open("/dev/null").expect("/dev/null");
        let bad = node.import_chunk(std::os::fd::AsFd::as_fd(&devnull), gpu, len);
        assert!(matches!(bad, Err(DeviceError::Cuda { .. })), "importing /dev/null: {bad:?}");
    }
}

/// Open while the legacy default stream may go on (`hold_default_stream`'s host function waits for it).
static DEFAULT_STREAM_OPEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn hold_default_stream(_: *mut std::ffi::c_void) {
    while !DEFAULT_STREAM_OPEN.load(std::sync::atomic::Ordering::Acquire) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// An arena's writes (small, through its pinned staging, and large), reads and fills complete while the legacy
/// default stream of the process's context is held up, as an application's is while it waits for a collective
/// that waits on the fabric (an agent inside a rank of a job shares that rank's context). They ran as the
/// driver's synchronous copies, on the legacy default stream: queued behind the held stream, they never
/// returned. The held stream is let go after 60 s either way, so a failure does not hang the suite.
#[test]
fn arena_copies_do_not_wait_for_the_default_stream() {
    use cudarc::driver::sys;
    use std::sync::atomic::Ordering;
    use std::time::Duration;
    let node = node();
    let a = node.create_arena(&ArenaSpec::new(Location::Gpu(0), 64 << 20)).expect("arena");
    let ctx = vfabric_transport::cuda::GpuContext::retain(0).expect("context");
    ctx.bind().expect("bind");
    DEFAULT_STREAM_OPEN.store(false, Ordering::Release);
    // SAFETY: the null stream is the context's legacy default stream; the function takes no data.
    let held = unsafe { sys::cuLaunchHostFunc(std::ptr::null_mut(), Some(hold_default_stream), std::ptr::null_mut()) };
    assert_eq!(held, sys::CUresult::CUDA_SUCCESS, "cuLaunchHostFunc");
    let (done, finished) = std::sync::mpsc::channel();
    let arena = Arc::clone(&a);
    let worker = std::thread::spawn(move || {
        let small = pattern::bytes(41, 0, 64 << 10);
        let large = pattern::bytes(42, 0, 8 << 20);
        let mut back = vec![0u8; 8 << 20];
        let r = arena
            .write(0, &small)
            .and_then(|()| arena.write(1 << 20, &large))
            .and_then(|()| arena.fill(32 << 20, 1 << 20, 0x5a))
            .and_then(|()| arena.read(1 << 20, &mut back))
            .map(|()| back == large);
        let _ = done.send(r);
    });
    let got = finished.recv_timeout(Duration::from_secs(60));
    DEFAULT_STREAM_OPEN.store(true, Ordering::Release);
    ctx.synchronize().expect("the default stream goes on");
    worker.join().expect("the worker");
    match got {
        Ok(Ok(same)) => assert!(same, "the bytes read back are the ones written"),
        Ok(Err(e)) => panic!("an arena call failed: {e}"),
        Err(_) => panic!("the arena's calls waited for the held default stream"),
    }
    let mut filled = vec![0u8; 1 << 20];
    a.read(32 << 20, &mut filled).expect("read the fill");
    assert!(filled.iter().all(|&b| b == 0x5a), "the fill landed");
}

/// The node reports what the fabric relies on.
/// A one-rank NCCL channel on gpu0 moves bytes between two device addresses of an arena (a send to itself and
/// its receive in one group: what one process can run on one GPU) and sums pages where they lie, as the CPU does;
/// a rank outside the communicator is refused, a send without its receive times out and breaks the channel (every
/// later call refused), and a new channel works.
#[test]
fn nccl_channel_moves_and_sums_pages_between_device_addresses() {
    use std::time::Duration;
    use vfabric_transport::cuda::nccl::nccl_version;
    use vfabric_transport::{page_sum, PeerTransfer};
    let n = node();
    assert!(n.nccl_available(), "the GPU machine has NCCL (libnccl.so.2)");
    eprintln!("NCCL {}", nccl_version().expect("version"));
    let half = 4usize << 20;
    let a = n.create_arena(&ArenaSpec::new(Location::Gpu(0), 2 * half as u64)).expect("arena");
    let data = pattern::bytes(31, 0, half);
    a.write(0, &data).expect("write");
    let join = || n.join_channel(0, &n.channel_id().expect("id"), (0, 1), Duration::from_secs(30)).expect("join");
    let mut ch = join();
    let send = PeerTransfer { ptr: a.device_ptr(), len: half, peer: 0 };
    let recv = PeerTransfer { ptr: a.device_ptr() + half as u64, len: half, peer: 0 };
    let t = Duration::from_secs(10);
    // SAFETY: both halves are gpu0's device memory, mapped until the arena drops at the end; nothing else uses it.
    unsafe { ch.exchange(&[send], &[recv], t) }.expect("exchange");
    let mut back = vec![0u8; half];
    a.read(half as u64, &mut back).expect("read");
    assert!(back == data, "the received bytes are the sent ones");
    // The kernel's sums are the CPU's, page by page (64 KiB pages, scattered over both halves).
    let page = 64usize << 10;
    let addrs: Vec<u64> = (0..2 * half / page).rev().map(|p| a.device_ptr() + (p * page) as u64).collect();
    // SAFETY: as above.
    let sums = unsafe { ch.page_sums(&addrs, page as u64) }.expect("sums");
    let mut all = vec![0u8; 2 * half];
    a.read(0, &mut all).expect("read all");
    let cpu: Vec<u64> = (0..2 * half / page).rev().map(|p| page_sum(&all[p * page..(p + 1) * page])).collect();
    assert_eq!(sums, cpu, "the GPU's page sums are the CPU's");
    // SAFETY: as above.
    match unsafe { ch.exchange(&[PeerTransfer { peer: 1, ..send }], &[], t) } {
        Err(DeviceError::InvalidArgument(_)) => {}
        other => panic!("a rank outside the communicator: {other:?}"),
    }
    // SAFETY: as above.
    match unsafe { ch.exchange(&[send], &[], Duration::from_secs(2)) } {
        Err(e @ (DeviceError::ChannelTimeout { .. } | DeviceError::Nccl { .. })) => {
            eprintln!("a send without its receive: {e}")
        }
        other => panic!("a send to itself without its receive: {other:?}"),
    }
    // SAFETY: as above.
    assert!(matches!(unsafe { ch.exchange(&[send], &[recv], t) }, Err(DeviceError::ChannelBroken)));
    drop(ch);
    let mut ch = join();
    a.write(half as u64, &vec![0u8; half]).expect("clear");
    // SAFETY: as above.
    unsafe { ch.exchange(&[send], &[recv], t) }.expect("a new channel works");
    a.read(half as u64, &mut back).expect("read");
    assert!(back == data, "the received bytes are the sent ones, again");
}

#[test]
fn node_reports_its_gpus() {
    let node = node();
    assert!(!node.gpus().is_empty());
    for g in node.gpus() {
        assert!(g.total_memory > 1 << 30, "{g:?}");
        assert!(g.multiprocessors > 0);
        assert!(g.granularity.is_power_of_two());
        assert!(node.peers_of(g.index).contains(&g.index));
    }
    eprintln!("{}; nccl: {}", node.describe(), node.nccl_available());
}

/// The fabric conformance suite on the GPUs: arenas of 512 MiB per GPU, 2 GiB of host memory.
mod fabric {
    use vfabric::{ByteSize, ClusterConfig};
    use vfabric_transport::Backend;

    fn config() -> ClusterConfig {
        let mut c = ClusterConfig::embedded_local();
        c.device.backend = Backend::Cuda;
        c.memory.gpu_budget = Some(ByteSize(512 << 20));
        c.memory.host_arena = ByteSize(2 << 30);
        c
    }

    vfabric_tests::fabric_suite_tests!(config());
}
