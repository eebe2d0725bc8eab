#!/usr/bin/env python3
"""An independent conformance checker for SPEC section 9 (precisions, operations, affine
indices, gather / scatter-add, random fetch) through `arrayjit run FILE.json`.

It generates random program files (the JSON format of PROGRAM_FORMAT.md), computes the values
they must print with its own implementation of the SPEC (written from SPEC.md and the program
format only, never from arrayjit's Rust code), runs `arrayjit run` (compiled, under varying
compilers and flags) and `arrayjit run --interpret` on each and compares every printed value:
exactly for integers, bfloat16 and fp8 (NaN equals NaN) and for exactly-rounded operations in
half, single and double; within an error bound that the reference carries along for libm
functions (exp, log, sin, tanh, sigmoid, pow, ...), fused multiply-adds the C compiler may
contract, and single/double reductions whose summation order may differ.

Usage:
    python3 -m venv /tmp/confenv && /tmp/confenv/bin/pip install numpy ml_dtypes
    /tmp/confenv/bin/python scripts/conformance.py --cases 500 --seed 1
    /tmp/confenv/bin/python scripts/conformance.py --check FILE.json [FILE.json ...]
    /tmp/confenv/bin/python scripts/conformance.py --reference FILE.json   (print expected)

Every mismatching program is kept on disk (--keep DIR, default /tmp/conformance/seed-S) and
named in the report; the exit status is 1 if any case mismatched, 0 otherwise.

The reference model (decisions where SPEC is silent are marked DECISION):
- compute type of a statement: double for a double result, float (binary32) for any other
  floating result, exact integers modulo 2^64 when the result and every argument are integers,
  double for an integer result with a floating argument (SPEC 9.1);
- integer values keep their exact value; an operation's result is reduced modulo 2^64 to a
  signed 64-bit value, or an unsigned one when one of its operands is a uint64 value
  (DECISION: signedness follows the operands, so exact values are compared exactly);
- storing: integers truncate toward zero then wrap (NaN/inf store 0); bfloat16 / fp8 / half /
  single round to nearest even (ml_dtypes conversions); every accumulation step is stored;
- a point where an affine entry leaves its axis is skipped; init_neutral fills the result with
  the accumulator's neutral element unless the projection is bijective (then the statement is
  a plain assignment);
- reductions run in the order of the product space: the letters of the result term first,
  then those of the arguments, in order of first appearance (DECISION; only matters when the
  accumulation is not associative or rounds at every step);
- arguments are read from a snapshot taken before the statement (DECISION, numpy's `y = f(y)`).
"""

import argparse
import itertools
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from fractions import Fraction

import numpy as np
import ml_dtypes

warnings.filterwarnings("ignore")
np.seterr(all="ignore")

INF = math.inf
NAN = math.nan

# ----------------------------------------------------------------------------- precisions

INT_PRECS = {  # name: (bits, signed)
    "byte": (8, False),
    "uint16": (16, False),
    "int32": (32, True),
    "uint32": (32, False),
    "int64": (64, True),
    "uint64": (64, False),
}
FLOAT_FMT = {  # name: (precision bits with the implicit one, minimum exponent, largest finite)
    "fp8": (3, -14, 57344.0),
    "half": (11, -14, 65504.0),
    "bfloat16": (8, -126, float.fromhex("0x1.fep127")),
    "single": (24, -126, float.fromhex("0x1.fffffep127")),
    "double": (53, -1022, sys.float_info.max),
}
ALL_PRECS = list(INT_PRECS) + list(FLOAT_FMT)
NARROW = ("fp8", "half", "bfloat16")


def is_int(p):
    return p in INT_PRECS


def int_min(p):
    bits, signed = INT_PRECS[p]
    return -(1 << (bits - 1)) if signed else 0


def int_max(p):
    bits, signed = INT_PRECS[p]
    return (1 << (bits - 1)) - 1 if signed else (1 << bits) - 1


def wrap(n, p):
    """An exact integer stored into integer precision p (modulo 2^bits, two's complement)."""
    bits, signed = INT_PRECS[p]
    n &= (1 << bits) - 1
    if signed and n >> (bits - 1):
        n -= 1 << bits
    return n


def wrap64(n, unsigned):
    n &= (1 << 64) - 1
    if not unsigned and n >> 63:
        n -= 1 << 64
    return n


def float_to_int(x, p):
    """A floating value stored into an integer precision: truncated, then wrapped."""
    if math.isnan(x) or math.isinf(x):
        return 0
    return wrap(math.trunc(x), p)


def round_frac(q, prec, mode="rne", neg_zero=False):
    """The exact rational q rounded to float format `prec` (to nearest even, or toward zero
    with mode="down"), returned as a Python float (every format fits in a double)."""
    p, emin, maxf = FLOAT_FMT[prec]
    if q == 0:
        return -0.0 if neg_zero else 0.0
    sign = -1.0 if q < 0 else 1.0
    a = -q if q < 0 else q
    num, den = a.numerator, a.denominator
    e = num.bit_length() - den.bit_length()
    if e >= 0:
        if num < (den << e):
            e -= 1
    elif (num << -e) < den:
        e -= 1
    e = max(e, emin)
    qe = e - (p - 1)
    if qe >= 0:
        sn, sd = num, den << qe
    else:
        sn, sd = num << -qe, den
    n, rem = divmod(sn, sd)
    if mode == "rne":
        if 2 * rem > sd or (2 * rem == sd and n & 1):
            n += 1
    val = Fraction(n) * (Fraction(2) ** qe)
    if val > Fraction(maxf):
        if mode == "rne":
            return sign * INF
        val = Fraction(maxf)
    r = float(val)
    return sign * r if n else (-0.0 if sign < 0 else 0.0)


def f32(x):
    return float(np.float32(x))


STORE_FLOAT = {
    "single": f32,
    "double": lambda x: float(x),
    "half": lambda x: float(np.float16(x)),
    "bfloat16": lambda x: float(ml_dtypes.bfloat16(x)),
    "fp8": lambda x: float(ml_dtypes.float8_e5m2(x)),
}


def ulp(x, prec):
    """The spacing of format `prec` at magnitude |x| (its smallest spacing below the normals)."""
    p, emin, _ = FLOAT_FMT[prec]
    x = abs(x)
    if x == 0 or math.isinf(x) or math.isnan(x):
        return math.ldexp(1.0, emin - p + 1)
    e = max(math.frexp(x)[1] - 1, emin)
    return math.ldexp(1.0, e - p + 1)


def int_to_float(n, prec):
    if abs(n) < (1 << 24):
        return float(n)
    return round_frac(Fraction(n), prec)


def decimal_to_prec(text, prec):
    """A JSON number (its text) or "inf"/"-inf"/"nan" converted directly to `prec`, as the
    program format says (correctly rounded from the decimal; integers truncated and wrapped)."""
    if isinstance(text, str):
        if text not in ("inf", "-inf", "nan"):
            raise RefError("bad value string %r" % text)
        if is_int(prec):
            return 0
        return float(text)
    if isinstance(text, bool):
        raise RefError("boolean value")
    if isinstance(text, int):
        if is_int(prec):
            return wrap(text, prec)
        return round_frac(Fraction(text), prec)
    s = repr(float(text))  # the JSON text json.dumps wrote for this float
    if math.isinf(float(text)) or math.isnan(float(text)):
        raise RefError("a number beyond the range of double")
    q = Fraction(s)
    if is_int(prec):
        return wrap(math.trunc(q), prec)
    return round_frac(q, prec, neg_zero=s.startswith("-"))


# ----------------------------------------------------------------------------- threefry

M32 = 0xFFFFFFFF
THREEFRY_ROT = [(10, 26), (11, 21), (13, 27), (23, 5), (6, 20), (17, 11), (25, 10), (18, 20)]


def threefry4x32_20(ctr, key):
    """Random123's threefry4x32 with 20 rounds (Skein's Threefish key schedule)."""
    ks = list(key) + [0x1BD11BDA ^ key[0] ^ key[1] ^ key[2] ^ key[3]]
    x = [(ctr[i] + ks[i]) & M32 for i in range(4)]

    def rotl(v, r):
        return ((v << r) | (v >> (32 - r))) & M32

    for r in range(20):
        ra, rb = THREEFRY_ROT[r % 8]
        if r % 2 == 0:
            x[0] = (x[0] + x[1]) & M32
            x[1] = rotl(x[1], ra) ^ x[0]
            x[2] = (x[2] + x[3]) & M32
            x[3] = rotl(x[3], rb) ^ x[2]
        else:
            x[0] = (x[0] + x[3]) & M32
            x[3] = rotl(x[3], ra) ^ x[0]
            x[2] = (x[2] + x[1]) & M32
            x[1] = rotl(x[1], rb) ^ x[2]
        if r % 4 == 3:
            s = (r + 1) // 4
            for i in range(4):
                x[i] = (x[i] + ks[(s + i) % 5]) & M32
            x[3] = (x[3] + s) & M32
    return x


# Random123's kat_vectors for threefry4x32 with 20 rounds: counter, key, expected output.
THREEFRY_KAT = [
    ([0, 0, 0, 0], [0, 0, 0, 0], [0x9C6CA96A, 0xE17EAE66, 0xFC10ECD4, 0x5256A7D8]),
    ([M32] * 4, [M32] * 4, [0x2A881696, 0x57012287, 0xF6C7446E, 0xA16A6732]),
    (
        [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344],
        [0xA4093822, 0x299F31D0, 0x082EFA98, 0xEC4E6C89],
        [0x59CD1DBB, 0xB8879579, 0x86B5D00C, 0xAC8B6D84],
    ),
]


def random_cell(seed, offset, prec):
    key = [seed & M32, (seed >> 32) & M32, 0, 0]
    ctr = [offset & M32, (offset >> 32) & M32, 0, 0]
    w = threefry4x32_20(ctr, key)[0]
    if is_int(prec):
        return wrap(w, prec)
    return round_frac(Fraction(w, 1 << 32), prec, mode="down")


def self_test():
    for ctr, key, want in THREEFRY_KAT:
        got = threefry4x32_20(ctr, key)
        assert got == want, ("threefry KAT", ctr, key, [hex(g) for g in got])
    rng = random.Random(5)
    # The exact rounding agrees with numpy's / ml_dtypes' conversions from double.
    for _ in range(20000):
        x = rng.choice([
            rng.uniform(-70000, 70000),
            math.ldexp(rng.uniform(-1, 1), rng.randint(-160, 130)),
            float(rng.randint(-(1 << 62), 1 << 62)),
        ])
        for prec in FLOAT_FMT:
            want = STORE_FLOAT[prec](x)
            got = round_frac(Fraction(x), prec)
            assert got == want or (math.isnan(got) and math.isnan(want)), (prec, x, got, want)
    assert round_frac(Fraction(61440), "fp8") == INF
    assert round_frac(Fraction(61439), "fp8") == 57344.0
    assert decimal_to_prec(9007199254740993, "int64") == 9007199254740993
    assert decimal_to_prec(300.7, "byte") == 44 and decimal_to_prec(-1.5, "byte") == 255
    assert wrap(1 << 64, "uint64") == 0


# ----------------------------------------------------------------------------- spec parsing


class RefError(Exception):
    """The program is invalid: arrayjit must refuse it (exit status 1)."""


class Unsupported(Exception):
    """A program whose meaning the reference does not decide (the case is skipped)."""


def parse_affine(body, whole):
    body = re.sub(r"\s+", "", body)
    toks = re.findall(r"\d+\*[A-Za-z]|[A-Za-z]|\d+|[+-]|.", body)
    terms = {}
    offset = 0
    i = 0
    expect_term = True
    while i < len(toks):
        t = toks[i]
        if expect_term:
            m = re.fullmatch(r"(\d+)\*([A-Za-z])", t)
            if m:
                terms[m.group(2)] = terms.get(m.group(2), 0) + int(m.group(1))
            elif re.fullmatch(r"[A-Za-z]", t):
                terms[t] = terms.get(t, 0) + 1
            else:
                raise RefError("bad affine entry in %r" % whole)
            expect_term = False
            i += 1
        else:
            if t not in "+-" or i + 1 >= len(toks):
                raise RefError("bad affine entry in %r" % whole)
            nxt = toks[i + 1]
            if re.fullmatch(r"\d+", nxt):
                if i + 2 != len(toks):
                    raise RefError("offset must be last in %r" % whole)
                offset = int(nxt) if t == "+" else -int(nxt)
                i += 2
            elif t == "+":
                expect_term = True
                i += 1
            else:
                raise RefError("'-' must be followed by the final offset in %r" % whole)
    if expect_term or not terms:
        raise RefError("bad affine entry in %r" % whole)
    return ("A", [(coef, c) for c, coef in terms.items()], offset)  # letters in textual order


