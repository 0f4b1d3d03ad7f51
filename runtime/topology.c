/* topology.c — discover this host with hwloc: packages, NUMA nodes, cores and hardware threads
 * this process may use, plus the CUDA devices visible to it. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>

#include "ctx.h"
#include "error.h"
#include "log.h"
#include "loom_tensor.h"
#include "topology.h"

static int count_type(hwloc_topology_t topo, hwloc_obj_type_t type) {
  int n = hwloc_get_nbobjs_by_type(topo, type);
  return n > 0 ? n : 0;
}

loom_status_t loom_topo_discover(loom_ctx_t *ctx, struct loom_topo *t) {
  loom_status_t status = LOOM_OK;
  t->topo = NULL;
  t->launch_cores = NULL;
  if (hwloc_topology_init(&t->topo) != 0) {
    t->topo = NULL;
    status = loom_error(ctx, LOOM_ERR_SYSTEM, "hwloc_topology_init failed: cannot read topology");
    goto fail;
  }
  if (hwloc_topology_load(t->topo) != 0) {
    status = loom_error(ctx, LOOM_ERR_SYSTEM,
                        "hwloc_topology_load failed: check that /sys and /proc are readable");
    goto fail;
  }
  t->pub.sockets = count_type(t->topo, HWLOC_OBJ_PACKAGE);
  t->pub.numa_nodes = count_type(t->topo, HWLOC_OBJ_NUMANODE);
  t->pub.cores = count_type(t->topo, HWLOC_OBJ_CORE);
  t->pub.pus = count_type(t->topo, HWLOC_OBJ_PU);
  if (t->pub.cores == 0) { // some virtual machines report PUs only
    t->pub.cores = t->pub.pus;
  }
  if (t->pub.numa_nodes == 0) {
    t->pub.numa_nodes = 1;
  }
  t->pub.gpus = loom_cuda_device_count();
  LOOM_INFO(LOOM_SUB_TOPO,
            "host has %d package(s), %d NUMA node(s), %d core(s), %d PU(s), %d GPU(s)",
            t->pub.sockets, t->pub.numa_nodes, t->pub.cores, t->pub.pus, t->pub.gpus);
  return LOOM_OK;
fail:
  loom_topo_destroy(t);
  return status;
}

void loom_topo_destroy(struct loom_topo *t) {
  free(t->launch_cores);
  t->launch_cores = NULL;
  if (t->topo) {
    hwloc_topology_destroy(t->topo);
    t->topo = NULL;
  }
}

int loom_sched_spin_us_effective(const loom_ctx_t *ctx, int *forced) {
  *forced = ctx->params.source[LOOM_P_SCHED_SPIN_US] == LOOM_SRC_DEFAULT &&
            ctx->topo.pub.cores > 0 && ctx->local_size > ctx->topo.pub.cores;
  return *forced ? 0 : ctx->params.sched_spin_us;
}
