//! Pages pushed to or pulled from a region whose home is another agent, many requests at a time: the transfer
//! `vfabric-bench remote` times (and `metrics_cost` again, with metrics served).

use std::time::Instant;

use vfabric::agent::Agent;

/// Moves `total` bytes in requests of `size`, `streams` at a time, over `region` (cycling through it).
pub async fn throughput(
    a: &Agent,
    region: &vfabric::Region,
    write: bool,
    size: u64,
    streams: usize,
    total: u64,
    data: &std::sync::Arc<Vec<u8>>,
) -> Result<(f64, u64), String> {
    let slots = (region.len / size).max(1);
    let requests = (total / size).max(1);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for k in 0..streams as u64 {
        let (a, r, d) = (a.clone(), *region, std::sync::Arc::clone(data));
        tasks.push(tokio::spawn(async move {
            let mut bad = 0u64;
            let mut buf = vec![0u8; size as usize];
            let mut i = k;
            while i < requests {
                let off = (i % slots) * size;
                if write {
                    a.write(&r, off, &d[..size as usize]).await.map_err(|e| e.to_string())?;
                } else {
                    a.read(&r, off, &mut buf).await.map_err(|e| e.to_string())?;
                    bad += u64::from(buf[..] != d[..size as usize]);
                }
                i += streams as u64;
            }
            Ok::<u64, String>(bad)
        }));
    }
    let mut bad = 0;
    for t in tasks {
        bad += t.await.map_err(|e| e.to_string())??;
    }
    Ok((start.elapsed().as_secs_f64(), bad))
}
