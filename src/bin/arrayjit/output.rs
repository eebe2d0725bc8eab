//! Printing tensors: the JSON object of `arrayjit run` and the tables of `--format table`.

use crate::program::decimal;
use arrayjit::error::{Error, Result};
use arrayjit::ir::ndarray::f16_from_f64;
use arrayjit::ir::Prec;
use half::f16;
use std::fmt::Write as _;

/// A value's text: the shortest decimal that reads back as the same value of `prec`.
///
/// Bytes print as integers. Floats print like Rust's `{}` (shortest round-trip digits), but in
/// exponent form (`1e20`, `1.5e-7`) when `|x| >= 1e16` or `0 < |x| < 1e-5`. Halves use the
/// fewest significant digits that round back to the same `f16`. Non-finite values print as
/// `inf`, `-inf` and `nan` (the JSON output quotes them). Negative zero prints as `-0`.
///
/// Every printed number, given back as an `init` value of a tensor of the same precision,
/// reads back as the same value ([`decimal`] converts it correctly rounded).
pub fn format_value(prec: Prec, v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    match prec {
        p if p.is_integer() => format!("{}", p.round(v) as i128),
        Prec::Half => format_f64(shortest_half(f16_from_f64(v))),
        // The exact value (shortest as a double): compared as a number or rounded back to
        // the precision, it is the stored value either way (the shortest digits that merely
        // round back, such as 60000 for the fp8 57344, would not compare equal as numbers).
        Prec::Bfloat16 | Prec::Fp8 => format_f64(prec.round(v)),
        Prec::Single => {
            let x = v as f32;
            let a = x.abs();
            if a >= 1e16 || (a < 1e-5 && a != 0.0) {
                format!("{x:e}")
            } else {
                format!("{x}")
            }
        }
        _ => format_f64(v),
    }
}

fn format_f64(x: f64) -> String {
    let a = x.abs();
    if a >= 1e16 || (a < 1e-5 && a != 0.0) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

/// The `f64` with the fewest significant decimal digits whose decimal converts back to `h`
/// (correctly rounded, see [`decimal::convert_text`]).
fn shortest_half(h: f16) -> f64 {
    let exact = h.to_f64();
    if exact == 0.0 {
        return exact;
    }
    for digits in 1..=17 {
        let s = format!("{:.*e}", digits - 1, exact);
        if let Ok(back) = decimal::convert_text(&s, Prec::Half) {
            if back.to_bits() == exact.to_bits() {
                if let Ok(y) = s.parse::<f64>() {
                    return y;
                }
            }
        }
    }
    exact
}

/// The longest text [`json_value`] gives for a finite value of `prec`, quotes included
/// (`"-inf"` is 6).
fn max_value_len(prec: Prec) -> usize {
    match prec {
        Prec::Byte => 6,
        p if p.is_integer() => 22,
        Prec::Half | Prec::Bfloat16 | Prec::Fp8 => 12,
        Prec::Single => 16,
        _ => 25,
    }
}

/// Reserves room for `more` bytes, or [`Error::OutOfMemory`] for the printed tensor `name`.
fn reserve(out: &mut String, more: usize, name: &str) -> Result<()> {
    out.try_reserve(more).map_err(|_| Error::OutOfMemory {
        what: format!("the printed text of tensor {}", json_string(name)),
        bytes: out.len().saturating_add(more),
    })
}

/// A value as JSON: a number, or the strings `"inf"`, `"-inf"`, `"nan"`.
pub fn json_value(prec: Prec, v: f64) -> String {
    let s = format_value(prec, v);
    if v.is_finite() {
        s
    } else {
        format!("\"{s}\"")
    }
}

/// One printed tensor.
pub struct Printed<'a> {
    /// The name.
    pub name: &'a str,
    /// The dims.
    pub dims: &'a [usize],
    /// The precision.
    pub prec: Prec,
    /// The values, row-major.
    pub values: &'a [f64],
    /// For integer precisions, the exact values (printed instead of `values`); else empty.
    pub ints: &'a [i128],
}

impl Printed<'_> {
    /// The JSON text of cell `k`.
    fn json_cell(&self, k: usize) -> String {
        match self.ints.get(k) {
            Some(i) => i.to_string(),
            None => json_value(self.prec, self.values[k]),
        }
    }

    /// The table text of cell `k`.
    fn table_cell(&self, k: usize) -> String {
        match self.ints.get(k) {
            Some(i) => i.to_string(),
            None => format_value(self.prec, self.values[k]),
        }
    }
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"?\"".into())
}

