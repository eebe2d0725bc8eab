//! The random program generator.

use super::case::{Kind, Op, Program, Shape, Stmt, TSpec};
use super::common;
use super::model::{apply, Est};
use arrayjit::ir::einsum::projections;
use arrayjit::ir::{AxisIndex, Bindings, Binop, Prec, StaticSymbol, Ternop, Unop};
use std::fmt::Write as _;

// Random numbers: xorshift64* seeded through splitmix64.

pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (n >= 1).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next() >> 11) % n.max(1) as u64) as usize
    }
    pub fn chance(&mut self, pct: usize) -> bool {
        self.below(100) < pct
    }
    pub fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len())]
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

pub struct Gen {
    pub rng: Rng,
    pub p: Program,
    pub ests: Vec<Est>,
    pub written: Vec<bool>,
    pub read: Vec<bool>,
    pub last: Option<usize>,
    /// An integer-heavy case: most new tensors get an integer precision.
    pub int_bias: bool,
}

pub const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyz";

impl Gen {
    pub fn new_tensor(
        &mut self,
        kind: Kind,
        dims: Vec<usize>,
        prec: Prec,
        init: Vec<f64>,
    ) -> usize {
        let i = self.p.tensors.len();
        let prefix = match kind {
            Kind::Input => "x",
            Kind::Output => "o",
            Kind::Temp => "t",
        };
        self.ests.push(if init.is_empty() {
            Est::zero()
        } else {
            Est::of_values(&init)
        });
        self.p.tensors.push(TSpec {
            name: format!("{prefix}{i}"),
            dims,
            prec,
            kind,
            init,
        });
        self.written.push(false);
        self.read.push(false);
        i
    }

    pub fn rollback(&mut self, n: usize) {
        self.p.tensors.truncate(n);
        self.ests.truncate(n);
        self.written.truncate(n);
        self.read.truncate(n);
    }

    pub fn random_dims(&mut self) -> Vec<usize> {
        let n = self.rng.pick(&[1, 1, 2, 2, 2, 3, 3, 4]);
        let mut d: Vec<usize> = (0..n).map(|_| 1 + self.rng.below(5)).collect();
        while d.iter().product::<usize>() > 200 {
            let k = self.rng.below(d.len());
            d[k] = (d[k] / 2).max(1);
        }
        d
    }

    pub fn random_prec(&mut self) -> Prec {
        if self.int_bias && self.rng.chance(75) {
            return self.rng.pick(&[
                Prec::Byte,
                Prec::Uint16,
                Prec::Int32,
                Prec::Uint32,
                Prec::Int64,
                Prec::Uint64,
            ]);
        }
        if self.rng.chance(40) {
            // SPEC 9.1's integer and narrow-float precisions.
            return self.rng.pick(&[
                Prec::Uint16,
                Prec::Int32,
                Prec::Int32,
                Prec::Uint32,
                Prec::Int64,
                Prec::Int64,
                Prec::Uint64,
                Prec::Bfloat16,
                Prec::Bfloat16,
                Prec::Fp8,
                Prec::Fp8,
            ]);
        }
        self.rng.pick(&[
            Prec::Byte,
            Prec::Byte,
            Prec::Half,
            Prec::Half,
            Prec::Half,
            Prec::Single,
            Prec::Single,
            Prec::Single,
            Prec::Double,
            Prec::Double,
        ])
    }

    /// An integer edge value of precision `p` (exact as `f64`): 0, ±1, the type's minimum
    /// and maximum (the largest `f64` below it for 64 bits), values around 2^31, 2^32,
    /// 2^53 and 2^63, small shift counts around the widths.
    pub fn int_edge(&mut self, p: Prec) -> f64 {
        let (lo, hi) = super::model::int_range(p);
        let two = |e: i32| 2f64.powi(e);
        let v = match self.rng.below(12) {
            0 => 0.0,
            1 => 1.0,
            2 => -1.0,
            3 => lo,
            4 => {
                if hi > two(53) {
                    // 2^63 - 1024 and 2^64 - 2048: the largest f64 values in range.
                    hi - hi / two(53)
                } else {
                    hi
                }
            }
            5 => two(31) + self.rng.pick(&[-2.0, -1.0, 0.0, 1.0]),
            6 => two(32) + self.rng.pick(&[-1.0, 0.0, 1.0]),
            7 => two(53) + self.rng.pick(&[-1.0, 0.0, 2.0]),
            8 => -two(31) + self.rng.pick(&[-1.0, 0.0, 1.0]),
            9 => self
                .rng
                .pick(&[7.0, 8.0, 15.0, 16.0, 31.0, 32.0, 33.0, 63.0, 64.0, 65.0]),
            10 => -(self.rng.below(5) as f64),
            _ => two(62) * self.rng.pick(&[-2.0, -1.0, 1.0, 1.5]),
        };
        common::round_to(p, v)
    }

