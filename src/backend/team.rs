//! Thread teams: the threads a device (or the no-device backend) runs its routines' parallel
//! regions on. A team is its caller (the device's worker, or whichever thread runs the
//! routine) plus helper threads, started once (when a region first needs them) and kept:
//! no thread is started per run.
//!
//! A region ([`crate::loops::ParallelLoop`]) reaches the team through the generated code's
//! `aj_parallel` (runtime header), which calls `AjTeam::run` with a chunk function and the
//! loop's range. The range is cut into chunks (at least the region's grain, about
//! [`CHUNKS_PER_THREAD`] per thread), the chunks into one contiguous share per thread, and each thread **claims the
//! chunks of its own share first, then those left in the others'** (an atomic counter per
//! share) until none is left: a thread that is descheduled (its core busy with another
//! process) simply claims fewer, and the others take the rest of its share. The shares keep
//! a thread on the same rows from one region to the next (a product's reduction blocks
//! update the same rows of `c` in turn; claimed from one shared counter, they moved between
//! the cores, and a 1000³ product took 12.1 ms on two threads instead of 11.4). The caller
//! takes chunks too, then waits for the chunks still running. Which thread runs which chunk
//! does not matter: a region's iterations are independent, so the results are the same
//! bits for any number of threads.
//!
//! Waits hand the core back: an idle helper checks for new work while yielding the core
//! for at most [`HELPER_SPIN`], then parks on a condition variable (woken when a region
//! starts); the caller waiting for the last chunks likewise yields for about two of its
//! chunks' time (between [`super::counter::DONE_SPIN`] and [`MAX_DONE_SPIN`]), then parks.
//! The spins are long because every wake-up of a parked thread costs time the region waits
//! for: about 40 µs on a 2-vCPU VM (median of 2,000 condition-variable wake-ups after 2 ms
//! idle; 78 µs at the 99th percentile, 1.3 ms at worst). But both stop at once, and park,
//! when a yield shows that another thread wanted the core
//! (`counter::spin_until`): on a core shared with another process, a
//! thread that keeps spinning is charged for it by the scheduler and then waits behind the
//! neighbour when it has work (the big moons job on one device beside a busy process fell
//! from 186k to 18k samples/s with plain 5 ms spins).
//!
//! Threads of other teams can be lent to a team ([`Team::lend_until`]): in the training's
//! exchange, a device's worker waiting for its partner's gradients takes chunks of the
//! partner's regions as a *guest*, with a share of its own, while it waits. A team that may
//! get guests ([`Team::host_guests`]) sends even its one-thread regions to `team_run`, which
//! runs them inline unless a guest is there; with one, a region is cut into
//! [`GUEST_CHUNKS_PER_THREAD`] chunks per thread, since the team's own thread is typically the
//! slow one (its core shared with another process) and the last chunk it holds is what the
//! guest waits for at the end.
//!
//! Helpers are pinned to cores when the team is given cores (`Team::set_cores`). The caller
//! need not be pinned (the no-device backend's caller is the user's thread): when a region
//! starts on the core of one of the helpers, that helper moves to the caller's own core
//! before it is woken. Otherwise it would wake on the core the caller occupies and wait there
//! for the caller to give it up, while the caller's core sat idle (measured on softmax over
//! 4096 × 1024 floats: two threads took 3.6 ms, as long as one, in most runs). The caller
//! moves helpers (`sched_setaffinity` on their thread ids) only when their core must change.

use super::counter::{spin_until, Counter, DONE_SPIN};
use std::alloc::Layout;
use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long an idle helper checks for a new region without parking, on a core it has to
/// itself (see the module documentation): long enough to span the sequential code between
/// the regions of one routine, and between runs.
pub const HELPER_SPIN: Duration = Duration::from_millis(5);

/// The longest a region's caller waits for the last chunks of other threads before parking
/// (see `team_run`).
pub const MAX_DONE_SPIN: Duration = Duration::from_millis(5);

