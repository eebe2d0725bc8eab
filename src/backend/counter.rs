//! Counts that threads wait on: a device queue's finished tasks, and [`Progress`], which
//! work running on one device advances and work on other devices waits for.
//!
//! A wait first checks in a loop that yields the core (for at most a budget), then parks on a
//! condition variable; an advance wakes only the threads parked for a count it reaches.

use crate::error::{Error, Result};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a thread waiting for a count (an await, a device waiting for another device's
/// event or progress) waits without parking (see `spin_until`).
pub const DONE_SPIN: Duration = Duration::from_micros(50);

/// A wait for a count more than this far ahead of the current one parks at once instead of
/// spinning first: it is long, and a spinning waiter would take core time from the workers
/// it waits for.
pub const FAR_AHEAD: u64 = 8;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How long a wait checks without yielding first (`spin_loop` between checks).
///
/// A yield on a core shared with another process hands the core to that process for the
/// rest of its time slice, milliseconds, even when what the thread waits for comes a
/// microsecond later. Two devices training the default moons job in lockstep, one of them
/// on a core with a busy process, waited for each other at every step, and each step lost a
/// time slice: 86k samples/s against 17.9M on one device (9 interleaved runs). With this
/// pause first, the short waits of a step never yield, and the same runs gave 18.6M. On a
/// quiet machine it changed nothing measurable (19.6M and 19.2M samples/s on two devices).
/// Spinning without yielding for longer would keep the waited-for thread off a core it
/// shares with the waiter, so past this the waits yield and then park as before.
pub(crate) const PAUSE_SPIN: Duration = Duration::from_micros(20);

/// Checks `ready()` without yielding for at most [`PAUSE_SPIN`] (or `budget` if shorter);
/// returns whether it became true.
fn pause_until(budget: Duration, ready: &impl Fn() -> bool) -> bool {
    if ready() {
        return true;
    }
    let start = Instant::now();
    let limit = budget.min(PAUSE_SPIN);
    loop {
        for _ in 0..32 {
            std::hint::spin_loop();
            if ready() {
                return true;
            }
        }
        if start.elapsed() >= limit {
            return false;
        }
    }
}

/// A yield that takes longer than this handed the core to another thread.
pub(crate) const SHARED_CORE_YIELD: Duration = Duration::from_micros(20);

/// Waits for `ready()` without parking for at most `budget`: for the first [`PAUSE_SPIN`]
/// without yielding (see [`pause_until`]), then yielding the core between checks, so that a
/// thread that wants the core (perhaps the one we wait for, when there are more threads
/// than cores) runs first; on an idle core a check comes every few hundred nanoseconds.
/// Returns whether `ready()` became true.
///
/// It gives up as soon as one yield took longer than [`SHARED_CORE_YIELD`]: another thread
/// wanted the core, so it is shared, and a thread that keeps spinning there competes with it
/// for every time slice (the scheduler counts the spinning against it, so when it has work
/// again it waits behind the neighbour); parked, it preempts the neighbour when woken. On an
/// idle core a spin costs nothing but power, and spares the wake-up of a parked thread, which
/// can take milliseconds on a virtual machine. (Device waits yielded for their whole budget
/// until 6 December 2026; giving up on a shared core changed nothing measurable there: the
/// default moons job on two devices, 7 interleaved runs, 20.1M and 19.5M samples/s quiet,
/// 18.2M and 18.5M beside a busy process.)
///
/// Busy-spinning for the whole budget (`spin_loop` without yielding) was measured and
/// rejected: on a machine whose cores are shared with other processes, the thread waited for
/// is often not running, and a busy spinner keeps it off the core for the whole budget.
pub(crate) fn spin_until(budget: Duration, ready: impl Fn() -> bool) -> bool {
    if pause_until(budget, &ready) {
        return true;
    }
    let start = Instant::now();
    let mut last = start;
    loop {
        if last.duration_since(start) >= budget {
            return ready();
        }
        std::thread::yield_now();
        let now = Instant::now();
        if ready() {
            return true;
        }
        if now.duration_since(last) > SHARED_CORE_YIELD {
            return false;
        }
        last = now;
    }
}

/// A count that only grows, and the threads parked until it reaches some value.
pub(crate) struct Counter {
    count: AtomicU64,
    /// Threads waiting for the count to grow park here.
    lock: Mutex<()>,
    cv: Condvar,
    /// The smallest count a thread parked on `cv` waits for (`u64::MAX` when none): advances
    /// below it wake nobody.
    wake_at: AtomicU64,
}

impl Counter {
    pub(crate) fn new() -> Counter {
        Counter {
            count: AtomicU64::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            wake_at: AtomicU64::new(u64::MAX),
        }
    }

    /// The count now.
    pub(crate) fn get(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }

    /// Whether the count has reached `target`.
    pub(crate) fn reached(&self, target: u64) -> bool {
        self.get() >= target
    }

    /// Adds `n` and wakes the threads waiting for a count it reaches; returns the new count.
    pub(crate) fn advance(&self, n: u64) -> u64 {
        let now = self.count.fetch_add(n, Ordering::SeqCst).saturating_add(n);
        if now >= self.wake_at.load(Ordering::SeqCst) {
            // A waiter holds the lock from lowering `wake_at` until it parks: taking it here
            // means every such waiter is parked (or saw the new count), so no wakeup is lost.
            // Woken waiters that still need to wait lower `wake_at` again.
            let g = lock(&self.lock);
            self.wake_at.store(u64::MAX, Ordering::SeqCst);
            drop(g);
            self.cv.notify_all();
        }
        now
    }

    /// Blocks until the count reaches `target`: spins for at most `spin` unless the target is
    /// more than [`FAR_AHEAD`] away, then parks.
    pub(crate) fn wait_until(&self, target: u64, spin: Duration) {
        let ahead = target.saturating_sub(self.get());
        if ahead <= FAR_AHEAD && spin_until(spin, || self.reached(target)) {
            return;
        }
        self.park_until(target, None);
    }

    /// Parks until the count reaches `target` or `deadline` passes (`None`: no deadline);
    /// returns whether the count reached it.
    pub(crate) fn park_until(&self, target: u64, deadline: Option<Instant>) -> bool {
        let mut g = lock(&self.lock);
        loop {
            self.wake_at.fetch_min(target, Ordering::SeqCst);
            if self.count.load(Ordering::SeqCst) >= target {
                return true;
            }
            g = match deadline {
                None => self.cv.wait(g).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return false;
                    }
                    self.cv
                        .wait_timeout(g, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        }
    }
}

/// How far some work has got, for other work to wait on: a count that work on one device
/// advances (e.g. after each stage of a training step) and work on other devices waits for,
/// without a task boundary in between. Cheap to clone (clones share the count).
///
/// When the work advancing it fails, [`fail`](Progress::fail) wakes every waiter with an
/// error, so that nothing waits forever for a count that will never come.
#[derive(Clone)]
pub struct Progress(Arc<ProgressInner>);

struct ProgressInner {
    name: String,
    counter: Counter,
    failed: AtomicBool,
}

impl Progress {
    /// A count at 0; `name` says whose progress it is, in errors.
    pub fn new(name: impl Into<String>) -> Progress {
        Progress(Arc::new(ProgressInner {
            name: name.into(),
            counter: Counter::new(),
            failed: AtomicBool::new(false),
        }))
    }

    /// Whose progress it is.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The count now.
    pub fn count(&self) -> u64 {
        self.0.counter.get()
    }

    /// Adds one and wakes the waiters it satisfies; returns the new count.
    pub fn advance(&self) -> u64 {
        self.0.counter.advance(1)
    }

    /// Whether the count has reached `target`, or the work advancing it failed (a wait for
    /// `target` would return at once).
    pub fn settled(&self, target: u64) -> bool {
        self.0.counter.reached(target) || self.0.failed.load(Ordering::Acquire)
    }

    /// Blocks until the count reaches `target`, spinning briefly first (for waits between
    /// devices, which are short); [`Error::Task`] if the work advancing it failed.
    ///
    /// # Errors
    ///
    /// When [`fail`](Progress::fail) was called.
    pub fn wait_for(&self, target: u64) -> Result<()> {
        self.wait(target, DONE_SPIN)
    }

    /// Like [`wait_for`](Progress::wait_for), parking at once: for a thread that waits long
    /// and should leave the cores to the work it waits for (the host waiting for an epoch).
    ///
    /// # Errors
    ///
    /// When [`fail`](Progress::fail) was called.
    pub fn sleep_until(&self, target: u64) -> Result<()> {
        self.wait(target, Duration::ZERO)
    }

    /// Like [`sleep_until`](Progress::sleep_until), giving up after `timeout`: returns
    /// whether the count reached `target`. For a thread that reports progress now and then
    /// without waking at every step.
    ///
    /// # Errors
    ///
    /// When [`fail`](Progress::fail) was called.
    pub fn sleep_until_for(&self, target: u64, timeout: Duration) -> Result<bool> {
        let reached = self
            .0
            .counter
            .park_until(target, Some(Instant::now() + timeout));
        self.check(target)?;
        Ok(reached)
    }

    fn wait(&self, target: u64, spin: Duration) -> Result<()> {
        self.0.counter.wait_until(target, spin);
        self.check(target)
    }

    fn check(&self, target: u64) -> Result<()> {
        if self.0.failed.load(Ordering::Acquire) {
            return Err(Error::Task {
                task: format!("waiting for {} to reach {target}", self.0.name),
                msg: "the work advancing it failed".into(),
            });
        }
        Ok(())
    }

    /// Marks the work advancing it as failed and wakes every waiter (whose waits then fail).
    pub fn fail(&self) {
        self.0.failed.store(true, Ordering::Release);
        self.0.counter.advance(u64::MAX / 2);
    }

    /// Whether [`fail`](Progress::fail) was called.
    pub fn has_failed(&self) -> bool {
        self.0.failed.load(Ordering::Acquire)
    }
}

impl fmt::Debug for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Progress({} at {})", self.0.name, self.count())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a core shared with a busy thread, the spin gives up long before its budget; when
    /// the condition holds, it says so at once.
    #[test]
    fn a_spin_gives_up_on_a_shared_core() {
        assert!(spin_until(Duration::from_secs(5), || true));
        let Some(core) = super::super::device::allowed_core(0) else {
            return;
        };
        let stop = Arc::new(AtomicBool::new(false));
        let busy = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                super::super::device::pin_current_thread(core);
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        let took = std::thread::spawn(move || {
            super::super::device::pin_current_thread(core);
            let start = Instant::now();
            assert!(!spin_until(Duration::from_secs(5), || false));
            start.elapsed()
        })
        .join()
        .unwrap();
        stop.store(true, Ordering::Relaxed);
        busy.join().unwrap();
        assert!(
            took < Duration::from_secs(2),
            "spun {took:?} on a shared core"
        );
    }

    #[test]
    fn waiters_wake_when_the_count_is_reached_and_fail_with_the_work() {
        let p = Progress::new("stage");
        let waiter = {
            let p = p.clone();
            std::thread::spawn(move || p.sleep_until(3))
        };
        for _ in 0..3 {
            p.advance();
        }
        waiter.join().unwrap().unwrap();
        assert_eq!(p.count(), 3);
        p.wait_for(2).unwrap();
        // A timed sleep returns at the deadline without the count, at once with it.
        let t = Instant::now();
        assert!(!p.sleep_until_for(4, Duration::from_millis(30)).unwrap());
        assert!(t.elapsed() >= Duration::from_millis(30));
        assert!(p.sleep_until_for(3, Duration::from_secs(60)).unwrap());

        let far = {
            let p = p.clone();
            std::thread::spawn(move || p.wait_for(1_000))
        };
        std::thread::sleep(Duration::from_millis(20));
        p.fail();
        let e = far.join().unwrap().unwrap_err();
        assert!(e.to_string().contains("stage"), "{e}");
        assert!(p.has_failed());
    }
}
