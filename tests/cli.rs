//! End-to-end tests of the `arrayjit` binary: example programs and small programs written to
//! temporary files are run, and the printed JSON is compared with values computed here by
//! plain Rust loops (never by the library).

use half::f16;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn arrayjit(args: &[&str]) -> Out {
    let o = Command::new(env!("CARGO_BIN_EXE_arrayjit"))
        .args(args)
        .output()
        .expect("the arrayjit binary runs");
    Out {
        code: o.status.code().expect("exited normally, not by a signal"),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/programs")
        .join(name)
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// Runs `arrayjit run FILE`, expects success and one JSON object on stdout.
fn run_ok(file: &Path) -> (Value, String) {
    let out = arrayjit(&["run", path_str(file)]);
    assert_eq!(
        out.code,
        0,
        "arrayjit run {} failed:\n{}",
        file.display(),
        out.stderr
    );
    let v: Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON value ({e}):\n{}", out.stdout));
    assert!(v.is_object(), "{}", out.stdout);
    (v, out.stdout)
}

/// Runs `arrayjit run FILE` and expects exit code 1 with `error: ` on stderr.
fn run_err(file: &Path) -> String {
    let out = arrayjit(&["run", path_str(file)]);
    assert_eq!(
        out.code, 1,
        "expected an error, got code {} stdout {} stderr {}",
        out.code, out.stdout, out.stderr
    );
    assert!(out.stderr.starts_with("error: "), "{}", out.stderr);
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    assert!(out.stdout.is_empty(), "{}", out.stdout);
    out.stderr
}

struct Prog {
    dir: tempfile::TempDir,
}

impl Prog {
    fn new() -> Prog {
        Prog {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

fn num(v: &Value) -> f64 {
    match v {
        Value::Number(n) => n.as_f64().unwrap(),
        Value::String(s) => match s.as_str() {
            "inf" => f64::INFINITY,
            "-inf" => f64::NEG_INFINITY,
            "nan" => f64::NAN,
            other => panic!("unexpected string value {other:?}"),
        },
        other => panic!("unexpected value {other}"),
    }
}

/// The dims, precision and values of a printed tensor.
fn tensor(out: &Value, name: &str) -> (Vec<usize>, String, Vec<f64>) {
    let t = &out[name];
    assert!(t.is_object(), "{name} not printed in {out}");
    let dims = t["dims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    let prec = t["prec"].as_str().unwrap().to_string();
    let values = t["values"].as_array().unwrap().iter().map(num).collect();
    (dims, prec, values)
}

fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "got {got:?}, want {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= tol * (1.0 + w.abs());
        assert!(ok, "cell {i}: got {g}, want {w} (all: {got:?} vs {want:?})");
    }
}

/// Row-major matrix product of `a` (n x k) and `b` (k x m), in f32 like the generated code.
fn matmul(a: &[f32], b: &[f32], n: usize, k: usize, m: usize) -> Vec<f32> {
    let mut c = vec![0f32; n * m];
    for i in 0..n {
        for j in 0..m {
            let mut s = 0f32;
            for l in 0..k {
                s += a[i * k + l] * b[l * m + j];
            }
            c[i * m + j] = s;
        }
    }
    c
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// Single values print as the shortest decimal that reads back as the same `f32`.
fn as_f32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

fn range(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32).collect()
}

// ---------------------------------------------------------------------------------------------
// The example programs.

#[test]
fn example_matmul() {
    let (out, _) = run_ok(&example("matmul.json"));
    let a = [1., 2., 3., -1., 0.5, 4.];
    let c = matmul(&a, &range(12), 2, 3, 4);
    let (dims, prec, values) = tensor(&out, "c");
    assert_eq!(dims, vec![2, 4]);
    assert_eq!(prec, "single");
    assert_close(&values, &f64s(&c), 1e-6);
}

#[test]
fn example_fused_chain() {
    let (out, _) = run_ok(&example("fused_chain.json"));
    let a = [1f32, -2., 3., -4., 5., -6.];
    let want: Vec<f64> = (0..6)
        .map(|i| {
            let b = if i % 2 == 0 { 0.5 } else { 1.5 };
            let r = (a[i] * b + i as f32).max(0.0);
            (r * 2.0 - 1.0) as f64
        })
        .collect();
    assert_eq!(out.as_object().unwrap().len(), 1, "{out}");
    let (dims, _, values) = tensor(&out, "out");
    assert_eq!(dims, vec![2, 3]);
    assert_close(&values, &want, 1e-6);
    // The intermediates are not printed, so they are inlined: one loop nest, no buffers.
    let c = arrayjit(&["emit-c", path_str(&example("fused_chain.json"))]);
    assert_eq!(c.code, 0, "{}", c.stderr);
    for intermediate in ["ab_", "abc_", "r2_", "two_"] {
        assert!(!c.stdout.contains(intermediate), "{}", c.stdout);
    }
}

#[test]
fn example_reduction() {
    let (out, _) = run_ok(&example("reduction.json"));
    let m = range(12);
    let rows: Vec<f64> = (0..3)
        .map(|i| (0..4).map(|j| m[i * 4 + j] as f64).sum())
        .collect();
    let total: f64 = m.iter().map(|&x| x as f64).sum();
    let (dims, _, values) = tensor(&out, "row_sums");
    assert_eq!(dims, vec![3]);
    assert_close(&values, &rows, 1e-6);
    let (dims, _, values) = tensor(&out, "total");
    assert_eq!(dims, vec![1]);
    assert_close(&values, &[total], 1e-6);
}

#[test]
fn example_slice() {
    let (out, _) = run_ok(&example("slice.json"));
    // Steps: b = 0, 1, 2, then b = 1 twice more.
    let batch = range(12);
    let want: Vec<f64> = (0..4)
        .map(|c| {
            [0usize, 1, 2, 1, 1]
                .iter()
                .map(|&b| batch[b * 4 + c] as f64)
                .sum()
        })
        .collect();
    let (dims, _, values) = tensor(&out, "acc");
    assert_eq!(dims, vec![2, 2]);
    assert_close(&values, &want, 1e-6);
}

#[test]
fn example_mlp_layer() {
    let (out, _) = run_ok(&example("mlp_layer.json"));
    let x = [1f32, 0., -1., 0.5, 2., 1., -2., 1., 0., 3., -1., 2.];
    let w = [0.5f32, -1., 1., 0.25, -0.5, 2.];
    let b = [0.1f32, -3.];
    let h = matmul(&x, &w, 4, 3, 2);
    let want: Vec<f64> = (0..8).map(|i| (h[i] + b[i % 2]).max(0.0) as f64).collect();
    let (dims, _, values) = tensor(&out, "y");
    assert_eq!(dims, vec![4, 2]);
    assert_close(&values, &want, 1e-6);
}

#[test]
fn example_format_example() {
    let (out, _) = run_ok(&example("format_example.json"));
    let x = [0.5f32, -1., 2., 3., 1., 1., 0., 2.];
    let y: Vec<f32> = matmul(&x, &range(6), 4, 2, 3)
        .into_iter()
        .map(|v| v.max(0.0))
        .collect();
    let s: Vec<f64> = (0..4)
        .map(|i| (0..3).map(|j| y[i * 3 + j]).sum::<f32>() as f64)
        .collect();
    let keys: Vec<&String> = out.as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 2);
    let (dims, prec, values) = tensor(&out, "y");
    assert_eq!((dims, prec.as_str()), (vec![4, 3], "single"));
    assert_close(&values, &f64s(&y), 1e-6);
    let (dims, _, values) = tensor(&out, "s");
    assert_eq!(dims, vec![4]);
    assert_close(&values, &s, 1e-6);
}

#[test]
fn output_keeps_print_order() {
    let (_, text) = run_ok(&example("format_example.json"));
    let y = text.find("\"y\"").unwrap();
    let s = text.find("\"s\"").unwrap();
    assert!(y < s, "{text}");
}

// ---------------------------------------------------------------------------------------------
// Inits.

#[test]
fn init_values_strict_cyclic_and_range() {
    let p = Prog::new();
    let f = p.write(
        "p.json",
        r#"{
  "tensors": [
    {"name": "a", "dims": [2, 2], "init": {"values": [1.5, -2, 3, 4], "strict": true}},
    {"name": "b", "dims": [5], "init": {"values": [1, 2], "strict": false}},
    {"name": "r", "dims": [2, 3, 2], "prec": "double", "init": "range"},
    {"name": "z", "dims": [3], "init": "zeros"},
    {"name": "b2", "dims": [5]}
  ],
  "routines": [{"name": "double_b", "code": [
    {"assign": "b2", "op": "add", "args": ["b", "b"]}
  ]}],
  "run": [{"routine": "double_b"}],
  "print": ["a", "b", "r", "z", "b2"]
}"#,
    );
    let (out, _) = run_ok(&f);
    assert_eq!(tensor(&out, "a").2, vec![1.5, -2., 3., 4.]);
    assert_eq!(tensor(&out, "b").2, vec![1., 2., 1., 2., 1.]);
    let (dims, prec, values) = tensor(&out, "r");
    assert_eq!((dims, prec.as_str()), (vec![2, 3, 2], "double"));
    assert_eq!(values, (0..12).map(|i| i as f64).collect::<Vec<_>>());
    assert_eq!(tensor(&out, "z").2, vec![0.; 3]);
    assert_eq!(tensor(&out, "b2").2, vec![2., 4., 2., 4., 2.]);

    // Strict values with the wrong count are an error naming the tensor.
    let bad = p.write(
        "bad.json",
        r#"{"tensors": [{"name": "a", "dims": [3], "init": {"values": [1, 2]}}]}"#,
    );
    let e = run_err(&bad);
    assert!(e.contains("tensor \"a\"") && e.contains("3"), "{e}");
}

#[test]
fn init_uniform_is_reproducible() {
    let p = Prog::new();
    let prog = |seed: u64| {
        format!(
            r#"{{"tensors": [
                {{"name": "u", "dims": [4, 8], "prec": "double", "init": {{"uniform": {{"seed": {seed}}}}}}},
                {{"name": "v", "dims": [16], "init": {{"uniform": {{"seed": {seed}}}}}}}
              ],
              "print": ["u", "v"]}}"#
        )
    };
    let a = run_ok(&p.write("a.json", &prog(7))).0;
    let b = run_ok(&p.write("b.json", &prog(7))).0;
    let c = run_ok(&p.write("c.json", &prog(8))).0;
    let (ua, ub, uc) = (tensor(&a, "u").2, tensor(&b, "u").2, tensor(&c, "u").2);
    assert_eq!(ua.len(), 32);
    assert_eq!(ua, ub, "same seed, same values");
    assert_ne!(ua, uc, "another seed, other values");
    let va = tensor(&a, "v").2;
    for x in ua.iter().chain(&va).chain(&uc) {
        assert!((0.0..1.0).contains(x), "{x} not in [0, 1)");
    }
    let mean = ua.iter().sum::<f64>() / ua.len() as f64;
    assert!((0.2..0.8).contains(&mean), "mean {mean}");
    assert!(ua.windows(2).any(|w| w[0] != w[1]));
}

