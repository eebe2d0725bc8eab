//! The user-facing `Backend` layer (the seed's device backends): everything of the no-device
//! backend plus devices, queues and transfers, on two implementations: [`MulticoreBackend`]
//! (a worker thread and FIFO queue per physical device, shared by its virtual devices) and
//! [`SyncBackend`] (everything runs on the caller's thread; for debugging and tests). A third,
//! `MpiBackend` (cargo feature `mpi`, module `backend::mpi`), spreads the devices over MPI
//! ranks.

use super::buffer::{lock_all, BufferPtr, DeviceBuffer};
use super::cc::{CcBackend, Code, CodeBatch, Config, Occupancy, Routine, Task};
use super::context::Context;
use super::device::{Device, Event, PhysicalDevice};
use super::reduce;
use super::team::Team;
use crate::error::{Error, Result};
use crate::ir::{Assignments, Bindings, Ndarray, Tnode};
use std::sync::{Arc, Mutex, MutexGuard};

/// How `device_to_device` uses the destination device's merge buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MergeBufferUse {
    /// Copy into the destination context's own buffer of the node.
    No,
    /// Point the destination's merge buffer at the source's buffer (no copy).
    Streaming,
    /// Copy the source's buffer into the destination device's merge buffer (grown as needed).
    Copy,
}

/// A checked [`Backend::device_to_device`] transfer of one node between two contexts,
/// prepared once by [`Backend::prepare_transfer`] and run any number of times. Cheap to clone.
#[derive(Clone)]
pub struct Transfer(Arc<TransferInner>);

struct TransferInner {
    description: Arc<str>,
    tn: Tnode,
    mode: MergeBufferUse,
    /// The destination's device (whose queue must run the transfer).
    device: Device,
    src_buf: BufferPtr,
    /// The destination's buffer of the node, for `No`.
    dst_buf: Option<BufferPtr>,
}

impl Transfer {
    /// Does the transfer now, on this thread: meant to run inside a task on the destination
    /// device (as [`Transfer::schedule`] does), after the source was synchronized.
    pub fn run(&self) -> Result<()> {
        let t = &self.0;
        let size = t.tn.size_in_bytes();
        match (&t.dst_buf, t.mode) {
            (Some(dst), _) => dst.copy_from(&t.src_buf, size),
            (None, MergeBufferUse::Copy) => {
                let storage = t.device.merge_storage(size)?;
                storage.copy_from(&t.src_buf, size)?;
                t.device.merge_buffer().set(storage, t.tn.clone());
                Ok(())
            }
            (None, _) => {
                t.device.merge_buffer().set_to(&t.src_buf, &t.tn);
                Ok(())
            }
        }
    }

    /// A task doing the transfer.
    ///
    /// The task declares what it accesses, for the device layer's hazard tracking (see
    /// [`Device::schedule`]): it reads the source buffer and writes the destination's; a
    /// streaming merge accesses nothing now, but the destination's merge-reading routines
    /// scheduled after it read the source buffer.
    pub fn task(&self) -> Task {
        let t = self.clone();
        let inner = &self.0;
        let accesses = match (&inner.dst_buf, inner.mode) {
            (Some(dst), _) => vec![(inner.src_buf.clone(), false), (dst.clone(), true)],
            (None, MergeBufferUse::Copy) => {
                inner.device.set_streamed(None);
                vec![(inner.src_buf.clone(), false)]
            }
            (None, _) => {
                inner.device.set_streamed(Some(inner.src_buf.clone()));
                vec![]
            }
        };
        Task::new(inner.description.clone(), move || t.run()).with_accesses(accesses)
    }

    /// Schedules the transfer on the destination's device (returns an earlier failure on the
    /// device instead).
    pub fn schedule(&self) -> Result<()> {
        self.0.device.schedule(self.task())
    }

    /// The destination's device.
    pub fn device(&self) -> &Device {
        &self.0.device
    }

    /// What the transfer does: `device_to_device NODE MODE SRC -> DST`.
    pub fn description(&self) -> &str {
        &self.0.description
    }
}

impl std::fmt::Debug for Transfer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Transfer({})", self.0.description)
    }
}

/// State shared by both device backends: the compiler backend and every device created.
#[derive(Default)]
pub struct DeviceCore {
    cc: CcBackend,
    devices: Mutex<Vec<Device>>,
}

impl DeviceCore {
    /// The shared state around a configured compiler backend.
    pub fn with_cc(cc: CcBackend) -> DeviceCore {
        DeviceCore {
            cc,
            devices: Mutex::default(),
        }
    }

    fn devices(&self) -> MutexGuard<'_, Vec<Device>> {
        self.devices.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// The underlying compiler backend (optimizer settings live there).
    pub fn cc(&self) -> &CcBackend {
        &self.cc
    }
}

/// The context's device, checked to be live (not released by `unsafe_cleanup`).
fn ctx_device(ctx: &Context) -> Result<Device> {
    let d = ctx.device().cloned().ok_or_else(|| Error::NoDevice {
        what: String::new(),
        context: ctx.label().to_string(),
    })?;
    d.check_live()?;
    Ok(d)
}

/// Seals [`Backend`]: the backends of this crate are its only implementations.
pub(crate) mod sealed {
    /// Implemented by this crate's backends only.
    pub trait Sealed {}
    impl Sealed for super::MulticoreBackend {}
    impl Sealed for super::SyncBackend {}
    #[cfg(feature = "mpi")]
    impl Sealed for crate::backend::mpi::MpiBackend {}
}

