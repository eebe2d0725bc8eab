/* Accuracy driver for the runtime header's single-precision vector math (tests/vmath.rs).
 * For each function and vector width it evaluates the vector function on
 *   - every STEP-th float bit pattern (both signs, subnormals, infinities, NaNs), and
 *   - the special values and every float within 64 ulps of each threshold below,
 * and compares each lane with the double-precision libm result rounded to nowhere: the error
 * is |got - exact| in ulps of the float result (2^-149 for subnormals). NaN must give NaN, an
 * infinity or a zero must match exactly (with its sign), and an exact result that rounds
 * past the largest float must give the infinity of its sign.
 * Prints one line per function and width: "NAME WIDTH MAX_ULP WORST_INPUT_BITS COUNT". */
#define AJ_VMATH_ALL 1 /* every function family */
#include "arrayjit.h"
#include <stdio.h>

#define NFUN 9
static const char *names[NFUN] = {"exp", "exp2", "log", "log2", "tanh",
                                  "sigmoid", "sin", "cos", "rsqrt"};

static double reference(int f, double x) {
  switch (f) {
  case 0: return exp(x);
  case 1: return exp2(x);
  case 2: return log(x);
  case 3: return log2(x);
  case 4: return tanh(x);
  case 5: return x < 0 ? exp(x) / (1.0 + exp(x)) : 1.0 / (1.0 + exp(-x));
  case 6: return sin(x);
  case 7: return cos(x);
  default: return 1.0 / sqrt(x);
  }
}

#define DEFINE_CALL(W)                                                                        \
  static void call_##W(int f, const float *in, float *out) {                                 \
    aj_vf32_##W v;                                                                            \
    memcpy(&v, in, sizeof v);                                                                 \
    switch (f) {                                                                              \
    case 0: v = aj_vexp_f32_##W(v); break;                                                    \
    case 1: v = aj_vexp2_f32_##W(v); break;                                                   \
    case 2: v = aj_vlog_f32_##W(v); break;                                                    \
    case 3: v = aj_vlog2_f32_##W(v); break;                                                   \
    case 4: v = aj_vtanh_f32_##W(v); break;                                                   \
    case 5: v = aj_vsigmoid_f32_##W(v); break;                                                \
    case 6: v = aj_vsin_f32_##W(v); break;                                                    \
    case 7: v = aj_vcos_f32_##W(v); break;                                                    \
    default: v = aj_vrsqrt_f32_##W(v); break;                                                 \
    }                                                                                         \
    memcpy(out, &v, sizeof v);                                                                \
  }
DEFINE_CALL(4)
DEFINE_CALL(8)
DEFINE_CALL(16)

/* The error of `got` against the exact `want`, in ulps of the float result; 1e9 for a wrong
 * special value. */
static double ulp_error(float got, double want) {
  if (want != want) return got != got ? 0.0 : 1e9;
  if (got != got) return 1e9;
  float rounded = (float)want;
  if (isinf(want) || isinf(rounded)) return (double)got == (double)rounded ? 0.0 : 1e9;
  if (want == 0.0) return got == 0.0f && !signbit(got) == !signbit(want) ? 0.0 : 1e9;
  if (isinf(got)) return 1e9;
  int e;
  frexp(fabs(want), &e);
  double ulp = ldexp(1.0, e - 24);
  if (ulp < 0x1p-149) ulp = 0x1p-149;
  return fabs((double)got - want) / ulp;
}

typedef struct {
  double worst;
  uint32_t worst_bits;
  uint64_t count;
} stat_t;

static void check(int f, int w, const float *in, stat_t *st) {
  float out[16];
  if (w == 4) call_4(f, in, out);
  else if (w == 8) call_8(f, in, out);
  else call_16(f, in, out);
  for (int i = 0; i < w; i++) {
    double e = ulp_error(out[i], reference(f, (double)in[i]));
    st->count++;
    if (e > st->worst) {
      st->worst = e;
      memcpy(&st->worst_bits, &in[i], 4);
    }
  }
}

static float from_bits(uint32_t b) {
  float x;
  memcpy(&x, &b, 4);
  return x;
}
static uint32_t to_bits(float x) {
  uint32_t b;
  memcpy(&b, &x, 4);
  return b;
}

int main(int argc, char **argv) {
  unsigned step = argc > 1 ? (unsigned)strtoul(argv[1], 0, 10) : 97u;
  unsigned widths_mask = argc > 2 ? (unsigned)strtoul(argv[2], 0, 10) : 7u;
  /* Special values and thresholds (overflow and underflow of exp/exp2, the normal-subnormal
   * boundaries, the fallback bound of sin/cos, where tanh reaches 1, ...). */
  static const float centers[] = {
      0.0f, 0x1p-149f, 0x1p-127f, 0x1p-126f, 0x1p-24f, 0x1p-12f, 0.25f, 0.5f, 0.70710677f, 1.0f,
      1.4142135f, 2.0f, 3.1415927f, 1.5707964f, 0.7853982f, 9.0f, 9.1f, 16.0f, 87.0f,
      87.33654f, 88.72283f, 89.0f, 103.97208f, 104.0f, 105.0f, 126.0f, 127.0f, 128.0f, 129.0f,
      149.0f, 150.0f, 151.0f, 152.0f, 0x1p19f, 0x1p20f, 0x1p24f, 1e30f, 0x1.fffffep127f};
  float buf[16];
  for (int f = 0; f < NFUN; f++) {
    for (int w = 4; w <= 16; w *= 2) {
      if (!(widths_mask & (unsigned)(w / 4 == 4 ? 4 : w / 4))) continue;
      stat_t st = {0, 0, 0};
      int k = 0;
      /* The dense sweep. */
      for (uint64_t b = 0; b <= 0xffffffffu; b += step) {
        buf[k++] = from_bits((uint32_t)b);
        if (k == w) { check(f, w, buf, &st); k = 0; }
      }
      /* Around every special value, both signs; then infinities and NaNs. */
      for (size_t c = 0; c < sizeof centers / sizeof centers[0]; c++) {
        for (int sign = 0; sign < 2; sign++) {
          uint32_t base = to_bits(centers[c]) | (sign ? 0x80000000u : 0u);
          for (int d = -64; d <= 64; d++) {
            uint32_t b = base + (uint32_t)d;
            if ((b & 0x7fffffffu) > 0x7f800000u || ((base ^ b) & 0x80000000u)) continue;
            buf[k++] = from_bits(b);
            if (k == w) { check(f, w, buf, &st); k = 0; }
          }
        }
      }
      static const uint32_t specials[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
                                          0x7f800001u, 0x7fffffffu, 0x00000000u, 0x80000000u};
      for (size_t s = 0; s < sizeof specials / sizeof specials[0]; s++) {
        buf[k++] = from_bits(specials[s]);
        if (k == w) { check(f, w, buf, &st); k = 0; }
      }
      while (k != 0) { /* pad the last vector with zeros */
        buf[k++] = 0.0f;
        if (k == w) { check(f, w, buf, &st); k = 0; }
      }
      printf("%s %d %.4f %08x %llu\n", names[f], w, st.worst, st.worst_bits,
             (unsigned long long)st.count);
    }
  }
  return 0;
}
