/* attention_cuda.cu — CUDA varlen core attention (FlashAttention-2 tiles, online softmax in base 2,
 * bottom-right causal, LSE out): bf16 tensor-core (wmma) kernels for D = 32, 64, 128, FMA others.
 */
#include "config.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <mma.h>
#include <stddef.h>
#include <stdint.h>

// loom_core.h includes mpi.h; its C++ bindings would need libmpi_cxx, so leave them out.
#define OMPI_SKIP_MPICXX  1
#define MPICH_SKIP_MPICXX 1
#include "cuda_ctx.h"
#include "cuda_kernels.h"
#include "error.h"
#include "loom_core.h"

// Two families of kernels, both mirroring compute/cpu/attention_cpu.c (same masks, base-2
// softmax, lse = (m + log2 l) ln 2, dS = P (dP - Di), dQ = scale dS K, dK = scale dS^T Q):
// - Tensor cores (bf16, D = 32, 64, 128, 16-byte aligned tensors): nvcuda::wmma 16x16x16 bf16
//   products with f32 accumulators; each warp owns 16 rows of the block's tile. P and dS are
//   rounded to bf16 before their products (as FlashAttention does); softmax, sums and lse in f32.
// - FMA (f32 at any D <= 256, bf16 at the other D <= 256): square tiles of BT rows kept in
//   shared memory as f32, products by 4x4 register micro-tiles.
// D > 256 returns LOOM_ERR_UNSUPPORTED. The backward takes no scratch and no atomics: each
// backward kernel computes Di = rowsum(dO * O) of the query tile it loads (the same function in
// both kernels, so the same bits); dK and dV of a key tile come from one block that walks the
// group's query heads in order, dQ of a query tile from one block: deterministic.

namespace {

namespace wmma = nvcuda::wmma;
typedef __nv_bfloat16 bf16;

constexpr int kThreads = 128;           // every kernel: 4 warps
constexpr int kWarps = kThreads / 32;   //
constexpr int kMaxGridYZ = 65535;       // gridDim.y, gridDim.z limit
constexpr int kDefaultSmem = 48 * 1024; // more dynamic shared memory needs an opt-in
constexpr int kMaxSmem = 99 * 1024;     // our budget per block (sm_80 allows 163 KiB)
constexpr int kMaxHeadDim = 256;        //
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__host__ __device__ constexpr int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}
__host__ __device__ constexpr int64_t max64(int64_t a, int64_t b) {
  return a > b ? a : b;
}
__host__ __device__ constexpr int align128(int n) {
  return (n + 127) & ~127;
}
__host__ __device__ constexpr int imax(int a, int b) {
  return a > b ? a : b;
}

// ---------------------------------------------------------------------------------------------
// What every kernel shares: the arguments, the sequence of the block, the mask.

struct AttnArgs {
  const int32_t *cu_q, *cu_k; // (B + 1) offsets
  int B;                      // sequences in all: cu_q[B] = total_q, the row count of lse
  int b0;                     // the block's sequence is b0 + blockIdx.z (launches of 65535)
  int H, H_kv, D, causal;     //
  float scale;                // > 0
  float s2;                   // scale * log2(e): scores in base 2
};

struct SeqInfo {
  int64_t q0, k0;  // first row of the sequence in q and in k
  int64_t total_q; // rows of q: the row stride of lse
  int lq, lk;      // its query and key rows
};

__device__ SeqInfo seq_info(const AttnArgs &a) {
  const int b = a.b0 + (int)blockIdx.z;
  SeqInfo s;
  s.q0 = a.cu_q[b];
  s.k0 = a.cu_k[b];
  s.lq = a.cu_q[b + 1] - a.cu_q[b];
  s.lk = a.cu_k[b + 1] - a.cu_k[b];
  s.total_q = a.cu_q[a.B];
  return s;
}

// Query i of the sequence sees key j: both exist and, if causal, j <= i + lk - lq.
__device__ __forceinline__ bool visible(int64_t i, int64_t j, const SeqInfo &s, int causal) {
  return i < s.lq && j < s.lk && (!causal || j <= i + s.lk - s.lq);
}

// Keys [0, result) are those seen by query i (and, causal, by every query before it).
__device__ __forceinline__ int keys_seen(int64_t i, const SeqInfo &s, int causal) {
  const int64_t end = causal ? i + 1 + s.lk - s.lq : s.lk;
  return (int)max64(0, min64(end, s.lk));
}

// The first query that sees key j0 (every later key tile is seen by later queries only).
__device__ __forceinline__ int64_t first_query(int64_t j0, const SeqInfo &s, int causal) {
  return causal ? max64(0, j0 + s.lq - s.lk) : 0;
}

// lse in base 2; +inf for a row without keys (lse = -inf), whose P = 2^(s - inf) is then 0.
__device__ __forceinline__ float lse_base2(float lse) {
  return lse == -INFINITY ? INFINITY : lse * kLog2e;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(bf16 x) {
  return __bfloat162float(x);
}
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <> __device__ __forceinline__ bf16 from_float<bf16>(float x) {
  return __float2bfloat16_rn(x);
}

// ---------------------------------------------------------------------------------------------
// FMA kernels. Tiles of BT query rows and BT key rows in shared memory as f32. Rows of the
// BT x D tiles are padded to DP = D rounded up to 4 columns (zeros) with an odd stride LD = DP + 1,
// BT x BT tiles have stride LDS = BT + 1: the column walks of tile_mm hit distinct banks.

__host__ __device__ constexpr int round4(int n) {
  return (n + 3) & ~3;
}

// Square tile size of the FMA kernels: 32 up to D = 64, 16 above (shared memory).
__host__ __device__ constexpr int gen_tile(int D) {
  return round4(D) <= 64 ? 32 : 16;
}

// Shared memory (bytes): forward Q, K, V, O tiles, S, and m, l, alpha; backward six BT x D
// tiles (K, V, dK, dV, Q, dO in the dK/dV kernel; the dQ kernel uses five), S, dP, lse2, di.
__host__ __device__ constexpr size_t gen_fwd_smem(int D, int BT) {
  return sizeof(float) * ((size_t)4 * BT * (round4(D) + 1) + (size_t)BT * (BT + 1) + 3 * BT);
}
__host__ __device__ constexpr size_t gen_bwd_smem(int D, int BT) {
  return sizeof(float) * ((size_t)6 * BT * (round4(D) + 1) + (size_t)2 * BT * (BT + 1) + 2 * BT);
}
static_assert(gen_bwd_smem(kMaxHeadDim, gen_tile(kMaxHeadDim)) <= (size_t)kMaxSmem,
              "FMA backward tiles at D = 256 exceed the shared memory budget");
static_assert(gen_bwd_smem(64, gen_tile(64)) <= (size_t)kMaxSmem &&
                  gen_bwd_smem(68, gen_tile(68)) <= (size_t)kMaxSmem,
              "FMA backward tiles exceed the shared memory budget");

// C (M x N, row stride ldc) = [row_scale[r] *] C (accumulate) or 0, plus A B, where
// A(r, k) = A[r * ar + k * ak] and B(k, c) = B[k * bk + c * bc] (strides express transposes).
// M and N are multiples of 4; each thread takes 4 x 4 elements {ri + i M/4} x {ci + j N/4} at a
// time. Every thread of the block calls it; the caller synchronizes around it.
__device__ void tile_mm(float *C, int ldc, const float *A, int ar, int ak, const float *B, int bk,
                        int bc, int M, int N, int K, const float *row_scale, bool accumulate) {
  const int mq = M / 4, nq = N / 4;
  for (int t = threadIdx.x; t < mq * nq; t += blockDim.x) {
    const int ri = t / nq, ci = t % nq;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const float rs = accumulate && row_scale ? row_scale[ri + i * mq] : 1.0f;
#pragma unroll
      for (int j = 0; j < 4; j++) {
        acc[i][j] = accumulate ? C[(ri + i * mq) * ldc + ci + j * nq] * rs : 0.0f;
      }
    }
    for (int kk = 0; kk < K; kk++) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; i++) {
        av[i] = A[(ri + i * mq) * ar + kk * ak];
        bv[i] = B[kk * bk + (ci + i * nq) * bc];
      }
#pragma unroll
      for (int i = 0; i < 4; i++) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
          acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
#pragma unroll
      for (int j = 0; j < 4; j++) {
        C[(ri + i * mq) * ldc + ci + j * nq] = acc[i][j];
      }
    }
  }
}

