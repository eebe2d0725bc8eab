//! Devices: a physical device is a CPU core (multicore) or the calling thread (sync). A
//! virtual device has a merge buffer and runs its tasks on its physical device's queue: on
//! the multicore backend one FIFO queue and one worker thread per physical device, shared by
//! all its virtual devices (so a core runs one task at a time, in scheduling order, as in the
//! seed's multicore backend); on the sync backend, at once on the scheduling thread.
//!
//! The queue is a `Mutex<VecDeque>` (producers: the threads scheduling on any of its devices;
//! one consumer: the worker, which takes every queued task at once) and two counters,
//! `scheduled` and `completed`. A device is idle when they are equal; an [`Event`] is a value
//! of `scheduled` (a position in the queue), complete once `completed` reaches it. Every wait
//! (the worker for work, an await, a device waiting for another's event) first checks in a
//! loop that yields the core (for at most [`WORK_SPIN`] or [`DONE_SPIN`]), then parks on a
//! condition variable; a finished task wakes only the threads parked for a count it reaches,
//! and a scheduled task wakes the worker only when it is parked.
//!
//! Waits cannot deadlock on a shared queue: an event covers only tasks scheduled before it,
//! and a wait for it is scheduled after it, so on the same queue those tasks come first.

use super::buffer::{BufferPtr, DeviceBuffer};
use super::counter::{spin_until, Counter};
pub use super::counter::{DONE_SPIN, FAR_AHEAD};
use super::task::{MergeBuffer, Task};
use super::team::Team;
use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// How many tasks a device queue holds before `schedule` blocks (back-pressure).
pub const QUEUE_CAPACITY: usize = 1024;

/// The stack size of device worker threads: generated routines keep at most
/// [`crate::codegen::MAX_FRAME_BYTES`] of local arrays on the stack, so this leaves ample room
/// for the task machinery and libm.
pub const WORKER_STACK_BYTES: usize = 8 << 20;

/// How long an idle worker waits for new work without parking (see `spin_until`).
pub const WORK_SPIN: Duration = Duration::from_micros(50);

pub(crate) static NEXT_DEVICE: AtomicUsize = AtomicUsize::new(1);
static NEXT_QUEUE: AtomicUsize = AtomicUsize::new(1);

/// `DeviceBuffer::owner` of a buffer accessed by several queues.
const SHARED_OWNER: usize = usize::MAX;

/// A physical device.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PhysicalDevice {
    pub(crate) backend: &'static str,
    pub(crate) ordinal: usize,
}

impl PhysicalDevice {
    /// The device's ordinal among its backend's physical devices.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
    /// The backend's name.
    pub fn backend(&self) -> &'static str {
        self.backend
    }
}

/// Where the failures of one virtual device's tasks go: the first failure since the last
/// report. Virtual devices sharing a queue keep their own.
#[derive(Default)]
struct Failures {
    error: Mutex<Option<Error>>,
    /// Whether `error` holds one (checked without the lock).
    failed: AtomicBool,
}

impl Failures {
    fn record(&self, e: Error) {
        let mut st = lock(&self.error);
        st.get_or_insert(e);
        self.failed.store(true, Ordering::Release);
    }

    /// The first failure since the last report (and forgets it).
    fn take(&self) -> Result<()> {
        if self.failed.load(Ordering::Acquire) {
            let mut st = lock(&self.error);
            self.failed.store(false, Ordering::Release);
            if let Some(e) = st.take() {
                return Err(e);
            }
        }
        Ok(())
    }
}

/// A point in a queue: complete once its `completed` count reaches `target` (0: nothing to
/// wait for).
struct Mark {
    queue: Arc<Shared>,
    target: u64,
}

impl Mark {
    fn pending_on_other(&self, me: &Arc<Shared>) -> bool {
        self.target != 0 && !Arc::ptr_eq(&self.queue, me) && !self.queue.is_complete(self.target)
    }
}

