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
// Backward. The saved mean is a float: for a row far from zero (rows of 1e4 + 1e-2 noise) it is
// off from the forward's double mean by up to half an ulp of the offset (5e-4 there, 5% of the
// spread), which (x - mean) * rstd would carry into every gradient. x - m is exact in float for
// x near m (Sterbenz), so sum(x - m) / C in double recovers the forward's mean as m + delta, and
// xhat = ((x - m) - delta) * rstd with delta rounded once to float: accurate to a few float ulps
// of xhat whatever the offset. sum(g * xhat) follows from sum(g * (x - m)) and sum(g) (products
// of two floats, exact in double), so one pass of sums and one elementwise pass remain.

LOOM_CPU_CLONES
static void layernorm_backward_kernel(int64_t N, int64_t C, const float *dout, const float *in,
                                      const float *restrict weight, const float *restrict mean,
                                      const float *restrict rstd, float *din,
                                      float *restrict dweight, float *restrict dbias) {
  for (int64_t r = 0; r < N; r++) {
    const float *x = in + r * C, *dy = dout + r * C;
    float *dx = din + r * C;
    const float m = mean[r], rs = rstd[r];

    // sum(x - m), sum(g) and sum(g * (x - m)), g = dy * weight.
    double sx[8] = {0, 0, 0, 0, 0, 0, 0, 0}, sg[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    double sgx[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    double tx = 0.0, tg = 0.0, tgx = 0.0;
    int64_t j = 0;
    for (; j + 8 <= C; j += 8) {
      for (int l = 0; l < 8; l++) {
        float g = dy[j + l] * weight[j + l];
        float xm = x[j + l] - m;
        sx[l] += (double)xm;
        sg[l] += (double)g;
        sgx[l] += (double)g * (double)xm;
      }
    }
    for (; j < C; j++) {
      float g = dy[j] * weight[j];
      float xm = x[j] - m;
      tx += (double)xm;
      tg += (double)g;
      tgx += (double)g * (double)xm;
    }
    const double delta = sum8_finish(sx, tx) / (double)C; // forward mean - m
    const double gm = sum8_finish(sg, tg) / (double)C;
    const float g_mean = (float)gm;
    // mean(g * xhat) = rstd * (mean(g * (x - m)) - delta * mean(g))
    const float gn_mean = (float)((double)rs * (sum8_finish(sgx, tgx) / (double)C - delta * gm));
    const float d = (float)delta;

    // Parameter gradients and din in one pass: each element's dy and x are read before its din is
    // written (din may alias either exactly).
    for (j = 0; j < C; j++) {
      float nrm = ((x[j] - m) - d) * rs;
      float dyj = dy[j];
      dbias[j] += dyj;
      dweight[j] += nrm * dyj;
      dx[j] = rs * (dyj * weight[j] - g_mean - nrm * gn_mean);
    }
  }
}

void loom_cpu_layernorm_backward(int64_t N, int64_t C, const float *dout, const float *in,
                                 const float *restrict weight, const float *restrict mean,
                                 const float *restrict rstd, float *din, float *restrict dweight,
                                 float *restrict dbias) {
  layernorm_backward_kernel(N, C, dout, in, weight, mean, rstd, din, dweight, dbias);
}
