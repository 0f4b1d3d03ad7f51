/* test_tunables.c — under mpirun with an adopted MPI: every tunable's bad value makes loom_init
 * fail on every rank with a message naming the variable and valid values; so do a bad value on
 * one rank only, a value that differs between ranks, and an unwritable log file; INFO logging of
 * set tunables reaches LOOM_DEBUG_FILE. */
#include "config.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../check_mpi.h"
#include "loom.h"
#include "params.h"

static const char *const bad[LOOM_P_COUNT] = {
    [LOOM_P_DEBUG] = "LOUD",
    [LOOM_P_DEBUG_SUBSYS] = "NOPE",
    [LOOM_P_DEBUG_FILE] = NULL,
    [LOOM_P_BIND] = "socket",
    [LOOM_P_BLAS_THREADS] = "-4",
    [LOOM_P_GPU] = "first",
    [LOOM_P_NODE_SIZE] = "half",
    [LOOM_P_EP_SIZE] = "0",
    [LOOM_P_ATTN_SERVERS] = "all",
    [LOOM_P_TIMEOUT] = "soon",
    [LOOM_P_CHECK_CONSISTENCY] = "on",
    [LOOM_P_PLAN_LANE] = "both",
    [LOOM_P_GEMM] = "mkl",
    [LOOM_P_PIPE_BYTES] = "4",
    [LOOM_P_STALL_WARN] = "-1",
};

// loom_init must fail with want on every rank and the message must contain both strings.
// var = v0 on rank 0 and v1 elsewhere: two spellings of one value, which loom_init accepts.
static void same_value(int rank, const char *var, const char *v0, const char *v1) {
  setenv(var, rank == 0 ? v0 : v1, 1);
  loom_ctx_t *ctx = NULL;
  CHECK(loom_init(NULL, NULL, NULL, &ctx) == LOOM_OK, "%s '%s' / '%s': %s", var, v0, v1,
        loom_last_error(NULL));
  if (ctx) {
    loom_finalize(ctx);
  }
  unsetenv(var);
}

static void expect_fail(loom_status_t want, const char *a, const char *b) {
  loom_ctx_t *ctx = NULL;
  loom_status_t st = loom_init(NULL, NULL, NULL, &ctx);
  CHECK(st == want && ctx == NULL, "status %d want %d (%s)", st, want, loom_last_error(NULL));
  const char *msg = loom_last_error(NULL);
  CHECK(strstr(msg, a) && (!b || strstr(msg, b)), "message '%s' lacks '%s'/'%s'", msg, a,
        b ? b : "");
  if (ctx) {
    loom_finalize(ctx);
  }
}

