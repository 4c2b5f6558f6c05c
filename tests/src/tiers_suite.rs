//! Walks over three tiers, on any device layer: what a walk in order costs the storage tier.

use vfabric::{ByteSize, ClusterConfig, Mode, Placement};

use crate::fabric_rig::{fabric, frames_of, gpus, read_through_lease, with_storage, write_pattern};
use crate::pattern;

/// A walk in order, one page a step, on a GPU over a region three times the GPU and host memory together, whose
/// later pages are still in memory (written last) and not yet on the storage tier: every leased byte is right,
/// the stored pages come up by prefetch (staged from the storage tier ahead of the walk), and host memory makes room for the pages it stages by dropping those the walk has passed (their copies on the
/// storage tier stand) before writing pages ahead of the walk to the storage tier only to read them back when
/// the walk gets there. Least recently used first wrote every page that was in memory; dropping behind writes
/// those that make the first room, before the walk has passed anything (about half).
pub fn walks_over_the_storage_tier_drop_what_they_passed(cfg: &ClusterConfig, dir: &std::path::Path) {
    let ps = cfg.memory.page_size.bytes();
    // GPU budgets of 16 pages (with_storage's), host memory of 64.
    let pages = 3 * (16 + 64);
    let (mut cfg, _path) = with_storage(cfg, &dir.join("tiers-suite.tier"), pages + 16);
    cfg.memory.host_arena = ByteSize(64 * ps);
    cfg.memory.readahead = ByteSize(8 * ps);
    let f = fabric(&cfg);
    let g = gpus(&f)[0];
    assert!(frames_of(&f, g) <= 16, "a GPU budget of 16 pages");
    let r = f.alloc(pages * ps, Placement::on(g)).expect("alloc");
    write_pattern(&f, &r, 61);
    let stored = f.stats().storage.map_or(0, |s| s.page_bytes) / ps;
    let in_memory = pages - stored;
    assert!(in_memory >= 64, "{in_memory} of {pages} pages in memory after writing");
    let before = f.traffic();
    for p in 0..pages {
        let lease = f.acquire(&r, p * ps..(p + 1) * ps, g, Mode::Read).expect("acquire");
        let got = read_through_lease(&f, &lease);
        assert_eq!(pattern::first_mismatch(61, p * ps, &got), None, "{g}: page {p} of the walk");
        f.release(lease).expect("release");
    }
    let t = f.traffic().since(&before);
    assert!(t.from_storage >= stored * ps, "the walk read the stored pages: {t:?}");
    // The walk's prefetch read them, staged into host memory ahead of it, rather than each acquire in turn.
    assert!(
        t.prefetched_from_storage * 4 >= stored * ps * 3 && t.prefetched_from_storage <= t.from_storage,
        "prefetch brought most of the {stored} stored pages up from the storage tier ahead of the walk: {t:?}"
    );
    let written = t.to_storage / ps;
    assert!(
        written * 3 <= in_memory * 2,
        "{written} of the {in_memory} pages in memory were written to the storage tier during the walk: {t:?}"
    );
}
