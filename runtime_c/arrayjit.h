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

/* AJ_PREFETCH(p, i, w): a hint that element i of the array p is about to be read (w = 0)
   or written (w = 1); it changes no value. The optimizer's prefetches of row streams (the
   next row of a tensor that a row loop reads) may name an element past the array, so the
   address is computed in integer arithmetic (no out-of-bounds pointer is formed) and
   prefetch instructions never fault. */
#if defined(__GNUC__) || defined(__clang__)
#define AJ_PREFETCH(p, i, w)                                                                   \
  __builtin_prefetch((const void *)((uintptr_t)(p) + (uintptr_t)(int64_t)(i) * sizeof *(p)), (w), 3)
#else
#define AJ_PREFETCH(p, i, w) ((void)(p), (void)(i))
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
/* sigmoid: 1 / (1 + e^-a) as e / (1 + e) for a < 0 and 1 / (1 + e) otherwise, with
 * e = e^-|a|: e^-a never overflows, so sigmoid(-89) in float is 2.2e-39, not 0. */
static inline float aj_sigmoid_f(float a) {
  float e = expf(-fabsf(a));
  return aj_where_f((float)(a < 0.0f), e, 1.0f) / (1.0f + e);
}
static inline double aj_sigmoid_d(double a) {
  double e = exp(-fabs(a));
  return aj_where_d((double)(a < 0.0), e, 1.0) / (1.0 + e);
}

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

/* AJ_VMAX(a, b), AJ_VMIN(a, b): aj_max_f/aj_min_f (and the double ones) lane by lane on
   GCC/Clang vectors of floats or doubles (intrinsics' types included): a NaN operand is
   ignored (two NaNs give a), +0 is larger than -0, equal operands are merged bitwise. The
   comparisons give lanes of all ones or zeros of the same width; the casts reinterpret bits. */
#define AJ_VMAX(a, b)                                                                          \
  __extension__({                                                                              \
    __typeof__(a) aj_vx = (a), aj_vy = (b);                                                    \
    __typeof__(aj_vx > aj_vy) aj_ia = (__typeof__(aj_vx > aj_vy))aj_vx,                        \
                              aj_ib = (__typeof__(aj_vx > aj_vy))aj_vy,                        \
                              aj_ta = (aj_vx > aj_vy) | (aj_vy != aj_vy), aj_eq = aj_vx == aj_vy; \
    (__typeof__(aj_vx))((aj_ia & aj_ta) | (aj_ib & ~(aj_ta | aj_eq)) | (aj_ia & aj_ib & aj_eq)); \
  })
#define AJ_VMIN(a, b)                                                                          \
  __extension__({                                                                              \
    __typeof__(a) aj_vx = (a), aj_vy = (b);                                                    \
    __typeof__(aj_vx > aj_vy) aj_ia = (__typeof__(aj_vx > aj_vy))aj_vx,                        \
                              aj_ib = (__typeof__(aj_vx > aj_vy))aj_vy,                        \
                              aj_ta = (aj_vx < aj_vy) | (aj_vy != aj_vy), aj_eq = aj_vx == aj_vy; \
    (__typeof__(aj_vx))((aj_ia & aj_ta) | (aj_ib & ~(aj_ta | aj_eq)) | ((aj_ia | aj_ib) & aj_eq)); \
  })

/* AJ_VMAX_ACC(acc, x), AJ_VMIN_ACC(acc, x): AJ_VMAX(acc, x) and AJ_VMIN(acc, x) for an acc
   that holds no NaN (a reduction's accumulator: it starts at -inf or +inf and stays a number,
   since maximumNumber ignores NaN), in five operations instead of about twelve. Bitwise,
   max = (x | ~(x >= acc)) & (acc | (x > acc)): x where x > acc, x & acc where they are equal
   (+0 of -0 and +0), acc where x < acc or x is NaN; min = (x & (x <= acc)) | (acc & ~(x <
   acc)): x where x < acc, x | acc where equal (-0), acc otherwise. */
#define AJ_VMAX_ACC(acc, x)                                                                    \
  __extension__({                                                                              \
    __typeof__(acc) aj_va = (acc), aj_vb = (x);                                                \
    __typeof__(aj_vb > aj_va) aj_gt = aj_vb > aj_va, aj_ge = aj_vb >= aj_va;                   \
    (__typeof__(aj_va))((((__typeof__(aj_gt))aj_vb) | ~aj_ge) & (((__typeof__(aj_gt))aj_va) | aj_gt)); \
  })
#define AJ_VMIN_ACC(acc, x)                                                                    \
  __extension__({                                                                              \
    __typeof__(acc) aj_va = (acc), aj_vb = (x);                                                \
    __typeof__(aj_vb < aj_va) aj_lt = aj_vb < aj_va, aj_le = aj_vb <= aj_va;                   \
    (__typeof__(aj_va))((((__typeof__(aj_lt))aj_vb) & aj_le) | (((__typeof__(aj_lt))aj_va) & ~aj_lt)); \
  })
/* AJ_VMAX_ACC and AJ_VMIN_ACC of 16 floats or 8 doubles (the C writer calls these for those
 * widths). On AVX-512 they take one comparison where the bit masks take two (comparisons into
 * a mask register issue on one port only; a softmax's max over rows of 1000 floats spent 8.1
 * cycles per 32 floats in llvm-mca's Ice Lake server model, 4.0 so): vmaxps(x, acc) is x
 * where x > acc and acc otherwise (x NaN, or x == acc), exact but for zeros of both signs;
 * where x == acc, a masked AND of the two gives the +0 of +0 and -0 (and x itself
 * otherwise). vminps and the OR likewise (-0). Three instructions (vmaxps, vcmpps into a
 * mask, a masked vpandd), with GCC 12 and Clang 14 alike; a blend of x and all-ones before
 * an AND took four. The builtins are those of GCC's and Clang's own _mm512_max_ps,
 * _mm512_cmp_ps_mask and _mm512_mask_and_epi32 (each compiler spells them differently). */
#if defined(__AVX512F__)
typedef float aj_acc_f32x16 __attribute__((vector_size(64)));
typedef int32_t aj_acc_i32x16 __attribute__((vector_size(64)));
typedef double aj_acc_f64x8 __attribute__((vector_size(64)));
typedef long long aj_acc_i64x8 __attribute__((vector_size(64)));
#if defined(__clang__)
#define AJ_VMAXMIN512(op, a, b) __builtin_ia32_##op##512((a), (b), 4)
#define AJ_VBITS512(w, op, k, a, b, src) __builtin_ia32_select##w##_512((k), (a) op (b), (src))
#else
#define AJ_VMAXMIN512(op, a, b) __builtin_ia32_##op##512_mask((a), (b), (a), -1, 4)
#define AJ_VBITS512(w, op, k, a, b, src) __builtin_ia32_p##op##w##512_mask((a), (b), (src), (k))
#endif
/* AJ_VBITS512(w, and|or, k, a, b, src): lanes of k are a AND (OR) b, the others src (one
 * masked vpandd/vpord, or the q forms). Clang spells the operation as an operator and a
 * select, GCC as its masked builtin; so AJ_VBITS512 takes `&` or `|` under Clang and the
 * mnemonic's name under GCC: see AJ_VAND512 and AJ_VOR512. */
