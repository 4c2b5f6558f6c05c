//! The cases of `vfabric-bench sweep` (see `sweep`): initiator/target pairs, and batches of blocks between two
//! locations of this node through the fabric's mover or between this node and a peer's agent over QUIC.

use std::sync::Arc;

use serde::Serialize;
use vfabric::pattern::shuffled;
use vfabric::ByteSize;
use vfabric_transport::{EngineChoice, Location, Mover, PageBatch, PageMove};

use crate::rig::Rig;

/// Which way a case moves blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// From the target to the initiator.
    Read,
    /// From the initiator to the target.
    Write,
}

/// Where a target is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A location of this node.
    Here(Location),
    /// A location of the peer node.
    Peer(Location),
}

/// An initiator (a location of this node) and a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pair {
    /// Where the initiator's blocks are.
    pub initiator: Location,
    /// Where the target's are.
    pub target: Target,
}

impl std::str::FromStr for Pair {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let loc = |t: &str| t.parse::<Location>().map_err(|e| format!("pair `{s}`: {e}"));
        let (a, b) = s.split_once('/').ok_or_else(|| format!("`{s}`: write INITIATOR/TARGET, e.g. gpu0/host"))?;
        let target = match b.strip_prefix("peer:") {
            Some(t) => Target::Peer(loc(t)?),
            None => Target::Here(loc(b)?),
        };
        let pair = Pair { initiator: loc(a)?, target };
        match pair.target {
            Target::Here(t) if t == pair.initiator => Err(format!("pair `{s}`: two different locations")),
            Target::Peer(_) if pair.initiator != Location::Host => {
                Err(format!("pair `{s}`: a peer's memory is reached from this node's host memory (host/peer:...)"))
            }
            _ if matches!(pair.target, Target::Here(Location::Storage) | Target::Peer(Location::Storage))
                || pair.initiator == Location::Storage =>
            {
                Err(format!("pair `{s}`: the storage tier is measured by `vfabric-bench storage`"))
            }
            _ => Ok(pair),
        }
    }
}

impl std::fmt::Display for Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.target {
            Target::Here(t) => write!(f, "{}/{t}", self.initiator),
            Target::Peer(t) => write!(f, "{}/peer:{t}", self.initiator),
        }
    }
}

/// One point of the grid.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// Between where.
    pub pair: Pair,
    /// Which way.
    pub op: Op,
    /// Bytes per block.
    pub block: u64,
    /// Blocks per batch.
    pub batch: usize,
    /// Batches in flight.
    pub in_flight: usize,
    /// Bytes to move in all.
    pub total: u64,
}

impl Case {
    /// The case, for the progress lines.
    pub fn describe(&self) -> String {
        format!(
            "{} {:?}: {} blocks, {} a batch, {} batch(es) in flight",
            self.pair,
            self.op,
            ByteSize(self.block),
            self.batch,
            self.in_flight
        )
    }

    /// Bytes of one round: every batch in flight once.
    pub fn round_bytes(&self) -> u64 {
        self.block * (self.batch * self.in_flight) as u64
    }
}

/// What a case measured.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct Measured {
    /// Bytes moved.
    pub bytes: u64,
    /// Seconds, wall clock.
    pub seconds: f64,
    /// Each batch's time from its posting to its completion, microseconds.
    pub batch_us: Vec<f64>,
    /// Blocks that arrived different.
    pub bad: u64,
}

/// A case between two locations of this node: rounds of `in_flight` batches of `batch` scattered pages
/// (block-sized) submitted to `mover` at once, until the case's bytes are moved; the last round's pages checked.
/// Returns the figures and the plain copy's GB/s for one round's bytes.
pub fn local_case(
    rig: &Rig,
    mover: &Arc<dyn Mover>,
    case: &Case,
    target: Location,
    engine: EngineChoice,
) -> Result<(Measured, f64), String> {
    let (from, to) = match case.op {
        Op::Write => (case.pair.initiator, target),
        Op::Read => (target, case.pair.initiator),
    };
    let half = (rig.region() / case.block) as u32;
    let per_round = case.batch * case.in_flight;
    if per_round as u64 > u64::from(half) {
        return Err(format!("{}: a round's {} blocks exceed the region's {half}", case.describe(), per_round));
    }
    let src = shuffled(half, 0x5eed ^ case.block);
    let dst = shuffled(half, 0xd57 ^ case.block);
    let rounds = (case.total / case.round_bytes()).max(1) as usize;
    rig.poison(&[(from, to)])?;
    let mut m = Measured::default();
    let mut last = Vec::new();
    for r in 0..rounds {
        let legs: Vec<(Location, Location, PageBatch)> = (0..case.in_flight)
            .map(|j| {
                let first = (r * per_round + j * case.batch) % half as usize;
                let moves = (0..case.batch)
                    .map(|i| {
                        let k = (first + i) % half as usize;
                        PageMove { src: src[k], dst: half + dst[k] }
                    })
                    .collect();
                (from, to, PageBatch::from_moves(case.block, moves))
            })
            .collect();
        let timing = rig.run(mover, &legs, engine)?;
        m.seconds += timing.wall;
        m.batch_us.extend(timing.done.iter().map(|s| s * 1e6));
        m.bytes += case.round_bytes();
        last = legs;
    }
    for (f, t, b) in &last {
        m.bad += rig.verify(*f, *t, b)? as u64;
    }
    let mut plain = Vec::new();
    for _ in 0..3 {
        plain.push(rig.baseline(&[(from, to)], case.round_bytes())?);
    }
    plain.sort_by(|a, b| a.total_cmp(b));
    Ok((m, case.round_bytes() as f64 / plain[1] / 1e9))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_parse_and_refuse_what_cannot_run() {
        let p: Pair = "gpu0/host".parse().expect("pair");
        assert_eq!((p.initiator, p.target), (Location::Gpu(0), Target::Here(Location::Host)));
        let p: Pair = "host/peer:gpu1".parse().expect("pair");
        assert_eq!((p.initiator, p.target), (Location::Host, Target::Peer(Location::Gpu(1))));
        assert_eq!(p.to_string(), "host/peer:gpu1");
        for bad in ["gpu0", "gpu0/gpu0", "gpu0/peer:host", "host/storage", "host/peer:tpu"] {
            assert!(bad.parse::<Pair>().is_err(), "{bad}");
        }
    }
}
