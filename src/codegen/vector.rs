//! How vector operations of the loop IR are spelled in C, per instruction set: one table
//! (types, loads, stores, broadcasts, arithmetic) for SSE2, AVX2, AVX-512 and NEON
//! intrinsics, and GCC/Clang vector extensions for every other target or vector width.
//!
//! By default every target is spelled with vector extensions of its native width (16, 32 or
//! 64 bytes): GCC and Clang turn them into exactly the instructions the intrinsics name (the
//! kernels' inner loops are instruction for instruction the same), and the intrinsics'
//! headers would add about 70 ms of parsing to every compile. `ARRAYJIT_INTRINSICS=1`
//! ([`VectorTarget::intrinsics`]) selects the intrinsics.
//!
//! Loads and stores never assume alignment (`loadu`, `vld1q`, `memcpy`).
//!
//! Integer vectors (`uint16`, `uint32` and `uint64` lanes, the integer GEMM kernels) are
//! always spelled with vector extensions of unsigned lanes, also with `ARRAYJIT_INTRINSICS=1`:
//! lane-wise arithmetic of vector extensions is done in the lanes' type (no promotion to
//! `int`), and unsigned arithmetic wraps, so it is never undefined behaviour; GCC and Clang
//! pick the instructions (`vpmullw`, `vpmulld`, `vpmullq` where AVX-512DQ has it, an emulated
//! 64-bit product elsewhere). Their
//! load and store helpers take untyped pointers, so that one helper moves the lanes of
//! `int32_t` and `uint32_t` arrays alike (bit patterns, through `memcpy`).

use crate::ir::{Binop, Prec, Ternop, Unop};
use crate::loops::VType;
use crate::target::{Isa, VectorTarget};

/// The spelling of vector code for one target.
#[derive(Clone, Copy, Debug)]
pub struct Dialect {
    target: VectorTarget,
}

/// An intrinsic family: type name, function prefix and suffix.
struct Native {
    ty: &'static str,
    load: &'static str,
    store: &'static str,
    splat: &'static str,
    zero: &'static str,
    add: &'static str,
    sub: &'static str,
    mul: &'static str,
    /// `a * b + c` as a call template with `$a $b $c`, if the family has it.
    fma: Option<&'static str>,
}

impl Dialect {
    /// The dialect of a target.
    pub fn new(target: VectorTarget) -> Dialect {
        Dialect { target }
    }

    fn native(&self, t: VType) -> Option<Native> {
        if !self.target.intrinsics {
            return None;
        }
        let single = match t.prec {
            Prec::Single => true,
            Prec::Double => false,
            _ => return None,
        };
        let bytes = t.lanes * if single { 4 } else { 8 };
        let fma = self.target.fma;
        let n = |ty, load, store, splat, zero, add, sub, mul, fma| Native {
            ty,
            load,
            store,
            splat,
            zero,
            add,
            sub,
            mul,
            fma,
        };
        Some(match (self.target.isa, bytes, single) {
            (Isa::Avx512, 64, true) => n(
                "__m512",
                "_mm512_loadu_ps",
                "_mm512_storeu_ps",
                "_mm512_set1_ps",
                "_mm512_setzero_ps()",
                "_mm512_add_ps",
                "_mm512_sub_ps",
                "_mm512_mul_ps",
                Some("_mm512_fmadd_ps($a, $b, $c)"),
            ),
            (Isa::Avx512, 64, false) => n(
                "__m512d",
                "_mm512_loadu_pd",
                "_mm512_storeu_pd",
                "_mm512_set1_pd",
                "_mm512_setzero_pd()",
                "_mm512_add_pd",
                "_mm512_sub_pd",
                "_mm512_mul_pd",
                Some("_mm512_fmadd_pd($a, $b, $c)"),
            ),
            (Isa::Avx2 | Isa::Avx512, 32, true) => n(
                "__m256",
                "_mm256_loadu_ps",
                "_mm256_storeu_ps",
                "_mm256_set1_ps",
                "_mm256_setzero_ps()",
                "_mm256_add_ps",
                "_mm256_sub_ps",
                "_mm256_mul_ps",
                fma.then_some("_mm256_fmadd_ps($a, $b, $c)"),
            ),
            (Isa::Avx2 | Isa::Avx512, 32, false) => n(
                "__m256d",
                "_mm256_loadu_pd",
                "_mm256_storeu_pd",
                "_mm256_set1_pd",
                "_mm256_setzero_pd()",
                "_mm256_add_pd",
                "_mm256_sub_pd",
                "_mm256_mul_pd",
                fma.then_some("_mm256_fmadd_pd($a, $b, $c)"),
            ),
            (Isa::Sse2 | Isa::Avx2 | Isa::Avx512, 16, true) => n(
                "__m128",
                "_mm_loadu_ps",
                "_mm_storeu_ps",
                "_mm_set1_ps",
                "_mm_setzero_ps()",
                "_mm_add_ps",
                "_mm_sub_ps",
                "_mm_mul_ps",
                fma.then_some("_mm_fmadd_ps($a, $b, $c)"),
            ),
            (Isa::Sse2 | Isa::Avx2 | Isa::Avx512, 16, false) => n(
                "__m128d",
                "_mm_loadu_pd",
                "_mm_storeu_pd",
                "_mm_set1_pd",
                "_mm_setzero_pd()",
                "_mm_add_pd",
                "_mm_sub_pd",
                "_mm_mul_pd",
                fma.then_some("_mm_fmadd_pd($a, $b, $c)"),
            ),
            (Isa::Neon, 16, true) => n(
                "float32x4_t",
                "vld1q_f32",
                "vst1q_f32",
                "vdupq_n_f32",
                "vdupq_n_f32(0.0f)",
                "vaddq_f32",
                "vsubq_f32",
                "vmulq_f32",
                Some("vfmaq_f32($c, $a, $b)"),
            ),
            (Isa::Neon, 16, false) => n(
                "float64x2_t",
                "vld1q_f64",
                "vst1q_f64",
                "vdupq_n_f64",
                "vdupq_n_f64(0.0)",
                "vaddq_f64",
                "vsubq_f64",
                "vmulq_f64",
                Some("vfmaq_f64($c, $a, $b)"),
            ),
            _ => return None,
        })
    }

