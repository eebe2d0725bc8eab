//! Host arrays: dense row-major buffers of one precision.

pub use super::prec::f16_from_f64;
use super::prec::{bf16_of_f64, bf16_to_f64, byte_of_f64, int_bits_of_f64, Fp8, Prec};
use crate::error::{Error, Result};
use half::{bf16, f16};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

/// How a host array is filled when it is created.
#[derive(Clone, Debug, PartialEq)]
pub enum InitOp {
    /// Values in row-major order. With `strict`, there must be exactly one value per cell;
    /// otherwise the values repeat cyclically.
    ConstantFill {
        /// The values.
        values: Vec<f64>,
        /// Whether the count must match the number of cells.
        strict: bool,
    },
    /// Each cell holds its own linear (row-major) offset.
    RangeOverOffsets,
    /// Uniform values in `[0, 1)` from a seeded generator.
    StandardUniform {
        /// The generator's seed.
        seed: u64,
    },
    /// All cells zero. (Unlike [`Ndarray::zeros`], [`Ndarray::create`] reports a failed
    /// allocation as [`Error::OutOfMemory`].)
    Zeros,
    /// The raw bytes of a file, in the array's precision (native byte order).
    ///
    /// The path must name a regular file of exactly the array's size in bytes; it is checked
    /// before anything is read (so `/dev/zero` or a FIFO is an error, not an endless read or a
    /// wait), opened without blocking, and checked again on the opened handle.
    FileMapped {
        /// The file to read.
        path: PathBuf,
    },
}

#[doc(hidden)]
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    Byte(Vec<u8>),
    Uint16(Vec<u16>),
    Int32(Vec<i32>),
    Uint32(Vec<u32>),
    Int64(Vec<i64>),
    Uint64(Vec<u64>),
    Fp8(Vec<Fp8>),
    Half(Vec<f16>),
    Bfloat16(Vec<bf16>),
    Single(Vec<f32>),
    Double(Vec<f64>),
}

/// A dense, row-major host array.
#[derive(Clone, Debug, PartialEq)]
pub struct Ndarray {
    dims: Vec<usize>,
    data: Data,
}

/// Number of cells of an array with the given dims; `usize::MAX` when the product overflows
/// (never a panic or a wrapped value). Use [`checked_numel`] or [`checked_size_in_bytes`] to
/// get an error instead.
pub fn numel(dims: &[usize]) -> usize {
    checked_numel(dims).unwrap_or(usize::MAX)
}

/// Number of cells of an array with the given dims, or an error when the product overflows
/// `usize`.
pub fn checked_numel(dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| {
            Error::Ndarray(format!(
                "dims {dims:?}: the number of cells overflows the address space"
            ))
        })
}

/// Size in bytes of an array with the given dims and precision, or an error when it does not
/// fit in the address space (more than `isize::MAX` bytes, the most any allocation can have).
pub fn checked_size_in_bytes(prec: Prec, dims: &[usize]) -> Result<usize> {
    checked_numel(dims)?
        .checked_mul(prec.size_in_bytes())
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| {
            Error::Ndarray(format!(
                "dims {dims:?} of precision {prec}: the size in bytes overflows the address space"
            ))
        })
}

/// A vector of `n` copies of `fill`, or [`Error::OutOfMemory`] for `what` when it cannot be
/// allocated (instead of aborting the process).
pub(crate) fn try_filled<T: Clone>(
    n: usize,
    fill: T,
    what: impl FnOnce() -> String,
) -> Result<Vec<T>> {
    let mut v: Vec<T> = Vec::new();
    if v.try_reserve_exact(n).is_err() {
        return Err(Error::OutOfMemory {
            what: what(),
            bytes: n.saturating_mul(std::mem::size_of::<T>()),
        });
    }
    v.resize(n, fill);
    Ok(v)
}