// dst (BT x DP, row stride ld) = rows [0, nrows) of src (row stride src_ld) as f32; zeros in the
// rows past nrows and the padding columns.
template <typename T>
__device__ void gen_load(float *dst, int ld, const T *src, int64_t src_ld, int nrows, int BT, int D,
                         int DP) {
  for (int e = threadIdx.x; e < BT * DP; e += blockDim.x) {
    const int r = e / DP, c = e % DP;
    dst[r * ld + c] = r < nrows && c < D ? to_float(src[r * src_ld + c]) : 0.0f;
  }
}

// Rows [0, nrows) of dst (row stride dst_ld) = src * (row_mul ? row_mul[r] : mul).
template <typename T>
__device__ void gen_store(T *dst, int64_t dst_ld, const float *src, int ld, int nrows, int D,
                          const float *row_mul, float mul) {
  for (int e = threadIdx.x; e < nrows * D; e += blockDim.x) {
    const int r = e / D, c = e % D;
    dst[r * dst_ld + c] = from_float<T>(src[r * ld + c] * (row_mul ? row_mul[r] : mul));
  }
}

// di[r] = sum_d dO[r, d] O[r, d] for the tile's rows (0 past nrows): a warp per row, lanes over
// d, a fixed shuffle tree, so both backward kernels get the same bits.
template <typename T>
__device__ void gen_row_dots(float *di, const float *dOs, int ld, const T *o, int64_t o_ld,
                             int nrows, int BT, int D) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < BT; r += blockDim.x / 32) {
    float sum = 0.0f;
    for (int d = lane; r < nrows && d < D; d += 32) {
      sum = fmaf(dOs[r * ld + d], to_float(o[r * o_ld + d]), sum);
    }
    sum = warp_sum(sum);
    if (lane == 0) {
      di[r] = sum;
    }
  }
}

// Forward: block (query tile, head, sequence); the longest causal tiles start first.
template <typename T, int BT>
__global__ void __launch_bounds__(kThreads)
    gen_fwd_kernel(AttnArgs a, T *out, float *lse, const T *q, const T *k, const T *v) {
  extern __shared__ float gsm[];
  const SeqInfo s = seq_info(a);
  const int h = blockIdx.y;
  const int64_t i0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * BT;
  if (i0 >= s.lq) {
    return;
  }
  const int rows = (int)min64(BT, s.lq - i0);
  const int D = a.D, DP = round4(D), LD = DP + 1, LDS = BT + 1;
  float *Qs = gsm, *Ks = Qs + BT * LD, *Vs = Ks + BT * LD, *Os = Vs + BT * LD; // (BT, LD)
  float *Ss = Os + BT * LD;                                                    // (BT, LDS)
  float *m_s = Ss + BT * LDS, *l_s = m_s + BT, *alpha_s = l_s + BT;            // (BT)
  const int64_t ldq = (int64_t)a.H * D, ldk = (int64_t)a.H_kv * D;
  const int64_t hk = h / (a.H / a.H_kv);
  const int64_t qoff = (s.q0 + i0) * ldq + (int64_t)h * D;

  gen_load(Qs, LD, q + qoff, ldq, rows, BT, D, DP);
  for (int e = threadIdx.x; e < BT * LD; e += blockDim.x) {
    Os[e] = 0.0f;
  }
  if (threadIdx.x < BT) {
    m_s[threadIdx.x] = -INFINITY;
    l_s[threadIdx.x] = 0.0f;
  }
  const int kend = keys_seen(i0 + rows - 1, s, a.causal); // later key tiles are fully masked
  for (int j0 = 0; j0 < kend; j0 += BT) {
    const int64_t koff = (s.k0 + j0) * ldk + hk * D;
    const int krows = (int)min64(BT, s.lk - j0);
    __syncthreads(); // the previous tile's products are done with K, V and S
    gen_load(Ks, LD, k + koff, ldk, krows, BT, D, DP);
    gen_load(Vs, LD, v + koff, ldk, krows, BT, D, DP);
    __syncthreads();
    tile_mm(Ss, LDS, Qs, LD, 1, Ks, 1, LD, BT, BT, D, nullptr, false); // S = Q K^T
    __syncthreads();
    if (threadIdx.x < BT) { // online softmax, a thread per row
      const int r = threadIdx.x;
      const int end = r < rows ? keys_seen(i0 + r, s, a.causal) - j0 : 0; // columns [0, end) seen
      float *sr = Ss + r * LDS;
      float mx = -INFINITY;
      for (int c = 0; c < BT && c < end; c++) {
        mx = fmaxf(mx, sr[c] * a.s2);
      }
      const float m_old = m_s[r], m_new = fmaxf(m_old, mx);
      const bool live = m_new != -INFINITY; // the row has seen a key
      float sum = 0.0f;
      for (int c = 0; c < BT; c++) {
        const float p = live && c < end ? exp2f(sr[c] * a.s2 - m_new) : 0.0f;
        sr[c] = p;
        sum += p;
      }
      const float alpha = live ? exp2f(m_old - m_new) : 1.0f; // m_old = -inf: 0
      l_s[r] = l_s[r] * alpha + sum;
      m_s[r] = m_new;
      alpha_s[r] = alpha;
    }
    __syncthreads();
    tile_mm(Os, LD, Ss, LDS, 1, Vs, LD, 1, BT, DP, BT, alpha_s, true); // O = alpha O + P V
  }
  __syncthreads();
  if (threadIdx.x < BT) { // out = O / l, lse = (m + log2 l) ln 2; rows without keys: 0, -inf
    const int r = threadIdx.x;
    const float l = l_s[r];
    alpha_s[r] = l > 0.0f ? 1.0f / l : 0.0f;
    if (r < rows) {
      lse[h * s.total_q + s.q0 + i0 + r] = l > 0.0f ? (m_s[r] + log2f(l)) * kLn2 : -INFINITY;
    }
  }
  __syncthreads();
  gen_store(out + qoff, ldq, Os, LD, rows, D, alpha_s, 1.0f);
}

