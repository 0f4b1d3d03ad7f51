/* codecs_cuda.cu — the payload codecs (none, fp16, bf16, int8, top-k, random-k, efsign) on device
 * memory, writing and reading the same bytes as compress_codecs.c, so either side can decode. */
#include "config.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>

// loom_core.h includes mpi.h; its C++ bindings would need libmpi_cxx, so leave them out.
#define OMPI_SKIP_MPICXX  1
#define MPICH_SKIP_MPICXX 1
#include "loom_compress.h"
#include "loom_core.h"
#include "compress_internal.h"
#include "codecs_cuda.h"
#include "cuda/cuda_ctx.h"
#include "error.h"

namespace {

const unsigned kThreads = 256; // threads per block (a power of two: the block reductions)

// ---------------------------------------------------------------------------------------------
// Payload access. A payload may start at any address (the collectives put it after a length
// prefix), so every multi-byte value goes through these: typed when the payload is 4-byte
// aligned (then so is every field: the header is 16 bytes, the scale 4, index and value arrays
// 4 per entry), byte by byte, little-endian as the host, when it is not.

template <bool kAligned> __device__ inline void store_u32(uint8_t *p, uint32_t v) {
  if (kAligned) {
    *reinterpret_cast<uint32_t *>(p) = v;
  } else {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
  }
}

template <bool kAligned> __device__ inline uint32_t load_u32(const uint8_t *p) {
  if (kAligned) {
    return *reinterpret_cast<const uint32_t *>(p);
  }
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

template <bool kAligned> __device__ inline void store_u16(uint8_t *p, uint32_t v) {
  if (kAligned) {
    *reinterpret_cast<uint16_t *>(p) = (uint16_t)v;
  } else {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
  }
}

template <bool kAligned> __device__ inline uint32_t load_u16(const uint8_t *p) {
  if (kAligned) {
    return *reinterpret_cast<const uint16_t *>(p);
  }
  return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}

__device__ inline uint32_t bits_of(float x) {
  return __float_as_uint(x);
}
__device__ inline float float_of(uint32_t u) {
  return __uint_as_float(u);
}

// loom_mix64 (compress_codecs.c), for the device.
__device__ inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The CPU's round_even: (v + 1.5 * 2^23) - 1.5 * 2^23 in float, never contracted.
__device__ inline float round_even(float v) {
  return __fsub_rn(__fadd_rn(v, 12582912.0f), 12582912.0f);
}

// Grid-stride loops: for (int64_t i = first_index(); i < n; i += grid_stride()).
__device__ inline int64_t first_index() {
  return (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ inline int64_t grid_stride() {
  return (int64_t)blockDim.x * gridDim.x;
}

// ---------------------------------------------------------------------------------------------
// Header (and the scale that follows it): up to 20 bytes passed by value, stored by one thread.

struct head_bytes_t {
  uint8_t b[20];
  int count;
};

__global__ void put_bytes_kernel(uint8_t *p, head_bytes_t h) {
  for (int i = 0; i < h.count; i++) {
    p[i] = h.b[i]; // p: (count) bytes
  }
}

// ---------------------------------------------------------------------------------------------
// fp16 and bf16: the CPU's branch-free conversions (to_f16, add_f16, to_bf16, add_bf16), with
// the float operations spelled as never-contracted intrinsics.

template <bool kAligned> __global__ void to_f16_kernel(const float *x, uint8_t *body, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    uint32_t u = bits_of(x[i]), sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
    uint32_t nan = 0x7E00u | ((a >> 13) & 0x03FFu);
    uint32_t normal = (a - (112u << 23) + 0x0FFFu + ((a >> 13) & 1u)) >> 13;
    normal = normal > 0x7C00u ? 0x7C00u : normal;
    uint32_t sub = bits_of(__fadd_rn(float_of(a), 0.5f)) - bits_of(0.5f);
    uint32_t r = a > 0x7F800000u ? nan : (a >= 0x38800000u ? normal : sub);
    store_u16<kAligned>(body + 2 * i, sign | r); // body: (n) u16
  }
}

template <bool kAligned>
__global__ void add_f16_kernel(const uint8_t *body, float *acc, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    uint32_t v = load_u16<kAligned>(body + 2 * i), sign = (v & 0x8000u) << 16,
             em = (v & 0x7FFFu) << 13;
    float finite = __fmul_rn(float_of(em), 0x1p112f);
    uint32_t special = 0x7F800000u | em | ((em & 0x007FFFFFu) ? 0x00400000u : 0u);
    uint32_t r = (v & 0x7C00u) == 0x7C00u ? special : bits_of(finite);
    acc[i] = __fadd_rn(acc[i], float_of(sign | r)); // acc: (n)
  }
}

template <bool kAligned> __global__ void to_bf16_kernel(const float *x, uint8_t *body, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    uint32_t u = bits_of(x[i]);
    uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x0040u;
    store_u16<kAligned>(body + 2 * i, (u & 0x7FFFFFFFu) > 0x7F800000u ? quiet : rounded);
  }
}

template <bool kAligned>
__global__ void add_bf16_kernel(const uint8_t *body, float *acc, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    uint32_t u = load_u16<kAligned>(body + 2 * i) << 16;
    u |= (u & 0x7FFFFFFFu) > 0x7F800000u ? 0x00400000u : 0u;
    acc[i] = __fadd_rn(acc[i], float_of(u));
  }
}