/// Hazard tracking: the tasks scheduled to access one buffer, as points in their queues.
/// Entries are updated in place (no allocation or reference counting once a buffer's
/// accessors are known), and marks reset to 0 rather than removed.
#[derive(Default)]
struct Hazards {
    /// After the last task scheduled to write the buffer.
    writer: Option<Mark>,
    /// After the tasks scheduled to read it since that write (one mark per queue).
    readers: Vec<Mark>,
    /// The queue that owned the buffer alone (see `DeviceBuffer::owner`), until a second
    /// one accesses it.
    first: Option<Arc<Shared>>,
}

/// Runs `f` on the buffer's hazard record.
fn with_hazards<R>(buf: &DeviceBuffer, f: impl FnOnce(&mut Hazards) -> R) -> R {
    let mut slot = buf.hazards();
    if !slot.as_ref().is_some_and(|b| b.is::<Hazards>()) {
        *slot = Some(Box::new(Hazards::default()));
    }
    match slot.as_mut().and_then(|b| b.downcast_mut::<Hazards>()) {
        Some(h) => f(h),
        None => f(&mut Hazards::default()),
    }
}

/// A queued task and where its failure goes.
type Queued = (Task, Arc<Failures>);

#[derive(Default)]
struct Pending {
    tasks: VecDeque<Queued>,
    /// No more tasks are accepted (set by `release`, the device's drop, or the worker's end).
    closed: bool,
    /// The worker is parked on `Shared::work`.
    parked: bool,
}

/// The part of a device its worker thread and its events share (not the whole device, so that
/// dropping the last handle ends the worker).
struct Shared {
    /// Unique among queues (never 0 or `usize::MAX`): the hazard tracking's owner id.
    id: usize,
    name: String,
    pending: Mutex<Pending>,
    /// The worker parks here when there is no work.
    work: Condvar,
    /// Tasks accepted so far (incremented with the push, under `pending`'s lock).
    scheduled: AtomicU64,
    /// Tasks finished so far (by the worker, in order), and the threads waiting for them.
    completed: Counter,
    /// Mirrors `Pending::closed`, for the spinning worker.
    closed: AtomicBool,
    /// Set by `unsafe_cleanup`.
    invalid: AtomicBool,
}

impl Shared {
    fn new(name: String) -> Shared {
        Shared {
            id: NEXT_QUEUE.fetch_add(1, Ordering::Relaxed),
            name,
            pending: Mutex::new(Pending::default()),
            work: Condvar::new(),
            scheduled: AtomicU64::new(0),
            completed: Counter::new(),
            closed: AtomicBool::new(false),
            invalid: AtomicBool::new(false),
        }
    }

    /// Counts `n` more tasks as finished and wakes the threads waiting for them.
    fn complete(&self, n: u64) {
        self.completed.advance(n);
    }

    fn is_complete(&self, target: u64) -> bool {
        self.completed.reached(target)
    }

    /// Blocks until `completed >= target`: spins, then parks.
    fn wait_until(&self, target: u64) {
        self.completed.wait_until(target, DONE_SPIN);
    }

    /// The first failure of `failures` since the last report (and forgets it), or an error
    /// if the queue was released.
    fn take_error(&self, failures: &Failures) -> Result<()> {
        if self.invalid.load(Ordering::Acquire) {
            return Err(Error::Released {
                device: self.name.clone(),
            });
        }
        failures.take()
    }

    /// Stops accepting tasks and wakes the worker (which finishes the queue, then ends).
    fn close(&self) {
        let mut p = lock(&self.pending);
        p.closed = true;
        self.closed.store(true, Ordering::Release);
        drop(p);
        self.work.notify_all();
    }