// Backward dK, dV: block (key tile, key/value head, sequence); for each query head of the group
// in order and each query tile that sees the key tile: recompute P, then dV += P^T dO,
// dK += dS^T Q (times scale at the end).
template <typename T, int BT>
__global__ void __launch_bounds__(kThreads)
    gen_bwd_dkdv_kernel(AttnArgs a, T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v,
                        const T *out, const float *lse) {
  extern __shared__ float gsm[];
  const SeqInfo s = seq_info(a);
  const int hk = blockIdx.y;
  const int64_t j0 = (int64_t)blockIdx.x * BT;
  if (j0 >= s.lk) {
    return;
  }
  const int cols = (int)min64(BT, s.lk - j0);
  const int D = a.D, DP = round4(D), LD = DP + 1, LDS = BT + 1;
  float *Ks = gsm, *Vs = Ks + BT * LD, *dKs = Vs + BT * LD, *dVs = dKs + BT * LD; // (BT, LD)
  float *Qs = dVs + BT * LD, *dOs = Qs + BT * LD;                                 // (BT, LD)
  float *Ss = dOs + BT * LD, *dPs = Ss + BT * LDS;                                // (BT, LDS)
  float *lse2 = dPs + BT * LDS, *di = lse2 + BT;                                  // (BT)
  const int64_t ldq = (int64_t)a.H * D, ldk = (int64_t)a.H_kv * D;
  const int64_t koff = (s.k0 + j0) * ldk + (int64_t)hk * D;

  gen_load(Ks, LD, k + koff, ldk, cols, BT, D, DP);
  gen_load(Vs, LD, v + koff, ldk, cols, BT, D, DP);
  for (int e = threadIdx.x; e < 2 * BT * LD; e += blockDim.x) {
    dKs[e] = 0.0f; // and dVs
  }
  const int group = a.H / a.H_kv;
  for (int h = hk * group; h < (hk + 1) * group; h++) {
    for (int64_t i0 = first_query(j0, s, a.causal); i0 < s.lq; i0 += BT) {
      const int rows = (int)min64(BT, s.lq - i0);
      const int64_t qoff = (s.q0 + i0) * ldq + (int64_t)h * D;
      __syncthreads(); // the previous query tile is done with Q, dO, S, dP, lse2, di
      gen_load(Qs, LD, q + qoff, ldq, rows, BT, D, DP);
      gen_load(dOs, LD, dout + qoff, ldq, rows, BT, D, DP);
      for (int r = threadIdx.x; r < BT; r += blockDim.x) {
        lse2[r] = r < rows ? lse_base2(lse[h * s.total_q + s.q0 + i0 + r]) : INFINITY;
      }
      __syncthreads();
      gen_row_dots(di, dOs, LD, out + qoff, ldq, rows, BT, D);
      tile_mm(Ss, LDS, Qs, LD, 1, Ks, 1, LD, BT, BT, D, nullptr, false);   // S = Q K^T
      tile_mm(dPs, LDS, dOs, LD, 1, Vs, 1, LD, BT, BT, D, nullptr, false); // dP = dO V^T
      __syncthreads();
      for (int e = threadIdx.x; e < BT * BT; e += blockDim.x) { // P in Ss, dS in dPs
        const int r = e / BT, c = e % BT;
        const bool vis = visible(i0 + r, j0 + c, s, a.causal);
        const float p = vis ? exp2f(Ss[r * LDS + c] * a.s2 - lse2[r]) : 0.0f;
        Ss[r * LDS + c] = p;
        dPs[r * LDS + c] = p * (dPs[r * LDS + c] - di[r]);
      }
      __syncthreads();
      tile_mm(dVs, LD, Ss, 1, LDS, dOs, LD, 1, BT, DP, BT, nullptr, true); // dV += P^T dO
      tile_mm(dKs, LD, dPs, 1, LDS, Qs, LD, 1, BT, DP, BT, nullptr, true); // dK += dS^T Q
    }
  }
  __syncthreads();
  gen_store(dk + koff, ldk, dKs, LD, cols, D, nullptr, a.scale);
  gen_store(dv + koff, ldk, dVs, LD, cols, D, nullptr, 1.0f);
}

// Backward dQ: block (query tile, head, sequence); dQ = scale sum over key tiles of dS K.
template <typename T, int BT>
__global__ void __launch_bounds__(kThreads)
    gen_bwd_dq_kernel(AttnArgs a, T *dq, const T *dout, const T *q, const T *k, const T *v,
                      const T *out, const float *lse) {
  extern __shared__ float gsm[];
  const SeqInfo s = seq_info(a);
  const int h = blockIdx.y;
  const int64_t i0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * BT;
  if (i0 >= s.lq) {
    return;
  }
  const int rows = (int)min64(BT, s.lq - i0);
  const int D = a.D, DP = round4(D), LD = DP + 1, LDS = BT + 1;
  float *Qs = gsm, *dOs = Qs + BT * LD, *Ks = dOs + BT * LD, *Vs = Ks + BT * LD; // (BT, LD)
  float *dQs = Vs + BT * LD;                                                     // (BT, LD)
  float *Ss = dQs + 2 * BT * LD, *dPs = Ss + BT * LDS; // (BT, LDS); one BT x LD tile unused
  float *lse2 = dPs + BT * LDS, *di = lse2 + BT;       // (BT)
  const int64_t ldq = (int64_t)a.H * D, ldk = (int64_t)a.H_kv * D;
  const int64_t hk = h / (a.H / a.H_kv);
  const int64_t qoff = (s.q0 + i0) * ldq + (int64_t)h * D;

  gen_load(Qs, LD, q + qoff, ldq, rows, BT, D, DP);
  gen_load(dOs, LD, dout + qoff, ldq, rows, BT, D, DP);
  for (int e = threadIdx.x; e < BT * LD; e += blockDim.x) {
    dQs[e] = 0.0f;
  }
  for (int r = threadIdx.x; r < BT; r += blockDim.x) {
    lse2[r] = r < rows ? lse_base2(lse[h * s.total_q + s.q0 + i0 + r]) : INFINITY;
  }
  __syncthreads();
  gen_row_dots(di, dOs, LD, out + qoff, ldq, rows, BT, D);
  const int kend = keys_seen(i0 + rows - 1, s, a.causal);
  for (int j0 = 0; j0 < kend; j0 += BT) {
    const int64_t koff = (s.k0 + j0) * ldk + hk * D;
    const int krows = (int)min64(BT, s.lk - j0);
    __syncthreads(); // the previous key tile is done with K, V, S, dP (and di is written)
    gen_load(Ks, LD, k + koff, ldk, krows, BT, D, DP);
    gen_load(Vs, LD, v + koff, ldk, krows, BT, D, DP);
    __syncthreads();
    tile_mm(Ss, LDS, Qs, LD, 1, Ks, 1, LD, BT, BT, D, nullptr, false);   // S = Q K^T
    tile_mm(dPs, LDS, dOs, LD, 1, Vs, 1, LD, BT, BT, D, nullptr, false); // dP = dO V^T
    __syncthreads();
    for (int e = threadIdx.x; e < BT * BT; e += blockDim.x) { // dS in dPs
      const int r = e / BT, c = e % BT;
      const bool vis = visible(i0 + r, j0 + c, s, a.causal);
      const float p = vis ? exp2f(Ss[r * LDS + c] * a.s2 - lse2[r]) : 0.0f;
      dPs[r * LDS + c] = p * (dPs[r * LDS + c] - di[r]);
    }
    __syncthreads();
    tile_mm(dQs, LD, dPs, LDS, 1, Ks, LD, 1, BT, DP, BT, nullptr, true); // dQ += dS K
  }
  __syncthreads();
  gen_store(dq + qoff, ldq, dQs, LD, rows, D, nullptr, a.scale);
}

// ---------------------------------------------------------------------------------------------
// Tensor-core kernels (bf16). Every warp owns 16 rows of the block's 64-row tile. Products are
// wmma 16x16x16 bf16 with f32 accumulators. wmma leaves the place of a matrix element inside an
// accumulator fragment unspecified but the same for every fragment of one type; loading a 16 x
// 16 matrix whose entries are their own row (column) numbers into a fragment tells each lane the
// row (column) of each of its elements x[i], for masking and per-row scaling in registers.

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> FragA;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> FragB;  // B (k, n)
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> FragBT; // X^T, X (n, k)
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragC;
constexpr int kFragElems = FragC::num_elements; // accumulator elements per lane

// erow[i], ecol[i] = the row and column of element x[i] of every accumulator fragment, from the
// index matrices (fill_index_matrices; cols may be NULL). The whole warp calls.
__device__ void element_places(const float *rows, const float *cols, int *erow, int *ecol) {
  FragC f;
  wmma::load_matrix_sync(f, rows, 16, wmma::mem_row_major);
#pragma unroll
  for (int i = 0; i < kFragElems; i++) {
    erow[i] = (int)f.x[i];
  }
  if (cols) {
    wmma::load_matrix_sync(f, cols, 16, wmma::mem_row_major);
#pragma unroll
    for (int i = 0; i < kFragElems; i++) {
      ecol[i] = (int)f.x[i];
    }
  }
}

