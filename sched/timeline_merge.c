/* timeline_merge.c — loom_timeline_merge OUT.json IN0.json IN1.json ...: merges the per-rank
 * Chrome traces that LOOM_TIMELINE writes into one file (events kept as they are, pid = rank). */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sched_internal.h"

#define MAX_DEPTH 64
// An input's bytes at most: an event takes at least 3 of them, so its count stays an int.
#define MAX_INPUT ((uint64_t)1 << 31)
// The mark a merged file carries, {"traceEvents":[...],"otherData":{"loom_timeline_merge":N}}:
// -f replaces such a file (or one holding several ranks), never a single rank's trace.
#define MERGE_MARK "\"loom_timeline_merge\""

// ---- a strict JSON reader that remembers where each trace event starts and ends --------------

struct span {
  size_t begin, end; // [begin, end) in the file
};

struct input {
  const char *path;
  char *buf;
  size_t len;
  struct span *ev;
  int nev, cap;
  long *pids; // distinct pids of the events
  int npids, cpids;
  int merged; // the file carries this tool's mark (otherData.loom_timeline_merge)
};

struct parser {
  struct input *in;
  size_t pos;
  const char *err; // what was expected at pos
};

static int fail_at(struct parser *p, const char *what) {
  if (!p->err) {
    p->err = what;
  }
  return -1;
}

static void skip_ws(struct parser *p) {
  while (p->pos < p->in->len && strchr(" \t\r\n", p->in->buf[p->pos]) && p->in->buf[p->pos]) {
    p->pos++;
  }
}

static int peek(struct parser *p) {
  return p->pos < p->in->len ? (unsigned char)p->in->buf[p->pos] : -1;
}

static int expect(struct parser *p, char c, const char *what) {
  skip_ws(p);
  if (peek(p) != c) {
    return fail_at(p, what);
  }
  p->pos++;
  return 0;
}

static int hexval(int c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

// Length of the valid UTF-8 sequence at s (n bytes left), or 0 when the bytes are not one.
static size_t utf8_len(const unsigned char *s, size_t n) {
  unsigned c = s[0], min;
  size_t len;
  if (c < 0x80) {
    return 1;
  } else if ((c & 0xE0) == 0xC0) {
    len = 2, min = 0x80, c &= 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, min = 0x800, c &= 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, min = 0x10000, c &= 0x07;
  } else {
    return 0;
  }
  if (len > n) {
    return 0;
  }
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80) {
      return 0;
    }
    c = (c << 6) | (s[i] & 0x3F);
  }
  return c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF) ? 0 : len;
}

