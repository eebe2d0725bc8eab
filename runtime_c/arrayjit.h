/* arrayjit runtime header: included by every generated C file.
 *
 * Generated code computes in `float` (for half and single arrays) or `double` (for byte and
 * double arrays) and converts explicitly when storing.
 *
 * Half arrays hold IEEE binary16 bit patterns in `aj_half` (`uint16_t`), never `_Float16`:
 * every conversion goes through `aj_h2f` / `aj_f2h` below, written in portable integer
 * arithmetic, so no compiler or CPU (AVX512-FP16, ARM FP16) can fuse, skip or widen the
 * rounding that the program's meaning requires at every store (GCC 12 with AVX512-FP16 drops
 * it in vectorized reductions when `_Float16` is used).
 *
 * Byte arrays are modular, as C's `unsigned char` and numpy's uint8: a value stored into a
 * byte is truncated toward zero and wrapped modulo 256; NaN and infinities store 0. */
#ifndef ARRAYJIT_RUNTIME_H
#define ARRAYJIT_RUNTIME_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* An IEEE binary16 value, as its bit pattern. */
typedef uint16_t aj_half;

/* binary16 -> binary32, exact. Branch-free (bit masks, no conditional selects), so it
 * vectorizes without if-conversion. */
static inline float aj_h2f(aj_half h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t em = (uint32_t)h & 0x7fffu;
  /* Normal numbers: move the fields into place and rebias the exponent (15 -> 127). */
  uint32_t normal = (em << 13) + 0x38000000u;
  /* Infinities and NaNs keep their payload under an all-ones exponent. */
  uint32_t special = (em << 13) | 0x7f800000u;
  /* Zero and subnormals: em * 2^-24, exact in float (and a normal float, so flush-to-zero
   * modes cannot touch it). */
  float sub_f = (float)(int32_t)em * 0x1p-24f;
  uint32_t sub;
  memcpy(&sub, &sub_f, sizeof sub);
  uint32_t is_sub = -(uint32_t)(em < 0x400u);
  uint32_t is_special = -(uint32_t)(em >= 0x7c00u);
  uint32_t bits = (sub & is_sub) | (special & is_special) | (normal & ~(is_sub | is_special));
  bits |= sign;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* binary32 -> binary16, rounding to nearest, ties to even, exactly as IEEE 754 requires
 * (overflow gives infinity, NaN gives a quiet NaN). Integer arithmetic only, branch-free. */
static inline aj_half aj_f2h(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t a = x & 0x7fffffffu;
  /* Results that are normal halves (|f| >= 2^-14): drop 13 mantissa bits, rounding to
   * nearest even, and rebias; a carry out of the mantissa correctly bumps the exponent. */
  uint32_t normal = (a - 0x38000000u + 0x0fffu + ((a >> 13) & 1u)) >> 13;
  /* Results that are subnormal halves or zero: the 24-bit significand shifted right by
   * 14..25 places (capped so the shift is always defined), rounded to nearest even. */
  int32_t e = (int32_t)(a >> 23);
  int32_t s = 126 - e;
  s = s < 14 ? 14 : s;
  s = s > 25 ? 25 : s;
  uint32_t m = (a & 0x7fffffu) | 0x800000u;
  uint32_t q = m >> s;
  uint32_t rem = m & ((1u << s) - 1u);
  uint32_t halfway = 1u << (s - 1);
  uint32_t up = (uint32_t)(rem > halfway) | ((uint32_t)(rem == halfway) & q);
  uint32_t sub = q + up;
  uint32_t is_nan = -(uint32_t)(a > 0x7f800000u);
  uint32_t is_inf = -(uint32_t)(a >= 0x477ff000u) & ~is_nan; /* >= 65520 rounds to inf */
  uint32_t is_normal = -(uint32_t)(a >= 0x38800000u) & ~(is_nan | is_inf);
  uint32_t is_sub = ~(is_nan | is_inf | is_normal);
  uint32_t h = (0x7e00u & is_nan) | (0x7c00u & is_inf) | (normal & is_normal) | (sub & is_sub);
  return (aj_half)(sign | h);
}

/* Stores into byte arrays: truncate toward zero, then wrap modulo 256. Clamping to +-2^62
 * first keeps the conversion defined and changes nothing modulo 256 (every double of that
 * magnitude is a multiple of 1024); NaN and infinities end up as 0. */
static inline unsigned char aj_to_byte(double x) {
  double c = fmin(fmax(x, -0x1p62), 0x1p62);
  return (unsigned char)((uint64_t)(int64_t)c & 0xffu);
}

/* `c > 0 ? v : 0` without a branch or a conditional select: the comparison becomes a bit
 * mask. Relu (through aj_relu_f/aj_relu_d below) and relu_gate use these, so that C
 * compilers vectorize them without if-conversion (which GCC 12 miscompiles in some loops, see
 * the README). NaN or -0.0 in `c` give +0.0, exactly as the conditional would. */
static inline float aj_gate_f(float c, float v) {
  int32_t bits;
  memcpy(&bits, &v, sizeof bits);
  bits &= -(int32_t)(c > 0.0f);
  memcpy(&v, &bits, sizeof bits);
  return v;
}

static inline double aj_gate_d(double c, double v) {
  int64_t bits;
  memcpy(&bits, &v, sizeof bits);
  bits &= -(int64_t)(c > 0.0);
  memcpy(&v, &bits, sizeof bits);
  return v;
}

/* Threefry-4x32 with 20 rounds (Random123's threefry4x32_R(20, ctr, key)); the random fetch
 * of SPEC section 9.5 uses the first output word for key (seed mod 2^32, seed div 2^32, 0, 0)
 * and counter (offset mod 2^32, offset div 2^32, 0, 0). Mirrors src/ir/random.rs; both pass
 * Random123's known-answer vectors. */
static inline uint32_t aj_rotl32(uint32_t x, unsigned n) {
  return (x << (n & 31u)) | (x >> ((32u - n) & 31u));
}

static inline void aj_threefry4x32_20(const uint32_t ctr[4], const uint32_t key[4],
                                      uint32_t out[4]) {
  static const unsigned rot[8][2] = {{10, 26}, {11, 21}, {13, 27}, {23, 5},
                                     {6, 20},  {17, 11}, {25, 10}, {18, 20}};
  uint32_t ks[5];
  uint32_t x[4];
  ks[4] = 0x1BD11BDAu;
  for (int i = 0; i < 4; i++) {
    ks[i] = key[i];
    ks[4] ^= key[i];
    x[i] = ctr[i] + key[i];
  }
  for (int r = 0; r < 20; r++) {
    if (r % 2 == 0) {
      x[0] += x[1];
      x[1] = aj_rotl32(x[1], rot[r % 8][0]) ^ x[0];
      x[2] += x[3];
      x[3] = aj_rotl32(x[3], rot[r % 8][1]) ^ x[2];
    } else {
      x[0] += x[3];
      x[3] = aj_rotl32(x[3], rot[r % 8][0]) ^ x[0];
      x[2] += x[1];
      x[1] = aj_rotl32(x[1], rot[r % 8][1]) ^ x[2];
    }
    if (r % 4 == 3) {
      unsigned s = (unsigned)(r + 1) / 4u;
      for (int i = 0; i < 4; i++) x[i] += ks[(s + (unsigned)i) % 5u];
      x[3] += (uint32_t)s;
    }
  }
  for (int i = 0; i < 4; i++) out[i] = x[i];
}

static inline uint32_t aj_threefry_word(uint64_t seed, uint64_t offset) {
  uint32_t key[4] = {(uint32_t)seed, (uint32_t)(seed >> 32), 0, 0};
  uint32_t ctr[4] = {(uint32_t)offset, (uint32_t)(offset >> 32), 0, 0};
  uint32_t out[4];
  aj_threefry4x32_20(ctr, key, out);
  return out[0];
}

/* w / 2^32 rounded down (toward zero) to a format with `mant` significand bits and smallest
 * normal exponent `emin`: the bits of w below the format's spacing at w's magnitude are
 * cleared, so the result is exact in double and in the format (no rounding by a later
 * conversion), and below 1. Integer bit code only. */
static inline double aj_rand_unit(uint32_t w, int mant, int emin) {
  if (w == 0) return 0.0;
  int k = 31;
  while (!(w >> k)) k--;
  int e = k - 32 < emin ? emin : k - 32;
  int shift = e - mant + 1 + 32;
  uint32_t kept = shift <= 0 ? w : shift >= 32 ? 0u : (w & ~((1u << shift) - 1u));
  return (double)kept * 0x1p-32;
}

/* where: `c != 0 ? a : b` (NaN is non-zero), as a bit mask like aj_gate_f. */
static inline float aj_where_f(float c, float a, float b) {
  uint32_t ia, ib;
  memcpy(&ia, &a, sizeof ia);
  memcpy(&ib, &b, sizeof ib);
  uint32_t m = -(uint32_t)(c != 0.0f);
  uint32_t r = (ia & m) | (ib & ~m);
  memcpy(&a, &r, sizeof r);
  return a;
}

static inline uint64_t aj_where_u64(uint64_t c, uint64_t a, uint64_t b) {
  uint64_t m = -(uint64_t)(c != 0u);
  return (a & m) | (b & ~m);
}

static inline double aj_where_d(double c, double a, double b) {
  uint64_t ia, ib;
  memcpy(&ia, &a, sizeof ia);
  memcpy(&ib, &b, sizeof ib);
  uint64_t m = -(uint64_t)(c != 0.0);
  uint64_t r = (ia & m) | (ib & ~m);
  memcpy(&a, &r, sizeof r);
  return a;
}

/* relu: `a > 0 ? a : 0`, taking its operand once (a nested expression is never printed
 * twice; inlined chains of relus stay linear in size). */
static inline float aj_relu_f(float a) { return aj_gate_f(a, a); }

static inline double aj_relu_d(double a) { return aj_gate_d(a, a); }

/* max and min, exactly as IEEE 754-2019 maximumNumber and minimumNumber: a NaN operand is
 * ignored (the other operand is the result; two NaNs give NaN), and +0 is larger than -0
 * whatever the order: max(-0, +0) = max(+0, -0) = +0, min(-0, +0) = min(+0, -0) = -0. (C's
 * fmax and fmin leave the sign of a zero result unspecified: it changed with the optimization
 * level.) Equal operands are merged bitwise, AND for max and OR for min, which only matters
 * for zeros of different signs. Bit masks, no conditional select, so that loops of them
 * vectorize without if-conversion (see aj_gate_f). The reference interpreter uses the same
 * definition (`max_number` and `min_number` in src/ir/ops.rs). */
static inline float aj_max_f(float a, float b) {
  uint32_t ia, ib;
  memcpy(&ia, &a, sizeof ia);
  memcpy(&ib, &b, sizeof ib);
  uint32_t take_a = -(uint32_t)((a > b) | (b != b));
  uint32_t eq = -(uint32_t)(a == b);
  uint32_t r = (ia & take_a) | (ib & ~(take_a | eq)) | (ia & ib & eq);
  memcpy(&a, &r, sizeof r);
  return a;
}

static inline float aj_min_f(float a, float b) {
  uint32_t ia, ib;
  memcpy(&ia, &a, sizeof ia);
  memcpy(&ib, &b, sizeof ib);
  uint32_t take_a = -(uint32_t)((a < b) | (b != b));
  uint32_t eq = -(uint32_t)(a == b);
  uint32_t r = (ia & take_a) | (ib & ~(take_a | eq)) | ((ia | ib) & eq);
  memcpy(&a, &r, sizeof r);
  return a;
}

static inline double aj_max_d(double a, double b) {
  uint64_t ia, ib;
  memcpy(&ia, &a, sizeof ia);
  memcpy(&ib, &b, sizeof ib);
  uint64_t take_a = -(uint64_t)((a > b) | (b != b));
  uint64_t eq = -(uint64_t)(a == b);
  uint64_t r = (ia & take_a) | (ib & ~(take_a | eq)) | (ia & ib & eq);
  memcpy(&a, &r, sizeof r);
  return a;
}

static inline double aj_min_d(double a, double b) {
  uint64_t ia, ib;
  memcpy(&ia, &a, sizeof ia);
  memcpy(&ib, &b, sizeof ib);
  uint64_t take_a = -(uint64_t)((a < b) | (b != b));
  uint64_t eq = -(uint64_t)(a == b);
  uint64_t r = (ia & take_a) | (ib & ~(take_a | eq)) | ((ia | ib) & eq);
  memcpy(&a, &r, sizeof r);
  return a;
}

/* AJ_REPEAT32X16(T, a): the 4 bytes of the vector a (a pair of bfloat16 values) repeated 16
 * times, as a 64-byte vector of type T (a bit cast of a broadcast 32-bit word).
 * AJ_DPBF16PS(acc, a, b): AVX512-BF16's vdpbf16ps: lane i of the 16 floats acc plus
 * a[2i+1]*b[2i+1], then plus a[2i]*b[2i], for vectors a, b of 32 bfloat16 values (round to
 * nearest even; subnormal inputs and results are zero). Inline assembly of the instruction, so
 * that no compiler's bfloat16 types or builtins are relied on; defined only when the compiler
 * may use AVX512-BF16, so code using it elsewhere does not compile. */
typedef uint32_t aj_u32x16 __attribute__((vector_size(64)));
#define AJ_REPEAT32X16(T, a)                                                                   \
  __extension__({                                                                              \
    __typeof__(a) aj_rep_a = (a);                                                              \
    uint32_t aj_rep_w;                                                                         \
    memcpy(&aj_rep_w, &aj_rep_a, 4);                                                           \
    (T)((aj_u32x16){aj_rep_w, aj_rep_w, aj_rep_w, aj_rep_w, aj_rep_w, aj_rep_w, aj_rep_w,      \
                    aj_rep_w, aj_rep_w, aj_rep_w, aj_rep_w, aj_rep_w, aj_rep_w, aj_rep_w,      \
                    aj_rep_w, aj_rep_w});                                                      \
  })
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define AJ_DPBF16PS(acc, a, b)                                                                 \
  __extension__({                                                                              \
    __typeof__(acc) aj_dp_acc = (acc);                                                         \
    __typeof__(a) aj_dp_a = (a);                                                               \
    __typeof__(b) aj_dp_b = (b);                                                               \
    __asm__("vdpbf16ps %2, %1, %0" : "+v"(aj_dp_acc) : "v"(aj_dp_a), "v"(aj_dp_b));            \
    aj_dp_acc;                                                                                 \
  })
#endif

/* AJ_SHUFFLE(T, M, a, b, i...): the lanes i... of a followed by b (vectors of type T), as a
   T. Clang and GCC 12+ have __builtin_shufflevector; older GCC has __builtin_shuffle, which
   takes the lane indices as an integer vector of the same shape (M, one of the aj_mask_*
   types below). On GCC, AJ_NO_SHUFFLEVECTOR forces the second spelling (tests use it; Clang
   has only the first). */
/* ---- Integer and narrow-float precisions (SPEC 9.1). ----
 * bfloat16 and fp8 (E5M2) arrays hold bit patterns, converted by integer code only. Integer
 * statements compute in uint64_t (wrapping: never signed-overflow UB); `_s` helpers give
 * the signed (int64) meaning of a 64-bit pattern, `_u` the unsigned one. */
typedef uint16_t aj_bf16;
typedef uint8_t aj_fp8;

static inline float aj_bf2f(aj_bf16 b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* binary32 -> bfloat16, to nearest, ties to even (overflow rounds to inf; NaN stays NaN). */
static inline aj_bf16 aj_f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (aj_bf16)((u >> 16) | 0x40u);
  return (aj_bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* fp8 E5M2 is the top byte of a half: widening is exact. */
static inline float aj_fp82f(aj_fp8 b) { return aj_h2f((aj_half)((uint16_t)b << 8)); }

/* binary32 -> fp8 E5M2, to nearest, ties to even, directly from the float (no rounding
 * through half). Values >= 61440 in magnitude round to inf; NaN stays NaN. */
static inline aj_fp8 aj_f2fp8(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  uint32_t sign = (u >> 24) & 0x80u;
  uint32_t a = u & 0x7fffffffu;
  uint32_t m;
  if (a > 0x7f800000u) {
    m = 0x7eu;
  } else if (a >= 0x47700000u) {
    m = 0x7cu;
  } else if (a >= 0x38800000u) {
    uint32_t x = a - ((uint32_t)(127 - 15) << 23);
    uint32_t q = x >> 21, r = x & 0x1fffffu;
    m = q + (uint32_t)(r > 0x100000u || (r == 0x100000u && (q & 1u)));
  } else {
    int32_t e = (int32_t)(a >> 23) - 127;
    int32_t s = 7 - e;
    if (a < 0x00800000u || s > 31) {
      m = 0;
    } else {
      uint32_t mm = (a & 0x7fffffu) | 0x800000u;
      uint32_t q = mm >> s, r = mm & ((1u << s) - 1u), half = 1u << (s - 1);
      m = q + (uint32_t)(r > half || (r == half && (q & 1u)));
    }
  }
  return (aj_fp8)(sign | m);
}

/* A floating value stored into an integer: truncated toward zero, wrapped modulo 2^64 (fmod
 * is exact); NaN and infinities give 0. Never an out-of-range conversion. */
static inline uint64_t aj_d2u64(double x) {
  if (!(x == x) || x == INFINITY || x == -INFINITY) return 0;
  double r = trunc(fmod(x, 18446744073709551616.0));
  if (r < 0) {
    double p = -r; /* < 2^64 */
    return UINT64_C(0) - (p >= 9223372036854775808.0
                              ? (uint64_t)(p - 9223372036854775808.0) + (UINT64_C(1) << 63)
                              : (uint64_t)p);
  }
  return r >= 9223372036854775808.0
             ? (uint64_t)(r - 9223372036854775808.0) + (UINT64_C(1) << 63)
             : (uint64_t)r;
}

/* The value of a 64-bit pattern as a double: signed (int64) or unsigned. */
static inline double aj_i2d_s(uint64_t a) {
  return (a >> 63) ? -(double)(UINT64_C(0) - a) : (double)a;
}
static inline double aj_i2d_u(uint64_t a) { return (double)a; }
static inline float aj_i2f_s(uint64_t a) {
  return (a >> 63) ? -(float)(UINT64_C(0) - a) : (float)a;
}

#define AJ_SB (UINT64_C(1) << 63)
static inline uint64_t aj_lt_s(uint64_t a, uint64_t b) { return (uint64_t)((a ^ AJ_SB) < (b ^ AJ_SB)); }
static inline uint64_t aj_lt_u(uint64_t a, uint64_t b) { return (uint64_t)(a < b); }
static inline uint64_t aj_le_s(uint64_t a, uint64_t b) { return (uint64_t)((a ^ AJ_SB) <= (b ^ AJ_SB)); }
static inline uint64_t aj_le_u(uint64_t a, uint64_t b) { return (uint64_t)(a <= b); }
static inline uint64_t aj_imax_s(uint64_t a, uint64_t b) { return aj_lt_s(a, b) ? b : a; }
static inline uint64_t aj_imax_u(uint64_t a, uint64_t b) { return a < b ? b : a; }
static inline uint64_t aj_imin_s(uint64_t a, uint64_t b) { return aj_lt_s(b, a) ? b : a; }
static inline uint64_t aj_imin_u(uint64_t a, uint64_t b) { return b < a ? b : a; }
static inline uint64_t aj_igate_s(uint64_t a, uint64_t b) { return aj_lt_s(0, a) ? b : 0; }
static inline uint64_t aj_igate_u(uint64_t a, uint64_t b) { return a != 0 ? b : 0; }
static inline uint64_t aj_irelu_s(uint64_t a) { return aj_lt_s(0, a) ? a : 0; }
static inline uint64_t aj_irelu_u(uint64_t a) { return a; }
static inline uint64_t aj_ipos_s(uint64_t a) { return aj_lt_s(0, a); }
static inline uint64_t aj_ipos_u(uint64_t a) { return (uint64_t)(a != 0); }
static inline uint64_t aj_iabs_s(uint64_t a) { return (a >> 63) ? UINT64_C(0) - a : a; }
static inline uint64_t aj_iabs_u(uint64_t a) { return a; }
/* A signed and an unsigned operand (SPEC 9.1: exact values): _su has a signed first and an
 * unsigned second operand, _us the reverse. A negative signed value is below every unsigned
 * one, and -1 differs from 2^64-1. */
static inline uint64_t aj_lt_su(uint64_t a, uint64_t b) { return (uint64_t)((a >> 63) | (uint64_t)(a < b)); }
static inline uint64_t aj_lt_us(uint64_t a, uint64_t b) { return (uint64_t)(!(b >> 63) && a < b); }
static inline uint64_t aj_le_su(uint64_t a, uint64_t b) { return (uint64_t)((a >> 63) | (uint64_t)(a <= b)); }
static inline uint64_t aj_le_us(uint64_t a, uint64_t b) { return (uint64_t)(!(b >> 63) && a <= b); }
static inline uint64_t aj_imax_su(uint64_t a, uint64_t b) { return aj_lt_su(a, b) ? b : a; }
static inline uint64_t aj_imax_us(uint64_t a, uint64_t b) { return aj_lt_us(a, b) ? b : a; }
static inline uint64_t aj_imin_su(uint64_t a, uint64_t b) { return aj_lt_us(b, a) ? b : a; }
static inline uint64_t aj_imin_us(uint64_t a, uint64_t b) { return aj_lt_su(b, a) ? b : a; }
static inline uint64_t aj_eq_s(uint64_t a, uint64_t b) { return (uint64_t)(a == b); }
static inline uint64_t aj_eq_u(uint64_t a, uint64_t b) { return (uint64_t)(a == b); }
static inline uint64_t aj_eq_su(uint64_t a, uint64_t b) { return (uint64_t)(a == b && !(a >> 63)); }
static inline uint64_t aj_eq_us(uint64_t a, uint64_t b) { return (uint64_t)(a == b && !(b >> 63)); }
static inline uint64_t aj_izero(uint64_t a, uint64_t b) { (void)a; (void)b; return 0; }
static inline float aj_izero_f(float a, float b) { (void)a; (void)b; return 0.0f; }
static inline double aj_izero_d(double a, double b) { (void)a; (void)b; return 0.0; }

/* Division truncates toward zero; x / 0 = 0; the most negative value / -1 wraps to itself. */
static inline uint64_t aj_div_s(uint64_t a, uint64_t b) {
  if (b == 0) return 0;
  if (b == UINT64_MAX) return UINT64_C(0) - a;
  /* |a| and |b| as unsigned; the quotient of magnitudes, then the sign. */
  uint64_t ma = (a >> 63) ? UINT64_C(0) - a : a, mb = (b >> 63) ? UINT64_C(0) - b : b;
  uint64_t q = ma / mb;
  return ((a ^ b) >> 63) ? UINT64_C(0) - q : q;
}
static inline uint64_t aj_div_u(uint64_t a, uint64_t b) { return b == 0 ? 0 : a / b; }
/* The magnitude of a signed value (the most negative one's is 2^63). */
static inline uint64_t aj_mag(uint64_t a) { return (a >> 63) ? UINT64_C(0) - a : a; }
static inline uint64_t aj_div_su(uint64_t a, uint64_t b) {
  if (b == 0) return 0;
  uint64_t q = aj_mag(a) / b;
  return (a >> 63) ? UINT64_C(0) - q : q;
}
static inline uint64_t aj_div_us(uint64_t a, uint64_t b) {
  if (b == 0) return 0;
  uint64_t q = a / aj_mag(b);
  return (b >> 63) ? UINT64_C(0) - q : q;
}
/* C's %: the sign of the dividend; x % 0 = 0. */
static inline uint64_t aj_mod_s(uint64_t a, uint64_t b) {
  if (b == 0) return 0;
  uint64_t ma = (a >> 63) ? UINT64_C(0) - a : a, mb = (b >> 63) ? UINT64_C(0) - b : b;
  uint64_t r = ma % mb;
  return (a >> 63) ? UINT64_C(0) - r : r;
}
static inline uint64_t aj_mod_u(uint64_t a, uint64_t b) { return b == 0 ? 0 : a % b; }
static inline uint64_t aj_mod_su(uint64_t a, uint64_t b) {
  if (b == 0) return 0;
  uint64_t r = aj_mag(a) % b;
  return (a >> 63) ? UINT64_C(0) - r : r;
}
static inline uint64_t aj_mod_us(uint64_t a, uint64_t b) { return b == 0 ? 0 : a % aj_mag(b); }
/* Exact wrapped power for a non-negative exponent; a negative one truncates the real result
 * (0, except for bases 1 and -1). */
static inline uint64_t aj_pow_u(uint64_t a, uint64_t e) {
  uint64_t r = 1;
  while (e) {
    if (e & 1u) r *= a;
    a *= a;
    e >>= 1;
  }
  return r;
}
static inline uint64_t aj_pow_s(uint64_t a, uint64_t e) {
  if (e >> 63) return a == 1 ? 1 : a == UINT64_MAX ? ((e & 1u) ? UINT64_MAX : 1) : 0;
  return aj_pow_u(a, e);
}
/* A signed base and an unsigned exponent; an unsigned base (2^64-1 is not -1) and a signed
 * exponent. */
static inline uint64_t aj_pow_su(uint64_t a, uint64_t e) { return aj_pow_u(a, e); }
static inline uint64_t aj_pow_us(uint64_t a, uint64_t e) {
  if (e >> 63) return a == 1 ? 1 : 0;
  return aj_pow_u(a, e);
}
/* Shifts: the count is taken modulo the result's width w (a power of two <= 64); shr shifts
 * the operand's exact value, logically for a uint64 one, arithmetically for a signed one (in
 * the complement: no signed shift), before the result is stored by the wrapping rule. */
static inline uint64_t aj_shl(uint64_t a, uint64_t b, unsigned w) { return a << (b & (w - 1u)); }
static inline uint64_t aj_shr_u(uint64_t a, uint64_t b, unsigned w) { return a >> (b & (w - 1u)); }
static inline uint64_t aj_shr_s(uint64_t a, uint64_t b, unsigned w) {
  unsigned k = (unsigned)(b & (w - 1u));
  return (a >> 63) ? ~(~a >> k) : a >> k;
}

static inline float aj_sgate_f(float a, float b) { return (a > 0.0f && a < 1.0f) ? b : 0.0f; }
static inline double aj_sgate_d(double a, double b) { return (a > 0.0 && a < 1.0) ? b : 0.0; }
static inline float aj_sigmoid_f(float a) { return 1.0f / (1.0f + expf(-a)); }
static inline double aj_sigmoid_d(double a) { return 1.0 / (1.0 + exp(-a)); }

#if defined(__clang__) || (!defined(AJ_NO_SHUFFLEVECTOR) && __GNUC__ >= 12)
#define AJ_SHUFFLE(T, M, a, b, ...) ((T)__builtin_shufflevector((a), (b), __VA_ARGS__))
#else
typedef int32_t aj_mask_i32x2 __attribute__((vector_size(8)));
typedef int32_t aj_mask_i32x4 __attribute__((vector_size(16)));
typedef int32_t aj_mask_i32x8 __attribute__((vector_size(32)));
typedef int32_t aj_mask_i32x16 __attribute__((vector_size(64)));
typedef int64_t aj_mask_i64x1 __attribute__((vector_size(8)));
typedef int64_t aj_mask_i64x2 __attribute__((vector_size(16)));
typedef int64_t aj_mask_i64x4 __attribute__((vector_size(32)));
typedef int64_t aj_mask_i64x8 __attribute__((vector_size(64)));
#define AJ_SHUFFLE(T, M, a, b, ...) ((T)__builtin_shuffle((a), (b), (M){__VA_ARGS__}))
#endif

/* Local arrays larger than this many bytes are allocated on the heap, not the stack. */
#define AJ_MAX_STACK_BYTES 16384

/* ---- Bounds-checked mode and trace logs (generated files define AJ_CHECKED or AJ_TRACE
 * before including this header; nothing below exists otherwise). ---- */

#ifdef AJ_CHECKED
/* The record a checked routine fills when an access is out of bounds, passed by the caller as
 * the last entry of the entry point's `buffers` table (see the Rust side, backend/cc.rs: the
 * layout must match `CheckRecord`). `tensor` indexes the routine's table of tensors, kept on
 * the Rust side: no name travels through C. `indices` and `extents` hold the first
 * AJ_CHECK_MAX_AXES axes of the offending element (for a vector access: the first lane out of
 * bounds). */
#define AJ_CHECK_MAX_AXES 16
/* The status a checked routine returns after an out-of-bounds access (nothing more is read
 * or written after it). */
#define AJ_STATUS_OUT_OF_BOUNDS 3
typedef struct aj_check {
  int32_t failed; /* 0, or 1 once an access was out of bounds */
  int32_t tensor; /* index into the routine's tensor table */
  int32_t naxes;  /* the tensor's number of axes */
  int32_t lanes;  /* 1 for a scalar access, the vector's lanes otherwise */
  int64_t indices[AJ_CHECK_MAX_AXES];
  int64_t extents[AJ_CHECK_MAX_AXES];
} aj_check_t;
_Static_assert(sizeof(aj_check_t) == 272, "aj_check_t must match the Rust CheckRecord");

/* Whether index value `i` lies outside 0..n-1 (one unsigned comparison). */
#define AJ_OOB(i, n) __builtin_expect((uint64_t)(int64_t)(i) >= (uint64_t)(n), 0)

/* Records an out-of-bounds access of `lanes` consecutive elements (in memory order) of
 * tensor `tensor` starting at `idx` (extents `ext`, `naxes` axes) and returns
 * AJ_STATUS_OUT_OF_BOUNDS. When the first element is inside the tensor, the element recorded
 * is the vector's last lane, whose indices are computed in row-major order (the first axis
 * unbounded, so the overflow shows there). */
__attribute__((cold, noinline)) static int aj_out_of_bounds(aj_check_t *c, int32_t tensor,
                                                            int32_t naxes, const int64_t *idx,
                                                            const int64_t *ext, int32_t lanes) {
  int inside = 1;
  for (int32_t k = 0; k < naxes; ++k)
    if (idx[k] < 0 || idx[k] >= ext[k]) inside = 0;
  int32_t n = naxes < AJ_CHECK_MAX_AXES ? naxes : AJ_CHECK_MAX_AXES;
  c->failed = 1;
  c->tensor = tensor;
  c->naxes = naxes;
  c->lanes = lanes;
  if (inside && lanes > 1 && naxes > 0) {
    /* The flat position of the last lane, split into indices again. */
    int64_t flat = 0;
    for (int32_t k = 0; k < naxes; ++k) flat = flat * ext[k] + idx[k];
    flat += lanes - 1;
    for (int32_t k = naxes - 1; k > 0; --k) {
      if (k < n) c->indices[k] = flat % ext[k];
      flat /= ext[k];
    }
    c->indices[0] = flat;
  } else {
    for (int32_t k = 0; k < n; ++k) c->indices[k] = idx[k];
  }
  for (int32_t k = 0; k < n; ++k) c->extents[k] = ext[k];
  return AJ_STATUS_OUT_OF_BOUNDS;
}
#endif

#ifdef AJ_TRACE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>
/* A trace log being written by one call of a routine's part: lines are formatted into `buf`
 * and written with one write(2) per batch of whole lines on a descriptor opened with
 * O_APPEND, so concurrent runs (several devices) never interleave within a line. The file is
 * opened without following symlinks. Formats are always the generator's constants; names
 * (routine, tensors) are passed as `%s` arguments, never as formats. */
typedef struct aj_trace {
  int fd;
  size_t len;
  char buf[8192];
} aj_trace_t;

static void aj_trace_open(aj_trace_t *t, const char *path) {
  t->len = 0;
  t->fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
}

static void aj_trace_write(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    n -= (size_t)w;
  }
}

static void aj_trace_flush(aj_trace_t *t) {
  if (t->fd >= 0 && t->len > 0) aj_trace_write(t->fd, t->buf, t->len);
  t->len = 0;
}

/* Appends one line (the format ends with a newline). A line longer than the buffer is
 * written on its own. */
__attribute__((format(printf, 2, 3))) static void aj_trace_printf(aj_trace_t *t,
                                                                  const char *fmt, ...) {
  if (t->fd < 0) return;
  va_list ap;
  va_start(ap, fmt);
  size_t room = sizeof t->buf - t->len;
  int n = vsnprintf(t->buf + t->len, room, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n < room) {
    t->len += (size_t)n;
    return;
  }
  /* It did not fit: write what is buffered, then the line alone. */
  aj_trace_flush(t);
  char *line = malloc((size_t)n + 1);
  if (!line) return;
  va_start(ap, fmt);
  vsnprintf(line, (size_t)n + 1, fmt, ap);
  va_end(ap);
  if ((size_t)n < sizeof t->buf) {
    memcpy(t->buf, line, (size_t)n);
    t->len = (size_t)n;
  } else {
    aj_trace_write(t->fd, line, (size_t)n);
  }
  free(line);
}

static void aj_trace_close(aj_trace_t *t) {
  aj_trace_flush(t);
  if (t->fd >= 0) close(t->fd);
  t->fd = -1;
}
#endif

#endif
