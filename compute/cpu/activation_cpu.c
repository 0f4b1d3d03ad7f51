/* activation_cpu.c — CPU GELU and softmax kernels in plain C: elementwise loops for GELU, three
 * passes per row for softmax (max, exp and sum, normalise) so that large logits cannot overflow. */
#include "config.h"
#include "activation_cpu.h"

#include <math.h>
#include <string.h>

#include "exp_cpu.h"
#include "linear_cpu.h"
#include "simd.h"

// Outputs may alias inputs exactly (in-place use), so the aliased pointers are not restrict; GCC
// still vectorises the simple loops behind a runtime overlap check.

// ---------------------------------------------------------------------------------------------
// GELU.

#define GELU_K 0.7978845608028654f // sqrt(2 / pi)
#define GELU_C 0.044715f
// Beyond |x| = 10 gelu(x) is x or 0 and gelu'(x) is 1 or 0 to float precision: the derivative
// and the exponent use x clamped there, which also keeps x^3 and exp finite.
#define GELU_CLAMP 10.0f

// GELU is written without tanhf, which is a library call per element and does not vectorise
// (it cost ~10 ns per element, more than the GEMMs around it in a GPT block). With
// s = sigmoid(2u) = 1 / (1 + exp(-2u)): 0.5 (1 + tanh u) = s and 1 - tanh^2 u = 4 s (1 - s), so
//   gelu(x)  = x s
//   gelu'(x) = s + 2 x s (1 - s) u'(x),  u' = k (1 + 3 c x^2)
// and the only transcendental left is exp, computed below in a form the compiler vectorises.
// Neither form cancels: 1 + tanh u never appears as a difference. The kernels are mostly
// multiply-adds (the exp polynomial, u, u'): they are compiled with contraction on
// (LOOM_CONTRACT), which took the AVX-512 clone on a Zen 5 core from 0.44 to 0.31 ns per element
// forward and from 0.63 to 0.47 backward (in cache and at 16 MB alike: compute-bound).

// s = sigmoid(2 u(x)) of the clamped x (NaN passes through the clamp and stays NaN).
static inline float gelu_sigmoid(float xc) {
  float u = GELU_K * (xc + GELU_C * xc * xc * xc); // |u| <= 43.7: exp(-2u) stays finite
  return 1.0f / (1.0f + exp_bounded(-2.0f * u));
}

static inline float clamp_gelu(float x) {
  return x < -GELU_CLAMP ? -GELU_CLAMP : (x > GELU_CLAMP ? GELU_CLAMP : x);
}

LOOM_CPU_CLONES LOOM_CONTRACT static void gelu_forward_kernel(int64_t n, const float *in,
                                                              float *out) {
  for (int64_t i = 0; i < n; i++) {
    float x = in[i];
    float s = gelu_sigmoid(clamp_gelu(x));
    out[i] = x * (x < -GELU_CLAMP ? 0.0f : s); // exactly (-)0 far left, as the tanh form gives
  }
}

void loom_cpu_gelu_forward(int64_t n, const float *in, float *out) {
  gelu_forward_kernel(n, in, out);
}

// gelu'(x) from x, its clamped value and s = gelu_sigmoid(xc).
static inline float gelu_deriv(float x, float xc, float s) {
  float du = GELU_K * (1.0f + 3.0f * GELU_C * xc * xc);
  float d = s + 2.0f * xc * s * (1.0f - s) * du;
  // Saturated: exactly 0 or 1, as the tanh form gives once tanh has reached -1 or 1.
  return x < -GELU_CLAMP ? 0.0f : (x > GELU_CLAMP ? 1.0f : d);
}

LOOM_CPU_CLONES LOOM_CONTRACT static void gelu_backward_kernel(int64_t n, const float *in,
                                                               const float *dout, float *din) {
  for (int64_t i = 0; i < n; i++) {
    float x = in[i], xc = clamp_gelu(x);
    din[i] = dout[i] * gelu_deriv(x, xc, gelu_sigmoid(xc));
  }
}

void loom_cpu_gelu_backward(int64_t n, const float *in, const float *dout, float *din) {
  gelu_backward_kernel(n, in, dout, din);
}

// The forward that keeps gelu'(x) for the backward: one exp and one division per element in all,
// where gelu_forward_kernel and gelu_backward_kernel each spend one (0.48 + 0.19 ns per element on
// a Zen 5 core against 0.33 + 0.45). deriv may be in: x is read before deriv is written.
LOOM_CPU_CLONES LOOM_CONTRACT static void
gelu_forward_deriv_kernel(int64_t n, const float *in, float *restrict out, float *deriv) {
  for (int64_t i = 0; i < n; i++) {
    float x = in[i], xc = clamp_gelu(x);
    float s = gelu_sigmoid(xc);
    out[i] = x * (x < -GELU_CLAMP ? 0.0f : s);
    deriv[i] = gelu_deriv(x, xc, s);
  }
}