/// About how many chunks each thread gets from a region when a guest is lent to the team
/// (see [`Team::lend_until`]). The guest waits for the team's thread, whose core is often
/// shared with another process, so the chunks are smaller than [`CHUNKS_PER_THREAD`]: the
/// last chunk that thread holds, at half speed, is what the guest waits for at the end of
/// the region. On the big moons job on two devices beside a busy process (12 interleaved
/// rounds, against one device with 4 chunks per thread), 4 chunks per thread gave 0.87×
/// one device, 16 gave 1.00× and 32 1.04×; on a quiet machine the three were within the
/// noise (1.06–1.09×).
pub const GUEST_CHUNKS_PER_THREAD: i64 = 32;

/// The longest a guest parks before it checks again whether it is done (see
/// [`Team::lend_until`]; a missed ring costs at most this).
pub const LEND_PARK: Duration = Duration::from_millis(1);

/// About how many chunks each thread gets from a region (more balance the threads when one
/// is slowed down, fewer cost less to hand out). It was 4 until 7 December 2026; on a
/// 2-vCPU AMD EPYC VM, 16 made the big moons job on one device (a team of two threads)
/// 1.08× as fast beside a busy process and 1.05× quiet (8 interleaved rounds each), and the
/// two-thread kernels of `benches/programs` (matmul 2048³, the 3×3 convolution, softmax,
/// layer norm, row sums, the fused chain) moved within the noise, quiet and busy.
pub const CHUNKS_PER_THREAD: i64 = 16;

/// No core: the thread is not pinned.
const NO_CORE: usize = usize::MAX;

/// A region's chunk function: runs iterations `lo..=hi` on thread `tid`; 0 or a status.
pub(crate) type ChunkFn = unsafe extern "C" fn(*mut c_void, i64, i64, i64) -> i32;

/// The runtime header's `aj_team_t`: what a routine's code gets to run its parallel regions
/// (same layout, checked on both sides).
#[repr(C)]
pub(crate) struct AjTeam {
    /// How many threads may take chunks (1: regions run inline).
    threads: i64,
    run: unsafe extern "C" fn(*const AjTeam, ChunkFn, *mut c_void, i64, i64, i64) -> i32,
    scratch: unsafe extern "C" fn(*const AjTeam, i64, i64) -> *mut c_void,
    /// The team's shared state (`TeamShared`), or null for no team.
    state: *const c_void,
}

const _: () = assert!(std::mem::size_of::<AjTeam>() == 8 + 3 * std::mem::size_of::<usize>());

impl AjTeam {
    /// A team of one: every region runs inline on the calling thread.
    pub(crate) fn single() -> AjTeam {
        AjTeam {
            threads: 1,
            run: team_run,
            scratch: team_scratch,
            state: std::ptr::null(),
        }
    }