#[test]
fn init_file_relative_to_program() {
    let p = Prog::new();
    let data: Vec<f32> = vec![0.25, -1.5, 3.0, 1e-3, 7.0, -0.0];
    let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_ne_bytes()).collect();
    std::fs::create_dir(p.dir.path().join("data")).unwrap();
    std::fs::write(p.dir.path().join("data/x.bin"), bytes).unwrap();
    let f = p.write(
        "p.json",
        r#"{"tensors": [
             {"name": "x", "dims": [2, 3], "init": {"file": "data/x.bin"}},
             {"name": "y", "dims": [2, 3]}
           ],
           "routines": [{"name": "twice", "code": [{"assign": "y", "op": "add", "args": ["x", "x"]}]}],
           "run": [{"routine": "twice"}],
           "print": ["x", "y"]}"#,
    );
    // Run from another working directory: the path is relative to the program file.
    let out = Command::new(env!("CARGO_BIN_EXE_arrayjit"))
        .args(["run", path_str(&f)])
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(as_f32(&tensor(&v, "x").2), data);
    let twice: Vec<f32> = data.iter().map(|x| x + x).collect();
    assert_eq!(as_f32(&tensor(&v, "y").2), twice);

    // A file of the wrong size is an error naming the tensor.
    let g = p.write(
        "q.json",
        r#"{"tensors": [{"name": "x", "dims": [7], "init": {"file": "data/x.bin"}}], "print": ["x"]}"#,
    );
    let e = run_err(&g);
    assert!(e.contains("tensor \"x\"") && e.contains("bytes"), "{e}");
    let h = p.write(
        "r.json",
        r#"{"tensors": [{"name": "x", "dims": [6], "init": {"file": "missing.bin"}}]}"#,
    );
    let e = run_err(&h);
    assert!(e.contains("missing.bin"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// Precisions and number formatting.

#[test]
fn byte_values_are_integers_and_wrap() {
    let p = Prog::new();
    let f = p.write(
        "p.json",
        r#"{"tensors": [
             {"name": "x", "dims": [4], "prec": "byte", "init": {"values": [1, 200, 3.7, 0]}},
             {"name": "y", "dims": [4], "prec": "byte"}
           ],
           "routines": [{"name": "r", "code": [{"assign": "y", "op": "add", "args": ["x", "x"]}]}],
           "run": [{"routine": "r"}],
           "print": ["x", "y"]}"#,
    );
    let (out, text) = run_ok(&f);
    let (_, prec, _) = tensor(&out, "x");
    assert_eq!(prec, "byte");
    let ints = |name: &str| -> Vec<u64> {
        out[name]["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().expect("byte values print as integers"))
            .collect()
    };
    assert_eq!(ints("x"), vec![1, 200, 3, 0]);
    // 200 + 200 = 400, stored modulo 256.
    assert_eq!(ints("y"), vec![2, 144, 6, 0]);
    assert!(!text.contains('.'), "{text}");
}

#[test]
fn half_values_print_shortest_round_trip() {
    let p = Prog::new();
    let f = p.write(
        "p.json",
        r#"{"tensors": [
             {"name": "x", "dims": [5], "prec": "half",
              "init": {"values": [0.1, 1000.5, -2.5, 65504, 0.3333]}},
             {"name": "three", "dims": [5], "prec": "half", "init": {"values": [3], "strict": false}},
             {"name": "y", "dims": [5], "prec": "half"}
           ],
           "routines": [{"name": "r", "code": [{"assign": "y", "op": "mul", "args": ["x", "three"]}]}],
           "run": [{"routine": "r"}],
           "print": ["x", "y"]}"#,
    );
    let (out, text) = run_ok(&f);
    let xs: Vec<f16> = [0.1, 1000.5, -2.5, 65504.0, 0.3333]
        .iter()
        .map(|&v| f16::from_f64(v))
        .collect();
    let (_, prec, xv) = tensor(&out, "x");
    assert_eq!(prec, "half");
    for (got, want) in xv.iter().zip(&xs) {
        assert_eq!(f16::from_f64(*got).to_bits(), want.to_bits(), "{got}");
    }
    // Shortest decimal that reads back as the same half.
    assert!(
        text.contains("\"values\": [0.1, 1000.5, -2.5, 65500, 0.3333]"),
        "{text}"
    );
    // y = x * 3 computed in float, stored as half (65504 * 3 overflows to inf).
    let yv = tensor(&out, "y").2;
    for (got, x) in yv.iter().zip(&xs) {
        let want = f16::from_f32(x.to_f32() * 3.0);
        if want.is_infinite() {
            assert_eq!(*got, f64::INFINITY);
        } else {
            assert_eq!(f16::from_f64(*got).to_bits(), want.to_bits(), "{got}");
        }
    }
    assert_eq!(yv[3], f64::INFINITY);
}

#[test]
fn single_and_double_values_round_trip() {
    let p = Prog::new();
    let f = p.write(
        "p.json",
        r#"{"tensors": [
             {"name": "a", "dims": [4], "prec": "double", "init": {"values": [0.1, 1e-300, 1e300, -0.0]}},
             {"name": "b", "dims": [4], "prec": "double", "init": {"values": [0.2, 0, 0, 0]}},
             {"name": "c", "dims": [4], "prec": "double"},
             {"name": "s", "dims": [3], "prec": "single", "init": {"values": [0.1, 1e20, 1.5e-7]}}
           ],
           "routines": [{"name": "r", "code": [{"assign": "c", "op": "add", "args": ["a", "b"]}]}],
           "run": [{"routine": "r"}],
           "print": ["c", "s"]}"#,
    );
    let (out, text) = run_ok(&f);
    let c = tensor(&out, "c").2;
    assert_eq!(c[0], 0.1 + 0.2);
    assert_eq!(&c[1..3], &[1e-300, 1e300]);
    assert!(text.contains("0.30000000000000004"), "{text}");
    assert!(text.contains("1e-300") && text.contains("1e300"), "{text}");
    let s = tensor(&out, "s").2;
    assert_eq!(as_f32(&s), vec![0.1f32, 1e20, 1.5e-7]);
    assert!(text.contains("[0.1, 1e20, 1.5e-7]"), "{text}");
}

#[test]
fn non_finite_values_are_strings() {
    let p = Prog::new();
    let f = p.write(
        "p.json",
        r#"{"tensors": [
             {"name": "x", "dims": [4], "init": {"values": ["inf", "-inf", "nan", 1]}},
             {"name": "zero", "dims": [4]},
             {"name": "y", "dims": [4]},
             {"name": "d", "dims": [3], "prec": "double", "init": {"values": [1, -1, 0]}},
             {"name": "dz", "dims": [3], "prec": "double"}
           ],
           "routines": [{"name": "r", "code": [
             {"assign": "y", "op": "div", "args": ["x", "zero"]},
             {"assign": "dz", "op": "div", "args": ["d", "zero"], "logic": "i,0->i"}
           ]}],
           "run": [{"routine": "r"}],
           "print": ["x", "y", "dz"]}"#,
    );
    let (out, text) = run_ok(&f);
    assert_eq!(
        out["x"]["values"],
        serde_json::json!(["inf", "-inf", "nan", 1])
    );
    assert_eq!(
        out["y"]["values"],
        serde_json::json!(["inf", "-inf", "nan", "inf"])
    );
    assert_eq!(
        out["dz"]["values"],
        serde_json::json!(["inf", "-inf", "nan"])
    );
    assert!(!text.contains("NaN") && !text.contains("null"), "{text}");
}

// ---------------------------------------------------------------------------------------------
// Memory modes, routines sharing tensors, run steps.

