//! The CLI with ternary assignments, gather / scatter_add and random fetches (SPEC 9.2, 9.4,
//! 9.5): example programs checked against values computed here, compiled and interpreted,
//! and the errors bad statements get.

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
        code: o.status.code().expect("exited normally"),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/programs")
        .join(name)
}

/// Runs the program compiled and interpreted; both must succeed with the same output.
fn run_both(file: &Path) -> Value {
    let f = file.to_str().unwrap();
    let compiled = arrayjit(&["run", f]);
    assert_eq!(compiled.code, 0, "{}", compiled.stderr);
    let interpreted = arrayjit(&["run", "--interpret", f]);
    assert_eq!(interpreted.code, 0, "{}", interpreted.stderr);
    assert_eq!(compiled.stdout, interpreted.stdout);
    serde_json::from_str(&compiled.stdout).unwrap()
}

fn run_err(text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.json");
    std::fs::write(&p, text).unwrap();
    let out = arrayjit(&["run", p.to_str().unwrap()]);
    assert_eq!(out.code, 1, "{} {}", out.stdout, out.stderr);
    assert!(out.stderr.starts_with("error: "), "{}", out.stderr);
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    out.stderr
}

fn values(out: &Value, name: &str) -> Vec<f64> {
    out[name]["values"]
        .as_array()
        .unwrap_or_else(|| panic!("{name} not printed: {out}"))
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect()
}

