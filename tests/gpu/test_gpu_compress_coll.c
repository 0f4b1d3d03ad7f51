/* test_gpu_compress_coll.c — the compressed allreduce of CUDA tensors (CUDA codecs, NCCL) against
 * the host one on the same inputs, under mpirun (tests/gpu/run_all.sh): the same bits everywhere.
 */
#include "config.h"
#include "loom.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LOOM_HAVE_NCCL
#include <cuda_runtime_api.h>

#include "cuda/cuda_ctx.h"
#endif

#include "../check_mpi.h"
#include "gpu_test.h"

// What is checked, at the np of the run (one GPU per rank: NCCL refuses two ranks on one GPU):
// - for none, fp16, int8, int8:sr (its encode seeds salted by rank and stage, as on the host),
//   topk:0.01, randomk:0.01 and efsign, the three schemes, sizes 0, 1, 5,
//   3 np + 1, 1000 and 100003 (LOOM_COMPRESS_CHUNK is 40000 bytes unless set: the larger sizes
//   run as several chunks, top-k excepted), three steps with error feedback (one of them
//   LOOM_AVG), each rank's own inputs: the device result has the host result's bits, the bytes
//   sent agree, and the device residual (seen through loom_ef_entry, which copies it to the host)
//   has the host residual's bits;
// - without error feedback, and through loom_icompressed_allreduce (no request: done in stream
//   order);
// - a residual restored with loom_ef_set on both tables before a step: the same bits again;
// - the gradient written by a kernel on a non-blocking current stream just before the call (the
//   encodes and the NCCL exchanges must come after it);
// - powersgd on device tensors (compress_powersgd_nccl.c) against the host form on the same
//   inputs, four steps (warm start, error feedback, one LOOM_AVG), 2-d and 3-d tensors, padded 1-d
//   ones (1000, 100003), tiny ones (1, 5: full rank), every entry point and scheme (the scheme is
//   ignored), a gradient written on a non-blocking stream: result, residual (loom_ef_entry) and Q
//   (loom_ef_state_entry) within a tolerance (below), bytes sent equal; at full rank the result is
//   the exact sum; a checkpoint round trip of the residual and Q (into a new ef, and back into the
//   same one) continues with the same bits; without ef it is LOOM_ERR_INVALID_ARG;
// - host memory labelled as a device tensor is LOOM_ERR_INVALID_ARG.
// The hierarchical scheme (NCCL allreduce and broadcast in each node, the indivisible scheme
// among the node leaders; run_all.sh also runs np 2 with LOOM_NODE_SIZE=1 and np 4 with
// LOOM_NODE_SIZE=2 where 2 or 4 GPUs are visible) must give the host's bits, result and
// residuals, when every node has at most two ranks (a two-value sum has one rounding in any
// order). In larger nodes NCCL sums the node in an order of its own: only none and fp16 are
// compared there, within |device - host| <= 1e-5 * 4 np (none: f32 sums of np values of at most
// 4 in magnitude reordered) and 2^-9 * 4 np (fp16: one rounding to fp16 may go the other way, two
// with the residual carried), results and residuals alike.
// Exits 77 (SKIP) without NCCL, without a visible GPU, or with fewer GPUs than ranks on a node.

static const char *kTest = "test_gpu_compress_coll";

#define OK(call)                                                                                   \
  do {                                                                                             \
    loom_status_t ok_status_ = (call);                                                             \
    CHECK(ok_status_ == LOOM_OK, "%s: %s", loom_strerror(ok_status_), loom_last_error(NULL));      \
  } while (0)

#ifdef LOOM_HAVE_NCCL

static const char *const kSpecs[] = {"none",      "fp16",         "int8",  "int8:sr",
                                     "topk:0.01", "randomk:0.01", "efsign"};
#define NSPECS ((int)(sizeof kSpecs / sizeof kSpecs[0]))

static int g_rank, g_gpu;

// Rank r's input for a step (each rank its own).
static void input(float *x, int64_t n, int r, int step) {
  test_rng_t rng = test_rng(5000u + 31u * (uint64_t)r + 977u * (uint64_t)step);
  test_fill_uniform(&rng, x, n, -2.0, 2.0);
}

