//! `arrayjit run --interpret`: runs a built program through the reference interpreter
//! ([`arrayjit::interp`]) instead of compiling it, so no C compiler is looked up or run.
//!
//! The plan executes as on the cc backend, with one [`Memory`] standing in for each device's
//! buffers:
//!
//! - every routine is lowered once (unoptimized, as [`interp::run_assignments`] does) and run
//!   with [`interp::run_named`], so errors name the routine;
//! - tensors persist in the memory between steps and routines, as in a context; hosted
//!   tensors (those with a host array) start from their host arrays, and every hosted tensor
//!   is copied back to its host array after the last step;
//! - static-index values set in a step persist in that routine's cells (per device) for its
//!   later steps, initially 0, exactly as with compiled routines;
//! - tensors declared `"memory": "local"` are zeroed before every routine call (the generated
//!   C allocates them zero-filled on every call);
//! - multi-device programs simulate each device with its own memory, running the steps one
//!   after the other (which is the order the CLI's synchronization guarantees on real
//!   devices): `copy` with `"merge": "no"` copies the values into the destination's memory,
//!   `"copy"` sets the destination's merge buffer to a copy of them, `"streaming"` makes the
//!   destination's merge buffer follow the source's values (it is refreshed before each
//!   routine the destination runs, as the merge buffer then points at the source's buffer);
//!   `from_host` / `to_host` copy between the memory and the host arrays, `all_reduce` sums
//!   the devices' values and stores the sum on each, `await` does nothing.
//!
//! Values are therefore those of the compiled code up to the differences documented in
//! [`arrayjit::interp`] (intermediate results of single and half expressions kept in `f64`,
//! contraction into fused multiply-adds, the last bits of `libm` functions). Nodes that the
//! optimizer would inline or keep local never exist in a compiled context; the interpreter
//! keeps them in its memory, so it accepts a few programs the compiled path rejects (e.g. a
//! `copy` of a tensor the optimizer inlined).

use crate::exec::{collect_printed, RunResult};
use crate::program::build::{Built, ProgramError};
use crate::program::format::MergeDecl;
use crate::steps::{self, quote, Machine};
use arrayjit::interp::{self, Memory};
use arrayjit::ir::{Assignments, Buffer, FetchOp, MemoryMode, Prec, StaticSymbol, Tnode};
use arrayjit::loops::Llc;
use arrayjit::lower;
use std::collections::HashSet;

/// A routine ready for the interpreter.
struct Lowered {
    name: String,
    code: Llc,
    /// Nodes declared `local`: zeroed before every call.
    locals: Vec<Tnode>,
    /// Nodes read through the merge buffer.
    merge_nodes: Vec<Tnode>,
}

/// Nodes that live on a device: written or read directly (not only through the merge buffer)
/// by some routine.
fn device_nodes(asgns: &Assignments, out: &mut HashSet<Tnode>, merge: &mut Vec<Tnode>) {
    let mut arg = |b: &Buffer, out: &mut HashSet<Tnode>| match b {
        Buffer::Node(t) => {
            out.insert(t.clone());
        }
        Buffer::MergeBuffer(t) => {
            if !merge.contains(t) {
                merge.push(t.clone());
            }
        }
    };
    asgns.visit(&mut |a| match a {
        Assignments::AccumBinop {
            lhs, rhs1, rhs2, ..
        } => {
            out.insert(lhs.clone());
            arg(rhs1, out);
            arg(rhs2, out);
        }
        Assignments::AccumUnop { lhs, rhs, .. } => {
            out.insert(lhs.clone());
            arg(rhs, out);
        }
        Assignments::AccumTernop {
            lhs,
            rhs1,
            rhs2,
            rhs3,
            ..
        } => {
            out.insert(lhs.clone());
            arg(rhs1, out);
            arg(rhs2, out);
            arg(rhs3, out);
        }
        Assignments::Gather { lhs, table, index } => {
            out.insert(lhs.clone());
            out.insert(table.clone());
            out.insert(index.clone());
        }
        Assignments::ScatterAdd { lhs, src, index } => {
            out.insert(lhs.clone());
            out.insert(src.clone());
            out.insert(index.clone());
        }
        Assignments::Fetch { array, fetch_op } => {
            out.insert(array.clone());
            if let FetchOp::Slice { sliced, .. } = fetch_op {
                out.insert(sliced.clone());
            }
        }
        _ => {}
    });
}

/// Lowers every routine; returns them and the nodes that live on each device.
fn lower_all(built: &Built) -> Result<(Vec<Lowered>, HashSet<Tnode>), ProgramError> {
    let mut on_device = HashSet::new();
    let mut routines = vec![];
    for (i, (name, a)) in built
        .routine_names
        .iter()
        .zip(&built.assignments)
        .enumerate()
    {
        let code = lower::lower(a).map_err(|e| {
            ProgramError::at(
                crate::program::locate::json_path!["routines", i],
                format!("while lowering: {e}"),
            )
        })?;
        let mut mine = HashSet::new();
        let mut merge_nodes = vec![];
        device_nodes(a, &mut mine, &mut merge_nodes);
        let mut locals: Vec<Tnode> = mine
            .iter()
            .filter(|t| matches!(t.declared_memory_mode(), Some((MemoryMode::Local, _))))
            .cloned()
            .collect();
        locals.sort();
        on_device.extend(mine);
        routines.push(Lowered {
            name: name.clone(),
            code,
            locals,
            merge_nodes,
        });
    }
    Ok((routines, on_device))
}

