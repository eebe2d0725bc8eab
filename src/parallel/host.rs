//! The schedules the host drives step by step: the host-scheduled tree (what runs over MPI
//! ranks) and the deterministic schedule (see the [module documentation](super#schedules)).

use super::plan::{part, Dev, Plan};
use crate::backend::{Backend, Context, Task};
use crate::error::Result;
use crate::ir::{StaticSymbol, Tnode};
use std::ops::Range;
use std::sync::Arc;

impl Plan {
    /// Schedules training step `s` on batch `k` of the epoch (module documentation),
    /// ordering the devices' work with events instead of awaiting them:
    /// - a merge target waits for its source's event (the source's gradients are final), so
    ///   it reads them after they are written; the source writes them again only in the next
    ///   step, after its parameter copy, which waits for device 0's update, which comes after
    ///   every merge (each target is merged onward into device 0 later in the tree);
    /// - every other device waits for device 0's event after the update before copying the
    ///   parameters; device 0 overwrites them in the next update only after every device's
    ///   next gradients were merged into it, which each device computes after its copy.
    ///
    /// One task per device and phase: the transfers and merge routines of a merge, and the
    /// copies of the parameters, run inside one task.
    pub(crate) fn schedule_step(&self, backend: &dyn Backend, k: usize, s: usize) -> Result<()> {
        let devs = &self.devs;
        let n_dev = devs.len();
        // 1. Gradients of every slice.
        for (i, d) in devs.iter().enumerate() {
            d.grad
                .bindings()
                .set_symbol(&self.slot, (k * n_dev + i) as i64)?;
            d.grad.schedule()?;
        }
        // 2. Tree merge into device 0.
        for job in &self.merges {
            let source = backend.record_event(&devs[job.from].device);
            let work = job.work.clone();
            backend.schedule(
                &devs[job.to].device,
                Task::new(job.description.clone(), move || {
                    source.wait();
                    let (t, r) = &*work;
                    part(t.description(), t.run())?;
                    part(r.name(), r.run_in_task())
                }),
            )?;
        }
        // 3. Across ranks: the leaders' gradients and losses are all-reduced (MPI).
        if let Some((nodes, ctxs)) = &self.all_reduce {
            backend.all_reduce(nodes, ctxs)?;
        }
        // 4. Update on every leader (device 0 on the in-process backends; on MPI every rank
        //    applies the same update to the same parameters, so they stay identical).
        let mut updated = vec![];
        for &l in &self.leaders {
            let d = &devs[l];
            d.update.bindings().set_symbol(&self.step, s as i64)?;
            d.update.schedule()?;
            updated.push(backend.record_event(&d.device));
        }
        // 5. Parameters from the leader to the other devices of its group.
        let group = n_dev / self.leaders.len();
        for job in &self.copies {
            let (updated, work) = (updated[job.to / group].clone(), job.work.clone());
            backend.schedule(
                &devs[job.to].device,
                Task::new(job.description.clone(), move || {
                    updated.wait();
                    part(work.description(), work.run())
                }),
            )?;
        }
        Ok(())
    }
}

/// The deterministic schedule, prepared once: every device computes the gradients of its
/// shards (slices of the batch, `shards` of them whatever the number of devices) into its
/// rows of a `[shards, n]` tensor whose other rows are zero; an all-reduce gives every
/// device every shard's row (a row plus zeros is the row, exactly); every device then adds
/// the rows up in shard order, zeroes them all for the next step, and applies the same
/// update to the same parameters. So neither the routine computing a shard's gradient nor the order of the
/// sum depends on the number of devices, and the results are the same bit for bit on any
/// number of them. No parameters are copied.
pub(crate) struct Sharded {
    pub(crate) devs: Vec<Dev>,
    /// The static indices of the gradient routine: the data slot and the row of the shard.
    pub(crate) slot: StaticSymbol,
    pub(crate) shard: StaticSymbol,
    /// The update's static index of the step.
    pub(crate) step: StaticSymbol,
    pub(crate) shards: usize,
    /// Per device, its shards, and what their task says it is.
    pub(crate) owned: Vec<Range<usize>>,
    pub(crate) descriptions: Vec<Arc<str>>,
    /// The `[shards, n]` rows of shard gradients (and losses).
    pub(crate) rows: Tnode,
    /// Every device's context (this rank's and the others', in device order).
    pub(crate) ctxs: Vec<Context>,
}

impl Sharded {
    /// Schedules training step `s` on batch `k` of the epoch: per device its shards'
    /// gradients, the all-reduce of the rows, the update on every device. The backend
    /// orders the all-reduce after the gradients and the updates after it (and the next
    /// step's gradients after the all-reduce read the rows), so the host never waits.
    ///
    /// A device's shards run in one task (the gradient routine once per shard, its static
    /// indices set in the task), so that a step schedules one task per device, not one per
    /// shard. The task declares no accesses: it is ordered after the previous all-reduce by
    /// the event the backend makes every device wait for, and before this step's by the
    /// events the all-reduce waits for.
    pub(crate) fn schedule_step(&self, backend: &dyn Backend, k: usize, s: usize) -> Result<()> {
        for ((d, range), what) in self.devs.iter().zip(&self.owned).zip(&self.descriptions) {
            let (grad, range) = (d.grad.clone(), range.clone());
            let (slot, shard, shards) = (self.slot.clone(), self.shard.clone(), self.shards);
            let work = move || -> Result<()> {
                for j in range.clone() {
                    let b = grad.bindings();
                    b.set_symbol(&slot, (k * shards + j) as i64)?;
                    b.set_symbol(&shard, j as i64)?;
                    part(grad.name(), grad.run_in_task())?;
                }
                Ok(())
            };
            backend.schedule(&d.device, Task::new(what.clone(), work))?;
        }
        backend.all_reduce(std::slice::from_ref(&self.rows), &self.ctxs)?;
        for d in &self.devs {
            d.update.bindings().set_symbol(&self.step, s as i64)?;
            d.update.schedule()?;
        }
        Ok(())
    }
}
