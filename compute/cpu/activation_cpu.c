/* activation_cpu.c — CPU GELU and softmax kernels in plain C: elementwise loops for GELU, three
 * passes per row for softmax (max, exp and sum, normalise) so that large logits cannot overflow. */
#include "config.h"
#include "activation_cpu.h"

#include <math.h>

// Outputs may alias inputs exactly (in-place use), so the aliased pointers are not restrict; GCC
// still vectorises the simple loops behind a runtime overlap check.

// ---------------------------------------------------------------------------------------------
// GELU.

#define GELU_K 0.7978845608028654f // sqrt(2 / pi)
#define GELU_C 0.044715f

void loom_cpu_gelu_forward(int64_t n, const float *in, float *out) {
  for (int64_t i = 0; i < n; i++) {
    float x = in[i];
    float u = GELU_K * (x + GELU_C * x * x * x);
    out[i] = 0.5f * x * (1.0f + tanhf(u));
  }
}

void loom_cpu_gelu_backward(int64_t n, const float *in, const float *dout, float *din) {
  for (int64_t i = 0; i < n; i++) {
    float x = in[i];
    float u = GELU_K * (x + GELU_C * x * x * x);
    float t = tanhf(u);
    float sech2 = 1.0f - t * t;
    // d/dx 0.5 x (1 + tanh u) = 0.5 (1 + t) + 0.5 x sech^2(u) u'(x), u' = k (1 + 3 c x^2). Once
    // tanh has saturated (sech2 == 0) the second term is 0; skipping it keeps huge |x| (x^2 = inf)
    // from giving 0 * inf = NaN.
    float d = 0.5f * (1.0f + t);
    if (sech2 != 0.0f) {
      d += 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * GELU_C * x * x);
    }
    din[i] = dout[i] * d;
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
    if (m == -INFINITY) { // every entry is -inf (or the row is empty): no mass anywhere
      for (int64_t j = 0; j < C; j++) {
        y[j] = 0.0f;
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
