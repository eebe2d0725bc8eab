//! Tests for einsum-style projection specs (`arrayjit::ir::einsum::projections`).

use arrayjit::ir::einsum::projections;
use arrayjit::ir::{AxisIndex, Bindings, Projections, StaticSymbol, Symbol};
use arrayjit::Error;

fn no_statics() -> Bindings {
    Bindings::empty()
}

fn ok(spec: &str, lhs: &[usize], rhs: &[&[usize]]) -> Projections {
    projections(spec, lhs, rhs, &no_statics())
        .unwrap_or_else(|e| panic!("spec {spec:?} should parse, got {e}"))
}

/// The error message for a spec that must fail; also checks the error kind and its spec field.
fn err_with(spec: &str, lhs: &[usize], rhs: &[&[usize]], statics: &Bindings) -> String {
    match projections(spec, lhs, rhs, statics) {
        Ok(p) => panic!("spec {spec:?} should fail, got {p:?}"),
        Err(Error::Spec { spec: s, msg }) => {
            assert_eq!(s, spec, "the error carries the spec as written");
            // The Display form mentions the message too.
            let shown = Error::Spec {
                spec: s,
                msg: msg.clone(),
            }
            .to_string();
            assert!(shown.contains(&msg));
            msg
        }
        Err(e) => panic!("spec {spec:?}: expected Error::Spec, got {e:?}"),
    }
}

fn err(spec: &str, lhs: &[usize], rhs: &[&[usize]]) -> String {
    err_with(spec, lhs, rhs, &no_statics())
}

fn assert_contains(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "message {msg:?} should contain {p:?}");
    }
}

fn it(s: Symbol) -> AxisIndex {
    AxisIndex::Iterator(s)
}

/// Product iterators are pairwise distinct and fresh.
fn assert_distinct(p: &Projections) {
    for (a, x) in p.product_iterators.iter().enumerate() {
        for y in &p.product_iterators[a + 1..] {
            assert_ne!(x, y);
        }
    }
    assert_eq!(p.product_space.len(), p.product_iterators.len());
}

// ---------------------------------------------------------------------------------------------
// Correct projections
// ---------------------------------------------------------------------------------------------

#[test]
fn matmul() {
    let p = ok("ij,jk->ik", &[2, 4], &[&[2, 3], &[3, 4]]);
    assert_distinct(&p);
    // Result letters first (i, k), then the reduced letter j.
    assert_eq!(p.product_space, vec![2, 4, 3]);
    let (i, k, j) = (
        p.product_iterators[0],
        p.product_iterators[1],
        p.product_iterators[2],
    );
    assert_eq!(p.project_lhs, vec![it(i), it(k)]);
    assert_eq!(p.project_rhs, vec![vec![it(i), it(j)], vec![it(j), it(k)]]);
    assert!(!p.is_bijective(), "matmul reduces over j");
    assert_eq!(p.lhs_dims, vec![2, 4]);
    assert_eq!(p.rhs_dims, vec![vec![2, 3], vec![3, 4]]);
    assert_eq!(p.debug_info, "ij,jk->ik");
}

#[test]
fn matmul_calls_get_fresh_iterators() {
    let a = ok("ij,jk->ik", &[2, 4], &[&[2, 3], &[3, 4]]);
    let b = ok("ij,jk->ik", &[2, 4], &[&[2, 3], &[3, 4]]);
    for s in &a.product_iterators {
        assert!(!b.product_iterators.contains(s));
    }
}

#[test]
fn transpose() {
    let p = ok("ij->ji", &[3, 2], &[&[2, 3]]);
    assert_distinct(&p);
    // Order of the result term: j then i.
    assert_eq!(p.product_space, vec![3, 2]);
    let (j, i) = (p.product_iterators[0], p.product_iterators[1]);
    assert_eq!(p.project_lhs, vec![it(j), it(i)]);
    assert_eq!(p.project_rhs, vec![vec![it(i), it(j)]]);
    assert!(p.is_bijective());
    assert_eq!(p.rhs_dims, vec![vec![2, 3]]);
}

#[test]
fn whitespace_is_ignored() {
    let p = ok("  i j , j k ->\ti k \n", &[2, 4], &[&[2, 3], &[3, 4]]);
    assert_eq!(p.product_space, vec![2, 4, 3]);
    assert_eq!(p.debug_info, "  i j , j k ->\ti k \n");
}

