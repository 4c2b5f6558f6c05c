//! A job under mpirun: every rank runs its own agent (`Agent::from_env`), rank 0 allocates a region on itself,
//! every rank writes its slice of it and reads every other rank's slice back, byte for byte.
//!
//! ```sh
//! vfabric cluster init --config cluster-configs/mpirun.toml --ranks 4 --out /tmp/certs
//! mpirun -np 4 -x VFABRIC_RENDEZVOUS=127.0.0.1:7799 -x VFABRIC_CERTS=/tmp/certs -x VFABRIC_SHARE=/tmp/share \
//!     target/release/examples/mpi_ranks
//! ```
//!
//! Region handles travel between ranks in their wire form ([`vfabric::proto::WireRegion`]); a real job would
//! broadcast it with its own MPI. Here, with no MPI linked, rank 0 leaves it in a file under `VFABRIC_SHARE`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use vfabric::agent::{Agent, JobRank};
use vfabric::proto::WireRegion;
use vfabric::{ClusterConfig, Region};

const SLICE: u64 = 1 << 20;

fn config() -> Result<ClusterConfig, String> {
    match std::env::var("VFABRIC_CONFIG") {
        Ok(p) => ClusterConfig::from_file(std::path::Path::new(&p)).map_err(|e| e.to_string()),
        Err(_) => ClusterConfig::from_toml(include_str!("../../cluster-configs/mpirun.toml"), "mpirun.toml")
            .map_err(|e| e.to_string()),
    }
}

async fn poll<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> Result<T, String> {
    let t = Instant::now();
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if t.elapsed() > Duration::from_secs(60) {
            return Err(format!("gave up waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn run() -> Result<String, String> {
    let job = JobRank::from_env().map_err(|e| e.to_string())?;
    let share = PathBuf::from(std::env::var("VFABRIC_SHARE").map_err(|_| "VFABRIC_SHARE is not set")?);
    let agent = Agent::from_env(&config()?).await.map_err(|e| e.to_string())?;
    let handle = share.join("region");
    let region = if job.rank == 0 {
        let r = agent.alloc(0, u64::from(job.size) * SLICE, None).await.map_err(|e| e.to_string())?;
        let w = WireRegion::from(&r);
        let text = format!("{} {} {} {} {}", w.addr, w.len, w.page_size, w.slot, w.generation);
        std::fs::write(share.join("region.tmp"), text).map_err(|e| e.to_string())?;
        std::fs::rename(share.join("region.tmp"), &handle).map_err(|e| e.to_string())?;
        r
    } else {
        let text = poll("rank 0's region", async || std::fs::read_to_string(&handle).ok()).await?;
        let f: Vec<u64> = text.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        let [addr, len, page_size, slot, generation] = f[..] else { return Err(format!("bad handle `{text}`")) };
        Region::from(&WireRegion { addr, len, page_size, slot: slot as u32, generation })
    };
    let mine = vfabric::pattern::bytes(u64::from(job.rank) + 100, 0, SLICE as usize);
    agent.write(&region, u64::from(job.rank) * SLICE, &mine).await.map_err(|e| e.to_string())?;
    for r in 0..job.size {
        let want = vfabric::pattern::bytes(u64::from(r) + 100, 0, SLICE as usize);
        let mut buf = vec![0u8; SLICE as usize];
        poll(&format!("rank {r}'s slice"), async || {
            let ok = agent.read(&region, u64::from(r) * SLICE, &mut buf).await.is_ok();
            (ok && buf == want).then_some(())
        })
        .await?;
    }
    std::fs::write(share.join(format!("done{}", job.rank)), "").map_err(|e| e.to_string())?;
    if job.rank == 0 {
        // The region's home stays up until every rank has read it.
        poll("every rank to finish", async || {
            (0..job.size).all(|r| share.join(format!("done{r}")).exists()).then_some(())
        })
        .await?;
    }
    agent.shutdown().await;
    Ok(format!("rank {} of {}: all {} slices verified", job.rank, job.size, job.size))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    vfabric::logging::init();
    match run().await {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