    pub fn random_values(&mut self, prec: Prec, n: usize) -> Vec<f64> {
        let dist = self.rng.below(if prec == Prec::Byte { 4 } else { 6 });
        (0..n)
            .map(|_| {
                let v = match (prec, dist) {
                    (Prec::Byte, 0 | 1) => self.rng.below(10) as f64,
                    (Prec::Byte, _) => self.rng.below(256) as f64,
                    // Integers: small values (divisors, shift counts) or edge values.
                    (p, 0..=2) if p.is_integer() => self.rng.below(12) as f64 - 3.0,
                    (p, _) if p.is_integer() => self.int_edge(p),
                    (_, 0) => (self.rng.below(49) as f64 - 24.0) / 8.0,
                    (_, 1) => (2 + self.rng.below(23)) as f64 / 8.0,
                    (_, 2) => (self.rng.below(801) as f64 - 400.0) / 4.0,
                    // Rounding ties of fp8 (k/16 in [1, 4)) and bfloat16 (1 + k/256, and
                    // 1 + k/2^9 in single), and fp8 subnormals and their ties (k·2^-17).
                    (Prec::Single | Prec::Double, 4) if self.rng.chance(50) => {
                        (512 + self.rng.below(512)) as f64 / 512.0
                    }
                    (_, 4) => match self.rng.below(3) {
                        0 => (16 + self.rng.below(48)) as f64 / 16.0,
                        1 => (256 + self.rng.below(256)) as f64 / 256.0,
                        _ => self.rng.below(16) as f64 / 131072.0,
                    },
                    _ => (self.rng.below(4097) as f64 - 2048.0) / 1024.0,
                };
                common::round_to(prec, v)
            })
            .collect()
    }

    pub fn new_input(&mut self, dims: Vec<usize>) -> usize {
        let prec = self.random_prec();
        let n = dims.iter().product();
        let values = self.random_values(prec, n);
        self.new_tensor(Kind::Input, dims, prec, values)
    }

    /// Whether the random statements may read tensor `i`: it has values, and its extents
    /// are those of the random shapes (1-5), not those of a large statement's operands and
    /// results ([`super::big`]), which would make the random statements large too.
    pub fn readable(&self, i: usize) -> bool {
        let t = &self.p.tensors[i];
        !self.ests[i].nonfinite
            && (t.kind == Kind::Input || self.written[i])
            && t.dims.iter().all(|&d| d <= 5)
    }

    pub fn pick_arg(&mut self) -> usize {
        if let Some(l) = self.last {
            if self.readable(l) && self.rng.chance(50) {
                return l;
            }
        }
        let cands: Vec<usize> = (0..self.p.tensors.len())
            .filter(|&i| self.readable(i))
            .collect();
        if !cands.is_empty() && self.rng.chance(65) {
            return self.rng.pick(&cands);
        }
        let dims = self.random_dims();
        self.new_input(dims)
    }