def parse_term(t, whole):
    out = []
    i = 0
    while i < len(t):
        c = t[i]
        if c.isspace():
            i += 1
        elif c.isalpha():
            out.append(("L", c))
            i += 1
        elif c.isdigit():
            out.append(("D", int(c)))
            i += 1
        elif c == "{":
            j = t.index("}", i)
            out.append(("S", t[i + 1:j].strip()))
            i = j + 1
        elif c == "(":
            j = t.find(")", i)
            if j < 0:
                raise RefError("unterminated ( in %r" % whole)
            out.append(parse_affine(t[i + 1:j], whole))
            i = j + 1
        else:
            raise RefError("stray character %r in %r" % (c, whole))
    return out


def split_terms(s):
    return s.split(",")


def parse_logic(logic, nargs):
    if "->" not in logic:
        raise RefError("no -> in %r" % logic)
    rhs, lhs = logic.split("->", 1)
    arg_terms = [parse_term(t, logic) for t in split_terms(rhs)]
    if len(arg_terms) != nargs:
        raise RefError("spec %r has %d argument terms for %d arguments" % (logic, len(arg_terms), nargs))
    return parse_term(lhs, logic), arg_terms


# ----------------------------------------------------------------------------- operations

BINOPS = ["add", "sub", "mul", "div", "pow", "relu_gate", "arg1", "arg2", "max", "min", "mod",
          "lt", "le", "gt", "ge", "eq", "ne", "and", "or", "satur01_gate",
          "bit_and", "bit_or", "bit_xor", "shl", "shr"]
UNOPS = ["identity", "relu", "neg", "exp", "log", "sqrt", "recip", "tanh", "sin", "cos", "exp2",
         "log2", "rsqrt", "trunc", "floor", "ceil", "abs", "sigmoid", "satur01", "not"]
TERNOPS = ["where", "fma", "mul3"]
INT_ONLY = ("bit_and", "bit_or", "bit_xor", "shl", "shr")
REAL_FUNS = ("exp", "log", "sqrt", "recip", "tanh", "sin", "cos", "exp2", "log2", "rsqrt", "sigmoid")
# Libm functions: their last bits may differ (error in units of the compute type's ulp).
LIBM_ULPS = {"exp": 4, "log": 4, "tanh": 4, "sin": 4, "cos": 4, "exp2": 4, "log2": 4,
             "rsqrt": 4, "sigmoid": 8, "pow": 8}
# Operations that are discontinuous in their arguments (an uncertain input makes them unknown
# when it may cross the discontinuity).
CMP = {"lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
       "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b}


class Ctx:
    """The compute type of a statement."""

    def __init__(self, ctype, result_prec):
        self.ctype = ctype  # "f32" | "f64" | "int"
        self.result_prec = result_prec
        if ctype == "f32":
            self.rnd = f32
            self.fmt = "single"
        else:
            self.rnd = float
            self.fmt = "double"
        p, emin, maxf = FLOAT_FMT[self.fmt]
        self.u = math.ldexp(1.0, -p)
        self.tiny = math.ldexp(1.0, emin - p + 1)
        self.maxf = maxf


def fdiv(a, b):
    if b == 0:
        if a == 0 or math.isnan(a):
            return NAN
        neg = (math.copysign(1.0, a) < 0) != (math.copysign(1.0, b) < 0)
        return -INF if neg else INF
    return a / b


def fsqrt(a):
    if math.isnan(a) or a < 0:
        return NAN
    return math.sqrt(a)


def npf(fn):
    return lambda a: float(fn(np.float64(a)))


def fsigmoid(a):
    return float(1.0 / (1.0 + np.exp(np.float64(-a))))


def fpow(a, b):
    """C's pow (C99 Annex F special cases: pow(-inf, 0.5) = inf, pow(-0, -1) = -inf, ...)."""
    def odd_int(y):
        return math.isfinite(y) and y == math.floor(y) and int(y) % 2 == 1
    if a == 0 and b < 0:
        return math.copysign(INF, a) if odd_int(b) else INF
    try:
        return math.pow(a, b)
    except ValueError:
        return NAN
    except OverflowError:
        return -INF if (a < 0 and odd_int(b)) else INF


def fmax(a, b):
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    if a == 0 and b == 0:
        return a if math.copysign(1.0, a) > 0 else b
    return a if a > b else b


def fmin(a, b):
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    if a == 0 and b == 0:
        return a if math.copysign(1.0, a) < 0 else b
    return a if a < b else b


def ffmod(a, b):
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or b == 0:
        return NAN
    if math.isinf(b):
        return a
    return math.fmod(a, b)


def ffma(a, b, c, fmt):
    """a*b+c rounded once to `fmt`."""
    vals = (a, b, c)
    if not all(math.isfinite(v) for v in vals):
        if math.isnan(a) or math.isnan(b) or math.isnan(c):
            return NAN
        if (math.isinf(a) and b == 0) or (math.isinf(b) and a == 0):
            return NAN
        if math.isinf(a) or math.isinf(b):
            p = math.copysign(INF, a) * math.copysign(1.0, b) if math.isinf(a) else math.copysign(INF, b) * math.copysign(1.0, a)
            if math.isinf(c) and c != p:
                return NAN
            return p
        return c
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact == 0:
        pz = -0.0 if (math.copysign(1.0, a) < 0) != (math.copysign(1.0, b) < 0) else 0.0
        if a * b == 0 or Fraction(a) * Fraction(b) == 0:
            return pz + c
        return 0.0
    return round_frac(exact, fmt)


def trunc_f(a):
    return float(np.trunc(np.float64(a)))


def floor_f(a):
    return float(np.floor(np.float64(a)))


def ceil_f(a):
    return float(np.ceil(np.float64(a)))


FLOAT_UN = {
    "identity": lambda a: a,
    "relu": lambda a: a if a > 0 else 0.0,
    "neg": lambda a: -a,
    "exp": npf(np.exp),
    "log": npf(np.log),
    "sqrt": fsqrt,
    "recip": lambda a: fdiv(1.0, a),
    "tanh": npf(np.tanh),
    "sin": npf(np.sin),
    "cos": npf(np.cos),
    "exp2": npf(np.exp2),
    "log2": npf(np.log2),
    "rsqrt": lambda a: fdiv(1.0, fsqrt(a)),
    "trunc": trunc_f,
    "floor": floor_f,
    "ceil": ceil_f,
    "abs": lambda a: abs(a),
    "sigmoid": fsigmoid,
    "satur01": lambda a: fmin(fmax(a, 0.0), 1.0) if not math.isnan(a) else 0.0,
    "not": lambda a: 1.0 if a == 0 else 0.0,
}

FLOAT_BIN = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": fdiv,
    "pow": fpow,
    "relu_gate": lambda a, b: b if a > 0 else 0.0,
    "arg1": lambda a, b: a,
    "arg2": lambda a, b: b,
    "max": fmax,
    "min": fmin,
    "mod": ffmod,
    "and": lambda a, b: 1.0 if (a != 0 and b != 0) else 0.0,
    "or": lambda a, b: 1.0 if (a != 0 or b != 0) else 0.0,
    "satur01_gate": lambda a, b: b if 0 < a < 1 else 0.0,
}
for _n, _f in CMP.items():
    FLOAT_BIN[_n] = (lambda f: lambda a, b: 1.0 if f(a, b) else 0.0)(_f)


def float_op(op, vs, ctx):
    """The value of `op` on compute-type values `vs` (rounded to the compute type)."""
    rnd = ctx.rnd
    if op in FLOAT_UN:
        (a,) = vs
        if op in ("sqrt", "recip"):
            return rnd(FLOAT_UN[op](a))
        return rnd(FLOAT_UN[op](a))
    if op in FLOAT_BIN:
        a, b = vs
        if op in ("add", "sub", "mul", "div"):
            if op == "mul":
                return rnd(a * b)
            return rnd(FLOAT_BIN[op](a, b))
        return rnd(FLOAT_BIN[op](a, b))
    if op == "where":
        a, b, c = vs
        return b if a != 0 else c
    if op == "fma":
        return ffma(*vs, ctx.fmt)
    if op == "mul3":
        a, b, c = vs
        return rnd(rnd(a * b) * c)
    raise RefError("unknown operation %r" % op)


def exact_op64(op, vs):
    """`op` in double without rounding to the compute type (for error propagation)."""
    if op in FLOAT_UN:
        return FLOAT_UN[op](vs[0])
    if op in FLOAT_BIN:
        return FLOAT_BIN[op](*vs)
    if op == "fma" or op == "mul3":
        a, b, c = vs
        return a * b + c if op == "fma" else a * b * c
    if op == "where":
        return vs[1] if vs[0] != 0 else vs[2]
    raise RefError("unknown operation %r" % op)


def contains_int(lo, hi):
    return math.floor(hi) >= lo


def float_eval(op, args, ctx):
    """args: list of (value, error bound). Returns (value, error bound)."""
    vs = [a[0] for a in args]
    es = [a[1] for a in args]
    r = float_op(op, vs, ctx)
    if any(e == INF for e in es):
        return (r, INF)
    base = 0.0
    if op in LIBM_ULPS:
        k = LIBM_ULPS[op]
        if op == "pow" and math.isfinite(vs[1]) and vs[1] == int(vs[1]):
            k += min(abs(int(vs[1])), 64)
        r64 = exact_op64(op, vs)
        special = not all(math.isfinite(v) for v in vs)
        if not special:
            if math.isnan(r):
                base = 0.0
            elif math.isinf(r) or abs(r64) * (1 + 4 * k * ctx.u) >= ctx.maxf:
                if abs(r64) * (1 - 4 * k * ctx.u) <= ctx.maxf:
                    return (r, INF)  # near overflow
            else:
                base = k * 2 * ctx.u * abs(r) + k * ctx.tiny
                if op == "pow" and vs[0] < 0:
                    base = k * 2 * ctx.u * abs(r) + k * ctx.tiny
    if all(e == 0 for e in es):
        return (r, base)
    # Propagation of input errors.
    if math.isnan(r):
        return (r, 0.0 if any(math.isnan(v) for v in vs) else INF)
    iv = [(v - e, v + e) for v, e in zip(vs, es)]
    if op in CMP:
        (alo, ahi), (blo, bhi) = iv
        return (r, INF if (ahi >= blo and bhi >= alo) else 0.0)
    if op in ("and", "or", "not"):
        if any(e > 0 and lo <= 0 <= hi for (lo, hi), e in zip(iv, es)):
            return (r, INF)
        return (r, 0.0)
    if op in ("trunc", "floor", "ceil"):
        lo, hi = iv[0]
        return (r, INF if contains_int(lo, hi) else 0.0)
    if op == "mod":
        return (r, INF)
    if op in ("relu_gate", "satur01_gate", "where"):
        lo, hi = iv[0]
        if es[0] > 0:
            if lo <= 0 <= hi or (op == "satur01_gate" and lo <= 1 <= hi):
                return (r, INF)
        if op == "where":
            return (r, es[1] if vs[0] != 0 else es[2])
        gate = vs[0] > 0 if op == "relu_gate" else 0 < vs[0] < 1
        return (r, es[1] if gate else 0.0)
    if op in ("arg1", "identity"):
        return (r, es[0])
    if op == "arg2":
        return (r, es[1])
    if op in ("neg", "abs", "relu", "satur01"):
        return (r, es[0])
    if op in ("max", "min"):
        return (r, max(es))
    if op in ("sin", "cos", "tanh"):
        return (r, es[0] + base + 2 * ctx.u * abs(r) + ctx.tiny)
    if op == "sigmoid":
        return (r, es[0] / 4 + base + 2 * ctx.u * abs(r) + ctx.tiny)
    if op in ("div", "recip"):
        blo, bhi = iv[-1]
        if blo <= 0 <= bhi:
            return (r, INF)
    if op in ("log", "log2", "sqrt", "rsqrt"):
        lo, _ = iv[0]
        if lo <= 0:
            return (r, INF)
    if op == "pow":
        lo, _ = iv[0]
        if lo <= 0:
            return (r, INF)
    # Monotone or multilinear in each argument: the extremes are at the corners.
    dev = 0.0
    for corner in itertools.product(*[(lo, v, hi) for (lo, hi), v in zip(iv, vs)]):
        c = exact_op64(op, list(corner))
        if math.isnan(c) or math.isinf(c):
            if c != r:
                return (r, INF)
            continue
        if math.isinf(r):
            return (r, INF)
        dev = max(dev, abs(c - r))
    e = dev * (1 + 1e-9) + base + 2 * ctx.u * abs(r) + ctx.tiny
    if abs(r) + e >= ctx.maxf:
        return (r, INF)
    return (r, e)


