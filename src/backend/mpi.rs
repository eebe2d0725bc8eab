//! The MPI backend (cargo feature `mpi`): data-parallel runs across processes and machines,
//! SPMD over the system MPI through the `mpi` crate (rsmpi).
//!
//! # The model
//!
//! Every rank (process of `MPI_COMM_WORLD`) runs the same program and makes the same calls
//! on the backend in the same order. The physical devices are the ranks
//! ([`Backend::num_physical_devices`] is the world size; physical device `r` is rank `r`),
//! and each rank holds the same number `L` of virtual devices, so that the virtual device
//! with *ordinal* `o = r·L + i` is local device `i` of rank `r` ([`Backend::placement`]
//! spreads `N` devices that way: rank `o / (N / R)`). Every rank creates every device, every
//! context and every link (so the calls stay in lockstep), but a device's work runs only on
//! the rank that owns it: on the other ranks the device is a stand-in that drops the tasks
//! scheduled on it ([`Device::is_remote`]). Buffers of stand-in contexts are allocated
//! zero-filled and never touched, so they cost address space, not memory. A rank's local
//! devices share one worker thread and queue, as the virtual devices of one physical device
//! do on every backend.
//!
//! # Communication
//!
//! Every MPI call after initialization is made by one communication thread per rank (a
//! device worker named `mpi:R:comm`), in the order the calls were made on the backend. Why
//! one thread rather than MPI calls from the device workers: collectives on one
//! communicator must be called in the same order on every rank and never concurrently from
//! two threads of a rank; one FIFO thread gives that order for free, and with it point to
//! point transfers are deadlock-free too (every MPI operation waits only for work that was
//! scheduled before it, on every rank, and its partner sits at the same position in the
//! other rank's queue). It needs `MPI_THREAD_SERIALIZED`; the backend asks for
//! `MPI_THREAD_MULTIPLE` and fails with [`Error::Mpi`] if the library gives less than
//! serialized. The price is that transfers with different peers do not overlap each other.
//!
//! - [`Backend::device_to_device`] between devices of different ranks: the source's owner
//!   sends the buffer after the work scheduled so far on the source device (and the source
//!   device's later work waits for the send to finish, so it cannot overwrite the buffer
//!   meanwhile); the destination's owner receives after the work scheduled so far on the
//!   destination device, and the destination's later work waits for the receive. Messages
//!   are matched by a tag from a per-backend counter, the same on every rank because the
//!   calls are in lockstep. `No` receives into the destination context's buffer;
//!   `Streaming` and `Copy` both receive into the destination device's merge buffer storage
//!   (there is no shared memory to stream from). Transfers within a rank take the in-process
//!   path. [`Backend::prepare_transfer`] works within a rank only (a prepared transfer runs
//!   inside a task of one device, and a cross-rank transfer needs work on two ranks).
//! - [`Backend::all_reduce`]: each rank sums its local contexts' buffers, then
//!   `MPI_Allreduce` with `MPI_SUM` sums across all ranks (every rank takes part, a rank
//!   without local contexts with zeros), and the result is written into every local context.
//!   Singles, doubles and bytes are reduced as `MPI_FLOAT`, `MPI_DOUBLE` and `MPI_UINT8_T`;
//!   halves are widened to `MPI_FLOAT` and rounded back once.
//!
//! # Faults
//!
//! - At every [`Backend::compile_batch`] (and [`Backend::compile`]), the ranks all-gather
//!   the BLAKE3 hash of the generated C and fail with [`Error::RankMismatch`] naming the
//!   ranks that differ from rank 0 ([`MpiBackend::check_same`] compares anything else, e.g.
//!   a program file).
//! - A panic outside a device task (whose panics become errors) prints `rank R: ...` and
//!   calls `MPI_Abort`, which makes `mpirun` stop every rank.
//! - A program that gets an error should call [`Backend::abort_job`] (the CLI and the moons
//!   example do, after printing `rank R: error: ...`); dropping the backend after a failure
//!   it saw also aborts instead of finalizing, since `MPI_Finalize` would wait for ranks
//!   that wait for this one.
//! - A rank that dies: OpenMPI's `mpirun` (and MPICH's hydra) stops the job and names it.
//! - Ranks whose calls get out of step wait for each other in MPI: a watchdog thread aborts
//!   the job when one MPI operation has waited longer than `ARRAYJIT_MPI_TIMEOUT` seconds
//!   ([`DEFAULT_TIMEOUT_SECS`] by default; 0: no limit), naming the operation.

use super::buffer::{lock_all, BufferPtr, DeviceBuffer};
use super::cc::{CcBackend, Code, CodeBatch, Config, Occupancy, Task};
use super::context::Context;
use super::device::{Device, PhysicalDevice};
use super::devices::{transfer_buffers, Backend, DeviceCore, MergeBufferUse, Transfer};
use super::reduce::{self, Acc};
use crate::error::{Error, Result};
use crate::ir::{Assignments, Bindings, Prec, Tnode};
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use mpi::environment::Universe;
use mpi::point_to_point::{Destination, Source};
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::Threading;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The largest number of elements (or bytes, for transfers) in one MPI call: MPI counts are
/// C `int`s, so larger tensors go in chunks of this size.
const CHUNK: usize = 1 << 28;

