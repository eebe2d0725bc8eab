//! Inputs at the edges of what a program may ask for: results that alias their arguments,
//! indices and offsets beyond 32 bits, many local arrays, very long routines.

mod common;

use arrayjit::ir::*;
use common::*;
use serde_json::{json, Value};
use std::process::Command;

#[test]
fn in_place_transpose_reads_the_old_values() {
    let b = Bindings::empty();
    let m = input(
        "m",
        &[3, 3],
        Prec::Single,
        &[1., 2., 3., 4., 5., 6., 7., 8., 9.],
    );
    let asg = unop(&m, Binop::Arg2, false, Unop::Identity, &m, "ij->ji", &b);
    let (got, _) = compute(&asg, &b, &[&m]);
    assert_eq!(got[0], vec![1., 4., 7., 2., 5., 8., 3., 6., 9.]);
    // The interpreter agrees.
    let m2 = input(
        "m",
        &[3, 3],
        Prec::Single,
        &[1., 2., 3., 4., 5., 6., 7., 8., 9.],
    );
    let asg = unop(&m2, Binop::Arg2, false, Unop::Identity, &m2, "ij->ji", &b);
    let mut mem = arrayjit::interp::Memory::new();
    mem.load_from_hosts(&asg.nodes());
    arrayjit::interp::run_assignments(&asg, &[], &mut mem).unwrap();
    assert_eq!(mem.get(&m2).unwrap(), &[1., 4., 7., 2., 5., 8., 3., 6., 9.]);
}

#[test]
fn in_place_matmul_uses_the_old_matrix() {
    let b = Bindings::empty();
    // a = a @ w, and a = a @ a: by hand.
    let a = input("a", &[2, 2], Prec::Double, &[1., 2., 3., 4.]);
    let w = input("w", &[2, 2], Prec::Double, &[0., 1., 1., 0.]);
    let asg = binop(&a, Binop::Add, true, Binop::Mul, &a, &w, "ij,jk->ik", &b);
    let (got, _) = compute(&asg, &b, &[&a]);
    assert_eq!(got[0], vec![2., 1., 4., 3.]);
    let a = input("a", &[2, 2], Prec::Single, &[1., 2., 3., 4.]);
    let asg = binop(&a, Binop::Add, true, Binop::Mul, &a, &a, "ij,jk->ik", &b);
    let (got, src) = compute(&asg, &b, &[&a]);
    assert_eq!(got[0], vec![7., 10., 15., 22.]);
    assert!(src.contains("a_old"), "{src}");
    // A pointwise in-place update still reads the cell it writes, without a snapshot.
    let v = input("v", &[3], Prec::Single, &[1., 2., 3.]);
    let asg = binop(&v, Binop::Arg2, false, Binop::Mul, &v, &v, "i,i->i", &b);
    let (got, src) = compute(&asg, &b, &[&v]);
    assert_eq!(got[0], vec![1., 4., 9.]);
    assert!(!src.contains("v_old"), "{src}");
}

/// A byte tensor of 65536 x 32769 cells (just over 2^31) is indexed past 2^31 through a static
/// index: with 32-bit offsets this was undefined behaviour (a crash). Untouched pages of the
/// zero-filled buffer are never materialized, so this costs almost no memory.
#[test]
fn offsets_beyond_two_to_the_31() {
    let s = StaticSymbol::new("row", Some(65536));
    let b = Bindings(vec![s.clone()]);
    let big = on_device("big", &[65536, 32769], Prec::Byte);
    let c = input("c", &[32769], Prec::Byte, &vec![7.0; 32769]);
    let row = output("row", &[32769], Prec::Byte);
    let asg = Assignments::seq([
        unop(
            &big,
            Binop::Arg2,
            false,
            Unop::Identity,
            &c,
            "j->{row}j",
            &b,
        ),
        unop(
            &row,
            Binop::Arg2,
            false,
            Unop::Identity,
            &big,
            "{row}j->j",
            &b,
        ),
    ]);
    let backend = arrayjit::backend::CcBackend::new();
    let (r, src) = build(&backend, "big", &b, &asg).unwrap();
    assert!(src.contains("int64_t row_"), "{src}");
    r.bindings().set("row", 65535).unwrap();
    let got = run_and_read(&backend, &r, &[&row]);
    assert!(got[0].iter().all(|&v| v == 7.0));
}

