//! How a job's launch fails: its launcher's variables, and the rendezvous where its ranks meet.

/// Why a rank of a job could not join it.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// No launcher's rank variable is set.
    #[error(
        "no rank in the environment (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK, SLURM_PROCID or RANK): not started by \
         a launcher?"
    )]
    NoRank,
    /// No launcher's job-size variable is set.
    #[error("no job size in the environment (OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS or WORLD_SIZE)")]
    NoSize,
    /// A launcher's variable is not a number.
    #[error("{var}={value} is not a rank or count")]
    NotANumber {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// The rank does not fit the job.
    #[error("rank {rank} of a job of {size}")]
    RankOutOfJob {
        /// The rank.
        rank: u16,
        /// The job's size.
        size: u16,
    },
    /// A variable the launch needs is not set.
    #[error("{var} ({what}) is not set")]
    Unset {
        /// The variable.
        var: &'static str,
        /// What it says.
        what: &'static str,
    },
    /// A variable that should hold an address does not.
    #[error("{var}: {source}")]
    BadAddress {
        /// The variable.
        var: &'static str,
        /// Why.
        source: std::net::AddrParseError,
    },
    /// The rendezvous's socket failed.
    #[error("rendezvous {at}: {source}")]
    Rendezvous {
        /// The rendezvous's address (or the rank it talked to).
        at: String,
        /// Why.
        source: std::io::Error,
    },
    /// The rendezvous did not complete in time.
    #[error("rendezvous: {0}")]
    Timeout(String),
    /// No agent serves this host's socket, and this rank does not start one (it is not in a job, or its job
    /// spans several hosts, whose agents `vfabric agent` runs).
    #[error(
        "no agent answers at {}: start one with `vfabric agent` (or set VFABRIC_SOCKET to the one that runs); a job \
         whose ranks all run on one host starts its own in local rank 0",
        socket.display()
    )]
    NoAgent {
        /// The socket.
        socket: std::path::PathBuf,
    },
    /// Rank 0 sent a table this rank cannot read.
    #[error("rendezvous: {0}")]
    BadTable(String),
    /// The agent process local rank 0 started for its host did not come up: it could not be started, or it
    /// ended before it served (its own error is on its standard error, which is the rank's).
    #[error("the host's agent process ({command}): {why}")]
    AgentProcess {
        /// The command that starts it.
        command: String,
        /// What happened.
        why: String,
    },
}

impl LaunchError {
    /// A failure of the rendezvous's socket at `at`.
    pub(crate) fn rendezvous(at: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> LaunchError {
        let at = at.to_string();
        move |source| LaunchError::Rendezvous { at, source }
    }
}