/// The tag space used for transfers (MPI guarantees tags up to at least 32767).
const TAGS: u64 = 32767;

/// The SPMD backend over MPI: physical devices are ranks; see the [module
/// documentation](self) for ordinals, what runs where, transfers, all-reduce and faults.
///
/// One per process: MPI is initialized by [`MpiBackend::new`] and finalized when the backend
/// is dropped (it cannot be initialized again afterwards).
pub struct MpiBackend {
    core: DeviceCore,
    rank: usize,
    size: usize,
    threading: Threading,
    /// The communication thread: every MPI call after initialization runs on it, in order.
    comm: Device,
    /// The next transfer tag (a call counter, the same on every rank).
    tags: AtomicU64,
    /// Reused receive buffers of the all-reduce (on the communication thread only).
    scratch: Arc<Mutex<Scratch>>,
    /// A failure was returned to the caller (then dropping aborts instead of finalizing).
    failed: AtomicBool,
    /// The MPI operation the communication thread is in, and since when (for the watchdog).
    busy: Busy,
    /// Ends the watchdog thread.
    stop: Arc<AtomicBool>,
    universe: Mutex<Option<Universe>>,
}

/// What the communication thread is waiting for in MPI, and since when.
type Busy = Arc<Mutex<Option<(String, Instant)>>>;

/// The default of `ARRAYJIT_MPI_TIMEOUT`, in seconds.
pub const DEFAULT_TIMEOUT_SECS: u64 = 600;

/// `ARRAYJIT_MPI_TIMEOUT`: how long one MPI operation may wait for the other ranks before the
/// job is aborted (0: no limit).
fn timeout_from_env() -> Result<Option<Duration>> {
    let var = "ARRAYJIT_MPI_TIMEOUT";
    let Some(v) = std::env::var_os(var) else {
        return Ok(Some(Duration::from_secs(DEFAULT_TIMEOUT_SECS)));
    };
    let text = v.to_string_lossy();
    match text.trim().parse::<u64>() {
        Ok(0) => Ok(None),
        Ok(s) => Ok(Some(Duration::from_secs(s))),
        Err(_) => Err(Error::Config {
            var: var.into(),
            value: text.into_owned(),
            expected: "a whole number of seconds (0: no limit)".into(),
        }),
    }
}

/// Watches the communication thread: when one MPI operation has waited longer than `limit`
/// (a rank that does not make the same calls, or one that is stuck), prints what it waits
/// for and aborts the job, so that a mismatch ends the job instead of hanging it.
fn start_watchdog(rank: usize, limit: Duration, busy: Busy, stop: Arc<AtomicBool>) -> Result<()> {
    std::thread::Builder::new()
        .name(format!("mpi:{rank}:watchdog"))
        .spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(200));
                let overdue = busy
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_ref()
                    .filter(|(_, since)| since.elapsed() > limit)
                    .map(|(what, _)| what.clone());
                if let Some(what) = overdue {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let line = format!(
                        "rank {rank}: error: MPI operation \"{what}\" has waited more than {} s \
                         for the other ranks (ARRAYJIT_MPI_TIMEOUT): a rank does not make the \
                         same calls in the same order, or is stuck; aborting the MPI job\n",
                        limit.as_secs()
                    );
                    eprint!("{line}");
                    SimpleCommunicator::world().abort(1);
                }
            }
        })
        .map(|_| ())
        .map_err(|e| Error::io("starting the MPI watchdog thread", e))
}

/// Receive buffers of the all-reduce, grown as needed and kept (a fresh buffer of a few MiB
/// costs page faults on every call).
#[derive(Default)]
struct Scratch {
    u8s: Vec<u8>,
    u64s: Vec<u64>,
    f32s: Vec<f32>,
    f64s: Vec<f64>,
}

/// The rank of this process if MPI is up, else what the launcher says, else 0 (for error
/// messages before or after MPI).
fn best_rank() -> usize {
    if mpi::environment::is_initialized() && !mpi::environment::is_finalized() {
        return SimpleCommunicator::world().rank() as usize;
    }
    ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
        .unwrap_or(0)
}

/// Installs (once) a panic hook that, after the usual message, aborts the MPI job from any
/// thread but a device worker (whose task panics are caught and reported as errors).
fn install_panic_hook(rank: usize) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            let thread = std::thread::current();
            if thread.name().is_some_and(|n| n.starts_with("mpi:")) {
                return;
            }
            // One write, so that the lines of ranks failing at once do not interleave.
            let line = format!("rank {rank}: panicked (above); aborting the MPI job\n");
            eprint!("{line}");
            if mpi::environment::is_initialized() && !mpi::environment::is_finalized() {
                SimpleCommunicator::world().abort(101);
            }
        }));
    });
}

