/* plan_measure.c — what the compression planner needs measured on the running job: the link's
 * alpha and bandwidth between two ranks, and each compressor's encode/decode cost per value. */
#include "config.h"
#include "loom_plan.h"

#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctx.h"
#include "error.h"
#include "log.h"
#include "sched_internal.h"
#ifdef LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/codecs_cuda.h"
#include "cuda/cuda_ctx.h"
#endif

// ---------------------------------------------------------------------------------------------
// Links: group rank 0 exchanges messages both ways at once (MPI_Sendrecv), as the two halves of
// an allreduce load a link, with the first other rank on its node (intra) and then with the
// first rank on another node (inter); the median of a few rounds at 8 bytes gives alpha, at
// 4 MiB the bandwidth. Every rank gets rank 0's figures.

#define LINK_BIG    (4u << 20)
#define LINK_ROUNDS 5

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double exchange_us(MPI_Comm comm, int peer, char *buf, int bytes) {
  double t[LINK_ROUNDS];
  for (int k = 0; k < LINK_ROUNDS; k++) {
    double t0 = MPI_Wtime();
    MPI_Sendrecv(buf, bytes, MPI_BYTE, peer, 77, buf + bytes, bytes, MPI_BYTE, peer, 77, comm,
                 MPI_STATUS_IGNORE);
    t[k] = (MPI_Wtime() - t0) * 1e6;
  }
  qsort(t, LINK_ROUNDS, sizeof t[0], by_value);
  return t[LINK_ROUNDS / 2];
}

// Rank 0 and peer measure their link into fig[0..1] (alpha_us, gbps); the others wait.
static void measure_pair(MPI_Comm comm, int me, int peer, char *buf, double *fig) {
  if (me != 0 && me != peer) {
    return;
  }
  const int other = me == 0 ? peer : 0;
  exchange_us(comm, other, buf, 8); // warm-up: connection set-up is not latency
  double small = exchange_us(comm, other, buf, 8);
  double big = exchange_us(comm, other, buf, (int)LINK_BIG);
  fig[0] = small;
  fig[1] = big > small ? (double)LINK_BIG / ((big - small) * 125.0) : 1e6;
}

loom_status_t loom_plan_measure_links(const loom_ctx_t *ctx, const loom_group_t *g,
                                      loom_plan_links_t *out) {
  const int me = loom_group_rank(g), np = loom_group_size(g);
  if (!out || me < 0) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_plan_measure_links: %s: call it on every member of the group",
                      out ? "this rank is not a member" : "out is NULL");
  }
  const char *a = loom_tunable(ctx, "LOOM_NET_ALPHA_US"), *b = loom_tunable(ctx, "LOOM_NET_GBPS");
  const double set_alpha = a ? atof(a) : 0.0, set_gbps = b ? atof(b) : 0.0;
  MPI_Comm comm = loom_group_comm(g);
  int *node = calloc((size_t)np, sizeof(int)), mine = g->node, ok = 0, all = 0;
  char *buf = malloc(2 * (size_t)LINK_BIG);
  ok = node && buf;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm);
  if (!all) {
    free(node);
    free(buf);
    return loom_error(NULL, LOOM_ERR_NOMEM, "loom_plan_measure_links: cannot allocate 8 MiB");
  }
  MPI_Allgather(&mine, 1, MPI_INT, node, 1, MPI_INT, comm);
  int intra_peer = -1, inter_peer = -1, fullest = 0, equal = 1;
  out->nodes = 0;
  for (int r = 0; r < np; r++) {
    int first = 1, size = 0; // the first rank of its node counts the node
    for (int q = 0; q < np; q++) {
      first &= q >= r || node[q] != node[r];
      size += node[q] == node[r];
    }
    out->nodes += first;
    equal &= r == 0 || size == fullest;
    fullest = size > fullest ? size : fullest;
    if (r > 0 && node[r] == node[0] && intra_peer < 0) {
      intra_peer = r;
    }
    if (node[r] != node[0] && inter_peer < 0) {
      inter_peer = r;
    }
  }
  // The float allreduce's scheme across nodes (comm/coll_mpi.c): hierarchical on 4 ranks or more
  // over nodes of equal sizes of 2 or more, unless LOOM_HIER_ALLREDUCE=off; else flat.
  const char *h = loom_tunable(ctx, "LOOM_HIER_ALLREDUCE");
  const int hier = np >= 4 && equal && fullest >= 2 && !(h && !strcmp(h, "off"));
  out->flat_node_ranks = out->nodes > 1 && !hier ? fullest : 0;
  double fig[4] = {0.0, 1e6, 0.0, 1e6}; // intra alpha, gbps; inter alpha, gbps
  memset(buf, 1, 2 * (size_t)LINK_BIG);
  if (intra_peer > 0) {
    measure_pair(comm, me, intra_peer, buf, fig);
  }
  if (inter_peer > 0 && (set_alpha <= 0.0 || set_gbps <= 0.0)) {
    measure_pair(comm, me, inter_peer, buf, fig + 2);
  }
  MPI_Bcast(fig, 4, MPI_DOUBLE, 0, comm);
  free(buf);
  free(node);
  out->intra = (loom_link_t){fig[0], fig[1]};
  out->inter = inter_peer > 0 ? (loom_link_t){fig[2], fig[3]} : out->intra;
  if (intra_peer < 0) {
    out->intra = out->inter;
  }
  // The tunables describe the network: the inter-node link, or the only link of one node.
  loom_link_t *net = inter_peer > 0 ? &out->inter : &out->intra;
  net->alpha_us = set_alpha > 0.0 ? set_alpha : net->alpha_us;
  net->gbps = set_gbps > 0.0 ? set_gbps : net->gbps;
  if (inter_peer < 0) {
    out->inter = out->intra;
  }
  return LOOM_OK;
}