#if defined(__clang__)
#define AJ_VAND512(w, k, a, b, src) AJ_VBITS512(w, &, k, a, b, src)
#define AJ_VOR512(w, k, a, b, src) AJ_VBITS512(w, |, k, a, b, src)
#else
#define AJ_VAND512(w, k, a, b, src) AJ_VBITS512(w, and, k, a, b, src)
#define AJ_VOR512(w, k, a, b, src) AJ_VBITS512(w, or, k, a, b, src)
#endif
static inline aj_acc_f32x16 aj_vmax_acc_f32_16(aj_acc_f32x16 acc, aj_acc_f32x16 x) {
  aj_acc_i32x16 m = (aj_acc_i32x16)AJ_VMAXMIN512(maxps, x, acc);
  unsigned short eq = __builtin_ia32_cmpps512_mask(x, acc, 0, (unsigned short)-1, 4);
  return (aj_acc_f32x16)AJ_VAND512(d, eq, (aj_acc_i32x16)acc, (aj_acc_i32x16)x, m);
}
static inline aj_acc_f32x16 aj_vmin_acc_f32_16(aj_acc_f32x16 acc, aj_acc_f32x16 x) {
  aj_acc_i32x16 m = (aj_acc_i32x16)AJ_VMAXMIN512(minps, x, acc);
  unsigned short eq = __builtin_ia32_cmpps512_mask(x, acc, 0, (unsigned short)-1, 4);
  return (aj_acc_f32x16)AJ_VOR512(d, eq, (aj_acc_i32x16)acc, (aj_acc_i32x16)x, m);
}
static inline aj_acc_f64x8 aj_vmax_acc_f64_8(aj_acc_f64x8 acc, aj_acc_f64x8 x) {
  aj_acc_i64x8 m = (aj_acc_i64x8)AJ_VMAXMIN512(maxpd, x, acc);
  unsigned char eq = __builtin_ia32_cmppd512_mask(x, acc, 0, (unsigned char)-1, 4);
  return (aj_acc_f64x8)AJ_VAND512(q, eq, (aj_acc_i64x8)acc, (aj_acc_i64x8)x, m);
}
static inline aj_acc_f64x8 aj_vmin_acc_f64_8(aj_acc_f64x8 acc, aj_acc_f64x8 x) {
  aj_acc_i64x8 m = (aj_acc_i64x8)AJ_VMAXMIN512(minpd, x, acc);
  unsigned char eq = __builtin_ia32_cmppd512_mask(x, acc, 0, (unsigned char)-1, 4);
  return (aj_acc_f64x8)AJ_VOR512(q, eq, (aj_acc_i64x8)acc, (aj_acc_i64x8)x, m);
}
#else
/* Macros, not functions: GCC warns (-Wpsabi) at a function returning a 64-byte vector
 * without AVX-512. */
#define aj_vmax_acc_f32_16(acc, x) AJ_VMAX_ACC(acc, x)
#define aj_vmin_acc_f32_16(acc, x) AJ_VMIN_ACC(acc, x)
#define aj_vmax_acc_f64_8(acc, x) AJ_VMAX_ACC(acc, x)
#define aj_vmin_acc_f64_8(acc, x) AJ_VMIN_ACC(acc, x)
#endif

/* ---- Vector math: explicit-SIMD elementwise functions (GCC/Clang vector extensions). ----
 * The optimizer's vector loops (src/optimize/vectorize.rs) call these on vectors of the
 * target's width: aj_v<op>_f32_<N> on N floats (N = 4, 8, 16), aj_v<op>_f64_<N> on N doubles
 * (N = 2, 4, 8). Every function is branch-free on ordinary inputs (masks and blends, unsigned
 * integer lanes for the bit tricks, vector casts for reinterpretation: no undefined
 * behaviour), so C compilers keep whole vectors in registers.
 *
 * Single-precision functions and their largest errors, measured against double libm over
 * every 97th float (all signs, subnormals, infinities, NaN), with GCC and Clang, with and
 * without FMA (tests/vmath.rs asserts the bounds in brackets):
 *   exp     0.87 ulp [1.5]   (1.16 without FMA) polynomial for e^r on |r| <= 0.36, 2^n in
 *                            one factor when every lane's |x| < 87, in two (subnormals,
 *                            overflow) otherwise
 *   exp2    1.06 ulp [1.5]   exact at integers
 *   log     0.79 ulp [1.5]   log2 0.84 ulp [1.5]   fdlibm's decomposition, no table
 *   tanh    2.49 ulp [3]     through expm1(-2|x|)
 *   sigmoid 2.40 ulp [3]     e/(1+e) for x < 0: tiny results keep their precision
 *   sin/cos 0.57 ulp [1]     reduced and evaluated in double; |x| > 2^19, inf and NaN lanes
 *                            take the scalar libm result (sinf/cosf)
 *   rsqrt   0.50 ulp [1]     Newton steps in double, rounded once
 * Double-precision functions, against the long double libm over 2^24 bit patterns spread
 * over all doubles and 64 ulps around each threshold (tests/vmath.rs):
 *   exp     0.95 ulp [1.5]   exp2 1.05 ulp [1.5]   log 0.78 ulp [1.5]   log2 0.81 ulp [1.5]
 *   tanh    2.31 ulp [3]     sigmoid 1.83 ulp [3]  (same algorithms, longer polynomials)
 * (no double sin, cos, rsqrt: loops calling them in double stay scalar libm code).
 * Special values are libm's: NaN gives NaN, e^x overflows to +inf past 88.72 (709.78) and
 * underflows through the subnormals to +0, log(0) = -inf, log(x < 0) = NaN,
 * log(+inf) = +inf, rsqrt(+-0) = +-inf, tanh and sin keep the sign of zero. Targets without
 * vectors use libm throughout.
 *
 * The families are macros: the types and masks below for every width, the functions where a
 * file instantiates them (AJ_VMATH_F32(N), AJ_VMATH_F64(N, 2N)). AVX-sized vectors on a target
 * without AVX change no ABI here (every function is static inline), so GCC's -Wpsabi note is
 * silenced. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
/* Whether fused multiply-add is one instruction here. */
#if defined(__FMA__) || defined(__AVX512F__)
#define AJ_FAST_FMA 1
#else
#define AJ_FAST_FMA 0
#endif
#define AJ_VTYPES(N)                                                                               \
typedef float aj_vf32_##N __attribute__((vector_size(4 * N)));                                     \
typedef uint32_t aj_vu32_##N __attribute__((vector_size(4 * N)));                                  \
typedef int32_t aj_vi32_##N __attribute__((vector_size(4 * N)));                                   \
typedef double aj_vf64_##N __attribute__((vector_size(8 * N)));                                    \
typedef uint64_t aj_vu64_##N __attribute__((vector_size(8 * N)));                                  \
typedef int64_t aj_vi64_##N __attribute__((vector_size(8 * N)));                                   \
/* m ? a : b, lane by lane, for masks m whose lanes are all ones or all zeros (what vector         \
 * comparisons give). */                                                                           \
static inline aj_vf32_##N aj_vsel_f32_##N(aj_vi32_##N m, aj_vf32_##N a, aj_vf32_##N b) {           \
  aj_vu32_##N u = (aj_vu32_##N)m;                                                                  \
  return (aj_vf32_##N)((u & (aj_vu32_##N)a) | (~u & (aj_vu32_##N)b));                              \
}                                                                                                  \
static inline aj_vf64_##N aj_vsel_f64_##N(aj_vi64_##N m, aj_vf64_##N a, aj_vf64_##N b) {           \
  aj_vu64_##N u = (aj_vu64_##N)m;                                                                  \
  return (aj_vf64_##N)((u & (aj_vu64_##N)a) | (~u & (aj_vu64_##N)b));                              \
}

