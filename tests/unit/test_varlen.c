/* test_varlen.c — padded <-> packed helpers: cu_seqlens from lengths, pack/unpack round trips for
 * f32, i32 and a 4-D u8 shape, the packed row map, and bad lengths, shapes and totals. */
#include "config.h"
#include "loom.h"

#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "../testutil.h"
#include "error.h"

// ---------------------------------------------------------------------------------------------
// Helpers

static loom_tensor_t i32_of(int64_t n, const int32_t *values, const char *name) {
  const int64_t shape[1] = {n};
  loom_tensor_t t = test_tensor(LOOM_I32, 1, shape, name);
  if (values && n > 0) {
    memcpy(t.data, values, (size_t)n * sizeof(int32_t));
  }
  return t;
}

static void fill_bytes(loom_tensor_t *t, unsigned char x) {
  if (t->data) { // NULL for an empty tensor
    memset(t->data, x, loom_tensor_bytes(t));
  }
}

static int all_bytes(const loom_tensor_t *t, unsigned char x) {
  const unsigned char *p = t->data;
  for (size_t i = 0; i < loom_tensor_bytes(t); i++) {
    if (p[i] != x) {
      return 0;
    }
  }
  return 1;
}

// ---------------------------------------------------------------------------------------------
// Offsets

static void test_offsets(void) {
  static const char op[] = "loom_varlen_offsets";
  const int32_t len[4] = {3, 0, 5, 2};
  loom_tensor_t lengths = i32_of(4, len, "lengths"), cu = i32_of(5, NULL, "cu");
  int32_t total = -1;
  CHECK(loom_varlen_offsets(&cu, &lengths, 5, &total) == LOOM_OK, "%s", loom_last_error(NULL));
  const int32_t want[5] = {0, 3, 3, 8, 10};
  CHECK(memcmp(cu.data, want, sizeof want) == 0 && total == 10, "offsets of {3, 0, 5, 2}");
  CHECK(loom_varlen_offsets(&cu, &lengths, 0, NULL) == LOOM_OK, "no max_len, NULL total");

  // B = 0: cu_seqlens = {0}.
  loom_tensor_t none = i32_of(0, NULL, "lengths"), cu0 = i32_of(1, NULL, "cu");
  ((int32_t *)cu0.data)[0] = 99;
  total = -1;
  CHECK(loom_varlen_offsets(&cu0, &none, 8, &total) == LOOM_OK && total == 0 &&
            ((int32_t *)cu0.data)[0] == 0,
        "B = 0");

  // Bad lengths and shapes: nothing written.
  fill_bytes(&cu, 0xAB);
  total = -7;
  test_expect_fail(loom_varlen_offsets(&cu, &lengths, 4, &total), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, op, "lengths[2]=5 > max_len=4", "length above max_len");
  const int32_t neg[4] = {3, -2, 5, 2};
  loom_tensor_t lneg = i32_of(4, neg, "lengths");
  test_expect_fail(loom_varlen_offsets(&cu, &lneg, 0, &total), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, op, "lengths[1]=-2 is negative", "negative length");
  const int32_t huge[4] = {2000000000, 2000000000, 1, 1};
  loom_tensor_t lhuge = i32_of(4, huge, "lengths");
  test_expect_fail(loom_varlen_offsets(&cu, &lhuge, 0, &total), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, op, "i32", "sum overflowing i32");
  loom_tensor_t cu4 = i32_of(4, NULL, "cu");
  test_expect_fail(loom_varlen_offsets(&cu4, &lengths, 0, &total), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, op, "cu_seqlens is (4)", "cu_seqlens of B entries");
  const int64_t s2[2] = {2, 2};
  loom_tensor_t l2 = test_tensor(LOOM_I32, 2, s2, "lengths");
  test_expect_fail(loom_varlen_offsets(&cu, &l2, 0, &total), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, op, "expected (B)", "2-D lengths");
  loom_tensor_t lf = test_tensor(LOOM_F32, 1, lengths.shape, "lengths");
  test_expect_fail(loom_varlen_offsets(&cu, &lf, 0, &total), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, op, "expected dtype i32", "f32 lengths");
  test_expect_fail(loom_varlen_offsets(&cu, NULL, 0, &total), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, op, "lengths is NULL", "NULL lengths");
  test_expect_fail(loom_varlen_offsets(NULL, &lengths, 0, &total), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, op, "cu_seqlens is NULL", "NULL cu_seqlens");
  CHECK(all_bytes(&cu, 0xAB) && total == -7, "a failed call wrote its outputs");

  TEST_FREE(&lengths, &cu, &none, &cu0, &lneg, &lhuge, &cu4, &l2, &lf);
}

// ---------------------------------------------------------------------------------------------
// Pack, unpack, row map