// ---------------------------------------------------------------------------------------------
// Codec: encode and decode at two sizes (the median of a few runs each) and fit time = a + b n.

static double median_us(const loom_compressor_t *c, int decode, const float *x, int64_t n,
                        void *payload, size_t cap, float *acc) {
  double t[LINK_ROUNDS];
  size_t bytes = 0;
  loom_compressor_encode(c, x, n, 1, payload, cap, &bytes);
  for (int k = 0; k < LINK_ROUNDS; k++) {
    double t0 = MPI_Wtime();
    if (decode) {
      loom_compressor_decode_add(c, payload, bytes, n, 1, acc);
    } else {
      loom_compressor_encode(c, x, n, 1, payload, cap, &bytes);
    }
    t[k] = (MPI_Wtime() - t0) * 1e6;
  }
  qsort(t, LINK_ROUNDS, sizeof t[0], by_value);
  return t[LINK_ROUNDS / 2];
}

static loom_status_t measure_codec(const char *spec, loom_codec_cost_t *out);

// ---------------------------------------------------------------------------------------------
// Cache: one file per host and build, a line per measurement ("spec enc_us enc_ns dec_us dec_ns
// bytes_per_value fixed_bytes"), appended: the last complete line of a spec is its latest
// measurement (LOOM_CODEC_REMEASURE appends a new one). The file is untrusted: a line that is
// cut short (no newline), longer than the buffer, or does not parse into finite, non-negative
// numbers is ignored, and the payload sizes are recomputed from the codec rather than read
// (they are not timings).

static int cache_read(const char *spec, loom_codec_cost_t *out) {
  char line[512], name[128];
  FILE *f = loom_cache_open("codec-costs"); // (not a regular file of at most 1 MiB: absent)
  if (!f) {
    return 0;
  }
  int found = 0;
  while (loom_cache_line(f, line, (int)sizeof line)) {
    double v[6];
    if (sscanf(line, "%127s %lf %lf %lf %lf %lf %lf", name, &v[0], &v[1], &v[2], &v[3], &v[4],
               &v[5]) != 7 ||
        strcmp(name, spec) != 0) {
      continue;
    }
    int ok = 1;
    for (int i = 0; i < 6; i++) {
      ok &= isfinite(v[i]) && v[i] >= 0.0 && v[i] < 1e12;
    }
    if (ok) {
      *out = (loom_codec_cost_t){spec, v[0], v[1], v[2], v[3], v[4], v[5]};
      found = 1;
    }
  }
  fclose(f);
  return found;
}

