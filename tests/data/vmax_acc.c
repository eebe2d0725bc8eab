/* Exactness driver for the runtime header's AJ_VMAX_ACC / AJ_VMIN_ACC (tests/vmath.rs): for
 * every accumulator value that is not NaN and every operand (NaNs of both signs and several
 * payloads, zeros of both signs, infinities, subnormals, ordinary values, and a pseudo-random
 * sample of bit patterns), with vectors of 4, 8 and 16 floats and 2, 4 and 8 doubles, each
 * lane must equal the scalar aj_max_f / aj_min_f (aj_max_d / aj_min_d) bit for bit, whatever
 * lane it is in. Prints "CHECKED MISMATCHES" and the first mismatches. */
#include "arrayjit.h"
#include <stdio.h>

typedef float f4 __attribute__((vector_size(16)));
typedef float f8 __attribute__((vector_size(32)));
typedef float f16 __attribute__((vector_size(64)));
typedef double d2 __attribute__((vector_size(16)));
typedef double d4 __attribute__((vector_size(32)));
typedef double d8 __attribute__((vector_size(64)));

static long checked, bad;

static void check_f(float acc, float x, float got, int max) {
  float want = max ? aj_max_f(acc, x) : aj_min_f(acc, x);
  uint32_t g, w;
  memcpy(&g, &got, 4);
  memcpy(&w, &want, 4);
  checked++;
  if (g != w && bad++ < 10) {
    uint32_t a, b;
    memcpy(&a, &acc, 4);
    memcpy(&b, &x, 4);
    printf("# %s_f(0x%08x, 0x%08x): 0x%08x, want 0x%08x\n", max ? "max" : "min", a, b, g, w);
  }
}

static void check_d(double acc, double x, double got, int max) {
  double want = max ? aj_max_d(acc, x) : aj_min_d(acc, x);
  uint64_t g, w;
  memcpy(&g, &got, 8);
  memcpy(&w, &want, 8);
  checked++;
  if (g != w && bad++ < 10) {
    printf("# %s_d(%a, %a): %a, want %a\n", max ? "max" : "min", acc, x, got, want);
  }
}

/* Every (acc, x) pair of the table, N at a time, each pair in every lane position. */
#define SWEEP(T, N, vals, n, check)                                                            \
  for (int max = 0; max < 2; max++)                                                            \
    for (int i = 0; i < n; i++) {                                                              \
      if (vals[i] != vals[i]) continue; /* the accumulator is never NaN */                      \
      for (int j0 = 0; j0 < n; j0 += N) {                                                      \
        for (int rot = 0; rot < N; rot++) {                                                    \
          T a, x, r;                                                                           \
          for (int l = 0; l < N; l++) {                                                        \
            a[l] = vals[i];                                                                    \
            x[l] = vals[(j0 + (l + rot) % N) % n];                                             \
          }                                                                                    \
          r = max ? AJ_VMAX_ACC(a, x) : AJ_VMIN_ACC(a, x);                                     \
          for (int l = 0; l < N; l++) check(a[l], x[l], r[l], max);                            \
        }                                                                                      \
      }                                                                                        \
    }

int main(void) {
  enum { NF = 24 + 200, ND = 22 + 200 };
  float fv[NF];
  double dv[ND];
  const uint32_t fbits[24] = {
      0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
      0x7f800001u, 0xff812345u, 0x7fffffffu, 0x00000001u, 0x80000001u, 0x007fffffu,
      0x807fffffu, 0x00800000u, 0x80800000u, 0x3f800000u, 0xbf800000u, 0x7f7fffffu,
      0xff7fffffu, 0x3f800001u, 0x3f7fffffu, 0xbf800001u, 0x40490fdbu, 0xc0490fdbu};
  for (int i = 0; i < 24; i++) memcpy(&fv[i], &fbits[i], 4);
  const uint64_t dbits[22] = {
      0x0000000000000000ull, 0x8000000000000000ull, 0x7ff0000000000000ull,
      0xfff0000000000000ull, 0x7ff8000000000000ull, 0xfff8000000000000ull,
      0x7ff0000000000001ull, 0xfff0000012345678ull, 0x0000000000000001ull,
      0x8000000000000001ull, 0x000fffffffffffffull, 0x800fffffffffffffull,
      0x0010000000000000ull, 0x3ff0000000000000ull, 0xbff0000000000000ull,
      0x7fefffffffffffffull, 0xffefffffffffffffull, 0x3ff0000000000001ull,
      0x3fefffffffffffffull, 0xbff0000000000001ull, 0x400921fb54442d18ull,
      0xc00921fb54442d18ull};
  for (int i = 0; i < 22; i++) memcpy(&dv[i], &dbits[i], 8);
  uint64_t s = 12345;
  for (int i = 0; i < 200; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t b = (uint32_t)(s >> 32);
    memcpy(&fv[24 + i], &b, 4);
    uint64_t d = s ^ (s << 17);
    memcpy(&dv[22 + i], &d, 8);
  }
  SWEEP(f4, 4, fv, NF, check_f)
  SWEEP(f8, 8, fv, NF, check_f)
  SWEEP(f16, 16, fv, NF, check_f)
  SWEEP(d2, 2, dv, ND, check_d)
  SWEEP(d4, 4, dv, ND, check_d)
  SWEEP(d8, 8, dv, ND, check_d)
  printf("%ld %ld\n", checked, bad);
  return 0;
}
