//! Units of work and merge-buffer cells: what the no-device backend and the devices share
//! (kept apart from both, so that neither imports the other).

use super::buffer::BufferPtr;
use crate::error::Result;
use crate::ir::Tnode;
use std::fmt;
use std::sync::{Arc, Mutex};

/// A merge buffer cell: which node's buffer a device's merge buffer currently holds.
#[derive(Clone, Default)]
pub struct MergeBuffer(Arc<Mutex<Option<(BufferPtr, Tnode)>>>);

impl MergeBuffer {
    /// An empty merge buffer.
    pub fn new() -> MergeBuffer {
        MergeBuffer::default()
    }
    /// Makes the merge buffer hold `tn`'s data in `buf`.
    pub fn set(&self, buf: BufferPtr, tn: Tnode) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some((buf, tn));
    }
    /// What the merge buffer holds.
    pub fn get(&self) -> Option<(BufferPtr, Tnode)> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    /// Empties the merge buffer.
    pub fn clear(&self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// A unit of work: a description (for error messages) and a closure.
pub struct Task {
    /// What the task does, e.g. `routine forward`.
    pub description: Arc<str>,
    work: Box<dyn FnOnce() -> Result<()> + Send>,
    /// Checked when the task is scheduled: an error here is returned by `schedule` instead of
    /// queueing the task (a routine's task checks that its context was not finalized).
    precondition: Option<Box<dyn Fn() -> Result<()> + Send>>,
    /// The buffers the task reads (`false`) and writes (`true`), for the device layer's
    /// hazard tracking; empty for tasks that declare nothing.
    pub(crate) accesses: Option<Arc<[(BufferPtr, bool)]>>,
}

impl Task {
    /// A task from a closure.
    pub fn new(
        description: impl Into<Arc<str>>,
        work: impl FnOnce() -> Result<()> + Send + 'static,
    ) -> Task {
        Task {
            description: description.into(),
            work: Box::new(work),
            precondition: None,
            accesses: None,
        }
    }
    /// The task, declaring the buffers it reads (`false`) and writes (`true`): scheduling it
    /// on a device first makes the device wait for tasks of other devices that write them
    /// (or, for the ones it writes, read them) and were scheduled before (see
    /// `Device::schedule`).
    pub fn with_accesses(mut self, accesses: impl Into<Arc<[(BufferPtr, bool)]>>) -> Task {
        let accesses = accesses.into();
        self.accesses = (!accesses.is_empty()).then_some(accesses);
        self
    }
    /// The task with a check that scheduling it runs first (and fails with).
    pub fn with_precondition(mut self, check: impl Fn() -> Result<()> + Send + 'static) -> Task {
        self.precondition = Some(Box::new(check));
        self
    }
    /// One task doing this task's work, then `next`'s (unless this one fails): it declares
    /// the accesses of both and checks both preconditions. Saves a task's scheduling when
    /// two always run back to back on one device, such as a transfer into the merge buffer
    /// and the routine that reads it.
    pub fn then(self, next: Task) -> Task {
        let description: Arc<str> =
            format!("{}, then {}", self.description, next.description).into();
        let accesses = match (self.accesses, next.accesses) {
            (None, b) => b,
            (a, None) => a,
            (Some(a), Some(b)) => Some(a.iter().chain(b.iter()).cloned().collect()),
        };
        let precondition: Option<Box<dyn Fn() -> Result<()> + Send>> =
            match (self.precondition, next.precondition) {
                (None, b) => b,
                (a, None) => a,
                (Some(a), Some(b)) => Some(Box::new(move || {
                    a()?;
                    b()
                })),
            };
        let (first, second) = (self.work, next.work);
        Task {
            description,
            work: Box::new(move || {
                first()?;
                second()
            }),
            precondition,
            accesses,
        }
    }

    /// The task, first running `wait` (on the device, before the work): how the device layer
    /// makes a task wait for its hazards without a task of its own.
    pub(crate) fn after(mut self, wait: impl FnOnce() + Send + 'static) -> Task {
        let work = self.work;
        self.work = Box::new(move || {
            wait();
            work()
        });
        self
    }
    /// Runs the precondition, if any.
    pub fn check(&self) -> Result<()> {
        self.precondition.as_ref().map_or(Ok(()), |c| c())
    }
    /// Runs the task now, on this thread.
    pub fn run(self) -> Result<()> {
        (self.work)()
    }
}

impl fmt::Debug for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Task({})", self.description)
    }
}
