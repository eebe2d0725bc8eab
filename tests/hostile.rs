//! Hostile input: seeded random strings full of C syntax (`*/`, `/*`, `#`, `"`, `\` + newline,
//! `??/` trigraphs), NUL and other control characters, arbitrary Unicode and very long text,
//! used as tensor labels, block comments and routine names.
//!
//! For every seed the same small computation (a fused pointwise chain, an intermediate read by
//! two reductions, and a reduction of a reduction) is compiled with hostile names and with
//! plain ones: it must compile, give bit-identical results, and the generated C must contain
//! nothing the names could have smuggled in (only printable ASCII; no `#` but the one
//! `#include`; no `"`, `\`, `??`, `//`; balanced, non-nested comments). The same holds for
//! program files run by the CLI, whose names and comments are hostile JSON strings.

mod common;

use arrayjit::backend::{CcBackend, Config, MergeBuffer};
use arrayjit::ir::*;
use common::*;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

/// A small linear congruential generator (Knuth's MMIX constants), so that every seed gives
/// the same strings on every platform.
struct Lcg(u64);

impl Lcg {
    fn new(seed: u64) -> Lcg {
        let mut g = Lcg(seed ^ 0x9E37_79B9_7F4A_7C15);
        g.next();
        g
    }
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
    fn below(&mut self, n: usize) -> usize {
        self.next() as usize % n
    }
}

/// Fragments that mean something to C, to the preprocessor, to a shell, to a terminal or to
/// Unicode-unaware code.
const PIECES: &[&str] = &[
    "\0",
    "*/",
    "/*",
    "//",
    "??/",
    "??=",
    "??(",
    "??)",
    "??'",
    "??<",
    "??>",
    "??!",
    "??-",
    "\\\n",
    "\\",
    "\\\r\n",
    "#",
    "##",
    "#include <stdlib.h>\n",
    "#define float int\n",
    "#undef x",
    "\"",
    "'",
    "\n",
    "\r",
    "\t",
    "\u{b}",
    "\u{c}",
    "\u{1b}[2J",
    "%s%n",
    "$(touch pwned)",
    "`id`",
    ";",
    "{",
    "}",
    "(",
    ")",
    "*",
    "/",
    "?",
    "int",
    "return 1;",
    "exp",
    "y0",
    "main",
    "_",
    "__",
    "0",
    "9",
    "x",
    "\u{202e}",
    "\u{feff}",
    "\u{2028}",
    "\u{85}",
    "\u{7f}",
    "é",
    "😀",
    "\u{fffd}",
    "\u{10ffff}",
];

/// A random hostile string: up to 12 pieces, some random code points; one in eight is very
/// long.
fn hostile(g: &mut Lcg) -> String {
    let mut s = String::new();
    for _ in 0..g.below(13) {
        match g.below(4) {
            0 => {
                // Any code point (surrogates are skipped by `from_u32`).
                if let Some(c) = char::from_u32(g.next() % 0x11_0000) {
                    s.push(c);
                }
            }
            1 => {
                // A Latin-1 or control character.
                if let Some(c) = char::from_u32(g.next() % 0x100) {
                    s.push(c);
                }
            }
            _ => s.push_str(PIECES[g.below(PIECES.len())]),
        }
    }
    if g.below(8) == 0 {
        let piece = PIECES[g.below(PIECES.len())];
        let times = 1000 + g.below(5000);
        s.push_str(&piece.repeat(times));
    }
    s
}

/// A label of one to three hostile parts.
fn hostile_label(g: &mut Lcg) -> Vec<String> {
    (0..1 + g.below(3)).map(|_| hostile(g)).collect()
}

/// The names used in one computation.
struct Names {
    /// Labels of a, b, t1, t2, t3, s, mx, total.
    labels: Vec<Vec<String>>,
    comments: [String; 2],
    routine: String,
}

impl Names {
    fn plain() -> Names {
        Names {
            labels: ["a", "b", "t1", "t2", "t3", "s", "mx", "total"]
                .iter()
                .map(|l| vec![l.to_string()])
                .collect(),
            comments: ["chain".into(), "reductions".into()],
            routine: "plain".into(),
        }
    }
    fn hostile(seed: u64) -> Names {
        let mut g = Lcg::new(seed);
        Names {
            labels: (0..8).map(|_| hostile_label(&mut g)).collect(),
            comments: [hostile(&mut g), hostile(&mut g)],
            routine: hostile(&mut g),
        }
    }
}

