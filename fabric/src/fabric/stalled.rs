//! Copies that pass their deadline (`device.copy_deadline_ms`). A stage's copies cannot be abandoned: its
//! destination frames stay the device's to write until they finish, so the stage can be neither committed nor
//! aborted. It is parked instead, with its copies, and the call that waited for it fails with
//! [`FabricError::Stalled`] naming it. While a stage is parked, the calls that would plan new stages (which
//! must see the parked one's outcome first) fail with the same error at once, without waiting; releases and
//! given-back reservations are kept for later; reads, leases' bytes and figures go on. Each gated call first
//! looks whether the parked copies have finished: once all have, their stages commit (or abort, if a copy
//! failed) as they would have in the call, the kept releases apply, and the fabric goes on.

use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use super::copying::{self, Copying};
use super::node::{lock, Deferred, InFlight, State};
use super::{Fabric, Region};
use crate::directory::Stage;
use crate::error::FabricError;

impl Fabric {
    /// The fabric's state for a call that plans stages: `Stalled` while a stage is parked (after taking in
    /// those whose copies have finished since).
    pub(super) fn state(&self) -> Result<MutexGuard<'_, State>, FabricError> {
        let mut st = lock(&self.inner.state);
        self.unpark(&mut st)?;
        Ok(st)
    }

    /// Commits (or aborts) every parked stage whose copies have all finished; once none is left, applies the
    /// changes kept meanwhile. The error for the oldest stage still parked.
    pub(super) fn unpark(&self, st: &mut State) -> Result<(), FabricError> {
        if st.parked.is_empty() {
            return Ok(());
        }
        let mut i = 0;
        while i < st.parked.len() {
            if st.parked[i].copies.iter_mut().any(|c| !c.is_complete()) {
                i += 1;
                continue;
            }
            let p = st.parked.remove(i);
            tracing::info!(
                stage = %describe(&p.stage),
                after_s = p.started.elapsed().as_secs_f64(),
                "stalled copies finished; the fabric takes them in"
            );
            self.settle_flight(st, p);
        }
        match st.parked.first() {
            Some(p) => Err(stalled(&p.stage, p.started, st.copy_deadline)),
            None => {
                for d in std::mem::take(&mut st.deferred) {
                    self.apply(st, d);
                }
                Ok(())
            }
        }
    }

    /// Waits for `copies` until `deadline`; past it, parks the stage with them and returns the error naming it.
    pub(super) fn wait_or_park(
        &self,
        st: &mut State,
        stage: Stage,
        mut copies: Vec<Copying>,
        started: Instant,
    ) -> Result<(Stage, Vec<Copying>), FabricError> {
        if copying::all_done_by(&mut copies, started + st.copy_deadline) {
            return Ok((stage, copies));
        }
        Err(self.park(st, InFlight { stage, copies, started }))
    }

    /// Frees a region for a caller that has gone (a local client that left): now, or once no stage is parked.
    pub(crate) fn free_or_defer(&self, region: &Region) -> Result<(), FabricError> {
        let mut st = lock(&self.inner.state);
        if self.unpark(&mut st).is_err() {
            st.deferred.push(Deferred::Free(*region));
            return Ok(());
        }
        drop(st);
        self.free(region)
    }

    /// Applies a change kept while a stage was parked (kept again if one before it parked a stage of its
    /// own); a failure is logged (its caller has gone).
    fn apply(&self, st: &mut State, d: Deferred) {
        match d {
            Deferred::Unreserve(id) => st.unreserve_or_defer(id),
            Deferred::Free(region) if !st.parked.is_empty() => st.deferred.push(Deferred::Free(region)),
            Deferred::Free(region) => {
                if let Err(e) = self.drive(st, |dir| dir.free(&region)) {
                    tracing::warn!(%region, error = %e, "freeing a departed client's region failed");
                }
                st.probes.forget(region.slot);
            }
        }
    }

    /// The error calls that plan stages fail with now, if a stage is parked (for the figures).
    pub(super) fn stalled_now(&self, st: &State) -> Option<String> {
        st.parked.first().map(|p| stalled(&p.stage, p.started, st.copy_deadline).to_string())
    }

    /// Parks a stage whose copies passed their deadline; the error naming it.
    pub(super) fn park(&self, st: &mut State, flight: InFlight) -> FabricError {
        let e = stalled(&flight.stage, flight.started, st.copy_deadline);
        tracing::error!(error = %e, "a stage's copies passed their deadline: the device or the drive is not answering");
        st.parked.push(flight);
        e
    }
}

/// The error for a stage whose copies started at `started` and passed `deadline`.
pub(crate) fn stalled(stage: &Stage, started: Instant, deadline: Duration) -> FabricError {
    let (what, waited_s) = (describe(stage), started.elapsed().as_secs_f64());
    FabricError::Stalled { what, waited_s, deadline_ms: deadline.as_millis() as u64 }
}

