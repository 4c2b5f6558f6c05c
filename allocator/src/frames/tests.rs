//! The frame arena's tests: allocation, headroom, quotas, leases and compaction, through its public methods.

use super::arena::FrameArena;
use super::compaction::{CompactionPlan, FrameMove};
use super::config::{AllocClass, FrameArenaConfig, DEFAULT_HEADROOM_PERCENT};
use super::run::{FrameAlloc, FrameRun, FrameState};
use crate::addr::PageSize;
use crate::error::AllocError;
use crate::quota::QuotaBook;
use crate::tenant::{TenantId, Tier};

const F: u64 = 64 * 1024;
const T1: TenantId = TenantId(1);
const T2: TenantId = TenantId(2);
const N: AllocClass = AllocClass::Normal;
const R: AllocClass = AllocClass::Reserved;

fn arena(frames: u64, headroom: u8) -> FrameArena {
    FrameArena::new(FrameArenaConfig::new(Tier::Gpu, PageSize::KIB_64, frames * F).with_headroom(headroom)).unwrap()
}

fn owners(a: &FrameArena) -> Vec<Option<TenantId>> {
    (0..a.frames())
        .map(|f| match a.state(f).unwrap() {
            FrameState::Free => None,
            FrameState::Used { tenant } => Some(tenant),
        })
        .collect()
}

#[test]
fn sizing_budget_and_headroom() {
    let cfg = FrameArenaConfig::new(Tier::Gpu, PageSize::KIB_64, 100 * F + 5);
    let a = FrameArena::new(cfg).unwrap();
    assert_eq!(a.frames(), 100);
    assert_eq!(a.reserved_frames(), 15);
    assert_eq!(a.available(N), 85);
    assert_eq!(a.available(R), 100);
    // Budget below capacity caps the arena; above capacity has no effect.
    let a = FrameArena::new(cfg.with_budget(10 * F + 1)).unwrap();
    assert_eq!(a.frames(), 10);
    assert_eq!(a.reserved_frames(), 2); // ceil(1.5)
    let a = FrameArena::new(cfg.with_budget(1000 * F)).unwrap();
    assert_eq!(a.frames(), 100);
    assert_eq!(arena(10, 0).reserved_frames(), 0);
    assert_eq!(arena(10, 100).reserved_frames(), 10);
    assert_eq!(arena(10, 100).available(N), 0);
    assert_eq!(arena(10, 1).reserved_frames(), 1);
    assert_eq!(a.config().headroom_percent, DEFAULT_HEADROOM_PERCENT);
    assert_eq!(a.tier(), Tier::Gpu);
    assert_eq!(a.frame_size(), PageSize::KIB_64);
}

#[test]
fn invalid_configs() {
    let cfg = FrameArenaConfig::new(Tier::Host, PageSize::MIB_2, 1 << 30);
    assert!(matches!(FrameArena::new(cfg.with_headroom(101)), Err(AllocError::InvalidConfig { .. })));
    assert!(matches!(
        FrameArena::new(cfg.with_budget(PageSize::MIB_2.bytes() - 1)),
        Err(AllocError::InvalidConfig { .. })
    ));
    assert!(matches!(
        FrameArena::new(FrameArenaConfig::new(Tier::Host, PageSize::MIB_2, 0)),
        Err(AllocError::InvalidConfig { .. })
    ));
    assert!(matches!(
        FrameArena::new(FrameArenaConfig::new(Tier::Nvme, PageSize::KIB_64, u64::MAX)),
        Err(AllocError::InvalidConfig { .. })
    ));
}

#[test]
fn contiguous_alloc_charges_quota() {
    let mut a = arena(10, 0);
    let mut q = QuotaBook::new();
    let x = a.alloc(3, T1, N, &mut q).unwrap();
    assert_eq!(x.runs, vec![FrameRun { start: 0, len: 3 }]);
    assert!(x.is_contiguous());
    assert_eq!(x.len(), 3);
    assert!(!x.is_empty());
    assert_eq!(x.frames().collect::<Vec<_>>(), vec![0, 1, 2]);
    assert_eq!(q.used(T1, Tier::Gpu), 3 * F);
    assert_eq!(a.used_frames(), 3);
    assert_eq!(a.free_frames(), 7);
    assert_eq!(a.state(1), Some(FrameState::Used { tenant: T1 }));
    assert_eq!(a.state(3), Some(FrameState::Free));
    assert_eq!(a.state(10), None);
}

