//! The table of operations: names, C syntax, neutral elements and interpretation.
//!
//! This is the one place that knows what an operation means. Adding an operation means adding
//! a variant and a row in [`Binop::info`] or [`Unop::info`]; the lowering, the optimizer, the
//! C writer, the program-file reader and the reference interpreter all read this table.
//!
//! C templates use `$a` and `$b` for the operands; each template comes in a `float` and a
//! `double` flavour, chosen by the compute type of the precision being written
//! (see [`crate::ir::Prec::compute_c_type`]). A template names each operand at most once
//! (an operation that needs its operand twice is a `static inline` helper of
//! `runtime_c/arrayjit.h` taking it once): operands are whole printed expressions, so naming
//! one twice would double the C text at every level of an inlined chain.

use std::fmt;

/// Binary operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Binop {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// `a / b`
    Div,
    /// `a` to the power `b`
    ToPowOf,
    /// `a > 0 ? b : 0` (the gradient gate of ReLU)
    ReluGate,
    /// `a` (first argument)
    Arg1,
    /// `b` (second argument); as an accumulator it means "overwrite"
    Arg2,
    /// The larger of `a` and `b`: IEEE 754-2019 maximumNumber (a NaN operand is ignored, as
    /// C `fmax`, and +0 is larger than -0), see [`max_number`]
    Max,
    /// The smaller of `a` and `b`: IEEE 754-2019 minimumNumber (a NaN operand is ignored, as
    /// C `fmin`, and -0 is smaller than +0), see [`min_number`]
    Min,
    /// Floats: C `fmod(a, b)`; integers: C `%` (sign of the dividend), `x mod 0 = 0`
    Mod,
    /// `a < b` (1 or 0; NaN compares false)
    Lt,
    /// `a <= b`
    Le,
    /// `a > b`
    Gt,
    /// `a >= b`
    Ge,
    /// `a == b`
    Eq,
    /// `a != b` (true when either is NaN)
    Ne,
    /// 1 if both are non-zero (NaN is non-zero), else 0
    And,
    /// 1 if either is non-zero, else 0
    Or,
    /// `0 < a < 1 ? b : 0` (the gradient gate of `satur01`)
    Satur01Gate,
    /// Bitwise and (integer precisions only)
    BitAnd,
    /// Bitwise or (integer precisions only)
    BitOr,
    /// Bitwise exclusive or (integer precisions only)
    BitXor,
    /// `a << (b mod width)` (integer precisions only)
    Shl,
    /// `a >> (b mod width)` on the operand's exact value: arithmetic for a signed operand,
    /// logical for a uint64 one (integer precisions only)
    Shr,
}

/// Unary operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unop {
    /// `a`
    Identity,
    /// `a > 0 ? a : 0`
    Relu,
    /// `-a`
    Neg,
    /// `e^a`
    Exp,
    /// natural logarithm
    Log,
    /// square root
    Sqrt,
    /// `1 / a`
    Recip,
    /// hyperbolic tangent
    Tanh,
    /// sine
    Sin,
    /// cosine
    Cos,
    /// `min(max(a, 0), 1)` (NaN gives 0)
    Satur01,
    /// `2^a`
    Exp2,
    /// logarithm base 2
    Log2,
    /// `1 / sqrt(a)`
    Rsqrt,
    /// rounding toward zero
    Trunc,
    /// rounding down
    Floor,
    /// rounding up
    Ceil,
    /// `|a|`
    Abs,
    /// `1 / (1 + e^-a)`
    Sigmoid,
    /// 1 if `a` is 0, else 0
    Not,
}

/// How the integer compute type (SPEC 9.1) reads the operands of one operation: each is a
/// 64-bit pattern holding a signed (int64) or an unsigned (uint64) value (see
/// [`crate::loops::int_unsigned`]), and operations see their exact values, so a signed and an
/// unsigned operand compare, divide and select exactly. `width` is the result precision's
/// width in bits (8, 16, 32 or 64): shift counts are taken modulo it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntCtx {
    /// Whether the first operand is an unsigned (uint64) value.
    pub a_unsigned: bool,
    /// Whether the second operand is an unsigned (uint64) value.
    pub b_unsigned: bool,
    /// The result precision's width in bits.
    pub width: u32,
}

impl IntCtx {
    /// The context of an operation writing a result of `width` bits on operands of the given
    /// signedness (the second one is ignored by unary operations).
    pub fn new(width: u32, a_unsigned: bool, b_unsigned: bool) -> IntCtx {
        IntCtx {
            a_unsigned,
            b_unsigned,
            width,
        }
    }