// A string at pos; *raw and *rawlen give its bytes between the quotes (escapes left as is).
static int parse_string(struct parser *p, const char **raw, size_t *rawlen) {
  if (expect(p, '"', "a string") != 0) {
    return -1;
  }
  size_t begin = p->pos;
  for (;;) {
    int c = peek(p);
    if (c < 0) {
      return fail_at(p, "the end of a string (the file ends inside one)");
    }
    if (c == '"') {
      break;
    }
    if (c < 0x20) {
      return fail_at(p, "an escaped control character in a string");
    }
    if (c >= 0x80) {
      size_t n = utf8_len((const unsigned char *)p->in->buf + p->pos, p->in->len - p->pos);
      if (n == 0) {
        return fail_at(p, "valid UTF-8 in a string");
      }
      p->pos += n;
      continue;
    }
    p->pos++;
    if (c == '\\') {
      c = peek(p);
      if (c == 'u') {
        for (int i = 1; i <= 4; i++) {
          if (p->pos + (size_t)i >= p->in->len || hexval(p->in->buf[p->pos + (size_t)i]) < 0) {
            return fail_at(p, "four hex digits after \\u");
          }
        }
        p->pos += 5;
      } else if (c >= 0 && strchr("\"\\/bfnrt", c) && c) {
        p->pos++;
      } else {
        return fail_at(p, "a valid escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
      }
    }
  }
  if (raw) {
    *raw = p->in->buf + begin;
    *rawlen = p->pos - begin;
  }
  p->pos++; // closing quote
  return 0;
}

static int parse_number(struct parser *p, long *as_long) {
  skip_ws(p);
  size_t begin = p->pos;
  if (peek(p) == '-') {
    p->pos++;
  }
  if (peek(p) == '0') {
    p->pos++;
  } else if (peek(p) >= '1' && peek(p) <= '9') {
    while (peek(p) >= '0' && peek(p) <= '9') {
      p->pos++;
    }
  } else {
    return fail_at(p, "a number");
  }
  int integral = 1;
  if (peek(p) == '.') {
    integral = 0;
    p->pos++;
    if (!(peek(p) >= '0' && peek(p) <= '9')) {
      return fail_at(p, "a digit after the decimal point");
    }
    while (peek(p) >= '0' && peek(p) <= '9') {
      p->pos++;
    }
  }
  if (peek(p) == 'e' || peek(p) == 'E') {
    integral = 0;
    p->pos++;
    if (peek(p) == '+' || peek(p) == '-') {
      p->pos++;
    }
    if (!(peek(p) >= '0' && peek(p) <= '9')) {
      return fail_at(p, "a digit in the exponent");
    }
    while (peek(p) >= '0' && peek(p) <= '9') {
      p->pos++;
    }
  }
  if (as_long && integral && p->pos - begin < 19) { // (the file's bytes end without a NUL)
    char digits[20];
    memcpy(digits, p->in->buf + begin, p->pos - begin);
    digits[p->pos - begin] = 0;
    *as_long = strtol(digits, NULL, 10);
  }
  return 0;
}

static int parse_value(struct parser *p, int depth, long *pid);

// An object; when pid is not NULL, the integer member "pid" (if any) is stored there.
static int parse_object(struct parser *p, int depth, long *pid) {
  if (expect(p, '{', "an object") != 0) {
    return -1;
  }
  skip_ws(p);
  if (peek(p) == '}') {
    p->pos++;
    return 0;
  }
  for (;;) {
    const char *key;
    size_t klen;
    if (parse_string(p, &key, &klen) != 0 || expect(p, ':', "':' after a member name") != 0) {
      return -1;
    }
    skip_ws(p);
    if (pid && klen == 3 && !memcmp(key, "pid", 3) && peek(p) != '"') {
      if (parse_number(p, pid) != 0) {
        return -1;
      }
    } else if (parse_value(p, depth + 1, NULL) != 0) {
      return -1;
    }
    skip_ws(p);
    if (peek(p) == ',') {
      p->pos++;
      continue;
    }
    return expect(p, '}', "',' or '}' in an object");
  }
}

static int parse_array(struct parser *p, int depth) {
  if (expect(p, '[', "an array") != 0) {
    return -1;
  }
  skip_ws(p);
  if (peek(p) == ']') {
    p->pos++;
    return 0;
  }
  for (;;) {
    if (parse_value(p, depth + 1, NULL) != 0) {
      return -1;
    }
    skip_ws(p);
    if (peek(p) == ',') {
      p->pos++;
      continue;
    }
    return expect(p, ']', "',' or ']' in an array");
  }
}

static int parse_literal(struct parser *p, const char *word) {
  size_t n = strlen(word);
  if (p->pos + n > p->in->len || memcmp(p->in->buf + p->pos, word, n) != 0) {
    return fail_at(p, "a value (object, array, string, number, true, false or null)");
  }
  p->pos += n;
  return 0;
}

static int parse_value(struct parser *p, int depth, long *pid) {
  if (depth > MAX_DEPTH) {
    return fail_at(p, "less nesting (deeper than 64 levels)");
  }
  skip_ws(p);
  switch (peek(p)) {
  case '{':
    return parse_object(p, depth, pid);
  case '[':
    return parse_array(p, depth);
  case '"':
    return parse_string(p, NULL, NULL);
  case 't':
    return parse_literal(p, "true");
  case 'f':
    return parse_literal(p, "false");
  case 'n':
    return parse_literal(p, "null");
  default:
    return parse_number(p, NULL);
  }
}

static int note_pid(struct input *in, long pid) {
  for (int i = 0; i < in->npids; i++) {
    if (in->pids[i] == pid) {
      return 0;
    }
  }
  if (in->npids == in->cpids) {
    int ncap = in->cpids ? 2 * in->cpids : 4;
    long *np = realloc(in->pids, (size_t)ncap * sizeof *np);
    if (!np) {
      return -1;
    }
    in->pids = np, in->cpids = ncap;
  }
  in->pids[in->npids++] = pid;
  return 0;
}

// The traceEvents array: remember each element's span and pid.
static int parse_events(struct parser *p) {
  struct input *in = p->in;
  if (expect(p, '[', "'[' opening the traceEvents array") != 0) {
    return -1;
  }
  skip_ws(p);
  if (peek(p) == ']') {
    p->pos++;
    return 0;
  }
  for (;;) {
    skip_ws(p);
    size_t begin = p->pos;
    long pid = -1;
    if (peek(p) != '{') {
      return fail_at(p, "an event object in traceEvents");
    }
    if (parse_value(p, 2, &pid) != 0) {
      return -1;
    }
    if (in->nev == in->cap) {
      int ncap = in->cap ? 2 * in->cap : 256;
      struct span *ns = realloc(in->ev, (size_t)ncap * sizeof *ns);
      if (!ns) {
        return fail_at(p, "less data (out of memory)");
      }
      in->ev = ns, in->cap = ncap;
    }
    in->ev[in->nev++] = (struct span){begin, p->pos};
    if (pid >= 0 && note_pid(in, pid) != 0) {
      return fail_at(p, "less data (out of memory)");
    }
    skip_ws(p);
    if (peek(p) == ',') {
      p->pos++;
      continue;
    }
    return expect(p, ']', "',' or ']' in traceEvents");
  }
}

// The whole file: {"traceEvents":[...], other members ignored}.
static int parse_trace(struct parser *p) {
  int found = 0;
  if (expect(p, '{', "'{' opening a Chrome trace object (loom writes {\"traceEvents\":[...]})") !=
      0) {
    return -1;
  }
  skip_ws(p);
  if (peek(p) != '}') {
    for (;;) {
      const char *key;
      size_t klen;
      if (parse_string(p, &key, &klen) != 0 || expect(p, ':', "':' after a member name") != 0) {
        return -1;
      }
      int is_events = klen == 11 && !memcmp(key, "traceEvents", 11);
      if (is_events && found) {
        return fail_at(p, "one traceEvents member only");
      }
      size_t begin = p->pos;
      if (is_events ? parse_events(p) != 0 : parse_value(p, 1, NULL) != 0) {
        return -1;
      }
      found |= is_events;
      if (klen == 9 && !memcmp(key, "otherData", 9) &&
          memmem(p->in->buf + begin, p->pos - begin, MERGE_MARK, sizeof MERGE_MARK - 1)) {
        p->in->merged = 1;
      }
      skip_ws(p);
      if (peek(p) == ',') {
        p->pos++;
        continue;
      }
      break;
    }
  }
  if (expect(p, '}', "',' or '}' closing the trace object") != 0) {
    return -1;
  }
  skip_ws(p);
  if (p->pos != p->in->len) {
    return fail_at(p, "the end of the file after the trace object");
  }
  if (!found) {
    p->pos = 0;
    return fail_at(p, "a traceEvents member (this is not a loom timeline)");
  }
  return 0;
}

// ---- files -----------------------------------------------------------------------------------

// Reads in->path whole; quiet: say nothing on failure (the existing output is only looked at).
static int read_file(struct input *in, int quiet) {
  uint64_t size = 0;
  int not_regular = 0;
  FILE *f = loom_fopen_regular(in->path, "rb", MAX_INPUT, &size, &not_regular);
  if (!f && !not_regular) {
    if (!quiet) {
      fprintf(stderr, "loom_timeline_merge: cannot open %s: %s\n", in->path, strerror(errno));
    }
    return -1;
  }
  if (!f) {
    if (!quiet) {
      fprintf(stderr,
              "loom_timeline_merge: %s is not a regular file of at most 2 GiB: pass the trace "
              "files that LOOM_TIMELINE wrote\n",
              in->path);
    }
    return -1;
  }
  in->buf = malloc(size ? (size_t)size : 1);
  in->len = in->buf ? fread(in->buf, 1, (size_t)size, f) : 0;
  int bad = ferror(f), err = errno;
  fclose(f);
  if (!in->buf || bad) {
    if (!quiet) {
      fprintf(stderr, "loom_timeline_merge: cannot read %s: %s\n", in->path,
              in->buf ? strerror(err) : "out of memory");
    }
    return -1;
  }
  return 0; // (a file cut short while read fails to parse, naming the offset)
}

// Written to PATH.tmp.PID and renamed over PATH at the end: a failed write leaves PATH as it was.
static int write_merged(const char *path, struct input *in, int n) {
  char tmp[4200];
  if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp) {
    fprintf(stderr, "loom_timeline_merge: the output path %.64s... is too long\n", path);
    return -1;
  }
  FILE *f = fopen(tmp, "w");
  if (!f) {
    fprintf(stderr, "loom_timeline_merge: cannot create %s: %s\n", tmp, strerror(errno));
    return -1;
  }
  fputs("{\"traceEvents\":[", f);
  int first = 1;
  for (int i = 0; i < n; i++) {
    for (int e = 0; e < in[i].nev; e++) {
      fputs(first ? "\n" : ",\n", f);
      fwrite(in[i].buf + in[i].ev[e].begin, 1, in[i].ev[e].end - in[i].ev[e].begin, f);
      first = 0;
    }
  }
  fprintf(f, "\n],\"otherData\":{%s:%d}}\n", MERGE_MARK, n);
  int bad = ferror(f);
  if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
    fprintf(stderr, "loom_timeline_merge: writing %s failed: %s\n", path, strerror(errno));
    remove(tmp);
    return -1;
  }
  return 0;
}