__host__ __device__ constexpr bool tc_head_dim(int D) {
  return D == 32 || D == 64 || D == 128;
}

// rows[e] = e / 16 and cols[e] = e % 16 (16 x 16 each); every thread of the block calls.
__device__ void fill_index_matrices(float *rows, float *cols) {
  for (int e = threadIdx.x; e < 256; e += blockDim.x) {
    rows[e] = (float)(e / 16);
    if (cols) {
      cols[e] = (float)(e % 16);
    }
  }
}

// Two bf16 in a 32-bit word, the first element in the low half (little endian), as floats:
// exact, a bf16 is the top half of an f32.
__device__ __forceinline__ float bf16_lo(uint32_t w) {
  return __uint_as_float(w << 16);
}
__device__ __forceinline__ float bf16_hi(uint32_t w) {
  return __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
         (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16;
}

// Rows [0, tile_rows) of a bf16 tile in shared memory (row stride ld): row r < nrows is row r of
// src (row stride src_ld), the rest zeros; 16-byte chunks, threads tid, tid + nthr, ...
template <int D>
__device__ void stage_bf16(bf16 *dst, int ld, const bf16 *src, int64_t src_ld, int nrows,
                           int tile_rows, int tid, int nthr) {
  constexpr int kChunks = D / 8;
  for (int e = tid; e < tile_rows * kChunks; e += nthr) {
    const int r = e / kChunks, c = e % kChunks;
    uint4 x = make_uint4(0u, 0u, 0u, 0u);
    if (r < nrows) {
      x = *reinterpret_cast<const uint4 *>(src + r * src_ld + c * 8);
    }
    *reinterpret_cast<uint4 *>(dst + r * ld + c * 8) = x;
  }
}

// stage_bf16 of dO that also writes partial[r * D/8 + c] = the dot product of chunk c of row r
// of dO with the same chunk of O (0 past nrows); sum_partials adds them up per row.
template <int D>
__device__ void stage_bf16_dot(bf16 *dst, int ld, float *partial, const bf16 *src, const bf16 *o,
                               int64_t src_ld, int nrows, int tile_rows) {
  constexpr int kChunks = D / 8;
  for (int e = threadIdx.x; e < tile_rows * kChunks; e += blockDim.x) {
    const int r = e / kChunks, c = e % kChunks;
    uint4 x = make_uint4(0u, 0u, 0u, 0u);
    float dot = 0.0f;
    if (r < nrows) {
      x = *reinterpret_cast<const uint4 *>(src + r * src_ld + c * 8);
      const uint4 y = *reinterpret_cast<const uint4 *>(o + r * src_ld + c * 8);
      const uint32_t xw[4] = {x.x, x.y, x.z, x.w}, yw[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
      for (int i = 0; i < 4; i++) { // elements 2i (low half) and 2i + 1
        dot = fmaf(bf16_lo(xw[i]), bf16_lo(yw[i]), dot);
        dot = fmaf(bf16_hi(xw[i]), bf16_hi(yw[i]), dot);
      }
    }
    *reinterpret_cast<uint4 *>(dst + r * ld + c * 8) = x;
    partial[r * kChunks + c] = dot;
  }
}

// di[r] = sum of partial[r, 0 .. D/8) in order: Di = rowsum(dO * O), the same bits in both kernels.
template <int D> __device__ void sum_partials(float *di, const float *partial, int tile_rows) {
  constexpr int kChunks = D / 8;
  for (int r = threadIdx.x; r < tile_rows; r += blockDim.x) {
    float sum = 0.0f;
    for (int c = 0; c < kChunks; c++) {
      sum += partial[r * kChunks + c];
    }
    di[r] = sum;
  }
}

// Rows [0, nrows) of a 16 x 16 fragment to dst (row stride dst_ld), rounded to bf16, through the
// warp's 256-float scratch; each lane writes 8 elements (16 bytes) of one row.
__device__ void store_frag_bf16(bf16 *dst, int64_t dst_ld, const FragC &f, float *scratch,
                                int nrows, int lane) {
  wmma::store_matrix_sync(scratch, f, 16, wmma::mem_row_major);
  __syncwarp();
  const int r = lane / 2, c = (lane % 2) * 8;
  if (r < nrows) {
    const float *x = scratch + r * 16 + c;
    const uint4 u = make_uint4(pack_bf16x2(x[0], x[1]), pack_bf16x2(x[2], x[3]),
                               pack_bf16x2(x[4], x[5]), pack_bf16x2(x[6], x[7]));
    *reinterpret_cast<uint4 *>(dst + r * dst_ld + c) = u;
  }
  __syncwarp();
}

// Forward shared memory: K and V tiles, the row-index matrix, then per warp its scores (which
// first stage its Q rows and last stage its output), its probabilities and 16 row factors.
template <int D> struct TcFwd {
  static constexpr int BR = 16 * kWarps; // query rows per block
  static constexpr int BC = 64;          // key rows per tile
  static constexpr int LDK = D + 8;      // bf16 row stride of K, V, Q (+16 bytes: no conflicts)
  static constexpr int LDS = BC + 4;     // f32 row stride of a warp's scores
  static constexpr int LDP = BC + 8;     // bf16 row stride of a warp's probabilities
  static constexpr int KV_BYTES = align128(BC * LDK * 2);
  static constexpr int STAGE_BYTES = align128(imax(imax(16 * LDS * 4, 16 * LDK * 2), 256 * 4));
  static constexpr int P_BYTES = align128(16 * LDP * 2);
  static constexpr int ROW_BYTES = 128;
  static constexpr int K_OFF = 0, V_OFF = KV_BYTES, IDX_OFF = 2 * KV_BYTES;
  static constexpr int WARP_OFF = IDX_OFF + 1024;
  static constexpr int WARP_BYTES = STAGE_BYTES + P_BYTES + ROW_BYTES;
  static constexpr int SMEM = WARP_OFF + kWarps * WARP_BYTES;
  static_assert(SMEM <= kMaxSmem, "tensor-core forward tiles exceed the shared memory budget");
};

// Forward: block (query tile, head, sequence), the longest causal tiles first. Per key tile:
// S = Q K^T to shared memory, online softmax by two lanes a row, O = alpha O + P V in registers.
template <int D>
__global__ void __launch_bounds__(kThreads)
    tc_fwd_kernel(AttnArgs a, bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v) {
  typedef TcFwd<D> L;
  extern __shared__ __align__(128) unsigned char smem[];
  const SeqInfo s = seq_info(a);
  const int h = blockIdx.y;
  const int64_t i0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * L::BR;
  if (i0 >= s.lq) {
    return;
  }
  const int rows = (int)min64(L::BR, s.lq - i0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r0 = warp * 16;                                  // the warp's first row in the tile
  const int wrows = (int)max64(0, min64(16, rows - r0));     // of which in the sequence
  bf16 *Ks = reinterpret_cast<bf16 *>(smem + L::K_OFF);      // (BC, LDK)
  bf16 *Vs = reinterpret_cast<bf16 *>(smem + L::V_OFF);      // (BC, LDK)
  float *idx = reinterpret_cast<float *>(smem + L::IDX_OFF); // (16, 16)
  unsigned char *wsm = smem + L::WARP_OFF + warp * L::WARP_BYTES;
  float *Sw = reinterpret_cast<float *>(wsm);                                 // (16, LDS)
  bf16 *Pw = reinterpret_cast<bf16 *>(wsm + L::STAGE_BYTES);                  // (16, LDP)
  float *roww = reinterpret_cast<float *>(wsm + L::STAGE_BYTES + L::P_BYTES); // (16)
  const int64_t ldq = (int64_t)a.H * D, ldk = (int64_t)a.H_kv * D;
  const int64_t hk = h / (a.H / a.H_kv);
  const int64_t qoff = (s.q0 + i0 + r0) * ldq + (int64_t)h * D; // the warp's rows, head h

  fill_index_matrices(idx, nullptr);
  bf16 *Qw = reinterpret_cast<bf16 *>(Sw); // (16, LDK): the warp's Q rows, then fragments
  stage_bf16<D>(Qw, L::LDK, q + qoff, ldq, wrows, 16, lane, 32);
  __syncwarp();
  FragA qf[D / 16];
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    wmma::load_matrix_sync(qf[kk], Qw + kk * 16, L::LDK);
  }
  FragC of[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; n++) {
    wmma::fill_fragment(of[n], 0.0f);
  }
  __syncthreads(); // idx is written; each warp is done with its Q staging before scores land
  int erow[kFragElems];
  element_places(idx, nullptr, erow, nullptr);

  // Softmax lanes: lanes sr and sr + 16 share row sr of the warp (columns 2t and 2t + 1); both
  // keep the row's running maximum m and sum l (base 2).
  const int sr = lane % 16, half = lane / 16;
  const int row_end = sr < wrows ? keys_seen(i0 + r0 + sr, s, a.causal) : 0;
  float m = -INFINITY, l = 0.0f;
  const int kend = keys_seen(i0 + rows - 1, s, a.causal); // later key tiles are fully masked
  for (int j0 = 0; j0 < kend; j0 += L::BC) {
    const int64_t koff = (s.k0 + j0) * ldk + hk * D;
    const int krows = (int)min64(L::BC, s.lk - j0);
    stage_bf16<D>(Ks, L::LDK, k + koff, ldk, krows, L::BC, threadIdx.x, kThreads);
    stage_bf16<D>(Vs, L::LDK, v + koff, ldk, krows, L::BC, threadIdx.x, kThreads);
    __syncthreads();
#pragma unroll
    for (int n = 0; n < L::BC / 16; n++) { // S = Q K^T, 16 keys at a time
      FragC sf;
      wmma::fill_fragment(sf, 0.0f);
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) {
        FragBT kb;
        wmma::load_matrix_sync(kb, Ks + n * 16 * L::LDK + kk * 16, L::LDK);
        wmma::mma_sync(sf, qf[kk], kb, sf);
      }
      wmma::store_matrix_sync(Sw + n * 16, sf, L::LDS, wmma::mem_row_major);
    }
    __syncwarp();
    const int end = row_end - j0; // the row sees columns [0, end) of this tile
    const float *srow = Sw + sr * L::LDS;
    float mx = -INFINITY;
    for (int t = 0; t < L::BC / 2; t++) {
      const int c = 2 * t + half;
      if (c < end) {
        mx = fmaxf(mx, srow[c] * a.s2);
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
    const float m_new = fmaxf(m, mx);
    const bool live = m_new != -INFINITY; // the row has seen a key
    bf16 *prow = Pw + sr * L::LDP;
    float sum = 0.0f;
    for (int t = 0; t < L::BC / 2; t++) {
      const int c = 2 * t + half;
      const float p = live && c < end ? exp2f(srow[c] * a.s2 - m_new) : 0.0f;
      sum += p;
      prow[c] = __float2bfloat16_rn(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 16);
    const float alpha = live ? exp2f(m - m_new) : 1.0f; // m = -inf: 0
    l = l * alpha + sum;
    m = m_new;
    if (half == 0) {
      roww[sr] = alpha;
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kFragElems; i++) { // O *= alpha of each element's row
      const float al = roww[erow[i]];
#pragma unroll
      for (int n = 0; n < D / 16; n++) {
        of[n].x[i] *= al;
      }
    }
#pragma unroll
    for (int kk = 0; kk < L::BC / 16; kk++) { // O += P V
      FragA pf;
      wmma::load_matrix_sync(pf, Pw + kk * 16, L::LDP);
#pragma unroll
      for (int n = 0; n < D / 16; n++) {
        FragB vb;
        wmma::load_matrix_sync(vb, Vs + kk * 16 * L::LDK + n * 16, L::LDK);
        wmma::mma_sync(of[n], pf, vb, of[n]);
      }
    }
    __syncthreads(); // the next tile rewrites K, V, S and P
  }

  // out = O / l, lse = (m + log2 l) ln 2; rows without keys get 0 and -inf.
  if (half == 0) {
    roww[sr] = l > 0.0f ? 1.0f / l : 0.0f;
    if (sr < wrows) {
      lse[h * s.total_q + s.q0 + i0 + r0 + sr] = l > 0.0f ? (m + log2f(l)) * kLn2 : -INFINITY;
    }
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < kFragElems; i++) {
    const float inv = roww[erow[i]];
#pragma unroll
    for (int n = 0; n < D / 16; n++) {
      of[n].x[i] *= inv;
    }
  }
#pragma unroll
  for (int n = 0; n < D / 16; n++) {
    store_frag_bf16(out + qoff + n * 16, ldq, of[n], Sw, wrows, lane);
  }
}

// Backward shared memory: K, V, Q, dO tiles (64 rows each), lse2 and di of the query tile, the
// partial dot products of Di, the row- and column-index matrices, then per warp two 16 x 64
// bf16 tiles (P^T and dS^T in the dK/dV kernel, dS in the dQ kernel) and a 256-float scratch.
template <int D> struct TcBwd {
  static constexpr int BR = 16 * kWarps; // query rows per tile
  static constexpr int BC = 16 * kWarps; // key rows per tile
  static constexpr int LDK = D + 8;      // bf16 row stride of K, V, Q, dO
  static constexpr int LDP = 64 + 8;     // bf16 row stride of the warp tiles
  static constexpr int CHUNKS = D / 8;   // 16-byte chunks per row
  static constexpr int TILE_BYTES = align128(64 * LDK * 2);
  static constexpr int K_OFF = 0, V_OFF = TILE_BYTES, Q_OFF = 2 * TILE_BYTES;
  static constexpr int DO_OFF = 3 * TILE_BYTES, LSE_OFF = 4 * TILE_BYTES;
  static constexpr int DI_OFF = LSE_OFF + align128(BR * 4), PART_OFF = DI_OFF + align128(BR * 4);
  static constexpr int IDX_OFF = PART_OFF + align128(BR * CHUNKS * 4);
  static constexpr int WARP_OFF = IDX_OFF + 2 * 1024;
  static constexpr int WTILE_BYTES = align128(16 * LDP * 2);
  static constexpr int WARP_BYTES = 2 * WTILE_BYTES + 1024;
  static constexpr int SMEM = WARP_OFF + kWarps * WARP_BYTES;
  static_assert(BR == 64 && BC == 64, "the warp tiles are 16 x 64");
  static_assert(SMEM <= kMaxSmem, "tensor-core backward tiles exceed the shared memory budget");
};

// Backward dK, dV: block (key tile, key/value head, sequence); each warp owns 16 keys and keeps
// their dK, dV in registers while it walks the group's query heads in order and the query tiles
// that see the key tile: P^T = 2^(s2 K Q^T - lse2), dP^T = V dO^T, dS^T = P^T (dP^T - Di),
// dV += P^T dO, dK += dS^T Q; dK is scaled once at the end.
template <int D>
__global__ void __launch_bounds__(kThreads)
    tc_bwd_dkdv_kernel(AttnArgs a, bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q,
                       const bf16 *k, const bf16 *v, const bf16 *out, const float *lse) {
  typedef TcBwd<D> L;
  extern __shared__ __align__(128) unsigned char smem[];
  const SeqInfo s = seq_info(a);
  const int hk = blockIdx.y;
  const int64_t j0 = (int64_t)blockIdx.x * L::BC;
  if (j0 >= s.lk) {
    return;
  }
  const int cols = (int)min64(L::BC, s.lk - j0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int c0 = warp * 16;                                    // the warp's first key in the tile
  const int wcols = (int)max64(0, min64(16, cols - c0));       // of which in the sequence
  bf16 *Ks = reinterpret_cast<bf16 *>(smem + L::K_OFF);        // (BC, LDK)
  bf16 *Vs = reinterpret_cast<bf16 *>(smem + L::V_OFF);        // (BC, LDK)
  bf16 *Qs = reinterpret_cast<bf16 *>(smem + L::Q_OFF);        // (BR, LDK)
  bf16 *dOs = reinterpret_cast<bf16 *>(smem + L::DO_OFF);      // (BR, LDK)
  float *lse2 = reinterpret_cast<float *>(smem + L::LSE_OFF);  // (BR)
  float *di = reinterpret_cast<float *>(smem + L::DI_OFF);     // (BR)
  float *part = reinterpret_cast<float *>(smem + L::PART_OFF); // (BR, CHUNKS)
  float *ridx_m = reinterpret_cast<float *>(smem + L::IDX_OFF), *cidx_m = ridx_m + 256;
  unsigned char *wsm = smem + L::WARP_OFF + warp * L::WARP_BYTES;
  bf16 *PTw = reinterpret_cast<bf16 *>(wsm);                            // (16, LDP)
  bf16 *dSTw = reinterpret_cast<bf16 *>(wsm + L::WTILE_BYTES);          // (16, LDP)
  float *scratch = reinterpret_cast<float *>(wsm + 2 * L::WTILE_BYTES); // (16, 16)
  const int64_t ldq = (int64_t)a.H * D, ldk = (int64_t)a.H_kv * D;
  const int64_t koff = (s.k0 + j0) * ldk + (int64_t)hk * D;

  fill_index_matrices(ridx_m, cidx_m);
  stage_bf16<D>(Ks, L::LDK, k + koff, ldk, cols, L::BC, threadIdx.x, kThreads);
  stage_bf16<D>(Vs, L::LDK, v + koff, ldk, cols, L::BC, threadIdx.x, kThreads);
  FragC dkf[D / 16], dvf[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; n++) {
    wmma::fill_fragment(dkf[n], 0.0f);
    wmma::fill_fragment(dvf[n], 0.0f);
  }
  __syncthreads();
  int erow[kFragElems], ecol[kFragElems];
  element_places(ridx_m, cidx_m, erow, ecol);

  const int group = a.H / a.H_kv;
  for (int h = hk * group; h < (hk + 1) * group; h++) {
    for (int64_t i0 = first_query(j0, s, a.causal); i0 < s.lq; i0 += L::BR) {
      const int rows = (int)min64(L::BR, s.lq - i0);
      const int64_t qoff = (s.q0 + i0) * ldq + (int64_t)h * D;
      __syncthreads(); // the previous query tile is done with Q, dO, lse2, di, the warp tiles
      stage_bf16<D>(Qs, L::LDK, q + qoff, ldq, rows, L::BR, threadIdx.x, kThreads);
      stage_bf16_dot<D>(dOs, L::LDK, part, dout + qoff, out + qoff, ldq, rows, L::BR);
      for (int r = threadIdx.x; r < L::BR; r += kThreads) {
        lse2[r] = r < rows ? lse_base2(lse[h * s.total_q + s.q0 + i0 + r]) : INFINITY;
      }
      __syncthreads();
      sum_partials<D>(di, part, L::BR);
      __syncthreads();
#pragma unroll 1
      for (int n = 0; n < L::BR / 16; n++) { // 16 queries at a time
        FragC sf, dpf;
        wmma::fill_fragment(sf, 0.0f);
        wmma::fill_fragment(dpf, 0.0f);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
          FragA xa;
          FragBT yb;
          wmma::load_matrix_sync(xa, Ks + c0 * L::LDK + kk * 16, L::LDK);
          wmma::load_matrix_sync(yb, Qs + n * 16 * L::LDK + kk * 16, L::LDK);
          wmma::mma_sync(sf, xa, yb, sf); // S^T = K Q^T
          wmma::load_matrix_sync(xa, Vs + c0 * L::LDK + kk * 16, L::LDK);
          wmma::load_matrix_sync(yb, dOs + n * 16 * L::LDK + kk * 16, L::LDK);
          wmma::mma_sync(dpf, xa, yb, dpf); // dP^T = V dO^T
        }
#pragma unroll
        for (int i = 0; i < kFragElems; i++) {
          const int kr = erow[i], qc = n * 16 + ecol[i];
          const bool vis = visible(i0 + qc, j0 + c0 + kr, s, a.causal);
          const float p = vis ? exp2f(sf.x[i] * a.s2 - lse2[qc]) : 0.0f;
          const float ds = p * (dpf.x[i] - di[qc]);
          PTw[kr * L::LDP + qc] = __float2bfloat16_rn(p);
          dSTw[kr * L::LDP + qc] = __float2bfloat16_rn(ds);
        }
      }
      __syncwarp();
#pragma unroll 1
      for (int kk = 0; kk < L::BR / 16; kk++) {
        FragA pa, da;
        wmma::load_matrix_sync(pa, PTw + kk * 16, L::LDP);
        wmma::load_matrix_sync(da, dSTw + kk * 16, L::LDP);
#pragma unroll
        for (int n = 0; n < D / 16; n++) {
          FragB yb;
          wmma::load_matrix_sync(yb, dOs + kk * 16 * L::LDK + n * 16, L::LDK);
          wmma::mma_sync(dvf[n], pa, yb, dvf[n]); // dV += P^T dO
          wmma::load_matrix_sync(yb, Qs + kk * 16 * L::LDK + n * 16, L::LDK);
          wmma::mma_sync(dkf[n], da, yb, dkf[n]); // dK += dS^T Q
        }
      }
    }
  }
#pragma unroll
  for (int n = 0; n < D / 16; n++) {
#pragma unroll
    for (int i = 0; i < kFragElems; i++) {
      dkf[n].x[i] *= a.scale;
    }
  }
  const int64_t woff = koff + c0 * ldk; // the warp's first key
#pragma unroll
  for (int n = 0; n < D / 16; n++) {
    store_frag_bf16(dk + woff + n * 16, ldk, dkf[n], scratch, wcols, lane);
    store_frag_bf16(dv + woff + n * 16, ldk, dvf[n], scratch, wcols, lane);
  }
}

// Backward dQ: block (query tile, head, sequence), the longest causal tiles first; each warp
// keeps its 16 rows of Q, dO (fragments) and dQ (accumulators) in registers over the key tiles:
// P = 2^(s2 Q K^T - lse2), dP = dO V^T, dS = P (dP - Di), dQ += dS K; scaled once at the end.
template <int D>
__global__ void __launch_bounds__(kThreads)
    tc_bwd_dq_kernel(AttnArgs a, bf16 *dq, const bf16 *dout, const bf16 *q, const bf16 *k,
                     const bf16 *v, const bf16 *out, const float *lse) {
  typedef TcBwd<D> L;
  extern __shared__ __align__(128) unsigned char smem[];
  const SeqInfo s = seq_info(a);
  const int h = blockIdx.y;
  const int64_t i0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * L::BR;
  if (i0 >= s.lq) {
    return;
  }
  const int rows = (int)min64(L::BR, s.lq - i0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r0 = warp * 16;
  const int wrows = (int)max64(0, min64(16, rows - r0));
  bf16 *Ks = reinterpret_cast<bf16 *>(smem + L::K_OFF);
  bf16 *Vs = reinterpret_cast<bf16 *>(smem + L::V_OFF);
  bf16 *Qs = reinterpret_cast<bf16 *>(smem + L::Q_OFF);
  bf16 *dOs = reinterpret_cast<bf16 *>(smem + L::DO_OFF);
  float *lse2 = reinterpret_cast<float *>(smem + L::LSE_OFF);
  float *di = reinterpret_cast<float *>(smem + L::DI_OFF);
  float *part = reinterpret_cast<float *>(smem + L::PART_OFF);
  float *ridx_m = reinterpret_cast<float *>(smem + L::IDX_OFF), *cidx_m = ridx_m + 256;
  unsigned char *wsm = smem + L::WARP_OFF + warp * L::WARP_BYTES;
  bf16 *dSw = reinterpret_cast<bf16 *>(wsm);                            // (16, LDP)
  float *scratch = reinterpret_cast<float *>(wsm + 2 * L::WTILE_BYTES); // (16, 16)
  const int64_t ldq = (int64_t)a.H * D, ldk = (int64_t)a.H_kv * D;
  const int64_t hk = h / (a.H / a.H_kv);
  const int64_t qoff = (s.q0 + i0) * ldq + (int64_t)h * D;

  fill_index_matrices(ridx_m, cidx_m);
  stage_bf16<D>(Qs, L::LDK, q + qoff, ldq, rows, L::BR, threadIdx.x, kThreads);
  stage_bf16_dot<D>(dOs, L::LDK, part, dout + qoff, out + qoff, ldq, rows, L::BR);
  for (int r = threadIdx.x; r < L::BR; r += kThreads) {
    lse2[r] = r < rows ? lse_base2(lse[h * s.total_q + s.q0 + i0 + r]) : INFINITY;
  }
  __syncthreads();
  sum_partials<D>(di, part, L::BR);
  int erow[kFragElems], ecol[kFragElems];
  element_places(ridx_m, cidx_m, erow, ecol);
  FragA qa[D / 16], oa[D / 16];
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    wmma::load_matrix_sync(qa[kk], Qs + r0 * L::LDK + kk * 16, L::LDK);
    wmma::load_matrix_sync(oa[kk], dOs + r0 * L::LDK + kk * 16, L::LDK);
  }
  FragC dqf[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; n++) {
    wmma::fill_fragment(dqf[n], 0.0f);
  }
  __syncthreads(); // di is written

  const int kend = keys_seen(i0 + rows - 1, s, a.causal); // later key tiles are fully masked
  for (int j0 = 0; j0 < kend; j0 += L::BC) {
    const int64_t koff = (s.k0 + j0) * ldk + hk * D;
    const int krows = (int)min64(L::BC, s.lk - j0);
    stage_bf16<D>(Ks, L::LDK, k + koff, ldk, krows, L::BC, threadIdx.x, kThreads);
    stage_bf16<D>(Vs, L::LDK, v + koff, ldk, krows, L::BC, threadIdx.x, kThreads);
    __syncthreads();
#pragma unroll 1
    for (int n = 0; n < L::BC / 16; n++) { // 16 keys at a time
      FragC sf, dpf;
      wmma::fill_fragment(sf, 0.0f);
      wmma::fill_fragment(dpf, 0.0f);
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) {
        FragBT yb;
        wmma::load_matrix_sync(yb, Ks + n * 16 * L::LDK + kk * 16, L::LDK);
        wmma::mma_sync(sf, qa[kk], yb, sf); // S = Q K^T
        wmma::load_matrix_sync(yb, Vs + n * 16 * L::LDK + kk * 16, L::LDK);
        wmma::mma_sync(dpf, oa[kk], yb, dpf); // dP = dO V^T
      }
#pragma unroll
      for (int i = 0; i < kFragElems; i++) {
        const int rr = erow[i], kc = n * 16 + ecol[i];
        const bool vis = visible(i0 + r0 + rr, j0 + kc, s, a.causal);
        const float p = vis ? exp2f(sf.x[i] * a.s2 - lse2[r0 + rr]) : 0.0f;
        dSw[rr * L::LDP + kc] = __float2bfloat16_rn(p * (dpf.x[i] - di[r0 + rr]));
      }
    }
    __syncwarp();
#pragma unroll 1
    for (int kk = 0; kk < L::BC / 16; kk++) { // dQ += dS K
      FragA da;
      wmma::load_matrix_sync(da, dSw + kk * 16, L::LDP);
#pragma unroll
      for (int n = 0; n < D / 16; n++) {
        FragB kb;
        wmma::load_matrix_sync(kb, Ks + kk * 16 * L::LDK + n * 16, L::LDK);
        wmma::mma_sync(dqf[n], da, kb, dqf[n]);
      }
    }
    __syncthreads(); // the next tile rewrites K, V and dS
  }
#pragma unroll
  for (int n = 0; n < D / 16; n++) {
#pragma unroll
    for (int i = 0; i < kFragElems; i++) {
      dqf[n].x[i] *= a.scale;
    }
    store_frag_bf16(dq + qoff + r0 * ldq + n * 16, ldq, dqf[n], scratch, wrows, lane);
  }
}

// ---------------------------------------------------------------------------------------------
// Host side: choose the kernels, allow their shared memory, launch over chunks of sequences.

bool aligned16(const void *p) {
  return ((uintptr_t)p & 15u) == 0;
}

unsigned tiles_of(int len, int tile) {
  return (unsigned)(((int64_t)len + tile - 1) / tile);
}

// Launch kernel on grid (tiles, heads, sequences) with `smem` bytes of dynamic shared memory;
// sequences go in launches of at most 65535 (gridDim.z).
template <typename... KArgs, typename... Args>
loom_status_t launch_seqs(void (*kernel)(AttnArgs, KArgs...), const char *name, AttnArgs a,
                          unsigned tiles, int heads, size_t smem, Args... args) {
  loom_status_t status = LOOM_OK;
  if (smem > (size_t)kDefaultSmem) {
    cudaError_t rc =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (rc != cudaSuccess) {
      return loom_error(NULL, LOOM_ERR_CUDA,
                        "%s: allowing %zu bytes of shared memory per block failed: %s (%s)", name,
                        smem, cudaGetErrorString(rc), cudaGetErrorName(rc));
    }
  }
  for (int64_t b0 = 0; b0 < a.B; b0 += kMaxGridYZ) {
    a.b0 = (int)b0;
    const unsigned nb = (unsigned)min64(a.B - b0, kMaxGridYZ);
    kernel<<<dim3(tiles, (unsigned)heads, nb), kThreads, smem, loom_cuda_stream()>>>(a, args...);
    if ((status = loom_cuda_launch_check(name)) != LOOM_OK) {
      return status;
    }
  }
  return LOOM_OK;
}

loom_status_t check_config(const char *op, loom_dtype_t dtype, int H, int H_kv, int D) {
  if (dtype != LOOM_F32 && dtype != LOOM_BF16) {
    return loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                      "%s: dtype %d: the CUDA attention kernels take f32 or bf16 tensors", op,
                      (int)dtype);
  }
  if (D < 1 || D > kMaxHeadDim) {
    return loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                      "%s: head size D=%d is not supported on CUDA: bf16 tensor-core kernels take "
                      "D = 32, 64 or 128, the FMA kernels any D from 1 to %d",
                      op, D, kMaxHeadDim);
  }
  if (H < 1 || H_kv < 1 || H > kMaxGridYZ || H % H_kv != 0) {
    return loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                      "%s: H=%d query heads, H_kv=%d key/value heads: the CUDA kernels need "
                      "1 <= H_kv, H <= %d and H a multiple of H_kv",
                      op, H, H_kv, kMaxGridYZ);
  }
  return LOOM_OK;
}

