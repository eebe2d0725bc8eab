/* Accuracy driver for the runtime header's double-precision vector math (tests/vmath.rs):
 * exp, exp2, log, log2, tanh, sigmoid on 2^24 bit patterns spread over all doubles (k * 0x10000000007), the
 * special values, and every double within 64 ulps of each threshold, with 2, 4 and 8 lanes,
 * against the long double libm (64-bit significand on x86). Errors are in ulps of the double
 * result (2^-1074 for subnormals); a wrong NaN, infinity or zero counts 1e9.
 * Prints "NAME WIDTH MAX_ULP WORST_INPUT_BITS COUNT" per function and width. */
#define AJ_VMATH_ALL 1 /* every function family */
#include "arrayjit.h"
#include <stdio.h>

#define NFUN 6
static const char *names[NFUN] = {"exp_f64", "exp2_f64", "log_f64", "log2_f64", "tanh_f64",
                                  "sigmoid_f64"};

static long double reference(int f, double x) {
  switch (f) {
  case 0: return expl((long double)x);
  case 1: return exp2l((long double)x);
  case 2: return logl((long double)x);
  case 3: return log2l((long double)x);
  case 4: return tanhl((long double)x);
  default: {
    long double e = expl(-fabsl((long double)x));
    return (x < 0 ? e : 1.0L) / (1.0L + e);
  }
  }
}

#define DEFINE_CALL(W)                                                                        \
  static void call_##W(int f, const double *in, double *out) {                               \
    aj_vf64_##W v;                                                                            \
    memcpy(&v, in, sizeof v);                                                                 \
    switch (f) {                                                                              \
    case 0: v = aj_vexp_f64_##W(v); break;                                                    \
    case 1: v = aj_vexp2_f64_##W(v); break;                                                   \
    case 2: v = aj_vlog_f64_##W(v); break;                                                    \
    case 3: v = aj_vlog2_f64_##W(v); break;                                                   \
    case 4: v = aj_vtanh_f64_##W(v); break;                                                   \
    default: v = aj_vsigmoid_f64_##W(v); break;                                               \
    }                                                                                         \
    memcpy(out, &v, sizeof v);                                                                \
  }
DEFINE_CALL(2)
DEFINE_CALL(4)
DEFINE_CALL(8)

static double ulp_error(double got, long double want) {
  if (want != want) return got != got ? 0.0 : 1e9;
  if (got != got) return 1e9;
  double rounded = (double)want;
  if (isinf(want) || isinf(rounded)) return got == rounded ? 0.0 : 1e9;
  if (want == 0.0L) return got == 0.0 && !signbit(got) == !signbit(want) ? 0.0 : 1e9;
  if (isinf(got)) return 1e9;
  int e;
  frexpl(fabsl(want), &e);
  long double ulp = ldexpl(1.0L, e - 53);
  if (ulp < 0x1p-1074L) ulp = 0x1p-1074L;
  return (double)(fabsl((long double)got - want) / ulp);
}

typedef struct {
  double worst;
  uint64_t worst_bits;
  uint64_t count;
} stat_t;

static void check(int f, int w, const double *in, stat_t *st) {
  double out[8];
  if (w == 2) call_2(f, in, out);
  else if (w == 4) call_4(f, in, out);
  else call_8(f, in, out);
  for (int i = 0; i < w; i++) {
    double e = ulp_error(out[i], reference(f, in[i]));
    st->count++;
    if (e > st->worst) {
      st->worst = e;
      memcpy(&st->worst_bits, &in[i], 8);
    }
  }
}

static double from_bits(uint64_t b) {
  double x;
  memcpy(&x, &b, 8);
  return x;
}

int main(int argc, char **argv) {
  uint64_t samples = argc > 1 ? strtoull(argv[1], 0, 10) : (1u << 24);
  static const double centers[] = {
      0.0, 0x1p-1074, 0x1p-1023, 0x1p-1022, 0x1p-53, 0x1p-26, 0.5, 0.7071067811865476, 1.0,
      1.4142135623730951, 2.0, 10.0, 700.0, 708.0, 708.3964185322641, 709.782712893384, 710.0,
      745.1332191019411, 746.0, 19.06, 36.7, 40.0, 1022.0, 1023.0, 1024.0, 1025.0, 1074.0, 1075.0, 1076.0,
      0x1.fffffffffffffp1023};
  double buf[8];
  for (int f = 0; f < NFUN; f++) {
    for (int w = 2; w <= 8; w *= 2) {
      stat_t st = {0, 0, 0};
      int k = 0;
      uint64_t n = w == 4 ? samples : samples / 8;
      for (uint64_t i = 0; i < n; i++) {
        buf[k++] = from_bits(i * UINT64_C(0x10000000007) * (w == 4 ? 1 : 8));
        if (k == w) { check(f, w, buf, &st); k = 0; }
      }
      for (size_t c = 0; c < sizeof centers / sizeof centers[0]; c++) {
        for (int sign = 0; sign < 2; sign++) {
          uint64_t base;
          memcpy(&base, &centers[c], 8);
          base |= sign ? UINT64_C(0x8000000000000000) : 0;
          for (int d = -64; d <= 64; d++) {
            uint64_t b = base + (uint64_t)(int64_t)d;
            if ((b & UINT64_C(0x7fffffffffffffff)) > UINT64_C(0x7ff0000000000000) ||
                ((base ^ b) & UINT64_C(0x8000000000000000)))
              continue;
            buf[k++] = from_bits(b);
            if (k == w) { check(f, w, buf, &st); k = 0; }
          }
        }
      }
      static const uint64_t specials[] = {
          UINT64_C(0x7ff0000000000000), UINT64_C(0xfff0000000000000), UINT64_C(0x7ff8000000000000),
          UINT64_C(0xfff8000000000000), UINT64_C(0x7ff0000000000001), 0, UINT64_C(0x8000000000000000)};
      for (size_t s = 0; s < sizeof specials / sizeof specials[0]; s++) {
        buf[k++] = from_bits(specials[s]);
        if (k == w) { check(f, w, buf, &st); k = 0; }
      }
      while (k != 0) {
        buf[k++] = 1.0;
        if (k == w) { check(f, w, buf, &st); k = 0; }
      }
      printf("%s %d %.4f %016llx %llu\n", names[f], w, st.worst,
             (unsigned long long)st.worst_bits, (unsigned long long)st.count);
    }
  }
  return 0;
}
