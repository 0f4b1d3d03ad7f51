/* fuzz_timeline.c — libFuzzer target for loom_timeline_merge's strict JSON reader (its source is
 * included, main renamed): any bytes as a rank's trace; what parses must merge and parse again. */
#define main loom_timeline_merge_main
#include "../../sched/timeline_merge.c"
#undef main

#include <stdint.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char out_path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  snprintf(out_path, sizeof out_path, "/tmp/fuzz_timeline.%ld.json", (long)getpid());
  return 0;
}

static void release(struct input *in) {
  free(in->buf);
  free(in->ev);
  free(in->pids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // The reader's input as read_file leaves it: exactly the file's bytes, no NUL after them.
  struct input in = {.path = "fuzz", .buf = malloc(size ? size : 1), .len = size};
  if (!in.buf) {
    return 0;
  }
  memcpy(in.buf, data, size);
  struct parser p = {&in, 0, NULL};
  if (parse_trace(&p) != 0) {
    if (!p.err || p.pos > size) {
      abort(); // a rejection names what was expected, at an offset inside the file
    }
    release(&in);
    return 0;
  }
  size_t last = 0;
  for (int e = 0; e < in.nev; e++) { // each event: an object, in order, inside the file
    const struct span s = in.ev[e];
    if (s.begin < last || s.end > size || s.end <= s.begin || in.buf[s.begin] != '{' ||
        in.buf[s.end - 1] != '}') {
      abort();
    }
    last = s.end;
  }
  // Merged (as the tool writes it) and read back: the same events, marked as a merge.
  if (write_merged(out_path, &in, 1) == 0) {
    struct input m = {.path = out_path};
    struct parser q = {&m, 0, NULL};
    if (read_file(&m, 0) != 0 || parse_trace(&q) != 0 || m.nev != in.nev || !m.merged ||
        m.npids != in.npids) {
      abort();
    }
    release(&m);
    remove(out_path);
  }
  release(&in);
  return 0;
}