const ROWS: usize = 4;
const COLS: usize = 8;

fn a_values() -> Vec<f64> {
    (0..ROWS * COLS)
        .map(|i| (i as f64 - 13.0) * 0.375)
        .collect()
}

fn b_values() -> Vec<f64> {
    (0..COLS).map(|j| 1.5 - j as f64 * 0.5).collect()
}

/// t1 = a * b (broadcast), t2 = t1 + a, t3 = relu(t2) (a fused chain); s = row sums of t3,
/// mx = row maxima of t3 (t3 is read by both); total = sum of s. Returns the code and the
/// outputs s, mx, total.
fn computation(n: &Names) -> (Assignments, Vec<Tnode>) {
    let b = Bindings::empty();
    let l = |i: usize| -> Vec<&str> { n.labels[i].iter().map(String::as_str).collect() };
    let with_values = |i: usize, dims: &[usize], v: Vec<f64>| {
        Tnode::with_init(
            &l(i),
            dims,
            Prec::Single,
            &InitOp::ConstantFill {
                values: v,
                strict: true,
            },
        )
        .unwrap()
    };
    let node = |i: usize, dims: &[usize]| Tnode::new(&l(i), dims, Prec::Single).unwrap();
    let hosted = |i: usize, dims: &[usize]| Tnode::hosted(&l(i), dims, Prec::Single).unwrap();
    let a = with_values(0, &[ROWS, COLS], a_values());
    let bb = with_values(1, &[COLS], b_values());
    let t1 = node(2, &[ROWS, COLS]);
    let t2 = node(3, &[ROWS, COLS]);
    let t3 = node(4, &[ROWS, COLS]);
    let s = hosted(5, &[ROWS]);
    let mx = hosted(6, &[ROWS]);
    let total = hosted(7, &[1]);
    let code = Assignments::seq([
        Assignments::block(
            &n.comments[0],
            Assignments::seq([
                binop(&t1, Binop::Arg2, false, Binop::Mul, &a, &bb, "ij,j->ij", &b),
                binop(
                    &t2,
                    Binop::Arg2,
                    false,
                    Binop::Add,
                    &t1,
                    &a,
                    "ij,ij->ij",
                    &b,
                ),
                unop(&t3, Binop::Arg2, false, Unop::Relu, &t2, "ij->ij", &b),
            ]),
        ),
        Assignments::block(
            &n.comments[1],
            Assignments::seq([
                unop(&s, Binop::Add, true, Unop::Identity, &t3, "ij->i", &b),
                unop(&mx, Binop::Max, true, Unop::Identity, &t3, "ij->i", &b),
                unop(&total, Binop::Add, true, Unop::Identity, &s, "i->0", &b),
            ]),
        ),
    ]);
    (code, vec![s, mx, total])
}

/// The expected outputs, computed here in `f32` like the generated code.
fn expected() -> Vec<Vec<f64>> {
    let (a, b) = (a_values(), b_values());
    let t3: Vec<f32> = (0..ROWS * COLS)
        .map(|k| {
            let (x, y) = (a[k] as f32, b[k % COLS] as f32);
            (x * y + x).max(0.0)
        })
        .collect();
    let s: Vec<f32> = t3.chunks(COLS).map(|r| r.iter().sum()).collect();
    let mx: Vec<f32> = t3
        .chunks(COLS)
        .map(|r| r.iter().copied().fold(f32::NEG_INFINITY, f32::max))
        .collect();
    let total: f32 = s.iter().sum();
    [s, mx, vec![total]]
        .iter()
        .map(|v| v.iter().map(|&x| x as f64).collect())
        .collect()
}