static loom_tensor_t dev_tensor(int64_t n, const char *name) {
  loom_tensor_t d;
  loom_status_t st = loom_tensor_alloc(&d, LOOM_F32, g_gpu, 1, &n, name);
  if (st != LOOM_OK) {
    fprintf(stderr, "FAIL: device allocation of %s (%lld floats): %s\n", name, (long long)n,
            loom_last_error(NULL));
    exit(1);
  }
  return d;
}

// Host floats to device tensor d (and wait: the copy runs on the legacy stream).
static void put(loom_tensor_t *d, const float *x) {
  loom_tensor_t h;
  OK(loom_tensor_wrap(&h, (void *)x, LOOM_F32, LOOM_DEVICE_HOST, d->ndim, d->shape, "h"));
  OK(loom_tensor_copy(d, &h));
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize");
}

// The largest node's size (the hierarchical scheme is bitwise the host's up to 2).
static int g_node_max;

// 1 when got (n floats) has want's bits (tol 0) or is within tol of it; else says where they
// first differ.
static int same_bits_tol(const char *what, const float *got, const float *want, int64_t n,
                         double tol) {
  int64_t first = -1, count = 0;
  for (int64_t i = 0; i < n; i++) {
    const double d = (double)got[i] - (double)want[i];
    if (tol > 0 ? !(d <= tol && d >= -tol) : memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      first = first < 0 ? i : first;
      count++;
    }
  }
  if (count) {
    fprintf(stderr,
            "rank %d: %s: %lld of %lld values differ%s; first [%lld] device %.9g host %.9g\n",
            g_rank, what, (long long)count, (long long)n, tol > 0 ? " beyond the tolerance" : "",
            (long long)first, (double)got[first], (double)want[first]);
  }
  return count == 0;
}

// Device tensor d has host tensor h's bits (tol 0), or is within tol of it.
static int same_tensor_tol(const char *what, const loom_tensor_t *d, const loom_tensor_t *h,
                           double tol) {
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize");
  loom_tensor_t got = gpu_download(d);
  int same = same_bits_tol(what, (const float *)got.data, (const float *)h->data,
                           loom_tensor_numel(h), tol);
  loom_tensor_free(&got);
  return same;
}

static int same_tensor(const char *what, const loom_tensor_t *d, const loom_tensor_t *h) {
  return same_tensor_tol(what, d, h, 0.0);
}

// The residual of "grad" in ef_d (copied from the device by loom_ef_entry) has ef_h's bits (tol
// 0), or is within tol of them.
static int same_residual_tol(const char *what, const loom_ef_t *ef_d, const loom_ef_t *ef_h,
                             int64_t n, double tol) {
  const float *rd = NULL, *rh = NULL;
  int64_t nd = -1, nh = -1;
  const char *name_d = NULL, *name_h = NULL;
  if (loom_ef_count(ef_d) != 1 || loom_ef_count(ef_h) != 1) {
    fprintf(stderr, "rank %d: %s: %d device and %d host residuals, want 1 each\n", g_rank, what,
            loom_ef_count(ef_d), loom_ef_count(ef_h));
    return 0;
  }
  OK(loom_ef_entry(ef_d, 0, &name_d, &rd, &nd));
  OK(loom_ef_entry(ef_h, 0, &name_h, &rh, &nh));
  if (!name_d || !name_h || strcmp(name_d, "grad") != 0 || nd != n || nh != n) {
    fprintf(stderr, "rank %d: %s: residual entries '%s' (%lld) and '%s' (%lld)\n", g_rank, what,
            name_d ? name_d : "(null)", (long long)nd, name_h ? name_h : "(null)", (long long)nh);
    return 0;
  }
  return same_bits_tol(what, rd, rh, n, tol);
}

static int same_residual(const char *what, const loom_ef_t *ef_d, const loom_ef_t *ef_h,
                         int64_t n) {
  return same_residual_tol(what, ef_d, ef_h, n, 0.0);
}

// How close the device result of spec with scheme must be to the host's: 0 (the same bits), a
// tolerance (the hierarchical scheme in nodes of more than two ranks; see the top), or -1 when
// the pair is not compared here (a lossy codec there).
static double tolerance(const char *spec, loom_scheme_t scheme, int np) {
  if (scheme != LOOM_SCHEME_HIERARCHICAL || g_node_max <= 2) {
    return 0.0;
  }
  return !strcmp(spec, "none") ? 1e-5 * 4.0 * np : !strcmp(spec, "fp16") ? 4.0 * np / 512.0 : -1.0;
}

