/* layernorm_cpu.h — CPU kernels of layer normalisation over the last dimension, forward (saving
 * mean and rstd per row) and backward, on raw contiguous f32 pointers. */
#ifndef LOOM_LAYERNORM_CPU_H
#define LOOM_LAYERNORM_CPU_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Per row: mean = sum(x) / C, var = sum((x - mean)^2) / C (two passes, sums in double),
// rstd = 1 / sqrt(var + eps), out = (x - mean) * rstd * weight + bias with x - mean in double;
// mean and rstd are saved rounded to float. C >= 1. out may be in (the same pointer); no other
// overlap.
void loom_cpu_layernorm_forward(int64_t N, int64_t C, float eps,
                                const float *in,     // (N, C)
                                const float *weight, // (C)
                                const float *bias,   // (C)
                                float *out,          // (N, C)
                                float *mean,         // (N)
                                float *rstd);        // (N)

// With norm = (x - mean) * rstd and g = dout * weight, per row:
// din = rstd * (g - mean(g) - norm * mean(g * norm)) (overwritten), and over all rows
// dweight += sum dout * norm, dbias += sum dout (accumulated, row by row in float).
// din may be dout or in (the same pointer); no other overlap.
void loom_cpu_layernorm_backward(int64_t N, int64_t C,
                                 const float *dout,   // (N, C)
                                 const float *in,     // (N, C)
                                 const float *weight, // (C)
                                 const float *mean,   // (N)
                                 const float *rstd,   // (N)
                                 float *din,          // (N, C)
                                 float *dweight,      // (C)
                                 float *dbias);       // (C)

#ifdef __cplusplus
}
#endif
#endif
