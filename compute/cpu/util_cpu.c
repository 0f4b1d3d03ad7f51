/* util_cpu.c — CPU vector utilities: scale, axpy, the sum of squares in double with a fixed
 * blocked order (vectorisable, deterministic), and FNV-1a 64 over bytes. */
#include "config.h"
#include "util_cpu.h"
#include "simd.h"

LOOM_CPU_CLONES
static void scale_kernel(int64_t n, float alpha, float *restrict x) {
  for (int64_t i = 0; i < n; i++) {
    x[i] *= alpha;
  }
}

void loom_cpu_scale(int64_t n, float alpha, float *restrict x) {
  scale_kernel(n, alpha, x);
}

LOOM_CPU_CLONES
static void axpy_kernel(int64_t n, float alpha, const float *restrict x, float *restrict y) {
  for (int64_t i = 0; i < n; i++) {
    y[i] += alpha * x[i];
  }
}

void loom_cpu_axpy(int64_t n, float alpha, const float *restrict x, float *restrict y) {
  axpy_kernel(n, alpha, x, y);
}

// Eight independent partial sums (lanes) over blocks of eight, then the tail, then the lanes in
// order: the compiler can keep the lanes in vector registers, and the order never changes.
#define SUMSQ_LANES 8

LOOM_CPU_CLONES
static double sumsq_kernel(int64_t n, const float *restrict x) {
  double lane[SUMSQ_LANES] = {0};
  int64_t full = n - n % SUMSQ_LANES;
  for (int64_t i = 0; i < full; i += SUMSQ_LANES) {
    for (int k = 0; k < SUMSQ_LANES; k++) {
      double xi = (double)x[i + k];
      lane[k] += xi * xi;
    }
  }
  for (int64_t i = full; i < n; i++) {
    double xi = (double)x[i];
    lane[i - full] += xi * xi;
  }
  double sum = 0.0;
  for (int k = 0; k < SUMSQ_LANES; k++) {
    sum += lane[k];
  }
  return sum;
}

double loom_cpu_sumsq(int64_t n, const float *restrict x) {
  return sumsq_kernel(n, x);
}

uint64_t loom_cpu_fnv1a64(uint64_t hash, const void *bytes, size_t len) {
  const unsigned char *p = bytes;
  for (size_t i = 0; i < len; i++) {
    hash ^= p[i];
    hash *= LOOM_FNV1A64_PRIME;
  }
  return hash;
}
