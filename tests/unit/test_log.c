/* test_log.c — logging to LOOM_DEBUG_FILE with %h/%p expansion, the line prefix, WARN's
 * file:line, and filtering by level and subsystem. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../check.h"
#include "log.h"

static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) {
    return NULL;
  }
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

int main(void) {
  char dir[] = "/tmp/loom_test_log_XXXXXX";
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");
  char pattern[256], path[512], host[64];
  snprintf(pattern, sizeof pattern, "%s/log.%%h.%%p.txt", dir);
  gethostname(host, sizeof host);
  host[sizeof host - 1] = '\0';
  snprintf(path, sizeof path, "%s/log.%s.%ld.txt", dir, host, (long)getpid());

  CHECK(loom_log_configure(LOOM_LOG_INFO, LOOM_SUB_INIT | LOOM_SUB_COLL, pattern) == 0, "open");
  loom_log_set_rank(3);
  LOOM_WARN(LOOM_SUB_MOE, "warn always %d", 1); // WARN ignores the subsystem mask
  LOOM_INFO(LOOM_SUB_INIT, "info init %s", "shown");
  LOOM_INFO(LOOM_SUB_ATTN, "info attn hidden"); // subsystem filtered
  LOOM_TRACE(LOOM_SUB_INIT, "trace hidden");    // level filtered
  loom_log_close();

  char *text = slurp(path);
  CHECK(text != NULL, "log file %s exists", path);
  if (text) {
    char prefix[128];
    snprintf(prefix, sizeof prefix, "%s:%ld:", host, (long)getpid());
    CHECK(strstr(text, prefix) != NULL, "prefix host:pid: in\n%s", text);
    CHECK(strstr(text, "[3] LOOM WARN MOE test_log.c:") != NULL, "WARN with file:line:\n%s", text);
    CHECK(strstr(text, "warn always 1") != NULL, "warn text");
    CHECK(strstr(text, "[3] LOOM INFO INIT info init shown") != NULL, "info line:\n%s", text);
    CHECK(strstr(text, "attn hidden") == NULL, "subsystem filter");
    CHECK(strstr(text, "trace hidden") == NULL, "level filter");
  }
  // TRACE level shows trace lines; an unwritable path fails.
  CHECK(loom_log_configure(LOOM_LOG_TRACE, LOOM_SUB_ALL, pattern) == 0, "reopen");
  LOOM_TRACE(LOOM_SUB_SCHED, "trace now shown");
  loom_log_close();
  text = slurp(path);
  CHECK(text && strstr(text, "LOOM TRACE SCHED trace now shown"), "trace line");
  CHECK(loom_log_configure(LOOM_LOG_WARN, LOOM_SUB_ALL, "/nonexistent/dir/x.log") != 0,
        "unwritable path reported");
  loom_log_configure(LOOM_LOG_WARN, LOOM_SUB_ALL, NULL);
  unlink(path);
  rmdir(dir);
  return check_exit("test_log");
}
