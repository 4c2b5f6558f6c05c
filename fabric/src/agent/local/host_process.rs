//! The host's agent as a process of its own: local rank 0 of a job on one host starts it (with the command
//! [`HostAgentLaunch::Process`] names) instead of running it in its own threads. The agent then has a CUDA
//! context of its own: the rank's device-wide waits (`torch.cuda.synchronize()`, a context synchronisation) never
//! wait for the copies it runs for the other ranks, nor its copies for the rank's kernels.
//!
//! The child serves with [`serve_host_agent`] until rank 0 lets it go (a byte on its standard input, or the
//! pipe's end), or rank 0 is gone (the child's parent changes: a process rank 0 forked may still hold the pipe),
//! so the agent never outlives its job.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use super::host_agent::HostAgent;
use crate::config::ClusterConfig;
use crate::error::{FabricError, LaunchError};

/// The variable a host agent process takes its socket from.
pub const HOST_AGENT_SOCKET: &str = "VFABRIC_HOST_AGENT_SOCKET";

/// How local rank 0 runs the agent it starts for its host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum HostAgentLaunch {
    /// In the rank's own process: its threads, its CUDA context.
    #[default]
    InProcess,
    /// As a child process: `program` with `args`, which calls [`serve_host_agent`] (given the socket in
    /// [`HOST_AGENT_SOCKET`]; the configuration as the rank would find it, from `VFABRIC_CONFIG` or the
    /// embedded one, in the environment it inherits).
    Process {
        /// The program.
        program: PathBuf,
        /// Its arguments.
        args: Vec<OsString>,
    },
}

/// The agent a host's job runs, in rank 0's process or as its child: held for its drop, which stops it.
#[allow(dead_code)]
pub(super) enum HostAgentHandle {
    /// In this process.
    InProcess(HostAgent),
    /// A child process.
    Process(HostAgentProcess),
}

/// A host agent process this rank started; dropping it lets the agent go and waits for it to end.
pub(super) struct HostAgentProcess {
    child: Child,
    /// The pipe whose end the child waits for.
    stdin: Option<ChildStdin>,
    socket: PathBuf,
}

/// How long a dropped host agent process has to shut down before it is killed.
const STOP_WAIT: Duration = Duration::from_secs(10);

impl HostAgentProcess {
    /// Starts `program args` serving at `socket` and waits (up to `wait`) until it answers there.
    pub(super) fn start(
        program: &Path,
        args: &[OsString],
        socket: &Path,
        wait: Duration,
    ) -> Result<HostAgentProcess, FabricError> {
        let command =
            format!("{} {}", program.display(), args.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" "));
        let failed = |why: String| LaunchError::AgentProcess { command: command.clone(), why };
        let mut child = Command::new(program)
            .args(args)
            .env(HOST_AGENT_SOCKET, socket)
            .stdin(Stdio::piped())
            .spawn()
            .map_err(|e| failed(format!("cannot start it: {e}")))?;
        // Dropped on a failure below too: the child then sees its input end and stops.
        let mut agent = HostAgentProcess { stdin: child.stdin.take(), child, socket: socket.to_path_buf() };
        let start = Instant::now();
        // Its exit checked after the socket answers too: another agent may have taken the socket first.
        let mut ended = || agent.child.try_wait().map_err(|e| failed(format!("cannot watch it: {e}")));
        loop {
            let serving = answers(socket);
            if let Some(status) = ended()? {
                return Err(failed(format!("it ended ({status}) before it served at {}", socket.display())).into());
            }
            if serving {
                break;
            }
            if start.elapsed() > wait {
                return Err(failed(format!(
                    "no answer at {} after {wait:?} (VFABRIC_AGENT_TIMEOUT waits longer)",
                    socket.display()
                ))
                .into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        tracing::info!(pid = agent.child.id(), socket = %socket.display(), "started the host's agent process");
        Ok(agent)
    }
}

impl Drop for HostAgentProcess {
    fn drop(&mut self) {
        // A byte, then the pipe's end: it stops serving, removes its socket and exits.
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"\n");
        }
        let start = Instant::now();
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if start.elapsed() < STOP_WAIT => std::thread::sleep(Duration::from_millis(10)),
                _ => break,
            }
        }
        tracing::warn!(pid = self.child.id(), "the host's agent process did not stop in {STOP_WAIT:?}: killing it");
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Serves this host's ranks as the agent process their local rank 0 started: at the socket in
/// [`HOST_AGENT_SOCKET`], with the configuration the rank would use (`VFABRIC_CONFIG`, else the embedded one),
/// until a byte or the end arrives on standard input, or this process's parent changes (rank 0 is gone).
/// Returns once the agent has stopped and its socket is gone.
pub fn serve_host_agent() -> Result<(), FabricError> {
    let socket = std::env::var_os(HOST_AGENT_SOCKET)
        .map(PathBuf::from)
        .ok_or(LaunchError::Unset { var: HOST_AGENT_SOCKET, what: "the socket the host's agent serves" })?;
    let parent = std::os::unix::process::parent_id();
    let agent = HostAgent::start(&job_config(None)?, &socket)?;
    let (told, stop) = std::sync::mpsc::channel::<()>();
    // The read ends with the rank's byte, the pipe's end, or an error (a signal's interruption is retried).
    let reader = move || {
        let mut byte = [0u8; 1];
        let mut stdin = std::io::stdin();
        while matches!(stdin.read(&mut byte), Err(ref e) if e.kind() == std::io::ErrorKind::Interrupted) {}
        let _ = told.send(());
    };
    std::thread::Builder::new()
        .name("vfabric-host-agent-stop".into())
        .spawn(reader)
        .map_err(|e| LaunchError::AgentProcess { command: "serve_host_agent".into(), why: format!("a thread: {e}") })?;
    loop {
        match stop.recv_timeout(Duration::from_secs(1)) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if std::os::unix::process::parent_id() == parent => {}
            _ => break,
        }
    }
    drop(agent);
    Ok(())
}

/// Whether an agent answers at `socket`.
pub(super) fn answers(socket: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(socket).is_ok()
}

/// The configuration of the agent a job starts: `given`, else the file `VFABRIC_CONFIG` names, else the
/// embedded one.
pub(super) fn job_config(given: Option<&ClusterConfig>) -> Result<ClusterConfig, FabricError> {
    Ok(match given {
        Some(c) => c.clone(),
        None => match std::env::var_os("VFABRIC_CONFIG") {
            Some(path) => ClusterConfig::from_file(Path::new(&path))?,
            None => ClusterConfig::embedded_local(),
        },
    })
}
