//! Property tests: every allocator against a naive model (a `Vec` of units) under random
//! operation sequences. Expected results, including exact error values, are computed from
//! the model alone, and the whole state is compared after every operation, which also
//! proves that failing operations change nothing.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::sample::Index;
use vfabric_allocator::{
    AllocClass, AllocError, CompactionPlan, Fit, FrameArena, FrameArenaConfig, FrameRun, FrameState, FreeExtents,
    GlobalAddr, NodeId, PageSize, QuotaBook, Range, RangeAllocator, TenantId, Tier, MAX_OFFSET,
};

fn config() -> ProptestConfig {
    ProptestConfig { cases: 256, ..ProptestConfig::default() }
}

fn fit() -> impl Strategy<Value = Fit> {
    prop_oneof![Just(Fit::FirstFit), Just(Fit::BestFit)]
}

/// Maximal free runs `(start, len)` of a unit map, in address order.
fn runs(free: &[bool]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (i, &f) in free.iter().enumerate() {
        if !f {
            continue;
        }
        let i = i as u64;
        match out.last_mut() {
            Some((s, l)) if *s + *l == i => *l += 1,
            _ => out.push((i, 1)),
        }
    }
    out
}

/// Where a fit policy must place `len` units, per the model.
fn model_find(free: &[bool], fit: Fit, len: u64) -> Option<u64> {
    if len == 0 {
        return None;
    }
    let rs = runs(free);
    match fit {
        Fit::FirstFit => rs.iter().find(|r| r.1 >= len).map(|r| r.0),
        Fit::BestFit => rs.iter().filter(|r| r.1 >= len).min_by_key(|r| (r.1, r.0)).map(|r| r.0),
    }
}

fn largest(free: &[bool]) -> u64 {
    runs(free).iter().map(|r| r.1).max().unwrap_or(0)
}

// ---------------------------------------------------------------------------------------
// FreeExtents
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum EOp {
    Take(Fit, u64),
    TakeExact(u64, u64),
    GiveBack(u64, u64),
    TakeLargest(u64),
    IsFree(u64, u64),
}

fn eop() -> impl Strategy<Value = EOp> {
    prop_oneof![
        3 => (fit(), 0u64..80).prop_map(|(f, l)| EOp::Take(f, l)),
        2 => (0u64..4096, 0u64..80).prop_map(|(s, l)| EOp::TakeExact(s, l)),
        4 => (0u64..4096, 0u64..80).prop_map(|(s, l)| EOp::GiveBack(s, l)),
        1 => (0u64..200).prop_map(EOp::TakeLargest),
        1 => (0u64..4096, 0u64..80).prop_map(|(s, l)| EOp::IsFree(s, l)),
    ]
}

fn check_extents(f: &FreeExtents, model: &[bool]) {
    let expected = runs(model);
    let actual: Vec<_> = f.iter().collect();
    // Equality with the maximal runs implies coalescing: no two free extents touch.
    assert_eq!(actual, expected);
    for w in actual.windows(2) {
        assert!(w[0].0 + w[0].1 < w[1].0, "adjacent free extents {w:?}");
    }
    assert_eq!(f.free_units(), model.iter().filter(|&&b| b).count() as u64);
    assert_eq!(f.free_ranges(), expected.len() as u64);
    assert_eq!(f.largest(), largest(model));
    assert_eq!(f.total(), model.len() as u64);
    let frag = f.fragmentation();
    assert_eq!(frag.free_units, f.free_units());
    assert!(frag.ratio > 0.0 && frag.ratio <= 1.0);
}

/// `Ok` if `[start, start + len)` is a valid, non-empty range of the model, else the error
/// that range checks report.
fn model_range(total: u64, start: u64, len: u64) -> Result<u64, AllocError> {
    if len == 0 {
        return Err(AllocError::InvalidSize { size: 0, reason: "" });
    }
    if start >= total {
        return Err(AllocError::InvalidAddress { addr: start });
    }
    if start + len > total {
        return Err(AllocError::InvalidAddress { addr: total });
    }
    Ok(start + len)
}

