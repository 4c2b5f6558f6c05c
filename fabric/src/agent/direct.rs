//! Calls that name a region of the node its address says, with no routing and no guard: this node's fabric,
//! or one call (striped over the lanes when long) to the peer. The routed calls of the API and the migrations
//! (which hold the region's guard already) are built on them.

use super::calls::ReadInto;
use super::replication::{Kept, Replication};
use super::shared::{in_place, lock, Agent};
use crate::directory::RegionHandle as Region;
use crate::error::FabricError;
use crate::proto::convert::{self, unexpected};
use crate::proto::message::{Message, WireRegion};

/// The smallest part of a read or write striped over several lanes: below it, the cost of a call outweighs
/// what another core adds.
const MIN_STRIPE: usize = 256 << 10;

/// Bytes copied per step when a region moves between nodes (bounds the copy buffer).
const MOVE_PIECE: u64 = 64 << 20;

impl Agent {
    /// Allocates a region of `size` bytes on `node`, placed there as `kept` says, kept on `replicas` nodes
    /// (`0`: the cluster's `network.replicas`).
    pub(crate) async fn alloc_direct(
        &self,
        node: u16,
        size: u64,
        kept: Kept,
        keep: Replication,
    ) -> Result<Region, FabricError> {
        if self.is_me(node) {
            return self.alloc_at_home(size, kept, keep).await;
        }
        let msg = Message::Alloc {
            size,
            device: kept.device.map(Into::into),
            replicas: keep.replicas,
            lag_ms: keep.lag_ms(),
            compression: kept.compression.number(),
            priority: convert::priority_number(kept.priority),
        };
        match self.call(node, &msg, &[]).await? {
            Message::Allocated { region } => {
                let region = Region::from(&region);
                if kept.compression.is_lossless() {
                    lock(&self.shared.lossless).insert(region.addr, kept.compression);
                }
                Ok(region)
            }
            other => Err(unexpected(node, &other)),
        }
    }

    /// Frees a region of this node's fabric or a peer's (only that region: no forwarding is followed).
    pub(crate) async fn free_direct(&self, region: &Region) -> Result<(), FabricError> {
        let node = region.addr.node().0;
        if self.is_me(node) {
            return in_place(|| self.shared.fabric.free(region));
        }
        match self.call(node, &Message::Free { region: WireRegion::from(region) }, &[]).await? {
            Message::Done => Ok(()),
            other => Err(unexpected(node, &other)),
        }
    }

    /// Copies `len` bytes from one region to another (either may be here or on a peer) in bounded pieces.
    pub(crate) async fn copy_direct(&self, from: &Region, to: &Region, len: u64) -> Result<(), FabricError> {
        let mut buf = vec![0u8; len.min(MOVE_PIECE) as usize];
        let mut at = 0;
        while at < len {
            let n = (len - at).min(MOVE_PIECE) as usize;
            self.read_direct(from, at, &mut buf[..n]).await?;
            self.write_direct(to, at, &buf[..n]).await?;
            at += n as u64;
        }
        Ok(())
    }

    /// Reads from a region of this node or a peer; a long read from a peer is striped over its lanes.
    pub(crate) async fn read_direct(&self, region: &Region, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        let node = region.addr.node().0;
        if self.is_me(node) {
            return in_place(|| self.shared.fabric.read(region, offset, buf));
        }
        self.peer(node)?;
        let (lanes, part, _in_flight) = self.shared.loads.stripes(node, buf.len(), MIN_STRIPE)?;
        // An empty read is one call too: the home checks its bounds.
        let pieces: Vec<&mut [u8]> = if buf.is_empty() { vec![buf] } else { buf.chunks_mut(part).collect() };
        let reads = pieces.into_iter().zip(lanes).enumerate().map(|(i, (piece, lane))| async move {
            let at = offset + (i * part) as u64;
            let want = piece.len() as u64;
            let msg = Message::Read { region: WireRegion::from(region), offset: at, len: want };
            match self.call_read(node, &lane, &msg, ReadInto::Buf { buf: piece, offset: at }, |_| want).await? {
                Message::Data { len } if len == want => Ok(()),
                other => Err(unexpected(node, &other)),
            }
        });
        futures_util::future::try_join_all(reads).await.map(|_| ())
    }

    /// Writes to a region of this node or a peer; a long write to a peer is striped over its lanes (a failure
    /// leaves the parts that arrived written, as a failed chunk of one call does).
    pub(crate) async fn write_direct(&self, region: &Region, offset: u64, data: &[u8]) -> Result<(), FabricError> {
        let node = region.addr.node().0;
        if self.is_me(node) {
            return in_place(|| self.shared.fabric.write(region, offset, data));
        }
        self.peer(node)?;
        let (lanes, part, _in_flight) = self.shared.loads.stripes(node, data.len(), MIN_STRIPE)?;
        let pieces: Vec<&[u8]> = if data.is_empty() { vec![data] } else { data.chunks(part).collect() };
        let writes = pieces.into_iter().zip(lanes).enumerate().map(|(i, (piece, lane))| async move {
            let at = offset + (i * part) as u64;
            let msg = Message::Write { region: WireRegion::from(region), offset: at, len: piece.len() as u64 };
            match self.call_on(node, &lane, &msg, piece).await? {
                Message::Done => Ok(()),
                other => Err(unexpected(node, &other)),
            }
        });
        futures_util::future::try_join_all(writes).await.map(|_| ())
    }
}
