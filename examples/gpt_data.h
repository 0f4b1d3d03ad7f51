/* gpt_data.h — the byte-level text corpus of train_gpt: load documents (fortune files split at
 * "%" lines, or whole files), hold some out, and cut packed cu_seqlens batches of rows. */
#ifndef LOOM_EXAMPLES_GPT_DATA_H
#define LOOM_EXAMPLES_GPT_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

#define GPT_DEFAULT_DATA "/usr/share/games/fortunes" // Debian package fortunes (and -min)
#define GPT_DOC_START    0                           // token that opens every document
#define GPT_MAX_FILE     (1L << 30)                  // refuse files larger than 1 GiB
#define GPT_MAX_CORPUS   (2L << 30)                  // and corpora over 2 GiB (every rank holds it)

// One token stream: documents back to back, each opened by GPT_DOC_START, then a final
// GPT_DOC_START so that the last byte has a target. Row r (of ctx tokens) reads tokens
// [r*ctx, r*ctx + ctx) and predicts [r*ctx + 1, r*ctx + ctx + 1).
typedef struct gpt_stream {
  uint8_t *tokens;     // (len)
  int64_t len;         // tokens including the final GPT_DOC_START
  int64_t *doc_starts; // (docs) offset of each document's GPT_DOC_START, increasing
  int64_t docs;        // documents
} gpt_stream_t;

typedef struct gpt_corpus {
  gpt_stream_t train, val;
  int files;              // files read
  double unigram_entropy; // of the training bytes, nats per token
} gpt_corpus_t;

// Read every path (a file, or a directory: its regular files in name order, skipping hidden
// files and the .dat/.u8 companions of fortune files). Each file is split into documents at
// lines that hold only "%" (a file without such lines is one document); empty documents are
// dropped. Every file is listed before any is read: a file reached twice (the same path, a link,
// or a file inside a directory also given) and files over GPT_MAX_CORPUS bytes are refused. The
// documents are shuffled with seed and the last val_frac of them (at least one) form the
// validation stream. Returns 0, or -1 with one line in err naming the file, the
// problem and the fix (a missing default corpus names the Debian package).
int gpt_corpus_load(const char *const *paths, int npaths, double val_frac, uint64_t seed,
                    gpt_corpus_t *c, char *err, size_t errlen);
void gpt_corpus_free(gpt_corpus_t *c);

// Rows of ctx tokens available in s (at least 1 when gpt_corpus_load succeeded with ctx small
// enough; 0 means the stream is shorter than one row).
int64_t gpt_rows(const gpt_stream_t *s, int ctx);

// A packed batch: nrows rows of ctx tokens, rows first_row, first_row + 1, ... (modulo the
// rows of the stream, so that training wraps into the next epoch). Each row is cut into
// sequences at document starts; a document longer than the row's remainder continues as a new
// sequence in the next row. No padding: total = nrows * ctx tokens.
typedef struct gpt_batch {
  int cap_rows, ctx;
  int64_t total;        // tokens in the batch (nrows * ctx)
  int nseq;             // sequences
  int64_t attn_pairs;   // sum over sequences of L (L + 1) / 2: causal (query, key) pairs
  loom_tensor_t tokens; // (total) i32 input bytes
  loom_tensor_t target; // (total) i32 next bytes
  loom_tensor_t pos;    // (total) i32 position inside its sequence
  loom_tensor_t cu;     // (nseq + 1) i32 sequence offsets
  int32_t *buf;         // the memory behind the four views: 4 * (cap_rows * ctx + 1)
} gpt_batch_t;

loom_status_t gpt_batch_alloc(gpt_batch_t *b, int cap_rows, int ctx);
void gpt_batch_free(gpt_batch_t *b);
// Fill b with nrows (1..cap_rows) rows starting at first_row (rows of s must be >= 1).
void gpt_batch_fill(gpt_batch_t *b, const gpt_stream_t *s, int64_t first_row, int nrows);
// Replace the document boundaries of a filled batch by synthetic ones with heavy-tailed
// lengths (train_gpt --doc-lengths skewed): the tokens and targets stay, cu_seqlens, positions,
// nseq and attn_pairs change. Lengths are lognormal, exp(mu + z) with z standard normal and
// mu = log(ctx) - 2 + 1.5 z' drawn once per call (z' standard normal): one batch gets short
// pieces, another pieces longer than a row. The rows are cut in order into pieces of the drawn
// lengths; a piece that does not fit in the rest of its row goes on as a new sequence at the
// start of the next row (as a corpus document does). Deterministic in seed.
void gpt_batch_skew(gpt_batch_t *b, uint64_t seed);

#endif