/// A small, fast, seedable generator (SplitMix64) for [`InitOp::StandardUniform`] (and, with
/// helpers, for `nn`'s datasets and initialization).
#[derive(Clone, Debug)]
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[0, 1)` with 53 random bits.
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The platform's `O_NONBLOCK` open flag, where it is known (from the kernels' headers).
#[cfg(unix)]
fn o_nonblock() -> Option<i32> {
    if cfg!(any(target_os = "linux", target_os = "android")) {
        if cfg!(any(target_arch = "mips", target_arch = "mips64")) {
            Some(0x80)
        } else if cfg!(any(target_arch = "sparc", target_arch = "sparc64")) {
            Some(0x4000)
        } else {
            Some(0o4000)
        }
    } else if cfg!(any(
        target_os = "macos",
        target_os = "ios",
        target_os = "freebsd",
        target_os = "netbsd",
        target_os = "openbsd",
        target_os = "dragonfly"
    )) {
        Some(0x0004)
    } else {
        None
    }
}

/// Opens an array file for reading without blocking (a FIFO swapped in after the metadata
/// check must not make `open` wait for a writer).
fn open_nonblocking(path: &Path) -> std::io::Result<File> {
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    if let Some(flag) = o_nonblock() {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(flag);
    }
    opts.open(path)
}

/// Checks that an array file is a regular file of exactly `want` bytes (before opening it and
/// again on the opened handle), then reads it into `dst`.
fn read_array_file(path: &Path, want: usize, dst: &mut [u8], what: &str) -> Result<()> {
    let shown = path.display();
    let check = |md: &std::fs::Metadata, when: &str| -> Result<()> {
        if !md.is_file() {
            return Err(Error::Ndarray(format!(
                "{what}: file {shown} is not a regular file{when}"
            )));
        }
        if md.len() != want as u64 {
            return Err(Error::Ndarray(format!(
                "{what}: file {shown} has {} bytes, but needs exactly {want}{when}",
                md.len()
            )));
        }
        Ok(())
    };
    let io = |e: std::io::Error, doing: &str| {
        Error::Ndarray(format!("{what}: {doing} file {shown}: {e}"))
    };
    let md = std::fs::metadata(path).map_err(|e| io(e, "cannot access"))?;
    check(&md, "")?;
    let mut f = open_nonblocking(path).map_err(|e| io(e, "cannot open"))?;
    let md = f.metadata().map_err(|e| io(e, "cannot access"))?;
    check(&md, " (it changed while being opened)")?;
    f.read_exact(dst).map_err(|e| io(e, "reading"))?;
    let mut extra = [0u8; 1];
    match f.read(&mut extra) {
        Ok(0) => Ok(()),
        Ok(_) => Err(Error::Ndarray(format!(
            "{what}: file {shown} grew beyond {want} bytes while being read"
        ))),
        Err(e) => Err(io(e, "reading")),
    }
}

impl Ndarray {
    /// An array of zeros.
    ///
    /// Like `vec!`, this aborts the process when the memory cannot be allocated; use
    /// [`Ndarray::try_zeros`] for sizes that come from user input.
    pub fn zeros(prec: Prec, dims: &[usize]) -> Ndarray {
        let n = numel(dims);
        let data = match prec {
            Prec::Byte => Data::Byte(vec![0; n]),
            Prec::Uint16 => Data::Uint16(vec![0; n]),
            Prec::Int32 => Data::Int32(vec![0; n]),
            Prec::Uint32 => Data::Uint32(vec![0; n]),
            Prec::Int64 => Data::Int64(vec![0; n]),
            Prec::Uint64 => Data::Uint64(vec![0; n]),
            Prec::Fp8 => Data::Fp8(vec![Fp8::default(); n]),
            Prec::Bfloat16 => Data::Bfloat16(vec![bf16::ZERO; n]),
            Prec::Half => Data::Half(vec![f16::ZERO; n]),
            Prec::Single => Data::Single(vec![0.0; n]),
            Prec::Double => Data::Double(vec![0.0; n]),
        };
        Ndarray {
            dims: dims.to_vec(),
            data,
        }
    }

    /// An array of zeros, or [`Error::OutOfMemory`] when it cannot be allocated (an error
    /// too when its size overflows the address space).
    pub fn try_zeros(prec: Prec, dims: &[usize]) -> Result<Ndarray> {
        checked_size_in_bytes(prec, dims)?;
        let n = numel(dims);
        let what = || format!("a host array of dims {dims:?} ({prec})");
        let data = match prec {
            Prec::Byte => Data::Byte(try_filled(n, 0, what)?),
            Prec::Uint16 => Data::Uint16(try_filled(n, 0, what)?),
            Prec::Int32 => Data::Int32(try_filled(n, 0, what)?),
            Prec::Uint32 => Data::Uint32(try_filled(n, 0, what)?),
            Prec::Int64 => Data::Int64(try_filled(n, 0, what)?),
            Prec::Uint64 => Data::Uint64(try_filled(n, 0, what)?),
            Prec::Fp8 => Data::Fp8(try_filled(n, Fp8::default(), what)?),
            Prec::Bfloat16 => Data::Bfloat16(try_filled(n, bf16::ZERO, what)?),
            Prec::Half => Data::Half(try_filled(n, f16::ZERO, what)?),
            Prec::Single => Data::Single(try_filled(n, 0.0, what)?),
            Prec::Double => Data::Double(try_filled(n, 0.0, what)?),
        };
        Ok(Ndarray {
            dims: dims.to_vec(),
            data,
        })
    }

    /// Creates an array and fills it with `init`.
    ///
    /// Errors: a size that overflows the address space, a failed allocation
    /// ([`Error::OutOfMemory`]), a wrong number of values, and for [`InitOp::FileMapped`] a
    /// path that is not a regular file of exactly the array's size or cannot be read.
    pub fn create(prec: Prec, dims: &[usize], init: &InitOp) -> Result<Ndarray> {
        let mut a = Ndarray::try_zeros(prec, dims)?;
        let n = a.len();
        match init {
            InitOp::Zeros => {}
            InitOp::ConstantFill { values, strict } => {
                if *strict && values.len() != n {
                    return Err(Error::Ndarray(format!(
                        "constant fill of dims {dims:?} needs exactly {n} values, got {}",
                        values.len()
                    )));
                }
                if values.is_empty() && n > 0 {
                    return Err(Error::Ndarray(format!(
                        "constant fill of dims {dims:?} got no values"
                    )));
                }
                // The array is zero already.
                if values.iter().any(|v| v.to_bits() != 0) {
                    for i in 0..n {
                        a.set(i, values[i % values.len()]);
                    }
                }
            }
            InitOp::RangeOverOffsets => {
                for i in 0..n {
                    if prec.is_integer() {
                        a.set_int(i, i as i128);
                    } else {
                        a.set(i, i as f64);
                    }
                }
            }
            InitOp::StandardUniform { seed } => {
                let mut rng = SplitMix64::new(*seed);
                for i in 0..n {
                    a.set(i, rng.next_f64());
                }
            }
            InitOp::FileMapped { path } => {
                let want = a.size_in_bytes();
                let what = format!("dims {dims:?} of precision {prec}");
                read_array_file(path, want, a.as_bytes_mut(), &what)?;
            }
        }
        Ok(a)
    }

    /// The precision.
    pub fn prec(&self) -> Prec {
        match self.data {
            Data::Byte(_) => Prec::Byte,
            Data::Uint16(_) => Prec::Uint16,
            Data::Int32(_) => Prec::Int32,
            Data::Uint32(_) => Prec::Uint32,
            Data::Int64(_) => Prec::Int64,
            Data::Uint64(_) => Prec::Uint64,
            Data::Fp8(_) => Prec::Fp8,
            Data::Bfloat16(_) => Prec::Bfloat16,
            Data::Half(_) => Prec::Half,
            Data::Single(_) => Prec::Single,
            Data::Double(_) => Prec::Double,
        }
    }

    /// The dims.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Number of cells.
    pub fn len(&self) -> usize {
        numel(&self.dims)
    }

    /// Whether the array has no cells.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Size in bytes.
    pub fn size_in_bytes(&self) -> usize {
        self.len() * self.prec().size_in_bytes()
    }

    /// Reads cell `i` (row-major offset) as `f64`.
    pub fn get(&self, i: usize) -> f64 {
        match &self.data {
            Data::Byte(v) => v[i] as f64,
            Data::Uint16(v) => v[i] as f64,
            Data::Int32(v) => v[i] as f64,
            Data::Uint32(v) => v[i] as f64,
            Data::Int64(v) => v[i] as f64,
            Data::Uint64(v) => v[i] as f64,
            Data::Fp8(v) => v[i].to_f64(),
            Data::Bfloat16(v) => bf16_to_f64(v[i].to_bits()),
            Data::Half(v) => v[i].to_f64(),
            Data::Single(v) => v[i] as f64,
            Data::Double(v) => v[i],
        }
    }

    /// Writes cell `i`, rounding to the array's precision (halves correctly rounded with
    /// [`f16_from_f64`]; bytes as [`crate::ir::prec::byte_of_f64`] stores them).
    pub fn set(&mut self, i: usize, x: f64) {
        match &mut self.data {
            Data::Byte(v) => v[i] = byte_of_f64(x),
            Data::Uint16(v) => v[i] = int_bits_of_f64(x) as u16,
            Data::Int32(v) => v[i] = int_bits_of_f64(x) as i32,
            Data::Uint32(v) => v[i] = int_bits_of_f64(x) as u32,
            Data::Int64(v) => v[i] = int_bits_of_f64(x) as i64,
            Data::Uint64(v) => v[i] = int_bits_of_f64(x),
            Data::Fp8(v) => v[i] = Fp8::from_f64(x),
            Data::Bfloat16(v) => v[i] = bf16::from_bits(bf16_of_f64(x)),
            Data::Half(v) => v[i] = f16_from_f64(x),
            Data::Single(v) => v[i] = x as f32,
            Data::Double(v) => v[i] = x,
        }
    }

    /// Reads cell `i` of an integer array exactly (`None` for floating arrays).
    pub fn get_int(&self, i: usize) -> Option<i128> {
        Some(match &self.data {
            Data::Byte(v) => i128::from(v[i]),
            Data::Uint16(v) => i128::from(v[i]),
            Data::Int32(v) => i128::from(v[i]),
            Data::Uint32(v) => i128::from(v[i]),
            Data::Int64(v) => i128::from(v[i]),
            Data::Uint64(v) => i128::from(v[i]),
            _ => return None,
        })
    }

    /// Writes an integer into cell `i`, wrapping it modulo 2^bits for integer arrays
    /// (rounding it for floating ones).
    pub fn set_int(&mut self, i: usize, x: i128) {
        let bits = x as u64;
        match &mut self.data {
            Data::Byte(v) => v[i] = bits as u8,
            Data::Uint16(v) => v[i] = bits as u16,
            Data::Int32(v) => v[i] = bits as i32,
            Data::Uint32(v) => v[i] = bits as u32,
            Data::Int64(v) => v[i] = bits as i64,
            Data::Uint64(v) => v[i] = bits,
            _ => self.set(i, x as f64),
        }
    }

    /// The cells as a typed slice; [`Error::PrecisionMismatch`] when `T` is not the array's
    /// element type (bfloat16 and fp8 arrays are read through [`Ndarray::get`]).
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        T::slice(&self.data).ok_or_else(|| Error::PrecisionMismatch {
            expected: T::PREC.name().to_string(),
            actual: self.prec().name().to_string(),
        })
    }

    /// The cells copied into a typed vector; [`Error::PrecisionMismatch`] on a wrong `T`.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.as_slice::<T>().map(<[T]>::to_vec)
    }

    /// The elements as a mutable slice of their Rust type; [`Error::PrecisionMismatch`] when
    /// `T` is not this array's element type.
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        let actual = self.prec().name().to_string();
        T::slice_mut(&mut self.data).ok_or_else(|| Error::PrecisionMismatch {
            expected: T::PREC.name().to_string(),
            actual,
        })
    }

    /// All cells as `f64`, row-major.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        (0..self.len()).map(|i| self.get(i)).collect()
    }

    /// All cells as `f64`, row-major, or [`Error::OutOfMemory`] (naming `what`) when the
    /// vector cannot be allocated.
    pub fn try_to_f64_vec(&self, what: &str) -> Result<Vec<f64>> {
        let n = self.len();
        let mut v: Vec<f64> = Vec::new();
        if v.try_reserve_exact(n).is_err() {
            return Err(Error::OutOfMemory {
                what: what.to_string(),
                bytes: n.saturating_mul(8),
            });
        }
        v.extend((0..n).map(|i| self.get(i)));
        Ok(v)
    }

    /// Overwrites all cells from `values` (row-major); the length must match.
    pub fn set_values(&mut self, values: &[f64]) -> Result<()> {
        if values.len() != self.len() {
            return Err(Error::Ndarray(format!(
                "set_values on dims {:?} needs {} values, got {}",
                self.dims,
                self.len(),
                values.len()
            )));
        }
        for (i, &x) in values.iter().enumerate() {
            self.set(i, x);
        }
        Ok(())
    }

    /// The raw bytes (native byte order).
    pub fn as_bytes(&self) -> &[u8] {
        match &self.data {
            Data::Byte(v) => v,
            Data::Fp8(v) => bytes_of(v),
            Data::Uint16(v) => bytes_of(v),
            Data::Bfloat16(v) => bytes_of(v),
            Data::Int32(v) => bytes_of(v),
            Data::Uint32(v) => bytes_of(v),
            Data::Int64(v) => bytes_of(v),
            Data::Uint64(v) => bytes_of(v),
            Data::Half(v) => bytes_of(v),
            Data::Single(v) => bytes_of(v),
            Data::Double(v) => bytes_of(v),
        }
    }

    /// The raw bytes, mutable (native byte order).
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.data {
            Data::Byte(v) => v,
            Data::Fp8(v) => bytes_of_mut(v),
            Data::Uint16(v) => bytes_of_mut(v),
            Data::Bfloat16(v) => bytes_of_mut(v),
            Data::Int32(v) => bytes_of_mut(v),
            Data::Uint32(v) => bytes_of_mut(v),
            Data::Int64(v) => bytes_of_mut(v),
            Data::Uint64(v) => bytes_of_mut(v),
            Data::Half(v) => bytes_of_mut(v),
            Data::Single(v) => bytes_of_mut(v),
            Data::Double(v) => bytes_of_mut(v),
        }
    }
}

/// Plain-old-data element types whose every bit pattern is valid.
/// Plain number types: no padding, and every bit pattern is a valid value.
trait Pod: Copy {}
impl Pod for Fp8 {}
impl Pod for bf16 {}
impl Pod for f16 {}
impl Pod for u16 {}
impl Pod for i32 {}
impl Pod for u32 {}
impl Pod for i64 {}
impl Pod for u64 {}

/// Element types of host arrays with typed access ([`Ndarray::as_slice`]).
pub trait Element: Copy + private::Sealed {
    /// The precision of arrays of this element type.
    const PREC: Prec;
    #[doc(hidden)]
    fn slice(d: &Data) -> Option<&[Self]>;
    #[doc(hidden)]
    fn slice_mut(d: &mut Data) -> Option<&mut [Self]>;
}

mod private {
    pub trait Sealed {}
}

macro_rules! element {
    ($t:ty, $v:ident, $p:ident) => {
        impl private::Sealed for $t {}
        impl Element for $t {
            const PREC: Prec = Prec::$p;
            fn slice(d: &Data) -> Option<&[Self]> {
                match d {
                    Data::$v(v) => Some(v),
                    _ => None,
                }
            }
            fn slice_mut(d: &mut Data) -> Option<&mut [Self]> {
                match d {
                    Data::$v(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
element!(u8, Byte, Byte);
element!(u16, Uint16, Uint16);
element!(i32, Int32, Int32);
element!(u32, Uint32, Uint32);
element!(i64, Int64, Int64);
element!(u64, Uint64, Uint64);
element!(Fp8, Fp8, Fp8);
element!(bf16, Bfloat16, Bfloat16);
element!(f16, Half, Half);
element!(f32, Single, Single);
element!(f64, Double, Double);
impl Pod for f32 {}
impl Pod for f64 {}

fn bytes_of<T: Pod>(v: &[T]) -> &[u8] {
    // SAFETY: T is a plain numeric type without padding; the byte view covers exactly the
    // slice's memory and borrows it immutably for the same lifetime.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn bytes_of_mut<T: Pod>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `bytes_of`; additionally every bit pattern is a valid T, so writes through
    // the byte view cannot create invalid values.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The nearest half by brute force over every finite half (ties to the even bit
    /// pattern), as an oracle independent of `f16_bracket`.
    fn nearest_half(x: f64) -> u16 {
        let a = x.abs();
        let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
        if a >= 65520.0 {
            return sign | 0x7C00;
        }
        let mut best = 0u16;
        for b in 1..0x7C00u16 {
            let (d, db) = (
                (f16::from_bits(b).to_f64() - a).abs(),
                (f16::from_bits(best).to_f64() - a).abs(),
            );
            if d < db || (d == db && b.is_multiple_of(2)) {
                best = b;
            }
        }
        sign | best
    }

    #[test]
    fn f16_from_f64_is_correctly_rounded() {
        let mut cases = vec![
            0.0,
            -0.0,
            1.0,
            65504.0,
            65519.999,
            65520.0,
            1e-9,
            2f64.powi(-25),
            2f64.powi(-25) * (1.0 + f64::EPSILON),
            1.0 + 2f64.powi(-11),
            1.0 + 2f64.powi(-11) + 2f64.powi(-40),
            -(1.0 + 2f64.powi(-11) + 2f64.powi(-40)),
            3.0 * 2f64.powi(-25),
        ];
        // Values just around every 97th midpoint, and pseudo-random values.
        for b in (0..0x7BFFu16).step_by(97) {
            let mid = (f16::from_bits(b).to_f64() + f16::from_bits(b + 1).to_f64()) / 2.0;
            cases.extend([
                mid,
                mid * (1.0 + f64::EPSILON),
                mid * (1.0 - f64::EPSILON / 2.0),
            ]);
        }
        let mut rng = SplitMix64::new(5);
        for _ in 0..300 {
            let e = (rng.next_u64() % 44) as i32 - 28;
            cases.push((rng.next_f64() + 0.5) * 2f64.powi(e));
        }
        for x in cases {
            assert_eq!(f16_from_f64(x).to_bits(), nearest_half(x), "{x:e}");
        }
        assert!(f16_from_f64(f64::NAN).is_nan());
        assert_eq!(f16_from_f64(f64::NEG_INFINITY), f16::NEG_INFINITY);
    }

    #[test]
    fn sizes_that_overflow_are_errors() {
        let huge = [usize::MAX / 2, 3];
        assert_eq!(numel(&huge), usize::MAX);
        assert!(checked_numel(&huge).is_err());
        assert_eq!(checked_numel(&[4, 5]).unwrap(), 20);
        // Fits in usize as cells, not as bytes.
        let dims = [usize::MAX / 8];
        assert!(checked_numel(&dims).is_ok());
        assert!(checked_size_in_bytes(Prec::Double, &dims).is_err());
        let e = Ndarray::try_zeros(Prec::Double, &dims).unwrap_err();
        assert!(e.to_string().contains("overflows"), "{e}");
        let e = Ndarray::create(Prec::Single, &huge, &InitOp::RangeOverOffsets).unwrap_err();
        assert!(e.to_string().contains("overflows"), "{e}");
    }

    #[test]
    fn zeros_init_and_fallible_zeros() {
        let a = Ndarray::create(Prec::Half, &[2, 3], &InitOp::Zeros).unwrap();
        assert_eq!(a.to_f64_vec(), vec![0.0; 6]);
        assert_eq!(Ndarray::try_zeros(Prec::Byte, &[7]).unwrap().len(), 7);
    }

    #[cfg(unix)]
    #[test]
    fn array_files_must_be_regular_files_of_the_exact_size() {
        let dir = tempfile::tempdir().unwrap();
        let ok = dir.path().join("ok.bin");
        std::fs::write(&ok, 1.5f32.to_ne_bytes().repeat(2)).unwrap();
        let file = |p: &Path| InitOp::FileMapped {
            path: p.to_path_buf(),
        };
        let a = Ndarray::create(Prec::Single, &[2], &file(&ok)).unwrap();
        assert_eq!(a.to_f64_vec(), vec![1.5, 1.5]);
        let e = Ndarray::create(Prec::Single, &[3], &file(&ok)).unwrap_err();
        assert!(
            e.to_string().contains("has 8 bytes, but needs exactly 12"),
            "{e}"
        );
        for special in ["/dev/zero", "/dev/null"] {
            let e = Ndarray::create(Prec::Single, &[2], &file(Path::new(special))).unwrap_err();
            assert!(e.to_string().contains("is not a regular file"), "{e}");
        }
        let e = Ndarray::create(Prec::Single, &[2], &file(dir.path())).unwrap_err();
        assert!(e.to_string().contains("is not a regular file"), "{e}");
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            let e = Ndarray::create(Prec::Single, &[2], &file(&fifo)).unwrap_err();
            assert!(e.to_string().contains("is not a regular file"), "{e}");
            // Opening a FIFO (as if it had been swapped in after the check) does not wait
            // for a writer.
            let (tx, rx) = std::sync::mpsc::channel();
            let p = fifo.clone();
            std::thread::spawn(move || {
                let _ = tx.send(open_nonblocking(&p).map(|_| ()).is_ok());
            });
            let opened = rx.recv_timeout(std::time::Duration::from_secs(10));
            assert_eq!(opened, Ok(true), "opening a FIFO blocked or failed");
        }
    }
}