static void cache_write(const loom_codec_cost_t *c) {
  char line[512];
  snprintf(line, sizeof line, "%s %.17g %.17g %.17g %.17g %.17g %.17g\n", c->compressor, c->enc_us,
           c->enc_ns, c->dec_us, c->dec_ns, c->bytes_per_value, c->fixed_bytes);
  loom_cache_append("codec-costs", line);
}

// The line through two timings, t[0] us at small units and t[1] us at big ones: *per, the slope
// in us per unit (the mean t[1] / big when the slope is not positive), and *fixed, the intercept
// in us (at least 0). Codec costs (units: values) and the PCIe link (units: bytes) take it.
static void fit_line(const double t[2], int64_t small, int64_t big, double *fixed, double *per) {
  double p = (t[1] - t[0]) / (double)(big - small);
  p = p > 0 ? p : t[1] / (double)big;
  *per = p;
  *fixed = t[0] - p * (double)small > 0 ? t[0] - p * (double)small : 0.0;
}

// The payload's bytes per value and fixed bytes, from the codec's sizes at small and big values.
static void payload_line(const loom_compressor_t *c, int64_t small, int64_t big,
                         loom_codec_cost_t *out) {
  double pb = (double)loom_compressor_max_bytes(c, big),
         ps = (double)loom_compressor_max_bytes(c, small);
  out->bytes_per_value = (pb - ps) / (double)(big - small);
  out->fixed_bytes = ps - out->bytes_per_value * (double)small;
}

// A codec's cost line from its encode (e) and decode (d) times in us at small and big values:
// per-value ns and fixed us (the slope and intercept), and the payload's bytes likewise.
static void fit_cost(const char *spec, const loom_compressor_t *c, const double e[2],
                     const double d[2], int64_t small, int64_t big, loom_codec_cost_t *out) {
  double per_e = 0.0, per_d = 0.0;
  fit_line(e, small, big, &out->enc_us, &per_e);
  fit_line(d, small, big, &out->dec_us, &per_d);
  out->compressor = spec;
  out->enc_ns = per_e * 1000.0;
  out->dec_ns = per_d * 1000.0;
  payload_line(c, small, big, out);
}

loom_status_t loom_plan_measure_codec(const char *spec, loom_codec_cost_t *out) {
  if (!spec || !out) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_plan_measure_codec: spec or out is NULL");
  }
  const char *again = getenv("LOOM_CODEC_REMEASURE"); // 1: measure, not the cache
  static int warned = 0;                              // once per process
  if (again && strcmp(again, "0") != 0 && strcmp(again, "1") != 0 && !warned++) {
    LOOM_WARN(LOOM_SUB_COMPRESS,
              "LOOM_CODEC_REMEASURE=%.32s is neither 0 nor 1: read as 0 (the "
              "cached codec costs are used; set 1 to measure them again)",
              again);
  }
  if (!(again && !strcmp(again, "1")) && cache_read(spec, out)) {
    enum { SMALL = 1 << 14, BIG = 1 << 20 };
    loom_compressor_t *c = NULL;
    if (loom_compressor_create(spec, &c) == LOOM_OK) { // (else measure_codec says why)
      payload_line(c, SMALL, BIG, out);
      loom_compressor_destroy(c);
      return LOOM_OK;
    }
  }
  loom_status_t status = measure_codec(spec, out);
  if (status == LOOM_OK) {
    cache_write(out);
  }
  return status;
}