    /// The context with the operands swapped.
    fn swap(self) -> IntCtx {
        IntCtx::new(self.width, self.b_unsigned, self.a_unsigned)
    }

    /// Whether the value of `a` is negative.
    fn a_neg(self, a: u64) -> bool {
        !self.a_unsigned && (a as i64) < 0
    }

    /// `a < b` on the exact values.
    fn lt(self, a: u64, b: u64) -> bool {
        match (self.a_unsigned, self.b_unsigned) {
            (false, false) => (a as i64) < (b as i64),
            (true, true) => a < b,
            (false, true) => (a as i64) < 0 || a < b,
            (true, false) => (b as i64) >= 0 && a < b,
        }
    }

    /// `a == b` on the exact values (-1 and 2^64-1 differ).
    fn eq(self, a: u64, b: u64) -> bool {
        a == b && (self.a_unsigned == self.b_unsigned || (!self.a_neg(a) && !self.swap().a_neg(b)))
    }

    /// The magnitude and sign of the first operand.
    fn a_mag(self, a: u64) -> (u64, bool) {
        if self.a_neg(a) {
            (a.wrapping_neg(), true)
        } else {
            (a, false)
        }
    }

    /// `a` converted to `double` (rounded to nearest).
    fn to_f64(self, a: u64) -> f64 {
        if self.a_unsigned {
            a as f64
        } else {
            a as i64 as f64
        }
    }
}

/// Ternary operations (SPEC section 9.2); `a`, `b`, `c` are the three arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ternop {
    /// `a != 0 ? b : c` (NaN is non-zero)
    Where,
    /// `a * b + c`, rounded once (C `fmaf` / `fma`, correctly rounded on every CPU)
    Fma,
    /// `a * b * c` (left to right)
    Mul3,
}

/// A row of the ternary-operation table.
#[derive(Clone, Copy, Debug)]
pub struct TernopInfo {
    /// The snake_case name used in program files and dumps.
    pub name: &'static str,
    /// C expression when computing in `float` (operands `$a`, `$b`, `$c`, each named once).
    pub c_float: &'static str,
    /// C expression when computing in `double`.
    pub c_double: &'static str,
    /// C expression in the integer compute type of SPEC section 9.1 (`uint64_t` operands,
    /// wrapping arithmetic, no undefined behaviour).
    pub c_int: &'static str,
    /// The meaning in `f64` (computing in `double`).
    pub interpret: fn(f64, f64, f64) -> f64,
    /// The meaning when computing in `float`: operands are `float` values (held in `f64`),
    /// the result is rounded to `float` as C computes it.
    pub interpret_f32: fn(f64, f64, f64) -> f64,
    /// The meaning in the integer compute type of SPEC section 9.1: 64-bit words, wrapping
    /// (`where` tests `a != 0`).
    pub interpret_int: fn(u64, u64, u64) -> u64,
}

/// A row of the binary-operation table.
#[derive(Clone, Copy, Debug)]
pub struct BinopInfo {
    /// The snake_case name used in program files and dumps.
    pub name: &'static str,
    /// The neutral element when used as an accumulator.
    pub neutral: f64,
    /// C expression when computing in `float`.
    pub c_float: &'static str,
    /// C expression when computing in `double`.
    pub c_double: &'static str,
    /// Infix symbol for the readable printers, if the operation has one.
    pub infix: Option<&'static str>,
    /// The meaning, in `f64`.
    pub interpret: fn(f64, f64) -> f64,
    /// C expression when computing in 64-bit integers (`uint64_t` operands); `$m` stands for
    /// the operands' signedness (`s`, `u`, `su`: signed then unsigned, or `us`), `$n` for the
    /// same with the operands swapped, `$sa` for the first operand's (`s` or `u`), `$w` for
    /// the result's width.
    pub c_int: &'static str,
    /// The meaning in 64-bit integers (wrapping patterns).
    pub interpret_int: fn(u64, u64, IntCtx) -> u64,
}

/// A row of the unary-operation table.
#[derive(Clone, Copy, Debug)]
pub struct UnopInfo {
    /// The snake_case name used in program files and dumps.
    pub name: &'static str,
    /// C expression when computing in `float`.
    pub c_float: &'static str,
    /// C expression when computing in `double`.
    pub c_double: &'static str,
    /// The meaning, in `f64`.
    pub interpret: fn(f64) -> f64,
    /// C expression when computing in 64-bit integers (see [`BinopInfo::c_int`]).
    pub c_int: &'static str,
    /// The meaning in 64-bit integers (wrapping patterns).
    pub interpret_int: fn(u64, IntCtx) -> u64,
}