/// The JSON object printed by `arrayjit run`, one member per line:
/// `{"NAME": {"dims": [...], "prec": "...", "values": [...]}, ...}`.
///
/// [`Error::OutOfMemory`] when the text does not fit in memory.
pub fn to_json(tensors: &[Printed<'_>]) -> Result<String> {
    let mut out = String::from("{");
    for (i, t) in tensors.iter().enumerate() {
        let dims: Vec<String> = t.dims.iter().map(|d| d.to_string()).collect();
        let head = format!(
            "{}{}: {{\"dims\": [{}], \"prec\": \"{}\", \"values\": [",
            if i == 0 { "\n  " } else { ",\n  " },
            json_string(t.name),
            dims.join(", "),
            t.prec.name(),
        );
        let body = t.values.len().saturating_mul(max_value_len(t.prec) + 2);
        reserve(
            &mut out,
            head.len().saturating_add(body).saturating_add(8),
            t.name,
        )?;
        out.push_str(&head);
        for k in 0..t.values.len() {
            if k > 0 {
                out.push_str(", ");
            }
            out.push_str(&t.json_cell(k));
        }
        out.push_str("]}");
    }
    out.push_str(if tensors.is_empty() { "}\n" } else { "\n}\n" });
    Ok(out)
}

/// A tensor name as a table header shows it: as is, unless it holds characters that could
/// garble a terminal or the layout (control characters such as newlines or escape sequences,
/// invisible formatting such as bidirectional overrides); then quoted, with those escaped
/// (Rust's `escape_debug`).
fn table_name(name: &str) -> String {
    let escaped = name.escape_debug().to_string();
    if escaped == name {
        escaped
    } else {
        format!("\"{escaped}\"")
    }
}

/// Human-readable tables: a header `NAME: dims [..], PREC` per tensor, then its values
/// right-aligned in columns of one width: a 1-D tensor as one row, a 2-D tensor as rows and
/// columns, and higher-dimensional tensors as a sequence of 2-D slices, each introduced by its
/// leading indices (`[0, 1, :, :]`).
///
/// [`Error::OutOfMemory`] when the text does not fit in memory.
pub fn to_table(tensors: &[Printed<'_>]) -> Result<String> {
    let mut out = String::new();
    for (k, t) in tensors.iter().enumerate() {
        if k > 0 {
            out.push('\n');
        }
        let dims: Vec<String> = t.dims.iter().map(|d| d.to_string()).collect();
        out.push_str(&format!(
            "{}: dims [{}], {}\n",
            table_name(t.name),
            dims.join(", "),
            t.prec.name()
        ));
        let mut cells: Vec<String> = Vec::new();
        cells
            .try_reserve_exact(t.values.len())
            .map_err(|_| Error::OutOfMemory {
                what: format!("the printed cells of tensor {}", json_string(t.name)),
                bytes: t.values.len().saturating_mul(std::mem::size_of::<String>()),
            })?;
        cells.extend((0..t.values.len()).map(|k| t.table_cell(k)));
        let width = cells.iter().map(|c| c.chars().count()).max().unwrap_or(1);
        reserve(
            &mut out,
            cells.len().saturating_mul(width + 2).saturating_add(64),
            t.name,
        )?;
        let (rows, cols) = match t.dims.len() {
            0 => (1, 1),
            1 => (1, t.dims[0]),
            n => (t.dims[n - 2], t.dims[n - 1]),
        };
        let slice = (rows * cols).max(1);
        let lead = if t.dims.len() > 2 {
            &t.dims[..t.dims.len() - 2]
        } else {
            &[][..]
        };
        for (s, chunk) in cells.chunks(slice).enumerate() {
            if !lead.is_empty() {
                // The leading indices of slice `s`.
                let mut idx = vec![0; lead.len()];
                let mut rem = s;
                for (i, &d) in lead.iter().enumerate().rev() {
                    idx[i] = rem % d;
                    rem /= d;
                }
                let mut parts: Vec<String> = idx.iter().map(|i| i.to_string()).collect();
                parts.extend([":".to_string(), ":".to_string()]);
                out.push_str(&format!("[{}]\n", parts.join(", ")));
            }
            for row in chunk.chunks(cols.max(1)) {
                out.push_str("  ");
                for (k, c) in row.iter().enumerate() {
                    if k > 0 {
                        out.push_str("  ");
                    }
                    let _ = write!(out, "{c:>width$}");
                }
                out.push('\n');
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_values() {
        assert_eq!(format_value(Prec::Single, 0.1f32 as f64), "0.1");
        assert_eq!(format_value(Prec::Single, 3.0), "3");
        assert_eq!(format_value(Prec::Single, 1e20), "1e20");
        assert_eq!(format_value(Prec::Single, 1.5e-7f32 as f64), "1.5e-7");
        assert_eq!(format_value(Prec::Double, 0.1 + 0.2), "0.30000000000000004");
        assert_eq!(format_value(Prec::Half, f16::from_f64(0.1).to_f64()), "0.1");
        assert_eq!(format_value(Prec::Half, 65504.0), "65500");
        assert_eq!(
            format_value(Prec::Half, f16::from_f64(1e-7).to_f64()),
            "1e-7"
        );
        assert_eq!(format_value(Prec::Byte, 255.0), "255");
        assert_eq!(format_value(Prec::Double, -0.0), "-0");
        assert_eq!(json_value(Prec::Double, f64::NEG_INFINITY), "\"-inf\"");
        assert_eq!(json_value(Prec::Half, f64::NAN), "\"nan\"");
    }

    #[test]
    fn table_names_are_escaped_only_when_needed() {
        assert_eq!(table_name("weights.layer_1"), "weights.layer_1");
        assert_eq!(table_name("été 😀"), "été 😀");
        assert_eq!(table_name("a\nb"), "\"a\\nb\"");
        assert_eq!(table_name("x\u{1b}[2J"), "\"x\\u{1b}[2J\"");
        assert_eq!(table_name("\u{202e}abc"), "\"\\u{202e}abc\"");
        let t = to_table(&[Printed {
            name: "two\nlines",
            dims: &[1],
            prec: Prec::Single,
            values: &[1.0],
            ints: &[],
        }])
        .unwrap();
        assert_eq!(t.lines().count(), 2, "{t}");
    }

    #[test]
    fn every_half_round_trips() {
        for bits in 0..=u16::MAX {
            let h = f16::from_bits(bits);
            if !h.is_finite() {
                continue;
            }
            let s = format_value(Prec::Half, h.to_f64());
            let back = decimal::convert_text(&s, Prec::Half).unwrap();
            assert_eq!(back.to_bits(), h.to_f64().to_bits(), "{s}");
        }
    }
}
