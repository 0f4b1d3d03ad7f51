/* embedding.c — loom_embedding_forward/backward and loom_residual_forward/backward: check shapes,
 * dtypes and every id's range before anything is written, then run the CPU kernels. */
#include "config.h"
#include "loom_compute.h"

#include "args.h"
#include "cpu/embedding_cpu.h"
#include "error.h"
#ifdef LOOM_HAVE_CUDA
#include "cuda/cuda_kernels.h"
#endif

// ---------------------------------------------------------------------------------------------
// Argument checks shared by the embedding forward and backward.

// table (V, C) f32 (exactly two dimensions), ids i32 (N elements, any shape) each in 0..V-1, and
// rows (N, C) f32 (a leading batch may be flattened). *n, *c receive N and C.
static loom_status_t check_embedding(const char *op, int device, const char *table_name,
                                     const loom_tensor_t *table, const loom_tensor_t *ids,
                                     const char *rows_name, const loom_tensor_t *rows, int64_t *n,
                                     int64_t *c) {
  char s1[LOOM_SHAPE_STR_MAX], s2[LOOM_SHAPE_STR_MAX], s3[LOOM_SHAPE_STR_MAX];
  int64_t vocab = 0, rn = 0, rc = 0;
  loom_status_t status = loom_arg_matrix(op, table_name, table, LOOM_F32, device, &vocab, c);
  if (status != LOOM_OK) {
    return status;
  }
  if (table->ndim != 2) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: %s is %s, expected (V, C): two dimensions",
                      op, table_name, loom_shape_str(table, s1));
  }
  status = loom_arg_tensor(op, "ids", ids, LOOM_I32, device);
  if (status != LOOM_OK) {
    return status;
  }
  *n = loom_tensor_numel(ids);
  status = loom_arg_matrix(op, rows_name, rows, LOOM_F32, device, &rn, &rc);
  if (status != LOOM_OK) {
    return status;
  }
  if (rn != *n || rc != *c) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: %s is %s, expected (%lld, %lld): one row of C per id, with ids %s and "
                      "%s %s",
                      op, rows_name, loom_shape_str(rows, s1), (long long)*n, (long long)*c,
                      loom_shape_str(ids, s2), table_name, loom_shape_str(table, s3));
  }
  const int32_t *id = NULL;
  int32_t *owned = NULL; // the host copy of device ids
  if ((status = loom_arg_i32_view(op, "ids", ids, &id, &owned)) != LOOM_OK) {
    return status;
  }
  for (int64_t i = 0; i < *n; i++) {
    if (id[i] < 0 || (int64_t)id[i] >= vocab) {
      status = loom_error(NULL, LOOM_ERR_INVALID_ARG,
                          "%s: ids[%lld] = %d is outside 0..%lld (%s %s has V = %lld rows)", op,
                          (long long)i, (int)id[i], (long long)vocab - 1, table_name,
                          loom_shape_str(table, s1), (long long)vocab);
      break;
    }
  }
  loom_host_free(owned);
  return status;
}

// ---------------------------------------------------------------------------------------------
// Embedding

loom_status_t loom_embedding_forward(loom_tensor_t *out, const loom_tensor_t *ids,
                                     const loom_tensor_t *table) {
  static const char op[] = "loom_embedding_forward";
  int64_t n = 0, c = 0;
  loom_status_t status = loom_arg_backend(op, "out", out);
  if (status != LOOM_OK) {
    return status;
  }
  status = check_embedding(op, out->device, "table", table, ids, "out", out, &n, &c);
  if (status == LOOM_OK) { // rows are copied with memcpy: out in table's memory would overlap
    status = loom_arg_disjoint(op, "out", out, "table", table, 0);
  }
  if (status == LOOM_OK) {
    status = loom_arg_disjoint(op, "out", out, "ids", ids, 0);
  }
  if (status != LOOM_OK) {
    return status;
  }
#ifdef LOOM_HAVE_CUDA
  if (out->device != LOOM_DEVICE_HOST) {
    return loom_cuda_embedding_forward(n, c, out->data, ids->data, table->data);
  }
#endif
  loom_cpu_embedding_forward(n, c, out->data, ids->data, table->data);
  return LOOM_OK;
}

