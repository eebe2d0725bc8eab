//! Hostile inputs to the `arrayjit` binary (issue 9): every one must get a clear error or the
//! correct result, never a panic, an abort, a hang or a signal.
//!
//! Every run goes through [`arrayjit`], which kills the child after a deadline and fails the
//! test, so a regression to a hang cannot hang the suite; it also asserts that the process
//! exited normally (no signal) and never printed a panic. Expected values are worked out by
//! hand (exact binary fractions) or computed here independently of the library.

use half::f16;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs a command with a deadline; fails the test if it is still running then (after killing
/// it) or if it died from a signal.
fn run_with_deadline(mut cmd: Command, secs: u64, what: &str) -> Out {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the command starts");
    // Drain the pipes on threads so that a large output cannot block the child.
    let mut so = child.stdout.take().expect("piped stdout");
    let mut se = child.stderr.take().expect("piped stderr");
    let out_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = so.read_to_end(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = se.read_to_end(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("waiting for the child") {
            break st;
        }
        if start.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {secs}s (killed)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = String::from_utf8_lossy(&out_t.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&err_t.join().unwrap_or_default()).into_owned();
    let code = status
        .code()
        .unwrap_or_else(|| panic!("{what}: killed by a signal ({status:?}); stderr:\n{stderr}"));
    assert!(
        !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
        "{what}: panicked:\n{stderr}"
    );
    Out {
        code,
        stdout,
        stderr,
    }
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_arrayjit")
}

fn arrayjit(args: &[&str]) -> Out {
    let mut cmd = Command::new(bin());
    cmd.args(args);
    run_with_deadline(cmd, 120, &format!("arrayjit {}", args.join(" ")))
}

/// Runs `arrayjit ARGS` in a shell with `ulimit -v KB` (virtual memory limit).
fn arrayjit_limited(kb: u64, args: &[&str]) -> Out {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("ulimit -v {kb} && exec \"$0\" \"$@\""))
        .arg(bin())
        .args(args);
    run_with_deadline(
        cmd,
        120,
        &format!("ulimit -v {kb}; arrayjit {}", args.join(" ")),
    )
}

struct Dir(tempfile::TempDir);

impl Dir {
    fn new() -> Dir {
        Dir(tempfile::tempdir().expect("a temporary directory"))
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).expect("writing a program");
        p
    }
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// `arrayjit run FILE` (plus flags) must succeed; returns stdout.
fn ok(args: &[&str]) -> String {
    let o = arrayjit(args);
    assert_eq!(o.code, 0, "arrayjit {args:?} failed:\n{}", o.stderr);
    o.stdout
}

/// `arrayjit ARGS` must fail with exit code 1 and one `error: ` line; returns it.
fn err(args: &[&str]) -> String {
    let o = arrayjit(args);
    assert_eq!(
        o.code, 1,
        "arrayjit {args:?}: expected exit 1, got {}:\nstdout {}\nstderr {}",
        o.code, o.stdout, o.stderr
    );
    assert!(o.stderr.starts_with("error: "), "{}", o.stderr);
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    assert!(o.stdout.is_empty(), "{}", o.stdout);
    o.stderr
}

fn assert_has(text: &str, parts: &[&str]) {
    for p in parts {
        assert!(text.contains(p), "{p:?} not in:\n{text}");
    }
}

/// The raw text of the `values` array of the printed tensor `name`.
fn values_text<'a>(stdout: &'a str, name: &str) -> &'a str {
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("\"{name}\":")))
        .unwrap_or_else(|| panic!("{name} not printed:\n{stdout}"));
    let start = line.find("\"values\": [").expect("a values array") + "\"values\": [".len();
    let end = line.rfind("]}").expect("the end of the values");
    &line[start..end]
}

fn tokens(values: &str) -> Vec<&str> {
    values.split(", ").collect()
}

// ---- 1. Every object of the format must be a JSON object ----