AttnArgs make_args(const int32_t *cu_q, const int32_t *cu_k, int B, int H, int H_kv, int D,
                   int causal, float scale) {
  AttnArgs a;
  a.cu_q = cu_q;
  a.cu_k = cu_k;
  a.B = B;
  a.b0 = 0;
  a.H = H;
  a.H_kv = H_kv;
  a.D = D;
  a.causal = causal != 0;
  a.scale = scale > 0.0f ? scale : 1.0f / sqrtf((float)D);
  a.s2 = a.scale * kLog2e;
  return a;
}

template <int D>
loom_status_t tc_fwd(const AttnArgs &a, int max_q, bf16 *out, float *lse, const bf16 *q,
                     const bf16 *k, const bf16 *v) {
  typedef TcFwd<D> L;
  return launch_seqs(tc_fwd_kernel<D>, "attention forward (bf16 tensor cores)", a,
                     tiles_of(max_q, L::BR), a.H, (size_t)L::SMEM, out, lse, q, k, v);
}

template <typename T, int BT>
loom_status_t gen_fwd(const AttnArgs &a, int max_q, T *out, float *lse, const T *q, const T *k,
                      const T *v) {
  return launch_seqs(gen_fwd_kernel<T, BT>, "attention forward (FMA)", a, tiles_of(max_q, BT), a.H,
                     gen_fwd_smem(a.D, BT), out, lse, q, k, v);
}

