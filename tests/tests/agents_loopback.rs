//! Several agents in one process, joined by QUIC over loopback: remote alloc, write, read and free through the
//! regions' home nodes, every byte verified; typed errors from the home; a peer with a certificate from another
//! CA refused; a peer that breaks the protocol cut off while the agent keeps serving the others; a stopped
//! agent's regions failing with a clear error instead of hanging.

use std::time::Duration;

use vfabric::agent::Agent;
use vfabric::proto::{write_frame, ErrorKind, Message};
use vfabric::FabricError;
use vfabric_tests::loopback::{cluster, config};
use vfabric_tests::pattern;
use vfabric_transport::quic::{self, ClusterCa, QuicSettings};
use vfabric_transport::Location;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime")
}

#[test]
fn remote_regions_round_trip_through_their_home() {
    runtime().block_on(async {
        let cfg = config(3);
        let ca = ClusterCa::generate("loop").expect("ca");
        let a = cluster(&cfg, &ca).await;
        // n0 allocates on n1 (bigger than one chunk and not page-aligned at the ends), writes, and every node reads.
        let len = 5 * (1 << 20) + 12345;
        let r = a[0].alloc(1, len as u64, Some(Location::Gpu(0))).await.expect("remote alloc");
        assert_eq!(r.addr.node().0, 1, "the region's home is n1");
        let data = pattern::bytes(7, 0, len);
        a[0].write(&r, 0, &data).await.expect("remote write");
        for (i, agent) in a.iter().enumerate() {
            let mut back = vec![0u8; len];
            agent.read(&r, 0, &mut back).await.unwrap_or_else(|e| panic!("read from n{i}: {e}"));
            assert_eq!(pattern::first_mismatch(7, 0, &back), None, "bytes read from n{i}");
        }
        // n0's calls to n1 took the latency lane (the alloc) and both lanes (the write, in two parts), each a
        // connection of its own; the latency lane is driven on a thread of its own (the runtime is
        // multi-threaded).
        assert_eq!(a[0].open_lanes(1).await.expect("known node"), [0, 1, 2]);
        assert_eq!(a[0].lane_threads(), 1);
        // A write at an offset from n2, read back in a window straddling it.
        let patch = pattern::bytes(9, 0, 300_000);
        a[2].write(&r, 1_000_000, &patch).await.expect("write at an offset");
        let mut win = vec![0u8; 500_000];
        a[0].read(&r, 900_000, &mut win).await.expect("read a window");
        assert_eq!(&win[..100_000], &data[900_000..1_000_000]);
        assert_eq!(&win[100_000..400_000], &patch[..]);
        assert_eq!(&win[400_000..], &data[1_300_000..1_400_000]);
        // Errors come back typed from the home, and change nothing.
        let mut big = vec![0u8; 64];
        match a[0].read(&r, r.len - 10, &mut big).await {
            Err(FabricError::Remote { node: 1, kind: ErrorKind::OutOfBounds, .. }) => {}
            other => panic!("out-of-bounds read: {other:?}"),
        }
        // A write refused before its payload is taken (it runs past the end), longer than the flow-control
        // window: the home's answer arrives although it never reads the bytes.
        let long = vec![1u8; 20 << 20];
        match a[0].write(&r, 0, &long).await {
            Err(FabricError::Remote { node: 1, kind: ErrorKind::OutOfBounds, .. }) => {}
            other => panic!("a long write past the end: {other:?}"),
        }
        match a[2].alloc(1, 0, None).await {
            Err(FabricError::Remote { node: 1, .. }) => {}
            other => panic!("an empty alloc: {other:?}"),
        }
        a[2].free(&r).await.expect("remote free");
        match a[0].read(&r, 0, &mut big).await {
            Err(FabricError::Remote { kind: ErrorKind::UseAfterFree, .. }) => {}
            other => panic!("read after free: {other:?}"),
        }
        match a[1].free(&r).await {
            Err(FabricError::DoubleFree(_)) => {}
            other => panic!("double free at home: {other:?}"),
        }
        assert!(a[0].ping(2).await.is_ok());
        // A migration asked from n0 happens at the home, n1: the region's pages go to n1's gpu1.
        let m = a[0].alloc(1, 4 << 20, Some(Location::Gpu(0))).await.expect("alloc on n1's gpu0");
        a[0].write(&m, 0, &pattern::bytes(3, 0, 4 << 20)).await.expect("write");
        let on = |dev: Location| {
            a[1].fabric().stats().directory.devices.iter().find(|d| d.location == dev).map_or(0, |d| d.used)
        };
        let before = on(Location::Gpu(1));
        a[0].migrate(&m, Location::Gpu(1)).await.expect("remote migrate");
        assert_eq!(on(Location::Gpu(1)), before + 2, "both pages now on n1's gpu1");
        let mut back = vec![0u8; 4 << 20];
        a[2].read(&m, 0, &mut back).await.expect("read after the migration");
        assert_eq!(pattern::first_mismatch(3, 0, &back), None);
        match a[0].migrate(&m, Location::Gpu(7)).await {
            Err(FabricError::Remote { node: 1, kind: ErrorKind::DeviceUnavailable, .. }) => {}
            other => panic!("a migration to a device n1 lacks: {other:?}"),
        }
        for x in &a {
            x.shutdown().await;
        }
    });
}

