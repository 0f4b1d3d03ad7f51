/* info.c — what loom_info prints: version, build features (MPI, BLAS, CUDA, NCCL), this host's
 * topology, and every tunable with its value, default, source and help; the README table. */
#include "config.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blas_check.h"
#include "ctx.h"
#include "error.h"
#include "layout.h"
#include "log.h"
#include "params.h"

#ifdef LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#ifdef LOOM_HAVE_NCCL
#include <nccl.h>
#endif

static void print_features(FILE *out) {
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = "unknown";
  int len = 0, initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    MPI_Get_library_version(mpi, &len);
    char *nl = strchr(mpi, '\n');
    if (nl) {
      *nl = '\0';
    }
  }
  int major = 0, minor = 0;
  MPI_Get_version(&major, &minor);
  fprintf(out, "  MPI      : %s (standard %d.%d)\n", mpi, major, minor);
#ifdef HAVE_OPENBLAS_GET_CONFIG
  fprintf(out, "  BLAS     : %s\n", openblas_get_config());
#else
  fprintf(out, "  BLAS     : CBLAS (vendor unknown)\n");
#endif
  const char *core = loom_blas_core(), *env = getenv("OPENBLAS_CORETYPE");
  const int avx512 = loom_cpu_has_avx512();
  fprintf(out, "  BLAS core: %s (%s%s%s; CPU %s AVX-512)%s\n", core,
          env && env[0] ? "OPENBLAS_CORETYPE=" : "detected", env && env[0] ? env : "",
          env && env[0] ? " in the environment" : "", avx512 ? "with" : "without",
          avx512 && loom_blas_core_is_avx2(core)
              ? ": AVX2 kernels; OPENBLAS_CORETYPE=SkylakeX may run sgemm up to 2x faster"
              : "");
#ifdef LOOM_HAVE_CUDA
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  fprintf(out, "  CUDA     : built (runtime %d.%d, driver %s)\n", rt / 1000, (rt % 1000) / 10,
          drv ? "present" : "absent");
#else
  fprintf(out, "  CUDA     : not built (reconfigure with --with-cuda)\n");
#endif
#ifdef LOOM_HAVE_NCCL
  int nccl = 0;
  ncclGetVersion(&nccl);
  fprintf(out, "  NCCL     : built (version code %d)\n", nccl);
#else
  fprintf(out, "  NCCL     : not built\n");
#endif
}

static const char *source_name(int source) {
  return source == LOOM_SRC_ENV ? "env" : source == LOOM_SRC_CONFIG ? "config" : "default";
}

// ---------------------------------------------------------------------------------------------
// The tunables table: variable, value, default and source, each column as wide as its longest
// entry (header included), so that a long name or value does not push the rest of its row out.

enum { COL_VARIABLE, COL_VALUE, COL_DEFAULT, COL_SOURCE, COL_COUNT };

static const char *const col_header[COL_COUNT] = {"variable", "value", "default", "source"};

// Tunable i's entry in column col (an empty one shown as "").
static const char *tunable_cell(const loom_ctx_t *ctx, int i, int col) {
  const struct loom_param_desc *d = &loom_param_table[i];
  const char *text = col == COL_VARIABLE  ? d->env
                     : col == COL_VALUE   ? (ctx ? ctx->params.text[i] : d->def)
                     : col == COL_DEFAULT ? d->def
                                          : (ctx ? source_name(ctx->params.source[i]) : "-");
  return text[0] ? text : "\"\"";
}

static void tunable_widths(const loom_ctx_t *ctx, int width[COL_COUNT]) {
  for (int col = 0; col < COL_COUNT; col++) {
    width[col] = (int)strlen(col_header[col]);
    for (int i = 0; i < LOOM_P_COUNT; i++) {
      int n = (int)strlen(tunable_cell(ctx, i, col));
      width[col] = n > width[col] ? n : width[col];
    }
  }
}

