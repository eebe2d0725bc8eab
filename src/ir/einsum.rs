//! Einsum-style projection specs.
//!
//! A spec such as `"ij,jk->ik"` describes how an operation's product space maps onto its
//! arguments (the comma-separated terms left of `->`) and its result (the single term right of
//! `->`). Grammar:
//!
//! - each ASCII letter (`a-z`, `A-Z`) is an iterator;
//! - a single decimal digit `0-9` is a fixed index into that axis;
//! - `{name}` is the static index called `name` in the given [`Bindings`];
//! - `(` terms `)` is an *affine* entry (SPEC 9.3): terms `COEF*LETTER` or `LETTER` joined by
//!   `+`, optionally followed by `+ N` or `- N`, e.g. `(2*h+i-1)`, `(o+k)`, `(i)`. Every letter
//!   in it must also appear alone, on an axis of extent other than 1, somewhere in the spec
//!   (that gives its extent). Points of the product space where an affine entry falls outside
//!   its axis are skipped (see [`Projections::affine`]);
//! - whitespace is ignored; any other character is an error.
//!
//! Every term has exactly one entry per axis of its operand. A letter's extent comes from the
//! dims it indexes; an axis of extent 1 broadcasts (it uses the fixed index 0 and does not
//! constrain the letter's extent). Letters that appear only left of `->` are reduced over.
//!
//! Positions in error messages count characters (not bytes) from 0.

use super::indexing::{AxisIndex, Bindings, Projections, StaticSymbol, Symbol};
use crate::error::{Error, Result};
use std::fmt;

/// Which operand a term describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operand {
    /// The result (the term right of `->`).
    Result,
    /// The argument with this 0-based position (shown 1-based).
    Arg(usize),
}

impl fmt::Display for Operand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Operand::Result => write!(f, "the result"),
            Operand::Arg(k) => write!(f, "argument {}", k + 1),
        }
    }
}

/// One axis entry of a term.
#[derive(Clone, Debug)]
enum Entry {
    Letter(char),
    Digit(usize),
    Static(String),
    /// `offset + Σ coef·letter`, with each letter's position in the spec.
    Affine {
        terms: Vec<(usize, char, usize)>,
        offset: i64,
    },
}

/// The largest coefficient or offset an affine entry may have.
pub const MAX_AFFINE_CONSTANT: u64 = i32::MAX as u64;

/// One parsed term: its text (for messages) and its entries with their character positions.
#[derive(Debug)]
struct Term {
    text: String,
    entries: Vec<(Entry, usize)>,
}

/// The extent of a letter, with where it was first seen with an extent other than 1.
#[derive(Clone, Copy)]
struct Extent {
    extent: usize,
    operand: Operand,
    axis: usize,
}

fn plural(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("{n} {one}")
    } else {
        format!("{n} {many}")
    }
}

/// Checks that the spec has one term per argument (`terms` of `args`) and that every
/// operand's term has one entry per axis.
fn check_operands(
    spec: &str,
    terms: usize,
    args: usize,
    operands: &[(Operand, &Term, &[usize])],
) -> Result<()> {
    let err = |msg: String| Error::Spec {
        spec: spec.to_string(),
        msg,
    };
    if terms != args {
        return Err(err(format!("expected {args} arguments, spec has {terms}")));
    }
    for &(operand, term, dims) in operands {
        if term.entries.len() != dims.len() {
            return Err(err(format!(
                "term '{}' of {operand} has {} but its dims {dims:?} have {}",
                term.text,
                plural(term.entries.len(), "axis", "axes"),
                dims.len()
            )));
        }
    }
    Ok(())
}