    /// Builds an einsum spec over the arguments' dims; returns the argument terms, the result
    /// term and the result's dims.
    pub fn build_logic(&mut self, arg_dims: &[Vec<usize>]) -> (Vec<String>, String, Vec<usize>) {
        // Letters with their extent (None: only seen on axes of extent 1 so far).
        let mut letters: Vec<(char, Option<usize>)> = vec![];
        let fresh = |letters: &mut Vec<(char, Option<usize>)>, e: Option<usize>| {
            let c = LETTERS[letters.len()] as char;
            letters.push((c, e));
            c
        };
        let statics = self.p.statics.clone();
        let mut terms = vec![];
        for dims in arg_dims {
            let mut term = String::new();
            for &e in dims {
                let r = self.rng.below(100);
                if e == 1 {
                    if r < 20 {
                        term.push('0');
                    } else if r < 50 && !letters.is_empty() {
                        term.push(self.rng.pick(&letters).0);
                    } else {
                        term.push(fresh(&mut letters, None));
                    }
                } else if self.rng.chance(AFFINE_PCT) && letters.iter().any(|l| l.1.is_some()) {
                    // An affine entry over letters that already have an extent.
                    let entry = self.affine_entry(&letters);
                    term.push_str(&entry);
                } else {
                    let st: Vec<&(String, usize)> = statics.iter().filter(|s| s.1 <= e).collect();
                    let same: Vec<usize> = (0..letters.len())
                        .filter(|&k| letters[k].1.is_none_or(|x| x == e))
                        .collect();
                    if r < 8 {
                        term.push((b'0' + self.rng.below(e) as u8) as char);
                    } else if r < 16 && !st.is_empty() {
                        let s = st[self.rng.below(st.len())];
                        let _ = write!(term, "{{{}}}", s.0);
                    } else if r < 60 && !same.is_empty() {
                        let k = self.rng.pick(&same);
                        letters[k].1 = Some(e);
                        term.push(letters[k].0);
                    } else {
                        term.push(fresh(&mut letters, Some(e)));
                    }
                }
            }
            terms.push(term);
        }
        // The result: kept letters, maybe a new broadcast letter, a digit, a static index.
        let mut axes: Vec<(String, usize)> = vec![];
        let mut order: Vec<usize> = (0..letters.len()).collect();
        self.rng.shuffle(&mut order);
        for k in order {
            if self.rng.chance(70) {
                let dim = match letters[k].1 {
                    Some(e) if self.rng.chance(5) => {
                        let _ = e;
                        1
                    }
                    Some(e) => e,
                    None => 1 + self.rng.below(5),
                };
                axes.push((letters[k].0.to_string(), dim));
            }
        }
        if self.rng.chance(15) && letters.len() < LETTERS.len() {
            let e = 2 + self.rng.below(4);
            let c = fresh(&mut letters, Some(e));
            axes.push((c.to_string(), e));
        }
        if self.rng.chance(8) {
            let d = self.rng.below(3);
            axes.push((d.to_string(), d + 1 + self.rng.below(5 - d)));
        }
        if self.rng.chance(10) && !statics.is_empty() {
            let (name, range) = statics[self.rng.below(statics.len())].clone();
            axes.push((format!("{{{name}}}"), range + self.rng.below(6 - range)));
        }
        self.rng.shuffle(&mut axes);
        axes.truncate(4);
        // Affine result entries (shifts, transposed convolutions, concatenation) over letters
        // that have an extent from the arguments.
        let with_extent: Vec<(char, Option<usize>)> = letters
            .iter()
            .copied()
            .filter(|l| l.1.is_some() && terms.iter().any(|t| t.contains(l.0)))
            .collect();
        if !with_extent.is_empty() {
            for axis in axes.iter_mut() {
                let letter = axis.0.chars().next().filter(|c| c.is_ascii_alphabetic());
                let Some(e) = letter
                    .and_then(|c| with_extent.iter().find(|l| l.0 == c))
                    .and_then(|l| l.1)
                else {
                    continue;
                };
                if self.rng.chance(AFFINE_PCT) {
                    axis.0 = self.affine_entry(&with_extent);
                    axis.1 = 1 + self.rng.below(e + 2);
                }
            }
        }
        if axes.is_empty() {
            axes.push(("0".into(), 1));
        }
        let lhs_term: String = axes.iter().map(|a| a.0.as_str()).collect();
        let lhs_dims = axes.iter().map(|a| a.1).collect();
        (terms, lhs_term, lhs_dims)
    }