#[test]
fn memory_field() {
    let p = Prog::new();
    let f = p.write(
        "p.json",
        r#"{"tensors": [
             {"name": "w", "dims": [2, 2], "init": {"values": [1, 2, 3, 4]}, "memory": "on_device"},
             {"name": "x", "dims": [2, 2], "init": "range"},
             {"name": "t", "dims": [2, 2], "memory": "local"},
             {"name": "v", "dims": [2, 2], "memory": "virtual"},
             {"name": "h", "dims": [2, 2], "memory": "hosted"},
             {"name": "y", "dims": [2, 2], "memory": "on_device"}
           ],
           "routines": [{"name": "r", "code": [
             {"assign": "t", "op": "mul", "args": ["w", "x"]},
             {"assign": "v", "op": "add", "args": ["t", "x"]},
             {"assign": "h", "op": "relu", "args": ["v"]},
             {"assign": "y", "op": "sub", "args": ["h", "w"]}
           ]}],
           "run": [{"routine": "r"}],
           "print": ["h", "y", "w"]}"#,
    );
    let (out, _) = run_ok(&f);
    let w = [1., 2., 3., 4.];
    let h: Vec<f64> = (0..4).map(|i| w[i] * i as f64 + i as f64).collect();
    let y: Vec<f64> = (0..4).map(|i| h[i] - w[i]).collect();
    assert_eq!(tensor(&out, "h").2, h);
    assert_eq!(tensor(&out, "y").2, y);
    assert_eq!(tensor(&out, "w").2, w.to_vec());

    // Printing a virtual tensor, or initializing a local one, are errors naming the tensor.
    let g = p.write(
        "g.json",
        r#"{"tensors": [{"name": "v", "dims": [2], "memory": "virtual"}], "print": ["v"]}"#,
    );
    let e = run_err(&g);
    assert!(e.contains("tensor \"v\"") && e.contains("virtual"), "{e}");
    let g = p.write(
        "g2.json",
        r#"{"tensors": [{"name": "l", "dims": [2], "memory": "local", "init": "range"}]}"#,
    );
    let e = run_err(&g);
    assert!(e.contains("tensor \"l\"") && e.contains("local"), "{e}");
    // A bad memory name is a parse error with its position.
    let g = p.write(
        "g3.json",
        "{\"tensors\": [\n  {\"name\": \"l\", \"dims\": [2], \"memory\": \"gpu\"}\n]}",
    );
    let e = run_err(&g);
    assert!(e.contains("g3.json:2:") && e.contains("gpu"), "{e}");
}

#[test]
fn tensors_shared_by_routines_persist() {
    let p = Prog::new();
    let f = p.write(
        "p.json",
        r#"{"tensors": [{"name": "w", "dims": [3]}, {"name": "o", "dims": [3]}],
           "routines": [
             {"name": "init", "code": [{"fetch": "w", "constant": 1.5}]},
             {"name": "step", "code": [
               {"assign": "w", "op": "add", "args": ["w", "w"]},
               {"assign": "o", "op": "identity", "args": ["w"]}
             ]}
           ],
           "run": [{"routine": "init"}, {"repeat": 2, "steps": [{"routine": "step"}]}],
           "print": ["o"]}"#,
    );
    assert_eq!(tensor(&run_ok(&f).0, "o").2, vec![6.; 3]);

    // A tensor forced local cannot be shared: the error names it.
    let g = p.write(
        "g.json",
        r#"{"tensors": [{"name": "t", "dims": [3], "memory": "local"}, {"name": "o", "dims": [3]}],
           "routines": [
             {"name": "a", "code": [{"fetch": "t", "constant": 1}]},
             {"name": "b", "code": [{"assign": "o", "op": "identity", "args": ["t"]}]}
           ]}"#,
    );
    let e = run_err(&g);
    assert!(
        e.contains("tensor \"t\"") && e.contains("\"a\", \"b\""),
        "{e}"
    );
}

#[test]
fn repeat_accumulates() {
    let p = Prog::new();
    let prog = |run: &str| {
        format!(
            r#"{{"tensors": [
                 {{"name": "x", "dims": [2, 3], "init": {{"values": [1, -2, 0.5, 4, 10, 0]}}}},
                 {{"name": "acc", "dims": [2, 3]}}
               ],
               "routines": [{{"name": "step", "code": [
                 {{"assign": "acc", "accum": "add", "op": "identity", "args": ["x"]}}
               ]}}],
               "run": {run},
               "print": ["acc"]}}"#
        )
    };
    let x = [1., -2., 0.5, 4., 10., 0.];
    let times = |k: f64| x.iter().map(|v| v * k).collect::<Vec<f64>>();
    let f = p.write(
        "a.json",
        &prog(r#"[{"repeat": 3, "steps": [{"routine": "step"}]}]"#),
    );
    assert_eq!(tensor(&run_ok(&f).0, "acc").2, times(3.));
    let f = p.write(
        "b.json",
        &prog(
            r#"[{"routine": "step"},
                {"repeat": 2, "steps": [{"repeat": 3, "steps": [{"routine": "step"}]}]},
                {"repeat": 0, "steps": [{"routine": "step"}]}]"#,
        ),
    );
    assert_eq!(tensor(&run_ok(&f).0, "acc").2, times(7.));
    let f = p.write("c.json", &prog("[]"));
    assert_eq!(tensor(&run_ok(&f).0, "acc").2, times(0.));
    let f = p.write(
        "d.json",
        &prog(r#"[{"repeat": -1, "steps": [{"routine": "step"}]}]"#),
    );
    let e = run_err(&f);
    assert!(e.contains("run step 1") && e.contains("-1"), "{e}");
}

#[test]
fn static_bindings_persist_and_are_checked() {
    let p = Prog::new();
    let prog = |run: &str| {
        format!(
            r#"{{"tensors": [{{"name": "k_val", "dims": [2], "prec": "double"}},
                            {{"name": "sum", "dims": [1], "prec": "double"}}],
               "static_indices": [{{"name": "k", "range": 5}}],
               "routines": [{{"name": "embed", "code": [
                 {{"fetch": "k_val", "embed_index": "k"}},
                 {{"assign": "sum", "accum": "add", "op": "identity", "args": ["k_val"], "logic": "i->0"}}
               ]}}],
               "run": {run},
               "print": ["k_val", "sum"]}}"#
        )
    };
    // 3 (k=3), 3 again (the binding persists), 4: sum = 2 * (3 + 3 + 4).
    let f = p.write(
        "a.json",
        &prog(
            r#"[{"routine": "embed", "bindings": {"k": 3}}, {"routine": "embed"},
                {"routine": "embed", "bindings": {"k": 4}}]"#,
        ),
    );
    let out = run_ok(&f).0;
    assert_eq!(tensor(&out, "k_val").2, vec![4., 4.]);
    assert_eq!(tensor(&out, "sum").2, vec![20.]);

    let f = p.write(
        "b.json",
        &prog(
            "[{\"routine\": \"embed\", \"bindings\": {\"k\": 1}},\n {\"routine\": \"embed\", \"bindings\": {\"k\": 5}}]",
        ),
    );
    let e = run_err(&f);
    assert!(
        e.contains("\"k\"") && e.contains('5') && e.contains("routine \"embed\""),
        "{e}"
    );
    assert!(e.contains("run step 2"), "{e}");
    let f = p.write(
        "c.json",
        &prog(r#"[{"routine": "embed", "bindings": {"k": -1}}]"#),
    );
    assert!(run_err(&f).contains("-1"));
    let f = p.write(
        "d.json",
        &prog(r#"[{"routine": "embed", "bindings": {"j": 0}}]"#),
    );
    assert!(run_err(&f).contains("unknown static index \"j\""));
}

// ---------------------------------------------------------------------------------------------
// Errors.

#[test]
fn unknown_field_reports_line_and_column() {
    let p = Prog::new();
    let f = p.write(
        "prog.json",
        r#"{
  "tensors": [{"name": "x", "dims": [2], "init": "range"}],
  "routines": [
    {"name": "forward", "code": [
      {"asign": "x", "op": "relu", "args": ["x"]}
    ]}
  ]
}"#,
    );
    let e = run_err(&f);
    assert!(e.contains("prog.json:5:"), "{e}");
    assert!(e.contains("unknown field") && e.contains("asign"), "{e}");
    assert!(e.contains("routine \"forward\""), "{e}");

    let f = p.write("top.json", "{\"tensors\": [],\n \"routine\": []}");
    let e = run_err(&f);
    assert!(e.contains("top.json:2:") && e.contains("routine"), "{e}");
}

#[test]
fn dangling_tensor_names_routine_and_name() {
    let p = Prog::new();
    let f = p.write(
        "prog.json",
        r#"{
  "tensors": [{"name": "x", "dims": [2], "init": "range"}, {"name": "y", "dims": [2]}],
  "routines": [
    {"name": "forward", "code": [
      {"assign": "y", "op": "relu", "args": ["x"]},
      {"comment": "y = relu(x @ w)", "code": [
        {"assign": "y", "op": "add", "args": ["y", "q"]}
      ]}
    ]}
  ]
}"#,
    );
    let e = run_err(&f);
    assert!(e.contains("routine \"forward\""), "{e}");
    assert!(e.contains("unknown tensor \"q\""), "{e}");
    assert!(e.contains("block \"y = relu(x @ w)\""), "{e}");
    assert!(e.contains("prog.json:7:"), "{e}");
}