/// The user-facing backend: compiling, linking and running routines on devices. Names follow
/// the seed API (OCANNL's `Backend`), with `await` spelled [`Backend::await_device`].
///
/// Implementations provide the five required methods; every other operation is shared.
///
/// The trait is sealed: only [`MulticoreBackend`], [`SyncBackend`] and `MpiBackend` (feature
/// `mpi`) implement it. Its shared operations hand buffers to compiled code running on device
/// worker threads, and their soundness rests on invariants of the device layer (one queue per
/// worker, hazard tracking between the queues, contexts that outlive their tasks) that a
/// [`Device`] made outside the crate could not keep; so `spawn_device` has no public
/// implementation to call. Write generic code against `&dyn Backend` (or `impl Backend`)
/// instead, and pick the backend by name with [`super::backend_by_name`].
pub trait Backend: Send + Sync + sealed::Sealed {
    /// The backend's name, e.g. `multicore`.
    fn name(&self) -> &'static str;
    /// The shared state.
    fn core(&self) -> &DeviceCore;
    /// Number of physical devices.
    fn num_physical_devices(&self) -> usize;
    /// The optimal number of virtual devices for the given physical device to follow the
    /// [`Config`] strategy passed to [`Backend::initialize`].
    fn suggested_num_virtual_devices(&self, device: &PhysicalDevice) -> usize;
    /// Creates the device object (a worker thread, or none); used by `new_virtual_device` for
    /// the first virtual device of a physical device (later ones share its worker and queue).
    fn spawn_device(&self, physical: &PhysicalDevice, subordinal: usize) -> Result<Device>;

