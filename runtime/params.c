/* params.c — resolve the tunables table: environment over config over default, with one parser
 * per tunable and an error that names the variable, the bad value and the valid values. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"
#include "log.h"
#include "params.h"

int loom_parse_int_range(const char *text, long min, long max, long *value) {
  while (isspace((unsigned char)*text)) {
    text++;
  }
  if (!*text) {
    return -1;
  }
  char *end = NULL;
  errno = 0;
  long v = strtol(text, &end, 10);
  while (end && isspace((unsigned char)*end)) {
    end++;
  }
  if (errno != 0 || !end || *end != '\0' || v < min || v > max) {
    return -1;
  }
  *value = v;
  return 0;
}

int loom_parse_real(const char *text, double *value) {
  if (strpbrk(text, "xXnNiI")) { // decimal only: no hex (0x10 once read as 16), inf or nan
    return -1;
  }
  char *end = NULL;
  errno = 0;
  double x = strtod(text, &end); // (skips leading white space)
  if (end == text) {
    return -1;
  }
  while (isspace((unsigned char)*end)) { // and trailing, as the integers do
    end++;
  }
  if (*end != '\0' || errno == ERANGE) {
    return -1;
  }
  *value = x;
  return 0;
}

int loom_parse_subsys_list(const char *text, unsigned *mask, char *err, size_t errlen) {
  int exclude = text[0] == '^';
  const char *p = text + exclude;
  unsigned bits = 0;
  if (!*p) {
    snprintf(err, errlen, "empty subsystem list");
    return -1;
  }
  for (;;) { // every item, the last one included after a trailing comma
    const char *comma = strchr(p, ',');
    size_t n = comma ? (size_t)(comma - p) : strlen(p);
    int found = 0;
    if (n == 0) {
      snprintf(err, errlen, "empty item in '%s' (a stray comma)", text);
      return -1;
    }
    if (n == 3 && strncasecmp(p, "ALL", 3) == 0) {
      bits |= LOOM_SUB_ALL;
      found = 1;
    }
    for (int i = 0; i < LOOM_LOG_NSUBSYS && !found; i++) {
      if (strlen(loom_log_subsys_names[i]) == n &&
          strncasecmp(p, loom_log_subsys_names[i], n) == 0) {
        bits |= 1u << i;
        found = 1;
      }
    }
    if (!found) {
      snprintf(err, errlen, "unknown subsystem '%.*s'", (int)n, p);
      return -1;
    }
    if (!comma) {
      break;
    }
    p = comma + 1;
  }
  *mask = exclude ? (LOOM_SUB_ALL & ~bits) : bits;
  return 0;
}

// The config field of d as text, or NULL when unset.
static const char *config_text(const struct loom_param_desc *d, const loom_config_t *cfg, char *buf,
                               size_t len) {
  if (!cfg) {
    return NULL;
  }
  const char *base = (const char *)cfg;
  if (d->field_is_int) {
    int v = *(const int *)(base + d->field_offset);
    if (v == LOOM_UNSET) {
      return NULL;
    }
    snprintf(buf, len, "%d", v);
    return buf;
  }
  return *(const char *const *)(base + d->field_offset);
}

void loom_config_init(loom_config_t *cfg) {
  if (!cfg) {
    return;
  }
  memset(cfg, 0, sizeof *cfg);
  for (int i = 0; i < LOOM_P_COUNT; i++) {
    if (loom_param_table[i].field_is_int) {
      *(int *)((char *)cfg + loom_param_table[i].field_offset) = LOOM_UNSET;
    }
  }
}

// The text a valid value is kept as, so that spellings the parsers accept alike read alike
// (loom_tunable, loom_info, the comparison between ranks): a choice as the table spells it
// ("inplace", "INFO"), a whole number printed back ("+5", " 05 " -> "5"). Paths, lists and
// compressor specs stay as given.
static void canonical_text(const struct loom_param_desc *d, const char *text, char *out,
                           size_t size) {
  snprintf(out, size, "%s", text);
  if (!strncmp(d->valid, "a path", 6)) {
    return;
  }
  for (const char *p = d->valid; *p;) { // the valid values' words, between '|'
    const char *bar = strchr(p, '|');
    size_t n = bar ? (size_t)(bar - p) : strlen(p);
    int word = n > 0;
    for (size_t k = 0; k < n; k++) {
      word &= isalpha((unsigned char)p[k]) != 0;
    }
    if (word && strlen(text) == n && !strncasecmp(text, p, n)) {
      snprintf(out, size, "%.*s", (int)n, p);
      return;
    }
    p += n + (bar ? 1 : 0);
  }
  long v = 0;
  double x = 0.0;
  if (loom_parse_int_range(text, -2147483647L - 1, 2147483647L, &v) == 0) {
    snprintf(out, size, "%ld", v);
  } else if (loom_parse_real(text, &x) == 0 && x >= 0.0) {
    snprintf(out, size, "%.15g", x); // a real number: "1e2", "100.0 " -> "100"
  }
}

loom_status_t loom_params_resolve(const loom_config_t *cfg, struct loom_params *out) {
  memset(out, 0, sizeof *out);
  for (int i = 0; i < LOOM_P_COUNT; i++) {
    const struct loom_param_desc *d = &loom_param_table[i];
    char buf[32];
    const char *text = getenv(d->env);
    int source = LOOM_SRC_ENV;
    if (!text) {
      text = config_text(d, cfg, buf, sizeof buf);
      source = LOOM_SRC_CONFIG;
    }
    if (!text) {
      text = d->def;
      source = LOOM_SRC_DEFAULT;
    }
    char why[256] = "";
    if (strlen(text) >= LOOM_PARAM_TEXT_MAX || d->parse(d, text, out, why, sizeof why) != 0) {
      char who[96];
      if (source == LOOM_SRC_ENV) {
        snprintf(who, sizeof who, "environment variable %s", d->env);
      } else {
        snprintf(who, sizeof who, "config field %s (%s)", d->field, d->env);
      }
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s='%.64s' is invalid (%s): valid values are %s. Fix or unset it "
                        "(default '%s').",
                        who, text, why[0] ? why : "too long", d->valid, d->def);
    }
    canonical_text(d, text, out->text[i], sizeof out->text[i]);
    out->source[i] = source;
  }
  return LOOM_OK;
}