// none: acc += the raw f32 values.
template <bool kAligned>
__global__ void add_f32_kernel(const uint8_t *body, float *acc, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    acc[i] = __fadd_rn(acc[i], float_of(load_u32<kAligned>(body + 4 * i)));
  }
}

// A payload flagged non-finite decodes to NaN everywhere: acc += NaN.
__global__ void add_nan_kernel(float *acc, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    acc[i] = __fadd_rn(acc[i], float_of(0x7FC00000u));
  }
}

// ---------------------------------------------------------------------------------------------
// Statistics of x: the largest magnitude's bits (the CPU's max_abs_bits: an unsigned max over
// the bits with the sign cleared, >= 0x7F800000 for NaN or Inf; exact in any order) and, for
// efsign, the sum of |x| in double over a fixed tree (each thread's grid-stride run in order,
// then a shared-memory tree per block, then the blocks in order by one block).

struct stats_t {
  uint32_t max_bits;
  double sum;
};

__device__ void block_reduce(uint32_t *m, double *s) {
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      m[threadIdx.x] =
          m[threadIdx.x] > m[threadIdx.x + half] ? m[threadIdx.x] : m[threadIdx.x + half];
      s[threadIdx.x] += s[threadIdx.x + half];
    }
    __syncthreads();
  }
}

__global__ void stats_kernel(const float *x, int64_t n, int with_sum, uint32_t *part_max,
                             double *part_sum) {
  __shared__ uint32_t m[kThreads];
  __shared__ double s[kThreads];
  uint32_t mine = 0;
  double sum = 0.0;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    uint32_t a = bits_of(x[i]) & 0x7FFFFFFFu; // x: (n)
    mine = a > mine ? a : mine;
    if (with_sum) {
      sum += fabs((double)x[i]);
    }
  }
  m[threadIdx.x] = mine;
  s[threadIdx.x] = sum;
  __syncthreads();
  block_reduce(m, s);
  if (threadIdx.x == 0) {
    part_max[blockIdx.x] = m[0]; // part_max, part_sum: (gridDim.x)
    part_sum[blockIdx.x] = s[0];
  }
}

__global__ void stats_finish_kernel(const uint32_t *part_max, const double *part_sum, int parts,
                                    stats_t *out) {
  __shared__ uint32_t m[kThreads];
  __shared__ double s[kThreads];
  uint32_t mine = 0;
  double sum = 0.0;
  for (int b = (int)threadIdx.x; b < parts; b += (int)blockDim.x) {
    mine = part_max[b] > mine ? part_max[b] : mine;
    sum += part_sum[b];
  }
  m[threadIdx.x] = mine;
  s[threadIdx.x] = sum;
  __syncthreads();
  block_reduce(m, s);
  if (threadIdx.x == 0) {
    out->max_bits = m[0];
    out->sum = s[0];
  }
}

// The CPU's sum_abs in its own order, bit for bit: eight lanes (lane l sums x[8 j + l] in order
// of j), combined as ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)), then the tail. Slow (one
// thread per lane); efsign runs it only when the fast path cannot prove the scale (see
// efsign_scale). Launch with one block of 8 threads.
__global__ void sum_abs_exact_kernel(const float *x, int64_t n, double *out) {
  __shared__ double part[8];
  const int64_t l = threadIdx.x, n8 = n - n % 8;
  double p = 0.0;
  for (int64_t i = 0; i < n8; i += 8) {
    p += fabs((double)x[i + l]); // x: (n)
  }
  part[l] = p;
  __syncthreads();
  if (l == 0) {
    double tail = 0.0;
    for (int64_t i = n8; i < n; i++) {
      tail += fabs((double)x[i]);
    }
    *out = ((part[0] + part[1]) + (part[2] + part[3])) +
           ((part[4] + part[5]) + (part[6] + part[7])) + tail;
  }
}

// ---------------------------------------------------------------------------------------------
// int8: one f32 scale (written with the header) and one signed byte a value, as encode_int8.

__global__ void quantise_kernel(const float *x, int8_t *q, int64_t n, float inv, float scale,
                                int divide, int stochastic, uint64_t seed) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    float r;
    if (!stochastic && !divide) { // the CPU's quantise()
      r = round_even(__fmul_rn(x[i], inv));
    } else {
      float v = scale > 0.0f ? (divide ? __fdiv_rn(x[i], scale) : __fmul_rn(x[i], inv)) : 0.0f;
      if (stochastic) { // floor(v + u), u uniform in [0, 1) from the seed and the index
        float u = __fmul_rn((float)(mix64(seed ^ (uint64_t)i) >> 40), 0x1p-24f);
        r = floorf(__fadd_rn(v, u));
      } else {
        r = round_even(v);
      }
    }
    r = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
    q[i] = (int8_t)r; // q: (n)
  }
}

__global__ void find_int8_min_kernel(const int8_t *q, int64_t n, uint32_t *bad) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    if (q[i] == -128) { // q: (n)
      *bad = 1;
    }
  }
}

__global__ void add_int8_kernel(const int8_t *q, float *acc, int64_t n, float scale) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    acc[i] = __fadd_rn(acc[i], __fmul_rn((float)q[i], scale));
  }
}

// ---------------------------------------------------------------------------------------------
// top-k and random-k: u32 indices, then f32 values (top-k); values only (random-k).

// key[i] = |x[i]|'s bits (finite: ordered as the magnitudes, +0 and -0 equal), val[i] = i.
__global__ void magnitude_keys_kernel(const float *x, int64_t n, uint32_t *key, uint32_t *val) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    key[i] = bits_of(x[i]) & 0x7FFFFFFFu; // x, key, val: (n)
    val[i] = (uint32_t)i;
  }
}