#[test]
fn arrays_in_place_of_objects_are_rejected_with_line_and_column() {
    let d = Dir::new();
    let tensor = r#"{"name": "x", "dims": [2]}"#;
    let routine = r#"{"name": "f", "code": [{"assign": "x", "op": "identity", "args": ["x"]}]}"#;
    let cases: Vec<(String, &str)> = vec![
        // The whole program.
        (
            format!("[{{\"tensors\": [{tensor}]}}]"),
            "expected a program (one JSON object)",
        ),
        ("[]".into(), "expected a program"),
        // A tensor declaration (fields in order: name, dims).
        (
            r#"{"tensors": [["x", [2]]], "print": ["x"]}"#.into(),
            "expected a tensor declaration",
        ),
        // A static index.
        (
            r#"{"static_indices": [["row", 3]]}"#.into(),
            "expected a static index declaration",
        ),
        // A routine.
        (
            format!(r#"{{"tensors": [{tensor}], "routines": [["f", []]]}}"#),
            "expected a routine",
        ),
        // A uniform init's parameters.
        (
            r#"{"tensors": [{"name": "x", "dims": [2], "init": {"uniform": [7]}}]}"#.into(),
            "expected {\"seed\": N}",
        ),
        // The init itself.
        (
            r#"{"tensors": [{"name": "x", "dims": [2], "init": [[1, 2], true]}]}"#.into(),
            "expected an init",
        ),
        // A statement.
        (
            format!(
                r#"{{"tensors": [{tensor}], "routines": [{{"name": "f", "code": [["x", "identity", ["x"]]]}}]}}"#
            ),
            "expected a statement",
        ),
        // A run step.
        (
            format!(r#"{{"tensors": [{tensor}], "routines": [{routine}], "run": [["f"]]}}"#),
            "expected a run step",
        ),
        // Bindings.
        (
            format!(
                r#"{{"tensors": [{tensor}], "static_indices": [{{"name": "r"}}], "routines": [{routine}], "run": [{{"routine": "f", "bindings": [["r", 1]]}}]}}"#
            ),
            "expected bindings",
        ),
        // Names must be strings, not serde's externally tagged enum objects.
        (
            r#"{"tensors": [{"name": "x", "dims": [2], "prec": {"double": null}}]}"#.into(),
            "expected a precision name",
        ),
        (
            r#"{"tensors": [{"name": "x", "dims": [2], "memory": {"hosted": null}}]}"#.into(),
            "expected a memory mode",
        ),
        (
            format!(
                r#"{{"devices": 2, "tensors": [{tensor}], "routines": [{routine}], "run": [{{"copy": "x", "from": 1, "to": 0, "merge": {{"copy": null}}}}]}}"#
            ),
            "expected a merge mode",
        ),
    ];
    for (i, (text, expected)) in cases.iter().enumerate() {
        let f = d.write(&format!("p{i}.json"), text);
        for args in [vec!["run", s(&f)], vec!["emit-c", s(&f)]] {
            let e = err(&args);
            assert_has(&e, &[expected, "invalid type"]);
            // FILE:LINE:COL, with a column counted from 1.
            let rest = e
                .strip_prefix(&format!("error: {}:", s(&f)))
                .unwrap_or_else(|| panic!("no FILE: prefix in {e}"));
            let mut parts = rest.splitn(3, ':');
            let line: usize = parts.next().unwrap().parse().expect("a line number");
            let col: usize = parts.next().unwrap().parse().expect("a column number");
            assert!(line >= 1 && col >= 1, "{e}");
        }
    }
    // The object forms of the same things are accepted (and compute the right values).
    let f = d.write(
        "fine.json",
        r#"{"tensors": [{"name": "x", "dims": [2], "prec": "double", "init": {"uniform": {"seed": 7}}},
                        {"name": "y", "dims": [2], "prec": "double", "memory": "hosted"}],
            "static_indices": [{"name": "r", "range": 2}],
            "routines": [{"name": "f", "code": [{"assign": "y", "op": "neg", "args": ["x"]}]}],
            "run": [{"routine": "f", "bindings": {"r": 1}}],
            "print": ["x", "y"]}"#,
    );
    let out = ok(&["run", s(&f)]);
    let x: Vec<f64> = tokens(values_text(&out, "x"))
        .iter()
        .map(|t| t.parse().unwrap())
        .collect();
    let y: Vec<f64> = tokens(values_text(&out, "y"))
        .iter()
        .map(|t| t.parse().unwrap())
        .collect();
    assert_eq!(y, x.iter().map(|v| -v).collect::<Vec<_>>());
}

