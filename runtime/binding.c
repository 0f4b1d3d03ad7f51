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

// Cores [first, first+count) as an hwloc cpuset (all their PUs).
static hwloc_bitmap_t cores_cpuset(hwloc_topology_t topo, int first, int count) {
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  if (!set) {
    return NULL;
  }
  hwloc_obj_type_t type =
      hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  for (int i = first; i < first + count; i++) {
    hwloc_obj_t core = hwloc_get_obj_by_type(topo, type, (unsigned)i);
    if (core) {
      hwloc_bitmap_or(set, set, core->cpuset);
    }
  }
  return set;
}

loom_status_t loom_topo_bind(loom_ctx_t *ctx, struct loom_topo *t, int mode, int local_rank,
                             int local_size, int *first, int *count) {
  loom_status_t status = LOOM_OK;
  hwloc_bitmap_t set = NULL;
  int ncores = t->pub.cores;
  *first = 0;
  *count = ncores;
  if (mode == LOOM_BIND_NONE) {
    LOOM_INFO(LOOM_SUB_TOPO, "LOOM_BIND=none: leaving the binding set by the launcher");
    return LOOM_OK;
  }
  if (mode == LOOM_BIND_CORE) {
    loom_bind_plan(ncores, local_rank, local_size, first, count);
    if (local_size > ncores) {
      LOOM_INFO(LOOM_SUB_TOPO, "%d ranks share %d cores on this host: rank %d shares core %d",
                local_size, ncores, local_rank, *first);
    }
    set = cores_cpuset(t->topo, *first, *count);
  } else { // NUMA: ranks are spread over NUMA nodes in blocks
    int nnuma = t->pub.numa_nodes;
    int which = (int)((long)local_rank * nnuma / local_size);
    hwloc_obj_t numa = hwloc_get_obj_by_type(t->topo, HWLOC_OBJ_NUMANODE, (unsigned)which);
    set = hwloc_bitmap_dup(numa ? numa->cpuset : hwloc_topology_get_allowed_cpuset(t->topo));
    int lo = -1, n = 0;
    for (int i = 0; i < ncores; i++) {
      hwloc_obj_t core = hwloc_get_obj_by_type(t->topo, HWLOC_OBJ_CORE, (unsigned)i);
      if (core && set && hwloc_bitmap_isincluded(core->cpuset, set)) {
        lo = lo < 0 ? i : lo;
        n++;
      }
    }
    *first = lo < 0 ? 0 : lo;
    *count = n > 0 ? n : ncores;
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
  return LOOM_OK;
fail:
  hwloc_bitmap_free(set);
  return status;
}