// The top-k body: indices idx[0..k) (ascending) and the values of x there.
template <bool kAligned>
__global__ void put_indexed_kernel(const float *x, const uint32_t *idx, int64_t k, uint8_t *body) {
  for (int64_t j = first_index(); j < k; j += grid_stride()) {
    uint32_t i = idx[j]; // idx: (k)
    store_u32<kAligned>(body + 4 * j, i);
    store_u32<kAligned>(body + 4 * k + 4 * j, bits_of(x[i]));
  }
}

// The random-k body: the values of x at idx[0..k).
template <bool kAligned>
__global__ void gather_kernel(const float *x, const uint32_t *idx, int64_t k, uint8_t *body) {
  for (int64_t j = first_index(); j < k; j += grid_stride()) {
    store_u32<kAligned>(body + 4 * j, bits_of(x[idx[j]]));
  }
}

// *bad = 1 when an index of the top-k body is >= n or not above the one before it.
template <bool kAligned>
__global__ void check_indices_kernel(const uint8_t *body, int64_t k, int64_t n, uint32_t *bad) {
  for (int64_t j = first_index(); j < k; j += grid_stride()) {
    uint32_t idx = load_u32<kAligned>(body + 4 * j);
    if ((int64_t)idx >= n || (j > 0 && idx <= load_u32<kAligned>(body + 4 * (j - 1)))) {
      *bad = 1;
    }
  }
}

// acc[idx[j]] += value j: idx from the body (top-k) or from dev_idx (random-k, body holds the
// values only). The indices are distinct (checked, or drawn without repetition): no races.
template <bool kAligned>
__global__ void scatter_add_kernel(const uint8_t *body, const uint32_t *dev_idx, int64_t k,
                                   float *acc) {
  for (int64_t j = first_index(); j < k; j += grid_stride()) {
    uint32_t idx;
    float v;
    if (dev_idx) {
      idx = dev_idx[j];
      v = float_of(load_u32<kAligned>(body + 4 * j));
    } else {
      idx = load_u32<kAligned>(body + 4 * j);
      v = float_of(load_u32<kAligned>(body + 4 * k + 4 * j));
    }
    acc[idx] = __fadd_rn(acc[idx], v);
  }
}

// ---------------------------------------------------------------------------------------------
// efsign: sign bits, 8 a byte (bit b of byte j: value 8 j + b is negative), then acc += +-scale.

__global__ void pack_signs_kernel(const float *x, int64_t n, uint8_t *bits) {
  const int64_t bytes = (n + 7) / 8;
  for (int64_t j = first_index(); j < bytes; j += grid_stride()) {
    uint32_t byte = 0;
    for (int64_t b = 0; b < 8 && 8 * j + b < n; b++) {
      byte |= (bits_of(x[8 * j + b]) >> 31) << b;
    }
    bits[j] = (uint8_t)byte; // bits: ((n + 7) / 8)
  }
}

__global__ void add_signs_kernel(const uint8_t *bits, float *acc, int64_t n, uint32_t scale_bits) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    uint32_t neg = (uint32_t)(bits[i / 8] >> (i % 8)) & 1u;
    acc[i] = __fadd_rn(acc[i], float_of(scale_bits | (neg << 31)));
  }
}

// ---------------------------------------------------------------------------------------------
// Error feedback.

__global__ void ef_sum_kernel(const float *x, const float *res, float *y, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    y[i] = __fadd_rn(x[i], res[i]); // x, res, y: (n)
  }
}

// res = (x + res) - decode(payload) (d holds the decode; x + res is y, summed again as
// ef_sum_kernel does); a non-finite difference becomes 0.
__global__ void ef_residual_kernel(const float *x, float *res, const float *d, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    float r = __fsub_rn(__fadd_rn(x[i], res[i]), d[i]); // x, res, d: (n)
    res[i] = isfinite(r) ? r : 0.0f;
  }
}

// A residual computed elsewhere (PowerSGD's M - P Ql^T): a non-finite value becomes 0.
__global__ void keep_finite_kernel(float *dst, const float *src, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float v = src[i]; // src, dst: (n)
    dst[i] = isfinite(v) ? v : 0.0f;
  }
}

// LOOM_AVG of the compressed allreduce: the host's x[i] / np.
__global__ void div_kernel(float *dst, const float *src, int64_t n, float d) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    dst[i] = __fdiv_rn(src[i], d); // dst, src: (n)
  }
}

// ---------------------------------------------------------------------------------------------
// Host helpers.

unsigned blocks_for(int64_t n) {
  return loom_cuda_blocks(n, kThreads);
}

// The CPU's corrupt(): the same message.
loom_status_t corrupt(const loom_compressor_t *c, const char *what) {
  return loom_error(NULL, LOOM_ERR_CORRUPT,
                    "%s payload: %s: the payload was damaged or comes from another compressor or "
                    "tensor (every rank must use the same compressor and sizes)",
                    c->name, what);
}

loom_status_t unsupported(const loom_compressor_t *c, const char *op) {
  return loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                    "%s: %s is a low-rank scheme, not a payload codec: use "
                    "loom_compressed_allreduce",
                    op, c->name);
}

