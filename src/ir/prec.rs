//! Precisions: the element types of arrays.

use std::fmt;

/// The element type of an array.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Prec {
    /// Unsigned 8-bit integer (`unsigned char`).
    Byte,
    /// IEEE binary16 (stored in C as its bit pattern, `aj_half`; see [`Prec::c_type`]).
    Half,
    /// IEEE binary32 (`float`).
    Single,
    /// IEEE binary64 (`double`).
    Double,
}

impl Prec {
    /// All precisions, narrowest first.
    pub const ALL: [Prec; 4] = [Prec::Byte, Prec::Half, Prec::Single, Prec::Double];

    /// Size of one element in bytes.
    pub fn size_in_bytes(self) -> usize {
        match self {
            Prec::Byte => 1,
            Prec::Half => 2,
            Prec::Single => 4,
            Prec::Double => 8,
        }
    }

    /// The C type that stores an element.
    ///
    /// Halves are stored as their IEEE binary16 bit pattern (`aj_half`, a `uint16_t`) and
    /// converted only through the runtime header's exact `aj_h2f` / `aj_f2h`, never as
    /// `_Float16`: with `_Float16`, compilers targeting CPUs with native half arithmetic
    /// (AVX512-FP16) may keep values in wider registers and skip the rounding at a store.
    pub fn c_type(self) -> &'static str {
        match self {
            Prec::Byte => "unsigned char",
            Prec::Half => "aj_half",
            Prec::Single => "float",
            Prec::Double => "double",
        }
    }

    /// The C type in which values of this precision are computed before being stored.
    ///
    /// Bytes are computed in `double` (and stored modulo 256, see `runtime_c/arrayjit.h`),
    /// halves in `float`, singles in `float`, doubles in `double`.
    pub fn compute_c_type(self) -> &'static str {
        match self {
            Prec::Byte | Prec::Double => "double",
            Prec::Half | Prec::Single => "float",
        }
    }

    /// Whether this is an integer precision (SPEC section 9.1): its cells hold integers, stored
    /// by wrapping.
    pub fn is_integer(self) -> bool {
        matches!(self, Prec::Byte)
    }

    /// Whether values are computed in single precision (`float`).
    pub fn computes_in_float(self) -> bool {
        matches!(self, Prec::Half | Prec::Single)
    }

    /// The name used in program files: `byte`, `half`, `single`, `double`.
    pub fn name(self) -> &'static str {
        match self {
            Prec::Byte => "byte",
            Prec::Half => "half",
            Prec::Single => "single",
            Prec::Double => "double",
        }
    }

    /// Parses a name as printed by [`Prec::name`].
    pub fn from_name(s: &str) -> Option<Prec> {
        Prec::ALL.into_iter().find(|p| p.name() == s)
    }

    /// Rounds a value to this precision, exactly as generated code stores it.
    ///
    /// Bytes are modular: values are truncated toward zero, then wrapped modulo 256 (300.7
    /// becomes 44, -1 becomes 255); NaN and infinities become 0.
    pub fn round(self, v: f64) -> f64 {
        match self {
            Prec::Byte => byte_of_f64(v) as f64,
            // Correctly rounded on every CPU (`half::f16::from_f64` is not).
            Prec::Half => super::ndarray::f16_from_f64(v).to_f64(),
            Prec::Single => v as f32 as f64,
            Prec::Double => v,
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
    if !v.is_finite() {
        return 0;
    }
    // Every double of magnitude 2^62 or more is a multiple of 1024, so clamping there changes
    // nothing modulo 256 and keeps the integer conversion exact.
    const LIMIT: f64 = 4_611_686_018_427_387_904.0; // 2^62
    (v.clamp(-LIMIT, LIMIT) as i64 & 0xff) as u8
}

impl fmt::Display for Prec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
