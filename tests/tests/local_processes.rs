//! Local clients in processes of their own, attached to one agent: the node's memory mapped in each, bytes
//! written through one process's mapping and read through another's, a client killed with SIGKILL while it
//! holds a lease (the agent lets go of it and frees the region the client owned), and a client of another user
//! refused.
//!
//! The clients are this test binary run again (`child_*` tests, ignored in a normal run) with the socket and
//! their arguments in the environment. The device is the one `auto` opens: the emulated device in CI, the GPU
//! on the GPU machine (`scripts/device-run.sh` runs this binary there).

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vfabric::agent::Agent;
use vfabric::config::NodeSection;
use vfabric::proto::message::WireRegion;
use vfabric::proto::{encode, ErrorKind, Message, DEFAULT_MAX_FRAME, PROTOCOL_VERSION};
use vfabric::{AllocOptions, AttachedClient, ByteSize, ClusterConfig, FabricError, Location, Mode, Region};
use vfabric_tests::pattern;
use vfabric_transport::quic::ClusterCa;
use vfabric_transport::Backend;

const SEED: u64 = 0x10ca1;
const LEN: u64 = (4 << 20) + (3 << 16);

fn config() -> ClusterConfig {
    let mut c = ClusterConfig::embedded_local();
    c.cluster.name = "procs".into();
    c.device.backend = Backend::Auto;
    c.memory.page_size = ByteSize(64 << 10);
    c.memory.gpu_budget = Some(ByteSize(64 << 20));
    c.memory.host_arena = ByteSize(64 << 20);
    c.nodes = vec![NodeSection { name: "n0".into(), gpus: Some(vec![0]), address: None, tenant: None }];
    c
}

/// Runs child test `name` of this binary with `args`; its stdout comes back line by line.
fn child(socket: &Path, name: &str, args: &str) -> std::process::Child {
    Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--ignored", "--exact", name, "--nocapture", "--test-threads=1"])
        .env("VFABRIC_TEST_SOCKET", socket)
        .env("VFABRIC_TEST_ARGS", args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start a client process")
}

/// What follows `tag` on the first line of the child's output that has it, waiting for it; panics if the child ends first.
fn line_with(out: &mut impl BufRead, tag: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        let n = out.read_line(&mut line).expect("the child's output");
        assert!(n > 0, "the client process ended without printing `{tag}`");
        // The test harness may have written `test child_x ... ` on the same line first.
        if let Some(at) = line.find(tag) {
            return line[at + tag.len()..].trim().to_string();
        }
    }
}

fn region_arg(r: &Region) -> String {
    let w = WireRegion::from(r);
    format!("{} {} {} {} {}", w.addr, w.len, w.page_size, w.slot, w.generation)
}

fn parse_region(s: &str) -> Region {
    let v: Vec<u64> = s.split_whitespace().map(|x| x.parse().expect("a number")).collect();
    Region::from(&WireRegion { addr: v[0], len: v[1], page_size: v[2], slot: v[3] as u32, generation: v[4] })
}

fn child_env() -> (PathBuf, String) {
    let socket = std::env::var_os("VFABRIC_TEST_SOCKET")
        .expect("this runs as a client process of local_clients_in_processes_share_the_nodes_memory");
    (PathBuf::from(socket), std::env::var("VFABRIC_TEST_ARGS").unwrap_or_default())
}