    /// An affine entry `(c·L + [c·M] ± o)` over letters with an extent: coefficients 1-2,
    /// offsets -2..2 (so some points fall outside the axis).
    fn affine_entry(&mut self, letters: &[(char, Option<usize>)]) -> String {
        let known: Vec<char> = letters
            .iter()
            .filter(|l| l.1.is_some())
            .map(|l| l.0)
            .collect();
        let mut parts = vec![];
        let n = if known.len() > 1 && self.rng.chance(50) {
            2
        } else {
            1
        };
        for _ in 0..n {
            let c = self.rng.pick(&known);
            parts.push(if self.rng.chance(35) {
                format!("2*{c}")
            } else {
                c.to_string()
            });
        }
        let mut s = format!("({}", parts.join("+"));
        match self.rng.below(5) as i64 - 2 {
            0 => {}
            o if o > 0 => {
                let _ = write!(s, "+{o}");
            }
            o => {
                let _ = write!(s, "{o}");
            }
        }
        s.push(')');
        s
    }

    pub fn shape_of(&self, spec: &str, lhs_dims: &[usize], arg_dims: &[Vec<usize>]) -> Shape {
        let bindings = Bindings(
            self.p
                .statics
                .iter()
                .map(|(n, r)| StaticSymbol::new(n, Some(*r)))
                .collect(),
        );
        let rhs: Vec<&[usize]> = arg_dims.iter().map(Vec::as_slice).collect();
        let pr = projections(spec, lhs_dims, &rhs, &bindings).unwrap_or_else(|e| {
            panic!("the generated spec {spec:?} with result dims {lhs_dims:?} and argument dims {arg_dims:?} was rejected: {e}")
        });
        let in_lhs = |s| pr.project_lhs.contains(&AxisIndex::Iterator(s));
        let fan_in = pr
            .product_iterators
            .iter()
            .zip(&pr.product_space)
            .filter(|(s, _)| !in_lhs(**s))
            .map(|(_, n)| *n)
            .product();
        let full = !pr.affine
            && pr.project_lhs.iter().zip(lhs_dims).all(|(ix, &d)| {
                d == 1 || matches!(ix, AxisIndex::Iterator(s) if pr.product_iterators.contains(s))
            });
        Shape {
            fan_in,
            full,
            bijective: pr.is_bijective(),
            affine: pr.affine,
        }
    }

    /// Picks or creates the result of an assignment.
    pub fn choose_lhs(
        &mut self,
        dims: &[usize],
        args: &[usize],
        terms: &[String],
        lhs_term: &str,
    ) -> Option<usize> {
        if self.rng.chance(25) {
            let cands: Vec<usize> = (0..self.p.tensors.len())
                .filter(|&i| {
                    let t = &self.p.tensors[i];
                    t.dims == dims
                        && !self.ests[i].nonfinite
                        && args
                            .iter()
                            .zip(terms)
                            .all(|(&a, term)| a != i || term == lhs_term)
                })
                .collect();
            if !cands.is_empty() {
                return Some(self.rng.pick(&cands));
            }
        }
        let kind = match self.rng.below(20) {
            0..=8 => Kind::Temp,
            9..=17 => Kind::Output,
            _ => Kind::Input,
        };
        let prec = self.random_prec();
        let init = if kind == Kind::Input {
            self.random_values(prec, dims.iter().product())
        } else {
            vec![]
        };
        Some(self.new_tensor(kind, dims.to_vec(), prec, init))
    }

    /// Tries `stmt`; commits it if the estimates accept it.
    pub fn try_commit(&mut self, stmt: Stmt) -> bool {
        let mut e = self.ests.clone();
        if apply(&self.p, &stmt, &mut e).is_err() {
            return false;
        }
        self.ests = e;
        let lhs = stmt.lhs();
        for r in stmt.reads() {
            // A node read only by its own updates is copied into an output at the end half of
            // the time (otherwise it is computed and never consumed, which must compile too:
            // `regression_node_read_only_by_its_own_updates`).
            if r != lhs || self.rng.chance(50) {
                self.read[r] = true;
            }
        }
        self.written[lhs] = true;
        if self.p.tensors[lhs].kind == Kind::Temp {
            self.last = Some(lhs);
        }
        self.p.stmts.push(stmt);
        true
    }