/// The dims of a result that `spec` leaves implicit: for each entry of the result term, the
/// extent its letter has in the arguments (`rhs_dims`, in order), or 1 where no argument gives
/// the letter an extent other than 1. Used to give an intermediate tensor its dims
/// ([`crate::ir::build`]).
///
/// # Errors
///
/// [`Error::Spec`] as [`projections`] for a malformed spec or a wrong number of arguments or
/// axes, and when a result entry is not a plain letter (a digit, a static index or an affine
/// entry: the result's extent there is not determined by the spec).
pub fn result_dims(spec: &str, rhs_dims: &[&[usize]]) -> Result<Vec<usize>> {
    let err = |msg: String| Error::Spec {
        spec: spec.to_string(),
        msg,
    };
    let (rhs_terms, lhs_term) = parse(spec)?;
    let operands: Vec<(Operand, &Term, &[usize])> = rhs_terms
        .iter()
        .zip(rhs_dims)
        .enumerate()
        .map(|(k, (t, d))| (Operand::Arg(k), t, *d))
        .collect();
    check_operands(spec, rhs_terms.len(), rhs_dims.len(), &operands)?;
    lhs_term
        .entries
        .iter()
        .map(|(entry, pos)| match entry {
            Entry::Letter(c) => Ok(rhs_terms
                .iter()
                .zip(rhs_dims)
                .flat_map(|(t, d)| t.entries.iter().zip(d.iter()))
                .filter(|((e, _), &dim)| matches!(e, Entry::Letter(l) if l == c) && dim != 1)
                .map(|(_, &dim)| dim)
                .next()
                .unwrap_or(1)),
            _ => Err(err(format!(
                "the result's entry at position {pos} (term '{}') is not a plain letter, so \
                 the result's dims are not determined by the spec: give it a tensor",
                lhs_term.text
            ))),
        })
        .collect()
}