    /// Initializes the backend before first use or after `unsafe_cleanup`. Does nothing if the
    /// backend is already initialized.
    fn initialize(&self, config: Config) {
        self.core().cc.initialize(config)
    }
    /// Returns false if there was no previous `initialize` call, or the most recent call was
    /// followed by `unsafe_cleanup`; then `initialize` must be called before using the backend.
    fn is_initialized(&self) -> bool {
        self.core().cc.is_initialized()
    }
    /// The physical device with the given ordinal.
    fn get_device(&self, ordinal: usize) -> Result<PhysicalDevice> {
        if !self.is_initialized() {
            return Err(Error::NotInitialized {
                backend: self.name().to_string(),
            });
        }
        let n = self.num_physical_devices();
        if ordinal >= n {
            return Err(Error::NoSuchDevice {
                backend: self.name().to_string(),
                ordinal,
                count: n,
            });
        }
        Ok(PhysicalDevice {
            backend: self.name(),
            ordinal,
        })
    }
    /// A new virtual device on the physical device: its own merge buffer and subordinal; on
    /// the multicore backend, the first one starts the physical device's worker thread and
    /// later ones share it, so their tasks run one at a time in the order they were
    /// scheduled (an event or await of one of them covers what was scheduled before on the
    /// others too).
    fn new_virtual_device(&self, physical: &PhysicalDevice) -> Result<Device> {
        if !self.is_initialized() {
            return Err(Error::NotInitialized {
                backend: self.name().to_string(),
            });
        }
        let mut devices = self.core().devices();
        let sub = devices.iter().filter(|d| d.physical() == physical).count();
        // Virtual devices of one physical device share its worker thread and queue (one
        // thread per core, as in the seed's multicore backend); each keeps its own merge
        // buffer and subordinal.
        let sibling = devices
            .iter()
            .find(|d| d.physical() == physical && d.has_worker())
            .and_then(|d| d.on_same_queue(sub));
        let d = match sibling {
            Some(d) => d,
            None => self.spawn_device(physical, sub)?,
        };
        devices.push(d.clone());
        Ok(d)
    }
    /// A new root context on the device.
    fn init(&self, device: &Device) -> Result<Context> {
        self.core().cc.init("")?;
        device.check_live()?;
        Ok(Context::root(&device.name(), Some(device.clone())))
    }
    /// Finalizes the context: waits until its device is idle (a failure stays to be
    /// reported by the next await or schedule), then releases the context's buffers. Later
    /// links into it, copies to or from it, and runs or schedules of routines linked into it
    /// fail with [`Error::ContextFinalized`].
    fn finalize(&self, ctx: &Context) {
        if let Some(d) = ctx.device() {
            d.wait_idle();
        }
        ctx.finalize()
    }
    /// The device of a context.
    fn get_ctx_device(&self, ctx: &Context) -> Result<Device> {
        ctx_device(ctx)
    }
    /// The physical device of a virtual device.
    fn get_physical_device(&self, device: &Device) -> PhysicalDevice {
        device.physical().clone()
    }
    /// The ordinal of a physical device.
    fn to_ordinal(&self, device: &PhysicalDevice) -> usize {
        device.ordinal()
    }
    /// The index of a virtual device among those of its physical device.
    fn to_subordinal(&self, device: &Device) -> usize {
        device.subordinal()
    }
    /// `backend:ordinal:subordinal`.
    fn get_name(&self, device: &Device) -> String {
        device.name()
    }
    /// Blocks till the device becomes idle, i.e. synchronizes the device; returns the first
    /// failure of a task since the last report.
    fn await_device(&self, device: &Device) -> Result<()> {
        tracing::trace!(target: "arrayjit::backend", device = %device.name(), "await");
        let r = device.await_idle();
        if let Err(e) = &r {
            tracing::debug!(
                target: "arrayjit::backend",
                device = %device.name(),
                error = %e,
                "await: a task failed"
            );
        }
        r
    }
    /// Whether the device is currently waiting for work.
    fn is_idle(&self, device: &Device) -> bool {
        device.is_idle()
    }
    /// An event marking the current end of the device's queue: it completes once every task
    /// scheduled on the device so far has finished.
    fn record_event(&self, device: &Device) -> Event {
        device.event()
    }
    /// Makes the tasks scheduled on `device` from now on wait until `event` (usually of
    /// another device) completes, without blocking the caller: the device-side counterpart of
    /// awaiting the event's device before scheduling. Returns an earlier failure on `device`
    /// instead, like [`Backend::schedule`].
    fn wait_for_event(&self, device: &Device, event: &Event) -> Result<()> {
        device.wait_for(event)
    }
    /// Blocks until the event completes, then returns the first failure of a task on its
    /// device since the last report, if any (as [`Backend::await_device`] would).
    fn await_event(&self, event: &Event) -> Result<()> {
        event.wait();
        event.take_error()
    }
    /// A zero-filled buffer of at least `size_in_bytes` for the device; reuses `old_buffer`
    /// when it is big enough.
    fn alloc_buffer(
        &self,
        old_buffer: Option<(BufferPtr, usize)>,
        size_in_bytes: usize,
        _device: &Device,
    ) -> Result<BufferPtr> {
        self.core().cc.alloc_buffer(old_buffer, size_in_bytes)
    }
    /// Compiles a routine (see [`CcBackend::compile`]).
    fn compile(
        &self,
        shared: bool,
        name: Option<&str>,
        bindings: &Bindings,
        asgns: &Assignments,
    ) -> Result<Code> {
        self.core().cc.compile(shared, name, bindings, asgns)
    }
    /// Compiles routines into one file (see [`CcBackend::compile_batch`]).
    fn compile_batch(
        &self,
        shared: bool,
        names: Option<&[String]>,
        occupancy: Option<Occupancy<'_>>,
        bindings: &Bindings,
        asgns: &[Assignments],
    ) -> Result<CodeBatch> {
        self.core()
            .cc
            .compile_batch(shared, names, occupancy, bindings, asgns)
    }
    /// The node a routine reads from the merge buffer, if any.
    fn expected_merge_node(&self, code: &Code) -> Option<Tnode> {
        self.core().cc.expected_merge_node(code)
    }
    /// The merge nodes of a batch's entries.
    fn expected_merge_nodes(&self, batch: &CodeBatch) -> Vec<Option<Tnode>> {
        self.core().cc.expected_merge_nodes(batch)
    }
    /// Returns the routine for the code's procedure, in a new context derived from the given
    /// context; the routine reads its device's merge buffer.
    fn link(&self, from_prior_context: &[Tnode], ctx: &Context, code: &Code) -> Result<Routine> {
        let d = ctx_device(ctx)?;
        self.core()
            .cc
            .link(from_prior_context, d.merge_buffer(), ctx, code)
    }
    /// Returns the routines of a batch; the returned context is downstream of all of them.
    fn link_batch(
        &self,
        from_prior_context: &[Tnode],
        ctx: &Context,
        batch: &CodeBatch,
    ) -> Result<(Context, Vec<Option<Routine>>)> {
        let d = ctx_device(ctx)?;
        self.core()
            .cc
            .link_batch(from_prior_context, d.merge_buffer(), ctx, batch)
    }
    /// Schedules a task on a device (returns an earlier failure on the device instead).
    fn schedule(&self, device: &Device, task: Task) -> Result<()> {
        device.schedule(task)
    }
    /// If the array is both hosted and in-context, schedules a copy from host to context and
    /// returns true, otherwise returns false.
    ///
    /// The device gets the host array's value *at this call*, in scheduling order: the host
    /// array as it is now, or, when a [`Backend::to_host`] of the same array scheduled before
    /// (on any device) has not run yet, the value that `to_host` writes. So the caller may
    /// overwrite the host array (e.g. [`Tnode::set_host_values`]) right after the call, and a
    /// later `to_host` of another device may too: neither changes what this copy uploads.
    /// This takes a snapshot: when the device is busy (or must first wait for another
    /// device), the host array is copied now into a staging buffer that the device's task
    /// copies from; when it is idle and nothing it would wait for is pending, the copy is
    /// made now, on this thread, with no staging buffer (as on the sync backend).
    ///
    /// # Errors
    ///
    /// [`Error::OutOfMemory`] when the staging buffer cannot be allocated; an earlier
    /// failure on the device; [`Error::ContextFinalized`].
    #[allow(clippy::wrong_self_convention)] // the seed API's name
    fn from_host(&self, ctx: &Context, tn: &Tnode) -> Result<bool> {
        ctx.check_live()?;
        let (Some(buf), true) = (ctx.get_buffer(tn), tn.is_hosted()) else {
            return Ok(false);
        };
        let d = ctx_device(ctx)?;
        tracing::trace!(target: "arrayjit::backend", tensor = %tn, device = %d.name(), "from_host");
        let description = format!("from_host {}", tn.name());
        let access = [(buf.clone(), true)];
        if !d.has_worker() {
            // The sync backend runs the task now (a remote device drops it).
            let t = tn.clone();
            d.schedule(
                Task::new(description, move || {
                    t.with_host(|a| buf.write_ndarray(a)).unwrap_or(Ok(()))
                })
                .with_accesses(access),
            )?;
            return Ok(true);
        }
        let task = match host_order::pending_write(tn) {
            // The value a to_host scheduled before writes, once it has.
            Some((write, done)) => {
                let name = tn.name();
                Task::new(description, move || {
                    done.wait();
                    match write.written() {
                        Some(bytes) => buf.write_bytes(&bytes),
                        None => Err(Error::Task {
                            task: format!("to_host {name} on {}", done.device_name()),
                            msg: "it failed or never ran, so the value this from_host \
                                  uploads (the one it writes) is unknown"
                                .into(),
                        }),
                    }
                })
            }
            None => {
                let now = || tn.with_host(|a| buf.write_ndarray(a)).unwrap_or(Ok(()));
                if d.run_now_if_idle(&access, now)? {
                    return Ok(true);
                }
                let snapshot = host_order::snapshot(tn)?;
                Task::new(description, move || buf.write_bytes(&snapshot))
            }
        };
        d.schedule(task.with_accesses(access))?;
        Ok(true)
    }
    /// If the array is both hosted and in-context, schedules a copy from context to host and
    /// returns true, otherwise returns false. The caller must synchronize the device (await
    /// it, or an event after the copy) before reading the host array, and must not write
    /// the host array before then.
    ///
    /// Host copies of one host array are ordered as scheduled, whatever their devices: the
    /// copy waits for the `to_host`s of the same array scheduled before it on other devices,
    /// so the last one scheduled leaves its value; a [`Backend::from_host`] scheduled after
    /// it uploads the value it writes (even if the device computes a new one meanwhile).
    fn to_host(&self, ctx: &Context, tn: &Tnode) -> Result<bool> {
        ctx.check_live()?;
        let (Some(buf), true) = (ctx.get_buffer(tn), tn.is_hosted()) else {
            return Ok(false);
        };
        let d = ctx_device(ctx)?;
        tracing::trace!(target: "arrayjit::backend", tensor = %tn, device = %d.name(), "to_host");
        let description = format!("to_host {}", tn.name());
        let access = [(buf.clone(), false)];
        let t = tn.clone();
        if !d.has_worker() {
            d.schedule(
                Task::new(description, move || {
                    t.with_host_mut(|a| buf.read_ndarray(a)).unwrap_or(Ok(()))
                })
                .with_accesses(access),
            )?;
            return Ok(true);
        }
        // The to_host scheduled before on another queue, if it has not run.
        let before =
            host_order::last_write(tn).filter(|e| !e.is_on_queue_of(&d) && !e.is_complete());
        let write = Arc::new(host_order::HostWrite::default());
        let w = write.clone();
        let task = Task::new(description, move || {
            if let Some(e) = &before {
                e.wait();
            }
            let wrote = t.with_host_mut(|a| {
                let r = buf.read_ndarray(a);
                w.finish(r.is_ok().then(|| a.as_bytes()))?;
                r
            });
            wrote.unwrap_or_else(|| w.finish(None))
        });
        if let Some(done) = d.schedule_marked(task.with_accesses(access))? {
            host_order::record(tn, write, done);
        }
        Ok(true)
    }
    /// Copies a node between devices, or into the destination's merge buffer:
    /// - if the node is absent from `src` and either present in `dst` or `into_merge_buffer`
    ///   is not `No`: an error;
    /// - `No`: if the node is in `dst`, schedules a copy from `src` into it on `dst`'s device
    ///   and returns true, otherwise returns false;
    /// - `Streaming`: schedules setting `dst`'s device merge buffer to `src`'s buffer (no
    ///   copy); the caller must not overwrite the source until `dst` has used it;
    /// - `Copy`: schedules a copy from `src` into `dst`'s device merge buffer (grown as
    ///   needed).
    ///
    /// Into a merge buffer (`Streaming`, `Copy`), `dst` must be the context of a routine that
    /// reads `tn` from the merge buffer (the one returned by linking it): otherwise the call
    /// fails at once with [`Error::MergeNodeMismatch`] naming the expected node (or none) and
    /// `tn`, as in the seed. Either context being finalized is an error
    /// ([`Error::ContextFinalized`]). The copy is ordered after the source's pending writes
    /// of the buffer, and later writes of it wait for the copy (the device layer's hazard
    /// tracking, see [`Device::schedule`]); work run outside it (tasks that declare no
    /// accesses, [`Transfer::run`] inside a task) must be ordered with events.
    fn device_to_device(
        &self,
        tn: &Tnode,
        into_merge_buffer: MergeBufferUse,
        dst: &Context,
        src: &Context,
    ) -> Result<bool> {
        match self.prepare_transfer(tn, into_merge_buffer, dst, src)? {
            Some(t) => {
                tracing::debug!(
                    target: "arrayjit::backend",
                    tensor = %tn,
                    merge = ?into_merge_buffer,
                    from = src.label(),
                    to = dst.label(),
                    "device_to_device"
                );
                t.schedule()?;
                Ok(true)
            }
            None => Ok(false),
        }
    }
    /// The transfer [`Backend::device_to_device`] would schedule, checked now (with the same
    /// errors) and not scheduled: a [`Transfer`] can be scheduled, or run inside a task of
    /// `dst`'s device, any number of times. `None` where `device_to_device` returns false.
    fn prepare_transfer(
        &self,
        tn: &Tnode,
        into_merge_buffer: MergeBufferUse,
        dst: &Context,
        src: &Context,
    ) -> Result<Option<Transfer>> {
        prepare_transfer_in_process(tn, into_merge_buffer, dst, src)
    }
    /// Sums each tensor of `tns` over the given contexts (on distinct devices) and leaves the
    /// sum in every one of them: the data-parallel merge of gradients. Like a transfer it is
    /// scheduled, not done now: it reads each buffer after the work already scheduled on
    /// its device, and the work scheduled on those devices afterwards sees the sums.
    ///
    /// The sum is exact in the tensor's precision: integers wrap into their width, and half,
    /// bfloat16 and fp8 are summed in `f32` and rounded once. This default, for the in-process backends, is a task on the
    /// first context's device that waits for the others, sums the buffers in the order given
    /// and writes the sums back; the other devices wait for it. [`MpiBackend`] sums each
    /// rank's local contexts first and then across ranks with `MPI_Allreduce`; there every
    /// rank must make the call, with the same tensors and contexts, in the same order.
    ///
    /// # Errors
    ///
    /// [`Error::AllReduce`] naming the tensor and the context when no context is given, one
    /// is not on a device, two are on the same device, or one lacks the tensor; an earlier
    /// failure on one of the devices.
    ///
    /// [`MpiBackend`]: https://docs.rs/arrayjit/latest/arrayjit/backend/mpi/struct.MpiBackend.html
    fn all_reduce(&self, tns: &[Tnode], ctxs: &[Context]) -> Result<()> {
        let mut jobs = vec![];
        let mut devices: Vec<Device> = vec![];
        for tn in tns {
            let parts = reduce::participants(tn, ctxs)?;
            devices = parts.iter().map(|(d, _)| d.clone()).collect();
            let bufs: Vec<BufferPtr> = parts.into_iter().map(|(_, b)| b).collect();
            jobs.push((tn.prec(), reduce::elements(tn), tn.name(), bufs));
        }
        let Some(first) = devices.first().cloned() else {
            return Ok(());
        };
        let events: Vec<Event> = devices[1..].iter().map(|d| d.event()).collect();
        let names: Vec<&str> = jobs.iter().map(|j| j.2.as_str()).collect();
        first.schedule(Task::new(
            format!(
                "all_reduce {} over {} devices",
                names.join(", "),
                devices.len()
            ),
            move || {
                for e in &events {
                    e.wait();
                }
                // Every buffer taking part, locked exclusively: each is read, then written.
                let mut locks: Vec<(&DeviceBuffer, bool)> = jobs
                    .iter()
                    .flat_map(|j| j.3.iter().map(|b| (&**b, true)))
                    .collect();
                let _access = lock_all(&mut locks);
                for (prec, n, name, bufs) in &jobs {
                    for b in bufs {
                        b.mark_written();
                    }
                    let what = format!("the all_reduce of {name}");
                    let mut acc = reduce::Acc::zeros(*prec, *n, &what)?;
                    for b in bufs {
                        // SAFETY: the buffer's lock is held (above).
                        unsafe { acc.add(*prec, b) };
                    }
                    for b in bufs {
                        // SAFETY: the buffer's lock is held exclusively (above).
                        unsafe { acc.store(*prec, b) };
                    }
                }
                Ok(())
            },
        ))?;
        let done = first.event();
        for d in &devices[1..] {
            d.wait_for(&done)?;
        }
        Ok(())
    }
    /// The number of processes the backend's devices are spread over: the world size of
    /// `MpiBackend` (feature `mpi`), 1 for the in-process backends.
    fn num_ranks(&self) -> usize {
        1
    }
    /// This process's rank among [`Backend::num_ranks`] (0 for the in-process backends).
    fn rank(&self) -> usize {
        0
    }
    /// The physical device that virtual device `index` of `total` goes on, for programs
    /// that spread `total` devices evenly: `⌊index · P / total⌋` for `P` physical devices
    /// (each core holds a consecutive block, so that devices next to each other, which a
    /// tree merge pairs first, share a core); on `MpiBackend` (feature `mpi`) the rank
    /// `⌊index · R / total⌋`.
    fn placement(&self, index: usize, total: usize) -> usize {
        let p = self.num_physical_devices().max(1);
        (index * p / total.max(1)).min(p - 1)
    }
    /// Checks that every rank passes the same `bytes` (e.g. the program it runs); `what` names
    /// them in the error. Always `Ok` on the in-process backends; on
    /// `MpiBackend` (feature `mpi`) an all-gather of BLAKE3 hashes that every rank
    /// must call in the same order, failing with [`Error::RankMismatch`] naming the ranks
    /// that differ from rank 0.
    fn check_ranks_agree(&self, what: &str, bytes: &[u8]) -> Result<()> {
        let _ = (what, bytes);
        Ok(())
    }
    /// Ends the whole job after an unrecoverable error on this process: on
    /// `MpiBackend` (feature `mpi`) it prints nothing and calls `MPI_Abort`, which
    /// stops every rank (without it, the other ranks would wait for this one forever); on the
    /// in-process backends it does nothing and returns.
    fn abort_job(&self, code: i32) {
        let _ = code;
    }
    /// Copies `tn`'s buffer in `src` into `dst` (now, on this thread).
    fn to_buffer(&self, tn: &Tnode, dst: &BufferPtr, src: &Context) -> Result<()> {
        self.core().cc.to_buffer(tn, dst, src)
    }
    /// Copies a host array into a buffer (now, on this thread).
    fn host_to_buffer(&self, src: &Ndarray, dst: &BufferPtr) -> Result<()> {
        self.core().cc.host_to_buffer(src, dst)
    }
    /// Copies a buffer into a host array (now, on this thread).
    fn buffer_to_host(&self, dst: &mut Ndarray, src: &BufferPtr) -> Result<()> {
        self.core().cc.buffer_to_host(dst, src)
    }
    /// The buffer of `tn` in `ctx`, if any.
    fn get_buffer(&self, tn: &Tnode, ctx: &Context) -> Option<BufferPtr> {
        ctx.get_buffer(tn)
    }
    /// Cleans up all work on the backend: drains every device's queue, joins the workers and
    /// releases resources. All devices and contexts obtained before become invalid; the
    /// backend must be initialized again to be used again.
    fn unsafe_cleanup(&self) {
        let devices: Vec<Device> = std::mem::take(&mut *self.core().devices());
        for d in devices {
            d.release();
        }
        self.core().cc.unsafe_cleanup();
    }
}