    pub fn gen_accum(&mut self) -> bool {
        let n0 = self.p.tensors.len();
        let binary = self.rng.chance(55);
        let ternary = binary && self.rng.chance(15);
        let arity = if ternary {
            3
        } else if binary {
            2
        } else {
            1
        };
        let args: Vec<usize> = (0..arity).map(|_| self.pick_arg()).collect();
        let arg_dims: Vec<Vec<usize>> = args
            .iter()
            .map(|&i| self.p.tensors[i].dims.clone())
            .collect();
        let (terms, lhs_term, lhs_dims) = self.build_logic(&arg_dims);
        let Some(lhs) = self.choose_lhs(&lhs_dims, &args, &terms, &lhs_term) else {
            self.rollback(n0);
            return false;
        };
        let logic = format!("{}->{lhs_term}", terms.join(","));
        let shape = self.shape_of(&logic, &lhs_dims, &arg_dims);
        if shape.fan_in > 1 && args.contains(&lhs) {
            // Updating a node in place while reducing into it reads values the same statement
            // already changed; the estimates do not model that.
            self.rollback(n0);
            return false;
        }
        let mut ops: Vec<Op> = if ternary {
            Ternop::ALL.iter().map(|&t| Op::Tern(t)).collect()
        } else if binary {
            Binop::ALL.iter().map(|&b| Op::Bin(b)).collect()
        } else {
            Unop::ALL.iter().map(|&u| Op::Un(u)).collect()
        };
        self.rng.shuffle(&mut ops);
        let t = &self.p.tensors;
        let int_stmt = t[lhs].prec.is_integer() && args.iter().all(|&i| t[i].prec.is_integer());
        if int_stmt {
            // Integer statements try the operations whose integer semantics is special first
            // (bit operations and shifts, div and mod by zero, pow, comparisons) half of the
            // time.
            if self.rng.chance(50) {
                ops.sort_by_key(|op| match op {
                    Op::Bin(b) if b.is_integer_only() => 0,
                    Op::Bin(Binop::Div | Binop::Mod | Binop::ToPowOf | Binop::Sub) => 1,
                    _ => 2,
                });
            }
        } else {
            ops.retain(|op| !op.integer_only());
        }
        let mut accums = [
            Binop::Arg2,
            Binop::Arg2,
            Binop::Add,
            Binop::Add,
            Binop::Sub,
            Binop::Mul,
            Binop::Max,
            Binop::Min,
        ];
        for &op in ops.iter().take(6) {
            self.rng.shuffle(&mut accums);
            for &accum in accums.iter().take(3) {
                let init = self.rng.chance(50);
                let stmt = Stmt::Accum {
                    lhs,
                    accum,
                    init,
                    op,
                    args: args.clone(),
                    logic: logic.clone(),
                    shape,
                };
                if self.try_commit(stmt) {
                    return true;
                }
            }
        }
        self.rollback(n0);
        false
    }

    pub fn new_result(&mut self, dims: Vec<usize>) -> usize {
        let kind = if self.rng.chance(55) {
            Kind::Temp
        } else {
            Kind::Output
        };
        let prec = self.random_prec();
        self.new_tensor(kind, dims, prec, vec![])
    }

