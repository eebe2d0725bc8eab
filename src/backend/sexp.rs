//! Structural dumps of backend values as S-expressions (the seed's `sexp_of_*` functions).
//! `sexp::Sexp` implements `Display`, so `println!("{}", sexp_of_context(&ctx))` prints a
//! readable one-line dump.

use super::buffer::BufferPtr;
use super::cc::{Code, CodeBatch, Routine};
use super::context::Context;
use super::device::Device;
use crate::ir::Tnode;
use sexp::{atom_i, atom_s, list, Sexp};

fn field(name: &str, value: Sexp) -> Sexp {
    list(&[atom_s(name), value])
}

fn tnode(tn: &Tnode) -> Sexp {
    list(&[
        atom_s(&tn.name()),
        atom_i(tn.id() as i64),
        atom_s(&format!("{:?}", tn.dims())),
        atom_s(tn.prec().name()),
        atom_s(
            &tn.declared_memory_mode()
                .map_or("undecided".into(), |(m, _)| format!("{m:?}")),
        ),
    ])
}

/// A compiled routine: its name, whether it is compiled or postponed, its merge node and
/// the nodes it uses with their memory modes.
pub fn sexp_of_code(code: &Code) -> Sexp {
    let o = code.optimized();
    list(&[
        atom_s("code"),
        field("name", atom_s(code.name())),
        field(
            "state",
            atom_s(if code.is_compiled() {
                "compiled"
            } else {
                "postponed"
            }),
        ),
        field(
            "merge_node",
            o.merge_node.as_ref().map_or(atom_s("none"), tnode),
        ),
        field(
            "nodes",
            list(&o.nodes.iter().map(|(t, _)| tnode(t)).collect::<Vec<_>>()),
        ),
    ])
}

/// A batch: the included routines (or `none`) in order.
pub fn sexp_of_code_batch(batch: &CodeBatch) -> Sexp {
    let entries: Vec<Sexp> = batch
        .names()
        .into_iter()
        .map(|n| n.map_or(atom_s("none"), atom_s))
        .collect();
    list(&[atom_s("code_batch"), field("routines", list(&entries))])
}

/// A buffer: its size in bytes.
pub fn sexp_of_buffer_ptr(buf: &BufferPtr) -> Sexp {
    list(&[atom_s("buffer"), field("bytes", atom_i(buf.size() as i64))])
}

/// A context: label, id, device, parent id, merge nodes and the nodes it holds.
pub fn sexp_of_context(ctx: &Context) -> Sexp {
    list(&[
        atom_s("context"),
        field("label", atom_s(ctx.label())),
        field("id", atom_i(ctx.id() as i64)),
        field(
            "device",
            ctx.device().map_or(atom_s("none"), |d| atom_s(&d.name())),
        ),
        field(
            "parent",
            ctx.parent()
                .map_or(atom_s("none"), |p| atom_i(p.id() as i64)),
        ),
        field(
            "expected_merge_node",
            ctx.expected_merge_node().map_or(atom_s("none"), tnode),
        ),
        field(
            "nodes",
            list(&ctx.nodes().iter().map(tnode).collect::<Vec<_>>()),
        ),
    ])
}

/// A routine: name, device, static indices with their current values, merge node, context.
pub fn sexp_of_routine(r: &Routine) -> Sexp {
    let statics: Vec<Sexp> = r
        .bindings()
        .symbols()
        .zip(r.bindings().values())
        .map(|(s, v)| list(&[atom_s(&s.name), atom_i(v)]))
        .collect();
    list(&[
        atom_s("routine"),
        field("name", atom_s(r.name())),
        field(
            "device",
            r.device().map_or(atom_s("none"), |d| atom_s(&d.name())),
        ),
        field("bindings", list(&statics)),
        field("merge_node", r.merge_node().map_or(atom_s("none"), tnode)),
        field("context", sexp_of_context(r.context())),
    ])
}

/// A device: name, whether it has a worker thread, pending tasks, what its merge buffer holds.
pub fn sexp_of_device(d: &Device) -> Sexp {
    list(&[
        atom_s("device"),
        field("name", atom_s(&d.name())),
        field(
            "worker",
            atom_s(if d.has_worker() { "thread" } else { "caller" }),
        ),
        field("pending", atom_i(d.pending() as i64)),
        field(
            "merge_buffer",
            d.merge_buffer().get().map_or(atom_s("empty"), |(b, t)| {
                list(&[tnode(&t), sexp_of_buffer_ptr(&b)])
            }),
        ),
    ])
}
