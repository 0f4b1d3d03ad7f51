/* example_util.h — what the example trainers share: command-line flag parsing, a seeded RNG, a
 * fatal-error check for loom calls, raw parameter dumps and their comparison (--compare). */
#ifndef LOOM_EXAMPLES_UTIL_H
#define LOOM_EXAMPLES_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "loom.h"

// The program name used in messages ("train_gpt"); main sets it first.
extern const char *ex_prog;

// Every loom call in a trainer is checked. A failure in the middle of training cannot be
// recovered on one rank alone (the others would wait in the next collective), so it aborts the
// whole job after printing the call, the status and loom's message.
#define EX_CHECK(call)                                                                             \
  do {                                                                                             \
    loom_status_t ex_check_st_ = (call);                                                           \
    if (ex_check_st_ != LOOM_OK) {                                                                 \
      ex_fatal(__FILE__, __LINE__, #call, ex_check_st_);                                           \
    }                                                                                              \
  } while (0)
void ex_fatal(const char *file, int line, const char *call, loom_status_t st);

// ---- flags: "--name value" or "--name=value"

// After a failed loom_init: print "PROG: loom_init: MESSAGE" on the rank whose own message it is.
// Every rank holds the message; the others hold it prefixed "rank N: " (relayed by loom_init), and
// print nothing, so that the job shows it once.
void ex_report_init_failure(const char *prog);

// Split argv[*i] into its flag name (copied to flag) and value. Flags listed in switches (NULL
// terminated) take no value and get *value = NULL; the others take the text after '=' or the
// next argument (then *i advances). Returns 0, or -1 with a message in err.
int ex_next_flag(int argc, char **argv, int *i, const char *const *switches, char *flag,
                 size_t flagcap, const char **value, char *err, size_t errlen);
// Parse an integer / a finite number in lo..hi for flag; -1 with a message naming the flag.
int ex_parse_long(const char *flag, const char *v, long lo, long hi, long *out, char *err,
                  size_t errlen);
int ex_parse_int(const char *flag, const char *v, int lo, int hi, int *out, char *err,
                 size_t errlen);
int ex_parse_double(const char *flag, const char *v, double lo, double hi, double *out, char *err,
                    size_t errlen);
// --compress auto|SPEC (SPEC checked with loom_compressor_check) and --compress-scheme S: returns
// 1 when flag is one of them (value parsed into *spec or *scheme, or -1 with a message in err),
// else 0.
int ex_parse_compress(const char *flag, const char *v, const char **spec, loom_scheme_t *scheme,
                      char *err, size_t errlen);
// An output file given by flag (NULL: none): 0 when path is not a directory and its folder
// exists and is writable; else -1 with err naming the flag, the path and the fix. Run before
// the work, so that results are not lost to a bad path at the end.
int ex_check_output(const char *flag, const char *path, char *err, size_t errlen);
// --accum K against --batch B (gradient accumulation: B rows as K micro-batches of B / K): 0
// when K divides B; else -1 with err naming both and the fix.
int ex_check_accum(int batch, int accum, char *err, size_t errlen);
// LOOM_COMPRESS checked at start, when no --compress (flag) overrides it: 0 when it is none,
// auto or a spec loom_compressor_check takes; else -1 with err naming the variable and the fix.
int ex_check_compress_env(const char *flag, const loom_ctx_t *ctx, char *err, size_t errlen);
// Right after loom_init, on every rank: 0 when no rank's arguments were bad (bad, with err) and
// every rank was started with rank 0's command line (ex_agree_args, which the MPI benchmarks
// share); else 2, after the lowest rank concerned printed why. Every rank gets the same answer,
// so all can loom_finalize (a rank that stopped alone hung its peers in MPI_Finalize). Shapes,
// data order and steps come from the command line: ranks that differ would post collectives of
// other sizes (undefined in MPI: corrupt memory) or diverge silently.
int ex_agree_start(const char *prog, int bad, const char *err, int argc, char **argv);
// The compression a trainer applies: flag (--compress) when given, else LOOM_COMPRESS (default
// auto). auto becomes none when there is nothing to plan for: one data-parallel rank, or a step
// without the overlapped gradient sync (overlap_ok 0). Rank 0 says so when --compress auto meets
// one data-parallel rank (the flag parsers refuse --compress auto without the overlapped sync, so
// only LOOM_COMPRESS=auto gets here with overlap_ok 0, silently). Any other spec is returned as it
// is (the trainer rejects what it cannot run).
const char *ex_compress_spec(const char *prog, const char *flag, const loom_ctx_t *ctx, int dp_size,
                             int overlap_ok, int rank);

// ---- seeded random numbers (the same on every rank for the same seed)

uint64_t ex_splitmix64(uint64_t *state);
// The seed of gradient tensor (or bucket) `tensor`'s compressed allreduce at `step`: the same on
// every rank, different for every (step, tensor), so that int8:sr's rounding and randomk's
// indices are drawn independently for each tensor rather than repeated across them.
uint64_t ex_compress_seed(uint64_t step, int tensor);
float ex_uniform(uint64_t *state); // [0, 1), 24 bits
float ex_normal(uint64_t *state);  // standard normal (Box-Muller)

// ---- parameter dumps

// Copy path into out with every "%r" replaced by rank. Returns -1 if it does not fit.
int ex_expand_rank(const char *path, int rank, char *out, size_t cap);
// Write the n tensors (f32) back to back as raw little-endian floats to path (%r = rank).
// Returns 0, or -1 after printing why.
int ex_dump_params(const char *path, int rank, const loom_tensor_t *const *tensors, int n);
// --compare A B: 0 when every float of A and B agrees within rtol of the larger magnitude
// (floored at A's RMS), 1 otherwise (or when a file cannot be read); prints a summary line.
int ex_compare_dumps(const char *pa, const char *pb, double rtol);

// ---- results

// --device host|cuda into *cuda (0 or 1). Returns 0, or -1 with err.
int ex_parse_device(const char *v, int *cuda, char *err, size_t errlen);
// The device a trainer with --device cuda (cuda != 0) runs on: loom_gpu(ctx), or LOOM_DEVICE_HOST
// without --device cuda. -2 when cuda is asked for but this rank has no GPU (rank 0 says why).
int ex_device(const char *prog, const loom_ctx_t *ctx, int cuda, int rank);

// LOOM_NONFINITE for a step whose averaged gradient norm is not finite (every rank sees the same
// norm, so every rank decides alike): abort (default) ends the job with MPI_Abort after rank 0
// names the step; skip counts it in *count and rank 0 logs it; the caller then drops the update.
// 1 when LOOM_NONFINITE is skip: the updates must then wait for the norm of every averaged
// gradient (under abort the job ends anyway, so they need not).
int ex_nonfinite_skip(const loom_ctx_t *ctx);
void ex_nonfinite_step(const char *prog, const loom_ctx_t *ctx, long step, long total, double norm,
                       int rank, long *count);

// The CPU encoding lane of device gradient g: cpu makes its host stage (once: pinned memory and
// a copy stream, for loom_icompressed_allreduce_staged), !cpu frees it (*stage NULL).
loom_status_t ex_cpu_lane_stage(loom_host_stage_t **stage, const loom_tensor_t *g, int cpu);

// The median of x[0..n) (sorts x in place); 0 when n is 0.
double ex_median(double *x, long n);

// v as a JSON number with the given decimals in buf, or "null" when it is NaN or infinite (a
// diverged loss: printf's "nan" and "inf" are not JSON). Returns buf.
const char *ex_json_num(char *buf, size_t cap, double v, int decimals);

// This process's resident set size in MiB (/proc/self/statm), or -1 where it cannot be read.
double ex_rss_mib(void);

// fopen(path, "w"), fputs(text), fclose, with errors printed. Returns 0 or -1.
int ex_write_text(const char *path, const char *text);

#endif