#[test]
fn semantic_errors_are_reported() {
    let p = Prog::new();
    let base = |code: &str, extra: &str| {
        format!(
            r#"{{"tensors": [{{"name": "x", "dims": [2, 3], "init": "range"}},
                            {{"name": "y", "dims": [2, 3]}},
                            {{"name": "v", "dims": [3]}}],
               "static_indices": [{{"name": "i", "range": 2}}],
               "routines": [{{"name": "main", "code": [{code}]}}]{extra}}}"#
        )
    };
    let cases: Vec<(String, &[&str])> = vec![
        (
            base(r#"{"assign": "y", "op": "add", "args": ["x"]}"#, ""),
            &["routine \"main\", statement 1", "binary", "1 argument"],
        ),
        (
            base(r#"{"assign": "y", "op": "relu", "args": ["x", "x"]}"#, ""),
            &["unary", "2 arguments"],
        ),
        (
            base(r#"{"assign": "y", "op": "identity", "args": []}"#, ""),
            &["1, 2 or 3 arguments"],
        ),
        (
            base(r#"{"assign": "y", "op": "frobnicate", "args": ["x"]}"#, ""),
            &["unknown unary operation \"frobnicate\""],
        ),
        (
            base(
                r#"{"assign": "y", "op": "add", "args": ["x", "x"], "accum": "plus"}"#,
                "",
            ),
            &["unknown accumulator \"plus\""],
        ),
        (
            base(r#"{"assign": "y", "op": "add", "args": ["x", "v"]}"#, ""),
            &["shapes mismatch", "\"v\"", "[3]"],
        ),
        (
            base(
                r#"{"assign": "y", "op": "add", "args": ["x", "v"], "logic": "ij,i->ij"}"#,
                "",
            ),
            &["routine \"main\"", "ij,i->ij"],
        ),
        (
            base(
                r#"{"assign": "y", "op": "add", "args": ["x", "v"], "logic": "ij,{nope}->ij"}"#,
                "",
            ),
            &["nope"],
        ),
        (
            base(r#"{"fetch": "v", "embed_index": "j"}"#, ""),
            &["unknown static index \"j\""],
        ),
        (
            base(r#"{"fetch": "x", "slice": "v", "index": "i"}"#, ""),
            &["shapes mismatch", "\"v\""],
        ),
        (
            base(r#"{"fetch": "v", "constant": 1, "embed_index": "i"}"#, ""),
            &["exactly one of"],
        ),
        (
            base(r#"{"assign": "y", "fetch": "y", "constant": 1}"#, ""),
            &["\"assign\"", "\"fetch\""],
        ),
        (
            base(
                r#"{"fetch": "v", "constant": 1}"#,
                r#", "run": [{"routine": "other"}]"#,
            ),
            &["run step 1", "unknown routine \"other\""],
        ),
        (
            base(
                r#"{"fetch": "v", "constant": 1}"#,
                r#", "print": ["y", "w"]"#,
            ),
            &["print entry 2", "unknown tensor \"w\""],
        ),
        (
            r#"{"tensors": [{"name": "x", "dims": [2]}, {"name": "x", "dims": [3]}]}"#.into(),
            &["duplicate tensor name \"x\""],
        ),
        (
            r#"{"tensors": [{"name": "x", "dims": [2, 0]}]}"#.into(),
            &["tensor \"x\"", "dims [2, 0]"],
        ),
        (
            r#"{"tensors": [{"name": "x", "dims": []}]}"#.into(),
            &["tensor \"x\"", "non-empty"],
        ),
        (
            r#"{"tensors": [{"name": "x", "dims": [2], "prec": "quad"}]}"#.into(),
            &[":1:", "quad"],
        ),
        (
            r#"{"tensors": [{"name": "x", "dims": [2]"#.into(),
            &[":1:", "EOF"],
        ),
    ];
    for (i, (text, needles)) in cases.iter().enumerate() {
        let f = p.write(&format!("case{i}.json"), text);
        let e = run_err(&f);
        assert!(e.contains(&format!("case{i}.json")), "case {i}: {e}");
        for n in *needles {
            assert!(e.contains(n), "case {i}: expected {n:?} in: {e}");
        }
    }
    let out = arrayjit(&["run", "/nonexistent/prog.json"]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("/nonexistent/prog.json"),
        "{}",
        out.stderr
    );
}

// ---------------------------------------------------------------------------------------------
// Commands and formats.

#[test]
fn emit_c_prints_the_routines() {
    let out = arrayjit(&["emit-c", path_str(&example("format_example.json"))]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("forward"), "{}", out.stdout);
    assert!(out.stdout.contains("for (int"), "{}", out.stdout);
    assert!(out.stdout.contains("y = relu(x @ w)"), "{}", out.stdout);
    let p = Prog::new();
    let two = p.write(
        "two.json",
        r#"{"tensors": [{"name": "a", "dims": [2], "init": "range"}, {"name": "b", "dims": [2]}],
           "routines": [
             {"name": "first_one", "code": [{"assign": "b", "op": "relu", "args": ["a"]}]},
             {"name": "second_one", "code": [{"assign": "b", "op": "add", "args": ["b", "a"]}]}
           ]}"#,
    );
    let out = arrayjit(&["emit-c", path_str(&two)]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("first_one") && out.stdout.contains("second_one"),
        "{}",
        out.stdout
    );
}

#[test]
fn table_format_shows_the_values() {
    let out = arrayjit(&[
        "run",
        "--format",
        "table",
        path_str(&example("format_example.json")),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let t = &out.stdout;
    assert!(t.contains("y") && t.contains("s"), "{t}");
    // The rows of y and the row of s.
    let rows: Vec<Vec<&str>> = t.lines().map(|l| l.split_whitespace().collect()).collect();
    for want in [
        vec!["0", "0", "0"],
        vec!["9", "14", "19"],
        vec!["3", "5", "7"],
        vec!["6", "8", "10"],
        vec!["0", "42", "15", "24"],
    ] {
        assert!(rows.contains(&want), "row {want:?} missing in:\n{t}");
    }
    assert!(serde_json::from_str::<Value>(t).is_err());

    // Higher dims print as 2-D slices with their leading indices.
    let p = Prog::new();
    let f = p.write(
        "t.json",
        r#"{"tensors": [{"name": "r", "dims": [2, 2, 3], "init": "range"}], "print": ["r"]}"#,
    );
    let out = arrayjit(&["run", "--format=table", path_str(&f)]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("[1, :, :]"), "{}", out.stdout);
    assert!(out.stdout.contains("9  10  11"), "{}", out.stdout);
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        vec![],
        vec!["frobnicate"],
        vec!["run"],
        vec!["run", "--fast", "x.json"],
        vec!["run", "--format", "xml", "x.json"],
        vec!["emit-c", "a.json", "b.json"],
    ] {
        let out = arrayjit(&args);
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains("Usage"), "{args:?}: {}", out.stderr);
        assert!(out.stdout.is_empty());
    }
    let out = arrayjit(&["--help"]);
    assert_eq!(out.code, 0);
    assert!(out.stdout.contains("Usage") && out.stdout.contains("emit-c"));
}

#[test]
fn library_errors_name_the_routine() {
    // Reading the merge buffer on a single device: it holds nothing.
    let p = Prog::new();
    let f = p.write(
        "p.json",
        r#"{"tensors": [{"name": "w", "dims": [3]}, {"name": "o", "dims": [3]}],
           "routines": [{"name": "merger", "code": [
             {"assign": "o", "op": "identity", "args": [{"merge": "w"}]}
           ]}],
           "run": [{"routine": "merger"}],
           "print": ["o"]}"#,
    );
    let e = run_err(&f);
    assert!(
        e.contains("run step 1") && e.contains("routine \"merger\""),
        "{e}"
    );
    assert!(e.contains("merge buffer"), "{e}");

    // Pathological nesting is an error, not a crash.
    let n = 50_000;
    let deep = format!(
        "{{\"routines\": [{{\"name\": \"r\", \"code\": [{}{}]}}]}}",
        "{\"comment\": \"c\", \"code\": [".repeat(n),
        "]}".repeat(n)
    );
    let f = p.write("deep.json", &deep);
    let e = run_err(&f);
    assert!(e.contains("recursion"), "{e}");
}

#[test]
fn example_data_parallel_on_both_backends() {
    // Column sums of range(4x3) times w = [1, 2, 3], by hand: [18, 22, 26] * w.
    let want = vec![18.0, 44.0, 78.0];
    let (v, _) = run_ok(&example("data_parallel.json"));
    assert_eq!(tensor(&v, "g").2, want);
    let text = std::fs::read_to_string(example("data_parallel.json")).unwrap();
    let p = Prog::new();
    for (backend, merge) in [
        ("sync", "streaming"),
        ("sync", "copy"),
        ("multicore", "copy"),
    ] {
        let t = text
            .replace("\"multicore\"", &format!("\"{backend}\""))
            .replace("\"streaming\"", &format!("\"{merge}\""));
        let (v, _) = run_ok(&p.write(&format!("{backend}_{merge}.json"), &t));
        assert_eq!(tensor(&v, "g").2, want, "{backend} {merge}");
    }
}

#[test]
fn multi_device_steps_and_errors() {
    let p = Prog::new();
    let prog = |devices: &str, run: &str| {
        format!(
            r#"{{ {devices}
  "tensors": [
    {{"name": "x", "dims": [2], "init": {{"values": [1, 2]}}}},
    {{"name": "y", "dims": [2]}},
    {{"name": "acc", "dims": [2]}}
  ],
  "routines": [
    {{"name": "double", "code": [{{"assign": "y", "op": "add", "args": ["x", "x"]}}]}},
    {{"name": "merge", "code": [{{"assign": "acc", "accum": "add", "op": "identity", "args": [{{"merge": "y"}}]}}]}}
  ],
  "run": [{run}],
  "print": ["y", "acc"]
}}"#
        )
    };
    // Device 1 doubles, its y is copied (plain copy) to device 0, and merged twice into acc.
    let ok = prog(
        r#""devices": 2,"#,
        r#"{"routine": "double", "device": 1},
           {"copy": "y", "from": 1, "to": 0},
           {"copy": "y", "from": 1, "to": 0, "merge": "copy"},
           {"repeat": 2, "steps": [{"routine": "merge", "device": 0}]},
           {"await": 0}"#,
    );
    let (v, _) = run_ok(&p.write("ok.json", &ok));
    assert_eq!(tensor(&v, "y").2, vec![2.0, 4.0]);
    assert_eq!(tensor(&v, "acc").2, vec![4.0, 8.0]);
    // Errors: a device that does not exist, a copy in a single-device program, a merge of
    // the wrong node, a copy to itself.
    let cases = [
        (
            prog(r#""devices": 2,"#, r#"{"routine": "double", "device": 2}"#),
            "device 2",
        ),
        (
            prog("", r#"{"copy": "y", "from": 1, "to": 0}"#),
            "multi-device",
        ),
        (
            prog(
                r#""devices": 2,"#,
                r#"{"copy": "x", "from": 1, "to": 0, "merge": "streaming"}"#,
            ),
            "tensor x",
        ),
        (
            prog(r#""devices": 2,"#, r#"{"copy": "y", "from": 1, "to": 1}"#),
            "itself",
        ),
        (
            prog(r#""devices": 2, "backend": "gpu","#, r#"{"await": "all"}"#),
            "backend",
        ),
        (prog(r#""devices": 2,"#, r#"{"await": "some"}"#), "all"),
    ];
    for (i, (text, needle)) in cases.iter().enumerate() {
        let err = run_err(&p.write(&format!("bad{i}.json"), text));
        assert!(err.contains(needle), "case {i}: {err}");
    }
    // The merge-node mismatch names both nodes.
    let err = run_err(&p.write("bad_merge.json", &cases[2].0));
    assert!(err.contains("y") && err.contains("merg"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// `run --interpret`: the reference interpreter instead of the C compiler.

/// Runs `arrayjit ARGS` with extra environment variables.
fn arrayjit_env(args: &[&str], env: &[(&str, &str)]) -> Out {
    let o = Command::new(env!("CARGO_BIN_EXE_arrayjit"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("the arrayjit binary runs");
    Out {
        code: o.status.code().expect("exited normally, not by a signal"),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// The example program files, sorted.
fn example_programs() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(example(""))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    v.sort();
    assert!(!v.is_empty());
    v
}

/// Relative tolerance between the compiled and the interpreted values of a precision: the
/// interpreter keeps intermediate results of single and half expressions in `f64`.
fn interp_tolerance(prec: &str) -> f64 {
    match prec {
        "byte" => 1.0,
        // integer statements are exact in both (SPEC 9.1)
        "uint16" | "int32" | "uint32" | "int64" | "uint64" => 0.0,
        "half" => 4e-3,
        "bfloat16" => 1e-2,
        "fp8" => 0.25,
        "single" => 1e-5,
        "double" => 1e-12,
        other => panic!("unknown precision {other}"),
    }
}

/// Asserts that two `run` outputs print the same tensors, in the same order, with the same
/// dims and precisions, and values equal up to the precision's tolerance.
fn assert_same_output(compiled: &str, interpreted: &str, what: &str) {
    let parse = |s: &str| -> Value {
        serde_json::from_str(s).unwrap_or_else(|e| panic!("{what}: not JSON ({e}):\n{s}"))
    };
    let (c, i) = (parse(compiled), parse(interpreted));
    let ck: Vec<&String> = c.as_object().unwrap().keys().collect();
    let ik: Vec<&String> = i.as_object().unwrap().keys().collect();
    assert_eq!(ck, ik, "{what}: printed tensors");
    // Same layout: one tensor per line, in print order.
    assert_eq!(
        compiled.lines().count(),
        interpreted.lines().count(),
        "{what}:\n{compiled}\n{interpreted}"
    );
    // A tensor computed from tensors of a coarser precision inherits their rounding
    // differences: use the loosest tolerance of the floating precisions printed.
    let loosest = ck
        .iter()
        .map(|name| tensor(&c, name).1)
        .filter(|p| p != "byte")
        .map(|p| interp_tolerance(&p))
        .fold(0.0, f64::max);
    for name in ck {
        let (cd, cp, cv) = tensor(&c, name);
        let (id, ip, iv) = tensor(&i, name);
        assert_eq!((&cd, &cp), (&id, &ip), "{what}: tensor {name}");
        let tol = if cp == "byte" {
            interp_tolerance(&cp)
        } else {
            loosest
        };
        assert_eq!(cv.len(), iv.len());
        for (k, (a, b)) in cv.iter().zip(&iv).enumerate() {
            let ok = (a.is_nan() && b.is_nan())
                || a == b
                || (a - b).abs() <= tol * a.abs().max(b.abs()).max(1e-30)
                || (cp == "byte" && (a - b).abs() <= tol);
            assert!(
                ok,
                "{what}: tensor {name} cell {k}: compiled {a}, interpreted {b}\n{compiled}\n{interpreted}"
            );
        }
    }
}

/// Runs a program compiled and interpreted (both must succeed) and compares the outputs.
fn assert_interpret_matches(file: &Path) -> String {
    let compiled = arrayjit(&["run", path_str(file)]);
    assert_eq!(
        compiled.code,
        0,
        "{}: compiled run failed:\n{}",
        file.display(),
        compiled.stderr
    );
    let interpreted = arrayjit(&["run", "--interpret", path_str(file)]);
    assert_eq!(
        interpreted.code,
        0,
        "{}: interpreted run failed:\n{}",
        file.display(),
        interpreted.stderr
    );
    assert!(interpreted.stderr.is_empty(), "{}", interpreted.stderr);
    assert_same_output(
        &compiled.stdout,
        &interpreted.stdout,
        &file.display().to_string(),
    );
    interpreted.stdout
}

#[test]
fn interpret_matches_compiled_on_every_example() {
    for file in example_programs() {
        assert_interpret_matches(&file);
        // The table format too: same shape of output (values may differ in the last digit).
        let c = arrayjit(&["run", "--format", "table", path_str(&file)]);
        let i = arrayjit(&["run", "--interpret", "--format=table", path_str(&file)]);
        assert_eq!((c.code, i.code), (0, 0), "{}\n{}", c.stderr, i.stderr);
        assert_eq!(
            c.stdout.lines().count(),
            i.stdout.lines().count(),
            "{}:\n{}\n{}",
            file.display(),
            c.stdout,
            i.stdout
        );
    }
}

#[test]
fn interpret_needs_no_compiler() {
    let no_cc = [
        ("ARRAYJIT_CC", "/nonexistent"),
        ("CC", "/nonexistent"),
        ("PATH", "/nonexistent"),
        ("ARRAYJIT_CACHE", "0"),
    ];
    for file in example_programs() {
        let compiled = arrayjit(&["run", path_str(&file)]);
        assert_eq!(compiled.code, 0, "{}", compiled.stderr);
        let i = arrayjit_env(&["run", "--interpret", path_str(&file)], &no_cc);
        assert_eq!(i.code, 0, "{}: {}", file.display(), i.stderr);
        assert_same_output(&compiled.stdout, &i.stdout, &file.display().to_string());
        // Without --interpret the same environment has no compiler.
        let c = arrayjit_env(&["run", path_str(&file)], &no_cc);
        assert_eq!(c.code, 1, "{}", c.stdout);
        assert!(
            c.stderr.contains("C compiler not found") && c.stderr.contains("/nonexistent"),
            "{}",
            c.stderr
        );
    }
    // emit-c needs no compiler either, and bench and emit-c reject --interpret.
    let f = example("matmul.json");
    let out = arrayjit_env(&["emit-c", path_str(&f)], &no_cc);
    assert_eq!(out.code, 0, "{}", out.stderr);
    for args in [
        vec!["emit-c", "--interpret", path_str(&f)],
        vec!["bench", path_str(&f), "--interpret"],
        vec!["run", "--interpret", "--interpret", path_str(&f)],
    ] {
        let out = arrayjit(&args);
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains("--interpret"), "{}", out.stderr);
        assert!(out.stderr.contains("Usage"), "{}", out.stderr);
    }
    let help = arrayjit(&["--help"]);
    assert!(help.stdout.contains("--interpret"), "{}", help.stdout);
}

#[test]
fn interpret_matches_compiled_on_memory_modes_routines_and_bindings() {
    let p = Prog::new();
    let programs = [
        // Every memory mode.
        r#"{"tensors": [
             {"name": "w", "dims": [2, 2], "init": {"values": [1, 2, 3, 4]}, "memory": "on_device"},
             {"name": "x", "dims": [2, 2], "init": "range"},
             {"name": "t", "dims": [2, 2], "memory": "local"},
             {"name": "v", "dims": [2, 2], "memory": "virtual"},
             {"name": "h", "dims": [2, 2], "memory": "hosted"},
             {"name": "y", "dims": [2, 2], "memory": "on_device"}
           ],
           "routines": [{"name": "r", "code": [
             {"assign": "t", "op": "mul", "args": ["w", "x"]},
             {"assign": "v", "op": "add", "args": ["t", "x"]},
             {"assign": "h", "op": "relu", "args": ["v"]},
             {"assign": "y", "op": "sub", "args": ["h", "w"]}
           ]}],
           "run": [{"routine": "r"}, {"routine": "r"}],
           "print": ["h", "y", "w"]}"#,
        // A local tensor read twice per cell, and an output accumulated over calls.
        r#"{"tensors": [
             {"name": "x", "dims": [3], "init": {"values": [1, 2, 3]}},
             {"name": "t", "dims": [3], "memory": "local"},
             {"name": "y", "dims": [3]}
           ],
           "routines": [{"name": "r", "code": [
             {"assign": "t", "op": "add", "args": ["x", "x"]},
             {"assign": "y", "accum": "add", "op": "mul", "args": ["t", "t"]}
           ]}],
           "run": [{"repeat": 3, "steps": [{"routine": "r"}]}],
           "print": ["y"]}"#,
        // Tensors shared by routines persist; repeats.
        r#"{"tensors": [{"name": "w", "dims": [3]}, {"name": "o", "dims": [3]}],
           "routines": [
             {"name": "init", "code": [{"fetch": "w", "constant": 1.5}]},
             {"name": "step", "code": [
               {"assign": "w", "op": "add", "args": ["w", "w"]},
               {"assign": "o", "op": "identity", "args": ["w"]}
             ]}
           ],
           "run": [{"routine": "init"}, {"repeat": 2, "steps": [{"routine": "step"},
                   {"repeat": 2, "steps": [{"routine": "step"}]}]}],
           "print": ["o"]}"#,
        // Static bindings persist per routine; embedding and slicing.
        r#"{"tensors": [{"name": "k_val", "dims": [2], "prec": "double"},
                        {"name": "batch", "dims": [5, 2], "init": "range", "prec": "half"},
                        {"name": "row", "dims": [2], "prec": "half"},
                        {"name": "acc", "dims": [2], "prec": "half"},
                        {"name": "sum", "dims": [1], "prec": "double"}],
           "static_indices": [{"name": "k", "range": 5}],
           "routines": [
             {"name": "embed", "code": [
               {"fetch": "k_val", "embed_index": "k"},
               {"assign": "sum", "accum": "add", "op": "identity", "args": ["k_val"], "logic": "i->0"}
             ]},
             {"name": "slice", "code": [
               {"fetch": "row", "slice": "batch", "index": "k"},
               {"assign": "acc", "accum": "add", "op": "sqrt", "args": ["row"]}
             ]}
           ],
           "run": [{"routine": "embed", "bindings": {"k": 3}}, {"routine": "embed"},
                   {"routine": "slice", "bindings": {"k": 4}}, {"routine": "slice"},
                   {"routine": "embed", "bindings": {"k": 4}}, {"routine": "slice"}],
           "print": ["k_val", "sum", "acc", "row"]}"#,
        // Every precision through transcendental operations, broadcasts and reductions.
        r#"{"tensors": [
             {"name": "a", "dims": [3, 4], "init": {"uniform": {"seed": 7}}, "prec": "double"},
             {"name": "b", "dims": [4], "init": {"values": [0.5, -1.25, 2, 3.75]}, "prec": "half"},
             {"name": "c", "dims": [3, 4], "prec": "single"},
             {"name": "d", "dims": [3], "prec": "double"},
             {"name": "e", "dims": [3, 4], "prec": "byte"},
             {"name": "f", "dims": [4], "prec": "half"},
             {"name": "g", "dims": [1], "prec": "single"}
           ],
           "routines": [{"name": "mix", "code": [
             {"assign": "c", "op": "mul", "args": ["a", "b"], "logic": "ij,j->ij"},
             {"assign": "c", "op": "tanh", "args": ["c"]},
             {"assign": "d", "accum": "add", "init_neutral": true, "op": "exp", "args": ["c"], "logic": "ij->i"},
             {"assign": "e", "op": "mul", "args": ["a", "b"], "logic": "ij,j->ij"},
             {"assign": "e", "op": "pow", "args": ["e", "b"], "logic": "ij,j->ij"},
             {"assign": "f", "accum": "max", "init_neutral": true, "op": "sin", "args": ["a"], "logic": "ij->j"},
             {"assign": "g", "accum": "mul", "init_neutral": true, "op": "div", "args": ["d", "d"], "logic": "i,i->0"},
             {"assign": "g", "op": "log", "args": ["g"]}
           ]}],
           "run": [{"routine": "mix"}],
           "print": ["c", "d", "e", "f", "g"]}"#,
    ];
    for (i, text) in programs.iter().enumerate() {
        let f = p.write(&format!("p{i}.json"), text);
        assert_interpret_matches(&f);
    }
    // y = 3 * (2x)^2.
    let out = run_interpreted(&p.write("local.json", programs[1]));
    assert_eq!(tensor(&out, "y").2, vec![12., 48., 108.]);
}

/// Runs `arrayjit run --interpret FILE` and parses the output.
fn run_interpreted(file: &Path) -> Value {
    let out = arrayjit(&["run", "--interpret", path_str(file)]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    serde_json::from_str(&out.stdout).unwrap()
}

#[test]
fn interpret_matches_compiled_on_multi_device_programs() {
    let p = Prog::new();
    let prog = |devices: &str, run: &str| {
        format!(
            r#"{{ {devices}
  "tensors": [
    {{"name": "x", "dims": [2], "init": {{"values": [1, 2]}}}},
    {{"name": "y", "dims": [2]}},
    {{"name": "acc", "dims": [2]}}
  ],
  "routines": [
    {{"name": "double", "code": [{{"assign": "y", "op": "add", "args": ["x", "x"]}}]}},
    {{"name": "merge", "code": [{{"assign": "acc", "accum": "add", "op": "identity", "args": [{{"merge": "y"}}]}}]}}
  ],
  "run": [{run}],
  "print": ["y", "acc"]
}}"#
        )
    };
    let runs = [
        r#"{"routine": "double", "device": 1},
           {"copy": "y", "from": 1, "to": 0},
           {"copy": "y", "from": 1, "to": 0, "merge": "copy"},
           {"repeat": 2, "steps": [{"routine": "merge", "device": 0}]},
           {"await": 0}"#,
        // Streaming: device 0's merge buffer follows device 1's y as it changes.
        r#"{"routine": "double", "device": 1},
           {"copy": "y", "from": 1, "to": 0, "merge": "streaming"},
           {"routine": "merge", "device": 0},
           {"copy": "y", "from": 0, "to": 1},
           {"routine": "merge", "device": 0},
           {"to_host": "acc", "device": 0},
           {"from_host": "x", "device": 2},
           {"routine": "double", "device": 2},
           {"copy": "y", "from": 2, "to": 0, "merge": "copy"},
           {"routine": "merge", "device": 0},
           {"await": "all"}"#,
    ];
    for (i, run) in runs.iter().enumerate() {
        for backend in ["multicore", "sync"] {
            let text = prog(&format!(r#""devices": 3, "backend": "{backend}","#), run);
            let f = p.write(&format!("m{i}_{backend}.json"), &text);
            assert_interpret_matches(&f);
        }
    }
    // The examples with the other backend and merge modes.
    let text = std::fs::read_to_string(example("data_parallel.json")).unwrap();
    for merge in ["copy", "streaming"] {
        let t = text
            .replace("\"multicore\"", "\"sync\"")
            .replace("\"streaming\"", &format!("\"{merge}\""));
        let out = run_interpreted(&p.write(&format!("dp_{merge}.json"), &t));
        assert_eq!(tensor(&out, "g").2, vec![18.0, 44.0, 78.0]);
    }
}

#[test]
fn interpret_reports_errors_like_the_compiled_run() {
    let p = Prog::new();
    let run_err_interpreted = |file: &Path| {
        let out = arrayjit(&["run", "--interpret", path_str(file)]);
        assert_eq!(out.code, 1, "{} {}", out.stdout, out.stderr);
        assert!(out.stderr.starts_with("error: "), "{}", out.stderr);
        assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
        assert!(out.stdout.is_empty());
        out.stderr
    };
    // Reading an empty merge buffer on a single device names the step and the routine.
    let f = p.write(
        "merge.json",
        r#"{"tensors": [{"name": "w", "dims": [3]}, {"name": "o", "dims": [3]}],
           "routines": [{"name": "merger", "code": [
             {"assign": "o", "op": "identity", "args": [{"merge": "w"}]}
           ]}],
           "run": [{"routine": "merger"}],
           "print": ["o"]}"#,
    );
    let e = run_err_interpreted(&f);
    assert!(
        e.contains("run step 1") && e.contains("routine \"merger\"") && e.contains("merge buffer"),
        "{e}"
    );
    // A static index without a declared range that indexes outside a tensor.
    let f = p.write(
        "oob.json",
        r#"{"tensors": [{"name": "batch", "dims": [4, 2], "init": "range"},
                        {"name": "x", "dims": [2]}],
           "static_indices": [{"name": "row"}],
           "routines": [{"name": "pick", "code": [
             {"fetch": "x", "slice": "batch", "index": "row"}
           ]}],
           "run": [{"routine": "pick", "bindings": {"row": 3}},
                   {"routine": "pick", "bindings": {"row": 7}}],
           "print": ["x"]}"#,
    );
    let e = run_err_interpreted(&f);
    assert!(
        e.contains("run step 2") && e.contains("routine \"pick\"") && e.contains("7"),
        "{e}"
    );
    let e = run_err(&f);
    assert!(
        e.contains("run step 2") && e.contains("routine \"pick\"") && e.contains("7"),
        "{e}"
    );
    // Merging the wrong tensor on several devices.
    let f = p.write(
        "wrong_merge.json",
        r#"{"devices": 2,
           "tensors": [{"name": "x", "dims": [2], "init": "range"}, {"name": "y", "dims": [2]}],
           "routines": [{"name": "merge", "code": [
             {"assign": "y", "accum": "add", "op": "identity", "args": [{"merge": "y"}]}]}],
           "run": [{"copy": "x", "from": 1, "to": 0, "merge": "streaming"}],
           "print": ["y"]}"#,
    );
    let e = run_err_interpreted(&f);
    assert!(
        e.contains("x") && e.contains("merg") && e.contains("run step 1"),
        "{e}"
    );
    // Semantic errors of the program file are the same as without --interpret.
    let f = p.write(
        "bad.json",
        r#"{"tensors": [{"name": "x", "dims": [2]}],
           "routines": [{"name": "r", "code": [{"assign": "x", "op": "relu", "args": ["q"]}]}]}"#,
    );
    assert_eq!(run_err_interpreted(&f), run_err(&f));
}

// ---------------------------------------------------------------------------------------------
// `arrayjit cache info|clear`, the cache limit, and how library errors are printed.

/// `cache info` counts arrayjit's files, `cache clear` deletes them and nothing else, and
/// `ARRAYJIT_CACHE_MAX` bounds what runs leave in the cache.
#[test]
fn cache_info_and_clear() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let cache_s = path_str(&cache);
    let env = [("ARRAYJIT_CACHE_DIR", cache_s), ("ARRAYJIT_CACHE", "on")];
    let info = |env: &[(&str, &str)]| {
        let out = arrayjit_env(&["cache", "info"], env);
        assert_eq!(out.code, 0, "{}", out.stderr);
        out.stdout
    };
    // An empty (missing) cache.
    let text = info(&env);
    assert!(text.contains(&format!("directory: {cache_s}\n")), "{text}");
    assert!(
        text.contains("compiled objects: 0 files, 0 bytes"),
        "{text}"
    );
    assert!(
        text.contains("limit (ARRAYJIT_CACHE_MAX) 1073741824 bytes (1.0 GiB)"),
        "{text}"
    );
    // Two programs compiled: two objects, and the memo of the target probe.
    for p in ["matmul.json", "reduction.json"] {
        let out = arrayjit_env(&["run", path_str(&example(p))], &env);
        assert_eq!(out.code, 0, "{}", out.stderr);
    }
    let text = info(&env);
    assert!(text.contains("compiled objects: 2 files, "), "{text}");
    assert!(
        text.contains("remembered compilers and targets: "),
        "{text}"
    );
    let objects = || {
        std::fs::read_dir(&cache)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".so")
            })
            .count()
    };
    assert_eq!(objects(), 2);
    // A limit of one object's size: the next store evicts the least recently used.
    let one = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "so"))
        .map(|p| std::fs::metadata(p).unwrap().len())
        .max()
        .unwrap();
    let limit = (one + one / 2).to_string();
    let limited = [env[0], env[1], ("ARRAYJIT_CACHE_MAX", limit.as_str())];
    let out = arrayjit_env(&["run", path_str(&example("mlp_layer.json"))], &limited);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(objects(), 1, "{}", info(&limited));
    // Files that are not arrayjit's survive a clear.
    std::fs::write(cache.join("notes.txt"), "mine").unwrap();
    let out = arrayjit_env(&["cache", "clear"], &env);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.starts_with("deleted "), "{}", out.stdout);
    assert!(out.stdout.contains(cache_s), "{}", out.stdout);
    assert!(info(&env).contains("total: 0 files, 0 bytes"));
    assert_eq!(
        std::fs::read_to_string(cache.join("notes.txt")).unwrap(),
        "mine"
    );
    // Junk in the limit is an error naming the variable; a cache that is off says so.
    let program = example("matmul.json");
    for args in [
        &["cache", "info"][..],
        &["cache", "clear"],
        &["run", path_str(&program)],
    ] {
        let out = arrayjit_env(args, &[env[0], ("ARRAYJIT_CACHE_MAX", "lots")]);
        assert_eq!(out.code, 1, "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.starts_with("error: ") && out.stderr.contains("ARRAYJIT_CACHE_MAX=\"lots\""),
            "{args:?}: {}",
            out.stderr
        );
    }
    let text = info(&[("ARRAYJIT_CACHE", "off")]);
    assert!(text.contains("the compile cache is off"), "{text}");
    for args in [&["cache"][..], &["cache", "purge"], &["cache", "info", "x"]] {
        let out = arrayjit(args);
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains("Usage"), "{args:?}: {}", out.stderr);
    }
}