/// Builds projections from an einsum-style spec.
///
/// `spec` is e.g. `"ij,jk->ik"` (binary) or `"ij->ji"` (unary); `lhs_dims` are the dims of the
/// result (the term right of `->`), `rhs_dims` those of the arguments (the terms left of
/// `->`, in order); `statics` resolves `{name}` entries.
///
/// The product space has one axis per letter whose extent is not 1: first the letters of the
/// result term in order of first appearance, then the letters found only in argument terms, in
/// order of first appearance. Each product axis gets a fresh [`Symbol`]. In the projections a
/// letter becomes [`AxisIndex::Iterator`] of its product iterator, except on axes of extent 1,
/// which use [`AxisIndex::Fixed`]`(0)` (broadcasting); a digit `d` becomes
/// [`AxisIndex::Fixed`]`(d)`; `{name}` becomes [`AxisIndex::Iterator`] of the static symbol.
/// A letter whose extent is 1 everywhere is not a product axis. An extent of 0 counts as a
/// genuine (empty) extent, not as a broadcast.
///
/// Letters that appear only in argument terms are reduced over, so the result is then not
/// [bijective](Projections::is_bijective).
///
/// # Errors
///
/// [`Error::Spec`] (never a panic) when the spec has a character other than letters, digits,
/// whitespace, `,`, `->` and `{name}`; when `->` is missing or repeated, or the result has more
/// than one term; when the number of argument terms differs from `rhs_dims.len()`; when a term's
/// number of entries differs from its operand's number of dims; when a letter has two different
/// extents that are not 1; when a digit is not below its axis's extent; when a static name is
/// empty, unterminated, or not in `statics`; or when a static index's range exceeds the extent
/// of the axis it indexes; when a letter of an affine entry never appears alone on an axis of
/// extent other than 1 (naming the letter), or an affine entry has more than
/// [`LinearIndex::MAX_TERMS`](super::indexing::LinearIndex::MAX_TERMS) distinct letters.
/// [`Error::SpecEntry`] when an affine entry is malformed (naming the term, the position and
/// the character) or has a number above [`MAX_AFFINE_CONSTANT`].
///
/// Affine entries set [`Projections::affine`] (and [`Projections::affine_result`] on the
/// result): lowering then guards every index that may leave its axis and skips those points.
pub fn projections(
    spec: &str,
    lhs_dims: &[usize],
    rhs_dims: &[&[usize]],
    statics: &Bindings,
) -> Result<Projections> {
    let err = |msg: String| Error::Spec {
        spec: spec.to_string(),
        msg,
    };
    let (rhs_terms, lhs_term) = parse(spec)?;
    // Every operand with its term and dims: the arguments in order, then the result.
    let operands: Vec<(Operand, &Term, &[usize])> = rhs_terms
        .iter()
        .zip(rhs_dims)
        .enumerate()
        .map(|(k, (t, d))| (Operand::Arg(k), t, *d))
        .chain(std::iter::once((Operand::Result, &lhs_term, lhs_dims)))
        .collect();
    check_operands(spec, rhs_terms.len(), rhs_dims.len(), &operands)?;

    // Validate entries and find every letter's extent.
    let mut extents: Vec<(char, Option<Extent>)> = vec![];
    for &(operand, term, dims) in &operands {
        for (axis, ((entry, pos), &dim)) in term.entries.iter().zip(dims).enumerate() {
            match entry {
                Entry::Letter(c) => {
                    let idx = match extents.iter().position(|(l, _)| l == c) {
                        Some(idx) => idx,
                        None => {
                            extents.push((*c, None));
                            extents.len() - 1
                        }
                    };
                    let slot = &mut extents[idx].1;
                    if dim == 1 {
                        continue;
                    }
                    match slot {
                        None => {
                            *slot = Some(Extent {
                                extent: dim,
                                operand,
                                axis,
                            })
                        }
                        Some(prev) if prev.extent != dim => {
                            return Err(err(format!(
                                "letter '{c}' has extent {} on axis {} of {} but extent {dim} \
                                 on axis {axis} of {operand} (term '{}')",
                                prev.extent, prev.axis, prev.operand, term.text
                            )));
                        }
                        Some(_) => {}
                    }
                }
                Entry::Digit(d) => {
                    if *d >= dim {
                        return Err(err(format!(
                            "fixed index {d} at position {pos} is out of range for axis {axis} \
                             of {operand} (term '{}'), whose extent is {dim}",
                            term.text
                        )));
                    }
                }
                Entry::Affine { .. } => {}
                Entry::Static(name) => {
                    let s = lookup(statics, name, *pos).map_err(err)?;
                    if let Some(range) = s.range {
                        if range > dim {
                            return Err(err(format!(
                                "static index '{name}' has range {range}, which exceeds the \
                                 extent {dim} of axis {axis} of {operand} (term '{}')",
                                term.text
                            )));
                        }
                    }
                }
            }
        }
    }

    // Every letter of an affine entry needs an extent from a plain entry.
    let mut affine = false;
    let mut affine_result = false;
    for &(operand, term, _) in &operands {
        for (entry, _) in &term.entries {
            if let Entry::Affine { terms, .. } = entry {
                affine = true;
                affine_result |= operand == Operand::Result;
                for &(_, c, pos) in terms {
                    let known = extents.iter().any(|(l, e)| *l == c && e.is_some());
                    if !known {
                        return Err(err(format!(
                            "letter '{c}' of the affine entry at position {pos} (term '{}' of \
                             {operand}) has no extent: it must also appear alone in some term \
                             on an axis of extent other than 1",
                            term.text
                        )));
                    }
                }
            }
        }
    }

    // Product space: result letters first, then letters found only in arguments.
    let mut order: Vec<char> = vec![];
    for term in std::iter::once(&lhs_term).chain(&rhs_terms) {
        for (entry, _) in &term.entries {
            let letters: Vec<char> = match entry {
                Entry::Letter(c) => vec![*c],
                Entry::Affine { terms, .. } => terms.iter().map(|t| t.1).collect(),
                _ => vec![],
            };
            for c in letters {
                if !order.contains(&c) {
                    order.push(c);
                }
            }
        }
    }
    let mut product_space = vec![];
    let mut product_iterators = vec![];
    let mut symbols: Vec<(char, Symbol)> = vec![];
    for c in order {
        let extent = extents
            .iter()
            .find(|(l, _)| *l == c)
            .and_then(|(_, e)| e.as_ref());
        if let Some(e) = extent {
            let s = Symbol::fresh();
            product_space.push(e.extent);
            product_iterators.push(s);
            symbols.push((c, s));
        }
    }

    let project = |term: &Term, dims: &[usize]| -> Result<Vec<AxisIndex>> {
        term.entries
            .iter()
            .zip(dims)
            .map(|((entry, pos), &dim)| {
                Ok(match entry {
                    Entry::Letter(_) if dim == 1 => AxisIndex::Fixed(0),
                    Entry::Letter(c) => {
                        let s = symbols
                            .iter()
                            .find(|(l, _)| l == c)
                            .map(|(_, s)| *s)
                            .ok_or_else(|| {
                                err(format!("internal error: no iterator for letter '{c}'"))
                            })?;
                        AxisIndex::Iterator(s)
                    }
                    Entry::Digit(d) => AxisIndex::Fixed(*d),
                    Entry::Affine { terms, offset } => {
                        let mut syms = vec![];
                        for &(coef, c, _) in terms {
                            let s = symbols
                                .iter()
                                .find(|(l, _)| *l == c)
                                .map(|(_, s)| *s)
                                .ok_or_else(|| {
                                    err(format!("internal error: no iterator for letter '{c}'"))
                                })?;
                            syms.push((s, coef));
                        }
                        AxisIndex::affine(&syms, *offset).ok_or_else(|| {
                            err(format!(
                                "the affine entry at position {pos} (term '{}') has more than \
                                 {} distinct letters",
                                term.text,
                                super::indexing::LinearIndex::MAX_TERMS
                            ))
                        })?
                    }
                    Entry::Static(name) => {
                        AxisIndex::Iterator(lookup(statics, name, *pos).map_err(err)?.symbol)
                    }
                })
            })
            .collect()
    };

    let project_lhs = project(&lhs_term, lhs_dims)?;
    let project_rhs = rhs_terms
        .iter()
        .zip(rhs_dims)
        .map(|(t, d)| project(t, d))
        .collect::<Result<Vec<_>>>()?;

    Ok(Projections {
        product_space,
        product_iterators,
        lhs_dims: lhs_dims.to_vec(),
        rhs_dims: rhs_dims.iter().map(|d| d.to_vec()).collect(),
        project_lhs,
        project_rhs,
        debug_info: spec.to_string(),
        affine,
        affine_result,
    })
}

