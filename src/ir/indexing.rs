//! Symbols, static indices, axis indices, projections and bindings.

use crate::error::{Error, Result};
use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::Arc;

static NEXT_SYMBOL: AtomicU32 = AtomicU32::new(1);

/// A fresh loop-index (or static-index) identifier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Symbol(pub u32);

impl Symbol {
    /// A symbol never returned before in this process.
    pub fn fresh() -> Symbol {
        Symbol(NEXT_SYMBOL.fetch_add(1, Ordering::Relaxed))
    }
}

impl fmt::Display for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "i{}", self.0)
    }
}

/// A symbol bound outside the routine: an `int` parameter of the generated function whose
/// value is set through the routine's bindings before each run.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StaticSymbol {
    /// The underlying symbol.
    pub symbol: Symbol,
    /// The user's name for it (for display, errors and naming in C).
    pub name: String,
    /// If set, valid values are `0..range`.
    pub range: Option<usize>,
}

impl StaticSymbol {
    /// A new static symbol with a fresh identifier.
    pub fn new(name: &str, range: Option<usize>) -> StaticSymbol {
        StaticSymbol {
            symbol: Symbol::fresh(),
            name: name.to_string(),
            range,
        }
    }
}

/// An index into one axis: a fixed position or a symbol (loop iterator or static index).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AxisIndex {
    /// A fixed position.
    Fixed(usize),
    /// A loop iterator or a static symbol.
    Iterator(Symbol),
    /// `offset + Σ coef·symbol`, for strip-mined, tiled and packed loops. Only the
    /// optimizer's loop passes produce it (never a spec or a projection).
    Linear(LinearIndex),
}

/// An index that is a linear combination of loop iterators: `offset + Σ coef·symbol`, with
/// at most [`LinearIndex::MAX_TERMS`] terms and non-negative coefficients (plain data, `Copy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LinearIndex {
    terms: [(Symbol, usize); LinearIndex::MAX_TERMS],
    len: u8,
    /// The constant part (negative only in affine entries of einsum specs, whose points out
    /// of range are skipped by guards).
    pub offset: i64,
}

impl LinearIndex {
    /// The most terms a linear index holds.
    pub const MAX_TERMS: usize = 4;

    /// `offset + Σ coef·symbol`; `None` when there are more than [`Self::MAX_TERMS`] terms.
    /// Terms with coefficient 0 are dropped; repeated symbols are combined.
    pub fn new(terms: &[(Symbol, usize)], offset: i64) -> Option<LinearIndex> {
        let mut out = LinearIndex {
            terms: [(Symbol(0), 0); Self::MAX_TERMS],
            len: 0,
            offset,
        };
        for &(s, c) in terms {
            if c == 0 {
                continue;
            }
            if let Some(t) = out.terms[..out.len as usize].iter_mut().find(|t| t.0 == s) {
                t.1 = t.1.saturating_add(c);
                continue;
            }
            if out.len as usize == Self::MAX_TERMS {
                return None;
            }
            out.terms[out.len as usize] = (s, c);
            out.len += 1;
        }
        Some(out)
    }

    /// The terms `(symbol, coefficient)`.
    pub fn terms(&self) -> &[(Symbol, usize)] {
        &self.terms[..self.len as usize]
    }

    /// The coefficient of `s` (0 if absent).
    pub fn coef(&self, s: Symbol) -> usize {
        self.terms().iter().find(|t| t.0 == s).map_or(0, |t| t.1)
    }
}

impl AxisIndex {
    /// The symbols the index depends on.
    pub fn symbols(&self) -> Vec<Symbol> {
        match self {
            AxisIndex::Fixed(_) => vec![],
            AxisIndex::Iterator(s) => vec![*s],
            AxisIndex::Linear(l) => l.terms().iter().map(|t| t.0).collect(),
        }
    }

    /// `offset + Σ coef·symbol` as an index: a fixed position, a plain iterator, or a linear
    /// index. `None` when there are more terms than a linear index holds.
    pub fn linear(terms: &[(Symbol, usize)], offset: usize) -> Option<AxisIndex> {
        AxisIndex::affine(terms, i64::try_from(offset).ok()?)
    }

    /// [`AxisIndex::linear`] with a signed offset (an affine entry such as `(2*h+i-1)`). A
    /// negative constant (no terms) stays a linear index, since a fixed index is unsigned.
    pub fn affine(terms: &[(Symbol, usize)], offset: i64) -> Option<AxisIndex> {
        let l = LinearIndex::new(terms, offset)?;
        Some(match l.terms() {
            [] if offset >= 0 => AxisIndex::Fixed(offset as usize),
            [(s, 1)] if offset == 0 => AxisIndex::Iterator(*s),
            _ => AxisIndex::Linear(l),
        })
    }

