//! The reference interpreter: runs the loop IR directly in Rust, without a C compiler.
//!
//! The interpreter executes [`Llc`] code (as produced by [`crate::lower::lower`], optimized or
//! not) statement by statement on a [`Memory`] that holds one `Vec<f64>` per node. It shares no
//! code with the C writer: it reads only the IR types and the meaning of each operation from
//! the operation table ([`crate::ir::Binop::interpret`], [`crate::ir::Unop::interpret`]).
//! It exists
//!
//! - as an *oracle* for testing: the differential tests run random programs both through the
//!   compiled C and through [`run_assignments`] and compare the results;
//! - as a *debugging aid* for users: a program can be run without a C compiler, with every
//!   out-of-bounds index reported as an error naming the tensor instead of a crash (it is
//!   meant to back `arrayjit run --interpret`), and its intermediate tensors can be inspected
//!   afterwards (every node the code writes stays in the [`Memory`], including ones that the
//!   compiled code would keep in registers or in routine-local arrays).
//!
//! # Using it
//!
//! 1. Put the inputs into a [`Memory`]: [`Memory::load_from_hosts`] copies the host arrays of
//!    hosted nodes (like `from_host`), [`Memory::set`] sets any node's values directly.
//! 2. Run: [`run_assignments`] lowers assignments and runs them as written (no optimization,
//!    no memory-mode decisions: the same nodes can still be compiled afterwards);
//!    [`run_optimized`] runs the body the optimizer produced for a compiled routine
//!    (`Code::optimized()` of the cc backend), to tell optimizer problems from C problems;
//!    [`run`] runs any loop IR. Static index values are passed as `(symbol, value)` pairs.
//! 3. Read results with [`Memory::get`], or copy them back into the host arrays with
//!    [`Memory::store_to_hosts`] (like `to_host`). The memory keeps every node between runs,
//!    so running again continues from the current state, as a routine does on a device.
//!
//! A merge buffer is set with [`Memory::set_merge`]; imported C functions
//! ([`crate::ir::FetchOp::Imported`]) are replaced by Rust closures registered with
//! [`Memory::set_function`].
//!
//! # Semantics
//!
//! - **Values** of a node are kept as `f64`, always already rounded to the node's precision.
//! - **Operations** are computed in `f64`, with the operation table's `interpret` functions.
//! - **Operands** are converted to the *compute type* of the precision being written (the
//!   node of the enclosing `Set`, or the virtual node of the enclosing `SetLocal`; see
//!   [`Prec::compute_c_type`]), exactly as the generated C converts them: reading a `double`
//!   node, a constant, an index value or the result of an imported function while writing a
//!   `half` or `single` node rounds the operand to `f32` ([`Prec::round_compute`]). Operands of
//!   other precisions are exact in every compute type.
//! - **Stores**: every `Set` rounds to the written node's precision ([`Prec::round`]; bytes
//!   truncate toward zero and wrap modulo 256, NaN and infinities become 0), and every `SetLocal`
//!   rounds to the precision of the local's (virtual) node.
//! - `ZeroOut` fills a node with zeros; a `LocalScope` starts its local at 0, runs its body
//!   and yields the local.
//! - Indices are fixed positions, loop iterators, static indices (their given values), or the
//!   strip-mined `outer * stride + inner` of the optimizer's loop passes.
//! - Nodes that the memory does not hold yet are created filled with zeros when first touched.
//!   With [`run_optimized`], nodes that the optimizer made `Local` are zeroed before each run
//!   (as the generated C declares them zero-initialized in the function).
//!
//! The only differences from compiled code are therefore the intermediate results of
//! expressions that C computes in `float` (for half and single nodes), which the interpreter
//! keeps in `f64`, the C compiler's freedom to contract `a * b + c` into a fused
//! multiply-add, the last bits of some `libm` functions, and, against optimized code, the
//! order in which long reductions are summed (the optimizer may split them into independent
//! partial sums). When every operation's exact result is representable in the compute type
//! (e.g. `+ - *` on small dyadic rationals), the results are bit-identical.
//!
//! # Errors
//!
//! Before anything is executed, the code is checked against the memory and the static index
//! values, so that a failing run leaves the memory untouched:
//!
//! - a static index value outside its declared range is [`Error::BindingOutOfRange`];
//! - a static index value (or a fixed index, or a loop range) that would index outside the
//!   axis of a tensor is an [`Error::Interpreter`] naming the tensor, the axis and the index;
//! - an index symbol that is neither a loop iterator nor one of the given static indices, a
//!   merge buffer that does not hold the node the code reads from it
//!   ([`Error::MergeBufferMismatch`]), or an imported C function that was not registered with
//!   [`Memory::set_function`] are errors too.
//!
//! The interpreter never panics on malformed code; every access is also bounds-checked while
//! running.
//!
//! # Example
//!
//! ```
//! use arrayjit::interp::{self, Memory};
//! use arrayjit::ir::einsum::projections;
//! use arrayjit::ir::{Assignments, Bindings, Binop, Buffer, Prec, Tnode};
//!
//! let x = Tnode::new(&["x"], &[2, 3], Prec::Single).unwrap();
//! let s = Tnode::new(&["s"], &[2], Prec::Single).unwrap();
//! let b = Bindings::empty();
//! let sum_rows = Assignments::AccumUnop {
//!     initialize_neutral: true,
//!     accum: Binop::Add,
//!     op: arrayjit::ir::Unop::Identity,
//!     lhs: s.clone(),
//!     rhs: Buffer::Node(x.clone()),
//!     projections: projections("ij->i", s.dims(), &[x.dims()], &b).unwrap(),
//! };
//! let mut mem = Memory::new();
//! mem.set(&x, vec![1., 2., 3., 4., 5., 6.]).unwrap();
//! interp::run_assignments(&sum_rows, &[], &mut mem).unwrap();
//! assert_eq!(mem.get(&s).unwrap(), &[6., 15.]);
//! ```

use crate::error::{Error, Result};
use crate::ir::ndarray::{checked_numel, try_filled};
use crate::ir::prec::int_bits_of_f64;
use crate::ir::{
    Assignments, AxisIndex, Compute, IntCtx, MemoryMode, Prec, StaticSymbol, Symbol, Tnode,
};
use crate::loops::{Llc, Llv, Vlv};
use crate::lower;
use crate::optimize::Optimized;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// A Rust function standing in for an imported C function `double NAME(void)`
/// ([`crate::ir::FetchOp::Imported`]).
pub type ImportedFn = Arc<dyn Fn() -> f64 + Send + Sync>;

