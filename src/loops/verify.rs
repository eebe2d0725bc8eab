//! A verifier for the loop IR, run between the optimizer's passes in debug builds (as
//! cranelift's `verify_if`): it catches a pass that breaks the IR's invariants where the
//! pass is, instead of as wrong values or a C compiler error later.
//!
//! Invariants checked:
//! - a loop iterator is used only inside its loop, and no loop reuses an enclosing loop's
//!   iterator;
//! - every access has one index per axis of its tensor, and fixed indices are within the
//!   axes;
//! - vector loads and stores are of the tensor's own precision (or, for integer lanes, of an
//!   integer precision of the lanes' width), and every vector variable read is assigned
//!   somewhere;
//! - a loop's bounds are not inverted beyond an empty range;
//! - a lookup ([`Llc::Lookup`]) reads an integer tensor, its symbol is used only in its body;
//! - a parallel region ([`Llc::Parallel`]) is not nested in another, and its iterations are
//!   independent ([`super::check_parallel`]).

use super::{Llc, Llv, VType, Vlv};
use crate::ir::{AxisIndex, Prec, Symbol, Tnode};
use std::collections::HashSet;

/// Checks the invariants above; `Err` describes the first violation.
pub fn verify(code: &Llc) -> Result<(), String> {
    let mut loop_syms = HashSet::new();
    super::visit_llc(code, &mut |c| match c {
        Llc::For { index, .. } | Llc::Lookup { symbol: index, .. } => {
            loop_syms.insert(*index);
        }
        Llc::Parallel(p) => {
            loop_syms.insert(p.index);
        }
        _ => {}
    });
    let mut v = Verifier {
        loop_syms,
        bound: vec![],
        vset: HashSet::new(),
    };
    super::visit_llc(code, &mut |c| {
        if let Llc::VSet(r, _) = c {
            v.vset.insert(r.id);
        }
    });
    v.stmt(code)?;
    // Every parallel region's iterations are independent.
    let mut regions = vec![];
    super::visit_llc(code, &mut |c| {
        if let Llc::Parallel(p) = c {
            regions.push((c, p.index));
        }
    });
    for (c, index) in regions {
        super::check_parallel(code, c).map_err(|e| format!("parallel loop over {index}: {e}"))?;
    }
    Ok(())
}

struct Verifier {
    /// Every symbol that is some loop's iterator.
    loop_syms: HashSet<Symbol>,
    /// The iterators of the enclosing loops.
    bound: Vec<Symbol>,
    /// Vector variables assigned somewhere.
    vset: HashSet<u32>,
}

impl Verifier {
    fn index(&self, ix: &AxisIndex, what: &str) -> Result<(), String> {
        for s in ix.symbols() {
            if self.loop_syms.contains(&s) && !self.bound.contains(&s) {
                return Err(format!(
                    "{what}: iterator {s} is used outside its loop (index {ix})"
                ));
            }
        }
        Ok(())
    }

    fn access(&self, tn: &Tnode, idcs: &[AxisIndex], what: &str) -> Result<(), String> {
        let what = format!("{what} {}", tn.name());
        if idcs.len() != tn.dims().len() {
            return Err(format!(
                "{what}: {} indices for {} axes",
                idcs.len(),
                tn.dims().len()
            ));
        }
        for (ix, &d) in idcs.iter().zip(tn.dims()) {
            if let AxisIndex::Fixed(k) = ix {
                if *k >= d {
                    return Err(format!("{what}: fixed index {k} on an axis of extent {d}"));
                }
            }
            self.index(ix, &what)?;
        }
        Ok(())
    }