    /// The smallest and largest values the index takes when every symbol `s` ranges over
    /// `0..=max(s)` (`None` when a symbol has no known range, is empty, or on overflow).
    pub fn range(&self, max: impl Fn(Symbol) -> Option<i64>) -> Option<(i64, i64)> {
        match self {
            AxisIndex::Fixed(k) => {
                let k = i64::try_from(*k).ok()?;
                Some((k, k))
            }
            AxisIndex::Iterator(s) => Some((0, max(*s)?)),
            AxisIndex::Linear(l) => {
                l.terms()
                    .iter()
                    .try_fold((l.offset, l.offset), |(lo, hi), &(s, c)| {
                        let m = max(s)?;
                        if m < 0 {
                            return None;
                        }
                        let c = i64::try_from(c).ok()?;
                        Some((lo, hi.checked_add(c.checked_mul(m)?)?))
                    })
            }
        }
    }

    /// The coefficient with which the index moves when `s` increases by one.
    pub fn coef(&self, s: Symbol) -> usize {
        match self {
            AxisIndex::Fixed(_) => 0,
            AxisIndex::Iterator(x) => usize::from(*x == s),
            AxisIndex::Linear(l) => l.coef(s),
        }
    }

    /// The index with `s` replaced by the index `by` (`None` when the result has too many
    /// terms for a linear index).
    pub fn substitute(&self, s: Symbol, by: AxisIndex) -> Option<AxisIndex> {
        let c = self.coef(s);
        if c == 0 {
            return Some(*self);
        }
        let (mut terms, mut offset): (Vec<(Symbol, usize)>, i64) = match self {
            AxisIndex::Fixed(k) => (vec![], i64::try_from(*k).ok()?),
            AxisIndex::Iterator(x) => (vec![(*x, 1)], 0),
            AxisIndex::Linear(l) => (l.terms().to_vec(), l.offset),
        };
        terms.retain(|t| t.0 != s);
        match by {
            AxisIndex::Fixed(k) => {
                let add = i64::try_from(c.checked_mul(k)?).ok()?;
                offset = offset.checked_add(add)?;
            }
            AxisIndex::Iterator(x) => terms.push((x, c)),
            AxisIndex::Linear(l) => {
                offset = offset.checked_add(i64::try_from(c).ok()?.checked_mul(l.offset)?)?;
                for &(x, k) in l.terms() {
                    terms.push((x, k.checked_mul(c)?));
                }
            }
        }
        AxisIndex::affine(&terms, offset)
    }
}

impl fmt::Display for AxisIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AxisIndex::Fixed(i) => write!(f, "{i}"),
            AxisIndex::Iterator(s) => write!(f, "{s}"),
            AxisIndex::Linear(l) => {
                let parts: Vec<String> = l
                    .terms()
                    .iter()
                    .map(|(s, c)| {
                        if *c == 1 {
                            format!("{s}")
                        } else {
                            format!("{s}*{c}")
                        }
                    })
                    .collect();
                let mut out = parts.join("+");
                if l.offset > 0 || (parts.is_empty() && l.offset == 0) {
                    if !out.is_empty() {
                        out.push('+');
                    }
                    out += &l.offset.to_string();
                } else if l.offset < 0 {
                    out += &l.offset.to_string();
                }
                f.write_str(&out)
            }
        }
    }
}

/// How one array operation maps its product space onto the result and arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct Projections {
    /// The extents of the loops.
    pub product_space: Vec<usize>,
    /// One symbol per product-space axis.
    pub product_iterators: Vec<Symbol>,
    /// The result's dims.
    pub lhs_dims: Vec<usize>,
    /// Each argument's dims.
    pub rhs_dims: Vec<Vec<usize>>,
    /// For every axis of the result, the index to use.
    pub project_lhs: Vec<AxisIndex>,
    /// For every argument and every axis of it, the index to use.
    pub project_rhs: Vec<Vec<AxisIndex>>,
    /// Where these projections came from (e.g. the einsum spec), for messages.
    pub debug_info: String,
    /// Whether some entry is affine (SPEC 9.3): then every index that may fall outside its
    /// axis is guarded, and the points where one does are skipped (instead of being an error).
    pub affine: bool,
    /// Whether the result has an affine entry: the statement is then an accumulation (never
    /// [bijective](Projections::is_bijective)).
    pub affine_result: bool,
}