/// The name [`run`] and [`run_assignments`] use for the routine in error messages.
pub const DEFAULT_ROUTINE_NAME: &str = "interpreted routine";

/// The state an interpreted routine runs on: the values of every node, this device's merge
/// buffer, and the functions standing in for imported C functions.
///
/// Values are stored as `f64`, rounded to each node's precision.
#[derive(Clone, Default)]
pub struct Memory {
    nodes: HashMap<Tnode, Vec<f64>>,
    /// Exact 64-bit patterns of integer nodes whose values may not all be exact as `f64`
    /// (authoritative when present; `nodes` then holds the same values rounded).
    ints: HashMap<Tnode, Vec<u64>>,
    merge: Option<(Tnode, Vec<f64>)>,
    /// Exact 64-bit patterns of an integer node in the merge buffer (authoritative when
    /// present, as `ints` is for nodes).
    merge_ints: Option<Vec<u64>>,
    functions: HashMap<String, ImportedFn>,
}

impl fmt::Debug for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut nodes: Vec<(&Tnode, &Vec<f64>)> = self.nodes.iter().collect();
        nodes.sort_by(|a, b| a.0.cmp(b.0));
        let mut names: Vec<&String> = self.functions.keys().collect();
        names.sort();
        f.debug_struct("Memory")
            .field("nodes", &nodes)
            .field("merge", &self.merge)
            .field("functions", &names)
            .finish()
    }
}

fn check_len(tn: &Tnode, values: &[f64], what: &str) -> Result<()> {
    if values.len() != tn.numel() {
        return Err(Error::Count {
            what: format!("{what} for tensor {} (dims {:?})", tn.name(), tn.dims()),
            expected: tn.numel(),
            got: values.len(),
        });
    }
    Ok(())
}

/// A node's values, all zero; [`Error::OutOfMemory`] (naming the node) when they cannot be
/// allocated, instead of aborting.
pub fn zeroed_values(tn: &Tnode) -> Result<Vec<f64>> {
    let n = checked_numel(tn.dims())?;
    try_filled(n, 0.0, || {
        format!("the interpreter's values of tensor {}", tn.name())
    })
}

/// A copy of a node's host values, if it has a host array; [`Error::OutOfMemory`] (naming the
/// node) when the copy cannot be allocated.
fn try_host_values(tn: &Tnode) -> Result<Option<Vec<f64>>> {
    let what = format!("the interpreter's values of tensor {}", tn.name());
    tn.with_host(|a| a.try_to_f64_vec(&what)).transpose()
}

impl Memory {
    /// An empty memory: no nodes, an empty merge buffer, no imported functions.
    pub fn new() -> Self {
        Memory::default()
    }

    /// Sets all values of a node (row-major), rounding them to the node's precision.
    ///
    /// An error if the number of values differs from the node's number of cells.
    pub fn set(&mut self, tn: &Tnode, mut values: Vec<f64>) -> Result<()> {
        check_len(tn, &values, "interpreter memory")?;
        let p = tn.prec();
        for v in &mut values {
            *v = p.round(*v);
        }
        self.ints.remove(tn);
        self.nodes.insert(tn.clone(), values);
        Ok(())
    }

    /// The exact values of an integer node (an `int64` or `uint64` beyond 2^53 included), if
    /// the memory holds it.
    pub fn get_int(&self, tn: &Tnode) -> Option<Vec<i128>> {
        let p = tn.prec();
        if !p.is_integer() {
            return None;
        }
        match self.ints.get(tn) {
            Some(v) => Some(v.iter().map(|&b| p.wrap_int(b)).collect()),
            None => self
                .nodes
                .get(tn)
                .map(|v| v.iter().map(|&x| p.wrap_int(int_bits_of_f64(x))).collect()),
        }
    }

    /// Sets all values of an integer node exactly (each wrapped into the precision); an error
    /// for a floating node or a wrong number of values.
    pub fn set_int(&mut self, tn: &Tnode, values: &[i128]) -> Result<()> {
        let p = tn.prec();
        if !p.is_integer() {
            return Err(Error::PrecisionMismatch {
                expected: "an integer precision".into(),
                actual: p.name().to_string(),
            });
        }
        let bits: Vec<u64> = values
            .iter()
            .map(|&v| p.wrap_int(v as u64) as u64)
            .collect();
        let f: Vec<f64> = bits.iter().map(|&b| p.wrap_int(b) as f64).collect();
        check_len(tn, &f, "interpreter memory")?;
        self.nodes.insert(tn.clone(), f);
        self.ints.insert(tn.clone(), bits);
        Ok(())
    }

    /// Loads a node's exact integer values from its host array, if it is an integer node.
    fn load_host_ints(&mut self, tn: &Tnode) {
        self.ints.remove(tn);
        if tn.prec().is_integer() {
            if let Some(v) = tn.with_host(|a| {
                (0..a.len())
                    .map(|i| a.get_int(i).unwrap_or(0) as u64)
                    .collect::<Vec<u64>>()
            }) {
                self.ints.insert(tn.clone(), v);
            }
        }
    }

    /// The values of a node, if the memory holds it.
    pub fn get(&self, tn: &Tnode) -> Option<&[f64]> {
        self.nodes.get(tn).map(Vec::as_slice)
    }

    /// Removes a node from the memory, returning its values.
    pub fn remove(&mut self, tn: &Tnode) -> Option<Vec<f64>> {
        self.ints.remove(tn);
        self.nodes.remove(tn)
    }

    /// The nodes the memory holds, in order of node id.
    pub fn nodes(&self) -> Vec<Tnode> {
        let mut v: Vec<Tnode> = self.nodes.keys().cloned().collect();
        v.sort();
        v
    }

    /// Makes the merge buffer hold `tn` with the given values (rounded to `tn`'s precision).
    ///
    /// An error if the number of values differs from the node's number of cells.
    pub fn set_merge(&mut self, tn: &Tnode, mut values: Vec<f64>) -> Result<()> {
        check_len(tn, &values, "interpreter merge buffer")?;
        let p = tn.prec();
        for v in &mut values {
            *v = p.round(*v);
        }
        self.merge = Some((tn.clone(), values));
        self.merge_ints = None;
        Ok(())
    }