// Write the header (and, with scale non-NULL, the 4-byte scale after it) at payload.
loom_status_t put_header(uint8_t *payload, const loom_compressor_t *c, int64_t n, uint32_t flags,
                         const float *scale) {
  loom_payload_header_t h = {LOOM_PAYLOAD_MAGIC, (uint8_t)c->kind, LOOM_PAYLOAD_VERSION, flags,
                             (uint64_t)n};
  head_bytes_t hb;
  memset(&hb, 0, sizeof hb);
  memcpy(hb.b, &h, sizeof h);
  hb.count = (int)sizeof h;
  if (scale) {
    memcpy(hb.b + sizeof h, scale, 4);
    hb.count += 4;
  }
  put_bytes_kernel<<<1, 1, 0, loom_cuda_stream()>>>(payload, hb);
  return loom_cuda_launch_check("put_bytes_kernel");
}

// A zeroed u32 flag in device scratch, for the check kernels.
loom_status_t new_flag(uint32_t **flag) {
  loom_status_t status = loom_cuda_scratch(sizeof(uint32_t), (void **)flag);
  if (status == LOOM_OK) {
    LOOM_CHECK_CUDA(NULL, cudaMemsetAsync(*flag, 0, sizeof(uint32_t), loom_cuda_stream()));
  }
  return status;
fail:
  loom_cuda_scratch_free(*flag);
  *flag = NULL;
  return status;
}

// After the launch of kernel: the flag's value on the host (waits for the stream); the flag freed.
loom_status_t read_flag(const char *kernel, uint32_t *flag, uint32_t *value) {
  loom_status_t status = loom_cuda_launch_check(kernel);
  if (status == LOOM_OK) {
    status = loom_cuda_to_host(value, flag, sizeof(uint32_t));
  }
  loom_cuda_scratch_free(flag);
  return status;
}

// x's statistics on the host (waits for the stream). *sum_terms bounds how many roundings any
// |x[i]| went through on its way into the sum (for efsign_scale).
loom_status_t compute_stats(const float *x, int64_t n, int with_sum, stats_t *out,
                            int64_t *sum_terms) {
  loom_status_t status = LOOM_OK;
  void *scratch = NULL;
  out->max_bits = 0;
  out->sum = 0.0;
  *sum_terms = 0;
  if (n == 0) {
    return LOOM_OK;
  }
  const unsigned blocks = blocks_for(n);
  // part_sum (blocks doubles), the result, part_max (blocks u32): doubles first for alignment.
  const size_t off_out = sizeof(double) * blocks, off_max = off_out + sizeof(stats_t);
  LOOM_CHECK(loom_cuda_scratch(off_max + sizeof(uint32_t) * blocks, &scratch));
  {
    double *part_sum = (double *)scratch;
    stats_t *d_out = (stats_t *)((char *)scratch + off_out);
    uint32_t *part_max = (uint32_t *)((char *)scratch + off_max);
    stats_kernel<<<blocks, kThreads, 0, loom_cuda_stream()>>>(x, n, with_sum, part_max, part_sum);
    LOOM_CHECK(loom_cuda_launch_check("stats_kernel"));
    stats_finish_kernel<<<1, kThreads, 0, loom_cuda_stream()>>>(part_max, part_sum, (int)blocks,
                                                                d_out);
    LOOM_CHECK(loom_cuda_launch_check("stats_finish_kernel"));
    LOOM_CHECK(loom_cuda_to_host(out, d_out, sizeof *out));
  }
  // A thread's run, its block's tree (log2 256 = 8 levels), the finishing thread's run over the
  // blocks, and that block's tree: generously, run + blocks + 16.
  *sum_terms = (n + (int64_t)blocks * kThreads - 1) / ((int64_t)blocks * kThreads) + blocks + 16;
fail:
  loom_cuda_scratch_free(scratch);
  return status;
}

// efsign's scale, bit for bit the CPU's (float)(sum_abs(x, n) / n), where sum_abs adds |x| in
// double in a fixed order that a parallel sum cannot follow. Both sums add nonnegative terms, so
// each is within gamma_k of the exact sum S, k being the most roundings a term went through
// (CPU: n / 8 per lane + 8; here: sum_terms): the CPU's sum lies in [lo, hi] around ours. The
// scale is a monotone function of the sum, so when lo and hi give the same float, that float is
// the CPU's scale. Otherwise (the sum is within ~n 1e-16 relative of a rounding boundary: rare)
// the exact kernel replays the CPU's order.
loom_status_t efsign_scale(const float *x, int64_t n, double sum, int64_t sum_terms, float *scale) {
  loom_status_t status = LOOM_OK;
  double *d_exact = NULL;
  double exact = 0.0;
  *scale = 0.0f;
  if (n == 0 || sum == 0.0) {
    return LOOM_OK; // no values, or every value is +-0: any order sums to exactly 0
  }
  // Twice the bound (the margin absorbs the rounding of lo and hi themselves).
  const double rel = (double)(n / 8 + 8 + sum_terms + 8) * 0x1p-52;
  const double lo = sum - sum * rel, hi = sum + sum * rel;
  const float f_lo = (float)(lo / (double)n), f_hi = (float)(hi / (double)n);
  if (f_lo == f_hi) {
    *scale = f_lo;
    return LOOM_OK;
  }
  LOOM_CHECK(loom_cuda_scratch(sizeof(double), (void **)&d_exact));
  sum_abs_exact_kernel<<<1, 8, 0, loom_cuda_stream()>>>(x, n, d_exact);
  LOOM_CHECK(loom_cuda_launch_check("sum_abs_exact_kernel"));
  LOOM_CHECK(loom_cuda_to_host(&exact, d_exact, sizeof exact));
  *scale = (float)(exact / (double)n);
fail:
  loom_cuda_scratch_free(d_exact);
  return status;
}