    /// The system header the intrinsics need, if any.
    pub fn include(&self) -> Option<&'static str> {
        if !self.target.intrinsics {
            return None;
        }
        match self.target.isa {
            Isa::Sse2 | Isa::Avx2 | Isa::Avx512 => Some("#include <immintrin.h>"),
            Isa::Neon => Some("#include <arm_neon.h>"),
            Isa::Generic => None,
        }
    }

    /// The C type of a vector.
    pub fn ty(&self, t: VType) -> String {
        match self.native(t) {
            Some(n) => n.ty.to_string(),
            None => generic_name(t),
        }
    }

    /// Definitions a file needs before using vectors of type `t` (the generic typedef and its
    /// load/store helpers; nothing for intrinsic types).
    pub fn prelude(&self, t: VType) -> String {
        if self.native(t).is_some() {
            return String::new();
        }
        let n = generic_name(t);
        let e = t.prec.c_type();
        let bytes = t.lanes * t.prec.size_in_bytes();
        let lanes = vec!["x"; t.lanes].join(", ");
        // Integer lanes move the bits of signed and unsigned arrays alike.
        let p = if t.prec.is_integer() { "void" } else { e };
        format!(
            "typedef {e} {n} __attribute__((vector_size({bytes})));\n\
             static inline {n} {n}_load(const {p} *p) {{ {n} v; memcpy(&v, p, sizeof v); return v; }}\n\
             static inline void {n}_store({p} *p, {n} v) {{ memcpy(p, &v, sizeof v); }}\n\
             static inline {n} {n}_splat({e} x) {{ return ({n}){{{lanes}}}; }}\n"
        )
    }

    /// A load of `t.lanes` consecutive elements at `ptr`.
    pub fn load(&self, t: VType, ptr: &str) -> String {
        match self.native(t) {
            Some(n) => format!("{}({ptr})", n.load),
            None => format!("{}_load({ptr})", generic_name(t)),
        }
    }

    /// A store of `v` to `t.lanes` consecutive elements at `ptr` (a statement without `;`).
    pub fn store(&self, t: VType, ptr: &str, v: &str) -> String {
        match self.native(t) {
            Some(n) => format!("{}({ptr}, {v})", n.store),
            None => format!("{}_store({ptr}, {v})", generic_name(t)),
        }
    }

    /// Every lane equal to the scalar `x` (of the vector's element type).
    pub fn splat(&self, t: VType, x: &str) -> String {
        match self.native(t) {
            Some(n) => format!("{}({x})", n.splat),
            None => format!("{}_splat({x})", generic_name(t)),
        }
    }

    /// Every lane 0.
    pub fn zero(&self, t: VType) -> String {
        match self.native(t) {
            Some(n) => n.zero.to_string(),
            None => format!("(({}){{0}})", generic_name(t)),
        }
    }

    /// `a * b + c`: fused where the target has FMA.
    pub fn fma(&self, t: VType, a: &str, b: &str, c: &str) -> String {
        match self.native(t) {
            Some(Native { fma: Some(f), .. }) => {
                f.replace("$a", a).replace("$b", b).replace("$c", c)
            }
            Some(n) => format!("{}({}({a}, {b}), {c})", n.add, n.mul),
            None => format!("({a} * {b} + {c})"),
        }
    }

    /// A permutation of the lanes of `a` followed by `b`: the runtime header's `AJ_SHUFFLE`
    /// (`__builtin_shufflevector` on Clang and GCC 12+, `__builtin_shuffle` with an integer
    /// mask vector on older GCC; the cast keeps the result in the vector type, intrinsics'
    /// types included).
    pub fn shuffle(&self, t: VType, a: &str, b: &str, idx: &[usize]) -> String {
        let idx: Vec<String> = idx.iter().map(|i| i.to_string()).collect();
        let esize = 8 * t.prec.size_in_bytes();
        format!(
            "AJ_SHUFFLE({}, aj_mask_i{esize}x{}, {a}, {b}, {})",
            self.ty(t),
            t.lanes,
            idx.join(", ")
        )
    }

    /// The 4-byte vector `a` repeated to fill the 64-byte type `to` (the runtime header's
    /// `AJ_REPEAT32X16`: a broadcast of `a`'s bytes; the verifier admits no other sizes).
    pub fn repeat(&self, to: VType, a: &str) -> String {
        format!("AJ_REPEAT32X16({}, {a})", self.ty(to))
    }

    /// `vdpbf16ps`: dot products of bfloat16 pairs added to single-precision lanes (the
    /// runtime header's `AJ_DPBF16PS`, inline assembly of the one instruction, so that no
    /// compiler's bfloat16 types or builtins are relied on).
    pub fn dot_pairs(&self, acc: &str, a: &str, b: &str) -> String {
        format!("AJ_DPBF16PS({acc}, {a}, {b})")
    }

    /// `max(acc, x)` or `min(acc, x)` (IEEE maximumNumber / minimumNumber, lane by lane) when
    /// `acc` never holds a NaN: the runtime header's `AJ_VMAX_ACC` / `AJ_VMIN_ACC`, or for
    /// 64-byte vectors its `aj_vmax_acc_f32_16` and the like (one comparison on AVX-512).
    pub fn max_min_acc(&self, t: VType, op: Binop, acc: &str, x: &str) -> String {
        let name = if op == Binop::Min { "min" } else { "max" };
        match (t.prec, t.lanes) {
            (Prec::Single, 16) => format!("aj_v{name}_acc_f32_16({acc}, {x})"),
            (Prec::Double, 8) => format!("aj_v{name}_acc_f64_8({acc}, {x})"),
            _ => format!("AJ_V{}_ACC({acc}, {x})", name.to_uppercase()),
        }
    }

    /// A lane-wise binary operation; `None` for operations vectors do not support here.
    pub fn binop(&self, t: VType, op: Binop, a: &str, b: &str) -> Option<String> {
        let native = self.native(t);
        let (f, infix) = match op {
            Binop::Add => (native.as_ref().map(|n| n.add), "+"),
            Binop::Sub => (native.as_ref().map(|n| n.sub), "-"),
            Binop::Mul => (native.as_ref().map(|n| n.mul), "*"),
            // Every compiler spells `/` on its vector types, intrinsic types included.
            Binop::Div => (None, "/"),
            // IEEE maximumNumber / minimumNumber lane by lane, as the scalar `aj_max_f`
            // (the runtime header's `AJ_VMAX`, bit masks on GCC/Clang vectors, which the
            // intrinsics' types are too).
            Binop::Max => return Some(format!("AJ_VMAX({a}, {b})")),
            Binop::Min => return Some(format!("AJ_VMIN({a}, {b})")),
            _ => return None,
        };
        Some(match f {
            Some(f) => format!("{f}({a}, {b})"),
            None => format!("({a} {infix} {b})"),
        })
    }
}