fn lookup<'a>(
    statics: &'a Bindings,
    name: &str,
    pos: usize,
) -> std::result::Result<&'a StaticSymbol, String> {
    statics.find(name).ok_or_else(|| {
        let known: Vec<&str> = statics.0.iter().map(|s| s.name.as_str()).collect();
        format!("unknown static index '{{{name}}}' at position {pos} (known: {known:?})")
    })
}

/// Splits a spec into its argument terms and its result term.
fn parse(spec: &str) -> Result<(Vec<Term>, Term)> {
    parse_terms(spec).map_err(|e| match e {
        ParseError::Msg(msg) => Error::Spec {
            spec: spec.to_string(),
            msg,
        },
        ParseError::Entry { term, pos, msg } => Error::SpecEntry {
            spec: spec.to_string(),
            term,
            pos,
            msg,
        },
    })
}

/// A parse error: about the whole spec, or about one entry of a term.
enum ParseError {
    Msg(String),
    Entry {
        term: String,
        pos: usize,
        msg: String,
    },
}

impl From<String> for ParseError {
    fn from(m: String) -> ParseError {
        ParseError::Msg(m)
    }
}

/// Describes a character for messages (`end of spec` past the end).
fn describe(c: Option<&char>) -> String {
    match c {
        Some(c) => format!("{c:?}"),
        None => "the end of the spec".to_string(),
    }
}