    /// The pointer the entry point takes.
    pub(crate) fn as_ptr(&self) -> *const c_void {
        (self as *const AjTeam).cast()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One run of a region: its chunks and the threads working on them.
struct Job {
    f: ChunkFn,
    /// The chunk function's context (a pointer into the caller's frame, valid until the
    /// caller has seen every chunk finish).
    ctx: usize,
    from: i64,
    to: i64,
    chunk: i64,
    chunks: u64,
    /// The shares: the team's threads taking part, then the guests' (see [`Team::lend_until`]).
    threads: usize,
    /// Helpers with a smaller index take part (the caller is 0).
    own: usize,
    /// The next share a guest takes (from `own`; none is left at `threads`).
    next_guest: AtomicUsize,
    /// Per thread taking part, the next chunk to claim of its share (see [`Job::share`]).
    cursors: Vec<AtomicU64>,
    /// Chunks finished (run, or skipped after a failure).
    finished: Counter,
    /// The first non-zero status of a chunk.
    status: AtomicI32,
}

impl Job {
    /// The chunks of thread `t`'s share: the chunks cut into one contiguous run per thread.
    fn share(&self, t: usize) -> (u64, u64) {
        let (t, n) = (t as u64, self.threads as u64);
        (t * self.chunks / n, (t + 1) * self.chunks / n)
    }

    /// Claims and runs chunks until none is left, those of its own share first, then those
    /// left in the others' (a thread whose core is busy leaves its share to them); returns
    /// how many it ran.
    fn work(&self, tid: usize) -> u32 {
        let mut ran = 0;
        let n = self.threads.max(1);
        for t in (0..n).map(|o| (tid + o) % n) {
            let (first, end) = self.share(t);
            loop {
                let k = first + self.cursors[t].fetch_add(1, Ordering::AcqRel);
                if k >= end {
                    break;
                }
                ran += 1;
                self.run_chunk(k, tid);
            }
        }
        ran
    }

    /// A guest's share number, if one is left.
    fn guest_share(&self) -> Option<usize> {
        let g = self.next_guest.fetch_add(1, Ordering::AcqRel);
        (g < self.threads).then_some(g)
    }

    /// Runs chunk `k` on thread `tid` (unless a chunk failed) and counts it finished.
    fn run_chunk(&self, k: u64, tid: usize) {
        if self.status.load(Ordering::Acquire) == 0 {
            let lo = self.from + k as i64 * self.chunk;
            let hi = (lo + self.chunk - 1).min(self.to);
            // SAFETY: `f` is a chunk function of a routine that is running (its library
            // stays loaded until the run returns, which it does only after every chunk has
            // finished), `ctx` its context in the caller's frame (alive for the same reason),
            // `lo..=hi` a part of the region's range, and `tid` a thread number no other
            // thread of the run uses at once.
            let s = unsafe { (self.f)(self.ctx as *mut c_void, lo, hi, tid as i64) };
            if s != 0 {
                let _ = self
                    .status
                    .compare_exchange(0, s, Ordering::AcqRel, Ordering::Acquire);
            }
        }
        self.finished.advance(1);
    }
}

/// Where one thread of a team runs.
struct Seat {
    /// The core it should run on (`NO_CORE`: anywhere). The caller's (seat 0) is the core a
    /// helper takes over when the caller runs on the helper's.
    core: AtomicUsize,
    /// The core a helper is pinned to now (`NO_CORE`: not pinned), written by whichever
    /// thread pins it (the helper itself at its start, then the callers of regions).
    placed: AtomicUsize,
    /// A helper's thread id once it has started and pinned itself (0 before).
    tid: AtomicI32,
}

/// What a team's threads share.
struct TeamShared {
    name: String,
    /// The most threads (the caller and `max - 1` helpers).
    max: usize,
    /// How many threads take part in regions now (at least 1, at most `max`).
    active: AtomicUsize,
    /// Per thread: the caller (index 0), then the helpers.
    seats: Vec<Seat>,
    /// Regions published so far, and rings (see [`Team::ring`]): idle helpers and guests wait
    /// for it to grow.
    generation: Counter,
    /// Threads of other teams lent to this one now (see [`Team::lend_until`]).
    guests: AtomicUsize,
    /// Guests may come (see [`Team::host_guests`]): regions reach `team_run` even with one
    /// thread.
    hosting: AtomicBool,
    /// The region being run.
    job: Mutex<Option<Arc<Job>>>,
    /// A region is being run (a second one at once, from another thread, runs inline).
    busy: AtomicBool,
    closed: AtomicBool,
    /// The size of the last scratch request that failed.
    failed_bytes: AtomicU64,
    /// The helpers started so far.
    helpers: Mutex<Vec<JoinHandle<()>>>,
}

/// A thread team (see the module documentation). Dropping it stops and joins its helpers.
pub struct Team {
    shared: Arc<TeamShared>,
}

impl std::fmt::Debug for Team {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Team({}: {} of {} threads)",
            self.shared.name,
            self.threads(),
            self.shared.max
        )
    }
}

impl Team {
    /// A team of at most `max` threads (the caller and `max - 1` helpers), all taking part,
    /// unpinned; named `name` (its helpers are `name+1`, ...).
    pub(crate) fn new(name: &str, max: usize) -> Arc<Team> {
        let max = max.max(1);
        Arc::new(Team {
            shared: Arc::new(TeamShared {
                name: name.to_string(),
                max,
                active: AtomicUsize::new(max),
                seats: (0..max)
                    .map(|_| Seat {
                        core: AtomicUsize::new(NO_CORE),
                        placed: AtomicUsize::new(NO_CORE),
                        tid: AtomicI32::new(0),
                    })
                    .collect(),
                generation: Counter::new(),
                guests: AtomicUsize::new(0),
                hosting: AtomicBool::new(false),
                job: Mutex::new(None),
                busy: AtomicBool::new(false),
                closed: AtomicBool::new(false),
                failed_bytes: AtomicU64::new(0),
                helpers: Mutex::new(vec![]),
            }),
        })
    }