#define AJ_VMATH_F32(N)                                                                            \
/* Lane-wise operations of f32 vectors with the scalar meanings of this header. */                 \
static inline aj_vf32_##N aj_vmax_f32_##N(aj_vf32_##N a, aj_vf32_##N b) {                          \
  aj_vu32_##N ia = (aj_vu32_##N)a, ib = (aj_vu32_##N)b;                                            \
  aj_vu32_##N take_a = (aj_vu32_##N)((a > b) | (b != b));                                          \
  aj_vu32_##N eq = (aj_vu32_##N)(a == b);                                                          \
  return (aj_vf32_##N)((ia & take_a) | (ib & ~(take_a | eq)) | (ia & ib & eq));                    \
}                                                                                                  \
static inline aj_vf32_##N aj_vmin_f32_##N(aj_vf32_##N a, aj_vf32_##N b) {                          \
  aj_vu32_##N ia = (aj_vu32_##N)a, ib = (aj_vu32_##N)b;                                            \
  aj_vu32_##N take_a = (aj_vu32_##N)((a < b) | (b != b));                                          \
  aj_vu32_##N eq = (aj_vu32_##N)(a == b);                                                          \
  return (aj_vf32_##N)((ia & take_a) | (ib & ~(take_a | eq)) | ((ia | ib) & eq));                  \
}                                                                                                  \
static inline aj_vf32_##N aj_vrelu_f32_##N(aj_vf32_##N a) { return (aj_vf32_##N)((aj_vu32_##N)a & (aj_vu32_##N)(a > 0.0f)); } \
static inline aj_vf32_##N aj_vabs_f32_##N(aj_vf32_##N a) { return (aj_vf32_##N)((aj_vu32_##N)a & ~0x80000000u); } \
/* fma: one rounding (a single vfmadd where the target has fused multiply-add; fmaf calls otherwise). */ \
static inline aj_vf32_##N aj_vfma_f32_##N(aj_vf32_##N a, aj_vf32_##N b, aj_vf32_##N c) {           \
  return aj_vfma_lanes_f32_##N(a, b, c);                                                           \
}                                                                                                  \
/* p * 2^n for the integer n held in the low bits of z = n + 0x1.8p23f (|n| <= 254): as two        \
 * normal factors, so that a result in the subnormals or past the largest float is rounded         \
 * once, like libm's. Unsigned lanes: no signed overflow. */                                       \
static inline aj_vf32_##N aj_vscale_f32_##N(aj_vf32_##N p, aj_vf32_##N z) {                        \
  aj_vu32_##N n = (aj_vu32_##N)z - 0x4b400000u;                                                    \
  aj_vu32_##N n1 = (n >> 1) | (n & 0x80000000u); /* floor(n / 2) */                                \
  aj_vu32_##N n2 = n - n1;                                                                         \
  aj_vf32_##N s1 = (aj_vf32_##N)((n1 + 127u) << 23);                                               \
  aj_vf32_##N s2 = (aj_vf32_##N)((n2 + 127u) << 23);                                               \
  return p * s1 * s2;                                                                              \
}                                                                                                  \
/* expm1(r) for |r| <= 0.36: r + r^2/2 + r^3 q(r), q a polynomial fitted to (Chebyshev             \
 * nodes) within 1e-8. */                                                                          \
static inline aj_vf32_##N aj_vexpm1_red_f32_##N(aj_vf32_##N r) {                                   \
  aj_vf32_##N q = 0x1.555556p-3f +                                                                 \
                r * (0x1.55551p-5f + r * (0x1.1110f2p-7f + r * (0x1.6d24c8p-10f + r * 0x1.a109f6p-13f))); \
  return r + r * r * (0.5f + r * q);                                                               \
}                                                                                                  \
/* e^r for |r| <= 0.36: 1 + r (1 + r P(r)), P of degree 4 fitted (weighted least squares on        \
 * Chebyshev nodes, for the relative error of e^r) within 3.1e-9, in Horner's form: six fused      \
 * multiply-adds where the target has them. */                                                     \
static inline aj_vf32_##N aj_vexp_red_f32_##N(aj_vf32_##N r) {                                     \
  aj_vf32_##N p = 0x1.1239e0p-7f + r * 0x1.6a243ap-10f;                                            \
  p = 0x1.5558f2p-5f + r * p;                                                                      \
  p = 0x1.555492p-3f + r * p;                                                                      \
  p = 0x1.fffffcp-2f + r * p;                                                                      \
  p = 1.0f + r * p;                                                                                \
  return 1.0f + r * p;                                                                             \
}                                                                                                  \
/* e^x: x = n ln2 + r (Cody-Waite, |r| <= 0.36), e^x = 2^n e^r. When every lane                    \
 * has |x| < 87 the result is normal, so 2^n is applied exactly by adding n to the exponent         \
 * field (n << 23 is z's bits << 23: the offset 0x4b400000 shifts out); otherwise x is clamped     \
 * (keeping NaN) and 2^n applied in two factors. Both give the bits of p * 2^n. */                 \