/// Parses the affine entry whose `(` is at `open`; returns it and the position of its `)`.
/// `term` is the text of the term holding it (for messages).
fn parse_affine(
    chars: &[char],
    open: usize,
    term: &str,
) -> std::result::Result<(Entry, usize), ParseError> {
    let fail = |pos: usize, msg: String| ParseError::Entry {
        term: term.to_string(),
        pos,
        msg,
    };
    let mut i = open + 1;
    let skip_ws = |i: &mut usize| {
        while chars.get(*i).is_some_and(|c| c.is_whitespace()) {
            *i += 1;
        }
    };
    // Reads a decimal number starting at `*i` (a digit).
    let number = |i: &mut usize| -> std::result::Result<u64, ParseError> {
        let start = *i;
        let mut v: u64 = 0;
        while let Some(d) = chars.get(*i).and_then(|c| c.to_digit(10)) {
            v = v
                .checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(d)))
                .filter(|v| *v <= MAX_AFFINE_CONSTANT)
                .ok_or_else(|| {
                    fail(
                        start,
                        format!(
                            "the number starting with {:?} at position {start} is too large \
                             (at most {MAX_AFFINE_CONSTANT})",
                            chars[start]
                        ),
                    )
                })?;
            *i += 1;
        }
        Ok(v)
    };
    let mut terms: Vec<(usize, char, usize)> = vec![];
    let mut offset: i64 = 0;
    loop {
        // A term (or, after '+', a final offset).
        skip_ws(&mut i);
        match chars.get(i) {
            Some(c) if c.is_ascii_alphabetic() => {
                terms.push((1, *c, i));
                i += 1;
            }
            Some(c) if c.is_ascii_digit() => {
                let start = i;
                let n = number(&mut i)?;
                skip_ws(&mut i);
                if chars.get(i) == Some(&'*') {
                    i += 1;
                    skip_ws(&mut i);
                    match chars.get(i) {
                        Some(c) if c.is_ascii_alphabetic() => {
                            terms.push((n as usize, *c, i));
                            i += 1;
                        }
                        c => {
                            return Err(fail(
                                i,
                                format!(
                                    "expected a letter after '*' in the affine entry opened at \
                                     position {open}, found {}",
                                    describe(c)
                                ),
                            ))
                        }
                    }
                } else if terms.is_empty() {
                    return Err(fail(
                        start,
                        format!(
                            "the affine entry opened at position {open} starts with the number \
                             {n} without '*' and a letter: it needs at least one letter term"
                        ),
                    ));
                } else {
                    offset = n as i64;
                    skip_ws(&mut i);
                    return match chars.get(i) {
                        Some(')') => Ok((Entry::Affine { terms, offset }, i)),
                        c => Err(fail(
                            i,
                            format!(
                                "expected ')' after the offset {n} of the affine entry opened \
                                 at position {open}, found {}",
                                describe(c)
                            ),
                        )),
                    };
                }
            }
            c => {
                return Err(fail(
                    i,
                    format!(
                        "expected a letter or a coefficient in the affine entry opened at \
                         position {open}, found {}",
                        describe(c)
                    ),
                ))
            }
        }
        // After a term: '+', '-' (final offset) or ')'.
        skip_ws(&mut i);
        match chars.get(i) {
            Some('+') => i += 1,
            Some(')') => return Ok((Entry::Affine { terms, offset }, i)),
            Some('-') => {
                let minus = i;
                i += 1;
                skip_ws(&mut i);
                if !chars.get(i).is_some_and(|c| c.is_ascii_digit()) {
                    return Err(fail(
                        i,
                        format!(
                            "expected a number after '-' at position {minus} (only the final \
                             offset may be subtracted), found {}",
                            describe(chars.get(i))
                        ),
                    ));
                }
                let n = number(&mut i)?;
                skip_ws(&mut i);
                if chars.get(i) == Some(&'*') {
                    return Err(fail(
                        i,
                        format!(
                            "unexpected '*' at position {i}: coefficients are non-negative, \
                             only the final offset may follow '-'"
                        ),
                    ));
                }
                offset = -(n as i64);
                return match chars.get(i) {
                    Some(')') => Ok((Entry::Affine { terms, offset }, i)),
                    c => Err(fail(
                        i,
                        format!(
                            "expected ')' after the offset -{n} of the affine entry opened at \
                             position {open}, found {}",
                            describe(c)
                        ),
                    )),
                };
            }
            c => {
                return Err(fail(
                    i,
                    format!(
                        "expected '+', '-' or ')' after a term of the affine entry opened at \
                         position {open}, found {}",
                        describe(c)
                    ),
                ))
            }
        }
    }
}

