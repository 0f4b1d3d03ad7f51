/* util_cpu.h — raw-pointer CPU kernels of the vector utilities: scale, axpy, sum of squares
 * accumulated in double, and the FNV-1a 64 checksum of a byte range. */
#ifndef LOOM_CPU_UTIL_H
#define LOOM_CPU_UTIL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// x *= alpha.
void loom_cpu_scale(int64_t n, float alpha,
                    float *x); // (n)

// y += alpha * x; x and y must not overlap.
void loom_cpu_axpy(int64_t n, float alpha,
                   const float *x, // (n)
                   float *y);      // (n)

// sum of x[i]^2, each square and the sum in double (the order is fixed: deterministic).
double loom_cpu_sumsq(int64_t n, const float *x); // (n)

#define LOOM_FNV1A64_OFFSET 0xcbf29ce484222325ull
#define LOOM_FNV1A64_PRIME  0x100000001b3ull

// FNV-1a 64 of bytes, continuing from hash (start with LOOM_FNV1A64_OFFSET).
uint64_t loom_cpu_fnv1a64(uint64_t hash, const void *bytes, size_t len);

#ifdef __cplusplus
}
#endif
#endif
