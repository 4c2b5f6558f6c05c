//! Jobs under a launcher (`mpirun`, Slurm): every rank runs an agent of its own, node id = rank, named
//! `rank<R>`, and finds the others through a rendezvous, with no MPI library linked.
//!
//! The rank and job size come from the launcher's environment (Open MPI's `OMPI_COMM_WORLD_*`, PMIx's
//! `PMIX_RANK`, MPICH/Hydra's `PMI_RANK`/`PMI_SIZE`, Slurm's `SLURM_PROCID`/`SLURM_NTASKS`). The rendezvous is
//! a TCP address (`VFABRIC_RENDEZVOUS`, `ip:port`) where rank 0 listens: each rank sends one line
//! `<rank> <quic address>`, and once all have arrived rank 0 sends every rank the whole table, one line per
//! rank. Trust still comes from the certificates (`vfabric cluster init --ranks N`): the table only says where
//! to dial, and a rank that dials answers to a certificate naming `rank<R>` signed by the cluster CA.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::config::{ClusterConfig, NodeSection};
use crate::error::{FabricError, LaunchError, NetworkError};

use super::shared::Agent;

/// Where this process sits in its job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobRank {
    /// This process's rank.
    pub rank: u16,
    /// Ranks in the job.
    pub size: u16,
    /// Rank among the job's processes on this host (picks the GPU, when there are several).
    pub local_rank: u16,
    /// The job's processes on this host (1 when the launcher does not say).
    pub local_size: u16,
}