/// Checks that generated C holds nothing a hostile name could have smuggled in: printable
/// ASCII only, one `#` (the `#include`), no `"`, `\`, `??` or `//` on any other line, and
/// comments that open and close on their line without nesting.
fn check_c(src: &str, what: &str) {
    let bad = src
        .char_indices()
        .find(|(_, c)| !(*c == '\n' || (' '..='~').contains(c)));
    assert!(
        bad.is_none(),
        "{what}: character {:?} at byte {} is not printable ASCII",
        bad.map(|b| b.1),
        bad.map(|b| b.0).unwrap_or(0)
    );
    // Our own directives only: the #include, and the #define that asks for the vector
    // math when the code calls it.
    let directives: Vec<&str> = src.lines().filter(|l| l.contains('#')).collect();
    assert!(
        directives
            .iter()
            .all(|l| *l == "#include \"arrayjit.h\"" || *l == "#define AJ_VMATH 1"),
        "{what}: unexpected directives {directives:?}"
    );
    assert_eq!(
        src.matches('#').count(),
        directives.len(),
        "{what}: one '#' per directive"
    );
    for (i, line) in src.lines().enumerate() {
        if line == "#include \"arrayjit.h\"" || line == "#define AJ_VMATH 1" {
            continue;
        }
        for needle in ["#", "\"", "\\", "??", "//"] {
            assert!(
                !line.contains(needle),
                "{what}: line {} contains {needle:?}: {line}",
                i + 1
            );
        }
        // Every comment opens and closes on its line and holds no other comment marker.
        let mut rest = line;
        loop {
            let open = rest.find("/*");
            let close = rest.find("*/");
            match (open, close) {
                (None, None) => break,
                (Some(o), Some(c)) if o < c => {
                    let body = &rest[o + 2..c];
                    assert!(
                        !body.contains("/*"),
                        "{what}: line {}: nested comment: {line}",
                        i + 1
                    );
                    rest = &rest[c + 2..];
                }
                _ => panic!("{what}: line {}: unbalanced comment: {line}", i + 1),
            }
        }
    }
}

/// Compiles the computation as one routine named `n.routine`, runs it once and returns the
/// outputs and the C source.
fn compile_and_run(n: &Names) -> (Vec<Vec<f64>>, String) {
    let (code, outs) = computation(n);
    let be = CcBackend::new();
    let (r, src) = build(&be, &n.routine, &Bindings::empty(), &code)
        .unwrap_or_else(|e| panic!("routine {:?} does not compile: {e}", n.routine));
    let refs: Vec<&Tnode> = outs.iter().collect();
    (run_and_read(&be, &r, &refs), src)
}

#[test]
fn hostile_names_compile_to_the_same_results_and_clean_c() {
    let (want, plain_src) = compile_and_run(&Names::plain());
    for (got, w) in want.iter().zip(expected()) {
        assert_close(Prec::Single, got, &w, "plain names");
    }
    check_c(&plain_src, "plain names");
    // The intermediates of the chain are inlined, t3 (read by two reductions) is not.
    let seeds: Vec<u64> = (0..50).collect();
    let threads = 4;
    std::thread::scope(|scope| {
        for chunk in seeds.chunks(seeds.len().div_ceil(threads)) {
            let (want, plain_src) = (&want, &plain_src);
            scope.spawn(move || {
                for &seed in chunk {
                    let names = Names::hostile(seed);
                    let (got, src) = compile_and_run(&names);
                    assert_eq!(&got, want, "seed {seed}: results differ from plain names");
                    check_c(&src, &format!("seed {seed}"));
                    // Same program apart from names and comments: the same number of lines
                    // of code.
                    assert_eq!(
                        src.lines().count(),
                        plain_src.lines().count(),
                        "seed {seed}:\n{src}"
                    );
                }
            });
        }
    });
}