impl Projections {
    /// Pointwise projections: every operand has `dims`, every axis is iterated (axes of extent
    /// 1 use the fixed index 0).
    pub fn pointwise(dims: &[usize], num_args: usize) -> Projections {
        let mut product_space = vec![];
        let mut product_iterators = vec![];
        let idcs: Vec<AxisIndex> = dims
            .iter()
            .map(|&d| {
                if d == 1 {
                    AxisIndex::Fixed(0)
                } else {
                    let s = Symbol::fresh();
                    product_space.push(d);
                    product_iterators.push(s);
                    AxisIndex::Iterator(s)
                }
            })
            .collect();
        Projections {
            product_space,
            product_iterators,
            lhs_dims: dims.to_vec(),
            rhs_dims: vec![dims.to_vec(); num_args],
            project_lhs: idcs.clone(),
            project_rhs: vec![idcs; num_args],
            debug_info: "pointwise".into(),
            affine: false,
            affine_result: false,
        }
    }

    /// Whether every product iterator appears in `project_lhs` (each result cell is written
    /// exactly once per run). Never with affine entries: their skipped points may leave
    /// result cells unwritten, so `initialize_neutral` must fill the result first.
    pub fn is_bijective(&self) -> bool {
        !self.affine
            && self
                .product_iterators
                .iter()
                .all(|s| self.project_lhs.contains(&AxisIndex::Iterator(*s)))
    }

    /// The same projections with fresh iterator symbols (so that two lowerings of one
    /// projection never share loop variables).
    pub fn freshen(&self) -> Projections {
        let map: Vec<(Symbol, Symbol)> = self
            .product_iterators
            .iter()
            .map(|&s| (s, Symbol::fresh()))
            .collect();
        let sub = |i: &AxisIndex| match i {
            AxisIndex::Iterator(s) => AxisIndex::Iterator(
                map.iter()
                    .find(|(o, _)| o == s)
                    .map(|(_, n)| *n)
                    .unwrap_or(*s),
            ),
            AxisIndex::Linear(l) => {
                let terms: Vec<(Symbol, usize)> = l
                    .terms()
                    .iter()
                    .map(|&(s, c)| {
                        let n = map.iter().find(|(o, _)| *o == s).map_or(s, |(_, n)| *n);
                        (n, c)
                    })
                    .collect();
                // Renaming keeps the number of distinct terms, so this cannot fail.
                AxisIndex::affine(&terms, l.offset).unwrap_or(*i)
            }
            f => *f,
        };
        Projections {
            product_iterators: map.iter().map(|(_, n)| *n).collect(),
            project_lhs: self.project_lhs.iter().map(sub).collect(),
            project_rhs: self
                .project_rhs
                .iter()
                .map(|p| p.iter().map(sub).collect())
                .collect(),
            ..self.clone()
        }
    }
}

/// The static indices a routine is compiled with (the seed's `unit_bindings`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Bindings(pub Vec<StaticSymbol>);

impl Bindings {
    /// No static indices.
    pub fn empty() -> Bindings {
        Bindings(vec![])
    }

    /// Looks a static index up by name.
    pub fn find(&self, name: &str) -> Option<&StaticSymbol> {
        self.0.iter().find(|s| s.name == name)
    }

    /// Looks a static index up by symbol.
    pub fn find_symbol(&self, sym: Symbol) -> Option<&StaticSymbol> {
        self.0.iter().find(|s| s.symbol == sym)
    }
}

/// The value cells of a routine's static indices (the seed's `lowered_bindings`), in the
/// order of the routine's [`Bindings`]. Cheap to clone; clones share the cells.
#[derive(Clone, Debug, Default)]
pub struct RoutineBindings {
    entries: Arc<Vec<(StaticSymbol, AtomicI64)>>,
    /// The routine they belong to and its limits, when known.
    checks: Option<Arc<Limits>>,
}

/// A linked routine's name and, per static index, the exclusive bound on its value (its
/// range and the extent of every axis it indexes), when there is one.
#[derive(Debug)]
struct Limits {
    routine: String,
    limits: Vec<Option<usize>>,
}

/// Checks a value of the static index `sym` of `routine` against its exclusive bound
/// `limit` (`None`: any value below `i64::MAX`): [`Error::BindingOutOfRange`] if it is
/// negative or not below it.
pub fn check_static_value(
    routine: &str,
    sym: &StaticSymbol,
    value: i64,
    limit: Option<usize>,
) -> Result<()> {
    let limit = limit.unwrap_or(i64::MAX as usize);
    if value < 0 || value as u64 >= limit as u64 {
        return Err(Error::BindingOutOfRange {
            routine: routine.to_string(),
            index: sym.name.clone(),
            value,
            limit,
        });
    }
    Ok(())
}

