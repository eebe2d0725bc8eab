//! Precisions: the element types of arrays, and the compute types of statements.

use half::f16;
use std::fmt;

/// The element type of an array (SPEC section 9.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Prec {
    /// Unsigned 8-bit integer (`unsigned char`).
    Byte,
    /// Unsigned 16-bit integer (`uint16_t`).
    Uint16,
    /// Two's complement 32-bit integer (`int32_t`).
    Int32,
    /// Unsigned 32-bit integer (`uint32_t`).
    Uint32,
    /// Two's complement 64-bit integer (`int64_t`).
    Int64,
    /// Unsigned 64-bit integer (`uint64_t`).
    Uint64,
    /// 8-bit float, E5M2 (the top byte of a half), stored as its bit pattern (`aj_fp8`).
    Fp8,
    /// IEEE binary16 (stored in C as its bit pattern, `aj_half`; see [`Prec::c_type`]).
    Half,
    /// The top 16 bits of an IEEE binary32, stored as its bit pattern (`aj_bf16`).
    Bfloat16,
    /// IEEE binary32 (`float`).
    Single,
    /// IEEE binary64 (`double`).
    Double,
}

/// The type a statement computes in (SPEC 9.1 "How an assignment computes"), see
/// [`Compute::of`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Compute {
    /// IEEE binary32 (`float`).
    F32,
    /// IEEE binary64 (`double`).
    F64,
    /// Exact integer arithmetic reduced modulo 2^64: 64-bit patterns (`uint64_t` in C,
    /// wrapping). Each value keeps the signedness of where it comes from (a `uint64` value is
    /// unsigned, every other one signed; see [`crate::loops::int_unsigned`]), so comparisons,
    /// `div`, `mod`, `max`, `min`, `abs` and the like see exact values.
    Int,
}

impl Compute {
    /// The compute type of a statement writing `result` and reading `args`: a floating result
    /// computes in `double` when it is `double`, else `float`; an integer result with only
    /// integer arguments computes in exact integers reduced modulo 2^64; an integer result
    /// with a floating argument computes in `double`.
    pub fn of(result: Prec, args: impl IntoIterator<Item = Prec>) -> Compute {
        if !result.is_integer() {
            return if result == Prec::Double {
                Compute::F64
            } else {
                Compute::F32
            };
        }
        for a in args {
            if !a.is_integer() {
                return Compute::F64;
            }
        }
        Compute::Int
    }

    /// Whether this is an integer compute type.
    pub fn is_integer(self) -> bool {
        self == Compute::Int
    }

    /// The C type of values in this compute type.
    pub fn c_type(self) -> &'static str {
        match self {
            Compute::F32 => "float",
            Compute::F64 => "double",
            Compute::Int => "uint64_t",
        }
    }

    /// Rounds an `f64` to this floating compute type (integer types: unchanged).
    pub fn round_float(self, v: f64) -> f64 {
        match self {
            Compute::F32 => v as f32 as f64,
            _ => v,
        }
    }
}

impl Prec {
    /// All precisions, integers first, then floats narrowest first.
    pub const ALL: [Prec; 11] = [
        Prec::Byte,
        Prec::Uint16,
        Prec::Int32,
        Prec::Uint32,
        Prec::Int64,
        Prec::Uint64,
        Prec::Fp8,
        Prec::Half,
        Prec::Bfloat16,
        Prec::Single,
        Prec::Double,
    ];

    /// Size of one element in bytes.
    pub fn size_in_bytes(self) -> usize {
        match self {
            Prec::Byte | Prec::Fp8 => 1,
            Prec::Uint16 | Prec::Half | Prec::Bfloat16 => 2,
            Prec::Int32 | Prec::Uint32 | Prec::Single => 4,
            Prec::Int64 | Prec::Uint64 | Prec::Double => 8,
        }
    }

