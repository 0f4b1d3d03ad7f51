/* topology.h — hwloc discovery of this host (sockets, NUMA nodes, cores, GPUs) and binding of
 * a rank to its share of cores; the binding plan itself is a pure function for the tests. */
#ifndef LOOM_TOPOLOGY_H
#define LOOM_TOPOLOGY_H

#include <hwloc.h>
#include <mpi.h>

#include "loom_core.h"

struct loom_topo {
  hwloc_topology_t topo;       // NULL until discovered
  loom_topology_t pub;         // counts reported to users
  unsigned char *launch_cores; // per core of pub.cores: 1 where LOOM_BIND=core may bind
};

loom_status_t loom_topo_discover(loom_ctx_t *ctx, struct loom_topo *t);
void loom_topo_destroy(struct loom_topo *t);

// Cores [first, first+count) for local rank `local_rank` of `local_size` on `ncores` cores:
// an even split with the remainder spread over the first ranks; when there are more ranks
// than cores, rank i shares core i % ncores.
void loom_bind_plan(int ncores, int local_rank, int local_size, int *first, int *count);

// The cores LOOM_BIND=core plans over on this host (t->launch_cores): every core, unless a rank
// of the host started with a narrower affinity that its launcher did not set as its own per-rank
// binding (taskset or numactl around the program, or around mpirun --bind-to none; the cores of a
// Slurm step): then the union of the host's ranks' starting masks. Open MPI's per-rank binding
// (OMPI_MCA_orte_bound_at_launch=1) is loom's to replace, as it always was. Collective over host.
loom_status_t loom_topo_launch_cores(loom_ctx_t *ctx, struct loom_topo *t, MPI_Comm host);

// Bind this process per mode (enum loom_bind_mode) and report the chosen cores: the lowest and
// how many, and the list of them as text ("2-3", "0,2"). local_rank/local_size are those of the
// physical host (not emulated nodes).
loom_status_t loom_topo_bind(loom_ctx_t *ctx, struct loom_topo *t, int mode, int local_rank,
                             int local_size, int *first, int *count, char *cores_text,
                             size_t text_len);

// Set the BLAS library's thread count (OpenBLAS); returns the count in effect.
int loom_set_blas_threads(int n);

#endif
