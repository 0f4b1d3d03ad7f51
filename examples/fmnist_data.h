/* fmnist_data.h — Fashion-MNIST for the example trainers: load the IDX gzip files (untrusted
 * bytes, every field checked), normalise, shuffle with a seed, and shard global batches by rank. */
#ifndef LOOM_EXAMPLES_FMNIST_DATA_H
#define LOOM_EXAMPLES_FMNIST_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

#define FMNIST_DEFAULT_DIR "/usr/share/datasets/fashion-mnist" // Debian dataset-fashion-mnist
#define FMNIST_ROWS        28
#define FMNIST_COLS        28
#define FMNIST_PIXELS      (FMNIST_ROWS * FMNIST_COLS)
#define FMNIST_CLASSES     10
#define FMNIST_MAX_SAMPLES 1000000 // sanity limit on the count an IDX header may claim

typedef struct fmnist_split {
  int64_t n;       // samples
  float *images;   // (n, 784) pixel / 255, then normalised by fmnist_normalize
  int32_t *labels; // (n) class 0..9
} fmnist_split_t;

// Load split "train" or "t10k" from dir ({split}-images-idx3-ubyte.gz and
// {split}-labels-idx1-ubyte.gz). On failure returns LOOM_ERR_SYSTEM (missing or unreadable file),
// LOOM_ERR_CORRUPT (bad magic, dimensions, counts, labels, truncated or trailing data) or
// LOOM_ERR_NOMEM, leaves *out empty, and writes one line naming the file and the problem to err.
loom_status_t fmnist_load(const char *dir, const char *split, fmnist_split_t *out, char *err,
                          size_t errlen);
void fmnist_free(fmnist_split_t *s);

// Mean and standard deviation over every pixel of s (computed in double).
void fmnist_stats(const fmnist_split_t *s, float *mean, float *std);
// pixel = (pixel - mean) / std for every pixel of s.
void fmnist_normalize(fmnist_split_t *s, float mean, float std);

// perm (n) = a permutation of 0..n-1 that depends only on (seed, epoch): every rank that calls
// this with the same arguments gets the same order.
void fmnist_permutation(int32_t *perm, int64_t n, uint64_t seed, int epoch);
// Global batches of batch * nranks samples in one epoch of n samples (the tail is dropped, so
// every step has full batches on every rank).
int64_t fmnist_steps_per_epoch(int64_t n, int batch, int nranks);
// The batch indices of rank `rank` in global step `step` of an epoch: rank r takes the r-th
// disjoint slice of `batch` entries of the global batch perm[step * batch * nranks ...].
const int32_t *fmnist_shard(const int32_t *perm, int64_t step, int batch, int rank, int nranks);
// The contiguous range [*begin, *end) of n samples that rank `rank` of nranks evaluates.
void fmnist_eval_range(int64_t n, int rank, int nranks, int64_t *begin, int64_t *end);
// x (count, 784) and y (count) = the samples idx[0..count) of s, or samples first..first+count
// when idx is NULL.
void fmnist_gather(const fmnist_split_t *s, const int32_t *idx, int64_t first, int64_t count,
                   float *x, int32_t *y);

#endif