#[test]
fn local_clients_in_processes_share_the_nodes_memory() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let cfg = config();
    let ca = ClusterCa::generate("procs").expect("ca");
    let id = ca.issue("n0").expect("certificate");
    let agent = rt.block_on(Agent::start(&cfg, "n0", &id, Some("127.0.0.1:0".parse().expect("addr")))).expect("agent");
    let socket = std::env::temp_dir().join(format!("vfabric-procs-{}.sock", std::process::id()));
    rt.block_on(agent.serve_local(&socket)).expect("serve the socket");
    let mode = std::fs::metadata(&socket).expect("the socket").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "only the agent's user may reach the socket");
    println!("agent on {}", agent.fabric().describe());

    // One process writes through its mapping of GPU 0 and keeps the region; another reads it through its own.
    let out = child(&socket, "child_writer", "").wait_with_output().expect("writer");
    assert!(out.status.success(), "the writer failed");
    let region = parse_region(&line_with(&mut &out.stdout[..], "REGION"));
    let mut back = vec![0u8; LEN as usize];
    rt.block_on(agent.read(&region, 0, &mut back)).expect("the agent reads the region");
    assert_eq!(pattern::first_mismatch(SEED, 0, &back), None, "the writer's bytes, as the agent sees them");
    let out = child(&socket, "child_reader", &region_arg(&region)).wait_with_output().expect("reader");
    assert!(out.status.success(), "the reader failed");
    line_with(&mut &out.stdout[..], "READ OK");

    // A process that dies holding a write lease (and owning a region) leaves nothing behind.
    let mut holder = child(&socket, "child_holder", &region_arg(&region));
    let mut lines = BufReader::new(holder.stdout.take().expect("stdout"));
    let owned = parse_region(&line_with(&mut lines, "OWNED"));
    line_with(&mut lines, "HOLDING");
    let held = rt.block_on(agent.acquire(&region, 0..LEN, Location::Gpu(0), Mode::Read)).map(|_| ());
    assert!(matches!(held, Err(FabricError::LeasedElsewhere { .. })), "the holder's lease excludes readers: {held:?}");
    holder.kill().expect("SIGKILL the holder");
    holder.wait().expect("reap the holder");
    // The agent notices the closed socket on the client's thread, releases the lease, then frees the region.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match rt.block_on(agent.acquire(&region, 0..LEN, Location::Gpu(0), Mode::Write)) {
            Ok(l) => {
                rt.block_on(agent.release(l)).expect("release");
                break;
            }
            Err(FabricError::LeasedElsewhere { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("the dead client's lease was not let go: {e}"),
        }
    }
    loop {
        match rt.block_on(agent.read(&owned, 0, &mut [0u8; 1])) {
            Err(FabricError::UseAfterFree(_)) => break,
            Ok(()) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            other => panic!("the dead client's region was not freed: {other:?}"),
        }
    }
    rt.block_on(agent.read(&region, 0, &mut back)).expect("read");
    assert_eq!(pattern::first_mismatch(SEED, 0, &back), None, "the kept region is intact");
    assert_eq!(agent.fabric().stats().directory.leases, 0, "no lease left");

    foreign_user_is_refused(&socket);
    rt.block_on(agent.free(&region)).expect("free");
    rt.block_on(agent.shutdown());
    let _ = std::fs::remove_file(&socket);
}