/// Errors from the library are printed in their `Display` form: a compiler failure keeps the
/// hint about `ARRAYJIT_DEBUG_DIR`, and never shows the `Debug` form of the error.
#[test]
fn library_errors_are_printed_for_people() {
    let dir = tempfile::tempdir().unwrap();
    let cache = path_str(dir.path());
    let out = arrayjit_env(
        &["run", path_str(&example("mlp_layer.json"))],
        &[
            ("ARRAYJIT_CACHE_DIR", cache),
            ("ARRAYJIT_CFLAGS", "-Wl,--no-such-linker-flag"),
        ],
    );
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.starts_with("error: "), "{}", out.stderr);
    assert!(
        out.stderr.contains("C compilation failed")
            && out.stderr.contains("<not kept: set ARRAYJIT_DEBUG_DIR>"),
        "{}",
        out.stderr
    );
    for debug_form in ["Compile {", "source_path:", "Some(", "Error::"] {
        assert!(!out.stderr.contains(debug_form), "{}", out.stderr);
    }
}

/// `-fsanitize=address` without the AddressSanitizer runtime is an error saying what to
/// preload (the process is not ended by the runtime); with it preloaded, the program runs.
#[test]
fn address_sanitizer_needs_its_runtime_preloaded() {
    let dir = tempfile::tempdir().unwrap();
    let file = example("mlp_layer.json");
    let env = [
        ("ARRAYJIT_CACHE_DIR", path_str(dir.path())),
        ("ARRAYJIT_CFLAGS", "-fsanitize=address"),
    ];
    let out = arrayjit_env(&["run", path_str(&file)], &env);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("AddressSanitizer (-fsanitize=address)")
            && out.stderr.contains("LD_PRELOAD=")
            && !out.stderr.contains("does not come first"),
        "{}",
        out.stderr
    );
    // The runtime, as the error names it (when the compiler has one).
    let preload = out
        .stderr
        .split("LD_PRELOAD=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap()
        .to_string();
    if !preload.starts_with('/') || !Path::new(&preload).exists() {
        eprintln!("no AddressSanitizer runtime found ({preload}): skipping the preloaded run");
        return;
    }
    let mut with = env.to_vec();
    with.extend([
        ("LD_PRELOAD", preload.as_str()),
        ("ASAN_OPTIONS", "detect_leaks=0"),
    ]);
    let (expected, _) = run_ok(&file);
    let out = arrayjit_env(&["run", path_str(&file)], &with);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        serde_json::from_str::<Value>(&out.stdout).unwrap(),
        expected
    );
}