    /// How many threads take part in regions now.
    pub fn threads(&self) -> usize {
        self.shared.active.load(Ordering::Acquire)
    }

    /// The most threads the team can have.
    pub fn max_threads(&self) -> usize {
        self.shared.max
    }

    /// The threads that take part from now on, by their cores: `cores[0]` is the caller's
    /// (not pinned here), `cores[k]` helper `k`'s (`None`: unpinned). At most `max` are used,
    /// at least one.
    pub(crate) fn set_cores(&self, cores: &[Option<usize>]) {
        let n = cores.len().clamp(1, self.shared.max);
        for (k, c) in cores.iter().enumerate().take(n) {
            self.shared.seats[k]
                .core
                .store(c.unwrap_or(NO_CORE), Ordering::Release);
        }
        self.shared.active.store(n, Ordering::Release);
    }

    /// The cores of the threads taking part now (the caller's first), as last set (`None`:
    /// unpinned).
    pub fn cores(&self) -> Vec<Option<usize>> {
        self.shared.seats[..self.threads()]
            .iter()
            .map(|seat| {
                let c = seat.core.load(Ordering::Acquire);
                (c != NO_CORE).then_some(c)
            })
            .collect()
    }

    /// The team as the generated code takes it, for one run on the calling thread.
    pub(crate) fn view(&self) -> AjTeam {
        let threads = self.threads();
        let hosting = self.shared.hosting.load(Ordering::Acquire);
        AjTeam {
            // With guests possible, a team of one thread says two, so that the generated
            // code hands its regions to `team_run`, which runs them inline without guests.
            threads: if hosting { threads.max(2) } else { threads } as i64,
            run: team_run,
            scratch: team_scratch,
            state: Arc::as_ptr(&self.shared).cast(),
        }
    }

    /// Lets threads of other teams take chunks of this team's regions from now on (see
    /// [`Team::lend_until`]).
    pub(crate) fn host_guests(&self) {
        self.shared.hosting.store(true, Ordering::Release);
    }

    /// Lends the calling thread (another team's: a device's worker waiting for this team's
    /// device) to this team until `done()`: it takes chunks of the regions this team runs
    /// meanwhile, as a guest with a share of its own, and otherwise waits for the next
    /// region, yielding its core (see [`spin_until`]) and then parking. Returns how many
    /// chunks it ran. A region that starts while a guest is lent is cut for one more thread,
    /// into [`GUEST_CHUNKS_PER_THREAD`] chunks per thread (the results are the same bits for
    /// any number of threads and chunks). Wake the guest with [`Team::ring`] when `done()`
    /// becomes true; it also checks every [`LEND_PARK`].
    ///
    /// The caller must not be running a region of this team, nor hold one of its chunks.
    pub(crate) fn lend_until(&self, done: &dyn Fn() -> bool) -> u64 {
        if done() {
            return 0;
        }
        let s = &self.shared;
        let mut ran = 0;
        s.guests.fetch_add(1, Ordering::SeqCst);
        loop {
            // The generation before `done()`: a ring after the check ends the park below.
            let seen = s.generation.get();
            if done() || s.closed.load(Ordering::Acquire) {
                break;
            }
            let job = lock(&s.job).clone();
            if let Some((job, share)) = job.and_then(|j| j.guest_share().map(|g| (j, g))) {
                ran += u64::from(job.work(share));
                continue;
            }
            if !spin_until(HELPER_SPIN, || done() || s.generation.reached(seen + 1)) {
                s.generation
                    .park_until(seen + 1, Some(std::time::Instant::now() + LEND_PARK));
            }
        }
        s.guests.fetch_sub(1, Ordering::SeqCst);
        ran
    }

    /// Wakes the guests lent to this team (see [`Team::lend_until`]) to check whether they
    /// are done: call it after making their `done()` true. Costs nothing without guests.
    pub(crate) fn ring(&self) {
        if self.shared.guests.load(Ordering::SeqCst) > 0 {
            self.shared.generation.advance(1);
        }
    }

    /// The size of the last request for scratch memory that could not be met.
    pub(crate) fn failed_bytes(&self) -> u64 {
        self.shared.failed_bytes.load(Ordering::Acquire)
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.generation.advance(1);
        let helpers = std::mem::take(&mut *lock(&self.shared.helpers));
        for h in helpers {
            // A helper never runs the team's drop (it holds no `Team`), so this never joins
            // the current thread.
            let _ = h.join();
        }
    }
}

