//! Payloads that arrive in pieces (a QUIC chunk in quinn's receive buffers), taken by byte range.

/// The bytes `start..start + len` of `parts` taken one after the other, as slices of the parts, into `out`
/// (cleared first). The range must lie within the parts.
pub(crate) fn slice_parts<'a>(parts: &[&'a [u8]], start: u64, len: u64, out: &mut Vec<&'a [u8]>) {
    out.clear();
    let (mut skip, mut want) = (start as usize, len as usize);
    for p in parts {
        if want == 0 {
            break;
        }
        if skip >= p.len() {
            skip -= p.len();
            continue;
        }
        let take = (p.len() - skip).min(want);
        out.push(&p[skip..skip + take]);
        want -= take;
        skip = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::slice_parts;
    use proptest::prelude::*;

    proptest! {
        /// Any range of the parts, taken as slices, is the same range of the parts put together.
        #[test]
        fn slices_of_parts_are_the_range(lens in proptest::collection::vec(0usize..40, 1..8), a in 0usize..300, b in 0usize..300) {
            let parts: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &n)| (0..n).map(|j| (i * 50 + j) as u8).collect()).collect();
            let refs: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
            let whole = parts.concat();
            let (lo, hi) = (a.min(b).min(whole.len()), a.max(b).min(whole.len()));
            let mut out = Vec::new();
            slice_parts(&refs, lo as u64, (hi - lo) as u64, &mut out);
            prop_assert_eq!(out.concat(), whole[lo..hi].to_vec());
            prop_assert!(out.iter().all(|s| !s.is_empty()) || hi == lo);
        }
    }
}
