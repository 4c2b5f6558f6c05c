//! Three agents in three network namespaces (`scripts/netns-agents.sh`): remote calls and `vfabric status`
//! between them, a partition made with nft, 5% packet loss, and an agent stopped by SIGTERM. Needs root,
//! iproute2 and nftables (`.ci/run` installs them).

mod common;

use std::process::Command;

#[test]
fn agents_in_network_namespaces_survive_partitions_loss_and_a_stopped_peer() {
    let what = "scripts/netns-agents.sh puts three agents in network namespaces";
    common::require_tool("ip", "iproute2", &format!("`ip` to make network namespaces ({what})"));
    common::require_tool("nft", "nftables", &format!("`nft` for partitions and packet loss ({what})"));
    common::require_root(&format!("{what}, which needs CAP_SYS_ADMIN"), "netns");
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let out = Command::new("bash")
        .arg(format!("{root}/scripts/netns-agents.sh"))
        .arg(env!("CARGO_BIN_EXE_vfabric"))
        .env("VFABRIC_LOG", "error")
        .output()
        .expect("run scripts/netns-agents.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("PASS netns agents"), "{stdout}");
    assert!(!stdout.contains("FAIL "), "{stdout}");
}