#[test]
fn an_empty_program_file_points_at_column_1() {
    let d = Dir::new();
    let f = d.write("empty.json", "");
    let e = err(&["run", s(&f)]);
    assert_has(&e, &[&format!("{}:1:1: ", s(&f)), "EOF while parsing"]);
}

// ---- 2. Numbers are read exactly ----

/// Runs a program with one printed tensor `x` of `prec` initialized with `values` (the raw
/// JSON text of the array's elements); returns the printed values' text.
fn printed_values(d: &Dir, name: &str, prec: &str, values: &str) -> String {
    let n = values.split(',').count();
    let f = d.write(
        name,
        &format!(
            r#"{{"tensors": [{{"name": "x", "dims": [{n}], "prec": "{prec}", "init": {{"values": [{values}]}}}}], "print": ["x"]}}"#
        ),
    );
    values_text(&ok(&["run", s(&f)]), "x").to_string()
}

#[test]
fn decimal_values_are_correctly_rounded_to_each_precision() {
    let d = Dir::new();
    // Double: the nearest double to 123456789.12345679 prints as itself.
    let t = printed_values(
        &d,
        "d.json",
        "double",
        "123456789.12345679, 5e-324, 2.4703282292062328e-324",
    );
    assert_eq!(t, "123456789.12345679, 5e-324, 5e-324");
    assert_eq!(
        "123456789.12345679".parse::<f64>().unwrap().to_bits(),
        0x419D6F34547E6B75,
        "the bits worked out by hand"
    );
    // Single, around 2^-150 (the midpoint between 0 and the smallest subnormal 2^-149,
    // printed 1e-45): just above it rounds up; exactly on it ties to even, 0. Through f64 the
    // first would become exactly 2^-150 and tie to 0.
    let above = "7.006492321624085354618647916449580656401309709382578858785341419448955413429303007433190941810607911e-46";
    let exact = "7.00649232162408535461864791644958065640130970938257885878534141944895541342930300743319094181060791015625e-46";
    let below = "7.006492321624085354618646e-46";
    let t = printed_values(
        &d,
        "s.json",
        "single",
        &format!("{above}, {exact}, {below}, 1e-45, 2.8e-45, 3.4028235e38, 3.4028235677973366e38, 3.4028235677973367e38"),
    );
    assert_eq!(
        t,
        "1e-45, 0, 0, 1e-45, 3e-45, 3.4028235e38, 3.4028235e38, \"inf\""
    );
    // Half around 2^-25 (midpoint between 0 and 2^-24, printed 6e-8), 1.5 * 2^-24 (tie to
    // the even 2^-23) and 65520 (the overflow midpoint).
    let t = printed_values(
        &d,
        "h.json",
        "half",
        "2.98023223876953125000000001e-8, 2.98023223876953125e-8, 2.9802322387695312e-8, \
         8.94069671630859375e-8, 8.940696716308594e-8, 8.9406967163085937e-8, \
         65519.99999999999999, 65520, 6e-8",
    );
    assert_eq!(t, "6e-8, 0, 0, 1e-7, 1e-7, 6e-8, 65500, \"inf\", 6e-8");
    // Bytes: the decimal truncated toward zero, then wrapped modulo 256.
    let t = printed_values(
        &d,
        "b.json",
        "byte",
        "255.99999999999999999, -1.5, 300.7, \"nan\", \"inf\", \"-inf\", -256.5, 1e300, 0.9999",
    );
    assert_eq!(t, "255, 255, 44, 0, 0, 0, 0, 0, 0");
    // Beyond the range of double: an error naming the tensor and the value.
    let f = d.write(
        "big.json",
        r#"{"tensors": [{"name": "x", "dims": [2], "prec": "half", "init": {"values": [1, -1e400]}}]}"#,
    );
    assert_has(&err(&["run", s(&f)]), &["-1e400", "out of range"]);
}

/// A small deterministic generator.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0
    }
}