/// A long read or write goes over every lane at once, one part each, and arrives whole; a part that fails
/// fails the call with the home's typed error.
#[test]
fn long_calls_are_striped_over_the_lanes() {
    runtime().block_on(async {
        let mut cfg = config(2);
        cfg.network.lanes = 2;
        // No heartbeat during the test: a ping takes a lane too, and the count of open lanes below would be off.
        cfg.network.heartbeat_ms = 60_000;
        cfg.network.dead_after_ms = 120_000;
        let ca = ClusterCa::generate("loop").expect("ca");
        let a = cluster(&cfg, &ca).await;
        // Bulk transfers leave the latency lane (lane 0) alone: an acquire of 4 KiB in a 2 MiB page (the whole
        // page crosses the wire) and a long write, n1's first calls to n0, open the two lanes only.
        let here = a[0].alloc(0, 2 << 20, None).await.expect("local alloc");
        let lease = a[1].acquire(&here, 0..4096, Location::Host, vfabric::Mode::Write).await.expect("acquire");
        a[1].release(lease).await.expect("release");
        assert_eq!(a[1].open_lanes(0).await.expect("known node"), [1], "the acquire of a page took a bulk lane");
        a[1].write(&here, 0, &pattern::bytes(5, 0, 1 << 20)).await.expect("long write to n0");
        assert_eq!(a[1].open_lanes(0).await.expect("known node"), [1, 2], "a bulk write took the two lanes");
        let len = 6 << 20;
        let r = a[0].alloc(1, len as u64, None).await.expect("remote alloc");
        // Short calls one after another keep to one lane (the least busy, the first of those).
        for i in 0..5 {
            a[0].write(&r, i * 4096, &[i as u8; 4096]).await.expect("short write");
        }
        a[0].ping(1).await.expect("ping");
        assert_eq!(a[0].open_lanes(1).await.expect("known node"), [0], "calls one at a time took lane 0");
        // One write: without striping it would take one lane, and open no other.
        let data = pattern::bytes(11, 0, (4 << 20) + 777);
        a[0].write(&r, 12_345, &data).await.expect("striped write");
        assert_eq!(a[0].open_lanes(1).await.expect("known node"), [0, 1, 2], "one write used both lanes");
        let mut back = vec![0u8; (3 << 20) + 5];
        a[0].read(&r, 12_345 + 1001, &mut back).await.expect("striped read");
        assert!(back[..] == data[1001..1001 + back.len()], "bytes read back in parts");
        // Short calls at the same time spread over the lanes, the latency lane included: three writes in flight
        // at once take the three lanes, each held until its call ends (n1 had opened two).
        let back_home = a[1].alloc(0, 1 << 20, None).await.expect("alloc at n0");
        let short = [7u8; 64 << 10];
        let (w0, w1, w2) = tokio::join!(
            a[1].write(&back_home, 0, &short),
            a[1].write(&back_home, 64 << 10, &short),
            a[1].write(&back_home, 128 << 10, &short)
        );
        w0.and(w1).and(w2).expect("three writes at once");
        assert_eq!(a[1].open_lanes(0).await.expect("known node"), [0, 1, 2], "three calls at once took three lanes");
        // The last part runs past the region's end: the whole read fails, typed.
        let mut past = vec![0u8; 2 << 20];
        match a[0].read(&r, len as u64 - (1 << 20), &mut past).await {
            Err(FabricError::Remote { node: 1, kind: ErrorKind::OutOfBounds, .. }) => {}
            other => panic!("a read past the end: {other:?}"),
        }
        for x in &a {
            x.shutdown().await;
        }
    });
}

