//! Converting the decimal text of a JSON number to a precision, exactly as written.
//!
//! `init.values` of a program file are converted from their text, correctly rounded to the
//! tensor's precision (round to nearest, ties to even), never through an intermediate that
//! could round twice:
//!
//! - `double`: Rust's `str::parse::<f64>` (correctly rounded);
//! - `single`: `str::parse::<f32>` (going through `f64` first would round twice);
//! - `half`: the `f64` nearest to the text, rounded to `f16`; that is exact unless the `f64`
//!   lands exactly on the midpoint between two halves, and then the decimal text itself is
//!   compared with the midpoint (both as exact decimals);
//! - `bfloat16`, `fp8`: likewise, the `f64` nearest to the text rounded once (through
//!   binary32 rounded to odd), and the decimal compared with the midpoint when the `f64` is
//!   one;
//! - `byte`: the decimal is truncated toward zero, then wrapped modulo 256 (`300.7` → 44,
//!   `-1.5` → 255, `255.99999999999999999` → 255), as stores into byte tensors do.
//!
//! `"inf"`, `"-inf"` and `"nan"` are infinities and NaN (0 for bytes). A number beyond the
//! range of `double` (`1e400`) is an error for every precision; below it, a value beyond the
//! largest finite value of `half` or `single` rounds to infinity, as IEEE rounding does.
//!
//! Printed values ([`super::output`]) read back to the same values through this module.

use super::format::ValueLit;
use arrayjit::ir::ndarray::f16_from_f64;
use arrayjit::ir::Prec;
use half::f16;
use std::cmp::Ordering;

/// A decimal number `±0.d1d2d3... × 10^point`, with no leading or trailing zero digits
/// (no digits at all for zero).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Decimal {
    negative: bool,
    digits: Vec<u8>,
    point: i64,
}

/// Exponents are clamped to this magnitude while parsing; beyond it every precision gives
/// 0 or an out-of-range error anyway, and it keeps the point arithmetic far from overflow.
const EXP_CLAMP: i64 = 1 << 40;

/// Parses a JSON number (`-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`).
fn parse_decimal(text: &str) -> Option<Decimal> {
    let b = text.as_bytes();
    let mut i = 0;
    let negative = b.first() == Some(&b'-');
    if negative {
        i += 1;
    }
    let digits_from = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        &b[start..*i]
    };
    let int = digits_from(&mut i);
    if int.is_empty() || (int.len() > 1 && int[0] == b'0') {
        return None;
    }
    let mut frac: &[u8] = &[];
    if b.get(i) == Some(&b'.') {
        i += 1;
        frac = digits_from(&mut i);
        if frac.is_empty() {
            return None;
        }
    }
    let mut exp: i64 = 0;
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        let sign = match b.get(i) {
            Some(b'-') => {
                i += 1;
                -1
            }
            Some(b'+') => {
                i += 1;
                1
            }
            _ => 1,
        };
        let e = digits_from(&mut i);
        if e.is_empty() {
            return None;
        }
        for &d in e {
            exp = (exp * 10 + i64::from(d - b'0')).min(EXP_CLAMP);
        }
        exp *= sign;
    }
    if i != b.len() {
        return None;
    }
    let mut all: Vec<u8> = int.iter().chain(frac).copied().collect();
    let lead = all.iter().take_while(|&&d| d == b'0').count();
    all.drain(..lead);
    while all.last() == Some(&b'0') {
        all.pop();
    }
    // Text lengths are far below 2^62, so none of this overflows.
    let point = int.len() as i64 - lead as i64 + exp;
    Some(Decimal {
        negative,
        digits: all,
        point,
    })
}

/// Compares the magnitudes of two decimals.
fn cmp_magnitude(a: &Decimal, b: &Decimal) -> Ordering {
    match (a.digits.is_empty(), b.digits.is_empty()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        // Without leading or trailing zeros, the larger point wins, then the digits compare
        // lexicographically (a proper prefix is smaller: the other has more non-zero digits).
        (false, false) => a.point.cmp(&b.point).then_with(|| a.digits.cmp(&b.digits)),
    }
}

/// The exact decimal value of a finite `f64`.
fn exact_decimal(x: f64) -> Option<Decimal> {
    // 60 significant digits hold every value this is used for (midpoints between halves
    // have at most 22); Rust prints the exact expansion, padded with zeros.
    parse_decimal(&format!("{x:.60e}"))
}