    fn stmt(&mut self, c: &Llc) -> Result<(), String> {
        match c {
            Llc::Noop | Llc::Comment(_) | Llc::ZeroOut(_) => Ok(()),
            Llc::Prefetch { tn, offset, .. } => {
                self.index(offset, &format!("prefetch of {}", tn.name()))
            }
            Llc::Seq(v) => v.iter().try_for_each(|c| self.stmt(c)),
            Llc::For {
                index,
                from,
                to,
                body,
                ..
            } => {
                if self.bound.contains(index) {
                    return Err(format!("loop over {index} nested in a loop over {index}"));
                }
                if *to < *from - 1 {
                    return Err(format!("loop over {index} from {from} to {to}"));
                }
                self.bound.push(*index);
                let r = self.stmt(body);
                self.bound.pop();
                r
            }
            Llc::Parallel(p) => {
                if self.bound.contains(&p.index) {
                    return Err(format!(
                        "parallel loop over {0} nested in a loop over {0}",
                        p.index
                    ));
                }
                if p.to < p.from - 1 || p.grain < 1 {
                    return Err(format!(
                        "parallel loop over {} from {} to {} with grain {}",
                        p.index, p.from, p.to, p.grain
                    ));
                }
                let mut nested = false;
                super::visit_llc(&p.body, &mut |c| nested |= matches!(c, Llc::Parallel(_)));
                if nested {
                    return Err(format!(
                        "a parallel loop nested in the parallel loop over {}",
                        p.index
                    ));
                }
                self.bound.push(p.index);
                let r = self.stmt(&p.body);
                self.bound.pop();
                r
            }
            Llc::If { guards, body } => {
                for (ix, _) in guards {
                    self.index(ix, "a guard")?;
                }
                self.stmt(body)
            }
            Llc::Lookup {
                symbol,
                tn,
                idcs,
                extent,
                body,
            } => {
                self.access(tn, idcs, "reading an index from")?;
                if !tn.prec().is_integer() {
                    return Err(format!(
                        "an index read from {} tensor {}",
                        tn.prec(),
                        tn.name()
                    ));
                }
                if *extent == 0 {
                    return Err(format!("an index read from {} with extent 0", tn.name()));
                }
                if self.bound.contains(symbol) {
                    return Err(format!(
                        "lookup binding {symbol} nested in a loop over {symbol}"
                    ));
                }
                self.bound.push(*symbol);
                let r = self.stmt(body);
                self.bound.pop();
                r
            }
            Llc::Set { tn, idcs, value } => {
                self.access(tn, idcs, "writing")?;
                self.value(value)
            }
            Llc::SetLocal(_, value) => self.value(value),
            Llc::VSet(_, v) => self.vector(v),
            Llc::VStore { tn, idcs, value } => {
                self.access(tn, idcs, "vector store to")?;
                if !value.ty().fits_memory_of(tn.prec()) {
                    return Err(format!(
                        "vector store of {} lanes into {} tensor {}",
                        value.ty().prec,
                        tn.prec(),
                        tn.name()
                    ));
                }
                self.vector(value)
            }
        }
    }

    fn value(&mut self, v: &Llv) -> Result<(), String> {
        match v {
            Llv::Get(tn, idcs) => self.access(tn, idcs, "reading"),
            Llv::GetMergeBuffer(tn, idcs) => self.access(tn, idcs, "reading the merge buffer of"),
            Llv::EmbedIndex(ix) => self.index(ix, "embedding an index"),
            Llv::LocalScope {
                body, orig_indices, ..
            } => {
                for ix in orig_indices {
                    self.index(ix, "a local scope's indices")?;
                }
                self.stmt(body)
            }
            Llv::Binop(_, a, b) => {
                self.value(a)?;
                self.value(b)
            }
            Llv::Unop(_, a) => self.value(a),
            Llv::Ternop(_, a, b, c) => {
                self.value(a)?;
                self.value(b)?;
                self.value(c)
            }
            Llv::Random { idcs, dims, .. } => {
                if idcs.len() != dims.len() {
                    return Err(format!(
                        "a random value has {} indices for dims {dims:?}",
                        idcs.len()
                    ));
                }
                for ix in idcs {
                    self.index(ix, "a random value's cell")?;
                }
                Ok(())
            }
            Llv::GetLocal(_) | Llv::GetCFunction(_) | Llv::Constant(_) => Ok(()),
        }
    }