/// Whether `y` (a decimal's nearest f64; printed halves have at most 5 digits, so that is
/// exact enough) is nearest to the half `h` among its neighbours, ties to the even one.
fn half_is_nearest(y: f64, h: f16) -> bool {
    let v = h.to_f64();
    let b = h.to_bits() & 0x7FFF;
    let neighbour = |bb: u16| f16::from_bits((h.to_bits() & 0x8000) | bb).to_f64();
    let mut ok = true;
    for nb in [b.wrapping_sub(1), b + 1] {
        if nb >= 0x7C00 || b == 0 && nb == u16::MAX {
            continue;
        }
        let n = neighbour(nb);
        let (dv, dn) = ((y - v).abs(), (y - n).abs());
        ok &= dv < dn || (dv == dn && b.is_multiple_of(2));
    }
    ok
}

#[test]
fn printed_values_read_back_identically_in_every_precision() {
    let d = Dir::new();
    let mut g = Lcg(2024);
    // Raw bit patterns of every precision, written to files (native byte order) that the
    // first program reads; the printed text is fed back as `init.values`.
    let mut cases: Vec<(&str, usize, Vec<u8>)> = vec![];
    let bytes: Vec<u8> = (0..=255).collect();
    cases.push(("byte", 256, bytes));
    let halves: Vec<u16> = (0..0x7C00u16)
        .step_by(7)
        .flat_map(|b| [b, b | 0x8000])
        .chain([0x7C00, 0xFC00, 1, 0x8001, 0x7BFF, 0x0400, 0x03FF])
        .collect();
    cases.push((
        "half",
        halves.len(),
        halves.iter().flat_map(|h| h.to_ne_bytes()).collect(),
    ));
    let mut singles: Vec<u32> = (0..3000).map(|_| (g.next() >> 32) as u32).collect();
    singles.extend([
        1,
        0x8000_0001,
        0x007F_FFFF,
        0x7F7F_FFFF,
        0x0080_0000,
        0x3F80_0001,
    ]);
    singles.retain(|b| !f32::from_bits(*b).is_nan());
    cases.push((
        "single",
        singles.len(),
        singles.iter().flat_map(|b| b.to_ne_bytes()).collect(),
    ));
    let mut doubles: Vec<u64> = (0..3000).map(|_| g.next()).collect();
    doubles.extend([
        1,
        0x8000_0000_0000_0001,
        0x000F_FFFF_FFFF_FFFF,
        0x7FEF_FFFF_FFFF_FFFF,
    ]);
    doubles
        .extend([123456789.12345679f64, 0.1, 1e-310, 1e23, 9007199254740993.0].map(f64::to_bits));
    doubles.retain(|b| !f64::from_bits(*b).is_nan());
    cases.push((
        "double",
        doubles.len(),
        doubles.iter().flat_map(|b| b.to_ne_bytes()).collect(),
    ));
    for (prec, n, raw) in cases {
        let bin = d.path(&format!("{prec}.bin"));
        std::fs::write(&bin, &raw).unwrap();
        let first = d.write(
            &format!("{prec}1.json"),
            &format!(
                r#"{{"tensors": [{{"name": "x", "dims": [{n}], "prec": "{prec}", "init": {{"file": "{prec}.bin"}}}}], "print": ["x"]}}"#
            ),
        );
        let out1 = ok(&["run", s(&first)]);
        let text1 = values_text(&out1, "x");
        let second = d.write(
            &format!("{prec}2.json"),
            &format!(
                r#"{{"tensors": [{{"name": "x", "dims": [{n}], "prec": "{prec}", "init": {{"values": [{text1}]}}}}], "print": ["x"]}}"#
            ),
        );
        let out2 = ok(&["run", s(&second)]);
        assert_eq!(
            out1, out2,
            "{prec}: printing the printed values changes them"
        );
        // Independently: every printed token denotes the original value.
        let toks = tokens(text1);
        assert_eq!(toks.len(), n);
        let num = |t: &str| -> f64 {
            match t {
                "\"inf\"" => f64::INFINITY,
                "\"-inf\"" => f64::NEG_INFINITY,
                _ => t
                    .parse()
                    .unwrap_or_else(|_| panic!("{prec}: bad token {t}")),
            }
        };
        for (i, t) in toks.iter().enumerate() {
            match prec {
                "byte" => assert_eq!(t.parse::<u32>().unwrap(), i as u32),
                "half" => {
                    let h = f16::from_bits(halves[i]);
                    let y = num(t);
                    if h.is_infinite() {
                        assert_eq!(y, h.to_f64());
                    } else {
                        assert!(
                            half_is_nearest(y, h),
                            "half {:#06x} printed as {t}",
                            halves[i]
                        );
                        assert_eq!(y.is_sign_negative(), h.is_sign_negative(), "{t}");
                    }
                }
                "single" => {
                    let back: f32 = if t.starts_with('"') {
                        num(t) as f32
                    } else {
                        t.parse().unwrap()
                    };
                    assert_eq!(back.to_bits(), singles[i], "{t}");
                }
                _ => assert_eq!(num(t).to_bits(), doubles[i], "{t}"),
            }
        }
    }
}

