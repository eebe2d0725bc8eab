//! Device buffers: zero-filled, 64-byte-aligned memory blocks shared by contexts.

use crate::error::{Error, Result};
use crate::ir::Ndarray;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::any::Any;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A block of device memory, shared by contexts, routines and transfers.
///
/// Every access to the bytes holds the buffer's reader-writer lock: the copies here take it
/// themselves, and a routine run takes the locks of all its buffers at once ([`lock_all`]),
/// shared for the buffers it only reads and exclusive for those it writes. So safe code can
/// never race on a buffer: a program whose devices are not synchronized (a copy scheduled
/// while another device still writes the source) gets some interleaving of whole operations,
/// never a torn one. Ordering the operations is still the caller's job (as in the seed API:
/// await a device, or wait for its event, before reading what it wrote); the locks are
/// uncontended when it is done.
pub struct DeviceBuffer {
    /// The allocation as returned by the allocator.
    raw: NonNull<u8>,
    /// `raw` rounded up to a multiple of [`ALIGN`].
    ptr: NonNull<u8>,
    size: usize,
    layout: Layout,
    /// Held (shared or exclusive) by every access to the bytes. On a cache line of its own:
    /// the thread running a routine writes it, while the scheduling thread reads `tracking`.
    access: CacheLine<RwLock<()>>,
    /// Whether anything wrote the buffer since it was allocated (zero-filled).
    written: AtomicBool,
    /// What the device layer's hazard tracking keeps (used by the scheduling thread).
    tracking: CacheLine<Tracking>,
}

/// A value alone on its cache line(s), so that threads writing neighbouring data do not
/// slow down its readers.
#[repr(align(64))]
struct CacheLine<T>(T);

struct Tracking {
    /// The record of the tasks scheduled to access the buffer (see `device`); opaque here,
    /// so that buffers do not depend on devices.
    hazards: Mutex<Option<Box<dyn Any + Send>>>,
    /// The fast path: the id of the one device queue that has accessed the buffer (0: none
    /// yet; `usize::MAX`: several, see `hazards`).
    owner: AtomicUsize,
}

/// Alignment of buffer data (a cache line; also what AVX-512 loads prefer).
const ALIGN: usize = 64;

// SAFETY: a DeviceBuffer is a plain heap allocation owned by the DeviceBuffer; moving the handle between
// threads is sound.
unsafe impl Send for DeviceBuffer {}
// SAFETY: every access to the bytes (the copies below, and routine runs through `lock_all`)
// holds `access`: shared to read, exclusive to write, so no two threads race on them. No
// method hands out references into the bytes.
unsafe impl Sync for DeviceBuffer {}

/// A shared handle to a buffer.
pub type BufferPtr = Arc<DeviceBuffer>;

