//! Element-wise sums of device buffers, for [`Backend::all_reduce`](super::Backend::all_reduce):
//! the in-process backends sum the devices' buffers here, and the MPI backend sums a rank's
//! local buffers here before the MPI collective sums across ranks.
//!
//! Sums are in the tensor's precision, with two exceptions:
//! - the narrow floats (half, bfloat16, fp8) are summed in `f32` and rounded to their
//!   precision once at the end, to nearest even (MPI has no such types);
//! - the integers wider than a byte are summed in `u64` with wrapping, then stored by
//!   wrapping into their width (SPEC 9.1: modular arithmetic commutes with the wrap, so this
//!   is the exact sum modulo 2^bits, and `MPI_SUM` on `MPI_UINT64_T` is unsigned, never
//!   overflowing, arithmetic).
//!
//! Bytes wrap modulo 256 (C's `unsigned char` arithmetic, and what `MPI_SUM` does on
//! `MPI_UINT8_T`).

use super::buffer::DeviceBuffer;
use super::context::Context;
use super::device::Device;
use crate::error::{Error, Result};
use crate::ir::prec::{bf16_of_f64, bf16_to_f64, fp8_of_f64, fp8_to_f64};
use crate::ir::{Prec, Tnode};
use half::f16;

/// An accumulator of `n` elements, in the type the sum is computed in.
pub(crate) enum Acc {
    /// Bytes (wrapping).
    U8(Vec<u8>),
    /// The wider integers, as 64-bit patterns (wrapping).
    U64(Vec<u64>),
    /// Singles, and the narrow floats widened.
    F32(Vec<f32>),
    /// Doubles.
    F64(Vec<f64>),
}

/// A buffer's first `n` elements of type `T`, read.
///
/// # Safety
///
/// The caller holds the buffer's lock (shared at least; [`super::buffer::lock_all`]) while
/// the slice lives, and `T` must be a plain number type (any bit pattern valid).
unsafe fn view<T>(buf: &DeviceBuffer, n: usize) -> &[T] {
    assert!(n * std::mem::size_of::<T>() <= buf.size());
    assert!(buf.as_ptr().cast::<T>().is_aligned());
    // SAFETY: in bounds and aligned (asserted); no writer meanwhile (the caller's contract).
    unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<T>(), n) }
}

/// A buffer's first `n` elements of type `T`, written.
///
/// # Safety
///
/// The caller holds the buffer's lock exclusively while the slice lives, and `T` must be a
/// plain number type.
#[allow(clippy::mut_from_ref)] // the buffer's bytes are not Rust-borrowed anywhere else
unsafe fn view_mut<T>(buf: &DeviceBuffer, n: usize) -> &mut [T] {
    assert!(n * std::mem::size_of::<T>() <= buf.size());
    assert!(buf.as_ptr().cast::<T>().is_aligned());
    // SAFETY: in bounds and aligned (asserted); exclusive access (the caller's contract).
    unsafe { std::slice::from_raw_parts_mut(buf.as_ptr().cast::<T>(), n) }
}

impl Acc {
    /// Zeros for `n` elements of precision `prec`; [`Error::OutOfMemory`] if they cannot be
    /// allocated.
    pub(crate) fn zeros(prec: Prec, n: usize, what: &str) -> Result<Acc> {
        fn alloc<T: Clone + Default>(n: usize, what: &str) -> Result<Vec<T>> {
            let mut v = Vec::new();
            v.try_reserve_exact(n).map_err(|_| Error::OutOfMemory {
                what: what.to_string(),
                bytes: n.saturating_mul(std::mem::size_of::<T>()),
            })?;
            v.resize(n, T::default());
            Ok(v)
        }
        Ok(match Acc::kind(prec) {
            Prec::Byte => Acc::U8(alloc(n, what)?),
            Prec::Uint64 => Acc::U64(alloc(n, what)?),
            Prec::Single => Acc::F32(alloc(n, what)?),
            _ => Acc::F64(alloc(n, what)?),
        })
    }