template <int D>
loom_status_t tc_bwd(const AttnArgs &a, int max_q, int max_k, bf16 *dq, bf16 *dk, bf16 *dv,
                     const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *out,
                     const float *lse) {
  typedef TcBwd<D> L;
  loom_status_t status = LOOM_OK;
  if (max_k > 0) {
    status = launch_seqs(tc_bwd_dkdv_kernel<D>, "attention backward dK dV (bf16 tensor cores)", a,
                         tiles_of(max_k, L::BC), a.H_kv, (size_t)L::SMEM, dk, dv, dout, q, k, v,
                         out, lse);
  }
  if (status == LOOM_OK && max_q > 0) {
    status = launch_seqs(tc_bwd_dq_kernel<D>, "attention backward dQ (bf16 tensor cores)", a,
                         tiles_of(max_q, L::BR), a.H, (size_t)L::SMEM, dq, dout, q, k, v, out, lse);
  }
  return status;
}

template <typename T, int BT>
loom_status_t gen_bwd(const AttnArgs &a, int max_q, int max_k, T *dq, T *dk, T *dv, const T *dout,
                      const T *q, const T *k, const T *v, const T *out, const float *lse) {
  loom_status_t status = LOOM_OK;
  if (max_k > 0) {
    status = launch_seqs(gen_bwd_dkdv_kernel<T, BT>, "attention backward dK dV (FMA)", a,
                         tiles_of(max_k, BT), a.H_kv, gen_bwd_smem(a.D, BT), dk, dv, dout, q, k, v,
                         out, lse);
  }
  if (status == LOOM_OK && max_q > 0) {
    status =
        launch_seqs(gen_bwd_dq_kernel<T, BT>, "attention backward dQ (FMA)", a, tiles_of(max_q, BT),
                    a.H, gen_bwd_smem(a.D, BT), dq, dout, q, k, v, out, lse);
  }
  return status;
}

