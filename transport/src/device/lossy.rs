//! The lossy page format on the CPU: what `kernels/page_codec.cu` does on the GPU, operation for operation, so
//! that both give the same bytes. The emulated device packs with it, the fabric expands a packed page with it
//! when a caller reads one that sits in host memory or on the storage tier, and the tests hold the GPU to it.
//!
//! A packed page of n values is `[n one-byte codes][n / 256 fp32 scales]` (little-endian), from the start of
//! its frame. A group's scale is its largest magnitude over the code's largest value (0 for a group at most
//! `LOSSY_TINY`, stored as zeros); each value is multiplied by the inverse and rounded to nearest, ties to even
//! (e4m3 saturating at 448; int8 clamped to ±127). Expanding multiplies each code by its group's scale and
//! rounds to the page's element type. NaN results are the GPU's one NaN (0x7fffffff), so NaN's bits match too.

use vfabric_allocator::{Element, Lossy, LossyCode, LOSSY_GROUP, LOSSY_TINY};

/// bf16 bits as fp32.
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// fp32 to bf16 bits, rounded to nearest even; NaN stays a quiet NaN.
pub fn f32_to_bf16(f: f32) -> u16 {
    let u = f.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 0x40) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// fp32 to fp8 e4m3 (no infinities; 0x7f is NaN), rounded to nearest even, saturating at ±448: PTX's
/// `cvt.rn.satfinite.e4m3x2.f32`.
pub fn encode_e4m3(q: f32) -> u8 {
    if q.is_nan() {
        return 0x7f;
    }
    let sign = if q.is_sign_negative() { 0x80 } else { 0 };
    let a = q.abs();
    if a >= 448.0 {
        return sign | 0x7e;
    }
    let code = if a < SMALLEST_NORMAL_E4M3 {
        // Subnormals: steps of 2^-9; 8 steps is the smallest normal, whose code is 8 as well.
        round_small(a * 512.0) as u8
    } else {
        // fp32's exponent and top three mantissa bits, rounded to nearest even on the 20 bits below them (a
        // carry out of the mantissa moves the exponent up, as it should); e4m3's exponent bias is 7, fp32's 127.
        let u = a.to_bits();
        let r = (u + 0x7_ffff + ((u >> 20) & 1)) >> 20;
        (r - ((127 - 7) << 3)).min(0x7e) as u8
    };
    sign | code
}

/// The smallest normal e4m3 value, 2^-6.
const SMALLEST_NORMAL_E4M3: f32 = 0.015625;

/// `x` (0 <= |x| < 2^22) rounded to the nearest integer, ties to even: adding 1.5 x 2^23 leaves no fraction
/// bits, so the float addition itself rounds (as `round_ties_even`, without a libm call).
fn round_small(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

/// fp8 e4m3 to fp32 (exact).
pub fn decode_e4m3(c: u8) -> f32 {
    let sign = if c & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (i32::from((c >> 3) & 0xf), f32::from(c & 7));
    if c & 0x7f == 0x7f {
        return f32::NAN;
    }
    if e == 0 {
        return sign * m * 2f32.powi(-9);
    }
    sign * (1.0 + m / 8.0) * 2f32.powi(e - 7)
}

/// A value already scaled to int8's range, as its code: clamped, then rounded (the same as rounding then
/// clamping, for the bounds are whole). `max` then `min`, not `clamp`: NaN becomes -127 as with the kernel's
/// `fmaxf`, where `clamp` keeps it NaN.
#[inline]
#[allow(clippy::manual_clamp)]
fn encode_int8(q: f32) -> u8 {
    round_small(q.max(-127.0).min(127.0)) as i8 as u8
}

/// Every e4m3 code's value, by code.
fn e4m3_values() -> &'static [f32; 256] {
    static TABLE: std::sync::LazyLock<[f32; 256]> =
        std::sync::LazyLock::new(|| std::array::from_fn(|c| decode_e4m3(c as u8)));
    &TABLE
}