impl Dialect {
    /// A call of the runtime header's lane-wise vector function `aj_v<name>_<f32|f64>_<lanes>`
    /// (see `runtime_c/arrayjit.h`, vector math); `None` for types it has no family for. With
    /// intrinsics, the operands and the result are cast between the intrinsic type and the
    /// header's generic vector type of the same shape (a bit cast).
    fn runtime_call(&self, t: VType, name: &str, args: &[&str]) -> Option<String> {
        let family = match (t.prec, t.lanes) {
            (Prec::Single, 4 | 8 | 16) => format!("f32_{}", t.lanes),
            (Prec::Double, 2 | 4 | 8) => format!("f64_{}", t.lanes),
            _ => return None,
        };
        Some(if self.native(t).is_some() {
            let generic = format!("aj_v{family}");
            let args: Vec<String> = args.iter().map(|a| format!("({generic})({a})")).collect();
            format!("(({})aj_v{name}_{family}({}))", self.ty(t), args.join(", "))
        } else {
            format!("aj_v{name}_{family}({})", args.join(", "))
        })
    }

    /// `a / d` for a vector `a` of single lanes and a scalar `d` (see `aj_vdivs_f32_N` in the
    /// runtime header: correctly rounded, as the division).
    pub fn divide_by_scalar(&self, t: VType, a: &str, d: &str) -> String {
        let family = format!("f32_{}", t.lanes);
        if self.native(t).is_some() {
            format!(
                "(({})aj_vdivs_{family}((aj_v{family})({a}), {d}))",
                self.ty(t)
            )
        } else {
            format!("aj_vdivs_{family}({a}, {d})")
        }
    }