impl DeviceBuffer {
    /// A zero-filled buffer of `size` bytes; [`Error::OutOfMemory`] when it cannot be
    /// allocated.
    pub fn new(size: usize) -> Result<BufferPtr> {
        DeviceBuffer::new_for(size, || "a device buffer".to_string())
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
        advise_huge_pages(raw.as_ptr(), layout.size());
        let offset = raw.as_ptr().align_offset(ALIGN);
        // SAFETY: offset < ALIGN, and the allocation has size + ALIGN bytes, so the aligned
        // start and the `size` bytes after it stay inside the allocation.
        let ptr = unsafe { NonNull::new_unchecked(raw.as_ptr().add(offset)) };
        Ok(Arc::new(DeviceBuffer {
            raw,
            ptr,
            size,
            layout,
            access: CacheLine(RwLock::new(())),
            written: AtomicBool::new(false),
            tracking: CacheLine(Tracking {
                hazards: Mutex::new(None),
                owner: AtomicUsize::new(0),
            }),
        }))
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The start of the memory, for generated code. Reading or writing through it is
    /// sound only while holding the buffer's lock ([`lock_all`]).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Whether anything (a host copy, a buffer copy, a routine storing to it) wrote the
    /// buffer since it was allocated zero-filled.
    pub fn was_written(&self) -> bool {
        self.written.load(Ordering::Relaxed)
    }

    /// Records that the buffer was written.
    pub(crate) fn mark_written(&self) {
        if !self.written.load(Ordering::Relaxed) {
            self.written.store(true, Ordering::Relaxed);
        }
    }

    /// The device layer's hazard record (see `Tracking`).
    pub(crate) fn hazards(&self) -> MutexGuard<'_, Option<Box<dyn Any + Send>>> {
        self.tracking
            .0
            .hazards
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The id of the one device queue that has accessed the buffer (0: none yet;
    /// `usize::MAX`: several), for the device layer's hazard tracking.
    pub(crate) fn owner(&self) -> &AtomicUsize {
        &self.tracking.0.owner
    }

    fn read_lock(&self) -> RwLockReadGuard<'_, ()> {
        self.access.0.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_lock(&self) -> RwLockWriteGuard<'_, ()> {
        self.access.0.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Copies `bytes` into the start of the buffer.
    pub fn write_bytes(&self, bytes: &[u8]) -> Result<()> {
        if bytes.len() > self.size {
            return Err(Error::BufferSize {
                what: "copying into a device buffer",
                bytes: bytes.len(),
                size: self.size,
            });
        }
        let _guard = self.write_lock();
        self.mark_written();
        // SAFETY: the destination has at least bytes.len() bytes (checked above) and cannot
        // overlap a Rust slice borrowed from elsewhere (the buffer's memory is never lent out);
        // the exclusive lock keeps every other access out.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.as_ptr(), bytes.len()) };
        Ok(())
    }

    /// Copies the start of the buffer into `bytes`.
    pub fn read_bytes(&self, bytes: &mut [u8]) -> Result<()> {
        self.read_bytes_at(0, bytes)
    }

    /// Copies the bytes `offset .. offset + bytes.len()` of the buffer into `bytes`.
    pub fn read_bytes_at(&self, offset: usize, bytes: &mut [u8]) -> Result<()> {
        if offset
            .checked_add(bytes.len())
            .is_none_or(|end| end > self.size)
        {
            return Err(Error::BufferSize {
                what: "reading from a device buffer",
                bytes: offset.saturating_add(bytes.len()),
                size: self.size,
            });
        }
        let _guard = self.read_lock();
        // SAFETY: the source has at least offset + bytes.len() bytes (checked above); the
        // destination is a distinct Rust slice; the shared lock keeps writers out.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                bytes.as_mut_ptr(),
                bytes.len(),
            )
        };
        Ok(())
    }

    /// Copies the first `len` bytes of `src` into this buffer.
    pub fn copy_from(&self, src: &DeviceBuffer, len: usize) -> Result<()> {
        if len > self.size || len > src.size {
            return Err(Error::BufferSize {
                what: "copying between device buffers",
                bytes: len,
                size: self.size.min(src.size),
            });
        }
        if std::ptr::eq(self, src) {
            return Ok(());
        }
        let _guards = lock_all(&mut [(src, false), (self, true)]);
        self.mark_written();
        // SAFETY: both regions have at least len bytes (checked) and belong to distinct
        // allocations (checked above), so they do not overlap; the locks keep writers of the
        // source and every other access to the destination out.
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

/// The held locks of a set of buffers (released when dropped): the first
/// [`Access::INLINE`] without allocating.
#[must_use = "the buffers are unlocked when this is dropped"]
pub struct Access<'a> {
    _inline: [Option<Guard<'a>>; Access::INLINE],
    _more: Vec<Guard<'a>>,
}

impl Access<'_> {
    /// How many locks are held without allocating.
    pub const INLINE: usize = 8;
}

/// A held lock: never read, only dropped (which releases it).
#[allow(dead_code)]
enum Guard<'a> {
    Read(RwLockReadGuard<'a, ()>),
    Write(RwLockWriteGuard<'a, ()>),
}

/// Locks every buffer of `buffers` (`true`: exclusively, to write; `false`: shared, to read),
/// in address order so that two threads locking overlapping sets cannot deadlock. A buffer
/// listed more than once is locked once, exclusively if any entry asks for it. Blocks while
/// another thread holds a conflicting lock.
pub fn lock_all<'a>(buffers: &mut [(&'a DeviceBuffer, bool)]) -> Access<'a> {
    buffers.sort_by_key(|(b, _)| b.ptr.as_ptr() as usize);
    lock_sorted(buffers.iter().copied())
}

