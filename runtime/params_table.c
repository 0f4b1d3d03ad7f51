/* params_table.c — the one table of loom's tunables: environment variable, config field,
 * default, valid values and help, with the parser each uses. Add new tunables here. */
#include "config.h"

#include <stddef.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "layout.h"
#include "log.h"
#include "params.h"

// ---- parsers: return 0 on success, else write why into err -----------------------------------

static int parse_choice(const char *text, const char *choices, int *index) {
  // choices is "a|b|c"; the match is case-insensitive.
  int i = 0;
  for (const char *p = choices; *p; i++) {
    const char *bar = strchr(p, '|');
    size_t n = bar ? (size_t)(bar - p) : strlen(p);
    if (strlen(text) == n && strncasecmp(text, p, n) == 0) {
      *index = i;
      return 0;
    }
    p += n + (bar ? 1 : 0);
  }
  return -1;
}

// A choice tunable stores the index of the matching choice: the choices in the table are
// listed in the order of their enum (enum loom_log_level, enum loom_bind_mode).
static int parse_choice_field(const struct loom_param_desc *d, const char *text, int *field,
                              char *err, size_t errlen) {
  if (parse_choice(text, d->valid, field) != 0) {
    snprintf(err, errlen, "not one of the choices");
    return -1;
  }
  return 0;
}

static int parse_debug(const struct loom_param_desc *d, const char *text, struct loom_params *out,
                       char *err, size_t errlen) {
  _Static_assert(LOOM_LOG_WARN == 0 && LOOM_LOG_INFO == 1 && LOOM_LOG_TRACE == 2, "choice order");
  return parse_choice_field(d, text, &out->debug_level, err, errlen);
}

static int parse_subsys(const struct loom_param_desc *d, const char *text, struct loom_params *out,
                        char *err, size_t errlen) {
  (void)d;
  return loom_parse_subsys_list(text, &out->debug_mask, err, errlen);
}

// Path tunables keep their text; the only error is a path too long for the buffer.
static int copy_path(const char *text, char *dst, size_t size, char *err, size_t errlen) {
  if (strlen(text) >= size) {
    snprintf(err, errlen, "path longer than %zu characters", size - 1);
    return -1;
  }
  snprintf(dst, size, "%s", text);
  return 0;
}

static int parse_file(const struct loom_param_desc *d, const char *text, struct loom_params *out,
                      char *err, size_t errlen) {
  (void)d;
  return copy_path(text, out->debug_file, sizeof out->debug_file, err, errlen);
}

static int parse_bind(const struct loom_param_desc *d, const char *text, struct loom_params *out,
                      char *err, size_t errlen) {
  _Static_assert(LOOM_BIND_CORE == 0 && LOOM_BIND_NUMA == 1 && LOOM_BIND_NONE == 2, "choice order");
  return parse_choice_field(d, text, &out->bind, err, errlen);
}

// Integer tunables: the field to store into is found by the table position.
static int parse_int_field(const struct loom_param_desc *d, const char *text, int *field, char *err,
                           size_t errlen) {
  long v;
  if (loom_parse_int_range(text, d->min, d->max, &v) != 0) {
    snprintf(err, errlen, "not an integer in %ld..%ld", d->min, d->max);
    return -1;
  }
  *field = (int)v;
  return 0;
}

static int parse_blas_threads(const struct loom_param_desc *d, const char *text,
                              struct loom_params *out, char *err, size_t errlen) {
  return parse_int_field(d, text, &out->blas_threads, err, errlen);
}

static int parse_node_size(const struct loom_param_desc *d, const char *text,
                           struct loom_params *out, char *err, size_t errlen) {
  return parse_int_field(d, text, &out->node_size, err, errlen);
}

static int parse_ep_size(const struct loom_param_desc *d, const char *text, struct loom_params *out,
                         char *err, size_t errlen) {
  return parse_int_field(d, text, &out->ep_size, err, errlen);
}

static int parse_fusion(const struct loom_param_desc *d, const char *text, struct loom_params *out,
                        char *err, size_t errlen) {
  return parse_int_field(d, text, &out->fusion_threshold, err, errlen);
}

static int parse_spin(const struct loom_param_desc *d, const char *text, struct loom_params *out,
                      char *err, size_t errlen) {
  return parse_int_field(d, text, &out->sched_spin_us, err, errlen);
}