    /// The precision a tensor of precision `prec` is summed in: `Byte`, `Uint64` (every
    /// wider integer), `Single` (single and the narrow floats) or `Double`.
    pub(crate) fn kind(prec: Prec) -> Prec {
        match prec {
            Prec::Byte => Prec::Byte,
            Prec::Half | Prec::Bfloat16 | Prec::Fp8 | Prec::Single => Prec::Single,
            Prec::Double => Prec::Double,
            _ => Prec::Uint64,
        }
    }

    /// Number of elements.
    pub(crate) fn len(&self) -> usize {
        match self {
            Acc::U8(v) => v.len(),
            Acc::U64(v) => v.len(),
            Acc::F32(v) => v.len(),
            Acc::F64(v) => v.len(),
        }
    }

    /// Adds the buffer's elements (of precision `prec`) to the accumulator.
    ///
    /// # Safety
    ///
    /// The caller holds `buf`'s lock (shared at least).
    pub(crate) unsafe fn add(&mut self, prec: Prec, buf: &DeviceBuffer) {
        let n = self.len();
        // SAFETY: the caller's contract.
        unsafe { self.add_at(prec, buf, 0, n) }
    }

    /// Adds the buffer's first `n` elements (of precision `prec`) to the accumulator's
    /// elements `at..at + n`.
    ///
    /// # Safety
    ///
    /// The caller holds `buf`'s lock (shared at least).
    pub(crate) unsafe fn add_at(&mut self, prec: Prec, buf: &DeviceBuffer, at: usize, n: usize) {
        // SAFETY (every view below): the caller guarantees no concurrent writer; the element
        // types match the precision's storage (bytes, half bit patterns, f32, f64).
        match (self, prec) {
            (Acc::U8(a), _) => {
                for (x, y) in a[at..at + n].iter_mut().zip(unsafe { view::<u8>(buf, n) }) {
                    *x = x.wrapping_add(*y);
                }
            }
            (Acc::U64(a), p) => {
                let a = &mut a[at..at + n];
                // Zero-extended: only the low bits of the sum are stored back.
                match p.size_in_bytes() {
                    2 => add_wrapping(a, unsafe { view::<u16>(buf, n) }),
                    4 => add_wrapping(a, unsafe { view::<u32>(buf, n) }),
                    _ => add_wrapping(a, unsafe { view::<u64>(buf, n) }),
                }
            }
            (Acc::F32(a), Prec::Bfloat16) => {
                for (x, y) in a[at..at + n].iter_mut().zip(unsafe { view::<u16>(buf, n) }) {
                    *x += bf16_to_f64(*y) as f32;
                }
            }
            (Acc::F32(a), Prec::Fp8) => {
                for (x, y) in a[at..at + n].iter_mut().zip(unsafe { view::<u8>(buf, n) }) {
                    *x += fp8_to_f64(*y) as f32;
                }
            }
            (Acc::F32(a), Prec::Half) => {
                for (x, y) in a[at..at + n].iter_mut().zip(unsafe { view::<u16>(buf, n) }) {
                    *x += f16::from_bits(*y).to_f32();
                }
            }
            (Acc::F32(a), _) => {
                for (x, y) in a[at..at + n].iter_mut().zip(unsafe { view::<f32>(buf, n) }) {
                    *x += *y;
                }
            }
            (Acc::F64(a), _) => {
                for (x, y) in a[at..at + n].iter_mut().zip(unsafe { view::<f64>(buf, n) }) {
                    *x += *y;
                }
            }
        }
    }

    /// Writes the accumulator into the buffer (of precision `prec`; halves rounded to nearest).
    ///
    /// # Safety
    ///
    /// The caller holds `buf`'s lock exclusively.
    pub(crate) unsafe fn store(&self, prec: Prec, buf: &DeviceBuffer) {
        let n = self.len();
        // SAFETY: the caller's contract.
        unsafe { self.store_at(prec, buf, 0, n) }
    }

