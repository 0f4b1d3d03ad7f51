/* attention_cuda.cu — CUDA varlen core attention (FlashAttention-2 tiles, online softmax in base 2,
 * bottom-right causal, LSE out): bf16 tensor-core (mma.sync) kernels for D = 32, 64, 128, FMA
 * others.
 */
#include "config.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
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
// - Tensor cores (bf16, D = 32, 64, 128, 16-byte aligned tensors): mma.sync m16n8k16 bf16
//   products with f32 accumulators, scores, softmax and gradients in registers; each warp owns 16
//   rows of the block's tile; K and V tiles stream in by cp.async, two stages. P and dS are
//   rounded to bf16 before their products (as FlashAttention does); softmax, sums and lse in f32.
// - FMA (f32 at any D <= 256, bf16 at the other D <= 256): square tiles of BT rows kept in
//   shared memory as f32, products by 4x4 register micro-tiles.
// D > 256 returns LOOM_ERR_UNSUPPORTED. The backward takes no scratch and no atomics: the FMA
// kernels compute Di = rowsum(dO * O) of the query tile they load (the same function in both
// kernels, so the same bits), the tensor-core path once, into dq's storage (see tc_bwd); dK and
// dV of a key tile come from one block that walks the group's query heads in order, dQ of a query
// tile from one block: deterministic.

namespace {

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
// Tensor-core kernels (bf16, sm_80+): mma.sync m16n8k16 with f32 accumulators, operands loaded
// from shared memory by ldmatrix, everything between the products in registers (FlashAttention-2
// style). Every warp owns 16 rows of the block's 64-row tile. Fragment layout (PTX ISA, g = lane
// / 4, t = lane % 4): an accumulator tile (16 x 8) holds c0, c1 at row g, columns 2t, 2t + 1 and
// c2, c3 at row g + 8; an A operand (16 x 16, bf16 pairs) holds rows g, g + 8 and columns 2t,
// 2t + 8; so two adjacent accumulator tiles, rounded to bf16, are the A operand of the next
// product (P and dS never leave registers). Row sums and maxima reduce over the 4 lanes of a quad.

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

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

// Four 8 x 8 bf16 matrices; lanes 8i .. 8i + 7 give the row addresses of matrix i, and lane
// (g, t) receives elements (g, 2t), (g, 2t + 1) of each (with .trans, (2t, g), (2t + 1, g)).
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const bf16 *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const bf16 *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// c (16 x 8, f32) += a (16 x 16, bf16) b (16 x 8, bf16; b0 rows 0-7, b1 rows 8-15).
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Where each lane points ldmatrix, for a 16 x 16 block at (r0, c0) of a row-major bf16 tile:
// - frag_a: the A operand of rows r0.. and columns c0.. (registers a0 .. a3);
// - frag_b: B (k, n) = X[n][k], X's rows r0.. being n (two 8-column B tiles: r[0..1], r[2..3]);
// - frag_bt: B (k, n) = X[k][n], X's rows r0.. being k (two B tiles, as frag_b).
__device__ __forceinline__ const bf16 *frag_a(const bf16 *x, int ld, int r0, int c0, int lane) {
  return x + (r0 + (lane & 15)) * ld + c0 + (lane >> 4) * 8;
}
__device__ __forceinline__ const bf16 *frag_b(const bf16 *x, int ld, int r0, int c0, int lane) {
  return x + (r0 + (lane & 7) + (lane >> 4) * 8) * ld + c0 + ((lane >> 3) & 1) * 8;
}
__device__ __forceinline__ const bf16 *frag_bt(const bf16 *x, int ld, int r0, int c0, int lane) {
  return x + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + c0 + (lane >> 4) * 8;
}

// The A operand (16 x 16) made of accumulator tiles c[0] (columns 0-7) and c[1] (8-15), in bf16.
__device__ __forceinline__ void acc_to_a(uint32_t a[4], const float c0[4], const float c1[4]) {
  a[0] = pack_bf16x2(c0[0], c0[1]);
  a[1] = pack_bf16x2(c0[2], c0[3]);
  a[2] = pack_bf16x2(c1[0], c1[1]);
  a[3] = pack_bf16x2(c1[2], c1[3]);
}

// f[kk] (and h[kk] unless h is null) = the A operand of rows r0 .. r0 + 15, columns 16 kk .., of
// the D-column tile x (of y).
template <int D>
__device__ __forceinline__ void load_rows_a(uint32_t f[D / 16][4], const bf16 *x, uint32_t (*h)[4],
                                            const bf16 *y, int ld, int r0, int lane) {
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    ldsm_x4(f[kk], frag_a(x, ld, r0, kk * 16, lane));
    if (h) {
      ldsm_x4(h[kk], frag_a(y, ld, r0, kk * 16, lane));
    }
  }
}

