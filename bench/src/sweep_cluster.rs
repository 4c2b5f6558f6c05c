//! `vfabric-bench sweep --cluster CONFIG` under a launcher (`mpirun`, Slurm's `srun`): every rank starts its
//! agent from the launcher's environment (`Agent::from_env`, as a training job's ranks do) and runs the peer
//! cases against the next rank's memory (rank r -> r+1, the last to rank 0), all ranks at once, case by case;
//! beside iperf3 TCP from each rank to the next, all at once. The ranks meet between cases at barriers made of
//! files in the results folder (which every rank must see: one host, or a shared file system). Rank 0 writes
//! the aggregate: per case, the bytes every rank moved over the slowest rank's time, and each rank's own GB/s.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use vfabric::agent::{Agent, JobRank};
use vfabric::ClusterConfig;

use crate::sweep_cases::{Case, Measured, Target};
use crate::sweep_peer::{peer_case, region_bytes, regions};

/// Ranks meeting at named points, through files in a folder every rank sees.
pub struct Barrier {
    dir: PathBuf,
    rank: u16,
    size: u16,
    wait: Duration,
}

impl Barrier {
    /// The barrier of rank `rank` of `size` in `dir` (rank 0 empties it first: call this before the ranks
    /// meet at the rendezvous, so that no rank writes into it before).
    pub fn new(dir: &Path, job: JobRank, wait: Duration) -> Result<Barrier, String> {
        let failed = |e: std::io::Error| format!("barrier folder {}: {e}", dir.display());
        if job.rank == 0 && dir.exists() {
            std::fs::remove_dir_all(dir).map_err(failed)?;
        }
        std::fs::create_dir_all(dir).map_err(failed)?;
        Ok(Barrier { dir: dir.to_path_buf(), rank: job.rank, size: job.size, wait })
    }

    /// Says that this rank failed, and why: the others stop waiting for it at their next point.
    pub fn fail(&self, why: &str) {
        let _ = std::fs::write(self.dir.join(format!("failed.{}", self.rank)), why);
    }

    /// A rank's failure, if one said it failed.
    fn failed(&self) -> Option<String> {
        (0..self.size).find_map(|r| {
            let why = std::fs::read_to_string(self.dir.join(format!("failed.{r}"))).ok()?;
            Some(format!("rank {r} failed: {why}"))
        })
    }