void CUDART_CB free_host(void *p) {
  free(p);
}

// *dev_idx (k indices in device scratch, free with loom_cuda_scratch_free) = the random-k
// indices of (n, seed). The host array is freed by a host function queued after the copy, so
// the call does not wait for the stream.
loom_status_t upload_random_indices(const loom_compressor_t *c, int64_t n, int64_t k, uint64_t seed,
                                    uint32_t **dev_idx) {
  loom_status_t status = LOOM_OK;
  cudaError_t rc = cudaSuccess;
  uint32_t *host = (uint32_t *)malloc(sizeof(uint32_t) * (size_t)k);
  *dev_idx = NULL;
  if (!host) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "%s: cannot allocate %lld indices", c->name,
                      (long long)k);
  }
  LOOM_CHECK(loom_codec_random_indices(n, k, seed, host));
  LOOM_CHECK(loom_cuda_scratch(sizeof(uint32_t) * (size_t)k, (void **)dev_idx));
  LOOM_CHECK_CUDA(NULL, cudaMemcpyAsync(*dev_idx, host, sizeof(uint32_t) * (size_t)k,
                                        cudaMemcpyHostToDevice, loom_cuda_stream()));
  rc = cudaLaunchHostFunc(loom_cuda_stream(), free_host, host);
  if (rc != cudaSuccess) { // free it once the copy is done
    (void)cudaGetLastError();
    LOOM_CHECK_CUDA(NULL, cudaStreamSynchronize(loom_cuda_stream()));
    free(host);
  }
  return LOOM_OK;
fail:
  // Reached before the copy was queued, or after a failed synchronisation (the copy's state is
  // unknown: leak the host array rather than free memory a copy may still read).
  if (rc == cudaSuccess) {
    free(host);
  }
  loom_cuda_scratch_free(*dev_idx);
  *dev_idx = NULL;
  return status;
}

// ---- top-k: a stable descending radix sort of (|x| bits, index) puts the k largest magnitudes
// first with ties in index order (the CPU's rule: ties go to the lower index); an ascending sort
// of those k indices gives the body's order.

size_t align256(size_t x) {
  return (x + 255) & ~(size_t)255;
}

template <bool kAligned>
loom_status_t encode_topk(const loom_compressor_t *c, const float *x, int64_t n, uint8_t *body) {
  loom_status_t status = LOOM_OK;
  const int64_t k = loom_codec_keep(c, n);
  void *scratch = NULL;
  size_t temp1 = 0, temp2 = 0;
  int idx_bits = 1;
  if (k == 0) {
    return LOOM_OK;
  }
  while (idx_bits < 32 && ((uint64_t)1 << idx_bits) < (uint64_t)n) {
    idx_bits++;
  }
  const cudaStream_t stream = loom_cuda_stream();
  const uint32_t un = (uint32_t)n, uk = (uint32_t)k; // n <= UINT32_MAX (checked)
  LOOM_CHECK_CUDA(NULL, cub::DeviceRadixSort::SortPairsDescending(
                            NULL, temp1, (const uint32_t *)NULL, (uint32_t *)NULL,
                            (const uint32_t *)NULL, (uint32_t *)NULL, un, 0, 31, stream));
  LOOM_CHECK_CUDA(NULL, cub::DeviceRadixSort::SortKeys(NULL, temp2, (const uint32_t *)NULL,
                                                       (uint32_t *)NULL, uk, 0, idx_bits, stream));
  {
    // Scratch: key_in, key_out, val_in, val_out (n u32 each), sorted (k u32), cub's temp.
    const size_t arr = align256(sizeof(uint32_t) * (size_t)n);
    const size_t temp = align256(temp1 > temp2 ? temp1 : temp2);
    LOOM_CHECK(
        loom_cuda_scratch(4 * arr + align256(sizeof(uint32_t) * (size_t)k) + temp + 256, &scratch));
    char *base = (char *)(((uintptr_t)scratch + 255) & ~(uintptr_t)255);
    uint32_t *key_in = (uint32_t *)base, *key_out = (uint32_t *)(base + arr);
    uint32_t *val_in = (uint32_t *)(base + 2 * arr), *val_out = (uint32_t *)(base + 3 * arr);
    uint32_t *sorted = (uint32_t *)(base + 4 * arr);
    void *d_temp = base + 4 * arr + align256(sizeof(uint32_t) * (size_t)k);
    size_t t1 = temp1, t2 = temp2;

    magnitude_keys_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, key_in, val_in);
    LOOM_CHECK(loom_cuda_launch_check("magnitude_keys_kernel"));
    LOOM_CHECK_CUDA(NULL, cub::DeviceRadixSort::SortPairsDescending(
                              d_temp, t1, (const uint32_t *)key_in, key_out,
                              (const uint32_t *)val_in, val_out, un, 0, 31, stream));
    LOOM_CHECK_CUDA(NULL, cub::DeviceRadixSort::SortKeys(d_temp, t2, (const uint32_t *)val_out,
                                                         sorted, uk, 0, idx_bits, stream));
    put_indexed_kernel<kAligned><<<blocks_for(k), kThreads, 0, stream>>>(x, sorted, k, body);
    LOOM_CHECK(loom_cuda_launch_check("put_indexed_kernel"));
  }
fail:
  loom_cuda_scratch_free(scratch);
  return status;
}