    fn vector(&mut self, v: &Vlv) -> Result<(), String> {
        match v {
            Vlv::Reg(r) => {
                if self.vset.contains(&r.id) {
                    Ok(())
                } else {
                    Err(format!("vector variable {} is read but never set", r.id))
                }
            }
            Vlv::Zero(_) => Ok(()),
            Vlv::Splat(_, x) => self.value(x),
            Vlv::Load(t, tn, idcs) => {
                self.access(tn, idcs, "vector load from")?;
                if !t.fits_memory_of(tn.prec()) {
                    return Err(format!(
                        "vector load of {} lanes from {} tensor {}",
                        t.prec,
                        tn.prec(),
                        tn.name()
                    ));
                }
                Ok(())
            }
            Vlv::Fma(a, b, c) => {
                self.vector(a)?;
                self.vector(b)?;
                self.vector(c)
            }
            Vlv::Binop(_, a, b) => {
                self.vector(a)?;
                self.vector(b)
            }
            Vlv::Unop(op, a) => {
                self.vector(a)?;
                let t = a.ty();
                if !super::vector_unop(*op, t.prec) {
                    return Err(format!(
                        "vector {op} of {}x{} lanes (no vector function)",
                        t.prec, t.lanes
                    ));
                }
                Ok(())
            }
            Vlv::Ternop(op, a, b, c) => {
                self.vector(a)?;
                self.vector(b)?;
                self.vector(c)?;
                let t = a.ty();
                if b.ty() != t || c.ty() != t || *op == crate::ir::Ternop::Where {
                    return Err(format!(
                        "vector {op} of {}x{}, {}x{} and {}x{} vectors",
                        t.prec,
                        t.lanes,
                        b.ty().prec,
                        b.ty().lanes,
                        c.ty().prec,
                        c.ty().lanes
                    ));
                }
                Ok(())
            }
            Vlv::Repeat(a, times) => {
                // The one repeat the C writer spells: 4 bytes broadcast to 64.
                let t = a.ty();
                let bytes = t.lanes * t.prec.size_in_bytes();
                if bytes != 4 || bytes * times != 64 {
                    return Err(format!(
                        "a {}x{} vector repeated {times} times (only 4 bytes to 64 are written)",
                        t.prec, t.lanes
                    ));
                }
                self.vector(a)
            }
            Vlv::DotPairs(acc, a, b) => {
                self.vector(acc)?;
                self.vector(a)?;
                self.vector(b)?;
                let (t, ta, tb) = (acc.ty(), a.ty(), b.ty());
                let pairs = VType {
                    prec: Prec::Bfloat16,
                    lanes: 2 * t.lanes,
                };
                if t.prec != Prec::Single || ta != pairs || tb != pairs {
                    return Err(format!(
                        "dot products of pairs into {}x{} from {}x{} and {}x{} vectors",
                        t.prec, t.lanes, ta.prec, ta.lanes, tb.prec, tb.lanes
                    ));
                }
                Ok(())
            }
            Vlv::Shuffle(a, b, idx) => {
                self.vector(a)?;
                self.vector(b)?;
                let t = a.ty();
                if b.ty() != t {
                    return Err(format!(
                        "shuffle of {}x{} and {}x{} vectors",
                        t.prec,
                        t.lanes,
                        b.ty().prec,
                        b.ty().lanes
                    ));
                }
                if idx.len() != t.lanes || idx.iter().any(|&i| i >= 2 * t.lanes) {
                    return Err(format!(
                        "shuffle of {}-lane vectors with lanes {idx:?}",
                        t.lanes
                    ));
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Prec;
    use crate::loops::{VReg, VType};

    fn for_(index: Symbol, to: i64, body: Llc) -> Llc {
        Llc::for_loop(index, 0, to, body)
    }

    #[test]
    fn catches_broken_invariants() {
        let t = Tnode::new(&["t"], &[4], Prec::Single).unwrap();
        let (i, j) = (Symbol::fresh(), Symbol::fresh());
        let set = |ix: AxisIndex| Llc::Set {
            tn: t.clone(),
            idcs: vec![ix],
            value: Llv::Constant(1.0),
        };
        assert!(verify(&for_(i, 3, set(AxisIndex::Iterator(i)))).is_ok());
        // i used after its loop.
        let bad = Llc::Seq(vec![for_(i, 3, Llc::Noop), set(AxisIndex::Iterator(i))]);
        assert!(verify(&bad).unwrap_err().contains("outside its loop"));
        // A loop nested in a loop over the same iterator.
        let bad = for_(i, 3, for_(i, 3, set(AxisIndex::Iterator(i))));
        assert!(verify(&bad).unwrap_err().contains("nested"));
        // Wrong number of indices, fixed index out of range.
        let bad = Llc::Set {
            tn: t.clone(),
            idcs: vec![AxisIndex::Fixed(0), AxisIndex::Fixed(0)],
            value: Llv::Constant(0.0),
        };
        assert!(verify(&bad).unwrap_err().contains("2 indices for 1 axes"));
        assert!(verify(&set(AxisIndex::Fixed(4)))
            .unwrap_err()
            .contains("fixed index 4"));
        // A vector variable read but never set, and a vector of the wrong precision.
        let ty = VType {
            prec: Prec::Double,
            lanes: 2,
        };
        let r = VReg { id: 7, ty };
        let bad = for_(
            j,
            1,
            Llc::VStore {
                tn: t.clone(),
                idcs: vec![AxisIndex::linear(&[(j, 2)], 0).unwrap()],
                value: Vlv::Reg(r),
            },
        );
        let e = verify(&bad).unwrap_err();
        assert!(
            e.contains("vector store of double lanes into single"),
            "{e}"
        );
        let ok_ty = VType {
            prec: Prec::Single,
            lanes: 2,
        };
        let bad = Llc::VStore {
            tn: t.clone(),
            idcs: vec![AxisIndex::Fixed(0)],
            value: Vlv::Reg(VReg { id: 8, ty: ok_ty }),
        };
        assert!(verify(&bad).unwrap_err().contains("never set"));
        // Shuffles: lanes from both operands are fine; a lane past both, a wrong number of
        // lanes or operands of different types are not.
        let (a, b) = (VReg { id: 9, ty: ok_ty }, VReg { id: 10, ty: ok_ty });
        let shuffle = |x: VReg, y: VReg, idx: Vec<usize>| {
            Llc::Seq(vec![
                Llc::VSet(a, Vlv::Zero(ok_ty)),
                Llc::VSet(b, Vlv::Zero(ok_ty)),
                Llc::VSet(r, Vlv::Zero(ty)),
                Llc::VStore {
                    tn: t.clone(),
                    idcs: vec![AxisIndex::Fixed(0)],
                    value: Vlv::Shuffle(Box::new(Vlv::Reg(x)), Box::new(Vlv::Reg(y)), idx),
                },
            ])
        };
        assert!(verify(&shuffle(a, b, vec![3, 0])).is_ok());
        assert!(verify(&shuffle(a, b, vec![4, 0]))
            .unwrap_err()
            .contains("with lanes"));
        assert!(verify(&shuffle(a, b, vec![0]))
            .unwrap_err()
            .contains("with lanes"));
        assert!(verify(&shuffle(a, r, vec![0, 1]))
            .unwrap_err()
            .contains("shuffle of"));
    }

    /// Dot products of bfloat16 pairs take 16 single lanes and two vectors of 32 bfloat16
    /// lanes; a repeat broadcasts 4 bytes to 64, nothing else.
    #[test]
    fn dot_products_of_pairs_and_repeats_are_typed() {
        let t = Tnode::new(&["t"], &[16], Prec::Single).unwrap();
        let p = Tnode::new(&["p"], &[32], Prec::Bfloat16).unwrap();
        let f16 = VType {
            prec: Prec::Single,
            lanes: 16,
        };
        let bf32 = VType {
            prec: Prec::Bfloat16,
            lanes: 32,
        };
        let bf2 = VType {
            prec: Prec::Bfloat16,
            lanes: 2,
        };
        let (acc, x) = (VReg { id: 1, ty: f16 }, VReg { id: 2, ty: bf32 });
        let code = |a: Vlv, b: Vlv| {
            Llc::Seq(vec![
                Llc::VSet(acc, Vlv::Zero(f16)),
                Llc::VSet(x, Vlv::Load(bf32, p.clone(), vec![AxisIndex::Fixed(0)])),
                Llc::VStore {
                    tn: t.clone(),
                    idcs: vec![AxisIndex::Fixed(0)],
                    value: Vlv::DotPairs(Box::new(Vlv::Reg(acc)), Box::new(a), Box::new(b)),
                },
            ])
        };
        let pair = |lanes| Vlv::Load(VType { lanes, ..bf2 }, p.clone(), vec![AxisIndex::Fixed(0)]);
        let repeat = |v: Vlv, n| Vlv::Repeat(Box::new(v), n);
        assert!(verify(&code(Vlv::Reg(x), repeat(pair(2), 16))).is_ok());
        // Operands of the wrong width.
        let e = verify(&code(Vlv::Reg(x), pair(16))).unwrap_err();
        assert!(e.contains("dot products of pairs"), "{e}");
        // A repeat of 8 bytes, or to 32 bytes.
        assert!(verify(&code(Vlv::Reg(x), repeat(pair(4), 8)))
            .unwrap_err()
            .contains("repeated"));
        assert!(verify(&code(Vlv::Reg(x), repeat(pair(2), 8)))
            .unwrap_err()
            .contains("repeated"));
    }

    /// Integer lanes load from and store into integer tensors of their width, signed or
    /// unsigned (bit patterns); not into narrower, wider or floating tensors.
    #[test]
    fn integer_lanes_move_integers_of_their_width() {
        let u32x8 = VType {
            prec: Prec::Uint32,
            lanes: 8,
        };
        let r = VReg { id: 1, ty: u32x8 };
        let move_ = |from: Prec, to: Prec| {
            let (a, b) = (
                Tnode::new(&["a"], &[8], from).unwrap(),
                Tnode::new(&["b"], &[8], to).unwrap(),
            );
            verify(&Llc::Seq(vec![
                Llc::VSet(r, Vlv::Load(u32x8, a, vec![AxisIndex::Fixed(0)])),
                Llc::VStore {
                    tn: b,
                    idcs: vec![AxisIndex::Fixed(0)],
                    value: Vlv::Reg(r),
                },
            ]))
        };
        assert!(move_(Prec::Int32, Prec::Uint32).is_ok());
        assert!(move_(Prec::Uint32, Prec::Int32).is_ok());
        let e = move_(Prec::Uint16, Prec::Int32).unwrap_err();
        assert!(e.contains("vector load of uint32 lanes from uint16"), "{e}");
        let e = move_(Prec::Int32, Prec::Int64).unwrap_err();
        assert!(e.contains("vector store of uint32 lanes into int64"), "{e}");
        let e = move_(Prec::Single, Prec::Int32).unwrap_err();
        assert!(e.contains("from single"), "{e}");
    }
}