#[test]
fn uppercase_letters_are_distinct_iterators() {
    let p = ok("iI->Ii", &[3, 2], &[&[2, 3]]);
    assert_eq!(p.product_space, vec![3, 2]);
    let (big, small) = (p.product_iterators[0], p.product_iterators[1]);
    assert_eq!(p.project_lhs, vec![it(big), it(small)]);
    assert_eq!(p.project_rhs, vec![vec![it(small), it(big)]]);
}

#[test]
fn broadcast_argument_axis() {
    let p = ok("ij,ij->ij", &[2, 3], &[&[2, 3], &[1, 3]]);
    assert_distinct(&p);
    assert_eq!(p.product_space, vec![2, 3]);
    let (i, j) = (p.product_iterators[0], p.product_iterators[1]);
    assert_eq!(p.project_lhs, vec![it(i), it(j)]);
    assert_eq!(p.project_rhs[0], vec![it(i), it(j)]);
    assert_eq!(p.project_rhs[1], vec![AxisIndex::Fixed(0), it(j)]);
    assert!(p.is_bijective());
}

#[test]
fn broadcast_into_result() {
    // j appears only in the result: broadcast along it.
    let p = ok("i->ij", &[2, 5], &[&[2]]);
    assert_eq!(p.product_space, vec![2, 5]);
    let (i, j) = (p.product_iterators[0], p.product_iterators[1]);
    assert_eq!(p.project_lhs, vec![it(i), it(j)]);
    assert_eq!(p.project_rhs, vec![vec![it(i)]]);
    assert!(p.is_bijective());
}

#[test]
fn letter_of_extent_one_everywhere_is_not_a_product_axis() {
    let p = ok("ij->ij", &[1, 3], &[&[1, 3]]);
    assert_eq!(p.product_space, vec![3]);
    let j = p.product_iterators[0];
    assert_eq!(p.project_lhs, vec![AxisIndex::Fixed(0), it(j)]);
    assert_eq!(p.project_rhs, vec![vec![AxisIndex::Fixed(0), it(j)]]);
    assert!(p.is_bijective());
}

#[test]
fn scalar_result_and_argument() {
    // A scalar has dims [1]: one entry, a letter or a digit.
    let p = ok("i->0", &[1], &[&[4]]);
    assert_eq!(p.product_space, vec![4]);
    assert_eq!(p.project_lhs, vec![AxisIndex::Fixed(0)]);
    assert_eq!(p.project_rhs, vec![vec![it(p.product_iterators[0])]]);
    assert!(!p.is_bijective());

    let p = ok("a,i->i", &[4], &[&[1], &[4]]);
    assert_eq!(p.product_space, vec![4]);
    let i = p.product_iterators[0];
    assert_eq!(p.project_rhs, vec![vec![AxisIndex::Fixed(0)], vec![it(i)]]);
    assert_eq!(p.project_lhs, vec![it(i)]);
    assert!(p.is_bijective());
}

#[test]
fn reduction_into_broadcast_result_axis() {
    // The result's axis of extent 1 uses Fixed(0); i is reduced over.
    let p = ok("i->i", &[1], &[&[5]]);
    assert_eq!(p.product_space, vec![5]);
    assert_eq!(p.project_lhs, vec![AxisIndex::Fixed(0)]);
    assert!(!p.is_bijective());
}

#[test]
fn reduction() {
    let p = ok("ij->i", &[2], &[&[2, 3]]);
    assert_distinct(&p);
    assert_eq!(p.product_space, vec![2, 3]);
    let (i, j) = (p.product_iterators[0], p.product_iterators[1]);
    assert_eq!(p.project_lhs, vec![it(i)]);
    assert_eq!(p.project_rhs, vec![vec![it(i), it(j)]]);
    assert!(!p.is_bijective());
}

#[test]
fn reduced_letters_in_order_of_first_appearance() {
    let p = ok("iba,cb->i", &[2], &[&[2, 3, 4], &[5, 3]]);
    assert_eq!(p.product_space, vec![2, 3, 4, 5]);
    let [i, b, a, c] = [0, 1, 2, 3].map(|n| p.product_iterators[n]);
    assert_eq!(p.project_rhs[0], vec![it(i), it(b), it(a)]);
    assert_eq!(p.project_rhs[1], vec![it(c), it(b)]);
}

