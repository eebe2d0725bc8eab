//! Device buffers: zero-filled, 64-byte-aligned memory blocks shared by contexts.

use crate::error::{Error, Result};
use crate::ir::Ndarray;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

/// A block of device memory. Generated code reads and writes it through raw pointers;
/// synchronizing those accesses is the caller's job (as in the seed API: await a device before
/// reading what it wrote).
pub struct Buffer {
    /// The allocation as returned by the allocator.
    raw: NonNull<u8>,
    /// `raw` rounded up to a multiple of [`ALIGN`].
    ptr: NonNull<u8>,
    size: usize,
    layout: Layout,
}

/// Alignment of buffer data (a cache line; also what AVX-512 loads prefer).
const ALIGN: usize = 64;

// SAFETY: a Buffer is a plain heap allocation owned by the Buffer; moving or sharing the handle
// between threads is sound. Concurrent access to the bytes goes through raw pointers whose
// synchronization is the documented responsibility of the caller (device awaits).
unsafe impl Send for Buffer {}
// SAFETY: see Send; no method hands out references into the bytes.
unsafe impl Sync for Buffer {}

/// A shared handle to a buffer.
pub type BufferPtr = Arc<Buffer>;

impl Buffer {
    /// A zero-filled buffer of `size` bytes; [`Error::OutOfMemory`] when it cannot be
    /// allocated.
    pub fn new(size: usize) -> Result<BufferPtr> {
        Buffer::new_for(size, || "a device buffer".to_string())
    }

    /// A zero-filled buffer of `size` bytes; when it cannot be allocated (or `size` is beyond
    /// what any allocation can have), [`Error::OutOfMemory`] saying what it was for (`what`,
    /// e.g. `the device buffer of tensor x`).
    pub fn new_for(size: usize, what: impl FnOnce() -> String) -> Result<BufferPtr> {
        // Over-allocate with the allocator's natural alignment so that `alloc_zeroed` can use
        // calloc (lazily zeroed pages for large buffers, instead of an eager memset), then align
        // the start by hand.
        let Some(layout) = size
            .checked_add(ALIGN)
            .and_then(|n| Layout::from_size_align(n, 16).ok())
        else {
            return Err(Error::OutOfMemory {
                what: what(),
                bytes: size,
            });
        };
        // SAFETY: the layout has non-zero size (at least ALIGN bytes).
        let raw = unsafe { alloc_zeroed(layout) };
        let Some(raw) = NonNull::new(raw) else {
            return Err(Error::OutOfMemory {
                what: what(),
                bytes: size,
            });
        };
        let offset = raw.as_ptr().align_offset(ALIGN);
        // SAFETY: offset < ALIGN, and the allocation has size + ALIGN bytes, so the aligned
        // start and the `size` bytes after it stay inside the allocation.
        let ptr = unsafe { NonNull::new_unchecked(raw.as_ptr().add(offset)) };
        Ok(Arc::new(Buffer {
            raw,
            ptr,
            size,
            layout,
        }))
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The start of the memory, for generated code.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Copies `bytes` into the start of the buffer.
    pub fn write_bytes(&self, bytes: &[u8]) -> Result<()> {
        if bytes.len() > self.size {
            return Err(Error::Usage(format!(
                "copying {} bytes into a buffer of {} bytes",
                bytes.len(),
                self.size
            )));
        }
        // SAFETY: the destination has at least bytes.len() bytes (checked above) and cannot
        // overlap a Rust slice borrowed from elsewhere (the buffer's memory is never lent out).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.as_ptr(), bytes.len()) };
        Ok(())
    }

    /// Copies the start of the buffer into `bytes`.
    pub fn read_bytes(&self, bytes: &mut [u8]) -> Result<()> {
        if bytes.len() > self.size {
            return Err(Error::Usage(format!(
                "reading {} bytes from a buffer of {} bytes",
                bytes.len(),
                self.size
            )));
        }
        // SAFETY: the source has at least bytes.len() bytes (checked above); the destination
        // is a distinct Rust slice.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), bytes.as_mut_ptr(), bytes.len())
        };
        Ok(())
    }

    /// Copies the first `len` bytes of `src` into this buffer.
    pub fn copy_from(&self, src: &Buffer, len: usize) -> Result<()> {
        if len > self.size || len > src.size {
            return Err(Error::Usage(format!(
                "copying {len} bytes between buffers of {} and {} bytes",
                src.size, self.size
            )));
        }
        if std::ptr::eq(self, src) {
            return Ok(());
        }
        // SAFETY: both regions have at least len bytes (checked) and belong to distinct
        // allocations (checked above), so they do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.ptr.as_ptr(), self.ptr.as_ptr(), len) };
        Ok(())
    }

    /// Copies a host array into the buffer.
    pub fn write_ndarray(&self, a: &Ndarray) -> Result<()> {
        self.write_bytes(a.as_bytes())
    }

    /// Copies the buffer into a host array.
    pub fn read_ndarray(&self, a: &mut Ndarray) -> Result<()> {
        self.read_bytes(a.as_bytes_mut())
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: raw was allocated with exactly this layout in Buffer::new and is freed once.
        unsafe { dealloc(self.raw.as_ptr(), self.layout) }
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Buffer({} bytes)", self.size)
    }
}