// ---- 3. File inits ----

#[cfg(unix)]
#[test]
fn file_inits_must_be_regular_files_of_the_exact_size() {
    let d = Dir::new();
    std::fs::write(d.path("short.bin"), [0u8; 12]).unwrap();
    std::fs::write(d.path("right.bin"), 2.5f32.to_ne_bytes().repeat(4)).unwrap();
    std::os::unix::fs::symlink("/dev/zero", d.path("zero_link")).unwrap();
    let fifo = d.path("fifo");
    let have_fifo = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success());
    let prog = |file: &str| {
        d.write(
            "p.json",
            &format!(
                r#"{{"tensors": [{{"name": "weights", "dims": [2, 2], "init": {{"file": "{file}"}}}}], "print": ["weights"]}}"#
            ),
        )
    };
    let mut cases = vec![
        ("/dev/zero", "is not a regular file"),
        ("zero_link", "is not a regular file"),
        (".", "is not a regular file"),
        ("short.bin", "has 12 bytes, but needs exactly 16"),
        ("missing.bin", "No such file"),
    ];
    if have_fifo {
        cases.push(("fifo", "is not a regular file"));
    }
    for (file, msg) in cases {
        let f = prog(file);
        for args in [vec!["run", s(&f)], vec!["run", "--interpret", s(&f)]] {
            let e = err(&args);
            assert_has(&e, &["tensor \"weights\"", file, msg]);
        }
    }
    let f = prog("right.bin");
    assert_eq!(
        values_text(&ok(&["run", s(&f)]), "weights"),
        "2.5, 2.5, 2.5, 2.5"
    );
}

// ---- 4. Allocation failures are errors ----