/// One simulated device: its memory, the static-index values of each routine, and the device
/// whose values its merge buffer streams from.
struct SimDevice {
    mem: Memory,
    statics: Vec<Vec<(StaticSymbol, i64)>>,
    streams_from: Option<(usize, Tnode)>,
}

struct Sim<'a> {
    built: &'a Built,
    routines: Vec<Lowered>,
    on_device: HashSet<Tnode>,
    devices: Vec<SimDevice>,
}

impl Sim<'_> {
    fn new(built: &Built, n: usize) -> Result<Sim<'_>, ProgramError> {
        let (routines, on_device) = lower_all(built)?;
        let initial: Vec<(StaticSymbol, i64)> =
            built.bindings.0.iter().map(|s| (s.clone(), 0)).collect();
        let hosted: Vec<&Tnode> = built
            .tensors
            .iter()
            .map(|(_, tn)| tn)
            .filter(|tn| on_device.contains(*tn))
            .collect();
        let mut devices = Vec::with_capacity(n);
        for d in 0..n {
            let mut mem = Memory::new();
            mem.try_load_from_hosts(hosted.iter().copied())
                .map_err(|e| {
                    ProgramError::nowhere(format!("loading the tensors of device {d}: {e}"))
                })?;
            devices.push(SimDevice {
                mem,
                statics: vec![initial.clone(); routines.len()],
                streams_from: None,
            });
        }
        Ok(Sim {
            built,
            routines,
            on_device,
            devices,
        })
    }

    /// A copy of the values of `tn` on device `d` (zeros if no routine touched it yet, as a
    /// freshly linked buffer); [`arrayjit::Error::OutOfMemory`] when the copy cannot be
    /// allocated.
    fn values(&self, d: usize, tn: &Tnode) -> arrayjit::Result<Vec<f64>> {
        match self.devices[d].mem.get(tn) {
            Some(v) => {
                let mut copy: Vec<f64> = Vec::new();
                if copy.try_reserve_exact(v.len()).is_err() {
                    return Err(arrayjit::Error::OutOfMemory {
                        what: format!("a copy of the values of tensor {}", tn.name()),
                        bytes: v.len().saturating_mul(8),
                    });
                }
                copy.extend_from_slice(v);
                Ok(copy)
            }
            None => interp::zeroed_values(tn),
        }
    }

    fn run_routine(
        &mut self,
        routine: usize,
        device: usize,
        bindings: &[(String, i64)],
    ) -> arrayjit::Result<()> {
        let r = &self.routines[routine];
        if !r.merge_nodes.is_empty() {
            if let Some((src, tn)) = self.devices[device].streams_from.clone() {
                if let Some(ints) = self.devices[src].mem.get_int(&tn) {
                    self.devices[device].mem.set_merge_int(&tn, &ints)?;
                } else {
                    let values = self.values(src, &tn)?;
                    self.devices[device].mem.set_merge(&tn, values)?;
                }
            }
        }
        let dev = &mut self.devices[device];
        let statics = &mut dev.statics[routine];
        for (name, v) in bindings {
            match statics.iter_mut().find(|(s, _)| &s.name == name) {
                Some(slot) => slot.1 = *v,
                None => {
                    return Err(arrayjit::Error::Usage(format!(
                        "routine {}: unknown static index {name}",
                        r.name
                    )))
                }
            }
        }
        for tn in &r.locals {
            dev.mem.set(tn, interp::zeroed_values(tn)?)?;
        }
        interp::run_named(&r.name, &r.code, statics, &mut dev.mem)
    }

    fn copy(&mut self, tn: &Tnode, from: usize, to: usize, merge: MergeDecl) -> Result<(), String> {
        if !self.on_device.contains(tn) {
            return Err(match merge {
                MergeDecl::No => format!(
                    "tensor {} is not on device {to} (no routine there uses it)",
                    quote(&tn.name())
                ),
                _ => format!(
                    "device_to_device: tensor {} is not on the source device {from}",
                    tn.name()
                ),
            });
        }
        if merge == MergeDecl::No && tn.prec().is_integer() {
            // Exact, an int64 above 2^53 included.
            let ints = self.devices[from]
                .mem
                .get_int(tn)
                .unwrap_or_else(|| vec![0; tn.numel()]);
            return self.devices[to]
                .mem
                .set_int(tn, &ints)
                .map_err(|e| e.to_string());
        }
        let values = self.values(from, tn).map_err(|e| e.to_string())?;
        match merge {
            MergeDecl::No => self.devices[to]
                .mem
                .set(tn, values)
                .map_err(|e| e.to_string()),
            MergeDecl::Streaming | MergeDecl::Copy => {
                let expected: Vec<&Tnode> =
                    self.routines.iter().flat_map(|r| &r.merge_nodes).collect();
                if !expected.is_empty() && !expected.contains(&tn) {
                    let mut names: Vec<String> = vec![];
                    for t in expected {
                        if !names.contains(&t.name()) {
                            names.push(t.name());
                        }
                    }
                    return Err(format!(
                        "device_to_device: merging tensor {} into device {to}, whose routines \
                         read {} from the merge buffer",
                        tn.name(),
                        names.join(", ")
                    ));
                }
                // Integers exactly, an int64 above 2^53 included.
                let ints = self.devices[from].mem.get_int(tn);
                let dev = &mut self.devices[to];
                match ints {
                    Some(ints) => dev.mem.set_merge_int(tn, &ints),
                    None => dev.mem.set_merge(tn, values),
                }
                .map_err(|e| e.to_string())?;
                dev.streams_from = if merge == MergeDecl::Streaming {
                    Some((from, tn.clone()))
                } else {
                    None
                };
                Ok(())
            }
        }
    }
}