#[test]
fn repeated_letter_takes_diagonal() {
    let p = ok("ii->i", &[3], &[&[3, 3]]);
    assert_eq!(p.product_space, vec![3]);
    let i = p.product_iterators[0];
    assert_eq!(p.project_rhs, vec![vec![it(i), it(i)]]);
    assert!(p.is_bijective());
}

#[test]
fn fixed_index_in_result() {
    let p = ok("ij->i0", &[2, 3], &[&[2, 3]]);
    assert_eq!(p.product_space, vec![2, 3]);
    let (i, j) = (p.product_iterators[0], p.product_iterators[1]);
    assert_eq!(p.project_lhs, vec![it(i), AxisIndex::Fixed(0)]);
    assert_eq!(p.project_rhs, vec![vec![it(i), it(j)]]);
    assert!(!p.is_bijective());
}

#[test]
fn fixed_index_in_argument() {
    let p = ok("2j->j", &[4], &[&[3, 4]]);
    assert_eq!(p.product_space, vec![4]);
    let j = p.product_iterators[0];
    assert_eq!(p.project_lhs, vec![it(j)]);
    assert_eq!(p.project_rhs, vec![vec![AxisIndex::Fixed(2), it(j)]]);
    assert!(p.is_bijective());
}

#[test]
fn consecutive_digits_are_separate_axes() {
    let p = ok("12->0", &[1], &[&[2, 3]]);
    assert_eq!(
        p.project_rhs,
        vec![vec![AxisIndex::Fixed(1), AxisIndex::Fixed(2)]]
    );
    assert!(p.product_space.is_empty());
    assert!(p.is_bijective());
}

#[test]
fn static_index() {
    let row = StaticSymbol::new("row", Some(3));
    let statics = Bindings(vec![StaticSymbol::new("other", None), row.clone()]);
    let p = projections("{row}j->j", &[4], &[&[3, 4]], &statics).unwrap();
    assert_eq!(p.product_space, vec![4]);
    let j = p.product_iterators[0];
    assert!(!p.product_iterators.contains(&row.symbol));
    assert_eq!(p.project_lhs, vec![it(j)]);
    assert_eq!(p.project_rhs, vec![vec![it(row.symbol), it(j)]]);
    assert!(p.is_bijective());
}

#[test]
fn static_index_without_range_and_with_spaces() {
    let b = StaticSymbol::new("batch", None);
    let statics = Bindings(vec![b.clone()]);
    let p = projections("{ batch } i -> i", &[5], &[&[100, 5]], &statics).unwrap();
    assert_eq!(
        p.project_rhs,
        vec![vec![it(b.symbol), it(p.product_iterators[0])]]
    );
}

#[test]
fn static_index_in_result() {
    let s = StaticSymbol::new("t", Some(2));
    let statics = Bindings(vec![s.clone()]);
    let p = projections("i->{t}i", &[2, 3], &[&[3]], &statics).unwrap();
    let i = p.product_iterators[0];
    assert_eq!(p.project_lhs, vec![it(s.symbol), it(i)]);
    assert!(p.is_bijective());
}

