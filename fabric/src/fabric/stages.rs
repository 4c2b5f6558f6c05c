//! Carrying out the directory's stages: running a call to completion ([`Fabric::drive`]), starting a stage's
//! copies (mover transfers, storage tier I/O, expansions out of the compressed tier) and waiting for them,
//! the stages that stay in flight across calls (prefetches, write-backs), and after a stage commits, moving
//! lossless regions' pages that arrived in host memory into the compressed tier.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use vfabric_allocator::{Location, COMPRESSED_BLOCK};
use vfabric_transport::PageBatch;

use super::copying::{self, Copying};
use super::node::{InFlight, State};
use super::{compressed, stalled, Fabric, Region};
use crate::directory::{Directory, DirectoryError, Stage, StageBatch, StageKind, Step, PREFETCH_DEPTH, STAGING_DEPTH};
use crate::error::FabricError;

impl Fabric {
    /// Runs a directory call to completion, carrying out each stage it asks for (and finishing the prefetch
    /// in flight when it has to wait for it).
    pub(super) fn drive<T>(
        &self,
        st: &mut State,
        mut step: impl FnMut(&mut Directory) -> Result<Step<T>, DirectoryError>,
    ) -> Result<T, FabricError> {
        // The callers check at their start (`Fabric::state`); a stage parked inside this call (packing arrivals
        // after it, say) must stop the ones after it too.
        if let Some(p) = st.parked.first() {
            return Err(stalled::stalled(&p.stage, p.started, st.copy_deadline));
        }
        // Each stage frees, moves or fills at least one frame; a bound only guards against a directory bug.
        for _ in 0..1_000_000 {
            match step(&mut st.dir)? {
                Step::Done(t) => {
                    self.pack_arrivals(st);
                    return Ok(t);
                }
                Step::Stage(stage) => self.carry_out(st, stage)?,
                Step::Wait => {
                    if st.prefetch.is_empty() {
                        return Err(FabricError::Internal(
                            "the directory waits for a prefetch the fabric does not have",
                        ));
                    }
                    let t = Instant::now();
                    let settled = self.settle_some(st);
                    self.inner.stalls.in_flight(t.elapsed());
                    settled?;
                }
            }
        }
        Err(FabricError::Internal("the directory asked for a million stages without finishing"))
    }

    /// Starts a stage's copies, waits for them (parking the stage if they pass their deadline) and commits it,
    /// or aborts it when a copy failed; counts the wait. A page that comes back wrong from the storage tier is
    /// named by its region and index.
    fn carry_out(&self, st: &mut State, stage: Stage) -> Result<(), FabricError> {
        let (t, kind) = (Instant::now(), stage.kind);
        let done = match self.start(&st.dir, &stage) {
            Ok(copies) => self.wait_or_park(st, stage, copies, t).map(|(stage, copies)| {
                let done = self.finish(&stage, copies);
                (stage, done)
            }),
            Err(e) => Ok((stage, Err(e))),
        };
        self.inner.stalls.stage(kind, t.elapsed());
        match done? {
            (stage, Ok(())) => {
                st.arrived.extend(arrivals(&stage));
                st.dir.commit(stage);
                Ok(())
            }
            (stage, Err(e)) => {
                // Named before the abort: the directory still has the slot's page where the stage read it.
                let e = copying::naming_stored_page(&st.dir, e);
                st.dir.abort(stage);
                Err(e)
            }
        }
    }

