/* fuzz_tunables.c — libFuzzer target for the tunable parsers (runtime/params.c and the table's
 * parsers): any text for any tunable, through the table and through loom_params_resolve; and the
 * compressor specs (LOOM_COMPRESS's values) through loom_compressor_create. */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress_internal.h"
#include "log.h"
#include "loom_moe.h"
#include "params.h"

// Input: byte 0 picks the tunable (modulo LOOM_P_COUNT); the rest, up to its first NUL, is the
// text. An int config field takes the text's first four bytes as its value.

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  for (int i = 0; i < LOOM_P_COUNT; i++) { // the config path, not the environment's values
    unsetenv(loom_param_table[i].env);
  }
  loom_log_configure(LOOM_LOG_WARN, LOOM_SUB_ALL, "/dev/null"); // each rejection logs a WARN
  return 0;
}

static void check_err(const char *err, size_t len) {
  if (memchr(err, '\0', len) == NULL) {
    abort(); // a parser left its message unterminated
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) {
    return 0;
  }
  const int id = data[0] % LOOM_P_COUNT;
  const struct loom_param_desc *d = &loom_param_table[id];
  char *text = malloc(size); // size - 1 bytes and a NUL: exact, so ASan sees any overread
  if (!text) {
    abort();
  }
  memcpy(text, data + 1, size - 1);
  text[size - 1] = '\0';

  // The table's parser, on text of any length.
  struct loom_params *out = calloc(1, sizeof *out);
  char err[256];
  memset(err, 'x', sizeof err);
  err[sizeof err - 1] = '\0';
  if (!out) {
    abort();
  }
  if (d->parse(d, text, out, err, sizeof err) != 0) {
    check_err(err, sizeof err);
  }

  // The helpers the parsers share.
  long v = 0;
  const long lo = (long)(int8_t)data[0] * 1000, hi = lo + (long)data[size - 1] * 100000;
  if (loom_parse_int_range(text, lo, hi, &v) == 0 && (v < lo || v > hi)) {
    abort();
  }
  unsigned mask = 0;
  if (loom_parse_subsys_list(text, &mask, err, sizeof err) != 0) {
    check_err(err, sizeof err);
  } else if (mask & ~(unsigned)LOOM_SUB_ALL) {
    abort();
  }

  // What the trainers make of LOOM_COMPRESS: the compressor registry. The canonical name of an
  // accepted spec must parse back to the same compressor (every rank parses the name it is sent).
  loom_compressor_t *c = NULL, *again = NULL;
  if (loom_compressor_create(text, &c) == LOOM_OK) {
    if (loom_compressor_create(loom_compressor_name(c), &again) != LOOM_OK ||
        again->kind != c->kind || again->ratio != c->ratio || again->rank != c->rank ||
        again->stochastic != c->stochastic || strcmp(again->name, c->name) != 0) {
      abort();
    }
    loom_compressor_destroy(again);
    loom_compressor_destroy(c);
  }
  loom_scheme_t scheme;
  (void)loom_scheme_parse(text, &scheme);
  int overlap = 0;
  (void)loom_moe_overlap_parse(text, &overlap);

  // The whole resolution with this tunable set through loom_config_t.
  loom_config_t cfg;
  loom_config_init(&cfg);
  char *field = (char *)&cfg + d->field_offset;
  if (d->field_is_int) {
    int iv = 0;
    memcpy(&iv, text, size - 1 < sizeof iv ? size - 1 : sizeof iv);
    memcpy(field, &iv, sizeof iv);
  } else {
    const char *s = text;
    memcpy(field, &s, sizeof s);
  }
  loom_params_resolve(&cfg, out);
  free(out);
  free(text);
  return 0;
}