def int_eval(op, args, ctx, result_prec):
    """args: list of (value, error in {0, INF}, unsigned). Returns (value, error, unsigned)."""
    vs = [a[0] for a in args]
    unk = any(a[1] == INF for a in args)
    uns = any(a[2] for a in args)
    W = INT_PRECS[result_prec][0]

    def w(n):
        return wrap64(n, uns)

    if op in REAL_FUNS:
        (a,) = vs
        r = FLOAT_UN[op](float(a))
        approx = op in LIBM_ULPS
        v = float_to_int64(r, uns)
        if approx and math.isfinite(r):
            e = 8 * 2.0 ** -53 * abs(r) + 1e-300
            if contains_int(r - e, r + e) and not (-1 < r - e and r + e < 1):
                return (v, INF, uns)
        if approx and (math.isinf(r) or abs(r) > 1.8e19):
            return (v, INF, uns)
        return (v, INF if unk else 0, uns)
    if op in ("identity", "trunc", "floor", "ceil"):
        r = vs[0]
    elif op == "neg":
        r = w(-vs[0])
    elif op == "abs":
        r = w(abs(vs[0]))
    elif op == "relu":
        r = max(vs[0], 0)
    elif op == "satur01":
        r = min(max(vs[0], 0), 1)
    elif op == "not":
        r = 1 if vs[0] == 0 else 0
    elif op == "add":
        r = w(vs[0] + vs[1])
    elif op == "sub":
        r = w(vs[0] - vs[1])
    elif op == "mul":
        r = w(vs[0] * vs[1])
    elif op == "div":
        a, b = vs
        if b == 0:
            r = 0
        else:
            q = abs(a) // abs(b)
            r = w(q if (a < 0) == (b < 0) else -q)
    elif op == "mod":
        a, b = vs
        if b == 0:
            r = 0
        else:
            q = abs(a) // abs(b)
            q = q if (a < 0) == (b < 0) else -q
            r = w(a - b * q)
    elif op == "pow":
        a, b = vs
        if b >= 0:
            r = w(pow(a, b, 1 << 64))
        elif a == 1:
            r = 1
        elif a == -1:
            r = w(-1 if b % 2 else 1)
        else:
            r = 0
    elif op == "relu_gate":
        r = vs[1] if vs[0] > 0 else 0
    elif op == "arg1":
        r = vs[0]
    elif op == "arg2":
        r = vs[1]
    elif op == "max":
        r = max(vs)
    elif op == "min":
        r = min(vs)
    elif op in CMP:
        r = 1 if CMP[op](*vs) else 0
    elif op == "and":
        r = 1 if (vs[0] != 0 and vs[1] != 0) else 0
    elif op == "or":
        r = 1 if (vs[0] != 0 or vs[1] != 0) else 0
    elif op == "satur01_gate":
        r = vs[1] if 0 < vs[0] < 1 else 0
    elif op == "bit_and":
        r = w(vs[0] & vs[1])
    elif op == "bit_or":
        r = w(vs[0] | vs[1])
    elif op == "bit_xor":
        r = w(vs[0] ^ vs[1])
    elif op == "shl":
        r = w(vs[0] << (vs[1] % W))
    elif op == "shr":
        r = w(vs[0] >> (vs[1] % W))
    elif op == "where":
        r = vs[1] if vs[0] != 0 else vs[2]
    elif op == "fma":
        r = w(vs[0] * vs[1] + vs[2])
    elif op == "mul3":
        r = w(vs[0] * vs[1] * vs[2])
    else:
        raise RefError("unknown operation %r" % op)
    # The result's signedness (DECISION, as arrayjit's `int_unsigned`): unsigned when an
    # operand it computes from is; 0/1 results are signed; selections and shifts keep the
    # signedness of the operand they pass on.
    if op in ("lt", "le", "gt", "ge", "eq", "ne", "and", "or", "satur01_gate", "not", "satur01"):
        res_uns = False
    elif op in ("arg1", "shl", "shr") or (op in UNOPS and op not in ("not", "satur01")):
        res_uns = args[0][2]
    elif op in ("arg2", "relu_gate"):
        res_uns = args[1][2]
    elif op == "where":
        res_uns = args[1][2] or args[2][2]
    else:
        res_uns = uns
    return (wrap64(r, res_uns), INF if unk else 0, res_uns)


def float_to_int64(x, unsigned):
    if math.isnan(x) or math.isinf(x):
        return 0
    return wrap64(math.trunc(x), unsigned)


# ----------------------------------------------------------------------------- reference


class Tensor:
    def __init__(self, name, dims, prec):
        self.name = name
        self.dims = list(dims)
        self.prec = prec
        self.size = 1
        for d in dims:
            self.size *= d
        self.strides = []
        s = 1
        for d in reversed(dims):
            self.strides.append(s)
            s *= d
        self.strides.reverse()
        zero = 0 if is_int(prec) else 0.0
        self.vals = [zero] * self.size
        self.errs = [0.0] * self.size
        self.order = [False] * self.size  # value depends on an unspecified order
        self.seq = [False] * self.size  # value of a rounding sequential accumulation
        self.prod = [False] * self.size  # an inexact product a compiler may contract


def neutral(accum, prec):
    if accum in ("add", "sub", "set", "arg2"):
        return 0 if is_int(prec) else 0.0
    if accum in ("mul", "div", "pow"):
        return 1 if is_int(prec) else 1.0
    if accum == "max":
        return int_min(prec) if is_int(prec) else -INF
    if accum == "min":
        return int_max(prec) if is_int(prec) else INF
    # DECISION (numpy's reductions): the identity of the logical and bitwise operations
    if accum == "and":
        return 1 if is_int(prec) else 1.0
    if accum in ("or", "bit_or", "bit_xor"):
        return 0 if is_int(prec) else 0.0
    if accum == "bit_and" and is_int(prec):
        return wrap(-1, prec)
    raise Unsupported("no neutral element for accum %s" % accum)


def store(v, e, prec, ctx):
    """A compute-type value (with error bound) stored into precision `prec`."""
    if is_int(prec):
        if isinstance(v, int):
            return wrap(v, prec), e
        s = float_to_int(v, prec)
        if e == 0:
            return s, 0.0
        if e == INF or not math.isfinite(v):
            return s, INF
        lo, hi = v - e, v + e
        if contains_int(lo, hi) and not (lo > -1 and hi < 1):
            return s, INF
        if abs(v) + e >= 2.0 ** 63:
            return s, INF
        return s, 0.0
    if isinstance(v, int):
        return int_to_float(v, prec), (INF if e == INF else 0.0)
    s = STORE_FLOAT[prec](v)
    if e == 0 or e == INF:
        return s, e
    if math.isinf(s) or abs(v) + e >= FLOAT_FMT[prec][2]:
        return s, INF
    return s, e + ulp(abs(v) + e, prec)


def read(v, e, prec, ctx):
    """A stored value of precision `prec` read into the compute type: (value, err, unsigned)."""
    if ctx.ctype == "int":
        return (v, e, prec == "uint64")
    if isinstance(v, int):
        if ctx.ctype == "f64":
            return (float(v), e, False)
        return (int_to_float(v, "single"), e, False)
    if ctx.ctype == "f32" and prec == "double":
        r = f32(v)
        if e > 0 and e != INF:
            e = e + ulp(abs(v) + e, "single")
        return (r, e, False)
    return (v, e, False)


def compute_type(result_prec, arg_precs):
    if result_prec == "double":
        return "f64"
    if not is_int(result_prec):
        return "f32"
    if all(is_int(p) for p in arg_precs):
        return "int"
    return "f64"


def evaluate(op, args, ctx):
    if ctx.ctype == "int":
        return int_eval(op, args, ctx, ctx.result_prec)
    r, e = float_eval(op, [(a[0], a[1]) for a in args], ctx)
    return (r, e, False)


def exact_sum_ok(terms, p):
    """True when every partial sum of `terms` (finite floats), in any order, is exactly
    representable with p significant bits (no over/underflow issues for these sizes)."""
    nz = [Fraction(t) for t in terms if t != 0]
    if not nz:
        return True
    k = None
    for q in nz:
        n, d = abs(q.numerator), q.denominator
        tz = (n & -n).bit_length() - 1 - (d.bit_length() - 1)
        k = tz if k is None else min(k, tz)
    total = sum(abs(q) for q in nz)
    return total <= Fraction(2) ** (p + k)


