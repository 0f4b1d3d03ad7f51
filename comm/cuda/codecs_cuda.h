/* codecs_cuda.h — the compressors' encode and decode-add on device memory, producing and reading
 * payloads byte-compatible with the CPU codecs (compress_codecs.c), so either side can decode. */
#ifndef LOOM_CODECS_CUDA_H
#define LOOM_CODECS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "compress_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

// As loom_codec_encode, with x (n floats) and payload (cap bytes) in device memory of the
// current device; *bytes_host receives the payload size on the host. Runs on the current stream
// (compute/cuda/cuda_ctx.h) and waits for it when the size depends on the data (top-k; the
// non-finite check). c is none, fp16, bf16, int8 (deterministic or stochastic), topk, randomk or
// efsign (powersgd: LOOM_ERR_UNSUPPORTED). The payload has the same header and body layout as
// the CPU codec's: fp16, bf16, int8 (deterministic), randomk and efsign payloads are the same
// bytes; top-k keeps the same set of values (ties broken to the lower index, as the CPU does)
// in ascending index order.
loom_status_t loom_cuda_codec_encode(const loom_compressor_t *c, const float *x, int64_t n,
                                     uint64_t seed, uint8_t *payload, size_t cap,
                                     size_t *bytes_host);
// As loom_codec_decode_add: acc (n floats, device) += decode(payload) where payload (bytes
// bytes, device) is validated first (header copied to the host; indices range-checked on the
// device): a malformed payload is LOOM_ERR_CORRUPT with acc untouched.
loom_status_t loom_cuda_codec_decode_add(const loom_compressor_t *c, const uint8_t *payload,
                                         size_t bytes, int64_t n, uint64_t seed, float *acc);
// As loom_ef_encode on device memory: y = x + res; payload = encode(y); res = y - decode(payload)
// (non-finite entries dropped; on an error of the encode or the decode res is unchanged). res
// may be NULL (plain encode into y's scratch).
loom_status_t loom_cuda_ef_encode(const loom_compressor_t *c, float *res, float *y, const float *x,
                                  int64_t n, uint64_t seed, uint8_t *payload, size_t cap,
                                  size_t *bytes_host);

// For the compressed allreduce of device tensors (compress_coll_nccl.c), on the current stream:
// dst[0..n) = src[0..n) / d, one IEEE division a value (LOOM_AVG, as the host path divides);
// and count <= 20 bytes from host memory src to device memory dst, passed by value to a kernel
// (src may be reused as soon as the call returns).
loom_status_t loom_cuda_div(float *dst, const float *src, int64_t n, float d);
// dst[0..n) = src[0..n) where finite, else 0 (error feedback's rule for a residual; PowerSGD's).
loom_status_t loom_cuda_keep_finite(float *dst, const float *src, int64_t n);
loom_status_t loom_cuda_put_bytes(uint8_t *dst, const void *src, int count);

#ifdef __cplusplus
}
#endif
#endif