template <bool kAligned>
loom_status_t encode_randomk(const loom_compressor_t *c, const float *x, int64_t n, uint64_t seed,
                             uint8_t *body) {
  loom_status_t status = LOOM_OK;
  uint32_t *idx = NULL;
  const int64_t k = loom_codec_keep(c, n);
  if (k == 0) {
    return LOOM_OK;
  }
  LOOM_CHECK(upload_random_indices(c, n, k, seed, &idx));
  gather_kernel<kAligned><<<blocks_for(k), kThreads, 0, loom_cuda_stream()>>>(x, idx, k, body);
  status = loom_cuda_launch_check("gather_kernel");
fail:
  loom_cuda_scratch_free(idx);
  return status;
}

// The body of every codec but none, int8 and efsign's sign bits are launched here by dtype and
// alignment.
template <bool kAligned>
loom_status_t encode_body(const loom_compressor_t *c, const float *x, int64_t n, uint64_t seed,
                          uint8_t *body) {
  const cudaStream_t stream = loom_cuda_stream();
  switch (c->kind) {
  case LOOM_CODEC_FP16:
    if (n > 0) {
      to_f16_kernel<kAligned><<<blocks_for(n), kThreads, 0, stream>>>(x, body, n);
      return loom_cuda_launch_check("to_f16_kernel");
    }
    return LOOM_OK;
  case LOOM_CODEC_BF16:
    if (n > 0) {
      to_bf16_kernel<kAligned><<<blocks_for(n), kThreads, 0, stream>>>(x, body, n);
      return loom_cuda_launch_check("to_bf16_kernel");
    }
    return LOOM_OK;
  case LOOM_CODEC_TOPK:
    return encode_topk<kAligned>(c, x, n, body);
  case LOOM_CODEC_RANDOMK:
    return encode_randomk<kAligned>(c, x, n, seed, body);
  default:
    return loom_error(NULL, LOOM_ERR_INTERNAL, "%s: no device body encoder", c->name);
  }
}

template <bool kAligned>
loom_status_t decode_body(const loom_compressor_t *c, const uint8_t *body, int64_t n, uint64_t seed,
                          float *acc) {
  loom_status_t status = LOOM_OK;
  const cudaStream_t stream = loom_cuda_stream();
  const int64_t k = loom_codec_keep(c, n);
  uint32_t *flag = NULL, *idx = NULL, bad = 0;
  switch (c->kind) {
  case LOOM_CODEC_NONE:
    if (n > 0) {
      add_f32_kernel<kAligned><<<blocks_for(n), kThreads, 0, stream>>>(body, acc, n);
      status = loom_cuda_launch_check("add_f32_kernel");
    }
    break;
  case LOOM_CODEC_FP16:
    if (n > 0) {
      add_f16_kernel<kAligned><<<blocks_for(n), kThreads, 0, stream>>>(body, acc, n);
      status = loom_cuda_launch_check("add_f16_kernel");
    }
    break;
  case LOOM_CODEC_BF16:
    if (n > 0) {
      add_bf16_kernel<kAligned><<<blocks_for(n), kThreads, 0, stream>>>(body, acc, n);
      status = loom_cuda_launch_check("add_bf16_kernel");
    }
    break;
  case LOOM_CODEC_TOPK:
    if (k == 0) {
      break;
    }
    LOOM_CHECK(new_flag(&flag));
    check_indices_kernel<kAligned><<<blocks_for(k), kThreads, 0, stream>>>(body, k, n, flag);
    status = read_flag("check_indices_kernel", flag, &bad); // frees flag
    flag = NULL;
    if (status == LOOM_OK && bad) {
      status = corrupt(c, "an index out of range or not increasing");
    }
    if (status != LOOM_OK) {
      goto fail;
    }
    scatter_add_kernel<kAligned><<<blocks_for(k), kThreads, 0, stream>>>(body, NULL, k, acc);
    status = loom_cuda_launch_check("scatter_add_kernel");
    break;
  case LOOM_CODEC_RANDOMK:
    if (k == 0) {
      break;
    }
    LOOM_CHECK(upload_random_indices(c, n, k, seed, &idx));
    scatter_add_kernel<kAligned><<<blocks_for(k), kThreads, 0, stream>>>(body, idx, k, acc);
    status = loom_cuda_launch_check("scatter_add_kernel");
    break;
  default:
    status = loom_error(NULL, LOOM_ERR_INTERNAL, "%s: no device body decoder", c->name);
    break;
  }
fail:
  loom_cuda_scratch_free(flag);
  loom_cuda_scratch_free(idx);
  return status;
}

} // namespace

// ---------------------------------------------------------------------------------------------
// Encode.