/// The checks `device_to_device` makes on every backend, and the buffers it copies between:
/// both contexts live; the node in the source (else an error if the destination holds it or
/// the copy goes into a merge buffer, `None` otherwise); into a merge buffer, the destination
/// context expects the node ([`Error::MergeNodeMismatch`]); for `No`, the destination's own
/// buffer (`None` when it holds none: nothing to copy).
#[allow(clippy::type_complexity)]
pub(crate) fn transfer_buffers(
    tn: &Tnode,
    mode: MergeBufferUse,
    dst: &Context,
    src: &Context,
) -> Result<Option<(BufferPtr, Option<BufferPtr>)>> {
    src.check_live()?;
    dst.check_live()?;
    let Some(src_buf) = src.get_buffer(tn) else {
        if dst.contains(tn) || mode != MergeBufferUse::No {
            return Err(Error::NotInContext {
                what: "device_to_device".into(),
                tensor: tn.name(),
                context: src.label().to_string(),
                hint: " (the source context)".into(),
            });
        }
        return Ok(None);
    };
    let dst_buf = match mode {
        MergeBufferUse::No => match dst.get_buffer(tn) {
            Some(b) => Some(b),
            None => return Ok(None),
        },
        _ => {
            if dst.expected_merge_node() != Some(tn) {
                return Err(Error::MergeNodeMismatch {
                    context: dst.label().to_string(),
                    expected: dst.expected_merge_node().map(Tnode::name),
                    actual: tn.name(),
                });
            }
            None
        }
    };
    Ok(Some((src_buf, dst_buf)))
}