impl JobRank {
    /// Reads the launcher's variables from the environment.
    pub fn from_env() -> Result<JobRank, FabricError> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// Reads the launcher's variables through `get` (the environment, or a test's table).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<JobRank, FabricError> {
        let first = |keys: &[&'static str]| keys.iter().find_map(|&k| get(k).map(|v| (k, v)));
        let num = |(k, v): (&'static str, String)| {
            v.trim().parse::<u16>().map_err(|_| LaunchError::NotANumber { var: k, value: v.clone() })
        };
        // Open MPI, PMIx, MPICH/Hydra, Slurm, then torchrun's (which other launchers' jobs may also carry).
        let rank = first(&["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"])
            .ok_or(LaunchError::NoRank)?;
        let size = first(&["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "OMPI_UNIVERSE_SIZE", "WORLD_SIZE"])
            .ok_or(LaunchError::NoSize)?;
        let local = first(&["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"]);
        let local_size = first(&["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE"]);
        let (rank, size) = (num(rank)?, num(size)?);
        let local_rank = local.map(num).transpose()?.unwrap_or(0);
        // Slurm says how many nodes, not how many tasks here: a job on one node has them all here.
        let one_node = get("SLURM_NNODES").is_some_and(|n| n.trim() == "1");
        let local_size = match local_size.map(num).transpose()? {
            Some(n) => n,
            None if one_node => size,
            None => 1,
        }
        .max(local_rank + 1);
        if size == 0 || rank >= size {
            return Err(LaunchError::RankOutOfJob { rank, size }.into());
        }
        Ok(JobRank { rank, size, local_rank, local_size })
    }

    /// Whether every rank of the job runs on this host.
    pub fn single_host(&self) -> bool {
        self.local_size >= self.size
    }

    /// The GPU this rank uses by default among `gpus` (its local rank's, round robin when there are more ranks
    /// than GPUs on the host).
    pub fn gpu(&self, gpus: u16) -> Option<u16> {
        (gpus > 0).then(|| self.local_rank % gpus)
    }
}

/// The name of rank `r`'s node (and certificate).
pub fn rank_name(r: u16) -> String {
    format!("rank{r}")
}

impl Agent {
    /// Starts this rank's agent in a job under a launcher: the configuration's nodes are replaced by the job's
    /// ranks (`rank0`..), this rank's identity is loaded from `network.certs` (or `VFABRIC_CERTS`), its QUIC
    /// endpoint binds `VFABRIC_BIND` (default: the rendezvous's IP, any port), and the ranks exchange addresses
    /// at `VFABRIC_RENDEZVOUS` (waiting up to `VFABRIC_RENDEZVOUS_TIMEOUT` seconds, default 60, for all).
    pub async fn from_env(config: &ClusterConfig) -> Result<Agent, FabricError> {
        let job = JobRank::from_env()?;
        let var = |k: &str| std::env::var(k).ok();
        let rendezvous: SocketAddr = var("VFABRIC_RENDEZVOUS")
            .ok_or(LaunchError::Unset { var: "VFABRIC_RENDEZVOUS", what: "ip:port where rank 0 listens" })?
            .parse()
            .map_err(|source| LaunchError::BadAddress { var: "VFABRIC_RENDEZVOUS", source })?;
        let bind: SocketAddr = match var("VFABRIC_BIND") {
            Some(b) => b.parse().map_err(|source| LaunchError::BadAddress { var: "VFABRIC_BIND", source })?,
            None => SocketAddr::new(rendezvous.ip(), 0),
        };
        let wait = Duration::from_secs(var("VFABRIC_RENDEZVOUS_TIMEOUT").and_then(|s| s.parse().ok()).unwrap_or(60));
        let mut cfg = config.clone();
        if let Some(dir) = var("VFABRIC_CERTS") {
            cfg.network.certs = dir;
        }
        // A job's ranks stop together: none hands its regions to the others.
        cfg.network.drain = false;
        let gpus = cfg.nodes.first().and_then(|n| n.gpus.clone());
        cfg.nodes = (0..job.size)
            .map(|r| NodeSection { name: rank_name(r), gpus: gpus.clone(), address: None, tenant: None })
            .collect();
        // Rank 0 listens before it does anything slow, so the others find the rendezvous early.
        let listener = if job.rank == 0 {
            Some(TcpListener::bind(rendezvous).await.map_err(LaunchError::rendezvous(rendezvous))?)
        } else {
            None
        };
        let name = rank_name(job.rank);
        let identity =
            vfabric_transport::quic::NodeIdentity::load(std::path::Path::new(&cfg.network.certs), &name).map_err(
                |source| NetworkError::Certificate { node: format!("{name} (from {})", cfg.network.certs), source },
            )?;
        let agent = Agent::start(&cfg, &name, &identity, Some(bind)).await?;
        let me = agent.local_addr();
        let serve = async {
            match listener {
                Some(l) => tokio::time::timeout(wait, collect(l, job.size)).await.map_err(|_| {
                    LaunchError::Timeout(format!("not every one of {} ranks arrived within {wait:?}", job.size))
                })?,
                None => Ok(()),
            }
        };
        let (served, table) = tokio::join!(serve, exchange(rendezvous, job, me, wait));
        served?;
        for (r, addr) in table?.into_iter().enumerate() {
            if r as u16 != job.rank {
                agent.set_peer_addr(r as u16, addr).await?;
            }
        }
        tracing::info!(rank = job.rank, size = job.size, addr = %me, "job rank joined");
        Ok(agent)
    }
}

/// Rank 0: takes one `<rank> <addr>` line from every rank, then sends each the whole table.
async fn collect(listener: TcpListener, size: u16) -> Result<(), FabricError> {
    let mut table: Vec<Option<SocketAddr>> = vec![None; usize::from(size)];
    let mut conns = Vec::new();
    while table.iter().any(Option::is_none) {
        let (sock, from) = listener.accept().await.map_err(LaunchError::rendezvous("(accept)"))?;
        let mut lines = BufReader::new(sock);
        let mut line = String::new();
        lines.read_line(&mut line).await.map_err(LaunchError::rendezvous(format!("(from {from})")))?;
        let mut parts = line.split_whitespace();
        let parsed = match (parts.next().map(str::parse::<u16>), parts.next().map(str::parse::<SocketAddr>)) {
            (Some(Ok(r)), Some(Ok(a))) if r < size && table[usize::from(r)].is_none() => Some((r, a)),
            _ => None,
        };
        let Some((r, a)) = parsed else {
            tracing::warn!(%from, line = line.trim(), "rendezvous: ignoring a bad or repeated line");
            continue;
        };
        table[usize::from(r)] = Some(a);
        conns.push(lines.into_inner());
    }
    let text: String = table.iter().flatten().enumerate().map(|(r, a)| format!("{r} {a}\n")).collect();
    for mut c in conns {
        c.write_all(text.as_bytes()).await.map_err(LaunchError::rendezvous("(table)"))?;
        let _ = c.shutdown().await;
    }
    Ok(())
}

/// Every rank: sends its line to rank 0 (retrying until it listens) and reads the table back.
async fn exchange(
    rendezvous: SocketAddr,
    job: JobRank,
    me: SocketAddr,
    wait: Duration,
) -> Result<Vec<SocketAddr>, FabricError> {
    let start = Instant::now();
    let mut sock = loop {
        match TcpStream::connect(rendezvous).await {
            Ok(s) => break s,
            Err(e) if start.elapsed() < wait => {
                tracing::debug!(error = %e, "rendezvous not up yet");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(LaunchError::rendezvous(rendezvous)(e).into()),
        }
    };
    sock.write_all(format!("{} {me}\n", job.rank).as_bytes()).await.map_err(LaunchError::rendezvous(rendezvous))?;
    let mut lines = BufReader::new(sock).lines();
    let mut table = Vec::new();
    let read = async {
        while let Some(l) = lines.next_line().await.map_err(LaunchError::rendezvous(rendezvous))? {
            let addr = l.split_whitespace().nth(1).and_then(|a| a.parse::<SocketAddr>().ok());
            table.push(addr.ok_or_else(|| LaunchError::BadTable(format!("rank 0 sent `{l}`")))?);
        }
        Ok::<(), FabricError>(())
    };
    tokio::time::timeout(wait.saturating_sub(start.elapsed()).max(Duration::from_secs(1)), read)
        .await
        .map_err(|_| LaunchError::Timeout("no table from rank 0 in time".into()))??;
    if table.len() != usize::from(job.size) {
        return Err(LaunchError::BadTable(format!("the table has {} ranks, the job {}", table.len(), job.size)).into());
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| pairs.iter().find(|(a, _)| *a == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn launchers_are_read() {
        let ompi = [("OMPI_COMM_WORLD_RANK", "2"), ("OMPI_COMM_WORLD_SIZE", "4"), ("OMPI_COMM_WORLD_LOCAL_RANK", "1")];
        let job = |rank, size, local_rank, local_size| Some(JobRank { rank, size, local_rank, local_size });
        assert_eq!(JobRank::from_vars(vars(&ompi)).ok(), job(2, 4, 1, 2), "local size at least local rank + 1");
        let slurm = [("SLURM_PROCID", "5"), ("SLURM_NTASKS", "8"), ("SLURM_LOCALID", "1")];
        assert_eq!(JobRank::from_vars(vars(&slurm)).ok(), job(5, 8, 1, 2));
        // A Slurm job on one node: every task is local, local rank 0 included.
        let one_node = [("SLURM_PROCID", "0"), ("SLURM_NTASKS", "4"), ("SLURM_LOCALID", "0"), ("SLURM_NNODES", "1")];
        let j = JobRank::from_vars(vars(&one_node)).expect("slurm");
        assert_eq!((j.local_size, j.single_host()), (4, true));
        let pmi = [("PMI_RANK", "0"), ("PMI_SIZE", "2")];
        assert_eq!(JobRank::from_vars(vars(&pmi)).ok(), job(0, 2, 0, 1));
        let torchrun = [("RANK", "3"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "3"), ("LOCAL_WORLD_SIZE", "4")];
        let t = JobRank::from_vars(vars(&torchrun)).expect("torchrun");
        assert_eq!(Some(t), job(3, 4, 3, 4));
        assert!(t.single_host());
        assert_eq!((t.gpu(8), t.gpu(2), t.gpu(0)), (Some(3), Some(1), None));
        // Open MPI's variables win over torchrun's when a job carries both.
        let both = [("RANK", "0"), ("WORLD_SIZE", "1"), ("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2")];
        assert_eq!(JobRank::from_vars(vars(&both)).ok(), job(1, 2, 0, 1));
        assert!(!JobRank::from_vars(vars(&both)).expect("job").single_host());
    }

    #[test]
    fn bad_launcher_variables_are_clear_errors() {
        let e = |p: &[(&str, &str)]| JobRank::from_vars(vars(p)).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e(&[]).contains("no rank"));
        assert!(e(&[("PMI_RANK", "1")]).contains("no job size"));
        assert!(e(&[("PMI_RANK", "x"), ("PMI_SIZE", "2")]).contains("not a rank"));
        assert!(e(&[("PMI_RANK", "2"), ("PMI_SIZE", "2")]).contains("rank 2 of a job of 2"));
    }
}
