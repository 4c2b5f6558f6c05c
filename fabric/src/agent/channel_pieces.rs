//! How a lease's pages cross a channel GPU to GPU: each end's pages lie in runs of frames contiguous in its
//! device memory, and each send or receive must be one contiguous range at both ends, so the pages go in the
//! pieces that both ends' runs cut them into (the union of their breaks). Pure: the requester sends its runs,
//! the home cuts the pieces and sends them back, and the requester checks that they fit its own runs before it
//! posts a byte.

use crate::fabric::LeasePtr;

/// The device address of each page of a lease.
pub(crate) fn page_addresses(ptr: &LeasePtr, page: u64) -> Vec<u64> {
    match ptr {
        LeasePtr::Contiguous { ptr, len } => (0..len / page.max(1)).map(|i| ptr + i * page).collect(),
        LeasePtr::Pages(v) => v.clone(),
    }
}

/// Pages at `addrs` as runs of pages contiguous in memory (page counts, in order).
pub(crate) fn runs_of(addrs: &[u64], page: u64) -> Vec<u32> {
    let mut runs: Vec<u32> = Vec::new();
    for (i, &a) in addrs.iter().enumerate() {
        match runs.last_mut() {
            Some(n) if i > 0 && addrs[i - 1].wrapping_add(page) == a && *n < u32::MAX => *n += 1,
            _ => runs.push(1),
        }
    }
    runs
}

/// The page numbers where `runs` break (each run's end), as a sorted list ending at their total.
fn breaks(runs: &[u32]) -> Vec<u64> {
    runs.iter()
        .scan(0u64, |at, &n| {
            *at += u64::from(n);
            Some(*at)
        })
        .collect()
}

/// Why a list of runs or pieces does not describe `pages` pages.
fn check(list: &[u32], pages: u64, what: &str) -> Result<(), String> {
    if list.contains(&0) {
        return Err(format!("{what} hold a piece of no pages"));
    }
    let total: u64 = list.iter().map(|&n| u64::from(n)).sum();
    if total != pages {
        return Err(format!("{what} cover {total} pages, not the lease's {pages}"));
    }
    Ok(())
}

/// The pieces (page counts) that both `mine` and `theirs` cut `pages` pages into; an error when `theirs` (from a
/// peer) does not describe `pages` pages.
pub(crate) fn pieces(mine: &[u32], theirs: &[u32], pages: u64) -> Result<Vec<u32>, String> {
    check(mine, pages, "this end's runs")?;
    check(theirs, pages, "the requester's runs")?;
    let mut cuts = breaks(mine);
    cuts.extend(breaks(theirs));
    cuts.sort_unstable();
    cuts.dedup();
    let mut at = 0u64;
    Ok(cuts
        .into_iter()
        .map(|c| {
            let n = (c - at) as u32;
            at = c;
            n
        })
        .collect())
}

/// Checks pieces from the home against this end's runs: they must cover `pages` pages and break wherever a run
/// does (so that each lies within one run here).
pub(crate) fn fit(pieces: &[u32], mine: &[u32], pages: u64) -> Result<(), String> {
    check(pieces, pages, "the home's pieces")?;
    let cuts = breaks(pieces);
    match breaks(mine).into_iter().find(|b| cuts.binary_search(b).is_err()) {
        Some(b) => Err(format!("the home's pieces run across page {b}, where this end's memory breaks")),
        None => Ok(()),
    }
}

/// Each piece's first page and its page count, in order.
pub(crate) fn spans(pieces: &[u32]) -> impl Iterator<Item = (usize, usize)> + '_ {
    pieces.iter().scan(0usize, |at, &n| {
        let first = *at;
        *at += n as usize;
        Some((first, n as usize))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_follow_contiguous_frames() {
        let p = 4096;
        assert_eq!(runs_of(&[0, 4096, 8192, 20000, 24096, 0], p), vec![3, 2, 1]);
        assert_eq!(runs_of(&[], p), Vec::<u32>::new());
        let whole = page_addresses(&LeasePtr::Contiguous { ptr: 1 << 20, len: 3 * p }, p);
        assert_eq!(whole, vec![1 << 20, (1 << 20) + p, (1 << 20) + 2 * p]);
        assert_eq!(runs_of(&whole, p), vec![3]);
    }

    #[test]
    fn pieces_break_wherever_either_end_does() {
        assert_eq!(pieces(&[5], &[5], 5).unwrap(), vec![5]);
        assert_eq!(pieces(&[2, 3], &[4, 1], 5).unwrap(), vec![2, 2, 1]);
        assert_eq!(pieces(&[1, 1, 1], &[3], 3).unwrap(), vec![1, 1, 1]);
        for (mine, theirs) in [(vec![2, 3], vec![4, 1]), (vec![5], vec![1, 4]), (vec![1, 1, 3], vec![2, 3])] {
            let p = pieces(&mine, &theirs, 5).unwrap();
            assert!(fit(&p, &theirs, 5).is_ok() && fit(&p, &mine, 5).is_ok(), "{p:?} fits both ends");
            let s: Vec<(usize, usize)> = spans(&p).collect();
            assert_eq!(s.last().map(|(f, n)| f + n), Some(5));
        }
    }

    #[test]
    fn pieces_that_do_not_fit_are_refused() {
        assert!(pieces(&[5], &[2, 2], 5).unwrap_err().contains("cover 4 pages"));
        assert!(pieces(&[5], &[5, 0], 5).unwrap_err().contains("no pages"));
        assert!(pieces(&[5], &[u32::MAX, u32::MAX, 2], 5).is_err(), "a total past the lease");
        assert!(fit(&[5], &[2, 3], 5).unwrap_err().contains("page 2"));
        assert!(fit(&[2, 2], &[2, 2], 5).is_err());
        assert!(fit(&[2, 3], &[2, 3], 5).is_ok());
    }
}
