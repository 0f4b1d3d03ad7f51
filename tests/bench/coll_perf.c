/* coll_perf.c — nccl-tests for loom: time a collective over a range of sizes, report algorithm
 * and bus bandwidth, check the results; --raw-mpi times plain MPI calls for comparison. */
#include "config.h"

#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../testutil.h"
#include "loom.h"

// Usage: mpirun -np N coll_perf [-b 8] [-e 64M] [-f 2] [-n 20] [-w 5] [-c 1] [-d float]
//          [-o sum] [--op allreduce|reduce_scatter|allgather|broadcast|alltoall|all]
//          [--raw-mpi] [--group world|node|dp|ep] [--json FILE] [--fusion-test]
//          [--fusion-tensors N]
// Sizes follow nccl-tests: allreduce and broadcast move size bytes per rank; reduce_scatter and
// alltoall send size bytes per rank; allgather receives size bytes. The count column is the
// count of the call, as nccl-tests prints it: size / n per rank (reduce_scatter's received
// block, allgather's sent block, alltoall's block per peer). busbw = algbw x factor:
// allreduce 2(n-1)/n; reduce_scatter, allgather, alltoall (n-1)/n; broadcast 1. Times are the
// mean over ranks of each rank's mean time per iteration. Exits 1 when any result is wrong; a
// call that fails on one rank ends the whole job from there (loom_abort names the rank), and
// ranks started with other arguments (an MPMD line) exit 2 before the first collective.

enum coll { ALLREDUCE, REDUCE_SCATTER, ALLGATHER, BROADCAST, ALLTOALL, NCOLL };
static const char *const coll_names[NCOLL] = {"allreduce", "reduce_scatter", "allgather",
                                              "broadcast", "alltoall"};
static const char *const type_names[LOOM_DTYPE_COUNT] = {"float", "half",  "bfloat16", "int8",
                                                         "uint8", "int32", "int64"};
static const char *const redop_names[LOOM_REDOP_COUNT] = {"sum", "avg", "max", "min"};

struct opts {
  size_t min_bytes, max_bytes;
  double factor;
  int iters, warmup, check;
  int dtype;          // -1: all
  int redop;          // -1: all
  int coll;           // -1: all
  int raw;            // --raw-mpi
  int fusion;         // --fusion-test
  int fusion_tensors; // --fusion-tensors: the fusion test's tensors of 4 KiB
  loom_group_kind_t group;
  const char *json;
  const char *compress;     // --compress NAME: loom_compressed_allreduce (allreduce, f32)
  loom_scheme_t scheme;     // --scheme
  loom_compressor_t *codec; // created from compress after parsing
};

struct row {
  const char *coll, *type, *redop;
  size_t bytes;
  int64_t count; // the call's count: size / n elements for reduce_scatter, allgather, alltoall
  double us, algbw, busbw;
  long long wrong; // -1: not checked
};

static int rank0;
static uint64_t compress_seed; // advanced every compressed call, as a trainer advances it per step
static size_t compress_sent;   // bytes the last compressed call sent from this rank
static loom_ef_t *compress_ef; // error feedback for powersgd (it needs one)

// ---- options ------------------------------------------------------------------------------------

// A size in bytes with an optional K, M, G or T suffix (powers of 1024); -1 for anything else
// (no digits, trailing characters, not finite, below 1 byte or above 2^40).
static int parse_size(const char *s, size_t *out) {
  char *end = NULL;
  double v = strtod(s, &end);
  if (end == s || (*end && end[1])) {
    return -1;
  }
  switch (*end ? *end : ' ') {
  case 'T':
  case 't':
    v *= 1024.0;
    // fallthrough
  case 'G':
  case 'g':
    v *= 1024.0;
    // fallthrough
  case 'M':
  case 'm':
    v *= 1024.0;
    // fallthrough
  case 'K':
  case 'k':
    v *= 1024.0;
    break;
  case ' ':
    break;
  default:
    return -1;
  }
  if (!(v >= 1.0 && v <= 0x1p40)) {
    return -1;
  }
  *out = (size_t)v;
  return 0;
}

// An integer flag in lo..hi with nothing after it; -1 (said) otherwise.
static int parse_count(const char *name, const char *s, int lo, int hi, int *out) {
  int v = 0;
  if (test_int_arg("coll_perf", name, s, &v) != 0) {
    return -1;
  }
  if (v < lo || v > hi) {
    fprintf(stderr, "coll_perf: %s %s: expected %d..%d\n", name, s, lo, hi);
    return -1;
  }
  *out = v;
  return 0;
}