static int parse_progress(const struct loom_param_desc *d, const char *text,
                          struct loom_params *out, char *err, size_t errlen) {
  return parse_int_field(d, text, &out->sched_progress_us, err, errlen);
}

static int parse_compress(const struct loom_param_desc *d, const char *text,
                          struct loom_params *out, char *err, size_t errlen) {
  (void)d;
  // The compressor registry lives in comm/, above runtime/: only the form is checked here
  // (the trainers create the compressor and report an unknown name with the valid ones).
  if (!*text || strlen(text) >= sizeof out->compress || strpbrk(text, " \t\n\r\v\f")) {
    snprintf(err, errlen, "not none, auto or a compressor spec such as fp16 or topk:0.01");
    return -1;
  }
  snprintf(out->compress, sizeof out->compress, "%s", text);
  return 0;
}

static int parse_nonneg(const char *text, double hi, double *out, char *err, size_t errlen) {
  double x = 0.0;
  if (loom_parse_real(text, &x) != 0 || !(x >= 0.0) || x > hi) {
    snprintf(err, errlen, "not a number in 0..%g", hi);
    return -1;
  }
  *out = x;
  return 0;
}

static int parse_alpha(const struct loom_param_desc *d, const char *text, struct loom_params *out,
                       char *err, size_t errlen) {
  (void)d;
  return parse_nonneg(text, 1e7, &out->net_alpha_us, err, errlen);
}

static int parse_gbps(const struct loom_param_desc *d, const char *text, struct loom_params *out,
                      char *err, size_t errlen) {
  (void)d;
  return parse_nonneg(text, 1e6, &out->net_gbps, err, errlen);
}

static int parse_compress_chunk(const struct loom_param_desc *d, const char *text,
                                struct loom_params *out, char *err, size_t errlen) {
  if (parse_int_field(d, text, &out->compress_chunk, err, errlen) != 0) {
    return -1;
  }
  if (out->compress_chunk > 0 && out->compress_chunk < 1024) {
    snprintf(err, errlen, "not 0 (whole tensors) or at least 1024 bytes");
    return -1;
  }
  return 0;
}

static int parse_moe_overlap(const struct loom_param_desc *d, const char *text,
                             struct loom_params *out, char *err, size_t errlen) {
  (void)d;
  static const char *const names[] = {"none", "coarse", "fine"};
  for (int i = 0; i < 3; i++) {
    if (strcasecmp(text, names[i]) == 0) {
      out->moe_overlap = i;
      return 0;
    }
  }
  snprintf(err, errlen, "not none, coarse or fine");
  return -1;
}

static int parse_timeout(const struct loom_param_desc *d, const char *text, struct loom_params *out,
                         char *err, size_t errlen) {
  return parse_int_field(d, text, &out->timeout, err, errlen);
}

static int parse_nonfinite(const struct loom_param_desc *d, const char *text,
                           struct loom_params *out, char *err, size_t errlen) {
  if (parse_choice(text, d->valid, &out->nonfinite) != 0) {
    snprintf(err, errlen, "not abort or skip");
    return -1;
  }
  return 0;
}

static int parse_plan_lane(const struct loom_param_desc *d, const char *text,
                           struct loom_params *out, char *err, size_t errlen) {
  _Static_assert(LOOM_PLAN_LANE_MODE_AUTO == 0 && LOOM_PLAN_LANE_MODE_GPU == 1 &&
                     LOOM_PLAN_LANE_MODE_CPU == 2,
                 "choice order");
  if (parse_choice(text, d->valid, &out->plan_lane) != 0) {
    snprintf(err, errlen, "not auto, gpu or cpu");
    return -1;
  }
  return 0;
}

static int parse_gemm(const struct loom_param_desc *d, const char *text, struct loom_params *out,
                      char *err, size_t errlen) {
  _Static_assert(LOOM_GEMM_MODE_AUTO == 0 && LOOM_GEMM_MODE_BLAS == 1 && LOOM_GEMM_MODE_LOOM == 2,
                 "choice order");
  if (parse_choice(text, d->valid, &out->gemm) != 0) {
    snprintf(err, errlen, "not auto, blas or loom");
    return -1;
  }
  return 0;
}

static int parse_pipe_bytes(const struct loom_param_desc *d, const char *text,
                            struct loom_params *out, char *err, size_t errlen) {
  return parse_int_field(d, text, &out->pipe_bytes, err, errlen);
}