/// [`Backend::prepare_transfer`] between two contexts of this process (the default, and the
/// MPI backend's within a rank).
pub(crate) fn prepare_transfer_in_process(
    tn: &Tnode,
    into_merge_buffer: MergeBufferUse,
    dst: &Context,
    src: &Context,
) -> Result<Option<Transfer>> {
    let Some((src_buf, dst_buf)) = transfer_buffers(tn, into_merge_buffer, dst, src)? else {
        return Ok(None);
    };
    let device = ctx_device(dst)?;
    Ok(Some(Transfer(Arc::new(TransferInner {
        description: format!(
            "device_to_device {} {:?} {} -> {}",
            tn.name(),
            into_merge_buffer,
            src.label(),
            dst.label()
        )
        .into(),
        tn: tn.clone(),
        mode: into_merge_buffer,
        device,
        src_buf,
        dst_buf,
    }))))
}

/// One worker thread and one FIFO queue per physical device, shared by the virtual devices
/// created on it, and a thread team per physical device running the parallel regions of its
/// routines (the worker and helper threads, see [`super::team`]).
///
/// How cores are shared:
/// - with a number of threads per device ([`CcBackend::with_threads`] on the compiler
///   backend given to [`MulticoreBackend::with_cc`], `JitConfig::threads`, the CLI's
///   `--threads`), there are `cores / threads` physical devices (at least one), and physical
///   device `i` owns cores `i·threads ..` (modulo the cores the process may use);
/// - otherwise (the default) there is a physical device per core, as in the seed's multicore
///   backend, and the cores are shared out among the physical devices that have a worker:
///   each device's worker keeps its own core, and the cores of no worker are dealt to the
///   devices' teams in equal contiguous shares. So one device (a `Jit`'s, a single-device
///   program's) uses every core, and data-parallel devices use disjoint cores.
///
/// By default each worker and helper is pinned to its core (physical device `i`'s worker to
/// the `i`-th CPU the process may run on, the CPUs other processes kept busy when the first
/// was pinned counted last; see [`MulticoreBackend::with_pinning`]): unpinned,
/// the kernel may start two workers on one core and take milliseconds to move one, and a
/// step in which devices wait for each other then runs their work one after the other.
#[derive(Default)]
pub struct MulticoreBackend {
    core: DeviceCore,
    /// Whether workers are pinned to cores; `None`: as `ARRAYJIT_PIN_WORKERS` says (read
    /// when a worker starts), on by default.
    pin: Option<bool>,
    /// The teams of the physical devices with a worker, by ordinal (weak: a team lives as
    /// long as its devices).
    teams: Mutex<Vec<(usize, std::sync::Weak<Team>)>>,
}