// N accumulator tiles of c (and of d unless d is null) set to zero.
template <int N> __device__ __forceinline__ void zero_acc(float c[N][4], float (*d)[4] = nullptr) {
#pragma unroll
  for (int n = 0; n < N; n++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      c[n][e] = 0.0f;
      if (d) {
        d[n][e] = 0.0f;
      }
    }
  }
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Asynchronous copies (cp.async, 16 bytes; a row past nrows is filled with zeros).
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of the groups committed last are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// A bf16 tile by cp.async, every thread of the block: rows [0, nrows) of src (nrows >= 1), zeros
// up to tile_rows; lands after cp_async_wait and a barrier.
template <int D>
__device__ void stage_async(bf16 *dst, int ld, const bf16 *src, int64_t src_ld, int nrows,
                            int tile_rows) {
  constexpr int kChunks = D / 8;
  for (int e = threadIdx.x; e < tile_rows * kChunks; e += blockDim.x) {
    const int r = e / kChunks, c = e % kChunks;
    const bool valid = r < nrows;
    cp_async16(dst + r * ld + c * 8, valid ? src + r * src_ld + c * 8 : src, valid);
  }
}

// Stores rows r and r + 8 (valid0, valid1) of a warp's 16 x D accumulators times `mul`, in bf16.
template <int D>
__device__ void store_rows_bf16(bf16 *dst0, bf16 *dst1, bool valid0, bool valid1,
                                const float acc[D / 8][4], float mul0, float mul1, int t) {
#pragma unroll
  for (int n = 0; n < D / 8; n++) {
    if (valid0) {
      *reinterpret_cast<uint32_t *>(dst0 + n * 8 + 2 * t) =
          pack_bf16x2(acc[n][0] * mul0, acc[n][1] * mul0);
    }
    if (valid1) {
      *reinterpret_cast<uint32_t *>(dst1 + n * 8 + 2 * t) =
          pack_bf16x2(acc[n][2] * mul1, acc[n][3] * mul1);
    }
  }
}

__host__ __device__ constexpr bool tc_head_dim(int D) {
  return D == 32 || D == 64 || D == 128;
}

// Forward shared memory: K and V tiles of two stages (the next tile loads while this one is
// used); Q passes through stage 1's K tile before the loop.
template <int D> struct TcFwd {
  static constexpr int BR = 16 * kWarps; // query rows per block
  static constexpr int BC = 64;          // key rows per tile
  static constexpr int LD = D + 8; // bf16 row stride (+16 bytes: ldmatrix rows in distinct banks)
  static constexpr int TILE = BC * LD; // elements per tile
  static constexpr int SMEM = 4 * TILE * 2;
  static_assert(BR == BC, "Q is staged in a key tile");
  static_assert(SMEM <= kMaxSmem, "tensor-core forward tiles exceed the shared memory budget");
};