impl TeamShared {
    /// Starts helpers up to `threads - 1` of them (fewer when a thread cannot be started).
    fn ensure_helpers(self: &Arc<TeamShared>, threads: usize) -> usize {
        let mut helpers = lock(&self.helpers);
        while helpers.len() + 1 < threads {
            let index = helpers.len() + 1;
            let shared = self.clone();
            let seen = self.generation.get();
            let spawned = std::thread::Builder::new()
                .name(format!("{}+{index}", self.name))
                .stack_size(super::device::WORKER_STACK_BYTES)
                .spawn(move || helper(shared, index, seen));
            match spawned {
                Ok(h) => helpers.push(h),
                Err(e) => {
                    tracing::warn!(
                        target: "arrayjit::backend",
                        "could not start helper thread {index} of {}: {e}",
                        self.name
                    );
                    break;
                }
            }
        }
        helpers.len() + 1
    }
}

/// A helper's life: pins itself to its core, then waits for regions and takes chunks of
/// those it takes part in (the callers of regions move it to another core when needed, see
/// [`TeamShared::place_helpers`]).
fn helper(shared: Arc<TeamShared>, index: usize, mut seen: u64) {
    let seat = &shared.seats[index];
    let want = seat.core.load(Ordering::Acquire);
    if want != NO_CORE && super::device::pin_thread(0, want) {
        seat.placed.store(want, Ordering::Release);
    }
    seat.tid
        .store(super::device::current_tid(), Ordering::Release);
    loop {
        if !spin_until(HELPER_SPIN, || shared.generation.reached(seen + 1)) {
            shared.generation.park_until(seen + 1, None);
        }
        if shared.closed.load(Ordering::Acquire) {
            return;
        }
        seen = shared.generation.get();
        let job = lock(&shared.job).clone();
        let Some(job) = job else { continue };
        if index >= job.own {
            continue;
        }
        job.work(index);
    }
}

impl TeamShared {
    /// Before a region wakes helpers `1..threads`: pins each started helper to its core, or
    /// to the caller's core (seat 0's) when the caller runs on the helper's core now.
    /// Only the one thread running a region (see `busy`) calls this.
    fn place_helpers(&self, threads: usize) {
        let caller = self.seats[0].core.load(Ordering::Acquire);
        let now = super::device::current_cpu().unwrap_or(NO_CORE);
        for k in 1..threads.min(self.max) {
            let seat = &self.seats[k];
            let mut want = seat.core.load(Ordering::Acquire);
            if want == NO_CORE {
                continue;
            }
            if want == now && caller != NO_CORE {
                want = caller;
            }
            let tid = seat.tid.load(Ordering::Acquire);
            if tid != 0
                && seat.placed.load(Ordering::Acquire) != want
                && super::device::pin_thread(tid, want)
            {
                seat.placed.store(want, Ordering::Release);
            }
        }
    }
}

