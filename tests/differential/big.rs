//! Large statements: contractions (matrix products in every layout) with extents up to about
//! 70, long contractions and long reductions (hundreds to thousands of terms), and a few wide
//! ones, so that the optimizer's GEMM kernels (`optimize/gemm.rs`), vectorized reductions and
//! cache tiling (`optimize/loops.rs`) run on random data, against the interpreter; and
//! windows (depthwise convolutions and pooling with padding, stride and dilation: the tap
//! kernels of `optimize/taps.rs`).
//!
//! Extents avoid being multiples of the kernels' tiles (14 × 32 floats, 14 × 16 doubles with
//! AVX-512; 6 × 16 with AVX2) half of the time and sit right around them otherwise; operand
//! values are scaled to the number of terms summed so that sums stay below about 1500 (half
//! and single results keep meaningful precision, accumulation over three runs stays finite).
//! Some cases are exact (dyadic values whose sums fit the compute type: any summation order
//! gives the same bits), most long ones are not (full-precision values, or too many bits):
//! there the error analysis bounds the reassociated sums ([`super::model::any_order`]).

use super::case::{Big, Kind, Op, Program, Stmt};
use super::common;
use super::gen::{Gen, LETTERS};
use super::model::Est;
use arrayjit::ir::{Binop, Prec, Unop};

/// Contraction layouts, einsum templates over `i` (the result's rows), `j` (the reduced
/// axis), `k` (the result's columns), `b` (a batch axis), `l` (a second reduced axis); `S`
/// is an outer axis indexed by a static index, `F` one indexed by a fixed digit. The
/// operands may be swapped.
pub const LAYOUTS: &[(&str, &str)] = &[
    ("ij,jk->ik", "ij,jk->ik"),
    ("ij,kj->ik", "ij,kj->ik"),
    ("ji,jk->ik", "ji,jk->ik"),
    ("ji,kj->ik", "ji,kj->ik"),
    ("ij,jk->ki", "ij,jk->ki"),
    ("ji,kj->ki", "ji,kj->ki"),
    ("gram ij,kj->ik", "ij,kj->ik"),
    ("bij,bjk->bik", "bij,bjk->bik"),
    ("ibj,bjk->bik", "ibj,bjk->bik"),
    ("bij,jk->bik", "bij,jk->bik"),
    ("ij,bjk->ibk", "ij,bjk->ibk"),
    ("ijl,jkl->ik", "ijl,jkl->ik"),
    ("lij,ljk->ik", "lij,ljk->ik"),
    ("Sij,jk->ik", "Sij,jk->ik"),
    ("ij,jk->Sik", "ij,jk->Sik"),
    ("Sij,Sjk->Sik", "Sij,Sjk->Sik"),
    ("Fij,jk->ik", "Fij,jk->ik"),
    ("ij,Fjk->Fik", "ij,Fjk->Fik"),
];

/// The layouts used for long contractions (a reduction of hundreds to thousands).
const LONG_LAYOUTS: &[usize] = &[0, 0, 1, 2, 3, 4, 7, 11];

/// Long reductions, over `i` (kept), `j` (long, reduced) and `b` (a batch axis).
pub const REDUCTIONS: &[(&str, &str)] = &[
    ("ij->i", "ij->i"),
    ("j->0", "j->0"),
    ("ji->i", "ji->i"),
    ("bij->bi", "bij->bi"),
    ("ij,ij->i", "ij,ij->i"),
    ("ij,j->i", "ij,j->i"),
    ("j,j->0", "j,j->0"),
    ("bij,bj->ib", "bij,bj->ib"),
    ("ji,j->i", "ji,j->i"),
];

/// Sums of a large statement stay below about this (times the number of runs).
const SUM_BUDGET: f64 = 1500.0;
/// The most multiply-adds of one large statement (the interpreter runs it twice per run).
const MAX_WORK: usize = 250_000;

/// Extents around the kernels' tiles and blocks.
const EDGES: &[usize] = &[
    2, 3, 5, 6, 7, 8, 9, 12, 13, 14, 15, 16, 17, 18, 23, 24, 25, 27, 28, 29, 31, 32, 33, 41, 42,
    43, 47, 48, 49, 55, 56, 57, 63, 64, 65, 69, 70,
];

