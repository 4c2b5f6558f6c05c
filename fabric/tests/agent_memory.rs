//! What local clients that announce more than they send cost the agent: a chunk header may announce up to
//! 16 MiB of payload, and a client that sends one and stalls must cost the agent only the bytes that arrived
//! plus a fixed bound per connection, not the 16 MiB announced. The agent runs in this process, so that this
//! test's allocator can count every byte it holds.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use vfabric::agent::Agent;
use vfabric::proto::chunk::ChunkHeader;
use vfabric::proto::codec::{read_frame_blocking, write_frame_blocking, PROTOCOL_VERSION};
use vfabric::proto::{Message, WireRegion};
use vfabric::ClusterConfig;

/// The system's allocator, counting the bytes held.
struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to the system allocator unchanged; only the count is kept beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size(), Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size(), Ordering::Relaxed);
        System.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        HELD.fetch_add(new_size, Ordering::Relaxed);
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Clients that stall after a 16 MiB chunk header.
const CLIENTS: usize = 32;
/// Bytes of payload each sends after its header.
const SENT: usize = 4096;
/// What a connection may cost the agent beyond the bytes it sent: its session, its thread's bookkeeping, a
/// control frame's buffer (at most 64 KiB before the frame's bytes arrive) and the chunk buffer's rounding.
const BOUND: usize = 256 << 10;

#[test]
fn clients_that_announce_16_mib_and_stall_cost_only_what_they_sent() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("memory-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch folder");
    let config = dir.join("solo.toml");
    let text = format!(
        "[cluster]\nname = \"memory\"\n[device]\nbackend = \"emulated\"\n[memory]\npage_size = \"64KiB\"\n\
         gpu_budget = \"32MiB\"\nhost_arena = \"32MiB\"\n[network]\ncerts = \"{}\"\n\
         [[node]]\nname = \"solo\"\naddress = \"127.0.0.1:47700\"\n",
        dir.join("certs").display()
    );
    std::fs::write(&config, text).expect("write the configuration");
    let init = Command::new(env!("CARGO_BIN_EXE_vfabric")).args(["cluster", "init", "--config"]).arg(&config).output();
    assert!(init.expect("cluster init").status.success());
    let cfg = ClusterConfig::from_file(&config).expect("configuration");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let socket = dir.join("agent.sock");
    let (agent, region) = rt.block_on(async {
        let agent = Agent::start_from_config(&cfg, "solo").await.expect("agent");
        agent.serve_local(&socket).await.expect("serve the socket");
        let region = agent.alloc(0, 16 << 20, None).await.expect("a region");
        (agent, region)
    });
    let hello = |s: &mut UnixStream| {
        let hello = Message::Hello {
            cluster: "memory".into(),
            node: 0,
            protocol: PROTOCOL_VERSION,
            lanes: 0,
            latency_lane: false,
        };
        write_frame_blocking(s, &hello, 1 << 20).expect("hello");
        assert!(matches!(read_frame_blocking(s, 1 << 20), Ok(Some(Message::Welcome { .. }))));
    };
    // One client first, whole, so that what the agent allocates once (its first client's thread and the like)
    // is in the baseline.
    let mut warm = UnixStream::connect(&socket).expect("connect");
    hello(&mut warm);
    let before = HELD.load(Ordering::Relaxed);
    let stalled: Vec<UnixStream> = (0..CLIENTS)
        .map(|_| {
            let mut s = UnixStream::connect(&socket).expect("connect");
            hello(&mut s);
            let write = Message::Write { region: WireRegion::from(&region), offset: 0, len: 16 << 20 };
            write_frame_blocking(&mut s, &write, 1 << 20).expect("a write of 16 MiB");
            let header = ChunkHeader { offset: 0, len: 16 << 20, checksum: 0, packed: false };
            s.write_all(&header.encode()).expect("a chunk header announcing 16 MiB");
            s.write_all(&[7u8; SENT]).expect("the first bytes of the chunk");
            s
        })
        .collect();
    // The agent's threads now wait for the rest of each chunk; what they hold has stopped growing.
    let mut grown = 0;
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(100));
        grown = HELD.load(Ordering::Relaxed).saturating_sub(before);
    }
    let per_client = grown / CLIENTS;
    eprintln!("{CLIENTS} clients stalled after announcing 16 MiB and sending {SENT} bytes: the process holds {grown} bytes more ({per_client} per client)");
    assert!(
        per_client <= SENT + BOUND,
        "each stalled client costs {per_client} bytes: more than the {SENT} it sent and the {BOUND} bound"
    );
    drop(stalled);
    drop(warm);
    rt.block_on(agent.shutdown());
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