/// `aj_team_t.run`: runs a region's chunks on the team (see the module documentation).
unsafe extern "C" fn team_run(
    team: *const AjTeam,
    f: ChunkFn,
    ctx: *mut c_void,
    from: i64,
    to: i64,
    grain: i64,
) -> i32 {
    let inline = || {
        // SAFETY: the caller's chunk function and context, over the whole range, on thread 0.
        unsafe { f(ctx, from, to, 0) }
    };
    if team.is_null() || to < from {
        return if to < from { 0 } else { inline() };
    }
    // SAFETY: `team` points to the `AjTeam` the routine's run passed to the entry point,
    // alive for the run (the generated code passes it on unchanged).
    let team = unsafe { &*team };
    if team.state.is_null() {
        return inline();
    }
    // SAFETY: a non-null `state` is the `TeamShared` of a `Team` the run holds (see
    // `Team::view`), alive for the run.
    let shared = unsafe { &*team.state.cast::<TeamShared>() };
    let guests = shared.guests.load(Ordering::SeqCst);
    let own_wanted = shared
        .active
        .load(Ordering::Acquire)
        .min(team.threads as usize)
        .clamp(1, shared.max);
    if own_wanted <= 1 && guests == 0 {
        return inline();
    }
    if shared.busy.swap(true, Ordering::AcqRel) {
        // Another thread is running a region on this team: run this one alone.
        return inline();
    }
    let n = to - from + 1;
    let wanted = (own_wanted + guests) as i64;
    let per = if guests > 0 {
        GUEST_CHUNKS_PER_THREAD
    } else {
        CHUNKS_PER_THREAD
    };
    let chunk = grain.max(1).max((n + wanted * per - 1) / (wanted * per));
    let chunks = ((n + chunk - 1) / chunk) as u64;
    if chunks <= 1 {
        shared.busy.store(false, Ordering::Release);
        return inline();
    }
    // SAFETY: `shared` lives in an `Arc` (see `Team::view`); taking a new reference to it
    // for the helpers started here keeps it alive as long as they run.
    let arc = unsafe {
        Arc::increment_strong_count(team.state.cast::<TeamShared>());
        Arc::from_raw(team.state.cast::<TeamShared>())
    };
    let own = arc.ensure_helpers(own_wanted).min(own_wanted);
    drop(arc);
    let threads = (own + guests).min(chunks as usize);
    let own = own.min(threads);
    let job = Arc::new(Job {
        f,
        ctx: ctx as usize,
        from,
        to,
        chunk,
        chunks,
        threads,
        own,
        next_guest: AtomicUsize::new(own),
        cursors: (0..threads).map(|_| AtomicU64::new(0)).collect(),
        finished: Counter::new(),
        status: AtomicI32::new(0),
    });
    shared.place_helpers(own);
    *lock(&shared.job) = Some(job.clone());
    shared.generation.advance(1);
    let start = std::time::Instant::now();
    let ran = job.work(0);
    // The chunks still running end within about one chunk's time: wait that long (twice the
    // caller's mean chunk, at most MAX_DONE_SPIN) before parking, since waking a parked thread
    // costs tens of microseconds, and now and then milliseconds (see the module docs).
    let mean = start.elapsed() / ran.max(1);
    let budget = (mean * 2).clamp(DONE_SPIN, MAX_DONE_SPIN);
    if !spin_until(budget, || job.finished.reached(chunks)) {
        job.finished.park_until(chunks, None);
    }
    *lock(&shared.job) = None;
    shared.busy.store(false, Ordering::Release);
    job.status.load(Ordering::Acquire)
}

/// Per-thread scratch memory for the large private arrays of regions: one block, grown as
/// needed, freed when the thread ends.
struct Scratch {
    ptr: *mut u8,
    layout: Option<Layout>,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(l) = self.layout {
            // SAFETY: `ptr` was allocated with `layout` and not freed since.
            unsafe { std::alloc::dealloc(self.ptr, l) };
        }
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = const {
        RefCell::new(Scratch {
            ptr: std::ptr::null_mut(),
            layout: None,
        })
    };
}

/// The alignment of scratch blocks (a cache line, and every vector).
const SCRATCH_ALIGN: usize = 64;

