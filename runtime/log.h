/* log.h — internal subsystem logging: LOOM_DEBUG level, LOOM_DEBUG_SUBSYS mask,
 * LOOM_DEBUG_FILE destination; lines are prefixed "host:pid:tid [rank] LOOM LEVEL SUBSYS". */
#ifndef LOOM_LOG_H
#define LOOM_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

enum loom_log_level { LOOM_LOG_WARN = 0, LOOM_LOG_INFO = 1, LOOM_LOG_TRACE = 2 };

// Subsystems, one bit each; names in loom_log_subsys_names (same order).
enum loom_log_subsys {
  LOOM_SUB_INIT = 1u << 0,
  LOOM_SUB_TOPO = 1u << 1,
  LOOM_SUB_ENV = 1u << 2,
  LOOM_SUB_MEM = 1u << 3,
  LOOM_SUB_COLL = 1u << 4,
  LOOM_SUB_COMPRESS = 1u << 5,
  LOOM_SUB_MOE = 1u << 6,
  LOOM_SUB_ATTN = 1u << 7,
  LOOM_SUB_SCHED = 1u << 8,
  LOOM_SUB_COMPUTE = 1u << 9,
  LOOM_SUB_CUDA = 1u << 10,
  LOOM_SUB_ALL = (1u << 11) - 1
};
#define LOOM_LOG_NSUBSYS 11
extern const char *const loom_log_subsys_names[LOOM_LOG_NSUBSYS];

extern int loom_log_level;     // current level (WARN by default)
extern unsigned loom_log_mask; // enabled subsystems (ALL by default)

// Apply the resolved tunables. file_pattern may be NULL or "" for stderr; %h and %p expand.
// Returns 0, or -1 with errno set when the file cannot be opened.
int loom_log_configure(int level, unsigned mask, const char *file_pattern);
void loom_log_set_rank(int rank); // -1 until known
void loom_log_close(void);

void loom_log_write(int level, unsigned subsys, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#ifdef __cplusplus
}
#endif

#define LOOM_WARN(sub, ...) loom_log_write(LOOM_LOG_WARN, (sub), __FILE__, __LINE__, __VA_ARGS__)
#define LOOM_INFO(sub, ...)                                                                        \
  do {                                                                                             \
    if (loom_log_level >= LOOM_LOG_INFO && (loom_log_mask & (sub)))                                \
      loom_log_write(LOOM_LOG_INFO, (sub), __FILE__, __LINE__, __VA_ARGS__);                       \
  } while (0)
#define LOOM_TRACE(sub, ...)                                                                       \
  do {                                                                                             \
    if (loom_log_level >= LOOM_LOG_TRACE && (loom_log_mask & (sub)))                               \
      loom_log_write(LOOM_LOG_TRACE, (sub), __FILE__, __LINE__, __VA_ARGS__);                      \
  } while (0)

#endif