#[test]
fn exact_fit_fills_the_arena() {
    let mut a = arena(8, 0);
    let mut q = QuotaBook::new();
    let x = a.alloc(8, T1, N, &mut q).unwrap();
    assert_eq!(x.runs, vec![FrameRun { start: 0, len: 8 }]);
    assert_eq!(a.alloc(1, T1, R, &mut q), Err(AllocError::OutOfMemory { requested: 1, available: 0, largest_free: 0 }));
    assert_eq!(q.used(T1, Tier::Gpu), 8 * F);
}

#[test]
fn scattered_alloc_uses_fewest_runs() {
    let mut a = arena(20, 0);
    let mut q = QuotaBook::new();
    // Free holes of 2, 5, 3 (and 0 at the end).
    let x = a.alloc(20, T1, N, &mut q).unwrap();
    a.free([1, 2], &mut q).unwrap();
    a.free(5..10, &mut q).unwrap();
    a.free(13..16, &mut q).unwrap();
    assert_eq!(a.free_frames(), 10);
    let y = a.alloc(7, T2, N, &mut q).unwrap();
    // Largest first (5), then the rest (2) by first-fit.
    assert_eq!(y.runs, vec![FrameRun { start: 1, len: 2 }, FrameRun { start: 5, len: 5 }]);
    assert!(!y.is_contiguous());
    assert_eq!(q.used(T2, Tier::Gpu), 7 * F);
    assert_eq!(x.len(), 20);
}

#[test]
fn headroom_limits_normal_but_not_reserved() {
    let mut a = arena(10, 20); // 2 reserved
    let mut q = QuotaBook::new();
    a.alloc(8, T1, N, &mut q).unwrap();
    assert_eq!(a.available(N), 0);
    assert_eq!(a.alloc(1, T1, N, &mut q), Err(AllocError::OutOfMemory { requested: 1, available: 0, largest_free: 2 }));
    // The failed attempt was not charged.
    assert_eq!(q.used(T1, Tier::Gpu), 8 * F);
    a.alloc(2, T1, R, &mut q).unwrap();
    assert_eq!(a.free_frames(), 0);
    assert_eq!(a.available(R), 0);
}

#[test]
fn reserved_use_shrinks_normal_availability() {
    let mut a = arena(10, 20);
    let mut q = QuotaBook::new();
    a.alloc(3, T1, R, &mut q).unwrap();
    assert_eq!(a.available(N), 5);
}

#[test]
fn headroom_100_blocks_all_normal_allocations() {
    let mut a = arena(4, 100);
    let mut q = QuotaBook::new();
    assert!(matches!(a.alloc(1, T1, N, &mut q), Err(AllocError::OutOfMemory { .. })));
    a.alloc(4, T1, R, &mut q).unwrap();
}

#[test]
fn quota_exceeded_changes_nothing() {
    let mut a = arena(10, 0);
    let mut q = QuotaBook::new();
    q.set_limit(T1, Tier::Gpu, Some(4 * F));
    a.alloc(3, T1, N, &mut q).unwrap();
    assert_eq!(
        a.alloc(2, T1, N, &mut q),
        Err(AllocError::QuotaExceeded { tenant: T1, tier: Tier::Gpu, limit: 4 * F, used: 3 * F, requested: 2 * F })
    );
    assert_eq!(a.used_frames(), 3);
    assert_eq!(q.used(T1, Tier::Gpu), 3 * F);
    // Quota applies to the reserved class as well.
    assert!(matches!(a.alloc(2, T1, R, &mut q), Err(AllocError::QuotaExceeded { .. })));
    a.alloc(1, T1, N, &mut q).unwrap();
    // Another tenant is unaffected.
    a.alloc(6, T2, N, &mut q).unwrap();
}

