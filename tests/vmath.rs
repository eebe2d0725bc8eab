//! The runtime header's single-precision vector math (`aj_vexp_f32_8`, ...) against libm:
//! `tests/data/vmath_sweep.c` evaluates every function at every 97th float bit pattern (both
//! signs, subnormals, infinities, NaNs) with 8-lane vectors, at every 997th with 4 and 16
//! lanes, and at the special values and 64 ulps around each threshold (overflow and underflow
//! of `exp`/`exp2`, the subnormal boundary, the range of the sin/cos reduction, ...) with every
//! width; it compares each lane with double-precision libm. The driver is compiled by the
//! configured C compiler with the configured flags (`ARRAYJIT_CC`, `ARRAYJIT_ARCH_FLAGS`,
//! ...), so the bounds are checked with and without FMA, with GCC and Clang. A wrong special
//! value (NaN, an infinity, a zero or its sign) counts as an error of 1e9 ulp.

use arrayjit::compile::CompilerConfig;
use std::path::Path;
use std::process::Command;

/// The documented bounds (docs/performance.md and the header), in ulp.
const BOUNDS: [(&str, f64); 9] = [
    ("exp", 1.5),
    ("exp2", 1.5),
    ("log", 1.5),
    ("log2", 1.5),
    ("tanh", 3.0),
    ("sigmoid", 3.0),
    ("sin", 1.0),
    ("cos", 1.0),
    ("rsqrt", 1.0),
];

/// The documented bounds of the double-precision functions, in ulp.
const BOUNDS_F64: [(&str, f64); 6] = [
    ("exp_f64", 1.5),
    ("exp2_f64", 1.5),
    ("log_f64", 1.5),
    ("log2_f64", 1.5),
    ("tanh_f64", 3.0),
    ("sigmoid_f64", 3.0),
];

/// Compiles the single-precision driver with the configured compiler and flags into `dir`.
fn build_driver(dir: &Path) -> std::path::PathBuf {
    build("vmath_sweep", dir)
}

