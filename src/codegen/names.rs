//! Identifiers and comments in generated C: sanitized, unique within a file, stable.

use crate::ir::{StaticSymbol, Symbol, Tnode};
use crate::loops::ScopeId;
use std::collections::HashMap;

/// Turns any text into a fragment of a C identifier: `[a-z0-9_]` only (lowercase), no
/// leading digit or underscore, no runs of underscores, at most 32 characters, never empty.
///
/// The result is only ever used with a suffix (`_<n>`, `_v<n>`, `_s<n>`, `_routine`), so it
/// can never equal a C keyword or a libc/libm name such as `exp` or `y0`; being lowercase, it
/// can never spell an upper-case macro of the C headers either (`M_PI_2` is a number in
/// `<math.h>`).
pub fn sanitize_ident(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        let c = if c.is_ascii_alphanumeric() {
            c.to_ascii_lowercase()
        } else {
            '_'
        };
        if c == '_' && (out.is_empty() || out.ends_with('_')) {
            continue;
        }
        out.push(c);
        if out.len() >= 32 {
            break;
        }
    }
    while out.ends_with('_') {
        out.pop();
    }
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, 't');
    }
    out
}

/// Makes text safe inside a C block comment: printable ASCII only, without `/` (so neither
/// `*/` nor `/*` can appear), `\` (no line splicing), `?` (no trigraphs), `#` or `"`; every
/// other character becomes `_`. At most 200 characters.
pub fn sanitize_comment(s: &str) -> String {
    s.chars()
        .take(200)
        .map(|c| {
            if (c.is_ascii_graphic() || c == ' ') && !matches!(c, '/' | '\\' | '?' | '#' | '"') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Per-file naming of nodes, loop iterators, static indices, locals and routines.
#[derive(Default)]
pub(crate) struct Names {
    nodes: HashMap<Tnode, String>,
    symbols: HashMap<Symbol, String>,
    scopes: HashMap<u32, String>,
    vregs: HashMap<u32, String>,
    routines: Vec<String>,
}

impl Names {
    pub(crate) fn node(&mut self, tn: &Tnode) -> String {
        let n = self.nodes.len() + 1;
        self.nodes
            .entry(tn.clone())
            .or_insert_with(|| format!("{}_{n}", sanitize_ident(&tn.label().join("_"))))
            .clone()
    }

    pub(crate) fn symbol(&mut self, s: Symbol) -> String {
        let n = self.symbols.len() + 1;
        self.symbols
            .entry(s)
            .or_insert_with(|| format!("i{n}"))
            .clone()
    }

    pub(crate) fn static_symbol(&mut self, s: &StaticSymbol) -> String {
        let n = self.symbols.len() + 1;
        self.symbols
            .entry(s.symbol)
            .or_insert_with(|| format!("{}_s{n}", sanitize_ident(&s.name)))
            .clone()
    }

    pub(crate) fn scope(&mut self, id: &ScopeId) -> String {
        let n = self.scopes.len() + 1;
        self.scopes
            .entry(id.id)
            .or_insert_with(|| format!("{}_v{n}", sanitize_ident(&id.tn.label().join("_"))))
            .clone()
    }

    pub(crate) fn vreg(&mut self, id: u32) -> String {
        let n = self.vregs.len() + 1;
        self.vregs
            .entry(id)
            .or_insert_with(|| format!("vec{n}"))
            .clone()
    }

    pub(crate) fn routine(&mut self, name: &str) -> String {
        let base = format!("{}_routine", sanitize_ident(name));
        let mut c = base.clone();
        let mut k = 2;
        while self.routines.contains(&c) {
            c = format!("{base}{k}");
            k += 1;
        }
        self.routines.push(c.clone());
        c
    }
}