/// The larger of `a` and `b`, as IEEE 754-2019 maximumNumber: a NaN operand is ignored (two
/// NaNs give NaN), and +0 is larger than -0, so `max(-0, +0) = max(+0, -0) = +0`. (Rust's
/// `f64::max` and C's `fmax` leave the sign of a zero result unspecified.) The generated C
/// computes the same with `aj_max_f` / `aj_max_d` of `runtime_c/arrayjit.h`.
pub fn max_number(a: f64, b: f64) -> f64 {
    if a.is_nan() || b > a {
        b
    } else if b.is_nan() || a > b {
        a
    } else if a.is_sign_negative() {
        // Equal: they differ at most in the sign of a zero, and +0 wins.
        b
    } else {
        a
    }
}

/// The smaller of `a` and `b`, as IEEE 754-2019 minimumNumber: a NaN operand is ignored (two
/// NaNs give NaN), and -0 is smaller than +0, so `min(-0, +0) = min(+0, -0) = -0`. The
/// generated C computes the same with `aj_min_f` / `aj_min_d` of `runtime_c/arrayjit.h`.
pub fn min_number(a: f64, b: f64) -> f64 {
    if a.is_nan() || b < a {
        b
    } else if b.is_nan() || a < b {
        a
    } else if a.is_sign_negative() {
        // Equal: they differ at most in the sign of a zero, and -0 wins.
        a
    } else {
        b
    }
}

fn relu(a: f64) -> f64 {
    if a > 0.0 {
        a
    } else {
        0.0
    }
}

fn b2f(c: bool) -> f64 {
    if c {
        1.0
    } else {
        0.0
    }
}