#[test]
fn all_reduce_steps_sum_over_devices_in_process() {
    // The MPI example program on the in-process backends and in the interpreter: by hand,
    // the batch's column sums [18, 22, 26] times w = [1, 2, 3]; w -= g/8; twice.
    let text = std::fs::read_to_string(example("mpi/all_reduce.json")).unwrap();
    let p = Prog::new();
    for backend in ["multicore", "sync"] {
        let file = p.write(
            &format!("{backend}.json"),
            &text.replace("\"mpi\"", &format!("\"{backend}\"")),
        );
        let (v, _) = run_ok(&file);
        assert_eq!(tensor(&v, "g").2, vec![-22.5, -77.0, -175.5], "{backend}");
        assert_eq!(tensor(&v, "w").2, vec![1.5625, 6.125, 15.1875], "{backend}");
    }
    let out = arrayjit(&[
        "run",
        "--interpret",
        path_str(&example("mpi/all_reduce.json")),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(tensor(&v, "w").2, vec![1.5625, 6.125, 15.1875]);

    // A subset of the devices, and the errors.
    let prog = |devices: &str, step: &str| {
        format!(
            r#"{{ {devices}
  "tensors": [{{"name": "x", "dims": [2], "prec": "half", "init": {{"values": [1.5, 2]}}}},
              {{"name": "y", "dims": [2], "prec": "half"}}],
  "routines": [{{"name": "double", "code": [{{"assign": "y", "op": "add", "args": ["x", "x"]}}]}}],
  "run": [{step}],
  "print": ["y"]
}}"#
        )
    };
    let file = p.write(
        "subset.json",
        &prog(
            r#""devices": 3,"#,
            r#"{"routine": "double", "device": 0}, {"routine": "double", "device": 2},
               {"all_reduce": "y", "devices": [2, 0]}"#,
        ),
    );
    let (v, _) = run_ok(&file);
    assert_eq!(tensor(&v, "y").2, vec![6.0, 8.0]);
    for (devices, step, msg) in [
        (
            "",
            r#"{"all_reduce": "y"}"#,
            "all_reduce needs a multi-device program",
        ),
        (
            r#""devices": 3,"#,
            r#"{"all_reduce": "y", "devices": [0, 0]}"#,
            "device 0 is listed twice",
        ),
        (
            r#""devices": 3,"#,
            r#"{"all_reduce": "y", "devices": [0, 3]}"#,
            "device 3 does not exist",
        ),
        (
            r#""devices": 3,"#,
            r#"{"all_reduce": "y", "devices": []}"#,
            "an all_reduce needs at least one device",
        ),
        (
            r#""devices": 3,"#,
            r#"{"all_reduce": "q"}"#,
            "unknown tensor \"q\"",
        ),
        (
            r#""devices": 3,"#,
            r#"{"all_reduce": "y", "device": 1}"#,
            "\"device\" does not go with this kind of run step",
        ),
    ] {
        let err = run_err(&p.write("bad.json", &prog(devices, step)));
        assert!(err.contains(msg), "{step}: {err}");
    }
}