/// A buffer's first `len` bytes.
///
/// # Safety
///
/// Nothing may write the buffer while the slice lives.
unsafe fn bytes(buf: &BufferPtr, len: usize) -> &[u8] {
    assert!(len <= buf.size());
    // SAFETY: in bounds (asserted); no writer meanwhile (the caller's contract).
    unsafe { std::slice::from_raw_parts(buf.as_ptr(), len) }
}

/// A buffer's first `len` bytes, writable.
///
/// # Safety
///
/// Nothing else may read or write the buffer while the slice lives.
#[allow(clippy::mut_from_ref)] // the buffer's bytes are not Rust-borrowed anywhere else
unsafe fn bytes_mut(buf: &BufferPtr, len: usize) -> &mut [u8] {
    assert!(len <= buf.size());
    // SAFETY: in bounds (asserted); exclusive access (the caller's contract).
    unsafe { std::slice::from_raw_parts_mut(buf.as_ptr(), len) }
}

/// A buffer's first `n` elements of `T`.
///
/// # Safety
///
/// As [`bytes`]; `T` is a plain number type.
unsafe fn elems<T>(buf: &BufferPtr, n: usize) -> &[T] {
    assert!(n * std::mem::size_of::<T>() <= buf.size());
    assert!(buf.as_ptr().cast::<T>().is_aligned());
    // SAFETY: in bounds and aligned (asserted); no writer meanwhile (the caller's contract).
    unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<T>(), n) }
}

/// `MPI_Allreduce` (sum) of `send` into `recv`, in chunks of at most [`CHUNK`] elements.
fn all_reduce_chunks<T: mpi::datatype::Equivalence>(
    world: &SimpleCommunicator,
    send: &[T],
    recv: &mut [T],
) {
    for (s, r) in send.chunks(CHUNK).zip(recv.chunks_mut(CHUNK)) {
        world.all_reduce_into(s, r, SystemOperation::sum());
    }
}

/// `MPI_IN_PLACE` of the MPI library in use, when it is one whose value is known: the `mpi`
/// crate does not export it, and it is a macro (`(void *) 1` in Open MPI, `(void *) -1` in
/// MPICH and the libraries derived from it, whose version strings say MPICH). `None` for any
/// other library: then the all-reduce receives into a scratch buffer and copies back.
fn in_place() -> Option<usize> {
    static SENTINEL: OnceLock<Option<usize>> = OnceLock::new();
    *SENTINEL.get_or_init(|| {
        let v = mpi::environment::library_version().unwrap_or_default();
        if v.starts_with("Open MPI") {
            Some(1)
        } else if v.contains("MPICH") {
            Some(usize::MAX)
        } else {
            None
        }
    })
}

/// `MPI_Allreduce` (sum) in place over `data`, in chunks of at most [`CHUNK`] elements.
///
/// # Safety
///
/// `sentinel` is the library's `MPI_IN_PLACE` ([`in_place`]).
unsafe fn all_reduce_in_place<T: mpi::datatype::Equivalence>(
    world: &SimpleCommunicator,
    data: &mut [T],
    sentinel: usize,
) -> Result<()> {
    use mpi::raw::AsRaw;
    for chunk in data.chunks_mut(CHUNK) {
        // SAFETY: `sentinel` is MPI_IN_PLACE (the caller's contract), so MPI reads and writes
        // only `chunk`, which holds `chunk.len()` (at most CHUNK, within a C int) elements of
        // the datatype equivalent to `T`; the communicator, datatype and operation are live
        // handles.
        let status = unsafe {
            mpi::ffi::MPI_Allreduce(
                sentinel as *const std::ffi::c_void,
                chunk.as_mut_ptr().cast(),
                chunk.len() as i32,
                T::equivalent_datatype().as_raw(),
                SystemOperation::sum().as_raw(),
                world.as_raw(),
            )
        };
        if status != 0 {
            return Err(Error::Mpi {
                rank: world.rank() as usize,
                msg: format!("MPI_Allreduce failed with error code {status}"),
            });
        }
    }
    Ok(())
}

/// A buffer's first `n` elements of `T`, writable.
///
/// # Safety
///
/// As [`bytes_mut`]; `T` is a plain number type.
#[allow(clippy::mut_from_ref)] // the buffer's bytes are not Rust-borrowed anywhere else
unsafe fn elems_mut<T>(buf: &BufferPtr, n: usize) -> &mut [T] {
    assert!(n * std::mem::size_of::<T>() <= buf.size());
    assert!(buf.as_ptr().cast::<T>().is_aligned());
    // SAFETY: in bounds and aligned (asserted); exclusive access (the caller's contract).
    unsafe { std::slice::from_raw_parts_mut(buf.as_ptr().cast::<T>(), n) }
}

