/* test_params.c — every tunable: default, config field, environment override, and rejection
 * of bad values with a message that names the variable and its valid values. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../check.h"
#include "comm_internal.h"
#include "ctx.h"
#include "error.h"
#include "log.h"
#include "loom.h"
#include "params.h"

// Bad values per tunable (NULL-terminated lists).
static const char *const bad_values[LOOM_P_COUNT][5] = {
    [LOOM_P_DEBUG] = {"LOUD", "", "3", NULL},
    [LOOM_P_DEBUG_SUBSYS] = {"NOPE", "INIT,NOPE", "^", "", NULL},
    [LOOM_P_DEBUG_FILE] = {NULL}, // any path parses; an unwritable one fails in loom_init
    [LOOM_P_BIND] = {"socket", "cores", "", NULL},
    [LOOM_P_BLAS_THREADS] = {"-1", "two", "1025", "4x", NULL},
    [LOOM_P_GPU] = {"first", "-3", "1024", NULL},
    [LOOM_P_NODE_SIZE] = {"-1", "x", "65537", NULL},
    [LOOM_P_EP_SIZE] = {"0", "abc", "2.5", "", NULL},
    [LOOM_P_ATTN_SERVERS] = {"all", "-2", "65536", NULL},
    [LOOM_P_TIMEOUT] = {"-1", "5s", "forever", "31536001", NULL},
    [LOOM_P_CHECK_CONSISTENCY] = {"2", "yes", "-1", "", NULL},
    [LOOM_P_PLAN_LANE] = {"both", "worker", "", "2", NULL},
    [LOOM_P_PIPE_BYTES] = {"0", "7", "1073741825", "1M", NULL},
    [LOOM_P_STALL_WARN] = {"-1", "1m", "31536001", "", NULL},
    [LOOM_P_HIER_ALLREDUCE] = {"on", "1", "", "autox", NULL},
};

static void unset_all(void) {
  for (int i = 0; i < LOOM_P_COUNT; i++) {
    unsetenv(loom_param_table[i].env);
  }
}

// Offsets at which the first five blank-separated fields of line start (-1 for a missing one).
static void field_starts(const char *line, int at[5]) {
  int n = 0;
  for (int i = 0; line[i] && line[i] != '\n' && n < 5; i++) {
    if (line[i] != ' ' && (i == 0 || line[i - 1] == ' ')) {
      at[n++] = i;
    }
  }
  while (n < 5) {
    at[n++] = -1;
  }
}

// loom_info's tunables table (loom_print_info): one row per tunable, and in every row the value,
// default, source and help start at the offsets of their headers (a name of 21 characters or
// more, or a long value, shifted the rest of its row).
static void check_info_columns(const loom_ctx_t *ctx, const char *what) {
  FILE *f = tmpfile();
  CHECK(f != NULL, "%s: tmpfile", what);
  if (!f) {
    return;
  }
  loom_print_info(ctx, f);
  rewind(f);
  char line[4096];
  int header[5] = {-1, -1, -1, -1, -1}, rows = 0;
  while (fgets(line, sizeof line, f)) {
    if (header[0] < 0) {
      if (!strncmp(line, "  variable ", 11)) {
        field_starts(line, header);
      }
      continue;
    }
    if (strncmp(line, "  LOOM_", 7) != 0) {
      break; // (the note under the table)
    }
    int at[5];
    field_starts(line, at);
    rows++;
    CHECK(!memcmp(at, header, sizeof at),
          "%s: columns at %d %d %d %d %d, the header's at %d %d %d %d %d: %s", what, at[0], at[1],
          at[2], at[3], at[4], header[0], header[1], header[2], header[3], header[4], line);
  }
  fclose(f);
  CHECK(header[4] > 0 && rows == LOOM_P_COUNT, "%s: header at %d, %d rows, want %d", what,
        header[0], rows, LOOM_P_COUNT);
}

int main(void) {
  struct loom_params p;
  unset_all();

  // Defaults.
  CHECK(loom_params_resolve(NULL, &p) == LOOM_OK, "defaults resolve: %s", loom_last_error(NULL));
  CHECK(p.debug_level == LOOM_LOG_WARN && p.debug_mask == LOOM_SUB_ALL, "log defaults");
  CHECK(p.bind == LOOM_BIND_CORE && p.blas_threads == 0 && p.gpu == LOOM_GPU_AUTO, "placement");
  CHECK(p.node_size == 0 && p.ep_size == 1 && p.attn_servers == 0, "group defaults");
  CHECK(p.timeout == 300 && p.check_consistency == 0, "watchdog defaults %d %d", p.timeout,
        p.check_consistency);
  for (int i = 0; i < LOOM_P_COUNT; i++) {
    CHECK(p.source[i] == LOOM_SRC_DEFAULT, "%s source", loom_param_table[i].env);
    CHECK(!strcmp(p.text[i], loom_param_table[i].def), "%s text", loom_param_table[i].env);
    const struct loom_param_desc *d = &loom_param_table[i];
    CHECK(d->env && !strncmp(d->env, "LOOM_", 5) && d->field && d->valid && d->help && d->parse,
          "table entry %d complete", i);
  }

  // Config struct.
  loom_config_t cfg;
  loom_config_init(&cfg);
  CHECK(cfg.ep_size == LOOM_UNSET && cfg.node_size == LOOM_UNSET && cfg.bind == NULL, "unset");
  cfg.ep_size = 2;
  cfg.bind = "numa";
  cfg.attn_servers = "inplace";
  cfg.debug = "info";
  cfg.debug_subsys = "^COLL,MOE";
  cfg.gpu = "none";
  CHECK(loom_params_resolve(&cfg, &p) == LOOM_OK, "config resolves: %s", loom_last_error(NULL));
  CHECK(p.ep_size == 2 && p.source[LOOM_P_EP_SIZE] == LOOM_SRC_CONFIG, "ep from config");
  CHECK(p.bind == LOOM_BIND_NUMA && p.attn_servers == LOOM_ATTN_INPLACE, "bind, attn");
  CHECK(p.debug_level == LOOM_LOG_INFO, "case-insensitive choice");
  CHECK(p.debug_mask == (LOOM_SUB_ALL & ~(LOOM_SUB_COLL | LOOM_SUB_MOE)), "exclusion mask %x",
        p.debug_mask);
  CHECK(p.gpu == LOOM_GPU_NONE, "gpu none");

  // Environment overrides config.
  setenv("LOOM_EP_SIZE", "4", 1);
  setenv("LOOM_ATTN_SERVERS", "3", 1);
  setenv("LOOM_DEBUG_SUBSYS", "INIT,TOPO", 1);
  setenv("LOOM_GPU", "2", 1);
  CHECK(loom_params_resolve(&cfg, &p) == LOOM_OK, "env resolves");
  CHECK(p.ep_size == 4 && p.source[LOOM_P_EP_SIZE] == LOOM_SRC_ENV, "env wins");
  CHECK(p.attn_servers == 3 && p.gpu == 2, "attn N, gpu index");
  CHECK(p.debug_mask == (LOOM_SUB_INIT | LOOM_SUB_TOPO), "subsys list");
  unset_all();

  // Every bad value, through the environment and through the config struct.
  for (int i = 0; i < LOOM_P_COUNT; i++) {
    const struct loom_param_desc *d = &loom_param_table[i];
    for (int j = 0; bad_values[i][j]; j++) {
      setenv(d->env, bad_values[i][j], 1);
      loom_status_t st = loom_params_resolve(NULL, &p);
      const char *msg = loom_last_error(NULL);
      CHECK(st == LOOM_ERR_INVALID_ARG, "%s='%s' accepted", d->env, bad_values[i][j]);
      CHECK(strstr(msg, d->env) && strstr(msg, d->valid), "%s message lacks name/valid: %s", d->env,
            msg);
      unsetenv(d->env);
      if (!d->field_is_int) {
        loom_config_init(&cfg);
        *(const char **)((char *)&cfg + d->field_offset) = bad_values[i][j];
        st = loom_params_resolve(&cfg, &p);
        msg = loom_last_error(NULL);
        CHECK(st == LOOM_ERR_INVALID_ARG && strstr(msg, d->field) && strstr(msg, d->env),
              "config %s='%s': %s", d->field, bad_values[i][j], msg);
      }
    }
  }
  loom_config_init(&cfg);
  cfg.ep_size = 0;
  CHECK(loom_params_resolve(&cfg, &p) == LOOM_ERR_INVALID_ARG, "config ep_size 0 rejected");
  CHECK(strstr(loom_last_error(NULL), "config field ep_size (LOOM_EP_SIZE)"), "names field: %s",
        loom_last_error(NULL));
  cfg.ep_size = LOOM_UNSET;
  cfg.blas_threads = 2000;
  CHECK(loom_params_resolve(&cfg, &p) == LOOM_ERR_INVALID_ARG, "blas_threads 2000 rejected");

  // LOOM_TIMEOUT: a value in seconds, 0 disables the watchdog (an operation entered on a group
  // gets no deadline); LOOM_CHECK_CONSISTENCY 0 or 1.
  setenv("LOOM_TIMEOUT", "0", 1);
  setenv("LOOM_CHECK_CONSISTENCY", "1", 1);
  CHECK(loom_params_resolve(NULL, &p) == LOOM_OK && p.timeout == 0 && p.check_consistency == 1,
        "LOOM_TIMEOUT=0, LOOM_CHECK_CONSISTENCY=1: %s", loom_last_error(NULL));
  unset_all();
  loom_config_init(&cfg);
  cfg.timeout = 7;
  CHECK(loom_params_resolve(&cfg, &p) == LOOM_OK && p.timeout == 7 &&
            p.source[LOOM_P_TIMEOUT] == LOOM_SRC_CONFIG,
        "timeout from config");
  setenv("LOOM_TIMEOUT", "bad", 1);
  CHECK(loom_params_resolve(NULL, &p) == LOOM_ERR_INVALID_ARG &&
            strstr(loom_last_error(NULL), "environment variable LOOM_TIMEOUT='bad' is invalid") &&
            strstr(loom_last_error(NULL), "0..31536000"),
        "LOOM_TIMEOUT=bad: %s", loom_last_error(NULL));
  unset_all();
  struct loom_group grp = {.kind = LOOM_GROUP_WORLD, .rank = 0, .size = 1};
  struct loom_op_desc d;
  struct loom_watch w;
  loom_op_desc_set(&d, LOOM_OPK_ALLREDUCE, "grad.x", LOOM_F32, 4, LOOM_SUM, -1, 0);
  grp.timeout = 0;
  loom_watch_enter(&w, &grp, &d, 1);
  CHECK(w.deadline_ns == 0 && w.seq == 0, "timeout 0: no deadline (%lld)",
        (long long)w.deadline_ns);
  loom_watch_check(&w); // never aborts without a deadline
  grp.timeout = 3;
  loom_watch_enter(&w, &grp, &d, 1);
  CHECK(w.deadline_ns == w.start_ns + 3000000000ll, "timeout 3: deadline 3 s after the start");
  CHECK(w.d.group_kind == LOOM_GROUP_WORLD && w.d.group_size == 1 && !strcmp(w.d.name, "grad.x"),
        "descriptor completed");
  // loom_test finding the deadline passed after a long time without a test extends it once.
  w.start_ns -= 5000000000ll;
  w.deadline_ns -= 5000000000ll;
  w.next_ns -= 5000000000ll;
  loom_watch_test(&w);
  CHECK(w.extended == 1 && w.deadline_ns > loom_watch_now_ns() + 2000000000ll &&
            w.next_ns == w.deadline_ns,
        "first late test: deadline extended by min(timeout, 10 s)");

  // LOOM_STALL_WARN: the first warning stall_warn seconds after the start, when that is before
  // the deadline; none when it is not, or 0.
  CHECK(w.warn_ns == 0, "default group (stall_warn 0): no warning");
  grp.stall_warn = 1;
  loom_watch_enter(&w, &grp, &d, 1);
  CHECK(w.warn_ns == w.start_ns + 1000000000ll && w.next_ns == w.warn_ns &&
            w.deadline_ns == w.start_ns + 3000000000ll,
        "stall_warn 1, timeout 3: warning at 1 s, then the deadline");
  loom_watch_check(&w); // not due yet: nothing happens
  CHECK(w.warn_ns == w.start_ns + 1000000000ll, "not due: warning unchanged");
  // Due 2.5 s after the start (set back in time): it warns (this rank: no peers to read, the
  // operation is not counted without a window) and the next warning is at 3 s, the deadline:
  // there is none after it.
  w.start_ns -= 2500000000ll;
  w.deadline_ns -= 2500000000ll;
  w.warn_ns -= 2500000000ll;
  w.next_ns -= 2500000000ll;
  const int64_t start = w.start_ns;
  loom_watch_due(&w);
  CHECK(w.warn_ns == start + 3000000000ll && w.next_ns == w.deadline_ns &&
            w.deadline_ns == start + 3000000000ll,
        "warned at 2.5 s: next warning at 3 s is the deadline (%lld / %lld)",
        (long long)(w.warn_ns - start), (long long)(w.next_ns - start));
  // loom_test after a long gap does not warn (the operation may not have moved) ...
  grp.timeout = 100;
  grp.stall_warn = 10;
  loom_watch_enter(&w, &grp, &d, 1);
  w.start_ns -= 15000000000ll;
  w.warn_ns -= 15000000000ll;
  w.next_ns -= 15000000000ll;
  w.deadline_ns -= 15000000000ll;
  const int64_t warn_at = w.warn_ns;
  loom_watch_test(&w);
  CHECK(w.warn_ns == warn_at, "a test after a long gap does not warn");
  // ... the next test, right after, does: the next warning is at 20 s.
  loom_watch_test(&w);
  CHECK(w.warn_ns == w.start_ns + 20000000000ll && w.next_ns == w.warn_ns,
        "a test after a short gap warns; next at 20 s (%lld)", (long long)(w.warn_ns - w.start_ns));
  grp.stall_warn = 100; // not before the deadline: never
  loom_watch_enter(&w, &grp, &d, 1);
  CHECK(w.warn_ns == 0 && w.next_ns == w.deadline_ns, "stall_warn >= timeout: no warning");
  grp.stall_warn = 0;

  // One spelling per value: choices as the table writes them, whole numbers as digits; paths
  // untouched (ranks compare this text, and programs read it through loom_tunable).
  unset_all();
  setenv("LOOM_ATTN_SERVERS", "INPLACE", 1);
  setenv("LOOM_DEBUG", "info", 1);
  setenv("LOOM_TIMEOUT", " +05 ", 1);
  setenv("LOOM_NONFINITE", "Skip", 1);
  setenv("LOOM_TIMELINE", "/tmp/Trace.0%r.json", 1);
  setenv("LOOM_GPU", "+0", 1);
  CHECK(loom_params_resolve(NULL, &p) == LOOM_OK, "mixed spellings resolve: %s",
        loom_last_error(NULL));
  CHECK(!strcmp(p.text[LOOM_P_ATTN_SERVERS], "inplace") && !strcmp(p.text[LOOM_P_DEBUG], "INFO") &&
            !strcmp(p.text[LOOM_P_TIMEOUT], "5") && !strcmp(p.text[LOOM_P_NONFINITE], "skip") &&
            !strcmp(p.text[LOOM_P_TIMELINE], "/tmp/Trace.0%r.json") &&
            !strcmp(p.text[LOOM_P_GPU], "0"),
        "canonical text: '%s' '%s' '%s' '%s' '%s' '%s'", p.text[LOOM_P_ATTN_SERVERS],
        p.text[LOOM_P_DEBUG], p.text[LOOM_P_TIMEOUT], p.text[LOOM_P_NONFINITE],
        p.text[LOOM_P_TIMELINE], p.text[LOOM_P_GPU]);
  unset_all();

  // LOOM_PIPE_BYTES: the ordered reductions' chunk (bytes per peer), 1 MiB by default, 8 (one
  // element of any dtype) to 1 GiB, from the environment or the config; a bad value names the
  // variable, the range and the fix.
  CHECK(loom_params_resolve(NULL, &p) == LOOM_OK && p.pipe_bytes == LOOM_PIPE_BYTES_DEFAULT &&
            p.pipe_bytes == 1048576 && !strcmp(p.text[LOOM_P_PIPE_BYTES], "1048576"),
        "LOOM_PIPE_BYTES default: %d", p.pipe_bytes);
  setenv("LOOM_PIPE_BYTES", " 8", 1);
  CHECK(loom_params_resolve(NULL, &p) == LOOM_OK && p.pipe_bytes == 8 &&
            p.source[LOOM_P_PIPE_BYTES] == LOOM_SRC_ENV && !strcmp(p.text[LOOM_P_PIPE_BYTES], "8"),
        "LOOM_PIPE_BYTES=' 8': %d '%s'", p.pipe_bytes, p.text[LOOM_P_PIPE_BYTES]);
  setenv("LOOM_PIPE_BYTES", "1073741824", 1);
  CHECK(loom_params_resolve(NULL, &p) == LOOM_OK && p.pipe_bytes == 1073741824,
        "LOOM_PIPE_BYTES=1 GiB: %d", p.pipe_bytes);
  setenv("LOOM_PIPE_BYTES", "7", 1);
  CHECK(loom_params_resolve(NULL, &p) == LOOM_ERR_INVALID_ARG &&
            strstr(loom_last_error(NULL), "environment variable LOOM_PIPE_BYTES='7' is invalid") &&
            strstr(loom_last_error(NULL), "8..1073741824") &&
            strstr(loom_last_error(NULL), "Fix or unset it (default '1048576')"),
        "LOOM_PIPE_BYTES=7: %s", loom_last_error(NULL));
  unset_all();
  loom_config_init(&cfg);
  CHECK(cfg.pipe_bytes == LOOM_UNSET, "pipe_bytes unset by loom_config_init");
  cfg.pipe_bytes = 4096;
  CHECK(loom_params_resolve(&cfg, &p) == LOOM_OK && p.pipe_bytes == 4096 &&
            p.source[LOOM_P_PIPE_BYTES] == LOOM_SRC_CONFIG,
        "pipe_bytes from config: %d", p.pipe_bytes);
  setenv("LOOM_PIPE_BYTES", "65536", 1); // the environment wins
  CHECK(loom_params_resolve(&cfg, &p) == LOOM_OK && p.pipe_bytes == 65536, "env over config");
  unset_all();
  cfg.pipe_bytes = 4;
  CHECK(loom_params_resolve(&cfg, &p) == LOOM_ERR_INVALID_ARG &&
            strstr(loom_last_error(NULL), "config field pipe_bytes (LOOM_PIPE_BYTES)") &&
            strstr(loom_last_error(NULL), "8..1073741824"),
        "config pipe_bytes 4: %s", loom_last_error(NULL));
  loom_config_init(&cfg);

  // LOOM_STALL_WARN: 60 s by default, 0 (none) to a year, environment or config.
  CHECK(loom_params_resolve(NULL, &p) == LOOM_OK && p.stall_warn == 60 &&
            !strcmp(p.text[LOOM_P_STALL_WARN], "60"),
        "LOOM_STALL_WARN default: %d", p.stall_warn);
  setenv("LOOM_STALL_WARN", "0", 1);
  CHECK(loom_params_resolve(NULL, &p) == LOOM_OK && p.stall_warn == 0 &&
            p.source[LOOM_P_STALL_WARN] == LOOM_SRC_ENV,
        "LOOM_STALL_WARN=0: %d", p.stall_warn);
  setenv("LOOM_STALL_WARN", "5s", 1);
  CHECK(loom_params_resolve(NULL, &p) == LOOM_ERR_INVALID_ARG &&
            strstr(loom_last_error(NULL), "environment variable LOOM_STALL_WARN='5s' is invalid") &&
            strstr(loom_last_error(NULL), "0..31536000") &&
            strstr(loom_last_error(NULL), "Fix or unset it (default '60')"),
        "LOOM_STALL_WARN=5s: %s", loom_last_error(NULL));
  unset_all();
  CHECK(cfg.stall_warn == LOOM_UNSET, "stall_warn unset by loom_config_init");
  cfg.stall_warn = 30;
  CHECK(loom_params_resolve(&cfg, &p) == LOOM_OK && p.stall_warn == 30 &&
            p.source[LOOM_P_STALL_WARN] == LOOM_SRC_CONFIG,
        "stall_warn from config: %d", p.stall_warn);
  loom_config_init(&cfg);

  // LOOM_HIER_ALLREDUCE: auto by default, off in any case, environment or config.
  CHECK(loom_params_resolve(NULL, &p) == LOOM_OK && p.hier_allreduce == 0 &&
            !strcmp(p.text[LOOM_P_HIER_ALLREDUCE], "auto"),
        "LOOM_HIER_ALLREDUCE default: %d", p.hier_allreduce);
  setenv("LOOM_HIER_ALLREDUCE", "OFF", 1);
  CHECK(loom_params_resolve(NULL, &p) == LOOM_OK && p.hier_allreduce == 1 &&
            !strcmp(p.text[LOOM_P_HIER_ALLREDUCE], "off"),
        "LOOM_HIER_ALLREDUCE=OFF: %d '%s'", p.hier_allreduce, p.text[LOOM_P_HIER_ALLREDUCE]);
  setenv("LOOM_HIER_ALLREDUCE", "on", 1);
  CHECK(loom_params_resolve(NULL, &p) == LOOM_ERR_INVALID_ARG &&
            strstr(loom_last_error(NULL), "LOOM_HIER_ALLREDUCE='on' is invalid") &&
            strstr(loom_last_error(NULL), "auto|off"),
        "LOOM_HIER_ALLREDUCE=on: %s", loom_last_error(NULL));
  unset_all();
  cfg.hier_allreduce = "off";
  CHECK(loom_params_resolve(&cfg, &p) == LOOM_OK && p.hier_allreduce == 1 &&
            p.source[LOOM_P_HIER_ALLREDUCE] == LOOM_SRC_CONFIG,
        "hier_allreduce from config: %d", p.hier_allreduce);
  loom_config_init(&cfg);

  // Decimal only for the planner's link figures: hex once read 0x10 as 16.
  setenv("LOOM_NET_GBPS", "0x10", 1);
  CHECK(loom_params_resolve(NULL, &p) == LOOM_ERR_INVALID_ARG, "LOOM_NET_GBPS=0x10 refused");
  unset_all();
  setenv("LOOM_NET_GBPS", "1e2", 1);
  CHECK(loom_params_resolve(NULL, &p) == LOOM_OK && p.net_gbps == 100.0 &&
            !strcmp(p.text[LOOM_P_NET_GBPS], "100"),
        "LOOM_NET_GBPS=1e2 is 100, and reads '100' as 100.0 does: '%s'", p.text[LOOM_P_NET_GBPS]);
  unset_all();
  // White space around a real number, as around an integer (was: " 10" read, "10 " refused).
  setenv("LOOM_NET_GBPS", " 2.5 ", 1);
  setenv("LOOM_NET_ALPHA_US", "30\t", 1);
  CHECK(loom_params_resolve(NULL, &p) == LOOM_OK && p.net_gbps == 2.5 && p.net_alpha_us == 30.0 &&
            !strcmp(p.text[LOOM_P_NET_GBPS], "2.5") && !strcmp(p.text[LOOM_P_NET_ALPHA_US], "30"),
        "LOOM_NET_GBPS=' 2.5 ', LOOM_NET_ALPHA_US='30\\t': '%s' '%s'", p.text[LOOM_P_NET_GBPS],
        p.text[LOOM_P_NET_ALPHA_US]);
  unset_all();
  for (int i = 0; i < 5; i++) {
    const char *bad[] = {" ", "inf", "nan", "1e999", "2 .5"};
    setenv("LOOM_NET_GBPS", bad[i], 1);
    CHECK(loom_params_resolve(NULL, &p) == LOOM_ERR_INVALID_ARG, "LOOM_NET_GBPS='%s' refused",
          bad[i]);
    unset_all();
  }
  setenv("LOOM_COMPRESS", "int8\t", 1);
  CHECK(loom_params_resolve(NULL, &p) == LOOM_ERR_INVALID_ARG, "LOOM_COMPRESS with a tab refused");
  unset_all();

  // Parsers directly.
  long v;
  CHECK(loom_parse_int_range(" 12 ", 0, 20, &v) == 0 && v == 12, "spaces ok");
  CHECK(loom_parse_int_range("99999999999999999999", 0, 20, &v) != 0, "overflow rejected");
  unsigned mask;
  char err[128];
  CHECK(loom_parse_subsys_list("all", &mask, err, sizeof err) == 0 && mask == LOOM_SUB_ALL, "all");
  CHECK(loom_parse_subsys_list("INIT,,TOPO", &mask, err, sizeof err) != 0, "empty item");
  // An empty item at either end too (",INIT" was refused but "INIT," accepted).
  CHECK(loom_parse_subsys_list("INIT,", &mask, err, sizeof err) != 0 && strstr(err, "empty"),
        "trailing comma: %s", err);
  CHECK(loom_parse_subsys_list("^COLL,", &mask, err, sizeof err) != 0, "trailing comma after ^");
  CHECK(loom_parse_subsys_list(",INIT", &mask, err, sizeof err) != 0 && strstr(err, "empty"),
        "leading comma: %s", err);
  // The scheduler's spin as it applies: 0 when left at its default with more ranks than cores
  // on the host (what loom_info says under its table), the value otherwise.
  static loom_ctx_t sctx; // (large: not on the stack)
  CHECK(loom_params_resolve(NULL, &sctx.params) == LOOM_OK, "%s", loom_last_error(NULL));
  sctx.local_size = 3;
  sctx.topo.pub.cores = 2;
  int forced = -1;
  CHECK(loom_sched_spin_us_effective(&sctx, &forced) == 0 && forced == 1, "3 ranks on 2 cores");
  sctx.local_size = 2;
  CHECK(loom_sched_spin_us_effective(&sctx, &forced) == 20000 && forced == 0, "2 on 2 cores");
  sctx.local_size = 3;
  setenv("LOOM_SCHED_SPIN_US", "500", 1);
  CHECK(loom_params_resolve(NULL, &sctx.params) == LOOM_OK, "%s", loom_last_error(NULL));
  CHECK(loom_sched_spin_us_effective(&sctx, &forced) == 500 && forced == 0, "set: it holds");
  unsetenv("LOOM_SCHED_SPIN_US");

  // loom_info's table keeps its columns: the defaults (LOOM_FUSION_THRESHOLD and
  // LOOM_CHECK_CONSISTENCY are the longest names), and a context with a value longer than any
  // default, set in the environment.
  check_info_columns(NULL, "loom_print_info(NULL)");
  setenv("LOOM_TIMELINE", "/tmp/a-timeline-path-longer-than-the-defaults.%r.json", 1);
  CHECK(loom_params_resolve(NULL, &sctx.params) == LOOM_OK, "%s", loom_last_error(NULL));
  check_info_columns(&sctx, "loom_print_info(ctx) with a long LOOM_TIMELINE");
  unsetenv("LOOM_TIMELINE");

  // LOOM_ variables loom does not read: one warning each, naming the closest tunable; tunables
  // and the few other names loom and its tools read are not reported.
  char logpath[] = "/tmp/test_params_log.XXXXXX";
  int logfd = mkstemp(logpath);
  CHECK(logfd >= 0 && loom_log_configure(LOOM_LOG_WARN, LOOM_SUB_ALL, logpath) == 0, "log file");
  const int before = loom_params_warn_unknown_env();
  setenv("LOOM_TIMOUT", "3", 1);
  setenv("LOOM_TIMEOUT", "3", 1);
  setenv("LOOM_CACHE_DIR", "/tmp", 1);
  setenv("LOOM_ZZZZZZZZZ", "1", 1);
  setenv("LOOM_STALL_WARNING", "1", 1);
  setenv("LOOM_CHECK_CONSIST", "1", 1);
  setenv("LOOM_TIME", "1", 1);
  const int after = loom_params_warn_unknown_env();
  CHECK(after == before + 5, "%d unknown variables, want %d + 5", after, before);
  loom_log_configure(LOOM_LOG_WARN, LOOM_SUB_ALL, NULL);
  char logtext[4096] = "";
  FILE *lf = fopen(logpath, "r");
  size_t got = lf ? fread(logtext, 1, sizeof logtext - 1, lf) : 0;
  logtext[got] = '\0';
  if (lf) {
    fclose(lf);
  }
  CHECK(strstr(logtext, "LOOM_TIMOUT is set but loom has no such variable (did you mean "
                        "LOOM_TIMEOUT?)") != NULL,
        "the warning names the closest tunable: %s", logtext);
  CHECK(strstr(logtext, "LOOM_ZZZZZZZZZ is set but loom has no such variable: it is ignored"),
        "no suggestion for a name far from every tunable: %s", logtext);
  CHECK(!strstr(logtext, "LOOM_CACHE_DIR is set"), "LOOM_CACHE_DIR reported: %s", logtext);
  CHECK(strstr(logtext, "LOOM_STALL_WARNING is set but loom has no such variable (did you mean "
                        "LOOM_STALL_WARN?)") != NULL,
        "a tunable the name extends: %s", logtext);
  CHECK(strstr(logtext, "LOOM_CHECK_CONSIST is set but loom has no such variable (did you mean "
                        "LOOM_CHECK_CONSISTENCY?)") != NULL,
        "a tunable the name shortens: %s", logtext);
  CHECK(strstr(logtext, "LOOM_TIME is set but loom has no such variable: it is ignored"),
        "no suggestion where two tunables start so (LOOM_TIMELINE, LOOM_TIMEOUT): %s", logtext);
  unsetenv("LOOM_STALL_WARNING");
  unsetenv("LOOM_CHECK_CONSIST");
  unsetenv("LOOM_TIME");
  unsetenv("LOOM_TIMOUT");
  unsetenv("LOOM_TIMEOUT");
  unsetenv("LOOM_CACHE_DIR");
  unsetenv("LOOM_ZZZZZZZZZ");
  if (logfd >= 0) {
    close(logfd);
    unlink(logpath);
  }
  return check_exit("test_params");
}