static inline aj_vf32_##N aj_vexp_f32_##N(aj_vf32_##N x) {                                         \
  aj_vi32_##N ax = (aj_vi32_##N)((aj_vu32_##N)x & 0x7fffffffu);                                   \
  if (__builtin_expect(!aj_vany_gt_i32_##N(ax, 0x42ae0000), 1)) {                                  \
    aj_vf32_##N z = x * 0x1.715476p+0f + 0x1.8p23f;                                                \
    aj_vf32_##N n = z - 0x1.8p23f;                                                                 \
    aj_vf32_##N r = x - n * 0x1.62e4p-1f;                                                          \
    r = r - n * 0x1.7f7d1cp-20f;                                                                   \
    aj_vf32_##N p = aj_vexp_red_f32_##N(r);                                                        \
    return (aj_vf32_##N)((aj_vu32_##N)p + ((aj_vu32_##N)z << 23));                                 \
  }                                                                                                \
  x = aj_vsel_f32_##N(x > 89.0f, (aj_vf32_##N){0} + 89.0f, x);     /* overflows: keeps NaN */      \
  x = aj_vsel_f32_##N(x < -105.0f, (aj_vf32_##N){0} - 105.0f, x);  /* underflows to 0 */           \
  aj_vf32_##N z = x * 0x1.715476p+0f + 0x1.8p23f;                                                  \
  aj_vf32_##N n = z - 0x1.8p23f;                                                                   \
  aj_vf32_##N r = x - n * 0x1.62e4p-1f;                                                            \
  r = r - n * 0x1.7f7d1cp-20f;                                                                     \
  return aj_vscale_f32_##N(aj_vexp_red_f32_##N(r), z);                                             \
}                                                                                                  \
/* x / d for a scalar d, correctly rounded like the division, with a reciprocal and two            \
 * corrections (used where a vector division is slow: 16 lanes). y = RN(1/d); q0 = RN(x y);        \
 * q1 = fma(x - q0 d, y, q0) is faithful (within 2^-46 of x/d, relative); its residual             \
 * r = x - q1 d is exact, and x/d - (q1 + r y) = r (1/d - y) lies nearer x/d than any              \
 * midpoint between floats (x/d is never a midpoint, and |a - m b| >= 2^-47 for the                \
 * significands), so RN(q1 + r y) = RN(x/d). That holds for normal quotients whose                 \
 * residuals do not underflow: 2^-125 <= |d| <= 2^125, and every lane with                         \
 * max(2^-100, |d| 2^-124) <= |x| <= min(2^126, |d| 2^126); otherwise (zeros, subnormals,          \
 * infinities, NaN) the vector is divided. Without FMA, a division. */                             \
static inline aj_vf32_##N aj_vdivs_f32_##N(aj_vf32_##N x, float d) {                               \
  float ad = __builtin_fabsf(d), y = 1.0f / d; /* unconditional: hoisted out of loops */           \
  uint32_t yb, db;                                                                                 \
  memcpy(&yb, &y, sizeof yb);                                                                      \
  memcpy(&db, &d, sizeof db);                                                                      \
  if (AJ_FAST_FMA && ad >= 0x1p-125f && ad <= 0x1p125f) {                                          \
    float lo = ad * 0x1p-124f > 0x1p-100f ? ad * 0x1p-124f : 0x1p-100f;                            \
    float hi = ad * 0x1p126f < 0x1p126f ? ad * 0x1p126f : 0x1p126f;                                \
    int32_t lob, hib;                                                                              \
    memcpy(&lob, &lo, sizeof lob);                                                                 \
    memcpy(&hib, &hi, sizeof hib);                                                                 \
    aj_vi32_##N ax = (aj_vi32_##N)((aj_vu32_##N)x & 0x7fffffffu);                                  \
    if (__builtin_expect(!aj_vany_outside_i32_##N(ax, lob, hib), 1)) {                             \
      aj_vf32_##N yv = (aj_vf32_##N)((aj_vu32_##N){0} + yb);                                       \
      aj_vf32_##N dv = (aj_vf32_##N)((aj_vu32_##N){0} + db);                                       \
      aj_vf32_##N q = x * yv;                                                                      \
      q = aj_vfma_f32_##N(aj_vfma_f32_##N(-q, dv, x), yv, q);                                      \
      return aj_vfma_f32_##N(aj_vfma_f32_##N(-q, dv, x), yv, q);                                   \
    }                                                                                              \
  }                                                                                                \
  return x / (aj_vf32_##N)((aj_vu32_##N){0} + db);                                                 \
}                                                                                                  \
/* 2^x = 2^n 2^r, n = round(x), 2^r = 1 + r q(r) for |r| <= 1/2 (exact for integer x). */          \
static inline aj_vf32_##N aj_vexp2_f32_##N(aj_vf32_##N x) {                                        \
  x = aj_vsel_f32_##N(x > 129.0f, (aj_vf32_##N){0} + 129.0f, x);                                   \
  x = aj_vsel_f32_##N(x < -152.0f, (aj_vf32_##N){0} - 152.0f, x);                                  \
  aj_vf32_##N z = x + 0x1.8p23f;                                                                   \
  aj_vf32_##N r = x - (z - 0x1.8p23f);                                                             \
  aj_vf32_##N q =                                                                                  \
      0x1.62e43p-1f +                                                                              \
      r * (0x1.ebfbep-3f +                                                                         \
           r * (0x1.c6b08ep-5f +                                                                   \
                r * (0x1.3b2a1cp-7f + r * (0x1.5d879ep-10f + r * (0x1.444p-13f + r * 0x1.00a582p-16f))))); \
  return aj_vscale_f32_##N(1.0f + r * q, z);                                                       \
}                                                                                                  \
/* expm1(y) for y <= 0 (or NaN): 2^n expm1(r) + (2^n - 1), exact for n = 0. */                     \
static inline aj_vf32_##N aj_vexpm1_neg_f32_##N(aj_vf32_##N y) {                                   \
  y = aj_vsel_f32_##N(y < -30.0f, (aj_vf32_##N){0} - 30.0f, y);                                    \
  aj_vf32_##N z = y * 0x1.715476p+0f + 0x1.8p23f;                                                  \
  aj_vf32_##N n = z - 0x1.8p23f;                                                                   \
  aj_vf32_##N r = y - n * 0x1.62e4p-1f;                                                            \
  r = r - n * 0x1.7f7d1cp-20f;                                                                     \
  aj_vf32_##N s = (aj_vf32_##N)(((aj_vu32_##N)z - 0x4b400000u + 127u) << 23); /* 2^n, n in [-44, 0] */ \
  return s * aj_vexpm1_red_f32_##N(r) + (s - 1.0f);                                                \
}                                                                                                  \
/* tanh(x) = -t / (t + 2) with t = expm1(-2|x|), and the sign of x. */                             \
static inline aj_vf32_##N aj_vtanh_f32_##N(aj_vf32_##N x) {                                        \
  aj_vu32_##N sign = (aj_vu32_##N)x & 0x80000000u;                                                 \
  aj_vf32_##N ax = (aj_vf32_##N)((aj_vu32_##N)x ^ sign);                                           \
  aj_vf32_##N t = aj_vexpm1_neg_f32_##N(-2.0f * ax);                                               \
  aj_vf32_##N th = -t / (t + 2.0f);                                                                \
  return (aj_vf32_##N)(((aj_vu32_##N)th & 0x7fffffffu) | sign);                                    \
}                                                                                                  \
/* 1 / (1 + e^-x) as e / (1 + e) for x < 0 and 1 / (1 + e) otherwise, e = e^-|x|: no               \
 * overflow, and tiny results keep their precision. */                                             \
static inline aj_vf32_##N aj_vsigmoid_f32_##N(aj_vf32_##N x) {                                     \
  aj_vf32_##N e = aj_vexp_f32_##N((aj_vf32_##N)((aj_vu32_##N)x | 0x80000000u));                    \
  return aj_vsel_f32_##N(x < 0.0f, e, (aj_vf32_##N){0} + 1.0f) / (1.0f + e);                       \
}                                                                                                  \
/* x = 2^k (1 + f) with f in [sqrt(2)/2 - 1, sqrt(2) - 1) for positive finite x (subnormals        \
 * scaled by 2^23 first); s = f / (2 + f), and R(s^2) the rest of log(1 + f) = 2 atanh(s)          \
 * = f - f^2/2 + s (f^2/2 + R) (fdlibm's decomposition; R fitted within 1.2e-9). */                \
