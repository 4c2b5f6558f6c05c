//! A peer that stops answering without closing anything (a crash, a frozen process): calls in flight to it fail
//! with `PeerDead` once the heartbeats declare it dead, instead of waiting for QUIC's idle timeout. The peer is
//! an agent in a process of its own, frozen with SIGSTOP (and ended by this test, by its PID).

mod common;
use common::Ended;

use std::process::{Command, Stdio};
use std::time::Duration;

use vfabric::agent::Agent;
use vfabric::{ClusterConfig, FabricError};

#[test]
fn a_call_to_a_frozen_peer_fails_as_peer_dead() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("peer-death-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch folder");
    let config = dir.join("two.toml");
    // Heartbeats every 200 ms, dead after 1 s: well inside QUIC's idle timeout (10 s).
    let text = format!(
        "[cluster]\nname = \"death\"\n[device]\nbackend = \"emulated\"\n[memory]\npage_size = \"64KiB\"\n\
         gpu_budget = \"8MiB\"\nhost_arena = \"16MiB\"\n[network]\ncerts = \"{}\"\nheartbeat_ms = 200\n\
         dead_after_ms = 1000\n[[node]]\nname = \"a\"\naddress = \"127.0.0.1:47400\"\n\
         [[node]]\nname = \"b\"\naddress = \"127.0.0.1:47410\"\n",
        dir.join("certs").display()
    );
    std::fs::write(&config, text).expect("write the configuration");
    let bin = env!("CARGO_BIN_EXE_vfabric");
    let init = Command::new(bin).args(["cluster", "init", "--config"]).arg(&config).output().expect("init");
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
    let b = Command::new(bin)
        .args(["agent", "--node", "b", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start agent b");
    let b = Ended(b);
    let cfg = ClusterConfig::from_file(&config).expect("configuration");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let a = Agent::start_from_config(&cfg, "a").await.expect("agent a");
        // b answers once it is up.
        let mut region = None;
        for _ in 0..50 {
            match a.alloc(1, 1 << 20, None).await {
                Ok(r) => {
                    region = Some(r);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let r = region.expect("a region on b");
        a.write(&r, 0, &[7u8; 4096]).await.expect("write to b");
        // b freezes: it holds its connections open and answers nothing.
        let pid = nix::unistd::Pid::from_raw(b.0.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP b");
        let mut buf = vec![0u8; 4096];
        match a.read(&r, 0, &mut buf).await {
            Err(FabricError::PeerDead { node: 1, why, .. }) => assert!(why.contains("heartbeat"), "{why}"),
            other => panic!("a read from a frozen peer: {other:?}"),
        }
        a.shutdown().await;
    });
    drop(b);
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
