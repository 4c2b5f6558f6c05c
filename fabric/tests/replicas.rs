//! Replicated regions across a home's death: a region kept on two nodes (`replicas = 2`) loses no
//! acknowledged byte when its home is killed with SIGKILL mid-write, is served again by its standby with the
//! same handle, and a home that was only frozen, or cut off by a partition (nft on loopback, root), does not
//! serve it again once its standby took over. A node that stops hands its regions over: replicated ones to their
//! standbys, the others (with `network.drain`) to a copy made as it leaves, under a writer that loses no
//! acknowledged write. The homes and standbys are agents in processes of their own (ended by this test, by their
//! PIDs).

mod common;
use common::Ended;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use vfabric::agent::Agent;
use vfabric::{ClusterConfig, FabricError};

const BLOCK: usize = 64 << 10;
const BLOCKS: usize = 256;

/// A cluster of `names` (on loopback ports from `port`) with replicas = 2 (unless `network` says otherwise) and
/// the given `[network]` settings beside it; its configuration's path. Its name is the folder's (agents' local sockets are named after the
/// cluster and the node).
fn cluster(dir: &Path, names: &[&str], port: u16, network: &str) -> PathBuf {
    let name = dir.file_name().and_then(|n| n.to_str()).expect("folder name");
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("scratch folder");
    let mut text = format!(
        "[cluster]\nname = \"{name}\"\n[device]\nbackend = \"emulated\"\n[memory]\npage_size = \"64KiB\"\n\
         gpu_budget = \"8MiB\"\nhost_arena = \"64MiB\"\n[network]\ncerts = \"{}\"\n{}{network}\n",
        dir.join("certs").display(),
        if network.contains("replicas") { "" } else { "replicas = 2\n" }
    );
    for (i, n) in names.iter().enumerate() {
        text += &format!("[[node]]\nname = \"{n}\"\naddress = \"127.0.0.1:{}\"\n", port + 10 * i as u16);
    }
    let config = dir.join("cluster.toml");
    std::fs::write(&config, text).expect("write the configuration");
    let init = Command::new(env!("CARGO_BIN_EXE_vfabric")).args(["cluster", "init", "--config"]).arg(&config).output();
    let init = init.expect("cluster init");
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
    config
}

/// Starts `node`'s agent, its log in the scratch folder (kept when the test fails).
fn start(config: &Path, node: &str) -> Ended {
    let log = std::fs::File::create(config.with_file_name(format!("{node}.log"))).expect("agent log");
    let child = Command::new(env!("CARGO_BIN_EXE_vfabric"))
        .args(["agent", "--node", node, "--config"])
        .arg(config)
        .env("RUST_LOG", "vfabric=debug")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start an agent");
    Ended(child)
}

fn signal(p: &Ended, s: Signal) {
    kill(Pid::from_raw(p.0.id() as i32), s).expect("signal an agent");
}

fn block(i: usize, round: u8) -> Vec<u8> {
    (0..BLOCK).map(|j| (i as u8).wrapping_mul(31) ^ (j as u8) ^ round).collect()
}

