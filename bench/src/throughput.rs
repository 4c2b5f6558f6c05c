//! Pages pushed to or pulled from a region whose home is another agent, many requests at a time: the transfer
//! `vfabric-bench remote` times (and `metrics_cost` again, with metrics served), and the bytes it moves.

use std::time::Instant;

use std::path::Path;

use vfabric::agent::Agent;

/// Moves `total` bytes in requests of `size`, `streams` at a time, over `region` (cycling through it). `data`
/// holds one request's bytes or several: the request at slot s of the region writes (and a read of it expects)
/// request s % (their number) of `data`.
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
    let held = (data.len() as u64 / size).max(1);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for k in 0..streams as u64 {
        let (a, r, d) = (a.clone(), *region, std::sync::Arc::clone(data));
        tasks.push(tokio::spawn(async move {
            let mut bad = 0u64;
            let mut buf = vec![0u8; size as usize];
            let mut i = k;
            while i < requests {
                let slot = i % slots;
                let bytes = &d[((slot % held) * size) as usize..][..size as usize];
                if write {
                    a.write(&r, slot * size, bytes).await.map_err(|e| e.to_string())?;
                } else {
                    a.read(&r, slot * size, &mut buf).await.map_err(|e| e.to_string())?;
                    bad += u64::from(buf[..] != *bytes);
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

/// What the requests of `vfabric-bench remote` carry.
#[derive(Debug, Clone, Copy)]
pub struct Payload<'a> {
    /// Zeros but for a number every 4 KiB (else random bytes).
    pub sparse: bool,
    /// A folder of raw trained tensors, one per file (instead of either).
    pub tensors: Option<&'a Path>,
    /// With `tensors`: that file's only (else a request of each file in turn).
    pub tensor: Option<&'a str>,
}

/// The bytes `vfabric-bench remote` writes in requests of `size` over a region of `region` bytes: random bytes
/// (`seed`), sparse pages, or the trained tensors' (one file's, or a request of each file in turn), a region's
/// worth at most.
pub fn payload(args: Payload, seed: u64, size: u64, region: u64) -> Result<Vec<u8>, String> {
    let Some(dir) = args.tensors else {
        return Ok(if args.sparse {
            sparse_bytes(size as usize)
        } else {
            vfabric::pattern::bytes(seed, 0, size as usize)
        });
    };
    let trained = crate::compression::tensors(dir, region as usize)?;
    let mut fills = crate::storage::tensor_fills(&trained, size as usize, (region / size).max(1) as usize);
    let found = match args.tensor {
        Some(name) => fills.into_iter().find(|(n, _)| n == name),
        None => fills.pop(),
    };
    let what = args.tensor.map_or("file".to_owned(), |n| format!("file {n}"));
    found.map(|(_, bytes)| bytes).ok_or_else(|| {
        format!("--tensors {}: no {what} with a whole request of {}", dir.display(), vfabric::ByteSize(size))
    })
}

/// What [`payload`] moves, for the report.
pub fn describe(args: Payload) -> String {
    match (args.tensors, args.tensor) {
        (Some(dir), Some(name)) => format!("trained tensor {name} of {}", dir.display()),
        (Some(dir), None) => format!("trained tensors of {} (a request of each file in turn)", dir.display()),
        _ if args.sparse => "sparse (zeros but for a number every 4 KiB)".into(),
        _ => "random bytes".into(),
    }
}

/// `len` bytes of zeros but for a number every 4 KiB.
fn sparse_bytes(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for (i, w) in v.chunks_mut(4096).enumerate() {
        let n = (i as u64 * 7 + 1).to_le_bytes();
        let k = n.len().min(w.len());
        w[..k].copy_from_slice(&n[..k]);
    }
    v
}