    /// Writes the accumulator's elements `at..at + n` into the buffer's first `n` elements
    /// (of precision `prec`; halves rounded to nearest).
    ///
    /// # Safety
    ///
    /// The caller holds `buf`'s lock exclusively.
    pub(crate) unsafe fn store_at(&self, prec: Prec, buf: &DeviceBuffer, at: usize, n: usize) {
        // SAFETY (every view below): exclusive access (the caller's contract); element types
        // match the precision's storage.
        match (self, prec) {
            (Acc::U8(a), _) => unsafe { view_mut::<u8>(buf, n) }.copy_from_slice(&a[at..at + n]),
            (Acc::U64(a), p) => {
                let a = &a[at..at + n];
                // Truncation to the width: the sum modulo 2^bits.
                match p.size_in_bytes() {
                    2 => store_mapped(unsafe { view_mut::<u16>(buf, n) }, a, |v| v as u16),
                    4 => store_mapped(unsafe { view_mut::<u32>(buf, n) }, a, |v| v as u32),
                    _ => unsafe { view_mut::<u64>(buf, n) }.copy_from_slice(a),
                }
            }
            (Acc::F32(a), Prec::Bfloat16) => {
                let a = &a[at..at + n];
                store_mapped(unsafe { view_mut::<u16>(buf, n) }, a, |v| {
                    bf16_of_f64(f64::from(v))
                })
            }
            (Acc::F32(a), Prec::Fp8) => {
                let a = &a[at..at + n];
                store_mapped(unsafe { view_mut::<u8>(buf, n) }, a, |v| {
                    fp8_of_f64(f64::from(v))
                })
            }
            (Acc::F32(a), Prec::Half) => {
                for (x, y) in unsafe { view_mut::<u16>(buf, n) }
                    .iter_mut()
                    .zip(&a[at..at + n])
                {
                    *x = f16::from_f32(*y).to_bits();
                }
            }
            (Acc::F32(a), _) => unsafe { view_mut::<f32>(buf, n) }.copy_from_slice(&a[at..at + n]),
            (Acc::F64(a), _) => unsafe { view_mut::<f64>(buf, n) }.copy_from_slice(&a[at..at + n]),
        }
    }
}

/// `a[i] += b[i]` modulo 2^64, `b` zero-extended.
fn add_wrapping<T: Copy + Into<u64>>(a: &mut [u64], b: &[T]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x = x.wrapping_add((*y).into());
    }
}

/// `dst[i] = f(src[i])`: the sums stored in the tensor's own type.
fn store_mapped<S: Copy, T>(dst: &mut [T], src: &[S], f: impl Fn(S) -> T) {
    for (x, y) in dst.iter_mut().zip(src) {
        *x = f(*y);
    }
}

/// The devices and buffers of an all-reduce's contexts, checked: at least one context, each
/// on a device, on distinct devices, each holding the tensor.
pub(crate) fn participants(
    tn: &Tnode,
    ctxs: &[Context],
) -> Result<Vec<(Device, std::sync::Arc<DeviceBuffer>)>> {
    let err = |msg: String| Error::AllReduce {
        tensor: tn.name(),
        msg,
    };
    if ctxs.is_empty() {
        return Err(err("no contexts given".into()));
    }
    let mut out: Vec<(Device, std::sync::Arc<DeviceBuffer>)> = vec![];
    for ctx in ctxs {
        let device = ctx.device().cloned().ok_or_else(|| {
            err(format!(
                "context {} does not belong to a device (it comes from the no-device backend)",
                ctx.label()
            ))
        })?;
        if out.iter().any(|(d, _)| *d == device) {
            return Err(err(format!(
                "device {} is given twice (each device takes part at most once)",
                device.name()
            )));
        }
        let buf = ctx.get_buffer(tn).ok_or_else(|| {
            err(format!(
                "the tensor is not in context {} on device {} (no routine linked there uses it)",
                ctx.label(),
                device.name()
            ))
        })?;
        out.push((device, buf));
    }
    Ok(out)
}

/// Number of elements of a tensor.
pub(crate) fn elements(tn: &Tnode) -> usize {
    tn.size_in_bytes() / tn.prec().size_in_bytes()
}
