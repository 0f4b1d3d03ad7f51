/* loss_cpu.c — CPU cross-entropy: numerically stable log-sum-exp per row (maximum subtracted,
 * exponentials in float without libm, the row sum in eight double partial sums) for the loss
 * and its softmax gradient. */
#include "config.h"
#include "loss_cpu.h"
#include "exp_cpu.h"
#include "simd.h"
#include "sum8.h"

#include <math.h>

int64_t loom_cpu_cross_entropy_count(int64_t n, const int32_t *targets, int32_t ignore_index) {
  int64_t valid = 0;
  for (int64_t i = 0; i < n; i++) {
    valid += targets[i] != ignore_index;
  }
  return valid;
}

// ---------------------------------------------------------------------------------------------
// One row: its maximum and sum(exp(x - max)).

LOOM_CLONE_HELPER float row_max(int64_t v, const float *restrict x) {
  float m[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  int64_t j = 0;
  for (; j + 8 <= v; j += 8) { // eight lanes: the maximum is exact in any order
    for (int l = 0; l < 8; l++) {
      m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
    }
  }
  float mx = -INFINITY;
  for (int l = 0; l < 8; l++) {
    mx = m[l] > mx ? m[l] : mx;
  }
  for (; j < v; j++) {
    mx = x[j] > mx ? x[j] : mx;
  }
  return mx;
}

// sum(exp(x - mx)) in eight double partial sums (sum8.h); with e != NULL the exponentials are
// stored there too (e may be x: each x[j] is read before e[j] is written).
LOOM_CLONE_HELPER double row_sumexp(int64_t v, const float *x, float mx, float *e) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0}, tail = 0.0;
  int64_t j = 0;
  for (; j + 8 <= v; j += 8) {
    for (int l = 0; l < 8; l++) {
      float ej = exp_nonpositive(x[j + l] - mx);
      if (e) {
        e[j + l] = ej;
      }
      s[l] += (double)ej;
    }
  }
  for (; j < v; j++) {
    float ej = exp_nonpositive(x[j] - mx);
    if (e) {
      e[j] = ej;
    }
    tail += (double)ej;
  }
  return sum8_finish(s, tail);
}

// ---------------------------------------------------------------------------------------------

LOOM_CPU_CLONES
static double cross_entropy_forward_kernel(int64_t n, int64_t v, const float *logits,
                                           const int32_t *targets, int32_t ignore_index,
                                           float *losses) {
  double total = 0.0;
  for (int64_t i = 0; i < n; i++) {
    if (targets[i] == ignore_index) {
      losses[i] = 0.0f;
      continue;
    }
    const float *x = logits + i * v;
    float mx = row_max(v, x);
    double sum = row_sumexp(v, x, mx, NULL);
    // loss = log(sum exp(x)) - x[t] = log(sum exp(x - mx)) - (x[t] - mx); sum >= 1.
    double loss = log(sum) - (double)(x[targets[i]] - mx);
    losses[i] = (float)loss;
    total += (double)losses[i];
  }
  return total;
}

double loom_cpu_cross_entropy_forward(int64_t n, int64_t v, const float *logits,
                                      const int32_t *targets, int32_t ignore_index, float *losses) {
  return cross_entropy_forward_kernel(n, v, logits, targets, ignore_index, losses);
}

LOOM_CPU_CLONES
static void cross_entropy_backward_kernel(int64_t n, int64_t v, float *dlogits, const float *logits,
                                          const int32_t *targets, int32_t ignore_index,
                                          float scale) {
  if (v <= 0) {
    return; // no classes: nothing to write (every row is then ignored)
  }
  for (int64_t i = 0; i < n; i++) {
    float *d = dlogits + i * v;
    if (targets[i] == ignore_index) {
      for (int64_t j = 0; j < v; j++) {
        d[j] = 0.0f;
      }
      continue;
    }
    const float *x = logits + i * v;
    float mx = row_max(v, x);
    double sum = row_sumexp(v, x, mx, d); // in place (d == x) is safe
    float k = (float)((double)scale / sum);
    for (int64_t j = 0; j < v; j++) {
      d[j] *= k;
    }
    d[targets[i]] -= scale;
  }
}

void loom_cpu_cross_entropy_backward(int64_t n, int64_t v, float *dlogits, const float *logits,
                                     const int32_t *targets, int32_t ignore_index, float scale) {
  cross_entropy_backward_kernel(n, v, dlogits, logits, targets, ignore_index, scale);
}