static inline aj_vf32_##N aj_vlog_red_f32_##N(aj_vf32_##N x, aj_vf32_##N *f, aj_vf32_##N *s, aj_vf32_##N *hfsq) { \
  aj_vi32_##N sub = x < 0x1p-126f;                                                                 \
  x = aj_vsel_f32_##N(sub, x * 0x1p23f, x);                                                        \
  aj_vu32_##N ix = (aj_vu32_##N)x + (0x3f800000u - 0x3f3504f3u);                                   \
  aj_vi32_##N k = (aj_vi32_##N)(ix >> 23) - 127 - (sub & 23);                                      \
  *f = (aj_vf32_##N)((ix & 0x007fffffu) + 0x3f3504f3u) - 1.0f;                                     \
  *s = *f / (2.0f + *f);                                                                           \
  aj_vf32_##N z = *s * *s;                                                                         \
  *hfsq = 0.5f * *f * *f;                                                                          \
  aj_vf32_##N R = z * (0x1.555556p-1f + z * (0x1.9999ecp-2f + z * (0x1.245ba6p-2f + z * 0x1.ddf01ap-3f))); \
  *s = *s * (*hfsq + R);                                                                           \
  return __builtin_convertvector(k, aj_vf32_##N);                                                  \
}                                                                                                  \
/* The results of log and log2 at 0, inf, negative numbers and NaN. */                             \
static inline aj_vf32_##N aj_vlog_special_f32_##N(aj_vf32_##N x, aj_vf32_##N r) {                  \
  r = aj_vsel_f32_##N(x == INFINITY, x, r);                                                        \
  r = aj_vsel_f32_##N(x == 0.0f, (aj_vf32_##N){0} - INFINITY, r);                                  \
  r = aj_vsel_f32_##N(x < 0.0f, (aj_vf32_##N){0} + NAN, r);                                        \
  return aj_vsel_f32_##N(x != x, x, r);                                                            \
}                                                                                                  \
static inline aj_vf32_##N aj_vlog_f32_##N(aj_vf32_##N x) {                                         \
  aj_vf32_##N f, sr, hfsq;                                                                         \
  aj_vf32_##N k = aj_vlog_red_f32_##N(x, &f, &sr, &hfsq);                                          \
  aj_vf32_##N r = k * 0x1.62e4p-1f - ((hfsq - (sr + k * 0x1.7f7d1cp-20f)) - f);                    \
  return aj_vlog_special_f32_##N(x, r);                                                            \
}                                                                                                  \
/* log2: log(1 + f) split into hi (12 bits) + lo, so that hi / ln2 is exact (fdlibm's). */         \
static inline aj_vf32_##N aj_vlog2_f32_##N(aj_vf32_##N x) {                                        \
  aj_vf32_##N f, sr, hfsq;                                                                         \
  aj_vf32_##N k = aj_vlog_red_f32_##N(x, &f, &sr, &hfsq);                                          \
  aj_vf32_##N hi = (aj_vf32_##N)((aj_vu32_##N)(f - hfsq) & 0xfffff000u);                           \
  aj_vf32_##N lo = (f - hi) - hfsq + sr;                                                           \
  aj_vf32_##N r = (lo + hi) * 0x1.47652cp-12f + lo * 0x1.714p+0f + hi * 0x1.714p+0f + k;           \
  return aj_vlog_special_f32_##N(x, r);                                                            \
}                                                                                                  \
/* sin and cos, computed in double: x = n pi/2 + r (pi/2 in three parts, the first two of 33       \
 * bits, so n pi/2 is exact for |n| < 2^20), |r| <= pi/4, polynomials fitted within 3e-14,         \
 * the quadrant from n. Lanes with |x| > 2^19 (and inf, NaN) take the scalar libm result. */       \
static inline aj_vf32_##N aj_vsincos_f32_##N(aj_vf32_##N x, unsigned quadrant) {                   \
  aj_vf64_##N d = __builtin_convertvector(x, aj_vf64_##N);                                         \
  aj_vf64_##N z = d * 0x1.45f306dc9c883p-1 + 0x1.8p52;                                             \
  aj_vf64_##N n = z - 0x1.8p52;                                                                    \
  aj_vf64_##N r = d - n * 0x1.921fb544p+0;                                                         \
  r = r - n * 0x1.0b4611a6p-34;                                                                    \
  r = r - n * 0x1.3198a2e037073p-69;                                                               \
  aj_vf64_##N r2 = r * r;                                                                          \
  aj_vf64_##N s =                                                                                  \
      r + r * r2 *                                                                                 \
              (-0x1.555555555516bp-3 +                                                             \
               r2 * (0x1.1111110fd3d2bp-7 +                                                        \
                     r2 * (-0x1.a019fd9b323e7p-13 + r2 * (0x1.71d9a9f152612p-19 + r2 * -0x1.aa28563e0067dp-26)))); \
  aj_vf64_##N c =                                                                                  \
      1.0 - 0.5 * r2 +                                                                             \
      r2 * r2 *                                                                                    \
          (0x1.5555555555437p-5 +                                                                  \
           r2 * (-0x1.6c16c16b614eep-10 +                                                          \
                 r2 * (0x1.a019ff53a485cp-16 + r2 * (-0x1.27e25f4a1c6f4p-22 + r2 * 0x1.1c81c295f2a13p-29)))); \
  aj_vu64_##N q = (aj_vu64_##N)z + quadrant;                                                       \
  aj_vf64_##N v = aj_vsel_f64_##N((q & 1u) != 0, c, s);                                            \
  v = (aj_vf64_##N)((aj_vu64_##N)v ^ ((q & 2u) << 62));                                            \
  aj_vf32_##N out = __builtin_convertvector(v, aj_vf32_##N);                                       \
  if (!quadrant) out = aj_vsel_f32_##N(x == 0.0f, x, out); /* sin(-0) = -0 */                      \
  aj_vi32_##N big = (aj_vi32_##N)(((aj_vu32_##N)x & 0x7fffffffu) > 0x48000000u);                   \
  if (__builtin_expect(aj_vany_i32_##N(big), 0)) {                                                 \
    for (int i = 0; i < N; i++)                                                                    \
      if (big[i]) out[i] = quadrant ? cosf(x[i]) : sinf(x[i]);                                     \
  }                                                                                                \
  return out;                                                                                      \
}                                                                                                  \
static inline aj_vf32_##N aj_vsin_f32_##N(aj_vf32_##N x) { return aj_vsincos_f32_##N(x, 0u); }     \
static inline aj_vf32_##N aj_vcos_f32_##N(aj_vf32_##N x) { return aj_vsincos_f32_##N(x, 1u); }     \
/* 1/sqrt(x): three Newton steps in double from the bit-pattern estimate (3.4% -> 3e-11),          \
 * rounded once to float. */                                                                       \
static inline aj_vf32_##N aj_vrsqrt_f32_##N(aj_vf32_##N x) {                                       \
  aj_vf64_##N d = __builtin_convertvector(x, aj_vf64_##N);                                         \
  aj_vf64_##N y = (aj_vf64_##N)(0x5fe6eb50c7b537a9u - ((aj_vu64_##N)d >> 1));                      \
  aj_vf64_##N h = 0.5 * d;                                                                         \
  y = y * (1.5 - h * y * y);                                                                       \
  y = y * (1.5 - h * y * y);                                                                       \
  y = y * (1.5 - h * y * y);                                                                       \
  aj_vf32_##N r = __builtin_convertvector(y, aj_vf32_##N);                                         \
  r = aj_vsel_f32_##N(x == INFINITY, (aj_vf32_##N){0}, r);                                         \
  r = aj_vsel_f32_##N(x == 0.0f, (aj_vf32_##N)(((aj_vu32_##N)x & 0x80000000u) | 0x7f800000u), r);  \
  r = aj_vsel_f32_##N(x < 0.0f, (aj_vf32_##N){0} + NAN, r);                                        \
  return aj_vsel_f32_##N(x != x, x, r);                                                            \
}