/// Compiles `tests/data/NAME.c` with the configured compiler and flags into `dir`.
fn build(name: &str, dir: &Path) -> std::path::PathBuf {
    let cfg = CompilerConfig::from_env().expect("compiler configuration");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = dir.join(name);
    let mut cmd = Command::new(&cfg.compiler);
    cmd.arg(format!("-O{}", cfg.opt_level))
        .args(&cfg.arch_flags)
        .args(&cfg.extra_flags)
        .arg("-std=gnu11")
        .arg(format!("-I{}", root.join("runtime_c").display()))
        .arg(root.join(format!("tests/data/{name}.c")))
        .arg("-o")
        .arg(&exe)
        .arg("-lm");
    let out = cmd.output().expect("the C compiler runs");
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Runs a driver with `args`: `(function, width, max ulp, worst input bits, count)` per line.
fn run(exe: &Path, args: &[String]) -> Vec<(String, u32, f64, String, u64)> {
    let out = Command::new(exe)
        .args(args)
        .output()
        .expect("the driver runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 5, "driver line {l:?}");
            (
                f[0].to_string(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
                f[3].to_string(),
                f[4].parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn vector_math_is_within_its_documented_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build_driver(dir.path());
    // Width 8 densely (mask 2), widths 4 and 16 more sparsely (masks 1 and 4).
    let mut rows = run(&exe, &["97".into(), "2".into()]);
    rows.extend(run(&exe, &["997".into(), (1 | 4).to_string()]));
    assert_eq!(rows.len(), BOUNDS.len() * 3, "{rows:?}");
    let mut failures = vec![];
    for (name, width, worst, bits, count) in &rows {
        let bound = BOUNDS
            .iter()
            .find(|b| b.0 == name)
            .expect("known function")
            .1;
        // Every 97th pattern of 2^32, plus the special values.
        assert!(*count > 4_000_000, "{name} x{width}: only {count} values");
        eprintln!("{name:8} x{width:2}: {worst:.3} ulp (worst at 0x{bits}) over {count} values");
        if *worst > bound {
            failures.push(format!(
                "{name} x{width}: {worst} ulp at 0x{bits} (bound {bound})"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The double-precision family (`aj_vexp_f64_4`, ...) against the long double libm:
/// `tests/data/vmath_sweep_f64.c` evaluates 2^22 bit patterns spread over all doubles with 4
/// lanes (2^19 with 2 and 8), the special values, and 64 ulps around each threshold.
#[test]
fn double_vector_math_is_within_its_documented_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build("vmath_sweep_f64", dir.path());
    let rows = run(&exe, &[(1u64 << 22).to_string()]);
    assert_eq!(rows.len(), BOUNDS_F64.len() * 3, "{rows:?}");
    let mut failures = vec![];
    for (name, width, worst, bits, count) in &rows {
        let bound = BOUNDS_F64.iter().find(|b| b.0 == name).expect("known").1;
        assert!(*count > 500_000, "{name} x{width}: only {count} values");
        eprintln!("{name:12} x{width}: {worst:.3} ulp (worst at 0x{bits}) over {count} values");
        if *worst > bound {
            failures.push(format!(
                "{name} x{width}: {worst} ulp at 0x{bits} (bound {bound})"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Each function at chosen arguments, against values computed here in double (Rust's libm),
/// including the special values the sweep counts as 1e9-ulp errors: the driver's error
/// measure itself is checked by these exact expectations.
#[test]
fn vector_math_special_values() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = CompilerConfig::from_env().expect("compiler configuration");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = dir.path().join("special.c");
    let inputs: [f32; 16] = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e-45,
        89.0,
        -104.0,
        -89.0,
        0.5,
        3.0e20,
        -2.5,
        128.0,
        -150.0,
    ];
    let bits: Vec<String> = inputs
        .iter()
        .map(|x| format!("0x{:08x}u", x.to_bits()))
        .collect();
    let fns = [
        "exp", "exp2", "log", "log2", "tanh", "sigmoid", "sin", "cos", "rsqrt",
    ];
    let mut c = String::from(
        "#define AJ_VMATH_ALL 1\n#include \"arrayjit.h\"\n#include <stdio.h>\nint main(void) {\n",
    );
    c.push_str(&format!(
        "  uint32_t bits[16] = {{{}}};\n  aj_vf32_16 x;\n  memcpy(&x, bits, sizeof x);\n",
        bits.join(", ")
    ));
    for f in fns {
        c.push_str(&format!(
            "  {{ aj_vf32_16 y = aj_v{f}_f32_16(x); uint32_t o[16]; memcpy(o, &y, sizeof o);\n    printf(\"{f}\"); for (int i = 0; i < 16; i++) printf(\" %08x\", o[i]); printf(\"\\n\"); }}\n"
        ));
    }
    c.push_str("  return 0;\n}\n");
    std::fs::write(&src, c).unwrap();
    let exe = dir.path().join("special");
    let out = Command::new(&cfg.compiler)
        .arg(format!("-O{}", cfg.opt_level))
        .args(&cfg.arch_flags)
        .args(&cfg.extra_flags)
        .arg("-std=gnu11")
        .arg(format!("-I{}", root.join("runtime_c").display()))
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .arg("-lm")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let reference = |f: &str, x: f64| -> f64 {
        match f {
            "exp" => x.exp(),
            "exp2" => x.exp2(),
            "log" => x.ln(),
            "log2" => x.log2(),
            "tanh" => x.tanh(),
            "sigmoid" => {
                if x < 0.0 {
                    x.exp() / (1.0 + x.exp())
                } else {
                    1.0 / (1.0 + (-x).exp())
                }
            }
            "sin" => x.sin(),
            "cos" => x.cos(),
            _ => 1.0 / x.sqrt(),
        }
    };
    let mut checked = 0;
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let f = parts.next().unwrap();
        for (x, hex) in inputs.iter().zip(parts) {
            let got = f32::from_bits(u32::from_str_radix(hex, 16).unwrap());
            let want = reference(f, *x as f64);
            let rounded = want as f32;
            let ctx = format!("{f}({x:e}) = {got:e}, libm {want:e}");
            if want.is_nan() {
                assert!(got.is_nan(), "{ctx}");
            } else if rounded.is_infinite() || rounded == 0.0 {
                // Infinities and zeros exactly, with their sign (a result below half the
                // smallest subnormal rounds to zero).
                assert_eq!(got.to_bits(), rounded.to_bits(), "{ctx}");
            } else {
                let ulp = (rounded.abs().next_up() - rounded.abs()) as f64;
                let err = (got as f64 - want).abs() / ulp;
                assert!(err <= 3.0, "{ctx}: {err} ulp");
            }
            checked += 1;
        }
    }
    assert_eq!(checked, fns.len() * inputs.len(), "{text}");
}

/// The reductions' cheaper exact max and min (`AJ_VMAX_ACC` / `AJ_VMIN_ACC`, for an
/// accumulator that holds no NaN): `tests/data/vmax_acc.c` compares every lane, for every
/// accumulator that is not NaN and every operand of a table of special values (NaNs of both
/// signs and several payloads, both zeros, infinities, subnormals) and 200 pseudo-random bit
/// patterns, in every lane position, with 4, 8 and 16 floats and 2, 4 and 8 doubles, with the
/// scalar `aj_max_f` / `aj_min_f` (`aj_max_d` / `aj_min_d`) bit for bit, compiled with the
/// configured compiler and flags.
#[test]
fn accumulator_max_and_min_match_the_scalar_ones_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build("vmax_acc", dir.path());
    let out = Command::new(&exe).output().expect("the driver runs");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().expect("a summary line");
    let f: Vec<u64> = last
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    // Every pair, each in every lane position of each width: about 4 million lanes.
    assert_eq!(f.len(), 2, "{text}");
    assert!(f[0] > 3_000_000, "only {} lanes checked", f[0]);
    assert_eq!(f[1], 0, "{text}");
}

/// The runtime header compiles without a warning (`-Wall -Wextra -Werror`, every vector
/// function family instantiated) with the configured compiler and flags, and on x86-64 for
/// the baseline and an AVX-512 target too: its 16-lane max and min steps, functions
/// returning 64-byte vectors, made GCC warn (`-Wpsabi`) in every compile on AVX2 machines.
#[test]
fn the_runtime_header_compiles_without_warnings() {
    let cfg = CompilerConfig::from_env().expect("compiler configuration");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("h.c");
    std::fs::write(&src, "#include \"arrayjit.h\"\nint aj_unused_h;\n").unwrap();
    let mut targets: Vec<Vec<String>> = vec![cfg.arch_flags.clone()];
    if cfg!(target_arch = "x86_64") {
        targets.push(vec!["-march=x86-64".into()]);
        targets.push(vec!["-march=skylake-avx512".into()]);
    }
    for arch in targets {
        let mut cmd = Command::new(&cfg.compiler);
        cmd.arg("-O2")
            .args(&arch)
            .args(["-Wall", "-Wextra", "-Werror", "-Wno-unused-function"])
            .arg("-DAJ_VMATH_ALL")
            .arg("-std=gnu11")
            .arg(format!("-I{}", root.join("runtime_c").display()))
            .args(["-c", "-o"])
            .arg(dir.path().join("h.o"))
            .arg(&src);
        let out = cmd.output().expect("the C compiler runs");
        assert!(
            out.status.success(),
            "{cmd:?}:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
