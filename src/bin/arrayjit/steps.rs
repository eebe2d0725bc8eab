//! Executing a program's plan: one walk over its steps (repeats, where errors are placed and
//! how they name the routine and device) for every way of running them — one device of the
//! cc backend, several devices of a device backend, or the reference interpreter — each of
//! which implements [`Machine`].

use crate::program::build::{PlanStep, ProgramError};
use crate::program::format::MergeDecl;
use arrayjit::ir::Tnode;

/// A name as a JSON string, the way error messages quote program names.
pub fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
}

/// What running a plan needs from a machine. Each operation returns what went wrong as a
/// message; [`execute`] places it at the step.
pub trait Machine {
    /// Whether the program declares devices (its errors then name the device, and copies
    /// between devices are allowed).
    fn multi_device(&self) -> bool;
    /// The name of the routine with this index.
    fn routine_name(&self, routine: usize) -> &str;
    /// Sets the bindings, then runs (or schedules) the routine on the device.
    fn run(
        &mut self,
        routine: usize,
        device: usize,
        bindings: &[(String, i64)],
    ) -> Result<(), String>;
    /// `device_to_device` of the tensor `(name, node)`.
    fn copy(
        &mut self,
        tensor: &(String, Tnode),
        from: usize,
        to: usize,
        merge: MergeDecl,
    ) -> Result<(), String>;
    /// Copies a hosted tensor to the device.
    fn load_from_host(&mut self, tensor: &Tnode, device: usize) -> Result<(), String>;
    /// Copies a hosted tensor from the device.
    fn store_to_host(&mut self, tensor: &Tnode, device: usize) -> Result<(), String>;
    /// Waits for a device (`None`: all of them).
    fn await_devices(&mut self, device: Option<usize>) -> Result<(), String>;
    /// Sums the tensor `(name, node)` over the devices, leaving the sum on each of them.
    fn all_reduce(&mut self, tensor: &(String, Tnode), devices: &[usize]) -> Result<(), String>;
}

/// Runs the steps on the machine, in order.
pub fn execute(m: &mut impl Machine, steps: &[PlanStep]) -> Result<(), ProgramError> {
    for step in steps {
        match step {
            PlanStep::Run {
                routine,
                device,
                bindings,
                path,
            } => {
                m.run(*routine, *device, bindings).map_err(|e| {
                    let name = quote(m.routine_name(*routine));
                    let msg = if m.multi_device() {
                        format!("routine {name} on device {device}: {e}")
                    } else {
                        format!("routine {name}: {e}")
                    };
                    ProgramError::at(path.clone(), msg)
                })?;
            }
            PlanStep::Repeat { count, steps } => {
                for _ in 0..*count {
                    execute(m, steps)?;
                }
            }
            PlanStep::Copy {
                tensor,
                from,
                to,
                merge,
                path,
            } => {
                if !m.multi_device() {
                    return Err(ProgramError::at(
                        path.clone(),
                        "copying between devices needs a multi-device program",
                    ));
                }
                m.copy(tensor, *from, *to, *merge)
                    .map_err(|e| ProgramError::at(path.clone(), e))?;
            }
            PlanStep::FromHost {
                tensor,
                device,
                path,
            } => m
                .load_from_host(&tensor.1, *device)
                .map_err(|e| ProgramError::at(path.clone(), e))?,
            PlanStep::ToHost {
                tensor,
                device,
                path,
            } => m
                .store_to_host(&tensor.1, *device)
                .map_err(|e| ProgramError::at(path.clone(), e))?,
            PlanStep::Await { device, path } => m
                .await_devices(*device)
                .map_err(|e| ProgramError::at(path.clone(), e))?,
            PlanStep::AllReduce {
                tensor,
                devices,
                path,
            } => {
                if !m.multi_device() {
                    return Err(ProgramError::at(
                        path.clone(),
                        "all_reduce needs a multi-device program",
                    ));
                }
                m.all_reduce(tensor, devices)
                    .map_err(|e| ProgramError::at(path.clone(), e))?
            }
        }
    }
    Ok(())
}