static int parse_dtype(const char *s) {
  if (!strcmp(s, "all")) {
    return -1;
  }
  for (int d = 0; d < LOOM_DTYPE_COUNT; d++) {
    if (!strcmp(s, type_names[d])) {
      return d;
    }
  }
  loom_dtype_t dt;
  if (loom_dtype_from_name(s, &dt) == LOOM_OK) {
    return (int)dt;
  }
  return -2;
}

static int parse_in(const char *s, const char *const *names, int n) {
  if (!strcmp(s, "all")) {
    return -1;
  }
  for (int i = 0; i < n; i++) {
    if (!strcmp(s, names[i])) {
      return i;
    }
  }
  return -2;
}

static void usage(FILE *out) {
  fprintf(
      out,
      "usage: coll_perf [-b minbytes] [-e maxbytes] [-f stepfactor] [-n iters] [-w warmup]\n"
      "                 [-c 0|1] [-d float|half|bfloat16|int8|uint8|int32|int64|all]\n"
      "                 [-o sum|avg|max|min|all]\n"
      "                 [--op allreduce|reduce_scatter|allgather|broadcast|alltoall|all]\n"
      "                 [--raw-mpi] [--group world|node|dp|ep] [--json FILE] "
      "[--fusion-test]\n"
      "                 [--fusion-tensors N]\n"
      "                 [--compress NAME [--scheme indivisible|divisible|hierarchical]]\n"
      "--compress times loom_compressed_allreduce (f32 allreduce of a fresh copy, in place) with\n"
      "NAME (none, fp16, bf16, int8, int8:sr, topk:RATIO, randomk:RATIO, efsign,\n"
      "powersgd:RANK); --scheme defaults to divisible. busbw counts the uncompressed bytes.\n"
      "--fusion-test times loom_fusion_allreduce of N (--fusion-tensors, default 1000) 4 KiB\n"
      "f32 tensors against one allreduce of as many elements and N separate allreduces.\n"
      "Every rank must be given the same arguments.\n");
}