    /// A lane-wise unary operation ([`crate::loops::Vlv::Unop`]); `None` for operations
    /// without a vector function ([`crate::loops::vector_unop`]).
    pub fn unop(&self, t: VType, op: Unop, a: &str) -> Option<String> {
        if !crate::loops::vector_unop(op, t.prec) {
            return None;
        }
        let one = if t.prec == Prec::Double {
            "1.0"
        } else {
            "1.0f"
        };
        match op {
            Unop::Identity => Some(a.to_string()),
            Unop::Neg => Some(format!("(-{a})")),
            Unop::Recip => Some(format!("({} / {a})", self.splat(t, one))),
            Unop::Satur01 => {
                let zero = self.zero(t);
                let low = self.runtime_call(t, "max", &[a, &zero])?;
                self.runtime_call(t, "min", &[&low, &self.splat(t, one)])
            }
            op => self.runtime_call(t, op.name(), &[a]),
        }
    }

    /// A lane-wise ternary operation ([`crate::loops::Vlv::Ternop`]): `fma` rounded once
    /// (the runtime's `aj_vfma_*`, one instruction where the target has FMA), `mul3` as two
    /// products; `None` for `where`.
    pub fn ternop(&self, t: VType, op: Ternop, a: &str, b: &str, c: &str) -> Option<String> {
        match op {
            Ternop::Fma => self.runtime_call(t, "fma", &[a, b, c]),
            Ternop::Mul3 => {
                let ab = self.binop(t, Binop::Mul, a, b)?;
                self.binop(t, Binop::Mul, &ab, c)
            }
            Ternop::Where => None,
        }
    }
}

/// The name of the generic vector type for `t`, e.g. `aj_v16f`, `aj_v8d`, `aj_v8u32`.
fn generic_name(t: VType) -> String {
    let e = match t.prec {
        Prec::Double => "d",
        Prec::Single => "f",
        Prec::Uint16 => "u16",
        Prec::Uint32 => "u32",
        Prec::Uint64 => "u64",
        p => p.name(),
    };
    format!("aj_v{}{e}", t.lanes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Integer lanes are vector extensions of unsigned lanes even where the intrinsics spell
    /// the float vectors, with untyped load and store helpers; their shuffles use masks of
    /// the lanes' width.
    #[test]
    fn integer_vectors_are_unsigned_vector_extensions() {
        let d = Dialect::new(VectorTarget {
            isa: Isa::Avx2,
            vector_bytes: 32,
            fma: true,
            intrinsics: true,
            ..VectorTarget::default()
        });
        let ty = |prec, lanes| VType { prec, lanes };
        assert_eq!(d.ty(ty(Prec::Single, 8)), "__m256");
        assert_eq!(d.ty(ty(Prec::Uint32, 8)), "aj_v8u32");
        assert_eq!(d.ty(ty(Prec::Uint64, 4)), "aj_v4u64");
        assert_eq!(d.ty(ty(Prec::Uint16, 16)), "aj_v16u16");
        let p = d.prelude(ty(Prec::Uint64, 4));
        assert!(
            p.contains("typedef uint64_t aj_v4u64 __attribute__((vector_size(32)));")
                && p.contains("aj_v4u64_load(const void *p)")
                && p.contains("aj_v4u64_store(void *p, aj_v4u64 v)"),
            "{p}"
        );
        assert_eq!(
            d.fma(ty(Prec::Uint32, 8), "a", "b", "c"),
            "(a * b + c)",
            "no intrinsic for integer lanes"
        );
        assert!(d
            .shuffle(ty(Prec::Uint64, 4), "a", "b", &[0, 4, 1, 5])
            .contains("aj_mask_i64x4"));
        assert!(d
            .shuffle(ty(Prec::Uint32, 8), "a", "b", &[0; 8])
            .contains("aj_mask_i32x8"));
    }
}