impl MulticoreBackend {
    /// A new (uninitialized) multicore backend.
    pub fn new() -> MulticoreBackend {
        MulticoreBackend::default()
    }

    /// A multicore backend compiling with a configured compiler backend (see
    /// [`CcBackend::with_config`]).
    pub fn with_cc(cc: CcBackend) -> MulticoreBackend {
        MulticoreBackend {
            core: DeviceCore::with_cc(cc),
            pin: None,
            teams: Mutex::default(),
        }
    }

    /// Threads per physical device: the compiler backend's setting
    /// ([`CcBackend::with_threads`]), or `None` (one physical device per core, the cores
    /// shared out among the devices in use).
    pub fn threads_per_device(&self) -> Option<usize> {
        self.core.cc.threads()
    }

    /// The cores the process may run on, in pinning order (at least one entry; `None` when
    /// unknown, or when `pin` is off: then the allowed CPUs are not read at all).
    fn cores(pin: bool) -> Vec<Option<usize>> {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        let order = pin.then(super::device::pinning_order).flatten();
        (0..n)
            .map(|i| order.as_ref().map(|o| o[i % o.len()]))
            .collect()
    }

    /// Deals the cores without a worker out to the teams of the devices with one (the
    /// default sharing, see the type's documentation).
    fn share_cores(&self, pin: bool) {
        let mut teams = self.teams.lock().unwrap_or_else(|p| p.into_inner());
        teams.retain(|(_, t)| t.strong_count() > 0);
        teams.sort_by_key(|(o, _)| *o);
        let cores = Self::cores(pin);
        let c = cores.len();
        let live: Vec<(usize, Arc<Team>)> = teams
            .iter()
            .filter_map(|(o, t)| t.upgrade().map(|t| (*o, t)))
            .collect();
        let workers: Vec<usize> = live.iter().map(|(o, _)| o % c).collect();
        let free: Vec<usize> = (0..c).filter(|k| !workers.contains(k)).collect();
        let p = live.len().max(1);
        for (r, (o, team)) in live.iter().enumerate() {
            let mine = &free[r * free.len() / p..(r + 1) * free.len() / p];
            let list: Vec<Option<usize>> = std::iter::once(*o % c)
                .chain(mine.iter().copied())
                .map(|k| cores[k])
                .collect();
            team.set_cores(&list);
        }
    }