class Reference:
    def __init__(self, prog, base_dir="."):
        self.prog = prog
        self.base_dir = base_dir
        self.T = {}
        for td in prog.get("tensors", []):
            name = td["name"]
            if name in self.T:
                raise RefError("duplicate tensor %s" % name)
            dims = td["dims"]
            if not dims or any((not isinstance(d, int)) or d < 1 for d in dims):
                raise RefError("bad dims for %s" % name)
            prec = td.get("prec", "single")
            if prec not in ALL_PRECS:
                raise RefError("unknown precision %r" % prec)
            t = Tensor(name, dims, prec)
            init = td.get("init", "zeros")
            if init == "zeros":
                pass
            elif init == "range":
                for i in range(t.size):
                    t.vals[i] = wrap(i, prec) if is_int(prec) else round_frac(Fraction(i), prec)
            elif isinstance(init, dict) and "values" in init:
                vals = init["values"]
                strict = init.get("strict", True)
                if strict and len(vals) != t.size:
                    raise RefError("wrong number of values for %s" % name)
                if not strict and (len(vals) == 0 or len(vals) > t.size):
                    raise RefError("wrong number of values for %s" % name)
                conv = [decimal_to_prec(v, prec) for v in vals]
                for i in range(t.size):
                    t.vals[i] = conv[i % len(conv)]
            else:
                raise Unsupported("init %r" % (init,))
            self.T[name] = t
        # host copies of hosted tensors (an init, printed, or "memory": "hosted"), for the
        # from_host / to_host steps
        printed = set(prog.get("print", []))
        self.host = {}
        for td in prog.get("tensors", []):
            mem = td.get("memory")
            if mem == "hosted" or (mem is None and ("init" in td or td["name"] in printed)):
                t = self.T[td["name"]]
                self.host[t.name] = (list(t.vals), list(t.errs))
        self.statics = {}
        for sd in prog.get("static_indices", []):
            self.statics[sd["name"]] = sd.get("range")
        self.routines = {}
        for r in prog.get("routines", []):
            self.routines[r["name"]] = r["code"]
        self.bindings = {r: {} for r in self.routines}
        self.steps = 0
        for code in self.routines.values():
            self.validate(code)

    # -- running
    def run(self):
        for step in self.prog.get("run", []):
            self.step(step)
        out = {}
        for name in self.prog.get("print", []):
            if name not in self.T:
                raise RefError("print of unknown tensor %s" % name)
            out[name] = self.T[name]
        return out

    def step(self, st):
        if "repeat" in st:
            for _ in range(st["repeat"]):
                for s in st.get("steps", []):
                    self.step(s)
            return
        if "routine" in st:
            name = st["routine"]
            if name not in self.routines:
                raise RefError("unknown routine %s" % name)
            b = self.bindings[name]
            for k, v in st.get("bindings", {}).items():
                if k not in self.statics:
                    raise RefError("unknown static index %s" % k)
                rg = self.statics[k]
                if rg is not None and not (0 <= v < rg):
                    raise RefError("binding %s=%d outside its range %d" % (k, v, rg))
                b[k] = v
            self.env_static = b
            self.exec_code(self.routines[name])
            return
        if "from_host" in st or "to_host" in st:
            name = st.get("from_host", st.get("to_host"))
            t = self.tensor(name)
            if name not in self.host:
                raise RefError("tensor %s has no host array" % name)
            if "from_host" in st:
                vals, errs = self.host[name]
                for i in range(t.size):
                    self.set_cell(t, i, vals[i], errs[i])
            else:
                self.host[name] = (list(t.vals), list(t.errs))
            return
        raise Unsupported("run step %r" % (st,))

    def exec_code(self, code):
        for st in code:
            if "comment" in st:
                self.exec_code(st.get("code", []))
            elif "assign" in st:
                self.assign(st)
            elif "fetch" in st:
                self.fetch(st)
            elif "gather" in st:
                self.gather(st)
            elif "scatter_add" in st:
                self.scatter(st)
            else:
                raise Unsupported("statement %r" % (st,))

    def tensor(self, name):
        if isinstance(name, dict):
            raise Unsupported("merge buffer")
        if name not in self.T:
            raise RefError("unknown tensor %r" % name)
        return self.T[name]

    def static_value(self, name):
        if name not in self.statics:
            raise RefError("unknown static index %s" % name)
        return self.env_static.get(name, 0)

    # -- fetches
    def fetch(self, st):
        t = self.tensor(st["fetch"])
        if "constant" in st:
            c = st["constant"]
            v = decimal_to_prec(c, t.prec)
            for i in range(t.size):
                self.set_cell(t, i, v, 0.0)
        elif "random" in st:
            seed = st["random"]["seed"]
            if not (isinstance(seed, int) and 0 <= seed < (1 << 64)):
                raise RefError("bad seed")
            for i in range(t.size):
                self.set_cell(t, i, random_cell(seed, i, t.prec), 0.0)
        elif "embed_index" in st:
            n = self.static_value(st["embed_index"])
            v = wrap(n, t.prec) if is_int(t.prec) else round_frac(Fraction(n), t.prec)
            for i in range(t.size):
                self.set_cell(t, i, v, 0.0)
        elif "slice" in st:
            src = self.tensor(st["slice"])
            n = self.static_value(st["index"])
            if src.dims[1:] != t.dims:
                raise RefError("slice dims")
            if not (0 <= n < src.dims[0]):
                raise RefError("slice index out of range")
            ctx = Ctx(compute_type(t.prec, [src.prec]), t.prec)
            snap = (list(src.vals), list(src.errs))
            for i in range(t.size):
                j = n * t.size + i
                v, e, _ = read(snap[0][j], snap[1][j], src.prec, ctx)
                self.set_cell(t, i, *store(v, e, t.prec, ctx))
        else:
            raise Unsupported("fetch %r" % (st,))

    def set_cell(self, t, i, v, e, order=False, seq=False, prod=False):
        t.vals[i] = v
        t.errs[i] = e
        t.order[i] = order
        t.seq[i] = seq
        t.prod[i] = prod

    # -- gather / scatter-add
    def gather(self, st):
        y = self.tensor(st["gather"])
        table = self.tensor(st["from"])
        idx = self.tensor(st["index"])
        if not is_int(idx.prec):
            raise RefError("index precision")
        if y is table or y is idx:
            raise RefError("gather reads and writes one tensor")
        n = table.dims[0]
        rsz = table.size // n
        if y.dims != idx.dims + table.dims[1:]:
            raise RefError("gather shape")
        ctx = Ctx(compute_type(y.prec, [table.prec]), y.prec)
        zero = 0 if is_int(y.prec) else 0.0
        for d in range(idx.size):
            k = idx.vals[d]
            unk = idx.errs[d] == INF or idx.order[d]
            for r in range(rsz):
                if 0 <= k < n:
                    v, e, _ = read(table.vals[k * rsz + r], table.errs[k * rsz + r], table.prec, ctx)
                    sv, se = store(v, e, y.prec, ctx)
                    self.set_cell(y, d * rsz + r, sv, INF if unk else se, table.order[k * rsz + r] or idx.order[d])
                else:
                    self.set_cell(y, d * rsz + r, zero, INF if unk else 0.0, idx.order[d])

    def scatter(self, st):
        g = self.tensor(st["scatter_add"])
        h = self.tensor(st["from"])
        idx = self.tensor(st["index"])
        if not is_int(idx.prec):
            raise RefError("index precision")
        if g is h or g is idx:
            raise RefError("scatter_add reads and writes one tensor")
        n = g.dims[0]
        rsz = g.size // n
        if h.dims != idx.dims + g.dims[1:]:
            raise RefError("scatter shape")
        ctx = Ctx(compute_type(g.prec, [h.prec]), g.prec)
        for d in range(idx.size):
            k = idx.vals[d]
            if idx.errs[d] == INF or idx.order[d]:
                raise Unsupported("uncertain index")
            if not (0 <= k < n):
                continue
            for r in range(rsz):
                j = k * rsz + r
                old = read(g.vals[j], g.errs[j], g.prec, ctx)
                new = read(h.vals[d * rsz + r], h.errs[d * rsz + r], h.prec, ctx)
                v, e, _ = evaluate("add", [old, new], ctx)
                sv, se = store(v, e, g.prec, ctx)
                self.set_cell(g, j, sv, se, g.order[j] or h.order[d * rsz + r], g.seq[j])

    # -- assignments
    def validate(self, code):
        """Static checks of every statement (arrayjit refuses a bad program before running)."""
        for st in code:
            if "comment" in st:
                self.validate(st.get("code", []))
            elif "assign" in st:
                self.analyze(st)
            elif "gather" in st or "scatter_add" in st:
                out = self.tensor(st.get("gather", st.get("scatter_add")))
                src, idx = self.tensor(st["from"]), self.tensor(st["index"])
                if not is_int(idx.prec):
                    raise RefError("index precision")
                if out is src or out is idx:
                    raise RefError("gather / scatter_add reads and writes one tensor")
                if "gather" in st and out.dims != idx.dims + src.dims[1:]:
                    raise RefError("gather shape")
                if "scatter_add" in st and src.dims != idx.dims + out.dims[1:]:
                    raise RefError("scatter shape")
            elif "fetch" in st:
                t = self.tensor(st["fetch"])
                if "slice" in st:
                    src = self.tensor(st["slice"])
                    if src.dims[1:] != t.dims:
                        raise RefError("slice dims")
                    if st["index"] not in self.statics:
                        raise RefError("unknown static index")
                if "embed_index" in st and st["embed_index"] not in self.statics:
                    raise RefError("unknown static index")

    def analyze(self, st):
        lhs = self.tensor(st["assign"])
        args = [self.tensor(a) for a in st["args"]]
        op = st["op"]
        accum = st.get("accum", "set")
        if accum == "set":
            acc = "arg2"
        else:
            acc = accum
        init = st.get("init_neutral", False)
        nargs = len(args)
        if op in UNOPS:
            arity = 1
        elif op in BINOPS:
            arity = 2
        elif op in TERNOPS:
            arity = 3
        else:
            raise RefError("unknown operation %s" % op)
        if arity != nargs:
            raise RefError("wrong arity")
        if acc not in BINOPS:
            raise RefError("unknown accum %s" % accum)
        precs = [lhs.prec] + [a.prec for a in args]
        if (op in INT_ONLY or acc in INT_ONLY) and not all(is_int(p) for p in precs):
            raise RefError("integer-only operation on a floating precision")
        if "logic" in st:
            res_term, arg_terms = parse_logic(st["logic"], nargs)
        else:
            for a in args:
                if a.dims != lhs.dims:
                    raise RefError("pointwise dims differ")
            letters = "abcdefghijklmnopqrstuvwxyz"[: len(lhs.dims)]
            res_term = [("L", c) for c in letters]
            arg_terms = [list(res_term) for _ in args]
        terms = [(res_term, lhs)] + list(zip(arg_terms, args))
        # letter extents
        ext = {}
        order = []
        for term, t in terms:
            if len(term) != len(t.dims):
                raise RefError("spec term has %d axes, tensor %s has %d" % (len(term), t.name, len(t.dims)))
            for ent, d in zip(term, t.dims):
                if ent[0] == "L":
                    c = ent[1]
                    if c not in order:
                        order.append(c)
                    if d != 1:
                        if c in ext and ext[c] != d:
                            raise RefError("mismatched extents for %s" % c)
                        ext[c] = d
                elif ent[0] == "A":
                    for _, c in ent[1]:
                        if c not in order:
                            order.append(c)
                elif ent[0] == "D":
                    if ent[1] >= d:
                        raise RefError("fixed index out of range")
                elif ent[0] == "S":
                    if ent[1] not in self.statics:
                        raise RefError("unknown static index %s" % ent[1])
        for term, t in terms:
            for ent in term:
                if ent[0] == "A":
                    for _, c in ent[1]:
                        if c not in ext:
                            raise RefError("letter %s of an affine entry has no extent" % c)
        for c in order:
            ext.setdefault(c, 1)
        # A result axis of extent 1 uses index 0 (SPEC 2: axes of extent 1 are not iterated),
        # so a letter of extent > 1 on it is reduced over.
        res_letters = {ent[1] for ent, d in zip(res_term, lhs.dims) if ent[0] == "L" and d != 1}
        affine_res = any(ent[0] == "A" for ent in res_term)
        # DECISION (arrayjit's docs/language-affine.md): a statement with an affine entry
        # anywhere is never a plain assignment; with init_neutral it fills the result first.
        affine_any = affine_res or any(ent[0] == "A" for term in arg_terms for ent in term)
        bij = (not affine_any) and all(c in res_letters or ext[c] == 1 for c in order)
        plain = init and bij
        return dict(lhs=lhs, args=args, op=op, acc=acc, init=init, res_term=res_term,
                    arg_terms=arg_terms, terms=terms, ext=ext, order=order, bij=bij, plain=plain)

    def assign(self, st):
        a = self.analyze(st)
        lhs, args, op, acc, init = a["lhs"], a["args"], a["op"], a["acc"], a["init"]
        res_term, arg_terms, terms, ext = a["res_term"], a["arg_terms"], a["terms"], a["ext"]
        order, bij, plain = a["order"], a["bij"], a["plain"]
        ctx = Ctx(compute_type(lhs.prec, [a.prec for a in args]), lhs.prec)
        statics = self.env_static
        # static entries must be inside their axes
        for term, t in terms:
            for ent, d in zip(term, t.dims):
                if ent[0] == "S" and not (0 <= statics.get(ent[1], 0) < d):
                    raise Unsupported("static index %s=%d outside an axis of extent %d" % (ent[1], statics.get(ent[1], 0), d))
        snaps = []
        for a in args:
            snaps.append((list(a.vals), list(a.errs), list(a.order), list(a.prod)))
        if init and not bij:
            nv = neutral(acc, lhs.prec)
            for i in range(lhs.size):
                self.set_cell(lhs, i, nv, 0.0)
        # compile each term to (stride, kind, data) for speed
        def compile_term(term, t):
            out = []
            for ent, d, s in zip(term, t.dims, t.strides):
                if ent[0] == "L":
                    if d == 1:
                        continue
                    out.append(("L", order.index(ent[1]), s, d))
                elif ent[0] == "D":
                    out.append(("C", ent[1] * s))
                elif ent[0] == "S":
                    out.append(("C", statics.get(ent[1], 0) * s))
                else:
                    out.append(("A", [(coef, order.index(c)) for coef, c in ent[1]], ent[2], s, d))
            return out

        cres = compile_term(res_term, lhs)
        cargs = [compile_term(term, a) for term, a in zip(arg_terms, args)]

        def offset(ct, pt):
            off = 0
            for item in ct:
                k = item[0]
                if k == "L":
                    off += pt[item[1]] * item[2]
                elif k == "C":
                    off += item[1]
                else:
                    idx = item[2]
                    for coef, li in item[1]:
                        idx += coef * pt[li]
                    if idx < 0 or idx >= item[4]:
                        return None
                    off += idx * item[3]
            return off

        contract_ops = ctx.ctype != "int" and (op in ("add", "sub") or acc in ("add", "sub"))
        fprec = "single" if ctx.ctype == "f32" else "double"
        # DECISION (arrayjit's lowering; SPEC 3 read literally, point by point): an argument
        # that is the result itself, read at the very cell the point writes, sees the current
        # value; read at other cells (or after init_neutral refills the result), it reads a
        # snapshot taken before the statement (numpy's `b = b.T`).
        def norm(ct):
            return [x for x in ct if x != ("C", 0)]
        live = [k for k, a in enumerate(args) if a is lhs and not (init and not bij)
                and norm(cargs[k]) == norm(cres)]
        counts = {}
        groups = {}
        for pt in itertools.product(*[range(ext[c]) for c in order]):
            lo = offset(cres, pt)
            if lo is None:
                continue
            offs = []
            skip = False
            for ct in cargs:
                o = offset(ct, pt)
                if o is None:
                    skip = True
                    break
                offs.append(o)
            if skip:
                continue
            vals = []
            orderdep = False
            for k, (a, o) in enumerate(zip(args, offs)):
                if k in live:
                    sv, se, so, sp = lhs.vals[o], lhs.errs[o], lhs.order[o], lhs.prod[o]
                else:
                    sv, se, so, sp = snaps[k][0][o], snaps[k][1][o], snaps[k][2][o], snaps[k][3][o]
                orderdep |= so
                rv = read(sv, se, a.prec, ctx)
                if sp and contract_ops and a.prec == fprec and rv[1] != INF:
                    rv = (rv[0], rv[1] + 2 * ctx.u * abs(rv[0]) + ctx.tiny, rv[2])
                vals.append(rv)
            r = evaluate(op, vals, ctx)
            prod = False
            if (ctx.ctype != "int" and op in ("mul", "mul3") and not plain and acc in ("add", "sub")
                    and not math.isfinite(r[0]) and all(math.isfinite(v[0]) for v in vals)):
                # the product overflows; fused into the accumulation it may not
                r = (r[0], INF, r[2])
            if ctx.ctype != "int" and op in ("mul", "mul3") and math.isfinite(r[0]) and r[1] != INF:
                if op == "mul":
                    exact = all(math.isfinite(v[0]) for v in vals) and Fraction(vals[0][0]) * Fraction(vals[1][0]) == Fraction(r[0])
                else:
                    ab = ctx.rnd(vals[0][0] * vals[1][0])
                    exact = math.isfinite(ab) and math.isfinite(vals[2][0]) and Fraction(ab) * Fraction(vals[2][0]) == Fraction(r[0])
                prod = not exact
                if prod and not plain and acc in ("add", "sub"):
                    r = (r[0], r[1] + 2 * ctx.u * abs(r[0]) + ctx.tiny, r[2])
            if live:
                # apply this point now: the next point may read what it writes
                counts[lo] = counts.get(lo, 0) + 1
                if plain:
                    sv, se = store(r[0], r[1], lhs.prec, ctx)
                else:
                    old = read(lhs.vals[lo], lhs.errs[lo], lhs.prec, ctx)
                    sv, se = self.fold(acc, old, [r], lhs.prec, ctx)
                self.set_cell(lhs, lo, sv, se, orderdep or lhs.order[lo], counts[lo] > 1 or lhs.seq[lo], False)
                continue
            groups.setdefault(lo, []).append((r, orderdep, prod))
        for lo, rs in groups.items():
            if plain:
                assert len(rs) == 1
                (r, od, prod) = rs[0]
                sv, se = store(r[0], r[1], lhs.prec, ctx)
                self.set_cell(lhs, lo, sv, se, od, False, prod and lhs.prec == fprec)
                continue
            prod_flag = acc == "arg2" and rs[-1][2] and lhs.prec == fprec
            old = read(lhs.vals[lo], lhs.errs[lo], lhs.prec, ctx)
            od = lhs.order[lo] or any(x[1] for x in rs)
            seq = lhs.seq[lo]
            vals = [x[0] for x in rs]
            sv, se = self.fold(acc, old, vals, lhs.prec, ctx)
            if len(vals) >= 2:
                reorderable = acc in ("add", "sub", "mul") and ctx.ctype != "int" and lhs.prec in ("single", "double") and (lhs.prec == fprec)
                if reorderable:
                    fin = [old[0]] + [v[0] for v in vals]
                    if all(math.isfinite(x) for x in fin) and se != INF:
                        p = FLOAT_FMT[fprec][0]
                        if acc == "mul":
                            ok = self.exact_product_ok(fin, fprec)
                        else:
                            ok = exact_sum_ok(fin, p)
                        if not ok:
                            mag = sum(abs(x) for x in fin) if acc != "mul" else abs(sv)
                            se = se + 2 * (len(fin) + 1) * ctx.u * mag + len(fin) * ctx.tiny
                            if acc == "mul":
                                big = sum(math.log2(abs(x)) for x in fin if x != 0 and abs(x) > 1)
                                small = sum(math.log2(abs(x)) for x in fin if x != 0 and abs(x) < 1)
                                if big >= math.log2(ctx.maxf) - 1 or small <= math.log2(ctx.tiny) + 2 * p + 2:
                                    se = INF
                            elif mag >= ctx.maxf / 2:
                                se = INF
                    elif se != INF:
                        finite_mag = sum(abs(x) for x in fin if math.isfinite(x))
                        if finite_mag >= ctx.maxf / 2 or (acc == "mul" and any(x == 0 for x in fin)):
                            se = INF
                else:
                    rr = random.Random(lo)
                    differs = not same(self.fold(acc, old, list(reversed(vals)), lhs.prec, ctx)[0], sv)
                    for _ in range(4 if len(vals) > 2 else 0):
                        if differs:
                            break
                        sh = list(vals)
                        rr.shuffle(sh)
                        differs = not same(self.fold(acc, old, sh, lhs.prec, ctx)[0], sv)
                    if differs:
                        if acc in ("add", "sub", "mul") and ctx.ctype != "int":
                            seq = True  # a narrow-float or integer-from-double accumulation
                        else:
                            od = True
            self.set_cell(lhs, lo, sv, se, od, seq, prod_flag)

    def fold(self, acc, old, vals, prec, ctx):
        cur = old
        sv, se = None, None
        for v in vals:
            r = evaluate(acc, [cur, v], ctx)
            sv, se = store(r[0], r[1], prec, ctx)
            cur = read(sv, se, prec, ctx)
        return sv, se

    @staticmethod
    def exact_product_ok(fin, fmt):
        p, emin, maxf = FLOAT_FMT[fmt]
        odd = 1
        lo = hi = Fraction(1)
        zero = False
        for x in fin:
            if x == 0:
                zero = True
                continue
            q = abs(Fraction(x))
            n, d = q.numerator, q.denominator
            if d & (d - 1):
                return False
            while n % 2 == 0:
                n //= 2
            odd *= n
            if q < 1:
                lo *= q
            else:
                hi *= q
        if zero:
            return hi <= Fraction(maxf)
        return odd.bit_length() <= p and hi <= Fraction(maxf) and lo >= Fraction(2) ** emin