// Forward: block (query tile, head, sequence), the longest causal tiles first. Per key tile:
// S = Q K^T, online softmax (base 2) and O = alpha O + P V, all in registers.
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
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int r0 = warp * 16;                     // the warp's first row in the tile
  bf16 *tiles = reinterpret_cast<bf16 *>(smem); // stage st: K at 2 st TILE, V at (2 st + 1) TILE
  const int64_t ldq = (int64_t)a.H * D, ldk = (int64_t)a.H_kv * D;
  const int64_t hk = h / (a.H / a.H_kv);
  const int kend = keys_seen(i0 + rows - 1, s, a.causal); // later key tiles are fully masked
  const int ntiles = (kend + L::BC - 1) / L::BC;

  bf16 *Qs = tiles + 2 * L::TILE;
  stage_async<D>(Qs, L::LD, q + (s.q0 + i0) * ldq + (int64_t)h * D, ldq, rows, L::BR);
  cp_async_commit();
  if (ntiles > 0) {
    const int64_t koff = s.k0 * ldk + hk * D;
    const int krows = (int)min64(L::BC, s.lk);
    stage_async<D>(tiles, L::LD, k + koff, ldk, krows, L::BC);
    stage_async<D>(tiles + L::TILE, L::LD, v + koff, ldk, krows, L::BC);
  }
  cp_async_commit();
  cp_async_wait<1>(); // Q has landed
  __syncthreads();
  uint32_t qa[D / 16][4];
  load_rows_a<D>(qa, Qs, nullptr, nullptr, L::LD, r0, lane);
  __syncthreads(); // every warp holds its Q: stage 1 is free

  float o[D / 8][4];
  zero_acc<D / 8>(o);
  // The lane's rows g and g + 8 of the warp: running maximum m and sum l (base 2), and the keys
  // each sees.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  int row_end[2];
#pragma unroll
  for (int x = 0; x < 2; x++) {
    const int64_t qi = i0 + r0 + g + 8 * x;
    row_end[x] = qi < s.lq ? keys_seen(qi, s, a.causal) : 0;
  }
  for (int jt = 0; jt < ntiles; jt++) {
    const int j0 = jt * L::BC;
    if (jt + 1 < ntiles) { // the next tile into the other stage, freed by the last barrier
      const int64_t koff = (s.k0 + j0 + L::BC) * ldk + hk * D;
      const int krows = (int)min64(L::BC, s.lk - j0 - L::BC);
      bf16 *next = tiles + 2 * ((jt + 1) & 1) * L::TILE;
      stage_async<D>(next, L::LD, k + koff, ldk, krows, L::BC);
      stage_async<D>(next + L::TILE, L::LD, v + koff, ldk, krows, L::BC);
    }
    cp_async_commit();
    cp_async_wait<1>(); // this tile has landed
    __syncthreads();
    const bf16 *Ks = tiles + 2 * (jt & 1) * L::TILE, *Vs = Ks + L::TILE;

    float sc[L::BC / 8][4]; // S = Q K^T: 8 tiles of 8 keys
    zero_acc<L::BC / 8>(sc);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
      for (int np = 0; np < L::BC / 16; np++) {
        uint32_t b[4];
        ldsm_x4(b, frag_b(Ks, L::LD, np * 16, kk * 16, lane));
        mma_bf16(sc[2 * np], qa[kk], b[0], b[1]);
        mma_bf16(sc[2 * np + 1], qa[kk], b[2], b[3]);
      }
    }
    float alpha[2];
#pragma unroll
    for (int x = 0; x < 2; x++) { // online softmax of row g + 8x: columns 8n + 2t + e
      const int end = row_end[x] - j0;
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < L::BC / 8; n++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const float val = n * 8 + 2 * t + e < end ? sc[n][2 * x + e] * a.s2 : -INFINITY;
          sc[n][2 * x + e] = val;
          mx = fmaxf(mx, val);
        }
      }
      const float m_new = fmaxf(m[x], quad_max(mx));
      const bool live = m_new != -INFINITY; // the row has seen a key
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < L::BC / 8; n++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const float p = live ? exp2f(sc[n][2 * x + e] - m_new) : 0.0f;
          sc[n][2 * x + e] = p;
          sum += p;
        }
      }
      alpha[x] = live ? exp2f(m[x] - m_new) : 1.0f; // m = -inf: 0
      l[x] = l[x] * alpha[x] + quad_sum(sum);
      m[x] = m_new;
    }
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
#pragma unroll
    for (int kk = 0; kk < L::BC / 16; kk++) { // O += P V, 16 keys at a time
      uint32_t pa[4];
      acc_to_a(pa, sc[2 * kk], sc[2 * kk + 1]);
#pragma unroll
      for (int dp = 0; dp < D / 16; dp++) {
        uint32_t b[4];
        ldsm_x4_trans(b, frag_bt(Vs, L::LD, kk * 16, dp * 16, lane));
        mma_bf16(o[2 * dp], pa, b[0], b[1]);
        mma_bf16(o[2 * dp + 1], pa, b[2], b[3]);
      }
    }
    __syncthreads(); // this stage is free for the tile after next
  }

  // out = O / l, lse = (m + log2 l) ln 2; rows without keys get 0 and -inf.
  float inv[2];
  int64_t qi[2];
