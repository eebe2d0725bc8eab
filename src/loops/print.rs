//! A readable rendering of the loop IR (the debug directory's `.ll.txt` dumps).

use super::{Llc, Llv, ScopeId, VReg, Vlv};
use crate::ir::AxisIndex;
use std::fmt::Write;

/// A readable rendering of loop IR, one statement per line.
pub fn to_doc(c: &Llc) -> String {
    let mut out = String::new();
    write_llc(&mut out, c, 0);
    out
}

fn idcs_doc(idcs: &[AxisIndex]) -> String {
    idcs.iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn scope_doc(id: &ScopeId) -> String {
    format!("v{}_{}", id.id, id.tn.name().escape_debug())
}

fn write_llc(out: &mut String, c: &Llc, indent: usize) {
    let pad = "  ".repeat(indent);
    match c {
        Llc::Noop => {}
        Llc::Comment(t) => {
            let _ = writeln!(out, "{pad}# {}", t.escape_debug());
        }
        Llc::Seq(v) => v.iter().for_each(|c| write_llc(out, c, indent)),
        Llc::For {
            index,
            from,
            to,
            body,
            ..
        } => {
            let _ = writeln!(out, "{pad}for {index} = {from} to {to} {{");
            write_llc(out, body, indent + 1);
            let _ = writeln!(out, "{pad}}}");
        }
        Llc::Parallel(p) => {
            let private: Vec<String> = p
                .private
                .iter()
                .map(|t| t.name().escape_debug().to_string())
                .collect();
            let _ = writeln!(
                out,
                "{pad}parallel for {} = {} to {} (grain {}, private [{}]) {{",
                p.index,
                p.from,
                p.to,
                p.grain,
                private.join(", ")
            );
            write_llc(out, &p.body, indent + 1);
            let _ = writeln!(out, "{pad}}}");
        }
        Llc::If { guards, body } => {
            let conds: Vec<String> = guards
                .iter()
                .map(|(ix, n)| format!("0 <= {ix} < {n}"))
                .collect();
            let _ = writeln!(out, "{pad}if {} {{", conds.join(" && "));
            write_llc(out, body, indent + 1);
            let _ = writeln!(out, "{pad}}}");
        }
        Llc::Lookup {
            symbol,
            tn,
            idcs,
            extent,
            body,
        } => {
            let _ = writeln!(
                out,
                "{pad}lookup {symbol} = {}[{}] if 0 <= {symbol} < {extent} {{",
                tn.name().escape_debug(),
                idcs_doc(idcs)
            );
            write_llc(out, body, indent + 1);
            let _ = writeln!(out, "{pad}}}");
        }
        Llc::ZeroOut(tn) => {
            let _ = writeln!(out, "{pad}zero_out {};", tn.name().escape_debug());
        }
        Llc::Prefetch { tn, offset, write } => {
            let _ = writeln!(
                out,
                "{pad}prefetch{} {}[flat {}];",
                if *write { "_write" } else { "" },
                tn.name().escape_debug(),
                idcs_doc(std::slice::from_ref(offset))
            );
        }
        Llc::Set { tn, idcs, value } => {
            let _ = writeln!(
                out,
                "{pad}{}[{}] := {};",
                tn.name().escape_debug(),
                idcs_doc(idcs),
                llv_doc(value, indent)
            );
        }
        Llc::SetLocal(id, value) => {
            let _ = writeln!(out, "{pad}{} := {};", scope_doc(id), llv_doc(value, indent));
        }
        Llc::VSet(r, v) => {
            let _ = writeln!(out, "{pad}{} := {};", vreg_doc(r), vlv_doc(v, indent));
        }
        Llc::VStore { tn, idcs, value } => {
            let _ = writeln!(
                out,
                "{pad}{}[{}..+{}] := {};",
                tn.name().escape_debug(),
                idcs_doc(idcs),
                value.ty().lanes,
                vlv_doc(value, indent)
            );
        }
    }
}

fn vreg_doc(r: &VReg) -> String {
    format!("vec{}_{}x{}", r.id, r.ty.prec, r.ty.lanes)
}

fn vlv_doc(v: &Vlv, indent: usize) -> String {
    match v {
        Vlv::Reg(r) => vreg_doc(r),
        Vlv::Zero(t) => format!("zero<{}x{}>", t.prec, t.lanes),
        Vlv::Splat(t, x) => format!("splat<{}x{}>({})", t.prec, t.lanes, llv_doc(x, indent)),
        Vlv::Load(t, tn, idcs) => format!(
            "{}[{}..+{}]",
            tn.name().escape_debug(),
            idcs_doc(idcs),
            t.lanes
        ),
        Vlv::Fma(a, b, c) => format!(
            "fma({}, {}, {})",
            vlv_doc(a, indent),
            vlv_doc(b, indent),
            vlv_doc(c, indent)
        ),
        Vlv::Shuffle(a, b, idx) => format!(
            "shuffle({}, {}, [{}])",
            vlv_doc(a, indent),
            vlv_doc(b, indent),
            idx.iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Vlv::Repeat(a, times) => format!("repeat({}, {times})", vlv_doc(a, indent)),
        Vlv::Unop(op, a) => format!("{}({})", op.name(), vlv_doc(a, indent)),
        Vlv::Ternop(op, a, b, c) => format!(
            "{}({}, {}, {})",
            op.name(),
            vlv_doc(a, indent),
            vlv_doc(b, indent),
            vlv_doc(c, indent)
        ),
        Vlv::DotPairs(a, b, c) => format!(
            "dot_pairs({}, {}, {})",
            vlv_doc(a, indent),
            vlv_doc(b, indent),
            vlv_doc(c, indent)
        ),
        Vlv::Binop(op, a, b) => format!(
            "{}({}, {})",
            op.name(),
            vlv_doc(a, indent),
            vlv_doc(b, indent)
        ),
    }
}

fn llv_doc(v: &Llv, indent: usize) -> String {
    match v {
        Llv::LocalScope { id, body, .. } => {
            let mut s = format!("{{ local {};\n", scope_doc(id));
            write_llc(&mut s, body, indent + 2);
            s.push_str(&format!("{}}}", "  ".repeat(indent + 1)));
            s
        }
        Llv::GetLocal(id) => scope_doc(id),
        Llv::Get(tn, idcs) => format!("{}[{}]", tn.name().escape_debug(), idcs_doc(idcs)),
        Llv::GetMergeBuffer(tn, idcs) => {
            format!("merge({})[{}]", tn.name().escape_debug(), idcs_doc(idcs))
        }
        Llv::GetCFunction(f) => format!("{f}()"),
        Llv::Binop(op, a, b) => match op.info().infix {
            Some(s) if s.len() <= 2 => {
                format!("({} {s} {})", llv_doc(a, indent), llv_doc(b, indent))
            }
            _ => format!(
                "{}({}, {})",
                op.name(),
                llv_doc(a, indent),
                llv_doc(b, indent)
            ),
        },
        Llv::Unop(op, a) => format!("{}({})", op.name(), llv_doc(a, indent)),
        Llv::Constant(c) => format!("{c:?}"),
        Llv::EmbedIndex(i) => format!("index({i})"),
        Llv::Ternop(op, a, b, c) => format!(
            "{}({}, {}, {})",
            op.name(),
            llv_doc(a, indent),
            llv_doc(b, indent),
            llv_doc(c, indent)
        ),
        Llv::Random {
            seed, idcs, prec, ..
        } => format!("random_{}({seed})[{}]", prec.name(), idcs_doc(idcs)),
    }
}