def same(a, b):
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) and math.isnan(b):
            return True
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return a == b


# ----------------------------------------------------------------------------- generator

PREC_WEIGHTS = {"byte": 1.0, "uint16": 0.8, "int32": 1.3, "uint32": 0.8, "int64": 1.3, "uint64": 1.0,
                "fp8": 1.0, "half": 1.3, "bfloat16": 1.3, "single": 2.5, "double": 1.8}
INT_LIST = list(INT_PRECS)
FLOAT_LIST = list(FLOAT_FMT)
UN_WEIGHTS = {op: 1.0 for op in UNOPS}
UN_WEIGHTS.update({"identity": 3.0, "relu": 1.5, "neg": 1.5})
BIN_WEIGHTS = {op: 1.0 for op in BINOPS}
BIN_WEIGHTS.update({"add": 4.0, "sub": 2.5, "mul": 4.0, "div": 2.0, "max": 1.5, "min": 1.5})
ACC_WEIGHTS = {op: 0.4 for op in BINOPS}
ACC_WEIGHTS.update({"set": 14.0, "add": 12.0, "max": 3.0, "min": 2.5, "mul": 2.0, "sub": 1.5})
NEUTRAL_ACCS = ("add", "sub", "mul", "div", "pow", "max", "min", "set", "arg2", "and", "or",
                "bit_and", "bit_or", "bit_xor")


def wchoice(rng, weights):
    items = list(weights.items())
    total = sum(w for _, w in items)
    x = rng.random() * total
    for k, w in items:
        x -= w
        if x < 0:
            return k
    return items[-1][0]


def prod_dims(dims):
    n = 1
    for d in dims:
        n *= d
    return n