#[cfg(not(feature = "mpi"))]
#[test]
fn backend_mpi_without_the_feature_is_a_clear_error() {
    let err = run_err(&example("mpi/all_reduce.json"));
    assert!(
        err.contains("backend mpi: this binary was built without feature `mpi`"),
        "{err}"
    );
}

/// A routine that reads a tensor nothing has written (neither hosted nor computed by a
/// routine run before it) reads zeros; the CLI says so on stderr once, naming the routine and
/// the tensor, and still prints the values. With its producer run first, no warning;
/// `ARRAYJIT_LOG=off` silences it.
#[test]
fn reads_of_never_written_tensors_are_warned_about() {
    let p = Prog::new();
    let prog = |run: &str| {
        format!(
            r#"{{"tensors": [{{"name": "a", "dims": [3], "memory": "on_device"}},
                             {{"name": "out", "dims": [3]}}],
               "routines": [{{"name": "make_a", "code": [{{"fetch": "a", "constant": 2}}]}},
                            {{"name": "use_a", "code": [{{"assign": "out", "op": "add", "args": ["a", "a"]}}]}}],
               "run": [{run}], "print": ["out"]}}"#
        )
    };
    let consumer_only = p.write(
        "consumer.json",
        &prog(r#"{"routine": "use_a"}, {"routine": "use_a"}"#),
    );
    let out = arrayjit(&["run", path_str(&consumer_only)]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.stderr
            .matches("routine use_a reads a that nothing has written")
            .count(),
        1,
        "{}",
        out.stderr
    );
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(tensor(&v, "out").2, vec![0.0; 3]);
    let both = p.write(
        "both.json",
        &prog(r#"{"routine": "make_a"}, {"routine": "use_a"}"#),
    );
    let out = arrayjit(&["run", path_str(&both)]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(!out.stderr.contains("WARN"), "{}", out.stderr);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(tensor(&v, "out").2, vec![4.0; 3]);
    let o = Command::new(env!("CARGO_BIN_EXE_arrayjit"))
        .args(["run", path_str(&consumer_only)])
        .env("ARRAYJIT_LOG", "off")
        .output()
        .unwrap();
    assert!(o.status.success() && o.stderr.is_empty());
}

/// `all_reduce` in every precision of SPEC 9.1, compiled and interpreted, against sums done
/// here by hand: integers exact (above 2^53 too) and wrapped into their width, bfloat16 and
/// fp8 summed in single precision and rounded once.
#[test]
fn all_reduce_of_the_wider_precisions_compiled_and_interpreted() {
    let p = Prog::new();
    let prog = |prec: &str, values: &str| {
        format!(
            r#"{{ "devices": 3,
  "tensors": [
    {{"name": "src", "dims": [3, 2], "prec": "{prec}", "init": {{"values": {values}}}}},
    {{"name": "g", "dims": [2], "prec": "{prec}"}}
  ],
  "static_indices": [{{"name": "row", "range": 3}}],
  "routines": [{{"name": "take", "code": [{{"fetch": "g", "slice": "src", "index": "row"}}]}}],
  "run": [
    {{"routine": "take", "device": 0, "bindings": {{"row": 0}}}},
    {{"routine": "take", "device": 1, "bindings": {{"row": 1}}}},
    {{"routine": "take", "device": 2, "bindings": {{"row": 2}}}},
    {{"all_reduce": "g"}}
  ],
  "print": ["g"]
}}"#
        )
    };
    let cases = [
        // 2^53 + 1 + 2 + 3 is exact; -2^63 + 1 + 1 = -2^63 + 2.
        (
            "int64",
            "[9007199254740993, -9223372036854775808, 2, 1, 3, 1]",
            "[9007199254740998,-9223372036854775806]",
        ),
        // 3 · (2^64 - 1) wraps to 2^64 - 3.
        (
            "uint64",
            "[18446744073709551615, 1, 18446744073709551615, 2, 18446744073709551615, 3]",
            "[18446744073709551613,6]",
        ),
        // (2^31 - 1) + 1 + 0 wraps to -2^31.
        ("int32", "[2147483647, 5, 1, 5, 0, 5]", "[-2147483648,15]"),
        // 256 + 1 + 1 = 258 is a bfloat16 (summing in bfloat16 would give 256 twice).
        ("bfloat16", "[256, 1, 1, 2, 1, 3]", "[258,6]"),
        // 0.75 · 3 = 2.25: halfway between the fp8 values 2 and 2.5, to even: 2.
        ("fp8", "[0.75, 1, 0.75, 1, 0.75, 1]", "[2,3]"),
    ];
    for (prec, values, want) in cases {
        let file = p.write(&format!("{prec}.json"), &prog(prec, values));
        let want: Value = serde_json::from_str(want).unwrap();
        let (v, _) = run_ok(&file);
        assert_eq!(v["g"]["values"], want, "{prec} compiled: {v}");
        let out = arrayjit(&["run", "--interpret", path_str(&file)]);
        assert_eq!(out.code, 0, "{}", out.stderr);
        let v: Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(v["g"]["values"], want, "{prec} interpreted: {v}");
    }
}

