//! Finding places in a program file's text: JSON paths to line/column and back, and a
//! readable description of a path (`routine "forward", statement 2 (in block "...")`).
//!
//! serde_json reports line and column but not the path; our semantic checks know the path but
//! not the position. A small tolerant scanner of the JSON text bridges the two (it works on
//! the raw text, so it also gives a best-effort path for syntax errors).

use serde_json::Value;

/// One step of a path into the JSON document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seg {
    /// An object member.
    Key(String),
    /// An array element (0-based).
    Index(usize),
}

/// A path into the JSON document.
pub type JsonPath = Vec<Seg>;

/// Builds a path from string keys and indices: `path!["routines", 0, "code"]`.
macro_rules! json_path {
    ($($seg:expr),* $(,)?) => {
        $crate::program::locate::JsonPath::from([$($crate::program::locate::IntoSeg::into_seg($seg)),*])
    };
}
pub(crate) use json_path;

/// Conversion into a path segment (used by the crate-internal `json_path!` macro).
pub trait IntoSeg {
    /// The segment.
    fn into_seg(self) -> Seg;
}
impl IntoSeg for &str {
    fn into_seg(self) -> Seg {
        Seg::Key(self.to_string())
    }
}
impl IntoSeg for usize {
    fn into_seg(self) -> Seg {
        Seg::Index(self)
    }
}
impl IntoSeg for Seg {
    fn into_seg(self) -> Seg {
        self
    }
}

/// What the scanner reports: a value starts (`end == None`) or ends.
type Visit<'a> = dyn FnMut(&[Seg], usize, Option<usize>) -> bool + 'a;

/// Nesting deeper than this is not scanned (serde_json rejects it anyway; this keeps the
/// recursive scanner's stack small).
const MAX_DEPTH: usize = 256;

struct Scanner<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Scanner<'_> {
    fn ws(&mut self) {
        while self.pos < self.s.len() && matches!(self.s[self.pos], b' ' | b'\t' | b'\n' | b'\r') {
            self.pos += 1;
        }
    }

    fn string(&mut self) -> Option<String> {
        if self.s.get(self.pos) != Some(&b'"') {
            return None;
        }
        self.pos += 1;
        let mut bytes = vec![];
        while let Some(&c) = self.s.get(self.pos) {
            self.pos += 1;
            match c {
                b'"' => return Some(String::from_utf8_lossy(&bytes).into_owned()),
                b'\\' => {
                    let e = *self.s.get(self.pos)?;
                    self.pos += 1;
                    match e {
                        b'n' => bytes.push(b'\n'),
                        b't' => bytes.push(b'\t'),
                        b'r' => bytes.push(b'\r'),
                        b'b' => bytes.push(8),
                        b'f' => bytes.push(12),
                        b'u' => {
                            let mut cp = self.hex4()?;
                            if (0xD800..0xDC00).contains(&cp)
                                && self.s.get(self.pos) == Some(&b'\\')
                                && self.s.get(self.pos + 1) == Some(&b'u')
                            {
                                self.pos += 2;
                                let lo = self.hex4()?;
                                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo.wrapping_sub(0xDC00));
                            }
                            let ch = char::from_u32(cp).unwrap_or('\u{FFFD}');
                            let mut buf = [0u8; 4];
                            bytes.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                        }
                        other => bytes.push(other),
                    }
                }
                _ => bytes.push(c),
            }
        }
        None
    }

    fn hex4(&mut self) -> Option<u32> {
        let h = self.s.get(self.pos..self.pos + 4)?;
        self.pos += 4;
        u32::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()
    }

    /// Scans one value; returns `None` on malformed input, `Some(false)` when `visit` asked to
    /// stop.
    fn value(&mut self, path: &mut JsonPath, visit: &mut Visit<'_>) -> Option<bool> {
        if path.len() > MAX_DEPTH {
            return None;
        }
        self.ws();
        let start = self.pos;
        if !visit(path, start, None) {
            return Some(false);
        }
        match *self.s.get(self.pos)? {
            b'{' => {
                self.pos += 1;
                self.ws();
                if self.s.get(self.pos) == Some(&b'}') {
                    self.pos += 1;
                } else {
                    loop {
                        self.ws();
                        let key = self.string()?;
                        self.ws();
                        if self.s.get(self.pos) != Some(&b':') {
                            return None;
                        }
                        self.pos += 1;
                        path.push(Seg::Key(key));
                        let go_on = self.value(path, visit)?;
                        path.pop();
                        if !go_on {
                            return Some(false);
                        }
                        self.ws();
                        match *self.s.get(self.pos)? {
                            b',' => self.pos += 1,
                            b'}' => {
                                self.pos += 1;
                                break;
                            }
                            _ => return None,
                        }
                    }
                }
            }
            b'[' => {
                self.pos += 1;
                self.ws();
                if self.s.get(self.pos) == Some(&b']') {
                    self.pos += 1;
                } else {
                    let mut i = 0;
                    loop {
                        path.push(Seg::Index(i));
                        let go_on = self.value(path, visit)?;
                        path.pop();
                        if !go_on {
                            return Some(false);
                        }
                        i += 1;
                        self.ws();
                        match *self.s.get(self.pos)? {
                            b',' => self.pos += 1,
                            b']' => {
                                self.pos += 1;
                                break;
                            }
                            _ => return None,
                        }
                    }
                }
            }
            b'"' => {
                self.string()?;
            }
            _ => {
                let from = self.pos;
                while self.pos < self.s.len()
                    && !matches!(
                        self.s[self.pos],
                        b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'
                    )
                {
                    self.pos += 1;
                }
                if self.pos == from {
                    return None;
                }
            }
        }
        Some(visit(path, start, Some(self.pos)))
    }
}