loom_status_t loom_embedding_backward(loom_tensor_t *dtable, const loom_tensor_t *ids,
                                      const loom_tensor_t *dout) {
  static const char op[] = "loom_embedding_backward";
  int64_t n = 0, c = 0;
  loom_status_t status = loom_arg_backend(op, "dtable", dtable);
  if (status != LOOM_OK) {
    return status;
  }
  status = check_embedding(op, dtable->device, "dtable", dtable, ids, "dout", dout, &n, &c);
  if (status == LOOM_OK) {
    status = loom_arg_disjoint(op, "dtable", dtable, "dout", dout, 0);
  }
  if (status == LOOM_OK) {
    status = loom_arg_disjoint(op, "dtable", dtable, "ids", ids, 0);
  }
  if (status != LOOM_OK) {
    return status;
  }
#ifdef LOOM_HAVE_CUDA
  if (dtable->device != LOOM_DEVICE_HOST) {
    return loom_cuda_embedding_backward(n, c, dtable->data, ids->data, dout->data);
  }
#endif
  loom_cpu_embedding_backward(n, c, dtable->data, ids->data, dout->data);
  return LOOM_OK;
}

// ---------------------------------------------------------------------------------------------
// Residual

loom_status_t loom_residual_forward(loom_tensor_t *out, const loom_tensor_t *a,
                                    const loom_tensor_t *b) {
  static const char op[] = "loom_residual_forward";
  loom_status_t status = loom_arg_backend(op, "out", out);
  if (status != LOOM_OK) {
    return status;
  }
  status = loom_arg_tensor(op, "out", out, LOOM_F32, out->device);
  if (status != LOOM_OK) {
    return status;
  }
  status = loom_arg_shape(op, "a", a, LOOM_F32, out->device, out->ndim, out->shape);
  if (status != LOOM_OK) {
    return status;
  }
  status = loom_arg_shape(op, "b", b, LOOM_F32, out->device, out->ndim, out->shape);
  if (status != LOOM_OK) {
    return status;
  }
  // In place is a or b itself: out ahead of an input in the same buffer would overwrite elements
  // before they are read.
  if ((status = loom_arg_disjoint(op, "out", out, "a", a, 1)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "out", out, "b", b, 1)) != LOOM_OK) {
    return status;
  }
#ifdef LOOM_HAVE_CUDA
  if (out->device != LOOM_DEVICE_HOST) {
    return loom_cuda_residual_forward(loom_tensor_numel(out), out->data, a->data, b->data);
  }
#endif
  loom_cpu_residual_forward(loom_tensor_numel(out), out->data, a->data, b->data);
  return LOOM_OK;
}

loom_status_t loom_residual_backward(loom_tensor_t *da, loom_tensor_t *db,
                                     const loom_tensor_t *dout) {
  static const char op[] = "loom_residual_backward";
  // da and db may be NULL: the first tensor present picks the backend.
  const loom_tensor_t *first = da ? da : db ? db : dout;
  loom_status_t status = loom_arg_backend(op, da ? "da" : db ? "db" : "dout", first);
  if (status != LOOM_OK) {
    return status;
  }
  status = loom_arg_tensor(op, "dout", dout, LOOM_F32, first->device);
  if (status != LOOM_OK) {
    return status;
  }
  if (da) {
    status = loom_arg_shape(op, "da", da, LOOM_F32, first->device, dout->ndim, dout->shape);
    if (status != LOOM_OK) {
      return status;
    }
  }
  if (db) {
    status = loom_arg_shape(op, "db", db, LOOM_F32, first->device, dout->ndim, dout->shape);
    if (status != LOOM_OK) {
      return status;
    }
  }
  int64_t n = loom_tensor_numel(dout);
  if ((status = loom_arg_disjoint(op, "da", da, "dout", dout, 0)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "db", db, "dout", dout, 0)) != LOOM_OK) {
    return status;
  }
#ifdef LOOM_HAVE_CUDA
  if (first->device != LOOM_DEVICE_HOST) {
    if (da && (status = loom_cuda_accumulate(n, da->data, dout->data)) != LOOM_OK) {
      return status;
    }
    return db ? loom_cuda_accumulate(n, db->data, dout->data) : LOOM_OK;
  }
#endif
  if (da) {
    loom_cpu_accumulate(n, da->data, dout->data);
  }
  if (db) {
    loom_cpu_accumulate(n, db->data, dout->data);
  }
  return LOOM_OK;
}