#[test]
fn hostile_routine_names_in_one_batch_stay_distinct() {
    // Hostile names in one file, including names whose identifiers sanitize or truncate
    // alike.
    let mut g = Lcg::new(4242);
    let long = "x".repeat(100);
    let mut names: Vec<String> = vec![
        "a/b".into(),
        "a?b".into(),
        "A b".into(),
        long.clone(),
        format!("{long}y"),
    ];
    names.extend(distinct_names(&mut g, 8));
    let be = CcBackend::new();
    be.initialize(Config::default());
    let b = Bindings::empty();
    // Routine k: out_k = x * k.
    let x = input("x", &[3], Prec::Double, &[1., 2., 3.]);
    let outs: Vec<Tnode> = (0..names.len())
        .map(|k| output(&names[k], &[3], Prec::Double))
        .collect();
    let code: Vec<Assignments> = outs
        .iter()
        .enumerate()
        .map(|(k, o)| {
            let kk = temp(&names[k], &[1], Prec::Double);
            Assignments::block(
                &names[k],
                Assignments::seq([
                    Assignments::Fetch {
                        array: kk.clone(),
                        fetch_op: FetchOp::Constant(k as f64),
                    },
                    binop(o, Binop::Arg2, false, Binop::Mul, &x, &kk, "i,0->i", &b),
                ]),
            )
        })
        .collect();
    let batch = be
        .compile_batch(true, Some(&names), None, &b, &code)
        .unwrap();
    check_c(batch.source(), "batch");
    assert_eq!(
        batch.names(),
        names.iter().map(|n| Some(n.as_str())).collect::<Vec<_>>()
    );
    let ctx = be.init("batch").unwrap();
    let (ctx, routines) = be
        .link_batch(&[], &MergeBuffer::new(), &ctx, &batch)
        .unwrap();
    be.from_host(&ctx, &x).unwrap();
    for (k, r) in routines.iter().enumerate() {
        let r = r.as_ref().unwrap();
        assert_eq!(r.name(), names[k]);
        r.run().unwrap();
    }
    for (k, o) in outs.iter().enumerate() {
        be.to_host(&ctx, o).unwrap();
        let kf = k as f64;
        assert_eq!(
            o.host_values().unwrap(),
            vec![kf, 2. * kf, 3. * kf],
            "routine {:?}",
            names[k]
        );
    }
}

/// Regression: comments used to keep `"` (seeds 1, 26 and 41 put one there).
#[test]
fn comments_hold_no_quotes() {
    for seed in [1u64, 26, 41] {
        let (code, _) = computation(&Names::hostile(seed));
        let src = CcBackend::new()
            .generate_batch_source(None, &Bindings::empty(), &[code])
            .unwrap();
        for (i, line) in src.lines().enumerate() {
            if line != "#include \"arrayjit.h\"" {
                assert!(!line.contains('"'), "seed {seed} line {}: {line}", i + 1);
            }
        }
    }
}

/// Regression: routines whose names sanitize alike used to get the same debug dump names, and
/// the batch failed to compile even without a debug directory.
#[test]
fn routine_names_that_sanitize_alike_compile_in_one_batch() {
    let long = "x".repeat(100);
    let names: Vec<String> = ["a/b", "a?b", "", "\u{202e}", &long, &format!("{long}y")]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let be = CcBackend::new();
    be.initialize(Config::default());
    let b = Bindings::empty();
    let x = input("x", &[2], Prec::Double, &[1., 2.]);
    let outs: Vec<Tnode> = (0..names.len())
        .map(|k| output(&format!("o{k}"), &[2], Prec::Double))
        .collect();
    let code: Vec<Assignments> = outs
        .iter()
        .map(|o| unop(o, Binop::Arg2, false, Unop::Neg, &x, "i->i", &b))
        .collect();
    let batch = be
        .compile_batch(true, Some(&names), None, &b, &code)
        .unwrap();
    let ctx = be.init("dup").unwrap();
    let (ctx, routines) = be
        .link_batch(&[], &MergeBuffer::new(), &ctx, &batch)
        .unwrap();
    be.from_host(&ctx, &x).unwrap();
    for (r, o) in routines.iter().zip(&outs) {
        r.as_ref().unwrap().run().unwrap();
        be.to_host(&ctx, o).unwrap();
        assert_eq!(o.host_values().unwrap(), vec![-1., -2.]);
    }
}

/// Regression: a label `M_PI` given node number 2 used to become the identifier `M_PI_2`, a
/// macro of `<math.h>` that expands to a number.
#[test]
fn labels_that_spell_math_macros_compile() {
    // M_PI_2, M_PI_4 and M_SQRT1_2 are macros of <math.h> under -std=gnu11; the generated
    // identifiers LABEL_N must never be one of them.
    let b = Bindings::empty();
    for (label, position) in [("M_PI", 2), ("M_PI", 4), ("M_SQRT1", 2)] {
        // `position - 1` plain nodes first, so that the labelled node is named N = position.
        let x = input("x", &[2], Prec::Single, &[1., 2.]);
        let mut prev = x.clone();
        let mut code = vec![];
        for i in 2..position {
            let t = output(&format!("p{i}"), &[2], Prec::Single);
            code.push(unop(&t, Binop::Arg2, false, Unop::Neg, &prev, "i->i", &b));
            prev = t;
        }
        let y = output(label, &[2], Prec::Single);
        code.push(binop(
            &y,
            Binop::Arg2,
            false,
            Binop::Add,
            &prev,
            &prev,
            "i,i->i",
            &b,
        ));
        let want: Vec<f64> = [1., 2.]
            .iter()
            .map(|v: &f64| if position % 2 == 0 { 2. * v } else { -2. * v })
            .collect();
        let (got, src) = compute(&Assignments::seq(code), &b, &[&y]);
        // Identifiers are lower case, so they cannot spell the macro.
        let ident = format!("{}_{position}", label.to_lowercase());
        assert!(src.contains(&ident), "{src}");
        assert_eq!(got[0], want, "{label} at {position}");
    }
}