    /// Starts the prefetches the directory asks for after an acquire of `region` on `device`, if any. Failures
    /// only cost the prefetch: the acquire that wants the pages later fetches them itself.
    pub(super) fn prefetch_walk(&self, st: &mut State, region: &Region, device: Location) {
        for _ in 0..PREFETCH_DEPTH + STAGING_DEPTH {
            let stage = match self.drive(st, |d| d.step_prefetch(region, device)) {
                Ok(Some(stage)) => stage,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(%region, %device, error = %e, "making room for a prefetch failed");
                    return;
                }
            };
            if let Err(e) = self.launch(st, stage) {
                tracing::warn!(%region, %device, error = %e, "starting a prefetch failed");
                return;
            }
        }
    }

    /// Starts a stage that stays in flight across calls (a prefetch or a write-back); aborts it if a copy
    /// cannot start.
    pub(super) fn launch(&self, st: &mut State, stage: Stage) -> Result<(), FabricError> {
        let t = Instant::now();
        let started = self.start(&st.dir, &stage);
        self.inner.stalls.launch(t.elapsed());
        match started {
            Ok(copies) => {
                st.prefetch.push_back(InFlight { stage, copies, started: t });
                Ok(())
            }
            Err(e) => {
                st.dir.abort(stage);
                Err(e)
            }
        }
    }

    /// Commits the stage in flight at `i` once its copies have arrived (or, when a copy failed, aborts it: its
    /// pages stay where they were).
    fn settle(&self, st: &mut State, i: usize) {
        if let Some(p) = st.prefetch.remove(i) {
            self.settle_flight(st, p);
        }
    }

    /// Commits a stage that stayed in flight, its copies all finished (or aborts it when one failed).
    pub(super) fn settle_flight(&self, st: &mut State, p: InFlight) {
        match self.finish(&p.stage, p.copies) {
            Ok(()) => {
                st.arrived.extend(arrivals(&p.stage));
                st.dir.commit(p.stage);
            }
            Err(e) => {
                let e = copying::naming_stored_page(&st.dir, e);
                let kind = p.stage.kind;
                tracing::warn!(error = %e, ?kind, pages = p.stage.pages(), "a stage's copies failed after its call; its pages stay where they were");
                st.dir.abort(p.stage);
            }
        }
    }

    /// Commits every stage in flight whose copies have all arrived (or failed), without blocking; returns how
    /// many. Stages in flight never share a page or a frame, so they commit in any order: a write-back still
    /// running does not hold up the prefetch an acquire waits for.
    pub(super) fn settle_if_done(&self, st: &mut State) -> usize {
        let mut settled = 0;
        let mut i = 0;
        while i < st.prefetch.len() {
            if st.prefetch[i].copies.iter_mut().any(|t| !t.is_complete()) {
                i += 1;
            } else {
                self.settle(st, i);
                settled += 1;
            }
        }
        settled
    }

    /// Blocks until at least one stage in flight has landed, and commits every one that has: what a call the
    /// directory told to wait needs. Polls (the copies run on the device; a poll is one query per transfer).
    /// When every one has passed its deadline and none has landed, they are parked and the call fails.
    pub(super) fn settle_some(&self, st: &mut State) -> Result<(), FabricError> {
        while !st.prefetch.is_empty() && self.settle_if_done(st) == 0 {
            let newest = st.prefetch.iter().map(|p| p.started).max();
            if newest.is_some_and(|t| t.elapsed() >= st.copy_deadline) {
                let mut first = None;
                for p in std::mem::take(&mut st.prefetch) {
                    let e = self.park(st, p);
                    first.get_or_insert(e);
                }
                return Err(first.unwrap_or(FabricError::Internal("no prefetch to park")));
            }
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
        Ok(())
    }

    /// Zero-fills a stage's new pages and starts its copies (all batches at once).
    pub(super) fn start(&self, dir: &Directory, stage: &Stage) -> Result<Vec<Copying>, FabricError> {
        let ps = self.inner.page_size;
        // One fill per run of consecutive frames: a fill waits for the device, so per-page fills would cost a
        // synchronisation each.
        let mut zero = stage.zero.clone();
        zero.sort_unstable();
        let mut runs: Vec<(Location, u32, u32)> = Vec::new();
        for (loc, frame) in zero {
            match runs.last_mut() {
                Some((l, start, len)) if *l == loc && *start + *len == frame => *len += 1,
                _ => runs.push((loc, frame, 1)),
            }
        }
        for (loc, start, len) in runs {
            // A packed tier's slot of zeros is a packed page of zeros (codes and scales 0).
            let stride = loc.frame_bytes(ps);
            self.arena_at(dir, loc)?.fill(u64::from(start) * stride, u64::from(len) * stride, 0)?;
        }
        let mut copies = Vec::with_capacity(stage.batches.len());
        for b in &stage.batches {
            if b.from == Location::Compressed {
                // Expanded on the CPU to a GPU's or host memory's frames, or stored packed on the storage tier.
                let tier = self.arena_at(dir, b.from)?;
                if b.to == Location::Storage {
                    let storage = self
                        .inner
                        .storage
                        .as_deref()
                        .ok_or(FabricError::Internal("a stage names a storage tier this node has not"))?;
                    copies.push(compressed::store_batch(tier.as_ref(), storage, ps, &b.moves)?);
                    continue;
                }
                let dst = self.arena_at(dir, b.to)?;
                if stage.kind == StageKind::Prefetch {
                    // A prefetch stays in flight across calls: its pages expand on a thread of their own.
                    let (tier, dst, moves) = (Arc::clone(tier), Arc::clone(dst), b.moves.clone());
                    let expand = move || compressed::expand_batch(&tier, &dst, ps, &moves)?.wait();
                    copies.push(copying::behind("vfabric-expand", expand)?);
                } else {
                    copies.push(compressed::expand_batch(tier, dst, ps, &b.moves)?);
                }
                continue;
            }
            if b.to == Location::Compressed {
                return Err(FabricError::Internal("a stage copies into the compressed tier, which only packing fills"));
            }
            if copying::is_storage(b.from, b.to) {
                let storage = self
                    .inner
                    .storage
                    .as_ref()
                    .ok_or(FabricError::Internal("a stage names a storage tier this node has not"))?;
                let to_storage = b.to == Location::Storage;
                // Host memory, or the packed tier, on the other side.
                let host = self.arena_at(dir, if to_storage { b.from } else { b.to })?;
                // On a thread of its own, as a GPU's copies run on the device: the call waits for it with their
                // deadline (a drive that stopped answering fails the call instead of holding the lock for good),
                // and a stage that stays in flight (a prefetch, a write-back) leaves it running.
                let moves = b.moves.clone();
                copies.push(copying::storage_behind(storage, host, ps, moves, to_storage, b.compression)?);
                continue;
            }
            let batch = PageBatch::from_moves(ps, b.moves.clone());
            let (src, dst) = (self.arena_at(dir, b.from)?, self.arena_at(dir, b.to)?);
            copies.push(copying::mover_batch(self.inner.mover.as_ref(), src, dst, &batch, b.compression)?);
        }
        Ok(copies)
    }

    /// Waits for a stage's copies and counts the bytes.
    pub(super) fn finish(&self, stage: &Stage, copies: Vec<Copying>) -> Result<(), FabricError> {
        let ps = self.inner.page_size;
        let c = &self.inner.counters;
        let counter = match stage.kind {
            StageKind::Evict => &c.evicted,
            StageKind::Compact => &c.compacted,
            StageKind::Fetch | StageKind::Prefetch => &c.fetched,
            StageKind::Migrate => &c.migrated,
            StageKind::WriteBack => &c.written_back,
        };
        // Every copy is waited for, failed or not, before the stage can be aborted and its frames reused.
        let waited: Vec<Result<u64, FabricError>> = copies.into_iter().map(Copying::wait).collect();
        for (t, b) in waited.into_iter().zip(&stage.batches) {
            let bytes = t?;
            if b.to == Location::Storage {
                c.to_storage.fetch_add(bytes, Ordering::Relaxed);
            } else if b.from == Location::Storage {
                c.from_storage.fetch_add(bytes, Ordering::Relaxed);
            }
            // Pages moved within one device (into a run of frames) count as compaction, whatever the stage.
            let which = if b.from == b.to { &c.compacted } else { counter };
            which.fetch_add(bytes, Ordering::Relaxed);
            if stage.kind == StageKind::Prefetch && b.from != b.to {
                c.prefetched.fetch_add(bytes, Ordering::Relaxed);
                if b.from == Location::Storage {
                    c.prefetched_from_storage.fetch_add(bytes, Ordering::Relaxed);
                }
            }
        }
        counter.fetch_add(stage.zero.len() as u64 * ps, Ordering::Relaxed);
        c.stages.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Moves lossless regions' pages that stages brought to host memory's frames from a GPU, or host writes filled
    /// whole (`State::arrived`), into the compressed tier: each that shrinks by a block is packed into a run of
    /// its length, making room there as it goes (the tier's least recently used pages go to the storage tier),
    /// unless its region's recent pages did not shrink (`ProbeSkips`). Runs when a directory call is done, not
    /// between its stages, so that making room never evicts what the call is bringing up. A failure only leaves
    /// pages where they are.
    pub(super) fn pack_arrivals(&self, st: &mut State) {
        // Packing changes the directory: not while a stage is parked (the frames wait for a later call).
        if !st.parked.is_empty() {
            return;
        }
        let frames = std::mem::take(&mut st.arrived);
        let mut pages: Vec<compressed::Packing> = frames
            .into_iter()
            .filter_map(|frame| {
                let (page, compression) = st.dir.compressible(frame)?;
                Some(compressed::Packing { frame, page, compression, run: None })
            })
            .collect();
        if pages.is_empty() {
            return;
        }
        let arenas = self.arena_at(&st.dir, Location::Host).and_then(|h| {
            let tier = self.arena_at(&st.dir, Location::Compressed)?;
            Ok((Arc::clone(h), Arc::clone(tier)))
        });
        let (host, tier) = match arenas {
            Ok(a) => a,
            Err(e) => return tracing::warn!(error = %e, "the compressed tier cannot be reached"),
        };
        let ps = self.inner.page_size;
        let t = Instant::now();
        let c = &self.inner.counters;
        match compressed::pack_all(host.as_ref(), ps, &mut pages, &mut st.probes) {
            Ok(skipped) => c.compress_skipped.fetch_add(skipped * ps, Ordering::Relaxed),
            Err(e) => {
                return tracing::warn!(error = %e, "packing pages for the compressed tier failed; they stay in host memory")
            }
        };
        for p in pages {
            c.compress_tried.fetch_add(ps, Ordering::Relaxed);
            let Some(run) = p.run else { continue };
            let blocks = (run.len() as u64 / COMPRESSED_BLOCK) as u32;
            let start = match st.dir.compressed_fit(blocks) {
                Some(s) => s,
                // Full, and nothing can leave, or no run that long for now: this page stays in host memory (a
                // shorter one may still fit).
                None => match self.drive(st, |d| d.step_compressed_room(blocks)) {
                    Ok(true) => match st.dir.compressed_fit(blocks) {
                        Some(s) => s,
                        None => continue,
                    },
                    Ok(false) => continue,
                    // Making room parked its stage: nothing more changes the directory until it lands.
                    Err(e @ FabricError::Stalled { .. }) => {
                        return tracing::warn!(error = %e, "packing for the compressed tier stops");
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "making room in the compressed tier failed");
                        continue;
                    }
                },
            };
            // Making room may have moved the page itself (to the storage tier, host memory being full).
            if st.dir.compressible(p.frame).map(|c| c.0) != Some(p.page) {
                continue;
            }
            let placed = tier
                .write(u64::from(start) * COMPRESSED_BLOCK, &run)
                .map_err(FabricError::from)
                .and_then(|()| Ok(st.dir.place_compressed(p.frame, p.page, start, blocks)?));
            match placed {
                Ok(()) => {
                    c.compressed.fetch_add(ps, Ordering::Relaxed);
                    c.compressed_bytes.fetch_add(run.len() as u64, Ordering::Relaxed);
                }
                Err(e) => tracing::warn!(error = %e, frame = p.frame, "a page could not move to the compressed tier"),
            }
        }
        self.inner.stalls.packing(t.elapsed());
    }
}

/// The frames of host memory a stage brought pages to from a GPU, to be packed into the compressed tier: those
/// of evictions, write-backs and migrations (pages that stay there); not fetches (a lease or a host read is
/// about to take them).
fn arrivals(stage: &Stage) -> Vec<u32> {
    if !matches!(stage.kind, StageKind::Evict | StageKind::WriteBack | StageKind::Migrate) {
        return Vec::new();
    }
    let from_gpu = |b: &&StageBatch| b.from.gpu().is_some() && b.to == Location::Host;
    stage.batches.iter().filter(from_gpu).flat_map(|b| b.moves.iter().map(|m| m.dst)).collect()
}