fn parse_terms(spec: &str) -> std::result::Result<(Vec<Term>, Term), ParseError> {
    let chars: Vec<char> = spec.chars().collect();
    let text = |from: usize, to: usize| -> String {
        chars[from..to]
            .iter()
            .collect::<String>()
            .trim()
            .to_string()
    };
    let mut rhs_terms = vec![];
    let mut entries = vec![];
    let mut term_start = 0;
    let mut arrow: Option<usize> = None;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => {}
            c if c.is_ascii_alphabetic() => entries.push((Entry::Letter(c), i)),
            c if c.is_ascii_digit() => {
                entries.push((Entry::Digit((c as u8 - b'0') as usize), i));
            }
            '(' => {
                // The text of the term holding the entry, for messages.
                let end = (i..chars.len())
                    .find(|&k| {
                        chars[k] == ',' || (chars[k] == '-' && chars.get(k + 1) == Some(&'>'))
                    })
                    .unwrap_or(chars.len());
                let term = text(term_start, end);
                let (entry, close) = parse_affine(&chars, i, &term)?;
                entries.push((entry, i));
                i = close;
            }
            '{' => {
                let close = chars[i + 1..]
                    .iter()
                    .position(|&c| c == '}')
                    .map(|off| i + 1 + off)
                    .ok_or_else(|| ParseError::Msg(format!("unterminated '{{' at position {i}")))?;
                if let Some(off) = chars[i + 1..close].iter().position(|&c| c == '{') {
                    return Err(ParseError::Msg(format!(
                        "unexpected '{{' at position {} inside the static index name opened \
                         at position {i} (missing '}}'?)",
                        i + 1 + off
                    )));
                }
                let name = text(i + 1, close);
                if name.is_empty() {
                    return Err(format!("empty static index name '{{}}' at position {i}").into());
                }
                entries.push((Entry::Static(name), i));
                i = close;
            }
            ',' => {
                if arrow.is_some() {
                    return Err(format!(
                        "the result (right of '->') must be a single term, found ',' at \
                         position {i}"
                    )
                    .into());
                }
                rhs_terms.push(Term {
                    text: text(term_start, i),
                    entries: std::mem::take(&mut entries),
                });
                term_start = i + 1;
            }
            '-' if chars.get(i + 1) == Some(&'>') => {
                if let Some(first) = arrow {
                    return Err(format!(
                        "'->' appears more than once (at positions {first} and {i})"
                    )
                    .into());
                }
                rhs_terms.push(Term {
                    text: text(term_start, i),
                    entries: std::mem::take(&mut entries),
                });
                arrow = Some(i);
                i += 1;
                term_start = i + 1;
            }
            '-' => {
                return Err(
                    format!("unexpected character '-' at position {i} (expected '->')").into(),
                )
            }
            c => {
                return Err(format!(
                    "unexpected character {c:?} at position {i}: expected a letter, a digit, \
                     '{{name}}', '(affine entry)', ',' or '->'"
                )
                .into())
            }
        }
        i += 1;
    }
    if arrow.is_none() {
        return Err("missing '->' between the arguments and the result"
            .to_string()
            .into());
    }
    let lhs = Term {
        text: text(term_start, chars.len()),
        entries,
    };
    Ok((rhs_terms, lhs))
}