/// The value of `text` truncated toward zero, modulo 256.
fn byte_of_decimal(d: &Decimal) -> u8 {
    if d.point <= 0 {
        return 0;
    }
    // 10^8 is a multiple of 256: only the last 8 digits of the integer part matter.
    let mut n: u64 = 0;
    for pos in (d.point - 8).max(0)..d.point {
        let digit = usize::try_from(pos)
            .ok()
            .and_then(|p| d.digits.get(p))
            .map_or(0, |c| u64::from(c - b'0'));
        n = n * 10 + digit;
    }
    let m = (n % 256) as u8;
    if d.negative {
        m.wrapping_neg()
    } else {
        m
    }
}

/// The integer part of `d` modulo 2^64 (truncated toward zero, then wrapped), as a 64-bit
/// pattern. 10^64 is a multiple of 2^64: only the last 64 digits of the integer part matter.
fn int_bits_of_decimal(d: &Decimal) -> u64 {
    if d.point <= 0 {
        return 0;
    }
    let mut n: u64 = 0;
    for pos in (d.point - 64).max(0)..d.point {
        let digit = usize::try_from(pos)
            .ok()
            .and_then(|p| d.digits.get(p))
            .map_or(0, |c| u64::from(c - b'0'));
        n = n.wrapping_mul(10).wrapping_add(digit);
    }
    if d.negative {
        n.wrapping_neg()
    } else {
        n
    }
}

/// Converts the text of a JSON number to an integer precision exactly: truncated toward zero
/// and wrapped into the type's range (SPEC 9.1), every digit kept.
pub fn convert_int_text(text: &str, prec: Prec) -> Result<i128, String> {
    convert_text(text, prec)?;
    let d = parse_decimal(text).ok_or_else(|| format!("{text:?} is not a JSON number"))?;
    Ok(prec.wrap_int(int_bits_of_decimal(&d)))
}

/// Converts a value of `init.values` to an integer precision exactly (NaN and infinities
/// store 0).
pub fn convert_int(v: &ValueLit, prec: Prec) -> Result<i128, String> {
    match v {
        ValueLit::Number(text) => convert_int_text(text, prec),
        ValueLit::Inf | ValueLit::NegInf | ValueLit::NaN => Ok(0),
    }
}

/// For a finite `a >= 0`: the bits and value of the largest finite `f16` not above `a`, and
/// the value of the next `f16` (65536 after the largest finite half, 65504, as if the
/// exponent range went on: IEEE rounding overflows to infinity from the midpoint 65520 on).
/// From the library's correctly rounded [`f16_from_f64`]: the nearest half, or the one below
/// it when that is above `a`.
fn f16_bracket(a: f64) -> (u16, f64, f64) {
    const MAX_FINITE: u16 = 0x7BFF;
    let nearest = f16_from_f64(a);
    let lo_bits = if nearest.is_infinite() {
        MAX_FINITE
    } else if nearest.to_f64() > a {
        nearest.to_bits() - 1
    } else {
        nearest.to_bits()
    };
    let lo = f16::from_bits(lo_bits).to_f64();
    let hi = if lo_bits == MAX_FINITE {
        65536.0
    } else {
        f16::from_bits(lo_bits + 1).to_f64()
    };
    (lo_bits, lo, hi)
}

/// The `f16` nearest to the decimal `d`, whose nearest `f64` is `x` (finite).
fn half_of_decimal(d: &Decimal, x: f64) -> f16 {
    let h = f16_from_f64(x);
    let a = x.abs();
    if a == 0.0 {
        return h;
    }
    let (lo_bits, lo, hi) = f16_bracket(a);
    let mid = (lo + hi) / 2.0;
    if a != mid {
        // The f64 is strictly on one side of the midpoint, and so is the decimal.
        return h;
    }
    let Some(mid_dec) = exact_decimal(mid) else {
        return h;
    };
    let bits = match cmp_magnitude(d, &mid_dec) {
        Ordering::Less => lo_bits,
        Ordering::Greater => lo_bits + 1,
        Ordering::Equal => return h,
    };
    let sign = if d.negative { 0x8000 } else { 0 };
    f16::from_bits(sign | bits)
}

