/* params_env.c — warn about LOOM_ variables in the environment that loom does not read (a
 * misspelled LOOM_TIMOUT would otherwise leave the default in force without a word). */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "log.h"
#include "params.h"

extern char **environ;

// LOOM_ variables read outside the table of tunables (the measurement caches) and by loom's test
// harness, benchmarks and scripts: known, so never reported.
static const char *const other_names[] = {"LOOM_CACHE_DIR",
                                          "LOOM_CODEC_REMEASURE",
                                          "LOOM_BUILDDIR",
                                          "LOOM_SRCDIR",
                                          "LOOM_TEST_TIMEOUT",
                                          "LOOM_MPIRUN_FLAGS",
                                          "LOOM_CONFIGURE_FLAGS",
                                          "LOOM_FMNIST_DIR",
                                          "LOOM_GPT_DATA",
                                          "LOOM_GPU_PREBUILT",
                                          "LOOM_BIN",
                                          "LOOM_CMD",
                                          NULL};

// Edit distance (insertions, deletions, substitutions, adjacent swaps) between a and b, or
// cap + 1 when it is above cap or a name is too long to compare.
static int distance(const char *a, size_t n, const char *b, int cap) {
  enum { MAX = 64 };
  size_t m = strlen(b);
  if (n >= MAX || m >= MAX) {
    return cap + 1;
  }
  int d[MAX + 1][MAX + 1];
  for (size_t i = 0; i <= n; i++) {
    d[i][0] = (int)i;
  }
  for (size_t j = 0; j <= m; j++) {
    d[0][j] = (int)j;
  }
  for (size_t i = 1; i <= n; i++) {
    for (size_t j = 1; j <= m; j++) {
      int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      best = d[i - 1][j] + 1 < best ? d[i - 1][j] + 1 : best;
      best = d[i][j - 1] + 1 < best ? d[i][j - 1] + 1 : best;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
          d[i - 2][j - 2] + 1 < best) {
        best = d[i - 2][j - 2] + 1;
      }
      d[i][j] = best;
    }
  }
  return d[n][m] <= cap ? d[n][m] : cap + 1;
}

static int is_known(const char *name, size_t n) {
  for (int i = 0; i < LOOM_P_COUNT; i++) {
    const char *env = loom_param_table[i].env;
    if (strlen(env) == n && !strncmp(env, name, n)) {
      return 1;
    }
  }
  for (int i = 0; other_names[i]; i++) {
    if (strlen(other_names[i]) == n && !strncmp(other_names[i], name, n)) {
      return 1;
    }
  }
  return 0;
}

// The tunable closest to name: at most 2 edits away; else the one tunable that name extends or
// shortens (LOOM_STALL_WARNING, LOOM_CHECK_CONSIST: at least 4 letters after LOOM_ in common,
// the longest such); NULL when none is, or when several are (LOOM_TIME).
static const char *closest(const char *name, size_t n) {
  const char *best = NULL;
  int best_d = 2;
  for (int i = 0; i < LOOM_P_COUNT; i++) {
    int d = distance(name, n, loom_param_table[i].env, best_d);
    if (d <= best_d && (!best || d < best_d)) {
      best = loom_param_table[i].env;
      best_d = d;
    }
  }
  if (best) {
    return best;
  }
  size_t best_common = 0;
  int ties = 0;
  for (int i = 0; i < LOOM_P_COUNT; i++) {
    const char *env = loom_param_table[i].env;
    const size_t m = strlen(env), common = m < n ? m : n;
    if (common < 9 || strncmp(env, name, common) != 0 || common < best_common) {
      continue;
    }
    ties = common == best_common ? ties + 1 : 1;
    best_common = common;
    best = env;
  }
  return ties == 1 ? best : NULL;
}

int loom_params_warn_unknown_env(void) {
  int unknown = 0;
  for (char **e = environ; e && *e; e++) {
    const char *eq = strchr(*e, '=');
    if (strncmp(*e, "LOOM_", 5) != 0 || !eq || is_known(*e, (size_t)(eq - *e))) {
      continue;
    }
    const size_t n = (size_t)(eq - *e);
    const char *near = closest(*e, n);
    char hint[96] = "";
    if (near) {
      snprintf(hint, sizeof hint, " (did you mean %s?)", near);
    }
    LOOM_WARN(LOOM_SUB_INIT,
              "%.*s is set but loom has no such variable%s: it is ignored; `loom_info` lists "
              "the tunables",
              (int)n, *e, hint);
    unknown++;
  }
  return unknown;
}