    /// The worker's loop: takes every queued task at once, runs them in order; when there is
    /// none, spins for a while, then parks. Ends when the device is closed and the queue is
    /// empty.
    fn work(self: Arc<Shared>) {
        // However the loop ends, tasks left behind count as finished (with an error), so no
        // await can hang on them.
        struct Exit {
            sh: Arc<Shared>,
            /// The tasks taken from the queue and not run yet.
            batch: VecDeque<Queued>,
        }
        impl Drop for Exit {
            fn drop(&mut self) {
                let mut p = lock(&self.sh.pending);
                p.closed = true;
                self.sh.closed.store(true, Ordering::Release);
                let mut left = std::mem::take(&mut p.tasks);
                drop(p);
                left.extend(self.batch.drain(..));
                for (t, failures) in &left {
                    failures.record(Error::Task {
                        task: t.description.to_string(),
                        msg: "the device's worker thread ended before running it".into(),
                    });
                }
                self.sh.complete(left.len() as u64);
            }
        }
        let mut exit = Exit {
            sh: self,
            batch: VecDeque::new(),
        };
        loop {
            let sh = &exit.sh;
            {
                let mut p = lock(&sh.pending);
                if p.tasks.is_empty() {
                    if p.closed {
                        return;
                    }
                    drop(p);
                    // Everything taken so far is finished: new work shows as `scheduled`
                    // moving past `completed`.
                    let done = sh.completed.get();
                    spin_until(WORK_SPIN, || {
                        sh.scheduled.load(Ordering::Acquire) != done
                            || sh.closed.load(Ordering::Acquire)
                    });
                    p = lock(&sh.pending);
                    while p.tasks.is_empty() && !p.closed {
                        p.parked = true;
                        p = sh.work.wait(p).unwrap_or_else(|e| e.into_inner());
                    }
                    p.parked = false;
                }
                std::mem::swap(&mut p.tasks, &mut exit.batch);
            }
            while let Some((task, failures)) = exit.batch.pop_front() {
                if let Err(e) = run_captured(task) {
                    failures.record(e);
                }
                exit.sh.complete(1);
            }
        }
    }
}

/// A point in a device's queue: complete once every task scheduled on the device before the
/// event was recorded has finished. Events order work across devices without the host
/// waiting: [`Device::wait_for`] makes a device's later tasks wait for another device's
/// event. Cheap to clone.
#[derive(Clone)]
pub struct Event {
    shared: Arc<Shared>,
    failures: Arc<Failures>,
    target: u64,
    /// The name of the device it was recorded on.
    device: Arc<str>,
}

impl Event {
    /// Whether every task the event covers has finished.
    pub fn is_complete(&self) -> bool {
        self.shared.is_complete(self.target)
    }

    /// Blocks until the event is complete (spinning briefly, then parking). Failures are not
    /// reported here (see [`crate::backend::Backend::await_event`]), so a task can wait for
    /// another device's event without taking that device's error. A task may call it for an
    /// event recorded before the task was scheduled (what [`Device::wait_for`] does), never for
    /// a later one of its own device, which would wait for the task itself.
    pub fn wait(&self) {
        self.shared.wait_until(self.target);
    }

    /// The first failure on the event's device since the last report (and forgets it).
    pub(crate) fn take_error(&self) -> Result<()> {
        self.failures.take()
    }

    /// The name of the device the event belongs to.
    pub fn device_name(&self) -> &str {
        &self.device
    }

    /// Whether the event is a point in `d`'s queue (whose tasks run in order anyway).
    pub(crate) fn is_on_queue_of(&self, d: &Device) -> bool {
        Arc::ptr_eq(&self.shared, d.shared())
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Event({} after {} tasks)", self.device, self.target)
    }
}

/// A queue and its worker thread, shared by the virtual devices of one physical device.
struct Queue {
    shared: Arc<Shared>,
    /// Whether tasks run on a worker thread (false: at once, on the scheduling thread).
    threaded: bool,
    worker: Mutex<Option<JoinHandle<()>>>,
    /// The thread team running the parallel regions of the device's routines (`None`: one
    /// thread).
    team: Option<Arc<Team>>,
}

impl Drop for Queue {
    fn drop(&mut self) {
        // The last device on the queue is gone: let the worker finish the queue and end (not
        // joined: this may run on the worker itself, when a task held the last handle).
        self.shared.close();
    }
}

struct Inner {
    id: usize,
    name: Arc<str>,
    physical: PhysicalDevice,
    subordinal: usize,
    merge_buffer: MergeBuffer,
    /// The device-owned storage that `Copy` merges copy into; grows as needed.
    merge_storage: Mutex<Option<BufferPtr>>,
    queue: Arc<Queue>,
    failures: Arc<Failures>,
    /// See [`Device::set_streamed`].
    streamed: Mutex<Option<BufferPtr>>,
    /// The device belongs to another process (an MPI rank): its tasks are dropped unrun.
    remote: bool,
}

