//! A job's ranks on their host's agent: [`AttachedClient::join`] finds the agent that serves the host (its
//! socket), or, in a job whose ranks all run on this host, starts one in local rank 0's process
//! (`host_agent`) when none runs; the other ranks wait for it. A rank's default GPU is its local rank's.
//!
//! A job over several hosts uses the agents that `vfabric agent` runs on each host (a cluster configuration
//! names them): its ranks attach to their host's, and reach the other hosts' regions through it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vfabric_allocator::Location;

use super::attached::AttachedClient;
use super::host_agent::HostAgent;
use super::host_process::{answers, job_config, HostAgentHandle, HostAgentLaunch, HostAgentProcess};
use crate::agent::launch::JobRank;
use crate::config::ClusterConfig;
use crate::error::{FabricError, LaunchError};

/// How a rank finds its host's agent.
#[derive(Debug, Clone)]
pub struct JoinOptions {
    /// The agent's socket; default `$VFABRIC_SOCKET`, else [`job_socket`].
    pub socket: Option<PathBuf>,
    /// The configuration of an agent this rank starts; default `$VFABRIC_CONFIG`, else the embedded one.
    pub config: Option<ClusterConfig>,
    /// How long a rank waits for local rank 0's agent; default `$VFABRIC_AGENT_TIMEOUT` seconds, else 60.
    pub wait: Duration,
    /// How local rank 0 runs the agent it starts: in its own process by default.
    pub launch: HostAgentLaunch,
}

impl Default for JoinOptions {
    fn default() -> Self {
        let wait = std::env::var("VFABRIC_AGENT_TIMEOUT").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
        JoinOptions { socket: None, config: None, wait: Duration::from_secs(wait), launch: HostAgentLaunch::InProcess }
    }
}

/// The socket of the agent a job's local rank 0 starts: `<temp dir>/vfabric-job-<uid>.sock`, one per user and
/// host (the agent serves only its own user's processes).
pub fn job_socket() -> PathBuf {
    std::env::temp_dir().join(format!("vfabric-job-{}.sock", nix::unistd::geteuid().as_raw()))
}

impl AttachedClient {
    /// Attaches this process to its host's agent as a rank of `job` (read from the launcher's variables with
    /// [`JobRank::from_env`]; `None` for a process outside a job). The agent is the one at the socket the
    /// options name; when none answers there, local rank 0 of a job on one host starts it in this process and
    /// the other ranks wait for it (up to `options.wait`).
    pub fn join(job: Option<JobRank>, options: &JoinOptions) -> Result<AttachedClient, FabricError> {
        let named = options.socket.clone().or_else(|| std::env::var_os("VFABRIC_SOCKET").map(PathBuf::from));
        let socket = named.unwrap_or_else(job_socket);
        let mut host = None;
        if !answers(&socket) {
            match job {
                Some(j) if j.local_rank == 0 && j.single_host() => {
                    host = Some(Arc::new(match &options.launch {
                        HostAgentLaunch::InProcess => HostAgentHandle::InProcess(HostAgent::start(
                            &job_config(options.config.as_ref())?,
                            &socket,
                        )?),
                        HostAgentLaunch::Process { program, args } => {
                            if options.config.is_some() {
                                return Err(LaunchError::AgentProcess {
                                    command: program.display().to_string(),
                                    why: "an agent process takes its configuration from VFABRIC_CONFIG, not from \
                                          JoinOptions::config"
                                        .into(),
                                }
                                .into());
                            }
                            HostAgentHandle::Process(HostAgentProcess::start(program, args, &socket, options.wait)?)
                        }
                    }));
                }
                Some(j) if j.single_host() => wait_for(&socket, options.wait)?,
                _ => return Err(LaunchError::NoAgent { socket }.into()),
            }
        }
        let mut client = AttachedClient::attach(&socket)?;
        let gpus = client.devices().iter().filter(|d| matches!(d, Location::Gpu(_))).count() as u16;
        client.default_device = job.and_then(|j| j.gpu(gpus)).map(Location::Gpu);
        client.host = host;
        Ok(client)
    }
}

/// Waits until an agent answers at `socket`.
fn wait_for(socket: &Path, wait: Duration) -> Result<(), FabricError> {
    let start = Instant::now();
    while !answers(socket) {
        if start.elapsed() > wait {
            return Err(LaunchError::Timeout(format!(
                "no agent at {} after {wait:?}: local rank 0 starts it (is it running? VFABRIC_AGENT_TIMEOUT \
                 waits longer)",
                socket.display()
            ))
            .into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}