/// A client running as another user (nobody) is refused even when the socket's mode lets it connect: the agent
/// checks its credentials and closes the connection without a word. Needs root (to run as nobody); elsewhere
/// only the socket's mode (checked above) keeps other users out, and this part says it did not run.
fn foreign_user_is_refused(socket: &Path) {
    if !nix::unistd::geteuid().is_root() {
        println!("not root: the credential check against another user was not exercised");
        return;
    }
    let python = Path::new("/usr/bin/python3");
    assert!(python.exists(), "the foreign-user check needs /usr/bin/python3 (apt-get install python3)");
    let mut hello = Vec::new();
    let msg = Message::Hello {
        cluster: String::new(),
        node: u16::MAX,
        protocol: PROTOCOL_VERSION,
        lanes: 0,
        latency_lane: false,
    };
    encode(&msg, DEFAULT_MAX_FRAME, &mut hello).expect("hello");
    let hex: String = hello.iter().map(|b| format!("{b:02x}")).collect();
    // The agent may close before the hello is sent or read (a broken pipe, a reset): no answer either way.
    let script = "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.settimeout(10)\ns.connect(sys.argv[1])\n\
                  try:\n  s.sendall(bytes.fromhex(sys.argv[2]))\n  print(len(s.recv(64)))\n\
                  except (ConnectionResetError, BrokenPipeError):\n  print(0)";
    let run = |uid: u32| {
        use std::os::unix::process::CommandExt;
        let out = Command::new(python).args(["-c", script]).arg(socket).arg(&hex).uid(uid).output().expect("python3");
        assert!(out.status.success(), "the probe as uid {uid} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().parse::<usize>().expect("a count")
    };
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let as_nobody = run(65534);
    let as_owner = run(0);
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    assert_eq!(as_nobody, 0, "another user's client gets no answer");
    assert!(as_owner > 0, "the owner's client is welcomed");
}

/// What ranks of [`ranks_of_one_host_share_the_agent_local_rank_0_starts`] write, each its slice.
const RANKS: u64 = 4;
// Whole pages of the default configuration (2 MiB): two ranks never lease the same page.
const SLICE: u64 = 4 << 20;

#[test]
fn ranks_of_one_host_share_the_agent_local_rank_0_starts() {
    let base = std::env::temp_dir().join(format!("vfabric-ranks-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).expect("a folder for the ranks' notes");
    let socket = base.join("agent.sock");
    // As torchrun starts them: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE; no agent runs yet.
    let ranks: Vec<_> = (0..RANKS)
        .map(|r| {
            Command::new(std::env::current_exe().expect("this test binary"))
                .args(["--ignored", "--exact", "child_rank", "--nocapture", "--test-threads=1"])
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", RANKS.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("LOCAL_WORLD_SIZE", RANKS.to_string())
                .env("VFABRIC_SOCKET", &socket)
                .env("VFABRIC_TEST_ARGS", &base)
                .env_remove("VFABRIC_CONFIG")
                .stdout(Stdio::piped())
                .spawn()
                .expect("start a rank")
        })
        .collect();
    for (r, rank) in ranks.into_iter().enumerate() {
        let out = rank.wait_with_output().expect("a rank");
        assert!(out.status.success(), "rank {r} failed");
        line_with(&mut &out.stdout[..], &format!("RANK {r} OK"));
    }
    assert!(!socket.exists(), "the agent's socket goes with local rank 0");
    let _ = std::fs::remove_dir_all(&base);
}

/// Waits for the file `path` that another rank writes.
fn wait_file(path: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            return s;
        }
        assert!(Instant::now() < deadline, "no {} in time", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
#[ignore = "a rank of ranks_of_one_host_share_the_agent_local_rank_0_starts"]
fn child_rank() {
    let dir = PathBuf::from(std::env::var("VFABRIC_TEST_ARGS").expect("runs as a rank of its parent test"));
    let job = vfabric::JobRank::from_env().expect("a torchrun-style job");
    let c = AttachedClient::join(Some(job), &vfabric::JoinOptions::default()).expect("join the host's agent");
    let r = u64::from(job.rank);
    assert_eq!(c.hosts_agent(), job.local_rank == 0, "local rank 0 starts the agent");
    let gpus = c.devices().iter().filter(|d| matches!(d, Location::Gpu(_))).count() as u16;
    let device = c.default_device().expect("a GPU for every rank");
    assert_eq!(device, Location::Gpu(job.local_rank % gpus), "the local rank's GPU");
    let region = if r == 0 {
        let region = c.alloc(RANKS * SLICE, &AllocOptions::default()).expect("alloc");
        // Written whole and renamed, so a reader never sees half of it.
        std::fs::write(dir.join("region.part"), region_arg(&region)).expect("note");
        std::fs::rename(dir.join("region.part"), dir.join("region")).expect("note");
        region
    } else {
        parse_region(&wait_file(&dir.join("region")))
    };
    // Each rank writes its slice on its GPU through its own mapping; pages move between the GPUs as ranks take
    // them (two ranks per GPU of the emulated device).
    let lease = c.acquire(&region, r * SLICE..(r + 1) * SLICE, device, Mode::Write).expect("acquire my slice");
    lease.write(0, &pattern::bytes(SEED + r, 0, SLICE as usize)).expect("write");
    c.synchronize(device).expect("synchronize");
    c.release(lease).expect("release");
    std::fs::write(dir.join(format!("done-{r}")), "").expect("note");
    if r == 0 {
        for other in 0..RANKS {
            wait_file(&dir.join(format!("done-{other}")));
        }
        let all = c.acquire(&region, 0..RANKS * SLICE, Location::Host, Mode::Read).expect("acquire all");
        for other in 0..RANKS {
            let mut got = vec![0u8; SLICE as usize];
            all.read(other * SLICE, &mut got).expect("read");
            assert_eq!(pattern::first_mismatch(SEED + other, 0, &got), None, "rank {other}'s slice");
        }
        c.release(all).expect("release");
    }
    println!("RANK {r} OK");
}

#[test]
#[ignore = "a client process of local_clients_in_processes_share_the_nodes_memory"]
fn child_writer() {
    let (socket, _) = child_env();
    let c = AttachedClient::attach(&socket).expect("attach");
    assert!(c.devices().contains(&Location::Gpu(0)) && c.devices().contains(&Location::Host), "{:?}", c.devices());
    let options = AllocOptions { device: Some(Location::Gpu(0)), keep: true, ..AllocOptions::default() };
    let r = c.alloc(LEN, &options).expect("alloc");
    let lease = c.acquire(&r, 0..LEN, Location::Gpu(0), Mode::Write).expect("acquire");
    assert_eq!((lease.offset(), lease.len()), (0, LEN));
    lease.write(0, &pattern::bytes(SEED, 0, LEN as usize)).expect("write through the mapping");
    c.synchronize(Location::Gpu(0)).expect("synchronize");
    c.release(lease).expect("release");
    println!("REGION {}", region_arg(&r));
}

#[test]
#[ignore = "a client process of local_clients_in_processes_share_the_nodes_memory"]
fn child_reader() {
    let (socket, args) = child_env();
    let c = AttachedClient::attach(&socket).expect("attach");
    let r = parse_region(&args);
    for device in [Location::Gpu(0), Location::Host] {
        // An unaligned range: the lease covers its whole pages.
        let lease = c.acquire(&r, 70_000..LEN - 5, device, Mode::Read).expect("acquire");
        assert_eq!(lease.offset(), 65_536);
        let mut got = vec![0u8; (LEN - lease.offset()) as usize];
        lease.read(0, &mut got).expect("read through the mapping");
        assert_eq!(pattern::first_mismatch(SEED, lease.offset(), &got), None, "bytes on {device}");
        assert!(matches!(lease.write(0, b"x"), Err(FabricError::ReadOnlyLease(_))));
        c.release(lease).expect("release");
    }
    // Through the socket too, and the typed errors the agent answers with.
    let mut some = vec![0u8; 1000];
    c.read(&r, 123_456, &mut some).expect("read through the socket");
    assert_eq!(pattern::first_mismatch(SEED, 123_456, &some), None);
    match c.acquire(&r, 0..LEN + 1, Location::Gpu(0), Mode::Read) {
        Err(FabricError::Remote { kind: ErrorKind::OutOfBounds, .. }) => {}
        other => panic!("an acquire past the end: {other:?}"),
    }
    let stats: serde_json::Value = serde_json::from_str(&c.stats_json().expect("stats")).expect("JSON");
    assert!(stats["directory"]["regions"].as_u64().is_some_and(|n| n >= 1), "{stats}");
    c.prefetch(&r, 0..LEN, Location::Host).expect("a prefetch hint");
    println!("READ OK");
}

#[test]
#[ignore = "a client process of local_clients_in_processes_share_the_nodes_memory"]
fn child_holder() {
    let (socket, args) = child_env();
    let c = AttachedClient::attach(&socket).expect("attach");
    let owned = c.alloc(1 << 20, &AllocOptions::default()).expect("alloc");
    println!("OWNED {}", region_arg(&owned));
    let r = parse_region(&args);
    let lease = c.acquire(&r, 0..LEN, Location::Gpu(0), Mode::Write).expect("acquire");
    println!("HOLDING");
    std::thread::sleep(Duration::from_secs(120));
    drop(lease);
}