// 1 (and says so) when OUT is one of the inputs: the merge would overwrite a rank's trace.
static int out_is_input(const char *out, char **inputs, int n) {
  struct stat so, si;
  if (stat(out, &so) != 0) {
    return 0; // a new file
  }
  for (int i = 0; i < n; i++) {
    if (stat(inputs[i], &si) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino) {
      fprintf(stderr,
              "loom_timeline_merge: the output %s is also input %d (%s): the merge would "
              "overwrite that trace, -f or not; name a new output first: loom_timeline_merge "
              "merged.json IN0.json IN1.json ...\n",
              out, i, inputs[i]);
      return 1;
    }
  }
  return 0;
}

// 1 (and says so) when one file is named twice among the inputs (a repeated glob, or a path and
// a link to it): its events would be merged twice into one process.
static int input_repeated(char **inputs, int n) {
  struct stat *st = calloc((size_t)n, sizeof *st);
  int repeated = 0;
  if (!st) {
    return 0; // the merge itself will say it is out of memory
  }
  for (int i = 0; i < n && !repeated; i++) {
    if (stat(inputs[i], &st[i]) != 0) {
      st[i].st_ino = 0; // missing: read_file says so
      continue;
    }
    for (int j = 0; j < i && !repeated; j++) {
      if (st[j].st_ino != 0 && st[j].st_dev == st[i].st_dev && st[j].st_ino == st[i].st_ino) {
        fprintf(stderr,
                "loom_timeline_merge: inputs %d (%s) and %d (%s) are the same file: name each "
                "rank's trace once\n",
                j, inputs[j], i, inputs[i]);
        repeated = 1;
      }
    }
  }
  free(st);
  return repeated;
}