#define AJ_VMATH_F64(N, M2)                                                                            \
/* Lane-wise operations of f64 vectors with the scalar meanings of this header. */                 \
static inline aj_vf64_##N aj_vmax_f64_##N(aj_vf64_##N a, aj_vf64_##N b) {                          \
  aj_vu64_##N ia = (aj_vu64_##N)a, ib = (aj_vu64_##N)b;                                            \
  aj_vu64_##N take_a = (aj_vu64_##N)((a > b) | (b != b));                                          \
  aj_vu64_##N eq = (aj_vu64_##N)(a == b);                                                          \
  return (aj_vf64_##N)((ia & take_a) | (ib & ~(take_a | eq)) | (ia & ib & eq));                    \
}                                                                                                  \
static inline aj_vf64_##N aj_vmin_f64_##N(aj_vf64_##N a, aj_vf64_##N b) {                          \
  aj_vu64_##N ia = (aj_vu64_##N)a, ib = (aj_vu64_##N)b;                                            \
  aj_vu64_##N take_a = (aj_vu64_##N)((a < b) | (b != b));                                          \
  aj_vu64_##N eq = (aj_vu64_##N)(a == b);                                                          \
  return (aj_vf64_##N)((ia & take_a) | (ib & ~(take_a | eq)) | ((ia | ib) & eq));                  \
}                                                                                                  \
static inline aj_vf64_##N aj_vrelu_f64_##N(aj_vf64_##N a) { return (aj_vf64_##N)((aj_vu64_##N)a & (aj_vu64_##N)(a > 0.0)); } \
static inline aj_vf64_##N aj_vabs_f64_##N(aj_vf64_##N a) { return (aj_vf64_##N)((aj_vu64_##N)a & ~UINT64_C(0x8000000000000000)); } \
/* fma: one rounding (a single vfmadd where the target has fused multiply-add; fmaf calls otherwise). */ \
static inline aj_vf64_##N aj_vfma_f64_##N(aj_vf64_##N a, aj_vf64_##N b, aj_vf64_##N c) {           \
  return aj_vfma_lanes_f64_##N(a, b, c);                                                           \
}                                                                                                  \
/* Whether any lane of a 64-bit mask is set. */                                                    \
static inline int aj_vany_i64_##N(aj_vi64_##N m) {                                                 \
  aj_vi32_##M2 h;                                                                                  \
  memcpy(&h, &m, sizeof h);                                                                        \
  return aj_vany_i32_##M2(h);                                                                      \
}                                                                                                  \
/* p * 2^n for the integer n in the low bits of z = n + 0x1.8p52 (|n| <= 2044), in two normal      \
 * factors (one rounding into the subnormals or past the largest double). */                       \
static inline aj_vf64_##N aj_vscale_f64_##N(aj_vf64_##N p, aj_vf64_##N z) {                        \
  aj_vu64_##N n = (aj_vu64_##N)z - UINT64_C(0x4338000000000000);                                   \
  aj_vu64_##N n1 = (n >> 1) | (n & UINT64_C(0x8000000000000000)); /* floor(n / 2) */               \
  aj_vu64_##N n2 = n - n1;                                                                         \
  aj_vf64_##N s1 = (aj_vf64_##N)((n1 + 1023u) << 52);                                              \
  aj_vf64_##N s2 = (aj_vf64_##N)((n2 + 1023u) << 52);                                              \
  return p * s1 * s2;                                                                              \
}                                                                                                  \
/* expm1(r) for |r| <= 0.35: r + r^2/2 + r^3 q(r), q fitted within 9e-18. */                       \
static inline aj_vf64_##N aj_vexpm1_red_f64_##N(aj_vf64_##N r) {                                   \
  aj_vf64_##N q =                                                                                  \
      0x1.5555555555556p-3 +                                                                       \
      r * (0x1.5555555555555p-5 +                                                                  \
           r * (0x1.111111111091ap-7 +                                                             \
                r * (0x1.6c16c16c1678ap-10 +                                                       \
                     r * (0x1.a01a01a83a3a3p-13 +                                                  \
                          r * (0x1.a01a01a4be7f8p-16 +                                             \
                               r * (0x1.71de0be80e7e8p-19 +                                        \
                                    r * (0x1.27e4e0f0f6358p-22 +                                   \
                                         r * (0x1.af3cd7b3560d9p-26 + r * 0x1.1f6942ca28386p-29)))))))); \
  return r + r * r * (0.5 + r * q);                                                                \
}                                                                                                  \
/* e^x in double, as the single version: 2^n added to the exponent field when every lane has       \
 * |x| < 708 (normal results). */                                                                  \
static inline aj_vf64_##N aj_vexp_f64_##N(aj_vf64_##N x) {                                         \
  aj_vi64_##N wide = (aj_vi64_##N)((aj_vu64_##N)x & UINT64_C(0x7fffffffffffffff)) >                \
                   (int64_t)UINT64_C(0x4086200000000000);                                          \
  int fast = !aj_vany_i64_##N(wide);                                                               \
  if (!fast) {                                                                                     \
    x = aj_vsel_f64_##N(x > 710.0, (aj_vf64_##N){0} + 710.0, x);                                   \
    x = aj_vsel_f64_##N(x < -746.0, (aj_vf64_##N){0} - 746.0, x);                                  \
  }                                                                                                \
  aj_vf64_##N z = x * 0x1.71547652b82fep+0 + 0x1.8p52;                                             \
  aj_vf64_##N n = z - 0x1.8p52;                                                                    \
  aj_vf64_##N r = x - n * 0x1.62e42feep-1;                                                         \
  r = r - n * 0x1.a39ef35793c76p-33;                                                               \
  aj_vf64_##N p = 1.0 + aj_vexpm1_red_f64_##N(r);                                                  \
  if (__builtin_expect(fast, 1))                                                                   \
    return (aj_vf64_##N)((aj_vu64_##N)p + ((aj_vu64_##N)z << 52));                                 \
  return aj_vscale_f64_##N(p, z);                                                                  \
}                                                                                                  \
/* expm1(y) for y <= 0 (or NaN): 2^n expm1(r) + (2^n - 1), exact for n = 0. */                     \
static inline aj_vf64_##N aj_vexpm1_neg_f64_##N(aj_vf64_##N y) {                                   \
  y = aj_vsel_f64_##N(y < -40.0, (aj_vf64_##N){0} - 40.0, y);                                      \
  aj_vf64_##N z = y * 0x1.71547652b82fep+0 + 0x1.8p52;                                             \
  aj_vf64_##N n = z - 0x1.8p52;                                                                    \
  aj_vf64_##N r = y - n * 0x1.62e42feep-1;                                                         \
  r = r - n * 0x1.a39ef35793c76p-33;                                                               \
  aj_vf64_##N s = (aj_vf64_##N)(((aj_vu64_##N)z - UINT64_C(0x4338000000000000) + 1023u) << 52);    \
  return s * aj_vexpm1_red_f64_##N(r) + (s - 1.0);                                                 \
}                                                                                                  \
/* tanh and sigmoid in double, as the single versions. */                                          \
static inline aj_vf64_##N aj_vtanh_f64_##N(aj_vf64_##N x) {                                        \
  aj_vu64_##N sign = (aj_vu64_##N)x & UINT64_C(0x8000000000000000);                                \
  aj_vf64_##N ax = (aj_vf64_##N)((aj_vu64_##N)x ^ sign);                                           \
  aj_vf64_##N t = aj_vexpm1_neg_f64_##N(-2.0 * ax);                                                \
  aj_vf64_##N th = -t / (t + 2.0);                                                                 \
  return (aj_vf64_##N)(((aj_vu64_##N)th & UINT64_C(0x7fffffffffffffff)) | sign);                   \
}                                                                                                  \
static inline aj_vf64_##N aj_vsigmoid_f64_##N(aj_vf64_##N x) {                                     \
  aj_vf64_##N e = aj_vexp_f64_##N((aj_vf64_##N)((aj_vu64_##N)x | UINT64_C(0x8000000000000000)));   \
  return aj_vsel_f64_##N(x < 0.0, e, (aj_vf64_##N){0} + 1.0) / (1.0 + e);                          \
}                                                                                                  \
/* 2^x in double: n = round(x), 2^r = 1 + r q(r) for |r| <= 1/2 (exact at integers). */            \
static inline aj_vf64_##N aj_vexp2_f64_##N(aj_vf64_##N x) {                                        \
  x = aj_vsel_f64_##N(x > 1026.0, (aj_vf64_##N){0} + 1026.0, x);                                   \
  x = aj_vsel_f64_##N(x < -1080.0, (aj_vf64_##N){0} - 1080.0, x);                                  \
  aj_vf64_##N z = x + 0x1.8p52;                                                                    \
  aj_vf64_##N r = x - (z - 0x1.8p52);                                                              \
  aj_vf64_##N q =                                                                                  \
      0x1.62e42fefa39efp-1 +                                                                       \
      r * (0x1.ebfbdff82c58fp-3 +                                                                  \
           r * (0x1.c6b08d704a0c6p-5 +                                                             \
                r * (0x1.3b2ab6fba4e79p-7 +                                                        \
                     r * (0x1.5d87fe78a3f9cp-10 +                                                  \
                          r * (0x1.430912f86b7dbp-13 +                                             \
                               r * (0x1.ffcbfc6da6ed1p-17 +                                        \
                                    r * (0x1.62c02242b879cp-20 +                                   \
                                         r * (0x1.b524ebd13a55fp-24 +                              \
                                              r * (0x1.e4cf10dec0f59p-28 +                         \
                                                   r * (0x1.e9ec1fcb69a7fp-32 + r * 0x1.c4a29324a1038p-36)))))))))); \
  return aj_vscale_f64_##N(1.0 + r * q, z);                                                        \
}                                                                                                  \
/* log in double: x = 2^k (1 + f), f in [sqrt(2)/2 - 1, sqrt(2) - 1) (subnormals scaled by         \
 * 2^54 first), s = f / (2 + f), R(s^2) fitted within 2.2e-18 (fdlibm's decomposition). */         \