// Three steps of spec/scheme on n values, host and device side by side. use_ef: with error
// feedback; nonblocking: the device side through loom_icompressed_allreduce; restore: before the
// last step both residuals are set with loom_ef_set.
static void compare_case(const loom_group_t *g, const char *spec, loom_scheme_t scheme, int64_t n,
                         int use_ef, int nonblocking, int restore) {
  const int me = loom_group_rank(g);
  const double tol = tolerance(spec, scheme, loom_group_size(g));
  char what[160];
  if (tol < 0) {
    return;
  }
  loom_compressor_t *c = NULL;
  loom_ef_t *ef_h = NULL, *ef_d = NULL;
  OK(loom_compressor_create(spec, &c));
  if (use_ef) {
    OK(loom_ef_create(&ef_h));
    OK(loom_ef_create(&ef_d));
  }
  loom_tensor_t th = test_tensor_f32(1, &n, "grad");
  loom_tensor_t td = dev_tensor(n, "grad");
  float *x = test_floats(&th);
  float *r = malloc(sizeof(float) * (size_t)(n + 1));
  for (int step = 0; step < 3 && c; step++) {
    const loom_redop_t op = step == 1 ? LOOM_AVG : LOOM_SUM;
    const uint64_t seed = 1000u + (uint64_t)step;
    size_t sent_h = 0, sent_d = 1;
    snprintf(what, sizeof what, "%s %s n=%lld ef=%d nb=%d restore=%d step %d", spec,
             loom_scheme_name(scheme), (long long)n, use_ef, nonblocking, restore, step);
    input(x, n, me, step);
    put(&td, x);
    if (restore && step == 2) { // a "checkpoint" value for both sides
      for (int64_t i = 0; i < n; i++) {
        r[i] = 0.25f * x[i] - 0.125f;
      }
      OK(loom_ef_set(ef_h, "grad", r, n));
      OK(loom_ef_set(ef_d, "grad", r, n));
    }
    OK(loom_compressed_allreduce(g, c, scheme, ef_h, &th, op, seed, &sent_h));
    if (nonblocking) {
      loom_request_t *req = (loom_request_t *)&sent_d; // must come back NULL
      OK(loom_icompressed_allreduce(g, c, scheme, ef_d, &td, op, seed, &sent_d, &req));
      CHECK(req == NULL, "%s: a device call returned a request", what);
      req = NULL;
      OK(loom_wait(&req));
    } else {
      OK(loom_compressed_allreduce(g, c, scheme, ef_d, &td, op, seed, &sent_d));
    }
    CHECK(same_tensor_tol(what, &td, &th, tol), "%s: device result != host result", what);
    CHECK(sent_d == sent_h, "%s: bytes sent %zu on the device, %zu on the host", what, sent_d,
          sent_h);
    if (use_ef) {
      CHECK(same_residual_tol(what, ef_d, ef_h, n, tol), "%s: device residual != host residual",
            what);
    }
  }
  free(r);
  loom_tensor_free(&td);
  TEST_FREE(&th);
  loom_ef_destroy(ef_h);
  loom_ef_destroy(ef_d);
  loom_compressor_destroy(c);
}

