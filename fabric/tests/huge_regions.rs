//! Regions far larger than the node: the directory's record of a region grows with the pages it uses, not with
//! its size, so allocating one costs a pointer per 1,024 pages and no work per page; the limits (the node's
//! 256 TiB of address space, 2^32 pages a region) are typed errors that name them, and an agent asked for such
//! regions keeps serving. This test's allocator counts the bytes the test's thread allocates (and those the
//! process holds), so that work per page would show.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicI64, Ordering};

use common::{agents_in_process, small_cluster};
use vfabric::directory::{AcquireRequest, Directory, DirectoryConfig, DirectoryError, Mode, Placement, Step};
use vfabric::proto::codec::{read_frame_blocking, write_frame_blocking, PROTOCOL_VERSION};
use vfabric::proto::Message;
use vfabric::FabricError;
use vfabric_allocator::PageSize;
use vfabric_transport::Location;

/// The system's allocator, counting what each thread allocates and what the process holds.
struct Counting;

thread_local! {
    /// Bytes this thread allocated (never lowered by frees: a buffer made and dropped counts too).
    static ALLOCATED: Cell<u64> = const { Cell::new(0) };
}

/// Bytes the process holds.
static HELD: AtomicI64 = AtomicI64::new(0);

fn count(bytes: usize) {
    HELD.fetch_add(bytes as i64, Ordering::Relaxed);
    // A thread being torn down has no counter left; its allocations go uncounted.
    let _ = ALLOCATED.try_with(|c| c.set(c.get() + bytes as u64));
}

// SAFETY: every call goes to the system allocator unchanged; only the counts are kept beside it (in a
// thread-local without a destructor and an atomic, neither of which allocates).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        HELD.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// `f`'s result, and the bytes this thread allocated while it ran.
fn allocating<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = ALLOCATED.with(Cell::get);
    let out = f();
    (out, ALLOCATED.with(Cell::get) - before)
}

const TIB: u64 = 1 << 40;

/// Runs a directory call to its end, committing every stage (no bytes are simulated: only the tables count).
fn drive<T>(dir: &mut Directory, mut f: impl FnMut(&mut Directory) -> Result<Step<T>, DirectoryError>) -> T {
    for _ in 0..100 {
        match f(dir).expect("directory call") {
            Step::Done(t) => return t,
            Step::Stage(s) => dir.commit(s),
            Step::Wait => panic!("nothing is in flight to wait for"),
        }
    }
    panic!("a call staged 100 times without finishing");
}

/// 128 TiB of 2 MiB pages (64 Mi pages): allocating the region takes a pointer per 1,024 pages (512 KiB) and
/// allocates nothing per page, even for a moment; using its last page makes one chunk of entries; past the node's
/// address space a region of 2 MiB pages gets `AddressSpaceExhausted` (its 2^32 pages would be 8 PiB).
#[test]
fn a_128_tib_region_of_2_mib_pages_costs_a_pointer_per_1024_pages() {
    const PAGE: u64 = 2 << 20;
    let cfg = DirectoryConfig { page_size: PageSize::MIB_2, headroom_percent: 0, ..DirectoryConfig::default() };
    let mut dir = Directory::new(cfg, &[(Location::Gpu(0), 8 * PAGE), (Location::Host, 16 * PAGE)]).expect("dir");
    let before = dir.stats().metadata_bytes;
    let (h, allocated) = allocating(|| dir.alloc(128 * TIB, Placement::on(Location::Gpu(0))));
    let h = h.expect("a 128 TiB region");
    let pages = 128 * TIB / PAGE;
    assert_eq!((h.len, dir.stats().pages), (128 * TIB, pages));
    // A byte per page would be 64 MiB.
    assert!(allocated < 1 << 20, "allocating {pages} pages allocated {allocated} bytes");
    let grown = dir.stats().metadata_bytes - before;
    assert!(grown < 1 << 20, "the directory's tables grew by {grown} bytes");
    // Its last page, acquired for writing like any other: one chunk of entries made.
    let (_, allocated) = allocating(|| {
        let mut req = AcquireRequest::new(h, h.len - PAGE, PAGE, Location::Gpu(0), Mode::Write);
        let grant = drive(&mut dir, |d| d.step_acquire(&mut req));
        dir.release(grant.id).expect("release");
    });
    assert!(allocated < 1 << 20, "acquiring one page allocated {allocated} bytes");
    assert_eq!(dir.stats().unbacked, pages - 1, "one page has a copy");
    dir.check_invariants().expect("invariants");
    // Past the node's address space: a typed error naming it, and nothing taken.
    match dir.alloc(200 * TIB, Placement::default()) {
        Err(e @ DirectoryError::AddressSpaceExhausted(_)) => assert!(e.to_string().contains("address space"), "{e}"),
        other => panic!("200 TiB beside 128 TiB: {other:?}"),
    }
    assert_eq!(dir.stats().regions, 1);
    let (_, allocated) = allocating(|| drive(&mut dir, |d| d.free(&h)));
    assert!(allocated < 1 << 20, "freeing allocated {allocated} bytes");
    let st = dir.stats();
    assert!(st.regions == 0 && st.devices.iter().all(|d| d.used == 0), "{st:?}");
    let again = dir.alloc(200 * TIB, Placement::default()).expect("the space is free again");
    drive(&mut dir, |d| d.free(&again));
}