    /// The backend, pinning each worker thread to a core (`true`) or leaving the workers to
    /// the kernel's scheduler (`false`), whatever `ARRAYJIT_PIN_WORKERS` says. Pinning suits
    /// a machine the process has to itself; on one shared with other busy processes, a
    /// pinned worker cannot move away from them.
    pub fn with_pinning(mut self, pin: bool) -> MulticoreBackend {
        self.pin = Some(pin);
        self
    }
}

impl Backend for MulticoreBackend {
    fn name(&self) -> &'static str {
        "multicore"
    }
    fn unsafe_cleanup(&self) {
        self.cleanup()
    }
    fn core(&self) -> &DeviceCore {
        &self.core
    }
    /// The machine's available parallelism, divided by the threads per device when set
    /// (at least 1).
    fn num_physical_devices(&self) -> usize {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        match self.threads_per_device() {
            Some(t) => (cores / t.max(1)).max(1),
            None => cores,
        }
    }
    /// `PhysicalDevicesOnly` and `MostParallelDevices`: 1 (a core runs one thread at a time);
    /// `ForParallelCopying`: 2 (so copies overlap with computation).
    fn suggested_num_virtual_devices(&self, _device: &PhysicalDevice) -> usize {
        match self.core.cc.config() {
            Config::ForParallelCopying => 2,
            Config::PhysicalDevicesOnly | Config::MostParallelDevices => 1,
        }
    }
    fn spawn_device(&self, physical: &PhysicalDevice, subordinal: usize) -> Result<Device> {
        let pin = match self.pin {
            Some(p) => p,
            None => crate::compile::env_boolean("ARRAYJIT_PIN_WORKERS", true)?,
        };
        let o = physical.ordinal;
        match self.threads_per_device() {
            Some(t) => {
                // Cores o·t .. o·t + t - 1 (modulo the allowed ones).
                let cores: Vec<Option<usize>> = (0..t)
                    .map(|k| {
                        if pin {
                            super::device::allowed_core(o * t + k)
                        } else {
                            None
                        }
                    })
                    .collect();
                let team = Team::new(&format!("multicore:{o}"), t);
                team.set_cores(&cores);
                Device::with_worker(physical.clone(), subordinal, cores[0], Some(team))
            }
            None => {
                let core = if pin {
                    super::device::allowed_core(o)
                } else {
                    None
                };
                let n = std::thread::available_parallelism().map_or(1, |n| n.get());
                let team = Team::new(&format!("multicore:{o}"), n);
                let d =
                    Device::with_worker(physical.clone(), subordinal, core, Some(team.clone()))?;
                self.teams
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((o, Arc::downgrade(&team)));
                self.share_cores(pin);
                Ok(d)
            }
        }
    }
}

impl MulticoreBackend {
    /// [`Backend::unsafe_cleanup`]'s work, forgetting the teams too.
    fn cleanup(&self) {
        let devices: Vec<Device> = std::mem::take(&mut *self.core.devices());
        for d in devices {
            d.release();
        }
        self.core.cc.unsafe_cleanup();
        self.teams.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

impl Drop for MulticoreBackend {
    fn drop(&mut self) {
        self.unsafe_cleanup();
    }
}

/// Every call runs on the caller's thread; one physical device, any number of virtual devices.
#[derive(Default)]
pub struct SyncBackend {
    core: DeviceCore,
}

impl SyncBackend {
    /// A new (uninitialized) sync backend.
    pub fn new() -> SyncBackend {
        SyncBackend::default()
    }

    /// A sync backend compiling with a configured compiler backend (see
    /// [`CcBackend::with_config`]).
    pub fn with_cc(cc: CcBackend) -> SyncBackend {
        SyncBackend {
            core: DeviceCore::with_cc(cc),
        }
    }
}

impl Backend for SyncBackend {
    fn name(&self) -> &'static str {
        "sync"
    }
    fn core(&self) -> &DeviceCore {
        &self.core
    }
    fn num_physical_devices(&self) -> usize {
        1
    }
    fn suggested_num_virtual_devices(&self, _device: &PhysicalDevice) -> usize {
        1
    }
    /// The device runs its routines' parallel regions on the calling thread and, with
    /// threads set on the compiler backend ([`CcBackend::with_threads`]), helper threads
    /// (unpinned).
    fn spawn_device(&self, physical: &PhysicalDevice, subordinal: usize) -> Result<Device> {
        let team = self
            .core
            .cc
            .threads()
            .filter(|&t| t > 1)
            .map(|t| Team::new(&format!("sync:{}", physical.ordinal), t));
        Ok(Device::synchronous(physical.clone(), subordinal, team))
    }
}

/// The order of host copies of one host array across devices (see [`Backend::from_host`] and
/// [`Backend::to_host`]): the `to_host`s scheduled on device queues that have not run, by
/// node, and the snapshots `from_host` takes.
mod host_order {
    use super::super::device::Event;
    use crate::error::{Error, Result};
    use crate::ir::Tnode;
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex, OnceLock, Weak};

