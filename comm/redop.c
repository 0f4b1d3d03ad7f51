/* redop.c — loom dtypes and reduction ops in MPI terms: the datatype map, the predefined ops,
 * the user-defined f16/bf16 MAX/MIN ops (created once), and the host reduction kernels. */
#include "config.h"
#include "comm_internal.h"

#include <math.h>
#include <pthread.h>

#include "error.h"

// ---- dtypes -------------------------------------------------------------------------------------

MPI_Datatype loom_mpi_datatype(loom_dtype_t dtype) {
  switch (dtype) {
  case LOOM_F32:
    return MPI_FLOAT;
  case LOOM_F16:
  case LOOM_BF16:
    return MPI_UINT16_T; // the bits travel; arithmetic goes through f32
  case LOOM_I8:
    return MPI_INT8_T;
  case LOOM_U8:
    return MPI_UINT8_T;
  case LOOM_I32:
    return MPI_INT32_T;
  case LOOM_I64:
    return MPI_INT64_T;
  default:
    return MPI_DATATYPE_NULL;
  }
}

int loom_dtype_is_float(loom_dtype_t dtype) {
  return dtype == LOOM_F32 || dtype == LOOM_F16 || dtype == LOOM_BF16;
}

const char *loom_redop_name(loom_redop_t op) {
  static const char *const names[LOOM_REDOP_COUNT] = {"sum", "avg", "max", "min"};
  return (int)op >= 0 && op < LOOM_REDOP_COUNT ? names[op] : "invalid";
}

// ---- reduction kernels --------------------------------------------------------------------------

// Integers: SUM wraps (computed in the unsigned type), MAX/MIN compare.
#define INT_KERNEL(T, UT)                                                                          \
  do {                                                                                             \
    T *a = acc;                                                                                    \
    const T *b = x;                                                                                \
    if (op == LOOM_MAX) {                                                                          \
      for (int64_t i = 0; i < n; i++)                                                              \
        a[i] = b[i] > a[i] ? b[i] : a[i];                                                          \
    } else if (op == LOOM_MIN) {                                                                   \
      for (int64_t i = 0; i < n; i++)                                                              \
        a[i] = b[i] < a[i] ? b[i] : a[i];                                                          \
    } else {                                                                                       \
      for (int64_t i = 0; i < n; i++)                                                              \
        a[i] = (T)((UT)a[i] + (UT)b[i]);                                                           \
    }                                                                                              \
  } while (0)

// f16/bf16 through f32: MAX/MIN keep the winning operand's bits (NaN wins); SUM rounds once per
// call.
static void half_kernel(loom_redop_t op, uint16_t *a, const uint16_t *b, int64_t n,
                        float (*to32)(uint16_t), uint16_t (*from32)(float)) {
  for (int64_t i = 0; i < n; i++) {
    float fa = to32(a[i]), fb = to32(b[i]);
    if (op == LOOM_MAX) {
      a[i] = isnan(fb) || fb > fa ? b[i] : a[i];
    } else if (op == LOOM_MIN) {
      a[i] = isnan(fb) || fb < fa ? b[i] : a[i];
    } else {
      a[i] = from32(fa + fb);
    }
  }
}

void loom_reduce_into(loom_dtype_t dtype, loom_redop_t op, void *acc, const void *x, int64_t n) {
  switch (dtype) {
  case LOOM_F32: {
    float *a = acc;
    const float *b = x;
    if (op == LOOM_MAX) {
      for (int64_t i = 0; i < n; i++) {
        a[i] = isnan(b[i]) || b[i] > a[i] ? b[i] : a[i];
      }
    } else if (op == LOOM_MIN) {
      for (int64_t i = 0; i < n; i++) {
        a[i] = isnan(b[i]) || b[i] < a[i] ? b[i] : a[i];
      }
    } else {
      for (int64_t i = 0; i < n; i++) {
        a[i] += b[i];
      }
    }
    break;
  }
  case LOOM_F16:
    half_kernel(op, acc, x, n, loom_f16_to_f32, loom_f32_to_f16);
    break;
  case LOOM_BF16:
    half_kernel(op, acc, x, n, loom_bf16_to_f32, loom_f32_to_bf16);
    break;
  case LOOM_I8:
    INT_KERNEL(int8_t, uint8_t);
    break;
  case LOOM_U8:
    INT_KERNEL(uint8_t, uint8_t);
    break;
  case LOOM_I32:
    INT_KERNEL(int32_t, uint32_t);
    break;
  case LOOM_I64:
    INT_KERNEL(int64_t, uint64_t);
    break;
  default:
    break;
  }
}

// ---- user-defined MPI ops ---------------------------------------------------------------------