    /// The C type that stores an element.
    ///
    /// Halves are stored as their IEEE binary16 bit pattern (`aj_half`, a `uint16_t`) and
    /// converted only through the runtime header's exact `aj_h2f` / `aj_f2h`, never as
    /// `_Float16`: with `_Float16`, compilers targeting CPUs with native half arithmetic
    /// (AVX512-FP16) may keep values in wider registers and skip the rounding at a store.
    /// Bfloat16 and fp8 are bit patterns too (`aj_bf16`, `aj_fp8`), converted by integer code.
    pub fn c_type(self) -> &'static str {
        match self {
            Prec::Byte => "unsigned char",
            Prec::Uint16 => "uint16_t",
            Prec::Int32 => "int32_t",
            Prec::Uint32 => "uint32_t",
            Prec::Int64 => "int64_t",
            Prec::Uint64 => "uint64_t",
            Prec::Fp8 => "aj_fp8",
            Prec::Half => "aj_half",
            Prec::Bfloat16 => "aj_bf16",
            Prec::Single => "float",
            Prec::Double => "double",
        }
    }

    /// The C type in which a statement writing this precision computes when its arguments do
    /// not decide otherwise (floating precisions; see [`Compute::of`] for the full rule).
    pub fn compute_c_type(self) -> &'static str {
        Compute::of(self, []).c_type()
    }

    /// Whether this is an integer precision (SPEC section 9.1): its cells hold integers, stored
    /// by wrapping.
    pub fn is_integer(self) -> bool {
        self.int_bits().is_some()
    }

    /// Whether this is a signed integer precision.
    pub fn is_signed_integer(self) -> bool {
        matches!(self, Prec::Int32 | Prec::Int64)
    }

    /// The width in bits of an integer precision.
    pub fn int_bits(self) -> Option<u32> {
        match self {
            Prec::Byte => Some(8),
            Prec::Uint16 => Some(16),
            Prec::Int32 | Prec::Uint32 => Some(32),
            Prec::Int64 | Prec::Uint64 => Some(64),
            _ => None,
        }
    }

    /// Whether values are computed in single precision (`float`) when the result has this
    /// precision (half, bfloat16, fp8 and single).
    pub fn computes_in_float(self) -> bool {
        matches!(self, Prec::Fp8 | Prec::Half | Prec::Bfloat16 | Prec::Single)
    }

    /// The name used in program files: `byte`, `uint16`, `int32`, `uint32`, `int64`,
    /// `uint64`, `fp8`, `half`, `bfloat16`, `single`, `double`.
    pub fn name(self) -> &'static str {
        match self {
            Prec::Byte => "byte",
            Prec::Uint16 => "uint16",
            Prec::Int32 => "int32",
            Prec::Uint32 => "uint32",
            Prec::Int64 => "int64",
            Prec::Uint64 => "uint64",
            Prec::Fp8 => "fp8",
            Prec::Half => "half",
            Prec::Bfloat16 => "bfloat16",
            Prec::Single => "single",
            Prec::Double => "double",
        }
    }

    /// The known names, comma-separated (for error messages).
    pub fn known_names() -> String {
        Prec::ALL.map(Prec::name).join(", ")
    }

    /// Parses a name as printed by [`Prec::name`].
    pub fn from_name(s: &str) -> Option<Prec> {
        Prec::ALL.into_iter().find(|p| p.name() == s)
    }

    /// Parses a name, or [`crate::Error::UnknownPrecision`] listing the known names.
    pub fn parse(s: &str) -> crate::error::Result<Prec> {
        Prec::from_name(s).ok_or_else(|| crate::error::Error::UnknownPrecision {
            name: s.to_string(),
            known: Prec::known_names(),
        })
    }

    /// Wraps a 64-bit integer pattern into this integer precision's range, as its value
    /// (sign-extended for signed precisions). For floating precisions the pattern is read as
    /// an `int64` and rounded.
    pub fn wrap_int(self, bits: u64) -> i128 {
        match self {
            Prec::Byte => i128::from(bits as u8),
            Prec::Uint16 => i128::from(bits as u16),
            Prec::Int32 => i128::from(bits as u32 as i32),
            Prec::Uint32 => i128::from(bits as u32),
            Prec::Int64 => i128::from(bits as i64),
            Prec::Uint64 => i128::from(bits),
            _ => i128::from(bits as i64),
        }
    }

    /// Rounds a value to this precision, exactly as generated code stores it.
    ///
    /// Integers are modular: values are truncated toward zero, then wrapped modulo 2^bits
    /// (300.7 becomes 44 in a byte, -1 becomes 255); NaN and infinities become 0. Bfloat16 and
    /// fp8 round to nearest, ties to even, overflowing to ±inf; NaN stays NaN.
    ///
    /// (An `int64` or `uint64` value beyond 2^53 is not exact in the returned `f64`.)
    pub fn round(self, v: f64) -> f64 {
        match self {
            Prec::Byte => byte_of_f64(v) as f64,
            p if p.is_integer() => p.wrap_int(int_bits_of_f64(v)) as f64,
            // Correctly rounded on every CPU (`half::f16::from_f64` is not).
            Prec::Half => f16_from_f64(v).to_f64(),
            Prec::Bfloat16 => bf16_to_f64(bf16_of_f64(v)),
            Prec::Fp8 => fp8_to_f64(fp8_of_f64(v)),
            Prec::Single => v as f32 as f64,
            _ => v,
        }
    }

    /// Rounds a value to the precision this precision computes in (see [`Prec::compute_c_type`]).
    pub fn round_compute(self, v: f64) -> f64 {
        if self.computes_in_float() {
            v as f32 as f64
        } else {
            v
        }
    }
}

