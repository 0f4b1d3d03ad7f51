/* embedding_cpu.h — raw-pointer CPU kernels of the embedding lookup (gather, deterministic
 * scatter-add) and of the residual connection (elementwise add, gradient accumulation). */
#ifndef LOOM_CPU_EMBEDDING_H
#define LOOM_CPU_EMBEDDING_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// out[i, :] = table[ids[i], :]. Every id must be in 0..V-1 (the caller checks).
void loom_cpu_embedding_forward(int64_t n, int64_t c,
                                float *out,          // (n, c)
                                const int32_t *ids,  // (n)
                                const float *table); // (V, c)

// dtable[ids[i], :] += dout[i, :] for i = 0, 1, ..., n-1 in that order, so that repeated ids sum
// in a fixed order and the result is bitwise reproducible.
void loom_cpu_embedding_backward(int64_t n, int64_t c,
                                 float *dtable,      // (V, c)
                                 const int32_t *ids, // (n)
                                 const float *dout); // (n, c)

// out = a + b elementwise; out may be a or b (no restrict: exact aliasing is allowed).
void loom_cpu_residual_forward(int64_t n,
                               float *out,      // (n)
                               const float *a,  // (n)
                               const float *b); // (n)

// acc += x elementwise (residual backward: da += dout, db += dout). acc may be x itself.
void loom_cpu_accumulate(int64_t n,
                         float *acc,      // (n)
                         const float *x); // (n)

#ifdef __cplusplus
}
#endif
#endif
