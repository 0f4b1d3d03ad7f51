/* varlen.c — padded <-> packed layouts for variable-length batches: cu_seqlens from lengths, pack
 * and unpack of any dtype (a row is everything after (B, T) or (total)), and the packed row map. */
#include "config.h"
#include "loom_compute.h"

#include <limits.h>
#include <string.h>

#include "args.h"
#include "cpu/attention_cpu.h"
#include "error.h"
#ifdef LOOM_HAVE_CUDA
#include "cuda/cuda_ctx.h"
#endif

// ---------------------------------------------------------------------------------------------

loom_status_t loom_varlen_offsets(loom_tensor_t *cu_seqlens, const loom_tensor_t *lengths,
                                  int max_len, int32_t *total) {
  static const char op[] = "loom_varlen_offsets";
  char s[LOOM_SHAPE_STR_MAX];
  loom_status_t status = loom_arg_backend(op, "cu_seqlens", cu_seqlens);
  if (status != LOOM_OK ||
      (status = loom_arg_tensor(op, "lengths", lengths, LOOM_I32, LOOM_DEVICE_HOST)) != LOOM_OK) {
    return status;
  }
  if (lengths->ndim != 1) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: lengths is %s, expected (B)", op,
                      loom_shape_str(lengths, s));
  }
  const int64_t B = lengths->shape[0];
  const int64_t want[1] = {B + 1};
  if ((status = loom_arg_shape(op, "cu_seqlens", cu_seqlens, LOOM_I32, LOOM_DEVICE_HOST, 1,
                               want)) != LOOM_OK) {
    return status;
  }
  const int32_t *len = lengths->data;
  int64_t sum = 0;
  for (int64_t b = 0; b < B; b++) {
    if (len[b] < 0) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: lengths[%lld]=%d is negative", op,
                        (long long)b, (int)len[b]);
    }
    if (max_len > 0 && len[b] > max_len) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: lengths[%lld]=%d > max_len=%d", op,
                        (long long)b, (int)len[b], max_len);
    }
    sum += len[b];
    if (sum > INT32_MAX) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: lengths[0..%lld] sum to %lld, more than an i32 offset holds", op,
                        (long long)b, (long long)sum);
    }
  }
  int32_t *cu = cu_seqlens->data;
  cu[0] = 0;
  for (int64_t b = 0; b < B; b++) {
    cu[b + 1] = cu[b] + len[b];
  }
  if (total) {
    *total = (int32_t)sum;
  }
  return LOOM_OK;
}

// ---------------------------------------------------------------------------------------------
// Pack and unpack: padded (B, T, ...) and packed (total, ...) of one dtype and trailing shape.

typedef struct varlen_layout {
  int64_t B, T;
  size_t row_bytes;
  int device;        // of packed and padded
  const int32_t *cu; // host-readable offsets
  int32_t *owned;    // the host copy of device offsets (loom_host_free), or NULL
} varlen_layout_t;

// Copy n bytes (memcpy on the host, a device-to-device copy on the current stream of a CUDA
// device), or zero them when src is NULL.
static loom_status_t copy_rows(int device, void *dst, const void *src, size_t n) {
#ifdef LOOM_HAVE_CUDA
  if (device != LOOM_DEVICE_HOST) {
    return src ? loom_cuda_copy(dst, src, n) : loom_cuda_zero(dst, n);
  }
#else
  (void)device;
#endif
  if (src) {
    memcpy(dst, src, n);
  } else {
    memset(dst, 0, n);
  }
  return LOOM_OK;
}

// The checks of pack (to_padded 0: packed is the output) and unpack (to_padded 1).
static loom_status_t check_layout(const char *op, const loom_tensor_t *packed,
                                  const loom_tensor_t *padded, const loom_tensor_t *cu_seqlens,
                                  int to_padded, varlen_layout_t *lay) {
  char s[LOOM_SHAPE_STR_MAX], s2[LOOM_SHAPE_STR_MAX];
  const int dev = lay->device;
  if (!padded) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: padded is NULL", op);
  }
  if (loom_dtype_size(padded->dtype) == 0) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: padded has an invalid dtype (%d)", op,
                      (int)padded->dtype);
  }
  loom_status_t status = loom_arg_tensor(op, "padded", padded, padded->dtype, dev);
  if (status != LOOM_OK ||
      (status = loom_arg_tensor(op, "packed", packed, padded->dtype, dev)) != LOOM_OK ||
      (status = loom_arg_tensor(op, "cu_seqlens", cu_seqlens, LOOM_I32, dev)) != LOOM_OK) {
    return status;
  }
  if (padded->ndim < 2) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: padded is %s, expected (B, T, ...)", op,
                      loom_shape_str(padded, s));
  }
  int same = packed->ndim == padded->ndim - 1 && packed->ndim >= 1;
  size_t row = loom_dtype_size(padded->dtype);
  for (int i = 2; i < padded->ndim; i++) {
    same = same && packed->shape[i - 1] == padded->shape[i];
    row *= (size_t)padded->shape[i];
  }
  if (!same) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: packed is %s and padded is %s: expected packed (total, ...) and padded "
                      "(B, T, ...) with the same trailing dimensions",
                      op, loom_shape_str(packed, s), loom_shape_str(padded, s2));
  }
  if (cu_seqlens->ndim != 1 || cu_seqlens->shape[0] != padded->shape[0] + 1) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: cu_seqlens is %s, expected (%lld): B + 1 for padded %s", op,
                      loom_shape_str(cu_seqlens, s), (long long)(padded->shape[0] + 1),
                      loom_shape_str(padded, s2));
  }
  // The rows are copied with memcpy (or a device copy), which overlapping memory breaks: no
  // packing in place.
  const loom_tensor_t *out = to_padded ? padded : packed, *in = to_padded ? packed : padded;
  const char *out_name = to_padded ? "padded" : "packed",
             *in_name = to_padded ? "packed" : "padded";
  if ((status = loom_arg_disjoint(op, out_name, out, in_name, in, 0)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, out_name, out, "cu_seqlens", cu_seqlens, 0)) != LOOM_OK) {
    return status;
  }
  lay->B = padded->shape[0];
  lay->T = padded->shape[1];
  lay->row_bytes = row;
  if ((status = loom_arg_i32_view(op, "cu_seqlens", cu_seqlens, &lay->cu, &lay->owned)) !=
      LOOM_OK) {
    return status;
  }
  status =
      loom_cpu_varlen_check(op, "cu_seqlens", lay->cu, lay->B, packed->shape[0], "packed", lay->T);
  if (status != LOOM_OK) {
    loom_host_free(lay->owned);
    lay->owned = NULL;
  }
  return status;
}