#[test]
fn zero_frames_is_invalid() {
    let mut a = arena(4, 0);
    let mut q = QuotaBook::new();
    assert!(matches!(a.alloc(0, T1, N, &mut q), Err(AllocError::InvalidSize { size: 0, .. })));
    assert!(matches!(
        a.alloc_at(FrameRun { start: 0, len: 0 }, T1, N, &mut q),
        Err(AllocError::InvalidSize { size: 0, .. })
    ));
    assert!(matches!(a.compaction_plan(0), Err(AllocError::InvalidSize { size: 0, .. })));
}

#[test]
fn alloc_at_errors() {
    let mut a = arena(10, 20);
    let mut q = QuotaBook::new();
    a.alloc_at(FrameRun { start: 2, len: 2 }, T1, N, &mut q).unwrap();
    assert_eq!(a.state(2), Some(FrameState::Used { tenant: T1 }));
    let run = |start, len| FrameRun { start, len };
    assert_eq!(a.alloc_at(run(10, 1), T1, N, &mut q), Err(AllocError::InvalidAddress { addr: 10 }));
    assert_eq!(a.alloc_at(run(8, 3), T1, N, &mut q), Err(AllocError::InvalidAddress { addr: 10 }));
    assert_eq!(a.alloc_at(run(8, u32::MAX), T1, N, &mut q), Err(AllocError::InvalidAddress { addr: 10 }));
    assert_eq!(a.alloc_at(run(0, 4), T1, N, &mut q), Err(AllocError::InUse { addr: 2 }));
    assert_eq!(a.alloc_at(run(4, 7), T1, N, &mut q), Err(AllocError::InvalidAddress { addr: 10 }));
    assert_eq!(a.alloc_at(run(3, 7), T1, N, &mut q), Err(AllocError::InUse { addr: 3 }));
    q.set_limit(T2, Tier::Gpu, Some(F));
    assert!(matches!(a.alloc_at(run(4, 2), T2, N, &mut q), Err(AllocError::QuotaExceeded { .. })));
    assert_eq!(q.used(T2, Tier::Gpu), 0);
    assert_eq!(a.used_frames(), 2);
    assert_eq!(q.used(T1, Tier::Gpu), 2 * F);
}

#[test]
fn alloc_at_respects_headroom() {
    let mut a = arena(10, 20);
    let mut q = QuotaBook::new();
    let run = FrameRun { start: 0, len: 9 };
    assert_eq!(
        a.alloc_at(run, T1, N, &mut q),
        Err(AllocError::OutOfMemory { requested: 9, available: 8, largest_free: 10 })
    );
    assert_eq!(q.used(T1, Tier::Gpu), 0);
    a.alloc_at(run, T1, R, &mut q).unwrap();
    assert_eq!(q.used(T1, Tier::Gpu), 9 * F);
}

#[test]
fn free_validates_everything_first() {
    let mut a = arena(10, 0);
    let mut q = QuotaBook::new();
    a.alloc(4, T1, N, &mut q).unwrap();
    a.alloc(2, T2, N, &mut q).unwrap();
    a.lease(1).unwrap();
    let before = owners(&a);
    assert_eq!(a.free([0, 10], &mut q), Err(AllocError::InvalidAddress { addr: 10 }));
    assert_eq!(a.free([0, 7], &mut q), Err(AllocError::DoubleFree { addr: 7 }));
    assert_eq!(a.free([0, 1], &mut q), Err(AllocError::FrameLeased { frame: 1 }));
    assert_eq!(a.free([2, 3, 2], &mut q), Err(AllocError::DoubleFree { addr: 2 }));
    assert_eq!(owners(&a), before);
    assert_eq!(q.used(T1, Tier::Gpu), 4 * F);
    // Several tenants in one call; each is credited.
    assert_eq!(a.free([5, 0, 4, 3], &mut q), Ok(4));
    assert_eq!(q.used(T1, Tier::Gpu), 2 * F);
    assert_eq!(q.used(T2, Tier::Gpu), 0);
    assert_eq!(a.free_runs().collect::<Vec<_>>(), vec![FrameRun { start: 0, len: 1 }, FrameRun { start: 3, len: 7 }]);
    assert_eq!(a.free(std::iter::empty(), &mut q), Ok(0));
}