static inline aj_vf64_##N aj_vlog_red_f64_##N(aj_vf64_##N x, aj_vf64_##N *f, aj_vf64_##N *sr, aj_vf64_##N *hfsq) { \
  aj_vi64_##N sub = x < 0x1p-1022;                                                                 \
  x = aj_vsel_f64_##N(sub, x * 0x1p54, x);                                                         \
  aj_vu64_##N ix = (aj_vu64_##N)x + (UINT64_C(0x3ff0000000000000) - UINT64_C(0x3fe6a09e667f3bcd)); \
  aj_vu64_##N k = (ix >> 52) - 1023u - ((aj_vu64_##N)sub & 54u);                                   \
  *f = (aj_vf64_##N)((ix & UINT64_C(0x000fffffffffffff)) + UINT64_C(0x3fe6a09e667f3bcd)) - 1.0;    \
  aj_vf64_##N s = *f / (2.0 + *f);                                                                 \
  aj_vf64_##N z = s * s;                                                                           \
  *hfsq = 0.5 * *f * *f;                                                                           \
  aj_vf64_##N R =                                                                                  \
      z * (0x1.5555555555555p-1 +                                                                  \
           z * (0x1.9999999999a3ep-2 +                                                             \
                z * (0x1.2492492475dbcp-2 +                                                        \
                     z * (0x1.c71c720302bd8p-3 +                                                   \
                          z * (0x1.745cf85360411p-3 +                                              \
                               z * (0x1.3b1c5ae500a38p-3 + z * (0x1.0fbaab3c72fc6p-3 + z * 0x1.0c2c748b6f13cp-3))))))); \
  *sr = s * (*hfsq + R);                                                                           \
  /* k as a double, exactly (|k| < 2^51): through the bits of k + 0x1.8p52. */                     \
  return (aj_vf64_##N)(k + UINT64_C(0x4338000000000000)) - 0x1.8p52;                               \
}                                                                                                  \
static inline aj_vf64_##N aj_vlog_special_f64_##N(aj_vf64_##N x, aj_vf64_##N r) {                  \
  r = aj_vsel_f64_##N(x == INFINITY, x, r);                                                        \
  r = aj_vsel_f64_##N(x == 0.0, (aj_vf64_##N){0} - INFINITY, r);                                   \
  r = aj_vsel_f64_##N(x < 0.0, (aj_vf64_##N){0} + NAN, r);                                         \
  return aj_vsel_f64_##N(x != x, x, r);                                                            \
}                                                                                                  \
static inline aj_vf64_##N aj_vlog_f64_##N(aj_vf64_##N x) {                                         \
  aj_vf64_##N f, sr, hfsq;                                                                         \
  aj_vf64_##N k = aj_vlog_red_f64_##N(x, &f, &sr, &hfsq);                                          \
  aj_vf64_##N r = k * 0x1.62e42feep-1 - ((hfsq - (sr + k * 0x1.a39ef35793c76p-33)) - f);           \
  return aj_vlog_special_f64_##N(x, r);                                                            \
}                                                                                                  \
static inline aj_vf64_##N aj_vlog2_f64_##N(aj_vf64_##N x) {                                        \
  aj_vf64_##N f, sr, hfsq;                                                                         \
  aj_vf64_##N k = aj_vlog_red_f64_##N(x, &f, &sr, &hfsq);                                          \
  aj_vf64_##N hi = (aj_vf64_##N)((aj_vu64_##N)(f - hfsq) & UINT64_C(0xffffffff00000000));          \
  aj_vf64_##N lo = (f - hi) - hfsq + sr;                                                           \
  aj_vf64_##N r = (lo + hi) * 0x1.94ae0bf85ddf4p-22 + lo * 0x1.71547p+0 + hi * 0x1.71547p+0 + k;   \
  return aj_vlog_special_f64_##N(x, r);                                                            \
}                                                                                                  \


/* Everything below is only compiled in files that use vector functions (the C writer
 * defines AJ_VMATH before including this header) or with AJ_VMATH_ALL. */
#if defined(AJ_VMATH) || defined(AJ_VMATH_ALL)
AJ_VTYPES(2)
AJ_VTYPES(4)
AJ_VTYPES(8)
AJ_VTYPES(16)

/* Whether any lane of a mask (all ones or all zeros per lane) is set: one movmskps on x86,
 * an OR of the words elsewhere. */
static inline int aj_vany_i32_4(aj_vi32_4 m) {
#if defined(__SSE__)
  return __builtin_ia32_movmskps((aj_vf32_4)m) != 0;
#else
  uint64_t w[2];
  memcpy(w, &m, sizeof w);
  return (w[0] | w[1]) != 0;
#endif
}
static inline int aj_vany_i32_8(aj_vi32_8 m) {
#if defined(__AVX__)
  return __builtin_ia32_movmskps256((aj_vf32_8)m) != 0;
#else
  aj_vi32_4 h[2];
  memcpy(h, &m, sizeof h);
  return aj_vany_i32_4(h[0] | h[1]);
#endif
}
static inline int aj_vany_i32_16(aj_vi32_16 m) {
#if defined(__AVX512DQ__)
  /* vpmovd2m and kortest (Clang folds the comparison's mask in): GCC spent five more
     instructions on the halves, a fifth of the vector exp's fast path. */
  return __builtin_ia32_cvtd2mask512(m) != 0;
#else
  aj_vi32_8 h[2];
  memcpy(h, &m, sizeof h);
  return aj_vany_i32_8(h[0] | h[1]);
#endif
}
/* Whether any lane of a is above b (signed): a comparison and an OR of the mask's lanes, or
 * on AVX-512 one vpcmpd into a mask register and kortest (GCC otherwise moves the mask to a
 * vector and back). */