// The gradient comes from a kernel on a non-blocking current stream right before the call: the
// call must order its encodes and exchanges after it, and its result is in that stream's order.
static void stream_case(const loom_group_t *g, const char *spec, loom_scheme_t scheme) {
  const int me = loom_group_rank(g);
  int64_t n = 100003;
  char what[128];
  snprintf(what, sizeof what, "%s %s on a non-blocking stream", spec, loom_scheme_name(scheme));
  loom_compressor_t *c = NULL;
  loom_ef_t *ef_h = NULL, *ef_d = NULL;
  cudaStream_t s = NULL;
  OK(loom_compressor_create(spec, &c));
  OK(loom_ef_create(&ef_h));
  OK(loom_ef_create(&ef_d));
  loom_tensor_t th = test_tensor_f32(1, &n, "grad");
  loom_tensor_t td = dev_tensor(n, "grad"), tx = dev_tensor(n, "x"), tz = dev_tensor(n, "z");
  float *x = test_floats(&th), *junk = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) {
    junk[i] = 1e30f;
  }
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
  for (int step = 0; step < 2 && c && s; step++) {
    size_t sent_h = 0, sent_d = 0;
    input(x, n, me, 40 + step);
    put(&tx, x);
    put(&td, junk);
    for (int64_t i = 0; i < n; i++) {
      junk[i] = 0.0f;
    }
    put(&tz, junk);
    OK(loom_compressed_allreduce(g, c, scheme, ef_h, &th, LOOM_SUM, 7u + (uint64_t)step, &sent_h));
    loom_cuda_set_stream(s);
    OK(loom_residual_forward(&td, &tx, &tz)); // td = x + 0, on s
    OK(loom_compressed_allreduce(g, c, scheme, ef_d, &td, LOOM_SUM, 7u + (uint64_t)step, &sent_d));
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "cudaStreamSynchronize");
    loom_cuda_set_stream(0);
    CHECK(same_tensor(what, &td, &th), "%s: device result != host result (step %d)", what, step);
    CHECK(same_residual(what, ef_d, ef_h, n), "%s: residuals differ (step %d)", what, step);
    for (int64_t i = 0; i < n; i++) {
      junk[i] = 1e30f;
    }
  }
  loom_cuda_set_stream(0);
  if (s) {
    cudaStreamDestroy(s);
  }
  free(junk);
  loom_tensor_free(&td);
  loom_tensor_free(&tx);
  loom_tensor_free(&tz);
  TEST_FREE(&th);
  loom_ef_destroy(ef_h);
  loom_ef_destroy(ef_d);
  loom_compressor_destroy(c);
}

// ---- PowerSGD -----------------------------------------------------------------------------------
//
// Tolerance: every compared vector (result, residual, Q) must satisfy |device - host| <= 1e-4 *
// max |host| (elementwise, scaled by the vector's largest magnitude). The two forms run the same
// algorithm on the same f32 inputs, with the same Gram-Schmidt code (in double, on the host) and
// the same NCCL-or-MPI sums of P and Q (up to two ranks a sum has one rounding in any order); what
// differs is the GEMMs: cuBLAS and OpenBLAS add the K products of an entry (K up to 317 here) in
// different orders, with and without FMA, so an entry may differ by a few ulp of the larger
// partial sums (at most K * 2^-24 relative, about 2e-5; typically sqrt(K) * 2^-24, about 1e-6).
// Gram-Schmidt divides by column norms and subtracts projections, which scales such differences
// by the conditioning of M Q (a few, on these random inputs), and the warm start and the residual
// carry them into the next step, where power iteration damps rather than grows them. 1e-4 leaves
// room for that; a wrong transpose, leading dimension or stale buffer gives differences of the
// order of the values themselves. Within the device form nothing is reordered: a checkpoint round
// trip must give the same bits.

#define PSGD_RTOL 1e-4

// A device tensor of the given shape.
static loom_tensor_t dev_tensor_shaped(int ndim, const int64_t *shape, const char *name) {
  loom_tensor_t d;
  loom_status_t st = loom_tensor_alloc(&d, LOOM_F32, g_gpu, ndim, shape, name);
  if (st != LOOM_OK) {
    fprintf(stderr, "FAIL: device allocation of %s: %s\n", name, loom_last_error(NULL));
    exit(1);
  }
  return d;
}

// The largest |v[i]| of n floats, at least floor.
static double max_abs_floor(const float *v, int64_t n, double floor) {
  double m = floor;
  for (int64_t i = 0; i < n; i++) {
    m = fabs((double)v[i]) > m ? fabs((double)v[i]) : m;
  }
  return m;
}

// got (n floats) within PSGD_RTOL * max |want| of want.
static int psgd_close(const char *what, const float *got, const float *want, int64_t n) {
  const double scale = max_abs_floor(want, n, 0.0);
  return same_bits_tol(what, got, want, n, PSGD_RTOL * (scale > 0.0 ? scale : 1.0));
}

// ef's one residual and one state entry (Q), both named "grad"; 0 (and a message) otherwise.
static int psgd_entries(const char *what, const loom_ef_t *ef, const float **res, int64_t *nres,
                        const float **q, int64_t *nq) {
  const char *nr = NULL, *ns = NULL;
  if (loom_ef_count(ef) != 1 || loom_ef_state_count(ef) != 1) {
    fprintf(stderr, "rank %d: %s: %d residuals and %d states, want 1 each\n", g_rank, what,
            loom_ef_count(ef), loom_ef_state_count(ef));
    return 0;
  }
  OK(loom_ef_entry(ef, 0, &nr, res, nres));
  OK(loom_ef_state_entry(ef, 0, &ns, q, nq));
  return nr && ns && !strcmp(nr, "grad") && !strcmp(ns, "grad");
}