extern "C" loom_status_t loom_cuda_codec_encode(const loom_compressor_t *c, const float *x,
                                                int64_t n, uint64_t seed, uint8_t *payload,
                                                size_t cap, size_t *bytes_host) {
  loom_status_t status = LOOM_OK;
  stats_t stats = {0, 0.0};
  int64_t sum_terms = 0;
  *bytes_host = 0;
  if (c->kind == LOOM_CODEC_POWERSGD) {
    return unsupported(c, "loom_cuda_codec_encode");
  }
  if ((c->kind == LOOM_CODEC_TOPK || c->kind == LOOM_CODEC_RANDOMK) && n > (int64_t)UINT32_MAX) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: %lld values: index-based compressors take at most 2^32 - 1 per tensor; "
                      "split the tensor",
                      c->name, (long long)n);
  }
  const size_t need = loom_codec_max_bytes(c, n);
  const int scaled =
      c->kind == LOOM_CODEC_INT8 || c->kind == LOOM_CODEC_EFSIGN || c->kind == LOOM_CODEC_TOPK;
  // NaN/Inf cannot be scaled or ranked: flag and send nothing (the max pass of int8's scale
  // finds them; efsign gets its sum from the same pass).
  if (scaled) {
    LOOM_CHECK(compute_stats(x, n, c->kind == LOOM_CODEC_EFSIGN, &stats, &sum_terms));
  }
  if (scaled && stats.max_bits >= 0x7F800000u) {
    if (cap < LOOM_PAYLOAD_HEADER) {
      goto small;
    }
    LOOM_CHECK(put_header(payload, c, n, LOOM_PAYLOAD_NONFINITE, NULL));
    *bytes_host = LOOM_PAYLOAD_HEADER;
    return LOOM_OK;
  }
  if (cap < need) {
    goto small;
  }
  {
    uint8_t *body = payload + LOOM_PAYLOAD_HEADER;
    const int aligned = (uintptr_t)payload % 4 == 0;
    const cudaStream_t stream = loom_cuda_stream();
    switch (c->kind) {
    case LOOM_CODEC_NONE:
      LOOM_CHECK(put_header(payload, c, n, 0, NULL));
      if (n > 0) {
        LOOM_CHECK_CUDA(NULL,
                        cudaMemcpyAsync(body, x, 4 * (size_t)n, cudaMemcpyDeviceToDevice, stream));
      }
      break;
    case LOOM_CODEC_INT8: {
      // encode_int8's scale, on the host from the max it needed anyway.
      float mx;
      memcpy(&mx, &stats.max_bits, 4);
      float scale = mx / 127.0f;
      if (std::isinf(127.0f * scale)) { // near FLT_MAX: 127 * scale must not decode to Inf
        scale = nextafterf(scale, 0.0f);
      }
      // 127 / mx overflows below mx ~ 3.7e-37: then divide by the (subnormal) scale instead.
      const float inv = mx > 0.0f ? 127.0f / mx : 0.0f;
      const int divide = std::isinf(inv);
      LOOM_CHECK(put_header(payload, c, n, 0, &scale));
      if (n > 0) {
        quantise_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, (int8_t *)(body + 4), n, inv,
                                                                scale, divide, c->stochastic, seed);
        LOOM_CHECK(loom_cuda_launch_check("quantise_kernel"));
      }
      break;
    }
    case LOOM_CODEC_EFSIGN: {
      float scale = 0.0f;
      LOOM_CHECK(efsign_scale(x, n, stats.sum, sum_terms, &scale));
      LOOM_CHECK(put_header(payload, c, n, 0, &scale));
      if (n > 0) {
        pack_signs_kernel<<<blocks_for((n + 7) / 8), kThreads, 0, stream>>>(x, n, body + 4);
        LOOM_CHECK(loom_cuda_launch_check("pack_signs_kernel"));
      }
      break;
    }
    default:
      LOOM_CHECK(put_header(payload, c, n, 0, NULL));
      LOOM_CHECK(aligned ? encode_body<true>(c, x, n, seed, body)
                         : encode_body<false>(c, x, n, seed, body));
      break;
    }
  }
  *bytes_host = need;
  return LOOM_OK;

small:
  return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                    "%s: payload buffer of %zu bytes, %zu needed for %lld values: size it with "
                    "loom_compressor_max_bytes",
                    c->name, cap, need, (long long)n);
fail:
  return status;
}

// ---------------------------------------------------------------------------------------------
// Decode: the header (and the scale) come to the host and go through the CPU decoder's checks
// (loom_codec_check_header, loom_codec_check_scale); the body's checks run on the device; nothing
// is added to acc before every check passed.