/// A local client's answers to allocations of `sizes` (after its hello), over the agent's socket; the regions it
/// got are freed.
fn local_allocs(socket: &std::path::Path, sizes: &[u64]) -> Vec<Message> {
    let mut s = UnixStream::connect(socket).expect("connect");
    let hello =
        Message::Hello { cluster: "huge".into(), node: 0, protocol: PROTOCOL_VERSION, lanes: 0, latency_lane: false };
    write_frame_blocking(&mut s, &hello, 1 << 20).expect("hello");
    assert!(matches!(read_frame_blocking(&mut s, 1 << 20), Ok(Some(Message::Welcome { .. }))), "not welcomed");
    let mut answers = Vec::new();
    for &size in sizes {
        let alloc = Message::Alloc { size, device: None, replicas: 0, lag_ms: None, compression: 0, priority: 0 };
        write_frame_blocking(&mut s, &alloc, 1 << 20).expect("alloc");
        answers.push(read_frame_blocking(&mut s, 1 << 20).expect("an answer").expect("not closed"));
    }
    for a in &answers {
        if let Message::Allocated { region } = a {
            write_frame_blocking(&mut s, &Message::Free { region: *region }, 1 << 20).expect("free");
            let done = read_frame_blocking(&mut s, 1 << 20);
            assert!(matches!(done, Ok(Some(Message::Done))), "freeing {region:?}: {done:?}");
        }
    }
    answers
}

/// An agent of 64 KiB pages asked for 200 TiB (3.3 G pages, within the node's 256 TiB and a region's 2^32 pages)
/// allocates it at a pointer per 1,024 pages and serves its last page; asked past the limits it answers with the
/// typed error that names each (`TooManyPages`, `AddressSpaceExhausted`; a local client reads them named),
/// takes nothing, and goes on serving: another region round-trips, and once the huge one is freed its space is
/// there again.
#[test]
fn an_agent_serves_a_200_tib_region_and_names_the_limits_past_it() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let mut cfg = small_cluster("huge", 1);
        cfg.memory.page_size = vfabric::ByteSize(64 << 10);
        let agents = agents_in_process(&cfg).await;
        let agent = &agents[0];
        let ps = agent.fabric().page_size();
        assert_eq!(ps, 64 << 10);
        let held = HELD.load(Ordering::Relaxed);
        let huge = agent.alloc(0, 200 * TIB, None).await.expect("200 TiB of 64 KiB pages is within the limits");
        // 3.3 G pages: 26 MB of chunk pointers; their entries made up front would take 107 GB.
        let grown = HELD.load(Ordering::Relaxed) - held;
        assert!(grown < 48 << 20, "the agent holds {grown} bytes more for a region of {} pages", huge.len / ps);
        assert_eq!(huge.len, 200 * TIB);
        let data: Vec<u8> = (0..ps).map(|i| (i % 251) as u8).collect();
        agent.write(&huge, huge.len - ps, &data).await.expect("write the last page");
        let mut back = vec![0u8; data.len()];
        agent.read(&huge, huge.len - ps, &mut back).await.expect("read the last page");
        assert!(back == data, "the last page read back different");
        // More pages than a region may have, then more than the node's address space has left.
        match agent.alloc(0, 300 * TIB, None).await {
            Err(e @ FabricError::InvalidSize(DirectoryError::TooManyPages { size })) => {
                assert_eq!(size, 300 * TIB);
                assert!(e.to_string().contains("2^32 pages"), "{e}");
            }
            other => panic!("300 TiB of 64 KiB pages: {other:?}"),
        }
        match agent.alloc(0, 100 * TIB, None).await {
            Err(e @ FabricError::Directory(DirectoryError::AddressSpaceExhausted(_))) => {
                assert!(e.to_string().contains("address space"), "{e}")
            }
            other => panic!("100 TiB beside 200 TiB: {other:?}"),
        }
        // A local client asking past the limits reads which one, and is served on.
        let socket = std::env::temp_dir().join(format!("vfabric-huge-{}.sock", std::process::id()));
        agent.serve_local(&socket).await.expect("serve local clients");
        let answers = tokio::task::spawn_blocking({
            let socket = socket.clone();
            move || local_allocs(&socket, &[300 * TIB, 100 * TIB, ps])
        });
        let answers = answers.await.expect("the local client");
        match &answers[..] {
            [Message::Error { message: pages, .. }, Message::Error { message: space, .. }, Message::Allocated { .. }] =>
            {
                assert!(pages.contains("2^32 pages") && space.contains("address space"), "{pages}; {space}")
            }
            other => panic!("a local client's allocations: {other:?}"),
        }
        // Still serving: another region round-trips.
        let small = agent.alloc(0, 4 * ps, None).await.expect("another region");
        agent.write(&small, ps, &data).await.expect("write");
        let mut back = vec![0u8; data.len()];
        agent.read(&small, ps, &mut back).await.expect("read");
        assert!(back == data, "the small region read back different");
        agent.free(&huge).await.expect("free the huge region");
        let again = agent.alloc(0, 100 * TIB, None).await.expect("its space is free again");
        agent.free(&again).await.expect("free");
        agent.free(&small).await.expect("free");
        assert_eq!(agent.fabric().stats().directory.regions, 0);
        for a in &agents {
            a.shutdown().await;
        }
        let _ = std::fs::remove_file(&socket);
    });
}