template <typename T>
loom_status_t gen_fwd_any(const AttnArgs &a, int max_q, void *out, float *lse, const void *q,
                          const void *k, const void *v) {
  T *o = static_cast<T *>(out);
  const T *qq = static_cast<const T *>(q), *kk = static_cast<const T *>(k),
          *vv = static_cast<const T *>(v);
  return gen_tile(a.D) == 32 ? gen_fwd<T, 32>(a, max_q, o, lse, qq, kk, vv)
                             : gen_fwd<T, 16>(a, max_q, o, lse, qq, kk, vv);
}

template <typename T>
loom_status_t gen_bwd_any(const AttnArgs &a, int max_q, int max_k, void *dq, void *dk, void *dv,
                          const void *dout, const void *q, const void *k, const void *v,
                          const void *out, const float *lse) {
  T *g_q = static_cast<T *>(dq), *g_k = static_cast<T *>(dk), *g_v = static_cast<T *>(dv);
  const T *d_o = static_cast<const T *>(dout), *qq = static_cast<const T *>(q);
  const T *kk = static_cast<const T *>(k), *vv = static_cast<const T *>(v);
  const T *oo = static_cast<const T *>(out);
  return gen_tile(a.D) == 32
             ? gen_bwd<T, 32>(a, max_q, max_k, g_q, g_k, g_v, d_o, qq, kk, vv, oo, lse)
             : gen_bwd<T, 16>(a, max_q, max_k, g_q, g_k, g_v, d_o, qq, kk, vv, oo, lse);
}

} // namespace

