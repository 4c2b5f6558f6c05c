//! Regions whose pages live on another node than their home, and the location hints that find them.
//!
//! A region's global address names its home for the region's whole life; a migration to another node's device
//! ([`Agent::migrate_to`]) does not change that. The home copies the pages into a region of its own making on
//! the target node (the *hosted* copy), frees its own, and keeps a forwarding entry: a request that names the
//! region at the home is answered `Moved { to }`. The requester follows it and caches `to` as a *hint*, so its
//! next calls go straight to the node that has the pages. A hint goes stale when the region moves again (or is
//! freed): the hosted copy it names is gone, the node answers `Moved` while it still forwards (see below) and
//! then `UseAfterFree` (its generation check sees a freed handle, also when the slot holds a newer region), and
//! the requester drops the hint and asks the home.
//!
//! While a region moves, no write may land in pages being copied away and no write may be lost: every
//! operation on a region of this node holds a read guard on the region's entry in [`Moves`] while it runs, and
//! a migration holds the write guard from the first copied byte until the forwarding entry is in place. Pages
//! that already moved are moved on by the home of the copy that has them, under its guard for that copy (writes
//! reach that copy directly through hints), which forwards to the new copy while the move runs; the region's
//! home then points at the new copy and has the old copy's node drop its entry (`Unforward`), so only a
//! region's home forwards for good. The
//! guards are per region, so two nodes moving regions to each other at once cannot wait on each other. A region
//! with a lease held on it is not moved (freeing the old copy fails, so the migration is undone).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedRwLockReadGuard, RwLock};
use vfabric_transport::Location;

use super::{in_place, lanes_for, unexpected, Agent, LaneUse, ReadInto};
use crate::directory::Placement;
use crate::error::FabricError;
use crate::fabric::Region;
use crate::proto::{ErrorKind, Message, WireRegion};

/// The forwarding entries of a home, one lock per region of this node that an operation has named: `None`
/// while its pages are here, `Some(to)` once they moved to region `to` (on the node its address names).
#[derive(Default)]
pub(super) struct Moves {
    regions: std::sync::Mutex<Entries>,
}

/// The entries, and the size at which the next one made sweeps out those no longer needed.
#[derive(Default)]
struct Entries {
    map: HashMap<Region, Arc<RwLock<Option<Region>>>>,
    sweep_at: usize,
}

/// The fewest entries kept before a sweep.
const SWEEP_FLOOR: usize = 1024;

impl Entries {
    /// Drops the entries that no operation holds and that forward nowhere: an operation makes one for every
    /// region it names, regions that are freed or never existed included (a peer may name any), and without
    /// this the table would only grow. Run under the table's lock, where no one can take an entry meanwhile,
    /// so an entry that nobody holds stays unheld until it is gone. Sweeping again only once the table has
    /// doubled keeps the cost per entry made constant.
    fn sweep(&mut self) {
        self.map.retain(|_, e| Arc::strong_count(e) > 1 || e.try_read().map_or(true, |to| to.is_some()));
        self.sweep_at = (2 * self.map.len()).max(SWEEP_FLOOR);
    }
}

impl Moves {
    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.regions.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn entry(&self, region: &Region) -> Arc<RwLock<Option<Region>>> {
        let mut entries = self.entries();
        if entries.map.len() >= entries.sweep_at {
            entries.sweep();
        }
        Arc::clone(entries.map.entry(*region).or_default())
    }

    fn forget(&self, region: &Region) {
        self.entries().map.remove(region);
    }

    /// How many entries there are (regions named since the last sweep, and those moved away).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries().map.len()
    }

    /// Drops the forwarding entry of `region`, a copy whose pages moved on to `to`, once its region's home
    /// sends no caller there any more; any other entry stays (one whose pages are here, or that names another
    /// region: a stale or misdirected request changes nothing). Callers that waited on it, and later ones, then
    /// reach the fabric, which says the copy is gone (and they ask the home).
    pub(super) async fn unforward(&self, region: &Region, to: &Region) {
        let existing = self.entries().map.get(region).cloned();
        let Some(entry) = existing else { return };
        let mut entry = entry.write_owned().await;
        if entry.as_ref() == Some(to) {
            *entry = None;
            self.forget(region);
        }
    }

    /// How many regions of this node have their pages elsewhere (an entry being changed right now may be left
    /// out).
    pub(super) fn forwarding(&self) -> usize {
        self.entries().map.values().filter(|e| e.try_read().is_ok_and(|to| to.is_some())).count()
    }

    /// For an operation on `region`, a region of this node: a read guard that keeps it from moving while the
    /// operation runs, or `Moved` when its pages are elsewhere.
    pub(super) async fn staying(&self, region: &Region) -> Result<OwnedRwLockReadGuard<Option<Region>>, FabricError> {
        let guard = self.entry(region).read_owned().await;
        match *guard {
            Some(to) => Err(FabricError::Moved { to }),
            None => Ok(guard),
        }
    }
}