static int parse_stall_warn(const struct loom_param_desc *d, const char *text,
                            struct loom_params *out, char *err, size_t errlen) {
  return parse_int_field(d, text, &out->stall_warn, err, errlen);
}

static int parse_hier_allreduce(const struct loom_param_desc *d, const char *text,
                                struct loom_params *out, char *err, size_t errlen) {
  if (parse_choice(text, d->valid, &out->hier_allreduce) != 0) {
    snprintf(err, errlen, "not auto or off");
    return -1;
  }
  return 0;
}

static int parse_check_consistency(const struct loom_param_desc *d, const char *text,
                                   struct loom_params *out, char *err, size_t errlen) {
  if (parse_int_field(d, text, &out->check_consistency, err, errlen) != 0) {
    snprintf(err, errlen, "not 0 or 1");
    return -1;
  }
  return 0;
}

static int parse_timeline(const struct loom_param_desc *d, const char *text,
                          struct loom_params *out, char *err, size_t errlen) {
  (void)d;
  return copy_path(text, out->timeline, sizeof out->timeline, err, errlen);
}

static int parse_gpu(const struct loom_param_desc *d, const char *text, struct loom_params *out,
                     char *err, size_t errlen) {
  if (strcasecmp(text, "auto") == 0) {
    out->gpu = LOOM_GPU_AUTO;
    return 0;
  }
  if (strcasecmp(text, "none") == 0) {
    out->gpu = LOOM_GPU_NONE;
    return 0;
  }
  if (parse_int_field(d, text, &out->gpu, err, errlen) != 0) {
    snprintf(err, errlen, "not auto, none or a device index");
    return -1;
  }
  return 0;
}

static int parse_attn(const struct loom_param_desc *d, const char *text, struct loom_params *out,
                      char *err, size_t errlen) {
  if (strcasecmp(text, "inplace") == 0) {
    out->attn_servers = LOOM_ATTN_INPLACE;
    return 0;
  }
  if (parse_int_field(d, text, &out->attn_servers, err, errlen) != 0) {
    snprintf(err, errlen, "not 0, inplace or a number of dedicated server ranks");
    return -1;
  }
  return 0;
}

// ---- the table --------------------------------------------------------------------------------

#define STR_FIELD(f)          0, offsetof(loom_config_t, f)
#define INT_FIELD(f)          1, offsetof(loom_config_t, f)
#define TEXT_OF(x)            #x
#define TEXT_OF_VALUE(x)      TEXT_OF(x)
#define SPIN_DEFAULT_TEXT     TEXT_OF_VALUE(LOOM_SCHED_SPIN_US_DEFAULT)
#define PROGRESS_DEFAULT_TEXT TEXT_OF_VALUE(LOOM_SCHED_PROGRESS_US_DEFAULT)
#define PIPE_DEFAULT_TEXT     TEXT_OF_VALUE(LOOM_PIPE_BYTES_DEFAULT)