    /// Leaves `note` at point `label` and waits for every rank to reach it; returns their notes, by rank. An
    /// error as soon as a rank says it failed, or when one has not come within the wait.
    pub fn meet(&self, label: &str, note: &str) -> Result<Vec<String>, String> {
        let file = |r: u16| self.dir.join(format!("{label}.{r}"));
        let failed = |e: std::io::Error| format!("barrier {label}: {e}");
        // Written whole, then renamed: a rank never reads half a note.
        let tmp = self.dir.join(format!(".{label}.{}", self.rank));
        std::fs::write(&tmp, note).map_err(failed)?;
        std::fs::rename(&tmp, file(self.rank)).map_err(failed)?;
        let start = Instant::now();
        let mut notes = vec![None; usize::from(self.size)];
        while notes.iter().any(Option::is_none) {
            for (r, n) in notes.iter_mut().enumerate().filter(|(_, n)| n.is_none()) {
                *n = std::fs::read_to_string(file(r as u16)).ok();
            }
            if let Some(why) = self.failed() {
                return Err(why);
            }
            if start.elapsed() > self.wait {
                let missing: Vec<usize> =
                    notes.iter().enumerate().filter(|(_, n)| n.is_none()).map(|(r, _)| r).collect();
                return Err(format!("rank(s) {missing:?} did not reach `{label}` within {:?}", self.wait));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(notes.into_iter().flatten().collect())
    }

    /// The last point: rank 0 removes the folder once every rank has passed it.
    pub fn finish(self) -> Result<(), String> {
        self.meet("done", "")?;
        self.meet_last()
    }

    fn meet_last(&self) -> Result<(), String> {
        if self.rank != 0 {
            return std::fs::write(self.dir.join(format!("left.{}", self.rank)), "").map_err(|e| e.to_string());
        }
        let start = Instant::now();
        while (1..self.size).any(|r| !self.dir.join(format!("left.{r}")).exists()) && start.elapsed() < self.wait {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::fs::remove_dir_all(&self.dir).map_err(|e| e.to_string())
    }
}

/// What a rank measured, case by case, for rank 0.
#[derive(Debug, Serialize, Deserialize)]
pub struct RankResult {
    /// The rank.
    pub rank: u16,
    /// iperf3 TCP to the next rank, GB/s (`None`: it did not run, and why).
    pub iperf_gb_s: Result<f64, String>,
    /// Each case's figures, in the order of the cases.
    pub cases: Vec<Measured>,
}

/// Runs `cases` (peer cases) as this rank of a job; returns every rank's results at rank 0, nothing elsewhere.
pub fn run_rank(
    cfg: &ClusterConfig,
    cases: &[Case],
    sync: &Path,
    iperf_seconds: u64,
) -> Result<Option<(JobRank, Vec<RankResult>)>, String> {
    let job = JobRank::from_env().map_err(|e| e.to_string())?;
    if job.size < 2 {
        return Err("--cluster: the job has one rank; start two or more (mpirun -np 2 ...)".into());
    }
    // How long a rank waits for the others at a point: a case's length and more.
    let wait = Duration::from_secs(
        std::env::var("VFABRIC_RENDEZVOUS_TIMEOUT").ok().and_then(|s| s.parse().ok()).unwrap_or(600),
    );
    let barrier = Barrier::new(sync, job, wait)?;
    let measured = measure_rank(cfg, cases, &barrier, job, iperf_seconds);
    if let Err(why) = &measured {
        barrier.fail(why);
    }
    let (results, agent, rt) = measured?;
    // Every rank has measured: the agents may stop.
    barrier.finish()?;
    rt.block_on(agent.shutdown());
    match job.rank {
        0 => {
            let all: Result<Vec<RankResult>, String> =
                results.iter().map(|t| serde_json::from_str(t).map_err(|e| e.to_string())).collect();
            Ok(Some((job, all?)))
        }
        _ => Ok(None),
    }
}

/// This rank's part: its agent, the iperf3 ring, every case against the next rank; every rank's results (as
/// their JSON), with the agent (still serving the rank before) and its runtime.
fn measure_rank(
    cfg: &ClusterConfig,
    cases: &[Case],
    barrier: &Barrier,
    job: JobRank,
    iperf_seconds: u64,
) -> Result<(Vec<String>, Agent, tokio::runtime::Runtime), String> {
    let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
    let rt = Agent::runtime((cores / usize::from(job.local_size)).max(2)).map_err(|e| e.to_string())?;
    let next = (job.rank + 1) % job.size;
    let blocks: Vec<u64> = cases.iter().map(|c| c.block).collect();
    let len = region_bytes(cfg, cases, &blocks);
    let (results, agent) = rt.block_on(async {
        let a = Agent::from_env(cfg).await.map_err(|e| format!("rank {}: {e}", job.rank))?;
        eprintln!("rank {} of {}: agent up at {}; measuring against rank {next}", job.rank, job.size, a.local_addr());
        let iperf = iperf3_ring(barrier, &a, job, iperf_seconds);
        // Every region made and filled before the first case, so that no rank's set-up falls in another's case.
        let regions = regions(&a, next, cases, len).await?;
        let mut measured = Vec::new();
        for (i, case) in cases.iter().enumerate() {
            let (_, region, contents) = regions
                .iter()
                .find(|(t, _, _)| case.pair.target == Target::Peer(*t))
                .ok_or_else(|| format!("{}: no region for its target", case.describe()))?;
            barrier.meet(&format!("case{i}"), "")?;
            if job.rank == 0 {
                eprintln!("{} (every rank to the next)", case.describe());
            }
            measured.push(peer_case(&a, region, case, contents).await?);
        }
        // Every rank's cases are done before a region is freed (its home serves the rank before).
        barrier.meet("measured", "")?;
        for (_, r, _) in regions {
            a.free(&r).await.map_err(|e| e.to_string())?;
        }
        let mine = RankResult { rank: job.rank, iperf_gb_s: iperf, cases: measured };
        let text = serde_json::to_string(&mine).map_err(|e| e.to_string())?;
        let all = barrier.meet("results", &text)?;
        Ok::<_, String>((all, a))
    })?;
    Ok((results, agent, rt))
}

/// iperf3 TCP from every rank to the next, all at once: each rank serves on its agent's address
/// (`VFABRIC_IPERF_PORT`, default 5201, plus its rank) and runs the client against the next rank's. GB/s.
fn iperf3_ring(barrier: &Barrier, a: &Agent, job: JobRank, seconds: u64) -> Result<f64, String> {
    let base: u16 = std::env::var("VFABRIC_IPERF_PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(5201);
    let ip = a.local_addr().ip().to_string();
    let port = |r: u16| (base + r).to_string();
    let server: Result<Child, String> = match seconds {
        0 => Err("skipped (--iperf-seconds 0)".into()),
        _ => Command::new("iperf3")
            .args(["-s", "-1", "-B", &ip, "-p", &port(job.rank)])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("iperf3 not runnable ({e}); install the Debian package iperf3")),
    };
    std::thread::sleep(Duration::from_millis(300));
    let ips = barrier.meet("iperf", &ip);
    let next = (job.rank + 1) % job.size;
    let result = match (&server, ips) {
        (Ok(_), Ok(ips)) => {
            let peer = &ips[usize::from(next)];
            Command::new("iperf3")
                .args(["-c", peer, "-p", &port(next), "-t", &seconds.to_string(), "-P", "4", "-J"])
                .output()
                .map_err(|e| format!("iperf3 client: {e}"))
                .and_then(|o| {
                    let v: serde_json::Value =
                        serde_json::from_slice(&o.stdout).map_err(|e| format!("iperf3 output: {e}"))?;
                    v["end"]["sum_received"]["bits_per_second"]
                        .as_f64()
                        .map(|bps| bps / 8e9)
                        .ok_or_else(|| format!("iperf3 gave no result: {}", v["error"]))
                })
        }
        (Err(why), _) => Err(why.clone()),
        (_, Err(why)) => Err(why),
    };
    // The rank before this one may still be sending to this rank's server.
    let all_done = barrier.meet("iperf-done", "");
    if let Ok(mut s) = server {
        // It serves one client (-1) and exits; end it by its PID should the client have failed.
        let _ = s.kill();
        let _ = s.wait();
    }
    all_done?;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_meet_and_read_each_others_notes() {
        let dir = std::env::temp_dir().join(format!("vfabric-barrier-{}", std::process::id()));
        let job = |rank| JobRank { rank, size: 3, local_rank: rank, local_size: 3 };
        let zero = Barrier::new(&dir, job(0), Duration::from_secs(10)).expect("rank 0");
        let others: Vec<Barrier> =
            (1..3).map(|r| Barrier::new(&dir, job(r), Duration::from_secs(10)).expect("rank")).collect();
        let notes = std::thread::scope(|s| {
            let hs: Vec<_> = others.iter().map(|b| s.spawn(move || b.meet("x", &format!("r{}", b.rank)))).collect();
            let mine = zero.meet("x", "r0").expect("meets");
            for h in hs {
                assert_eq!(h.join().expect("thread").expect("meets"), mine);
            }
            mine
        });
        assert_eq!(notes, ["r0", "r1", "r2"]);
        let late =
            Barrier { wait: Duration::from_millis(50), ..Barrier::new(&dir, job(1), Duration::ZERO).expect("b") };
        let err = late.meet("y", "").expect_err("nobody else comes");
        assert!(err.contains("[0, 2]") && err.contains("`y`"), "{err}");
        std::thread::scope(|s| {
            for b in others {
                s.spawn(move || b.finish().expect("finishes"));
            }
            zero.finish().expect("finishes");
        });
        assert!(!dir.exists(), "rank 0 removes the folder last");
        // A rank that fails says so, and the others stop waiting for it at once.
        let zero = Barrier::new(&dir, job(0), Duration::from_secs(600)).expect("rank 0");
        Barrier::new(&dir, job(2), Duration::from_secs(600)).expect("rank 2").fail("no region on rank 0");
        let err = zero.meet("z", "").expect_err("rank 2 failed");
        assert_eq!(err, "rank 2 failed: no region on rank 0");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
