/* arrayjit runtime header: included by every generated C file.
 *
 * Generated code computes in `float` (for half and single arrays) or `double` (for byte and
 * double arrays) and converts explicitly when storing. Stores into byte arrays saturate:
 * NaN becomes 0, values are truncated toward zero and clamped to 0..255 (a plain C cast of an
 * out-of-range value would be undefined behaviour). */
#ifndef ARRAYJIT_RUNTIME_H
#define ARRAYJIT_RUNTIME_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline unsigned char aj_to_byte(double x) {
  if (!(x > 0.0)) return 0;
  if (x >= 255.0) return 255;
  return (unsigned char)x;
}

/* `c > 0 ? v : 0` without a branch or a conditional select: the comparison becomes a bit
 * mask. Relu and relu_gate use these, so that C compilers vectorize them without
 * if-conversion (which GCC 12 miscompiles in some loops, see the README). NaN or -0.0 in `c`
 * give +0.0, exactly as the conditional would. */
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

/* Local arrays larger than this many bytes are allocated on the heap, not the stack. */
#define AJ_MAX_STACK_BYTES 16384

#endif