/// The modular conversion used to store into byte arrays (mirrors `aj_to_byte` in C):
/// truncate toward zero, then wrap modulo 256; NaN and infinities give 0.
pub fn byte_of_f64(v: f64) -> u8 {
    int_bits_of_f64(v) as u8
}

/// The 64-bit pattern of a floating value stored into an integer (mirrors `aj_d2u64` in C):
/// truncate toward zero, then wrap modulo 2^64; NaN and infinities give 0.
pub fn int_bits_of_f64(v: f64) -> u64 {
    if !v.is_finite() {
        return 0;
    }
    // fmod is exact, so this is the exact value modulo 2^64 (|r| < 2^64, an integer after
    // truncation: fits an i128).
    let r = (v % 18_446_744_073_709_551_616.0).trunc();
    (r as i128) as u64
}

/// `v` rounded to binary32 toward zero, with the last bit set when that is inexact ("round to
/// odd"). Rounding this to a format of p ≤ 22 bits (bfloat16, fp8) to nearest gives `v`
/// rounded to nearest once: the odd bit stands for everything below and can neither create
/// nor break a tie. (Rounding to binary32 to nearest first would: 1.0039062500000002 would
/// become the bfloat16 midpoint 1.00390625, which ties down to 1.)
fn f32_round_to_odd(v: f64) -> f32 {
    let f = v as f32;
    if !f.is_finite() || f64::from(f) == v {
        return f;
    }
    let mut b = f.to_bits();
    if f64::from(f).abs() > v.abs() {
        // one step toward zero (the magnitude is in the low 31 bits)
        b -= 1;
    }
    f32::from_bits(b | 1)
}

