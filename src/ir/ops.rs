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

impl Binop {
    /// Every binary operation.
    pub const ALL: [Binop; 10] = [
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
    ];

    /// The operation's row in the table.
    pub fn info(self) -> BinopInfo {
        let row = |name, neutral, c_float, c_double, infix, interpret| BinopInfo {
            name,
            neutral,
            c_float,
            c_double,
            infix,
            interpret,
        };
        match self {
            Binop::Add => row("add", 0.0, "($a + $b)", "($a + $b)", Some("+"), |a, b| {
                a + b
            }),
            Binop::Sub => row("sub", 0.0, "($a - $b)", "($a - $b)", Some("-"), |a, b| {
                a - b
            }),
            Binop::Mul => row("mul", 1.0, "($a * $b)", "($a * $b)", Some("*"), |a, b| {
                a * b
            }),
            Binop::Div => row("div", 1.0, "($a / $b)", "($a / $b)", Some("/"), |a, b| {
                a / b
            }),
            Binop::ToPowOf => row(
                "pow",
                1.0,
                "powf($a, $b)",
                "pow($a, $b)",
                Some("**"),
                f64::powf,
            ),
            Binop::ReluGate => row(
                "relu_gate",
                0.0,
                "aj_gate_f($a, $b)",
                "aj_gate_d($a, $b)",
                Some("-?/"),
                |a, b| if a > 0.0 { b } else { 0.0 },
            ),
            Binop::Arg1 => row("arg1", 0.0, "$a", "$a", Some("-@>"), |a, _| a),
            Binop::Arg2 => row("arg2", 0.0, "$b", "$b", Some("-/>"), |_, b| b),
            Binop::Max => row(
                "max",
                f64::NEG_INFINITY,
                "aj_max_f($a, $b)",
                "aj_max_d($a, $b)",
                None,
                max_number,
            ),
            Binop::Min => row(
                "min",
                f64::INFINITY,
                "aj_min_f($a, $b)",
                "aj_min_d($a, $b)",
                None,
                min_number,
            ),
        }
    }

    /// The snake_case name.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// Looks an operation up by its snake_case name.
    pub fn from_name(s: &str) -> Option<Binop> {
        Binop::ALL.into_iter().find(|op| op.name() == s)
    }

    /// The neutral element as an accumulator: 0 for add/sub, 1 for mul/div/pow, -inf for max,
    /// +inf for min, 0 otherwise.
    pub fn neutral(self) -> f64 {
        self.info().neutral
    }

    /// Applies the operation in `f64`.
    pub fn interpret(self, a: f64, b: f64) -> f64 {
        (self.info().interpret)(a, b)
    }

    /// The C expression for operands `a` and `b` in the given compute type.
    pub fn c_expr(self, in_float: bool, a: &str, b: &str) -> String {
        let info = self.info();
        let t = if in_float {
            info.c_float
        } else {
            info.c_double
        };
        t.replace("$a", a).replace("$b", b)
    }
}

impl Unop {
    /// Every unary operation.
    pub const ALL: [Unop; 10] = [
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
    ];

    /// The operation's row in the table.
    pub fn info(self) -> UnopInfo {
        let row = |name, c_float, c_double, interpret| UnopInfo {
            name,
            c_float,
            c_double,
            interpret,
        };
        match self {
            Unop::Identity => row("identity", "$a", "$a", |a| a),
            Unop::Relu => row("relu", "aj_relu_f($a)", "aj_relu_d($a)", relu),
            Unop::Neg => row("neg", "(-$a)", "(-$a)", |a| -a),
            Unop::Exp => row("exp", "expf($a)", "exp($a)", f64::exp),
            Unop::Log => row("log", "logf($a)", "log($a)", f64::ln),
            Unop::Sqrt => row("sqrt", "sqrtf($a)", "sqrt($a)", f64::sqrt),
            Unop::Recip => row("recip", "(1.0f / $a)", "(1.0 / $a)", |a| 1.0 / a),
            Unop::Tanh => row("tanh", "tanhf($a)", "tanh($a)", f64::tanh),
            Unop::Sin => row("sin", "sinf($a)", "sin($a)", f64::sin),
            Unop::Cos => row("cos", "cosf($a)", "cos($a)", f64::cos),
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

    /// Applies the operation in `f64`.
    pub fn interpret(self, a: f64) -> f64 {
        (self.info().interpret)(a)
    }

    /// The C expression for operand `a` in the given compute type.
    pub fn c_expr(self, in_float: bool, a: &str) -> String {
        let info = self.info();
        let t = if in_float {
            info.c_float
        } else {
            info.c_double
        };
        t.replace("$a", a)
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