/// A virtual device: a queue of tasks (run by a worker thread on the multicore backend, at
/// once on the sync backend) and a merge buffer. Cheap to clone.
#[derive(Clone)]
pub struct Device(Arc<Inner>);

/// The `i`-th (modulo their number) CPU this thread may run on, for pinning the worker of
/// physical device `i`; `None` when the allowed CPUs cannot be read. The CPUs where another
/// process's thread was runnable come last ([`super::load::busy_cpus`], looked at once per
/// process, when the first CPU is asked for), each group in CPU order. So a single worker is
/// not pinned beside a busy process: pinned to the first allowed CPU, it shared that CPU
/// with a busy loop in 2 of 16 runs of the default moons job (11M samples/s instead of 25M)
/// until the scheduler moved the loop.
pub(crate) fn allowed_core(i: usize) -> Option<usize> {
    let cpus = pinning_order()?;
    Some(cpus[i % cpus.len()])
}

/// The CPUs this thread may run on, in the order [`allowed_core`] deals them out (at least
/// one; `None` when they cannot be read): one read of the affinity for callers that need
/// them all.
pub(crate) fn pinning_order() -> Option<Vec<usize>> {
    static BUSY: std::sync::OnceLock<Vec<usize>> = std::sync::OnceLock::new();
    let busy = BUSY.get_or_init(super::load::busy_cpus);
    let mut cpus = allowed_cpus()?;
    cpus.sort_by_key(|c| busy.contains(c));
    Some(cpus)
}

/// The CPUs this thread may run on, in CPU order; `None` when they cannot be read.
fn allowed_cpus() -> Option<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity writes at most
    // size_of::<cpu_set_t>() bytes into it.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        set
    };
    let allowed: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        // SAFETY: CPU_ISSET reads bit c of the set, c < CPU_SETSIZE.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect();
    (!allowed.is_empty()).then_some(allowed)
}

/// Pins the calling thread to CPU `core`; a failure is reported through `tracing` (the
/// thread then runs wherever the kernel puts it).
pub(crate) fn pin_current_thread(core: usize) {
    pin_thread(0, core);
}

/// Pins thread `tid` of this process (0: the calling thread) to CPU `core`; returns whether it
/// could. A failure is reported through `tracing` (the thread then stays where it may run).
pub(crate) fn pin_thread(tid: libc::pid_t, core: usize) -> bool {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET sets bit `core` (checked
    // below CPU_SETSIZE); sched_setaffinity reads size_of::<cpu_set_t>() bytes of it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if core >= libc::CPU_SETSIZE as usize {
            -1
        } else {
            libc::CPU_SET(core, &mut set);
            libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set)
        }
    };
    if rc != 0 {
        tracing::warn!(
            target: "arrayjit::backend",
            "could not pin a thread to CPU {core}: {}",
            std::io::Error::last_os_error()
        );
    }
    rc == 0
}

/// The CPU the calling thread runs on now (it may move at any time), if the system says.
pub(crate) fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu takes no argument and only returns a number.
    usize::try_from(unsafe { libc::sched_getcpu() }).ok()
}

/// The calling thread's id, for [`pin_thread`] from another thread.
pub(crate) fn current_tid() -> libc::pid_t {
    // SAFETY: gettid takes no argument and cannot fail.
    unsafe { libc::gettid() }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".into()
    }
}

/// Runs a task, turning a panic or an error into an error that names the task.
fn run_captured(task: Task) -> Result<()> {
    let description = task.description.clone();
    match catch_unwind(AssertUnwindSafe(|| task.run())) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(Error::Task {
            task: description.to_string(),
            msg: e.to_string(),
        }),
        Err(p) => Err(Error::Task {
            task: description.to_string(),
            msg: format!("panicked: {}", panic_message(p.as_ref())),
        }),
    }
}

