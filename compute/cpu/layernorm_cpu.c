/* layernorm_cpu.c — CPU layer normalisation: row statistics by two passes with double partial
 * sums (stable for rows with a large common offset), then simple float loops that vectorise. */
#include "config.h"
#include "layernorm_cpu.h"
#include "simd.h"
#include "sum8.h"

#include <math.h>

// din and out may alias dout or in exactly (in-place use), so those pointers are not restrict.
// The row reductions use eight double partial sums (sum8.h).

// ---------------------------------------------------------------------------------------------
// Forward.

LOOM_CPU_CLONES
static void layernorm_forward_kernel(int64_t N, int64_t C, float eps, const float *in,
                                     const float *restrict weight, const float *restrict bias,
                                     float *out, float *restrict mean, float *restrict rstd) {
  for (int64_t r = 0; r < N; r++) {
    const float *x = in + r * C;
    float *y = out + r * C;

    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0}, tail = 0.0;
    int64_t j = 0;
    for (; j + 8 <= C; j += 8) {
      for (int l = 0; l < 8; l++) {
        s[l] += (double)x[j + l];
      }
    }
    for (; j < C; j++) {
      tail += (double)x[j];
    }
    double mu = sum8_finish(s, tail) / (double)C;

    // Second pass around the mean: no cancellation between E[x^2] and E[x]^2.
    for (int l = 0; l < 8; l++) {
      s[l] = 0.0;
    }
    tail = 0.0;
    for (j = 0; j + 8 <= C; j += 8) {
      for (int l = 0; l < 8; l++) {
        double d = (double)x[j + l] - mu;
        s[l] += d * d;
      }
    }
    for (; j < C; j++) {
      double d = (double)x[j] - mu;
      tail += d * d;
    }
    double var = sum8_finish(s, tail) / (double)C;

    double rs = 1.0 / sqrt(var + (double)eps);
    // x - mu in double: a row far from zero (|mean| >> its spread) keeps its precision, which a
    // float mean (off by up to half an ulp of itself) would lose.
    for (j = 0; j < C; j++) {
      y[j] = (float)(((double)x[j] - mu) * rs) * weight[j] + bias[j];
    }
    mean[r] = (float)mu;
    rstd[r] = (float)rs;
  }
}

void loom_cpu_layernorm_forward(int64_t N, int64_t C, float eps, const float *in,
                                const float *restrict weight, const float *restrict bias,
                                float *out, float *restrict mean, float *restrict rstd) {
  layernorm_forward_kernel(N, C, eps, in, weight, bias, out, mean, rstd);
}

// ---------------------------------------------------------------------------------------------
// Backward.

LOOM_CPU_CLONES
static void layernorm_backward_kernel(int64_t N, int64_t C, const float *dout, const float *in,
                                      const float *restrict weight, const float *restrict mean,
                                      const float *restrict rstd, float *din,
                                      float *restrict dweight, float *restrict dbias) {
  for (int64_t r = 0; r < N; r++) {
    const float *x = in + r * C, *dy = dout + r * C;
    float *dx = din + r * C;
    float m = mean[r], rs = rstd[r];

    // Parameter gradients first, while dy and x are intact (din may alias either).
    for (int64_t j = 0; j < C; j++) {
      float nrm = (x[j] - m) * rs;
      dbias[j] += dy[j];
      dweight[j] += nrm * dy[j];
    }

    // sum(g) and sum(g * norm), g = dy * weight.
    double sg[8] = {0, 0, 0, 0, 0, 0, 0, 0}, sgn[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    double tg = 0.0, tgn = 0.0;
    int64_t j = 0;
    for (; j + 8 <= C; j += 8) {
      for (int l = 0; l < 8; l++) {
        float g = dy[j + l] * weight[j + l];
        float nrm = (x[j + l] - m) * rs;
        sg[l] += (double)g;
        sgn[l] += (double)g * (double)nrm;
      }
    }
    for (; j < C; j++) {
      float g = dy[j] * weight[j];
      float nrm = (x[j] - m) * rs;
      tg += (double)g;
      tgn += (double)g * (double)nrm;
    }
    float g_mean = (float)(sum8_finish(sg, tg) / (double)C);
    float gn_mean = (float)(sum8_finish(sgn, tgn) / (double)C);

    for (j = 0; j < C; j++) {
      float nrm = (x[j] - m) * rs;
      dx[j] = rs * (dy[j] * weight[j] - g_mean - nrm * gn_mean);
    }
  }
}

void loom_cpu_layernorm_backward(int64_t N, int64_t C, const float *dout, const float *in,
                                 const float *restrict weight, const float *restrict mean,
                                 const float *restrict rstd, float *din, float *restrict dweight,
                                 float *restrict dbias) {
  layernorm_backward_kernel(N, C, dout, in, weight, mean, rstd, din, dweight, dbias);
}