/// The byte offset where the value at `path` starts, if the text has it.
pub fn find_value(text: &str, path: &[Seg]) -> Option<usize> {
    let mut found = None;
    let mut sc = Scanner {
        s: text.as_bytes(),
        pos: 0,
    };
    sc.value(&mut vec![], &mut |p, start, end| {
        if end.is_none() && p == path {
            found = Some(start);
            return false;
        }
        true
    });
    found
}

/// The path of the innermost value whose text contains byte offset `offset` (best effort:
/// on malformed text, the values opened before the error count as containing it).
pub fn path_at(text: &str, offset: usize) -> JsonPath {
    let mut spans: Vec<(JsonPath, usize, Option<usize>)> = vec![];
    let mut sc = Scanner {
        s: text.as_bytes(),
        pos: 0,
    };
    sc.value(&mut vec![], &mut |p, start, end| {
        if start > offset {
            return false;
        }
        match end {
            None => spans.push((p.to_vec(), start, None)),
            Some(e) => {
                if let Some(s) = spans.iter_mut().rev().find(|s| s.0 == p && s.1 == start) {
                    s.2 = Some(e);
                }
            }
        }
        true
    });
    spans
        .into_iter()
        .filter(|(_, start, end)| *start <= offset && end.is_none_or(|e| offset < e.max(start + 1)))
        .max_by_key(|(p, _, _)| p.len())
        .map(|(p, _, _)| p)
        .unwrap_or_default()
}

/// 1-based line and column (in characters) of a byte offset.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let mut offset = offset;
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

/// The byte offset of a 1-based line and column as serde_json reports them (column counts
/// bytes; clamped to the text).
pub fn offset_of(text: &str, line: usize, column: usize) -> usize {
    let mut start = 0;
    for _ in 1..line {
        match text[start..].find('\n') {
            Some(i) => start += i + 1,
            None => return text.len(),
        }
    }
    let line_len = text[start..].find('\n').unwrap_or(text.len() - start);
    start + column.saturating_sub(1).min(line_len)
}

fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
}

fn name_at<'a>(v: Option<&'a Value>, key: &str) -> Option<&'a str> {
    v?.get(key)?.as_str()
}

