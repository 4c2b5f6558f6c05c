//! The agent a job's local rank 0 runs in its own process for the ranks of its host, when none serves it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use vfabric_transport::quic::ClusterCa;

use crate::agent::shared::Agent;
use crate::config::{ClusterConfig, NodeSection};
use crate::error::{FabricError, NetworkError};

/// An agent run inside a rank's process for the ranks of its host: started by [`AttachedClient::join`] in local
/// rank 0 when no agent served the host; it stops when that process's client goes.
pub(super) struct HostAgent {
    agent: Agent,
    socket: PathBuf,
    runtime: Option<tokio::runtime::Runtime>,
}

impl HostAgent {
    /// A one-node cluster of this host (every GPU the configuration gives it, a certificate authority of its
    /// own: nobody else dials it) serving local clients at `socket`.
    pub(super) fn start(config: &ClusterConfig, socket: &Path) -> Result<HostAgent, FabricError> {
        let mut cfg = config.clone();
        let gpus = cfg.nodes.first().and_then(|n| n.gpus.clone());
        cfg.nodes = vec![NodeSection { name: "host".into(), gpus, address: None, tenant: None }];
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("vfabric-host-agent")
            .enable_all()
            .build()
            .map_err(NetworkError::Io)?;
        let certificate = |e| NetworkError::Certificate { node: "host (this job's own)".into(), source: e };
        let identity = ClusterCa::generate(&cfg.cluster.name).and_then(|ca| ca.issue("host")).map_err(certificate)?;
        let loopback = "127.0.0.1:0".parse().ok();
        let agent = runtime.block_on(async {
            let agent = Agent::start(&cfg, "host", &identity, loopback).await?;
            agent.serve_local(socket).await?;
            Ok::<_, FabricError>(agent)
        })?;
        tracing::info!(socket = %socket.display(), device = %agent.fabric().describe(), "started the host's agent");
        Ok(HostAgent { agent, socket: socket.to_path_buf(), runtime: Some(runtime) })
    }
}

impl Drop for HostAgent {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.block_on(self.agent.shutdown());
            rt.shutdown_timeout(Duration::from_secs(5));
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}