/// The bfloat16 or fp8 value nearest to the decimal `d`, whose nearest `f64` is `x` (finite):
/// `x` rounded once (exact unless `x` lands exactly on the midpoint between two values of
/// the format: then the decimal itself is compared with the midpoint, as for halves).
fn narrow_of_decimal(d: &Decimal, x: f64, prec: Prec) -> f64 {
    use arrayjit::ir::prec::{bf16_of_f64, bf16_to_f64, fp8_of_f64, fp8_to_f64};
    let r = prec.round(x);
    let a = x.abs();
    if a == 0.0 || r == x {
        return r;
    }
    // bit patterns of magnitudes; the largest finite one; the value after it as if the
    // exponent range went on (rounding overflows to infinity from the midpoint on)
    type Enc = fn(f64) -> u32;
    type Dec = fn(u32) -> f64;
    let (enc, dec, max_bits, after_max): (Enc, Dec, u32, f64) = if prec == Prec::Bfloat16 {
        (
            |v| u32::from(bf16_of_f64(v)) & 0x7fff,
            |b| bf16_to_f64(b as u16),
            0x7f7f,
            2f64.powi(128),
        )
    } else {
        (
            |v| u32::from(fp8_of_f64(v)) & 0x7f,
            |b| fp8_to_f64(b as u8),
            0x7b,
            65536.0,
        )
    };
    let nb = enc(a);
    let lo_bits = if nb > max_bits {
        max_bits
    } else if dec(nb) > a {
        nb - 1
    } else {
        nb
    };
    let lo = dec(lo_bits);
    let hi = if lo_bits == max_bits {
        after_max
    } else {
        dec(lo_bits + 1)
    };
    let mid = (lo + hi) / 2.0;
    if a != mid {
        return r;
    }
    let Some(mid_dec) = parse_decimal(&format!("{mid:.800e}")) else {
        return r;
    };
    let m = match cmp_magnitude(d, &mid_dec) {
        Ordering::Less => lo,
        Ordering::Greater if lo_bits == max_bits => f64::INFINITY,
        Ordering::Greater => hi,
        Ordering::Equal => return r,
    };
    if d.negative {
        -m
    } else {
        m
    }
}

/// Converts the text of a JSON number to `prec`, correctly rounded (see the module docs);
/// the result is a value of `prec`, as `f64`. `Err` says why the text is not accepted.
pub fn convert_text(text: &str, prec: Prec) -> Result<f64, String> {
    let d = parse_decimal(text).ok_or_else(|| format!("{text:?} is not a JSON number"))?;
    let x: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a JSON number"))?;
    if !x.is_finite() {
        return Err(format!(
            "value {text} is out of range (beyond the largest double)"
        ));
    }
    Ok(match prec {
        Prec::Double => x,
        Prec::Single => {
            let s: f32 = text
                .parse()
                .map_err(|_| format!("{text:?} is not a JSON number"))?;
            f64::from(s)
        }
        Prec::Half => half_of_decimal(&d, x).to_f64(),
        Prec::Byte => f64::from(byte_of_decimal(&d)),
        Prec::Bfloat16 | Prec::Fp8 => narrow_of_decimal(&d, x, prec),
        p => p.wrap_int(int_bits_of_decimal(&d)) as f64,
    })
}