static void print_tunables(const loom_ctx_t *ctx, FILE *out) {
  int w[COL_COUNT];
  tunable_widths(ctx, w);
  fprintf(out, "  %-*s  %-*s  %-*s  %-*s  %s\n", w[0], col_header[0], w[1], col_header[1], w[2],
          col_header[2], w[3], col_header[3], "help");
  for (int i = 0; i < LOOM_P_COUNT; i++) {
    const struct loom_param_desc *d = &loom_param_table[i];
    fprintf(out, "  %-*s  %-*s  %-*s  %-*s  %s [%s]\n", w[0], tunable_cell(ctx, i, COL_VARIABLE),
            w[1], tunable_cell(ctx, i, COL_VALUE), w[2], tunable_cell(ctx, i, COL_DEFAULT), w[3],
            tunable_cell(ctx, i, COL_SOURCE), d->help, d->valid);
  }
}

void loom_print_info(const loom_ctx_t *ctx, FILE *out) {
  if (!out) {
    return;
  }
  fprintf(out, "loom %s\n", loom_version());
  fprintf(out, "build features:\n");
  print_features(out);
  if (ctx) {
    const loom_topology_t *t = &ctx->topo.pub;
    fprintf(out, "topology of %s:\n", ctx->hostname);
    fprintf(out, "  %d package(s), %d NUMA node(s), %d core(s), %d hardware thread(s), %d GPU(s)\n",
            t->sockets, t->numa_nodes, t->cores, t->pus, t->gpus);
    fprintf(out, "  %d rank(s) on %d node(s); MPI thread level %d (MULTIPLE = %d)\n", ctx->size,
            ctx->num_nodes, ctx->thread_level, MPI_THREAD_MULTIPLE);
  }
  fprintf(out, "tunables (environment overrides the config struct):\n");
  print_tunables(ctx, out);
  int forced = 0;
  if (ctx) {
    loom_sched_spin_us_effective(ctx, &forced);
  }
  if (forced) {
    fprintf(out,
            "  (LOOM_SCHED_SPIN_US: the scheduler uses 0 on this rank, not %s: %d ranks share "
            "%d cores here, and a spinning rank would take a core from a computing one; set it "
            "to override)\n",
            ctx->params.text[LOOM_P_SCHED_SPIN_US], ctx->local_size, ctx->topo.pub.cores);
  }
}

// Write text with '|' escaped so that it stays inside one Markdown table cell.
static void markdown_cell(FILE *out, const char *text) {
  for (const char *c = text; *c; c++) {
    if (*c == '|') {
      fputc('\\', out);
    }
    fputc(*c, out);
  }
}

void loom_print_tunables_markdown(FILE *out) {
  if (!out) {
    return;
  }
  fprintf(out, "| variable | config field | default | valid values | what it does |\n");
  fprintf(out, "|---|---|---|---|---|\n");
  for (int i = 0; i < LOOM_P_COUNT; i++) {
    const struct loom_param_desc *d = &loom_param_table[i];
    fprintf(out, "| `%s` | `%s` | %s%s%s | ", d->env, d->field, d->def[0] ? "`" : "",
            d->def[0] ? d->def : "(unset)", d->def[0] ? "`" : "");
    markdown_cell(out, d->valid);
    fprintf(out, " | ");
    markdown_cell(out, d->help);
    fprintf(out, " |\n");
  }
}

loom_status_t loom_print_layout(FILE *out, int max_np) {
  if (!out) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_print_layout: out is NULL: pass a stream such as stdout");
  }
  if (max_np < 1 || max_np > 64) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_print_layout: np %d is outside 1..64",
                      max_np);
  }
  struct loom_params p;
  loom_status_t status = loom_params_resolve(NULL, &p);
  if (status != LOOM_OK) {
    return status;
  }
  loom_layout_print_table(out, max_np, p.node_size, p.ep_size, p.attn_servers);
  return LOOM_OK;
}