/// Compares errors, ignoring the free-text `reason` of `InvalidSize`.
fn same_err(a: &AllocError, b: &AllocError) -> bool {
    match (a, b) {
        (AllocError::InvalidSize { size: x, .. }, AllocError::InvalidSize { size: y, .. }) => x == y,
        (AllocError::CompactionImpossible { frames: x, .. }, AllocError::CompactionImpossible { frames: y, .. }) => {
            x == y
        }
        _ => a == b,
    }
}

fn assert_result<T: std::fmt::Debug>(actual: &Result<T, AllocError>, expected: &Result<(), AllocError>) {
    match (actual, expected) {
        (Ok(_), Ok(())) => {}
        (Err(a), Err(e)) => assert!(same_err(a, e), "got {a:?}, expected {e:?}"),
        _ => panic!("got {actual:?}, expected {expected:?}"),
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn free_extents_match_model(
        total in 1u64..=2048,
        all_free in any::<bool>(),
        ops in prop::collection::vec(eop(), 1..80),
    ) {
        let mut f = if all_free {
            FreeExtents::new_all_free(total)
        } else {
            FreeExtents::new_all_used(total)
        };
        let mut model = vec![all_free; total as usize];
        check_extents(&f, &model);
        // Reduce raw positions so that some land just past the end.
        let pos = |x: u64| x % (total + 8);
        for op in ops {
            match op {
                EOp::Take(fit, len) => {
                    let expected = model_find(&model, fit, len);
                    let got = f.take(fit, len);
                    prop_assert_eq!(got, expected);
                    if let Some(s) = got {
                        for u in s..s + len {
                            model[u as usize] = false;
                        }
                    }
                }
                EOp::TakeExact(s, len) => {
                    let s = pos(s);
                    let expected = model_range(total, s, len).and_then(|end| {
                        match (s..end).find(|&u| !model[u as usize]) {
                            Some(u) => Err(AllocError::InUse { addr: u }),
                            None => Ok(()),
                        }
                    });
                    let got = f.take_exact(s, len);
                    assert_result(&got, &expected);
                    if got.is_ok() {
                        for u in s..s + len {
                            model[u as usize] = false;
                        }
                    }
                }
                EOp::GiveBack(s, len) => {
                    let s = pos(s);
                    let expected = model_range(total, s, len).and_then(|end| {
                        match (s..end).find(|&u| model[u as usize]) {
                            Some(u) => Err(AllocError::DoubleFree { addr: u }),
                            None => Ok(()),
                        }
                    });
                    let got = f.give_back(s, len);
                    assert_result(&got, &expected);
                    if got.is_ok() {
                        for u in s..s + len {
                            model[u as usize] = true;
                        }
                    }
                }
                EOp::TakeLargest(max) => {
                    let l = largest(&model);
                    let expected = if max == 0 || l == 0 {
                        None
                    } else {
                        let start = runs(&model).iter().find(|r| r.1 == l).map(|r| r.0);
                        start.map(|s| (s, max.min(l)))
                    };
                    let got = f.take_largest(max);
                    prop_assert_eq!(got, expected);
                    if let Some((s, len)) = got {
                        for u in s..s + len {
                            model[u as usize] = false;
                        }
                    }
                }
                EOp::IsFree(s, len) => {
                    let s = pos(s);
                    let expected = len == 0
                        || (s + len <= total && (s..s + len).all(|u| model[u as usize]));
                    prop_assert_eq!(f.is_free(s, len), expected);
                }
            }
            check_extents(&f, &model);
        }
    }
}

// ---------------------------------------------------------------------------------------
// RangeAllocator
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum ROp {
    Alloc(u64),
    FreeLive(Index),
    FreeRaw(u64),
}

fn rop() -> impl Strategy<Value = ROp> {
    prop_oneof![
        5 => (0u64..40).prop_map(ROp::Alloc),
        4 => any::<Index>().prop_map(ROp::FreeLive),
        1 => (0u64..1 << 20).prop_map(ROp::FreeRaw),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn range_allocator_matches_model(
        pages in 1u64..=2048,
        align_shift in 0u32..13,
        fit in fit(),
        ops in prop::collection::vec(rop(), 1..100),
    ) {
        let align = 1u64 << align_shift;
        let capacity = pages * align;
        let mut a = RangeAllocator::new(capacity, align, fit).unwrap();
        // Per page: free or not; live ranges by start.
        let mut model = vec![true; pages as usize];
        let mut live: BTreeMap<u64, u64> = BTreeMap::new();
        for op in ops {
            match op {
                ROp::Alloc(units) => {
                    // Sizes around page boundaries: some exact, some one byte over.
                    let size = (units / 2) * align + (units % 2) * (align / 2).max(1);
                    let npages = size.div_ceil(align);
                    let got = a.alloc(size);
                    if size == 0 {
                        let zero = matches!(got, Err(AllocError::InvalidSize { size: 0, .. }));
                        prop_assert!(zero, "zero-sized alloc gave {:?}", got);
                        continue;
                    }
                    match model_find(&model, Fit::FirstFit, npages).and(model_find(&model, fit, npages)) {
                        Some(p) => {
                            let r = got.unwrap();
                            prop_assert_eq!(r, Range { start: p * align, len: npages * align });
                            prop_assert!(r.end() <= capacity);
                            for q in p..p + npages {
                                prop_assert!(model[q as usize], "page {} handed out twice", q);
                                model[q as usize] = false;
                            }
                            live.insert(r.start, r.len);
                        }
                        None => {
                            let free = model.iter().filter(|&&b| b).count() as u64;
                            prop_assert_eq!(got, Err(AllocError::OutOfMemory {
                                requested: npages * align,
                                available: free * align,
                                largest_free: largest(&model) * align,
                            }));
                        }
                    }
                }
                ROp::FreeLive(idx) => {
                    if live.is_empty() {
                        continue;
                    }
                    let (&start, &len) = live.iter().nth(idx.index(live.len())).unwrap();
                    prop_assert_eq!(a.free(start), Ok(Range { start, len }));
                    live.remove(&start);
                    for q in start / align..(start + len) / align {
                        model[q as usize] = true;
                    }
                }
                ROp::FreeRaw(raw) => {
                    let addr = raw % (capacity + 2 * align);
                    let expected = if addr >= capacity {
                        Err(AllocError::InvalidAddress { addr })
                    } else if addr % align != 0 {
                        Err(AllocError::Unaligned { addr, align })
                    } else if let Some(&len) = live.get(&addr) {
                        Ok(Range { start: addr, len })
                    } else if model[(addr / align) as usize] {
                        Err(AllocError::DoubleFree { addr })
                    } else {
                        Err(AllocError::InvalidAddress { addr })
                    };
                    prop_assert_eq!(a.free(addr), expected.clone());
                    if expected.is_ok() {
                        let len = live.remove(&addr).unwrap();
                        for q in addr / align..(addr + len) / align {
                            model[q as usize] = true;
                        }
                    }
                }
            }

            // Live ranges: same as the model, in bounds, never overlapping.
            let got: Vec<_> = a.live().collect();
            let want: Vec<_> = live.iter().map(|(&start, &len)| Range { start, len }).collect();
            prop_assert_eq!(&got, &want);
            for w in got.windows(2) {
                prop_assert!(w[0].end() <= w[1].start);
            }
            prop_assert!(got.last().is_none_or(|r| r.end() <= capacity));
            prop_assert_eq!(a.live_count(), live.len());
            // Accounting.
            let used: u64 = live.values().sum();
            prop_assert_eq!(a.used(), used);
            prop_assert_eq!(a.used() + a.free_bytes(), capacity);
            // Free extents: the model's maximal runs (so coalesced), in bytes.
            let extents: Vec<_> = a.free_extents().collect();
            let want: Vec<_> = runs(&model).iter().map(|&(s, l)| (s * align, l * align)).collect();
            prop_assert_eq!(&extents, &want);
            for w in extents.windows(2) {
                prop_assert!(w[0].0 + w[0].1 < w[1].0);
            }
            let frag = a.fragmentation();
            prop_assert_eq!(frag.free_ranges, want.len() as u64);
            prop_assert_eq!(frag.largest_free, largest(&model) * align);
        }
    }
}

// ---------------------------------------------------------------------------------------
// FrameArena
// ---------------------------------------------------------------------------------------

const FRAME: u64 = 64 * 1024;
const TENANTS: u32 = 4;

#[derive(Debug, Clone)]
enum FOp {
    Alloc { n: u32, tenant: u32, reserved: bool },
    AllocAt { start: u32, len: u32, tenant: u32, reserved: bool },
    FreeAlloc(Index),
    FreeFrames(Vec<u32>),
    Lease(Index, Index),
    LeaseRaw(u32),
    Unlease(Index),
    UnleaseRaw(u32),
    Compact(u32),
    SetLimit { tenant: u32, frames: Option<u32> },
}

fn fop() -> impl Strategy<Value = FOp> {
    prop_oneof![
        6 => (0u32..24, 0..TENANTS, any::<bool>())
            .prop_map(|(n, tenant, reserved)| FOp::Alloc { n, tenant, reserved }),
        1 => (0u32..1000, 0u32..12, 0..TENANTS, any::<bool>())
            .prop_map(|(start, len, tenant, reserved)| FOp::AllocAt { start, len, tenant, reserved }),
        4 => any::<Index>().prop_map(FOp::FreeAlloc),
        1 => prop::collection::vec(0u32..1000, 0..4).prop_map(FOp::FreeFrames),
        2 => (any::<Index>(), any::<Index>()).prop_map(|(a, p)| FOp::Lease(a, p)),
        1 => (0u32..1000).prop_map(FOp::LeaseRaw),
        2 => any::<Index>().prop_map(FOp::Unlease),
        1 => (0u32..1000).prop_map(FOp::UnleaseRaw),
        2 => (1u32..48).prop_map(FOp::Compact),
        1 => (0..TENANTS, proptest::option::of(0u32..64))
            .prop_map(|(tenant, frames)| FOp::SetLimit { tenant, frames }),
    ]
}

/// The naive model of a frame arena.
struct FModel {
    frames: u32,
    reserved: u32,
    fit: Fit,
    owner: Vec<Option<TenantId>>,
    leases: Vec<u32>,
    /// Live allocations: tenant and, per page, the frame backing it.
    allocs: Vec<(TenantId, Vec<u32>)>,
    limits: BTreeMap<TenantId, u64>,
}

impl FModel {
    fn free_map(&self) -> Vec<bool> {
        self.owner.iter().map(Option::is_none).collect()
    }
    fn used(&self) -> u32 {
        self.owner.iter().filter(|o| o.is_some()).count() as u32
    }
    fn used_by(&self, t: TenantId) -> u64 {
        self.owner.iter().filter(|&&o| o == Some(t)).count() as u64 * FRAME
    }
    fn available(&self, class: AllocClass) -> u32 {
        match class {
            AllocClass::Normal => (self.frames - self.reserved).saturating_sub(self.used()),
            AllocClass::Reserved => self.frames - self.used(),
        }
    }
    /// The quota check then the capacity check, as the arena orders them.
    fn admit(&self, n: u32, t: TenantId, class: AllocClass) -> Result<(), AllocError> {
        let requested = u64::from(n) * FRAME;
        let used = self.used_by(t);
        if let Some(&limit) = self.limits.get(&t) {
            if used + requested > limit {
                return Err(AllocError::QuotaExceeded { tenant: t, tier: Tier::Gpu, limit, used, requested });
            }
        }
        let available = self.available(class);
        if n > available {
            return Err(AllocError::OutOfMemory {
                requested: u64::from(n),
                available: u64::from(available),
                largest_free: largest(&self.free_map()),
            });
        }
        Ok(())
    }
    fn take(&mut self, t: TenantId, frames: Vec<u32>) {
        for &f in &frames {
            assert!(self.owner[f as usize].is_none(), "frame {f} handed out twice");
            self.owner[f as usize] = Some(t);
        }
        self.allocs.push((t, frames));
    }
    /// Frees frames (already validated): their pages disappear from their allocations.
    fn release(&mut self, frames: &[u32]) {
        for &f in frames {
            self.owner[f as usize] = None;
            assert_eq!(self.leases[f as usize], 0);
        }
        for (_, pages) in &mut self.allocs {
            pages.retain(|p| !frames.contains(p));
        }
        self.allocs.retain(|(_, pages)| !pages.is_empty());
    }
    fn check_frames(&self, frames: &[u32]) -> Result<(), AllocError> {
        for &f in frames {
            if f >= self.frames {
                return Err(AllocError::InvalidAddress { addr: u64::from(f) });
            }
            if self.owner[f as usize].is_none() {
                return Err(AllocError::DoubleFree { addr: u64::from(f) });
            }
            if self.leases[f as usize] > 0 {
                return Err(AllocError::FrameLeased { frame: f });
            }
        }
        let mut sorted = frames.to_vec();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(AllocError::DoubleFree { addr: u64::from(w[0]) });
        }
        Ok(())
    }
    fn lease_check(&self, f: u32) -> Result<(), AllocError> {
        if f >= self.frames {
            return Err(AllocError::InvalidAddress { addr: u64::from(f) });
        }
        if self.owner[f as usize].is_none() {
            return Err(AllocError::DoubleFree { addr: u64::from(f) });
        }
        Ok(())
    }
    /// The plan the arena must produce, computed the slow way.
    fn plan(&self, n: u32) -> Result<CompactionPlan, AllocError> {
        let impossible = AllocError::CompactionImpossible { frames: u64::from(n), reason: "" };
        if n > self.frames {
            return Err(impossible);
        }
        let free = self.free_map();
        if let Some(s) = model_find(&free, self.fit, u64::from(n)) {
            return Ok(CompactionPlan { target: FrameRun { start: s as u32, len: n }, moves: vec![] });
        }
        if n > self.frames - self.used() {
            return Err(impossible);
        }
        let best = (0..=self.frames - n)
            .filter(|&s| (s..s + n).all(|f| self.leases[f as usize] == 0))
            .min_by_key(|&s| ((s..s + n).filter(|&f| !free[f as usize]).count(), s));
        let Some(s) = best else {
            return Err(impossible);
        };
        let target = FrameRun { start: s, len: n };
        let sources = (s..s + n).filter(|&f| !free[f as usize]);
        let dests = (0..self.frames).filter(|&f| free[f as usize] && !target.contains(f));
        let moves = sources.zip(dests).map(|(from, to)| vfabric_allocator::FrameMove { from, to }).collect();
        Ok(CompactionPlan { target, moves })
    }
}

fn check_arena(a: &FrameArena, m: &FModel, q: &QuotaBook) -> Result<(), TestCaseError> {
    for f in 0..m.frames {
        let want = match m.owner[f as usize] {
            None => FrameState::Free,
            Some(tenant) => FrameState::Used { tenant },
        };
        prop_assert_eq!(a.state(f), Some(want), "frame {}", f);
        prop_assert_eq!(a.lease_count(f), m.leases[f as usize]);
    }
    prop_assert_eq!(a.state(m.frames), None);
    prop_assert_eq!(a.used_frames(), m.used());
    prop_assert_eq!(a.free_frames(), m.frames - m.used());
    prop_assert_eq!(a.leased_frames(), m.leases.iter().filter(|&&l| l > 0).count() as u32);
    prop_assert_eq!(a.available(AllocClass::Normal), m.available(AllocClass::Normal));
    prop_assert_eq!(a.available(AllocClass::Reserved), m.available(AllocClass::Reserved));
    let free = m.free_map();
    prop_assert_eq!(u64::from(a.largest_free_run()), largest(&free));
    let free_runs: Vec<_> = a.free_runs().map(|r| (u64::from(r.start), u64::from(r.len))).collect();
    prop_assert_eq!(free_runs, runs(&free));
    for t in 0..TENANTS {
        let t = TenantId(t);
        prop_assert_eq!(q.used(t, Tier::Gpu), m.used_by(t), "quota of tenant {}", t);
        prop_assert_eq!(q.limit(t, Tier::Gpu), m.limits.get(&t).copied());
    }
    // Every page of every live allocation is backed by its own frame, owned by its tenant.
    let mut seen = vec![false; m.frames as usize];
    for (t, pages) in &m.allocs {
        for &p in pages {
            prop_assert!(!seen[p as usize], "frame {} backs two pages", p);
            seen[p as usize] = true;
            prop_assert_eq!(a.state(p), Some(FrameState::Used { tenant: *t }));
        }
    }
    prop_assert_eq!(seen.iter().filter(|&&s| s).count() as u32, m.used());
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn frame_arena_matches_model(
        capacity_frames in 1u64..=256,
        slack in 0u64..FRAME,
        budget in proptest::option::of((1u64..=320, 0u64..FRAME)),
        headroom in prop_oneof![Just(0u8), Just(100u8), 0u8..=100],
        fit in fit(),
        limits in prop::collection::vec(proptest::option::of(0u32..200), TENANTS as usize),
        ops in prop::collection::vec(fop(), 1..60),
    ) {
        let mut cfg = FrameArenaConfig::new(Tier::Gpu, PageSize::KIB_64, capacity_frames * FRAME + slack)
            .with_headroom(headroom)
            .with_fit(fit);
        if let Some((frames, extra)) = budget {
            cfg = cfg.with_budget(frames * FRAME + extra);
        }
        let frames = budget.map_or(capacity_frames, |(b, _)| b.min(capacity_frames)) as u32;
        let mut a = FrameArena::new(cfg).unwrap();
        prop_assert_eq!(a.frames(), frames);
        let reserved = (u64::from(frames) * u64::from(headroom)).div_ceil(100) as u32;
        prop_assert_eq!(a.reserved_frames(), reserved);

        let mut q = QuotaBook::new();
        let mut m = FModel {
            frames,
            reserved,
            fit,
            owner: vec![None; frames as usize],
            leases: vec![0; frames as usize],
            allocs: Vec::new(),
            limits: BTreeMap::new(),
        };
        for (t, l) in limits.iter().enumerate() {
            if let Some(l) = l {
                let t = TenantId(t as u32);
                q.set_limit(t, Tier::Gpu, Some(u64::from(*l) * FRAME));
                m.limits.insert(t, u64::from(*l) * FRAME);
            }
        }
        // Raw frame ids reach a little past the end of the arena.
        let raw = |x: u32| x % (frames + 3);

        for op in ops {
            match op {
                FOp::Alloc { n, tenant, reserved } => {
                    let t = TenantId(tenant);
                    let class = if reserved { AllocClass::Reserved } else { AllocClass::Normal };
                    let expected = if n == 0 {
                        Err(AllocError::InvalidSize { size: 0, reason: "" })
                    } else {
                        m.admit(n, t, class)
                    };
                    let got = a.alloc(n, t, class, &mut q);
                    assert_result(&got, &expected);
                    if let Ok(x) = got {
                        prop_assert_eq!(x.len(), n);
                        for w in x.runs.windows(2) {
                            prop_assert!(w[0].end() < w[1].start, "runs unsorted or touching");
                        }
                        let free = m.free_map();
                        match model_find(&free, fit, u64::from(n)) {
                            Some(s) => prop_assert_eq!(
                                &x.runs,
                                &vec![FrameRun { start: s as u32, len: n }]
                            ),
                            None => {
                                // Fewest runs: as many as the largest free runs need.
                                let mut lens: Vec<u64> = runs(&free).iter().map(|r| r.1).collect();
                                lens.sort_unstable_by(|a, b| b.cmp(a));
                                let mut sum = 0;
                                let k = lens.iter().take_while(|&&l| {
                                    let before = sum;
                                    sum += l;
                                    before < u64::from(n)
                                }).count();
                                prop_assert_eq!(x.runs.len(), k);
                            }
                        }
                        m.take(t, x.frames().collect());
                    }
                }
                FOp::AllocAt { start, len, tenant, reserved } => {
                    let start = raw(start);
                    let t = TenantId(tenant);
                    let class = if reserved { AllocClass::Reserved } else { AllocClass::Normal };
                    let run = FrameRun { start, len };
                    let expected = if len == 0 {
                        Err(AllocError::InvalidSize { size: 0, reason: "" })
                    } else if start >= frames {
                        Err(AllocError::InvalidAddress { addr: u64::from(start) })
                    } else if start + len > frames {
                        Err(AllocError::InvalidAddress { addr: u64::from(frames) })
                    } else if let Some(f) = run.iter().find(|&f| m.owner[f as usize].is_some()) {
                        Err(AllocError::InUse { addr: u64::from(f) })
                    } else {
                        m.admit(len, t, class)
                    };
                    let got = a.alloc_at(run, t, class, &mut q);
                    assert_result(&got, &expected);
                    if let Ok(x) = got {
                        prop_assert_eq!(&x.runs, &vec![run]);
                        m.take(t, run.iter().collect());
                    }
                }
                FOp::FreeAlloc(idx) => {
                    if m.allocs.is_empty() {
                        continue;
                    }
                    let pages = m.allocs[idx.index(m.allocs.len())].1.clone();
                    let expected = m.check_frames(&pages);
                    let got = a.free(pages.iter().copied(), &mut q);
                    assert_result(&got, &expected);
                    if let Ok(count) = got {
                        prop_assert_eq!(count as usize, pages.len());
                        m.release(&pages);
                    }
                }
                FOp::FreeFrames(list) => {
                    let list: Vec<u32> = list.into_iter().map(raw).collect();
                    let expected = m.check_frames(&list);
                    let got = a.free(list.iter().copied(), &mut q);
                    assert_result(&got, &expected);
                    if let Ok(count) = got {
                        prop_assert_eq!(count as usize, list.len());
                        m.release(&list);
                    }
                }
                FOp::Lease(ai, pi) => {
                    if m.allocs.is_empty() {
                        continue;
                    }
                    let pages = &m.allocs[ai.index(m.allocs.len())].1;
                    let f = pages[pi.index(pages.len())];
                    prop_assert_eq!(a.lease(f), Ok(m.leases[f as usize] + 1));
                    m.leases[f as usize] += 1;
                }
                FOp::LeaseRaw(f) => {
                    let f = raw(f);
                    let got = a.lease(f);
                    match m.lease_check(f) {
                        Ok(()) => {
                            m.leases[f as usize] += 1;
                            prop_assert_eq!(got, Ok(m.leases[f as usize]));
                        }
                        Err(e) => prop_assert_eq!(got, Err(e)),
                    }
                }
                FOp::Unlease(idx) => {
                    let leased: Vec<u32> =
                        (0..frames).filter(|&f| m.leases[f as usize] > 0).collect();
                    if leased.is_empty() {
                        continue;
                    }
                    let f = leased[idx.index(leased.len())];
                    m.leases[f as usize] -= 1;
                    prop_assert_eq!(a.unlease(f), Ok(m.leases[f as usize]));
                }
                FOp::UnleaseRaw(f) => {
                    let f = raw(f);
                    let got = a.unlease(f);
                    match m.lease_check(f) {
                        Ok(()) if m.leases[f as usize] == 0 => {
                            prop_assert_eq!(got, Err(AllocError::NotLeased { frame: f }));
                        }
                        Ok(()) => {
                            m.leases[f as usize] -= 1;
                            prop_assert_eq!(got, Ok(m.leases[f as usize]));
                        }
                        Err(e) => prop_assert_eq!(got, Err(e)),
                    }
                }
                FOp::Compact(n) => {
                    let expected = m.plan(n);
                    let got = a.compaction_plan(n);
                    match (&got, &expected) {
                        (Ok(p), Ok(e)) => prop_assert_eq!(p, e),
                        (Err(g), Err(e)) => prop_assert!(same_err(g, e), "{:?} vs {:?}", g, e),
                        _ => prop_assert!(false, "plan {:?}, expected {:?}", got, expected),
                    }
                    let Ok(plan) = got else { continue };
                    let before: Vec<_> = (0..frames).map(|f| a.state(f)).collect();
                    prop_assert_eq!(a.apply_plan(&plan), Ok(()));
                    // The target is now free; each page kept its tenant and leased frames
                    // never moved.
                    for f in plan.target.iter() {
                        prop_assert_eq!(a.state(f), Some(FrameState::Free));
                    }
                    for mv in &plan.moves {
                        prop_assert_eq!(m.leases[mv.from as usize], 0);
                        prop_assert_eq!(a.state(mv.to), before[mv.from as usize]);
                        let owner = m.owner[mv.from as usize].take();
                        m.owner[mv.to as usize] = owner;
                        for (_, pages) in &mut m.allocs {
                            for p in pages.iter_mut() {
                                if *p == mv.from {
                                    *p = mv.to;
                                }
                            }
                        }
                    }
                    prop_assert!(u64::from(a.largest_free_run()) >= u64::from(n));
                }
                FOp::SetLimit { tenant, frames: limit } => {
                    let t = TenantId(tenant);
                    let bytes = limit.map(|l| u64::from(l) * FRAME);
                    q.set_limit(t, Tier::Gpu, bytes);
                    match bytes {
                        Some(b) => m.limits.insert(t, b),
                        None => m.limits.remove(&t),
                    };
                }
            }
            check_arena(&a, &m, &q)?;
        }
    }
}

// ---------------------------------------------------------------------------------------
// GlobalAddr
// ---------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    #[test]
    fn global_addr_round_trips(node in any::<u16>(), offset in 0..=MAX_OFFSET, add in any::<u64>()) {
        let a = GlobalAddr::new(NodeId(node), offset).unwrap();
        prop_assert_eq!(a.node(), NodeId(node));
        prop_assert_eq!(a.offset(), offset);
        prop_assert_eq!(GlobalAddr::from_raw(a.raw()), a);
        prop_assert_eq!(a.raw(), (u64::from(node) << 48) | offset);
        prop_assert_eq!(a.to_string(), format!("n{node}:0x{offset:x}"));
        let add = add >> (add % 64);
        match a.checked_add(add) {
            Some(b) => {
                prop_assert_eq!(b.node(), NodeId(node));
                prop_assert_eq!(b.offset(), offset + add);
            }
            None => prop_assert!(offset.checked_add(add).is_none_or(|o| o > MAX_OFFSET)),
        }
    }

    #[test]
    fn global_addr_rejects_wide_offsets(node in any::<u16>(), offset in (MAX_OFFSET + 1)..=u64::MAX) {
        prop_assert_eq!(
            GlobalAddr::new(NodeId(node), offset),
            Err(AllocError::InvalidAddress { addr: offset })
        );
    }

    #[test]
    fn every_raw_value_decodes(raw in any::<u64>()) {
        let a = GlobalAddr::from_raw(raw);
        prop_assert_eq!(GlobalAddr::new(a.node(), a.offset()), Ok(a));
    }

    #[test]
    fn page_size_accepts_exactly_the_powers_of_two_in_bounds(bytes in any::<u64>(), shift in 0u32..64) {
        for b in [bytes, 1u64 << shift] {
            let ok = b.is_power_of_two() && (64 * 1024..=2 * 1024 * 1024).contains(&b);
            prop_assert_eq!(PageSize::new(b).is_ok(), ok);
            if let Ok(p) = PageSize::new(b) {
                prop_assert_eq!(p.bytes(), b);
            }
        }
    }
}