extern "C" loom_status_t loom_cuda_codec_decode_add(const loom_compressor_t *c,
                                                    const uint8_t *payload, size_t bytes, int64_t n,
                                                    uint64_t seed, float *acc) {
  loom_status_t status = LOOM_OK;
  uint8_t head[LOOM_PAYLOAD_HEADER + 4] = {0};
  uint32_t *flag = NULL, bad = 0, flags = 0;
  if (c->kind == LOOM_CODEC_POWERSGD) {
    return unsupported(c, "loom_cuda_codec_decode_add");
  }
  const int has_scale = c->kind == LOOM_CODEC_INT8 || c->kind == LOOM_CODEC_EFSIGN;
  if (bytes >= LOOM_PAYLOAD_HEADER) { // (a shorter payload is refused without reading it)
    const size_t head_bytes = has_scale && bytes >= LOOM_PAYLOAD_HEADER + 4
                                  ? LOOM_PAYLOAD_HEADER + 4
                                  : LOOM_PAYLOAD_HEADER;
    LOOM_CHECK(loom_cuda_to_host(head, payload, head_bytes));
  }
  LOOM_CHECK(loom_codec_check_header(c, head, bytes, n, &flags));
  if (flags & LOOM_PAYLOAD_NONFINITE) {
    if (n > 0) {
      add_nan_kernel<<<blocks_for(n), kThreads, 0, loom_cuda_stream()>>>(acc, n);
      return loom_cuda_launch_check("add_nan_kernel");
    }
    return LOOM_OK;
  }
  {
    const uint8_t *body = payload + LOOM_PAYLOAD_HEADER;
    const cudaStream_t stream = loom_cuda_stream();
    float scale = 0.0f;
    if (has_scale) { // bytes is the full size (>= 20) here
      LOOM_CHECK(loom_codec_check_scale(c, head + LOOM_PAYLOAD_HEADER, &scale));
    }
    switch (c->kind) {
    case LOOM_CODEC_INT8: {
      const int8_t *q = (const int8_t *)(body + 4);
      if (n == 0) {
        break;
      }
      LOOM_CHECK(new_flag(&flag));
      find_int8_min_kernel<<<blocks_for(n), kThreads, 0, stream>>>(q, n, flag);
      status = read_flag("find_int8_min_kernel", flag, &bad); // frees flag
      flag = NULL;
      if (status == LOOM_OK && bad) {
        status = corrupt(c, "a quantised value of -128 (the encoder emits -127..127)");
      }
      if (status != LOOM_OK) {
        goto fail;
      }
      add_int8_kernel<<<blocks_for(n), kThreads, 0, stream>>>(q, acc, n, scale);
      LOOM_CHECK(loom_cuda_launch_check("add_int8_kernel"));
      break;
    }
    case LOOM_CODEC_EFSIGN: {
      const uint8_t *bits = body + 4;
      uint32_t scale_bits;
      memcpy(&scale_bits, &scale, 4);
      if (n % 8) {
        uint8_t last = 0;
        LOOM_CHECK(loom_cuda_to_host(&last, bits + n / 8, 1));
        if (last >> (n % 8)) {
          return corrupt(c, "padding bits after the last sign are set");
        }
      }
      if (n > 0) {
        add_signs_kernel<<<blocks_for(n), kThreads, 0, stream>>>(bits, acc, n, scale_bits);
        LOOM_CHECK(loom_cuda_launch_check("add_signs_kernel"));
      }
      break;
    }
    default:
      LOOM_CHECK((uintptr_t)payload % 4 == 0 ? decode_body<true>(c, body, n, seed, acc)
                                             : decode_body<false>(c, body, n, seed, acc));
      break;
    }
  }
  return LOOM_OK;

fail:
  loom_cuda_scratch_free(flag);
  return status;
}

// ---------------------------------------------------------------------------------------------
// Error feedback, as loom_ef_encode: y = x + res; payload = encode(y); res = y - decode(payload).

extern "C" loom_status_t loom_cuda_ef_encode(const loom_compressor_t *c, float *res, float *y,
                                             const float *x, int64_t n, uint64_t seed,
                                             uint8_t *payload, size_t cap, size_t *bytes_host) {
  loom_status_t status = LOOM_OK;
  if (!res) {
    return loom_cuda_codec_encode(c, x, n, seed, payload, cap, bytes_host);
  }
  *bytes_host = 0;
  if (c->kind == LOOM_CODEC_POWERSGD) {
    return unsupported(c, "loom_cuda_ef_encode");
  }
  if (n > 0) {
    ef_sum_kernel<<<blocks_for(n), kThreads, 0, loom_cuda_stream()>>>(x, res, y, n);
    LOOM_CHECK(loom_cuda_launch_check("ef_sum_kernel"));
  }
  LOOM_CHECK(loom_cuda_codec_encode(c, y, n, seed, payload, cap, bytes_host)); // res unchanged
  // residual = y - decode(payload): decode into y (scratch), so that a failed decode (randomk's
  // host indices out of memory) leaves the residual as it was; then subtract from x + residual.
  if (n > 0) {
    LOOM_CHECK_CUDA(NULL, cudaMemsetAsync(y, 0, (size_t)n * sizeof(float), loom_cuda_stream()));
  }
  LOOM_CHECK(loom_cuda_codec_decode_add(c, payload, *bytes_host, n, seed, y));
  if (n > 0) {
    ef_residual_kernel<<<blocks_for(n), kThreads, 0, loom_cuda_stream()>>>(x, res, y, n);
    LOOM_CHECK(loom_cuda_launch_check("ef_residual_kernel"));
  }
  return LOOM_OK;
fail:
  return status;
}

// ---------------------------------------------------------------------------------------------
// Helpers of the compressed allreduce of device tensors.

extern "C" loom_status_t loom_cuda_div(float *dst, const float *src, int64_t n, float d) {
  if (n <= 0) {
    return LOOM_OK;
  }
  div_kernel<<<blocks_for(n), kThreads, 0, loom_cuda_stream()>>>(dst, src, n, d);
  return loom_cuda_launch_check("div_kernel");
}

extern "C" loom_status_t loom_cuda_keep_finite(float *dst, const float *src, int64_t n) {
  if (n <= 0) {
    return LOOM_OK;
  }
  keep_finite_kernel<<<blocks_for(n), kThreads, 0, loom_cuda_stream()>>>(dst, src, n);
  return loom_cuda_launch_check("keep_finite_kernel");
}

extern "C" loom_status_t loom_cuda_put_bytes(uint8_t *dst, const void *src, int count) {
  head_bytes_t hb;
  if (count < 0 || count > (int)sizeof hb.b) {
    return loom_error(NULL, LOOM_ERR_INTERNAL, "loom_cuda_put_bytes: %d bytes (at most %d)", count,
                      (int)sizeof hb.b);
  }
  memset(&hb, 0, sizeof hb);
  memcpy(hb.b, src, (size_t)count);
  hb.count = count;
  put_bytes_kernel<<<1, 1, 0, loom_cuda_stream()>>>(dst, hb);
  return loom_cuda_launch_check("put_bytes_kernel");
}