/// A region on `node` with replicas = 2, once the agents there answer.
async fn region_on(a: &Agent, node: u16) -> vfabric::Region {
    let mut last = None;
    for _ in 0..100 {
        match a.alloc(node, (BLOCK * BLOCKS) as u64, None).await {
            Ok(r) => return r,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no replicated region on node {node}: {last:?}");
}

/// Writes round `round` into every block of `r`, each write acknowledged.
async fn write_round(a: &Agent, r: &vfabric::Region, round: u8) {
    for i in 0..BLOCKS {
        let written = a.write(r, (i * BLOCK) as u64, &block(i, round)).await;
        written.unwrap_or_else(|e| panic!("round {round}, block {i}: {e}"));
    }
}

/// A cluster of a, b and c (folder `tag` and loopback ports from `port`, `network` settings beside heartbeats
/// that would take 30 s to call a node dead, so that only a node's shutdown tells the others), with b and c
/// started in processes of their own: its folder, its configuration, and b and c.
fn leaving(tag: &str, port: u16, network: &str) -> (PathBuf, ClusterConfig, Ended, Ended) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{tag}-{}", std::process::id()));
    let config = cluster(&dir, &["a", "b", "c"], port, &format!("{network}heartbeat_ms = 200\ndead_after_ms = 30000"));
    let (b, c) = (start(&config, "b"), start(&config, "c"));
    (dir, ClusterConfig::from_file(&config).expect("configuration"), b, c)
}

/// Node a of `cfg` started here, and a region on b written with round 1.
async fn written_on_b(cfg: &ClusterConfig) -> (Agent, vfabric::Region) {
    let a = Agent::start_from_config(cfg, "a").await.expect("agent a");
    let r = region_on(&a, 1).await;
    write_round(&a, &r, 1).await;
    (a, r)
}

/// Reads every block of `r` through `a`, each as round `round` wrote it.
async fn read_round(a: &Agent, r: &vfabric::Region, round: u8) {
    let mut buf = vec![0u8; BLOCK];
    for i in 0..BLOCKS {
        a.read(r, (i * BLOCK) as u64, &mut buf).await.unwrap_or_else(|e| panic!("block {i}: {e}"));
        assert!(buf == block(i, round), "block {i} is not as round {round} wrote it");
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

#[test]
fn a_home_killed_mid_write_loses_no_acknowledged_byte() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("replicas-kill-{}", std::process::id()));
    // The default heartbeats and `dead_after_ms`: the failover time printed is the one users get.
    let config = cluster(&dir, &["a", "b", "c"], 47500, "");
    let (b, _c) = (start(&config, "b"), start(&config, "c"));
    let cfg = ClusterConfig::from_file(&config).expect("configuration");
    runtime().block_on(async {
        let a = Agent::start_from_config(&cfg, "a").await.expect("agent a");
        let r = region_on(&a, 1).await;
        // Round 1 everywhere, then round 2 block by block; b is killed partway through round 2.
        write_round(&a, &r, 1).await;
        let mut acknowledged = 0;
        let mut longest = Duration::ZERO;
        let mut killed = None;
        for i in 0..BLOCKS {
            if i == BLOCKS / 3 {
                signal(&b, Signal::SIGKILL);
                killed = Some(Instant::now());
            }
            let t = Instant::now();
            match a.write(&r, (i * BLOCK) as u64, &block(i, 2)).await {
                Ok(()) => acknowledged = i + 1,
                Err(e) => panic!("write {i} after the home's death failed instead of failing over: {e}"),
            }
            longest = longest.max(t.elapsed());
        }
        let failover = killed.map(|k| k.elapsed()).unwrap_or_default();
        let net = &cfg.network;
        eprintln!(
            "failover with heartbeat_ms = {} and dead_after_ms = {}: the longest write took {longest:?}; all \
             writes from the kill on took {failover:?}",
            net.heartbeat_ms, net.dead_after_ms
        );
        assert_eq!(acknowledged, BLOCKS);
        // Every acknowledged byte is there, read with the handle from before the failover.
        let mut buf = vec![0u8; BLOCK];
        for i in 0..BLOCKS {
            a.read(&r, (i * BLOCK) as u64, &mut buf).await.expect("a read after the failover");
            assert!(buf == block(i, 2), "block {i} lost its acknowledged write");
        }
        let mut lease_buf = vec![0u8; BLOCK];
        let lease = a
            .acquire(&r, 0..BLOCK as u64, vfabric::Location::Host, vfabric::Mode::Write)
            .await
            .expect("a write lease after the failover");
        lease.local().expect("local pages").read(0, &mut lease_buf).expect("read through the lease");
        assert!(lease_buf == block(0, 2));
        a.release(lease).await.expect("release");
        a.free(&r).await.expect("free the region where it lives now");
        assert!(a.read(&r, 0, &mut buf).await.is_err(), "a freed region still answers");
        a.shutdown().await;
    });
    drop(b);
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn a_frozen_home_that_wakes_after_the_failover_sends_callers_to_the_standby() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("replicas-freeze-{}", std::process::id()));
    // Node order: the two test agents, then the home b, then its standby c (the node after it).
    let config = cluster(&dir, &["a", "a2", "b", "c"], 47600, "heartbeat_ms = 200\ndead_after_ms = 1000");
    let (b, _c) = (start(&config, "b"), start(&config, "c"));
    let cfg = ClusterConfig::from_file(&config).expect("configuration");
    runtime().block_on(async {
        let a = Agent::start_from_config(&cfg, "a").await.expect("agent a");
        let a2 = Agent::start_from_config(&cfg, "a2").await.expect("agent a2");
        let r = region_on(&a, 2).await;
        assert_eq!(r.addr.node().0, 2);
        a.write(&r, 0, &block(0, 1)).await.expect("write round 1");
        signal(&b, Signal::SIGSTOP);
        // Once a takes b for dead, it sends b nothing more (a write sent to the frozen b would land there when it
        // wakes, and tell it of the takeover), fails over to c and writes round 2 there.
        let until = Instant::now() + Duration::from_secs(10);
        while a.is_alive(2).await.expect("node 2") {
            assert!(Instant::now() < until, "a never took the frozen b for dead");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        a.write(&r, 0, &block(0, 2)).await.expect("write round 2 through the failover");
        signal(&b, Signal::SIGCONT);
        // a2 never followed the failover: once it hears b again, it asks b, which must send it to c.
        while !a2.is_alive(2).await.expect("node 2") {
            assert!(Instant::now() < until, "a2 never heard b again");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut buf = vec![0u8; BLOCK];
        loop {
            match a2.read(&r, 0, &mut buf).await {
                Ok(()) => break,
                // b may not have heard c again yet: it then serves nothing rather than risk a stale answer.
                Err(FabricError::Remote { kind: vfabric::proto::message::ErrorKind::Unavailable, .. })
                    if Instant::now() < until =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(e) => panic!("a read of the region after b woke: {e}"),
            }
        }
        assert!(buf == block(0, 2), "the woken home served the region's bytes from before the failover");
        a.shutdown().await;
        a2.shutdown().await;
    });
    drop(b);
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn a_standby_that_restarts_is_replaced_and_the_region_survives_its_home() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("replicas-restart-{}", std::process::id()));
    let config = cluster(&dir, &["a", "b", "c"], 47650, "heartbeat_ms = 200\ndead_after_ms = 1000");
    let (b, c) = (start(&config, "b"), start(&config, "c"));
    let cfg = ClusterConfig::from_file(&config).expect("configuration");
    runtime().block_on(async {
        let a = Agent::start_from_config(&cfg, "a").await.expect("agent a");
        let r = region_on(&a, 1).await;
        write_round(&a, &r, 1).await;
        // The standby's node restarts: its copy is gone.
        signal(&c, Signal::SIGKILL);
        drop(c);
        let _c = start(&config, "c");
        // b refuses writes until it reaches c again, then places a new copy there with the whole region.
        let restarted = Instant::now();
        let until = restarted + Duration::from_secs(20);
        for i in 0..BLOCKS {
            loop {
                match a.write(&r, (i * BLOCK) as u64, &block(i, 2)).await {
                    Ok(()) => break,
                    Err(e) if Instant::now() < until => {
                        assert!(
                            matches!(
                                e,
                                FabricError::Remote { kind: vfabric::proto::message::ErrorKind::Unavailable, .. }
                            ),
                            "a write while the standby restarts: {e}"
                        );
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => panic!("the home never took writes again after its standby restarted: {e}"),
                }
            }
        }
        eprintln!("the home took writes again {:?} after its standby restarted", restarted.elapsed());
        // Now the home dies: the new copy has everything.
        signal(&b, Signal::SIGKILL);
        read_round(&a, &r, 2).await;
        a.shutdown().await;
    });
    drop(b);
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn a_copy_that_took_over_gets_a_standby_and_survives_its_own_death() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("replicas-chain-{}", std::process::id()));
    let config = cluster(&dir, &["a", "b", "c", "d", "e"], 47700, "heartbeat_ms = 200\ndead_after_ms = 1000");
    let (b, c, _d) = (start(&config, "b"), start(&config, "c"), start(&config, "d"));
    let cfg = ClusterConfig::from_file(&config).expect("configuration");
    runtime().block_on(async {
        let a = Agent::start_from_config(&cfg, "a").await.expect("agent a");
        let r = region_on(&a, 1).await;
        write_round(&a, &r, 1).await;
        // b dies: c takes over, and places a standby of its copy on d (the next node that answers).
        signal(&b, Signal::SIGKILL);
        write_round(&a, &r, 2).await;
        write_round(&a, &r, 3).await;
        // c dies too: d takes over from it, with every acknowledged write.
        signal(&c, Signal::SIGKILL);
        let mut buf = vec![0u8; BLOCK];
        for i in 0..BLOCKS {
            a.read(&r, (i * BLOCK) as u64, &mut buf).await.expect("a read after the second failover");
            assert!(buf == block(i, 3), "block {i} lost its acknowledged write");
        }
        // A caller that never followed either failover finds the region by its handle alone.
        let e = Agent::start_from_config(&cfg, "e").await.expect("agent e");
        e.read(&r, 0, &mut buf).await.expect("a read by a caller that knows only the handle");
        assert!(buf == block(0, 3));
        e.shutdown().await;
        a.shutdown().await;
    });
    drop((b, c));
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// A partition on loopback made with nft (dropping UDP between two sets of ports), taken down when dropped, also
/// when the test fails.
struct Partition(String);

impl Partition {
    /// Cuts every packet between the agents on ports `one` and those on `other` (each agent's lanes included).
    fn cut(name: &str, one: &[u16], other: &[u16]) -> Partition {
        let set = |ports: &[u16]| {
            let all: Vec<String> = ports.iter().flat_map(|p| [p.to_string(), (p + 1).to_string()]).collect();
            format!("{{ {} }}", all.join(", "))
        };
        let (a, b) = (set(one), set(other));
        let rules = format!(
            "table inet {name} {{\n chain out {{\n  type filter hook output priority 0; policy accept;\n  \
             udp sport {a} udp dport {b} drop\n  udp sport {b} udp dport {a} drop\n }}\n}}\n"
        );
        let mut nft = Command::new("nft").args(["-f", "-"]).stdin(Stdio::piped()).spawn().expect("run nft");
        use std::io::Write;
        nft.stdin.take().expect("nft's stdin").write_all(rules.as_bytes()).expect("nft rules");
        assert!(nft.wait().expect("nft").success(), "nft refused the partition's rules");
        Partition(name.to_string())
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        let _ = Command::new("nft").args(["delete", "table", "inet", &self.0]).status();
    }
}

#[test]
fn a_home_cut_off_by_a_partition_serves_nothing_stale_and_forwards_once_healed() {
    common::require_tool("nft", "nftables", "`nft` to cut agents on loopback apart");
    common::require_root("a partition made with nft needs CAP_NET_ADMIN", "replicas");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("replicas-partition-{}", std::process::id()));
    // a and d are callers in this process; b is the home, c (the node after it) its standby.
    let config = cluster(&dir, &["a", "d", "b", "c"], 48100, "heartbeat_ms = 200\ndead_after_ms = 1000");
    let (b, _c) = (start(&config, "b"), start(&config, "c"));
    let cfg = ClusterConfig::from_file(&config).expect("configuration");
    runtime().block_on(async {
        let a = Agent::start_from_config(&cfg, "a").await.expect("agent a");
        let d = Agent::start_from_config(&cfg, "d").await.expect("agent d");
        let r = region_on(&a, 2).await;
        a.write(&r, 0, &block(0, 1)).await.expect("round 1");
        // b is cut off from a and from its standby c; d still reaches b.
        let cut = Partition::cut(&format!("vfrep{}", std::process::id()), &[48120], &[48100, 48130]);
        a.write(&r, 0, &block(0, 2)).await.expect("round 2, through the failover to c");
        // d asks b, which cannot reach its standby: it refuses rather than answer with round 1.
        let mut buf = vec![0u8; BLOCK];
        for _ in 0..5 {
            match d.read(&r, 0, &mut buf).await {
                Err(FabricError::Remote { kind: vfabric::proto::message::ErrorKind::Unavailable, .. }) => {}
                Ok(()) => assert!(buf == block(0, 2), "the cut-off home served the bytes from before the failover"),
                Err(e) => panic!("a read through the cut-off home: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Healed: b learns that c took over and sends d there.
        drop(cut);
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            match d.read(&r, 0, &mut buf).await {
                Ok(()) => {
                    break assert!(buf == block(0, 2), "after the heal, d read the bytes from before the failover")
                }
                Err(e) => assert!(Instant::now() < until, "d never read the region after the heal: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        a.shutdown().await;
        d.shutdown().await;
    });
    drop(b);
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn a_home_that_shuts_down_hands_its_regions_over_at_once() {
    // Heartbeats would take 30 s to call b dead: only its shutdown can tell the others.
    let (dir, cfg, mut b, _c) = leaving("replicas-leave", 48200, "");
    runtime().block_on(async {
        let (a, r) = written_on_b(&cfg).await;
        // b stops: it hands the region to c and says so as it closes its connections.
        signal(&b, Signal::SIGTERM);
        assert!(b.0.wait().expect("b exits").success(), "b's agent stops cleanly");
        let mut buf = vec![0u8; BLOCK];
        for i in 0..BLOCKS {
            a.read(&r, (i * BLOCK) as u64, &mut buf).await.expect("a read once b is gone");
            assert!(buf == block(i, 1), "block {i} is not as written");
            a.write(&r, (i * BLOCK) as u64, &block(i, 2)).await.expect("a write once b is gone");
        }
        a.read(&r, 0, &mut buf).await.expect("a read at c");
        assert!(buf == block(0, 2));
        a.shutdown().await;
    });
    drop(b);
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn a_node_that_leaves_hands_its_regions_over_without_replicas() {
    // Regions kept on their home only.
    let (dir, cfg, mut b, _c) = leaving("replicas-drain", 48300, "replicas = 1\n");
    runtime().block_on(async {
        let (a, r) = written_on_b(&cfg).await;
        // A region of b's freed before b stops: only what lives is handed over.
        let gone = region_on(&a, 1).await;
        a.free(&gone).await.expect("free a region on b");
        // Under load: a writer goes on through the region while b drains and stops, each write retried until
        // acknowledged, and remembers the round each block last had acknowledged.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (a, stop) = (a.clone(), stop.clone());
            tokio::spawn(async move {
                let mut acked = vec![1u8; BLOCKS];
                let (mut round, mut retries) = (2u8, 0);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for (i, last) in acked.iter_mut().enumerate() {
                        while let Err(e) = a.write(&r, (i * BLOCK) as u64, &block(i, round)).await {
                            retries += 1;
                            assert!(retries < 200, "block {i}, round {round}: {e}");
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        *last = round;
                    }
                    round = round.wrapping_add(1).max(2);
                }
                (acked, retries)
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        // b stops (network.drain, the default): it copies the region to c and c takes it over.
        let t = Instant::now();
        signal(&b, Signal::SIGTERM);
        let exited = tokio::task::spawn_blocking(move || b.0.wait().map(|s| (s, b))).await.expect("join");
        let (status, b) = exited.expect("b exits");
        assert!(status.success(), "b's agent stops cleanly");
        eprintln!("b drained {} KiB under writes and stopped in {:?}", BLOCK * BLOCKS / 1024, t.elapsed());
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (acked, retries) = writer.await.expect("the writer");
        let rounds = acked.iter().max().copied().unwrap_or(1) - 1;
        eprintln!(
            "the writer wrote {rounds} round(s) of {BLOCKS} blocks, retrying {retries} write(s), across the handover"
        );
        assert!(rounds >= 2, "the writer did not go on through the handover");
        let mut buf = vec![0u8; BLOCK];
        for (i, &round) in acked.iter().enumerate() {
            a.read(&r, (i * BLOCK) as u64, &mut buf).await.expect("a read of the drained region");
            assert!(buf == block(i, round), "block {i} lost its acknowledged write of round {round}");
        }
        // The freed region stays freed: b is gone and nobody took it over.
        assert!(a.read(&gone, 0, &mut buf).await.is_err(), "a freed region came back");
        a.shutdown().await;
        drop(b);
    });
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn an_asynchronous_region_acknowledges_writes_before_its_standby_has_them_and_catches_up() {
    // a is the home, in this process; b keeps the standby (a process); c reads once a has gone.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("replicas-async-{}", std::process::id()));
    let config = cluster(&dir, &["a", "b", "c"], 48400, "heartbeat_ms = 200\ndead_after_ms = 30000");
    let b = start(&config, "b");
    let cfg = ClusterConfig::from_file(&config).expect("configuration");
    runtime().block_on(async {
        let a = Agent::start_from_config(&cfg, "a").await.expect("agent a");
        let c = Agent::start_from_config(&cfg, "c").await.expect("agent c");
        // The standby may be a minute behind: the background flush comes 15 s after a write.
        let keep = vfabric::agent::Replication::lagging(2, Duration::from_secs(60));
        let mut placed = None;
        for _ in 0..100 {
            match a.alloc_replicated(0, (BLOCK * BLOCKS) as u64, None, keep).await {
                Ok(r) => {
                    placed = Some(r);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let r = placed.expect("an asynchronous replicated region on a");
        write_round(&a, &r, 1).await;
        assert!(a.replication_lag().await > Duration::ZERO, "the writes were acknowledged before b had them");
        // With b frozen, writes still return: they do not wait for the standby.
        signal(&b, Signal::SIGSTOP);
        write_round(&a, &r, 2).await;
        signal(&b, Signal::SIGCONT);
        a.flush_replicas().await.expect("the pending writes reach b");
        assert_eq!(a.replication_lag().await, Duration::ZERO, "b has every acknowledged write");
        // a stops: b takes the region over, and c (which a's close tells) reads every acknowledged write there.
        c.read(&r, 0, &mut [0u8; 16]).await.expect("c reads the region at a");
        a.shutdown().await;
        read_round(&c, &r, 2).await;
        c.shutdown().await;
    });
    drop(b);
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