#[test]
fn strangers_and_protocol_breakers_are_cut_off() {
    runtime().block_on(async {
        let cfg = config(2);
        let ca = ClusterCa::generate("loop").expect("ca");
        let a = cluster(&cfg, &ca).await;
        // A node of the same name with a certificate from another CA.
        let other_ca = ClusterCa::generate("loop").expect("ca");
        let stranger =
            Agent::start(&cfg, "n0", &other_ca.issue("n0").expect("cert"), Some("127.0.0.1:0".parse().expect("addr")))
                .await
                .expect("stranger starts");
        stranger.set_peer_addr(1, a[1].local_addr()).await.expect("peer");
        let r = stranger.alloc(1, 1 << 20, None).await;
        assert!(
            matches!(r, Err(FabricError::Network(_)) | Err(FabricError::PeerDead { .. })),
            "a stranger got in: {r:?}"
        );
        stranger.shutdown().await;

        // A member that sends garbage after its hello: its connection is closed, n1 keeps serving n0.
        let id = ca.issue("n0").expect("cert");
        let ep = quic::endpoint("127.0.0.1:0".parse().expect("addr"), &id, &QuicSettings::default()).expect("endpoint");
        let conn = quic::connect(&ep, a[1].local_addr(), "n1").await.expect("connect");
        let (mut s, mut rcv) = conn.open_bi().await.expect("stream");
        let hello = member_hello(&cfg);
        write_frame(&mut s, &hello, 1 << 20).await.expect("hello");
        s.finish().expect("finish");
        let welcome = vfabric::proto::read_frame(&mut rcv, 1 << 20).await.expect("welcome");
        assert!(matches!(welcome, Some(Message::Welcome { node: 1, .. })), "{welcome:?}");
        let (mut s, _r) = conn.open_bi().await.expect("stream");
        s.write_all(b"VFAB\x00\x63\x00\x00\x00\x00\x00\x04junk").await.expect("garbage");
        s.finish().expect("finish");
        let closed = tokio::time::timeout(Duration::from_secs(5), conn.closed()).await.expect("closed in time");
        match closed {
            quinn::ConnectionError::ApplicationClosed(c) => {
                assert_eq!(c.error_code, quinn::VarInt::from_u32(1), "closed as a protocol violation");
                let why = String::from_utf8_lossy(&c.reason);
                assert!(why.contains("version"), "the reason names the bad version: {why}");
            }
            other => panic!("closed another way: {other}"),
        }
        // n1 still serves n0.
        let r = a[0].alloc(1, 1 << 20, None).await.expect("n1 still serves");
        a[0].write(&r, 0, &[1u8; 1000]).await.expect("write");

        // A member with another lane layout (it would dial the wrong ports): refused at its hello, with a reason
        // that names the settings.
        for (lanes, latency_lane) in [(cfg.network.lanes + 1, true), (cfg.network.lanes, false)] {
            let conn = quic::connect(&ep, a[1].local_addr(), "n1").await.expect("connect");
            let (mut s, _rcv) = conn.open_bi().await.expect("stream");
            let other = Message::Hello {
                cluster: "loop".into(),
                node: 0,
                protocol: vfabric::proto::PROTOCOL_VERSION,
                lanes,
                latency_lane,
            };
            write_frame(&mut s, &other, 1 << 20).await.expect("hello");
            s.finish().expect("finish");
            match tokio::time::timeout(Duration::from_secs(5), conn.closed()).await.expect("closed in time") {
                quinn::ConnectionError::ApplicationClosed(c) => {
                    let why = String::from_utf8_lossy(&c.reason);
                    assert!(why.contains("network.lanes and network.latency_lane"), "{why}");
                }
                other => panic!("closed another way: {other}"),
            }
        }

        // A member whose write chunk claims an offset at the end of the address space (so that offset + length
        // wraps around): refused as a protocol violation, not a panic in the serving task.
        let conn = quic::connect(&ep, a[1].local_addr(), "n1").await.expect("connect");
        let (mut s, mut rcv) = conn.open_bi().await.expect("stream");
        write_frame(&mut s, &hello, 1 << 20).await.expect("hello");
        s.finish().expect("finish");
        let welcome = vfabric::proto::read_frame(&mut rcv, 1 << 20).await.expect("welcome");
        assert!(matches!(welcome, Some(Message::Welcome { node: 1, .. })), "{welcome:?}");
        let (mut s, _r) = conn.open_bi().await.expect("stream");
        let write = Message::Write { region: vfabric::proto::WireRegion::from(&r), offset: 0, len: 1000 };
        write_frame(&mut s, &write, 1 << 20).await.expect("write request");
        let payload = [2u8; 100];
        let header = vfabric::proto::ChunkHeader::for_payload(u64::MAX - 10, &payload).encode();
        s.write_all(&header).await.expect("chunk header");
        // The agent may close the connection as soon as the header arrives: the payload need not get there.
        let _ = s.write_all(&payload).await;
        let _ = s.finish();
        match tokio::time::timeout(Duration::from_secs(5), conn.closed()).await.expect("closed in time") {
            quinn::ConnectionError::ApplicationClosed(c) => {
                assert_eq!(c.error_code, quinn::VarInt::from_u32(1), "closed as a protocol violation");
                let why = String::from_utf8_lossy(&c.reason);
                assert!(why.contains("runs past"), "the reason says what was wrong: {why}");
            }
            other => panic!("closed another way: {other}"),
        }
        let mut back = [0u8; 1000];
        a[0].read(&r, 0, &mut back).await.expect("n1 still serves");
        assert_eq!(back, [1u8; 1000], "nothing of the refused write was written");
        ep.close(quinn::VarInt::from_u32(0), b"done");
        for x in &a {
            x.shutdown().await;
        }
    });
}

/// The hello of node n0 of `cfg`'s cluster, as a member says it.
fn member_hello(cfg: &vfabric::ClusterConfig) -> Message {
    Message::Hello {
        cluster: "loop".into(),
        node: 0,
        protocol: vfabric::proto::PROTOCOL_VERSION,
        lanes: cfg.network.lanes,
        latency_lane: cfg.network.latency_lane,
    }
}

/// One request on its own stream of `conn`, and the answer.
async fn ask(conn: &quinn::Connection, msg: &Message) -> Message {
    let (mut s, mut rcv) = conn.open_bi().await.expect("stream");
    write_frame(&mut s, msg, 1 << 20).await.expect("request");
    s.finish().expect("finish");
    vfabric::proto::read_frame(&mut rcv, 1 << 20).await.expect("answer").expect("an answer")
}

