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
    /// Makes the merge buffer hold `tn`'s data in `buf`, touching no reference count when it
    /// already does (a streaming merge from the same source every step moves no count
    /// between cores).
    pub fn set_to(&self, buf: &BufferPtr, tn: &Tnode) {
        let mut cell = self.lock();
        if !matches!(&*cell, Some((b, t)) if Arc::ptr_eq(b, buf) && t == tn) {
            *cell = Some((buf.clone(), tn.clone()));
        }
    }
    /// What the merge buffer holds.
    pub fn get(&self) -> Option<(BufferPtr, Tnode)> {
        self.lock().clone()
    }
    /// The cell, locked: a routine run holds it while it reads the buffer, instead of
    /// cloning the buffer's handle.
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Option<(BufferPtr, Tnode)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// Empties the merge buffer.
    pub fn clear(&self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// Work that a task can run many times with different static-index values (a linked
/// routine): a task holding it is a reference count and the values, with no allocation, so
/// scheduling it costs the scheduling thread no `malloc` and the device's thread no `free`.
pub(crate) trait Runnable: Send + Sync {
    /// Runs the work with these static-index values.
    fn run_with(&self, values: &[i64]) -> Result<()>;
    /// What scheduling a task of it checks first (e.g. that its context is live).
    fn check(&self) -> Result<()>;
}

/// Static-index values captured by a task: inline up to [`StaticValues::INLINE`].
#[derive(Clone, Debug)]
pub(crate) enum StaticValues {
    Inline([i64; StaticValues::INLINE], u8),
    Heap(Vec<i64>),
}

impl StaticValues {
    /// How many values are held without allocating.
    pub(crate) const INLINE: usize = 8;

    pub(crate) fn collect(values: impl IntoIterator<Item = i64>) -> StaticValues {
        let mut a = [0; Self::INLINE];
        let mut n = 0usize;
        let mut values = values.into_iter();
        for v in values.by_ref() {
            match a.get_mut(n) {
                Some(slot) => *slot = v,
                None => {
                    let mut heap = a.to_vec();
                    heap.push(v);
                    heap.extend(values);
                    return StaticValues::Heap(heap);
                }
            }
            n += 1;
        }
        StaticValues::Inline(a, n as u8)
    }

    pub(crate) fn as_slice(&self) -> &[i64] {
        match self {
            StaticValues::Inline(a, n) => &a[..usize::from(*n)],
            StaticValues::Heap(v) => v,
        }
    }
}

/// What a task runs.
enum Work {
    Once(Box<dyn FnOnce() -> Result<()> + Send>),
    Shared(Arc<dyn Runnable>, StaticValues),
}

impl Work {
    fn run(self) -> Result<()> {
        match self {
            Work::Once(f) => f(),
            Work::Shared(r, values) => r.run_with(values.as_slice()),
        }
    }
}

/// A unit of work: a description (for error messages) and a closure.
pub struct Task {
    /// What the task does, e.g. `routine forward`.
    pub description: Arc<str>,
    work: Work,
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
            work: Work::Once(Box::new(work)),
            precondition: None,
            accesses: None,
        }
    }

    /// A task running `work` with `values`, whose check is `work`'s own.
    pub(crate) fn shared(
        description: Arc<str>,
        work: Arc<dyn Runnable>,
        values: StaticValues,
    ) -> Task {
        Task {
            description,
            work: Work::Shared(work, values),
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
        let (c1, c2) = (work_check(&first), work_check(&second));
        let precondition: Option<Box<dyn Fn() -> Result<()> + Send>> = match (precondition, c1, c2)
        {
            (p, None, None) => p,
            (p, a, b) => Some(Box::new(move || {
                if let Some(p) = &p {
                    p()?;
                }
                if let Some(a) = &a {
                    a.check()?;
                }
                b.as_ref().map_or(Ok(()), |b| b.check())
            })),
        };
        Task {
            description,
            work: Work::Once(Box::new(move || {
                first.run()?;
                second.run()
            })),
            precondition,
            accesses,
        }
    }

    /// The task, first running `wait` (on the device, before the work): how the device layer
    /// makes a task wait for its hazards without a task of its own. Only for a task already
    /// checked ([`Task::check`]): the check of shared work does not carry over.
    pub(crate) fn after(mut self, wait: impl FnOnce() + Send + 'static) -> Task {
        let work = self.work;
        self.work = Work::Once(Box::new(move || {
            wait();
            work.run()
        }));
        self
    }
    /// Runs the precondition, if any.
    pub fn check(&self) -> Result<()> {
        self.precondition.as_ref().map_or(Ok(()), |c| c())?;
        match &self.work {
            Work::Shared(r, _) => r.check(),
            Work::Once(_) => Ok(()),
        }
    }
    /// Runs the task now, on this thread.
    pub fn run(self) -> Result<()> {
        self.work.run()
    }
}

/// The check of shared work (which a task wrapping it into a closure must keep).
fn work_check(w: &Work) -> Option<Arc<dyn Runnable>> {
    match w {
        Work::Shared(r, _) => Some(r.clone()),
        Work::Once(_) => None,
    }
}

impl fmt::Debug for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Task({})", self.description)
    }
}
