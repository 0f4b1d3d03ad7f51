/* embedding_cpu.c — CPU embedding gather and deterministic scatter-add (rows in id order), and
 * the residual add and gradient accumulation; plain loops the compiler vectorises. */
#include "config.h"
#include "embedding_cpu.h"
#include "simd.h"

#include <string.h>

void loom_cpu_embedding_forward(int64_t n, int64_t c, float *out, const int32_t *ids,
                                const float *table) {
  if (c <= 0) {
    return; // nothing to copy (and the tensors may have no data)
  }
  for (int64_t i = 0; i < n; i++) {
    memcpy(out + i * c, table + (int64_t)ids[i] * c, (size_t)c * sizeof(float));
  }
}

void loom_cpu_embedding_backward(int64_t n, int64_t c, float *dtable, const int32_t *ids,
                                 const float *dout) {
  if (c <= 0) {
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    float *restrict row = dtable + (int64_t)ids[i] * c;
    const float *restrict g = dout + i * c;
    for (int64_t j = 0; j < c; j++) {
      row[j] += g[j];
    }
  }
}

LOOM_CPU_CLONES
static void residual_forward_kernel(int64_t n, float *out, const float *a, const float *b) {
  for (int64_t i = 0; i < n; i++) {
    out[i] = a[i] + b[i];
  }
}

void loom_cpu_residual_forward(int64_t n, float *out, const float *a, const float *b) {
  residual_forward_kernel(n, out, a, b);
}

LOOM_CPU_CLONES
static void accumulate_kernel(int64_t n, float *acc, const float *x) {
  for (int64_t i = 0; i < n; i++) {
    acc[i] += x[i];
  }
}

void loom_cpu_accumulate(int64_t n, float *acc, const float *x) {
  accumulate_kernel(n, acc, x);
}
