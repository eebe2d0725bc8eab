//! The schedules that run the whole training as one program per device queue: the exchange
//! and the tree (see the [module documentation](super#schedules)). The host schedules one task
//! per queue; queues wait for each other through [`Progress`] counts, without task boundaries.

use super::plan::{part, MergeWork};
use crate::backend::{BufferPtr, Progress, Routine, Team, Transfer};
use crate::error::{Error, Result};
use crate::ir::{StaticSymbol, Tnode};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The exchange: the training as one program per device queue, used on one rank when the
/// devices on each queue form aligned blocks of the same size, a power of two, and their
/// number is a power of two too (each device on a queue of its own; blocks of consecutive
/// devices per core; every device on one queue on the sync backend).
///
/// Per step, every queue computes its devices' gradients, adds them up in a tree into its
/// first device (the *leader*), then the leaders exchange partial sums by recursive
/// doubling: in round `r` (stride `2^(r-1)` groups) a leader adds its partner's partial sum
/// to its own. Every leader then holds the sum of all the gradients and applies the same
/// update; the other devices of its queue copy the leader's parameters. The sums have the
/// tree's association (a block's tree, then each round adds two sums of the same blocks,
/// with `a + b == b + a` exactly), so the results are the tree's, bit for bit, whatever the
/// grouping.
///
/// Leaders read each other's sums without copying them (`Streaming`) or through their merge
/// buffers (`Copy`). A round writes a tensor of its own, read only by the next round's
/// partner, and every tensor a partner reads has two rows, row `s % 2` at step `s`: a
/// leader overwrites a row only two steps later, after waiting for its partner's next-step
/// value, which the partner computes after reading. So each round needs one wait, for the
/// partner's previous stage, and no write-after-read waits.
pub(crate) struct Exchange {
    pub(crate) slot: StaticSymbol,
    pub(crate) step: StaticSymbol,
    pub(crate) parity: StaticSymbol,
    /// Per device, the gradient routine.
    pub(crate) grads: Vec<Routine>,
    pub(crate) groups: Vec<Group>,
}

/// The devices of one queue in the exchange.
pub(crate) struct Group {
    /// Consecutive devices, the leader first.
    pub(crate) members: Vec<usize>,
    /// The tree into the leader, in order.
    pub(crate) local: Vec<Merge>,
    /// The leader's rounds with the other groups' leaders.
    pub(crate) rounds: Vec<Merge>,
    /// The leader's update, with the last round before it in one routine (without rounds,
    /// the copy of the leader's row as the merged sum).
    pub(crate) update: Routine,
    /// The parameters from the leader to the other members.
    pub(crate) copies: Vec<(String, Transfer)>,
    /// The thread team running the regions of the queue's routines: a leader waiting for
    /// this group's stage lends its thread to it (see [`Exchange::wait_for_group`]).
    pub(crate) team: Option<Arc<Team>>,
}

/// One merge of the exchange: the transfer of `from`'s sum into the merge buffer of the
/// device running `routine`, which adds it to its own.
pub(crate) struct Merge {
    /// The group whose progress to wait for (rounds only).
    pub(crate) from_group: usize,
    pub(crate) description: String,
    pub(crate) transfer: Transfer,
    pub(crate) routine: Routine,
}

impl Exchange {
    /// Runs the whole training of group `gi` (the devices of one queue), as one task on that
    /// queue: for each step, the members' gradients, the tree into the leader, the leader's
    /// rounds (each waiting for the partner's previous stage through its [`Progress`]), the
    /// update, and the parameter copies. `progress[g]` counts group `g`'s finished stages
    /// (`rounds + 1` per step); group 0 also copies the loss history to the host at the end
    /// of each epoch and advances `epochs`. On any failure (or panic) every count fails, so
    /// that no queue and not the host waits forever.
    fn run_group(&self, run: &Run, gi: usize) -> Result<()> {
        let mut exit = FailOnExit(run, false);
        let g = &self.groups[gi];
        let n_dev = self.grads.len();
        let stages = g.rounds.len() as u64 + 1;
        let with_parity = |r: &Routine, parity: i64| -> Result<()> {
            r.bindings().set_symbol(&self.parity, parity)?;
            part(r.name(), r.run_in_task())
        };
        for (s, &k) in run.order.iter().enumerate() {
            let parity = (s % 2) as i64;
            for &i in &g.members {
                let grad = &self.grads[i];
                grad.bindings()
                    .set_symbol(&self.slot, (k * n_dev + i) as i64)?;
                with_parity(grad, parity)?;
            }
            for m in &g.local {
                part(&m.description, m.transfer.run())?;
                with_parity(&m.routine, parity)?;
            }
            self.advance(run, gi);
            // The last round runs the update too.
            g.update.bindings().set_symbol(&self.step, s as i64)?;
            for (r, m) in g.rounds.iter().enumerate() {
                self.wait_for_group(run, gi, m.from_group, s as u64 * stages + r as u64 + 1)?;
                part(&m.description, m.transfer.run())?;
                with_parity(&m.routine, parity)?;
                self.advance(run, gi);
            }
            if g.rounds.is_empty() {
                with_parity(&g.update, parity)?;
            }
            for (what, copy) in &g.copies {
                part(what, copy.run())?;
            }
            if gi == 0 {
                run.end_of_step(s)?;
            }
        }
        exit.1 = true;
        Ok(())
    }

