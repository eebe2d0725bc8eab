//! Host arrays: dense row-major buffers of one precision.

use super::prec::{byte_of_f64, Prec};
use crate::error::{Error, Result};
use half::f16;
use std::path::PathBuf;

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
    /// The raw bytes of a file, in the array's precision (native byte order).
    FileMapped {
        /// The file to read.
        path: PathBuf,
    },
}

#[derive(Clone, Debug, PartialEq)]
enum Data {
    Byte(Vec<u8>),
    Half(Vec<f16>),
    Single(Vec<f32>),
    Double(Vec<f64>),
}

/// A dense, row-major host array.
#[derive(Clone, Debug, PartialEq)]
pub struct Ndarray {
    dims: Vec<usize>,
    data: Data,
}

/// Number of cells of an array with the given dims.
pub fn numel(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// A small, fast, seedable generator (SplitMix64) for [`InitOp::StandardUniform`].
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

impl Ndarray {
    /// An array of zeros.
    pub fn zeros(prec: Prec, dims: &[usize]) -> Ndarray {
        let n = numel(dims);
        let data = match prec {
            Prec::Byte => Data::Byte(vec![0; n]),
            Prec::Half => Data::Half(vec![f16::ZERO; n]),
            Prec::Single => Data::Single(vec![0.0; n]),
            Prec::Double => Data::Double(vec![0.0; n]),
        };
        Ndarray {
            dims: dims.to_vec(),
            data,
        }
    }

    /// Creates an array and fills it with `init`.
    pub fn create(prec: Prec, dims: &[usize], init: &InitOp) -> Result<Ndarray> {
        let mut a = Ndarray::zeros(prec, dims);
        let n = a.len();
        match init {
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
                for i in 0..n {
                    a.set(i, values[i % values.len()]);
                }
            }
            InitOp::RangeOverOffsets => {
                for i in 0..n {
                    a.set(i, i as f64);
                }
            }
            InitOp::StandardUniform { seed } => {
                let mut rng = SplitMix64::new(*seed);
                for i in 0..n {
                    a.set(i, rng.next_f64());
                }
            }
            InitOp::FileMapped { path } => {
                let bytes = std::fs::read(path)
                    .map_err(|e| Error::io(format!("reading array file {}", path.display()), e))?;
                let want = n * prec.size_in_bytes();
                if bytes.len() != want {
                    return Err(Error::Ndarray(format!(
                        "file {} has {} bytes, but dims {dims:?} of precision {prec} need {want}",
                        path.display(),
                        bytes.len()
                    )));
                }
                a.as_bytes_mut().copy_from_slice(&bytes);
            }
        }
        Ok(a)
    }

    /// The precision.
    pub fn prec(&self) -> Prec {
        match self.data {
            Data::Byte(_) => Prec::Byte,
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
            Data::Half(v) => v[i].to_f64(),
            Data::Single(v) => v[i] as f64,
            Data::Double(v) => v[i],
        }
    }

    /// Writes cell `i`, rounding to the array's precision (bytes saturate).
    pub fn set(&mut self, i: usize, x: f64) {
        match &mut self.data {
            Data::Byte(v) => v[i] = byte_of_f64(x),
            Data::Half(v) => v[i] = f16::from_f64(x),
            Data::Single(v) => v[i] = x as f32,
            Data::Double(v) => v[i] = x,
        }
    }

    /// All cells as `f64`, row-major.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        (0..self.len()).map(|i| self.get(i)).collect()
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
            Data::Half(v) => bytes_of(v),
            Data::Single(v) => bytes_of(v),
            Data::Double(v) => bytes_of(v),
        }
    }

    /// The raw bytes, mutable (native byte order).
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.data {
            Data::Byte(v) => v,
            Data::Half(v) => bytes_of_mut(v),
            Data::Single(v) => bytes_of_mut(v),
            Data::Double(v) => bytes_of_mut(v),
        }
    }
}

/// Plain-old-data element types whose every bit pattern is valid.
trait Pod: Copy {}
impl Pod for f16 {}
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