// Round trip of a padded (B, T, trailing...) tensor of dtype through pack and unpack, checked
// byte by byte against the row map: packed row i is padded row row_map[i]; padding comes back 0.
static void round_trip(loom_dtype_t dtype, int ndim, const int64_t *padded_shape,
                       const int32_t *len, test_rng_t *rng) {
  const int64_t B = padded_shape[0], T = padded_shape[1];
  loom_tensor_t lengths = i32_of(B, len, "lengths"), cu = i32_of(B + 1, NULL, "cu");
  int32_t total = 0;
  CHECK(loom_varlen_offsets(&cu, &lengths, (int)T, &total) == LOOM_OK, "%s", loom_last_error(NULL));
  int64_t packed_shape[LOOM_MAX_DIMS] = {total};
  for (int i = 2; i < ndim; i++) {
    packed_shape[i - 1] = padded_shape[i];
  }
  loom_tensor_t padded = test_tensor(dtype, ndim, padded_shape, "padded");
  loom_tensor_t packed = test_tensor(dtype, ndim - 1, packed_shape, "packed");
  loom_tensor_t back = test_tensor(dtype, ndim, padded_shape, "back");
  loom_tensor_t map = i32_of(total, NULL, "row_map");
  unsigned char *pb = padded.data;
  for (size_t i = 0; i < loom_tensor_bytes(&padded); i++) {
    pb[i] = (unsigned char)(test_next(rng) | 1u); // never 0, so zeroed padding is visible
  }
  fill_bytes(&back, 0x5A);
  CHECK(loom_varlen_pack(&packed, &padded, &cu) == LOOM_OK, "pack: %s", loom_last_error(NULL));
  CHECK(loom_varlen_row_map(&map, &cu, (int)T) == LOOM_OK, "row_map: %s", loom_last_error(NULL));
  CHECK(loom_varlen_unpack(&back, &packed, &cu) == LOOM_OK, "unpack: %s", loom_last_error(NULL));

  const size_t row = loom_tensor_bytes(&padded) / (size_t)(B * T > 0 ? B * T : 1);
  const int32_t *m = map.data, *c = cu.data;
  int bad_map = 0, bad_pack = 0, bad_back = 0;
  for (int64_t b = 0; b < B; b++) {
    for (int32_t i = c[b]; i < c[b + 1]; i++) {
      bad_map += m[i] != (int32_t)(b * T + (i - c[b]));
      bad_pack += memcmp((char *)packed.data + (size_t)i * row, pb + (size_t)m[i] * row, row) != 0;
    }
    for (int64_t t = 0; t < T; t++) {
      const char *got = (char *)back.data + (size_t)(b * T + t) * row;
      if (t < len[b]) {
        bad_back += memcmp(got, pb + (size_t)(b * T + t) * row, row) != 0;
      } else {
        for (size_t x = 0; x < row; x++) {
          bad_back += got[x] != 0;
        }
      }
    }
  }
  CHECK(bad_map == 0 && bad_pack == 0 && bad_back == 0,
        "%s ndim %d: %d wrong row_map entries, %d wrong packed rows, %d wrong unpacked bytes",
        loom_dtype_name(dtype), ndim, bad_map, bad_pack, bad_back);
  TEST_FREE(&lengths, &cu, &padded, &packed, &back, &map);
}

static void test_round_trips(void) {
  test_rng_t rng = test_rng(11);
  const int32_t len3[3] = {4, 0, 6};
  const int64_t f32_shape[3] = {3, 6, 5};
  round_trip(LOOM_F32, 3, f32_shape, len3, &rng);
  const int32_t len5[5] = {7, 7, 1, 0, 3};
  const int64_t i32_shape[2] = {5, 7}; // (B, T): one element per row
  round_trip(LOOM_I32, 2, i32_shape, len5, &rng);
  const int64_t u8_shape[4] = {3, 6, 2, 3}; // 4-D: a row is a 2 x 3 block
  round_trip(LOOM_U8, 4, u8_shape, len3, &rng);
  const int64_t f16_shape[4] = {5, 7, 3, 1};
  round_trip(LOOM_F16, 4, f16_shape, len5, &rng);
  const int32_t zero[2] = {0, 0};
  const int64_t empty_shape[3] = {2, 4, 3}; // every sequence empty: total 0
  round_trip(LOOM_F32, 3, empty_shape, zero, &rng);
  const int64_t b0_shape[3] = {0, 4, 3}; // B = 0
  round_trip(LOOM_F32, 3, b0_shape, zero, &rng);
}

