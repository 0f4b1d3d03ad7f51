/* fill.c — loom_tensor_fill: convert a double to the tensor dtype's bit pattern once, then write
 * it to every element, with a plain loop on the host or the CUDA kernel on a device. */
#include "config.h"
#include "fill.h"

#include <inttypes.h>
#include <string.h>

#include "error.h"
#include "loom_tensor.h"
#include "memory.h"

// ---------------------------------------------------------------------------------------------
// Value conversion.

// Round v to f32 toward zero and set the last bit if that was inexact ("round to odd"). Rounding
// the result to f16 or bf16 to nearest even then gives exactly v rounded to nearest even: an f32
// keeps at least two more bits than either (24 >= 2 * 11 + 2), so an inexact result can never
// land on a tie point of the narrower type. A plain (float) cast would round twice and can miss
// (1 + 2^-11 + 2^-40 would become the tie 1 + 2^-11 and then 1.0 in f16 instead of 1 + 2^-10).
static float round_to_odd_f32(double v) {
  float f = (float)v;
  if (v != v || (double)f == v) {
    return f; // NaN, or exact (Inf and 0 included)
  }
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if (v > 0 ? (double)f > v : (double)f < v) {
    u--; // the cast rounded away from zero (possibly to Inf): step back to the truncation
  }
  u |= 1u;
  memcpy(&f, &u, sizeof f);
  return f;
}

// Round half away from zero (as lround does: 2.5 -> 3, -2.5 -> -3), then saturate to [lo, hi];
// NaN gives 0. The fractional part v - trunc(v) is exact, so there is no double-rounding.
static int64_t round_saturate(double v, int64_t lo, int64_t hi) {
  if (v != v) {
    return 0;
  }
  if (v >= 9223372036854775808.0) { // 2^63 and above, +Inf
    return hi;
  }
  if (v < -9223372036854775808.0) { // below -2^63, -Inf
    return lo;
  }
  int64_t i = (int64_t)v;      // truncation toward zero; exact in this range
  double frac = v - (double)i; // nonzero only when |v| < 2^52, so i +- 1 cannot overflow
  if (frac >= 0.5) {
    i++;
  } else if (frac <= -0.5) {
    i--;
  }
  return i < lo ? lo : i > hi ? hi : i;
}

// The element bit pattern for value in dtype, in the low loom_dtype_size(dtype) bytes.
static uint64_t fill_pattern(loom_dtype_t dtype, double value) {
  switch (dtype) {
  case LOOM_F32: {
    float f = (float)value; // round to nearest even (overflow gives Inf under IEEE arithmetic)
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
  }
  case LOOM_F16:
    return loom_f32_to_f16(round_to_odd_f32(value));
  case LOOM_BF16:
    return loom_f32_to_bf16(round_to_odd_f32(value));
  case LOOM_I8:
    return (uint8_t)(int8_t)round_saturate(value, INT8_MIN, INT8_MAX);
  case LOOM_U8:
    return (uint8_t)round_saturate(value, 0, UINT8_MAX);
  case LOOM_I32:
    return (uint32_t)(int32_t)round_saturate(value, INT32_MIN, INT32_MAX);
  case LOOM_I64:
    return (uint64_t)round_saturate(value, INT64_MIN, INT64_MAX);
  default:
    return 0;
  }
}

// ---------------------------------------------------------------------------------------------
// Host fill, one loop per element width.

static void host_fill(void *data, size_t n, size_t elem_size, uint64_t pattern) {
  switch (elem_size) {
  case 1:
    memset(data, (int)(uint8_t)pattern, n);
    break;
  case 2: {
    uint16_t *p = data; // (n,)
    uint16_t v = (uint16_t)pattern;
    for (size_t i = 0; i < n; i++) {
      p[i] = v;
    }
    break;
  }
  case 4: {
    uint32_t *p = data; // (n,)
    uint32_t v = (uint32_t)pattern;
    for (size_t i = 0; i < n; i++) {
      p[i] = v;
    }
    break;
  }
  default: {
    uint64_t *p = data; // (n,)
    for (size_t i = 0; i < n; i++) {
      p[i] = pattern;
    }
    break;
  }
  }
}

// ---------------------------------------------------------------------------------------------

loom_status_t loom_tensor_fill(loom_tensor_t *t, double value) {
  loom_status_t status = LOOM_OK;
  if (t == NULL) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_tensor_fill: tensor is NULL");
  }
  size_t elem_size = loom_dtype_size(t->dtype);
  if (elem_size == 0) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_tensor_fill: tensor '%.*s' has invalid dtype %d: use one of f32, f16, "
                      "bf16, i8, u8, i32, i64",
                      LOOM_NAME_MAX - 1, t->name, (int)t->dtype);
  }
  if (t->ndim < 0 || t->ndim > LOOM_MAX_DIMS) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_tensor_fill: tensor '%.*s' has ndim %d: use 0..%d", LOOM_NAME_MAX - 1,
                      t->name, t->ndim, LOOM_MAX_DIMS);
  }
  int empty = 0;
  for (int i = 0; i < t->ndim; i++) {
    if (t->shape[i] < 0) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "loom_tensor_fill: tensor '%.*s' has negative extent shape[%d] = %" PRId64
                        ": extents must be >= 0",
                        LOOM_NAME_MAX - 1, t->name, i, t->shape[i]);
    }
    empty |= t->shape[i] == 0;
  }
  LOOM_CHECK(loom_device_check(t->device));
  int64_t numel = loom_tensor_numel(t);
  // No zero extent and no elements: the product of the extents overflowed.
  if ((numel == 0 && !empty) || (uint64_t)numel > SIZE_MAX / elem_size) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_tensor_fill: tensor '%.*s' has more elements than fit in memory (the "
                      "product of its extents overflows)",
                      LOOM_NAME_MAX - 1, t->name);
  }
  if (numel == 0) {
    return LOOM_OK;
  }
  if (t->data == NULL) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_tensor_fill: tensor '%.*s' has %" PRId64 " elements but data is NULL",
                      LOOM_NAME_MAX - 1, t->name, numel);
  }
  if ((uintptr_t)t->data % elem_size != 0) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_tensor_fill: tensor '%.*s' data %p is not aligned to its %zu-byte "
                      "elements",
                      LOOM_NAME_MAX - 1, t->name, t->data, elem_size);
  }
  uint64_t pattern = fill_pattern(t->dtype, value);
  if (t->device == LOOM_DEVICE_HOST) {
    host_fill(t->data, (size_t)numel, elem_size, pattern);
    return LOOM_OK;
  }
#ifdef LOOM_HAVE_CUDA
  LOOM_CHECK(loom_cuda_fill_pattern(t->device, t->data, (size_t)numel, elem_size, pattern));
  return LOOM_OK;
#else
  // loom_device_check already refused every device index in a build without CUDA.
  return loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                    "tensor on CUDA device %d requested but loom was built without CUDA: "
                    "reconfigure with --with-cuda",
                    t->device);
#endif

fail:
  return status;
}