/// A lock plan for [`lock_planned`]: the buffers in address order, each once, exclusive if
/// any entry asks for it (what [`lock_all`] works out on every call, done once).
pub(crate) fn plan_locks(mut buffers: Vec<(BufferPtr, bool)>) -> Arc<[(BufferPtr, bool)]> {
    buffers.sort_by_key(|(b, _)| b.ptr.as_ptr() as usize);
    let mut plan: Vec<(BufferPtr, bool)> = Vec::with_capacity(buffers.len());
    for (b, write) in buffers {
        match plan.last_mut() {
            Some((last, w)) if Arc::ptr_eq(last, &b) => *w |= write,
            _ => plan.push((b, write)),
        }
    }
    plan.into()
}

/// Locks the buffers of a plan made by [`plan_locks`] (no sorting on the way).
pub(crate) fn lock_planned(plan: &[(BufferPtr, bool)]) -> Access<'_> {
    lock_sorted(plan.iter().map(|(b, w)| (&**b, *w)))
}

/// Locks buffers given in address order; consecutive entries for one buffer lock it once.
fn lock_sorted<'a>(sorted: impl Iterator<Item = (&'a DeviceBuffer, bool)>) -> Access<'a> {
    let mut sorted = sorted.peekable();
    let mut access = Access {
        _inline: Default::default(),
        _more: vec![],
    };
    let mut held = 0;
    while let Some((b, mut write)) = sorted.next() {
        while let Some(&(next, w)) = sorted.peek() {
            if !std::ptr::eq(next, b) {
                break;
            }
            write |= w;
            sorted.next();
        }
        let guard = if write {
            Guard::Write(b.write_lock())
        } else {
            Guard::Read(b.read_lock())
        };
        match access._inline.get_mut(held) {
            Some(slot) => *slot = Some(guard),
            None => access._more.push(guard),
        }
        held += 1;
    }
    access
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: raw was allocated with exactly this layout in DeviceBuffer::new and is freed once.
        unsafe { dealloc(self.raw.as_ptr(), self.layout) }
    }
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceBuffer({} bytes)", self.size)
    }
}

/// Buffers at least this large ask for transparent huge pages (see [`advise_huge_pages`]).
const HUGE_PAGE_MIN_BYTES: usize = 4 << 20;

/// The size of a transparent huge page on x86-64 and most other Linux targets.
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Asks the kernel to back the whole 2 MiB pages inside a large new allocation with huge pages
/// (`madvise(MADV_HUGEPAGE)`, as numpy does for its large arrays): a stream over a large
/// tensor then misses the TLB once per 2 MiB instead of once per 4 KiB. A hint only: where
/// the kernel declines (huge pages off, or not Linux), nothing changes.
fn advise_huge_pages(start: *mut u8, len: usize) {
    if len < HUGE_PAGE_MIN_BYTES {
        return;
    }
    let begin = start.align_offset(HUGE_PAGE_BYTES);
    let Some(inner) = len.checked_sub(begin) else {
        return;
    };
    let inner = inner - inner % HUGE_PAGE_BYTES;
    if inner == 0 {
        return;
    }
    #[cfg(target_os = "linux")]
    // SAFETY: [start + begin, start + begin + inner) lies inside the allocation of `len`
    // bytes at `start`, which this process owns; MADV_HUGEPAGE changes no byte of it.
    unsafe {
        libc::madvise(start.add(begin).cast(), inner, libc::MADV_HUGEPAGE);
    }
}