void loom_cpu_gelu_forward_deriv(int64_t n, const float *in, float *out, float *deriv) {
  gelu_forward_deriv_kernel(n, in, out, deriv);
}

// The fused bias gradient keeps one double per column on the stack (16 KB at most); a wider
// matrix takes the two passes, which give the same bits.
#define GELU_BIAS_MAX_COLS 2048

// din = dout * deriv and dbias += column sums of din (M, N) in double, row after row: the
// additions of loom_cpu_bias_backward in its order, so the bits are those of the two passes.
// Whole rows at a time: a version that took a 256-column tile at a time over every row read each
// row in pieces and took 1.13% of a train_gpt step under perf, against 0.49% for this one.
LOOM_CPU_CLONES
static void gelu_backward_deriv_kernel(int64_t M, int64_t N, const float *deriv, const float *dout,
                                       float *din, float *restrict dbias) {
  double acc[GELU_BIAS_MAX_COLS];
  for (int64_t j = 0; j < N; j++) {
    acc[j] = 0.0;
  }
  for (int64_t i = 0; i < M; i++) {
    const float *d = deriv + i * N, *dy = dout + i * N;
    float *dx = din + i * N;
    for (int64_t j = 0; j < N; j++) {
      float g = dy[j] * d[j];
      dx[j] = g;
      acc[j] += (double)g;
    }
  }
  for (int64_t j = 0; j < N; j++) {
    dbias[j] = (float)((double)dbias[j] + acc[j]);
  }
}

LOOM_CPU_CLONES
static void mul_kernel(int64_t n, const float *a, const float *b, float *c) {
  for (int64_t i = 0; i < n; i++) {
    c[i] = a[i] * b[i];
  }
}

void loom_cpu_gelu_backward_deriv(int64_t M, int64_t N, const float *deriv, const float *dout,
                                  float *din, float *dbias) {
  if (dbias && N <= GELU_BIAS_MAX_COLS) {
    gelu_backward_deriv_kernel(M, N, deriv, dout, din, dbias);
    return;
  }
  mul_kernel(M * N, dout, deriv, din);
  if (dbias) {
    loom_cpu_bias_backward(M, N, din, dbias);
  }
}

// ---------------------------------------------------------------------------------------------
// Softmax.

void loom_cpu_softmax_forward(int64_t N, int64_t C, const float *in, float *out) {
  for (int64_t r = 0; r < N; r++) {
    const float *x = in + r * C;
    float *y = out + r * C;
    float m = -INFINITY;
    for (int64_t j = 0; j < C; j++) {
      m = x[j] > m ? x[j] : m;
    }
    if (m == -INFINITY) { // every entry is -inf or NaN (or the row is empty): no mass anywhere,
      // zeros; but a NaN (which never wins the comparison) makes the row NaN, as it does beside
      // a finite entry, rather than vanish.
      float fill = 0.0f;
      for (int64_t j = 0; j < C; j++) {
        fill = x[j] != x[j] ? NAN : fill;
      }
      for (int64_t j = 0; j < C; j++) {
        y[j] = fill;
      }
      continue;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < C; j++) {
      float e = expf(x[j] - m); // <= 1: cannot overflow
      y[j] = e;
      sum += (double)e;
    }
    float inv = (float)(1.0 / sum); // sum >= 1: the max contributes exp(0)
    for (int64_t j = 0; j < C; j++) {
      y[j] *= inv;
    }
  }
}

void loom_cpu_softmax_backward(int64_t N, int64_t C, const float *out, const float *dout,
                               float *din) {
  for (int64_t r = 0; r < N; r++) {
    const float *y = out + r * C, *dy = dout + r * C;
    float *dx = din + r * C;
    // Eight double partial sums: a fixed order (deterministic) that the compiler can vectorise.
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t j = 0;
    for (; j + 8 <= C; j += 8) {
      for (int l = 0; l < 8; l++) {
        s[l] += (double)y[j + l] * (double)dy[j + l];
      }
    }
    double tail = 0.0;
    for (; j < C; j++) {
      tail += (double)y[j] * (double)dy[j];
    }
    float dot = (float)(((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + tail);
    for (j = 0; j < C; j++) {
      dx[j] = y[j] * (dy[j] - dot);
    }
  }
}