/// A value (binary64) rounded to bfloat16, to nearest, ties to even, as its bit pattern
/// (from a binary32 it is what `aj_f2bf` in C computes): rounded once, through binary32
/// rounded to odd.
pub fn bf16_of_f64(v: f64) -> u16 {
    let u = f32_round_to_odd(v).to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 0x40) as u16;
    }
    ((u + 0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// The value of a bfloat16 bit pattern.
pub fn bf16_to_f64(b: u16) -> f64 {
    f32::from_bits(u32::from(b) << 16) as f64
}

/// A value (binary64) rounded to fp8 E5M2, to nearest, ties to even, as its bit pattern
/// (from a binary32 it is what `aj_f2fp8` in C computes): rounded once, through binary32
/// rounded to odd.
pub fn fp8_of_f64(v: f64) -> u8 {
    let u = f32_round_to_odd(v).to_bits();
    let sign = ((u >> 24) & 0x80) as u8;
    let a = u & 0x7fff_ffff;
    let m: u8 = if a > 0x7f80_0000 {
        0x7e
    } else if a >= 0x4770_0000 {
        // >= 61440 (halfway between 57344 and 65536) rounds to inf
        0x7c
    } else if a >= 0x3880_0000 {
        // normal (>= 2^-14): rebias 127 -> 15, drop 21 mantissa bits
        let x = a - ((127 - 15) << 23);
        let q = x >> 21;
        let r = x & 0x1f_ffff;
        (q + u32::from(r > 0x10_0000 || (r == 0x10_0000 && q & 1 == 1))) as u8
    } else {
        // subnormal or zero: units of 2^-16
        let e = (a >> 23) as i32 - 127;
        let s = 7 - e; // >= 22
        if a < 0x0080_0000 || s > 31 {
            0
        } else {
            let mm = (a & 0x7f_ffff) | 0x80_0000;
            let q = mm >> s;
            let r = mm & ((1u32 << s) - 1);
            let half = 1u32 << (s - 1);
            (q + u32::from(r > half || (r == half && q & 1 == 1))) as u8
        }
    };
    sign | m
}

/// The value of an fp8 E5M2 bit pattern (the top byte of a half).
pub fn fp8_to_f64(b: u8) -> f64 {
    half::f16::from_bits(u16::from(b) << 8).to_f64()
}

/// An fp8 E5M2 value (SPEC 9.1: the top byte of an IEEE half, with infinities and NaN; the
/// `float8_e5m2` of `ml_dtypes`), the element type of `fp8` host arrays
/// ([`crate::ir::Ndarray::as_slice`], [`crate::ir::Tnode::host_to_vec`]).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Fp8(u8);

impl Fp8 {
    /// The value with this bit pattern.
    pub const fn from_bits(bits: u8) -> Fp8 {
        Fp8(bits)
    }
    /// The bit pattern.
    pub const fn to_bits(self) -> u8 {
        self.0
    }
    /// `v` rounded to nearest, ties to even (beyond the largest finite value, ±infinity; NaN
    /// stays NaN): how arrayjit stores into `fp8`.
    pub fn from_f64(v: f64) -> Fp8 {
        Fp8(fp8_of_f64(v))
    }
    /// `v` rounded as [`Fp8::from_f64`] does.
    pub fn from_f32(v: f32) -> Fp8 {
        Fp8(fp8_of_f64(f64::from(v)))
    }
    /// The value, exactly.
    pub fn to_f64(self) -> f64 {
        fp8_to_f64(self.0)
    }
    /// The value, exactly.
    pub fn to_f32(self) -> f32 {
        fp8_to_f64(self.0) as f32
    }
}

impl fmt::Display for Fp8 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.to_f64(), f)
    }
}

impl fmt::Display for Prec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The `f16` nearest to `x` (ties to even; beyond the largest finite half, infinity), computed
/// exactly.
///
/// `half::f16::from_f64` is not correctly rounded: on x86 CPUs with F16C it converts through
/// `f32` (double rounding), otherwise it ignores the low 32 bits of the mantissa, so its
/// result can depend on the CPU. Host arrays use this function instead.
pub fn f16_from_f64(x: f64) -> f16 {
    if x.is_nan() {
        return f16::NAN;
    }
    let a = x.abs();
    let bits = if a.is_infinite() {
        0x7C00
    } else {
        let (lo_bits, lo, hi) = f16_bracket(a);
        let mid = (lo + hi) / 2.0;
        if a < mid || (a == mid && lo_bits.is_multiple_of(2)) {
            lo_bits
        } else {
            lo_bits + 1
        }
    };
    let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
    f16::from_bits(sign | bits)
}