/// Copies `src` into the buffer's first elements.
///
/// # Safety
///
/// Nothing else may read or write `buf` meanwhile; `T` is a plain number type of the
/// buffer's precision.
unsafe fn store_slice<T: Copy>(src: &[T], buf: &BufferPtr) {
    // SAFETY: exclusive access (the caller's contract).
    unsafe { elems_mut::<T>(buf, src.len()) }.copy_from_slice(src);
}

/// Grows `v` to at least `n` elements (fallibly) and returns its first `n`.
fn grown<'a, T: Clone + Default>(v: &'a mut Vec<T>, n: usize, what: &str) -> Result<&'a mut [T]> {
    if v.len() < n {
        v.try_reserve_exact(n - v.len())
            .map_err(|_| Error::OutOfMemory {
                what: what.to_string(),
                bytes: n.saturating_mul(std::mem::size_of::<T>()),
            })?;
        v.resize(n, T::default());
    }
    Ok(&mut v[..n])
}

impl MpiBackend {
    /// Initializes MPI (asking for `MPI_THREAD_MULTIPLE`) and creates the backend, with the
    /// default compiler backend. Installs a panic hook that aborts the MPI job when a thread
    /// other than a device worker panics (see the [module documentation](self)).
    ///
    /// # Errors
    ///
    /// [`Error::Mpi`] when MPI was already initialized in this process (there is one
    /// `MpiBackend` per process), or when the MPI library's thread support is below
    /// `MPI_THREAD_SERIALIZED`.
    pub fn new() -> Result<MpiBackend> {
        MpiBackend::with_cc(CcBackend::new())
    }

    /// As [`MpiBackend::new`], compiling with a configured compiler backend.
    pub fn with_cc(cc: CcBackend) -> Result<MpiBackend> {
        let Some((universe, threading)) = mpi::initialize_with_threading(Threading::Multiple)
        else {
            return Err(Error::Mpi {
                rank: best_rank(),
                msg: "MPI is already initialized (or was finalized) in this process: there \
                      can be one MpiBackend per process"
                    .into(),
            });
        };
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        if threading < Threading::Serialized {
            return Err(Error::Mpi {
                rank,
                msg: format!(
                    "the MPI library provides thread support {threading:?}; the MPI backend \
                     needs at least Serialized (MPI_THREAD_SERIALIZED: it makes its MPI calls \
                     from a communication thread); use an MPI built with thread support"
                ),
            });
        }
        install_panic_hook(rank);
        let timeout = timeout_from_env().map_err(|e| Error::Mpi {
            rank,
            msg: e.to_string(),
        })?;
        let busy: Busy = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        if let Some(limit) = timeout {
            start_watchdog(rank, limit, busy.clone(), stop.clone())?;
        }
        let comm = Device::named_worker(
            PhysicalDevice {
                backend: "mpi",
                ordinal: rank,
            },
            usize::MAX,
            format!("mpi:{rank}:comm"),
        )?;
        Ok(MpiBackend {
            core: DeviceCore::with_cc(cc),
            rank,
            size,
            threading,
            comm,
            tags: AtomicU64::new(0),
            scratch: Arc::default(),
            failed: AtomicBool::new(false),
            busy,
            stop,
            universe: Mutex::new(Some(universe)),
        })
    }

    /// The thread support the MPI library provides (at least `Serialized`).
    pub fn threading(&self) -> Threading {
        self.threading
    }

    /// A task of the communication thread making MPI calls: the watchdog sees it while it
    /// runs.
    fn mpi_task(&self, what: String, work: impl FnOnce() -> Result<()> + Send + 'static) -> Task {
        let busy = self.busy.clone();
        Task::new(what.clone(), move || {
            *busy.lock().unwrap_or_else(|p| p.into_inner()) = Some((what, Instant::now()));
            let r = work();
            *busy.lock().unwrap_or_else(|p| p.into_inner()) = None;
            r
        })
    }

    /// The rank owning a device.
    fn owner(device: &Device) -> usize {
        device.physical().ordinal()
    }

    /// Remembers a failure returned to the caller (see `Drop`).
    fn note<T>(&self, r: Result<T>) -> Result<T> {
        if r.is_err() {
            self.failed.store(true, Ordering::SeqCst);
        }
        r
    }

    /// Checks that every rank passes the same `bytes` (by an all-gather of their BLAKE3
    /// hashes): every rank must call it, in the same order relative to its other calls.
    ///
    /// # Errors
    ///
    /// [`Error::RankMismatch`] naming `what` and the ranks whose bytes differ from rank 0's
    /// (the same error on every rank).
    pub fn check_same(&self, what: &str, bytes: &[u8]) -> Result<()> {
        let r = self.check_same_inner(what, bytes);
        self.note(r)
    }