    /// Group `gi`'s next stage is done: its progress advances, and threads lent to its team
    /// are told.
    fn advance(&self, run: &Run, gi: usize) {
        advance_and_ring(&run.progress[gi], self.groups[gi].team.as_ref());
    }

    /// Group `gi` (its leader's thread) waits until group `from` has done `target` stages,
    /// taking chunks of `from`'s regions meanwhile (see [`wait_lending`]).
    fn wait_for_group(&self, run: &Run, gi: usize, from: usize, target: u64) -> Result<()> {
        let teams = (&self.groups[gi].team, &self.groups[from].team);
        wait_lending(run, &run.progress[from], target, teams)
    }
}

/// Advances `progress` and tells the threads lent to `team` (the team of the work that
/// advanced it) to look at it.
fn advance_and_ring(progress: &Progress, team: Option<&Arc<Team>>) {
    progress.advance();
    if let Some(t) = team {
        t.ring();
    }
}

/// Waits until `progress` reaches `target`. Meanwhile, when the waiting queue and the one
/// it waits for have teams of their own (`mine`, `theirs`), the waiting thread is lent to
/// `theirs` and takes chunks of its parallel regions: a device whose core is shared with
/// another process computes its gradients more slowly, and the device waiting for it,
/// which would sit idle, does part of them. A region's iterations are independent, so the
/// results are the same bits whichever thread runs them. Counts the chunks in `run.lent`.
fn wait_lending(
    run: &Run,
    progress: &Progress,
    target: u64,
    (mine, theirs): (&Option<Arc<Team>>, &Option<Arc<Team>>),
) -> Result<()> {
    if let (Some(mine), Some(theirs)) = (mine, theirs) {
        if !Arc::ptr_eq(mine, theirs) {
            let ran = theirs.lend_until(&|| progress.settled(target));
            run.lent.fetch_add(ran, Ordering::Relaxed);
        }
    }
    progress.wait_for(target)
}

/// Lets each team in `teams` take guests (see [`Team::host_guests`]) when another team is
/// among them: a queue program waits only for other queues.
pub(crate) fn host_guests<'a>(teams: impl Iterator<Item = &'a Arc<Team>> + Clone) {
    for t in teams.clone() {
        if teams.clone().any(|u| !Arc::ptr_eq(t, u)) {
            t.host_guests();
        }
    }
}

/// How often the host reports the epochs' losses while the programs run (it sleeps in
/// between).
pub(crate) const REPORT_EVERY: Duration = Duration::from_millis(100);

/// What the queue programs of the exchange share (see `Exchange::run_group`).
pub(crate) struct Run {
    /// The batch of each step.
    pub(crate) order: Vec<usize>,
    pub(crate) per_epoch: usize,
    /// The exchange: per group, its finished stages. The tree: per device, the steps whose
    /// sum of its subtree is final.
    pub(crate) progress: Vec<Progress>,
    /// The tree: the steps device 0 has updated the parameters of.
    pub(crate) updated: Progress,
    /// Epochs whose loss history device 0 has copied to the host.
    pub(crate) epochs: Progress,
    pub(crate) history: Tnode,
    /// Device 0's buffer of the loss history.
    pub(crate) history_buffer: BufferPtr,
    /// Chunks of regions that queues ran for the queues they waited for (see
    /// [`wait_lending`]).
    pub(crate) lent: AtomicU64,
}

impl Run {
    /// Device 0's end of step `s`: at the end of an epoch, the loss history to the host.
    fn end_of_step(&self, s: usize) -> Result<()> {
        if (s + 1).is_multiple_of(self.per_epoch) {
            // Only the epoch's steps: copying the whole history every epoch made long
            // trainings quadratic (2000 epochs of the default moons job: 40,000 steps of
            // history copied 2000 times).
            let steps = (s + 1 - self.per_epoch)..(s + 1);
            self.history
                .with_host_mut(|a| {
                    let size = a.prec().size_in_bytes();
                    let bytes = a
                        .as_bytes_mut()
                        .get_mut(steps.start * size..steps.end * size)
                        .ok_or_else(|| Error::Internal("the loss history is too short".into()))?;
                    self.history_buffer.read_bytes_at(steps.start * size, bytes)
                })
                .unwrap_or(Ok(()))?;
            self.epochs.advance();
        }
        Ok(())
    }
}

