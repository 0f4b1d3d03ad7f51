/* activation_cpu.h — CPU kernels of GELU (tanh approximation) and row softmax, forward and
 * backward, on raw contiguous f32 pointers; reusable by the MoE expert FFN and attention. */
#ifndef LOOM_ACTIVATION_CPU_H
#define LOOM_ACTIVATION_CPU_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// out[i] = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), x = in[i]. out may be in (the
// same pointer); no other overlap.
void loom_cpu_gelu_forward(int64_t n,
                           const float *in, // (n)
                           float *out);     // (n)

// din[i] = dout[i] * gelu'(in[i]), the exact derivative of the tanh approximation. din may be in
// or dout (the same pointer); no other overlap.
void loom_cpu_gelu_backward(int64_t n,
                            const float *in,   // (n)
                            const float *dout, // (n)
                            float *din);       // (n)

// out[i] = gelu(in[i]) and deriv[i] = gelu'(in[i]), the bits of loom_cpu_gelu_forward and of the
// derivative loom_cpu_gelu_backward uses. deriv may be in (the same pointer); out overlaps neither.
void loom_cpu_gelu_forward_deriv(int64_t n,
                                 const float *in, // (n)
                                 float *out,      // (n)
                                 float *deriv);   // (n)

// din = dout * deriv (a saved gelu'), and with dbias (not NULL) dbias += the column sums of din as
// loom_cpu_bias_backward adds them (same bits). din may be deriv or dout; dbias overlaps nothing.
void loom_cpu_gelu_backward_deriv(int64_t M, int64_t N,
                                  const float *deriv, // (M, N)
                                  const float *dout,  // (M, N)
                                  float *din,         // (M, N)
                                  float *dbias);      // (N) or NULL

// Softmax of each row over the last dimension, max subtracted first. A row whose entries are all
// -inf (nothing to attend to) gives zeros. out may be in; no other overlap.
void loom_cpu_softmax_forward(int64_t N, int64_t C,
                              const float *in, // (N, C)
                              float *out);     // (N, C)

// din = out * (dout - sum(dout * out)) per row, the sum in double. din may be out or dout; no
// other overlap.
void loom_cpu_softmax_backward(int64_t N, int64_t C,
                               const float *out,  // (N, C)
                               const float *dout, // (N, C)
                               float *din);       // (N, C)

#ifdef __cplusplus
}
#endif
#endif
