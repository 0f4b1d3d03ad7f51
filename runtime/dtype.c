/* dtype.c — element types: size in bytes, canonical name, and parsing of names and their common
 * aliases ("fp16", "bfloat16", "int8", ...) as users write them in flags and config files. */
#include "config.h"
#include "loom_tensor.h"

#include <stddef.h>

#include "error.h"

static const struct {
  size_t size;
  const char *name;
} dtype_info[LOOM_DTYPE_COUNT] = {
    [LOOM_F32] = {4, "f32"}, [LOOM_F16] = {2, "f16"}, [LOOM_BF16] = {2, "bf16"},
    [LOOM_I8] = {1, "i8"},   [LOOM_U8] = {1, "u8"},   [LOOM_I32] = {4, "i32"},
    [LOOM_I64] = {8, "i64"},
};

// Accepted spellings besides the canonical names.
static const struct {
  const char *alias;
  loom_dtype_t dtype;
} dtype_aliases[] = {
    {"float32", LOOM_F32}, {"fp32", LOOM_F32},      {"float16", LOOM_F16}, {"fp16", LOOM_F16},
    {"half", LOOM_F16},    {"bfloat16", LOOM_BF16}, {"int8", LOOM_I8},     {"uint8", LOOM_U8},
    {"int32", LOOM_I32},   {"int64", LOOM_I64},
};

size_t loom_dtype_size(loom_dtype_t dtype) {
  if ((unsigned)dtype >= (unsigned)LOOM_DTYPE_COUNT) {
    return 0;
  }
  return dtype_info[dtype].size;
}

const char *loom_dtype_name(loom_dtype_t dtype) {
  if ((unsigned)dtype >= (unsigned)LOOM_DTYPE_COUNT) {
    return "invalid";
  }
  return dtype_info[dtype].name;
}

// ASCII case-insensitive equality (locale-independent, unlike strcasecmp).
static int name_equal(const char *a, const char *b) {
  for (;; a++, b++) {
    char ca = *a >= 'A' && *a <= 'Z' ? (char)(*a - 'A' + 'a') : *a;
    char cb = *b >= 'A' && *b <= 'Z' ? (char)(*b - 'A' + 'a') : *b;
    if (ca != cb) {
      return 0;
    }
    if (ca == '\0') {
      return 1;
    }
  }
}

loom_status_t loom_dtype_from_name(const char *name, loom_dtype_t *dtype) {
  if (dtype == NULL) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_dtype_from_name: dtype is NULL");
  }
  if (name == NULL) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "dtype name is NULL: use one of f32, f16, bf16, i8, u8, i32, i64");
  }
  for (int i = 0; i < LOOM_DTYPE_COUNT; i++) {
    if (name_equal(name, dtype_info[i].name)) {
      *dtype = (loom_dtype_t)i;
      return LOOM_OK;
    }
  }
  for (size_t i = 0; i < sizeof dtype_aliases / sizeof dtype_aliases[0]; i++) {
    if (name_equal(name, dtype_aliases[i].alias)) {
      *dtype = dtype_aliases[i].dtype;
      return LOOM_OK;
    }
  }
  return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                    "unknown dtype '%s': use one of f32, f16, bf16, i8, u8, i32, i64", name);
}