// The residual and Q of the device table ef_d against those of the host table ef_h. The residual
// (gradient minus its rank-r reconstruction) is measured against grad_scale, the magnitude of the
// gradient it was taken from: where the rank covers the matrix (powersgd:8 on 5 values) the
// reconstruction is exact, the residual is rounding noise of the gradient (a few 1e-7 here, seen
// on an H200), and cuBLAS and OpenBLAS round it differently.
static void psgd_compare_ef(const char *what, const loom_ef_t *ef_d, const loom_ef_t *ef_h,
                            double grad_scale) {
  const float *rd = NULL, *rh = NULL, *qd = NULL, *qh = NULL;
  int64_t nrd = -1, nrh = -2, nqd = -1, nqh = -2;
  char w[240];
  if (!psgd_entries(what, ef_d, &rd, &nrd, &qd, &nqd) ||
      !psgd_entries(what, ef_h, &rh, &nrh, &qh, &nqh) || nrd != nrh || nqd != nqh) {
    CHECK(0, "%s: error-feedback entries differ (residual %lld/%lld, Q %lld/%lld floats)", what,
          (long long)nrd, (long long)nrh, (long long)nqd, (long long)nqh);
    return;
  }
  snprintf(w, sizeof w, "%s: residual", what);
  CHECK(same_bits_tol(w, rd, rh, nrd, PSGD_RTOL * max_abs_floor(rh, nrd, grad_scale)), "%s", w);
  snprintf(w, sizeof w, "%s: Q", what);
  CHECK(psgd_close(w, qd, qh, nqd), "%s", w);
}

// One device call of spec on td: blocking, non-blocking (no request comes back) or with td
// written by a kernel on a non-blocking current stream s just before the call (from tx, on s).
enum { PSGD_BLOCKING, PSGD_NONBLOCKING, PSGD_STREAM };

static loom_status_t psgd_device_call(const loom_group_t *g, const loom_compressor_t *c,
                                      loom_scheme_t scheme, loom_ef_t *ef, loom_tensor_t *td,
                                      loom_tensor_t *tx, loom_tensor_t *tz, loom_redop_t op,
                                      int how, cudaStream_t s, size_t *sent) {
  loom_status_t st = LOOM_OK;
  if (how == PSGD_NONBLOCKING) {
    loom_request_t *req = (loom_request_t *)sent; // must come back NULL
    st = loom_icompressed_allreduce(g, c, scheme, ef, td, op, 9, sent, &req);
    CHECK(st != LOOM_OK || req == NULL, "powersgd: a device call returned a request");
    return st;
  }
  if (how == PSGD_STREAM) {
    loom_cuda_set_stream(s);
    st = loom_residual_forward(td, tx, tz); // td = x + 0, on s
    if (st == LOOM_OK) {
      st = loom_compressed_allreduce(g, c, scheme, ef, td, op, 9, sent);
    }
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "cudaStreamSynchronize");
    loom_cuda_set_stream(0);
    return st;
  }
  return loom_compressed_allreduce(g, c, scheme, ef, td, op, 9, sent);
}