/// A stage as an error names it: its kind and each batch's pages and devices.
pub(crate) fn describe(stage: &Stage) -> String {
    let batches: Vec<String> =
        stage.batches.iter().map(|b| format!("{} page(s) {} -> {}", b.moves.len(), b.from, b.to)).collect();
    let kind = format!("{:?}", stage.kind).to_lowercase();
    match batches.is_empty() {
        true => format!("a {kind} stage"),
        false => format!("a {kind} stage ({})", batches.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use vfabric_transport::Backend;

    use crate::config::ClusterConfig;
    use crate::directory::{Mode, Placement};
    use crate::error::FabricError;
    use crate::units::ByteSize;
    use crate::{Fabric, Lease, Location, Region};

    const MIB: u64 = 1 << 20;

    /// An emulated node whose host link moves 1 MiB a second, and whose copies have 200 ms: a fetch of 8 MiB
    /// to a GPU takes 8 s, so it passes its deadline whatever the machine's load (a sleep paces it), and the
    /// checks made while it is parked have seconds to spare.
    fn slow_link() -> Fabric {
        let mut c = ClusterConfig::embedded_local();
        c.device.backend = Backend::Emulated;
        c.device.emulated_host_link = ByteSize(MIB);
        c.device.copy_deadline_ms = 200;
        c.memory.gpu_budget = Some(ByteSize(32 * MIB));
        c.memory.host_arena = ByteSize(128 * MIB);
        Fabric::embedded(&c).expect("fabric")
    }

    fn pattern(seed: u8, len: u64) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    /// A region of `len` bytes written in host memory.
    fn in_host(f: &Fabric, len: u64, seed: u8) -> Region {
        let r = f.alloc(len, Placement::on(Location::Host)).expect("alloc");
        f.write(&r, 0, &pattern(seed, len)).expect("write");
        r
    }

    fn is_stalled(e: &FabricError, kind: &str) -> bool {
        matches!(e, FabricError::Stalled { what, .. } if what.contains(kind) && what.contains("host -> gpu0"))
    }

    /// Another region, with a lease on it held in host memory.
    fn other_held(f: &Fabric) -> (Region, Lease) {
        let other = in_host(f, 2 * MIB, 9);
        let held = f.acquire(&other, 0..2 * MIB, Location::Host, Mode::Read).expect("a host lease");
        (other, held)
    }

    /// While `r`'s fetch is parked: other calls that plan stages fail at once, reads and allocations go on, a
    /// lease dropped meanwhile (`held`, on `other`) is let go, and a departed client's free of `other` waits
    /// for the copies; then the fetch's pages are on the GPU, whole, and `other` is gone.
    fn stalled_then_recovered(f: &Fabric, r: &Region, len: u64, kind: &str, (other, held): (Region, Lease)) {
        let t = Instant::now();
        let e = f.write(&other, 0, &[1; 16]).expect_err("a write while the fetch is parked");
        assert!(is_stalled(&e, kind), "{e}");
        assert!(t.elapsed() < Duration::from_secs(2), "refused at once, not after another deadline");
        let e = f.acquire(&other, 0..2 * MIB, Location::Gpu(1), Mode::Read).expect_err("an acquire elsewhere");
        assert!(is_stalled(&e, kind), "{e}");
        let mut buf = vec![0; len as usize];
        f.read(r, 0, &mut buf).expect("reads go on");
        assert!(buf == pattern(1, len), "the stalled region reads as written");
        f.alloc(MIB, Placement::default()).expect("allocations go on");
        let shown = f.stats().stalled.expect("the figures say the fabric is stalled");
        assert!(shown.contains(kind) && shown.contains("host -> gpu0"), "{shown}");
        drop(held);
        let e = f.free(&other).expect_err("a free while parked");
        assert!(is_stalled(&e, kind), "{e}");
        // A departed client's region: kept for later, freed once the copies land.
        f.free_or_defer(&other).expect("kept for later");
        let deadline = Instant::now() + Duration::from_secs(60);
        let lease = loop {
            match f.acquire(r, 0..len, Location::Gpu(0), Mode::Read) {
                Ok(l) => break l,
                Err(e) if is_stalled(&e, kind) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => panic!("after the copies finish the fabric goes on: {e}"),
            }
        };
        f.release(lease).expect("release");
        assert_eq!(f.stats().stalled, None);
        assert!(f.traffic().fetched >= len, "the parked fetch was taken in: {:?}", f.traffic());
        for page in 0..len / (2 * MIB) {
            let at = page * 2 * MIB;
            assert!(f.page_copies(r, at).expect("copies").contains(&Location::Gpu(0)), "page {page}");
            let mut got = vec![0; (2 * MIB) as usize];
            f.read_copy(r, at, Location::Gpu(0), &mut got).expect("the GPU's copy");
            assert!(got[..] == pattern(1, len)[at as usize..(at + 2 * MIB) as usize], "page {page} on the GPU");
        }
        let e = f.free(&other).expect_err("freed when the fabric went on, its lease let go before");
        assert!(matches!(e, FabricError::DoubleFree(_) | FabricError::UseAfterFree(_)), "{e}");
    }

    #[test]
    fn a_fetch_past_its_deadline_fails_the_call_and_the_fabric_goes_on_once_it_lands() {
        let f = slow_link();
        let r = in_host(&f, 8 * MIB, 1);
        let other = other_held(&f);
        let t = Instant::now();
        let e = f.acquire(&r, 0..8 * MIB, Location::Gpu(0), Mode::Read).expect_err("8 s of copies, 200 ms given");
        assert!(is_stalled(&e, "fetch"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(8), "failed at its deadline, not once the copy landed");
        assert!(e.to_string().contains("(device.copy_deadline_ms = 200)"), "{e}");
        stalled_then_recovered(&f, &r, 8 * MIB, "fetch", other);
    }

    #[test]
    fn a_wait_for_a_prefetch_past_its_deadline_fails_the_call_the_same_way() {
        let f = slow_link();
        let r = in_host(&f, 8 * MIB, 1);
        let other = other_held(&f);
        f.prefetch(&r, 0..8 * MIB, Location::Gpu(0)).expect("prefetch");
        let e = f.acquire(&r, 0..8 * MIB, Location::Gpu(0), Mode::Read).expect_err("waits for the prefetch");
        assert!(is_stalled(&e, "prefetch"), "{e}");
        stalled_then_recovered(&f, &r, 8 * MIB, "prefetch", other);
    }
}
