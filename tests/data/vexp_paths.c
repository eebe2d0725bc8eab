/* aj_vexp_f32_16 over every 61st float bit pattern and every 7th float with 80 <= |x| <= 110
 * (the overflow, subnormal and underflow thresholds): prints the number of inputs and a
 * 64-bit FNV-1a hash of the results' bits. tests/vmath.rs compiles it with the configured
 * flags and again without AVX-512, and compares the two lines: the AVX-512 path (vscalefps)
 * must give the bits of the portable paths. */
#include <stdio.h>
#define AJ_VMATH 1
#include "arrayjit.h"
AJ_VMATH_F32(16)

static uint64_t hash = 0xcbf29ce484222325ull, count = 0;

static void eval(const uint32_t *bits) {
  aj_vf32_16 x, y;
  memcpy(&x, bits, sizeof x);
  y = aj_vexp_f32_16(x);
  uint32_t out[16];
  memcpy(out, &y, sizeof out);
  for (int k = 0; k < 16; k++) {
    /* NaN results count by class only: a NaN's payload is not part of the semantics. */
    uint32_t b = (out[k] & 0x7fffffffu) > 0x7f800000u ? 0x7fc00000u : out[k];
    for (int s = 0; s < 32; s += 8) {
      hash ^= (b >> s) & 0xffu;
      hash *= 0x100000001b3ull;
    }
  }
  count += 16;
}

int main(void) {
  uint32_t buf[16];
  int n = 0;
  for (uint64_t b = 0; b <= 0xffffffffull; b += 61) {
    buf[n++] = (uint32_t)b;
    if (n == 16) { eval(buf); n = 0; }
  }
  for (float lo = 80.0f; lo <= 110.0f; lo = __builtin_nextafterf(lo, 200.0f)) {
    static int step = 0;
    if (step++ % 7 != 0) continue;
    uint32_t pos;
    memcpy(&pos, &lo, 4);
    buf[n++] = pos;
    buf[n++] = pos | 0x80000000u;
    if (n == 16) { eval(buf); n = 0; }
  }
  printf("%llu %016llx\n", (unsigned long long)count, (unsigned long long)hash);
  return 0;
}