#pragma unroll
  for (int x = 0; x < 2; x++) {
    qi[x] = i0 + r0 + g + 8 * x;
    inv[x] = l[x] > 0.0f ? 1.0f / l[x] : 0.0f;
    if (t == 0 && qi[x] < s.lq) {
      lse[h * s.total_q + s.q0 + qi[x]] = l[x] > 0.0f ? (m[x] + log2f(l[x])) * kLn2 : -INFINITY;
    }
  }
  bf16 *o0 = out + (s.q0 + qi[0]) * ldq + (int64_t)h * D;
  store_rows_bf16<D>(o0, o0 + 8 * ldq, qi[0] < s.lq, qi[1] < s.lq, o, inv[0], inv[1], t);
}

// Backward, three kernels in order on one stream: Di, then dK dV, then dQ. Di = rowsum(dO * O)
// of each (query row, head) is computed once, in f32, and kept in the first 4 bytes of dq's own
// storage for that row and head: the dK/dV kernel reads it there, and so does the dQ block that
// owns the row, before it writes the row's dQ last (no scratch, no atomics).
__device__ __forceinline__ int64_t di_at(int64_t row, int64_t ldq, int h, int D) {
  return row * ldq + (int64_t)h * D;
}

// Di of kDiRows query rows of one head and sequence: D/8 lanes a row, a fixed order of sums.
constexpr int kDiRows = 64;
template <int D>
__global__ void __launch_bounds__(kThreads)
    tc_bwd_di_kernel(AttnArgs a, bf16 *dq, const bf16 *dout, const bf16 *out) {
  constexpr int kChunks = D / 8, kRowsPerWarp = 32 / kChunks, kTileRows = kDiRows;
  const SeqInfo s = seq_info(a);
  const int h = blockIdx.y;
  const int64_t i0 = (int64_t)blockIdx.x * kTileRows;
  if (i0 >= s.lq) {
    return;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, c = lane % kChunks;
  const int64_t ldq = (int64_t)a.H * D;
  for (int r = warp * kRowsPerWarp + lane / kChunks; r < kTileRows; r += kWarps * kRowsPerWarp) {
    const int64_t i = i0 + r; // every lane of the warp takes the same number of turns
    float dot = 0.0f;
    if (i < s.lq) {
      const int64_t off = (s.q0 + i) * ldq + (int64_t)h * D + c * 8;
      const uint4 x = *reinterpret_cast<const uint4 *>(dout + off);
      const uint4 y = *reinterpret_cast<const uint4 *>(out + off);
      const uint32_t xw[4] = {x.x, x.y, x.z, x.w}, yw[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
      for (int e = 0; e < 4; e++) { // elements 2e (low half) and 2e + 1
        dot = fmaf(bf16_lo(xw[e]), bf16_lo(yw[e]), dot);
        dot = fmaf(bf16_hi(xw[e]), bf16_hi(yw[e]), dot);
      }
    }
#pragma unroll
    for (int off = kChunks / 2; off > 0; off /= 2) { // the row's lanes are contiguous
      dot += __shfl_xor_sync(0xffffffffu, dot, off);
    }
    if (c == 0 && i < s.lq) {
      *reinterpret_cast<float *>(dq + di_at(s.q0 + i, ldq, h, D)) = dot;
    }
  }
}

// 4-byte cp.async (a float; zero when !valid).
__device__ __forceinline__ void cp_async4(void *dst, const void *src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}

// Backward shared memory: two stages, each a Q tile, a dO tile (64 rows), and the lse and Di of
// those rows. dK/dV: K and V pass through stage 1's tiles on their way to registers, then query
// tiles alternate between the stages. dQ: Q and dO pass through stage 0, then key tiles (K in
// the Q tile, V in the dO tile) alternate.
template <int D> struct TcBwd {
  static constexpr int BR = 16 * kWarps; // query rows per tile
  static constexpr int BC = 16 * kWarps; // key rows per tile
  static constexpr int LD = D + 8;       // bf16 row stride of the tiles
  static constexpr int TILE_BYTES = align128(64 * LD * 2);
  static constexpr int VEC_BYTES = align128(64 * 4);
  static constexpr int Q_AT = 0, DO_AT = TILE_BYTES, LSE_AT = 2 * TILE_BYTES;
  static constexpr int DI_AT = LSE_AT + VEC_BYTES;
  static constexpr int STAGE_BYTES = DI_AT + VEC_BYTES;
  static constexpr int SMEM = 2 * STAGE_BYTES;
  static_assert(BR == 64 && BC == 64, "tiles of 64 rows");
  static_assert(SMEM <= kMaxSmem, "tensor-core backward tiles exceed the shared memory budget");
};

// Backward dK, dV: block (key tile, key/value head, sequence); each warp owns 16 keys, keeps
// their K, V fragments and dK, dV accumulators in registers, and walks the group's query heads
// in order and the query tiles that see the key tile (the next one loading while this one is
// used), 16 queries at a time: P^T = 2^(s2 K Q^T - lse2), dP^T = V dO^T, dS^T = P^T (dP^T -
// Di), dV += P^T dO, dK += dS^T Q; dK is scaled once at the end.
template <int D>
__global__ void __launch_bounds__(kThreads)
    tc_bwd_dkdv_kernel(AttnArgs a, bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q,
                       const bf16 *k, const bf16 *v, const bf16 *dq, const float *lse) {
  typedef TcBwd<D> L;
  extern __shared__ __align__(128) unsigned char smem[];
  const SeqInfo s = seq_info(a);
  const int hk = blockIdx.y;
  const int64_t j0 = (int64_t)blockIdx.x * L::BC;
  if (j0 >= s.lk) {
    return;
  }
  const int cols = (int)min64(L::BC, s.lk - j0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int c0 = warp * 16; // the warp's first key in the tile
  const int64_t ldq = (int64_t)a.H * D, ldk = (int64_t)a.H_kv * D;
  const int64_t koff = (s.k0 + j0) * ldk + (int64_t)hk * D;
  const int group = a.H / a.H_kv;
  const int64_t iq0 = first_query(j0, s, a.causal);
  const int per_head = iq0 < s.lq ? (int)((s.lq - iq0 + L::BR - 1) / L::BR) : 0;
  const int items = group * per_head; // (head, query tile) in order

  // Item `it` (head hk group + it / per_head, query tile it % per_head) into stage st.
  auto prefetch = [&](int it, int st) {
    const int h = hk * group + it / per_head;
    const int64_t i0 = iq0 + (int64_t)(it % per_head) * L::BR;
    const int rows = (int)min64(L::BR, s.lq - i0);
    const int64_t qoff = (s.q0 + i0) * ldq + (int64_t)h * D;
    unsigned char *base = smem + st * L::STAGE_BYTES;
    stage_async<D>(reinterpret_cast<bf16 *>(base + L::Q_AT), L::LD, q + qoff, ldq, rows, L::BR);
    stage_async<D>(reinterpret_cast<bf16 *>(base + L::DO_AT), L::LD, dout + qoff, ldq, rows, L::BR);
    for (int r = threadIdx.x; r < L::BR; r += kThreads) {
      const bool valid = r < rows;
      const int64_t row = s.q0 + i0 + (valid ? r : 0);
      cp_async4(base + L::LSE_AT + 4 * r, lse + h * s.total_q + row, valid);
      cp_async4(base + L::DI_AT + 4 * r, dq + di_at(row, ldq, h, D), valid);
    }
  };

  bf16 *Ks = reinterpret_cast<bf16 *>(smem + L::STAGE_BYTES + L::Q_AT);
  bf16 *Vs = reinterpret_cast<bf16 *>(smem + L::STAGE_BYTES + L::DO_AT);
  stage_async<D>(Ks, L::LD, k + koff, ldk, cols, L::BC);
  stage_async<D>(Vs, L::LD, v + koff, ldk, cols, L::BC);
  cp_async_commit();
  if (items > 0) {
    prefetch(0, 0);
  }
  cp_async_commit();
  cp_async_wait<1>(); // K and V have landed
  __syncthreads();
  uint32_t ka[D / 16][4], va[D / 16][4];
  load_rows_a<D>(ka, Ks, va, Vs, L::LD, c0, lane);
  __syncthreads(); // K and V are in registers: stage 1 is free
  float dkc[D / 8][4], dvc[D / 8][4];
  zero_acc<D / 8>(dkc, dvc);
  const int64_t kj0 = j0 + c0 + g; // the lane's keys: kj0 and kj0 + 8

  for (int it = 0; it < items; it++) {
    if (it + 1 < items) {
      prefetch(it + 1, (it + 1) & 1);
    }
    cp_async_commit();
    cp_async_wait<1>(); // this item has landed
    __syncthreads();
    const unsigned char *base = smem + (it & 1) * L::STAGE_BYTES;
    const bf16 *Qs = reinterpret_cast<const bf16 *>(base + L::Q_AT);
    const bf16 *dOs = reinterpret_cast<const bf16 *>(base + L::DO_AT);
    const float *lse_s = reinterpret_cast<const float *>(base + L::LSE_AT);
    const float *di_s = reinterpret_cast<const float *>(base + L::DI_AT);
    const int64_t i0 = iq0 + (int64_t)(it % per_head) * L::BR;
#pragma unroll 1
    for (int qs = 0; qs < L::BR / 16; qs++) { // 16 queries at a time
      float st[2][4], dpt[2][4];
      zero_acc<2>(st, dpt);
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) {
        uint32_t b[4];
        ldsm_x4(b, frag_b(Qs, L::LD, qs * 16, kk * 16, lane));
        mma_bf16(st[0], ka[kk], b[0], b[1]); // S^T = K Q^T
        mma_bf16(st[1], ka[kk], b[2], b[3]);
        ldsm_x4(b, frag_b(dOs, L::LD, qs * 16, kk * 16, lane));
        mma_bf16(dpt[0], va[kk], b[0], b[1]); // dP^T = V dO^T
        mma_bf16(dpt[1], va[kk], b[2], b[3]);
      }
#pragma unroll
      for (int n = 0; n < 2; n++) { // element (key g + 8x, query qs 16 + 8n + 2t + e)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int qc = qs * 16 + n * 8 + 2 * t + e;
          const float lse2 = lse_base2(lse_s[qc]), di = di_s[qc];
#pragma unroll
          for (int x = 0; x < 2; x++) {
            const bool vis = visible(i0 + qc, kj0 + 8 * x, s, a.causal);
            const float p = vis ? exp2f(st[n][2 * x + e] * a.s2 - lse2) : 0.0f;
            st[n][2 * x + e] = p;
            dpt[n][2 * x + e] = p * (dpt[n][2 * x + e] - di);
          }
        }
      }
      uint32_t pa[4], da[4];
      acc_to_a(pa, st[0], st[1]);
      acc_to_a(da, dpt[0], dpt[1]);
#pragma unroll
      for (int dp = 0; dp < D / 16; dp++) {
        uint32_t b[4];
        ldsm_x4_trans(b, frag_bt(dOs, L::LD, qs * 16, dp * 16, lane));
        mma_bf16(dvc[2 * dp], pa, b[0], b[1]); // dV += P^T dO
        mma_bf16(dvc[2 * dp + 1], pa, b[2], b[3]);
        ldsm_x4_trans(b, frag_bt(Qs, L::LD, qs * 16, dp * 16, lane));
        mma_bf16(dkc[2 * dp], da, b[0], b[1]); // dK += dS^T Q
        mma_bf16(dkc[2 * dp + 1], da, b[2], b[3]);
      }
    }
    __syncthreads(); // this stage is free for the item after next
  }
  bf16 *k0p = dk + koff + (int64_t)(c0 + g) * ldk, *v0p = dv + koff + (int64_t)(c0 + g) * ldk;
  const bool valid0 = c0 + g < cols, valid1 = c0 + g + 8 < cols;
  store_rows_bf16<D>(k0p, k0p + 8 * ldk, valid0, valid1, dkc, a.scale, a.scale, t);
  store_rows_bf16<D>(v0p, v0p + 8 * ldk, valid0, valid1, dvc, 1.0f, 1.0f, t);
}

// Backward dQ: block (query tile, head, sequence), the longest causal tiles first; each warp
// keeps its 16 rows of Q, dO (fragments), lse, Di and dQ (accumulators) in registers over the
// key tiles (the next loading while this one is used), kKeyStep keys at a time: P = 2^(s2 Q K^T
// - lse2), dP = dO V^T, dS = P (dP - Di), dQ += dS K; scaled once at the end, where it replaces
// the rows' Di. 32 keys a step give the products of S and dP 8 independent accumulator chains
// instead of 4 (on an H200, 1% faster than 16; splitting the dK/dV kernel's chains the same way
// made it slower: it is at 254 registers).
constexpr int kKeyStep = 32;
template <int D>
__global__ void __launch_bounds__(kThreads)
    tc_bwd_dq_kernel(AttnArgs a, bf16 *dq, const bf16 *dout, const bf16 *q, const bf16 *k,
                     const bf16 *v, const float *lse) {
  typedef TcBwd<D> L;
  extern __shared__ __align__(128) unsigned char smem[];
  const SeqInfo s = seq_info(a);
  const int h = blockIdx.y;
  const int64_t i0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * L::BR;
  if (i0 >= s.lq) {
    return;
  }
  const int rows = (int)min64(L::BR, s.lq - i0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int r0 = warp * 16;
  const int64_t ldq = (int64_t)a.H * D, ldk = (int64_t)a.H_kv * D;
  const int64_t hk = h / (a.H / a.H_kv);
  const int64_t qoff = (s.q0 + i0) * ldq + (int64_t)h * D;
  const int kend = keys_seen(i0 + rows - 1, s, a.causal); // later key tiles are fully masked
  const int ntiles = (kend + L::BC - 1) / L::BC;
  // Key tile jt (K in the Q tile, V in the dO tile) into stage st.
  auto prefetch = [&](int jt, int st) {
    const int64_t koff = (s.k0 + (int64_t)jt * L::BC) * ldk + hk * D;
    const int krows = (int)min64(L::BC, s.lk - (int64_t)jt * L::BC);
    unsigned char *base = smem + st * L::STAGE_BYTES;
    stage_async<D>(reinterpret_cast<bf16 *>(base + L::Q_AT), L::LD, k + koff, ldk, krows, L::BC);
    stage_async<D>(reinterpret_cast<bf16 *>(base + L::DO_AT), L::LD, v + koff, ldk, krows, L::BC);
  };

  const bf16 *Qs = reinterpret_cast<const bf16 *>(smem + L::Q_AT);
  const bf16 *dOs = reinterpret_cast<const bf16 *>(smem + L::DO_AT);
  stage_async<D>(const_cast<bf16 *>(Qs), L::LD, q + qoff, ldq, rows, L::BR);
  stage_async<D>(const_cast<bf16 *>(dOs), L::LD, dout + qoff, ldq, rows, L::BR);
  cp_async_commit();
  if (ntiles > 0) {
    prefetch(0, 1); // key tile jt goes to stage (jt + 1) % 2
  }
  cp_async_commit();
  float lse2r[2], dir[2];
  int64_t qi[2];
#pragma unroll
  for (int x = 0; x < 2; x++) { // the lane's rows g and g + 8 of the warp
    qi[x] = i0 + r0 + g + 8 * x;
    const bool valid = qi[x] < s.lq;
    lse2r[x] = valid ? lse_base2(lse[h * s.total_q + s.q0 + qi[x]]) : INFINITY;
    dir[x] = valid ? *reinterpret_cast<const float *>(dq + di_at(s.q0 + qi[x], ldq, h, D)) : 0.0f;
  }
  cp_async_wait<1>(); // Q and dO have landed
  __syncthreads();
  uint32_t qa[D / 16][4], oa[D / 16][4];
  load_rows_a<D>(qa, Qs, oa, dOs, L::LD, r0, lane);
  __syncthreads(); // Q and dO are in registers: stage 0 is free
  float dqc[D / 8][4];
  zero_acc<D / 8>(dqc);

  for (int jt = 0; jt < ntiles; jt++) {
    const int j0 = jt * L::BC;
    if (jt + 1 < ntiles) {
      prefetch(jt + 1, jt & 1);
    }
    cp_async_commit();
    cp_async_wait<1>(); // this tile has landed
    __syncthreads();
    const unsigned char *base = smem + ((jt + 1) & 1) * L::STAGE_BYTES;
    const bf16 *Ks = reinterpret_cast<const bf16 *>(base + L::Q_AT);
    const bf16 *Vs = reinterpret_cast<const bf16 *>(base + L::DO_AT);
#pragma unroll 1
    for (int ks = 0; ks < L::BC / kKeyStep; ks++) { // kKeyStep keys at a time
      constexpr int NT = kKeyStep / 8;              // tiles of 8 keys
      float sc[NT][4], dpc[NT][4];
      zero_acc<NT>(sc, dpc);
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
          uint32_t b[4];
          ldsm_x4(b, frag_b(Ks, L::LD, ks * kKeyStep + np * 16, kk * 16, lane));
          mma_bf16(sc[2 * np], qa[kk], b[0], b[1]); // S = Q K^T
          mma_bf16(sc[2 * np + 1], qa[kk], b[2], b[3]);
          ldsm_x4(b, frag_b(Vs, L::LD, ks * kKeyStep + np * 16, kk * 16, lane));
          mma_bf16(dpc[2 * np], oa[kk], b[0], b[1]); // dP = dO V^T
          mma_bf16(dpc[2 * np + 1], oa[kk], b[2], b[3]);
        }
      }
#pragma unroll
      for (int n = 0; n < NT; n++) { // element (row g + 8x, key ks kKeyStep + 8n + 2t + e)
#pragma unroll
        for (int x = 0; x < 2; x++) {
#pragma unroll
          for (int e = 0; e < 2; e++) {
            const int kc = ks * kKeyStep + n * 8 + 2 * t + e;
            const bool vis = visible(qi[x], j0 + kc, s, a.causal);
            const float p = vis ? exp2f(sc[n][2 * x + e] * a.s2 - lse2r[x]) : 0.0f;
            dpc[n][2 * x + e] = p * (dpc[n][2 * x + e] - dir[x]);
          }
        }
      }
#pragma unroll
      for (int kh = 0; kh < NT / 2; kh++) { // dQ += dS K, 16 keys at a time
        uint32_t da[4];
        acc_to_a(da, dpc[2 * kh], dpc[2 * kh + 1]);
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
          uint32_t b[4];
          ldsm_x4_trans(b, frag_bt(Ks, L::LD, ks * kKeyStep + kh * 16, dp * 16, lane));
          mma_bf16(dqc[2 * dp], da, b[0], b[1]);
          mma_bf16(dqc[2 * dp + 1], da, b[2], b[3]);
        }
      }
    }
    __syncthreads(); // this stage is free for the tile after next
  }
  bf16 *q0p = dq + (s.q0 + qi[0]) * ldq + (int64_t)h * D;
  store_rows_bf16<D>(q0p, q0p + 8 * ldq, qi[0] < s.lq, qi[1] < s.lq, dqc, a.scale, a.scale, t);
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
  if (max_q > 0) { // Di into dq's storage, read by the two kernels after it
    status = launch_seqs(tc_bwd_di_kernel<D>, "attention backward Di (bf16)", a,
                         tiles_of(max_q, kDiRows), a.H, 0, dq, dout, out);
  }
  if (status == LOOM_OK && max_k > 0) {
    status = launch_seqs(tc_bwd_dkdv_kernel<D>, "attention backward dK dV (bf16 tensor cores)", a,
                         tiles_of(max_k, L::BC), a.H_kv, (size_t)L::SMEM, dk, dv, dout, q, k, v,
                         (const bf16 *)dq, lse);
  }
  if (status == LOOM_OK && max_q > 0) {
    status = launch_seqs(tc_bwd_dq_kernel<D>, "attention backward dQ (bf16 tensor cores)", a,
                         tiles_of(max_q, L::BR), a.H, (size_t)L::SMEM, dq, dout, q, k, v, lse);
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