int main(int argc, char **argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  for (int i = 0; i < LOOM_P_COUNT; i++) {
    if (!bad[i]) {
      continue;
    }
    const struct loom_param_desc *d = &loom_param_table[i];
    setenv(d->env, bad[i], 1);
    expect_fail(LOOM_ERR_INVALID_ARG, d->env, d->valid);
    unsetenv(d->env);
  }
  // Bad on the last rank only: every rank fails and names that rank.
  if (rank == size - 1) {
    setenv("LOOM_BIND", "socket", 1);
  }
  char who[32];
  snprintf(who, sizeof who, "rank %d", size - 1);
  expect_fail(LOOM_ERR_INVALID_ARG, "LOOM_BIND", rank == size - 1 ? "core|numa|none" : who);
  unsetenv("LOOM_BIND");
  // A group-shaping value that differs between ranks.
  if (size > 1) {
    setenv("LOOM_NODE_SIZE", rank == 0 ? "1" : "2", 1);
    expect_fail(LOOM_ERR_INVALID_ARG, "LOOM_NODE_SIZE differs between ranks", NULL);
    unsetenv("LOOM_NODE_SIZE");
    // The GEMM kernel decides the bits of every product: it must not depend on the rank.
    setenv("LOOM_GEMM", rank == 0 ? "blas" : "loom", 1);
    expect_fail(LOOM_ERR_INVALID_ARG, "LOOM_GEMM differs between ranks",
                "rank 0 has 'blas', rank 1 has 'loom'");
    unsetenv("LOOM_GEMM");
    // Values that decide which messages a rank posts: a timeout of 0 on one rank once skipped
    // the watchdog's collective window creation there and hung loom_init; another fusion
    // threshold or compression plan makes other buckets (a count mismatch corrupts memory).
    // The case of a choice does not matter; the last rank alone differing is named.
    setenv("LOOM_TIMEOUT", rank == 0 ? "0" : "10", 1);
    expect_fail(LOOM_ERR_INVALID_ARG, "LOOM_TIMEOUT differs between ranks",
                "rank 0 has '0', rank 1 has '10'");
    unsetenv("LOOM_TIMEOUT");
    setenv("LOOM_FUSION_THRESHOLD", rank == size - 1 ? "0" : "1024", 1);
    snprintf(who, sizeof who, "rank %d has '0'", size - 1);
    expect_fail(LOOM_ERR_INVALID_ARG, "LOOM_FUSION_THRESHOLD differs between ranks", who);
    unsetenv("LOOM_FUSION_THRESHOLD");
    // Another pipeline chunk posts other message sizes in every ordered reduction (a receive
    // shorter than its message); the same number spelled otherwise is the same value.
    setenv("LOOM_PIPE_BYTES", rank == size - 1 ? "64" : "1048576", 1);
    snprintf(who, sizeof who, "rank %d has '64'", size - 1);
    expect_fail(LOOM_ERR_INVALID_ARG, "LOOM_PIPE_BYTES differs between ranks", who);
    same_value(rank, "LOOM_PIPE_BYTES", "64", " +064");
    unsetenv("LOOM_PIPE_BYTES");
    // The lowest rank that arrived warns for the group: a rank with 0 would silence the others.
    setenv("LOOM_STALL_WARN", rank == size - 1 ? "0" : "60", 1);
    snprintf(who, sizeof who, "rank %d has '0'", size - 1);
    expect_fail(LOOM_ERR_INVALID_ARG, "LOOM_STALL_WARN differs between ranks", who);
    unsetenv("LOOM_STALL_WARN");
    same_value(rank, "LOOM_MOE_OVERLAP", "FINE", "fine");
  }
  // An EP size that does not divide the ranks, and too many attention servers.
  char v[16];
  snprintf(v, sizeof v, "%d", size + 1);
  setenv("LOOM_EP_SIZE", v, 1);
  expect_fail(LOOM_ERR_INVALID_ARG, "LOOM_EP_SIZE", "does not divide");
  unsetenv("LOOM_EP_SIZE");
  snprintf(v, sizeof v, "%d", size);
  setenv("LOOM_ATTN_SERVERS", v, 1);
  expect_fail(LOOM_ERR_INVALID_ARG, "LOOM_ATTN_SERVERS", "leaves no training rank");
  unsetenv("LOOM_ATTN_SERVERS");
  // Unwritable log file.
  setenv("LOOM_DEBUG_FILE", "/nonexistent/dir/loom.%p.log", 1);
  expect_fail(LOOM_ERR_SYSTEM, "LOOM_DEBUG_FILE", "cannot be opened");
  unsetenv("LOOM_DEBUG_FILE");

  // INFO logging of set tunables goes to the per-process file.
  char path[256], host[64];
  gethostname(host, sizeof host);
  host[sizeof host - 1] = '\0';
  snprintf(path, sizeof path, "/tmp/loom_tunables.%s.%ld.log", host, (long)getpid());
  unlink(path);
  setenv("LOOM_DEBUG_FILE", "/tmp/loom_tunables.%h.%p.log", 1);
  setenv("LOOM_DEBUG", "INFO", 1);
  setenv("LOOM_BLAS_THREADS", "1", 1);
  loom_ctx_t *ctx = NULL;
  CHECK(loom_init(NULL, NULL, NULL, &ctx) == LOOM_OK, "init with logging: %s",
        loom_last_error(NULL));
  if (ctx) {
    CHECK(loom_blas_threads(ctx) == 1, "LOOM_BLAS_THREADS=1 applied");
    loom_finalize(ctx);
  }
  FILE *f = fopen(path, "r");
  CHECK(f != NULL, "log file %s", path);
  if (f) {
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    char tag[32];
    snprintf(tag, sizeof tag, "[%d] LOOM INFO ENV", rank);
    CHECK(strstr(text, tag) && strstr(text, "LOOM_BLAS_THREADS set by environment to 1"),
          "INFO line for the set tunable in:\n%s", text);
    unlink(path);
  }
  int rc = check_exit_all("test_tunables");
  MPI_Finalize();
  return rc;
}
