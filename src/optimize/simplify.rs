//! Simplification: constant folding (in the statement's compute type), the algebraic
//! identities that hold for every IEEE value (`x*1`, `x/1`, `x+(-0)`, `x-(+0)`), collapsing
//! trivial local scopes, and unrolling integer powers. Results never depend on whether a
//! constant was inlined: `x*0` stays (nan·0 is nan, -2·0 is -0), `x+0` stays (-0 + 0 is +0),
//! and constants are not reassociated ((x + c1) + c2 rounds differently from x + (c1 + c2)).

use crate::ir::{Binop, Prec, Unop};
use crate::loops::{map_body, Llc, Llv};

/// Largest integer exponent unrolled into multiplications.
const MAX_UNROLLED_POWER: f64 = 16.0;

/// Simplifies code.
pub fn simplify(c: Llc) -> Llc {
    match c {
        Llc::Seq(v) => {
            let v: Vec<Llc> = v
                .into_iter()
                .map(simplify)
                .flat_map(|c| c.flatten())
                .collect();
            match v.len() {
                0 => Llc::Noop,
                1 => v.into_iter().next().unwrap_or(Llc::Noop),
                _ => Llc::Seq(v),
            }
        }
        c @ (Llc::For { .. } | Llc::If { .. } | Llc::Lookup { .. }) => {
            // A loop, guard or lookup whose body simplifies to nothing is nothing.
            match map_body(c, simplify) {
                Llc::For { body, .. } | Llc::If { body, .. } | Llc::Lookup { body, .. }
                    if *body == Llc::Noop =>
                {
                    Llc::Noop
                }
                c => c,
            }
        }
        Llc::Set { tn, idcs, value } => {
            let value = simplify_value(value, tn.prec());
            Llc::Set { tn, idcs, value }
        }
        Llc::SetLocal(id, value) => {
            let value = simplify_value(value, id.tn.prec());
            Llc::SetLocal(id, value)
        }
        c => c,
    }
}

fn is_simple(v: &Llv) -> bool {
    matches!(
        v,
        Llv::Get(..)
            | Llv::GetLocal(_)
            | Llv::Constant(_)
            | Llv::EmbedIndex(_)
            | Llv::GetMergeBuffer(..)
    )
}

/// `base` multiplied by itself `n` times (n >= 1).
fn unrolled_power(base: &Llv, n: u32) -> Llv {
    (1..n).fold(base.clone(), |acc, _| {
        Llv::Binop(Binop::Mul, Box::new(acc), Box::new(base.clone()))
    })
}

fn uses_local(v: &Llv, id: &crate::loops::ScopeId) -> bool {
    let mut hit = false;
    crate::loops::visit_values(&Llc::SetLocal(id.clone(), v.clone()), &mut |x| {
        if let Llv::GetLocal(i) = x {
            if i == id {
                hit = true
            }
        }
    });
    hit
}

/// Simplifies a value computed for storing into a node of precision `target`.
///
/// A local scope that only sets its local once becomes the bare expression when that loses
/// nothing: when the inlined node's precision is exactly the type `target` computes in
/// (single into half/single, double into byte/double). Otherwise the local stays, so the
/// value is computed in the inlined node's own compute type and rounded to its precision.
pub fn simplify_value(v: Llv, target: Prec) -> Llv {
    use Llv::Constant as C;
    if target.is_integer() {
        // Integer results compute in a type chosen from their arguments (SPEC 9.1), with
        // integer meanings for div, pow, ...: only simplify inside inlined computations.
        return simplify_inner(v);
    }
    match v {
        Llv::LocalScope {
            id,
            body,
            orig_indices,
        } => {
            let body = simplify(*body);
            let exact = id.tn.prec().c_type() == target.compute_c_type();
            if let Llc::SetLocal(i, value) = &body {
                if exact && *i == id && !uses_local(value, &id) {
                    return value.clone();
                }
            }
            Llv::LocalScope {
                id,
                body: Box::new(body),
                orig_indices,
            }
        }
        Llv::Ternop(op, a, b, c) => Llv::Ternop(
            op,
            Box::new(simplify_value(*a, target)),
            Box::new(simplify_value(*b, target)),
            Box::new(simplify_value(*c, target)),
        ),
        Llv::Unop(op, a) => {
            let a = simplify_value(*a, target);
            match (op, a) {
                // folded in the statement's compute type, as the C would compute it
                (_, C(x)) => C(target.round_compute(op.interpret(x))),
                (Unop::Identity, a) => a,
                (op, a) => Llv::Unop(op, Box::new(a)),
            }
        }
        Llv::Binop(op, a, b) => {
            let a = simplify_value(*a, target);
            let b = simplify_value(*b, target);
            match (op, a, b) {
                (op, C(x), C(y)) => C(target.round_compute(op.interpret(x, y))),
                (Binop::Arg1, a, _) => a,
                (Binop::Arg2, _, b) => b,
                // Only identities that hold for every IEEE value: x + (-0) and x - (+0) are x
                // (x + 0 is not: -0 + 0 = +0), and x * 0 is not 0 (nan, inf, and -0 for a
                // negative x), so neither is simplified.
                (Binop::Add, C(z), x) | (Binop::Add, x, C(z))
                    if z == 0.0 && z.is_sign_negative() =>
                {
                    x
                }
                (Binop::Sub, x, C(z)) if z == 0.0 && z.is_sign_positive() => x,
                (Binop::Mul, C(o), x) | (Binop::Mul, x, C(o)) if o == 1.0 => x,
                (Binop::Div, x, C(1.0)) => x,
                // (No reassociation of constants: (x + c1) + c2 rounds differently from
                // x + (c1 + c2), e.g. x = 1, c1 = 2^24, c2 = -2^24 in float.)
                (Binop::ToPowOf, base, C(e))
                    if e.fract() == 0.0
                        && e.abs() <= MAX_UNROLLED_POWER
                        && (is_simple(&base) || matches!(base, Llv::LocalScope { .. })) =>
                {
                    if e == 0.0 {
                        C(1.0)
                    } else if e > 0.0 {
                        unrolled_power(&base, e as u32)
                    } else {
                        Llv::Binop(
                            Binop::Div,
                            Box::new(C(1.0)),
                            Box::new(unrolled_power(&base, (-e) as u32)),
                        )
                    }
                }
                (op, a, b) => Llv::Binop(op, Box::new(a), Box::new(b)),
            }
        }
        v => v,
    }
}

/// Simplifies the bodies of the local scopes of a value, leaving the value itself as is.
fn simplify_inner(v: Llv) -> Llv {
    match v {
        Llv::LocalScope {
            id,
            body,
            orig_indices,
        } => Llv::LocalScope {
            id,
            body: Box::new(simplify(*body)),
            orig_indices,
        },
        Llv::Unop(op, a) => Llv::Unop(op, Box::new(simplify_inner(*a))),
        Llv::Binop(op, a, b) => Llv::Binop(
            op,
            Box::new(simplify_inner(*a)),
            Box::new(simplify_inner(*b)),
        ),
        v => v,
    }
}