    pub fn gen_fetch(&mut self) -> bool {
        let n0 = self.p.tensors.len();
        let has_statics = !self.p.statics.is_empty();
        let stmt = match self.rng.below(if has_statics { 3 } else { 1 }) {
            _ if self.rng.chance(25) => {
                let dims = self.random_dims();
                let lhs = self.new_result(dims);
                let seed = self.rng.pick(&[0, 1, 42, 0xdead_beef, u64::MAX, 1 << 32]);
                Stmt::Random { lhs, seed }
            }
            0 => {
                let dims = if self.rng.chance(60) {
                    vec![1]
                } else {
                    self.random_dims()
                };
                let lhs = self.new_result(dims);
                let t = &self.p.tensors[lhs];
                let special = t.kind == Kind::Output;
                let c = if special && self.rng.chance(20) {
                    // Non-finite values (integers store 0), and overflow and its rounding
                    // tie of fp8 (57344, 61440) and bfloat16.
                    self.rng.pick(&[
                        f64::INFINITY,
                        f64::NEG_INFINITY,
                        f64::NAN,
                        -0.0,
                        57344.0,
                        61440.0,
                        -65536.0,
                        1e5,
                        3.4e38,
                    ])
                } else {
                    self.rng.pick(&[
                        0.0,
                        0.5,
                        -1.25,
                        2.0,
                        3.0,
                        0.375,
                        1.0,
                        0.1,
                        1.0 / 3.0,
                        2.7,
                        -0.3,
                    ])
                };
                Stmt::Const { lhs, c }
            }
            1 => {
                let stat = self.rng.below(self.p.statics.len());
                let range = self.p.statics[stat].1;
                let cands: Vec<usize> = (0..self.p.tensors.len())
                    .filter(|&i| {
                        let d = &self.p.tensors[i].dims;
                        self.readable(i) && d.len() >= 2 && d[0] >= range
                    })
                    .collect();
                let src = if !cands.is_empty() && self.rng.chance(50) {
                    self.rng.pick(&cands)
                } else {
                    let mut dims = vec![range + self.rng.below(6 - range)];
                    let rest = self.random_dims();
                    dims.extend(rest.into_iter().take(3));
                    if dims.len() < 2 {
                        dims.push(1 + self.rng.below(5));
                    }
                    self.new_input(dims)
                };
                let dims = self.p.tensors[src].dims[1..].to_vec();
                let lhs = self.new_result(dims);
                Stmt::Slice { lhs, src, stat }
            }
            _ => {
                let stat = self.rng.below(self.p.statics.len());
                let dims = self.random_dims();
                let lhs = self.new_result(dims);
                Stmt::Embed { lhs, stat }
            }
        };
        if self.try_commit(stmt) {
            true
        } else {
            self.rollback(n0);
            false
        }
    }
}

impl Gen {
    /// A gather from a readable table (or a scatter-add into a readable result) by a new index
    /// input of an integer precision holding in-range and out-of-range rows (up to 255,
    /// negative, ±2^63).
    pub fn gen_gather(&mut self) -> bool {
        let n0 = self.p.tensors.len();
        let table = self.pick_arg();
        let tdims = self.p.tensors[table].dims.clone();
        let n = tdims[0];
        let mut idims = self.random_dims();
        idims.truncate(2);
        let cells: usize = idims.iter().product();
        // Any integer precision; signed ones also get negative and huge indices.
        const PRECS: [Prec; 6] = [
            Prec::Byte,
            Prec::Uint16,
            Prec::Int32,
            Prec::Uint32,
            Prec::Int64,
            Prec::Uint64,
        ];
        let prec = PRECS[self.rng.below(PRECS.len())];
        let signed = matches!(prec, Prec::Int32 | Prec::Int64);
        let ids: Vec<f64> = (0..cells)
            .map(|_| match self.rng.below(10) {
                0 => 255.0,
                1 => (n + self.rng.below(3)) as f64,
                2 if signed => -1.0 - self.rng.below(3) as f64,
                3 if prec == Prec::Int64 => -9_223_372_036_854_775_808.0,
                3 if prec == Prec::Uint64 => 9_223_372_036_854_775_808.0,
                _ => self.rng.below(n) as f64,
            })
            .collect();
        let index = self.new_tensor(Kind::Input, idims.clone(), prec, ids);
        let rows: Vec<usize> = idims.iter().chain(&tdims[1..]).copied().collect();
        let stmt = if self.rng.chance(60) {
            let lhs = self.new_result(rows);
            Stmt::Gather { lhs, table, index }
        } else {
            if self.p.tensors[table].kind == Kind::Input {
                self.rollback(n0);
                return false;
            }
            let src = self.new_input(rows);
            Stmt::Scatter {
                lhs: table,
                src,
                index,
            }
        };
        if self.try_commit(stmt) {
            true
        } else {
            self.rollback(n0);
            false
        }
    }
}