#[test]
fn leases() {
    let mut a = arena(4, 0);
    let mut q = QuotaBook::new();
    a.alloc(2, T1, N, &mut q).unwrap();
    assert_eq!(a.lease(0), Ok(1));
    assert_eq!(a.lease(0), Ok(2));
    assert_eq!(a.lease(1), Ok(1));
    assert_eq!(a.leased_frames(), 2);
    assert_eq!(a.lease_count(0), 2);
    assert_eq!(a.lease_count(3), 0);
    assert_eq!(a.lease_count(99), 0);
    assert_eq!(a.lease(2), Err(AllocError::DoubleFree { addr: 2 }));
    assert_eq!(a.lease(4), Err(AllocError::InvalidAddress { addr: 4 }));
    assert_eq!(a.unlease(2), Err(AllocError::DoubleFree { addr: 2 }));
    assert_eq!(a.unlease(4), Err(AllocError::InvalidAddress { addr: 4 }));
    assert_eq!(a.unlease(0), Ok(1));
    assert_eq!(a.unlease(0), Ok(0));
    assert_eq!(a.unlease(0), Err(AllocError::NotLeased { frame: 0 }));
    assert_eq!(a.leased_frames(), 1);
    assert_eq!(a.free([0], &mut q), Ok(1));
    assert_eq!(a.free([1], &mut q), Err(AllocError::FrameLeased { frame: 1 }));
    a.unlease(1).unwrap();
    assert_eq!(a.leased_frames(), 0);
    a.free([1], &mut q).unwrap();
}

/// The layout `UUUU.U.U..`: frames 0-3, 5 and 7 used by T1 on a 10-frame arena.
fn layout() -> (FrameArena, QuotaBook) {
    let mut a = arena(10, 0);
    let mut q = QuotaBook::new();
    a.alloc(10, T1, N, &mut q).unwrap();
    a.free([4, 6, 8, 9], &mut q).unwrap();
    (a, q)
}

#[test]
fn compaction_noop_when_a_run_is_free() {
    let (a, _) = layout();
    let plan = a.compaction_plan(2).unwrap();
    assert_eq!(plan.target, FrameRun { start: 8, len: 2 });
    assert!(plan.is_noop());
    assert!(a.compaction_plan(1).unwrap().is_noop());
}

#[test]
fn compaction_moves_out_of_the_emptiest_window() {
    let (mut a, mut q) = layout();
    // Windows of 3 holding a single used frame: [4, 7), [6, 9), [7, 10); lowest wins.
    let plan = a.compaction_plan(3).unwrap();
    assert_eq!(plan.target, FrameRun { start: 4, len: 3 });
    assert_eq!(plan.moves, vec![FrameMove { from: 5, to: 8 }]);
    a.apply_plan(&plan).unwrap();
    assert!(plan.target.iter().all(|f| a.state(f) == Some(FrameState::Free)));
    assert_eq!(a.state(8), Some(FrameState::Used { tenant: T1 }));
    // Moves leave quotas alone.
    assert_eq!(q.used(T1, Tier::Gpu), 6 * F);
    a.alloc_at(plan.target, T2, N, &mut q).unwrap();
}

#[test]
fn compaction_uses_every_free_frame_and_counts_honestly() {
    let (a, _) = layout();
    // 4 free frames: a run of 4 is possible, 5 is not.
    let plan = a.compaction_plan(4).unwrap();
    assert_eq!(plan.target, FrameRun { start: 6, len: 4 });
    assert_eq!(plan.moves, vec![FrameMove { from: 7, to: 4 }]);
    assert!(matches!(a.compaction_plan(5), Err(AllocError::CompactionImpossible { frames: 5, .. })));
    assert!(matches!(a.compaction_plan(11), Err(AllocError::CompactionImpossible { frames: 11, .. })));
    let mut b = a.clone();
    b.apply_plan(&plan).unwrap();
    assert_eq!(b.largest_free_run(), 4);
    assert_eq!(b.used_frames(), 6);
    assert_eq!(b.fragmentation().free_ranges, 1);
    // Headroom does not stop compaction: it is the fabric's own work.
    let mut c = arena(10, 50);
    let mut q = QuotaBook::new();
    c.alloc(5, T1, N, &mut q).unwrap();
    c.alloc(5, T1, R, &mut q).unwrap();
    c.free([1, 3, 5, 7, 9], &mut q).unwrap();
    let plan = c.compaction_plan(5).unwrap();
    assert_eq!(plan.moves.len(), 2);
    c.apply_plan(&plan).unwrap();
    assert_eq!(c.largest_free_run(), 5);
}

