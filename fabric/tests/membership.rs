//! Membership kept in etcd: nodes join a running cluster and leave it without the others restarting (a node that
//! stops hands its regions over first), and a node that stops (its lease revoked) or is killed (its lease
//! expired) is gone for the others at once, not after
//! `network.dead_after_ms` of silence (set to 30 s here, so that only etcd can tell). A real etcd, and agents in
//! processes of their own, all ended by this test by their PIDs.

mod common;
use common::{require_tool, Ended};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use vfabric::agent::Agent;
use vfabric::{ClusterConfig, FabricError};

/// An etcd's client URL on loopback port `port` (its peers' port is the one 10 above).
fn etcd_url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

fn start(config: &Path, node: &str) -> Ended {
    start_with(config, node, &[])
}

/// [`start`] with more arguments for `vfabric agent`; the log of each start goes on after the last one's.
fn start_with(config: &Path, node: &str, more: &[&str]) -> Ended {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(config.with_file_name(format!("{node}.log")));
    let child = Command::new(env!("CARGO_BIN_EXE_vfabric"))
        .args(["agent", "--node", node, "--config"])
        .arg(config)
        .args(more)
        .stdout(Stdio::null())
        .stderr(log.expect("agent log"))
        .spawn()
        .expect("start an agent");
    Ended(child)
}