/// How many times one call follows a `Moved` answer or drops a stale hint before it gives up.
const MAX_HOPS: usize = 4;

/// Bytes copied per step when a region moves between nodes (bounds the copy buffer).
const MOVE_PIECE: u64 = 64 << 20;

/// The smallest part of a read or write striped over several lanes: below it, the cost of a call outweighs
/// what another core adds.
const MIN_STRIPE: usize = 256 << 10;

/// Where one call on a region goes: the hint when there is one, else the region itself (its home), following
/// `Moved` answers and dropping stale hints. Callers loop over `target()`, their attempt, and `settle()`; a
/// helper taking the attempt as an async closure would be shorter, but its future cannot be proven `Send` on
/// stable Rust, and the agent's calls run in spawned tasks.
pub(super) struct Route<'a> {
    agent: &'a Agent,
    region: Region,
    target: Region,
    hops: usize,
}

impl<'a> Route<'a> {
    pub(super) fn new(agent: &'a Agent, region: &Region) -> Route<'a> {
        let target = agent.hints().get(region).copied().unwrap_or(*region);
        Route { agent, region: *region, target, hops: 0 }
    }

    /// The region to name in the next attempt (the hosted copy, or the region itself).
    pub(super) fn target(&self) -> Region {
        self.target
    }

    /// The attempt's outcome, or `None` to try again at the new target: after `Moved` (the hint is kept) or
    /// after a stale hint failed (it is dropped and the home is asked).
    pub(super) fn settle<T>(&mut self, r: Result<T, FabricError>) -> Option<Result<T, FabricError>> {
        if self.hops >= MAX_HOPS {
            return Some(r);
        }
        match &r {
            Err(FabricError::Moved { to }) => {
                self.agent.hints().insert(self.region, *to);
                self.target = *to;
            }
            Err(e) if self.target != self.region && is_stale(e) => {
                let mut hints = self.agent.hints();
                if hints.get(&self.region) == Some(&self.target) {
                    hints.remove(&self.region);
                }
                self.target = self.region;
            }
            _ => return Some(r),
        }
        self.hops += 1;
        None
    }
}

/// One transfer counted in flight to a peer while it lives.
pub(super) struct InFlight<'a> {
    counter: &'a AtomicUsize,
    /// Transfers in flight when this one entered, itself included.
    count: usize,
}