/// Long reduction extents around the vector widths and reduction blocks (256, 512).
const LONG_EDGES: &[usize] = &[
    255, 256, 257, 300, 383, 511, 512, 513, 767, 1000, 1023, 1025, 1500, 2047, 2049, 2500, 3000,
];

impl Gen {
    /// An extent in `lo..=hi`: a tile edge 40% of the time, else uniform.
    fn extent(&mut self, lo: usize, hi: usize, edges: &[usize]) -> usize {
        let e: Vec<usize> = edges
            .iter()
            .copied()
            .filter(|e| (lo..=hi).contains(e))
            .collect();
        if !e.is_empty() && self.rng.chance(40) {
            self.rng.pick(&e)
        } else {
            lo + self.rng.below(hi - lo + 1)
        }
    }

    /// A uniform number in `[0, 1)` with 53 random bits.
    fn unit(&mut self) -> f64 {
        (self.rng.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `n` values of precision `prec` of magnitude at most `q`: dyadic (multiples of 1/8 or
    /// 1/1024: products and short sums are exact), full precision (products round), or all
    /// positive (sums without cancellation); bytes are small integers.
    pub fn scaled_values(&mut self, prec: Prec, n: usize, q: f64) -> Vec<f64> {
        let dist = self.rng.pick(&[0, 0, 0, 1, 1, 2, 3, 3, 3]);
        let top = q.floor().clamp(1.0, 9.0) as usize;
        (0..n)
            .map(|_| {
                let u = self.unit();
                let v = match (prec, dist) {
                    (Prec::Byte, _) => self.rng.below(top + 1) as f64,
                    (_, 0) => ((2.0 * u - 1.0) * q * 8.0).round() / 8.0,
                    (_, 1) => ((2.0 * u - 1.0) * q * 1024.0).round() / 1024.0,
                    (_, 2) => u * q,
                    _ => (2.0 * u - 1.0) * q,
                };
                common::round_to(prec, v)
            })
            .collect()
    }

    fn operand_prec(&mut self) -> Prec {
        self.rng.pick(&[
            Prec::Single,
            Prec::Single,
            Prec::Single,
            Prec::Double,
            Prec::Double,
            Prec::Double,
            Prec::Half,
            Prec::Half,
            Prec::Byte,
        ])
    }

    /// Mostly single and double (the kernels' precisions).
    fn result_prec(&mut self) -> Prec {
        match self.rng.below(20) {
            0..=8 => Prec::Single,
            9..=16 => Prec::Double,
            17..=18 => Prec::Half,
            _ => Prec::Byte,
        }
    }

    fn scaled_input(&mut self, dims: Vec<usize>, q: f64) -> usize {
        let prec = self.operand_prec();
        let values = self.scaled_values(prec, dims.iter().product(), q);
        self.new_tensor(Kind::Input, dims, prec, values)
    }

    /// An operand of magnitude at most about `q`: an input, or (a third of the time) a
    /// pointwise chain of one or two statements into a non-hosted node, which the optimizer
    /// may inline into the contraction (then the kernel packs the computed values).
    fn operand(&mut self, dims: &[usize], q: f64, prec: Prec) -> usize {
        if self.rng.chance(67) {
            return self.scaled_input(dims.to_vec(), q);
        }
        let term: String = (0..dims.len()).map(|k| LETTERS[k] as char).collect();
        let mut cur = self.scaled_input(dims.to_vec(), q);
        for step in 0..1 + self.rng.below(2) {
            // Mostly the result's precision: then the inlined computation is a plain
            // expression the kernel can pack (a node of another precision stays a scope that
            // rounds to it, which the kernels do not pack).
            let prec = if self.rng.chance(60) {
                prec
            } else {
                self.rng.pick(&[Prec::Single, Prec::Double, Prec::Half])
            };
            let t = self.new_tensor(Kind::Temp, dims.to_vec(), prec, vec![]);
            let (op, args, logic) = match self.rng.below(if step == 0 { 10 } else { 6 }) {
                0 => (Op::Un(Unop::Relu), vec![cur], format!("{term}->{term}")),
                1 => (Op::Un(Unop::Neg), vec![cur], format!("{term}->{term}")),
                2 => (Op::Un(Unop::Tanh), vec![cur], format!("{term}->{term}")),
                3 => (Op::Un(Unop::Sin), vec![cur], format!("{term}->{term}")),
                4 => (Op::Un(Unop::Identity), vec![cur], format!("{term}->{term}")),
                5 => (Op::Un(Unop::Cos), vec![cur], format!("{term}->{term}")),
                k => {
                    // A second input: a factor in [-1, 1], or a bound for max / min.
                    let y = self.scaled_input(dims.to_vec(), 1.0);
                    let op = [Binop::Mul, Binop::Mul, Binop::Max, Binop::Min][k - 6];
                    (Op::Bin(op), vec![cur, y], format!("{term},{term}->{term}"))
                }
            };
            let shape = self.shape_of(&logic, dims, &vec![dims.to_vec(); args.len()]);
            let stmt = Stmt::Accum {
                lhs: t,
                accum: Binop::Arg2,
                init: false,
                op,
                args,
                logic,
                shape,
            };
            if !self.try_commit(stmt) {
                self.rollback(t);
                break;
            }
            cur = t;
        }
        cur
    }

    /// A static index for an `S` axis (a new one if the program has none).
    fn a_static(&mut self) -> usize {
        if self.p.statics.is_empty() || self.rng.chance(20) {
            let k = self.p.statics.len();
            let range = 1 + self.rng.below(4);
            self.p.statics.push((format!("s{k}"), range));
            k
        } else {
            self.rng.below(self.p.statics.len())
        }
    }

    /// Expands a layout template into the einsum terms and the dims of every operand.
    fn expand(&mut self, template: &str, ext: &[(char, usize)]) -> (Vec<String>, Vec<Vec<usize>>) {
        let stat = template.contains('S').then(|| self.a_static());
        let mut terms = vec![];
        let mut dims = vec![];
        for part in template.split("->").flat_map(|s| s.split(',')) {
            let (mut term, mut d) = (String::new(), vec![]);
            for ch in part.chars() {
                match ch {
                    'S' => {
                        let (name, range) = self.p.statics[stat.unwrap_or(0)].clone();
                        term.push_str(&format!("{{{name}}}"));
                        d.push(range + self.rng.below(3));
                    }
                    'F' => {
                        let e = 2 + self.rng.below(3);
                        term.push((b'0' + self.rng.below(e) as u8) as char);
                        d.push(e);
                    }
                    c => {
                        term.push(c);
                        d.push(ext.iter().find(|x| x.0 == c).map_or(1, |x| x.1));
                    }
                }
            }
            terms.push(term);
            dims.push(d);
        }
        (terms, dims)
    }

    /// Saves the generator's state (to undo a large statement that does not fit).
    fn save(&self) -> (Program, Vec<Est>, Vec<bool>, Vec<bool>, Option<usize>) {
        (
            self.p.clone(),
            self.ests.clone(),
            self.written.clone(),
            self.read.clone(),
            self.last,
        )
    }

    fn restore(&mut self, s: (Program, Vec<Est>, Vec<bool>, Vec<bool>, Option<usize>)) {
        (self.p, self.ests, self.written, self.read, self.last) = s;
    }

    /// A result for a large statement: non-hosted (then, when its reduction is short, the
    /// optimizer may inline it into its reader), a hosted output of zeros, or a hosted input
    /// with values (accumulated into across runs when not re-initialized).
    fn big_result(&mut self, dims: &[usize], prec: Prec) -> usize {
        match self.rng.below(20) {
            0..=3 => self.new_tensor(Kind::Temp, dims.to_vec(), prec, vec![]),
            4..=14 => self.new_tensor(Kind::Output, dims.to_vec(), prec, vec![]),
            _ => {
                let values = self.scaled_values(prec, dims.iter().product(), 4.0);
                self.new_tensor(Kind::Input, dims.to_vec(), prec, values)
            }
        }
    }

    /// Commits `lhs accum= op(args)` with the first accumulator and op the estimates accept.
    fn commit_big(
        &mut self,
        lhs: usize,
        ops: &[Op],
        args: &[usize],
        terms: &[String],
        dims: &[Vec<usize>],
    ) -> bool {
        let logic = format!("{}->{}", terms[..args.len()].join(","), terms[args.len()]);
        let shape = self.shape_of(&logic, &dims[args.len()], &dims[..args.len()]);
        // Mostly a sum (the kernels' case); otherwise another accumulator first.
        let mut accums = vec![Binop::Add, Binop::Sub, Binop::Max, Binop::Min];
        if self.rng.chance(12) {
            self.rng.shuffle(&mut accums);
        }
        for &op in ops {
            for &accum in &accums[..2] {
                let stmt = Stmt::Accum {
                    lhs,
                    accum,
                    init: self.rng.chance(50),
                    op,
                    args: args.to_vec(),
                    logic: logic.clone(),
                    shape,
                };
                if self.try_commit(stmt) {
                    return true;
                }
            }
        }
        false
    }

    /// Reads a large result afterwards (half of the time): pointwise into a hosted output, or
    /// summed along its last axis.
    fn read_back(&mut self, c: usize) {
        if !self.rng.chance(50) {
            return;
        }
        let dims = self.p.tensors[c].dims.clone();
        let term: String = (0..dims.len()).map(|k| LETTERS[k] as char).collect();
        let prec = self.result_prec();
        let (out_dims, logic, op, accum) = if self.rng.chance(70) || dims.len() < 2 {
            let op = self
                .rng
                .pick(&[Unop::Identity, Unop::Relu, Unop::Neg, Unop::Tanh]);
            (dims.clone(), format!("{term}->{term}"), op, Binop::Arg2)
        } else {
            let kept = &term[..term.len() - 1];
            (
                dims[..dims.len() - 1].to_vec(),
                format!("{term}->{kept}"),
                Unop::Identity,
                Binop::Add,
            )
        };
        let o = self.new_tensor(Kind::Output, out_dims.clone(), prec, vec![]);
        let shape = self.shape_of(&logic, &out_dims, &[dims]);
        let stmt = Stmt::Accum {
            lhs: o,
            accum,
            init: true,
            op: Op::Un(op),
            args: vec![c],
            logic,
            shape,
        };
        if !self.try_commit(stmt) {
            self.rollback(o);
        }
    }

    /// A contraction; `kind` is `"contraction"` (extents up to 70), `"long contraction"` (a
    /// reduction of 257-3000 into a few rows) or `"wide contraction"` (hundreds of columns:
    /// cache tiling of small contractions, GEMM column blocks). Returns whether one was
    /// committed (otherwise the generator's state is unchanged).
    pub fn gen_contraction(&mut self, kind: &'static str) -> bool {
        let saved = self.save();
        let li = match kind {
            "long contraction" => self.rng.pick(LONG_LAYOUTS),
            "wide contraction" => 0,
            _ => self.rng.below(LAYOUTS.len()),
        };
        let (layout, template) = LAYOUTS[li];
        let gram = layout.starts_with("gram");
        let (mut m, mut n, mut k);
        let (batch, lred) = (2 + self.rng.below(2), 2 + self.rng.below(2));
        let wide_blocks = kind == "wide contraction" && self.rng.chance(40);
        let max_work = if wide_blocks { 2 * MAX_WORK } else { MAX_WORK };
        let outer = if template.contains('b') { batch } else { 1 }
            * if template.contains('l') { lred } else { 1 };
        // Mostly above the kernels' threshold (32^3 multiply-adds, 16 contiguous columns of
        // the result), sometimes anywhere.
        let above = kind != "wide contraction" && self.rng.chance(85);
        let transposed_result = template.ends_with("ki");
        let mut tries = 0;
        loop {
            tries += 1;
            match kind {
                "long contraction" => {
                    m = self.extent(2, 10, EDGES);
                    n = self.extent(8, 48, EDGES);
                    k = self.extent(257, 3000, LONG_EDGES);
                }
                "wide contraction" if wide_blocks => {
                    // Wider than a block of column panels (with a 2 MiB L2: 32 panels of
                    // 16 doubles, 32 of 32 floats, for a reduction block of 256).
                    m = 2;
                    n = self.rng.pick(&[600, 700, 1100]);
                    k = self.extent(200, 256, LONG_EDGES);
                }
                "wide contraction" => {
                    // Small products with hundreds of columns: below the kernels' threshold,
                    // so the loop passes tile them (panels of 512 bytes).
                    m = self.extent(2, 4, EDGES);
                    n = self.rng.pick(&[256, 384, 512]);
                    k = self.extent(2, 8, EDGES);
                }
                _ => {
                    m = self.extent(2, 70, EDGES);
                    n = self.extent(6, 70, EDGES);
                    k = self.extent(4, 70, EDGES);
                }
            }
            if gram {
                n = m;
            }
            let cols = if transposed_result { m } else { n };
            let fits = m * n * k * outer <= max_work;
            if fits && (!above || (m * n * k >= 32 * 32 * 32 && cols >= 16)) {
                break;
            }
            if tries > 300 {
                (m, n, k) = (33, 33, 31);
                break;
            }
        }
        let ext = [('i', m), ('j', k), ('k', n), ('b', batch), ('l', lred)];
        let (mut terms, mut dims) = self.expand(template, &ext);
        let fan_in = k * if template.contains('l') { lred } else { 1 };
        let q = (SUM_BUDGET / fan_in as f64).sqrt().min(4.0);
        let prec = self.result_prec();
        let a = self.operand(&dims[0], q, prec);
        let b = if gram {
            a
        } else {
            self.operand(&dims[1], q, prec)
        };
        let mut args = vec![a, b];
        if self.rng.chance(50) {
            args.swap(0, 1);
            terms.swap(0, 1);
            dims.swap(0, 1);
        }
        let mut ops = vec![Op::Bin(Binop::Mul); 3];
        if self.rng.chance(6) {
            ops.insert(
                0,
                Op::Bin(self.rng.pick(&[Binop::Add, Binop::Max, Binop::Sub])),
            );
        }
        for attempt in 0..3 {
            let n0 = self.p.tensors.len();
            let prec = if attempt == 0 {
                prec
            } else {
                self.result_prec()
            };
            let c = self.big_result(&dims[2], prec);
            if self.commit_big(c, &ops, &args, &terms, &dims) {
                let (rows, cols) = if transposed_result { (n, m) } else { (m, n) };
                self.p.big.push(Big {
                    lhs: c,
                    kind,
                    layout,
                    mnk: (rows, cols, k),
                });
                self.read_back(c);
                return true;
            }
            self.rollback(n0);
        }
        self.restore(saved);
        false
    }

    /// A long reduction (257-3000 terms, a few of them side by side): plain sums, sums of
    /// transcendental terms, dot products, matrix-vector products; contiguous (vectorized
    /// for single and double results) or strided (not).
    pub fn gen_long_reduction(&mut self) -> bool {
        let saved = self.save();
        let (layout, template) = self.rng.pick(REDUCTIONS);
        let j = self.extent(257, 3000, LONG_EDGES);
        let i = self.extent(1, 8, EDGES);
        let b = 2 + self.rng.below(2);
        let ext = [('i', i), ('j', j), ('b', b)];
        let (terms, dims) = self.expand(template, &ext);
        let binary = terms.len() == 3;
        let prec = self.result_prec();
        let q = if binary {
            (SUM_BUDGET / j as f64).sqrt()
        } else {
            (SUM_BUDGET / j as f64).min(4.0)
        };
        let args: Vec<usize> = (0..terms.len() - 1)
            .map(|k| self.operand(&dims[k], q, prec))
            .collect();
        let mut ops: Vec<Op> = if binary {
            vec![Op::Bin(Binop::Mul), Op::Bin(Binop::Mul)]
        } else {
            let mut u = vec![
                Op::Un(Unop::Identity),
                Op::Un(Unop::Tanh),
                Op::Un(Unop::Sin),
                Op::Un(Unop::Exp),
                Op::Un(Unop::Sqrt),
                Op::Un(Unop::Neg),
            ];
            self.rng.shuffle(&mut u);
            u.truncate(3);
            u
        };
        if self.rng.chance(25) {
            ops.insert(0, Op::Un(Unop::Identity));
            if binary {
                ops[0] = Op::Bin(self.rng.pick(&[Binop::Add, Binop::Sub, Binop::Max]));
            }
        }
        for attempt in 0..3 {
            let n0 = self.p.tensors.len();
            let prec = if attempt == 0 {
                prec
            } else {
                self.result_prec()
            };
            let c = self.big_result(&dims[terms.len() - 1], prec);
            if self.commit_big(c, &ops, &args, &terms, &dims) {
                self.p.big.push(Big {
                    lhs: c,
                    kind: "long reduction",
                    layout,
                    mnk: (0, 0, 0),
                });
                self.read_back(c);
                return true;
            }
            self.rollback(n0);
        }
        self.restore(saved);
        false
    }

    /// An affine entry `(s·out + d·tap - p)`, without coefficients of 1 and offsets of 0.
    fn window_entry(out: char, tap: char, (s, d, p): (usize, usize, usize)) -> String {
        let coef = |c: usize, l: char| {
            if c == 1 {
                l.to_string()
            } else {
                format!("{c}*{l}")
            }
        };
        let off = if p == 0 {
            String::new()
        } else {
            format!("-{p}")
        };
        format!("({}+{}{off})", coef(s, out), coef(d, tap))
    }

    /// A window over NHWC data (the tap kernels' case): a depthwise convolution
    /// `b(s·h+d·i-p)(s·v+d·j-p)c,ijc->bhvc` (mul, accumulated with add or sub) or a pooling
    /// `...,ij->bhvc` (arg1, accumulated with max, min or add), with windows of 2-3 × 2-4,
    /// stride and dilation 1-2, padding from 0 to beyond the window (outputs that meet no
    /// input), and channel counts around the vector widths. Returns whether one was committed
    /// (otherwise the generator's state is unchanged).
    pub fn gen_window(&mut self) -> bool {
        let saved = self.save();
        let batch = 1 + self.rng.below(2);
        let (kh, kw) = (2 + self.rng.below(2), 2 + self.rng.below(3));
        let (sh, sw) = (1 + self.rng.below(2), 1 + self.rng.below(2));
        let (dh, dw) = (1 + self.rng.below(2), 1 + self.rng.below(2));
        let (ph, pw) = (
            self.rng.below(dh * (kh - 1) + 3),
            self.rng.below(dw * (kw - 1) + 3),
        );
        let h = self.extent(1, 12, EDGES);
        let w = self.extent(2, 40, EDGES);
        // Every output the window reaches with some tap, sometimes one more.
        let out = |n: usize, k: usize, s: usize, d: usize, p: usize| {
            ((n + 2 * p).saturating_sub(d * (k - 1) + 1) / s + 1).max(2)
        };
        let oh = out(h, kh, sh, dh, ph) + self.rng.below(2);
        let ow = out(w, kw, sw, dw, pw) + self.rng.below(2);
        let mut c = self.extent(2, 70, EDGES);
        while c > 2 && batch * oh * ow * c * kh * kw > MAX_WORK {
            c /= 2;
        }
        let pool = self.rng.chance(40);
        let x_term = format!(
            "b{}{}c",
            Self::window_entry('h', 'i', (sh, dh, ph)),
            Self::window_entry('v', 'j', (sw, dw, pw))
        );
        let terms = [
            x_term,
            if pool { "ij" } else { "ijc" }.to_string(),
            "bhvc".to_string(),
        ];
        let dims = [
            vec![batch, h, w, c],
            if pool { vec![kh, kw] } else { vec![kh, kw, c] },
            vec![batch, oh, ow, c],
        ];
        let q = (SUM_BUDGET / (kh * kw) as f64).sqrt().min(4.0);
        let prec = self.result_prec();
        // Mostly inputs of the result's precision (the tap kernels' case).
        let arg = |g: &mut Self, d: &[usize]| {
            if g.rng.chance(60) {
                let values = g.scaled_values(prec, d.iter().product(), q);
                g.new_tensor(Kind::Input, d.to_vec(), prec, values)
            } else {
                g.operand(d, q, prec)
            }
        };
        let x = arg(self, &dims[0]);
        let k = arg(self, &dims[1]);
        let args = vec![x, k];
        let logic = format!("{},{}->{}", terms[0], terms[1], terms[2]);
        let (op, mut accums) = if pool {
            (Binop::Arg1, vec![Binop::Max, Binop::Min, Binop::Add])
        } else {
            (Binop::Mul, vec![Binop::Add, Binop::Add, Binop::Sub])
        };
        self.rng.shuffle(&mut accums);
        for (attempt, &accum) in accums.iter().enumerate() {
            let n0 = self.p.tensors.len();
            let prec = if attempt == 0 {
                prec
            } else {
                self.result_prec()
            };
            let lhs = self.big_result(&dims[2], prec);
            let shape = self.shape_of(&logic, &dims[2], &dims[..2]);
            let stmt = Stmt::Accum {
                lhs,
                accum,
                init: self.rng.chance(80),
                op: Op::Bin(op),
                args: args.clone(),
                logic: logic.clone(),
                shape,
            };
            if self.try_commit(stmt) {
                self.p.big.push(Big {
                    lhs,
                    kind: "window",
                    layout: if pool { "pooling" } else { "depthwise" },
                    mnk: (oh * ow, c, kh * kw),
                });
                self.read_back(lhs);
                return true;
            }
            self.rollback(n0);
        }
        self.restore(saved);
        false
    }
}
