//! The peer cases of `vfabric-bench sweep`: block-sized reads and writes of a region homed at another node's
//! agent, in batches posted at once, several batches in flight; every read checked against what the region
//! holds, and each write case read back in part afterwards.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use vfabric::agent::Agent;
use vfabric::pattern::{self, shuffled};
use vfabric::{ByteSize, ClusterConfig};
use vfabric_transport::Location;

use crate::sweep_cases::{Case, Measured, Op, Target};

/// The unit in which [`Contents`] keeps track (the smallest block).
const UNIT: usize = 4096;

/// Blocks of each write case read back afterwards (not timed).
const READ_BACK: usize = 64;

/// What a region homed at a peer holds: in each 4 KiB unit, one of two fills of known bytes. Write cases
/// alternate the fill they write, so that a write that never landed shows at the next read of its block.
pub struct Contents {
    fills: [Vec<u8>; 2],
    units: Vec<AtomicU8>,
    writes: AtomicUsize,
}

impl Contents {
    /// A region of `len` bytes (a multiple of 4 KiB), holding the first fill.
    pub fn new(len: usize) -> Contents {
        Contents {
            fills: [pattern::bytes(0x5ee9, 0, len), pattern::bytes(0xa17e, 0, len)],
            units: (0..len / UNIT).map(|_| AtomicU8::new(0)).collect(),
            writes: AtomicUsize::new(0),
        }
    }

    /// The first fill, whole (to write the region with at first).
    pub fn first(&self) -> &[u8] {
        &self.fills[0]
    }

    /// The fill the next write case writes.
    pub fn next_write(&self) -> usize {
        (self.writes.fetch_add(1, Ordering::Relaxed) + 1) % 2
    }

    fn wrote(&self, fill: usize, off: usize, len: usize) {
        for u in &self.units[off / UNIT..(off + len).div_ceil(UNIT)] {
            u.store(fill as u8, Ordering::Relaxed);
        }
    }

    /// Whether `got`, read at `off`, differs from what the region holds there.
    fn differs(&self, off: usize, got: &[u8]) -> bool {
        got.chunks(UNIT).enumerate().any(|(i, c)| {
            let at = off + i * UNIT;
            let fill = usize::from(self.units[at / UNIT].load(Ordering::Relaxed));
            c != &self.fills[fill][at..at + c.len()]
        })
    }
}

/// The peer cases: two agents in this process on loopback, a region homed at the peer on each target location,
/// filled with known bytes; each case's batches are block-sized reads or writes at scattered offsets of it.
pub fn peer_cases(cfg: &ClusterConfig, cases: &[Case], blocks: &[u64]) -> Result<Vec<(Case, Measured)>, String> {
    let region_bytes = region_bytes(cfg, cases, blocks);
    let page = cfg.memory.page_size.bytes().max(blocks.iter().copied().max().unwrap_or(0));
    let mut pair_cfg =
        crate::remote::two_nodes(cfg, cfg.network.mtu, region_bytes, page, None, Some(cfg.network.lanes))?;
    // Host tiers the size of what the cases use, not the configuration's (each agent pins its own).
    pair_cfg.memory.host_arena = ByteSize(region_bytes + (256 << 20));
    let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
    let rt = Agent::runtime(cores.max(4)).map_err(|e| e.to_string())?;
    rt.block_on(async {
        let (a, b) = crate::remote::start_pair(&pair_cfg).await?;
        let mut out = Vec::new();
        for (t, region, contents) in regions(&a, b.node(), cases, region_bytes).await? {
            for case in cases.iter().filter(|c| c.pair.target == Target::Peer(t)) {
                eprintln!("{}", case.describe());
                out.push((*case, peer_case(&a, &region, case, &contents).await?));
            }
            a.free(&region).await.map_err(|e| e.to_string())?;
        }
        a.shutdown().await;
        b.shutdown().await;
        Ok(out)
    })
}

/// Bytes of the region each peer target gets: room for every case's bytes and round.
pub fn region_bytes(cfg: &ClusterConfig, cases: &[Case], blocks: &[u64]) -> u64 {
    let total = cases.iter().map(|c| c.total.max(c.round_bytes())).max().unwrap_or(0);
    let page = cfg.memory.page_size.bytes().max(blocks.iter().copied().max().unwrap_or(0));
    total.div_ceil(page) * page
}