#[test]
fn static_index_values_beyond_int_max() {
    let s = StaticSymbol::new("step", Some(5_000_000_000));
    let b = Bindings(vec![s.clone()]);
    let y = output("y", &[1], Prec::Double);
    let asg = Assignments::Fetch {
        array: y.clone(),
        fetch_op: FetchOp::EmbedSymbol(s),
    };
    let backend = arrayjit::backend::CcBackend::new();
    let (r, _) = build(&backend, "embed", &b, &asg).unwrap();
    r.bindings().set("step", 4_000_000_000).unwrap();
    assert_eq!(run_and_read(&backend, &r, &[&y])[0], vec![4e9]);
    // Out of its range: an error before anything runs.
    assert!(matches!(
        r.bindings().set("step", 5_000_000_000),
        Err(arrayjit::Error::BindingOutOfRange { .. })
    ));
}

#[test]
fn absurd_sizes_are_errors() {
    let e = Tnode::new(&["huge"], &[1 << 40, 1 << 40], Prec::Single).unwrap_err();
    assert!(
        e.to_string().contains("huge") && e.to_string().contains("too large"),
        "{e}"
    );
    let e = Tnode::new(&["h2"], &[usize::MAX / 2, 3], Prec::Byte).unwrap_err();
    assert!(e.to_string().contains("h2"), "{e}");
}

/// Runs `arrayjit run` on a program (with a bound on its time) and returns its JSON output.
fn run_program(prog: &Value, secs: u64) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("p.json");
    std::fs::write(&f, serde_json::to_string(prog).unwrap()).unwrap();
    let out = Command::new("timeout")
        .arg(secs.to_string())
        .arg(env!("CARGO_BIN_EXE_arrayjit"))
        .arg("run")
        .arg(&f)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "status {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A thousand 16 KiB local arrays in one routine (16 MB, far more than any stack), on the
