//! Devices: a physical device is a CPU core (multicore) or the calling thread (sync); a
//! virtual device owns a FIFO queue of tasks and, on the multicore backend, a worker thread
//! that runs them, plus a merge buffer.

use super::buffer::BufferPtr;
use super::cc::{MergeBuffer, Task};
use crate::error::{Error, Result};
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// How many tasks a device queue holds before `schedule` blocks (back-pressure).
pub const QUEUE_CAPACITY: usize = 1024;

/// The stack size of device worker threads: generated routines keep at most
/// [`crate::codegen::MAX_FRAME_BYTES`] of local arrays on the stack, so this leaves ample room
/// for the task machinery and libm.
pub const WORKER_STACK_BYTES: usize = 8 << 20;

pub(crate) static NEXT_DEVICE: AtomicUsize = AtomicUsize::new(1);

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

#[derive(Default)]
struct QueueState {
    /// Tasks scheduled and not yet finished.
    pending: usize,
    /// The first failure since the last await or schedule reported one.
    error: Option<Error>,
    /// Set by `unsafe_cleanup`.
    invalid: bool,
}

/// The part of a device its worker thread shares (not the whole device, so that dropping the
/// last handle drops the sender and ends the worker).
#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
    idle: Condvar,
}

impl Queue {
    fn work(&self, rx: Receiver<Task>) {
        // The loop ends when the sender is dropped (unsafe_cleanup, or the device is dropped).
        while let Ok(task) = rx.recv() {
            let result = run_captured(task);
            let mut st = lock(&self.state);
            if let Err(e) = result {
                st.error.get_or_insert(e);
            }
            st.pending -= 1;
            if st.pending == 0 {
                self.idle.notify_all();
            }
        }
    }
}

struct Inner {
    id: usize,
    physical: PhysicalDevice,
    subordinal: usize,
    merge_buffer: MergeBuffer,
    /// The device-owned storage that `Copy` merges copy into; grows as needed.
    merge_storage: Mutex<Option<BufferPtr>>,
    queue: Arc<Queue>,
    sender: Mutex<Option<SyncSender<Task>>>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

/// A virtual device: a queue of tasks (run by a worker thread on the multicore backend, at
/// once on the sync backend) and a merge buffer. Cheap to clone.
#[derive(Clone)]
pub struct Device(Arc<Inner>);

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
            task: description,
            msg: e.to_string(),
        }),
        Err(p) => Err(Error::Task {
            task: description,
            msg: format!("panicked: {}", panic_message(p.as_ref())),
        }),
    }
}

impl Device {
    /// A device whose tasks run on a dedicated worker thread.
    pub(crate) fn with_worker(physical: PhysicalDevice, subordinal: usize) -> Result<Device> {
        let (tx, rx) = sync_channel::<Task>(QUEUE_CAPACITY);
        let dev = Device::new(physical, subordinal, Some(tx));
        let queue = dev.0.queue.clone();
        let handle = std::thread::Builder::new()
            .name(dev.name())
            .stack_size(WORKER_STACK_BYTES)
            .spawn(move || queue.work(rx))
            .map_err(|e| Error::io("starting a device worker thread", e))?;
        *lock(&dev.0.worker) = Some(handle);
        Ok(dev)
    }

    /// A device whose tasks run at once on the scheduling thread.
    pub(crate) fn synchronous(physical: PhysicalDevice, subordinal: usize) -> Device {
        Device::new(physical, subordinal, None)
    }

    fn new(
        physical: PhysicalDevice,
        subordinal: usize,
        sender: Option<SyncSender<Task>>,
    ) -> Device {
        Device(Arc::new(Inner {
            id: NEXT_DEVICE.fetch_add(1, Ordering::Relaxed),
            physical,
            subordinal,
            merge_buffer: MergeBuffer::new(),
            merge_storage: Mutex::new(None),
            queue: Arc::new(Queue::default()),
            sender: Mutex::new(sender),
            worker: Mutex::new(None),
        }))
    }

    fn take_error(&self, st: &mut QueueState) -> Result<()> {
        if st.invalid {
            return Err(Error::Usage(format!(
                "device {} was released by unsafe_cleanup",
                self.name()
            )));
        }
        match st.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Enqueues a task (on the sync backend: runs it now). Returns the error of an earlier
    /// failed task on this device, if any, instead of scheduling. Blocks while the queue is
    /// full.
    pub fn schedule(&self, task: Task) -> Result<()> {
        let sender = {
            let mut st = lock(&self.0.queue.state);
            self.take_error(&mut st)?;
            let sender = lock(&self.0.sender).clone();
            if sender.is_some() {
                st.pending += 1;
            }
            sender
        };
        match sender {
            None => run_captured(task),
            Some(tx) => tx.send(task).map_err(|_| {
                let mut st = lock(&self.0.queue.state);
                st.pending -= 1;
                Error::Usage(format!("device {} has no worker (released?)", self.name()))
            }),
        }
    }

    /// Blocks until every scheduled task has finished (without busy-waiting), then returns
    /// the first failure since the last report, if any.
    pub fn await_idle(&self) -> Result<()> {
        let mut st = lock(&self.0.queue.state);
        while st.pending > 0 {
            st = self
                .0
                .queue
                .idle
                .wait(st)
                .unwrap_or_else(|p| p.into_inner());
        }
        self.take_error(&mut st)
    }

    /// Whether the device has no scheduled task left.
    pub fn is_idle(&self) -> bool {
        lock(&self.0.queue.state).pending == 0
    }

    /// Stops accepting work, lets the worker finish the queue, and joins it.
    pub(crate) fn release(&self) {
        lock(&self.0.sender).take();
        let handle = lock(&self.0.worker).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
        let mut st = lock(&self.0.queue.state);
        st.invalid = true;
        st.pending = 0;
        self.0.queue.idle.notify_all();
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
        format!(
            "{}:{}:{}",
            self.0.physical.backend, self.0.physical.ordinal, self.0.subordinal
        )
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
                let b = super::buffer::Buffer::new(size)?;
                *st = Some(b.clone());
                Ok(b)
            }
        }
    }

    /// The current size of the `Copy` merge storage, if allocated.
    pub fn merge_storage_size(&self) -> Option<usize> {
        lock(&self.0.merge_storage).as_ref().map(|b| b.size())
    }

    /// Whether the device runs tasks on a worker thread.
    pub fn has_worker(&self) -> bool {
        lock(&self.0.sender).is_some()
    }

    /// Number of tasks scheduled and not finished.
    pub fn pending(&self) -> usize {
        lock(&self.0.queue.state).pending
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