loom_status_t loom_varlen_pack(loom_tensor_t *packed, const loom_tensor_t *padded,
                               const loom_tensor_t *cu_seqlens) {
  static const char op[] = "loom_varlen_pack";
  varlen_layout_t lay = {0};
  loom_status_t status = loom_arg_backend(op, "packed", packed);
  if (status != LOOM_OK) {
    return status;
  }
  lay.device = packed->device;
  if ((status = check_layout(op, packed, padded, cu_seqlens, 0, &lay)) != LOOM_OK) {
    return status;
  }
  char *dst = packed->data;
  const char *src = padded->data;
  for (int64_t b = 0; b < lay.B && status == LOOM_OK; b++) {
    const size_t n = (size_t)(lay.cu[b + 1] - lay.cu[b]) * lay.row_bytes;
    if (n > 0) {
      status = copy_rows(lay.device, dst + (size_t)lay.cu[b] * lay.row_bytes,
                         src + (size_t)(b * lay.T) * lay.row_bytes, n);
    }
  }
  loom_host_free(lay.owned);
  return status;
}

loom_status_t loom_varlen_unpack(loom_tensor_t *padded, const loom_tensor_t *packed,
                                 const loom_tensor_t *cu_seqlens) {
  static const char op[] = "loom_varlen_unpack";
  varlen_layout_t lay = {0};
  loom_status_t status = loom_arg_backend(op, "padded", padded);
  if (status != LOOM_OK) {
    return status;
  }
  lay.device = padded->device;
  if ((status = check_layout(op, packed, padded, cu_seqlens, 1, &lay)) != LOOM_OK) {
    return status;
  }
  char *dst = padded->data;
  const char *src = packed->data;
  for (int64_t b = 0; b < lay.B && status == LOOM_OK; b++) {
    const size_t len = (size_t)(lay.cu[b + 1] - lay.cu[b]);
    char *row0 = dst + (size_t)(b * lay.T) * lay.row_bytes;
    if (len > 0) {
      status =
          copy_rows(lay.device, row0, src + (size_t)lay.cu[b] * lay.row_bytes, len * lay.row_bytes);
    }
    if (status == LOOM_OK && (size_t)lay.T > len) {
      status = copy_rows(lay.device, row0 + len * lay.row_bytes, NULL,
                         ((size_t)lay.T - len) * lay.row_bytes);
    }
  }
  loom_host_free(lay.owned);
  return status;
}

// ---------------------------------------------------------------------------------------------

loom_status_t loom_varlen_row_map(loom_tensor_t *row_map, const loom_tensor_t *cu_seqlens, int T) {
  static const char op[] = "loom_varlen_row_map";
  char s[LOOM_SHAPE_STR_MAX];
  loom_status_t status = loom_arg_backend(op, "row_map", row_map);
  if (status != LOOM_OK ||
      (status = loom_arg_tensor(op, "row_map", row_map, LOOM_I32, LOOM_DEVICE_HOST)) != LOOM_OK ||
      (status = loom_arg_tensor(op, "cu_seqlens", cu_seqlens, LOOM_I32, LOOM_DEVICE_HOST)) !=
          LOOM_OK) {
    return status;
  }
  if (cu_seqlens->ndim != 1 || cu_seqlens->shape[0] < 1) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: cu_seqlens is %s, expected (B + 1)", op,
                      loom_shape_str(cu_seqlens, s));
  }
  const int64_t B = cu_seqlens->shape[0] - 1;
  if (T < 0 || B * (int64_t)T > INT32_MAX) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: T=%d with B=%lld: padded row indices b * T + t must fit in i32 and T "
                      "must be >= 0",
                      op, T, (long long)B);
  }
  if (row_map->ndim != 1) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: row_map is %s, expected (total)", op,
                      loom_shape_str(row_map, s));
  }
  const int32_t *cu = cu_seqlens->data;
  if ((status = loom_cpu_varlen_check(op, "cu_seqlens", cu, B, row_map->shape[0], "row_map", T)) !=
      LOOM_OK) {
    return status;
  }
  int32_t *map = row_map->data;
  for (int64_t b = 0; b < B; b++) {
    for (int32_t i = cu[b]; i < cu[b + 1]; i++) {
      map[i] = (int32_t)(b * T) + (i - cu[b]);
    }
  }
  return LOOM_OK;
}
