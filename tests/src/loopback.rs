//! Clusters of agents in one process, joined by QUIC over loopback, for the tests that drive several nodes.

use vfabric::agent::Agent;
use vfabric::config::NodeSection;
use vfabric::{ByteSize, ClusterConfig};
use vfabric_transport::quic::ClusterCa;
use vfabric_transport::Backend;

/// A cluster `loop` of `nodes` nodes `n0`, `n1`, ... on the emulated device: 32 MiB of GPU and 64 MiB of host
/// memory each, heartbeats every 100 ms, two bulk lanes and the latency lane.
pub fn config(nodes: usize) -> ClusterConfig {
    let mut c = ClusterConfig::embedded_local();
    c.cluster.name = "loop".into();
    c.device.backend = Backend::Emulated;
    c.memory.gpu_budget = Some(ByteSize(32 << 20));
    c.memory.host_arena = ByteSize(64 << 20);
    c.network.heartbeat_ms = 100;
    c.network.dead_after_ms = 3000;
    c.network.chunk = ByteSize(256 << 10);
    // Two connections per pair of nodes for bulk transfers, and the latency lane (lane 0) for the others.
    c.network.lanes = 2;
    c.nodes =
        (0..nodes).map(|i| NodeSection { name: format!("n{i}"), gpus: None, address: None, tenant: None }).collect();
    c
}

/// Starts every node of `cfg` on 127.0.0.1 (certificates from `ca`, naming the tenant a node belongs to) and
/// tells each where the others are.
pub async fn cluster(cfg: &ClusterConfig, ca: &ClusterCa) -> Vec<Agent> {
    let mut agents = Vec::new();
    for n in &cfg.nodes {
        let id = ca.issue_for(&n.name, n.tenant).expect("certificate");
        let a = Agent::start(cfg, &n.name, &id, Some("127.0.0.1:0".parse().expect("addr"))).await.expect("agent");
        agents.push(a);
    }
    for a in &agents {
        for b in &agents {
            if a.node() != b.node() {
                a.set_peer_addr(b.node(), b.local_addr()).await.expect("peer");
            }
        }
    }
    agents
}