    /// Makes the merge buffer hold the integer node `tn` with the given values, exactly
    /// (each wrapped into the precision); an error for a floating node or a wrong number of
    /// values.
    pub fn set_merge_int(&mut self, tn: &Tnode, values: &[i128]) -> Result<()> {
        let p = tn.prec();
        if !p.is_integer() {
            return Err(Error::PrecisionMismatch {
                expected: "an integer precision".into(),
                actual: p.name().to_string(),
            });
        }
        let bits: Vec<u64> = values.iter().map(|&v| v as u64).collect();
        let f: Vec<f64> = bits.iter().map(|&b| p.wrap_int(b) as f64).collect();
        check_len(tn, &f, "interpreter merge buffer")?;
        self.merge = Some((tn.clone(), f));
        self.merge_ints = Some(bits);
        Ok(())
    }

    /// What the merge buffer holds, if anything.
    pub fn merge(&self) -> Option<(&Tnode, &[f64])> {
        self.merge.as_ref().map(|(t, v)| (t, v.as_slice()))
    }

    /// Empties the merge buffer.
    pub fn clear_merge(&mut self) {
        self.merge = None;
        self.merge_ints = None;
    }

    /// Registers a Rust function to be called where the code calls the imported C function
    /// `name` (a [`crate::ir::FetchOp::Imported`] fetch).
    pub fn set_function(&mut self, name: &str, f: impl Fn() -> f64 + Send + Sync + 'static) {
        self.functions.insert(name.to_string(), Arc::new(f));
    }

    /// Like [`Memory::load_from_hosts`], but a copy that cannot be allocated is
    /// [`Error::OutOfMemory`] naming the node (the nodes before it are loaded) instead of
    /// aborting the process.
    pub fn try_load_from_hosts<'a>(
        &mut self,
        nodes: impl IntoIterator<Item = &'a Tnode>,
    ) -> Result<usize> {
        let mut n = 0;
        for tn in nodes {
            if let Some(values) = try_host_values(tn)? {
                self.nodes.insert(tn.clone(), values);
                self.load_host_ints(tn);
                n += 1;
            }
        }
        Ok(n)
    }

    /// Copies the host arrays of the given nodes that are hosted into the memory (like
    /// `from_host`); returns how many were copied. Nodes without a host array are skipped.
    ///
    /// Aborts the process, like `vec!`, when a copy cannot be allocated; use
    /// [`Memory::try_load_from_hosts`] for sizes that come from user input.
    pub fn load_from_hosts<'a>(&mut self, nodes: impl IntoIterator<Item = &'a Tnode>) -> usize {
        let mut n = 0;
        for tn in nodes {
            if let Some(values) = tn.host_values() {
                self.nodes.insert(tn.clone(), values);
                self.load_host_ints(tn);
                n += 1;
            }
        }
        n
    }

    /// Copies the values of the given nodes that are hosted and held by the memory back into
    /// their host arrays (like `to_host`); returns how many were copied.
    pub fn store_to_hosts<'a>(&self, nodes: impl IntoIterator<Item = &'a Tnode>) -> Result<usize> {
        let mut n = 0;
        for tn in nodes {
            if let (true, Some(values)) = (tn.is_hosted(), self.nodes.get(tn)) {
                tn.set_host_values(values)?;
                if let Some(bits) = self.ints.get(tn) {
                    tn.with_host_mut(|a| {
                        for (i, &b) in bits.iter().enumerate() {
                            a.set_int(i, i128::from(b));
                        }
                    });
                }
                n += 1;
            }
        }
        Ok(n)
    }

    /// The values of a node, created zero-filled if the memory does not hold it yet.
    fn values_mut(&mut self, tn: &Tnode) -> Result<&mut Vec<f64>> {
        match self.nodes.entry(tn.clone()) {
            std::collections::hash_map::Entry::Occupied(e) => Ok(e.into_mut()),
            std::collections::hash_map::Entry::Vacant(e) => Ok(e.insert(zeroed_values(tn)?)),
        }
    }
}

/// Runs loop IR (optimized or not) on `mem`.
///
/// `statics` gives the value of every static index the code uses. Every node the code reads
/// or writes persists in `mem` (nodes missing from it are created zeroed). Errors are
/// described in the [module documentation](self); the code is checked before anything runs.
pub fn run(code: &Llc, statics: &[(StaticSymbol, i64)], mem: &mut Memory) -> Result<()> {
    run_named(DEFAULT_ROUTINE_NAME, code, statics, mem)
}

/// Like [`run`], with the routine's name for error messages.
pub fn run_named(
    routine: &str,
    code: &Llc,
    statics: &[(StaticSymbol, i64)],
    mem: &mut Memory,
) -> Result<()> {
    let mut m = Machine::new(routine, statics, mem)?;
    m.check_stmt(code, &mut vec![])?;
    m.exec(code)
}

/// Runs an optimized routine body: its `Local` nodes are zeroed first (as the generated C
/// zero-initializes them on every call); every other node persists in `mem`.
pub fn run_optimized(
    o: &Optimized,
    statics: &[(StaticSymbol, i64)],
    mem: &mut Memory,
) -> Result<()> {
    let mut m = Machine::new(&o.name, statics, mem)?;
    m.check_stmt(&o.code, &mut vec![])?;
    for (tn, mode) in &o.nodes {
        if *mode == MemoryMode::Local {
            m.mem.nodes.insert(tn.clone(), zeroed_values(tn)?);
            m.mem.ints.remove(tn);
        }
    }
    m.exec(&o.code)
}

/// Lowers assignments and runs the *unoptimized* loop IR on `mem` (see [`run`]).
///
/// This does not touch the nodes' memory modes: the same nodes can be compiled afterwards.
pub fn run_assignments(
    asgns: &Assignments,
    statics: &[(StaticSymbol, i64)],
    mem: &mut Memory,
) -> Result<()> {
    let name = asgns.first_comment().unwrap_or(DEFAULT_ROUTINE_NAME);
    let code = lower::lower(asgns)?;
    run_named(name, &code, statics, mem)
}

struct Machine<'m> {
    routine: &'m str,
    mem: &'m mut Memory,
    /// Loop iterators currently bound.
    env: HashMap<Symbol, i64>,
    statics: HashMap<Symbol, (&'m StaticSymbol, i64)>,
    locals: HashMap<u32, f64>,
    /// Exact 64-bit patterns of integer locals.
    int_locals: HashMap<u32, u64>,
    /// Vector variables, lane by lane (each lane rounded to the vector's precision).
    vregs: HashMap<u32, Vec<f64>>,
    /// Integer vector variables (`uint16`, `uint32`, `uint64` lanes), lane by lane: exact
    /// patterns.
    int_vregs: HashMap<u32, Vec<u64>>,
}