impl<'a> InFlight<'a> {
    fn enter(counter: &'a AtomicUsize) -> InFlight<'a> {
        let count = counter.fetch_add(1, Ordering::AcqRel) + 1;
        InFlight { counter, count }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether an error says that the region named is gone: a hint to a hosted copy that moved on.
fn is_stale(e: &FabricError) -> bool {
    matches!(
        e,
        FabricError::UseAfterFree(_)
            | FabricError::InvalidAddress(_)
            | FabricError::Remote { kind: ErrorKind::UseAfterFree | ErrorKind::InvalidAddress, .. }
    )
}

impl Agent {
    pub(super) fn hints(&self) -> std::sync::MutexGuard<'_, HashMap<Region, Region>> {
        self.shared.hints.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// See [`Moves::staying`].
    pub(super) async fn staying(&self, region: &Region) -> Result<OwnedRwLockReadGuard<Option<Region>>, FabricError> {
        self.shared.moves.staying(region).await
    }

    /// Frees a region of this node: its hosted copy too when it moved.
    pub(super) async fn free_at_home(&self, region: &Region) -> Result<(), FabricError> {
        let mut entry = self.shared.moves.entry(region).write_owned().await;
        match *entry {
            None => in_place(|| self.shared.fabric.free(region))?,
            Some(to) => self.free_direct(&to).await?,
        }
        // Callers that waited on this entry now go to the fabric, which says the region is gone.
        *entry = None;
        self.shared.moves.forget(region);
        Ok(())
    }

    /// Moves a region of this node to `device` of `node`; returns the region that has the pages now (the region
    /// itself when they stayed on this node). Undone when any step fails, so the region is left where it was.
    pub(super) async fn migrate_at_home(
        &self,
        region: &Region,
        node: u16,
        device: Location,
    ) -> Result<Region, FabricError> {
        self.peer_or_self(node)?;
        let mut entry = self.shared.moves.entry(region).write_owned().await;
        let before = *entry;
        let now = match before {
            // The pages are here: they move under this region's guard.
            None => self.move_pages(region, node, device).await?,
            // They are on another node (or in another region here): that copy's own home moves them, under its
            // guard for that copy, so writes that reach it through hints wait there and then follow it.
            Some(current) => self.migrate_hosted(&current, node, device).await?,
        };
        if now != *region {
            tracing::info!(region = %region, node, device = %device, "a region's pages moved to another node");
        }
        *entry = (now != *region).then_some(now);
        drop(entry);
        // The copy that had the pages forwarded to the new one while this entry still named it; now that it
        // names the new one, the old copy's entry may go. Only this node's own entries keep forwarding for
        // good, so a region that moves often leaves none behind.
        if let Some(old) = before.filter(|&old| old != now) {
            self.unforward(&old, &now).await;
        }
        Ok(now)
    }

    /// Has the node of `copy` (a copy that held one of this node's regions' pages and moved them on to `to`)
    /// drop its forwarding entry ([`Moves::unforward`]). A failure is logged: the entry only stays.
    async fn unforward(&self, copy: &Region, to: &Region) {
        let at = copy.addr.node().0;
        if at == self.shared.node {
            return self.shared.moves.unforward(copy, to).await;
        }
        let msg = Message::Unforward { region: WireRegion::from(copy), to: WireRegion::from(to) };
        match self.call(at, &msg, &[]).await {
            Ok(Message::Done) => {}
            Ok(other) => tracing::warn!(node = at, copy = %copy, error = %unexpected(at, &other), "unforward"),
            Err(e) => tracing::warn!(node = at, copy = %copy, error = %e, "the forwarding entry of a copy stays"),
        }
    }

    /// Moves the pages of `region`, which are here: a migration on this node, or a copy into a new region on
    /// `node` and this copy freed.
    async fn move_pages(&self, region: &Region, node: u16, device: Location) -> Result<Region, FabricError> {
        if node == self.shared.node {
            in_place(|| self.shared.fabric.migrate(region, device))?;
            return Ok(*region);
        }
        // The region must be live before anything is allocated for it.
        self.shared.fabric.version(region, 0..1)?;
        let fresh = self.alloc_direct(node, region.len, device).await?;
        let moved = async {
            self.copy_direct(region, &fresh, region.len).await?;
            in_place(|| self.shared.fabric.free(region))
        };
        if let Err(e) = moved.await {
            if let Err(undo) = self.free_direct(&fresh).await {
                tracing::warn!(region = %fresh, error = %undo, "freeing the copy of a failed migration failed");
            }
            return Err(e);
        }
        Ok(fresh)
    }

    /// Asks the home of `current` (a copy that has a region's pages) to move it; returns where they are now.
    async fn migrate_hosted(&self, current: &Region, node: u16, device: Location) -> Result<Region, FabricError> {
        let at = current.addr.node().0;
        if at == self.shared.node {
            return Box::pin(self.migrate_at_home(current, node, device)).await;
        }
        let msg = Message::MigrateTo { region: WireRegion::from(current), node, device: device.into() };
        match self.call(at, &msg, &[]).await {
            // `MigrateTo` is answered with where the pages are now.
            Err(FabricError::Moved { to }) => Ok(to),
            Ok(other) => Err(unexpected(at, &other)),
            Err(e) => Err(e),
        }
    }

    fn peer_or_self(&self, node: u16) -> Result<(), FabricError> {
        if node == self.shared.node {
            return Ok(());
        }
        self.peer(node).map(|_| ())
    }

    // The `*_direct` calls name a region of the node its address says, with no routing and no guard: the
    // migration that uses them holds the write guard already.

    async fn alloc_direct(&self, node: u16, size: u64, device: Location) -> Result<Region, FabricError> {
        if node == self.shared.node {
            return in_place(|| self.shared.fabric.alloc(size, Placement::on(device)));
        }
        match self.call(node, &Message::Alloc { size, device: Some(device.into()) }, &[]).await? {
            Message::Allocated { region } => Ok(Region::from(&region)),
            other => Err(unexpected(node, &other)),
        }
    }

    pub(super) async fn free_direct(&self, region: &Region) -> Result<(), FabricError> {
        let node = region.addr.node().0;
        if node == self.shared.node {
            return in_place(|| self.shared.fabric.free(region));
        }
        match self.call(node, &Message::Free { region: WireRegion::from(region) }, &[]).await? {
            Message::Done => Ok(()),
            other => Err(unexpected(node, &other)),
        }
    }

    /// Copies `len` bytes from one region to another (either may be here or on a peer) in bounded pieces.
    async fn copy_direct(&self, from: &Region, to: &Region, len: u64) -> Result<(), FabricError> {
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
    pub(super) async fn read_direct(&self, region: &Region, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        let node = region.addr.node().0;
        if node == self.shared.node {
            return in_place(|| self.shared.fabric.read(region, offset, buf));
        }
        let (lanes, part, _in_flight) = self.stripes(node, buf.len())?;
        // An empty read is one call too: the home checks its bounds.
        let pieces: Vec<&mut [u8]> = if buf.is_empty() { vec![buf] } else { buf.chunks_mut(part).collect() };
        let reads = pieces.into_iter().zip(lanes).enumerate().map(|(i, (piece, lane))| async move {
            let at = offset + (i * part) as u64;
            let msg = Message::Read { region: WireRegion::from(region), offset: at, len: piece.len() as u64 };
            let want = piece.len() as u64;
            match self.call_read_some(node, &lane, &msg, ReadInto::Buf { buf: piece, offset: at }, |_| want).await? {
                Message::Data { len } if len == want => Ok(()),
                other => Err(unexpected(node, &other)),
            }
        });
        futures_util::future::try_join_all(reads).await.map(|_| ())
    }

    /// Writes to a region of this node or a peer; a long write to a peer is striped over its lanes (a failure
    /// leaves the parts that arrived written, as a failed chunk of one call does).
    pub(super) async fn write_direct(&self, region: &Region, offset: u64, data: &[u8]) -> Result<(), FabricError> {
        let node = region.addr.node().0;
        if node == self.shared.node {
            return in_place(|| self.shared.fabric.write(region, offset, data));
        }
        let (lanes, part, _in_flight) = self.stripes(node, data.len())?;
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

    /// How a transfer of `len` bytes to or from peer `node` is split: the lanes its parts take (the least busy
    /// of those [`lanes_for`] gives: a bulk transfer leaves the latency lane alone), each held until its part's
    /// call ends, the bytes per part, and the count of transfers in flight to the peer, this one included, for
    /// as long as the transfer holds it. Each lane's connection is driven by its own tasks, on a core at a time,
    /// so a call alone uses several cores at once instead of one; with others in flight it takes its share of the lanes (one when
    /// there are as many transfers as lanes: more, smaller calls would only add per-call work), and no part is
    /// under [`MIN_STRIPE`].
    fn stripes(&self, node: u16, len: usize) -> Result<(Vec<LaneUse>, usize, InFlight<'_>), FabricError> {
        self.lane_loads(node)?; // `node` is a node of the cluster: `transfers` has its entry
        let lanes = lanes_for(&self.shared.net, len as u64).len();
        let in_flight = InFlight::enter(&self.shared.transfers[usize::from(node)]);
        let parts = (lanes / in_flight.count).min(len / MIN_STRIPE).max(1);
        let lanes = self.take_lanes(node, parts, len as u64)?;
        let part = len.div_ceil(lanes.len().max(1)).max(1);
        Ok((lanes, part, in_flight))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(slot: u32) -> Region {
        Region::from(&WireRegion {
            addr: (1u64 << 48) | u64::from(slot) << 21,
            len: 1 << 21,
            page_size: 1 << 21,
            slot,
            generation: 1,
        })
    }

    #[test]
    fn entries_nobody_needs_are_swept_and_the_others_kept() {
        tokio::runtime::Builder::new_current_thread().build().expect("runtime").block_on(async {
            let moves = Moves::default();
            // A region that moved away, and one an operation holds while the table fills.
            let moved = region(0);
            *moves.entry(&moved).write().await = Some(region(1));
            let held = moves.staying(&region(2)).await.expect("not moved");
            // A peer naming region after region that does not exist (each call makes an entry, then lets go).
            for slot in 3..20_000 {
                drop(moves.staying(&region(slot)).await.expect("not moved"));
                assert!(moves.len() <= 2 * SWEEP_FLOOR + 2, "{} entries after {slot} names", moves.len());
            }
            assert!(matches!(moves.staying(&moved).await, Err(FabricError::Moved { to }) if to == region(1)));
            assert_eq!(moves.forwarding(), 1, "the forwarding entry outlived every sweep");
            assert_eq!(Arc::strong_count(&moves.entry(&region(2))), 3, "the held entry is the one in the table");
            drop(held);
        });
    }
}