// MPI's own ops are not used where they would differ from loom_reduce_into, which the reduce-
// scatter and fusion paths use, so that every path gives the same bits: f16/bf16 (no MPI type),
// f32 MAX/MIN (MPI's may drop a NaN, depending on which rank holds it) and int8/uint8 SUM (Open
// MPI's AVX module saturates long buffers where a short one wraps). MPI calls these with
// inout = in op inout over len elements.
#define USER_OP(fn, dtype, op)                                                                     \
  static void fn(void *in, void *inout, int *len, MPI_Datatype *dt) {                              \
    (void)dt;                                                                                      \
    loom_reduce_into(dtype, op, inout, in, *len);                                                  \
  }
USER_OP(f16_max, LOOM_F16, LOOM_MAX)
USER_OP(f16_min, LOOM_F16, LOOM_MIN)
USER_OP(bf16_max, LOOM_BF16, LOOM_MAX)
USER_OP(bf16_min, LOOM_BF16, LOOM_MIN)
USER_OP(f32_max, LOOM_F32, LOOM_MAX)
USER_OP(f32_min, LOOM_F32, LOOM_MIN)
USER_OP(i8_sum, LOOM_I8, LOOM_SUM)
USER_OP(u8_sum, LOOM_U8, LOOM_SUM)
#undef USER_OP

static const struct user_op_desc {
  loom_dtype_t dtype;
  loom_redop_t op;
  MPI_User_function *fn;
} user_op_table[] = {
    {LOOM_F16, LOOM_MAX, f16_max},   {LOOM_F16, LOOM_MIN, f16_min}, {LOOM_BF16, LOOM_MAX, bf16_max},
    {LOOM_BF16, LOOM_MIN, bf16_min}, {LOOM_F32, LOOM_MAX, f32_max}, {LOOM_F32, LOOM_MIN, f32_min},
    {LOOM_I8, LOOM_SUM, i8_sum},     {LOOM_U8, LOOM_SUM, u8_sum},
};
enum { OP_COUNT = sizeof user_op_table / sizeof user_op_table[0] };
static MPI_Op user_ops[OP_COUNT];
static int user_ops_rc = MPI_SUCCESS;
static pthread_once_t user_ops_once = PTHREAD_ONCE_INIT;

// MPI_Finalize deletes MPI_COMM_SELF's attributes first: this frees the ops there.
static int free_user_ops(MPI_Comm comm, int keyval, void *value, void *extra) {
  (void)comm, (void)value, (void)extra;
  for (int i = 0; i < OP_COUNT; i++) {
    if (user_ops[i] != MPI_OP_NULL) {
      MPI_Op_free(&user_ops[i]);
    }
  }
  MPI_Comm_free_keyval(&keyval);
  return MPI_SUCCESS;
}

static void create_user_ops(void) {
  for (int i = 0; i < OP_COUNT; i++) {
    user_ops[i] = MPI_OP_NULL;
  }
  for (int i = 0; i < OP_COUNT && user_ops_rc == MPI_SUCCESS; i++) {
    user_ops_rc = MPI_Op_create(user_op_table[i].fn, 1, &user_ops[i]);
  }
  int keyval = MPI_KEYVAL_INVALID;
  if (user_ops_rc == MPI_SUCCESS) {
    user_ops_rc = MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, free_user_ops, &keyval, NULL);
  }
  if (user_ops_rc == MPI_SUCCESS) {
    user_ops_rc = MPI_Comm_set_attr(MPI_COMM_SELF, keyval, NULL);
  }
}

loom_status_t loom_mpi_op(loom_dtype_t dtype, loom_redop_t op, MPI_Op *out) {
  int half = dtype == LOOM_F16 || dtype == LOOM_BF16;
  if (op == LOOM_AVG || (half && op == LOOM_SUM) || op < 0 || op >= LOOM_REDOP_COUNT) {
    return loom_error(NULL, LOOM_ERR_INTERNAL, "no MPI op for %s on %s", loom_redop_name(op),
                      loom_dtype_name(dtype));
  }
  int user = -1;
  for (int i = 0; i < OP_COUNT; i++) {
    if (user_op_table[i].dtype == dtype && user_op_table[i].op == op) {
      user = i;
    }
  }
  if (user < 0) {
    *out = op == LOOM_SUM ? MPI_SUM : op == LOOM_MAX ? MPI_MAX : MPI_MIN;
    return LOOM_OK;
  }
  pthread_once(&user_ops_once, create_user_ops);
  if (user_ops_rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(user_ops_rc, msg, &len);
    return loom_error(NULL, LOOM_ERR_MPI, "creating loom's MPI reduction ops failed: %s", msg);
  }
  *out = user_ops[user];
  return LOOM_OK;
}
