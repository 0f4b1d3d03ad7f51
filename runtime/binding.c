/* binding.c — place a rank on this host: its share of cores (or a NUMA node), the BLAS thread
 * count that matches, and the CUDA device chosen by local rank. */
#include "config.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "error.h"
#include "log.h"
#include "params.h"
#include "topology.h"

#ifdef LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

void loom_bind_plan(int ncores, int local_rank, int local_size, int *first, int *count) {
  if (ncores < 1 || local_size < 1) {
    *first = 0;
    *count = ncores > 0 ? ncores : 1;
    return;
  }
  if (local_size >= ncores) {
    *first = local_rank % ncores;
    *count = 1;
    return;
  }
  int base = ncores / local_size, extra = ncores % local_size;
  *count = base + (local_rank < extra ? 1 : 0);
  *first = local_rank * base + (local_rank < extra ? local_rank : extra);
}

int loom_set_blas_threads(int n) {
#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
  openblas_set_num_threads(n);
  return openblas_get_num_threads();
#else
  (void)n;
  return 1;
#endif
}

loom_status_t loom_topo_launch_cores(loom_ctx_t *ctx, struct loom_topo *t, MPI_Comm host) {
  loom_status_t status = LOOM_OK;
  const int ncores = t->pub.cores;
  hwloc_bitmap_t start = hwloc_bitmap_alloc();
  unsigned char *mine = malloc((size_t)ncores);
  free(t->launch_cores);
  t->launch_cores = malloc((size_t)ncores);
  LOOM_CHECK_SYS(ctx, start && mine && t->launch_cores, "malloc(launch cores)");
  // Open MPI's per-rank binding is a default loom replaces; any other starting mask was asked
  // for around the program (a failed query reads as no restriction).
  const char *ompi = getenv("OMPI_MCA_orte_bound_at_launch");
  const int launcher_bound = ompi && !strcmp(ompi, "1");
  const int known =
      !launcher_bound && hwloc_get_cpubind(t->topo, start, HWLOC_CPUBIND_PROCESS) == 0;
  hwloc_obj_type_t type =
      hwloc_get_nbobjs_by_type(t->topo, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  for (int i = 0; i < ncores; i++) {
    hwloc_obj_t core = hwloc_get_obj_by_type(t->topo, type, (unsigned)i);
    mine[i] = !known || (core && hwloc_bitmap_intersects(core->cpuset, start));
  }
  LOOM_CHECK_MPI(ctx,
                 MPI_Allreduce(mine, t->launch_cores, ncores, MPI_UNSIGNED_CHAR, MPI_MAX, host));
fail:
  hwloc_bitmap_free(start);
  free(mine);
  return status;
}

// The cores LOOM_BIND=core plans over (indices into the host's cores); returns how many.
static int launch_core_list(const struct loom_topo *t, int *list) {
  int n = 0;
  for (int i = 0; i < t->pub.cores; i++) {
    if (!t->launch_cores || t->launch_cores[i]) {
      list[n++] = i;
    }
  }
  if (n == 0) { // (no starting mask met a core: every core)
    for (; n < t->pub.cores; n++) {
      list[n] = n;
    }
  }
  return n;
}

// Cores list[0..count) as an hwloc cpuset (all their PUs).
static hwloc_bitmap_t cores_cpuset(hwloc_topology_t topo, const int *list, int count) {
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  if (!set) {
    return NULL;
  }
  hwloc_obj_type_t type =
      hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  for (int i = 0; i < count; i++) {
    hwloc_obj_t core = hwloc_get_obj_by_type(topo, type, (unsigned)list[i]);
    if (core) {
      hwloc_bitmap_or(set, set, core->cpuset);
    }
  }
  return set;
}

// The ascending core indices list[0..count) as text, runs as ranges: "0-3", "1,3".
static void cores_text(const int *list, int count, char *text, size_t len) {
  size_t used = 0;
  text[0] = '\0';
  for (int i = 0; i < count && used < len; i++) {
    int end = i;
    while (end + 1 < count && list[end + 1] == list[end] + 1) {
      end++;
    }
    int w = end > i
                ? snprintf(text + used, len - used, "%s%d-%d", used ? "," : "", list[i], list[end])
                : snprintf(text + used, len - used, "%s%d", used ? "," : "", list[i]);
    used += w > 0 ? (size_t)w : 0;
    i = end;
  }
}

loom_status_t loom_topo_bind(loom_ctx_t *ctx, struct loom_topo *t, int mode, int local_rank,
                             int local_size, int *first, int *count, char *cores_text_out,
                             size_t text_len) {
  loom_status_t status = LOOM_OK;
  hwloc_bitmap_t set = NULL;
  int ncores = t->pub.cores;
  int *list = malloc(sizeof(int) * (size_t)(ncores > 0 ? ncores : 1));
  if (!list) {
    return loom_error(ctx, LOOM_ERR_NOMEM, "cannot allocate the list of cores");
  }
  for (int i = 0; i < ncores; i++) {
    list[i] = i;
  }
  *first = 0;
  *count = ncores;
  snprintf(cores_text_out, text_len, "0-%d", ncores - 1);
  if (mode == LOOM_BIND_NONE) {
    LOOM_INFO(LOOM_SUB_TOPO, "LOOM_BIND=none: leaving the binding set by the launcher");
    free(list);
    return LOOM_OK;
  }
  if (mode == LOOM_BIND_CORE) {
    const int ncand = launch_core_list(t, list);
    if (ncand < ncores) {
      LOOM_INFO(LOOM_SUB_TOPO,
                "the ranks of this host started on %d of its %d cores (taskset, numactl or the "
                "job's cpuset): binding within them",
                ncand, ncores);
    }
    int f = 0, c = 0;
    loom_bind_plan(ncand, local_rank, local_size, &f, &c);
    if (local_size > ncand) {
      LOOM_INFO(LOOM_SUB_TOPO, "%d ranks share %d cores on this host: rank %d shares core %d",
                local_size, ncand, local_rank, list[f]);
    }
    *first = list[f];
    *count = c;
    set = cores_cpuset(t->topo, list + f, c);
    cores_text(list + f, c, cores_text_out, text_len);
  } else { // NUMA: ranks are spread over NUMA nodes in blocks
    int nnuma = t->pub.numa_nodes;
    int which = (int)((long)local_rank * nnuma / local_size);
    hwloc_obj_t numa = hwloc_get_obj_by_type(t->topo, HWLOC_OBJ_NUMANODE, (unsigned)which);
    set = hwloc_bitmap_dup(numa ? numa->cpuset : hwloc_topology_get_allowed_cpuset(t->topo));
    int n = 0;
    for (int i = 0; i < ncores; i++) {
      hwloc_obj_t core = hwloc_get_obj_by_type(t->topo, HWLOC_OBJ_CORE, (unsigned)i);
      if (core && set && hwloc_bitmap_isincluded(core->cpuset, set)) {
        list[n++] = i;
      }
    }
    *first = n > 0 ? list[0] : 0;
    *count = n > 0 ? n : ncores;
    cores_text(list, n, cores_text_out, text_len);
  }
  if (!set) {
    status = loom_error(ctx, LOOM_ERR_NOMEM, "cannot allocate an hwloc cpuset");
    goto fail;
  }
  if (hwloc_set_cpubind(t->topo, set, HWLOC_CPUBIND_PROCESS) != 0) {
    char *s = NULL;
    hwloc_bitmap_asprintf(&s, set);
    status = loom_error(ctx, LOOM_ERR_SYSTEM,
                        "binding to cpuset %s failed (%s): set LOOM_BIND=none to keep the "
                        "launcher's binding",
                        s ? s : "?", strerror(errno));
    free(s);
    goto fail;
  }
  hwloc_bitmap_free(set);
  free(list);
  return LOOM_OK;
fail:
  hwloc_bitmap_free(set);
  free(list);
  return status;
}