// Four steps of spec on a tensor of the given shape, host and device side by side (each rank its
// own inputs; step 2 is LOOM_AVG), then the checkpoint round trip of the device side.
static void powersgd_case(const loom_group_t *g, const char *spec, int ndim, const int64_t *shape,
                          loom_scheme_t scheme, int how) {
  const int me = loom_group_rank(g);
  char what[200], shp[64] = "";
  for (int i = 0; i < ndim; i++) {
    snprintf(shp + strlen(shp), sizeof shp - strlen(shp), "%s%lld", i ? "x" : "",
             (long long)shape[i]);
  }
  loom_compressor_t *c = NULL;
  loom_ef_t *ef_h = NULL, *ef_d = NULL, *ef_r = NULL;
  cudaStream_t s = NULL;
  OK(loom_compressor_create(spec, &c));
  OK(loom_ef_create(&ef_h));
  OK(loom_ef_create(&ef_d));
  OK(loom_ef_create(&ef_r));
  if (how == PSGD_STREAM) {
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
  }
  loom_tensor_t th = test_tensor_f32(ndim, shape, "grad");
  loom_tensor_t td = dev_tensor_shaped(ndim, shape, "grad");
  loom_tensor_t tx = dev_tensor_shaped(ndim, shape, "x"), tz = dev_tensor_shaped(ndim, shape, "z");
  const int64_t n = loom_tensor_numel(&th);
  float *x = test_floats(&th);
  float *zero = calloc((size_t)n + 1, sizeof(float)),
        *junk = malloc(sizeof(float) * (size_t)(n + 1));
  for (int64_t i = 0; i < n; i++) {
    junk[i] = 1e30f; // td before the kernel on s writes it: must never reach the result
  }
  put(&tz, zero);
  for (int step = 0; step < 4 && c && (how != PSGD_STREAM || s); step++) {
    const loom_redop_t op = step == 2 ? LOOM_AVG : LOOM_SUM;
    size_t sent_h = 0, sent_d = 0;
    snprintf(what, sizeof what, "%s %s %s how=%d step %d", spec, shp, loom_scheme_name(scheme), how,
             step);
    input(x, n, me, 60 + step);
    const double grad_scale = max_abs_floor(x, n, 0.0);
    put(&td, how == PSGD_STREAM ? junk : x);
    put(&tx, x);
    OK(loom_compressed_allreduce(g, c, scheme, ef_h, &th, op, 9, &sent_h));
    OK(psgd_device_call(g, c, scheme, ef_d, &td, &tx, &tz, op, how, s, &sent_d));
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize");
    loom_tensor_t got = gpu_download(&td);
    CHECK(psgd_close(what, test_floats(&got), x, n), "%s: device result != host result", what);
    loom_tensor_free(&got);
    CHECK(sent_d == sent_h, "%s: bytes sent %zu on the device, %zu on the host", what, sent_d,
          sent_h);
    if (n > 0) {
      psgd_compare_ef(what, ef_d, ef_h, grad_scale);
    } else {
      CHECK(loom_ef_count(ef_d) == 0 && loom_ef_state_count(ef_d) == 0,
            "%s: an empty tensor made error-feedback entries", what);
    }
  }
  // Checkpoint round trip: save the device side's residual and Q (as example_ckpt.c does), run
  // one more step (A); restore into a new ef and run the same step (B); restore into the same ef
  // (loom_ef_set drops its device residual) and run it again (C). A, B and C: the same bits.
  const float *rd = NULL, *qd = NULL;
  int64_t nr = 0, nq = 0;
  if (n > 0 && c && psgd_entries("checkpoint", ef_d, &rd, &nr, &qd, &nq)) {
    float *rsave = malloc(sizeof(float) * (size_t)nr), *qsave = malloc(sizeof(float) * (size_t)nq);
    float *res_a = malloc(sizeof(float) * (size_t)nr), *q_a = malloc(sizeof(float) * (size_t)nq);
    memcpy(rsave, rd, sizeof(float) * (size_t)nr);
    memcpy(qsave, qd, sizeof(float) * (size_t)nq);
    loom_tensor_t out[3];
    loom_ef_t *efs[3] = {ef_d, ef_r, ef_d};
    for (int k = 0; k < 3; k++) {
      size_t sent = 0;
      snprintf(what, sizeof what, "%s %s checkpoint round trip %c", spec, shp, "ABC"[k]);
      if (k > 0) {
        OK(loom_ef_set(efs[k], "grad", rsave, nr));
        OK(loom_ef_state_set(efs[k], "grad", qsave, nq));
      }
      input(x, n, me, 70);
      put(&td, x);
      OK(loom_compressed_allreduce(g, c, scheme, efs[k], &td, LOOM_SUM, 9, &sent));
      out[k] = gpu_download(&td);
      const float *r = NULL, *q = NULL;
      int64_t n1 = 0, n2 = 0;
      if (!psgd_entries(what, efs[k], &r, &n1, &q, &n2) || n1 != nr || n2 != nq) {
        CHECK(0, "%s: entries", what);
      } else if (k == 0) {
        memcpy(res_a, r, sizeof(float) * (size_t)nr);
        memcpy(q_a, q, sizeof(float) * (size_t)nq);
      } else {
        CHECK(test_same_bits(test_floats(&out[k]), test_floats(&out[0]), n) &&
                  test_same_bits(r, res_a, nr) && test_same_bits(q, q_a, nq),
              "%s: result, residual or Q differ from the uninterrupted run", what);
      }
    }
    TEST_FREE(&out[0], &out[1], &out[2]);
    free(rsave);
    free(qsave);
    free(res_a);
    free(q_a);
  }
  if (s) {
    cudaStreamDestroy(s);
  }
  free(zero);
  free(junk);
  loom_tensor_free(&td);
  loom_tensor_free(&tx);
  loom_tensor_free(&tz);
  TEST_FREE(&th);
  loom_ef_destroy(ef_h);
  loom_ef_destroy(ef_d);
  loom_ef_destroy(ef_r);
  loom_compressor_destroy(c);
}