#[cfg(unix)]
#[test]
fn allocation_failures_under_a_memory_limit_are_errors_naming_the_tensor() {
    let d = Dir::new();
    let limit = 4_000_000; // KiB of virtual memory: about 3.8 GiB.
                           // A 16 GiB hosted tensor (2^31 - 1 doubles): its host array.
    let f = d.write(
        "hosted.json",
        r#"{"tensors": [{"name": "huge", "dims": [2147483647], "prec": "double", "memory": "hosted"}], "print": ["huge"]}"#,
    );
    for args in [vec!["run", s(&f)], vec!["run", "--interpret", s(&f)]] {
        let o = arrayjit_limited(limit, &args);
        assert_eq!(o.code, 1, "{}", o.stderr);
        assert_has(
            &o.stderr,
            &[
                "out of memory",
                "cannot allocate 17179869176 bytes",
                "tensor \"huge\"",
            ],
        );
    }
    // A 4 GiB range init.
    let f = d.write(
        "range.json",
        r#"{"tensors": [{"name": "r", "dims": [1024, 1048576], "init": "range"}], "print": ["r"]}"#,
    );
    let o = arrayjit_limited(limit, &["run", s(&f)]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert_has(
        &o.stderr,
        &["out of memory", "4294967296 bytes", "tensor \"r\""],
    );
    // A 2 GiB tensor that lives only on the device: the compiled run fails on its device
    // buffer, the interpreter (8 bytes per cell) on its values.
    let f = d.write(
        "device.json",
        r#"{"tensors": [{"name": "big", "dims": [536870912], "memory": "on_device"},
                        {"name": "s", "dims": [1]}],
            "routines": [{"name": "f", "code": [
              {"fetch": "big", "constant": 1},
              {"assign": "s", "accum": "add", "init_neutral": true, "op": "identity", "args": ["big"], "logic": "i->0"}]}],
            "run": [{"routine": "f"}],
            "print": ["s"]}"#,
    );
    let o = arrayjit_limited(1_500_000, &["run", s(&f)]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert_has(
        &o.stderr,
        &[
            "out of memory",
            "2147483648 bytes",
            "device buffer of tensor big",
        ],
    );
    let o = arrayjit_limited(limit, &["run", "--interpret", s(&f)]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert_has(
        &o.stderr,
        &[
            "run step 1",
            "out of memory",
            "4294967296 bytes",
            "interpreter's values of tensor big",
        ],
    );
}

#[test]
fn sizes_beyond_the_limits_are_errors_before_allocating() {
    let d = Dir::new();
    for (dims, prec, msg) in [
        ("[4294967296, 4294967296]", "byte", "too large"),
        ("[18446744073709551615, 2]", "double", "too large"),
        ("[3, 0]", "single", "every dim at least 1"),
    ] {
        let f = d.write(
            "p.json",
            &format!(r#"{{"tensors": [{{"name": "t", "dims": {dims}, "prec": "{prec}"}}]}}"#),
        );
        assert_has(&err(&["run", s(&f)]), &["tensor \"t\"", msg]);
    }
}

// ---- 5. bench arguments ----

#[test]
fn absurd_bench_counts_are_usage_errors_naming_the_flag() {
    let d = Dir::new();
    let f = d.write(
        "p.json",
        r#"{"tensors": [{"name": "x", "dims": [2], "init": "range"}, {"name": "y", "dims": [2]}],
            "routines": [{"name": "f", "code": [{"assign": "y", "op": "neg", "args": ["x"]}]}],
            "run": [{"routine": "f"}], "print": ["y"]}"#,
    );
    for (args, flag) in [
        (vec!["--runs", "18446744073709551615"], "--runs"),
        (vec!["--runs", "100000000000"], "--runs"),
        (
            vec!["--warmup", "18446744073709551615", "--runs", "1"],
            "--warmup",
        ),
        (vec!["--runs=1000001"], "--runs"),
        (vec!["--runs", "0"], "--runs"),
        (vec!["--runs", "-1"], "--runs"),
    ] {
        let mut all = vec!["bench", s(&f)];
        all.extend(args);
        let o = arrayjit(&all);
        assert_eq!(o.code, 2, "{all:?}: {}", o.stderr);
        assert!(o.stderr.starts_with("error: "), "{}", o.stderr);
        assert_has(o.stderr.lines().next().unwrap(), &[flag]);
    }
    let out = ok(&["bench", s(&f), "--warmup", "0", "--runs", "3"]);
    assert!(out.contains("\"runs\": 3"), "{out}");
    // Too many executed steps in total: an error naming --runs.
    let f = d.write(
        "many.json",
        r#"{"routines": [{"name": "f", "code": []}],
            "run": [{"repeat": 100000000, "steps": [{"routine": "f"}]}]}"#,
    );
    let e = err(&["bench", s(&f), "--warmup", "3", "--runs", "10"]);
    assert_has(&e, &["--runs 10", "1000000000"]);
}

// ---- 6. Plans that would run forever ----