extern "C" loom_status_t loom_cuda_attention_fwd(loom_dtype_t dtype, void *out, float *lse,
                                                 const void *q, const void *k, const void *v,
                                                 const int32_t *cu_q, const int32_t *cu_k, int B,
                                                 int max_q, int max_k, int H, int H_kv, int D,
                                                 int causal, float scale) {
  (void)max_k; // rows that see no key are written all the same
  if (B <= 0 || max_q <= 0) {
    return LOOM_OK; // no query rows: nothing to write
  }
  loom_status_t status = check_config("loom_cuda_attention_fwd", dtype, H, H_kv, D);
  if (status != LOOM_OK) {
    return status;
  }
  const AttnArgs a = make_args(cu_q, cu_k, B, H, H_kv, D, causal, scale);
  if (dtype == LOOM_BF16) {
    if (tc_head_dim(D) && aligned16(out) && aligned16(q) && aligned16(k) && aligned16(v)) {
      bf16 *o = static_cast<bf16 *>(out);
      const bf16 *qq = static_cast<const bf16 *>(q), *kk = static_cast<const bf16 *>(k),
                 *vv = static_cast<const bf16 *>(v);
      switch (D) {
      case 32:
        return tc_fwd<32>(a, max_q, o, lse, qq, kk, vv);
      case 64:
        return tc_fwd<64>(a, max_q, o, lse, qq, kk, vv);
      default:
        return tc_fwd<128>(a, max_q, o, lse, qq, kk, vv);
      }
    }
    return gen_fwd_any<bf16>(a, max_q, out, lse, q, k, v);
  }
  return gen_fwd_any<float>(a, max_q, out, lse, q, k, v);
}

extern "C" loom_status_t loom_cuda_attention_bwd(loom_dtype_t dtype, void *dq, void *dk, void *dv,
                                                 const void *dout, const void *q, const void *k,
                                                 const void *v, const void *out, const float *lse,
                                                 const int32_t *cu_q, const int32_t *cu_k, int B,
                                                 int max_q, int max_k, int H, int H_kv, int D,
                                                 int causal, float scale) {
  if (B <= 0 || (max_q <= 0 && max_k <= 0)) {
    return LOOM_OK; // no rows at all
  }
  loom_status_t status = check_config("loom_cuda_attention_bwd", dtype, H, H_kv, D);
  if (status != LOOM_OK) {
    return status;
  }
  const AttnArgs a = make_args(cu_q, cu_k, B, H, H_kv, D, causal, scale);
  if (dtype == LOOM_BF16) {
    const void *ptrs[8] = {dq, dk, dv, dout, q, k, v, out};
    bool aligned = tc_head_dim(D);
    for (int i = 0; i < 8; i++) {
      aligned = aligned && aligned16(ptrs[i]);
    }
    if (aligned) {
      bf16 *g_q = static_cast<bf16 *>(dq), *g_k = static_cast<bf16 *>(dk),
           *g_v = static_cast<bf16 *>(dv);
      const bf16 *d_o = static_cast<const bf16 *>(dout), *qq = static_cast<const bf16 *>(q);
      const bf16 *kk = static_cast<const bf16 *>(k), *vv = static_cast<const bf16 *>(v);
      const bf16 *oo = static_cast<const bf16 *>(out);
      switch (D) {
      case 32:
        return tc_bwd<32>(a, max_q, max_k, g_q, g_k, g_v, d_o, qq, kk, vv, oo, lse);
      case 64:
        return tc_bwd<64>(a, max_q, max_k, g_q, g_k, g_v, d_o, qq, kk, vv, oo, lse);
      default:
        return tc_bwd<128>(a, max_q, max_k, g_q, g_k, g_v, d_o, qq, kk, vv, oo, lse);
      }
    }
    return gen_bwd_any<bf16>(a, max_q, max_k, dq, dk, dv, dout, q, k, v, out, lse);
  }
  return gen_bwd_any<float>(a, max_q, max_k, dq, dk, dv, dout, q, k, v, out, lse);
}