/// A loop iterator in scope during checking: its symbol and its range.
type Bound = (Symbol, i64, i64);

/// A marker pushed on the bounds while checking the body of a guard ([`Llc::If`]): symbol 0
/// is never a fresh symbol.
const GUARD: Symbol = Symbol(0);

impl<'m> Machine<'m> {
    fn new(
        routine: &'m str,
        statics: &'m [(StaticSymbol, i64)],
        mem: &'m mut Memory,
    ) -> Result<Machine<'m>> {
        let mut map = HashMap::new();
        for (s, v) in statics {
            if let Some(range) = s.range {
                if *v < 0 || *v as u64 >= range as u64 {
                    return Err(Error::BindingOutOfRange {
                        routine: routine.to_string(),
                        index: s.name.clone(),
                        value: *v,
                        limit: range,
                    });
                }
            }
            map.insert(s.symbol, (s, *v));
        }
        Ok(Machine {
            routine,
            mem,
            env: HashMap::new(),
            statics: map,
            locals: HashMap::new(),
            int_locals: HashMap::new(),
            vregs: HashMap::new(),
            int_vregs: HashMap::new(),
        })
    }

    // ---- Checking (before running) ----

    fn check_index(
        &self,
        tn: &Tnode,
        what: &str,
        idcs: &[AxisIndex],
        bound: &[Bound],
    ) -> Result<()> {
        let dims = tn.dims();
        if idcs.len() != dims.len() {
            return Err(Error::Interpreter {
                routine: self.routine.to_string(),
                msg: format!(
                    "{what} tensor {} (dims {dims:?}) with {} indices",
                    tn.name(),
                    idcs.len()
                ),
            });
        }
        // Inside a guard (see `check_stmt`), accesses out of range are skipped at run time.
        let guarded = bound.iter().any(|b| b.0 == GUARD);
        for (axis, (ix, &d)) in idcs.iter().zip(dims).enumerate() {
            let bad = |desc: String| {
                if guarded {
                    return Ok(());
                }
                Err(Error::Interpreter {
                    routine: self.routine.to_string(),
                    msg: format!(
                        "{what} tensor {} out of bounds: {desc} indexes axis {axis}, whose \
                         extent is {d}",
                        tn.name()
                    ),
                })
            };
            match ix {
                AxisIndex::Fixed(k) => {
                    if *k >= d {
                        return bad(format!("fixed index {k}"));
                    }
                }
                AxisIndex::Iterator(s) => {
                    if let Some(&(_, from, to)) = bound.iter().rev().find(|b| b.0 == *s) {
                        if from <= to && (from < 0 || to >= d as i64) {
                            return bad(format!("loop iterator {s} ranging over {from}..={to}"));
                        }
                    } else if let Some((st, v)) = self.statics.get(s) {
                        if *v < 0 || *v >= d as i64 {
                            return bad(format!("static index {} = {v}", st.name));
                        }
                    } else {
                        return Err(self.unbound(*s, &format!("{what} tensor {}", tn.name())));
                    }
                }
                AxisIndex::Linear(l) => {
                    // The index ranges over offset + Σ coef·[from, to] of its loop iterators
                    // (static indices contribute their value).
                    let (mut lo, mut hi) = (l.offset as i128, l.offset as i128);
                    let mut empty = false;
                    for &(s, c) in l.terms() {
                        let c = c as i128;
                        if let Some(&(_, from, to)) = bound.iter().rev().find(|b| b.0 == s) {
                            empty |= from > to;
                            lo += c * from as i128;
                            hi += c * to as i128;
                        } else if let Some((_, v)) = self.statics.get(&s) {
                            lo += c * *v as i128;
                            hi += c * *v as i128;
                        } else {
                            return Err(self.unbound(s, &format!("{what} tensor {}", tn.name())));
                        }
                    }
                    if !empty && (lo < 0 || hi >= d as i128) {
                        return bad(format!("linear index {ix} ranging over {lo}..={hi}"));
                    }
                }
            }
        }
        Ok(())
    }

    fn unbound(&self, s: Symbol, place: &str) -> Error {
        Error::Interpreter {
            routine: self.routine.to_string(),
            msg: format!(
                "index {s} (used when {place}) is neither a loop iterator nor one of the \
             given static indices"
            ),
        }
    }

    fn check_stmt(&self, c: &Llc, bound: &mut Vec<Bound>) -> Result<()> {
        match c {
            // A prefetch is a hint: its address may lie outside the tensor.
            Llc::Noop | Llc::Comment(_) | Llc::Prefetch { .. } => Ok(()),
            Llc::Seq(v) => v.iter().try_for_each(|c| self.check_stmt(c, bound)),
            Llc::For {
                index,
                from,
                to,
                body,
                ..
            } => {
                bound.push((*index, *from, *to));
                let r = self.check_stmt(body, bound);
                bound.pop();
                r
            }
            // A parallel region means what the plain loop means.
            Llc::Parallel(p) => {
                bound.push((p.index, p.from, p.to));
                let r = self.check_stmt(&p.body, bound);
                bound.pop();
                r
            }
            Llc::If { guards, body } => {
                for (ix, _) in guards {
                    if let Some(s) = ix
                        .symbols()
                        .into_iter()
                        .find(|s| !bound.iter().any(|b| b.0 == *s) && !self.statics.contains_key(s))
                    {
                        return Err(self.unbound(s, "evaluating a guard"));
                    }
                }
                bound.push((GUARD, 1, 0));
                let r = self.check_stmt(body, bound);
                bound.pop();
                r
            }
            Llc::Lookup {
                symbol,
                tn,
                idcs,
                extent,
                body,
            } => {
                self.check_index(tn, "reading an index from", idcs, bound)?;
                if !tn.prec().is_integer() {
                    return Err(Error::Interpreter {
                        routine: self.routine.to_string(),
                        msg: format!("an index read from {} tensor {}", tn.prec(), tn.name()),
                    });
                }
                // The body runs only for values in 0..extent.
                bound.push((*symbol, 0, *extent as i64 - 1));
                let r = self.check_stmt(body, bound);
                bound.pop();
                r
            }
            Llc::ZeroOut(_) => Ok(()),
            Llc::Set { tn, idcs, value } => {
                self.check_index(tn, "writing", idcs, bound)?;
                self.check_value(value, bound)
            }
            Llc::SetLocal(_, value) => self.check_value(value, bound),
            Llc::VSet(_, v) => self.check_vector(v, bound),
            Llc::VStore { tn, idcs, value } => {
                self.check_index(tn, "writing", idcs, bound)?;
                self.check_vector(value, bound)
            }
        }
    }

    fn check_vector(&self, v: &Vlv, bound: &mut Vec<Bound>) -> Result<()> {
        match v {
            Vlv::Reg(_) | Vlv::Zero(_) => Ok(()),
            Vlv::Splat(_, x) => self.check_value(x, bound),
            Vlv::Load(_, tn, idcs) => self.check_index(tn, "reading", idcs, bound),
            Vlv::Fma(a, b, c) | Vlv::DotPairs(a, b, c) | Vlv::Ternop(_, a, b, c) => {
                self.check_vector(a, bound)?;
                self.check_vector(b, bound)?;
                self.check_vector(c, bound)
            }
            Vlv::Repeat(a, _) | Vlv::Unop(_, a) => self.check_vector(a, bound),
            Vlv::Binop(_, a, b) | Vlv::Shuffle(a, b, _) => {
                self.check_vector(a, bound)?;
                self.check_vector(b, bound)
            }
        }
    }

    fn check_value(&self, v: &Llv, bound: &mut Vec<Bound>) -> Result<()> {
        match v {
            Llv::LocalScope { body, .. } => self.check_stmt(body, bound),
            Llv::GetLocal(_) | Llv::Constant(_) => Ok(()),
            Llv::Get(tn, idcs) => self.check_index(tn, "reading", idcs, bound),
            Llv::GetMergeBuffer(tn, idcs) => {
                self.merge_values(tn)?;
                self.check_index(tn, "reading the merge buffer holding", idcs, bound)
            }
            Llv::GetCFunction(name) => self.function(name).map(|_| ()),
            Llv::Binop(_, a, b) => {
                self.check_value(a, bound)?;
                self.check_value(b, bound)
            }
            Llv::Unop(_, a) => self.check_value(a, bound),
            Llv::Ternop(_, a, b, c) => {
                self.check_value(a, bound)?;
                self.check_value(b, bound)?;
                self.check_value(c, bound)
            }
            Llv::Random { idcs, .. } => idcs
                .iter()
                .try_for_each(|ix| self.check_value(&Llv::EmbedIndex(*ix), bound)),
            Llv::EmbedIndex(AxisIndex::Fixed(_)) => Ok(()),
            Llv::EmbedIndex(AxisIndex::Linear(l)) => {
                match l.terms().iter().find(|(s, _)| {
                    !bound.iter().any(|b| b.0 == *s) && !self.statics.contains_key(s)
                }) {
                    None => Ok(()),
                    Some((s, _)) => Err(self.unbound(*s, "embedding an index value")),
                }
            }
            Llv::EmbedIndex(AxisIndex::Iterator(s)) => {
                if bound.iter().any(|b| b.0 == *s) || self.statics.contains_key(s) {
                    Ok(())
                } else {
                    Err(self.unbound(*s, "embedding an index value"))
                }
            }
        }
    }

    fn merge_values(&self, tn: &Tnode) -> Result<&[f64]> {
        match &self.mem.merge {
            Some((t, v)) if t == tn && v.len() == tn.numel() => Ok(v),
            other => Err(Error::MergeBufferMismatch {
                routine: self.routine.to_string(),
                expected: tn.name(),
                found: match other {
                    Some((t, _)) => t.name(),
                    None => "nothing".into(),
                },
            }),
        }
    }

    fn function(&self, name: &str) -> Result<ImportedFn> {
        self.mem
            .functions
            .get(name)
            .cloned()
            .ok_or_else(|| Error::Interpreter {
                routine: self.routine.to_string(),
                msg: format!(
                    "the imported C function {name:?} is not available to the \
                 interpreter (register a stand-in with Memory::set_function)"
                ),
            })
    }

    // ---- Running ----

    fn index(&self, ix: &AxisIndex) -> Result<i64> {
        let sym = |s: &Symbol| match self.env.get(s) {
            Some(v) => Ok(*v),
            None => match self.statics.get(s) {
                Some((_, v)) => Ok(*v),
                None => Err(self.unbound(*s, "running")),
            },
        };
        match ix {
            AxisIndex::Fixed(k) => Ok(*k as i64),
            AxisIndex::Iterator(s) => sym(s),
            AxisIndex::Linear(l) => l.terms().iter().try_fold(l.offset, |acc, (s, c)| {
                let v = sym(s)?;
                i64::try_from(*c)
                    .ok()
                    .and_then(|c| c.checked_mul(v))
                    .and_then(|t| acc.checked_add(t))
                    .ok_or_else(|| Error::Interpreter {
                        routine: self.routine.to_string(),
                        msg: format!("index {ix} overflows when running"),
                    })
            }),
        }
    }

    fn offset(&self, tn: &Tnode, idcs: &[AxisIndex]) -> Result<usize> {
        let dims = tn.dims();
        if idcs.len() != dims.len() {
            return Err(Error::Interpreter {
                routine: self.routine.to_string(),
                msg: format!(
                    "tensor {} (dims {dims:?}) indexed with {} indices",
                    tn.name(),
                    idcs.len()
                ),
            });
        }
        let mut off = 0usize;
        for (axis, (ix, &d)) in idcs.iter().zip(dims).enumerate() {
            let i = self.index(ix)?;
            if i < 0 || i >= d as i64 {
                return Err(Error::Interpreter {
                    routine: self.routine.to_string(),
                    msg: format!(
                        "index {i} ({ix}) on axis {axis} of tensor {} is out of bounds \
                     (extent {d})",
                        tn.name()
                    ),
                });
            }
            off = off * d + i as usize;
        }
        Ok(off)
    }

    fn exec_loop(&mut self, index: Symbol, from: i64, to: i64, body: &Llc) -> Result<()> {
        let prev = self.env.remove(&index);
        let mut r = Ok(());
        for i in from..=to {
            self.env.insert(index, i);
            r = self.exec(body);
            if r.is_err() {
                break;
            }
        }
        match prev {
            Some(p) => self.env.insert(index, p),
            None => self.env.remove(&index),
        };
        r
    }

    fn exec(&mut self, c: &Llc) -> Result<()> {
        match c {
            Llc::Noop | Llc::Comment(_) | Llc::Prefetch { .. } => Ok(()),
            Llc::Seq(v) => v.iter().try_for_each(|c| self.exec(c)),
            Llc::For {
                index,
                from,
                to,
                body,
                ..
            } => self.exec_loop(*index, *from, *to, body),
            // A parallel region runs as the plain loop (its iterations are independent, so
            // any order computes the same).
            Llc::Parallel(p) => self.exec_loop(p.index, p.from, p.to, &p.body),
            Llc::If { guards, body } => {
                for (ix, n) in guards {
                    let v = self.index(ix)?;
                    if v < 0 || v as u64 >= *n as u64 {
                        return Ok(());
                    }
                }
                self.exec(body)
            }
            Llc::Lookup {
                symbol,
                tn,
                idcs,
                extent,
                body,
            } => {
                // The exact integer value of the cell (wrapped into its precision).
                let off = self.offset(tn, idcs)?;
                let x = self.mem.values_mut(tn)?[off];
                let bits = match self.mem.ints.get(tn) {
                    Some(v) => v[off],
                    None => int_bits_of_f64(x),
                };
                let v = tn.prec().wrap_int(bits);
                if v < 0 || v >= *extent as i128 {
                    return Ok(());
                }
                let prev = self.env.insert(*symbol, v as i64);
                let r = self.exec(body);
                match prev {
                    Some(p) => self.env.insert(*symbol, p),
                    None => self.env.remove(symbol),
                };
                r
            }
            Llc::ZeroOut(tn) => {
                self.mem.values_mut(tn)?.fill(0.0);
                self.mem.ints.remove(tn);
                Ok(())
            }
            Llc::Set { tn, idcs, value } => {
                let (v, bits) = self.eval_stored(tn.prec(), value)?;
                let off = self.offset(tn, idcs)?;
                match bits {
                    Some(b) => self.store_int(tn, off, b),
                    None => {
                        self.mem.values_mut(tn)?[off] = v;
                        Ok(())
                    }
                }
            }
            Llc::SetLocal(id, value) => {
                let (v, bits) = self.eval_stored(id.tn.prec(), value)?;
                self.locals.insert(id.id, v);
                match bits {
                    Some(b) => self.int_locals.insert(id.id, b),
                    None => self.int_locals.remove(&id.id),
                };
                Ok(())
            }
            Llc::VSet(r, value) if r.ty.prec.is_integer() => {
                let v = self.eval_int_vector(value)?;
                self.int_vregs.insert(r.id, v);
                Ok(())
            }
            Llc::VSet(r, value) => {
                let v = self.eval_vector(value)?;
                self.vregs.insert(r.id, v);
                Ok(())
            }
            Llc::VStore { tn, idcs, value } if value.ty().prec.is_integer() => {
                // Each lane's pattern, wrapped into the tensor's precision.
                let v = self.eval_int_vector(value)?;
                let off = self.vector_span(tn, idcs, v.len(), "writing")?;
                for (i, bits) in v.into_iter().enumerate() {
                    self.store_int(tn, off + i, bits)?;
                }
                Ok(())
            }
            Llc::VStore { tn, idcs, value } => {
                let v = self.eval_vector(value)?;
                let off = self.vector_span(tn, idcs, v.len(), "writing")?;
                let p = tn.prec();
                for (dst, x) in self.mem.values_mut(tn)?[off..off + v.len()]
                    .iter_mut()
                    .zip(v)
                {
                    *dst = p.round(x);
                }
                Ok(())
            }
        }
    }

    /// The offset of the first of `lanes` consecutive elements, checked to lie within `tn`.
    fn vector_span(
        &self,
        tn: &Tnode,
        idcs: &[AxisIndex],
        lanes: usize,
        what: &str,
    ) -> Result<usize> {
        let off = self.offset(tn, idcs)?;
        if off + lanes > tn.numel() {
            return Err(Error::Interpreter {
                routine: self.routine.to_string(),
                msg: format!(
                    "{what} {lanes} lanes of tensor {} from offset {off} goes past its \
                 {} elements",
                    tn.name(),
                    tn.numel()
                ),
            });
        }
        Ok(off)
    }

    /// Stores the 64-bit pattern `bits` into cell `off` of the integer tensor `tn`, wrapped
    /// into its precision, keeping the tensor's exact patterns.
    fn store_int(&mut self, tn: &Tnode, off: usize, bits: u64) -> Result<()> {
        let exact = tn.prec().wrap_int(bits);
        self.mem.values_mut(tn)?[off] = exact as f64;
        if !self.mem.ints.contains_key(tn) {
            let derived: Vec<u64> = self
                .mem
                .values_mut(tn)?
                .iter()
                .map(|&x| int_bits_of_f64(x))
                .collect();
            self.mem.ints.insert(tn.clone(), derived);
        }
        if let Some(ints) = self.mem.ints.get_mut(tn) {
            ints[off] = exact as u64;
        }
        Ok(())
    }

    /// Evaluates an integer vector (`uint16`, `uint32` or `uint64` lanes) lane by lane: exact
    /// patterns, every operation wrapping modulo 2^bits of a lane.
    fn eval_int_vector(&mut self, v: &Vlv) -> Result<Vec<u64>> {
        let ty = v.ty();
        let bits = 8 * ty.prec.size_in_bytes() as u32;
        let wrap = |x: u64| {
            if bits >= 64 {
                x
            } else {
                x & ((1u64 << bits) - 1)
            }
        };
        Ok(match v {
            Vlv::Reg(r) => match self.int_vregs.get(&r.id) {
                Some(v) => v.clone(),
                None => {
                    return Err(Error::Interpreter {
                        routine: self.routine.to_string(),
                        msg: format!("vector variable {} is read before it is set", r.id),
                    })
                }
            },
            Vlv::Zero(t) => vec![0; t.lanes],
            Vlv::Splat(t, x) => {
                let (_, b) = self.eval_stored(t.prec, x)?;
                vec![wrap(b.unwrap_or(0)); t.lanes]
            }
            Vlv::Load(t, tn, idcs) => {
                let off = self.vector_span(tn, idcs, t.lanes, "reading")?;
                let values = self.mem.values_mut(tn)?[off..off + t.lanes].to_vec();
                match self.mem.ints.get(tn) {
                    Some(exact) => exact[off..off + t.lanes].iter().map(|&b| wrap(b)).collect(),
                    None => values.iter().map(|&x| wrap(int_bits_of_f64(x))).collect(),
                }
            }
            Vlv::Fma(a, b, c) => {
                let (a, b, c) = (
                    self.eval_int_vector(a)?,
                    self.eval_int_vector(b)?,
                    self.eval_int_vector(c)?,
                );
                a.iter()
                    .zip(&b)
                    .zip(&c)
                    .map(|((a, b), c)| wrap(a.wrapping_mul(*b).wrapping_add(*c)))
                    .collect()
            }
            Vlv::Binop(op, a, b) => {
                let (a, b) = (self.eval_int_vector(a)?, self.eval_int_vector(b)?);
                // Lanes hold `bits`-bit patterns; signed lanes are sign-extended for the
                // operation, which sees their exact values.
                let signed = ty.prec.is_signed_integer();
                let ext = |x: u64| {
                    if signed && bits < 64 {
                        (((x << (64 - bits)) as i64) >> (64 - bits)) as u64
                    } else {
                        x
                    }
                };
                let cx = IntCtx::new(bits, !signed, !signed);
                a.iter()
                    .zip(&b)
                    .map(|(a, b)| wrap(op.interpret_int(ext(*a), ext(*b), cx)))
                    .collect()
            }
            Vlv::Shuffle(a, b, idx) => {
                let (a, b) = (self.eval_int_vector(a)?, self.eval_int_vector(b)?);
                idx.iter()
                    .map(|&i| if i < a.len() { a[i] } else { b[i - a.len()] })
                    .collect()
            }
            Vlv::Repeat(a, times) => {
                let a = self.eval_int_vector(a)?;
                let n = a.len();
                a.into_iter().cycle().take(n * times).collect()
            }
            Vlv::DotPairs(..) | Vlv::Unop(..) | Vlv::Ternop(..) => {
                return Err(Error::Interpreter {
                    routine: self.routine.to_string(),
                    msg: format!(
                        "{} lanes have no dot products, vector functions or ternary operations",
                        ty.prec
                    ),
                })
            }
        })
    }

    /// Evaluates a vector lane by lane; every operation rounds to the vector's precision.
    fn eval_vector(&mut self, v: &Vlv) -> Result<Vec<f64>> {
        let ty = v.ty();
        let round = |x: f64| ty.prec.round_compute(x);
        Ok(match v {
            Vlv::Reg(r) => match self.vregs.get(&r.id) {
                Some(v) => v.clone(),
                None => {
                    return Err(Error::Interpreter {
                        routine: self.routine.to_string(),
                        msg: format!("vector variable {} is read before it is set", r.id),
                    })
                }
            },
            Vlv::Zero(t) => vec![0.0; t.lanes],
            Vlv::Splat(t, x) => {
                vec![round(self.eval(x, Compute::of(t.prec, []))?); t.lanes]
            }
            Vlv::Load(t, tn, idcs) => {
                let off = self.vector_span(tn, idcs, t.lanes, "reading")?;
                self.mem.values_mut(tn)?[off..off + t.lanes]
                    .iter()
                    .map(|&x| round(x))
                    .collect()
            }
            Vlv::Fma(a, b, c) => {
                let (a, b, c) = (
                    self.eval_vector(a)?,
                    self.eval_vector(b)?,
                    self.eval_vector(c)?,
                );
                a.iter()
                    .zip(&b)
                    .zip(&c)
                    .map(|((a, b), c)| round(a.mul_add(*b, *c)))
                    .collect()
            }
            Vlv::Binop(op, a, b) => {
                let (a, b) = (self.eval_vector(a)?, self.eval_vector(b)?);
                a.iter()
                    .zip(&b)
                    .map(|(a, b)| round(op.interpret(*a, *b)))
                    .collect()
            }
            Vlv::Unop(op, a) => self
                .eval_vector(a)?
                .into_iter()
                .map(|a| round(op.interpret(a)))
                .collect(),
            Vlv::Ternop(op, a, b, c) => {
                let (a, b, c) = (
                    self.eval_vector(a)?,
                    self.eval_vector(b)?,
                    self.eval_vector(c)?,
                );
                let in_float = ty.prec.computes_in_float();
                a.iter()
                    .zip(&b)
                    .zip(&c)
                    .map(|((a, b), c)| round(op.interpret(in_float, *a, *b, *c)))
                    .collect()
            }
            Vlv::Shuffle(a, b, idx) => {
                let (a, b) = (self.eval_vector(a)?, self.eval_vector(b)?);
                idx.iter()
                    .map(|&i| if i < a.len() { a[i] } else { b[i - a.len()] })
                    .collect()
            }
            Vlv::Repeat(a, times) => {
                let a = self.eval_vector(a)?;
                let n = a.len();
                a.into_iter().cycle().take(n * times).collect()
            }
            Vlv::DotPairs(acc, a, b) => {
                let (acc, a, b) = (
                    self.eval_vector(acc)?,
                    self.eval_vector(a)?,
                    self.eval_vector(b)?,
                );
                acc.iter()
                    .enumerate()
                    .map(|(i, &s)| {
                        let s = dot_pair_step(s, a[2 * i + 1], b[2 * i + 1]);
                        dot_pair_step(s, a[2 * i], b[2 * i])
                    })
                    .collect()
            }
        })
    }

    /// Evaluates the value of a statement writing precision `p`, in the statement's compute
    /// type (SPEC 9.1), and rounds it to `p` as a store does.
    /// For integer precisions, the stored 64-bit pattern comes too.
    fn eval_stored(&mut self, p: Prec, value: &Llv) -> Result<(f64, Option<u64>)> {
        let c = crate::loops::statement_compute(p, value);
        let bits = if c.is_integer() {
            self.eval_int(value, p.int_bits().unwrap_or(64))?
        } else if p.is_integer() {
            int_bits_of_f64(self.eval(value, c)?)
        } else {
            return Ok((p.round(c.round_float(self.eval(value, c)?)), None));
        };
        let exact = p.wrap_int(bits);
        Ok((exact as f64, Some(exact as u64)))
    }

    /// The exact pattern of an integer local.
    fn local_int(&self, id: &crate::loops::ScopeId) -> Result<u64> {
        match self.int_locals.get(&id.id) {
            Some(b) => Ok(*b),
            None => Ok(int_bits_of_f64(self.local(id)?)),
        }
    }

    /// The value of a local, or an error if it is read outside its scope.
    fn local(&self, id: &crate::loops::ScopeId) -> Result<f64> {
        match self.locals.get(&id.id) {
            Some(v) => Ok(*v),
            None => Err(Error::Interpreter {
                routine: self.routine.to_string(),
                msg: format!(
                    "local v{} of tensor {} is read outside its scope",
                    id.id,
                    id.tn.name()
                ),
            }),
        }
    }

    /// Evaluates a value in the integer compute type: 64-bit wrapping patterns, each operation
    /// reading its operands with their own signedness (SPEC 9.1, exact values); `width` is
    /// the result's width in bits.
    fn eval_int(&mut self, v: &Llv, width: u32) -> Result<u64> {
        use crate::loops::int_unsigned;
        Ok(match v {
            Llv::Constant(c) => int_bits_of_f64(*c),
            Llv::EmbedIndex(ix) => self.index(ix)? as u64,
            Llv::Get(tn, idcs) => {
                let off = self.offset(tn, idcs)?;
                let x = self.mem.values_mut(tn)?[off];
                match self.mem.ints.get(tn) {
                    Some(v) => v[off],
                    None => int_bits_of_f64(x),
                }
            }
            Llv::GetMergeBuffer(tn, idcs) => {
                let off = self.offset(tn, idcs)?;
                let x = self.merge_values(tn)?[off];
                match &self.mem.merge_ints {
                    Some(v) => v[off],
                    None => int_bits_of_f64(x),
                }
            }
            Llv::GetCFunction(name) => {
                let f = self.function(name)?;
                int_bits_of_f64(f())
            }
            Llv::GetLocal(id) => self.local_int(id)?,
            Llv::LocalScope { id, body, .. } => {
                self.locals.insert(id.id, 0.0);
                self.int_locals.remove(&id.id);
                self.exec(body)?;
                self.local_int(id)?
            }
            Llv::Binop(op, a, b) => {
                let cx = IntCtx::new(width, int_unsigned(a), int_unsigned(b));
                let a = self.eval_int(a, width)?;
                let b = self.eval_int(b, width)?;
                op.interpret_int(a, b, cx)
            }
            Llv::Unop(op, a) => {
                let cx = IntCtx::new(width, int_unsigned(a), false);
                let a = self.eval_int(a, width)?;
                op.interpret_int(a, cx)
            }
            Llv::Ternop(op, a, b, c) => {
                let a = self.eval_int(a, width)?;
                let b = self.eval_int(b, width)?;
                let c = self.eval_int(c, width)?;
                op.interpret_int(a, b, c)
            }
            Llv::Random {
                seed,
                idcs,
                dims,
                prec,
            } => {
                let off = self.random_offset(idcs, dims)?;
                match crate::ir::random::float_format(*prec) {
                    // A floating random value read by an integer statement: never the case
                    // (the statement would compute in a floating type), kept exact anyway.
                    Some(_) => int_bits_of_f64(crate::ir::random::value(*seed, off, *prec)),
                    None => u64::from(crate::ir::random::word(*seed, off)),
                }
            }
        })
    }

    /// The row-major offset of a random fetch's cell, wrapping like the C (offsets fit in 64
    /// bits anyway).
    fn random_offset(&self, idcs: &[AxisIndex], dims: &[usize]) -> Result<u64> {
        let mut off: u64 = 0;
        for (ix, &d) in idcs.iter().zip(dims) {
            let i = self.index(ix)?;
            off = off.wrapping_mul(d as u64).wrapping_add(i as u64);
        }
        Ok(off)
    }

    /// Evaluates a value in a floating compute type `c`: operands are converted to it,
    /// operations are computed in `f64` and each result is rounded to `c`.
    fn eval(&mut self, v: &Llv, c: Compute) -> Result<f64> {
        Ok(match v {
            Llv::Constant(x) => c.round_float(*x),
            Llv::EmbedIndex(ix) => c.round_float(self.index(ix)? as f64),
            Llv::Get(tn, idcs) => {
                let off = self.offset(tn, idcs)?;
                let x = self.mem.values_mut(tn)?[off];
                match (self.mem.ints.get(tn), c) {
                    // An exact integer converted once (as C converts it), not through f64.
                    (Some(v), Compute::F32) => tn.prec().wrap_int(v[off]) as f32 as f64,
                    (Some(v), _) => tn.prec().wrap_int(v[off]) as f64,
                    (None, _) => c.round_float(x),
                }
            }
            Llv::GetMergeBuffer(tn, idcs) => {
                let off = self.offset(tn, idcs)?;
                c.round_float(self.merge_values(tn)?[off])
            }
            Llv::GetCFunction(name) => {
                let f = self.function(name)?;
                c.round_float(f())
            }
            Llv::GetLocal(id) => c.round_float(self.local(id)?),
            Llv::LocalScope { id, body, .. } => {
                self.locals.insert(id.id, 0.0);
                self.int_locals.remove(&id.id);
                self.exec(body)?;
                let v = self.locals.get(&id.id).copied().unwrap_or(0.0);
                c.round_float(v)
            }
            // Every operation rounds to the compute type, as the C computes in it.
            Llv::Binop(op, a, b) => {
                let a = self.eval(a, c)?;
                let b = self.eval(b, c)?;
                c.round_float(op.interpret(a, b))
            }
            Llv::Unop(op, a) => {
                let a = self.eval(a, c)?;
                c.round_float(op.interpret(a))
            }
            Llv::Ternop(op, a, b, x) => {
                let a = self.eval(a, c)?;
                let b = self.eval(b, c)?;
                let x = self.eval(x, c)?;
                op.interpret(c == Compute::F32, a, b, x)
            }
            Llv::Random {
                seed,
                idcs,
                dims,
                prec,
            } => {
                let off = self.random_offset(idcs, dims)?;
                c.round_float(crate::ir::random::value(*seed, off, *prec))
            }
        })
    }
}

/// One step of `vdpbf16ps` (see [`Vlv::DotPairs`]): `s + x·y` rounded once to single
/// precision (nearest even), subnormal inputs and a subnormal result taken as zero of their
/// sign. `x·y` (two bfloat16 values: 8-bit significands) is exact in double. So is `s + x·y`
/// when the exponents of the two terms are within 29 of each other (24 + 29 bits fit in
/// double's 53); otherwise the smaller term is below a 64th of an ulp of the larger (in
/// single), which the rounding to single drops either way. One rounding in all cases.
fn dot_pair_step(s: f64, x: f64, y: f64) -> f64 {
    let flush = |v: f64| {
        if v != 0.0 && v.abs() < f32::MIN_POSITIVE as f64 {
            0.0f64.copysign(v)
        } else {
            v
        }
    };
    flush((flush(s) + flush(x) * flush(y)) as f32 as f64)
}