/// The integer power `a^b` (SPEC 9.1): exact and wrapped for a non-negative exponent; for a
/// negative one (a signed exponent below 0) the real result truncated: 0, except for bases 1
/// and -1 (a signed -1, not the uint64 2^64-1).
pub fn int_pow(a: u64, b: u64, c: IntCtx) -> u64 {
    if c.swap().a_neg(b) {
        return match a {
            1 => 1,
            u64::MAX if !c.a_unsigned => {
                if b & 1 == 1 {
                    u64::MAX
                } else {
                    1
                }
            }
            _ => 0,
        };
    }
    let (mut base, mut e, mut r) = (a, b, 1u64);
    while e > 0 {
        if e & 1 == 1 {
            r = r.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        e >>= 1;
    }
    r
}

/// Division truncating toward zero of the exact values (magnitudes, then the sign); `x / 0`
/// is 0 and the most negative int64 divided by -1 wraps to itself.
fn int_div(a: u64, b: u64, c: IntCtx) -> u64 {
    if b == 0 {
        return 0;
    }
    let ((ma, na), (mb, nb)) = (c.a_mag(a), c.swap().a_mag(b));
    let q = ma / mb;
    if na != nb {
        q.wrapping_neg()
    } else {
        q
    }
}

/// C's `%` on the exact values (the sign of the dividend); `x % 0` is 0.
fn int_mod(a: u64, b: u64, c: IntCtx) -> u64 {
    if b == 0 {
        return 0;
    }
    let ((ma, na), (mb, _)) = (c.a_mag(a), c.swap().a_mag(b));
    let r = ma % mb;
    if na {
        r.wrapping_neg()
    } else {
        r
    }
}

/// `a >> (b mod width)` on the exact value of `a`: arithmetic for a signed operand, logical
/// for a uint64 one (the result is then stored by the wrapping rule).
fn int_shr(a: u64, b: u64, c: IntCtx) -> u64 {
    let k = b & u64::from(c.width - 1);
    if c.a_unsigned {
        a >> k
    } else {
        ((a as i64) >> k) as u64
    }
}

/// A function of reals on an integer (SPEC 9.1): computed in `double`, then truncated and
/// wrapped like a store.
fn real_fn(a: u64, c: IntCtx, f: fn(f64) -> f64) -> u64 {
    crate::ir::prec::int_bits_of_f64(f(c.to_f64(a)))
}

fn sigmoid(a: f64) -> f64 {
    1.0 / (1.0 + (-a).exp())
}

impl Binop {
    /// Every binary operation.
    pub const ALL: [Binop; 25] = [
        Binop::Add,
        Binop::Sub,
        Binop::Mul,
        Binop::Div,
        Binop::ToPowOf,
        Binop::ReluGate,
        Binop::Arg1,
        Binop::Arg2,
        Binop::Max,
        Binop::Min,
        Binop::Mod,
        Binop::Lt,
        Binop::Le,
        Binop::Gt,
        Binop::Ge,
        Binop::Eq,
        Binop::Ne,
        Binop::And,
        Binop::Or,
        Binop::Satur01Gate,
        Binop::BitAnd,
        Binop::BitOr,
        Binop::BitXor,
        Binop::Shl,
        Binop::Shr,
    ];

    /// The operation's row in the table.
    pub fn info(self) -> BinopInfo {
        #[allow(clippy::type_complexity)]
        let row = |name,
                   neutral,
                   c_float,
                   c_double,
                   infix,
                   interpret: fn(f64, f64) -> f64,
                   c_int,
                   interpret_int: fn(u64, u64, IntCtx) -> u64| BinopInfo {
            name,
            neutral,
            c_float,
            c_double,
            infix,
            interpret,
            c_int,
            interpret_int,
        };
        match self {
            Binop::Add => row(
                "add",
                0.0,
                "($a + $b)",
                "($a + $b)",
                Some("+"),
                |a, b| a + b,
                "($a + $b)",
                |a, b, _| a.wrapping_add(b),
            ),
            Binop::Sub => row(
                "sub",
                0.0,
                "($a - $b)",
                "($a - $b)",
                Some("-"),
                |a, b| a - b,
                "($a - $b)",
                |a, b, _| a.wrapping_sub(b),
            ),
            Binop::Mul => row(
                "mul",
                1.0,
                "($a * $b)",
                "($a * $b)",
                Some("*"),
                |a, b| a * b,
                "($a * $b)",
                |a, b, _| a.wrapping_mul(b),
            ),
            Binop::Div => row(
                "div",
                1.0,
                "($a / $b)",
                "($a / $b)",
                Some("/"),
                |a, b| a / b,
                "aj_div_$m($a, $b)",
                int_div,
            ),
            Binop::ToPowOf => row(
                "pow",
                1.0,
                "powf($a, $b)",
                "pow($a, $b)",
                Some("**"),
                f64::powf,
                "aj_pow_$m($a, $b)",
                int_pow,
            ),
            Binop::ReluGate => row(
                "relu_gate",
                0.0,
                "aj_gate_f($a, $b)",
                "aj_gate_d($a, $b)",
                Some("-?/"),
                |a, b| if a > 0.0 { b } else { 0.0 },
                "aj_igate_$sa($a, $b)",
                |a, b, c| if a != 0 && !c.a_neg(a) { b } else { 0 },
            ),
            Binop::Arg1 => row(
                "arg1",
                0.0,
                "$a",
                "$a",
                Some("-@>"),
                |a, _| a,
                "$a",
                |a, _, _| a,
            ),
            Binop::Arg2 => row(
                "arg2",
                0.0,
                "$b",
                "$b",
                Some("-/>"),
                |_, b| b,
                "$b",
                |_, b, _| b,
            ),
            Binop::Max => row(
                "max",
                f64::NEG_INFINITY,
                "aj_max_f($a, $b)",
                "aj_max_d($a, $b)",
                None,
                max_number,
                "aj_imax_$m($a, $b)",
                |a, b, c| if c.lt(a, b) { b } else { a },
            ),
            Binop::Min => row(
                "min",
                f64::INFINITY,
                "aj_min_f($a, $b)",
                "aj_min_d($a, $b)",
                None,
                min_number,
                "aj_imin_$m($a, $b)",
                |a, b, c| if c.swap().lt(b, a) { b } else { a },
            ),
            Binop::Mod => row(
                "mod",
                0.0,
                "fmodf($a, $b)",
                "fmod($a, $b)",
                None,
                |a, b| a % b,
                "aj_mod_$m($a, $b)",
                int_mod,
            ),
            Binop::Lt => row(
                "lt",
                0.0,
                "(float)($a < $b)",
                "(double)($a < $b)",
                None,
                |a, b| b2f(a < b),
                "aj_lt_$m($a, $b)",
                |a, b, c| u64::from(c.lt(a, b)),
            ),
            Binop::Le => row(
                "le",
                0.0,
                "(float)($a <= $b)",
                "(double)($a <= $b)",
                None,
                |a, b| b2f(a <= b),
                "aj_le_$m($a, $b)",
                |a, b, c| u64::from(!c.swap().lt(b, a)),
            ),
            Binop::Gt => row(
                "gt",
                0.0,
                "(float)($a > $b)",
                "(double)($a > $b)",
                None,
                |a, b| b2f(a > b),
                "aj_lt_$n($b, $a)",
                |a, b, c| u64::from(c.swap().lt(b, a)),
            ),
            Binop::Ge => row(
                "ge",
                0.0,
                "(float)($a >= $b)",
                "(double)($a >= $b)",
                None,
                |a, b| b2f(a >= b),
                "aj_le_$n($b, $a)",
                |a, b, c| u64::from(!c.lt(a, b)),
            ),
            Binop::Eq => row(
                "eq",
                0.0,
                "(float)($a == $b)",
                "(double)($a == $b)",
                None,
                |a, b| b2f(a == b),
                "aj_eq_$m($a, $b)",
                |a, b, c| u64::from(c.eq(a, b)),
            ),
            Binop::Ne => row(
                "ne",
                0.0,
                "(float)($a != $b)",
                "(double)($a != $b)",
                None,
                |a, b| b2f(a != b),
                "(UINT64_C(1) ^ aj_eq_$m($a, $b))",
                |a, b, c| u64::from(!c.eq(a, b)),
            ),
            Binop::And => row(
                "and",
                1.0,
                "(float)($a != 0.0f && $b != 0.0f)",
                "(double)($a != 0.0 && $b != 0.0)",
                None,
                |a, b| b2f(a != 0.0 && b != 0.0),
                "(uint64_t)($a != 0 && $b != 0)",
                |a, b, _| u64::from(a != 0 && b != 0),
            ),
            Binop::Or => row(
                "or",
                0.0,
                "(float)($a != 0.0f || $b != 0.0f)",
                "(double)($a != 0.0 || $b != 0.0)",
                None,
                |a, b| b2f(a != 0.0 || b != 0.0),
                "(uint64_t)($a != 0 || $b != 0)",
                |a, b, _| u64::from(a != 0 || b != 0),
            ),
            Binop::Satur01Gate => row(
                "satur01_gate",
                0.0,
                "aj_sgate_f($a, $b)",
                "aj_sgate_d($a, $b)",
                None,
                |a, b| if a > 0.0 && a < 1.0 { b } else { 0.0 },
                // no integer lies strictly between 0 and 1
                "aj_izero($a, $b)",
                |_, _, _| 0,
            ),
            Binop::BitAnd => row(
                "bit_and",
                0.0,
                "aj_izero_f($a, $b)",
                "aj_izero_d($a, $b)",
                None,
                |_, _| f64::NAN,
                "($a & $b)",
                |a, b, _| a & b,
            ),
            Binop::BitOr => row(
                "bit_or",
                0.0,
                "aj_izero_f($a, $b)",
                "aj_izero_d($a, $b)",
                None,
                |_, _| f64::NAN,
                "($a | $b)",
                |a, b, _| a | b,
            ),
            Binop::BitXor => row(
                "bit_xor",
                0.0,
                "aj_izero_f($a, $b)",
                "aj_izero_d($a, $b)",
                None,
                |_, _| f64::NAN,
                "($a ^ $b)",
                |a, b, _| a ^ b,
            ),
            Binop::Shl => row(
                "shl",
                0.0,
                "aj_izero_f($a, $b)",
                "aj_izero_d($a, $b)",
                None,
                |_, _| f64::NAN,
                "aj_shl($a, $b, $w)",
                |a, b, c| a << (b & u64::from(c.width - 1)),
            ),
            Binop::Shr => row(
                "shr",
                0.0,
                "aj_izero_f($a, $b)",
                "aj_izero_d($a, $b)",
                None,
                |_, _| f64::NAN,
                "aj_shr_$sa($a, $b, $w)",
                int_shr,
            ),
        }
    }

    /// Whether the operation is defined on integer precisions only (SPEC 9.2).
    pub fn is_integer_only(self) -> bool {
        matches!(
            self,
            Binop::BitAnd | Binop::BitOr | Binop::BitXor | Binop::Shl | Binop::Shr
        )
    }

    /// The snake_case name.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// Looks an operation up by its snake_case name.
    pub fn from_name(s: &str) -> Option<Binop> {
        Binop::ALL.into_iter().find(|op| op.name() == s)
    }

    /// Parses a name, or [`crate::Error::UnknownOp`] listing the known binary operations.
    pub fn parse(s: &str) -> crate::error::Result<Binop> {
        Binop::from_name(s).ok_or_else(|| crate::error::Error::UnknownOp {
            name: s.to_string(),
            known: Binop::ALL.map(Binop::name).join(", "),
        })
    }

    /// The neutral element as an accumulator: 0 for add/sub, 1 for mul/div/pow, -inf for max,
    /// +inf for min, 1 for `and` (0 for `or`, `bit_or`, `bit_xor`; see [`Binop::int_neutral`]
    /// for `bit_and`), 0 otherwise.
    pub fn neutral(self) -> f64 {
        self.info().neutral
    }

    /// The neutral element for results of an integer precision `prec` (SPEC 9.1): the type's
    /// minimum for max and maximum for min, all ones for `bit_and`, as a 64-bit pattern;
    /// otherwise as [`Binop::neutral`].
    pub fn int_neutral(self, prec: crate::ir::Prec) -> u64 {
        let signed = prec.is_signed_integer();
        let bits = prec.int_bits().unwrap_or(64);
        match self {
            Binop::Max if signed => (i64::MIN >> (64 - bits)) as u64,
            Binop::Max => 0,
            Binop::Min if signed => (i64::MAX >> (64 - bits)) as u64,
            Binop::Min => u64::MAX >> (64 - bits),
            // all ones (numpy's bitwise_and.reduce starts there)
            Binop::BitAnd => u64::MAX,
            op => crate::ir::prec::int_bits_of_f64(op.neutral()),
        }
    }

    /// Applies the operation in `f64`.
    pub fn interpret(self, a: f64, b: f64) -> f64 {
        (self.info().interpret)(a, b)
    }

    /// Applies the operation in 64-bit integers.
    pub fn interpret_int(self, a: u64, b: u64, c: IntCtx) -> u64 {
        (self.info().interpret_int)(a, b, c)
    }

    /// The C expression for operands `a` and `b` in the given floating compute type.
    pub fn c_expr(self, in_float: bool, a: &str, b: &str) -> String {
        let info = self.info();
        let t = if in_float {
            info.c_float
        } else {
            info.c_double
        };
        t.replace("$a", a).replace("$b", b)
    }

    /// The C expression for `uint64_t` operands `a` and `b` in integer compute.
    pub fn c_expr_int(self, c: IntCtx, a: &str, b: &str) -> String {
        fill_int(self.info().c_int, c)
            .replace("$a", a)
            .replace("$b", b)
    }
}

fn fill_int(t: &str, c: IntCtx) -> String {
    let pair = |a: bool, b: bool| match (a, b) {
        (false, false) => "s",
        (true, true) => "u",
        (false, true) => "su",
        (true, false) => "us",
    };
    t.replace("$m", pair(c.a_unsigned, c.b_unsigned))
        .replace("$n", pair(c.b_unsigned, c.a_unsigned))
        .replace("$sa", if c.a_unsigned { "u" } else { "s" })
        .replace("$w", &c.width.to_string())
}

impl Unop {
    /// Every unary operation.
    pub const ALL: [Unop; 20] = [
        Unop::Identity,
        Unop::Relu,
        Unop::Neg,
        Unop::Exp,
        Unop::Log,
        Unop::Sqrt,
        Unop::Recip,
        Unop::Tanh,
        Unop::Sin,
        Unop::Cos,
        Unop::Satur01,
        Unop::Exp2,
        Unop::Log2,
        Unop::Rsqrt,
        Unop::Trunc,
        Unop::Floor,
        Unop::Ceil,
        Unop::Abs,
        Unop::Sigmoid,
        Unop::Not,
    ];

    /// The operation's row in the table.
    pub fn info(self) -> UnopInfo {
        let row =
            |name, c_float, c_double, interpret: fn(f64) -> f64, c_int, interpret_int| UnopInfo {
                name,
                c_float,
                c_double,
                interpret,
                c_int,
                interpret_int,
            };
        // Functions of reals: computed in double from the integer, then stored by the rule.
        macro_rules! real {
            ($name:expr, $cf:expr, $cd:expr, $f:expr, $ci:expr) => {
                row($name, $cf, $cd, $f, $ci, |a, c| real_fn(a, c, $f))
            };
        }
        match self {
            Unop::Identity => row("identity", "$a", "$a", |a| a, "$a", |a, _| a),
            Unop::Relu => row(
                "relu",
                "aj_relu_f($a)",
                "aj_relu_d($a)",
                relu,
                "aj_irelu_$sa($a)",
                |a, c| if a != 0 && !c.a_neg(a) { a } else { 0 },
            ),
            Unop::Neg => row(
                "neg",
                "(-$a)",
                "(-$a)",
                |a| -a,
                "(UINT64_C(0) - $a)",
                |a, _| a.wrapping_neg(),
            ),
            Unop::Exp => real!(
                "exp",
                "expf($a)",
                "exp($a)",
                f64::exp,
                "aj_d2u64(exp(aj_i2d_$sa($a)))"
            ),
            Unop::Log => real!(
                "log",
                "logf($a)",
                "log($a)",
                f64::ln,
                "aj_d2u64(log(aj_i2d_$sa($a)))"
            ),
            Unop::Sqrt => real!(
                "sqrt",
                "sqrtf($a)",
                "sqrt($a)",
                f64::sqrt,
                "aj_d2u64(sqrt(aj_i2d_$sa($a)))"
            ),
            Unop::Recip => real!(
                "recip",
                "(1.0f / $a)",
                "(1.0 / $a)",
                |a| 1.0 / a,
                "aj_d2u64(1.0 / aj_i2d_$sa($a))"
            ),
            Unop::Tanh => real!(
                "tanh",
                "tanhf($a)",
                "tanh($a)",
                f64::tanh,
                "aj_d2u64(tanh(aj_i2d_$sa($a)))"
            ),
            Unop::Sin => real!(
                "sin",
                "sinf($a)",
                "sin($a)",
                f64::sin,
                "aj_d2u64(sin(aj_i2d_$sa($a)))"
            ),
            Unop::Cos => real!(
                "cos",
                "cosf($a)",
                "cos($a)",
                f64::cos,
                "aj_d2u64(cos(aj_i2d_$sa($a)))"
            ),
            Unop::Satur01 => row(
                "satur01",
                "aj_min_f(aj_max_f($a, 0.0f), 1.0f)",
                "aj_min_d(aj_max_d($a, 0.0), 1.0)",
                |a| min_number(max_number(a, 0.0), 1.0),
                "aj_ipos_$sa($a)",
                |a, c| u64::from(a != 0 && !c.a_neg(a)),
            ),
            Unop::Exp2 => real!(
                "exp2",
                "exp2f($a)",
                "exp2($a)",
                f64::exp2,
                "aj_d2u64(exp2(aj_i2d_$sa($a)))"
            ),
            Unop::Log2 => real!(
                "log2",
                "log2f($a)",
                "log2($a)",
                f64::log2,
                "aj_d2u64(log2(aj_i2d_$sa($a)))"
            ),
            Unop::Rsqrt => real!(
                "rsqrt",
                "(1.0f / sqrtf($a))",
                "(1.0 / sqrt($a))",
                |a| 1.0 / a.sqrt(),
                "aj_d2u64(1.0 / sqrt(aj_i2d_$sa($a)))"
            ),
            Unop::Trunc => row(
                "trunc",
                "truncf($a)",
                "trunc($a)",
                f64::trunc,
                "$a",
                |a, _| a,
            ),
            Unop::Floor => row(
                "floor",
                "floorf($a)",
                "floor($a)",
                f64::floor,
                "$a",
                |a, _| a,
            ),
            Unop::Ceil => row("ceil", "ceilf($a)", "ceil($a)", f64::ceil, "$a", |a, _| a),
            Unop::Abs => row(
                "abs",
                "fabsf($a)",
                "fabs($a)",
                f64::abs,
                "aj_iabs_$sa($a)",
                |a, c| if c.a_neg(a) { a.wrapping_neg() } else { a },
            ),
            Unop::Sigmoid => real!(
                "sigmoid",
                "aj_sigmoid_f($a)",
                "aj_sigmoid_d($a)",
                sigmoid,
                "aj_d2u64(aj_sigmoid_d(aj_i2d_$sa($a)))"
            ),
            Unop::Not => row(
                "not",
                "(float)($a == 0.0f)",
                "(double)($a == 0.0)",
                |a| b2f(a == 0.0),
                "(uint64_t)($a == 0)",
                |a, _| u64::from(a == 0),
            ),
        }
    }

    /// The snake_case name.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// Looks an operation up by its snake_case name.
    pub fn from_name(s: &str) -> Option<Unop> {
        Unop::ALL.into_iter().find(|op| op.name() == s)
    }

    /// Parses a name, or [`crate::Error::UnknownOp`] listing the known unary operations.
    pub fn parse(s: &str) -> crate::error::Result<Unop> {
        Unop::from_name(s).ok_or_else(|| crate::error::Error::UnknownOp {
            name: s.to_string(),
            known: Unop::ALL.map(Unop::name).join(", "),
        })
    }

    /// Applies the operation in `f64`.
    pub fn interpret(self, a: f64) -> f64 {
        (self.info().interpret)(a)
    }

    /// Applies the operation in 64-bit integers.
    pub fn interpret_int(self, a: u64, c: IntCtx) -> u64 {
        (self.info().interpret_int)(a, c)
    }

    /// The C expression for operand `a` in the given floating compute type.
    pub fn c_expr(self, in_float: bool, a: &str) -> String {
        let info = self.info();
        let t = if in_float {
            info.c_float
        } else {
            info.c_double
        };
        t.replace("$a", a)
    }

    /// The C expression for a `uint64_t` operand `a` in integer compute.
    pub fn c_expr_int(self, c: IntCtx, a: &str) -> String {
        fill_int(self.info().c_int, c).replace("$a", a)
    }
}

impl Ternop {
    /// Every ternary operation.
    pub const ALL: [Ternop; 3] = [Ternop::Where, Ternop::Fma, Ternop::Mul3];

    /// The operation's row in the table.
    pub fn info(self) -> TernopInfo {
        match self {
            Ternop::Where => TernopInfo {
                name: "where",
                c_float: "aj_where_f($a, $b, $c)",
                c_double: "aj_where_d($a, $b, $c)",
                c_int: "aj_where_u64($a, $b, $c)",
                interpret: |a, b, c| if a != 0.0 { b } else { c },
                interpret_f32: |a, b, c| if a != 0.0 { b } else { c },
                interpret_int: |a, b, c| if a != 0 { b } else { c },
            },
            Ternop::Fma => TernopInfo {
                name: "fma",
                c_float: "fmaf($a, $b, $c)",
                c_double: "fma($a, $b, $c)",
                c_int: "($a * $b + $c)",
                interpret: f64::mul_add,
                interpret_f32: |a, b, c| (a as f32).mul_add(b as f32, c as f32) as f64,
                interpret_int: |a, b, c| a.wrapping_mul(b).wrapping_add(c),
            },
            Ternop::Mul3 => TernopInfo {
                name: "mul3",
                c_float: "($a * $b * $c)",
                c_double: "($a * $b * $c)",
                c_int: "($a * $b * $c)",
                interpret: |a, b, c| a * b * c,
                interpret_f32: |a, b, c| ((a as f32) * (b as f32) * (c as f32)) as f64,
                interpret_int: |a, b, c| a.wrapping_mul(b).wrapping_mul(c),
            },
        }
    }

    /// The snake_case name.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// Looks an operation up by its snake_case name.
    pub fn from_name(s: &str) -> Option<Ternop> {
        Ternop::ALL.into_iter().find(|op| op.name() == s)
    }

    /// Applies the operation in the compute type: `float` when `in_float` (operands must be
    /// `float` values), else `double`. Exact: the fused multiply-add rounds once in both.
    pub fn interpret(self, in_float: bool, a: f64, b: f64, c: f64) -> f64 {
        let info = self.info();
        if in_float {
            (info.interpret_f32)(a, b, c)
        } else {
            (info.interpret)(a, b, c)
        }
    }

    /// Applies the operation in the integer compute type (64-bit words, wrapping).
    pub fn interpret_int(self, a: u64, b: u64, c: u64) -> u64 {
        (self.info().interpret_int)(a, b, c)
    }

    /// The C expression for operands `a`, `b`, `c` in the given compute type.
    pub fn c_expr(self, in_float: bool, a: &str, b: &str, c: &str) -> String {
        let info = self.info();
        let t = if in_float {
            info.c_float
        } else {
            info.c_double
        };
        substitute3(t, a, b, c)
    }

    /// The C expression for `uint64_t` operands in the integer compute type (SPEC 9.1).
    pub fn c_expr_int(self, a: &str, b: &str, c: &str) -> String {
        substitute3(self.info().c_int, a, b, c)
    }
}

/// Replaces `$a`, `$b` and `$c` in a template, in one pass (an operand's text containing
/// `$b` is left alone).
fn substitute3(t: &str, a: &str, b: &str, c: &str) -> String {
    let mut out = String::with_capacity(t.len() + a.len() + b.len() + c.len());
    let mut chars = t.chars().peekable();
    while let Some(ch) = chars.next() {
        let operand = match (ch, chars.peek()) {
            ('$', Some('a')) => Some(a),
            ('$', Some('b')) => Some(b),
            ('$', Some('c')) => Some(c),
            _ => None,
        };
        match operand {
            Some(x) => {
                out.push_str(x);
                chars.next();
            }
            None => out.push(ch),
        }
    }
    out
}

impl fmt::Display for Ternop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Binop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Unop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