/// A region homed at `node` on each location the cases target there, written with its first fill.
pub async fn regions(
    a: &Agent,
    node: u16,
    cases: &[Case],
    len: u64,
) -> Result<Vec<(Location, vfabric::Region, Arc<Contents>)>, String> {
    let mut targets: Vec<Location> =
        cases.iter().filter_map(|c| if let Target::Peer(t) = c.pair.target { Some(t) } else { None }).collect();
    targets.sort_unstable();
    targets.dedup();
    let mut out = Vec::new();
    for t in targets {
        let region = a
            .alloc(node, len, Some(t))
            .await
            .map_err(|e| format!("a region of {} on node {node}'s {t}: {e}", ByteSize(len)))?;
        let contents = Contents::new(len as usize);
        for (i, piece) in contents.first().chunks(64 << 20).enumerate() {
            a.write(&region, (i as u64) << 26, piece).await.map_err(|e| e.to_string())?;
        }
        out.push((t, region, Arc::new(contents)));
    }
    Ok(out)
}

/// One peer case: `in_flight` workers, each posting its batches one after the other; a write case's blocks
/// read back in part afterwards.
pub async fn peer_case(
    a: &Agent,
    region: &vfabric::Region,
    case: &Case,
    contents: &Arc<Contents>,
) -> Result<Measured, String> {
    let slots = (region.len / case.block).max(1);
    let order = Arc::new(shuffled(slots as u32, 0x0ff5e7 ^ case.block));
    let batches = (case.total / (case.block * case.batch as u64)).max(1) as usize;
    let fill = if case.op == Op::Write { contents.next_write() } else { 0 };
    let start = Instant::now();
    let mut workers = Vec::new();
    for w in 0..case.in_flight {
        let (a, r, data, order, case) = (a.clone(), *region, Arc::clone(contents), Arc::clone(&order), *case);
        workers.push(tokio::spawn(async move {
            let mut m = Measured::default();
            for k in (w..batches).step_by(case.in_flight) {
                let posted = Instant::now();
                let mut requests = Vec::with_capacity(case.batch);
                for i in 0..case.batch {
                    let off = u64::from(order[(k * case.batch + i) % order.len()]) * case.block;
                    let (a, data) = (a.clone(), Arc::clone(&data));
                    requests.push(tokio::spawn(async move {
                        block_io(&a, &r, (case.op, fill), off, case.block, &data).await
                    }));
                }
                for q in requests {
                    m.bad += q.await.map_err(|e| e.to_string())?? as u64;
                }
                m.batch_us.push(posted.elapsed().as_secs_f64() * 1e6);
                m.bytes += case.block * case.batch as u64;
            }
            Ok::<Measured, String>(m)
        }));
    }
    let mut all = Measured::default();
    for w in workers {
        let m = w.await.map_err(|e| e.to_string())??;
        all.bytes += m.bytes;
        all.bad += m.bad;
        all.batch_us.extend(m.batch_us);
    }
    all.seconds = start.elapsed().as_secs_f64();
    if case.op == Op::Write {
        let written = (batches * case.batch).min(order.len());
        for i in (0..written).step_by((written / READ_BACK).max(1)) {
            let off = u64::from(order[i]) * case.block;
            all.bad += u64::from(block_io(a, region, (Op::Read, 0), off, case.block, contents).await?);
        }
    }
    Ok(all)
}

/// One block read (whether it differs from what the region holds) or written with fill `fill` (never
/// counted as differing: its read-back is).
async fn block_io(
    a: &Agent,
    r: &vfabric::Region,
    (op, fill): (Op, usize),
    off: u64,
    len: u64,
    contents: &Contents,
) -> Result<bool, String> {
    let (at, n) = (off as usize, len as usize);
    match op {
        Op::Write => {
            a.write(r, off, &contents.fills[fill][at..at + n]).await.map_err(|e| e.to_string())?;
            contents.wrote(fill, at, n);
            Ok(false)
        }
        Op::Read => {
            let mut buf = vec![0u8; n];
            a.read(r, off, &mut buf).await.map_err(|e| e.to_string())?;
            Ok(contents.differs(at, &buf))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contents_follow_the_writes() {
        let c = Contents::new(4 * UNIT);
        let first = c.first()[UNIT..3 * UNIT].to_vec();
        assert!(!c.differs(UNIT, &first));
        let fill = c.next_write();
        c.wrote(fill, UNIT, UNIT);
        // The first unit now holds the other fill; the second still the first.
        assert!(c.differs(UNIT, &first));
        assert!(!c.differs(2 * UNIT, &first[UNIT..]));
        let second = c.fills[fill][UNIT..2 * UNIT].to_vec();
        assert!(!c.differs(UNIT, &second));
        assert_ne!(c.next_write(), fill, "write cases alternate");
    }
}