const struct loom_param_desc loom_param_table[LOOM_P_COUNT] = {
    [LOOM_P_DEBUG] = {"LOOM_DEBUG", "debug", STR_FIELD(debug), "WARN", "WARN|INFO|TRACE", 0, 0,
                      parse_debug,
                      "log level: warnings only, plus setup/per-step info, or everything"},
    [LOOM_P_DEBUG_SUBSYS] = {"LOOM_DEBUG_SUBSYS", "debug_subsys", STR_FIELD(debug_subsys), "ALL",
                             "ALL or a comma list of INIT,TOPO,ENV,MEM,COLL,COMPRESS,MOE,ATTN,"
                             "SCHED,COMPUTE,CUDA; ^LIST excludes",
                             0, 0, parse_subsys, "subsystems whose INFO/TRACE lines are printed"},
    [LOOM_P_DEBUG_FILE] = {"LOOM_DEBUG_FILE", "debug_file", STR_FIELD(debug_file), "",
                           "a path; %h is the host, %p the pid", 0, 0, parse_file,
                           "write log lines to this file instead of stderr"},
    [LOOM_P_BIND] = {"LOOM_BIND", "bind", STR_FIELD(bind), "core", "core|numa|none", 0, 0,
                     parse_bind,
                     "bind each local rank to its share of cores (of those the job started on; "
                     "see README), to a NUMA node, or not at all"},
    [LOOM_P_BLAS_THREADS] = {"LOOM_BLAS_THREADS", "blas_threads", INT_FIELD(blas_threads), "0",
                             "0..1024", 0, 1024, parse_blas_threads,
                             "BLAS threads per rank; 0 = the rank's share of cores"},
    [LOOM_P_GPU] = {"LOOM_GPU", "gpu", STR_FIELD(gpu), "auto", "auto|none|0..1023", 0, 1023,
                    parse_gpu,
                    "CUDA device: local rank modulo the device count, none, or an index"},
    [LOOM_P_NODE_SIZE] = {"LOOM_NODE_SIZE", "node_size", INT_FIELD(node_size), "0", "0..65536", 0,
                          65536, parse_node_size,
                          "emulate nodes of K consecutive ranks (0 = the real hosts)"},
    [LOOM_P_EP_SIZE] = {"LOOM_EP_SIZE", "ep_size", INT_FIELD(ep_size), "1", "1..65536", 1, 65536,
                        parse_ep_size,
                        "expert-parallel group size; must divide the number of training ranks"},
    [LOOM_P_ATTN_SERVERS] = {"LOOM_ATTN_SERVERS", "attn_servers", STR_FIELD(attn_servers), "0",
                             "0|inplace|N (1..65535)", 0, 65535, parse_attn,
                             "attention servers: off, every trainer serves, or the last N ranks "
                             "only serve"},
    [LOOM_P_FUSION_THRESHOLD] = {"LOOM_FUSION_THRESHOLD", "fusion_threshold",
                                 INT_FIELD(fusion_threshold), "67108864", "0..2147483647", 0,
                                 2147483647, parse_fusion,
                                 "bytes per fusion bucket for small tensors (0 = no fusion)"},
    [LOOM_P_TIMELINE] = {"LOOM_TIMELINE", "timeline", STR_FIELD(timeline), "",
                         "a path; %r is the rank", 0, 0, parse_timeline,
                         "write each rank's step timeline as Chrome trace JSON (Perfetto)"},
    [LOOM_P_SCHED_SPIN_US] = {"LOOM_SCHED_SPIN_US", "sched_spin_us", INT_FIELD(sched_spin_us),
                              SPIN_DEFAULT_TEXT, "0..10000000", 0, 10000000, parse_spin,
                              "microseconds the scheduler polls communication without sleeping "
                              "when it has nothing to compute, before it backs off (0 by "
                              "default when a host has more ranks than cores)"},
    [LOOM_P_SCHED_PROGRESS_US] = {"LOOM_SCHED_PROGRESS_US", "sched_progress_us",
                                  INT_FIELD(sched_progress_us), PROGRESS_DEFAULT_TEXT, "0..1000000",
                                  0, 1000000, parse_progress,
                                  "microseconds between the scheduler's progress-thread polls "
                                  "while communication is in flight (0 = no progress thread)"},
    [LOOM_P_COMPRESS] = {"LOOM_COMPRESS", "compress", STR_FIELD(compress), "auto",
                         "none|auto|a compressor spec (fp16, int8, topk:0.01, ...)", 0, 0,
                         parse_compress,
                         "gradient compression of the example trainers: none, planned per "
                         "tensor (auto), or one compressor for every tensor"},
    [LOOM_P_NET_ALPHA_US] = {"LOOM_NET_ALPHA_US", "net_alpha_us", STR_FIELD(net_alpha_us), "0",
                             "0..1e7", 0, 0, parse_alpha,
                             "link latency in microseconds for the compression planner (0 = "
                             "measure at planning time)"},
    [LOOM_P_NET_GBPS] = {"LOOM_NET_GBPS", "net_gbps", STR_FIELD(net_gbps), "0", "0..1e6", 0, 0,
                         parse_gbps,
                         "link bandwidth in Gbit/s for the compression planner (0 = measure at "
                         "planning time)"},
    [LOOM_P_COMPRESS_CHUNK] = {"LOOM_COMPRESS_CHUNK", "compress_chunk", INT_FIELD(compress_chunk),
                               "4194304", "0 or 1024..2147483647", 0, 2147483647,
                               parse_compress_chunk,
                               "compressed allreduce: bytes of f32 gradient per pipelined chunk "
                               "(encoding, transfer and decoding of successive chunks overlap; "
                               "0 = whole tensors; top-k is never cut)"},
    [LOOM_P_MOE_OVERLAP] = {"LOOM_MOE_OVERLAP", "moe_overlap", STR_FIELD(moe_overlap), "fine",
                            "none|coarse|fine", 0, 0, parse_moe_overlap,
                            "MoE layers: how the dispatch and combine all-to-alls overlap the "
                            "expert GEMMs (blocking, pipelined chunks, or COMET's fine split)"},
    [LOOM_P_TIMEOUT] = {"LOOM_TIMEOUT", "timeout", INT_FIELD(timeout), "300", "0..31536000", 0,
                        31536000, parse_timeout,
                        "seconds a collective, MoE or attention-server exchange may wait for its "
                        "peers before the job aborts with a message naming the ranks that did not "
                        "arrive (0 = wait forever)"},
    [LOOM_P_CHECK_CONSISTENCY] = {"LOOM_CHECK_CONSISTENCY", "check_consistency",
                                  INT_FIELD(check_consistency), "0", "0|1", 0, 1,
                                  parse_check_consistency,
                                  "1: before each collective (MoE and attention-server calls "
                                  "too) the ranks compare operation, tensor name, count, dtype, "
                                  "op/root and group; a mismatch, or a call one rank refuses, is "
                                  "an error on every rank naming it (one small allgather per "
                                  "call)"},
    [LOOM_P_NONFINITE] = {"LOOM_NONFINITE", "nonfinite", STR_FIELD(nonfinite), "abort",
                          "abort|skip", 0, 0, parse_nonfinite,
                          "what a training loop does when the averaged gradient holds a NaN or "
                          "an infinity: abort the job naming the step, or skip the step on "
                          "every rank (counted and logged)"},
    [LOOM_P_PLAN_LANE] = {"LOOM_PLAN_LANE", "plan_lane", STR_FIELD(plan_lane), "auto",
                          "auto|gpu|cpu", 0, 0, parse_plan_lane,
                          "gradients on a GPU (example trainers): the lane that encodes the "
                          "compressed ones: per tensor as the compression plan says (auto), the "
                          "CUDA codecs, or the CPU (host codecs on a pinned copy) for every one"},
    [LOOM_P_GEMM] = {"LOOM_GEMM", "gemm", STR_FIELD(gemm), "auto", "auto|blas|loom", 0, 0,
                     parse_gemm,
                     "host GEMMs with an untransposed left operand: loom's AVX2 kernel for "
                     "products of 512 rows or more where every rank's OpenBLAS runs its AVX2 "
                     "kernels on one thread (auto), always the BLAS, or loom's kernel for every "
                     "one on a CPU with AVX2 and FMA"},
    [LOOM_P_PIPE_BYTES] = {"LOOM_PIPE_BYTES", "pipe_bytes", INT_FIELD(pipe_bytes),
                           PIPE_DEFAULT_TEXT, "8..1073741824", 8, 1073741824, parse_pipe_bytes,
                           "float allreduce and reduce-scatter (summed in rank order, bitwise "
                           "identical on every rank): bytes per peer of each pipelined chunk, "
                           "split among the peers beyond two ranks; the reduction of one chunk "
                           "overlaps the transfer of the next"},
    [LOOM_P_STALL_WARN] = {"LOOM_STALL_WARN", "stall_warn", INT_FIELD(stall_warn), "60",
                           "0..31536000", 0, 31536000, parse_stall_warn,
                           "seconds an operation may wait for its peers before the lowest rank "
                           "that arrived warns, naming the ranks that did not (again every as "
                           "many seconds, until LOOM_TIMEOUT aborts the job; 0 = no warning; "
                           "only while LOOM_TIMEOUT is on)"},
    [LOOM_P_HIER_ALLREDUCE] = {"LOOM_HIER_ALLREDUCE", "hier_allreduce", STR_FIELD(hier_allreduce),
                               "auto", "auto|off", 0, 0, parse_hier_allreduce,
                               "float sum/avg allreduce on a group that spans nodes with the same "
                               "number of its ranks on each: reduce-scatter in the node, "
                               "allreduce between the nodes, allgather in the node, so each "
                               "node's link carries 1/ranks-per-node of the flat scheme's bytes "
                               "(auto); off: the flat scheme always"},
};