/// The requests of the NCCL route, from a member the home cannot serve them for: no NCCL (the emulated device) and
/// an unknown channel are refused with a typed error, a malformed id closes the connection with the reason; the
/// region is untouched, and a lease goes by QUIC, saying why.
#[test]
fn channel_requests_a_home_cannot_serve_are_refused_with_a_reason() {
    runtime().block_on(async {
        let cfg = config(2);
        let ca = ClusterCa::generate("loop").expect("ca");
        let a = cluster(&cfg, &ca).await;
        let r = a[0].alloc(1, 1 << 20, Some(Location::Gpu(0))).await.expect("alloc on n1");
        a[0].write(&r, 0, &pattern::bytes(5, 0, 1 << 20)).await.expect("write");
        let id = ca.issue("n0").expect("cert");
        let ep = quic::endpoint("127.0.0.1:0".parse().expect("addr"), &id, &QuicSettings::default()).expect("endpoint");
        let conn = quic::connect(&ep, a[1].local_addr(), "n1").await.expect("connect");
        let hello = member_hello(&cfg);
        assert!(matches!(ask(&conn, &hello).await, Message::Welcome { node: 1, .. }));
        let refused = |m: Message, kind: ErrorKind, says: &str| match m {
            Message::Error { kind: k, message } if k == kind && message.contains(says) => {}
            other => panic!("expected {kind:?} saying {says:?}: {other:?}"),
        };
        let join = ask(&conn, &Message::ChannelJoin { link: 1, id: vec![0; 128], gpu: 0 }).await;
        refused(join, ErrorKind::Unavailable, "NCCL is not available");
        let by = Message::AcquireBy {
            link: 1,
            region: vfabric::proto::WireRegion::from(&r),
            offset: 0,
            len: 1 << 20,
            mode: vfabric::proto::WireMode::Read,
            cached: None,
            runs: vec![u32::MAX],
        };
        refused(ask(&conn, &by).await, ErrorKind::Unavailable, "no channel 1");
        // An id of the wrong length breaks the protocol: the connection closes, saying which field.
        let (mut s, _rcv) = conn.open_bi().await.expect("stream");
        let bad = Message::ChannelJoin { link: 1, id: vec![0; 5], gpu: 0 };
        write_frame(&mut s, &bad, 1 << 20).await.expect("request");
        s.finish().expect("finish");
        match tokio::time::timeout(Duration::from_secs(5), conn.closed()).await.expect("closed in time") {
            quinn::ConnectionError::ApplicationClosed(c) => {
                assert!(String::from_utf8_lossy(&c.reason).contains("ChannelJoin.id"), "{c:?}");
            }
            other => panic!("closed another way: {other}"),
        }
        // Nothing changed: the region reads back, and a lease onto n0's GPU came by QUIC, saying why.
        let mut back = vec![0u8; 1 << 20];
        a[0].read(&r, 0, &mut back).await.expect("read");
        assert_eq!(pattern::first_mismatch(5, 0, &back), None);
        let l = a[0].acquire(&r, 0..1 << 20, Location::Gpu(0), vfabric::Mode::Read).await.expect("lease");
        a[0].release(l).await.expect("release");
        let status = a[0].status().await;
        let routes = &status.peers.iter().find(|p| p.node == 1).expect("n1").routes;
        assert!(routes.iter().any(|x| x.route == "quic" && x.why.contains("NCCL")), "{routes:?}");
        ep.close(quinn::VarInt::from_u32(0), b"done");
        for x in &a {
            x.shutdown().await;
        }
    });
}

