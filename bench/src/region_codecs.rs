//! Regions of each lossless codec side by side on the wire (`vfabric-bench remote --region-codecs`): a region
//! allocated with LZ4 or zstd crosses packed whatever `network.compression` says, so one pair of agents can time
//! packed and unpacked pages in the same run. The codecs take turns round by round (each round starting with the
//! next one), so that drift in the machine falls on all of them alike, and each is compared with the uncompressed
//! region of the same round.

use std::fmt::Write as _;
use std::sync::Arc;

use serde::Serialize;
use vfabric::agent::{Agent, Kept, Replication};
use vfabric::{ByteSize, Compression};
use vfabric_transport::Location;

use crate::stats::Summary;

/// One codec's figures over the rounds.
#[derive(Debug, Clone, Serialize)]
pub struct CodecWire {
    /// QUIC packet size.
    pub mtu: u16,
    /// The regions' compression.
    pub codec: Compression,
    /// Bytes per request.
    pub size: u64,
    /// Requests in flight.
    pub streams: usize,
    /// Rounds run.
    pub rounds: usize,
    /// Writes, Gbit/s of page payload, median of the rounds.
    pub write_gbit_s: f64,
    /// Reads, the same.
    pub read_gbit_s: f64,
    /// Median over the rounds of this codec's write Gbit/s over the uncompressed region's in the same round
    /// (`None` when `none` is not among the codecs).
    pub write_x_none: Option<f64>,
    /// The same for reads.
    pub read_x_none: Option<f64>,
    /// UDP payload bytes on the link over the page bytes, writes and reads of every round together.
    pub wire_per_payload: f64,
    /// Reads whose bytes came back different from what was written, every round together.
    pub bad: u64,
}

/// What one codec moved in one round: write and read Gbit/s.
type Round = [f64; 2];

/// `--region-codecs` and `--codec-rounds` as [`measure`] takes them: lossless codecs and `none`, a round at least.
pub fn check(codecs: &[Compression], rounds: usize) -> Result<(), String> {
    if let Some(c) = codecs.iter().find(|c| !(c.is_lossless() || **c == Compression::None)) {
        return Err(format!("--region-codecs takes none, lz4 and zstd (pages packed on the wire), not {c}"));
    }
    if rounds == 0 {
        return Err("--codec-rounds must be at least 1".into());
    }
    Ok(())
}

/// Times `codecs` (lossless ones and `none`) against a region homed at `peer`'s `home`, over packets of `mtu`: `rounds` rounds, each
/// writing then reading `total` bytes per codec in requests of `size`, `streams` at a time, `data` as the
/// requests' bytes (see [`crate::throughput::throughput`]).
#[allow(clippy::too_many_arguments)]
pub async fn measure(
    a: &Agent,
    (peer, home, mtu): (u16, Location, u16),
    region_bytes: u64,
    codecs: &[Compression],
    rounds: usize,
    (size, streams, total): (u64, usize, u64),
    data: &Arc<Vec<u8>>,
) -> Result<Vec<CodecWire>, String> {
    check(codecs, rounds)?;
    let e = |e: vfabric::FabricError| e.to_string();
    let mut figures: Vec<Vec<Round>> = vec![Vec::with_capacity(rounds); codecs.len()];
    let (mut wire, mut bad) = (vec![0u64; codecs.len()], vec![0u64; codecs.len()]);
    let bytes = (total / size).max(1) * size;
    for round in 0..rounds {
        for k in (0..codecs.len()).map(|i| (i + round) % codecs.len()) {
            eprintln!("round {}/{rounds}: {} region, {} of writes then reads", round + 1, codecs[k], ByteSize(bytes));
            // One region at a time, so that the run needs the home's room for one.
            let kept = Kept { device: Some(home), compression: codecs[k], ..Kept::default() };
            let region = a.alloc_with(peer, region_bytes, kept, Replication::default()).await.map_err(e)?;
            let timed = async {
                let before = a.link_stats(peer).await.map_err(e)?;
                let mut gbit = [0.0; 2];
                for (w, write) in [true, false].into_iter().enumerate() {
                    let (secs, wrong) =
                        crate::throughput::throughput(a, &region, write, size, streams, total, data).await?;
                    gbit[w] = bytes as f64 * 8.0 / secs / 1e9;
                    bad[k] += wrong;
                }
                let link = a.link_stats(peer).await.map_err(e)?.since(&before);
                wire[k] += link.udp_tx_bytes + link.udp_rx_bytes;
                figures[k].push(gbit);
                Ok::<(), String>(())
            };
            // Freed whatever happened, so that a failed round leaves nothing at the home.
            let timed = timed.await;
            a.free(&region).await.map_err(e)?;
            timed?;
        }
    }
    let none = codecs.iter().position(|c| *c == Compression::None);
    // Of an even number of rounds, the mean of the middle two.
    let median = |v: &mut Vec<f64>| Summary::of(v).map_or(0.0, |s| s.median);
    let x_none = |k: usize, w: usize| {
        none.map(|n| median(&mut (0..rounds).map(|r| figures[k][r][w] / figures[n][r][w]).collect()))
    };
    Ok(codecs
        .iter()
        .enumerate()
        .map(|(k, &codec)| CodecWire {
            mtu,
            codec,
            size,
            streams,
            rounds,
            write_gbit_s: median(&mut figures[k].iter().map(|f| f[0]).collect()),
            read_gbit_s: median(&mut figures[k].iter().map(|f| f[1]).collect()),
            write_x_none: x_none(k, 0),
            read_x_none: x_none(k, 1),
            wire_per_payload: wire[k] as f64 / (2 * bytes * rounds as u64).max(1) as f64,
            bad: bad[k],
        })
        .collect())
}

/// The Markdown section of `rows` (none when empty).
pub fn markdown(md: &mut String, rows: &[CodecWire], wire: &str) {
    let Some(first) = rows.first() else { return };
    let _ = writeln!(
        md,
        "\n## Regions of each codec, alternating rounds\n\nA region allocated with each codec (`Kept::compression`), \
         its pages packed on the wire whatever `network.compression` says (LZ4; zstd for a zstd region with \
         `network.wire_zstd`; here {wire}); {} rounds, each \
         writing then reading every region in turn, starting with the next codec; medians of the rounds; x none: \
         the median of each round's Gbit/s over the uncompressed region's in the same round; every read checked.\n",
        first.rounds
    );
    let _ = writeln!(
        md,
        "| packet | region | request | in flight | write Gbit/s | x none | read Gbit/s | x none | wire bytes / payload | bad |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
    let x = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.2} | {} | {:.2} | {} | {:.3} | {} |",
            r.mtu,
            r.codec,
            ByteSize(r.size),
            r.streams,
            r.write_gbit_s,
            x(r.write_x_none),
            r.read_gbit_s,
            x(r.read_x_none),
            r.wire_per_payload,
            r.bad
        );
    }
}