/// A readable description of where `path` points, using names from the parsed document when
/// available: `tensor "x"`, `static index "row"`, `routine "forward", statement 2 (in block
/// "...")`, `run step 1.2` (step 2 inside the repeat that is run step 1), `print entry 3`.
/// Statement and step numbers count from 1. Empty when the path has no such context.
pub fn describe(path: &[Seg], root: Option<&Value>) -> String {
    let key = |i: usize| match path.get(i) {
        Some(Seg::Key(k)) => Some(k.as_str()),
        _ => None,
    };
    let index = |i: usize| match path.get(i) {
        Some(Seg::Index(n)) => Some(*n),
        _ => None,
    };
    let section = key(0);
    let Some(n) = index(1) else {
        return String::new();
    };
    let item = root.and_then(|r| r.get(section?)).and_then(|s| s.get(n));
    match section {
        Some("tensors") => match name_at(item, "name") {
            Some(name) => format!("tensor {}", quote(name)),
            None => format!("tensor #{}", n + 1),
        },
        Some("static_indices") => match name_at(item, "name") {
            Some(name) => format!("static index {}", quote(name)),
            None => format!("static index #{}", n + 1),
        },
        Some("routines") => {
            let mut out = match name_at(item, "name") {
                Some(name) => format!("routine {}", quote(name)),
                None => format!("routine #{}", n + 1),
            };
            // Walk code[j].code[k]... collecting the statement numbers and enclosing blocks.
            let mut cur = item;
            let mut i = 2;
            let mut blocks: Vec<String> = vec![];
            let mut last: Option<usize> = None;
            while key(i) == Some("code") {
                let Some(j) = index(i + 1) else { break };
                if let Some(prev) = last {
                    let comment = name_at(cur, "comment")
                        .map(quote)
                        .unwrap_or_else(|| format!("#{}", prev + 1));
                    blocks.push(comment);
                }
                cur = cur.and_then(|c| c.get("code")).and_then(|c| c.get(j));
                last = Some(j);
                i += 2;
            }
            if let Some(j) = last {
                out.push_str(&format!(", statement {}", j + 1));
                if !blocks.is_empty() {
                    blocks.reverse();
                    let named = |bs: &[String]| -> Vec<String> {
                        bs.iter().map(|b| format!("in block {b}")).collect()
                    };
                    // A deep nest names its innermost and outermost blocks only.
                    let inner = if blocks.len() > 6 {
                        let (first, rest) = blocks.split_at(3);
                        let last = &rest[rest.len() - 3..];
                        let skipped = blocks.len() - 6;
                        let mut v = named(first);
                        v.push(format!("... {skipped} more blocks"));
                        v.extend(named(last));
                        v
                    } else {
                        named(&blocks)
                    };
                    out.push_str(&format!(" ({})", inner.join(", ")));
                }
            }
            out
        }
        Some("run") => {
            let mut nums = vec![(n + 1).to_string()];
            let mut i = 2;
            while key(i) == Some("steps") {
                let Some(j) = index(i + 1) else { break };
                nums.push((j + 1).to_string());
                i += 2;
            }
            format!("run step {}", nums.join("."))
        }
        Some("print") => format!("print entry {}", n + 1),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r#"{
  "tensors": [{"name": "x", "dims": [2]}],
  "routines": [
    {"name": "f", "code": [
      {"comment": "blk", "code": [
        {"assign": "x", "op": "identity", "args": ["q"]}
      ]}
    ]}
  ]
}"#;

    #[test]
    fn finds_values_and_paths() {
        let p = json_path!["routines", 0usize, "code", 0usize, "code", 0usize, "args", 0usize];
        let off = find_value(DOC, &p).unwrap();
        assert_eq!(&DOC[off..off + 3], "\"q\"");
        assert_eq!(line_col(DOC, off).0, 6);
        assert_eq!(path_at(DOC, off + 1), p);
        let v: Value = serde_json::from_str(DOC).unwrap();
        assert_eq!(
            describe(&p, Some(&v)),
            "routine \"f\", statement 1 (in block \"blk\")"
        );
        assert_eq!(
            describe(&json_path!["tensors", 0usize, "dims"], Some(&v)),
            "tensor \"x\""
        );
        assert_eq!(
            describe(&json_path!["run", 0usize, "steps", 1usize], None),
            "run step 1.2"
        );
    }

    #[test]
    fn offsets_round_trip() {
        let off = offset_of(DOC, 2, 3);
        assert_eq!(line_col(DOC, off), (2, 3));
    }
}