static loom_status_t measure_codec(const char *spec, loom_codec_cost_t *out) {
  enum { SMALL = 1 << 14, BIG = 1 << 20 };
  loom_compressor_t *c = NULL;
  loom_status_t status = loom_compressor_create(spec, &c);
  if (status != LOOM_OK) {
    return status;
  }
  if (loom_compressor_lowrank(c)) {
    loom_compressor_destroy(c);
    return loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                      "loom_plan_measure_codec: %s has no payload codec to time; give its costs "
                      "by hand",
                      spec);
  }
  size_t cap = loom_compressor_max_bytes(c, BIG);
  float *x = malloc(sizeof(float) * BIG), *acc = calloc(BIG, sizeof(float));
  void *payload = malloc(cap);
  if (!x || !acc || !payload) {
    status = loom_error(NULL, LOOM_ERR_NOMEM, "loom_plan_measure_codec: out of memory");
    goto done;
  }
  uint64_t s = 12345;
  for (int i = 0; i < BIG; i++) { // gradient-like values: uniform in [-1, 1)
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (float)((double)(s >> 40) * 0x1p-23 - 1.0);
  }
  const double e[2] = {median_us(c, 0, x, SMALL, payload, cap, acc),
                       median_us(c, 0, x, BIG, payload, cap, acc)};
  const double d[2] = {median_us(c, 1, x, SMALL, payload, cap, acc),
                       median_us(c, 1, x, BIG, payload, cap, acc)};
  fit_cost(spec, c, e, d, SMALL, BIG, out);
done:
  free(x);
  free(acc);
  free(payload);
  loom_compressor_destroy(c);
  return status;
}

// ---------------------------------------------------------------------------------------------
// Device codecs: the same fit, with the CUDA codecs on device memory; each call is timed up to
// the end of its kernels on the current stream.

#ifdef LOOM_HAVE_CUDA
static double median_device_us(const loom_compressor_t *c, int decode, const float *x, int64_t n,
                               uint8_t *payload, size_t cap, float *acc, loom_status_t *status) {
  double t[LINK_ROUNDS];
  size_t bytes = 0;
  cudaStream_t stream = loom_cuda_stream();
  *status = loom_cuda_codec_encode(c, x, n, 1, payload, cap, &bytes);
  for (int k = 0; k < LINK_ROUNDS && *status == LOOM_OK; k++) {
    double t0 = MPI_Wtime();
    *status = decode ? loom_cuda_codec_decode_add(c, payload, bytes, n, 1, acc)
                     : loom_cuda_codec_encode(c, x, n, 1, payload, cap, &bytes);
    if (*status == LOOM_OK && cudaStreamSynchronize(stream) != cudaSuccess) {
      *status = loom_error(NULL, LOOM_ERR_CUDA, "loom_plan_measure_codec_device: %s",
                           cudaGetErrorString(cudaGetLastError()));
    }
    t[k] = (MPI_Wtime() - t0) * 1e6;
  }
  qsort(t, LINK_ROUNDS, sizeof t[0], by_value);
  return t[LINK_ROUNDS / 2];
}
#endif

loom_status_t loom_plan_measure_codec_device(const char *spec, int device, loom_codec_cost_t *out) {
  if (!spec || !out) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_plan_measure_codec_device: %s is NULL: pass a compressor spec and "
                      "where to store its cost",
                      !spec ? "spec" : "out");
  }
#ifndef LOOM_HAVE_CUDA
  (void)device;
  return loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                    "loom_plan_measure_codec_device: loom was built without CUDA: measure the "
                    "host codecs with loom_plan_measure_codec");
#else
  enum { SMALL = 1 << 14, BIG = 1 << 20 };
  loom_compressor_t *c = NULL;
  float *x = NULL, *acc = NULL, *hx = NULL;
  uint8_t *payload = NULL;
  size_t cap = 0;
  cudaError_t rc = cudaSuccess;
  double e[2] = {0.0, 0.0}, d[2] = {0.0, 0.0}; // encode, decode at SMALL and BIG
  loom_status_t status = loom_compressor_create(spec, &c);
  if (status != LOOM_OK) {
    return status;
  }
  if (loom_compressor_lowrank(c)) {
    loom_compressor_destroy(c);
    return loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                      "loom_plan_measure_codec_device: %s has no device codec (host only)", spec);
  }
  LOOM_CHECK(loom_cuda_use_device(device));
  cap = loom_compressor_max_bytes(c, BIG);
  hx = malloc(sizeof(float) * BIG);
  LOOM_CHECK_SYS(NULL, hx != NULL, "malloc(codec timing input)");
  uint64_t s = 12345;
  for (int i = 0; i < BIG; i++) { // gradient-like values: uniform in [-1, 1), as on the host
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    hx[i] = (float)((double)(s >> 40) * 0x1p-23 - 1.0);
  }
  rc = cudaMalloc((void **)&x, sizeof(float) * BIG);
  if (rc == cudaSuccess) {
    rc = cudaMalloc((void **)&acc, sizeof(float) * BIG);
  }
  if (rc == cudaSuccess) {
    rc = cudaMalloc((void **)&payload, cap);
  }
  if (rc == cudaSuccess) {
    rc = cudaMemcpy(x, hx, sizeof(float) * BIG, cudaMemcpyHostToDevice);
  }
  if (rc == cudaSuccess) {
    rc = cudaMemset(acc, 0, sizeof(float) * BIG);
  }
  LOOM_CHECK_CUDA(NULL, rc);
  for (int k = 0; k < 4 && status == LOOM_OK; k++) { // encode small, big; decode small, big
    double us = median_device_us(c, k >= 2, x, k % 2 ? BIG : SMALL, payload, cap, acc, &status);
    *(k >= 2 ? &d[k % 2] : &e[k % 2]) = us;
  }
  LOOM_CHECK(status);
  fit_cost(spec, c, e, d, SMALL, BIG, out);