// Full rank (powersgd:4 on a 4 x 6 tensor): P is a basis of R^4, so P Q^T is the exact sum of
// every rank's input (f32 sums of np values of at most 2: within 1e-4 np, as the host test) and
// the residual is zero within rounding.
static void powersgd_exact(const loom_group_t *g) {
  const int me = loom_group_rank(g), np = loom_group_size(g);
  int64_t shape[2] = {4, 6};
  const int64_t n = 24;
  loom_compressor_t *c = NULL;
  loom_ef_t *ef = NULL;
  float x[24], want[24] = {0};
  OK(loom_compressor_create("powersgd:4", &c));
  OK(loom_ef_create(&ef));
  loom_tensor_t td = dev_tensor_shaped(2, shape, "grad");
  for (int r = 0; r < np; r++) {
    input(x, n, r, 80);
    for (int64_t i = 0; i < n; i++) {
      want[i] += x[i];
    }
  }
  input(x, n, me, 80);
  put(&td, x);
  OK(loom_compressed_allreduce(g, c, LOOM_SCHEME_DIVISIBLE, ef, &td, LOOM_SUM, 1, NULL));
  loom_tensor_t got = gpu_download(&td);
  CHECK(same_bits_tol("powersgd:4 on 4 x 6: result", test_floats(&got), want, n, 1e-4 * np),
        "powersgd:4 at full rank is not the exact sum");
  const float *res = NULL, *q = NULL;
  int64_t nr = 0, nq = 0;
  if (psgd_entries("powersgd:4 on 4 x 6", ef, &res, &nr, &q, &nq)) {
    float zeros[24] = {0};
    CHECK(nr == n && same_bits_tol("powersgd:4 on 4 x 6: residual", res, zeros, n, 1e-4),
          "powersgd:4 at full rank left a residual");
  }
  loom_tensor_free(&got);
  loom_tensor_free(&td);
  loom_ef_destroy(ef);
  loom_compressor_destroy(c);
}

static void powersgd_cases(const loom_group_t *g) {
  const int64_t s2[2] = {64, 48}, s3[3] = {8, 4, 6}, s1k[1] = {1000}, s100k[1] = {100003};
  const int64_t s5[1] = {5}, s1[1] = {1}, s0[1] = {0};
  powersgd_case(g, "powersgd:2", 2, s2, LOOM_SCHEME_INDIVISIBLE, PSGD_BLOCKING);
  powersgd_case(g, "powersgd:3", 3, s3, LOOM_SCHEME_HIERARCHICAL, PSGD_BLOCKING);
  powersgd_case(g, "powersgd:4", 1, s100k, LOOM_SCHEME_DIVISIBLE, PSGD_NONBLOCKING);
  powersgd_case(g, "powersgd:1", 1, s1k, LOOM_SCHEME_DIVISIBLE, PSGD_STREAM);
  powersgd_case(g, "powersgd:8", 1, s5, LOOM_SCHEME_DIVISIBLE, PSGD_BLOCKING);
  powersgd_case(g, "powersgd:1", 1, s1, LOOM_SCHEME_INDIVISIBLE, PSGD_BLOCKING);
  powersgd_case(g, "powersgd:2", 1, s0, LOOM_SCHEME_DIVISIBLE, PSGD_BLOCKING);
  powersgd_exact(g);
}