/// The tree as one program per device queue, for one rank when the exchange does not fit
/// (see `TreeProgram::run_group`): the same merges, update and copies as the host-scheduled
/// tree, in the same order, with waits on [`Progress`] counts instead of events.
pub(crate) struct TreeProgram {
    pub(crate) slot: StaticSymbol,
    pub(crate) step: StaticSymbol,
    /// Per device, the gradient routine, and its queue.
    pub(crate) grads: Vec<Routine>,
    pub(crate) queue: Vec<Option<usize>>,
    /// The tree's merges, in order: `(to, from, work)`.
    pub(crate) merges: Vec<(usize, usize, MergeWork)>,
    /// Per device, how many merges add into it.
    pub(crate) incoming: Vec<usize>,
    /// Device 0's update.
    pub(crate) update: Routine,
    /// The parameter copies from device 0: `(to, what, transfer)`.
    pub(crate) copies: Vec<(usize, Arc<str>, Arc<Transfer>)>,
    /// The devices by queue.
    pub(crate) groups: Vec<Vec<usize>>,
    /// Per device, the thread team running its routines' parallel regions (see
    /// [`wait_lending`]).
    pub(crate) teams: Vec<Option<Arc<Team>>>,
}

impl TreeProgram {
    /// Runs the whole training of the devices `groups[gi]` (one queue), as one task on it:
    /// per step, their gradients, the merges into them (waiting, for a source on another
    /// queue, until its own merges are done: `progress[from]` counts the steps whose sum of
    /// its subtree is final), device 0's update (then `updated` advances), and the copies of
    /// device 0's parameters into them (waiting for `updated` on another queue than device
    /// 0's). A queue does its merges in the tree's order (stride 1, 2, 4, ...), and a merge
    /// waits only for subtrees of smaller strides, so no two queues wait for each other. The
    /// write-after-read rules are the host-scheduled tree's (see `Plan::schedule_step`). On
    /// any failure (or panic) every count fails.
    fn run_group(&self, run: &Run, gi: usize) -> Result<()> {
        let mut exit = FailOnExit(run, false);
        let members = &self.groups[gi];
        let n_dev = self.grads.len();
        let mine = |i: usize| self.queue[i] == self.queue[members[0]];
        let mut left = vec![0usize; n_dev];
        for (s, &k) in run.order.iter().enumerate() {
            let done = s as u64 + 1;
            for &i in members {
                let g = &self.grads[i];
                g.bindings()
                    .set_symbol(&self.slot, (k * n_dev + i) as i64)?;
                part(g.name(), g.run_in_task())?;
                left[i] = self.incoming[i];
                if left[i] == 0 {
                    advance_and_ring(&run.progress[i], self.teams[i].as_ref());
                }
            }
            for (to, from, work) in &self.merges {
                if !mine(*to) {
                    continue;
                }
                if !mine(*from) {
                    let teams = (&self.teams[*to], &self.teams[*from]);
                    wait_lending(run, &run.progress[*from], done, teams)?;
                }
                let (t, r) = &**work;
                part(t.description(), t.run())?;
                part(r.name(), r.run_in_task())?;
                left[*to] -= 1;
                if left[*to] == 0 {
                    advance_and_ring(&run.progress[*to], self.teams[*to].as_ref());
                }
            }
            if mine(0) {
                self.update.bindings().set_symbol(&self.step, s as i64)?;
                part(self.update.name(), self.update.run_in_task())?;
                advance_and_ring(&run.updated, self.teams[0].as_ref());
            }
            for (to, what, copy) in &self.copies {
                if mine(*to) {
                    let teams = (&self.teams[*to], &self.teams[0]);
                    wait_lending(run, &run.updated, done, teams)?;
                    part(what, copy.run())?;
                }
            }
            if mine(0) {
                run.end_of_step(s)?;
            }
        }
        exit.1 = true;
        Ok(())
    }
}

/// A training run as one program per queue.
#[derive(Clone)]
pub(crate) enum Program {
    Exchange(Arc<Exchange>),
    Tree(Arc<TreeProgram>),
}

impl Program {
    /// The devices of each queue, the first one's queue running the group's program.
    pub(crate) fn groups(&self) -> Vec<Vec<usize>> {
        match self {
            Program::Exchange(x) => x.groups.iter().map(|g| g.members.clone()).collect(),
            Program::Tree(t) => t.groups.clone(),
        }
    }

    pub(crate) fn run_group(&self, run: &Run, gi: usize) -> Result<()> {
        match self {
            Program::Exchange(x) => x.run_group(run, gi),
            Program::Tree(t) => t.run_group(run, gi),
        }
    }
}

/// Fails every count of a run unless disarmed (`.1 = true`): a program that stops early
/// (an error or a panic) must not leave another queue or the host waiting.
struct FailOnExit<'a>(&'a Run, bool);

impl Drop for FailOnExit<'_> {
    fn drop(&mut self) {
        if !self.1 {
            self.0.progress.iter().for_each(Progress::fail);
            self.0.updated.fail();
            self.0.epochs.fail();
        }
    }
}