#[test]
fn repeats_of_nothing_finish_and_huge_plans_are_rejected() {
    let d = Dir::new();
    // x = [1, 2]; each f adds x to acc. The huge repeats of nothing must cost nothing.
    let prog = |devices: &str, run: &str| {
        format!(
            r#"{{{devices}"tensors": [{{"name": "x", "dims": [2], "init": {{"values": [1, 2]}}}},
                               {{"name": "acc", "dims": [2], "memory": "hosted"}}],
                "routines": [{{"name": "f", "code": [{{"assign": "acc", "accum": "add", "op": "identity", "args": ["x"]}}]}}],
                "run": {run}, "print": ["acc"]}}"#
        )
    };
    let nothing = r#"[{"repeat": 9223372036854775807, "steps": []},
                      {"routine": "f"},
                      {"repeat": 9223372036854775807, "steps": [{"repeat": 0, "steps": [{"routine": "f"}]}]},
                      {"repeat": 3, "steps": [{"routine": "f"}, {"repeat": 9223372036854775807, "steps": [{"repeat": 9223372036854775807, "steps": []}]}]}]"#;
    for devices in [
        "",
        r#""devices": 2, "#,
        r#""devices": 2, "backend": "sync", "#,
    ] {
        let f = d.write("nothing.json", &prog(devices, nothing));
        for args in [vec!["run", s(&f)], vec!["run", "--interpret", s(&f)]] {
            // f runs 4 times: acc = 4 * x.
            assert_eq!(values_text(&ok(&args), "acc"), "4, 8", "{devices} {args:?}");
        }
        let f = d.write(
            "big.json",
            &prog(
                devices,
                r#"[{"repeat": 100000, "steps": [{"repeat": 100000, "steps": [{"routine": "f"}]}]}]"#,
            ),
        );
        for args in [
            vec!["run", s(&f)],
            vec!["run", "--interpret", s(&f)],
            vec!["emit-c", s(&f)],
        ] {
            assert_has(
                &err(&args),
                &[
                    "run step 1:",
                    "repeating 100000 steps 100000 times",
                    "1000000000",
                ],
            );
        }
        let f = d.write(
            "overflow.json",
            &prog(
                devices,
                r#"[{"routine": "f"}, {"repeat": 2, "steps": [{"repeat": 9223372036854775807, "steps": [{"routine": "f"}]}]}]"#,
            ),
        );
        assert_has(
            &err(&["run", s(&f)]),
            &[
                "run step 2.1:",
                "repeating 1 step 9223372036854775807 times",
            ],
        );
        // Each repeat is within the limit, together they are not: the step that crosses it.
        let f = d.write(
            "sum.json",
            &prog(
                devices,
                r#"[{"repeat": 600000000, "steps": [{"routine": "f"}]}, {"routine": "f"}, {"repeat": 600000000, "steps": [{"routine": "f"}]}]"#,
            ),
        );
        assert_has(
            &err(&["run", "--interpret", s(&f)]),
            &["run step 3:", "more than 1000000000 steps"],
        );
    }
}

// ---- 7. Host copies of tensors that are not hosted ----