/// Value `i` of a page of `element`s.
pub fn value(page: &[u8], i: usize, element: Element) -> f32 {
    match element {
        Element::Bf16 => bf16_to_f32(u16::from_le_bytes([page[2 * i], page[2 * i + 1]])),
        Element::F32 => f32::from_le_bytes(page[4 * i..4 * i + 4].try_into().unwrap_or_default()),
    }
}

/// The values of one group of a page of `element`s (its `LOSSY_GROUP x element.bytes()` bytes), as fp32.
#[inline]
fn group_values(bytes: &[u8], element: Element, out: &mut [f32; LOSSY_GROUP]) {
    match element {
        Element::Bf16 => {
            for (v, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *v = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        Element::F32 => {
            for (v, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
    }
}

/// Packs `page` into `out` (at least [`Lossy::packed_len`] bytes; the rest is left alone). `page`'s length must
/// hold whole groups ([`Lossy::fits`]); a partial last group is not packed.
pub fn pack(lossy: Lossy, page: &[u8], out: &mut [u8]) {
    let n = page.len() / lossy.element.bytes();
    let groups = n / LOSSY_GROUP;
    let top = lossy.top();
    let (codes, scales) = out.split_at_mut(n);
    let group_bytes = LOSSY_GROUP * lossy.element.bytes();
    let mut values = [0f32; LOSSY_GROUP];
    let pieces = page.chunks_exact(group_bytes).zip(codes.chunks_exact_mut(LOSSY_GROUP));
    for ((bytes, codes), scale_at) in pieces.zip(scales.chunks_exact_mut(4)).take(groups) {
        group_values(bytes, lossy.element, &mut values);
        // `max` skips NaN as the kernel's `fmaxf` does (and gives the same largest value in any order).
        let m = values.iter().fold(0f32, |m, v| m.max(v.abs()));
        // A tiny group is zeros: `top / m` would overflow.
        let (inv, scale) = if m > LOSSY_TINY { (top / m, m / top) } else { (0.0, 0.0) };
        match lossy.code {
            LossyCode::Fp8E4m3 => codes.iter_mut().zip(&values).for_each(|(o, v)| *o = encode_e4m3(v * inv)),
            LossyCode::Int8 => codes.iter_mut().zip(&values).for_each(|(o, v)| *o = encode_int8(v * inv)),
        }
        scale_at.copy_from_slice(&scale.to_le_bytes());
    }
}

/// Expands `packed` (as [`pack`] leaves it) into `page`.
pub fn unpack(lossy: Lossy, packed: &[u8], page: &mut [u8]) {
    match lossy.code {
        // fp8 codes through a table of their values; int8 codes convert in a vector instruction, faster than a
        // table's lookups.
        LossyCode::Fp8E4m3 => {
            let table = e4m3_values();
            expand(lossy.element, packed, page, |c| table[usize::from(c)]);
        }
        LossyCode::Int8 => expand(lossy.element, packed, page, |c| f32::from(c as i8)),
    }
}

/// [`unpack`] with `decode` giving each code's value (one copy of the loops for each kind of code).
#[inline(always)]
fn expand(element: Element, packed: &[u8], page: &mut [u8], decode: impl Fn(u8) -> f32) {
    let n = page.len() / element.bytes();
    let groups = n / LOSSY_GROUP;
    let (codes, scales) = packed.split_at(n);
    let group_bytes = LOSSY_GROUP * element.bytes();
    let pieces = page.chunks_exact_mut(group_bytes).zip(codes.chunks_exact(LOSSY_GROUP));
    for ((out, codes), scale) in pieces.zip(scales.chunks_exact(4)).take(groups) {
        let scale = f32::from_le_bytes([scale[0], scale[1], scale[2], scale[3]]);
        // A GPU's arithmetic gives one NaN, 0x7fffffff: so does this (its bf16 is 0x7fff). bf16 values are
        // made first and written after: two simple loops the compiler vectorises.
        match element {
            Element::Bf16 => {
                let mut values = [0u16; LOSSY_GROUP];
                for (v, &c) in values.iter_mut().zip(codes) {
                    // `f32_to_bf16`, without branches.
                    let x = decode(c) * scale;
                    let u = x.to_bits();
                    let rounded = (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16;
                    *v = if x.is_nan() { 0x7fff } else { rounded };
                }
                for (o, v) in out.chunks_exact_mut(2).zip(&values) {
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
            // fp32 values go straight out: one pass is faster here than two.
            Element::F32 => {
                for (o, &c) in out.chunks_exact_mut(4).zip(codes) {
                    let x = decode(c) * scale;
                    o.copy_from_slice(&(if x.is_nan() { f32::from_bits(0x7fff_ffff) } else { x }).to_le_bytes());
                }
            }
        }
    }
}

/// The largest value by which `back` differs from `page` over its declared error bound (at most 1.0 when the
/// bound holds for every value), and the values compared. Both are pages of `lossy.element`s.
pub fn worst_error(lossy: Lossy, page: &[u8], back: &[u8]) -> (f64, usize) {
    let n = page.len().min(back.len()) / lossy.element.bytes();
    let mut worst = 0f64;
    for g in 0..n / LOSSY_GROUP {
        let at = g * LOSSY_GROUP;
        let m = (at..at + LOSSY_GROUP).fold(0f32, |m, i| m.max(value(page, i, lossy.element).abs()));
        for i in at..at + LOSSY_GROUP {
            let (x, y) = (value(page, i, lossy.element), value(back, i, lossy.element));
            let err = f64::from((x - y).abs());
            let bound = f64::from(lossy.error_bound(x, m));
            let r = if bound > 0.0 {
                err / bound
            } else if err == 0.0 {
                0.0
            } else {
                f64::INFINITY
            };
            worst = worst.max(if r.is_nan() { f64::INFINITY } else { r });
        }
    }
    (worst, n - n % LOSSY_GROUP)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfabric_allocator::Compression;

    /// Puts value `i` of a page of `element`s.
    fn set_value(page: &mut [u8], i: usize, element: Element, v: f32) {
        match element {
            Element::Bf16 => page[2 * i..2 * i + 2].copy_from_slice(&f32_to_bf16(v).to_le_bytes()),
            Element::F32 => page[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes()),
        }
    }

    /// The format written out value by value, with the float library's rounding: the oracle the fast codec
    /// (and so the GPU's kernels, which the GPU tests hold to the fast codec) must match bit for bit.
    mod reference {
        use super::*;

        pub fn encode_e4m3(q: f32) -> u8 {
            if q.is_nan() {
                return 0x7f;
            }
            let sign = if q.is_sign_negative() { 0x80 } else { 0 };
            let a = q.abs();
            if a >= 448.0 {
                return sign | 0x7e;
            }
            let code = if a < 2f32.powi(-6) {
                (a * 512.0).round_ties_even() as u8
            } else {
                let e = ((a.to_bits() >> 23) as i32) - 127;
                let m = ((a / 2f32.powi(e) - 1.0) * 8.0).round_ties_even() as i32;
                let (e, m) = if m == 8 { (e + 1, 0) } else { (e, m) };
                (((e + 7) << 3) | m).min(0x7e) as u8
            };
            sign | code
        }

        #[allow(clippy::manual_clamp)]
        fn encode(q: f32, code: LossyCode) -> u8 {
            match code {
                LossyCode::Fp8E4m3 => encode_e4m3(q),
                LossyCode::Int8 => q.round_ties_even().max(-127.0).min(127.0) as i8 as u8,
            }
        }

        fn decode(c: u8, code: LossyCode) -> f32 {
            match code {
                LossyCode::Fp8E4m3 => decode_e4m3(c),
                LossyCode::Int8 => f32::from(c as i8),
            }
        }

        pub fn pack(lossy: Lossy, page: &[u8], out: &mut [u8]) {
            let n = page.len() / lossy.element.bytes();
            let top = lossy.top();
            for g in 0..n / LOSSY_GROUP {
                let at = g * LOSSY_GROUP;
                let m = (at..at + LOSSY_GROUP).fold(0f32, |m, i| m.max(value(page, i, lossy.element).abs()));
                let (inv, scale) = if m > LOSSY_TINY { (top / m, m / top) } else { (0.0, 0.0) };
                for (i, o) in out[at..at + LOSSY_GROUP].iter_mut().enumerate() {
                    *o = encode(value(page, at + i, lossy.element) * inv, lossy.code);
                }
                out[n + 4 * g..n + 4 * g + 4].copy_from_slice(&scale.to_le_bytes());
            }
        }

        pub fn unpack(lossy: Lossy, packed: &[u8], page: &mut [u8]) {
            let n = page.len() / lossy.element.bytes();
            for g in 0..n / LOSSY_GROUP {
                let scale = f32::from_le_bytes(packed[n + 4 * g..n + 4 * g + 4].try_into().unwrap());
                let at = g * LOSSY_GROUP;
                for (i, &c) in packed[at..at + LOSSY_GROUP].iter().enumerate() {
                    let v = decode(c, lossy.code) * scale;
                    set_value(page, at + i, lossy.element, if v.is_nan() { f32::from_bits(0x7fff_ffff) } else { v });
                }
            }
        }
    }

    #[test]
    fn e4m3_encoding_matches_the_reference_on_every_kind_of_float() {
        // Every 61st bit pattern (70 million floats: every exponent, both signs, NaNs and infinities), then
        // every pattern around each code's value and around the midpoint between neighbouring codes (the ties).
        let mut checked = 0u64;
        let mut check = |u: u32| {
            let q = f32::from_bits(u);
            assert_eq!(encode_e4m3(q), reference::encode_e4m3(q), "{q:e} ({u:#010x})");
            checked += 1;
        };
        (0..=u32::MAX).step_by(61).for_each(&mut check);
        for c in 0..=0x7eu8 {
            let (v, next) = (decode_e4m3(c), decode_e4m3(c + 1));
            let mid = if c < 0x7e { (v + next) / 2.0 } else { 448.0 };
            for centre in [v.to_bits(), mid.to_bits()] {
                for u in centre.saturating_sub(1 << 12)..=centre.saturating_add(1 << 12) {
                    check(u);
                    check(u | 0x8000_0000);
                }
            }
        }
        assert!(checked > 70_000_000);
    }

    #[test]
    fn pages_pack_and_expand_as_the_reference_does() {
        for c in LOSSY {
            let l = c.lossy().unwrap();
            for seed in [3, 5, 7] {
                let mut page = page_of(l.element, 16 * LOSSY_GROUP, seed);
                // A group with a NaN, one with an infinity, one with a subnormal value, one all tiny, one
                // saturating.
                let specials = [(1, f32::NAN), (2, f32::INFINITY), (6, 1e-40), (4, 1e-33), (5, -3e38)];
                for (g, v) in specials {
                    set_value(&mut page, g * LOSSY_GROUP + 9, l.element, v);
                }
                // A group whose values but its largest (1.0) scale below e4m3's normal range, into its subnormal
                // codes, and around int8's smallest steps.
                for i in 0..LOSSY_GROUP {
                    let v = if i == 0 { 1.0 } else { i as f32 * 1.3e-7 * if i % 2 == 0 { 1.0 } else { -300.0 } };
                    set_value(&mut page, 3 * LOSSY_GROUP + i, l.element, v);
                }
                let n = l.packed_len(page.len() as u64) as usize;
                let (mut fast, mut slow) = (vec![0xeeu8; n + 8], vec![0xeeu8; n + 8]);
                pack(l, &page, &mut fast);
                reference::pack(l, &page, &mut slow);
                assert!(fast == slow, "{c} seed {seed}: packed bytes differ");
                let (mut fast_back, mut slow_back) = (vec![0u8; page.len()], vec![0u8; page.len()]);
                unpack(l, &fast, &mut fast_back);
                reference::unpack(l, &slow, &mut slow_back);
                assert!(fast_back == slow_back, "{c} seed {seed}: expanded values differ");
            }
        }
    }

    const LOSSY: [Compression; 4] =
        [Compression::Fp8Bf16, Compression::Fp8F32, Compression::Int8Bf16, Compression::Int8F32];

    #[test]
    fn e4m3_codes_round_trip_and_round_to_nearest_even() {
        let mut finite = Vec::new();
        for c in 0..=255u8 {
            let v = decode_e4m3(c);
            if c & 0x7f == 0x7f {
                assert!(v.is_nan());
                continue;
            }
            assert_eq!(encode_e4m3(v), c, "code {c:#x} ({v})");
            if c < 0x80 {
                finite.push(v);
            }
        }
        assert_eq!(finite.last(), Some(&448.0));
        for w in finite.windows(2) {
            let (lo, hi) = (w[0], w[1]);
            let mid = (lo + hi) / 2.0;
            let even = if encode_e4m3(lo) % 2 == 0 { lo } else { hi };
            assert_eq!(decode_e4m3(encode_e4m3(mid)), even, "tie between {lo} and {hi}");
            assert_eq!(decode_e4m3(encode_e4m3(lo + (hi - lo) * 0.4)), lo);
            assert_eq!(decode_e4m3(encode_e4m3(lo + (hi - lo) * 0.6)), hi);
            assert_eq!(decode_e4m3(encode_e4m3(-mid)), -even);
        }
        assert_eq!(encode_e4m3(1e9), 0x7e);
        assert_eq!(encode_e4m3(460.0), 0x7e, "saturates instead of rounding past 448");
        assert_eq!(encode_e4m3(f32::NEG_INFINITY), 0xfe);
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80, "tie to even (down)");
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82, "tie to even (up)");
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        assert_eq!(bf16_to_f32(0xc040), -3.0);
    }

    fn page_of(element: Element, n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        let mut page = vec![0u8; n * element.bytes()];
        for i in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Magnitudes over eight decades, so groups hold values far below their largest.
            let mag = 10f32.powi((x % 8) as i32 - 6);
            let v = mag * (((x >> 12) % 2001) as f32 / 1000.0 - 1.0);
            set_value(&mut page, i, element, if i % 1000 == 7 { 0.0 } else { v });
        }
        page
    }

    #[test]
    fn packed_pages_expand_within_the_declared_bound() {
        for c in LOSSY {
            let l = c.lossy().unwrap();
            let page = page_of(l.element, 64 * LOSSY_GROUP, 11);
            let mut packed = vec![0u8; l.packed_len(page.len() as u64) as usize];
            pack(l, &page, &mut packed);
            let mut back = vec![0u8; page.len()];
            unpack(l, &packed, &mut back);
            let (worst, n) = worst_error(l, &page, &back);
            assert_eq!(n, 64 * LOSSY_GROUP);
            assert!(worst <= 1.0, "{c}: an error {worst}x its bound");
            // The bound is not loose: the worst value uses a good part of it.
            assert!(worst > 0.2, "{c}: worst {worst}");
            // A change the bound does not allow is caught.
            let mut off = back.clone();
            set_value(&mut off, 5, l.element, value(&back, 5, l.element) * 1.5 + 1.0);
            assert!(worst_error(l, &page, &off).0 > 1.0, "{c}");
        }
    }

    #[test]
    fn packing_expanded_values_again_gives_the_same_codes() {
        for c in LOSSY {
            let l = c.lossy().unwrap();
            let page = page_of(l.element, 64 * LOSSY_GROUP, 23);
            let n = l.packed_len(page.len() as u64) as usize;
            let (mut once, mut twice) = (vec![0u8; n], vec![0u8; n]);
            pack(l, &page, &mut once);
            let mut back = vec![0u8; page.len()];
            unpack(l, &once, &mut back);
            pack(l, &back, &mut twice);
            assert_eq!(once[..n - 4 * 64], twice[..n - 4 * 64], "{c}: the codes");
            let mut again = vec![0u8; page.len()];
            unpack(l, &twice, &mut again);
            assert_eq!(again, back, "{c}: the values");
        }
    }

    #[test]
    fn zero_groups_pack_to_zeros_and_expand_to_zeros() {
        for c in LOSSY {
            let l = c.lossy().unwrap();
            let page = vec![0u8; 4 * LOSSY_GROUP * l.element.bytes()];
            let mut packed = vec![0xabu8; l.packed_len(page.len() as u64) as usize];
            pack(l, &page, &mut packed);
            assert!(packed.iter().all(|&b| b == 0), "{c}");
            let mut back = vec![0xffu8; page.len()];
            unpack(l, &packed, &mut back);
            assert_eq!(back, page, "{c}");
        }
    }

    #[test]
    fn tiny_groups_come_back_as_zeros_not_nan() {
        for c in LOSSY {
            let l = c.lossy().unwrap();
            let mut page = vec![0u8; 2 * LOSSY_GROUP * l.element.bytes()];
            // A group of values around 1e-37 (Adam's moments of a row that is never used decay there)...
            for (i, v) in [0.0, 3e-38, -5e-38, 1e-37].iter().enumerate() {
                set_value(&mut page, i, l.element, *v);
            }
            // ...and one just above the threshold, whose inverse scale is still finite.
            set_value(&mut page, LOSSY_GROUP, l.element, 1e-30);
            set_value(&mut page, LOSSY_GROUP + 1, l.element, -3e-31);
            let mut packed = vec![0u8; l.packed_len(page.len() as u64) as usize];
            pack(l, &page, &mut packed);
            let mut back = vec![0xffu8; page.len()];
            unpack(l, &packed, &mut back);
            for i in 0..2 * LOSSY_GROUP {
                assert!(value(&back, i, l.element).is_finite(), "{c}: value {i}");
            }
            let (worst, _) = worst_error(l, &page, &back);
            assert!(worst <= 1.0, "{c}: {worst}");
        }
    }

    #[test]
    fn a_groups_largest_value_comes_back_nearly_exact() {
        let l = Compression::Int8F32.lossy().unwrap();
        let mut page = vec![0u8; LOSSY_GROUP * 4];
        set_value(&mut page, 3, Element::F32, -7.25);
        set_value(&mut page, 4, Element::F32, 0.01);
        let mut packed = vec![0u8; l.packed_len(page.len() as u64) as usize];
        pack(l, &page, &mut packed);
        assert_eq!(packed[3] as i8, -127);
        let mut back = vec![0u8; page.len()];
        unpack(l, &packed, &mut back);
        assert!((value(&back, 3, Element::F32) + 7.25).abs() < 1e-5);
        assert_eq!(value(&back, 4, Element::F32), 0.0, "below half a step");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

        /// Any finite values, from subnormals to fp32's largest, a group of one magnitude or of many: every value
        /// comes back within its bound, and packing what came back gives the same codes.
        #[test]
        fn any_finite_group_keeps_its_bound(
            bits in proptest::collection::vec(proptest::prelude::any::<u32>(), LOSSY_GROUP),
            exp in -149i32..128,
            spread in 0u32..40,
            code in 0usize..4,
        ) {
            let c = LOSSY[code];
            let l = c.lossy().unwrap();
            let mut page = vec![0u8; LOSSY_GROUP * l.element.bytes()];
            for (i, b) in bits.iter().enumerate() {
                // A random mantissa and sign at a random exponent within `spread` binades of `exp`.
                let e = (exp - (b % (spread + 1)) as i32).clamp(-149, 127);
                let m = 1.0 + (b >> 8) as f32 / (1u32 << 24) as f32;
                let v = if e < -126 { (m * 2f32.powi(e + 24)) * 2f32.powi(-24) } else { m * 2f32.powi(e) };
                let v = if b & 1 == 1 { -v } else { v };
                let v = if v.is_finite() { v } else { f32::MAX };
                set_value(&mut page, i, l.element, v);
            }
            let n = l.packed_len(page.len() as u64) as usize;
            let (mut once, mut twice) = (vec![0u8; n], vec![0u8; n]);
            pack(l, &page, &mut once);
            let mut back = vec![0u8; page.len()];
            unpack(l, &once, &mut back);
            let (worst, _) = worst_error(l, &page, &back);
            proptest::prop_assert!(worst <= 1.0, "{}: {}x the bound", c, worst);
            pack(l, &back, &mut twice);
            proptest::prop_assert_eq!(&once[..LOSSY_GROUP], &twice[..LOSSY_GROUP]);
        }
    }
}
