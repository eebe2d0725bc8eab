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

/* Local arrays larger than this many bytes are allocated on the heap, not the stack. */
#define AJ_MAX_STACK_BYTES 16384

#endif