/// Waits (up to 20 s) until `a`'s read of `region` fails as `PeerDead` because its node is no member.
async fn gone(a: &Agent, region: &vfabric::Region, what: &str) -> Duration {
    let t = Instant::now();
    let mut buf = [0u8; 16];
    loop {
        match a.read(region, 0, &mut buf).await {
            Err(FabricError::PeerDead { why, .. }) if why.contains("not a member") => return t.elapsed(),
            other => assert!(t.elapsed() < Duration::from_secs(20), "{what}: still {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (up to 20 s) until `a` takes node `node` for a member.
async fn joined(a: &Agent, node: u16) {
    let t = Instant::now();
    while !a.is_alive(node).await.expect("a node of the cluster") {
        assert!(t.elapsed() < Duration::from_secs(20), "node {node} never joined");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A real etcd serving on loopback port `port` ([`etcd_url`]), its data and log in `dir`.
fn etcd(dir: &Path, port: u16) -> Ended {
    let (client, peer) = (etcd_url(port), etcd_url(port + 10));
    let etcd = require_tool("etcd", "etcd-server", "a real etcd for the cluster's membership");
    let log = std::fs::File::create(dir.join("etcd.log")).expect("etcd log");
    Ended(
        Command::new(etcd)
            .args(["--name", "t", "--data-dir"])
            .arg(dir.join("etcd"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("t={peer}")])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd"),
    )
}

/// A cluster of `names` on loopback ports from `port`, its membership in the etcd on `etcd` and
/// `dead_after_ms` 30 s (so that only etcd can tell a node is gone), with `network` more settings; the scratch
/// folder made afresh, and the configuration's path.
fn cluster(dir: &Path, names: &[&str], port: u16, etcd: u16, network: &str) -> PathBuf {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("scratch folder");
    let name = dir.file_name().and_then(|n| n.to_str()).expect("folder name");
    let mut text = format!(
        "[cluster]\nname = \"{name}\"\n[device]\nbackend = \"emulated\"\n[memory]\npage_size = \"64KiB\"\n\
         gpu_budget = \"8MiB\"\nhost_arena = \"16MiB\"\n[network]\ncerts = \"{}\"\nheartbeat_ms = 200\n\
         dead_after_ms = 30000\n{network}\n[membership]\netcd = [\"{}\"]\nlease_ttl_s = 2\n",
        dir.join("certs").display(),
        etcd_url(etcd)
    );
    for (i, n) in names.iter().enumerate() {
        text += &format!("[[node]]\nname = \"{n}\"\naddress = \"127.0.0.1:{}\"\n", port + 10 * i as u16);
    }
    let config = dir.join("cluster.toml");
    std::fs::write(&config, text).expect("write the configuration");
    let init = Command::new(env!("CARGO_BIN_EXE_vfabric")).args(["cluster", "init", "--config"]).arg(&config).output();
    assert!(init.expect("cluster init").status.success());
    config
}

/// Node `name` of `cfg` started in this process, once etcd serves (a start that cannot reach it fails).
async fn start_here(cfg: &ClusterConfig, name: &str) -> Agent {
    let t = Instant::now();
    loop {
        match Agent::start_from_config(cfg, name).await {
            Ok(a) => return a,
            Err(e) => assert!(t.elapsed() < Duration::from_secs(20), "agent {name} never reached etcd: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

#[test]
fn nodes_join_and_leave_a_running_cluster_through_etcd() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("members-{}", std::process::id()));
    let config = cluster(&dir, &["a", "b", "c"], 47800, 23790, "");
    let _etcd = etcd(&dir, 23790);
    let cfg = ClusterConfig::from_file(&config).expect("configuration");
    runtime().block_on(async {
        let a = start_here(&cfg, "a").await;
        // Nodes that never started are no members: calls to them fail at once.
        assert!(!a.is_alive(1).await.expect("node b"), "b is no member before it starts");
        // b joins the running cluster, then c.
        let b = start(&config, "b");
        joined(&a, 1).await;
        let rb = a.alloc(1, 1 << 20, None).await.expect("a region on b");
        a.write(&rb, 0, &[1u8; 4096]).await.expect("write on b");
        let c = start(&config, "c");
        joined(&a, 2).await;
        let rc = a.alloc(2, 1 << 20, None).await.expect("a region on c, which joined after a started");
        a.write(&rc, 0, &[2u8; 4096]).await.expect("write on c");
        // b stops: it hands its region to c (`network.drain`) and leaves at once. c is killed: it is gone when its
        // lease expires. Neither waits for the 30 s of `dead_after_ms`.
        kill(Pid::from_raw(b.0.id() as i32), Signal::SIGTERM).expect("SIGTERM b");
        let t = Instant::now();
        while a.is_alive(1).await.expect("node b") {
            assert!(t.elapsed() < Duration::from_secs(20), "b never left");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let left = t.elapsed();
        let mut buf = [0u8; 4096];
        a.read(&rb, 0, &mut buf).await.expect("b's region, handed to c as b left");
        assert_eq!(buf, [1u8; 4096], "b's region as written");
        kill(Pid::from_raw(c.0.id() as i32), Signal::SIGKILL).expect("SIGKILL c");
        let died = gone(&a, &rc, "c killed").await;
        eprintln!("a saw b leave {left:?} after its SIGTERM, and c go {died:?} after its SIGKILL (lease_ttl_s = 2)");
        a.shutdown().await;
        drop((b, c));
    });
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// `BLOCKS` blocks of 64 KiB, `round` in each.
const BLOCK: usize = 64 << 10;
const BLOCKS: usize = 64;

fn block(i: usize, round: u8) -> Vec<u8> {
    (0..BLOCK).map(|j| (i as u8).wrapping_mul(31) ^ (j as u8) ^ round).collect()
}

#[test]
fn a_standby_that_etcd_counts_out_is_replaced_and_the_region_survives_its_home() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("members-standby-{}", std::process::id()));
    let config = cluster(&dir, &["a", "b", "c", "d"], 47850, 23791, "replicas = 2");
    let _etcd = etcd(&dir, 23791);
    let cfg = ClusterConfig::from_file(&config).expect("configuration");
    runtime().block_on(async {
        let a = start_here(&cfg, "a").await;
        let (b, c, _d) = (start(&config, "b"), start(&config, "c"), start(&config, "d"));
        for node in 1..4 {
            joined(&a, node).await;
        }
        // A region on b, its standby on c (the next node).
        let r = a.alloc(1, (BLOCK * BLOCKS) as u64, None).await.expect("a replicated region on b");
        for i in 0..BLOCKS {
            a.write(&r, (i * BLOCK) as u64, &block(i, 1)).await.expect("round 1");
        }
        // c dies for good. Once etcd counts it out, b places a new standby on d and takes writes again.
        kill(Pid::from_raw(c.0.id() as i32), Signal::SIGKILL).expect("SIGKILL c");
        let t = Instant::now();
        write_round(&a, &r, 2, "b never took writes again").await;
        eprintln!("b took writes again {:?} after its standby was killed (lease_ttl_s = 2)", t.elapsed());
        // b dies too: d has every acknowledged write, and etcd's word lets it take over (heartbeats would wait 30 s).
        kill(Pid::from_raw(b.0.id() as i32), Signal::SIGKILL).expect("SIGKILL b");
        let t = Instant::now();
        read_round(&a, &r, 2, "no failover to d").await;
        eprintln!("d served the region {:?} after b was killed", t.elapsed());
        a.shutdown().await;
        drop((b, c));
    });
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// Writes round `round` into every block of `r` through `a`, each write retried (for up to 20 s, `what` in
/// the failure) until it is acknowledged.
async fn write_round(a: &Agent, r: &vfabric::Region, round: u8, what: &str) {
    let t = Instant::now();
    for i in 0..BLOCKS {
        while let Err(e) = a.write(r, (i * BLOCK) as u64, &block(i, round)).await {
            assert!(t.elapsed() < Duration::from_secs(20), "{what}: block {i} of round {round}: {e}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Reads every block of `r` through `a`, each retried (for up to 20 s) until it is served, and checks it holds
/// round `round`; how long the first read took to be served.
async fn read_round(a: &Agent, r: &vfabric::Region, round: u8, what: &str) -> Duration {
    let t = Instant::now();
    let mut served = None;
    let mut buf = vec![0u8; BLOCK];
    for i in 0..BLOCKS {
        while let Err(e) = a.read(r, (i * BLOCK) as u64, &mut buf).await {
            assert!(t.elapsed() < Duration::from_secs(20), "{what}: block {i}: {e}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        served.get_or_insert(t.elapsed());
        assert!(buf == block(i, round), "{what}: block {i} does not hold round {round}, an acknowledged write");
    }
    served.unwrap_or_default()
}

/// A region of `BLOCKS` blocks on b (node 1), kept on the cluster's `network.replicas` nodes, once b counts the
/// nodes of its standbys members too (up to 20 s).
async fn replicated_on_b(a: &Agent) -> vfabric::Region {
    let t = Instant::now();
    loop {
        match a.alloc(1, (BLOCK * BLOCKS) as u64, None).await {
            Ok(r) => return r,
            Err(e) => assert!(t.elapsed() < Duration::from_secs(20), "no replicated region on b: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A replicated region on b whose standby c keeps. b places a standby on the next node it sees alive, which is a
/// until b has seen c join (a saw c first, and the test waits only for a): a region whose standby went to a is
/// freed and asked for again.
async fn replicated_on_b_kept_on_c(a: &Agent) -> vfabric::Region {
    let t = Instant::now();
    loop {
        let r = replicated_on_b(a).await;
        if kept_on(a, 2).await == 1 {
            return r;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "b never placed its standby on c");
        a.free(&r).await.expect("free a region whose standby is not on c");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How many replicated regions node `node` is the home of, and how many standby copies it keeps, as it says
/// through `a` (`vfabric status --node`).
async fn replication_on(a: &Agent, node: u16) -> (u64, u64) {
    let json = a.status_json(Some(node)).await.unwrap_or_else(|e| panic!("node {node}'s status: {e}"));
    let status: serde_json::Value = serde_json::from_str(&json).expect("status JSON");
    let count = |what: &str| status["replication"][what].as_u64().unwrap_or_else(|| panic!("no {what} in {json}"));
    (count("homed"), count("kept"))
}

/// How many standby copies node `node` keeps ([`replication_on`]).
async fn kept_on(a: &Agent, node: u16) -> u64 {
    replication_on(a, node).await.1
}

#[test]
fn a_region_kept_on_three_nodes_survives_its_home_and_then_the_copy_that_took_over() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("members-three-{}", std::process::id()));
    let config = cluster(&dir, &["a", "b", "c", "d"], 48500, 23793, "replicas = 3");
    let _etcd = etcd(&dir, 23793);
    let cfg = ClusterConfig::from_file(&config).expect("configuration");
    runtime().block_on(async {
        let a = start_here(&cfg, "a").await;
        let (b, c, d) = (start(&config, "b"), start(&config, "c"), start(&config, "d"));
        for node in 1..4 {
            joined(&a, node).await;
        }
        // A region on b, its standbys on c and d (the next nodes), once b counts them members too.
        let r = replicated_on_b(&a).await;
        write_round(&a, &r, 1, "b").await;
        // b dies: one of its standbys takes over (the first to claim it in etcd), with every acknowledged write.
        kill(Pid::from_raw(b.0.id() as i32), Signal::SIGKILL).expect("SIGKILL b");
        let first = read_round(&a, &r, 1, "after b died").await;
        // The copy that took over keeps the region on three nodes again (its standbys: the other copy, given the
        // whole region again, and one on a), and takes writes once they have it.
        write_round(&a, &r, 2, "the copy that took over").await;
        let home = if replication_on(&a, 2).await.0 == 1 { 2 } else { 3 };
        let other = 5 - home;
        assert_eq!(replication_on(&a, home).await.0, 1, "c or d took over from b");
        assert_eq!(kept_on(&a, other).await, 1, "the other copy is the new home's standby: no second copy");
        assert_eq!(a.replication(), (0, 1), "a keeps one standby copy for the copy that took over");
        // That copy's node dies too: a copy left takes over, with round 2 whole, under the same handle.
        let home_agent = if home == 2 { &c } else { &d };
        kill(Pid::from_raw(home_agent.0.id() as i32), Signal::SIGKILL).expect("SIGKILL the new home");
        let second = read_round(&a, &r, 2, "after the new home died too").await;
        write_round(&a, &r, 3, "the second copy that took over").await;
        read_round(&a, &r, 3, "round 3").await;
        // a or the other node is the home now, the other its standby (b and the first new home are gone).
        let here = a.replication();
        let (here, there) = ((here.0 as u64, here.1 as u64), replication_on(&a, other).await);
        assert_eq!(here.0 + there.0, 1, "one home: a {here:?}, node {other} {there:?}");
        assert_eq!(
            (here.1, there.1),
            (1, 1),
            "each keeps one copy (the home's own counts): a {here:?}, node {other} {there:?}"
        );
        // The handle frees it all: the copy that took over and its standby.
        a.free(&r).await.expect("free the region by its first handle");
        assert_eq!(replication_on(&a, other).await, (0, 0), "node {other} keeps nothing of the region");
        assert_eq!(a.replication(), (0, 0), "nor does a");
        eprintln!(
            "the region was served {first:?} after b's SIGKILL and {second:?} after its new home's (lease_ttl_s = 2)"
        );
        a.shutdown().await;
        drop((b, c, d));
    });
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn a_standby_that_loses_the_takeover_in_etcd_sends_callers_to_the_copy_that_claimed_it_first() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("members-claim-{}", std::process::id()));
    let config = cluster(&dir, &["a", "b", "c"], 48550, 23794, "replicas = 2");
    let _etcd = etcd(&dir, 23794);
    let cfg = ClusterConfig::from_file(&config).expect("configuration");
    runtime().block_on(async {
        let a = start_here(&cfg, "a").await;
        let (b, c) = (start(&config, "b"), start(&config, "c"));
        for node in 1..3 {
            joined(&a, node).await;
        }
        // A region on b (its standby on c), and another copy that claimed b's region first in etcd: a region
        // on a with other bytes (what a copy that won the takeover elsewhere would be).
        let r = replicated_on_b_kept_on_c(&a).await;
        write_round(&a, &r, 1, "b").await;
        assert_eq!(kept_on(&a, 2).await, 1, "c keeps b's standby copy");
        let first = a.alloc_replicated(0, (BLOCK * BLOCKS) as u64, None, 1).await.expect("a region on a");
        write_round(&a, &first, 9, "a").await;
        let key = vfabric::agent::takeover_key(&cfg.cluster.name, &r);
        let mut etcd_client = etcd_client::Client::connect([etcd_url(23794)], None).await.expect("etcd client");
        etcd_client.put(key, vfabric::agent::region_text(&first), None).await.expect("the first claim");
        // b dies. c finds the takeover claimed: it sends callers to the first copy, and keeps its own (the first
        // may make it its standby), without taking over.
        kill(Pid::from_raw(b.0.id() as i32), Signal::SIGKILL).expect("SIGKILL b");
        read_round(&a, &r, 9, "b's handle after b died").await;
        assert_eq!(replication_on(&a, 2).await, (0, 1), "c took nothing over and keeps its copy");
        a.shutdown().await;
        drop((b, c));
    });
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn a_node_the_configuration_does_not_list_joins_takes_an_id_and_keeps_it() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("members-unlisted-{}", std::process::id()));
    let config = cluster(&dir, &["a", "b"], 47900, 23792, "");
    let _etcd = etcd(&dir, 23792);
    let cfg = ClusterConfig::from_file(&config).expect("configuration");
    // x is in no [[node]]: the cluster's CA makes its certificate, and it says where it listens.
    let add = |name: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_vfabric"))
            .args(["cluster", "add-node", "--name", name, "--config"])
            .arg(&config)
            .output()
            .expect("vfabric cluster add-node");
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    assert!(add("x").0, "a certificate for x");
    let (listed, why) = add("a");
    assert!(!listed && why.contains("listed"), "a listed node's certificate comes from cluster init: {why}");
    runtime().block_on(async {
        let a = start_here(&cfg, "a").await;
        let x = start_with(&config, "x", &["--listen", "127.0.0.1:47950"]);
        // The first id after the listed nodes': 2.
        joined(&a, 2).await;
        let r = a.alloc(2, 1 << 20, None).await.expect("a region on x");
        a.write(&r, 0, &[7u8; 4096]).await.expect("write on x");
        // x stops: it hands its region over (to a, the only other node up) and leaves.
        kill(Pid::from_raw(x.0.id() as i32), Signal::SIGTERM).expect("SIGTERM x");
        let t = Instant::now();
        while a.is_alive(2).await.expect("node x") {
            assert!(t.elapsed() < Duration::from_secs(20), "x never left");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut buf = [0u8; 4096];
        a.read(&r, 0, &mut buf).await.expect("x's region, handed over as x left");
        assert_eq!(buf, [7u8; 4096]);
        // x comes back (once its process is gone, and its port with it): etcd kept its id.
        let exited = tokio::task::spawn_blocking(move || {
            let mut x = x;
            x.0.wait().map(|s| (s, x))
        });
        let (status, _gone) = exited.await.expect("join").expect("x exits");
        assert!(status.success(), "x stops cleanly");
        let x = start_with(&config, "x", &["--listen", "127.0.0.1:47950"]);
        joined(&a, 2).await;
        let again = a.alloc(2, 1 << 20, None).await.expect("a region on x again");
        assert_eq!(again.addr.node().0, 2, "x has the id it had");
        a.shutdown().await;
        drop(x);
    });
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