// 1 when the existing file OUT is one rank's trace rather than an earlier merge: a Chrome trace
// without this tool's mark whose events hold at most one pid. A glob over the traces
// (loom_timeline_merge trace.*.json) makes rank 0's trace the output: -f must not replace it.
static int out_is_rank_trace(const char *out) {
  struct input o = {.path = out};
  int rank = 0;
  if (read_file(&o, 1) == 0) {
    struct parser p = {&o, 0, NULL};
    rank = parse_trace(&p) == 0 && !o.merged && o.npids <= 1;
  }
  free(o.buf);
  free(o.ev);
  free(o.pids);
  return rank;
}

static void usage(FILE *out) {
  fprintf(out,
          "usage: loom_timeline_merge [-f] OUT.json IN0.json [IN1.json ...]\n"
          "Merges the per-rank Chrome traces written under LOOM_TIMELINE (one per rank, %%r in\n"
          "the path) into OUT.json for Perfetto or chrome://tracing; each rank is one process.\n"
          "OUT.json must not exist (-f replaces an earlier merge), and is never one of the\n"
          "inputs nor a rank's trace (trace.*.json alone would make rank 0's the output);\n"
          "each input is named once.\n");
}

int main(int argc, char **argv) {
  const int force = argc > 1 && (!strcmp(argv[1], "-f") || !strcmp(argv[1], "--force"));
  argc -= force;
  argv += force;
  if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
    usage(stdout);
    return 0;
  }
  if (argc < 3) {
    usage(stderr);
    return 2;
  }
  int n = argc - 2, rc = 1;
  long total = 0;
  if (argv[1][0] == '-') {
    fprintf(stderr,
            "loom_timeline_merge: unknown option %s (the only one is -f, before OUT.json)\n",
            argv[1]);
    return 2;
  }
  if (out_is_input(argv[1], argv + 2, n) || input_repeated(argv + 2, n)) {
    return 2;
  }
  if (access(argv[1], F_OK) == 0 && out_is_rank_trace(argv[1])) { // e.g. trace.*.json alone
    fprintf(stderr,
            "loom_timeline_merge: the output %s is a rank's trace, not an earlier merge: it is "
            "never replaced, -f or not (a glob such as trace.*.json alone makes the first trace "
            "the output); name a new output first: loom_timeline_merge merged.json %s %s%s\n",
            argv[1], argv[1], argv[2], n > 1 ? " ..." : "");
    return 2;
  }
  if (!force && access(argv[1], F_OK) == 0) { // an earlier merge, or not a trace at all
    fprintf(stderr,
            "loom_timeline_merge: %s exists: name a new output first (OUT.json IN0.json ...), "
            "or pass -f to replace it\n",
            argv[1]);
    return 2;
  }
  struct input *in = calloc((size_t)n, sizeof *in);
  if (!in) {
    fprintf(stderr, "loom_timeline_merge: out of memory\n");
    return 1;
  }
  for (int i = 0; i < n; i++) {
    in[i].path = argv[i + 2];
    if (read_file(&in[i], 0) != 0) {
      goto done;
    }
    struct parser p = {&in[i], 0, NULL};
    if (parse_trace(&p) != 0) {
      fprintf(stderr, "loom_timeline_merge: %s: malformed trace at byte offset %zu: expected %s\n",
              in[i].path, p.pos, p.err);
      goto done;
    }
    total += in[i].nev;
    for (int j = 0; j < i; j++) {
      for (int a = 0; a < in[i].npids; a++) {
        for (int b = 0; b < in[j].npids; b++) {
          if (in[i].pids[a] == in[j].pids[b]) {
            fprintf(stderr,
                    "loom_timeline_merge: warning: %s and %s both hold pid %ld (the same rank "
                    "twice?); their events share one process in the merged trace\n",
                    in[j].path, in[i].path, in[i].pids[a]);
          }
        }
      }
    }
  }
  if (write_merged(argv[1], in, n) != 0) {
    goto done;
  }
  printf("loom_timeline_merge: wrote %s: %ld events from %d file%s\n", argv[1], total, n,
         n == 1 ? "" : "s");
  rc = 0;
done:
  for (int i = 0; i < n; i++) {
    free(in[i].buf);
    free(in[i].ev);
    free(in[i].pids);
  }
  free(in);
  return rc;
}