// ---------------------------------------------------------------------------------------------
// Program files with hostile names, run by the CLI.

/// `n` distinct, non-empty hostile strings (the CLI requires unique, non-empty names).
fn distinct_names(g: &mut Lcg, n: usize) -> Vec<String> {
    let mut out: Vec<String> = vec![];
    while out.len() < n {
        let s = hostile(g);
        if !s.is_empty() && !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// A program in the style of the examples: a fused chain and reductions, over two routines
/// (so tensors persist between them), with a block comment; every name is given by `t`
/// (tensors x, w, h, y, s, total), `r` (routines) and `c` (comments).
fn program(t: &[String], r: &[String], c: &[String]) -> Value {
    json!({
        "tensors": [
            {"name": t[0], "dims": [3, 4], "init": "range"},
            {"name": t[1], "dims": [4], "init": {"values": [0.5, -1, 2, 0.25]}},
            {"name": t[2], "dims": [3, 4]},
            {"name": t[3], "dims": [3, 4]},
            {"name": t[4], "dims": [3]},
            {"name": t[5], "dims": [1], "prec": "double"}
        ],
        "routines": [
            {"name": r[0], "code": [
                {"comment": c[0], "code": [
                    {"assign": t[2], "op": "mul", "args": [t[0], t[1]], "logic": "ij,j->ij"},
                    {"assign": t[3], "op": "relu", "args": [t[2]]}
                ]}
            ]},
            {"name": r[1], "code": [
                {"comment": c[1], "code": [
                    {"assign": t[4], "accum": "add", "init_neutral": true, "op": "identity",
                     "args": [t[3]], "logic": "ij->i"},
                    {"assign": t[5], "accum": "add", "init_neutral": true, "op": "identity",
                     "args": [t[4]], "logic": "i->0"}
                ]}
            ]}
        ],
        "run": [{"routine": r[0]}, {"repeat": 2, "steps": [{"routine": r[1]}]}],
        "print": [t[3], t[4], t[5]]
    })
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn arrayjit(args: &[&str], env: &[(&str, &Path)]) -> Out {
    let o = Command::new(env!("CARGO_BIN_EXE_arrayjit"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v.as_os_str())))
        .output()
        .expect("the arrayjit binary runs");
    Out {
        code: o.status.code().expect("exited normally, not by a signal"),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// The printed tensors as (name, dims, values), in order.
fn printed(stdout: &str) -> Vec<(String, Value, Value)> {
    let v: Value = serde_json::from_str(stdout)
        .unwrap_or_else(|e| panic!("not one JSON object ({e}):\n{stdout}"));
    // serde_json's Map keeps keys sorted unless `preserve_order` is on, so read the order
    // from the text: one tensor per line.
    let obj = v.as_object().unwrap();
    let mut out = vec![];
    for line in stdout.lines().filter(|l| l.starts_with("  ")) {
        let entry: Value =
            serde_json::from_str(&format!("{{{}}}", line.trim().trim_end_matches(',')))
                .unwrap_or_else(|e| panic!("line is not a member ({e}): {line}"));
        let (name, t) = entry.as_object().unwrap().iter().next().unwrap();
        assert_eq!(&obj[name], t);
        out.push((name.clone(), t["dims"].clone(), t["values"].clone()));
    }
    assert_eq!(out.len(), obj.len(), "{stdout}");
    out
}

#[test]
fn hostile_program_files_run_and_print_the_same_values() {
    let dir = tempfile::tempdir().unwrap();
    let plain_t: Vec<String> = ["x", "w", "h", "y", "s", "total"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let plain_r = vec!["layer".to_string(), "sums".to_string()];
    let plain_c = vec!["chain".to_string(), "reductions".to_string()];
    let plain = dir.path().join("plain.json");
    std::fs::write(&plain, program(&plain_t, &plain_r, &plain_c).to_string()).unwrap();
    let out = arrayjit(&["run", plain.to_str().unwrap()], &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let want = printed(&out.stdout);
    assert_eq!(want.len(), 3);
    let plain_c_src = arrayjit(&["emit-c", plain.to_str().unwrap()], &[]);
    assert_eq!(plain_c_src.code, 0, "{}", plain_c_src.stderr);

    for seed in 0..8u64 {
        let mut g = Lcg::new(1000 + seed);
        let t = distinct_names(&mut g, 6);
        let r = distinct_names(&mut g, 2);
        let c = vec![hostile(&mut g), hostile(&mut g)];
        let file = dir.path().join(format!("hostile{seed}.json"));
        std::fs::write(&file, program(&t, &r, &c).to_string()).unwrap();
        let f = file.to_str().unwrap();
        // With a debug directory, so the names also reach file names.
        let debug = dir.path().join(format!("debug{seed}"));
        for interpret in [false, true] {
            let mut args = vec!["run", f];
            if interpret {
                args.insert(1, "--interpret");
            }
            let out = arrayjit(&args, &[("ARRAYJIT_DEBUG_DIR", &debug)]);
            assert_eq!(out.code, 0, "seed {seed} {args:?}: {}", out.stderr);
            let got = printed(&out.stdout);
            let names: Vec<&String> = got.iter().map(|g| &g.0).collect();
            assert_eq!(names, vec![&t[3], &t[4], &t[5]], "seed {seed}");
            for (g, w) in got.iter().zip(&want) {
                assert_eq!((&g.1, &g.2), (&w.1, &w.2), "seed {seed} {args:?}");
            }
            // The table format prints the names without raw control characters.
            args.insert(1, "--format=table");
            let out = arrayjit(&args, &[("ARRAYJIT_DEBUG_DIR", &debug)]);
            assert_eq!(out.code, 0, "seed {seed} {args:?}: {}", out.stderr);
            assert!(
                !out.stdout.chars().any(|ch| ch.is_control() && ch != '\n'),
                "seed {seed}: control character in the table:\n{:?}",
                out.stdout
            );
            let headers = out
                .stdout
                .lines()
                .filter(|l| l.contains(": dims ["))
                .count();
            assert_eq!(headers, 3, "seed {seed}:\n{}", out.stdout);
        }
        // The debug directory holds only plain files, all directly inside it.
        for e in std::fs::read_dir(&debug).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            assert!(e.file_type().unwrap().is_file(), "{name}");
            assert!(
                name.chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || "_.-".contains(ch)),
                "seed {seed}: debug file name {name:?}"
            );
        }
        let outside: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.ends_with(".json") && !n.starts_with("debug"))
            .collect();
        assert!(outside.is_empty(), "seed {seed}: {outside:?}");
        // The C: clean, and the same code as with plain names.
        let src = arrayjit(&["emit-c", f], &[]);
        assert_eq!(src.code, 0, "seed {seed}: {}", src.stderr);
        check_c(&src.stdout, &format!("CLI seed {seed}"));
        assert_eq!(
            src.stdout.lines().count(),
            plain_c_src.stdout.lines().count(),
            "seed {seed}:\n{}",
            src.stdout
        );
    }
}

#[test]
fn hostile_names_in_errors_are_quoted() {
    // An error about a hostile name shows it escaped, on one line.
    let dir = tempfile::tempdir().unwrap();
    let mut g = Lcg::new(77);
    let names = distinct_names(&mut g, 3);
    let bad = format!("{}\n\u{1b}[2Jnot declared", names[2]);
    let prog = json!({
        "tensors": [{"name": names[0], "dims": [2]}, {"name": names[1], "dims": [2]}],
        "routines": [{"name": names[2], "code": [
            {"assign": names[1], "op": "relu", "args": [bad]}
        ]}]
    });
    let f = dir.path().join("bad.json");
    std::fs::write(&f, prog.to_string()).unwrap();
    let out = arrayjit(&["run", f.to_str().unwrap()], &[]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.starts_with("error: "), "{}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "{:?}", out.stderr);
    assert!(!out.stderr.contains('\u{1b}'), "{:?}", out.stderr);
    assert!(
        out.stderr.contains(&serde_json::to_string(&bad).unwrap()),
        "{:?}",
        out.stderr
    );
}