    fn check_same_inner(&self, what: &str, bytes: &[u8]) -> Result<()> {
        let mine = *blake3::hash(bytes).as_bytes();
        let size = self.size;
        let out: Arc<Mutex<Vec<u8>>> = Arc::default();
        let out2 = out.clone();
        self.comm.schedule(self.mpi_task(
            format!("all-gather the hashes of {what}"),
            move || {
                let world = SimpleCommunicator::world();
                let mut all = vec![0u8; 32 * size];
                world.all_gather_into(&mine[..], &mut all[..]);
                *out2.lock().unwrap_or_else(|p| p.into_inner()) = all;
                Ok(())
            },
        ))?;
        self.comm.await_idle()?;
        let all = std::mem::take(&mut *out.lock().unwrap_or_else(|p| p.into_inner()));
        let hashes: Vec<&[u8]> = all.chunks(32).collect();
        if hashes.len() != size {
            return Err(Error::Mpi {
                rank: self.rank,
                msg: format!("the all-gather of the hashes of {what} returned nothing"),
            });
        }
        let differ: Vec<usize> = (1..size).filter(|&r| hashes[r] != hashes[0]).collect();
        if differ.is_empty() {
            return Ok(());
        }
        let hex = |h: &[u8]| {
            h[..6]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        let list: Vec<String> = differ
            .iter()
            .map(|&r| format!("rank {r} ({}…)", hex(hashes[r])))
            .collect();
        Err(Error::RankMismatch {
            what: what.to_string(),
            detail: format!(
                "{} differ{} from rank 0 ({}…); every rank must run the same program with the \
                 same compiler settings",
                list.join(", "),
                if differ.len() == 1 { "s" } else { "" },
                hex(hashes[0])
            ),
        })
    }

    /// A transfer between devices of different ranks (see the module documentation).
    fn cross_rank_transfer(
        &self,
        tn: &Tnode,
        mode: MergeBufferUse,
        dst: &Context,
        src: &Context,
        (dst_dev, src_dev): (&Device, &Device),
    ) -> Result<bool> {
        let Some((src_buf, dst_buf)) = transfer_buffers(tn, mode, dst, src)? else {
            return Ok(false);
        };
        let tag = (self.tags.fetch_add(1, Ordering::SeqCst) % TAGS) as i32;
        let (src_rank, dst_rank) = (Self::owner(src_dev), Self::owner(dst_dev));
        let size = tn.size_in_bytes();
        let what = format!(
            "device_to_device {} {mode:?} {} (rank {src_rank}) -> {} (rank {dst_rank})",
            tn.name(),
            src_dev.name(),
            dst_dev.name()
        );
        if !src_dev.is_remote() {
            self.comm.wait_for(&src_dev.event())?;
            let buf = src_buf.clone();
            self.comm
                .schedule(self.mpi_task(format!("{what}: send"), move || {
                    let world = SimpleCommunicator::world();
                    let _access = lock_all(&mut [(&*buf, false)]);
                    // SAFETY: the buffer's lock is held (shared); and the source device is past
                    // the work that wrote it (the wait above) and its later work waits for
                    // this send.
                    let data = unsafe { bytes(&buf, size) };
                    for chunk in data.chunks(CHUNK) {
                        world
                            .process_at_rank(dst_rank as i32)
                            .send_with_tag(chunk, tag);
                    }
                    Ok(())
                }))?;
            src_dev.wait_for(&self.comm.event())?;
        }
        if !dst_dev.is_remote() {
            self.comm.wait_for(&dst_dev.event())?;
            let device = dst_dev.clone();
            let node = tn.clone();
            self.comm
                .schedule(self.mpi_task(format!("{what}: receive"), move || {
                    let world = SimpleCommunicator::world();
                    let target = match &dst_buf {
                        Some(b) => b.clone(),
                        None => device.merge_storage(size)?,
                    };
                    {
                        let _access = lock_all(&mut [(&*target, true)]);
                        target.mark_written();
                        // SAFETY: the buffer's lock is held exclusively; and the destination
                        // device is past its earlier work (the wait above) and its later work
                        // waits for this receive.
                        let data = unsafe { bytes_mut(&target, size) };
                        for chunk in data.chunks_mut(CHUNK) {
                            world
                                .process_at_rank(src_rank as i32)
                                .receive_into_with_tag(chunk, tag);
                        }
                    }
                    if dst_buf.is_none() {
                        device.merge_buffer().set(target, node);
                    }
                    Ok(())
                }))?;
            dst_dev.wait_for(&self.comm.event())?;
        }
        Ok(true)
    }

    fn all_reduce_inner(&self, tns: &[Tnode], ctxs: &[Context]) -> Result<()> {
        let mut jobs = vec![];
        let mut local: Vec<Device> = vec![];
        for tn in tns {
            let parts = reduce::participants(tn, ctxs)?;
            let (devs, bufs): (Vec<Device>, Vec<BufferPtr>) =
                parts.into_iter().filter(|(d, _)| !d.is_remote()).unzip();
            local = devs;
            jobs.push((tn.prec(), reduce::elements(tn), tn.name(), bufs));
        }
        if jobs.is_empty() {
            return Ok(());
        }
        for d in &local {
            self.comm.wait_for(&d.event())?;
        }
        let names: Vec<&str> = jobs.iter().map(|j| j.2.as_str()).collect();
        let what = format!("all_reduce {} across {} ranks", names.join(", "), self.size);
        let scratch = self.scratch.clone();
        let failure: Arc<OnceLock<String>> = Arc::default();
        let failed = failure.clone();
        self.comm.schedule(self.mpi_task(what.clone(), move || {
            let r = if jobs.len() == 1 {
                let (prec, n, name, bufs) = &jobs[0];
                reduce_here(*prec, *n, name, bufs, &scratch)
            } else {
                reduce_fused(&jobs)
            };
            if let Err(e) = &r {
                let _ = failed.set(e.to_string());
            }
            r
        }))?;
        let done = self.comm.event();
        for d in &local {
            let (done, failure, what) = (done.clone(), failure.clone(), what.clone());
            let rank = self.rank;
            d.schedule(Task::new(format!("wait for {what}"), move || {
                done.wait();
                match failure.get() {
                    Some(msg) => Err(Error::Mpi {
                        rank,
                        msg: format!("{what}: {msg}"),
                    }),
                    None => Ok(()),
                }
            }))?;
        }
        Ok(())
    }
}

/// The communication thread's part of an all-reduce of several tensors (the gradients of a
/// model): the tensors whose sums have the same type are packed into one vector (each
/// rank's local sum of each), reduced with one `MPI_Allreduce`, and unpacked into every local
/// buffer. One collective instead of one per tensor: its latency, not the bytes, is what a
/// step of a small model pays for.
fn reduce_fused(jobs: &[(Prec, usize, String, Vec<BufferPtr>)]) -> Result<()> {
    let world = SimpleCommunicator::world();
    // Bytes, then the wider integers (summed in u64), then singles and the narrow floats
    // (summed in f32), then doubles.
    for kind in [Prec::Byte, Prec::Uint64, Prec::Single, Prec::Double] {
        let group: Vec<&(Prec, usize, String, Vec<BufferPtr>)> =
            jobs.iter().filter(|j| Acc::kind(j.0) == kind).collect();
        if group.is_empty() {
            continue;
        }
        // Every local buffer of the group, locked exclusively (each is read, then written).
        let mut locks: Vec<(&DeviceBuffer, bool)> = group
            .iter()
            .flat_map(|j| j.3.iter().map(|b| (&**b, true)))
            .collect();
        let _access = lock_all(&mut locks);
        for b in group.iter().flat_map(|j| &j.3) {
            b.mark_written();
        }
        let total: usize = group.iter().map(|j| j.1).sum();
        let names: Vec<&str> = group.iter().map(|j| j.2.as_str()).collect();
        let mut packed = Acc::zeros(
            kind,
            total,
            &format!("the all_reduce of {}", names.join(", ")),
        )?;
        let mut at = 0;
        for (prec, n, _, bufs) in &group {
            for b in bufs {
                // SAFETY: the local devices are past the work scheduled before the all-reduce
                // (the comm thread waited for their events) and their later work waits for
                // this task.
                unsafe { packed.add_at(*prec, b, at, *n) };
            }
            at += n;
        }
        // SAFETY (both): `in_place` is the library's MPI_IN_PLACE.
        match (&mut packed, in_place()) {
            (Acc::U8(v), Some(s)) => unsafe { all_reduce_in_place(&world, v, s) }?,
            (Acc::U64(v), Some(s)) => unsafe { all_reduce_in_place(&world, v, s) }?,
            (Acc::F32(v), Some(s)) => unsafe { all_reduce_in_place(&world, v, s) }?,
            (Acc::F64(v), Some(s)) => unsafe { all_reduce_in_place(&world, v, s) }?,
            (Acc::U8(v), None) => {
                let mut r = vec![0u8; total];
                all_reduce_chunks(&world, v, &mut r);
                *v = r;
            }
            (Acc::U64(v), None) => {
                let mut r = vec![0u64; total];
                all_reduce_chunks(&world, v, &mut r);
                *v = r;
            }
            (Acc::F32(v), None) => {
                let mut r = vec![0f32; total];
                all_reduce_chunks(&world, v, &mut r);
                *v = r;
            }
            (Acc::F64(v), None) => {
                let mut r = vec![0f64; total];
                all_reduce_chunks(&world, v, &mut r);
                *v = r;
            }
        }
        let mut at = 0;
        for (prec, n, _, bufs) in &group {
            for b in bufs {
                // SAFETY: as above; this thread has the buffers to itself.
                unsafe { packed.store_at(*prec, b, at, *n) };
            }
            at += n;
        }
    }
    Ok(())
}

/// The communication thread's part of an all-reduce: the local sum, `MPI_Allreduce`, the
/// result written into every local buffer.
fn reduce_here(
    prec: Prec,
    n: usize,
    name: &str,
    bufs: &[BufferPtr],
    scratch: &Mutex<Scratch>,
) -> Result<()> {
    let world = SimpleCommunicator::world();
    let mut s = scratch.lock().unwrap_or_else(|p| p.into_inner());
    let what = format!("the all_reduce of {name}");
    // Every local buffer, locked exclusively (each is read, then written).
    let mut locks: Vec<(&DeviceBuffer, bool)> = bufs.iter().map(|b| (&**b, true)).collect();
    let _access = lock_all(&mut locks);
    for b in bufs {
        b.mark_written();
    }
    // One local buffer of a type MPI sums (byte, single, double): reduce in place in it
    // (MPI_IN_PLACE, when the library's value of it is known), or send straight from it into
    // a scratch buffer and copy the result back.
    let native = matches!(prec, Prec::Byte | Prec::Single | Prec::Double);
    if let ([buf], true) = (bufs, native) {
        // SAFETY: the device is past the work scheduled before the all-reduce (the comm
        // thread waited for its event) and its later work waits for this task, so this
        // thread has the buffer to itself.
        unsafe {
            if let Some(sentinel) = in_place() {
                return match prec {
                    Prec::Byte => all_reduce_in_place(&world, elems_mut::<u8>(buf, n), sentinel),
                    Prec::Single => all_reduce_in_place(&world, elems_mut::<f32>(buf, n), sentinel),
                    // double: no other precision gets here
                    _ => all_reduce_in_place(&world, elems_mut::<f64>(buf, n), sentinel),
                };
            }
            match prec {
                Prec::Byte => {
                    let recv = grown(&mut s.u8s, n, &what)?;
                    all_reduce_chunks(&world, elems::<u8>(buf, n), recv);
                    store_slice(recv, buf);
                }
                Prec::Single => {
                    let recv = grown(&mut s.f32s, n, &what)?;
                    all_reduce_chunks(&world, elems::<f32>(buf, n), recv);
                    store_slice(recv, buf);
                }
                _ => {
                    let recv = grown(&mut s.f64s, n, &what)?;
                    all_reduce_chunks(&world, elems::<f64>(buf, n), recv);
                    store_slice(recv, buf);
                }
            }
        }
        return Ok(());
    }
    // Otherwise sum the local buffers first (none: zeros).
    let mut acc = Acc::zeros(prec, n, &what)?;
    for b in bufs {
        // SAFETY: as above, for every local device taking part.
        unsafe { acc.add(prec, b) };
    }
    let result = match &acc {
        Acc::U8(a) => {
            let recv = grown(&mut s.u8s, n, &what)?;
            all_reduce_chunks(&world, a, recv);
            Acc::U8(recv.to_vec())
        }
        Acc::U64(a) => {
            let recv = grown(&mut s.u64s, n, &what)?;
            all_reduce_chunks(&world, a, recv);
            Acc::U64(recv.to_vec())
        }
        Acc::F32(a) => {
            let recv = grown(&mut s.f32s, n, &what)?;
            all_reduce_chunks(&world, a, recv);
            Acc::F32(recv.to_vec())
        }
        Acc::F64(a) => {
            let recv = grown(&mut s.f64s, n, &what)?;
            all_reduce_chunks(&world, a, recv);
            Acc::F64(recv.to_vec())
        }
    };
    for b in bufs {
        // SAFETY: as above.
        unsafe { result.store(prec, b) };
    }
    Ok(())
}

impl Backend for MpiBackend {
    fn name(&self) -> &'static str {
        "mpi"
    }
    fn core(&self) -> &DeviceCore {
        &self.core
    }
    /// The world size: one physical device per rank.
    fn num_physical_devices(&self) -> usize {
        self.size
    }
    /// `ForParallelCopying`: 2 per rank (so copies overlap with computation); otherwise 1.
    fn suggested_num_virtual_devices(&self, _device: &PhysicalDevice) -> usize {
        match self.core.cc().config() {
            Config::ForParallelCopying => 2,
            Config::PhysicalDevicesOnly | Config::MostParallelDevices => 1,
        }
    }
    /// A device with a worker thread on its own rank; a stand-in that drops its tasks on
    /// every other rank. The worker runs its routines' parallel regions alone, or, with
    /// threads set on the compiler backend ([`CcBackend::with_threads`]), with helper threads
    /// (unpinned): several ranks may share a machine, so a rank does not take every core.
    fn spawn_device(&self, physical: &PhysicalDevice, subordinal: usize) -> Result<Device> {
        if physical.ordinal() == self.rank {
            let team = self
                .core
                .cc()
                .threads()
                .filter(|&t| t > 1)
                .map(|t| super::team::Team::new(&format!("mpi:{}", self.rank), t));
            Device::with_worker(physical.clone(), subordinal, None, team)
        } else {
            Ok(Device::remote(physical.clone(), subordinal))
        }
    }
    fn num_ranks(&self) -> usize {
        self.size
    }
    fn rank(&self) -> usize {
        self.rank
    }
    /// Rank `⌊index · R / total⌋`: consecutive blocks of devices per rank, as even as they can
    /// be (`total / R` each when `R` divides `total`; some ranks hold none when `total < R`).
    fn placement(&self, index: usize, total: usize) -> usize {
        (index * self.size / total.max(1)).min(self.size - 1)
    }
    fn check_ranks_agree(&self, what: &str, bytes: &[u8]) -> Result<()> {
        self.check_same(what, bytes)
    }
    fn abort_job(&self, code: i32) {
        self.failed.store(true, Ordering::SeqCst);
        SimpleCommunicator::world().abort(code)
    }
    fn await_device(&self, device: &Device) -> Result<()> {
        let r = device.await_idle();
        self.note(r)
    }
    fn schedule(&self, device: &Device, task: Task) -> Result<()> {
        let r = device.schedule(task);
        self.note(r)
    }
    fn compile(
        &self,
        shared: bool,
        name: Option<&str>,
        bindings: &Bindings,
        asgns: &Assignments,
    ) -> Result<Code> {
        let r = self.core.cc().compile(shared, name, bindings, asgns);
        // Every rank takes part in the comparison, even one whose compile failed (an empty
        // source stands for the failure), so that no rank waits for it.
        let source = r
            .as_ref()
            .map(|c| c.source().to_string())
            .unwrap_or_default();
        let checked = self.check_same(
            "the compiled routine (hash of its C source)",
            source.as_bytes(),
        );
        let code = self.note(r)?;
        checked?;
        Ok(code)
    }
    fn compile_batch(
        &self,
        shared: bool,
        names: Option<&[String]>,
        occupancy: Option<Occupancy<'_>>,
        bindings: &Bindings,
        asgns: &[Assignments],
    ) -> Result<CodeBatch> {
        let r = self
            .core
            .cc()
            .compile_batch(shared, names, occupancy, bindings, asgns);
        let source = r
            .as_ref()
            .map(|b| b.source().to_string())
            .unwrap_or_default();
        let checked = self.check_same(
            "the compiled batch (hash of its C source)",
            source.as_bytes(),
        );
        let batch = self.note(r)?;
        checked?;
        Ok(batch)
    }
    fn device_to_device(
        &self,
        tn: &Tnode,
        into_merge_buffer: MergeBufferUse,
        dst: &Context,
        src: &Context,
    ) -> Result<bool> {
        let r = (|| {
            let (Some(d), Some(s)) = (dst.device(), src.device()) else {
                let off = if dst.device().is_none() { dst } else { src };
                return Err(Error::NoDevice {
                    what: "device_to_device: ".into(),
                    context: off.label().to_string(),
                });
            };
            if Self::owner(d) == Self::owner(s) {
                return match self.prepare_transfer(tn, into_merge_buffer, dst, src)? {
                    Some(t) => {
                        t.schedule()?;
                        Ok(true)
                    }
                    None => Ok(false),
                };
            }
            self.cross_rank_transfer(tn, into_merge_buffer, dst, src, (d, s))
        })();
        self.note(r)
    }
    fn prepare_transfer(
        &self,
        tn: &Tnode,
        into_merge_buffer: MergeBufferUse,
        dst: &Context,
        src: &Context,
    ) -> Result<Option<Transfer>> {
        if let (Some(d), Some(s)) = (dst.device(), src.device()) {
            if Self::owner(d) != Self::owner(s) {
                return self.note(Err(Error::Mpi {
                    rank: self.rank,
                    msg: format!(
                        "prepare_transfer of tensor {}: devices {} and {} are on different \
                         ranks; a transfer between ranks needs device_to_device (work on both \
                         ranks)",
                        tn.name(),
                        s.name(),
                        d.name()
                    ),
                }));
            }
        }
        let r = super::devices::prepare_transfer_in_process(tn, into_merge_buffer, dst, src);
        self.note(r)
    }
    fn all_reduce(&self, tns: &[Tnode], ctxs: &[Context]) -> Result<()> {
        let r = self.all_reduce_inner(tns, ctxs);
        self.note(r)
    }
}

impl Drop for MpiBackend {
    fn drop(&mut self) {
        self.unsafe_cleanup();
        self.comm.release();
        self.stop.store(true, Ordering::SeqCst);
        let universe = self
            .universe
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if self.failed.load(Ordering::SeqCst) || std::thread::panicking() {
            // MPI_Finalize would wait for the other ranks, which may wait for this one.
            eprintln!(
                "rank {}: the MPI backend saw a failure; aborting the MPI job",
                self.rank
            );
            SimpleCommunicator::world().abort(1);
        }
        drop(universe);
    }
}