class Gen:
    LETTERS = "ijklmnpqrstuv"

    def __init__(self, rng, big=0.06):
        self.rng = rng
        self.tensors = {}  # name -> JSON object
        self.written = []  # names written by some statement, in order
        self.read_later = set()
        self.statics = {}  # name -> range
        self.stmts = []
        self.n = 0
        self.edge = rng.random() < 0.55
        self.edge_p = rng.choice([0.08, 0.15, 0.3])
        self.big = rng.random() < big
        self.mode = rng.choice(["mixed", "mixed", "mixed", "int", "float", "same"])
        self.same_prec = self.pick_prec_any()
        self.errors_ok = rng.random() < 0.08

    # -- precisions and values
    def pick_prec_any(self):
        return wchoice(self.rng, PREC_WEIGHTS)

    def pick_prec(self, kind=None):
        r = self.rng
        if kind == "int" or (kind is None and self.mode == "int"):
            return wchoice(r, {p: PREC_WEIGHTS[p] for p in INT_LIST})
        if kind == "float" or (kind is None and self.mode == "float"):
            return wchoice(r, {p: PREC_WEIGHTS[p] for p in FLOAT_LIST})
        if kind is None and self.mode == "same" and r.random() < 0.85:
            return self.same_prec
        return self.pick_prec_any()

    def value(self, prec):
        r = self.rng
        if is_int(prec):
            lo, hi = int_min(prec), int_max(prec)
            if self.edge and r.random() < self.edge_p:
                return r.choice([lo, hi, hi - 1, lo + 1, 0, 1, -1, 2 ** 31, 2 ** 31 - 1, -(2 ** 31),
                                 2 ** 32 - 1, 2 ** 32, 2 ** 53 + 1, -(2 ** 53 + 1), 2 ** 63 - 1,
                                 -(2 ** 63), 2 ** 64 - 1, 2 ** 63, 255, 256, 65535, 65536, 127, 128,
                                 r.randint(lo, hi), r.randint(lo, hi), 63, 64, 31, 33])
            if INT_PRECS[prec][1] or r.random() < 0.05:
                return r.randint(-7, 12)
            return r.randint(0, 12)
        p, emin, maxf = FLOAT_FMT[prec]
        if self.edge and r.random() < self.edge_p:
            v = r.choice([0.0, -0.0, "inf", "-inf", "nan", maxf, -maxf, math.ldexp(1.0, emin - p + 1),
                          math.ldexp(1.0, emin), 0.1, -0.1, 1 / 3, 2.0 ** 24 + 1, 1e30, -1e30,
                          65504.0, 65520.0, 57344.0, 61440.0, 1e-8, 2.5, -2.5, 0.5, -3.5, 1e300,
                          float(2 ** 53 + 1), 2 ** 53 + 1, 3.4028235677973366e38, 1e-40, 100.0,
                          -0.75, 7.0, 0.3])
            return v
        c = r.random()
        if c < 0.4:
            return r.randint(-8, 8)
        if c < 0.7:
            return round_frac(Fraction(r.randint(-32, 32), r.choice([2, 4, 8])), prec)
        return round_frac(Fraction(r.uniform(-4, 4)), prec)

    # -- tensors
    def new_tensor(self, dims, prec=None, init=True, kind=None, values=None):
        name = "t%d" % self.n
        self.n += 1
        prec = prec or self.pick_prec(kind)
        d = {"name": name, "dims": list(dims), "prec": prec}
        size = prod_dims(dims)
        if values is not None:
            d["init"] = {"values": values}
        elif init:
            c = self.rng.random()
            if c < 0.08:
                d["init"] = "range"
            elif c < 0.16 and size > 1:
                k = self.rng.randint(1, min(size, 5))
                d["init"] = {"values": [self.value(prec) for _ in range(k)], "strict": False}
            else:
                d["init"] = {"values": [self.value(prec) for _ in range(size)]}
        self.tensors[name] = d
        return name

    def dims_of(self, name):
        return self.tensors[name]["dims"]

    def prec_of(self, name):
        return self.tensors[name]["prec"]

    def arg(self, dims, kind=None, allow_reuse=True):
        r = self.rng
        if allow_reuse and r.random() < 0.5:
            cands = [n for n, t in self.tensors.items() if t["dims"] == list(dims)
                     and (kind is None or (kind == "int") == is_int(t["prec"]))]
            written = [n for n in cands if n in self.written]
            if written and r.random() < 0.75:
                n = r.choice(written)
                self.read_later.add(n)
                return n
            if cands:
                n = r.choice(cands)
                self.read_later.add(n)
                return n
        return self.new_tensor(dims, kind=kind)

    def result(self, dims, kind=None):
        r = self.rng
        if r.random() < 0.15:
            cands = [n for n, t in self.tensors.items() if t["dims"] == list(dims)
                     and (kind is None or (kind == "int") == is_int(t["prec"]))]
            if cands:
                return r.choice(cands)
        init = r.random() < 0.2
        return self.new_tensor(dims, init=init, kind=kind)

    def extent(self):
        r = self.rng
        if self.big and r.random() < 0.5:
            return r.choice([16, 17, 32, 33, 48, 64])
        return r.choice([1, 2, 2, 3, 3, 4, 4, 5, 7])

    def static(self, maxrange):
        r = self.rng
        if self.statics and r.random() < 0.5:
            for name, rg in self.statics.items():
                if rg <= maxrange:
                    return name
        name = "s%d" % len(self.statics)
        self.statics[name] = r.randint(1, maxrange)
        return name

    # -- operations
    def pick_op(self, arity, precs):
        r = self.rng
        allint = all(is_int(p) for p in precs)
        if arity == 2 and allint and r.random() < 0.3:
            return r.choice(INT_ONLY + ("div", "mod", "lt", "max", "min", "pow"))
        for _ in range(20):
            if arity == 1:
                op = wchoice(r, UN_WEIGHTS)
            elif arity == 2:
                op = wchoice(r, BIN_WEIGHTS)
            else:
                op = r.choice(TERNOPS)
            if op in INT_ONLY and not allint and not (self.errors_ok and r.random() < 0.3):
                continue
            return op
        return "add" if arity == 2 else ("identity" if arity == 1 else "fma")

    def pick_accum(self, precs, reduce):
        r = self.rng
        allint = all(is_int(p) for p in precs)
        if allint and r.random() < 0.15:
            return r.choice(INT_ONLY + ("div", "mod", "pow", "and", "or"))
        for _ in range(20):
            acc = wchoice(r, ACC_WEIGHTS)
            if acc in INT_ONLY and not allint and not (self.errors_ok and r.random() < 0.3):
                continue
            return acc
        return "add"

    def emit(self, st, lhs):
        self.stmts.append(st)
        if lhs not in self.written:
            self.written.append(lhs)

    def assignment(self, lhs, args, logic, arity, reduce, op=None, accum=None, init=None):
        r = self.rng
        precs = [self.prec_of(lhs)] + [self.prec_of(a) for a in args]
        op = op or self.pick_op(arity, precs)
        acc = accum or self.pick_accum(precs, reduce)
        if init is None:
            init = r.random() < 0.55
        if reduce and acc not in NEUTRAL_ACCS:
            init = False
        st = {"assign": lhs, "op": op, "args": args}
        if logic is not None:
            st["logic"] = logic
        if acc != "set" or r.random() < 0.3:
            st["accum"] = acc
        if init or r.random() < 0.2:
            st["init_neutral"] = init
        self.emit(st, lhs)
        return st

    # -- statement templates
    def elementwise(self, reduce=False):
        r = self.rng
        arity = r.choice([1, 2, 2, 2, 3]) if not reduce else r.choice([1, 2, 2, 3])
        rank = r.choice([1, 1, 2, 2, 3])
        letters = r.sample(self.LETTERS[:6], rank)
        ext = {c: self.extent() for c in letters}
        red = []
        if reduce:
            red = [c for c in r.sample(self.LETTERS[6:], r.choice([1, 1, 2]))]
            for c in red:
                ext[c] = self.extent() if r.random() < 0.8 else 1
                if ext[c] == 1 and r.random() < 0.5:
                    ext[c] = 3
        # keep the reference fast
        while prod_dims([ext[c] for c in letters + red]) > 150000:
            c = r.choice(letters + red)
            ext[c] = max(1, ext[c] // 2)
        res_letters = list(letters)
        if r.random() < 0.2:
            r.shuffle(res_letters)
        args = []
        terms = []
        need = set(red)
        for k in range(arity):
            ls = list(letters) + list(red)
            if r.random() < 0.25:
                r.shuffle(ls)
            term, dims = [], []
            for c in ls:
                if c in red:
                    if c in need or r.random() < 0.6:
                        need.discard(c)
                        term.append(c)
                        dims.append(ext[c])
                    continue
                p = r.random()
                if p < 0.1:
                    continue
                if p < 0.22:
                    term.append(c)
                    dims.append(1)
                else:
                    term.append(c)
                    dims.append(ext[c])
            if r.random() < 0.12:
                d = r.randint(1, 4)
                pos = r.randint(0, len(term))
                term.insert(pos, str(r.randrange(d)))
                dims.insert(pos, d)
            if r.random() < 0.1:
                s = self.static(4)
                d = r.randint(self.statics[s], self.statics[s] + 2)
                pos = r.randint(0, len(term))
                term.insert(pos, "{%s}" % s)
                dims.insert(pos, d)
            if not term or r.random() < 0.08:
                # a scalar: often a constant fetched in the routine (the optimizer inlines it)
                terms.append("0")
                if r.random() < 0.7:
                    c = self.new_tensor([1], init=False)
                    v = self.value(self.prec_of(c))
                    self.emit({"fetch": c, "constant": v}, c)
                    self.read_later.add(c)
                    args.append(c)
                else:
                    args.append(self.arg([1]))
                continue
            terms.append("".join(term))
            args.append(self.arg(dims))
        rterm = list(res_letters)
        rdims = [ext[c] for c in res_letters]
        if reduce and rdims and r.random() < 0.1:
            # a result axis of extent 1 under a letter of extent > 1: reduced over (keepdims)
            rdims[r.randrange(len(rdims))] = 1
        if r.random() < 0.06:
            s = self.static(3)
            pos = r.randint(0, len(rterm))
            rterm.insert(pos, "{%s}" % s)
            rdims.insert(pos, self.statics[s] + r.randint(0, 1))
        lhs = self.result(rdims)
        if lhs in args and r.random() < 0.7:
            lhs = self.new_tensor(rdims, init=False)
        logic = ",".join(terms) + "->" + "".join(rterm)
        pointwise = (not reduce and all(self.dims_of(a) == rdims for a in args)
                     and all(t == "".join(rterm) for t in terms) and "{" not in logic)
        if pointwise and r.random() < 0.5:
            logic = None
        self.assignment(lhs, args, logic, arity, reduce)

    def matmul(self):
        r = self.rng
        big = self.big or r.random() < 0.15
        sz = (lambda: r.choice([8, 16, 24, 32, 40, 64])) if big else (lambda: r.randint(1, 6))
        form = r.choice(["mm", "mm", "bmm", "mv", "dot"])
        prec = r.choice(["single", "double"]) if r.random() < 0.6 else None
        I, K, J, B = sz(), sz(), sz(), r.randint(1, 3)
        while I * K * J * B > 150000:
            I, K, J = max(1, I // 2), max(1, K // 2), J
        if form == "mm":
            logic, da, db, dy = "ik,kj->ij", [I, K], [K, J], [I, J]
        elif form == "bmm":
            logic, da, db, dy = "bik,bkj->bij", [B, I, K], [B, K, J], [B, I, J]
        elif form == "mv":
            logic, da, db, dy = "ik,k->i", [I, K], [K], [I]
        else:
            logic, da, db, dy = "k,k->0", [K], [K], [1]
        a = self.arg(da) if prec is None else self.new_tensor(da, prec)
        b = self.arg(db) if prec is None else self.new_tensor(db, prec)
        y = self.result(dy) if prec is None else self.new_tensor(dy, prec, init=False)
        op = "mul" if r.random() < 0.85 else None
        acc = "add" if r.random() < 0.8 else None
        self.assignment(y, [a, b], logic, 2, True, op=op, accum=acc,
                        init=True if r.random() < 0.85 else None)

    def aff(self, coef_letters, offset):
        """Renders an affine entry."""
        r = self.rng
        parts = []
        for coef, c in coef_letters:
            if coef == 1 and r.random() < 0.8:
                parts.append(c)
            else:
                parts.append("%d*%s" % (coef, c))
        s = "+".join(parts)
        if offset > 0 or (offset == 0 and r.random() < 0.1):
            s += "+%d" % offset
        elif offset < 0:
            s += "-%d" % (-offset)
        return "(" + s + ")"

    def conv1d(self):
        r = self.rng
        N = r.randint(3, 12) if not self.big else r.randint(40, 200)
        K = r.randint(2, 4) if r.random() < 0.95 else 1
        S = r.choice([1, 1, 2, 3])
        D = r.choice([1, 1, 2])
        P = r.choice([0, 0, 1, 2])
        O = max(2, (N + 2 * P - D * (K - 1) - 1) // S + 1 + r.choice([0, 0, 0, -1, 1]))
        batch = r.random() < 0.3
        entry = self.aff([(S, "o"), (D, "k")], -P)
        if r.random() < 0.35:
            # transposed: from y[O] back to dx[N]
            if batch:
                B, C, Dd = r.randint(1, 2), r.randint(1, 3), r.randint(1, 3)
                y = self.arg([B, O, Dd])
                w = self.arg([K, C, Dd])
                dx = self.result([B, N, C])
                logic = "bod,kcd->b%sc" % entry
            else:
                y = self.arg([O])
                w = self.arg([K])
                dx = self.result([N])
                logic = "o,k->%s" % entry
            self.assignment(dx, [y, w], logic, 2, True, op=r.choice(["mul", "mul", None]),
                            accum=r.choice(["add", "add", "max", None]), init=r.random() < 0.8 or None)
            return
        if batch:
            B, C, Dd = r.randint(1, 2), r.randint(1, 3), r.randint(1, 3)
            x = self.arg([B, N, C])
            w = self.arg([K, C, Dd])
            y = self.result([B, O, Dd])
            logic = "b%sc,kcd->bod" % entry
        else:
            x = self.arg([N])
            w = self.arg([K])
            y = self.result([O])
            logic = "%s,k->o" % entry
        op, acc = r.choice([("mul", "add"), ("mul", "add"), ("arg1", "max"), ("arg1", "min"),
                            ("add", "max"), (None, None)])
        self.assignment(y, [x, w], logic, 2, True, op=op, accum=acc, init=r.random() < 0.8 or None)

    def conv2d(self, pool=False):
        r = self.rng
        H, W = r.randint(2, 9), r.randint(2, 9)
        KH, KW = r.randint(2, 3), r.randint(2, 3)
        S = r.choice([1, 2])
        P = r.choice([0, 1])
        OH = max(2, (H + 2 * P - KH) // S + 1 + r.choice([0, 0, -1, 1]))
        OW = max(2, (W + 2 * P - KW) // S + 1)
        B, C, Dd = r.randint(1, 2), r.randint(1, 3), r.randint(1, 3)
        eh = self.aff([(S, "h"), (1, "i")], -P)
        ew = self.aff([(S, "w"), (1, "j")], -P)
        if pool:
            x = self.arg([B, H, W, C])
            k = self.arg([KH, KW])
            y = self.result([B, OH, OW, C])
            logic = "b%s%sc,ij->bhwc" % (eh, ew)
            op, acc = r.choice([("arg1", "max"), ("arg1", "max"), ("arg1", "min"), ("arg1", "add"),
                                ("mul", "add")])
            self.assignment(y, [x, k], logic, 2, True, op=op, accum=acc, init=True)
        else:
            x = self.arg([B, H, W, C])
            w = self.arg([KH, KW, C, Dd])
            y = self.result([B, OH, OW, Dd])
            logic = "b%s%sc,ijcd->bhwd" % (eh, ew)
            self.assignment(y, [x, w], logic, 2, True, op="mul", accum="add",
                            init=r.random() < 0.85 or None)

    def chain(self):
        """A chain of pointwise statements over one shape, each reading earlier results (the
        optimizer inlines and fuses them), some reading one result twice or transposed."""
        r = self.rng
        rank = r.choice([1, 2, 2, 3])
        dims = [self.extent() if r.random() < 0.7 else r.choice([8, 16, 33]) for _ in range(rank)]
        while prod_dims(dims) > 20000:
            dims = [max(1, d // 2) for d in dims]
        letters = "ijk"[:rank]
        prev = [self.arg(dims)]
        for _ in range(r.randint(2, 5)):
            arity = r.choice([1, 2, 2, 3])
            args = [prev[-1]] + [r.choice(prev) if r.random() < 0.6 else self.arg(dims)
                                 for _ in range(arity - 1)]
            r.shuffle(args)
            for a in args:
                self.read_later.add(a)
            y = self.new_tensor(dims, init=False)
            logic = None if r.random() < 0.5 else ",".join([letters] * arity) + "->" + letters
            self.assignment(y, args, logic, arity, False,
                            accum=r.choice(["set", "set", "set", None]), init=r.random() < 0.5)
            prev.append(y)

    def conv_kernel(self):
        """A convolution large enough for the GEMM kernels (single or double operands)."""
        r = self.rng
        prec = r.choice(["single", "double"])
        B, H, W = r.randint(1, 2), r.randint(6, 14), r.randint(6, 14)
        C, D = r.choice([4, 8, 16]), r.choice([4, 8, 16, 32])
        KH, KW = r.choice([(3, 3), (2, 2), (1, 3)])
        S, P = r.choice([(1, 0), (1, 1), (2, 1)])
        OH = max(2, (H + 2 * P - KH) // S + 1)
        OW = max(2, (W + 2 * P - KW) // S + 1)
        x = self.new_tensor([B, H, W, C], prec)
        w = self.new_tensor([KH, KW, C, D], prec)
        y = self.new_tensor([B, OH, OW, D], prec, init=False)
        eh = self.aff([(S, "h"), (1, "i")], -P)
        ew = self.aff([(S, "w"), (1, "j")], -P)
        self.assignment(y, [x, w], "b%s%sc,ijcd->bhwd" % (eh, ew), 2, True, op="mul", accum="add",
                        init=True)

    def concat(self):
        r = self.rng
        pieces = [r.randint(2, 5) for _ in range(r.choice([2, 2, 3]))]
        gap = r.choice([0, 0, 0, 1])
        total = sum(pieces) + gap
        two_d = r.random() < 0.35
        M = r.randint(1, 4)
        y = self.result([total, M] if two_d else [total]) if r.random() < 0.5 else \
            self.new_tensor([total, M] if two_d else [total], init=True)
        pos = 0
        for n in pieces:
            a = self.arg([n, M] if two_d else [n])
            entry = self.aff([(1, "i")], pos) if (pos or r.random() < 0.8) else "i"
            if entry == "i" and n != total:
                entry = "(i)"
            logic = ("i->%s" % entry) if not two_d else ("ij->%sj" % entry)
            op = r.choice(["identity", "identity", "neg", "relu"])
            self.assignment(y, [a], logic, 1, True, op=op, accum="set", init=False)
            pos += n

    def shift(self):
        r = self.rng
        n = r.randint(2, 8)
        c = r.randint(1, 3)
        x = self.arg([n])
        if r.random() < 0.5:
            y = self.result([n])
            self.assignment(y, [x], "i->(i+%d)" % c, 1, True, op="identity", accum="set",
                            init=False)
        else:
            y = self.result([n])
            self.assignment(y, [x], "(i+%d)->i" % c, 1, False, op=r.choice(["identity", "neg"]),
                            accum=r.choice(["set", "add"]), init=r.random() < 0.5)

    def random_affine(self):
        r = self.rng
        letters = r.sample("ijklmn", r.choice([1, 2, 2, 3]))
        ext = {c: r.randint(1, 5) for c in letters}
        for c in letters:
            if ext[c] == 1:
                ext[c] = 2
        arity = r.choice([1, 2, 2])
        terms, dims_list = [], []
        # result: plain letters of some, affine entries of others
        def make_term(is_res):
            term, dims = [], []
            used = list(letters)
            r.shuffle(used)
            for c in used[: r.randint(1, len(used))]:
                if r.random() < 0.45:
                    other = [x for x in letters if x != c]
                    lst = [(r.randint(1, 2), c)]
                    if other and r.random() < 0.5:
                        lst.append((r.randint(1, 2), r.choice(other)))
                    off = r.randint(-2, 2)
                    term.append(self.aff(lst, off))
                    hi = sum(k * (ext[x] - 1) for k, x in lst) + off
                    dims.append(max(1, hi + r.randint(-2, 1)))
                else:
                    term.append(c)
                    dims.append(ext[c])
            return term, dims
        for _ in range(arity):
            t, d = make_term(False)
            terms.append(t)
            dims_list.append(d)
        rt, rd = make_term(True)
        # every letter needs an extent from a plain entry
        plain = {e for t in terms + [rt] for e in t if len(e) == 1}
        for c in letters:
            if c not in plain:
                terms[0].append(c)
                dims_list[0].append(ext[c])
        args = [self.arg(d) for d in dims_list]
        y = self.result(rd)
        logic = ",".join("".join(t) for t in terms) + "->" + "".join(rt)
        acc = r.choice(["add", "add", "set", "max", None])
        self.assignment(y, args, logic, arity, True, accum=acc,
                        init=(r.random() < 0.6) if acc != "set" else False)

    def index_tensor(self, dims, n):
        r = self.rng
        prec = self.pick_prec("int")
        cands = [x for x, t in self.tensors.items() if t["dims"] == list(dims) and is_int(t["prec"])
                 and x in self.written]
        if cands and r.random() < 0.25:
            return r.choice(cands)
        vals = []
        for _ in range(prod_dims(dims)):
            if r.random() < 0.15:
                vals.append(r.choice([-1, -2, n, n + 1, int_min(prec), int_max(prec), 2 ** 63,
                                      2 ** 64 - 1, -(2 ** 31), 2 ** 32 + 1]))
            else:
                vals.append(r.randint(0, n - 1))
        return self.new_tensor(dims, prec, values=vals)

    def gather(self):
        r = self.rng
        N = r.randint(1, 6) if not self.big else r.randint(100, 3000)
        D = [r.randint(1, 5) for _ in range(r.choice([1, 1, 2]))]
        R = [r.randint(1, 4) for _ in range(r.choice([0, 1, 1, 2]))]
        idx = self.index_tensor(D, N)
        table = self.arg([N] + R)
        y = self.result(D + R)
        if y in (table, idx):
            y = self.new_tensor(D + R, init=False)
        self.emit({"gather": y, "from": table, "index": idx}, y)

    def scatter(self):
        r = self.rng
        N = r.randint(1, 6)
        D = [r.randint(1, 6) for _ in range(r.choice([1, 1, 2]))]
        R = [r.randint(1, 4) for _ in range(r.choice([0, 1, 1, 2]))]
        idx = self.index_tensor(D, N)
        h = self.arg(D + R)
        g = self.result([N] + R)
        if g in (h, idx):
            g = self.new_tensor([N] + R)
        if r.random() < 0.3:
            self.emit({"fetch": g, "constant": 0}, g)
        self.emit({"scatter_add": g, "from": h, "index": idx}, g)

    def fetch(self):
        r = self.rng
        dims = [self.extent() for _ in range(r.choice([1, 1, 2]))]
        c = r.random()
        if c < 0.35:
            y = self.result(dims)
            seed = r.choice([0, 1, 42, 2 ** 32 - 1, 2 ** 32, 2 ** 64 - 1, r.randrange(2 ** 64)])
            self.emit({"fetch": y, "random": {"seed": seed}}, y)
        elif c < 0.6:
            y = self.result(dims)
            v = self.value(self.prec_of(y))
            if isinstance(v, str):
                v = 0.25
            self.emit({"fetch": y, "constant": v}, y)
        elif c < 0.8:
            s = self.static(r.choice([3, 10, 300]))
            y = self.result(dims)
            self.emit({"fetch": y, "embed_index": s}, y)
        else:
            B = r.randint(1, 4)
            s = self.static(B)
            src = self.arg([self.statics[s] + r.randint(0, 1)] + dims)
            y = self.result(dims)
            if y == src:
                y = self.new_tensor(dims, init=False)
            self.emit({"fetch": y, "slice": src, "index": s}, y)

    def program(self):
        r = self.rng
        templates = {"elementwise": 5.0, "reduce": 3.0, "chain": 1.5, "matmul": 1.2, "conv1d": 1.2, "conv2d": 0.7,
                     "pool": 0.7, "concat": 0.7, "shift": 0.5, "random_affine": 1.2,
                     "gather": 0.8, "scatter": 0.6, "fetch": 1.2, "conv_kernel": 0.3}
        nst = r.choice([1, 2, 2, 3, 3, 4, 5, 6])
        for _ in range(nst):
            t = wchoice(r, templates)
            if t == "elementwise":
                self.elementwise(False)
            elif t == "reduce":
                self.elementwise(True)
            elif t == "pool":
                self.conv2d(pool=True)
            else:
                getattr(self, t)()
        # routines: one, or the statements split in two
        if len(self.stmts) >= 2 and r.random() < 0.3:
            cut = r.randint(1, len(self.stmts) - 1)
            routines = [{"name": "first", "code": self.stmts[:cut]},
                        {"name": "second", "code": self.stmts[cut:]}]
        else:
            code = self.stmts
            if r.random() < 0.3:
                code = [{"comment": "block */ of \"statements\"", "code": code}]
            routines = [{"name": "main", "code": code}]

        def binds():
            return {s: r.randrange(rg) for s, rg in self.statics.items() if r.random() < 0.9}

        steps = []
        for rt in routines:
            st = {"routine": rt["name"]}
            if self.statics:
                st["bindings"] = binds()
            steps.append(st)
        if r.random() < 0.15:
            steps = [{"repeat": r.randint(0, 3), "steps": steps}]
        elif r.random() < 0.15:
            extra = {"routine": routines[-1]["name"]}
            if self.statics:
                extra["bindings"] = binds()
            steps.append(extra)
        if r.random() < 0.2:
            # copies between host and device between the steps
            hosted = [n for n, t in self.tensors.items() if "init" in t]
            if hosted:
                n = r.choice(hosted)
                more = [{"to_host": n}] if r.random() < 0.5 else []
                more.append({"routine": routines[-1]["name"]})
                more.append({"from_host": n})
                more.append({"routine": routines[0]["name"]})
                steps.extend(more)
        if self.statics and self.errors_ok and r.random() < 0.2:
            s = r.choice(list(self.statics))
            steps.append({"routine": routines[0]["name"], "bindings": {s: self.statics[s] + r.randint(0, 2)}})
        # print the written tensors (some intermediates stay hidden so they may be inlined)
        printed = []
        for n in self.written:
            if n in self.read_later and "init" not in self.tensors[n] and r.random() < 0.55:
                continue
            printed.append(n)
        if not printed:
            printed = list(self.written[-1:])
        # explicit memory modes on some hidden intermediates
        for n in self.written:
            t = self.tensors[n]
            if n not in printed and "init" not in t and r.random() < 0.12:
                t["memory"] = "on_device"
        prog = {"tensors": list(self.tensors.values())}
        if self.statics:
            prog["static_indices"] = [{"name": s, "range": rg} if r.random() < 0.9 else {"name": s}
                                      for s, rg in self.statics.items()]
        prog["routines"] = routines
        prog["run"] = steps
        prog["print"] = printed
        return prog


def generate(seed, case, big):
    rng = random.Random("%d/%d" % (seed, case))
    return Gen(rng, big).program()


# ----------------------------------------------------------------------------- running


class Outcome:
    def __init__(self, rc, stdout, stderr, secs):
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr
        self.secs = secs
        self.values = None
        if rc == 0:
            try:
                # "-0" is a float's negative zero: keep its sign
                self.values = json.loads(stdout, parse_int=lambda t: -0.0 if t == "-0" else int(t))
            except ValueError as e:
                self.rc = -999
                self.stderr += "\nunparsable output: %s" % e


def run_arrayjit(binary, path, interpret, env, timeout=600):
    cmd = [binary, "run"] + (["--interpret"] if interpret else []) + [path]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        return Outcome(p.returncode, p.stdout, p.stderr, time.time() - t0)
    except subprocess.TimeoutExpired:
        return Outcome(-998, "", "timeout after %ds" % timeout, time.time() - t0)


def parse_got(v, prec):
    if isinstance(v, str):
        if v in ("inf", "-inf", "nan"):
            return float(v)
        raise ValueError("bad printed value %r" % v)
    if is_int(prec):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError("integer precision printed %r" % v)
        return v
    return STORE_FLOAT[prec](float(v))


def cell_matches(g, rv, re_, prec):
    if is_int(prec):
        return g == rv
    if re_ == 0:
        return same(g, rv)
    if math.isnan(rv):
        return math.isnan(g)
    if math.isinf(rv):
        return g == rv
    if math.isnan(g) or math.isinf(g):
        return False
    return abs(g - rv) <= re_ * (1 + 1e-6) + 1e-300


def fmt_val(v):
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    return str(v)


def unravel(i, dims):
    out = []
    for d in reversed(dims):
        out.append(i % d)
        i //= d
    return tuple(reversed(out))


def compare(ref_out, got, label):
    """Returns (mismatches, soft mismatches (order), checked cells, unchecked cells)."""
    hard, soft = [], []
    checked = unchecked = 0
    if set(got.keys()) != set(ref_out.keys()):
        hard.append("%s: printed tensors %s, expected %s" % (label, sorted(got), sorted(ref_out)))
        return hard, soft, 0, 0
    for name, t in ref_out.items():
        g = got[name]
        if g.get("dims") != t.dims or g.get("prec") != t.prec or len(g.get("values", [])) != t.size:
            hard.append("%s: tensor %s printed as dims %s prec %s with %d values, expected %s %s %d"
                        % (label, name, g.get("dims"), g.get("prec"), len(g.get("values", [])),
                           t.dims, t.prec, t.size))
            continue
        for i, gv in enumerate(g["values"]):
            if t.errs[i] == INF:
                unchecked += 1
                continue
            checked += 1
            try:
                gvv = parse_got(gv, t.prec)
            except ValueError as e:
                hard.append("%s: %s[%d]: %s" % (label, name, i, e))
                continue
            if not cell_matches(gvv, t.vals[i], t.errs[i], t.prec):
                msg = "%s: %s%s (%s): expected %s%s, got %s" % (
                    label, name, list(unravel(i, t.dims)), t.prec, fmt_val(t.vals[i]),
                    (" (+-%.3g)" % t.errs[i]) if t.errs[i] else "", fmt_val(gvv))
                if t.order[i] or t.seq[i]:
                    soft.append(msg + " [order-dependent cell]")
                else:
                    hard.append(msg)
    return hard, soft, checked, unchecked


VARIANTS = {
    "gcc": {},
    "clang": {"ARRAYJIT_CC": "clang"},
    "gcc-v2": {"ARRAYJIT_ARCH_FLAGS": "-march=x86-64-v2"},
    "clang-v2": {"ARRAYJIT_CC": "clang", "ARRAYJIT_ARCH_FLAGS": "-march=x86-64-v2"},
    "checked": {"ARRAYJIT_CHECKED": "1"},
    "O0": {"ARRAYJIT_OPT_LEVEL": "0"},
}


def reference_of(prog, base_dir="."):
    """("ok", outputs) | ("error", message) | ("unsupported", message)."""
    try:
        return "ok", Reference(prog, base_dir).run()
    except RefError as e:
        return "error", str(e)
    except Unsupported as e:
        return "unsupported", str(e)


def check_program(prog, path, opts, variants, stats):
    """Runs one program file through arrayjit (compiled under each variant, interpreted) and
    compares with the reference. Returns a list of report lines (empty when it conforms)."""
    kind, ref = reference_of(prog, os.path.dirname(path))
    if kind == "unsupported":
        stats["unsupported"] += 1
        return []
    lines = []
    runs = []
    for v in variants:
        env = dict(os.environ)
        env.update(VARIANTS[v])
        if opts.cache_dir:
            env["ARRAYJIT_CACHE_DIR"] = opts.cache_dir
        runs.append(("compiled[%s]" % v, run_arrayjit(opts.binary, path, False, env)))
    if not opts.no_interpret:
        env = dict(os.environ)
        runs.append(("interpreted", run_arrayjit(opts.binary, path, True, env)))
    for label, o in runs:
        stats["runs"] += 1
        stats["secs"] += o.secs
        if kind == "error":
            if o.rc == 0:
                lines.append("%s: ran, but the program is invalid (%s)" % (label, ref))
            elif o.rc != 1:
                lines.append("%s: exit status %d (expected 1: %s): %s" % (label, o.rc, ref, o.stderr.strip()[-300:]))
            continue
        if o.rc != 0:
            lines.append("%s: failed with status %d: %s" % (label, o.rc, o.stderr.strip()[-500:]))
            continue
        hard, soft, c, u = compare(ref, o.values, label)
        stats["cells"] += c
        stats["unchecked"] += u
        lines.extend(hard[:8])
        if len(hard) > 8:
            lines.append("%s: ... %d more mismatching cells" % (label, len(hard) - 8))
        if soft:
            stats["soft"] += 1
            lines.extend(soft[:4])
    # compiled and interpreted runs must agree exactly on integer and narrow results
    oks = [(lb, o) for lb, o in runs if o.rc == 0 and o.values is not None]
    if kind == "ok" and len(oks) >= 2:
        base_lb, base = oks[0]
        for lb, o in oks[1:]:
            for name, t in ref.items():
                if t.prec in ("single", "double", "half"):
                    continue
                a, b = base.values.get(name, {}).get("values"), o.values.get(name, {}).get("values")
                if a is None or b is None:
                    continue
                for i, (x, y) in enumerate(zip(a, b)):
                    if x != y and t.errs[i] != INF:
                        break
                else:
                    continue
                if t.order[i] or t.seq[i]:
                    lines.append("%s and %s differ on %s[%d]: %s vs %s [order-dependent cell]" % (base_lb, lb, name, i, x, y))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--start", type=int, default=0, help="first case number")
    ap.add_argument("--binary", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "arrayjit"))
    ap.add_argument("--keep", default=None, help="directory for the program files (default /tmp/conformance/seed-S)")
    ap.add_argument("--keep-all", action="store_true", help="keep every program file, not only failing ones")
    ap.add_argument("--variants", default="gcc,clang,gcc-v2,checked,gcc,clang-v2",
                    help="compiled configurations, cycled over the cases (%s)" % ",".join(VARIANTS))
    ap.add_argument("--all-variants", action="store_true", help="run every case under every variant")
    ap.add_argument("--no-interpret", action="store_true")
    ap.add_argument("--big", type=float, default=0.06, help="fraction of programs with large shapes")
    ap.add_argument("--cache-dir", default=None, help="ARRAYJIT_CACHE_DIR for the runs")
    ap.add_argument("--check", nargs="*", help="check these program files instead of random ones")
    ap.add_argument("--reference", help="print the reference values of a program file")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--exclude-precs", default="", help="precisions the generator leaves out")
    opts = ap.parse_args()
    self_test()
    for p in opts.exclude_precs.split(","):
        if p:
            PREC_WEIGHTS[p] = 0.0
    opts.binary = os.path.abspath(opts.binary)
    if opts.reference:
        with open(opts.reference) as f:
            prog = json.load(f)
        kind, ref = reference_of(prog, os.path.dirname(opts.reference))
        if kind != "ok":
            print("%s: %s" % (kind, ref))
            return 1
        for name, t in ref.items():
            vals = [fmt_val(v) + ("~%.2g" % e if e else "") for v, e in zip(t.vals, t.errs)]
            print("%s %s %s: %s" % (name, t.prec, t.dims, ", ".join(vals)))
        return 0
    variants = [v for v in opts.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            ap.error("unknown variant %s" % v)
    stats = {"runs": 0, "cells": 0, "unchecked": 0, "soft": 0, "unsupported": 0, "secs": 0.0}
    failed = []
    if opts.check is not None:
        for path in opts.check:
            with open(path) as f:
                prog = json.load(f)
            kind, why = reference_of(prog, os.path.dirname(os.path.abspath(path)))
            if kind == "unsupported":
                print("%s: skipped (%s)" % (path, why))
                continue
            lines = check_program(prog, os.path.abspath(path), opts, variants, stats)
            print("%s: %s" % (path, "ok" if not lines else "MISMATCH"))
            for ln in lines:
                print("  " + ln)
            if lines:
                failed.append(path)
        print("checked %d files, %d mismatching, %d cells compared" % (len(opts.check), len(failed), stats["cells"]))
        return 1 if failed else 0
    keep = opts.keep or "/tmp/conformance/seed-%d" % opts.seed
    os.makedirs(keep, exist_ok=True)
    t0 = time.time()
    errors_expected = 0
    for case in range(opts.start, opts.start + opts.cases):
        prog = generate(opts.seed, case, opts.big)
        path = os.path.join(keep, "case-%d.json" % case)
        with open(path, "w") as f:
            json.dump(prog, f, indent=1)
        vs = variants if opts.all_variants else [variants[case % len(variants)]]
        kind, _ = reference_of(prog)
        if kind == "error":
            errors_expected += 1
        try:
            lines = check_program(prog, path, opts, vs, stats)
        except Exception as e:  # a bug of this script: keep the file and go on
            lines = ["checker exception: %r" % e]
        hard = [ln for ln in lines if "[order-dependent" not in ln]
        if lines:
            failed.append((case, path, hard, lines))
            print("%s case %d (seed %d): %s" % ("MISMATCH" if hard else "ORDER", case, opts.seed, path))
            for ln in lines:
                print("  " + ln)
            sys.stdout.flush()
        elif not opts.keep_all:
            os.remove(path)
        if not opts.quiet and (case - opts.start + 1) % 50 == 0:
            print("... %d cases, %d with mismatches, %.0f s" % (case - opts.start + 1, len(failed), time.time() - t0))
            sys.stdout.flush()
    nhard = sum(1 for f in failed if f[2])
    print("seed %d: %d cases (%d invalid programs expected to fail, %d skipped as unsupported), "
          "%d arrayjit runs, %d cells compared (%d left unchecked: uncertain), "
          "%d cases with mismatches, %d with only order-dependent differences; %.0f s"
          % (opts.seed, opts.cases, errors_expected, stats["unsupported"], stats["runs"],
             stats["cells"], stats["unchecked"], nhard, len(failed) - nhard, time.time() - t0))
    for case, path, hard, _ in failed:
        print("  %s case %d: %s" % ("MISMATCH" if hard else "order", case, path))
    return 1 if nhard else 0


if __name__ == "__main__":
    sys.exit(main())
