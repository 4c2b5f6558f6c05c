//! What serving Prometheus metrics costs transfers between agents (`vfabric-bench remote`): the same writes and
//! reads with both agents' endpoints served (every call then timed into histograms) and without, alternating
//! round by round so that drift in the machine falls on both alike.

use std::sync::Arc;

use serde::Serialize;
use vfabric::agent::Agent;
use vfabric_transport::Location;

use crate::stats::percentile;

/// Rounds of each (a round: writes, then reads, with metrics served and without, in alternating order).
const ROUNDS: usize = 5;

/// Throughput with metrics served beside the same without, medians of the rounds.
#[derive(Debug, Clone, Serialize)]
pub struct MetricsCost {
    /// Bytes per request.
    pub size: u64,
    /// Requests in flight.
    pub streams: usize,
    /// Rounds of each.
    pub rounds: usize,
    /// Writes, Gbit/s: without metrics, with.
    pub write_gbit_s: (f64, f64),
    /// Reads, Gbit/s: without metrics, with.
    pub read_gbit_s: (f64, f64),
}

impl MetricsCost {
    /// With / without, writes and reads.
    pub fn ratios(&self) -> (f64, f64) {
        (self.write_gbit_s.1 / self.write_gbit_s.0, self.read_gbit_s.1 / self.read_gbit_s.0)
    }
}

/// Measures it between `a` and `b` (a region homed at `b`'s host memory, `total` bytes per case in requests of
/// `size`, `streams` at a time).
pub async fn measure(a: &Agent, b: &Agent, size: u64, streams: usize, total: u64) -> Result<MetricsCost, String> {
    let e = |e: vfabric::FabricError| e.to_string();
    let region_bytes = total.clamp(size, 256 << 20);
    let region = a.alloc(b.node(), region_bytes, Some(Location::Host)).await.map_err(e)?;
    let data = Arc::new(vfabric::pattern::bytes(0x3e7, 0, size as usize));
    let mut figures: [[Vec<f64>; 2]; 2] = Default::default(); // [served][write, read]
    for round in 0..ROUNDS {
        for served in [round % 2 == 1, round % 2 == 0] {
            let servers = match served {
                true => {
                    let at = ([127, 0, 0, 1], 0).into();
                    Some((a.serve_metrics(at).map_err(e)?, b.serve_metrics(at).map_err(e)?))
                }
                false => None,
            };
            for (k, write) in [true, false].into_iter().enumerate() {
                let (secs, bad) = crate::throughput::throughput(a, &region, write, size, streams, total, &data).await?;
                if bad > 0 {
                    return Err(format!("{bad} read(s) came back different from what was written"));
                }
                let bytes = (total / size).max(1) * size;
                figures[usize::from(served)][k].push(bytes as f64 * 8.0 / secs / 1e9);
            }
            drop(servers);
        }
    }
    a.free(&region).await.map_err(e)?;
    let mut med = |s: usize, k: usize| percentile(&mut figures[s][k], 0.5);
    Ok(MetricsCost {
        size,
        streams,
        rounds: ROUNDS,
        write_gbit_s: (med(0, 0), med(1, 0)),
        read_gbit_s: (med(0, 1), med(1, 1)),
    })
}