static void test_bad_layouts(void) {
  const int64_t ps[3] = {3, 4, 2}, ks[2] = {7, 2};
  loom_tensor_t padded = test_tensor(LOOM_F32, 3, ps, "padded");
  loom_tensor_t packed = test_tensor(LOOM_F32, 2, ks, "packed");
  const int32_t good[4] = {0, 3, 3, 7}, longer[4] = {0, 5, 5, 7}, down[4] = {0, 3, 2, 7},
                short_total[4] = {0, 3, 3, 6}, start1[4] = {1, 3, 3, 7};
  loom_tensor_t cu = i32_of(4, good, "cu");
  loom_tensor_t map = i32_of(7, NULL, "row_map");
  fill_bytes(&packed, 0xCD);
  fill_bytes(&padded, 0xCD);
  fill_bytes(&map, 0xCD);
  static const char P[] = "loom_varlen_pack", U[] = "loom_varlen_unpack",
                    R[] = "loom_varlen_row_map";

  const struct {
    const int32_t *cu;
    const char *needle;
  } bad_cu[] = {
      {longer, "longer than the padded length 4"},
      {down, "cu_seqlens[2]=2 < cu_seqlens[1]=3"},
      {short_total, "cu_seqlens[3]=6, but"},
      {start1, "cu_seqlens[0]=1"},
  };
  for (size_t i = 0; i < sizeof bad_cu / sizeof bad_cu[0]; i++) {
    memcpy(cu.data, bad_cu[i].cu, sizeof good);
    test_expect_fail(loom_varlen_pack(&packed, &padded, &cu), LOOM_ERR_INVALID_ARG,
                     LOOM_ERR_INVALID_ARG, P, bad_cu[i].needle, bad_cu[i].needle);
    test_expect_fail(loom_varlen_unpack(&padded, &packed, &cu), LOOM_ERR_INVALID_ARG,
                     LOOM_ERR_INVALID_ARG, U, bad_cu[i].needle, bad_cu[i].needle);
    test_expect_fail(loom_varlen_row_map(&map, &cu, 4), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG,
                     R, bad_cu[i].needle, bad_cu[i].needle);
  }
  memcpy(cu.data, good, sizeof good);

  // Shapes and dtypes.
  const int64_t ks3[2] = {7, 3}, ks8[2] = {8, 2}, s1[1] = {3};
  loom_tensor_t packed3 = test_tensor(LOOM_F32, 2, ks3, "packed");
  loom_tensor_t packed8 = test_tensor(LOOM_F32, 2, ks8, "packed");
  loom_tensor_t packed_i32 = test_tensor(LOOM_I32, 2, ks, "packed");
  loom_tensor_t cu3 = i32_of(3, good, "cu");
  loom_tensor_t cuf = test_tensor(LOOM_F32, 1, cu.shape, "cu");
  loom_tensor_t pad1 = test_tensor(LOOM_F32, 1, s1, "padded");
  loom_tensor_t map8 = i32_of(8, NULL, "row_map");
  test_expect_fail(loom_varlen_pack(&packed3, &padded, &cu), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, P, "same trailing dimensions", "trailing shape mismatch");
  test_expect_fail(loom_varlen_pack(&packed8, &padded, &cu), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, P, "packed has 8 rows", "packed total mismatch");
  test_expect_fail(loom_varlen_unpack(&padded, &packed8, &cu), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, U, "packed has 8 rows", "unpack total mismatch");
  test_expect_fail(loom_varlen_pack(&packed_i32, &padded, &cu), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, P, "expected dtype f32", "dtype mismatch");
  test_expect_fail(loom_varlen_pack(&packed, &padded, &cu3), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, P, "B + 1", "cu_seqlens of another B");
  test_expect_fail(loom_varlen_pack(&packed, &padded, &cuf), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, P, "expected dtype i32", "f32 cu_seqlens");
  test_expect_fail(loom_varlen_pack(&packed, &pad1, &cu), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, P, "expected (B, T, ...)", "1-D padded");
  test_expect_fail(loom_varlen_pack(&packed, NULL, &cu), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG,
                   P, "padded is NULL", "NULL padded");
  test_expect_fail(loom_varlen_unpack(NULL, &packed, &cu), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, U, "padded is NULL", "NULL padded (unpack)");
  test_expect_fail(loom_varlen_row_map(&map8, &cu, 4), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG,
                   R, "row_map has 8 rows", "row_map total mismatch");
  test_expect_fail(loom_varlen_row_map(&map, &cu, -1), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG,
                   R, "T=-1", "negative T");
  test_expect_fail(loom_varlen_row_map(&map, &cu, 3), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, R,
                   "longer than the padded length 3", "T too short");
  // In place: the row copies (memcpy) would overlap.
  {
    loom_tensor_t packed_in = packed; // packed rows in padded's memory
    packed_in.data = padded.data;
    test_expect_fail(loom_varlen_pack(&packed_in, &padded, &cu), LOOM_ERR_INVALID_ARG,
                     LOOM_ERR_INVALID_ARG, P, "packed (7, 2) f32 on host overlaps padded",
                     "pack in place");
    test_expect_fail(loom_varlen_unpack(&padded, &packed_in, &cu), LOOM_ERR_INVALID_ARG,
                     LOOM_ERR_INVALID_ARG, U, "padded (3, 4, 2) f32 on host overlaps packed",
                     "unpack in place");
  }
  CHECK(all_bytes(&packed, 0xCD) && all_bytes(&padded, 0xCD) && all_bytes(&map, 0xCD),
        "a failed call wrote its outputs");

  TEST_FREE(&padded, &packed, &cu, &map, &packed3, &packed8, &packed_i32, &cu3, &cuf, &pad1, &map8);
}

// ---------------------------------------------------------------------------------------------

int main(void) {
  test_offsets();
  test_round_trips();
  test_bad_layouts();
  return check_exit("test_varlen");
}