    /// A `to_host` scheduled on a device queue: what the host copies of the same array
    /// scheduled after it need.
    #[derive(Default)]
    pub(super) struct HostWrite {
        /// Complete once the `to_host` task has finished (set before the record is listed).
        done: OnceLock<Event>,
        state: Mutex<State>,
    }

    #[derive(Default)]
    enum State {
        /// Not run yet.
        #[default]
        Pending,
        /// Not run yet, and a `from_host` scheduled after it uploads what it writes.
        Wanted,
        /// Ran; what it wrote, if a `from_host` wanted it.
        Written(Option<Arc<Vec<u8>>>),
        /// Failed (the failure is reported on its device).
        Failed,
    }

    impl HostWrite {
        fn state(&self) -> std::sync::MutexGuard<'_, State> {
            self.state.lock().unwrap_or_else(|p| p.into_inner())
        }

        /// Records that the `to_host` wrote `bytes` to the host array (`None`: it failed),
        /// keeping a copy if a `from_host` wants it. Runs in the task, holding the host
        /// array's lock.
        pub(super) fn finish(&self, bytes: Option<&[u8]>) -> Result<()> {
            let mut st = self.state();
            let wanted = matches!(*st, State::Wanted);
            *st = match bytes {
                None => State::Failed,
                Some(_) if !wanted => State::Written(None),
                Some(b) => match copy("the value a to_host wrote", b) {
                    Ok(v) => State::Written(Some(Arc::new(v))),
                    Err(e) => {
                        *st = State::Failed;
                        return Err(e);
                    }
                },
            };
            Ok(())
        }

        /// What the `to_host` wrote, once it has run, for a `from_host` that asked for it
        /// ([`pending_write`]); `None` if it failed or never ran.
        pub(super) fn written(&self) -> Option<Arc<Vec<u8>>> {
            match &*self.state() {
                State::Written(b) => b.clone(),
                _ => None,
            }
        }
    }

    /// The listed `to_host`s by node id: weak, so that a record goes away with its task
    /// (and the `from_host` tasks waiting for it).
    struct Table {
        writes: BTreeMap<usize, Weak<HostWrite>>,
        /// When `writes` grows to this many entries, dead ones are dropped.
        prune_at: usize,
    }

    static TABLE: Mutex<Table> = Mutex::new(Table {
        writes: BTreeMap::new(),
        prune_at: 64,
    });

    fn table() -> std::sync::MutexGuard<'static, Table> {
        TABLE.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last `to_host` of `tn` scheduled on a device queue, while its task is alive.
    fn last(tn: &Tnode) -> Option<Arc<HostWrite>> {
        table().writes.get(&tn.id()).and_then(Weak::upgrade)
    }

    /// Lists a scheduled `to_host` of `tn`, ending at `done`.
    pub(super) fn record(tn: &Tnode, write: Arc<HostWrite>, done: Event) {
        let _ = write.done.set(done);
        let mut t = table();
        t.writes.insert(tn.id(), Arc::downgrade(&write));
        if t.writes.len() >= t.prune_at {
            t.writes.retain(|_, w| w.strong_count() > 0);
            t.prune_at = (2 * t.writes.len()).max(64);
        }
    }

    /// Where the last `to_host` of `tn` scheduled on a device queue ends, if it has not run:
    /// a later `to_host` on another queue waits for it.
    pub(super) fn last_write(tn: &Tnode) -> Option<Event> {
        let w = last(tn)?;
        if !matches!(*w.state(), State::Pending | State::Wanted) {
            return None;
        }
        w.done.get().cloned()
    }

    /// The last `to_host` of `tn` scheduled on a device queue, if it has not run, and where
    /// it ends: it will keep what it writes for the caller, a `from_host` that uploads it.
    pub(super) fn pending_write(tn: &Tnode) -> Option<(Arc<HostWrite>, Event)> {
        let w = last(tn)?;
        let done = w.done.get()?.clone();
        {
            let mut st = w.state();
            match *st {
                State::Pending => *st = State::Wanted,
                State::Wanted => {}
                // It ran: the host array holds its value (or a newer one the caller wrote).
                State::Written(_) | State::Failed => return None,
            }
        }
        Some((w, done))
    }

    /// A copy of `tn`'s host array (empty if it has none).
    pub(super) fn snapshot(tn: &Tnode) -> Result<Vec<u8>> {
        let what = || {
            format!(
                "the snapshot of the host array of {} (from_host)",
                tn.name()
            )
        };
        tn.with_host(|a| copy(&what(), a.as_bytes()))
            .unwrap_or(Ok(Vec::new()))
    }

    /// A copy of `bytes`; [`Error::OutOfMemory`] naming `what` if it cannot be allocated.
    fn copy(what: &str, bytes: &[u8]) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        v.try_reserve_exact(bytes.len())
            .map_err(|_| Error::OutOfMemory {
                what: what.to_string(),
                bytes: bytes.len(),
            })?;
        v.extend_from_slice(bytes);
        Ok(v)
    }
}