fail:
  free(hx);
  cudaFree(x);
  cudaFree(acc);
  cudaFree(payload);
  loom_compressor_destroy(c);
  return status;
#endif
}

// ---------------------------------------------------------------------------------------------
// PCIe: pinned host memory <-> device copies on a stream of their own, each timed on the host up
// to its end; one sample is the mean of a copy each way. The median of a few at two sizes, fitted
// like the codecs: alpha from the intercept, the bandwidth from the slope.

#ifdef LOOM_HAVE_CUDA
static loom_status_t copy_us(void *dev, void *host, size_t bytes, cudaStream_t stream, double *us) {
  loom_status_t status = LOOM_OK;
  double t[LINK_ROUNDS];
  for (int k = 0; k < LINK_ROUNDS; k++) {
    double t0 = MPI_Wtime();
    LOOM_CHECK_CUDA(NULL, cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream));
    LOOM_CHECK_CUDA(NULL, cudaStreamSynchronize(stream));
    LOOM_CHECK_CUDA(NULL, cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream));
    LOOM_CHECK_CUDA(NULL, cudaStreamSynchronize(stream));
    t[k] = (MPI_Wtime() - t0) * 1e6 / 2.0;
  }
  qsort(t, LINK_ROUNDS, sizeof t[0], by_value);
  *us = t[LINK_ROUNDS / 2];
fail:
  return status;
}
#endif

loom_status_t loom_plan_measure_pcie(int device, loom_link_t *out) {
  if (!out) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_plan_measure_pcie: out is NULL: pass where to store the link");
  }
#ifndef LOOM_HAVE_CUDA
  (void)device;
  return loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                    "loom_plan_measure_pcie: loom was built without CUDA: there is no host <-> "
                    "device link to measure (a host problem leaves pcie unset)");
#else
  enum { SMALL = 1 << 16, BIG = 1 << 24 }; // bytes: 64 KiB and 16 MiB
  loom_status_t status = LOOM_OK;
  void *dev = NULL, *host = NULL;
  cudaStream_t stream = NULL;
  double t[2] = {0.0, 0.0}, per = 0.0;
  LOOM_CHECK(loom_cuda_use_device(device));
  LOOM_CHECK_CUDA(NULL, cudaMalloc(&dev, BIG));
  LOOM_CHECK_CUDA(NULL, cudaHostAlloc(&host, BIG, cudaHostAllocDefault));
  LOOM_CHECK_CUDA(NULL, cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  memset(host, 1, BIG);
  LOOM_CHECK(copy_us(dev, host, SMALL, stream, &t[0])); // warm-up: first use of the memory
  LOOM_CHECK(copy_us(dev, host, SMALL, stream, &t[0]));
  LOOM_CHECK(copy_us(dev, host, BIG, stream, &t[1]));
  fit_line(t, SMALL, BIG, &out->alpha_us, &per);   // per: us per byte
  out->gbps = per > 0 ? 1.0 / (per * 125.0) : 1e6; // bytes per us / 125 = Gbit/s
fail:
  if (stream) {
    cudaStreamDestroy(stream);
  }
  cudaFree(dev);
  cudaFreeHost(host);
  return status;
#endif
}