/// Converts a value of `init.values` to `prec` (see [`convert_text`]).
pub fn convert(v: &ValueLit, prec: Prec) -> Result<f64, String> {
    let special = |x: f64| if prec.is_integer() { 0.0 } else { x };
    match v {
        ValueLit::Number(text) => convert_text(text, prec),
        ValueLit::Inf => Ok(special(f64::INFINITY)),
        ValueLit::NegInf => Ok(special(f64::NEG_INFINITY)),
        ValueLit::NaN => Ok(special(f64::NAN)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn half(text: &str) -> f64 {
        convert_text(text, Prec::Half).unwrap()
    }

    #[test]
    fn parses_json_numbers() {
        let d = parse_decimal("-0012").is_none();
        assert!(d);
        let d = parse_decimal("-120.0500e+3").unwrap();
        assert_eq!(
            d,
            Decimal {
                negative: true,
                digits: b"12005".to_vec(),
                point: 6
            }
        );
        let d = parse_decimal("0.000").unwrap();
        assert!(d.digits.is_empty());
        for bad in ["", "-", "1.", ".5", "1e", "1e+", "01", "1x", "+1", "inf"] {
            assert!(parse_decimal(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn bytes_truncate_then_wrap() {
        let b = |t: &str| convert_text(t, Prec::Byte).unwrap();
        assert_eq!(b("255.99999999999999999"), 255.0);
        assert_eq!(b("-1.5"), 255.0);
        assert_eq!(b("300.7"), 44.0);
        assert_eq!(b("-0.9"), 0.0);
        assert_eq!(b("256"), 0.0);
        assert_eq!(b("-256"), 0.0);
        assert_eq!(b("-257"), 255.0);
        assert_eq!(b("1e300"), 0.0);
        assert_eq!(b("1.2345e3"), 210.0); // 1234 mod 256
        assert_eq!(
            b("123456789012345678901234567890"),
            (1234567890u64 % 256) as f64
        );
        assert_eq!(b("2.55e2"), 255.0);
        assert_eq!(b("1e-400"), 0.0);
        assert!(convert_text("1e400", Prec::Byte).is_err());
    }

    #[test]
    fn halves_decide_midpoints_from_the_decimal() {
        // 2^-25 is the midpoint between 0 and the smallest subnormal 2^-24.
        assert_eq!(half("2.98023223876953125e-8"), 0.0);
        assert_eq!(half("2.98023223876953125000000000001e-8"), 2f64.powi(-24));
        assert_eq!(half("2.98023223876953124999999999999e-8"), 0.0);
        // 1.5 * 2^-24: the tie goes to the even 2^-23.
        assert_eq!(half("8.94069671630859375e-8"), 2f64.powi(-23));
        assert_eq!(half("8.94069671630859374999999999e-8"), 2f64.powi(-24));
        // 65520 is the midpoint between 65504 and the overflow.
        assert_eq!(half("65520"), f64::INFINITY);
        assert_eq!(half("65519.99999999999999999"), 65504.0);
        assert_eq!(half("-65519.99999999999999999"), -65504.0);
        // 1 + 2^-11: between 1 and 1 + 2^-10, tie to even 1.
        assert_eq!(half("1.00048828125"), 1.0);
        assert_eq!(half("1.000488281250000000000001"), 1.0 + 2f64.powi(-10));
        assert_eq!(half("6e-8"), 2f64.powi(-24));
        assert_eq!(half("-0"), 0.0);
        assert!(half("-0").is_sign_negative());
    }

    #[test]
    fn singles_and_doubles_round_once() {
        assert_eq!(
            convert_text("123456789.12345679", Prec::Double).unwrap(),
            123456789.12345679f64
        );
        // Just above 2^-150, the midpoint between 0 and the smallest subnormal single: via f64
        // it would become exactly 2^-150 and then tie to 0.
        let t = "7.0064923216240853546186479164495806564013097093825788587853414194489554134293\
                 03007433190941810607911e-46";
        assert_eq!(convert_text(t, Prec::Single).unwrap(), 2f64.powi(-149));
        assert_eq!(
            convert_text("1e-45", Prec::Single).unwrap(),
            2f64.powi(-149)
        );
        assert_eq!(convert_text("1e39", Prec::Single).unwrap(), f64::INFINITY);
        assert!(convert_text("1e400", Prec::Double).is_err());
        assert!(convert_text("-1e400", Prec::Single).is_err());
    }

    #[test]
    fn every_half_reads_back_from_its_exact_decimal_and_midpoints_tie_to_even() {
        for bits in 0..0x7C00u16 {
            let h = f16::from_bits(bits);
            let text = format!("{:e}", h.to_f64());
            assert_eq!(half(&text).to_bits(), h.to_f64().to_bits(), "{text}");
            let (lo_bits, lo, hi) = f16_bracket(h.to_f64());
            assert_eq!(lo_bits, bits);
            let mid = format!("{:.40e}", (lo + hi) / 2.0);
            let even = if bits.is_multiple_of(2) {
                lo
            } else if bits == 0x7BFF {
                f64::INFINITY
            } else {
                hi
            };
            assert_eq!(half(&mid), even, "{mid}");
        }
    }
}