/// calling thread and on multicore device workers.
#[test]
fn many_local_arrays_fit_any_stack() {
    let n = 1000;
    let mut tensors = vec![
        json!({"name": "x", "dims": [4096], "init": "range"}),
        json!({"name": "y", "dims": [4096]}),
    ];
    let mut code = vec![];
    for k in 0..n {
        let t = format!("t{k}");
        tensors.push(json!({"name": t, "dims": [4096], "memory": "local"}));
        code.push(json!({"assign": t, "op": "add", "args": ["x", "x"]}));
    }
    for k in 0..n {
        code.push(
            json!({"assign": "y", "accum": "add", "op": "identity", "args": [format!("t{k}")]}),
        );
    }
    let want: Vec<f64> = (0..4096).map(|i| (2 * i * n) as f64).collect();
    for devices in [None, Some(2)] {
        let mut prog = json!({
            "tensors": tensors,
            "routines": [{"name": "r", "code": code}],
            "run": [{"routine": "r"}],
            "print": ["y"]
        });
        if let Some(d) = devices {
            prog["devices"] = json!(d);
            prog["run"] = json!([{"routine": "r", "device": 1}, {"await": "all"},
                                 {"copy": "y", "from": 1, "to": 0}]);
        }
        let out = run_program(&prog, 600);
        let got: Vec<f64> = out["y"]["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(got, want, "devices {devices:?}");
    }
}

/// 100,000 statements in one routine: printed, interpreted and compiled (the routine is
/// split into parts, so compile time grows linearly).
#[test]
fn a_hundred_thousand_statements() {
    let n = 100_000;
    let code: Vec<Value> = (0..n)
        .map(|_| json!({"assign": "x", "op": "add", "args": ["x", "c"]}))
        .collect();
    let prog = json!({
        "tensors": [{"name": "x", "dims": [4], "init": {"values": [1, 2, 3, 4]}},
                    {"name": "c", "dims": [4], "init": {"values": [1, 0.5, 0.25, 0]}}],
        "routines": [{"name": "r", "code": code}],
        "run": [{"routine": "r"}],
        "print": ["x"]
    });
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("p.json");
    std::fs::write(&f, serde_json::to_string(&prog).unwrap()).unwrap();
    let emit = Command::new("timeout")
        .args(["120", env!("CARGO_BIN_EXE_arrayjit"), "emit-c"])
        .arg(&f)
        .output()
        .unwrap();
    assert!(
        emit.status.success(),
        "{}",
        String::from_utf8_lossy(&emit.stderr)
    );
    assert!(emit.stdout.len() > 1_000_000);
    let want = json!([100001, 50002, 25003, 4]);
    let interp = Command::new("timeout")
        .args(["120", env!("CARGO_BIN_EXE_arrayjit"), "run", "--interpret"])
        .arg(&f)
        .output()
        .unwrap();
    assert!(
        interp.status.success(),
        "{}",
        String::from_utf8_lossy(&interp.stderr)
    );
    let v: Value = serde_json::from_slice(&interp.stdout).unwrap();
    assert_eq!(v["x"]["values"], want);
    let v = run_program(&prog, 1500);
    assert_eq!(v["x"]["values"], want);
}

/// `n` chained relus of a 4-element tensor: every intermediate is inlined into one expression.
/// Before, `relu` printed its operand twice (`aj_gate_f($a, $a)`), so the C text doubled with
/// each level: 15 levels made 0.66 MB of C, 30 aborted on a 2.7 GB allocation. Now the C
/// grows linearly with the chain (under 1 kB per level; half chains keep a rounded local
/// per level) and the values are
/// relu's: negatives and zeros give +0, positives pass.
#[test]
fn chained_relus_give_linear_c() {
    for prec in [Prec::Single, Prec::Double, Prec::Half] {
        for n in [30usize, 200] {
            let b = Bindings::empty();
            let x = input("x", &[4], prec, &[-1.5, -0.0, 0.5, 2.0]);
            let out = output("out", &[4], prec);
            let mut prev = x.clone();
            let mut asgns = vec![];
            for k in 0..n {
                let next = if k + 1 == n {
                    out.clone()
                } else {
                    temp(&format!("r{k}"), &[4], prec)
                };
                asgns.push(unop(
                    &next,
                    Binop::Arg2,
                    false,
                    Unop::Relu,
                    &prev,
                    "i->i",
                    &b,
                ));
                prev = next;
            }
            let (got, src) = compute(&Assignments::seq(asgns), &b, &[&out]);
            assert_eq!(got[0], vec![0.0, 0.0, 0.5, 2.0], "{n} relus [{prec}]");
            assert!(
                got[0][..2].iter().all(|v| v.is_sign_positive()),
                "{n} relus [{prec}]: {:?}",
                got[0]
            );
            assert!(
                src.len() < 4000 + 1000 * n,
                "{n} relus [{prec}]: {} bytes of C",
                src.len()
            );
        }
    }
}

/// A sum over every cell of a range-filled tensor of high rank and small extents, against
/// its closed form `n (n - 1) / 2`. Tracing walked every combination of the first iterations
/// of every loop (2^20 points for rank 20 with extent 2; a rank-24 one ran out of memory after
/// 35 s); its sampling is now bounded per loop nest, which the counter of traced points shows.
#[test]
fn sums_over_high_rank_tensors() {
    use arrayjit::optimize::{optimize, Settings};
    let letters = "abcdefghijklmnopqrstuvwxyz";
    for dims in [vec![2usize; 20], vec![2; 24], vec![5; 9]] {
        let b = Bindings::empty();
        let x = Tnode::with_init(&["x"], &dims, Prec::Single, &InitOp::RangeOverOffsets).unwrap();
        let s = output("s", &[1], Prec::Double);
        let spec = format!("{}->0", &letters[..dims.len()]);
        let asg = unop(&s, Binop::Add, true, Unop::Identity, &x, &spec, &b);
        let settings = Settings::default();
        let o = optimize("sum", arrayjit::lower::lower(&asg).unwrap(), &settings).unwrap();
        let points = o.traced_store.points();
        assert!(
            points <= 4 * settings.max_tracing_points,
            "{dims:?}: {points} points traced"
        );
        let n: u64 = dims.iter().map(|&d| d as u64).product();
        let (got, _) = compute(&asg, &b, &[&s]);
        assert_eq!(got[0], vec![(n * (n - 1) / 2) as f64], "{dims:?}");
    }
}

/// A value read twice per cell at every level (`t_k = t_{k-1} * t_{k-1}`), with the optimizer
/// allowed to inline nodes however often they are read: each read is a separate copy of the
/// inlined computation, so the copies double with each level, and the inlining budget (work
/// per read, counting nested inlined computations) must stop them. 30 levels stay small and
/// give the squares computed by hand.
#[test]
fn inlined_values_read_twice_per_level_stay_small() {
    use arrayjit::backend::CcBackend;
    use arrayjit::optimize::Settings;
    let n = 30;
    let b = Bindings::empty();
    let x = input("x", &[4], Prec::Single, &[1.0, -1.0, 0.0, -0.0]);
    let out = output("out", &[4], Prec::Single);
    let mut prev = x.clone();
    let mut asgns = vec![];
    for k in 0..n {
        let next = if k + 1 == n {
            out.clone()
        } else {
            temp(&format!("t{k}"), &[4], Prec::Single)
        };
        asgns.push(binop(
            &next,
            Binop::Arg2,
            false,
            Binop::Mul,
            &prev,
            &prev,
            "i,i->i",
            &b,
        ));
        prev = next;
    }
    let backend = CcBackend::with_settings(Settings::default().max_visits(usize::MAX));
    let (r, src) = build(&backend, "squares", &b, &Assignments::seq(asgns)).unwrap();
    let got = run_and_read(&backend, &r, &[&out]);
    assert_eq!(got[0], vec![1.0, 1.0, 0.0, 0.0]);
    assert!(src.len() < 4000 + 1000 * n, "{} bytes of C", src.len());
}

/// Tracing's budget changes what it walks, never what it decides: with a budget of a single
/// point, broadcast reads deep in a rank-7 nest still count the visits of the full walk (so
/// the broadcast operand is not inlined), and transposed reads of a computed node still
/// find it written, exactly as without a budget.
#[test]
fn tracing_budget_keeps_the_decisions() {
    use arrayjit::optimize::{optimize, Settings};
    let b = Bindings::empty();
    let d7 = [5usize; 7];
    let x = output("x", &d7, Prec::Single);
    let v = output("v", &[5], Prec::Single);
    let y = temp("y", &[5], Prec::Single);
    let t = temp("t", &d7, Prec::Single);
    let u = temp("u", &d7, Prec::Single);
    let z = output("z", &d7, Prec::Single);
    let s = output("s", &[1], Prec::Single);
    let cases = [
        // y[g] read at every (a..f): 5^6 times per cell.
        Assignments::seq([
            unop(&y, Binop::Arg2, false, Unop::Relu, &v, "a->a", &b),
            binop(
                &z,
                Binop::Arg2,
                false,
                Binop::Mul,
                &y,
                &x,
                "g,abcdefg->abcdefg",
                &b,
            ),
        ]),
        // t written in full, read transposed; u summed.
        Assignments::seq([
            unop(
                &t,
                Binop::Arg2,
                false,
                Unop::Relu,
                &x,
                "abcdefg->abcdefg",
                &b,
            ),
            unop(
                &u,
                Binop::Arg2,
                false,
                Unop::Relu,
                &t,
                "abcdefg->gfedcba",
                &b,
            ),
            unop(&s, Binop::Add, true, Unop::Identity, &u, "abcdefg->0", &b),
        ]),
    ];
    for (k, asg) in cases.iter().enumerate() {
        let decisions = |budget: usize| {
            let settings = Settings::default().max_tracing_points(budget);
            let o = optimize("m", arrayjit::lower::lower(asg).unwrap(), &settings).unwrap();
            let traced: Vec<_> = o
                .traced_store
                .nodes()
                .map(|t| (t.tn.name(), t.read_only, t.is_recurrent, t.max_visits))
                .collect();
            // Nodes by name: the parallel pass makes a fresh partial-sums node per call.
            let nodes: Vec<_> = o
                .nodes
                .iter()
                .map(|(t, m)| (t.name(), format!("{m:?}")))
                .collect();
            (traced, nodes, o.traced_store.points())
        };
        let (full, bounded) = (decisions(usize::MAX), decisions(1));
        assert_eq!(full.0, bounded.0, "case {k}");
        assert_eq!(full.1, bounded.1, "case {k}");
        assert!(bounded.2 <= 4, "case {k}: {} points", bounded.2);
    }
}