fn singles(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

/// Threefry-4x32-20's first word, written here independently of the library.
fn threefry_first(ctr: [u32; 4], key: [u32; 4]) -> u32 {
    const R: [u32; 16] = [10, 26, 11, 21, 13, 27, 23, 5, 6, 20, 17, 11, 25, 10, 18, 20];
    let ks = [
        key[0],
        key[1],
        key[2],
        key[3],
        0x1BD11BDA ^ key[0] ^ key[1] ^ key[2] ^ key[3],
    ];
    let mut x: Vec<u32> = (0..4).map(|i| ctr[i].wrapping_add(ks[i])).collect();
    for r in 0..20usize {
        let (p, q) = if r % 2 == 0 { (1, 3) } else { (3, 1) };
        x[0] = x[0].wrapping_add(x[p]);
        x[p] = x[p].rotate_left(R[2 * (r % 8)]) ^ x[0];
        x[2] = x[2].wrapping_add(x[q]);
        x[q] = x[q].rotate_left(R[2 * (r % 8) + 1]) ^ x[2];
        if r % 4 == 3 {
            let s = (r + 1) / 4;
            for (i, xi) in x.iter_mut().enumerate() {
                *xi = xi.wrapping_add(ks[(s + i) % 5]);
            }
            x[3] = x[3].wrapping_add(s as u32);
        }
    }
    x[0]
}

fn word(seed: u64, off: u64) -> u32 {
    threefry_first(
        [off as u32, (off >> 32) as u32, 0, 0],
        [seed as u32, (seed >> 32) as u32, 0, 0],
    )
}

#[test]
fn example_causal_mask() {
    let out = run_both(&example("causal_mask.json"));
    let scores: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let mask = [
        1., 0., 0., 0., 1., 1., 0., 0., 1., 1., 1., 0., 1., 1., 1., 1.,
    ];
    let scale = [0.5f32, 0.25, 2.0, 0.1];
    let bias = [1f32, 2.0, 3.0, 0.3];
    let masked: Vec<f32> = (0..16)
        .map(|k| if mask[k] != 0.0 { scores[k] } else { -1000.0 })
        .collect();
    assert_eq!(singles(&values(&out, "masked")), masked);
    let affine: Vec<f32> = (0..16)
        .map(|k| masked[k].mul_add(scale[k % 4], bias[k % 4]))
        .collect();
    assert_eq!(singles(&values(&out, "affine")), affine);
    let prod: Vec<f32> = (0..4)
        .map(|i| {
            (0..4).fold(0f32, |acc, j| {
                acc + scores[i * 4 + j] * scale[j] * mask[i * 4 + j] as f32
            })
        })
        .collect();
    assert_eq!(singles(&values(&out, "prod")), prod);
    // Random fetches: w / 2^32 rounded down to single; exact in double; w mod 256 in byte.
    let single: Vec<f32> = (0..6)
        .map(|o| {
            let exact = word(42, o) as f64 / 4294967296.0;
            let f = exact as f32;
            if f as f64 > exact {
                f32::from_bits(f.to_bits() - 1)
            } else {
                f
            }
        })
        .collect();
    assert_eq!(singles(&values(&out, "noise")), single);
    let double: Vec<f64> = (0..6).map(|o| word(42, o) as f64 / 4294967296.0).collect();
    assert_eq!(values(&out, "noise_d"), double);
    let bytes: Vec<f64> = (0..6).map(|o| (word(u64::MAX, o) & 0xff) as f64).collect();
    assert_eq!(values(&out, "noise_b"), bytes);
}

#[test]
fn example_embedding() {
    let out = run_both(&example("embedding.json"));
    let table = [
        0.5f32, 1., 1.5, 10., 20., 30., -1., -2., -3., 0.25, 0.125, 7.,
    ];
    let ids = [1usize, 3, 4, 0, 255, 1];
    let mut emb = vec![];
    for &i in &ids {
        for r in 0..3 {
            emb.push(if i < 4 { table[i * 3 + r] } else { 0.0 });
        }
    }
    assert_eq!(singles(&values(&out, "emb")), emb);
    assert_eq!(singles(&values(&out, "emb_h")), emb);
    let mut grad = vec![100f32, 100., 100., 0., 0., 0., 0., 0., 0., 0., 0., 0.];
    for (d, &i) in ids.iter().enumerate() {
        if i < 4 {
            for r in 0..3 {
                grad[i * 3 + r] += (d * 3 + r) as f32;
            }
        }
    }
    assert_eq!(singles(&values(&out, "grad_table")), grad);
}

/// Runs the CLI with extra environment variables.
fn arrayjit_env(args: &[&str], env: &[(&str, &str)]) -> Out {
    let o = Command::new(env!("CARGO_BIN_EXE_arrayjit"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("the arrayjit binary runs");
    Out {
        code: o.status.code().expect("exited normally"),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

#[test]
fn example_gather_indices() {
    let file = example("gather_indices.json");
    let out = run_both(&file);
    // table = range over offsets: row i is [2i, 2i + 1].
    let ids: [i64; 6] = [99_999, -1, 100_000, 0, 50_000, 99_999];
    let rows: Vec<f64> = ids
        .iter()
        .flat_map(|&i| {
            (0..2).map(move |c| {
                if (0..100_000).contains(&i) {
                    (2 * i + c) as f64
                } else {
                    0.0
                }
            })
        })
        .collect();
    assert_eq!(values(&out, "rows"), rows);
    // 2^64 - 1 (computed as 0 - 1 in uint64) and 2^63 are out of range; 7 is row 7.
    assert_eq!(values(&out, "rows_huge"), vec![0.0, 0.0]);
    assert_eq!(values(&out, "rows_top"), vec![0.0, 0.0, 14.0, 15.0]);
    let labels = [3usize, 3, 4, 0, 65535, 3];
    let mut grad = vec![-100i64, -100, 0, 0, 0, 0, 1000, 1000];
    for (d, &l) in labels.iter().enumerate() {
        if l < 4 {
            for c in 0..2 {
                grad[l * 2 + c] += (d * 2 + c) as i64;
            }
        }
    }
    let grad: Vec<f64> = grad.into_iter().map(|x| x as f64).collect();
    assert_eq!(values(&out, "grad"), grad);
    // The same with clang and with bounds checks.
    let f = file.to_str().unwrap();
    let compiled = arrayjit(&["run", f]);
    for env in [("ARRAYJIT_CC", "clang"), ("ARRAYJIT_CHECKED", "1")] {
        let o = arrayjit_env(&["run", f], &[env]);
        assert_eq!(o.code, 0, "{env:?}: {}", o.stderr);
        assert_eq!(o.stdout, compiled.stdout, "{env:?}");
    }
    // Each index is read once and one row copied: no loop over the 100000 rows.
    let c = arrayjit(&["emit-c", f]);
    assert_eq!(c.code, 0, "{}", c.stderr);
    assert!(!c.stdout.contains("99999;"), "{}", c.stdout);
    // One unsigned comparison against the row count per index (the iterator's number
    // depends on how the loops were fused, so only its `_u` suffix is matched).
    assert!(
        c.stdout.contains("_u < UINT64_C(100000)) {"),
        "{}",
        c.stdout
    );
}

const TENSORS: &str = r#"
    {"name": "t", "dims": [4, 3]},
    {"name": "i", "dims": [2], "prec": "byte"},
    {"name": "f", "dims": [2]},
    {"name": "y", "dims": [2, 3]},
    {"name": "z", "dims": [3, 3]}"#;

fn program(stmt: &str) -> String {
    format!(
        r#"{{"tensors": [{TENSORS}], "routines": [{{"name": "r", "code": [{stmt}]}}],
            "run": [{{"routine": "r"}}], "print": ["y"]}}"#
    )
}

#[test]
fn gather_errors_name_the_tensors() {
    let e = run_err(&program(r#"{"gather": "y", "from": "t", "index": "f"}"#));
    assert!(
        e.contains("gather into y: index tensor f has precision single, but an index needs an integer precision"),
        "{e}"
    );
    let e = run_err(&program(r#"{"gather": "z", "from": "t", "index": "i"}"#));
    assert!(
        e.contains("gather into z: z has dims [3, 3], but index i (dims [2]) followed by the row dims [3] of table t (dims [4, 3]) give [2, 3]"),
        "{e}"
    );
    let e = run_err(&program(
        r#"{"scatter_add": "t", "from": "z", "index": "i"}"#,
    ));
    assert!(e.contains("scatter_add into t: z has dims [3, 3]"), "{e}");
    let e = run_err(&program(r#"{"gather": "y", "from": "t"}"#));
    assert!(e.contains("missing field \"index\""), "{e}");
    let e = run_err(&program(r#"{"gather": "y", "from": "nope", "index": "i"}"#));
    assert!(e.contains("unknown tensor \"nope\""), "{e}");
    let e = run_err(&program(
        r#"{"gather": "y", "from": "t", "index": "i", "op": "add"}"#,
    ));
    assert!(
        e.contains("field \"op\" does not belong in a gather"),
        "{e}"
    );
}

#[test]
fn ternary_and_random_errors() {
    let e = run_err(&program(
        r#"{"assign": "y", "op": "where", "args": ["y", "y"]}"#,
    ));
    assert!(
        e.contains(
            "wrong arity: operation \"where\" is ternary, but the assignment has 2 arguments"
        ),
        "{e}"
    );
    let e = run_err(&program(
        r#"{"assign": "y", "op": "add", "args": ["y", "y", "y"]}"#,
    ));
    assert!(
        e.contains("unknown ternary operation \"add\" (ternary operations: "),
        "{e}"
    );
    let e = run_err(&program(r#"{"fetch": "y", "random": {"seed": -1}}"#));
    assert!(
        e.contains("invalid value: integer \"-1\", expected u64"),
        "{e}"
    );
    let e = run_err(&program(r#"{"fetch": "y", "random": {"sed": 1}}"#));
    assert!(
        e.contains("unknown field \"sed\", expected \"seed\""),
        "{e}"
    );
}

/// The random fetch gives the same values on any device of any device count, and when the
/// tensor is only read through its transpose (inlined into the consumer).
/// A constant fetch stores its constant exactly as written, as `values` do: an int64 above
/// 2^53 keeps every digit, the uint64 2^64-1 stays 2^64-1 (through a double it was 2^64,
/// which wraps to 0), -2^31-1 wraps to 2^31-1 in an int32, 300.7 into a byte is 44, a
/// bfloat16 constant rounds once, from the decimal (1.00390625000001 is above the midpoint
/// of 1 and 1.0078125, so 1.0078125; through a float it tied to 1), and "-inf" is accepted
/// as in `values`. Found by scripts/conformance.py.
#[test]
fn constant_fetches_are_exact() {
    let prog = r#"{"tensors": [
        {"name": "a", "dims": [2], "prec": "int64"},
        {"name": "b", "dims": [1], "prec": "uint64"},
        {"name": "e", "dims": [1], "prec": "int32"},
        {"name": "c", "dims": [1], "prec": "byte"},
        {"name": "d", "dims": [1], "prec": "bfloat16"},
        {"name": "f", "dims": [1], "prec": "half"}],
      "routines": [{"name": "r", "code": [
        {"fetch": "a", "constant": 9007199254740993},
        {"fetch": "b", "constant": 18446744073709551615},
        {"fetch": "e", "constant": -2147483649},
        {"fetch": "c", "constant": 300.7},
        {"fetch": "d", "constant": 1.00390625000001},
        {"fetch": "f", "constant": "-inf"}]}],
      "run": [{"routine": "r"}], "print": ["a", "b", "e", "c", "d", "f"]}"#;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.json");
    std::fs::write(&p, prog).unwrap();
    let out = run_both(&p);
    let text = |k: &str| out[k]["values"].to_string();
    assert_eq!(text("a"), "[9007199254740993,9007199254740993]");
    assert_eq!(text("b"), "[18446744073709551615]");
    assert_eq!(text("e"), "[2147483647]");
    assert_eq!(text("c"), "[44]");
    assert_eq!(values(&out, "d"), vec![1.0078125]);
    assert_eq!(text("f"), "[\"-inf\"]");
}

#[test]
fn random_fetch_is_the_same_on_every_device() {
    let dir = tempfile::tempdir().unwrap();
    let prog = |devices: usize, device: usize| {
        let run = if device == 0 {
            r#"[{"routine": "r", "device": 0}, {"await": "all"}]"#.to_string()
        } else {
            format!(
                r#"[{{"routine": "r", "device": {device}}},
                    {{"copy": "noise", "from": {device}, "to": 0}},
                    {{"copy": "y", "from": {device}, "to": 0}}, {{"await": "all"}}]"#
            )
        };
        format!(
            r#"{{"devices": {devices}, "backend": "multicore",
              "tensors": [{{"name": "noise", "dims": [3, 5], "prec": "half"}},
                          {{"name": "y", "dims": [5, 3], "prec": "half"}}],
              "routines": [{{"name": "r", "code": [
                {{"fetch": "noise", "random": {{"seed": 12345}}}},
                {{"assign": "y", "op": "identity", "args": ["noise"], "logic": "ij->ji"}}]}}],
              "run": {run}, "print": ["noise", "y"]}}"#
        )
    };
    let want: Vec<f64> = (0..15)
        .map(|o| {
            let exact = word(12345, o) as f64 / 4294967296.0;
            let h = half::f16::from_f64(exact);
            if h.to_f64() > exact {
                half::f16::from_bits(h.to_bits() - 1).to_f64()
            } else {
                h.to_f64()
            }
        })
        .collect();
    let transposed: Vec<f64> = (0..15).map(|k| want[(k % 3) * 5 + k / 3]).collect();
    for (devices, device) in [(1, 0), (3, 2), (2, 1)] {
        let p = dir.path().join(format!("p{devices}_{device}.json"));
        std::fs::write(&p, prog(devices, device)).unwrap();
        let out = run_both(&p);
        // Halves print as their shortest decimal: read them back as halves.
        let halves = |v: Vec<f64>| -> Vec<f64> {
            v.iter().map(|&x| half::f16::from_f64(x).to_f64()).collect()
        };
        let what = format!("{devices} devices, device {device}");
        assert_eq!(halves(values(&out, "noise")), want, "{what}");
        assert_eq!(halves(values(&out, "y")), transposed, "{what}");
    }
}