static void error_cases(const loom_group_t *g) {
  int64_t n = 64;
  loom_compressor_t *c = NULL, *p = NULL;
  loom_ef_t *ef = NULL;
  OK(loom_compressor_create("int8", &c));
  OK(loom_compressor_create("powersgd:1", &p));
  OK(loom_ef_create(&ef));
  loom_tensor_t td = dev_tensor(n, "grad");
  loom_tensor_t th = test_tensor_f32(1, &n, "grad");
  loom_status_t st =
      loom_compressed_allreduce(g, p, LOOM_SCHEME_INDIVISIBLE, NULL, &td, LOOM_SUM, 1, NULL);
  CHECK(st == LOOM_ERR_INVALID_ARG && strstr(loom_last_error(NULL), "error feedback"),
        "powersgd on a device tensor without ef: %s: %s", loom_strerror(st), loom_last_error(NULL));
  loom_tensor_t fake = th; // host memory that claims to be on the GPU
  fake.device = g_gpu;
  fake.owns_data = 0;
  st = loom_compressed_allreduce(g, c, LOOM_SCHEME_INDIVISIBLE, NULL, &fake, LOOM_SUM, 1, NULL);
  CHECK(st == LOOM_ERR_INVALID_ARG && strstr(loom_last_error(NULL), "not memory of"),
        "host memory as a device tensor: %s: %s", loom_strerror(st), loom_last_error(NULL));
  loom_tensor_free(&td);
  TEST_FREE(&th);
  loom_ef_destroy(ef);
  loom_compressor_destroy(c);
  loom_compressor_destroy(p);
}

#endif // LOOM_HAVE_NCCL

int main(int argc, char **argv) {
  setenv("LOOM_COMPRESS_CHUNK", "40000", 0); // several chunks at 100003 values (unless set)
  loom_ctx_t *ctx = NULL;
  if (loom_init(&argc, &argv, NULL, &ctx) != LOOM_OK) {
    fprintf(stderr, "%s: loom_init failed: %s\n", kTest, loom_last_error(NULL));
    return 1;
  }
#ifndef LOOM_HAVE_NCCL
  if (loom_rank(ctx) == 0) {
    printf("%s: SKIP: loom was built without NCCL (device collectives need it)\n", kTest);
  }
  loom_finalize(ctx);
  return GPU_SKIP;
#else
  g_rank = loom_rank(ctx);
  if (gpu_mpi_skipped(ctx, kTest, &g_gpu)) {
    return GPU_SKIP;
  }
  const loom_group_t *g = loom_group(ctx, LOOM_GROUP_WORLD);
  const int np = loom_group_size(g);
  const int64_t sizes[] = {0, 1, 5, 3 * (int64_t)np + 1, 1000, 100003};
  const loom_scheme_t schemes[] = {LOOM_SCHEME_INDIVISIBLE, LOOM_SCHEME_DIVISIBLE,
                                   LOOM_SCHEME_HIERARCHICAL};
  const int node_size = loom_group_size(loom_group(ctx, LOOM_GROUP_NODE));
  MPI_Allreduce(&node_size, &g_node_max, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (g_rank == 0) {
    const char *ns = getenv("LOOM_NODE_SIZE");
    printf("%s: %d ranks, GPU %d on rank 0, LOOM_COMPRESS_CHUNK=%s, LOOM_NODE_SIZE=%s (nodes of "
           "up to %d: hierarchical %s)\n",
           kTest, np, g_gpu, getenv("LOOM_COMPRESS_CHUNK"), ns ? ns : "unset", g_node_max,
           g_node_max <= 2 ? "bitwise" : "none and fp16 within tolerances");
  }
  for (int s = 0; s < NSPECS; s++) {
    for (int sc = 0; sc < 3; sc++) {
      for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        compare_case(g, kSpecs[s], schemes[sc], sizes[k], 1, 0, 0);
      }
      compare_case(g, kSpecs[s], schemes[sc], 1000, 0, 0, 0);
      compare_case(g, kSpecs[s], schemes[sc], 1000, 1, 1, 1);
    }
  }
  stream_case(g, "int8", LOOM_SCHEME_DIVISIBLE);
  stream_case(g, "topk:0.01", LOOM_SCHEME_INDIVISIBLE);
  if (g_node_max <= 2) { // bitwise only there
    stream_case(g, "int8", LOOM_SCHEME_HIERARCHICAL);
  }
  powersgd_cases(g);
  error_cases(g);
  int rc = check_exit_all(kTest);
  loom_finalize(ctx);
  return rc;
#endif
}
