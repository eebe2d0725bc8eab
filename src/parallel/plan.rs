//! The plan of a training: the devices, their queues and routines, and the transfers of the
//! merges and parameter copies, prepared once and checked when prepared.

use super::programs::{host_guests, Exchange, Group, Merge, TreeProgram};
use crate::backend::{Backend, Context, Device, MergeBufferUse, Routine, Team, Transfer};
use crate::error::{Error, Result};
use crate::ir::{StaticSymbol, Tnode};
use std::sync::Arc;

/// One device's handles.
pub(crate) struct Dev {
    pub(crate) device: Device,
    pub(crate) ctx: Context,
    pub(crate) grad: Routine,
    /// The tree: one routine adding the fused gradients (and loss) in the merge buffer to
    /// this device's. The exchange: the merge within a queue, then one routine per round
    /// but the last (which is `update`'s). The deterministic schedule: none.
    pub(crate) merges: Vec<Routine>,
    pub(crate) update: Routine,
    /// The evaluation, if the model has one.
    pub(crate) eval: Option<Routine>,
}

/// The transfer of a merge's source into the target's merge buffer, and the routine adding it.
pub(crate) type MergeWork = Arc<(Transfer, Routine)>;

/// One merge of the tree: `to` adds `from`'s gradients (and loss) to its own.
pub(crate) struct MergeJob {
    pub(crate) to: usize,
    pub(crate) from: usize,
    pub(crate) description: Arc<str>,
    /// The transfer of the fused gradients into `to`'s merge buffer, then the routine adding
    /// them.
    pub(crate) work: MergeWork,
}

/// The copy of the fused parameters from device 0 to device `to`.
pub(crate) struct CopyJob {
    pub(crate) to: usize,
    pub(crate) description: Arc<str>,
    pub(crate) work: Arc<Transfer>,
}

/// What a training step schedules, prepared once: the devices' routines, and the transfers
/// of the merge tree and of the parameter copies, checked when prepared.
pub(crate) struct Plan {
    pub(crate) devs: Vec<Dev>,
    pub(crate) slot: StaticSymbol,
    pub(crate) step: StaticSymbol,
    /// In tree order within each rank's group: rounds with stride 1, 2, 4, ...
    pub(crate) merges: Vec<MergeJob>,
    /// The first device of each rank's group (device 0 on the in-process backends).
    pub(crate) leaders: Vec<usize>,
    /// What the leaders all-reduce across ranks (the fused gradients and loss), when there are
    /// several ranks, and the leaders' contexts.
    pub(crate) all_reduce: Option<(Vec<Tnode>, Vec<Context>)>,
    pub(crate) copies: Vec<CopyJob>,
    /// Instead of the tree, merges and copies: the exchange (see [`Exchange`]).
    pub(crate) exchange: Option<Arc<Exchange>>,
}

/// The exchange's tensors of gradient sums: `rows[r]` (two rows, one per step parity) is
/// what round `r + 1` reads (`rows[0]`: each device's gradients, summed in place by the
/// tree into its leader); `merged` (one row) is what the update reads.
pub(crate) struct Sums {
    pub(crate) rows: Vec<Tnode>,
    pub(crate) merged: Tnode,
    /// The rounds between leaders: log2 of the number of groups.
    pub(crate) rounds: usize,
}

/// The exchange's groups for devices on these queues (`queue[i]`: device `i`'s queue), when
/// they qualify (see [`Exchange`]): `n` devices in aligned blocks of `2^a` per queue, `2^b`
/// blocks. `None` otherwise.
pub(crate) fn exchange_groups(queue: &[Option<usize>]) -> Option<Vec<Vec<usize>>> {
    let groups = queue_groups(queue);
    let size = groups.first()?.len();
    let blocks = groups
        .iter()
        .all(|g| g.len() == size && g.windows(2).all(|w| w[1] == w[0] + 1));
    let ok = queue.len().is_power_of_two()
        && size.is_power_of_two()
        && groups.len().is_power_of_two()
        && blocks;
    ok.then_some(groups)
}