impl Device {
    /// A device whose tasks run on a new worker thread (the first virtual device of a
    /// physical device; see [`Device::on_same_queue`]), pinned to CPU `core` if given (a
    /// failure to pin is reported through `tracing` and leaves the worker unpinned).
    pub(crate) fn with_worker(
        physical: PhysicalDevice,
        subordinal: usize,
        core: Option<usize>,
        team: Option<Arc<Team>>,
    ) -> Result<Device> {
        let queue_name = format!("{}:{}", physical.backend, physical.ordinal);
        Device::spawn_worker(physical, subordinal, queue_name, core, team)
    }

    /// A device whose tasks run on a new worker thread, whose queue (and thread) has a name of
    /// its own.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn named_worker(
        physical: PhysicalDevice,
        subordinal: usize,
        queue_name: String,
    ) -> Result<Device> {
        Device::spawn_worker(physical, subordinal, queue_name, None, None)
    }

    fn spawn_worker(
        physical: PhysicalDevice,
        subordinal: usize,
        queue_name: String,
        core: Option<usize>,
        team: Option<Arc<Team>>,
    ) -> Result<Device> {
        let shared = Arc::new(Shared::new(queue_name.clone()));
        let worker_shared = shared.clone();
        let handle = std::thread::Builder::new()
            .name(queue_name)
            .stack_size(WORKER_STACK_BYTES)
            .spawn(move || {
                if let Some(c) = core {
                    pin_current_thread(c);
                }
                worker_shared.work()
            })
            .map_err(|e| Error::io("starting a device worker thread", e))?;
        let queue = Queue {
            shared,
            threaded: true,
            worker: Mutex::new(Some(handle)),
            team,
        };
        Ok(Device::new(physical, subordinal, Arc::new(queue)))
    }

    /// A device whose tasks run at once on the scheduling thread (its routines' parallel
    /// regions on `team` too, with that thread among the team's).
    pub(crate) fn synchronous(
        physical: PhysicalDevice,
        subordinal: usize,
        team: Option<Arc<Team>>,
    ) -> Device {
        let name = format!("{}:{}:{}", physical.backend, physical.ordinal, subordinal);
        let queue = Queue {
            shared: Arc::new(Shared::new(name)),
            threaded: false,
            worker: Mutex::new(None),
            team,
        };
        Device::new(physical, subordinal, Arc::new(queue))
    }

    /// A stand-in for a device that another process owns (SPMD backends: another MPI rank
    /// runs its work). Every rank creates every device, so that all ranks make the same calls
    /// in the same order; on the ranks that do not own it, the device drops the tasks
    /// scheduled on it without running them, is always idle, and its events are always
    /// complete.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn remote(physical: PhysicalDevice, subordinal: usize) -> Device {
        let mut d = Device::synchronous(physical, subordinal, None);
        if let Some(inner) = Arc::get_mut(&mut d.0) {
            inner.remote = true;
        }
        d
    }

    /// Another virtual device of this device's physical device, on the same queue and worker
    /// thread: its own merge buffer and subordinal, its tasks run in scheduling order with
    /// those of every device on the queue (one thread per physical device, as in the seed's
    /// multicore backend, where a physical device runs one thing at a time). `None` if this
    /// device's queue was released.
    pub(crate) fn on_same_queue(&self, subordinal: usize) -> Option<Device> {
        if self.0.queue.shared.closed.load(Ordering::Acquire) {
            return None;
        }
        Some(Device::new(
            self.0.physical.clone(),
            subordinal,
            self.0.queue.clone(),
        ))
    }

    fn new(physical: PhysicalDevice, subordinal: usize, queue: Arc<Queue>) -> Device {
        let name = format!("{}:{}:{}", physical.backend, physical.ordinal, subordinal);
        Device(Arc::new(Inner {
            id: NEXT_DEVICE.fetch_add(1, Ordering::Relaxed),
            name: name.into(),
            physical,
            subordinal,
            merge_buffer: MergeBuffer::new(),
            merge_storage: Mutex::new(None),
            queue,
            failures: Arc::default(),
            streamed: Mutex::new(None),
            remote: false,
        }))
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.0.queue.shared
    }

    /// Enqueues a task (on the sync backend: runs it now). Returns the error of an earlier
    /// failed task on this device, if any, instead of scheduling. Blocks while the queue is
    /// full.
    ///
    /// A task that declares the buffers it accesses ([`Task::with_accesses`]; routine tasks,
    /// transfers and host copies do) is tracked for hazards: the device first waits (as
    /// [`Device::wait_for`] does) for the tasks of other queues scheduled before it that write
    /// a buffer it accesses, or that read one it writes. So work scheduled from one thread
    /// runs as if in scheduling order, whatever devices it is spread over. Tasks on one queue
    /// are in order anyway.
    pub fn schedule(&self, task: Task) -> Result<()> {
        self.enqueue(task).map(drop)
    }

    /// [`Device::schedule`], returning an event that completes once the task has finished
    /// (`None` when the task ran at once, on the sync backend, or was dropped, on a remote
    /// device).
    pub(crate) fn schedule_marked(&self, task: Task) -> Result<Option<Event>> {
        Ok(self.enqueue(task)?.map(|target| Event {
            shared: self.shared().clone(),
            failures: self.0.failures.clone(),
            target,
            device: self.0.name.clone(),
        }))
    }

    /// [`Device::schedule`], returning the task's end in the queue (`None`: the task ran at
    /// once, or was dropped on a remote device).
    fn enqueue(&self, mut task: Task) -> Result<Option<u64>> {
        let sh = self.shared();
        sh.take_error(&self.0.failures)?;
        task.check()?;
        if self.0.remote {
            // Another process runs this device's work.
            drop(task);
            return Ok(None);
        }
        if !self.0.queue.threaded {
            sh.scheduled.fetch_add(1, Ordering::SeqCst);
            let r = run_captured(task);
            sh.complete(1);
            return r.map(|()| None);
        }
        let accesses = task.accesses.take();
        if let Some(acc) = &accesses {
            // The task itself waits first (rather than a waiting task of its own before it).
            let mut waits = self.hazard_waits(acc);
            waits.retain(|(queue, target)| !queue.is_complete(*target));
            if !waits.is_empty() {
                task = task.after(move || {
                    for (queue, target) in waits {
                        queue.wait_until(target);
                    }
                });
            }
        }
        // Back-pressure: wait for room.
        let s = sh.scheduled.load(Ordering::Relaxed);
        if s.saturating_sub(sh.completed.get()) >= QUEUE_CAPACITY as u64 {
            sh.wait_until(s + 1 - QUEUE_CAPACITY as u64);
        }
        let mut p = lock(&sh.pending);
        if p.closed {
            return Err(Error::Released {
                device: self.name(),
            });
        }
        p.tasks.push_back((task, self.0.failures.clone()));
        let after = sh.scheduled.fetch_add(1, Ordering::Release) + 1;
        // Notify once per parking.
        let wake = std::mem::take(&mut p.parked);
        drop(p);
        if wake {
            sh.work.notify_one();
        }
        if let Some(acc) = &accesses {
            self.record_accesses(acc, after);
        }
        Ok(Some(after))
    }

    /// Runs `work` now, on this thread, instead of scheduling it as a task accessing
    /// `accesses`, when that is the same: the device has a worker, its queue is idle, and no
    /// task of another queue that such a task would wait for is pending. Returns whether it
    /// ran (false: nothing was done); like [`Device::schedule`], first returns an earlier
    /// failure on the device.
    pub(crate) fn run_now_if_idle(
        &self,
        accesses: &[(BufferPtr, bool)],
        work: impl FnOnce() -> Result<()>,
    ) -> Result<bool> {
        let sh = self.shared();
        sh.take_error(&self.0.failures)?;
        if !self.0.queue.threaded || self.0.remote || self.pending() != 0 {
            return Ok(false);
        }
        if !self.hazard_waits(accesses).is_empty() {
            return Ok(false);
        }
        work()?;
        Ok(true)
    }

    /// The points in other queues that a task accessing `accesses` must wait for: the last
    /// writer of each buffer, and for a buffer written, its readers since (the latest point
    /// per queue; complete ones left out).
    fn hazard_waits(&self, accesses: &[(BufferPtr, bool)]) -> Vec<(Arc<Shared>, u64)> {
        let me = self.shared();
        let mut waits: Vec<(Arc<Shared>, u64)> = vec![];
        let mut add = |m: &Mark| {
            if !m.pending_on_other(me) {
                return;
            }
            match waits.iter_mut().find(|(q, _)| Arc::ptr_eq(q, &m.queue)) {
                Some((_, t)) => *t = (*t).max(m.target),
                None => waits.push((m.queue.clone(), m.target)),
            }
        };
        for (buf, write) in accesses {
            // Fast path: a buffer only this queue has accessed needs no tracking.
            if buf.owner().load(Ordering::Acquire) == me.id {
                continue;
            }
            with_hazards(buf, |h| {
                let owner = buf.owner().load(Ordering::Acquire);
                if owner == me.id {
                    return;
                }
                if owner == 0 {
                    // The first queue to access it owns it.
                    h.first = Some(me.clone());
                    buf.owner().store(me.id, Ordering::Release);
                    return;
                }
                if owner != SHARED_OWNER {
                    // A second queue: its owner's accesses were not recorded, so everything
                    // the owner has scheduled so far counts as a write.
                    if let Some(first) = h.first.take() {
                        let target = first.scheduled.load(Ordering::Acquire);
                        h.writer = Some(Mark {
                            queue: first,
                            target,
                        });
                    }
                    buf.owner().store(SHARED_OWNER, Ordering::Release);
                }
                if let Some(w) = &h.writer {
                    add(w);
                }
                if *write {
                    h.readers.iter().for_each(&mut add);
                }
            });
        }
        waits
    }

    /// Records that the task ending at position `after` of this device's queue accesses
    /// `accesses`.
    fn record_accesses(&self, accesses: &[(BufferPtr, bool)], after: u64) {
        let me = self.shared();
        let mark = |slot: &mut Mark| {
            if Arc::ptr_eq(&slot.queue, me) {
                slot.target = after;
                true
            } else {
                false
            }
        };
        for (buf, write) in accesses {
            if buf.owner().load(Ordering::Acquire) != SHARED_OWNER {
                continue;
            }
            with_hazards(buf, |h| {
                if *write {
                    // Every earlier reader is waited for (other queues) or runs before (this
                    // one), and later accesses wait for this write.
                    h.readers.iter_mut().for_each(|r| r.target = 0);
                    if !h.writer.as_mut().is_some_and(mark) {
                        h.writer = Some(Mark {
                            queue: me.clone(),
                            target: after,
                        });
                    }
                } else if !h.readers.iter_mut().any(mark) {
                    h.readers.push(Mark {
                        queue: me.clone(),
                        target: after,
                    });
                }
            });
        }
    }

    /// Blocks until the tasks of any device that a run accessing `accesses` now, on this
    /// thread, must wait for (see [`Device::schedule`]) have finished.
    pub(crate) fn wait_for_hazards(&self, accesses: &[(BufferPtr, bool)]) {
        for (queue, target) in self.hazard_waits(accesses) {
            queue.wait_until(target);
        }
    }

    /// Where a streaming merge into this device points its merge buffer, as scheduled so far
    /// (for the hazard tracking of routines reading the merge buffer).
    pub(crate) fn set_streamed(&self, src: Option<BufferPtr>) {
        *lock(&self.0.streamed) = src;
    }

    /// See [`Device::set_streamed`].
    pub(crate) fn streamed(&self) -> Option<BufferPtr> {
        lock(&self.0.streamed).clone()
    }

    /// An event marking the current end of the queue: complete once every task scheduled so
    /// far has finished.
    pub fn event(&self) -> Event {
        Event {
            shared: self.shared().clone(),
            failures: self.0.failures.clone(),
            target: self.shared().scheduled.load(Ordering::Acquire),
            device: self.0.name.clone(),
        }
    }

    /// Makes the tasks scheduled on this device from now on wait until `event` (usually of
    /// another device) is complete, without blocking the caller: schedules a task that waits
    /// (nothing when the event is already complete). Returns an earlier failure on this
    /// device instead, as [`Device::schedule`] does. Waiting can never deadlock: an event
    /// only covers tasks scheduled before it, and every wait is scheduled after its event.
    pub fn wait_for(&self, event: &Event) -> Result<()> {
        if event.is_complete() {
            return self.shared().take_error(&self.0.failures);
        }
        let ev = event.clone();
        self.schedule(Task::new(
            format!("wait for {}", ev.device_name()),
            move || {
                ev.wait();
                Ok(())
            },
        ))
    }

    /// Blocks until every scheduled task has finished (spinning briefly, then parking), then
    /// returns the first failure since the last report, if any.
    pub fn await_idle(&self) -> Result<()> {
        self.wait_idle();
        self.shared().take_error(&self.0.failures)
    }

    /// Blocks until every scheduled task has finished, leaving any failure to be reported by
    /// the next await or schedule.
    pub(crate) fn wait_idle(&self) {
        let sh = self.shared();
        loop {
            let s = sh.scheduled.load(Ordering::Acquire);
            sh.wait_until(s);
            if sh.completed.get() >= sh.scheduled.load(Ordering::Acquire) {
                break;
            }
        }
    }

    /// Fails if the device was released by `unsafe_cleanup` (its worker is gone).
    pub fn check_live(&self) -> Result<()> {
        if self.shared().invalid.load(Ordering::Acquire) {
            return Err(Error::Released {
                device: self.name(),
            });
        }
        Ok(())
    }

    /// Whether the device has no scheduled task left.
    pub fn is_idle(&self) -> bool {
        self.pending() == 0
    }

    /// Stops accepting work, lets the worker finish the queue, and joins it.
    pub(crate) fn release(&self) {
        let sh = self.shared();
        sh.close();
        let handle = lock(&self.0.queue.worker).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
        sh.invalid.store(true, Ordering::Release);
        sh.complete(0);
    }

    /// The physical device.
    pub fn physical(&self) -> &PhysicalDevice {
        &self.0.physical
    }

    /// The index among the virtual devices of the physical device.
    pub fn subordinal(&self) -> usize {
        self.0.subordinal
    }

    /// A unique id (used as the device of contexts).
    pub fn id(&self) -> usize {
        self.0.id
    }

    /// `backend:ordinal:subordinal`.
    pub fn name(&self) -> String {
        self.0.name.to_string()
    }

    /// The device's merge buffer.
    pub fn merge_buffer(&self) -> &MergeBuffer {
        &self.0.merge_buffer
    }

    /// The device-owned storage used by `Copy` merges, grown to at least `size` bytes.
    pub(crate) fn merge_storage(&self, size: usize) -> Result<BufferPtr> {
        let mut st = lock(&self.0.merge_storage);
        match &*st {
            Some(b) if b.size() >= size => Ok(b.clone()),
            _ => {
                let b = super::buffer::DeviceBuffer::new(size)?;
                *st = Some(b.clone());
                Ok(b)
            }
        }
    }

    /// The current size of the `Copy` merge storage, if allocated.
    pub fn merge_storage_size(&self) -> Option<usize> {
        lock(&self.0.merge_storage).as_ref().map(|b| b.size())
    }

    /// Whether the device belongs to another process (an MPI rank other than this one): work
    /// scheduled on it is skipped here, and runs in the owning process.
    pub fn is_remote(&self) -> bool {
        self.0.remote
    }

    /// The thread team running the parallel regions of the device's routines (shared by
    /// the virtual devices of a physical device); `None`: they run on one thread.
    pub fn team(&self) -> Option<&Arc<Team>> {
        self.0.queue.team.as_ref()
    }

    /// How many threads run the parallel regions of the device's routines now.
    pub fn threads(&self) -> usize {
        self.team().map_or(1, |t| t.threads())
    }

    /// Whether the device runs tasks on a worker thread.
    pub fn has_worker(&self) -> bool {
        self.0.queue.threaded && !self.shared().closed.load(Ordering::Acquire)
    }

    /// Number of tasks scheduled and not finished.
    pub fn pending(&self) -> usize {
        let sh = self.shared();
        let done = sh.completed.get();
        sh.scheduled.load(Ordering::Acquire).saturating_sub(done) as usize
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.0.id == other.0.id
    }
}
impl Eq for Device {}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({})", self.name())
    }
}