#[test]
fn compaction_avoids_leased_frames() {
    let (mut a, _) = layout();
    a.lease(7).unwrap();
    let plan = a.compaction_plan(4).unwrap();
    // Windows holding frame 7 are excluded; [3, 7) holds the fewest used frames (3, 5).
    assert_eq!(plan.target, FrameRun { start: 3, len: 4 });
    assert_eq!(plan.moves, vec![FrameMove { from: 3, to: 8 }, FrameMove { from: 5, to: 9 }]);
    a.lease(3).unwrap();
    a.lease(5).unwrap();
    assert!(matches!(a.compaction_plan(4), Err(AllocError::CompactionImpossible { frames: 4, .. })));
    // A plan made before a lease is refused when applied.
    a.unlease(3).unwrap();
    a.unlease(5).unwrap();
    let plan = a.compaction_plan(4).unwrap();
    a.lease(5).unwrap();
    assert_eq!(a.apply_plan(&plan), Err(AllocError::FrameLeased { frame: 5 }));
    assert_eq!(a.state(8), Some(FrameState::Free));
}

#[test]
fn apply_move_errors() {
    let (mut a, _) = layout();
    let mv = |from, to| FrameMove { from, to };
    assert_eq!(a.apply_move(mv(10, 4)), Err(AllocError::InvalidAddress { addr: 10 }));
    assert_eq!(a.apply_move(mv(0, 10)), Err(AllocError::InvalidAddress { addr: 10 }));
    assert_eq!(a.apply_move(mv(4, 6)), Err(AllocError::DoubleFree { addr: 4 }));
    assert_eq!(a.apply_move(mv(0, 1)), Err(AllocError::InUse { addr: 1 }));
    assert_eq!(a.apply_move(mv(0, 0)), Err(AllocError::InUse { addr: 0 }));
    a.lease(0).unwrap();
    assert_eq!(a.apply_move(mv(0, 4)), Err(AllocError::FrameLeased { frame: 0 }));
    a.unlease(0).unwrap();
    a.apply_move(mv(0, 4)).unwrap();
    assert_eq!(a.state(0), Some(FrameState::Free));
    assert_eq!(a.state(4), Some(FrameState::Used { tenant: T1 }));
    assert_eq!(a.used_frames(), 6);
}

#[test]
fn apply_plan_is_all_or_nothing() {
    let (mut a, _) = layout();
    let before = owners(&a);
    let plan = CompactionPlan {
        target: FrameRun { start: 0, len: 1 },
        moves: vec![
            FrameMove { from: 0, to: 4 },
            // Chained: sees frame 4 used by the first move.
            FrameMove { from: 4, to: 6 },
            // Frame 0 was vacated by the first move.
            FrameMove { from: 0, to: 8 },
        ],
    };
    assert_eq!(a.apply_plan(&plan), Err(AllocError::DoubleFree { addr: 0 }));
    assert_eq!(owners(&a), before);
    let plan = CompactionPlan {
        target: FrameRun { start: 0, len: 1 },
        moves: vec![FrameMove { from: 0, to: 4 }, FrameMove { from: 4, to: 6 }],
    };
    a.apply_plan(&plan).unwrap();
    assert_eq!(a.state(0), Some(FrameState::Free));
    assert_eq!(a.state(4), Some(FrameState::Free));
    assert_eq!(a.state(6), Some(FrameState::Used { tenant: T1 }));
}

#[test]
fn frame_run_helpers() {
    let r = FrameRun { start: 3, len: 2 };
    assert_eq!(r.end(), 5);
    assert!(r.contains(4));
    assert!(!r.contains(5));
    assert_eq!(r.into_iter().collect::<Vec<_>>(), vec![3, 4]);
    let huge = FrameRun { start: u32::MAX - 1, len: 10 };
    assert_eq!(huge.end(), u32::MAX);
    let a = FrameAlloc { runs: vec![FrameRun { start: 0, len: u32::MAX - 1 }; 2] };
    assert_eq!(a.len(), u32::MAX);
    assert!(FrameAlloc::default().is_empty());
}