#[test]
fn host_copies_of_tensors_that_are_not_hosted_are_errors() {
    let d = Dir::new();
    let prog = |devices: &str, step: &str| {
        format!(
            r#"{{{devices}"tensors": [{{"name": "x", "dims": [2], "init": "range"}},
                               {{"name": "tmp", "dims": [2]}},
                               {{"name": "dev", "dims": [2], "memory": "on_device"}},
                               {{"name": "y", "dims": [2]}}],
                "routines": [{{"name": "f", "code": [
                  {{"assign": "tmp", "op": "neg", "args": ["x"]}},
                  {{"assign": "dev", "op": "neg", "args": ["tmp"]}},
                  {{"assign": "y", "op": "identity", "args": ["dev"]}}]}}],
                "run": [{{"routine": "f"}}, {step}], "print": ["y"]}}"#
        )
    };
    for devices in ["", r#""devices": 2, "#] {
        for (step, tensor, kind) in [
            (r#"{"to_host": "tmp"}"#, "tmp", "to_host"),
            (r#"{"from_host": "tmp"}"#, "tmp", "from_host"),
            (r#"{"to_host": "dev"}"#, "dev", "to_host"),
            (r#"{"from_host": "dev", "device": 0}"#, "dev", "from_host"),
        ] {
            let f = d.write("p.json", &prog(devices, step));
            for args in [
                vec!["run", s(&f)],
                vec!["run", "--interpret", s(&f)],
                vec!["emit-c", s(&f)],
            ] {
                assert_has(
                    &err(&args),
                    &[
                        "run step 2",
                        &format!("{kind} of tensor \"{tensor}\", which is not hosted"),
                    ],
                );
            }
        }
        // Hosted tensors may be copied: y = x = [0, 1].
        let f = d.write(
            "p.json",
            &prog(devices, r#"{"to_host": "y"}, {"from_host": "x"}"#),
        );
        assert_eq!(values_text(&ok(&["run", s(&f)]), "y"), "0, 1");
    }
}

// ---- 8. Other hostile inputs found on the way ----

#[test]
fn other_hostile_inputs_get_clear_errors() {
    let d = Dir::new();
    let routine = r#"{"name": "f", "code": [{"fetch": "x", "embed_index": "r"}]}"#;
    let cases: Vec<(String, Vec<&str>)> = vec![
        // serde's BTreeMap would keep the last of the repeated keys silently.
        (
            format!(
                r#"{{"tensors": [{{"name": "x", "dims": [1]}}], "static_indices": [{{"name": "r", "range": 4}}], "routines": [{routine}], "run": [{{"routine": "f", "bindings": {{"r": 1, "r": 2}}}}], "print": ["x"]}}"#
            ),
            vec!["run step 1", "static index \"r\" is bound twice"],
        ),
        // A million worker threads.
        (
            r#"{"devices": 1000000}"#.into(),
            vec!["1000000 devices are too many", "1024"],
        ),
        // Values beyond the last cell would be dropped silently.
        (
            r#"{"tensors": [{"name": "x", "dims": [2], "init": {"values": [1, 2, 3], "strict": false}}], "print": ["x"]}"#.into(),
            vec!["tensor \"x\"", "3 values for 2 cells"],
        ),
        // Static index values are checked against the range even when it does not fit in
        // i64 (it used to wrap to -1, rejecting every value).
        (
            r#"{"tensors": [{"name": "x", "dims": [1], "prec": "double"}], "static_indices": [{"name": "r", "range": 18446744073709551615}], "routines": [{"name": "f", "code": [{"fetch": "x", "embed_index": "r"}]}], "run": [{"routine": "f", "bindings": {"r": -1}}], "print": ["x"]}"#.into(),
            vec!["run step 1", "static index \"r\" = -1 is out of range 0..9223372036854775807"],
        ),
    ];
    for (i, (text, parts)) in cases.iter().enumerate() {
        let f = d.write(&format!("o{i}.json"), text);
        for args in [vec!["run", s(&f)], vec!["run", "--interpret", s(&f)]] {
            assert_has(&err(&args), parts);
        }
    }
    // A static index with the largest range, bound beyond i32.
    let f = d.write(
        "wide.json",
        r#"{"tensors": [{"name": "x", "dims": [1], "prec": "double"}], "static_indices": [{"name": "r", "range": 18446744073709551615}], "routines": [{"name": "f", "code": [{"fetch": "x", "embed_index": "r"}]}], "run": [{"routine": "f", "bindings": {"r": 5000000000}}], "print": ["x"]}"#,
    );
    for args in [vec!["run", s(&f)], vec!["run", "--interpret", s(&f)]] {
        assert_eq!(values_text(&ok(&args), "x"), "5000000000");
    }
    // A program file that never ends, or is not text.
    assert_has(
        &err(&["run", "/dev/zero"]),
        &["/dev/zero", "at most 1073741824 bytes"],
    );
    let f = d.path("binary.json");
    std::fs::write(&f, [b'{', 0xFF, b'}']).unwrap();
    assert_has(&err(&["run", s(&f)]), &["not UTF-8", "offset 1"]);
    // Blocks nested beyond the reader's depth limit: one short line that names the place
    // without listing every block.
    let deep = format!(
        r#"{{"tensors": [{{"name": "x", "dims": [1]}}], "routines": [{{"name": "f", "code": [{}{{"fetch": "x", "constant": 1}}{}]}}]}}"#,
        r#"{"comment": "c", "code": ["#.repeat(300),
        "]}".repeat(300)
    );
    let f = d.write("deep.json", &deep);
    let e = err(&["run", s(&f)]);
    assert_has(
        &e,
        &["routine #1", "recursion limit exceeded", "more blocks"],
    );
    assert!(e.len() < 400, "{e}");
}