/// A `constant` fetch written as an integer literal is exact for integer tensors (SPEC 9.1:
/// values beyond 2^53 keep every digit), and wraps into the width like any integer store.
#[test]
fn integer_constants_are_exact() {
    let p = Prog::new();
    let text = r#"{
  "tensors": [
    {"name": "a", "dims": [2], "prec": "int64"},
    {"name": "b", "dims": [2], "prec": "uint64"},
    {"name": "c", "dims": [1], "prec": "int32"},
    {"name": "d", "dims": [1], "prec": "uint16"},
    {"name": "e", "dims": [1], "prec": "int64"},
    {"name": "f", "dims": [1], "prec": "single"}
  ],
  "routines": [{"name": "r", "code": [
    {"fetch": "a", "constant": 9007199254740993},
    {"fetch": "b", "constant": 18446744073709551615},
    {"fetch": "c", "constant": 4294967301},
    {"fetch": "d", "constant": -1},
    {"fetch": "e", "constant": -9223372036854775807},
    {"fetch": "f", "constant": 16777217}
  ]}],
  "run": [{"routine": "r"}],
  "print": ["a", "b", "c", "d", "e", "f"]
}"#;
    let file = p.write("consts.json", text);
    // 2^32 + 5 wraps to 5 in an int32, -1 to 65535 in a uint16; 2^24 + 1 rounds to 2^24 in
    // a single (to even).
    let want = serde_json::json!({
        "a": [9007199254740993_i64, 9007199254740993_i64],
        "b": [18446744073709551615_u64, 18446744073709551615_u64],
        "c": [5], "d": [65535], "e": [-9223372036854775807_i64], "f": [16777216]
    });
    for args in [vec!["run"], vec!["run", "--interpret"]] {
        let mut args = args.clone();
        args.push(path_str(&file));
        let out = arrayjit(&args);
        assert_eq!(out.code, 0, "{}", out.stderr);
        let v: Value = serde_json::from_str(&out.stdout).unwrap();
        for (name, values) in want.as_object().unwrap() {
            assert_eq!(&v[name]["values"], values, "{args:?} {name}: {v}");
        }
    }
}

/// Copies and merge buffers keep int64 values exact, compiled and interpreted: device 1
/// doubles x, its y is copied to device 0 and merged twice into acc. By hand:
/// 2·(2^53 + 1) = 18014398509481986, twice that 36028797018963972; 2·(1 - 2^63) wraps to 2.
#[test]
fn merges_of_int64_are_exact() {
    let p = Prog::new();
    let text = r#"{ "devices": 2,
  "tensors": [
    {"name": "x", "dims": [2], "prec": "int64", "init": {"values": [9007199254740993, -9223372036854775807]}},
    {"name": "y", "dims": [2], "prec": "int64"},
    {"name": "acc", "dims": [2], "prec": "int64"}
  ],
  "routines": [
    {"name": "double", "code": [{"assign": "y", "op": "add", "args": ["x", "x"]}]},
    {"name": "merge", "code": [{"assign": "acc", "accum": "add", "op": "identity", "args": [{"merge": "y"}]}]}
  ],
  "run": [{"routine": "double", "device": 1},
          {"copy": "y", "from": 1, "to": 0},
          {"copy": "y", "from": 1, "to": 0, "merge": "copy"},
          {"repeat": 2, "steps": [{"routine": "merge", "device": 0}]},
          {"await": 0}],
  "print": ["y", "acc"]
}"#;
    let file = p.write("merge64.json", text);
    for args in [vec!["run"], vec!["run", "--interpret"]] {
        let mut args = args.clone();
        args.push(path_str(&file));
        let out = arrayjit(&args);
        assert_eq!(out.code, 0, "{}", out.stderr);
        let v: Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(
            v["y"]["values"],
            serde_json::json!([18014398509481986_i64, 2]),
            "{args:?}"
        );
        assert_eq!(
            v["acc"]["values"],
            serde_json::json!([36028797018963972_i64, 4]),
            "{args:?}"
        );
    }
}