/// For a finite `a >= 0`: the bits and value of the largest finite `f16` not above `a`, and
/// the value of the next `f16` (65536 after the largest finite half, 65504, as if the
/// exponent range went on: IEEE rounding overflows to infinity from the midpoint 65520 on).
///
/// Every value involved has at most 11 significant bits, so all arithmetic here is exact.
pub(crate) fn f16_bracket(a: f64) -> (u16, f64, f64) {
    const MIN_NORMAL: f64 = 1.0 / 16384.0; // 2^-14
    let lo_bits: u16 = if a >= 65504.0 {
        0x7BFF
    } else if a < MIN_NORMAL {
        // Subnormals: multiples of 2^-24.
        (a * 16_777_216.0).floor() as u16
    } else {
        let e = ((a.to_bits() >> 52) & 0x7FF) as i32 - 1023; // -14..=15
        let step = 2f64.powi(e - 10);
        let m = (a / step).floor() as u16; // 1024..=2047
        (((e + 15) as u16) << 10) | (m - 1024)
    };
    let lo = f16::from_bits(lo_bits).to_f64();
    let hi = if lo_bits == 0x7BFF {
        65536.0
    } else {
        f16::from_bits(lo_bits + 1).to_f64()
    };
    (lo_bits, lo, hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_stores_wrap() {
        assert_eq!(Prec::Int32.round(2147483648.0), -2147483648.0);
        assert_eq!(Prec::Int32.round(-2.9), -2.0);
        assert_eq!(Prec::Uint16.round(-1.0), 65535.0);
        assert_eq!(Prec::Uint32.round(f64::NAN), 0.0);
        assert_eq!(Prec::Int64.round(f64::INFINITY), 0.0);
        assert_eq!(int_bits_of_f64(18446744073709551616.0 + 4096.0), 4096);
        assert_eq!(int_bits_of_f64(-1.0), u64::MAX);
        assert_eq!(Prec::Byte.round(300.7), 44.0);
    }

    #[test]
    fn bf16_and_fp8_round_to_nearest_even() {
        // bfloat16: 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even is 1.
        assert_eq!(Prec::Bfloat16.round(1.0 + 2f64.powi(-8)), 1.0);
        assert_eq!(
            Prec::Bfloat16.round(1.0 + 3.0 * 2f64.powi(-8)),
            1.0 + 2.0 * 2f64.powi(-7)
        );
        assert_eq!(Prec::Bfloat16.round(3.5e38), f64::INFINITY);
        assert!(Prec::Bfloat16.round(f64::NAN).is_nan());
        // fp8 E5M2: max 57344; 61440 is the tie to inf; 1.125 ties to 1, 1.375 to 1.5.
        assert_eq!(Prec::Fp8.round(57344.0), 57344.0);
        assert_eq!(Prec::Fp8.round(61439.0), 57344.0);
        assert_eq!(Prec::Fp8.round(61440.0), f64::INFINITY);
        assert_eq!(Prec::Fp8.round(-1e9), f64::NEG_INFINITY);
        assert_eq!(Prec::Fp8.round(1.125), 1.0);
        assert_eq!(Prec::Fp8.round(1.375), 1.5);
        // subnormals: step 2^-16; 2^-17 ties to 0, 3·2^-17 ties to 2^-15.
        assert_eq!(Prec::Fp8.round(2f64.powi(-17)), 0.0);
        assert_eq!(Prec::Fp8.round(3.0 * 2f64.powi(-17)), 2f64.powi(-15));
        assert_eq!(Prec::Fp8.round(1.1 * 2f64.powi(-17)), 2f64.powi(-16));
        assert!(Prec::Fp8.round(f64::NAN).is_nan());
    }

    #[test]
    fn compute_types() {
        assert_eq!(Compute::of(Prec::Int32, [Prec::Int32]), Compute::Int);
        assert_eq!(Compute::of(Prec::Uint64, [Prec::Int64]), Compute::Int);
        assert_eq!(Compute::of(Prec::Byte, [Prec::Single]), Compute::F64);
        assert_eq!(Compute::of(Prec::Half, [Prec::Int64]), Compute::F32);
        assert_eq!(Compute::of(Prec::Double, []), Compute::F64);
    }
}