#[test]
fn static_range_equal_to_dim_is_fine() {
    let statics = Bindings(vec![StaticSymbol::new("row", Some(3))]);
    assert!(projections("{row}->0", &[1], &[&[3]], &statics).is_ok());
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

#[test]
fn wrong_arity() {
    let m = err("ij->ji", &[3, 2], &[&[2, 3], &[2, 3]]);
    assert_contains(&m, &["expected 2 arguments, spec has 1"]);
    let m = err("ij,jk->ik", &[2, 4], &[&[2, 3]]);
    assert_contains(&m, &["expected 1 arguments, spec has 2"]);
    let m = err("->", &[1], &[]);
    assert_contains(&m, &["expected 0 arguments, spec has 1"]);
}

#[test]
fn extent_mismatch() {
    let m = err("ij,jk->ik", &[2, 4], &[&[2, 3], &[5, 4]]);
    assert_contains(&m, &["'j'", "3", "5", "argument 1", "argument 2"]);
    let m = err("ij->ij", &[2, 7], &[&[2, 3]]);
    assert_contains(&m, &["'j'", "3", "7", "argument 1", "the result"]);
    let m = err("ii->i", &[3], &[&[3, 4]]);
    assert_contains(&m, &["'i'", "3", "4"]);
}

#[test]
fn wrong_number_of_axes() {
    let m = err("ij,ij->ij", &[2, 3], &[&[2, 3], &[3]]);
    assert_eq!(
        m,
        "term 'ij' of argument 2 has 2 axes but its dims [3] have 1"
    );
    let m = err("ij->ijk", &[2, 3], &[&[2, 3]]);
    assert_contains(&m, &["'ijk'", "the result", "3 axes", "[2, 3]", "have 2"]);
    let m = err("->i", &[3], &[&[3]]);
    assert_contains(&m, &["argument 1", "0 axes", "[3]"]);
    let m = err("{s}i->i", &[3], &[&[3]]);
    // Counted before static names are resolved, so this is about axes.
    assert_contains(&m, &["argument 1", "2 axes"]);
}

#[test]
fn unknown_static_name() {
    let statics = Bindings(vec![StaticSymbol::new("row", None)]);
    let m = err_with("{col}j->j", &[4], &[&[3, 4]], &statics);
    assert_contains(&m, &["col", "unknown", "row"]);
    let m = err("{row}->0", &[1], &[&[3]]);
    assert_contains(&m, &["row", "unknown"]);
}

#[test]
fn malformed_braces() {
    let m = err("{}j->j", &[4], &[&[3, 4]]);
    assert_contains(&m, &["empty", "position 0"]);
    let m = err("{ }j->j", &[4], &[&[3, 4]]);
    assert_contains(&m, &["empty"]);
    let m = err("{rowj->j", &[4], &[&[3, 4]]);
    assert_contains(&m, &["unterminated", "position 0"]);
    let m = err("i{a{b}->i", &[3], &[&[3, 1]]);
    assert_contains(&m, &["position 3", "'{'"]);
    let m = err("i}->i", &[3], &[&[3]]);
    assert_contains(&m, &["'}'", "position 1"]);
}

#[test]
fn bad_character() {
    let m = err("ij,j_->ik", &[2, 4], &[&[2, 3], &[3, 4]]);
    assert_contains(&m, &["'_'", "position 4"]);
    let m = err("ij->jé", &[3, 2], &[&[2, 3]]);
    assert_contains(&m, &["'é'", "position 5"]);
    let m = err("i-j->i", &[3], &[&[3, 3]]);
    assert_contains(&m, &["'-'", "position 1"]);
    let m = err("i>i", &[3], &[&[3]]);
    assert_contains(&m, &["'>'", "position 1"]);
    let m = err("i\0->i", &[3], &[&[3]]);
    assert_contains(&m, &["position 1"]);
    // Non-ASCII digits and letters are not entries.
    let m = err("٣->0", &[1], &[&[3]]);
    assert_contains(&m, &["'٣'", "position 0"]);
}

#[test]
fn missing_or_repeated_arrow() {
    let m = err("ij", &[2, 3], &[&[2, 3]]);
    assert_contains(&m, &["missing '->'"]);
    let m = err("", &[1], &[&[1]]);
    assert_contains(&m, &["missing '->'"]);
    let m = err("i->i->i", &[3], &[&[3]]);
    assert_contains(&m, &["'->'", "more than once", "1", "4"]);
    let m = err("i->i,i", &[3], &[&[3]]);
    assert_contains(&m, &["single term", "position 4"]);
}

#[test]
fn fixed_index_out_of_range() {
    let m = err("3j->j", &[4], &[&[3, 4]]);
    assert_contains(
        &m,
        &["fixed index 3", "axis 0", "argument 1", "extent is 3"],
    );
    let m = err("ij->i1", &[2, 1], &[&[2, 3]]);
    assert_contains(&m, &["fixed index 1", "axis 1", "the result", "'i1'"]);
}

#[test]
fn static_range_exceeds_dim() {
    let statics = Bindings(vec![StaticSymbol::new("row", Some(5))]);
    let m = err_with("{row}j->j", &[4], &[&[3, 4]], &statics);
    assert_contains(
        &m,
        &["'row'", "range 5", "extent 3", "axis 0", "argument 1"],
    );
    let m = err_with("i->i{row}", &[3, 4], &[&[3]], &statics);
    assert_contains(&m, &["'row'", "axis 1", "the result"]);
}

#[test]
fn errors_never_depend_on_statics_being_used() {
    // A static that is bound but unused is fine.
    let statics = Bindings(vec![StaticSymbol::new("row", Some(100))]);
    assert!(projections("i->i", &[3], &[&[3]], &statics).is_ok());
}

// ---------------------------------------------------------------------------------------------
// Robustness
// ---------------------------------------------------------------------------------------------

struct Lcg(u64);

impl Lcg {
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

#[test]
fn random_specs_never_panic() {
    let mut rng = Lcg(0x5eed);
    let statics = Bindings(vec![
        StaticSymbol::new("row", Some(2)),
        StaticSymbol::new("b", None),
        StaticSymbol::new("big", Some(1000)),
    ]);
    // Characters that matter to the grammar, plus a few that do not.
    let alphabet: Vec<char> = "ijkIJ0129 ,->{}rowb{}é٣\0\t_()+*-".chars().collect();
    for case in 0..600 {
        let spec: String = if case % 2 == 0 {
            // Raw bytes, decoded lossily (so invalid UTF-8 becomes U+FFFD).
            let len = rng.below(24);
            let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        } else {
            let len = rng.below(16);
            (0..len)
                .map(|_| alphabet[rng.below(alphabet.len())])
                .collect()
        };
        let num_args = rng.below(4);
        let dims =
            |rng: &mut Lcg| -> Vec<usize> { (0..rng.below(4)).map(|_| rng.below(5)).collect() };
        let lhs = dims(&mut rng);
        let rhs: Vec<Vec<usize>> = (0..num_args).map(|_| dims(&mut rng)).collect();
        let rhs_refs: Vec<&[usize]> = rhs.iter().map(|d| d.as_slice()).collect();
        let result = std::panic::catch_unwind(|| projections(&spec, &lhs, &rhs_refs, &statics));
        match result {
            Err(_) => panic!("projections panicked on spec {spec:?}, lhs {lhs:?}, rhs {rhs:?}"),
            Ok(Ok(p)) => {
                check_consistent(&p, &lhs, &rhs);
            }
            Ok(Err(Error::Spec { spec: s, msg })) => {
                assert_eq!(s, spec);
                assert!(!msg.is_empty());
            }
            // A malformed affine entry `( ... )` (SPEC 9.3).
            Ok(Err(Error::SpecEntry { spec: s, msg, .. })) => {
                assert_eq!(s, spec);
                assert!(!msg.is_empty());
            }
            Ok(Err(e)) => panic!("unexpected error kind for {spec:?}: {e:?}"),
        }
    }
}

#[test]
fn random_valid_specs_are_consistent() {
    // Build specs that are valid by construction and check the projections' invariants.
    let mut rng = Lcg(42);
    let letters: Vec<char> = "abcdeXY".chars().collect();
    for _ in 0..300 {
        let extent: Vec<usize> = letters.iter().map(|_| 1 + rng.below(4)).collect();
        let term = |rng: &mut Lcg| -> (String, Vec<usize>) {
            let n = 1 + rng.below(3);
            let mut s = String::new();
            let mut dims = vec![];
            for _ in 0..n {
                if rng.below(5) == 0 {
                    s.push('0');
                    dims.push(1 + rng.below(3));
                } else {
                    let l = rng.below(letters.len());
                    s.push(letters[l]);
                    // Sometimes broadcast.
                    dims.push(if rng.below(4) == 0 { 1 } else { extent[l] });
                }
            }
            (s, dims)
        };
        let num_args = 1 + rng.below(2);
        let args: Vec<(String, Vec<usize>)> = (0..num_args).map(|_| term(&mut rng)).collect();
        let (lhs_s, lhs_dims) = term(&mut rng);
        let spec = format!(
            "{}->{}",
            args.iter()
                .map(|(s, _)| s.as_str())
                .collect::<Vec<_>>()
                .join(","),
            lhs_s
        );
        let rhs: Vec<Vec<usize>> = args.iter().map(|(_, d)| d.clone()).collect();
        let rhs_refs: Vec<&[usize]> = rhs.iter().map(|d| d.as_slice()).collect();
        let p = projections(&spec, &lhs_dims, &rhs_refs, &Bindings::empty())
            .unwrap_or_else(|e| panic!("valid spec {spec:?} failed: {e}"));
        check_consistent(&p, &lhs_dims, &rhs);
        // Every letter with a non-1 extent somewhere is a product axis with that extent.
        for (l, &c) in letters.iter().enumerate() {
            let used_non_one = args
                .iter()
                .chain(std::iter::once(&(lhs_s.clone(), lhs_dims.clone())))
                .any(|(s, d)| s.chars().zip(d).any(|(x, &dim)| x == c && dim != 1));
            let found = p.product_space.iter().filter(|&&e| e == extent[l]).count();
            if used_non_one {
                assert!(
                    found >= 1,
                    "{spec:?}: letter {c} missing from product space"
                );
            }
        }
    }
}

/// Invariants every successful result satisfies.
fn check_consistent(p: &Projections, lhs: &[usize], rhs: &[Vec<usize>]) {
    assert_distinct(p);
    assert_eq!(p.lhs_dims, lhs);
    assert_eq!(p.rhs_dims, rhs);
    assert_eq!(p.project_lhs.len(), lhs.len());
    assert_eq!(p.project_rhs.len(), rhs.len());
    let all = std::iter::once((&p.project_lhs, lhs)).chain(
        p.project_rhs
            .iter()
            .zip(rhs)
            .map(|(pr, d)| (pr, d.as_slice())),
    );
    for (proj, dims) in all {
        assert_eq!(proj.len(), dims.len());
        for (idx, &dim) in proj.iter().zip(dims) {
            match idx {
                // Affine entries (SPEC 9.3) are guarded, not bounded by their axis.
                _ if p.affine => {}
                AxisIndex::Fixed(f) => assert!(*f < dim),
                AxisIndex::Iterator(s) => {
                    if let Some(n) = p.product_iterators.iter().position(|x| x == s) {
                        assert_eq!(p.product_space[n], dim, "iterator extent matches the axis");
                        assert_ne!(dim, 1, "axes of extent 1 are never iterated");
                    }
                }
                AxisIndex::Linear(_) => panic!("specs never produce linear indices"),
            }
        }
    }
    // Every product axis is used by some operand, and none has extent 1.
    for (n, s) in p.product_iterators.iter().enumerate() {
        assert_ne!(p.product_space[n], 1);
        let used = p.project_lhs.iter().any(|ix| ix.coef(*s) != 0)
            || p.project_rhs
                .iter()
                .any(|r| r.iter().any(|ix| ix.coef(*s) != 0));
        assert!(used);
    }
}

// ---------------------------------------------------------------------------------------------
// Affine entries (SPEC 9.3)

#[test]
fn affine_entries_become_linear_indices() {
    let p = ok(
        "b(2*h+i-1)(2*w+j-1)c,ijcd->bhwd",
        &[1, 4, 4, 2],
        &[&[1, 8, 8, 3], &[3, 3, 3, 2]],
    );
    assert!(p.affine && !p.affine_result && !p.is_bijective());
    // Result letters first (b has extent 1: not iterated), then i, j, c.
    assert_eq!(p.product_space, vec![4, 4, 2, 3, 3, 3]);
    let [h, w, d, i, j, c] = p.product_iterators[..] else {
        panic!("six product axes")
    };
    assert_eq!(
        p.project_lhs,
        vec![AxisIndex::Fixed(0), it(h), it(w), it(d)]
    );
    let x = &p.project_rhs[0];
    assert_eq!(x[0], AxisIndex::Fixed(0));
    assert_eq!(x[1], AxisIndex::affine(&[(h, 2), (i, 1)], -1).unwrap());
    assert_eq!(x[2], AxisIndex::affine(&[(w, 2), (j, 1)], -1).unwrap());
    assert_eq!(x[3], it(c));
    assert_eq!(x[1].to_string(), format!("{h}*2+{i}-1"));
    // `(i)` alone takes its extent from the argument (concatenation).
    let p = ok("i->(i+4)", &[7], &[&[3]]);
    assert!(p.affine_result && !p.is_bijective());
    assert_eq!(p.product_space, vec![3]);
    let s = p.product_iterators[0];
    assert_eq!(
        p.project_lhs,
        vec![AxisIndex::affine(&[(s, 1)], 4).unwrap()]
    );
    let p = ok("i->(i)", &[7], &[&[4]]);
    assert_eq!(p.product_space, vec![4]);
    assert_eq!(p.project_lhs, vec![it(p.product_iterators[0])]);
    // Whitespace inside entries is ignored; repeated letters add up.
    let p = ok("( 2 * o + k + o - 3 ),k->o", &[5], &[&[9], &[2]]);
    let [o, k] = p.product_iterators[..] else {
        panic!("two product axes")
    };
    assert_eq!(
        p.project_rhs[0][0],
        AxisIndex::affine(&[(o, 3), (k, 1)], -3).unwrap()
    );
}
