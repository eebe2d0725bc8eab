//! Compiling, running and emitting a built program on the cc backend.

use super::build::{Built, PlanStep, ProgramError};
use super::locate::json_path;
use super::output::Printed;
use crate::backend::{CcBackend, Config, MergeBuffer, Routine};
use crate::ir::Assignments;

fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
}

fn backend() -> CcBackend {
    let be = CcBackend::new();
    be.initialize(Config::default());
    be
}

/// Names the routine a batch-level library error comes from.
///
/// A batch is optimized routine by routine; when it fails, each routine is generated alone
/// and the first one failing with the same message is named. (The process exits right after,
/// so the memory-mode decisions this records on the nodes do not matter.) When no single
/// routine reproduces the error (e.g. a C compiler failure), every routine is named.
fn attribute(be: &CcBackend, built: &Built, err: crate::Error, what: &str) -> ProgramError {
    let msg = err.to_string();
    for (i, (name, a)) in built
        .routine_names
        .iter()
        .zip(&built.assignments)
        .enumerate()
    {
        let alone = be.generate_batch_source(
            Some(std::slice::from_ref(name)),
            &built.bindings,
            std::slice::from_ref::<Assignments>(a),
        );
        if let Err(e) = alone {
            if e.to_string() == msg {
                return ProgramError::at(json_path!["routines", i], format!("while {what}: {msg}"));
            }
        }
    }
    let names: Vec<String> = built.routine_names.iter().map(|n| quote(n)).collect();
    ProgramError::nowhere(format!(
        "while {what} (routines {}): {msg}",
        names.join(", ")
    ))
}

/// The C source of every routine as one batch, without running a compiler.
pub fn emit_c(built: &Built) -> Result<String, ProgramError> {
    let be = backend();
    be.generate_batch_source(
        Some(&built.routine_names),
        &built.bindings,
        &built.assignments,
    )
    .map_err(|e| attribute(&be, built, e, "generating the C"))
}

fn execute(steps: &[PlanStep], routines: &[Routine], names: &[String]) -> Result<(), ProgramError> {
    for step in steps {
        match step {
            PlanStep::Run {
                routine,
                bindings,
                path,
            } => {
                let r = &routines[*routine];
                let fail = |e: crate::Error| {
                    ProgramError::at(
                        path.clone(),
                        format!("routine {}: {e}", quote(&names[*routine])),
                    )
                };
                for (name, v) in bindings {
                    r.bindings().set(name, *v).map_err(fail)?;
                }
                r.run().map_err(fail)?;
            }
            PlanStep::Repeat { count, steps } => {
                for _ in 0..*count {
                    execute(steps, routines, names)?;
                }
            }
        }
    }
    Ok(())
}

/// The values of the printed tensors after a run.
pub struct RunResult {
    /// (name, dims, precision, values) per printed tensor, in print order.
    pub tensors: Vec<(String, Vec<usize>, crate::ir::Prec, Vec<f64>)>,
}

impl RunResult {
    /// Views for the printers.
    pub fn printed(&self) -> Vec<Printed<'_>> {
        self.tensors
            .iter()
            .map(|(name, dims, prec, values)| Printed {
                name,
                dims,
                prec: *prec,
                values,
            })
            .collect()
    }
}

/// Compiles all routines as one batch, links them into one context, copies hosted tensors to
/// the device, runs the plan, copies hosted tensors back and collects the printed tensors.
///
/// A printed tensor that does not live in the context (no routine materializes it, e.g. it is
/// used by no routine, or only read where the backend reads host data directly) prints its
/// host values, i.e. its init.
pub fn run(built: &Built) -> Result<RunResult, ProgramError> {
    let be = backend();
    let lib =
        |what: &'static str| move |e: crate::Error| ProgramError::nowhere(format!("{what}: {e}"));
    let mut routines = vec![];
    let ctx = be
        .init("arrayjit")
        .map_err(lib("initializing the backend"))?;
    let ctx = if built.assignments.is_empty() {
        ctx
    } else {
        let batch = be
            .compile_batch(
                true,
                Some(&built.routine_names),
                None,
                &built.bindings,
                &built.assignments,
            )
            .map_err(|e| attribute(&be, built, e, "compiling"))?;
        let (ctx, linked) = be
            .link_batch(&[], &MergeBuffer::new(), &ctx, &batch)
            .map_err(lib("linking the routines"))?;
        for (name, r) in built.routine_names.iter().zip(linked) {
            routines.push(r.ok_or_else(|| {
                ProgramError::nowhere(format!("routine {} was not linked", quote(name)))
            })?);
        }
        ctx
    };
    for (name, tn) in &built.tensors {
        if tn.is_hosted() {
            be.from_host(&ctx, tn).map_err(|e| {
                ProgramError::nowhere(format!("copying tensor {} to the device: {e}", quote(name)))
            })?;
        }
    }
    execute(&built.plan, &routines, &built.routine_names)?;
    for (name, tn) in &built.tensors {
        if tn.is_hosted() {
            be.to_host(&ctx, tn).map_err(|e| {
                ProgramError::nowhere(format!("copying tensor {} to the host: {e}", quote(name)))
            })?;
        }
    }
    let tensors = built
        .print
        .iter()
        .map(|(name, tn)| {
            let values = tn.host_values().ok_or_else(|| {
                ProgramError::nowhere(format!("tensor {} has no host array", quote(name)))
            })?;
            Ok((name.clone(), tn.dims().to_vec(), tn.prec(), values))
        })
        .collect::<Result<Vec<_>, ProgramError>>()?;
    Ok(RunResult { tensors })
}