impl RoutineBindings {
    /// Cells for the given static indices, all 0.
    pub fn new(bindings: &Bindings) -> RoutineBindings {
        RoutineBindings {
            entries: Arc::new(
                bindings
                    .0
                    .iter()
                    .map(|s| (s.clone(), AtomicI64::new(0)))
                    .collect(),
            ),
            checks: None,
        }
    }

    /// Cells for a linked routine's static indices, all 0: setting a value outside
    /// `0..limits[k]` is [`Error::BindingOutOfRange`] at once, naming the routine.
    pub fn for_routine(
        bindings: &Bindings,
        routine: &str,
        limits: Vec<Option<usize>>,
    ) -> RoutineBindings {
        RoutineBindings {
            checks: Some(Arc::new(Limits {
                routine: routine.to_string(),
                limits,
            })),
            ..RoutineBindings::new(bindings)
        }
    }

    fn check(&self, k: usize, value: i64) -> Result<()> {
        match &self.checks {
            Some(c) => check_static_value(
                &c.routine,
                &self.entries[k].0,
                value,
                c.limits.get(k).copied().flatten(),
            ),
            None => Ok(()),
        }
    }

    /// The static indices, in order.
    pub fn symbols(&self) -> impl Iterator<Item = &StaticSymbol> {
        self.entries.iter().map(|(s, _)| s)
    }

    fn unknown(&self, name: &str) -> Error {
        let known: Vec<&str> = self.entries.iter().map(|(s, _)| s.name.as_str()).collect();
        Error::UnknownStaticIndex {
            name: name.to_string(),
            known: if known.is_empty() {
                "none".into()
            } else {
                known.join(", ")
            },
        }
    }

    /// Sets the value of the static index named `name`.
    pub fn set(&self, name: &str, value: i64) -> Result<()> {
        let k = self
            .entries
            .iter()
            .position(|(s, _)| s.name == name)
            .ok_or_else(|| self.unknown(name))?;
        self.check(k, value)?;
        self.entries[k].1.store(value, Ordering::SeqCst);
        Ok(())
    }

    /// Sets the value of a static index by symbol.
    pub fn set_symbol(&self, sym: &StaticSymbol, value: i64) -> Result<()> {
        let k = self
            .entries
            .iter()
            .position(|(s, _)| s.symbol == sym.symbol)
            .ok_or_else(|| self.unknown(&sym.name))?;
        self.check(k, value)?;
        self.entries[k].1.store(value, Ordering::SeqCst);
        Ok(())
    }

    /// The current values, in order, without allocating.
    pub fn iter_values(&self) -> impl ExactSizeIterator<Item = i64> + '_ {
        self.entries.iter().map(|(_, c)| c.load(Ordering::SeqCst))
    }

    /// The current values, in order.
    pub fn values(&self) -> Vec<i64> {
        self.entries
            .iter()
            .map(|(_, c)| c.load(Ordering::SeqCst))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affine_indices_are_signed() {
        let (a, b) = (Symbol::fresh(), Symbol::fresh());
        let ix = AxisIndex::affine(&[(a, 2), (b, 1)], -1).unwrap();
        assert_eq!(ix.to_string(), format!("{a}*2+{b}-1"));
        let max = |s: Symbol| Some(if s == a { 3 } else { 2 });
        assert_eq!(ix.range(max), Some((-1, 7)));
        // A negative constant stays linear (fixed indices are unsigned).
        assert!(matches!(
            AxisIndex::affine(&[], -2),
            Some(AxisIndex::Linear(_))
        ));
        assert_eq!(AxisIndex::affine(&[], 2), Some(AxisIndex::Fixed(2)));
        assert_eq!(
            AxisIndex::affine(&[(a, 1)], 0),
            Some(AxisIndex::Iterator(a))
        );
        // Substitution keeps the signed offset: a := 1 gives b + 1.
        let s = ix.substitute(a, AxisIndex::Fixed(1)).unwrap();
        assert_eq!(s, AxisIndex::affine(&[(b, 1)], 1).unwrap());
        // Overflowing ranges are None, not a panic.
        let big = AxisIndex::affine(&[(a, usize::MAX / 2)], i64::MAX).unwrap();
        assert_eq!(big.range(|_| Some(4)), None);
    }
}