/// How many cases in a thousand get a large statement ([`super::big`]): 190, or
/// `ARRAYJIT_FUZZ_BIG` (0-1000).
/// How often (in percent) an argument axis or a result axis gets an affine entry.
const AFFINE_PCT: usize = 10;

pub fn big_share() -> usize {
    static SHARE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *SHARE.get_or_init(|| match std::env::var("ARRAYJIT_FUZZ_BIG") {
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&n| n <= 1000)
            .unwrap_or_else(|| panic!("ARRAYJIT_FUZZ_BIG={v:?}: expected 0-1000")),
        Err(_) => 190,
    })
}

/// Generates the program of one case; the same seed always gives the same program (for a
/// given [`big_share`]).
pub fn generate(seed: u64) -> Program {
    let mut g = Gen {
        rng: Rng::new(seed),
        p: Program {
            seed,
            tensors: vec![],
            statics: vec![],
            stmts: vec![],
            runs: vec![],
            ests: vec![],
            big: vec![],
        },
        ests: vec![],
        written: vec![],
        read: vec![],
        last: None,
        int_bias: false,
    };
    g.int_bias = g.rng.chance(30);
    let n_statics = g.rng.pick(&[0, 0, 1, 1, 2]);
    for k in 0..n_statics {
        let range = 1 + g.rng.below(5);
        g.p.statics.push((format!("s{k}"), range));
    }
    let target = 4 + g.rng.below(9);
    // A minority of the cases gets one large statement, somewhere among the others.
    let roll = g.rng.below(1000);
    let share = big_share();
    let big = if roll < share {
        match roll * 21 / share {
            0..=11 => Some("contraction"),
            12..=14 => Some("long contraction"),
            15..=17 => Some("long reduction"),
            18 => Some("wide contraction"),
            _ => Some("window"),
        }
    } else {
        None
    };
    let mut big_at = big.map(|_| g.rng.below(target));
    let mut attempts = 0;
    while g.p.stmts.len() < target && attempts < 4 * target {
        attempts += 1;
        if big_at.is_some_and(|at| g.p.stmts.len() >= at) {
            big_at = None;
            for _ in 0..3 {
                let done = match big {
                    Some("long reduction") => g.gen_long_reduction(),
                    Some("window") => g.gen_window(),
                    Some(kind) => g.gen_contraction(kind),
                    None => true,
                };
                if done {
                    break;
                }
            }
            continue;
        }
        if g.rng.chance(15) {
            g.gen_fetch();
        } else if g.rng.chance(8) {
            g.gen_gather();
        } else {
            g.gen_accum();
        }
    }
    // Every non-hosted result that nothing reads is copied into a hosted output.
    for i in 0..g.p.tensors.len() {
        let t = g.p.tensors[i].clone();
        if t.kind == Kind::Temp && g.written[i] && !g.read[i] && !g.ests[i].nonfinite {
            let prec = if g.rng.chance(50) {
                g.random_prec()
            } else {
                t.prec
            };
            let lhs = g.new_tensor(Kind::Output, t.dims.clone(), prec, vec![]);
            let term: String = (0..t.dims.len()).map(|k| LETTERS[k] as char).collect();
            let logic = format!("{term}->{term}");
            let shape = g.shape_of(&logic, &t.dims, std::slice::from_ref(&t.dims));
            let stmt = Stmt::Accum {
                lhs,
                accum: Binop::Arg2,
                init: false,
                op: Op::Un(Unop::Identity),
                args: vec![i],
                logic,
                shape,
            };
            if !g.try_commit(stmt) {
                g.rollback(lhs);
            }
        }
    }
    // Runs: as many (up to 1-3) as the estimates allow.
    let mut p = g.p;
    let mut runs = g.rng.pick(&[1, 2, 2, 3, 3]);
    let ests = loop {
        match p.replay(runs) {
            Ok(e) => break e,
            Err(_) if runs > 1 => runs -= 1,
            Err(why) => panic!("seed {seed}: replaying the generated program failed: {why}"),
        }
    };
    p.ests = ests;
    p.runs = (0..runs)
        .map(|_| {
            p.statics
                .iter()
                .map(|(_, r)| g.rng.below(*r) as i64)
                .collect()
        })
        .collect();
    p
}