static inline int aj_vany_gt_i32_4(aj_vi32_4 a, int32_t b) {
  return aj_vany_i32_4((aj_vi32_4)(a > b));
}
static inline int aj_vany_gt_i32_8(aj_vi32_8 a, int32_t b) {
  return aj_vany_i32_8((aj_vi32_8)(a > b));
}
static inline int aj_vany_gt_i32_16(aj_vi32_16 a, int32_t b) {
#if defined(__AVX512F__)
  return __builtin_ia32_cmpd512_mask(a, (aj_vi32_16){0} + b, 6, (unsigned short)-1) != 0;
#else
  return aj_vany_i32_16((aj_vi32_16)(a > b));
#endif
}
/* Whether any lane of a lies outside [lo, hi] (signed, lo <= hi): two comparisons, or on
 * AVX-512 one unsigned comparison of a - lo with hi - lo into a mask register. */
static inline int aj_vany_outside_i32_4(aj_vi32_4 a, int32_t lo, int32_t hi) {
  return aj_vany_i32_4((aj_vi32_4)((a < lo) | (a > hi)));
}
static inline int aj_vany_outside_i32_8(aj_vi32_8 a, int32_t lo, int32_t hi) {
  return aj_vany_i32_8((aj_vi32_8)((a < lo) | (a > hi)));
}
static inline int aj_vany_outside_i32_16(aj_vi32_16 a, int32_t lo, int32_t hi) {
#if defined(__AVX512F__)
  return __builtin_ia32_ucmpd512_mask(a - lo, (aj_vi32_16){0} + (hi - lo), 6,
                                      (unsigned short)-1) != 0;
#else
  return aj_vany_i32_16((aj_vi32_16)((a < lo) | (a > hi)));
#endif
}
/* Fused multiply-add lane by lane: __builtin_fma per lane, which compilers make one vfmadd
 * where the target has FMA; on AVX-512 the 512-bit instruction itself, since GCC 12 turned
 * the 16-lane loop into 16 scalar vfmadd132ss and masked broadcasts (a layer norm's last
 * loop). */
#define AJ_VFMA_LANES(T, F, N)                                                                     \
  static inline T aj_vfma_lanes_##N(T a, T b, T c) {                                               \
    T r;                                                                                           \
    for (int i = 0; i < (int)(sizeof r / sizeof r[0]); i++) r[i] = F(a[i], b[i], c[i]);            \
    return r;                                                                                      \
  }
AJ_VFMA_LANES(aj_vf32_4, __builtin_fmaf, f32_4)
AJ_VFMA_LANES(aj_vf32_8, __builtin_fmaf, f32_8)
AJ_VFMA_LANES(aj_vf64_2, __builtin_fma, f64_2)
AJ_VFMA_LANES(aj_vf64_4, __builtin_fma, f64_4)
#if defined(__AVX512F__)
static inline aj_vf32_16 aj_vfma_lanes_f32_16(aj_vf32_16 a, aj_vf32_16 b, aj_vf32_16 c) {
  return (aj_vf32_16)__builtin_ia32_vfmaddps512_mask(a, b, c, (unsigned short)-1, 4);
}
static inline aj_vf64_8 aj_vfma_lanes_f64_8(aj_vf64_8 a, aj_vf64_8 b, aj_vf64_8 c) {
  return (aj_vf64_8)__builtin_ia32_vfmaddpd512_mask(a, b, c, (unsigned char)-1, 4);
}
#else
AJ_VFMA_LANES(aj_vf32_16, __builtin_fmaf, f32_16)
AJ_VFMA_LANES(aj_vf64_8, __builtin_fma, f64_8)
#endif
/* The function families are instantiated by the files that use them (the C writer puts
 * `AJ_VMATH_F32(8)` and the like after this header), or all of them with AJ_VMATH_ALL: each
 * family is about 200 lines that Clang would otherwise analyze in every compile. */
#ifdef AJ_VMATH_ALL
AJ_VMATH_F32(4)
AJ_VMATH_F32(8)
AJ_VMATH_F32(16)
AJ_VMATH_F64(2, 4)
AJ_VMATH_F64(4, 8)
AJ_VMATH_F64(8, 16)
#endif
#endif /* AJ_VMATH || AJ_VMATH_ALL */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

/* Local arrays larger than this many bytes are allocated on the heap, not the stack. */
#define AJ_MAX_STACK_BYTES 16384

/* ---- Parallel regions (see the Rust side, backend/team.rs: the layout of aj_team_t must
 * match `AjTeam`). ----
 *
 * A routine's parallel regions run their loop's iterations in chunks on a thread team: the
 * entry point gets the team as its last argument. A chunk function runs iterations lo..hi
 * (inclusive) on the thread numbered `tid` (0 for the calling thread, below `threads`) and
 * returns 0, or a status that stops the region. */
typedef struct aj_team aj_team_t;
typedef int (*aj_chunk_fn)(void *ctx, int64_t lo, int64_t hi, int64_t tid);
struct aj_team {
  /* How many threads may run chunks at once (1: everything runs inline). */
  int64_t threads;
  /* Runs fn over from..to in chunks of at least `grain` iterations on the team's threads
   * (the calling thread among them) and returns once every chunk has finished: 0, or the
   * first non-zero status a chunk returned (after which no new chunk starts). */
  int (*run)(const aj_team_t *team, aj_chunk_fn fn, void *ctx, int64_t from, int64_t to,
             int64_t grain);
  /* At least `bytes` bytes of memory of thread `tid` alone, 64-byte aligned, kept until its
   * next call on that thread; 0 when it cannot be had. */
  void *(*scratch)(const aj_team_t *team, int64_t tid, int64_t bytes);
  const void *state;
};
_Static_assert(sizeof(aj_team_t) == sizeof(int64_t) + 3 * sizeof(void *),
               "aj_team_t must match the Rust AjTeam");

/* The status of a routine whose thread could not get scratch memory for a region. */
#define AJ_STATUS_NO_MEMORY 4

/* Runs a parallel region: on the team when it has several threads and the loop more than
 * one grain of iterations, else inline on this thread. */
static inline int aj_parallel(const aj_team_t *team, aj_chunk_fn fn, void *ctx, int64_t from,
                              int64_t to, int64_t grain) {
  if (to < from) return 0;
  if (team == 0 || team->threads <= 1 || to - from < grain) return fn(ctx, from, to, 0);
  return team->run(team, fn, ctx, from, to, grain);
}

/* Scratch memory of thread `tid` for a chunk's large private arrays (0 without a team). */
static inline void *aj_scratch(const aj_team_t *team, int64_t tid, int64_t bytes) {
  return team == 0 ? 0 : team->scratch(team, tid, bytes);
}

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

/* A parallel region's chunk met an out-of-bounds access, recorded in its own record `own`:
 * the first chunk of the region to get here (`claim` goes from 0 to 1) reports it in the
 * routine's record. */
static inline void aj_check_publish(aj_check_t *shared, const aj_check_t *own, int32_t *claim) {
  if (__atomic_exchange_n(claim, 1, __ATOMIC_ACQ_REL) == 0) *shared = *own;
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
