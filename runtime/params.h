/* params.h — the tunables: one table entry per LOOM_* variable (env name, config field, default,
 * valid values, help) and the resolved values loom_init works from. */
#ifndef LOOM_PARAMS_H
#define LOOM_PARAMS_H

#include <stddef.h>

#include "loom_core.h"

enum loom_bind_mode { LOOM_BIND_CORE = 0, LOOM_BIND_NUMA, LOOM_BIND_NONE };
// LOOM_PLAN_LANE: which lane encodes compressed gradients that live on a GPU.
enum loom_plan_lane_mode {
  LOOM_PLAN_LANE_MODE_AUTO = 0,
  LOOM_PLAN_LANE_MODE_GPU,
  LOOM_PLAN_LANE_MODE_CPU
};
// LOOM_GEMM: which kernel runs host GEMMs whose a is not transposed.
enum loom_gemm_mode { LOOM_GEMM_MODE_AUTO = 0, LOOM_GEMM_MODE_BLAS, LOOM_GEMM_MODE_LOOM };
#define LOOM_GPU_AUTO     (-2)
#define LOOM_GPU_NONE     (-1)
#define LOOM_ATTN_INPLACE (-1)
// The LOOM_SCHED_SPIN_US default, also used by a scheduler created without a context.
#define LOOM_SCHED_SPIN_US_DEFAULT 20000
// The LOOM_SCHED_PROGRESS_US default, likewise.
#define LOOM_SCHED_PROGRESS_US_DEFAULT 1000
// The LOOM_PIPE_BYTES default, also used by a group built without a context.
#define LOOM_PIPE_BYTES_DEFAULT 1048576

// Indices into loom_param_table; keep in the table's order.
enum loom_param_id {
  LOOM_P_DEBUG = 0,
  LOOM_P_DEBUG_SUBSYS,
  LOOM_P_DEBUG_FILE,
  LOOM_P_BIND,
  LOOM_P_BLAS_THREADS,
  LOOM_P_GPU,
  LOOM_P_NODE_SIZE,
  LOOM_P_EP_SIZE,
  LOOM_P_ATTN_SERVERS,
  LOOM_P_FUSION_THRESHOLD,
  LOOM_P_TIMELINE,
  LOOM_P_SCHED_SPIN_US,
  LOOM_P_SCHED_PROGRESS_US,
  LOOM_P_COMPRESS,
  LOOM_P_NET_ALPHA_US,
  LOOM_P_NET_GBPS,
  LOOM_P_COMPRESS_CHUNK,
  LOOM_P_MOE_OVERLAP,
  LOOM_P_TIMEOUT,
  LOOM_P_CHECK_CONSISTENCY,
  LOOM_P_NONFINITE,
  LOOM_P_PLAN_LANE,
  LOOM_P_GEMM,
  LOOM_P_PIPE_BYTES,
  LOOM_P_STALL_WARN,
  LOOM_P_HIER_ALLREDUCE,
  LOOM_P_COUNT
};

// Where a resolved value came from.
enum loom_param_source { LOOM_SRC_DEFAULT = 0, LOOM_SRC_CONFIG, LOOM_SRC_ENV };

#define LOOM_PARAM_TEXT_MAX 256

struct loom_params {
  int debug_level;                      // enum loom_log_level
  unsigned debug_mask;                  // enum loom_log_subsys bits
  char debug_file[LOOM_PARAM_TEXT_MAX]; // "" = stderr
  int bind;                             // enum loom_bind_mode
  int blas_threads;                     // 0 = auto
  int gpu;                              // LOOM_GPU_AUTO, LOOM_GPU_NONE or a device index
  int node_size;                        // 0 = real nodes
  int ep_size;                          // >= 1
  int attn_servers;                     // 0 off, LOOM_ATTN_INPLACE, or N dedicated ranks
  char timeline[LOOM_PARAM_TEXT_MAX];   // Chrome trace path per rank (%r = rank); "" = off
  int fusion_threshold;                 // bytes per fusion bucket (0: every tensor travels alone)
  int sched_spin_us;                    // scheduler: poll without sleeping this long (us)
  int sched_progress_us;                // scheduler: progress thread interval (us), 0 = none
  char compress[LOOM_PARAM_TEXT_MAX];   // auto, none or a compressor spec
  double net_alpha_us;                  // 0 = measure at planning time
  double net_gbps;                      // 0 = measure at planning time
  int compress_chunk;                   // f32 bytes per pipelined chunk (0: whole tensors)
  int moe_overlap;                      // loom_moe_overlap_t: 0 none, 1 coarse, 2 fine
  int timeout;                          // seconds before a stuck operation aborts (0: never)
  int check_consistency;                // 1: ranks compare each collective's arguments first
  int nonfinite;                        // 0 abort, 1 skip a step with a non-finite gradient
  int plan_lane;                        // enum loom_plan_lane_mode: auto, gpu, cpu
  int gemm;                             // enum loom_gemm_mode: auto, blas, loom
  int pipe_bytes;                       // ordered reductions: bytes per peer per pipeline chunk
  int stall_warn;                       // seconds of waiting before a stall warning (0: none)
  int hier_allreduce;                   // 0 auto (over nodes when they allow), 1 off (flat)
  char text[LOOM_P_COUNT][LOOM_PARAM_TEXT_MAX]; // value as given (or the default)
  int source[LOOM_P_COUNT];                     // enum loom_param_source
};

struct loom_param_desc;
// Parse text into out; on error write a message (without the variable name) into err.
typedef int (*loom_param_parse_fn)(const struct loom_param_desc *d, const char *text,
                                   struct loom_params *out, char *err, size_t errlen);

struct loom_param_desc {
  const char *env;     // environment variable, e.g. "LOOM_EP_SIZE"
  const char *field;   // loom_config_t field, e.g. "ep_size"
  int field_is_int;    // 1: int field (LOOM_UNSET = unset); 0: const char * (NULL = unset)
  size_t field_offset; // offsetof(loom_config_t, field)
  const char *def;     // default, as text
  const char *valid;   // valid values, as shown to users ("1..4096", "core|numa|none")
  long min, max;       // integer range where the value is an integer
  loom_param_parse_fn parse;
  const char *help; // one line
};

extern const struct loom_param_desc loom_param_table[LOOM_P_COUNT];

// Resolve every tunable: environment, else cfg (may be NULL), else default. On a bad value
// returns LOOM_ERR_INVALID_ARG with a message naming the variable and its valid values.
loom_status_t loom_params_resolve(const loom_config_t *cfg, struct loom_params *out);

// Log one warning per LOOM_ variable of the environment that is neither a tunable nor one of
// the few other names loom and its tools read (a misspelling, with the closest tunable named).
// Returns how many there were.
int loom_params_warn_unknown_env(void);

// Parsers used by the table (also unit-tested directly).
int loom_parse_int_range(const char *text, long min, long max, long *value);
// A decimal real number with optional white space around it (no hex, inf or nan): 0, or -1.
int loom_parse_real(const char *text, double *value);
int loom_parse_subsys_list(const char *text, unsigned *mask, char *err, size_t errlen);

#endif