#[test]
fn a_stopped_agent_fails_calls_instead_of_hanging() {
    runtime().block_on(async {
        let cfg = config(3);
        let ca = ClusterCa::generate("loop").expect("ca");
        let mut a = cluster(&cfg, &ca).await;
        let on2 = a[0].alloc(2, 1 << 20, None).await.expect("alloc on n2");
        let on1 = a[0].alloc(1, 1 << 20, None).await.expect("alloc on n1");
        a[2].shutdown().await;
        let mut buf = vec![0u8; 1 << 20];
        let err = a[0].read(&on2, 0, &mut buf).await.expect_err("n2 is gone");
        assert!(matches!(err, FabricError::Network(_) | FabricError::PeerDead { .. }), "{err}");
        // Once the heartbeats stop, n2 is declared dead and calls fail at once.
        tokio::time::sleep(Duration::from_millis(cfg.network.dead_after_ms + 500)).await;
        assert!(!a[0].is_alive(2).await.expect("known node"), "n2 declared dead");
        match a[0].read(&on2, 0, &mut buf).await {
            Err(FabricError::PeerDead { node: 2, .. }) => {}
            other => panic!("read from a dead node: {other:?}"),
        }
        // The others are untouched.
        a[0].write(&on1, 0, &buf).await.expect("n1 still works");
        assert!(a[0].is_alive(1).await.expect("known"));
        // n2 comes back at the same address: n0's heartbeats see it again, with nobody telling n0.
        let n2_addr = a[2].local_addr();
        drop(a.pop());
        let id = ca.issue("n2").expect("cert");
        // The stopped agent's socket goes once the last handle on it is dropped.
        let mut restarted = None;
        for _ in 0..50 {
            match Agent::start(&cfg, "n2", &id, Some(n2_addr)).await {
                Ok(x) => {
                    restarted = Some(x);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let back = restarted.expect("n2 restarts at its address");
        // (n2 is not told where n0 is, so only n0's own heartbeats can find it.)
        let mut alive = false;
        for _ in 0..100 {
            if a[0].is_alive(2).await.expect("known") {
                alive = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(alive, "the restarted n2 is alive again for n0");
        a[0].alloc(2, 1 << 20, None).await.expect("calls to n2 work again");
        back.shutdown().await;
        a[0].shutdown().await;
        a[1].shutdown().await;
    });
}

/// The bytes under a lease, read through its frames on this node's device.
fn leased_bytes(agent: &Agent, lease: &vfabric::agent::AgentLease) -> Vec<u8> {
    let l = lease.local().expect("a local lease");
    let ps = agent.fabric().page_size();
    let mut out = vec![0u8; l.frames().len() * ps as usize];
    l.read(0, &mut out).expect("read the leased pages");
    out
}

#[test]
fn remote_leases_put_pages_on_this_node_and_keep_the_home_coherent() {
    runtime().block_on(async {
        let cfg = config(3);
        let ca = ClusterCa::generate("loop").expect("ca");
        let a = cluster(&cfg, &ca).await;
        let ps = a[0].fabric().page_size();
        let r = a[0].alloc(1, 4 * ps, None).await.expect("alloc on n1");
        let data = pattern::bytes(21, 0, (4 * ps) as usize);
        a[0].write(&r, 0, &data).await.expect("write");
        let g0 = Location::Gpu(0);

        // n0 leases pages 1..3 for writing: they arrive on n0's GPU with the region's bytes.
        let w = a[0].acquire(&r, ps..3 * ps, g0, vfabric::Mode::Write).await.expect("remote write lease");
        assert_eq!(w.home(&a[0]), 1);
        // They came over QUIC, and n0's status says why no faster route was open (no NCCL on the emulated
        // device, or the same GPU of one machine on a real one).
        let status = a[0].status().await;
        let n1 = status.peers.iter().find(|p| p.node == 1).expect("n1 in n0's status");
        match &n1.routes[..] {
            [q] if q.route == "quic" && q.moves == 1 && q.bytes == 2 * ps => {
                let why = if a[0].fabric().nccl_available() { "same GPU" } else { "NCCL is not available" };
                assert!(q.why.contains(why), "{}", q.why);
            }
            other => panic!("n0's moves with n1 by route: {other:?}"),
        }
        assert!(leased_bytes(&a[0], &w) == data[ps as usize..3 * ps as usize], "leased bytes are the region's");
        // Meanwhile the home refuses every other lease on those pages, and host reads of them.
        match a[2].acquire(&r, 2 * ps..3 * ps, g0, vfabric::Mode::Read).await {
            Err(FabricError::Remote { node: 1, kind: ErrorKind::LeasedElsewhere, .. }) => {}
            other => panic!("a read lease beside a remote write lease: {:?}", other.map(|_| ())),
        }
        let mut page = vec![0u8; ps as usize];
        assert!(a[2].read(&r, ps, &mut page).await.is_err(), "a read of pages leased for writing");
        // Pages outside the lease stay usable.
        a[2].read(&r, 3 * ps, &mut page).await.expect("a page outside the lease");
        assert!(page == data[3 * ps as usize..]);
        // The "kernel" writes through the lease on n0's GPU; the release sends the pages home.
        let l = w.local().expect("local lease");
        l.pages().fill(0, l.len(), 0x77).expect("device memset");
        a[0].release(w).await.expect("release sends the pages home");
        let mut back = vec![0u8; (4 * ps) as usize];
        a[2].read(&r, 0, &mut back).await.expect("read after the write lease");
        assert!(back[..ps as usize] == data[..ps as usize], "page 0 untouched");
        assert!(back[ps as usize..3 * ps as usize].iter().all(|&b| b == 0x77), "pages 1..3 hold what the lease wrote");
        assert!(back[3 * ps as usize..] == data[3 * ps as usize..], "page 3 untouched");

        // Two read leases from two nodes at once, each with the bytes; a write lease waits for both.
        let r0 = a[0].acquire(&r, 0..2 * ps, g0, vfabric::Mode::Read).await.expect("read lease on n0");
        let r2 = a[2].acquire(&r, ps..2 * ps, g0, vfabric::Mode::Read).await.expect("read lease on n2");
        assert!(leased_bytes(&a[2], &r2).iter().all(|&b| b == 0x77));
        assert!(matches!(
            a[1].acquire(&r, 0..ps, g0, vfabric::Mode::Write).await.map(|_| ()),
            Err(FabricError::LeasedElsewhere { .. })
        ));
        a[0].release(r0).await.expect("release");
        // A lease dropped without release is let go at the home in the background.
        drop(r2);
        let mut freed = false;
        for _ in 0..100 {
            if let Ok(l) = a[1].acquire(&r, 0..4 * ps, g0, vfabric::Mode::Write).await {
                a[1].release(l).await.expect("release");
                freed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(freed, "the dropped read lease was let go at the home");
        // A range past the region's end is refused before anything is asked of the home or allocated here.
        assert!(matches!(
            a[0].acquire(&r, 0..(1 << 50), g0, vfabric::Mode::Read).await.map(|_| ()),
            Err(FabricError::OutOfBounds { .. })
        ));
        assert!(a[0].free(&r).await.is_ok());
        for x in &a {
            x.shutdown().await;
        }
    });
}

#[test]
fn local_clients_reach_the_cluster_through_their_node_agent() {
    runtime().block_on(async {
        let cfg = config(2);
        let ca = ClusterCa::generate("loop").expect("ca");
        let a = cluster(&cfg, &ca).await;
        let path = std::env::temp_dir().join(format!("vfabric-local-{}.sock", std::process::id()));
        a[0].serve_local(&path).await.expect("serve the socket");
        assert!(a[1].serve_local(&path).await.is_err(), "a live socket is not taken over");
        let c = vfabric::agent::LocalClient::connect(&path).await.expect("connect");
        assert_eq!(c.node(), 0);
        // A region at n0 (the client's agent), and one at n1 reached through it.
        let here = c.alloc(3 << 20, None).await.expect("alloc");
        let there = a[0].alloc(1, 3 << 20, None).await.expect("alloc on n1");
        for r in [&here, &there] {
            let data = pattern::bytes(5, 0, (3 << 20) - 7);
            c.write(r, 7, &data).await.expect("write through the socket");
            let mut back = vec![0u8; data.len()];
            c.read(r, 7, &mut back).await.expect("read through the socket");
            assert!(back == data, "bytes through the socket, home n{}", r.addr.node().0);
        }
        match c.read(&there, there.len - 1, &mut [0u8; 2]).await {
            Err(FabricError::Remote { kind: ErrorKind::OutOfBounds, .. }) => {}
            other => panic!("an out-of-bounds read: {other:?}"),
        }
        c.free(&there).await.expect("free");
        // A client that sends garbage is cut off; the others go on.
        let mut raw = tokio::net::UnixStream::connect(&path).await.expect("connect");
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        raw.write_all(b"XXXX\x00\x01\x00\x00\x00\x00\x00\x00").await.expect("garbage");
        let mut sink = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut sink)).await.expect("closed in time");
        assert_eq!(n.expect("read"), 0, "the agent closed the connection without answering");
        c.free(&here).await.expect("the first client is still served");
        for x in &a {
            x.shutdown().await;
        }
        let _ = std::fs::remove_file(&path);
    });
}

#[test]
fn copies_of_remote_pages_are_reused_while_current_and_refreshed_after_a_write() {
    runtime().block_on(async {
        let cfg = config(3);
        let ca = ClusterCa::generate("loop").expect("ca");
        let a = cluster(&cfg, &ca).await;
        let ps = a[0].fabric().page_size();
        let g0 = Location::Gpu(0);
        let r = a[0].alloc(1, 2 * ps, None).await.expect("alloc on n1");
        let data = pattern::bytes(31, 0, (2 * ps) as usize);
        a[0].write(&r, 0, &data).await.expect("write");
        let copied = |x: &Agent| x.fabric().traffic().host_io;

        let l = a[0].acquire(&r, 0..2 * ps, g0, vfabric::Mode::Read).await.expect("first lease");
        assert!(leased_bytes(&a[0], &l) == data);
        a[0].release(l).await.expect("release");
        // Unchanged at the home: the next lease uses the kept copy, no page crosses the wire.
        let before = copied(&a[0]);
        let l = a[0].acquire(&r, 0..2 * ps, g0, vfabric::Mode::Read).await.expect("second lease");
        assert_eq!(copied(&a[0]), before, "no page was copied in for an unchanged range");
        assert!(leased_bytes(&a[0], &l) == data);
        a[0].release(l).await.expect("release");
        // Another node writes one byte: the copy is stale, and the next lease brings the new bytes.
        a[2].write(&r, ps + 5, &[0xEE]).await.expect("a write elsewhere");
        let l = a[0].acquire(&r, 0..2 * ps, g0, vfabric::Mode::Read).await.expect("third lease");
        assert!(copied(&a[0]) > before, "the stale copy was refreshed");
        let got = leased_bytes(&a[0], &l);
        assert_eq!(got[(ps + 5) as usize], 0xEE, "the new byte");
        assert!(got[..(ps + 5) as usize] == data[..(ps + 5) as usize], "the rest as before");
        a[0].release(l).await.expect("release");
        // A write lease from the copy: its release makes the copy the current version, reused next time.
        let w = a[0].acquire(&r, 0..2 * ps, g0, vfabric::Mode::Write).await.expect("write lease");
        let lw = w.local().expect("local");
        lw.pages().fill(0, ps, 0x11).expect("memset");
        a[0].release(w).await.expect("release sends it home");
        let before = copied(&a[0]);
        let l = a[0].acquire(&r, 0..2 * ps, g0, vfabric::Mode::Read).await.expect("after the write lease");
        assert_eq!(copied(&a[0]), before, "the written copy is current");
        assert!(leased_bytes(&a[0], &l)[..ps as usize].iter().all(|&b| b == 0x11));
        a[0].release(l).await.expect("release");
        let mut home = vec![0u8; ps as usize];
        a[1].read(&r, 0, &mut home).await.expect("read at home");
        assert!(home.iter().all(|&b| b == 0x11), "the home has what the lease wrote");
        for x in &a {
            x.shutdown().await;
        }
    });
}

/// Pages used by regions on one node's devices (the directory's count).
fn pages_on(agent: &Agent, dev: Location) -> u32 {
    agent.fabric().stats().directory.devices.iter().find(|d| d.location == dev).map_or(0, |d| d.used)
}

#[test]
fn regions_move_to_other_nodes_and_callers_follow_hints() {
    runtime().block_on(async {
        let cfg = config(3);
        let ca = ClusterCa::generate("loop").expect("ca");
        let a = cluster(&cfg, &ca).await;
        let len = 3 * (1 << 20) + 4321;
        let r = a[0].alloc(0, len as u64, Some(Location::Gpu(0))).await.expect("alloc on n0");
        let data = pattern::bytes(11, 0, len);
        a[0].write(&r, 0, &data).await.expect("write");
        let read_all = async |agent: &Agent| {
            let mut back = vec![0u8; len];
            agent.read(&r, 0, &mut back).await.map(|()| back)
        };
        let n0_gpu0 = pages_on(&a[0], Location::Gpu(0));
        let n2_gpu0 = pages_on(&a[2], Location::Gpu(0));

        // n1 asks the home, n0, to move the region to n2's gpu0: the pages leave n0 and land on n2.
        a[1].migrate_to(&r, 2, Location::Gpu(0)).await.expect("migrate to n2");
        assert_eq!(pages_on(&a[0], Location::Gpu(0)), n0_gpu0 - 2, "n0's copy is freed");
        assert_eq!(pages_on(&a[2], Location::Gpu(0)), n2_gpu0 + 2, "the pages are on n2's gpu0");
        // Every node reads the same bytes under the region's own address (n0 and n1 are told where by the
        // home; n2 finds its own hosted copy the same way).
        for (i, x) in a.iter().enumerate() {
            let back = read_all(x).await.unwrap_or_else(|e| panic!("read from n{i}: {e}"));
            assert_eq!(pattern::first_mismatch(11, 0, &back), None, "bytes read from n{i}");
        }
        // Writes from anywhere land in the moved pages.
        let patch = pattern::bytes(12, 0, 100_000);
        a[2].write(&r, 2_000_000, &patch).await.expect("write at n2, the pages' node");
        let mut expect = data.clone();
        expect[2_000_000..2_100_000].copy_from_slice(&patch);
        assert!(read_all(&a[1]).await.expect("read") == expect);
        // A lease on the moved region comes from n2, and keeps it from moving again.
        let lease = a[0].acquire(&r, 0..(1 << 20), Location::Gpu(0), vfabric::Mode::Read).await.expect("acquire");
        assert_eq!(lease.home(&a[0]), 2, "the lease comes from the node that has the pages");
        assert_eq!(&leased_bytes(&a[0], &lease)[..1 << 20], &expect[..1 << 20]);
        match a[1].migrate_to(&r, 1, Location::Gpu(0)).await {
            Err(FabricError::Remote { node: 0, kind: ErrorKind::LeasedElsewhere, .. }) => {}
            other => panic!("a migration of a leased region: {other:?}"),
        }
        assert_eq!(pages_on(&a[1], Location::Gpu(0)), 0, "the failed migration's copy is freed");
        a[0].release(lease).await.expect("release");
        assert!(read_all(&a[0]).await.expect("still readable") == expect);

        let forwarding = || a.iter().map(Agent::forwarding_entries).collect::<Vec<_>>();
        assert_eq!(forwarding(), [1, 0, 0], "only the home forwards");

        // It moves on to n1: n0's and n2's hints name a freed copy now; their next calls find the new place.
        a[0].migrate_to(&r, 1, Location::Host).await.expect("migrate to n1's host memory");
        assert_eq!(pages_on(&a[2], Location::Gpu(0)), n2_gpu0, "n2's copy is freed");
        // n2's copy forwarded to the new one while the move ran; once the home names the new one, n2 keeps no
        // entry for it, however often the region moves.
        assert_eq!(forwarding(), [1, 0, 0], "the copy that moved on left no forwarding entry");
        for (i, x) in a.iter().enumerate() {
            let back = read_all(x).await.unwrap_or_else(|e| panic!("read from n{i} after the second move: {e}"));
            assert!(back == expect, "bytes read from n{i} after the second move");
        }
        // The hint needs no home: with n0 stopped, n2 still reads the pages on n1.
        // (Back home first, to check that too, then away again.)
        let away = pages_on(&a[0], Location::Gpu(0));
        a[2].migrate(&r, Location::Gpu(0)).await.expect("back to the home's gpu0");
        assert_eq!(pages_on(&a[0], Location::Gpu(0)), away + 2, "home again");
        assert!(read_all(&a[1]).await.expect("read at home") == expect);
        a[2].migrate_to(&r, 1, Location::Gpu(0)).await.expect("to n1 again");
        assert!(read_all(&a[2]).await.expect("read, learning the hint") == expect);
        a[0].shutdown().await;
        assert!(read_all(&a[2]).await.expect("read through the hint, home stopped") == expect);
        match a[2].free(&r).await {
            Err(FabricError::Network(_) | FabricError::PeerDead { .. }) => {}
            other => panic!("a free needs the home: {other:?}"),
        }
        a[1].shutdown().await;
        a[2].shutdown().await;
    });
}

#[test]
fn freeing_a_moved_region_frees_its_pages_where_they_are() {
    runtime().block_on(async {
        let cfg = config(2);
        let ca = ClusterCa::generate("loop").expect("ca");
        let a = cluster(&cfg, &ca).await;
        let r = a[1].alloc(0, 2 << 20, None).await.expect("alloc on n0");
        a[1].write(&r, 0, &pattern::bytes(5, 0, 2 << 20)).await.expect("write");
        let before = pages_on(&a[1], Location::Gpu(0));
        a[1].migrate_to(&r, 1, Location::Gpu(0)).await.expect("to n1");
        assert_eq!(pages_on(&a[1], Location::Gpu(0)), before + 1);
        match a[0].migrate_to(&r, 9, Location::Gpu(0)).await {
            Err(FabricError::InvalidAddress(_)) => {}
            other => panic!("a migration to a node not in the cluster: {other:?}"),
        }
        a[1].free(&r).await.expect("free through the home");
        assert_eq!(pages_on(&a[1], Location::Gpu(0)), before, "the hosted copy is freed");
        let mut buf = vec![0u8; 16];
        for x in &a {
            match x.read(&r, 0, &mut buf).await {
                Err(FabricError::UseAfterFree(_)) | Err(FabricError::Remote { kind: ErrorKind::UseAfterFree, .. }) => {}
                other => panic!("a read after the free: {other:?}"),
            }
        }
        for x in &a {
            x.shutdown().await;
        }
    });
}

/// Writes from two nodes race two migrations of the region: every write lands (in the pages where they end
/// up), none is lost in pages being copied away.
#[test]
fn writes_racing_migrations_are_never_lost() {
    runtime().block_on(async {
        let cfg = config(3);
        let ca = ClusterCa::generate("loop").expect("ca");
        let a = cluster(&cfg, &ca).await;
        const BLOCK: usize = 64 << 10;
        const BLOCKS: usize = 48;
        let r = a[0].alloc(0, (BLOCK * BLOCKS) as u64, None).await.expect("alloc on n0");
        let writer = |x: Agent, first: usize| {
            tokio::spawn(async move {
                for b in (first..BLOCKS).step_by(2) {
                    let data = pattern::bytes(100 + b as u64, 0, BLOCK);
                    x.write(&r, (b * BLOCK) as u64, &data).await.map_err(|e| format!("block {b}: {e}"))?;
                }
                Ok::<(), String>(())
            })
        };
        let (w1, w2) = (writer(a[1].clone(), 0), writer(a[2].clone(), 1));
        a[2].migrate_to(&r, 2, Location::Gpu(0)).await.expect("to n2");
        a[1].migrate_to(&r, 1, Location::Host).await.expect("to n1");
        w1.await.expect("task").expect("writes from n1");
        w2.await.expect("task").expect("writes from n2");
        let mut back = vec![0u8; BLOCK * BLOCKS];
        a[0].read(&r, 0, &mut back).await.expect("read");
        for b in 0..BLOCKS {
            let got = &back[b * BLOCK..(b + 1) * BLOCK];
            assert_eq!(pattern::first_mismatch(100 + b as u64, 0, got), None, "block {b}");
        }
        for x in &a {
            x.shutdown().await;
        }
    });
}

/// The threads of this process whose name starts with `prefix` (Linux: `/proc/self/task/*/comm`).
fn threads_named(prefix: &str) -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

#[test]
fn lane_threads_end_with_the_agent() {
    // The latency lane's thread is named `vf-lane0-NODE` (`comm` keeps 15 bytes); other tests of this binary
    // may run agents at the same time, so this test's nodes have names no other test uses.
    let mut cfg = config(2);
    cfg.network.lanes = 5;
    for (i, n) in cfg.nodes.iter_mut().enumerate() {
        n.name = format!("lt{i}");
    }
    let ca = ClusterCa::generate("loop").expect("ca");
    let ours = || threads_named("vf-lane0-lt");
    let before = ours();
    // Shut down: the lane threads end.
    runtime().block_on(async {
        let a = cluster(&cfg, &ca).await;
        assert_eq!(a[0].lane_threads(), 1, "the latency lane's thread alone");
        assert_eq!(ours(), before + 2, "one for each agent");
        a[0].ping(1).await.expect("ping over a lane thread");
        for x in &a {
            x.shutdown().await;
        }
    });
    let gone = |want: usize| {
        (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(20));
            ours() <= want
        })
    };
    assert!(gone(before), "lane threads left after shutdown: {}", ours());
    // Never shut down, but the runtime that started the agents is dropped: they end too.
    let rt = runtime();
    rt.block_on(async {
        let a = cluster(&cfg, &ca).await;
        a[1].ping(0).await.expect("ping");
        assert_eq!(ours(), before + 2);
    });
    drop(rt);
    assert!(gone(before), "lane threads left after the runtime ended: {}", ours());
    // On a current-thread runtime there are none, nor without a latency lane.
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime").block_on(async {
        let a = cluster(&cfg, &ca).await;
        assert_eq!(a[0].lane_threads(), 0);
        a[0].ping(1).await.expect("ping on the caller's thread");
        assert!(ours() <= before);
        for x in &a {
            x.shutdown().await;
        }
    });
    cfg.network.latency_lane = false;
    runtime().block_on(async {
        let a = cluster(&cfg, &ca).await;
        assert_eq!(a[0].lane_threads(), 0, "no latency lane");
        a[0].ping(1).await.expect("ping on the runtime's workers");
        for x in &a {
            x.shutdown().await;
        }
    });
}

#[test]
fn mapped_leases_reach_other_nodes_regions_through_the_clients_agent() {
    runtime().block_on(async {
        let cfg = config(2);
        let ca = ClusterCa::generate("loop").expect("ca");
        let a = cluster(&cfg, &ca).await;
        let path = std::env::temp_dir().join(format!("vfabric-mapped-{}.sock", std::process::id()));
        a[0].serve_local(&path).await.expect("serve the socket");
        let ps = a[0].fabric().page_size();
        // A region whose home is n1; the client is attached to n0.
        let r = a[1].alloc(1, 3 * ps, None).await.expect("alloc at n1");
        let data = pattern::bytes(41, 0, (3 * ps) as usize);
        a[1].write(&r, 0, &data).await.expect("write at n1");
        let socket = path.clone();
        let (r2, d2) = (r, data.clone());
        // The client's calls block: off the runtime's threads.
        tokio::task::spawn_blocking(move || {
            let c = vfabric::AttachedClient::attach(&socket).expect("attach");
            let l = c
                .acquire(&r2, ps..3 * ps, Location::Gpu(0), vfabric::Mode::Read)
                .expect("a mapped lease on n1's region");
            let mut got = vec![0u8; (2 * ps) as usize];
            l.read(0, &mut got).expect("read through the mapping");
            assert!(got == d2[ps as usize..], "n1's bytes, brought to n0's GPU and mapped here");
            c.release(l).expect("release");
            let w = c.acquire(&r2, 0..ps, Location::Gpu(0), vfabric::Mode::Write).expect("a write lease");
            w.write(7, b"mapped").expect("write through the mapping");
            c.release(w).expect("the release sends the page home");
        })
        .await
        .expect("the client");
        let mut home = vec![0u8; 16];
        a[1].read(&r, 0, &mut home).await.expect("read at the home");
        assert_eq!(&home[7..13], b"mapped", "the home has what the client wrote through its mapping");
        assert_eq!(&home[..7], &data[..7]);
        a[1].free(&r).await.expect("free");
        for x in &a {
            x.shutdown().await;
        }
        let _ = std::fs::remove_file(&path);
    });
}

#[test]
fn a_local_clients_tensor_pool_takes_its_regions_from_the_agent() {
    runtime().block_on(async {
        let cfg = config(1);
        let ca = ClusterCa::generate("loop").expect("ca");
        let a = cluster(&cfg, &ca).await;
        let path = std::env::temp_dir().join(format!("vfabric-pool-{}.sock", std::process::id()));
        a[0].serve_local(&path).await.expect("serve the socket");
        let socket = path.clone();
        let stats = tokio::task::spawn_blocking(move || {
            let c = vfabric::AttachedClient::attach(&socket).expect("attach");
            let mut cfg = vfabric::PoolConfig::new(&c, Location::Gpu(0));
            cfg.slab_bytes = 2 << 20;
            cfg.large_bytes = 1 << 20;
            let mut pool = vfabric::TensorPool::new(c, cfg).expect("pool");
            let small: Vec<u64> = (0..50).map(|i| pool.alloc(100 + i).expect("small")).collect();
            let large = pool.alloc(3 << 20).expect("large");
            let during = pool.stats();
            for p in small {
                pool.free(p).expect("free");
            }
            pool.free(large).expect("free large");
            during
        })
        .await
        .expect("the client");
        assert_eq!((stats.slabs, stats.large), (1, 1), "{stats:?}");
        // The pool is gone with its client: every region it took at the agent was given back.
        assert_eq!(a[0].fabric().stats().directory.regions, 0);
        assert_eq!(a[0].fabric().stats().directory.leases, 0);
        for x in &a {
            x.shutdown().await;
        }
        let _ = std::fs::remove_file(&path);
    });
}