impl Sim<'_> {
    /// Sums the tensor's values over the devices (in the order listed, accumulating as the
    /// backends do: singles and the narrow floats in `f32`, doubles in `f64`, integers
    /// exactly modulo 2^bits) and stores the sum, rounded to the tensor's precision, on each
    /// of them.
    fn all_reduce_values(&mut self, tn: &Tnode, devices: &[usize]) -> arrayjit::Result<()> {
        if !self.on_device.contains(tn) {
            return Err(arrayjit::Error::AllReduce {
                tensor: tn.name(),
                msg: "the tensor is not on the devices (no routine uses it)".into(),
            });
        }
        let prec = tn.prec();
        // As the compiled backends sum (backend::reduce): integers exactly, wrapped into
        // their width; the narrow floats and singles in f32, rounded once at the end.
        if prec.is_integer() {
            // (A device that never wrote the tensor holds zeros.)
            let mut sum: Vec<i128> = vec![0; interp::zeroed_values(tn)?.len()];
            for &d in devices {
                let v = self.devices[d].mem.get_int(tn).unwrap_or_default();
                for (s, x) in sum.iter_mut().zip(v) {
                    *s = prec.wrap_int((*s).wrapping_add(x) as u64);
                }
            }
            for &d in devices {
                self.devices[d].mem.set_int(tn, &sum)?;
            }
            return Ok(());
        }
        let acc_round = |v: f64| match prec {
            Prec::Double => v,
            _ => v as f32 as f64,
        };
        let mut sum = interp::zeroed_values(tn)?;
        for &d in devices {
            for (s, v) in sum.iter_mut().zip(self.values(d, tn)?) {
                *s = acc_round(*s + v);
            }
        }
        for s in &mut sum {
            *s = prec.round(*s);
        }
        for &d in devices {
            self.devices[d].mem.set(tn, sum.clone())?;
        }
        Ok(())
    }
}

impl Machine for Sim<'_> {
    fn multi_device(&self) -> bool {
        self.built.devices.is_some()
    }
    fn routine_name(&self, routine: usize) -> &str {
        &self.built.routine_names[routine]
    }
    fn run(
        &mut self,
        routine: usize,
        device: usize,
        bindings: &[(String, i64)],
    ) -> Result<(), String> {
        self.run_routine(routine, device, bindings)
            .map_err(|e| e.to_string())
    }
    fn copy(
        &mut self,
        tensor: &(String, Tnode),
        from: usize,
        to: usize,
        merge: MergeDecl,
    ) -> Result<(), String> {
        Sim::copy(self, &tensor.1, from, to, merge)
    }
    fn load_from_host(&mut self, tensor: &Tnode, device: usize) -> Result<(), String> {
        // Like `from_host`: only tensors on the device that have a host array.
        if self.on_device.contains(tensor) {
            self.devices[device]
                .mem
                .try_load_from_hosts([tensor])
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
    fn store_to_host(&mut self, tensor: &Tnode, device: usize) -> Result<(), String> {
        self.devices[device]
            .mem
            .store_to_hosts([tensor])
            .map(drop)
            .map_err(|e| e.to_string())
    }
    fn all_reduce(&mut self, tensor: &(String, Tnode), devices: &[usize]) -> Result<(), String> {
        self.all_reduce_values(&tensor.1, devices)
            .map_err(|e| e.to_string())
    }
    fn await_devices(&mut self, _: Option<usize>) -> Result<(), String> {
        Ok(())
    }
}

/// Runs the program through the interpreter: hosted tensors are loaded into every device's
/// memory, the plan executes, hosted tensors are copied back from device 0, and the printed
/// tensors are collected. Never looks up or runs a C compiler.
pub fn run(built: &Built) -> Result<RunResult, ProgramError> {
    let mut sim = Sim::new(built, built.devices.unwrap_or(1))?;
    steps::execute(&mut sim, &built.plan)?;
    let host = built.tensors.iter().map(|(_, tn)| tn);
    sim.devices[0]
        .mem
        .store_to_hosts(host)
        .map_err(|e| ProgramError::nowhere(format!("copying the tensors to the host: {e}")))?;
    Ok(RunResult {
        tensors: collect_printed(built)?,
    })
}