/// `aj_team_t.scratch`: the calling thread's scratch block, grown to `bytes` (null when it
/// cannot be).
unsafe extern "C" fn team_scratch(team: *const AjTeam, _tid: i64, bytes: i64) -> *mut c_void {
    let got = usize::try_from(bytes).ok().and_then(|bytes| {
        SCRATCH
            .try_with(|s| {
                let mut s = s.try_borrow_mut().ok()?;
                if s.layout.is_some_and(|l| l.size() >= bytes.max(1)) {
                    return Some(s.ptr);
                }
                let layout = Layout::from_size_align(bytes.max(1), SCRATCH_ALIGN).ok()?;
                // SAFETY: `layout` has a non-zero size.
                let p = unsafe { std::alloc::alloc(layout) };
                if p.is_null() {
                    return None;
                }
                if let Some(old) = s.layout.take() {
                    // SAFETY: the old block was allocated with `old` and is replaced now (a
                    // chunk asks once, before it uses the block).
                    unsafe { std::alloc::dealloc(s.ptr, old) };
                }
                s.ptr = p;
                s.layout = Some(layout);
                Some(p)
            })
            .ok()
            .flatten()
    });
    match got {
        Some(p) => p.cast(),
        None => {
            if !team.is_null() {
                // SAFETY: as in `team_run`.
                let t = unsafe { &*team };
                if !t.state.is_null() {
                    // SAFETY: as in `team_run`.
                    let shared = unsafe { &*t.state.cast::<TeamShared>() };
                    shared
                        .failed_bytes
                        .store(bytes.max(0) as u64, Ordering::Release);
                }
            }
            std::ptr::null_mut()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// Adds `i` to cell `i` of the context's array for every iteration, and counts the
    /// chunks each thread ran.
    unsafe extern "C" fn mark(ctx: *mut c_void, lo: i64, hi: i64, tid: i64) -> i32 {
        // SAFETY: the tests pass a `Marks`.
        let m = unsafe { &*(ctx as *const Marks) };
        for i in lo..=hi {
            m.cells[i as usize].fetch_add(i as u64 + 1, Ordering::Relaxed);
        }
        m.by_thread[tid as usize].fetch_add(1, Ordering::Relaxed);
        if m.fail_at.is_some_and(|f| (lo..=hi).contains(&f)) {
            return 7;
        }
        0
    }

    struct Marks {
        cells: Vec<AtomicU64>,
        by_thread: Vec<AtomicU64>,
        fail_at: Option<i64>,
    }

    fn marks(n: usize, fail_at: Option<i64>) -> Marks {
        Marks {
            cells: (0..n).map(|_| AtomicU64::new(0)).collect(),
            by_thread: (0..16).map(|_| AtomicU64::new(0)).collect(),
            fail_at,
        }
    }

    #[test]
    fn every_iteration_runs_once_on_any_team() {
        for threads in [1, 2, 3, 8] {
            let team = Team::new("test", threads);
            for (from, to, grain) in [(0, 999, 1), (5, 6, 1), (3, 3, 1), (0, 99, 40)] {
                let m = marks(1000, None);
                let view = team.view();
                // SAFETY: `mark` and its `Marks` as above; `view` outlives the call.
                let s = unsafe {
                    (view.run)(
                        &view,
                        mark,
                        &m as *const Marks as *mut c_void,
                        from,
                        to,
                        grain,
                    )
                };
                assert_eq!(s, 0);
                for (i, c) in m.cells.iter().enumerate() {
                    let want = if (from..=to).contains(&(i as i64)) {
                        i as u64 + 1
                    } else {
                        0
                    };
                    assert_eq!(
                        c.load(Ordering::Relaxed),
                        want,
                        "{threads} threads, cell {i}"
                    );
                }
                // No thread number at or past the team's size.
                let used: u64 = m.by_thread[threads..]
                    .iter()
                    .map(|c| c.load(Ordering::Relaxed))
                    .sum();
                assert_eq!(used, 0);
            }
        }
    }

    #[test]
    fn a_failing_chunk_stops_the_region_and_its_status_comes_back() {
        let team = Team::new("test", 3);
        let m = marks(10_000, Some(17));
        let view = team.view();
        // SAFETY: as above.
        let s = unsafe { (view.run)(&view, mark, &m as *const Marks as *mut c_void, 0, 9_999, 1) };
        assert_eq!(s, 7);
    }

    #[test]
    fn fewer_threads_take_part_after_set_cores() {
        let team = Team::new("test", 4);
        team.set_cores(&[None, None]);
        assert_eq!(team.threads(), 2);
        let m = marks(4000, None);
        let view = team.view();
        // SAFETY: as above.
        let s = unsafe { (view.run)(&view, mark, &m as *const Marks as *mut c_void, 0, 3999, 1) };
        assert_eq!(s, 0);
        assert!(m.by_thread[2..]
            .iter()
            .all(|c| c.load(Ordering::Relaxed) == 0));
        assert!(lock(&team.shared.helpers).len() <= 1);
    }

    /// A helper pinned to the core the caller runs on moves to the caller's own core (in a
    /// thread of its own, so that pinning it changes nothing else in the test process).
    #[test]
    fn a_helper_on_the_callers_core_moves_to_the_callers_own() {
        let (Some(a), Some(b)) = (
            super::super::device::allowed_core(0),
            super::super::device::allowed_core(1),
        ) else {
            return;
        };
        if a == b {
            // One allowed core: nothing to move to.
            return;
        }
        std::thread::spawn(move || {
            super::super::device::pin_current_thread(b);
            let team = Team::new("test", 2);
            team.set_cores(&[Some(a), Some(b)]);
            let region = || {
                let m = marks(4000, None);
                let view = team.view();
                // SAFETY: as above.
                let s = unsafe {
                    (view.run)(&view, mark, &m as *const Marks as *mut c_void, 0, 3999, 1)
                };
                assert_eq!(s, 0);
                assert!(m.cells.iter().all(|c| c.load(Ordering::Relaxed) > 0));
            };
            // The first region starts the helper, which pins itself to its own core `b`
            // before it says its thread id; a region that knows the id moves it to `a` (the
            // first one already, when the helper was that quick, otherwise the next).
            region();
            let start = std::time::Instant::now();
            while team.shared.seats[1].tid.load(Ordering::Acquire) == 0 {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "the helper never started"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            region();
            assert_eq!(team.shared.seats[1].placed.load(Ordering::Acquire), a);
        })
        .join()
        .unwrap();
    }

    /// A thread lent to a team of one takes chunks of its regions, every iteration runs once,
    /// and it leaves when told.
    #[test]
    fn a_lent_thread_takes_chunks_of_a_team_of_one() {
        unsafe extern "C" fn slow(ctx: *mut c_void, lo: i64, hi: i64, tid: i64) -> i32 {
            std::thread::sleep(Duration::from_micros(200));
            // SAFETY: as `mark`'s.
            unsafe { mark(ctx, lo, hi, tid) }
        }
        let host = Team::new("host", 1);
        host.host_guests();
        let view = host.view();
        assert_eq!(
            view.threads, 2,
            "a hosting team sends its regions to team_run"
        );
        let stop = Arc::new(AtomicBool::new(false));
        let guest = {
            let (host, stop) = (Arc::clone(&host), stop.clone());
            std::thread::spawn(move || host.lend_until(&|| stop.load(Ordering::Acquire)))
        };
        let start = std::time::Instant::now();
        while host.shared.guests.load(Ordering::SeqCst) == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the guest never came"
            );
            std::thread::yield_now();
        }
        let m = marks(640, None);
        // SAFETY: as above.
        let s = unsafe { (view.run)(&view, slow, &m as *const Marks as *mut c_void, 0, 639, 1) };
        assert_eq!(s, 0);
        for (i, c) in m.cells.iter().enumerate() {
            assert_eq!(c.load(Ordering::Relaxed), i as u64 + 1, "cell {i}");
        }
        // 64 chunks of 200 µs or more: the guest, waiting for regions, takes some.
        let by_guest = m.by_thread[1].load(Ordering::Relaxed);
        let by_host = m.by_thread[0].load(Ordering::Relaxed);
        assert_eq!(by_guest + by_host, 64);
        assert!(by_guest > 0, "the guest ran no chunk");
        stop.store(true, Ordering::Release);
        host.ring();
        assert_eq!(guest.join().unwrap(), by_guest);
        assert_eq!(host.shared.guests.load(Ordering::SeqCst), 0);
        // Without guests, a region of the team of one runs inline.
        let m = marks(640, None);
        // SAFETY: as above.
        let s = unsafe { (view.run)(&view, mark, &m as *const Marks as *mut c_void, 0, 639, 1) };
        assert_eq!(s, 0);
        assert_eq!(m.by_thread[0].load(Ordering::Relaxed), 1);
    }

    #[test]
    fn scratch_is_aligned_and_grows() {
        let view = AjTeam::single();
        // SAFETY: a plain request on this thread.
        let a = unsafe { (view.scratch)(&view, 0, 100) } as usize;
        assert!(a != 0 && a.is_multiple_of(SCRATCH_ALIGN));
        // SAFETY: as above.
        let b = unsafe { (view.scratch)(&view, 0, 50) } as usize;
        assert_eq!(a, b, "a smaller request reuses the block");
        // SAFETY: as above.
        let c = unsafe { (view.scratch)(&view, 0, 1 << 20) } as usize;
        assert!(c != 0 && c.is_multiple_of(SCRATCH_ALIGN));
        // SAFETY: as above; an impossible size fails.
        let d = unsafe { (view.scratch)(&view, 0, -1) };
        assert!(d.is_null());
    }
}
