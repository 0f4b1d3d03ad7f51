/* attn_measure.c — what one query row of core attention costs on this core besides its (query,
 * key) pairs, in pairs: the attention balancer's row_cost, timed on the CPU kernels. */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "loom_attn.h"
#include "loom_compute.h"

#define MEASURE_ROWS      256   // query rows of each batch
#define SHORT_LEN         4     // the short documents' length
#define MEASURE_MAX_WIDTH 65536 // heads x head_dim: 9 buffers of 256 rows, 576 MiB at most
#define MEASURE_REPS      5     // the fastest of this many forward + backward runs counts

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

// The (query, key) pairs of a whole document of len rows (the balancer's cost model).
static double pairs_of(int len, int causal) {
  return causal ? 0.5 * (double)len * (double)(len + 1) : (double)len * (double)len;
}

// The buffers of one batch of MEASURE_ROWS rows: q, k, v, out, dout, dq, dk, dv (rows, H(kv), D)
// and lse (H, rows), cu (docs + 1).
typedef struct batch {
  float *f[9];
  int32_t cu[MEASURE_ROWS + 1];
} batch_t;

// The fastest forward + backward of MEASURE_ROWS rows cut into documents of len rows (ms).
static loom_status_t time_batch(batch_t *b, int H, int Hkv, int D, int causal, int len,
                                double *ms) {
  const int docs = MEASURE_ROWS / len;
  for (int i = 0; i <= docs; i++) {
    b->cu[i] = i * len;
  }
  const int64_t sq[3] = {MEASURE_ROWS, H, D}, sk[3] = {MEASURE_ROWS, Hkv, D};
  const int64_t sl[2] = {H, MEASURE_ROWS}, sc[1] = {docs + 1};
  loom_tensor_t t[11];
  loom_status_t status = LOOM_OK;
  const int64_t *shape[9] = {sq, sk, sk, sq, sq, sq, sk, sk, sl};
  const char *names[9] = {"q", "k", "v", "out", "dout", "dq", "dk", "dv", "lse"};
  for (int i = 0; i < 9; i++) {
    LOOM_CHECK(loom_tensor_wrap(&t[i], b->f[i], LOOM_F32, LOOM_DEVICE_HOST, i == 8 ? 2 : 3,
                                shape[i], names[i]));
  }
  LOOM_CHECK(loom_tensor_wrap(&t[9], b->cu, LOOM_I32, LOOM_DEVICE_HOST, 1, sc, "cu_seqlens"));
  LOOM_CHECK(loom_tensor_wrap(&t[10], b->cu, LOOM_I32, LOOM_DEVICE_HOST, 1, sc, "cu_seqlens"));
  *ms = INFINITY;
  for (int r = 0; r <= MEASURE_REPS; r++) { // the first run warms the caches and is not counted
    double t0 = now_ms();
    LOOM_CHECK(
        loom_attention_forward(&t[3], &t[8], &t[0], &t[1], &t[2], &t[9], &t[10], causal, 0.0f));
    LOOM_CHECK(loom_attention_backward(&t[5], &t[6], &t[7], &t[4], &t[0], &t[1], &t[2], &t[3],
                                       &t[8], &t[9], &t[10], causal, 0.0f));
    double dt = now_ms() - t0;
    if (r > 0 && dt < *ms) {
      *ms = dt;
    }
  }
fail:
  return status;
}

loom_status_t loom_attn_measure_row_cost(int heads, int kv_heads, int head_dim, int causal,
                                         double *row_cost) {
  if (!row_cost) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_attn_measure_row_cost: row_cost is NULL: pass where to write it");
  }
  *row_cost = 0.0;
  if (heads < 1 || kv_heads < 1 || heads % kv_heads != 0 || head_dim < 1 || head_dim > 4096 ||
      heads > 4096) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_attn_measure_row_cost: heads %d, kv_heads %d, head_dim %d: need "
                      "1 <= kv_heads, heads a multiple of kv_heads, heads and head_dim in 1..4096",
                      heads, kv_heads, head_dim);
  }
  if (causal != 0 && causal != 1) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_attn_measure_row_cost: causal = %d: need 1 (causal) or 0", causal);
  }
  // Nine batches of MEASURE_ROWS rows of heads x head_dim floats: 4096 x 4096 would ask for
  // 150 GB and meet the OOM killer rather than a failed malloc. Per row and per pair both grow
  // with the heads, so their ratio, the result, is measured as well on fewer.
  if ((int64_t)heads * head_dim > MEASURE_MAX_WIDTH) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_attn_measure_row_cost: heads x head_dim = %d x %d is over %d: the "
                      "result is a ratio per head, so measure with heads and kv_heads divided by "
                      "the same factor",
                      heads, head_dim, MEASURE_MAX_WIDTH);
  }
  batch_t b;
  memset(&b, 0, sizeof b);
  loom_status_t status = LOOM_OK;
  const size_t nq = (size_t)MEASURE_ROWS * (size_t)heads * (size_t)head_dim;
  const size_t nk = (size_t)MEASURE_ROWS * (size_t)kv_heads * (size_t)head_dim;
  const size_t n[9] = {nq, nk, nk, nq, nq, nq, nk, nk, (size_t)MEASURE_ROWS * (size_t)heads};
  for (int i = 0; i < 9; i++) {
    b.f[i] = malloc(n[i] * sizeof(float));
    if (!b.f[i]) {
      status = loom_error(NULL, LOOM_ERR_NOMEM,
                          "loom_attn_measure_row_cost: out of memory for %zu floats", n[i]);
      goto done;
    }
    uint64_t s = 0x726f77ull + (uint64_t)i; // "row": small values in [-0.5, 0.5)
    for (size_t j = 0; j < n[i]; j++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      b.f[i][j] = (float)((double)(s >> 40) * 0x1p-24 - 0.5);
    }
  }
  // One long document and many short ones with the same rows: their times differ by the pairs,
  // and what the short batch costs beyond its pairs is its rows'.
  double t_long, t_short;
  if ((status = time_batch(&b, heads, kv_heads, head_dim, causal, MEASURE_ROWS, &t_long)) !=
          LOOM_OK ||
      (status = time_batch(&b, heads, kv_heads, head_dim, causal, SHORT_LEN, &t_short)) !=
          LOOM_OK) {
    goto done;
  }
  const double p_long = pairs_of(MEASURE_ROWS, causal);
  const double p_short = (double)(MEASURE_ROWS / SHORT_LEN) * pairs_of(SHORT_LEN, causal);
  const double per_pair = (t_long - t_short) / (p_long - p_short);
  if (per_pair > 0.0) { // else the timer saw noise only: pairs alone it is
    const double per_row = (t_short - per_pair * p_short) / (double)MEASURE_ROWS;
    *row_cost = per_row > 0.0 ? per_row / per_pair : 0.0;
  }
done:
  for (int i = 0; i < 9; i++) {
    free(b.f[i]);
  }
  return status;
}