static int parse_opts(int argc, char **argv, struct opts *o) {
  static const struct option longs[] = {
      {"op", required_argument, NULL, 'O'},       {"raw-mpi", no_argument, NULL, 'R'},
      {"group", required_argument, NULL, 'G'},    {"json", required_argument, NULL, 'J'},
      {"fusion-test", no_argument, NULL, 'F'},    {"fusion-tensors", required_argument, NULL, 'T'},
      {"compress", required_argument, NULL, 'C'}, {"scheme", required_argument, NULL, 'S'},
      {"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0}};
  static const char *const groups[] = {"world", "node", "dp", "ep"};
  static const loom_group_kind_t group_kinds[] = {LOOM_GROUP_WORLD, LOOM_GROUP_NODE, LOOM_GROUP_DP,
                                                  LOOM_GROUP_EP};
  *o = (struct opts){.min_bytes = 8,
                     .max_bytes = 64u << 20,
                     .factor = 2.0,
                     .iters = 20,
                     .warmup = 5,
                     .check = 1,
                     .dtype = LOOM_F32,
                     .redop = LOOM_SUM,
                     .coll = ALLREDUCE,
                     .fusion_tensors = 1000,
                     .group = LOOM_GROUP_WORLD,
                     .scheme = LOOM_SCHEME_DIVISIBLE};
  int c, g;
  while ((c = getopt_long(argc, argv, "b:e:f:n:w:c:d:o:h", longs, NULL)) != -1) {
    switch (c) {
    case 'b':
    case 'e':
      if (parse_size(optarg, c == 'b' ? &o->min_bytes : &o->max_bytes) != 0) {
        fprintf(stderr, "coll_perf: -%c %s: expected a size of 1 byte to 1T, e.g. 8, 64K, 16M\n", c,
                optarg);
        return 2;
      }
      break;
    case 'f': {
      char *end = NULL;
      o->factor = strtod(optarg, &end);
      if (end == optarg || *end) {
        o->factor = 0.0; // refused below, with the other ranges
      }
      break;
    }
    case 'n':
      if (parse_count("-n", optarg, 1, 1000000, &o->iters) != 0) {
        return 2;
      }
      break;
    case 'w':
      if (parse_count("-w", optarg, 0, 1000000, &o->warmup) != 0) {
        return 2;
      }
      break;
    case 'c':
      if (parse_count("-c", optarg, 0, 1, &o->check) != 0) {
        return 2;
      }
      break;
    case 'd':
      if ((o->dtype = parse_dtype(optarg)) == -2) {
        fprintf(stderr, "coll_perf: -d %s: unknown type\n", optarg);
        return 2;
      }
      break;
    case 'o':
      if ((o->redop = parse_in(optarg, redop_names, LOOM_REDOP_COUNT)) == -2) {
        fprintf(stderr, "coll_perf: -o %s: expected sum, avg, max, min or all\n", optarg);
        return 2;
      }
      break;
    case 'O':
      if ((o->coll = parse_in(optarg, coll_names, NCOLL)) == -2) {
        fprintf(stderr, "coll_perf: --op %s: unknown collective\n", optarg);
        return 2;
      }
      break;
    case 'R':
      o->raw = 1;
      break;
    case 'G':
      if ((g = parse_in(optarg, groups, 4)) < 0) {
        fprintf(stderr, "coll_perf: --group %s: expected world, node, dp or ep\n", optarg);
        return 2;
      }
      o->group = group_kinds[g];
      break;
    case 'J':
      o->json = optarg;
      break;
    case 'F':
      o->fusion = 1;
      break;
    case 'T':
      if (parse_count("--fusion-tensors", optarg, 1, 10000000, &o->fusion_tensors) != 0) {
        return 2;
      }
      break;
    case 'C':
      o->compress = optarg;
      break;
    case 'S':
      if (loom_scheme_parse(optarg, &o->scheme) != LOOM_OK) {
        fprintf(stderr, "coll_perf: --scheme %s: expected indivisible, divisible or hierarchical\n",
                optarg);
        return 2;
      }
      break;
    case 'h':
      usage(stdout);
      return 1;
    default:
      usage(stderr);
      return 2;
    }
  }
  if (!(o->factor >= 2.0 && o->factor <= 1e6) || o->min_bytes > o->max_bytes) {
    fprintf(stderr, "coll_perf: need -f a number in 2..1e6 and -b <= -e\n");
    return 2;
  }
  // MPI takes int counts: past 2^31 - 1 elements a --raw-mpi count would wrap (the smallest type
  // swept gives the most elements).
  const size_t es = o->dtype >= 0 ? loom_dtype_size((loom_dtype_t)o->dtype) : 1;
  if (o->raw && o->max_bytes / es > (size_t)INT_MAX) {
    fprintf(stderr,
            "coll_perf: --raw-mpi: -e %zu bytes is %zu elements of %s, more than MPI's int count "
            "holds (%d): lower -e\n",
            o->max_bytes, o->max_bytes / es, o->dtype >= 0 ? type_names[o->dtype] : "uint8",
            INT_MAX);
    return 2;
  }
  if (test_output_writable("coll_perf", "--json", o->json) != 0) { // now, not after the sweep
    return 2;
  }
  if (o->compress) {
    if (loom_compressor_check(o->compress) != LOOM_OK || // said once, here, not logged too
        loom_compressor_create(o->compress, &o->codec) != LOOM_OK) {
      fprintf(stderr, "coll_perf: --compress: %s\n", loom_last_error(NULL));
      return 2;
    }
    if (o->raw || o->coll != ALLREDUCE || o->dtype != LOOM_F32) {
      fprintf(stderr, "coll_perf: --compress times the f32 allreduce of loom only: drop --raw-mpi, "
                      "--op and -d\n");
      return 2;
    }
    if (loom_compressor_lowrank(o->codec) && loom_ef_create(&compress_ef) != LOOM_OK) {
      fprintf(stderr, "coll_perf: %s\n", loom_last_error(NULL));
      return 2;
    }
    o->redop = LOOM_AVG; // in place on a fresh copy of the send values each call
    o->check = 0;        // lossy: tests/mpi/test_compress checks the results
  }
  return 0;
}

// ---- values -------------------------------------------------------------------------------------

// Element i of rank r's input: small integers, exact in every dtype and in their sums.
static double value(loom_dtype_t dt, int r, int64_t i) {
  int64_t base = ((int64_t)r * 7 + i * 3) % 17;
  return dt == LOOM_U8 ? (double)base : (double)(base - 8);
}

// Gradient-like values for --compress (a compressor's cost and error depend on the values; the
// integer pattern of fill() is all ties): uniform in [-1, 1) from a hash of (rank, index).
static void fill_gradient(float *p, int64_t count, int r) {
  for (int64_t i = 0; i < count; i++) {
    uint64_t z = ((uint64_t)r << 40) + (uint64_t)i + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    p[i] = (float)((double)(z >> 40) * 0x1p-23 - 1.0);
  }
}

static void fill(loom_dtype_t dt, void *p, int64_t count, int r) {
  for (int64_t i = 0; i < count; i++) {
    test_put(dt, p, i, value(dt, r, i));
  }
}

static double reduced(loom_dtype_t dt, loom_redop_t op, int n, int64_t i) {
  double acc = value(dt, 0, i);
  for (int r = 1; r < n; r++) {
    double v = value(dt, r, i);
    acc = op == LOOM_MAX ? fmax(acc, v) : op == LOOM_MIN ? fmin(acc, v) : acc + v;
  }
  return op == LOOM_AVG ? (double)((float)acc / (float)n) : acc;
}

// Elements of got (count of them) whose bits differ from element j of the expected sequence,
// expected(j) given by what and the rank layout.
static long long count_wrong(enum coll c, loom_dtype_t dt, loom_redop_t op, const void *got,
                             int64_t count, int n, int me) {
  size_t es = loom_dtype_size(dt);
  uint64_t want = 0;
  long long wrong = 0;
  int64_t block = count; // per-rank block of the output layout
  if (c == ALLGATHER || c == ALLTOALL) {
    block = count / n;
  }
  for (int64_t j = 0; j < count; j++) {
    double v = 0;
    switch (c) {
    case ALLREDUCE:
      v = reduced(dt, op, n, j);
      break;
    case REDUCE_SCATTER:
      v = reduced(dt, op, n, (int64_t)me * count + j);
      break;
    case ALLGATHER:
      v = value(dt, (int)(j / block), j % block);
      break;
    case BROADCAST:
      v = value(dt, 0, j);
      break;
    case ALLTOALL: // block from rank j / block: its block for me
      v = value(dt, (int)(j / block), (int64_t)me * block + j % block);
      break;
    default:
      break;
    }
    test_put(dt, &want, 0, v);
    wrong += memcmp((const char *)got + (size_t)j * es, &want, es) != 0;
  }
  return wrong;
}

// ---- one collective -----------------------------------------------------------------------------

static MPI_Datatype raw_type(loom_dtype_t dt) {
  switch (dt) {
  case LOOM_F32:
    return MPI_FLOAT;
  case LOOM_I8:
    return MPI_INT8_T;
  case LOOM_U8:
    return MPI_UINT8_T;
  case LOOM_I32:
    return MPI_INT32_T;
  case LOOM_I64:
    return MPI_INT64_T;
  default:
    return MPI_UINT16_T; // f16/bf16: bits only (no MPI reductions)
  }
}

// Run collective c once as a plain MPI call (--raw-mpi) on the group's communicator, whose
// errors return (loom sets MPI_ERRORS_RETURN on it): MPI's error code. Arguments as run_once.
static int run_raw(const loom_group_t *g, enum coll c, loom_dtype_t dt, loom_redop_t op, void *send,
                   void *recv, int64_t count) {
  int64_t block = c == ALLREDUCE || c == BROADCAST ? count : count / loom_group_size(g);
  MPI_Comm comm = loom_group_comm(g);
  MPI_Datatype t = raw_type(dt);
  MPI_Op mop = op == LOOM_MAX ? MPI_MAX : op == LOOM_MIN ? MPI_MIN : MPI_SUM;
  switch (c) {
  case ALLREDUCE:
    return MPI_Allreduce(send, recv, (int)count, t, mop, comm);
  case REDUCE_SCATTER:
    return MPI_Reduce_scatter_block(send, recv, (int)block, t, mop, comm);
  case ALLGATHER:
    return MPI_Allgather(send, (int)block, t, recv, (int)block, t, comm);
  case BROADCAST:
    return MPI_Bcast(recv, (int)count, t, 0, comm);
  default:
    return MPI_Alltoall(send, (int)block, t, recv, (int)block, t, comm);
  }
}

// Run collective c once with loom. send/recv hold up to the largest size; count is in elements
// of the size (see the top comment), already a multiple of n where blocks are needed.
static loom_status_t run_once(const struct opts *o, const loom_group_t *g, enum coll c,
                              loom_dtype_t dt, loom_redop_t op, void *send, void *recv,
                              int64_t count) {
  int64_t block = c == ALLREDUCE || c == BROADCAST ? count : count / loom_group_size(g);
  loom_tensor_t s, r;
  int64_t scount = c == ALLGATHER ? block : count, rcount = c == REDUCE_SCATTER ? block : count;
  if (o->codec) { // in place on recv: the average keeps the values in range call after call
    (void)send;
    // One name per size: error feedback keeps a residual per name, and a residual has the
    // length of its tensor (powersgd refused the second size under one name).
    char name[32];
    snprintf(name, sizeof name, "recv.%lld", (long long)rcount);
    loom_tensor_wrap(&r, recv, dt, LOOM_DEVICE_HOST, 1, &rcount, name);
    return loom_compressed_allreduce(g, o->codec, o->scheme, compress_ef, &r, op, compress_seed++,
                                     &compress_sent);
  }
  loom_tensor_wrap(&s, send, dt, LOOM_DEVICE_HOST, 1, &scount, "send");
  loom_tensor_wrap(&r, recv, dt, LOOM_DEVICE_HOST, 1, &rcount, "recv");
  switch (c) {
  case ALLREDUCE:
    return loom_allreduce(g, &s, &r, op);
  case REDUCE_SCATTER:
    return loom_reduce_scatter(g, &s, &r, NULL, op);
  case ALLGATHER:
    return loom_allgather(g, &s, &r);
  case BROADCAST:
    return loom_broadcast(g, &r, 0);
  default:
    return loom_alltoall(g, &s, &r);
  }
}

// run_raw or run_once; a failure on this rank ends the job (the others may be waiting for it in
// the call), naming the call and MPI's or loom's message.
static void run_ok(const struct opts *o, const loom_group_t *g, enum coll c, loom_dtype_t dt,
                   loom_redop_t op, void *send, void *recv, int64_t count) {
  int mpi_rc = MPI_SUCCESS;
  loom_status_t status = LOOM_OK;
  if (o->raw) {
    mpi_rc = run_raw(g, c, dt, op, send, recv, count);
  } else {
    status = run_once(o, g, c, dt, op, send, recv, count);
  }
  if (mpi_rc != MPI_SUCCESS || status != LOOM_OK) {
    char what[96];
    snprintf(what, sizeof what, "%s%s of %lld %s elements", o->raw ? "MPI " : "", coll_names[c],
             (long long)count, type_names[dt]);
    test_mpi_job_check(mpi_rc, "coll_perf", what);
    test_job_check(status, "coll_perf", what);
  }
}

// Time c over the sizes and print its rows; returns the number of rows added to rows[].
static int run_coll(const struct opts *o, const loom_group_t *g, enum coll c, loom_dtype_t dt,
                    loom_redop_t op, void *send, void *recv, struct row *rows, int *failed) {
  int n = loom_group_size(g), me = loom_group_rank(g), nrows = 0;
  size_t es = loom_dtype_size(dt);
  int reduction = c == ALLREDUCE || c == REDUCE_SCATTER;
  if (o->raw && reduction && (dt == LOOM_F16 || dt == LOOM_BF16 || op == LOOM_AVG)) {
    if (rank0) {
      printf("# %s %s %s: skipped, MPI has no such reduction\n", coll_names[c], type_names[dt],
             redop_names[op]);
    }
    return 0;
  }
  double factor = c == ALLREDUCE ? 2.0 * (n - 1) / n : c == BROADCAST ? 1.0 : (double)(n - 1) / n;
  for (double sz = (double)o->min_bytes; sz <= (double)o->max_bytes; sz *= o->factor) {
    int64_t count = (int64_t)((size_t)sz / es);
    if (c != ALLREDUCE && c != BROADCAST) {
      count -= count % n;
    }
    size_t bytes = (size_t)count * es;
    fill(dt, send, c == ALLGATHER ? count / n : count, me);
    if (o->codec) {
      fill_gradient(send, count, me);
    }
    fill(dt, recv, count, me + 1000);
    for (int i = 0; i < o->warmup; i++) {
      if (o->codec) {
        memcpy(recv, send, bytes);
      }
      run_ok(o, g, c, dt, op, send, recv, count);
    }
    test_mpi_job_check(MPI_Barrier(loom_group_comm(g)), "coll_perf", "MPI_Barrier");
    double t0 = MPI_Wtime(), sec = 0, sum = 0;
    if (o->codec) { // every call gets fresh values (a compressor's cost depends on them)
      for (int i = 0; i < o->iters; i++) {
        memcpy(recv, send, bytes);
        test_mpi_job_check(MPI_Barrier(loom_group_comm(g)), "coll_perf", "MPI_Barrier");
        double t1 = MPI_Wtime();
        run_ok(o, g, c, dt, op, send, recv, count);
        sec += MPI_Wtime() - t1;
      }
      sec /= o->iters;
    } else {
      for (int i = 0; i < o->iters; i++) {
        run_ok(o, g, c, dt, op, send, recv, count);
      }
      sec = (MPI_Wtime() - t0) / o->iters;
    }
    test_mpi_job_check(MPI_Allreduce(&sec, &sum, 1, MPI_DOUBLE, MPI_SUM, loom_group_comm(g)),
                       "coll_perf", "MPI_Allreduce of the times");
    sec = sum / n;
    long long wrong = -1;
    if (o->check) {
      if (c == BROADCAST) {
        fill(dt, recv, count, me == 0 ? 0 : me + 1000);
      }
      run_ok(o, g, c, dt, op, send, recv, count);
      long long mine = count_wrong(c, dt, op, recv, c == REDUCE_SCATTER ? count / n : count, n, me);
      test_mpi_job_check(
          MPI_Allreduce(&mine, &wrong, 1, MPI_LONG_LONG, MPI_SUM, loom_group_comm(g)), "coll_perf",
          "MPI_Allreduce of the wrong results");
    }
    struct row *rw = &rows[nrows++];
    *rw = (struct row){coll_names[c],
                       type_names[dt],
                       reduction ? redop_names[op] : "none",
                       bytes,
                       c == ALLREDUCE || c == BROADCAST ? count : count / n,
                       sec * 1e6,
                       0,
                       0,
                       wrong};
    rw->algbw = sec > 0 ? (double)bytes / sec / 1e9 : 0;
    rw->busbw = rw->algbw * factor;
    if (rank0) {
      char w[24];
      snprintf(w, sizeof w, wrong < 0 ? "N/A" : "%lld", wrong);
      printf("%12zu  %12lld  %8s  %6s  %9.2f  %6.2f  %6.2f  %6s\n", bytes, (long long)rw->count,
             rw->type, rw->redop, rw->us, rw->algbw, rw->busbw, w);
      if (o->codec) {
        double ring = 2.0 * (n - 1) / n * (double)bytes;
        printf("#   %s (%s): %zu bytes sent by rank 0, %.4f of a ring allreduce's %.0f\n",
               loom_compressor_name(o->codec), loom_scheme_name(o->scheme), compress_sent,
               ring > 0 ? (double)compress_sent / ring : 0.0, ring);
      }
      fflush(stdout);
    }
    if (wrong > 0) {
      *failed = 1;
    }
  }
  return nrows;
}

// ---- fusion -------------------------------------------------------------------------------------

// loom_fusion_allreduce of --fusion-tensors (1000) separate 4 KiB f32 tensors against one
// allreduce of as many elements and against one allreduce per tensor.
static int fusion_test(const struct opts *o, loom_ctx_t *ctx, const loom_group_t *g) {
  enum { ELEMS = 1024 };
  const int nt = o->fusion_tensors;
  int me = loom_group_rank(g), n = loom_group_size(g), bad = 0, failed = 0;
  int64_t one = ELEMS, all = (int64_t)nt * ELEMS;
  const size_t whole_bytes = sizeof(float) * (size_t)all;
  float *big = loom_host_alloc(whole_bytes);
  loom_tensor_t *ts = calloc((size_t)nt, sizeof *ts), **ptrs = calloc((size_t)nt, sizeof *ptrs);
  loom_tensor_t whole;
  loom_fusion_t *f = NULL;
  int ok = big && ts && ptrs;
  for (int i = 0; ok && i < nt; i++) { // separate allocations, as gradients are
    ok = loom_tensor_alloc(&ts[i], LOOM_F32, LOOM_DEVICE_HOST, 1, &one, "grad") == LOOM_OK;
    ptrs[i] = &ts[i];
  }
  if (!ok) {
    fprintf(stderr,
            "coll_perf: fusion test: rank %d cannot allocate %d tensors of %zu bytes and one of "
            "%zu bytes: lower --fusion-tensors\n",
            loom_rank(ctx), nt, sizeof(float) * ELEMS, whole_bytes);
  }
  // every rank of the group or none runs the test (one that left alone would leave the others
  // waiting in its first allreduce)
  test_mpi_job_check(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, loom_group_comm(g)),
                     "coll_perf", "fusion test: MPI_Allreduce of the allocations' outcome");
  if (!ok) {
    failed = 1;
    goto done;
  }
  loom_tensor_wrap(&whole, big, LOOM_F32, LOOM_DEVICE_HOST, 1, &all, "whole");
  test_job_check(loom_fusion_create(ctx, g, 0, &f), "coll_perf", "fusion test: loom_fusion_create");
  double t[3] = {0, 0, 0}; // fused, one allreduce, one allreduce per tensor
  for (int phase = 0; phase < 3; phase++) {
    for (int it = -o->warmup; it < o->iters; it++) {
      for (int i = 0; i < nt; i++) {
        fill(LOOM_F32, ts[i].data, ELEMS, me);
      }
      fill(LOOM_F32, big, all, me);
      test_mpi_job_check(MPI_Barrier(loom_group_comm(g)), "coll_perf", "fusion test: MPI_Barrier");
      double t0 = MPI_Wtime();
      if (phase == 0) {
        test_job_check(loom_fusion_allreduce(f, ptrs, nt, LOOM_SUM), "coll_perf",
                       "fusion test: loom_fusion_allreduce");
      } else if (phase == 1) {
        test_job_check(loom_allreduce(g, &whole, &whole, LOOM_SUM), "coll_perf",
                       "fusion test: the allreduce of all tensors' elements at once");
      }
      for (int i = 0; phase == 2 && i < nt; i++) {
        test_job_check(loom_allreduce(g, &ts[i], &ts[i], LOOM_SUM), "coll_perf",
                       "fusion test: a 4 KiB allreduce");
      }
      double dt = MPI_Wtime() - t0;
      if (it >= 0) {
        t[phase] += dt / o->iters;
      }
    }
    for (int i = 0; i < nt && phase == 0; i++) { // the fused results
      for (int64_t k = 0; k < ELEMS; k++) {
        bad += ((float *)ts[i].data)[k] != (float)reduced(LOOM_F32, LOOM_SUM, n, k);
      }
    }
  }
  double sums[3];
  test_mpi_job_check(MPI_Allreduce(t, sums, 3, MPI_DOUBLE, MPI_SUM, loom_group_comm(g)),
                     "coll_perf", "fusion test: MPI_Allreduce of the times");
  int buckets = loom_fusion_buckets(f);
  if (bad) {
    fprintf(stderr, "coll_perf: fusion test failed: %d wrong fused results\n", bad);
    failed = 1;
  } else if (rank0) {
    printf("# fusion: %d x 4 KiB f32 tensors in %d bucket(s): %.1f us; one %zu KiB allreduce: "
           "%.1f us; ratio %.2f; %d separate allreduces: %.1f us\n",
           nt, buckets, sums[0] / n * 1e6, whole_bytes / 1024, sums[1] / n * 1e6,
           sums[1] > 0 ? sums[0] / sums[1] : 0, nt, sums[2] / n * 1e6);
  }
done:
  loom_fusion_destroy(f);
  for (int i = 0; ts && i < nt; i++) { // (a tensor never allocated is zero: nothing to free)
    loom_tensor_free(&ts[i]);
  }
  free(ts);
  free(ptrs);
  loom_host_free(big);
  return failed;
}

// ---- output -------------------------------------------------------------------------------------

// 0, or -1 when the file could not be written (said).
static int write_json(const struct opts *o, const loom_group_t *g, const struct row *rows,
                      int nrows, double avg) {
  FILE *f = test_output_open("coll_perf", "--json", o->json, "w");
  if (!f) {
    return -1;
  }
  fprintf(f, "{\"ranks\": %d, \"group\": \"%s\", \"backend\": \"%s\", \"iters\": %d, ",
          loom_group_size(g), loom_group_kind_name(o->group), o->raw ? "mpi" : "loom", o->iters);
  fprintf(f, "\"avg_busbw\": %.6f, \"results\": [", avg);
  for (int i = 0; i < nrows; i++) {
    const struct row *r = &rows[i];
    fprintf(f,
            "%s\n  {\"op\": \"%s\", \"type\": \"%s\", \"redop\": \"%s\", \"size\": %zu, "
            "\"count\": %lld, \"time_us\": %.3f, \"algbw\": %.6f, \"busbw\": %.6f, \"wrong\": "
            "%lld}",
            i ? "," : "", r->coll, r->type, r->redop, r->bytes, (long long)r->count, r->us,
            r->algbw, r->busbw, r->wrong);
  }
  fprintf(f, "\n]}\n");
  return test_output_close("coll_perf", "--json", o->json, f);
}

int main(int argc, char **argv) {
  loom_ctx_t *ctx = NULL;
  struct opts o;
  // Parse before init so that --help needs no MPI; every rank parses the same argv.
  int prc = parse_opts(argc, argv, &o);
  if (prc) {
    return prc == 1 ? 0 : prc;
  }
  if (loom_init(NULL, NULL, NULL, &ctx) != LOOM_OK) {
    fprintf(stderr, "coll_perf: loom_init failed: %s\n", loom_last_error(NULL));
    return 1;
  }
  if (test_bench_agree_args("coll_perf", argc, argv) != 0) { // every rank, or none
    loom_ef_destroy(compress_ef);
    loom_compressor_destroy(o.codec);
    loom_finalize(ctx);
    return 2;
  }
  const loom_group_t *g = loom_group(ctx, o.group);
  int member = loom_group_rank(g) >= 0, failed = 0, n = loom_group_size(g);
  rank0 = loom_rank(ctx) == 0 && member;
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  if (rank0) {
    printf("# coll_perf (loom %s): %s on group %s of %d ranks, %s\n", loom_version(),
           o.coll < 0 ? "all collectives" : coll_names[o.coll], loom_group_kind_name(o.group), n,
           o.raw     ? "raw MPI calls"
           : o.codec ? "loom compressed allreduce (values averaged in place)"
                     : "loom collectives (MPI for host tensors)");
    printf("# minBytes %zu maxBytes %zu step: %g(factor) warmup iters: %d iters: %d "
           "validation: %d\n#\n",
           o.min_bytes, o.max_bytes, o.factor, o.warmup, o.iters, o.check);
  }
  struct who {
    int world, group, pid;
    char host[64];
  } me = {loom_rank(ctx), loom_group_rank(g), (int)getpid(), ""}, *all = NULL;
  snprintf(me.host, sizeof me.host, "%.63s", host);
  if (loom_rank(ctx) == 0) {
    all = calloc((size_t)loom_size(ctx), sizeof *all);
  }
  MPI_Gather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, 0, MPI_COMM_WORLD);
  for (int r = 0; rank0 && r < loom_size(ctx); r++) {
    if (all[r].group >= 0) {
      printf("#  Rank %2d Group rank %2d Pid %6d on %10s device host\n", all[r].world, all[r].group,
             all[r].pid, all[r].host);
    }
  }
  free(all);

  struct row *rows = calloc(4096, sizeof *rows);
  int nrows = 0;
  void *send = member ? loom_host_alloc(o.max_bytes + 64) : NULL;
  void *recv = member ? loom_host_alloc(o.max_bytes + 64) : NULL;
  if (member && (!send || !recv)) {
    fprintf(stderr, "coll_perf: rank %d cannot allocate 2 x %zu bytes: lower -e\n", loom_rank(ctx),
            o.max_bytes);
    failed = 1;
  }
  // every rank or none goes on (one that stopped alone would leave the others in a collective)
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (member && !failed) {
    if (rank0) {
      printf("#\n#%11s  %12s  %8s  %6s  %9s  %6s  %6s  %6s\n", "size", "count", "type", "redop",
             "time", "algbw", "busbw", "#wrong");
      printf("#%11s  %12s  %8s  %6s  %9s  %6s  %6s  %6s\n", "(B)", "(elements)", "", "", "(us)",
             "(GB/s)", "(GB/s)", "");
    }
    for (int c = 0; c < NCOLL; c++) {
      if (o.coll >= 0 && c != o.coll) {
        continue;
      }
      int reduction = c == ALLREDUCE || c == REDUCE_SCATTER;
      if (rank0 && o.coll < 0) {
        printf("# %s\n", coll_names[c]);
      }
      for (int d = 0; d < LOOM_DTYPE_COUNT; d++) {
        if (o.dtype >= 0 && d != o.dtype) {
          continue;
        }
        for (int op = 0; op < LOOM_REDOP_COUNT; op++) {
          if ((reduction && o.redop >= 0 && op != o.redop) || (!reduction && op > 0) ||
              (op == LOOM_AVG && d != LOOM_F32 && d != LOOM_F16 && d != LOOM_BF16) ||
              nrows > 4000) {
            continue;
          }
          nrows += run_coll(&o, g, (enum coll)c, (loom_dtype_t)d, (loom_redop_t)op, send, recv,
                            rows + nrows, &failed);
        }
      }
    }
  }
  long long wrong = 0;
  double avg = 0;
  for (int i = 0; i < nrows; i++) {
    wrong += rows[i].wrong > 0 ? rows[i].wrong : 0;
    avg += rows[i].busbw / nrows;
  }
  if (rank0) {
    printf("# Out of bounds values : %lld %s\n", wrong, wrong || failed ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g\n#\n", avg);
  }
  if (member && o.fusion && !failed) {
    failed |= fusion_test(&o, ctx, g);
  }
  if (rank0 && o.json) {
    failed |= write_json(&o, g, rows, nrows, avg) != 0;
  }
  loom_host_free(send);
  loom_host_free(recv);
  free(rows);
  loom_ef_destroy(compress_ef);
  loom_compressor_destroy(o.codec);
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  loom_finalize(ctx);
  return any ? 1 : 0;
}
