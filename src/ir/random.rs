//! The counter-based random numbers of SPEC section 9.5: Threefry-4x32 with 20 rounds
//! (Random123), and the conversion of its first output word to a cell's value.
//!
//! The generated C computes the same with `aj_threefry4x32_20` and `aj_rand_unit` of
//! `runtime_c/arrayjit.h`; both reproduce Random123's published known-answer vectors.

use super::Prec;

/// The rotation constants of Threefry-4x32 (Random123's `R_32x4_*`), per round modulo 8.
const ROT: [[u32; 2]; 8] = [
    [10, 26],
    [11, 21],
    [13, 27],
    [23, 5],
    [6, 20],
    [17, 11],
    [25, 10],
    [18, 20],
];

/// Skein's key-schedule parity constant for 32-bit words.
const PARITY: u32 = 0x1BD1_1BDA;

/// Threefry-4x32 with 20 rounds (Random123's `threefry4x32_R(20, ctr, key)`).
pub fn threefry4x32_20(ctr: [u32; 4], key: [u32; 4]) -> [u32; 4] {
    let ks = [
        key[0],
        key[1],
        key[2],
        key[3],
        PARITY ^ key[0] ^ key[1] ^ key[2] ^ key[3],
    ];
    let mut x: [u32; 4] = std::array::from_fn(|i| ctr[i].wrapping_add(ks[i]));
    for r in 0..20 {
        let [r0, r1] = ROT[r % 8];
        if r % 2 == 0 {
            x[0] = x[0].wrapping_add(x[1]);
            x[1] = x[1].rotate_left(r0) ^ x[0];
            x[2] = x[2].wrapping_add(x[3]);
            x[3] = x[3].rotate_left(r1) ^ x[2];
        } else {
            x[0] = x[0].wrapping_add(x[3]);
            x[3] = x[3].rotate_left(r0) ^ x[0];
            x[2] = x[2].wrapping_add(x[1]);
            x[1] = x[1].rotate_left(r1) ^ x[2];
        }
        if r % 4 == 3 {
            let s = (r + 1) / 4;
            for (i, xi) in x.iter_mut().enumerate() {
                *xi = xi.wrapping_add(ks[(s + i) % 5]);
            }
            x[3] = x[3].wrapping_add(s as u32);
        }
    }
    x
}

/// The first output word for a seed and a cell's row-major offset: key
/// `(seed mod 2^32, seed div 2^32, 0, 0)`, counter `(offset mod 2^32, offset div 2^32, 0, 0)`.
pub fn word(seed: u64, offset: u64) -> u32 {
    let key = [seed as u32, (seed >> 32) as u32, 0, 0];
    let ctr = [offset as u32, (offset >> 32) as u32, 0, 0];
    threefry4x32_20(ctr, key)[0]
}

/// The significand width (implicit bit included) and the smallest normal exponent of a
/// floating precision, or `None` for an integer precision.
pub fn float_format(prec: Prec) -> Option<(u32, i32)> {
    if prec.is_integer() {
        return None;
    }
    // Exhaustive on purpose: a new floating precision must say how it rounds down.
    match prec {
        Prec::Byte | Prec::Uint16 | Prec::Int32 | Prec::Uint32 | Prec::Int64 | Prec::Uint64 => None,
        Prec::Fp8 => Some((3, -14)),
        Prec::Bfloat16 => Some((8, -126)),
        Prec::Half => Some((11, -14)),
        Prec::Single => Some((24, -126)),
        Prec::Double => Some((53, -1022)),
    }
}

/// `w / 2^32` rounded down (toward zero) to a format with `mant` significand bits and
/// smallest normal exponent `emin`: the low bits of `w` below the format's spacing at `w`'s
/// magnitude are cleared, so the result is exact in `f64` and in the format, and below 1.
/// Mirrors `aj_rand_unit` of `runtime_c/arrayjit.h`.
pub fn unit(w: u32, mant: u32, emin: i32) -> f64 {
    if w == 0 {
        return 0.0;
    }
    // w / 2^32 lies in [2^(k-32), 2^(k-31)) where k is the position of w's top bit.
    let k = 31 - w.leading_zeros() as i32;
    let e = (k - 32).max(emin);
    // Spacing 2^(e - mant + 1), in units of 2^-32.
    let shift = e - mant as i32 + 1 + 32;
    let kept = if shift <= 0 {
        w
    } else if shift >= 32 {
        0
    } else {
        w & !((1u32 << shift) - 1)
    };
    kept as f64 / 4_294_967_296.0
}

/// The value of the cell at row-major `offset` of a tensor of precision `prec` filled by
/// `{"fetch": X, "random": {"seed": seed}}`: for floating precisions `w / 2^32` rounded down
/// to the precision (so in `[0, 1)`), for integer precisions `w` itself (an integer in
/// `0 .. 2^32`, stored by the wrapping rule of SPEC section 9.1).
pub fn value(seed: u64, offset: u64, prec: Prec) -> f64 {
    let w = word(seed, offset);
    match float_format(prec) {
        Some((mant, emin)) => unit(w, mant, emin),
        None => w as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answers() {
        // Random123's kat_vectors for threefry4x32 with 20 rounds: counter, key, output.
        assert_eq!(
            threefry4x32_20([0; 4], [0; 4]),
            [0x9c6ca96a, 0xe17eae66, 0xfc10ecd4, 0x5256a7d8]
        );
        assert_eq!(
            threefry4x32_20([u32::MAX; 4], [u32::MAX; 4]),
            [0x2a881696, 0x57012287, 0xf6c7446e, 0xa16a6732]
        );
        assert_eq!(
            threefry4x32_20(
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0, 0x082efa98, 0xec4e6c89]
            ),
            [0x59cd1dbb, 0xb8879579, 0x86b5d00c, 0xac8b6d84]
        );
    }

    #[test]
    fn rounding_down() {
        // Single: 24 significant bits; the largest word gives the float just below 1.
        assert_eq!(unit(u32::MAX, 24, -126), 1.0 - f32::EPSILON as f64 / 2.0);
        assert_eq!(
            unit(u32::MAX, 24, -126) as f32 as f64,
            unit(u32::MAX, 24, -126)
        );
        // Half: 11 bits, spacing 2^-11 in [0.5, 1); below 2^-14 the spacing is 2^-24.
        assert_eq!(unit(u32::MAX, 11, -14), 1.0 - 1.0 / 2048.0);
        assert_eq!(unit(0x1ff, 11, -14), 256.0 / 4_294_967_296.0);
        assert_eq!(unit(0xff, 11, -14), 0.0);
        // Double keeps every word.
        assert_eq!(
            unit(0xffff_ffff, 53, -1022),
            4_294_967_295.0 / 4_294_967_296.0
        );
        // Every value is exact in its precision and below 1.
        for w in [1u32, 3, 0x00ff_ffff, 0x0100_0001, 0x8000_0001, u32::MAX] {
            for p in [Prec::Half, Prec::Single, Prec::Double] {
                let (m, e) = float_format(p).unwrap();
                let v = unit(w, m, e);
                assert!(v < 1.0 && v <= w as f64 / 4_294_967_296.0);
                assert_eq!(p.round(v), v, "{w:#x} in {p}");
            }
        }
    }
}