/// The queue a device's tasks run on: its physical device's worker, or `None` for the
/// devices without one (which run tasks on the scheduling thread, all alike).
pub(crate) fn queue_of(d: &Device) -> Option<usize> {
    d.has_worker().then(|| d.physical().ordinal())
}

/// The devices by queue (`queue[i]`: device `i`'s), in order of first appearance, each in
/// device order.
pub(crate) fn queue_groups(queue: &[Option<usize>]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = vec![];
    for (i, q) in queue.iter().enumerate() {
        match groups.iter_mut().find(|g| queue[g[0]] == *q) {
            Some(g) => g.push(i),
            None => groups.push(vec![i]),
        }
    }
    groups
}

/// Runs a transfer or a routine of a job, naming it in a failure.
pub(crate) fn part(what: &str, r: Result<()>) -> Result<()> {
    r.map_err(|e| Error::InJob {
        job: what.to_string(),
        source: Box::new(e),
    })
}

/// The error of a transfer that found nothing to copy: `tn` is not in `ctx`.
fn not_in(what: &str, tn: &Tnode, ctx: &Context) -> Error {
    Error::NotInContext {
        what: what.to_string(),
        tensor: tn.name(),
        context: ctx.label().to_string(),
        hint: String::new(),
    }
}

impl Plan {
    pub(crate) fn new(
        backend: &dyn Backend,
        devs: Vec<Dev>,
        (slot, step): (StaticSymbol, StaticSymbol),
        grads: &Tnode,
        params: &Tnode,
        merge: MergeBufferUse,
        exchange: Option<(StaticSymbol, Sums, Vec<Vec<usize>>)>,
    ) -> Result<Plan> {
        if let Some((parity, sums, groups)) = exchange {
            let prepare = |tn: &Tnode, mode, to: &Routine, from: &Dev| {
                backend
                    .prepare_transfer(tn, mode, to.context(), &from.ctx)?
                    .ok_or_else(|| not_in("a transfer of the exchange", tn, &from.ctx))
            };
            let mut out = vec![];
            for (gi, members) in groups.iter().enumerate() {
                let leader = &devs[members[0]];
                // The tree into the leader: rounds with stride 1, 2, 4, ... within the block.
                let mut local = vec![];
                let mut stride = 1;
                while stride < members.len() {
                    for l in (0..members.len()).step_by(2 * stride) {
                        let (to, from) = (&devs[members[l]], &devs[members[l + stride]]);
                        local.push(Merge {
                            from_group: gi,
                            description: format!(
                                "merge the gradients of {} into {}",
                                from.device.name(),
                                to.device.name()
                            ),
                            transfer: prepare(&sums.rows[0], merge, &to.merges[0], from)?,
                            routine: to.merges[0].clone(),
                        });
                    }
                    stride *= 2;
                }
                let mut rounds = vec![];
                for r in 0..sums.rounds {
                    let pg = gi ^ (1 << r);
                    let partner = &devs[groups[pg][0]];
                    // The last round is the update's routine (see `train`).
                    let routine = if r + 1 == sums.rounds {
                        leader.update.clone()
                    } else {
                        leader.merges[1 + r].clone()
                    };
                    rounds.push(Merge {
                        from_group: pg,
                        description: format!(
                            "exchange round {} of {} with {}",
                            r + 1,
                            leader.device.name(),
                            partner.device.name()
                        ),
                        transfer: prepare(&sums.rows[r], merge, &routine, partner)?,
                        routine,
                    });
                }
                let mut copies = vec![];
                for &i in &members[1..] {
                    let d = &devs[i];
                    let copy = backend
                        .prepare_transfer(params, MergeBufferUse::No, &d.ctx, &leader.ctx)?
                        .ok_or_else(|| not_in("a parameter copy", params, &d.ctx))?;
                    copies.push((
                        format!(
                            "copy the parameters from {} to {}",
                            leader.device.name(),
                            d.device.name()
                        ),
                        copy,
                    ));
                }
                out.push(Group {
                    members: members.clone(),
                    local,
                    rounds,
                    update: leader.update.clone(),
                    copies,
                    team: leader.device.team().cloned(),
                });
            }
            // Leaders lend their threads to the teams of the groups they wait for.
            host_guests(out.iter().filter_map(|g| g.team.as_ref()));
            let exchange = Arc::new(Exchange {
                slot: slot.clone(),
                step: step.clone(),
                parity,
                grads: devs.iter().map(|d| d.grad.clone()).collect(),
                groups: out,
            });
            return Ok(Plan {
                devs,
                slot,
                step,
                merges: vec![],
                leaders: vec![0],
                all_reduce: None,
                copies: vec![],
                exchange: Some(exchange),
            });
        }
        let ranks = backend.num_ranks().max(1);
        let group = devs.len() / ranks;
        let leaders: Vec<usize> = (0..ranks).map(|r| r * group).collect();
        let mut merges = vec![];
        for &base in &leaders {
            let mut stride = 1;
            while stride < group {
                for local in (0..group).step_by(2 * stride) {
                    if local + stride >= group {
                        continue;
                    }
                    let (to, from) = (base + local, base + local + stride);
                    let (dt, df) = (&devs[to], &devs[from]);
                    let t = backend
                        .prepare_transfer(grads, merge, dt.merges[0].context(), &df.ctx)?
                        .ok_or_else(|| not_in("a merge of the tree", grads, &df.ctx))?;
                    let work = (t, dt.merges[0].clone());
                    merges.push(MergeJob {
                        to,
                        from,
                        description: format!(
                            "merge the gradients of {} into {}",
                            df.device.name(),
                            dt.device.name()
                        )
                        .into(),
                        work: Arc::new(work),
                    });
                }
                stride *= 2;
            }
        }
        let mut copies = vec![];
        for (to, d) in devs.iter().enumerate() {
            let leader = &devs[to / group * group];
            if to % group == 0 {
                continue;
            }
            let work = backend
                .prepare_transfer(params, MergeBufferUse::No, &d.ctx, &leader.ctx)?
                .ok_or_else(|| not_in("a parameter copy", params, &d.ctx))?;
            copies.push(CopyJob {
                to,
                description: format!("copy the parameters from {}", leader.device.name()).into(),
                work: Arc::new(work),
            });
        }
        let all_reduce = (ranks > 1).then(|| {
            let ctxs = leaders.iter().map(|&l| devs[l].ctx.clone()).collect();
            (vec![grads.clone()], ctxs)
        });
        Ok(Plan {
            devs,
            slot,
            step,
            merges,
            leaders,
            all_reduce,
            copies,
            exchange: None,
        })
    }

    /// The tree as one program per queue (one rank; see [`TreeProgram`]).
    pub(crate) fn tree_program(&self) -> TreeProgram {
        let queue: Vec<Option<usize>> = self.devs.iter().map(|d| queue_of(&d.device)).collect();
        let groups = queue_groups(&queue);
        let teams: Vec<Option<Arc<Team>>> =
            self.devs.iter().map(|d| d.device.team().cloned()).collect();
        host_guests(teams.iter().flatten());
        let mut incoming = vec![0; self.devs.len()];
        for m in &self.merges {
            incoming[m.to] += 1;
        }
        TreeProgram {
            slot: self.slot.clone(),
            step: self.step.clone(),
            grads: self.devs.iter().map(|d| d.grad.clone()).collect(),
            queue,
            merges: self
                .merges
                .iter()
                .map(|m| (m.to, m.from, m.work.clone()))
                .collect(),
            incoming,
            update: self.devs[0].update.clone(),
            copies: self
                .copies
                .iter()
                .map(|c| (c.to, c.description.clone(), c.work.clone()))
                .collect(),
            groups,
            teams,
        }
    }
}
