/* ckpt_edit.c — the resume tests' tool for damaged-but-valid checkpoints: rewrites one file with
 * an entry dropped or every element of one entry set to a value (the CRCs stay correct). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom.h"
#include "loom_checkpoint.h"

static int usage(void) {
  fprintf(stderr, "usage: ckpt_edit IN OUT drop NAME | ckpt_edit IN OUT fill NAME VALUE\n"
                  "  drop: OUT is IN without entry NAME; fill: every element of NAME (i32 or "
                  "f32) set to VALUE\n");
  return 2;
}

int main(int argc, char **argv) {
  const int drop = argc == 5 && !strcmp(argv[3], "drop");
  const int fill = argc == 6 && !strcmp(argv[3], "fill");
  if (!drop && !fill) {
    return usage();
  }
  const char *name = argv[4];
  char *end = NULL;
  const double value = fill ? strtod(argv[5], &end) : 0.0;
  if (fill && (end == argv[5] || *end)) {
    fprintf(stderr, "ckpt_edit: VALUE '%s' is not a number\n", argv[5]);
    return 2;
  }
  loom_checkpoint_t *ck = NULL;
  if (loom_checkpoint_open(argv[1], &ck) != LOOM_OK) {
    fprintf(stderr, "ckpt_edit: %s\n", loom_last_error(NULL));
    return 1;
  }
  loom_ckpt_info_t info;
  loom_checkpoint_info(ck, &info);
  const int n = loom_checkpoint_count(ck);
  loom_tensor_t *t = calloc((size_t)n + 1, sizeof *t);
  const loom_tensor_t **p = calloc((size_t)n + 1, sizeof *p);
  void *filled = NULL;
  int m = 0, found = 0, rc = 1;
  for (int i = 0; t && p && i < n; i++) {
    if (loom_checkpoint_entry(ck, i, &t[m]) != LOOM_OK) {
      fprintf(stderr, "ckpt_edit: %s\n", loom_last_error(NULL));
      goto done;
    }
    if (strcmp(t[m].name, name) != 0) {
      p[m] = &t[m];
      m++;
      continue;
    }
    found = 1;
    if (drop) {
      continue;
    }
    if (t[m].dtype != LOOM_I32 && t[m].dtype != LOOM_F32) {
      fprintf(stderr, "ckpt_edit: %s is neither i32 nor f32\n", name);
      goto done;
    }
    const int64_t count = loom_tensor_numel(&t[m]);
    filled = malloc((size_t)loom_tensor_bytes(&t[m]) + 1);
    if (!filled) {
      fprintf(stderr, "ckpt_edit: out of memory\n");
      goto done;
    }
    for (int64_t k = 0; k < count; k++) {
      if (t[m].dtype == LOOM_I32) {
        ((int32_t *)filled)[k] = (int32_t)value;
      } else {
        ((float *)filled)[k] = (float)value;
      }
    }
    t[m].data = filled;
    p[m] = &t[m];
    m++;
  }
  if (!t || !p) {
    fprintf(stderr, "ckpt_edit: out of memory\n");
  } else if (!found) {
    fprintf(stderr, "ckpt_edit: %s has no entry '%s'\n", argv[1], name);
  } else if (loom_checkpoint_save(argv[2], &info, p, m) != LOOM_OK) {
    fprintf(stderr, "ckpt_edit: %s\n", loom_last_error(NULL));
  } else {
    rc = 0;
  }
done:
  free(filled);
  free(t);
  free(p);
  loom_checkpoint_close(ck);
  return rc;
}
